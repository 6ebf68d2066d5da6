"""The hot paths of the bus record encodings (tbmq/cluster/records.py,
``RecordCodec(fast=...)``) accept, refuse and produce exactly what the
field by field checks do, and the packer a thread keeps packs what
``msgpack.packb`` packs."""

from __future__ import annotations

import dataclasses
import threading

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tbmq.cluster import record_codec, record_fields
from tbmq.cluster import records as r
from tbmq.errors import RecordEncodingError
from tbmq.model import ClientType, Message
from tbmq.mqtt.constants import Property

from .test_records import deliveries, events, markers, messages, responses, runs, sessions

FAST = [(r.MESSAGE, messages), (r.DELIVERY, deliveries), (r.DELIVERY_RUN, runs), (r.MARKER, markers),
        (r.SESSION, sessions), (r.SESSION_EVENT, events), (r.SESSION_EVENT_RESPONSE, responses)]
FAST_IDS = [codec.name for codec, _ in FAST]


def field_by_field(codec: r.RecordCodec) -> r.RecordCodec:
    """``codec`` without its hot path (what it was before it had one)."""
    return r.RecordCodec(codec.name, codec.cls, codec.tag, codec._write, codec._readers,
                         codec.tombstone, codec.version)


def typed(value):
    """``value`` with the exact type of each of its parts (``1 == 1.0 ==
    True``, but a record read with an int time is not the same record)."""
    if dataclasses.is_dataclass(value):  # (not Message.wire: no part of the value)
        return type(value), tuple(typed(getattr(value, f.name))
                                  for f in dataclasses.fields(value) if f.compare)
    if isinstance(value, (list, tuple)):
        return type(value), tuple(typed(v) for v in value)
    if isinstance(value, dict):
        return type(value), tuple((typed(k), typed(v)) for k, v in value.items())
    return type(value), value


def outcome(f, *args):
    """:returns: ``("ok", typed(result))`` or ``("error", None)`` for a
        RecordEncodingError (any other exception propagates)."""
    try:
        return "ok", typed(f(*args))
    except RecordEncodingError:
        return "error", None


#: values of every msgpack kind, the near misses of each field's type
#: among them: a bool for an int, an int for a float or a bool, a float
#: that is whole, an out of range QoS, a nested array of the wrong tag
ODD_WIRE = [True, False, 0, 1, 2, 3, -1, 2**63, 12.0, 0.5, "", "x", "DEVICE", "APPLICATION",
            "CONNECTION_REQUEST", "msg", b"", b"\x00", None, [], [1, "x"], {}, {"a": [0]},
            ["msg", 1, "t", b"", 0, False, None, "", 0.0, None], ["will", 1, "t", b"", 0, False,
                                                                   None]]
#: the same for an object's fields before encoding (a tuple, an IntEnum,
#: a bytearray, a str enum, a dict of properties...)
ODD_VALUES = ODD_WIRE[:-2] + [(), (1, 2), (True,), [3], bytearray(b"x"), ClientType.DEVICE,
                              Property.CONTENT_TYPE, {Property.CONTENT_TYPE: "a"},
                              {Property.CONTENT_TYPE: 1}, Message("t", b""),
                              r.WillRecord("t", b"", 0, False, {}), "\ud800"]


def mutate(array, path, value):
    """``array`` (nested lists) with the item at ``path`` replaced."""
    array = list(array)
    if len(path) == 1:
        array[path[0]] = value
    else:
        array[path[0]] = mutate(array[path[0]], path[1:], value)
    return array


def paths(array, prefix=()):
    """Every index path into ``array`` and its nested arrays."""
    for i, item in enumerate(array):
        yield prefix + (i,)
        if isinstance(item, (list, tuple)) and item and isinstance(item[0], str):
            yield from paths(item, prefix + (i,))


