"""TBMQ's publish/subscribe authorization rules (:mod:`tbmq.auth.rules`) and
the password helpers (:mod:`tbmq.auth.passwords`)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import bcrypt
import pytest
from scramp import ScramClient, ScramMechanism

from tbmq.auth.passwords import (
    check_password,
    check_password_async,
    check_scram_password,
    hash_password,
    scram_auth_info,
    scram_credentials,
)
from tbmq.auth.rules import UNRESTRICTED, AuthorizationRules, BoundRules
from tbmq.errors import CredentialsError

# -- rules ----------------------------------------------------------------------------


def test_missing_lists_mean_no_restriction():
    rules = AuthorizationRules.from_value(None).bind("c")
    assert rules.may_publish("any/topic") and rules.may_subscribe("#")
    rules = AuthorizationRules.from_value({}).bind("c")
    assert rules.may_publish("x") and rules.may_subscribe("x/+")
    assert AuthorizationRules.from_value(None) is UNRESTRICTED


def test_empty_lists_allow_nothing():
    rules = AuthorizationRules.from_value(
        {"pubAuthRulePatterns": [], "subAuthRulePatterns": []}
    ).bind("c")
    assert not rules.may_publish("a")
    assert not rules.may_subscribe("a")


def test_one_direction_restricted():
    rules = AuthorizationRules.from_value({"pubAuthRulePatterns": ["a/.*"]}).bind("c")
    assert rules.may_publish("a/b")
    assert not rules.may_publish("b")
    assert rules.may_subscribe("anything/#")


def test_whole_topic_must_match_any_pattern():
    """TBMQ: ``Pattern.matcher(topic).matches()`` on any of the patterns."""
    rules = AuthorizationRules(["sensors/.*", "status"], ["cmd/\\+", "cmd/#"]).bind("c")
    assert rules.may_publish("sensors/t1")
    assert rules.may_publish("status")
    assert not rules.may_publish("status/x")  # no prefix match
    assert not rules.may_publish("x/sensors/t1")  # no search
    assert rules.may_subscribe("cmd/+")  # wildcards are literal characters
    assert rules.may_subscribe("cmd/#")
    assert not rules.may_subscribe("cmd/a")


def test_placeholders_are_substituted_as_literals():
    rules = AuthorizationRules(
        ["devices/${clientId}/.*", "users/${username}", "certs/${certificateCn}", "tbmq/${cn}"],
        ["in/${clientId}/#"],
    )
    bound = rules.bind("dev.42", "alice+bob", "cn[1]")
    assert bound.may_publish("devices/dev.42/t")
    assert not bound.may_publish("devices/devX42/t")  # '.' is literal
    assert bound.may_publish("users/alice+bob")
    assert not bound.may_publish("users/alicebob")
    assert bound.may_publish("certs/cn[1]")
    assert bound.may_publish("tbmq/cn[1]")  # TBMQ's ${cn}
    assert not bound.may_publish("certs/cn1")
    assert bound.may_subscribe("in/dev.42/#")
    other = rules.bind("dev7", "carol", None)
    assert not other.may_publish("devices/dev.42/t")
    assert other.may_publish("devices/dev7/t")


def test_placeholder_without_value_matches_nothing():
    rules = AuthorizationRules(["users/${username}", "certs/${certificateCn}", "all/.*"], None)
    bound = rules.bind("c", None, None)
    assert not bound.may_publish("users/")
    assert not bound.may_publish("users/None")
    assert not bound.may_publish("certs/")
    assert bound.may_publish("all/x")
    only = AuthorizationRules(["users/${username}"], None).bind("c")
    assert not only.may_publish("users/")  # restricted to nothing, not unrestricted


@pytest.mark.parametrize(
    "value",
    [
        {"pubAuthRulePatterns": ["a/(b"]},
        {"subAuthRulePatterns": ["ok", "[z-a]"]},
        {"pubAuthRulePatterns": ["${clientId}("]},
    ],
)
def test_invalid_regex_is_refused_with_the_pattern(value):
    with pytest.raises(CredentialsError) as info:
        AuthorizationRules.from_value(value)
    (key,) = value
    assert key in str(info.value)
    assert repr(value[key][-1]) in str(info.value)


@pytest.mark.parametrize(
    "value",
    [
        "a/.*",
        ["a"],
        {"pubAuthRulePatterns": "a/.*"},
        {"pubAuthRulePatterns": [1]},
        {"subAuthRulePatterns": {"a": 1}},
    ],
)
def test_malformed_rules_are_refused(value):
    with pytest.raises(CredentialsError):
        AuthorizationRules.from_value(value)


def test_to_value_round_trip():
    for value in (
        {},
        {"pubAuthRulePatterns": []},
        {"pubAuthRulePatterns": ["a"], "subAuthRulePatterns": ["b", "c"]},
    ):
        rules = AuthorizationRules.from_value(value)
        assert rules.to_value() == value
        assert AuthorizationRules.from_value(rules.to_value()) == rules


def test_answers_are_cached_and_bounded():
    bound = AuthorizationRules(["a/.*"], ["s/.*"]).bind("c", cache_size=3)
    for topic in ("a/1", "a/2", "b", "a/3", "a/4"):
        bound.may_publish(topic)
    cache = bound._pub.cache
    assert list(cache) == ["b", "a/3", "a/4"]  # least recently used dropped
    assert bound.may_publish("b") is False  # a hit ...
    assert list(cache)[-1] == "b"  # ... moves to the end
    assert bound.may_subscribe("s/x") and list(bound._sub.cache) == ["s/x"]
    uncached = AuthorizationRules(["a"], None).bind("c", cache_size=0)
    assert uncached.may_publish("a") and not uncached._pub.cache


def test_cache_default_is_bounded():
    bound = AuthorizationRules(["t/.*"], None).bind("c")
    for i in range(5000):
        assert bound.may_publish(f"t/{i}")
    assert len(bound._pub.cache) == 1024


def test_bound_rules_repr_and_validation():
    bound = AuthorizationRules(["x"], None).bind("c")
    assert "x" in repr(bound)
    with pytest.raises(ValueError):
        BoundRules(None, None, cache_size=-1)


# -- bcrypt ----------------------------------------------------------------------------


def test_hash_and_check_password():
    hashed = hash_password("s3cret", rounds=4)
    assert hashed.startswith("$2b$04$")
    assert check_password(b"s3cret", hashed)
    assert check_password("s3cret", hashed)
    assert not check_password(b"s3cret!", hashed)
    assert hash_password("s3cret", rounds=4) != hashed  # salted


def test_default_rounds_is_tbmqs():
    assert hash_password(b"x").startswith("$2b$10$")


def test_tbmq_spring_hashes_are_accepted():
    """TBMQ stores Spring's BCryptPasswordEncoder output, ``$2a$``."""
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4, prefix=b"2a")).decode()
    assert hashed.startswith("$2a$")
    assert check_password(b"pw", hashed)


