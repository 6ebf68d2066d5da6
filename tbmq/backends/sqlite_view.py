"""The store's side of a :class:`~tbmq.backends.sqlite_runner.SQLiteRunner`:
:class:`RunnerView`, the base of every SQLite store (counted start and
stop, operations submitted in order), which merges the writes accepted
while the database thread is busy into one
:class:`~tbmq.backends.merged_writes.MergedWrites` operation of the next
transaction (the device store's
:class:`~tbmq.backends.sqlite_deliveries.CoalescedWrites`, the topic log's
:class:`~tbmq.backends.sqlite_topic_log.TopicLogWrites`);
``MergedWrites`` is importable from here too.
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import defer

from tbmq.backends.merged_writes import MergedWrites
from tbmq.backends.sqlite_runner import Operation, Schema, SQLiteRunner

__all__ = ["MergedWrites", "OnRunner", "RunnerView"]


class OnRunner:
    """What a store on a :class:`SQLiteRunner` (its attribute ``runner``)
    tells of its file."""

    runner: SQLiteRunner

    @property
    def path(self) -> str:
        """The database file."""
        return self.runner.path

    @property
    def synchronous(self) -> str:
        """The file's ``PRAGMA synchronous``."""
        return self.runner.synchronous

    @property
    def running(self) -> bool:
        """True while the runner is running (between its start and stop)."""
        return self.runner.running


class RunnerView(OnRunner):
    """One store's face of a :class:`SQLiteRunner`.  ``start``/``stop`` are
    counted: the runner stops when its last started view stops.

    :param runner: the runner of the store's file.
    :param schema: the :class:`Schema` of the store's tables, or None.
    """

    def __init__(self, runner: SQLiteRunner, schema: Schema | None = None) -> None:
        self.runner = runner
        self._started = False
        self._writes: MergedWrites | None = None
        runner.attach(self, schema)

    def start(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.start` by starting the
        shared runner (idempotent).

        :returns: a Deferred firing with None when the file is usable.
        """
        if self._started:
            return self.runner.start()
        self._started = True
        return self.runner.acquire()

    def stop(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.stop`: the shared runner
        is flushed and closed when this is the last started view.

        :returns: a Deferred firing with None when done.
        """
        if not self._started:
            return defer.succeed(None)
        self._started = False
        return self.runner.release()

    def _submit(self, operation: Operation, write: bool = True) -> defer.Deferred:
        return self.runner.submit(operation, write)

    def _merge(self, new: Callable[[], MergedWrites], merge: Callable[[Any], None],
               tag: Any = None) -> defer.Deferred:
        """Merge a write into the open :class:`MergedWrites` of this store:
        ``merge(writes)`` on it, or on ``new()``, queued now, when there is
        none (it keeps the place of its first write; the database thread
        never sees it half written, as merges run in the reactor thread).

        :param tag: the call's tag for :meth:`MergedWrites.results`.
        :returns: a Deferred firing with the call's result after the
            COMMIT, or failing with :class:`~tbmq.errors.BackendError` when
            the runner is not running.
        """
        runner = self.runner
        refused = runner.refused()
        if refused is not None:
            return refused
        waiter: defer.Deferred = defer.Deferred()
        # under the runner's lock: the database thread seals a queued
        # operation when it takes it, never while a write merges into it
        with runner.lock:
            writes = self._writes
            if writes is None or writes.sealed:
                writes = self._writes = new()
            merge(writes)
            writes.waiters.append((waiter, tag))
            if writes.submitted:
                return waiter
            writes.submitted = True
            queued = runner.enqueue_locked(writes)
        queued.addBoth(writes.done)
        runner.kick()
        return waiter

    def _close_writes(self) -> None:
        """Later writes go to a new :class:`MergedWrites`, queued after the
        operation about to be submitted (a read, which must not see them;
        a write that must follow them)."""
        self._writes = None

    def _call(self, build: Callable[[], Operation], write: bool = True) -> defer.Deferred:
        """Build an operation now (serialising the caller's values) and
        submit it; a serialisation error fails the returned Deferred."""
        try:
            operation = build()
        except Exception:
            return defer.fail()
        return self.runner.submit(operation, write)
