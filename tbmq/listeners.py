"""The listeners of a node: one listening port per ``listeners:`` entry, with
the transport layers its config asks for, from the wire up::

    TCP (listener.endpoint, any Twisted server endpoint string)
     └ PROXY protocol v1/v2 header      proxy_protocol: true
        └ TLS ≥ 1.2 from PEM files       type tls | wss
           └ WebSocket (RFC 6455)        type ws | wss: path ws_path, subprotocol
              │                          mqtt or mqttv3.1, binary frames
              └ MQTTProtocol             tbmq.broker.protocol.MQTTFactory

Each layer is a Twisted factory wrapping the next: Twisted's
:class:`~twisted.protocols.haproxy` wrapper, its
:class:`~twisted.protocols.tls.TLSMemoryBIOFactory`, and autobahn's
:class:`~autobahn.twisted.websocket.WrappingWebSocketServerFactory`, each
subclassed here for what MQTT needs:

* the connection limit of :class:`~tbmq.broker.protocol.MQTTFactory` (its
  ``buildProtocol`` returns None when the listener is full) closes the new
  socket on every layer instead of failing inside the wrapper;
* on ``ws``/``wss`` the MQTT protocol is made when the WebSocket upgrade is
  accepted, so ``max_connections`` counts MQTT connections and a full
  listener answers the upgrade with HTTP 503;
* the MQTT connect timeout (``mqtt.connect_timeout``) starts when the TCP
  connection is accepted on ``tcp``/``tls``, so it covers a PROXY header and
  a TLS handshake that never come; on ``ws``/``wss`` the WebSocket opening
  handshake timeout (the same number of seconds) covers the TLS handshake and
  the HTTP upgrade, then the MQTT connect timeout starts;
* WebSocket payload is handed to MQTT frame by frame as it arrives (no
  buffering of whole WebSocket messages), so one MQTT packet may span any
  number of frames and one frame may hold several packets; the MQTT decoder's
  ``max_packet_size`` is the only size limit.

:func:`peer_certificate_chain` and :func:`peer_address` give the X.509 chain
and the client's address of a connection through all these layers.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from autobahn.twisted.websocket import (
    WrappingWebSocketServerFactory,
    WrappingWebSocketServerProtocol,
)
from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.types import ConnectionDeny
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL, crypto
from twisted.internet import address, defer, endpoints, error, interfaces, ssl
from twisted.logger import Logger
from twisted.protocols.haproxy._wrapper import HAProxyProtocolWrapper, HAProxyWrappingFactory
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from twisted.python.failure import Failure

from tbmq.broker.tcp_server import lighten
from tbmq.config import TLS_LISTENER_TYPES
from tbmq.errors import ConfigError, StartupError
from tbmq.log import LogThrottle, OBSERVER as LOG_OBSERVER

log = Logger(observer=LOG_OBSERVER)

__all__ = [
    "WS_SUBPROTOCOLS",
    "build_factory",
    "cannot_listen",
    "check",
    "listen",
    "listen_on",
    "parse_endpoint",
    "server_endpoint",
    "tls_options",
    "peer_certificate_chain",
    "peer_address",
    "forwarded_address",
    "ProxyProtocolFactory",
    "TLSFactory",
    "MQTTWebSocketFactory",
    "MQTTWebSocketProtocol",
]

#: WebSocket subprotocols accepted, in the server's order of preference:
#: ``mqtt`` (MQTT 3.1.1 and 5.0 [MQTT-6.0.0-3]) and ``mqttv3.1`` (MQTT 3.1).
WS_SUBPROTOCOLS = ("mqtt", "mqttv3.1")

#: The ``Server`` header of the WebSocket upgrade response.
WS_SERVER_HEADER = "tbmq"


# -- plumbing shared by the wrappers -----------------------------------------


class _RefusableWrapping:
    """Mixin for a :class:`~twisted.protocols.policies.WrappingFactory`:
    when the wrapped factory refuses a connection (``buildProtocol`` returns
    None: the listener's connection limit), refuse it too, so the port
    closes the socket.  Twisted's wrappers would build a wrapper around None.
    """

    def buildProtocol(self, addr):
        inner = self.wrappedFactory.buildProtocol(addr)
        if inner is None:
            return None
        return self.protocol(self, inner)


# -- PROXY protocol ------------------------------------------------------------


class _ProxyProtocolWrapper(HAProxyProtocolWrapper):
    """Twisted's PROXY header parser; ``getPeer()``/``getHost()`` give the
    addresses of the header once it is read.  ``connected`` turns false when
    the connection is lost (the MQTT protocol checks it after asynchronous
    authentication)."""

    def connectionLost(self, reason):
        self.connected = False
        super().connectionLost(reason)


class ProxyProtocolFactory(_RefusableWrapping, HAProxyWrappingFactory):
    """Expects a PROXY protocol v1 or v2 header first on every connection
    (the connection is closed without one) and passes the rest to
    ``wrappedFactory``'s protocol, whose transport then reports the proxied
    client as its peer.

    This is what Twisted's ``haproxy:`` endpoint string does (same wrapper),
    plus refusing cleanly when the wrapped factory refuses.

    :param wrappedFactory: the factory of the protocol behind the header.
    """

    protocol = _ProxyProtocolWrapper
    noisy = False


# -- TLS -----------------------------------------------------------------------


class _TLSProtocol(TLSMemoryBIOProtocol):
    """TLS as Twisted does it, except that closing the connection while a
    producer is registered (the MQTT protocol registers itself as a push
    producer) sends the TLS close alert and closes at once instead of waiting
    for the producer to be unregistered, as a TCP transport does."""

    def loseConnection(self):
        if self._producer is not None and self.connected and not self.disconnecting:
            self.unregisterProducer()
        super().loseConnection()


class TLSFactory(_RefusableWrapping, TLSMemoryBIOFactory):
    """Server-side TLS around ``wrappedFactory`` with the context of
    :func:`tls_options`.  The wrapped protocol is connected as soon as the
    TCP connection is, so its timeouts run during the handshake.

    :param contextFactory: an :class:`~twisted.internet.ssl.CertificateOptions`.
    :param isClient: False.
    :param wrappedFactory: the factory of the protocol inside TLS.
    :param clock: when small writes are flushed (Twisted aggregates them
        until the next reactor turn); the reactor when None.
    :ivar options: ``contextFactory``.
    """

    protocol = _TLSProtocol
    noisy = False

    def __init__(self, contextFactory, isClient, wrappedFactory, clock=None) -> None:
        super().__init__(contextFactory, isClient, wrappedFactory, clock)
        self.options = contextFactory


def _key_path(broker, listener, key: str) -> str:
    """``listeners[<i>].<key>`` for ``listener`` in the broker's config, for
    error messages; ``listeners[<name>].<key>`` when it is not found there."""
    listeners = getattr(getattr(broker, "config", None), "listeners", ()) or ()
    for i, item in enumerate(listeners):
        if item is listener:
            return f"listeners[{i}].{key}"
    return f"listeners[{listener.name}].{key}"


def _read(path: str, where: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read {path}: {e.strerror}", key=where) from e


def _load_certificates(path: str, where: str) -> list[x509.Certificate]:
    """Every certificate of the PEM file ``path``, in file order.

    :raises ConfigError: naming ``where`` when the file is unreadable or holds
        no PEM certificate.
    """
    data = _read(path, where)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise ConfigError(f"{where}: {path}: no PEM certificate ({e})", key=where) from e
    return certs


def _load_private_key(path: str, where: str):
    data = _read(path, where)
    try:
        return serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{where}: {path}: not an unencrypted PEM private key ({e})",
                          key=where) from e


def tls_options(listener, broker=None) -> ssl.CertificateOptions:
    """The TLS server context of a ``tls``/``wss`` listener.

    * certificate chain from ``tls_cert`` (leaf first, then intermediates),
      private key from ``tls_key``;
    * TLS 1.2 at least, Twisted's default cipher selection, no session
      tickets;
    * ``tls_client_auth``: ``none`` asks for no client certificate;
      ``optional`` asks for one and verifies it against ``tls_ca`` when one
      is sent (a certificate that does not verify fails the handshake);
      ``required`` also fails the handshake when none is sent.  The CA names
      of ``tls_ca`` are announced in the certificate request.

    The context is built here, so a key that does not match the certificate
    is reported at start.

    :param listener: the :class:`tbmq.config.ListenerConfig`.
    :param broker: the broker, used only to name the key path in errors.
    :returns: the options, usable as the ``contextFactory`` of
        :class:`TLSFactory`.
    :raises ConfigError: naming ``listeners[i].tls_cert`` / ``tls_key`` /
        ``tls_ca`` when a file is missing, unreadable or not PEM, or the key
        does not match the certificate.
    """
    where_cert = _key_path(broker, listener, "tls_cert")
    where_key = _key_path(broker, listener, "tls_key")
    if not listener.tls_cert:
        raise ConfigError(f"{where_cert}: required for type {listener.type}", key=where_cert)
    if not listener.tls_key:
        raise ConfigError(f"{where_key}: required for type {listener.type}", key=where_key)
    chain = _load_certificates(listener.tls_cert, where_cert)
    key = _load_private_key(listener.tls_key, where_key)
    cas: list[x509.Certificate] = []
    if listener.tls_client_auth != "none":
        where_ca = _key_path(broker, listener, "tls_ca")
        if not listener.tls_ca:
            raise ConfigError(f"{where_ca}: required for tls_client_auth "
                              f"{listener.tls_client_auth}", key=where_ca)
        cas = _load_certificates(listener.tls_ca, where_ca)
    try:
        try:
            return _certificate_options(chain, key, cas, listener.tls_client_auth, native=True)
        except TypeError:  # pyOpenSSL < 24.3 takes only its own X509 and PKey
            return _certificate_options(chain, key, cas, listener.tls_client_auth, native=False)
    except (SSL.Error, crypto.Error) as e:
        raise ConfigError(f"{where_key}: does not fit {listener.tls_cert} ({e})",
                          key=where_key) from e


def _certificate_options(chain: list[x509.Certificate], key, cas: list[x509.Certificate],
                         client_auth: str, native: bool) -> ssl.CertificateOptions:
    """Build the options and their context (see :func:`tls_options`).

    :param native: pass :mod:`cryptography` objects to pyOpenSSL (its
        current API) rather than its deprecated ``X509``/``PKey`` wrappers.
    :raises OpenSSL.SSL.Error: the key does not match the certificate.
    :raises TypeError: ``native`` with a pyOpenSSL that does not take them.
    """
    def cert(c: x509.Certificate):
        return c if native else crypto.X509.from_cryptography(c)

    kwargs: dict[str, Any] = {
        "privateKey": key if native else crypto.PKey.from_cryptography_key(key),
        "certificate": cert(chain[0]),
        "extraCertChain": [cert(c) for c in chain[1:]],
        "raiseMinimumTo": ssl.TLSVersion.TLSv1_2,
    }
    if client_auth != "none":
        # caCerts + verify rather than trustRoot: trustRoot always requires a
        # certificate, and "optional" must not.  Twisted adds them to an
        # X509Store, which takes only pyOpenSSL's X509.
        kwargs.update(verify=True, caCerts=[crypto.X509.from_cryptography(c) for c in cas],
                      requireCertificate=client_auth == "required")
    options = ssl.CertificateOptions(**kwargs)
    context = options.getContext()  # built now: errors at start, not per connection
    for ca in cas:  # the CA names sent in the certificate request
        context.add_client_ca(cert(ca))
    return options


# -- WebSocket -----------------------------------------------------------------


def _forwarded_host(headers: dict[str, str]) -> str | None:
    """The client's address as a proxy gave it: the first address of
    ``X-Forwarded-For`` (several headers are joined with commas), else
    ``X-Real-IP``; a port (``203.0.113.9:5000``, ``[2001:db8::1]:5000``)
    left out."""
    value = headers.get("x-forwarded-for", "").split(",")[0].strip()
    if not value:
        value = headers.get("x-real-ip", "").strip()
    if not value:
        return None
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:  # IPv4 with a port; IPv6 has several colons
        return value.split(":", 1)[0]
    return value


def forwarded_address(headers: dict[str, str], warnings=None) -> interfaces.IAddress | None:
    """The client's address that a trusted HTTP proxy put in a WebSocket
    upgrade request (TBMQ 2.4; ``listeners[].trust_proxy``).

    :param headers: the request's headers, names in lower case (autobahn's
        ``ConnectionRequest.headers``).
    :param warnings: a :class:`~tbmq.log.LogThrottle` for headers that hold
        no IP address, or None.
    :returns: an :class:`~twisted.internet.address.IPv4Address` or
        ``IPv6Address`` without a port (``port`` None: the header gives
        none), or None when neither header holds an IP address (the TCP
        peer is the client's address then).
    """
    host = _forwarded_host(headers)
    if host is None:
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if warnings is not None:
            warnings.info("ignored a forwarded client address that is no IP address: "
                          "{value!r}", value=host[:100])
        return None
    if ip.version == 6:
        return address.IPv6Address("TCP", str(ip), None)
    return address.IPv4Address("TCP", str(ip), None)


class MQTTWebSocketProtocol(WrappingWebSocketServerProtocol):
    """One WebSocket connection carrying one MQTT connection (MQTT section 6).

    The opening handshake is accepted only on the factory's ``path`` with a
    subprotocol of :data:`WS_SUBPROTOCOLS` (else HTTP 404 / 406), and only
    when the MQTT factory accepts a new connection (else HTTP 503).  Then it
    is the MQTT protocol's transport: binary messages out, the payload of
    binary frames in as it arrives; a text frame closes the connection
    [MQTT-6.0.0-1].
    """

    #: the MQTT protocol, from the accepted upgrade until the connection ends
    _mqtt = None
    #: the client's address a trusted proxy gave (``trust_proxy``), or None
    _forwarded = None
    _mqtt_connected = False
    _handshake_timer = None

    # -- opening handshake ---------------------------------------------------

    def connectionMade(self) -> None:
        super().connectionMade()
        factory = self.factory
        if factory.open_handshake_timeout:
            self._handshake_timer = factory.clock.callLater(
                factory.open_handshake_timeout, self._handshake_timed_out)

    def _handshake_timed_out(self) -> None:
        self._handshake_timer = None
        self.onOpenHandshakeTimeout()  # drops the connection unless it is open

    def _cancel_handshake_timer(self) -> None:
        timer, self._handshake_timer = self._handshake_timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def onConnect(self, request):
        factory = self.factory
        if request.path != factory.path:
            raise ConnectionDeny(ConnectionDeny.NOT_FOUND,
                                 f"MQTT over WebSocket is at {factory.path}")
        for subprotocol in request.protocols:
            if subprotocol in WS_SUBPROTOCOLS:
                break
        else:
            raise ConnectionDeny(ConnectionDeny.NOT_ACCEPTABLE,
                                 "the WebSocket subprotocol must be mqtt or mqttv3.1")
        if factory.trust_proxy:
            self._forwarded = forwarded_address(request.headers, factory.bad_headers)
        mqtt = factory.wrapped_factory.buildProtocol(self.getPeer())
        if mqtt is None:
            raise ConnectionDeny(ConnectionDeny.SERVICE_UNAVAILABLE, "connection limit reached")
        self._mqtt = mqtt
        self._binaryMode = True
        return subprotocol

    def onOpen(self) -> None:
        self._cancel_handshake_timer()
        self._mqtt_connected = True
        self._mqtt.makeConnection(self)

    # -- incoming data ---------------------------------------------------------

    def onMessageBegin(self, isBinary: bool) -> None:
        super().onMessageBegin(isBinary)
        if not isBinary:
            self._fail_connection(WebSocketProtocol.CLOSE_STATUS_CODE_UNSUPPORTED_DATA,
                                  "MQTT packets must be sent in binary frames")

    def onMessageFrameData(self, payload: bytes) -> None:
        if self.failedByMe or not self._mqtt_connected or self._mqtt is None:
            return
        self._mqtt.dataReceived(payload)

    def onMessageFrame(self, payload) -> None:
        pass  # already delivered by onMessageFrameData

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        pass  # already delivered by onMessageFrameData

    def onClose(self, wasClean: bool, code, reason) -> None:
        mqtt, self._mqtt = self._mqtt, None
        self._mqtt_connected = False
        if mqtt is not None:
            # also when the upgrade was accepted but never opened: the MQTT
            # factory counted the connection
            if wasClean:
                mqtt.connectionLost(Failure(error.ConnectionDone()))
            else:
                mqtt.connectionLost(Failure(error.ConnectionLost(reason)))

    def connectionLost(self, reason) -> None:
        self.connected = False
        self._cancel_handshake_timer()
        super().connectionLost(reason)

    # -- the MQTT protocol's transport ----------------------------------------

    def getPeer(self):
        """The client's address: on a ``trust_proxy`` listener the one its
        proxy forwarded in the upgrade request (:func:`forwarded_address`),
        else the TCP peer (behind the PROXY protocol, the header's)."""
        forwarded = self._forwarded
        return forwarded if forwarded is not None else self.transport.getPeer()

    def write(self, data: bytes) -> None:
        """Send ``data`` as one binary message; dropped once the WebSocket is
        closing (as a TCP transport drops writes after ``loseConnection``)."""
        if self.state != WebSocketProtocol.STATE_OPEN:
            return
        self.sendMessage(bytes(data), isBinary=True)

    def writeSequence(self, data) -> None:
        self.write(b"".join(data))

    def loseConnection(self) -> None:
        """The WebSocket closing handshake, then the TCP close (the peer has
        ``closeHandshakeTimeout`` seconds to answer)."""
        if self.state == WebSocketProtocol.STATE_OPEN:
            self.sendClose(WebSocketProtocol.CLOSE_STATUS_CODE_NORMAL)
        elif self.state != WebSocketProtocol.STATE_CLOSED:
            self.dropConnection(abort=False)

    def abortConnection(self) -> None:
        self.dropConnection(abort=True)

    _producer_registered = False

    def registerProducer(self, producer, streaming) -> None:
        """The MQTT protocol as producer of the connection underneath (its
        write buffer is the WebSocket's)."""
        self.transport.registerProducer(producer, streaming)
        self._producer_registered = True

    def unregisterProducer(self) -> None:
        # autobahn calls this on every drop, registered or not
        if self._producer_registered:
            self._producer_registered = False
            self.transport.unregisterProducer()


class MQTTWebSocketFactory(WrappingWebSocketServerFactory):
    """MQTT over WebSocket around an MQTT factory.

    :param factory: the :class:`~tbmq.broker.protocol.MQTTFactory`.
    :param path: the HTTP path of the upgrade (``ws_path``).
    :param open_handshake_timeout: seconds from the TCP connection to the
        completed upgrade (TLS handshake included for ``wss``); 0 for none.
        Timed on ``clock`` rather than with autobahn's ``openHandshakeTimeout``,
        whose timers are cut to whole seconds (1 s fires after 0 to 1 s).
    :param secure: whether it runs inside TLS (``wss``).
    :param reactor: the reactor (autobahn's own timers).
    :param clock: an :class:`~twisted.internet.interfaces.IReactorTime` for
        the opening handshake timeout; ``reactor`` when None.
    :param trust_proxy: take the client's address from the upgrade
        request's ``X-Forwarded-For`` / ``X-Real-IP`` headers
        (``listeners[].trust_proxy``).
    """

    protocol = MQTTWebSocketProtocol
    noisy = False

    def __init__(self, factory, path: str = "/mqtt", open_handshake_timeout: float = 10.0,
                 secure: bool = False, reactor=None, clock=None,
                 trust_proxy: bool = False) -> None:
        url = f"{'wss' if secure else 'ws'}://localhost{path}"
        super().__init__(factory, url, reactor=reactor, enableCompression=False,
                         autoFragmentSize=0)
        self.wrapped_factory = factory
        self.path = path
        self.open_handshake_timeout = open_handshake_timeout
        self.clock = clock if clock is not None else self.reactor
        self.trust_proxy = trust_proxy
        self.bad_headers = LogThrottle(self.clock, log, "unusable forwarded addresses")
        self.server = WS_SERVER_HEADER
        self.protocols = list(WS_SUBPROTOCOLS)
        self.setProtocolOptions(
            openHandshakeTimeout=0,   # see open_handshake_timeout
            closeHandshakeTimeout=1.0,
            webStatus=False,
            maxFramePayloadSize=0,    # no buffering: the MQTT decoder limits sizes
            maxMessagePayloadSize=0,
        )

    def buildProtocol(self, addr):
        proto = self.protocol()
        proto.factory = self
        return proto


# -- building and listening -----------------------------------------------------


def build_factory(broker, listener, reactor=None) -> interfaces.IProtocolFactory:
    """The protocol factory of one listener: :class:`MQTTFactory` (its
    ``max_packet_size`` and ``max_connections``) inside WebSocket for
    ``ws``/``wss``, inside TLS for ``tls``/``wss``, inside the PROXY protocol
    when ``proxy_protocol``.

    :param broker: the :class:`tbmq.broker.broker.Broker`.
    :param listener: the :class:`tbmq.config.ListenerConfig`.
    :param reactor: the reactor (WebSocket timers); the global one when None.
    :returns: the outermost factory, to listen with on ``listener.endpoint``.
    :raises ConfigError: for unusable TLS files (see :func:`tls_options`).
    """
    # imported here: tbmq.broker.protocol imports this module (peer_certificate_chain)
    from tbmq.broker.protocol import MQTTFactory

    factory: Any = MQTTFactory(broker, listener)
    if listener.type in ("ws", "wss"):
        factory = MQTTWebSocketFactory(
            factory, listener.ws_path, broker.config.mqtt.connect_timeout,
            secure=listener.type == "wss", reactor=reactor, clock=broker.clock,
            trust_proxy=listener.trust_proxy)
    if listener.type in TLS_LISTENER_TYPES:
        factory = TLSFactory(tls_options(listener, broker), False, factory, clock=broker.clock)
    if listener.proxy_protocol:
        factory = ProxyProtocolFactory(factory)
    return factory


#: endpoint types whose Twisted parser takes ``backlog=``
_BACKLOG_TYPES = ("tcp", "tcp6", "unix")


def endpoint_string(listener) -> str:
    """``listener.endpoint`` with ``:backlog=<listener.backlog>`` added when
    it is a TCP or UNIX endpoint that does not set its own (Twisted's
    default, 50, overflows when a few hundred devices reconnect at once and
    each overflow costs the client a one-second SYN retransmission).

    :param listener: the :class:`tbmq.config.ListenerConfig`.
    :returns: the endpoint string to listen on.
    """
    endpoint = listener.endpoint
    kind = endpoint.split(":", 1)[0].strip().lower()
    if kind in _BACKLOG_TYPES and not re.search(r"(^|:)backlog=", endpoint):
        endpoint += f":backlog={listener.backlog}"
    return endpoint


def parse_endpoint(reactor, text: str, shown: str, where: str) -> interfaces.IStreamServerEndpoint:
    """Read a server endpoint string with :func:`~twisted.internet.endpoints.serverFromString`
    (nothing is bound yet).

    :param reactor: the reactor the endpoint listens with.
    :param text: the endpoint string to read.
    :param shown: the endpoint as the config gives it, for the message.
    :param where: the key path of the setting (``listeners[0].endpoint``).
    :raises ConfigError: ``listeners[0].endpoint: invalid endpoint 'tcp:abc': …``
        with Twisted's reason.
    """
    try:
        return endpoints.serverFromString(reactor, text)
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"{where}: invalid endpoint {shown!r}: {e}", key=where) from None


def server_endpoint(broker, listener, reactor=None) -> interfaces.IStreamServerEndpoint:
    """The endpoint of ``listener`` (:func:`endpoint_string`), not yet listening.

    :raises ConfigError: for an endpoint string Twisted does not read.
    """
    if reactor is None:
        from twisted.internet import reactor
    return parse_endpoint(reactor, endpoint_string(listener), listener.endpoint,
                          _key_path(broker, listener, "endpoint"))


def check(broker, listener, reactor=None) -> None:
    """Read what ``listener`` needs before it listens, its endpoint string
    and its TLS files, so that a mistake in either stops the node when it
    is made (``twistd``: exit status 2) rather than once it runs.

    :raises ConfigError: naming the setting (see :func:`server_endpoint`
        and :func:`tls_options`).
    """
    server_endpoint(broker, listener, reactor)
    if listener.type in TLS_LISTENER_TYPES:
        tls_options(listener, broker)


def cannot_listen(reason: error.CannotListenError, shown: str, where: str) -> StartupError:
    """The one-line error of an endpoint that could not listen.

    :param reason: Twisted's error (its ``socketError`` says why).
    :param shown: the endpoint as the config gives it.
    :param where: the key path of the setting.
    :returns: ``cannot listen on tcp:1883: address already in use
        (listeners[0].endpoint)``.
    """
    cause = reason.socketError
    text = getattr(cause, "strerror", None) or str(cause)
    return StartupError(f"cannot listen on {shown}: {text[:1].lower()}{text[1:]} ({where})")


def listen_on(endpoint, factory, shown: str, where: str) -> defer.Deferred:
    """``endpoint.listen(factory)``, its ``CannotListenError`` (address in
    use, permission denied) told as :func:`cannot_listen`.

    :returns: a Deferred firing with the ``IListeningPort`` or failing with
        :class:`StartupError` (or the endpoint's other errors).
    """
    def explain(failure: Failure):
        failure.trap(error.CannotListenError)
        raise cannot_listen(failure.value, shown, where)

    return endpoint.listen(factory).addErrback(explain)


def listen(broker, listener, reactor=None) -> defer.Deferred:
    """Listen on ``listener.endpoint`` with :func:`build_factory`.

    :param broker: the :class:`tbmq.broker.broker.Broker`.
    :param listener: the :class:`tbmq.config.ListenerConfig`.
    :param reactor: the reactor; the global one when None.
    :returns: a Deferred firing with the
        :class:`~twisted.internet.interfaces.IListeningPort` (a TCP port's
        connections get the lighter :class:`tbmq.broker.tcp_server.Server`
        transport), or failing with
        :class:`ConfigError` (bad endpoint string, TLS files) or
        :class:`StartupError` (address in use …, see :func:`listen_on`).
        For ``tcp:``, ``tcp6:`` and ``unix:`` endpoints it has fired when
        this returns.
    """
    if reactor is None:
        from twisted.internet import reactor
    try:
        endpoint = server_endpoint(broker, listener, reactor)
        factory = build_factory(broker, listener, reactor)
    except ConfigError:
        return defer.fail()
    return listen_on(endpoint, factory, listener.endpoint,
                     _key_path(broker, listener, "endpoint")).addCallback(lighten)


# -- what the layers know about a connection ----------------------------------------


def _layers(transport, limit: int = 8):
    """``transport``, then the transport under it, and so on (wrapping
    protocols keep theirs in ``.transport``)."""
    layer = transport
    while layer is not None and limit > 0:
        yield layer
        layer = vars(layer).get("transport") if hasattr(layer, "__dict__") else None
        limit -= 1


def peer_certificate_chain(transport) -> list[x509.Certificate] | None:
    """The client certificate chain of a connection, as verified by the TLS
    handshake against the listener's ``tls_ca``: leaf first, up to and
    including the trusted CA.

    :param transport: an MQTT protocol's ``transport`` (TLS, WebSocket over
        TLS, with or without the PROXY protocol).
    :returns: the chain, or None when the connection is not TLS, the
        listener asks for no client certificate (``tls_client_auth: none``),
        the client sent none, the handshake is not complete, or the
        connection is gone.
    """
    for layer in _layers(transport):
        if isinstance(layer, TLSMemoryBIOProtocol):
            connection = layer.getHandle()
            if connection is None:
                return None
            try:
                chain = connection.get_verified_chain(as_cryptography=True)
            except TypeError:  # pyOpenSSL < 25: X509 objects
                chain = connection.get_verified_chain()
                chain = [c.to_cryptography() for c in chain] if chain else None
            return list(chain) if chain else None
    return None


def peer_address(transport) -> interfaces.IAddress | None:
    """The client's address: the source address of the PROXY protocol header
    on a ``proxy_protocol`` listener, else the TCP peer.  Every layer's
    ``getPeer()`` delegates down to the PROXY wrapper, so this is
    ``transport.getPeer()`` of the MQTT protocol's transport.

    :param transport: an MQTT protocol's ``transport``.
    :returns: an :class:`~twisted.internet.interfaces.IAddress`
        (:class:`~twisted.internet.address.IPv4Address` or ``IPv6Address``;
        for a PROXY v1 ``UNKNOWN`` header, the proxy's own address), or None
        without a transport.
    """
    if transport is None:
        return None
    return transport.getPeer()
