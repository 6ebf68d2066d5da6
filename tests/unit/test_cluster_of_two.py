"""Two broker nodes in one process sharing one in-process bus and one
device store: the cluster logic (delivery targets, downlinks, the session
registry, session events and takeover, wills) before any Kafka exists."""

from __future__ import annotations

import dataclasses

import pytest
from twisted.internet import defer, task

from tbmq.auth import AuthResult
from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.backends.memory import MemoryDeviceMessageStore, MemoryRetainedStore
from tbmq.backends.memory_credentials import MemoryCredentialStore
from tbmq.broker.broker import Broker
from tbmq.broker.protocol import MQTTFactory
from tbmq.cluster.sinks import BusSink, write_marker
from tbmq.config import load_config
from tbmq.hookspecs import hookimpl
from tbmq.model import ClientType, Message, StoredDelivery
from tbmq.mqtt import (
    Disconnect, Property, Puback, Pubcomp, Publish, Pubrec, Pubrel, Subscribe,
    SubscriptionRequest, Will,
)
from tbmq.plugins import make_plugin_manager
from tests.helpers import Harness


class ApplicationsByName:
    """Authenticates client ids starting with ``app`` as APPLICATION clients
    (in a real node the credentials say so)."""

    @hookimpl(tryfirst=True)
    def tbmq_authenticate(self, request):
        if request.client_id.startswith("app"):
            return AuthResult(True, client_type=ClientType.APPLICATION, provider="test",
                              credentials_name="applications")
        return None


class SharedBus:
    """One node's handle on the bus the nodes share: the node starts and
    stops its handle, the cluster owns the bus (each Kafka client of a real
    node is its own)."""

    def __init__(self, bus) -> None:
        self._bus = bus

    def __getattr__(self, name):
        return getattr(self._bus, name)

    def start(self):
        return defer.succeed(None)

    def stop(self):
        return defer.succeed(None)


class Node:
    """One broker node on the shared bus, clock and device store."""

    def __init__(self, cluster: "Cluster", service_id: str) -> None:
        self.clock = cluster.clock
        self.config = load_config(None, environ={}, overrides={
            "storage": {"backend": "memory"}, "node": {"service_id": service_id},
            "auth": {"credentials": "memory"}, "mqtt": cluster.mqtt})
        plugins = make_plugin_manager(self.config, load_entry_points=False)
        plugins.register(ApplicationsByName(), name="test-applications")
        self.broker = Broker(self.config, plugins, self.clock, bus=SharedBus(cluster.bus),
                             retained_store=MemoryRetainedStore(),
                             device_store=cluster.device_store,
                             credential_store=MemoryCredentialStore())
        started = self.broker.start()
        assert started.called, "memory backends start at once"
        self.factory = MQTTFactory(self.broker, self.config.listeners[0])

    def turn(self) -> None:
        self.clock.advance(0)

    def kill(self) -> None:
        """Die as a killed process does: no more heartbeats, every consumer
        gone from its group, nothing said to anyone (its clients' sockets
        are left as they are)."""
        broker = self.broker
        broker.membership._loop.stop()
        consumers = broker.consumers()
        for session in broker.sessions.sessions.values():
            for name in ("will_timer", "expiry_timer"):
                timer = getattr(session, name)
                if timer is not None and timer.active():
                    timer.cancel()
        for consumer in consumers:
            consumer.stop()

    #: connect a client to this node (consumes its CONNACK)
    client = Harness.client


class Cluster:
    """:param mqtt: ``mqtt`` settings of both nodes."""

    def __init__(self, encode: bool, mqtt: dict | None = None) -> None:
        self.mqtt = mqtt or {}
        self.clock = task.Clock()
        self.clock.advance(1_700_000_000)
        self.bus = InProcessBus(clock=self.clock, encode=encode)
        self.bus.start()
        self.device_store = MemoryDeviceMessageStore()
        self.a = Node(self, "node-a")
        self.b = Node(self, "node-b")

    def third(self) -> Node:
        """:returns: a third node, joining now."""
        return Node(self, "node-c")


def sub(client, topic_filter, qos=1):
    client.send(Subscribe(1, [SubscriptionRequest(topic_filter, qos)]))
    return client.received()


