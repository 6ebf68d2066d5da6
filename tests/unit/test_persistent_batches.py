"""The embedded node's persistent path in batches: the device store's rows
in few statements (:mod:`tbmq.backends.sqlite_bulk`), a batch's deliveries
to one sink with one waiter (:meth:`InProcessBus.publish_many`), and a
turn's device store updates in one call."""

from __future__ import annotations

import sqlite3

from twisted.internet import defer
from twisted.internet.task import Clock

from tbmq.backends import sqlite_bulk
from tbmq.backends.deliveries import update_many
from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.backends.memory import MemoryDeviceMessageStore
from tbmq.backends.sqlite_deliveries import CoalescedWrites
from tbmq.backends.sqlite_schema import EMBEDDED_SCHEMA, message_blob
from tbmq.backends.sqlite_runner import apply_schemas
from tbmq.cluster.records import Delivery
from tbmq.errors import ConsumerFailedError
from tbmq.model import DeliveryState, Message, StoredDelivery

PERSISTED = "tbmq.msg.persisted"


def _db() -> tuple[sqlite3.Connection, list[str]]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    apply_schemas(conn, ":memory:", [EMBEDDED_SCHEMA])
    assert sqlite_bulk.has_json(conn)  # (asked once, not traced below)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    return conn, statements


def _row(client_id: str, seq: int) -> list:
    return [client_id, seq, message_blob(Message("a/b", b"x", 1)), 1, 0, None, None, 0]


