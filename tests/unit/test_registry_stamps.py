"""The order stamps of the session registry (:mod:`tbmq.cluster.registry`,
:mod:`tbmq.cluster.session_events`): every grant of a connection is stamped
by the member that decides its client id, every record of the connection
carries the stamp, and every node applies a client id's records by stamp,
not by arrival, so two connects of one client id granted before either
record was read end, on every node, with the later grant."""

from __future__ import annotations

from twisted.internet import task

from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.cluster.records import SessionInfo
from tbmq.cluster.registry import SessionRegistry
from tbmq.cluster.session_events import SessionEvents
from tbmq.cluster.topics import TopicCatalogue
from tbmq.model import ClientType


def info(service_id, session_id, stamp, connected=True):
    return SessionInfo("x", service_id, session_id, connected, True, ClientType.DEVICE, 60, 5,
                       1.0, None, 1.0, stamp=stamp)


def started(service_id="me", seconds=0.0):
    clock = task.Clock()
    clock.advance(seconds)
    topics = TopicCatalogue()
    bus = InProcessBus(clock=clock, catalogue=topics, encode=True)
    bus.start()
    registry = SessionRegistry(bus, topics.client_session, service_id, clock)
    registry.start()
    changes, late = [], []
    registry.listeners.append(lambda c, old, new: changes.append(new))
    registry.stale_listeners.append(lambda c, current, stale: late.append((current, stale)))
    return clock, topics, bus, registry, changes, late


def test_a_client_ids_records_apply_by_stamp_not_by_arrival():
    clock, topics, bus, registry, changes, late = started()
    newer, older = info("node-b", "sb", 20), info("node-a", "sa", 10)
    bus.publish(topics.client_session, "x", newer)
    bus.publish(topics.client_session, "x", older)
    assert registry.get("x") == newer
    assert changes == [newer]  # the listeners never saw the older grant
    assert late == [(newer, older)]
    # the older connection going offline: older still
    bus.publish(topics.client_session, "x", info("node-a", "sa", 10, connected=False))
    assert registry.get("x") == newer and len(late) == 2
    # the same connection's later record (equal stamp) applies
    offline = info("node-b", "sb", 20, connected=False)
    bus.publish(topics.client_session, "x", offline)
    assert registry.get("x") == offline and changes == [newer, offline]
    # a newer grant replaces it
    again = info("node-a", "sc", 21)
    bus.publish(topics.client_session, "x", again)
    assert registry.get("x") == again


def test_two_connections_of_one_stamp_are_ordered_by_session_id_and_unstamped_by_arrival():
    clock, topics, bus, registry, changes, late = started()
    bus.publish(topics.client_session, "x", info("node-a", "s2", 5))
    bus.publish(topics.client_session, "x", info("node-b", "s1", 5))
    assert registry.get("x").session_id == "s2"
    # records of nodes before stamps (0): the last one, but the replaced one's
    bus.publish(topics.client_session, "y", SessionInfo(
        "y", "node-a", "old", True, True, ClientType.DEVICE, 60, 5, 1.0, None, 1.0))
    bus.publish(topics.client_session, "y", SessionInfo(
        "y", "node-b", "new", True, True, ClientType.DEVICE, 60, 5, 1.0, None, 1.0))
    assert registry.get("y").session_id == "new"
    bus.publish(topics.client_session, "y", SessionInfo(
        "y", "node-a", "old", False, True, ClientType.DEVICE, 60, 5, 1.0, 2.0, 2.0))
    assert registry.get("y").session_id == "new"


def test_stamps_grow_past_the_time_the_record_held_and_every_stamp_seen():
    clock, topics, bus, registry, changes, late = started(seconds=100.0)
    first = registry.next_stamp("x")
    assert first == 100_000_001
    assert registry.next_stamp("x") == first + 1  # same microsecond: still greater
    clock.advance(1.0)
    assert registry.next_stamp("x") == 101_000_001
    # a record stamped ahead of this node's time (another member's clock)
    bus.publish(topics.client_session, "x", info("node-b", "sb", 500_000_000))
    assert registry.next_stamp("x") == 500_000_001
    assert registry.next_stamp("other") == 500_000_002


