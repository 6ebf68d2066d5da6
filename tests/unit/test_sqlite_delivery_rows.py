"""The rows of the embedded device store (schema version 5 and later): a delivery's
message in one column (:func:`tbmq.backends.sqlite_schema.message_blob`),
encoded once for every subscriber of the message, in a table whose only
B-tree is its primary key; and the migration of a file of version 3 or 4,
whose deliveries had a column per field."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from tbmq.backends import sqlite_schema
from tbmq.backends.sqlite_deliveries import SHARED_BLOB_MAX
from tbmq.backends.sqlite_schema import SCHEMA_VERSION, message_blob, message_of_blob
from tbmq.errors import RecordEncodingError
from tbmq.model import DeliveryState, StoredDelivery
from tests.unit.test_sqlite_store import manual_store, sync_store
from tests.unit.test_stores import delivery, failure_of, fired, message, rich_message

#: a version 4 row: client_id, seq, topic, payload, message_qos,
#: message_retain, properties, publisher, received_at, expires_at, qos,
#: retain, subscription_ids, packet_id, state
_V4_INSERT = "INSERT INTO deliveries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


def _v4_row(client_id: str, d: StoredDelivery) -> tuple:
    m = d.message
    return (client_id, d.seq, *sqlite_schema.message_columns(m), d.qos, 1 if d.retain else 0,
            sqlite_schema.ids_json(d.subscription_ids), d.packet_id, int(d.state))


def _old_file(path: Any, version: int, rows: list[tuple]) -> None:
    """Write an embedded store file of schema ``version`` (3 or 4): the
    deliveries a column per field (and at 3 the index that version 4
    dropped)."""
    conn = sqlite3.connect(path)
    try:
        conn.executescript(sqlite_schema._STORE_TABLES + sqlite_schema._TOPIC_LOG_V2)
        if version == 3:
            conn.execute("CREATE INDEX deliveries_client_id_seq ON deliveries (client_id, seq)")
        conn.execute("CREATE TABLE tbmq_schema (name TEXT PRIMARY KEY, version INTEGER NOT NULL)")
        conn.execute("INSERT INTO tbmq_schema VALUES ('embedded', ?)", (version,))
        conn.executemany(_V4_INSERT, rows)
        conn.execute(f"PRAGMA user_version={version}")
        conn.commit()
    finally:
        conn.close()


def _old_deliveries() -> list[tuple[str, StoredDelivery]]:
    return [
        ("c", delivery(2, message=rich_message(), qos=2, retain=True, subscription_ids=(3, 9),
                       packet_id=11, state=DeliveryState.SENT)),
        ("c", delivery(1)),
        ("d", delivery(1, message=message("x", b"", qos=0), qos=0)),
        ("c", delivery(3, state=DeliveryState.RELEASED, packet_id=12)),
    ]


@pytest.mark.parametrize("version", [3, 4])
def test_an_old_file_has_its_deliveries_rewritten_with_the_message_in_one_column(
        tmp_path, version):
    """Version 3 or 4 → 5: every delivery is read back as it was stored
    (message fields, properties, subscription identifiers, packet id,
    state), in seq order, from a table of eight columns without rowid whose
    primary key serves the read (no sort, no other index)."""
    old = _old_deliveries()
    _old_file(tmp_path / "db.sqlite", version, [_v4_row(c, d) for c, d in old])
    store = sync_store(tmp_path)
    fired(store.start())
    for client_id in ("c", "d"):
        expected = sorted((d for c, d in old if c == client_id), key=lambda d: d.seq)
        assert fired(store.deliveries.load(client_id)) == expected
    fired(store.stop())
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    try:
        assert dict(conn.execute("SELECT name, version FROM tbmq_schema"))["embedded"] == SCHEMA_VERSION == 7
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
        columns = [row[1] for row in conn.execute("PRAGMA table_info(deliveries)")]
        assert columns == ["client_id", "seq", "message", "qos", "retain", "subscription_ids",
                           "packet_id", "state"]
        (sql,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'deliveries'").fetchone()
        assert sql.rstrip().endswith("WITHOUT ROWID")
        tables = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "deliveries_v4" not in tables
        indexes = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'deliveries'")}
        assert indexes == set()  # the table is its primary key's B-tree
        plan = " ".join(str(row[-1]) for row in conn.execute(
            "EXPLAIN QUERY PLAN SELECT seq FROM deliveries WHERE client_id = 'c' ORDER BY seq"))
        assert "PRIMARY KEY" in plan and "TEMP B-TREE" not in plan, plan
        # the message column is the msg record of the bus, as the store writes it
        (blob,) = conn.execute(
            "SELECT message FROM deliveries WHERE client_id = 'c' AND seq = 2").fetchone()
        assert message_of_blob(blob) == rich_message() and blob == message_blob(rich_message())
    finally:
        conn.close()


def test_a_stored_message_that_cannot_be_rewritten_fails_the_open_and_leaves_the_file(tmp_path):
    """A row of version 4 whose message is no ``msg`` record (a QoS of 7):
    the open fails, and the file is still version 4 with its rows."""
    bad = list(_v4_row("c", delivery(1)))
    bad[4] = 7  # message_qos
    _old_file(tmp_path / "db.sqlite", 4, [_v4_row("c", delivery(2)), tuple(bad)])
    store = sync_store(tmp_path)
    failure = failure_of(store.start())
    assert failure.check(RecordEncodingError) and "qos" in str(failure.value)
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    try:
        assert dict(conn.execute("SELECT name, version FROM tbmq_schema"))["embedded"] == 4
        assert conn.execute("SELECT count(*) FROM deliveries").fetchone() == (2,)
        assert len([row for row in conn.execute("PRAGMA table_info(deliveries)")]) == 15
    finally:
        conn.close()


def test_one_message_queued_for_several_sessions_is_encoded_once(tmp_path):
    """The deliveries of one message to several persistent sessions (adds
    of one turn) carry the same bytes of its encoding, not one encoding
    each; another message gets its own."""
    store, pool = manual_store(tmp_path)
    store.start()
    pool.run_one()  # open
    shared, other = message("a/b", b"p", qos=1), message("a/b", b"p", qos=1)
    store.deliveries.add("x", [StoredDelivery(1, shared, 1)])  # handed to the thread
    store.deliveries.add("a", [StoredDelivery(1, shared, 1)])
    store.deliveries.add("b", [StoredDelivery(1, shared, 0), StoredDelivery(2, other, 1)])
    writes = store.runner._pending[0][0]
    first, second = writes.puts[("a", 1)], writes.puts[("b", 1)]
    assert len(first) == sqlite_schema.DELIVERY_COLUMNS == 8
    assert first[2] is second[2] and message_of_blob(first[2]) == shared
    assert writes.puts[("b", 2)][2] is not first[2]
    assert (first[3], second[3]) == (1, 0)  # the delivery's own QoS beside it


def test_a_delivery_whose_message_cannot_be_encoded_fails_its_add(tmp_path):
    """A payload that is not bytes cannot be written: the add fails at once
    and nothing is stored."""
    store = sync_store(tmp_path)
    fired(store.start())
    failure = failure_of(store.deliveries.add("c", [delivery(1, message=message("t", "text"))]))
    assert failure is not None
    assert fired(store.deliveries.load("c")) == []
    fired(store.stop())



def test_a_page_of_messages_is_unpacked_in_one_pass_as_one_at_a_time_would():
    """:func:`messages_of_blobs` gives what :func:`message_of_blob` gives
    each (properties, expiry, retain, empty payload), in order."""
    messages = [rich_message(), message("a", b"", qos=0), message("b/c", b"\x00" * 70000, qos=1),
                message("d", b"x", qos=2, retain=True, expires_at=5.5)]
    blobs = [message_blob(m) for m in messages]
    assert sqlite_schema.messages_of_blobs(blobs) == messages == [
        message_of_blob(b) for b in blobs]
    assert sqlite_schema.messages_of_blobs([]) == []


@pytest.mark.parametrize("bad", [
    b"\x93\x01\x02\x03",  # an array, not a msg record
    "two records",  # one row holding two: the page does not come apart row by row
    "truncated",
])
def test_a_page_with_a_row_that_is_no_message_fails_as_that_row_alone_would(bad):
    good = message_blob(message("a", b"1"))
    if bad == "two records":
        bad = good + good
    elif bad == "truncated":
        bad = good[:-3]
    with pytest.raises(RecordEncodingError):
        message_of_blob(bad)
    with pytest.raises(RecordEncodingError):
        sqlite_schema.messages_of_blobs([good, bad, good])


def test_a_large_message_is_not_kept_for_the_next_subscriber(tmp_path):
    """A message encoded to more than SHARED_BLOB_MAX bytes is encoded again
    for the next session (the store does not hold it after its add); its
    rows are still the same message."""
    store, pool = manual_store(tmp_path)
    store.start()
    pool.run_one()  # open
    big = message("a/b", b"x" * (SHARED_BLOB_MAX + 1), qos=1)
    store.deliveries.add("x", [StoredDelivery(1, big, 1)])  # handed to the thread
    store.deliveries.add("a", [StoredDelivery(1, big, 1)])
    store.deliveries.add("b", [StoredDelivery(1, big, 1), StoredDelivery(2, big, 1)])
    writes = store.runner._pending[0][0]
    blobs = [writes.puts[key][2] for key in (("a", 1), ("b", 1), ("b", 2))]
    assert blobs[0] is not blobs[1] and blobs[0] == blobs[1] == blobs[2]
    assert message_of_blob(blobs[2]) == big


def _page_store(tmp_path):
    store = sync_store(tmp_path)
    assert fired(store.start()) is None
    base = 1_790_000_000_000_000_000  # nanoseconds: next_seq's keys
    stored = [
        delivery(base + 1, message=rich_message(), qos=2, retain=True, subscription_ids=(3, 9),
                 packet_id=11, state=DeliveryState.SENT),
        delivery(base + 2, message=message("a", b"\x00\xff\xfe\x00", qos=1)),
        delivery(base + 3, message=message("b/c", b"", qos=0), qos=0),
        delivery(base + 4, state=DeliveryState.RELEASED, packet_id=12),
        delivery(base + 5, message=message("d", b"x" * 70000, qos=1, expires_at=5.5)),
    ]
    fired(store.deliveries.add("c", stored))
    fired(store.deliveries.add("other", [delivery(base + 2)]))
    return store, stored, base


def test_a_page_is_one_step_of_one_statement_and_gives_every_column(tmp_path):
    """A page of ``load`` is one aggregate SELECT (one step: the database
    thread takes the GIL again once, not per row); its messages (binary
    payloads, properties), seqs, identifiers, packet ids and states are
    the rows'."""
    store, stored, base = _page_store(tmp_path)
    statements: list[str] = []
    store.runner._conn.set_trace_callback(statements.append)
    assert fired(store.deliveries.load("c")) == stored
    assert fired(store.deliveries.load("c", after_seq=base + 1, limit=3)) == stored[1:4]
    assert fired(store.deliveries.load("c", after_seq=base + 5)) == []
    selects = [s for s in statements if s.startswith("SELECT") and "json_each('[1]')" not in s
               and "FROM delivery_runs" not in s]
    assert len(selects) == 3 and all("group_concat(message, '')" in s for s in selects)
    # and one look-up of the runs per page (none here)
    assert len([s for s in statements if "FROM delivery_runs" in s]) == 3
    # the rows as queued at QoS 1 (no identifiers, packet id, RETAIN; QUEUED)
    # are their seqs alone in the page's JSON array, the others whole
    from tbmq.backends.sqlite_deliveries import _PAGE  # noqa: PLC0415

    _, columns, _ = store.runner._conn.execute(_PAGE.format(where="client_id = ?"),
                                               ["c", -1]).fetchone()
    plain = [d.seq for d in stored if d.qos == 1 and not d.retain and not d.subscription_ids
             and d.packet_id is None and d.state is DeliveryState.QUEUED]
    assert plain and [row for row in json.loads(columns) if type(row) is int] == plain
    store.stop()


