"""End to end with paho-mqtt 2.x against the real broker (one per module):
QoS flows, wildcards, retained messages, wills, shared subscriptions,
persistent sessions, session takeover and the MQTT 5 features.

Every test uses its own topic prefix and client ids.  "Not delivered" is
checked with a marker: a later message that must arrive first (messages of
one subscription arrive in order, and a QoS 1 publish is routed before its
PUBACK), so no test sleeps for correctness; only the expiry and will delay
tests let real time pass, because that is what they test.
"""

from __future__ import annotations

import queue
import time

import pytest
from paho.mqtt.packettypes import PacketTypes

from tbmq.mqtt import (
    Connack, Disconnect, Pingreq, Pingresp, Property, Puback, Pubcomp, Publish, Pubrec, Pubrel,
    Suback, Subscribe, SubscriptionRequest, Will,
)
from tbmq.mqtt.codec import encode
from tests.integration.helpers import TIMEOUT, PahoClient, props, uid

pytestmark = pytest.mark.timeout(60)


def _ids(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def persistent(mqtt, version: int, client_id: str, *, clean: bool) -> PahoClient:
    """A connected client with a persistent session: v3 clean session 0, v5
    session expiry 300 with clean start = ``clean`` (v3 always connects with
    clean session 0: a new id has no session to resume anyway)."""
    if version == 5:
        return mqtt(5, client_id).connect_and_wait(clean_start=clean, session_expiry=300)
    return mqtt(version, client_id, clean_session=False).connect_and_wait()


def collect(clients: list[PahoClient], n: int, timeout: float = TIMEOUT) -> dict:
    """``n`` messages received by any of ``clients`` → {client: [messages]}."""
    got = {c: [] for c in clients}
    total = 0
    deadline = time.monotonic() + timeout
    while total < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {total} of {n} messages in {timeout} s: "
                                 f"{ {c.client_id: [m.payload for m in ms] for c, ms in got.items()} }")
        for c in clients:
            try:
                m = c.messages.get(timeout=0.02)
            except queue.Empty:
                continue
            got[c].append(m)
            total += 1
    return got


# ---------------------------------------------------------------------------
# QoS flows
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("version", [3, 4, 5], ids=["v31", "v311", "v5"])
def test_publish_subscribe_qos(mqtt, version, qos):
    topic = f"{uid()}/qos/{qos}"
    sub = mqtt.connect(version)
    assert sub.subscribe(topic, qos) == [qos]
    pub = mqtt.connect(version)
    pub.publish(topic, b"payload \x00\xff", qos)
    m = sub.get()
    assert (m.topic, m.payload, m.qos, m.retain, m.dup) == (topic, b"payload \x00\xff", qos, False, False)


@pytest.mark.parametrize("pub_qos,sub_qos", [(2, 0), (2, 1), (1, 2), (0, 2), (1, 0)])
def test_delivered_qos_is_the_minimum(mqtt, mqtt_version, pub_qos, sub_qos):
    topic = f"{uid()}/downgrade"
    sub = mqtt.connect(mqtt_version)
    sub.subscribe(topic, sub_qos)
    pub = mqtt.connect(mqtt_version)
    pub.publish(topic, b"x", pub_qos)
    assert sub.get().qos == min(pub_qos, sub_qos)


def test_cross_version_delivery(mqtt):
    topic = f"{uid()}/cross"
    sub3, sub4, sub5 = mqtt.connect(3), mqtt.connect(4), mqtt.connect(5)
    for s in (sub3, sub4, sub5):
        s.subscribe(topic, 2)
    for version in (3, 4, 5):
        mqtt.connect(version).publish(topic, f"from {version}", 2)
    for s in (sub3, sub4, sub5):
        assert [m.payload for m in s.get_many(3)] == [b"from 3", b"from 4", b"from 5"]


@pytest.mark.parametrize("qos", [1, 2])
def test_many_messages_in_order(mqtt, mqtt_version, qos):
    topic = f"{uid()}/order"
    sub = mqtt.connect(mqtt_version)
    sub.subscribe(topic, qos)
    pub = mqtt.connect(mqtt_version)
    infos = [pub.publish(topic, str(i), qos, wait=False) for i in range(100)]
    for info in infos:
        info.wait_for_publish(TIMEOUT)
        assert info.is_published()
    assert [m.payload for m in sub.get_many(100)] == [str(i).encode() for i in range(100)]


def test_large_payload(mqtt, mqtt_version):
    topic = f"{uid()}/large"
    sub = mqtt.connect(mqtt_version)
    sub.subscribe(topic, 1)
    payload = bytes(range(256)) * 1024  # 256 KiB
    mqtt.connect(mqtt_version).publish(topic, payload, 1)
    assert sub.get().payload == payload


# ---------------------------------------------------------------------------
# Topic filters
# ---------------------------------------------------------------------------


def test_wildcards(mqtt, mqtt_version):
    p = uid()
    plus = mqtt.connect(mqtt_version)
    plus.subscribe(f"{p}/+/temp", 1)
    multi = mqtt.connect(mqtt_version)
    multi.subscribe(f"{p}/#", 1)
    both = mqtt.connect(mqtt_version)
    both.subscribe("+/+/hum", 1)
    pub = mqtt.connect(mqtt_version)
    topics = [f"{p}/r1/temp", f"{p}/r1/hum", f"{p}/r1/x/temp", p, f"{p}/r2/temp", f"{p}/end"]
    for t in topics:
        pub.publish(t, t, 1)
    assert [m.topic for m in plus.get_many(2)] == [f"{p}/r1/temp", f"{p}/r2/temp"]
    # "sport/#" also matches "sport" [MQTT-4.7.1-2]
    assert [m.topic for m in multi.get_many(len(topics))] == topics
    assert both.get_for(f"{p}/r1/hum").payload == f"{p}/r1/hum".encode()
    plus.publish(f"{p}/end/temp", "end", 1)
    assert plus.get().topic == f"{p}/end/temp"


