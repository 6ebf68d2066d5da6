"""TBMQ's topic catalogue (tbmq/cluster/topics.py): names, prefix, hashing
of unsafe parts, codecs, compacted and durable topics."""

from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tbmq.cluster import records
from tbmq.cluster.topics import MAX_TOPIC_LENGTH, TopicCatalogue, hashed_name, safe_name
from tbmq.errors import RecordEncodingError

KAFKA_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")


def h(s: str) -> str:
    return "h" + hashlib.sha1(s.encode("utf-8")).hexdigest()


def test_tbmq_names_without_prefix():
    c = TopicCatalogue()
    assert c.msg_all == "tbmq.msg.all"
    assert c.msg_retained == "tbmq.msg.retained"
    assert c.msg_persisted == "tbmq.msg.persisted"
    assert c.client_session == "tbmq.client.session"
    assert c.client_subscriptions == "tbmq.client.subscriptions"
    assert c.session_event_request == "tbmq.client.session.event.request"
    assert c.events == "tbmq.events"
    assert c.downlink_basic("node-1") == "tbmq.msg.downlink.basic.node-1"
    assert c.downlink_persisted("node-1") == "tbmq.msg.downlink.persisted.node-1"
    assert c.app("app_1") == "tbmq.msg.app.app_1"
    assert c.app_shared("a/+/b") == "tbmq.msg.app.shared." + h("a/+/b")
    assert c.session_event_response("n2") == "tbmq.client.session.event.response.n2"
    assert c.client_disconnect("n2") == "tbmq.client.disconnect.n2"


def test_the_prefix_comes_first():
    c = TopicCatalogue("prod.")
    assert c.msg_all == "prod.tbmq.msg.all"
    assert c.app("x") == "prod.tbmq.msg.app.x"
    assert c.client_disconnect("n") == "prod.tbmq.client.disconnect.n"


@pytest.mark.parametrize("prefix", ["a b", "x/", "é", "p" * 200])
def test_bad_prefixes_are_refused(prefix):
    with pytest.raises(ValueError, match="topic prefix"):
        TopicCatalogue(prefix)


@pytest.mark.parametrize("client_id,hashed", [
    ("sensor-1", False), ("Sensor_1", False),
    ("a.b", True),  # Kafka takes . and _ as one: a.b would collide with a_b
    ("a/b", True), ("", True), ("é", True), ("x y", True), ("x" * 300, True),
    ("shared_x", True),  # would collide with tbmq.msg.app.shared.x
    (h("a/b"), True),  # looks hashed: hashed again, so it cannot meet a/b
])
def test_unsafe_client_ids_are_hashed(client_id, hashed):
    name = TopicCatalogue().app(client_id)
    assert name == "tbmq.msg.app." + (h(client_id) if hashed else client_id)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.sampled_from(["", "p.", "cluster-7_"]))
def test_every_name_is_a_valid_kafka_name(part, prefix):
    c = TopicCatalogue(prefix)
    names = [c.downlink_basic(part), c.downlink_persisted(part), c.app(part),
             c.app_shared(part), c.session_event_response(part), c.client_disconnect(part)]
    for name in names:
        assert KAFKA_NAME.match(name), name
        assert len(name) <= MAX_TOPIC_LENGTH
    # stable and distinct from the name of another part
    assert c.app(part) == TopicCatalogue(prefix).app(part)
    assert c.app(part) != c.app(part + "x")
    # never taken for a shared-subscription topic, even with . and _ alike
    assert not c.app(part).replace(".", "_").startswith(
        (prefix + "tbmq.msg.app.shared.").replace(".", "_"))


def test_safe_name_keeps_safe_and_hashes_the_rest():
    assert safe_name("abc") == "abc"
    assert safe_name("abc", room=2) == h("abc")
    assert safe_name("\ud800") == "h" + hashlib.sha1("\ud800".encode("utf-8", "surrogatepass")).hexdigest()


def test_codecs():
    c = TopicCatalogue("p.")
    assert c.codec_for(c.msg_all) is records.MESSAGE
    assert c.codec_for(c.msg_retained) is records.RETAINED
    assert c.codec_for(c.msg_persisted) is records.PERSISTED_RUNS
    assert c.codec_for(c.downlink_persisted("n")) is records.PERSISTED
    assert c.codec_for(c.downlink_basic("n")) is records.DOWNLINK
    for name in (c.app("a"), c.app_shared("f/#")):
        assert c.codec_for(name) is records.APPLICATION
    assert c.codec_for(c.client_session) is records.SESSION
    assert c.codec_for(c.client_subscriptions) is records.SUBSCRIPTIONS
    assert c.codec_for(c.session_event_request) is records.SESSION_EVENT
    assert c.codec_for(c.session_event_response("n")) is records.SESSION_EVENT_RESPONSE
    assert c.codec_for(c.client_disconnect("n")) is records.DISCONNECT
    assert c.codec_for(c.events) is records.BYTES
    for name in ("tbmq.msg.all", "p.tbmq.msg.nothing", "p.tbmq.msg.app.", "p.other"):
        with pytest.raises(RecordEncodingError, match="not a topic of the catalogue"):
            c.codec_for(name)


def test_compacted_and_durable():
    c = TopicCatalogue("p.")
    compacted = {c.client_session, c.client_subscriptions, c.msg_retained}
    durable = {c.client_session, c.client_subscriptions, c.app("a"), c.app_shared("f/#")}
    every = {c.msg_all, c.msg_retained, c.msg_persisted, c.downlink_basic("n"),
             c.downlink_persisted("n"), c.app("a"), c.app_shared("f/#"), c.client_session,
             c.client_subscriptions, c.session_event_request, c.session_event_response("n"),
             c.client_disconnect("n"), c.events}
    assert {t for t in every if c.compacted(t)} == compacted
    assert {t for t in every if c.durable(t)} == durable
    assert not c.durable("tbmq.client.session")  # another prefix
    assert not c.compacted("tbmq.client.session")


def test_per_id_names_are_remembered_within_a_bound_and_stay_right_past_it(monkeypatch):
    c = TopicCatalogue("p.")
    monkeypatch.setattr(TopicCatalogue, "NAMES_CACHED", 3)
    ids = ["node-1", "a/b", "shared_x", "node-2", "ünï"]
    first = [(c.downlink_basic(i), c.app(i)) for i in ids]
    assert len(c._names) <= 3  # forgotten when full, never more
    assert [(c.downlink_basic(i), c.app(i)) for i in ids] == first
    assert first[0] == ("p.tbmq.msg.downlink.basic.node-1", "p.tbmq.msg.app.node-1")
    assert first[2][1] == "p.tbmq.msg.app." + hashed_name("shared_x")
    assert first[1][0] == "p.tbmq.msg.downlink.basic." + hashed_name("a/b")