@pytest.mark.parametrize(
    "hashed", [None, "", "plain", "$2b$04$short", b"\xff\xfe", "$2b$99$" + "a" * 53]
)
def test_malformed_hash_is_false(hashed):
    assert check_password(b"pw", hashed) is False


def test_long_passwords():
    with pytest.raises(CredentialsError):
        hash_password(b"x" * 73)
    hashed = hash_password(b"x" * 72, rounds=4)
    assert check_password(b"x" * 72, hashed)
    assert not check_password(b"x" * 73, hashed)
    with pytest.raises(CredentialsError):
        hash_password("x", rounds=3)


def test_check_password_async_runs_in_threads(reactor_thread):
    hashed = hash_password(b"right", rounds=4)
    reactor = reactor_thread.reactor
    assert reactor_thread.call(check_password_async, b"right", hashed, reactor) is True
    assert reactor_thread.call(check_password_async, b"wrong", hashed, reactor) is False
    assert reactor_thread.call(check_password_async, b"x", None, reactor) is False
    pool = reactor.getThreadPool()
    assert reactor_thread.call(check_password_async, "right", hashed, reactor, pool) is True


def test_many_wrong_passwords_do_not_block_the_reactor(reactor_thread):
    """Each check runs in a thread: the reactor keeps turning while 200
    bcrypt checks run (a blocking check would stall it for their sum)."""
    from twisted.internet import defer, task

    reactor = reactor_thread.reactor
    hashed = hash_password(b"right", rounds=6)
    ticks: list = []

    async def scenario() -> list:
        loop = task.LoopingCall(lambda: ticks.append(time.monotonic()))
        loop.clock = reactor
        loop.start(0.01)
        try:
            return await defer.gatherResults(
                [check_password_async(b"wrong%d" % i, hashed, reactor) for i in range(200)])
        finally:
            loop.stop()

    started = time.monotonic()
    results = reactor_thread.run(scenario)
    elapsed = time.monotonic() - started
    assert not any(results)
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) > 3, (len(ticks), elapsed)
    # no single stall of the reactor as long as the checks took together
    assert max(gaps) < max(0.5, elapsed / 2), (max(gaps), elapsed)


