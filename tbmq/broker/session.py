"""One client's session: what it publishes and subscribes to, the QoS flows
both ways, its packet identifiers and topic aliases (MQTT 5.0 §4.1, §4.3,
§4.8, §4.9, §3.3.2.3.4).

The session decides; the connection (:class:`tbmq.broker.protocol.MQTTProtocol`)
only moves bytes.  A session gets its few collaborators in one
:class:`SessionContext`, never the node, and sees its connection through a
:class:`~tbmq.broker.link.Link` (protocol level, send quota, maximum packet
size, topic alias maximum, paused, auth, write).  It keeps the client's
identity, inbound QoS state and subscriptions, and owns its parts: the
:class:`~tbmq.broker.outbox.Outbox` (outbound window, packet identifiers,
queue), which owns a :class:`~tbmq.broker.holding.SourceHolds` from its
first hold and a persistent session's
:class:`~tbmq.broker.store_reads.StoreReader` from its first read, and, from
its client's first PUBLISH, the
:class:`~tbmq.broker.publisher_acks.PublisherAcks` (the PUBACKs and PUBRECs
owed to the client's publishes, in order, and the publishes the bus has not
answered yet).
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import defer
from twisted.logger import Logger

from tbmq.broker.outbox import Outbox
from tbmq.broker.publish_done import WAITING, PublishDone
from tbmq.broker.publish_run import PublishRun, plain_columns, plain_run
from tbmq.broker.publisher_acks import PublisherAcks
from tbmq.broker.session_context import (  # noqa: F401 - the session's context, re-exported
    SessionContext, TopicNameCache, next_seq, valid_utf8,
)
from tbmq.cluster.message_arrays import published_messages
from tbmq.errors import BusClosedError, ProtocolViolation
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import ClientType, Message, StoredDelivery, SubscriptionOptions
from tbmq.views import SessionView
from tbmq.mqtt import (
    MQTT_5, Property, Puback, Pubcomp, Publish, Pubrec, Pubrel, ReasonCode, Suback,
    SubackReturnCode, Subscribe, Unsuback, Unsubscribe,
)
from tbmq.mqtt.codec import encode_puback
from tbmq.mqtt.topics import (
    TooManyLevels,
    TopicError,
    check_levels,
    parse_shared_subscription,
    validate_topic_filter,
    validate_topic_name,
)

#: the session expiry interval that means "never expires" (§3.1.2.11.2)
EXPIRY_NEVER = 0xFFFFFFFF

#: unacknowledged QoS 1/2 PUBLISHes a v3 client may have towards the broker:
#: it is never told ``mqtt.receive_maximum``, so it is held to the packet
#: identifier space
V3_RECEIVE_MAXIMUM = 65535

#: a session's inbound QoS 2 packet ids while it has none
_NO_IDS: frozenset = frozenset()
#: an empty mapping shared by the sessions that have no subscriptions, topic
#: aliases, cached authorizations or APPLICATION consumers yet: never
#: written (a dict is made at the first entry; an empty one is 64 bytes)
_NO_ENTRIES: dict = {}


class Session:
    """The state of one client id.

    :ivar client_id: the client identifier.
    :ivar persistent: True when the session outlives the connection (TBMQ's
        persistent client; v3 ``cleanSession=0``, v5 session expiry > 0).
    :ivar expiry_interval: session expiry interval, seconds.
    :ivar client_type: DEVICE or APPLICATION.
    :ivar subscriptions: topic filter → :class:`SubscriptionOptions` (a
        shared empty mapping, never written, until the first subscription:
        :meth:`tbmq.broker.sessions.SessionManager.subscribe` makes the dict).
    :ivar connection: the live connection, or None while offline.
    :ivar acks: the :class:`~tbmq.broker.publisher_acks.PublisherAcks` part
        (the acknowledgements owed to the client's publishes), or None
        until the first PUBLISH needs it (:meth:`publisher_acks`).
    :ivar inbound_unacked: QoS 1 PUBLISHes of the client not acknowledged
        yet (the receive maximum counts them [MQTT-3.3.4-9]).
    :ivar dropped: messages dropped for this session, by reason.
    :ivar address: ``host:port`` of the client's last connection, or None.
    :ivar username: the user name it last authenticated with, or None.
    :ivar credentials_name: the name of the credentials record that last
        admitted it, or None.
    """

    log = Logger(observer=LOG_OBSERVER)

    # attributes in slots, not in a dict per session (CPython shares instance
    # dicts' keys up to 30 attributes only: past that, 1.6 KB each)
    __slots__ = tuple("""ctx client_id persistent expiry_interval protocol_level client_type subscriptions
        connection disconnected_at inbound_qos2 inbound_unacked aliases acks _spare _run _allowed
        _allowed_for will will_timer expiry_timer session_id connected_at address username
        credentials_name _view link outbox app_consumers _received _received_bytes rate_in
        rate_out""".split())

    def __init__(self, ctx: SessionContext, client_id: str, persistent: bool,
                 expiry_interval: int = 0, protocol_level: int = 4,
                 client_type: ClientType = ClientType.DEVICE) -> None:
        self.ctx = ctx
        self.client_id = client_id
        self.persistent = persistent
        self.expiry_interval = expiry_interval
        self.protocol_level = protocol_level
        self.client_type = client_type
        # a dict from the first subscription (SessionManager.subscribe)
        self.subscriptions: dict[str, SubscriptionOptions] = _NO_ENTRIES
        self.connection: Any = None
        #: what the session sees of its connection: its
        #: :class:`~tbmq.broker.link.Link`, or None while offline
        self.link: Any = None
        self.disconnected_at: float | None = None
        # inbound QoS 2 packet ids from the PUBLISH to the PUBREL [MQTT-4.3.3-10]
        self.inbound_qos2: set[int] | frozenset = _NO_IDS  # a set from the first QoS 2 PUBLISH
        self.inbound_unacked = 0
        # the client's buckets of mqtt.rate_limits, made at first use when enabled
        self.rate_in = self.rate_out = None
        # topic aliases of the current connection [MQTT-3.3.2-7]
        self.aliases: dict[int, str] = _NO_ENTRIES  # a dict from the first alias
        # PUBACK/PUBREC in order [MQTT-4.6.0-2], and the publishes handed to
        # the pipeline and not yet accepted by the bus: made at first use
        self.acks: PublisherAcks | None = None
        # the done of the next publish (PublishDone), reused while the bus
        # answers during the call
        self._spare: PublishDone | None = None
        # the PublishRun gathering a read's PUBLISHes (gather_publishes), or None
        self._run: PublishRun | None = None
        # topic name → (allowed, until): the publish authorization cache,
        # valid for the AuthResult it was filled under
        self._allowed: dict[str, tuple[bool, float]] = _NO_ENTRIES  # a dict from the first
        self._allowed_for = None
        self.will = None
        self.will_timer = None
        self.expiry_timer = None
        #: the id of the connection that holds (or last held) the session
        self.session_id = ""
        self.connected_at: float | None = None
        # who the client is (SessionManager sets them at each connect)
        self.address: str | None = None
        self.username: str | None = None
        self.credentials_name: str | None = None
        self._view: SessionView | None = None  # made when a plugin is first shown the session
        #: the consumers of a persistent APPLICATION's topics while it is
        #: connected here: None → ``tbmq.msg.app.<clientId>``, a shared
        #: subscription's filter → ``tbmq.msg.app.shared.<filter>``
        self.app_consumers: dict = _NO_ENTRIES  # a dict from the first (ApplicationReader.follow)
        # the node's counters of PUBLISH packets received (one add each)
        self._received = ctx.traffic.received
        self._received_bytes = ctx.traffic.received_bytes
        #: the outbound part: :class:`~tbmq.broker.outbox.Outbox` (the
        #: router calls its ``deliver``: no frame of the session's on the way)
        self.outbox = Outbox(self, ctx.clock.seconds())

    def publisher_acks(self) -> PublisherAcks:
        """:returns: :attr:`acks`, made at the first call (a client that
        never publishes holds none), the PUBLISHes gathered so far handed
        on first (:meth:`publish_gathered`: what is queued now comes after
        them)."""
        if self._run is not None:  # an acknowledgement out of the run comes after it
            self.publish_gathered()
        acks = self.acks
        if acks is None:
            acks = self.acks = PublisherAcks(self)
        return acks

    @property
    def view(self) -> SessionView:
        """What plugins see of this session: its :class:`~tbmq.views.SessionView`,
        made at the first call (most sessions are never shown to a plugin)."""
        view = self._view
        if view is None:
            view = self._view = SessionView(self)
        return view

    # -- PUBLISH from the client ------------------------------------------------------

    def on_publish(self, packet: Publish):
        """Resolve the topic alias, check the rules and the receive maximum,
        ask the authorization hooks, hand the message to the pipeline and
        acknowledge it once it is durable [MQTT-4.3.2-4, MQTT-4.3.3-8].
        A topic name with more than ``mqtt.max_topic_levels`` levels is well
        formed but not accepted: a v5 QoS 1/2 message gets PUBACK / PUBREC
        0x90 Topic Name invalid and is dropped; QoS 0 (nothing to answer
        with) and v3 (no negative acknowledgement, [MQTT-3.3.5-2]) end the
        connection with 0x90.

        :returns: None, or a Deferred while the authorization is being
            decided (the connection holds the packets after this one).
        :raises ProtocolViolation: with the reason code of the rule broken.
        """
        conn = self.link
        now = self.ctx.clock.seconds()  # the time of receipt, read once
        if packet.qos < 2 and not packet.properties:  # (what plain_run can take)
            plain = self._plain_way(conn, now)
            if plain is not None:
                taken, unacked = plain_run((packet,), 0, self.inbound_unacked, *plain)
                if taken:
                    self.inbound_unacked = unacked
                    self._publish(packet, packet.topic, conn, now, plain[0])
                    return None
        mqtt = self.ctx.mqtt
        v5 = conn.protocol_level >= MQTT_5
        qos = packet.qos
        topic = packet.topic
        props = packet.properties
        if v5 and props:
            alias = props.get(Property.TOPIC_ALIAS)
            if alias is not None:
                if alias == 0 or alias > mqtt.topic_alias_maximum:
                    raise ProtocolViolation(ReasonCode.TOPIC_ALIAS_INVALID,
                                            "topic alias out of range")
                if topic:
                    aliases = self.aliases
                    if aliases is _NO_ENTRIES:
                        aliases = self.aliases = {}
                    aliases[alias] = topic
                else:
                    topic = self.aliases.get(alias)
                    if topic is None:
                        raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR, "unknown topic alias")
            if Property.SUBSCRIPTION_IDENTIFIER in props:
                raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR,
                                        "subscription identifier in PUBLISH")
            response_topic = props.get(Property.RESPONSE_TOPIC)
            if response_topic is not None:
                try:
                    validate_topic_name(response_topic)
                except TopicError:
                    raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR, "invalid response topic")
        topics = self.ctx.topics
        too_deep = None
        if topic not in topics:
            try:
                topics.check(topic, mqtt.max_topic_levels)
            except TooManyLevels as e:
                if qos == 0 or not v5:
                    raise ProtocolViolation(ReasonCode.TOPIC_NAME_INVALID, str(e))
                too_deep = str(e)  # refused in its acknowledgement, below
            except TopicError as e:
                raise ProtocolViolation(ReasonCode.TOPIC_NAME_INVALID, f"invalid topic name: {e}")
        if qos > mqtt.max_qos:
            raise ProtocolViolation(ReasonCode.QOS_NOT_SUPPORTED, "QoS not supported")
        if packet.retain and not mqtt.retain_available:
            raise ProtocolViolation(ReasonCode.RETAIN_NOT_SUPPORTED, "retain not supported")
        pid = packet.packet_id
        if qos:
            if qos == 2 and pid in self.inbound_qos2:
                # a resent PUBLISH is not routed again; its PUBREC follows the
                # first one's (QoS 2 method A, [MQTT-4.3.3-9])
                self.publisher_acks().ack_when(None, Pubrec(pid), duplicate=True)
                return None
            # a v3 client is never told the receive maximum
            if self.inbound_unacked + len(self.inbound_qos2) >= (
                    mqtt.receive_maximum if v5 else V3_RECEIVE_MAXIMUM):
                raise ProtocolViolation(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                                        "receive maximum exceeded")  # [MQTT-3.3.4-9]
            if qos == 1:
                self.inbound_unacked += 1
            else:
                if not self.inbound_qos2:
                    self.inbound_qos2 = set()
                self.inbound_qos2.add(pid)  # until PUBREL [MQTT-4.3.3-10]
            if too_deep is not None:
                # well formed but not accepted: 0x90 Topic Name invalid, the
                # connection goes on (§3.4.2.1)
                self.log.info("PUBLISH of {client_id} refused (0x90): {error}",
                              client_id=self.client_id, error=too_deep)
                self.publisher_acks().ack_when(None, (Puback if qos == 1 else Pubrec)(
                    pid, ReasonCode.TOPIC_NAME_INVALID))
                return None
        limits = self.ctx.limits_in
        if limits is not None and limits.admit_incoming(self) is not None:
            self._over_rate(packet, conn, v5)
            return None
        if v5 and props.get(Property.PAYLOAD_FORMAT_INDICATOR) == 1 and not valid_utf8(packet.payload):
            # payload format 1 must be UTF-8 [MQTT-3.3.2-4]: refused with 0x99
            if qos == 0:
                raise ProtocolViolation(ReasonCode.PAYLOAD_FORMAT_INVALID, "payload is not UTF-8")
            self.publisher_acks().ack_when(None, (Puback if qos == 1 else Pubrec)(
                pid, ReasonCode.PAYLOAD_FORMAT_INVALID))
            return None
        hit = self._allowed.get(topic) if conn.auth is self._allowed_for else None
        if hit is not None and hit[1] > now:
            allowed = hit[0]  # the authorization cache
        else:
            allowed = self._may_publish(topic, conn, now)
        if allowed is True:
            self._publish(packet, topic, conn, now, v5)
            return None
        if allowed is False:
            self._publish_denied(packet, topic, conn)
            return None

        def decided(allowed: bool) -> None:
            if self.link is not conn:
                return
            if allowed:
                self._publish(packet, topic, conn, self.ctx.clock.seconds(), v5)
            else:
                self._publish_denied(packet, topic, conn)

        return allowed.addCallback(decided)

    def on_publishes(self, packets: list, start: int) -> int:
        """The :class:`~tbmq.mqtt.Publish` packets of ``packets`` from
        ``start`` on, as :meth:`on_publish` each, while a run is gathered
        (:meth:`gather_publishes`) and each takes the plain way
        (:func:`plain_run`, :meth:`on_publish`'s first check, made on the
        run's columns: :func:`~tbmq.broker.publish_run.plain_columns`), the
        settings and the clock read once for them all (one time of receipt).

        :returns: the index of the first packet not handled (not a PUBLISH,
            or one that goes the whole way); ``start`` when none was."""
        run = self._run
        conn = self.link
        plain = self._plain_way(conn, self.ctx.clock.seconds()) \
            if run is not None and conn is run.conn else None
        if plain is None:
            return start
        unacked = self.inbound_unacked
        end, after, topics, payloads, qoss, retains, pids = plain_columns(
            packets, start, unacked, *plain)
        if end == start:
            return start
        self.inbound_unacked = after
        run.messages.extend(published_messages(  # (no properties: plain_run)
            topics, payloads, qoss, retains, self.client_id, plain[5]))
        run.packet_ids += pids
        ones = after - unacked  # QoS 1 (the others QoS 0)
        received, received_bytes = self._received, self._received_bytes
        received[1] += ones
        received[0] += end - start - ones
        if ones == 0 or ones == end - start:
            received_bytes[1 if ones else 0] += sum(map(len, payloads))
        else:
            for qos, payload in zip(qoss, payloads):
                received_bytes[qos] += len(payload)
        return end

    def _plain_way(self, conn, now: float) -> tuple | None:
        """What a PUBLISH of ``conn`` received at ``now`` (the clock's
        seconds) is checked against for the plain way (:func:`plain_run`),
        read once: ``(v5, max_qos, retain_ok, topics, allowed, now,
        limit)`` (``max_qos`` at most 1, ``limit`` the receive maximum less the
        QoS 2 flows open); None when none takes it (a rate limit on
        incoming PUBLISHes, a ``message_published`` hook)."""
        ctx = self.ctx
        if ctx.limits_in is not None or ctx.hooks.wants_published:
            return None
        mqtt = ctx.mqtt
        v5 = conn.protocol_level >= MQTT_5
        return (v5, 1 if mqtt.max_qos > 1 else mqtt.max_qos, mqtt.retain_available, ctx.topics,
                self._allowed if conn.auth is self._allowed_for else _NO_ENTRIES, now,
                (mqtt.receive_maximum if v5 else V3_RECEIVE_MAXIMUM) - len(self.inbound_qos2))

    def _may_publish(self, topic: str, conn, now: float):
        """The authorization hooks' answer for a PUBLISH to ``topic``, from
        the connection's cache when it holds a fresh one (EMQX's
        authorization cache: ``auth.cache_size`` names for
        ``auth.cache_ttl`` seconds, forgotten when the connection's
        authorization changes).

        :returns: a bool, or a Deferred firing with one.
        """
        cache = self._allowed
        auth = conn.auth
        if auth is not self._allowed_for:
            if cache:
                cache.clear()
            self._allowed_for = auth
        hit = cache.get(topic)
        if hit is not None and hit[1] > now:
            return hit[0]
        allowed = self.ctx.hooks.authorize("publish", self, auth, topic)
        settings = self.ctx.auth
        if type(allowed) is bool and settings is not None and settings.cache_size:
            if cache is _NO_ENTRIES:
                cache = self._allowed = {}
            elif len(cache) >= settings.cache_size:
                del cache[next(iter(cache))]  # the oldest
            cache[topic] = (allowed, now + settings.cache_ttl)
        return allowed

    def _over_rate(self, packet: Publish, conn, v5: bool) -> None:
        """A PUBLISH over ``mqtt.rate_limits.incoming_publish`` or
        ``total`` (counted and logged by
        :class:`~tbmq.broker.limits.NodeLimits`), not routed: a v5 QoS 1/2
        one gets PUBACK / PUBREC QUOTA_EXCEEDED (0x97, as TBMQ: 0x96 Message
        rate too high is a DISCONNECT reason code only, not one of PUBACK's
        [MQTT-3.4.2.1] or PUBREC's [MQTT-3.5.2.1]), a v5 QoS 0 one is
        dropped (as TBMQ), and a v3 client, which has no negative
        acknowledgement [MQTT-3.3.5-2], is disconnected (as TBMQ)."""
        if not v5:
            conn.disconnect(ReasonCode.MESSAGE_RATE_TOO_HIGH)
        elif packet.qos:
            self.publisher_acks().ack_when(None, (Puback if packet.qos == 1 else Pubrec)(
                packet.packet_id, ReasonCode.QUOTA_EXCEEDED))

    def _publish_denied(self, packet: Publish, topic: str, conn) -> None:
        """Not authorized: the message is dropped; v5 QoS 1/2 get 0x87, v3
        gets a plain acknowledgement (it has no negative one), as Mosquitto."""
        self.log.debug("{client_id} may not publish to {topic}",
                       client_id=self.client_id, topic=topic)
        self.ctx.drops.add("not_authorized")
        code = (ReasonCode.NOT_AUTHORIZED if conn.protocol_level >= MQTT_5
                else ReasonCode.SUCCESS)
        if packet.qos == 1:
            self.publisher_acks().ack_when(None, Puback(packet.packet_id, code))
        elif packet.qos == 2:
            self.publisher_acks().ack_when(None, Pubrec(packet.packet_id, code))

    def _publish(self, packet: Publish, topic: str, conn, now: float, v5: bool) -> None:
        """Hand the message to the pipeline; acknowledge once it is durable.

        :param now: seconds since the epoch (the time of receipt).
        :param v5: the connection speaks MQTT 5.0."""
        qos = packet.qos
        props = packet.properties
        expires_at = None
        if v5 and props:
            expiry = props.get(Property.MESSAGE_EXPIRY_INTERVAL)
            if expiry is not None:
                expires_at = now + expiry
            if Property.TOPIC_ALIAS in props:
                props = dict(props)
                del props[Property.TOPIC_ALIAS]
        message = Message(topic, packet.payload, qos, packet.retain,
                          props if v5 else {}, self.client_id, now, expires_at)
        self._received[qos] += 1
        self._received_bytes[qos] += len(packet.payload)
        hooks = self.ctx.hooks
        if hooks.wants_published:
            hooks.message_published(self, message)
        run = self._run
        if run is not None:  # handed on with the read's others (publish_gathered)
            run.messages.append(message)
            run.packet_ids.append(packet.packet_id)
            if qos == 2:
                run.qos2 = True
            return
        self._hand_on(message, qos, packet.packet_id, conn)

    def gather_publishes(self, conn) -> None:
        """The PUBLISHes of ``conn`` (the live link) handled from now on
        are handed to the pipeline together, by :meth:`publish_gathered`
        (the connection calls both around a read of several packets: see
        :mod:`tbmq.broker.publish_run`)."""
        if self.ctx.publish_many is not None:
            self._run = PublishRun(conn)

    def publish_gathered(self) -> None:
        """Hand the PUBLISHes gathered since :meth:`gather_publishes` to
        the pipeline: one message as by itself, several with one
        ``publish_many`` and one ``done``
        (:meth:`~tbmq.broker.publish_run.PublishRun.hand_on`).  Gathering
        stops; called before anything that must come after them (a packet
        that is not a PUBLISH, an acknowledgement queued out of turn, the
        end of the read)."""
        run = self._run
        if run is None:
            return
        self._run = None
        messages = run.messages
        if len(messages) > 1:
            acks = self.acks
            if acks is None:
                acks = self.publisher_acks()
            run.hand_on(self.ctx.publish_many, acks, self.link)
        elif messages:
            self._hand_on(messages[0], messages[0].qos, run.packet_ids[0], run.conn)

    def _hand_on(self, message: Message, qos: int, packet_id: int | None, conn) -> None:
        """Hand one message to the pipeline; acknowledge it once it is durable."""
        done = self._spare
        if done is None:
            acks = self.acks
            if acks is None:
                acks = self.publisher_acks()
            spares = acks.spares  # (answered later ones, kept for reuse)
            done = spares.pop() if spares else PublishDone(acks)
        else:
            self._spare = None  # (a publish from inside this one takes another)
        self.ctx.publish(message, done.call)
        answer = done.answer
        if answer is None:
            # held during the call: acknowledged now, and the done is reused
            done.answer = WAITING
            self._spare = done
            if qos == 1:
                acks = done.acks
                if not acks.queue:
                    self.inbound_unacked -= 1
                    conn.write(encode_puback(packet_id))
                else:
                    acks.ack_when(None, Puback(packet_id))
            elif qos == 2:
                done.acks.ack_when(None, Pubrec(packet_id))
            return
        # the bus answers later (or refused it during the call)
        done.acks.pending(done, conn, qos, packet_id, self.link)
        if answer is not WAITING:
            done.call(answer)

    def on_pubrel(self, packet: Pubrel) -> None:
        """PUBREL from the client ends an inbound QoS 2 flow with PUBCOMP;
        an unknown packet id gets 0x92 in v5 [MQTT-4.3.3-11]."""
        conn = self.link
        if packet.packet_id in self.inbound_qos2:
            self.inbound_qos2.discard(packet.packet_id)
            conn.send(Pubcomp(packet.packet_id))
        else:
            conn.send(Pubcomp(packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
                               if conn.protocol_level >= MQTT_5 else ReasonCode.SUCCESS))

    # -- SUBSCRIBE / UNSUBSCRIBE -------------------------------------------------------

    def on_subscribe(self, packet: Subscribe):
        """Per-filter reason codes [MQTT-3.9.3]; retained messages after the
        SUBACK as the retain handling says [MQTT-3.3.1-9, -10, -11].  A
        filter with more than ``mqtt.max_topic_levels`` levels gets 0x8F
        Topic Filter invalid; a new one beyond ``mqtt.max_subscriptions``
        0x97 Quota exceeded (v3: 0x80 Failure for both) [MQTT-3.9.3-1].

        :returns: None, or a Deferred while authorizations are decided.
        :raises ProtocolViolation: for a malformed request.
        """
        conn = self.link
        mqtt = self.ctx.mqtt
        v5 = conn.protocol_level >= MQTT_5
        sub_ids = packet.properties.get(Property.SUBSCRIPTION_IDENTIFIER) if v5 else None
        sub_id = None
        if sub_ids:
            sub_id = sub_ids[0]
            if not mqtt.subscription_identifier_available:
                raise ProtocolViolation(ReasonCode.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
                                        "subscription identifiers not supported")
            if sub_id == 0:
                raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR, "subscription identifier 0")
        # 1. validity, per filter: None (valid so far) or the reason code
        entries = []
        for request in packet.subscriptions:
            topic_filter = request.topic_filter
            code = None
            share = None
            try:
                validate_topic_filter(topic_filter)
                share = parse_shared_subscription(topic_filter)
                check_levels(share[1] if share else topic_filter, mqtt.max_topic_levels)
            except TopicError as e:
                self.log.debug("{client_id} may not subscribe to {filter}: {error}",
                               client_id=self.client_id, filter=topic_filter[:200], error=str(e))
                code = ReasonCode.TOPIC_FILTER_INVALID if v5 else SubackReturnCode.FAILURE
            if code is None and share is not None:
                if not mqtt.shared_subscription_available:
                    code = (ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED if v5
                            else SubackReturnCode.FAILURE)
                elif request.no_local:
                    raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR,
                                            "no local on a shared subscription")  # [MQTT-3.8.3-4]
            real_filter = share[1] if share else topic_filter
            if code is None and not mqtt.wildcard_subscription_available and (
                    "+" in real_filter or "#" in real_filter):
                code = (ReasonCode.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED if v5
                        else SubackReturnCode.FAILURE)
            entries.append((request, share, real_filter, code))
        # 2. authorization of the valid ones, possibly asynchronous
        authorize = self.ctx.hooks.authorize
        decisions = [authorize("subscribe", self, conn.auth, real_filter)
                     if code is None else False
                     for request, share, real_filter, code in entries]
        if all(type(d) is bool for d in decisions):
            self._subscribe(packet, entries, decisions, sub_id, conn)
            return None
        d = defer.gatherResults([defer.maybeDeferred(lambda x=x: x) for x in decisions],
                                consumeErrors=True)
        return d.addCallback(lambda answers: self.link is conn and self._subscribe(
            packet, entries, answers, sub_id, conn))

    def _subscribe(self, packet: Subscribe, entries: list, decisions: list,
                   sub_id: int | None, conn) -> None:
        """Apply the authorized subscriptions, send SUBACK once the
        subscriptions are stored (a persistent session), then retained
        messages."""
        mqtt = self.ctx.mqtt
        hooks = self.ctx.hooks
        book = self.ctx.subscriptions
        v5 = conn.protocol_level >= MQTT_5
        codes = []
        retained = []
        limit = mqtt.max_subscriptions
        for (request, share, real_filter, code), allowed in zip(entries, decisions):
            topic_filter = request.topic_filter
            if code is None and not allowed:
                code = ReasonCode.NOT_AUTHORIZED if v5 else SubackReturnCode.FAILURE
            if (code is None and limit and len(self.subscriptions) >= limit
                    and topic_filter not in self.subscriptions):
                self.log.info("{client_id} has {limit} subscriptions, the most allowed: "
                              "{filter} refused", client_id=self.client_id, limit=limit,
                              filter=topic_filter[:200])
                code = ReasonCode.QUOTA_EXCEEDED if v5 else SubackReturnCode.FAILURE
            if code is not None:
                codes.append(code)
                hooks.client_subscribed(self, topic_filter, None, code)
                continue
            qos = min(request.qos, mqtt.max_qos)
            options = SubscriptionOptions(qos, request.no_local, request.retain_as_published,
                                          request.retain_handling, sub_id)
            is_new = book.subscribe(self, topic_filter, options)
            reader = self.outbox.reader  # (a persistent DEVICE session's)
            if reader is not None:  # its store may hold deliveries for it from now on
                reader.on_subscribed()
            codes.append(qos)
            hooks.client_subscribed(self, topic_filter, options, qos)
            if share is None and mqtt.retain_available and (
                    request.retain_handling == 0 or (request.retain_handling == 1 and is_new)):
                retained.append((real_filter, options))
        suback = Suback(packet.packet_id, codes)

        def send_suback(_=None):
            if self.link is not conn:
                return
            conn.send(suback)
            now = self.ctx.clock.seconds()
            for real_filter, options in retained:
                sids = (options.subscription_id,) if options.subscription_id else ()
                for message in self.ctx.retained_for(real_filter):
                    self._replay_retained(message, min(message.qos, options.qos), sids, now)

        self._after_save(send_suback, conn)

    def _replay_retained(self, message: Message, qos: int, sids: tuple, now: float) -> None:
        """A retained message for a new subscription, RETAIN set [MQTT-3.3.1-9]."""
        if qos and self.persistent:
            delivery = StoredDelivery(next_seq(int(now * 1e9)), message, qos, True, sids)
            self.ctx.device_store.add(self.client_id, [delivery])
            self.outbox.deliver_stored(delivery, None, now)
        else:
            self.outbox.deliver(message, qos, True, sids, None, now)

    def _after_save(self, then: Callable, conn) -> None:
        """Publish the subscriptions, then run ``then`` once this node's
        trie has them (and the bus holds them: Kafka acknowledged, or the
        embedded default's topic log stored them): SUBACK promises that
        matching messages published afterwards are delivered."""
        result = self.ctx.subscriptions.save(self)
        if result is None:
            then()
            return

        def failed(failure):
            self.log.failure("storing the subscriptions of {client_id} failed", failure,
                             client_id=self.client_id)
            if self.link is conn and conn is not None:
                conn.disconnect(ReasonCode.UNSPECIFIED_ERROR)

        result.addCallbacks(then, failed)

    def on_unsubscribe(self, packet: Unsubscribe) -> None:
        """UNSUBACK with a reason code per filter (v5) [MQTT-3.10.4]."""
        conn = self.link
        v5 = conn.protocol_level >= MQTT_5
        book = self.ctx.subscriptions
        codes = []
        for topic_filter in packet.topic_filters:
            try:
                validate_topic_filter(topic_filter)
                parse_shared_subscription(topic_filter)
            except TopicError:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                continue
            existed = book.unsubscribe(self, topic_filter)
            codes.append(ReasonCode.SUCCESS if existed else ReasonCode.NO_SUBSCRIPTION_EXISTED)
            self.ctx.hooks.client_unsubscribed(self, topic_filter, codes[-1])
        unsuback = Unsuback(packet.packet_id, codes if v5 else [])
        self._after_save(lambda _=None: self.link is conn and conn.send(unsuback), conn)

    def recheck_subscriptions(self, rules) -> list[str]:
        """After the client's authorization rules changed: drop the
        subscriptions ``rules`` no longer allow.

        :returns: the topic filters removed.
        """
        dropped = []
        for topic_filter in list(self.subscriptions):
            share = parse_shared_subscription(topic_filter)
            if not rules.may_subscribe(share[1] if share else topic_filter):
                self.ctx.subscriptions.unsubscribe(self, topic_filter)
                dropped.append(topic_filter)
        if dropped:
            self.ctx.subscriptions.save(self)
        return dropped

    # -- connection life cycle -------------------------------------------------------

    def attach(self, connection) -> None:
        """Bind a new connection; acks pending for the old one are void,
        topic aliases both ways start empty [MQTT-3.3.2-7]."""
        if self._run is not None:  # the old connection's, handed on first
            self.publish_gathered()
        self.connection = connection
        link = self.link = connection.make_link()
        self.protocol_level = connection.protocol_level
        self.disconnected_at = None
        acks = self.acks
        if acks is not None:
            acks.attach()
        self.inbound_unacked = 0
        self.aliases = _NO_ENTRIES
        self.outbox.attach(link)

    def detach(self, now: float) -> None:
        """The connection is gone; a persistent session keeps its state in
        the stores (and its application topic) and gives its memory back."""
        self.publish_gathered()
        if self.app_consumers:
            self.ctx.applications.detach(self)
        if self.connection is not None and self._uses_device_store():
            self._mark(False)
        self.connection = self.link = None
        self.disconnected_at = now
        acks = self.acks
        if acks is not None:
            acks.detach()
        self.inbound_unacked = 0
        self.aliases = _NO_ENTRIES
        self.outbox.detach()

    def expiry_on_disconnect(self, expiry: int, asked: int, cap: int) -> None:
        """Apply the Session Expiry Interval of a v5 DISCONNECT
        (§3.14.2.2.2): it replaces the session's, up to ``cap``, but may not
        turn a session that was to end with its connection into one that
        outlives it [MQTT-3.14.2-2].

        :param expiry: the DISCONNECT's Session Expiry Interval, seconds.
        :param asked: the one the CONNECT asked for (0 when absent), seconds.
        :param cap: the longest interval granted to this client, seconds.
        :raises ProtocolViolation: PROTOCOL_ERROR for a non-zero ``expiry``
            after a CONNECT that asked for 0.
        """
        if asked == 0 and expiry != 0:
            raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR,
                                    "session expiry interval changed from 0")
        self.expiry_interval = min(expiry, cap)

    def resume(self, stored: bool = True) -> None:
        """After CONNACK: resend in-flight deliveries and send the queue; a
        persistent APPLICATION session reads its own topic again, a
        persistent DEVICE session writes its attach marker.

        :param stored: False for a session the CONNECT made (CONNACK
            session present 0 [MQTT-3.2.2-2]): the device store holds
            nothing of it, so it is not read unless the session subscribed
            before its attach marker came back
            (:meth:`tbmq.broker.store_reads.StoreReader.start`)."""
        if not self.persistent:  # neither: the outbox alone
            self.outbox.resume(False)
            return
        marker = self._uses_device_store()
        self.outbox.resume(marker, stored)
        if self.reads_application_topics() and not self.app_consumers:
            self.ctx.applications.attach(self)
        elif marker:
            self._mark(True)
            self.outbox.reader.marker_sent()

    def _uses_device_store(self) -> bool:
        """True for a persistent DEVICE session: the consumer of
        ``tbmq.msg.persisted`` stores its messages."""
        return (self.persistent and self.client_type != ClientType.APPLICATION
                and self.ctx.mark is not None)

    def _mark(self, attached: bool) -> None:
        """Write this connection's :class:`~tbmq.cluster.records.SessionMarker`;
        a failure is logged (the session keeps what its first read found),
        except on a bus that stopped (the node is stopping)."""
        result = self.ctx.mark(self.client_id, self.session_id, attached)
        if result is None:
            return

        def failed(failure):
            if not failure.check(BusClosedError):
                self.log.warn("the {what} marker of {client_id} was not written: {error}",
                              what="attach" if attached else "detach",
                              client_id=self.client_id, error=failure.getErrorMessage())
            if attached:
                reader = self.outbox.reader
                if reader is not None:
                    reader.marker_failed()

        result.addErrback(failed)

    def reads_application_topics(self) -> bool:
        """True for a persistent APPLICATION session (TBMQ keeps its
        messages in its own bus topics)."""
        return (self.persistent and self.client_type == ClientType.APPLICATION
                and self.ctx.applications is not None)

    # -- what others call of the outbox ------------------------------------------------

    inflight = property(lambda self: self.outbox.inflight,
                        doc="packet id → delivery sent and not yet acknowledged")
    queue = property(lambda self: self.outbox.queue, doc="deliveries waiting for the window")
    # looked up at each call, not a bound method held per session (64 bytes):
    # the router's and the sinks' calls go to ``session.outbox.deliver``
    deliver = property(lambda self: self.outbox.deliver,
                       doc=":meth:`tbmq.broker.outbox.Outbox.deliver` of this session")
    dropped = property(lambda self: self.outbox.dropped,
                       doc="reason → messages not delivered to this session")

    def deliver_stored(self, delivery: StoredDelivery, cache: dict | None = None,
                       now: float | None = None, source=None) -> None:
        """See :meth:`tbmq.broker.outbox.Outbox.deliver_stored`."""
        self.outbox.deliver_stored(delivery, cache, now, source)

    def deliver_app(self, d, source) -> defer.Deferred | None:
        """See :meth:`tbmq.broker.outbox.Outbox.deliver_app`."""
        return self.outbox.deliver_app(d, source)

    def deliver_app_batch(self, deliveries, source):
        """See :meth:`tbmq.broker.outbox.Outbox.deliver_app_batch`."""
        return self.outbox.deliver_app_batch(deliveries, source)

    def on_attached(self, session_id: str) -> None:
        """See :meth:`tbmq.broker.store_reads.StoreReader.on_attached`."""
        self.outbox.store_reader().on_attached(session_id)

    def drop(self, reason: str, message: Message | None = None, count: int = 1) -> None:
        """See :meth:`tbmq.broker.outbox.Outbox.drop`."""
        self.outbox.drop(reason, message, count)

    def discard(self) -> None:
        """The session ends: forget everything it holds."""
        if self.app_consumers:
            self.ctx.applications.detach(self)
        self.outbox.discard()
        self.inbound_qos2 = _NO_IDS
