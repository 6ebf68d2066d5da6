"""The ``http`` authentication provider end to end: a real ``twistd -n
tbmq`` whose ``auth.providers`` are ``[http, basic]``, an HTTP
authentication service started by the test (:mod:`tests.auth_service`,
answering by the user name it receives), paho-mqtt 3.1.1 and 5.0 clients,
raw clients for the exact codes on the wire, and the REST API for what the
node made of each client."""

from __future__ import annotations

import time

import pytest
import yaml

from tbmq.mqtt import Connack, Puback, Publish, ReasonCode, Suback, Subscribe, SubscriptionRequest
from tests.auth_service import AuthService
from tests.integration.helpers import HOST, ListenersBroker, PahoClient, RawClient, free_port, uid
from tests.integration.ops import add_admin, api_session, tbmq_cli, wait_http

#: auth.http.timeout of the broker under test, seconds
TIMEOUT_S = 1.0
ADMIN = ("root", "root-password-1")
BODY = {"clientid": "${clientId}", "username": "${username}", "password": "${password}",
        "peer": "${peerhost}", "cn": "${certificateCn}"}


def answer(seen):
    """The service's answer, by the user name it was sent."""
    user = seen.json["username"]
    return {
        "allowed": (200, {"result": "allow"}, 0),
        "denied": (200, {"result": "deny"}, 0),
        "ignored": (200, {"result": "ignore"}, 0),
        "forbidden": (403, b"", 0),
        "broken": (500, b"oops", 0),
        "dev": (503, b"", 0),  # basic credentials: the basic provider decides
        "garbage": (200, b"<html>", 0),
        "slow": (200, {"result": "allow"}, TIMEOUT_S + 2),
        "app": (200, {"result": "allow", "client_type": "APPLICATION"}, 0),
        "ruled": (200, {"result": "allow", "pub": ["dev/${clientId}/.*"],
                        "sub": ["cmd/.*"]}, 0),
    }.get(user, (200, {"result": "deny"}, 0))


@pytest.fixture(scope="module")
def service():
    with AuthService() as s:
        s.answer = answer
        yield s


@pytest.fixture(scope="module")
def broker(tmp_path_factory, service):
    workdir = tmp_path_factory.mktemp("auth-http")
    ports = {"tcp": free_port()}
    http_port = free_port()
    config = {
        "listeners": [{"name": "tcp", "type": "tcp",
                       "endpoint": f"tcp:{ports['tcp']}:interface={HOST}"}],
        "http": {"endpoint": f"tcp:{http_port}:interface={HOST}"},
        "storage": {"backend": "memory"},
        "auth": {"allow_anonymous": True, "providers": ["http", "basic"],
                 "http": {"url": service.url, "method": "POST", "body": BODY,
                          "headers": {"X-Api-Key": "key-1"}, "timeout": TIMEOUT_S,
                          "cache_ttl": 60}},
    }
    path = workdir / "tbmq.yml"
    path.write_text(yaml.safe_dump(config))
    b = ListenersBroker(workdir, path, ports)
    b.data_dir.mkdir(parents=True, exist_ok=True)
    add_admin(b.data_dir, *ADMIN)
    tbmq_cli(b.data_dir, "credentials", "add", "--type", "basic", "--name", "dev",
             "--username", "dev", "--password", "right", "--rounds", "4")
    with b:
        b.api = f"http://{HOST}:{http_port}"
        wait_http(http_port)
        yield b


@pytest.fixture
def clients():
    made: list[PahoClient] = []
    yield made
    for c in made:
        c.close()


def paho(broker, clients, version, username, password="pw", client_id=None, expect_rc=0,
         **connect):
    c = PahoClient(broker.port, version, client_id)
    c.client.username_pw_set(username, password)
    clients.append(c)
    return c.connect_and_wait(expect_rc=expect_rc, **connect)


def requests_for(service, client_id):
    return [s for s in service.seen if s.json["clientid"] == client_id]


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_allow_and_deny(broker, service, clients, version):
    paho(broker, clients, version, "allowed")
    paho(broker, clients, version, "denied", expect_rc=ReasonCode.NOT_AUTHORIZED)
    paho(broker, clients, version, "forbidden", expect_rc=ReasonCode.NOT_AUTHORIZED)
    paho(broker, clients, version, "stranger", expect_rc=ReasonCode.NOT_AUTHORIZED)


def test_v311_return_code_on_the_wire(broker):
    for user in ("denied", "forbidden"):
        raw = RawClient(broker.port, level=4)
        try:
            assert raw.connect(username=user, password=b"pw") == Connack(False, 0x05)
        finally:
            raw.close()


