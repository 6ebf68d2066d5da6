"""Protocol and session behaviour on StringTransport and task.Clock."""

import pytest

from tbmq.mqtt import (
    Connack, Connect, Disconnect, Pingreq, Pingresp, Property, Puback, Pubcomp, Publish,
    Pubrec, Pubrel, Suback, Subscribe, SubscriptionRequest, Unsuback, Unsubscribe, Will,
)
from tbmq.mqtt.codec import encode
from tests.helpers import Harness


def sub(client, *filters, qos=1, pid=1, props=None, **opts):
    client.send(Subscribe(pid, [SubscriptionRequest(f, qos, **opts) for f in filters], props or {}))
    return client.received()


@pytest.fixture
def h():
    return Harness()


# -- CONNECT ---------------------------------------------------------------------

def test_v5_connack_carries_the_server_capabilities(h):
    c = h.client("a", level=5, keep_alive=30)
    ack = c.connack
    assert ack.reason_code == 0 and ack.session_present is False
    p = ack.properties
    assert p[Property.RECEIVE_MAXIMUM] == h.config.mqtt.receive_maximum == 128
    assert p[Property.MAXIMUM_PACKET_SIZE] == h.config.mqtt.max_packet_size
    assert p[Property.TOPIC_ALIAS_MAXIMUM] == h.config.mqtt.topic_alias_maximum
    assert p[Property.RETAIN_AVAILABLE] == 1
    assert p[Property.WILDCARD_SUBSCRIPTION_AVAILABLE] == 1
    assert p[Property.SUBSCRIPTION_IDENTIFIER_AVAILABLE] == 1
    assert p[Property.SHARED_SUBSCRIPTION_AVAILABLE] == 1
    assert Property.MAXIMUM_QOS not in p  # 2 is the default, not sent


def test_capabilities_follow_the_config():
    h = Harness({"mqtt": {"max_qos": 1, "max_keep_alive": 20, "retain_available": False}})
    c = h.client("a", level=5, keep_alive=100)
    p = c.connack.properties
    assert p[Property.MAXIMUM_QOS] == 1
    assert p[Property.SERVER_KEEP_ALIVE] == 20
    assert p[Property.RETAIN_AVAILABLE] == 0
    c.send(Publish("t", b"x", qos=0, retain=True))
    assert c.received() == [Disconnect(0x9A)]
    assert c.closed


@pytest.mark.parametrize("level,name,code", [(6, "MQTT", 0x84), (2, "MQTT", 0x01), (7, "MQIsdp", 0x84)])
def test_unsupported_protocol_level(h, level, name, code):
    c = h.raw(level=5)
    c.send(Connect(protocol_name=name, protocol_level=level, client_id="x"))
    data = c.transport.value()
    assert data[0] == 0x20 and data[3] == code  # CONNACK, reason / return code
    assert c.closed


def test_empty_client_id_is_assigned_in_v5_and_refused_for_v311_persistent(h):
    c = h.client("", level=5)
    assigned = c.connack.properties[Property.ASSIGNED_CLIENT_IDENTIFIER]
    assert assigned and assigned in h.broker.sessions.sessions
    d = h.client("", level=4, clean_start=False)
    assert d.connack.reason_code == 0x02 and d.closed
    e = h.client("", level=4)
    assert e.connack.reason_code == 0


def test_client_id_too_long():
    h = Harness({"mqtt": {"max_client_id_length": 23}})
    c = h.client("x" * 24, level=5)
    assert c.connack.reason_code == 0x85 and c.closed


def test_connect_timeout_closes_a_silent_connection(h):
    c = h.raw()
    h.clock.advance(h.config.mqtt.connect_timeout - 0.1)
    assert not c.closed
    h.clock.advance(0.2)
    assert c.closed


def test_keepalive_is_one_and_a_half_times_the_interval(h):
    c = h.client("k", level=5, keep_alive=10)
    h.clock.advance(14)
    c.send(Pingreq())
    assert c.received() == [Pingresp()]
    h.clock.advance(14.9)
    assert not c.closed
    h.clock.advance(0.2)
    assert c.received() == [Disconnect(0x8D)]
    assert c.closed


