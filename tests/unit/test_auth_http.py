"""The ``http`` authentication provider (:mod:`tbmq_plugins.auth_http`): the
request its templates make, how it reads answers, its cache, and its HTTP
client against a real HTTP server (:mod:`tests.auth_service`) on a private
reactor."""

from __future__ import annotations

import json
import time
import urllib.parse

import pytest
from twisted.internet import task
from twisted.internet.address import IPv4Address

from tbmq.auth import AuthRequest
from tbmq.config import load_config
from tbmq.errors import ConfigError
from tbmq.model import ClientType
from tbmq_plugins.auth_http import (
    AnswerCache, Decision, HttpAuth, HttpService, TrustedCAs, Unreadable, build_request, decide,
    placeholder_values, used_placeholders,
)
from tests.auth_service import AuthService

BODY = {"id": "${clientId}", "user": "${username}", "pw": "${password}",
        "cn": "${certificateCn}", "ip": "${peerhost}", "both": "${clientId}/${username}"}


def http_config(**settings):
    settings.setdefault("url", "http://auth.example/check")
    return load_config(environ={}, overrides={"auth": {"providers": ["http"],
                                                       "http": settings}}).auth.http


def request(client_id="dev-1", username="alice", password=b'p"w&=1', host="203.0.113.5"):
    return AuthRequest(client_id, username, password, 5,
                       address=IPv4Address("TCP", host, 40000))


# -- the request -----------------------------------------------------------------------


def test_post_sends_the_body_template_as_json_with_the_headers():
    cfg = http_config(body=BODY, headers={"X-Api-Key": "k1"})
    method, url, headers, body = build_request(cfg, placeholder_values(request()))
    assert (method, url) == (b"POST", b"http://auth.example/check")
    assert json.loads(body) == {"id": "dev-1", "user": "alice", "pw": 'p"w&=1', "cn": "",
                                "ip": "203.0.113.5", "both": "dev-1/alice"}
    assert headers.getRawHeaders("X-Api-Key") == ["k1"]
    assert headers.getRawHeaders("Content-Type") == ["application/json"]


def test_get_sends_the_body_fields_as_query_parameters():
    cfg = http_config(method="get", url="http://auth.example/c/${clientId}?v=1", body=BODY)
    method, url, _, body = build_request(cfg, placeholder_values(request(client_id="a/b c")))
    assert method == b"GET" and body is None
    parts = urllib.parse.urlsplit(url.decode())
    assert parts.path == "/c/a%2Fb%20c"
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    assert query == {"v": "1", "id": "a/b c", "user": "alice", "pw": 'p"w&=1', "cn": "",
                     "ip": "203.0.113.5", "both": "a/b c/alice"}


def test_post_as_a_form_when_the_headers_say_so():
    cfg = http_config(body={"u": "${username}"},
                      headers={"content-type": "application/x-www-form-urlencoded"})
    _, _, headers, body = build_request(cfg, placeholder_values(request()))
    assert body == b"u=alice"
    assert headers.getRawHeaders("Content-Type") == ["application/x-www-form-urlencoded"]


def test_missing_values_are_empty_and_the_default_body():
    cfg = http_config()
    _, _, _, body = build_request(cfg, placeholder_values(request(username=None, password=None)))
    assert json.loads(body) == {"clientId": "dev-1", "username": "", "password": ""}


def test_the_cache_key_holds_only_the_placeholders_used():
    assert used_placeholders(http_config()) == ("clientId", "password", "username")
    assert used_placeholders(http_config(url="http://a/${peerhost}", body={})) == ("peerhost",)


@pytest.mark.parametrize("settings, message", [
    ({"url": None}, "auth.http.url: required when http is in auth.providers"),
    ({"url": "ftp://x"}, "auth.http.url: must be an http:// or https:// URL"),
    ({"body": {"a": "${clientid}"}}, "auth.http.body: a: unknown placeholder ${clientid}"),
    ({"method": "PUT"}, "auth.http.method: must be one of GET, POST"),
    ({"timeout": 0}, "auth.http.timeout: must be > 0"),
    ({"cache_ttl": -1}, "auth.http.cache_ttl: must be >= 0"),
    ({"default_client_type": "ROBOT"}, "auth.http.default_client_type: must be one of"),
    ({"default_pub": ["("]}, "auth.http.default_pub: [0]: invalid regex '('"),
])
def test_config_errors_name_the_key(settings, message):
    with pytest.raises(ConfigError) as e:
        http_config(**settings)
    assert str(e.value).startswith(message)


# -- the answer ------------------------------------------------------------------------


def test_an_allow_answer_gives_the_client_type_and_rules():
    cfg = http_config()
    d = decide(200, json.dumps({"result": "allow", "client_type": "APPLICATION",
                                "pub": ["dev/${clientId}/.*"], "sub": []}).encode(), cfg)
    assert (d.result, d.client_type) == ("allow", ClientType.APPLICATION)
    bound = d.rules.bind("c1")
    assert bound.may_publish("dev/c1/x") and not bound.may_publish("dev/c2/x")
    assert not bound.may_subscribe("anything")


def test_an_allow_answer_without_fields_takes_the_defaults():
    cfg = http_config(default_client_type="APPLICATION", default_pub=["p/.*"],
                      default_sub=["s/.*"])
    d = decide(200, b'{"result": "allow"}', cfg)
    assert d.client_type is ClientType.APPLICATION
    assert (d.rules.pub_patterns, d.rules.sub_patterns) == (("p/.*",), ("s/.*",))
    d = decide(200, b'{"result": "allow"}', http_config())
    assert d.client_type is ClientType.DEVICE
    assert (d.rules.pub_patterns, d.rules.sub_patterns) == (None, None)


