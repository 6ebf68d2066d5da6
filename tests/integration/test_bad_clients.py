"""Misbehaving clients over raw sockets: each is disconnected by the broker
(for v5, with the reason code read from the bytes it sent), while a
well-behaved paho publisher/subscriber pair, connected for the whole module,
keeps working before and after every test.

The broker runs with ``max_packet_size: 1024``, ``connect_timeout: 1``,
``topic_alias_maximum: 10`` and ``receive_maximum: 2``.
"""

from __future__ import annotations

import random
import time

import pytest

from tbmq.mqtt import (
    Auth, Connack, Connect, Disconnect, Pingreq, Pingresp, Property, Puback, Pubcomp, Publish,
    Pubrec, Pubrel, ReasonCode, Subscribe, SubscriptionRequest, Will,
)
from tbmq.mqtt.codec import Decoder, encode
from tests.integration.helpers import PahoClient, uid

pytestmark = pytest.mark.timeout(60)

MAX_PACKET_SIZE = 1024
CONNECT_TIMEOUT = 1
TOPIC_ALIAS_MAXIMUM = 10
RECEIVE_MAXIMUM = 2

BROKER_ENV = {
    "TBMQ_MQTT__MAX_PACKET_SIZE": str(MAX_PACKET_SIZE),
    "TBMQ_MQTT__CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
    "TBMQ_MQTT__TOPIC_ALIAS_MAXIMUM": str(TOPIC_ALIAS_MAXIMUM),
    "TBMQ_MQTT__RECEIVE_MAXIMUM": str(RECEIVE_MAXIMUM),
}


class HealthyPair:
    """A v5 subscriber and a v3.1.1 publisher that stay connected."""

    def __init__(self, port: int) -> None:
        self.topic = f"health/{uid()}"
        self.sub = PahoClient(port, 5).connect_and_wait()
        assert self.sub.subscribe(self.topic, 1) == [1]
        self.pub = PahoClient(port, 4).connect_and_wait()
        self.count = 0

    def check(self) -> None:
        self.count += 1
        payload = f"ping {self.count}".encode()
        assert not self.sub.disconnected.is_set(), "the healthy subscriber was disconnected"
        assert not self.pub.disconnected.is_set(), "the healthy publisher was disconnected"
        self.pub.publish(self.topic, payload, 1)
        m = self.sub.get()
        assert (m.topic, m.payload) == (self.topic, payload)

    def close(self) -> None:
        self.sub.close()
        self.pub.close()


@pytest.fixture(scope="module")
def pair(broker):
    p = HealthyPair(broker.port)
    yield p
    p.close()


@pytest.fixture(autouse=True)
def healthy(pair):
    pair.check()
    yield
    pair.check()


def connect_bytes(name: bytes, level: int, body_after_keepalive: bytes) -> bytes:
    """A CONNECT with clean start, keep alive 60, built by hand."""
    body = len(name).to_bytes(2, "big") + name + bytes([level, 0x02, 0x00, 0x3C]) + body_after_keepalive
    assert len(body) < 128
    return bytes([0x10, len(body)]) + body


def assert_disconnected_with(packets, code: int) -> None:
    """The broker's last word to a v5 client was DISCONNECT ``code``."""
    disconnects = [p for p in packets if isinstance(p, Disconnect)]
    assert disconnects, f"no DISCONNECT before the close; got {packets}"
    assert disconnects[-1].reason_code == code, (
        f"DISCONNECT 0x{disconnects[-1].reason_code:02X}, expected 0x{code:02X}")


# ---------------------------------------------------------------------------
# Before CONNECT
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("garbage", [
    b"\xff" * 10,
    random.Random(1883).randbytes(64),
    b"\x10\xff\xff\xff\xff\x7f",  # a remaining length of 5 bytes
    b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"\x00" * 4,
], ids=["ff", "random", "bad-length", "http", "zeros"])
def test_garbage_before_connect_closed(raw, garbage):
    c = raw(decode=False)
    c.send(garbage)
    c.wait_closed()
    assert not c.received.startswith(b"\x20\x02\x00\x00"), "accepted garbage as CONNECT"


