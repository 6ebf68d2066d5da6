"""The REST admin API over real HTTP (treq): every resource, the refusals
(no token, a wrong token, a viewer asking for a change, no admin user at
all), bad JSON and unknown ids (4xx, never 500), every answer checked
against its JSON schema; and the ``tbmq sessions`` and ``tbmq retained``
commands against the running node."""

from __future__ import annotations

import jwt
import pytest
from jsonschema import Draft202012Validator

from tbmq.ops.api.routes import PUBLIC, ROUTES, WRITE
from tbmq.ops.api.schemas import SCHEMAS, resolved
from tests.integration.conftest import _finish
from tests.integration.helpers import HOST, props, uid, wait_for
from tests.integration.ops import (  # noqa: F401
    USERS, Http, ops_broker, start_ops_broker, tbmq_cli,
)

ROOT, WATCHER = "root", "watcher"


@pytest.fixture(scope="module")
def admin(ops_broker, reactor_thread) -> Http:
    http = Http(reactor_thread, ops_broker.url)
    http.login(ROOT, USERS[ROOT][0])
    return http


@pytest.fixture(scope="module")
def viewer(ops_broker, reactor_thread) -> Http:
    http = Http(reactor_thread, ops_broker.url)
    http.login(WATCHER, USERS[WATCHER][0])
    return http


def check(answer, status: int, schema: str | None = None):
    """The answer has ``status`` and fits ``schema`` (Error for a 4xx)."""
    assert answer.status == status, answer
    assert answer.headers["content-type"].startswith("application/json")
    if status >= 400:
        schema = "Error"
        assert answer.json["error"]["status"] == status
    if schema is not None:
        errors = list(Draft202012Validator(resolved(schema)).iter_errors(answer.json))
        assert not errors, [e.message for e in errors]
    return answer.json


def concrete(route) -> str:
    return "/api/" + "/".join("x" if p.startswith("{") else p for p in route.path)


# -- the document and the refusals -----------------------------------------------------


def test_openapi_document_lists_every_route_with_schemas(admin):
    doc = check(admin.get("/api/openapi.json", token=None), 200)
    assert doc["openapi"].startswith("3.1")
    for route in ROUTES:
        path = "/api/" + "/".join(route.path)
        operation = doc["paths"][path][route.method.lower()]
        assert operation["operationId"] == route.handler
        assert str(route.status) in operation["responses"]
        if route.access != PUBLIC:
            assert "401" in operation["responses"] and "403" in operation["responses"]
    assert set(doc["components"]["schemas"]) == set(SCHEMAS)
    for schema in SCHEMAS:
        Draft202012Validator.check_schema(resolved(schema))


@pytest.mark.parametrize("route", [r for r in ROUTES if r.access != PUBLIC],
                         ids=lambda r: f"{r.method} {'/'.join(r.path)}")
def test_refused_without_token_with_a_wrong_token_and_for_a_viewer(route, admin, viewer):
    path = concrete(route)
    body = {} if route.body else None
    answer = admin.request(route.method, path, token=None, json_body=body)
    check(answer, 401)
    assert answer.headers["www-authenticate"].startswith("Bearer")
    check(admin.request(route.method, path, token="not-a-token", json_body=body), 401)
    forged = jwt.encode({"sub": ROOT, "role": "admin", "exp": 4102444800}, "another-key-of-32-bytes-or-more!",
                        algorithm="HS256")
    check(admin.request(route.method, path, token=forged, json_body=body), 401)
    expired = admin.request(route.method, path, json_body=body, token=jwt.encode(
        {"sub": ROOT, "exp": 1}, "k" * 32, algorithm="HS256"))
    check(expired, 401)
    if route.access == WRITE:
        answer = viewer.request(route.method, path, json_body=body)
        check(answer, 403)
        assert "may not change" in answer.json["error"]["message"]


