"""The embedded store: one SQLite file used from one dedicated thread.

:class:`SQLiteStore` owns one :mod:`sqlite3` connection.  Every call --
reads included -- becomes an *operation* appended to a queue kept in the
reactor thread; while the database thread is idle, the whole queue is handed
to it as one *batch* and run in one transaction (one savepoint per operation,
so a failing operation is rolled back alone).  Only one batch is in flight at
a time, so operations run in the order they were accepted (the per-client
order of :mod:`tbmq.interfaces`), a read sees every write accepted before it,
and a write's Deferred fires, in the reactor thread, only after the COMMIT
that made it durable.  Calls accepted while a batch runs share the next
transaction: the busier the store, the larger the batches.

Values are serialised in the reactor thread when the call is made, so a
caller may mutate a record as soon as the call returns.  The three views
:attr:`SQLiteStore.sessions`, :attr:`SQLiteStore.retained` and
:attr:`SQLiteStore.deliveries` each provide one interface and share the
connection.
"""

from __future__ import annotations

import json
import os
import sqlite3
from typing import Any, Callable, Iterable

from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool
from zope.interface import implementer

from tbmq.errors import BackendError
from tbmq.interfaces import IDeviceMessageStore, IRetainedStore, ISessionStore
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import (
    ClientType,
    DeliveryState,
    Message,
    SessionRecord,
    StoredDelivery,
    SubscriptionOptions,
)
from tbmq.mqtt.properties import pack_properties, unpack_properties

__all__ = ["SQLiteStore", "SCHEMA_VERSION", "SYNCHRONOUS_MODES"]

log = Logger(observer=LOG_OBSERVER)

#: The schema version written to ``PRAGMA user_version``.
SCHEMA_VERSION = 1

#: The accepted values of ``PRAGMA synchronous``.  ``FULL`` (the default)
#: syncs the WAL at every commit, so an acknowledged write survives a power
#: loss; ``NORMAL`` survives a crash of the process only.
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    client_id TEXT PRIMARY KEY,
    protocol_level INTEGER NOT NULL,
    session_expiry_interval INTEGER NOT NULL,
    client_type TEXT NOT NULL,
    disconnected_at REAL
);
CREATE TABLE IF NOT EXISTS subscriptions (
    client_id TEXT NOT NULL,
    topic_filter TEXT NOT NULL,
    qos INTEGER NOT NULL,
    no_local INTEGER NOT NULL,
    retain_as_published INTEGER NOT NULL,
    retain_handling INTEGER NOT NULL,
    subscription_id INTEGER,
    PRIMARY KEY (client_id, topic_filter)
);
CREATE INDEX IF NOT EXISTS subscriptions_client_id
    ON subscriptions (client_id);
CREATE TABLE IF NOT EXISTS retained (
    topic TEXT PRIMARY KEY,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    properties BLOB,
    publisher TEXT NOT NULL,
    received_at REAL NOT NULL,
    expires_at REAL
);
CREATE TABLE IF NOT EXISTS deliveries (
    client_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    message_qos INTEGER NOT NULL,
    message_retain INTEGER NOT NULL,
    properties BLOB,
    publisher TEXT NOT NULL,
    received_at REAL NOT NULL,
    expires_at REAL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    subscription_ids TEXT NOT NULL,
    packet_id INTEGER,
    state INTEGER NOT NULL,
    PRIMARY KEY (client_id, seq)
);
CREATE INDEX IF NOT EXISTS deliveries_client_id_seq
    ON deliveries (client_id, seq);
"""

#: An operation run in the database thread: ``op(connection) -> result``.
Operation = Callable[[sqlite3.Connection], Any]

# Life-cycle states of SQLiteStore.
_STOPPED, _STARTING, _RUNNING, _STOPPING = (
    "stopped",
    "starting",
    "running",
    "stopping",
)


def _pack(properties: dict) -> bytes | None:
    """:returns: the serialised properties, or None when there are none."""
    return pack_properties(properties) if properties else None


def _unpack(data: bytes | None) -> dict:
    """:returns: the properties dict of :func:`_pack`'s output."""
    return unpack_properties(bytes(data)) if data else {}


def _ids_json(subscription_ids: tuple[int, ...]) -> str:
    """:returns: the subscription identifiers as a JSON array."""
    if not subscription_ids:
        return "[]"
    return json.dumps([int(i) for i in subscription_ids])


