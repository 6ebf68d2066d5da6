"""A cluster node (``twistd -n tbmq``, ``bus: kafka``) while Kafka, Redis
or PostgreSQL goes away and comes back: it logs it, refuses or holds work
with the right reason codes (CONNACK 0x88, PUBACK 0x83 in v5), and resumes
by itself.

The module has its own Tansu and Redis (killed and restarted here) and
reaches the run's PostgreSQL through a TCP proxy that the tests cut.  Its
node is alone in its cluster, so it matches every message itself.  Kafka
goes away last, and its test shows that every path resumes, the persistent
one (``tbmq.msg.persisted``, the device store) too.
"""

from __future__ import annotations

import time

import pytest

from tests.integration.cluster import ClusterNode, Services
from tests.integration.conftest import _LIVE
from tests.integration.helpers import PahoClient, uid
from tests.kafka import Tansu, free_port
from tests.postgres import Proxy, TcpProxy, new_database
from tests.redis_server import RedisServer

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def outside(postgres_dsn, reactor_thread):
    """Tansu behind a proxy (Kafka away is the proxy down: Tansu keeps
    everything in memory, as a Kafka broker keeps it on disk), a Redis of
    this module, and a proxy to PostgreSQL."""
    kafka_port, proxy_port = free_port(), free_port()
    tansu = Tansu(kafka_port, advertised_port=proxy_port)
    tansu.start()
    kafka = TcpProxy(reactor_thread, "127.0.0.1", kafka_port, proxy_port)
    redis = RedisServer()
    redis.start()
    postgres = Proxy(reactor_thread, new_database(postgres_dsn))
    yield tansu, kafka, redis, postgres
    tansu.close()
    kafka.down()
    redis.close()
    postgres.down()


@pytest.fixture(scope="module")
def node(outside, tmp_path_factory):
    tansu, _, redis, postgres = outside
    services = Services(tansu.bootstrap, redis.url, postgres.dsn, f"o{uid()[:8]}")
    n = ClusterNode(tmp_path_factory.mktemp("outages"), services, "node-o",
                    env={"TBMQ_AUTH__REFRESH_INTERVAL": "1"})
    n.start()
    _LIVE.append(n)  # its log printed when a test fails
    yield n
    try:
        n.stop()
    finally:
        n.kill()
        _LIVE.remove(n)


def _connect(node, client_id=None, expect_rc=0, **kwargs) -> PahoClient:
    return PahoClient(node.port, 5, client_id=client_id).connect_and_wait(
        expect_rc=expect_rc, timeout=40, **kwargs)


def _puback_code(client: PahoClient, topic: str, payload: bytes, timeout: float = 40.0) -> int:
    """Publish at QoS 1 and :returns: the PUBACK reason code."""
    codes: list[int] = []

    def on_publish(c, userdata, mid, reason_code, properties):
        codes.append(getattr(reason_code, "value", reason_code))

    client.client.on_publish = on_publish
    client.client.publish(topic, payload, 1)
    deadline = time.monotonic() + timeout
    while not codes:
        assert time.monotonic() < deadline, "no PUBACK"
        time.sleep(0.05)
    return codes[0]


def _eventually(check, timeout: float = 60.0, every: float = 1.0):
    """Call ``check`` until it returns without raising AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(every)


def test_after_suback_a_message_through_the_node_is_delivered(node):
    """SUBACK promises that matching messages published afterwards are
    delivered, as every broker does on the node that sent it.  Kafka acknowledges the subscriptions record
    before any consumer read it, so the node sends SUBACK only once its own
    consumer of ``tbmq.client.subscriptions`` has put the subscription in
    its trie.  The node is alone in its cluster (it matches every message),
    and each round publishes at once after SUBACK: to a live subscriber,
    and to a persistent device that went offline."""
    pub = _connect(node)
    for i in range(15):
        topic, cid = f"now/{uid()}", f"dev-{uid()}"
        live = _connect(node)
        live.subscribe(topic, qos=1)
        assert _puback_code(pub, topic, b"live %d" % i) == 0
        assert live.get(timeout=30).payload == b"live %d" % i
        device = _connect(node, cid, clean_start=False, session_expiry=300)
        device.subscribe(topic + "/dev", qos=1)
        device.disconnect()
        assert _puback_code(pub, topic + "/dev", b"stored %d" % i) == 0
        back = _connect(node, cid, clean_start=False, session_expiry=300)
        assert back.get(timeout=30).payload == b"stored %d" % i
        for c in (live, back):
            c.close()
    pub.close()


def test_redis_away_holds_persistent_messages_until_it_is_back(node, outside):
    redis = outside[2]
    topic, cid = f"r/{uid()}", f"dev-{uid()}"
    device = _connect(node, cid, clean_start=False, session_expiry=300)
    device.subscribe(topic, qos=1)
    device.disconnect()
    redis.stop()
    pub = _connect(node)
    assert _puback_code(pub, topic, b"kept") == 0  # Kafka holds it; the store write retries
    node.wait_log("device store write failed")
    redis.start()  # the same port
    node.wait_log("device store writes again")
    again = _connect(node, cid, clean_start=False, session_expiry=300)
    assert again.session_present is True
    assert again.get(timeout=30).payload == b"kept"
    for c in (again, pub):
        c.close()


def test_postgresql_away_gives_0x88_then_logins_work_again(node, outside):
    proxy = outside[3]
    assert _connect(node).connack_code == 0
    proxy.down()
    refused = _connect(node, expect_rc=0x88)
    assert refused.connack_code == 0x88
    node.wait_log("a backend is unavailable")
    proxy.up()  # the same port
    _eventually(lambda: _connect(node).close(), timeout=60)


def test_kafka_away_gives_0x83_and_0x88_then_the_node_resumes(node, outside):
    kafka = outside[1]
    topic, cid = f"k/{uid()}", f"dev-{uid()}"
    sub = _connect(node)
    sub.subscribe(topic, qos=1)
    pub = _connect(node)
    assert _puback_code(pub, topic, b"before") == 0
    assert sub.get(timeout=30).payload == b"before"
    kafka.down()
    assert _puback_code(pub, topic, b"during") == 0x83  # Implementation specific error
    _connect(node, expect_rc=0x88)  # Server unavailable: the cluster did not answer
    node.wait_log("not accepted by the bus")
    kafka.up()  # the same port

    def resumed():
        fresh = _connect(node)
        try:
            assert _puback_code(fresh, topic, b"after", timeout=15) == 0
        finally:
            fresh.close()

    _eventually(resumed, timeout=90)
    assert _eventually(lambda: sub.get_for(topic, timeout=5)).payload == b"after"
    # every consumer group reads again, those of persistent sessions too: a
    # message for an offline persistent device goes through
    # tbmq.msg.persisted and the device store
    offline = _connect(node, cid, clean_start=False, session_expiry=300)
    offline.subscribe(topic + "/dev", qos=1)
    offline.disconnect()
    assert _puback_code(pub, topic + "/dev", b"stored") == 0
    back = _connect(node, cid, clean_start=False, session_expiry=300)
    assert back.session_present is True
    assert back.get(timeout=60).payload == b"stored"
    for c in (sub, pub, back):
        c.close()
