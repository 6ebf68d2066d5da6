"""Membership on its own (:mod:`tbmq.cluster.membership`): heartbeats, a
node counted gone, replays ignored, and the takeover requests it makes."""

from __future__ import annotations

import dataclasses

from twisted.internet import task

from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.cluster.membership import Membership
from tbmq.cluster.records import NodeInfo, SessionInfo
from tbmq.cluster.registry import SessionRegistry
from tbmq.cluster.topics import TopicCatalogue
from tbmq.model import ClientType


def info(client_id, service_id, connected=True):
    return SessionInfo(client_id, service_id, "s-" + client_id, connected, True,
                       ClientType.DEVICE, 60, 5, 0.0, None, 0.0)


class World:
    def __init__(self) -> None:
        self.clock = task.Clock()
        self.clock.advance(1_000_000)
        self.topics = TopicCatalogue()
        self.bus = InProcessBus(clock=self.clock, catalogue=self.topics, encode=True)
        self.bus.start()
        self.registry = SessionRegistry(self.bus, self.topics.client_session, "me")
        self.registry.start()
        self.asked: list[str] = []
        self.me = Membership(self.bus, self.topics.nodes, "me", self.clock, self.registry,
                             lambda i: self.asked.append(i.client_id), 1.0, 5.0, ("tcp=tcp:1883",))
        self.me.start()

    def heartbeat(self, service_id, sent_at=None, stopping=False):
        at = self.clock.seconds() if sent_at is None else sent_at
        self.bus.publish(self.topics.nodes, service_id, NodeInfo(service_id, at, at, stopping))

    def run(self, seconds):
        for _ in range(int(seconds * 10)):
            self.clock.advance(0.1)


def test_a_silent_node_is_gone_after_the_timeout_and_its_sessions_are_asked_for_once():
    w = World()
    w.registry.put(info("c1", "other"))
    w.registry.put(info("c2", "other", connected=False))
    w.registry.put(info("mine", "me"))
    for _ in range(3):
        w.heartbeat("other")
        w.run(1)
    assert w.me.alive() == ["me", "other"] and w.asked == []
    w.run(6)
    assert w.me.alive() == ["me"]
    assert sorted(w.asked) == ["c1", "c2"]
    w.run(4)
    assert sorted(w.asked) == ["c1", "c2"]  # not again within the timeout
    w.run(2)
    assert sorted(w.asked) == ["c1", "c1", "c2", "c2"]  # still there: asked again


def test_a_node_that_says_it_stops_is_gone_at_once():
    w = World()
    w.registry.put(info("c1", "other"))
    w.heartbeat("other")
    w.run(0.5)
    w.heartbeat("other", stopping=True)
    w.run(0.1)
    assert w.asked == ["c1"]


def test_a_replayed_old_heartbeat_says_nothing_and_an_unheard_holder_is_gone_after_start():
    w = World()
    w.registry.put(info("c1", "ghost"))
    w.heartbeat("ghost", sent_at=w.clock.seconds() - 60)
    w.run(4)
    assert "ghost" not in w.me.nodes and w.asked == []
    w.run(3)
    assert w.asked == ["c1"]


def test_this_nodes_heartbeats_reach_the_others():
    w = World()
    seen = []
    w.bus.subscribe(w.topics.nodes, "watcher", lambda record: seen.append(record.value))
    w.run(2.5)
    assert [n.service_id for n in seen] == ["me", "me"]
    assert seen[0].listeners == ("tcp=tcp:1883",) and not seen[0].stopping
    w.me.stop()
    w.run(0.1)
    assert seen[-1].stopping is True


def test_a_gone_nodes_session_is_not_taken_over_once_the_client_connected_again():
    """The decider grants a connection on node B, then hears that node A,
    which held the session, is gone, before B's session record reached its
    registry: the connection granted since ends A's session; nothing is
    taken over, and B's client is not dropped."""
    from tbmq.cluster.records import CONNECTION_REQUEST, NODE_GONE, SessionEvent
    from tbmq.cluster.session_events import SessionEvents

    w = World()
    w.bus.publish(w.topics.client_session, "dev", info("dev", "node-a"))
    taken, answers = [], []
    events = SessionEvents(w.bus, w.topics, "me", w.registry, w.clock,
                           drop_local=lambda *a: None, forget_local=lambda *a: None,
                           take_over=taken.append)
    events.start()
    w.bus.subscribe(w.topics.session_event_response("node-b"), "b", answers.append)
    w.bus.publish(w.topics.session_event_request, "dev", SessionEvent(
        CONNECTION_REQUEST, "dev", "node-b", "s-new", "r1", persistent=True))
    assert [a.value.request_id for a in answers] == ["r1"]
    # node A's takeover is asked before node B's record reached the registry
    w.bus.publish(w.topics.session_event_request, "dev", SessionEvent(
        NODE_GONE, "dev", "node-a", "s-dev", "r2", at=w.clock.seconds()))
    assert taken == []
    # once the registry shows the new connection, a later node loss is decided as usual
    w.bus.publish(w.topics.client_session, "dev",
                  dataclasses.replace(info("dev", "node-b"), session_id="s-new"))
    w.bus.publish(w.topics.session_event_request, "dev", SessionEvent(
        NODE_GONE, "dev", "node-b", "s-new", "r3", at=w.clock.seconds()))
    assert [i.service_id for i in taken] == ["node-b"]


def test_the_deciding_member_joins_with_the_cluster_bundle_but_decides_after_start():
    """A node subscribes its session-event member with its other cluster
    groups (one Kafka join), paused: a request that comes before the
    registry replay is decided once the node starts deciding."""
    from tbmq.cluster.records import CONNECTION_REQUEST, SessionEvent
    from tbmq.cluster.session_events import SessionEvents
    from tbmq.cluster.topics import CLUSTER_BUNDLE

    w = World()
    made = []
    subscribe = w.bus.subscribe

    def recording(topic, group, handler, from_beginning=False, exclusive=False, bundle=None,
                  batch_handler=None):
        made.append((topic, group, bundle))
        return subscribe(topic, group, handler, from_beginning, exclusive, bundle,
                         batch_handler)

    w.bus.subscribe = recording
    answers = []
    events = SessionEvents(w.bus, w.topics, "me", w.registry, w.clock,
                           drop_local=lambda *a: None, forget_local=lambda *a: None)
    events.join()
    assert made == [(w.topics.session_event_request, "tbmq-session-events", CLUSTER_BUNDLE)]
    subscribe(w.topics.session_event_response("node-b"), "b", answers.append)
    w.bus.publish(w.topics.session_event_request, "dev", SessionEvent(
        CONNECTION_REQUEST, "dev", "node-b", "s-new", "r1", persistent=True))
    w.run(1)
    assert answers == []  # joined, not deciding yet
    events.start()
    w.run(0.1)
    assert [a.value.request_id for a in answers] == ["r1"]
    assert len(made) == 3 and len(events.consumers) == 3  # the member is not made twice
