"""The device message store of the embedded default: the table
``deliveries`` of the embedded store file, keyed by (client id, seq), and
the runs of ``add_run`` beside it (:mod:`tbmq.backends.sqlite_delivery_runs`).

Writes accepted while the database thread is busy are merged into one
:class:`CoalescedWrites` operation of the next transaction
(:class:`~tbmq.backends.deliveries.DeliveryWrites`).
"""

from __future__ import annotations

import json
import sqlite3
from itertools import repeat
from typing import Iterable

from twisted.internet import defer
from zope.interface import implementer

from tbmq.backends.deliveries import DeliveryWrites, check_limit, check_page
from tbmq.backends.sqlite_bulk import delete_seqs, has_json, insert_rows, update_states
from tbmq.backends.sqlite_delivery_runs import (
    MAX_RUN_MESSAGES,
    count_runs,
    cut_runs,
    insert_runs,
    load_runs,
    run_deliveries_of,
    split_stream,
    trim_client,
)
from tbmq.backends.sqlite_runner import SQLiteRunner
from tbmq.backends.sqlite_view import RunnerView
from tbmq.backends.sqlite_schema import (
    DELIVERY_COLUMN_NAMES,
    DELIVERY_COLUMNS,
    DELIVERY_NULLABLE,
    EMBEDDED_SCHEMA,
    ids_json,
    message_blobs,
    message_of_blob,
    messages_of_blobs,
    messages_of_stream,
)
from tbmq.cluster.message_arrays import templated
from tbmq.interfaces import IDeviceMessageStore
from tbmq.model import DeliveryState, StoredDelivery

__all__ = ["CoalescedWrites", "SHARED_BLOBS", "SHARED_BLOB_MAX", "SQLiteDeviceMessageStore"]

#: the most messages whose encoding (:func:`~tbmq.backends.sqlite_schema.
#: message_blob`) a store keeps for the next subscribers of the same message
#: (the deliveries of one message to several persistent sessions are adds
#: of one reactor turn); all are forgotten when an add would go beyond it
SHARED_BLOBS = 256
#: a message encoded to more bytes than this is not kept (the store would
#: hold it after its deliveries are done)
SHARED_BLOB_MAX = 16 * 1024

#: the column ``state`` → its :class:`~tbmq.model.DeliveryState` (the
#: values are 0, 1, 2: a tuple look-up, not the enum's call, per row read)
_STATES = tuple(DeliveryState(value) for value in range(max(DeliveryState) + 1))


