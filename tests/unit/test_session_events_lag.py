"""A Clean Start 0 reconnect to another node while the deciding member's
session registry lags its grants (:mod:`tbmq.cluster.session_events`): the
member that decides a client id answers from the registry's record or from
its own later grant whose record it has not read yet (TBMQ's deciding node
writes the session record itself, so its view holds its grants at once),
so the session a node was granted moments ago is present for the next
connect [MQTT-3.2.2-2] and its connection is dropped there [MQTT-3.1.4-3].
The other side of the same lag: a session that expired ends through that
member (:meth:`SessionEvents.request_end`), so the next connect finds no
session though the registry has not read the end's tombstone yet."""

from __future__ import annotations

from twisted.internet import task

from tbmq.cluster.records import (
    CLEAR_SESSION,
    CONNECTION_REQUEST,
    DisconnectCommand,
    Record,
    SessionEvent,
    SessionInfo,
)
from tbmq.cluster.registry import SessionRegistry
from tbmq.cluster.session_events import SessionEvents
from tbmq.cluster.topics import TopicCatalogue
from tbmq.model import ClientType
from tbmq.mqtt import ReasonCode
from tests.unit.test_session_events_batches import AcknowledgingBus, Member


class Replayed(Member):
    """A :class:`Member` whose replay is done (the registry's consumer)."""

    caught_up = None


class LaggingBus(AcknowledgingBus):
    """An :class:`AcknowledgingBus` whose consumers have replayed: the
    registry's reads are the test's (:func:`read`)."""

    def subscribe(self, topic, group, handler, **kw):
        super().subscribe(topic, group, handler, **kw)
        self.members[topic] = member = Replayed()
        return member


def connect(node, session_id, request_id, clean_start=False, persistent=True):
    return SessionEvent(CONNECTION_REQUEST, "x", node, session_id, request_id, clean_start,
                        persistent, ClientType.DEVICE, 3600 if persistent else 0, 5, 100.0)


def deciding(bus=None):
    """Node D: the member deciding client id ``x``; its registry reads
    only what the test hands it (:func:`read`)."""
    bus = bus or LaggingBus()
    clock = task.Clock()
    clock.advance(100)
    topics = TopicCatalogue()
    registry = SessionRegistry(bus, topics.client_session, "node-d", clock)
    registry.start()
    events = SessionEvents(bus, topics, "node-d", registry, clock,
                           drop_local=lambda *a: None, forget_local=lambda *a: None)
    events.start()
    return events, bus


def read(events, bus, info):
    """Node D's registry reads ``info``, a record of ``tbmq.client.session``."""
    handler = bus.subscribed[events.topics.client_session][0]
    handler(Record(events.topics.client_session, info.client_id, info))


def answered(bus, events, node):
    """:returns: the answers sent to ``node``, in order."""
    topic = events.topics.session_event_response(node)
    return [r for t, _, values, _ in bus.many if t == topic for r in values]


def disconnects(bus, events, node):
    topic = events.topics.client_disconnect(node)
    return [v for t, _, v, _ in bus.published if t == topic]


def record_of(answer, node, session_id, connected=True):
    """Node ``node``'s record of the connection ``answer`` granted."""
    return SessionInfo("x", node, session_id, connected, True, ClientType.DEVICE, 3600, 5,
                       10.0, None if connected else 11.0, 11.0, stamp=answer.stamp)


def test_a_reconnect_to_another_node_finds_the_session_granted_before_its_record_was_read():
    events, bus = deciding()
    events._decide_many((connect("node-a", "sa", "r1"),))
    first, = answered(bus, events, "node-a")
    assert not first.session_present and first.session is None
    # the client reconnects to node B, Clean Start 0, before node D's
    # registry read node A's record of its grant
    assert events.registry.get("x") is None
    events._decide_many((connect("node-b", "sb", "r2"),))
    second, = answered(bus, events, "node-b")
    assert second.success and second.session_present
    assert (second.session.service_id, second.session.session_id,
            second.session.persistent, second.session.connected) == ("node-a", "sa", True, True)
    assert second.stamp > first.stamp
    # node A's connection is dropped there at once, as for a registered one
    assert disconnects(bus, events, "node-a") == [
        DisconnectCommand("x", "sa", ReasonCode.SESSION_TAKEN_OVER)]
    # both records land, in either order: node D's view is node B's grant
    read(events, bus, record_of(second, "node-b", "sb"))
    read(events, bus, record_of(first, "node-a", "sa", connected=False))
    assert events.registry.get("x").session_id == "sb"
    events._decide_many((connect("node-a", "sc", "r3"),))
    third = answered(bus, events, "node-a")[-1]
    assert third.session_present and third.session.session_id == "sb"
    assert third.stamp > second.stamp


