"""MQTT constants: packet types, protocol levels, reason codes, property ids.

Everything here is immutable data; nothing is computed at run time except the
lookup tables built once at import; two one-line helpers read them
(:func:`is_failure`, :func:`connack_return_code`).

Spec references are to MQTT 5.0 (OASIS Standard, 7 March 2019) unless a
statement names MQTT 3.1.1 (OASIS Standard, 29 October 2014) or MQTT 3.1
(IBM/Eurotech, 2010).
"""

from __future__ import annotations

from enum import IntEnum
from types import MappingProxyType
from typing import Final, Mapping

__all__ = [
    "PacketType",
    "MQTT_3_1",
    "MQTT_3_1_1",
    "MQTT_5",
    "PROTOCOL_NAMES",
    "SUPPORTED_PROTOCOLS",
    "ReasonCode",
    "ConnackReturnCode",
    "SubackReturnCode",
    "Property",
    "PropertyType",
    "PROPERTY_TYPES",
    "WILL_PROPERTIES",
    "PROPERTY_PACKET_TYPES",
    "PACKET_PROPERTIES",
    "REPEATABLE_PROPERTIES",
    "REASON_CODES",
    "V3_CONNACK_RETURN_CODES",
    "is_failure",
    "connack_return_code",
    "MAX_PACKET_SIZE",
    "MAX_VARIABLE_BYTE_INTEGER",
]


class PacketType(IntEnum):
    """MQTT control packet types, the high nibble of the fixed header's first
    byte (section 2.1.2). The value 0 is reserved and forbidden."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


#: MQTT 3.1, protocol name ``"MQIsdp"``.
MQTT_3_1: Final = 3
#: MQTT 3.1.1, protocol name ``"MQTT"``.
MQTT_3_1_1: Final = 4
#: MQTT 5.0, protocol name ``"MQTT"``.
MQTT_5: Final = 5

#: The protocol name each supported protocol level uses in CONNECT
#: [MQTT-3.1.2-1].
PROTOCOL_NAMES: Final[Mapping[int, str]] = MappingProxyType(
    {MQTT_3_1: "MQIsdp", MQTT_3_1_1: "MQTT", MQTT_5: "MQTT"}
)

#: The (protocol name, protocol level) pairs this codec decodes fully.
SUPPORTED_PROTOCOLS: Final = frozenset((name, level) for level, name in PROTOCOL_NAMES.items())

#: The largest value a Variable Byte Integer can hold (section 1.5.5).
MAX_VARIABLE_BYTE_INTEGER: Final = 268_435_455

#: The largest MQTT packet: a 5-byte fixed header and the largest remaining
#: length (section 2.1.4).
MAX_PACKET_SIZE: Final = 268_435_460


class ReasonCode(IntEnum):
    """MQTT 5.0 reason codes (section 2.4), with aliases for shared values."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class ConnackReturnCode(IntEnum):
    """MQTT 3.1 / 3.1.1 CONNACK return codes (3.1.1 section 3.2.2.3, table
    3.1): 0 accepts the connection, 1-5 refuse it and the server closes the
    connection [MQTT-3.2.2-5]; a refusal none of them names is a close
    without CONNACK [MQTT-3.2.2-6]."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USERNAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


class SubackReturnCode(IntEnum):
    """MQTT 3.1 / 3.1.1 SUBACK return codes (3.1.1 section 3.9.3); 3.1 has no
    FAILURE."""

    MAXIMUM_QOS_0 = 0x00
    MAXIMUM_QOS_1 = 0x01
    MAXIMUM_QOS_2 = 0x02
    FAILURE = 0x80


class Property(IntEnum):
    """MQTT 5.0 property identifiers (section 2.2.2.2)."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


class PropertyType(IntEnum):
    """The data representations a property value can have (section 1.5)."""

    BYTE = 1
    TWO_BYTE_INT = 2
    FOUR_BYTE_INT = 3
    VARIABLE_BYTE_INT = 4
    UTF8_STRING = 5
    BINARY_DATA = 6
    UTF8_STRING_PAIR = 7


