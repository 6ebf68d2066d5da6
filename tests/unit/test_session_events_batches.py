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
        self.members: dict = {}  # topic -> its Member

    def publish(self, topic, key, value, headers=(), done=None):
        self.published.append((topic, key, value, done))
        return None if done is not None else defer.Deferred()

    def publish_many(self, topic, keys, values, done):
        self.many.append((topic, list(keys), list(values), done))

    def subscribe(self, topic, group, handler, from_beginning=False, exclusive=False,
                  bundle=None, batch_handler=None):
        self.subscribed[topic] = (handler, batch_handler)
        self.members[topic] = member = Member()
        return member


class Member:
    """A consumer of :class:`PackingBus`: notes whether it was asked to
    hand its node's own records on acknowledgement."""

    def __init__(self) -> None:
        self.own = False
        #: the client ids whose partition this member hands and has read
        self.deciding: set = set()

    def pause(self):
        pass

    def resume(self):
        pass

    def hand_own(self):
        self.own = True
        return True

    def decides(self, key):
        return key in self.deciding


class Registry:
    def __init__(self, sessions=None) -> None:
        self.sessions = dict(sessions or {})
        self.listeners: list = []
        self.stale_listeners: list = []
        self.stamps = 0
        self.grants: list = []

    def get(self, client_id):
        return self.sessions.get(client_id)

    def next_stamp(self, client_id):
        self.stamps += 1
        return self.stamps

    def granted(self, client_id, session_id, stamp):
        self.grants.append((client_id, session_id, stamp))

    def granted_later(self, client_id, stamp):
        return any(c == client_id and s > stamp for c, _, s in self.grants)


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
    assert batch == events._decide_many
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


def test_the_deciding_member_takes_this_nodes_requests_on_acknowledgement():
    """The deciding member is asked to hand this node's own requests when
    they are acknowledged (:meth:`tbmq.interfaces.IConsumer.hand_own`), the
    others' consumers are not; an own request handed so (the value as
    published) is decided once and answered in process, and the
    connection it takes over on node-c is dropped once."""
    bus = PackingBus()
    members = []
    subscribe = bus.subscribe

    def noting(*args, **kwargs):
        member = subscribe(*args, **kwargs)
        members.append(member)
        return member

    bus.subscribe = noting
    events, _ = make(bus, Registry({"x": info("x", "node-c", "s-old")}))
    events.start()
    assert [m.own for m in members] == [True, False, False]
    got = []
    ask(events, "x", "s1").addCallback(got.append)
    topic, key, event, _ = bus.published[0]
    assert topic == events.topics.session_event_request and key == "x"
    _, batch = bus.subscribed[topic]
    assert batch((event,)) is None  # as the member hands it: nothing to send
    assert len(got) == 1 and got[0].request_id == event.request_id
    takeovers = [v for t, _, v, _ in bus.published if t == events.topics.client_disconnect("node-c")]
    assert takeovers == [DisconnectCommand("x", "s-old", ReasonCode.SESSION_TAKEN_OVER)]
    assert bus.many == [] and events._pending == {}



def test_a_request_of_a_partition_this_node_decides_and_has_read_is_decided_at_once():
    """A connect whose client id the node's own deciding member decides
    (its partition handed and read to its end: ``IConsumer.decides``) is
    answered during the call, without a publish; the decision is the one
    the member would make reading it (the connection on another node
    dropped there [MQTT-3.1.4-3], an offline session present
    [MQTT-3.2.2-2]), and the grant is remembered (a gone node's session is
    not taken over after it).  Other client ids are published as before,
    and nothing is decided at once before the member decides (paused until
    :meth:`SessionEvents.start`)."""
    bus = PackingBus()
    registry = Registry({"held": info("held", "node-c", "s-old")})
    events, _ = make(bus, registry)
    events.join()
    member = bus.members[events.topics.session_event_request]
    member.deciding.add("held")
    events.start()
    answers = []
    d = events.request_connect("held", "s-new", clean_start=False, persistent=True,
                               client_type=ClientType.DEVICE, session_expiry_interval=60,
                               protocol_level=5)
    d.addCallback(answers.append)
    assert [(a.client_id, a.success, a.session_present) for a in answers] == [
        ("held", True, True)]
    assert answers[0].session == registry.sessions["held"]
    assert [(t, v) for t, _, v, _ in bus.published] == [
        (events.topics.client_disconnect("node-c"),
         DisconnectCommand("held", "s-old", ReasonCode.SESSION_TAKEN_OVER))]
    assert events._pending == {} and events._granted["held"][0] == "s-new"
    other = ask(events, "other")
    assert not other.called
    assert [(t, k) for t, k, *_ in bus.published[1:]] == [
        (events.topics.session_event_request, "other")]


