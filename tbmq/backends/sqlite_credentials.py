"""The embedded credential store: TBMQ's ``mqtt_client_credentials`` in SQLite.

:class:`SQLiteCredentialStore` keeps credentials in a file of their own
(``credentials.sqlite3`` in the data directory, :func:`make_sqlite_credential_store`),
apart from the message store, so ``tbmq credentials ...`` can change it
while the broker runs: the file is in WAL mode (readers never wait for the
writer), every write is one ``BEGIN IMMEDIATE`` transaction (writers of both
processes take turns) and a busy timeout makes a writer wait for the other
instead of failing.  The broker sees the CLI's changes through
:meth:`SQLiteCredentialStore.changed_since`: every save stamps the record
with the next value of a counter kept in the same file, every delete leaves
the id and its version in ``deleted_credentials``.

The store owns one :mod:`sqlite3` connection used from one thread
(``ThreadPool(1, 1)``): calls run one at a time, in the order they were
made, each in its own transaction, and each call's Deferred fires in the
reactor thread after its transaction is committed.  Calls made while the
thread is busy are handed to it together, as one job.  Nothing here blocks the reactor.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any, Callable

from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool
from zope.interface import implementer

from tbmq.backends.memory_credentials import (
    CREDENTIALS_COLUMNS as _COLUMNS,
)
from tbmq.backends.memory_credentials import (
    conflict_message,
    encode_value,
    prepare_for_save,
    save_times,
)
from tbmq.backends.memory_credentials import (
    credentials_from_row as _record,
)
from tbmq.backends.sqlite import fire_batch
from tbmq.errors import BackendError, CredentialsError
from tbmq.interfaces import ICredentialStore
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import Credentials, CredentialsType

__all__ = [
    "FILE_NAME",
    "SCHEMA_VERSION",
    "SQLiteCredentialStore",
    "make_sqlite_credential_store",
]

log = Logger(observer=LOG_OBSERVER)

#: The file name of the store in the data directory.
FILE_NAME = "credentials.sqlite3"

#: The schema version written to ``PRAGMA user_version``.
SCHEMA_VERSION = 1

#: The accepted values of ``PRAGMA synchronous``.
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")

# After TBMQ's mqtt_client_credentials (id, created_time, name,
# client_type, credentials_id, credentials_type, credentials_value), plus
# updated_time and the version changed_since reads.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS mqtt_client_credentials (
    id TEXT PRIMARY KEY,
    created_time REAL NOT NULL,
    updated_time REAL NOT NULL,
    name TEXT NOT NULL UNIQUE,
    client_type TEXT NOT NULL,
    credentials_id TEXT NOT NULL,
    credentials_type TEXT NOT NULL,
    credentials_value TEXT NOT NULL,
    version INTEGER NOT NULL,
    UNIQUE (credentials_type, credentials_id)
);
CREATE INDEX IF NOT EXISTS mqtt_client_credentials_version
    ON mqtt_client_credentials (version);
CREATE TABLE IF NOT EXISTS deleted_credentials (
    id TEXT PRIMARY KEY,
    version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS deleted_credentials_version
    ON deleted_credentials (version);
CREATE TABLE IF NOT EXISTS credentials_version (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO credentials_version VALUES (1, 0);
"""


_STOPPED, _STARTING, _RUNNING, _STOPPING = "stopped", "starting", "running", "stopping"


def _next_version(conn: sqlite3.Connection) -> int:
    """In a write transaction: bump and return the change counter."""
    (value,) = conn.execute(
        "UPDATE credentials_version SET value = value + 1 WHERE one = 1 RETURNING value"
    ).fetchone()
    return value


