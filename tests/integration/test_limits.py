"""The ``mqtt.*`` limits and capabilities, set through ``TBMQ_MQTT__*``
environment variables: announced in CONNACK and enforced."""

from __future__ import annotations

import pytest

from tbmq.mqtt import (
    Connack, Disconnect, Property, Puback, Publish, Suback, Subscribe, SubscriptionRequest, Will,
)
from tests.integration.helpers import uid

pytestmark = pytest.mark.timeout(60)

BROKER_ENV = {
    "TBMQ_MQTT__MAX_QOS": "1",
    "TBMQ_MQTT__RETAIN_AVAILABLE": "false",
    "TBMQ_MQTT__WILDCARD_SUBSCRIPTION_AVAILABLE": "false",
    "TBMQ_MQTT__SUBSCRIPTION_IDENTIFIER_AVAILABLE": "false",
    "TBMQ_MQTT__SHARED_SUBSCRIPTION_AVAILABLE": "false",
    "TBMQ_MQTT__MAX_KEEP_ALIVE": "10",
    "TBMQ_MQTT__MAX_SESSION_EXPIRY_INTERVAL": "100",
    "TBMQ_MQTT__MAX_CLIENT_ID_LENGTH": "30",
    "TBMQ_MQTT__ALLOW_EMPTY_CLIENT_ID": "false",
    "TBMQ_MQTT__MAX_QUEUED_MESSAGES": "5",
    "TBMQ_MQTT__MAX_INFLIGHT_MESSAGES": "3",
    "TBMQ_MQTT__RESPONSE_INFORMATION": "resp/info",
}


def last_disconnect(packets) -> int | None:
    codes = [p.reason_code for p in packets if isinstance(p, Disconnect)]
    return codes[-1] if codes else None


def test_v5_connack_announces_limits(raw):
    c = raw(5)
    ack = c.connect(keep_alive=60, properties={Property.SESSION_EXPIRY_INTERVAL: 300,
                                               Property.REQUEST_RESPONSE_INFORMATION: 1})
    assert isinstance(ack, Connack) and ack.reason_code == 0
    p = ack.properties
    assert p.get(Property.MAXIMUM_QOS) == 1
    assert p.get(Property.RETAIN_AVAILABLE) == 0
    assert p.get(Property.WILDCARD_SUBSCRIPTION_AVAILABLE) == 0
    assert p.get(Property.SUBSCRIPTION_IDENTIFIER_AVAILABLE) == 0
    assert p.get(Property.SHARED_SUBSCRIPTION_AVAILABLE) == 0
    assert p.get(Property.SERVER_KEEP_ALIVE) == 10
    assert p.get(Property.SESSION_EXPIRY_INTERVAL) == 100
    assert p.get(Property.RESPONSE_INFORMATION) == "resp/info"
    c.send(Disconnect(0, {Property.SESSION_EXPIRY_INTERVAL: 0}))
    c.wait_closed()


def test_v5_keep_alive_zero_gets_server_keep_alive(raw):
    c = raw(5)
    ack = c.connect(keep_alive=0)
    assert ack.properties.get(Property.SERVER_KEEP_ALIVE) == 10
    c.disconnect()


def test_subscribe_qos_capped(raw, mqtt_version):
    c = raw(mqtt_version)
    c.connect()
    c.send(Subscribe(1, [SubscriptionRequest(f"{uid()}/q", 2)]))
    assert c.expect() == Suback(1, [1])
    c.disconnect()


def test_v5_publish_above_max_qos(raw):
    c = raw(5)
    c.connect()
    c.send(Publish(f"{uid()}/q", b"x", qos=2, packet_id=1))
    assert last_disconnect(c.wait_closed()) == 0x9B


def test_v5_publish_retain_not_available(raw):
    c = raw(5)
    c.connect()
    c.send(Publish(f"{uid()}/r", b"x", qos=1, packet_id=1, retain=True))
    assert last_disconnect(c.wait_closed()) == 0x9A