@pytest.mark.parametrize("codec,values", FAST, ids=FAST_IDS)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_a_decoded_array_with_one_odd_field_reads_as_the_field_checks_read_it(codec, values,
                                                                             data):
    """Every item of the array (nested ones included) replaced by every
    odd value in turn."""
    slow = field_by_field(codec)
    array = msgpack.unpackb(codec.encode(data.draw(values)), raw=False)
    for path in paths(array):
        for odd in ODD_WIRE:
            raw = msgpack.packb(mutate(array, path, odd), use_bin_type=True)
            assert outcome(codec.decode, raw) == outcome(slow.decode, raw), (path, odd)


def replaced(value, name: str, odd):
    """``value`` with its field ``name`` set to ``odd`` (no checks: a
    record is checked when it is encoded)."""
    value = dataclasses.replace(value)
    object.__setattr__(value, name, odd)
    return value


@pytest.mark.parametrize("codec,values", FAST, ids=FAST_IDS)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_a_value_with_one_odd_field_encodes_as_the_field_checks_encode_it(codec, values, data):
    """Every field (a delivery's message's too) set to every odd value in
    turn."""
    slow = field_by_field(codec)
    value = data.draw(values)
    odd_values = [replaced(value, f.name, odd) for f in dataclasses.fields(value) if f.init
                  for odd in ODD_VALUES]
    if isinstance(value, r.Delivery):
        odd_values += [replaced(value, "message", replaced(value.message, f.name, odd))
                       for f in dataclasses.fields(Message) if f.init for odd in ODD_VALUES]
    for odd in odd_values:
        fast = outcome(codec.encode, odd)
        assert fast == outcome(slow.encode, odd), odd
        if fast[0] == "ok":
            data = fast[1][1]
            assert outcome(codec.decode, data) == outcome(slow.decode, data), odd


@pytest.mark.parametrize("codec,values", FAST, ids=FAST_IDS)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_the_hot_path_writes_the_bytes_of_the_field_checks(codec, values, data):
    value = data.draw(values)
    assert codec.encode(value) == field_by_field(codec).encode(value) == msgpack.packb(
        codec.to_list(value), use_bin_type=True)


def test_a_subclass_instance_takes_the_field_checks():
    class Mine(Message):
        __slots__ = ()

    value = Mine("t", b"x", 1, False, {}, "p", 1.0, None)
    assert r.MESSAGE.decode(r.MESSAGE.encode(value)) == Message("t", b"x", 1, False, {}, "p",
                                                                1.0, None)


def test_whole_floats_and_bytes_like_fields_are_still_converted():
    """What the field checks convert (an int time, a bytearray payload, a
    list of subscription ids) is written as before: the hot path leaves it
    to them."""
    odd = r.Delivery("c", Message("t", bytearray(b"x"), 1, False, {}, "p", 3, 4), 1, False, [7])
    plain = r.Delivery("c", Message("t", b"x", 1, False, {}, "p", 3.0, 4.0), 1, False, (7,))
    assert r.DELIVERY.encode(odd) == r.DELIVERY.encode(plain)
    wire = ["dlv", 1, "c", ["msg", 1, "t", b"x", 1, False, None, "p", 3, 4], 1, False, [7], 0]
    read = r.DELIVERY.decode(msgpack.packb(wire, use_bin_type=True))
    assert read == plain and type(read.message.received_at) is float


def test_a_failed_encoding_leaves_the_packer_of_the_thread_clean():
    good = Message("t", b"x", 1, False, {}, "p", 1.0, None)
    with pytest.raises(RecordEncodingError, match="cannot encode"):
        r.MESSAGE.encode(Message("t", b"x" * 100, 1, False, {}, "\ud800", 1.0, None))
    assert r.MESSAGE.encode(good) == msgpack.packb(r.MESSAGE.to_list(good), use_bin_type=True)


