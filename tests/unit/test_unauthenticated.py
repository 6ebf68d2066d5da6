"""What a client may cost before it is authenticated, or as an anonymous
client (issue 12, items 9-11), at the protocol level: raw packets on
StringTransport and task.Clock, the exact reason code or behaviour asserted.

9. failed logins: bans with expiry per client id and per address, the
   password checks in flight per address and per node, a check skipped
   once its connection is gone, the log lines;
10. memory before login: the largest packet read before CONNECT, and a
    packet not completed in time;
11. session expiry: finite by default, shorter for anonymous clients, and
    persistent sessions per address.
"""

from __future__ import annotations

import pytest
from twisted.internet import defer

from tbmq.auth import passwords
from tbmq.auth.guard import SUMMARY_INTERVAL, TRUSTED_FOR, LoginGuard
from tbmq.auth.passwords import check_password, hash_password
from tbmq.config import LoginLimitsConfig
from tbmq.model import Credentials, CredentialsType
from tbmq.mqtt import Connack, Connect, Disconnect, Property, Puback, Publish, Will
from tbmq.mqtt.codec import encode
from tests.helpers import Harness


class Checks:
    """bcrypt in the test's thread, counted; ``hold`` keeps the answers
    until :meth:`release` (checks still running)."""

    def __init__(self) -> None:
        self.count = 0
        self.hold = False
        self.held: list = []

    def __call__(self, password, hashed, reactor=None, threadpool=None, cancelled=None):
        if cancelled is not None and cancelled():
            return defer.succeed(False)
        self.count += 1
        if self.hold:
            d = defer.Deferred()
            self.held.append((d, check_password(password, hashed)))
            return d
        return defer.succeed(check_password(password, hashed))

    def release(self) -> None:
        held, self.held = self.held, []
        for d, answer in held:
            d.callback(answer)


@pytest.fixture
def checks(monkeypatch):
    c = Checks()
    monkeypatch.setattr(passwords, "check_password_async", c)
    return c


def broker(**limits):
    settings = {"allow_anonymous": False, "login_limits": limits}
    h = Harness({"auth": settings}, entry_points=True)
    for name, password in (("user", "pw"), ("other", "pw2")):
        credentials = Credentials(name, name, CredentialsType.MQTT_BASIC, f"username|{name}",
                                  value={"userName": name,
                                         "password": hash_password(password, rounds=4)})
        assert h.broker.credential_store.save(credentials).called
    return h


def login(h, client_id, password, level=5, username="user", peer=None):
    """:returns: the CONNACK's reason code (None: no answer yet)."""
    c = h.client(client_id, level, peer=peer, username=username, password=password)
    return c.connack.reason_code if c.connack is not None else None


# -- 9. failed logins ------------------------------------------------------------------


@pytest.mark.parametrize("level, wrong, banned", [(5, 0x86, 0x8A), (4, 0x04, 0x05)])
def test_client_id_banned_after_its_failures_until_the_ban_ends(checks, level, wrong, banned):
    """``max_failures_per_client_id`` wrong passwords ban the client id:
    0x8A Banned (v3: 0x05) with no password checked, the right one too,
    until ``ban_time`` has passed."""
    h = broker(max_failures_per_client_id=3, ban_time=100, max_failures_per_address=0)
    assert [login(h, "dev-1", b"nope", level) for _ in range(3)] == [wrong] * 3
    assert checks.count == 3
    assert login(h, "dev-1", b"pw", level) == banned
    assert login(h, "dev-1", b"nope", level) == banned
    assert checks.count == 3  # no bcrypt for a banned client id
    assert login(h, "dev-2", b"pw", level) == 0  # another client id is not banned
    h.clock.advance(100)
    assert login(h, "dev-1", b"pw", level) == 0


def test_logins_refused_without_a_check_are_counted_and_ban_the_client_id(checks):
    """A CONNECT without a password holds no attempt of the guard, yet its
    refusal (NOT_AUTHORIZED) counts as a failure: ``max_failures_per_client_id``
    of them ban the client id, and its right password is then refused too."""
    h = broker(max_failures_per_client_id=2, ban_time=100, max_failures_per_address=0)
    assert [login(h, "dev", None, username=None) for _ in range(2)] == [0x87, 0x87]
    assert checks.count == 0
    assert login(h, "dev", b"pw") == 0x8A
    assert checks.count == 0
    assert login(h, "dev-2", b"pw") == 0


