"""The Twisted protocol of one MQTT connection: bytes → packets → calls on the
session, and packets → bytes.

It owns the connect timeout and the keepalive (1.5 × the keep alive,
[MQTT-3.1.2-24]) through :class:`~twisted.protocols.policies.TimeoutMixin`
with the broker's clock, validates packets against the negotiated
capabilities and answers bad input with the MQTT reason code; it never routes.
"""

from __future__ import annotations

from twisted.internet import defer, interfaces, protocol
from twisted.logger import Logger
from twisted.protocols.policies import TimeoutMixin
from zope.interface import implementer

from tbmq.auth import AuthRequest, AuthResult
from tbmq.broker.connect import ConnectFlow, ProtocolViolation, valid_utf8
from tbmq.broker.flow import FlowControl
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import Message, SubscriptionOptions
from tbmq.mqtt import (
    MQTT_5, Auth, Connect, Disconnect, MalformedPacket, Pingreq, Pingresp,
    Property, Puback, Pubcomp, Publish, Pubrec, Pubrel, Suback, Subscribe, Unsuback,
    Unsubscribe,
)
from tbmq.mqtt.codec import Decoder, encode
from tbmq.mqtt.topics import (
    TopicError,
    parse_shared_subscription,
    validate_topic_filter,
    validate_topic_name,
)

__all__ = ["MQTTProtocol", "MQTTFactory", "ProtocolViolation"]


