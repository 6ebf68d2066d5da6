"""Runs of deliveries as one row of the embedded device store
(:mod:`tbmq.backends.sqlite_delivery_runs`): an ``add_run`` is one row of
``delivery_runs``; removing its first deliveries moves its ``first_seq``;
any other write into it cuts it; reads, counts, the per-client limit and a
restart see every delivery as the in-memory store does."""

from __future__ import annotations

import random
import sqlite3

import pytest

from tbmq.backends import sqlite_bulk, sqlite_deliveries, sqlite_delivery_runs, sqlite_schema
from tbmq.backends.memory import MemoryDeviceMessageStore
from tbmq.model import DeliveryState
from tests.unit.test_sqlite_store import manual_store, sync_store
from tests.unit.test_stores import delivery, fired, message


def _msgs(first: int, n: int) -> list:
    return [message(f"t/{seq}", b"p%d" % seq, qos=1) for seq in range(first, first + n)]


def _tables(tmp_path) -> tuple[int, int]:
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    try:
        return (conn.execute("SELECT count(*) FROM deliveries").fetchone()[0],
                conn.execute("SELECT count(*) FROM delivery_runs").fetchone()[0])
    finally:
        conn.close()


def _view(deliveries) -> list[tuple]:
    return [(d.seq, d.message.topic, d.message.payload, d.qos, d.retain,
             tuple(d.subscription_ids), d.packet_id, int(d.state)) for d in deliveries]


def test_a_run_is_one_row_and_its_first_deliveries_leave_it_without_a_row_each(tmp_path):
    store = sync_store(tmp_path)
    fired(store.start())
    fired(store.deliveries.add_run("c", 100, _msgs(100, 50), 1, True, (7,)))
    assert _tables(tmp_path) == (0, 1)
    got = fired(store.deliveries.load("c"))
    assert [d.seq for d in got] == list(range(100, 150))
    assert all(d.retain and d.subscription_ids == (7,) and d.state == DeliveryState.QUEUED
               and d.packet_id is None for d in got)
    assert [d.message.topic for d in got] == [f"t/{seq}" for seq in range(100, 150)]
    fired(store.deliveries.remove("c", range(100, 120)))  # a prefix: the run is trimmed
    assert _tables(tmp_path) == (0, 1)
    assert fired(store.deliveries.count("c")) == 30
    assert [d.seq for d in fired(store.deliveries.load("c", after_seq=125, limit=10))] == \
        list(range(126, 136))
    fired(store.deliveries.remove("c", range(120, 150)))  # the rest: the row goes
    assert _tables(tmp_path) == (0, 0)
    assert fired(store.deliveries.load("c")) == []
    fired(store.stop())


def test_an_update_or_a_removal_inside_a_run_cuts_it(tmp_path):
    store = sync_store(tmp_path)
    fired(store.start())
    fired(store.deliveries.add_run("c", 1, _msgs(1, 10), 1))
    fired(store.deliveries.update("c", 3, 42, DeliveryState.SENT))
    # 1..3 are rows now (3 sent), 4..10 still the run
    assert _tables(tmp_path) == (3, 1)
    fired(store.deliveries.remove("c", [2, 6]))
    assert _tables(tmp_path) == (4, 1)  # rows 1, 3, 4, 5; the run 7..10
    got = fired(store.deliveries.load("c"))
    assert [d.seq for d in got] == [1, 3, 4, 5, 7, 8, 9, 10]
    assert [(d.packet_id, d.state) for d in got if d.seq == 3] == [(42, DeliveryState.SENT)]
    fired(store.deliveries.add("c", [delivery(9, message=message("new"), qos=2)]))
    got = fired(store.deliveries.load("c"))
    assert [(d.seq, d.message.topic, d.qos) for d in got][-2:] == [(9, "new", 2), (10, "t/10", 1)]
    assert fired(store.deliveries.count("c")) == 8
    fired(store.deliveries.clear("c"))
    assert _tables(tmp_path) == (0, 0)
    fired(store.stop())