#: Pseudo packet type for the Will Properties of a CONNECT payload
#: (section 3.1.3.2). 0 is never a real packet type (it is reserved).
WILL_PROPERTIES: Final = 0

_P = Property
_T = PropertyType
_C = PacketType

#: The wire type of every property (section 2.2.2.2, table 2-4).
PROPERTY_TYPES = {
    _P.PAYLOAD_FORMAT_INDICATOR: _T.BYTE,
    _P.MESSAGE_EXPIRY_INTERVAL: _T.FOUR_BYTE_INT,
    _P.CONTENT_TYPE: _T.UTF8_STRING,
    _P.RESPONSE_TOPIC: _T.UTF8_STRING,
    _P.CORRELATION_DATA: _T.BINARY_DATA,
    _P.SUBSCRIPTION_IDENTIFIER: _T.VARIABLE_BYTE_INT,
    _P.SESSION_EXPIRY_INTERVAL: _T.FOUR_BYTE_INT,
    _P.ASSIGNED_CLIENT_IDENTIFIER: _T.UTF8_STRING,
    _P.SERVER_KEEP_ALIVE: _T.TWO_BYTE_INT,
    _P.AUTHENTICATION_METHOD: _T.UTF8_STRING,
    _P.AUTHENTICATION_DATA: _T.BINARY_DATA,
    _P.REQUEST_PROBLEM_INFORMATION: _T.BYTE,
    _P.WILL_DELAY_INTERVAL: _T.FOUR_BYTE_INT,
    _P.REQUEST_RESPONSE_INFORMATION: _T.BYTE,
    _P.RESPONSE_INFORMATION: _T.UTF8_STRING,
    _P.SERVER_REFERENCE: _T.UTF8_STRING,
    _P.REASON_STRING: _T.UTF8_STRING,
    _P.RECEIVE_MAXIMUM: _T.TWO_BYTE_INT,
    _P.TOPIC_ALIAS_MAXIMUM: _T.TWO_BYTE_INT,
    _P.TOPIC_ALIAS: _T.TWO_BYTE_INT,
    _P.MAXIMUM_QOS: _T.BYTE,
    _P.RETAIN_AVAILABLE: _T.BYTE,
    _P.USER_PROPERTY: _T.UTF8_STRING_PAIR,
    _P.MAXIMUM_PACKET_SIZE: _T.FOUR_BYTE_INT,
    _P.WILDCARD_SUBSCRIPTION_AVAILABLE: _T.BYTE,
    _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: _T.BYTE,
    _P.SHARED_SUBSCRIPTION_AVAILABLE: _T.BYTE,
}

_ACKS = (_C.PUBACK, _C.PUBREC, _C.PUBREL, _C.PUBCOMP)