@pytest.mark.parametrize("status, body, result", [
    (200, b'{"result": "deny"}', "deny"),
    (200, b'{"result": "ignore"}', "ignore"),
    (400, b"", "deny"), (401, b"", "deny"), (403, b'{"result": "allow"}', "deny"),
    (404, b"x", "deny"),
])
def test_deny_and_ignore(status, body, result):
    assert decide(status, body, http_config()).result == result


@pytest.mark.parametrize("status, body, why", [
    (500, b'{"result": "allow"}', "HTTP status 500"),
    (503, b"", "HTTP status 503"),
    (302, b"", "HTTP status 302"),
    (200, b"allow", "not JSON"),
    (200, b"[]", "not a JSON object"),
    (200, b'{"result": "yes"}', "result 'yes'"),
    (200, b'{"result": "allow", "client_type": "ROBOT"}', "client_type 'ROBOT'"),
    (200, b'{"result": "allow", "pub": ["("]}', "invalid regex"),
    (200, b'{"result": "allow", "sub": "a/.*"}', "expected a list"),
])
def test_unusable_answers(status, body, why):
    with pytest.raises(Unreadable, match=why.replace("(", r"\(").replace("[", r"\[")):
        decide(status, body, http_config())


def test_the_cache_keeps_answers_ttl_seconds_and_a_bounded_number():
    clock = task.Clock()
    cache = AnswerCache(clock, ttl=10, size=2)
    names = ("clientId", "password")
    key = cache.key(names, placeholder_values(request()))
    assert not any(b'p"w&=1' == part or 'p"w&=1' == part for part in key)
    allow = Decision("allow")
    cache.put(key, allow)
    clock.advance(9.9)
    assert cache.get(key) is allow
    clock.advance(0.1)
    assert cache.get(key) is None
    for i in range(3):
        cache.put((str(i),), allow)
    assert len(cache) == 2 and cache.get(("0",)) is None and cache.get(("2",)) is allow


# -- against a real HTTP server --------------------------------------------------------------


@pytest.fixture
def service():
    with AuthService() as s:
        yield s


def ask(reactor_thread, cfg, req=None):
    made = reactor_thread.call(HttpService, cfg, reactor_thread.reactor)
    try:
        return made, reactor_thread.run(made.ask, req or request())
    finally:
        reactor_thread.call(made.close)


def test_the_service_receives_the_request_and_its_answer_is_read(reactor_thread, service):
    service.reset(lambda seen: (200, {"result": "allow", "client_type": "APPLICATION"}, 0))
    _, decision = ask(reactor_thread, http_config(url=service.url, body=BODY,
                                                  headers={"Authorization": "Bearer t"}))
    assert decision.result == "allow" and decision.client_type is ClientType.APPLICATION
    (seen,) = service.seen
    assert seen.method == "POST" and seen.headers["authorization"] == "Bearer t"
    assert seen.json["pw"] == 'p"w&=1' and seen.json["ip"] == "203.0.113.5"


def test_a_slow_service_is_no_decision_after_the_timeout(reactor_thread, service):
    service.reset(lambda seen: (200, {"result": "allow"}, 2))
    _, decision = ask(reactor_thread, http_config(url=service.url, timeout=0.3))
    assert decision is None
    # the service's thread may read the request after the client gave up
    # (a loaded machine): it is asked once, whenever it reads
    deadline = time.monotonic() + 10
    while not service.seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(service.seen) == 1


def test_a_service_that_is_not_there_is_no_decision(reactor_thread, service):
    url = service.url
    service.__exit__()
    _, decision = ask(reactor_thread, http_config(url=url, timeout=2))
    assert decision is None


def test_cached_answers_are_not_asked_again_within_the_ttl(reactor_thread, service):
    made = reactor_thread.call(HttpService, http_config(url=service.url, cache_ttl=30),
                               reactor_thread.reactor)
    try:
        first = reactor_thread.run(made.ask, request())
        second = reactor_thread.run(made.ask, request())
        other = reactor_thread.run(made.ask, request(password=b"other"))
    finally:
        reactor_thread.call(made.close)
    assert first is second and other is not first
    assert len(service.seen) == 2


def test_get_puts_the_fields_in_the_query_the_service_receives(reactor_thread, service):
    service.reset(lambda seen: (200, {"result": "deny"}, 0))
    _, decision = ask(reactor_thread, http_config(url=service.url + "?v=1", method="GET",
                                                  body={"u": "${username}", "p": "${password}"}))
    assert decision.result == "deny"
    (seen,) = service.seen
    assert seen.method == "GET" and seen.body == b""
    assert seen.query == {"v": "1", "u": "alice", "p": 'p"w&=1'}


def test_an_unusable_tls_ca_is_a_config_error(tmp_path):
    cfg = load_config(environ={}, overrides={"auth": {"providers": ["http"], "http": {
        "url": "https://a/", "tls_ca": str(tmp_path / "none.pem")}}})
    with pytest.raises(ConfigError, match=r"^auth\.http\.tls_ca: cannot read .*none\.pem"):
        HttpAuth().tbmq_configure(cfg)
    (tmp_path / "empty.pem").write_text("nothing here\n")
    with pytest.raises(ConfigError, match=r"^auth\.http\.tls_ca: .*holds no PEM certificate"):
        TrustedCAs(str(tmp_path / "empty.pem"))
