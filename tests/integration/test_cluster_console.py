"""The API and the console show the cluster: two ``twistd -n tbmq`` nodes on
Tansu, each with its HTTP listener.  Traffic published through node A shows
in node B's cluster totals and rates (A's counters reach B in A's
heartbeats); ``GET /api/kafka`` on a node lists the cluster's topics and
the node's consumer groups with their lag; the embedded node answers too
(its in-process topics).  In a real browser: B's dashboard shows the
cluster's rate and A's row while A carries the traffic, and the Kafka page
lists the topics and groups (screenshots ``dashboard-cluster.png`` and
``kafka.png`` in ``docs/screenshots/``).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from selenium.webdriver.common.by import By

from tests.integration.cluster import ClusterNode, Services
from tests.integration.conftest import _LIVE, _finish
from tests.integration.helpers import HOST, PahoClient, free_port, uid, wait_for
from tests.integration.ops import USERS, add_admin, start_ops_broker, wait_http
from tests.integration.test_ops_console import browser, go, shot, visible, wait  # noqa: F401
from tbmq.ops.api.schemas import validate

pytestmark = pytest.mark.timeout(600)

ROOT = "root"
DRIVERS = ["confluent", "kafka-python"]


class Api:
    """The admin API of one node, over plain HTTP (blocking)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.token = self._call("POST", "/api/auth/login",
                                {"username": ROOT, "password": USERS[ROOT][0]})["token"]

    def _call(self, method: str, path: str, body=None) -> dict:
        request = urllib.request.Request(
            self.url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json",
                     **({"Authorization": f"Bearer {self.token}"}
                        if getattr(self, "token", None) else {})})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def get(self, path: str) -> dict:
        return self._call("GET", path)


@pytest.fixture(scope="module", params=DRIVERS)
def nodes(request, kafka_bootstrap, tmp_path_factory):
    """Nodes A and B on Tansu, each with HTTP and the admin users."""
    services = Services(kafka_bootstrap, "redis://127.0.0.1:1/0", "unused", f"u{uid()[:8]}")
    workdir = tmp_path_factory.mktemp("cluster-console")
    made = {}
    for sid in ("node-a", "node-b"):
        http_port = free_port()
        node = ClusterNode(workdir, services, sid, request.param, env={
            "TBMQ_STORAGE__DEVICE_STORE": "memory", "TBMQ_AUTH__CREDENTIALS": "sqlite",
            "TBMQ_HTTP__ENDPOINT": f"tcp:{http_port}:interface={HOST}"})
        for name, (password, role) in USERS.items():
            add_admin(node.data_dir, name, password, role)
        node.url = f"http://{HOST}:{http_port}"
        node.http_port = http_port
        _LIVE.append(node)
        made[sid] = node
    for node in made.values():
        node.start()
        wait_http(node.http_port)
    made["prefix"] = services.prefix + "."
    made["driver"] = request.param
    yield made
    for node in (made["node-a"], made["node-b"]):
        _finish(node)


def _row(cluster: dict, sid: str) -> dict:
    return {row["service_id"]: row for row in cluster["by_node"]}[sid]


def test_node_b_counts_the_messages_published_through_node_a(nodes):
    a, b = nodes["node-a"], nodes["node-b"]
    api_b = Api(b.url)
    wait_for(lambda: api_b.get("/api/metrics/cluster")["nodes"] == 2, timeout=30, interval=0.5)
    before = _row(api_b.get("/api/metrics/cluster"), "node-a")["counters"].get("received", 0)
    publisher = PahoClient(a.port, 5, client_id=f"pub-{uid()[:6]}")
    publisher.connect_and_wait()
    for i in range(40):
        publisher.publish(f"load/{i % 4}", b"0123456789", qos=1)
    publisher.disconnect()

    def seen() -> dict | None:
        cluster = api_b.get("/api/metrics/cluster")
        row = _row(cluster, "node-a")
        return cluster if row["counters"].get("received", 0) >= before + 40 else None

    cluster = wait_for(seen, timeout=30, interval=0.5)
    validate("ClusterMetrics", cluster)
    row_a, row_b = _row(cluster, "node-a"), _row(cluster, "node-b")
    assert row_b["this"] and not row_a["this"] and row_a["alive"]
    assert row_a["counters"]["received_bytes"] >= 400
    assert cluster["totals"]["received"] == (row_a["counters"]["received"]
                                             + row_b["counters"]["received"])
    assert cluster["totals"]["received"] >= 40
    # the rate is over A's last two heartbeats (1 s apart here): A's 40
    # messages show in B's figures for a second or two
    assert "received" in row_a["rates"]


def test_the_rate_in_node_bs_figures_follows_node_as_traffic(nodes):
    a, b = nodes["node-a"], nodes["node-b"]
    api_b = Api(b.url)
    stop = threading.Event()
    publisher = PahoClient(a.port, 4, client_id=f"rate-{uid()[:6]}")
    publisher.connect_and_wait()

    def publish():
        while not stop.is_set():
            for _ in range(20):
                publisher.publish("rate/x", b"x", qos=0, wait=False)
            time.sleep(0.02)

    worker = threading.Thread(target=publish, daemon=True)
    worker.start()
    try:
        def fast() -> dict | None:
            c = api_b.get("/api/metrics/cluster")
            points = c["points"]
            return c if points and points[-1]["received"] >= 100 else None

        # the chart's last point, and the rate of node A in B's figures
        cluster = wait_for(fast, timeout=30, interval=0.5)
        assert cluster["points"][-1]["nodes"] == 2
        assert _row(cluster, "node-a")["rates"]["received"] >= 50
    finally:
        stop.set()
        worker.join(5)
        publisher.close()  # its backlog of QoS 0 messages is of no interest


