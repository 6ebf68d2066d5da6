"""The outbound part of a session (:class:`tbmq.broker.outbox.Outbox`) on
its own: a stand-in owner and a fake connection (what the outbox reads of it:
protocol level, send quota, maximum packet size, topic alias maximum,
paused, and a write function), no protocol, no node."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest
from twisted.internet import task

from tbmq.backends.memory import MemoryDeviceMessageStore
from tbmq.broker.hooks import DropCounter
from tbmq.broker.acknowledgements import on_puback, on_pubacks
from tbmq.broker.outbound import Holds, TurnFlusher
from tbmq.broker.outbox import NO_ENTRIES, Outbox
from tbmq.broker.session import Session, SessionContext, TopicNameCache
from tbmq.config import load_config
from tbmq.errors import ProtocolViolation
from tbmq.model import Message
from tbmq.mqtt import Puback, Publish, ReasonCode
from tbmq.mqtt.decoder import Decoder
from tests.unit.test_router import FakeConnection as RouterFakeConnection, Source


class FakeConnection(RouterFakeConnection):
    """What an outbox sees of its connection (its link), with the client's
    values of a CONNECT."""

    def __init__(self, *, protocol_level=4, send_quota=65535, max_packet_size=None,
                 topic_alias_maximum=0) -> None:
        super().__init__()
        self.protocol_level = protocol_level
        self.send_quota = send_quota
        self.max_packet_size = max_packet_size
        self.topic_alias_maximum = topic_alias_maximum

    def packets(self) -> list:
        """What was written, decoded as the client reads it."""
        return Decoder(protocol_level=self.protocol_level, server_side=False).feed(self.out)


def make_outbox(conn=None, *, persistent=False, device_store=None, **mqtt):
    """An :class:`Outbox` of its own (its owner a stand-in) on ``conn``."""
    clock = task.Clock()
    clock.advance(1000)
    config = load_config(None, environ={}, overrides={"mqtt": mqtt})
    hooks = SimpleNamespace(wants_delivered=False, wants_dropped=False, wants_published=False)
    ctx = SessionContext(clock=clock, mqtt=config.mqtt, hooks=hooks, drops=DropCounter(),
                         flusher=TurnFlusher(clock), holds=Holds(), device_store=device_store,
                         publish=lambda m, done: None, retained_for=lambda f: [],
                         subscriptions=None, topics=TopicNameCache())
    owner = SimpleNamespace(ctx=ctx, client_id="c", persistent=persistent, session_id="s1")
    outbox = owner.outbox = Outbox(owner, clock.seconds())
    conn = conn or FakeConnection()
    outbox.attach(conn)
    return outbox, conn, clock


def make_session(**kw):
    """A :class:`Session` on a fake connection (for the session's own rules)."""
    outbox, conn, clock = make_outbox(**kw)
    session = Session(outbox.ctx, "c", persistent=outbox.persistent)
    session.attach(conn)
    return session, conn, clock


def deliver(outbox, clock, topic="t", payload=b"x", qos=1, source=None, **kw):
    outbox.deliver(Message(topic, payload, qos, **kw), qos, False, (), None,
                    clock.seconds(), source)


def test_an_idle_outbox_holds_no_queue_and_no_held_sources():
    # an idle connection keeps no deque (760 bytes) and no sets (216 each)
    outbox, conn, clock = make_outbox()
    assert outbox.queue == () and outbox.holder is None  # the held sources: at the first hold
    assert outbox.reader is None  # the store reader: a persistent session's, at its first read
    # nor dicts, lists or a hold credit of its own (64 bytes each)
    assert outbox.dropped is NO_ENTRIES and outbox._app_done is NO_ENTRIES
    assert outbox._completed == ()


def test_the_first_drop_makes_the_outboxs_own_counts():
    outbox, conn, clock = make_outbox()
    other, _, _ = make_outbox()
    outbox.drop("expired")
    outbox.drop("expired")
    assert outbox.dropped == {"expired": 2} and other.dropped == {} and NO_ENTRIES == {}


def test_the_window_is_the_lower_of_the_send_quota_and_max_inflight():
    outbox, conn, clock = make_outbox(FakeConnection(send_quota=2), max_inflight_messages=3)
    for i in range(4):
        deliver(outbox, clock, payload=b"%d" % i)
    sent = conn.packets()
    assert [p.packet_id for p in sent] == [1, 2]
    assert type(outbox.queue) is deque and len(outbox.queue) == 2
    on_puback(outbox.session, Puback(1))
    assert len(outbox.queue) == 2  # the pump waits for the end of the turn
    clock.advance(0)
    assert [p.payload for p in conn.packets()] == [b"0", b"1", b"2"]
    assert sorted(outbox.inflight) == [2, 3] and len(outbox.queue) == 1


def test_a_paused_connection_queues_and_writable_sends_in_order():
    outbox, conn, clock = make_outbox()
    conn.paused = True
    deliver(outbox, clock, payload=b"a")
    deliver(outbox, clock, payload=b"b")
    assert conn.out == b"" and len(outbox.queue) == 2
    conn.paused = False
    outbox.on_writable()
    assert [p.payload for p in conn.packets()] == [b"a", b"b"]
    assert outbox.queued_bytes == 0


def test_a_queue_sent_before_the_first_inflight_entry_keeps_to_the_window():
    # the window counts the in-flight dict that the first send makes: a
    # queue drained when there was none yet sends no more than the window
    # (beyond it, packet identifiers would run out and a delivery be lost)
    outbox, conn, clock = make_outbox(max_inflight_messages=3)
    conn.paused = True
    for i in range(5):
        deliver(outbox, clock, payload=b"%d" % i)
    assert outbox.inflight is NO_ENTRIES and len(outbox.queue) == 5
    conn.paused = False
    outbox.on_writable()
    assert [p.packet_id for p in conn.packets()] == [1, 2, 3]
    assert sorted(outbox.inflight) == [1, 2, 3] and len(outbox.queue) == 2
    assert NO_ENTRIES == {}


def test_a_publish_over_the_clients_maximum_packet_size_is_dropped_and_counted():
    # [MQTT-3.1.2-25]
    outbox, conn, clock = make_outbox(FakeConnection(protocol_level=5, max_packet_size=64))
    deliver(outbox, clock, payload=b"x" * 100)
    deliver(outbox, clock, payload=b"small")
    assert [p.payload for p in conn.packets()] == [b"small"]
    assert outbox.dropped == {"too_large_for_client": 1}
    assert len(outbox.inflight) == 1 and outbox.queue == ()


def test_topic_aliases_follow_the_clients_topic_alias_maximum():
    outbox, conn, clock = make_outbox(FakeConnection(protocol_level=5, topic_alias_maximum=1),
                                       outbound_topic_aliases=5)
    deliver(outbox, clock, topic="a/b", qos=0)
    deliver(outbox, clock, topic="a/b", qos=0)
    first, second = conn.packets()
    assert first.topic == "a/b" and second.topic == ""
    assert first.properties[0x23] == second.properties[0x23] == 1


def test_a_puback_for_a_qos2_delivery_is_a_protocol_error():
    outbox, conn, clock = make_outbox()
    deliver(outbox, clock, qos=2)
    with pytest.raises(ProtocolViolation) as e:
        on_puback(outbox.session, Puback(1))
    assert e.value.reason_code == ReasonCode.PROTOCOL_ERROR


def test_a_run_of_pubacks_finishes_its_deliveries_and_stops_where_on_puback_must_decide():
    """:func:`on_pubacks` takes the PUBACKs of QoS 1 deliveries in flight
    together and stops at an unknown packet id or a QoS 2 delivery, which
    :func:`on_puback` handles (ignored, or a protocol error); the run's
    freed window sends what was queued, once, at the end of the turn."""
    outbox, conn, clock = make_outbox(max_inflight_messages=3)
    for qos in (1, 1, 2, 1, 1):
        deliver(outbox, clock, qos=qos)
    assert sorted(outbox.inflight) == [1, 2, 3] and len(outbox.queue) == 2
    packets = [Puback(1), Puback(2), Puback(9), Puback(3), Publish("t", b"x")]
    assert on_pubacks(outbox.session, packets, 0) == 2  # 9: unknown
    assert sorted(outbox.inflight) == [3]
    assert on_pubacks(outbox.session, packets, 2) == 2
    assert on_pubacks(outbox.session, packets, 3) == 3  # 3: QoS 2, left to on_puback
    with pytest.raises(ProtocolViolation):
        on_puback(outbox.session, packets[3])
    clock.advance(0)  # the pump asked by the run
    assert sorted(outbox.inflight) == [3, 4, 5] and not outbox.queue
    outbox.session.ctx.hooks.wants_delivered = True  # each one's hook: one by one
    assert on_pubacks(outbox.session, [Puback(4), Puback(5)], 0) == 0


def test_a_packet_id_repeated_in_a_run_of_pubacks_is_done_once():
    """A client that acknowledges one packet id twice in one read: the
    second PUBACK is ignored, as :func:`on_puback` ignores an unknown packet
    id, and the delivery is finished once."""
    outbox, conn, clock = make_outbox(max_inflight_messages=3)
    for _ in range(3):
        deliver(outbox, clock, qos=1)
    assert on_pubacks(outbox.session, [Puback(1), Puback(1), Puback(2)], 0) == 3
    assert sorted(outbox.inflight) == [3]


def test_an_overflowing_session_is_disconnected_and_its_queue_given_back():
    outbox, conn, clock = make_outbox(FakeConnection(send_quota=1), max_pending_messages=2,
                                       outbound_pause_timeout=0.1)
    source = Source()
    for i in range(3):
        deliver(outbox, clock, payload=b"%d" % i, source=source)
    clock.advance(0.5)  # the hold credit is used up: the outbox is slow
    assert outbox.slow and not source.paused
    deliver(outbox, clock, payload=b"last", source=source)
    assert conn.closed_with == ReasonCode.QUOTA_EXCEEDED
    assert outbox.queue == () and outbox.inflight == {} and not source.paused
    assert outbox.dropped == {"quota_exceeded": 4}


def test_holding_a_source_makes_a_set_and_letting_go_gives_it_back():
    outbox, conn, clock = make_outbox(FakeConnection(send_quota=1), max_pending_messages=2)
    source = Source()
    for i in range(3):  # one in flight, two queued: the high-water mark
        deliver(outbox, clock, payload=b"%d" % i, source=source)
    assert source.paused and outbox.holder.holding == {source}
    on_puback(outbox.session, Puback(1))  # one queued (at the turn's end): the low-water mark
    clock.advance(0)
    assert not source.paused and outbox.holder.holding == frozenset()
    assert outbox.holder.timer is None and outbox.holder.since is None


def test_a_persistent_session_gives_its_queue_back_when_offline_and_reads_the_store_again():
    store = MemoryDeviceMessageStore()
    outbox, conn, clock = make_outbox(FakeConnection(send_quota=1), persistent=True,
                                       device_store=store)
    outbox.paged_out = False
    assert outbox.reader is None
    deliveries = [_stored(i + 1) for i in range(3)]
    store.add("c", deliveries)
    for delivery in deliveries:
        outbox.deliver_stored(delivery, None, clock.seconds())
    assert len(outbox.queue) == 2
    outbox.detach()
    assert outbox.queue == () and outbox.inflight == {} and outbox.paged_out
    again = FakeConnection(send_quota=1)
    outbox.attach(again)
    outbox.resume()  # the store reader's first read: what was in flight again, with DUP
    clock.advance(0)
    assert outbox.reader is not None and not outbox.reader.loading
    sent = again.packets()
    assert [(p.payload, p.dup) for p in sent] == [(b"1", True)] and len(outbox.queue) == 2


def _stored(seq):
    from tbmq.model import StoredDelivery
    return StoredDelivery(seq, Message("t", b"%d" % seq, 1), 1, False, ())


def test_publish_decoded_by_the_fake_is_a_publish():
    # the fake's decoding is what the client reads (guards the other tests)
    outbox, conn, clock = make_outbox()
    deliver(outbox, clock, qos=0)
    assert [type(p) for p in conn.packets()] == [Publish]
