"""Listeners (tbmq.listeners): the config of TLS / WebSocket / PROXY protocol
listeners, the factory stack built for each type, and what a connection
tells through the stack (certificate chain, peer address) — all in memory:
StringTransport and iosim loopbacks on a task.Clock."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL
from twisted.internet import protocol, ssl
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.test import iosim

from tbmq import listeners
from tbmq.broker.protocol import ConnectionContext, MQTTFactory, MQTTProtocol
from tbmq.config import load_config
from tbmq.errors import ConfigError
from tbmq.listeners import (
    MQTTWebSocketFactory, MQTTWebSocketProtocol, ProxyProtocolFactory, TLSFactory,
    build_factory, peer_address, peer_certificate_chain,
)
from tbmq.mqtt import Connack, Connect, Pingreq, Pingresp, Publish, Subscribe, SubscriptionRequest
from tbmq.mqtt.codec import Decoder, encode
from tests.certs import make_pki
from tests.helpers import Harness

CLIENT_ADDR = IPv4Address("TCP", "192.0.2.10", 40000)
SERVER_ADDR = IPv4Address("TCP", "127.0.0.1", 8883)


# -- config --------------------------------------------------------------------


def load(*listeners, environ=None):
    return load_config(None, environ=environ or {}, overrides={"listeners": list(listeners)})


def error_of(*listeners, environ=None) -> str:
    with pytest.raises(ConfigError) as e:
        load(*listeners, environ=environ)
    return str(e.value)


def test_defaults_of_the_new_fields():
    (listener,) = load({"name": "a"}).listeners
    assert listener.tls_cert is None and listener.tls_key is None and listener.tls_ca is None
    assert listener.tls_client_auth == "none"
    assert listener.ws_path == "/mqtt"
    assert listener.proxy_protocol is False


def test_a_tls_listener_with_every_field():
    config = load({"name": "plain"}, {
        "name": "secure", "type": "wss", "endpoint": "tcp:8884:interface=127.0.0.1",
        "tls_cert": "c.pem", "tls_key": "k.pem", "tls_ca": "ca.pem",
        "tls_client_auth": "required", "ws_path": "/ws", "proxy_protocol": True})
    listener = config.listeners[1]
    assert (listener.tls_cert, listener.tls_key, listener.tls_ca) == ("c.pem", "k.pem", "ca.pem")
    assert listener.tls_client_auth == "required"
    assert listener.ws_path == "/ws" and listener.proxy_protocol is True


@pytest.mark.parametrize("listener, message", [
    ({"type": "tls"}, "listeners[1].tls_cert: required for type tls"),
    ({"type": "wss", "tls_cert": "c.pem"}, "listeners[1].tls_key: required for type wss"),
    ({"type": "tls", "tls_cert": "c.pem", "tls_key": "k.pem", "tls_client_auth": "optional"},
     "listeners[1].tls_ca: required for tls_client_auth optional"),
    ({"type": "tls", "tls_cert": "c.pem", "tls_key": "k.pem", "tls_client_auth": "required"},
     "listeners[1].tls_ca: required for tls_client_auth required"),
    ({"type": "tls", "tls_cert": "c.pem", "tls_key": "k.pem", "tls_client_auth": "yes"},
     "listeners[1].tls_client_auth: must be one of none, optional, required"),
    ({"type": "tcp", "tls_cert": "c.pem"}, "listeners[1].tls_cert: only used by types tls and wss"),
    ({"type": "ws", "tls_ca": "ca.pem"}, "listeners[1].tls_ca: only used by types tls and wss"),
    ({"type": "tcp", "tls_client_auth": "optional", "tls_ca": "ca.pem"},
     "listeners[1].tls_ca: only used by types tls and wss"),
    ({"type": "tls", "tls_cert": "", "tls_key": "k.pem"}, "listeners[1].tls_cert: must not be empty"),
    ({"type": "ws", "ws_path": "mqtt"}, "listeners[1].ws_path: must be an HTTP path"),
    ({"type": "ws", "ws_path": "/mqtt?x=1"}, "listeners[1].ws_path: must be an HTTP path"),
    ({"type": "ws", "proxy_protocol": "yes"}, "listeners[1].proxy_protocol: expected true or false"),
    ({"type": "tls", "endpoint": "ssl:8883:privateKey=k.pem", "tls_cert": "c", "tls_key": "k"},
     "listeners[1].endpoint: give the TCP endpoint"),
    ({"endpoint": "haproxy:tcp:1884", "proxy_protocol": True},
     "listeners[1].endpoint: give the inner endpoint"),
])
def test_invalid_listener_fields_name_the_key_path(listener, message):
    assert error_of({"name": "first"}, {"name": "second", **listener}).startswith(message)


def test_environment_sets_the_new_fields():
    config = load_config(None, environ={
        "TBMQ_LISTENERS__0__TYPE": "wss",
        "TBMQ_LISTENERS__0__TLS_CERT": "/etc/c.pem",
        "TBMQ_LISTENERS__0__TLS_KEY": "/etc/k.pem",
        "TBMQ_LISTENERS__0__PROXY_PROTOCOL": "true",
        "TBMQ_LISTENERS__0__WS_PATH": "/",
    })
    (listener,) = config.listeners
    assert listener.type == "wss" and listener.tls_cert == "/etc/c.pem"
    assert listener.proxy_protocol is True and listener.ws_path == "/"


# -- factories -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_fields(pki, client_auth="none"):
    fields = {"tls_cert": str(pki.server.chain_path), "tls_key": str(pki.server.key_path)}
    if client_auth != "none":
        fields.update(tls_ca=str(pki.ca.cert_path), tls_client_auth=client_auth)
    return fields


def harness(*listeners, connect_timeout=10.0) -> Harness:
    return Harness({"listeners": list(listeners), "mqtt": {"connect_timeout": connect_timeout}})


def test_each_type_gets_its_wrappers(pki):
    h = harness(
        {"name": "tcp"},
        {"name": "tls", "type": "tls", **tls_fields(pki)},
        {"name": "ws", "type": "ws", "max_packet_size": 512},
        {"name": "wss", "type": "wss", **tls_fields(pki, "optional")},
        {"name": "proxy", "proxy_protocol": True},
        {"name": "proxy-wss", "type": "wss", "proxy_protocol": True, **tls_fields(pki)},
        connect_timeout=7,
    )
    tcp, tls, ws, wss, proxy, proxy_wss = (
        build_factory(h.broker, listener) for listener in h.config.listeners)
    assert type(tcp) is MQTTFactory
    assert type(tls) is TLSFactory and type(tls.wrappedFactory) is MQTTFactory
    assert type(ws) is MQTTWebSocketFactory and type(ws.wrapped_factory) is MQTTFactory
    assert ws.wrapped_factory.max_packet_size == 512
    assert ws.path == "/mqtt" and ws.open_handshake_timeout == 7
    assert type(wss) is TLSFactory and type(wss.wrappedFactory) is MQTTWebSocketFactory
    assert type(wss.wrappedFactory.wrapped_factory) is MQTTFactory
    assert type(proxy) is ProxyProtocolFactory and type(proxy.wrappedFactory) is MQTTFactory
    assert type(proxy_wss) is ProxyProtocolFactory
    assert type(proxy_wss.wrappedFactory.wrappedFactory.wrapped_factory) is MQTTFactory
    # each MQTTFactory carries its own listener
    assert [f.listener.name for f in (tcp, tls.wrappedFactory, ws.wrapped_factory)] == \
        ["tcp", "tls", "ws"]


@pytest.mark.parametrize("client_auth, mode", [
    ("none", SSL.VERIFY_NONE),
    ("optional", SSL.VERIFY_PEER),
    ("required", SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT),
])
def test_client_certificate_verification_follows_tls_client_auth(pki, client_auth, mode):
    h = harness({"name": "tls", "type": "tls", **tls_fields(pki, client_auth)})
    context = build_factory(h.broker, h.config.listeners[0]).options.getContext()
    checked = SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT
    assert context.get_verify_mode() & checked == mode
    options = context.set_options(0)  # adds nothing, returns the options in force
    assert options & SSL.OP_NO_TLSv1 and options & SSL.OP_NO_TLSv1_1  # TLS 1.2 at least
    assert not options & SSL.OP_NO_TLSv1_2


def test_unusable_tls_files_name_the_key(pki, tmp_path):
    wrong_key = {"name": "t", "type": "tls", "tls_cert": str(pki.server.chain_path),
                 "tls_key": str(pki.client.key_path)}
    h = harness({"name": "a"}, wrong_key)
    with pytest.raises(ConfigError, match=r"^listeners\[1\]\.tls_key: does not fit"):
        build_factory(h.broker, h.config.listeners[1])
    missing = dict(wrong_key, tls_cert=str(tmp_path / "nope.pem"))
    h = harness(missing)
    with pytest.raises(ConfigError, match=r"^listeners\[0\]\.tls_cert: cannot read .*nope\.pem"):
        build_factory(h.broker, h.config.listeners[0])
    not_pem = dict(wrong_key, tls_cert=str(pki.server.key_path))
    h = harness(not_pem)
    with pytest.raises(ConfigError, match=r"^listeners\[0\]\.tls_cert: .* no PEM certificate"):
        build_factory(h.broker, h.config.listeners[0])
    bad_ca = dict(tls_fields(pki, "required"), name="t", type="tls",
                  tls_ca=str(tmp_path / "none.pem"))
    h = harness(bad_ca)
    with pytest.raises(ConfigError, match=r"^listeners\[0\]\.tls_ca: cannot read"):
        build_factory(h.broker, h.config.listeners[0])


def test_a_full_listener_refuses_at_every_layer(pki):
    h = harness({"name": "tls", "type": "tls", "max_connections": 1, **tls_fields(pki)},
                {"name": "proxy", "proxy_protocol": True, "max_connections": 1})
    for listener in h.config.listeners:
        factory = build_factory(h.broker, listener)
        first = factory.buildProtocol(CLIENT_ADDR)
        assert first is not None
        first.makeConnection(StringTransport(peerAddress=CLIENT_ADDR))
        assert factory.buildProtocol(CLIENT_ADDR) is None, listener.name
        first.connectionLost(None)
        assert factory.buildProtocol(CLIENT_ADDR) is not None, listener.name


# -- helpers: a TLS client, WebSocket frames ---------------------------------------


class Collector(protocol.Protocol):
    """A client protocol that keeps what it receives."""

    def __init__(self) -> None:
        self.data = b""
        self.lost = None
        self.made = False

    def connectionMade(self) -> None:
        self.made = True

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason=None) -> None:
        self.lost = reason


def client_tls(issued=None, extra_chain=()) -> ssl.CertificateOptions:
    kwargs = {}
    if issued is not None:
        kwargs.update(privateKey=issued.key, certificate=issued.cert,
                      extraCertChain=list(issued.chain[1:]) + list(extra_chain))
    return ssl.CertificateOptions(**kwargs)


def loopback(h: Harness, server_factory, client_protocol, client_options=None,
             preamble: bytes = b""):
    """Connect ``client_protocol`` (inside TLS when ``client_options``) to a
    protocol of ``server_factory`` in memory, on the harness's clock.

    :returns: (server protocol, client protocol, pump).
    """
    server = server_factory.buildProtocol(CLIENT_ADDR)
    client = client_protocol
    if client_options is not None:
        client = protocol.Factory.forProtocol(lambda: client_protocol)
        client = listeners.TLSFactory(client_options, True, client, clock=h.clock) \
            .buildProtocol(SERVER_ADDR)
    clock = h.clock
    server_transport = iosim.FakeTransport(server, True, SERVER_ADDR, CLIENT_ADDR)
    client_transport = iosim.FakeTransport(client, False, CLIENT_ADDR, SERVER_ADDR)
    if preamble:  # bytes a proxy puts first on the connection
        server.makeConnection(server_transport)
        server.dataReceived(preamble)
        client.makeConnection(client_transport)
        pump = iosim.IOPump(client, server, client_transport, server_transport, False, clock)
        pump.flush()
    else:
        pump = iosim.connect(server, server_transport, client, client_transport, clock=clock)
    return server, client, pump


def mqtt_of(server) -> MQTTProtocol | None:
    """The MQTT protocol at the bottom of a server-side protocol stack."""
    layer = server
    for _ in range(6):
        if isinstance(layer, MQTTProtocol):
            return layer
        layer = getattr(layer, "wrappedProtocol", None) or getattr(layer, "_mqtt", None)
    return None


def connect_bytes(client_id: str = "c", level: int = 4) -> bytes:
    return encode(Connect(protocol_level=level, client_id=client_id))


def packets(data: bytes, level: int = 4) -> list:
    return Decoder(protocol_level=level, server_side=False).feed(data)


WS_KEY = base64.b64encode(b"0123456789abcdef").decode()


def upgrade_request(path="/mqtt", subprotocols="mqtt") -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: localhost", "Upgrade: websocket",
             "Connection: Upgrade", f"Sec-WebSocket-Key: {WS_KEY}", "Sec-WebSocket-Version: 13"]
    if subprotocols:
        lines.append(f"Sec-WebSocket-Protocol: {subprotocols}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def ws_frame(payload: bytes, opcode: int = 2, fin: bool = True, mask: bytes = b"\x01\x02\x03\x04") -> bytes:
    """A client → server frame (masked)."""
    first = (0x80 if fin else 0) | opcode
    n = len(payload)
    if n < 126:
        header = bytes([first, 0x80 | n])
    elif n < 65536:
        header = bytes([first, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        header = bytes([first, 0x80 | 127]) + n.to_bytes(8, "big")
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def split_response(data: bytes) -> tuple[str, list[tuple[int, bytes]]]:
    """The HTTP response head and the server's (unmasked) frames after it."""
    head, _, rest = data.partition(b"\r\n\r\n")
    frames = []
    while len(rest) >= 2:
        opcode, n = rest[0] & 0x0F, rest[1] & 0x7F
        offset = 2
        if n == 126:
            n, offset = int.from_bytes(rest[2:4], "big"), 4
        elif n == 127:
            n, offset = int.from_bytes(rest[2:10], "big"), 10
        frames.append((opcode, rest[offset:offset + n]))
        rest = rest[offset + n:]
    return head.decode("latin-1"), frames