def test_dollar_topics_not_matched_by_wildcards(mqtt, mqtt_version):
    """[MQTT-4.7.2-1]: '#' and '+/...' do not match topics starting with '$'."""
    p = uid()
    everything = mqtt.connect(mqtt_version)
    everything.subscribe("#", 1)
    plus = mqtt.connect(mqtt_version)
    plus.subscribe(f"+/{p}", 1)
    sys_sub = mqtt.connect(mqtt_version)
    sys_sub.subscribe(f"$SYS/{p}", 1)
    pub = mqtt.connect(mqtt_version)
    pub.publish(f"$SYS/{p}", b"sys", 1)
    assert sys_sub.get().topic == f"$SYS/{p}"  # it was published
    pub.publish(f"m/{p}", b"marker", 1)
    assert plus.get().topic == f"m/{p}"
    deadline = time.monotonic() + TIMEOUT
    while True:  # '#' may also get other tests' retained messages first
        m = everything.get(max(0.1, deadline - time.monotonic()))
        assert not m.topic.startswith("$"), f"'#' matched {m.topic}"
        if m.topic == f"m/{p}":
            break


def test_unsubscribe_stops_delivery(mqtt, mqtt_version):
    p = uid()
    sub = mqtt.connect(mqtt_version)
    sub.subscribe(f"{p}/a", 1)
    sub.subscribe(f"{p}/b", 1)
    pub = mqtt.connect(mqtt_version)
    pub.publish(f"{p}/a", b"1", 1)
    assert sub.get().payload == b"1"
    codes = sub.unsubscribe(f"{p}/a")
    if mqtt_version == 5:
        assert codes == [0]
    pub.publish(f"{p}/a", b"2", 1)
    pub.publish(f"{p}/b", b"marker", 1)
    m = sub.get()
    assert (m.topic, m.payload) == (f"{p}/b", b"marker")
    if mqtt_version == 5:  # unsubscribing again: no subscription existed (0x11)
        assert sub.unsubscribe(f"{p}/a") == [0x11]


def test_invalid_subscription_refused(raw, mqtt_version):
    """A bad filter gets a failure code in SUBACK; the others are granted
    (paho refuses to send a bad filter, so this uses a raw socket)."""
    p = uid()
    c = raw(mqtt_version)
    c.connect()
    c.send(Subscribe(7, [SubscriptionRequest(f"{p}/a#", 1), SubscriptionRequest(f"{p}/ok", 1)]))
    suback = c.expect()
    assert isinstance(suback, Suback) and suback.packet_id == 7
    assert suback.reason_codes == [0x80 if mqtt_version != 5 else 0x8F, 1]
    c.disconnect()


# ---------------------------------------------------------------------------
# Retained messages
# ---------------------------------------------------------------------------


def test_retained_set_delivered_and_cleared(mqtt, mqtt_version):
    topic = f"{uid()}/retained"
    pub = mqtt.connect(mqtt_version)
    pub.publish(topic, b"r1", 1, retain=True)

    s1 = mqtt.connect(mqtt_version)
    s1.subscribe(topic, 1)
    m = s1.get()
    assert (m.topic, m.payload, m.qos, m.retain) == (topic, b"r1", 1, True)

    # to an established subscription: RETAIN 0 [MQTT-3.3.1-9 / v5 3.3.1-12]
    pub.publish(topic, b"r2", 1, retain=True)
    m = s1.get()
    assert (m.payload, m.retain) == (b"r2", False)

    s2 = mqtt.connect(mqtt_version)
    s2.subscribe(f"{topic.split('/')[0]}/+", 1)  # via a wildcard, replaced value
    m = s2.get()
    assert (m.topic, m.payload, m.retain) == (topic, b"r2", True)

    # an empty retained payload clears it and goes to subscribers as normal
    pub.publish(topic, b"", 1, retain=True)
    assert s1.get().payload == b""
    s3 = mqtt.connect(mqtt_version)
    s3.subscribe(topic, 1)
    pub.publish(topic, b"marker", 1)
    m = s3.get()
    assert (m.payload, m.retain) == (b"marker", False)


def test_retained_qos_is_downgraded_on_subscribe(mqtt, mqtt_version):
    topic = f"{uid()}/retained-qos"
    pub = mqtt.connect(mqtt_version)
    pub.publish(topic, b"r", 2, retain=True)
    s = mqtt.connect(mqtt_version)
    s.subscribe(topic, 0)
    m = s.get()
    assert (m.payload, m.qos, m.retain) == (b"r", 0, True)
    pub.publish(topic, b"", 1, retain=True)


# ---------------------------------------------------------------------------
# Will messages (raw socket publisher: closed with or without DISCONNECT)
# ---------------------------------------------------------------------------


def test_will_published_on_abrupt_close(mqtt, raw, mqtt_version):
    topic = f"{uid()}/will"
    watcher = mqtt.connect(mqtt_version)
    watcher.subscribe(topic, 2)
    c = raw(mqtt_version)
    ack = c.connect(keep_alive=60, will=Will(topic, b"gone", qos=1))
    assert isinstance(ack, Connack) and ack.reason_code == 0
    c.close()  # the TCP connection ends without DISCONNECT
    m = watcher.get()
    assert (m.topic, m.payload, m.qos, m.retain) == (topic, b"gone", 1, False)