def test_failures_are_counted_over_the_window(checks):
    h = broker(max_failures_per_client_id=3, window=10, max_failures_per_address=0)
    for _ in range(4):
        assert [login(h, "dev", b"nope") for _ in range(2)] == [0x86, 0x86]
        h.clock.advance(10)  # two per window: never three
    assert login(h, "dev", b"pw") == 0


def test_a_login_forgets_the_client_ids_failures(checks):
    h = broker(max_failures_per_client_id=3, max_failures_per_address=0)
    assert [login(h, "dev", b"nope") for _ in range(2)] == [0x86, 0x86]
    assert login(h, "dev", b"pw") == 0
    assert [login(h, "dev", b"nope") for _ in range(2)] == [0x86, 0x86]
    assert login(h, "dev", b"pw") == 0


def test_a_banned_address_refuses_the_names_that_failed_and_checks_the_others(checks, log):
    """After ``max_failures_per_address`` failures from an address, what
    repeats a failed user name or client id from it gets 0x8A at once; a
    client id and user name without failures is still checked, so a good
    client behind the same address gets in; other addresses are not
    banned."""
    h = broker(max_failures_per_address=5, max_failures_per_client_id=0, ban_time=60)
    assert [login(h, f"flood-{i}", b"guess") for i in range(5)] == [0x86] * 5
    assert any("address 192.168.1.1 banned for 60 s: 5 failed logins" in line for line in log)
    assert login(h, "flood-new", b"guess") == 0x8A  # user "user" failed: refused
    assert login(h, "flood-0", b"guess", username="other") == 0x8A  # client id failed
    assert checks.count == 5
    assert login(h, "good", b"pw2", username="other") == 0  # checked, in
    assert login(h, "flood-x", b"guess", peer="10.0.0.2") == 0x86  # another address
    assert checks.count == 7
    h.clock.advance(60)
    assert login(h, "flood-new", b"pw") == 0


@pytest.mark.parametrize("level, busy", [(5, 0x89), (4, 0x03)])
def test_password_checks_in_flight_are_capped_per_address(checks, level, busy):
    """``max_checks_per_address`` checks from one address at once; one more
    gets 0x89 Server busy (v3: 0x03) at once, another address does not; a
    client id that logged in from the address before has a place of its
    own."""
    h = broker(max_checks_per_address=2)
    assert login(h, "known", b"pw", level) == 0
    checks.hold = True
    pending = [h.client(f"c{i}", level, username="user", password=b"pw") for i in range(2)]
    assert [c.connack for c in pending] == [None, None]
    assert login(h, "third", b"pw", level) == busy
    elsewhere = h.client("there", level, peer="10.0.0.2", username="user", password=b"pw")
    assert elsewhere.connack is None  # being checked
    trusted = h.client("known", level, username="user", password=b"pw")
    assert trusted.connack is None  # being checked: its own place
    assert checks.count == 1 + 4
    checks.release()
    assert [c.received()[0].reason_code for c in (*pending, elsewhere, trusted)] == [0] * 4
    checks.hold = False
    assert login(h, "fourth", b"pw", level) == 0  # the places are free again


def test_the_last_place_of_an_address_is_kept_for_names_without_failures(checks):
    """A user name that failed holds one of the address's two places at
    most, before any ban: a new client keeps the other."""
    h = broker(max_checks_per_address=2, max_failures_per_address=0,
               max_failures_per_client_id=0)
    assert login(h, "guess-0", b"nope") == 0x86  # "user" failed once
    checks.hold = True
    guessing = h.client("guess-1", 5, username="user", password=b"nope")
    assert guessing.connack is None
    assert login(h, "guess-2", b"nope") == 0x89  # a second place for "user": no
    good = h.client("good", 5, username="other", password=b"pw2")
    assert good.connack is None  # the kept place
    checks.release()
    assert [guessing.received()[0].reason_code, good.received()[0].reason_code] == [0x86, 0]


def test_password_checks_in_flight_are_capped_on_the_node(checks):
    h = broker(max_checks=3, max_checks_per_address=0)
    checks.hold = True
    pending = [h.client(f"c{i}", peer=f"10.0.0.{i}", username="user", password=b"pw")
               for i in range(3)]
    assert login(h, "more", b"pw", peer="10.0.1.1") == 0x89
    checks.release()
    assert [c.received()[0].reason_code for c in pending] == [0, 0, 0]


