"""The connect path of a cluster in batches (:mod:`tbmq.cluster.session_events`,
:mod:`tbmq.cluster.registry`): the requests of one packed record decided in
one call with one answer per asking node, the answers of one read handed in
one call, and no Deferred per request or registry record."""

from __future__ import annotations

from twisted.internet import defer, task
from twisted.python.failure import Failure

from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.broker.sessions import new_session_id
from tbmq.cluster.completion import Completion
from tbmq.cluster.records import (
    CLEAR_SESSION,
    CONNECTION_REQUEST,
    DisconnectCommand,
    SessionEvent,
    SessionEventResponse,
    SessionInfo,
)
from tbmq.cluster.registry import SessionRegistry
from tbmq.cluster.session_events import SessionEvents
from tbmq.cluster.topics import TopicCatalogue
from tbmq.errors import BusPublishError
from tbmq.model import ClientType
from tbmq.mqtt import ReasonCode


def info(client_id, service_id, session_id, connected=True, persistent=True):
    return SessionInfo(client_id, service_id, session_id, connected, persistent,
                       ClientType.DEVICE, 60, 5, 0.0, None, 0.0)


def request(client_id, node, session_id, request_id, clean_start=False):
    return SessionEvent(CONNECTION_REQUEST, client_id, node, session_id, request_id,
                        clean_start, True)


class PackingBus:
    """A bus that packs (``packs``, with ``publish_many``): records what is
    published, each ``done`` kept for the test to call."""

    packs = True

    def __init__(self) -> None:
        self.published: list = []  # (topic, key, value, done)
        self.many: list = []  # (topic, keys, values, done)
        self.subscribed: dict = {}  # topic -> (handler, batch_handler)

    def publish(self, topic, key, value, headers=(), done=None):
        self.published.append((topic, key, value, done))
        return None if done is not None else defer.Deferred()

    def publish_many(self, topic, keys, values, done):
        self.many.append((topic, list(keys), list(values), done))

    def subscribe(self, topic, group, handler, from_beginning=False, exclusive=False,
                  bundle=None, batch_handler=None):
        self.subscribed[topic] = (handler, batch_handler)

        class Member:
            def pause(self):
                pass

            def resume(self):
                pass

        return Member()


class Registry:
    def __init__(self, sessions=None) -> None:
        self.sessions = dict(sessions or {})
        self.listeners: list = []

    def get(self, client_id):
        return self.sessions.get(client_id)


def ask(events, client_id, session_id="s"):
    """A clean v5 connect of ``client_id`` asked of the cluster."""
    return events.request_connect(client_id, session_id, clean_start=True, persistent=False,
                                  client_type=ClientType.DEVICE, session_expiry_interval=0,
                                  protocol_level=5)


def make(bus, registry=None, cleared=None):
    clock = task.Clock()
    events = SessionEvents(bus, TopicCatalogue(), "me", registry or Registry(), clock,
                           drop_local=lambda *a: None, forget_local=lambda *a: None,
                           clear=(cleared.append if cleared is not None else lambda i: None))
    return events, clock


def test_the_requests_of_a_batch_are_decided_in_order_with_one_answer_publish_per_node():
    """Three requests of one packed record, from two nodes: the answers go
    out in one ``publish_many`` per asking node, in the requests' order;
    the batch is committed (its Completion) once both were acknowledged.
    A client connected on another node is dropped there first
    [MQTT-3.1.4-3], and an offline persistent session is present for a
    Clean Start 0 request [MQTT-3.2.2-2]."""
    bus = PackingBus()
    registry = Registry({"held": info("held", "node-c", "s-old"),
                         "off": info("off", "node-c", "s-off", connected=False)})
    events, _ = make(bus, registry)
    events.start()
    topics = events.topics
    handler, batch = bus.subscribed[topics.session_event_request]
    assert batch == events._read
    result = batch((request("held", "node-a", "s1", "r1"),
                    request("off", "node-b", "s2", "r2"),
                    request("new", "node-a", "s3", "r3", clean_start=True)))
    assert type(result) is Completion and not result.complete
    assert [(t, k) for t, k, *_ in bus.many] == [
        (topics.session_event_response("node-a"), ["held", "new"]),
        (topics.session_event_response("node-b"), ["off"])]
    to_a, to_b = bus.many[0][2], bus.many[1][2]
    assert [r.request_id for r in to_a] == ["r1", "r3"]
    assert [r.session_present for r in to_a] == [True, False]  # held: persistent, not clean
    assert to_b[0].session_present is True and to_b[0].session == registry.sessions["off"]
    # the connection on node-c is dropped there, once
    drops = [(t, v) for t, _, v, _ in bus.published]
    assert drops == [(topics.client_disconnect("node-c"),
                      DisconnectCommand("held", "s-old", ReasonCode.SESSION_TAKEN_OVER))]
    bus.many[0][3](None)
    assert not result.complete
    bus.many[1][3](None)
    assert result.succeeded
    assert set(events._granted) == {"held", "off", "new"}