def test_writes_merged_with_a_run_before_it_is_stored_make_it_rows(tmp_path):
    """A run whose client is written again in the same transaction (sent and
    acknowledged before its commit, a live session) becomes rows there:
    what is acknowledged costs no row."""
    store, pool = manual_store(tmp_path)
    started = store.start()
    pool.run_all()
    fired(started)
    blocker = store.deliveries.add("x", [delivery(1)])  # the thread is busy with it
    adds = [store.deliveries.add_run("c", 1, _msgs(1, 5), 1),
            store.deliveries.add_run("d", 1, _msgs(1, 5), 1)]
    store.deliveries.update("c", 1, 9, DeliveryState.SENT)
    store.deliveries.remove("c", [1, 2])
    pool.run_all()
    fired(blocker)
    assert [fired(d) for d in adds] == [0, 0]
    loads = [store.deliveries.load("c"), store.deliveries.load("d")]
    pool.run_all()
    assert _view(fired(loads[0])) == _view(
        [delivery(seq, message=m) for seq, m in zip(range(3, 6), _msgs(3, 3))])
    assert [d.seq for d in fired(loads[1])] == [1, 2, 3, 4, 5]
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    try:
        # c's run became rows 3..5 (1 and 2 never written), d's stayed a run
        assert conn.execute("SELECT client_id, count(*) FROM deliveries GROUP BY client_id "
                            "ORDER BY 1").fetchall() == [("c", 3), ("x", 1)]
        assert conn.execute("SELECT client_id FROM delivery_runs").fetchall() == [("d",)]
    finally:
        conn.close()
    stopped = store.stop()
    pool.run_all()
    fired(stopped)


def test_a_long_run_is_several_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_delivery_runs, "MAX_RUN_MESSAGES", 4)
    monkeypatch.setattr(sqlite_deliveries, "MAX_RUN_MESSAGES", 4)
    store = sync_store(tmp_path)
    fired(store.start())
    fired(store.deliveries.add_run("c", 1, _msgs(1, 10), 1))
    assert _tables(tmp_path) == (0, 3)
    fired(store.deliveries.update("c", 6, 1, DeliveryState.SENT))  # in the second row
    fired(store.deliveries.remove("c", [1, 2, 3, 4, 9]))
    got = fired(store.deliveries.load("c"))
    assert [(d.seq, d.state) for d in got] == [(5, 0), (6, DeliveryState.SENT), (7, 0), (8, 0),
                                               (10, 0)]
    assert [d.message.topic for d in got] == ["t/5", "t/6", "t/7", "t/8", "t/10"]
    fired(store.stop())


