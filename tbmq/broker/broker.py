"""The composition root of one node: it builds the backends, the router, the
sessions, the sinks and the hooks, hands each its few collaborators, and
starts and stops them.  Nothing reaches through it at run time; it never
does network I/O itself.
"""

from __future__ import annotations

import os
import socket
import uuid
from functools import partial

import pluggy
from twisted.internet import defer
from twisted.logger import Logger

from tbmq.auth.watch import CredentialsWatcher
from tbmq.broker.hooks import DropCounter, Hooks
from tbmq.broker.limits import NodeLimits
from tbmq.broker.outbound import Holds, TurnFlusher
from tbmq.broker.protocol import ConnectionContext
from tbmq.broker.router import Router
from tbmq.broker.session import SessionContext, TopicNameCache, next_seq
from tbmq.broker.traffic import Traffic, heartbeat_counters
from tbmq.broker.sessions import SessionManager
from tbmq.cluster.membership import Membership
from tbmq.cluster.blocked import BlockedClients
from tbmq.cluster.registry import SessionRegistry, SubscriptionBook
from tbmq.cluster.unauthorized import UnauthorizedLog
from tbmq.cluster.session_events import SessionEvents
from tbmq.cluster.sinks import (
    ApplicationReader, DownlinkReader, PersistedWriter, Sinks, write_marker,
)
from tbmq.cluster.topics import CLUSTER_BUNDLE, TopicCatalogue, node_group
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.mqtt import ReasonCode
from tbmq.node_view import NodeView
from tbmq.plugins import first_result, log_plugins


def default_service_id() -> str:
    """TBMQ's service id default: the host name."""
    return socket.gethostname() or "tbmq"


#: The file in ``data_dir`` that keeps a generated service id.
SERVICE_ID_FILE = "service_id"


