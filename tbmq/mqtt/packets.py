"""MQTT control packets as plain dataclasses.

One class per packet type (section 3 of MQTT 5.0), the same classes for every
protocol level: fields a level does not have on the wire (properties and reason
codes before 5.0) are simply left at their defaults by the decoder and ignored
by the encoder.

Properties are a plain ``dict`` mapping :class:`~tbmq.mqtt.constants.Property`
to its value: ``int`` for integer properties, ``str`` for UTF-8 strings,
``bytes`` for binary data (Correlation Data, Authentication Data). The two
properties that may repeat are always lists: ``Property.USER_PROPERTY`` →
``list[tuple[str, str]]`` (wire order kept, section 3.3.2.3.7) and
``Property.SUBSCRIPTION_IDENTIFIER`` → ``list[int]`` (even in SUBSCRIBE, where
only one is allowed).

Packets compare with ``==``; they carry a class attribute ``packet_type``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Union

from .constants import PacketType

__all__ = [
    "Will",
    "Connect",
    "Connack",
    "Publish",
    "Puback",
    "Pubrec",
    "Pubrel",
    "Pubcomp",
    "SubscriptionRequest",
    "Subscribe",
    "Suback",
    "Unsubscribe",
    "Unsuback",
    "Pingreq",
    "Pingresp",
    "Disconnect",
    "Auth",
    "Packet",
]


@dataclass(slots=True)
class Will:
    """The Will Message of a CONNECT (section 3.1.2.5 - 3.1.2.7, 3.1.3.2 -
    3.1.3.4).

    :param topic: the Will Topic.
    :param payload: the Will Payload.
    :param qos: the Will QoS, 0 to 2.
    :param retain: the Will Retain flag.
    :param properties: the Will Properties (MQTT 5.0 only).
    """

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    """CONNECT, client to server (section 3.1).

    A CONNECT whose protocol name and level are not one of ``("MQIsdp", 3)``,
    ``("MQTT", 4)``, ``("MQTT", 5)`` is decoded only as far as the level, the
    other fields keep their defaults (the broker answers CONNACK 0x01 / 0x84,
    [MQTT-3.1.2-2]).

    :param protocol_name: ``"MQTT"`` or ``"MQIsdp"`` (3.1).
    :param protocol_level: 3, 4 or 5.
    :param clean_start: Clean Session (3.x) / Clean Start (5.0).
    :param keep_alive: the Keep Alive in seconds.
    :param client_id: the Client Identifier, possibly empty.
    :param will: the Will Message, or None when the Will Flag is 0.
    :param username: the User Name, or None when the flag is 0.
    :param password: the Password, or None when the flag is 0.
    :param properties: CONNECT properties (5.0).
    """

    packet_type: ClassVar[PacketType] = PacketType.CONNECT
    protocol_name: str = "MQTT"
    protocol_level: int = 4
    clean_start: bool = True
    keep_alive: int = 0
    client_id: str = ""
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class Connack:
    """CONNACK, server to client (section 3.2).

    :param session_present: the Session Present flag (not on the wire in 3.1).
    :param reason_code: the 5.0 reason code, or the 3.x return code
        (:class:`~tbmq.mqtt.constants.ConnackReturnCode`).
    :param properties: CONNACK properties (5.0).
    """

    packet_type: ClassVar[PacketType] = PacketType.CONNACK
    session_present: bool = False
    reason_code: int = 0
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    """PUBLISH, both directions (section 3.3).

    :param topic: the Topic Name; may be ``""`` in 5.0 when a Topic Alias
        property is present (section 3.3.2.3.4).
    :param payload: the application message.
    :param qos: 0, 1 or 2.
    :param retain: the RETAIN flag.
    :param dup: the DUP flag.
    :param packet_id: the Packet Identifier, None for QoS 0 [MQTT-2.2.1-2].
    :param properties: PUBLISH properties (5.0).
    """

    packet_type: ClassVar[PacketType] = PacketType.PUBLISH
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: dict = field(default_factory=dict)


#: the properties of an acknowledgement made by :meth:`_Acknowledgement.
#: of_packet_id`: shared, never written
_NO_PROPERTIES: dict = {}


class _Acknowledgement:
    """What PUBACK, PUBREC, PUBREL and PUBCOMP share (their fields are
    ``packet_id``, ``reason_code``, ``properties``)."""

    __slots__ = ()

    @classmethod
    def of_packet_id(cls, packet_id: int):
        """The acknowledgement of ``packet_id`` alone (reason code 0 =
        Success, no properties), made field by field: equal to
        ``cls(packet_id)``, without the dataclass ``__init__``'s frame and
        its new properties dict (a drain reads one acknowledgement per
        message).  Its ``properties`` is an empty dict shared by all of
        them: not to be written.

        :param packet_id: the Packet Identifier, 1 to 65535."""
        packet = object.__new__(cls)
        packet.packet_id = packet_id
        packet.reason_code = 0
        packet.properties = _NO_PROPERTIES
        return packet


@dataclass(slots=True)
class Puback(_Acknowledgement):
    """PUBACK, the QoS 1 acknowledgement (section 3.4).

    :param packet_id: the Packet Identifier of the PUBLISH.
    :param reason_code: the 5.0 reason code (ignored before 5.0).
    :param properties: PUBACK properties (5.0).
    """

    packet_type: ClassVar[PacketType] = PacketType.PUBACK
    packet_id: int
    reason_code: int = 0
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class Pubrec(_Acknowledgement):
    """PUBREC, QoS 2 part 1 (section 3.5). Fields as :class:`Puback`."""

    packet_type: ClassVar[PacketType] = PacketType.PUBREC
    packet_id: int
    reason_code: int = 0
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class Pubrel(_Acknowledgement):
    """PUBREL, QoS 2 part 2 (section 3.6). Fields as :class:`Puback`."""

    packet_type: ClassVar[PacketType] = PacketType.PUBREL
    packet_id: int
    reason_code: int = 0
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class Pubcomp(_Acknowledgement):
    """PUBCOMP, QoS 2 part 3 (section 3.7). Fields as :class:`Puback`."""

    packet_type: ClassVar[PacketType] = PacketType.PUBCOMP
    packet_id: int
    reason_code: int = 0
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class SubscriptionRequest:
    """One Topic Filter and its Subscription Options (section 3.8.3.1).

    :param topic_filter: the Topic Filter (possibly ``$share/...``).
    :param qos: the Maximum QoS, 0 to 2.
    :param no_local: the No Local option (5.0).
    :param retain_as_published: the Retain As Published option (5.0).
    :param retain_handling: the Retain Handling option, 0 to 2 (5.0).
    """

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    """SUBSCRIBE, client to server (section 3.8).

    :param packet_id: the Packet Identifier, non-zero [MQTT-2.2.1-3].
    :param subscriptions: one or more requests [MQTT-3.8.3-2].
    :param properties: SUBSCRIBE properties (5.0).
    """

    packet_type: ClassVar[PacketType] = PacketType.SUBSCRIBE
    packet_id: int
    subscriptions: list[SubscriptionRequest]
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class Suback:
    """SUBACK, server to client (section 3.9).

    :param packet_id: the Packet Identifier of the SUBSCRIBE.
    :param reason_codes: one per requested filter; 3.x return codes are 0, 1,
        2 and 0x80.
    :param properties: SUBACK properties (5.0).
    """

    packet_type: ClassVar[PacketType] = PacketType.SUBACK
    packet_id: int
    reason_codes: list[int]
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    """UNSUBSCRIBE, client to server (section 3.10).

    :param packet_id: the Packet Identifier, non-zero [MQTT-2.2.1-3].
    :param topic_filters: one or more filters [MQTT-3.10.3-2].
    :param properties: UNSUBSCRIBE properties (5.0).
    """

    packet_type: ClassVar[PacketType] = PacketType.UNSUBSCRIBE
    packet_id: int
    topic_filters: list[str]
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class Unsuback:
    """UNSUBACK, server to client (section 3.11).

    :param packet_id: the Packet Identifier of the UNSUBSCRIBE.
    :param reason_codes: one per filter, on the wire in 5.0 only (3.x decodes
        to ``[]``).
    :param properties: UNSUBACK properties (5.0).
    """

    packet_type: ClassVar[PacketType] = PacketType.UNSUBACK
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class Pingreq:
    """PINGREQ, client to server (section 3.12)."""

    packet_type: ClassVar[PacketType] = PacketType.PINGREQ


@dataclass(slots=True)
class Pingresp:
    """PINGRESP, server to client (section 3.13)."""

    packet_type: ClassVar[PacketType] = PacketType.PINGRESP


@dataclass(slots=True)
class Disconnect:
    """DISCONNECT, client to server (both directions in 5.0, section 3.14).

    :param reason_code: the 5.0 reason code (ignored before 5.0).
    :param properties: DISCONNECT properties (5.0).
    """

    packet_type: ClassVar[PacketType] = PacketType.DISCONNECT
    reason_code: int = 0
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    """AUTH, both directions, MQTT 5.0 only (section 3.15).

    :param reason_code: 0x00, 0x18 or 0x19.
    :param properties: AUTH properties.
    """

    packet_type: ClassVar[PacketType] = PacketType.AUTH
    reason_code: int = 0
    properties: dict = field(default_factory=dict)


Packet = Union[
    Connect,
    Connack,
    Publish,
    Puback,
    Pubrec,
    Pubrel,
    Pubcomp,
    Subscribe,
    Suback,
    Unsubscribe,
    Unsuback,
    Pingreq,
    Pingresp,
    Disconnect,
    Auth,
]