def test_will_retained(mqtt, raw, mqtt_version):
    topic = f"{uid()}/will-retained"
    c = raw(mqtt_version)
    c.connect(will=Will(topic, b"offline", qos=1, retain=True))
    c.close()
    # the will is retained: a later subscriber gets it
    pub = mqtt.connect(mqtt_version)
    deadline = time.monotonic() + TIMEOUT
    while True:
        s = mqtt.connect(mqtt_version)
        s.subscribe(topic, 1)
        pub.publish(topic, b"probe", 1)
        m = s.get()
        if m.payload == b"offline":
            assert m.retain
            break
        assert m.payload == b"probe"
        assert time.monotonic() < deadline, "the retained will never appeared"
    pub.publish(topic, b"", 1, retain=True)


def test_will_not_published_on_normal_disconnect(mqtt, raw, mqtt_version):
    topic = f"{uid()}/will"
    watcher = mqtt.connect(mqtt_version)
    watcher.subscribe(topic, 1)
    c = raw(mqtt_version)
    c.connect(will=Will(topic, b"gone", qos=1))
    c.send(Disconnect())
    c.wait_closed()  # the broker closed it: it is done with the connection
    mqtt.connect(mqtt_version).publish(topic, b"marker", 1)
    assert watcher.get().payload == b"marker"


def test_will_published_on_broker_initiated_close(mqtt, raw, mqtt_version):
    """A protocol error closes the connection: the will is published."""
    topic = f"{uid()}/will"
    watcher = mqtt.connect(mqtt_version)
    watcher.subscribe(topic, 1)
    c = raw(mqtt_version)
    c.connect(will=Will(topic, b"broken", qos=1))
    c.send(b"\x30\x03\x00\x01#")  # PUBLISH to "#": a wildcard in a topic name
    c.wait_closed()
    assert watcher.get().payload == b"broken"


def test_v5_disconnect_with_will_message(mqtt, raw):
    """DISCONNECT 0x04 (Disconnect with Will Message) publishes the will."""
    topic = f"{uid()}/will"
    watcher = mqtt.connect(5)
    watcher.subscribe(topic, 1)
    c = raw(5)
    c.connect(will=Will(topic, b"asked for", qos=1))
    c.send(Disconnect(0x04))
    c.wait_closed()
    assert watcher.get().payload == b"asked for"


def test_v5_will_delay_interval(mqtt, raw):
    topic = f"{uid()}/will-delay"
    watcher = mqtt.connect(5)
    watcher.subscribe(topic, 1)
    c = raw(5)
    c.connect(will=Will(topic, b"late", qos=1, properties={Property.WILL_DELAY_INTERVAL: 2}),
              properties={Property.SESSION_EXPIRY_INTERVAL: 60})
    closed_at = time.monotonic()
    c.close()
    m = watcher.get(timeout=15)
    assert m.payload == b"late"
    assert m.at - closed_at >= 1.5, f"will published {m.at - closed_at:.2f} s after the close"
    assert m.prop("WillDelayInterval") is None


def test_v5_will_delay_cancelled_by_reconnect(mqtt, raw):
    """[MQTT-3.1.3-9]: the session resumed before the delay: no will."""
    topic = f"{uid()}/will-delay"
    cid = f"w-{uid()}"
    watcher = mqtt.connect(5)
    watcher.subscribe(topic, 1)
    c = raw(5)
    c.connect(cid, will=Will(topic, b"late", qos=1, properties={Property.WILL_DELAY_INTERVAL: 3}),
              properties={Property.SESSION_EXPIRY_INTERVAL: 60})
    closed_at = time.monotonic()
    c.close()
    c2 = raw(5)
    ack = c2.connect(cid, clean_start=False, properties={Property.SESSION_EXPIRY_INTERVAL: 60})
    assert ack.session_present
    assert time.monotonic() - closed_at < 2.5, "reconnect too slow for this test"
    while time.monotonic() - closed_at < 4.0:  # past the will delay
        time.sleep(0.1)
    mqtt.connect(5).publish(topic, b"marker", 1)
    assert watcher.get().payload == b"marker"
    c2.send(Disconnect(0, {Property.SESSION_EXPIRY_INTERVAL: 0}))
    c2.wait_closed()


def test_v5_will_published_when_session_ends_before_delay(mqtt, raw):
    """The session expires (1 s) before the will delay (60 s): the will goes
    out when the session ends [MQTT-3.1.3-9]."""
    topic = f"{uid()}/will-expiry"
    watcher = mqtt.connect(5)
    watcher.subscribe(topic, 1)
    c = raw(5)
    c.connect(will=Will(topic, b"session over", qos=1, properties={Property.WILL_DELAY_INTERVAL: 60}),
              properties={Property.SESSION_EXPIRY_INTERVAL: 1})
    closed_at = time.monotonic()
    c.close()
    m = watcher.get(timeout=20)
    assert m.payload == b"session over"
    assert m.at - closed_at < 15


# ---------------------------------------------------------------------------
# Shared subscriptions
# ---------------------------------------------------------------------------