@pytest.mark.parametrize("topic_filter,v5_code", [
    ("{p}/+", 0xA2), ("{p}/#", 0xA2), ("$share/g/{p}", 0x9E),
])
def test_unavailable_subscriptions_refused(raw, mqtt_version, topic_filter, v5_code):
    p = uid()
    c = raw(mqtt_version)
    c.connect()
    c.send(Subscribe(1, [SubscriptionRequest(topic_filter.format(p=p), 1),
                         SubscriptionRequest(f"{p}/ok", 1)]))
    assert c.expect() == Suback(1, [v5_code if mqtt_version == 5 else 0x80, 1])
    c.disconnect()


def test_v5_subscription_identifier_not_available(raw):
    c = raw(5)
    c.connect()
    c.send(Subscribe(1, [SubscriptionRequest(f"{uid()}/s", 1)],
                     {Property.SUBSCRIPTION_IDENTIFIER: [5]}))
    assert last_disconnect(c.wait_closed()) == 0xA1


@pytest.mark.parametrize("client_id", ["x" * 31, ""], ids=["too-long", "empty"])
def test_client_id_refused(raw, mqtt_version, client_id):
    c = raw(mqtt_version)
    ack = c.connect(client_id)
    assert isinstance(ack, Connack)
    assert ack.reason_code == (0x85 if mqtt_version == 5 else 0x02)
    c.wait_closed()


def test_client_id_at_max_length_accepted(raw, mqtt_version):
    c = raw(mqtt_version)
    assert c.connect("y" * 30).reason_code == 0
    c.disconnect()


@pytest.mark.parametrize("will,code", [
    (Will("w/t", b"x", qos=2), 0x9B), (Will("w/t", b"x", qos=1, retain=True), 0x9A),
], ids=["qos2", "retain"])
def test_v5_will_refused(raw, will, code):
    c = raw(5)
    ack = c.connect(will=will)
    assert isinstance(ack, Connack) and ack.reason_code == code
    c.wait_closed()


def test_max_queued_messages(mqtt, mqtt_version):
    """An offline persistent session keeps no message in memory (5 at most
    when online): all of them wait in the device store and come back in
    order, none lost."""
    cid = f"q-{uid()}"
    topic = f"{uid()}/queue"
    if mqtt_version == 5:
        s = mqtt(5, cid).connect_and_wait(clean_start=True, session_expiry=100)
    else:
        s = mqtt(4, cid, clean_session=False).connect_and_wait()
    s.subscribe(topic, 1)
    s.disconnect()
    pub = mqtt.connect(mqtt_version)
    for i in range(10):
        pub.publish(topic, str(i), 1)
    if mqtt_version == 5:
        s2 = mqtt(5, cid).connect_and_wait(clean_start=False, session_expiry=100)
    else:
        s2 = mqtt(4, cid, clean_session=False).connect_and_wait()
    assert [m.payload for m in s2.get_many(10)] == [str(i).encode() for i in range(10)]
    pub.publish(topic, b"marker", 1)
    assert s2.get().payload == b"marker"


def test_max_inflight_messages(mqtt, raw):
    """At most 3 unacknowledged QoS 1 PUBLISHes towards a client that would
    accept 65535; each PUBACK releases the next."""
    topic = f"{uid()}/inflight"
    c = raw(5)
    c.connect()
    c.send(Subscribe(1, [SubscriptionRequest(topic, 1)]))
    assert isinstance(c.expect(), Suback)
    pub = mqtt.connect(5)
    for i in range(5):
        pub.publish(topic, str(i), 1)
    first = [c.expect() for _ in range(3)]
    assert [p.payload for p in first] == [b"0", b"1", b"2"]
    with pytest.raises(AssertionError, match="no packet"):
        c.expect(timeout=0.7)
    c.send(Puback(first[0].packet_id))
    fourth = c.expect()
    assert fourth.payload == b"3"
    for p in first[1:] + [fourth]:
        c.send(Puback(p.packet_id))
    last = c.expect()
    assert last.payload == b"4"
    c.send(Puback(last.packet_id))
    c.disconnect()
