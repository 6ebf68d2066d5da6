"""Match, then target, then sink: the router with a fake bus, fake
sessions and a fake registry — no broker object — one test per target kind;
and a session on a fake connection and context."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from twisted.internet import defer, task
from twisted.python.failure import Failure

from tbmq.broker.hooks import DropCounter
from tbmq.broker.acknowledgements import on_puback
from tbmq.broker.outbound import Holds, TurnFlusher
from tbmq.broker.router import Router
from tbmq.broker.session import Session, SessionContext, TopicNameCache
from tbmq.cluster.completion import Completion, deferred_done
from tbmq.cluster.records import Delivery, DeliveryRun, Record, SessionInfo
from tbmq.cluster.sinks import Sinks
from tbmq.cluster.topics import TopicCatalogue
from tbmq.config import load_config
from tbmq.errors import BusPublishError
from tbmq.model import ClientType, Message, SubscriptionOptions
from tbmq.mqtt.codec import Decoder

T = TopicCatalogue()


class FakeBus:
    """Records what is published; no consumer.

    :ivar hold: when True, a publish's ``done`` is kept in :attr:`dones`
        (the bus answers later, as Kafka does), else called at once.
    """

    def __init__(self) -> None:
        self.published: list[tuple] = []
        self.hold = False
        self.dones: list = []

    def publish(self, topic, key, value, headers=(), done=None):
        self.published.append((topic, key, value))
        if done is not None:
            if self.hold:
                self.dones.append(done)
            else:
                done(None)
        return None

    def subscribe(self, topic, group, handler, from_beginning=False, exclusive=False,
                  bundle=None, batch_handler=None):
        return SimpleNamespace(topic=topic, group=group, handler=handler,
                               batch_handler=batch_handler, caught_up=defer.succeed(None),
                               hand_own=lambda: False)


class FakeSession:
    """A session of this node as the router sees it."""

    def __init__(self, client_id, persistent=False, client_type=ClientType.DEVICE,
                 connected=True) -> None:
        self.client_id = client_id
        self.persistent = persistent
        self.client_type = client_type
        self.connection = object() if connected else None
        self.delivered: list[tuple] = []
        self.outbox = self  # the router calls session.outbox.deliver

    def deliver(self, message, qos, retain, sids, cache, now, source):
        self.delivered.append((message.topic, qos, retain, sids, source))


def info(client_id, service_id="node-x", connected=True, persistent=False,
         client_type=ClientType.DEVICE) -> SessionInfo:
    return SessionInfo(client_id, service_id, "s-" + client_id, connected, persistent,
                       client_type, 60 if persistent else 0, 5, 1.0, None, 1.0)


@pytest.fixture
def world():
    bus = FakeBus()
    sessions: dict = {}
    registry: dict = {}
    clock = task.Clock()
    router = Router(bus, T, "node-a", clock, SimpleNamespace(), sessions, registry.get)
    router.start()
    return SimpleNamespace(bus=bus, sessions=sessions, registry=registry, router=router)


def subscribe(router, client_id, topic_filter, qos=1, **options):
    from tbmq.mqtt.topics import parse_shared_subscription

    router.add_subscription(client_id, topic_filter, parse_shared_subscription(topic_filter),
                            SubscriptionOptions(qos, **options))


def dispatch(world, topic="a/b", qos=1, publisher="p"):
    message = Message(topic, b"x", qos, False, {}, publisher, 1.0)
    return world.router._on_message(Record(T.msg_all, topic, message)), message


def test_a_non_persistent_client_here_is_written_now_held_by_the_consumer(world):
    s = world.sessions["c"] = FakeSession("c")
    subscribe(world.router, "c", "a/+")
    dispatch(world, qos=2)
    assert s.delivered == [("a/b", 1, False, (), world.router.consumer)]
    assert world.bus.published == []


def test_qos0_to_a_persistent_client_here_is_written_now(world):
    s = world.sessions["c"] = FakeSession("c", persistent=True)
    subscribe(world.router, "c", "a/#", qos=0)
    dispatch(world)
    assert [d[1] for d in s.delivered] == [0] and world.bus.published == []


def test_a_persistent_device_goes_through_tbmq_msg_persisted(world):
    world.sessions["d"] = FakeSession("d", persistent=True)
    subscribe(world.router, "d", "a/b")
    dispatch(world)
    (topic, key, value), = world.bus.published
    assert (topic, key) == (T.msg_persisted, "d") and isinstance(value, Delivery)
    assert (value.client_id, value.qos) == ("d", 1)


def test_a_non_persistent_client_on_another_node_goes_through_its_downlink(world):
    world.registry["r"] = info("r", "node-x")
    subscribe(world.router, "r", "a/b")
    dispatch(world)
    assert [(t, k) for t, k, _ in world.bus.published] == [(T.downlink_basic("node-x"), "r")]


def test_an_offline_non_persistent_client_elsewhere_gets_nothing(world):
    world.registry["r"] = info("r", connected=False)
    subscribe(world.router, "r", "a/b")
    dispatch(world)
    assert world.bus.published == []


def test_a_persistent_device_elsewhere_or_offline_goes_through_tbmq_msg_persisted(world):
    world.registry["r"] = info("r", connected=False, persistent=True)
    subscribe(world.router, "r", "a/b")
    dispatch(world)
    assert [(t, k) for t, k, _ in world.bus.published] == [(T.msg_persisted, "r")]


def test_a_persistent_application_goes_through_its_own_topic(world):
    world.registry["app"] = info("app", persistent=True, client_type=ClientType.APPLICATION)
    world.sessions["app2"] = FakeSession("app2", persistent=True,
                                         client_type=ClientType.APPLICATION)
    subscribe(world.router, "app", "a/b")
    subscribe(world.router, "app2", "a/#")
    dispatch(world)
    assert sorted((t, k) for t, k, _ in world.bus.published) == [
        (T.app("app"), "app"), (T.app("app2"), "app2")]


def test_an_application_shared_subscription_goes_through_the_shared_topic_once(world):
    for cid in ("m1", "m2"):
        world.registry[cid] = info(cid, persistent=True, client_type=ClientType.APPLICATION)
        subscribe(world.router, cid, "$share/g/a/+")
        subscribe(world.router, cid, "$share/h/a/+")
    dispatch(world)
    assert [(t, k) for t, k, _ in world.bus.published] == [(T.app_shared("a/+"), "a/b")]


def test_a_device_shared_subscription_gives_each_message_to_one_member(world):
    for cid in ("d1", "d2"):
        world.sessions[cid] = FakeSession(cid)
        subscribe(world.router, cid, "$share/g/a/b")
    for _ in range(4):
        dispatch(world)
    assert [len(world.sessions[c].delivered) for c in ("d1", "d2")] == [2, 2]


def test_one_copy_per_client_at_the_highest_qos_with_every_identifier(world):
    s = world.sessions["c"] = FakeSession("c")
    subscribe(world.router, "c", "a/+", qos=0, subscription_id=1)
    subscribe(world.router, "c", "a/#", qos=2, subscription_id=2)
    dispatch(world, qos=2)
    assert [(q, sorted(sids)) for _, q, _, sids, _ in s.delivered] == [(2, [1, 2])]


def test_no_local_skips_the_publisher(world):
    s = world.sessions["p"] = FakeSession("p")
    subscribe(world.router, "p", "a/b", no_local=True)
    dispatch(world, publisher="p")
    assert s.delivered == []


def sink_targets(world) -> None:
    """Subscribers of ``a/b`` that each cost one sink send: a client on
    another node, a persistent device, a persistent application, an
    application share group."""
    world.registry["r"] = info("r", "node-x")
    world.sessions["d"] = FakeSession("d", persistent=True)
    world.registry["app"] = info("app", persistent=True, client_type=ClientType.APPLICATION)
    for client_id in ("r", "d", "app"):
        subscribe(world.router, client_id, "a/#")
    world.registry["m"] = info("m", persistent=True, client_type=ClientType.APPLICATION)
    subscribe(world.router, "m", "$share/g/a/b")


def test_the_sink_sends_of_a_record_are_one_completion(world):
    sink_targets(world)
    world.bus.hold = True
    result, _ = dispatch(world)
    assert type(result) is Completion  # no Deferred per message
    assert sorted(t for t, _, _ in world.bus.published) == sorted([
        T.downlink_basic("node-x"), T.msg_persisted, T.app("app"), T.app_shared("a/b")])
    assert len(world.bus.dones) == 4 and not result.complete
    fired: list = []
    result.then(fired.append)
    for done in world.bus.dones[:3]:
        done(None)
    assert fired == [] and not result.complete  # committed only once every one is
    world.bus.dones[3](None)
    assert fired == [None]


def test_a_failed_sink_send_fails_the_record_at_once(world):
    sink_targets(world)
    world.bus.hold = True
    result, _ = dispatch(world)
    fired: list = []
    result.then(fired.append)
    refused = Failure(BusPublishError("Kafka did not acknowledge the record"))
    world.bus.dones[1](refused)
    assert fired == [refused]  # left uncommitted: read again
    for done in world.bus.dones[2:] + world.bus.dones[:1]:
        done(None)
    assert fired == [refused]


def test_sink_sends_answered_during_the_call_give_a_complete_completion(world):
    world.registry["r"] = info("r", "node-x")
    subscribe(world.router, "r", "a/b")
    result, _ = dispatch(world)
    assert type(result) is Completion and result.succeeded
    world.sessions["c"] = FakeSession("c")
    subscribe(world.router, "c", "only/here")
    assert dispatch(world, topic="only/here")[0] is None  # nothing sent: nothing made


def test_a_batch_of_records_is_routed_in_order_under_one_completion(world):
    """The batch handler of ``tbmq.msg.all`` (a packed record's messages):
    each routed as alone, in order; the sends of all of them are one
    completion, done once every one is."""
    assert world.router.consumer.batch_handler == world.router._on_messages
    s = world.sessions["c"] = FakeSession("c")
    subscribe(world.router, "c", "here/+")
    world.registry["r"] = info("r", "node-x")
    subscribe(world.router, "r", "there/+")
    world.bus.hold = True
    batch = [Message(t, b"x", 1, False, {}, "p", 1.0)
             for t in ("here/1", "there/1", "nobody", "here/2", "there/2")]
    result = world.router._on_messages(batch)
    assert [d[0] for d in s.delivered] == ["here/1", "here/2"]
    assert [v.message.topic for _, _, v in world.bus.published] == ["there/1", "there/2"]
    fired: list = []
    result.then(fired.append)
    world.bus.dones[0](None)
    assert fired == []
    world.bus.dones[1](None)
    assert fired == [None]
    assert world.router._on_messages(batch[:1] + batch[2:3]) is None  # nothing sent


def test_publish_hands_done_to_the_bus_and_a_retained_message_waits_for_both(world):
    bus, router = world.bus, world.router
    bus.hold = True
    outcomes: list = []
    assert router.publish(Message("a/b", b"x", 1, False, {}, "p", 1.0), outcomes.append) is None
    assert [t for t, _, _ in bus.published] == [T.msg_all]
    bus.dones[0](None)
    assert outcomes == [None]
    retained: list = []
    router.publish(Message("a/r", b"x", 1, True, {}, "p", 1.0), retained.append)
    assert [t for t, _, _ in bus.published[1:]] == [T.msg_retained, T.msg_all]
    refused = Failure(BusPublishError("not acknowledged"))
    bus.dones[2](refused)
    assert retained == [refused]  # the first failure, once
    bus.dones[1](None)
    assert retained == [refused]
    # a Deferred, for a caller that wants one
    d = deferred_done(lambda done: router.publish(Message("a/b", b"y", 1, False, {}, "p", 1.0),
                                                  done))
    assert isinstance(d, defer.Deferred) and not d.called
    bus.dones[3](None)
    assert d.called and d.result is None


# -- a session without a broker ---------------------------------------------------------


class FakeConnection:
    def __init__(self) -> None:
        self.protocol_level = 4
        self.send_quota = 2
        self.max_packet_size = None
        self.topic_alias_maximum = 0
        self.paused = False
        self.paused_bytes = 0
        self.auth = None
        self.out = b""
        self.closed_with = None

    def write(self, data: bytes) -> None:
        self.out += data

    def send(self, packet) -> None:
        from tbmq.mqtt.codec import encode
        self.write(encode(packet, self.protocol_level))

    def disconnect(self, code, reason=None) -> None:
        self.closed_with = code

    def make_link(self):
        return self  # what the session sees of it: the same values


class Source:
    def __init__(self) -> None:
        self.paused = False

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False


def make_session(device_store=None, persistent=False, **mqtt):
    clock = task.Clock()
    config = load_config(None, environ={}, overrides={"mqtt": mqtt})
    hooks = SimpleNamespace(wants_delivered=False, wants_dropped=False, wants_published=False)
    ctx = SessionContext(clock=clock, mqtt=config.mqtt, hooks=hooks, drops=DropCounter(),
                         flusher=TurnFlusher(clock), holds=Holds(), device_store=device_store,
                         publish=lambda m: None, retained_for=lambda f: [],
                         subscriptions=None, topics=TopicNameCache())
    session = Session(ctx, "s", persistent=persistent)
    conn = FakeConnection()
    session.attach(conn)
    return session, conn, clock, ctx


def test_a_session_holds_its_source_at_the_high_water_mark_and_lets_go_when_drained():
    session, conn, clock, ctx = make_session(max_pending_messages=4)
    source = Source()
    for i in range(6):  # 2 in flight, 4 queued
        session.deliver(Message("t", b"%d" % i, 1), 1, False, (), None, clock.seconds(), source)
    assert len(session.inflight) == 2 and len(session.queue) == 4 and source.paused
    sent = Decoder(protocol_level=4, server_side=False).feed(conn.out)
    for p in sent:
        on_puback(session, p)
    assert len(session.queue) == 4  # one pump for both, when the turn ends
    clock.advance(0)
    assert len(session.queue) == 2 and not source.paused  # at the low-water mark
    assert not any(ctx.drops.counts.values())


def test_a_slow_session_past_its_credit_overflows_with_0x97_and_counts_the_loss():
    session, conn, clock, ctx = make_session(max_pending_messages=2, outbound_pause_timeout=1)
    source = Source()
    for i in range(4):
        session.deliver(Message("t", b"%d" % i, 1), 1, False, (), None, clock.seconds(), source)
    assert source.paused
    clock.advance(1)
    assert session.outbox.slow and not source.paused
    session.deliver(Message("t", b"over", 1), 1, False, (), None, clock.seconds(), source)
    assert conn.closed_with == 0x97
    assert {k: n for k, n in ctx.drops.counts.items() if n} == {"quota_exceeded": 5}


class SlowLoads:
    """A memory device store whose reads return what was there when they
    were called, once the test releases them."""

    def __init__(self) -> None:
        from tbmq.backends.memory import MemoryDeviceMessageStore
        self.store = MemoryDeviceMessageStore()
        self.loads: list[tuple[defer.Deferred, list]] = []

    def __getattr__(self, name):
        return getattr(self.store, name)

    def load(self, client_id, after_seq=None, limit=None):
        now: list = []
        self.store.load(client_id, after_seq, limit).addCallback(now.extend)
        d = defer.Deferred()
        self.loads.append((d, now))
        return d

    def release(self) -> None:
        d, result = self.loads.pop(0)
        d.callback(result)


def test_an_attach_marker_during_the_first_read_has_the_session_read_the_store_again():
    from tbmq.model import StoredDelivery
    store = SlowLoads()
    session, conn, clock, ctx = make_session(store, persistent=True)
    session.session_id = "conn-1"
    store.add("s", [StoredDelivery(10, Message("t", b"first", 1), 1, False, ())])
    session.outbox.resume()  # the first read, under way
    # the writer stored one more after that read began, then passed the marker on
    store.add("s", [StoredDelivery(20, Message("t", b"stored after", 1), 1, False, ())])
    session.on_attached("an-older-connection")  # ignored
    session.on_attached("conn-1")
    store.release()  # the first read's result is not used: the store is read again
    assert conn.out == b"" and len(store.loads) == 1
    store.release()
    sent = Decoder(protocol_level=4, server_side=False).feed(conn.out)
    assert [p.payload for p in sent] == [b"first", b"stored after"]
    # a marker that comes again reads again, and sends nothing twice: not
    # what is in flight, nor what was acknowledged while the store was read
    session.on_attached("conn-1")
    on_puback(session, sent[0])
    store.release()
    assert Decoder(protocol_level=4, server_side=False).feed(conn.out) == sent
    assert list(session.inflight) == [sent[1].packet_id]


def test_a_resumed_session_reads_the_store_once_its_marker_is_back_or_after_a_wait():
    from tbmq.model import StoredDelivery
    store = SlowLoads()
    session, conn, clock, ctx = make_session(store, persistent=True)
    session.session_id = "conn-1"
    store.add("s", [StoredDelivery(10, Message("t", b"first", 1), 1, False, ())])
    session.outbox.resume(marker=True)
    assert store.loads == []  # not before the marker is back
    session.on_attached("conn-1")  # back during its publish: no timer armed after it
    assert len(store.loads) == 1
    session.outbox.reader.marker_sent()
    reader = session.outbox.reader
    assert not reader.awaiting_marker and reader.marker_timer is None
    assert not clock.getDelayedCalls()
    store.release()
    assert [p.payload for p in Decoder(protocol_level=4, server_side=False).feed(conn.out)] \
        == [b"first"]
    clock.advance(session.outbox.reader.MARKER_WAIT)
    assert store.loads == []  # the marker came: no read after the wait
    # a marker that does not come back (the writer's partition has not
    # moved yet): the store is read after the wait, and again when it comes
    conn2 = FakeConnection()
    session.detach(clock.seconds())
    session.attach(conn2)
    session.session_id = "conn-2"
    session.outbox.resume(marker=True)
    session.outbox.reader.marker_sent()  # published, not back: the wait starts
    clock.advance(session.outbox.reader.MARKER_WAIT - 0.1)
    assert store.loads == []
    clock.advance(0.1)
    assert len(store.loads) == 1
    store.release()
    assert [p.payload for p in Decoder(protocol_level=4, server_side=False).feed(conn2.out)] \
        == [b"first"]
    session.on_attached("conn-2")
    assert len(store.loads) == 1


def test_an_older_delivery_the_store_reads_did_not_show_is_read_from_the_store_not_dropped():
    """A partition of ``tbmq.msg.persisted`` moved between two live nodes:
    the new writer hands the session here a delivery at once, and the old
    writer's forward of an older one (lower seq, committed there, so never
    handled again) comes after it.  No read of the store showed the older
    one: it is read from the store, not dropped as already read."""
    from tbmq.model import StoredDelivery
    store = SlowLoads()
    session, conn, clock, ctx = make_session(store, persistent=True)
    session.session_id = "conn-1"
    session.outbox.resume()
    store.release()  # the first read: nothing stored yet
    newer = StoredDelivery(200, Message("t", b"new writer", 1), 1, False, ())
    store.add("s", [newer])
    session.deliver_stored(newer)
    older = StoredDelivery(150, Message("t", b"old writer", 1), 1, False, ())
    store.add("s", [older])
    session.deliver_stored(older)
    while store.loads:
        store.release()
    sent = Decoder(protocol_level=4, server_side=False).feed(conn.out)
    assert [p.payload for p in sent] == [b"new writer", b"old writer"]
    assert not sent[1].dup


def test_a_delivery_a_store_read_already_showed_is_not_sent_twice():
    """The usual case of an older seq: the writer's forward of a delivery
    the session's read already took (in flight, then acknowledged)."""
    from tbmq.model import StoredDelivery
    store = SlowLoads()
    session, conn, clock, ctx = make_session(store, persistent=True)
    session.session_id = "conn-1"
    first = StoredDelivery(10, Message("t", b"read", 1), 1, False, ())
    store.add("s", [first])
    session.outbox.resume()
    store.release()
    session.deliver_stored(StoredDelivery(10, Message("t", b"read", 1), 1, False, ()))  # in flight
    sent = Decoder(protocol_level=4, server_side=False).feed(conn.out)
    on_puback(session, sent[0])
    clock.advance(0)  # its removal from the store is written
    session.deliver_stored(StoredDelivery(10, Message("t", b"read", 1), 1, False, ()))  # done
    while store.loads:
        store.release()
    assert [p.payload for p in Decoder(protocol_level=4, server_side=False).feed(conn.out)] \
        == [b"read"]