@pytest.fixture(params=[False, True], ids=["direct", "encoded"])
def cluster(request):
    """Both modes of the bus: objects handed over, or every record encoded
    and decoded (as on Kafka)."""
    return Cluster(encode=request.param)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publisher_on_a_subscribers_on_b(cluster, qos):
    s1 = cluster.b.client("s1")
    s2 = cluster.b.client("s2", level=5)
    assert sub(s1, "t/#", 2)[0].reason_codes == [2]
    assert sub(s2, "t/+", 2)[0].reason_codes == [2]
    crossed = []

    class Counting(BusSink):
        __slots__ = ()

        def send(self, service_id, client_id, value, done=None):
            crossed.append((service_id, client_id))
            return BusSink.send(self, service_id, client_id, value, done)

        def send_many(self, service_id, client_ids, values, done):
            crossed.extend((service_id, c) for c in client_ids)
            return BusSink.send_many(self, service_id, client_ids, values, done)

    router = cluster.a.broker.router
    sinks = router.sinks
    router.sinks = sinks._replace(downlink=Counting(sinks.downlink.bus, sinks.downlink.topic_of))
    p = cluster.a.client("p")
    p.send(Publish("t/x", b"hello", qos=qos, packet_id=7 if qos else None))
    if qos == 1:
        assert p.received() == [Puback(7)]
    elif qos == 2:
        assert p.received() == [Pubrec(7)]
        p.send(Pubrel(7))
        assert p.received() == [Pubcomp(7)]
    for s in (s1, s2):
        got = s.received()
        assert [(m.topic, m.payload, m.qos) for m in got] == [("t/x", b"hello", qos)]
    assert cluster.a.broker.registry.locate("s1") == "node-b"
    # node a consumes tbmq.msg.all (one partition, its member joined first):
    # the deliveries crossed to node b on its downlink topic
    assert sorted(crossed) == [("node-b", "s1"), ("node-b", "s2")]


def test_a_persistent_device_offline_on_a_gets_everything_in_order_on_b(cluster):
    d = cluster.a.client("dev", clean_start=False)
    sub(d, "cmd/dev")
    d.send(Disconnect())
    d.lose()
    p = cluster.b.client("p")
    for i in range(30):
        p.send(Publish("cmd/dev", b"%d" % i, qos=1, packet_id=i + 1))
    assert p.received() == [Puback(i + 1) for i in range(30)]
    again = cluster.b.client("dev", clean_start=False)
    assert again.connack.session_present is True
    got = again.pending + again.received()
    assert [m.payload for m in got] == [b"%d" % i for i in range(30)]
    assert "dev" not in cluster.a.broker.sessions.sessions  # a no longer owns it
    assert cluster.a.broker.registry.locate("dev") == "node-b"


def test_a_persistent_application_offline_on_a_gets_everything_in_order_on_b(cluster):
    """Its messages wait in its own topic tbmq.msg.app.<clientId>, not in
    the device store, and what it did not acknowledge comes again."""
    app = cluster.a.client("app-1", level=5, clean_start=False,
                           properties={Property.SESSION_EXPIRY_INTERVAL: 600})
    sub(app, "telemetry/#")
    assert cluster.a.broker.sessions.sessions["app-1"].client_type is ClientType.APPLICATION
    p = cluster.b.client("p")
    p.send(Publish("telemetry/1", b"live", qos=1, packet_id=1))
    first = app.received()
    assert [m.payload for m in first] == [b"live"]  # not acknowledged
    app.lose()
    for i in range(20):
        p.send(Publish("telemetry/1", b"%d" % i, qos=1, packet_id=i + 2))
    assert p.received() == [Puback(i + 1) for i in range(21)]
    stored = []
    cluster.device_store.count("app-1").addCallback(stored.append)
    assert stored == [0]  # not the device store's
    again = cluster.b.client("app-1", level=5, clean_start=False,
                             properties={Property.SESSION_EXPIRY_INTERVAL: 600})
    assert again.connack.session_present is True
    got = again.pending + again.received()
    assert [m.payload for m in got] == [b"live"] + [b"%d" % i for i in range(20)]
    for m in got:
        again.send(Puback(m.packet_id))
    again.lose()
    third = cluster.a.client("app-1", level=5, clean_start=False,
                             properties={Property.SESSION_EXPIRY_INTERVAL: 600})
    assert third.pending + third.received() == []  # all committed


