"""The consumer of ``tbmq.msg.persisted`` (:class:`PersistedWriter`) and the
session markers that tell it where a persistent DEVICE client is connected:
a marker is ordered with the client's deliveries, is passed on only once
the deliveries before it are stored, and outranks a registry that lags."""

from __future__ import annotations

from twisted.internet import defer, task

from tbmq.cluster.records import Delivery, DeliveryRun, Record, SessionMarker
from tbmq.cluster.sinks import DownlinkReader, PersistedWriter
from tbmq.model import Message


class Store:
    """A device store whose adds complete when the test says."""

    def __init__(self) -> None:
        self.adds: list[tuple[str, list, defer.Deferred]] = []

    def add(self, client_id, deliveries):
        d = defer.Deferred()
        self.adds.append((client_id, deliveries, d))
        return d

    def complete(self, index: int) -> None:
        self.adds[index][2].callback(0)


class Bus:
    def __init__(self) -> None:
        self.published: list[tuple[str, str, object]] = []

    def publish(self, topic, key, value, headers=(), done=None):
        self.published.append((topic, key, value))
        if done is not None:
            done(None)
        return None


class Session:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.connection = object()
        self.attached: list[str] = []
        self.stored: list = []

    def on_attached(self, session_id):
        self.attached.append(session_id)

    def deliver_stored(self, stored, cache, now, source):
        self.stored.append(stored)


class World:
    def __init__(self) -> None:
        self.store = Store()
        self.bus = Bus()
        self.sessions: dict = {}
        self.registry: dict = {}  # client id -> service id (the registry's answer)
        self.gone: set = set()
        seq = iter(range(1, 10**6))
        self.writer = PersistedWriter(
            self.store, self.sessions, self.registry.get, "node-w", self.bus,
            lambda service_id: "downlink." + service_id, task.Clock(), lambda now, count=1: next(seq),
            gone=self.gone.__contains__)

    def record(self, value) -> Record:
        return Record("tbmq.msg.persisted", value.client_id, value, (), 0, 0)

    def deliver(self, client_id: str, payload: bytes):
        return self.writer.handle(self.record(Delivery(client_id, Message("t", payload, 1), 1)))

    def mark(self, client_id: str, service_id: str, session_id: str, attached: bool = True):
        return self.writer.handle(self.record(
            SessionMarker(client_id, service_id, session_id, attached)))

    def sent(self) -> list[tuple[str, object]]:
        """(topic, payload or marker session id) of what went to downlinks."""
        return [(topic, value.message.payload if type(value) is Delivery else value.session_id)
                for topic, _key, value in self.bus.published]


def test_without_a_marker_the_registry_locates_the_client():
    w = World()
    w.registry["dev"] = "node-x"
    w.deliver("dev", b"1")
    assert w.sent() == []  # not before it is stored
    w.store.complete(0)
    assert w.sent() == [("downlink.node-x", b"1")]
    w.registry["dev"] = None  # offline: it waits in the store
    w.deliver("dev", b"2")
    w.store.complete(1)
    assert w.sent() == [("downlink.node-x", b"1")]


def test_an_attach_marker_outranks_a_registry_that_lags():
    w = World()
    w.registry["dev"] = None  # the registry has not heard of the connection yet
    w.mark("dev", "node-y", "conn-1")
    w.deliver("dev", b"1")
    w.store.complete(0)
    assert w.sent() == [("downlink.node-y", "conn-1"), ("downlink.node-y", b"1")]
    w.registry["dev"] = "node-x"  # a stale record of an older connection
    w.deliver("dev", b"2")
    w.store.complete(1)
    assert w.sent()[-1] == ("downlink.node-y", b"2")


def test_the_marker_is_passed_on_after_the_deliveries_before_it_are_stored_and_sent():
    w = World()
    w.registry["dev"] = "node-x"  # stale: the client connected to node-y
    w.deliver("dev", b"1")
    w.deliver("dev", b"2")
    w.deliver("other", b"3")  # another client's store does not hold the marker
    done = w.mark("dev", "node-y", "conn-1")
    w.deliver("dev", b"4")
    assert not done.complete and w.sent() == []
    # stores may complete out of order (a retried write); a delivery is
    # located once stored, so those still being stored go where the marker says
    w.store.complete(1)
    assert w.sent() == [("downlink.node-y", b"2")]
    assert not done.complete
    w.store.complete(0)
    assert done.succeeded
    assert w.sent() == [("downlink.node-y", b"2"), ("downlink.node-y", b"1"),
                        ("downlink.node-y", "conn-1")]
    w.store.complete(3)
    assert w.sent()[-1] == ("downlink.node-y", b"4")


def test_a_marker_for_this_node_goes_to_the_session_here():
    w = World()
    session = w.sessions["dev"] = Session("conn-1")
    assert w.mark("dev", "node-w", "conn-1") is None  # nothing to wait for: done at once
    assert session.attached == ["conn-1"]
    assert w.sent() == []