def test_shared_subscription_splits_messages(mqtt, mqtt_version):
    p = uid()
    group = f"$share/g{p}/{p}/t"
    a = mqtt.connect(mqtt_version)
    b = mqtt.connect(mqtt_version)
    assert a.subscribe(group, 1) == [1]
    assert b.subscribe(group, 1) == [1]
    plain = mqtt.connect(mqtt_version)  # a normal subscriber gets every message
    plain.subscribe(f"{p}/t", 1)
    pub = mqtt.connect(mqtt_version)
    n = 20
    for i in range(n):
        pub.publish(f"{p}/t", str(i), 1)
    got = collect([a, b], n)
    payloads = [m.payload for ms in got.values() for m in ms]
    assert sorted(payloads) == sorted(str(i).encode() for i in range(n)), "each message exactly once"
    assert got[a] and got[b], "both members get some"
    for ms in got.values():  # each member sees its share in publish order
        assert [int(m.payload) for m in ms] == sorted(int(m.payload) for m in ms)
        assert all(m.topic == f"{p}/t" for m in ms)
    assert [m.payload for m in plain.get_many(n)] == [str(i).encode() for i in range(n)]
    # and nothing more went to the group
    pub.publish(f"{p}/t", b"last", 1)
    last = collect([a, b], 1)
    assert [m.payload for ms in last.values() for m in ms] == [b"last"]


def test_shared_subscription_member_leaving(mqtt, mqtt_version):
    p = uid()
    group = f"$share/g{p}/{p}/t"
    a = mqtt.connect(mqtt_version)
    b = mqtt.connect(mqtt_version)
    a.subscribe(group, 1)
    b.subscribe(group, 1)
    b.unsubscribe(group)
    pub = mqtt.connect(mqtt_version)
    for i in range(6):
        pub.publish(f"{p}/t", str(i), 1)
    assert [m.payload for m in a.get_many(6)] == [str(i).encode() for i in range(6)]


# ---------------------------------------------------------------------------
# Sessions
# ---------------------------------------------------------------------------


def test_persistent_session_gets_offline_messages(mqtt, mqtt_version):
    cid = f"p-{uid()}"
    topic = f"{uid()}/persist"
    s = persistent(mqtt, mqtt_version, cid, clean=True)
    s.subscribe(topic, 1)
    s.disconnect()
    pub = mqtt.connect(mqtt_version)
    for i in range(5):
        pub.publish(topic, f"offline {i}", 1)
    pub.publish(topic, b"qos0 is not queued", 0)
    pub.publish(topic, b"qos2", 2)
    s2 = persistent(mqtt, mqtt_version, cid, clean=False)
    assert s2.session_present is True
    got = [m.payload for m in s2.get_many(6)]
    assert got == [f"offline {i}".encode() for i in range(5)] + [b"qos2"]
    # the subscription survived too
    pub.publish(topic, b"online", 1)
    assert s2.get().payload == b"online"


def test_clean_session_discards_state(mqtt, mqtt_version):
    cid = f"p-{uid()}"
    topic = f"{uid()}/clean"
    s = persistent(mqtt, mqtt_version, cid, clean=True)
    s.subscribe(topic, 1)
    s.disconnect()
    pub = mqtt.connect(mqtt_version)
    pub.publish(topic, b"queued", 1)
    if mqtt_version == 5:
        s2 = mqtt(5, cid).connect_and_wait(clean_start=True)
    else:
        s2 = mqtt(mqtt_version, cid, clean_session=True).connect_and_wait()
    assert s2.session_present is False
    # the old subscription is gone: subscribe to a marker topic only
    s2.subscribe(f"{topic}/m", 1)
    pub.publish(topic, b"not subscribed", 1)
    pub.publish(f"{topic}/m", b"marker", 1)
    assert s2.get().payload == b"marker"


def test_non_persistent_session_has_no_session_present(mqtt, mqtt_version):
    cid = f"n-{uid()}"
    s = mqtt.connect(mqtt_version, cid)
    assert s.session_present is False
    s.disconnect()
    s2 = mqtt.connect(mqtt_version, cid)
    assert s2.session_present is False


def test_session_takeover(mqtt, mqtt_version):
    cid = f"t-{uid()}"
    topic = f"{uid()}/takeover"
    first = mqtt.connect(mqtt_version, cid)
    second = mqtt.connect(mqtt_version, cid)
    first.wait_disconnected()
    if mqtt_version == 5:
        codes = [rc for rc, _ in first.disconnects]
        assert 0x8E in codes, f"first client saw disconnect codes {codes}, expected 0x8E"
    assert second.client.is_connected()
    second.subscribe(topic, 1)
    mqtt.connect(mqtt_version).publish(topic, b"to the new one", 1)
    assert second.get().payload == b"to the new one"
    assert not second.disconnected.is_set()


def test_session_takeover_keeps_persistent_session(mqtt, mqtt_version):
    cid = f"t-{uid()}"
    topic = f"{uid()}/takeover"
    first = persistent(mqtt, mqtt_version, cid, clean=True)
    first.subscribe(topic, 1)
    second = persistent(mqtt, mqtt_version, cid, clean=False)
    assert second.session_present is True
    first.wait_disconnected()
    mqtt.connect(mqtt_version).publish(topic, b"still subscribed", 1)
    assert second.get().payload == b"still subscribed"


# ---------------------------------------------------------------------------
# MQTT 5
# ---------------------------------------------------------------------------


def test_v5_no_local(mqtt):
    topic = f"{uid()}/nolocal"
    c = mqtt.connect(5)
    c.subscribe(topic, 1, no_local=True)
    watcher = mqtt.connect(5)
    watcher.subscribe(topic, 1)
    c.publish(topic, b"own", 1)
    assert watcher.get().payload == b"own"  # it was published
    mqtt.connect(5).publish(topic, b"other", 1)
    assert c.get().payload == b"other"


