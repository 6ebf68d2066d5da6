"""CONNECT and AUTH: validation of the CONNECT packet, authentication
through the ``tbmq_authenticate`` hooks (MQTT 5 enhanced authentication and
re-authentication included, [MQTT-4.12]), the session binding and CONNACK
with the server's capabilities [MQTT-3.2.2.3].

:class:`ConnectHandler` is an object the connection
(:class:`tbmq.broker.protocol.MQTTProtocol`) holds while it needs one.
"""

from __future__ import annotations

import uuid

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from tbmq.auth import AuthRequest, AuthResult
from tbmq.listeners import peer_certificate_chain
from tbmq.log import debug_enabled
from tbmq.model import ClientType
from tbmq.mqtt import (
    MQTT_5, Auth, Connack, Connect, MalformedPacket, Property, ReasonCode, Will,
    connack_return_code,
)
from tbmq.mqtt.codec import encode
from tbmq.mqtt.topics import TopicError, validate_topic_name
from tbmq.broker.session_context import valid_utf8
from tbmq.broker.sessions import is_persistent
from tbmq.cluster.unauthorized import refusal_reason
from tbmq.errors import BackendError, BusError, ProtocolViolation  # noqa: F401  (ProtocolViolation: raised by handle_auth)

#: (protocol name, level) pairs this broker speaks [MQTT-3.1.2-1, -2]
SUPPORTED = {("MQIsdp", 3), ("MQTT", 4), ("MQTT", 5)}

#: CONNACK 0 Connection Accepted before MQTT 5, by its session present flag
#: [MQTT-3.2.2-2, MQTT-3.2.2-3]
_CONNACK_ACCEPTED = (encode(Connack(False, ReasonCode.SUCCESS), 4),
                     encode(Connack(True, ReasonCode.SUCCESS), 4))

#: keep alive (seconds) → the connection's timeout, 1.5 times it
#: [MQTT-3.1.2-24]: one float per keep alive value for the node, not per
#: connection (24 bytes each)
_TIMEOUTS: dict[int, float] = {}


def _timeout_of(keep_alive: int) -> float:
    """:returns: 1.5 × ``keep_alive`` seconds, the same float object for
    every connection with that keep alive (at most 65535 values)."""
    timeout = _TIMEOUTS.get(keep_alive)
    if timeout is None:
        timeout = _TIMEOUTS[keep_alive] = keep_alive * 1.5
    return timeout


def will_fault(will: Will, cfg) -> tuple[int, str] | None:
    """What is wrong with a CONNECT's will, if anything (MQTT 5.0 §3.1.2.5,
    §3.1.3.2, §3.1.3.3).

    :param will: the :class:`tbmq.mqtt.Will`.
    :param cfg: the :class:`tbmq.config.MqttConfig`.
    :returns: None for an acceptable will, else ``(v5 reason code,
        description)``: TOPIC_NAME_INVALID (0x90) for a topic that is empty,
        holds a wildcard or U+0000 [MQTT-3.1.3-11, MQTT-4.7.3-1] or has more
        than ``mqtt.max_topic_levels`` levels; QOS_NOT_SUPPORTED (0x9B)
        above ``mqtt.max_qos`` [MQTT-3.2.2-12]; RETAIN_NOT_SUPPORTED (0x9A)
        [MQTT-3.2.2-13]; PAYLOAD_FORMAT_INVALID (0x99) for a payload that is
        not UTF-8 with Payload Format Indicator 1 (§3.1.3.2.3);
        PROTOCOL_ERROR (0x82) for a Response Topic that is not a topic name
        (§3.1.3.2.5, as for a PUBLISH).
    """
    try:
        validate_topic_name(will.topic, cfg.max_topic_levels)
    except TopicError as e:
        return ReasonCode.TOPIC_NAME_INVALID, f"will topic {will.topic[:100]!r} invalid: {e}"
    if will.qos > cfg.max_qos:
        return (ReasonCode.QOS_NOT_SUPPORTED,
                f"will QoS {will.qos} not supported (maximum {cfg.max_qos})")
    if will.retain and not cfg.retain_available:
        return ReasonCode.RETAIN_NOT_SUPPORTED, "will retain not supported"
    props = will.properties
    if props.get(Property.PAYLOAD_FORMAT_INDICATOR) == 1 and not valid_utf8(will.payload):
        return (ReasonCode.PAYLOAD_FORMAT_INVALID,
                "will payload is not UTF-8 but its payload format indicator is 1")
    response_topic = props.get(Property.RESPONSE_TOPIC)
    if response_topic is not None:
        try:
            validate_topic_name(response_topic)
        except TopicError as e:
            return ReasonCode.PROTOCOL_ERROR, f"will response topic invalid: {e}"
    return None


