"""Runs of deliveries kept as one row of the embedded device store: the
tables ``delivery_runs`` and ``delivery_run_heads`` beside ``deliveries``
(schema version 7, :mod:`tbmq.backends.sqlite_schema`), for the database
thread of :class:`~tbmq.backends.sqlite_deliveries.SQLiteDeviceMessageStore`.

An ``add_run`` (the messages of one :class:`~tbmq.cluster.records.
DeliveryRun` of ``tbmq.msg.persisted``: one client, consecutive order keys,
one QoS, retain flag and set of subscription identifiers, all queued) is one
row of ``delivery_runs`` per :data:`MAX_RUN_MESSAGES`: ``client_id,
last_seq, base_seq, qos, retain, subscription_ids, messages``, keyed by
``(client_id, last_seq)``.  ``messages`` is the :func:`~tbmq.backends.
sqlite_schema.message_blob` of each message from ``base_seq`` to
``last_seq``, one after another (a msgpack stream).  The deliveries kept
are those from ``first_seq`` to ``last_seq``: ``first_seq`` is the run's
row of ``delivery_run_heads`` (``client_id, last_seq, first_seq``) once its
first deliveries are removed, else ``base_seq``.  A run's order keys are in
no row of ``deliveries`` and in no other run.  So a queued message costs a
part of one row, not a row of eight bound values (about 12,000
instructions of the database thread, counted with callgrind), and a
drain's removals are one small row written (or one run deleted) per run,
not a B-tree delete per message; a page of a drain reads its runs in one
step of one statement (:func:`load_runs`).

A write that touches a delivery of a run other than by removing its first
ones (an update of its packet id and state, a removal further on, an
``add`` of one of its order keys, a run over it) *cuts* the run
(:func:`cut_runs`): its deliveries up to the highest one touched become
rows of ``deliveries`` (those removed or replaced left out), and the run
keeps the rest.  A row of ``deliveries`` then means what it always meant;
the runs only ever hold queued deliveries without a packet id.  Every cut
is a part of the transaction of the write that made it.
"""

from __future__ import annotations

import json
import sqlite3
from bisect import bisect_right
from itertools import count, islice, repeat

import msgpack

from tbmq.backends.sqlite_bulk import has_json, insert_rows
from tbmq.backends.sqlite_schema import DELIVERY_COLUMNS
from tbmq.cluster.records import MESSAGE
from tbmq.model import DeliveryState, Message, StoredDelivery

__all__ = ["MAX_RUN_MESSAGES", "RUN_COLUMNS", "count_runs", "cut_runs", "insert_runs", "load_runs",
           "plain_run_deliveries", "run_deliveries_of", "split_stream", "trim_client"]

#: The values of a row of ``delivery_runs``.
RUN_COLUMNS = 7