def test_a_batch_of_150_rows_is_three_insert_statements_and_every_row_is_written():
    conn, statements = _db()
    writes = CoalescedWrites()
    for seq in range(1, 151):
        writes.put(("c", seq), _row("c", seq))
    writes(conn)
    inserts = [s for s in statements if s.startswith("INSERT")]
    # executemany would step (and trace) once per row: 150
    assert len(inserts) == 3 == -(-150 // sqlite_bulk.CHUNK_ROWS)
    assert conn.execute("SELECT count(*), min(seq), max(seq) FROM deliveries").fetchone() == (
        150, 1, 150)


def test_columns_none_in_every_row_of_a_chunk_are_left_out_and_read_back_null():
    """A chunk whose rows all lack subscription identifiers and a packet id
    names its other columns (nothing bound for those two); a chunk where
    one row has them binds every column; every value reads back."""
    conn, statements = _db()
    writes = CoalescedWrites()
    for seq in range(1, 65):  # one chunk: no ids, no packet id
        writes.put(("c", seq), _row("c", seq))
    for seq in range(65, 129):  # the next chunk: one row with both
        row = _row("c", seq)
        if seq == 100:
            row[5], row[6] = "[3]", 42
        writes.put(("c", seq), row)
    writes(conn)
    inserts = [s for s in statements if s.startswith("INSERT")]
    assert len(inserts) == 2
    assert inserts[0].startswith("INSERT OR REPLACE INTO deliveries "
                                 "(client_id,seq,message,qos,retain,state) VALUES")
    assert inserts[1].startswith("INSERT OR REPLACE INTO deliveries VALUES")
    rows = conn.execute("SELECT seq, message, qos, retain, subscription_ids, packet_id, state "
                        "FROM deliveries ORDER BY seq").fetchall()
    blob = _row("c", 1)[2]
    assert rows == [(seq, blob, 1, 0, "[3]" if seq == 100 else None,
                     42 if seq == 100 else None, 0) for seq in range(1, 129)]
    # one column None throughout, the next not: only the first left out
    statements.clear()
    sent = CoalescedWrites()
    for seq in range(200, 203):
        row = _row("c", seq)
        row[6], row[7] = seq, int(DeliveryState.SENT)
        sent.put(("c", seq), row)
    sent(conn)
    (insert,) = [s for s in statements if s.startswith("INSERT")]
    assert insert.startswith("INSERT OR REPLACE INTO deliveries "
                             "(client_id,seq,message,qos,retain,packet_id,state) VALUES")
    assert conn.execute("SELECT seq, subscription_ids, packet_id, state FROM deliveries "
                        "WHERE seq >= 200 ORDER BY seq").fetchall() == [
        (seq, None, seq, int(DeliveryState.SENT)) for seq in range(200, 203)]


def test_updates_and_deletes_of_a_batch_are_a_few_statements_and_hit_only_their_rows():
    conn, statements = _db()
    writes = CoalescedWrites()
    for client_id in ("c", "d"):
        for seq in range(1, 101):
            writes.put((client_id, seq), _row(client_id, seq))
    writes(conn)
    statements.clear()
    later = CoalescedWrites()
    for seq in range(1, 71):  # sent: packet id and state
        later.update(("c", seq), seq + 1000, int(DeliveryState.SENT))
    for seq in range(1, 81):  # acknowledged
        later.delete(("d", seq))
    later(conn)
    # 70 updates in 2 statements, 80 deletes in 1 (the seqs as one JSON array),
    # and per client one look-up of the runs they might cut (none here)
    lookups = [s for s in statements if s.startswith("SELECT")]
    assert len(lookups) == 2 and all("FROM delivery_runs" in s for s in lookups)
    assert len(statements) == 2 + 1 + 2
    (delete,) = [s for s in statements if s.startswith("DELETE")]
    head = ("DELETE FROM deliveries WHERE client_id = 'd' AND seq IN "
            "(SELECT value FROM json_each('[")
    assert delete.startswith(head) and delete.endswith("]'))")
    assert sorted(map(int, delete[len(head):-len("]'))")].split(","))) == list(range(1, 81))
    assert conn.execute("SELECT count(*) FROM deliveries WHERE client_id = 'd'").fetchone() == (20,)
    assert conn.execute("SELECT min(seq) FROM deliveries WHERE client_id = 'd'").fetchone() == (81,)
    sent = conn.execute("SELECT seq, packet_id, state FROM deliveries WHERE client_id = 'c' "
                        "AND state = ? ORDER BY seq", (int(DeliveryState.SENT),)).fetchall()
    assert sent == [(seq, seq + 1000, int(DeliveryState.SENT)) for seq in range(1, 71)]
    assert conn.execute("SELECT count(*) FROM deliveries WHERE client_id = 'c' "
                        "AND packet_id IS NULL").fetchone() == (30,)


def test_deletes_without_json_functions_are_chunks_of_in_lists(monkeypatch):
    conn, statements = _db()
    sqlite_bulk.insert_rows(conn, "deliveries", [_row("c", seq) for seq in range(1, 101)], 8)
    statements.clear()
    monkeypatch.setattr(sqlite_bulk, "_JSON", [False])
    sqlite_bulk.delete_seqs(conn, [("c", seq) for seq in range(1, 81)] + [("c", 1000)])
    assert len(statements) == 2  # 81 seqs in two IN lists
    assert conn.execute("SELECT count(*), min(seq) FROM deliveries").fetchone() == (20, 81)


def test_a_large_seq_in_a_json_array_deletes_only_its_row():
    conn, _ = _db()
    base = 1_790_000_000_000_000_000  # nanoseconds: next_seq's keys
    sqlite_bulk.insert_rows(conn, "deliveries", [_row("c", base + i) for i in range(200)], 8)
    sqlite_bulk.delete_seqs(conn, [("c", base + i) for i in range(0, 200, 2)])
    assert [seq - base for (seq,) in conn.execute("SELECT seq FROM deliveries ORDER BY seq")] == \
        list(range(1, 200, 2))


def test_updates_of_several_clients_and_states_set_each_row_alone():
    conn, statements = _db()
    sqlite_bulk.insert_rows(conn, "deliveries",
                            [_row(c, seq) for c in ("c", "d") for seq in range(1, 4)], 8)
    statements.clear()
    sent, released = int(DeliveryState.SENT), int(DeliveryState.RELEASED)
    sqlite_bulk.update_states(conn, [
        (("c", 2), (7, sent)), (("c", 9), (8, sent)),  # an unknown seq is ignored
        (("c", 3), (9, released)), (("d", 1), (None, sent)), (("d", 3), (5, sent))])
    assert len(statements) == 3  # one per client and state
    assert conn.execute("SELECT client_id, seq, packet_id, state FROM deliveries "
                        "ORDER BY client_id, seq").fetchall() == [
        ("c", 1, None, 0), ("c", 2, 7, sent), ("c", 3, 9, released),
        ("d", 1, None, sent), ("d", 2, None, 0), ("d", 3, 5, sent)]


def _bus() -> tuple[InProcessBus, Clock]:
    clock = Clock()
    bus = InProcessBus(clock=clock)
    assert bus.start().called
    return bus, clock


def _deliveries(n: int) -> list[Delivery]:
    return [Delivery("c", Message("a/b", str(i).encode()), 1) for i in range(n)]


def test_publish_many_hands_a_batch_handler_the_records_together_with_one_outcome():
    bus, clock = _bus()
    batches, results = [], []

    def batch(values):
        batches.append(values)
        results.append(defer.Deferred())
        return results[-1]

    bus.subscribe(PERSISTED, "w", lambda record: None, batch_handler=batch)
    outcome = []
    values = _deliveries(5)
    bus.publish_many(PERSISTED, ["c"] * 5, values, outcome.append)
    state = bus._topics[PERSISTED]
    waiters = state.parts[0].waiters
    assert len(set(map(id, waiters.values()))) == 1 and len(waiters) == 5  # one waiter
    clock.advance(0)
    assert batches == [values] and outcome == []  # handled, not yet durable
    results[0].callback(None)
    assert outcome == [None] and waiters == {}
    assert state.groups["w"].cursors[0].committed == 5


def test_publish_many_waits_for_every_group_and_fails_with_the_first_failure():
    bus, clock = _bus()
    held = []
    bus.subscribe(PERSISTED, "a", lambda record: None,
                  batch_handler=lambda values: held.append(defer.Deferred()) or held[-1])
    bus.subscribe(PERSISTED, "b", lambda record: None, batch_handler=lambda values: None)
    outcome = []
    bus.publish_many(PERSISTED, ["c"] * 3, _deliveries(3), outcome.append)
    clock.advance(0)
    assert outcome == []  # group b handled them, group a not yet
    held[0].errback(RuntimeError("store down"))
    assert len(outcome) == 1 and outcome[0].check(ConsumerFailedError)


def test_publish_many_without_a_consumer_is_done_at_once():
    bus, _ = _bus()
    outcome = []
    bus.publish_many(PERSISTED, ["c"] * 2, _deliveries(2), outcome.append)
    assert outcome == [None]


class _CountingStore(MemoryDeviceMessageStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def update_many(self, client_id, updates):
        self.calls.append((client_id, list(updates)))
        return defer.DeferredList([self.update(client_id, *u) for u in updates])


def test_update_many_uses_the_store_s_own_call_or_one_update_each():
    store = _CountingStore()
    stored = [StoredDelivery(seq, Message("a", b"x"), 1) for seq in (1, 2)]
    store.add("c", stored)
    update_many(store, "c", [(1, 5, int(DeliveryState.SENT)), (2, 6, int(DeliveryState.SENT))])
    assert store.calls == [("c", [(1, 5, 1), (2, 6, 1)])]
    plain = MemoryDeviceMessageStore()
    plain.add("c", [StoredDelivery(seq, Message("a", b"x"), 1) for seq in (1, 2)])
    done = []
    update_many(plain, "c", [(1, 5, 1), (2, 6, 1)]).addCallback(done.append)
    assert done == [None]
    loaded = []
    plain.load("c").addCallback(loaded.extend)
    assert [(d.packet_id, d.state) for d in loaded] == [(5, DeliveryState.SENT)] * 1 + [
        (6, DeliveryState.SENT)]


def test_the_qos2_sends_of_a_turn_are_one_store_update_written_when_the_turn_ends():
    from tests.unit.test_outbox import make_outbox  # noqa: PLC0415

    store = _CountingStore()
    outbox, conn, clock = make_outbox(persistent=True, device_store=store)
    outbox.paged_out = False
    deliveries = [StoredDelivery(seq, Message("t", b"%d" % seq, 2), 2) for seq in (1, 2, 3)]
    store.add("c", deliveries)
    for delivery in deliveries:
        outbox.deliver_stored(delivery, None, clock.seconds())
    assert len(conn.packets()) == 3 and store.calls == []  # sent; the store write waits
    clock.advance(0)  # the turn ends
    assert store.calls == [("c", [(seq, deliveries[seq - 1].packet_id, int(DeliveryState.SENT))
                                  for seq in (1, 2, 3)])]
    loaded = []
    store.load("c").addCallback(loaded.extend)
    assert {d.state for d in loaded} == {DeliveryState.SENT}


def _sent_qos1(seqs=(1, 2, 3)):
    from tests.unit.test_outbox import make_outbox  # noqa: PLC0415

    store = _CountingStore()
    outbox, conn, clock = make_outbox(persistent=True, device_store=store)
    outbox.paged_out = False
    deliveries = [StoredDelivery(seq, Message("t", b"%d" % seq, 1), 1) for seq in seqs]
    store.add("c", deliveries)
    for delivery in deliveries:
        outbox.deliver_stored(delivery, None, clock.seconds())
    assert len(conn.packets()) == len(deliveries)
    return store, outbox, clock, deliveries


def _states(store):
    loaded = []
    store.load("c").addCallback(loaded.extend)
    return [(d.seq, d.packet_id, d.state) for d in loaded]


def test_a_qos1_delivery_acknowledged_soon_writes_no_sent_state_only_its_removal():
    from tbmq.broker.sent_states import SentStates  # noqa: PLC0415

    store, outbox, clock, deliveries = _sent_qos1()
    clock.advance(0)
    assert store.calls == []  # no update at the end of the turn
    for delivery in deliveries:
        outbox.complete(delivery.packet_id)
    clock.advance(0)
    assert _states(store) == []  # removed
    clock.advance(2 * SentStates.DELAY)
    assert store.calls == []  # and never updated
    assert outbox.sent_states.call is None  # no timer left


def test_qos1_deliveries_of_a_client_acknowledging_nothing_get_their_sent_states_within_two_delays():
    from tbmq.broker.sent_states import SentStates  # noqa: PLC0415

    store, outbox, clock, deliveries = _sent_qos1()
    clock.advance(SentStates.DELAY)  # one tick: they are young, they wait one more
    assert store.calls == []
    clock.advance(SentStates.DELAY)
    sent = int(DeliveryState.SENT)
    assert store.calls == [("c", [(d.seq, d.packet_id, sent) for d in deliveries])]
    assert outbox.sent_states.call is None  # nothing held: the timer stops


def test_held_sent_states_wait_while_the_client_acknowledges_in_order_at_most_most_ticks():
    from tbmq.broker.sent_states import SentStates  # noqa: PLC0415

    store, outbox, clock, deliveries = _sent_qos1(range(1, SentStates.MOST_TICKS + 3))
    acked = iter(deliveries[:-1])  # in order, one per tick; the last is never acknowledged
    for _ in range(SentStates.MOST_TICKS):  # the client acknowledges: nothing is written
        outbox.complete(next(acked).packet_id)
        clock.advance(SentStates.DELAY)
    assert store.calls == []
    outbox.complete(next(acked).packet_id)  # still acknowledging: the last is written
    clock.advance(SentStates.DELAY)
    sent = int(DeliveryState.SENT)
    assert store.calls == [("c", [(deliveries[-1].seq, deliveries[-1].packet_id, sent)])]
    assert outbox.sent_states.call is None


def test_a_held_sent_state_the_client_passed_over_is_written_while_it_acknowledges_others():
    from tbmq.broker.sent_states import SentStates  # noqa: PLC0415

    store, outbox, clock, deliveries = _sent_qos1(range(1, 6))
    outbox.complete(deliveries[1].packet_id)  # 2 before 1
    clock.advance(SentStates.DELAY)  # one tick: they are young, they wait one more
    assert store.calls == []
    outbox.complete(deliveries[2].packet_id)
    clock.advance(SentStates.DELAY)  # 1 was passed over; 4 and 5 were not
    sent = int(DeliveryState.SENT)
    assert store.calls == [("c", [(1, deliveries[0].packet_id, sent)])]
    assert outbox.sent_states.call is not None  # 4 and 5 wait


def test_a_tick_a_delay_late_writes_nothing_the_reactor_read_nothing_meanwhile():
    from tbmq.broker.sent_states import SentStates  # noqa: PLC0415

    store, outbox, clock, deliveries = _sent_qos1()
    clock.advance(3 * SentStates.DELAY)  # the reactor busy: the tick comes late
    assert store.calls == []
    clock.advance(SentStates.DELAY)  # on time, nothing acknowledged: written
    sent = int(DeliveryState.SENT)
    assert store.calls == [("c", [(d.seq, d.packet_id, sent) for d in deliveries])]


def test_a_qos1_delivery_not_acknowledged_gets_its_sent_state_two_delays_after_the_last_ack():
    from tbmq.broker.sent_states import SentStates  # noqa: PLC0415

    store, outbox, clock, deliveries = _sent_qos1()
    outbox.complete(deliveries[0].packet_id)
    clock.advance(SentStates.DELAY)  # the client acknowledged (in order): nothing is written
    assert store.calls == []
    clock.advance(SentStates.DELAY)  # a tick without: what waited a tick is written
    sent = int(DeliveryState.SENT)
    assert store.calls == [("c", [(2, deliveries[1].packet_id, sent),
                                  (3, deliveries[2].packet_id, sent)])]
    assert _states(store) == [(2, deliveries[1].packet_id, DeliveryState.SENT),
                              (3, deliveries[2].packet_id, DeliveryState.SENT)]
    assert outbox.sent_states.call is None  # nothing held: the timer stops


def test_the_held_sent_states_are_written_when_the_connection_ends():
    store, outbox, clock, deliveries = _sent_qos1()
    outbox.complete(deliveries[0].packet_id)
    outbox.detach()
    sent = int(DeliveryState.SENT)
    assert store.calls == [("c", [(2, deliveries[1].packet_id, sent),
                                  (3, deliveries[2].packet_id, sent)])]
    assert outbox.sent_states.call is None
    clock.advance(1)
    assert _states(store) == [(2, deliveries[1].packet_id, DeliveryState.SENT),
                              (3, deliveries[2].packet_id, DeliveryState.SENT)]
    assert len(store.calls) == 1  # not written twice


def test_a_discarded_session_writes_no_held_sent_state():
    from tbmq.broker.sent_states import SentStates  # noqa: PLC0415

    store, outbox, clock, _ = _sent_qos1()
    outbox.discard()
    clock.advance(3 * SentStates.DELAY)
    assert store.calls == [] and _states(store) == []


def test_publish_many_to_a_durable_topic_is_one_log_append_and_one_outcome():
    from tests.helpers import MemoryTopicLog  # noqa: PLC0415

    log = MemoryTopicLog()
    clock = Clock()
    bus = InProcessBus(clock=clock, log=log)
    assert bus.start().called
    topic = "tbmq.msg.app.app1"
    got = []
    # the client has not acknowledged them: the group does not commit
    bus.subscribe(topic, "tbmq-app-app1", lambda record: None,
                  batch_handler=lambda values: got.append(values) or defer.Deferred())
    values = [Delivery("app1", Message("a/b", str(i).encode()), 1) for i in range(4)]
    outcome = []
    log.calls.clear()
    bus.publish_many(topic, ["app1"] * 4, values, outcome.append)
    assert outcome == []  # not durable before the log has it
    clock.advance(0)
    assert log.calls.count("append") == 1 and outcome == [None]
    assert got == [values]  # the live group got the objects themselves
    assert sorted(log.records[(topic, 0)]) == [0, 1, 2, 3]  # each record, encoded