def test_v5_retain_handling(mqtt):
    topic = f"{uid()}/rh"
    pub = mqtt.connect(5)
    pub.publish(topic, b"kept", 1, retain=True)

    # 2: never send retained messages on subscribe
    c = mqtt.connect(5)
    c.subscribe(topic, 1, retain_handling=2)
    pub.publish(f"{topic}", b"live", 1)
    m = c.get()
    assert (m.payload, m.retain) == (b"live", False)

    # 1: only for a new subscription
    c1 = mqtt.connect(5)
    c1.subscribe(topic, 1, retain_handling=1)
    m = c1.get()
    assert (m.payload, m.retain) == (b"kept", True)
    c1.subscribe(topic, 1, retain_handling=1)
    pub.publish(topic, b"live2", 1)
    assert c1.get().payload == b"live2"
    c.get()  # live2 to c as well

    # 0: on every subscribe
    c0 = mqtt.connect(5)
    c0.subscribe(topic, 1, retain_handling=0)
    assert c0.get().payload == b"kept"
    c0.subscribe(topic, 1, retain_handling=0)
    m = c0.get()
    assert (m.payload, m.retain) == (b"kept", True)
    pub.publish(topic, b"", 1, retain=True)


def test_v5_retain_as_published(mqtt):
    topic = f"{uid()}/rap"
    rap = mqtt.connect(5)
    rap.subscribe(topic, 1, retain_as_published=True)
    plain = mqtt.connect(5)
    plain.subscribe(topic, 1)
    pub = mqtt.connect(5)
    pub.publish(topic, b"r", 1, retain=True)
    assert rap.get().retain is True
    assert plain.get().retain is False
    pub.publish(topic, b"n", 1)
    assert rap.get().retain is False
    pub.publish(topic, b"", 1, retain=True)


def test_v5_subscription_identifier(mqtt):
    p = uid()
    c = mqtt.connect(5)
    assert c.connack_properties.SubscriptionIdentifierAvailable == 1
    c.subscribe(f"{p}/+", 1, sub_id=42)
    pub = mqtt.connect(5)
    pub.publish(f"{p}/x", b"1", 1)
    assert _ids(c.get().prop("SubscriptionIdentifier")) == [42]

    # overlapping subscriptions: one message with both ids, or one per
    # subscription [MQTT-3.3.4-3, -4, -5]
    c.subscribe(f"{p}/#", 1, sub_id=43)
    pub.publish(f"{p}/y", b"2", 1)
    m = c.get()
    ids = set(_ids(m.prop("SubscriptionIdentifier")))
    if ids != {42, 43}:
        ids |= set(_ids(c.get().prop("SubscriptionIdentifier")))
    assert ids == {42, 43}

    # a subscription without an id
    c.subscribe(f"{p}/z/only", 1)
    pub.publish(f"{p}/z/only", b"3", 1)
    assert _ids(c.get_for(f"{p}/z/only").prop("SubscriptionIdentifier")) == [43]


def test_v5_message_expiry_drops_queued_message(mqtt):
    cid = f"e-{uid()}"
    topic = f"{uid()}/expiry"
    s = mqtt(5, cid).connect_and_wait(clean_start=True, session_expiry=300)
    s.subscribe(topic, 1)
    s.disconnect()
    pub = mqtt.connect(5)
    pub.publish(topic, b"short", 1, properties=props(MessageExpiryInterval=1))
    pub.publish(topic, b"long", 1, properties=props(MessageExpiryInterval=100))
    published = time.monotonic()
    while time.monotonic() - published < 2.2:  # the expiry is what is tested
        time.sleep(0.1)
    s2 = mqtt(5, cid).connect_and_wait(clean_start=False, session_expiry=300)
    assert s2.session_present
    m = s2.get()
    assert m.payload == b"long", "the expired message was delivered"
    # forwarded with the time left [MQTT-3.3.2-6]
    assert 90 <= m.prop("MessageExpiryInterval") <= 98


def test_v5_message_expiry_of_retained_message(mqtt):
    topic = f"{uid()}/expiry-retained"
    pub = mqtt.connect(5)
    pub.publish(topic, b"short", 1, retain=True, properties=props(MessageExpiryInterval=1))
    published = time.monotonic()
    while time.monotonic() - published < 2.2:
        time.sleep(0.1)
    s = mqtt.connect(5)
    s.subscribe(topic, 1)
    pub.publish(topic, b"marker", 1)
    assert s.get().payload == b"marker"


def test_v5_properties_passed_through(mqtt):
    topic = f"{uid()}/props"
    sub = mqtt.connect(5)
    sub.subscribe(topic, 1)
    pub = mqtt.connect(5)
    user = [("a", "1"), ("b", "2"), ("a", "3")]
    pub.publish(topic, "{}", 1, properties=props(
        UserProperty=user, ContentType="application/json", ResponseTopic=f"{topic}/reply",
        CorrelationData=b"\x00\x01corr", PayloadFormatIndicator=1))
    m = sub.get()
    assert m.prop("UserProperty") == user  # order kept [MQTT-3.3.2-18]
    assert m.prop("ContentType") == "application/json"
    assert m.prop("ResponseTopic") == f"{topic}/reply"
    assert m.prop("CorrelationData") == b"\x00\x01corr"
    assert m.prop("PayloadFormatIndicator") == 1


def test_v5_request_response(mqtt):
    """A responder answers on the Response Topic with the Correlation Data."""
    p = uid()
    responder = mqtt.connect(5)
    responder.subscribe(f"{p}/req", 1)
    requester = mqtt.connect(5)
    requester.subscribe(f"{p}/resp", 1)
    requester.publish(f"{p}/req", b"ping", 1, properties=props(
        ResponseTopic=f"{p}/resp", CorrelationData=b"42"))
    req = responder.get()
    responder.publish(req.prop("ResponseTopic"), b"pong", 1,
                      properties=props(CorrelationData=req.prop("CorrelationData")))
    resp = requester.get()
    assert (resp.payload, resp.prop("CorrelationData")) == (b"pong", b"42")