def test_garbage_after_connect_v5(raw):
    """Reserved flags set (a PUBLISH-less 0xFF type byte) after CONNECT:
    malformed packet, DISCONNECT 0x81 [MQTT-2.1.3-1]."""
    c = raw(5)
    assert c.connect().reason_code == 0
    c.send(b"\xff" * 10)
    assert_disconnected_with(c.wait_closed(), 0x81)


def test_garbage_after_connect_v311(raw):
    c = raw(4)
    assert c.connect().reason_code == 0
    c.send(b"\xff" * 10)
    assert c.wait_closed() == []


def test_publish_before_connect_closed(raw, pair):
    c = raw(4, decode=False)
    c.send(encode(Publish(pair.topic, b"sneaky", qos=1, packet_id=1), 4))
    c.wait_closed()
    assert c.received == b"", f"broker answered {c.received!r}"
    # not routed: the next healthy check gets its own ping first


def test_subscribe_before_connect_closed(raw):
    c = raw(4, decode=False)
    c.send(encode(Subscribe(1, [SubscriptionRequest("#", 0)]), 4))
    c.wait_closed()
    assert c.received == b""


def test_no_connect_closed_after_connect_timeout(raw):
    c = raw(decode=False)
    start = time.monotonic()
    c.wait_closed(timeout=15)
    elapsed = time.monotonic() - start
    assert c.received == b""
    assert CONNECT_TIMEOUT * 0.5 <= elapsed <= 10, f"closed after {elapsed:.2f} s"


def test_partial_connect_closed_after_connect_timeout(raw):
    c = raw(decode=False)
    c.send(encode(Connect(client_id="half", protocol_level=5), 5)[:6])
    start = time.monotonic()
    c.wait_closed(timeout=15)
    assert c.received == b""
    assert time.monotonic() - start <= 10


# ---------------------------------------------------------------------------
# CONNECT itself
# ---------------------------------------------------------------------------


def test_unsupported_protocol_level_6_v5_style(raw):
    """A v5-shaped CONNECT (with a property length) at level 6: CONNACK 0x84
    (Unsupported Protocol Version) in the v5 layout, then closed."""
    c = raw(5, decode=False)
    c.send(connect_bytes(b"MQTT", 6, b"\x00" + b"\x00\x02id"))
    c.wait_closed()
    assert c.received == b"\x20\x03\x00\x84\x00", f"got {c.received!r}"


def test_unsupported_protocol_level_above_5(raw):
    """A CONNECT at a level above 5: a client newer than MQTT 5 is answered
    in the MQTT 5 layout, CONNACK 0x84 UNSUPPORTED_PROTOCOL_VERSION
    [MQTT-3.1.2-2], then closed; levels below 3 get the v3 0x01 (below)."""
    c = raw(4, decode=False)
    c.send(connect_bytes(b"MQTT", 7, b"\x00\x02id"))
    c.wait_closed()
    assert c.received == b"\x20\x03\x00\x84\x00", f"got {c.received!r}"


@pytest.mark.parametrize("name,level", [(b"MQTT", 3), (b"MQTT", 2), (b"MQIsdp", 4)],
                         ids=["MQTT-3", "MQTT-2", "MQIsdp-4"])
def test_unsupported_protocol_level_v3(raw, name, level):
    c = raw(4, decode=False)
    c.send(connect_bytes(name, level, b"\x00\x02id"))
    c.wait_closed()
    assert c.received == b"\x20\x02\x00\x01", f"got {c.received!r}"


def test_unknown_protocol_name_closed(raw):
    """[MQTT-3.1.2-1]: the server MAY NOT continue; it closes, no CONNACK
    needed."""
    c = raw(decode=False)
    c.send(connect_bytes(b"XMPP", 4, b"\x00\x02id"))
    c.wait_closed()
    assert not c.received.startswith(b"\x20\x02\x00\x00")


def test_second_connect_v5(raw):
    c = raw(5)
    assert c.connect().reason_code == 0
    c.send(Connect(client_id=f"again-{uid()}", protocol_level=5))
    assert_disconnected_with(c.wait_closed(), 0x82)


def test_second_connect_v311(raw):
    c = raw(4)
    assert c.connect().reason_code == 0
    c.send(Connect(client_id=f"again-{uid()}", protocol_level=4))
    assert c.wait_closed() == []