def test_the_per_client_limit_counts_and_trims_runs(tmp_path):
    store = sync_store(tmp_path, max_messages_per_client=25)
    fired(store.start())
    assert fired(store.deliveries.add("c", [delivery(1), delivery(2)])) == 0
    assert fired(store.deliveries.add_run("c", 3, _msgs(3, 10), 1)) == 0
    assert fired(store.deliveries.add_run("c", 13, _msgs(13, 20), 1)) == 7
    assert [d.seq for d in fired(store.deliveries.load("c"))] == list(range(8, 33))
    assert fired(store.deliveries.add_run("c", 33, _msgs(33, 30), 1)) == 25 + 5
    assert [d.seq for d in fired(store.deliveries.load("c"))] == list(range(38, 63))
    fired(store.stop())


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_random_writes_read_back_as_the_memory_store(tmp_path, seed, batched):
    """Adds, runs, updates, removals (prefixes and scattered), pages and
    restarts, mirrored on the in-memory store: the same deliveries, in the
    same states, every time; ``batched``: the writes of several steps
    merged into one transaction (the database thread busy meanwhile)."""
    rnd = random.Random(seed)
    # (merged writes trim once, after the removals merged with them: their
    # per-client limit is not the memory store's add by add)
    limit = None if batched else rnd.choice([None, None, 40])
    if batched:
        store, pool = manual_store(tmp_path, max_messages_per_client=limit)
        run = pool.run_all
    else:
        store = sync_store(tmp_path, max_messages_per_client=limit)
        run = lambda: None  # noqa: E731 (each call runs at once)

    def done(d):
        run()
        return fired(d)

    memory = MemoryDeviceMessageStore(max_messages_per_client=limit)
    done(store.start())
    fired(memory.start())
    clients = ["c", "d"]
    top = {c: 0 for c in clients}
    removed = [0, 0]  # (sqlite, memory) deliveries the limit removed
    pending: list = []
    for step in range(150):
        c = rnd.choice(clients)
        kind = rnd.random()
        stored = [d.seq for d in fired(memory.load(c))]
        if kind < 0.3:
            n = rnd.randint(1, 12)
            first = top[c] + 1 if rnd.random() < 0.85 or not stored else rnd.choice(stored)
            top[c] = max(top[c], first + n - 1)
            msgs = _msgs(first, n)
            sids = rnd.choice([(), (3,)])
            pending.append(store.deliveries.add_run(c, first, msgs, 1, False, sids))
            removed[1] += fired(memory.add_run(c, first, msgs, 1, False, sids))
        elif kind < 0.4:
            seq = top[c] + 1 if rnd.random() < 0.5 or not stored else rnd.choice(stored)
            top[c] = max(top[c], seq)
            one = [delivery(seq, message=message(f"one/{step}"), qos=2)]
            pending.append(store.deliveries.add(c, one))
            removed[1] += fired(memory.add(c, one))
        elif kind < 0.55 and stored:
            seq = rnd.choice(stored)
            state = rnd.choice([DeliveryState.SENT, DeliveryState.RELEASED])
            store.deliveries.update(c, seq, step, state)
            fired(memory.update(c, seq, step, state))
        elif kind < 0.8 and stored:
            if rnd.random() < 0.6:
                seqs = stored[:rnd.randint(1, len(stored))]
            else:
                seqs = rnd.sample(stored, rnd.randint(1, len(stored)))
            store.deliveries.remove(c, seqs)
            fired(memory.remove(c, seqs))
        elif kind < 0.85:
            done(store.stop())
            done(store.start())
        elif kind < 0.9:
            store.deliveries.clear(c)
            fired(memory.clear(c))
        if batched and rnd.random() < 0.7:
            continue  # more writes join the same transaction
        run()
        removed[0] += sum(fired(d) for d in pending)
        pending = []
        assert removed[0] == removed[1]
        for client in clients:
            expected = _view(fired(memory.load(client)))
            assert _view(done(store.deliveries.load(client))) == expected
            assert done(store.deliveries.count(client)) == len(expected)
            # in pages
            paged, after = [], None
            while True:
                page = done(store.deliveries.load(client, after_seq=after, limit=7))
                paged.extend(page)
                if len(page) < 7:
                    break
                after = page[-1].seq
            assert _view(paged) == expected
    done(store.stop())


@pytest.mark.parametrize("batched", [False, True])
def test_without_json_functions_the_runs_read_back_as_the_memory_store(tmp_path, monkeypatch,
                                                                        batched):
    """An SQLite without ``json_each``: the look-ups of the runs a write cuts
    are a row each, the pages read row by row."""
    monkeypatch.setattr(sqlite_bulk, "_JSON", [False])
    test_random_writes_read_back_as_the_memory_store(tmp_path, 3, batched)


def test_the_messages_of_a_run_are_encoded_once_for_every_subscriber(tmp_path):
    store, pool = manual_store(tmp_path)
    store.start()
    pool.run_one()  # open
    msgs = _msgs(1, 5)
    store.deliveries.add("x", [delivery(1)])  # handed to the thread
    store.deliveries.add_run("a", 1, msgs, 1)
    store.deliveries.add_run("b", 7, msgs, 1)  # all known: the same bytes
    store.deliveries.add_run("c", 1, msgs[2:] + _msgs(6, 2), 1)  # some known
    writes = store.runner._pending[0][0]
    a, b, c = (writes.runs[client][0][7] for client in "abc")
    assert all(x is y for x, y in zip(a, b)) and a[2:] == c[:3] and a[2] is c[0]
    assert len(c) == 5 and c[3] != c[4]
    pool.run_all()
    stopped = store.stop()
    pool.run_all()
    fired(stopped)


def test_a_page_of_many_runs_is_one_statement_and_stops_at_its_limit(tmp_path):
    store = sync_store(tmp_path)
    fired(store.start())
    for n in range(40):  # 40 runs of 5
        fired(store.deliveries.add_run("c", 1 + 5 * n, _msgs(1 + 5 * n, 5), 1))
    fired(store.deliveries.remove("c", [1, 2]))
    statements: list[str] = []
    store.runner._conn.set_trace_callback(statements.append)
    page = fired(store.deliveries.load("c", after_seq=4, limit=12))
    assert [d.seq for d in page] == list(range(5, 17))
    (runs,) = [s for s in statements if "FROM delivery_runs" in s]
    assert "json_group_array" in runs and "OVER" in runs
    fired(store.stop())