def test_packet_before_connect_closes(h):
    c = h.raw()
    c.send(Publish("a", b"x"))
    assert c.received() == [] and c.closed


def test_second_connect_is_a_protocol_error(h):
    c = h.client("a", level=5)
    c.send(Connect(protocol_level=5, client_id="a"))
    assert c.received() == [Disconnect(0x82)] and c.closed


def test_garbage_closes_and_other_clients_go_on(h):
    good = h.client("good")
    sub(good, "t")
    bad = h.client("bad", level=5)
    bad.send_bytes(b"\xf0\xff\xff\xff\xff\x7f")
    assert bad.received() == [Disconnect(0x81)] and bad.closed
    pub = h.client("pub")
    pub.send(Publish("t", b"still"))
    assert good.received()[0].payload == b"still"


def test_oversized_packet_gets_0x95():
    h = Harness({"mqtt": {"max_packet_size": 100}})
    c = h.client("a", level=5)
    c.send_bytes(b"\x30\xc8\x01")  # PUBLISH header announcing 200 bytes
    assert c.received() == [Disconnect(0x95)] and c.closed


def test_auth_hook_refusal_gives_v5_and_v3_codes():
    h = Harness({"auth": {"allow_anonymous": False}})
    assert h.client("a", level=5).connack.reason_code == 0x87
    assert h.client("b", level=4).connack.reason_code == 0x05


@pytest.mark.parametrize("level, first, answer", [
    (None, 0x00, []),                # reserved type, before CONNECT
    (None, 0xF0, []),                # not CONNECT first [MQTT-3.1.0-1]
    (4, 0xF0, []),                   # AUTH in 3.1.1
    (4, 0x00, []),
    (5, 0x00, [Disconnect(0x81)]),   # reserved type
    (5, 0x20, [Disconnect(0x82)]),   # CONNACK to a server
    (5, 0x10, [Disconnect(0x82)]),   # second CONNECT [MQTT-3.1.0-2]
    (5, 0x36, [Disconnect(0x81)]),   # PUBLISH QoS 3 [MQTT-3.3.1-4]
], ids=["00-before-connect", "f0-before-connect", "f0-v311", "00-v311", "00-v5", "20-v5",
        "10-v5", "36-v5"])
def test_a_forbidden_first_byte_closes_at_once(h, level, first, answer):
    """One byte, nothing after it and no time passing: the connection is
    closed (v5: DISCONNECT with the reason code) without waiting for a
    Remaining Length that may never come."""
    c = h.raw() if level is None else h.client("one-byte", level=level)
    assert level is None or c.connack.reason_code == 0
    c.send_bytes(bytes((first,)))
    assert c.closed
    if level is not None:
        assert c.received() == answer
    else:
        assert c.transport.value() == b""


def test_a_valid_first_byte_waits_for_the_rest(h):
    c = h.client("waits", level=4)
    c.send_bytes(b"\x30")
    assert not c.closed
    c.send_bytes(b"\x03\x00\x01t")
    c.send(Pingreq())
    assert c.received() == [Pingresp()] and not c.closed


def v5_connect(props: bytes, client_id: bytes = b"bad") -> bytes:
    """A v5 CONNECT (clean start, keep alive 60) with raw property bytes."""
    body = (b"\x00\x04MQTT\x05\x02\x00\x3c" + bytes((len(props),)) + props
            + len(client_id).to_bytes(2, "big") + client_id)
    return bytes((0x10, len(body))) + body


