"""The bus record encodings (tbmq/cluster/records.py): every record type
round-trips; wrong types, unknown versions and arbitrary bytes only ever
raise RecordEncodingError."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tbmq.cluster import records as r
from tbmq.errors import RecordEncodingError
from tbmq.model import ClientType, Message, SubscriptionOptions
from tbmq.mqtt.constants import Property

text = st.text(max_size=20)
#: MQTT strings never hold U+0000 [MQTT-1.5.4-2] (the decoder refuses it)
mqtt_text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
                    max_size=20)  # UTF-8 strings [MQTT-1.5.4-1]: no surrogates
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
qos = st.integers(0, 2)
u32 = st.integers(0, 0xFFFFFFFF)

properties = st.fixed_dictionaries({}, optional={
    Property.PAYLOAD_FORMAT_INDICATOR: st.integers(0, 1),
    Property.MESSAGE_EXPIRY_INTERVAL: u32,
    Property.CONTENT_TYPE: mqtt_text,
    Property.RESPONSE_TOPIC: mqtt_text,
    Property.CORRELATION_DATA: st.binary(max_size=20),
    Property.USER_PROPERTY: st.lists(st.tuples(mqtt_text, mqtt_text), min_size=1, max_size=3),
})

messages = st.builds(Message, text, st.binary(max_size=50), qos, st.booleans(), properties,
                     text, times, st.none() | times)
deliveries = st.builds(r.Delivery, text, messages, qos, st.booleans(),
                       st.lists(st.integers(1, 268435455), max_size=3).map(tuple),
                       st.integers(0, 2**63 - 1))
runs = st.builds(r.DeliveryRun, text, st.lists(messages, min_size=1, max_size=3).map(tuple),
                 qos, st.booleans(), st.lists(st.integers(1, 268435455), max_size=3).map(tuple))
wills = st.builds(r.WillRecord, text, st.binary(max_size=20), qos, st.booleans(), properties)
client_types = st.sampled_from(list(ClientType))
sessions = st.builds(r.SessionInfo, text, text, text, st.booleans(), st.booleans(), client_types,
                     u32, st.sampled_from([3, 4, 5]), st.none() | times, st.none() | times,
                     times, st.none() | wills, st.none() | text, st.none() | text,
                     st.none() | text)
options = st.builds(SubscriptionOptions, qos, st.booleans(), st.booleans(), st.integers(0, 2),
                    st.none() | st.integers(1, 268435455))
subscriptions = st.builds(r.SubscriptionsRecord, text,
                          st.dictionaries(text, options, max_size=4))
events = st.builds(r.SessionEvent, st.sampled_from(r.SESSION_EVENT_KINDS), text, text, text, text,
                   st.booleans(), st.booleans(), client_types, u32, st.sampled_from([3, 4, 5]),
                   times)
responses = st.builds(r.SessionEventResponse, text, text, st.booleans(), st.booleans(),
                      st.none() | sessions, text)
disconnects = st.builds(r.DisconnectCommand, text, text, st.integers(0, 255))
markers = st.builds(r.SessionMarker, text, text, text, st.booleans())
nodes = st.builds(r.NodeInfo, text, times, times, st.booleans(),
                  st.lists(text, max_size=3).map(tuple))

CASES = [
    (r.MESSAGE, messages),
    (r.RETAINED, messages),
    (r.DELIVERY, deliveries),
    (r.MARKER, markers),
    (r.PERSISTED, deliveries | markers),
    (r.PERSISTED_RUNS, deliveries | runs | markers),
    (r.DELIVERY_RUN, runs),
    (r.DOWNLINK, deliveries | runs),
    (r.SESSION, sessions),
    (r.SUBSCRIPTIONS, subscriptions),
    (r.SESSION_EVENT, events),
    (r.SESSION_EVENT_RESPONSE, responses),
    (r.DISCONNECT, disconnects),
    (r.NODE, nodes),
    (r.BYTES, st.binary(max_size=100)),
]
CODECS = [codec for codec, _ in CASES]
IDS = [codec.name + ("+tombstone" if codec.tombstone else "") for codec in CODECS]


@pytest.mark.parametrize("codec,values", CASES, ids=IDS)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_round_trip(codec, values, data):
    value = data.draw(values)
    encoded = codec.encode(value)
    assert isinstance(encoded, bytes)
    assert codec.decode(encoded) == value


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_only_raise_record_encoding_error(codec, data):
    try:
        codec.decode(data)
    except RecordEncodingError:
        pass


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | text
    | st.binary(max_size=10),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(text, children, max_size=3),
    max_leaves=20)


TAGGED = [c for c in CODECS if isinstance(c, r.RecordCodec)]


@pytest.mark.parametrize("codec", TAGGED, ids=[IDS[CODECS.index(c)] for c in TAGGED])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_well_tagged_arrays_of_wrong_fields_only_raise_record_encoding_error(codec, data):
    fields = data.draw(st.lists(msgpack_values, max_size=16))
    version = data.draw(st.sampled_from([1, 1, 1, 2, "1", None]))
    raw = msgpack.packb([codec.tag, version, *fields], use_bin_type=True)
    try:
        value = codec.decode(raw)
    except RecordEncodingError:
        return
    assert isinstance(value, codec.cls)  # a valid record by chance: it re-encodes to itself
    assert codec.decode(codec.encode(value)) == value


def test_the_persisted_union_reads_each_member_by_its_tag_and_nothing_else():
    d = r.Delivery("c", Message("t", b"x"), 1, seq=7)
    m = r.SessionMarker("c", "node-a", "s1", False)
    assert r.PERSISTED.encode(d) == r.DELIVERY.encode(d)
    assert r.PERSISTED.encode(m) == r.MARKER.encode(m)
    assert r.PERSISTED.decode(r.DELIVERY.encode(d)) == d
    assert r.PERSISTED.decode(r.MARKER.encode(m)) == m
    with pytest.raises(RecordEncodingError, match="expected a tag of"):
        r.PERSISTED.decode(r.MESSAGE.encode(Message("t", b"x")))
    for bad in (None, r.SessionInfo("c", "n", "s", True, True, ClientType.DEVICE, 0, 5, None,
                                    None, 0.0, None)):
        with pytest.raises(RecordEncodingError):
            r.PERSISTED.encode(bad)
    with pytest.raises(RecordEncodingError, match="tombstone"):
        r.PERSISTED.decode(None)


def test_the_downlink_union_reads_deliveries_and_runs_and_refuses_an_empty_run():
    m1, m2 = Message("t/1", b"x", 1), Message("t/2", b"y", 1, True)
    d = r.Delivery("c", m1, 1, seq=0)
    run = r.DeliveryRun("c", [m1, m2], 1, True, (3,))
    assert r.DOWNLINK.encode(d) == r.DELIVERY.encode(d)
    assert r.DOWNLINK.decode(r.DELIVERY.encode(d)) == d
    read = r.DOWNLINK.decode(r.DOWNLINK.encode(run))
    assert type(read) is r.DeliveryRun and read.messages == (m1, m2)
    assert (read.client_id, read.qos, read.retain, read.subscription_ids) == ("c", 1, True, (3,))
    for bad in (r.DeliveryRun("c", [], 1), r.DeliveryRun("c", [m1, "not a message"], 1),
                r.DeliveryRun("c", [m1], 3), r.SessionMarker("c", "n", "s", True)):
        with pytest.raises(RecordEncodingError):
            r.DOWNLINK.encode(bad)
    # what a consumer counts: a run's messages; one for anything else, however malformed
    arrays = [msgpack.unpackb(r.DOWNLINK.encode(v), use_list=False) for v in (d, run)]
    assert r.DOWNLINK.count_arrays(arrays) == 3
    assert r.DOWNLINK.count_arrays([("dlr",), (("dlr",), 1), None, (), ({"a": 1},),
                                    ("dlr", 1, "c", (), 1, False, ())]) == 6
    assert r.DELIVERY.count_arrays(arrays) == 2
    empty = msgpack.packb(["dlr", 1, "c", [], 1, False, []], use_bin_type=True)
    with pytest.raises(RecordEncodingError, match="non-empty"):
        r.DOWNLINK.decode(empty)


def test_the_persisted_topic_reads_deliveries_runs_and_markers():
    """``tbmq.msg.persisted`` carries a routed batch's messages to one
    client as a run, besides lone deliveries and session markers; the
    persisted downlink does not take runs; a consumer counts a run's
    messages."""
    m1, m2 = Message("t/1", b"x", 1), Message("t/2", b"y", 1)
    d = r.Delivery("c", m1, 1, seq=0)
    run = r.DeliveryRun("c", [m1, m2], 1, False, ())
    marker = r.SessionMarker("c", "n", "s", True)
    for value in (d, marker):
        assert r.PERSISTED_RUNS.decode(r.PERSISTED_RUNS.encode(value)) == value
    read = r.PERSISTED_RUNS.decode(r.PERSISTED_RUNS.encode(run))
    assert type(read) is r.DeliveryRun and read.messages == (m1, m2)
    arrays = [msgpack.unpackb(r.PERSISTED_RUNS.encode(v), use_list=False)
              for v in (d, run, marker)]
    assert r.PERSISTED_RUNS.count_arrays(arrays) == 4
    with pytest.raises(RecordEncodingError):
        r.PERSISTED.encode(run)


def test_a_reader_rejects_another_type_and_an_unknown_version():
    d = r.Delivery("c", Message("t", b"x"), 0)
    encoded = r.DELIVERY.encode(d)
    with pytest.raises(RecordEncodingError, match="expected tag 'msg'"):
        r.MESSAGE.decode(encoded)
    obj = msgpack.unpackb(encoded, raw=False)
    assert obj[:2] == ["dlv", 1]
    obj[1] = 2
    with pytest.raises(RecordEncodingError, match="unknown version 2"):
        r.DELIVERY.decode(msgpack.packb(obj, use_bin_type=True))


def _session_info(**who) -> r.SessionInfo:
    return r.SessionInfo("c", "node-a", "s1", True, True, ClientType.APPLICATION, 3600, 5,
                         10.0, None, 11.0, None, **who)


def test_a_session_record_is_version_3_with_who_the_client_is_and_the_stamp_at_the_end():
    info = _session_info(address="192.0.2.7:50123", username="alice",
                         credentials_name="sensors", stamp=1_700_000_000_000_001)
    obj = msgpack.unpackb(r.SESSION.encode(info), raw=False)
    assert obj[:2] == ["ses", 3] == ["ses", r.SESSION_VERSION]
    assert obj[2:5] == ["c", "node-a", "s1"]
    assert obj[-4:] == ["192.0.2.7:50123", "alice", "sensors", 1_700_000_000_000_001]
    assert len(obj) == 2 + 16
    assert r.SESSION.decode(r.SESSION.encode(info)) == info


def test_a_session_record_of_version_2_is_read_with_stamp_0():
    info = _session_info(address="192.0.2.7:50123", username="alice",
                         credentials_name="sensors", stamp=5)
    v2 = ["ses", 2, *msgpack.unpackb(r.SESSION.encode(info), raw=False)[2:17]]
    read = r.SESSION.decode(msgpack.packb(v2, use_bin_type=True))
    assert read == _session_info(address="192.0.2.7:50123", username="alice",
                                 credentials_name="sensors")
    assert read.stamp == 0
    response = ["ser", 1, "c", "q", True, True, v2, ""]
    old = r.SESSION_EVENT_RESPONSE.decode(msgpack.packb(response, use_bin_type=True))
    assert (old.session.stamp, old.stamp) == (0, 0)
    new = r.SessionEventResponse("c", "q", True, False, info, "", 7)
    obj = msgpack.unpackb(r.SESSION_EVENT_RESPONSE.encode(new), raw=False)
    assert obj[:2] == ["ser", 2] and obj[-1] == 7
    assert r.SESSION_EVENT_RESPONSE.decode(r.SESSION_EVENT_RESPONSE.encode(new)) == new
    with pytest.raises(RecordEncodingError):
        r.SESSION.encode(_session_info(stamp=-1))


def test_a_session_record_of_version_1_is_still_read():
    """What an older node wrote (on tbmq.client.session, or nested in a
    session event response): the twelve fields of version 1, read with
    nobody known."""
    info = _session_info(address="192.0.2.7:50123", username="alice",
                         credentials_name="sensors")
    v1 = ["ses", 1, *msgpack.unpackb(r.SESSION.encode(info), raw=False)[2:14]]
    read = r.SESSION.decode(msgpack.packb(v1, use_bin_type=True))
    assert read == _session_info()
    assert (read.address, read.username, read.credentials_name) == (None, None, None)
    response = ["ser", 1, "c", "q", True, True, v1, ""]
    assert r.SESSION_EVENT_RESPONSE.decode(msgpack.packb(response, use_bin_type=True)) \
        .session == _session_info()
    # a version 1 array of version 2's length is no record, nor version 2 of 12 fields
    for bad in (["ses", 1, *v1[2:], "a", "b", "c"], ["ses", 2, *v1[2:]],
                ["ses", 3, *v1[2:], "a", "b", "c"]):
        with pytest.raises(RecordEncodingError, match="expected"):
            r.SESSION.decode(msgpack.packb(bad, use_bin_type=True))


def test_the_message_array_is_the_documented_layout():
    m = Message("a/b", b"hi", 1, True, {Property.CONTENT_TYPE: "text/plain"}, "pub", 12.5, 99.0)
    obj = msgpack.unpackb(r.MESSAGE.encode(m), raw=False)
    assert obj[:2] == ["msg", 1]
    assert obj[2:5] == ["a/b", b"hi", 1] and obj[5] is True
    assert isinstance(obj[6], bytes)
    assert obj[7:] == ["pub", 12.5, 99.0]
    # no properties: nil, not an empty bin
    assert msgpack.unpackb(r.MESSAGE.encode(Message("t", b"")), raw=False)[6] is None


@pytest.mark.parametrize("codec,value", [
    (r.MESSAGE, r.Delivery("c", Message("t", b""), 0)),
    (r.MESSAGE, Message("t", "not bytes")),
    (r.MESSAGE, Message(b"t", b"")),
    (r.MESSAGE, Message("t", b"", qos=3)),
    (r.MESSAGE, Message("t", b"", retain=1)),
    (r.MESSAGE, Message("t", b"", properties={0x7F: 1})),
    (r.MESSAGE, Message("t", b"", received_at="now")),
    (r.MESSAGE, Message("\ud800", b"")),
    (r.DELIVERY, r.Delivery("c", "not a message", 0)),
    (r.SESSION, r.SessionInfo("c", "n", "s", True, False, "PRINTER", 0, 4, None, None, 0.0)),
    (r.SESSION, _session_info(address=("192.0.2.7", 1883))),
    (r.SESSION, _session_info(username=b"alice")),
    (r.SESSION, _session_info(credentials_name=7)),
    (r.SUBSCRIPTIONS, r.SubscriptionsRecord("c", {"a": 1})),
    (r.SESSION_EVENT, r.SessionEvent("CONNECT", "c", "n", "s", "q")),
    (r.DISCONNECT, r.DisconnectCommand("c", "s", 256)),
    (r.NODE, r.NodeInfo("n", 0.0, 0.0, False, "a=b")),
    (r.NODE, r.NodeInfo("n", 0.0, 0.0, "no")),
    (r.BYTES, "text"),
    (r.MESSAGE, None),
    (r.DELIVERY, None),
    (r.SESSION_EVENT, None),
    (r.BYTES, None),
])
def test_values_that_do_not_fit_raise_record_encoding_error(codec, value):
    with pytest.raises(RecordEncodingError):
        codec.encode(value)


@pytest.mark.parametrize("codec", [r.RETAINED, r.SESSION, r.SUBSCRIPTIONS])
def test_tombstones_where_the_topic_allows_them(codec):
    assert codec.encode(None) is None
    assert codec.decode(None) is None


@pytest.mark.parametrize("codec", [r.MESSAGE, r.DELIVERY, r.SESSION_EVENT, r.BYTES])
def test_no_tombstone_elsewhere(codec):
    with pytest.raises(RecordEncodingError):
        codec.decode(None)


def test_record_defaults():
    rec = r.Record("tbmq.msg.all", "a/b", Message("a/b", b""))
    assert (rec.headers, rec.partition, rec.offset) == ((), 0, -1)
    assert not hasattr(rec, "__dict__")  # slotted