def mqtt_from_frames(frames) -> list:
    return packets(b"".join(payload for opcode, payload in frames if opcode == 2))


class WSConnection:
    """A server-side WebSocket protocol of ``factory`` on a StringTransport."""

    def __init__(self, factory, peer=CLIENT_ADDR, clock=None) -> None:
        self.transport = StringTransport(peerAddress=peer, hostAddress=SERVER_ADDR)
        self.protocol = factory.buildProtocol(peer)
        self.protocol.makeConnection(self.transport)
        self.clock = clock

    def send(self, data: bytes) -> None:
        self.protocol.dataReceived(data)
        if self.clock is not None:
            self.clock.advance(0)  # the reactor turn ends: outbound queues flush

    def response(self) -> tuple[str, list]:
        return split_response(self.transport.value())


# -- TLS ---------------------------------------------------------------------------------


def test_tls_carries_mqtt_and_the_verified_client_chain(pki):
    h = harness({"name": "tls", "type": "tls", **tls_fields(pki, "required")})
    factory = build_factory(h.broker, h.config.listeners[0])
    client = Collector()
    server, _, pump = loopback(h, factory, client, client_tls(pki.client))
    assert client.made and client.lost is None
    client.transport.write(connect_bytes("tls-client"))
    pump.flush()
    assert packets(client.data) == [Connack(False, 0)]
    mqtt = mqtt_of(server)
    chain = peer_certificate_chain(mqtt.transport)
    assert chain == [pki.client.cert, pki.ca.cert]  # leaf first, up to the trust anchor
    assert peer_address(mqtt.transport) == CLIENT_ADDR