@implementer(ICredentialStore)
class SQLiteCredentialStore:
    """:class:`~tbmq.interfaces.ICredentialStore` in an SQLite file.

    :param path: the database file (its directory is created if missing;
        the file is created readable by its owner only, as it holds password
        hashes), or ``":memory:"``.
    :param reactor: the reactor that receives results; the global one when
        None.
    :param threadpool: the pool running database work.  When None the store
        creates, starts and stops its own ``ThreadPool(1, 1)``; a pool given
        here must run one call at a time and is started and stopped by its
        owner (tests pass a synchronous one).
    :param synchronous: ``PRAGMA synchronous`` (``FULL`` by default: a
        saved credential survives a power loss).
    :param clock: the wall clock for ``created_time``/``updated_time``,
        seconds since the epoch.
    :param busy_timeout: seconds a write waits for another process's write
        (the CLI's, the broker's) before failing with
        :class:`~tbmq.errors.BackendError`.
    :raises ValueError: for an unknown ``synchronous`` mode.

    Calls made before :meth:`start` or after :meth:`stop` fail with
    :class:`~tbmq.errors.BackendError`; calls made while starting wait for
    the file to open.
    """

    def __init__(
        self,
        path: str,
        reactor: Any = None,
        threadpool: Any = None,
        synchronous: str = "FULL",
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 5.0,
    ) -> None:
        mode = synchronous.upper()
        if mode not in SYNCHRONOUS_MODES:
            raise ValueError(
                f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, "
                f"not {synchronous!r}"
            )
        if reactor is None:
            from twisted.internet import reactor  # noqa: PLC0415
        self.path = path
        self.synchronous = mode
        self.busy_timeout = busy_timeout
        self._clock = clock
        self._reactor = reactor
        self._given_pool = threadpool
        self._pool: Any = threadpool
        self._conn: sqlite3.Connection | None = None
        self._state = _STOPPED
        self._start_waiters: list[defer.Deferred] = []
        self._stop_waiters: list[defer.Deferred] = []
        self._shutdown_trigger: Any = None
        self._pending: list[tuple[Callable, bool, defer.Deferred]] = []
        self._jobs = 0  # batches handed to the thread and not done yet

    # -- life cycle ---------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._state == _RUNNING

    def start(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.start`: open the file,
        switch it to WAL, create the schema.  Idempotent.

        :returns: a Deferred firing with None when the store is usable, or
            failing with the error that prevented opening it (a
            :class:`~tbmq.errors.BackendError` for a file of a newer schema).
        """
        if self._state == _RUNNING:
            return defer.succeed(None)
        if self._state == _STOPPING:
            return defer.fail(BackendError(f"credential store {self.path} is stopping"))
        waiter: defer.Deferred = defer.Deferred()
        self._start_waiters.append(waiter)
        if self._state == _STARTING:
            return waiter
        self._state = _STARTING
        if self._given_pool is None:
            self._pool = ThreadPool(1, 1, name="tbmq-sqlite-credentials")
            self._pool.start()
            # "before" shutdown: the reactor waits for stop() and still runs.
            self._shutdown_trigger = self._reactor.addSystemEventTrigger(
                "before", "shutdown", self._on_shutdown
            )
        d = deferToThreadPool(self._reactor, self._pool, self._open)
        d.addBoth(self._opened)
        return waiter

    def _opened(self, result: Any) -> None:
        """In the reactor thread: the open job finished."""
        waiters, self._start_waiters = self._start_waiters, []
        if isinstance(result, Failure):
            log.failure("cannot open credential store {path}", result, path=self.path)
            self._finish_stop()
            for d in waiters:
                d.errback(result)
            return
        if self._state == _STARTING:
            self._state = _RUNNING
        for d in waiters:
            d.callback(None)

    def stop(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.stop`: close the
        connection once the calls made before have run.

        :returns: a Deferred firing with None when closed.
        """
        if self._state == _STOPPED:
            return defer.succeed(None)
        waiter: defer.Deferred = defer.Deferred()
        self._stop_waiters.append(waiter)
        if self._state != _STOPPING:
            self._state = _STOPPING
            if self._pending:
                # the pool runs one job at a time, in order: these run
                # after the job in flight and before the close
                self._hand_pending()
            d = deferToThreadPool(self._reactor, self._pool, self._close)
            d.addBoth(self._closed)
        return waiter

    def _closed(self, result: Any) -> None:
        """In the reactor thread: the close job finished."""
        if isinstance(result, Failure):
            log.failure("closing credential store {path}", result, path=self.path)
        self._finish_stop()
        waiters, self._stop_waiters = self._stop_waiters, []
        for d in waiters:
            d.callback(None)

    def _on_shutdown(self) -> defer.Deferred:
        self._shutdown_trigger = None
        return self.stop()

    def _finish_stop(self) -> None:
        self._state = _STOPPED
        if self._shutdown_trigger is not None:
            self._reactor.removeSystemEventTrigger(self._shutdown_trigger)
            self._shutdown_trigger = None
        if self._given_pool is None and self._pool is not None:
            pool, self._pool = self._pool, None
            pool.stop()

    def _open(self) -> None:
        """In the database thread: connect, set the pragmas, create the
        schema."""
        if self.path != ":memory:":
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            if not os.path.exists(self.path):
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=self.busy_timeout,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise BackendError(
                        f"{self.path}: schema version {version} is newer than "
                        f"this tbmq's ({SCHEMA_VERSION})"
                    )
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- calls --------------------------------------------------------------

    def _submit(self, operation: Callable[[sqlite3.Connection], Any], write: bool) -> defer.Deferred:
        """Run ``operation(connection)`` in the database thread, in one
        transaction (``BEGIN IMMEDIATE`` for a write, a read snapshot
        otherwise).  Calls made while the thread runs earlier ones are handed
        to it together, as one job (a burst of CONNECTs costs one thread
        round trip, not one each), still one transaction per call and in
        the order they were made.

        :returns: a Deferred firing in the reactor thread with its result
            after COMMIT, or failing with its error (rolled back); a lock
            held longer than the busy timeout fails with
            :class:`~tbmq.errors.BackendError`.
        """
        if self._state not in (_STARTING, _RUNNING):
            return defer.fail(BackendError(f"credential store {self.path} is {self._state}"))
        d: defer.Deferred = defer.Deferred()
        self._pending.append((operation, write, d))
        if not self._jobs:
            self._hand_pending()
        return d

    def _hand_pending(self) -> None:
        """Hand every queued call to the database thread as one job."""
        batch, self._pending = self._pending, []
        self._jobs += 1
        d = deferToThreadPool(self._reactor, self._pool, self._run_batch,
                              [(operation, write) for operation, write, _ in batch])
        d.addBoth(self._batch_done, [waiter for _, _, waiter in batch])

    def _run_batch(self, calls: list) -> list[tuple[bool, Any]]:
        """In the database thread: run each write in its own transaction and
        each run of consecutive reads in one read transaction (calls made
        together see one snapshot).

        :returns: per call, ``(True, result)`` or ``(False, Failure)``.
        """
        results: list[tuple[bool, Any]] = []
        i = 0
        while i < len(calls):
            write = calls[i][1]
            j = i + 1
            if not write:
                while j < len(calls) and not calls[j][1]:
                    j += 1
            results.extend(self._transaction([operation for operation, _ in calls[i:j]], write))
            i = j
        return results

    def _batch_done(self, outcome: Any, waiters: list) -> None:
        """In the reactor thread: fire the calls' Deferreds, then hand the
        calls made meanwhile."""
        self._jobs -= 1
        fire_batch(outcome, waiters)
        if self._pending and not self._jobs and self._state in (_STARTING, _RUNNING):
            self._hand_pending()

    def _transaction(self, operations: list, write: bool) -> list[tuple[bool, Any]]:
        """In the database thread: run ``operations`` (one, for a write) in
        one transaction; a failed write is rolled back.

        :returns: per operation, ``(True, result)`` or ``(False, Failure)``
            of :class:`~tbmq.errors.BackendError` (the database: locked
            longer than the busy timeout, I/O), of
            :class:`~tbmq.errors.CredentialsError` (a uniqueness conflict) or
            of the operation's own error.
        """
        conn = self._conn
        try:
            if conn is None:
                raise BackendError(f"credential store {self.path} is not open")
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except Exception as e:
            return [(False, self._failure(e))] * len(operations)
        results: list[tuple[bool, Any]] = []
        for operation in operations:
            try:
                results.append((True, operation(conn)))
            except Exception as e:
                results.append((False, self._failure(e)))
        try:
            if write and not results[0][0]:
                conn.execute("ROLLBACK")
            else:
                conn.execute("COMMIT")
        except Exception as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return [(False, self._failure(e))] * len(operations)
        return results

    def _failure(self, error: Exception) -> Failure:
        """The Failure a call gets for ``error``, the exception being handled
        (SQLite's errors mapped, others with their traceback)."""
        if isinstance(error, sqlite3.OperationalError):
            failure = Failure(BackendError(f"credential store {self.path}: {error}"))
        elif isinstance(error, sqlite3.IntegrityError):
            failure = Failure(CredentialsError(f"credentials conflict: {error}"))
        else:
            failure = Failure()
        failure.cleanFailure()
        return failure

    def find(self, credentials_type: CredentialsType | str, credentials_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.find` (the
        unique index on (credentials_type, credentials_id)).

        :returns: a Deferred firing with the record, or None.
        """
        params = (type_name(credentials_type), credentials_id)

        def find(conn: sqlite3.Connection) -> Credentials | None:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM mqtt_client_credentials "
                "WHERE credentials_type = ? AND credentials_id = ?",
                params,
            ).fetchone()
            return None if row is None else _record(row)

        return self._submit(find, write=False)

    def find_all(self, credentials_type: CredentialsType | str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.find_all`.

        :returns: a Deferred firing with the records of that type, by name.
        """
        param = type_name(credentials_type)

        def find_all(conn: sqlite3.Connection) -> list:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM mqtt_client_credentials "
                "WHERE credentials_type = ? ORDER BY name",
                (param,),
            ).fetchall()
            return [_record(row) for row in rows]

        return self._submit(find_all, write=False)

    def get(self, id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.get`.

        :returns: a Deferred firing with the record, or None.
        """

        def get(conn: sqlite3.Connection) -> Credentials | None:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM mqtt_client_credentials WHERE id = ?", (id,)
            ).fetchone()
            return None if row is None else _record(row)

        return self._submit(get, write=False)

    def list(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.list`.

        :returns: a Deferred firing with every record, ordered by name
            (binary collation: code point order).
        """

        def list_all(conn: sqlite3.Connection) -> list:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM mqtt_client_credentials ORDER BY name"
            ).fetchall()
            return [_record(row) for row in rows]

        return self._submit(list_all, write=False)

    def save(self, credentials: Credentials) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.save`: insert
        or replace by id, in one transaction that also takes the next
        version.

        :param credentials: the record; read now, never modified.
        :returns: a Deferred firing with the saved record (its times set,
            see :func:`~tbmq.backends.memory_credentials.save_times`), or
            failing with :class:`~tbmq.errors.CredentialsError` when it is
            invalid or its name or (type, credentials id) belongs to another
            record.
        """
        try:
            record = prepare_for_save(credentials)
            value_text = encode_value(record.value)
        except CredentialsError:
            return defer.fail()
        now = self._clock()

        def save(conn: sqlite3.Connection) -> Credentials:
            for field, sql, params in (
                ("name", "name = ?", (record.name,)),
                (
                    "id",
                    "credentials_type = ? AND credentials_id = ?",
                    (record.credentials_type.value, record.credentials_id),
                ),
            ):
                row = conn.execute(
                    f"SELECT id FROM mqtt_client_credentials WHERE {sql} AND id != ?",
                    params + (record.id,),
                ).fetchone()
                if row is not None:
                    shown = record.name if field == "name" else (
                        f"{record.credentials_type.value}:{record.credentials_id}"
                    )
                    raise CredentialsError(conflict_message(field, shown, row[0]))
            old = conn.execute(
                "SELECT created_time, updated_time FROM mqtt_client_credentials WHERE id = ?",
                (record.id,),
            ).fetchone()
            record.created_time, record.updated_time = save_times(
                now, *(old if old is not None else (None, None))
            )
            version = _next_version(conn)
            conn.execute(
                "INSERT INTO mqtt_client_credentials (id, created_time, updated_time, "
                "name, client_type, credentials_id, credentials_type, credentials_value, "
                "version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET created_time = excluded.created_time, "
                "updated_time = excluded.updated_time, name = excluded.name, "
                "client_type = excluded.client_type, "
                "credentials_id = excluded.credentials_id, "
                "credentials_type = excluded.credentials_type, "
                "credentials_value = excluded.credentials_value, "
                "version = excluded.version",
                (
                    record.id,
                    record.created_time,
                    record.updated_time,
                    record.name,
                    record.client_type.value,
                    record.credentials_id,
                    record.credentials_type.value,
                    value_text,
                    version,
                ),
            )
            conn.execute("DELETE FROM deleted_credentials WHERE id = ?", (record.id,))
            return record

        return self._submit(save, write=True)

    def delete(self, id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.delete`; the id
        is kept in ``deleted_credentials`` with a new version, for
        :meth:`changed_since`.

        :returns: a Deferred firing with True when a record was removed.
        """

        def delete(conn: sqlite3.Connection) -> bool:
            removed = conn.execute(
                "DELETE FROM mqtt_client_credentials WHERE id = ?", (id,)
            ).rowcount
            if not removed:
                return False
            conn.execute(
                "INSERT OR REPLACE INTO deleted_credentials (id, version) VALUES (?, ?)",
                (id, _next_version(conn)),
            )
            return True

        return self._submit(delete, write=True)

    def changed_since(self, version: int) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.changed_since`,
        from one read snapshot (so a concurrent write is seen whole or not
        at all, and then by the next call).

        :param version: 0, or the ``new_version`` of an earlier answer; a
            version greater than the file's counter (a recreated file)
            counts as 0.
        :returns: a Deferred firing with ``(changed, deleted_ids,
            new_version)``: records saved after ``version`` by name, ids
            deleted after it (sorted), and the counter's value.
        """
        since = int(version)

        def changed_since(conn: sqlite3.Connection) -> tuple:
            (current,) = conn.execute("SELECT value FROM credentials_version").fetchone()
            after = since if since <= current else 0
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM mqtt_client_credentials "
                "WHERE version > ? ORDER BY name",
                (after,),
            ).fetchall()
            deleted = [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM deleted_credentials WHERE version > ? ORDER BY id",
                    (after,),
                )
            ]
            return [_record(row) for row in rows], deleted, current

        return self._submit(changed_since, write=False)


def type_name(credentials_type: Any) -> str:
    """:returns: the stored name of a :class:`~tbmq.model.CredentialsType`
    (or of its value), "" for an unknown one (which finds nothing)."""
    try:
        return CredentialsType(credentials_type).value
    except ValueError:
        return ""


def make_sqlite_credential_store(config: Any, **kwargs: Any) -> SQLiteCredentialStore:
    """Build the embedded credential store of ``config``
    (``auth.credentials: sqlite``): ``<data_dir>/credentials.sqlite3``,
    with the message store's ``storage.sqlite_synchronous``.

    :param config: a :class:`tbmq.config.Config`.
    :param kwargs: passed to :class:`SQLiteCredentialStore` (``reactor``,
        ``threadpool`` ...).
    :returns: the store, not started.
    """
    kwargs.setdefault("synchronous", config.storage.sqlite_synchronous)
    return SQLiteCredentialStore(os.path.join(config.data_dir, FILE_NAME), **kwargs)