def test_a_grant_older_than_the_registrys_record_is_not_used():
    """The registry read a later grant's record (of this member's earlier
    process, or of the partition's member before it moved here): the
    answer is the record's, not the older grant's."""
    events, bus = deciding()
    events._decide_many((connect("node-a", "sa", "r1"),))
    first, = answered(bus, events, "node-a")
    later = SessionInfo("x", "node-c", "sc", False, False, ClientType.DEVICE, 0, 5, 10.0,
                        12.0, 12.0, stamp=first.stamp + 10)
    read(events, bus, later)
    events._decide_many((connect("node-b", "sb", "r2"),))
    second, = answered(bus, events, "node-b")
    assert second.session == later and not second.session_present
    assert disconnects(bus, events, "node-a") == []


def test_a_grant_whose_connect_no_longer_waits_is_not_used():
    """A request decided after its connect stopped waiting (older than the
    connect timeout: the asking node refused it, no record of it comes)
    grants nothing the next connect is answered with; a tombstone of an
    older connection (written by a node that had not read the grant)
    leaves a grant in use."""
    events, bus = deciding()
    events.clock.advance(events.timeout + 1)
    events._decide_many((connect("node-a", "sa", "r1"),))
    events._decide_many((SessionEvent(CONNECTION_REQUEST, "x", "node-b", "sb", "r2", False,
                                      True, ClientType.DEVICE, 3600, 5,
                                      events.clock.seconds()),))
    second, = answered(bus, events, "node-b")
    assert not second.session_present and second.session is None
    older = SessionInfo("x", "node-c", "s0", True, False, ClientType.DEVICE, 0, 5, 1.0, None,
                        1.0, stamp=1)
    read(events, bus, older)
    handler = bus.subscribed[events.topics.client_session][0]
    handler(Record(events.topics.client_session, "x", None))
    events._decide_many((SessionEvent(CONNECTION_REQUEST, "x", "node-a", "sc", "r3", False,
                                      True, ClientType.DEVICE, 3600, 5,
                                      events.clock.seconds()),))
    third = answered(bus, events, "node-a")[-1]
    assert third.session_present and third.session.session_id == "sb"


def test_a_clean_start_reconnect_within_the_lag_clears_the_granted_session():
    """Clean Start 1 while the grant's record is not read: no session
    present, but the answer names the session granted, so the asking node
    clears what it left (subscriptions, stored deliveries) [MQTT-3.1.2-4]."""
    events, bus = deciding()
    events._decide_many((connect("node-a", "sa", "r1"),))
    events._decide_many((connect("node-b", "sb", "r2", clean_start=True),))
    second, = answered(bus, events, "node-b")
    assert not second.session_present and second.session.session_id == "sa"
    assert len(disconnects(bus, events, "node-a")) == 1


def test_a_persistent_clean_start_connect_is_not_decided_at_once_by_another_member():
    """A Clean Start 1 connect that makes a persistent session goes to the
    member deciding its client id, so that member knows every session a
    Clean Start 0 connect can ask for; a non-persistent one, which ends
    with its connection, is decided at once where the registry shows
    nothing."""
    events, bus = deciding()
    kept = events.request_connect("p", "sp", clean_start=True, persistent=True,
                                  client_type=ClientType.DEVICE, session_expiry_interval=60,
                                  protocol_level=5)
    assert not kept.called
    clean = events.request_connect("c", "sc", clean_start=True, persistent=False,
                                   client_type=ClientType.DEVICE, session_expiry_interval=0,
                                   protocol_level=5)
    assert clean.called
    assert [k for t, k, *_ in bus.published if t == events.topics.session_event_request] == [
        "p"]


def end(node, session_id, request_id):
    """Node ``node``'s request to end its offline session ``session_id`` of ``x``."""
    return SessionEvent(CLEAR_SESSION, "x", node, session_id, request_id, True, at=100.0)


def offline(node, session_id, stamp):
    return SessionInfo("x", node, session_id, False, True, ClientType.APPLICATION, 3, 5,
                       10.0, 11.0, 11.0, stamp=stamp)


def test_a_reconnect_after_the_session_expired_finds_no_session_before_the_tombstone_is_read():
    """Node A's persistent session expired; node A asks the deciding member
    to end it, which answers yes (no later connection) and remembers the
    end: a Clean Start 0 reconnect to node B decided next presents no
    session [MQTT-3.2.2-2] though node D's registry still shows node A's
    offline record (its tombstone not read yet), and drops nothing."""
    events, bus = deciding()
    read(events, bus, offline("node-a", "sa", 5))
    events._decide_many((end("node-a", "sa", "e1"),))
    ended, = answered(bus, events, "node-a")
    assert (ended.request_id, ended.success) == ("e1", True)
    assert events.registry.get("x").session_id == "sa"  # the tombstone not read yet
    events._decide_many((connect("node-b", "sb", "r2"),))
    second, = answered(bus, events, "node-b")
    assert second.success and not second.session_present and second.session is None
    assert disconnects(bus, events, "node-a") == []
    # the tombstone, then node B's record: the next connect finds node B's session
    handler = bus.subscribed[events.topics.client_session][0]
    handler(Record(events.topics.client_session, "x", None))
    read(events, bus, record_of(second, "node-b", "sb", connected=False))
    events._decide_many((connect("node-a", "sc", "r3"),))
    third = answered(bus, events, "node-a")[-1]
    assert third.session_present and third.session.session_id == "sb"


