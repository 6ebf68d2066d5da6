"""The blocked-client list and the unauthorized-client log on the
in-process bus with a fake clock (tbmq/cluster/blocked.py,
tbmq/cluster/unauthorized.py, tbmq/cluster/client_records.py): the
records' encodings, two nodes sharing one bus, matching, expiry with
idempotent tombstones, the list read back from the topic log after a
restart, the log's time to live and its bound."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.cluster.blocked import BlockedClients, InvalidEntry, new_entry
from tbmq.cluster.client_records import BLOCKED, UNAUTHORIZED, UnauthorizedAttempt
from tbmq.cluster.topics import TopicCatalogue
from tbmq.errors import RecordEncodingError
from tbmq.mqtt import ReasonCode
from tbmq.cluster.unauthorized import UnauthorizedLog, refusal_reason
from tests.helpers import MemoryTopicLog

C = TopicCatalogue()
T0 = 1_800_000_000.0


def bus_and_clock(log=None) -> tuple[InProcessBus, Clock]:
    clock = Clock()
    clock.advance(T0)
    bus = InProcessBus(clock=clock, log=log, encode=True)
    assert bus.start().called
    return bus, clock


class FakeConnection:
    """What :class:`BlockedClients` reads of a connection."""

    class Connect:
        def __init__(self, client_id, username):
            self.client_id, self.username = client_id, username

    def __init__(self, client_id, username=None, host="10.0.0.1"):
        self.connect_packet = self.Connect(client_id, username)  # before its CONNACK
        self.session = None
        self._closing = False
        self.host = host
        self.closed_with = None

    def _peer(self):
        return self.host

    def disconnect(self, code, reason=None):
        self.closed_with = (code, reason)
        self._closing = True


def node(bus, clock, service_id, connections=()):
    blocked = BlockedClients(bus, C.client_blocked, service_id, clock, set(connections))
    blocked.start()
    clock.advance(0)
    return blocked


def test_records_round_trip_and_refuse_bad_fields():
    entry = new_entry("regex", "a.*", "username", T0 + 60, T0, "note")
    assert BLOCKED.decode(BLOCKED.encode(entry)) == entry
    assert BLOCKED.decode(None) is None
    attempt = UnauthorizedAttempt("c", "127.0.0.1", None, "r", T0, True, False, "n1")
    assert UNAUTHORIZED.decode(UNAUTHORIZED.encode(attempt)) == attempt
    with pytest.raises(RecordEncodingError, match="type"):
        BLOCKED.encode(entry.__class__("x", "hostname", "v", None, None, T0))


@pytest.mark.parametrize("args,field", [
    (("hostname", "x"), "type"), (("client_id", ""), "value"),
    (("regex", "("), "not a regular expression"), (("regex", "x", "password"), "regex_target"),
    (("username", "x", "client_id"), "only for type regex"),
    (("ip_address", "10.0.0.300"), "not an IP address"),
    (("client_id", "x", None, T0 - 1), "already past"),
])
def test_entries_that_cannot_be_kept_are_refused(args, field):
    with pytest.raises(InvalidEntry, match=field):
        new_entry(*args, now=T0)


def test_the_same_entry_has_the_same_id_and_addresses_are_normalised():
    assert new_entry("client_id", "x").id == new_entry("client_id", "x", expires_at=T0 + 1).id
    assert new_entry("client_id", "x").id != new_entry("username", "x").id
    assert new_entry("ip_address", "2001:DB8:0:0::1").value == "2001:db8::1"
    assert new_entry("regex", "x").regex_target == "client_id"


def test_an_entry_added_on_one_node_matches_on_the_other_and_disconnects_there():
    bus, clock = bus_and_clock()
    victim = FakeConnection("dev-7", "alice")
    other = FakeConnection("dev-8", "bob")
    a = node(bus, clock, "a")
    b = node(bus, clock, "b", [victim, other])
    entry = new_entry("regex", "dev-[0-7]", "client_id", now=T0)
    a.add(entry)
    assert b.entries == {entry.id: entry}
    assert b.match("dev-3", None, "10.9.9.9") == entry
    assert b.match("dev-9", None, "10.9.9.9") is None
    assert victim.closed_with == (ReasonCode.ADMINISTRATIVE_ACTION, "blocked")
    assert other.closed_with is None and b.disconnected == 1
    by_user = new_entry("username", "bob", now=T0)
    by_address = new_entry("ip_address", "10.1.1.1", now=T0)
    b.add(by_user)
    b.add(by_address)
    assert a.match("any", "bob", None) == by_user
    assert a.match("any", None, "10.1.1.1") == by_address
    assert a.match("any", "carol", "10.1.1.2") is None
    assert b.remove(by_user.id) is not None
    assert a.match("any", "bob", None) is None
    assert b.remove(by_user.id) is None  # unknown id


def test_an_entry_expires_on_every_node_and_its_tombstones_are_harmless():
    bus, clock = bus_and_clock()
    a = node(bus, clock, "a")
    b = node(bus, clock, "b")
    entry = new_entry("client_id", "brief", expires_at=T0 + 10, now=T0)
    a.add(entry)
    assert b.match("brief", None, None) == entry
    clock.advance(9.9)
    assert b.match("brief", None, None) == entry
    clock.advance(0.2)  # both nodes' timers fire and publish a tombstone each
    assert a.entries == {} and b.entries == {}
    assert a.match("brief", None, None) is None
    assert bus.held(C.client_blocked) == 0  # the tombstones passed every group
    late = node(bus, clock, "c")  # a node that starts later sees nothing
    assert late.entries == {}


def test_the_list_is_read_back_after_a_restart_and_an_expired_entry_dropped():
    log = MemoryTopicLog()
    bus, clock = bus_and_clock(log)
    first = node(bus, clock, "n")
    kept = new_entry("client_id", "kept", now=T0)
    brief = new_entry("client_id", "brief", expires_at=T0 + 5, now=T0)
    first.add(kept)
    first.add(brief)
    first.stop()
    bus.stop()
    bus2, clock2 = bus_and_clock(log)
    clock2.advance(60)  # down for a minute: brief expired meanwhile
    again = node(bus2, clock2, "n")
    assert again.entries == {kept.id: kept}
    assert again.match("brief", None, None) is None
    clock2.advance(0)  # its tombstone
    bus2.stop()
    bus3, clock3 = bus_and_clock(log)
    assert node(bus3, clock3, "n").entries == {kept.id: kept}


def two_logs(max_entries: int):
    """:returns: the unauthorized-client logs of nodes a and b on one bus
    (ttl 100 s), and the clock."""
    bus, clock = bus_and_clock()
    logs = [UnauthorizedLog(bus, C.client_unauthorized, name, clock, ttl=100,
                            max_entries=max_entries) for name in ("a", "b")]
    for log in logs:
        log.start()
    clock.advance(0)
    return logs[0], logs[1], clock


def test_the_unauthorized_log_is_shared_kept_for_its_ttl_and_bounded():
    a, b, clock = two_logs(max_entries=3)
    reason = refusal_reason(ReasonCode.BAD_USER_NAME_OR_PASSWORD, "basic")
    assert reason == "BAD_USER_NAME_OR_PASSWORD (0x86) by basic"
    b.refused("c1", "10.0.0.1", "u", reason, True, False)
    assert [(x.client_id, x.service_id) for x in a.listing()] == [("c1", "b")]
    clock.advance(60)
    for n in range(2, 6):
        b.refused(f"c{n}", "10.0.0.1", None, reason, False, True)
    assert [x.client_id for x in a.listing()] == ["c5", "c4", "c3"]
    assert a.evicted == 2 and b.evicted == 2
    clock.advance(60)  # the sweep (every min(ttl, 60) s) keeps what is younger than ttl
    assert len(a.attempts) == 3
    clock.advance(60)
    assert a.attempts == {} and a.listing() == []
    b.refused("c6", None, None, reason, False, False)
    cleared = []
    a.clear().addCallback(cleared.append)
    assert cleared == [1] and b.listing() == []
    a.stop()
    b.stop()


def test_a_flood_of_refusals_is_published_at_a_bounded_rate():
    a, b, clock = two_logs(max_entries=1000)
    limit = UnauthorizedLog.MAX_PUBLISHED_PER_SECOND
    for n in range(limit + 50):
        a.refused(f"f{n}", None, None, "r", False, False)
    assert len(b.attempts) == limit and len(a.attempts) == limit + 50
    assert a.local_only == 50
    clock.advance(1)  # the next second publishes again
    a.refused("next", None, None, "r", False, False)
    assert "next" in b.attempts and a.local_only == 50