def test_oversized_connect_closed(raw):
    c = raw(5)
    c.send(Connect(client_id="x" * 2000, protocol_level=5))
    packets = c.wait_closed()
    # a CONNACK, if any, must be a refusal (0x95 Packet too large)
    assert all(not isinstance(p, Connack) or p.reason_code == 0x95 for p in packets), packets


# ---------------------------------------------------------------------------
# After CONNECT
# ---------------------------------------------------------------------------


def test_oversized_publish_v5(raw, pair):
    c = raw(5)
    ack = c.connect()
    assert ack.reason_code == 0
    assert ack.properties.get(Property.MAXIMUM_PACKET_SIZE) == MAX_PACKET_SIZE
    packet = encode(Publish(pair.topic, b"x" * 2000, qos=1, packet_id=1), 5)
    assert len(packet) > MAX_PACKET_SIZE
    c.send(packet)
    packets = c.wait_closed()
    assert not any(isinstance(p, Puback) for p in packets), packets
    assert_disconnected_with(packets, 0x95)


def test_oversized_publish_v311(raw, pair):
    c = raw(4)
    assert c.connect().reason_code == 0
    c.send(encode(Publish(pair.topic, b"x" * 2000, qos=1, packet_id=1), 4))
    assert c.wait_closed() == []


def test_publish_at_max_packet_size_accepted(raw, pair):
    """Exactly max_packet_size bytes (fixed header included) is allowed."""
    c = raw(5)
    assert c.connect().reason_code == 0
    probe = encode(Publish(pair.topic, b"", qos=1, packet_id=1), 5)
    payload = b"y" * (MAX_PACKET_SIZE - len(probe) - 1)  # one more remaining-length byte
    packet = encode(Publish(pair.topic, payload, qos=1, packet_id=1), 5)
    assert len(packet) == MAX_PACKET_SIZE, len(packet)
    c.send(packet)
    assert c.expect() == Puback(1)
    assert pair.sub.get().payload == payload
    c.disconnect()


def test_v5_keepalive_missed(raw):
    c = raw(5)
    assert c.connect(keep_alive=1).reason_code == 0
    start = time.monotonic()
    packets = c.wait_closed(timeout=15)
    elapsed = time.monotonic() - start
    assert_disconnected_with(packets, 0x8D)
    assert 1.0 <= elapsed <= 10, f"closed after {elapsed:.2f} s (keep alive 1 s x 1.5)"


def test_v311_keepalive_missed(raw):
    c = raw(4)
    assert c.connect(keep_alive=1).reason_code == 0
    start = time.monotonic()
    assert c.wait_closed(timeout=15) == []
    assert 1.0 <= time.monotonic() - start <= 10


def test_keepalive_kept_by_pingreq(raw):
    """PINGREQs every 0.3 s keep a keep-alive-1 connection open past 3 s."""
    c = raw(5)
    assert c.connect(keep_alive=1).reason_code == 0
    start = time.monotonic()
    while time.monotonic() - start < 3.0:
        c.send(Pingreq())
        assert c.expect() == Pingresp()
        time.sleep(0.3)
    c.disconnect()


def test_v5_wildcard_in_topic_name(raw):
    c = raw(5)
    assert c.connect().reason_code == 0
    c.send(Publish(f"{uid()}/+", b"x", qos=0))
    assert_disconnected_with(c.wait_closed(), 0x90)


def test_v5_topic_alias_out_of_range(raw):
    c = raw(5)
    ack = c.connect()
    assert ack.properties.get(Property.TOPIC_ALIAS_MAXIMUM) == TOPIC_ALIAS_MAXIMUM
    c.send(Publish(f"{uid()}/a", b"x", properties={Property.TOPIC_ALIAS: TOPIC_ALIAS_MAXIMUM + 1}))
    assert_disconnected_with(c.wait_closed(), 0x94)


def test_v5_topic_alias_zero(raw):
    c = raw(5)
    assert c.connect().reason_code == 0
    c.send(Publish(f"{uid()}/a", b"x", properties={Property.TOPIC_ALIAS: 0}))
    assert_disconnected_with(c.wait_closed(), 0x94)