def test_login_refusals(admin):
    check(admin.request("POST", "/api/auth/login", token=None,
                        json_body={"username": ROOT, "password": "wrong"}), 401)
    check(admin.request("POST", "/api/auth/login", token=None,
                        json_body={"username": "nobody", "password": "x"}), 401)
    check(admin.request("POST", "/api/auth/login", token=None, data=b"{not json"), 400)
    answer = check(admin.request("POST", "/api/auth/login", token=None,
                                 json_body={"username": ROOT}), 422)
    assert any("password" in d for d in answer["error"]["details"])
    # an MQTT client's credentials never log in here
    check(admin.request("POST", "/api/auth/login", token=None,
                        json_body={"username": "sensor", "password": "sensor-pass"}), 401)


def test_viewer_reads_and_me(admin, viewer):
    assert check(viewer.get("/api/auth/me"), 200, "User") == {"name": WATCHER, "role": "viewer"}
    assert check(admin.get("/api/auth/me"), 200, "User") == {"name": ROOT, "role": "admin"}
    check(viewer.get("/api/sessions"), 200, "SessionPage")


def test_unknown_paths_and_methods(admin):
    check(admin.get("/api/nothing-here"), 404)
    answer = admin.request("PUT", "/api/sessions")
    check(answer, 405)
    assert answer.headers["allow"] == "GET"


def test_no_admin_user_refuses_everything(tmp_path, reactor_thread):
    broker = start_ops_broker(tmp_path / "bare")
    try:
        http = Http(reactor_thread, broker.url)
        answer = check(http.request("POST", "/api/auth/login", token=None,
                                    json_body={"username": "a", "password": "b"}), 403)
        assert "tbmq admin add" in answer["error"]["message"]
        for route in ROUTES:
            if route.access != PUBLIC:
                check(http.request(route.method, concrete(route), token="whatever",
                                   json_body={} if route.body else None), 403)
    finally:
        _finish(broker)


# -- sessions ------------------------------------------------------------------------------


def test_sessions_list_show_filter_and_page(admin, ops_broker, mqtt):
    tag = uid()
    persistent = mqtt.connect(5, client_id=f"{tag}-p", port=ops_broker.port, clean_start=False,
                              session_expiry=600)
    persistent.subscribe(f"{tag}/#", qos=1)
    plain = [mqtt.connect(4, client_id=f"{tag}-c{i}", port=ops_broker.port) for i in range(3)]
    slash = mqtt.connect(4, client_id=f"{tag}/with/slash", port=ops_broker.port)
    page = check(admin.get("/api/sessions", params={"q": tag}), 200, "SessionPage")
    assert page["total"] == 5
    ids = [s["client_id"] for s in page["items"]]
    assert ids == sorted(ids)
    page = check(admin.get("/api/sessions", params={"q": tag, "limit": "2", "offset": "1"}), 200,
                 "SessionPage")
    assert [s["client_id"] for s in page["items"]] == ids[1:3] and page["total"] == 5
    only = check(admin.get("/api/sessions", params={"q": tag, "persistent": "true"}), 200)
    assert [s["client_id"] for s in only["items"]] == [f"{tag}-p"]
    assert only["items"][0]["subscriptions"] == 1
    assert only["items"][0]["node"]
    for bad in ({"connected": "maybe"}, {"limit": "0"}, {"offset": "-1"}, {"limit": "x"},
                {"client_type": "ROBOT"}):
        check(admin.get("/api/sessions", params=bad), 400)

    persistent.disconnect()
    publisher = mqtt.connect(4, port=ops_broker.port)
    for i in range(4):
        publisher.publish(f"{tag}/t", b"m%d" % i, qos=1)
    detail = check(admin.get(f"/api/sessions/{tag}-p"), 200, "SessionDetail")
    assert detail["session"]["connected"] is False and detail["session"]["persistent"] is True
    assert detail["queued"] == 4
    assert detail["subscriptions"][0]["topic_filter"] == f"{tag}/#"
    subs = check(admin.get(f"/api/sessions/{tag}-p/subscriptions"), 200, "SubscriptionList")
    assert [s["qos"] for s in subs["items"]] == [1]
    # a client id with slashes, percent-encoded
    detail = check(admin.get(f"/api/sessions/{tag}%2Fwith%2Fslash"), 200, "SessionDetail")
    assert detail["session"]["client_id"] == f"{tag}/with/slash"
    check(admin.get("/api/sessions/no-such-client"), 404)
    check(admin.get("/api/sessions/no-such-client/subscriptions"), 404)
    check(admin.get("/api/sessions/%FF%FE"), 400)
    for client in plain + [slash]:
        client.disconnect()