@pytest.mark.parametrize("props, code, words", [
    (b"\x21\x00\x00", 0x82, "RECEIVE_MAXIMUM must not be 0"),
    (b"\x27\x00\x00\x00\x00", 0x82, "MAXIMUM_PACKET_SIZE must not be 0"),
    (b"\x17\x02", 0x82, "REQUEST_PROBLEM_INFORMATION must be 0 or 1"),
    (b"\x11\x00\x00\x00\x01\x11\x00\x00\x00\x01", 0x82, "SESSION_EXPIRY_INTERVAL included twice"),
    (b"\x23\x00\x01", 0x81, "TOPIC_ALIAS not valid"),
    (b"\x21\x00", 0x81, "truncated"),
], ids=["receive-maximum-0", "maximum-packet-size-0", "request-problem-information-2",
        "duplicate", "topic-alias", "truncated"])
def test_v5_connect_breaking_a_rule_gets_connack_with_a_reason_string(h, props, code, words):
    """[MQTT-4.13.1-1, MQTT-3.2.2-7]: a v5 CONNECT the decoder refuses once
    its protocol level is read is answered CONNACK with the reason code of
    the error and a Reason String naming it, then closed; no session."""
    c = h.raw(level=5)
    c.send_bytes(v5_connect(props))
    [ack] = c.received()
    assert type(ack) is Connack and (ack.session_present, ack.reason_code) == (False, code)
    assert words in ack.properties[Property.REASON_STRING]
    assert c.closed and "bad" not in h.broker.sessions.sessions


def test_v311_malformed_connect_is_closed_without_connack(h):
    """3.1.1 has no return code for a malformed CONNECT [MQTT-3.1.4-1]."""
    c = h.raw(level=4)
    c.send_bytes(bytes.fromhex("100c00044d51545404030000 0000".replace(" ", "")))  # reserved flag
    assert c.transport.value() == b"" and c.closed


# -- QoS flows -----------------------------------------------------------------------

def test_qos1_both_ways(h):
    s = h.client("s")
    assert sub(s, "a/+", qos=1) == [Suback(1, [1])]
    p = h.client("p")
    p.send(Publish("a/b", b"m", qos=1, packet_id=7))
    assert p.received() == [Puback(7)]
    got = s.received()
    assert len(got) == 1 and got[0].qos == 1 and got[0].payload == b"m"
    s.send(Puback(got[0].packet_id))
    assert h.broker.sessions.sessions["s"].inflight == {}


def test_qos2_exactly_once(h):
    s = h.client("s")
    sub(s, "t", qos=2)
    p = h.client("p")
    p.send(Publish("t", b"once", qos=2, packet_id=3))
    assert p.received() == [Pubrec(3)]
    p.send(Publish("t", b"once", qos=2, packet_id=3, dup=True))  # resent before PUBREL
    assert p.received() == [Pubrec(3)]
    p.send(Pubrel(3))
    assert p.received() == [Pubcomp(3)]
    got = s.received()
    assert [m.payload for m in got] == [b"once"]
    pid = got[0].packet_id
    s.send(Pubrec(pid))
    assert s.received() == [Pubrel(pid)]
    s.send(Pubcomp(pid))
    assert h.broker.sessions.sessions["s"].inflight == {}


def test_qos_is_downgraded_to_the_subscription(h):
    s = h.client("s")
    sub(s, "t", qos=0)
    p = h.client("p")
    p.send(Publish("t", b"x", qos=2, packet_id=1))
    assert s.received()[0].qos == 0


def test_inflight_window_is_the_client_receive_maximum(h):
    s = h.client("s", level=5, properties={Property.RECEIVE_MAXIMUM: 2})
    sub(s, "t")
    p = h.client("p")
    for i in range(5):
        p.send(Publish("t", b"%d" % i, qos=1, packet_id=i + 1))
    got = s.received()
    assert [m.payload for m in got] == [b"0", b"1"]
    s.send(Puback(got[0].packet_id))
    got2 = s.received()
    assert [m.payload for m in got2] == [b"2"]
    s.send(Puback(got[1].packet_id), Puback(got2[0].packet_id))
    assert [m.payload for m in s.received()] == [b"3", b"4"]


