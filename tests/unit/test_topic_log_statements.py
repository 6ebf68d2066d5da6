"""The SQLite topic log writes a batch's records of compacted topics (a
persistent session's records of its CONNECT and disconnect) in a few multi-row
statements, not one ``executemany`` step per record: each step lets go of
the GIL and waits for it again (:mod:`tbmq.backends.sqlite_bulk`).  The
rows left are those of the records written one by one.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from tbmq.backends.sqlite_bulk import CHUNK_ROWS
from tbmq.backends.sqlite_runner import SQLiteRunner
from tbmq.backends.sqlite_topic_log import SQLiteTopicLog, TopicLogWrites
from tests.unit.test_stores import SyncReactor, SyncThreadPool, fired

HEADERS = (("tbmq-kind", b"marker"),)


def _log(path: str) -> SQLiteTopicLog:
    log = SQLiteTopicLog(SQLiteRunner(path, SyncReactor(), SyncThreadPool()))
    fired(log.start())
    return log


def _records(topic: str, keys: int, first: int, value: bytes) -> list[tuple]:
    return [(topic, 0, first + i, f"client-{i}", value + b"%d" % i,
             HEADERS if i % 2 else (), True) for i in range(keys)]


def _write(path: str, records: list[tuple]) -> list[str]:
    """Write ``records`` as one merged batch on a connection of our own.

    :returns: the first word of each DELETE and INSERT statement SQLite
        ran (one per step of ``executemany``)."""
    writes = TopicLogWrites()
    for record in records:
        writes.append(record)
    conn = sqlite3.connect(path, isolation_level=None)
    ran: list[str] = []
    conn.set_trace_callback(ran.append)
    try:
        conn.execute("BEGIN IMMEDIATE")
        writes(conn)
        conn.execute("COMMIT")
    finally:
        conn.close()
    return [s.split(" ", 1)[0] for s in ran if s.startswith(("DELETE", "INSERT"))]


def test_a_batch_of_compacted_records_is_a_few_statements_and_keeps_the_last_values(
        tmp_path: Any) -> None:
    path = str(tmp_path / "tbmq.sqlite3")
    fired(_log(path).stop())  # the schema
    keys = CHUNK_ROWS * 2 + 5  # three chunks of keys per topic
    first = _records("s", keys, 0, b"old") + _records("u", 7, 0, b"old")
    # per topic one DELETE of the keys' stored records per chunk of keys,
    # then the rows, a chunk per INSERT: not one statement per record
    assert _write(path, first) == ["DELETE"] * 4 + ["INSERT"] * 3
    again = _records("s", keys, keys, b"new")
    assert _write(path, again) == ["DELETE"] * 3 + ["INSERT"] * 3

    log = _log(path)
    try:
        records, _ = fired(log.load())
    finally:
        fired(log.stop())
    by_key = {(r[0], r[3]): (r[2], r[4], r[5]) for r in records}
    assert len(records) == len(by_key) == keys + 7  # one record per compacted key
    for i in range(keys):
        assert by_key[("s", f"client-{i}")] == (keys + i, b"new%d" % i,
                                                HEADERS if i % 2 else ())
    for i in range(7):
        assert by_key[("u", f"client-{i}")] == (i, b"old%d" % i, HEADERS if i % 2 else ())
