"""Faults, overload and bad input (issue 12, items 1-4 and 6), at the
protocol level: raw packets on StringTransport and task.Clock, the exact
reason code or behaviour asserted."""

from __future__ import annotations

import pytest

from tbmq.mqtt import (
    Connack, Connect, Disconnect, Property, Puback, Pubcomp, Publish, Pubrec, Pubrel, Suback,
    Subscribe, SubscriptionRequest, Unsubscribe, Will,
)
from tbmq.mqtt.codec import encode
from tests.helpers import Harness


@pytest.fixture
def h():
    return Harness()


def sub(client, *filters, qos=1, pid=1):
    client.send(Subscribe(pid, [SubscriptionRequest(f, qos) for f in filters]))
    return client.received()


def connect_raw(h, level: int, **connect):
    """Send a CONNECT and return the client (its answer unread)."""
    c = h.raw(level)
    c.send(Connect(protocol_level=level, protocol_name="MQIsdp" if level == 3 else "MQTT",
                   **connect))
    return c


# -- 1. an invalid will is named by its reason code; v3 is closed without CONNACK ----

INVALID_WILLS = [
    # (will, mqtt config, v5 reason code, what the log line names)
    (Will("", b"x"), {}, 0x90, "will topic '' invalid"),
    (Will("a/#", b"x"), {}, 0x90, "will topic 'a/#' invalid"),
    (Will("a/b/c/d", b"x"), {"max_topic_levels": 3}, 0x90, "4 levels"),
    (Will("w", b"x", qos=2), {"max_qos": 1}, 0x9B, "will QoS 2 not supported"),
    (Will("w", b"x", retain=True), {"retain_available": False}, 0x9A, "will retain not supported"),
]


@pytest.mark.parametrize("will, mqtt, code, why", INVALID_WILLS)
def test_v5_invalid_will_gets_the_reason_code_of_its_defect(will, mqtt, code, why, log):
    h = Harness({"mqtt": mqtt})
    c = connect_raw(h, 5, client_id="w", will=will)
    assert c.received() == [Connack(False, code)]
    assert c.closed
    assert any("refused" in line and why in line for line in log), log


@pytest.mark.parametrize("will, mqtt, code, why", INVALID_WILLS)
@pytest.mark.parametrize("level", [3, 4])
def test_v3_invalid_will_is_closed_without_connack(level, will, mqtt, code, why, log):
    """3.1.1 has no return code for a bad will (0x02 would name the client
    identifier): the connection is closed without CONNACK [MQTT-3.1.4-1]."""
    h = Harness({"mqtt": mqtt})
    c = connect_raw(h, level, client_id="w", will=will)
    h.turn()
    assert c.transport.value() == b""
    assert c.closed
    assert any("without CONNACK" in line and why in line for line in log), log
    assert h.client("next", level).connack.reason_code == 0  # the broker goes on


def test_v5_will_payload_not_utf8_with_format_indicator_gets_0x99(h, log):
    will = Will("w", b"\xff\xfe", properties={Property.PAYLOAD_FORMAT_INDICATOR: 1})
    c = connect_raw(h, 5, client_id="w", will=will)
    assert c.received() == [Connack(False, 0x99)] and c.closed
    assert any("will payload is not UTF-8" in line for line in log)


def test_v5_will_response_topic_with_a_wildcard_is_a_protocol_error(h, log):
    will = Will("w", b"x", properties={Property.RESPONSE_TOPIC: "reply/#"})
    c = connect_raw(h, 5, client_id="w", will=will)
    assert c.received() == [Connack(False, 0x82)] and c.closed
    assert any("will response topic invalid" in line for line in log)


def test_a_valid_will_at_the_limits_is_accepted():
    h = Harness({"mqtt": {"max_topic_levels": 3, "max_qos": 1}})
    will = Will("a/b/c", "é".encode(), qos=1, properties={Property.PAYLOAD_FORMAT_INDICATOR: 1})
    assert h.client("w", 5, will=will).connack.reason_code == 0
    assert h.client("v", 4, will=will).connack.reason_code == 0


# -- 2. a reconnect within the will delay cancels the will, clean start or not --------

def will_client(h, clean_start: bool, expiry: int = 100, delay: int = 5, level: int = 5):
    return h.client("w", level=level, clean_start=clean_start,
                    properties={Property.SESSION_EXPIRY_INTERVAL: expiry} if expiry else {},
                    will=Will("will/t", b"gone", 1, False, {Property.WILL_DELAY_INTERVAL: delay}))


@pytest.mark.parametrize("clean_start", [False, True], ids=["resume", "clean-start"])
@pytest.mark.parametrize("expiry", [100, 0], ids=["persistent", "not-persistent"])
def test_reconnect_within_the_will_delay_publishes_no_will(h, clean_start, expiry):
    """[MQTT-3.1.3-9]: a new connection before the Will Delay Interval passed,
    whether it resumes the session or starts a new one."""
    s = h.client("s")
    sub(s, "will/t")
    will_client(h, clean_start=False).lose()
    h.clock.advance(2)
    back = h.client("w", level=5, clean_start=clean_start,
                    properties={Property.SESSION_EXPIRY_INTERVAL: expiry} if expiry else {})
    assert back.connack.reason_code == 0
    h.clock.advance(200)  # past the delay and the old session's expiry
    assert s.received() == []
    assert not s.closed and not back.closed


