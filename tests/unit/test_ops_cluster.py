"""Operations cover the whole cluster: two nodes on one in-process bus; the
admin API and the figures of node a see, disconnect and remove the sessions
node b holds; the ``$SYS`` topics and the timed backends of one node."""

from __future__ import annotations

import types

from twisted.internet import defer

from tbmq.mqtt import Disconnect, Property, Publish, Subscribe, SubscriptionRequest
from tbmq.ops.admins import AdminUser
from tbmq.ops.api.app import AdminApi, ApiError
from tbmq.ops.api.schemas import validate
from tbmq.ops.stats import History, NodeStats
from tbmq.ops.sys_topics import SysTopics
from tbmq.timing import SAMPLE_CALLS, instrument
from tests.unit.test_cluster_of_two import Cluster, sub

ADMIN = AdminUser("root", "admin", 0.0, 0.0)


def api_of(node) -> AdminApi:
    stats = NodeStats(node.broker.view, wall=node.clock.seconds)
    return AdminApi(node.broker.view, stats, History(stats, node.clock), auth=None, clock=node.clock)


def request(**args) -> types.SimpleNamespace:
    return types.SimpleNamespace(args={k.encode(): [v.encode()] for k, v in args.items()})


def run(node, coroutine):
    d = coroutine if isinstance(coroutine, defer.Deferred) else defer.ensureDeferred(coroutine)
    results = []
    d.addBoth(results.append)
    for _ in range(300):  # the handler may wait for the registry, on the clock
        node.turn()
        if results:
            break
        node.clock.advance(0.02)
    assert results, "the handler did not finish"
    if isinstance(results[0], Exception) or hasattr(results[0], "raiseException"):
        results[0].raiseException()
    return results[0]


def test_node_a_lists_and_shows_the_sessions_node_b_holds():
    cluster = Cluster(encode=True)
    dev = cluster.b.client("dev-b", level=5, clean_start=False,
                           properties={Property.SESSION_EXPIRY_INTERVAL: 600})
    sub(dev, "cmd/dev-b")
    cluster.a.client("here-a")
    api = api_of(cluster.a)
    page = run(cluster.a, api.list_sessions(request(), ADMIN, None))
    assert [(s["client_id"], s["node"], s["connected"]) for s in page["items"]] == [
        ("dev-b", "node-b", True), ("here-a", "node-a", True)]
    only_b = run(cluster.a, api.list_sessions(request(node="node-b"), ADMIN, None))
    assert [s["client_id"] for s in only_b["items"]] == ["dev-b"]
    detail = run(cluster.a, api.show_session(request(), ADMIN, None, client_id="dev-b"))
    assert detail["session"]["node"] == "node-b"
    assert [s["topic_filter"] for s in detail["subscriptions"]] == ["cmd/dev-b"]
    assert detail["queued"] == 0 and detail["inflight"] is None  # not held on a
    stats = api.stats
    assert stats.cluster_sessions().total == 2 and stats.local_sessions().total == 1
    nodes = {n["service_id"]: n for n in stats.nodes()}
    assert nodes["node-a"]["this"] and nodes["node-b"]["alive"]
    assert nodes["node-b"]["sessions"] == 1


def test_node_a_shows_who_the_clients_of_node_b_are():
    """The address, user name and credentials name of a client reach the
    session views of its node and, through its session record (encoded
    on the bus), the admin API of the other node; they stay once the
    client is offline, and the search finds them."""
    cluster = Cluster(encode=True)
    app = cluster.b.client("app-1", level=5, peer="192.0.2.9", username="alice",
                           clean_start=False,
                           properties={Property.SESSION_EXPIRY_INTERVAL: 600})
    assert app.connack.reason_code == 0
    cluster.b.client("anon-1", peer="192.0.2.10")
    view = cluster.b.broker.sessions.sessions["app-1"].view
    assert (view.address, view.username, view.credentials_name) == (
        "192.0.2.9:50000", "alice", "applications")
    api = api_of(cluster.a)
    page = run(cluster.a, api.list_sessions(request(), ADMIN, None))
    who = {s["client_id"]: (s["address"], s["username"], s["credentials_name"])
           for s in page["items"]}
    assert who == {"app-1": ("192.0.2.9:50000", "alice", "applications"),
                   "anon-1": ("192.0.2.10:50000", None, None)}
    validate("SessionPage", page)  # the OpenAPI document describes them
    for q in ("ALICE", "192.0.2.9", "applic"):
        found = run(cluster.a, api.list_sessions(request(q=q), ADMIN, None))
        assert [s["client_id"] for s in found["items"]] == ["app-1"], q
    app.send(Disconnect())
    app.lose()
    detail = run(cluster.a, api.show_session(request(), ADMIN, None, client_id="app-1"))
    assert detail["session"]["connected"] is False
    assert (detail["session"]["address"], detail["session"]["username"],
            detail["session"]["credentials_name"]) == ("192.0.2.9:50000", "alice",
                                                       "applications")