def service_id_of(config) -> str:
    """This node's service id: ``node.service_id``; else, for the embedded
    bus, the host name (one node); else the id kept in
    ``data_dir/service_id``, made once as ``<host name>-<8 hex digits>`` so
    that two nodes on one host never share one.

    :raises OSError: when the data directory cannot be written.
    """
    if config.node.service_id:
        return config.node.service_id
    if config.bus == "memory":
        return default_service_id()
    path = os.path.join(config.data_dir, SERVICE_ID_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            kept = f.read().strip()
        if kept:
            return kept
    except FileNotFoundError:
        pass
    made = f"{default_service_id()}-{uuid.uuid4().hex[:8]}"
    os.makedirs(config.data_dir, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(made + "\n")
    os.replace(path + ".tmp", path)
    return made


class Broker:
    """One node.

    :param config: the :class:`tbmq.config.Config`.
    :param plugins: the :class:`pluggy.PluginManager` (see
        :func:`tbmq.plugins.make_plugin_manager`).
    :param clock: an ``IReactorTime``; ``clock.seconds()`` is the wall clock
        in seconds (a :class:`twisted.internet.task.Clock` in tests).
    :param bus, retained_store, device_store, credential_store:
        the backends; when None they come from the factory hooks.
    :raises tbmq.errors.ConfigError: when no plugin provides a backend the
        config names.
    :ivar traffic: the node's :class:`tbmq.broker.traffic.Traffic` counters.
    """

    log = Logger(observer=LOG_OBSERVER)

    #: the share of ``mqtt.connect_timeout`` a connect waits for the
    #: cluster's answer (a session event response): past it the client gets
    #: CONNACK SERVER_UNAVAILABLE (0x88; v3: 3 Server unavailable) and
    #: retries, instead of a silent close when the connect timeout ends the
    #: connection first.  The answer is late when the member deciding for the
    #: client id is gone and its partitions have not moved yet (a consumer
    #: group's session timeout).
    CONNECT_ANSWER_SHARE = 0.8

    def __init__(self, config, plugins: pluggy.PluginManager, clock=None, *,
                 bus=None, retained_store=None, device_store=None,
                 credential_store=None) -> None:
        from tbmq.errors import ConfigError

        if clock is None:
            from twisted.internet import reactor as clock
        self.config = config
        self.plugins = plugins
        self.clock = clock
        self.service_id = service_id_of(config)
        hook = plugins.hook
        provided: dict[str, list[str]] = {}

        def make(given, factory, what: str, **kwargs):
            if given is not None:
                return given
            made, plugin = first_result(factory, config=config, **kwargs)
            if made is not None and plugin is not None:
                provided.setdefault(plugin, []).append(what)
            return made

        bus = make(bus, hook.tbmq_message_bus, f"bus {config.bus}", clock=clock)
        if bus is None:
            raise ConfigError(f"bus: no plugin provides the bus {config.bus!r}")
        retained_store = make(retained_store, hook.tbmq_retained_store,
                              f"retained store {config.storage.backend}")
        device_store = make(device_store, hook.tbmq_device_message_store,
                            f"device store {config.storage.device_store_name}")
        if retained_store is None:
            raise ConfigError(
                f"storage.backend: no plugin provides {config.storage.backend!r}")
        if device_store is None:
            raise ConfigError(f"storage.device_store: no plugin provides "
                              f"{config.storage.device_store_name!r}")
        credential_store = make(credential_store, hook.tbmq_credential_store,
                                f"credentials {config.auth.credentials}", reactor=None)
        if credential_store is None:
            raise ConfigError(
                f"auth.credentials: no plugin provides {config.auth.credentials!r}")
        log_plugins(plugins, provided)
        #: the latencies of backend calls (:class:`tbmq.timing.CallTimes`),
        #: measured only while the HTTP listener (and so ``/metrics``) is on
        self.call_times = None
        if config.http.endpoint is not None:
            from tbmq.timing import instrument

            self.call_times, (bus, retained_store, device_store, credential_store) = \
                instrument(bus, retained_store, device_store, credential_store)
        self.credential_store = credential_store
        self.bus = bus
        self.retained_store = retained_store
        self.device_store = device_store
        self.topics = getattr(bus, "catalogue", None) or TopicCatalogue()
        self.hooks = Hooks(plugins, config.auth.providers, config)
        self.drops = DropCounter()
        # the latency histogram's only readers are behind the HTTP listener
        self.traffic = Traffic(observe_latency=config.http.endpoint is not None)
        self.flusher = TurnFlusher(clock)
        self.holds = Holds()
        self.connections: set = set()
        self.sessions_by_id: dict = {}
        self.registry = SessionRegistry(bus, self.topics.client_session, self.service_id,
                                        clock)
        self.sinks = Sinks.build(bus, self.topics)
        self.router = Router(bus, self.topics, self.service_id, clock, retained_store,
                             self.sessions_by_id, self.registry.get, self.sinks)
        self.limits = self._limits(config.mqtt, clock)
        self.applications = ApplicationReader(bus, self.topics.app, self.topics.app_shared,
                                              config.kafka.enable_topic_deletion)
        self.book = SubscriptionBook(bus, self.topics.client_subscriptions, self.service_id,
                                     self.router, clock)
        self.sessions = SessionManager(self._session_context, self.router, self.registry,
                                       self.book, self.service_id, self.sessions_by_id)
        self.events = SessionEvents(bus, self.topics, self.service_id, self.registry, clock,
                                    self.sessions.drop_local, self.sessions.forget_local,
                                    self.sessions.take_over,
                                    timeout=min(config.node.connect_answer_timeout,
                                                self.CONNECT_ANSWER_SHARE
                                                * config.mqtt.connect_timeout),
                                    clear=self.sessions.clear_offline)
        self.sessions.events = self.events
        self.registry.stale_listeners.append(self.sessions.restate)
        self.membership = Membership(
            bus, self.topics.nodes, self.service_id, clock, self.registry,
            self.events.request_takeover, config.node.heartbeat_interval,
            config.node.node_timeout,
            tuple(lc.label for lc in config.listeners),
            counters=partial(heartbeat_counters, self.traffic, self.drops.counts,
                             self.connections, self.sessions_by_id))
        self.persisted_writer = PersistedWriter(
            device_store, self.sessions_by_id, self.registry.locate, self.service_id, bus,
            self.topics.downlink_persisted, clock, next_seq, self.drops,
            gone=self.membership.is_gone)
        self.registry.listeners.append(self.persisted_writer.session_changed)
        self.downlink_reader = DownlinkReader(self.sessions_by_id, clock)
        self.watcher: CredentialsWatcher | None = None
        #: the blocked clients and the unauthorized-client log of the cluster
        self.blocked = BlockedClients(bus, self.topics.client_blocked, self.service_id, clock,
                                      self.connections)
        unauthorized = config.mqtt.unauthorized_clients
        self.unauthorized = UnauthorizedLog(bus, self.topics.client_unauthorized,
                                            self.service_id, clock, unauthorized.ttl,
                                            unauthorized.max_entries)
        #: what operations and plugins see of this node (one view, handed to
        #: the ops service and to the ``tbmq_broker_started``/``stopping`` hooks)
        self.view = NodeView(self)

    def _limits(self, mqtt, clock) -> NodeLimits | None:
        """The node's :class:`~tbmq.broker.limits.NodeLimits`, wired where
        its limits apply, or None when every limit is off (nothing is
        checked then)."""
        limits = NodeLimits(mqtt, clock, self.drops,
                            nodes=lambda: len(self.membership.alive()))
        if limits.device_persisted is not None:
            self.router.persisted_limit = limits
        if limits.application_clients_limit:
            self.registry.listeners.append(limits.session_changed)
        if not (limits.checks_incoming or limits.checks_outgoing or limits.checks_sessions
                or limits.device_persisted is not None):
            return None
        return limits

    def _session_context(self, manager) -> SessionContext:
        return SessionContext(
            clock=self.clock, mqtt=self.config.mqtt, hooks=self.hooks, drops=self.drops,
            flusher=self.flusher, holds=self.holds, device_store=self.device_store,
            publish=self.router.publish, publish_many=self.router.publish_many,
            retained_for=self.router.retained_for,
            subscriptions=manager, topics=TopicNameCache(), auth=self.config.auth,
            applications=self.applications, traffic=self.traffic,
            mark=partial(write_marker, self.sinks.persisted, self.service_id),
            limits_in=self._limits_if("checks_incoming"),
            limits_out=self._limits_if("checks_outgoing"))

    def _limits_if(self, which: str) -> NodeLimits | None:
        limits = self.limits
        return limits if limits is not None and getattr(limits, which) else None

    def connection_context(self) -> ConnectionContext:
        """What the connections of a listener use of this node."""
        return ConnectionContext(
            clock=self.clock, config=self.config, hooks=self.hooks, sessions=self.sessions,
            connections=self.connections, flusher=self.flusher,
            credentials=self.credential_store, traffic=self.traffic, blocked=self.blocked,
            unauthorized=self.unauthorized, limits=self._limits_if("checks_sessions"))

    @property
    def dropped(self) -> dict[str, int]:
        """Messages not delivered on this node, by reason."""
        return self.drops.counts

    def refresh_hooks(self) -> None:
        """Look again at which hooks plugins implement (after registering a
        plugin at run time): hooks nobody implements cost nothing per message."""
        self.hooks.refresh()

    def bus_topic(self, name: str) -> str:
        """The bus topic name for TBMQ topic ``name`` (the catalogue's prefix
        applied)."""
        return self.topics.prefix + name

    # -- life cycle --------------------------------------------------------------

    @defer.inlineCallbacks
    def start(self):
        """Start the backends and reload retained messages and persistent
        sessions (with their queued deliveries).

        :returns: a Deferred that fires when the node can accept clients.
        """
        backends = self._backends()
        for backend in backends:
            yield backend.start()
        retained_replayed = self.router.start()
        bus = self.bus
        writer = self.persisted_writer
        writer.consumer = bus.subscribe(self.topics.msg_persisted, "tbmq-msg-persisted",
                                        writer.handle, bundle=CLUSTER_BUNDLE,
                                        batch_handler=writer.handle_batch)
        # the cluster bundle's groups are joined together (one Kafka join);
        # the session events' member waits, paused, for the registry replay
        self.events.join()
        reader = self.downlink_reader
        group = node_group(self.service_id)
        reader.basic = bus.subscribe(self.topics.downlink_basic(self.service_id), group,
                                     reader.handle_basic, exclusive=True,
                                     batch_handler=reader.handle_basic_batch)
        reader.persisted = bus.subscribe(self.topics.downlink_persisted(self.service_id),
                                         group, reader.handle_persisted, exclusive=True,
                                         batch_handler=reader.handle_persisted_batch)
        self.watcher = CredentialsWatcher(self.credential_store, self.connections, self.clock,
                                          self.config.auth.refresh_interval)
        yield self.watcher.start()
        for message in (yield self.retained_store.load_all()):
            self.router.retained.set(message)
        yield defer.gatherResults([self.registry.start(), self.book.start(), retained_replayed,
                                   self.blocked.start(), self.unauthorized.start()],
                                  consumeErrors=True)
        self.events.start()
        self.membership.start()
        # accept clients only once every consumer group is joined and
        # positioned: a message acknowledged before tbmq.msg.all's group
        # has a position would be read from past it
        yield defer.gatherResults([c.caught_up for c in self.consumers()], consumeErrors=True)
        restored = self.sessions.restore()
        self.log.info("broker {service_id} started: {sessions} persistent sessions, "
                      "{retained} retained messages", service_id=self.service_id,
                      sessions=restored, retained=len(self.router.retained))
        self.plugins.hook.tbmq_broker_started(broker=self.view)

    def consumers(self) -> list:
        """:returns: every bus consumer of this node (``IConsumer``), its
        sessions' included."""
        found = [self.router.consumer, self.router.retained_consumer,
                 self.persisted_writer.consumer, self.downlink_reader.basic,
                 self.downlink_reader.persisted, self.registry.consumer, self.book.consumer,
                 self.membership.consumer, *self.events.consumers, self.blocked.consumer,
                 self.unauthorized.consumer]
        for session in self.sessions.sessions.values():
            found.extend(session.app_consumers.values())
        return [c for c in found if c is not None]

    def _backends(self) -> list:
        seen, out = set(), []
        for backend in (self.bus, self.retained_store, self.device_store,
                        self.credential_store):
            if id(backend) not in seen:
                seen.add(id(backend))
                out.append(backend)
        return out

    @defer.inlineCallbacks
    def stop(self):
        """Close every connection (v5 clients get DISCONNECT
        SERVER_SHUTTING_DOWN), then
        flush and stop the backends."""
        self.plugins.hook.tbmq_broker_stopping(broker=self.view)
        if self.watcher is not None:
            self.watcher.stop()
        self.blocked.stop()
        self.unauthorized.stop()
        connections = list(self.connections)
        closed = [conn.when_closed() for conn in connections]
        for conn in connections:
            conn.disconnect(ReasonCode.SERVER_SHUTTING_DOWN)  # aborted after 5 s if stuck
        if closed:
            yield defer.DeferredList(closed)
        now = self.clock.seconds()
        for session in list(self.sessions.sessions.values()):
            if session.persistent and session.connection is None and session.disconnected_at is None:
                session.disconnected_at = now
        left = [c.stop() for c in self.consumers()]  # the others take the partitions
        yield defer.DeferredList([d for d in left if d is not None], consumeErrors=True)
        try:
            yield self.membership.stop()
        except Exception as e:
            self.log.warn("last heartbeat not sent: {error}", error=e)
        for backend in reversed(self._backends()):
            yield backend.stop()