def test_v5_topic_alias_from_publisher(mqtt):
    topic = f"{uid()}/alias"
    sub5 = mqtt.connect(5)
    sub5.subscribe(topic, 1)
    sub4 = mqtt.connect(4)
    sub4.subscribe(topic, 1)
    pub = mqtt.connect(5)
    assert (pub.connack_properties.TopicAliasMaximum or 0) >= 1
    pub.publish(topic, b"1", 1, properties=props(TopicAlias=1))
    pub.publish("", b"2", 1, properties=props(TopicAlias=1))
    pub.publish("", b"3", 0, properties=props(TopicAlias=1))
    for s in (sub5, sub4):
        got = s.get_many(3)
        assert [(m.topic, m.payload) for m in got] == [(topic, b"1"), (topic, b"2"), (topic, b"3")]
    # the subscriber did not announce a topic alias maximum: no alias to it
    assert all(m.prop("TopicAlias") is None for m in got)


def test_v5_assigned_client_identifier(mqtt):
    c = mqtt(5, client_id="")
    c.connect_and_wait()
    assigned = c.connack_properties.AssignedClientIdentifier
    assert isinstance(assigned, str) and assigned
    topic = f"{uid()}/assigned"
    c.subscribe(topic, 1)
    c.publish(topic, b"works", 1)
    assert c.get().payload == b"works"
    other = mqtt(5, client_id="")
    other.connect_and_wait()
    assert other.connack_properties.AssignedClientIdentifier != assigned


def test_v311_empty_client_id(mqtt, raw):
    c = mqtt(4, client_id="")
    c.connect_and_wait()  # clean session: accepted
    # persistent session with an empty id: identifier rejected [MQTT-3.1.3-8]
    r = raw(4)
    ack = r.connect("", clean_start=False)
    assert ack.reason_code == 0x02
    r.wait_closed()


def test_v5_session_expiry_zero_ends_session(mqtt):
    cid = f"x-{uid()}"
    topic = f"{uid()}/noexpiry"
    s = mqtt(5, cid).connect_and_wait(clean_start=True, session_expiry=300)
    s.subscribe(topic, 1)
    # DISCONNECT may lower the expiry to 0: the session ends with it
    s.disconnect(properties=props(PacketTypes.DISCONNECT, SessionExpiryInterval=0))
    s2 = mqtt(5, cid).connect_and_wait(clean_start=False, session_expiry=300)
    assert s2.session_present is False


# ---------------------------------------------------------------------------
# More topic, retained, will and session edges
# ---------------------------------------------------------------------------


def test_wildcards_match_empty_levels(mqtt, mqtt_version):
    """'+' matches an empty level; 'a/#' matches 'a/' (section 4.7)."""
    p = uid()
    plus = mqtt.connect(mqtt_version)
    plus.subscribe(f"{p}/+/temp", 1)
    lead = mqtt.connect(mqtt_version)
    lead.subscribe(f"+/{p}", 1)
    multi = mqtt.connect(mqtt_version)
    multi.subscribe(f"{p}/x/#", 1)
    pub = mqtt.connect(mqtt_version)
    pub.publish(f"{p}//temp", b"1", 1)
    pub.publish(f"/{p}", b"2", 1)
    pub.publish(f"{p}/x/", b"3", 1)
    assert plus.get().topic == f"{p}//temp"
    assert lead.get().topic == f"/{p}"
    assert multi.get().topic == f"{p}/x/"


def test_topics_are_case_sensitive_and_exact(mqtt, mqtt_version):
    p = uid()
    s = mqtt.connect(mqtt_version)
    s.subscribe(f"{p}/Room", 1)
    pub = mqtt.connect(mqtt_version)
    for t in (f"{p}/room", f"{p}/Room/", f"{p}/Room ", f"{p}/Room/x", f"{p}/Room"):
        pub.publish(t, t, 1)
    assert s.get().topic == f"{p}/Room"


def test_resubscribe_replaces_qos(mqtt, mqtt_version):
    topic = f"{uid()}/resub"
    s = mqtt.connect(mqtt_version)
    s.subscribe(topic, 0)
    s.subscribe(topic, 2)
    pub = mqtt.connect(mqtt_version)
    pub.publish(topic, b"one", 2)
    pub.publish(topic, b"marker", 2)
    got = s.get_many(2)
    assert [(m.payload, m.qos) for m in got] == [(b"one", 2), (b"marker", 2)], "one copy, at QoS 2"


def test_fan_out_to_many_subscribers(mqtt, mqtt_version):
    topic = f"{uid()}/fan"
    subs = [mqtt.connect(mqtt_version) for _ in range(15)]
    for s in subs:
        s.subscribe(topic, 1)
    mqtt.connect(mqtt_version).publish(topic, b"all", 1)
    for s in subs:
        assert s.get().payload == b"all"


def test_retained_many_topics_via_wildcard(mqtt, mqtt_version):
    p = uid()
    pub = mqtt.connect(mqtt_version)
    topics = [f"{p}/a", f"{p}/b/c", f"{p}/d/e/f"]
    for t in topics:
        pub.publish(t, t, 1, retain=True)
    s = mqtt.connect(mqtt_version)
    s.subscribe(f"{p}/#", 1)
    got = s.get_many(3)
    assert sorted(m.topic for m in got) == sorted(topics)
    assert all(m.retain and m.payload == m.topic.encode() for m in got)
    for t in topics:
        pub.publish(t, b"", 1, retain=True)


