"""End to end: the real broker (``twistd -n tbmq``) with the event log on,
real paho clients publishing a known traffic mix (MQTT 3.1.1 and 5.0, QoS
0, 1 and 2, a retained message); ``tbmq-analytics report`` over its log
while it runs (the file being written, not rotated yet), then again once
the broker stopped: the report's counts equal what the clients sent and
received.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
import sys
import threading
import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.integration.helpers import HOST, REPO_ROOT, uid

# two Spark jobs (a JVM each): minutes on a busy machine
pytestmark = pytest.mark.timeout(900)

TIMEOUT = 15.0


class Client:
    """A paho client that counts what it receives."""

    def __init__(self, port: int, client_id: str, version: int) -> None:
        protocol = paho.MQTTv5 if version == 5 else paho.MQTTv311
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=protocol)
        self.received: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.client.on_connect = lambda c, u, f, rc, p: self.connected.set()
        self.client.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(HOST, port)
        self.client.loop_start()
        assert self.connected.wait(TIMEOUT), f"{client_id} did not connect"

    def _on_message(self, client, userdata, msg) -> None:
        with self.lock:
            self.received.append((msg.topic, len(msg.payload)))

    def subscribe(self, topic_filter: str, qos: int) -> None:
        self.subscribed.clear()
        self.client.subscribe(topic_filter, qos)
        assert self.subscribed.wait(TIMEOUT)

    def publish(self, topic: str, size: int, qos: int, retain: bool = False) -> None:
        info = self.client.publish(topic, b"x" * size, qos=qos, retain=retain)
        info.wait_for_publish(TIMEOUT)

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.received) >= count:
                    return
            time.sleep(0.02)
        raise AssertionError(f"received {len(self.received)} of {count}")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def read_csv(path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def report(events_dir, out, *options) -> subprocess.CompletedProcess:
    """``tbmq-analytics report`` over ``events_dir`` in a subprocess."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, "-m", "tbmq.analytics.cli", "report", "--input", str(events_dir),
         "--output", str(out), "--master", "local[2]", *options],
        env=env, capture_output=True, text=True, timeout=600)


def wait_for_records(events_dir, kinds: dict[str, int]) -> None:
    """Wait until the exporter's file in progress holds ``kinds`` (type →
    count) records."""
    deadline = time.monotonic() + TIMEOUT
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        counts = {}
        for name in os.listdir(events_dir):
            with open(events_dir / name, encoding="utf-8") as f:
                for line in f:
                    if line.endswith("\n"):
                        kind = json.loads(line)["type"]
                        counts[kind] = counts.get(kind, 0) + 1
        if all(counts.get(k, 0) >= n for k, n in kinds.items()):
            return
        time.sleep(0.1)
    raise AssertionError(f"the event log holds {counts}, not {kinds}")