def test_the_end_of_a_session_whose_connection_is_not_read_yet_waits_for_its_record():
    """A session granted moments ago (its records not read yet: the member
    knows it as connected) is not ended: the holding node asks again
    later; once the registry shows it offline, the end is granted, and a
    connect decided after it presents no session."""
    events, bus = deciding()
    events._decide_many((connect("node-a", "sa", "r1"),))
    first, = answered(bus, events, "node-a")
    events._decide_many((end("node-a", "sa", "e1"),))
    assert answered(bus, events, "node-a")[-1].success is False
    read(events, bus, record_of(first, "node-a", "sa", connected=False))
    events._decide_many((end("node-a", "sa", "e2"),))
    assert answered(bus, events, "node-a")[-1].success is True
    events._decide_many((connect("node-b", "sb", "r2"),))
    second = answered(bus, events, "node-b")[-1]
    assert not second.session_present and second.session is None


def test_the_end_of_a_session_a_later_connection_holds_is_refused():
    """A connection granted after node A's session went offline (its record
    not read yet) holds the session: node A's request to end it is
    answered no, and the next connect still presents the session."""
    events, bus = deciding()
    read(events, bus, offline("node-a", "sa", 5))
    events._decide_many((connect("node-b", "sb", "r1"),))
    assert answered(bus, events, "node-b")[-1].session_present
    events._decide_many((end("node-a", "sa", "e1"),))
    refused = answered(bus, events, "node-a")[-1]
    assert (refused.request_id, refused.success) == ("e1", False)
    events._decide_many((connect("node-c", "sc", "r2"),))
    third = answered(bus, events, "node-c")[-1]
    assert third.session_present and third.session.session_id == "sb"


def test_the_holding_node_ends_its_session_once_the_member_answers():
    """request_end: decided at once where this node's member decides the
    client id and has read its partition; else published as a
    CLEAR_SESSION asked by the holding node, and ``done`` gets the
    member's answer, or True when none comes in time."""
    events, bus = deciding()
    member = bus.members[events.topics.session_event_request]
    member.deciding.add("x")
    read(events, bus, offline("node-d", "sd", 5))
    outcomes = []
    events.request_end("x", "sd", outcomes.append)
    assert outcomes == [True]
    events._decide_many((connect("node-b", "sb", "r1"),))
    assert answered(bus, events, "node-b")[-1].session is None
    member.deciding.clear()
    events.request_end("y", "sy", outcomes.append)
    asked, = [v for t, _, v, *_ in bus.published if t == events.topics.session_event_request]
    assert (asked.kind, asked.client_id, asked.service_id, asked.session_id,
            asked.clean_start) == (CLEAR_SESSION, "y", "node-d", "sy", True)
    assert outcomes == [True]
    events._decide_many((asked,))  # this node's own request, read back: answered in process
    assert outcomes == [True, True]
    events.request_end("z", "sz", outcomes.append)
    events.clock.advance(events.timeout * 1.2)
    assert outcomes == [True, True, True]


def test_a_request_read_again_after_its_session_was_recorded_or_ended_grants_nothing_kept():
    """A connect request read again (its partition moved before the member
    that decided it committed it) after the registry read its
    connection's record, or the end of that persistent session: decided
    again, but its grant is not kept, so the next connect is answered
    from the registry (no session after the end [MQTT-3.2.2-2]) and the
    end of the session is not refused for a connection that no longer
    exists."""
    events, bus = deciding()
    events._decide_many((connect("node-a", "sa", "r1"),))
    first, = answered(bus, events, "node-a")
    read(events, bus, record_of(first, "node-a", "sa", connected=False))
    events._decide_many((connect("node-a", "sa", "r1"),))  # read again: recorded
    events._decide_many((end("node-a", "sa", "e1"),))
    assert answered(bus, events, "node-a")[-1].success is True
    handler = bus.subscribed[events.topics.client_session][0]
    handler(Record(events.topics.client_session, "x", None))
    events._decide_many((connect("node-a", "sa", "r1"),))  # read again: ended
    events._decide_many((connect("node-b", "sb", "r2"),))
    second = answered(bus, events, "node-b")[-1]
    assert not second.session_present and second.session is None
