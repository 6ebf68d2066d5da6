"""The contract suite of :class:`~tbmq.interfaces.ITopicLog`, run against
the memory and the SQLite topic logs, then what only SQLite shows: offsets
and records survive a reopen, a Deferred fires after the COMMIT, writes
accepted while the thread is busy are merged into one operation and still
leave the rows that the calls one by one would leave, and a database of
schema 1 gains the topic log, with its sessions in it.

As in ``test_stores.py``, the SQLite log runs on a synchronous reactor and
thread pool here, and on a hand-driven pool (:class:`ManualThreadPool`)
where the queue matters.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from zope.interface.verify import verifyObject

from tbmq.backends.memory import MemoryTopicLog
from tbmq.backends.sqlite import SQLiteStore
from tbmq.backends.sqlite_schema import SCHEMA_VERSION
from tbmq.backends.sqlite_runner import SQLiteRunner
from tbmq.backends.sqlite_schema import SCHEMA_VERSION
from tbmq.backends.sqlite_topic_log import SQLiteTopicLog, TopicLogWrites
from tbmq.backends.topic_records import RecordRun
from tbmq.cluster.records import UNCLAIMED, SubscriptionsRecord
from tbmq.cluster.topics import TopicCatalogue
from tbmq.errors import BackendError
from tbmq.interfaces import ITopicLog
from tbmq.model import ClientType, SubscriptionOptions
from tests.helpers import TABLES_V1
from tests.unit.test_stores import (
    ManualThreadPool,
    SyncReactor,
    SyncThreadPool,
    failure_of,
    fired,
)

# -- backends -------------------------------------------------------------------------


class MemoryBackend:
    durable = False

    def __init__(self, tmp_path: Any) -> None:
        pass

    def open(self) -> Any:
        log = MemoryTopicLog()
        fired(log.start())
        return log

    def close(self, log: Any) -> None:
        fired(log.stop())


class SQLiteBackend:
    durable = True

    def __init__(self, tmp_path: Any) -> None:
        self.path = str(tmp_path / "data" / "tbmq.sqlite3")

    def open(self) -> Any:
        runner = SQLiteRunner(self.path, SyncReactor(), SyncThreadPool())
        log = SQLiteTopicLog(runner)
        fired(log.start())
        return log

    def close(self, log: Any) -> None:
        fired(log.stop())


BACKENDS = {"memory": MemoryBackend, "sqlite": SQLiteBackend}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: Any, tmp_path: Any):
    return BACKENDS[request.param](tmp_path)


@pytest.fixture(params=sorted(name for name, cls in BACKENDS.items() if cls.durable))
def durable_backend(request: Any, tmp_path: Any):
    return BACKENDS[request.param](tmp_path)


@pytest.fixture
def log(backend: Any):
    opened = backend.open()
    yield opened
    backend.close(opened)


def rec(topic: str, partition: int, offset: int, key: str | None = "k",
        value: bytes | None = b"v", headers: tuple = (), compacted: bool = False) -> tuple:
    """A record as ``append`` takes it."""
    return (topic, partition, offset, key, value, headers, compacted)


def stored(record: tuple) -> tuple:
    """The record as ``load`` gives it back."""
    return record[:6]


def records_of(log: Any) -> list:
    return fired(log.load())[0]


def offsets_of(log: Any) -> dict:
    return fired(log.load())[1]


# -- the contract ------------------------------------------------------------------------


def test_provides_the_interface(log):
    assert verifyObject(ITopicLog, log)


def test_empty(log):
    assert fired(log.load()) == ([], {})


def test_append_then_load_in_order(log):
    headers = (("trace", b"\x00\xff"), ("ü", b""), ("trace", b"2"))
    batch = [
        rec("tbmq.msg.app.c", 0, 1, "c", b"second"),
        rec("tbmq.msg.app.c", 0, 0, "c", b"first", headers),
        rec("tbmq.client.session", 1, 0, "x", b"\x00binary\xff"),
        rec("tbmq.msg.app.c", 1, 0, None, None),  # no key, a null value: kept
    ]
    assert fired(log.append(batch)) is None
    assert fired(log.append([rec("tbmq.client.session", 0, 5, "y", b"y")])) is None
    assert records_of(log) == [
        stored(rec("tbmq.client.session", 0, 5, "y", b"y")),
        stored(rec("tbmq.client.session", 1, 0, "x", b"\x00binary\xff")),
        stored(rec("tbmq.msg.app.c", 0, 0, "c", b"first", headers)),
        stored(rec("tbmq.msg.app.c", 0, 1, "c", b"second")),
        stored(rec("tbmq.msg.app.c", 1, 0, None, None)),
    ]
    (_, _, _, _, value, got_headers) = records_of(log)[2]
    assert isinstance(value, bytes) and got_headers == headers


def test_a_plain_topic_keeps_every_record_of_a_key(log):
    fired(log.append([rec("t", 0, 0, "k", b"1"), rec("t", 0, 1, "k", b"2"),
                      rec("t", 0, 2, "k", None)]))
    assert [r[4] for r in records_of(log)] == [b"1", b"2", None]


def test_the_same_position_replaces(log):
    fired(log.append([rec("t", 0, 0, "a", b"old")]))
    fired(log.append([rec("t", 0, 0, "b", b"new")]))
    assert records_of(log) == [stored(rec("t", 0, 0, "b", b"new"))]


def test_empty_append(log):
    assert fired(log.append([])) is None
    assert records_of(log) == []


def test_malformed_records_store_nothing(log):
    good = rec("t", 0, 0)
    for bad in (
        rec("t", 0, 1, value="text"),
        rec("t", "0", 1),
        rec("t", 0, 1, key=5),
        rec("t", 0, 1, headers=(("h", "not bytes"),)),
        ("t", 0, 1),
    ):
        failure = failure_of(log.append([good, bad]))
        assert failure.check(TypeError, ValueError)
    assert records_of(log) == []


def test_commit(log):
    assert fired(log.commit("g1", "t", 0, 5)) is None
    fired(log.commit("g1", "t", 1, 2))
    fired(log.commit("g2", "t", 0, 1))
    fired(log.commit("g1", "u", 0, 9))
    fired(log.commit("g1", "t", 0, 7))  # the last commit wins
    assert offsets_of(log) == {("g1", "t", 0): 7, ("g1", "t", 1): 2, ("g2", "t", 0): 1,
                               ("g1", "u", 0): 9}


def test_truncate(log):
    fired(log.append([rec("t", p, o) for p in (0, 1) for o in range(4)]
                     + [rec("u", 0, o) for o in range(2)]))
    fired(log.commit("g", "t", 0, 3))
    assert fired(log.truncate("t", 0, 3)) is None
    assert [(r[0], r[1], r[2]) for r in records_of(log)] == (
        [("t", 0, 3)] + [("t", 1, o) for o in range(4)] + [("u", 0, 0), ("u", 0, 1)])
    assert offsets_of(log) == {("g", "t", 0): 3}
    fired(log.truncate("t", 0, 100))
    fired(log.truncate("nothing", 0, 5))
    assert [(r[0], r[1]) for r in records_of(log)].count(("t", 0)) == 0


def test_truncate_reaches_compacted_records(log):
    fired(log.append([rec("c", 0, 0, "a", compacted=True), rec("c", 0, 1, "b", compacted=True)]))
    fired(log.truncate("c", 0, 1))
    assert records_of(log) == [stored(rec("c", 0, 1, "b"))]
    # the truncated key is gone: a new record of it is simply stored
    fired(log.append([rec("c", 0, 2, "a", b"again", compacted=True)]))
    assert [r[3:5] for r in records_of(log)] == [("b", b"v"), ("a", b"again")]


def test_delete_topic(log):
    fired(log.append([rec("t", 0, 0), rec("t", 1, 0), rec("u", 0, 0)]))
    fired(log.append([rec("c", 0, 0, "k", compacted=True)]))
    fired(log.commit("g", "t", 0, 1))
    fired(log.commit("g", "u", 0, 1))
    assert fired(log.delete_topic("t")) is None
    fired(log.delete_topic("c"))
    fired(log.delete_topic("unknown"))
    assert records_of(log) == [stored(rec("u", 0, 0))]
    assert offsets_of(log) == {("g", "u", 0): 1}
    # a compacted key of a deleted topic is not remembered
    fired(log.append([rec("c", 0, 3, "k", b"new", compacted=True)]))
    assert stored(rec("c", 0, 3, "k", b"new")) in records_of(log)


def test_compacted_keeps_the_last_value_per_key(log):
    fired(log.append([
        rec("s", 0, 0, "a", b"a1", compacted=True),
        rec("s", 0, 1, "b", b"b1", compacted=True),
        rec("s", 0, 2, "a", b"a2", compacted=True),
    ]))
    fired(log.append([rec("s", 1, 0, "c", b"c1", compacted=True),
                      rec("s", 0, 3, "b", b"b2", (("h", b"1"),), compacted=True)]))
    assert records_of(log) == [
        stored(rec("s", 0, 2, "a", b"a2")),
        stored(rec("s", 0, 3, "b", b"b2", (("h", b"1"),))),
        stored(rec("s", 1, 0, "c", b"c1")),
    ]


def test_compaction_is_per_topic(log):
    fired(log.append([rec("s", 0, 0, "a", b"s", compacted=True),
                      rec("t", 0, 0, "a", b"t", compacted=True)]))
    fired(log.append([rec("s", 0, 1, "a", b"s2", compacted=True)]))
    assert records_of(log) == [stored(rec("s", 0, 1, "a", b"s2")), stored(rec("t", 0, 0, "a", b"t"))]


def test_a_tombstone_removes_the_key(log):
    fired(log.append([rec("s", 0, 0, "a", b"a1", compacted=True),
                      rec("s", 0, 1, "b", b"b1", compacted=True)]))
    fired(log.append([rec("s", 0, 2, "a", None, compacted=True)]))
    assert records_of(log) == [stored(rec("s", 0, 1, "b", b"b1"))]
    fired(log.append([rec("s", 0, 3, "nobody", None, compacted=True)]))  # nothing to remove
    fired(log.append([rec("s", 0, 4, "a", b"a2", compacted=True)]))
    assert records_of(log) == [stored(rec("s", 0, 1, "b", b"b1")), stored(rec("s", 0, 4, "a", b"a2"))]


def test_a_tombstone_in_the_same_call(log):
    fired(log.append([rec("s", 0, 0, "a", b"a1", compacted=True),
                      rec("s", 0, 1, "a", None, compacted=True),
                      rec("s", 0, 2, None, b"no key", compacted=True)]))
    assert records_of(log) == [stored(rec("s", 0, 2, None, b"no key"))]


def test_write_is_append_then_commits_then_truncations(log):
    fired(log.append([rec("t", 0, o) for o in range(2)]))
    assert fired(log.write([rec("t", 0, o) for o in range(2, 5)] + [rec("u", 0, 0)],
                           {("g", "t", 0): 3, ("g", "u", 0): 1},
                           {("t", 0): 3, ("u", 0): 1})) is None
    # the truncation reaches the records of the same call below it
    assert [(r[0], r[2]) for r in records_of(log)] == [("t", 3), ("t", 4)]
    assert offsets_of(log) == {("g", "t", 0): 3, ("g", "u", 0): 1}
    assert fired(log.write([], {("g", "t", 0): 5}, {})) is None
    assert offsets_of(log) == {("g", "t", 0): 5, ("g", "u", 0): 1}


def test_a_malformed_write_stores_nothing(log):
    failure = failure_of(log.write([rec("t", 0, 0), rec("t", 0, 1, value="text")],
                                   {("g", "t", 0): 1}, {("t", 0): 1}))
    assert failure.check(TypeError, ValueError)
    assert fired(log.load()) == ([], {})


def test_survives_a_restart(durable_backend):
    backend = durable_backend
    log = backend.open()
    fired(log.append([rec("s", 0, 0, "a", b"1", compacted=True), rec("t", 0, 0, None, b"x")]))
    fired(log.commit("g", "t", 0, 1))
    fired(log.commit("g", "t", 0, 2))
    backend.close(log)
    log = backend.open()
    try:
        assert fired(log.load()) == (
            [stored(rec("s", 0, 0, "a", b"1")), stored(rec("t", 0, 0, None, b"x"))],
            {("g", "t", 0): 2})
        # compaction still finds the key stored before the restart
        fired(log.append([rec("s", 0, 1, "a", b"2", compacted=True)]))
        assert records_of(log)[0] == stored(rec("s", 0, 1, "a", b"2"))
    finally:
        backend.close(log)


# -- SQLite ------------------------------------------------------------------------------


def manual_log(tmp_path: Any) -> tuple[SQLiteTopicLog, ManualThreadPool]:
    pool = ManualThreadPool()
    runner = SQLiteRunner(str(tmp_path / "tbmq.sqlite3"), SyncReactor(), pool)
    log = SQLiteTopicLog(runner)
    log.start()
    pool.run_one()  # the open
    return log, pool


def rows_on_disk(path: str) -> list:
    """What another connection sees: only what is committed."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT topic, partition_id, log_offset FROM topic_log "
                            "ORDER BY topic, partition_id, log_offset").fetchall()
    finally:
        conn.close()