def test_runs_read_out_of_order_are_not_taken():
    """An aggregate's rows in another order than the runs': None (the page
    is then read a row at a time)."""
    blobs = [sqlite_schema.message_blob(m) for m in _msgs(1, 4)]
    headers = [[1, 2, 1, 1, 0, None], [3, 4, 3, 1, 0, None]]
    got = sqlite_delivery_runs.run_deliveries_of(headers, b"".join(blobs))
    assert [d.seq for d in got] == [1, 2, 3, 4]
    assert [d.message.topic for d in got] == ["t/1", "t/2", "t/3", "t/4"]
    assert sqlite_delivery_runs.run_deliveries_of(headers[::-1], b"".join(blobs)) is None
    # a message short, or one too many
    assert sqlite_delivery_runs.run_deliveries_of(headers, b"".join(blobs[:3])) is None
    assert sqlite_delivery_runs.run_deliveries_of(headers, b"".join(blobs + blobs[:1])) is None


def test_a_plain_run_is_read_in_one_loop_with_every_field_the_codec_reads():
    """:func:`~tbmq.backends.sqlite_delivery_runs.plain_run_deliveries`
    makes each delivery and message field by field: every slot is set to
    what the codec's reader gives (``wire`` left None: the array is not
    kept), so a field added to :class:`Message` or :class:`StoredDelivery`
    and not to it fails here; a message with properties is left to the
    codec (None), and :func:`run_deliveries_of` still reads such a run."""
    import dataclasses

    import msgpack

    from tbmq.cluster.records import MESSAGE
    from tbmq.model import Message, StoredDelivery
    from tbmq.mqtt import Property

    plain = [Message("t/a", b"one", 1, False, {}, "pub", 1.5, None),
             Message("t/b", b"two", 2, True, {}, "", 2.5, 99.0)]
    data = b"".join(msgpack.packb(MESSAGE.to_list(m), use_bin_type=True) for m in plain)
    unpacker = msgpack.Unpacker(raw=False, use_list=False, strict_map_key=False)
    unpacker.feed(data)
    arrays = list(unpacker)
    made = sqlite_delivery_runs.plain_run_deliveries(arrays, 7, 1, True, (3,))
    expected = MESSAGE.decode_arrays(arrays)
    assert [d.seq for d in made] == [7, 8]
    for delivery, message in zip(made, expected):
        assert {name: getattr(delivery, name) for name in StoredDelivery.__slots__ if name != "message"} \
            == {"seq": delivery.seq, "qos": 1, "retain": True, "subscription_ids": (3,),
                "packet_id": None, "state": DeliveryState.QUEUED}
        for name in Message.__slots__:
            if name != "wire":
                value, wanted = getattr(delivery.message, name), getattr(message, name)
                assert (type(value), value) == (type(wanted), wanted), name
        assert delivery.message.wire is None
    # one empty properties dict for the run's messages (none is written)
    assert made[0].message.properties is made[1].message.properties == {}
    assert set(Message.__slots__) == {f.name for f in dataclasses.fields(Message)}
    assert set(StoredDelivery.__slots__) == {f.name for f in dataclasses.fields(StoredDelivery)}
    rich = Message("t/c", b"three", 1, False, {Property.CONTENT_TYPE: "a"}, "pub", 3.5, None)
    with_props = arrays + [msgpack.unpackb(msgpack.packb(MESSAGE.to_list(rich), use_bin_type=True),
                                           raw=False, use_list=False)]
    assert sqlite_delivery_runs.plain_run_deliveries(with_props, 7, 1, False, ()) is None
    stream = data + msgpack.packb(MESSAGE.to_list(rich), use_bin_type=True)
    read = sqlite_delivery_runs.run_deliveries_of([[7, 9, 7, 1, 0, None]], stream)
    assert [(d.seq, d.message) for d in read] == [(7, plain[0]), (8, plain[1]), (9, rich)]
