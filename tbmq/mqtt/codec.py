"""Sans-IO MQTT codec: :func:`encode`, and the incremental :class:`Decoder`
of :mod:`tbmq.mqtt.decoder` (exported here too).

Pure functions over bytes, for MQTT 3.1 (level 3), 3.1.1 (level 4) and 5.0
(level 5). Bad input raises :class:`MalformedPacket` carrying the reason code
to close the connection with; nothing here does I/O or logs.

The hot path is PUBLISH: :func:`encode_publish` builds the packet with a few
joins, and :func:`publish_packet_id_offset` lets a broker encode once and
patch the Packet Identifier per subscriber.
"""

from __future__ import annotations

import struct

from .constants import (
    MQTT_3_1,
    MQTT_5,
)
from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from .decoder import _TOPIC_CACHE_SIZE, Decoder
from .properties import (
    BYTES,
    MalformedPacket,
    _pack_H,
    encode_binary,
    encode_properties,
    encode_string,
    encode_variable_byte_integer,
)

__all__ = [
    "MalformedPacket",
    "encode",
    "encode_publish",
    "encode_publish_fields",
    "encode_publish_run",
    "publish_packet_id_offset",
    "Decoder",
]

_PROTOCOL_ERROR = 0x82
_PACKET_TOO_LARGE = 0x95

_vbi = encode_variable_byte_integer

#: topic name → its UTF-8 bytes, for :func:`encode_publish`
_TOPIC_BYTES: dict[str, bytes] = {}
_EMPTY_PROPS = b"\x00"


def _frame(first: int, body: bytes) -> bytes:
    """Prefix ``body`` with a fixed header (section 2.1)."""
    return b"".join((BYTES[first], _vbi(len(body)), body))


def _props(props: dict) -> bytes:
    return encode_properties(props) if props else _EMPTY_PROPS


# --------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------


def encode_publish(packet: Publish, protocol_level: int) -> bytes:
    """Encode a PUBLISH (section 3.3); the fast path :func:`encode` uses.

    :param packet: the packet. ``packet_id`` is ignored for QoS 0
        [MQTT-2.2.1-2] and required otherwise.
    :param protocol_level: 3, 4 or 5; properties are written only for 5.
    :returns: the whole packet.
    :raises ValueError: QoS > 0 without a packet id, or QoS out of range.
    """
    return encode_publish_fields(packet.topic, packet.payload, packet.qos, packet.retain,
                                 packet.dup, packet.packet_id, packet.properties,
                                 protocol_level)


def encode_publish_fields(topic_name: str, payload: bytes, qos: int, retain: bool, dup: bool,
                          packet_id: int | None, properties: dict | None,
                          protocol_level: int) -> bytes:
    """:func:`encode_publish` from the fields of a PUBLISH, for a sender
    that has them without a :class:`Publish` (the broker's deliveries).

    :param properties: the v5 properties (read for level 5 only; None or
        empty for none).

    :raises ValueError: as :func:`encode_publish`.
    """
    topic = _TOPIC_BYTES.get(topic_name)
    if topic is None:
        topic = topic_name.encode("utf-8")
        if len(_TOPIC_BYTES) >= _TOPIC_CACHE_SIZE:
            _TOPIC_BYTES.clear()
        _TOPIC_BYTES[topic_name] = topic
    first = 0x30 | (qos << 1)
    if retain:
        first |= 1
    if dup:
        first |= 8
    if qos:
        if not packet_id or qos > 2:
            raise ValueError("PUBLISH with QoS 1 or 2 needs a non-zero packet_id and QoS <= 2")
        tail = _pack_H(packet_id)
    else:
        tail = b""
    if protocol_level == MQTT_5:
        tail += encode_properties(properties) if properties else _EMPTY_PROPS
    tl = len(topic)
    return b"".join((
        BYTES[first],
        _vbi(2 + tl + len(tail) + len(payload)),
        _pack_H(tl),
        topic,
        tail,
        payload,
    ))