def test_node_a_disconnects_a_client_of_node_b():
    cluster = Cluster(encode=False)
    dev = cluster.b.client("dev-b", level=5)
    api = api_of(cluster.a)
    asked = api.disconnect_session(request(), ADMIN, None, client_id="dev-b")
    d = defer.ensureDeferred(asked)
    cluster.a.turn()
    assert Disconnect(0x98) in dev.received()  # node b closed it
    assert dev.closed
    dev.lose()  # the socket's close reaches node b
    answer = run(cluster.a, d)
    assert answer == {"status": "disconnected", "target": "dev-b"}
    assert cluster.a.broker.registry.get("dev-b") is None  # a non-persistent session ends
    assert api.audit_log[-1]["action"] == "disconnected"


def test_node_a_removes_an_offline_session_node_b_holds():
    cluster = Cluster(encode=True)
    dev = cluster.b.client("dev-b", clean_start=False)
    sub(dev, "cmd/dev-b")
    dev.send(Disconnect())
    dev.lose()
    p = cluster.a.client("p")
    p.send(Publish("cmd/dev-b", b"waiting", qos=1, packet_id=1))
    p.received()
    stored = []
    cluster.device_store.count("dev-b").addCallback(stored.append)
    assert stored == [1]
    api = api_of(cluster.a)
    try:
        run(cluster.a, api.remove_session(request(), ADMIN, None, client_id="p"))
        raise AssertionError("a connected session was removed")
    except ApiError as e:
        assert e.status == 409
    answer = run(cluster.a, api.remove_session(request(), ADMIN, None, client_id="dev-b"))
    assert answer["status"] == "removed"
    for node in (cluster.a, cluster.b):
        assert node.broker.registry.get("dev-b") is None
        assert node.broker.book.of("dev-b") == {}
        assert "dev-b" not in node.broker.sessions_by_id
    stored.clear()
    cluster.device_store.count("dev-b").addCallback(stored.append)
    assert stored == [0]
    again = cluster.b.client("dev-b", clean_start=False)
    assert again.connack.session_present is False


def test_sys_topics_reach_local_subscribers_only_and_not_hash():
    cluster = Cluster(encode=False)
    watcher = cluster.a.client("w")
    watcher.send(Subscribe(1, [SubscriptionRequest("$SYS/broker/clients/#", 0),
                               SubscriptionRequest("#", 0)]))
    watcher.received()
    remote = cluster.b.client("r")
    sub(remote, "$SYS/#", 0)
    stats = NodeStats(cluster.a.broker.view, wall=cluster.a.clock.seconds)
    sys_topics = SysTopics(stats, cluster.a.broker.view, cluster.a.clock, 10.0)
    sys_topics.tick()
    got = {m.topic: m.payload for m in watcher.received()}
    assert got["$SYS/broker/clients/connected"] == b"2"
    assert all(topic.startswith("$SYS/broker/clients/") for topic in got)
    assert remote.received() == []  # node a's figures stay on node a
    # retained for a later subscriber, not counted as retained messages
    late = cluster.a.client("late")
    got = sub(late, "$SYS/broker/uptime", 0)[1:]  # after the SUBACK
    assert [(m.topic, m.retain) for m in got] == [("$SYS/broker/uptime", True)]
    assert stats.retained_messages() == 0
    # only what changed is published again: a third client connected
    sys_topics.tick()
    assert got_three(watcher.received())
    sys_topics.tick()
    assert [m.topic for m in watcher.received()] == []
    cluster.a.clock.advance(10)
    sys_topics.tick()
    assert "$SYS/broker/load/connections/1min" in sys_topics.published


def got_three(messages) -> bool:
    return {m.topic: m.payload for m in messages}["$SYS/broker/clients/connected"] == b"3"


def test_timed_backends_sample_the_bus_and_time_every_store_call():
    cluster = Cluster(encode=False)
    broker = cluster.a.broker
    times, (bus, retained, devices, credentials) = instrument(
        broker.bus, broker.retained_store, broker.device_store, broker.credential_store)
    publish = broker.bus.publish
    assert bus.publish == publish  # the bus's own method between samples
    times.sample()
    for i in range(SAMPLE_CALLS * 2):
        bus.publish("tbmq.test.timed", str(i), None)
    assert sum(times.buckets("bus", "publish").counts) == SAMPLE_CALLS
    assert bus.publish == publish
    devices.count("x")
    credentials.list()
    assert sum(times.buckets("device_store", "count").counts) == 1
    assert sum(times.buckets("credential_store", "list").counts) == 1
    assert bus.encodes is broker.bus.encodes  # everything else is the backend's


def test_the_address_of_a_session_as_operators_read_it():
    from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress  # noqa: PLC0415

    from tbmq.broker.sessions import address_text  # noqa: PLC0415

    assert address_text(IPv4Address("TCP", "192.0.2.1", 1883)) == "192.0.2.1:1883"
    assert address_text(IPv6Address("TCP", "2001:db8::1", 1883)) == "[2001:db8::1]:1883"
    assert address_text(UNIXAddress(b"/run/tbmq.sock")) == "/run/tbmq.sock"
    assert address_text(None) is None