def test_the_check_of_a_closed_connection_is_skipped_and_not_counted(checks):
    """A connection gone before its check starts costs no bcrypt and counts
    no failure; its place is held until the pool answers.  A check that ran
    counts its failure even when the client left."""
    h = broker(max_checks_per_address=1, max_failures_per_client_id=1)
    guard = h.factory.ctx.guard
    real, calls = guard.checks.check, []

    def held(password, hashed, cancelled):
        calls.append((cancelled, defer.Deferred()))
        return calls[-1][1]

    guard.checks.check = held
    c = h.client("gone", username="user", password=b"nope")
    assert c.connack is None and guard.in_flight == 1
    c.lose()
    cancelled, answer = calls.pop()
    assert cancelled() is True  # the pool skips it
    assert login(h, "other", b"pw") == 0x89  # the place is held until the answer
    answer.callback(False)
    assert guard.in_flight == 0
    left = h.client("left", username="user", password=b"nope")
    left.lose()
    calls.pop()[1].callback(False)  # checked before the pool saw the close
    guard.checks.check = real
    assert login(h, "gone", b"pw") == 0  # not counted: not banned
    assert login(h, "left", b"pw") == 0x8A  # counted: banned
    assert checks.count == 1


def test_connect_pending_past_the_connect_timeout_is_logged_as_such(checks, log):
    """A CONNECT that arrived but whose authentication outlasted
    ``mqtt.connect_timeout`` is not logged as "no CONNECT"."""
    h = broker()
    checks.hold = True
    c = h.client("slow", username="user", password=b"pw")
    h.clock.advance(h.config.mqtt.connect_timeout)
    assert c.closed
    lines = [line for line in log if "slow" in line]
    assert any("CONNECT of slow from 192.168.1.1 not accepted 10 s after" in line
               for line in lines), lines
    assert not any("no CONNECT" in line for line in log)
    idle = h.raw()
    h.clock.advance(h.config.mqtt.connect_timeout)
    assert idle.closed
    assert any("no CONNECT from 192.168.1.1 in 10 s" in line for line in log)


def test_refusals_without_a_check_are_counted_in_one_line(checks, log):
    h = broker(max_failures_per_client_id=1, max_failures_per_address=0)
    assert login(h, "dev", b"nope") == 0x86
    assert [login(h, "dev", b"nope") for _ in range(50)] == [0x8A] * 50
    assert not any("refused without a password check" in line for line in log)
    h.clock.advance(SUMMARY_INTERVAL)
    assert any("50 logins refused without a password check in the last 10 s: 50 banned "
               "(0x8A), 0 server busy (0x89)" in line for line in log), log
    assert sum("dev" in line and "refused" in line for line in log) <= 2


def test_guard_state_is_bounded(monkeypatch):
    """Failures, bans and trusted clients are remembered for at most
    MAX_TRACKED sources, the oldest forgotten first."""
    from tbmq.auth import guard as guard_module
    from twisted.internet import task

    monkeypatch.setattr(guard_module, "MAX_TRACKED", 10)
    clock = task.Clock()
    g = LoginGuard(LoginLimitsConfig(max_failures_per_client_id=1), clock)
    for i in range(50):
        attempt = g.admit(f"10.0.0.{i}", f"c{i}", f"u{i}", costly=True)
        g.done(attempt, True)
        ok = g.admit(f"10.1.0.{i}", f"ok{i}", None, costly=True)
        g.done(ok, False)
    assert len(g._failures) <= 10 and len(g._bans) <= 10 and len(g._trusted) <= 10
    assert g.banned("client_id", "c49") is not None and g.banned("client_id", "c0") is None
    assert g.in_flight == 0


def test_a_trusted_client_is_trusted_for_a_day_and_until_it_fails():
    from twisted.internet import task

    clock = task.Clock()
    g = LoginGuard(LoginLimitsConfig(max_checks_per_address=1), clock)
    g.done(g.admit("10.0.0.1", "dev", "u", costly=True), False)
    flood = g.admit("10.0.0.1", "x", "y", costly=True)
    assert g.admit("10.0.0.1", "dev", "u", costly=True).trusted
    clock.advance(TRUSTED_FOR)
    assert g.admit("10.0.0.1", "dev", "u", costly=True).refusal == 0x89
    g.done(flood, True)
    g.done(g.admit("10.0.0.1", "dev", "u", costly=True), False)
    g.done(g.admit("10.0.0.1", "dev", "u", costly=True), True)  # trusted, failed
    g.admit("10.0.0.1", "x", "y", costly=True)
    assert g.admit("10.0.0.1", "dev", "u", costly=True).refusal == 0x89