def test_a_marker_for_this_node_waits_for_the_deliveries_being_stored_before_it():
    w = World()
    session = w.sessions["dev"] = Session("conn-1")
    w.deliver("dev", b"1")
    done = w.mark("dev", "node-w", "conn-2")
    assert session.attached == [] and not done.complete
    w.store.complete(0)
    assert session.attached == ["conn-2"] and done.succeeded


def test_a_detach_marker_forgets_its_own_connection_only():
    w = World()
    w.registry["dev"] = None
    w.mark("dev", "node-y", "conn-1")
    w.mark("dev", "node-z", "conn-2")
    w.mark("dev", "node-y", "conn-1", attached=False)  # the older connection's end
    assert w.writer.where("dev") == "node-z"
    w.mark("dev", "node-z", "conn-2", attached=False)
    assert w.writer.where("dev") is None  # the registry again
    assert w.writer.attached == {}


def test_a_gone_node_no_longer_locates_the_client():
    w = World()
    w.registry["dev"] = None
    w.mark("dev", "node-y", "conn-1")
    assert w.writer.where("dev") == "node-y"
    w.gone.add("node-y")
    assert w.writer.where("dev") is None
    assert w.writer.attached == {}


def test_an_ended_session_is_forgotten():
    w = World()
    w.mark("dev", "node-y", "conn-1")
    w.writer.session_changed("dev", object(), object())  # still there
    assert w.writer.where("dev") == "node-y"
    w.writer.session_changed("dev", object(), None)
    assert w.writer.attached == {}


def test_the_downlink_reader_hands_a_marker_to_the_connected_session():
    sessions = {"dev": Session("conn-1")}
    reader = DownlinkReader(sessions, task.Clock())
    reader.handle_persisted(Record("downlink.node-y", "dev",
                                   SessionMarker("dev", "node-y", "conn-1"), (), 0, 0))
    assert sessions["dev"].attached == ["conn-1"]
    sessions["dev"].connection = None  # gone meanwhile: the store keeps everything
    reader.handle_persisted(Record("downlink.node-y", "dev",
                                   SessionMarker("dev", "node-y", "conn-1"), (), 0, 1))
    assert sessions["dev"].attached == ["conn-1"]


class LiveSession:
    """A non-persistent session here: what the basic downlink gives it;
    it goes (overflow) after ``room`` deliveries."""

    def __init__(self, room: int = 100) -> None:
        self.connection = object()
        self.delivered: list = []
        self.room = room
        self.outbox = self

    def deliver(self, message, qos, retain, sids, cache, now, source):
        self.delivered.append((message.topic, qos, retain, sids))
        if len(self.delivered) >= self.room:
            self.connection = None


def test_the_basic_downlink_delivers_a_run_in_order_and_stops_when_the_session_goes():
    """A :class:`DeliveryRun` is a delivery per message, in order, among the
    records around it; a session that goes during the run gets no more."""
    a, b = LiveSession(), LiveSession(room=2)
    reader = DownlinkReader({"a": a, "b": b}, task.Clock())
    m = [Message(f"t/{i}", b"x", 1) for i in range(4)]
    reader.handle_basic_batch([Delivery("a", m[0], 1), DeliveryRun("a", (m[1], m[2]), 1, True, (7,)),
                               DeliveryRun("b", tuple(m), 0), Delivery("a", m[3], 0),
                               DeliveryRun("gone", (m[0],), 1)])
    assert a.delivered == [("t/0", 1, False, ()), ("t/1", 1, True, (7,)),
                           ("t/2", 1, True, (7,)), ("t/3", 0, False, ())]
    assert b.delivered == [("t/0", 0, False, ()), ("t/1", 0, False, ())]
    reader.handle_basic(Record("downlink.node-y", "b", DeliveryRun("b", (m[2],), 0), (), 0, 0))
    assert len(b.delivered) == 2


def test_an_add_answered_out_of_step_is_written_again_not_taken_as_done():
    """A Redis connection whose replies came out of step after a reply
    timeout answers an add with another call's reply (bytes): the add may
    not have been done, so it is written again (same seq: it replaces),
    and the delivery is forwarded only once an add really succeeded."""
    w = World()
    w.registry["c"] = "node-x"
    result: list = []
    w.deliver("c", b"m").then(result.append)
    w.store.adds[0][2].callback(b"\x91\x00")  # a LOAD's reply, not a count
    assert result == [] and len(w.store.adds) == 1
    w.writer.clock.advance(w.writer.RETRY_FIRST)
    assert len(w.store.adds) == 2  # the same delivery again, same seq
    assert w.store.adds[1][1][0].seq == w.store.adds[0][1][0].seq
    assert w.sent() == []
    w.store.complete(1)
    assert result == [None]
    assert w.sent() == [("downlink.node-x", b"m")]


