"""The outbound half of a session (:class:`tbmq.broker.outbox.Outbox`) on
its own: a session with a fake connection (what the outbox reads of it:
protocol level, send quota, maximum packet size, topic alias maximum,
paused, and a write function), no protocol, no node."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest
from twisted.internet import task

from tbmq.backends.memory import MemoryDeviceMessageStore
from tbmq.broker.hooks import DropCounter
from tbmq.broker.outbound import Holds, TurnFlusher
from tbmq.broker.session import Session, SessionContext, TopicNameCache
from tbmq.config import load_config
from tbmq.errors import ProtocolViolation
from tbmq.model import Message
from tbmq.mqtt import Puback, Publish, ReasonCode
from tbmq.mqtt.decoder import Decoder


class FakeConnection:
    """What a session sees of its connection."""

    def __init__(self, *, protocol_level=4, send_quota=65535, max_packet_size=None,
                 topic_alias_maximum=0) -> None:
        self.protocol_level = protocol_level
        self.send_quota = send_quota
        self.max_packet_size = max_packet_size
        self.topic_alias_maximum = topic_alias_maximum
        self.paused = False
        self.paused_bytes = 0
        self.auth = None
        self.written: list[bytes] = []
        self.closed_with = None

    def write(self, data: bytes) -> None:
        self.written.append(data)
        if self.paused:
            self.paused_bytes += len(data)

    def send(self, packet) -> None:
        from tbmq.mqtt.codec import encode
        self.write(encode(packet, self.protocol_level))

    def disconnect(self, code, reason=None) -> None:
        self.closed_with = code

    def packets(self) -> list:
        """What was written, decoded as the client reads it."""
        decoder = Decoder(protocol_level=self.protocol_level, server_side=False)
        return decoder.feed(b"".join(self.written))


class Source:
    def __init__(self) -> None:
        self.paused = False

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False


def make_outbox(conn=None, *, persistent=False, device_store=None, **mqtt):
    clock = task.Clock()
    clock.advance(1000)
    config = load_config(None, environ={}, overrides={"mqtt": mqtt})
    hooks = SimpleNamespace(wants_delivered=False, wants_dropped=False, wants_published=False)
    ctx = SessionContext(clock=clock, mqtt=config.mqtt, hooks=hooks, drops=DropCounter(),
                         flusher=TurnFlusher(clock), holds=Holds(), device_store=device_store,
                         publish=lambda m, done: None, retained_for=lambda f: [],
                         subscriptions=None, topics=TopicNameCache())
    session = Session(ctx, "c", persistent=persistent)
    conn = conn or FakeConnection()
    session.attach(conn)
    return session, conn, clock


def deliver(session, clock, topic="t", payload=b"x", qos=1, source=None, **kw):
    session.deliver(Message(topic, payload, qos, **kw), qos, False, (), None,
                    clock.seconds(), source)


def test_an_idle_outbox_holds_no_queue_and_no_held_sources():
    # an idle connection keeps no deque (760 bytes) and no sets (216 each)
    session, conn, clock = make_outbox()
    assert session.queue == () and type(session._holding) is frozenset
    assert type(session._finished_in_read) is frozenset


def test_the_window_is_the_lower_of_the_send_quota_and_max_inflight():
    session, conn, clock = make_outbox(FakeConnection(send_quota=2), max_inflight_messages=3)
    for i in range(4):
        deliver(session, clock, payload=b"%d" % i)
    sent = conn.packets()
    assert [p.packet_id for p in sent] == [1, 2]
    assert type(session.queue) is deque and len(session.queue) == 2
    session.on_puback(Puback(1))
    assert [p.payload for p in conn.packets()] == [b"0", b"1", b"2"]
    assert sorted(session.inflight) == [2, 3] and len(session.queue) == 1


def test_a_paused_connection_queues_and_writable_sends_in_order():
    session, conn, clock = make_outbox()
    conn.paused = True
    deliver(session, clock, payload=b"a")
    deliver(session, clock, payload=b"b")
    assert conn.written == [] and len(session.queue) == 2
    conn.paused = False
    session.on_writable()
    assert [p.payload for p in conn.packets()] == [b"a", b"b"]
    assert session.queued_bytes == 0


def test_a_publish_over_the_clients_maximum_packet_size_is_dropped_and_counted():
    # [MQTT-3.1.2-25]
    session, conn, clock = make_outbox(FakeConnection(protocol_level=5, max_packet_size=64))
    deliver(session, clock, payload=b"x" * 100)
    deliver(session, clock, payload=b"small")
    assert [p.payload for p in conn.packets()] == [b"small"]
    assert session.dropped == {"too_large_for_client": 1}
    assert len(session.inflight) == 1 and session.queue == ()


def test_topic_aliases_follow_the_clients_topic_alias_maximum():
    session, conn, clock = make_outbox(FakeConnection(protocol_level=5, topic_alias_maximum=1),
                                       outbound_topic_aliases=5)
    deliver(session, clock, topic="a/b", qos=0)
    deliver(session, clock, topic="a/b", qos=0)
    first, second = conn.packets()
    assert first.topic == "a/b" and second.topic == ""
    assert first.properties[0x23] == second.properties[0x23] == 1


def test_a_puback_for_a_qos2_delivery_is_a_protocol_error():
    session, conn, clock = make_outbox()
    deliver(session, clock, qos=2)
    with pytest.raises(ProtocolViolation) as e:
        session.on_puback(Puback(1))
    assert e.value.reason_code == ReasonCode.PROTOCOL_ERROR


def test_an_overflowing_session_is_disconnected_and_its_queue_given_back():
    session, conn, clock = make_outbox(FakeConnection(send_quota=1), max_pending_messages=2,
                                       outbound_pause_timeout=0.1)
    source = Source()
    for i in range(3):
        deliver(session, clock, payload=b"%d" % i, source=source)
    clock.advance(0.5)  # the hold credit is used up: the session is slow
    assert session.slow and not source.paused
    deliver(session, clock, payload=b"last", source=source)
    assert conn.closed_with == ReasonCode.QUOTA_EXCEEDED
    assert session.queue == () and session.inflight == {} and not source.paused
    assert session.dropped == {"quota_exceeded": 4}


def test_holding_a_source_makes_a_set_and_letting_go_gives_it_back():
    session, conn, clock = make_outbox(FakeConnection(send_quota=1), max_pending_messages=2)
    source = Source()
    for i in range(3):  # one in flight, two queued: the high-water mark
        deliver(session, clock, payload=b"%d" % i, source=source)
    assert source.paused and session._holding == {source}
    session.on_puback(Puback(1))  # one queued: the low-water mark
    assert not source.paused and type(session._holding) is frozenset


def test_a_persistent_session_gives_its_queue_back_when_offline():
    session, conn, clock = make_outbox(FakeConnection(send_quota=1), persistent=True,
                                       device_store=MemoryDeviceMessageStore())
    session.paged_out = False
    for i in range(3):
        session.deliver_stored(_stored(i + 1), None, clock.seconds())
    assert len(session.queue) == 2
    session.detach(clock.seconds())
    assert session.queue == () and session.inflight == {} and session.paged_out


def _stored(seq):
    from tbmq.model import StoredDelivery
    return StoredDelivery(seq, Message("t", b"%d" % seq, 1), 1, False, ())


def test_publish_decoded_by_the_fake_is_a_publish():
    # the fake's decoding is what the client reads (guards the other tests)
    session, conn, clock = make_outbox()
    deliver(session, clock, qos=0)
    assert [type(p) for p in conn.packets()] == [Publish]