def encode_publish_run(fields, protocol_level: int) -> bytes:
    """:func:`encode_publish_fields` of each of ``fields``, without DUP and
    properties, one after another in one call: the PUBLISHes of one write
    of a session's run (a drain sends most of a window at once), each
    made of its fixed header and topic (kept for the next PUBLISH of the
    same topic, QoS, RETAIN flag and payload size), its packet identifier
    and its payload, joined once for the run.

    :param fields: ``(topic_name, payload, qos, retain, packet_id)`` each
        (an iterable), ``qos`` 1 or 2 and ``packet_id`` 1..65535.
    :param protocol_level: 3 or 4 (a 5.0 PUBLISH has properties:
        :func:`encode_publish_fields`).
    :returns: the PUBLISHes' bytes, byte for byte what
        :func:`encode_publish_fields` gives each.
    :raises ValueError: for protocol level 5, a QoS other than 1 or 2, or
        a packet identifier out of range.
    """
    if protocol_level >= MQTT_5:
        raise ValueError("a run of PUBLISHes without properties is for MQTT 3.1 and 3.1.1")
    parts: list[bytes] = []
    append = parts.append
    pack = _pack_H
    heads = _PUBLISH_HEADS
    try:
        for topic_name, payload, qos, retain, packet_id in fields:
            key = (topic_name, qos, retain, len(payload))
            head = heads.get(key)
            if head is None:
                head = _publish_head(*key)
            if not packet_id:
                raise ValueError("a PUBLISH of a run needs a non-zero packet_id")
            append(head)
            append(pack(packet_id))
            append(payload)
    except struct.error:
        raise ValueError("packet identifiers are 1..65535") from None
    return b"".join(parts)


#: (topic name, QoS, RETAIN flag, payload size) → the fixed header and
#: Topic Name of such a PUBLISH (:func:`encode_publish_run`), up to
#: :data:`_TOPIC_CACHE_SIZE` of them
_PUBLISH_HEADS: dict[tuple, bytes] = {}


def _publish_head(topic_name: str, qos: int, retain: bool, size: int) -> bytes:
    """The fixed header and Topic Name of a PUBLISH without DUP and
    properties whose packet identifier and ``size`` bytes of payload
    follow."""
    if qos != 1 and qos != 2:
        raise ValueError("a PUBLISH of a run has QoS 1 or 2")
    topic = topic_name.encode("utf-8")
    tl = len(topic)
    head = b"".join((BYTES[0x30 | (qos << 1) | (1 if retain else 0)], _vbi(2 + tl + 2 + size),
                     _pack_H(tl), topic))
    if len(_PUBLISH_HEADS) >= _TOPIC_CACHE_SIZE:
        _PUBLISH_HEADS.clear()
    _PUBLISH_HEADS[(topic_name, qos, retain, size)] = head
    return head


def publish_packet_id_offset(data: bytes) -> int:
    """Offset of the two-byte Packet Identifier in an encoded QoS 1/2
    PUBLISH, for patching it per subscriber::

        data[:o] + pid.to_bytes(2, "big") + data[o + 2:]

    :param data: a PUBLISH from :func:`encode_publish` / :func:`encode`.
    :returns: the byte offset of the Packet Identifier (section 3.3.2.2).
    :raises ValueError: if ``data`` is not a QoS 1 or 2 PUBLISH.
    """
    first = data[0]
    if first >> 4 != 3 or not first & 0x06:
        raise ValueError("not a QoS 1 or 2 PUBLISH")
    i = 1
    while data[i] & 0x80:
        i += 1
    i += 1
    return i + 2 + ((data[i] << 8) | data[i + 1])