def test_v5_unknown_topic_alias(raw):
    """An empty topic with an alias never set: protocol error."""
    c = raw(5)
    assert c.connect().reason_code == 0
    c.send(Publish("", b"x", properties={Property.TOPIC_ALIAS: 7}))
    assert_disconnected_with(c.wait_closed(), 0x82)


def test_v5_qos_3_publish(raw):
    """QoS bits 11 are malformed [MQTT-3.3.1-4]."""
    c = raw(5)
    assert c.connect().reason_code == 0
    good = encode(Publish(f"{uid()}/q", b"x", qos=1, packet_id=1), 5)
    c.send(bytes([good[0] | 0x06]) + good[1:])
    assert_disconnected_with(c.wait_closed(), 0x81)


def test_v5_invalid_utf8_payload_with_format_indicator(raw, pair):
    """Payload Format Indicator 1 with a non-UTF-8 payload: PUBACK 0x99
    (Payload format invalid); the connection stays usable."""
    c = raw(5)
    assert c.connect().reason_code == 0
    c.send(Publish(pair.topic, b"\xff\xfe", qos=1, packet_id=3,
                   properties={Property.PAYLOAD_FORMAT_INDICATOR: 1}))
    ack = c.expect()
    assert isinstance(ack, Puback) and ack.packet_id == 3 and ack.reason_code == 0x99
    c.send(Pingreq())
    assert c.expect() == Pingresp()
    c.disconnect()


def test_many_bad_clients_at_once(raw):
    """Twenty garbage connections and twenty silent ones together."""
    noisy = [raw(decode=False) for _ in range(20)]
    silent = [raw(decode=False) for _ in range(20)]
    for c in noisy:
        c.send(b"\xff" * 10)
    for c in noisy + silent:
        c.wait_closed(timeout=15)


def test_v5_receive_maximum_exceeded(raw):
    """More unacknowledged QoS 2 PUBLISHes than the announced Receive
    Maximum (2): DISCONNECT 0x93 [MQTT-3.3.4-8]."""
    c = raw(5)
    ack = c.connect()
    assert ack.properties.get(Property.RECEIVE_MAXIMUM) == RECEIVE_MAXIMUM
    topic = f"{uid()}/rm"
    c.send(b"".join(encode(Publish(topic, b"x", qos=2, packet_id=i), 5) for i in (1, 2, 3)))
    packets = c.wait_closed()
    assert [p for p in packets if isinstance(p, Pubrec)] == [Pubrec(1), Pubrec(2)]
    assert_disconnected_with(packets, 0x93)


def test_receive_maximum_respected_is_fine(raw):
    """Completing each QoS 2 flow keeps a client under the limit."""
    c = raw(5)
    c.connect()
    topic = f"{uid()}/rm-ok"
    for i in range(1, 6):
        c.send(Publish(topic, b"x", qos=2, packet_id=i))
        assert c.expect() == Pubrec(i)
        c.send(Pubrel(i))
        assert c.expect() == Pubcomp(i)
    c.disconnect()


def test_v5_pubrel_unknown_packet_id(raw):
    """PUBREL for an unknown id: PUBCOMP 0x92 (Packet Identifier not found);
    the connection stays."""
    c = raw(5)
    c.connect()
    c.send(Pubrel(77))
    assert c.expect() == Pubcomp(77, 0x92)
    c.send(Pingreq())
    assert c.expect() == Pingresp()
    c.disconnect()


def test_v5_session_expiry_set_from_zero_on_disconnect(raw, mqtt):
    """CONNECT with no session expiry, DISCONNECT with one: protocol error
    [MQTT-3.14.2-2]: the broker answers DISCONNECT 0x82 and publishes the
    will (the DISCONNECT did not end the connection normally)."""
    topic = f"{uid()}/will"
    watcher = mqtt.connect(5)
    watcher.subscribe(topic, 1)
    c = raw(5)
    c.connect(will=Will(topic, b"protocol error", qos=1))
    c.send(Disconnect(0, {Property.SESSION_EXPIRY_INTERVAL: 60}))
    assert_disconnected_with(c.wait_closed(), 0x82)
    assert watcher.get().payload == b"protocol error"


def test_v5_auth_without_method(raw):
    c = raw(5)
    c.connect()
    c.send(Auth(0x19))
    assert_disconnected_with(c.wait_closed(), 0x82)


