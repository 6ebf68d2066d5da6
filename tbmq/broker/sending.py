"""How an :class:`~tbmq.broker.outbox.Outbox` writes its PUBLISHes: the
encoding for a client's protocol level (:func:`encode_for`), the device
store writes of a turn (:func:`store_update`), and a run of queued
deliveries sent together (:func:`send_run`: the drain of a persistent
session, one pump's sends in one write).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tbmq.broker.sent_states import SentStates
from tbmq.model import DeliveryState, Message
from tbmq.mqtt import MQTT_5, Property
from tbmq.mqtt.codec import encode_publish_fields

__all__ = ["encode_for", "send_run", "store_update"]

if TYPE_CHECKING:
    from tbmq.broker.outbox import Outbox

_SENT = DeliveryState.SENT


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


def store_update(outbox: "Outbox", seq: int, packet_id: int, state: int) -> None:
    """Record in the device store, with the other writes of ``outbox`` in
    this turn (one ``update_many`` when the turn ends,
    :meth:`Outbox._remove_completed`), that delivery ``seq`` was sent with
    ``packet_id`` and is in ``state`` (:class:`~tbmq.model.DeliveryState`)."""
    updates = outbox._updates
    if not updates:
        updates = outbox._updates = []
        if not outbox._completed:  # else asked already
            outbox.ctx.flusher.later(outbox._remove_completed)
    updates.append((seq, packet_id, state))


def send_run(outbox: "Outbox", deliveries: list, now: float, conn) -> int:
    """Write ``deliveries`` (taken from ``outbox``'s queue, in order) as
    :meth:`Outbox._send` each, with their PUBLISHes in one write and the SENT
    states of those of the device store held or recorded together: the
    drain's sends of one pump.  One that cannot be sent (expired, too
    large for the client) is finished (:meth:`Outbox._finished`).

    :param now: seconds since the epoch.
    :returns: how many were sent (now in flight)."""
    inflight = outbox.inflight
    if not inflight:  # (maybe the outbox's shared empty mapping: a dict of its own)
        inflight = outbox.inflight = {}
    encoded = outbox._encoded
    level = conn.protocol_level
    # without topic aliases each PUBLISH is encoded here (encode_for, as
    # Outbox._encoded does), checked and counted: no call between
    direct = outbox.sent_aliases is None
    max_size = conn.max_packet_size
    counts = outbox._sent
    volumes = outbox._sent_bytes
    latency = outbox._latency
    datas = []
    held = []  # (seq, packet id) of QoS 1 deliveries of the store
    sent = 0
    for delivery in deliveries:
        message = delivery.message
        expires_at = message.expires_at
        if expires_at is not None and expires_at <= now:
            outbox.drop("expired", message)
            outbox._finished(delivery)
            continue
        pid = outbox._next_packet_id
        if pid in inflight:
            pid = outbox._packet_id()
        else:
            outbox._next_packet_id = pid + 1 if pid < 65535 else 1
        qos = delivery.qos
        if direct:
            data = (encode_publish_fields(message.topic, message.payload, qos, delivery.retain,
                                          False, pid, None, level) if level < MQTT_5 else
                    encode_for(message, qos, delivery.retain, delivery.subscription_ids, now,
                               level, False, pid))
            if max_size is not None and len(data) > max_size:
                outbox.drop("too_large_for_client", message)
                outbox._finished(delivery)
                continue
            counts[qos] += 1
            volumes[qos] += len(message.payload)
            if latency is not None and not delivery.retain:
                outbox._observe(message, now)
        else:
            data = encoded(message, qos, delivery.retain, delivery.subscription_ids, None,
                           now, conn, False, pid)
            if data is None:
                outbox._finished(delivery)
                continue
        delivery.packet_id = pid
        delivery.state = _SENT
        inflight[pid] = delivery
        datas.append(data)
        sent += 1
        seq = delivery.seq
        if seq:  # in the device store
            if qos == 1:  # written if not acknowledged soon
                held.append((seq, pid))
            else:  # one write per turn for all
                store_update(outbox, seq, pid, _SENT)
    if datas:
        conn.write(datas[0] if len(datas) == 1 else b"".join(datas))
    if held:
        states = outbox.sent_states
        if states is None:
            states = outbox.sent_states = SentStates(outbox)
        states.hold_many(held)
    return sent
