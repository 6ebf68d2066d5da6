"""How a persistent session reads its deliveries from the device store (a
:class:`StoreReader`, a part of its :class:`tbmq.broker.outbox.Outbox`): a page at a time while it is
*paged out*, and from its start again when the connection's attach marker
comes back from the writer of ``tbmq.msg.persisted``
(:class:`tbmq.cluster.sinks.PersistedWriter`).

A resumed persistent DEVICE session reads the store once its marker is
back, so the read sees every delivery the writer handled before the
marker, and everything after it comes to this node (:meth:`StoreReader.
on_attached`).  A marker that does not come back within :data:`StoreReader.
MARKER_WAIT` seconds (the writer of the client's partition is gone and its
partition has not moved yet) does not hold the stored deliveries back: the
store is read then, and again when the marker comes.
"""

from __future__ import annotations

from collections import deque
from operator import attrgetter

from twisted.internet import defer

from tbmq.model import DeliveryState, StoredDelivery
from tbmq.mqtt import ReasonCode

__all__ = ["MESSAGE_OVERHEAD", "PageReads", "StoreReader", "delivery_size", "runs_size"]

#: fixed cost counted per queued message on top of its payload, bytes
MESSAGE_OVERHEAD = 200


def delivery_size(delivery: StoredDelivery) -> int:
    """Bytes a queued delivery is counted for: its payload and topic plus
    :data:`MESSAGE_OVERHEAD`."""
    message = delivery.message
    return len(message.payload) + len(message.topic) + MESSAGE_OVERHEAD


#: a delivery's payload, topic, state and packet id (called by map, in C)
_PAYLOAD = attrgetter("message.payload")
_TOPIC = attrgetter("message.topic")
_STATE = attrgetter("state")
_PACKET_ID = attrgetter("packet_id")


def runs_size(deliveries) -> int:
    """The sum of :func:`delivery_size` over ``deliveries`` (a sequence of
    :class:`~tbmq.model.StoredDelivery`), summed by ``map`` (no bytecode per
    delivery)."""
    return (sum(map(len, map(_PAYLOAD, deliveries))) + sum(map(len, map(_TOPIC, deliveries)))
            + len(deliveries) * MESSAGE_OVERHEAD)


#: the seqs finished during a read while none is under way
NO_SEQS: frozenset = frozenset()


class PageReads:
    """The node's page reads of the device store in flight, at most
    :attr:`limit` at once; the sessions past it wait in turn, one entry
    each.  A burst of persistent CONNECTs (each resumed session reads its
    store) then holds at most ``limit`` reads queued on the store's thread:
    a read waiting there holds its callbacks, Deferred and query (about a
    KB), and when the database thread fell behind the reactor thousands
    of them were freed at once, leaving the memory they took scattered
    among the sessions' objects (the allocator's pools stay taken: 2 KB
    more RSS per idle persistent connection).

    :param limit: reads in flight at most (each a page of one session).
    """

    __slots__ = ("limit", "running", "waiting")

    #: reads in flight at most: a batch of the database thread holds them
    LIMIT = 64

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.running = 0
        #: ``(reader, connection)`` waiting for a read, in turn
        self.waiting: deque = deque()

    def read(self, reader: "StoreReader", conn) -> None:
        """Start ``reader``'s read for the connection ``conn`` now
        (:meth:`StoreReader.issue`), or when a read in flight ends."""
        if self.running < self.limit:
            self.running += 1
            reader.issue(conn)
        else:
            self.waiting.append((reader, conn))

    def done(self) -> None:
        """A read ended (its result handled): the next waiting one starts."""
        waiting = self.waiting
        if waiting:
            reader, conn = waiting.popleft()
            reader.issue(conn)
        else:
            self.running -= 1