def test_retained_not_sent_to_new_shared_subscription(mqtt, mqtt_version):
    """[MQTT-3.8.4-?] (v5 4.8.2): retained messages are not sent when a
    shared subscription is made."""
    topic = f"{uid()}/shared-retained"
    pub = mqtt.connect(mqtt_version)
    pub.publish(topic, b"kept", 1, retain=True)
    s = mqtt.connect(mqtt_version)
    s.subscribe(f"$share/g/{topic}", 1)
    pub.publish(topic, b"live", 1)
    assert s.get().payload == b"live"
    pub.publish(topic, b"", 1, retain=True)


def test_shared_subscription_prefers_online_members(mqtt, mqtt_version):
    """A member whose persistent session is offline does not get messages
    while another member is online."""
    p = uid()
    group = f"$share/g{p}/{p}/t"
    offline = persistent(mqtt, mqtt_version, f"sh-{uid()}", clean=True)
    offline.subscribe(group, 1)
    online = mqtt.connect(mqtt_version)
    online.subscribe(group, 1)
    offline.disconnect()
    pub = mqtt.connect(mqtt_version)
    for i in range(6):
        pub.publish(f"{p}/t", str(i), 1)
    assert [m.payload for m in online.get_many(6)] == [str(i).encode() for i in range(6)]


def test_will_published_on_takeover(mqtt, raw, mqtt_version):
    """The taken-over connection is closed by the server: its will (no
    delay) is published [MQTT-3.1.4-3]."""
    topic = f"{uid()}/will-takeover"
    cid = f"wt-{uid()}"
    watcher = mqtt.connect(mqtt_version)
    watcher.subscribe(topic, 1)
    first = raw(mqtt_version)
    first.connect(cid, will=Will(topic, b"taken over", qos=1))
    second = raw(mqtt_version)
    assert second.connect(cid).reason_code == 0
    packets = first.wait_closed()
    if mqtt_version == 5:
        assert [p.reason_code for p in packets if isinstance(p, Disconnect)] == [0x8E]
    assert watcher.get().payload == b"taken over"
    second.disconnect()


def test_v5_will_properties_passed_through(mqtt, raw):
    topic = f"{uid()}/will-props"
    watcher = mqtt.connect(5)
    watcher.subscribe(topic, 2)
    c = raw(5)
    c.connect(will=Will(topic, b"{}", qos=2, properties={
        Property.CONTENT_TYPE: "application/json",
        Property.USER_PROPERTY: [("why", "test")],
        Property.PAYLOAD_FORMAT_INDICATOR: 1,
        Property.RESPONSE_TOPIC: f"{topic}/r",
        Property.CORRELATION_DATA: b"cd",
    }))
    c.close()
    m = watcher.get()
    assert (m.payload, m.qos) == (b"{}", 2)
    assert m.prop("ContentType") == "application/json"
    assert m.prop("UserProperty") == [("why", "test")]
    assert m.prop("PayloadFormatIndicator") == 1
    assert m.prop("ResponseTopic") == f"{topic}/r"
    assert m.prop("CorrelationData") == b"cd"


def test_v5_session_expires(mqtt):
    """A session with expiry 1 s is gone 2 s after its disconnect."""
    cid = f"se-{uid()}"
    s = mqtt(5, cid).connect_and_wait(clean_start=True, session_expiry=1)
    s.subscribe(f"{uid()}/x", 1)
    s.disconnect()
    gone = time.monotonic()
    while time.monotonic() - gone < 2.5:
        time.sleep(0.1)
    s2 = mqtt(5, cid).connect_and_wait(clean_start=False, session_expiry=1)
    assert s2.session_present is False


def test_v5_receive_maximum_limits_inflight(mqtt, raw):
    """The broker sends no more unacknowledged QoS 1 PUBLISHes than the
    client's Receive Maximum (2) [MQTT-3.3.4-9]; each PUBACK lets one more
    through, in order."""
    topic = f"{uid()}/recvmax"
    c = raw(5)
    assert c.connect(properties={Property.RECEIVE_MAXIMUM: 2}).reason_code == 0
    c.send(Subscribe(1, [SubscriptionRequest(topic, 1)]))
    assert isinstance(c.expect(), Suback)
    pub = mqtt.connect(5)
    for i in range(5):
        pub.publish(topic, str(i), 1)
    first = [c.expect(), c.expect()]
    assert [p.payload for p in first] == [b"0", b"1"]
    # a third one must wait for an acknowledgement
    with pytest.raises(AssertionError, match="no packet"):
        c.expect(timeout=0.7)
    got = []
    for p in first:
        c.send(Puback(p.packet_id))
    while len(got) < 3:
        p = c.expect()
        got.append(p.payload)
        c.send(Puback(p.packet_id))
    assert got == [b"2", b"3", b"4"]
    c.disconnect()


def test_v5_maximum_packet_size_of_client(mqtt, raw):
    """A message larger than the client's Maximum Packet Size is not sent to
    it [MQTT-3.1.2-25]; the next one is."""
    topic = f"{uid()}/maxsize"
    c = raw(5)
    assert c.connect(properties={Property.MAXIMUM_PACKET_SIZE: 200}).reason_code == 0
    c.send(Subscribe(1, [SubscriptionRequest(topic, 1)]))
    assert isinstance(c.expect(), Suback)
    pub = mqtt.connect(5)
    pub.publish(topic, b"x" * 500, 1)
    pub.publish(topic, b"small", 1)
    p = c.expect()
    assert p.payload == b"small"
    c.send(Puback(p.packet_id))
    c.disconnect()