def test_a_batch_fails_when_an_answer_is_not_sent():
    """A refused answer fails the batch's Completion: the records stay
    uncommitted and are read again (the asking node takes the first answer)."""
    bus = PackingBus()
    events, _ = make(bus)
    result = events._decide_many((request("a", "node-a", "s1", "r1"),))
    seen = []
    result.then(seen.append)
    bus.many[0][3](Failure(BusPublishError("down")))
    assert len(seen) == 1 and seen[0].check(BusPublishError)


def test_a_batch_without_a_connect_request_commits_at_once():
    """CLEAR_SESSION of an offline session is carried out; nothing is
    answered, so the batch needs no Completion."""
    bus = PackingBus()
    offline = info("c", "node-b", "s-c", connected=False)
    cleared = []
    events, _ = make(bus, Registry({"c": offline}), cleared)
    event = SessionEvent(CLEAR_SESSION, "c", "node-b", "s-c", "x")
    assert events._decide_many((event,)) is None
    assert cleared == [offline] and bus.many == []


def test_one_record_is_decided_as_a_batch_of_one():
    bus = PackingBus()
    events, _ = make(bus)
    events.start()

    class Rec:
        value = request("a", "node-a", "s1", "r1")

    handler, _ = bus.subscribed[events.topics.session_event_request]
    assert type(handler(Rec)) is Completion
    assert [k for _, k, *_ in bus.many] == [["a"]]


def test_the_answers_of_a_read_fire_their_connects_in_one_call():
    """The answers of a packed record go to the response topic's
    ``batch_handler``: each pending connect fires with its answer; an
    answer to nothing pending (timed out) is ignored."""
    bus = PackingBus()
    events, _ = make(bus)
    events.start()
    d1 = ask(events, "a", "s1")
    d2 = ask(events, "b", "s2")
    ids = [v.request_id for _, _, v, _ in bus.published]
    _, batch = bus.subscribed[events.topics.session_event_response("me")]
    got = []
    d1.addCallback(got.append)
    d2.addCallback(got.append)
    answers = [SessionEventResponse(c, r, True, False, None) for c, r in zip("ab", ids)]
    assert batch(answers + [SessionEventResponse("z", "gone", True, False, None)]) is None
    assert got == answers


def test_a_refused_request_fails_its_connect_through_done_without_a_deferred():
    """The request is published with a ``done`` (no Deferred per
    request); a refusal fails the connect at once, and a later answer is
    ignored."""
    bus = PackingBus()
    events, _ = make(bus)
    d = ask(events, "a", "s1")
    topic, key, event, done = bus.published[0]
    assert callable(done) and key == "a"
    failures = []
    d.addErrback(failures.append)
    done(Failure(BusPublishError("refused")))
    assert len(failures) == 1 and failures[0].check(BusPublishError)
    assert events._pending == {}
    events._on_responses((SessionEventResponse("a", event.request_id, True, False, None),))
    # an acknowledged request stays pending until its answer
    d2 = ask(events, "b", "s2")
    bus.published[-1][3](None)
    assert not d2.called and len(events._pending) == 1


def in_process():
    """A started in-process bus (encoding) and session registry."""
    clock = task.Clock()
    topics = TopicCatalogue()
    bus = InProcessBus(clock=clock, catalogue=topics, encode=True)
    bus.start()
    registry = SessionRegistry(bus, topics.client_session, "me")
    registry.start()
    return clock, topics, bus, registry


