"""Listeners end to end: one ``twistd -n tbmq`` with TCP, TLS, WebSocket,
secure WebSocket and PROXY-protocol listeners from a YAML config, real
paho-mqtt clients (3.1.1 and 5.0) and raw sockets for the clients that
misbehave.  Certificates come from :mod:`tests.certs`."""

from __future__ import annotations

import ipaddress
import queue
import socket
import ssl
import threading
import time

import paho.mqtt.client as paho
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from tbmq.mqtt import Connack, Connect
from tbmq.mqtt.codec import Decoder, encode
from tests.integration.helpers import HOST, TIMEOUT, ListenersBroker, RawClient, free_port, uid

#: mqtt.connect_timeout of the broker under test, seconds
CONNECT_TIMEOUT = 1.0

#: name → (type, extra listener settings); the ``*_fields`` are filled in
#: with the certificate paths
LISTENERS = {
    "tcp": ("tcp", {}),
    "tls": ("tls", {"tls_client_auth": "optional"}),
    "ws": ("ws", {}),
    "wss": ("wss", {}),
    "tls-required": ("tls", {"tls_client_auth": "required"}),
    "proxy": ("tcp", {"proxy_protocol": True}),
    "limited": ("tcp", {"max_connections": 2}),
    "small": ("ws", {"max_packet_size": 512}),
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory, pki):
    workdir = tmp_path_factory.mktemp("listeners")
    ports = {name: free_port() for name in LISTENERS}
    listeners = []
    for name, (kind, extra) in LISTENERS.items():
        listener = {"name": name, "type": kind,
                    "endpoint": f"tcp:{ports[name]}:interface={HOST}", **extra}
        if kind in ("tls", "wss"):
            listener.update(tls_cert=str(pki.server.chain_path), tls_key=str(pki.server.key_path))
            if listener.get("tls_client_auth", "none") != "none":
                listener["tls_ca"] = str(pki.ca.cert_path)
        listeners.append(listener)
    config = {
        "listeners": listeners,
        "mqtt": {"connect_timeout": CONNECT_TIMEOUT},
        "storage": {"backend": "memory"},
        "node": {"log_level": "debug"},  # the "connected from" lines
    }
    path = workdir / "tbmq.yml"
    path.write_text(yaml.safe_dump(config))
    with ListenersBroker(workdir, path, ports) as b:
        yield b


@pytest.fixture(autouse=True)
def _log_on_failure(request, broker):
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n===== broker log =====\n{broker.log()[-20000:]}")


# -- a paho client on any listener ------------------------------------------------------


class Client:
    """A paho-mqtt client on one listener (TCP, TLS, WebSocket, secure
    WebSocket) that queues what it receives.

    :param cert: the :class:`tests.certs.Issued` client certificate to
        present on TLS, or None.
    """

    def __init__(self, broker, pki, listener: str, version: int = 4, cert=None) -> None:
        kind = LISTENERS[listener][0]
        self.port = broker.ports[listener]
        self.client_id = f"{listener}-{uid()}"
        self.client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2, client_id=self.client_id,
            protocol=paho.MQTTv5 if version == 5 else paho.MQTTv311,
            transport="websockets" if kind in ("ws", "wss") else "tcp",
            reconnect_on_failure=False)
        if kind in ("tls", "wss"):
            self.client.tls_set(
                ca_certs=str(pki.ca.cert_path),
                certfile=str(cert.chain_path) if cert else None,
                keyfile=str(cert.key_path) if cert else None)
        self.messages: "queue.Queue" = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connack_code: int | None = None
        self.disconnect_codes: list[int] = []
        self.subacks: "queue.Queue" = queue.Queue()
        c = self.client
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = lambda client, userdata, msg: self.messages.put(msg)
        c.on_subscribe = lambda client, userdata, mid, codes, props: self.subacks.put(mid)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.connack_code = int(getattr(reason_code, "value", reason_code))
        self.connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.disconnect_codes.append(int(getattr(reason_code, "value", reason_code)))
        self.disconnected.set()

    def connect(self) -> "Client":
        self.client.connect(HOST, self.port, keepalive=30)
        self.client.loop_start()
        assert self.connected.wait(TIMEOUT), f"{self.client_id}: no CONNACK"
        assert self.connack_code == 0, f"{self.client_id}: CONNACK {self.connack_code:#x}"
        return self

    def subscribe(self, topic: str, qos: int = 1) -> None:
        rc, mid = self.client.subscribe(topic, qos)
        assert rc == paho.MQTT_ERR_SUCCESS
        assert self.subacks.get(timeout=TIMEOUT) == mid

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        info = self.client.publish(topic, payload, qos)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"{self.client_id}: {topic} not acknowledged"

    def get(self, timeout: float = TIMEOUT):
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no message in {timeout} s") from None

    def close(self) -> None:
        try:
            self.client.disconnect()
        finally:
            self.client.loop_stop()


