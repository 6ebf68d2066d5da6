"""Tests for tbmq.mqtt: codec round trips, stream splitting, fuzzing, spec
vectors and validation errors."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tbmq.mqtt import (
    Auth,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    MalformedPacket,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
    encode_publish,
    pack_properties,
    publish_packet_id_offset,
    unpack_properties,
)
from tbmq.mqtt.codec import MalformedPacket as CodecMalformedPacket
from tbmq.mqtt.decoder import dispatch_table
from tbmq.mqtt.constants import (
    PACKET_PROPERTIES,
    PROPERTY_TYPES,
    REASON_CODES,
    WILL_PROPERTIES,
    PacketType,
    Property,
    PropertyType,
)
from tbmq.mqtt.properties import decode_properties, decode_variable_byte_integer, encode_properties

LEVELS = (3, 4, 5)
NAMES = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}
ALLOWED_ERRORS = (0x81, 0x82, 0x95)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------

text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
binary = st.binary(max_size=24)
packet_ids = st.integers(1, 0xFFFF)
qos = st.integers(0, 2)

_BOOLEAN = {
    Property.PAYLOAD_FORMAT_INDICATOR,
    Property.REQUEST_PROBLEM_INFORMATION,
    Property.REQUEST_RESPONSE_INFORMATION,
    Property.MAXIMUM_QOS,
    Property.RETAIN_AVAILABLE,
    Property.WILDCARD_SUBSCRIPTION_AVAILABLE,
    Property.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
    Property.SHARED_SUBSCRIPTION_AVAILABLE,
}


def property_value(prop: Property, packet_type) -> st.SearchStrategy:
    """A valid value for ``prop`` in ``packet_type``."""
    ptype = PROPERTY_TYPES[prop]
    if prop is Property.SUBSCRIPTION_IDENTIFIER:
        size = 1 if packet_type == PacketType.SUBSCRIBE else 3
        return st.lists(st.integers(1, 268_435_455), min_size=1, max_size=size)
    if prop is Property.USER_PROPERTY:
        return st.lists(st.tuples(text, text), min_size=1, max_size=3)
    if prop in _BOOLEAN:
        return st.integers(0, 1)
    low = 1 if prop in (Property.RECEIVE_MAXIMUM, Property.MAXIMUM_PACKET_SIZE) else 0
    return {
        PropertyType.BYTE: st.integers(0, 255),
        PropertyType.TWO_BYTE_INT: st.integers(low, 0xFFFF),
        PropertyType.FOUR_BYTE_INT: st.integers(low, 0xFFFFFFFF),
        PropertyType.UTF8_STRING: text,
        PropertyType.BINARY_DATA: binary,
    }[ptype]


@cache
def properties(packet_type, exclude=()) -> st.SearchStrategy:
    """A valid properties dict for ``packet_type`` (None: any property)."""
    allowed = PROPERTY_TYPES if packet_type is None else PACKET_PROPERTIES[packet_type]
    optional = {p: property_value(p, packet_type) for p in sorted(allowed) if p not in exclude}
    return st.fixed_dictionaries({}, optional=optional).filter(
        lambda d: Property.AUTHENTICATION_DATA not in d or Property.AUTHENTICATION_METHOD in d
    )


@cache
def props_for(level: int, packet_type, exclude=()) -> st.SearchStrategy:
    return properties(packet_type, exclude) if level == 5 else st.just({})


def reason(level: int, packet_type) -> st.SearchStrategy:
    return st.sampled_from(sorted(REASON_CODES[packet_type])) if level == 5 else st.just(0)


@cache
def wills(level: int) -> st.SearchStrategy:
    return st.builds(Will, text, binary, qos, st.booleans(), props_for(level, WILL_PROPERTIES))


@st.composite
def _connects(draw, level: int) -> Connect:
    username = draw(st.none() | text)
    if level == 5 or username is not None:
        password = draw(st.none() | binary)
    else:
        password = None  # [MQTT-3.1.2-22]
    return Connect(
        protocol_name=NAMES[level],
        protocol_level=level,
        clean_start=draw(st.booleans()),
        keep_alive=draw(st.integers(0, 0xFFFF)),
        client_id=draw(text),
        will=draw(st.none() | wills(level)),
        username=username,
        password=password,
        properties=draw(props_for(level, PacketType.CONNECT)),
    )


@cache
def connects(level: int) -> st.SearchStrategy:
    return _connects(level)


@cache
def publishes(level: int, to_server: bool) -> st.SearchStrategy:
    exclude = (Property.SUBSCRIPTION_IDENTIFIER,) if to_server else ()

    @st.composite
    def build(draw):
        q = draw(qos)
        return Publish(
            topic=draw(text),
            payload=draw(st.binary(max_size=64)),
            qos=q,
            retain=draw(st.booleans()),
            dup=draw(st.booleans()) if q else False,
            packet_id=draw(packet_ids) if q else None,
            properties=draw(props_for(level, PacketType.PUBLISH, exclude)),
        )

    return build()


@cache
def acks(level: int) -> st.SearchStrategy:
    return st.one_of(
        *(
            st.builds(cls, packet_ids, reason(level, ptype), props_for(level, ptype))
            for cls, ptype in (
                (Puback, PacketType.PUBACK),
                (Pubrec, PacketType.PUBREC),
                (Pubrel, PacketType.PUBREL),
                (Pubcomp, PacketType.PUBCOMP),
            )
        )
    )


@cache
def subscription_requests(level: int) -> st.SearchStrategy:
    if level == 5:
        return st.builds(SubscriptionRequest, text, qos, st.booleans(), st.booleans(), st.integers(0, 2))
    return st.builds(SubscriptionRequest, text, qos)


@cache
def subscribes(level: int) -> st.SearchStrategy:
    return st.builds(
        Subscribe,
        packet_ids,
        st.lists(subscription_requests(level), min_size=1, max_size=4),
        props_for(level, PacketType.SUBSCRIBE),
    )


@cache
def unsubscribes(level: int) -> st.SearchStrategy:
    return st.builds(
        Unsubscribe, packet_ids, st.lists(text, min_size=1, max_size=4), props_for(level, PacketType.UNSUBSCRIBE)
    )


@cache
def connacks(level: int) -> st.SearchStrategy:
    codes = st.sampled_from(sorted(REASON_CODES[PacketType.CONNACK])) if level == 5 else st.integers(0, 5)
    session_present = st.just(False) if level == 3 else st.booleans()
    return st.builds(Connack, session_present, codes, props_for(level, PacketType.CONNACK))


@cache
def subacks(level: int) -> st.SearchStrategy:
    codes = sorted(REASON_CODES[PacketType.SUBACK]) if level == 5 else [0, 1, 2, 0x80]
    return st.builds(
        Suback,
        packet_ids,
        st.lists(st.sampled_from(codes), min_size=1, max_size=4),
        props_for(level, PacketType.SUBACK),
    )


@cache
def unsubacks(level: int) -> st.SearchStrategy:
    if level != 5:
        return st.builds(Unsuback, packet_ids)
    return st.builds(
        Unsuback,
        packet_ids,
        st.lists(st.sampled_from(sorted(REASON_CODES[PacketType.UNSUBACK])), min_size=1, max_size=4),
        properties(PacketType.UNSUBACK),
    )


@cache
def reason_packets(cls, ptype) -> st.SearchStrategy:
    return st.builds(cls, reason(5, ptype), properties(ptype))


@cache
def client_packets(level: int) -> st.SearchStrategy:
    """Packets a client sends after CONNECT."""
    options = [
        publishes(level, to_server=True),
        acks(level),
        subscribes(level),
        unsubscribes(level),
        st.just(Pingreq()),
    ]
    if level == 5:
        options += [reason_packets(Disconnect, PacketType.DISCONNECT), reason_packets(Auth, PacketType.AUTH)]
    else:
        options.append(st.just(Disconnect()))
    return st.one_of(*options)


@cache
def server_packets(level: int) -> st.SearchStrategy:
    """Packets a server sends."""
    options = [
        connacks(level),
        publishes(level, to_server=False),
        acks(level),
        subacks(level),
        unsubacks(level),
        st.just(Pingresp()),
    ]
    if level == 5:
        options += [reason_packets(Disconnect, PacketType.DISCONNECT), reason_packets(Auth, PacketType.AUTH)]
    return st.one_of(*options)


def server_decoder(level: int, **kwargs) -> Decoder:
    decoder = Decoder(**kwargs)
    connect = Connect(protocol_name=NAMES[level], protocol_level=level, client_id="c")
    assert decoder.feed(encode(connect)) == [connect]
    assert decoder.protocol_level == level
    return decoder


def fed_in_pieces(decoder: Decoder, data: bytes, cuts: list[int]) -> list:
    out = []
    start = 0
    for cut in sorted(set(c % (len(data) + 1) for c in cuts)) + [len(data)]:
        out += decoder.feed(data[start:cut])
        start = cut
    return out


# --------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@SETTINGS
@given(data=st.data())
def test_connect_round_trip(level, data):
    packet = data.draw(connects(level))
    decoder = Decoder()
    assert decoder.feed(encode(packet, level)) == [packet]
    assert decoder.protocol_level == level


@pytest.mark.parametrize("level", LEVELS)
@SETTINGS
@given(data=st.data())
def test_client_to_server_round_trip(level, data):
    packet = data.draw(client_packets(level))
    assert server_decoder(level).feed(encode(packet, level)) == [packet]


@pytest.mark.parametrize("level", LEVELS)
@SETTINGS
@given(data=st.data())
def test_server_to_client_round_trip(level, data):
    packet = data.draw(server_packets(level))
    decoder = Decoder(protocol_level=level, server_side=False)
    assert decoder.feed(encode(packet, level)) == [packet]


@pytest.mark.parametrize("level", LEVELS)
@SETTINGS
@given(data=st.data())
def test_encode_publish_matches_encode(level, data):
    packet = data.draw(publishes(level, to_server=False))
    assert encode_publish(packet, level) == encode(packet, level)


@pytest.mark.parametrize("level", LEVELS)
@FEW
@given(data=st.data())
def test_stream_cut_at_random_points(level, data):
    connect = data.draw(connects(level))
    packets = [connect] + data.draw(st.lists(client_packets(level), max_size=12))
    stream = b"".join(encode(p, level) for p in packets)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    assert fed_in_pieces(Decoder(), stream, cuts) == packets
    # byte by byte too
    decoder = Decoder()
    out = []
    for i in range(len(stream)):
        out += decoder.feed(stream[i:i + 1])
    assert out == packets


@pytest.mark.parametrize("level", LEVELS)
@FEW
@given(data=st.data())
def test_client_stream_cut_at_random_points(level, data):
    packets = data.draw(st.lists(server_packets(level), min_size=1, max_size=12))
    stream = b"".join(encode(p, level) for p in packets)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    decoder = Decoder(protocol_level=level, server_side=False)
    assert fed_in_pieces(decoder, stream, cuts) == packets


@SETTINGS
@given(props=properties(None))
def test_pack_unpack_properties(props):
    assert unpack_properties(pack_properties(props)) == props


# --------------------------------------------------------------------------
# Arbitrary input only ever raises MalformedPacket
# --------------------------------------------------------------------------


def feed_garbage(decoder: Decoder, chunks) -> None:
    try:
        for chunk in chunks:
            decoder.feed(chunk)
    except MalformedPacket as exc:
        assert exc.reason_code in ALLOWED_ERRORS
        # a failed decoder stays failed
        with pytest.raises(MalformedPacket):
            decoder.feed(b"\xc0\x00")


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200), server_side=st.booleans(), level=st.sampled_from((None, 3, 4, 5)))
def test_arbitrary_bytes(data, server_side, level):
    feed_garbage(Decoder(protocol_level=level, server_side=server_side), [data])


@settings(max_examples=200, deadline=None)
@given(level=st.sampled_from(LEVELS), chunks=st.lists(st.binary(max_size=60), max_size=5))
def test_arbitrary_bytes_after_connect(level, chunks):
    feed_garbage(server_decoder(level), chunks)


@SETTINGS
@given(
    data=st.data(),
    level=st.sampled_from(LEVELS),
    server_side=st.booleans(),
    mutations=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=3),
)
def test_mutated_packets(data, level, server_side, mutations):
    """Valid encodings with a few bytes overwritten decode or raise
    MalformedPacket, nothing else."""
    if server_side:
        decoder = server_decoder(level)
        packet = data.draw(st.one_of(client_packets(level), connects(level)))
    else:
        decoder = Decoder(protocol_level=level, server_side=False)
        packet = data.draw(server_packets(level))
    raw = bytearray(encode(packet, level))
    for index, value in mutations:
        raw[index % len(raw)] = value
    feed_garbage(decoder, [bytes(raw)])


@SETTINGS
@given(
    data=st.data(),
    level=st.sampled_from(LEVELS),
    server_side=st.booleans(),
    first=st.integers(0, 255),
)
def test_the_dispatch_table_decodes_as_the_checking_path(data, level, server_side, first):
    """A valid packet whose first byte is replaced by any byte decodes, or
    fails with the same reason code and message, through the decoding
    table of its side and level as through ``Decoder._decode``, which
    checks type and flags for each packet."""
    packet = data.draw(client_packets(level) if server_side else server_packets(level))
    raw = bytearray(encode(packet, level))
    raw[0] = first
    length, body = decode_variable_byte_integer(raw, 1, len(raw))
    outcomes = []
    for decode in (dispatch_table(server_side, level)[first], Decoder._decode):
        decoder = (server_decoder(level) if server_side
                   else Decoder(protocol_level=level, server_side=False))
        try:
            outcomes.append(decode(decoder, first, bytes(raw), body, body + length))
        except MalformedPacket as e:
            outcomes.append((e.reason_code, str(e)))
    assert outcomes[0] == outcomes[1]
    if first == raw[0] == encode(packet, level)[0]:
        assert outcomes[0] == packet


def _decoded(decoder: Decoder, chunks: list) -> list:
    """The packets ``chunks`` give one after another, then the reason code
    and message of the error that ends them, if one does."""
    out: list = []
    try:
        for chunk in chunks:
            out += decoder.feed(chunk)
    except MalformedPacket as e:
        out += e.packets
        out.append((e.reason_code, str(e)))
    return out


@SETTINGS
@given(
    level=st.sampled_from(LEVELS),
    runs=st.lists(st.tuples(
        st.sampled_from(("a/b", "a/c", "t")), st.sampled_from((0, 1, 1, 2)), st.booleans(),
        st.booleans(), st.sampled_from((0, 1, 5, 200)), st.booleans(), st.integers(0, 40)),
        min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 100_000), max_size=3),
)
def test_a_run_of_publishes_decodes_as_each_alone(level, runs, cuts):
    """PUBLISHes that repeat one header (decoded together by
    ``Decoder._same_publishes``), a run of them with a property or packet
    identifier 0 among them, read in one piece or cut anywhere, give the
    packets, and the error, that each packet's bytes give when read alone."""
    raw = []
    for topic, qos, retain, dup, size, props, count in runs:
        for n in range(count):
            packet = Publish(topic, b"x" * size, qos, retain and qos > 0, dup and qos > 0,
                             n % 7 + 1 if qos else None,
                             {Property.CONTENT_TYPE: "x"} if props and level == 5 and n % 5 == 3 else {})
            data = encode(packet, level)
            if qos and n % 11 == 10:  # packet identifier 0 [MQTT-2.2.1-3]
                at = 4 + len(topic)
                data = data[:at] + b"\x00\x00" + data[at + 2:]
            raw.append(data)
    stream = b"".join(raw)
    points = sorted(cut % (len(stream) + 1) for cut in cuts)
    chunks = [stream[i:j] for i, j in zip([0, *points], [*points, len(stream)])]
    assert _decoded(server_decoder(level), chunks) == _decoded(server_decoder(level), raw)


