"""A CONNECT decided without reading its session event request back, on a
real Kafka-protocol broker (Tansu) with confluent-kafka: decided at once,
not published, when the node's deciding member has read the partition of
its client id (:meth:`tbmq.interfaces.IConsumer.decides`), else when the
request is acknowledged (the deciding member takes its node's own requests
then: :meth:`tbmq.interfaces.IConsumer.hand_own`, the driver tells where a
record landed).

One node decides every partition of ``tbmq.client.session.event.request``.
Its consumers wait up to ``kafka.fetch_max_wait_ms`` = 0.6 s per fetch
(Tansu never answers a fetch early): a CONNECT whose request is read back
took 0.3 s here, one decided on its acknowledgement 10 ms, one decided at
once less.  Connects of one client id in a row are decided in order
([MQTT-3.1.4-3]: the second connection of a client id takes the first over).
"""

from __future__ import annotations

import time

import pytest

from tests.integration.cluster import ClusterNode, Services
from tests.integration.conftest import _LIVE
from tests.integration.helpers import PahoClient, uid
from tests.postgres import new_database

pytestmark = pytest.mark.timeout(300)

FETCH_WAIT_MS = 600


@pytest.fixture(scope="module")
def node(kafka_bootstrap, redis_url, postgres_dsn, tmp_path_factory):
    services = Services(kafka_bootstrap, redis_url, new_database(postgres_dsn),
                        f"k{uid()[:8]}")
    made = ClusterNode(tmp_path_factory.mktemp("connect-ack"), services, "node-a", "confluent",
                       "redis", env={"TBMQ_KAFKA__FETCH_MAX_WAIT_MS": str(FETCH_WAIT_MS),
                                     "TBMQ_KAFKA__PARTITIONS": "1"})
    _LIVE.append(made)
    made.start()
    yield made
    try:
        made.stop()
    finally:
        made.kill()
        _LIVE.remove(made)


def _timed_connect(node: ClusterNode, client_id: str) -> tuple[PahoClient, float]:
    started = time.monotonic()
    c = PahoClient(node.port, 5, client_id=client_id).connect_and_wait(timeout=30)
    return c, time.monotonic() - started


def test_connects_in_a_row_are_decided_on_acknowledgement_and_in_order(node):
    cid = f"ack-{uid()}"
    first, _ = _timed_connect(node, f"warm-{uid()}")  # read back: the partition's first
    times = []
    clients = []
    for _ in range(3):
        c, took = _timed_connect(node, cid)
        clients.append(c)
        times.append(took)
    # each connection of the client id took the one before over, in order
    for earlier in clients[:-1]:
        earlier.wait_disconnected(timeout=30)
        assert earlier.disconnects[-1][0] == 0x8E  # SESSION_TAKEN_OVER
    assert clients[-1].client.is_connected()
    # none waited for a read back
    assert max(times) < FETCH_WAIT_MS / 1000 / 4, times
    for c in [first, *clients]:
        c.close()