def test_a_page_without_json_functions_is_read_row_by_row_alike(tmp_path, monkeypatch):
    from tbmq.backends import sqlite_bulk  # noqa: PLC0415

    store, stored, base = _page_store(tmp_path)
    monkeypatch.setattr(sqlite_bulk, "_JSON", [False])
    statements: list[str] = []
    store.runner._conn.set_trace_callback(statements.append)
    assert fired(store.deliveries.load("c", after_seq=base + 1, limit=3)) == stored[1:4]
    assert not [s for s in statements if "group_concat" in s]
    store.stop()


@pytest.mark.parametrize("bad", ["two records", "truncated"])
def test_a_page_whose_messages_do_not_come_apart_fails_as_its_bad_row_would(tmp_path, bad):
    store, stored, base = _page_store(tmp_path)
    good = message_blob(message("a", b"1"))
    blob = good + good if bad == "two records" else good[:-3]
    store.runner._conn.execute("UPDATE deliveries SET message = ? WHERE client_id = 'c' AND seq = ?",
                               (blob, base + 2))
    with pytest.raises(RecordEncodingError):
        fired(store.deliveries.load("c"))
    assert fired(store.deliveries.load("c", after_seq=base + 2)) == stored[2:]
    store.stop()


def test_a_page_whose_aggregates_come_in_another_order_is_put_in_seq_order():
    """SQLite does not promise the order of an aggregate's rows: the two
    aggregates of a page (stepped through the same rows) are put in seq
    order together."""
    import json  # noqa: PLC0415

    from tbmq.backends.sqlite_deliveries import _deliveries_of_page  # noqa: PLC0415

    messages = [message("a", b"1"), message("b", b"2"), message("c", b"3"), message("d", b"4")]
    # a row as queued at QoS 1 is its seq alone
    rows = [[3, 1, 0, None, None, 0], [1, 1, 1, "[4]", 7, 1], 4, [2, 0, 0, None, None, 0]]
    page = _deliveries_of_page(b"".join(message_blob(m) for m in messages), json.dumps(rows), 4)
    assert page == [StoredDelivery(1, messages[1], 1, True, (4,), 7, DeliveryState.SENT),
                    StoredDelivery(2, messages[3], 0),
                    StoredDelivery(3, messages[0], 1),
                    StoredDelivery(4, messages[2], 1)]
    assert _deliveries_of_page(None, "[]", 0) == []