def test_the_dispatch_table_sends_valid_bytes_straight_to_their_decoder():
    """After CONNECT, PUBLISH and the acknowledgements skip the checking
    path; before it, and for CONNECT and reserved bytes, everything takes
    it."""
    table = dispatch_table(True, 4)
    assert table[0x30] is table[0x3B] is Decoder._decode_publish
    assert table[0x40] is not Decoder._decode  # PUBACK
    assert table[0x41] is Decoder._decode  # PUBACK with a flag set: refused there
    assert table[0x62] is not Decoder._decode and table[0x60] is Decoder._decode  # PUBREL
    assert dispatch_table(True, 3)[0x6A] is table[0x62]  # 3.1 may set DUP on PUBREL
    assert table[0x6A] is Decoder._decode
    assert table[0x10] is table[0x20] is table[0x00] is table[0xF0] is Decoder._decode
    assert dispatch_table(True, 5)[0xF0] is not Decoder._decode  # AUTH in 5.0
    first = dispatch_table(True, None)  # a server's first packet: CONNECT decoded at once
    assert set(first[0x10:0x20]) == {Decoder._decode_first_connect}
    assert set(first[:0x10] + first[0x20:]) == {Decoder._decode}
    assert set(dispatch_table(False, None)) == {Decoder._decode}