def test_the_deferred_fires_after_the_commit(tmp_path):
    log, pool = manual_log(tmp_path)
    appended = log.append([rec("t", 0, 0)])
    committed = log.commit("g", "t", 0, 1)
    assert not appended.called and not committed.called
    assert rows_on_disk(log.runner.path) == []
    pool.run_one()  # the append: handed at once, the thread was idle
    assert fired(appended) is None and not committed.called
    assert rows_on_disk(log.runner.path) == [("t", 0, 0)]
    pool.run_one()  # the commit: the next transaction
    assert fired(committed) is None
    stopped = log.stop()
    pool.run_all()
    assert fired(stopped) is None


def test_a_write_is_one_transaction(tmp_path):
    log, pool = manual_log(tmp_path)
    written = log.write([rec("t", 0, 0), rec("t", 0, 1)], {("g", "t", 0): 1}, {("t", 0): 1})
    assert len(pool.jobs) == 1 and not written.called
    pool.run_one()  # records, commit and truncation: one COMMIT
    assert fired(written) is None and not pool.jobs
    assert rows_on_disk(log.runner.path) == [("t", 0, 1)]
    loaded = log.load()
    pool.run_one()
    assert fired(loaded)[1] == {("g", "t", 0): 1}


def test_writes_while_busy_share_one_operation(tmp_path):
    log, pool = manual_log(tmp_path)
    first = log.append([rec("t", 0, 0), rec("c", 0, 0, "a", b"old", compacted=True)])
    assert len(pool.jobs) == 1  # handed at once: the thread was idle
    calls = [
        log.append([rec("t", 0, 1), rec("t", 0, 2)]),
        log.commit("g", "t", 0, 2),
        log.truncate("t", 0, 2),  # the running batch's row 0 and the merged row 1
        log.append([rec("c", 0, 1, "a", b"new", compacted=True),
                    rec("c", 0, 2, "b", b"b", compacted=True)]),
        log.append([rec("c", 0, 3, "b", None, compacted=True)]),
        log.commit("g", "t", 0, 3),
    ]
    pending = log.runner._pending
    assert len(pending) == 1 and isinstance(pending[0][0], TopicLogWrites)
    writes = pending[0][0]
    assert set(writes.rows) == {("t", 0, 2), ("c", 0, 1)}
    assert writes.dropped_keys == {("c", "a"), ("c", "b")}
    assert writes.truncations == {("t", 0): 2} and writes.offsets == {("g", "t", 0): 3}
    pool.run_one()
    assert fired(first) is None
    assert not any(d.called for d in calls)  # not before their COMMIT
    pool.run_one()
    assert all(fired(d) is None for d in calls)
    loaded = log.load()
    pool.run_one()
    assert fired(loaded) == ([stored(rec("c", 0, 1, "a", b"new")), stored(rec("t", 0, 2))],
                             {("g", "t", 0): 3})