def test_persistent_session_redelivers_with_dup_and_queues_offline(h):
    s = h.client("s", clean_start=False)
    sub(s, "t")
    p = h.client("p")
    p.send(Publish("t", b"1", qos=1, packet_id=1))
    first = s.received()[0]
    s.lose()
    p.send(Publish("t", b"2", qos=1, packet_id=2))
    s2 = h.client("s", clean_start=False)
    assert s2.connack.session_present is True
    got = s2.pending + s2.received()
    assert [(m.payload, m.dup) for m in got] == [(b"1", True), (b"2", False)]
    assert got[0].packet_id == first.packet_id


def test_offline_session_keeps_its_queue_in_the_store_not_in_memory():
    h = Harness({"mqtt": {"max_queued_messages": 3}})
    s = h.client("s", clean_start=False)
    sub(s, "t")
    s.send(Disconnect())
    s.lose()
    p = h.client("p")
    for i in range(5):
        p.send(Publish("t", b"%d" % i, qos=1, packet_id=i + 1))
    assert p.received() == [Puback(i + 1) for i in range(5)]
    session = h.broker.sessions.sessions["s"]
    assert len(session.queue) == 0 and session.inflight == {} and session.dropped == {}
    stored = []
    h.broker.device_store.load("s").addCallback(stored.append)
    assert [d.message.payload for d in stored[0]] == [b"%d" % i for i in range(5)]
    s2 = h.client("s", clean_start=False)
    got = s2.pending + s2.received()
    assert [m.payload for m in got] == [b"%d" % i for i in range(5)]


def test_the_device_store_limit_removes_the_oldest_and_counts_them():
    h = Harness({"storage": {"max_messages_per_client": 3}})
    s = h.client("s", clean_start=False)
    sub(s, "t")
    s.send(Disconnect())
    s.lose()
    p = h.client("p")
    for i in range(5):
        p.send(Publish("t", b"%d" % i, qos=1, packet_id=i + 1))
    assert {k: n for k, n in h.broker.dropped.items() if n} == {"store_limit": 2}
    s2 = h.client("s", clean_start=False)
    assert [m.payload for m in s2.pending + s2.received()] == [b"2", b"3", b"4"]


def test_a_persistent_session_pages_its_queue_from_the_store():
    """Only max_queued_messages wait in memory; the rest are read back from
    the device store as the client acknowledges, in order, none lost."""
    h = Harness({"mqtt": {"max_queued_messages": 4}})
    s = h.client("s", level=5, properties={Property.SESSION_EXPIRY_INTERVAL: 60,
                                           Property.RECEIVE_MAXIMUM: 2})
    sub(s, "t")
    p = h.client("p")
    for i in range(20):
        p.send(Publish("t", b"%d" % i, qos=1, packet_id=i + 1))
    session = h.broker.sessions.sessions["s"]
    assert len(session.inflight) == 2 and len(session.queue) <= 4 and session.outbox.paged_out
    got = []
    for _ in range(40):
        batch = s.received()
        if not batch:
            break
        got += batch
        for m in batch:
            s.send(Puback(m.packet_id))
    assert [m.payload for m in got] == [b"%d" % i for i in range(20)]
    assert session.dropped == {} and not session.outbox.paged_out and len(session.queue) == 0


def test_clean_start_discards_the_old_session(h):
    s = h.client("s", clean_start=False)
    sub(s, "t")
    s.send(Disconnect())
    s.lose()
    s2 = h.client("s", clean_start=True)
    assert s2.connack.session_present is False
    p = h.client("p")
    p.send(Publish("t", b"x"))
    assert s2.received() == []


def test_takeover_sends_0x8e_to_the_old_v5_connection(h):
    old = h.client("dup", level=5)
    new = h.client("dup", level=5)
    assert old.received() == [Disconnect(0x8E)] and old.closed
    assert new.connack.reason_code == 0 and not new.closed
    old.lose()  # the old connection's loss must not end the new session
    assert h.broker.sessions.sessions["dup"].connection is new.protocol


# -- will ------------------------------------------------------------------------------