def test_an_application_shared_subscription_gives_each_message_to_one_member(cluster):
    """Its members read tbmq.msg.app.shared.<filter> in one consumer group;
    a member that leaves hands what it did not acknowledge to the others."""
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 600}
    m1 = cluster.a.client("app-m1", level=5, clean_start=False, properties=expiry)
    m2 = cluster.b.client("app-m2", level=5, clean_start=False, properties=expiry)
    for m in (m1, m2):
        assert sub(m, "$share/g/jobs/#")[0].reason_codes == [1]
    p = cluster.a.client("p")
    for i in range(10):
        p.send(Publish("jobs/x", b"%d" % i, qos=1, packet_id=i + 1))
    assert p.received() == [Puback(i + 1) for i in range(10)]
    got = m1.received() + m2.received()
    assert sorted(m.payload for m in got) == sorted(b"%d" % i for i in range(10))
    shared = cluster.a.broker.topics.app_shared("jobs/#")
    assert shared in cluster.bus.topics()


def test_a_client_connecting_to_b_while_connected_to_a_is_taken_over(cluster):
    old = cluster.a.client("dup", level=5)
    new = cluster.b.client("dup", level=5)
    assert new.connack.reason_code == 0
    assert old.received() == [Disconnect(0x8E)] and old.closed
    old.lose()
    assert not new.closed
    assert cluster.a.broker.registry.locate("dup") == "node-b"
    assert cluster.b.broker.sessions.sessions["dup"].connection is new.protocol


def test_a_will_fires_once_in_the_cluster(cluster):
    watchers = [cluster.a.client("wa"), cluster.b.client("wb")]
    for w in watchers:
        sub(w, "wills/#")
    dying = cluster.a.client("dying", level=5, will=Will("wills/dying", b"bye", qos=1))
    dying.lose()
    for w in watchers:
        assert [m.payload for m in w.received()] == [b"bye"]
    cluster.clock.advance(10)
    for w in watchers:
        assert w.received() == []


def test_a_delayed_will_is_not_fired_when_the_session_resumes_on_another_node(cluster):
    watcher = cluster.b.client("watch")
    sub(watcher, "wills/#")
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 300}
    will = Will("wills/w", b"gone", qos=1, properties={Property.WILL_DELAY_INTERVAL: 5})
    first = cluster.a.client("w", level=5, clean_start=False, will=will, properties=expiry)
    first.lose()
    again = cluster.b.client("w", level=5, clean_start=False, properties=expiry)
    assert again.connack.session_present is True
    cluster.clock.advance(10)
    assert watcher.received() == []  # [MQTT-3.1.3-9]


def test_a_killed_nodes_sessions_are_taken_over_once_with_their_wills(cluster):
    c = cluster.third()
    watchers = [cluster.b.client("wb"), c.client("wc")]
    for w in watchers:
        sub(w, "wills/#")
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 120}
    cluster.a.client("persistent", level=5, clean_start=False, properties=expiry,
                     will=Will("wills/persistent", b"p", qos=1))
    cluster.a.client("plain", level=5, will=Will("wills/plain", b"n", qos=1))
    delayed = Will("wills/delayed", b"d", qos=1, properties={Property.WILL_DELAY_INTERVAL: 20})
    cluster.a.client("delayed", level=5, clean_start=False, properties=expiry, will=delayed)
    cluster.clock.advance(1)
    cluster.a.kill()
    timeout = cluster.a.config.node.node_timeout
    for _ in range(int(timeout) + 6):
        cluster.clock.advance(1)
    for w in watchers:
        assert sorted(m.payload for m in w.received()) == [b"n", b"p"]
    registry = cluster.b.broker.registry
    assert "plain" not in registry.sessions  # a non-persistent session ended with its node
    for client_id in ("persistent", "delayed"):
        info = registry.get(client_id)
        assert info.service_id in ("node-b", "node-c") and not info.connected
        assert c.broker.registry.get(client_id) == info
    assert cluster.b.broker.membership.alive() == ["node-b", "node-c"]
    cluster.clock.advance(20)  # the delayed will is due 20 s after its node died
    for w in watchers:
        assert [m.payload for m in w.received()] == [b"d"]
    cluster.clock.advance(120)  # and the sessions expire on their new node
    assert "persistent" not in registry.sessions and "delayed" not in registry.sessions
    for w in watchers:
        assert w.received() == []