def test_the_service_receives_the_body_template_and_headers(broker, service):
    cid = f"tpl-{uid()}"
    raw = RawClient(broker.port, level=5)
    try:
        assert raw.connect(client_id=cid, username="allowed",
                           password=b'p"a\\ss').reason_code == ReasonCode.SUCCESS
    finally:
        raw.close()
    (seen,) = requests_for(service, cid)
    assert seen.method == "POST" and seen.path == "/auth"
    assert seen.headers["x-api-key"] == "key-1"
    assert seen.headers["content-type"] == "application/json"
    assert seen.json == {"clientid": cid, "username": "allowed", "password": 'p"a\\ss',
                         "peer": "127.0.0.1", "cn": ""}
    assert 'p"a' not in broker.log()  # passwords are never logged


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_5xx_timeout_and_garbage_let_the_next_provider_decide(broker, service, clients, version):
    # the service fails for "dev": the basic provider checks the password
    paho(broker, clients, version, "dev", "right")
    paho(broker, clients, version, "dev", "wrong", expect_rc=ReasonCode.BAD_USER_NAME_OR_PASSWORD)
    # nobody else decides: refused, although anonymous access is on
    for user in ("broken", "garbage"):
        paho(broker, clients, version, user, expect_rc=ReasonCode.NOT_AUTHORIZED)
    started = time.monotonic()
    paho(broker, clients, version, "slow", expect_rc=ReasonCode.NOT_AUTHORIZED)
    assert TIMEOUT_S - 0.1 < time.monotonic() - started < TIMEOUT_S + 1.5
    # an explicit "ignore" is a provider passing: anonymous access applies
    paho(broker, clients, version, "ignored")
    log = broker.log()
    assert "HTTP status 500" in log and "the body is not JSON" in log
    assert f"within {TIMEOUT_S:g} s (auth.http.timeout)" in log


def test_client_type_application_from_the_answer(broker, clients):
    cid = f"app-{uid()}"
    paho(broker, clients, 5, "app", client_id=cid, clean_start=False, session_expiry=600)
    assert api_session(broker.api, cid, ADMIN)["client_type"] == "APPLICATION"
    cid = f"dev-{uid()}"
    paho(broker, clients, 5, "allowed", client_id=cid, clean_start=False, session_expiry=600)
    assert api_session(broker.api, cid, ADMIN)["client_type"] == "DEVICE"


def test_publish_and_subscribe_rules_from_the_answer(broker, clients):
    cid = f"r{uid()}"
    raw = RawClient(broker.port, level=5)
    watcher = paho(broker, clients, 5, "allowed")
    assert watcher.subscribe("dev/#", 1) == [1]
    try:
        assert raw.connect(client_id=cid, username="ruled",
                           password=b"pw").reason_code == ReasonCode.SUCCESS
        raw.send(Subscribe(1, [SubscriptionRequest("cmd/x", 1),
                               SubscriptionRequest("secret/#", 1)]))
        assert raw.expect() == Suback(1, [1, ReasonCode.NOT_AUTHORIZED])
        raw.send(Publish(f"dev/{cid}/t", b"allowed", qos=1, packet_id=2))
        assert raw.expect() == Puback(2)
        raw.send(Publish("dev/other/t", b"denied", qos=1, packet_id=3))
        assert raw.expect() == Puback(3, ReasonCode.NOT_AUTHORIZED)
    finally:
        raw.close()
    assert watcher.get().payload == b"allowed"
    time.sleep(0.3)
    watcher.assert_empty()


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_answers_are_cached_for_the_same_client(broker, service, clients, version):
    cid = f"cached-{uid()}"
    for _ in range(2):
        c = paho(broker, clients, version, "allowed", client_id=cid)
        c.disconnect()
    assert len(requests_for(service, cid)) == 1
    # another password is another question
    paho(broker, clients, version, "allowed", password="other", client_id=cid)
    assert len(requests_for(service, cid)) == 2


def test_an_https_service_verified_with_tls_ca(tmp_path, pki, clients):
    server = pki.ca.issue("auth-server", "localhost", server=True, dns_names=("localhost",))
    with AuthService(tls=(str(server.chain_path), str(server.key_path))) as https:
        https.answer = answer
        port = free_port()
        config = {
            "listeners": [{"name": "tcp", "type": "tcp",
                           "endpoint": f"tcp:{port}:interface={HOST}"}],
            "storage": {"backend": "memory"},
            "auth": {"providers": ["http"],
                     "http": {"url": https.url, "tls_ca": str(pki.ca.cert_path)}},
        }
        path = tmp_path / "tbmq.yml"
        path.write_text(yaml.safe_dump(config))
        with ListenersBroker(tmp_path / "ca", path, {"tcp": port}) as b:
            paho(b, clients, 5, "allowed")
            paho(b, clients, 5, "denied", expect_rc=ReasonCode.NOT_AUTHORIZED)
        assert [s.json["username"] for s in https.seen] == ["allowed", "denied"]
        # without tls_ca the system's CA certificates do not know the test CA
        del config["auth"]["http"]["tls_ca"]
        path.write_text(yaml.safe_dump(config))
        with ListenersBroker(tmp_path / "system", path, {"tcp": port}) as b:
            paho(b, clients, 5, "allowed", expect_rc=ReasonCode.NOT_AUTHORIZED)
            assert "certificate verify failed" in b.wait_log("HTTP authentication of")
        assert len(https.seen) == 2
