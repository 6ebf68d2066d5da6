"""The topic ``tbmq.msg.app.<clientId>`` of a persistent APPLICATION session
is deleted when the session ends (TBMQ's ``tbmq.sys.app.removed``), by the
one node that ends it, unless ``kafka.enable_topic_deletion`` is false."""

from __future__ import annotations

from tbmq.mqtt import Disconnect, Property, Publish
from tests.helpers import Harness
from tests.unit.test_cluster_of_two import Cluster, sub
from tests.unit.test_ops_cluster import ADMIN, api_of, request, run

EXPIRY = {Property.SESSION_EXPIRY_INTERVAL: 5}


def spy(cluster) -> list:
    """Record every ``delete_topic`` call on the shared bus."""
    calls: list = []
    delete = cluster.bus.delete_topic

    def counted(topic):
        calls.append(topic)
        return delete(topic)

    cluster.bus.delete_topic = counted
    return calls


def offline_application(cluster, node, client_id="app-1"):
    """A persistent APPLICATION session on ``node``, offline, with three
    messages waiting in its topic."""
    app = node.client(client_id, level=5, clean_start=False, properties=dict(EXPIRY))
    sub(app, "telemetry/#")
    app.send(Disconnect())
    app.lose()
    p = cluster.b.client("p")
    for i in range(3):
        p.send(Publish("telemetry/1", b"%d" % i, qos=1, packet_id=i + 1))
    p.received()
    topic = cluster.a.broker.topics.app(client_id)
    assert cluster.bus.held(topic) == 3
    return topic


def test_an_expired_application_session_takes_its_topic_along():
    cluster = Cluster(encode=True)
    calls = spy(cluster)
    topic = offline_application(cluster, cluster.a)
    cluster.clock.advance(4)
    assert topic in cluster.bus.topics() and calls == []
    cluster.clock.advance(2)  # expired on node a, which held it
    cluster.a.turn()
    assert calls == [topic]  # one node deletes it, not every node
    assert topic not in cluster.bus.topics()
    assert cluster.a.broker.registry.get("app-1") is None


def test_an_application_session_removed_through_the_api_takes_its_topic_along():
    cluster = Cluster(encode=False)
    calls = spy(cluster)
    topic = offline_application(cluster, cluster.a)
    api = api_of(cluster.b)  # node b asks; the deciding node ends it
    answer = run(cluster.b, api.remove_session(request(), ADMIN, None, client_id="app-1"))
    assert answer == {"status": "removed", "target": "app-1"}
    cluster.a.turn()
    assert calls == [topic]
    assert topic not in cluster.bus.topics()


def test_a_clean_start_of_the_same_application_keeps_its_topic():
    cluster = Cluster(encode=False)
    calls = spy(cluster)
    topic = offline_application(cluster, cluster.a)
    again = cluster.a.client("app-1", level=5, clean_start=True, properties=dict(EXPIRY))
    assert again.connack.session_present is False
    assert calls == [] and topic in cluster.bus.topics()
    # the client comes back as a non-persistent one (always a DEVICE): gone
    again.send(Disconnect())
    again.lose()
    cluster.a.client("app-1", level=5, clean_start=True)
    cluster.a.turn()
    assert calls == [topic] and topic not in cluster.bus.topics()


def test_with_topic_deletion_off_the_topic_stays():
    cluster = Cluster(encode=False)
    calls = spy(cluster)
    for node in (cluster.a, cluster.b):
        node.broker.applications.delete_topics = False
    topic = offline_application(cluster, cluster.a)
    cluster.clock.advance(6)
    cluster.a.turn()
    assert calls == [] and cluster.bus.held(topic) == 3
    assert cluster.a.broker.registry.get("app-1") is None  # the session ended all the same


def test_the_setting_reaches_the_node():
    assert Harness().broker.applications.delete_topics is True
    off = Harness(overrides={"kafka": {"enable_topic_deletion": False}})
    assert off.broker.applications.delete_topics is False
