"""The cluster's figures: each node's counters in its heartbeat (the node
record, version 2), summed over the live nodes into totals and rates
(:mod:`tbmq.ops.cluster_stats`), and the bus's overview of topics and
consumer groups with their lag (:mod:`tbmq.ops.api.kafka`)."""

from __future__ import annotations

import types

import msgpack
import pytest
from twisted.internet import defer, task

from tbmq.cluster import records as r
from tbmq.errors import RecordEncodingError
from tbmq.mqtt import Publish
from tbmq.ops.api.kafka import BusNotDescribed, BusOverview, overview
from tbmq.ops.api.schemas import validate
from tbmq.ops.cluster_stats import ClusterStats, cluster_sum, node_rates, rates
from tests.unit.test_cluster_of_two import Cluster
from tests.unit.test_ops_cluster import ADMIN, api_of, run

# -- the heartbeat record ---------------------------------------------------------------

COUNTERS = {"received": 10, "sent": 20, "dropped": 1, "connections": 3, "sessions": 4}


def test_a_heartbeat_is_version_2_with_the_counters_last():
    info = r.NodeInfo("n", 1.0, 2.0, False, ("tcp:1883",), dict(COUNTERS))
    obj = msgpack.unpackb(r.NODE.encode(info), raw=False)
    assert obj[:2] == ["node", 2] == ["node", r.NODE_VERSION]
    assert obj[-1] == COUNTERS
    assert r.NODE.decode(r.NODE.encode(info)) == info


def test_a_heartbeat_of_version_1_is_still_read_without_counters():
    v1 = ["node", 1, "n", 1.0, 2.0, False, ["tcp:1883"]]
    read = r.NODE.decode(msgpack.packb(v1, use_bin_type=True))
    assert read == r.NodeInfo("n", 1.0, 2.0, False, ("tcp:1883",), {})
    for bad in (v1 + [{}], ["node", 2, *v1[2:]]):  # v1 of v2's length; v2 of v1's
        with pytest.raises(RecordEncodingError, match="expected"):
            r.NODE.decode(msgpack.packb(bad, use_bin_type=True))


@pytest.mark.parametrize("counters", [{"sent": -1}, {"sent": 1.5}, {1: 2}, [1], {"sent": "1"}])
def test_counters_that_do_not_fit_are_refused_both_ways(counters):
    with pytest.raises(RecordEncodingError):
        r.NODE.encode(r.NodeInfo("n", 1.0, 2.0, False, (), counters))
    raw = msgpack.packb(["node", 2, "n", 1.0, 2.0, False, [], counters], use_bin_type=True)
    with pytest.raises(RecordEncodingError):
        r.NODE.decode(raw)


# -- summing ------------------------------------------------------------------------------

def beat(sid, started, sent_at, stopping=False, **counters):
    return r.NodeInfo(sid, started, sent_at, stopping, (), counters)


class FakeMembership:
    """What :class:`ClusterStats` reads of a node's view (a
    :class:`tbmq.node_view.NodeView`'s methods over a Membership)."""

    def __init__(self, own: dict) -> None:
        self.service_id = "me"
        self.own = own
        self.counters = lambda: dict(self.own)
        self.nodes: dict = {}
        self.previous: dict = {}
        self.gone: set = set()

    def alive_nodes(self):
        return sorted({"me"} | {s for s in self.nodes if s not in self.gone})

    def known_nodes(self):
        return dict(self.nodes)

    def previous_heartbeats(self):
        return dict(self.previous)

    def heartbeat_counters(self):
        return self.counters()

    def hear(self, info) -> None:
        if info.service_id in self.nodes:
            self.previous[info.service_id] = self.nodes[info.service_id]
        self.nodes[info.service_id] = info


def test_rates_are_differences_over_time_and_a_reset_counts_zero():
    assert rates({"received": 30, "sent": 5, "connections": 9},
                 {"received": 10, "sent": 9, "connections": 1}, 4.0) == \
        {"received": 5.0, "sent": 0.0}
    first = beat("x", 100.0, 105.0, received=10)
    assert node_rates(first, None) == {}
    assert node_rates(beat("x", 100.0, 110.0, received=60), first) == {"received": 10.0}
    # the node restarted in between: its counters began again
    assert node_rates(beat("x", 200.0, 202.0, received=3), first) == {}
    assert node_rates(first, first) == {}