#: The packet types (and :data:`WILL_PROPERTIES`) that may carry each property
#: (section 2.2.2.2, table 2-4).
PROPERTY_PACKET_TYPES = {
    prop: frozenset(types)
    for prop, types in {
        _P.PAYLOAD_FORMAT_INDICATOR: (_C.PUBLISH, WILL_PROPERTIES),
        _P.MESSAGE_EXPIRY_INTERVAL: (_C.PUBLISH, WILL_PROPERTIES),
        _P.CONTENT_TYPE: (_C.PUBLISH, WILL_PROPERTIES),
        _P.RESPONSE_TOPIC: (_C.PUBLISH, WILL_PROPERTIES),
        _P.CORRELATION_DATA: (_C.PUBLISH, WILL_PROPERTIES),
        _P.SUBSCRIPTION_IDENTIFIER: (_C.PUBLISH, _C.SUBSCRIBE),
        _P.SESSION_EXPIRY_INTERVAL: (_C.CONNECT, _C.CONNACK, _C.DISCONNECT),
        _P.ASSIGNED_CLIENT_IDENTIFIER: (_C.CONNACK,),
        _P.SERVER_KEEP_ALIVE: (_C.CONNACK,),
        _P.AUTHENTICATION_METHOD: (_C.CONNECT, _C.CONNACK, _C.AUTH),
        _P.AUTHENTICATION_DATA: (_C.CONNECT, _C.CONNACK, _C.AUTH),
        _P.REQUEST_PROBLEM_INFORMATION: (_C.CONNECT,),
        _P.WILL_DELAY_INTERVAL: (WILL_PROPERTIES,),
        _P.REQUEST_RESPONSE_INFORMATION: (_C.CONNECT,),
        _P.RESPONSE_INFORMATION: (_C.CONNACK,),
        _P.SERVER_REFERENCE: (_C.CONNACK, _C.DISCONNECT),
        _P.REASON_STRING: (
            _C.CONNACK, *_ACKS, _C.SUBACK, _C.UNSUBACK, _C.DISCONNECT, _C.AUTH,
        ),
        _P.RECEIVE_MAXIMUM: (_C.CONNECT, _C.CONNACK),
        _P.TOPIC_ALIAS_MAXIMUM: (_C.CONNECT, _C.CONNACK),
        _P.TOPIC_ALIAS: (_C.PUBLISH,),
        _P.MAXIMUM_QOS: (_C.CONNACK,),
        _P.RETAIN_AVAILABLE: (_C.CONNACK,),
        _P.USER_PROPERTY: (
            _C.CONNECT, _C.CONNACK, _C.PUBLISH, WILL_PROPERTIES, *_ACKS,
            _C.SUBSCRIBE, _C.SUBACK, _C.UNSUBSCRIBE, _C.UNSUBACK, _C.DISCONNECT,
            _C.AUTH,
        ),
        _P.MAXIMUM_PACKET_SIZE: (_C.CONNECT, _C.CONNACK),
        _P.WILDCARD_SUBSCRIPTION_AVAILABLE: (_C.CONNACK,),
        _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: (_C.CONNACK,),
        _P.SHARED_SUBSCRIPTION_AVAILABLE: (_C.CONNACK,),
    }.items()
}

#: The inverse of :data:`PROPERTY_PACKET_TYPES`: packet type (or
#: :data:`WILL_PROPERTIES`) → the properties it may carry.
PACKET_PROPERTIES = {
    ptype: frozenset(p for p, types in PROPERTY_PACKET_TYPES.items() if ptype in types)
    for ptype in (WILL_PROPERTIES, *PacketType)
}

#: Properties that may appear more than once, per packet type: User Property
#: everywhere (section 3.1.2.11.8 and others), Subscription Identifier only in
#: PUBLISH (section 3.3.2.3.8; once in SUBSCRIBE, section 3.8.2.1.2). Always
#: held as a list in a properties dict.
REPEATABLE_PROPERTIES = {
    ptype: (
        frozenset((_P.USER_PROPERTY, _P.SUBSCRIPTION_IDENTIFIER))
        if ptype == _C.PUBLISH
        else frozenset((_P.USER_PROPERTY,))
    )
    for ptype in (WILL_PROPERTIES, *PacketType)
}

_R = ReasonCode