def test_the_in_process_bus_keeps_handing_records_one_by_one():
    """Without ``publish_many`` (the in-process bus hands each record in
    the publisher's call) no batch handler is given: an embedded CONNECT
    is answered during its request."""
    clock, topics, bus, registry = in_process()
    events = SessionEvents(bus, topics, "me", registry, clock, drop_local=lambda *a: None,
                           forget_local=lambda *a: None)
    events.start()
    d = ask(events, "a", "s1")
    assert d.called and d.result.request_id.endswith("-1")


def test_registry_records_report_to_done_without_a_deferred():
    """:meth:`SessionRegistry.put` and :meth:`~SessionRegistry.remove` with
    a ``done``: the bus's outcome goes there, nothing is returned."""
    clock, topics, bus, registry = in_process()
    outcomes = []
    assert registry.put(info("c", "me", "s1", persistent=False), outcomes.append) is None
    assert registry.get("c").session_id == "s1"
    assert registry.remove("c", outcomes.append) is None
    assert registry.get("c") is None and outcomes == [None, None]


def test_session_ids_are_uuid_shaped_and_unique():
    ids = [new_session_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_a_request_of_this_node_is_answered_in_process_in_order():
    """The deciding node's own requests get their answers without a
    publish (one bus hop saved); another node's answer is still sent, and
    the decisions keep the batch's order."""
    bus = PackingBus()
    events, _ = make(bus)
    events.start()
    mine = ask(events, "a", "s1")
    event = bus.published[0][2]
    assert event.service_id == "me"
    got = []
    mine.addCallback(got.append)
    result = events._decide_many((event, request("b", "node-b", "s2", "r2")))
    assert [r.request_id for r in got] == [event.request_id]
    assert [(t, k) for t, k, *_ in bus.many] == [
        (events.topics.session_event_response("node-b"), ["b"])]
    assert events._pending == {} and list(events._granted) == ["a", "b"]
    assert not result.complete  # node-b's answer not acknowledged yet
    # only this node's requests: nothing to wait for
    assert events._decide_many((request("c", "me", "s3", "r-old"),)) is None


class Deciding:
    """The deciding member of a bus that knows where its records landed."""

    def __init__(self) -> None:
        self.at: int | None = None

    def pause(self):
        pass

    def resume(self):
        pass

    def handed(self, partition):
        return self.at


class PlacingBus(PackingBus):
    def __init__(self) -> None:
        super().__init__()
        self.member = Deciding()

    def subscribe(self, topic, group, handler, from_beginning=False, exclusive=False,
                  bundle=None, batch_handler=None):
        super().subscribe(topic, group, handler, from_beginning, exclusive, bundle,
                          batch_handler)
        return self.member


def connect(events, client_id, session_id="s"):
    d = ask(events, client_id, session_id)
    got = []
    d.addCallback(got.append)
    return got


def acknowledge(bus, index, partition, offset):
    """The bus acknowledges request ``index`` at ``offset`` of ``partition``."""
    done = bus.published[index][3]
    done.where = (partition, offset)
    done(None)


def test_a_request_is_decided_when_acknowledged_if_every_record_before_it_was():
    """This node hands partition 0 up to offset 7: its request acknowledged
    at offset 7 is decided at once (no read back); the connection it takes
    over on node-c is dropped once, not again when the record is read."""
    bus = PlacingBus()
    events, _ = make(bus, Registry({"x": info("x", "node-c", "s-old")}))
    events.start()
    bus.member.at = 7
    got = connect(events, "x", "s1")
    acknowledge(bus, 0, 0, 7)
    assert len(got) == 1 and got[0].client_id == "x"
    takeovers = [v for t, _, v, _ in bus.published if t == events.topics.client_disconnect("node-c")]
    assert len(takeovers) == 1
    # read back: skipped (nothing decided or sent twice)
    assert events._decide_many((bus.published[0][2],)) is None
    takeovers = [v for t, _, v, _ in bus.published if t == events.topics.client_disconnect("node-c")]
    assert len(takeovers) == 1 and events._ahead == {}


def test_requests_acknowledged_in_a_row_are_decided_in_a_row():
    """Offsets 7 (two requests in one packed record) and 8 are decided on
    their acknowledgements while the member still shows 7 handed: the
    record before each was decided here."""
    bus = PlacingBus()
    events, _ = make(bus)
    events.start()
    bus.member.at = 7
    a, b, c = connect(events, "a"), connect(events, "b"), connect(events, "c")
    acknowledge(bus, 0, 1, 7)
    acknowledge(bus, 1, 1, 7)
    acknowledge(bus, 2, 1, 8)
    assert [len(a), len(b), len(c)] == [1, 1, 1]
    assert list(events._granted) == ["a", "b", "c"]


def test_a_request_after_records_not_yet_decided_waits_to_be_read():
    """The member handed up to 5 only: offset 7 may follow another node's
    request for the same client id at 5 or 6, so it waits (here it is read
    back first, and decided then, once); a request read before its
    acknowledgement is not decided twice; a paused member (before the
    registry replay) decides nothing."""
    bus = PlacingBus()
    events, _ = make(bus)
    events.start()
    bus.member.at = 5
    got = connect(events, "a")
    acknowledge(bus, 0, 0, 7)
    assert got == [] and events._ahead == {}
    events._decide_many((bus.published[0][2],))
    assert len(got) == 1
    # read (handed 9) before the acknowledgement of offset 8
    bus.member.at = 9
    late = connect(events, "b")
    events._decide_many((bus.published[1][2],))
    assert len(late) == 1
    acknowledge(bus, 1, 0, 8)
    assert list(events._granted) == ["a", "b"] and events._ahead == {}
    bus.member.at = None  # paused, or not this member's partition
    paused = connect(events, "c")
    acknowledge(bus, 2, 0, 10)
    assert paused == [] and 0 not in events._ahead_at


def test_a_packed_record_passes_its_place_to_the_located_publishes_it_carries():
    from tbmq.cluster.completion import Located
    from tbmq_plugins.kafka.packing import Fanout, Packer

    sent = []
    later = []
    packer = Packer(lambda *a: sent.append(a), later.append)
    places, outcomes = [], []
    packer.add("t", 3, b"k1", b"v1", (), Located(outcomes.append, lambda p, o: places.append((p, o))))
    packer.add("t", 3, b"k2", b"v2", (), outcomes.append)
    later[0]()
    fanout = sent[0][5]
    assert type(fanout) is Fanout and fanout.located
    fanout.where = (3, 41)
    fanout(None)
    assert places == [(3, 41)] and outcomes == [None, None]
    # a bus that does not tell the place: the publish's done only
    alone = Located(outcomes.append, lambda p, o: places.append((p, o)))
    alone(None)
    assert places == [(3, 41)] and outcomes == [None, None, None]
    packer.add("t", 1, b"k3", b"v3", (), outcomes.append)
    later[1]()
    assert getattr(sent[1][5], "located", False) is False


def test_acknowledged_requests_are_decided_once_the_records_before_them_are_read():
    """Offsets 6 and 7 (this node's) are acknowledged while the member has
    handed up to 5; offset 5 is another node's request for the same client
    id.  Once it is read and decided, 6 and 7 follow at once, in order,
    without waiting to be read themselves; read later, they are skipped."""
    bus = PlacingBus()
    events, _ = make(bus)
    events.start()
    bus.member.at = 5
    a, b = connect(events, "x", "s-a"), connect(events, "x", "s-b")
    acknowledge(bus, 0, 2, 6)
    acknowledge(bus, 1, 2, 7)
    assert a == [] and b == [] and list(events._acked[2]) == [6, 7]
    bus.member.at = 6  # the consumer hands offset 5
    other = request("x", "node-b", "s-other", "r-b")
    result = events._read((other,))
    assert [k for _, k, *_ in bus.many] == [["x"]]  # node-b answered first
    assert type(result) is Completion
    assert len(a) == 1 and len(b) == 1 and events._acked == {}
    assert events._granted["x"][0] == "s-b"  # the last one granted is the last request
    bus.member.at = 8
    assert events._read((bus.published[0][2], bus.published[1][2])) is None
    assert events._ahead == {}