def test_a_thread_keeps_its_own_packer_and_none_for_a_large_value():
    good = Message("t", b"x", 1, False, {}, "p", 1.0, None)
    expected = r.MESSAGE.encode(good)
    mine = record_codec._packers.packer
    seen = []

    def other():
        seen.append(r.MESSAGE.encode(good))
        seen.append(record_codec._packers.packer)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen[0] == expected and seen[1] is not mine
    big = Message("t", bytes(record_codec._PACKER_KEPT_BELOW), 1, False, {}, "p", 1.0, None)
    assert r.MESSAGE.decode(r.MESSAGE.encode(big)) == big
    assert not hasattr(record_codec._packers, "packer")  # its grown buffer let go
    assert r.MESSAGE.encode(good) == expected


def test_decoding_gives_arrays_as_tuples_and_accepts_lists_nested_by_hand():
    d = r.Delivery("c", Message("t", b"x", 2, True, {Property.CONTENT_TYPE: "a"}, "p", 1.0,
                                None), 2, False, (3, 4), 9)
    read = r.DELIVERY.decode(r.DELIVERY.encode(d))
    assert read == d and read.subscription_ids == (3, 4)
    assert r.DELIVERY.from_list(r.DELIVERY.to_list(d)) == d
    assert r.DELIVERY.from_list(list(msgpack.unpackb(r.DELIVERY.encode(d), raw=False))) == d


def one_by_one(f, values):
    """``[f(value) for value in values]`` as :func:`outcome` gives it."""
    return outcome(lambda: [f(value) for value in values])


@pytest.mark.parametrize("codec,values", FAST, ids=FAST_IDS)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_encode_many_gives_what_encode_gives_each_value(codec, values, data):
    """The batch encoding (``KafkaBus.publish_many``) writes the bytes
    ``encode`` writes for every value, and refuses a batch exactly when
    ``encode`` refuses one of its values (odd fields included)."""
    value = data.draw(values)
    odd_values = [replaced(value, f.name, odd) for f in dataclasses.fields(value)
                  for odd in ODD_VALUES]
    batch = [value, data.draw(values), value]
    assert codec.encode_many(batch) == [codec.encode(v) for v in batch]
    for odd in odd_values:
        assert outcome(codec.encode_many, [value, odd]) == one_by_one(codec.encode, [value, odd])
    assert codec.encode_many([]) == []


@pytest.mark.parametrize("codec,values", FAST, ids=FAST_IDS)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_decode_arrays_reads_each_array_as_decode_reads_its_bytes(codec, values, data):
    """A packed record's arrays (one unpacking for all) read as each
    value's own bytes would, odd fields and tombstones included: the same
    records, or an error for the batch when one of them is refused."""
    array = msgpack.unpackb(codec.encode(data.draw(values)), raw=False)
    good = msgpack.unpackb(msgpack.packb(array, use_bin_type=True), use_list=False)
    assert codec.decode_arrays((good, good)) == [codec.decode(msgpack.packb(good))] * 2
    for path in list(paths(array))[:6]:
        for odd in ODD_WIRE:
            raw = msgpack.packb(mutate(array, path, odd), use_bin_type=True)
            obj = msgpack.unpackb(raw, raw=False, use_list=False, strict_map_key=False)
            assert outcome(codec.decode_arrays, (good, obj)) == \
                one_by_one(codec.decode, [msgpack.packb(good), raw]), (path, odd)
    assert outcome(codec.decode_arrays, (None,)) == one_by_one(codec.decode, [None])