def will_client(h, level=5, delay=None, **kw):
    props = {Property.WILL_DELAY_INTERVAL: delay} if delay else {}
    return h.client("w", level=level, will=Will("will/t", b"gone", 1, False, props), **kw)


def test_will_on_connection_loss_not_on_normal_disconnect(h):
    s = h.client("s")
    sub(s, "will/t")
    w = will_client(h)
    w.send(Disconnect(0))
    w.lose()
    assert s.received() == []
    w = will_client(h)
    w.lose()
    assert [m.payload for m in s.received()] == [b"gone"]


def test_will_on_disconnect_0x04(h):
    s = h.client("s")
    sub(s, "will/t")
    w = will_client(h)
    w.send(Disconnect(0x04))
    w.lose()
    assert [m.payload for m in s.received()] == [b"gone"]


def test_will_delay_and_cancel_by_reconnect(h):
    s = h.client("s")
    sub(s, "will/t")
    w = will_client(h, delay=5, properties={Property.SESSION_EXPIRY_INTERVAL: 100}, clean_start=False)
    w.lose()
    h.clock.advance(4)
    assert s.received() == []
    h.clock.advance(1.1)
    assert [m.payload for m in s.received()] == [b"gone"]
    w = will_client(h, delay=5, properties={Property.SESSION_EXPIRY_INTERVAL: 100}, clean_start=False)
    w.lose()
    will_client(h, delay=5, properties={Property.SESSION_EXPIRY_INTERVAL: 100}, clean_start=False)
    h.clock.advance(10)
    assert s.received() == []


def test_session_expiry_ends_the_session_and_sends_a_pending_will(h):
    s = h.client("s")
    sub(s, "will/t")
    w = will_client(h, delay=50, properties={Property.SESSION_EXPIRY_INTERVAL: 3})
    w.lose()
    assert "w" in h.broker.sessions.sessions
    h.clock.advance(3.1)
    assert "w" not in h.broker.sessions.sessions
    assert [m.payload for m in s.received()] == [b"gone"]


# -- subscriptions, retained ---------------------------------------------------------------

def test_subscribe_reason_codes_v5_and_v3(h):
    c5 = h.client("a", level=5)
    assert sub(c5, "ok", "bad/#/x", "$share//t", qos=2) == [Suback(1, [2, 0x8F, 0x8F])]
    c3 = h.client("b", level=4)
    assert sub(c3, "ok", "bad/#/x", qos=1) == [Suback(1, [1, 0x80])]


def test_unsubscribe_reason_codes(h):
    c = h.client("a", level=5)
    sub(c, "x")
    c.send(Unsubscribe(2, ["x", "y"]))
    assert c.received() == [Unsuback(2, [0, 0x11])]
    p = h.client("p")
    p.send(Publish("x", b"1"))
    assert c.received() == []


def test_dollar_topics_not_matched_by_leading_wildcards(h):
    s = h.client("s")
    sub(s, "#", "+/x")
    p = h.client("p")
    p.send(Publish("$SYS/x", b"1"), Publish("a/x", b"2"))
    assert [m.payload for m in s.received()] == [b"2"]


def test_retained_set_clear_and_handling(h):
    p = h.client("p")
    p.send(Publish("r/1", b"keep", qos=1, retain=True, packet_id=1))
    c = h.client("c", level=5)
    got = sub(c, "r/#", qos=1)
    assert got[0] == Suback(1, [1])
    assert got[1].retain and got[1].payload == b"keep"
    c.send(Puback(got[1].packet_id))
    assert sub(c, "r/#", pid=2, retain_handling=1)[1:] == []  # not a new subscription
    assert sub(c, "r/+", pid=3, retain_handling=2)[1:] == []
    p.send(Publish("r/1", b"", retain=True))
    c.received()
    assert sub(c, "r/1", pid=4)[1:] == []
    assert len(h.broker.router.retained) == 0


