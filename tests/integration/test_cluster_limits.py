"""``mqtt.sessions_limit`` and ``mqtt.application_clients_limit`` over two
``twistd -n tbmq`` nodes on Tansu: both count the cluster's sessions (the
session registry), so a session made on one node takes a place on the
other; and ``mqtt.rate_limits.total`` split between the live nodes."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tbmq.mqtt import ReasonCode
from tests.integration.cluster import ClusterNode, Services
from tests.integration.conftest import _LIVE
from tests.integration.helpers import HOST, PahoClient, free_port, uid, wait_for
from tests.integration.test_cluster import APP_PASSWORD, APP_USER, _add_application_credentials
from tests.postgres import new_database

pytestmark = pytest.mark.timeout(300)

LIMITS = {
    "TBMQ_MQTT__SESSIONS_LIMIT": "3",
    "TBMQ_MQTT__APPLICATION_CLIENTS_LIMIT": "1",
    "TBMQ_MQTT__RATE_LIMITS__TOTAL__ENABLED": "true",
    "TBMQ_MQTT__RATE_LIMITS__TOTAL__CONFIG": "100000:1",
}


@pytest.fixture(scope="module")
def nodes(kafka_bootstrap, redis_url, postgres_dsn, tmp_path_factory):
    services = Services(kafka_bootstrap, redis_url, new_database(postgres_dsn), f"l{uid()[:8]}")
    workdir = tmp_path_factory.mktemp("cluster-limits")
    _add_application_credentials(services, workdir)
    started = []
    for sid in ("node-a", "node-b"):
        http_port = free_port()
        node = ClusterNode(workdir, services, sid, env={
            **LIMITS, "TBMQ_HTTP__ENDPOINT": f"tcp:{http_port}:interface={HOST}"})
        node.http_port = http_port
        _LIVE.append(node)
        started.append(node.start())
    yield started
    for node in started:
        try:
            node.stop()
        finally:
            node.kill()
            _LIVE.remove(node)


def connect(node, client_id: str, app: bool = False, persistent: bool = False,
            expect_rc: int | None = 0) -> PahoClient:
    c = PahoClient(node.port, 5, client_id)
    if app:
        c.client.username_pw_set(APP_USER, APP_PASSWORD)
    return c.connect_and_wait(clean_start=not persistent, expect_rc=expect_rc, timeout=30,
                              session_expiry=300 if persistent else None)


def cluster_sessions(node) -> int:
    """The sessions the node's registry knows (``tbmq_cluster_sessions``)."""
    with urllib.request.urlopen(f"http://{HOST}:{node.http_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return int(sum(sample.value for family in text_string_to_metric_families(text)
                   for sample in family.samples if sample.name == "tbmq_cluster_sessions"))


def seen(nodes, n: int) -> None:
    """Wait until every node's registry has ``n`` sessions."""
    for node in nodes:
        wait_for(lambda: cluster_sessions(node) == n, timeout=20,
                 what=f"{node.service_id} knows {n} sessions")


def test_total_limit_split_between_live_nodes(nodes):
    # the split is looked at when a message is checked against the limit,
    # at most once a second: a node whose first message came before it saw
    # the other node join splits at a later one
    split = "cluster rate limits split among 2 node(s)"
    for node in nodes:
        pub = connect(node, f"p-{uid()}")
        topic = f"t/{uid()}"

        def published_and_split() -> bool:
            pub.publish(topic, b"x", qos=1)
            return split in node.log()

        wait_for(published_and_split, timeout=30, interval=0.3,
                 what=f"{node.service_id} logs {split!r}")
        pub.disconnect()


def test_session_limits_count_the_cluster(nodes):
    a, b = nodes
    # the clean sessions of an earlier test end by tombstones that each
    # node reads in its own time: until both read them, a node's count
    # could be 1 without the APPLICATION session below
    seen(nodes, 0)
    clients = []
    try:
        app = connect(a, f"app-{uid()}", app=True, persistent=True)
        clients.append(app)
        seen(nodes, 1)
        # the APPLICATION session on A fills the limit on B too
        clients.append(connect(b, f"app-{uid()}", app=True, persistent=True,
                               expect_rc=ReasonCode.QUOTA_EXCEEDED))
        # its own client moves to B and is accepted
        app.disconnect()
        app = connect(b, app.client_id, app=True, persistent=True)
        clients.append(app)
        assert app.session_present
        clients.append(connect(a, f"dev-{uid()}"))
        clients.append(connect(b, f"dev-{uid()}"))
        seen(nodes, 3)
        # 3 sessions in the cluster: one more is refused on either node
        for node in nodes:
            clients.append(connect(node, f"dev-{uid()}", expect_rc=ReasonCode.QUOTA_EXCEEDED))
        # a client with a session is not refused at the limit
        app.disconnect()
        clients.append(connect(a, app.client_id, app=True, persistent=True))
    finally:
        for c in clients:
            c.close()