def test_the_cluster_sums_the_live_nodes_and_lists_each():
    wall = [1000.0]
    membership = FakeMembership({"received": 0, "sent": 0, "dropped": 0, "connections": 2,
                                 "sessions": 3})
    stats = ClusterStats(membership, task.Clock(), wall=lambda: wall[0])
    stats.tick()  # the first reading of this node's counters
    membership.hear(beat("b", 1.0, 995.0, received=100, sent=50, connections=5, sessions=6))
    membership.hear(beat("b", 1.0, 1000.0, received=600, sent=150, connections=7, sessions=8))
    membership.hear(beat("c", 1.0, 999.0, received=1000, connections=100, sessions=100))
    membership.hear(beat("d", 1.0, 990.0, received=5, connections=1))
    membership.hear(beat("d", 1.0, 995.0, received=10, connections=1))
    membership.gone.add("c")  # heard from, then silent: not summed
    membership.own.update(received=20, sent=40)
    wall[0] += 2.0
    stats.tick()
    snap = stats.snapshot()
    validate("ClusterMetrics", snap)
    by_id = {row["service_id"]: row for row in snap["by_node"]}
    assert [row["service_id"] for row in snap["by_node"]] == ["me", "b", "c", "d"]
    assert by_id["me"]["this"] and by_id["me"]["rates"]["received"] == 10.0
    assert by_id["b"]["rates"]["received"] == 100.0 and by_id["b"]["rates"]["sent"] == 20.0
    assert by_id["c"]["alive"] is False and by_id["c"]["rates"] == {}
    assert by_id["d"]["rates"]["received"] == 1.0
    assert snap["nodes"] == 3
    assert snap["totals"]["received"] == 20 + 600 + 10
    assert snap["totals"]["connections"] == 2 + 7 + 1
    assert snap["rates"]["received"] == 10.0 + 100.0 + 1.0
    assert snap["rates"]["sent"] == 20.0 + 20.0
    point = snap["points"][-1]
    assert (point["received"], point["sent"], point["connections"], point["nodes"]) == \
        (111.0, 40.0, 10, 3)
    # a node that says it stops is no longer summed
    membership.hear(beat("b", 1.0, 1001.0, stopping=True, received=700))
    totals, per_second = cluster_sum(stats.nodes())
    assert totals["received"] == 20 + 10 and per_second["received"] == 11.0


def test_nodes_on_one_bus_see_each_others_traffic_in_their_heartbeats():
    cluster = Cluster(encode=True)
    a, b = cluster.a, cluster.b
    publisher = a.client("pub-a", level=5)
    for i in range(7):
        publisher.send(Publish("t/x", b"12345", qos=0))
        a.turn()
    interval = a.config.node.heartbeat_interval
    for _ in range(3):
        cluster.clock.advance(interval)
    stats = ClusterStats(b.broker.view, cluster.clock, wall=cluster.clock.seconds)
    stats.tick()
    row = {row["service_id"]: row for row in stats.nodes()}["node-a"]
    assert row["alive"] and row["counters"]["received"] == 7
    assert row["counters"]["received_bytes"] == 35 and row["counters"]["connections"] == 1
    assert row["counters"]["sessions"] == 1
    api = api_of(b)
    api.cluster = stats
    answer = run(b, api.cluster_metrics(None, user=ADMIN, body=None))
    validate("ClusterMetrics", answer)
    assert answer["nodes"] == 2 and answer["totals"]["received"] == 7
    # more traffic through a: b's rate of a is over a's last two heartbeats
    for i in range(10):
        publisher.send(Publish("t/x", b"1", qos=0))
        a.turn()
    cluster.clock.advance(interval)
    stats.tick()
    row = {row["service_id"]: row for row in stats.nodes()}["node-a"]
    assert row["rates"]["received"] == pytest.approx(10 / interval)