class CoalescedWrites(DeliveryWrites):
    """Writes to the ``deliveries`` table accepted while the database thread
    is busy, merged per (client id, seq) into one operation of the next
    batch (:class:`~tbmq.backends.deliveries.DeliveryWrites`); a put is the
    row to INSERT OR REPLACE (``client_id, seq, message, qos, retain,
    subscription_ids, packet_id, state``,
    :mod:`tbmq.backends.sqlite_schema`).  An ``add_run`` is one row of
    ``delivery_runs`` (:mod:`tbmq.backends.sqlite_delivery_runs`) in
    :attr:`runs`, until a later write of this operation touches its
    client: then its deliveries become puts (:meth:`_spread`), and the
    merging goes on as for an ``add``.

    :ivar runs: client id → its runs of this operation, each ``[client_id,
        last_seq, first_seq, base_seq, qos, retain, subscription_ids,
        blobs]`` (``first_seq`` is ``base_seq``; the blobs are joined in the
        database thread).
    """

    __slots__ = ("runs",)

    def __init__(self, limit: int | None = None) -> None:
        super().__init__(limit)
        self.runs: dict[str, list[list]] = {}

    def put_run(self, client_id: str, run: list) -> None:
        """Keep ``run`` (a row of ``delivery_runs`` with its blobs) as one
        row; as puts when this operation writes one of its order keys
        already (the later write replaces the earlier)."""
        if self.puts or self.updates or self.deletes:
            first, last = run[2], run[1]
            for keys in (self.puts, self.updates, self.deletes):
                if keys and any((client_id, seq) in keys for seq in range(first, last + 1)):
                    self._spread_run(run)
                    return
        runs = self.runs.get(client_id)
        if runs is None:
            self.runs[client_id] = [run]
        elif any(other[2] <= run[1] and other[1] >= run[2] for other in runs):
            # it overlaps a run of this operation: both as puts, the later last
            self._spread(client_id)
            self._spread_run(run)
        else:
            runs.append(run)

    def _spread(self, client_id: str) -> None:
        """The runs of ``client_id`` in this operation become puts."""
        runs = self.runs.pop(client_id, None)
        if runs:
            for run in runs:
                self._spread_run(run)

    def _spread_run(self, run: list) -> None:
        client_id, last, first, base, qos, retain, ids, blobs = run
        put = super().put
        for seq in range(first, last + 1):
            put((client_id, seq), [client_id, seq, blobs[seq - base], qos, retain, ids, None, 0])

    def put(self, key: tuple[str, int], row: list) -> None:
        if self.runs:
            self._spread(key[0])
        super().put(key, row)

    def put_all(self, client_id: str, rows: list) -> None:
        if self.runs:
            self._spread(client_id)
        super().put_all(client_id, rows)

    def update(self, key: tuple[str, int], packet_id: int | None, state: int) -> None:
        if self.runs:
            self._spread(key[0])
        super().update(key, packet_id, state)

    def update_all(self, client_id: str, updates) -> None:
        if self.runs:
            self._spread(client_id)
        super().update_all(client_id, updates)

    def delete(self, key: tuple[str, int]) -> None:
        if self.runs:
            self._spread(key[0])
        super().delete(key)

    def delete_all(self, client_id: str, seqs) -> None:
        if self.runs:
            self._spread(client_id)
        super().delete_all(client_id, seqs)

    def __call__(self, conn: sqlite3.Connection) -> dict[str, int]:
        """In the database thread: cut the stored runs these writes touch
        (:func:`~tbmq.backends.sqlite_delivery_runs.cut_runs`), write the
        merged rows and runs, then trim.

        :returns: client id → deliveries removed by the trim."""
        deletes = self._cut(conn)
        # one statement per up to CHUNK_ROWS rows, not one step per row
        # (tbmq.backends.sqlite_bulk: each step waits for the GIL again)
        if deletes:
            delete_seqs(conn, deletes)
        if self.updates:
            update_states(conn, self.updates.items())
        if self.puts:
            # the columns None in every row of a statement bind nothing
            insert_rows(conn, "deliveries", list(self.puts.values()), DELIVERY_COLUMNS,
                        columns=DELIVERY_COLUMN_NAMES, nullable=DELIVERY_NULLABLE)
        if self.runs:
            insert_runs(conn, [run for runs in self.runs.values() for run in runs])
        removed: dict[str, int] = {}
        if self.limit is not None:
            for client_id in self.added_clients():
                count = trim_client(conn, client_id, self.limit)
                if count:
                    removed[client_id] = count
        return removed

    def _cut(self, conn: sqlite3.Connection) -> set:
        """Cut, per client, the stored runs that hold a delivery these
        writes update, remove or replace, or that a new run overlaps.

        :returns: the deletes left for ``deliveries`` (those found in a
            run are done)."""
        touched: dict[str, set] = {}
        gone: dict[str, set] = {client_id: set() for client_id in self.runs}
        for key in self.deletes:
            gone.setdefault(key[0], set()).add(key[1])
        for key in self.puts:
            gone.setdefault(key[0], set()).add(key[1])
        for key in self.updates:
            touched.setdefault(key[0], set()).add(key[1])
        left = self.deletes
        for client_id in gone.keys() | touched.keys():
            removed = gone.get(client_id, set())
            seqs = sorted(removed | touched.get(client_id, set()))
            ranges = [(run[2], run[1]) for run in self.runs.get(client_id, ())]
            covered = cut_runs(conn, client_id, seqs, removed, ranges)
            if covered:
                if left is self.deletes:
                    left = set(left)
                left.difference_update(zip(repeat(client_id), covered))
        return left


