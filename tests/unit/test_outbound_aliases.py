"""Topic aliases the broker gives the topics it sends (MQTT 5.0 §3.3.2.3.4;
issue 12, item 7): ``mqtt.outbound_topic_aliases``, off by default, up to the
client's Topic Alias Maximum, the least recently used alias reassigned."""

from __future__ import annotations

from tbmq.mqtt import Property, Puback, Publish, Subscribe, SubscriptionRequest
from tests.helpers import Harness

ALIAS = Property.TOPIC_ALIAS


def subscriber(h, client_id="s", level=5, maximum=2, qos=0, props=None):
    props = dict(props or {})
    if maximum is not None:
        props[Property.TOPIC_ALIAS_MAXIMUM] = maximum
    s = h.client(client_id, level=level, properties=props if level == 5 else {})
    s.send(Subscribe(1, [SubscriptionRequest("#", qos)]))
    s.received()
    return s


def publish(h, *topics, qos=0):
    p = h.client("p")
    for i, topic in enumerate(topics, 1):
        p.send(Publish(topic, topic.encode(), qos=qos, packet_id=i if qos else None))


def seen(client):
    """(topic name as sent, alias or None, payload) of each PUBLISH received."""
    return [(m.topic, m.properties.get(ALIAS), m.payload) for m in client.received()
            if isinstance(m, Publish)]


def test_off_by_default_even_when_the_client_takes_aliases():
    h = Harness()
    assert h.config.mqtt.outbound_topic_aliases == 0
    s = subscriber(h, maximum=10)
    publish(h, "a/b", "a/b")
    assert seen(s) == [("a/b", None, b"a/b"), ("a/b", None, b"a/b")]
    assert h.broker.sessions.sessions["s"].outbox.sent_aliases is None


def test_aliases_are_given_and_the_least_recently_used_is_reassigned():
    h = Harness({"mqtt": {"outbound_topic_aliases": 10}})
    s = subscriber(h, maximum=2)  # the client's maximum is the lower one
    publish(h, "a", "a", "b", "c", "a", "c", "b")
    assert seen(s) == [
        ("a", 1, b"a"),   # a new topic: its name and a new alias
        ("", 1, b"a"),    # known: an empty topic name (§3.3.2.3.4)
        ("b", 2, b"b"),
        ("c", 1, b"c"),   # both taken: the least recently used (a's 1) is given to c
        ("a", 2, b"a"),   # then b's
        ("", 1, b"c"),
        ("b", 2, b"b"),   # a was used after c: a's alias goes
    ]


def test_a_client_resolving_the_aliases_gets_every_topic_right():
    h = Harness({"mqtt": {"outbound_topic_aliases": 3}})
    s = subscriber(h, maximum=5, qos=1)
    topics = [f"t/{i % 5}" for i in range(40)]
    publish(h, *topics, qos=1)
    mapping = {}
    resolved = []
    for m in s.received():
        alias = m.properties[ALIAS]
        assert 1 <= alias <= 3  # never above the lower maximum [MQTT-3.3.2-11]
        if m.topic:
            mapping[alias] = m.topic
        resolved.append(mapping[alias])
        assert m.payload == mapping[alias].encode()
        s.send(Puback(m.packet_id))
    assert resolved == topics


def test_no_aliases_for_a_client_that_takes_none_or_a_v3_client():
    h = Harness({"mqtt": {"outbound_topic_aliases": 10}})
    none = subscriber(h, "none", maximum=None)  # no Topic Alias Maximum [MQTT-3.1.2-27]
    zero = subscriber(h, "zero", maximum=0)
    v3 = subscriber(h, "v3", level=4, maximum=None)
    publish(h, "x/y", "x/y")
    for client in (none, zero, v3):
        assert seen(client) == [("x/y", None, b"x/y"), ("x/y", None, b"x/y")]


def test_subscribers_with_and_without_aliases_share_a_message():
    """The encoding shared by a message's subscribers is not the aliased one."""
    h = Harness({"mqtt": {"outbound_topic_aliases": 4}})
    plain = subscriber(h, "plain", maximum=None, qos=1)
    aliased = subscriber(h, "aliased", maximum=4, qos=1)
    publish(h, "m", "m", qos=1)
    assert [(m.topic, m.properties.get(ALIAS), m.packet_id) for m in plain.received()] == [
        ("m", None, 1), ("m", None, 2)]
    assert [(m.topic, m.properties.get(ALIAS), m.packet_id) for m in aliased.received()] == [
        ("m", 1, 1), ("", 1, 2)]


def test_a_message_not_sent_does_not_establish_its_alias():
    """A PUBLISH too large for the client is dropped: the client never
    learnt its alias, so the next one carries the topic name again."""
    h = Harness({"mqtt": {"outbound_topic_aliases": 4}})
    s = subscriber(h, maximum=4, props={Property.MAXIMUM_PACKET_SIZE: 60})
    p = h.client("p")
    p.send(Publish("big/topic", b"x" * 100), Publish("big/topic", b"small"))
    assert seen(s) == [("big/topic", 1, b"small")]


def test_aliases_start_again_on_a_new_connection():
    """Mappings last as long as the connection [MQTT-3.3.2-7]."""
    h = Harness({"mqtt": {"outbound_topic_aliases": 4}})
    props = {Property.SESSION_EXPIRY_INTERVAL: 60}
    s = subscriber(h, maximum=4, qos=1, props=props)
    publish(h, "r/t", qos=1)
    (first,) = s.received()
    assert (first.topic, first.properties[ALIAS]) == ("r/t", 1)
    s.lose()  # unacknowledged: resent on the next connection
    again = h.client("s", level=5, clean_start=False,
                     properties={**props, Property.TOPIC_ALIAS_MAXIMUM: 4})
    resent = [m for m in again.pending + again.received() if isinstance(m, Publish)]
    assert [(m.topic, m.properties[ALIAS], m.dup) for m in resent] == [("r/t", 1, True)]