# -- the bus overview --------------------------------------------------------------------

DESCRIBED = {
    "bus": "kafka", "driver": "confluent",
    "topics": [{"name": "p.tbmq.msg.all", "partitions": 2, "latest_offsets": [10, None]},
               {"name": "p.tbmq.cluster.nodes", "partitions": 1, "latest_offsets": [None]}],
    "groups": [{"group": "p.tbmq-cluster", "state": "stable", "members": 2, "committed": [
        {"topic": "p.tbmq.msg.all", "partition": 1, "offset": 4},
        {"topic": "p.tbmq.msg.all", "partition": 0, "offset": 7}]},
        {"group": "tbmq-node-a", "state": None, "members": None, "committed": [
            {"topic": "p.tbmq.cluster.nodes", "partition": 0, "offset": 3},
            {"topic": "p.tbmq.msg.all", "partition": 0, "offset": 12}]}],
    "errors": ["consumer groups not described: not supported"]}


def test_the_overview_gives_the_lag_per_partition_topic_and_group():
    answer = overview(DESCRIBED, 5.0)
    validate("KafkaOverview", answer)
    assert [t["records"] for t in answer["topics"]] == [10, None]
    cluster_group, node_group = answer["consumer_groups"]
    assert cluster_group["topics"][0]["partitions"] == [
        {"partition": 0, "committed": 7, "latest": 10, "lag": 3},
        {"partition": 1, "committed": 4, "latest": None, "lag": None}]
    assert cluster_group["topics"][0]["lag"] == 3 and cluster_group["total_lag"] == 3
    # a committed offset past the latest one (Tansu's too-low latest offsets): lag 0
    by_topic = {t["topic"]: t for t in node_group["topics"]}
    assert by_topic["p.tbmq.msg.all"]["lag"] == 0
    assert by_topic["p.tbmq.cluster.nodes"]["lag"] is None
    assert node_group["total_lag"] == 0 and node_group["members"] is None
    assert answer["errors"] == DESCRIBED["errors"]


def test_the_overview_is_asked_once_per_max_age_and_shared_meanwhile():
    clock = task.Clock()
    asked = []
    bus = types.SimpleNamespace(describe=lambda: asked.append(defer.Deferred()) or asked[-1])
    view = BusOverview(bus, clock, wall=clock.seconds)
    first, second = view.overview(), view.overview()
    assert len(asked) == 1 and not first.called
    asked[0].callback(DESCRIBED)
    assert first.result == second.result and first.result["bus"] == "kafka"
    assert view.overview().result is first.result and len(asked) == 1
    clock.advance(2.5)
    failed = view.overview()
    asked[1].errback(RuntimeError("no broker answered"))
    with pytest.raises(RuntimeError):
        failed.result.raiseException()
    failed.addErrback(lambda f: None)
    missing = BusOverview(object(), clock).overview()
    assert isinstance(missing.result.value, BusNotDescribed)
    missing.addErrback(lambda f: None)


def test_the_in_process_bus_describes_its_topics_and_groups():
    cluster = Cluster(encode=False)
    a = cluster.a
    publisher = a.client("pub-a", level=5)
    for _ in range(3):
        publisher.send(Publish("t/x", b"x", qos=0))
        a.turn()
    api = api_of(a)
    api.bus = BusOverview(a.broker.bus, cluster.clock)
    answer = run(a, api.kafka(None, user=ADMIN, body=None))
    validate("KafkaOverview", answer)
    assert answer["bus"] == "in-process" and answer["driver"] is None
    topics = {t["name"]: t for t in answer["topics"]}
    assert topics["tbmq.msg.all"]["records"] == 3
    groups = {g["group"]: g for g in answer["consumer_groups"]}
    msg_all = {t["topic"]: t for t in groups["tbmq-msg-all"]["topics"]}["tbmq.msg.all"]
    assert msg_all["lag"] == 0 and msg_all["partitions"][0]["committed"] == 3
    assert groups["tbmq-msg-all"]["members"] == 2 and groups["tbmq-msg-all"]["state"] == \
        "stable"
    assert "tbmq-node-node-a" in groups
