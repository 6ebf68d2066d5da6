"""The client's acknowledgements of a session's deliveries (PUBACK,
PUBREC, PUBCOMP): the part of the :class:`~tbmq.broker.outbox.Outbox`
that ends a QoS 1 or QoS 2 flow.

Each is ``handler(session, packet)``, the signature of
:attr:`tbmq.broker.protocol.MQTTProtocol._session_handlers`: the protocol
calls it with the :class:`~tbmq.broker.session.Session` directly (one call
per acknowledgement, no frame in between).
"""

from __future__ import annotations

from tbmq.errors import ProtocolViolation
from tbmq.model import DeliveryState
from tbmq.mqtt import MQTT_5, Puback, Pubrel, ReasonCode, is_failure

__all__ = ["on_puback", "on_pubacks", "on_pubcomp", "on_pubrec"]

_RELEASED = DeliveryState.RELEASED


def on_puback(session, packet) -> None:
    """PUBACK from the client: the QoS 1 delivery is done [MQTT-4.3.2-2].
    An unknown packet id is ignored (an acknowledgement repeated across
    a reconnect).

    :raises ProtocolViolation: PROTOCOL_ERROR for a PUBACK of a QoS 2
        delivery
        (sent or already answered with PUBREC): an acknowledgement of the
        wrong kind is a Protocol Error (§4.3.3, §4.13.1) and ends the
        connection (DISCONNECT PROTOCOL_ERROR in v5, a close in v3), so the
        message never stays in flight, shrinking the window.
    """
    outbox = session.outbox
    packet_id = packet.packet_id
    delivery = outbox.inflight.get(packet_id)
    if delivery is None:
        outbox.log.debug("PUBACK for unknown packet id {pid} from {client_id}",
                     pid=packet_id, client_id=outbox.client_id)
        return
    if delivery.qos != 1:
        raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR,
                                f"PUBACK for the QoS 2 delivery {packet_id}")
    outbox.complete(packet_id)
    if outbox.ctx.hooks.wants_delivered:
        outbox.ctx.hooks.message_delivered(session, delivery.message, 1)
    _pump_after_acknowledgement(outbox)


def _pump_after_acknowledgement(outbox) -> None:
    """Ask ``outbox`` for a pump when a window slot freed by an
    acknowledgement can take something: a queued or held delivery, or the
    next stored page.  A pump has nothing to do while a paged-out session's
    next page is being read (its read-ahead, most of a drain): the read
    pumps when done; the acknowledgements of one read pump once, at the end
    of the turn (:meth:`~tbmq.broker.outbox.Outbox.ask_pump`)."""
    if outbox.queue or (outbox.holder is not None and outbox.holder.holding) or (
            outbox.paged_out and (outbox.slow or outbox.reader is None
                                  or not outbox.reader.loading)):
        outbox.ask_pump()


def on_pubacks(session, packets: list, start: int) -> int:
    """The :class:`~tbmq.mqtt.Puback` packets of ``packets`` from ``start``
    on, as :func:`on_puback` each, while each acknowledges a QoS 1 delivery
    in flight and no ``message_delivered`` hook is registered: their
    deliveries finished together (:meth:`Outbox.complete_run
    <tbmq.broker.outbox.Outbox.complete_run>`), one pump asked for the lot.
    A client draining its queue acknowledges a window of PUBLISHes in a few
    reads.  The signature of
    :attr:`tbmq.broker.protocol.MQTTProtocol._session_runs`.

    :returns: the index of the first packet not handled (not a PUBACK,
        or one that :func:`on_puback` handles: an unknown packet id, a QoS
        2 delivery); ``start`` when none was."""
    outbox = session.outbox
    if outbox.ctx.hooks.wants_delivered:
        return start
    inflight = outbox.inflight
    n = len(packets)
    index = start
    done = []
    while index < n:
        packet = packets[index]
        if type(packet) is not Puback:
            break
        delivery = inflight.get(packet.packet_id)
        if delivery is None or delivery.qos != 1:
            break
        done.append(packet.packet_id)
        index += 1
    if done:
        outbox.complete_run(done)
        _pump_after_acknowledgement(outbox)  # once for the run
    return index


def on_pubrec(session, packet) -> None:
    """PUBREC from the client: answered with PUBREL [MQTT-4.3.3-3], or
    with PUBREL PACKET_IDENTIFIER_NOT_FOUND (v5) for an unknown packet
    id; a refusal (a failure reason code, 0x80 or more:
    :func:`~tbmq.mqtt.is_failure`) ends the flow.

    :raises ProtocolViolation: PROTOCOL_ERROR for a PUBREC of a QoS 1
        delivery.
    """
    outbox = session.outbox
    packet_id = packet.packet_id
    conn = outbox.link
    delivery = outbox.inflight.get(packet_id)
    if delivery is None:
        v5 = conn.protocol_level >= MQTT_5
        conn.send(Pubrel(packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND if v5
                         else ReasonCode.SUCCESS))
        return
    if delivery.qos != 2:
        raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR,
                                f"PUBREC for the QoS 1 delivery {packet_id}")
    if is_failure(packet.reason_code):  # the receiver refused it: the flow ends here
        outbox.complete(packet_id)
        outbox.pump()
        return
    if delivery.state != _RELEASED:
        delivery.state = _RELEASED
        if delivery.seq:
            outbox.store_update(delivery.seq, packet_id, _RELEASED)
    conn.send(Pubrel(packet_id))


def on_pubcomp(session, packet) -> None:
    """PUBCOMP from the client: the QoS 2 delivery is done
    [MQTT-4.3.3-5].  An unknown packet id is ignored.

    :raises ProtocolViolation: PROTOCOL_ERROR for a PUBCOMP of a QoS 1
        delivery,
        or of a QoS 2 one not yet released (no PUBREC came before it).
    """
    outbox = session.outbox
    packet_id = packet.packet_id
    delivery = outbox.inflight.get(packet_id)
    if delivery is None:
        return
    if delivery.state != _RELEASED:
        raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR,
                                f"PUBCOMP for the QoS {delivery.qos} delivery "
                                f"{packet_id}, which has no PUBREL")
    outbox.complete(packet_id)
    outbox.ctx.hooks.message_delivered(session, delivery.message, 2)
    outbox.pump()