#: The MQTT 5.0 reason codes each packet type may carry (section 2.4, table 2-6
#: and the reason code tables of sections 3.2.2.2, 3.4.2.1, 3.5.2.1, 3.6.2.1,
#: 3.7.2.1, 3.9.3, 3.11.3, 3.14.2.1, 3.15.2.1).
REASON_CODES = {
    _C.CONNACK: frozenset((
        _R.SUCCESS, _R.UNSPECIFIED_ERROR, _R.MALFORMED_PACKET, _R.PROTOCOL_ERROR,
        _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.UNSUPPORTED_PROTOCOL_VERSION,
        _R.CLIENT_IDENTIFIER_NOT_VALID, _R.BAD_USER_NAME_OR_PASSWORD,
        _R.NOT_AUTHORIZED, _R.SERVER_UNAVAILABLE, _R.SERVER_BUSY, _R.BANNED,
        _R.BAD_AUTHENTICATION_METHOD, _R.TOPIC_NAME_INVALID, _R.PACKET_TOO_LARGE,
        _R.QUOTA_EXCEEDED, _R.PAYLOAD_FORMAT_INVALID, _R.RETAIN_NOT_SUPPORTED,
        _R.QOS_NOT_SUPPORTED, _R.USE_ANOTHER_SERVER, _R.SERVER_MOVED,
        _R.CONNECTION_RATE_EXCEEDED,
    )),
    _C.PUBACK: frozenset((
        _R.SUCCESS, _R.NO_MATCHING_SUBSCRIBERS, _R.UNSPECIFIED_ERROR,
        _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.NOT_AUTHORIZED, _R.TOPIC_NAME_INVALID,
        _R.PACKET_IDENTIFIER_IN_USE, _R.QUOTA_EXCEEDED, _R.PAYLOAD_FORMAT_INVALID,
    )),
    _C.PUBREL: frozenset((_R.SUCCESS, _R.PACKET_IDENTIFIER_NOT_FOUND)),
    _C.SUBACK: frozenset((
        _R.GRANTED_QOS_0, _R.GRANTED_QOS_1, _R.GRANTED_QOS_2, _R.UNSPECIFIED_ERROR,
        _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.NOT_AUTHORIZED, _R.TOPIC_FILTER_INVALID,
        _R.PACKET_IDENTIFIER_IN_USE, _R.QUOTA_EXCEEDED,
        _R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
        _R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
        _R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
    )),
    _C.UNSUBACK: frozenset((
        _R.SUCCESS, _R.NO_SUBSCRIPTION_EXISTED, _R.UNSPECIFIED_ERROR,
        _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.NOT_AUTHORIZED, _R.TOPIC_FILTER_INVALID,
        _R.PACKET_IDENTIFIER_IN_USE,
    )),
    _C.DISCONNECT: frozenset((
        _R.NORMAL_DISCONNECTION, _R.DISCONNECT_WITH_WILL_MESSAGE,
        _R.UNSPECIFIED_ERROR, _R.MALFORMED_PACKET, _R.PROTOCOL_ERROR,
        _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.NOT_AUTHORIZED, _R.SERVER_BUSY,
        _R.SERVER_SHUTTING_DOWN, _R.KEEP_ALIVE_TIMEOUT, _R.SESSION_TAKEN_OVER,
        _R.TOPIC_FILTER_INVALID, _R.TOPIC_NAME_INVALID, _R.RECEIVE_MAXIMUM_EXCEEDED,
        _R.TOPIC_ALIAS_INVALID, _R.PACKET_TOO_LARGE, _R.MESSAGE_RATE_TOO_HIGH,
        _R.QUOTA_EXCEEDED, _R.ADMINISTRATIVE_ACTION, _R.PAYLOAD_FORMAT_INVALID,
        _R.RETAIN_NOT_SUPPORTED, _R.QOS_NOT_SUPPORTED, _R.USE_ANOTHER_SERVER,
        _R.SERVER_MOVED, _R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
        _R.CONNECTION_RATE_EXCEEDED, _R.MAXIMUM_CONNECT_TIME,
        _R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
        _R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
    )),
    _C.AUTH: frozenset((_R.SUCCESS, _R.CONTINUE_AUTHENTICATION, _R.RE_AUTHENTICATE)),
}
REASON_CODES[_C.PUBREC] = REASON_CODES[_C.PUBACK]
REASON_CODES[_C.PUBCOMP] = REASON_CODES[_C.PUBREL]

_V3 = ConnackReturnCode

