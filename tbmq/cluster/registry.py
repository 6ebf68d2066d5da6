"""Who is where, for the whole cluster, without a coordinator (TBMQ's
session and subscription topics, ARCHITECTURE §1 "Sessions without a
coordinator").

* :class:`SessionRegistry`: client id → :class:`~tbmq.cluster.records.SessionInfo`
  (the node holding the connection, connected or not, persistent or not,
  client type, session expiry interval, last change), fed by
  ``tbmq.client.session``.
* :class:`SubscriptionBook`: client id → its subscriptions, fed by
  ``tbmq.client.subscriptions``; it keeps the router's trie.

Both read their topic from the beginning at every start, in a consumer
group of their own node, and keep the last value per key (a tombstone
removes it; the session registry keeps, of a client id's records, the one
of the latest grant: :attr:`SessionInfo.stamp`): neither compaction nor
``latest`` offsets are relied upon.
The node does not accept clients before both have caught up.  In the
embedded default the in-process bus keeps these topics in the SQLite topic
log, so a restart replays them; a non-persistent session's record need not
survive a restart (the node ends such sessions at its start), so
:class:`SessionRegistry` marks it transient (not written to the log, not
waited for) unless it replaces a record the log may hold.  On a bus that
packs records (Kafka, where every topic is durable) no record is marked:
the mark would cost a header per record, and the client ids remembered for
it would grow with every clean session the node reads.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from twisted.internet import defer
from twisted.logger import Logger

from tbmq.cluster.records import Record, SessionInfo, SubscriptionsRecord
from tbmq.cluster.topics import TRANSIENT, node_group, transient
from tbmq.errors import BusPublishError
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import SubscriptionOptions
from tbmq.mqtt.topics import parse_shared_subscription

log = Logger(observer=LOG_OBSERVER)


class SessionRegistry:
    """Client id → :class:`SessionInfo` of every session in the cluster.

    :param bus: the :class:`tbmq.interfaces.IMessageBus`.
    :param topic: the ``tbmq.client.session`` topic name.
    :param service_id: this node's service id (names the consumer group).
    :ivar sessions: client id → :class:`SessionInfo`.
    :ivar by_node: service id → the client ids whose session that node
        holds (connected or not), as the keys of a dict (values None): a
        dict of strings takes a fifth of a set's memory at the sizes a
        node holds (5,000 ids: 104 KB against 524 KB), and one id per
        session is kept.
    :ivar stale_listeners: ``callable(client_id, current, late)`` called
        when an older record arrives (``late``, ignored: see
        :meth:`_on_record`), and when a tombstone removes ``current``, a
        record of a connection of this node (``late`` None); the node
        holding ``current`` publishes it again, so that the last record of
        the key is the newest even where the topic is compacted, and the
        node of ``late`` drops that connection.
    :ivar listeners: ``callable(client_id, old, new)`` called after each
        change (``old``/``new`` a :class:`SessionInfo` or None).
    :param clock: ``IReactorTime`` of the order stamps (:meth:`next_stamp`),
        or None for the system's time.

    Order stamps: every grant of a connection carries a stamp, integer
    microseconds of a hybrid logical clock, greater than any the deciding
    member knew for the client id (:meth:`next_stamp`), and every record
    of that connection carries it (:attr:`SessionInfo.stamp`, filled by
    :meth:`put`).  A client id's records are applied by stamp, not by
    arrival: one older than the record held is ignored on every node, so
    two grants that crossed in the log (decided before either record was
    read) end, everywhere, on the later grant.
    """

    def __init__(self, bus, topic: str, service_id: str, clock=None) -> None:
        self.bus = bus
        self.topic = topic
        self.service_id = service_id
        self.sessions: dict[str, SessionInfo] = {}
        self.by_node: dict[str, dict[str, None]] = {}
        self.listeners: list[Callable] = []
        self.stale_listeners: list[Callable] = []
        #: client id -> the session id its current session replaced (for
        #: records without a stamp, of nodes before stamps)
        self._replaced: dict[str, str] = {}
        #: client id -> (session id, stamp) of a connection granted to this
        #: node (or made here without a grant: a takeover), until the
        #: registry reads a record of that connection (or :meth:`remove`)
        self._mine: dict[str, tuple[str, int]] = {}
        #: the greatest stamp made or read here (the logical part of the clock)
        self._last_stamp = 0
        self._seconds = time.time if clock is None else clock.seconds
        #: client ids whose last record in a durable topic log may be a
        #: session (not a tombstone): their next record is durable too
        #: (the keys; a dict, as :attr:`by_node`'s, for its size)
        self._logged: dict[str, None] = {}
        #: whether records are marked transient: not on a bus that packs
        #: records (Kafka keeps every topic and ignores the mark)
        self._marks = not getattr(bus, "packs", False)
        self.consumer = None

    def start(self) -> defer.Deferred:
        """Replay ``tbmq.client.session`` from the beginning, then follow it.
        This node's own records are applied when the bus acknowledges them,
        where it can (:meth:`tbmq.interfaces.IConsumer.hand_own`: once
        every record before them was applied, in the topic's order, the
        value as published; the fetch then skips them, not decoded).

        :returns: a Deferred that fires once the replay is done.
        """
        self.consumer = self.bus.subscribe(self.topic, node_group(self.service_id),
                                           self._on_record, from_beginning=True,
                                           exclusive=True)
        self.consumer.hand_own()
        return self.consumer.caught_up

    def _on_record(self, record: Record) -> None:
        """Apply one record, by its stamp (:attr:`SessionInfo.stamp`): a
        record of another connection with a smaller stamp than the record
        held (an older grant, whatever the order the records landed in:
        two nodes granted one client id before either read the other's
        record, or a disconnect crossed a takeover) is late and ignored,
        the same way on every node, and :attr:`stale_listeners` hear of
        it; an equal stamp is the same connection's later record (two
        connections of one stamp, made by two members at one microsecond,
        are ordered by session id).  Records without a stamp (0, of nodes
        before stamps) keep the last record, but one of the connection the
        current one replaced.

        A tombstone (the session ended) carries no stamp and always
        applies, as before stamps; one that removes a record of a
        connection of this node tells :attr:`stale_listeners` (``late``
        None), whose node publishes that record again if the connection is
        still open (the tombstone's writer had not read it yet)."""
        client_id = record.key
        new = record.value
        headers = record.headers
        if (new is not None and self._marks
                and not (headers and (headers is TRANSIENT or transient(headers)))):
            self._logged[client_id] = None  # (TRANSIENT: this node's mark, no call)
        if new is None:
            old = self.sessions.pop(client_id, None)
            self._replaced.pop(client_id, None)
            if old is not None and old.connected and old.service_id == self.service_id:
                for listener in self.stale_listeners:
                    listener(client_id, old, None)
        else:
            stamp = new.stamp
            if stamp > self._last_stamp:
                self._last_stamp = stamp
            mine = self._mine.pop(client_id, None)  # this node's own record, read
            if mine is not None and mine[0] != new.session_id:
                self._mine[client_id] = mine  # (another connection's: kept)
            old = self.sessions.get(client_id)
            if old is not None and old.session_id != new.session_id:
                held = old.stamp
                if (stamp < held or (stamp == held and (
                        new.session_id < old.session_id if stamp
                        else self._replaced.get(client_id) == new.session_id))):
                    for listener in self.stale_listeners:
                        listener(client_id, old, new)
                    return
                if not stamp:
                    self._replaced[client_id] = old.session_id
            self.sessions[client_id] = new
        if old is not None and (new is None or new.service_id != old.service_id):
            held = self.by_node.get(old.service_id)
            if held is not None:
                held.pop(client_id, None)
                if not held:
                    del self.by_node[old.service_id]
        if new is not None:
            held = self.by_node.get(new.service_id)
            if held is None:
                held = self.by_node[new.service_id] = {}
            held[client_id] = None
        for listener in self.listeners:
            try:
                listener(client_id, old, new)
            except Exception:
                log.failure("session registry listener failed for {client_id}",
                            client_id=client_id)

    def next_stamp(self, client_id: str) -> int:
        """A new order stamp for a grant of ``client_id``: greater than the
        stamp of its record here, than any stamp made or read here, and
        than the time now (a hybrid logical clock, in microseconds), so
        the grants of one member are ordered and, after a partition moved
        to another member, its time and the records it read keep the order.

        The stamp of the record held for ``client_id`` is never above the
        greatest stamp read (:meth:`_on_record` raises it with every record
        before it keeps one), so that greatest stamp covers it.

        :returns: int, microseconds since the epoch (or a little more)."""
        stamp = int(self._seconds() * 1_000_000)
        last = self._last_stamp
        self._last_stamp = stamp = (stamp if stamp > last else last) + 1
        return stamp

    def granted(self, client_id: str, session_id: str, stamp: int) -> None:
        """The connection ``session_id`` of ``client_id`` was granted to
        this node with ``stamp`` (:attr:`SessionEventResponse.stamp`): its
        records (:meth:`put`) carry it.  A stamp of 0 (a node that does not
        stamp) is not kept."""
        if stamp:
            self._mine[client_id] = (session_id, stamp)
            if stamp > self._last_stamp:
                self._last_stamp = stamp

    def granted_later(self, client_id: str, stamp: int) -> bool:
        """Whether this node holds a grant of ``client_id`` with a greater
        stamp than ``stamp`` whose record the registry has not read yet
        (:meth:`granted`): a record of ``stamp`` read now is older than
        that connection, whose record, when read, replaces it."""
        mine = self._mine.get(client_id)
        return mine is not None and mine[1] > stamp

    def _stamp_of(self, client_id: str, session_id: str) -> int:
        mine = self._mine.get(client_id)
        if mine is not None and mine[0] == session_id:
            return mine[1]
        held = self.sessions.get(client_id)
        if held is not None and held.session_id == session_id:
            return held.stamp
        stamp = self.next_stamp(client_id)
        self._mine[client_id] = (session_id, stamp)
        return stamp

    def get(self, client_id: str) -> SessionInfo | None:
        """:returns: what the cluster knows of ``client_id``'s session."""
        return self.sessions.get(client_id)

    def locate(self, client_id: str) -> str | None:
        """:returns: the service id of the node ``client_id`` is connected
        to, or None when it is offline or unknown."""
        info = self.sessions.get(client_id)
        if info is None or not info.connected:
            return None
        return info.service_id

    def put(self, info: SessionInfo, done: Callable | None = None):
        """Publish ``info`` as the session of ``info.client_id``.

        The record of a non-persistent session is transient (the in-process
        bus does not write it to its topic log: :data:`~tbmq.cluster.topics.TRANSIENT`;
        other nodes still read it) unless the log may hold a record of that
        client id from this node or a replay (a persistent session's, which
        a restart must not bring back): then it is durable, as every
        persistent session's record.  On a bus that packs records (Kafka)
        no record is marked.

        :param done: ``done(None | Failure)``, the bus's outcome of the
            record (:meth:`tbmq.interfaces.IMessageBus.publish`), or None
            for a Deferred.
        :attr:`SessionInfo.stamp` of ``info`` is set here when it is 0: the
        stamp of the connection's grant (:meth:`granted`), else of the
        record held for that connection, else a new one
        (:meth:`next_stamp`: a session this node made without a grant, a
        gone node's taken over, or the answer of a node that does not
        stamp).

        :returns: the bus's publish result (None with ``done``, else a Deferred).
        """
        client_id = info.client_id
        if not info.stamp:
            mine = self._mine.get(client_id)  # (the grant: _stamp_of's first case, inline)
            info.stamp = (mine[1] if mine is not None and mine[0] == info.session_id
                          else self._stamp_of(client_id, info.session_id))
        if not self._marks:
            return self.bus.publish(self.topic, client_id, info, (), done)
        if info.persistent or client_id in self._logged:
            self._logged[client_id] = None
            return self.bus.publish(self.topic, client_id, info, (), done)
        return self.bus.publish(self.topic, client_id, info, TRANSIENT, done)

    def remove(self, client_id: str, done: Callable | None = None):
        """Publish a tombstone: the session of ``client_id`` ended.  It is
        durable when the log may hold a record of ``client_id`` (see
        :meth:`put`), else transient.

        :param done: as :meth:`put`'s."""
        self._mine.pop(client_id, None)
        if not self._marks:
            return self.bus.publish(self.topic, client_id, None, (), done)
        if client_id in self._logged:
            del self._logged[client_id]
            return self.bus.publish(self.topic, client_id, None, (), done)
        return self.bus.publish(self.topic, client_id, None, TRANSIENT, done)


class SubscriptionBook:
    """Client id → its subscriptions for the whole cluster; keeps the
    router's trie in step with ``tbmq.client.subscriptions``.

    :param bus: the :class:`tbmq.interfaces.IMessageBus`.
    :param topic: the ``tbmq.client.subscriptions`` topic name.
    :param service_id: this node's service id (names the consumer group).
    :param router: the :class:`tbmq.broker.router.Router`
        (``add_subscription``/``remove_subscription``).
    :ivar subscriptions: client id → ``{topic filter: SubscriptionOptions}``.
    """

    #: the header that names a record's write, for :meth:`put` to wait for it
    WRITE_HEADER = "tbmq-write"
    #: seconds :meth:`put` waits at most for this node's consumer to read
    #: the record back
    READ_BACK_TIMEOUT = 30.0

    def __init__(self, bus, topic: str, service_id: str, router, clock=None) -> None:
        self.bus = bus
        self.topic = topic
        self.service_id = service_id
        self.router = router
        self.clock = clock
        self.subscriptions: dict[str, dict[str, SubscriptionOptions]] = {}
        self.consumer = None
        # this node's writes not read back yet: write id -> Deferred
        self._prefix = f"{service_id}/{os.urandom(4).hex()}/".encode()
        self._writes = 0
        self._unread: dict[bytes, defer.Deferred] = {}

    def start(self) -> defer.Deferred:
        """Replay ``tbmq.client.subscriptions`` from the beginning into the
        trie, then follow it.

        :returns: a Deferred that fires once the replay is done.
        """
        self.consumer = self.bus.subscribe(
            self.topic, node_group(self.service_id), self._on_record,
            from_beginning=True, exclusive=True)
        return self.consumer.caught_up

    def _on_record(self, record: Record) -> None:
        client_id = record.key
        self._apply(client_id, record.value)
        if self._unread:
            for name, value in record.headers:
                if name == self.WRITE_HEADER:
                    waiter = self._unread.pop(value, None)
                    if waiter is not None:
                        waiter.callback(None)

    def _apply(self, client_id: str, value: SubscriptionsRecord | None) -> None:
        new = value.subscriptions if value is not None else {}
        old = self.subscriptions.get(client_id, {})
        router = self.router
        for topic_filter in old:
            if topic_filter not in new:
                router.remove_subscription(client_id, topic_filter,
                                           parse_shared_subscription(topic_filter))
        for topic_filter, options in new.items():
            if old.get(topic_filter) != options:
                router.add_subscription(client_id, topic_filter,
                                        parse_shared_subscription(topic_filter), options)
        if new:
            self.subscriptions[client_id] = dict(new)
        else:
            self.subscriptions.pop(client_id, None)

    def of(self, client_id: str) -> dict[str, SubscriptionOptions]:
        """:returns: a copy of the subscriptions of ``client_id``."""
        return dict(self.subscriptions.get(client_id, {}))

    def put(self, client_id: str, subscriptions: dict[str, SubscriptionOptions]):
        """Publish the whole set of ``client_id``'s subscriptions (a tombstone
        when empty), and wait until this node's own consumer has read the
        record back, so that this node's trie has them: a SUBACK sent then
        promises that a message published afterwards through this node
        matches them (on Kafka the bus's acknowledgement comes before any
        consumer read the record; other nodes' tries follow within their
        consumer's lag, as in TBMQ).

        The record carries a :data:`WRITE_HEADER` naming this write (this
        node's service id, a random id of this process, a counter), which
        is how the consumer recognises it.

        :returns: None when both already happened during the call (the
            in-process bus), else a Deferred firing with None once both
            happened; it fails with the bus's :class:`~tbmq.errors.BusError`,
            or with :class:`~tbmq.errors.BusPublishError` when the record was
            acknowledged but not read back within :data:`READ_BACK_TIMEOUT`
            seconds (this node's consumer of ``tbmq.client.subscriptions``
            is stuck).
        """
        value = SubscriptionsRecord(client_id, dict(subscriptions)) if subscriptions else None
        self._writes += 1
        write = self._prefix + str(self._writes).encode()
        read_back = self._unread[write] = defer.Deferred()
        published = self.bus.publish(self.topic, client_id, value,
                                     ((self.WRITE_HEADER, write),))
        if not isinstance(published, defer.Deferred):
            if read_back.called:
                return None  # handled during the call
            published = defer.succeed(None)
        timer = None
        if self.clock is not None and not read_back.called:
            timer = self.clock.callLater(self.READ_BACK_TIMEOUT, self._not_read_back, write)

        def published_ok(_):
            return read_back

        def published_failed(failure):
            self._unread.pop(write, None)
            return failure

        def done(result):
            if timer is not None and timer.active():
                timer.cancel()
            return result

        return published.addCallbacks(published_ok, published_failed).addBoth(done)

    def _not_read_back(self, write: bytes) -> None:
        waiter = self._unread.pop(write, None)
        if waiter is not None:
            log.warn("the consumer of {topic} did not read this node's write back within "
                     "{seconds:.0f} s", topic=self.topic, seconds=self.READ_BACK_TIMEOUT)
            waiter.errback(BusPublishError(
                f"{self.topic}: the record was acknowledged but not read back within "
                f"{self.READ_BACK_TIMEOUT:.0f} s"))