def test_a_persistent_device_of_a_killed_node_gets_what_it_missed_on_another(cluster):
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 300}
    device = cluster.a.client("dev", level=5, clean_start=False, properties=expiry)
    sub(device, "cmd/dev", qos=1)
    cluster.a.kill()
    publisher = cluster.b.client("pub")
    for i in range(5):
        publisher.send(Publish("cmd/dev", str(i).encode(), qos=1, packet_id=i + 1))
    assert [p.packet_id for p in publisher.received()] == [1, 2, 3, 4, 5]
    for _ in range(int(cluster.a.config.node.node_timeout) + 6):
        cluster.clock.advance(1)
    again = cluster.b.client("dev", level=5, clean_start=False, properties=expiry)
    assert again.connack.session_present is True
    got = again.pending + again.received()
    assert [m.payload for m in got] == [b"0", b"1", b"2", b"3", b"4"]


def test_a_node_that_stops_cleanly_hands_its_offline_sessions_over_at_once(cluster):
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 60}
    cluster.a.client("kept", level=5, clean_start=False, properties=expiry).lose()
    stopped = cluster.a.broker.stop()
    cluster.clock.advance(1)
    assert stopped.called
    info = cluster.b.broker.registry.get("kept")
    assert info.service_id == "node-b" and not info.connected
    cluster.clock.advance(61)
    assert cluster.b.broker.registry.get("kept") is None


def test_a_late_disconnect_of_a_replaced_connection_does_not_undo_the_takeover(cluster):
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 300}
    topic = cluster.a.broker.topics.client_session
    last: dict = {}
    cluster.bus.subscribe(topic, "watcher", lambda record: last.__setitem__(record.key,
                                                                            record.value))
    old = cluster.a.client("late", level=5, clean_start=False, properties=expiry)
    stale = cluster.a.broker.registry.get("late")
    new = cluster.b.client("late", level=5, clean_start=False, properties=expiry)
    assert new.connack.reason_code == 0
    # node A's record of its old connection, offline, lands after the
    # takeover (written before node A heard of the new connection)
    cluster.bus.publish(topic, "late", dataclasses.replace(
        stale, connected=False, disconnected_at=cluster.clock.seconds()))
    cluster.clock.advance(0)
    current = cluster.b.broker.sessions.sessions["late"].session_id
    for node in (cluster.a, cluster.b):
        info = node.broker.registry.get("late")
        assert (info.service_id, info.session_id, info.connected) == ("node-b", current, True)
    # and node B said it again: the last record of the key is right
    assert (last["late"].session_id, last["late"].connected) == (current, True)
    old.lose()


def _stored(cluster, client_id: str) -> list:
    """The deliveries the (memory) device store holds for ``client_id``."""
    got: list = []
    cluster.device_store.load(client_id).addCallback(got.extend)
    return got


def _wait(cluster, seconds: int) -> None:
    """Let ``seconds`` pass a second at a time (the nodes' heartbeats go on)."""
    for _ in range(seconds):
        cluster.clock.advance(1.0)


def _writers(cluster, action: str) -> None:
    """Pause or resume the consumers of ``tbmq.msg.persisted`` on both nodes."""
    for node in (cluster.a, cluster.b):
        getattr(node.broker.persisted_writer.consumer, action)()
    cluster.clock.advance(0)