def test_a_put_carries_the_grants_stamp_else_the_records_else_a_new_one():
    clock, topics, bus, registry, changes, late = started(seconds=10.0)
    registry.granted("x", "s1", 7_000)
    registry.put(info("me", "s1", 0))
    assert registry.get("x").stamp == 7_000
    registry.put(info("me", "s1", 0, connected=False))  # the same connection
    assert registry.get("x").stamp == 7_000 and not registry.get("x").connected
    # a session made here without a grant (a gone node's taken over)
    registry.put(info("me", "s2", 0))
    assert registry.get("x").session_id == "s2" and registry.get("x").stamp == 10_000_001
    registry.granted("x", "s3", 0)  # a node that does not stamp: a new one at the put
    registry.put(info("me", "s3", 0))
    assert registry.get("x").stamp == 10_000_002


def test_the_race_of_two_grants_ends_on_the_later_one_whatever_arrives_first():
    """This node's connect A is granted at once; a connect B of the same
    client id on node-b, granted later (a greater stamp) by another member,
    lands in the registry before or after A's record: either way this node
    drops A, and the registry keeps B."""
    for b_first in (False, True):
        clock, topics, bus, registry, changes, late = started(seconds=50.0)
        forgotten, restated = [], []
        events = SessionEvents(bus, topics, "me", registry, clock, drop_local=lambda *a: None,
                               forget_local=lambda c, i: forgotten.append(i.session_id))
        registry.stale_listeners.append(lambda c, current, stale: restated.append(current))
        events.start()
        answer = events.request_connect("x", "sa", clean_start=False, persistent=True,
                                        client_type=ClientType.DEVICE,
                                        session_expiry_interval=60, protocol_level=5)
        stamp_a = answer.result.stamp
        assert stamp_a > 50_000_000
        b = info("node-b", "sb", stamp_a + 3)
        if b_first:
            bus.publish(topics.client_session, "x", b)
        registry.put(info("me", "sa", 0))  # A's record, with its grant's stamp
        if not b_first:
            assert registry.get("x").stamp == stamp_a
            bus.publish(topics.client_session, "x", b)
        assert registry.get("x") == b
        # A dropped for B (when B's record came, and again when A's own was
        # found older: sessions.forget_local does nothing the second time)
        assert forgotten and set(forgotten) == {"sb"}
        # a stale record of A reaching the node that holds B: B is restated
        assert (b in restated) is b_first


def test_an_older_grants_record_read_before_this_nodes_own_leaves_its_connection():
    """This node's connect A is granted after node-b's C (a greater stamp),
    but C's record is read here before A's own: the registry shows C for a
    moment, A is not dropped, and A's record then replaces C."""
    clock, topics, bus, registry, changes, late = started(seconds=50.0)
    forgotten = []
    events = SessionEvents(bus, topics, "me", registry, clock, drop_local=lambda *a: None,
                           forget_local=lambda c, i: forgotten.append(i.session_id))
    events.start()
    answer = events.request_connect("x", "sa", clean_start=True, persistent=False,
                                    client_type=ClientType.DEVICE,
                                    session_expiry_interval=0, protocol_level=5)
    stamp_a = answer.result.stamp
    older = info("node-b", "sc", stamp_a - 1)
    bus.publish(topics.client_session, "x", older)
    assert registry.get("x") == older and forgotten == []
    registry.put(info("me", "sa", 0))
    assert registry.get("x").session_id == "sa" and registry.get("x").stamp == stamp_a
    assert forgotten == []
    # the grant read, a newer record of another node takes the client id
    bus.publish(topics.client_session, "x", info("node-b", "sd", stamp_a + 1))
    assert forgotten == ["sd"]