@pytest.fixture
def clients(broker, pki):
    made: list[Client] = []

    def make(listener: str, version: int = 4, cert=None) -> Client:
        client = Client(broker, pki, listener, version, cert)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


# -- publish on one listener, receive on another ------------------------------------------


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
@pytest.mark.parametrize("publisher, subscriber", [
    ("tcp", "wss"), ("tls", "ws"), ("ws", "tls"), ("wss", "tcp"), ("wss", "ws"),
])
def test_publish_on_one_listener_receive_on_another(clients, publisher, subscriber, version):
    topic = f"listeners/{uid()}"
    sub = clients(subscriber, version).connect()
    sub.subscribe(topic, qos=1)
    pub = clients(publisher, version).connect()
    # larger than one TLS record and than a paho socket read
    payloads = [b"small", bytes(range(256)) * 300]
    for payload in payloads:
        pub.publish(topic, payload, qos=1)
    got = [sub.get(), sub.get()]
    assert [m.payload for m in got] == payloads
    assert all(m.topic == topic for m in got)


def test_a_client_certificate_of_the_ca_is_accepted_with_client_auth_required(clients, pki):
    topic = f"certs/{uid()}"
    sub = clients("ws").connect()
    sub.subscribe(topic)
    pub = clients("tls-required", 5, cert=pki.client).connect()
    pub.publish(topic, b"with a certificate")
    assert sub.get().payload == b"with a certificate"


def tls_socket(broker, pki, listener: str, cert=None) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    if cert is not None:
        context.load_cert_chain(str(cert.chain_path), str(cert.key_path))
    raw = socket.create_connection((HOST, broker.ports[listener]), timeout=TIMEOUT)
    return context.wrap_socket(raw, server_hostname="localhost")


def refused_after_handshake(sock: ssl.SSLSocket) -> bool:
    """With TLS 1.3 the client's handshake ends before the server checks its
    certificate: the refusal is an alert (or a close) on the first read."""
    try:
        sock.sendall(encode(Connect(protocol_level=4, client_id=f"tls-{uid()}")))
        data = sock.recv(100)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return True
    return data == b""


@pytest.mark.parametrize("listener", ["tls-required", "tls"])
def test_a_client_certificate_of_another_ca_fails_the_handshake(broker, pki, listener):
    try:
        sock = tls_socket(broker, pki, listener, cert=pki.untrusted_client)
    except (ssl.SSLError, ConnectionResetError):
        return  # refused during the handshake (TLS 1.2)
    with sock:
        assert refused_after_handshake(sock)


def test_no_client_certificate_is_refused_only_where_required(broker, pki):
    with tls_socket(broker, pki, "tls") as sock:  # optional
        sock.sendall(encode(Connect(protocol_level=4, client_id=f"tls-{uid()}")))
        assert Decoder(server_side=False).feed(sock.recv(100)) == [Connack(False, 0)]
    try:
        sock = tls_socket(broker, pki, "tls-required")
    except (ssl.SSLError, ConnectionResetError):
        return
    with sock:
        assert refused_after_handshake(sock)


# -- clients that never get to MQTT ---------------------------------------------------------


def closed_after(port: int, send: bytes = b"") -> float:
    """Connect, send ``send``, then wait for the broker to close; the
    seconds from the connection to the close."""
    sock = socket.create_connection((HOST, port), timeout=TIMEOUT)
    started = time.monotonic()
    try:
        if send:
            sock.sendall(send)
        while True:
            try:
                if not sock.recv(4096):
                    break
            except ConnectionResetError:
                break
            except socket.timeout:
                raise AssertionError(f"port {port}: still open after {TIMEOUT} s") from None
    finally:
        sock.close()
    return time.monotonic() - started


CLIENT_HELLO_START = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 20