def test_sessions_show_who_the_client_is(admin, ops_broker, mqtt):
    """A client's address, user name and the name of the credentials
    record that admitted it, in the list and the details (and they stay
    once it is offline); the search finds a session by any of them."""
    tag = uid()
    record = check(admin.request("POST", "/api/credentials", json_body={
        "type": "basic", "name": f"sensor-{tag}", "username": f"u-{tag}",
        "client_id": f"{tag}-dev", "password": "pw-who", "rounds": 4}), 201, "Credentials")
    device = mqtt(5, client_id=f"{tag}-dev", port=ops_broker.port)
    device.client.username_pw_set(f"u-{tag}", "pw-who")
    device.connect_and_wait(clean_start=False, session_expiry=600)
    address = "%s:%d" % device.client.socket().getsockname()[:2]
    anonymous = mqtt.connect(4, client_id=f"{tag}-anon", port=ops_broker.port)
    page = check(admin.get("/api/sessions", params={"q": tag}), 200, "SessionPage")
    who = {s["client_id"]: (s["address"], s["username"], s["credentials_name"])
           for s in page["items"]}
    anonymous_address = "%s:%d" % anonymous.client.socket().getsockname()[:2]
    assert who == {f"{tag}-dev": (address, f"u-{tag}", f"sensor-{tag}"),
                   f"{tag}-anon": (anonymous_address, None, None)}
    # not the record's internal ids
    assert record["credentials_id"] not in str(page) and record["id"] not in str(page)
    described = admin.get("/api/openapi.json", token=None).json["components"]["schemas"]
    for field in ("address", "username", "credentials_name"):
        assert described["Session"]["properties"][field]["description"], field
    for q in (f"U-{tag}", f"sensor-{tag}", address):
        found = check(admin.get("/api/sessions", params={"q": q}), 200, "SessionPage")
        assert [s["client_id"] for s in found["items"]] == [f"{tag}-dev"], q
    device.disconnect()
    wait_for(lambda: admin.get(f"/api/sessions/{tag}-dev").json["session"]["connected"] is False,
             what="the session offline")
    detail = check(admin.get(f"/api/sessions/{tag}-dev"), 200, "SessionDetail")["session"]
    assert (detail["address"], detail["username"], detail["credentials_name"]) == (
        address, f"u-{tag}", f"sensor-{tag}")
    anonymous.disconnect()
    check(admin.request("DELETE", f"/api/sessions/{tag}-dev"), 200, "Accepted")
    check(admin.request("DELETE", f"/api/credentials/{record['id']}"), 200, "Accepted")


def test_disconnect_and_remove_a_session(admin, ops_broker, mqtt):
    tag = uid()
    v5 = mqtt.connect(5, client_id=f"{tag}-v5", port=ops_broker.port, clean_start=False,
                      session_expiry=600)
    v5.subscribe(f"{tag}/x", qos=1)
    check(admin.request("DELETE", f"/api/sessions/{tag}-v5"), 409)  # connected
    answer = check(admin.request("POST", f"/api/sessions/{tag}-v5/disconnect"), 200, "Accepted")
    assert answer == {"status": "disconnected", "target": f"{tag}-v5"}
    v5.wait_disconnected()
    assert v5.disconnects[-1][0] == 0x98  # Administrative action
    check(admin.request("POST", f"/api/sessions/{tag}-v5/disconnect"), 409)  # not connected
    answer = check(admin.request("DELETE", f"/api/sessions/{tag}-v5"), 200, "Accepted")
    assert answer["status"] == "removed"
    check(admin.get(f"/api/sessions/{tag}-v5"), 404)
    again = mqtt(5, client_id=f"{tag}-v5", port=ops_broker.port).connect_and_wait(
        clean_start=False, session_expiry=600)
    assert again.session_present is False
    check(admin.request("POST", "/api/sessions/nobody/disconnect"), 404)
    check(admin.request("DELETE", "/api/sessions/nobody"), 404)
    audit = check(admin.get("/api/audit"), 200, "AuditList")["items"]
    assert [(e["user"], e["action"]) for e in audit[:2]] == [(ROOT, "removed"),
                                                             (ROOT, "disconnected")]