def test_delete_topic_and_load_keep_their_place(tmp_path):
    log, pool = manual_log(tmp_path)
    busy = log.commit("g", "x", 0, 1)  # keeps the thread busy
    log.append([rec("t", 0, 0)])
    seen = log.load()
    deleted = log.delete_topic("t")
    log.append([rec("t", 0, 5)])
    log.commit("g", "t", 0, 6)
    assert len(log.runner._pending) == 4
    pool.run_all()
    assert fired(busy) is None and fired(deleted) is None
    assert fired(seen)[0] == [stored(rec("t", 0, 0))]
    final = log.load()
    pool.run_all()
    assert fired(final) == ([stored(rec("t", 0, 5))], {("g", "x", 0): 1, ("g", "t", 0): 6})


def test_a_failed_open_fails_the_merged_writes(tmp_path):
    (tmp_path / "dir").write_text("not a directory")
    pool = ManualThreadPool()
    log = SQLiteTopicLog(SQLiteRunner(str(tmp_path / "dir" / "db"), SyncReactor(), pool))
    started = log.start()
    lost = log.append([rec("t", 0, 0)])
    pool.run_all()
    failure_of(started)
    failure_of(lost)
    failure_of(log.append([rec("t", 0, 1)])).trap(BackendError)  # stopped now