def test_the_chain_includes_intermediates_sent_by_the_client(pki, tmp_path):
    sub = pki.ca.intermediate("sub-ca")
    leaf = sub.issue("dev", "device-7")
    h = harness({"name": "tls", "type": "tls", **tls_fields(pki, "optional")})
    client = Collector()
    server, _, pump = loopback(h, build_factory(h.broker, h.config.listeners[0]), client,
                               client_tls(leaf))
    assert client.lost is None
    assert peer_certificate_chain(mqtt_of(server).transport) == [leaf.cert, sub.cert, pki.ca.cert]


def test_optional_client_auth_accepts_no_certificate(pki):
    h = harness({"name": "tls", "type": "tls", **tls_fields(pki, "optional")})
    client = Collector()
    server, _, pump = loopback(h, build_factory(h.broker, h.config.listeners[0]), client,
                               client_tls(None))
    client.transport.write(connect_bytes())
    pump.flush()
    assert packets(client.data) == [Connack(False, 0)]
    assert peer_certificate_chain(mqtt_of(server).transport) is None


@pytest.mark.parametrize("client_auth", ["optional", "required"])
def test_a_certificate_of_another_ca_fails_the_handshake(pki, client_auth):
    h = harness({"name": "tls", "type": "tls", **tls_fields(pki, client_auth)})
    client = Collector()
    server, _, pump = loopback(h, build_factory(h.broker, h.config.listeners[0]), client,
                               client_tls(pki.untrusted_client))
    pump.flush()
    assert client.lost is not None and client.data == b""
    assert h.broker.connections == set()
    assert mqtt_of(server) is None  # the wrapper let go of it: connection over


