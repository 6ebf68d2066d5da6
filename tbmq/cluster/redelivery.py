"""When a consumer hands a failed record again (``docs/bus.md``, "Handlers
and commits"): one :class:`Redelivery` per consumer, shared by the
in-process bus and the Kafka bus.

A handler result that fails stops its partition at that record; the member
reads the partition again from the record :data:`FIRST_DELAY` seconds
later, then after twice the delay while it keeps failing, at most
:data:`MOST_DELAY` seconds; a success past it resets the delay.  The first
failure of an outage is logged with its traceback, then a reminder at most
once per :data:`MOST_DELAY` seconds while the record keeps failing (a poison
record), and the recovery once.
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from tbmq.log import OBSERVER as LOG_OBSERVER

__all__ = ["FIRST_DELAY", "MOST_DELAY", "Redelivery"]

log = Logger(observer=LOG_OBSERVER)

#: Seconds before a failed record is handed again the first time.
FIRST_DELAY = 1.0
#: Most seconds between two hands of a record that keeps failing.
MOST_DELAY = 30.0


class _Outage:
    __slots__ = ("offset", "delay", "attempts", "since", "logged", "call")

    def __init__(self, offset: int, now: float) -> None:
        self.offset = offset
        self.delay = 0.0
        self.attempts = 0
        self.since = now
        self.logged = now
        self.call: Any = None


class Redelivery:
    """The failed partitions of one consumer and their delays.

    :param clock: an ``IReactorTime`` (``callLater``, ``seconds``).
    :param name: what the log lines call the consumer ("consumer group g of
        topic t").
    """

    def __init__(self, clock: Any, name: str) -> None:
        self._clock = clock
        self.name = name
        self._outages: dict[int, _Outage] = {}

    def waiting(self, partition: int) -> bool:
        """:returns: True while ``partition`` waits to be read again."""
        outage = self._outages.get(partition)
        return outage is not None and outage.call is not None

    def failed(self, partition: int, offset: int, failure: Failure,
               again: Callable[[], None]) -> None:
        """The record at ``offset`` of ``partition`` failed and stopped the
        partition: call ``again()`` after the delay (nothing when the
        partition already waits).

        :param offset: the offset to read the partition again from (the
            failed record; a Kafka record carrying several records: its
            offset).
        """
        outage = self._outages.get(partition)
        if outage is not None and outage.call is not None:
            return
        now = self._clock.seconds()
        if outage is None:
            outage = self._outages[partition] = _Outage(offset, now)
            outage.delay = FIRST_DELAY
            log.failure("{name} failed on partition {partition} offset {offset}; handing it "
                        "again in {delay} s (later failures: a reminder every {most} s)",
                        failure, level=LogLevel.warn, name=self.name, partition=partition,
                        offset=offset, delay=outage.delay, most=MOST_DELAY)
        else:
            outage.delay = min(outage.delay * 2, MOST_DELAY)
            if offset != outage.offset or now - outage.logged >= MOST_DELAY:
                outage.logged = now
                log.warn("{name} still fails on partition {partition} offset {offset} "
                         "({attempts} attempts in {seconds:.0f} s): {error}; handing it again "
                         "every {delay} s", name=self.name, partition=partition,
                         offset=offset, attempts=outage.attempts + 1,
                         seconds=now - outage.since, error=failure.getErrorMessage(),
                         delay=outage.delay)
            outage.offset = offset
        outage.attempts += 1
        outage.call = self._clock.callLater(outage.delay, self._fire, outage, again)

    @staticmethod
    def _fire(outage: _Outage, again: Callable[[], None]) -> None:
        outage.call = None
        again()

    def passed(self, partition: int, committed: int) -> None:
        """The commit of ``partition`` moved to ``committed``: past the
        failed record, the outage is over (the delay starts again at
        :data:`FIRST_DELAY`)."""
        outage = self._outages.get(partition)
        if outage is not None and outage.call is None and committed > outage.offset:
            del self._outages[partition]
            log.info("{name}: partition {partition} offset {offset} handled after "
                     "{attempts} failures", name=self.name, partition=partition,
                     offset=outage.offset, attempts=outage.attempts)

    def forget(self, partition: int | None = None) -> None:
        """Stop waiting for ``partition`` (taken away), or for every one."""
        gone = list(self._outages) if partition is None else [partition]
        for p in gone:
            outage = self._outages.pop(p, None)
            if outage is not None and outage.call is not None and outage.call.active():
                outage.call.cancel()