def test_calls_when_not_running_fail(tmp_path):
    log = SQLiteTopicLog(SQLiteRunner(str(tmp_path / "db"), SyncReactor(), SyncThreadPool()))
    for d in (log.append([rec("t", 0, 0)]), log.commit("g", "t", 0, 1),
              log.truncate("t", 0, 1), log.delete_topic("t"), log.load()):
        failure_of(d).trap(BackendError)


def test_the_embedded_store_has_its_topic_log_on_its_file(tmp_path):
    store = SQLiteStore(str(tmp_path / "tbmq.sqlite3"), reactor=SyncReactor(),
                        threadpool=SyncThreadPool())
    assert verifyObject(ITopicLog, store.topic_log)
    assert store.topic_log.runner is store.runner
    fired(store.topic_log.start())
    fired(store.topic_log.append([rec("t", 0, 0)]))
    fired(store.retained.load_all())  # the other stores run on the same connection
    fired(store.stop())
    assert rows_on_disk(store.path) == [("t", 0, 0)]


def test_a_database_of_schema_1_gains_the_topic_log_with_its_sessions(tmp_path):
    """Versions 1 → 2 → 3 → 4 → 5 in one open: the topic log's tables are
    made, then the session and its subscriptions move there and their
    tables go (then the index that repeated the deliveries' primary key
    goes, then the table of packed rows is made)."""
    path = str(tmp_path / "tbmq.sqlite3")
    conn = sqlite3.connect(path)
    conn.executescript(TABLES_V1 + "INSERT INTO sessions VALUES "
                       "('c', 5, 60, 'DEVICE', NULL);"
                       "INSERT INTO subscriptions VALUES ('c', 'a/+', 1, 1, 0, 2, 7);")
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    store = SQLiteStore(path, reactor=SyncReactor(), threadpool=SyncThreadPool())
    fired(store.start())
    topics = TopicCatalogue()
    (session, subscriptions), offsets = fired(store.topic_log.load())
    assert offsets == {}
    assert session[:4] == (topics.client_session, 0, 0, "c")
    assert subscriptions[:4] == (topics.client_subscriptions, 0, 0, "c")
    info = topics.codec_for(topics.client_session).decode(session[4])
    assert (info.client_id, info.service_id, info.connected, info.persistent,
            info.client_type, info.session_expiry_interval, info.protocol_level,
            info.connected_at, info.disconnected_at, info.will) == (
        "c", UNCLAIMED, False, True, ClientType.DEVICE, 60, 5, None, None, None)
    assert topics.codec_for(topics.client_subscriptions).decode(subscriptions[4]) == \
        SubscriptionsRecord("c", {"a/+": SubscriptionOptions(1, True, False, 2, 7)})
    fired(store.topic_log.append([rec("t", 0, 0)]))
    assert fired(store.topic_log.load())[0][0] == stored(rec("t", 0, 0))  # "t" sorts first
    fired(store.stop())
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert dict(conn.execute("SELECT name, version FROM tbmq_schema")) == {"embedded": SCHEMA_VERSION}
        assert not conn.execute("SELECT name FROM sqlite_master WHERE name IN "
                                "('sessions', 'subscriptions')").fetchall()
        # version 6: the packed rows' table
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = "
                            "'topic_log_packs'").fetchall() == [("topic_log_packs",)]
    finally:
        conn.close()