# -- SCRAM ------------------------------------------------------------------------------


def _rfc5802_keys(password: bytes, salt: bytes, iterations: int, name: str):
    salted = hashlib.pbkdf2_hmac(name, password, salt, iterations)
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", name).digest()
    return stored_key, server_key


@pytest.mark.parametrize("algorithm,name", [("SHA256", "sha256"), ("SHA512", "sha512")])
def test_scram_credentials_follow_rfc5802(algorithm, name):
    salt = b"0123456789abcdef"
    value = scram_credentials("pencil", algorithm, iterations=4096, salt=salt)
    assert set(value) == {"salt", "storedKey", "serverKey", "iterations", "algorithm"}
    assert value["algorithm"] == algorithm and value["iterations"] == 4096
    stored_key, server_key = _rfc5802_keys(b"pencil", salt, 4096, name)
    assert base64.b64decode(value["salt"]) == salt
    assert base64.b64decode(value["storedKey"]) == stored_key
    assert base64.b64decode(value["serverKey"]) == server_key
    assert scram_auth_info(value) == (salt, stored_key, server_key, 4096)
    assert check_scram_password("pencil", value)
    assert not check_scram_password("pencil2", value)


def test_scram_rfc7677_example():
    """RFC 7677 §3: user "user", password "pencil", salt
    ``W22ZaJ0SNY7soEsUEjb6gQ==``, 4096 iterations: the server's signature
    ``6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=`` follows from ServerKey."""
    value = scram_credentials(
        "pencil", "SHA256", 4096, salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    )
    auth_message = (
        b"n=user,r=rOprNGfwEbeRWgbNEkqO,"
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,"
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    )
    signature = hmac.new(base64.b64decode(value["serverKey"]), auth_message, "sha256").digest()
    assert base64.b64encode(signature) == b"6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_scram_values_authenticate_a_real_exchange():
    value = scram_credentials("pw", "SHA512")
    mechanism = ScramMechanism("SCRAM-SHA-512")
    server = mechanism.make_server(lambda username: scram_auth_info(value))
    client = ScramClient(["SCRAM-SHA-512"], "bob", "pw")
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    server.set_client_final(client.get_client_final())
    client.set_server_final(server.get_server_final())  # raises on a bad proof


def test_scram_errors():
    with pytest.raises(CredentialsError):
        scram_credentials("pw", "MD5")
    with pytest.raises(CredentialsError):
        scram_credentials("pw", "SHA256", iterations=10)
    with pytest.raises(CredentialsError):
        scram_auth_info({"salt": "!!", "storedKey": "", "serverKey": "", "iterations": 1})
    assert not check_scram_password("pw", {})