#: a page of ``deliveries`` (``{where}``: the filter; its values, then the
#: LIMIT, bound) in **one step** of one statement: the page's message
#: columns as one blob (their :func:`~tbmq.backends.sqlite_schema.
#: message_blob` encodings one after another: a msgpack stream), its other
#: columns as one JSON array, and its row count.  :mod:`sqlite3` takes the
#: GIL again after every step, and a ``fetchall`` steps once per row: while
#: the reactor works, the database thread then waited for the GIL once per
#: row of a drain, before the COMMITs of the writes queued behind the read.
#: A row as queued at QoS 1 (retain 0, no subscription identifiers, no
#: packet id, state QUEUED: most of a drain) is its ``seq`` alone in the
#: JSON array, any other the array of its six columns: a page of plain
#: ints is read by ``json.loads`` in about a quarter of the time of one
#: array per row, and SQLite builds no array for it either
_PAGE = ("SELECT CAST(group_concat(message, '') AS BLOB), "
         "json_group_array(CASE WHEN qos = 1 AND retain = 0 AND subscription_ids IS NULL "
         "AND packet_id IS NULL AND state = 0 THEN seq "
         "ELSE json_array(seq, qos, retain, subscription_ids, packet_id, state) END), "
         "count(*) FROM (SELECT seq, message, qos, retain, subscription_ids, packet_id, state "
         "FROM deliveries WHERE {where} ORDER BY seq LIMIT ?)")


def _deliveries_of_page(data: bytes | None, columns: str, count: int
                        ) -> list[StoredDelivery] | None:
    """In the reactor thread: the deliveries of a page read by
    :data:`_PAGE` (the database thread did no per-row Python work for it).

    :returns: the deliveries in ``seq`` order, or None when ``data`` does
        not come apart as one message per row.
    :raises tbmq.errors.RecordEncodingError: for a message that is not a
        ``msg`` record of a known version."""
    if not count:
        return []
    messages = messages_of_stream(data, count)
    if messages is None:
        return None
    rows = json.loads(columns)
    # both aggregates step through the same rows, in the subquery's order,
    # which SQLite does not promise: the pairs go in seq order if it is not
    seqs = [row if type(row) is int else row[0] for row in rows]
    if seqs != sorted(seqs):
        pairs = sorted(zip(seqs, rows, messages), key=lambda triple: triple[0])
        rows, messages = [row for _, row, _ in pairs], [message for _, _, message in pairs]
    return _page_deliveries(messages, rows)


def _page_deliveries(messages: list, rows: list) -> list[StoredDelivery]:
    """:returns: a :class:`StoredDelivery` per message and its row of
    :data:`_PAGE`: a ``seq`` (an int) for a row as queued at QoS 1, else
    ``[seq, qos, retain, subscription_ids, packet_id, state]``."""
    states, loads, queued = _STATES, json.loads, DeliveryState.QUEUED
    return [
        StoredDelivery(row, message, 1, False, (), None, queued) if type(row) is int else
        StoredDelivery(row[0], message, row[1], row[2] == 1,
                       () if row[3] is None else tuple(loads(row[3])), row[4], states[row[5]])
        for message, row in zip(messages, rows)
    ]


def _merged(rows: list, runs: list, limit: int | None) -> list[StoredDelivery]:
    """:returns: the deliveries of ``rows`` and ``runs`` (each in ``seq``
    order, no ``seq`` in both) in ``seq`` order, the first ``limit`` (all
    when None)."""
    if not runs:
        merged = rows
    elif not rows:
        merged = runs
    else:
        merged = rows + runs
        merged.sort(key=_seq_of)
    if limit is not None and len(merged) > limit:
        del merged[limit:]
    return merged


def _seq_of(delivery: StoredDelivery) -> int:
    return delivery.seq