@pytest.mark.parametrize("clean_start", [False, True], ids=["resume", "clean-start"])
def test_takeover_of_a_live_connection_with_a_will_delay_publishes_no_will(h, clean_start):
    s = h.client("s")
    sub(s, "will/t")
    old = will_client(h, clean_start=False)
    new = h.client("w", level=5, clean_start=clean_start,
                   properties={Property.SESSION_EXPIRY_INTERVAL: 100})
    assert old.received() == [Disconnect(0x8E)] and old.closed
    assert new.connack.reason_code == 0
    h.clock.advance(200)
    assert s.received() == []


def test_the_will_is_still_published_when_nobody_reconnects(h):
    s = h.client("s")
    sub(s, "will/t")
    will_client(h, clean_start=True).lose()
    h.clock.advance(4.9)
    assert s.received() == []
    h.clock.advance(0.2)
    assert [m.payload for m in s.received()] == [b"gone"]


# -- 3. an acknowledgement of the wrong kind is a protocol error ----------------------

def delivery(h, level: int, qos: int):
    """A subscriber of ``level`` with one message of ``qos`` in flight."""
    s = h.client("s", level=level)
    sub(s, "t", qos=qos)
    h.client("p").send(Publish("t", b"m", qos=qos, packet_id=9))
    (publish,) = s.received()
    assert publish.qos == qos
    return s, publish.packet_id


WRONG_ACKS = [
    # (QoS of the delivery, the client's correct acks first, the wrong one)
    (1, [], Pubcomp),
    (1, [], Pubrec),
    (2, [], Puback),
    (2, [Pubrec], Puback),
    (2, [], Pubcomp),
]


@pytest.mark.parametrize("qos, before, wrong", WRONG_ACKS,
                         ids=["PUBCOMP-qos1", "PUBREC-qos1", "PUBACK-qos2",
                              "PUBACK-after-PUBREC", "PUBCOMP-before-PUBREC"])
def test_v5_wrong_acknowledgement_gets_disconnect_0x82(h, log, qos, before, wrong):
    s, pid = delivery(h, 5, qos)
    for ack in before:
        s.send(ack(pid))
        assert s.received() == [Pubrel(pid)]
    s.send(wrong(pid))
    assert s.received() == [Disconnect(0x82)]
    assert s.closed
    assert any("protocol violation" in line and wrong.__name__.upper() in line for line in log)


@pytest.mark.parametrize("qos, before, wrong", WRONG_ACKS)
def test_v311_wrong_acknowledgement_closes_the_connection(h, qos, before, wrong):
    s, pid = delivery(h, 4, qos)
    for ack in before:
        s.send(ack(pid))
        assert s.received() == [Pubrel(pid)]
    s.send(wrong(pid))
    assert s.received() == []
    assert s.closed


def test_acknowledgements_of_unknown_packet_ids_are_not_errors(h):
    s, pid = delivery(h, 5, 1)
    s.send(Puback(pid + 1), Pubcomp(pid + 1))
    s.send(Pubrec(pid + 1))
    assert s.received() == [Pubrel(pid + 1, 0x92)]
    s.send(Puback(pid))
    assert s.received() == [] and not s.closed
    assert not h.broker.sessions.sessions["s"].inflight


# -- 4. MQTT 3.1 may set its reserved CONNECT flags ------------------------------------

def connect_with_reserved_flags(level: int) -> bytes:
    data = bytearray(encode(Connect(protocol_name="MQIsdp" if level == 3 else "MQTT",
                                    protocol_level=level, client_id="old"), level))
    data[0] |= 0x02  # a fixed-header flag
    name_length = 6 if level == 3 else 4
    data[2 + 2 + name_length + 1] |= 0x01  # the reserved connect flag
    return bytes(data)


def test_mqtt31_connect_with_reserved_flags_is_accepted(h):
    """MQTT 3.1 had no rule for them, and old devices set them (as Mosquitto,
    accepted for level 3 only)."""
    s = h.client("s")
    sub(s, "t")
    c = h.raw(3)
    c.send_bytes(connect_with_reserved_flags(3))
    assert c.received() == [Connack(False, 0)]
    c.send(Publish("t", b"from 3.1"))
    assert [m.payload for m in s.received()] == [b"from 3.1"]