# -- retained messages -----------------------------------------------------------------------


def test_retained_list_by_filter_and_delete(admin, ops_broker, mqtt):
    tag = uid()
    publisher = mqtt.connect(4, port=ops_broker.port)
    publisher.publish(f"{tag}/a", b"one", qos=1, retain=True)
    publisher.publish(f"{tag}/b/c", b"\xff\x00", qos=0, retain=True)
    wait_for(lambda: admin.get("/api/retained", params={"filter": f"{tag}/#"}).json["total"] == 2,
             what="retained messages listed")
    page = check(admin.get("/api/retained", params={"filter": f"{tag}/#"}), 200, "RetainedPage")
    first, second = page["items"]
    assert (first["topic"], first["payload"], first["qos"]) == (f"{tag}/a", "one", 1)
    assert second["payload"] is None and second["payload_base64"] == "/wA="
    one = check(admin.get("/api/retained", params={"filter": f"{tag}/+"}), 200)
    assert [m["topic"] for m in one["items"]] == [f"{tag}/a"]
    check(admin.get("/api/retained", params={"filter": "a/#/b"}), 400)
    check(admin.get("/api/retained", params={"filter": "$share/g/a"}), 400)
    check(admin.request("DELETE", "/api/retained"), 400)
    check(admin.request("DELETE", "/api/retained", params={"topic": "a/+"}), 400)
    check(admin.request("DELETE", "/api/retained", params={"topic": f"{tag}/none"}), 404)
    subscriber = mqtt.connect(4, port=ops_broker.port)
    subscriber.subscribe(f"{tag}/a")
    assert subscriber.get().payload == b"one"  # the retained message
    check(admin.request("DELETE", "/api/retained", params={"topic": f"{tag}/a"}), 200, "Accepted")
    page = check(admin.get("/api/retained", params={"filter": f"{tag}/#"}), 200)
    assert [m["topic"] for m in page["items"]] == [f"{tag}/b/c"]
    subscriber.assert_empty()  # deleting routes no empty message
    late = mqtt.connect(4, port=ops_broker.port)
    late.subscribe(f"{tag}/a")
    with pytest.raises(AssertionError):
        late.get(timeout=0.5)


# -- credentials ----------------------------------------------------------------------------------


