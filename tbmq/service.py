"""The node as a Twisted service: the broker's backends first, then one
listening port per configured listener."""

from __future__ import annotations

from twisted.application import service
from twisted.internet import defer
from twisted.logger import Logger

from tbmq import listeners
from tbmq.broker.broker import Broker
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.ops.service import OpsService
from tbmq.plugins import make_plugin_manager


class BrokerService(service.Service):
    """Starts the :class:`~tbmq.broker.broker.Broker` (state loaded from the
    stores), then listens on every ``config.listeners`` entry with
    :func:`tbmq.listeners.listen` (TCP, TLS, WebSocket, PROXY protocol); stops
    in the reverse order, flushing the stores last.  A listener that cannot
    start (address in use, unreadable certificate) stops the node.

    :param config: the :class:`tbmq.config.Config`.
    :param reactor: the reactor (listening and clock).
    :ivar ports: the ``IListeningPort`` of each listener once started.
    :ivar ops: the :class:`tbmq.ops.service.OpsService` (``$SYS``, and the
        HTTP listener of ``http.endpoint``), started after the listeners.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, config, reactor=None, plugins=None) -> None:
        if reactor is None:
            from twisted.internet import reactor
        self.config = config
        self.reactor = reactor
        self.plugins = plugins if plugins is not None else make_plugin_manager(config)
        self.broker = Broker(config, self.plugins, clock=reactor)
        self.ops = OpsService(self.broker, reactor)
        self.ports: list = []
        self.started: defer.Deferred = defer.Deferred()

    def startService(self) -> None:
        service.Service.startService(self)
        d = defer.ensureDeferred(self._start())
        d.addErrback(self._failed)

    async def _start(self) -> None:
        await self.broker.start()
        for listener in self.config.listeners:
            port = await listeners.listen(self.broker, listener, self.reactor)
            self.ports.append(port)
            host = port.getHost()
            extras = []
            if listener.type in ("ws", "wss"):
                extras.append(f"path {listener.ws_path}")
            if listener.type in ("tls", "wss"):
                extras.append(f"client certificates {listener.tls_client_auth}")
            if listener.proxy_protocol:
                extras.append("PROXY protocol")
            self.log.info(
                "listener {name} ({type}) on {host}:{port}{extras}", name=listener.name,
                type=listener.type, host=getattr(host, "host", host),
                port=getattr(host, "port", ""), address=host,
                extras="".join(f", {e}" for e in extras))
        await self.ops.start()
        self.started.callback(self)

    def _failed(self, failure) -> None:
        self.log.failure("tbmq failed to start", failure)
        if not self.started.called:
            self.started.errback(failure)
        if self.reactor.running:
            self.reactor.stop()

    @defer.inlineCallbacks
    def stopService(self):
        service.Service.stopService(self)
        yield defer.ensureDeferred(self.ops.stop())
        for port in self.ports:
            yield port.stopListening()
        self.ports = []
        yield self.broker.stop()
