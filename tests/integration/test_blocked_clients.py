"""Blocked clients and the unauthorized-client log on a real ``twistd -n
tbmq`` node (the embedded default), with paho (MQTT 5 and 3.1.1) and raw
sockets: each type of entry refuses its clients (CONNACK 0x8A Banned; v3
return code 5 Not authorized) and no other, a connected client is
disconnected (v5 DISCONNECT 0x98 Administrative action), an entry expires,
the list survives a restart; the API's refusals; ``tbmq blocked``; refused
logins listed with what they gave, bounded by
``mqtt.unauthorized_clients.max_entries``.

One node for the module (restarted once, by the last test of the blocked
list)."""

from __future__ import annotations

import time

import pytest

from tbmq.mqtt import Connack
from tests.integration.conftest import _finish
from tests.integration.helpers import PahoClient, RawClient, uid, wait_for
from tests.integration.ops import USERS, Http, start_ops_broker, tbmq_cli, wait_http

BANNED, NOT_AUTHORIZED_V3, ADMINISTRATIVE_ACTION = 0x8A, 5, 0x98
BAD_USER_NAME_OR_PASSWORD = 0x86
DEVICE_USER, DEVICE_PASSWORD = "dev-user", "dev-secret"
#: mqtt.unauthorized_clients.max_entries of the module's node
MAX_UNAUTHORIZED = 6


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("blocked")
    tbmq_cli(workdir / "data", "credentials", "add", "--type", "basic", "--name", "dev",
             "--username", DEVICE_USER, "--password", DEVICE_PASSWORD, "--rounds", "4")
    broker = start_ops_broker(workdir, USERS, env={
        "TBMQ_MQTT__UNAUTHORIZED_CLIENTS__MAX_ENTRIES": str(MAX_UNAUTHORIZED)})
    yield broker
    _finish(broker)


@pytest.fixture(scope="module")
def admin(node, reactor_thread) -> Http:
    http = Http(reactor_thread, node.url)
    http.login("root", USERS["root"][0])
    return http


def block(admin: Http, **body) -> dict:
    body.setdefault("regex_target", None)
    body.setdefault("expires_at", None)
    answer = admin.request("POST", "/api/blocked-clients", json_body=body)
    assert answer.status == 201, answer
    return answer.json


def unblock(admin: Http, entry_id: str) -> None:
    answer = admin.request("DELETE", f"/api/blocked-clients/{entry_id}")
    assert answer.status == 200, answer
    assert answer.json == {"status": "removed", "target": entry_id}


def connack_v5(node, client_id: str, username: str | None = None,
               password: str | None = None) -> int:
    c = PahoClient(node.port, 5, client_id=client_id)
    if username is not None:
        c.client.username_pw_set(username, password)
    try:
        c.connect_and_wait(expect_rc=None)
        return c.connack_code
    finally:
        c.close()


def connack_v3(node, client_id: str, username: str | None = None,
               password: str | None = None) -> int:
    """The return code of a 3.1.1 CONNACK, read off the wire."""
    raw = RawClient(node.port, level=4)
    try:
        kwargs = {}
        if username is not None:
            kwargs["username"] = username
        if password is not None:
            kwargs["password"] = password.encode()
        answer = raw.connect(client_id=client_id, **kwargs)
        assert isinstance(answer, Connack), answer
        return answer.reason_code
    finally:
        raw.close()


# -- the blocked clients ---------------------------------------------------------------


def test_each_type_refuses_its_clients_and_no_other(node, admin):
    tag = uid()
    cases = [
        ({"type": "client_id", "value": f"evil-{tag}"}, {"client_id": f"evil-{tag}"},
         {"client_id": f"good-{tag}"}),
        ({"type": "username", "value": f"mallory-{tag}"},
         {"client_id": f"u1-{tag}", "username": f"mallory-{tag}"},
         {"client_id": f"u2-{tag}", "username": f"alice-{tag}"}),
        ({"type": "regex", "value": f"bot-{tag}-[0-9]+", "regex_target": "client_id"},
         {"client_id": f"bot-{tag}-42"}, {"client_id": f"bot-{tag}-x"}),
        ({"type": "regex", "value": f"spam-{tag}.*", "regex_target": "username"},
         {"client_id": f"r1-{tag}", "username": f"spam-{tag}-1"},
         {"client_id": f"r2-{tag}", "username": f"ham-{tag}"}),
        # the node's tests all come from 127.0.0.1: the entry refuses everyone
        ({"type": "ip_address", "value": "127.0.0.1"}, {"client_id": f"ip-{tag}"}, None),
        ({"type": "regex", "value": r"127\.0\.0\.[0-9]+", "regex_target": "ip_address"},
         {"client_id": f"ipr-{tag}"}, None),
    ]
    for body, refused, accepted in cases:
        entry = block(admin, **body)
        assert entry["type"] == body["type"] and entry["value"] == body["value"]
        assert entry["regex_target"] == body.get("regex_target")
        listed = admin.get("/api/blocked-clients").json
        assert entry in listed["items"]
        assert connack_v5(node, **refused) == BANNED, body
        assert connack_v3(node, **refused) == NOT_AUTHORIZED_V3, body
        if accepted is not None:
            assert connack_v5(node, **accepted) == 0, body
            assert connack_v3(node, **accepted) == 0, body
        unblock(admin, entry["id"])
        assert connack_v5(node, **refused) == 0, body
    assert admin.get("/api/blocked-clients").json == {"items": [], "total": 0}
    assert node.log().count("refused: blocked client") >= 12


