"""Records handed over without a hole: a consumer of a topic whose offsets
have no gaps reads a partition again from the first offset it has not seen
when a fetch skips offsets (:class:`Gaps`).

The bus's own topics that are not compacted are written only by tbmq's
producers, without transactions, so each offset of their partitions is a
record: a fetch that brings offset ``n + 2`` after ``n`` has skipped
``n + 1``.  Kafka never does that (a record is readable only once every
offset below it is).  Tansu, the Kafka-protocol broker of the tests, does:
when two producers write to one partition at once, a fetch can return the
later batch before the earlier one is readable, and a consumer that goes on
from there never sees the earlier records (measured: 3 holes of a whole
batch each in 827,500 records of two producers in 20 s; all there when read
again).  An acknowledged MQTT message in such a hole was lost.

So the thread (:class:`~.loop.ConsumerLoop`) drops a partition's records
from the hole on, seeks the partition back to the missing offset and reads
it again.  A hole that is still there after :data:`GAP_WAIT` seconds is
taken as real (records deleted by retention, or written by a transactional
producer outside tbmq) and passed, with a warning.

The compacted topics (``tbmq.client.session``, ``tbmq.client.subscriptions``,
``tbmq.msg.retained``) have legitimate holes on Kafka: compaction removes
records.  But Kafka's log cleaner never touches the head of a partition
younger than the topic's ``min.compaction.lag.ms`` (nor the active
segment): the cleanable range ends at the first segment whose newest
timestamp is younger than the lag, so nothing after a young record is
removed.  tbmq creates these topics with ``min.compaction.lag.ms =
kafka.min_compaction_lag_ms`` and :class:`Gaps` is given that lag: a hole
right after a record whose timestamp is younger than half the lag (the
other half is a margin for the clocks of the producing node, the broker and
this node) cannot be compaction, so it is read again as above; a hole after
an older record, after a record without a timestamp (the lag cannot protect
what has no time) or before the first record handed over since the
partition was (re)started is passed at once, without a warning.  On Tansu,
which does not compact, this catches its holes: they come in live reading,
right after a fresh record.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from twisted.logger import Logger

from tbmq.log import OBSERVER as LOG_OBSERVER

__all__ = ["GAP_WAIT", "Gaps"]

log = Logger(observer=LOG_OBSERVER)

#: Seconds a partition is read again from a missing offset before the hole
#: is passed.
GAP_WAIT = 5.0


class Gaps:
    """Finds the holes in what one subscription's polls bring (thread side).

    :param name: the consumer's name in log lines.
    :param wait: :data:`GAP_WAIT`.
    :param clock: ``() -> float`` seconds (monotonic).
    :param compaction_lag_ms: None: every offset is a record, every hole is
        read again; an ``int`` (> 0): the topic is compacted with this
        ``min.compaction.lag.ms``, only the holes after a record younger
        than half of it are read again (see the module doc).
    :param wall: ``() -> float`` seconds since the epoch, the clock of the
        records' timestamps.
    :ivar refetches: how many times a partition was read again from a hole
        (``int``; the tests read it).
    """

    def __init__(self, name: str, wait: float = GAP_WAIT,
                 clock: Callable[[], float] = time.monotonic, *,
                 compaction_lag_ms: int | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.name = name
        self.wait = wait
        self.clock = clock
        self.wall = wall
        self.refetches = 0
        #: ms of age under which a record's successors cannot be compacted
        self.recent_ms = None if compaction_lag_ms is None else compaction_lag_ms / 2.0
        self._open: dict[int, tuple[int, float]] = {}  # partition -> (missing offset, since)
        # compacted: partition -> timestamp of the last record handed over
        self._stamps: dict[int, int | None] = {}

    def filter(self, records: list, nexts: dict[int, int]) -> tuple[list, dict[int, int]]:
        """The records of one poll that follow what was handed over.

        :param records: :class:`~.drivers.RawRecord` in offset order per
            partition.
        :param nexts: partition -> the next offset expected (the one after
            the last record handed over, or where the partition started);
            a partition without one is not checked.
        :returns: ``(records, again)``: the records to hand over, and
            ``{partition: offset}`` of the partitions to read again from
            ``offset`` (their records from the hole on were dropped).
        """
        expected: dict[int, int] = {}
        again: dict[int, int] = {}
        kept = []
        stamps = None if self.recent_ms is None else self._stamps
        for r in records:
            p = r.partition
            if p in again:
                continue
            want = expected.get(p)
            if want is None:
                want = nexts.get(p)
            if (want is not None and r.offset > want
                    and (stamps is None or self._young(stamps.get(p)))
                    and not self._passed(p, want, r.offset)):
                again[p] = want
                continue
            if want is not None and r.offset >= want:
                self._open.pop(p, None)
            expected[p] = r.offset + 1
            if stamps is not None:
                stamps[p] = r.timestamp
            kept.append(r)
        if again:
            self.refetches += 1
        return kept, again

    def _young(self, stamp: int | None) -> bool:
        """The last record handed over of a compacted partition was written
        less than half ``min.compaction.lag.ms`` ago: what follows it cannot
        have been compacted.  False without a record or a timestamp."""
        return stamp is not None and stamp > self.wall() * 1000.0 - self.recent_ms

    def _passed(self, partition: int, missing: int, found: int) -> bool:
        """A hole from ``missing`` to ``found`` (excluded): False while it
        is read again, True once it was there for :attr:`wait` seconds."""
        now = self.clock()
        known = self._open.get(partition)
        if known is None or known[0] != missing:
            self._open[partition] = (missing, now)
            log.debug("Kafka consumer {name}: partition {partition} brought offset {found} "
                      "before {missing}: read again from {missing}", name=self.name,
                      partition=partition, found=found, missing=missing)
            return False
        if now - known[1] < self.wait:
            return False
        del self._open[partition]
        log.warn("Kafka consumer {name}: partition {partition} has no records from offset "
                 "{missing} to {last} ({seconds:.0f} s of reading again); going on at {found}",
                 name=self.name, partition=partition, missing=missing, last=found - 1,
                 found=found, seconds=now - known[1])
        return True

    def forget(self, partitions: Any) -> None:
        """``partitions`` were taken away, assigned again or read again
        from elsewhere: their holes are not followed any more."""
        for p in partitions:
            self._open.pop(p, None)
            self._stamps.pop(p, None)