def expiry_cap(config, result: AuthResult | None) -> int:
    """:param config: the node's :class:`tbmq.config.Config`.
    :param result: the :class:`~tbmq.auth.AuthResult` the client connected under.
    :returns: the longest session expiry interval granted to the client,
        seconds: ``mqtt.max_session_expiry_interval``, or
        ``auth.anonymous_max_session_expiry`` when lower for a client the
        ``anonymous`` provider accepted."""
    cap = config.mqtt.max_session_expiry_interval
    if result is not None and result.provider == "anonymous":
        cap = min(cap, config.auth.anonymous_max_session_expiry)
    return cap


class ConnectHandler:
    """The CONNECT / AUTH handling of one connection, held by its
    :class:`~tbmq.broker.protocol.MQTTProtocol` (``conn``) from the CONNECT
    to the CONNACK, and again for an AUTH after it (re-authentication).  It
    sets the connection's ``protocol_level``, ``auth``, ``auth_request``
    and ``session``, and keeps the client's ``send_quota``,
    ``max_packet_size`` and ``topic_alias_maximum`` for the session's
    :class:`~tbmq.broker.link.Link`; it uses the connection's ``send``,
    ``disconnect``, ``_close`` and ``_hold``/``_release`` (the gate of the
    packets read meanwhile).

    :param conn: the :class:`~tbmq.broker.protocol.MQTTProtocol`.
    """

    __slots__ = ("conn", "ctx", "exchange", "_attempt", "_assigned_id", "send_quota",
                 "max_packet_size", "topic_alias_maximum", "_accepted")

    def __init__(self, conn) -> None:
        self.conn = conn
        self.ctx = conn.ctx
        #: (AuthRequest, provider) while an AUTH exchange continues
        self.exchange = None
        #: the LoginGuard's Attempt while authenticating
        self._attempt = None
        #: the client identifier the broker assigned (an empty one in CONNECT)
        self._assigned_id: str | None = None
        #: the client's Receive Maximum (65535 before v5) [MQTT-3.3.4-7]
        self.send_quota = 65535
        #: the client's Maximum Packet Size, bytes, or None [MQTT-3.1.2-24]
        self.max_packet_size: int | None = None
        #: topic aliases the broker may give towards the client: the lower of
        #: its Topic Alias Maximum and ``mqtt.outbound_topic_aliases``, 0 for none
        self.topic_alias_maximum = 0
        #: (AuthResult, AuthRequest) of the authentication that let the
        #: client in, while its session is asked for (no partial per CONNECT)
        self._accepted: tuple | None = None

    def lost(self) -> None:
        """The connection is gone: a password check not started is skipped,
        and an exchange waiting for the client ends for the login guard."""
        attempt = self._attempt
        if attempt is not None:
            attempt.cancelled = True
            if self.exchange is not None:  # no answer pending: waiting for the client
                self._attempt = None
                self.ctx.guard.done(attempt, None)

    # -- CONNECT -------------------------------------------------------------------

    def _refuse(self, code: int, why: str) -> None:
        """Refuse a CONNECT: CONNACK with ``code`` (a v5 CONNACK reason
        code; a v3 client gets its :func:`~tbmq.mqtt.connack_return_code`),
        then the close [MQTT-3.2.2-5], with a log line saying why."""
        self.conn._before_connect_log(self.conn.log).info("CONNECT from {peer} refused: {why}",
                                                peer=self.conn._peer(), why=why)
        self._refuse_quietly(code)

    def _refuse_quietly(self, code: int) -> None:
        """Refuse a CONNECT without a line of its own (the
        :class:`~tbmq.auth.guard.LoginGuard` counts and summarises them)."""
        v5 = self.conn.protocol_level >= MQTT_5
        self.conn.send(Connack(False, code if v5 else connack_return_code(code)))
        self.conn._close()

    def _refuse_will(self, code: int, why: str) -> None:
        """A CONNECT whose will is not acceptable: v5 gets CONNACK with the
        reason code naming the defect; 3.1.1 and 3.1 have no return code
        for it, so the connection is closed without a CONNACK
        [MQTT-3.1.4-1, MQTT-3.2.2-6] (IDENTIFIER_REJECTED would name the
        wrong field).  The log line says what was wrong."""
        if self.conn.protocol_level >= MQTT_5:
            self._refuse(code, why)
            return
        self.conn._before_connect_log(self.conn.log).info(
            "CONNECT from {peer} refused, closed without CONNACK: {why}",
            peer=self.conn._peer(), why=why)
        self.conn._close()

    def refuse_malformed_connect(self, error: MalformedPacket) -> None:
        """A CONNECT the decoder refused after reading its protocol level
        (``error.connect_level``): MALFORMED_PACKET (0x81), or
        PROTOCOL_ERROR (0x82) for a fault such as a property given twice or
        a value it may not have (Receive Maximum or Maximum Packet Size 0,
        Request Problem Information 2...).  A v5 client gets CONNACK with the error's
        reason code and a Reason String saying what was wrong, then the
        close [MQTT-4.13.1-1, MQTT-3.2.2-6, MQTT-3.2.2-7]; 3.1.1 and 3.1
        have no return code for it, so the connection is closed without
        CONNACK [MQTT-3.1.4-1].

        :param error: the decoder's :class:`~tbmq.mqtt.MalformedPacket`.
        """
        self.conn.protocol_level = error.connect_level
        if error.connect_level >= MQTT_5:
            self.conn.send(Connack(False, error.reason_code, {Property.REASON_STRING: str(error)}))
        self.conn._close()

    def handle_connect(self, connect: Connect) -> None:
        """Validate CONNECT, refuse a blocked client (CONNACK BANNED, v3: 5
        Not authorized; :mod:`tbmq.cluster.blocked`), authenticate, bind the
        session, send CONNACK.  A refusal by authentication is recorded in
        the unauthorized-client log (:mod:`tbmq.cluster.unauthorized`)."""
        self.conn.connect_packet = connect
        if (connect.protocol_name, connect.protocol_level) not in SUPPORTED:
            if connect.protocol_name in ("MQTT", "MQIsdp"):
                self.conn.protocol_level = 5 if connect.protocol_level >= 5 else 4
                self._refuse(ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
                             f"protocol level {connect.protocol_level}")
            else:
                self.conn._before_connect_log(self.conn.log).info("unknown protocol name from {peer}",
                                                        peer=self.conn._peer())
                self.conn._close()
            return
        conn = self.conn
        conn.protocol_level = level = connect.protocol_level
        cfg = self.ctx.config.mqtt
        props = connect.properties
        v5 = level >= MQTT_5
        client_id = connect.client_id
        # (its length in UTF-8 bytes: an ASCII one's is its length, no copy made)
        if (len(client_id) if client_id.isascii() else len(client_id.encode("utf-8"))) \
                > cfg.max_client_id_length or (
                level == 3 and len(client_id) > 23 and cfg.max_client_id_length <= 23):
            return self._refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                                "client identifier too long")
        self._assigned_id = None
        if not connect.client_id:
            if level == 3 or (level == 4 and not connect.clean_start) or not cfg.allow_empty_client_id:
                # [MQTT-3.1.3-8]: empty id with a persistent session
                return self._refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                                    "empty client identifier")
            connect.client_id = self._assigned_id = "tbmq-" + uuid.uuid4().hex
        if v5:
            # (Receive Maximum and Maximum Packet Size 0 are refused with
            # the decoder's errors: refuse_malformed_connect)
            self.send_quota = props.get(Property.RECEIVE_MAXIMUM, 65535)
            self.max_packet_size = props.get(Property.MAXIMUM_PACKET_SIZE)
            # none unless the client accepts them [MQTT-3.1.2-27, MQTT-3.3.2-11]
            self.topic_alias_maximum = min(props.get(Property.TOPIC_ALIAS_MAXIMUM, 0),
                                           cfg.outbound_topic_aliases)
        if connect.will is not None:
            fault = will_fault(connect.will, cfg)
            if fault is not None:
                return self._refuse_will(*fault)
        blocked = self.ctx.blocked
        if blocked is not None and blocked.entries:
            entry = blocked.match(connect.client_id, connect.username, self.conn._peer())
            if entry is not None:  # TBMQ's blocked clients, before authentication
                blocked.refused += 1
                return self._refuse(ReasonCode.BANNED, f"blocked client ({entry.type} "
                                                       f"{entry.value!r}, entry {entry.id})")
        guard = self.ctx.guard
        if guard is not None:
            costly = connect.password is not None or (
                v5 and props.get(Property.AUTHENTICATION_METHOD) is not None)
            if not guard.admits_freely(costly):  # (else: a login that holds nothing)
                attempt = guard.admit(self.conn._peer(), connect.client_id, connect.username,
                                      costly)
                if attempt is not None:
                    if attempt.refusal is not None:
                        # banned: BANNED; too many checks in flight: SERVER_BUSY
                        return self._refuse_quietly(attempt.refusal)
                    self._attempt = attempt
        conn._hold()
        listener = conn.listener
        # (positional arguments: a class called with keywords costs a dict)
        conn.auth_request = request = AuthRequest(
            connect.client_id, connect.username, connect.password, level,
            conn._address(), listener,
            peer_certificate_chain(conn.transport)
            if getattr(listener, "tls_client_auth", "none") != "none" else None,
            props.get(Property.AUTHENTICATION_METHOD) if v5 else None,
            props.get(Property.AUTHENTICATION_DATA) if v5 else None)
        self._auth_step(request, None)

    # -- the connection's packets while something is decided ----------------------

    def _drop_held(self) -> None:
        """The connection is refused: what waits is never handled."""
        self.conn._gate = 0
        self.conn._waiting = ()

    def _gone(self) -> bool:
        return self.conn._closing or self.conn.transport is None or not self.conn.transport.connected

    def _internal_error(self, failure) -> None:
        """A step of the connection failed.  A backend that is out (the
        credential store, the bus: :class:`~tbmq.errors.BackendError`,
        :class:`~tbmq.errors.BusError`) is logged in one line and refused
        before CONNACK with SERVER_UNAVAILABLE (0x88; v3: 3 Server
        unavailable), so the client retries; anything else is a bug, logged
        with its traceback (UNSPECIFIED_ERROR, v3: 3); after CONNACK the
        connection ends with IMPLEMENTATION_SPECIFIC_ERROR (0x83)."""
        out = failure.check(BackendError, BusError)
        if out:
            self.conn.log.warn("{client_id}: a backend is unavailable: {error}",
                          client_id=self.conn._client_id(), error=failure.getErrorMessage())
        else:
            self.conn.log.failure("internal error on the connection of {client_id}", failure,
                             client_id=self.conn._client_id())
        self._drop_held()
        self._auth_done(None)
        if not self._gone():
            if self.conn._connacked:
                self.conn.disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
            elif out:
                self._refuse(ReasonCode.SERVER_UNAVAILABLE, "a backend is unavailable")
            else:
                self._refuse(ReasonCode.UNSPECIFIED_ERROR, "internal error")

    # -- authentication (CONNECT, enhanced authentication, re-authentication) ----------

    def _auth_step(self, request: AuthRequest, provider: str | None) -> None:
        request.credentials = self.ctx.credentials
        request.config = self.ctx.config
        if self._attempt is not None and not request.reauthenticate:
            request.checker = self._attempt.check_password
        d = self.ctx.hooks.authenticate(request, provider)
        # answered at once: a tuple (no isinstance: Deferred is an ABC's subclass)
        if type(d) is not tuple and isinstance(d, Deferred):
            d.addCallback(self._auth_answer, request)
            d.addErrback(self._internal_error)
            return
        try:  # answered at once
            self._auth_answer(d, request)
        except Exception:
            self._internal_error(Failure())

    def _auth_done(self, failed: bool | None, request: AuthRequest | None = None) -> None:
        """Tell the login guard how the CONNECT's authentication ended (see
        :meth:`tbmq.auth.guard.LoginGuard.done`); a refused login that held
        no :class:`~tbmq.auth.guard.Attempt` is counted from ``request``
        (:meth:`~tbmq.auth.guard.LoginGuard.failed`); a login accepted
        without one has nothing to tell."""
        attempt = self._attempt
        if attempt is not None:
            self._attempt = None
            self.ctx.guard.done(attempt, failed)
        elif failed and request is not None and self.ctx.guard is not None:
            address = request.address
            self.ctx.guard.failed(str(getattr(address, "host", address)), request.client_id,
                                  request.username)

    def _auth_answer(self, answer, request: AuthRequest) -> None:
        """Apply an authentication answer [MQTT-4.12]."""
        result, provider = answer
        v5 = self.conn.protocol_level >= MQTT_5
        continues = result is not None and result.continue_auth and v5 and request.auth_method
        if not continues and not request.reauthenticate:
            # a failure counts against the source even when the client left
            self._auth_done(result is None or not result.allowed, request)
        if self._gone():
            self._drop_held()
            return
        if continues:
            self.exchange = (request, provider)
            self.conn.send(Auth(ReasonCode.CONTINUE_AUTHENTICATION,
                            {Property.AUTHENTICATION_METHOD: request.auth_method,
                             Property.AUTHENTICATION_DATA: result.auth_data or b""}))
            self.conn._release()
            return
        if result is None or not result.allowed:
            if result is not None:
                code = result.reason_code
            else:
                code = (ReasonCode.BAD_AUTHENTICATION_METHOD if request.auth_method
                        else ReasonCode.NOT_AUTHORIZED)
            self._drop_held()
            log = self.conn.log if request.reauthenticate else self.conn._before_connect_log(self.conn.log)
            log.info("authentication of {client_id} refused (0x{code:02X})",
                     client_id=request.client_id, code=code)
            if request.reauthenticate:
                self.conn.disconnect(code)  # [MQTT-4.12.1-2]
                return
            self.ctx.hooks.authentication_failed(self.conn.connect_packet, request.address, code)
            if self.ctx.unauthorized is not None:
                self.ctx.unauthorized.refused(
                    request.client_id, self.conn._peer(), request.username,
                    refusal_reason(code, result.provider if result is not None else None),
                    request.password is not None, bool(request.certificate_chain))
            self._refuse(code, "not authorized")
            return
        if request.reauthenticate:
            self.conn.auth = result
            props = {Property.AUTHENTICATION_METHOD: request.auth_method}
            if result.auth_data is not None:
                props[Property.AUTHENTICATION_DATA] = result.auth_data
            self.conn.send(Auth(ReasonCode.SUCCESS, props))
            self.conn._release()
            return
        will = self.conn.connect_packet.will
        if will is not None:
            allowed = self.ctx.hooks.authorize("publish", None, result, will.topic)
            if not isinstance(allowed, bool):
                allowed.addCallback(self._will_decided, result, request)
                allowed.addErrback(self._internal_error)
                return
            if not allowed:
                self._drop_held()
                return self._refuse(ReasonCode.NOT_AUTHORIZED,
                                    "will topic not authorized")
        self._open_session(result, request)

    def _will_decided(self, allowed: bool, result, request) -> None:
        if self._gone():
            return
        if not allowed:
            self._drop_held()
            return self._refuse(ReasonCode.NOT_AUTHORIZED, "will topic not authorized")
        self._open_session(result, request)

    def handle_auth(self, packet: Auth) -> None:
        """An AUTH packet: the client's next step of an exchange
        (CONTINUE_AUTHENTICATION) or a re-authentication (RE_AUTHENTICATE)
        with the CONNECT's method [MQTT-4.12.1-1]."""
        method = packet.properties.get(Property.AUTHENTICATION_METHOD)
        if self.exchange is not None:
            request, provider = self.exchange
            if (packet.reason_code != ReasonCode.CONTINUE_AUTHENTICATION
                    or method != request.auth_method):
                raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR,
                                        "unexpected AUTH in an exchange")
            self.exchange = None
            request.auth_data = packet.properties.get(Property.AUTHENTICATION_DATA)
            self.conn._hold()
            self._auth_step(request, provider)
            return
        first = self.conn.auth_request
        if (packet.reason_code != ReasonCode.RE_AUTHENTICATE or self.conn.session is None
                or first is None or first.auth_method is None
                or method != first.auth_method):
            raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR,
                                    "AUTH without an authentication exchange")
        request = AuthRequest(
            first.client_id, first.username, first.password, self.conn.protocol_level,
            address=first.address, listener=self.conn.listener,
            certificate_chain=first.certificate_chain, auth_method=method,
            auth_data=packet.properties.get(Property.AUTHENTICATION_DATA), reauthenticate=True)
        self.conn._hold()
        self._auth_step(request, None)

    def _open_session(self, result: AuthResult, request: AuthRequest) -> None:
        """Authentication succeeded: ask the cluster for the session (a
        session event), then bind it, send CONNACK and resume.

        The session expiry granted is capped by
        ``mqtt.max_session_expiry_interval``, and for a client the
        ``anonymous`` provider accepted by ``auth.anonymous_max_session_expiry``
        when lower.  A CONNECT that would create one more persistent session
        than ``mqtt.max_persistent_sessions_per_address`` for its address
        gets CONNACK QUOTA_EXCEEDED (0x97; v3: 3 Server unavailable);
        resuming or replacing an existing session of its client id does not
        count."""
        self.conn.auth = result
        config = self.ctx.config
        connect = self.conn.connect_packet
        cap = expiry_cap(config, result)
        sessions = self.ctx.sessions
        limit = config.mqtt.max_persistent_sessions_per_address
        host = self.conn._peer() if limit else None
        if limit and is_persistent(connect) and not sessions.known(connect.client_id):
            held = sessions.persistent_from(host)
            if held >= limit:
                self._drop_held()
                return self._refuse(ReasonCode.QUOTA_EXCEEDED, f"{held} persistent sessions from "
                                    f"{host} already (mqtt.max_persistent_sessions_per_address)")
        limits = self.ctx.limits
        if limits is not None and self._over_session_limit(limits, connect, result):
            return
        # (persistent sessions counted by address only while the limit is on)
        self._accepted = (result, request)
        sessions.connect(self.conn, connect, result.client_type, expiry_cap=cap, address=host,
                         opened=self._session_opened, refused=self._session_refused,
                         failed=self._internal_error)

    def _over_session_limit(self, limits, connect, result: AuthResult) -> bool:
        """``mqtt.sessions_limit`` and ``mqtt.application_clients_limit``
        (TBMQ's): a CONNECT that would create a session past one of them
        gets CONNACK QUOTA_EXCEEDED (0x97; v3: 3 Server unavailable, the
        closest return code [MQTT-3.2.2.3]), counted and logged by
        :class:`~tbmq.broker.limits.NodeLimits`.

        :returns: True when refused."""
        sessions = self.ctx.sessions
        client_id = connect.client_id
        registry = sessions.registry
        refused = limits.admit_session(len(registry.sessions), is_persistent(connect),
                                       result.client_type, sessions.known(client_id),
                                       registry.get(client_id))
        if refused is None:
            return False
        limits.note(refused, "CONNECT of {client_id} from {peer} refused (0x97): over "
                    "mqtt.{limit} ({count})", client_id=client_id, peer=self.conn._peer(),
                    count=getattr(limits, refused))
        self._drop_held()
        self._refuse_quietly(ReasonCode.QUOTA_EXCEEDED)
        return True

    def _session_refused(self, failure) -> None:
        """No answer from the cluster: CONNACK SERVER_UNAVAILABLE (0x88; v3:
        3 Server unavailable) and the client retries."""
        if failure.check(BusError):
            self.conn.log.warn("no session for {client_id}: {error}", client_id=self.conn._client_id(),
                          error=failure.getErrorMessage())
        else:
            self.conn.log.failure("no session for {client_id}", failure, client_id=self.conn._client_id())
        if not self._gone():
            self._drop_held()
            self._refuse(ReasonCode.SERVER_UNAVAILABLE,
                         "the cluster did not answer the connect request")

    def _session_opened(self, opened) -> None:
        """The session is bound (``opened``: ``(session, session present)``),
        under the authentication :meth:`_open_session` kept: CONNACK, the
        keep alive's timeout, then the packets held meanwhile."""
        session, present = opened
        (result, request), self._accepted = self._accepted, None
        conn = self.conn
        connect = conn.connect_packet
        cfg = self.ctx.config.mqtt
        if self._gone():
            self.ctx.sessions.connection_lost(session, conn, publish_will=False)
            return
        if not session.persistent:
            session.client_type = ClientType.DEVICE  # TBMQ: non-persistent is a DEVICE
        conn.session = session
        keep_alive = connect.keep_alive
        if cfg.max_keep_alive and (keep_alive == 0 or keep_alive > cfg.max_keep_alive):
            keep_alive = cfg.max_keep_alive if conn.protocol_level >= MQTT_5 else keep_alive
        # the connect timeout becomes the keep alive's: a later deadline is
        # one attribute (the node's Deadlines move it when its bucket is due)
        conn.setTimeout(_timeout_of(keep_alive) if keep_alive else None)
        level = conn.protocol_level
        if level >= MQTT_5:
            props = self._connack_properties(connect, session, keep_alive)
            if request.auth_method:
                props[Property.AUTHENTICATION_METHOD] = request.auth_method
                if result.auth_data is not None:
                    props[Property.AUTHENTICATION_DATA] = result.auth_data
            conn.send(Connack(present, ReasonCode.SUCCESS, props))
        else:  # the same four bytes for every client (3.1: no session present flag)
            conn.write(_CONNACK_ACCEPTED[present and level > 3])
        conn._connacked = True
        conn.handshake = None  # made again for an AUTH (re-authentication)
        # nothing reads the CONNECT after its CONNACK but its session expiry
        # (a DISCONNECT's [MQTT-3.14.2-2]) and the hooks, given it below
        conn.connect_packet = None
        if level >= MQTT_5:
            conn.expiry_asked = connect.properties.get(Property.SESSION_EXPIRY_INTERVAL, 0)
        if result.credentials is None and request.auth_method is None:
            # kept only for what reads it later: a re-authentication (AUTH
            # 0x19 of the same method) and the rules of credentials records
            # bound again when they change (tbmq.auth.watch)
            conn.auth_request = None
        if debug_enabled():
            conn.log.debug("client {client_id} connected from {peer} (MQTT level {mqtt_level}, "
                       "persistent={persistent}, session present={present}, "
                       "authenticated by {provider})",
                       client_id=connect.client_id, peer=conn._peer(),
                       mqtt_level=level, persistent=session.persistent,
                       present=present, provider=result.provider)
        hooks = self.ctx.hooks
        if hooks.wants_connected:  # (no call when no plugin listens)
            hooks.client_connected(session, connect, request.address)
        conn._peer_address = None  # asked of the transport again when needed
        session.resume(present)
        conn._release()

    def _connack_properties(self, connect: Connect, session, keep_alive: int) -> dict:
        """The server's capabilities [MQTT-3.2.2.3]."""
        cfg = self.ctx.config.mqtt
        props = {
            Property.RECEIVE_MAXIMUM: cfg.receive_maximum,
            Property.RETAIN_AVAILABLE: int(cfg.retain_available),
            Property.MAXIMUM_PACKET_SIZE: self.conn.decoder.max_packet_size,
            Property.TOPIC_ALIAS_MAXIMUM: cfg.topic_alias_maximum,
            Property.WILDCARD_SUBSCRIPTION_AVAILABLE: int(cfg.wildcard_subscription_available),
            Property.SUBSCRIPTION_IDENTIFIER_AVAILABLE: int(cfg.subscription_identifier_available),
            Property.SHARED_SUBSCRIPTION_AVAILABLE: int(cfg.shared_subscription_available),
        }
        if cfg.max_qos < 2:
            props[Property.MAXIMUM_QOS] = cfg.max_qos
        if keep_alive != connect.keep_alive:
            props[Property.SERVER_KEEP_ALIVE] = keep_alive
        if self._assigned_id is not None:
            props[Property.ASSIGNED_CLIENT_IDENTIFIER] = self._assigned_id
        asked = connect.properties.get(Property.SESSION_EXPIRY_INTERVAL, 0)
        if session.expiry_interval != asked:
            props[Property.SESSION_EXPIRY_INTERVAL] = session.expiry_interval
        if connect.properties.get(Property.REQUEST_RESPONSE_INFORMATION) and cfg.response_information:
            props[Property.RESPONSE_INFORMATION] = cfg.response_information
        return props