# -- merged writes leave what the calls one by one leave -------------------------------------

_topics = st.sampled_from(["s", "t"])
_calls = st.one_of(
    st.tuples(st.just("append"), st.lists(st.tuples(
        # the bus keys every record of a compacted topic
        _topics, st.integers(0, 1), st.integers(0, 4), st.sampled_from(["a", "b"]),
        st.sampled_from([None, b"1", b"2"]), st.booleans()), max_size=3)),
    st.tuples(st.just("commit"), st.sampled_from(["g", "h"]), _topics, st.integers(0, 1),
              st.integers(0, 9)),
    st.tuples(st.just("truncate"), _topics, st.integers(0, 1), st.integers(0, 5)),
    st.tuples(st.just("delete_topic"), _topics),
)


def _renumber(calls: list) -> list:
    """Give appended records the offsets the bus gives: each position of a
    ``(topic, partition)`` once, increasing."""
    nxt: dict = {}
    out = []
    for call in calls:
        if call[0] == "append":
            records = []
            for t, p, _, k, v, c in call[1]:
                o = nxt.get((t, p), 0)
                nxt[(t, p)] = o + 1
                records.append((t, p, o, k, v, c))
            call = ("append", records)
        out.append(call)
    return out


def _apply(log: Any, call: tuple) -> Any:
    name, *args = call
    if name == "append":
        # one topic is compacted or not for good: "s" is, "t" is not
        args = [[(t, p, o, k, v, (), t == "s") for t, p, o, k, v, _ in args[0]]]
    return getattr(log, name)(*args)