def test_a_connect_after_an_unsupported_one_is_refused():
    """The first CONNECT is decoded straight from the dispatch table; one
    after an unsupported CONNECT (the level still unknown) is refused
    [MQTT-3.1.0-2]."""
    decoder = Decoder()
    unsupported = b"\x10\x0d\x00\x04MQTT\x07\x02\x00\x3c\x00\x01a"
    (connect,) = decoder.feed(unsupported)
    assert connect.protocol_level == 7 and decoder.protocol_level is None
    with pytest.raises(MalformedPacket) as info:
        decoder.feed(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a")
    assert info.value.reason_code == 0x82
    assert dispatch_table(False, 4)[0x20] is not Decoder._decode  # CONNACK to a client


# --------------------------------------------------------------------------
# Maximum packet size
# --------------------------------------------------------------------------


def test_oversized_publish_rejected_before_body():
    decoder = server_decoder(4, max_packet_size=100)
    # PUBLISH, remaining length 1000 (0xE8 0x07): only the fixed header sent.
    with pytest.raises(MalformedPacket) as info:
        decoder.feed(b"\x30\xe8")
        decoder.feed(b"\x07")
    assert info.value.reason_code == 0x95


def test_packet_at_max_size_accepted():
    packet = Publish("t", b"x" * 95)
    data = encode(packet, 4)
    assert len(data) == 100
    assert server_decoder(4, max_packet_size=100).feed(data) == [packet]
    with pytest.raises(MalformedPacket) as info:
        server_decoder(4, max_packet_size=99).feed(data[:2])
    assert info.value.reason_code == 0x95


def test_remaining_length_longer_than_four_bytes():
    with pytest.raises(MalformedPacket) as info:
        server_decoder(4).feed(b"\x30\xff\xff\xff\xff\x01")
    assert info.value.reason_code == 0x81


def test_largest_remaining_length_header_is_buffered():
    decoder = server_decoder(4)
    assert decoder.feed(b"\x30\xff\xff\xff\x7f\x00\x01") == []


# --------------------------------------------------------------------------
# Spec vectors
# --------------------------------------------------------------------------

CONNECT_311 = bytes.fromhex(
    "1027"            # CONNECT, remaining length 39
    "00044d515454"    # "MQTT"
    "04"              # level 4
    "ee"              # user, password, will retain, will QoS 1, will, clean session
    "003c"            # keep alive 60
    "0003636964"      # client id "cid"
    "0005772f746f70"  # will topic "w/top"
    "0003627965"      # will message "bye"
    "000475736572"    # user name "user"
    "000470617373"    # password "pass"
)


def test_connect_311_vector():
    expected = Connect(
        protocol_name="MQTT",
        protocol_level=4,
        clean_start=True,
        keep_alive=60,
        client_id="cid",
        will=Will("w/top", b"bye", 1, True),
        username="user",
        password=b"pass",
    )
    assert Decoder().feed(CONNECT_311) == [expected]
    assert encode(expected) == CONNECT_311


def test_connect_31_vector():
    data = bytes.fromhex("1012" "00064d5149736470" "03" "02" "000a" "000461626364")
    expected = Connect(protocol_name="MQIsdp", protocol_level=3, keep_alive=10, client_id="abcd")
    decoder = Decoder()
    assert decoder.feed(data) == [expected]
    assert decoder.protocol_level == 3
    assert encode(expected) == data


PUBLISH_5 = bytes.fromhex(
    "3b1b"              # PUBLISH, DUP, QoS 1, RETAIN; remaining length 27
    "0003612f62"        # topic "a/b"
    "000a"              # packet id 10
    "11"                # property length 17
    "0101"              # payload format indicator 1
    "020000003c"        # message expiry interval 60
    "230005"            # topic alias 5
    "2600016b000176"    # user property ("k", "v")
    "6869"              # payload "hi"
)


def test_publish_5_vector():
    expected = Publish(
        topic="a/b",
        payload=b"hi",
        qos=1,
        retain=True,
        dup=True,
        packet_id=10,
        properties={
            Property.PAYLOAD_FORMAT_INDICATOR: 1,
            Property.MESSAGE_EXPIRY_INTERVAL: 60,
            Property.TOPIC_ALIAS: 5,
            Property.USER_PROPERTY: [("k", "v")],
        },
    )
    assert server_decoder(5).feed(PUBLISH_5) == [expected]
    assert encode(expected, 5) == PUBLISH_5


def test_publish_5_topic_alias_only():
    packet = Publish("", b"", properties={Property.TOPIC_ALIAS: 1})
    assert encode(packet, 5) == bytes.fromhex("3006" "0000" "03230001")
    assert server_decoder(5).feed(encode(packet, 5)) == [packet]


@pytest.mark.parametrize(
    "packet, level, data",
    [
        (Puback(1), 5, "40020001"),
        (Puback(1, 0x10), 5, "4003000110"),
        (Puback(1, 0x10), 4, "40020001"),
        (Pubrel(7), 4, "62020007"),
        (Pubrel(7, 0x92), 5, "6203000792"),
        (Disconnect(), 5, "e000"),
        (Disconnect(0x04), 5, "e00104"),
        (Disconnect(0x04), 4, "e000"),
        (Auth(), 5, "f000"),
        (Pingreq(), 4, "c000"),
        (Pingresp(), 5, "d000"),
        (Connack(True, 0), 4, "20020100"),
        (Connack(False, 5), 3, "20020005"),
        (Connack(False, 0x87), 5, "2003008700"),
        (Suback(3, [0, 1, 2, 0x80]), 4, "9006000300010280"),
        (Suback(3, [0x97]), 5, "9004000300" "97"),
        (Unsuback(4), 4, "b0020004"),
        (Unsuback(4, [0x11]), 5, "b00400040011"),
        (Subscribe(2, [SubscriptionRequest("a/#", 1)]), 4, "82080002" "0003612f23" "01"),
        (
            Subscribe(2, [SubscriptionRequest("a", 2, True, True, 2)]), 5,
            "8207000200" "000161" "2e",
        ),
        (Unsubscribe(5, ["a", "b"]), 4, "a2080005" "000161" "000162"),
    ],
)
def test_vectors(packet, level, data):
    raw = bytes.fromhex(data)
    assert encode(packet, level) == raw
    to_server = packet.packet_type in (
        PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE, PacketType.PINGREQ
    ) or (level < 5 and isinstance(packet, Disconnect))
    decoder = server_decoder(level) if to_server else Decoder(protocol_level=level, server_side=False)
    if level < 5 and isinstance(packet, (Puback, Disconnect)):
        packet = type(packet)(*([packet.packet_id] if isinstance(packet, Puback) else []))
    assert decoder.feed(raw) == [packet]


def test_puback_with_reason_string_vector():
    packet = Puback(1, 0x10, {Property.REASON_STRING: "x"})
    raw = bytes.fromhex("4008" "0001" "10" "04" "1f000178")
    assert encode(packet, 5) == raw
    assert Decoder(protocol_level=5, server_side=False).feed(raw) == [packet]


def test_variable_byte_integer_vectors():
    # section 1.5.5: 321 is encoded as 0xC1 0x02
    packet = Publish("t", b"x" * 318)
    raw = encode(packet, 4)
    assert raw[:3] == b"\x30\xc1\x02"
    assert server_decoder(4).feed(raw) == [packet]


# --------------------------------------------------------------------------
# encode once, patch the packet id per subscriber
# --------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@SETTINGS
@given(data=st.data(), pid=packet_ids)
def test_publish_packet_id_patching(level, data, pid):
    packet = data.draw(publishes(level, to_server=False).filter(lambda p: p.qos > 0))
    raw = encode_publish(packet, level)
    offset = publish_packet_id_offset(raw)
    patched = raw[:offset] + pid.to_bytes(2, "big") + raw[offset + 2:]
    packet.packet_id = pid
    assert Decoder(protocol_level=level, server_side=False).feed(patched) == [packet]


def test_publish_packet_id_offset_rejects_qos0():
    with pytest.raises(ValueError):
        publish_packet_id_offset(encode(Publish("t", b"x"), 4))


def test_encode_publish_qos1_needs_packet_id():
    with pytest.raises(ValueError):
        encode(Publish("t", qos=1), 4)


# --------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------


def test_properties_vectors():
    props = {Property.SESSION_EXPIRY_INTERVAL: 10, Property.USER_PROPERTY: [("a", "b"), ("a", "c")]}
    raw = encode_properties(props)
    assert raw == bytes.fromhex("13" "110000000a" "26000161000162" "260001610001 63".replace(" ", ""))
    assert decode_properties(b"\xff" + raw, 1, PacketType.CONNECT) == (props, len(raw) + 1)
    assert encode_properties({}) == b"\x00"


@pytest.mark.parametrize(
    "raw, packet_type, code",
    [
        (b"\x02\x05\x00", PacketType.CONNECT, 0x81),              # unknown id 0x05
        (b"\x02\x23\x00", PacketType.CONNECT, 0x81),              # topic alias: truncated
        (b"\x03\x23\x00\x01", PacketType.CONNECT, 0x81),          # topic alias not in CONNECT
        (b"\x04\x21\x00\x01", PacketType.CONNECT, 0x81),          # length beyond the data
        (b"\x06\x21\x00\x01\x21\x00\x02", PacketType.CONNECT, 0x82),  # receive maximum twice
        (b"\x03\x21\x00\x00", PacketType.CONNECT, 0x82),          # receive maximum 0
        (b"\x02\x17\x02", PacketType.CONNECT, 0x82),              # request problem info 2
        (b"\x04\x0b\x01\x0b\x02", PacketType.SUBSCRIBE, 0x82),     # two subscription ids
        (b"\x02\x0b\x00", PacketType.SUBSCRIBE, 0x82),             # subscription id 0
        (b"\x03\x16\x00\x00", PacketType.CONNECT, 0x82),           # auth data, no method
        (b"\x05\x03\x00\x02\xc3\x28", PacketType.PUBLISH, 0x81),   # content type not UTF-8
        (b"\x04\x03\x00\x01\x00", PacketType.PUBLISH, 0x81),       # content type U+0000
        (b"\x05\x0b\xff\xff\xff\xff", PacketType.PUBLISH, 0x81),   # 5-byte VBI
    ],
)
def test_bad_properties(raw, packet_type, code):
    with pytest.raises(MalformedPacket) as info:
        decode_properties(raw, 0, packet_type)
    assert info.value.reason_code == code


def test_repeated_subscription_identifiers_in_publish():
    props, _ = decode_properties(b"\x04\x0b\x01\x0b\x02", 0, PacketType.PUBLISH)
    assert props == {Property.SUBSCRIPTION_IDENTIFIER: [1, 2]}


def test_unpack_properties_trailing_bytes():
    with pytest.raises(MalformedPacket):
        unpack_properties(b"\x00\x00")


# --------------------------------------------------------------------------
# Validation errors
# --------------------------------------------------------------------------


def h(data: str) -> bytes:
    return bytes.fromhex(data.replace(" ", ""))


@pytest.mark.parametrize(
    "level, data, code",
    [
        (4, "32 05 0001 74 0000", 0x81),             # QoS 1 with packet id 0
        (4, "36 03 0001 74", 0x81),                   # QoS 3
        (4, "38 03 0001 74", 0x81),                   # DUP on QoS 0
        (4, "30 03 0001 ff", 0x81),                   # topic not UTF-8
        (4, "30 03 0001 00", 0x81),                   # topic U+0000
        (4, "30 05 0003 eda080", 0x81),               # encoded surrogate U+D800
        (4, "60 02 0001", 0x81),                      # PUBREL flags must be 0010
        (4, "41 02 0001", 0x81),                      # PUBACK flags must be 0
        (4, "80 06 0001 000161 00", 0x81),            # SUBSCRIBE flags must be 0010
        (4, "82 02 0001", 0x82),                      # SUBSCRIBE without filters
        (4, "82 06 0001 000161 04", 0x81),            # reserved option bit (3.1.1)
        (4, "82 06 0001 000161 03", 0x81),            # QoS 3 (3.1.1)
        (5, "82 07 0001 00 000161 c0", 0x81),         # reserved option bits (5.0)
        (5, "82 07 0001 00 000161 30", 0x82),         # retain handling 3
        (4, "a2 02 0001", 0x82),                      # UNSUBSCRIBE without filters
        (4, "a2 04 0001 0001", 0x81),                 # truncated filter
        (4, "40 03 0001 00", 0x81),                   # PUBACK with extra byte in 3.1.1
        (4, "c0 01 00", 0x81),                        # PINGREQ with a body
        (4, "e0 01 00", 0x81),                        # DISCONNECT with a body in 3.1.1
        (4, "00 00", 0x81),                           # packet type 0
        (4, "20 02 0000", 0x82),                      # CONNACK to a server
        (4, "90 03 0001 00", 0x82),                   # SUBACK to a server
        (4, "b0 02 0001", 0x82),                      # UNSUBACK to a server
        (4, "d0 00", 0x82),                           # PINGRESP to a server
        (4, "f0 00", 0x81),                           # AUTH in 3.1.1
        (4, "10 0c 00044d515454 04 02 0000 0000", 0x82),  # second CONNECT
        (5, "40 04 0001 10 05", 0x81),                # PUBACK properties truncated
        (5, "40 03 0001 05", 0x82),                   # PUBACK reason code not valid
        (5, "e0 01 05", 0x82),                        # DISCONNECT reason code not valid
        (5, "32 08 0001 74 0001 02 0b01", 0x82),       # subscription id from a client
        (5, "e0 03 00 00 00", 0x81),                  # DISCONNECT trailing byte
    ],
)
def test_server_side_errors(level, data, code):
    with pytest.raises(MalformedPacket) as info:
        server_decoder(level).feed(h(data))
    assert info.value.reason_code == code


@pytest.mark.parametrize(
    "level, data, code",
    [
        (4, "10 0c 00044d515454 04 02 0000 0000", 0x82),  # CONNECT to a client
        (4, "82 06 0001 000161 00", 0x82),            # SUBSCRIBE to a client
        (4, "a2 05 0001 000161", 0x82),               # UNSUBSCRIBE to a client
        (4, "c0 00", 0x82),                           # PINGREQ to a client
        (4, "20 02 0200", 0x81),                      # CONNACK reserved flag
        (4, "20 02 0006", 0x81),                      # CONNACK return code 6
        (4, "90 03 0001 03", 0x82),                   # SUBACK return code 3
        (5, "90 04 0001 00 03", 0x82),                # SUBACK reason code 3
        (5, "20 02 0000", 0x81),                      # CONNACK v5 without properties
    ],
)
def test_client_side_errors(level, data, code):
    with pytest.raises(MalformedPacket) as info:
        Decoder(protocol_level=level, server_side=False).feed(h(data))
    assert info.value.reason_code == code


@pytest.mark.parametrize(
    "data, code",
    [
        ("10 0c 00044d515454 04 03 0000 0000", 0x81),  # reserved flag
        ("10 0c 00044d515454 04 08 0000 0000", 0x81),  # will QoS without will flag
        ("10 0c 00044d515454 04 20 0000 0000", 0x81),  # will retain without will flag
        ("10 11 00044d515454 04 1c 0000 0000 0001 74 0000", 0x81),  # will QoS 3
        ("10 0e 00044d515454 04 40 0000 0000 0000", 0x81),  # password without user name
        ("10 0d 00044d515454 04 02 0000 0000 00", 0x81),  # trailing byte
        ("10 0b 00044d515454 04 02 0000 00", 0x81),  # truncated client id
        ("30 02 0000", 0x82),                         # first packet not CONNECT
    ],
)
def test_connect_errors(data, code):
    with pytest.raises(MalformedPacket) as info:
        Decoder().feed(h(data))
    assert info.value.reason_code == code


def test_v5_password_without_user_name():
    packet = Connect(protocol_level=5, password=b"secret")
    assert Decoder().feed(encode(packet)) == [packet]


@pytest.mark.parametrize("name, level", [("MQTT", 3), ("MQTT", 6), ("MQIsdp", 4), ("MQTX", 4)])
def test_unsupported_protocol(name, level):
    body = len(name).to_bytes(2, "big") + name.encode() + bytes((level,)) + b"\x02\x00\x3c\x00\x00"
    raw = b"\x10" + bytes((len(body),)) + body
    decoder = Decoder()
    assert decoder.feed(raw) == [Connect(protocol_name=name, protocol_level=level)]
    assert decoder.protocol_level is None


def test_v31_tolerates_dup_on_pubrel():
    decoder = server_decoder(3)
    assert decoder.feed(h("6a 02 0001")) == [Pubrel(1)]
    with pytest.raises(MalformedPacket):
        server_decoder(4).feed(h("6a 02 0001"))


def test_failed_decoder_keeps_earlier_packets():
    decoder = server_decoder(4)
    good = encode(Publish("t", b"1"), 4)
    with pytest.raises(MalformedPacket) as info:
        decoder.feed(good + h("00 00"))
    assert info.value.packets == [Publish("t", b"1")]
    with pytest.raises(MalformedPacket):
        decoder.feed(good)


def test_malformed_packet_api():
    assert MalformedPacket is CodecMalformedPacket
    exc = MalformedPacket("x")
    assert exc.reason_code == 0x81
    assert MalformedPacket("y", 0x82).reason_code == 0x82


def test_protocol_level_switch_within_one_feed():
    connect = Connect(protocol_level=5, client_id="c")
    packet = Publish("t", b"p", properties={Property.CONTENT_TYPE: "text/plain"})
    assert Decoder().feed(encode(connect) + encode(packet, 5)) == [connect, packet]


def test_feed_accepts_bytearray_and_memoryview():
    raw = encode(Publish("t", b"abc"), 4)
    assert server_decoder(4).feed(bytearray(raw)) == [Publish("t", b"abc")]
    assert server_decoder(4).feed(memoryview(raw)) == [Publish("t", b"abc")]
    [packet] = server_decoder(4).feed(bytearray(raw))
    assert type(packet.payload) is bytes


def test_auth_not_encodable_before_v5():
    with pytest.raises(ValueError):
        encode(Auth(), 4)


# --------------------------------------------------------------------------
# A packet refused on its first byte (section 4.13)
# --------------------------------------------------------------------------


def first_byte_error(first: int, server_side: bool, level: int | None) -> int | None:
    """What the spec says of a first byte on its own, written from the
    spec apart from the decoder: the reason code it is refused with, or
    None when the rest of the packet must be read to tell.

    :param level: None for a server before CONNECT.
    """
    ptype, flags = first >> 4, first & 0x0F
    if level is None:
        return None if ptype == PacketType.CONNECT else 0x82  # [MQTT-3.1.0-1]
    if ptype == 0 or (ptype == PacketType.AUTH and level != 5):
        return 0x81
    refused = ((PacketType.CONNECT, PacketType.CONNACK, PacketType.SUBACK, PacketType.UNSUBACK,
                PacketType.PINGRESP) if server_side  # the CONNECT: a second one
               else (PacketType.CONNECT, PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE,
                     PacketType.PINGREQ))
    if ptype in refused:
        return 0x82
    if ptype == PacketType.PUBLISH:
        qos = (flags >> 1) & 3
        return 0x81 if qos == 3 or (flags & 8 and not qos) else None  # [MQTT-3.3.1-4, -2]
    if ptype in (PacketType.PUBREL, PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE):
        return None if (flags & 7 if level == 3 else flags) == 2 else 0x81
    return 0x81 if flags else None  # [MQTT-2.1.3-1]


@pytest.mark.parametrize("server_side, level", [
    (True, None), (True, 3), (True, 4), (True, 5), (False, 3), (False, 4), (False, 5)])
def test_every_first_byte_is_judged_before_the_rest_arrives(server_side, level):
    """Each of the 256 first bytes, fed alone and then with a Remaining
    Length that announces a body not sent yet: refused at once with its
    reason code when the byte alone breaks a rule, else the decoder waits."""
    for first in range(256):
        expected = first_byte_error(first, server_side, level)
        for data in (bytes((first,)), bytes((first, 0x80)), bytes((first, 0x05, 0x00))):
            if server_side:
                decoder = Decoder() if level is None else server_decoder(level)
            else:
                decoder = Decoder(protocol_level=level, server_side=False)
            if expected is None:
                assert decoder.feed(data) == [], (hex(first), data)
                assert decoder.pending == len(data)
            else:
                with pytest.raises(MalformedPacket) as info:
                    decoder.feed(data)
                assert info.value.reason_code == expected, (hex(first), data, str(info.value))


@pytest.mark.parametrize("level, data, code, message", [
    (None, "00", 0x82, "first packet must be CONNECT"),
    (None, "30", 0x82, "first packet must be CONNECT"),
    (4, "f0", 0x81, "AUTH exists only in MQTT 5.0"),
    (3, "f0", 0x81, "AUTH exists only in MQTT 5.0"),
    (5, "00", 0x81, "packet type 0 is reserved"),
    (4, "00", 0x81, "packet type 0 is reserved"),
    (4, "10", 0x82, "second CONNECT"),
    (5, "20", 0x82, "must not receive CONNACK"),
    (4, "36", 0x81, "QoS 3"),
    (5, "38", 0x81, "DUP"),
    (4, "60", 0x81, "0010"),
    (4, "41", 0x81, "must be 0"),
])
def test_a_forbidden_first_byte_fails_without_the_rest(level, data, code, message):
    """[MQTT-3.1.0-1, MQTT-3.1.0-2, MQTT-2.1.3-1]: the decoder does not wait
    for a Remaining Length that may never come."""
    decoder = Decoder() if level is None else server_decoder(level)
    with pytest.raises(MalformedPacket) as info:
        decoder.feed(h(data))
    assert info.value.reason_code == code and message in str(info.value)
    assert decoder.pending == 0


def test_packets_before_a_forbidden_first_byte_are_kept():
    decoder = server_decoder(4)
    good = encode(Publish("t", b"1"), 4)
    with pytest.raises(MalformedPacket) as info:
        decoder.feed(good + b"\xf0")
    assert info.value.packets == [Publish("t", b"1")]


def test_a_forbidden_type_is_named_before_its_announced_size():
    """A CONNACK sent to a server, announcing 1000 bytes where 100 are
    allowed: the type is the error (0x82), not the size (0x95)."""
    with pytest.raises(MalformedPacket) as info:
        server_decoder(4, max_packet_size=100).feed(b"\x20\xe8\x07")
    assert info.value.reason_code == 0x82


def test_valid_first_bytes_wait_for_the_rest():
    """CONNECT first, then AUTH in 5.0, a QoS 2 PUBLISH with DUP, PUBREL:
    nothing is decided before their bodies."""
    assert Decoder().feed(b"\x10") == []
    assert server_decoder(5).feed(b"\xf0") == []
    assert server_decoder(4).feed(b"\x3d\x05") == []
    assert server_decoder(3).feed(b"\x6a") == []


# --------------------------------------------------------------------------
# CONNECT errors found once its protocol level is known
# --------------------------------------------------------------------------


def v5_connect(props: str, will_props: str | None = None) -> bytes:
    """A v5 CONNECT built by hand (clean start, keep alive 60, client id
    "c"), with raw property bytes (their length is prefixed here)."""
    flags = 0x02 if will_props is None else 0x06
    body = h("0004 4d515454 05") + bytes((flags,)) + h("003c")
    body += bytes((len(h(props)),)) + h(props) + h("0001 63")
    if will_props is not None:
        body += bytes((len(h(will_props)),)) + h(will_props) + h("0001 77 0000")
    return bytes((0x10, len(body))) + body


@pytest.mark.parametrize("data, code", [
    (v5_connect("21 0000"), 0x82),                  # Receive Maximum 0
    (v5_connect("27 00000000"), 0x82),              # Maximum Packet Size 0
    (v5_connect("11 0000003c 11 0000003c"), 0x82),  # Session Expiry Interval twice
    (v5_connect("17 02"), 0x82),                    # Request Problem Information 2
    (v5_connect("19 02"), 0x82),                    # Request Response Information 2
    (v5_connect("16 0001 78"), 0x82),               # Authentication Data, no Method
    (v5_connect("23 0001"), 0x81),                  # Topic Alias: not a CONNECT property
    (v5_connect("7f 00"), 0x81),                    # unknown property identifier
    (v5_connect("21 00"), 0x81),                    # truncated Receive Maximum
    (v5_connect("", "01 02"), 0x82),                # will Payload Format Indicator 2
    (v5_connect("", "21 0005"), 0x81),              # Receive Maximum as a will property
    (h("10 0c 0004 4d515454 05 02 003c 00 00"), 0x81),  # truncated client identifier
    (h("11 0d 0004 4d515454 05 02 003c 00 0000"), 0x81),  # fixed-header flags [MQTT-2.1.3-1]
], ids=["receive-maximum-0", "maximum-packet-size-0", "duplicate", "request-problem-information-2",
        "request-response-information-2", "authentication-data-without-method", "topic-alias",
        "unknown-property", "truncated-property", "will-payload-format-2",
        "will-receive-maximum", "truncated-client-id", "header-flags"])
def test_v5_connect_errors_carry_the_protocol_level(data, code):
    """Every rule a v5 CONNECT breaks once its protocol level is read comes
    out the same way: the reason code and ``connect_level`` 5, so the
    server can answer CONNACK with that code [MQTT-4.13.1-1]."""
    with pytest.raises(MalformedPacket) as info:
        Decoder().feed(data)
    assert (info.value.reason_code, info.value.connect_level) == (code, 5)


@pytest.mark.parametrize("data, level", [
    ("10 0c 00044d515454 04 03 0000 0000", 4),      # 3.1.1 reserved flag
    ("10 0b 00044d515454 04 02 0000 00", 4),        # 3.1.1 truncated client id
    ("10 0d 00064d5149736470 03 02 0000 00", 3),    # 3.1 truncated client id
    ("10 05 00044d5154", None),                     # protocol name truncated
    ("10 06 00044d515454", None),                   # level missing
    ("11 0c 00044d515454 06 02 0000 0000", None),   # level 6, fixed-header flags set
    ("30 02 0000", None),                           # not a CONNECT
])
def test_connect_level_of_other_errors(data, level):
    """3.1.1 and 3.1 CONNECTs carry their level too; an error before the
    protocol name and a supported level are read carries None."""
    with pytest.raises(MalformedPacket) as info:
        Decoder().feed(h(data))
    assert info.value.connect_level == level


def test_a_valid_v5_connect_built_by_hand_decodes():
    """The hand-built CONNECTs above differ from a valid one only where
    they say."""
    [packet] = Decoder().feed(v5_connect("21 0001 27 00000400", "01 01"))
    assert packet.properties == {Property.RECEIVE_MAXIMUM: 1, Property.MAXIMUM_PACKET_SIZE: 1024}
    assert packet.will.properties == {Property.PAYLOAD_FORMAT_INDICATOR: 1}


@pytest.mark.parametrize("level", [3, 4, 5])
def test_encode_pubacks_decode_back_to_their_packet_ids(level):
    """The PUBACKs of a run are the 2-byte success PUBACK of each packet
    id, in order, and a client decodes them back to those ids."""
    from tbmq.mqtt import Puback, encode, encode_pubacks
    pids = [1, 258, 65535]
    data = encode_pubacks(pids)
    assert data == h("4002 0001 4002 0102 4002 ffff")
    assert data == b"".join(encode(Puback(pid), level) for pid in pids)
    decoded = Decoder(protocol_level=level, server_side=False).feed(data)
    assert [(type(p), p.packet_id, p.reason_code) for p in decoded] == [(Puback, pid, 0) for pid in pids]
    assert encode_pubacks([]) == b""


def test_encode_pubacks_is_each_puback_in_turn_and_refuses_ids_out_of_range():
    from tbmq.mqtt import encode_puback, encode_pubacks
    pids = [1, 2, 0x1234, 65535]
    assert encode_pubacks(pids) == b"".join(map(encode_puback, pids))
    assert encode_pubacks([7]) == b"\x40\x02\x00\x07"
    assert encode_pubacks([]) == b""
    for bad in ([0], [1, 65536]):
        with pytest.raises(ValueError):
            encode_pubacks(bad)


@pytest.mark.parametrize("level", [3, 4])
def test_a_run_of_publishes_is_each_publish_in_turn_and_decodes_back(level):
    """:func:`encode_publish_run` gives, byte for byte, what
    :func:`encode_publish_fields` gives each PUBLISH (topics, QoS, RETAIN
    flags and payload sizes changing within the run, a remaining length
    of one to three bytes), a client decodes them back, and it refuses
    what :func:`encode_publish_fields` refuses, and 5.0."""
    from tbmq.mqtt.codec import encode_publish_fields, encode_publish_run
    fields = [("a/b", b"", 1, False, 1), ("a/b", b"x" * 64, 1, False, 2),
              ("a/b", b"y" * 64, 1, False, 3), ("a/b", b"y" * 64, 2, False, 4),
              ("a/b", b"y" * 64, 2, True, 5), ("é/ü", b"z" * 200, 1, False, 65535),
              ("t" * 300, b"w" * 20000, 1, True, 258)]
    data = encode_publish_run(fields, level)
    assert data == b"".join(encode_publish_fields(t, p, q, r, False, pid, None, level)
                            for t, p, q, r, pid in fields)
    decoded = Decoder(protocol_level=level, server_side=False).feed(data)
    assert [(p.topic, p.payload, p.qos, p.retain, p.packet_id, p.dup) for p in decoded] \
        == [(*f, False) for f in fields]
    assert encode_publish_run([], level) == b""
    for bad in ([("a", b"", 0, False, 1)], [("a", b"", 1, False, 0)],
                [("a", b"", 1, False, 65536)]):
        with pytest.raises(ValueError):
            encode_publish_run(bad, level)
    with pytest.raises(ValueError):
        encode_publish_run(fields, 5)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("cls", [Puback, Pubrec, Pubrel, Pubcomp])
def test_an_acknowledgement_of_a_packet_id_alone_is_made_whole(level, cls):
    # made field by field (of_packet_id) by the decoder: every field set,
    # equal to the dataclass's own
    decoder = server_decoder(level)
    (packet,) = decoder.feed(encode(cls(513), level))
    assert type(packet) is cls and packet == cls(513) == cls.of_packet_id(513)
    assert (packet.packet_id, packet.reason_code, packet.properties) == (513, 0, {})
    assert not hasattr(packet, "__dict__")  # (the dataclass's slots kept)
