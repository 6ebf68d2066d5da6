"""One client's session: its QoS flows, packet identifiers, inflight window,
queued messages and subscriptions (MQTT 5.0 §4.1, §4.3, §4.4, §4.9).

The session decides; the connection (:class:`tbmq.broker.protocol.MQTTProtocol`)
only moves bytes.  A session outlives its connection when it is persistent:
its queue and inflight deliveries stay in memory and, write-through, in the
device message store (:class:`tbmq.interfaces.IDeviceMessageStore`), so a
broker restart resumes them.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import (
    ClientType,
    DeliveryState,
    Message,
    StoredDelivery,
    SubscriptionOptions,
)
from tbmq.mqtt import MQTT_5, Property, Publish, Pubrel
from tbmq.mqtt.codec import encode_publish, publish_packet_id_offset

if TYPE_CHECKING:  # pragma: no cover
    from tbmq.broker.broker import Broker

#: the session expiry interval that means "never expires" (§3.1.2.11.2)
EXPIRY_NEVER = 0xFFFFFFFF

_SEQ = [0]
_SENT = DeliveryState.SENT


def next_seq(now_ns: int) -> int:
    """A process-wide increasing order key for queued deliveries.

    :param now_ns: the wall clock in nanoseconds, so keys also increase across
        restarts.
    """
    seq = _SEQ[0] + 1
    if now_ns > seq:
        seq = now_ns
    _SEQ[0] = seq
    return seq


def bump_seq(seen: int) -> None:
    """Make later :func:`next_seq` results larger than ``seen`` (on restore)."""
    if seen > _SEQ[0]:
        _SEQ[0] = seen


def _encode(message: Message, qos: int, retain: bool, subscription_ids: tuple[int, ...],
            now: float, level: int, dup: bool, packet_id: int) -> bytes:
    """The PUBLISH of ``message`` for a client of protocol ``level``: v5
    properties without the publisher's topic alias, with the subscription
    identifiers [MQTT-3.3.4-3] and the expiry interval left [MQTT-3.3.2-6]."""
    props = None
    if level >= MQTT_5:
        props = message.properties
        if subscription_ids or message.expires_at is not None or Property.TOPIC_ALIAS in props:
            props = dict(props)
            props.pop(Property.TOPIC_ALIAS, None)
            if subscription_ids:
                props[Property.SUBSCRIPTION_IDENTIFIER] = list(subscription_ids)
            if message.expires_at is not None:
                props[Property.MESSAGE_EXPIRY_INTERVAL] = max(
                    1, math.ceil(message.expires_at - now))
    return encode_publish(Publish(message.topic, message.payload, qos, retain, dup,
                                  packet_id if qos else None, props if props is not None else {}),
                          level)


class Session:
    """The state of one client id.

    :ivar client_id: the client identifier.
    :ivar persistent: True when the session outlives the connection (TBMQ's
        persistent client; v3 ``cleanSession=0``, v5 session expiry > 0).
    :ivar expiry_interval: session expiry interval, seconds.
    :ivar client_type: DEVICE or APPLICATION.
    :ivar subscriptions: topic filter → :class:`SubscriptionOptions`.
    :ivar connection: the live connection, or None while offline.
    :ivar dropped: messages dropped for this session, by reason.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, broker: "Broker", client_id: str, *, persistent: bool,
                 expiry_interval: int = 0, protocol_level: int = 4,
                 client_type: ClientType = ClientType.DEVICE) -> None:
        self.broker = broker
        self.client_id = client_id
        self.persistent = persistent
        self.expiry_interval = expiry_interval
        self.protocol_level = protocol_level
        self.client_type = client_type
        self.subscriptions: dict[str, SubscriptionOptions] = {}
        self.connection: Any = None
        self.disconnected_at: float | None = None
        # outbound QoS 1/2: packet id -> delivery, in send order
        self.inflight: dict[int, StoredDelivery] = {}
        self.queue: deque[StoredDelivery] = deque()
        self._next_packet_id = 1
        # inbound QoS 2 packet ids from the PUBLISH to the PUBREL [MQTT-4.3.3-10]
        self.inbound_qos2: set[int] = set()
        self.inbound_unacked = 0
        # seqs of finished deliveries not yet removed from the device store
        self._completed: list[int] = []
        # acks waiting for earlier acks, to keep PUBACK/PUBREC in order [MQTT-4.6.0-2]
        self._acks: deque[list] = deque()
        self.dropped: dict[str, int] = {}
        self._drop_logged_at = float("-inf")
        self._max_inflight = broker.config.mqtt.max_inflight_messages
        self.will = None
        self.will_timer = None
        self.expiry_timer = None

    # -- bookkeeping ---------------------------------------------------------

    @property
    def queue_limit(self) -> int:
        mqtt = self.broker.config.mqtt
        return mqtt.max_queued_messages if self.persistent else mqtt.max_pending_messages

    #: seconds between two log lines about drops for one session
    DROP_LOG_INTERVAL = 10.0

    def drop(self, reason: str, message: Message | None = None) -> None:
        """Count a message not delivered to this session; log the first drop
        and then a summary at most every :attr:`DROP_LOG_INTERVAL` seconds."""
        count = self.dropped.get(reason, 0) + 1
        self.dropped[reason] = count
        self.broker.stats_dropped(reason)
        now = self.broker.clock.seconds()
        if now >= self._drop_logged_at + self.DROP_LOG_INTERVAL:
            self._drop_logged_at = now
            self.log.warn(
                "dropped messages for {client_id}: {dropped} so far",
                client_id=self.client_id, dropped=dict(self.dropped),
                topic=message.topic if message else None)
        self.broker.hooks_message_dropped(self, message, reason)

    def _packet_id(self) -> int:
        pid = self._next_packet_id
        inflight = self.inflight
        if pid in inflight:
            for _ in range(65535):
                if pid not in inflight:
                    break
                pid = pid + 1 if pid < 65535 else 1
            else:  # pragma: no cover - the window is at most 65535
                raise RuntimeError("no free packet identifier")
        self._next_packet_id = pid + 1 if pid < 65535 else 1
        return pid

    def _window(self) -> int:
        conn = self.connection
        if conn is None:
            return 0
        quota = conn.send_quota
        limit = self._max_inflight
        return quota if quota < limit else limit

    # -- outbound ------------------------------------------------------------

    def deliver(self, message: Message, qos: int, retain: bool,
                subscription_ids: tuple[int, ...], cache: dict | None = None,
                now: float | None = None):
        """Deliver ``message`` to this client at ``qos`` (already downgraded to
        the subscription's maximum, [MQTT-3.8.4-8]).

        QoS 0 goes straight to the connection or is dropped; QoS 1 and 2 are
        sent when the inflight window allows, else queued (bounded; the
        newest message is dropped and counted when the queue is full, as
        Mosquitto's ``max_queued_messages``).

        :param cache: per-dispatch encoding cache shared by all subscribers of
            one message (encode once per message and QoS, patch the packet id).
        :returns: None, or for a persistent session and QoS > 0 a Deferred that
            fires when the delivery is durable in the device message store.
        """
        if now is None:
            now = self.broker.clock.seconds()
        if message.expires_at is not None and message.expires_at <= now:
            self.drop("expired", message)
            return None
        conn = self.connection
        if qos == 0:
            if conn is None:
                if not self.persistent:
                    return None
                self.drop("offline_qos0", message)
                return None
            if conn.paused and not conn.hold(self.broker.current_source):
                self.drop("slow_consumer", message)
                return None
            data = self._encoded(message, 0, retain, subscription_ids, cache, now, conn)
            if data is not None:
                conn.write(data)
                if self.broker.notify_delivered:
                    self.broker.hooks_message_delivered(self, message, 0)
            return None
        queue = self.queue
        inflight = self.inflight
        if conn is None:
            window = 0
        else:
            if conn.paused:
                conn.hold(self.broker.current_source)  # slow the publisher down
            window = self._window()
        if len(queue) + len(inflight) >= self.queue_limit + window:
            self.drop("queue_full", message)
            return None
        delivery = StoredDelivery(
            next_seq(int(now * 1e9)) if self.persistent else 0,
            message, qos, retain, subscription_ids)
        send_now = window and not queue and not conn.paused and len(inflight) < window
        if send_now:
            delivery.packet_id = pid = self._packet_id()
            delivery.state = _SENT
            inflight[pid] = delivery
        else:
            queue.append(delivery)
        result = None
        if self.persistent:
            result = self.broker.device_store.add(self.client_id, [delivery])
        if send_now:
            data = self._encoded(message, qos, retain, subscription_ids, cache, now, conn,
                                 packet_id=pid)
            if data is None:
                self._complete(pid)
            elif cache is None:
                conn.write(data)
            else:
                o = publish_packet_id_offset(data)
                conn.write(data[:o] + pid.to_bytes(2, "big") + data[o + 2:])
        return result

    def _encoded(self, message: Message, qos: int, retain: bool,
                 subscription_ids: tuple[int, ...], cache: dict | None, now: float,
                 conn, dup: bool = False, packet_id: int = 1) -> bytes | None:
        """The PUBLISH bytes for this client, or None when they exceed the
        client's maximum packet size [MQTT-3.1.2-25].

        :param cache: shared by the subscribers of one message: the bytes are
            cached with ``packet_id`` (for QoS > 0 a placeholder, 1, that each
            delivery patches); None encodes ``packet_id`` itself.
        """
        level = conn.protocol_level
        if cache is None:
            data = _encode(message, qos, retain, subscription_ids, now, level, dup, packet_id)
        else:
            key = (qos, retain, level >= MQTT_5, subscription_ids, dup)
            data = cache.get(key)
            if data is None:
                # the placeholder packet id 1, patched per delivery
                data = cache[key] = _encode(message, qos, retain, subscription_ids, now,
                                            level, dup, 1)
        if conn.max_packet_size is not None and len(data) > conn.max_packet_size:
            self.drop("too_large_for_client", message)
            return None
        return data

    def _send_delivery(self, delivery: StoredDelivery, dup: bool, now: float) -> bool:
        conn = self.connection
        message = delivery.message
        if not dup and message.expires_at is not None and message.expires_at <= now:
            self.drop("expired", message)
            return False
        data = self._encoded(message, delivery.qos, delivery.retain,
                             delivery.subscription_ids, None, now, conn, dup, delivery.packet_id)
        if data is None:
            return False
        conn.write(data)
        return True

    def pump(self) -> None:
        """Send queued deliveries while the inflight window has room."""
        conn = self.connection
        queue = self.queue
        if conn is None or not queue:
            return
        window = self._window()
        inflight = self.inflight
        store = self.broker.device_store if self.persistent else None
        now = self.broker.clock.seconds()
        removed = []
        while queue and len(inflight) < window and not conn.paused:
            delivery = queue.popleft()
            delivery.packet_id = pid = self._packet_id()
            delivery.state = DeliveryState.SENT
            if self._send_delivery(delivery, False, now):
                inflight[pid] = delivery
                if store is not None:
                    store.update(self.client_id, delivery.seq, pid, DeliveryState.SENT)
            elif store is not None:
                removed.append(delivery.seq)
        if removed:
            store.remove(self.client_id, removed)

    def resume(self) -> None:
        """After a reconnect: resend every unacknowledged PUBLISH with DUP set
        and every PUBREL, in their original order [MQTT-4.4.0-1], then pump."""
        conn = self.connection
        now = self.broker.clock.seconds()
        for pid, delivery in list(self.inflight.items()):
            if delivery.state == DeliveryState.RELEASED:
                conn.send(Pubrel(pid))
            elif not self._send_delivery(delivery, True, now):
                self._complete(pid)
        self.pump()

    def _complete(self, packet_id: int) -> StoredDelivery | None:
        delivery = self.inflight.pop(packet_id, None)
        if delivery is not None and self.persistent:
            # one store write for the deliveries completed by one read
            completed = self._completed
            completed.append(delivery.seq)
            if len(completed) == 1:
                self.broker.flusher.later(self._remove_completed)
        return delivery

    def _remove_completed(self) -> None:
        completed, self._completed = self._completed, []
        if completed:
            self.broker.device_store.remove(self.client_id, completed)

    def on_puback(self, packet_id: int) -> None:
        """PUBACK from the client: the QoS 1 delivery is done [MQTT-4.3.2-2]."""
        delivery = self.inflight.get(packet_id)
        if delivery is None or delivery.qos != 1:
            self.log.debug("PUBACK for unknown packet id {pid} from {client_id}",
                           pid=packet_id, client_id=self.client_id)
            return
        self._complete(packet_id)
        if self.broker.notify_delivered:
            self.broker.hooks_message_delivered(self, delivery.message, 1)
        if self.queue:
            self.pump()

    def on_pubrec(self, packet_id: int, reason_code: int) -> bool:
        """PUBREC from the client; answer PUBREL [MQTT-4.3.3-3].

        :returns: False when ``packet_id`` is unknown (the caller answers
            PUBREL with 0x92 PACKET_IDENTIFIER_NOT_FOUND in v5).
        """
        delivery = self.inflight.get(packet_id)
        if delivery is None or delivery.qos != 2:
            return False
        if reason_code >= 0x80:  # the receiver refused it: the flow ends here
            self._complete(packet_id)
            self.pump()
            return True
        if delivery.state != DeliveryState.RELEASED:
            delivery.state = DeliveryState.RELEASED
            if self.persistent:
                self.broker.device_store.update(
                    self.client_id, delivery.seq, packet_id, DeliveryState.RELEASED)
        self.connection.send(Pubrel(packet_id))
        return True

    def on_pubcomp(self, packet_id: int) -> None:
        """PUBCOMP from the client: the QoS 2 delivery is done."""
        delivery = self.inflight.get(packet_id)
        if delivery is None or delivery.state != DeliveryState.RELEASED:
            return
        self._complete(packet_id)
        self.broker.hooks_message_delivered(self, delivery.message, 2)
        self.pump()

    # -- inbound acknowledgements in order -----------------------------------

    def ack_when(self, result, packet, duplicate: bool = False) -> None:
        """Send ``packet`` (PUBACK or PUBREC) when ``result`` (None or a
        Deferred) is done, after every ack queued before it [MQTT-4.6.0-2].
        If the Deferred fails, the message was not accepted: nothing is
        acknowledged and the connection is closed so the client resends it."""
        acks = self._acks
        if result is None and not acks:
            self._send_ack(packet, duplicate)
            return
        entry = [packet, result is None, duplicate]
        acks.append(entry)
        if result is not None:
            conn = self.connection

            def done(_):
                entry[1] = True
                self._flush_acks(conn)

            def failed(failure):
                self.log.failure("message from {client_id} not stored; closing without ack",
                                 failure, client_id=self.client_id)
                if self.connection is conn and conn is not None:
                    conn.disconnect(0x80)
                self._acks.clear()

            result.addCallbacks(done, failed)
        else:
            self._flush_acks(self.connection)

    def _flush_acks(self, conn) -> None:
        acks = self._acks
        while acks and acks[0][1]:
            packet, _, duplicate = acks.popleft()
            if self.connection is conn and conn is not None:
                self._send_ack(packet, duplicate)

    def _send_ack(self, packet, duplicate: bool = False) -> None:
        conn = self.connection
        if conn is None:
            return
        ptype = packet.packet_type
        if ptype == 4:  # PUBACK ends an inbound QoS 1 flow
            self.inbound_unacked -= 1
        elif packet.reason_code >= 0x80 and not duplicate:
            # a refused QoS 2 PUBLISH ends its flow with the PUBREC [MQTT-4.3.3-9]
            self.inbound_qos2.discard(packet.packet_id)
        if packet.reason_code == 0 and not packet.properties:
            # the short form, the same in every version [MQTT-3.4.2.1]
            conn.write((b"\x40\x02" if ptype == 4 else b"\x50\x02")
                       + packet.packet_id.to_bytes(2, "big"))
        else:
            conn.send(packet)

    # -- connection life cycle -------------------------------------------------

    def attach(self, connection) -> None:
        """Bind a new connection; acks pending for the old one are void."""
        self.connection = connection
        self.protocol_level = connection.protocol_level
        self.disconnected_at = None
        self._acks.clear()
        self.inbound_unacked = 0

    def detach(self, now: float) -> None:
        """The connection is gone; a persistent session keeps its state."""
        self.connection = None
        self.disconnected_at = now
        self._acks.clear()
        self.inbound_unacked = 0

    def discard(self) -> None:
        """The session ends: forget everything it holds."""
        for delivery in list(self.inflight.values()) + list(self.queue):
            self.broker.hooks_message_dropped(self, delivery.message, "session_ended")
        self.inflight.clear()
        self.queue.clear()
        self.inbound_qos2.clear()
        self._completed = []
        if self.persistent:
            self.broker.device_store.clear(self.client_id)

    def restore(self, deliveries: list[StoredDelivery]) -> None:
        """Reload the queue and inflight window from the device store."""
        for delivery in deliveries:
            bump_seq(delivery.seq)
            if delivery.state == DeliveryState.QUEUED or delivery.packet_id is None:
                self.queue.append(delivery)
            elif delivery.packet_id in self.inflight:
                delivery.packet_id = None
                delivery.state = DeliveryState.QUEUED
                self.queue.append(delivery)
            else:
                self.inflight[delivery.packet_id] = delivery
