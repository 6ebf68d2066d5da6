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
    :ivar refetches: how many times a partition was read again from a hole
        (``int``; the tests read it).
    """

    def __init__(self, name: str, wait: float = GAP_WAIT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.wait = wait
        self.clock = clock
        self.refetches = 0
        self._open: dict[int, tuple[int, float]] = {}  # partition -> (missing offset, since)

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
        for r in records:
            p = r.partition
            if p in again:
                continue
            want = expected.get(p)
            if want is None:
                want = nexts.get(p)
            if want is not None and r.offset > want and not self._passed(p, want, r.offset):
                again[p] = want
                continue
            if want is not None and r.offset >= want:
                self._open.pop(p, None)
            expected[p] = r.offset + 1
            kept.append(r)
        if again:
            self.refetches += 1
        return kept, again

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