def test_a_resumed_session_reads_again_what_the_writer_stored_before_its_marker(cluster):
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 300}
    first = cluster.a.client("late-dev", level=5, clean_start=False, properties=expiry)
    sub(first, "cmd/late", qos=1)
    first.lose()
    _writers(cluster, "pause")
    again = cluster.b.client("late-dev", level=5, clean_start=False, properties=expiry)
    session = cluster.b.broker.sessions.sessions["late-dev"]
    # the marker does not come back (the writers are paused): the session
    # reads the store after a wait, and finds nothing
    _wait(cluster, int(session.outbox.reader.MARKER_WAIT) + 1)
    assert again.pending + again.received() == []
    # what the writer of the client's partition stored after that read, but
    # sent to node A's downlink or nowhere (its registry did not know of the
    # connection on node B yet): the delivery is ahead of the marker
    seq = session.outbox._last_seq
    cluster.device_store.add("late-dev", [StoredDelivery(
        seq + n, Message("cmd/late", b"stale %d" % n, 1), 1, False, ()) for n in (1, 2)])
    _wait(cluster, 60)
    assert again.received() == []  # no timer reads the store again: the marker does
    _writers(cluster, "resume")
    got = again.received()
    assert [m.payload for m in got] == [b"stale 1", b"stale 2"]
    for m in got:
        again.send(Puback(m.packet_id))
    # what comes after the marker is sent once, not read again
    publisher = cluster.a.client("pub-late")
    publisher.send(Publish("cmd/late", b"live", qos=1, packet_id=1))
    got = again.received()
    assert [m.payload for m in got] == [b"live"]
    _wait(cluster, 60)
    assert again.received() == []
    assert [d.message.payload for d in _stored(cluster, "late-dev")] == [b"live"]


def test_a_marker_read_again_keeps_what_is_in_flight_and_ignores_an_older_connection(cluster):
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 300}
    device = cluster.a.client("mark-dev", level=5, clean_start=False, properties=expiry)
    sub(device, "cmd/mark", qos=1)
    publisher = cluster.b.client("pub-mark")
    for n in range(3):
        publisher.send(Publish("cmd/mark", b"m%d" % n, qos=1, packet_id=n + 1))
    got = device.received()
    assert [m.payload for m in got] == [b"m0", b"m1", b"m2"]
    device.send(Puback(got[0].packet_id))  # m1, m2 stay in flight
    session = cluster.a.broker.sessions.sessions["mark-dev"]
    persisted = cluster.a.broker.sinks.persisted
    # the writer passes the marker on again (its partition moved before the
    # marker was committed): the store is read again, nothing is sent twice
    write_marker(persisted, "node-a", "mark-dev", session.session_id, True)
    cluster.clock.advance(0)
    assert device.received() == []
    assert sorted(d.seq for d in session.inflight.values()) == [
        d.seq for d in _stored(cluster, "mark-dev")]
    # a marker of an older connection changes nothing
    write_marker(persisted, "node-a", "mark-dev", "an-older-connection", True)
    cluster.clock.advance(0)
    assert device.received() == []
    for m in got[1:]:
        device.send(Puback(m.packet_id))
    assert _stored(cluster, "mark-dev") == []


@pytest.mark.parametrize("encode", [False, True], ids=["direct", "encoded"])
def test_a_backlogged_session_gets_what_was_stored_behind_its_read_cursor(encode):
    """The kill test's case: the writer stored a delivery after the session's
    first read and sent it elsewhere; newer ones came here and moved the
    session past it; then a backlog kept the session paging for a minute.
    Its marker, not a timer, has the store read again: nothing is left
    behind."""
    cluster = Cluster(encode, mqtt={"max_queued_messages": 20})
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 300, Property.RECEIVE_MAXIMUM: 10}
    first = cluster.a.client("behind", level=5, clean_start=False, properties=expiry)
    sub(first, "cmd/behind", qos=1)
    first.lose()
    _writers(cluster, "pause")
    again = cluster.b.client("behind", level=5, clean_start=False, properties=expiry)
    session = cluster.b.broker.sessions.sessions["behind"]
    # stored after the session's first read, and sent elsewhere: the newer
    # deliveries that come here move the session's read cursor past it
    cluster.device_store.add("behind", [StoredDelivery(
        session.outbox._last_seq + 1, Message("cmd/behind", b"behind", 1), 1, False, ())])
    _writers(cluster, "resume")
    publisher = cluster.a.client("pub-behind")
    burst = session.outbox.queue_limit * 2
    for n in range(burst):
        publisher.send(Publish("cmd/behind", b"%d" % n, qos=1, packet_id=n % 60000 + 1))
    publisher.received()
    _wait(cluster, 60)  # the client reads nothing for a minute
    got: list = []
    while True:
        batch = [p for p in again.pending + again.received() if isinstance(p, Publish)]
        again.pending = []
        if not batch:
            break
        got += batch
        for p in batch:
            again.send(Puback(p.packet_id))
    payloads = [m.payload for m in got]
    assert b"behind" in payloads
    assert sorted(payloads) == sorted([b"behind"] + [b"%d" % n for n in range(burst)])