@pytest.mark.parametrize("codec", [r.DELIVERY, r.DOWNLINK, r.PERSISTED],
                         ids=["Delivery", "Downlink", "Persisted"])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_one_clients_deliveries_are_encoded_together_as_each_alone(codec, data):
    """A batch's deliveries to one client (the router's: the same client id,
    QoS, RETAIN, identifiers and seq objects) are written together
    (``write_many``: what they share packed once) into the bytes
    ``encode`` gives each; a delivery that shares less, or an odd field
    anywhere, leaves each to be written alone: the same bytes, or the same
    refusal."""
    first = data.draw(deliveries)
    shared = {f: getattr(first, f) for f in ("client_id", "qos", "retain",
                                             "subscription_ids", "seq")}
    batch = [first] + [r.Delivery(message=m, **shared)
                       for m in data.draw(st.lists(messages, min_size=2, max_size=6))]
    together = []

    def spy(ds, pack):
        together.append(r._deliveries_packed(ds, pack))
        return together[-1]

    fresh = [dataclasses.replace(d, message=dataclasses.replace(d.message)) for d in batch]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(r.DELIVERY, "_write_many", spy)
        if codec is not r.DELIVERY:  # a union keeps its members' at its making
            patch.setattr(codec, "_many", {r.Delivery: spy})
        assert codec.encode_many(batch) == [codec.encode(d) for d in fresh]
    assert together and together[0] is not None  # written together
    at = data.draw(st.integers(0, len(batch) - 1))
    for name in ("qos", "retain", "seq", "message"):
        for odd in ODD_VALUES:
            odd_batch = list(batch)
            odd_batch[at] = replaced(batch[at], name, odd)
            assert outcome(codec.encode_many, odd_batch) == one_by_one(codec.encode, odd_batch)
    other = list(batch)
    other[at] = replaced(batch[at], "client_id", batch[at].client_id + "x")
    assert codec.encode_many(other) == [codec.encode(d) for d in other]


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_fresh_messages_are_encoded_together_as_each_alone(data):
    """Messages never written before and without properties (a run of a
    publisher's, queued for a DEVICE) are written together, column by
    column (``write_many``), into the bytes ``encode`` gives each; one with
    properties, written before, or with an odd field anywhere leaves each
    to be written alone: the same bytes, or the same refusal."""
    from tbmq.cluster.message_arrays import messages_packed
    pack = record_codec._thread_packer().pack
    batch = [dataclasses.replace(m, properties={})
             for m in data.draw(st.lists(messages, min_size=3, max_size=6))]
    fresh = [dataclasses.replace(m) for m in batch]
    together = messages_packed(batch, pack)
    assert together is not None and together == [r.MESSAGE.encode(m) for m in fresh]
    assert r.MESSAGE.encode_many(batch) == together
    at = data.draw(st.integers(0, len(batch) - 1))
    for name in ("topic", "payload", "qos", "retain", "publisher", "received_at", "expires_at"):
        for odd in ODD_VALUES:
            odd_batch = list(batch)
            odd_batch[at] = replaced(batch[at], name, odd)
            assert outcome(r.MESSAGE.encode_many, odd_batch) == \
                one_by_one(r.MESSAGE.encode, odd_batch)
    with_props = list(batch)
    with_props[at] = dataclasses.replace(batch[at], properties={Property.CONTENT_TYPE: "a"})
    assert messages_packed(with_props, pack) is None
    assert r.MESSAGE.encode_many(with_props) == [r.MESSAGE.encode(m) for m in with_props]


def test_deliveries_share_only_the_very_same_fields():
    """Equal is not the same: a QoS ``True`` beside ``1`` (equal, another
    type) leaves each delivery to be written alone, which refuses it."""
    m = Message("t", b"x")
    batch = [r.Delivery("c", m, 1), r.Delivery("c", m, 1), r.Delivery("c", m, True)]
    assert r._deliveries_packed(batch, record_codec._thread_packer().pack) is None
    with pytest.raises(RecordEncodingError):
        r.DELIVERY.encode_many(batch)
    ok = batch[:2] + [r.Delivery("c", m, 1)]
    assert r._deliveries_packed(ok, record_codec._thread_packer().pack) == \
        [r.DELIVERY.encode(d) for d in ok]


def test_encode_many_lets_a_grown_packer_go():
    """A batch with a value past the kept size leaves the thread without
    its packer (the next one starts with a small buffer), as ``encode``."""
    big = Message("t", b"x" * record_codec._PACKER_KEPT_BELOW)
    r.MESSAGE.encode_many([Message("t", b"")])
    assert hasattr(record_codec._packers, "packer")
    assert r.MESSAGE.encode_many([big]) == [r.MESSAGE.encode(big)]
    r.MESSAGE.encode_many([big])
    assert not hasattr(record_codec._packers, "packer")


