"""HTTP authentication (TBMQ 2.3's HTTP provider, EMQX's HTTP
authenticator): each CONNECT is decided by an HTTP service (``auth.http``).

The request is built from templates (:class:`~tbmq.config.HttpAuthConfig`):
the placeholders ``${clientId}``, ``${username}``, ``${password}``,
``${certificateCn}`` and ``${peerhost}`` (the client's address, behind a
proxy the forwarded one) in ``url`` (URL-quoted) and in the values of
``body``: a GET sends the body fields as URL query parameters, a POST as a
JSON object (form-encoded when ``headers`` give that content type).

The answer is read as EMQX reads it:

* status 200 with a JSON object ``{"result": "allow" | "deny" | "ignore",
  "client_type": "DEVICE" | "APPLICATION", "pub": [regex, ...], "sub":
  [regex, ...]}``, all but ``result`` optional: ``allow`` accepts the client
  with that client type and those publish / subscribe rules
  (:mod:`tbmq.auth.rules`: whole-topic regexes with the same placeholders as
  credentials), else ``auth.http.default_client_type``, ``default_pub`` and
  ``default_sub``; ``deny`` refuses it with CONNACK NOT_AUTHORIZED (0x87;
  v3: 5); ``ignore`` passes to the next provider;
* a 4xx status is ``deny``;
* a 5xx status (or any other one), a timeout (``auth.http.timeout``), a
  connection error or a body that is not such an object is ``ignore``, with
  a log line (at most a few per 10 s per kind).  The service could not
  decide, so the built-in ``anonymous`` provider does not accept the client
  even with ``auth.allow_anonymous`` (:attr:`tbmq.auth.AuthRequest.undecided`):
  a later provider (``basic``...) decides, or it is refused with
  NOT_AUTHORIZED.

Answers ``allow`` and ``deny`` are kept ``auth.http.cache_ttl`` seconds
(:class:`AnswerCache`), keyed by the values of the placeholders the request
uses (the password as a keyed hash), at most :data:`CACHE_SIZE` of them.

The requests go through :class:`twisted.web.client.Agent` with a persistent
connection pool (HTTPS verified against the system's CA certificates, or
those of ``auth.http.tls_ca``), so the reactor never waits; the password
is never logged.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import re
import types
import urllib.parse
from typing import Any

from twisted.internet import defer, error, protocol, ssl, task
from twisted.logger import Logger
from twisted.web import client as web_client, http as web_http
from twisted.web.http_headers import Headers
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from tbmq.auth import NO_REQUEST, AuthResult, AuthScope
from tbmq.auth.rules import AuthorizationRules
from tbmq.errors import ConfigError, CredentialsError
from tbmq.hookspecs import hookimpl
from tbmq.log import LogThrottle, OBSERVER as LOG_OBSERVER
from tbmq.model import ClientType
from tbmq.mqtt import ReasonCode

#: The body of a request when ``auth.http.body`` is not set.
DEFAULT_BODY = types.MappingProxyType(
    {"clientId": "${clientId}", "username": "${username}", "password": "${password}"})

#: The most answers :class:`AnswerCache` keeps (least recently used dropped).
CACHE_SIZE = 10000

_PLACEHOLDER = re.compile(r"\$\{(clientId|username|password|certificateCn|peerhost)\}")
_FORM = "application/x-www-form-urlencoded"
#: a per-process key of the password hashes in cache keys
_KEY = os.urandom(16)

log = Logger(observer=LOG_OBSERVER)


# -- the request ---------------------------------------------------------------------


def placeholder_values(request) -> dict[str, str]:
    """The placeholders' values for one CONNECT.

    :param request: the :class:`tbmq.auth.AuthRequest`.
    :returns: placeholder name → text; a value the client did not give is
        ``""``; the password is decoded as UTF-8 (bad bytes replaced).
    """
    password = request.password
    address = request.address
    host = getattr(address, "host", None)
    return {
        "clientId": request.client_id,
        "username": request.username or "",
        "password": password.decode("utf-8", "replace") if password is not None else "",
        "certificateCn": request.certificate_cn or "",
        "peerhost": host.decode() if isinstance(host, bytes) else (host or ""),
    }


def render(template: str, values: dict[str, str], quote=None) -> str:
    """Replace the placeholders of ``template``.

    :param values: from :func:`placeholder_values`.
    :param quote: applied to each value (``urllib.parse.quote`` for a URL),
        or None.
    :returns: the text.
    """
    return _PLACEHOLDER.sub(
        lambda m: quote(values[m.group(1)]) if quote else values[m.group(1)], template)


def used_placeholders(cfg) -> tuple[str, ...]:
    """:returns: the placeholder names ``cfg.url`` and ``cfg.body`` use,
    sorted: what an answer depends on (the cache key)."""
    texts = [cfg.url or ""] + list((cfg.body if cfg.body is not None else DEFAULT_BODY).values())
    return tuple(sorted({name for text in texts for name in _PLACEHOLDER.findall(text)}))


def build_request(cfg, values: dict[str, str]) -> tuple[bytes, bytes, Headers, bytes | None]:
    """The HTTP request for one CONNECT.

    :param cfg: the :class:`tbmq.config.HttpAuthConfig`.
    :param values: from :func:`placeholder_values`.
    :returns: ``(method, url, headers, body or None)``: for GET the body
        fields are query parameters; for POST a JSON object (``Content-Type:
        application/json`` unless ``headers`` name another one) or, with
        ``Content-Type: application/x-www-form-urlencoded``, a form.
    """
    url = render(cfg.url, values, lambda v: urllib.parse.quote(v, safe=""))
    fields = {name: render(text, values)
              for name, text in (cfg.body if cfg.body is not None else DEFAULT_BODY).items()}
    headers = Headers()
    for name, value in cfg.headers.items():
        headers.addRawHeader(name, value)
    content_type = next((v for k, v in cfg.headers.items() if k.lower() == "content-type"), None)
    body = None
    if cfg.method == "GET":
        if fields:
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode(fields)
    elif content_type is not None and content_type.split(";")[0].strip().lower() == _FORM:
        body = urllib.parse.urlencode(fields).encode()
    else:
        body = json.dumps(fields).encode()
        if content_type is None:
            headers.addRawHeader("Content-Type", "application/json")
    return cfg.method.encode(), url.encode(), headers, body


# -- the answer ----------------------------------------------------------------------


class Unreadable(ValueError):
    """An answer that is not what the service should send."""


class Decision:
    """What the service answered, before it is bound to a connection.

    :ivar result: ``allow``, ``deny`` or ``ignore``.
    :ivar client_type: the :class:`~tbmq.model.ClientType` of ``allow``.
    :ivar rules: the :class:`~tbmq.auth.rules.AuthorizationRules` of ``allow``.
    """

    __slots__ = ("result", "client_type", "rules")

    def __init__(self, result: str, client_type: ClientType = ClientType.DEVICE,
                 rules: AuthorizationRules | None = None) -> None:
        self.result = result
        self.client_type = client_type
        self.rules = rules

    def __repr__(self) -> str:
        return f"Decision({self.result!r}, {self.client_type}, {self.rules!r})"


def decide(status: int, body: bytes, cfg) -> Decision:
    """Read the service's answer, as EMQX's HTTP authenticator does.

    :param status: the HTTP status code.
    :param body: the answer's body.
    :param cfg: the :class:`tbmq.config.HttpAuthConfig` (the defaults).
    :returns: the decision: 4xx → ``deny``; 200 → the body's.
    :raises Unreadable: for a status that is neither 200 nor 4xx, or a 200
        whose body is not a JSON object with a ``result`` of ``allow``,
        ``deny`` or ``ignore``, a known ``client_type`` and lists of valid
        regexes for ``pub`` and ``sub``; the message says which.
    """
    if 400 <= status < 500:
        return Decision("deny")
    if status != 200:
        raise Unreadable(f"HTTP status {status}")
    try:
        answer = json.loads(body)
    except ValueError:
        raise Unreadable("the body is not JSON") from None
    if not isinstance(answer, dict):
        raise Unreadable("the body is not a JSON object")
    result = answer.get("result")
    if result not in ("allow", "deny", "ignore"):
        raise Unreadable(f"result {result!r} is not allow, deny or ignore")
    if result != "allow":
        return Decision(result)
    client_type = answer.get("client_type") or cfg.default_client_type
    try:
        client_type = ClientType(str(client_type).upper())
    except ValueError:
        raise Unreadable(f"client_type {client_type!r} is not DEVICE or APPLICATION") from None
    pub, sub = answer.get("pub"), answer.get("sub")  # absent or null: the defaults
    try:
        rules = AuthorizationRules(pub if pub is not None else cfg.default_pub,
                                   sub if sub is not None else cfg.default_sub)
    except CredentialsError as e:
        raise Unreadable(f"pub/sub: {e}") from None
    return Decision("allow", client_type, rules)


class AnswerCache:
    """The service's ``allow`` and ``deny`` answers, kept ``ttl`` seconds.

    :param clock: ``IReactorTime``.
    :param ttl: seconds, > 0.
    :param size: answers kept at most, least recently used dropped first.
    """

    def __init__(self, clock, ttl: float, size: int = CACHE_SIZE) -> None:
        self.clock = clock
        self.ttl = ttl
        self.size = size
        self._answers: collections.OrderedDict = collections.OrderedDict()

    @staticmethod
    def key(names: tuple[str, ...], values: dict[str, str]) -> tuple:
        """:returns: the values of the placeholders ``names``, the
        password as a keyed BLAKE2 hash (never kept in clear)."""
        return tuple(
            hashlib.blake2b(values[n].encode("utf-8", "surrogatepass"), key=_KEY).digest()
            if n == "password" else values[n] for n in names)

    def get(self, key: tuple) -> Decision | None:
        """:returns: the answer kept for ``key`` and not expired, or None."""
        entry = self._answers.get(key)
        if entry is None:
            return None
        expires, decision = entry
        if self.clock.seconds() >= expires:
            del self._answers[key]
            return None
        self._answers.move_to_end(key)
        return decision

    def put(self, key: tuple, decision: Decision) -> None:
        self._answers[key] = (self.clock.seconds() + self.ttl, decision)
        self._answers.move_to_end(key)
        while len(self._answers) > self.size:
            self._answers.popitem(last=False)

    def __len__(self) -> int:
        return len(self._answers)


# -- the service ---------------------------------------------------------------------


class _Warnings:
    """A :class:`twisted.logger.Logger` whose ``info`` warns (for :class:`LogThrottle`)."""

    def __init__(self, logger: Logger) -> None:
        self.info = logger.warn


@implementer(IPolicyForHTTPS)
class TrustedCAs:
    """Verify an HTTPS service against the CA certificates of a PEM file
    (``auth.http.tls_ca``) instead of the system's.

    :param path: the PEM file, read here.
    :raises ConfigError: naming ``auth.http.tls_ca`` when it cannot be read
        or holds no certificate.
    """

    def __init__(self, path: str) -> None:
        try:
            with open(path, "rb") as f:
                data = f.read()
            blocks = re.findall(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----",
                                data, re.S)
            certificates = [ssl.Certificate.loadPEM(block) for block in blocks]
        except OSError as e:
            raise ConfigError(f"auth.http.tls_ca: cannot read {path}: {e.strerror}",
                              key="auth.http.tls_ca") from None
        except Exception as e:  # noqa: BLE001 (pyOpenSSL's errors)
            raise ConfigError(f"auth.http.tls_ca: {path}: not a PEM certificate: {e}",
                              key="auth.http.tls_ca") from None
        if not certificates:
            raise ConfigError(f"auth.http.tls_ca: {path} holds no PEM certificate",
                              key="auth.http.tls_ca")
        self.trust = ssl.trustRootFromCertificates(certificates)

    def creatorForNetloc(self, hostname: bytes, port: int):
        return ssl.optionsForClientTLS(hostname.decode("ascii"), trustRoot=self.trust)


class HttpService:
    """The HTTP service of one ``auth.http`` config.

    :param cfg: the :class:`tbmq.config.HttpAuthConfig`.
    :param reactor: the reactor; the global one when None.
    :param tls: the :class:`TrustedCAs` of ``cfg.tls_ca``, or None for the
        system's CA certificates (Twisted's ``BrowserLikePolicyForHTTPS``).
    """

    def __init__(self, cfg, reactor=None, tls: TrustedCAs | None = None) -> None:
        if reactor is None:
            from twisted.internet import reactor  # noqa: PLC0415
        self.cfg = cfg
        self.reactor = reactor
        self.pool = web_client.HTTPConnectionPool(reactor, persistent=True)
        self.pool._factory = _QuietFactory  # no log line per new connection
        # request bodies are written by turns of this reactor
        self.cooperator = task.Cooperator(scheduler=lambda step: reactor.callLater(0, step))
        policy = tls if tls is not None else web_client.BrowserLikePolicyForHTTPS()
        self.agent = web_client.Agent(reactor, contextFactory=policy, pool=self.pool,
                                      connectTimeout=cfg.timeout)
        self.names = used_placeholders(cfg)
        self.cache = AnswerCache(reactor, cfg.cache_ttl) if cfg.cache_ttl > 0 else None
        self.warnings = {kind: LogThrottle(reactor, _Warnings(log), f"HTTP authentication {kind}",
                                           burst=5)
                         for kind in ("unreachable", "timeouts", "errors", "answers")}
        self.requests = 0

    async def ask(self, request) -> Decision | None:
        """Ask the service about one CONNECT (or take the cached answer).

        :param request: the :class:`tbmq.auth.AuthRequest`.
        :returns: the decision, or None when the service could not decide
            (logged).
        """
        values = placeholder_values(request)
        key = None
        if self.cache is not None:
            key = self.cache.key(self.names, values)
            decision = self.cache.get(key)
            if decision is not None:
                return decision
        try:
            decision = await self._call(values)
        except Unreadable as e:
            self._warn("answers", "HTTP authentication of {client_id}: unusable answer from "
                       "{url}: {why}; the next provider decides", request, why=str(e))
            return None
        except (defer.TimeoutError, defer.CancelledError, web_client.ResponseNeverReceived) as e:
            if isinstance(e, web_client.ResponseNeverReceived) and not any(
                    r.check(defer.CancelledError) for r in e.reasons):
                self._warn("unreachable", "HTTP authentication of {client_id}: no answer from "
                           "{url}: {why}; the next provider decides", request,
                           why=", ".join(r.getErrorMessage() for r in e.reasons))
                return None
            self._warn("timeouts", "HTTP authentication of {client_id}: no answer from {url} "
                       "within {timeout:g} s (auth.http.timeout); the next provider decides",
                       request, timeout=self.cfg.timeout)
            return None
        except (error.ConnectError, error.DNSLookupError, OSError,
                web_client.ResponseFailed) as e:
            self._warn("unreachable", "HTTP authentication of {client_id}: cannot reach {url}: "
                       "{why}; the next provider decides", request, why=str(e) or type(e).__name__)
            return None
        except Exception as e:  # noqa: BLE001 (a failed request must not fail the CONNECT)
            self._warn("errors", "HTTP authentication of {client_id}: request to {url} failed: "
                       "{why}; the next provider decides", request,
                       why=f"{type(e).__name__}: {e}")
            return None
        if key is not None and decision.result != "ignore":
            self.cache.put(key, decision)
        return decision

    async def _call(self, values: dict[str, str]) -> Decision:
        method, url, headers, body = build_request(self.cfg, values)
        self.requests += 1
        producer = None if body is None else web_client.FileBodyProducer(
            io.BytesIO(body), cooperator=self.cooperator)
        d = self.agent.request(method, url, headers, producer)
        d.addCallback(self._read)
        d.addTimeout(self.cfg.timeout, self.reactor)
        status, content = await d
        return decide(status, content, self.cfg)

    @staticmethod
    def _read(response) -> defer.Deferred:
        collector = _Collector()
        response.deliverBody(collector)
        return collector.done.addCallback(lambda body: (response.code, body))

    def _warn(self, kind: str, fmt: str, request, **kwargs: Any) -> None:
        # the URL template: no client's values (passwords) in the log
        self.warnings[kind].info(fmt, client_id=request.client_id, url=self.cfg.url, **kwargs)

    def close(self) -> defer.Deferred:
        """Close the kept-alive connections."""
        return self.pool.closeCachedConnections()


class _QuietFactory(web_client._HTTP11ClientFactory):
    noisy = False


class _Collector(protocol.Protocol):
    """Reads an answer's body (:func:`twisted.web.client.readBody`, whose
    cancel warns on a pooled connection); cancelled, it stops reading (the
    connection is closed)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.done = defer.Deferred(lambda d: self.transport.stopProducing())

    def dataReceived(self, data: bytes) -> None:
        self.parts.append(data)

    def connectionLost(self, reason) -> None:
        if self.done.called:
            return
        if reason.check(web_client.ResponseDone, web_http.PotentialDataLoss):
            self.done.callback(b"".join(self.parts))
        else:
            self.done.errback(reason)


