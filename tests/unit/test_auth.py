"""Authentication providers and authorization rules on the protocol harness
(StringTransport + task.Clock; the providers are the installed entry-point
plugins; the bcrypt check runs inline here, in a thread in the broker)."""

import dataclasses
import time

import jwt
import pytest
import scramp
from twisted.internet import defer

from tbmq.auth import passwords
from tbmq.auth.passwords import DEFAULT_ROUNDS, check_password, hash_password, scram_credentials
from tbmq.hookspecs import hookimpl
from tbmq.model import ClientType, Credentials, CredentialsType
from tbmq.mqtt import (
    Auth, Connect, Disconnect, Property, Puback, Publish, Pubrec, Suback, Subscribe,
    SubscriptionRequest, Will,
)
from tests.helpers import Harness

SECRET = "s3cret-key-for-tests-0123456789abcdef"


@pytest.fixture(autouse=True)
def inline_bcrypt(monkeypatch):
    """bcrypt in the test's thread (the harness's clock is no reactor)."""
    def inline(password, hashed, reactor=None, threadpool=None, cancelled=None):
        return defer.succeed(check_password(password, hashed))

    monkeypatch.setattr(passwords, "check_password_async", inline)


def harness(**auth):
    settings = {"allow_anonymous": False, "refresh_interval": 1.0,
                "jwt": {"secret": SECRET, "algorithms": ["HS256"]}}
    settings.update(auth)
    return Harness({"auth": settings}, entry_points=True)


def add(h, name, ctype, cid, value, client_type=ClientType.DEVICE, id=None):
    creds = Credentials(id or name, name, ctype, cid, client_type, value)
    d = h.broker.credential_store.save(creds)
    assert d.called
    return creds


def basic(h, name="dev", username="user", password="pw", client_id=None, pub=None, sub=None, **kw):
    rules = {}
    if pub is not None:
        rules["pubAuthRulePatterns"] = pub
    if sub is not None:
        rules["subAuthRulePatterns"] = sub
    value = {"clientId": client_id, "userName": username,
             "password": hash_password(password, rounds=4) if password else None, "authRules": rules}
    key = f"mixed|{client_id}|{username}" if client_id and username else (
        f"username|{username}" if username else f"client_id|{client_id}")
    return add(h, name, CredentialsType.MQTT_BASIC, key, value, **kw)


# -- basic -----------------------------------------------------------------------

@pytest.mark.parametrize("level,bad,anonymous", [(5, 0x86, 0x87), (4, 0x04, 0x05)])
def test_basic_password(level, bad, anonymous):
    """A wrong password and an unknown user name get the same answer, so a
    refusal does not tell which user names exist; a client that sent no
    credentials at all is not authorized."""
    h = harness()
    basic(h)
    assert h.client("a", level, username="user", password=b"pw").connack.reason_code == 0
    assert h.client("b", level, username="user", password=b"nope").connack.reason_code == bad
    assert h.client("c", level, username="who", password=b"pw").connack.reason_code == bad
    assert h.client("d", level, username="user").connack.reason_code == bad
    assert h.client("e", level, username="who").connack.reason_code == bad
    assert h.client("f", level).connack.reason_code == anonymous


def test_unknown_user_takes_as_long_as_a_wrong_password():
    """An unknown user name costs a bcrypt check at the default cost, as a
    wrong password of credentials hashed at that cost does."""
    h = harness()
    add(h, "dev", CredentialsType.MQTT_BASIC, "username|user",
        {"userName": "user", "password": hash_password("pw", rounds=DEFAULT_ROUNDS)})

    def refusal(username: str) -> float:
        times = []
        for i in range(3):
            start = time.perf_counter()
            client = h.client(f"{username}-{i}", 5, username=username, password=b"wrong")
            assert client.connack.reason_code == 0x86
            times.append(time.perf_counter() - start)
        return sorted(times)[1]

    wrong, unknown = refusal("user"), refusal("nobody")
    one_check = min(wrong, unknown)
    assert one_check > 0.01  # bcrypt at 10 rounds: tens of milliseconds
    assert 0.5 < unknown / wrong < 2.0, (unknown, wrong)


def test_basic_by_client_id_and_client_type():
    h = harness()
    basic(h, username=None, client_id="dev-1", password=None, client_type=ClientType.APPLICATION)
    c = h.client("dev-1", 5, clean_start=False, properties={Property.SESSION_EXPIRY_INTERVAL: 60})
    assert c.connack.reason_code == 0
    assert h.broker.sessions.sessions["dev-1"].client_type is ClientType.APPLICATION


def test_basic_credentials_saved_after_anonymous_logins_are_found():
    """Anonymous clients connect while the store holds no MQTT_BASIC
    credentials (no lookup key is made for them); credentials saved later
    authenticate the next CONNECT that matches them."""
    h = harness(allow_anonymous=True)
    first = h.client("dev-1", 5, clean_start=False, properties={Property.SESSION_EXPIRY_INTERVAL: 60})
    assert first.connack.reason_code == 0
    assert h.broker.sessions.sessions["dev-1"].client_type is ClientType.DEVICE
    first.lose()
    basic(h, username=None, client_id="dev-1", password=None, client_type=ClientType.APPLICATION)
    c = h.client("dev-1", 5, clean_start=False, properties={Property.SESSION_EXPIRY_INTERVAL: 60})
    assert c.connack.reason_code == 0
    assert h.broker.sessions.sessions["dev-1"].client_type is ClientType.APPLICATION


