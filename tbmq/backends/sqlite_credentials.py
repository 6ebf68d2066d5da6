"""The embedded credential store: TBMQ's ``mqtt_client_credentials`` in SQLite.

:class:`SQLiteCredentialStore` keeps credentials in a file of their own
(``credentials.sqlite3`` in the data directory, :func:`make_sqlite_credential_store`),
apart from the message store, so ``tbmq credentials ...`` can change it
while the broker runs: the file is in WAL mode (readers never wait for the
writer), every batch of writes is one ``BEGIN IMMEDIATE`` transaction
(writers of both processes take turns) and a busy timeout makes a writer
wait for the other instead of failing.  The broker sees the CLI's changes
through :meth:`SQLiteCredentialStore.changed_since`: every save stamps the
record with the next value of a counter kept in the same file, every delete
leaves the id and its version in ``deleted_credentials``.
:meth:`SQLiteCredentialStore.unchanged_since` answers "nothing changed"
without a database round trip while the file's write-ahead log keeps the
inode, size and modification time it had when the store last read its
version (a commit of either process changes them).

The store runs on a :class:`~tbmq.backends.sqlite_runner.SQLiteRunner`
(its own, or the one of its file shared with other stores, on a shared
thread): calls run in the order they were made, calls made while the thread
is busy share the next transaction (each rolled back alone when it fails),
and each call's Deferred fires in the reactor thread after the COMMIT.
Nothing here blocks the reactor.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any, Callable

from twisted.internet import defer
from twisted.python.failure import Failure
from zope.interface import implementer

from tbmq.backends.credential_rows import CREDENTIALS_COLUMNS as _COLUMNS
from tbmq.backends.credential_rows import credentials_from_row as _record
from tbmq.backends.credential_rows import (
    delete_in_transaction,
    encode_value,
    prepare_for_save,
    save_in_transaction,
    type_name,
)
from tbmq.backends.sqlite_runner import (
    SYNCHRONOUS_MODES,
    Operation,
    Schema,
    SQLiteDatabases,
    SQLiteRunner,
)
from tbmq.backends.sqlite_view import RunnerView
from tbmq.errors import BackendError, CredentialsError
from tbmq.interfaces import ICredentialStore
from tbmq.model import Credentials, CredentialsType

__all__ = [
    "CREDENTIALS_SCHEMA",
    "FILE_NAME",
    "SCHEMA_VERSION",
    "SYNCHRONOUS_MODES",
    "SQLiteCredentialStore",
    "make_sqlite_credential_store",
]

#: The file name of the store in the data directory.
FILE_NAME = "credentials.sqlite3"

#: The version of :data:`CREDENTIALS_SCHEMA`.
SCHEMA_VERSION = 1

# After TBMQ's mqtt_client_credentials (id, created_time, name,
# client_type, credentials_id, credentials_type, credentials_value), plus
# updated_time and the version changed_since reads.
_TABLES_V1 = """
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

#: The tables of the credential store.
CREDENTIALS_SCHEMA = Schema(
    name="credentials",
    version=SCHEMA_VERSION,
    marker="mqtt_client_credentials",
    create=_TABLES_V1,
)


def _next_version(cursor: sqlite3.Cursor) -> int:
    """In a write transaction: bump and return the change counter."""
    cursor.execute("UPDATE credentials_version SET value = value + 1 WHERE one = 1 RETURNING value")
    (value,) = cursor.fetchone()
    return value


