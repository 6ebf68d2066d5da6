"""The node as a Twisted service: the broker's backends first, then one
listening port per configured listener."""

from __future__ import annotations

from twisted.application import service
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq import listeners
from tbmq.broker.broker import Broker
from tbmq.errors import TbmqError
from tbmq.integrations.plugin import Integrations
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.ops.service import OpsService
from tbmq.plugins import make_plugin_manager


def startup_problem(failure: Failure) -> str | None:
    """What stopped a node from starting, on one line.

    :param failure: the failure of the start.
    :returns: the message of a :class:`~tbmq.errors.TbmqError` (a
        :class:`~tbmq.errors.ConfigError`, a
        :class:`~tbmq.errors.StartupError` such as ``cannot listen on
        tcp:1883: address already in use (listeners[0].endpoint)``, a
        backend's error), or None for any other exception (a bug, whose
        traceback is worth logging).
    """
    if failure.check(TbmqError):
        return " ".join(str(failure.value).split())
    return None


def _failure_now(d: defer.Deferred) -> Failure | None:
    """The failure ``d`` has already fired with (now consumed), else None."""
    box: list = []
    d.addBoth(lambda result: box.append(result) or result)
    if box and isinstance(box[0], Failure):
        d.addErrback(lambda _: None)
        return box[0]
    return None


class BrokerService(service.Service):
    """Starts the :class:`~tbmq.broker.broker.Broker` (state loaded from the
    stores), then accepts connections on every ``config.listeners`` entry,
    bound with :func:`tbmq.listeners.listen` (TCP, TLS, WebSocket, PROXY
    protocol); stops in the reverse order, flushing the stores last.

    Made by ``twistd tbmq`` (:func:`tbmq.tap.makeService`): the endpoint
    strings and TLS files are read when the service is made
    (:func:`tbmq.listeners.check`), and the listeners bind in
    :meth:`privilegedStartService`, before the reactor runs, so that an
    address in use fails twistd's start itself (with ``-n`` the process
    exits, daemonized the parent reports it).  A bound listener accepts
    nothing until the broker has started (its socket is not read: clients
    wait in the kernel's backlog).  Any later failure (a backend that does
    not start, the HTTP listener) logs one line naming the cause, fails
    :attr:`started` and stops the reactor.

    :param config: the :class:`tbmq.config.Config`.
    :param reactor: the reactor (listening and clock).
    :param plugins: the plugin manager; :func:`~tbmq.plugins.make_plugin_manager`
        of ``config`` when None.
    :raises tbmq.errors.ConfigError: a backend no plugin provides, an
        endpoint string Twisted does not read, an unusable TLS file.
    :ivar ports: the ``IListeningPort`` of each listener once bound.
    :ivar ops: the :class:`tbmq.ops.service.OpsService` (``$SYS``, and the
        HTTP listener of ``http.endpoint``), started after the listeners.
    :ivar started: a Deferred firing with this service once it accepts
        connections, or failing with what stopped it.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, config, reactor=None, plugins=None) -> None:
        if reactor is None:
            from twisted.internet import reactor
        self.config = config
        self.reactor = reactor
        self.plugins = plugins if plugins is not None else make_plugin_manager(config)
        #: the outbound integrations (the plugin ``integrations``)
        self.integrations = Integrations(config, reactor, self.plugins)
        self.plugins.register(self.integrations, name="integrations")
        self.broker = Broker(config, self.plugins, clock=reactor)
        self.integrations.refresh_hooks = self.broker.refresh_hooks
        for listener in config.listeners:
            listeners.check(self.broker, listener, reactor)
        self.ops = OpsService(self.broker.view, reactor)
        self.ports: list = []
        self.started: defer.Deferred = defer.Deferred()
        self._listening: list[defer.Deferred] | None = None

    def privilegedStartService(self) -> None:
        """Bind every listener (twistd calls this before it drops privileges
        and before the reactor runs).

        :raises tbmq.errors.StartupError: a listener cannot listen
            (``cannot listen on tcp:1883: address already in use
            (listeners[0].endpoint)``), after logging it.
        """
        service.Service.privilegedStartService(self)
        self._bind()

    def _bind(self) -> None:
        """Listen on each listener, paused until :meth:`_start` resumes it.

        :raises TbmqError: the first listener that could not listen at once
            (the ones bound before it are closed).
        """
        self._listening = []
        for listener in self.config.listeners:
            d = listeners.listen(self.broker, listener, self.reactor)
            failure = _failure_now(d)
            if failure is not None:
                self._report(failure)
                for port in self.ports:
                    port.stopListening()
                self.ports = []
                failure.raiseException()
            self._listening.append(d.addCallback(self._pause))

    def _pause(self, port):
        self.ports.append(port)
        stop_reading = getattr(port, "stopReading", None)
        if stop_reading is not None:
            stop_reading()
        return port

    def startService(self) -> None:
        service.Service.startService(self)
        d = defer.ensureDeferred(self._start())
        d.addErrback(self._failed)

    async def _start(self) -> None:
        if self._listening is None:  # not started by twistd: no privileged step
            self._bind()
        await self.broker.start()
        if not self.running:
            return  # stopped while the broker started: nothing to open
        await self.integrations.start(self.broker.bus, self.broker.topics,
                                      self.broker.service_id)
        for listener, listening in zip(self.config.listeners, self._listening):
            port = await listening
            if not self.running:
                return
            start_reading = getattr(port, "startReading", None)
            if start_reading is not None:
                start_reading()
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

    def _report(self, failure: Failure) -> None:
        problem = startup_problem(failure)
        if problem is None:
            self.log.failure("tbmq could not start", failure)
        else:
            self.log.critical("tbmq could not start: {problem}", problem=problem)

    def _failed(self, failure: Failure) -> None:
        if not self.running:
            # stopped (SIGTERM) while it started: what failed is the start
            # that the stop cut short, not a problem of the node
            self.log.info("tbmq stopped while it was starting ({error})",
                          error=failure.getErrorMessage())
            return
        self._report(failure)
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
        yield defer.ensureDeferred(self.integrations.stop())