def test_report_counts_equal_the_traffic(broker_factory, tmp_path):
    broker = broker_factory(env={"TBMQ_EVENTS__ENABLED": "true",
                                 "TBMQ_EVENTS__FLUSH_INTERVAL": "0.2",
                                 "TBMQ_NODE__SERVICE_ID": "e2e-node"})
    p = f"e2e{uid()}"
    connected = time.monotonic()
    sub_a = Client(broker.port, f"{p}-sub-a", 5)
    sub_b = Client(broker.port, f"{p}-sub-b", 4)
    sub_a.subscribe(f"{p}/#", 1)
    sub_b.subscribe(f"{p}/sensors/+", 0)
    pub_1 = Client(broker.port, f"{p}-pub-1", 4)
    pub_2 = Client(broker.port, f"{p}-pub-2", 5)
    for _ in range(10):
        pub_1.publish(f"{p}/sensors/t1", 10, 0)
    for _ in range(5):
        pub_1.publish(f"{p}/sensors/t2", 20, 1)
    for _ in range(4):
        pub_2.publish(f"{p}/cmd/x", 5, 2)
    pub_2.publish(f"{p}/status", 3, 1, retain=True)
    sub_a.wait_for(20)
    sub_b.wait_for(15)
    time.sleep(0.5)  # the last QoS 1/2 acknowledgements reach the broker

    # the report over the running broker: the file being written is read
    events_dir = broker.data_dir / "events"
    wait_for_records(events_dir, {"publish": 20, "deliver": 35})
    names = os.listdir(events_dir)
    assert len(names) == 1 and names[0].endswith(".jsonl.inprogress"), names
    live = report(events_dir, tmp_path / "live", "--quiet")
    assert live.returncode == 0, live.stderr[-5000:]
    summary = {r["metric"]: int(r["value"]) for r in read_csv(tmp_path / "live" / "csv" / "summary.csv")}
    assert summary["messages_in"] == 20 and summary["messages_out"] == 35
    assert summary["events_connect"] == 4 and summary["bad_records"] == 0

    for client in (pub_1, pub_2, sub_a, sub_b):
        client.close()
    time.sleep(0.5)
    lifetime = time.monotonic() - connected  # the longest a connection can have lasted
    broker.stop()  # SIGTERM: a clean shutdown (it raises if the broker does not stop)

    # what the clients saw
    assert len(sub_a.received) == 20 and len(sub_b.received) == 15
    received = {}
    for topic, size in sub_a.received + sub_b.received:
        count, total = received.get(topic, (0, 0))
        received[topic] = (count + 1, total + size)
    assert received == {f"{p}/sensors/t1": (20, 200), f"{p}/sensors/t2": (10, 200),
                        f"{p}/cmd/x": (4, 20), f"{p}/status": (1, 3)}

    # the exported log: rotated and gzipped on stop, nothing in progress left
    names = os.listdir(events_dir)
    assert names and all(n.endswith(".jsonl.gz") for n in names), names
    records = []
    for name in names:
        with gzip.open(events_dir / name, "rt", encoding="utf-8") as f:
            records += [json.loads(line) for line in f]
    assert {r["node"] for r in records} == {"e2e-node"}
    # a truncated line, as a crash would leave: counted, not fatal
    (events_dir / "events-torn.jsonl").write_text('{"v":1,"type":"publish","ts":17\n')

    out = tmp_path / "report"
    run = report(events_dir, out, "--levels", "2,3")
    assert run.returncode == 0, run.stderr[-5000:]
    assert "[21/21]" in run.stderr and "1 bad input records skipped" in run.stderr

    summary = {r["metric"]: int(r["value"]) for r in read_csv(out / "csv" / "summary.csv")}
    assert summary["messages_in"] == 20 and summary["bytes_in"] == 100 + 100 + 20 + 3
    assert summary["messages_out"] == 35 and summary["bytes_out"] == 200 + 200 + 20 + 3
    assert summary["events_connect"] == 4 and summary["events_disconnect"] == 4
    assert summary["events_subscribe"] == 2 and summary["bad_records"] == 1

    by_topic = {r["topic"]: (int(r["messages_in"]), int(r["bytes_in"]), int(r["messages_out"]),
                             int(r["bytes_out"])) for r in read_csv(out / "csv" / "traffic_by_topic.csv")}
    assert by_topic == {f"{p}/sensors/t1": (10, 100, 20, 200), f"{p}/sensors/t2": (5, 100, 10, 200),
                        f"{p}/cmd/x": (4, 20, 4, 20), f"{p}/status": (1, 3, 1, 3)}

    by_client = {r["client_id"]: (r["client_type"], int(r["messages_in"]), int(r["messages_out"]))
                 for r in read_csv(out / "csv" / "traffic_by_client.csv")}
    assert by_client == {f"{p}-pub-1": ("DEVICE", 15, 0), f"{p}-pub-2": ("DEVICE", 5, 0),
                         f"{p}-sub-a": ("DEVICE", 0, 20), f"{p}-sub-b": ("DEVICE", 0, 15)}

    rollup = {(int(r["levels"]), r["topic_prefix"]): int(r["messages_out"])
              for r in read_csv(out / "csv" / "traffic_by_rollup.csv")}
    assert rollup[(2, f"{p}/sensors")] == 30 and rollup[(3, f"{p}/sensors/t1")] == 20

    qos = {(r["direction"], int(r["qos"]), r["retain"]): int(r["messages"])
           for r in read_csv(out / "csv" / "qos_mix.csv")}
    assert qos == {("in", 0, "false"): 10, ("in", 1, "false"): 5, ("in", 1, "true"): 1,
                   ("in", 2, "false"): 4, ("out", 0, "false"): 10 + 15,
                   # QoS 2 messages reach sub-a (QoS 1 subscription) at QoS 1
                   ("out", 1, "false"): 5 + 4, ("out", 1, "true"): 1}

    fanout = {int(r["fanout"]): int(r["messages"]) for r in read_csv(out / "csv" / "fanout.csv")}
    assert fanout == {2: 15, 1: 5}

    latency = read_csv(out / "csv" / "latency_by_node.csv")
    assert [r["node"] for r in latency] == ["e2e-node"]
    assert int(latency[0]["deliveries"]) == 34  # the retained message is left out
    assert 0 <= float(latency[0]["p50_ms"]) <= float(latency[0]["p99_ms"]) < 10000

    durations = {r["client_type"]: r for r in read_csv(out / "csv" / "session_durations.csv")}
    assert int(durations["DEVICE"]["sessions"]) == 4
    assert 0 < float(durations["DEVICE"]["max_s"]) < lifetime

    reasons = {r["reason"]: int(r["disconnects"]) for r in read_csv(out / "csv" / "disconnect_reasons.csv")}
    assert reasons == {"normal disconnection": 4}
    bad = read_csv(out / "csv" / "bad_records.csv")
    assert [(r["reason"], r["records"]) for r in bad] == [("corrupt", "1")]
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "charts/throughput.png" in html and (out / "charts" / "throughput.png").exists()
