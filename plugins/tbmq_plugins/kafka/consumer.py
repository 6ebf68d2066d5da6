"""The reactor side of one Kafka consumer (:class:`KafkaConsumer`).

Its thread (:class:`~.loop.ConsumerLoop`) hands over each poll's records in
one call; this side keeps them in a buffer and hands them to the handler:

* a packed record (:mod:`.packing`) is handed as the records it lists, each
  with its offset; that offset commits once all of them are done.  With a
  ``batch_handler`` its records' values are handed in **one** call, and
  their one result commits (or fails) the Kafka record: one call, one
  result, one commit for up to :data:`~.packing.MAX_RECORDS` records;
* single records of one partition that wait in a row go to the
  ``batch_handler`` in one call too, each committed on its own
  (:mod:`.runs`: a :class:`~tbmq.cluster.completion.Progress` result
  commits each as its batch's leading run of finished records passes it);
* in the reactor thread, one at a time (never re-entered), in the order they
  came (so in offset order within a partition), at most
  :data:`SLICE` per reactor turn, and with at most ``max_uncommitted``
  handler results pending (a result is None, a Deferred, or a
  :class:`~tbmq.cluster.completion.Completion` of the publishes the record
  caused);
* **commits** per partition over the contiguous records whose results fired
  with success (:class:`Track`), queued back to the thread;
* a **failed** result stops its partition there: once every record before
  it is committed, the partition's records here are dropped and, after a
  delay (:class:`~tbmq.cluster.redelivery.Redelivery`: 1 s, doubling to
  30 s while it keeps failing), the thread seeks the partition back to the
  failed Kafka record (all of it, for a packed record), which then starts
  over as on a new assignment (a new :class:`Track`, so that results of the
  old one do not commit): the failed record is handed again, then what
  follows it (at least once, in order);
* **pause** stops handing at once and has the thread pause the client's
  partitions; the records already handed over stay in the buffer, in order,
  for :meth:`KafkaConsumer.resume`.  A full buffer pauses the client too
  (back-pressure), until it drains below half;
* a **rebalance** that takes partitions away asks this side first: their
  buffered records are dropped (the next owner reads them from the committed
  offset), their pending results no longer commit;
* ``caught_up`` fires once every assigned partition was *reached* (the
  thread handed over everything below the end it fetched) and the handlers'
  results of what came until then have fired, or stopped at a failed record
  (that waits to be read again);
* a member that opted in (:meth:`KafkaConsumer.hand_own`) hands this node's
  own records when they are acknowledged, in offset order, and skips them
  when the fetch brings them (:mod:`.own`).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from tbmq.cluster.completion import Completion, Progress
from tbmq.cluster.records import new_record
from tbmq.cluster.redelivery import Redelivery
from tbmq.interfaces import IConsumer
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq_plugins.kafka.drivers import RawRecord
from tbmq_plugins.kafka.packing import expand, unpacked
from tbmq_plugins.kafka.runs import Runs

__all__ = ["SLICE", "Entry", "KafkaConsumer", "Owned", "Track"]

log = Logger(observer=LOG_OBSERVER)

#: Most records handed to the handler per reactor turn.
SLICE = 256

#: units of this node's own records a partition holds at most while the
#: records before them are not read yet (:meth:`KafkaConsumer.take_own`):
#: past that the fetch is behind by more than a few acknowledgements (a
#: busy partition) and brings them as soon as a held unit would go
OWN_HELD_MAX = 8

#: :attr:`Entry.state` values
WAITING, OK, FAILED = 0, 1, 2


class Entry:
    """One Kafka record of one :class:`Track`, from its arrival to the
    results of the records it carries (one, or those of a packed record).

    :ivar parts: its records whose results have not fired.
    :ivar state: :data:`WAITING`, :data:`OK` (every result fired with
        success) or :data:`FAILED` (one failed).
    :ivar failure: the first failure of its records, or None.
    """

    __slots__ = ("offset", "seq", "state", "parts", "failure")

    def __init__(self, offset: int, seq: int, parts: int) -> None:
        self.offset = offset
        self.seq = seq
        self.state = WAITING
        self.parts = parts
        self.failure: Failure | None = None


def _count(item: Any) -> int:
    """The messages a buffered item holds (a list or a tuple: a packed
    record's values, see :meth:`KafkaConsumer._hand`; a :class:`Weighed`:
    what its topic's codec counted; an :class:`Owned`: its items)."""
    kind = type(item)
    if kind is list or kind is tuple:
        return len(item)
    if kind is Weighed:
        return item.count
    return len(item.items) if kind is Owned else 1


class Weighed:
    """In the buffer, in place of a packed record's values (version 2)
    whose records carry more messages than one each (a downlink's
    :class:`~tbmq.cluster.records.DeliveryRun` s): the values and the
    messages they carry, counted once by the codec (``count_arrays``).

    :ivar values: the decoded arrays, a tuple.
    :ivar count: the messages they carry.
    """

    __slots__ = ("values", "count")

    def __init__(self, values: tuple, count: int) -> None:
        self.values = values
        self.count = count


class Owned:
    """In the buffer, in place of a fetched record: this node's unit
    acknowledged at that offset and held (:mod:`.own`), handed from the
    held copy (the value objects as published, not decoded).

    :ivar items: ``(key, value, headers)`` each: one, or the records of a
        packed record for the ``batch_handler``.
    """

    __slots__ = ("items",)

    def __init__(self, items: tuple | list) -> None:
        self.items = items


class Track:
    """One partition of one consumer, for one assignment.

    :ivar partition: ``int``.
    :ivar live: False once the partition was taken away (its results no
        longer commit).
    :ivar committed: the offset last queued for commit, or None.
    :ivar blocked: a record failed, every one before it committed: nothing
        more commits on this assignment (the partition is read again from
        :attr:`failed`).
    :ivar failed: the :class:`Entry` that blocked it, or None.
    :ivar reached: the thread handed over everything below the end.
    :ivar top: the offset after the last record that arrived or was handed
        on acknowledgement (:mod:`.own`): every record below it is known
        here; None until the member knows where the partition starts.
    :ivar queued: items of this partition in the consumer's buffer.
    :ivar held: offset -> this node's records acknowledged there, ahead of
        :attr:`top` (:mod:`.own`), or None.
    """

    __slots__ = ("partition", "live", "committed", "blocked", "failed", "pending", "arrived",
                 "open", "reached", "barrier", "barrier_open", "handed", "top", "queued",
                 "held")

    def __init__(self, partition: int, top: int | None = None) -> None:
        self.partition = partition
        self.live = True
        self.top = top
        self.queued = 0
        self.held: dict[int, Any] | None = None
        #: the offset after the last record handed on this assignment, or None
        self.handed: int | None = None
        self.committed: int | None = None
        self.blocked = False
        self.failed: Entry | None = None
        self.pending: deque[Entry] = deque()  # in arrival order, until committed
        self.arrived = 0
        self.open = 0  # records whose result has not fired
        self.reached = False
        self.barrier: int | None = None  # entries that arrived before reached
        self.barrier_open = 0  # their records whose result has not fired

    def arrive(self, offset: int, parts: int = 1) -> Entry:
        """A Kafka record arrived from the thread.

        :param parts: the records it carries (more than one: a packed record).
        """
        entry = Entry(offset, self.arrived, parts)
        self.arrived += 1
        self.open += parts
        if not self.blocked:
            self.pending.append(entry)
        return entry

    def reach(self) -> None:
        """Everything below the end has arrived."""
        self.reached = True
        self.barrier = self.arrived
        self.barrier_open = self.open

    def done(self, entry: Entry, ok: bool) -> bool:
        """The result of one record of ``entry`` fired.

        :returns: True when :attr:`committed` moved.
        """
        entry.parts -= 1
        if not ok:
            entry.state = FAILED
        elif entry.parts == 0 and entry.state == WAITING:
            entry.state = OK
        self.open -= 1
        if self.barrier is not None and entry.seq < self.barrier:
            self.barrier_open -= 1
        pending = self.pending
        moved = False
        while pending and pending[0].state == OK:
            self.committed = pending.popleft().offset + 1
            moved = True
        if pending and pending[0].state == FAILED:
            self.blocked = True
            self.failed = pending[0]
            pending.clear()
        return moved

    @property
    def caught_up(self) -> bool:
        """Reached, and every record that arrived until then is done."""
        return self.reached and self.barrier_open == 0


@implementer(IConsumer)
class KafkaConsumer(Runs):
    """One member of a consumer group on the Kafka bus (made by
    :meth:`~.bus.KafkaBus.subscribe`); see the module doc.

    :ivar topic: the topic name.
    :ivar group: the group name.
    :ivar caught_up: see :class:`tbmq.interfaces.IConsumer`.
    :ivar stopped: True once :meth:`stop` was called.
    :ivar positioned: True while the member has its partitions (none is a
        valid answer) and has read each to the end it found: a record
        published from then on reaches the group.
    """

    #: seconds between two questions whether the whole group is positioned
    GROUP_CHECK_EVERY = 0.2

    def __init__(self, bus: Any, topic: str, group: str, handler: Callable,
                 codec: Any, max_uncommitted: int, buffer_limit: int,
                 group_wide: bool = False, batch_handler: Callable | None = None) -> None:
        self.bus = bus
        self.topic = topic
        self.group = group
        self.handler = handler
        self.batch_handler = batch_handler
        self.codec = codec
        self.max_uncommitted = max_uncommitted
        self.buffer_limit = buffer_limit
        self.caught_up: defer.Deferred = defer.Deferred()
        self.loop: Any = None  # the ConsumerLoop, once the topic exists
        self._reactor = bus.clock
        self._tracks: dict[int, Track] = {}
        self._has_assignment = False
        #: (track, entry, raw record, or the values of a packed one for the batch handler)
        self._buffer: deque = deque()
        #: messages in the buffer: a packed record's counted one by one, each
        #: as many as it carries (the codec's ``count_arrays``, once: a run of
        #: a downlink counts its messages, :class:`Weighed`)
        self._held = 0
        self._inflight = 0
        self._paused = False
        self._throttled = False
        self._busy = False
        self._scheduled = None
        self.stopped = False
        self._closed_d: defer.Deferred | None = None
        self._redelivery = Redelivery(self._reactor,
                                      f"Kafka consumer group {group} of {topic}")
        #: a group that joins: caught up only once the whole group has a
        #: position (see :meth:`_check_caught_up`)
        self._group_ready = not group_wide
        self._group_asking = False
        #: hand this node's records on acknowledgement (:meth:`hand_own`)
        self._own = False
        #: the tracks whose :attr:`Track.held` has units (:mod:`.own`)
        self._holding: set[Track] = set()

    @property
    def positioned(self) -> bool:
        return (self._has_assignment and not self.stopped
                and all(t.reached for t in self._tracks.values()))

    # -- the interface ---------------------------------------------------------------------

    def pause(self) -> None:
        """Stop handing records; the client's partitions are paused (the
        records already read wait here, in order; this node's records held
        to be handed on acknowledgement are left to the fetch).
        Idempotent."""
        if not self._paused:
            self._paused = True
            self._want_paused()
            if self._holding:
                self._forget_own()

    def resume(self) -> None:
        """Hand records again, those that waited first.  Idempotent."""
        if self._paused:
            self._paused = False
            self._want_paused()
            self._schedule()

    def hand_own(self) -> bool:
        """Hand this node's own records of the topic when Kafka acknowledges
        them rather than when the fetch brings them back (:mod:`.own`): a
        record published here to a partition this member hands, once every
        record before it was handed; the fetch then skips it.  The handler
        gets the same :class:`~tbmq.cluster.records.Record` (or, for a
        packed record, ``batch_handler`` the same values) it would read
        back, its value the object as published; commits are unchanged.

        :returns: True when the bus can (its driver reports the offsets of
            acknowledged records), else False (the records are fetched as
            before).
        """
        if not self._own:
            self._own = self.bus._take_own(self)
        return self._own

    def handed(self, partition: int) -> int | None:
        """:returns: the offset after the last record of ``partition`` this
        member handed to its handler (every record before it was handed,
        in order), or None when it does not hand that partition now (not
        assigned, read again, paused, stopped, or nothing handed yet on
        this assignment)."""
        track = self._tracks.get(partition)
        if track is None or not track.live or self._paused or self.stopped:
            return None
        return track.handed

    def lag(self) -> int:
        """:returns: records of this member's partitions that its group has
        not committed yet: those the thread has not read or handed over
        (from the high watermarks of its last fetches, read once a second)
        and those here whose results have not all fired (the operations
        metrics' ``tbmq_consumer_lag_records``)."""
        loop = self.loop
        backlog = loop.backlog if loop is not None else 0
        return backlog + sum(len(t.pending) for t in self._tracks.values() if t.live)

    def stop(self) -> defer.Deferred:
        """Leave the group: commit what the handlers finished, close the
        client (its partitions go to the other members from the committed
        offsets).  Records whose results have not fired are not committed.

        :returns: a Deferred firing with None once the client is closed.
        """
        if self._closed_d is not None:
            return self._chain(self._closed_d)
        self.stopped = True
        self._closed_d = defer.Deferred()
        self._buffer.clear()
        self._held = 0
        self._forget_own()
        if self._scheduled is not None and self._scheduled.active():
            self._scheduled.cancel()
        self._scheduled = None
        for track in self._tracks.values():
            track.live = False
        self._redelivery.forget()
        self.bus._forget(self)
        if self.loop is None:  # the thread never started
            self._closed_d.callback(None)
        else:
            self.loop.stop()
        return self._chain(self._closed_d)

    @staticmethod
    def _chain(d: defer.Deferred) -> defer.Deferred:
        out = defer.Deferred()
        d.addBoth(lambda result: (out.callback(None), result)[1])
        return out

    # -- from the thread (in the reactor thread) ------------------------------------------

    def _assigned(self, partitions: list[int], starts: dict[int, int] | None = None) -> None:
        """The thread gives ``partitions`` (a new assignment, or read again).

        :param starts: partition -> the offset the thread reads it from,
            where it is known (not a partition that starts at its end)."""
        if self.stopped:
            return
        for p in partitions:
            old = self._tracks.get(p)
            if old is not None:
                old.live = False
            self._tracks[p] = Track(p, starts.get(p) if starts else None)
        self._has_assignment = True
        self._check_caught_up()

    def _revoke(self, partitions: list[int]) -> None:
        """The group takes ``partitions`` away (asked by the thread, which
        commits what was queued once this returns)."""
        gone = set(partitions)
        for p in partitions:
            track = self._tracks.pop(p, None)
            if track is not None:
                track.live = False
                self._holding.discard(track)
            self._redelivery.forget(p)
        if self._buffer:
            self._buffer = deque(item for item in self._buffer
                                 if item[0].partition not in gone)
            self._held = sum(_count(item[2]) for item in self._buffer)
        self._has_assignment = False  # until the group gives partitions again

    def _batch(self, records: list, reached: list[int],
               tops: dict[int, int] | None = None) -> None:
        """A poll's records, and the partitions it reached.

        :param tops: partition -> the offset after what the thread handed
            over, for ``reached`` partitions (:attr:`Track.top`)."""
        if self.stopped:
            return
        tracks = self._tracks
        buffer = self._buffer
        batches = self.batch_handler is not None
        own = self._own
        held = self._held
        count_arrays = self.codec.count_arrays
        for raw in records:
            track = tracks.get(raw.partition)
            if track is None or not track.live:  # (read before a seek back)
                continue
            if own:
                top = track.top
                if top is not None and raw.offset < top:
                    continue  # handed when it was acknowledged (.own)
                track.top = raw.offset + 1
                if track.held:
                    items = track.held.pop(raw.offset, None)
                    if items is not None:  # held: handed from that copy, not decoded
                        held += self._buffer_owned(track, raw.offset, items)
                        continue
            if raw.headers:  # a packed record, maybe (:mod:`.packing`)
                if batches:
                    found = unpacked(raw)
                    if found is not None:
                        values = found[1]  # inline (version 2): a tuple of arrays
                        if not found[2]:
                            values = list(values)  # version 1: a list of bytes
                            n = len(values)
                        else:
                            n = count_arrays(values)
                            if n != len(values):
                                values = Weighed(values, n)
                        buffer.append((track, track.arrive(raw.offset), values))
                        track.queued += 1
                        held += n
                        continue
                else:
                    inner = expand(raw)
                    entry = track.arrive(raw.offset, len(inner))
                    for one in inner:
                        buffer.append((track, entry, one))
                    track.queued += len(inner)
                    held += len(inner)
                    continue
            buffer.append((track, track.arrive(raw.offset), raw))
            track.queued += 1
            held += 1
        self._held = held
        for p in reached:
            track = tracks.get(p)
            if track is not None:
                track.reach()
                top = tops.get(p) if tops else None
                if top is not None and (track.top is None or top > track.top):
                    track.top = top
        if held >= self.buffer_limit and not self._throttled:
            self._throttled = True
            self._want_paused()
        self._pump()
        self._check_caught_up()

    def _buffer_owned(self, track: Track, offset: int, items: tuple | list) -> int:
        """Buffer this node's held unit at ``offset`` of ``track`` as the
        fetch brought it (:class:`Owned`): as :meth:`_hand_own` hands it,
        one item for the ``batch_handler`` or one per record.

        :returns: the records buffered."""
        buffer = self._buffer
        if self.batch_handler is not None and len(items) > 1:
            buffer.append((track, track.arrive(offset), Owned(items)))
            track.queued += 1
        else:
            entry = track.arrive(offset, len(items))
            for item in items:
                buffer.append((track, entry, Owned((item,))))
            track.queued += len(items)
        return len(items)

    def _closed(self) -> None:
        if self._closed_d is not None and not self._closed_d.called:
            self._closed_d.callback(None)

    # -- handing ---------------------------------------------------------------------------

    def _want_paused(self) -> None:
        if self.loop is not None:
            self.loop.want_paused = self._paused or self._throttled

    def _schedule(self) -> None:
        if self._scheduled is None and not self.stopped and not self._paused and self._buffer:
            self._scheduled = self._reactor.callLater(0, self._slice)

    def _slice(self) -> None:
        self._scheduled = None
        self._pump()

    def _pump(self) -> None:
        """Hand buffered records: :data:`SLICE` at most now, the rest from
        the next reactor turn."""
        if self._busy or self._paused or self.stopped:
            return
        buffer = self._buffer
        budget = SLICE
        batches = self.batch_handler is not None
        self._busy = True
        try:
            while buffer and self._inflight < self.max_uncommitted and not self._paused:
                if budget <= 0:
                    self._schedule()
                    break
                track, entry, raw = buffer.popleft()
                if (batches and type(raw) is RawRecord and not raw.headers and buffer
                        and buffer[0][0] is track and type(buffer[0][2]) is RawRecord
                        and budget > 1):
                    budget -= self._take_run(track, entry, raw, budget)
                    continue
                count = _count(raw)
                self._held -= count
                budget -= count
                track.queued -= 1
                if track.live:
                    track.handed = entry.offset + 1
                    self._hand(track, entry, raw)
        finally:
            self._busy = False
        if self._throttled and self._held <= self.buffer_limit // 2:
            self._throttled = False
            self._want_paused()
        if self._holding:
            self._advance_own()

    def _hand(self, track: Track, entry: Entry, raw: Any) -> None:
        """Hand one Kafka record to the handler, or the values of a packed
        one decoded to the ``batch_handler``: a tuple of the records' arrays
        (version 2, unpacked with the packed record: read with the codec's
        ``decode_arrays``) or a list of their bytes (version 1); an
        :class:`Owned` as :meth:`_hand_own` hands its items (not decoded)."""
        try:
            if type(raw) is tuple:
                result = self.batch_handler(self.codec.decode_arrays(raw))
            elif type(raw) is Weighed:
                result = self.batch_handler(self.codec.decode_arrays(raw.values))
            elif type(raw) is list:
                decode = self.codec.decode
                result = self.batch_handler([decode(value) for value in raw])
            elif type(raw) is Owned:
                items = raw.items
                if len(items) > 1:
                    result = self.batch_handler([item[1] for item in items])
                else:
                    key, value, headers = items[0]
                    result = self.handler(new_record((self.topic, key, value, headers,
                                                      track.partition, entry.offset)))
            else:
                key = raw.key
                record = new_record((self.topic,
                                     None if key is None else key.decode("utf-8", "surrogatepass"),
                                     self.codec.decode(raw.value), raw.headers, raw.partition,
                                     raw.offset))
                result = self.handler(record)
        except Exception:
            self._done(track, entry, Failure())
            return
        self._took(track, entry, result)

    def hands(self, partition: int) -> bool:
        """:returns: True when this member hands ``partition`` now
        (assigned, not read again, not paused, not stopped): this node's
        records of it may be handed on acknowledgement (:meth:`take_own`)."""
        track = self._tracks.get(partition)
        return track is not None and track.live and not self._paused and not self.stopped

    def decides(self, key: str) -> bool:
        """See :meth:`tbmq.interfaces.IConsumer.decides`: the partition of
        ``key`` (:meth:`~.bus.KafkaBus.partition_of`) is handed by this
        member now (:meth:`hands`), was reached (everything below the end
        its first fetch saw arrived) and has nothing waiting here (in the
        buffer, or this node's records held until those before them); and
        Kafka answers (:meth:`~.bus.KafkaBus.acknowledging`: a record of
        this node acknowledged within the last half second, none failed
        since), else False: while the brokers may be away the member may
        have lost the partition without knowing yet, and what it decided
        could not be written to the session registry."""
        bus = self.bus
        if not bus.acknowledging():
            return False
        partition = bus.partition_of(self.topic, key)
        if partition is None or not self.hands(partition):
            return False
        track = self._tracks[partition]
        return track.reached and not track.queued and not track.held

    def take_own(self, partition: int, offset: int, items: tuple | list) -> None:
        """This node's unit ``items`` (``(key, value, headers)`` each) was
        acknowledged at ``offset`` of ``partition`` (:mod:`.own`): hand it
        now, keep it until the records before it were handed, or leave it
        to the fetch (not this member's partition now, paused, stopped,
        read already, records of the partition waiting in the buffer, or
        :data:`OWN_HELD_MAX` units held already: under load the fetch
        brings the records as soon, and holding them would only cost)."""
        if not self.hands(partition):
            return
        track = self._tracks[partition]
        top = track.top
        if top is None or offset < top:
            return  # where the partition starts is not known yet, or read already
        if offset == top and self._can_hand_own(track):
            self._hand_own(track, offset, items)
            if track.held:
                self._advance_own()
            return
        held = track.held
        if track.queued or (held is not None and len(held) >= OWN_HELD_MAX):
            return  # the fetch is ahead (records of it wait here) or far behind: it brings it
        if held is None:
            held = track.held = {}
        held[offset] = items
        self._holding.add(track)

    def _advance_own(self) -> None:
        """Hand the held units that follow everything handed in their
        partition, in offset order, as long as the member may hand; forget
        those of partitions that moved and those the fetch brought
        meanwhile."""
        holding = self._holding
        for track in list(holding):
            held = track.held
            if not track.live or not held:
                holding.discard(track)
                if held:
                    held.clear()
                continue
            top = track.top
            for offset in [o for o in held if o < top]:
                del held[offset]  # fetched meanwhile: handed as read
            while held and self._can_hand_own(track):
                items = held.pop(track.top, None)
                if items is None:
                    break
                self._hand_own(track, track.top, items)
            if not held:
                holding.discard(track)

    def _forget_own(self) -> None:
        """Paused or stopped: what was held is left to the fetch."""
        for track in self._holding:
            if track.held:
                track.held.clear()
        self._holding.clear()

    def _can_hand_own(self, track: Track) -> bool:
        """This node's record at :attr:`Track.top` of ``track`` may be
        handed now (:mod:`.own`): nothing of the partition waits in the
        buffer, the handler is not busy, the member is not paused and has
        room for one more pending result."""
        return (not track.queued and track.live and not self._busy and not self._paused
                and not self.stopped and self._inflight < self.max_uncommitted)

    def _hand_own(self, track: Track, offset: int, items: tuple | list) -> None:
        """Hand this node's unit at ``offset`` of ``track`` (acknowledged,
        every record before it handed): ``items`` are ``(key, value,
        headers)`` each, as published.  One item is handed as the
        :class:`~tbmq.cluster.records.Record` the fetch would give; several
        (a packed record) in one ``batch_handler`` call, or one record each
        to the handler, as a fetched packed record is."""
        track.top = track.handed = offset + 1
        topic, p = self.topic, track.partition
        batch = self.batch_handler is not None and len(items) > 1
        entry = track.arrive(offset, 1 if batch else len(items))
        self._busy = True
        try:
            if batch:
                try:
                    result = self.batch_handler([item[1] for item in items])
                except Exception:
                    self._done(track, entry, Failure())
                    return
                self._took(track, entry, result)
                return
            for key, value, headers in items:
                if not track.live:
                    break  # an earlier one failed: the partition is read again
                try:
                    result = self.handler(new_record((topic, key, value, headers, p, offset)))
                except Exception:
                    self._done(track, entry, Failure())
                    continue
                self._took(track, entry, result)
        finally:
            self._busy = False

    def _took(self, track: Track, entry: Entry, result: Any) -> None:
        """What the handler returned for (one record of) ``entry``."""
        if result is None:
            self._done(track, entry, None)
        elif type(result) is Completion:
            self._inflight += 1
            result.then(self._settled, track, entry)
        elif type(result) is Progress:  # one Kafka record: done once all of it is
            self._inflight += 1
            result.then(self._progress_one, track, entry, result.size)
        elif isinstance(result, defer.Deferred):
            self._inflight += 1
            result.addCallbacks(self._fired, self._fired, callbackArgs=(track, entry, False),
                                errbackArgs=(track, entry, True))
        else:
            self._done(track, entry, None)

    def _fired(self, outcome: Any, track: Track, entry: Entry, failed: bool) -> None:
        """A handler's Deferred fired (``failed``: with ``outcome``, a Failure)."""
        self._settled(outcome if failed else None, track, entry)

    def _settled(self, failure: Failure | None, track: Track, entry: Entry) -> None:
        """A handler's pending result (a Deferred, or a
        :class:`~tbmq.cluster.completion.Completion`) is done: with success
        when ``failure`` is None."""
        self._inflight -= 1
        self._done(track, entry, failure)
        self._room_freed()

    def _done(self, track: Track, entry: Entry, failure: Failure | None) -> None:
        """The handler's result for ``entry`` fired (``failure`` when it failed)."""
        if failure is not None:
            if entry.failure is None:
                entry.failure = failure
            if not track.live:
                log.debug("Kafka consumer group {group} of {topic}: partition {partition} "
                          "offset {offset} failed; it is read again", group=self.group,
                          topic=self.topic, partition=track.partition, offset=entry.offset)
        if track.done(entry, failure is None) and track.live:
            self.loop.commit(track.partition, track.committed)
            self._redelivery.passed(track.partition, track.committed)
        if track.blocked and track.live:
            self._read_again(track)
        if track.reached and not self.caught_up.called:
            self._check_caught_up()

    def _read_again(self, track: Track) -> None:
        """``track`` failed at :attr:`Track.failed`, every record before it
        committed: its records here are dropped (:meth:`_pump` skips them;
        this may run inside it) and the thread reads the partition again
        from the failed one, after the delay."""
        track.live = False
        failed = track.failed
        self._redelivery.failed(track.partition, failed.offset, failed.failure,
                                lambda: self._seek(track, failed.offset))

    def _seek(self, track: Track, offset: int) -> None:
        if not self.stopped and self._tracks.get(track.partition) is track:
            self.loop.seek(track.partition, offset)  # then _assigned: a new Track

    def _check_caught_up(self) -> None:
        if (not self.caught_up.called and self._has_assignment and not self.stopped
                and all(t.caught_up or not t.live for t in self._tracks.values())):
            if self._group_ready:
                self.caught_up.callback(None)
            elif not self._group_asking:
                self._ask_group()

    def _ask_group(self) -> None:
        """A group that joins is caught up once **every** partition of the
        topic has a position in the group (a committed offset), not only
        this member's: the cluster's groups get their first members one at
        a time, and a member starts a partition the group never committed
        at its end, so a record published to a partition no member holds
        yet would be skipped.  The node accepts clients only once its
        groups are caught up (``Broker.start``), so nothing it publishes
        goes where no member has a position.  Asked every
        :data:`GROUP_CHECK_EVERY` seconds (the bus's
        :meth:`~.bus.KafkaBus.group_positioned`, in its worker thread)."""
        self._group_asking = True

        def answered(ready: bool) -> None:
            self._group_asking = False
            if ready:
                self._group_ready = True
                self._check_caught_up()
            elif not self.stopped:
                self._group_asking = True
                self._reactor.callLater(self.GROUP_CHECK_EVERY, self._ask_group)

        def failed(failure) -> None:
            answered(False)

        self.bus.group_positioned(self).addCallbacks(answered, failed)