def test_a_reconnect_to_the_deciding_node_before_it_read_the_grants_record_resumes(cluster):
    """A node's grant of a persistent session, then a Clean Start 0
    connect of the client to the node that decides its client id, whose
    session registry has not read the first node's record yet: the session
    is present [MQTT-3.2.2-2], its subscription kept, and the first
    connection taken over [MQTT-3.1.4-3]."""
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 300}
    deciding, other = ((cluster.a, cluster.b) if cluster.a.broker.events._deciding.decides("lag")
                       else (cluster.b, cluster.a))
    assert deciding.broker.events._deciding.decides("lag")
    deciding.broker.registry.consumer.pause()  # the deciding node's registry lags
    first = other.client("lag", level=5, clean_start=False, properties=expiry)
    assert first.connack.reason_code == 0 and not first.connack.session_present
    assert sub(first, "lag/#")[0].reason_codes == [1]
    assert deciding.broker.registry.get("lag") is None
    again = deciding.client("lag", level=5, clean_start=False, properties=expiry)
    assert again.connack.reason_code == 0 and again.connack.session_present
    assert first.received() == [Disconnect(0x8E)] and first.closed  # taken over
    first.lose()
    deciding.broker.registry.consumer.resume()
    cluster.clock.advance(0)
    publisher = other.client("pub")
    publisher.send(Publish("lag/1", b"kept", qos=1, packet_id=1))
    publisher.received()
    cluster.clock.advance(0)
    assert [p.payload for p in again.received() if isinstance(p, Publish)] == [b"kept"]
    for node in (cluster.a, cluster.b):
        info = node.broker.registry.get("lag")
        assert (info.service_id, info.connected) == (deciding.broker.service_id, True)


def _lagging(cluster, client_id):
    """:returns: (the node deciding ``client_id``, the other node)."""
    if cluster.a.broker.events._deciding.decides(client_id):
        return cluster.a, cluster.b
    return cluster.b, cluster.a


def test_a_reconnect_after_an_expiry_finds_no_session_before_the_deciding_registry_reads_it(
        cluster):
    """A persistent session offline on the other node expires while the
    deciding node's registry lags: the end goes through the deciding
    member, so a Clean Start 0 connect to the deciding node right after
    presents no session [MQTT-3.2.2-2] though its registry still shows the
    offline record."""
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 60}
    deciding, other = _lagging(cluster, "gone")
    first = other.client("gone", level=5, clean_start=False, properties=expiry)
    assert sub(first, "gone/#")[0].reason_codes == [1]
    first.lose()
    cluster.clock.advance(0)
    assert deciding.broker.registry.get("gone").connected is False
    deciding.broker.registry.consumer.pause()
    _wait(cluster, 60)
    assert "gone" not in other.broker.sessions.sessions  # ended there
    assert deciding.broker.registry.get("gone") is not None  # the tombstone not read
    again = deciding.client("gone", level=5, clean_start=False, properties=expiry)
    assert again.connack.reason_code == 0 and not again.connack.session_present
    deciding.broker.registry.consumer.resume()
    cluster.clock.advance(0)
    for node in (cluster.a, cluster.b):
        info = node.broker.registry.get("gone")
        assert (info.service_id, info.connected) == (deciding.broker.service_id, True)


def test_an_expiry_the_deciding_member_cannot_confirm_yet_is_asked_again(cluster):
    """The deciding member has not read the record of a connection it
    granted (it knows the session as connected): the holding node's
    expiry is refused and asked again after the connect timeout, and the
    session ends once the member's registry has read it offline."""
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 60}
    deciding, other = _lagging(cluster, "slow")
    deciding.broker.registry.consumer.pause()
    first = other.client("slow", level=5, clean_start=False, properties=expiry)
    first.lose()
    _wait(cluster, 60)
    assert "slow" in other.broker.sessions.sessions  # not ended: refused
    deciding.broker.registry.consumer.resume()
    _wait(cluster, int(deciding.broker.events.timeout) + 1)
    assert "slow" not in other.broker.sessions.sessions
    for node in (cluster.a, cluster.b):
        assert node.broker.registry.get("slow") is None
