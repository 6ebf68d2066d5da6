"""What :class:`tbmq.backends.inprocess_bus.InProcessBus` writes to its
topic log (:class:`tbmq.interfaces.ITopicLog`): the records of its durable
topics, its consumer groups' committed offsets and the truncations below
them, gathered during one reactor turn and written together at the start
of the next (*group commit*), or, when a consumer's slice of handing
published records (the router's deliveries to APPLICATION clients, whose
publishers wait for the COMMIT), when that slice ends
(:meth:`LogWrites.flush_records`).

The records a turn publishes to durable topics go to the log in one
:meth:`~tbmq.interfaces.ITopicLog.write` call with that turn's commits and
truncations (one transaction of the SQLite topic log, however many
publishes and topics), the records first (so a truncation never precedes
the append of a record below it).  Each
record's publisher is told (its ``done`` called) once that call's Deferred
fired: after the COMMIT that made its record durable, as before, with one
Deferred per turn instead of one per record (and no waiter object).  A
run of records with one ``done`` (:meth:`LogWrites.append_run`: the
router's deliveries of a batch to one APPLICATION client) is one
:class:`~tbmq.backends.topic_records.RecordRun` item of that ``write``,
told once.
"""

from __future__ import annotations

from typing import Callable

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq.backends.topic_records import RecordRun
from tbmq.errors import BusClosedError, BusPublishError
from tbmq.log import OBSERVER as LOG_OBSERVER

__all__ = ["LogWrites"]

log = Logger(observer=LOG_OBSERVER)