def test_credentials_add_show_change_delete(admin, ops_broker, mqtt):
    tag = uid()
    added = check(admin.request("POST", "/api/credentials", json_body={
        "type": "basic", "name": f"dev-{tag}", "username": f"u-{tag}", "password": "pw-1",
        "rounds": 4, "pub": [f"{tag}/up/.*"], "sub": None}), 201, "Credentials")
    assert added["credentials_id"] == f"username|u-{tag}" and added["has_password"]
    assert "password" not in added and added["pub"] == [f"{tag}/up/.*"] and added["sub"] is None
    listed = check(admin.get("/api/credentials"), 200, "CredentialsList")
    assert f"dev-{tag}" in [c["name"] for c in listed["items"]]
    assert check(admin.get(f"/api/credentials/{added['id']}"), 200, "Credentials") == added
    assert check(admin.get(f"/api/credentials/dev-{tag}"), 200)["id"] == added["id"]

    client = mqtt(5, port=ops_broker.port)
    client.client.username_pw_set(f"u-{tag}", "pw-1")
    client.connect_and_wait()
    assert client.publish(f"{tag}/up/1", b"ok", qos=1).rc == 0
    changed = check(admin.request("PATCH", f"/api/credentials/{added['id']}",
                                  json_body={"pub": []}), 200, "Credentials")
    assert changed["pub"] == [] and changed["updated_time"] > added["updated_time"]
    # the rules reach the connected client within auth.refresh_interval
    watcher = mqtt.connect(5, port=ops_broker.port)
    watcher.subscribe(f"{tag}/up/#", qos=1)

    def refused():
        client.publish(f"{tag}/up/2", b"no", qos=1)
        try:
            watcher.get(timeout=0.3)
            return False
        except AssertionError:
            return True

    wait_for(refused, timeout=15, interval=0.3, what="the publish refused")

    check(admin.request("POST", "/api/credentials", json_body={
        "type": "basic", "name": f"dev-{tag}", "username": "other", "rounds": 4}), 409)
    answer = check(admin.request("POST", "/api/credentials", json_body={
        "type": "basic", "name": f"re-{tag}", "username": f"r-{tag}", "pub": ["("]}), 422)
    assert "regex" in answer["error"]["message"] or "pattern" in answer["error"]["message"]
    check(admin.request("POST", "/api/credentials", json_body={
        "type": "basic", "name": f"none-{tag}"}), 422)  # no client id, no user name
    check(admin.request("POST", "/api/credentials", json_body={
        "type": "x509", "name": f"x-{tag}", "cn": "a", "password": "nope"}), 422)
    check(admin.request("POST", "/api/credentials", json_body={
        "type": "robot", "name": "r"}), 422)
    check(admin.request("POST", "/api/credentials", data=b"[1, 2"), 400)
    check(admin.request("POST", "/api/credentials", data=b"\xff\xfe"), 400)
    check(admin.request("PATCH", f"/api/credentials/{added['id']}", json_body={}), 422)
    check(admin.request("PATCH", "/api/credentials/no-such-id", json_body={"pub": []}), 404)
    check(admin.get("/api/credentials/no-such-id"), 404)
    x509 = check(admin.request("POST", "/api/credentials", json_body={
        "type": "x509", "name": f"x-{tag}", "cn": "device-.*", "cn_regex": True,
        "client_type": "APPLICATION"}), 201, "Credentials")
    assert (x509["cn"], x509["cn_regex"], x509["client_type"]) == ("device-.*", True,
                                                                    "APPLICATION")
    scram = check(admin.request("POST", "/api/credentials", json_body={
        "type": "scram", "name": f"s-{tag}", "username": f"s-{tag}", "password": "pw",
        "algorithm": "SHA512"}), 201, "Credentials")
    assert scram["algorithm"] == "SHA512" and scram["has_password"]
    for record in (added, x509, scram):
        check(admin.request("DELETE", f"/api/credentials/{record['id']}"), 200, "Accepted")
        check(admin.request("DELETE", f"/api/credentials/{record['id']}"), 404)
    client.close()


# -- nodes and metrics -------------------------------------------------------------------------------


def test_nodes_and_metrics_snapshot(admin, ops_broker, mqtt):
    nodes = check(admin.get("/api/nodes"), 200, "NodeList")["items"]
    assert len(nodes) == 1 and nodes[0]["this"] and nodes[0]["alive"]
    # a --listen listener is named by its endpoint, given once
    assert nodes[0]["listeners"] == [f"tcp:{ops_broker.port}:interface={HOST}"]
    client = mqtt.connect(4, port=ops_broker.port)
    client.publish("snap/x", b"1", qos=1)
    snapshot = check(admin.get("/api/metrics"), 200, "MetricsSnapshot")
    assert snapshot["service_id"] == nodes[0]["service_id"]
    assert snapshot["node"]["connections"] >= 1
    assert snapshot["node"]["messages_received"] >= 1
    assert snapshot["node"]["payload_bytes_received"] >= 1
    assert snapshot["node"]["bytes_received"] > snapshot["node"]["payload_bytes_received"]
    assert snapshot["cluster"]["nodes"] == 1
    assert snapshot["cluster"]["sessions"]["connected"] >= 1
    history = wait_for(lambda: (lambda h: h if len(h["points"]) >= 2 else None)(
        admin.get("/api/metrics/history").json), what="two history points")
    check(admin.get("/api/metrics/history"), 200, "MetricsHistory")
    assert history["interval"] == 1.0


# -- the console's files and /metrics ---------------------------------------------------------------