def test_retain_as_published(h):
    c = h.client("c", level=5)
    sub(c, "a", retain_as_published=True)
    sub(c, "b", pid=2)
    p = h.client("p")
    p.send(Publish("a", b"1", retain=True), Publish("b", b"2", retain=True))
    assert [(m.topic, m.retain) for m in c.received()] == [("a", True), ("b", False)]


def test_no_local(h):
    c = h.client("c", level=5)
    sub(c, "t", no_local=True)
    c.send(Publish("t", b"mine"))
    assert c.received() == []


def test_subscription_identifiers(h):
    c = h.client("c", level=5)
    sub(c, "a/+", props={Property.SUBSCRIPTION_IDENTIFIER: [7]})
    sub(c, "a/#", pid=2, props={Property.SUBSCRIPTION_IDENTIFIER: [9]})
    p = h.client("p")
    p.send(Publish("a/b", b"x"))
    got = c.received()
    assert len(got) == 1
    assert sorted(got[0].properties[Property.SUBSCRIPTION_IDENTIFIER]) == [7, 9]


def test_shared_subscription_round_robin(h):
    a = h.client("a")
    b = h.client("b")
    sub(a, "$share/g/t")
    sub(b, "$share/g/t")
    p = h.client("p")
    for i in range(6):
        p.send(Publish("t", b"%d" % i))
    ga = [m.payload for m in a.received()]
    gb = [m.payload for m in b.received()]
    assert len(ga) == 3 and len(gb) == 3
    assert sorted(ga + gb) == [b"%d" % i for i in range(6)]


# -- v5 properties ------------------------------------------------------------------------

def test_properties_pass_through_and_expiry_decreases(h):
    c = h.client("c", level=5)
    sub(c, "t")
    props = {
        Property.USER_PROPERTY: [("k", "v"), ("k", "w")],
        Property.CONTENT_TYPE: "text/plain",
        Property.RESPONSE_TOPIC: "reply/here",
        Property.CORRELATION_DATA: b"\x01\x02",
        Property.PAYLOAD_FORMAT_INDICATOR: 1,
        Property.MESSAGE_EXPIRY_INTERVAL: 60,
    }
    p = h.client("p", level=5)
    p.send(Publish("t", "ok".encode(), properties=props))
    got = c.received()[0]
    for key in (Property.USER_PROPERTY, Property.CONTENT_TYPE, Property.RESPONSE_TOPIC,
                Property.CORRELATION_DATA, Property.PAYLOAD_FORMAT_INDICATOR):
        assert got.properties[key] == props[key]
    assert got.properties[Property.MESSAGE_EXPIRY_INTERVAL] == 60


def test_expired_messages_are_dropped_and_expiry_is_forwarded_decreased(h):
    c = h.client("c", level=5, clean_start=False, properties={Property.SESSION_EXPIRY_INTERVAL: 100})
    sub(c, "t")
    c.lose()
    p = h.client("p", level=5)
    p.send(Publish("t", b"short", qos=1, packet_id=1, properties={Property.MESSAGE_EXPIRY_INTERVAL: 2}))
    p.send(Publish("t", b"long", qos=1, packet_id=2, properties={Property.MESSAGE_EXPIRY_INTERVAL: 10}))
    h.clock.advance(3)
    c = h.client("c", level=5, clean_start=False, properties={Property.SESSION_EXPIRY_INTERVAL: 100})
    got = c.pending + c.received()
    assert [m.payload for m in got] == [b"long"]
    assert got[0].properties[Property.MESSAGE_EXPIRY_INTERVAL] == 7


def test_topic_alias(h):
    c = h.client("c")
    sub(c, "long/topic/name")
    p = h.client("p", level=5)
    p.send(Publish("long/topic/name", b"1", properties={Property.TOPIC_ALIAS: 3}))
    p.send(Publish("", b"2", properties={Property.TOPIC_ALIAS: 3}))
    assert [(m.topic, m.payload) for m in c.received()] == [("long/topic/name", b"1"), ("long/topic/name", b"2")]
    p.send(Publish("", b"3", properties={Property.TOPIC_ALIAS: 4}))
    assert p.received() == [Disconnect(0x82)]


