"""Client addresses behind HTTP proxies end to end: a real ``twistd -n
tbmq`` with a WebSocket listener that trusts its proxy
(``trust_proxy: true``) and one that does not, paho-mqtt WebSocket clients
sending ``X-Forwarded-For`` / ``X-Real-IP`` as a proxy would, and the
address the REST API's session list shows, the log and the ``http``
authentication provider's ``${peerhost}`` see."""

from __future__ import annotations

import paho.mqtt.client as paho
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from tests.auth_service import AuthService
from tests.integration.helpers import HOST, TIMEOUT, ListenersBroker, free_port, uid, wait_for
from tests.integration.ops import add_admin, api_session, wait_http

ADMIN = ("root", "root-password-1")


@pytest.fixture(scope="module")
def service():
    with AuthService() as s:
        yield s


@pytest.fixture(scope="module")
def broker(tmp_path_factory, service):
    workdir = tmp_path_factory.mktemp("forwarded")
    ports = {"tcp": free_port(), "ws": free_port(), "ws-proxied": free_port()}
    http_port = free_port()
    config = {
        "listeners": [
            {"name": "tcp", "type": "tcp", "endpoint": f"tcp:{ports['tcp']}:interface={HOST}"},
            {"name": "ws", "type": "ws", "endpoint": f"tcp:{ports['ws']}:interface={HOST}"},
            {"name": "ws-proxied", "type": "ws", "trust_proxy": True,
             "endpoint": f"tcp:{ports['ws-proxied']}:interface={HOST}"},
        ],
        "http": {"endpoint": f"tcp:{http_port}:interface={HOST}"},
        "storage": {"backend": "memory"},
        "node": {"log_level": "debug"},  # the "connected from" lines
        "auth": {"providers": ["http"],
                 "http": {"url": service.url, "body": {"id": "${clientId}",
                                                       "peer": "${peerhost}"}}},
    }
    path = workdir / "tbmq.yml"
    path.write_text(yaml.safe_dump(config))
    b = ListenersBroker(workdir, path, ports)
    b.data_dir.mkdir(parents=True, exist_ok=True)
    add_admin(b.data_dir, *ADMIN)
    with b:
        b.api = f"http://{HOST}:{http_port}"
        wait_http(http_port)
        yield b


@pytest.fixture
def connect(broker):
    made = []

    def make(listener: str, headers: dict, version: int = 4) -> str:
        client_id = f"{listener}-{uid()}"
        client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id,
            protocol=paho.MQTTv5 if version == 5 else paho.MQTTv311, transport="websockets",
            reconnect_on_failure=False)
        client.ws_set_options(path="/mqtt", headers=headers)
        codes = []
        client.on_connect = lambda c, u, flags, rc, props: codes.append(int(rc.value))
        made.append(client)
        client.connect(HOST, broker.ports[listener], keepalive=30)
        client.loop_start()
        wait_for(lambda: codes, TIMEOUT, what=f"CONNACK of {client_id}")
        assert codes == [0]
        return client_id

    yield make
    for client in made:
        client.disconnect()
        client.loop_stop()


def session_address(broker, client_id: str) -> str:
    """The address ``GET /api/sessions`` shows for ``client_id``."""
    return api_session(broker.api, client_id, ADMIN)["address"]


def peer_sent(service, client_id: str) -> str:
    (seen,) = [s for s in service.seen if s.json["id"] == client_id]
    return seen.json["peer"]


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_a_trusted_proxy_gives_the_client_address(broker, service, connect, version):
    client_id = connect("ws-proxied", {"X-Forwarded-For": "203.0.113.7, 10.1.2.3"}, version)
    assert session_address(broker, client_id) == "203.0.113.7"
    assert peer_sent(service, client_id) == "203.0.113.7"
    line = broker.wait_log(f"client {client_id} connected from")
    assert line.split("connected from ")[1].startswith("203.0.113.7 ")


def test_x_real_ip_when_there_is_no_x_forwarded_for(broker, service, connect):
    client_id = connect("ws-proxied", {"X-Real-IP": "2001:db8::42"})
    assert session_address(broker, client_id) == "[2001:db8::42]"
    assert peer_sent(service, client_id) == "2001:db8::42"


def test_an_untrusted_listener_ignores_the_headers(broker, service, connect):
    client_id = connect("ws", {"X-Forwarded-For": "203.0.113.7", "X-Real-IP": "198.51.100.4"})
    address = session_address(broker, client_id)
    assert address.startswith("127.0.0.1:")
    assert peer_sent(service, client_id) == "127.0.0.1"


def test_a_trusted_listener_without_headers_has_the_tcp_peer(broker, connect):
    client_id = connect("ws-proxied", {})
    assert session_address(broker, client_id).startswith("127.0.0.1:")
