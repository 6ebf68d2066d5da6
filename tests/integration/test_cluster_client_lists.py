"""Blocked clients and unauthorized clients across a cluster: two ``twistd
-n tbmq`` nodes on one Kafka-protocol broker (Tansu), Redis and PostgreSQL.
An entry added through node A's API refuses a client on node B (CONNACK
0x8A) and disconnects B's connected client (DISCONNECT 0x98); its removal
through B lets the client in on A; an attempt refused on node B is listed
through node A's API."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.cluster import ClusterNode, Services
from tests.integration.conftest import _LIVE, _finish
from tests.integration.helpers import HOST, REPO_ROOT, PahoClient, free_port, uid, wait_for
from tests.integration.ops import Http, wait_http
from tests.postgres import new_database

pytestmark = pytest.mark.timeout(600)

ADMIN, ADMIN_PASSWORD = "root", "root-password-1"
DEVICE_USER, DEVICE_PASSWORD = "dev-user", "dev-secret"
BANNED, ADMINISTRATIVE_ACTION, BAD_USER_NAME_OR_PASSWORD = 0x8A, 0x98, 0x86


def _cli(workdir, services: Services, *args: str, stdin: str = "") -> None:
    config = workdir / "cli.yml"
    config.write_text(f"auth:\n  credentials: postgres\npostgres:\n  dsn: \"{services.dsn}\"\n")
    subprocess.run([sys.executable, "-m", "tbmq.cli", *args, "--config", str(config)],
                   check=True, cwd=REPO_ROOT, capture_output=True, input=stdin, text=True)


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap, redis_url, postgres_dsn, tmp_path_factory, reactor_thread):
    services = Services(kafka_bootstrap, redis_url, new_database(postgres_dsn),
                        f"c{uid()[:8]}")
    workdir = tmp_path_factory.mktemp("cluster-lists")
    # the admin users and credentials are in PostgreSQL: one store for both nodes
    _cli(workdir, services, "admin", "add", ADMIN, "--password-stdin", "--rounds", "4",
         stdin=ADMIN_PASSWORD + "\n")
    _cli(workdir, services, "credentials", "add", "--type", "basic", "--name", "dev",
         "--username", DEVICE_USER, "--password", DEVICE_PASSWORD, "--rounds", "4")
    nodes = {}
    for name in ("a", "b"):
        port = free_port()
        node = ClusterNode(workdir, services, f"node-{name}", env={
            "TBMQ_HTTP__ENDPOINT": f"tcp:{port}:interface={HOST}"})
        _LIVE.append(node)
        nodes[name] = node.start()
        wait_http(port)
        http = Http(reactor_thread, f"http://{HOST}:{port}")
        http.login(ADMIN, ADMIN_PASSWORD)
        nodes[name + "_api"] = http
    yield nodes
    for key in ("a", "b"):
        _finish(nodes[key])


def _connack(node: ClusterNode, client_id: str, username=None, password=None) -> int:
    c = PahoClient(node.port, 5, client_id=client_id)
    if username is not None:
        c.client.username_pw_set(username, password)
    try:
        c.connect_and_wait(expect_rc=None, timeout=30)
        return c.connack_code
    finally:
        c.close()


def test_an_entry_added_on_a_refuses_and_disconnects_on_b(cluster):
    a, b, api_a, api_b = cluster["a"], cluster["b"], cluster["a_api"], cluster["b_api"]
    tag = uid()
    connected = PahoClient(b.port, 5, client_id=f"held-{tag}").connect_and_wait(timeout=30)
    answer = api_a.request("POST", "/api/blocked-clients", json_body={
        "type": "regex", "value": f"(held|new)-{tag}", "regex_target": "client_id",
        "expires_at": None})
    assert answer.status == 201, answer
    entry = answer.json
    connected.wait_disconnected(timeout=30)
    assert [code for code, _ in connected.disconnects] == [ADMINISTRATIVE_ACTION]
    assert _connack(b, f"new-{tag}") == BANNED
    wait_for(lambda: api_b.get("/api/blocked-clients").json["items"] == [entry], timeout=30,
             what="node B's list")
    assert _connack(b, f"other-{tag}") == 0
    removed = api_b.request("DELETE", f"/api/blocked-clients/{entry['id']}")
    assert removed.status == 200, removed
    wait_for(lambda: _connack(a, f"new-{tag}") == 0, timeout=30, interval=0.5,
             what="node A to let the client in again")
    assert api_a.get("/api/blocked-clients").json == {"items": [], "total": 0}
    connected.close()


def test_an_attempt_refused_on_b_is_listed_through_a(cluster):
    b, api_a = cluster["b"], cluster["a_api"]
    client_id = f"intruder-{uid()}"
    assert _connack(b, client_id, DEVICE_USER, "wrong") == BAD_USER_NAME_OR_PASSWORD

    def listed():
        items = api_a.get("/api/unauthorized-clients").json["items"]
        return [a for a in items if a["client_id"] == client_id]

    attempts = wait_for(listed, timeout=30, interval=0.3, what="the attempt on node A")
    assert len(attempts) == 1
    assert attempts[0]["node"] == "node-b"
    assert attempts[0]["username"] == DEVICE_USER
    assert attempts[0]["password_provided"] is True
    assert attempts[0]["reason"].startswith("BAD_USER_NAME_OR_PASSWORD (0x86)")
