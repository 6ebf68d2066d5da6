"""MQTT 5.0 properties and the wire primitives they share with the codec.

A properties dict maps :class:`~tbmq.mqtt.constants.Property` to a value:
``int`` for Byte, Two Byte, Four Byte and Variable Byte Integer properties,
``str`` for UTF-8 strings, ``bytes`` for Binary Data. ``USER_PROPERTY`` is
always a ``list[tuple[str, str]]`` (wire order kept) and
``SUBSCRIPTION_IDENTIFIER`` always a ``list[int]``.

:class:`MalformedPacket` lives here because every reader here raises it; its
public home is :mod:`tbmq.mqtt.codec` (and :mod:`tbmq.mqtt`), which re-export
it.
"""

from __future__ import annotations

import struct

from .constants import (
    MAX_VARIABLE_BYTE_INTEGER,
    PACKET_PROPERTIES,
    PROPERTY_TYPES,
    REPEATABLE_PROPERTIES,
    Property,
    PropertyType,
)

__all__ = [
    "MalformedPacket",
    "encode_properties",
    "decode_properties",
    "pack_properties",
    "unpack_properties",
    "encode_variable_byte_integer",
    "decode_variable_byte_integer",
    "encode_string",
    "encode_binary",
    "decode_string",
    "decode_binary",
]

MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82


class MalformedPacket(Exception):
    """The one error raised for bad MQTT input.

    :param message: what was wrong, for logs (never includes payload bytes).
    :param reason_code: the MQTT 5.0 reason code to close the connection with:
        0x81 Malformed Packet (default), 0x82 Protocol Error or 0x95 Packet
        Too Large.

    The attribute ``packets`` holds the complete packets the
    :class:`~tbmq.mqtt.codec.Decoder` decoded from the same ``feed`` call
    before the bad one (empty elsewhere).  ``connect_level`` is the
    protocol level (3, 4 or 5) of the CONNECT the error was found in, once
    the decoder has read a protocol name and level it supports, else None:
    a server may then answer a v5 client with CONNACK and ``reason_code``
    before closing [MQTT-4.13.1-1].
    """

    def __init__(self, message: str, reason_code: int = MALFORMED_PACKET) -> None:
        super().__init__(message)
        self.reason_code = reason_code
        self.packets: list = []
        self.connect_level: int | None = None


_H = struct.Struct("!H")
_I = struct.Struct("!I")
_pack_H = _H.pack
_pack_I = _I.pack
_unpack_H = _H.unpack_from
_unpack_I = _I.unpack_from

#: ``bytes((i,))`` for every byte value, to avoid building one-byte objects.
BYTES = tuple(bytes((i,)) for i in range(256))


# --------------------------------------------------------------------------
# Primitives (section 1.5)
# --------------------------------------------------------------------------


def encode_variable_byte_integer(value: int) -> bytes:
    """Encode a Variable Byte Integer (section 1.5.5) with the minimum number
    of bytes [MQTT-1.5.5-1].

    :param value: 0 to 268,435,455.
    :returns: 1 to 4 bytes.
    :raises ValueError: when the value is out of range.
    """
    if value < 0x80:
        if value < 0:
            raise ValueError(f"variable byte integer {value} < 0")
        return BYTES[value]
    if value > MAX_VARIABLE_BYTE_INTEGER:
        raise ValueError(f"variable byte integer {value} too large")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_variable_byte_integer(data, pos: int, end: int) -> tuple[int, int]:
    """Decode a Variable Byte Integer (section 1.5.5) of at most 4 bytes.

    :param data: the buffer.
    :param pos: where the integer starts.
    :param end: the end of the enclosing packet or field.
    :returns: ``(value, new position)``.
    :raises MalformedPacket: (0x81) truncated, or longer than 4 bytes.
    """
    value = 0
    shift = 0
    while True:
        if pos >= end:
            raise MalformedPacket("truncated variable byte integer")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 21:
            raise MalformedPacket("variable byte integer longer than 4 bytes")


def encode_string(value: str) -> bytes:
    """Encode a UTF-8 Encoded String with its two-byte length (section
    1.5.4).

    :param value: the string; at most 65,535 bytes in UTF-8.
    :returns: the length prefix and the UTF-8 bytes.
    :raises ValueError: when longer than 65,535 bytes or not encodable.
    """
    raw = value.encode("utf-8")
    n = len(raw)
    if n > 0xFFFF:
        raise ValueError("UTF-8 string longer than 65535 bytes")
    return _pack_H(n) + raw


def encode_binary(value: bytes) -> bytes:
    """Encode Binary Data with its two-byte length (section 1.5.6).

    :param value: at most 65,535 bytes.
    :returns: the length prefix and the bytes.
    :raises ValueError: when longer than 65,535 bytes.
    """
    n = len(value)
    if n > 0xFFFF:
        raise ValueError("binary data longer than 65535 bytes")
    return _pack_H(n) + bytes(value)