def test_topic_alias_above_the_maximum():
    h = Harness({"mqtt": {"topic_alias_maximum": 2}})
    p = h.client("p", level=5)
    p.send(Publish("t", b"1", properties={Property.TOPIC_ALIAS: 3}))
    assert p.received() == [Disconnect(0x94)]


def test_invalid_utf8_with_payload_format_1(h):
    p = h.client("p", level=5)
    p.send(Publish("t", b"\xff\xfe", qos=1, packet_id=1, properties={Property.PAYLOAD_FORMAT_INDICATOR: 1}))
    assert p.received() == [Puback(1, 0x99)]


def test_request_response_information():
    h = Harness({"mqtt": {"response_information": "resp/"}})
    c = h.client("c", level=5, properties={Property.REQUEST_RESPONSE_INFORMATION: 1})
    assert c.connack.properties[Property.RESPONSE_INFORMATION] == "resp/"
    d = h.client("d", level=5)
    assert Property.RESPONSE_INFORMATION not in d.connack.properties


def test_client_maximum_packet_size_is_respected(h):
    c = h.client("c", level=5, properties={Property.MAXIMUM_PACKET_SIZE: 30})
    sub(c, "t")
    p = h.client("p")
    p.send(Publish("t", b"x" * 100), Publish("t", b"small"))
    assert [m.payload for m in c.received()] == [b"small"]


def test_puback_order_follows_publish_order(h):
    """Acks wait for the durable store even when a later message needs none."""
    from twisted.internet import defer

    store = h.broker.device_store
    gate = defer.Deferred()
    original = store.add
    store.add = lambda client_id, deliveries: gate.addCallback(lambda _: 0) if deliveries[0].message.payload == b"slow" else original(client_id, deliveries)
    s = h.client("s", clean_start=False)
    sub(s, "slow")
    p = h.client("p")
    p.send(Publish("slow", b"slow", qos=1, packet_id=1), Publish("other", b"x", qos=1, packet_id=2))
    assert p.received() == []
    gate.callback(None)
    assert p.received() == [Puback(1), Puback(2)]


BIG = b"x" * 20000  # past a quarter of max_outbound_buffer 65536: a hold


def test_a_congested_subscriber_holds_the_pipeline_and_then_its_publisher():
    h = Harness({"mqtt": {"max_pending_messages": 4, "max_outbound_buffer": 65536}})
    s = h.client("s")
    sub(s, "t")
    s.protocol.pauseProducing()  # the subscriber's socket is full
    p = h.client("p")
    consumer = h.broker.router.consumer
    p.send(Publish("t", b"q0"))
    assert not consumer.paused  # a burst the outbound buffer takes
    p.send(Publish("t", BIG))
    assert consumer.paused  # the consumer of tbmq.msg.all is held
    p.send(*[Publish("t", b"w%d" % i) for i in range(6)])
    # the publishes wait in the bus; past max_pending_messages of them the
    # publisher is not read any more
    assert p.transport.producerState == "paused"
    assert [m.payload for m in s.received()] == [b"q0", BIG]
    s.protocol.resumeProducing()
    h.turn()  # the bus hands what waited over in the next turns
    h.turn()
    assert not consumer.paused and p.transport.producerState == "producing"
    assert [m.payload for m in s.received()] == [b"w%d" % i for i in range(6)]
    assert h.broker.sessions.sessions["s"].dropped == {}