# -- a message read from the bus is written again as it came (Message.wire) ------------

WIRED = Message("t/x", b"payload", 1, True, {Property.CONTENT_TYPE: "text/plain",
                                            Property.USER_PROPERTY: [("k", "v")]},
                "pub", 1.5, 9.5)


def test_a_routing_node_writes_the_message_array_of_the_record_it_read(monkeypatch):
    """The ``msg`` bytes of ``tbmq.msg.all`` are in the downlink delivery as
    they are: the fields are not checked nor the properties packed again."""
    record = r.MESSAGE.encode(WIRED)
    read = r.MESSAGE.decode(record)
    assert read == WIRED and read.wire == msgpack.unpackb(record, raw=False, use_list=False)

    def no_packing(props):
        raise AssertionError("the properties were packed again")

    monkeypatch.setattr(record_fields, "pack_properties", no_packing)
    delivery = r.DELIVERY.encode(r.Delivery("c", read, 1, False, (4,), 0))
    assert record in delivery  # the very bytes, nested in the delivery's array
    monkeypatch.undo()
    assert delivery == r.DELIVERY.encode(r.Delivery("c", WIRED, 1, False, (4,), 0))
    again = r.DELIVERY.decode(delivery)
    assert again.message == WIRED and r.MESSAGE.encode(again.message) == record


def test_a_message_written_once_keeps_its_array_for_the_next_writes(monkeypatch):
    """The node that publishes a message and routes it (the Kafka bus's own
    records: the routing node gets the message as published, not read
    back) writes the same ``msg`` array into its deliveries: the fields are
    not checked nor the properties packed a second time."""
    published = Message("t/x", b"payload", 1, True, {Property.CONTENT_TYPE: "text/plain"},
                        "pub", 1.5, 9.5)
    record = r.MESSAGE.encode(published)
    assert published.wire == msgpack.unpackb(record, raw=False, use_list=False)

    def no_packing(props):
        raise AssertionError("the properties were packed again")

    monkeypatch.setattr(record_fields, "pack_properties", no_packing)
    delivery = r.DELIVERY.encode(r.Delivery("c", published, 1, False, (4,), 0))
    assert record in delivery
    monkeypatch.undo()
    assert r.DELIVERY.decode(delivery).message == published
    assert dataclasses.replace(published, retain=False).wire is None  # a changed copy


def test_the_array_of_a_packed_record_is_kept_too():
    """``decode_arrays`` (a packed record's values, one unpacking) keeps
    each message's array."""
    arrays = msgpack.unpackb(msgpack.packb([r.MESSAGE.to_list(WIRED)] * 2, use_bin_type=True),
                             raw=False, use_list=False)
    read = r.MESSAGE.decode_arrays(arrays)
    assert [m.wire for m in read] == list(arrays) and read[0] == WIRED


def test_a_message_read_from_arrays_has_every_field_its_constructor_sets():
    """The hot reader makes a message field by field (no ``__init__``):
    every slot of :class:`Message` is set, to what the constructor sets,
    on a packed record's messages and on a run's, so a field added to
    :class:`Message` and not to the reader fails here."""
    made = Message("t/x", b"p", 1, True, {Property.CONTENT_TYPE: "a"}, "pub", 1.5, None)
    arrays = msgpack.unpackb(msgpack.packb([r.MESSAGE.to_list(made), r.MESSAGE.to_list(WIRED)],
                                           use_bin_type=True), raw=False, use_list=False)
    run = msgpack.unpackb(r.DELIVERY_RUN.encode(r.DeliveryRun("c", (made, WIRED), 1, False, ())),
                          raw=False, use_list=False)
    for read, expected in [*zip(r.MESSAGE.decode_arrays(arrays), (made, WIRED)),
                           *zip(r.DELIVERY_RUN.decode_arrays((run,))[0].messages, (made, WIRED))]:
        for name in Message.__slots__:
            if name != "wire":
                assert typed(getattr(read, name)) == typed(getattr(expected, name)), name
        assert type(read.wire) is tuple and r.MESSAGE.from_list(read.wire) == expected
    assert set(Message.__slots__) == {f.name for f in dataclasses.fields(Message)}