def decode_string(data, pos: int, end: int) -> tuple[str, int]:
    """Decode a UTF-8 Encoded String (section 1.5.4).

    :param data: the buffer.
    :param pos: where the two-byte length starts.
    :param end: the end of the enclosing packet or field.
    :returns: ``(string, new position)``.
    :raises MalformedPacket: (0x81) truncated, ill-formed UTF-8 (including
        encoded surrogates) [MQTT-1.5.4-1], or containing U+0000
        [MQTT-1.5.4-2]. A BOM is kept, never stripped [MQTT-1.5.4-3].
    """
    start = pos + 2
    if start > end:
        raise MalformedPacket("truncated string length")
    stop = start + ((data[pos] << 8) | data[pos + 1])
    if stop > end:
        raise MalformedPacket("truncated string")
    try:
        value = str(data[start:stop], "utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("string is not well-formed UTF-8 [MQTT-1.5.4-1]") from None
    if "\x00" in value:
        raise MalformedPacket("string contains U+0000 [MQTT-1.5.4-2]")
    return value, stop


def decode_binary(data, pos: int, end: int) -> tuple[bytes, int]:
    """Decode Binary Data (section 1.5.6).

    :param data: the buffer.
    :param pos: where the two-byte length starts.
    :param end: the end of the enclosing packet or field.
    :returns: ``(bytes, new position)``.
    :raises MalformedPacket: (0x81) when truncated.
    """
    start = pos + 2
    if start > end:
        raise MalformedPacket("truncated binary data length")
    stop = start + ((data[pos] << 8) | data[pos + 1])
    if stop > end:
        raise MalformedPacket("truncated binary data")
    return bytes(data[start:stop]), stop


# --------------------------------------------------------------------------
# Properties (section 2.2.2)
# --------------------------------------------------------------------------

_BYTE = PropertyType.BYTE
_TWO = PropertyType.TWO_BYTE_INT
_FOUR = PropertyType.FOUR_BYTE_INT
_VBI = PropertyType.VARIABLE_BYTE_INT
_STR = PropertyType.UTF8_STRING
_BIN = PropertyType.BINARY_DATA
_PAIR = PropertyType.UTF8_STRING_PAIR

#: property id → (Property member, wire type); unknown ids are absent.
_BY_ID: dict[int, tuple[Property, PropertyType]] = {
    int(p): (p, t) for p, t in PROPERTY_TYPES.items()
}

#: Byte properties whose only valid values are 0 and 1 (sections 3.1.2.11.6,
#: 3.1.2.11.7, 3.2.2.3.4, 3.2.2.3.5, 3.2.2.3.11 - 3.2.2.3.13, 3.3.2.3.2).
_BOOLEAN = frozenset((
    Property.PAYLOAD_FORMAT_INDICATOR,
    Property.REQUEST_PROBLEM_INFORMATION,
    Property.REQUEST_RESPONSE_INFORMATION,
    Property.MAXIMUM_QOS,
    Property.RETAIN_AVAILABLE,
    Property.WILDCARD_SUBSCRIPTION_AVAILABLE,
    Property.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
    Property.SHARED_SUBSCRIPTION_AVAILABLE,
))

#: Properties for which 0 is a Protocol Error (sections 3.1.2.11.3, 3.1.2.11.4,
#: 3.3.2.3.8).
_NON_ZERO = frozenset((
    Property.RECEIVE_MAXIMUM,
    Property.MAXIMUM_PACKET_SIZE,
    Property.SUBSCRIPTION_IDENTIFIER,
))

#: Properties always held as a list, repeatable or not (Subscription
#: Identifier may appear once only in SUBSCRIBE, section 3.8.2.1.2).
_LIST_VALUED = _ANY_REPEATABLE = frozenset((Property.USER_PROPERTY, Property.SUBSCRIPTION_IDENTIFIER))


def encode_properties(props: dict) -> bytes:
    """Encode a properties dict with its Property Length (section 2.2.2.1).

    Repeatable properties are written once per list item, in list order.

    :param props: the properties; an empty dict encodes as ``b"\\x00"``.
    :returns: the Variable Byte Integer length followed by the properties.
    :raises ValueError: for an unknown property id or a value out of range.
    """
    if not props:
        return b"\x00"
    out = bytearray()
    for prop, value in props.items():
        entry = _BY_ID.get(prop)
        if entry is None:
            raise ValueError(f"unknown property id {prop!r}")
        ptype = entry[1]
        if ptype is _STR:
            out.append(prop)
            out += encode_string(value)
        elif ptype is _FOUR:
            out.append(prop)
            out += _pack_I(value)
        elif ptype is _TWO:
            out.append(prop)
            out += _pack_H(value)
        elif ptype is _BYTE:
            out.append(prop)
            out.append(value)
        elif ptype is _PAIR:
            for name, val in value:
                out.append(prop)
                out += encode_string(name)
                out += encode_string(val)
        elif ptype is _BIN:
            out.append(prop)
            out += encode_binary(value)
        else:  # _VBI: Subscription Identifier, a list
            for item in [value] if isinstance(value, int) else value:
                out.append(prop)
                out += encode_variable_byte_integer(item)
    return encode_variable_byte_integer(len(out)) + bytes(out)


def decode_properties(
    data: bytes | memoryview,
    offset: int,
    packet_type,
    end: int | None = None,
) -> tuple[dict, int]:
    """Decode a Property Length and the properties after it (section 2.2.2).

    :param data: the buffer.
    :param offset: where the Property Length starts.
    :param packet_type: the :class:`~tbmq.mqtt.constants.PacketType` (or
        :data:`~tbmq.mqtt.constants.WILL_PROPERTIES`) whose property set
        applies, or None to accept every property (stored messages).
    :param end: the end of the enclosing packet; defaults to ``len(data)``.
    :returns: ``(properties dict, offset after the properties)``.
    :raises MalformedPacket: 0x81 for truncation, an unknown property id or
        one not valid for the packet type (section 2.2.2.2); 0x82 for a
        second instance of a single-valued property, a value a property may
        not have (0 or 1 flags, non-zero sizes and identifiers), or
        Authentication Data without an Authentication Method (section
        3.1.2.11.10).
    """
    if end is None:
        end = len(data)
    if offset >= end:
        raise MalformedPacket("missing property length")
    length = data[offset]
    if length < 0x80:
        pos = offset + 1
    else:
        length, pos = decode_variable_byte_integer(data, offset, end)
    stop = pos + length
    if stop > end:
        raise MalformedPacket("property length exceeds the packet")
    props: dict = {}
    if not length:
        return props, pos
    if packet_type is None:
        allowed = None
        repeatable = _ANY_REPEATABLE
    else:
        allowed = PACKET_PROPERTIES[packet_type]
        repeatable = REPEATABLE_PROPERTIES[packet_type]
    by_id = _BY_ID
    while pos < stop:
        pid = data[pos]
        pos += 1
        entry = by_id.get(pid)
        if entry is None:
            raise MalformedPacket(f"unknown property id 0x{pid:02x}")
        prop, ptype = entry
        if allowed is not None and prop not in allowed:
            raise MalformedPacket(f"property {prop.name} not valid in this packet")
        if ptype is _STR:
            value, pos = decode_string(data, pos, stop)
        elif ptype is _FOUR:
            if pos + 4 > stop:
                raise MalformedPacket("truncated four byte integer property")
            value = _unpack_I(data, pos)[0]
            pos += 4
        elif ptype is _TWO:
            if pos + 2 > stop:
                raise MalformedPacket("truncated two byte integer property")
            value = (data[pos] << 8) | data[pos + 1]
            pos += 2
        elif ptype is _BYTE:
            if pos >= stop:
                raise MalformedPacket("truncated byte property")
            value = data[pos]
            pos += 1
        elif ptype is _PAIR:
            name, pos = decode_string(data, pos, stop)
            val, pos = decode_string(data, pos, stop)
            value = (name, val)
        elif ptype is _BIN:
            value, pos = decode_binary(data, pos, stop)
        else:
            value, pos = decode_variable_byte_integer(data, pos, stop)
        if prop in _BOOLEAN:
            if value > 1:
                raise MalformedPacket(f"{prop.name} must be 0 or 1", PROTOCOL_ERROR)
        elif prop in _NON_ZERO and not value:
            raise MalformedPacket(f"{prop.name} must not be 0", PROTOCOL_ERROR)
        if prop in props:
            if prop not in repeatable:
                raise MalformedPacket(f"property {prop.name} included twice", PROTOCOL_ERROR)
            props[prop].append(value)
        elif prop in _LIST_VALUED:
            props[prop] = [value]
        else:
            props[prop] = value
    if Property.AUTHENTICATION_DATA in props and Property.AUTHENTICATION_METHOD not in props:
        raise MalformedPacket("authentication data without a method", PROTOCOL_ERROR)
    return props, pos


def pack_properties(props: dict) -> bytes:
    """Serialize a properties dict on its own, e.g. to store a message.

    Same bytes as :func:`encode_properties` (length prefix included); any
    property is accepted regardless of packet type.

    :param props: the properties.
    :returns: bytes that :func:`unpack_properties` turns back into ``props``
        (a repeatable property given as an empty list is omitted).
    :raises ValueError: for an unknown property id or a value out of range.
    """
    return encode_properties(props)


def unpack_properties(data: bytes) -> dict:
    """Inverse of :func:`pack_properties`.

    :param data: bytes from :func:`pack_properties`.
    :returns: the properties dict.
    :raises MalformedPacket: for truncated, trailing or invalid data.
    """
    props, pos = decode_properties(data, 0, None)
    if pos != len(data):
        raise MalformedPacket("trailing bytes after properties")
    return props