def test_v5_no_local_on_shared_subscription(raw):
    """[MQTT-3.8.3-4]: No Local on a shared subscription is a protocol error."""
    c = raw(5)
    c.connect()
    c.send(Subscribe(1, [SubscriptionRequest(f"$share/g/{uid()}", 1, no_local=True)]))
    assert_disconnected_with(c.wait_closed(), 0x82)


def test_v5_subscription_identifier_zero(raw):
    """A Subscription Identifier of 0 is a protocol error (3.8.2.1.2)."""
    c = raw(5)
    c.connect()
    c.send(Subscribe(1, [SubscriptionRequest(f"{uid()}/s", 1)],
                     {Property.SUBSCRIPTION_IDENTIFIER: [0]}))
    packets = c.wait_closed()
    disconnects = [p.reason_code for p in packets if isinstance(p, Disconnect)]
    # 0x82 (Protocol Error) or the more general 0x81 (Malformed Packet)
    assert disconnects and disconnects[-1] in (0x81, 0x82), packets


def test_subscribe_with_bad_reserved_flags(raw, mqtt_version):
    """SUBSCRIBE must have flags 0010 [MQTT-3.8.1-1]; 0000 is malformed."""
    c = raw(mqtt_version)
    c.connect()
    good = encode(Subscribe(1, [SubscriptionRequest(f"{uid()}/s", 1)]), mqtt_version)
    c.send(bytes([good[0] & 0xF0]) + good[1:])
    packets = c.wait_closed()
    if mqtt_version == 5:
        assert_disconnected_with(packets, 0x81)
    else:
        assert packets == []


def test_v5_connect_with_receive_maximum_zero(raw):
    """Receive Maximum 0 in a v5 CONNECT is a protocol error (3.1.2.11.3):
    CONNACK 0x82 with a Reason String, then the close [MQTT-4.13.1-1,
    MQTT-3.2.2-7]."""
    c = raw(5, decode=False)
    props = bytes((Property.RECEIVE_MAXIMUM, 0x00, 0x00))
    client_id = f"rm0-{uid()}".encode()
    c.send(connect_bytes(b"MQTT", 5, bytes((len(props),)) + props
                         + len(client_id).to_bytes(2, "big") + client_id))
    c.wait_closed()
    assert c.received[:1] == b"\x20", f"no CONNACK first: {c.received!r}"
    [ack] = Decoder(protocol_level=5, server_side=False).feed(c.received)
    assert type(ack) is Connack and ack.reason_code == ReasonCode.PROTOCOL_ERROR, ack
    assert "RECEIVE_MAXIMUM" in ack.properties[Property.REASON_STRING]


@pytest.mark.parametrize("level, first, answer", [
    (None, 0x00, []),              # the reserved type, as the first byte ever sent
    (4, 0xF0, []),                 # AUTH, which 3.1.1 does not have
    (5, 0x00, [Disconnect(ReasonCode.MALFORMED_PACKET)]),
], ids=["00-before-connect", "f0-v311", "00-v5"])
def test_a_forbidden_first_byte_is_closed_at_once(raw, level, first, answer):
    """One byte of a forbidden packet type and nothing more: closed within
    0.5 s (before CONNECT the connect timeout would close it only after 1 s;
    after CONNECT, nothing would until the incomplete-packet timeout)."""
    c = raw(level or 4)
    if level is not None:
        assert c.connect().reason_code == 0
    start = time.monotonic()
    c.send(bytes((first,)))
    packets = c.wait_closed(timeout=5)
    elapsed = time.monotonic() - start
    assert packets == answer
    assert elapsed < 0.5, f"closed {elapsed:.2f} s after the byte"


def test_publish_invalid_utf8_topic(raw, mqtt_version):
    """A topic name that is not UTF-8 is malformed [MQTT-1.5.4-1]."""
    c = raw(mqtt_version)
    c.connect()
    topic = b"bad\xff\xfe"
    body = len(topic).to_bytes(2, "big") + topic + (b"\x00" if mqtt_version == 5 else b"") + b"x"
    c.send(bytes([0x30, len(body)]) + body)
    packets = c.wait_closed()
    if mqtt_version == 5:
        assert_disconnected_with(packets, 0x81)
    else:
        assert packets == []
