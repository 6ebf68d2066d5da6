"""A reconnect storm: node B of a two-node cluster (Tansu, the Redis device
store) is killed with SIGKILL while it holds 60 clients, and every one of
them reconnects to node A, as clients with automatic reconnect do.

Half of the clients are persistent QoS 1 subscribers (v5 Session Expiry
3600), half QoS 1 publishers, publisher i to subscriber i, every payload
tagged (pair, sequence number) (:class:`bench.storm.StormFleet`, the
clients of ``bench/cluster.py``'s ``storm`` scenario). After the kill each
client waits 0 to 1 s, then CONNECTs to node A every second until accepted
(CONNACK 0x88 Server unavailable while the partitions node B held have not
moved yet); a publisher then sends its unacknowledged PUBLISH again with
DUP set [MQTT-4.4.0-1]. Nothing a publisher was acknowledged for may be
lost [MQTT-4.3.3-1]; duplicates are allowed (QoS 1) and counted.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.mqttgen import now
from bench.storm import StormFleet
from tests.integration.cluster import ClusterNode, Services
from tests.integration.conftest import _LIVE, _finish
from tests.integration.helpers import uid

pytestmark = pytest.mark.timeout(240)

#: publisher/subscriber pairs on node B (twice as many clients)
PAIRS = 30
#: messages/s of each publisher
RATE = 4.0
#: seconds every client may take to be connected again after the kill
RECONNECT_LIMIT = 60.0


@pytest.fixture(params=["kafka-python", "confluent"])
def nodes(request, kafka_bootstrap, redis_url, tmp_path):
    """Nodes A and B of a cluster of their own (topic and key prefix),
    credentials in SQLite (no client here has any)."""
    services = Services(kafka_bootstrap, redis_url, "dbname=unused", f"st{uid()[:8]}")
    made = [ClusterNode(tmp_path, services, service_id, request.param, "redis",
                        env={"TBMQ_AUTH__CREDENTIALS": "sqlite"}) for service_id in ("node-a", "node-b")]
    _LIVE.extend(made)  # their logs printed when the test fails
    try:
        with ThreadPoolExecutor(2) as pool:  # both join the consumer groups at once
            list(pool.map(ClusterNode.start, made))
        yield made
    finally:
        for node in made:
            _finish(node)  # fails the test if node A died by itself


def test_the_clients_of_a_killed_node_come_back_on_the_other_and_lose_nothing(nodes, capsys):
    a, b = nodes
    fleet = StormFleet("127.0.0.1", range(PAIRS), f"st{uid()[:6]}", f"storm/{uid()}", rate_each=RATE,
                       seed=19)
    try:
        assert fleet.connect(b.port, timeout=60), "the clients did not all connect to node B"
        fleet.port = a.port  # where every client reconnects
        fleet.start_publishing()
        # every subscription known where its topic is matched (those sent
        # before are left out of the figures)
        assert fleet.warm_up(timeout=30), "a subscriber received nothing from node B"
        fleet.idle(4.0)
        b.kill()
        t_kill = now()
        back = fleet.run(fleet.all_back, RECONNECT_LIMIT)
        fleet.idle(1.0)  # traffic through node A alone
        fleet.stop_publishing()
        fleet.run(fleet.settled, 45)
        report = fleet.report(t_kill)
    finally:
        fleet.close()
    summary = ", ".join(f"{k} {v}" for k, v in report.items())
    assert back and report["still_down"] == 0, summary
    assert report["lost_connection"] == 2 * PAIRS, summary
    assert report["reconnect_s"] < RECONNECT_LIMIT, summary
    # every persistent subscriber found its session (and subscription) on node A
    assert report["sessions_lost"] == 0, summary
    assert report["lost"] == 0, summary
    assert report["strays"] == 0, summary
    # enough acknowledged traffic, before and after the kill, to mean something
    assert report["acked"] >= PAIRS * RATE * 4, summary
    with capsys.disabled():  # the counts belong in the test run's output
        print(f"\nreconnect storm, node B killed: {summary}")