class LogWrites:
    """The topic-log writes of one bus that wait for the next flush.

    :param topic_log: the :class:`~tbmq.interfaces.ITopicLog`.
    :param clock: ``IReactorTime`` of the flushes.
    :ivar active: flushes are scheduled only while True (the bus runs).
    :ivar records: ``(topic, partition, offset, key, value, headers,
        compacted)`` and :class:`~tbmq.backends.topic_records.RecordRun`
        appended this turn, in publish order.
    :ivar dones: the publish's ``done(None | Failure)`` of each item of
        :attr:`records`, in the same order.
    :ivar commits: ``(group, topic, partition) → offset`` to write.
    :ivar truncates: ``(topic, partition) → before`` to write.
    :ivar handing: > 0 while a consumer's slice of handing runs (its
        :meth:`flush_records` comes at its end): a record appended then
        schedules no flush of its own (no timed call made and cancelled
        per batch).
    :ivar landing: flushes with records whose write has not fired yet.
        While one is under way commits and truncations wait for the next
        flush with records, or for its end: they are not worth a
        transaction (and a COMMIT) of their own that the next records, whose
        publishers wait, would queue behind.
    """

    __slots__ = ("topic_log", "clock", "active", "records", "dones", "commits", "truncates",
                 "call", "landing", "handing")

    def __init__(self, topic_log, clock) -> None:
        self.topic_log = topic_log
        self.clock = clock
        self.active = False
        self.records: list[tuple] = []
        self.dones: list[Callable] = []
        self.commits: dict[tuple, int] = {}
        self.truncates: dict[tuple, int] = {}
        self.call = None
        self.landing = 0
        self.handing = 0

    def append(self, record: tuple, done: Callable) -> None:
        """Write ``record`` (an encoded one, for
        :meth:`~tbmq.interfaces.ITopicLog.append`) with the next flush.

        :param done: called once: ``done(None)`` once the log has it, or
            with a :class:`~twisted.python.failure.Failure` of
            :class:`~tbmq.errors.BusPublishError` (the log failed) or
            :class:`~tbmq.errors.BusClosedError` (its topic was deleted
            first); what it raises is logged."""
        self.records.append(record)
        self.dones.append(done)
        if self.call is None and self.active and not self.handing:
            self.call = self.clock.callLater(0, self.flush)

    def append_run(self, run, done: Callable) -> None:
        """Write ``run`` (a :class:`~tbmq.backends.topic_records.RecordRun`
        of encoded records) with the next flush, with **one** ``done`` for
        all of its records (called as :meth:`append` says: they are one
        item of one ``write`` call, stored or failed together)."""
        if not run.values:
            done(None)
            return
        self.append(run, done)

    def commit(self, group: str, topic: str, partition: int, offset: int) -> None:
        """Write ``group``'s committed ``offset`` with the next flush (the
        last one of a turn wins)."""
        self.commits[(group, topic, partition)] = offset
        if not self.landing:
            self.soon()

    def truncate(self, topic: str, partition: int, before: int) -> None:
        """Drop the logged records below ``before`` with the next flush."""
        self.truncates[(topic, partition)] = before
        if not self.landing:
            self.soon()

    def soon(self) -> None:
        """Flush in the next reactor turn (once)."""
        if self.call is None and self.active:
            self.call = self.clock.callLater(0, self.flush)

    def slice(self, hand: Callable, member) -> None:
        """``hand(member)``: a consumer's slice of handing, whose handlers'
        records (the router's deliveries to APPLICATION clients) schedule
        no flush of their own (no timed call made, then cancelled, per
        batch: :attr:`handing`); then :meth:`flush_records`, even when it
        raised."""
        self.handing += 1
        try:
            hand(member)
        finally:
            self.handing -= 1
            self.flush_records()

    def flush_records(self) -> None:
        """:meth:`flush` now when records wait (with the commits and
        truncations gathered so far), not from the next reactor turn: a
        consumer's slice of handing ends (its handlers' publishes, the
        router's deliveries to APPLICATION clients, wait for this COMMIT;
        the next turn would first read every socket ready).  A flush
        already scheduled is cancelled; what comes later gets its own."""
        if self.records and self.active:
            self.flush()

    def forget(self, topic: str) -> None:
        """``topic`` is deleted: nothing of it is written any more; its
        records not written yet fail their publish
        (:class:`~tbmq.errors.BusClosedError`)."""
        for key in [k for k in self.commits if k[1] == topic]:
            del self.commits[key]
        for key in [k for k in self.truncates if k[0] == topic]:
            del self.truncates[key]
        records, dones = self.records, self.dones
        self.records, self.dones = [], []
        for record, done in zip(records, dones):
            if _topic(record) == topic:
                _tell(done, Failure(BusClosedError(
                    f"{topic}: the topic was deleted before the record was stored")))
            else:
                self.records.append(record)
                self.dones.append(done)

    def flush(self) -> defer.Deferred:
        """Write what waits in one
        :meth:`~tbmq.interfaces.ITopicLog.write`: the records, then the
        commits, then the truncations (one transaction of the SQLite topic
        log, one Deferred).

        :returns: a Deferred firing with None once it is durable (a failure
            is logged, and fails the publishes of its records).
        """
        call, self.call = self.call, None
        if call is not None and call.active():
            call.cancel()
        records, dones, commits, truncates = self.records, self.dones, self.commits, self.truncates
        if not (records or commits or truncates):
            return defer.succeed(None)
        if records:
            self.records, self.dones = [], []
        if commits:
            self.commits = {}
        if truncates:
            self.truncates = {}
        d = self.topic_log.write(records, commits, truncates)
        if records:
            self.landing += 1
            d.addCallbacks(_logged, _not_logged, callbackArgs=(dones,),
                           errbackArgs=(records, dones))
            d.addBoth(self._landed)
        d.addErrback(_write_failed)
        return d

    def _landed(self, result):
        """A flush with records fired: the commits and truncations that
        waited for it are flushed (from the next turn) when no other is
        under way.  :returns: ``result``."""
        self.landing -= 1
        if not self.landing and (self.commits or self.truncates):
            self.soon()
        return result


def _write_failed(failure: Failure) -> None:
    log.failure("in-process bus: topic log write failed", failure)


def _tell(done: Callable, outcome) -> None:
    try:
        done(outcome)
    except Exception:
        log.failure("in-process bus: the outcome of a publish could not be reported")


def _topic(record) -> str:
    """The topic of an item of :attr:`LogWrites.records`."""
    return record.topic if type(record) is RecordRun else record[0]


def _logged(_result, dones: list) -> None:
    """The append of ``dones``' records is committed: tell each."""
    for done in dones:
        _tell(done, None)


def _not_logged(failure: Failure, records: list, dones: list) -> Failure:
    """The append of ``records`` failed: nothing of it is stored, every one
    of their publishes fails.  :returns: ``failure`` (logged)."""
    message = failure.getErrorMessage()
    for record, done in zip(records, dones):
        _tell(done, Failure(BusPublishError(
            f"{_topic(record)}: the topic log did not store the record: {message}")))
    return failure