class FailingWrites(SlowLoads):
    """A store whose writes of a session's state (update, remove) fail."""

    def update(self, client_id, seq, packet_id, state):
        return defer.fail(RuntimeError("Not received Redis response in 10.0 seconds"))

    def remove(self, client_id, seqs):
        return defer.fail(RuntimeError("Not received Redis response in 10.0 seconds"))


def test_a_failed_store_write_of_a_session_is_logged_once_not_an_unhandled_error():
    """Under a store outage every PUBLISH sent and every PUBACK makes a
    write: their failures are one warning per interval with a count, not
    an unhandled error per delivery (the delivery stays in the store and
    comes again at the next connection)."""
    import gc

    from twisted.logger import globalLogPublisher
    from tbmq.model import StoredDelivery
    events = []
    globalLogPublisher.addObserver(events.append)
    try:
        store = FailingWrites()
        session, conn, clock, ctx = make_session(store, persistent=True)
        session.outbox.resume()
        store.release()
        for seq in (1, 2, 3):
            stored = StoredDelivery(seq, Message("t", b"%d" % seq, 1), 1, False, ())
            store.store.add("s", [stored])
            session.deliver_stored(stored)
        for p in Decoder(protocol_level=4, server_side=False).feed(conn.out):
            on_puback(session, p)
        clock.advance(0)  # the removes of the acknowledged ones
        gc.collect()
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert not [e for e in events if e.get("isError") or e.get("log_level") is not None
                and e["log_level"].name == "critical"]
    warned = [e for e in events if "device store write" in e.get("log_format", "")]
    # the QoS 1 sends' SENT states wait (tbmq.broker.sent_states) and the
    # PUBACKs cancel them: the first write is the removal
    assert len(warned) == 1 and warned[0]["operation"] == "remove"