class StoreReader:
    """The device store reads of a persistent session: a part of its
    :class:`~tbmq.broker.outbox.Outbox` (``outbox``), made at its first read
    (a non-persistent session has none).  It fills the outbox's ``queue``
    and ``inflight`` and moves its ``paged_out`` and ``_last_seq``.

    :ivar loading: a read of the store is under way.
    :ivar arrived: deliveries handed over live during that read.
    :ivar reread: the attach marker came during that read: read again after it.
    :ivar awaiting_marker: the session waits for its attach marker
        before its first read.
    :ivar marker_timer: the timer of :data:`MARKER_WAIT` while it waits
        (None while the marker is being published: it is armed after the
        publish, if still waiting), else None.
    :ivar finished_in_read: seqs of the deliveries finished during the read
        (the read may still hold them: sent, they would be sent again), kept
        only while :attr:`screened`.
    :ivar rewound: the highest ``seq`` this connection took before the
        store was last read again from its start (:meth:`read_again`), else
        0: every delivery taken on this connection (in flight or finished)
        has a ``seq`` up to ``max(rewound, outbox._last_seq)``.
    :ivar screened: the read under way starts below :attr:`rewound`: it may
        return deliveries in flight or finished, which it then leaves out
        (a read after every ``seq`` taken, a drain's page, returns none of
        them, and nothing is remembered for it).
    :ivar new: the session is new (its CONNECT made it), has not
        subscribed since (:meth:`on_subscribed`), and its first read is
        still to come: the store holds nothing of it.
    """

    __slots__ = ("outbox", "loading", "arrived", "reread", "awaiting_marker", "marker_timer",
                 "finished_in_read", "rewound", "screened", "new")

    def __init__(self, outbox) -> None:
        self.outbox = outbox
        self.loading = False
        self.arrived: list[StoredDelivery] | tuple = ()  # a list from the first
        self.reread = False
        self.awaiting_marker = False
        self.marker_timer = None
        self.finished_in_read: set[int] | frozenset = NO_SEQS  # a set during each read
        self.rewound = 0
        self.screened = False
        self.new = False

    def start(self, marker: bool, stored: bool = True) -> None:
        """The session resumed (:meth:`~tbmq.broker.outbox.Outbox.resume`):
        read the store now, or with ``marker`` once the attach marker comes
        back (:meth:`on_attached`), after :data:`MARKER_WAIT` seconds at the
        latest, counted from :meth:`marker_sent`.

        :param stored: False for a new session (CONNACK session present 0):
            the store holds nothing of it (a session that ended had its
            deliveries cleared, in the store's order of the client's calls,
            before this one was made), and nothing can be stored for it
            before it subscribes.  It is not read then: not now, and not
            when its marker comes back unless it subscribed meanwhile (a
            delivery matched by that subscription may then be stored
            before the marker, on a cluster)."""
        self.reread = False
        self.rewound = 0  # (a new connection: nothing in flight)
        self.stop_marker_wait()
        self.new = not stored
        if marker:
            self.awaiting_marker = True
        elif stored:
            self.page_in()
        else:
            self.outbox.paged_out = False

    def marker_sent(self) -> None:
        """The session's attach marker was published: wait for it
        :data:`MARKER_WAIT` seconds at most, unless it came back during its
        publish (the writer of ``tbmq.msg.persisted`` in this process
        follows it at once: the embedded node, where a persistent CONNECT
        then costs no timer)."""
        if self.awaiting_marker and self.marker_timer is None:
            self.marker_timer = self.outbox.ctx.clock.callLater(
                self.MARKER_WAIT, self._marker_late, self.outbox.link)

    #: seconds a resumed persistent DEVICE session waits for its attach
    #: marker before it reads the store anyway (and again when it comes)
    MARKER_WAIT = 5.0

    def page_in(self) -> None:
        """Read the next deliveries of a paged-out persistent session (none
        while the session waits for its attach marker: the marker's read
        is the first), when the node's :class:`PageReads` lets it; it is
        loading from now on (what finishes meanwhile is remembered as
        during the read)."""
        if self.awaiting_marker:
            return
        self.loading = True
        self.outbox.ctx.page_reads.read(self, self.outbox.link)

    def finished(self, seqs: list) -> None:
        """The deliveries ``seqs`` (a list of ``seq``) finished during a read:
        remembered in :attr:`finished_in_read` (a set from the first) when
        the read is :attr:`screened`."""
        if self.screened:
            seen = self.finished_in_read
            if seen is NO_SEQS:
                seen = self.finished_in_read = set()
            seen.update(seqs)

    def issue(self, conn) -> None:
        """Read the store now, for the connection ``conn`` (a read let go
        by :class:`PageReads`, whose :meth:`~PageReads.done` is called once
        its result is handled)."""
        reads = self.outbox.ctx.page_reads
        if self.outbox.link is not conn:  # gone while it waited: no read
            if self.outbox.link is None:  # (a new connection's read is its own)
                self.loading = False
                self.arrived = ()
                self.finished_in_read = NO_SEQS
            reads.done()
            return
        # the writes of this turn go first (the store runs them in order): the
        # read sees what was sent (DUP on a resend) and not what was completed
        self.outbox._remove_completed()
        limit = max(1, self.outbox.queue_limit // 2)
        # below a seq taken on this connection (read again from the start):
        # what is in flight or finishes meanwhile is left out of the page
        screened = self.screened = self.outbox._last_seq < self.rewound
        try:
            d = self.outbox.ctx.device_store.load(self.outbox.client_id,
                                                   after_seq=self.outbox._last_seq, limit=limit)
        except Exception:
            d = defer.fail()

        def loaded(deliveries):
            reads.done()
            self.loading = False
            if self.outbox.link is not conn:
                self.arrived = ()
                return
            # the read's set goes with it (an empty set is 216 bytes per session)
            seen, self.finished_in_read = self.finished_in_read, NO_SEQS
            if self.reread:
                self.read_again()
                return
            # sent on this connection: still in flight, or finished while
            # the store was read (its removal was called after the read)
            if screened and self.outbox.inflight:
                seen = seen.union(d.seq for d in self.outbox.inflight.values())
            self._take_page(deliveries, seen)
            if len(deliveries) < limit:
                self.outbox.paged_out = False
                arrived, self.arrived = self.arrived, ()
                for delivery in arrived:
                    if delivery.seq > self.outbox._last_seq:
                        self.outbox._last_seq = delivery.seq
                        self.outbox._queue_to_fill().append(delivery)
                        self.outbox.queued_bytes += delivery_size(delivery)
            else:
                self.arrived = ()
            self.outbox.pump()

        def failed(failure):
            reads.done()
            self.loading = False
            self.finished_in_read = NO_SEQS
            self.outbox.log.failure("reading the queued messages of {client_id} failed", failure,
                             client_id=self.outbox.client_id)
            if self.outbox.link is conn and conn is not None:
                conn.disconnect(ReasonCode.UNSPECIFIED_ERROR)

        d.addCallbacks(loaded, failed)

    def on_attached(self, session_id: str) -> None:
        """The attach marker of the connection ``session_id`` came back from
        the consumer of ``tbmq.msg.persisted``
        (:class:`tbmq.cluster.sinks.PersistedWriter`): every delivery it
        handled before the marker is in the store now, and those after it
        come here.  The session reads the store again from its start, for
        what the writer stored after the session's first read and sent
        elsewhere (its registry did not know of this connection yet).

        A session that waits for its marker before its first read
        (:meth:`~tbmq.broker.outbox.Outbox.resume`) reads the store now, once.  Otherwise what
        is in flight stays there and the queue is read again from the store,
        in ``seq`` order.  A marker of an older connection, or one that
        comes again (the writer's partition moved before it was committed),
        changes nothing or reads the store once more."""
        if self.outbox.link is None or session_id != self.outbox.session.session_id:
            return
        if self.awaiting_marker:  # the first read: the only one
            self.stop_marker_wait()
            if self.new:
                # nothing stored, nothing matched for it before the marker
                # (it did not subscribe since its CONNECT: on_subscribed)
                self.new = False
                self.outbox.paged_out = False
                return
        elif self.loading:
            self.reread = True  # once the read under way is done
            return
        self.read_again()

    def on_subscribed(self) -> None:
        """The session subscribed: from now on the store may hold
        deliveries matched for it (on a cluster, before its attach marker
        comes back), so a new session reads the store at its marker, even
        if it unsubscribed meanwhile ([MQTT-3.10.4-3] lets the messages
        buffered before an UNSUBSCRIBE be delivered)."""
        self.new = False

    def behind(self, delivery: StoredDelivery) -> None:
        """A delivery handed over live whose ``seq`` is not above the
        highest this connection took (from a read of the store, or live).
        Usually a read of the store already showed it: it is queued, in
        flight or done.  Otherwise the store holds it and no read will
        show it again (each page reads after ``_last_seq``): the writer of
        the client's partition of ``tbmq.msg.persisted`` changed while both
        nodes were up, and the old writer's forward of an older delivery
        came after the new writer's newer ones.  Then the store is read
        again from its start (:meth:`read_again`), so that an
        acknowledged message is not left there while the client is
        connected; what was taken already is not sent twice."""
        seq = delivery.seq
        if not seq or any(d.seq == seq for d in self.outbox.inflight.values()) \
                or any(d.seq == seq for d in self.outbox.queue):
            return
        if self.loading:
            self.reread = True
        else:
            self.read_again()

    def stop_marker_wait(self) -> None:
        """The session waits for its attach marker no more: its timer, if
        armed, is cancelled."""
        self.awaiting_marker = False
        timer, self.marker_timer = self.marker_timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _marker_late(self, conn) -> None:
        """The attach marker did not come back within :data:`MARKER_WAIT`
        (the writer of the client's partition is gone, and its partition
        has not moved yet): read the store now, and again when it comes."""
        self.awaiting_marker = False
        self.marker_timer = None
        if self.outbox.link is conn and conn is not None:
            self.read_again()

    def marker_failed(self) -> None:
        """The attach marker could not be written: read the store now (once;
        what a lagging writer sent elsewhere waits for the next connect)."""
        if self.awaiting_marker:
            self.stop_marker_wait()
            self.read_again()

    def read_again(self) -> None:
        """Read the store from its start (see :meth:`on_attached`); the
        removals of completed deliveries go first, and the store runs a
        client's calls in order, so they are not read back."""
        self.reread = False
        self.new = False
        outbox = self.outbox
        if outbox._last_seq > self.rewound:
            self.rewound = outbox._last_seq
        self.outbox._remove_completed()
        if self.outbox.queue:
            kept = deque(d for d in self.outbox.queue if not d.seq)  # QoS 0: not in the store
            self.outbox.queue = kept
            self.outbox.queued_bytes = sum(delivery_size(d) for d in kept)
        self.outbox._last_seq = 0
        self.arrived = ()
        self.outbox.paged_out = True
        self.page_in()

    def _take_page(self, deliveries: list[StoredDelivery], seen: set[int]) -> None:
        """Put the deliveries of a page read from the store (in ``seq``
        order) where their states say, skipping those in ``seen``: the
        queued ones (most of a page) go to the end of the queue in one
        pass, their sizes summed once; one in flight before is resent
        (:meth:`_take`) in its place among them."""
        outbox = self.outbox
        if not seen and deliveries and not any(map(_STATE, deliveries)) \
                and not any(map(_PACKET_ID, deliveries)):
            # all queued, none left out (a drain's page): in one piece
            outbox._queue_to_fill().extend(deliveries)
            outbox.queued_bytes += runs_size(deliveries)
            last = deliveries[-1].seq  # (in seq order)
            if last > outbox._last_seq:
                outbox._last_seq = last
            return
        queue = None
        last = outbox._last_seq
        size = 0
        for delivery in deliveries:
            seq = delivery.seq
            if seq in seen:
                if seq > last:
                    last = seq
                continue
            if delivery.state or delivery.packet_id is not None:  # not QUEUED: as _take
                outbox._last_seq = last
                outbox.queued_bytes += size
                size = 0
                self._take(delivery)
                last = outbox._last_seq
                continue
            if seq > last:
                last = seq
            if queue is None:
                queue = outbox._queue_to_fill()
            queue.append(delivery)
            message = delivery.message  # (delivery_size, without a call each)
            size += len(message.payload) + len(message.topic) + MESSAGE_OVERHEAD
        outbox._last_seq = last
        outbox.queued_bytes += size

    def _take(self, delivery: StoredDelivery) -> None:
        """Put a delivery read from the store where its state says."""
        if delivery.seq > self.outbox._last_seq:
            self.outbox._last_seq = delivery.seq
        if (delivery.state != DeliveryState.QUEUED and delivery.packet_id is not None
                and delivery.packet_id not in self.outbox.inflight):
            from tbmq.broker.outbox import NO_ENTRIES  # (the outbox imports this module)
            inflight = self.outbox.inflight
            if inflight is NO_ENTRIES:  # a dict from the first
                inflight = self.outbox.inflight = {}
            inflight[delivery.packet_id] = delivery
            self.outbox._resend(delivery)
            return
        delivery.packet_id = None
        delivery.state = DeliveryState.QUEUED
        self.outbox._queue_to_fill().append(delivery)
        self.outbox.queued_bytes += delivery_size(delivery)