@pytest.mark.parametrize("level", [4, 5])
def test_qos2_inbound_exactly_once(mqtt, raw, level):
    """A QoS 2 PUBLISH resent (DUP) before PUBREL is delivered once."""
    topic = f"{uid()}/qos2-dup"
    s = mqtt.connect(level)
    # QoS 1 subscription: paho hands a QoS 2 message to the application only
    # at PUBREL, which would reorder it after the QoS 1 marker
    s.subscribe(topic, 1)
    c = raw(level)
    c.connect()
    c.send(Publish(topic, b"once", qos=2, packet_id=9))
    assert c.expect() == Pubrec(9)
    c.send(Publish(topic, b"once", qos=2, packet_id=9, dup=True))
    assert c.expect() == Pubrec(9)
    c.send(Pubrel(9))
    assert c.expect() == Pubcomp(9)
    c.send(Publish(topic, b"marker", qos=1, packet_id=10))
    assert c.expect() == Puback(10)
    assert [m.payload for m in s.get_many(2)] == [b"once", b"marker"]
    c.disconnect()


@pytest.mark.parametrize("level", [4, 5])
def test_qos2_outbound_flow(mqtt, raw, level):
    """PUBLISH → PUBREC → PUBREL → PUBCOMP towards a subscriber."""
    topic = f"{uid()}/qos2-out"
    c = raw(level)
    c.connect()
    c.send(Subscribe(1, [SubscriptionRequest(topic, 2)]))
    assert isinstance(c.expect(), Suback)
    mqtt.connect(level).publish(topic, b"q2", 2)
    p = c.expect()
    assert (p.payload, p.qos, p.dup) == (b"q2", 2, False)
    c.send(Pubrec(p.packet_id))
    assert c.expect() == Pubrel(p.packet_id)
    c.send(Pubcomp(p.packet_id))
    c.send(Pingreq())
    assert c.expect() == Pingresp()
    c.disconnect()


def test_inflight_resent_with_dup_on_reconnect(mqtt, raw, mqtt_version):
    """An unacknowledged QoS 1 PUBLISH is resent with DUP when the
    persistent session reconnects [MQTT-4.4.0-1]; a PUBREC'd QoS 2 one gets
    its PUBREL resent."""
    topic = f"{uid()}/resend"
    cid = f"rs-{uid()}"
    kwargs = {"clean_start": False}
    if mqtt_version == 5:
        kwargs["properties"] = {Property.SESSION_EXPIRY_INTERVAL: 300}
    c = raw(mqtt_version)
    c.connect(cid, **kwargs)
    c.send(Subscribe(1, [SubscriptionRequest(topic, 2)]))
    assert isinstance(c.expect(), Suback)
    pub = mqtt.connect(mqtt_version)
    pub.publish(topic, b"q1", 1)
    pub.publish(topic, b"q2", 2)
    p1, p2 = c.expect(), c.expect()
    assert (p1.payload, p1.qos, p2.payload, p2.qos) == (b"q1", 1, b"q2", 2)
    c.send(Pubrec(p2.packet_id))
    assert c.expect() == Pubrel(p2.packet_id)
    c.close()
    c2 = raw(mqtt_version)
    ack = c2.connect(cid, **kwargs)
    assert ack.session_present
    again = c2.expect()
    assert (again.payload, again.qos, again.dup, again.packet_id) == (b"q1", 1, True, p1.packet_id)
    assert c2.expect() == Pubrel(p2.packet_id)
    c2.send(Puback(p1.packet_id))
    c2.send(Pubcomp(p2.packet_id))
    c2.send(Pingreq())
    assert c2.expect() == Pingresp()
    c2.disconnect()


@pytest.mark.parametrize("level", [4, 5])
def test_qos2_duplicate_before_pubrec_delivered_once(mqtt, raw, level):
    """A QoS 2 PUBLISH and its DUP resend arriving together, while the first
    is still being stored for a persistent subscriber (so its PUBREC is not
    out yet), is still delivered only once [MQTT-4.3.3-?, 4.3.3 method A]."""
    topic = f"{uid()}/qos2-dup-early"
    s = persistent(mqtt, 4, f"d-{uid()}", clean=True)
    s.subscribe(topic, 1)
    c = raw(level)
    c.connect()
    first = encode(Publish(topic, b"once", qos=2, packet_id=4), level)
    dup = encode(Publish(topic, b"once", qos=2, packet_id=4, dup=True), level)
    c.send(first + dup)
    assert c.expect() == Pubrec(4)
    assert c.expect() == Pubrec(4)
    c.send(Pubrel(4))
    assert c.expect() == Pubcomp(4)
    c.send(Publish(topic, b"marker", qos=1, packet_id=5))
    assert c.expect() == Puback(5)
    assert [m.payload for m in s.get_many(2)] == [b"once", b"marker"]
    c.disconnect()


@pytest.mark.parametrize("first,second", [(4, 5), (5, 4), (3, 5)], ids=["v311-then-v5", "v5-then-v311", "v31-then-v5"])
def test_persistent_session_across_protocol_versions(mqtt, first, second):
    """Messages queued for a session are sent in the protocol of the
    connection that resumes it (v5 properties dropped for v3)."""
    cid = f"xv-{uid()}"
    topic = f"{uid()}/xv"
    s = persistent(mqtt, first, cid, clean=True)
    s.subscribe(topic, 1)
    s.disconnect()
    pub = mqtt.connect(5)
    pub.publish(topic, b"queued", 1, properties=props(UserProperty=[("k", "v")], ContentType="t"))
    s2 = persistent(mqtt, second, cid, clean=False)
    assert s2.session_present is True
    m = s2.get()
    assert (m.topic, m.payload, m.qos) == (topic, b"queued", 1)
    if second == 5:
        assert m.prop("UserProperty") == [("k", "v")]
    pub.publish(topic, b"live", 1)
    assert s2.get().payload == b"live"