def split_stream(data: bytes, count: int) -> list[bytes]:
    """:returns: the first ``count`` msgpack values of ``data`` (a run's
        ``messages``), each as its own bytes (a message's
        :func:`~tbmq.backends.sqlite_schema.message_blob`).
    :raises ValueError: when ``data`` holds fewer."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(data), 1 << 20))
    unpacker.feed(data)
    out = []
    start = 0
    for _ in range(count):
        unpacker.skip()
        end = unpacker.tell()
        out.append(data[start:end])
        start = end
    return out


def insert_runs(conn: sqlite3.Connection, runs: list[list]) -> None:
    """Write ``runs`` (rows of ``delivery_runs``, ``messages`` a list of
    blobs joined here), up to :data:`~tbmq.backends.sqlite_bulk.CHUNK_ROWS` per statement.  A run
    replaces nothing: its order keys are new (:func:`cut_runs` made room
    for any that were not)."""
    rows = []
    for client_id, last, _, base, qos, retain, ids, blobs in runs:
        rows.append((client_id, last, base, qos, retain, ids, b"".join(blobs)))
    insert_rows(conn, "delivery_runs", rows, RUN_COLUMNS)


#: the most messages of one row of ``delivery_runs`` (a longer ``add_run``
#: is several rows): a run that holds a seq ends at most this far past it,
#: so the look-up of :func:`cut_runs` reads a bounded range of the key
MAX_RUN_MESSAGES = 4096

#: a client's runs that may hold a seq from ``lo`` to ``hi`` (``last_seq``
#: from ``lo`` to ``hi + MAX_RUN_MESSAGES - 1``, ``base_seq`` up to
#: ``hi``), with the first delivery each keeps, as one JSON array; and
#: whether ``deliveries`` has a row from ``lo`` to ``hi``: one step of one
#: statement (each step waits for the GIL again, :mod:`tbmq.backends.
#: sqlite_bulk`)
_LOOK_UP = ("SELECT (SELECT json_group_array(json_array(r.last_seq, "
            "coalesce(h.first_seq, r.base_seq), r.base_seq, r.qos, r.retain, "
            "r.subscription_ids)) FROM delivery_runs r LEFT JOIN delivery_run_heads h "
            "ON h.client_id = r.client_id AND h.last_seq = r.last_seq "
            "WHERE r.client_id = ?1 AND r.last_seq BETWEEN ?2 AND ?3 + ?4 AND r.base_seq <= ?3), "
            "EXISTS (SELECT 1 FROM deliveries WHERE client_id = ?1 AND seq BETWEEN ?5 AND ?6)")

#: the same without JSON functions: a row per run, and the rows' question
_LOOK_UP_ROWS = ("SELECT r.last_seq, coalesce(h.first_seq, r.base_seq), r.base_seq, r.qos, "
                 "r.retain, r.subscription_ids FROM delivery_runs r "
                 "LEFT JOIN delivery_run_heads h "
                 "ON h.client_id = r.client_id AND h.last_seq = r.last_seq "
                 "WHERE r.client_id = ?1 AND r.last_seq BETWEEN ?2 AND ?3 + ?4 "
                 "AND r.base_seq <= ?3 ORDER BY r.last_seq")
_ANY_ROW = "SELECT EXISTS (SELECT 1 FROM deliveries WHERE client_id = ? AND seq BETWEEN ? AND ?)"


def _look_up(conn: sqlite3.Connection, client_id: str, low: int, high: int,
             rows_low: int, rows_high: int) -> tuple[list, bool]:
    """:returns: the runs of ``client_id`` that may hold a seq from ``low``
    to ``high`` (``[last_seq, first_seq, base_seq, qos, retain,
    subscription_ids]`` each), and whether ``deliveries`` has a row of it
    from ``rows_low`` to ``rows_high``."""
    params = (client_id, low, high, MAX_RUN_MESSAGES - 1, rows_low, rows_high)
    if has_json(conn):
        runs, rows = conn.execute(_LOOK_UP, params).fetchone()
        return json.loads(runs), bool(rows)
    runs = conn.execute(_LOOK_UP_ROWS, params[:4]).fetchall()
    (rows,) = conn.execute(_ANY_ROW, (client_id, rows_low, rows_high)).fetchone()
    return runs, bool(rows)


def cut_runs(conn: sqlite3.Connection, client_id: str, touched: list[int], gone: set,
             ranges: list[tuple[int, int]] = ()) -> set[int]:
    """Make room in ``client_id``'s runs for this transaction's writes: in
    each run holding one of ``touched`` (sorted order keys updated, removed
    or replaced) or overlapping one of ``ranges`` (``(first, last)`` of new
    runs), the deliveries up to the highest one touched leave it; those not
    in ``gone`` (removed or replaced) nor in a range become rows of
    ``deliveries`` (queued, no packet id: an update then sets them).  The
    run keeps the rest, or goes when nothing is left.  The rows of
    ``deliveries`` in ``ranges`` are deleted (the new runs replace them).

    :returns: the order keys of ``gone`` that were in a run (no row of
        ``deliveries`` to delete for them)."""
    if not touched and not ranges:
        return set()
    lows = [touched[0]] if touched else []
    highs = [touched[-1]] if touched else []
    for first, last in ranges:
        lows.append(first)
        highs.append(last)
    if ranges:
        rows_low, rows_high = min(a for a, _ in ranges), max(b for _, b in ranges)
    else:
        rows_low, rows_high = 1, 0  # (no range: no row asked about)
    found, rows = _look_up(conn, client_id, min(lows), max(highs), rows_low, rows_high)
    if rows:
        for first, last in ranges:  # a new run replaces the rows it covers
            conn.execute("DELETE FROM deliveries WHERE client_id = ? AND seq BETWEEN ? AND ?",
                         (client_id, first, last))
    covered: set[int] = set()
    for last, first, base, qos, retain, ids in found:
        i = bisect_right(touched, last) - 1
        top = touched[i] if i >= 0 and touched[i] >= first else None
        for a, b in ranges:
            if a <= last and b >= first:
                end = b if b < last else last
                if top is None or end > top:
                    top = end
        if top is None:
            continue
        span = range(first, top + 1)
        if gone.issuperset(span):  # a drain's acknowledgements: the first ones all gone
            keep = ()
            covered.update(span)
        else:
            keep = [seq for seq in span if seq not in gone]
            if ranges:
                keep = [seq for seq in keep if not _in_ranges(seq, ranges)]
            covered.update(gone.intersection(span))
        if keep:
            (data,) = conn.execute(
                "SELECT messages FROM delivery_runs WHERE client_id = ? AND last_seq = ?",
                (client_id, last)).fetchone()
            blobs = split_stream(data, top - base + 1)
            insert_rows(conn, "deliveries",
                        [[client_id, seq, blobs[seq - base], qos, retain, ids, None, 0]
                         for seq in keep], DELIVERY_COLUMNS)
        if top >= last:
            drop_run(conn, client_id, last, first != base)
        else:
            move_head(conn, client_id, last, top + 1)
    return covered


def drop_run(conn: sqlite3.Connection, client_id: str, last_seq: int, head: bool) -> None:
    """Delete the run of ``client_id`` ending at ``last_seq``, and its head
    when it has one (``head``: its first delivery is not its base)."""
    key = (client_id, last_seq)
    conn.execute("DELETE FROM delivery_runs WHERE client_id = ? AND last_seq = ?", key)
    if head:
        conn.execute("DELETE FROM delivery_run_heads WHERE client_id = ? AND last_seq = ?", key)


def move_head(conn: sqlite3.Connection, client_id: str, last_seq: int, first_seq: int) -> None:
    """The run of ``client_id`` ending at ``last_seq`` keeps its deliveries
    from ``first_seq`` on: a row of ``delivery_run_heads`` (a few bytes
    written, not the run's row with its messages)."""
    conn.execute("INSERT OR REPLACE INTO delivery_run_heads VALUES (?, ?, ?)",
                 (client_id, last_seq, first_seq))


def _in_ranges(seq: int, ranges) -> bool:
    for a, b in ranges:
        if a <= seq <= b:
            return True
    return False


#: the runs of a page (``?1`` the client, ``?2`` the seq it reads after,
#: ``?3`` the most deliveries) in **one step** of one statement: their
#: ``[first_seq, last_seq, base_seq, qos, retain, subscription_ids]`` as one
#: JSON array and their ``messages`` one after another as one blob (as
#: :data:`tbmq.backends.sqlite_deliveries._PAGE` reads the rows: each step
#: of a statement waits for the GIL again, and a page of 5,000 deliveries
#: is some 40 runs).  The runs are chosen by their small columns alone (a
#: run's messages are read only for the runs of the page): at most ``?3``
#: of them, up to the one that holds the ``?3``-th delivery.
_RUNS_PAGE = (
    "SELECT json_group_array(json_array(first, last, base_seq, qos, retain, "
    "subscription_ids)), CAST(group_concat(messages, '') AS BLOB) FROM ("
    "SELECT p.first AS first, p.last AS last, r.base_seq AS base_seq, r.qos AS qos, "
    "r.retain AS retain, r.subscription_ids AS subscription_ids, r.messages AS messages "
    "FROM (SELECT last, first, sum(last - first + 1) OVER (ORDER BY last "
    "ROWS UNBOUNDED PRECEDING) AS upto FROM ("
    "SELECT r.last_seq AS last, max(coalesce(h.first_seq, r.base_seq), ?2 + 1) AS first "
    "FROM delivery_runs r LEFT JOIN delivery_run_heads h "
    "ON h.client_id = r.client_id AND h.last_seq = r.last_seq "
    "WHERE r.client_id = ?1 AND r.last_seq > ?2 ORDER BY r.last_seq LIMIT ?3)) p "
    "JOIN delivery_runs r ON r.client_id = ?1 AND r.last_seq = p.last "
    "WHERE p.upto - (p.last - p.first + 1) < ?3 ORDER BY p.last)")

#: the lowest seq (``after_seq`` of a read of everything) and the most
#: deliveries of a read without a limit
_NO_SEQ, _NO_LIMIT = -(1 << 63), (1 << 62)


def load_runs(conn: sqlite3.Connection, client_id: str, after_seq: int | None,
              limit: int | None) -> tuple[list, bytes]:
    """:returns: the runs of ``client_id`` with deliveries after
        ``after_seq`` (all when None), in order, up to those that hold
        ``limit`` of them (all when None): ``(headers, data)``, a header
        ``[first_seq, last_seq, base_seq, qos, retain, subscription_ids]``
        per run (its ``first_seq`` raised past ``after_seq``), and their
        ``messages`` one after another (:func:`run_deliveries_of`).  One
        step of one statement where the library has JSON and window
        functions (and the page fits one value), else a step per run."""
    after = _NO_SEQ if after_seq is None else after_seq
    most = _NO_LIMIT if limit is None else limit
    if has_json(conn) and sqlite3.sqlite_version_info >= (3, 25, 0):
        try:
            headers, data = conn.execute(_RUNS_PAGE, (client_id, after, most)).fetchone()
        except sqlite3.DataError:  # past SQLITE_MAX_LENGTH: a run at a time
            pass
        else:
            return json.loads(headers), data or b""
    cursor = conn.execute(
        "SELECT max(coalesce(h.first_seq, r.base_seq), ? + 1), r.last_seq, r.base_seq, r.qos, "
        "r.retain, r.subscription_ids, r.messages FROM delivery_runs r "
        "LEFT JOIN delivery_run_heads h ON h.client_id = r.client_id "
        "AND h.last_seq = r.last_seq WHERE r.client_id = ? AND r.last_seq > ? "
        "ORDER BY r.last_seq", (after, client_id, after))
    headers, parts = [], []
    held = 0
    for first, last, base, qos, retain, ids, data in cursor:
        headers.append([first, last, base, qos, retain, ids])
        parts.append(data)
        held += last - first + 1
        if held >= most:
            break
    cursor.close()
    return headers, b"".join(parts)


def count_runs(conn: sqlite3.Connection, client_id: str) -> int:
    """:returns: the deliveries of ``client_id`` kept in runs."""
    return conn.execute(
        "SELECT coalesce(sum(r.last_seq - coalesce(h.first_seq, r.base_seq) + 1), 0) "
        "FROM delivery_runs r LEFT JOIN delivery_run_heads h "
        "ON h.client_id = r.client_id AND h.last_seq = r.last_seq "
        "WHERE r.client_id = ?", (client_id,)).fetchone()[0]


def trim_client(conn: sqlite3.Connection, client_id: str, limit: int) -> int:
    """Keep the ``limit`` newest deliveries of ``client_id`` (rows and
    runs); the oldest go, whatever their state.

    :returns: the number removed."""
    (rows,) = conn.execute("SELECT count(*) FROM deliveries WHERE client_id = ?",
                           (client_id,)).fetchone()
    excess = rows + count_runs(conn, client_id) - limit
    if excess <= 0:
        return 0
    removed = 0
    parts = conn.execute(
        "SELECT seq, seq, NULL FROM deliveries WHERE client_id = ? UNION ALL "
        "SELECT coalesce(h.first_seq, r.base_seq), r.last_seq, r.base_seq FROM delivery_runs r "
        "LEFT JOIN delivery_run_heads h ON h.client_id = r.client_id "
        "AND h.last_seq = r.last_seq WHERE r.client_id = ? ORDER BY 1",
        (client_id, client_id)).fetchall()
    cut_below = None  # the rows of deliveries up to it go
    for low, high, base in parts:
        if removed >= excess:
            break
        if base is None:  # a row
            cut_below = low
            removed += 1
            continue
        size = high - low + 1
        if removed + size <= excess:
            drop_run(conn, client_id, high, low != base)
            removed += size
        else:
            take = excess - removed
            move_head(conn, client_id, high, low + take)
            removed += take
    if cut_below is not None:
        conn.execute("DELETE FROM deliveries WHERE client_id = ? AND seq <= ?",
                     (client_id, cut_below))
    return removed


def run_deliveries_of(headers: list, data: bytes) -> list | None:
    """In the reactor thread: the deliveries of the runs read by
    :func:`load_runs`, in order.

    :returns: a :class:`~tbmq.model.StoredDelivery` per delivery kept (queued,
        no packet id), or None when the runs are not in order or their
        ``messages`` do not come apart as one message per order key.
    :raises tbmq.errors.RecordEncodingError: for a message that is not a
        ``msg`` record of a known version."""
    out: list = []
    if not headers:
        return out
    lasts = [header[1] for header in headers]
    if lasts != sorted(lasts):  # (an aggregate's order is not SQLite's promise)
        return None
    extend = out.extend
    queued = DeliveryState.QUEUED
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, use_list=False,
                                max_buffer_size=max(len(data), 1 << 20))
    unpacker.feed(data)
    for first, last, base, qos, retain, ids in headers:
        try:
            for _ in range(first - base):
                unpacker.skip()
            arrays = list(islice(unpacker, last - first + 1))
        except Exception:
            return None
        if len(arrays) != last - first + 1:
            return None
        flag = retain == 1
        sids = () if ids is None else tuple(json.loads(ids))
        made = plain_run_deliveries(arrays, first, qos, flag, sids)
        if made is None:  # not all plain: each message as the codec reads it
            made = map(StoredDelivery, count(first), MESSAGE.decode_arrays(arrays),
                       repeat(qos), repeat(flag), repeat(sids), repeat(None), repeat(queued))
        extend(made)
    try:  # nothing may be left over
        unpacker.skip()
    except msgpack.OutOfData:
        return out
    return None