@settings(max_examples=300, deadline=None)
@given(before=st.lists(_calls, max_size=6), during=st.lists(_calls, max_size=10))
def test_merged_writes_equal_the_calls_one_by_one(before, during):
    """Calls made while the thread is busy are merged (up to a
    ``delete_topic``); the result is what the memory log (each call applied
    at once) holds after the same calls."""
    busy = ("commit", "busy", "x", 0, 0)  # keeps the thread busy while `during` is made
    calls = _renumber(before + during)
    before, during = calls[:len(before)], calls[len(before):]
    reference = MemoryTopicLog()
    for call in before + [busy] + during:
        _apply(reference, call)
    pool = ManualThreadPool()
    log = SQLiteTopicLog(SQLiteRunner(":memory:", SyncReactor(), pool))
    log.start()
    pool.run_all()
    for call in before:
        _apply(log, call)
        pool.run_all()
    results = [_apply(log, call) for call in [busy] + during]
    pool.run_all()
    assert all(fired(d) is None for d in results)
    loaded = log.load()
    pool.run_all()
    assert fired(loaded) == fired(reference.load())
    stopped = log.stop()
    pool.run_all()
    fired(stopped)


def test_plain_rows_and_full_rows_in_one_write(tmp_path):
    """A record without headers in a topic that is not compacted is merged
    as five columns (the common row, bound as five); one with headers and
    a compacted one as seven; one transaction stores both kinds, and a
    plain record written over a full one at the same position replaces it
    (and the reverse)."""
    log, pool = manual_log(tmp_path)
    first = log.append([rec("t", 0, 0)])
    headers = (("h", b"\x01"),)
    log.append([rec("t", 0, 1), rec("t", 0, 2, headers=headers),
                rec("c", 0, 0, "a", b"kept", compacted=True)])
    log.append([rec("t", 0, 1, value=b"again", headers=headers), rec("t", 0, 2, value=b"plain")])
    writes = log.runner._pending[0][0]
    assert {position: len(row) for position, row in writes.rows.items()} == {
        ("t", 0, 1): 7, ("t", 0, 2): 5, ("c", 0, 0): 7}
    pool.run_one()
    pool.run_one()
    assert fired(first) is None
    loaded = log.load()
    pool.run_one()
    assert fired(loaded)[0] == [
        stored(rec("c", 0, 0, "a", b"kept", compacted=True)),
        stored(rec("t", 0, 0)),
        stored(rec("t", 0, 1, value=b"again", headers=headers)),
        stored(rec("t", 0, 2, value=b"plain")),
    ]


def test_plain_rows_go_in_multi_row_statements(tmp_path):
    """150 plain records of one write: three INSERT statements (64 rows at
    most each, sqlite_bulk.CHUNK_ROWS), not one step per row, and each
    record reads back as it was given."""
    log, pool = manual_log(tmp_path)
    statements: list[str] = []
    log.runner._conn.set_trace_callback(statements.append)
    records = [rec("t", i % 2, i, key=None if i % 3 else f"k{i}", value=b"v%d" % i)
               for i in range(150)]
    appended = log.append(records)
    pool.run_one()
    assert fired(appended) is None
    inserts = [s for s in statements if s.startswith("INSERT OR REPLACE INTO topic_log ")]
    assert len(inserts) == 3
    loaded = log.load()
    pool.run_one()
    assert fired(loaded)[0] == sorted(stored(r) for r in records)


# -- packed rows ------------------------------------------------------------------------------


def _table_rows(path: str, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


def test_a_run_of_one_partition_is_one_packed_row(tmp_path):
    """The records one append gives one partition at consecutive offsets
    are one row of ``topic_log_packs`` (two runs: the gap at offset 5
    splits them; a lone record stays a row of ``topic_log``); load gives
    each record back at its own offset, with its key and value, also
    after a reopen."""
    backend = SQLiteBackend(tmp_path)
    log = backend.open()
    records = [rec("app", 0, o, f"c{o}", b"v%d" % o) for o in (2, 3, 4, 6, 7)] + [
        rec("app", 1, 0, None, None), rec("other", 0, 9, "x", b"\x00\xff")]
    fired(log.append(records))
    assert _table_rows(backend.path, "topic_log_packs") == 2
    assert _table_rows(backend.path, "topic_log") == 2
    backend.close(log)
    log = backend.open()
    try:
        assert records_of(log) == sorted(stored(r) for r in records)
    finally:
        backend.close(log)


def test_a_truncation_cuts_into_a_packed_row(tmp_path):
    """A truncation inside a packed row keeps its records from there on;
    one past it drops the row; the rows below go whole."""
    backend = SQLiteBackend(tmp_path)
    log = backend.open()
    try:
        fired(log.append([rec("t", 0, o, value=b"%d" % o) for o in range(4)]))
        fired(log.append([rec("t", 0, o, value=b"%d" % o) for o in range(4, 8)]))
        fired(log.truncate("t", 0, 6))
        assert [r[2] for r in records_of(log)] == [6, 7]
        assert _table_rows(backend.path, "topic_log_packs") == 1
        fired(log.truncate("t", 0, 5))  # below the earlier one: nothing comes back
        assert [r[2] for r in records_of(log)] == [6, 7]
        fired(log.truncate("t", 0, 8))
        assert records_of(log) == []
        assert _table_rows(backend.path, "topic_log_packs") == 0
    finally:
        backend.close(log)


def test_a_write_over_a_packed_row_replaces_its_positions(tmp_path):
    """A record at a position of a stored packed row replaces that record
    only (the others of the row stay); a packed run over stored single
    rows replaces them; deleting the topic deletes its packed rows."""
    backend = SQLiteBackend(tmp_path)
    log = backend.open()
    try:
        fired(log.append([rec("t", 0, o, value=b"old%d" % o) for o in range(4)]))
        fired(log.append([rec("t", 0, 2, "n", b"new2", (("h", b"1"),))]))
        assert [(r[2], r[4]) for r in records_of(log)] == [
            (0, b"old0"), (1, b"old1"), (2, b"new2"), (3, b"old3")]
        assert records_of(log)[2][5] == (("h", b"1"),)
        fired(log.append([rec("t", 0, o, value=b"again%d" % o) for o in (1, 2)]))
        assert [r[4] for r in records_of(log)] == [b"old0", b"again1", b"again2", b"old3"]
        fired(log.delete_topic("t"))
        assert records_of(log) == []
        assert _table_rows(backend.path, "topic_log_packs") == 0
    finally:
        backend.close(log)


_writes = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 1), st.integers(0, 9), st.integers(1, 4)),
    st.tuples(st.just("truncate"), st.integers(0, 1), st.integers(0, 12)),
), max_size=8)