def _message_columns(message: Message) -> tuple:
    """:returns: the columns topic .. expires_at of a message."""
    return (
        message.topic,
        bytes(message.payload),
        int(message.qos),
        int(bool(message.retain)),
        _pack(message.properties),
        message.publisher,
        float(message.received_at),
        message.expires_at,
    )


def _message_from(row: tuple | sqlite3.Row) -> Message:
    """:param row: the eight columns of :func:`_message_columns`.
    :returns: the :class:`~tbmq.model.Message` they describe."""
    topic, payload, qos, retain, props, publisher, received_at, expires_at = row
    return Message(
        topic=topic,
        payload=bytes(payload),
        qos=qos,
        retain=bool(retain),
        properties=_unpack(props),
        publisher=publisher,
        received_at=received_at,
        expires_at=expires_at,
    )


class SQLiteStore:
    """The embedded store of sessions, retained messages and deliveries.

    :param path: the database file (its directory is created if missing), or
        ``":memory:"``.
    :param reactor: the reactor that receives results; the global one when
        None.
    :param threadpool: the pool running database work.  When None the store
        creates, starts and stops its own
        ``ThreadPool(1, 1, name="tbmq-sqlite")``; a pool given here must run
        one call at a time and is started and stopped by its owner (tests
        pass a synchronous one).
    :param synchronous: ``PRAGMA synchronous``, one of
        :data:`SYNCHRONOUS_MODES`; ``FULL`` by default, so that no
        acknowledged message is lost even on power loss.
    :raises ValueError: for an unknown ``synchronous`` mode.

    The store is running between a successful :meth:`start` and
    :meth:`stop`; calls made at other times fail with
    :class:`~tbmq.errors.BackendError`.  Calls made while it is starting wait
    for the database to open.
    """

    def __init__(
        self,
        path: str,
        reactor: Any = None,
        threadpool: Any = None,
        synchronous: str = "FULL",
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
        self._reactor = reactor
        self._given_pool = threadpool
        self._pool: Any = threadpool
        self._conn: sqlite3.Connection | None = None
        self._state = _STOPPED
        self._busy = False  # a job is in the database thread
        self._pending: list[tuple[Operation, defer.Deferred]] = []
        self._start_waiters: list[defer.Deferred] = []
        self._stop_waiters: list[defer.Deferred] = []
        self._shutdown_trigger: Any = None
        self._users = 0  # started views
        self.sessions = SQLiteSessionStore(self)
        self.retained = SQLiteRetainedStore(self)
        self.deliveries = SQLiteDeviceMessageStore(self)

    # -- life cycle ---------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._state == _RUNNING

    def start(self) -> defer.Deferred:
        """Open the database and create the schema
        (:meth:`tbmq.interfaces.IBackend.start`).  Idempotent: a second call
        while starting or running returns a Deferred for the same start.

        :returns: a Deferred firing with None when the store is usable, or
            failing with the error that prevented opening it.
        """
        if self._state == _RUNNING:
            return defer.succeed(None)
        if self._state == _STOPPING:
            return defer.fail(BackendError("SQLite store is stopping"))
        waiter: defer.Deferred = defer.Deferred()
        self._start_waiters.append(waiter)
        if self._state == _STARTING:
            return waiter
        self._state = _STARTING
        if self._given_pool is None:
            self._pool = ThreadPool(1, 1, name="tbmq-sqlite")
            self._pool.start()
            # "before" shutdown: the reactor waits for the returned Deferred
            # and still runs, so pending writes are committed.
            self._shutdown_trigger = self._reactor.addSystemEventTrigger(
                "before", "shutdown", self._on_shutdown
            )
        self._busy = True
        d = deferToThreadPool(self._reactor, self._pool, self._open)
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

    def _on_shutdown(self) -> defer.Deferred:
        """The reactor shuts down: flush and close (the trigger is spent)."""
        self._shutdown_trigger = None
        return self.stop()

    def _acquire(self) -> defer.Deferred:
        """A view starts: count it and start the store."""
        self._users += 1
        return self.start()

    def _release(self) -> defer.Deferred:
        """A view stops: stop the store when it was the last one."""
        self._users = max(0, self._users - 1)
        if self._users == 0:
            return self.stop()
        return defer.succeed(None)

    def _open(self) -> None:
        """In the database thread: connect, set the pragmas, create the
        schema."""
        if self.path != ":memory:":
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("PRAGMA busy_timeout=5000")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise BackendError(
                    f"{self.path}: schema version {version} is newer than "
                    f"this tbmq's ({SCHEMA_VERSION})"
                )
            conn.executescript(
                "BEGIN;"
                + _SCHEMA
                + f"PRAGMA user_version={SCHEMA_VERSION};COMMIT;"
            )
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _opened(self, result: None | Failure) -> None:
        """In the reactor thread: the open job finished."""
        self._busy = False
        waiters, self._start_waiters = self._start_waiters, []
        if isinstance(result, Failure):
            log.failure("cannot open SQLite store {path}", result, path=self.path)
            pending, self._pending = self._pending, []
            stop_waiters, self._stop_waiters = self._stop_waiters, []
            self._finish_stop()
            for _, d in pending:
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
            log.failure("closing SQLite store {path}", result, path=self.path)
        self._finish_stop()
        waiters, self._stop_waiters = self._stop_waiters, []
        for d in waiters:
            d.callback(None)

    def _finish_stop(self) -> None:
        """Back to the stopped state; no view counts as started any more;
        release the pool if it is ours."""
        self._state = _STOPPED
        self._users = 0
        for view in (self.sessions, self.retained, self.deliveries):
            view._started = False
        if self._shutdown_trigger is not None:
            self._reactor.removeSystemEventTrigger(self._shutdown_trigger)
            self._shutdown_trigger = None
        if self._given_pool is None and self._pool is not None:
            pool, self._pool = self._pool, None
            # The worker is idle (its last job has reported back), so this
            # join returns at once.
            pool.stop()

    # -- the queue ----------------------------------------------------------

    def refused(self) -> defer.Deferred | None:
        """:returns: None while the store takes operations (starting or
        running), else a failed Deferred (:class:`BackendError`)."""
        if self._state in (_STARTING, _RUNNING):
            return None
        return defer.fail(BackendError(f"SQLite store {self.path} is {self._state}"))

    def submit(self, operation: Operation) -> defer.Deferred:
        """Queue ``operation`` to run in the database thread, in order, inside
        the next transaction.

        :param operation: ``operation(connection) -> result``, run in the
            database thread; it must not commit or roll back.
        :returns: a Deferred firing in the reactor thread with the
            operation's result after the transaction is committed, or failing
            with its exception (the operation alone is rolled back) or with
            the COMMIT's error.
        """
        refused = self.refused()
        if refused is not None:
            return refused
        d: defer.Deferred = defer.Deferred()
        self._pending.append((operation, d))
        self._flush()
        return d

    def _flush(self) -> None:
        """Hand the queue to the database thread if it is idle; when
        stopping and nothing is left, close."""
        if self._busy or self._state == _STARTING:
            return
        if self._pending:
            batch, self._pending = self._pending, []
            for operation, _ in batch:
                if isinstance(operation, CoalescedWrites):
                    operation.sealed = True
            self._busy = True
            d = deferToThreadPool(
                self._reactor, self._pool, self._run_batch, [op for op, _ in batch]
            )
            d.addBoth(self._batch_done, [waiter for _, waiter in batch])
        elif self._state == _STOPPING:
            self._busy = True
            d = deferToThreadPool(self._reactor, self._pool, self._close)
            d.addBoth(self._closed)

    def _run_batch(self, operations: list[Operation]) -> list[tuple[bool, Any]]:
        """In the database thread: run ``operations`` in one transaction.

        :returns: per operation, ``(True, result)`` or ``(False, Failure)``.
        :raises Exception: when the transaction itself fails (all rolled back).
        """
        conn = self._conn
        if conn is None:
            raise BackendError(f"SQLite store {self.path} is closed")
        results: list[tuple[bool, Any]] = []
        conn.execute("BEGIN IMMEDIATE")
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

    def _batch_done(
        self, outcome: list[tuple[bool, Any]] | Failure, waiters: list
    ) -> None:
        """In the reactor thread: fire the batch's Deferreds, then send the
        next batch.  Calls made by their callbacks join the next batch."""
        fire_batch(outcome, waiters)
        self._busy = False
        self._flush()


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


class CoalescedWrites:
    """Writes to the ``deliveries`` table accepted while the database thread
    is busy, merged per (client id, seq) into one operation of the next
    batch.

    A delivery queued, sent and acknowledged before its batch runs costs no
    row at all: its INSERT and UPDATE are replaced by one DELETE (of a row
    that may exist from an earlier batch).  The operation keeps its place in
    the queue, the place of its first write; once the store hands its batch
    to the thread it is *sealed*, and later writes open a new one, as do
    writes after a read or a clear (which must see, or follow, them in
    order).

    :ivar puts: (client id, seq) → the 15 columns to INSERT OR REPLACE, as a
        list so that an UPDATE can patch them in place.
    :ivar updates: (client id, seq) → (packet id, state) of rows written by
        an earlier batch.
    :ivar deletes: (client id, seq) of rows to DELETE.
    :ivar waiters: the Deferreds of the merged calls, fired together after
        the COMMIT.
    """

    __slots__ = ("puts", "updates", "deletes", "waiters", "submitted", "sealed")

    def __init__(self) -> None:
        self.puts: dict[tuple[str, int], list] = {}
        self.updates: dict[tuple[str, int], tuple[int | None, int]] = {}
        self.deletes: set[tuple[str, int]] = set()
        self.waiters: list[defer.Deferred] = []
        self.submitted = False
        self.sealed = False

    def put(self, key: tuple[str, int], row: list) -> None:
        self.deletes.discard(key)
        self.updates.pop(key, None)
        self.puts[key] = row

    def update(self, key: tuple[str, int], packet_id: int | None, state: int) -> None:
        row = self.puts.get(key)
        if row is not None:
            row[13] = packet_id
            row[14] = state
        elif key not in self.deletes:
            self.updates[key] = (packet_id, state)

    def delete(self, key: tuple[str, int]) -> None:
        self.puts.pop(key, None)
        self.updates.pop(key, None)
        self.deletes.add(key)

    def __call__(self, conn: sqlite3.Connection) -> None:
        """In the database thread: write the merged rows."""
        if self.deletes:
            conn.executemany(
                "DELETE FROM deliveries WHERE client_id = ? AND seq = ?", self.deletes
            )
        if self.updates:
            conn.executemany(
                "UPDATE deliveries SET packet_id = ?, state = ? "
                "WHERE client_id = ? AND seq = ?",
                [(pid, state, c, s) for (c, s), (pid, state) in self.updates.items()],
            )
        if self.puts:
            conn.executemany(
                "INSERT OR REPLACE INTO deliveries VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                self.puts.values(),
            )

    def done(self, result: Any) -> None:
        """In the reactor thread: fire every merged call's Deferred.  Nothing
        merges into it any more (it is done even when it never ran: the
        store failed to open)."""
        self.sealed = True
        waiters, self.waiters = self.waiters, []
        if isinstance(result, Failure):
            for d in waiters:
                d.errback(result)
        else:
            for d in waiters:
                d.callback(None)


class _View:
    """One interface's face of a :class:`SQLiteStore`; ``start``/``stop``
    are counted, the store stops when its last started view stops."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self._started = False

    def start(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.start` by starting the
        shared store (idempotent).

        :returns: a Deferred firing with None when the store is usable.
        """
        if self._started:
            return self.store.start()
        self._started = True
        return self.store._acquire()

    def stop(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.stop`: the shared store
        is flushed and closed when this is the last started view.

        :returns: a Deferred firing with None when done.
        """
        if not self._started:
            return defer.succeed(None)
        self._started = False
        return self.store._release()

    def _submit(self, operation: Operation) -> defer.Deferred:
        return self.store.submit(operation)

    def _call(self, build: Callable[[], Operation]) -> defer.Deferred:
        """Build an operation now (serialising the caller's values) and
        submit it; a serialisation error fails the returned Deferred."""
        try:
            operation = build()
        except Exception:
            return defer.fail()
        return self.store.submit(operation)


@implementer(ISessionStore)
class SQLiteSessionStore(_View):
    """:class:`~tbmq.interfaces.ISessionStore` on the tables ``sessions`` and
    ``subscriptions`` (one row per topic filter, options as columns)."""

    def load_all(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ISessionStore.load_all`.

        :returns: a Deferred firing with a ``list[SessionRecord]`` ordered
            by client id, subscriptions in the order they were saved.
        """
        return self._submit(_load_sessions)

    def save(self, record: SessionRecord) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ISessionStore.save`.

        :param record: the :class:`~tbmq.model.SessionRecord`; its values are
            read now.
        :returns: a Deferred firing with None when committed.
        """

        def build() -> Operation:
            client_id = record.client_id
            row = (
                client_id,
                int(record.protocol_level),
                int(record.session_expiry_interval),
                ClientType(record.client_type).value,
                record.disconnected_at,
            )
            subscriptions = [
                (
                    client_id,
                    topic_filter,
                    int(o.qos),
                    int(bool(o.no_local)),
                    int(bool(o.retain_as_published)),
                    int(o.retain_handling),
                    o.subscription_id,
                )
                for topic_filter, o in record.subscriptions.items()
            ]

            def save(conn: sqlite3.Connection) -> None:
                conn.execute(
                    "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?)", row
                )
                conn.execute(
                    "DELETE FROM subscriptions WHERE client_id = ?", (client_id,)
                )
                conn.executemany(
                    "INSERT INTO subscriptions VALUES (?, ?, ?, ?, ?, ?, ?)",
                    subscriptions,
                )

            return save

        return self._call(build)

    def delete(self, client_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ISessionStore.delete`.

        :param client_id: the session's client id; unknown ids are ignored.
        :returns: a Deferred firing with None when committed.
        """

        def delete(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM sessions WHERE client_id = ?", (client_id,))
            conn.execute(
                "DELETE FROM subscriptions WHERE client_id = ?", (client_id,)
            )

        return self._submit(delete)


def _load_sessions(conn: sqlite3.Connection) -> list[SessionRecord]:
    """In the database thread: every session with its subscriptions."""
    records: dict[str, SessionRecord] = {}
    for cid, level, expiry, ctype, disconnected_at in conn.execute(
        "SELECT client_id, protocol_level, session_expiry_interval, "
        "client_type, disconnected_at FROM sessions ORDER BY client_id"
    ):
        records[cid] = SessionRecord(
            client_id=cid,
            protocol_level=level,
            session_expiry_interval=expiry,
            client_type=ClientType(ctype),
            disconnected_at=disconnected_at,
        )
    for cid, topic_filter, qos, no_local, rap, rh, sub_id in conn.execute(
        "SELECT client_id, topic_filter, qos, no_local, retain_as_published, "
        "retain_handling, subscription_id FROM subscriptions ORDER BY rowid"
    ):
        record = records.get(cid)
        if record is not None:
            record.subscriptions[topic_filter] = SubscriptionOptions(
                qos=qos,
                no_local=bool(no_local),
                retain_as_published=bool(rap),
                retain_handling=rh,
                subscription_id=sub_id,
            )
    return list(records.values())


@implementer(IRetainedStore)
class SQLiteRetainedStore(_View):
    """:class:`~tbmq.interfaces.IRetainedStore` on the table ``retained``
    (one row per topic name, properties serialised as MQTT v5 properties)."""

    def load_all(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IRetainedStore.load_all`.

        :returns: a Deferred firing with a ``list[Message]`` ordered by topic.
        """

        def load_all(conn: sqlite3.Connection) -> list[Message]:
            rows = conn.execute(
                "SELECT topic, payload, qos, retain, properties, publisher, "
                "received_at, expires_at FROM retained ORDER BY topic"
            ).fetchall()
            return [_message_from(row) for row in rows]

        return self._submit(load_all)

    def put(self, message: Message) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IRetainedStore.put`
        [MQTT-3.3.1-5].

        :param message: the :class:`~tbmq.model.Message`; its values are read
            now.
        :returns: a Deferred firing with None when committed.
        """

        def build() -> Operation:
            row = _message_columns(message)

            def put(conn: sqlite3.Connection) -> None:
                conn.execute(
                    "INSERT OR REPLACE INTO retained VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )

            return put

        return self._call(build)

    def remove(self, topic: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IRetainedStore.remove`
        [MQTT-3.3.1-6].

        :param topic: the topic name; a topic without one is ignored.
        :returns: a Deferred firing with None when committed.
        """

        def remove(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM retained WHERE topic = ?", (topic,))

        return self._submit(remove)


@implementer(IDeviceMessageStore)
class SQLiteDeviceMessageStore(_View):
    """:class:`~tbmq.interfaces.IDeviceMessageStore` on the table
    ``deliveries``, keyed by (client id, seq)."""

    def __init__(self, store: SQLiteStore) -> None:
        super().__init__(store)
        self._writes: CoalescedWrites | None = None

    def _open_writes(self) -> CoalescedWrites:
        """:returns: the unsealed :class:`CoalescedWrites`, a new one when
        there is none (submitted by :meth:`_merged` once filled, so the
        database thread never sees it half written)."""
        writes = self._writes
        if writes is None or writes.sealed:
            writes = self._writes = CoalescedWrites()
        return writes

    def _merged(self, writes: CoalescedWrites) -> defer.Deferred:
        """:returns: a Deferred for the call just merged into ``writes``;
        submit ``writes`` if it is new."""
        waiter: defer.Deferred = defer.Deferred()
        writes.waiters.append(waiter)
        if not writes.submitted:
            writes.submitted = True
            self.store.submit(writes).addBoth(writes.done)
        return waiter

    def _close_writes(self) -> None:
        """Later writes go to a new :class:`CoalescedWrites`, queued after
        the operation about to be submitted."""
        self._writes = None

    def add(
        self, client_id: str, deliveries: Iterable[StoredDelivery]
    ) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.add`; a
        delivery whose ``seq`` is already stored replaces it.

        :param client_id: the persistent session's client id.
        :param deliveries: the deliveries; their values are read now.
        :returns: a Deferred firing with None when committed.
        """
        try:
            rows = [
                [client_id, int(d.seq)]
                + list(_message_columns(d.message))
                + [
                    int(d.qos),
                    int(bool(d.retain)),
                    _ids_json(d.subscription_ids),
                    d.packet_id,
                    int(d.state),
                ]
                for d in deliveries
            ]
        except Exception:
            return defer.fail()
        refused = self.store.refused()
        if refused is not None:
            return refused
        writes = self._open_writes()
        for row in rows:
            writes.put((client_id, row[1]), row)
        return self._merged(writes)

    def update(
        self, client_id: str, seq: int, packet_id: int | None, state: int
    ) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.update`.

        :param client_id: the persistent session's client id.
        :param seq: the delivery's order key; an unknown one is ignored.
        :param packet_id: the packet identifier it was sent with.
        :param state: its new :class:`~tbmq.model.DeliveryState`.
        :returns: a Deferred firing with None when committed.
        """
        refused = self.store.refused()
        if refused is not None:
            return refused
        writes = self._open_writes()
        writes.update((client_id, int(seq)), packet_id, int(state))
        return self._merged(writes)

    def remove(self, client_id: str, seqs: Iterable[int]) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.remove`.

        :param client_id: the persistent session's client id.
        :param seqs: the order keys to drop; unknown ones are ignored.
        :returns: a Deferred firing with None when committed.
        """
        refused = self.store.refused()
        if refused is not None:
            return refused
        writes = self._open_writes()
        for seq in seqs:
            writes.delete((client_id, int(seq)))
        return self._merged(writes)

    def load(self, client_id: str, after_seq: int | None = None,
             limit: int | None = None) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.load`.

        :param client_id: the persistent session's client id.
        :param after_seq: only deliveries with a larger ``seq``.
        :param limit: at most this many.
        :returns: a Deferred firing with the ``list[StoredDelivery]`` in
            ``seq`` order.
        """

        self._close_writes()

        def load(conn: sqlite3.Connection) -> list[StoredDelivery]:
            rows = conn.execute(
                "SELECT seq, topic, payload, message_qos, message_retain, "
                "properties, publisher, received_at, expires_at, qos, retain, "
                "subscription_ids, packet_id, state FROM deliveries "
                "WHERE client_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (client_id, -1 if after_seq is None else after_seq,
                 -1 if limit is None else limit),
            ).fetchall()
            return [
                StoredDelivery(
                    seq=row[0],
                    message=_message_from(row[1:9]),
                    qos=row[9],
                    retain=bool(row[10]),
                    subscription_ids=tuple(json.loads(row[11])),
                    packet_id=row[12],
                    state=DeliveryState(row[13]),
                )
                for row in rows
            ]

        return self._submit(load)

    def clear(self, client_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.clear`.

        :param client_id: the persistent session's client id.
        :returns: a Deferred firing with None when committed.
        """

        self._close_writes()

        def clear(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM deliveries WHERE client_id = ?", (client_id,))

        return self._submit(clear)
