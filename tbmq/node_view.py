"""What operations and plugins see of a node: :class:`NodeView`, a read-only
view of one :class:`tbmq.broker.broker.Broker` with the few operations they
may ask of it (ARCHITECTURE §3, "Plugins get documented public views").

The ops service (:mod:`tbmq.ops`: the metrics, ``$SYS``, the admin API),
the event exporter (:mod:`tbmq.events`) and every plugin (the ``broker``
argument of :func:`tbmq.hookspecs.tbmq_broker_started` and
:func:`~tbmq.hookspecs.tbmq_broker_stopping`) get this view, never the
``Broker``: what they read is listed here, and the broker's internals may
change without them.  The broker makes one view (``Broker.view``) and hands
that same object everywhere, so a plugin may tell its node's view by
identity.

Reads copy or wrap what they return (read-only mappings, lists), except
the counters (:attr:`NodeView.traffic`), live objects whose fields only
the broker writes.  Nothing here is on the message path: each read walks
the node's tables when it is called.

This module sits below both the broker and ops: it imports neither.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from tbmq.broker.limits import SESSION_LIMITS
from tbmq.model import Message
from tbmq.views import SessionView


class NodeView:
    """A read-only view of one node, and the operations operators ask of it.

    :param broker: the :class:`tbmq.broker.broker.Broker` it shows (private:
        :attr:`_broker`, which no reader outside this module uses).
    """

    __slots__ = ("_broker",)

    def __init__(self, broker) -> None:
        self._broker = broker

    # -- the node ------------------------------------------------------------------

    @property
    def service_id(self) -> str:
        """This node's service id (``node.service_id``), ``str``."""
        return self._broker.service_id

    @property
    def config(self):
        """The node's :class:`tbmq.config.Config` (read it, never change it)."""
        return self._broker.config

    @property
    def clock(self):
        """The node's ``IReactorTime`` (``seconds()``, ``callLater``)."""
        return self._broker.clock

    @property
    def started_at(self) -> float | None:
        """Seconds (the node's clock) when the node started following the
        cluster's heartbeats, or None before its start."""
        return self._broker.membership.started_at

    # -- sessions of this node --------------------------------------------------------

    def sessions(self) -> dict[str, SessionView]:
        """:returns: client id → :class:`~tbmq.views.SessionView` of every
        session this node holds (a new dict)."""
        return {cid: s.view for cid, s in list(self._broker.sessions_by_id.items())}

    def session(self, client_id: str) -> SessionView | None:
        """:returns: the :class:`~tbmq.views.SessionView` of ``client_id``'s
        session if this node holds it, else None."""
        session = self._broker.sessions_by_id.get(client_id)
        return None if session is None else session.view

    def backlog(self, client_id: str) -> tuple[int, int] | None:
        """:returns: ``(queued, inflight)``: messages waiting in the session's
        in-memory queue and PUBLISH packets awaiting their acknowledgement,
        of ``client_id``'s session on this node; None when this node does
        not hold it."""
        session = self._broker.sessions_by_id.get(client_id)
        if session is None:
            return None
        return len(session.queue), len(session.inflight)

    async def stored_messages(self, client_id: str) -> int:
        """:returns: messages the device store keeps for ``client_id`` (a
        persistent DEVICE session's queue, ``ITbmqDeviceMessageStore.count``).

        :raises tbmq.errors.BackendError: the store failed.
        """
        return int(await self._broker.device_store.count(client_id))

    def connections_by_listener(self) -> dict[str, int]:
        """:returns: listener name → MQTT connections open on it now (those
        before CONNECT included; ``"?"`` for a connection of no listener)."""
        counts: dict[str, int] = {}
        for conn in list(self._broker.connections):
            name = getattr(getattr(conn, "listener", None), "name", "?")
            counts[name] = counts.get(name, 0) + 1
        return counts

    def connection_count(self) -> int:
        """:returns: MQTT connections open on this node now."""
        return len(self._broker.connections)

    # -- the cluster's registries ----------------------------------------------------

    def cluster_sessions(self) -> Mapping[str, Any]:
        """:returns: client id → :class:`tbmq.cluster.records.SessionInfo`
        of every session of the cluster (``tbmq.client.session``), a
        read-only mapping over the live registry."""
        return MappingProxyType(self._broker.registry.sessions)

    def cluster_session(self, client_id: str):
        """:returns: the :class:`~tbmq.cluster.records.SessionInfo` of
        ``client_id``, or None when the cluster has no session of it."""
        return self._broker.registry.get(client_id)

    def sessions_by_node(self) -> dict[str, int]:
        """:returns: service id → sessions the registry shows held there."""
        return {sid: len(held) for sid, held in list(self._broker.registry.by_node.items())}

    def subscriptions(self) -> Mapping[str, Mapping]:
        """:returns: client id → (topic filter →
        :class:`tbmq.model.SubscriptionOptions`) of every session of the
        cluster (``tbmq.client.subscriptions``), read-only."""
        return MappingProxyType(self._broker.book.subscriptions)

    def subscriptions_of(self, client_id: str) -> Mapping:
        """:returns: topic filter → :class:`~tbmq.model.SubscriptionOptions`
        of ``client_id`` (empty when it has none), read-only."""
        return MappingProxyType(self._broker.book.of(client_id))

    # -- retained messages -----------------------------------------------------------------

    def retained_count(self) -> int:
        """:returns: retained messages this node holds (every node holds the
        cluster's; this node's own ``$SYS`` topics included)."""
        return len(self._broker.router.retained)

    def retained(self, topic: str) -> Message | None:
        """:returns: the retained :class:`~tbmq.model.Message` of topic name
        ``topic``, or None."""
        return self._broker.router.retained.get(topic)

    def retained_for(self, topic_filter: str) -> list[Message]:
        """:returns: the retained messages whose topic names match
        ``topic_filter`` (a valid, non-shared topic filter)."""
        return list(self._broker.router.retained_for(topic_filter))

    # -- counters -----------------------------------------------------------------------------

    @property
    def traffic(self):
        """The node's :class:`tbmq.broker.traffic.Traffic` counters (messages
        and bytes by QoS, delivery latencies); read them, never write."""
        return self._broker.traffic

    def dropped(self) -> dict[str, int]:
        """:returns: reason (:data:`tbmq.broker.hooks.DROP_REASONS`) →
        messages not delivered on this node (a copy)."""
        return dict(self._broker.drops.counts)

    def sessions_refused(self) -> dict[str, int]:
        """:returns: session limit (:data:`tbmq.broker.limits.SESSION_LIMITS`)
        → CONNECTs it refused on this node (a copy; zeros when no session
        limit is set)."""
        limits = self._broker.limits
        if limits is None:
            return dict.fromkeys(SESSION_LIMITS, 0)
        return dict(limits.refused)

    @property
    def call_times(self):
        """The latencies of the node's backend calls
        (:class:`tbmq.timing.CallTimes`), or None when they are not measured
        (no HTTP listener)."""
        return self._broker.call_times

    def consumers(self) -> list:
        """:returns: every bus consumer of this node
        (:class:`tbmq.interfaces.IConsumer`; those that can tell have a
        ``lag()``)."""
        return self._broker.consumers()

    # -- membership ---------------------------------------------------------------------------

    def alive_nodes(self) -> list[str]:
        """:returns: the service ids of the nodes alive (heard from within
        ``node.node_timeout``), this one included."""
        return list(self._broker.membership.alive())

    def known_nodes(self) -> dict[str, Any]:
        """:returns: service id → the last
        :class:`tbmq.cluster.records.NodeInfo` heartbeat heard of it (this
        node's own included once it came back)."""
        return dict(self._broker.membership.nodes)

    def last_heard(self) -> dict[str, float]:
        """:returns: service id → seconds (this node's clock) when it was
        last heard."""
        return dict(self._broker.membership.last_seen)

    def previous_heartbeats(self) -> dict[str, Any]:
        """:returns: service id → the :class:`tbmq.cluster.records.NodeInfo`
        heartbeat heard before the last one of that node (a node's rates are
        the difference of the two)."""
        return dict(self._broker.membership.previous)

    def heartbeat_counters(self) -> dict[str, int]:
        """:returns: this node's totals as its next heartbeat sends them
        (:attr:`tbmq.cluster.records.NodeInfo.counters`; ``{}`` when the
        node sends none), read now."""
        counters = self._broker.membership.counters
        return dict(counters()) if counters is not None else {}

    @property
    def integrations(self):
        """The node's outbound integrations
        (:class:`tbmq.integrations.plugin.Integrations`: ``snapshot()``,
        ``put(body)``, ``delete(name)``, ``collector()``), or None on a node
        built without them."""
        return self._broker.plugins.get_plugin("integrations")

    # -- backends ------------------------------------------------------------------------------

    @property
    def credential_store(self):
        """The node's :class:`tbmq.interfaces.ITbmqCredentialStore` (the
        admin API lists and changes records through it; every node sees a
        change within ``auth.refresh_interval``)."""
        return self._broker.credential_store

    @property
    def bus(self):
        """The node's :class:`tbmq.interfaces.IMessageBus` (to publish on
        a topic of one's own, as the event exporter's ``bus`` sink does)."""
        return self._broker.bus

    def bus_topic(self, name: str) -> str:
        """:returns: the bus topic name of TBMQ topic ``name`` (the
        catalogue's prefix applied)."""
        return self._broker.bus_topic(name)

    # -- blocked clients and refused attempts ----------------------------------------------------

    def blocked_clients(self) -> list:
        """:returns: the cluster's blocked-client entries in force
        (:class:`tbmq.cluster.client_records.BlockedClient`), as
        :meth:`tbmq.cluster.blocked.BlockedClients.listing` orders them."""
        return self._broker.blocked.listing()

    def blocked_client(self, entry_id: str):
        """:returns: the blocked-client entry ``entry_id``, or None."""
        return self._broker.blocked.entries.get(entry_id)

    def block_client(self, entry):
        """Add ``entry`` (a :class:`~tbmq.cluster.client_records.BlockedClient`)
        on every node; the connections it matches are closed.

        :returns: a Deferred firing once the bus has it.
        """
        return self._broker.blocked.add(entry)

    def unblock_client(self, entry_id: str):
        """Remove the entry ``entry_id`` on every node.

        :returns: a Deferred firing once the bus has it, or None when there
            is no such entry.
        """
        return self._broker.blocked.remove(entry_id)

    def unauthorized_attempts(self) -> list:
        """:returns: the last refused attempt per client id, newest first
        (:class:`tbmq.cluster.client_records.UnauthorizedAttempt`)."""
        return self._broker.unauthorized.listing()

    @property
    def unauthorized_evicted(self) -> int:
        """Refused attempts this node dropped at
        ``mqtt.unauthorized_clients.max_entries``."""
        return self._broker.unauthorized.evicted

    def clear_unauthorized(self):
        """Forget the refused attempts on every node.

        :returns: a Deferred firing with how many there were.
        """
        return self._broker.unauthorized.clear()

    # -- operations -----------------------------------------------------------------------------

    def disconnect_client(self, client_id: str) -> bool:
        """Close ``client_id``'s connection wherever it is (DISCONNECT
        ADMINISTRATIVE_ACTION to a v5 client), through the node that holds it.

        :returns: False when the registry shows no connection of it.
        """
        return self._broker.events.disconnect_client(client_id)

    def clear_session(self, client_id: str) -> bool:
        """End ``client_id``'s offline session wherever it is held (TBMQ's
        session removal: its subscriptions, queue and, for a persistent
        APPLICATION client, its ``tbmq.msg.app`` topic go).

        :returns: False when the registry shows no session of it, or a
            connected one (disconnect it first).
        """
        return self._broker.events.clear_session(client_id)

    def delete_retained(self, topic: str):
        """Delete the retained message of ``topic`` on every node (a
        tombstone on ``tbmq.msg.retained``; subscribers get nothing).

        :returns: a Deferred firing once the bus acknowledged it, or None.
        """
        router = self._broker.router
        return router.bus.publish(router.topics.msg_retained, topic, None)

    def publish_local(self, message: Message) -> None:
        """Keep ``message`` as this node's own retained message of its topic
        (not sent to the other nodes) and deliver it at QoS 0 to this node's
        connected subscribers (the ``$SYS`` topics: each node publishes its
        own)."""
        broker = self._broker
        router = broker.router
        sessions = broker.sessions_by_id
        router.retained.set(message)
        topic = message.topic
        targets = [target for subs in router.trie.match(topic) for target in subs.items()]
        for groups in router.shared.match(topic):
            for group in groups.values():
                picked = group.pick(lambda c: c in sessions)
                if picked is not None:
                    targets.append(picked)
        now = message.received_at
        for client_id, options in targets:
            session = sessions.get(client_id)
            if session is None or session.connection is None:
                continue
            sid = options.subscription_id
            session.outbox.deliver(message, 0, options.retain_as_published,
                            () if sid is None else (sid,), None, now)

    def register_plugin(self, plugin: object, name: str | None = None) -> None:
        """Register ``plugin`` (an object with ``@hookimpl`` methods) in the
        node's plugin manager, and make the node call its hooks from now on.

        :raises ValueError: a plugin of that name or that object is already
            registered (pluggy's error).
        """
        broker = self._broker
        broker.plugins.register(plugin, name=name)
        broker.refresh_hooks()

    def unregister_plugin(self, plugin: object) -> None:
        """Remove ``plugin`` from the node's plugin manager (no-op when it is
        not registered)."""
        broker = self._broker
        if broker.plugins.is_registered(plugin):
            broker.plugins.unregister(plugin)
            broker.refresh_hooks()

    def __repr__(self) -> str:
        return f"<NodeView {self.service_id!r}>"