def test_a_slow_subscriber_loses_qos0_and_holds_nobody_back():
    h = Harness({"mqtt": {"max_outbound_buffer": 65536}})
    s = h.client("s")
    sub(s, "t")
    s.protocol.pauseProducing()
    p = h.client("p")
    p.send(Publish("t", BIG))
    consumer = h.broker.router.consumer
    assert consumer.paused
    h.clock.advance(h.config.mqtt.outbound_pause_timeout)
    assert not consumer.paused  # its hold credit is spent: it is slow
    session = h.broker.sessions.sessions["s"]
    assert session.outbox.slow
    s.received()
    p.send(Publish("t", b"b"), Publish("t", b"c", qos=1, packet_id=1))
    assert s.received() == [] and not consumer.paused
    assert p.received() == [Puback(1)]
    assert session.dropped == {"slow_consumer": 1} and len(session.queue) == 1
    s.protocol.resumeProducing()
    assert [m.payload for m in s.received()] == [b"c"] and not session.outbox.slow


def test_a_slow_non_persistent_subscriber_that_overflows_is_disconnected_with_0x97():
    """Never acknowledged to the publisher and then silently dropped for a
    subscriber that believes it is subscribed."""
    h = Harness({"mqtt": {"max_pending_messages": 3}})
    s = h.client("s", level=5, properties={Property.RECEIVE_MAXIMUM: 1})
    sub(s, "t")
    p = h.client("p")
    p.send(*[Publish("t", b"%d" % i, qos=1, packet_id=i + 1) for i in range(4)])
    consumer = h.broker.router.consumer
    assert consumer.paused  # 1 in flight, 3 queued: held
    h.clock.advance(h.config.mqtt.outbound_pause_timeout)
    assert not consumer.paused
    assert p.received() == [Puback(i + 1) for i in range(4)]
    p.send(Publish("t", b"over", qos=1, packet_id=9))
    got = s.received()
    assert got[-1].reason_code == 0x97 and s.closed
    session_drops = h.broker.dropped
    assert session_drops["quota_exceeded"] == 5  # 1 in flight, 3 queued, the new one


def test_a_drip_reader_holds_the_others_for_a_bounded_share_of_the_time():
    h = Harness({"mqtt": {"max_outbound_buffer": 65536}})
    s = h.client("s")
    sub(s, "t")
    p = h.client("p")
    consumer = h.broker.router.consumer
    timeout = h.config.mqtt.outbound_pause_timeout
    held = 0.0
    for _ in range(20):  # 20 cycles of 2 s: full socket, a little read
        s.protocol.pauseProducing()
        p.send(Publish("t", BIG))
        for _ in range(20):
            if consumer.paused:
                held += 0.1
            h.clock.advance(0.1)
        s.protocol.resumeProducing()
        s.received()
    assert held <= timeout + 40 * timeout / 10 + 0.5


def test_writes_of_one_read_are_coalesced(h):
    s = h.client("s")
    sub(s, "t")
    p = h.client("p")
    writes = []
    original = s.transport.write
    s.transport.write = lambda data: (writes.append(data), original(data))
    p.send_bytes(b"".join(encode(Publish("t", b"%d" % i), 4) for i in range(50)))
    assert len(writes) == 1
    assert len(s.received()) == 50


def test_stop_disconnects_v5_clients_with_0x8b(h):
    c = h.client("c", level=5)
    d = h.broker.stop()
    assert c.received() == [Disconnect(0x8B)]
    assert not d.called
    c.lose()
    assert d.called


def test_acks_of_one_read_remove_their_deliveries_with_one_store_write(h):
    store = h.broker.device_store
    calls = []
    original = store.remove
    store.remove = lambda client_id, seqs: (calls.append((client_id, list(seqs))),
                                            original(client_id, seqs))[1]
    s = h.client("s", clean_start=False)
    sub(s, "t", qos=1)
    p = h.client("p")
    p.send(*[Publish("t", b"%d" % i, qos=1, packet_id=i + 1) for i in range(3)])
    got = s.received()
    assert len(got) == 3
    session = h.broker.sessions.sessions["s"]
    seqs = [d.seq for d in session.inflight.values()]
    s.send_bytes(b"".join(encode(Puback(m.packet_id), 4) for m in got))  # one read
    assert calls == [("s", seqs)]
    assert session.inflight == {}
    loaded = []
    store.load("s").addCallback(loaded.append)
    assert loaded == [[]]
