"""The node as a Twisted service: the broker's backends first, then one
listening port per configured listener."""

from __future__ import annotations

from twisted.application import service
from twisted.internet import defer, endpoints
from twisted.logger import Logger

from tbmq.broker.broker import Broker
from tbmq.broker.protocol import MQTTFactory
from tbmq.plugins import make_plugin_manager


class BrokerService(service.Service):
    """Starts the :class:`~tbmq.broker.broker.Broker` (state loaded from the
    stores), then listens on every ``config.listeners`` endpoint; stops in the
    reverse order, flushing the stores last.

    :param config: the :class:`tbmq.config.Config`.
    :param reactor: the reactor (listening and clock).
    :ivar ports: the ``IListeningPort`` of each listener once started.
    """

    log = Logger()

    def __init__(self, config, reactor=None, plugins=None) -> None:
        if reactor is None:
            from twisted.internet import reactor
        self.config = config
        self.reactor = reactor
        self.plugins = plugins if plugins is not None else make_plugin_manager(config)
        self.broker = Broker(config, self.plugins, clock=reactor)
        self.ports: list = []
        self.started: defer.Deferred = defer.Deferred()

    def startService(self) -> None:
        service.Service.startService(self)
        d = defer.ensureDeferred(self._start())
        d.addErrback(self._failed)

    async def _start(self) -> None:
        await self.broker.start()
        for listener in self.config.listeners:
            endpoint = endpoints.serverFromString(self.reactor, listener.endpoint)
            port = await endpoint.listen(MQTTFactory(self.broker, listener))
            self.ports.append(port)
            self.log.info("listener {name} ({type}) on {address}", name=listener.name,
                          type=listener.type, address=port.getHost())
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
        for port in self.ports:
            yield port.stopListening()
        self.ports = []
        yield self.broker.stop()
