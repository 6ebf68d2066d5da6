"""How a persistent session reads its deliveries from the device store (a
mixin of :class:`tbmq.broker.outbox.Outbox`): a page at a time while it is
*paged out*, and from its start again when the connection's attach marker
comes back from the writer of ``tbmq.msg.persisted``
(:class:`tbmq.cluster.sinks.PersistedWriter`).

A resumed persistent DEVICE session reads the store once its marker is
back, so the read sees every delivery the writer handled before the
marker, and everything after it comes to this node (:meth:`StoreReads.
on_attached`).  A marker that does not come back within :data:`StoreReads.
MARKER_WAIT` seconds (the writer of the client's partition is gone and its
partition has not moved yet) does not hold the stored deliveries back: the
store is read then, and again when the marker comes.
"""

from __future__ import annotations

from collections import deque

from tbmq.model import DeliveryState, StoredDelivery
from tbmq.mqtt import ReasonCode

__all__ = ["MESSAGE_OVERHEAD", "StoreReads", "delivery_size"]

#: fixed cost counted per queued message on top of its payload, bytes
MESSAGE_OVERHEAD = 200


def delivery_size(delivery: StoredDelivery) -> int:
    """Bytes a queued delivery is counted for: its payload and topic plus
    :data:`MESSAGE_OVERHEAD`."""
    message = delivery.message
    return len(message.payload) + len(message.topic) + MESSAGE_OVERHEAD


class StoreReads:
    """The device store reads of a persistent session (a mixin of
    :class:`~tbmq.broker.outbox.Outbox`, whose state it uses: ``queue``,
    ``inflight``, ``paged_out``, ``_last_seq``, ``_loading``, ``_arrived``,
    ``_reread``, ``_marker_wait``, ``_finished_in_read``)."""

    __slots__ = ()

    #: seconds a resumed persistent DEVICE session waits for its attach
    #: marker before it reads the store anyway (and again when it comes)
    MARKER_WAIT = 5.0

    def _page_in(self) -> None:
        """Read the next deliveries of a paged-out persistent session (none
        while the session waits for its attach marker: the marker's read
        is the first)."""
        if self._marker_wait is not None:
            return
        self._loading = True
        self._finished_in_read = set()
        limit = max(1, self.queue_limit // 2)
        conn = self.link
        d = self.ctx.device_store.load(self.client_id, after_seq=self._last_seq, limit=limit)

        def loaded(deliveries):
            self._loading = False
            if self.link is not conn:
                self._arrived = ()
                return
            if self._reread:
                self._read_again()
                return
            # sent on this connection: still in flight, or finished while
            # the store was read (its removal was called after the read)
            seen = self._finished_in_read  # a new set at the next read
            if self.inflight:
                seen.update(d.seq for d in self.inflight.values())
            for delivery in deliveries:
                if delivery.seq in seen:
                    if delivery.seq > self._last_seq:
                        self._last_seq = delivery.seq
                    continue
                self._take(delivery)
            if len(deliveries) < limit:
                self.paged_out = False
                arrived, self._arrived = self._arrived, ()
                for delivery in arrived:
                    if delivery.seq > self._last_seq:
                        self._last_seq = delivery.seq
                        self._queue_to_fill().append(delivery)
                        self.queued_bytes += delivery_size(delivery)
            else:
                self._arrived = ()
            self.pump()

        def failed(failure):
            self._loading = False
            self.log.failure("reading the queued messages of {client_id} failed", failure,
                             client_id=self.client_id)
            if self.link is conn and conn is not None:
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
        if self.link is None or session_id != self.session.session_id:
            return
        if self._marker_wait is not None:  # the first read: the only one
            self._stop_marker_wait()
        elif self._loading:
            self._reread = True  # once the read under way is done
            return
        self._read_again()

    def _behind(self, delivery: StoredDelivery) -> None:
        """A delivery handed over live whose ``seq`` is not above the
        highest this connection took (from a read of the store, or live).
        Usually a read of the store already showed it: it is queued, in
        flight or done.  Otherwise the store holds it and no read will
        show it again (each page reads after ``_last_seq``): the writer of
        the client's partition of ``tbmq.msg.persisted`` changed while both
        nodes were up, and the old writer's forward of an older delivery
        came after the new writer's newer ones.  Then the store is read
        again from its start (:meth:`_read_again`), so that an
        acknowledged message is not left there while the client is
        connected; what was taken already is not sent twice."""
        seq = delivery.seq
        if not seq or any(d.seq == seq for d in self.inflight.values()) \
                or any(d.seq == seq for d in self.queue):
            return
        if self._loading:
            self._reread = True
        else:
            self._read_again()

    def _stop_marker_wait(self) -> None:
        timer, self._marker_wait = self._marker_wait, None
        if timer is not None and timer.active():
            timer.cancel()

    def _marker_late(self, conn) -> None:
        """The attach marker did not come back within :data:`MARKER_WAIT`
        (the writer of the client's partition is gone, and its partition
        has not moved yet): read the store now, and again when it comes."""
        self._marker_wait = None
        if self.link is conn and conn is not None:
            self._read_again()

    def marker_failed(self) -> None:
        """The attach marker could not be written: read the store now (once;
        what a lagging writer sent elsewhere waits for the next connect)."""
        if self._marker_wait is not None:
            self._stop_marker_wait()
            self._read_again()

    def _read_again(self) -> None:
        """Read the store from its start (see :meth:`on_attached`); the
        removals of completed deliveries go first, and the store runs a
        client's calls in order, so they are not read back."""
        self._reread = False
        self._remove_completed()
        if self.queue:
            kept = deque(d for d in self.queue if not d.seq)  # QoS 0: not in the store
            self.queue = kept
            self.queued_bytes = sum(delivery_size(d) for d in kept)
        self._last_seq = 0
        self._arrived = ()
        self.paged_out = True
        self._page_in()

    def _take(self, delivery: StoredDelivery) -> None:
        """Put a delivery read from the store where its state says."""
        if delivery.seq > self._last_seq:
            self._last_seq = delivery.seq
        if (delivery.state != DeliveryState.QUEUED and delivery.packet_id is not None
                and delivery.packet_id not in self.inflight):
            self.inflight[delivery.packet_id] = delivery
            self._resend(delivery)
            return
        delivery.packet_id = None
        delivery.state = DeliveryState.QUEUED
        self._queue_to_fill().append(delivery)
        self.queued_bytes += delivery_size(delivery)
