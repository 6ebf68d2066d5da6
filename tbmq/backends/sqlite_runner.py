"""One SQLite database file used from one dedicated thread.

:class:`SQLiteRunner` owns one :mod:`sqlite3` connection to one file and is
shared by every store kept in that file (:mod:`tbmq.backends.sqlite`,
:mod:`tbmq.backends.sqlite_credentials`, :mod:`tbmq.backends.sqlite_topic_log`).
Every call of a store -- reads included -- becomes an *operation* appended
to a queue kept in the reactor thread; while the database thread is idle,
the whole queue is handed to it as one *batch* and run in one transaction,
one savepoint per operation, so a failing operation is rolled back alone.
Only one batch is in flight at a time, so operations run in the order they
were accepted (the per-client order of :mod:`tbmq.interfaces`), a read sees
every write accepted before it, and each operation's Deferred fires, in the
reactor thread, only after the COMMIT that made it durable.  Calls accepted
while a batch runs share the next transaction: the busier the file, the
larger the batches.  The database thread takes that next batch itself as
soon as a COMMIT ends (under :attr:`SQLiteRunner.lock`), while the reactor
fires the Deferreds of the batch just committed, so a batch never waits
for the reactor's work on the one before.  A batch of reads only runs in a deferred transaction
(a read snapshot that never waits for another process's writer); a batch
with a write starts with ``BEGIN IMMEDIATE`` and waits up to the busy
timeout for another process's writer (``tbmq credentials`` on the
credential file).

Stores are :class:`~tbmq.backends.sqlite_view.RunnerView` of the runner of
their file.  Runners may share one :class:`DatabaseThread`: :class:`SQLiteDatabases`
hands out one runner per file, all on one thread (the embedded default's
message store and credential store).

Each store brings the :class:`Schema` of its tables.  The version of every
schema in a file is kept in its table ``tbmq_schema`` (``PRAGMA
user_version`` holds the highest, so an older tbmq that knows only the
pragma refuses a file it cannot read); opening a file of an older version
runs the schema's migrations, opening a file of a newer one fails.  Nothing
here blocks the reactor.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from queue import SimpleQueue
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq.backends.sqlite_bulk import bind_as_is
from tbmq.errors import BackendError
from tbmq.log import OBSERVER as LOG_OBSERVER

if TYPE_CHECKING:
    from tbmq.backends.sqlite_view import RunnerView

__all__ = [
    "SYNCHRONOUS_MODES",
    "DatabaseThread",
    "JobThread",
    "Operation",
    "SQLiteDatabases",
    "SQLiteRunner",
    "Schema",
    "fire_batch",
]

log = Logger(observer=LOG_OBSERVER)

#: The accepted values of ``PRAGMA synchronous``.  ``FULL`` (the default)
#: syncs the WAL at every commit, so an acknowledged write survives a power
#: loss; ``NORMAL`` survives a crash of the process only.
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")

#: An operation run in the database thread: ``op(connection) -> result``.
#: It must not commit or roll back.  An operation object with a ``seal()``
#: method is told when its batch is handed to the thread (it then takes no
#: more merged writes, :class:`~tbmq.backends.sqlite_view.MergedWrites`).
Operation = Callable[[sqlite3.Connection], Any]

#: The highest ``PRAGMA user_version`` of files written before the
#: ``tbmq_schema`` table: each of their schemas is at that version.
_LEGACY_VERSION = 1

# Life-cycle states of SQLiteRunner.
_STOPPED, _STARTING, _RUNNING, _STOPPING = "stopped", "starting", "running", "stopping"


@dataclass(frozen=True)
class Schema:
    """The tables of one store kind, and how to bring a file up to date.

    :ivar name: the key in ``tbmq_schema`` (``"embedded"``, ``"credentials"``).
    :ivar version: the version this tbmq writes, >= 1.
    :ivar marker: a table version 1 has: a file without ``tbmq_schema``
        (written before it existed) whose ``user_version`` is 1 holds this
        schema at version 1 when the table exists.
    :ivar create: ``;``-separated statements creating the schema at
        ``version`` in a file that has none of it.
    :ivar migrations: ``{n: step}`` bringing version ``n`` to ``n + 1``,
        for every ``n`` from 1 to ``version - 1``; a step is
        ``;``-separated statements, or ``step(connection) -> None`` run in
        the database thread inside the transaction that opens the file (it
        must not commit or roll back; what it raises fails the open and
        leaves the file as it was).
    """

    name: str
    version: int
    marker: str
    create: str
    migrations: dict = field(default_factory=dict)


def _statements(script: str) -> list[str]:
    """:returns: the statements of a ``;``-separated script without one."""
    return [s for s in (part.strip() for part in script.split(";")) if s]


def apply_schemas(conn: sqlite3.Connection, path: str, schemas: list[Schema]) -> None:
    """In the database thread, inside a write transaction: create or migrate
    ``schemas`` and record their versions.

    :raises BackendError: when the file holds a newer version of one of
        them (written by a newer tbmq).
    """
    legacy = conn.execute("PRAGMA user_version").fetchone()[0]
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "tbmq_schema" in tables:
        recorded = dict(conn.execute("SELECT name, version FROM tbmq_schema"))
        versions = recorded
    else:
        newest = max((s.version for s in schemas), default=_LEGACY_VERSION)
        if legacy > max(newest, _LEGACY_VERSION):
            raise BackendError(
                f"{path}: schema version {legacy} is newer than this tbmq's ({newest})"
            )
        recorded = {}
        versions = {s.name: legacy for s in schemas if legacy and s.marker in tables}
        conn.execute(
            "CREATE TABLE tbmq_schema (name TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
    for schema in schemas:
        stored = versions.get(schema.name, 0)
        if stored > schema.version:
            raise BackendError(
                f"{path}: {schema.name} schema version {stored} is newer than "
                f"this tbmq's ({schema.version})"
            )
        if stored == 0:
            scripts = [schema.create]
        else:
            scripts = [schema.migrations[n] for n in range(stored, schema.version)]
        for script in scripts:
            if callable(script):
                script(conn)
                continue
            for statement in _statements(script):
                conn.execute(statement)
        if recorded.get(schema.name) != schema.version:
            conn.execute(
                "INSERT OR REPLACE INTO tbmq_schema (name, version) VALUES (?, ?)",
                (schema.name, schema.version),
            )
    (highest,) = conn.execute("SELECT max(version) FROM tbmq_schema").fetchone()
    if highest is not None and highest != legacy:
        conn.execute(f"PRAGMA user_version={int(highest)}")


def fire_batch(outcome: list[tuple[bool, Any]] | Failure, waiters: list[defer.Deferred]) -> None:
    """In the reactor thread: fire the Deferreds of a batch of operations
    run in the database thread.

    :param outcome: per operation ``(True, result)`` or ``(False,
        Failure)``, or one Failure when the whole batch failed (logged and
        given to every waiter).
    :param waiters: the operations' Deferreds, in the same order.
    """
    if isinstance(outcome, Failure):
        log.failure("SQLite transaction failed", outcome)
        outcome = [(False, outcome)] * len(waiters)
    for (ok, value), waiter in zip(outcome, waiters):
        if ok:
            waiter.callback(value)
        else:
            waiter.errback(value)


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

    def release(self) -> None:
        """A runner stopped: stop our pool when it was the last.  Its worker
        is idle (the runner's last job has reported back), so the join
        returns at once."""
        self._users = max(0, self._users - 1)
        if self._users == 0 and self.owned and self.pool is not None:
            pool, self.pool = self.pool, None
            pool.stop()

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

    def _posted(self, ok: bool, result: Any) -> None:
        """In the database thread: the end of a :meth:`post` job."""
        if not ok:
            self.reactor.callFromThread(log.failure, "SQLite database job failed", result)


class SQLiteRunner:
    """The queue, thread, connection and life cycle of one database file.

    :param path: the database file (its directory is created if missing), or
        ``":memory:"``.
    :param reactor: the reactor that receives results (used when
        ``thread`` is None); the global one when None.
    :param threadpool: the pool of a private :class:`DatabaseThread` (used
        when ``thread`` is None; see there).
    :param synchronous: ``PRAGMA synchronous``, one of
        :data:`SYNCHRONOUS_MODES` (any case); ``FULL`` by default.
    :param busy_timeout: seconds a write waits for another process's write
        transaction before failing with ``sqlite3.OperationalError``
        ("database is locked").
    :param private: create the file readable by its owner only (it holds
        password hashes).
    :param thread: the :class:`DatabaseThread` shared with other runners; a
        private one when None.
    :raises ValueError: for an unknown ``synchronous`` mode.

    The runner is running between a successful :meth:`start` and
    :meth:`stop`; calls made at other times fail with
    :class:`~tbmq.errors.BackendError`.  Calls made while it is starting
    wait for the file to open.  Stores use it through
    :class:`~tbmq.backends.sqlite_view.RunnerView`, whose ``start``/``stop``
    are counted: the runner stops when its last
    started view stops.
    """

    def __init__(
        self,
        path: str,
        reactor: Any = None,
        threadpool: Any = None,
        synchronous: str = "FULL",
        busy_timeout: float = 5.0,
        private: bool = False,
        thread: DatabaseThread | None = None,
    ) -> None:
        mode = synchronous.upper()
        if mode not in SYNCHRONOUS_MODES:
            raise ValueError(
                f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, "
                f"not {synchronous!r}"
            )
        self.path = path
        self.synchronous = mode
        self.busy_timeout = float(busy_timeout)
        self.private = private
        self.thread = thread if thread is not None else DatabaseThread(reactor, threadpool)
        self._conn: sqlite3.Connection | None = None
        self._state = _STOPPED
        #: guards the queue and :attr:`_busy`, which the database thread
        #: reads and changes too (it takes the next batch itself), and the
        #: merging of writes into a queued operation (RunnerView._merge):
        #: an operation is sealed under it
        self.lock = threading.Lock()
        self._busy = False  # a batch (or the open/close job) is on the database thread
        self._pending: list[tuple[Operation, bool, defer.Deferred]] = []
        self._start_waiters: list[defer.Deferred] = []
        self._stop_waiters: list[defer.Deferred] = []
        self._shutdown_trigger: Any = None
        self._users = 0  # started views
        self._views: list[RunnerView] = []
        self._schemas: dict[str, Schema] = {}

    # -- users --------------------------------------------------------------

    def attach(self, view: RunnerView, schema: Schema | None) -> None:
        """Register a store on this file and the schema its tables need.
        A schema attached while the file is open is applied by an operation
        queued now, before the store's first call.

        :raises ValueError: when another version of that schema is attached.
        """
        self._views.append(view)
        if schema is None:
            return
        known = self._schemas.get(schema.name)
        if known is not None:
            if known != schema:
                raise ValueError(f"{self.path}: two versions of the {schema.name} schema")
            return
        self._schemas[schema.name] = schema
        if self._state in (_STARTING, _RUNNING):
            self.submit(lambda conn: apply_schemas(conn, self.path, [schema]))

    def acquire(self) -> defer.Deferred:
        """A view starts: count it and start the runner."""
        self._users += 1
        return self.start()

    def release(self) -> defer.Deferred:
        """A view stops: stop the runner when it was the last one."""
        self._users = max(0, self._users - 1)
        if self._users == 0:
            return self.stop()
        return defer.succeed(None)

    # -- life cycle ---------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._state == _RUNNING

    @property
    def reactor(self) -> Any:
        """The reactor that receives this runner's results (its
        :class:`DatabaseThread`'s)."""
        return self.thread.reactor

    def start(self) -> defer.Deferred:
        """Open the file and create or migrate the attached schemas
        (:meth:`tbmq.interfaces.IBackend.start`).  Idempotent: a second call
        while starting or running returns a Deferred for the same start.

        :returns: a Deferred firing with None when the file is usable, or
            failing with the error that prevented opening it (a
            :class:`~tbmq.errors.BackendError` for a file of a newer
            schema, a :class:`sqlite3.Error` or :class:`OSError` otherwise).
        """
        if self._state == _RUNNING:
            return defer.succeed(None)
        if self._state == _STOPPING:
            return defer.fail(BackendError(f"SQLite database {self.path} is stopping"))
        waiter: defer.Deferred = defer.Deferred()
        self._start_waiters.append(waiter)
        if self._state == _STARTING:
            return waiter
        self._state = _STARTING
        self.thread.acquire()
        if self.thread.owned:
            # "before" shutdown: the reactor waits for the returned Deferred
            # and still runs, so pending writes are committed.
            self._shutdown_trigger = self.thread.reactor.addSystemEventTrigger(
                "before", "shutdown", self._on_shutdown
            )
        self._busy = True
        d = self.thread.run(self._open, list(self._schemas.values()))
        d.addBoth(self._opened)
        return waiter

    def stop(self) -> defer.Deferred:
        """Write what was accepted, then close
        (:meth:`tbmq.interfaces.IBackend.stop`).  Calls made after this fail.

        :returns: a Deferred firing with None when every call accepted before
            is committed and the connection is closed.
        """
        if self._state == _STOPPED:
            return defer.succeed(None)
        waiter: defer.Deferred = defer.Deferred()
        self._stop_waiters.append(waiter)
        if self._state != _STOPPING:
            self._state = _STOPPING
            self._flush()
        return waiter

    #: seconds the reactor's shutdown waits for the stores on this file to
    #: stop it themselves (the node stops them in order, after closing its
    #: connections, whose last session records still need the file)
    SHUTDOWN_GRACE = 10.0

    def _on_shutdown(self) -> defer.Deferred:
        """The reactor shuts down: once the stores using this file have
        stopped it (at most :attr:`SHUTDOWN_GRACE` seconds), flush and close
        (the trigger is spent)."""
        self._shutdown_trigger = None
        if self._users == 0 or self._state != _RUNNING:
            return self.stop()
        done: defer.Deferred = defer.Deferred()
        self._stop_waiters.append(done)
        reactor = self.thread.reactor
        timer = reactor.callLater(self.SHUTDOWN_GRACE, self._shutdown_now)

        def stopped(result):
            if timer.active():
                timer.cancel()
            return result

        return done.addBoth(stopped)

    def _shutdown_now(self) -> None:
        """The grace after the shutdown began is over: stop anyway."""
        if self._state == _RUNNING:
            log.warn("{path}: its stores did not stop within {grace} s of the shutdown; "
                     "closing it", path=self.path, grace=self.SHUTDOWN_GRACE)
            self.stop()

    def _open(self, schemas: list[Schema]) -> None:
        """In the database thread: connect, set the pragmas, create or
        migrate the schemas."""
        if self.path != ":memory:":
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            if self.private and not os.path.exists(self.path):
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        bind_as_is()  # bytes and None bound without the adapter protocol's misses
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False,
            timeout=self.busy_timeout,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                apply_schemas(conn, self.path, schemas)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _opened(self, result: None | Failure) -> None:
        """In the reactor thread: the open job finished."""
        self._busy = False
        waiters, self._start_waiters = self._start_waiters, []
        if isinstance(result, Failure):
            log.failure("cannot open SQLite database {path}", result, path=self.path)
            pending, self._pending = self._pending, []
            stop_waiters, self._stop_waiters = self._stop_waiters, []
            self._finish_stop()
            for operation, _, d in pending:
                _seal(operation)
                d.errback(result)
            for d in waiters:
                d.errback(result)
            for d in stop_waiters:
                d.callback(None)
            return
        if self._state == _STARTING:
            self._state = _RUNNING
        for d in waiters:
            d.callback(None)
        self._flush()

    def _close(self) -> None:
        """In the database thread: close the connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _closed(self, result: None | Failure) -> None:
        """In the reactor thread: the close job finished."""
        self._busy = False
        if isinstance(result, Failure):
            log.failure("closing SQLite database {path}", result, path=self.path)
        self._finish_stop()
        waiters, self._stop_waiters = self._stop_waiters, []
        for d in waiters:
            d.callback(None)

    def _finish_stop(self) -> None:
        """Back to the stopped state; no view counts as started any more;
        release the thread."""
        self._state = _STOPPED
        self._users = 0
        for view in self._views:
            view._started = False
        if self._shutdown_trigger is not None:
            self.thread.reactor.removeSystemEventTrigger(self._shutdown_trigger)
            self._shutdown_trigger = None
        self.thread.release()

    # -- the queue ----------------------------------------------------------

    def refused(self) -> defer.Deferred | None:
        """:returns: None while the runner takes operations (starting or
        running), else a failed Deferred (:class:`BackendError`)."""
        if self._state in (_STARTING, _RUNNING):
            return None
        return defer.fail(BackendError(f"SQLite database {self.path} is {self._state}"))

    def submit(self, operation: Operation, write: bool = True) -> defer.Deferred:
        """Queue ``operation`` to run in the database thread, in order, inside
        the next transaction.

        :param operation: ``operation(connection) -> result``, run in the
            database thread; it must not commit or roll back.
        :param write: False when it only reads (a batch of reads only runs
            in a deferred transaction, which never waits for a writer).
        :returns: a Deferred firing in the reactor thread with the
            operation's result after the transaction is committed, or failing
            with its exception (the operation alone is rolled back), with
            the transaction's error (``sqlite3.OperationalError`` "database
            is locked" past the busy timeout, I/O), or with
            :class:`~tbmq.errors.BackendError` when the runner is not
            running.
        """
        refused = self.refused()
        if refused is not None:
            return refused
        d: defer.Deferred = defer.Deferred()
        with self.lock:
            self._pending.append((operation, write, d))
            if self._busy:
                return d
        self._flush()
        return d

    def enqueue_locked(self, operation: Operation, write: bool = True) -> defer.Deferred:
        """:meth:`submit` for a caller that holds :attr:`lock` and checked
        :meth:`refused`: queue ``operation``; the caller calls
        :meth:`_flush` (:meth:`kick`) once it let go of the lock.

        :returns: as :meth:`submit`."""
        d: defer.Deferred = defer.Deferred()
        self._pending.append((operation, write, d))
        return d

    def kick(self) -> None:
        """Hand the queue to the database thread if it is idle (after
        :meth:`enqueue_locked`)."""
        self._flush()

    def _take(self) -> tuple[list, bool, list]:
        """With :attr:`lock` held: the queue as the next batch (its merging
        operations sealed), the thread marked busy.

        :returns: ``(operations, write, waiters)``."""
        batch, self._pending = self._pending, []
        for operation, _, _ in batch:
            _seal(operation)
        self._busy = True
        return ([op for op, _, _ in batch], any(write for _, write, _ in batch),
                [waiter for _, _, waiter in batch])

    def _flush(self) -> None:
        """Hand the queue to the database thread if it is idle; when
        stopping and nothing is left, close."""
        with self.lock:
            if self._busy or self._state == _STARTING:
                return
            if self._pending:
                batch = self._take()
            elif self._state == _STOPPING:
                self._busy = True
                batch = None
            else:
                return
        if batch is None:
            d = self.thread.run(self._close)
            d.addBoth(self._closed)
        else:
            self._hand(batch)

    def _hand(self, batch: tuple[list, bool, list]) -> None:
        """Queue ``batch`` (:meth:`_take`) on the database thread; it runs
        after the jobs queued there before it (another runner's)."""
        self.thread.post(self._run_chained, *batch)

    def _run_chained(self, operations: list[Operation], write: bool, waiters: list) -> None:
        """In the database thread: run a batch (:meth:`_run_batch`), tell the
        reactor its outcome, and go on with what the reactor queued
        meanwhile **without waiting for the reactor**: the next COMMIT
        starts as soon as this one ends, while the reactor fires this
        batch's Deferreds (acknowledges its messages).  The next batch is
        queued as a new job of the database thread, so another runner's
        jobs on it take their turn in between."""
        try:
            outcome: list[tuple[bool, Any]] | Failure = self._run_batch(operations, write)
        except BaseException:
            outcome = Failure()
        with self.lock:
            following = self._take() if self._pending and self._state != _STARTING else None
            if following is None:
                self._busy = False
        self.thread.reactor.callFromThread(self._batch_done, outcome, waiters)
        if following is not None:
            self._hand(following)

    def _run_batch(self, operations: list[Operation], write: bool) -> list[tuple[bool, Any]]:
        """In the database thread: run ``operations`` in one transaction
        (``BEGIN IMMEDIATE`` when ``write``), one savepoint each when there
        are several.

        :returns: per operation, ``(True, result)`` or ``(False, Failure)``.
        :raises Exception: when the transaction itself fails (all rolled back).
        """
        conn = self._conn
        if conn is None:
            raise BackendError(f"SQLite database {self.path} is closed")
        results: list[tuple[bool, Any]] = []
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        if len(operations) == 1:
            # alone in its transaction (the usual batch under load: one
            # merged write), an operation needs no savepoint: two statements,
            # and two waits for the GIL, fewer
            return self._run_alone(conn, operations[0])
        try:
            for operation in operations:
                conn.execute("SAVEPOINT op")
                try:
                    value = operation(conn)
                except Exception:
                    failure = Failure()
                    failure.cleanFailure()
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    results.append((False, failure))
                else:
                    conn.execute("RELEASE op")
                    results.append((True, value))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return results

    @staticmethod
    def _run_alone(conn: sqlite3.Connection, operation: Operation) -> list[tuple[bool, Any]]:
        """In the database thread, in the transaction just begun: run the
        batch's only ``operation``; its failure rolls the transaction back.

        :returns: ``[(True, result)]`` or ``[(False, Failure)]``.
        :raises Exception: when the COMMIT fails (rolled back)."""
        try:
            value = operation(conn)
        except Exception:
            failure = Failure()
            failure.cleanFailure()
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return [(False, failure)]
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return [(True, value)]

    def _batch_done(self, outcome: list[tuple[bool, Any]] | Failure, waiters: list) -> None:
        """In the reactor thread: fire the batch's Deferreds; then, when the
        database thread went idle, send what is queued (calls made by the
        callbacks join the next batch) or close when stopping."""
        fire_batch(outcome, waiters)
        self._flush()


def _seal(operation: Any) -> None:
    """Tell a merging operation that it takes no more writes."""
    seal = getattr(operation, "seal", None)
    if seal is not None:
        seal()


class SQLiteDatabases:
    """One :class:`SQLiteRunner` per database file, all on one
    :class:`DatabaseThread`: the embedded default's stores share a thread,
    and a connection when they share a file.

    :param reactor: see :class:`DatabaseThread`.
    :param threadpool: see :class:`DatabaseThread`.
    :param synchronous: the default ``PRAGMA synchronous`` of the runners.
    """

    def __init__(self, reactor: Any = None, threadpool: Any = None,
                 synchronous: str = "FULL") -> None:
        self.thread = DatabaseThread(reactor, threadpool)
        self.synchronous = synchronous
        self._runners: dict[str, SQLiteRunner] = {}

    def runner(self, path: str, *, synchronous: str | None = None,
               busy_timeout: float | None = None, private: bool = False) -> SQLiteRunner:
        """:returns: the runner of ``path`` (the same one for every spelling
            of the same file), made on first use.
        :param synchronous: ``PRAGMA synchronous``; the registry's default
            when None.
        :param busy_timeout: seconds; 5 when None.
        :param private: the file is created readable by its owner only
            (asked by any user, it holds for the file).
        :raises ValueError: when the file's runner exists with another
            ``synchronous`` or ``busy_timeout`` than one given here.
        """
        key = path if path == ":memory:" else os.path.realpath(path)
        runner = self._runners.get(key)
        if runner is None:
            runner = self._runners[key] = SQLiteRunner(
                path,
                synchronous=synchronous or self.synchronous,
                busy_timeout=5.0 if busy_timeout is None else busy_timeout,
                private=private,
                thread=self.thread,
            )
            return runner
        if synchronous is not None and synchronous.upper() != runner.synchronous:
            raise ValueError(f"{path}: opened with synchronous={runner.synchronous}")
        if busy_timeout is not None and float(busy_timeout) != runner.busy_timeout:
            raise ValueError(f"{path}: opened with busy_timeout={runner.busy_timeout}")
        runner.private = runner.private or private
        return runner