@implementer(interfaces.IPushProducer)
class MQTTProtocol(ConnectFlow, FlowControl, protocol.Protocol, TimeoutMixin):
    """One client connection.

    :ivar session: the :class:`tbmq.broker.session.Session` once CONNECT is
        accepted, else None.
    :ivar protocol_level: 3, 4 or 5 once CONNECT arrived.
    :ivar send_quota: the client's receive maximum (outbound window).
    :ivar max_packet_size: the client's maximum packet size, bytes, or None.
    :ivar paused: True while the transport's write buffer is full.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, broker, listener, max_packet_size: int) -> None:
        self.broker = broker
        self.listener = listener
        self.callLater = broker.clock.callLater
        self.decoder = Decoder(max_packet_size=max_packet_size)
        self.server_max_packet_size = max_packet_size
        self.session = None
        self.connect_packet: Connect | None = None
        self.protocol_level = 4
        self.send_quota = 65535
        self.max_packet_size: int | None = None
        self._init_flow()
        self.aliases: dict[int, str] = {}
        self._closing = False
        self._connacked = False
        self.connected_at: float | None = None
        self._normal_disconnect = False
        self._disconnect_reason: int | None = None
        self._waiting: list | None = None  # packets held while CONNECT is decided
        self._abort_call = None
        self._exchange = None  # (AuthRequest, provider) while an AUTH exchange continues
        self.auth: AuthResult | None = None
        self.auth_request: AuthRequest | None = None
        self._closed_waiters: list | None = None

    # -- Twisted --------------------------------------------------------------

    def connectionMade(self) -> None:
        self.broker.connections.add(self)
        self.transport.registerProducer(self, True)
        self.setTimeout(self.broker.config.mqtt.connect_timeout)

    def dataReceived(self, data: bytes) -> None:
        """Decode and handle a read; everything written meanwhile is flushed
        once at the end (see :mod:`tbmq.broker.flow`)."""
        if self._closing:
            return
        broker = self.broker
        flusher = broker.flusher
        flusher.depth += 1
        previous, broker.current_source = broker.current_source, self
        try:
            self._handle_data(data)
        finally:
            broker.current_source = previous
            flusher.depth -= 1
            if not flusher.depth:
                flusher.flush()

    def _handle_data(self, data: bytes) -> None:
        try:
            packets = self.decoder.feed(data)
        except MalformedPacket as e:
            self.log.info("malformed packet from {peer}: {error} (0x{code:02X})",
                          peer=self._peer(), error=str(e), code=e.reason_code)
            self.disconnect(e.reason_code)
            return
        if self._waiting is not None:
            self._waiting.extend(packets)
            return
        if packets and self.session is not None:
            self.resetTimeout()
        self.handle_packets(packets)

    def handle_packets(self, packets) -> None:
        """Handle ``packets`` in order; a rule broken ends the connection with
        its reason code; when a decision becomes asynchronous, the rest waits
        (see :meth:`~tbmq.broker.connect.ConnectFlow._hold`)."""
        handlers = self._handlers
        for index, packet in enumerate(packets):
            if self._closing:
                return
            try:
                # a connected client's packets go straight to their handler
                handler = handlers.get(type(packet)) if self.session is not None else None
                if handler is not None:
                    handler(self, packet)
                else:
                    self.packet_received(packet)
            except ProtocolViolation as e:
                self.log.info("protocol violation by {client_id}: {error} (0x{code:02X})",
                              client_id=self._client_id(), error=str(e), code=e.reason_code)
                self.disconnect(e.reason_code)
                return
            if self._waiting is not None:  # something is being decided: hold the rest
                self._waiting.extend(packets[index + 1:])
                return

    def connectionLost(self, reason=protocol.connectionDone) -> None:
        self._closing = True
        self.setTimeout(None)
        self._out = []
        self.stopProducing()
        if self._abort_call is not None and self._abort_call.active():
            self._abort_call.cancel()
        self.broker.connections.discard(self)
        waiters, self._closed_waiters = self._closed_waiters, None
        factory = getattr(self, "factory", None)
        if factory is not None:
            factory.active -= 1
        session = self.session
        if session is not None:
            self.session = None
            will = not self._normal_disconnect
            self.broker.hooks_client_disconnected(session, self._disconnect_reason, will)
            self.broker.sessions.connection_lost(session, self, publish_will=will)
        for waiter in waiters or ():
            waiter.callback(None)

    def when_closed(self) -> defer.Deferred:
        """:returns: a Deferred that fires once the connection is lost."""
        d = defer.Deferred()
        if self._closed_waiters is None:
            self._closed_waiters = []
        self._closed_waiters.append(d)
        return d

    def timeoutConnection(self) -> None:
        if self.session is None:
            self.log.info("no CONNECT from {peer} in time; closing", peer=self._peer())
            self._close()
        else:
            self.log.info("keep alive of {client_id} expired", client_id=self._client_id())
            self.disconnect(0x8D)  # KEEP_ALIVE_TIMEOUT

    # -- output ------------------------------------------------------------------

    def send(self, packet) -> None:
        """Encode ``packet`` for this connection's protocol level and write it."""
        self.write(encode(packet, self.protocol_level))

    def disconnect(self, reason_code: int = 0, reason: str | None = None) -> None:
        """Server-initiated close: DISCONNECT with ``reason_code`` for a v5
        client that completed CONNECT [MQTT-3.14.2], then close the connection.
        Safe to call more than once."""
        if self._closing:
            return
        self._disconnect_reason = reason_code
        if self._connacked and self.protocol_level >= MQTT_5:
            props = {Property.REASON_STRING: reason} if reason else {}
            self.send(Disconnect(reason_code, props))
        self._close()

    def _close(self) -> None:
        self.flush()
        self._closing = True
        self.setTimeout(None)
        self.transport.loseConnection()
        # a peer that never reads would keep the connection open: abort it
        self._abort_call = self.callLater(5, self.transport.abortConnection)

    def _peer(self) -> str:
        peer = self.transport.getPeer() if self.transport else None
        return str(getattr(peer, "host", peer))

    def _client_id(self) -> str:
        return self.connect_packet.client_id if self.connect_packet else "?"

    # -- dispatch ------------------------------------------------------------------

    def packet_received(self, packet) -> None:
        if self.session is None:
            if self.connect_packet is not None:
                if type(packet) is Auth and self._exchange is not None:
                    self.handle_auth(packet)
                    return
                raise ProtocolViolation(0x82, "packet before CONNACK")
            if type(packet) is not Connect:
                # the first packet must be CONNECT [MQTT-3.1.0-1]
                self.log.info("{type} before CONNECT from {peer}; closing",
                              type=type(packet).__name__, peer=self._peer())
                self._close()
                return
            self.handle_connect(packet)
            return
        handler = self._handlers.get(type(packet))
        if handler is None:
            raise ProtocolViolation(0x82, f"unexpected {type(packet).__name__}")
        handler(self, packet)

    # -- PUBLISH -------------------------------------------------------------------

    def handle_publish(self, packet: Publish) -> None:
        """Resolve the topic alias, check the rules, hand the message to the
        router, acknowledge once it is durable [MQTT-4.3.2-4, MQTT-4.3.3-8]."""
        session = self.session
        cfg = self.broker.config.mqtt
        v5 = self.protocol_level >= MQTT_5
        qos = packet.qos
        topic = packet.topic
        props = packet.properties
        if v5 and props:
            alias = props.get(Property.TOPIC_ALIAS)
            if alias is not None:
                if alias == 0 or alias > cfg.topic_alias_maximum:
                    raise ProtocolViolation(0x94, "topic alias out of range")
                if topic:
                    self.aliases[alias] = topic
                else:
                    topic = self.aliases.get(alias)
                    if topic is None:
                        raise ProtocolViolation(0x82, "unknown topic alias")
            if Property.SUBSCRIPTION_IDENTIFIER in props:
                raise ProtocolViolation(0x82, "subscription identifier in PUBLISH")
            response_topic = props.get(Property.RESPONSE_TOPIC)
            if response_topic is not None:
                try:
                    validate_topic_name(response_topic)
                except TopicError:
                    raise ProtocolViolation(0x82, "invalid response topic")
        valid = self.broker.valid_topics
        if topic not in valid:
            try:
                validate_topic_name(topic)
            except TopicError as e:
                raise ProtocolViolation(0x90, f"invalid topic name: {e}")
            if len(valid) >= 10000:
                valid.clear()
            valid.add(topic)
        if qos > cfg.max_qos:
            raise ProtocolViolation(0x9B, "QoS not supported")
        if packet.retain and not cfg.retain_available:
            raise ProtocolViolation(0x9A, "retain not supported")
        pid = packet.packet_id
        if qos:
            if qos == 2 and pid in session.inbound_qos2:
                # a resent PUBLISH is not routed again; its PUBREC follows the
                # first one's (QoS 2 method A, [MQTT-4.3.3-9])
                session.ack_when(None, Pubrec(pid), duplicate=True)
                return
            if session.inbound_unacked + len(session.inbound_qos2) >= cfg.receive_maximum:
                raise ProtocolViolation(0x93, "receive maximum exceeded")  # [MQTT-3.3.4-9]
            if qos == 1:
                session.inbound_unacked += 1
            else:
                session.inbound_qos2.add(pid)  # until PUBREL [MQTT-4.3.3-10]
        if v5 and props.get(Property.PAYLOAD_FORMAT_INDICATOR) == 1 and not valid_utf8(packet.payload):
            # payload format 1 must be UTF-8 [MQTT-3.3.2-4]: refused with 0x99
            if qos == 0:
                raise ProtocolViolation(0x99, "payload is not UTF-8")
            session.ack_when(None, (Puback if qos == 1 else Pubrec)(pid, 0x99))
            return
        allowed = self.broker.authorize("publish", session, self.auth, topic)
        if allowed is True:
            self._publish(session, packet, topic)
        elif allowed is False:
            self._publish_denied(session, packet, topic)
        else:
            self._hold()
            allowed.addCallback(self._publish_decided, session, packet, topic)
            allowed.addErrback(self._internal_error)

    def _publish_decided(self, allowed: bool, session, packet: Publish, topic: str) -> None:
        if self.session is not session or self._closing:
            return
        if allowed:
            self._publish(session, packet, topic)
        else:
            self._publish_denied(session, packet, topic)
        self._release()

    def _publish_denied(self, session, packet: Publish, topic: str) -> None:
        """Not authorized: the message is dropped; v5 QoS 1/2 get 0x87, v3
        gets a plain acknowledgement (it has no negative one), as Mosquitto."""
        self.log.debug("{client_id} may not publish to {topic}",
                       client_id=session.client_id, topic=topic)
        self.broker.stats_dropped("not_authorized")
        code = 0x87 if self.protocol_level >= MQTT_5 else 0
        if packet.qos == 1:
            session.ack_when(None, Puback(packet.packet_id, code))
        elif packet.qos == 2:
            session.ack_when(None, Pubrec(packet.packet_id, code))

    def _publish(self, session, packet: Publish, topic: str) -> None:
        """Hand the message to the router; acknowledge once it is durable."""
        qos = packet.qos
        props = packet.properties
        v5 = self.protocol_level >= MQTT_5
        now = self.broker.clock.seconds()
        expires_at = None
        if v5 and props:
            expiry = props.get(Property.MESSAGE_EXPIRY_INTERVAL)
            if expiry is not None:
                expires_at = now + expiry
            if Property.TOPIC_ALIAS in props:
                props = dict(props)
                del props[Property.TOPIC_ALIAS]
        message = Message(topic, packet.payload, qos, packet.retain,
                          props if v5 else {}, session.client_id, now, expires_at)
        broker = self.broker
        if broker.notify_published:
            broker.hooks_message_published(session, message)
        result = broker.router.publish(message)
        if qos == 1:
            if result is None and not session._acks:
                # nothing to wait for: the short PUBACK now, the same bytes in
                # every version [MQTT-3.4.2.1]
                session.inbound_unacked -= 1
                self.write(b"\x40\x02" + packet.packet_id.to_bytes(2, "big"))
            else:
                session.ack_when(result, Puback(packet.packet_id))
        elif qos == 2:
            session.ack_when(result, Pubrec(packet.packet_id))

    def handle_puback(self, packet: Puback) -> None:
        self.session.on_puback(packet.packet_id)

    def handle_pubrec(self, packet: Pubrec) -> None:
        if not self.session.on_pubrec(packet.packet_id, packet.reason_code):
            self.send(Pubrel(packet.packet_id, 0x92 if self.protocol_level >= MQTT_5 else 0))

    def handle_pubrel(self, packet: Pubrel) -> None:
        session = self.session
        if packet.packet_id in session.inbound_qos2:
            session.inbound_qos2.discard(packet.packet_id)
            self.send(Pubcomp(packet.packet_id))
        else:
            self.send(Pubcomp(packet.packet_id, 0x92 if self.protocol_level >= MQTT_5 else 0))

    def handle_pubcomp(self, packet: Pubcomp) -> None:
        self.session.on_pubcomp(packet.packet_id)

    # -- SUBSCRIBE / UNSUBSCRIBE -------------------------------------------------------

    def handle_subscribe(self, packet: Subscribe) -> None:
        """Per-filter reason codes [MQTT-3.9.3]; retained messages after the
        SUBACK as the retain handling says [MQTT-3.3.1-9, -10, -11]."""
        cfg = self.broker.config.mqtt
        session = self.session
        v5 = self.protocol_level >= MQTT_5
        sub_ids = packet.properties.get(Property.SUBSCRIPTION_IDENTIFIER) if v5 else None
        sub_id = None
        if sub_ids:
            sub_id = sub_ids[0]
            if not cfg.subscription_identifier_available:
                raise ProtocolViolation(0xA1, "subscription identifiers not supported")
            if sub_id == 0:
                raise ProtocolViolation(0x82, "subscription identifier 0")
        # 1. validity, per filter: None (valid so far) or the reason code
        entries = []
        for request in packet.subscriptions:
            topic_filter = request.topic_filter
            code = None
            share = None
            try:
                validate_topic_filter(topic_filter)
                share = parse_shared_subscription(topic_filter)
            except TopicError:
                code = 0x8F if v5 else 0x80
            if code is None and share is not None:
                if not cfg.shared_subscription_available:
                    code = 0x9E if v5 else 0x80
                elif request.no_local:
                    raise ProtocolViolation(0x82, "no local on a shared subscription")  # [MQTT-3.8.3-4]
            real_filter = share[1] if share else topic_filter
            if code is None and not cfg.wildcard_subscription_available and (
                    "+" in real_filter or "#" in real_filter):
                code = 0xA2 if v5 else 0x80
            entries.append((request, share, real_filter, code))
        # 2. authorization of the valid ones, possibly asynchronous
        decisions = [self.broker.authorize("subscribe", session, self.auth, real_filter)
                     if code is None else False
                     for request, share, real_filter, code in entries]
        if all(type(d) is bool for d in decisions):
            self._subscribe(session, packet, entries, decisions, sub_id)
            return
        self._hold()
        d = defer.gatherResults([defer.maybeDeferred(lambda x=x: x) for x in decisions],
                                consumeErrors=True)
        d.addCallback(lambda answers: self.session is session and not self._closing and (
            self._subscribe(session, packet, entries, answers, sub_id), self._release()))
        d.addErrback(self._internal_error)

    def _subscribe(self, session, packet: Subscribe, entries: list, decisions: list,
                   sub_id: int | None) -> None:
        """Apply the authorized subscriptions, send SUBACK (after the session
        store has them, for a persistent session), then retained messages."""
        cfg = self.broker.config.mqtt
        v5 = self.protocol_level >= MQTT_5
        sessions = self.broker.sessions
        codes = []
        retained = []
        for (request, share, real_filter, code), allowed in zip(entries, decisions):
            topic_filter = request.topic_filter
            if code is None and not allowed:
                code = 0x87 if v5 else 0x80  # NOT_AUTHORIZED
            if code is not None:
                codes.append(code)
                self.broker.hooks_client_subscribed(session, topic_filter, None, code)
                continue
            qos = min(request.qos, cfg.max_qos)
            options = SubscriptionOptions(qos, request.no_local, request.retain_as_published,
                                          request.retain_handling, sub_id)
            is_new = sessions.subscribe(session, topic_filter, options)
            codes.append(qos)
            self.broker.hooks_client_subscribed(session, topic_filter, options, qos)
            if share is None and cfg.retain_available and (
                    request.retain_handling == 0 or (request.retain_handling == 1 and is_new)):
                retained.append((real_filter, options))
        suback = Suback(packet.packet_id, codes)

        def send_suback(_=None):
            if self.session is not session:
                return
            self.send(suback)
            now = self.broker.clock.seconds()
            for real_filter, options in retained:
                sids = (options.subscription_id,) if options.subscription_id else ()
                for message in self.broker.router.retained_for(real_filter):
                    session.deliver(message, min(message.qos, options.qos), True, sids, None, now)

        if session.persistent:
            sessions.save(session).addCallbacks(send_suback, self._store_failed)
        else:
            send_suback()

    def recheck_subscriptions(self) -> None:
        """After the client's authorization rules changed: drop the
        subscriptions they no longer allow (logged)."""
        session, auth = self.session, self.auth
        if session is None or auth is None or auth.rules is None:
            return
        dropped = []
        for topic_filter in list(session.subscriptions):
            share = parse_shared_subscription(topic_filter)
            if not auth.rules.may_subscribe(share[1] if share else topic_filter):
                self.broker.sessions.unsubscribe(session, topic_filter)
                dropped.append(topic_filter)
        if dropped:
            self.log.info("subscriptions of {client_id} no longer authorized, removed: {filters}",
                          client_id=session.client_id, filters=dropped)
            if session.persistent:
                self.broker.sessions.save(session)

    def _store_failed(self, failure) -> None:
        self.log.failure("session store write for {client_id} failed", failure,
                         client_id=self._client_id())
        self.disconnect(0x80)

    def handle_unsubscribe(self, packet: Unsubscribe) -> None:
        session = self.session
        v5 = self.protocol_level >= MQTT_5
        codes = []
        for topic_filter in packet.topic_filters:
            try:
                validate_topic_filter(topic_filter)
                parse_shared_subscription(topic_filter)
            except TopicError:
                codes.append(0x8F)
                continue
            existed = self.broker.sessions.unsubscribe(session, topic_filter)
            codes.append(0x00 if existed else 0x11)
            self.broker.hooks_client_unsubscribed(session, topic_filter, codes[-1])
        unsuback = Unsuback(packet.packet_id, codes if v5 else [])
        if session.persistent:
            self.broker.sessions.save(session).addCallbacks(
                lambda _: self.session is session and self.send(unsuback), self._store_failed)
        else:
            self.send(unsuback)

    # -- the rest ----------------------------------------------------------------------

    def handle_pingreq(self, packet: Pingreq) -> None:
        self.send(Pingresp())

    def handle_disconnect(self, packet: Disconnect) -> None:
        """DISCONNECT 0x00 discards the will [MQTT-3.14.4-3]; 0x04 keeps it.
        A v5 client may change the session expiry interval, but not from 0
        [MQTT-3.14.2-2]."""
        session = self.session
        if self.protocol_level >= MQTT_5:
            expiry = packet.properties.get(Property.SESSION_EXPIRY_INTERVAL)
            if expiry is not None:
                asked = self.connect_packet.properties.get(Property.SESSION_EXPIRY_INTERVAL, 0)
                if asked == 0 and expiry != 0:
                    raise ProtocolViolation(0x82, "session expiry interval changed from 0")
                session.expiry_interval = min(
                    expiry, self.broker.config.mqtt.max_session_expiry_interval)
        self._normal_disconnect = packet.reason_code != 0x04
        self._disconnect_reason = packet.reason_code
        self._closing = True
        self.setTimeout(None)
        self.transport.loseConnection()

    _handlers = {
        Publish: handle_publish,
        Puback: handle_puback,
        Pubrec: handle_pubrec,
        Pubrel: handle_pubrel,
        Pubcomp: handle_pubcomp,
        Subscribe: handle_subscribe,
        Unsubscribe: handle_unsubscribe,
        Pingreq: handle_pingreq,
        Disconnect: handle_disconnect,
        Auth: ConnectFlow.handle_auth,
    }


class MQTTFactory(protocol.Factory):
    """Builds :class:`MQTTProtocol` for one listener and enforces its
    connection limit.

    :param broker: the :class:`tbmq.broker.broker.Broker`.
    :param listener: the :class:`tbmq.config.ListenerConfig`.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, broker, listener) -> None:
        self.broker = broker
        self.listener = listener
        self.max_packet_size = listener.max_packet_size or broker.config.mqtt.max_packet_size
        self.active = 0

    def buildProtocol(self, addr):
        limit = self.listener.max_connections
        if limit and self.active >= limit:
            self.log.warn("listener {name}: connection limit {limit} reached; refusing {addr}",
                          name=self.listener.name, limit=limit, addr=addr)
            return None
        self.active += 1
        proto = MQTTProtocol(self.broker, self.listener, self.max_packet_size)
        proto.factory = self
        return proto
