"""Plain records shared by the broker and its backends.

These are the values that cross the interfaces of :mod:`tbmq.interfaces`: they
speak of topics, client ids, bytes and MQTT properties, never of a storage or
transport type.  Properties are the ``dict`` of :mod:`tbmq.mqtt.packets`
(``Property`` → value, with ``USER_PROPERTY`` and ``SUBSCRIPTION_IDENTIFIER``
always lists).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ClientType(str, enum.Enum):
    """TBMQ's client types: a DEVICE publishes and receives few messages,
    an APPLICATION consumes many.  A non-persistent client is always a DEVICE."""

    DEVICE = "DEVICE"
    APPLICATION = "APPLICATION"


@dataclass(slots=True)
class Message:
    """An application message as it travels on ``tbmq.msg.all``.

    :ivar topic: the topic name (aliases already resolved).
    :ivar payload: the application payload, bytes.
    :ivar qos: the QoS it was published with (0, 1, 2).
    :ivar retain: the RETAIN flag as published.
    :ivar properties: the v5 properties forwarded to subscribers
        (``TOPIC_ALIAS`` and ``SUBSCRIPTION_IDENTIFIER`` removed;
        ``MESSAGE_EXPIRY_INTERVAL`` as published).
    :ivar publisher: the client id of the publisher ("" for a will or a
        system message without one).
    :ivar received_at: wall-clock time of receipt, seconds since the epoch.
    :ivar expires_at: wall-clock time at which it expires, or None for never
        (from the message expiry interval, [MQTT-3.3.2-5]).
    :ivar wire: None, or the ``msg`` array (``tuple``) the bus record this
        message was read from carried, or the one first written for it, or
        made with it from a run of PUBLISHes
        (:func:`tbmq.cluster.message_arrays.published_messages`; see
        :mod:`tbmq.cluster.records`): a node that passes the message on (a
        routing node's downlink deliveries) writes that array again as it
        is instead of encoding the fields anew.  Not an argument, not
        compared; a message is never changed once made, so the array stays
        its encoding.
    :ivar template: None, or ``(before, after)`` (``bytes`` each): the
        msgpack bytes of :attr:`wire` before and after the payload, one
        tuple shared by the messages of a run of PUBLISHes of one topic,
        QoS, RETAIN flag and payload size
        (:func:`tbmq.cluster.message_arrays.published_messages`): where the
        run's arrays would be packed, each message's bytes are ``before``,
        its payload and ``after``, joined
        (:func:`~tbmq.cluster.message_arrays.templated`).  Not an argument,
        not compared.
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: dict = field(default_factory=dict)
    publisher: str = ""
    received_at: float = 0.0
    expires_at: float | None = None
    wire: tuple | None = field(default=None, init=False, repr=False, compare=False)
    template: tuple | None = field(default=None, init=False, repr=False, compare=False)


@dataclass(slots=True, frozen=True)
class SubscriptionOptions:
    """One subscription of a client, as SUBSCRIBE gave it [MQTT-3.8.3].

    :ivar qos: the maximum QoS granted (0, 1, 2).
    :ivar no_local: do not send the client its own messages [MQTT-3.8.3-3].
    :ivar retain_as_published: keep the RETAIN flag when forwarding.
    :ivar retain_handling: 0 send retained on subscribe, 1 only for a new
        subscription, 2 never.
    :ivar subscription_id: the v5 subscription identifier, or None.
    :ivar subscription_ids: ``(subscription_id,)``, or ``()`` without one:
        what a delivery through this subscription carries [MQTT-3.3.4-3]
        (derived, made once).
    """

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None
    subscription_ids: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sid = self.subscription_id
        object.__setattr__(self, "subscription_ids", () if sid is None else (sid,))


class DeliveryState(enum.IntEnum):
    """Where a queued message of a persistent session is in its QoS flow."""

    QUEUED = 0  #: not sent yet, no packet identifier
    SENT = 1  #: PUBLISH sent with ``packet_id``; waiting for PUBACK / PUBREC
    RELEASED = 2  #: QoS 2: PUBREC received, PUBREL sent; waiting for PUBCOMP


@dataclass(slots=True)
class StoredDelivery:
    """One message queued for, or in flight to, a persistent session.

    :ivar seq: the message's order key within the session, unique per client
        id and increasing in delivery order.
    :ivar message: the message (``qos`` already downgraded to the subscription's).
    :ivar qos: the QoS of the delivery to this subscriber.
    :ivar retain: the RETAIN flag to send.
    :ivar subscription_ids: the matching subscriptions' identifiers.
    :ivar packet_id: the packet identifier once sent, else None.
    :ivar state: see :class:`DeliveryState`.
    """

    seq: int
    message: Message
    qos: int
    retain: bool = False
    subscription_ids: tuple[int, ...] = ()
    packet_id: int | None = None
    state: DeliveryState = DeliveryState.QUEUED


class CredentialsType(str, enum.Enum):
    """TBMQ's credential types (``mqtt_client_credentials.credentials_type``)."""

    MQTT_BASIC = "MQTT_BASIC"  #: client id and/or username, bcrypt password
    X_509 = "X_509"  #: client certificate chain, matched by CN or regex
    SCRAM = "SCRAM"  #: SCRAM-SHA-256/512 through MQTT 5 AUTH


@dataclass(slots=True)
class Credentials:
    """One row of TBMQ's ``mqtt_client_credentials``.

    :ivar id: a UUID string.
    :ivar name: a human-readable name, unique.
    :ivar credentials_type: see :class:`CredentialsType`.
    :ivar credentials_id: the lookup key (TBMQ's): for MQTT_BASIC
        ``"username|<u>"``, ``"client_id|<c>"`` or ``"mixed|<c>|<u>"``; for
        X_509 the certificate CN (or the CN regex when ``certCnIsRegex``); for
        SCRAM ``"scram|<SHA256|SHA512>|<u>"``.  Unique per type.
    :ivar client_type: DEVICE or APPLICATION for clients authenticated by it.
    :ivar value: the type's JSON document (TBMQ's ``credentials_value``):
        MQTT_BASIC ``{"clientId", "userName", "password" (bcrypt hash or
        null), "authRules"}``; X_509 ``{"certCnPattern", "certCnIsRegex",
        "authRules"}``; SCRAM ``{"userName", "algorithm", "salt",
        "storedKey", "serverKey", "iterations", "authRules"}`` (bytes as
        base64).  ``authRules`` is ``{"pubAuthRulePatterns": [regex, ...],
        "subAuthRulePatterns": [regex, ...]}``; a missing list means no
        restriction, an empty one allows nothing.
    :ivar created_time: seconds since the epoch.
    :ivar updated_time: seconds since the epoch; changes on every save.
    """

    id: str
    name: str
    credentials_type: CredentialsType
    credentials_id: str
    client_type: ClientType = ClientType.DEVICE
    value: dict = field(default_factory=dict)
    created_time: float = 0.0
    updated_time: float = 0.0