def _deliveries(messages: list, rows: list) -> list[StoredDelivery]:
    """:returns: a :class:`StoredDelivery` per message and its row's ``seq,
    qos, retain, subscription_ids, packet_id, state``."""
    states, loads = _STATES, json.loads
    return [
        StoredDelivery(seq, message, qos, retain == 1,
                       () if ids is None else tuple(loads(ids)), packet_id, states[state])
        for message, (seq, qos, retain, ids, packet_id, state) in zip(messages, rows)
    ]


@implementer(IDeviceMessageStore)
class SQLiteDeviceMessageStore(RunnerView):
    """:class:`~tbmq.interfaces.IDeviceMessageStore` on the table
    ``deliveries``, keyed by (client id, seq).

    :param runner: the :class:`~tbmq.backends.sqlite_runner.SQLiteRunner`
        of the embedded store file.
    :param max_messages_per_client: the most deliveries kept per client
        (the oldest are removed beyond it, see :meth:`add`); None for no
        limit.
    :raises ValueError: for a limit below 1.
    """

    def __init__(self, runner: SQLiteRunner, max_messages_per_client: int | None = None) -> None:
        super().__init__(runner, EMBEDDED_SCHEMA)
        self.max_messages_per_client = check_limit(max_messages_per_client)
        #: id(message) → (message, its message_blob), for the next subscribers
        self._blobs: dict[int, tuple] = {}

    def _new_writes(self) -> CoalescedWrites:
        return CoalescedWrites(self.max_messages_per_client)

    def add(
        self, client_id: str, deliveries: Iterable[StoredDelivery]
    ) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.add`; a
        delivery whose ``seq`` is already stored replaces it.

        :param client_id: the persistent session's client id.
        :param deliveries: the deliveries; their values are read now.
        :returns: a Deferred firing, when committed, with the number of the
            client's oldest deliveries removed to stay within
            ``max_messages_per_client`` (adds merged into one transaction:
            the last one reports them, the others 0).
        """
        try:
            ids_of = ids_json
            rows, messages = [], []
            for d in deliveries:
                ids = d.subscription_ids
                rows.append([client_id, int(d.seq), None, int(d.qos), 1 if d.retain else 0,
                             ids_of(ids) if ids else None, d.packet_id, int(d.state)])
                messages.append(d.message)
            self._fill_blobs(rows, messages)
        except Exception:
            return defer.fail()
        return self._merge(self._new_writes, lambda writes: writes.put_all(client_id, rows),
                           client_id)

    def add_run(self, client_id: str, first_seq: int, messages, qos: int,
                retain: bool = False, subscription_ids: tuple = ()) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.add_run`:
        one row of ``delivery_runs`` per :data:`~tbmq.backends.
        sqlite_delivery_runs.MAX_RUN_MESSAGES` messages, their encodings
        one after another (no :class:`~tbmq.model.StoredDelivery` nor row
        each).

        :param client_id: the persistent session's client id.
        :param first_seq: the order key of the first message (an int); the
            next ones follow it by one.
        :param messages: the :class:`~tbmq.model.Message` s, in order.
        :returns: a Deferred as :meth:`add`'s, or failing with
            :class:`TypeError` for a ``first_seq`` that is not an int.
        """
        try:
            if isinstance(first_seq, bool) or not isinstance(first_seq, int):
                raise TypeError(f"first_seq must be an int, not {first_seq!r}")
            qos, flag = int(qos), 1 if retain else 0
            ids = ids_json(tuple(subscription_ids)) if subscription_ids else None
            if not messages:
                return defer.succeed(0)
            blobs = self._blobs_of(messages)
        except Exception:
            return defer.fail()
        # one row of delivery_runs (tbmq.backends.sqlite_delivery_runs) per
        # MAX_RUN_MESSAGES
        runs = []
        for start in range(0, len(blobs), MAX_RUN_MESSAGES):
            part = blobs[start:start + MAX_RUN_MESSAGES]
            first = first_seq + start
            runs.append([client_id, first + len(part) - 1, first, first, qos, flag, ids, part])

        def merge(writes: CoalescedWrites) -> None:
            for run in runs:
                writes.put_run(client_id, run)

        return self._merge(self._new_writes, merge, client_id)

    def _blobs_of(self, messages) -> list[bytes]:
        """:returns: the :func:`~tbmq.backends.sqlite_schema.message_blob`
        of each of ``messages`` (a sequence), in order: a message is encoded
        once (:func:`~tbmq.backends.sqlite_schema.message_blobs`, one pass
        for the new ones) for every subscriber it is queued for, the same
        bytes each time (kept while the message is held, up to
        ``SHARED_BLOBS`` of at most ``SHARED_BLOB_MAX`` bytes). A run none or
        all of whose messages were encoded before costs no bytecode per
        message (map loops); a published run's messages, which share one
        template (:func:`~tbmq.cluster.message_arrays.templated`), are
        encoded from it, and kept nowhere.

        :raises tbmq.errors.RecordEncodingError: for a message that does
            not fit its record."""
        if not messages:
            return []
        packed = templated(messages)
        if packed is not None:  # a published run's: made from its template, nothing to share
            return packed
        blobs = self._blobs
        known = list(map(blobs.get, map(id, messages))) if blobs else None
        if known is None or known.count(None) == len(known):
            missed = messages
            out = new = message_blobs(messages)
        elif None not in known:
            return [blob for _, blob in known]
        else:  # some of them: the new ones encoded in one pass
            missed = [m for m, k in zip(messages, known) if k is None]
            fresh = iter(new := message_blobs(missed))
            out = [next(fresh) if k is None else k[1] for k in known]
        if len(blobs) + len(new) > SHARED_BLOBS:
            blobs.clear()
        if max(map(len, new)) <= SHARED_BLOB_MAX:
            # the messages are held: their ids are not others' meanwhile
            blobs.update(zip(map(id, missed), zip(missed, new)))
        else:
            for message, blob in zip(missed, new):
                if len(blob) <= SHARED_BLOB_MAX:
                    blobs[id(message)] = (message, blob)
        return out

    def _fill_blobs(self, rows: list, messages) -> None:
        """Put :meth:`_blobs_of` ``messages`` into the ``message`` column of
        each message's row of ``rows``.

        :raises tbmq.errors.RecordEncodingError: for a message that does
            not fit its record."""
        for row, blob in zip(rows, self._blobs_of(messages)):
            row[2] = blob

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
        key, state = (client_id, int(seq)), int(state)
        return self._merge(self._new_writes, lambda w: w.update(key, packet_id, state))

    def update_many(self, client_id: str,
                    updates: Iterable[tuple[int, int | None, int]]) -> defer.Deferred:
        """Several :meth:`update` calls as one merged write, with one
        Deferred (:func:`tbmq.backends.deliveries.update_many`: the outbox
        sends them once per reactor turn).

        :param client_id: the persistent session's client id.
        :param updates: ``(seq, packet_id, state)`` each, in order;
            unknown seqs are ignored.
        :returns: a Deferred firing with None when committed.
        """
        # one loop over them, under the runner's lock (DeliveryWrites.update_all)
        updates = list(updates)
        return self._merge(self._new_writes, lambda writes: writes.update_all(client_id, updates))

    def remove(self, client_id: str, seqs: Iterable[int]) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.remove`.

        :param client_id: the persistent session's client id.
        :param seqs: the order keys to drop; unknown ones are ignored.
        :returns: a Deferred firing with None when committed.
        """
        seqs = list(seqs)
        return self._merge(self._new_writes, lambda writes: writes.delete_all(client_id, seqs))

    def load(
        self, client_id: str, after_seq: int | None = None, limit: int | None = None
    ) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.load`.

        :param client_id: the persistent session's client id.
        :param after_seq: only deliveries with a greater ``seq``; all when
            None.
        :param limit: at most this many (>= 0); all when None.
        :returns: a Deferred firing with the ``list[StoredDelivery]`` in
            ``seq`` order, or failing with :class:`ValueError` (a negative
            ``limit``) or :class:`TypeError` (not an int).
        """
        try:
            check_page(after_seq, limit)
        except (TypeError, ValueError):
            return defer.fail()
        self._close_writes()
        where, params = "client_id = ?", [client_id]
        if after_seq is not None:
            where += " AND seq > ?"
            params.append(after_seq)
        params.append(-1 if limit is None else limit)  # LIMIT -1: no limit

        def load(conn: sqlite3.Connection) -> tuple:
            runs = load_runs(conn, client_id, after_seq, limit)
            if has_json(conn):
                try:
                    return conn.execute(_PAGE.format(where=where), params).fetchone(), runs
                except sqlite3.DataError:  # the page's messages past SQLITE_MAX_LENGTH
                    pass
            return read_rows(conn), runs

        def read_rows(conn: sqlite3.Connection) -> list[StoredDelivery]:
            rows = conn.execute(
                "SELECT seq, message, qos, retain, subscription_ids, packet_id, state "
                f"FROM deliveries WHERE {where} ORDER BY seq LIMIT ?",
                params,
            ).fetchall()
            # one msgpack pass for the page's messages (tbmq.cluster.records'
            # msg records)
            messages = messages_of_blobs([row[1] for row in rows])
            return _deliveries(messages, [(seq, qos, retain, ids, packet_id, state)
                                          for seq, _, qos, retain, ids, packet_id, state in rows])

        def decoded(result):
            page, runs = result
            if type(page) is not list:
                page = _deliveries_of_page(*page)
            in_runs = run_deliveries_of(*runs)
            if page is None or in_runs is None:  # not one message per row: one by one
                return self._submit(load_rows, write=False)
            return _merged(page, in_runs, limit)

        def load_rows(conn: sqlite3.Connection) -> list[StoredDelivery]:
            rows = conn.execute(
                "SELECT seq, message, qos, retain, subscription_ids, packet_id, state "
                f"FROM deliveries WHERE {where} ORDER BY seq LIMIT ?",
                params,
            ).fetchall()
            page = _deliveries([message_of_blob(row[1]) for row in rows],
                               [(seq, qos, retain, ids, packet_id, state)
                                for seq, _, qos, retain, ids, packet_id, state in rows])
            in_runs = []
            headers, data = load_runs(conn, client_id, after_seq, limit)
            blobs = split_stream(data, sum(last - base + 1 for _, last, base, *_ in headers))
            at = 0
            for first, last, base, qos, retain, ids in headers:
                kept = blobs[at + first - base:at + last - base + 1]
                at += last - base + 1
                in_runs.extend(_deliveries(
                    [message_of_blob(blob) for blob in kept],
                    [(seq, qos, retain, ids, None, 0) for seq in range(first, last + 1)]))
            in_runs.sort(key=_seq_of)  # (in the aggregate's order)
            return _merged(page, in_runs, limit)

        return self._submit(load, write=False).addCallback(decoded)

    def count(self, client_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.count`.

        :param client_id: the persistent session's client id.
        :returns: a Deferred firing with the number of its deliveries, the
            calls made before included.
        """
        self._close_writes()

        def count(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "SELECT count(*) FROM deliveries WHERE client_id = ?", (client_id,)
            ).fetchone()[0] + count_runs(conn, client_id)

        return self._submit(count, write=False)

    def clear(self, client_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.clear`.

        :param client_id: the persistent session's client id.
        :returns: a Deferred firing with None when committed.
        """

        self._close_writes()

        def clear(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM deliveries WHERE client_id = ?", (client_id,))
            conn.execute("DELETE FROM delivery_runs WHERE client_id = ?", (client_id,))
            conn.execute("DELETE FROM delivery_run_heads WHERE client_id = ?", (client_id,))

        return self._submit(clear)
