"""How an :class:`~tbmq.broker.outbox.Outbox` encodes its PUBLISHes: the
encoding of a message for a client's protocol level (:func:`encode_for`).
"""

from __future__ import annotations

import math

from tbmq.model import Message
from tbmq.mqtt import MQTT_5, Property
from tbmq.mqtt.codec import encode_publish_fields

__all__ = ["encode_for"]


def encode_for(message: Message, qos: int, retain: bool, subscription_ids: tuple[int, ...],
               now: float, level: int, dup: bool, packet_id: int | None,
               alias: int = 0, alias_known: bool = False) -> bytes:
    """The PUBLISH of ``message`` for a client of protocol ``level``: v5
    properties without the publisher's topic alias, with the subscription
    identifiers [MQTT-3.3.4-3] and the expiry interval left [MQTT-3.3.2-6].

    :param now: seconds since the epoch.
    :param packet_id: for QoS 1/2; ignored for QoS 0.
    :param alias: v5: the Topic Alias the broker gives the topic on this
        connection, or 0 for none.
    :param alias_known: the client already maps ``alias`` to the topic: the
        Topic Name is sent empty (§3.3.2.3.4).
    """
    props = None
    topic = message.topic
    if level >= MQTT_5:
        props = message.properties
        if (subscription_ids or message.expires_at is not None or alias
                or Property.TOPIC_ALIAS in props):
            props = dict(props)
            props.pop(Property.TOPIC_ALIAS, None)
            if subscription_ids:
                props[Property.SUBSCRIPTION_IDENTIFIER] = list(subscription_ids)
            if message.expires_at is not None:
                props[Property.MESSAGE_EXPIRY_INTERVAL] = max(
                    1, math.ceil(message.expires_at - now))
            if alias:
                props[Property.TOPIC_ALIAS] = alias
                if alias_known:
                    topic = ""
    return encode_publish_fields(topic, message.payload, qos, retain, dup,
                                 packet_id if qos else None, props, level)