def carried(value) -> tuple:
    """``(topics, qos, retain, type)`` of a downlink record: a run's
    messages, or a lone delivery's one."""
    messages = value.messages if type(value) is DeliveryRun else [value.message]
    return [m.topic for m in messages], value.qos, value.retain, type(value).__name__


def test_a_batchs_deliveries_to_one_node_go_in_one_send_in_order(world):
    """A bus with ``publish_many`` (Kafka) gets a batch's deliveries to one
    node's downlink in one call with one ``done``; the batch's completion
    waits for it, and a failure of it fails the batch."""
    many: list = []
    world.bus.publish_many = lambda topic, keys, values, done: many.append(
        (topic, keys, values, done))
    world.router.sinks = Sinks.build(world.bus, T)
    world.registry["r"] = info("r", "node-x")
    world.registry["q"] = info("q", "node-y")
    subscribe(world.router, "r", "there/+")
    subscribe(world.router, "q", "there/2")
    batch = [Message(t, b"x", 1, False, {}, "p", 1.0) for t in ("there/1", "there/2", "there/3")]
    result = world.router._on_messages(batch)
    assert world.bus.published == []  # nothing one by one
    # a client's messages of the batch: one run (DeliveryRun) on its node's
    # downlink; a client with one message: a Delivery
    assert [(topic, keys, [carried(v) for v in values]) for topic, keys, values, _ in many] == [
        (T.downlink_basic("node-x"), ["r"],
         [(["there/1", "there/2", "there/3"], 1, False, "DeliveryRun")]),
        (T.downlink_basic("node-y"), ["q"], [(["there/2"], 1, False, "Delivery")])]
    fired: list = []
    result.then(fired.append)
    many[0][3](None)
    assert fired == []
    failed = Failure(BusPublishError("not acknowledged"))
    many[1][3](failed)
    assert fired == [failed]  # read again