@pytest.mark.parametrize("listener, send", [
    ("tls", b""),
    ("tls", CLIENT_HELLO_START),
    ("wss", CLIENT_HELLO_START),
    ("ws", b""),
    ("ws", b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\n"),
    ("proxy", b""),
    ("proxy", b"PROXY TCP4 203.0.113.7 "),
], ids=["tls-silent", "tls-partial-hello", "wss-partial-hello", "ws-silent",
        "ws-partial-upgrade", "proxy-silent", "proxy-partial-header"])
def test_an_unfinished_handshake_is_dropped_by_the_connect_timeout(broker, listener, send):
    elapsed = closed_after(broker.ports[listener], send)
    assert CONNECT_TIMEOUT - 0.1 <= elapsed < CONNECT_TIMEOUT + 3, elapsed


def test_after_the_websocket_upgrade_the_connect_timeout_runs_again(broker):
    sock = socket.create_connection((HOST, broker.ports["ws"]), timeout=TIMEOUT)
    with sock:
        sock.sendall(b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n")
        upgraded = time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(4096)
        assert data.startswith(b"HTTP/1.1 101 ")
        while True:  # no CONNECT: a close frame, then the close
            try:
                if not sock.recv(4096):
                    break
            except ConnectionResetError:
                break
        assert CONNECT_TIMEOUT - 0.1 <= time.monotonic() - upgraded < CONNECT_TIMEOUT + 3


# -- PROXY protocol ------------------------------------------------------------------------------


def test_proxy_protocol_gives_the_broker_the_client_address(broker):
    client_id = f"proxied-{uid()}"
    raw = RawClient(broker.ports["proxy"], level=4)
    try:
        raw.send(b"PROXY TCP4 203.0.113.7 127.0.0.1 5000 1883\r\n")
        assert raw.connect(client_id) == Connack(False, 0)
        line = broker.wait_log(f"client {client_id} connected from")
        assert "203.0.113.7" in line and "127.0.0.1" not in line.split("connected from")[1]
    finally:
        raw.close()


def test_proxy_protocol_v2_header(broker):
    client_id = f"proxied2-{uid()}"
    body = (ipaddress.ip_address("198.51.100.9").packed + ipaddress.ip_address("127.0.0.1").packed
            + (6000).to_bytes(2, "big") + (1883).to_bytes(2, "big"))
    header = (b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x21, 0x11]) + len(body).to_bytes(2, "big")
              + body)
    raw = RawClient(broker.ports["proxy"], level=4)
    try:
        raw.send(header)
        assert raw.connect(client_id) == Connack(False, 0)
        assert "198.51.100.9" in broker.wait_log(f"client {client_id} connected from")
    finally:
        raw.close()


def test_proxy_listener_drops_a_connection_without_the_header(broker):
    raw = RawClient(broker.ports["proxy"], level=4)
    try:
        raw.send(encode(Connect(protocol_level=4, client_id=f"noproxy-{uid()}")))
        with pytest.raises(AssertionError, match="closed by the broker"):
            raw.expect(timeout=TIMEOUT)
    finally:
        raw.close()


# -- per-listener limits --------------------------------------------------------------------------


def test_max_connections_refuses_the_third_connection_only_there(broker, clients):
    first = RawClient(broker.ports["limited"], level=4)
    second = RawClient(broker.ports["limited"], level=4)
    third = None
    try:
        assert first.connect(f"lim-{uid()}") == Connack(False, 0)
        assert second.connect(f"lim-{uid()}") == Connack(False, 0)
        third = RawClient(broker.ports["limited"], level=4)
        third.send(encode(Connect(protocol_level=4, client_id=f"lim-{uid()}")))
        with pytest.raises(AssertionError, match="closed by the broker"):
            third.expect(timeout=TIMEOUT)
        # the first two still work, and other listeners are not limited by it
        first.send(b"\xc0\x00")  # PINGREQ
        assert type(first.expect()).__name__ == "Pingresp"
        clients("tcp").connect()
        clients("ws").connect()
        # once one leaves, there is room again
        second.close()
        deadline = time.monotonic() + TIMEOUT
        while True:
            fourth = RawClient(broker.ports["limited"], level=4)
            fourth.send(encode(Connect(protocol_level=4, client_id=f"lim-{uid()}")))
            try:
                assert fourth.expect(timeout=TIMEOUT) == Connack(False, 0)
                break
            except AssertionError:  # the broker may not have seen the close yet
                if time.monotonic() > deadline:
                    raise
            finally:
                fourth.close()
    finally:
        for raw in (first, second, third):
            if raw is not None:
                raw.close()


def test_max_packet_size_is_per_listener(clients):
    topic = f"size/{uid()}"
    sub = clients("tcp", 5).connect()
    sub.subscribe(topic, qos=0)
    big = b"z" * 1000
    tcp = clients("tcp", 5).connect()
    tcp.publish(topic, big, qos=1)
    assert sub.get().payload == big
    small = clients("small", 5).connect()
    small.client.publish(topic, big, qos=0)
    assert small.disconnected.wait(TIMEOUT)
    assert small.disconnect_codes[0] == 0x95  # Packet too large
    small_ok = clients("small", 5).connect()
    small_ok.publish(topic, b"fits", qos=1)
    assert sub.get().payload == b"fits"