@settings(max_examples=200, deadline=None)
@given(calls=_writes)
def test_packed_rows_equal_the_memory_log(calls):
    """Runs appended anywhere (over stored packed rows and single rows,
    partly or whole) and truncations anywhere leave what the memory log
    leaves."""
    reference = MemoryTopicLog()
    fired(reference.start())
    log = SQLiteTopicLog(SQLiteRunner(":memory:", SyncReactor(), SyncThreadPool()))
    fired(log.start())
    try:
        for i, call in enumerate(calls):
            if call[0] == "append":
                _, p, first, n = call
                records = [rec("t", p, o, f"k{i}", b"%d.%d" % (i, o))
                           for o in range(first, first + n)]
                fired(reference.append(records))
                fired(log.append(records))
            else:
                _, p, before = call
                fired(reference.truncate("t", p, before))
                fired(log.truncate("t", p, before))
        assert fired(log.load()) == fired(reference.load())
    finally:
        fired(log.stop())


# -- runs (RecordRun): one item for the records of a partition at consecutive offsets ------


def test_a_run_is_one_packed_row_and_loads_as_its_records(tmp_path):
    """A :class:`RecordRun` is kept as one packed row (nothing per record),
    and load gives each of its records back at its own offset, also after
    a reopen; a run of one record is a row of ``topic_log``."""
    backend = SQLiteBackend(tmp_path)
    log = backend.open()
    fired(log.append([RecordRun("app", 0, 3, ["a", None, "c"], [b"1", b"2", None]),
                      RecordRun("app", 1, 0, ["z"], [b"alone"])]))
    assert _table_rows(backend.path, "topic_log_packs") == 1
    assert _table_rows(backend.path, "topic_log") == 1
    backend.close(log)
    log = backend.open()
    try:
        assert records_of(log) == [("app", 0, 3, "a", b"1", ()), ("app", 0, 4, None, b"2", ()),
                                   ("app", 0, 5, "c", None, ()), ("app", 1, 0, "z", b"alone", ())]
    finally:
        backend.close(log)


@pytest.mark.parametrize("run, error", [
    (RecordRun("t", 0, 0, ["k"], [b"1", b"2"]), ValueError),
    (RecordRun("t", 0, 0, ["k", 5], [b"1", b"2"]), TypeError),
    (RecordRun("t", 0, 0, ["k"], ["text"]), TypeError),
    (RecordRun("t", True, 0, ["k"], [b"1"]), TypeError),
    (RecordRun(b"t", 0, 0, ["k"], [b"1"]), TypeError),
])
def test_a_malformed_run_fails_the_append_and_stores_nothing(log, run, error):
    failure = failure_of(log.append([rec("t", 0, 9), run]))
    failure.trap(error)
    assert records_of(log) == []


def test_a_run_of_bytearrays_is_stored_as_bytes(log):
    fired(log.append([RecordRun("t", 0, 0, ["k", "l"], [bytearray(b"1"), memoryview(b"2")])]))
    assert records_of(log) == [("t", 0, 0, "k", b"1", ()), ("t", 0, 1, "l", b"2", ())]