def test_a_batch_classifies_a_target_elsewhere_once_per_qos_class(world):
    """In a batch, a client without a session here is looked up once for
    its QoS 0 deliveries and once for its QoS 1/2 ones (they may go to
    different sinks: a persistent DEVICE's QoS 0 to its node's downlink,
    its QoS 1 to the device store); every delivery still goes out, in
    order, to the sink of its class."""
    many: list = []
    world.bus.publish_many = lambda topic, keys, values, done: many.append(
        (topic, keys, values, done))
    world.router.sinks = Sinks.build(world.bus, T)
    asked: list = []
    world.router.lookup = lambda client_id: asked.append(client_id) or world.registry.get(
        client_id)
    world.registry["d"] = info("d", "node-x", persistent=True)
    subscribe(world.router, "d", "there/+", qos=1)
    batch = [Message(f"there/{i}", b"x", qos, False, {}, "p", 1.0)
             for i, qos in enumerate((1, 0, 1, 0, 1))]
    world.router._on_messages(batch)
    assert asked == ["d", "d"]
    # the device store's deliveries of the client: one run (a record of
    # the downlink between them does not end it: another topic)
    assert [(topic, keys, [carried(r) for r in runs]) for topic, keys, runs, _ in many[:1]] == [
        (T.msg_persisted, ["d"], [(["there/0", "there/2", "there/4"], 1, False, "DeliveryRun")])]
    ((topic, keys, runs, _),) = many[1:]
    assert (topic, keys, [carried(r) for r in runs]) == (
        T.downlink_basic("node-x"), ["d"], [(["there/1", "there/3"], 0, False, "DeliveryRun")])


