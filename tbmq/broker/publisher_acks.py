"""The acknowledgements a session owes its client's publishes (PUBACK,
PUBREC), sent in the order of the PUBLISHes [MQTT-4.6.0-2] once each
message is durable [MQTT-4.3.2-4, MQTT-4.3.3-8], and the count of the
publishes the bus has not answered yet (a publisher never fills memory).

The bus answers a QoS 1/2 publish once the message is durable: in the
embedded node, once the topic log committed the transaction that holds it
(an APPLICATION client's record), which answers every publish of that
commit in a row.  The first answer of a run at the head of the queue asks
for one flush when the turn ends; the PUBACKs ready then go out in one
write (:meth:`PublisherAcks._flush_acks`), not one call and one write each.
"""

from __future__ import annotations

from collections import deque

from tbmq.mqtt import MQTT_5, Puback, ReasonCode, is_failure
from tbmq.mqtt.codec import encode_puback, encode_pubrec

__all__ = ["PublisherAcks"]

#: ``ReasonCode.SUCCESS``, read once (a class attribute of an enum is a slow
#: lookup on the path of every acknowledgement)
_SUCCESS = ReasonCode.SUCCESS


class PublisherAcks:
    """The acknowledgement queue of a :class:`tbmq.broker.session.Session`
    (which has the attributes used here: ``ctx``, ``link``, ``log``,
    ``client_id``, ``_acks``, ``_unaccepted``, ``_reading_paused``,
    ``inbound_unacked``, ``inbound_qos2``).

    An entry of ``_acks`` is ``[packet, ready, duplicate]``: ``packet`` a
    :class:`~tbmq.mqtt.Puback` or :class:`~tbmq.mqtt.Pubrec` to send, or
    the packet id (``int``) of a QoS 1 PUBLISH whose PUBACK is a success
    with no properties (no packet object per message).
    """

    __slots__ = ()

    def _accepted(self, value, conn):
        """The bus answered one publish that it did not accept during the
        call (counted by ``Session._publish``): success or failure,
        ``value`` passes through."""
        self._unaccepted -= 1
        if (self._reading_paused
                and self._unaccepted <= self.ctx.mqtt.max_pending_messages // 2):
            self._reading_paused = False
            # not from inside the consumer that accepted it: the packets
            # read meanwhile are handled when this turn ends
            self.ctx.flusher.later(lambda: self.link is conn and conn.resume_reading())
        return value

    def _qos0_refused(self, failure, conn) -> None:
        self._accepted(None, conn)
        self.log.failure("QoS 0 message of {client_id} not accepted", failure,
                         client_id=self.client_id)

    # -- acknowledgements to the client, in order ---------------------------------------

    def ack_when(self, result, packet, duplicate: bool = False, accepting=None) -> None:
        """Send ``packet`` (PUBACK or PUBREC) when ``result`` (None or a
        Deferred) is done, after every ack queued before it [MQTT-4.6.0-2].
        If the Deferred fails, the message was not accepted (the bus is
        unreachable or refused it): a v5 client gets the PUBACK / PUBREC
        with 0x83 Implementation specific error, in its turn, and may send
        the message again; a v3 client, which has no negative
        acknowledgement, is disconnected without one, so it resends the
        message when it reconnects [MQTT-4.4.0-1].

        :param accepting: the connection whose publish ``result`` is, counted
            by ``Session._publish`` (its answer also counts for
            :meth:`_accepted`), or None.
        """
        acks = self._acks
        if result is None and not acks:
            self._send_ack(packet, duplicate)
            return
        entry = [packet, result is None, duplicate]
        self._waiting_acks().append(entry)
        if result is not None:
            args = (entry, self.link, accepting)
            result.addCallbacks(self._ack_ready, self._ack_refused, callbackArgs=args,
                                errbackArgs=args)
        else:
            self._flush_acks(self.link)

    def _published(self, failure, entry: list | None, conn, accepting) -> None:
        """The bus answered a publish of :meth:`_publish` that it did not
        hold during the call (``failure``: None, or why it refused it);
        ``entry`` is its queued acknowledgement (None at QoS 0)."""
        if entry is None:
            if failure is None:
                self._accepted(None, accepting)
            else:
                self._qos0_refused(failure, accepting)
        elif failure is None:
            if self._reading_paused:
                self._accepted(None, accepting)
            else:
                self._unaccepted -= 1  # (what _accepted does then)
            entry[1] = True
            acks = self._acks
            if acks and acks[0] is entry and self.link is conn:
                # the first of a run that the bus answers together (a
                # commit of the topic log): sent together when the turn
                # ends, in one write (the ones answered meanwhile behind it)
                self.ctx.flusher.later(self._flush_acks)
        else:
            self._ack_refused(failure, entry, conn, accepting)

    def _ack_ready(self, _result, entry: list, conn, accepting) -> None:
        if accepting is not None:
            self._accepted(None, accepting)
        entry[1] = True
        self._flush_acks(conn)

    def _ack_refused(self, failure, entry: list, conn, accepting) -> None:
        if accepting is not None:
            self._accepted(None, accepting)
        self.ctx.drops.refused(failure)
        if conn is not None and conn.protocol_level >= MQTT_5:
            packet = entry[0]
            entry[0] = (Puback(packet, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
                        if type(packet) is int else
                        type(packet)(packet.packet_id, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR))
            entry[1] = True
            self._flush_acks(conn)
            return
        if self.link is conn and conn is not None:
            conn.disconnect(ReasonCode.UNSPECIFIED_ERROR)
        self._acks = ()

    def _waiting_acks(self) -> deque:
        """:returns: the queue of acknowledgements waiting for earlier ones,
        made at the first (an idle session holds an empty tuple)."""
        acks = self._acks
        if not isinstance(acks, deque):
            acks = self._acks = deque()
        return acks

    def _flush_acks(self, conn=None) -> None:
        """Send the acknowledgements ready at the head of the queue, on
        ``conn`` (default: the live connection; one that is not live any
        more sends nothing): the PUBACKs in a row (an entry of a packet id,
        see :meth:`_publish`) in one write."""
        acks = self._acks
        link = self.link
        if conn is None:
            conn = link
        live = link is conn and conn is not None
        pids = None
        while acks and acks[0][1]:
            packet, _, duplicate = acks.popleft()
            if not live:
                continue
            if type(packet) is int:  # PUBACK, success: ends an inbound QoS 1 flow
                if pids is None:
                    pids = [packet]
                else:
                    pids.append(packet)
                continue
            if pids is not None:
                self._send_pubacks(conn, pids)
                pids = None
            self._send_ack(packet, duplicate)
        if pids is not None:
            self._send_pubacks(conn, pids)

    def _send_pubacks(self, conn, pids: list) -> None:
        """PUBACK with success for each of ``pids`` (packet ids), in one write."""
        self.inbound_unacked -= len(pids)
        conn.write(b"".join(map(encode_puback, pids)))

    def _send_ack(self, packet, duplicate: bool = False) -> None:
        conn = self.link
        if conn is None:
            return
        is_puback = type(packet) is Puback
        if is_puback:  # PUBACK ends an inbound QoS 1 flow
            self.inbound_unacked -= 1
        elif is_failure(packet.reason_code) and not duplicate:
            # a refused QoS 2 PUBLISH ends its flow with the PUBREC [MQTT-4.3.3-9]
            if packet.packet_id in self.inbound_qos2:
                self.inbound_qos2.discard(packet.packet_id)
        if packet.reason_code == _SUCCESS and not packet.properties:
            conn.write(encode_puback(packet.packet_id) if is_puback
                       else encode_pubrec(packet.packet_id))
        else:
            conn.send(packet)
