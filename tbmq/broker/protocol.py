"""The Twisted protocol of one MQTT connection: bytes → packets → calls on the
session, and packets → bytes.

It owns the connect timeout and the keepalive (1.5 × the keep alive,
[MQTT-3.1.2-24]) as a deadline in the node's
:class:`~tbmq.broker.deadlines.Deadlines` (one timer for all connections,
on the broker's clock), validates packets against the negotiated
capabilities and answers bad input with the MQTT reason code; it never routes.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer, interfaces, protocol
from twisted.logger import Logger
from zope.interface import implementer

from tbmq.auth import AuthRequest, AuthResult
from tbmq.auth.guard import LoginGuard, PasswordChecks
from tbmq.broker import acknowledgements
from tbmq.broker.connect import ConnectHandler, expiry_cap
from tbmq.broker.link import Link
from tbmq.broker.deadlines import deadlines_for
from tbmq.broker.incomplete_packet import IncompletePacket
from tbmq.broker.session import Session
from tbmq.errors import ProtocolViolation
from tbmq.log import OBSERVER as LOG_OBSERVER, LogThrottle
from tbmq.mqtt import (
    MQTT_5, Auth, Connect, Disconnect, MalformedPacket, Pingreq, Pingresp,
    Property, Puback, Pubcomp, Publish, Pubrec, Pubrel, ReasonCode, Subscribe,
    Unsubscribe,
)
from tbmq.mqtt.codec import Decoder, encode

__all__ = ["MQTTProtocol", "MQTTFactory", "ProtocolViolation"]


@dataclass(frozen=True, slots=True)
class ConnectionContext:
    """What a connection uses of its node.

    :ivar clock: ``IReactorTime``.
    :ivar config: the :class:`tbmq.config.Config` (``mqtt`` and ``auth``).
    :ivar hooks: the :class:`tbmq.broker.hooks.Hooks`.
    :ivar sessions: the :class:`tbmq.broker.sessions.SessionManager`.
    :ivar connections: the node's set of live connections.
    :ivar flusher: the :class:`tbmq.broker.outbound.TurnFlusher`.
    :ivar credentials: the :class:`tbmq.interfaces.ICredentialStore`.
    :ivar guard: the node's :class:`tbmq.auth.guard.LoginGuard`, or None
        (no login limits).
    :ivar before_connect_log: the node's :class:`tbmq.log.LogThrottle` of
        the lines about connections closed before a CONNECT was accepted,
        or None (every line written).
    :ivar traffic: the node's :class:`tbmq.broker.traffic.Traffic`, where
        connections count the bytes they read and write.
    :ivar limits: the node's :class:`tbmq.broker.limits.NodeLimits` when
        ``mqtt.sessions_limit`` or ``mqtt.application_clients_limit`` is
        set, else None.
    :ivar blocked: the :class:`tbmq.cluster.blocked.BlockedClients`, or None.
    :ivar unauthorized: the :class:`tbmq.cluster.unauthorized.UnauthorizedLog`,
        or None.
    :ivar deadlines: the :class:`~tbmq.broker.deadlines.Deadlines` of
        ``clock`` (:func:`~tbmq.broker.deadlines.deadlines_for`), asked once
        for the node's connections; None: each connection asks for it.
    """

    clock: Any
    config: Any
    hooks: Any
    sessions: Any
    connections: set
    flusher: Any
    credentials: Any
    guard: Any = None
    before_connect_log: Any = None
    traffic: Any = None
    limits: Any = None
    blocked: Any = None
    unauthorized: Any = None
    deadlines: Any = None


#: broker → (its LoginGuard, its LogThrottle of lines before CONNECT): one
#: of each per node, shared by its listeners
_NODE_GUARDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def guarded_context(broker) -> ConnectionContext:
    """:returns: ``broker.connection_context()`` with the node's
    :class:`~tbmq.auth.guard.LoginGuard` (``auth.login_limits``) and its
    throttle of lines logged before CONNECT, made at the first call."""
    ctx = broker.connection_context()
    node = _NODE_GUARDS.get(broker)
    if node is None:
        clock = ctx.clock
        reactor = clock if hasattr(clock, "callFromThread") else None
        limits = ctx.config.auth.login_limits
        node = _NODE_GUARDS[broker] = (
            LoginGuard(limits, clock, PasswordChecks(limits.check_threads, reactor)),
            LogThrottle(clock, MQTTProtocol.log, "connections closed before CONNECT"))
    return dataclasses.replace(ctx, guard=node[0], before_connect_log=node[1],
                               deadlines=deadlines_for(ctx.clock))


@implementer(interfaces.IPushProducer)
class MQTTProtocol(protocol.Protocol):
    """One client connection: bytes in, packets to the session; bytes out
    through its own outbound queue, written once per reactor turn.

    :ivar session: the :class:`tbmq.broker.session.Session` once CONNECT is
        accepted, else None.
    :ivar protocol_level: 3, 4 or 5 once CONNECT arrived.
    :ivar paused: True while the transport's write buffer is full.
    :ivar paused_bytes: bytes written since the transport became full.
    """

    log = Logger(observer=LOG_OBSERVER)

    # one per connection: its attributes in slots, not in a dict of its own
    # (CPython shares the keys of instance dicts only up to 30 attributes:
    # past that each connection had a 1.6 KB dict); an attribute not named
    # here still works (Protocol gives instances a __dict__)
    __slots__ = (
        "transport", "connected", "factory",  # Twisted's (class defaults in Protocol)
        "ctx", "_deadlines", "deadline", "deadline_slot", "timeOut", "_traffic", "listener",
        "decoder", "session", "connect_packet", "expiry_asked",
        "protocol_level", "paused",
        "paused_bytes", "_out", "_closing", "_connacked", "_normal_disconnect",
        "_disconnect_reason", "_gate", "_waiting", "_abort_call", "handshake", "_auth", "link",
        "auth_request", "_closed_waiters", "_incomplete",
        "_read_pauses", "_peer_address",
    )

    def __init__(self, ctx: ConnectionContext, listener, max_packet_size: int,
                 peer_address=None) -> None:
        self.transport = None
        self.connected = 0
        self.factory = None
        self.ctx = ctx
        deadlines = ctx.deadlines
        self._deadlines = deadlines if deadlines is not None else deadlines_for(ctx.clock)
        #: the connect timeout or the keep alive's end, seconds of the clock,
        #: or None; kept with :meth:`setTimeout` (see :class:`~tbmq.broker.deadlines.Deadlines`)
        self.deadline: float | None = None
        #: the bucket of the node's :class:`~tbmq.broker.deadlines.Deadlines` this connection is in
        self.deadline_slot: int | None = None
        #: seconds :meth:`resetTimeout` moves the deadline to, or None
        self.timeOut: float | None = None
        self._traffic = ctx.traffic
        self.listener = listener
        # max_packet_size, protocol_level, server_side, max_connect_size:
        # positional, as a class called with keywords builds a dict
        self.decoder = Decoder(max_packet_size, None, True,
                               ctx.config.mqtt.max_connect_packet_size)
        self.session = None
        #: the CONNECT from its arrival to the CONNACK, else None (a
        #: connected client keeps what it needs of it: :attr:`expiry_asked`)
        self.connect_packet: Connect | None = None
        #: the Session Expiry Interval the CONNECT asked for (0 when
        #: absent), seconds: a DISCONNECT may not raise it from 0 [MQTT-3.14.2-2]
        self.expiry_asked = 0
        self.protocol_level = 4
        self.paused = False
        self.paused_bytes = 0
        # the outbound queue: a list from the first write of a turn
        self._out: list[bytes] | tuple = ()
        self._closing = False
        self._connacked = False
        self._normal_disconnect = False
        self._disconnect_reason: int | None = None
        self._gate = 0  # reasons packets wait: a decision being made, a backlog
        self._waiting: list | tuple = ()  # packets read while the gate was closed
        self._abort_call = None
        #: the :class:`~tbmq.broker.connect.ConnectHandler` from the CONNECT
        #: to the CONNACK (and during a re-authentication), else None
        self.handshake: ConnectHandler | None = None
        #: what the session sees of this connection, once it attached: a
        #: :class:`~tbmq.broker.link.Link` (its ``paused`` kept with this one's)
        self.link: Link | None = None
        self._auth: AuthResult | None = None
        #: the CONNECT's :class:`~tbmq.auth.AuthRequest`, kept after CONNACK only for a
        #: re-authentication or a client of a credentials record (its rules bound again)
        self.auth_request: AuthRequest | None = None
        self._closed_waiters: list | None = None
        #: the :class:`~tbmq.broker.incomplete_packet.IncompletePacket`, made
        #: when a read first ends inside a packet
        self._incomplete: IncompletePacket | None = None
        self._read_pauses = 0
        # the client's address, from the first ask to the CONNACK: the
        # listening port's (``peer_address``, what the transport's getPeer()
        # would make again), forgotten in connectionMade when a layer stands
        # between; else the transport's getPeer()
        self._peer_address = peer_address

    # -- the connect timeout and the keep alive ------------------------------------------

    def setTimeout(self, period: float | None) -> None:
        """Close the connection (:meth:`timeoutConnection`) ``period``
        seconds from now unless :meth:`resetTimeout` moves it; None for no
        timeout."""
        self.timeOut = period
        self._deadlines.set(self, None if period is None else self.ctx.clock.seconds() + period)

    def resetTimeout(self) -> None:
        """The client sent a packet: the timeout restarts [MQTT-3.1.2-24]."""
        if self.timeOut is not None:
            self._deadlines.touch(self, self.ctx.clock.seconds() + self.timeOut)

    def deadline_passed(self) -> None:
        """Called by the node's :class:`~tbmq.broker.deadlines.Deadlines`."""
        self.timeOut = None
        self.timeoutConnection()

    # -- Twisted --------------------------------------------------------------

    def connectionMade(self) -> None:
        self.ctx.connections.add(self)
        transport = self.transport
        transport.registerProducer(self, True)
        # the CONNECT a client sent before it was accepted is handled now,
        # not a turn of the reactor later (tbmq.broker.tcp_server.Server);
        # looked up on the class: a layer between (TLS, PROXY protocol: a
        # Twisted ProtocolWrapper) would hand the TCP transport's own, which
        # reads for that layer while it is being connected
        read_waiting = getattr(type(transport), "read_waiting", None)
        if read_waiting is None:
            # a layer between: the address buildProtocol got is the layer's
            # peer, maybe not the client's (a PROXY protocol's sender)
            self._peer_address = None
        else:
            read_waiting(transport)
        # the connect timeout, unless the CONNECT read now was answered (its
        # CONNACK set the keep alive's) or refused: a connection answered as
        # it was accepted gets one deadline, not two
        if not (self._connacked or self._closing):
            self.setTimeout(self.ctx.config.mqtt.connect_timeout)

    def dataReceived(self, data: bytes) -> None:
        """Decode a read and hand its packets on."""
        self._traffic.bytes_read += len(data)  # the node's counters
        if self._closing:
            return
        decoder = self.decoder
        try:
            packets = decoder.feed(data)
        except MalformedPacket as e:
            self._before_connect_log(self.log).info(
                "malformed packet from {peer}: {error} (0x{code:02X})",
                peer=self._peer(), error=str(e), code=e.reason_code)
            if e.connect_level is not None:
                self._handshake().refuse_malformed_connect(e)
            else:
                self.disconnect(e.reason_code)
            return
        if self._connacked:
            incomplete = self._incomplete
            if not decoder.partial:
                if incomplete is not None:
                    incomplete.since = None
            elif incomplete is None:
                incomplete = self._incomplete = IncompletePacket(self)
                incomplete.started()
            elif packets or incomplete.since is None:
                incomplete.started()
        if self._gate:  # kept for _release (a list from the first, then extended)
            if self._waiting:
                self._waiting.extend(packets)
            else:
                self._waiting = list(packets)
            return
        if packets and self.session is not None:
            self.resetTimeout()
        self.handle_packets(packets)

    def handle_packets(self, packets) -> None:
        """Handle ``packets`` in order; a rule broken ends the connection with
        its reason code; while the gate is closed (a decision being made, a
        backlog) the rest waits.  The PUBLISHes of several packets go to the
        pipeline together (:meth:`Session.gather_publishes
        <tbmq.broker.session.Session.gather_publishes>`): a run of them is
        handed on before the next packet that is not a PUBLISH, and at the
        end; a run of PUBACKs is handled in one call
        (:func:`~tbmq.broker.acknowledgements.on_pubacks`)."""
        decided = self._session_handlers
        runs = self._session_runs
        n = len(packets)
        gatherer = self.session if n > 1 else None
        gathering = False  # a run of PUBLISHes being gathered
        index = -1
        try:
            while index + 1 < n:
                index += 1
                packet = packets[index]
                if self._closing:
                    return
                try:
                    # a connected client's packets go straight to the session
                    session = self.session
                    kind = type(packet)
                    handler = decided.get(kind) if session is not None else None
                    if gatherer is not None:
                        if kind is not Publish:
                            if gathering:  # what came before it goes first
                                gathering = False
                                gatherer.publish_gathered()
                        elif not gathering and index + 1 < n and type(packets[index + 1]) is Publish:
                            gathering = True
                            gatherer.gather_publishes(gatherer.link)
                        if handler is not None and (gathering or kind is not Publish) \
                                and kind in runs:
                            # the run's packets on the plain path, together
                            # (Session.on_publishes, on_pubacks); the first
                            # it leaves goes the whole way below
                            taken = runs[kind](session, packets, index)
                            if taken > index:
                                index = taken - 1
                                continue
                    if handler is not None:
                        waits = handler(session, packet)
                        if waits is not None:
                            self._wait_for(waits)
                    else:
                        self.packet_received(packet)
                except ProtocolViolation as e:
                    self.log.info("protocol violation by {client_id}: {error} (0x{code:02X})",
                                  client_id=self._client_id(), error=str(e), code=e.reason_code)
                    if gathering:
                        gathering = False
                        gatherer.publish_gathered()
                    self.disconnect(e.reason_code)
                    return
                if self._gate:  # something is being decided: hold the rest
                    if self._waiting:
                        self._waiting.extend(packets[index + 1:])
                    else:
                        self._waiting = packets[index + 1:]
                    return
        finally:
            if gathering:
                gatherer.publish_gathered()

    def _wait_for(self, d: defer.Deferred) -> None:
        """Hold the packets after this one until ``d`` (a decision) fires."""
        self._hold()

        def done(_):
            if not self._closing:
                self._release()

        d.addCallbacks(done, self._internal_error)

    def _before_connect_log(self, log):
        """The logger of a line an unauthenticated peer causes: the node's
        throttle until a CONNECT is accepted, ``log`` after."""
        throttle = self.ctx.before_connect_log
        return log if self._connacked or throttle is None else throttle

    def connectionLost(self, reason=protocol.connectionDone) -> None:
        self._closing = True
        self.setTimeout(None)
        if self._incomplete is not None:
            self._incomplete.cancel()
        if self.handshake is not None:
            self.handshake.lost()
        self._out = ()
        self._set_paused(True)
        if self._abort_call is not None and self._abort_call.active():
            self._abort_call.cancel()
        self.ctx.connections.discard(self)
        waiters, self._closed_waiters = self._closed_waiters, None
        factory = getattr(self, "factory", None)
        if factory is not None:
            factory.active -= 1
        session = self.session
        if session is not None:
            self.session = None
            will = not self._normal_disconnect
            self.ctx.hooks.client_disconnected(session, self._disconnect_reason, will)
            self.ctx.sessions.connection_lost(session, self, publish_will=will)
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
            timeout = self.ctx.config.mqtt.connect_timeout
            if self.connect_packet is None:
                self._before_connect_log(self.log).info(
                    "no CONNECT from {peer} in {timeout:g} s; closing", peer=self._peer(),
                    timeout=timeout)
            else:
                self._before_connect_log(self.log).info(
                    "CONNECT of {client_id} from {peer} not accepted {timeout:g} s after "
                    "the connection opened (authentication or the session still pending); "
                    "closing", client_id=self._client_id(), peer=self._peer(),
                    timeout=timeout)
            self._close()
        else:
            self.log.info("keep alive of {client_id} expired", client_id=self._client_id())
            self.disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT)

    # -- output: the outbound queue ------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue encoded bytes; they leave with the rest of this turn's."""
        if self._closing and self.transport is None:
            return
        if self.paused:
            self.paused_bytes += len(data)
        out = self._out
        if not out:
            self.ctx.flusher.mark(self)
            out = self._out = []
        out.append(data)

    def flush(self) -> None:
        """Write the outbound queue to the transport."""
        out = self._out
        if not out:
            return
        self._out = ()
        transport = self.transport
        if transport is not None and transport.connected:
            data = out[0] if len(out) == 1 else b"".join(out)
            self._traffic.bytes_written += len(data)
            transport.write(data)

    def send(self, packet) -> None:
        """Encode ``packet`` for this connection's protocol level and write it."""
        self.write(encode(packet, self.protocol_level))

    # IPushProducer: the transport says when its write buffer is full

    def pauseProducing(self) -> None:
        if not self.paused:
            self._set_paused(True)
            self.paused_bytes = 0

    def resumeProducing(self) -> None:
        if not self.paused or self._closing:
            return
        self._set_paused(False)
        if self.session is not None:
            self.session.outbox.on_writable()

    def stopProducing(self) -> None:
        self._set_paused(True)

    def _set_paused(self, paused: bool) -> None:
        """The socket is full (True) or writable: here and in the link."""
        self.paused = paused
        link = self.link
        if link is not None:
            link.paused = paused

    def make_link(self) -> Link:
        """:returns: a new :class:`~tbmq.broker.link.Link` of this connection
        for the session that attaches to it (kept up to date by this one),
        with the client's capabilities its CONNECT's handler read."""
        handshake = self.handshake
        link = self.link = Link(self, auth=self._auth) if handshake is None else Link(
            self, handshake.send_quota, handshake.max_packet_size, handshake.topic_alias_maximum,
            self._auth)
        return link

    # -- input: back-pressure on a publisher ------------------------------------------

    def pause_reading(self) -> None:
        """Stop reading this connection (its publishes wait for the bus)."""
        self._gate += 1
        self._read_pauses += 1
        if self.transport is not None:
            self.transport.pauseProducing()

    def resume_reading(self) -> None:
        """Read again (see :meth:`pause_reading`)."""
        if self._closing:
            return
        if self._read_pauses:
            self._read_pauses -= 1
        incomplete = self._incomplete
        if incomplete is not None and incomplete.since is not None:
            incomplete.since = self.ctx.clock.seconds()  # the rest could not arrive meanwhile
        if self.transport is not None:
            self.transport.resumeProducing()
        self._release()

    # -- closing -----------------------------------------------------------------------

    def disconnect(self, reason_code: int = ReasonCode.NORMAL_DISCONNECTION,
                   reason: str | None = None) -> None:
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
        self._abort_call = self.ctx.clock.callLater(5, self.transport.abortConnection)

    def _address(self):
        """:returns: the client's ``IAddress`` (behind the PROXY protocol,
        the proxied one): the one the listening port gave
        :meth:`MQTTFactory.buildProtocol` when no layer stands between, else
        asked of the transport; kept until the CONNACK (then asked at each
        call: a connected client keeps no address object); None without a
        transport."""
        address = self._peer_address
        if address is None and self.transport is not None:
            address = self._peer_address = self.transport.getPeer()
        return address

    def _peer(self) -> str:
        peer = self._address()
        return str(getattr(peer, "host", peer))

    def _client_id(self) -> str:
        connect, session = self.connect_packet, self.session
        return connect.client_id if connect else session.client_id if session else "?"

    # -- dispatch ------------------------------------------------------------------

    def packet_received(self, packet) -> None:
        if self.session is None:
            if self.connect_packet is not None or self._connacked:
                handshake = self.handshake
                if type(packet) is Auth and handshake is not None \
                        and handshake.exchange is not None:
                    handshake.handle_auth(packet)
                    return
                raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR, "packet before CONNACK")
            if type(packet) is not Connect:
                # the first packet must be CONNECT [MQTT-3.1.0-1]
                self._before_connect_log(self.log).info(
                    "{type} before CONNECT from {peer}; closing",
                    type=type(packet).__name__, peer=self._peer())
                self._close()
                return
            self._handshake().handle_connect(packet)
            return
        handler = self._handlers.get(type(packet))
        if handler is None:
            raise ProtocolViolation(ReasonCode.PROTOCOL_ERROR,
                                    f"unexpected {type(packet).__name__}")
        handler(self, packet)

    def recheck_subscriptions(self) -> None:
        """After the client's authorization rules changed: drop the
        subscriptions they no longer allow (logged)."""
        session, auth = self.session, self.auth
        if session is None or auth is None or auth.rules is None:
            return
        dropped = session.recheck_subscriptions(auth.rules)
        if dropped:
            self.log.info("subscriptions of {client_id} no longer authorized, removed: {filters}",
                          client_id=session.client_id, filters=dropped)

    def _handshake(self) -> ConnectHandler:
        """:returns: the connection's :class:`~tbmq.broker.connect.ConnectHandler`,
        made at first use (a connected client holds none)."""
        handshake = self.handshake
        if handshake is None:
            handshake = self.handshake = ConnectHandler(self)
        return handshake

    @property
    def auth(self) -> AuthResult | None:
        """The :class:`~tbmq.auth.AuthResult` the client is connected under,
        None before; set again by a re-authentication or a change of its
        credentials, here and in the session's :class:`~tbmq.broker.link.Link`."""
        return self._auth

    @auth.setter
    def auth(self, result: AuthResult | None) -> None:
        self._auth = result
        link = self.link
        if link is not None:
            link.auth = result

    def _internal_error(self, failure) -> None:
        """A step of the connection failed: see
        :meth:`tbmq.broker.connect.ConnectHandler._internal_error`."""
        self._handshake()._internal_error(failure)

    def _hold(self) -> None:
        """Keep incoming packets aside until :meth:`_release` (CONNECT being
        authenticated, a PUBLISH or SUBSCRIBE being authorized, a backlog), so
        packets are handled in order."""
        self._gate += 1

    def _release(self) -> None:
        if self._gate:
            self._gate -= 1
        if not self._gate and self._waiting:
            waiting, self._waiting = self._waiting, ()
            self.handle_packets(waiting)

    def handle_disconnect(self, packet: Disconnect) -> None:
        """DISCONNECT NORMAL_DISCONNECTION discards the will [MQTT-3.14.4-3];
        DISCONNECT_WITH_WILL_MESSAGE keeps it.
        A v5 client may change the session expiry interval, but not from 0
        [MQTT-3.14.2-2]."""
        session = self.session
        if self.protocol_level >= MQTT_5:
            expiry = packet.properties.get(Property.SESSION_EXPIRY_INTERVAL)
            if expiry is not None:
                session.expiry_on_disconnect(expiry, self.expiry_asked,
                                             expiry_cap(self.ctx.config, self._auth))
        self._normal_disconnect = packet.reason_code != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE
        self._disconnect_reason = packet.reason_code
        self._closing = True
        self.setTimeout(None)
        self.flush()
        self.transport.loseConnection()

    #: packets of a connected client the session decides:
    #: ``handler(session, packet) -> None | Deferred`` (a Deferred holds the
    #: packets after this one until it fires)
    #: a run of gathered packets of one kind handled together:
    #: ``handler(session, packets, index) -> index of the first left``
    _session_runs = {Publish: Session.on_publishes, Puback: acknowledgements.on_pubacks}
    _session_handlers = {
        Publish: Session.on_publish,
        Puback: acknowledgements.on_puback,
        Pubrec: acknowledgements.on_pubrec,
        Pubrel: Session.on_pubrel,
        Pubcomp: acknowledgements.on_pubcomp,
        Subscribe: Session.on_subscribe,
        Unsubscribe: Session.on_unsubscribe,
    }
    #: packets the connection itself handles: ``handler(self, packet)``
    _handlers = {
        Pingreq: lambda self, packet: self.send(Pingresp()),  # [MQTT-3.12.4-1]
        Disconnect: handle_disconnect,
        # AUTH (an exchange or a re-authentication): the ConnectHandler's
        Auth: lambda self, packet: self._handshake().handle_auth(packet),
    }


class MQTTFactory(protocol.Factory):
    """Builds :class:`MQTTProtocol` for one listener and enforces its
    connection limit.

    :param broker: the :class:`tbmq.broker.broker.Broker` (its
        :meth:`~tbmq.broker.broker.Broker.connection_context`).
    :param listener: the :class:`tbmq.config.ListenerConfig`.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, broker, listener) -> None:
        self.ctx = guarded_context(broker)
        self.listener = listener
        self.max_packet_size = listener.max_packet_size or self.ctx.config.mqtt.max_packet_size
        self.active = 0

    def buildProtocol(self, addr):
        limit = self.listener.max_connections
        if limit and self.active >= limit:
            self.log.warn("listener {name}: connection limit {limit} reached; refusing {addr}",
                          name=self.listener.name, limit=limit, addr=addr)
            return None
        self.active += 1
        # the peer's address as the port made it: one IPv4Address less per
        # connection than the transport's getPeer()
        proto = MQTTProtocol(self.ctx, self.listener, self.max_packet_size, addr)
        proto.factory = self
        return proto
