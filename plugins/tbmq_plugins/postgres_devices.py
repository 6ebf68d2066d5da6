"""The PostgreSQL device message store (``storage.device_store: postgres``):
persistent DEVICE sessions' messages in the table ``device_messages``.

One row per stored delivery, keyed by (client id, seq): the ``dlv``
record of the delivery (:func:`tbmq.backends.deliveries.encode_delivery`:
the message, QoS, retain flag and subscription identifiers, in the bus's
documented msgpack encoding) and, beside it, the packet id and state that
change as it is sent.

Writes accepted while a transaction runs are merged per (client id, seq)
into the next one (:class:`~tbmq.backends.deliveries.DeliveryWrites`, as
the embedded SQLite store does): a delivery queued, sent and acknowledged
in the meantime costs one DELETE, and many clients' adds share one
INSERT and one COMMIT.  Each transaction first takes a transaction-scoped
advisory lock per client it writes to (in key order, so two nodes never
deadlock), so that writers on several nodes never interleave within a
client: an add and its trim see every row of the client.  The trim keeps
the ``max_messages_per_client`` highest seqs of each client added to.

Order: the store runs its operations in call order: a write transaction
waits for the operations called before it, a read (``load``, ``count``)
for the writes called before it, and reads next to each other run side by
side on the pool's connections.  Lost connections: see
:mod:`tbmq_plugins.postgres_pool`.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Any, Callable, Iterable

from twisted.internet import defer
from zope.interface import implementer

from tbmq.backends.deliveries import (
    DeliveryWrites,
    RunsAsAdds,
    check_limit,
    check_page,
    decode_delivery,
    encode_delivery,
)
from tbmq.errors import BackendError
from tbmq.interfaces import IDeviceMessageStore
from tbmq.model import StoredDelivery
from tbmq_plugins.postgres_pool import PostgresBackend, lock_writers

__all__ = ["PostgresDeviceMessageStore", "client_lock_key"]

#: The advisory lock taken while the schema is created: ``b"tbmqdevs"`` as
#: a big-endian bigint.
SCHEMA_LOCK_KEY = int.from_bytes(b"tbmqdevs", "big") - (1 << 63)

_SCHEMA = """CREATE TABLE IF NOT EXISTS device_messages (
    client_id text NOT NULL,
    seq bigint NOT NULL,
    delivery bytea NOT NULL,
    packet_id integer,
    state smallint NOT NULL,
    PRIMARY KEY (client_id, seq)
)"""

_COLUMNS = {"client_id", "seq", "delivery", "packet_id", "state"}

_INSERT = (
    "INSERT INTO device_messages (client_id, seq, delivery, packet_id, state) VALUES %s "
    "ON CONFLICT (client_id, seq) DO UPDATE SET delivery = EXCLUDED.delivery, "
    "packet_id = EXCLUDED.packet_id, state = EXCLUDED.state"
)
_UPDATE = (
    "UPDATE device_messages AS m SET packet_id = v.packet_id, state = v.state "
    "FROM (VALUES %s) AS v (client_id, seq, packet_id, state) "
    "WHERE m.client_id = v.client_id AND m.seq = v.seq"
)
_DELETE = (
    "DELETE FROM device_messages AS m USING (VALUES %s) AS v (client_id, seq) "
    "WHERE m.client_id = v.client_id AND m.seq = v.seq"
)
# Per client: the highest seq beyond the limit, and every row up to it.
_TRIM = """DELETE FROM device_messages AS m USING (
    SELECT c.client_id, cut.seq
    FROM unnest(%s::text[]) AS c (client_id)
    CROSS JOIN LATERAL (
        SELECT seq FROM device_messages AS q WHERE q.client_id = c.client_id
        ORDER BY seq DESC OFFSET %s LIMIT 1
    ) AS cut
) AS t
WHERE m.client_id = t.client_id AND m.seq <= t.seq
RETURNING m.client_id"""

_INT64 = (-(1 << 63), 1 << 63)


def client_lock_key(client_id: str) -> int:
    """:returns: the advisory lock key (a signed bigint) of ``client_id``'s
    rows: 64 bits of its BLAKE2b hash."""
    digest = hashlib.blake2b(client_id.encode("utf-8"), digest_size=8,
                             person=b"tbmq-devices").digest()
    return int.from_bytes(digest, "big", signed=True)


def _lock_clients(txn: Any, client_ids: Iterable[str]) -> None:
    """Take the advisory locks of ``client_ids``, in key order."""
    keys = sorted({client_lock_key(c) for c in client_ids})
    if keys:
        txn.execute("SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS k", (keys,))


def _check_client(client_id: Any) -> str:
    if not isinstance(client_id, str):
        raise TypeError(f"client_id must be a str, not {client_id!r}")
    if "\x00" in client_id:
        raise ValueError("client_id must not contain NUL")
    return client_id


def _check_seq(seq: Any) -> int:
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise TypeError(f"seq must be an int, not {seq!r}")
    if not _INT64[0] <= seq < _INT64[1]:
        raise ValueError(f"seq must fit a bigint, not {seq}")
    return seq


class _Writes(DeliveryWrites):
    """The merged writes of one transaction; a put is the row
    ``[client_id, seq, record, packet_id, state]``."""

    __slots__ = ()

    def __call__(self, txn: Any) -> dict[str, int]:
        """In a pool thread: lock the clients, write, trim.

        :returns: client id → deliveries removed by the trim."""
        from psycopg2.extras import execute_values  # noqa: PLC0415

        _lock_clients(txn, {c for c, _ in self.puts} | {c for c, _ in self.updates}
                      | {c for c, _ in self.deletes})
        if self.deletes:
            execute_values(txn, _DELETE, list(self.deletes), template="(%s, %s::bigint)",
                           page_size=1000)
        if self.updates:
            execute_values(txn, _UPDATE,
                           [(c, s, pid, state) for (c, s), (pid, state) in self.updates.items()],
                           template="(%s, %s::bigint, %s::integer, %s::smallint)",
                           page_size=1000)
        if self.puts:
            execute_values(txn, _INSERT, list(self.puts.values()), page_size=1000)
        removed: dict[str, int] = {}
        added = sorted(self.added_clients())
        if self.limit is not None and added:
            txn.execute(_TRIM, (added, self.limit))
            for (client_id,) in txn.fetchall():
                removed[client_id] = removed.get(client_id, 0) + 1
        return removed


@implementer(IDeviceMessageStore)
class PostgresDeviceMessageStore(RunsAsAdds, PostgresBackend):
    """:class:`~tbmq.interfaces.IDeviceMessageStore` in PostgreSQL.

    :param dsn, min_connections, max_connections, reactor, pool: the
        database and its pool, see
        :class:`~tbmq_plugins.postgres_pool.PostgresBackend`.
    :param max_messages_per_client: the most deliveries kept per client
        (the lowest seqs go beyond it, see :meth:`add`), or None for no
        limit.
    :raises ValueError: for a limit below 1.

    :meth:`start` creates ``device_messages`` if missing and fails with
    :class:`~tbmq.errors.BackendError` when PostgreSQL cannot be reached
    or an existing ``device_messages`` lacks a column.  Calls made before
    :meth:`start` or after :meth:`stop` fail with
    :class:`~tbmq.errors.BackendError`; so do the calls of a transaction
    whose connection is lost.
    """

    what = "PostgreSQL device store"

    def __init__(self, dsn: str, min_connections: int = 1, max_connections: int = 5,
                 max_messages_per_client: int | None = None, reactor: Any = None,
                 pool: Any = None) -> None:
        super().__init__(dsn, min_connections, max_connections, reactor, pool)
        self.max_messages_per_client = check_limit(max_messages_per_client)
        self._queue: collections.deque = collections.deque()
        self._active = 0
        self._active_write = False
        self._writes: _Writes | None = None

    def _create_schema(self, txn: Any) -> None:
        """In a pool thread: create ``device_messages`` if missing (under an
        advisory lock: nodes starting together do not race), check it."""
        lock_writers(txn, SCHEMA_LOCK_KEY)
        txn.execute(_SCHEMA)
        txn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'device_messages'")
        missing = _COLUMNS - {row[0] for row in txn.fetchall()}
        if missing:
            raise BackendError(
                "table device_messages exists without the column(s) "
                f"{', '.join(sorted(missing))}")

    # -- the queue of operations ---------------------------------------------

    def _submit(self, write: bool, start: Callable[[], defer.Deferred]) -> None:
        """Queue an operation: ``start()`` runs it and returns a Deferred
        that fires (never fails) when it is done."""
        self._queue.append((write, start))
        self._pump()

    def _pump(self) -> None:
        """Start the operations at the head of the queue that may run: a
        write alone, reads together."""
        while self._queue:
            write, start = self._queue[0]
            if self._active and (write or self._active_write):
                return
            self._queue.popleft()
            self._active += 1
            self._active_write = write
            start().addBoth(self._finished)

    def _finished(self, _: Any) -> None:
        self._active -= 1
        if not self._active:
            self._active_write = False
        self._pump()

    def _call(self, write: bool, interaction: Callable, *args: Any) -> defer.Deferred:
        """Queue ``interaction(txn, *args)`` as one transaction of its own;
        later writes go to a new merged transaction after it.

        :returns: a Deferred firing with its result."""
        refused = self._refused()
        if refused is not None:
            return refused
        self._writes = None
        result: defer.Deferred = defer.Deferred()
        self._submit(write, lambda: self._interaction(interaction, *args).chainDeferred(result))
        return self._track(result)

    def _merge(self, merge: Callable[[_Writes], None], tag: str | None = None) -> defer.Deferred:
        """Merge a write into the open :class:`_Writes`, or a new one queued
        now.

        :param tag: the client id of an ``add``, else None.
        :returns: a Deferred firing with the call's result after the
            COMMIT."""
        refused = self._refused()
        if refused is not None:
            return refused
        writes = self._writes
        if writes is None or writes.sealed:
            writes = self._writes = _Writes(self.max_messages_per_client)
            self._submit(True, lambda: self._run_writes(writes))
        merge(writes)
        waiter: defer.Deferred = defer.Deferred()
        writes.waiters.append((waiter, tag))
        return self._track(waiter)

    def _run_writes(self, writes: _Writes) -> defer.Deferred:
        writes.seal()
        return self._interaction(writes).addBoth(writes.done)

    # -- IDeviceMessageStore ---------------------------------------------------

    def add(self, client_id: str, deliveries: Iterable[StoredDelivery]) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.add`: the
        ``deliveries`` (read now) are inserted or, by ``seq``, replaced in
        the next transaction, with those of the calls made meanwhile.

        :returns: a Deferred firing, when committed, with the number (int)
            of the client's oldest deliveries the trim removed (adds merged
            into one transaction: the last one reports them, the others 0);
            failing with
            :class:`TypeError`/:class:`ValueError` for a bad client id or
            ``seq``, :class:`~tbmq.errors.RecordEncodingError` for a
            delivery that cannot be encoded, or
            :class:`~tbmq.errors.BackendError`.
        """
        try:
            _check_client(client_id)
            rows = [[client_id, _check_seq(d.seq), encode_delivery(client_id, d),
                     None if d.packet_id is None else int(d.packet_id), int(d.state)]
                    for d in deliveries]
        except Exception:
            return defer.fail()

        def merge(writes: _Writes) -> None:
            for row in rows:
                writes.put((client_id, row[1]), row)

        return self._merge(merge, client_id)

    def update(self, client_id: str, seq: int, packet_id: int | None,
               state: int) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.update`.

        :param client_id: the persistent session's client id.
        :param seq: the delivery's order key; an unknown one is ignored.
        :param packet_id: the packet identifier it was sent with, or None.
        :param state: its new :class:`~tbmq.model.DeliveryState`.
        :returns: a Deferred firing with None when committed.
        """
        try:
            key = (_check_client(client_id), _check_seq(seq))
            packet_id = None if packet_id is None else int(packet_id)
            state = int(state)
        except Exception:
            return defer.fail()
        return self._merge(lambda writes: writes.update(key, packet_id, state))

    def remove(self, client_id: str, seqs: Iterable[int]) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.remove`.

        :param client_id: the persistent session's client id.
        :param seqs: the order keys to drop; unknown ones are ignored.
        :returns: a Deferred firing with None when committed.
        """
        try:
            keys = [(_check_client(client_id), _check_seq(seq)) for seq in seqs]
        except Exception:
            return defer.fail()

        def merge(writes: _Writes) -> None:
            for key in keys:
                writes.delete(key)

        return self._merge(merge)

    def load(self, client_id: str, after_seq: int | None = None,
             limit: int | None = None) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.load` (one
        query on the primary key, after the writes called before it).

        :returns: a Deferred firing with the client's ``list[StoredDelivery]``
            with ``seq > after_seq`` (an int; None: all), at most ``limit``
            (an int >= 0; None: all), in ``seq`` order; failing with
            :class:`ValueError`/:class:`TypeError` for bad paging arguments
            or :class:`~tbmq.errors.BackendError`.
        """
        try:
            check_page(after_seq, limit)
            _check_client(client_id)
        except (TypeError, ValueError):
            return defer.fail()
        sql = "SELECT delivery, packet_id, state FROM device_messages WHERE client_id = %s"
        params: list = [client_id]
        if after_seq is not None:
            sql += " AND seq > %s"
            params.append(max(min(after_seq, _INT64[1] - 1), _INT64[0]))
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)

        def load(txn: Any) -> list[StoredDelivery]:
            txn.execute(sql, params)
            return [decode_delivery(bytes(row[0]), row[1], row[2]) for row in txn.fetchall()]

        return self._call(False, load)

    def count(self, client_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.count`.

        :param client_id: the persistent session's client id.
        :returns: a Deferred firing with the number of its deliveries, the
            calls made before included.
        """
        try:
            _check_client(client_id)
        except (TypeError, ValueError):
            return defer.fail()

        def count(txn: Any) -> int:
            txn.execute("SELECT count(*) FROM device_messages WHERE client_id = %s",
                        (client_id,))
            return txn.fetchone()[0]

        return self._call(False, count)

    def clear(self, client_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.clear` (under
        the client's advisory lock).

        :param client_id: the persistent session's client id.
        :returns: a Deferred firing with None when committed.
        """
        try:
            _check_client(client_id)
        except (TypeError, ValueError):
            return defer.fail()

        def clear(txn: Any) -> None:
            _lock_clients(txn, [client_id])
            txn.execute("DELETE FROM device_messages WHERE client_id = %s", (client_id,))

        return self._call(True, clear)