class AcknowledgingBus(PackingBus):
    """A :class:`PackingBus` that tells whether its brokers answer."""

    def __init__(self) -> None:
        super().__init__()
        self.answering = True

    def acknowledging(self):
        return self.answering


def test_a_client_id_the_registry_shows_no_session_of_is_decided_at_once():
    """A Clean Start connect of a client id no node holds a session of is
    decided during the call though another member decides its partition
    (no session present [MQTT-3.2.2-2], nothing to take over), stamped and
    told to the registry; a Clean Start 0 one (it asks for its session,
    which another node may have made moments ago), one the registry shows
    a session of, one asked while the bus cannot tell that its brokers
    answer, one asked before the node decides and one of a client id whose
    earlier request waits for its answer here are published."""
    bus = AcknowledgingBus()
    registry = Registry({"held": info("held", "node-c", "s-old", connected=False)})
    events, _ = make(bus, registry)
    events.join()
    early = ask(events, "early")
    assert not early.called  # not started: published
    events.start()
    answers = []
    ask(events, "new", "s-new").addCallback(answers.append)
    assert [(a.client_id, a.success, a.session_present, a.session) for a in answers] == [
        ("new", True, False, None)]
    assert registry.grants == [("new", "s-new", answers[0].stamp)] and answers[0].stamp > 0
    assert not events.request_connect("resumed", "s", clean_start=False, persistent=True,
                                      client_type=ClientType.DEVICE, session_expiry_interval=60,
                                      protocol_level=5).called
    assert not ask(events, "held").called
    assert not ask(events, "early", "s-again").called  # its first request waits
    bus.answering = False
    assert not ask(events, "other").called
    assert [k for t, k, *_ in bus.published if t == events.topics.session_event_request] == [
        "early", "resumed", "held", "early", "other"]
    # the answers of both waiting requests release the client id
    bus.answering = True
    requests = [v for t, k, v, *_ in bus.published if k == "early"]
    events._on_responses((SessionEventResponse("early", requests[0].request_id, True,
                                               False, None, "", 9),))
    assert not ask(events, "early", "s-third").called  # the second still waits
    events._on_responses((SessionEventResponse("early", requests[1].request_id, True,
                                               False, None, "", 10),
                          SessionEventResponse("early", bus.published[-1][2].request_id,
                                               True, False, None, "", 11)))
    assert ask(events, "early", "s-fourth").called
    assert ("early", "s-again", 10) in registry.grants


def test_an_answer_nobody_waits_for_leaves_no_grant_in_the_registry():
    """A request of this node decided from its partition after its connect
    was refused (no answer in time: the partition's member was on a node
    that died) grants a connection that does not exist: the registry is not
    told of it, so no stamp of it makes ``granted_later`` keep a session
    that another node takes over; the waiting connect's grant, decided
    next, is told once, with its stamp."""
    bus = PackingBus()
    registry = Registry({"x": info("x", "node-c", "s-old")})
    events, clock = make(bus, registry)
    events.start()
    refused = ask(events, "x", "s1")
    failures = []
    refused.addErrback(failures.append)
    clock.advance(events.timeout * 2)
    assert len(failures) == 1 and failures[0].check(BusPublishError)
    waiting = ask(events, "x", "s2")
    got = []
    waiting.addCallback(got.append)
    old, new = [v for t, _, v, _ in bus.published if t == events.topics.session_event_request]
    assert events._decide_many((old, new)) is None  # both this node's: answered in process
    assert [r.request_id for r in got] == [new.request_id]
    assert registry.grants == [("x", "s2", got[0].stamp)]
    assert not registry.granted_later("x", got[0].stamp)