def batch_sends_and_classes(world) -> tuple[list, list]:
    """The router of ``world`` on sinks that send runs, recording each
    ``publish_many`` call as ``(topic, keys, values, done)`` and each
    classification as ``(client_id, qos)``: the two lists, in that order."""
    many: list = []
    world.bus.publish_many = lambda topic, keys, values, done: many.append(
        (topic, keys, values, done))
    world.router.sinks = Sinks.build(world.bus, T)
    classified: list = []
    classify = world.router.classify
    world.router.classify = lambda client_id, session, qos: (
        classified.append((client_id, qos)) or classify(client_id, session, qos))
    return many, classified


def test_a_batch_classifies_a_persistent_session_here_once_per_qos_class(world):
    """In a batch, a persistent session of this node is classified once for
    its QoS 1/2 deliveries (its APPLICATION topic or the device store, as
    one elsewhere), and its QoS 0 ones are written to it now; every
    delivery goes out in order, in one send per sink and place, and the
    clock is read once for the batch."""
    many, classified = batch_sends_and_classes(world)
    app = world.sessions["app"] = FakeSession("app", persistent=True,
                                              client_type=ClientType.APPLICATION)
    world.sessions["dev"] = FakeSession("dev", persistent=True)
    subscribe(world.router, "app", "here/+")
    subscribe(world.router, "dev", "here/2")
    read: list = []
    seconds = world.router._seconds
    world.router._seconds = lambda: read.append(1) or seconds()
    batch = [Message(f"here/{i}", b"x", qos, False, {}, "p", 1.0)
             for i, qos in enumerate((1, 0, 1, 2, 1))]
    world.router._on_messages(batch)
    assert classified == [("app", 1), ("dev", 1)]
    assert [(m[0], m[1], m[3]) for m in app.delivered] == [("here/1", 0, ())]
    # the APPLICATION client's QoS 1 messages (at most QoS 1 granted) as one run
    assert [(topic, keys, [carried(v) for v in values]) for topic, keys, values, _ in many] == [
        (T.app("app"), ["app"],
         [(["here/0", "here/2", "here/3", "here/4"], 1, False, "DeliveryRun")]),
        (T.msg_persisted, ["dev"], [(["here/2"], 1, False, "Delivery")])]
    assert read == [1]