def test_a_connected_client_matching_a_new_entry_is_disconnected(node, admin):
    tag = uid()
    v5 = PahoClient(node.port, 5, client_id=f"victim5-{tag}").connect_and_wait()
    v3 = PahoClient(node.port, 4, client_id=f"victim3-{tag}").connect_and_wait()
    bystander = PahoClient(node.port, 5, client_id=f"bystander-{tag}").connect_and_wait()
    entry = block(admin, type="regex", value=f"victim[35]-{tag}", regex_target="client_id")
    v5.wait_disconnected()
    v3.wait_disconnected()
    assert [code for code, _ in v5.disconnects] == [ADMINISTRATIVE_ACTION]
    assert v5.disconnects[0][1].ReasonString == "blocked"
    assert len(v3.disconnects) == 1
    time.sleep(0.3)
    assert bystander.disconnects == []
    assert connack_v5(node, f"victim5-{tag}") == BANNED
    unblock(admin, entry["id"])
    for c in (v5, v3, bystander):
        c.close()


def test_an_entry_expires_everywhere_it_was_kept(node, admin):
    client_id = f"brief-{uid()}"
    entry = block(admin, type="client_id", value=client_id, expires_at=time.time() + 2)
    assert entry["expires_at"] is not None
    assert connack_v5(node, client_id) == BANNED
    wait_for(lambda: connack_v5(node, client_id) == 0, timeout=10, interval=0.3,
             what="the entry to expire")
    assert admin.get("/api/blocked-clients").json["total"] == 0
    wait_for(lambda: f"blocked client entry {entry['id']}" in node.log(), timeout=5,
             what="the expiry's log line")


def test_the_api_refuses_entries_it_cannot_keep(node, admin):
    post = lambda body: admin.request("POST", "/api/blocked-clients", json_body=body)  # noqa: E731
    for body, words in [
        ({"type": "regex", "value": "(unclosed"}, "not a regular expression"),
        ({"type": "hostname", "value": "x"}, "type"),
        ({"type": "ip_address", "value": "999.1.1.1"}, "not an IP address"),
        ({"type": "client_id", "value": "x", "regex_target": "username"}, "only for type regex"),
        ({"type": "regex", "value": "x", "regex_target": "password"}, "regex_target"),
        ({"type": "client_id", "value": "x", "expires_at": time.time() - 10}, "already past"),
        ({"type": "client_id", "value": ""}, "value"),
    ]:
        answer = post(body)
        assert answer.status == 400, (body, answer)
        assert words in answer.json["error"]["message"], (body, answer)
    assert post({"type": "client_id", "value": 5}).status == 422
    assert post({"type": "client_id"}).status == 422
    assert admin.request("DELETE", "/api/blocked-clients/0123456789abcdef").status == 404
    # the same entry twice is one entry (its id derives from it)
    first = block(admin, type="client_id", value="twice")
    second = block(admin, type="client_id", value="twice", expires_at=time.time() + 600)
    assert first["id"] == second["id"]
    assert [e["id"] for e in admin.get("/api/blocked-clients").json["items"]] == [first["id"]]
    unblock(admin, first["id"])