def test_api_kafka_lists_the_topics_and_the_nodes_groups(nodes):
    a, b = nodes["node-a"], nodes["node-b"]
    prefix = nodes["prefix"]
    publisher = PahoClient(a.port, 4, client_id=f"k-{uid()[:6]}")
    publisher.connect_and_wait()
    for _ in range(5):
        publisher.publish("kafka/x", b"x", qos=1)
    publisher.disconnect()
    answer = Api(b.url).get("/api/kafka")
    validate("KafkaOverview", answer)
    assert answer["bus"] == "kafka" and answer["driver"] == nodes["driver"]
    topics = {t["name"]: t for t in answer["topics"]}
    msg_all = topics[prefix + "tbmq.msg.all"]
    assert msg_all["partitions"] == 4 and len(msg_all["latest_offsets"]) == 4
    assert msg_all["records"] and msg_all["records"] > 0
    assert all(name.startswith(prefix + "tbmq.") for name in topics)
    assert prefix + "tbmq.cluster.nodes" in topics
    groups = {g["group"]: g for g in answer["consumer_groups"]}
    node_group = groups["tbmq-node-node-b"]
    assert prefix + "tbmq.cluster.nodes" in {t["topic"] for t in node_group["topics"]}
    bundle = groups[prefix + "tbmq-cluster"]
    on_all = {t["topic"]: t for t in bundle["topics"]}[prefix + "tbmq.msg.all"]
    assert on_all["partitions"] and all(p["committed"] is not None
                                        for p in on_all["partitions"])
    assert all(p["lag"] is None or p["lag"] >= 0 for p in on_all["partitions"])


def test_the_embedded_node_answers_with_its_in_process_topics(tmp_path):
    broker = start_ops_broker(tmp_path, USERS)
    try:
        publisher = PahoClient(broker.port, 4, client_id="embedded-pub")
        publisher.connect_and_wait()
        for _ in range(3):
            publisher.publish("e/x", b"x", qos=1)
        publisher.disconnect()
        api = Api(broker.url)
        answer = api.get("/api/kafka")
        validate("KafkaOverview", answer)
        assert answer["bus"] == "in-process" and answer["driver"] is None
        topics = {t["name"]: t for t in answer["topics"]}
        assert topics["tbmq.msg.all"]["records"] >= 3
        assert "tbmq-msg-all" in {g["group"] for g in answer["consumer_groups"]}
        cluster = api.get("/api/metrics/cluster")
        validate("ClusterMetrics", cluster)
        assert cluster["nodes"] == 1 and len(cluster["by_node"]) == 1
        assert cluster["totals"]["received"] >= 3
    finally:
        _finish(broker)


# -- in a browser --------------------------------------------------------------------------


def _log_in(browser, node) -> None:
    browser.get(f"{node.url}/console/")
    if browser.find_elements(By.ID, "logout"):
        browser.find_element(By.ID, "logout").click()
    visible(browser, "#login-form")
    browser.find_element(By.ID, "login-user").send_keys(ROOT)
    browser.find_element(By.ID, "login-password").send_keys(USERS[ROOT][0])
    browser.find_element(By.ID, "login-submit").click()
    visible(browser, "#view-dashboard")


def test_the_dashboard_and_the_kafka_page_of_node_b(nodes, browser):  # noqa: F811
    a, b = nodes["node-a"], nodes["node-b"]
    _log_in(browser, b)
    go(browser, b, "dashboard")
    stop = threading.Event()
    publisher = PahoClient(a.port, 4, client_id=f"web-{uid()[:6]}")
    publisher.connect_and_wait()
    subscriber = PahoClient(b.port, 4, client_id=f"web-sub-{uid()[:6]}")
    subscriber.connect_and_wait()
    subscriber.subscribe("web/#")

    def publish():
        while not stop.is_set():
            for _ in range(20):
                publisher.publish("web/x", b"payload", qos=0, wait=False)
            time.sleep(0.02)

    def number(css: str) -> float:
        text = browser.find_element(By.CSS_SELECTOR, css).text.replace(",", "")
        return float(text) if text not in ("", "–") else 0.0

    worker = threading.Thread(target=publish, daemon=True)
    worker.start()
    try:
        # B's dashboard: the cluster's rate in, carried by A
        wait(browser, lambda _: number("#rate-in") >= 100, timeout=30)
        wait(browser, lambda _: number('tr[data-node="node-a"] .rate-in') >= 100, timeout=20)
        assert browser.find_elements(By.CSS_SELECTOR, 'tr[data-node="node-b"]')
        wait(browser, lambda _: number("#stat-connections") >= 2, timeout=10)
        time.sleep(3)  # a few points on the chart
        shot(browser, "dashboard-cluster")
    finally:
        stop.set()
        worker.join(5)
        publisher.close()  # its backlog of QoS 0 messages is of no interest
        subscriber.close()
    go(browser, b, "kafka")
    visible(browser, "#kafka-topics")
    prefix = nodes["prefix"]
    wait(browser, lambda br: br.find_elements(
        By.CSS_SELECTOR, f'#kafka-topics tr[data-topic="{prefix}tbmq.msg.all"]'))
    visible(browser, f'#kafka-groups tr[data-group="{prefix}tbmq-cluster"]')
    visible(browser, '#kafka-groups tr[data-group="tbmq-node-node-b"]')
    assert "Kafka bus" in browser.find_element(By.ID, "kafka-bus").text
    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1440, max(960, height))  # the whole page: groups too
    try:
        shot(browser, "kafka")
    finally:
        browser.set_window_size(1440, 960)