@pytest.mark.parametrize("packs", [True, False], ids=["kafka", "in-process"])
def test_an_application_clients_qos1_messages_go_as_runs(world, packs):
    """On every bus (Kafka, ``bus.packs``, and the in-process bus of the
    embedded node) a batch's QoS 1 messages to a persistent APPLICATION
    client go to its topic as one DeliveryRun; QoS 2 ones as a Delivery
    each (a run comes again whole when its connection ends before all of
    it is acknowledged: a completed QoS 2 message must not)."""
    many: list = []
    world.bus.publish_many = lambda topic, keys, values, done: many.append(
        (topic, keys, values, done))
    world.bus.packs = packs
    world.router.sinks = Sinks.build(world.bus, T)
    world.registry["app"] = info("app", "node-x", persistent=True,
                                 client_type=ClientType.APPLICATION)
    subscribe(world.router, "app", "t/+", qos=2)
    batch = [Message(f"t/{i}", b"x", qos, False, {}, "p", 1.0)
             for i, qos in enumerate((1, 1, 1, 2, 2, 1, 1))]
    world.router._on_messages(batch)
    ((topic, keys, values, _),) = many
    assert topic == T.app("app") and keys == ["app"] * len(values)
    assert [carried(v) for v in values] == [
        (["t/0", "t/1", "t/2"], 1, False, "DeliveryRun"), (["t/3"], 2, False, "Delivery"),
        (["t/4"], 2, False, "Delivery"), (["t/5"], 1, False, "Delivery"),
        (["t/6"], 1, False, "Delivery")]