#: what the provider answers with a service
#: (:func:`tbmq.hookspecs.tbmq_authentication_scope`)
_SCOPE = AuthScope()


class HttpAuth:
    """The ``http`` provider: one :class:`HttpService` per ``auth.http``
    config it is asked with."""

    def __init__(self) -> None:
        self.services: dict = {}
        self.trusted: dict[str, TrustedCAs] = {}

    @hookimpl
    def tbmq_configure(self, config):
        """Read ``auth.http.tls_ca`` now, so that a bad file stops the start.

        :raises ConfigError: see :class:`TrustedCAs`.
        """
        path = config.auth.http.tls_ca
        if path is not None and path not in self.trusted:
            self.trusted[path] = TrustedCAs(path)

    def service(self, cfg) -> HttpService:
        """:returns: the service of ``cfg`` (made on first use)."""
        service = self.services.get(cfg)
        if service is None:
            tls = None
            if cfg.tls_ca is not None:
                tls = self.trusted.get(cfg.tls_ca) or self.trusted.setdefault(
                    cfg.tls_ca, TrustedCAs(cfg.tls_ca))
            service = self.services[cfg] = HttpService(cfg, tls=tls)
        return service

    @hookimpl
    def tbmq_authentication_scope(self, config):
        """Every CONNECT without an Authentication Method; none without
        ``auth.http.url``."""
        return _SCOPE if config.auth.http.url is not None else NO_REQUEST

    @hookimpl
    def tbmq_authenticate(self, request):
        """Ask the service (see the module's docstring).

        :returns: a Deferred firing with an :class:`~tbmq.auth.AuthResult`
            (``allow``, ``deny``) or None (``ignore``, or no decision:
            then :attr:`~tbmq.auth.AuthRequest.undecided` is set); None at
            once for an enhanced authentication or a re-authentication.
        """
        if request.auth_method is not None or request.reauthenticate:
            return None
        cfg = request.config.auth.http
        if cfg.url is None:
            return None
        return defer.ensureDeferred(self._authenticate(self.service(cfg), request))

    async def _authenticate(self, service: HttpService, request):
        decision = await service.ask(request)
        if decision is None:
            request.undecided = "http"
            return None
        if decision.result == "deny":
            return AuthResult(False, reason_code=ReasonCode.NOT_AUTHORIZED, provider="http")
        if decision.result == "ignore":
            return None
        return AuthResult(True, decision.client_type, provider="http",
                          rules=decision.rules.bind(request.client_id, request.username,
                                                    request.certificate_cn))

    @hookimpl
    def tbmq_broker_stopping(self, broker):
        for service in self.services.values():
            service.close()


plugin = HttpAuth()