def test_a_page_too_big_for_one_value_is_read_row_by_row(tmp_path):
    """The page's messages as one blob may pass the library's largest value
    (SQLITE_MAX_LENGTH, 1e9 bytes by default): the rows are then read one
    by one, as before."""
    store, stored, base = _page_store(tmp_path)
    conn = store.runner._conn
    (largest,) = conn.execute("SELECT max(length(message)) FROM deliveries").fetchone()
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, largest + 1)  # each row fits, not the page
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    assert fired(store.deliveries.load("c")) == stored
    selects = [s for s in statements if s.startswith("SELECT") and "json_each('[1]')" not in s
               and "FROM delivery_runs" not in s]
    assert len(selects) == 2 and "group_concat" in selects[0] and "group_concat" not in selects[1]
    store.stop()


def test_bytes_and_none_bind_through_registered_adapters(tmp_path):
    """An open store file has adapters for ``bytes`` and ``None`` in
    ``sqlite3.adapters`` (each value bound without the adapter protocol's
    misses, :func:`tbmq.backends.sqlite_bulk.bind_as_is`); the values are
    stored as before: a BLOB and NULLs, read back equal."""
    store = sync_store(tmp_path)
    fired(store.start())
    protocol = sqlite3.PrepareProtocol
    assert (bytes, protocol) in sqlite3.adapters and (type(None), protocol) in sqlite3.adapters
    stored = delivery(1, message=message("t", b"\x00\xffpayload"))
    fired(store.deliveries.add("c", [stored]))
    conn = store.runner._conn
    assert conn.execute("SELECT typeof(message), typeof(subscription_ids), typeof(packet_id) "
                        "FROM deliveries").fetchone() == ("blob", "null", "null")
    assert fired(store.deliveries.load("c")) == [stored]
    store.stop()