def test_console_files_are_served(admin):
    root = admin.get("/", token=None)  # redirected to /console/ (treq follows it)
    assert root.status == 200 and b"tbmq console" in root.body
    page = admin.get("/console/", token=None)
    assert page.status == 200 and b"tbmq console" in page.body
    for path in ("/console/app.js", "/console/app.css", "/console/vendor/alpine-3.17.4.min.js",
                 "/console/vendor/uPlot-1.6.32.iife.min.js"):
        assert admin.get(path, token=None).status == 200, path
    assert admin.get("/console/no-such-file.js", token=None).status == 404


# -- the CLI through the running node -----------------------------------------------------------------


def test_cli_sessions_and_retained(ops_broker, mqtt):
    tag = uid()
    env = {"TBMQ_ADMIN_USER": ROOT, "TBMQ_ADMIN_PASSWORD": USERS[ROOT][0]}
    url = ["--url", ops_broker.url]
    client = mqtt.connect(5, client_id=f"{tag}-cli", port=ops_broker.port)
    client.publish(f"{tag}/r", b"kept", qos=1, retain=True)
    out = tbmq_cli(ops_broker.data_dir, "sessions", "list", "--q", tag, *url, env=env).stdout
    assert f"{tag}-cli" in out and "connected" in out
    out = tbmq_cli(ops_broker.data_dir, "sessions", "show", f"{tag}-cli", *url, env=env).stdout
    assert f'"client_id": "{tag}-cli"' in out
    out = tbmq_cli(ops_broker.data_dir, "sessions", "disconnect", f"{tag}-cli", *url,
                   env=env).stdout
    assert "disconnected" in out
    client.wait_disconnected()
    failed = tbmq_cli(ops_broker.data_dir, "sessions", "show", "nobody", *url, env=env,
                      check=False)
    assert failed.returncode == 1 and "404" in failed.stderr
    out = tbmq_cli(ops_broker.data_dir, "retained", "list", "--filter", f"{tag}/#", *url,
                   env=env).stdout
    assert f"{tag}/r" in out and "kept" in out
    tbmq_cli(ops_broker.data_dir, "retained", "delete", f"{tag}/r", *url, env=env)
    out = tbmq_cli(ops_broker.data_dir, "retained", "list", "--filter", f"{tag}/#", *url,
                   env=env).stdout
    assert f"{tag}/r" not in out
    wrong = tbmq_cli(ops_broker.data_dir, "sessions", "list", *url, check=False,
                     env={"TBMQ_ADMIN_USER": ROOT, "TBMQ_ADMIN_PASSWORD": "wrong"})
    assert wrong.returncode == 1 and "401" in wrong.stderr
    users = tbmq_cli(ops_broker.data_dir, "admin", "list").stdout
    assert ROOT in users and WATCHER in users and "viewer" in users


def test_v5_publish_refused_code(admin, ops_broker, mqtt):
    """A v5 client whose rules forbid a topic gets PUBACK 0x87."""
    tag = uid()
    record = check(admin.request("POST", "/api/credentials", json_body={
        "type": "basic", "name": f"r-{tag}", "username": f"r-{tag}", "password": "pw-2",
        "rounds": 4, "pub": ["allowed/.*"]}), 201)
    client = mqtt(5, port=ops_broker.port)
    codes = []
    client.client.on_publish = lambda c, u, mid, rc, p: codes.append(int(rc.value))
    client.client.username_pw_set(f"r-{tag}", "pw-2")
    client.connect_and_wait()
    client.publish("forbidden/x", b"no", qos=1, properties=props())
    wait_for(lambda: codes, what="the PUBACK")
    assert codes == [0x87]
    check(admin.request("DELETE", f"/api/credentials/{record['id']}"), 200)


def test_a_removed_users_token_stops_working(ops_broker, reactor_thread):
    from tests.integration.ops import add_admin

    name = f"temp-{uid()[:6]}"
    add_admin(ops_broker.data_dir, name, "temporary-pw-1", "viewer")
    http = Http(reactor_thread, ops_broker.url)
    http.login(name, "temporary-pw-1")
    check(http.get("/api/auth/me"), 200, "User")
    tbmq_cli(ops_broker.data_dir, "admin", "remove", name)
    wait_for(lambda: http.get("/api/auth/me").status == 401, timeout=10, interval=0.25,
             what="the token refused")