def test_a_batch_stores_each_clients_deliveries_in_one_write_a_marker_after_those_before_it():
    """The batch handler (a packed record's records): one store write per
    client and run of deliveries, in order with new seqs; a marker splits
    its client's run, so that it is passed on after the deliveries before
    it are stored; the batch is done once every write and send is."""
    w = World()
    w.registry["a"] = "node-x"
    w.registry["b"] = None  # offline: it waits in the store
    batch = [Delivery("a", Message("t", b"a1", 1), 1), Delivery("b", Message("t", b"b1", 1), 1),
             Delivery("a", Message("t", b"a2", 1), 1),
             SessionMarker("a", "node-y", "conn-1", True),
             Delivery("a", Message("t", b"a3", 1), 1), Delivery("b", Message("t", b"b2", 1), 1)]
    done = w.writer.handle_batch(batch)
    assert [(c, [d.message.payload for d in ds]) for c, ds, _ in w.store.adds] == [
        ("a", [b"a1", b"a2"]), ("b", [b"b1", b"b2"]), ("a", [b"a3"])]
    seqs = [d.seq for _, ds, _ in w.store.adds for d in ds]
    assert len(set(seqs)) == 5
    assert [d.seq for d in w.store.adds[0][1]] == sorted(d.seq for d in w.store.adds[0][1])
    w.store.complete(2)  # a3 stored: located by the marker
    assert w.sent() == [("downlink.node-y", b"a3")]
    w.store.complete(1)
    assert not done.complete
    w.store.complete(0)  # a1, a2 stored, located by the marker too; then the marker
    assert w.sent() == [("downlink.node-y", b"a3"), ("downlink.node-y", b"a1"),
                        ("downlink.node-y", b"a2"), ("downlink.node-y", "conn-1")]
    assert done.succeeded


def test_an_attach_marker_builds_no_log_event_below_debug(monkeypatch):
    """One marker per persistent CONNECT: its debug line is not even built
    at info (an event and its fields per CONNECT)."""
    from tbmq import log
    from tbmq.cluster import sinks

    events = []
    monkeypatch.setattr(sinks.log, "debug", lambda *a, **kw: events.append(kw))
    w = World()
    w.sessions["dev"] = Session("conn-1")
    log.set_log_level("info")
    w.mark("dev", "node-w", "conn-1")
    assert events == []
    try:
        log.set_log_level("debug")
        w.mark("dev", "node-w", "conn-2")
        assert [e["session_id"] for e in events] == ["conn-2"]
    finally:
        log.set_log_level("info")


class ManyBus(Bus):
    """A bus with ``publish_many``: each call noted in ``published`` (in
    order with the single publishes) as ``(topic, keys, values)``, its
    ``done`` kept for the test to call."""

    def __init__(self) -> None:
        super().__init__()
        self.dones: list = []

    def publish_many(self, topic, keys, values, done):
        self.published.append((topic, list(keys), list(values)))
        self.dones.append(done)


def test_the_attach_markers_of_a_batch_go_to_each_node_in_one_publish():
    """A burst of persistent CONNECTs elsewhere: the attach markers of one
    batch with nothing of their client being stored go to each node in
    one ``publish_many`` (in order), one for this node's session goes to
    it; the batch is done once those publishes are."""
    w = World()
    w.bus = w.writer.bus = ManyBus()
    here = w.sessions["d"] = Session("conn-d")
    done = w.writer.handle_batch([SessionMarker("a", "node-y", "conn-a", True),
                                  SessionMarker("c", "node-z", "conn-c", True),
                                  SessionMarker("b", "node-y", "conn-b", True),
                                  SessionMarker("d", "node-w", "conn-d", True)])
    assert [(topic, keys, [m.session_id for m in markers])
            for topic, keys, markers in w.bus.published] == [
        ("downlink.node-y", ["a", "b"], ["conn-a", "conn-b"]),
        ("downlink.node-z", ["c"], ["conn-c"])]
    assert here.attached == ["conn-d"]
    assert not done.complete
    w.bus.dones[0](None)
    assert not done.complete
    w.bus.dones[1](None)
    assert done.succeeded


class StoredAtOnce(Store):
    """A device store whose adds complete during the call (an in-memory one)."""

    def add(self, client_id, deliveries):
        self.adds.append((client_id, deliveries, None))
        return defer.succeed(0)


def test_gathered_markers_go_before_a_later_write_of_the_batch():
    """With a store that answers at once, a delivery after a marker is sent
    on during the batch: the marker gathered before it is published
    first, so the node gets them in the batch's order."""
    w = World()
    w.store = w.writer.store = StoredAtOnce()
    w.bus = w.writer.bus = ManyBus()
    w.registry["a"] = None
    done = w.writer.handle_batch([SessionMarker("a", "node-y", "conn-1", True),
                                  Delivery("a", Message("t", b"a1", 1), 1),
                                  SessionMarker("a", "node-z", "conn-2", True),
                                  Delivery("a", Message("t", b"a2", 1), 1)])
    sent = [(p[0], [m.session_id for m in p[2]]) if type(p[1]) is list
            else (p[0], p[2].message.payload) for p in w.bus.published]
    assert sent == [("downlink.node-y", ["conn-1"]), ("downlink.node-y", b"a1"),
                    ("downlink.node-z", ["conn-2"]), ("downlink.node-z", b"a2")]
    for d in w.bus.dones:
        d(None)
    assert done.succeeded