def publish_with_packet_id(data: bytes, packet_id: int) -> bytes:
    """An encoded QoS 1/2 PUBLISH with its Packet Identifier replaced: one
    encoding of a message serves all its subscribers (ARCHITECTURE §3).

    :param data: a QoS 1 or 2 PUBLISH from :func:`encode_publish`.
    :param packet_id: 1..65535.
    :raises ValueError: if ``data`` is not a QoS 1 or 2 PUBLISH.
    """
    o = publish_packet_id_offset(data)
    return data[:o] + _pack_H(packet_id) + data[o + 2:]


def _encode_connect(p: Connect, level: int) -> bytes:
    level = p.protocol_level
    v5 = level == MQTT_5
    flags = 0x02 if p.clean_start else 0
    will = p.will
    if will is not None:
        flags |= 0x04 | (will.qos << 3)
        if will.retain:
            flags |= 0x20
    if p.password is not None:
        flags |= 0x40
    if p.username is not None:
        flags |= 0x80
    parts = [encode_string(p.protocol_name), bytes((level, flags)), _pack_H(p.keep_alive)]
    if v5:
        parts.append(_props(p.properties))
    parts.append(encode_string(p.client_id))
    if will is not None:
        if v5:
            parts.append(_props(will.properties))
        parts.append(encode_string(will.topic))
        parts.append(encode_binary(will.payload))
    if p.username is not None:
        parts.append(encode_string(p.username))
    if p.password is not None:
        parts.append(encode_binary(p.password))
    return _frame(0x10, b"".join(parts))


def _encode_connack(p: Connack, level: int) -> bytes:
    if level == MQTT_5:
        return _frame(0x20, bytes((1 if p.session_present else 0, p.reason_code)) + _props(p.properties))
    if level == MQTT_3_1:
        return bytes((0x20, 2, 0, p.reason_code))
    return bytes((0x20, 2, 1 if p.session_present else 0, p.reason_code))


def _ack_encoder(first: int):
    head = BYTES[first]

    def _encode_ack(p, level: int) -> bytes:
        if level == MQTT_5 and (p.reason_code or p.properties):
            if p.properties:
                return _frame(first, _pack_H(p.packet_id) + BYTES[p.reason_code] + encode_properties(p.properties))
            return head + b"\x03" + _pack_H(p.packet_id) + BYTES[p.reason_code]
        return head + b"\x02" + _pack_H(p.packet_id)

    return _encode_ack


_PUBACK_HEAD = b"\x40\x02"
_PUBREC_HEAD = b"\x50\x02"


def encode_puback(packet_id: int) -> bytes:
    """The PUBACK of ``packet_id`` with reason code 0 and no properties: the
    2-byte form, the same bytes in every protocol level [MQTT-3.4.2.1].

    :param packet_id: 1..65535.
    :returns: 4 bytes.
    """
    return _PUBACK_HEAD + _pack_H(packet_id)


def encode_pubacks(packet_ids: list[int]) -> bytes:
    """:func:`encode_puback` of each of ``packet_ids``, one after another,
    packed in one call (a run of PUBLISHes acknowledged together).

    :param packet_ids: each 1..65535.
    :returns: 4 bytes per packet id.
    :raises ValueError: for a packet id out of range."""
    if not packet_ids:
        return b""
    if min(packet_ids) < 1 or max(packet_ids) > 0xFFFF:
        raise ValueError("packet identifiers are 1..65535")
    return struct.pack(f">{len(packet_ids)}I", *[_PUBACK_WORD | pid for pid in packet_ids])


#: the first two bytes of a success PUBACK above its packet identifier, as
#: one big-endian 32-bit word
_PUBACK_WORD = 0x40020000


def encode_pubrec(packet_id: int) -> bytes:
    """The PUBREC of ``packet_id`` with reason code 0 and no properties, the
    same bytes in every protocol level [MQTT-3.5.2.1].

    :param packet_id: 1..65535.
    :returns: 4 bytes.
    """
    return _PUBREC_HEAD + _pack_H(packet_id)