def test_a_login_without_a_check_leaves_nothing_but_a_ban_still_refuses_it():
    """A CONNECT without a password holds no place and leaves no trace
    while nothing is banned; once its client id is banned, or its address
    with a failure of its client id, it is refused as a costly one is."""
    from twisted.internet import task

    clock = task.Clock()
    g = LoginGuard(LoginLimitsConfig(max_failures_per_client_id=5, max_failures_per_address=1),
                   clock)
    assert g.admit("10.0.0.1", "dev", None, costly=False) is None  # no Attempt kept
    assert not g._trusted and not g._in_flight and g.in_flight == 0 and not g._failures
    g.done(g.admit("10.0.0.1", "dev", None, costly=True), True)  # bans the address
    assert g.admit("10.0.0.1", "dev", None, costly=False).refusal == 0x8A
    assert g.admit("10.0.0.1", "other", None, costly=False).refusal is None
    assert g.admit("10.0.0.2", "dev", None, costly=False).refusal is None
    by_id = LoginGuard(LoginLimitsConfig(max_failures_per_client_id=1), clock)
    by_id.done(by_id.admit("10.0.0.1", "dev", None, costly=True), True)  # bans "dev"
    assert by_id.admit("10.0.0.2", "dev", None, costly=False).refusal == 0x8A


# -- 10. memory before login -------------------------------------------------------------

ANNOUNCE_256MB = bytes([0x10, 0xFF, 0xFF, 0xFF, 0x7F])


def connect_of_size(size: int, level: int = 4) -> bytes:
    """A CONNECT of exactly ``size`` bytes (its will payload fills it)."""
    def build(n):
        return encode(Connect(client_id="big", protocol_level=level, will=Will("w", b"x" * n)),
                      level)
    n = size - len(build(0))
    for _ in range(3):  # the remaining length's own bytes grow with n
        n += size - len(build(n))
    data = build(n)
    assert len(data) == size
    return data


@pytest.mark.parametrize("first", [ANNOUNCE_256MB, connect_of_size(65537)[:5]],
                         ids=["256MB", "64KB+1"])
def test_before_connect_a_larger_packet_closes_the_connection_unread(first, log):
    """Only ``mqtt.max_connect_packet_size`` (64 KB) is read before a
    CONNECT is accepted: announcing more closes the connection as soon as
    the fixed header is read, nothing buffered."""
    h = Harness()
    c = h.raw(4)
    c.send_bytes(first)
    assert c.closed
    assert c.protocol.decoder.pending == 0
    assert c.transport.value() == b""
    assert any("exceeds the maximum CONNECT size 65536" in line for line in log), log


def test_a_connect_at_the_limit_then_a_larger_publish_are_read():
    h = Harness()
    c = h.raw(4)
    publish = encode(Publish("t", b"p" * 200_000, qos=1, packet_id=1), 4)
    c.send_bytes(connect_of_size(65536) + publish)
    assert c.received() == [Connack(False, 0), Puback(1)]


def test_the_limit_before_connect_is_configurable():
    h = Harness({"mqtt": {"max_connect_packet_size": 1024}})
    c = h.raw(4)
    c.send_bytes(connect_of_size(1025))
    assert c.closed
    assert h.client("small").connack.reason_code == 0


@pytest.mark.parametrize("level", [4, 5])
def test_a_packet_not_completed_in_time_closes_the_connection(level, log):
    """With keep alive 0 nothing else would time out a half-sent packet:
    ``mqtt.incomplete_packet_timeout`` (60 s) does; v5 gets DISCONNECT 0x8D."""
    h = Harness({"mqtt": {"max_keep_alive": 0}})
    c = h.client("slow", level, keep_alive=0)
    assert c.connack.reason_code == 0
    publish = encode(Publish("t", b"p" * 1000, qos=0), level)
    c.send_bytes(publish[:500])
    h.clock.advance(59)
    assert not c.closed
    h.clock.advance(1)
    assert c.closed
    assert c.received() == ([Disconnect(0x8D, {Property.REASON_STRING: "packet not complete in time"})]
                            if level == 5 else [])
    assert any("packet from slow not complete 60 s after it began (500 bytes of it read)"
               in line for line in log), log