def test_a_run_on_the_downlink_keeps_a_clients_order_across_qos_and_flags(world):
    """A client's messages of a batch with another QoS, RETAIN flag or set
    of subscription identifiers start a new run, after the last one, so
    that the node reading the downlink delivers them in the order routed."""
    many: list = []
    world.bus.publish_many = lambda topic, keys, values, done: many.append(
        (topic, keys, values, done))
    world.router.sinks = Sinks.build(world.bus, T)
    world.registry["r"] = info("r", "node-x")
    subscribe(world.router, "r", "t/+", qos=2, retain_as_published=True)
    batch = [Message(f"t/{i}", b"x", qos, retain, {}, "p", 1.0)
             for i, (qos, retain) in enumerate(
                 [(1, False), (1, False), (0, False), (1, False), (1, True), (2, True),
                  (2, True)])]
    world.router._on_messages(batch)
    ((topic, keys, runs, _),) = many
    assert topic == T.downlink_basic("node-x") and keys == ["r"] * len(runs)
    assert [carried(r)[:3] for r in runs] == [
        (["t/0", "t/1"], 1, False), (["t/2"], 0, False), (["t/3"], 1, False),
        (["t/4"], 1, True), (["t/5", "t/6"], 2, True)]


def test_a_run_on_the_downlink_is_bounded_in_messages_and_payload_bytes(world):
    """A run past :data:`RUN_MAX_MESSAGES` messages or :data:`RUN_MAX_BYTES`
    of payload continues in the next run (a Kafka record has a size limit,
    and a consumer's buffer counts messages)."""
    from tbmq.cluster.records import RUN_MAX_BYTES, RUN_MAX_MESSAGES

    many: list = []
    world.bus.publish_many = lambda topic, keys, values, done: many.append(
        (topic, keys, values, done))
    world.router.sinks = Sinks.build(world.bus, T)
    world.registry["r"] = info("r", "node-x")
    subscribe(world.router, "r", "t/#")
    small = [Message("t/s", b"x", 1, False, {}, "p", 1.0)] * (RUN_MAX_MESSAGES + 1)
    big = [Message("t/b", b"y" * (RUN_MAX_BYTES // 2), 1, False, {}, "p", 1.0)] * 3
    world.router._on_messages(small + big)
    ((_, _, runs, _),) = many
    # the 129th small one, then a big one; the next would pass the bytes: two big ones
    assert [len(carried(r)[0]) for r in runs] == [RUN_MAX_MESSAGES, 2, 2]
    assert [m for r in runs for m in r.messages] == small + big
    # one big message past the bytes of a first one: two lone deliveries
    many.clear()
    huge = Message("t/h", b"z" * (RUN_MAX_BYTES - 10), 1, False, {}, "p", 1.0)
    world.router._on_messages([huge, big[0]])
    ((_, _, values, _),) = many
    assert [carried(v) for v in values] == [(["t/h"], 1, False, "Delivery"),
                                            (["t/b"], 1, False, "Delivery")]


def test_a_batch_asks_the_persisted_limit_for_each_delivery_to_the_device_store(world):
    """Under ``mqtt.rate_limits.device_persisted_messages`` a batch keeps no
    entry for a persistent DEVICE's store: each of its deliveries there is
    admitted on its own, and only those admitted are sent."""
    many: list = []
    world.bus.publish_many = lambda topic, keys, values, done: many.append(
        (topic, keys, values, done))
    world.router.sinks = Sinks.build(world.bus, T)
    asked: list = []

    class Limit:
        def admit_persisted(self, client_id):
            asked.append(client_id)
            return len(asked) % 2 == 1  # every other one

    world.router.persisted_limit = Limit()
    world.registry["d"] = info("d", "node-x", persistent=True)
    subscribe(world.router, "d", "there/+", qos=1)
    batch = [Message(f"there/{i}", b"x", 1, False, {}, "p", 1.0) for i in range(4)]
    world.router._on_messages(batch)
    assert asked == ["d"] * 4
    assert [(topic, keys, [d.message.topic for d in values])
            for topic, keys, values, _ in many] == [
        (T.msg_persisted, ["d", "d"], ["there/0", "there/2"])]


def test_a_batchs_run_of_one_topic_is_routed_to_each_subscriber_at_once_in_order(world):
    """Messages in a row of one topic, QoS and RETAIN flag are routed
    together: a live session gets them in order, each with its own shared
    encoding cache; a persistent DEVICE elsewhere is classified once and
    gets them as one run on ``tbmq.msg.persisted``; a No Local subscriber
    still misses only its own messages."""
    many, classified = batch_sends_and_classes(world)
    caches: list = []
    live = world.sessions["live"] = FakeSession("live")
    deliver = live.deliver
    live.deliver = lambda message, qos, retain, sids, cache, now, source: (
        caches.append(cache), deliver(message, qos, retain, sids, cache, now, source))
    world.registry["dev"] = info("dev", "node-x", connected=False, persistent=True)
    subscribe(world.router, "live", "r/t", qos=0)
    subscribe(world.router, "dev", "r/t")
    batch = [Message("r/t", str(i).encode(), 1, False, {}, "p", 1.0) for i in range(5)]
    world.router._on_messages(batch)
    assert [m[:2] for m in live.delivered] == [("r/t", 0)] * 5
    assert len({id(c) for c in caches}) == 5  # one cache per message, shared by its targets
    assert classified == [("dev", 1)]
    ((topic, keys, values, _),) = many
    assert topic == T.msg_persisted and keys == ["dev"]
    assert [carried(v) for v in values] == [(["r/t"] * 5, 1, False, "DeliveryRun")]
    assert values[0].messages == batch
    # No Local: the filter's run goes message by message, the publisher's own skipped
    many.clear()
    world.sessions["p"] = FakeSession("p")
    subscribe(world.router, "p", "r/t", qos=0, no_local=True)
    mixed = [Message("r/t", b"x", 1, False, {}, publisher, 1.0) for publisher in "pqpq"]
    world.router._on_messages(mixed)
    assert len(world.sessions["p"].delivered) == 2
    assert [v.messages for _, _, values, _ in many for v in values] == [mixed]
