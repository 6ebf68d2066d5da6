"""Membership without a coordinator: nodes learn of each other through the
bus, and the sessions of a node that is gone are taken over.

Every node publishes a :class:`~tbmq.cluster.records.NodeInfo` heartbeat on
``tbmq.cluster.nodes`` (key: its service id) every ``node.heartbeat_interval``
seconds, and reads every other node's in a consumer group of its own.  A
node is *gone* when it has sent nothing for ``node.node_timeout`` seconds,
or said in its last heartbeat that it stops; a service id that holds
sessions in the registry but was never heard from counts from this node's
start.

For each session the registry still records on a gone node, every node
that notices asks for a takeover on ``tbmq.client.session.event.request``
(a :data:`~tbmq.cluster.records.NODE_GONE` event keyed by client id): the
one member of the deciding group that owns the client's partition takes it
over once (:meth:`tbmq.cluster.session_events.SessionEvents.decide`), so its
will is published once and its expiry runs on exactly one node.  Requests
are repeated every ``node_timeout`` while the registry still records the
session there (a lost request, a decider that moved).
"""

from __future__ import annotations

from typing import Callable

from twisted.internet import task
from twisted.logger import Logger

from tbmq.cluster.records import UNCLAIMED, NodeInfo, Record
from tbmq.cluster.topics import node_group
from tbmq.log import OBSERVER as LOG_OBSERVER

log = Logger(observer=LOG_OBSERVER)