#: the properties of every message of a plain run (none): one empty dict for
#: all, never written (a message is never changed once made; whoever adds
#: properties for a client copies them first, :func:`tbmq.broker.sending.
#: encode_for`): no container per message of a page kept until its PUBACK
_NO_PROPERTIES: dict = {}


def plain_run_deliveries(arrays: list, first: int, qos: int, retain: bool,
                         subscription_ids: tuple) -> list | None:
    """In the reactor thread: the queued deliveries ``first``, ``first +
    1``... of a run whose ``msg`` arrays msgpack read (``arrays``, tuples),
    each delivery and its message made field by field in one loop, with no
    call per message (what :func:`run_deliveries_of` makes of a page is most
    of the reactor's work of a drain before its first send).  Each message
    is what :meth:`MESSAGE.decode_arrays <tbmq.cluster.record_codec.
    RecordCodec.decode_arrays>` makes of its array, but its ``wire`` is None:
    it goes to the client only, so its array is not kept (one container
    less per message of a page for the garbage collector to walk, and its
    memory), and its empty properties are one dict shared by all
    (:data:`_NO_PROPERTIES`).

    :param qos: the run's QoS (1 or 2), ``retain`` its RETAIN flag and
        ``subscription_ids`` its subscription identifiers, shared by its
        deliveries.
    :returns: the deliveries, in order; or None when an array is not a
        version 1 ``msg`` array of plain fields without properties (the
        codec then reads them all).
    """
    out: list = []
    append = out.append
    new = object.__new__
    queued = DeliveryState.QUEUED
    no_properties = _NO_PROPERTIES
    seq = first
    for obj in arrays:
        if type(obj) is not tuple or len(obj) != 10:
            return None
        tag, version, topic, payload, mqos, mretain, props, publisher, received_at, expires_at = obj
        if not (props is None and tag == "msg" and version == 1 and type(version) is int
                and type(topic) is str and type(payload) is bytes and type(mqos) is int
                and 0 <= mqos <= 2 and type(mretain) is bool and type(publisher) is str
                and type(received_at) is float
                and (expires_at is None or type(expires_at) is float)):
            return None
        m = new(Message)  # every field set (tests/unit/test_delivery_runs.py)
        m.topic = topic
        m.payload = payload
        m.qos = mqos
        m.retain = mretain
        m.properties = no_properties
        m.publisher = publisher
        m.received_at = received_at
        m.expires_at = expires_at
        m.wire = m.template = None
        d = new(StoredDelivery)
        d.seq = seq
        d.message = m
        d.qos = qos
        d.retain = retain
        d.subscription_ids = subscription_ids
        d.packet_id = None
        d.state = queued
        append(d)
        seq += 1
    return out