def _encode_subscribe(p: Subscribe, level: int) -> bytes:
    parts = [_pack_H(p.packet_id)]
    if level == MQTT_5:
        parts.append(_props(p.properties))
        for s in p.subscriptions:
            parts.append(encode_string(s.topic_filter))
            opts = s.qos | (s.retain_handling << 4)
            if s.no_local:
                opts |= 0x04
            if s.retain_as_published:
                opts |= 0x08
            parts.append(BYTES[opts])
    else:
        for s in p.subscriptions:
            parts.append(encode_string(s.topic_filter))
            parts.append(BYTES[s.qos])
    return _frame(0x82, b"".join(parts))


def _encode_suback(p: Suback, level: int) -> bytes:
    body = _pack_H(p.packet_id)
    if level == MQTT_5:
        body += _props(p.properties)
    return _frame(0x90, body + bytes(p.reason_codes))


def _encode_unsubscribe(p: Unsubscribe, level: int) -> bytes:
    parts = [_pack_H(p.packet_id)]
    if level == MQTT_5:
        parts.append(_props(p.properties))
    parts.extend(encode_string(f) for f in p.topic_filters)
    return _frame(0xA2, b"".join(parts))


def _encode_unsuback(p: Unsuback, level: int) -> bytes:
    if level == MQTT_5:
        return _frame(0xB0, _pack_H(p.packet_id) + _props(p.properties) + bytes(p.reason_codes))
    return b"\xb0\x02" + _pack_H(p.packet_id)


def _encode_pingreq(p: Pingreq, level: int) -> bytes:
    return b"\xc0\x00"


def _encode_pingresp(p: Pingresp, level: int) -> bytes:
    return b"\xd0\x00"


def _reason_encoder(first: int):
    head = BYTES[first]

    def _encode_reason(p, level: int) -> bytes:
        if level != MQTT_5:
            if first == 0xF0:
                raise ValueError("AUTH exists only in MQTT 5.0")
            return head + b"\x00"
        if p.properties:
            return _frame(first, BYTES[p.reason_code] + encode_properties(p.properties))
        if p.reason_code:
            return head + b"\x01" + BYTES[p.reason_code]
        return head + b"\x00"

    return _encode_reason


_ENCODERS = {
    Connect: _encode_connect,
    Connack: _encode_connack,
    Publish: encode_publish,
    Puback: _ack_encoder(0x40),
    Pubrec: _ack_encoder(0x50),
    Pubrel: _ack_encoder(0x62),
    Pubcomp: _ack_encoder(0x70),
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_unsuback,
    Pingreq: _encode_pingreq,
    Pingresp: _encode_pingresp,
    Disconnect: _reason_encoder(0xE0),
    Auth: _reason_encoder(0xF0),
}


def encode(packet: Packet, protocol_level: int = 4) -> bytes:
    """Encode any packet for a protocol level.

    Before 5.0, properties and reason codes that have no place on the wire are
    dropped. In 5.0, PUBACK / PUBREC / PUBREL / PUBCOMP use the 2-byte form
    when the reason code is 0 and there are no properties, the 3-byte form
    when there are no properties (sections 3.4.2.1, 3.5.2.1, 3.6.2.1,
    3.7.2.1); DISCONNECT and AUTH have a Remaining Length of 0 (2 bytes in
    all) in the same case (sections 3.14.2.1, 3.15.2.1). CONNECT uses its own
    ``protocol_level``.

    :param packet: the packet.
    :param protocol_level: 3, 4 or 5.
    :returns: the packet's bytes.
    :raises TypeError: for an object that is not a packet.
    :raises ValueError: for values that cannot be encoded (AUTH before 5.0,
        QoS 1/2 PUBLISH without packet id, strings over 65,535 bytes, ...).
    """
    try:
        encoder = _ENCODERS[packet.__class__]
    except KeyError:
        raise TypeError(f"not an MQTT packet: {packet!r}") from None
    return encoder(packet, protocol_level)