class Membership:
    """This node's heartbeats, and what it knows of the others.

    :param bus: the :class:`tbmq.interfaces.IMessageBus`.
    :param topic: the ``tbmq.cluster.nodes`` topic name.
    :param service_id: this node's service id.
    :param clock: ``IReactorTime``.
    :param registry: the :class:`tbmq.cluster.registry.SessionRegistry`
        (its ``by_node`` index).
    :param request_takeover: ``request_takeover(info)``: ask the cluster to
        take over the session ``info`` (a
        :class:`~tbmq.cluster.records.SessionInfo`) of a gone node.
    :param heartbeat_interval: seconds between heartbeats, > 0.
    :param node_timeout: seconds of silence after which a node is gone,
        > ``heartbeat_interval``.
    :param listeners: ``tuple[str, ...]`` sent in the heartbeats.
    :param counters: ``counters() -> dict[str, int]``, this node's totals
        sent in each heartbeat (:attr:`NodeInfo.counters`), or None (none
        sent).  Called once per heartbeat.
    :ivar nodes: service id → the last :class:`NodeInfo` heard from another
        node.
    :ivar previous: service id → the heartbeat heard before that one (the
        two give another node's rates, :mod:`tbmq.ops.cluster_stats`).
    :ivar last_seen: service id → seconds (this node's clock) when it was
        last heard.
    """

    def __init__(self, bus, topic: str, service_id: str, clock, registry,
                 request_takeover: Callable, heartbeat_interval: float = 5.0,
                 node_timeout: float = 30.0, listeners: tuple = (),
                 counters: Callable[[], dict] | None = None) -> None:
        self.bus = bus
        self.topic = topic
        self.service_id = service_id
        self.clock = clock
        self.registry = registry
        self.request_takeover = request_takeover
        self.heartbeat_interval = heartbeat_interval
        self.node_timeout = node_timeout
        self.listeners = tuple(listeners)
        self.counters = counters
        self.nodes: dict[str, NodeInfo] = {}
        self.previous: dict[str, NodeInfo] = {}
        self.last_seen: dict[str, float] = {}
        self.started_at: float | None = None
        self._gone: set[str] = set()
        self._asked: dict[str, float] = {}  # session id -> when a takeover was last asked
        self._loop: task.LoopingCall | None = None
        self.consumer = None

    def start(self) -> None:
        """Follow the heartbeats and start sending this node's."""
        self.started_at = self.clock.seconds()
        self.consumer = self.bus.subscribe(self.topic, node_group(self.service_id),
                                           self._on_record, exclusive=True)
        loop = self._loop = task.LoopingCall(self._tick)
        loop.clock = self.clock
        loop.start(self.heartbeat_interval, now=True).addErrback(
            lambda f: log.failure("membership loop stopped", f))

    def stop(self):
        """Send a last heartbeat saying this node stops; stop sending.

        :returns: the bus's publish result (None or a Deferred).
        """
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        if self.consumer is not None:
            self.consumer.stop()
            self.consumer = None
        return self._send(stopping=True)

    def _send(self, stopping: bool = False):
        now = self.clock.seconds()
        counters = self.counters() if self.counters is not None else {}
        info = NodeInfo(self.service_id, self.started_at or now, now, stopping, self.listeners,
                        counters)
        result = self.bus.publish(self.topic, self.service_id, info)
        if result is not None:
            result.addErrback(lambda f: log.warn("heartbeat not sent: {error}",
                                                 error=f.getErrorMessage()))
        return result

    def _on_record(self, record: Record) -> None:
        info: NodeInfo = record.value
        if info is None or info.service_id == self.service_id:
            return
        now = self.clock.seconds()
        if not info.stopping and info.sent_at < now - self.node_timeout:
            return  # an old heartbeat read again (a replay): says nothing of now
        last = self.nodes.get(info.service_id)
        known = last is not None
        if known and last.sent_at < info.sent_at:
            self.previous[info.service_id] = last
        self.nodes[info.service_id] = info
        if info.stopping:
            self.last_seen.pop(info.service_id, None)
            log.info("node {node} stopped", node=info.service_id)
            self._node_gone(info.service_id)
            return
        self.last_seen[info.service_id] = now
        if info.service_id in self._gone or not known:
            self._gone.discard(info.service_id)
            log.info("node {node} joined", node=info.service_id)

    # -- noticing gone nodes -----------------------------------------------------------

    def alive(self) -> list[str]:
        """:returns: the service ids of the nodes heard from within the
        timeout, this node's included, sorted."""
        return sorted({self.service_id} | {
            sid for sid in self.last_seen if sid not in self._gone})

    def is_gone(self, service_id: str) -> bool:
        """:returns: True when node ``service_id`` is gone (no heartbeat
        within the timeout, or it said it stops) and has not come back."""
        return service_id in self._gone

    def _tick(self) -> None:
        self._send()
        now = self.clock.seconds()
        for sid, seen in list(self.last_seen.items()):
            if sid not in self._gone and now - seen > self.node_timeout:
                log.warn("node {node} gone: no heartbeat for {seconds:.0f} s", node=sid,
                         seconds=now - seen)
                self._node_gone(sid)
        if now - (self.started_at or now) > self.node_timeout:
            for sid in list(self.registry.by_node):
                if sid in (self.service_id, UNCLAIMED) or sid in self.last_seen:
                    continue
                if sid not in self._gone:
                    log.warn("node {node} holds sessions but was not heard from since "
                             "this node started", node=sid)
                    self._gone.add(sid)
        for sid in list(self._gone):
            self._ask(sid, now)

    def _node_gone(self, sid: str) -> None:
        self._gone.add(sid)
        self._ask(sid, self.clock.seconds())

    def _ask(self, sid: str, now: float) -> None:
        """Ask for the takeover of the sessions ``sid`` still holds, at most
        once per ``node_timeout`` each."""
        asked = self._asked
        for client_id in list(self.registry.by_node.get(sid, ())):
            info = self.registry.get(client_id)
            if info is None or info.service_id != sid:
                continue
            last = asked.get(info.session_id)
            if last is not None and now - last < self.node_timeout:
                continue
            asked[info.session_id] = now
            self.request_takeover(info)
        if len(asked) > 4 * (len(self.registry.sessions) + 64):
            horizon = now - self.node_timeout
            self._asked = {k: v for k, v in asked.items() if v >= horizon}