def test_anonymous_setting():
    h = harness(allow_anonymous=True)
    assert h.client("anon", 5).connack.reason_code == 0


def test_unknown_authentication_method_gets_0x8c():
    h = harness(allow_anonymous=True)
    c = h.client("x", 5, properties={Property.AUTHENTICATION_METHOD: "KERBEROS"})
    assert c.connack.reason_code == 0x8C


def test_providers_can_be_switched_off():
    h = harness(providers=["jwt"])
    basic(h)
    assert h.client("a", 5, username="user", password=b"pw").connack.reason_code == 0x86


# -- authorization -------------------------------------------------------------------

@pytest.mark.parametrize("level", [4, 5])
def test_publish_and_subscribe_rules(level):
    h = harness(allow_anonymous=True)
    basic(h, pub=["sensors/${clientId}/.*"], sub=["cmd/${clientId}/#", "cmd/all"])
    c = h.client("d1", level, username="user", password=b"pw")
    c.send(Subscribe(1, [SubscriptionRequest("cmd/d1/#", 1), SubscriptionRequest("cmd/d2/#", 1)]))
    assert c.received() == [Suback(1, [1, 0x87 if level == 5 else 0x80])]
    watcher = h.client("w", 5)
    watcher.send(Subscribe(1, [SubscriptionRequest("#", 1)]))
    watcher.received()
    c.send(Publish("sensors/d1/t", b"ok", qos=1, packet_id=1),
           Publish("sensors/d2/t", b"denied", qos=1, packet_id=2),
           Publish("sensors/d2/t", b"denied", qos=2, packet_id=3))
    denied = 0x87 if level == 5 else 0
    assert c.received() == [Puback(1), Puback(2, denied), Pubrec(3, denied)]
    assert [m.payload for m in watcher.received()] == [b"ok"]


def test_will_topic_must_be_authorized():
    h = harness()
    basic(h, pub=["ok/.*"])
    c = h.client("d", 5, username="user", password=b"pw", will=Will("secret/x", b"w"))
    assert c.connack.reason_code == 0x87


def test_changed_rules_apply_without_reconnect():
    h = harness()
    creds = basic(h, pub=["a/.*"], sub=["a/#", "b/#"])
    c = h.client("d", 5, username="user", password=b"pw")
    c.send(Subscribe(1, [SubscriptionRequest("b/#", 0)]))
    assert c.received() == [Suback(1, [0])]
    c.send(Publish("a/1", b"x", qos=1, packet_id=1))
    assert c.received() == [Puback(1)]
    creds.value["authRules"] = {"pubAuthRulePatterns": ["z/.*"], "subAuthRulePatterns": ["a/#"]}
    h.broker.credential_store.save(creds)
    h.clock.advance(1.01)
    c.send(Publish("a/1", b"x", qos=1, packet_id=2), Publish("z/1", b"y", qos=1, packet_id=3))
    assert c.received() == [Puback(2, 0x87), Puback(3)]
    assert list(h.broker.sessions.sessions["d"].subscriptions) == []  # b/# no longer allowed
    assert not c.closed


def test_deleted_credentials_disconnect():
    h = harness()
    creds = basic(h)
    c = h.client("d", 5, username="user", password=b"pw")
    h.broker.credential_store.delete(creds.id)
    h.clock.advance(1.01)
    assert c.received() == [Disconnect(0x87)] and c.closed


def test_asynchronous_authorization_keeps_order():
    class Slow:
        def __init__(self):
            self.pending = []

        @hookimpl
        def tbmq_authorize_publish(self, session, auth, topic):
            d = defer.Deferred()
            self.pending.append(d)
            return d

    h = harness(allow_anonymous=True)
    slow = Slow()
    h.plugins.register(slow, name="slow")
    h.broker.refresh_hooks()
    c = h.client("c", 4)
    c.send(Publish("t", b"1", qos=1, packet_id=1), Publish("t", b"2", qos=1, packet_id=2))
    assert c.received() == [] and len(slow.pending) == 1
    slow.pending[0].callback(True)  # a Deferred is an answer (firstresult)
    assert len(slow.pending) == 2
    slow.pending[1].callback(False)
    assert c.received() == [Puback(1), Puback(2)]


class Counting:
    """Allows everything and counts how often it is asked."""

    def __init__(self):
        self.asked = []

    @hookimpl(tryfirst=True)
    def tbmq_authorize_publish(self, session, auth, topic):
        self.asked.append(topic)
        return True