def test_a_changed_or_hand_made_message_is_encoded_from_its_fields():
    """:func:`dataclasses.replace` gives a message without the array; one
    made from lists (not as msgpack reads) has none either."""
    read = r.MESSAGE.decode(r.MESSAGE.encode(WIRED))
    changed = dataclasses.replace(read, topic="t/y")
    assert changed.wire is None
    assert r.MESSAGE.decode(r.MESSAGE.encode(changed)).topic == "t/y"
    assert r.MESSAGE.from_list(list(r.MESSAGE.to_list(WIRED))).wire is None
    assert Message("t", b"").wire is None and "wire" not in repr(read)


@pytest.mark.parametrize("union,values", [(r.DOWNLINK, deliveries | runs),
                                          (r.PERSISTED, deliveries | markers)],
                         ids=["Downlink", "Persisted"])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_a_union_encodes_and_reads_many_as_it_does_each(union, values, data):
    """A union's ``encode_many`` and ``decode_arrays`` (the hot paths of
    its members) give what ``encode`` and ``decode`` give each value."""
    batch = data.draw(st.lists(values, min_size=1, max_size=5))
    encoded = union.encode_many(batch)
    assert encoded == [union.encode(v) for v in batch]
    arrays = [msgpack.unpackb(b, raw=False, use_list=False) for b in encoded]
    assert [typed(v) for v in union.decode_arrays(arrays)] == [
        typed(union.decode(b)) for b in encoded]
    with pytest.raises(RecordEncodingError):
        union.encode_many(batch + [Message("t", b"")])


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_published_messages_carry_the_array_encode_would_make(data):
    """A run of PUBLISHes made into messages with their arrays
    (``published_messages``) encodes, alone and together, into the bytes
    the same messages made without an array give; a field of another type
    anywhere leaves every message without one (written as any message)."""
    from tbmq.cluster.message_arrays import messages_packed, published_messages
    pack = record_codec._thread_packer().pack
    drawn = data.draw(st.lists(messages, min_size=1, max_size=6))
    topics = [m.topic for m in drawn]
    payloads = [m.payload for m in drawn]
    qoss = [m.qos for m in drawn]
    retains = [m.retain for m in drawn]
    made = published_messages(topics, payloads, qoss, retains, "pub", 12.5)
    plain = [Message(t, p, q, x, {}, "pub", 12.5, None)
             for t, p, q, x in zip(topics, payloads, qoss, retains)]
    assert made == plain and all(m.wire is not None for m in made)
    assert [r.MESSAGE.encode(m) for m in made] == [r.MESSAGE.encode(m) for m in plain]
    # (fewer than three are each packed by their arrays: None)
    assert messages_packed(made, pack) == ([r.MESSAGE.encode(m) for m in plain]
                                           if len(made) > 2 else None)
    assert r.MESSAGE.encode_many(made) == [r.MESSAGE.encode(m) for m in plain]
    mixed = made[:1] + [dataclasses.replace(m) for m in made[1:]]
    assert len(mixed) == 1 or messages_packed(mixed, pack) is None
    odd = published_messages(topics, payloads, [*qoss[:-1], True], retains, "pub", 12.5)
    assert all(m.wire is None for m in odd)
    assert all(m.wire is None for m in published_messages(topics, payloads, qoss, retains, "pub", 12))


@settings(max_examples=60, deadline=None)
@given(topic=st.text(max_size=300), qos=st.integers(0, 2), retain=st.booleans(),
       size=st.sampled_from([0, 1, 31, 32, 255, 256, 65535, 65536]), count=st.integers(1, 6),
       publisher=st.text(max_size=40), at=st.floats(allow_nan=False), data=st.data())
