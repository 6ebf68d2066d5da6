"""Operations of one node, started by :class:`tbmq.service.BrokerService`
once the broker listens: the ``$SYS`` topics (every ``sys_interval`` seconds), and, when
``http.endpoint`` is set, the HTTP listener with ``/metrics``, the admin API
and the web console.
"""

from __future__ import annotations

from twisted.logger import Logger

from tbmq.listeners import listen_on, parse_endpoint
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.ops.stats import History, NodeStats

log = Logger(observer=LOG_OBSERVER)


def endpoint_string(endpoint: str) -> str:
    """``http.endpoint`` as it is listened on: an endpoint that names no
    ``interface=`` gets ``interface=127.0.0.1`` (loopback only)."""
    kind = endpoint.split(":", 1)[0].lower()
    if kind in ("tcp", "tcp6", "ssl") and "interface=" not in endpoint:
        return endpoint + ":interface=" + ("::1" if kind == "tcp6" else "127.0.0.1")
    return endpoint


class OpsService:
    """The ``$SYS`` topics, the metrics and the admin API of a broker.

    :param node: the node's :class:`tbmq.node_view.NodeView` (never the
        ``Broker``: ops reads the node through its view).
    :param reactor: the reactor.
    :ivar stats: the :class:`~tbmq.ops.stats.NodeStats`, registered as the
        plugin ``ops`` (it counts authentication failures).
    :ivar port: the HTTP ``IListeningPort``, or None.
    :raises tbmq.errors.ConfigError: ``http.endpoint`` is not an endpoint
        string Twisted reads.
    """

    def __init__(self, node, reactor) -> None:
        self.node = node
        self.reactor = reactor
        self.config = node.config
        self.stats = NodeStats(node)
        node.register_plugin(self.stats, name="ops")
        self.sys_topics = None
        self.history = None
        #: the :class:`~tbmq.ops.cluster_stats.ClusterStats` (with the HTTP
        #: listener), or None
        self.cluster = None
        self.port = None
        #: the HTTP endpoint, read now so that a bad string stops the node
        #: when it is made
        self.endpoint = None
        if self.config.http.endpoint is not None:
            self.endpoint = parse_endpoint(reactor, endpoint_string(self.config.http.endpoint),
                                           self.config.http.endpoint, "http.endpoint")

    async def start(self) -> None:
        """Start publishing ``$SYS`` and listening on ``http.endpoint``.

        :raises tbmq.errors.StartupError: ``http.endpoint`` cannot listen
            (``cannot listen on tcp:8083: address already in use
            (http.endpoint)``).
        """
        config = self.config
        if config.sys_interval > 0:
            from tbmq.ops.sys_topics import SysTopics

            self.sys_topics = SysTopics(self.stats, self.node, self.reactor,
                                        config.sys_interval)
            self.sys_topics.start()
        if config.http.endpoint is None:
            return
        from tbmq.ops.admins import AdminAuth, open_admin_store
        from tbmq.ops.api.app import AdminApi
        from tbmq.ops.api.kafka import BusOverview
        from tbmq.ops.cluster_stats import ClusterStats
        from tbmq.ops.http import make_site
        from tbmq.ops.metrics import make_registry

        self.history = History(self.stats, self.reactor)
        self.history.start()
        self.cluster = ClusterStats(self.node, self.reactor)
        self.cluster.start()
        auth = AdminAuth(open_admin_store(config), config.http.token_ttl)
        api = AdminApi(self.node, self.stats, self.history, auth, self.reactor,
                       cluster=self.cluster, bus=BusOverview(self.node.bus, self.reactor))
        registry = make_registry(self.stats)
        integrations = self.node.integrations
        if integrations is not None:
            registry.register(integrations.collector())
        site = make_site(registry, api, auth, config.http.metrics_auth)
        self.port = await listen_on(self.endpoint, site, config.http.endpoint, "http.endpoint")
        host = self.port.getHost()
        users = await auth.store.list()
        log.info("HTTP on {host}:{port}: /metrics, /api/, /console/ ({users})",
                 host=getattr(host, "host", host), port=getattr(host, "port", ""),
                 users=f"{len(users)} admin user(s)" if users else
                 "no admin user: the API refuses everything; add one with 'tbmq admin add'")

    async def stop(self) -> None:
        """Stop listening and publishing."""
        if self.port is not None:
            await self.port.stopListening()
            self.port = None
        for part in (self.sys_topics, self.history, self.cluster):
            if part is not None:
                part.stop()