def test_publish_authorization_is_cached_per_connection_until_its_rules_change():
    h = harness(allow_anonymous=True)
    counting = Counting()
    h.plugins.register(counting, name="counting")
    h.broker.refresh_hooks()
    c = h.client("c", 5)
    c.send(*[Publish("t/a", b"%d" % i) for i in range(5)], Publish("t/b", b"x"))
    assert counting.asked == ["t/a", "t/b"]
    c.protocol.auth = dataclasses.replace(c.protocol.auth)  # new rules bound
    c.send(Publish("t/a", b"again"))
    assert counting.asked == ["t/a", "t/b", "t/a"]
    h.clock.advance(h.config.auth.cache_ttl)
    c.send(Publish("t/a", b"later"))
    assert counting.asked[-1] == "t/a" and len(counting.asked) == 4


def test_publish_authorization_cache_size_0_asks_every_time():
    h = harness(allow_anonymous=True, cache_size=0)
    counting = Counting()
    h.plugins.register(counting, name="counting")
    h.broker.refresh_hooks()
    c = h.client("c", 5)
    c.send(*[Publish("t/a", b"%d" % i) for i in range(3)])
    assert counting.asked == ["t/a"] * 3


# -- SCRAM (MQTT 5 enhanced authentication) ---------------------------------------------

def scram_setup(h, algorithm="SHA256", password="pencil"):
    value = scram_credentials(password, algorithm)
    value.update(userName="user", authRules={})
    add(h, "scram", CredentialsType.SCRAM, f"scram|{algorithm}|user", value,
        client_type=ClientType.APPLICATION)


@pytest.mark.parametrize("method,algorithm", [("SCRAM-SHA-256", "SHA256"), ("SCRAM-SHA-512", "SHA512")])
def test_scram_exchange(method, algorithm):
    h = harness()
    scram_setup(h, algorithm)
    client = scramp.ScramClient([method], "user", "pencil")
    c = h.raw(level=5)
    c.send(Connect(protocol_level=5, client_id="app", properties={
        Property.AUTHENTICATION_METHOD: method,
        Property.AUTHENTICATION_DATA: client.get_client_first().encode()}))
    (auth,) = c.received()
    assert isinstance(auth, Auth) and auth.reason_code == 0x18
    client.set_server_first(auth.properties[Property.AUTHENTICATION_DATA].decode())
    c.send(Auth(0x18, {Property.AUTHENTICATION_METHOD: method,
                       Property.AUTHENTICATION_DATA: client.get_client_final().encode()}))
    (connack,) = c.received()
    assert connack.reason_code == 0
    assert connack.properties[Property.AUTHENTICATION_METHOD] == method
    client.set_server_final(connack.properties[Property.AUTHENTICATION_DATA].decode())  # verifies the server
    # re-authentication with the same method [MQTT-4.12.1]
    client = scramp.ScramClient([method], "user", "pencil")
    c.send(Auth(0x19, {Property.AUTHENTICATION_METHOD: method,
                       Property.AUTHENTICATION_DATA: client.get_client_first().encode()}))
    (auth,) = c.received()
    client.set_server_first(auth.properties[Property.AUTHENTICATION_DATA].decode())
    c.send(Auth(0x18, {Property.AUTHENTICATION_METHOD: method,
                       Property.AUTHENTICATION_DATA: client.get_client_final().encode()}))
    (done,) = c.received()
    assert done.reason_code == 0 and not c.closed


def test_scram_wrong_password():
    h = harness()
    scram_setup(h)
    client = scramp.ScramClient(["SCRAM-SHA-256"], "user", "wrong")
    c = h.raw(level=5)
    c.send(Connect(protocol_level=5, client_id="app", properties={
        Property.AUTHENTICATION_METHOD: "SCRAM-SHA-256",
        Property.AUTHENTICATION_DATA: client.get_client_first().encode()}))
    (auth,) = c.received()
    client.set_server_first(auth.properties[Property.AUTHENTICATION_DATA].decode())
    c.send(Auth(0x18, {Property.AUTHENTICATION_METHOD: "SCRAM-SHA-256",
                       Property.AUTHENTICATION_DATA: client.get_client_final().encode()}))
    (connack,) = c.received()
    assert connack.reason_code == 0x86 and c.closed


# -- JWT -----------------------------------------------------------------------------

def token(**claims):
    claims.setdefault("exp", int(time.time()) + 60)
    return jwt.encode(claims, SECRET, algorithm="HS256").encode()


def test_jwt_valid_expired_and_forged():
    h = harness()
    ok = h.client("j1", 5, username="any", password=token(client_type="APPLICATION"))
    assert ok.connack.reason_code == 0
    expired = h.client("j2", 5, username="any", password=token(exp=int(time.time()) - 10))
    assert expired.connack.reason_code == 0x86
    forged = jwt.encode({"exp": int(time.time()) + 60}, "another-key-0123456789abcdef0123",
                        algorithm="HS256").encode()
    assert h.client("j3", 4, username="any", password=forged).connack.reason_code == 0x04


def test_jwt_claims_give_rules():
    h = harness()
    c = h.client("j", 5, username="u", password=token(pub=["up/${clientId}"], sub_rules=["down/#"]))
    c.send(Publish("up/j", b"1", qos=1, packet_id=1), Publish("up/k", b"2", qos=1, packet_id=2))
    assert c.received() == [Puback(1), Puback(2, 0x87)]