@pytest.mark.parametrize("level", [4, 5])
def test_mqtt311_and_5_connect_with_reserved_flags_is_malformed(h, level, log):
    """3.1.1: closed without CONNACK; 5.0: CONNACK 0x81 with a Reason String
    naming the rule, then closed [MQTT-4.13.1-1]."""
    c = h.raw(level)
    c.send_bytes(connect_with_reserved_flags(level))
    got = c.received()
    if level == 5:
        [ack] = got
        assert ack.reason_code == 0x81
        assert "[MQTT-2.1.3-1]" in ack.properties[Property.REASON_STRING]
    else:
        assert got == []
    assert c.closed
    assert any("malformed packet" in line and "[MQTT-2.1.3-1]" in line for line in log)


# -- 6. defaults that bound one client's cost -------------------------------------------

def test_default_limits_are_announced_and_enforced(h):
    cfg = h.config.mqtt
    c = h.client("c", level=5)
    p = c.connack.properties
    assert (p[Property.RECEIVE_MAXIMUM], p[Property.MAXIMUM_PACKET_SIZE],
            p[Property.TOPIC_ALIAS_MAXIMUM]) == (128, 1048576, 10)
    assert (cfg.max_topic_levels, cfg.max_subscriptions) == (128, 1000)
    c.send(Publish("t", b"x", properties={Property.TOPIC_ALIAS: 11}))
    assert c.received() == [Disconnect(0x94)]
    big = h.client("big", level=5)
    big.send_bytes(encode(Publish("t", b"x" * 1048576), 5))
    assert big.received() == [Disconnect(0x95)]


def test_v5_receive_maximum_128_and_v3_is_held_to_the_packet_id_space(h):
    v5 = h.client("v5", level=5)
    v5.send(*[Publish("t", b"x", qos=2, packet_id=i) for i in range(1, 130)])
    got = v5.received()
    assert got[:128] == [Pubrec(i) for i in range(1, 129)] and got[128:] == [Disconnect(0x93)]
    v3 = h.client("v3", level=4)
    v3.send(*[Publish("t", b"x", qos=2, packet_id=i) for i in range(1, 201)])
    assert v3.received() == [Pubrec(i) for i in range(1, 201)] and not v3.closed


def test_default_topic_levels_128_accepted_129_refused(h):
    c = h.client("c", level=5)
    assert sub(c, "/".join("a" * 128), "/".join(["+"] * 129)) == [Suback(1, [1, 0x8F])]
    c.send(Publish("/".join("a" * 128), b"ok", qos=1, packet_id=1),
           Publish("/".join("a" * 129), b"deep", qos=1, packet_id=2))
    got = c.received()
    assert [m.payload for m in got if isinstance(m, Publish)] == [b"ok"]
    assert Puback(2, 0x90) in got and not c.closed


@pytest.fixture
def shallow():
    return Harness({"mqtt": {"max_topic_levels": 3}})


def test_v5_deep_topic_name_refused_in_its_acknowledgement(shallow, log):
    s = shallow.client("s")
    sub(s, "#")
    p = shallow.client("p", level=5)
    p.send(Publish("a/b/c/d", b"1", qos=1, packet_id=1),
           Publish("a/b/c/d", b"2", qos=2, packet_id=2),
           Publish("a/b/c", b"3", qos=1, packet_id=3))
    assert p.received() == [Puback(1, 0x90), Pubrec(2, 0x90), Puback(3)]
    assert [m.payload for m in s.received()] == [b"3"]
    assert not p.closed
    assert any("refused (0x90)" in line and "4 levels" in line for line in log)
    p.send(Publish("a/b/c/d", b"qos 0"))
    assert p.received() == [Disconnect(0x90)] and p.closed


def test_v3_deep_topic_name_closes_the_connection(shallow):
    p = shallow.client("p", level=4)
    p.send(Publish("a/b/c/d", b"1", qos=1, packet_id=1))
    assert p.received() == [] and p.closed


@pytest.mark.parametrize("level, refused", [(5, 0x8F), (4, 0x80)])
def test_deep_topic_filter_refused(shallow, level, refused):
    c = shallow.client("c", level=level)
    got = sub(c, "a/b/c", "a/b/+/#", "$share/g/a/b/c", "$share/g/a/b/c/d", "a/b/c/d")
    assert got == [Suback(1, [1, refused, 1, refused, refused])]
    assert set(shallow.broker.sessions.sessions["c"].subscriptions) == {"a/b/c", "$share/g/a/b/c"}


@pytest.mark.parametrize("level, refused", [(5, 0x97), (4, 0x80)])
def test_subscriptions_per_session_are_limited(level, refused, log):
    h = Harness({"mqtt": {"max_subscriptions": 2}})
    c = h.client("c", level=level)
    assert sub(c, "a", "b", "c", pid=1) == [Suback(1, [1, 1, refused])]
    assert sub(c, "a", pid=2) == [Suback(2, [1])]  # a replaced subscription is not a new one
    c.send(Unsubscribe(3, ["a"]))
    c.received()
    assert sub(c, "c", pid=4) == [Suback(4, [1])]
    assert set(h.broker.sessions.sessions["c"].subscriptions) == {"b", "c"}
    assert any("2 subscriptions, the most allowed" in line for line in log)