def test_a_published_run_of_one_shape_is_packed_from_one_template(topic, qos, retain, size,
                                                                  count, publisher, at, data):
    """A run of one topic, QoS, RETAIN flag and payload size shares one
    template (``published_messages``): the bytes around its payload that
    give each message's the bytes msgpack gives its array, what
    ``messages_packed`` and the codec's ``encode`` write for it; a run of
    two or fewer, or one whose payload sizes differ, has none (packed by
    its arrays)."""
    from tbmq.cluster.message_arrays import (
        messages_packed, published_messages, templated, templated_stream,
    )
    pack = record_codec._thread_packer().pack
    payloads = [data.draw(st.binary(min_size=size, max_size=size)) if size < 300
                else bytes([data.draw(st.integers(0, 255))]) * size for _ in range(count)]
    made = published_messages([topic] * count, payloads, [qos] * count, [retain] * count,
                              publisher, at)
    encoded = [r.MESSAGE.encode(Message(topic, p, qos, retain, {}, publisher, at)) for p in payloads]
    if count > 2:
        assert all(m.template is made[0].template is not None for m in made)
        assert templated(made) == [pack(m.wire) for m in made] == encoded
        assert templated_stream(made) == b"".join(encoded)
        assert messages_packed(made, pack) == encoded
    else:
        assert all(m.template is None for m in made) and templated(made) is None
        assert templated_stream(made) is None
    assert r.MESSAGE.encode_many(made) == encoded
    if count > 2:
        grown = published_messages([topic] * count, [*payloads[:-1], payloads[-1] + b"x"],
                                   [qos] * count, [retain] * count, publisher, at)
        assert all(m.template is None for m in grown) and templated(grown) is None
        assert messages_packed(grown, pack) == [pack(m.wire) for m in grown]
        other = published_messages([topic + "x"] * count, payloads, [qos] * count,
                                   [retain] * count, publisher, at)
        assert templated([*made[:-1], other[-1]]) is None  # two templates
        assert templated_stream([*made[:-1], other[-1]]) is None


@settings(max_examples=40, deadline=None)
@given(data=st.data(), client_id=st.text(max_size=40), qos=st.integers(0, 2),
       retain=st.booleans(), ids=st.lists(st.integers(1, 268435455), max_size=3),
       count=st.sampled_from([1, 2, 3, 15, 16, 17, 65535, 65536]))
def test_a_run_of_published_messages_is_written_around_their_bytes(data, client_id, qos, retain,
                                                                  ids, count):
    """A :class:`DeliveryRun` whose messages each carry their bytes (a
    published run's) encodes, alone and in a batch, into the bytes its
    array gives (the run's fields and the array header of any length around
    them); one message without its bytes sends the run by its arrays."""
    from tbmq.cluster.message_arrays import published_messages
    size = data.draw(st.integers(0, 40))
    made = published_messages(["t/x"] * count, [bytes([i % 256]) * size for i in range(count)],
                              [1] * count, [False] * count, "pub", 1.5)
    assert count < 3 or all(m.template is not None for m in made)
    run = r.DeliveryRun(client_id, tuple(made), qos, retain, tuple(ids))
    alone = r.DELIVERY_RUN.encode(run)
    assert msgpack.unpackb(alone, raw=False, use_list=False)[3][0] == made[0].wire
    for codec in (r.DELIVERY_RUN, r.APPLICATION, r.DOWNLINK):
        assert codec.encode_many([run]) == [alone]
        assert codec.encode_many([run, run]) == [alone, alone]
    plain = [dataclasses.replace(m) for m in made]
    mixed = r.DeliveryRun(client_id, (made[0], *plain[1:]), qos, retain, tuple(ids))
    assert r.DELIVERY_RUN.encode_many([mixed]) == [alone]
    assert r.DELIVERY_RUN.encode_many([run, mixed]) == [alone, alone]
