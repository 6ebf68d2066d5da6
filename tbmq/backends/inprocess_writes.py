"""What :class:`tbmq.backends.inprocess_bus.InProcessBus` writes to its
topic log (:class:`tbmq.interfaces.ITopicLog`): the records of its durable
topics, its consumer groups' committed offsets and the truncations below
them, gathered during one reactor turn and written together at the start
of the next (*group commit*).

The records a turn publishes to durable topics go to the log in one
``append`` call (one transaction of the SQLite topic log, however many
publishes and topics), before that turn's commits and truncations (so a
truncation never precedes the append of a record below it).  Each
record's :class:`~tbmq.backends.inprocess_log.Waiter` is told once that
call's Deferred fired: the publisher's ``done`` is called after the COMMIT
that made its record durable, as before, with one Deferred per turn
instead of one per record.
"""

from __future__ import annotations

from twisted.internet import defer
from twisted.logger import Logger

from tbmq.backends.inprocess_log import Waiter
from tbmq.log import OBSERVER as LOG_OBSERVER

__all__ = ["LogWrites"]

log = Logger(observer=LOG_OBSERVER)


class LogWrites:
    """The topic-log writes of one bus that wait for the next flush.

    :param topic_log: the :class:`~tbmq.interfaces.ITopicLog`.
    :param clock: ``IReactorTime`` of the flushes.
    :ivar active: flushes are scheduled only while True (the bus runs).
    :ivar records: ``(topic, partition, offset, key, value, headers,
        compacted)`` appended this turn, in publish order.
    :ivar waiters: their :class:`~tbmq.backends.inprocess_log.Waiter`, in
        the same order.
    :ivar commits: ``(group, topic, partition) → offset`` to write.
    :ivar truncates: ``(topic, partition) → before`` to write.
    """

    __slots__ = ("topic_log", "clock", "active", "records", "waiters", "commits", "truncates",
                 "call")

    def __init__(self, topic_log, clock) -> None:
        self.topic_log = topic_log
        self.clock = clock
        self.active = False
        self.records: list[tuple] = []
        self.waiters: list[Waiter] = []
        self.commits: dict[tuple, int] = {}
        self.truncates: dict[tuple, int] = {}
        self.call = None

    def append(self, record: tuple, waiter: Waiter) -> None:
        """Write ``record`` (an encoded one, for
        :meth:`~tbmq.interfaces.ITopicLog.append`) with the next flush;
        ``waiter.logged`` is called once the log has it."""
        self.records.append(record)
        self.waiters.append(waiter)
        if self.call is None and self.active:
            self.call = self.clock.callLater(0, self.flush)

    def commit(self, group: str, topic: str, partition: int, offset: int) -> None:
        """Write ``group``'s committed ``offset`` with the next flush (the
        last one of a turn wins)."""
        self.commits[(group, topic, partition)] = offset
        self.soon()

    def truncate(self, topic: str, partition: int, before: int) -> None:
        """Drop the logged records below ``before`` with the next flush."""
        self.truncates[(topic, partition)] = before
        self.soon()

    def soon(self) -> None:
        """Flush in the next reactor turn (once)."""
        if self.call is None and self.active:
            self.call = self.clock.callLater(0, self.flush)

    def forget(self, topic: str) -> None:
        """``topic`` is deleted: nothing of it is written any more; its
        records not written yet fail their publish
        (:meth:`~tbmq.backends.inprocess_log.Waiter.close`)."""
        for key in [k for k in self.commits if k[1] == topic]:
            del self.commits[key]
        for key in [k for k in self.truncates if k[0] == topic]:
            del self.truncates[key]
        records, waiters = self.records, self.waiters
        self.records, self.waiters = [], []
        for record, waiter in zip(records, waiters):
            if record[0] == topic:
                waiter.close()
            else:
                self.records.append(record)
                self.waiters.append(waiter)

    def flush(self) -> defer.Deferred:
        """Write what waits: the records in one ``append``, then the commits
        and truncations.

        :returns: a Deferred firing with None once every write is done
            (a failed one is logged; a failed append fails its records'
            publishes).
        """
        call, self.call = self.call, None
        if call is not None and call.active():
            call.cancel()
        topic_log = self.topic_log
        calls = []
        if self.records:
            records, self.records = self.records, []
            waiters, self.waiters = self.waiters, []
            d = topic_log.append(records)
            d.addCallbacks(_logged, _not_logged, callbackArgs=(waiters,),
                           errbackArgs=(waiters,))
            calls.append(d)
        if self.commits:
            commits, self.commits = self.commits, {}
            calls += [topic_log.commit(g, t, p, o) for (g, t, p), o in commits.items()]
        if self.truncates:
            truncates, self.truncates = self.truncates, {}
            calls += [topic_log.truncate(t, p, o) for (t, p), o in truncates.items()]
        for d in calls:
            d.addErrback(lambda f: log.failure("in-process bus: topic log write failed", f))
        return defer.gatherResults(calls).addCallback(lambda _: None)


def _logged(_result, waiters: list) -> None:
    """The append of ``waiters``' records is committed: tell each."""
    for waiter in waiters:
        waiter.logged()


def _not_logged(failure, waiters: list):
    """The append of ``waiters``' records failed: nothing of it is stored,
    every one of their publishes fails.  :returns: ``failure`` (logged)."""
    for waiter in waiters:
        waiter.logged(failure)
    return failure