@implementer(ICredentialStore)
class SQLiteCredentialStore(RunnerView):
    """:class:`~tbmq.interfaces.ICredentialStore` in an SQLite file.

    :param path: the database file (its directory is created if missing;
        the file is created readable by its owner only, as it holds password
        hashes), or ``":memory:"``; ignored when ``runner`` is given.
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
    :param runner: the :class:`~tbmq.backends.sqlite_runner.SQLiteRunner`
        of the file, shared with other stores (``reactor``, ``threadpool``,
        ``synchronous`` and ``busy_timeout`` are then its own); a new one
        when None.
    :raises ValueError: for an unknown ``synchronous`` mode.
    :raises TypeError: when neither ``path`` nor ``runner`` is given.

    Calls made while the runner is not running (before :meth:`start`,
    after :meth:`stop`) fail with :class:`~tbmq.errors.BackendError`; calls
    made while starting wait for the file to open.
    """

    def __init__(
        self,
        path: str | None = None,
        reactor: Any = None,
        threadpool: Any = None,
        synchronous: str = "FULL",
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 5.0,
        runner: SQLiteRunner | None = None,
    ) -> None:
        if runner is None:
            if path is None:
                raise TypeError("SQLiteCredentialStore needs a path or a runner")
            runner = SQLiteRunner(path, reactor, threadpool, synchronous,
                                  busy_timeout=busy_timeout, private=True)
        else:
            runner.private = True
        super().__init__(runner, CREDENTIALS_SCHEMA)
        self._clock = clock
        #: (version, file signature) of the last changed_since answer whose
        #: signature was settled, or None
        self._known: tuple[int, tuple] | None = None
        self._wal = None if self.path == ":memory:" else self.path + "-wal"
        #: the write-ahead log's :meth:`_stat` taken in this turn of the
        #: reactor, for the other CONNECTs of the turn (a burst is read in
        #: one turn: one ``stat`` for it, not one per CONNECT), or None
        self._turn_stat: tuple | None = None

    @property
    def busy_timeout(self) -> float:
        """Seconds a write waits for another process's write."""
        return self.runner.busy_timeout

    def _run(self, operation: Operation, write: bool) -> defer.Deferred:
        """Run ``operation(connection)`` in the next transaction of the
        runner (:meth:`~tbmq.backends.sqlite_runner.SQLiteRunner.submit`).

        :param write: False when it only reads.
        :returns: a Deferred firing with its result after COMMIT, or failing
            with its own error (rolled back alone), with
            :class:`~tbmq.errors.BackendError` (not running; the database
            locked longer than the busy timeout, I/O) or with
            :class:`~tbmq.errors.CredentialsError` (a uniqueness conflict).
        """
        return self._submit(operation, write).addErrback(self._translate)

    def _translate(self, failure: Failure) -> Failure:
        """SQLite's errors as tbmq's: an operational error (locked, I/O)
        is a :class:`~tbmq.errors.BackendError`, an integrity error a
        :class:`~tbmq.errors.CredentialsError`."""
        error = failure.value
        if isinstance(error, sqlite3.OperationalError):
            return Failure(BackendError(f"credential store {self.path}: {error}"))
        if isinstance(error, sqlite3.IntegrityError):
            return Failure(CredentialsError(f"credentials conflict: {error}"))
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

        return self._run(find, write=False)

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

        return self._run(find_all, write=False)

    def get(self, id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.get`.

        :returns: a Deferred firing with the record, or None.
        """

        def get(conn: sqlite3.Connection) -> Credentials | None:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM mqtt_client_credentials WHERE id = ?", (id,)
            ).fetchone()
            return None if row is None else _record(row)

        return self._run(get, write=False)

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

        return self._run(list_all, write=False)

    def save(self, credentials: Credentials) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.save`: insert
        or replace by id, in one transaction that also takes the next
        version.

        :param credentials: the record; read now, never modified.
        :returns: a Deferred firing with the saved record (its times set,
            see :func:`~tbmq.backends.credential_rows.save_times`), or
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
            return save_in_transaction(conn.cursor(), record, value_text, now, _next_version)

        return self._run(save, write=True)

    def delete(self, id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.delete`; the id
        is kept in ``deleted_credentials`` with a new version, for
        :meth:`changed_since`.

        :returns: a Deferred firing with True when a record was removed.
        """

        def delete(conn: sqlite3.Connection) -> bool:
            return delete_in_transaction(conn.cursor(), id, _next_version)

        return self._run(delete, write=True)

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
        signature = self._signature()

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

        d = self._run(changed_since, write=False)
        if signature is not None:
            d.addCallback(self._remember, signature)
        return d

    #: nanoseconds a file's modification time must be older than its
    #: signature for :meth:`unchanged_since` to trust it (a write in the
    #: same tick of the file system's clock may leave it as it was)
    SETTLE_NS = 1_000_000_000

    def _stat(self) -> tuple | None:
        """The inode, size and modification time (ns) of the file's
        write-ahead log, which every commit of a file in WAL mode writes
        (this store's and the CLI's: the mode is kept in the file), or None
        when it cannot tell every change (an in-memory database, no log).
        One ``stat``, in the calling thread; no database access."""
        try:
            wal = os.stat(self._wal)
        except (OSError, TypeError):
            return None
        return wal.st_ino, wal.st_size, wal.st_mtime_ns

    def _signature(self) -> tuple | None:
        """:meth:`_stat`, or None when a modification time is less than
        :data:`SETTLE_NS` old (a later write might leave it as it is)."""
        if not self.running:
            return None
        stat = self._stat()
        if stat is None or stat[2] > time.time_ns() - self.SETTLE_NS:
            return None
        return stat

    def _remember(self, answer: tuple, signature: tuple) -> tuple:
        self._known = (answer[2], signature)
        return answer

    def unchanged_since(self, version: int) -> bool:
        """Know without a database round trip that nothing changed after
        ``version`` (what :meth:`changed_since` would answer ``([], [],
        version)``).

        :param version: the ``new_version`` of an earlier answer.
        :returns: True when ``version`` is the version of the store's last
            :meth:`changed_since` answer and neither the file nor its
            write-ahead log changed since that question was asked (a save or
            a delete by this store or by another process: the CLI); False
            when it cannot tell (then ask :meth:`changed_since`).
        """
        known = self._known
        if known is None or known[0] != version:
            return False
        stat = self._turn_stat
        if stat is None:  # (the first question of a turn: running asked then)
            if not self.running:
                return False
            stat = self._stat()
            later = getattr(self.runner.reactor, "callLater", None)
            if later is not None and stat is not None:
                self._turn_stat = stat
                later(0, self._turn_over)
        return stat == known[1]

    def _turn_over(self) -> None:
        """The reactor's turn ended: the next question takes a new ``stat``."""
        self._turn_stat = None


def make_sqlite_credential_store(
    config: Any, databases: SQLiteDatabases | None = None, **kwargs: Any
) -> SQLiteCredentialStore:
    """Build the embedded credential store of ``config``
    (``auth.credentials: sqlite``): ``<data_dir>/credentials.sqlite3``,
    with the message store's ``storage.sqlite_synchronous``.

    :param config: a :class:`tbmq.config.Config`.
    :param databases: the :class:`~tbmq.backends.sqlite_runner.SQLiteDatabases`
        of the node: the store then runs on its thread (and on the
        connection of the message store if the file is the same); a store
        of its own thread when None.
    :param kwargs: passed to :class:`SQLiteCredentialStore` (``reactor``,
        ``threadpool``, ``clock`` ...).
    :returns: the store, not started.
    :raises ValueError: when ``databases`` already has the file with
        another ``synchronous`` or ``busy_timeout``.
    """
    path = os.path.join(config.data_dir, FILE_NAME)
    synchronous = kwargs.pop("synchronous", config.storage.sqlite_synchronous)
    if databases is not None:
        kwargs["runner"] = databases.runner(
            path, synchronous=synchronous, private=True,
            busy_timeout=kwargs.pop("busy_timeout", None))
        return SQLiteCredentialStore(path, **kwargs)
    return SQLiteCredentialStore(path, synchronous=synchronous, **kwargs)
