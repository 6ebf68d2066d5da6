"""The threads of the SQLite runners (:mod:`tbmq.backends.sqlite_runner`):
:class:`DatabaseThread`, the one thread that runs the database work of one
or more files, with a second one for their WAL syncs, each a
:class:`JobThread`.  Nothing here blocks the reactor.
"""

from __future__ import annotations

import threading
from queue import SimpleQueue
from typing import Any, Callable

from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq.log import OBSERVER as LOG_OBSERVER

__all__ = ["DatabaseThread", "JobThread"]

log = Logger(observer=LOG_OBSERVER)


class JobThread:
    """One thread that runs jobs in order, with the calls of a
    ``ThreadPool(1, 1)`` that :class:`DatabaseThread` makes (``start``,
    ``stop``, ``callInThreadWithCallback``), from a queue of ``(on_result,
    f, args)``: a job of Twisted's ``ThreadPool`` costs a closure that
    refers to itself (``inContext``), garbage that only the cyclic
    collector frees, which a busy node runs seldom; one per database batch
    (a fraction of a KB each) stayed in the node's memory.

    :param name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: SimpleQueue = SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the jobs queued; wait for the thread to end."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join()

    def callInThreadWithCallback(self, on_result: Callable[[bool, Any], None],  # noqa: N802 (Twisted's name)
                                 f: Callable, *args: Any) -> None:
        """Run ``f(*args)`` in the thread, after the jobs queued before it;
        then ``on_result(True, result)`` or ``on_result(False, Failure)``
        there."""
        self._jobs.put((on_result, f, args))

    def _serve(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            on_result, f, args = job
            del job
            try:
                outcome = (True, f(*args))
            except BaseException:
                outcome = (False, Failure())
            try:
                on_result(*outcome)
            except BaseException:  # as Twisted's pool: logged, the thread goes on
                log.failure("SQLite database job's result handler failed")
            del on_result, f, args, outcome  # nothing of a job outlives it while the thread waits


class DatabaseThread:
    """The one thread that runs the database work of one or more runners.

    :param reactor: the reactor that receives results; the global one when
        None.
    :param threadpool: the pool to use.  When None the thread creates its
        own :class:`JobThread` when its first runner starts and stops it
        when its last one stops; a pool given here must run one call at a
        time and is started and stopped by its owner (tests pass a
        synchronous one).
    :param name: the name of the thread it creates.
    """

    def __init__(self, reactor: Any = None, threadpool: Any = None,
                 name: str = "tbmq-sqlite") -> None:
        if reactor is None:
            from twisted.internet import reactor  # noqa: PLC0415
        self.reactor = reactor
        self.name = name
        self._given = threadpool
        #: The pool while some runner uses it (always the given one), else None.
        self.pool: Any = threadpool
        #: The thread of the WAL syncs (:meth:`post_sync`) while some runner
        #: uses the pool this object owns, else None (a given pool: none).
        self.syncer: JobThread | None = None
        self._users = 0

    @property
    def owned(self) -> bool:
        """True when this object starts and stops the pool itself."""
        return self._given is None

    def acquire(self) -> None:
        """A runner starts: start our pool if it is the first."""
        self._users += 1
        if self.pool is None:
            self.pool = JobThread(self.name)
            self.pool.start()
            self.syncer = JobThread(self.name + "-sync")
            self.syncer.start()

    def release(self) -> None:
        """A runner stopped: stop our pool when it was the last.  Its worker
        is idle (the runner's last job has reported back), so the join
        returns at once."""
        self._users = max(0, self._users - 1)
        if self._users == 0 and self.owned and self.pool is not None:
            pool, self.pool = self.pool, None
            pool.stop()
            syncer, self.syncer = self.syncer, None
            if syncer is not None:
                syncer.stop()

    def run(self, f: Callable, *args: Any) -> defer.Deferred:
        """:returns: a Deferred firing in the reactor thread with
        ``f(*args)`` run in the database thread."""
        return deferToThreadPool(self.reactor, self.pool, f, *args)

    def post(self, f: Callable, *args: Any) -> None:
        """Run ``f(*args)`` in the database thread, after the jobs queued
        before it, with no result: ``f`` reports to the reactor itself (no
        Deferred, and no wake-up of the reactor for the job's end).  What
        ``f`` raises is logged from the reactor thread."""
        self.pool.callInThreadWithCallback(self._posted, f, *args)

    def post_sync(self, f: Callable, *args: Any) -> None:
        """Run ``f(*args)`` in the thread of the WAL syncs, after the jobs
        queued there before it, with no result (as :meth:`post`): beside
        the database thread, so that a runner's next transaction is written
        while the last one's WAL is synced.  With a given pool (no thread
        of its own) it runs now, in the calling thread."""
        syncer = self.syncer
        if syncer is None:
            f(*args)
            return
        syncer.callInThreadWithCallback(self._posted, f, *args)

    def _posted(self, ok: bool, result: Any) -> None:
        """In the database thread: the end of a :meth:`post` job."""
        if not ok:
            self.reactor.callFromThread(log.failure, "SQLite database job failed", result)