def test_tbmq_blocked_adds_lists_and_removes_through_the_node(node, admin):
    env = {"TBMQ_ADMIN_USER": "root", "TBMQ_ADMIN_PASSWORD": USERS["root"][0]}
    data = node.workdir / "data"
    url = ("--url", node.url)
    client_id = f"cli-{uid()}"
    added = tbmq_cli(data, "blocked", "add", *url, "--type", "client_id", "--value", client_id,
                     "--expires", "600", env=env).stdout
    assert added.startswith(f"blocked client_id {client_id} (")
    entry_id = added.strip().rsplit("(", 1)[1].rstrip(")")
    assert connack_v5(node, client_id) == BANNED
    listing = tbmq_cli(data, "blocked", "list", *url, env=env).stdout.splitlines()
    assert listing[0].split() == ["ID", "TYPE", "VALUE", "TARGET", "EXPIRES", "CREATED"]
    assert [line.split()[:3] for line in listing[1:]] == [[entry_id, "client_id", client_id]]
    bad = tbmq_cli(data, "blocked", "add", *url, "--type", "regex", "--value", "(",
                   env=env, check=False)
    assert bad.returncode == 1 and "400: value: not a regular expression" in bad.stderr
    assert tbmq_cli(data, "blocked", "remove", *url, entry_id, env=env).stdout.strip() == \
        f"removed {entry_id}"
    assert connack_v5(node, client_id) == 0
    unknown = tbmq_cli(data, "blocked", "remove", *url, entry_id, env=env, check=False)
    assert unknown.returncode == 1 and "404" in unknown.stderr


# -- the unauthorized clients --------------------------------------------------------------


def test_refused_logins_are_listed_with_what_they_gave_and_bounded(node, admin):
    assert admin.request("DELETE", "/api/unauthorized-clients").status == 200
    tag = uid()
    assert connack_v5(node, f"bad5-{tag}", DEVICE_USER, "wrong") == BAD_USER_NAME_OR_PASSWORD
    assert connack_v3(node, f"bad3-{tag}", DEVICE_USER, "wrong") == 4  # bad user name or password
    assert connack_v5(node, f"good-{tag}", DEVICE_USER, DEVICE_PASSWORD) == 0
    page = wait_for(lambda: (lambda p: p if p["total"] == 2 else None)(
        admin.get("/api/unauthorized-clients").json), what="two refused attempts")
    by_id = {a["client_id"]: a for a in page["items"]}
    assert set(by_id) == {f"bad5-{tag}", f"bad3-{tag}"}
    for attempt in by_id.values():
        assert attempt["address"] == "127.0.0.1"
        assert attempt["username"] == DEVICE_USER
        assert attempt["password_provided"] is True
        assert attempt["certificate_provided"] is False
        assert attempt["reason"].startswith("BAD_USER_NAME_OR_PASSWORD (0x86)")
        assert abs(attempt["time"] - time.time()) < 30
    assert page["items"][0]["client_id"] == f"bad3-{tag}"  # newest first
    # one more attempt of a client id replaces its entry
    assert connack_v5(node, f"bad5-{tag}", DEVICE_USER, "wrong again") == \
        BAD_USER_NAME_OR_PASSWORD
    wait_for(lambda: admin.get("/api/unauthorized-clients").json["items"][0]["client_id"]
             == f"bad5-{tag}", what="the newer attempt first")
    assert admin.get("/api/unauthorized-clients").json["total"] == 2
    # a flood of client ids keeps max_entries, the oldest evicted and counted
    evicted = admin.get("/api/unauthorized-clients").json["evicted"]
    for n in range(MAX_UNAUTHORIZED + 2):
        assert connack_v5(node, f"flood-{n}-{tag}", DEVICE_USER, "wrong") == \
            BAD_USER_NAME_OR_PASSWORD
    page = wait_for(lambda: (lambda p: p if p["evicted"] == evicted + 4 else None)(
        admin.get("/api/unauthorized-clients").json), what="4 evictions")
    assert page["total"] == MAX_UNAUTHORIZED
    # evicted: bad3, bad5 (its second attempt made it newer), flood-0, flood-1
    assert {a["client_id"] for a in page["items"]} == {
        f"flood-{n}-{tag}" for n in range(2, MAX_UNAUTHORIZED + 2)}
    cleared = admin.request("DELETE", "/api/unauthorized-clients")
    assert cleared.json == {"status": "cleared", "target": str(MAX_UNAUTHORIZED)}
    assert admin.get("/api/unauthorized-clients").json["total"] == 0


# -- last: restarts the node ------------------------------------------------------------------


def test_the_blocked_list_survives_a_restart(node, admin, reactor_thread):
    client_id = f"kept-{uid()}"
    entry = block(admin, type="client_id", value=client_id)
    node.restart()
    http = Http(reactor_thread, node.url)
    wait_http(node.http_port)
    http.login("root", USERS["root"][0])
    assert http.get("/api/blocked-clients").json["items"] == [entry]
    assert connack_v5(node, client_id) == BANNED
    assert connack_v3(node, client_id) == NOT_AUTHORIZED_V3
    unblock(http, entry["id"])
    assert connack_v5(node, client_id) == 0
