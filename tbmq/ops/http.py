"""The node's HTTP site (twisted.web, in the broker's reactor):

* ``/metrics``: Prometheus metrics (:mod:`tbmq.ops.metrics`), open unless
  ``http.metrics_auth``;
* ``/api/``: the REST admin API (:mod:`tbmq.ops.api.app`);
* ``/console/``: the web console, static files shipped in the package
  (``tbmq/ops/console``); ``/`` redirects there.
"""

from __future__ import annotations

import os

from twisted.internet import defer
from twisted.web import resource, server, static, util

from tbmq.ops.admins import TokenError
from tbmq.ops.metrics import CONTENT_TYPE, render

#: the console's files
CONSOLE_DIR = os.path.join(os.path.dirname(__file__), "console")


class MetricsResource(resource.Resource):
    """``/metrics``: the text exposition of the node's registry.

    :param registry: the :class:`prometheus_client.CollectorRegistry`.
    :param auth: the :class:`tbmq.ops.admins.AdminAuth` when a token is
        needed, else None.
    """

    isLeaf = True

    def __init__(self, registry, auth=None) -> None:
        super().__init__()
        self.registry = registry
        self.auth = auth

    def render_GET(self, request):
        if self.auth is None:
            return self._body(request)

        def refused(failure):
            failure.trap(TokenError)
            request.setResponseCode(failure.value.status)
            request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
            request.write(str(failure.value).encode("utf-8") + b"\n")
            request.finish()

        d = defer.ensureDeferred(self.auth.authenticate(request.getHeader("authorization")))
        d.addCallback(lambda _: (request.write(self._body(request)), request.finish()))
        d.addErrback(refused)
        return server.NOT_DONE_YET

    def _body(self, request) -> bytes:
        request.setHeader(b"Content-Type", CONTENT_TYPE.encode())
        return render(self.registry)


class ConsoleFiles(static.File):
    """The console's static files, never cached stale (``no-cache``: the
    browser asks again and gets 304 while they are the same)."""

    def render_GET(self, request):
        request.setHeader(b"Cache-Control", b"no-cache")
        request.setHeader(b"X-Content-Type-Options", b"nosniff")
        return super().render_GET(request)

    def createSimilarFile(self, path):
        return ConsoleFiles(path, self.defaultType, self.ignoredExts, self.registry)


def make_site(registry, api, auth, metrics_auth: bool = False) -> server.Site:
    """:returns: the :class:`~twisted.web.server.Site` of the node.

    :param registry: the metrics registry.
    :param api: the :class:`tbmq.ops.api.app.AdminApi`.
    :param auth: the :class:`tbmq.ops.admins.AdminAuth`.
    :param metrics_auth: ``/metrics`` needs a token too.
    """
    root = resource.Resource()
    root.putChild(b"", util.Redirect(b"/console/"))
    root.putChild(b"metrics", MetricsResource(registry, auth if metrics_auth else None))
    root.putChild(b"api", api)
    console = ConsoleFiles(CONSOLE_DIR)
    console.contentTypes.update({".js": "text/javascript; charset=utf-8",
                                 ".css": "text/css; charset=utf-8",
                                 ".svg": "image/svg+xml"})
    root.putChild(b"console", console)
    site = QuietSite(root)
    site.displayTracebacks = False
    site.noisy = False
    return site


class QuietSite(server.Site):
    """A site that writes no access log line per request (Prometheus
    scrapes and the console's polls would fill the log; changes are logged
    by the API with the user who made them)."""

    def log(self, request) -> None:
        pass