def test_required_client_auth_refuses_no_certificate(pki):
    h = harness({"name": "tls", "type": "tls", **tls_fields(pki, "required")})
    client = Collector()
    loopback(h, build_factory(h.broker, h.config.listeners[0]), client, client_tls(None))[2].flush()
    assert client.lost is not None and client.data == b""


def test_no_client_auth_means_no_chain(pki):
    h = harness({"name": "tls", "type": "tls", **tls_fields(pki)})
    client = Collector()
    server, _, pump = loopback(h, build_factory(h.broker, h.config.listeners[0]), client,
                               client_tls(pki.client))
    assert client.lost is None
    assert peer_certificate_chain(mqtt_of(server).transport) is None


def test_no_chain_on_plain_tcp_or_without_transport():
    h = harness({"name": "tcp"})
    server = build_factory(h.broker, h.config.listeners[0]).buildProtocol(CLIENT_ADDR)
    server.makeConnection(StringTransport(peerAddress=CLIENT_ADDR))
    assert peer_certificate_chain(server.transport) is None
    assert peer_certificate_chain(None) is None
    assert peer_address(None) is None


def test_connect_timeout_covers_a_tls_handshake_that_never_finishes(pki):
    h = harness({"name": "tls", "type": "tls", **tls_fields(pki)}, connect_timeout=3)
    server = build_factory(h.broker, h.config.listeners[0]).buildProtocol(CLIENT_ADDR)
    transport = StringTransport(peerAddress=CLIENT_ADDR)
    server.makeConnection(transport)
    server.dataReceived(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello's start
    h.clock.advance(2.9)
    assert not transport.disconnecting
    h.clock.advance(0.2)
    assert transport.disconnecting  # aborted: no TLS close alert mid-handshake
    server.connectionLost(None)
    assert h.broker.connections == set()


def test_a_server_side_close_after_the_handshake_closes_tls_at_once(pki):
    """The MQTT protocol is a registered producer of its transport; closing
    must not wait for it to unregister (nor for the 5 s abort)."""
    h = harness({"name": "tls", "type": "tls", **tls_fields(pki)})
    client = Collector()
    server, _, pump = loopback(h, build_factory(h.broker, h.config.listeners[0]), client,
                               client_tls(None))
    client.transport.write(encode(Pingreq()))  # not CONNECT: the broker closes
    pump.flush()
    assert client.lost is not None


# -- WebSocket --------------------------------------------------------------------------------


def ws_harness(**listener) -> Harness:
    return harness({"name": "ws", "type": "ws", **listener}, connect_timeout=5)


def test_upgrade_negotiates_the_mqtt_subprotocol_then_carries_mqtt():
    h = ws_harness()
    ws = WSConnection(build_factory(h.broker, h.config.listeners[0]), clock=h.clock)
    ws.send(upgrade_request(subprotocols="chat, mqtt"))
    head, frames = ws.response()
    assert head.startswith("HTTP/1.1 101 ")
    assert "Sec-WebSocket-Protocol: mqtt" in head.split("\r\n")
    accept = base64.b64encode(hashlib.sha1(
        (WS_KEY + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    assert f"Sec-WebSocket-Accept: {accept}" in head.split("\r\n")
    ws.transport.clear()
    ws.send(ws_frame(connect_bytes("ws-client")))
    _, frames = split_response(b"\r\n\r\n" + ws.transport.value())
    assert frames == [(2, encode(Connack(False, 0)))]  # one binary message per packet
    assert peer_address(mqtt_of(ws.protocol).transport) == CLIENT_ADDR


def test_mqttv31_subprotocol_is_accepted():
    h = ws_harness()
    ws = WSConnection(build_factory(h.broker, h.config.listeners[0]), clock=h.clock)
    ws.send(upgrade_request(subprotocols="mqttv3.1"))
    head, _ = ws.response()
    assert head.startswith("HTTP/1.1 101 ") and "Sec-WebSocket-Protocol: mqttv3.1" in head


@pytest.mark.parametrize("request_bytes, status", [
    (upgrade_request(path="/"), "404"),
    (upgrade_request(path="/other"), "404"),
    (upgrade_request(subprotocols=None), "406"),
    (upgrade_request(subprotocols="chat"), "406"),
])
def test_wrong_path_or_subprotocol_is_refused(request_bytes, status):
    h = ws_harness()
    ws = WSConnection(build_factory(h.broker, h.config.listeners[0]), clock=h.clock)
    ws.send(request_bytes)
    head, _ = ws.response()
    assert head.split(" ")[1] == status
    assert h.broker.connections == set()
    assert mqtt_of(ws.protocol) is None


def test_a_configured_path_is_the_only_one():
    h = ws_harness(ws_path="/")
    factory = build_factory(h.broker, h.config.listeners[0])
    ws = WSConnection(factory)
    ws.send(upgrade_request(path="/"))
    assert ws.response()[0].startswith("HTTP/1.1 101 ")
    ws = WSConnection(factory)
    ws.send(upgrade_request(path="/mqtt"))
    assert ws.response()[0].split(" ")[1] == "404"


def test_one_packet_across_frames_and_tcp_chunks_and_packets_sharing_a_frame():
    h = ws_harness()
    ws = WSConnection(build_factory(h.broker, h.config.listeners[0]), clock=h.clock)
    ws.send(upgrade_request())
    ws.transport.clear()
    ws.send(ws_frame(connect_bytes("split")))
    # SUBSCRIBE + PINGREQ in one frame
    sub = Subscribe(1, [SubscriptionRequest("a/b", 0)])
    ws.send(ws_frame(encode(sub) + encode(Pingreq())))
    # one PUBLISH (3000 bytes) in three frames (a fragmented message), fed byte
    # chunks at a time
    publish = encode(Publish("a/b", b"x" * 3000, qos=0))
    parts = [publish[:10], publish[10:2000], publish[2000:]]
    wire = (ws_frame(parts[0], opcode=2, fin=False) + ws_frame(parts[1], opcode=0, fin=False)
            + ws_frame(parts[2], opcode=0, fin=True))
    for i in range(0, len(wire), 777):
        ws.send(wire[i:i + 777])
    _, frames = split_response(b"\r\n\r\n" + ws.transport.value())
    got = mqtt_from_frames(frames)
    assert [type(p).__name__ for p in got] == ["Connack", "Suback", "Pingresp", "Publish"]
    assert got[2] == Pingresp()
    assert got[3].payload == b"x" * 3000


def test_max_packet_size_applies_across_frames():
    h = ws_harness(max_packet_size=512)
    ws = WSConnection(build_factory(h.broker, h.config.listeners[0]), clock=h.clock)
    ws.send(upgrade_request())
    ws.send(ws_frame(encode(Connect(protocol_level=5, client_id="big"))))
    ws.transport.clear()
    publish = encode(Publish("a", b"y" * 600, qos=0), 5)
    ws.send(ws_frame(publish[:300], fin=False))
    ws.send(ws_frame(publish[300:], opcode=0))
    _, frames = split_response(b"\r\n\r\n" + ws.transport.value())
    data = b"".join(p for op, p in frames if op == 2)
    (disconnect,) = Decoder(protocol_level=5, server_side=False).feed(data)
    assert disconnect.reason_code == 0x95
    assert any(op == 8 for op, _ in frames)  # then the WebSocket close frame


def test_a_text_frame_closes_the_connection():
    h = ws_harness()
    ws = WSConnection(build_factory(h.broker, h.config.listeners[0]), clock=h.clock)
    ws.send(upgrade_request())
    ws.transport.clear()
    ws.send(ws_frame(connect_bytes("text"), opcode=1))
    _, frames = split_response(b"\r\n\r\n" + ws.transport.value())
    assert [op for op, _ in frames] == [8]  # close (1003), no CONNACK
    assert frames[0][1][:2] == (1003).to_bytes(2, "big")


def test_the_connection_limit_counts_mqtt_connections_and_answers_503():
    h = ws_harness(max_connections=1)
    factory = build_factory(h.broker, h.config.listeners[0])
    idle = WSConnection(factory)          # TCP only: not an MQTT connection yet
    first = WSConnection(factory)
    first.send(upgrade_request())
    assert first.response()[0].startswith("HTTP/1.1 101 ")
    second = WSConnection(factory)
    second.send(upgrade_request())
    assert second.response()[0].split(" ")[1] == "503"
    assert factory.wrapped_factory.active == 1
    first.protocol.connectionLost(Failure(ConnectionDone()))  # the MQTT connection ends: room again
    assert factory.wrapped_factory.active == 0
    idle.send(upgrade_request())
    assert idle.response()[0].startswith("HTTP/1.1 101 ")


def test_the_upgrade_must_come_within_the_connect_timeout():
    h = ws_harness()
    ws = WSConnection(build_factory(h.broker, h.config.listeners[0]), clock=h.clock)
    ws.send(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n")  # and nothing more
    h.clock.advance(4.9)
    assert not ws.transport.disconnecting
    h.clock.advance(0.2)
    assert ws.transport.disconnecting


def test_after_the_upgrade_the_mqtt_connect_timeout_runs():
    h = ws_harness()
    ws = WSConnection(build_factory(h.broker, h.config.listeners[0]), clock=h.clock)
    h.clock.advance(4)
    ws.send(upgrade_request())
    h.clock.advance(4)  # 8 s after the TCP connection, 4 s after the upgrade
    assert not ws.transport.disconnecting
    h.clock.advance(1.1)  # no CONNECT 5 s after the upgrade: a close frame
    assert ws.response()[1][-1][0] == 8


def test_mqtt_writes_after_the_close_are_dropped():
    h = ws_harness()
    ws = WSConnection(build_factory(h.broker, h.config.listeners[0]), clock=h.clock)
    ws.send(upgrade_request())
    mqtt = mqtt_of(ws.protocol)
    ws.protocol.loseConnection()
    ws.transport.clear()
    ws.protocol.write(encode(Pingresp()))
    assert ws.transport.value() == b""
    ws.protocol.abortConnection()
    assert ws.transport.disconnecting
    ws.protocol.connectionLost(Failure(ConnectionDone()))
    assert not ws.protocol.connected
    assert mqtt not in h.broker.connections


# -- PROXY protocol, TLS and WebSocket together -------------------------------------------------


PROXY_V1 = b"PROXY TCP4 203.0.113.7 127.0.0.1 5000 1883\r\n"


def test_proxy_protocol_gives_the_client_address_on_tcp():
    h = harness({"name": "proxy", "proxy_protocol": True})
    factory = build_factory(h.broker, h.config.listeners[0])
    server = factory.buildProtocol(CLIENT_ADDR)
    transport = StringTransport(peerAddress=CLIENT_ADDR)
    server.makeConnection(transport)
    server.dataReceived(PROXY_V1 + connect_bytes("behind-proxy"))
    h.turn()
    assert packets(transport.value()) == [Connack(False, 0)]
    address = peer_address(mqtt_of(server).transport)
    assert (address.host, address.port) == ("203.0.113.7", 5000)


def test_proxy_protocol_without_a_header_closes():
    h = harness({"name": "proxy", "proxy_protocol": True})
    server = build_factory(h.broker, h.config.listeners[0]).buildProtocol(CLIENT_ADDR)
    transport = StringTransport(peerAddress=CLIENT_ADDR)
    server.makeConnection(transport)
    server.dataReceived(connect_bytes())
    assert transport.disconnecting and transport.value() == b""


def test_connect_timeout_covers_a_missing_proxy_header():
    h = harness({"name": "proxy", "proxy_protocol": True}, connect_timeout=2)
    server = build_factory(h.broker, h.config.listeners[0]).buildProtocol(CLIENT_ADDR)
    transport = StringTransport(peerAddress=CLIENT_ADDR)
    server.makeConnection(transport)
    h.clock.advance(2.1)
    assert transport.disconnecting


def test_chain_and_address_through_proxy_tls_and_websocket(pki):
    h = harness({"name": "wss", "type": "wss", "proxy_protocol": True,
                 **tls_fields(pki, "required")})
    factory = build_factory(h.broker, h.config.listeners[0])
    client = Collector()
    server, _, pump = loopback(h, factory, client, client_tls(pki.client), preamble=PROXY_V1)
    assert client.lost is None
    client.transport.write(upgrade_request())
    pump.flush()
    assert client.data.startswith(b"HTTP/1.1 101 ")
    client.data = b""
    client.transport.write(ws_frame(connect_bytes("wss-proxied")))
    pump.flush()
    _, frames = split_response(b"\r\n\r\n" + client.data)
    assert mqtt_from_frames(frames) == [Connack(False, 0)]
    mqtt = mqtt_of(server)
    assert isinstance(mqtt.transport, MQTTWebSocketProtocol)
    assert peer_certificate_chain(mqtt.transport) == [pki.client.cert, pki.ca.cert]
    address = peer_address(mqtt.transport)
    assert (address.host, address.port) == ("203.0.113.7", 5000)


def test_chain_through_tls_and_proxy(pki):
    h = harness({"name": "tls", "type": "tls", "proxy_protocol": True,
                 **tls_fields(pki, "optional")})
    client = Collector()
    server, _, pump = loopback(h, build_factory(h.broker, h.config.listeners[0]), client,
                               client_tls(pki.client), preamble=PROXY_V1)
    client.transport.write(connect_bytes("tls-proxied"))
    pump.flush()
    assert packets(client.data) == [Connack(False, 0)]
    mqtt = mqtt_of(server)
    assert peer_certificate_chain(mqtt.transport)[0] == pki.client.cert
    assert peer_address(mqtt.transport).host == "203.0.113.7"


def test_chain_certificates_are_cryptography_objects(pki):
    h = harness({"name": "tls", "type": "tls", **tls_fields(pki, "required")})
    client = Collector()
    server, _, pump = loopback(h, build_factory(h.broker, h.config.listeners[0]), client,
                               client_tls(pki.client))
    (leaf, root) = peer_certificate_chain(mqtt_of(server).transport)
    assert leaf.public_bytes(serialization.Encoding.PEM) == pki.client.cert_path.read_bytes()
    assert root.subject == pki.ca.cert.subject


@pytest.mark.parametrize("endpoint, expected", [
    ("tcp:1883", "tcp:1883:backlog=1024"),
    ("tcp:1883:interface=127.0.0.1", "tcp:1883:interface=127.0.0.1:backlog=1024"),
    ("tcp6:1883:interface=\\:\\:", "tcp6:1883:interface=\\:\\::backlog=1024"),
    ("unix:/run/tbmq.sock", "unix:/run/tbmq.sock:backlog=1024"),
    ("tcp:1883:backlog=5", "tcp:1883:backlog=5"),  # its own wins
    ("systemd:domain=INET:index=0", "systemd:domain=INET:index=0"),  # no backlog there
])
def test_endpoint_string_adds_the_backlog(endpoint, expected):
    config = load_config(None, environ={}, overrides={
        "listeners": [{"name": "l", "endpoint": endpoint}]})
    assert listeners.endpoint_string(config.listeners[0]) == expected


def test_listen_uses_the_configured_backlog():
    from twisted.internet import reactor  # noqa: PLC0415

    config = load_config(None, environ={}, overrides={"listeners": [
        {"name": "l", "endpoint": "tcp:0:interface=127.0.0.1", "backlog": 7}]})
    seen = {}

    def listenTCP(port, factory, backlog=50, interface=""):
        seen.update(port=port, backlog=backlog, interface=interface)
        return "listening"

    class Reactor:
        def __getattr__(self, name):
            return getattr(reactor, name)

    fake = Reactor()
    fake.listenTCP = listenTCP
    context = ConnectionContext(clock=reactor, config=config, hooks=None, sessions=None,
                                connections=set(), flusher=None, credentials=None)
    broker = type("B", (), {"config": config, "connection_context": lambda self: context})()
    d = listeners.listen(broker, config.listeners[0], fake)
    results = []
    d.addBoth(results.append)
    assert results == ["listening"]
    assert seen == {"port": 0, "backlog": 7, "interface": "127.0.0.1"}