#: The MQTT 3.1 / 3.1.1 CONNACK return code (3.1.1 section 3.2.2.3) a v3
#: client gets where a v5 client gets the CONNACK reason code of the key
#: (MQTT 5.0 section 3.2.2.2): the refusals the broker makes.  The will
#: defects (TOPIC_NAME_INVALID, QOS_NOT_SUPPORTED, RETAIN_NOT_SUPPORTED,
#: PAYLOAD_FORMAT_INVALID), MALFORMED_PACKET and PROTOCOL_ERROR have no
#: return code: a v3 client is closed without CONNACK [MQTT-3.2.2-6].
V3_CONNACK_RETURN_CODES = {
    _R.SUCCESS: _V3.ACCEPTED,
    _R.UNSUPPORTED_PROTOCOL_VERSION: _V3.UNACCEPTABLE_PROTOCOL_VERSION,
    _R.CLIENT_IDENTIFIER_NOT_VALID: _V3.IDENTIFIER_REJECTED,
    _R.BAD_USER_NAME_OR_PASSWORD: _V3.BAD_USERNAME_OR_PASSWORD,
    _R.NOT_AUTHORIZED: _V3.NOT_AUTHORIZED,
    _R.BAD_AUTHENTICATION_METHOD: _V3.NOT_AUTHORIZED,
    _R.BANNED: _V3.NOT_AUTHORIZED,
    _R.UNSPECIFIED_ERROR: _V3.SERVER_UNAVAILABLE,
    _R.IMPLEMENTATION_SPECIFIC_ERROR: _V3.SERVER_UNAVAILABLE,
    _R.SERVER_UNAVAILABLE: _V3.SERVER_UNAVAILABLE,
    _R.SERVER_BUSY: _V3.SERVER_UNAVAILABLE,
    _R.QUOTA_EXCEEDED: _V3.SERVER_UNAVAILABLE,
    _R.CONNECTION_RATE_EXCEEDED: _V3.SERVER_UNAVAILABLE,
    _R.USE_ANOTHER_SERVER: _V3.SERVER_UNAVAILABLE,
    _R.SERVER_MOVED: _V3.SERVER_UNAVAILABLE,
}


def is_failure(reason_code: int) -> bool:
    """Whether a reason code reports a failure: 0x80 (UNSPECIFIED_ERROR) or
    greater (section 2.4); below it, success or a kind of success.

    :param reason_code: an MQTT 5.0 reason code, ``int`` 0-255.
    :returns: True for a failure.
    """
    return reason_code >= ReasonCode.UNSPECIFIED_ERROR


def connack_return_code(reason_code: int) -> ConnackReturnCode:
    """The MQTT 3.1 / 3.1.1 CONNACK return code for a refusal the broker
    names with an MQTT 5.0 CONNACK reason code
    (:data:`V3_CONNACK_RETURN_CODES`).

    :param reason_code: an MQTT 5.0 CONNACK reason code, ``int``.
    :returns: its :class:`ConnackReturnCode`; NOT_AUTHORIZED for a code the
        table does not hold (one an authentication provider chose).
    """
    return V3_CONNACK_RETURN_CODES.get(reason_code, ConnackReturnCode.NOT_AUTHORIZED)


# Read-only views: these tables are shared by every connection.
PROPERTY_TYPES: Mapping[Property, PropertyType] = MappingProxyType(PROPERTY_TYPES)
PROPERTY_PACKET_TYPES: Mapping[Property, frozenset[int]] = MappingProxyType(PROPERTY_PACKET_TYPES)
PACKET_PROPERTIES: Mapping[int, frozenset[Property]] = MappingProxyType(PACKET_PROPERTIES)
REPEATABLE_PROPERTIES: Mapping[int, frozenset[Property]] = MappingProxyType(REPEATABLE_PROPERTIES)
REASON_CODES: Mapping[int, frozenset[int]] = MappingProxyType(REASON_CODES)
V3_CONNACK_RETURN_CODES: Mapping[int, ConnackReturnCode] = MappingProxyType(V3_CONNACK_RETURN_CODES)

del _P, _T, _C, _R, _V3, _ACKS