_merged_writes = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 1), st.integers(0, 9), st.integers(1, 4)),
    st.tuples(st.just("run"), st.integers(0, 1), st.integers(0, 9), st.integers(1, 5)),
    st.tuples(st.just("truncate"), st.integers(0, 1), st.integers(0, 12)),
), max_size=10)


@settings(max_examples=300, deadline=None)
@given(calls=_merged_writes, loaded=st.booleans(), busy=st.booleans())
# a write over a packed row turns it into single rows: a truncation after it
# must still reach them (StoredEnds learns of them)
@example(calls=[("append", 1, 0, 2), ("append", 1, 1, 2), ("truncate", 1, 1)],
         loaded=True, busy=False)
def test_runs_merged_while_busy_equal_the_memory_log(calls, loaded, busy):
    """Runs and records appended, truncations and a topic's deletion, while
    the database thread is busy (merged into one operation: runs joined,
    cut by a truncation, made rows by a write over them) or one by one,
    after a load (the log then knows which rows it stores, and skips the
    look-ups and statements that cannot change anything) or not, leave
    what the memory log leaves from the same calls one by one."""
    reference = MemoryTopicLog()
    fired(reference.start())
    pool = ManualThreadPool()
    log = SQLiteTopicLog(SQLiteRunner(":memory:", SyncReactor(), pool))
    log.start()
    pool.run_one()  # the open
    try:
        fired(reference.append([rec("t", 0, 20, "first"), rec("u", 0, 3, "other")]))
        log.append([rec("t", 0, 20, "first"), rec("u", 0, 3, "other")])
        if loaded:
            log.load()
            pool.run_all()
            fired(reference.delete_topic("u"))
            log.delete_topic("u")
            pool.run_all()
            fired(reference.append([rec("u", 0, 1, "again")]))
            log.append([rec("u", 0, 1, "again")])
        for i, call in enumerate(calls):
            if not busy:
                pool.run_all()
            if call[0] == "truncate":
                _, p, before = call
                fired(reference.truncate("t", p, before))
                log.truncate("t", p, before)
                continue
            _, p, first, n = call
            records = [rec("t", p, o, f"k{i}", b"%d.%d" % (i, o)) for o in range(first, first + n)]
            if call[0] == "run":
                records = [RecordRun("t", p, first, [r[3] for r in records],
                                     [r[4] for r in records])]
            fired(reference.append(records))
            log.append(records)
        pool.run_all()
        loaded = log.load()
        pool.run_all()
        assert fired(loaded) == fired(reference.load())
    finally:
        stopped = log.stop()
        pool.run_all()
        fired(stopped)


def test_a_truncation_past_every_single_row_leaves_their_table_out(tmp_path):
    """Once a truncation passed the last single row of a partition, its next
    truncations make no statement on ``topic_log`` (and none on
    ``topic_log_packs`` past the last packed row) until one is written
    again; what loads is what the calls leave."""
    log, pool = manual_log(tmp_path)
    loaded = log.load()  # the log knows what it stores
    pool.run_one()
    fired(loaded)
    statements: list[str] = []
    log.runner._conn.set_trace_callback(statements.append)

    def run_and_count(d, table: str) -> int:
        statements.clear()
        pool.run_one()
        assert fired(d) is None
        return sum(s.startswith(f"DELETE FROM {table} ") for s in statements)

    assert run_and_count(log.append([rec("t", 0, 0)]), "topic_log") == 0  # a single row
    assert run_and_count(log.truncate("t", 0, 1), "topic_log") == 1  # it goes
    assert run_and_count(log.truncate("t", 0, 1), "topic_log") == 0  # none left
    fired_run = log.append([RecordRun("t", 0, 1, ["a", "b"], [b"1", b"2"])])
    assert run_and_count(fired_run, "topic_log_packs") == 0
    assert run_and_count(log.truncate("t", 0, 2), "topic_log_packs") == 1  # cut, kept
    assert run_and_count(log.truncate("t", 0, 2), "topic_log_packs") == 1
    assert run_and_count(log.truncate("t", 0, 3), "topic_log_packs") == 1  # it goes
    assert run_and_count(log.truncate("t", 0, 3), "topic_log_packs") == 0
    assert run_and_count(log.append([rec("t", 0, 3)]), "topic_log") == 0
    assert run_and_count(log.truncate("t", 0, 3), "topic_log") == 1  # written again
    loaded = log.load()
    pool.run_one()
    assert fired(loaded)[0] == [stored(rec("t", 0, 3))]
    stopped = log.stop()
    pool.run_all()
    fired(stopped)
