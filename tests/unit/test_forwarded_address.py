"""Client addresses behind HTTP proxies (``listeners[].trust_proxy``, TBMQ
2.4): the address a WebSocket upgrade's ``X-Forwarded-For`` / ``X-Real-IP``
headers give, taken only on a listener that trusts its proxy; in memory, on
the WebSocket harness of :mod:`tests.unit.test_listeners`."""

from __future__ import annotations

import pytest
from twisted.internet import task
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.logger import Logger

from tbmq.config import load_config
from tbmq.errors import ConfigError
from tbmq.listeners import build_factory, forwarded_address, peer_address
from tbmq.log import LogThrottle
from tbmq.mqtt import Connack
from tbmq.mqtt.codec import encode
from tests.unit.test_listeners import (
    CLIENT_ADDR, WSConnection, connect_bytes, mqtt_of, split_response, upgrade_request,
    ws_frame, ws_harness,
)


@pytest.mark.parametrize("headers, host", [
    ({"x-forwarded-for": "203.0.113.7"}, "203.0.113.7"),
    ({"x-forwarded-for": "203.0.113.7, 10.0.0.2, 10.0.0.3"}, "203.0.113.7"),
    ({"x-forwarded-for": "203.0.113.7:5123"}, "203.0.113.7"),
    ({"x-forwarded-for": "2001:db8::7"}, "2001:db8::7"),
    ({"x-forwarded-for": "[2001:db8::7]:5123"}, "2001:db8::7"),
    ({"x-real-ip": "198.51.100.4"}, "198.51.100.4"),
    ({"x-forwarded-for": "203.0.113.7", "x-real-ip": "198.51.100.4"}, "203.0.113.7"),
    ({"x-forwarded-for": " ", "x-real-ip": "198.51.100.4"}, "198.51.100.4"),
])
def test_the_forwarded_address(headers, host):
    address = forwarded_address(headers)
    assert address.host == host and address.port is None
    assert isinstance(address, IPv6Address if ":" in host else IPv4Address)


@pytest.mark.parametrize("headers", [
    {}, {"x-forwarded-for": ""}, {"x-forwarded-for": "unknown"},
    {"x-real-ip": "evil.example"}, {"x-forwarded-for": "1.2.3.4.5"},
])
def test_no_usable_forwarded_address(headers):
    clock = task.Clock()
    warnings = LogThrottle(clock, Logger(), "test")
    assert forwarded_address(headers, warnings) is None


def upgrade_with(headers: dict) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return upgrade_request().replace(b"\r\n\r\n", b"\r\n" + extra.encode() + b"\r\n")


@pytest.mark.parametrize("trust, expected", [
    (True, IPv4Address("TCP", "203.0.113.7", None)),
    (False, CLIENT_ADDR),
])
def test_the_headers_count_only_on_a_listener_that_trusts_its_proxy(trust, expected):
    h = ws_harness(trust_proxy=trust)
    ws = WSConnection(build_factory(h.broker, h.config.listeners[0]), clock=h.clock)
    ws.send(upgrade_with({"X-Forwarded-For": "203.0.113.7, 192.0.2.10",
                          "X-Real-IP": "198.51.100.4"}))
    assert ws.response()[0].startswith("HTTP/1.1 101 ")
    ws.transport.clear()
    ws.send(ws_frame(connect_bytes("proxied")))
    _, frames = split_response(b"\r\n\r\n" + ws.transport.value())
    assert frames == [(2, encode(Connack(False, 0)))]
    mqtt = mqtt_of(ws.protocol)
    assert peer_address(mqtt.transport) == expected
    assert mqtt._address() == expected
    assert h.broker.sessions.sessions["proxied"].address == (
        "203.0.113.7" if trust else "192.0.2.10:40000")


def test_a_trusted_listener_without_the_headers_has_the_tcp_peer():
    h = ws_harness(trust_proxy=True)
    ws = WSConnection(build_factory(h.broker, h.config.listeners[0]), clock=h.clock)
    ws.send(upgrade_with({"X-Forwarded-For": "not-an-address"}))
    ws.send(ws_frame(connect_bytes("direct")))
    assert peer_address(mqtt_of(ws.protocol).transport) == CLIENT_ADDR


def test_trust_proxy_is_for_websocket_listeners_only():
    with pytest.raises(ConfigError, match=r"listeners\[0\]\.trust_proxy: only used by types ws "
                                          "and wss, not tcp"):
        load_config(environ={}, overrides={"listeners": [{"name": "t", "trust_proxy": True}]})
    config = load_config(environ={}, overrides={
        "listeners": [{"name": "w", "type": "ws", "trust_proxy": True}]})
    assert config.listeners[0].trust_proxy is True
    assert load_config(environ={}).listeners[0].trust_proxy is False
