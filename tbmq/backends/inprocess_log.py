"""The state behind :class:`tbmq.backends.inprocess_bus.InProcessBus`: the
partition logs of each topic, the consumer groups' offsets, and the waiters
of ``publish`` calls.  Plain data and small operations; no handler calls
(the bus does those; a waiter calls its publisher's ``done``).

Offsets count from 0 in each partition.  A partition holds the records from
:attr:`Partition.first` to :attr:`Partition.next` - 1, with holes where
records were compacted away or dropped; a reader skips holes.
"""

from __future__ import annotations

import zlib
from collections import deque
from itertools import count, repeat
from operator import itemgetter
from typing import Any, Callable

from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq.errors import BusClosedError, ConsumerFailedError
from tbmq.log import OBSERVER as LOG_OBSERVER

__all__ = ["Cursor", "Group", "Partition", "QueuedRun", "RangeWaiter", "TopicState", "Waiter",
           "partition_of"]

log = Logger(observer=LOG_OBSERVER)

#: a held entry's decoded object, and its value (:attr:`Partition.entries`)
_DECODED = itemgetter(3)
_VALUE = itemgetter(1)


def partition_of(key: str, n: int) -> int:
    """:returns: the partition (``int``, 0 to ``n`` - 1) of a record with
    ``key`` on a topic of ``n`` partitions: ``crc32(key) % n``, as the Kafka
    bus places the records it places itself."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % n


class Partition:
    """One append log.

    :ivar index: the partition number.
    :ivar entries: offset → ``(key, value, headers, decoded)``, in offset
        order (``value`` as stored: the object in direct mode, the encoded
        bytes or None on an encoded topic; ``decoded`` the object a record
        of a durable topic was published with, kept while a live group is
        to get it so that it is not decoded again, and for a transient record,
        which is then held unencoded, else None).
    :ivar first: no record below it is held (a lower bound of the first
        held offset).
    :ivar next: the offset the next record gets.
    :ivar keys: compacted topics: key → offset of its last record; else None.
    :ivar tombstones: compacted topics: offsets of held tombstones, in order.
    :ivar waiters: offset → :class:`Waiter` of a publish not finished yet.
    :ivar queued: the newest :class:`QueuedRun` of the partition, which
        the next queued publish joins when it can, or None.
    :ivar logged_next: the offset after the last record given to the topic
        log (or read back from it): a group's commit beyond it covers only
        records the log never had (transient ones), and is not written.
    """

    __slots__ = ("index", "entries", "first", "next", "keys", "tombstones", "waiters",
                 "logged_next", "queued")

    def __init__(self, index: int, compacted: bool = False) -> None:
        self.index = index
        self.entries: dict[int, tuple] = {}
        self.first = 0
        self.next = 0
        self.keys: dict | None = {} if compacted else None
        self.tombstones: deque | None = deque() if compacted else None
        self.waiters: dict[int, Waiter] = {}
        self.logged_next = 0
        self.queued: QueuedRun | None = None

    def append(self, key: str | None, value: Any, headers: tuple, decoded: Any = None) -> int:
        """Hold a record at the next offset; on a compacted partition the
        key's previous record goes.

        :returns: its offset.
        """
        o = self.next
        self.next = o + 1
        if self.keys is None:  # not compacted: put's work, without the call
            entries = self.entries
            if not entries:
                self.first = o
            entries[o] = (key, value, headers, decoded)
        else:
            self.put(o, key, value, headers, decoded)
        return o

    def extend(self, keys: list, values: list, decoded: list | None = None) -> int:
        """Hold records without headers at the next offsets, in one pass
        (a partition that is not compacted: a run published together).

        :param decoded: the objects the values were encoded from (see
            :attr:`entries`), or None.
        :returns: the offset of the first.
        """
        first = self.next
        entries = self.entries
        if not entries:
            self.first = first
        # the entries made and held in C (no bytecode per record)
        entries.update(zip(count(first), zip(keys, values, repeat(()),
                                             repeat(None) if decoded is None else decoded)))
        self.next = first + len(values)
        return first

    def run(self, o: int, most: int, codec) -> tuple[list, list]:
        """The records held in a row from offset ``o`` (held there), at most
        ``most``, up to the first hole, with their values decoded (a
        consumer's batch).  Found and read in C, no bytecode per record,
        when each is held decoded (a durable topic's live record) or, with
        no ``codec``, as the object itself; else decoded one by one, up to
        the first that does not decode.

        :param codec: the topic's :class:`~tbmq.cluster.record_codec.RecordCodec`,
            or None.
        :returns: ``(offsets, values)``, in order; both empty when the
            record at ``o`` does not decode.
        """
        end = self.next
        if end - o > most:
            end = o + most
        held = list(map(self.entries.get, range(o, end)))
        if None in held:  # (a tuple compared to None: in C)
            del held[held.index(None):]
        values = list(map(_DECODED, held))
        if all(values):
            return list(range(o, o + len(held))), values
        if codec is None and not any(values):
            return list(range(o, o + len(held))), list(map(_VALUE, held))
        offsets, values = [], []
        for x, (_, value, _, decoded) in enumerate(held, o):
            if decoded is not None:
                value = decoded
            elif codec is not None:
                try:
                    value = codec.decode(value)
                except Exception:  # it alone fails, once those before it are handed
                    break
            offsets.append(x)
            values.append(value)
        return offsets, values

    def put(self, o: int, key: str | None, value: Any, headers: tuple,
            decoded: Any = None) -> None:
        """Hold a record at offset ``o`` (appending, or restoring a log);
        see :attr:`entries`."""
        entries = self.entries
        if not entries:
            self.first = o
        entries[o] = (key, value, headers, decoded)
        keys = self.keys
        if keys is not None and key is not None:
            previous = keys.get(key)
            keys[key] = o
            if previous is not None:
                entries.pop(previous, None)
            if value is None:
                self.tombstones.append(o)

    def release(self, before: int) -> int:
        """Forget what every group has passed: every record below ``before``
        (compacted: the tombstones below it, the keys' last values stay).

        :returns: how many records went.
        """
        entries = self.entries
        n = len(entries)
        if self.keys is None:
            o = self.first
            if before >= self.next:  # every record goes (the usual commit)
                entries.clear()
            elif before - o > n:  # sparse: walk the records, not the offsets
                for held in [held for held in entries if held < before]:
                    del entries[held]
            else:  # each offset popped in C (no bytecode per record)
                deque(map(entries.pop, range(o, before), repeat(None)), maxlen=0)
            if before > self.first:
                self.first = before
        else:
            tombstones, keys = self.tombstones, self.keys
            while tombstones and tombstones[0] < before:
                o = tombstones.popleft()
                entry = entries.pop(o, None)
                if entry is not None and keys.get(entry[0]) == o:
                    del keys[entry[0]]
        return n - len(entries)

    def drop_oldest(self, keep: int, below: int) -> int:
        """Retention: drop the oldest records below offset ``below`` until
        at most ``keep`` are held.

        :returns: how many were dropped.
        """
        entries = self.entries
        dropped = 0
        while len(entries) > keep:
            o = next(iter(entries))
            if o >= below:
                break
            del entries[o]
            dropped += 1
            self.first = o + 1
        return dropped

    def first_held(self) -> int:
        """:returns: the lowest held offset (:attr:`next` when none)."""
        for o in self.entries:
            return o
        return self.next


class Cursor:
    """Where one consumer group is in one partition, for one assignment
    (a rebalance makes a new cursor; results of records handed under an old
    one do not commit).

    :ivar committed: every record below it is handled (the group's offset).
    :ivar position: the next offset to hand.
    :ivar inflight: offsets handed whose handler result has not fired.
    :ivar failed: offset → the :class:`~twisted.python.failure.Failure` of
        its handler result (they hold the commit back until the partition
        is read again).
    :ivar logged: the committed offset last given to the topic log, or None.
    """

    __slots__ = ("committed", "position", "inflight", "failed", "logged")

    def __init__(self, committed: int) -> None:
        self.logged = None
        self.committed = committed
        self.position = committed
        self.inflight: set[int] = set()
        self.failed: dict[int, Any] = {}

    def advance(self, settled: range | None = None) -> bool:
        """Move :attr:`committed` over the contiguous handled prefix.

        :param settled: the offsets whose results just fired with success
            (handed, out of :attr:`inflight`, not failed), or None: when
            they start at :attr:`committed` it moves past them at once, not
            one offset at a time.
        :returns: True when it moved.
        """
        c = start = self.committed
        position, inflight, failed = self.position, self.inflight, self.failed
        if settled is not None and settled.start == c and settled.stop <= position:
            c = settled.stop
        while c < position and c not in inflight and c not in failed:
            c += 1
        if c == start:
            return False
        self.committed = c
        return True

    def handled_below(self, offset: int) -> bool:
        """:returns: True when every record below ``offset`` was handed and
        its result fired (with success or not)."""
        if self.committed >= offset:
            return True
        if self.position < offset:
            return False
        return not any(o < offset for o in self.inflight)


class Group:
    """One consumer group of one topic.

    :ivar name: the group name.
    :ivar members: the live members, in join order.
    :ivar cursors: partition → :class:`Cursor`.
    :ivar owners: partition → the member that owns it, or None.
    """

    __slots__ = ("name", "members", "cursors", "owners")

    def __init__(self, name: str, starts: list[int]) -> None:
        self.name = name
        self.members: list = []
        self.cursors = [Cursor(o) for o in starts]
        self.owners: list = [None] * len(starts)

    def assign(self, reset: bool = False) -> None:
        """Share the partitions among the members (partition ``p`` to member
        ``p % len(members)``); a partition that changes owner, or every one
        when ``reset``, gets a new cursor at the committed offset."""
        members = self.members
        n = len(members)
        for p, cursor in enumerate(self.cursors):
            owner = members[p % n] if n else None
            if reset or owner is not self.owners[p]:
                self.owners[p] = owner
                self.cursors[p] = Cursor(cursor.committed)
        for m in members:
            m.partitions = [p for p, owner in enumerate(self.owners) if owner is m]


class Waiter:
    """The outcome of one publish to a non-durable topic: which groups
    still have to handle the record (a durable topic's publish waits for
    the topic log only: :mod:`tbmq.backends.inprocess_writes`).

    :ivar pending: names of the groups that have not handled it yet.
    :ivar failed_group: the first group whose handler failed, or None.
    :ivar error: a failure that fails the publish outright (bus stopped),
        or None.
    :ivar notify: the publish's ``done(None | Failure)``, called once when
        it is :attr:`done`, or None.
    """

    __slots__ = ("pending", "failed_group", "error", "notify", "topic")

    def __init__(self, topic: str, pending: set[str],
                 notify: Callable[[Failure | None], None] | None = None) -> None:
        self.topic = topic
        self.pending = pending
        self.failed_group: str | None = None
        self.error: Exception | None = None
        #: (given here, or by :meth:`settle`)
        self.notify = notify

    @property
    def done(self) -> bool:
        return self.error is not None or not self.pending

    def complete(self, group: str, ok: bool, offset: int | None = None) -> bool:
        """Group ``group`` handled the record (its result fired ``ok``).

        :param offset: the record's offset (a :class:`RangeWaiter` waits
            for several).
        :returns: True when no group waits for the record at ``offset``
            any more (its entry in :attr:`Partition.waiters` may go): here
            :attr:`done`."""
        pending = self.pending
        if group in pending:
            pending.discard(group)
            if not ok and self.failed_group is None:
                self.failed_group = group
            if not pending and self.notify is not None:
                if self.failed_group is None and self.error is None:
                    # the usual end: every group handled it well (told as
                    # _tell does, without the call)
                    notify, self.notify = self.notify, None
                    try:
                        notify(None)
                    except Exception:
                        log.failure("in-process bus: the outcome of a publish to {topic} "
                                    "could not be reported", topic=self.topic)
                else:
                    self._maybe_fire()
        return self.error is not None or not pending

    def complete_span(self, group: str, start: int, end: int, waiters: dict) -> int:
        """Group ``group`` handled the records from ``start`` to ``end`` -
        1 with success (a batch), ``start`` this waiter's: :meth:`complete`
        for ``start``, whose entry leaves ``waiters`` when no group waits
        for it any more.

        :returns: ``start + 1``, the next offset to look at."""
        if self.complete(group, True, start):
            waiters.pop(start, None)
        return start + 1

    def close(self) -> None:
        """The bus stopped before the record was handled."""
        if not self.done:
            self.error = BusClosedError(f"{self.topic}: the bus stopped before every "
                                        "consumer group handled the record")
            self._maybe_fire()

    def _failure(self) -> Exception | None:
        if self.error is not None:
            return self.error
        if self.failed_group is not None:
            return ConsumerFailedError(
                f"{self.topic}: the handler of consumer group {self.failed_group!r} failed; "
                "the record is not committed for it", group=self.failed_group)
        return None

    def _maybe_fire(self) -> None:
        notify = self.notify
        if notify is not None and self.done:
            self.notify = None
            error = self._failure()
            self._tell(notify, None if error is None else Failure(error))

    def _tell(self, notify: Callable, outcome: Failure | None) -> None:
        self._tell_all((notify,), outcome)

    def _tell_all(self, notifies, outcome: Failure | None) -> None:
        """Call each of ``notifies`` (None ones skipped) with ``outcome``,
        in order, in one guarded loop (not a ``try`` and a call each): one
        that raises is logged, and those after it are still told."""
        it = iter(notifies)
        while True:
            try:
                for notify in it:
                    if notify is not None:
                        notify(outcome)
                return
            except Exception:
                log.failure("in-process bus: the outcome of a publish to {topic} could not "
                            "be reported", topic=self.topic)

    def outcome(self) -> "Waiter | Exception | None":
        """What the publish has come to: None when it is done and well, its
        error when done and not well, else this waiter (to :meth:`settle`)."""
        if self.done:
            return self._failure()
        return self

    def settle(self, done: Callable[[Failure | None], None]) -> None:
        """Call ``done`` once the publish is done (:attr:`done` is False
        now): with None, or a :class:`~twisted.python.failure.Failure` of
        :class:`~tbmq.errors.ConsumerFailedError` or
        :class:`~tbmq.errors.BusClosedError`; what it raises is logged."""
        self.notify = done


class RangeWaiter(Waiter):
    """The outcome of one ``publish_many`` to a non-durable topic: records
    at the offsets ``first`` .. ``first + count - 1`` of one partition, one
    ``done`` for them all (:meth:`InProcessBus.publish_many
    <tbmq.backends.inprocess_bus.InProcessBus.publish_many>`).  It is
    registered at each of their offsets in :attr:`Partition.waiters`, and
    done once every group handled every one of them, or one failed (the
    first failure decides, as a publish of each under a
    :class:`~tbmq.cluster.completion.Completion` would).

    :ivar left: group name → the offsets it has not handled yet.
    :ivar stop: the offset after its last record.
    """

    __slots__ = ("left", "stop")

    def __init__(self, topic: str, groups: list[str], first: int, count: int) -> None:
        super().__init__(topic, set(groups))
        self.stop = first + count
        self.left = {group: set(range(first, first + count)) for group in groups}

    def complete_span(self, group: str, start: int, end: int, waiters: dict) -> int:
        """Group ``group`` handled the records from ``start`` to ``end`` -
        1 with success (a batch), ``start`` one of this waiter's: those of
        them that are its own are handled at once (one set operation, not a
        :meth:`complete` each), and leave ``waiters``
        (:attr:`Partition.waiters`) when no group waits for them any more.

        :returns: the offset after the last of them that is this waiter's."""
        stop = self.stop if self.stop < end else end
        left = self.left
        offsets = left.get(group)
        if offsets is not None:
            offsets.difference_update(range(start, stop))
            if not offsets:
                del left[group]
                self.pending.discard(group)
                if not self.pending and self.notify is not None:
                    self._maybe_fire()
        gone = range(start, stop)
        if self.error is None and left:  # those another group waits for stay
            gone = set(gone)
            for waiting in left.values():
                gone -= waiting
        deque(map(waiters.pop, gone, repeat(None)), 0)  # in C
        return stop

    def complete(self, group: str, ok: bool, offset: int | None = None) -> bool:
        """Group ``group`` handled the record at ``offset`` (its result
        fired ``ok``; a failure fails the publish, and the group waits for
        none of its records any more).

        :returns: True when no group waits for the record at ``offset``
            (or the waiter is closed)."""
        left = self.left
        offsets = left.get(group)
        if offsets is not None and offset in offsets:
            if ok:
                offsets.discard(offset)
            else:
                offsets.clear()
                if self.failed_group is None:
                    self.failed_group = group
            if not offsets:
                del left[group]
                self.pending.discard(group)
                if not self.pending and self.notify is not None:
                    self._maybe_fire()
        if self.error is not None or not left:
            return True
        for offsets in left.values():
            if offset in offsets:
                return False
        return True


class QueuedRun(Waiter):
    """The outcomes of publishes to a topic of one group whose member takes
    batches, queued while it was busy
    (:meth:`InProcessBus._queued <tbmq.backends.inprocess_bus.InProcessBus>`):
    records at consecutive offsets from ``first``, each with its own
    ``done``, under one object (registered at each of their offsets in
    :attr:`Partition.waiters`), not a :class:`Waiter` and a set each.
    Each record is done once the group handled it (its ``done`` called
    with None, or a :class:`~twisted.python.failure.Failure` of
    :class:`~tbmq.errors.ConsumerFailedError` when the handler failed), or
    when the run is closed (:class:`~tbmq.errors.BusClosedError`).

    :ivar group: the group's name.
    :ivar first: the offset of the first record.
    :ivar end: the offset the next record must have to join the run (its
        ``done`` then appended to :attr:`dones`, and ``end`` moved on), or
        -1 once closed.
    :ivar dones: the ``done`` of each record from :attr:`first` on, None
        once called.
    """

    __slots__ = ("first", "end", "dones", "group")

    def __init__(self, topic: str, group: str, first: int) -> None:
        super().__init__(topic, set())
        self.group = group
        self.first = self.end = first
        self.dones: list = []

    @property
    def done(self) -> bool:
        return self.error is not None or not any(self.dones)

    def complete(self, group: str, ok: bool, offset: int | None = None) -> bool:
        """Group ``group`` handled the record at ``offset``: its ``done``
        is called (another group's answer changes nothing).

        :returns: True: no group waits for that record any more."""
        if group == self.group and offset is not None:
            self._call(offset, offset + 1, ok)
        return True

    def complete_span(self, group: str, start: int, end: int, waiters: dict) -> int:
        """Group ``group`` handled the records from ``start`` to ``end`` -
        1 with success (a batch), ``start`` one of this run's: those of
        them that are this run's are done at once, and leave ``waiters``
        (:attr:`Partition.waiters`).

        :returns: the offset after the last of them that is this run's."""
        stop = self.first + len(self.dones)
        if stop > end:
            stop = end
        if group == self.group:
            # their entries leave in C, then each done is called
            deque(map(waiters.pop, range(start, stop), repeat(None)), 0)
            self._call(start, stop, True)
        return stop

    def _call(self, start: int, stop: int, ok: bool) -> None:
        """Tell the ``done`` of the records from ``start`` to ``stop`` - 1
        not told yet (``ok``: their group handled them well)."""
        dones = self.dones
        lo, hi = start - self.first, stop - self.first
        if lo < 0:
            lo = 0
        told = dones[lo:hi]
        dones[lo:hi] = repeat(None, len(told))
        outcome = None if ok else Failure(ConsumerFailedError(
            f"{self.topic}: the handler of consumer group {self.group!r} failed; "
            "the record is not committed for it", group=self.group))
        self._tell_all(told, outcome)

    def close(self) -> None:
        """The bus stopped (or the topic went) before the records were
        handled: every ``done`` not called yet is told."""
        if self.error is not None:
            return
        self.end = -1
        self.error = BusClosedError(f"{self.topic}: the bus stopped before every "
                                    "consumer group handled the record")
        dones, self.dones = self.dones, []
        for done in dones:
            if done is not None:
                self._tell(done, Failure(self.error))


class TopicState:
    """One topic of the bus.

    :ivar name: the topic name.
    :ivar parts: the :class:`Partition` list.
    :ivar groups: group name → :class:`Group` (every group ever subscribed).
    :ivar codec: the codec when values are held encoded (encoding mode, or a
        durable topic), else None.
    :ivar durable: written to the topic log.
    :ivar compacted: the last record per key is kept.
    :ivar rr: the partition of the next record without a key.
    :ivar live: the groups of :attr:`groups` with a live member, in
        subscription order (kept by the bus at every join and leave; read
        only).
    """

    __slots__ = ("name", "parts", "groups", "codec", "durable", "compacted", "rr", "live")

    def __init__(self, name: str, partitions: int, codec, durable: bool,
                 compacted: bool) -> None:
        self.name = name
        self.parts = [Partition(p, compacted) for p in range(partitions)]
        self.groups: dict[str, Group] = {}
        self.codec = codec
        self.durable = durable
        self.compacted = compacted
        self.rr = 0
        self.live: list[Group] = []