def test_packets_that_keep_arriving_are_not_timed_out():
    """Reads that each end inside a packet, over longer than the timeout:
    each packet is complete within it."""
    h = Harness({"mqtt": {"max_keep_alive": 0, "incomplete_packet_timeout": 10}})
    c = h.client("stream", 4, keep_alive=0)
    data = b"".join(encode(Publish("t", b"%03d" % i, qos=0), 4) for i in range(40))
    for i in range(0, len(data), 7):
        c.send_bytes(data[i:i + 7])
        h.clock.advance(1)
    assert not c.closed


def test_a_paused_reader_does_not_time_its_client_out():
    """While the broker does not read (back-pressure), the client cannot
    complete its packet: the time starts again when reading resumes."""
    h = Harness({"mqtt": {"max_keep_alive": 0, "incomplete_packet_timeout": 10}})
    c = h.client("paused", 4, keep_alive=0)
    c.send_bytes(encode(Publish("t", b"x" * 100, qos=0), 4)[:50])
    c.protocol.pause_reading()
    h.clock.advance(30)
    assert not c.closed
    c.protocol.resume_reading()
    h.clock.advance(9)
    assert not c.closed
    h.clock.advance(1)
    assert c.closed


# -- 11. session expiry and persistent sessions per address ------------------------------

ASK_NEVER = {Property.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF}


def test_session_expiry_is_finite_and_shorter_for_anonymous_clients(checks):
    """A v5 client asking for a session that never expires gets
    ``mqtt.max_session_expiry_interval`` (7 days), an anonymous one
    ``auth.anonymous_max_session_expiry`` (1 hour), told in CONNACK."""
    h = Harness({"auth": {"allow_anonymous": True}}, entry_points=True)
    credentials = Credentials("u", "u", CredentialsType.MQTT_BASIC, "username|user",
                              value={"userName": "user", "password": hash_password("pw", rounds=4)})
    assert h.broker.credential_store.save(credentials).called
    anonymous = h.client("anon", 5, properties=ASK_NEVER)
    known = h.client("known", 5, properties=ASK_NEVER, username="user", password=b"pw")
    assert anonymous.connack.properties[Property.SESSION_EXPIRY_INTERVAL] == 3600
    assert known.connack.properties[Property.SESSION_EXPIRY_INTERVAL] == 604800
    # nor may DISCONNECT lengthen it past the cap
    anonymous.send(Disconnect(0, {Property.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFE}))
    assert h.broker.sessions.sessions["anon"].expiry_interval == 3600


@pytest.mark.parametrize("level", [4, 5])
def test_an_anonymous_persistent_session_ends_an_hour_after_its_client_left(level):
    h = Harness()
    persistent = {"clean_start": False} if level == 4 else {"properties": ASK_NEVER}
    c = h.client("anon", level, **persistent)
    assert c.connack.reason_code == 0
    c.lose()
    sessions = h.broker.sessions.sessions
    h.clock.advance(3599)
    assert "anon" in sessions
    h.clock.advance(1)
    assert "anon" not in sessions
    again = h.client("anon", level, **({"clean_start": False} if level == 4 else {}))
    assert again.connack.session_present is False


@pytest.mark.parametrize("level, quota", [(5, 0x97), (4, 0x03)])
def test_persistent_sessions_per_address_are_capped(level, quota, log):
    """``mqtt.max_persistent_sessions_per_address`` new persistent sessions
    from one address; one more gets 0x97 Quota exceeded (v3: 0x03).
    Resuming or replacing one, a non-persistent session, another address
    and a session that ended are not held to it."""
    h = Harness({"mqtt": {"max_persistent_sessions_per_address": 2}})
    persistent = {"clean_start": False}
    if level == 5:
        persistent["properties"] = {Property.SESSION_EXPIRY_INTERVAL: 100}
    assert [h.client(f"p{i}", level, **persistent).connack.reason_code
            for i in range(3)] == [0, 0, quota]
    assert any("2 persistent sessions from 192.168.1.1 already" in line for line in log)
    assert h.client("n", level).connack.reason_code == 0  # not persistent
    resumed = h.client("p0", level, **persistent)
    assert (resumed.connack.reason_code, resumed.connack.session_present) == (0, True)
    assert h.client("p1", level, **{**persistent, "clean_start": True}).connack.reason_code == 0
    assert h.client("p2", level, peer="10.0.0.2", **persistent).connack.reason_code == 0
    h.client("p1", level)  # a clean, non-persistent session ends p1's
    assert h.client("p3", level, **persistent).connack.reason_code == 0
    assert h.broker.sessions.persistent_from("192.168.1.1") == 2
