"""The scenarios of :mod:`bench.cluster` beside the throughput ones: an idle
cluster, a burst of CONNECTs, persistent DEVICE and APPLICATION traffic, a
node killed while clients connect, and a reconnect storm.

Each takes a :class:`Context` and the running ``Cluster`` (its
``nodes``: node A first) and returns a dict of figures; times in seconds,
CPU in percent of one core unless the name says otherwise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench import scenarios
from bench import workers as gen
from bench.brokers import proc_cpu_s, thread_cpu_s
from bench.storm import probe_connects, stored_tags, storm_worker, tags_in_topics

now = time.monotonic

#: the client id of the APPLICATION client of ``app_fanin``; its
#: credentials (client type APPLICATION, no password) are added to every
#: node's credential store before the node starts
APP_CLIENT_ID = "bench-app"


@dataclass
class Context:
    """What a scenario may need beside its cluster.

    :ivar duration: seconds of traffic (``--duration``).
    :ivar prefix: unique per configuration and run: client ids and topics.
    :ivar services: the run's ``Services`` (``procs``: Tansu, Redis).
    :ivar options: the other command-line options (``argparse.Namespace``).
    """

    duration: float
    prefix: str
    services: object
    options: object


def _cpu_of(procs: dict) -> dict:
    out = {}
    for name, pid in procs.items():
        try:
            out[name] = proc_cpu_s(pid)
        except OSError:
            out[name] = 0.0
    return out


def idle(ctx: Context, cluster) -> dict:
    """The nodes started, no client: each node's CPU and Tansu's (and
    Redis's) over ``--idle-seconds`` (10), after ``--idle-settle`` (2) s."""
    time.sleep(ctx.options.idle_settle)
    procs = {"tansu": ctx.services.procs[0].pid, "redis": ctx.services.procs[1].pid}
    n0, s0, t0 = cluster.node_cpu_s(), _cpu_of(procs), now()
    time.sleep(ctx.options.idle_seconds)
    n1, s1, wall = cluster.node_cpu_s(), _cpu_of(procs), now() - t0
    return {"node_cpu_pct": [100.0 * (b - a) / wall for a, b in zip(n0, n1)],
            "tansu_cpu_pct": 100.0 * (s1["tansu"] - s0["tansu"]) / wall,
            "redis_cpu_pct": 100.0 * (s1["redis"] - s0["redis"]) / wall, "seconds": wall}


def connect_burst(ctx: Context, cluster, clean: bool) -> dict:
    """``--connect-clients`` (5,000) clients CONNECT to node A as fast as
    it answers (v5; clean: Clean Start, else Session Expiry 3600 and Clean
    Start 0), ``--connect-window`` handshakes under way per worker, two
    workers; then DISCONNECT (persistent: the sessions are removed after,
    outside the figures).

    :returns: value (accepted CONNECT/s from the first CONNECT sent to the
        last CONNACK received), p50/p99/max_ms (CONNECT → CONNACK),
        accepted, refused (reason code >= 0x80) with codes, failed, the
        node CPU over the burst (node_cpu_pct, cpu_us_per_connect).
    """
    count, n_workers = ctx.options.connect_clients, 2
    roles = [{"host": cluster.host, "port": cluster.port, "level": 5,
              "count": count // n_workers + (k < count % n_workers),
              "prefix": f"{ctx.prefix}{'cc' if clean else 'cp'}{k}", "window": ctx.options.connect_window,
              "clean": clean, "expiry": 0 if clean else 3600, "cleanup": not clean, "timeout": 600}
             for k in range(n_workers)]
    w = scenarios.Workers(gen.connect_worker, roles)
    try:
        w.gather(("ready",), 60)
        threads0 = _node_threads(cluster)
        cpu0 = cluster.node_cpu_s()
        w.send_all(("go", now() + 0.2))
        got = w.gather(("connected",), 700)
        cpu1 = cluster.node_cpu_s()
        threads1 = _node_threads(cluster)
        w.send_all(("close",))
        ends = w.gather(("done",), 900)
    finally:
        w.close()
    lat = sorted(x for g in got for x in g["latencies"])
    t_first, t_last = min(g["t_first"] for g in got), max(g["t_last"] for g in got)
    wall = max(1e-6, t_last - t_first)
    accepted = sum(g["accepted"] for g in got)
    codes: dict = {}
    for g in got:
        for code, n in g["codes"].items():
            codes[code] = codes.get(code, 0) + n
    cpu = [b - a for a, b in zip(cpu0, cpu1)]

    def pct(p):
        return 1e3 * lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None

    result = {"value": accepted / wall, "wall_s": wall, "accepted": accepted, "expected": count,
            "refused": sum(g["refused"] for g in got), "codes": {f"{k:#x}": v for k, v in codes.items()},
            "failed": sum(g["failed"] for g in got), "p50_ms": pct(0.5), "p99_ms": pct(0.99),
            "max_ms": 1e3 * lat[-1] if lat else None,
            "node_cpu_pct": [100.0 * c / wall for c in cpu],
            "cpu_us_per_connect": 1e6 * sum(cpu) / accepted if accepted else None,
            "gen_cpu_s": sum(g["cpu"] for g in got),
            "unclosed": sum(e["unclosed"] for e in ends)}
    if getattr(ctx.options, "threads", False) and accepted:
        result["thread_cpu_us_per_connect"] = [
            {k: round(1e6 * (v - before.get(k, 0.0)) / accepted, 1)
             for k, v in sorted(after.items()) if v - before.get(k, 0.0) > 0}
            for before, after in zip(threads0, threads1)]
    return result


def _node_threads(cluster) -> list[dict]:
    """Each node's CPU seconds by thread (:func:`bench.brokers.thread_cpu_s`);
    {} for a node whose process is gone (or Mosquitto's, which has no nodes)."""
    out = []
    for n in getattr(cluster, "nodes", ()):
        try:
            out.append(thread_cpu_s(n.pid))
        except OSError:
            out.append({})
    return out


def persistent_p2p(ctx: Context, cluster, pairs: int = 50) -> dict:
    """``pairs`` QoS 1 pairs: persistent DEVICE subscribers (v5 Session
    Expiry 3600: their messages go through the device store, Redis in the
    cluster) on node B, publishers on node A."""
    roles = []
    for k in range(2):
        ids = range(k * pairs // 2, (k + 1) * pairs // 2)
        roles.append({"subs": [(f"{ctx.prefix}ps{i:03d}", f"bench/pp2p/{i:03d}") for i in ids],
                      "pubs": [(f"{ctx.prefix}pp{i:03d}", f"bench/pp2p/{i:03d}") for i in ids],
                      "sub_qos": 1, "qos": 1, "window": 20, "expect": "own", "sub_expiry": 3600,
                      "sub_port": cluster.other_port})
    return scenarios._throughput(cluster, 5, roles, ctx.duration)


def app_fanin(ctx: Context, cluster, publishers: int = 10) -> dict:
    """``publishers`` QoS 1 publishers (half on each node) → one persistent
    APPLICATION client (:data:`APP_CLIENT_ID`, Session Expiry 3600) on node
    B: its messages go through ``tbmq.msg.app.<clientId>`` in the cluster."""
    pubs = [(f"{ctx.prefix}ap{i:02d}", f"bench/app/{i:02d}") for i in range(publishers)]
    common = {"sub_qos": 1, "qos": 1, "window": 100, "expect": "all"}
    roles = [
        {**common, "subs": [(APP_CLIENT_ID, "bench/app/+")], "pubs": [], "sub_expiry": 3600,
         "sub_port": cluster.other_port},
        {**common, "subs": [], "pubs": pubs[:publishers // 2]},
        {**common, "subs": [], "pubs": pubs[publishers // 2:], "pub_port": cluster.other_port},
    ]
    return scenarios._throughput(cluster, 5, roles, ctx.duration)


def queue(ctx: Context, cluster, app: bool) -> dict:
    """An offline persistent subscriber (v5, Session Expiry 3600, QoS 1) of
    node B while a publisher on node A sends ``--queue-count`` QoS 1
    messages (:func:`bench.scenarios.persistent`), then its reconnect to B
    and drain. A DEVICE's messages are queued in the device store (Redis or
    PostgreSQL in the cluster, SQLite on the embedded node), an
    APPLICATION client's (``app``, :data:`APP_CLIENT_ID`) in
    ``tbmq.msg.app.<clientId>``. ``value`` is the drain rate,
    ``publish_rate`` the queueing rate (acknowledged messages per second)."""
    res = scenarios.persistent(cluster, 5, count=ctx.options.queue_count,
                               app_client=APP_CLIENT_ID if app else None,
                               sub_port=cluster.other_port, settle=2.0)
    res["queue_rate"] = res.get("publish_rate")
    return res


def kill(ctx: Context, cluster) -> dict:
    """SIGKILL node B while node A serves; a new client CONNECTs to node A
    every 100 ms (its own client id each time: some belong to the
    partitions B held), from 1 s before the kill until CONNECTs have been
    accepted promptly for 5 s, at least ``max(15, --duration)`` s after the
    kill (:func:`bench.storm.probe_connects`). The cluster runs with
    ``etc/tbmq.yml``'s Kafka group settings."""
    a, b = cluster.nodes
    res = probe_connects(a.host, a.port, b.proc.kill, f"{ctx.prefix}k", before=1.0, interval=0.1,
                         window=max(15.0, ctx.duration), steady=5.0)
    res["value"] = res["recovered_s"]
    res["codes"] = {f"{k:#x}": v for k, v in res["codes"].items()}
    return res


def storm(ctx: Context, cluster) -> dict:
    """Node B holds ``--storm-clients`` (1,000) clients: half persistent
    QoS 1 subscribers, half QoS 1 publishers (``--storm-rate``, 1,000
    msg/s in all, publisher i to subscriber i); ``--duration`` s after
    every subscriber received its first message node B is killed (SIGKILL) and every client reconnects to node A
    (:class:`bench.storm.StormFleet`); 1 s after the last is back the
    publishers stop.

    :returns: value and reconnect_s (kill → every client connected again),
        delivered_s (kill → every acknowledged message sent before the kill
        delivered), all_delivered_s (kill → every acknowledged message
        delivered, those sent until the stop too), lost (acknowledged, never delivered: must be 0),
        duplicates, the CONNECT attempts and refusals of the storm;
        lost_messages (only when some were lost): a few of them, each
        described by :meth:`bench.storm.StormFleet.describe_lost`, with
        ``stored`` (the subscriber's deliveries in the device store after
        the run) and ``in_store`` (the lost one's ``[state, packet id]``
        there, or None) and ``on_bus`` (``[topic, partition, offset]`` of
        every record of ``tbmq.msg.all`` and ``tbmq.msg.persisted`` that
        holds it).
    """
    a, b = cluster.nodes
    pairs, n_workers = max(1, ctx.options.storm_clients // 2), 2
    per = [pairs // n_workers + (k < pairs % n_workers) for k in range(n_workers)]
    roles = [{"host": a.host, "port": b.port, "port_a": a.port, "first": sum(per[:k]), "pairs": per[k],
              "prefix": f"{ctx.prefix}st", "topic": "bench/storm", "seed": k,
              "rate_each": ctx.options.storm_rate / pairs}
             for k in range(n_workers) if per[k]]
    w = scenarios.Workers(storm_worker, roles)
    try:
        w.gather(("ready",), 600)
        time.sleep(ctx.duration)
        b.proc.kill()
        t_kill = now()
        w.send_all(("killed", t_kill))
        back = w.gather(("reconnected",), 400)
        time.sleep(1.0)
        w.send_all(("stop",))
        done = w.gather(("done",), 300)
    finally:
        w.close()
    out: dict = {"codes": {}}
    for d in done:
        for k, v in d.items():
            if k == "codes":
                for code, n in v.items():
                    out["codes"][f"{code:#x}"] = out["codes"].get(f"{code:#x}", 0) + n
            elif k.endswith("_s"):
                out[k] = None if v is None or (k in out and out[k] is None) else max(out.get(k, v), v)
            elif isinstance(v, list):
                out[k] = out.get(k, []) + v
            else:
                out[k] = out.get(k, 0) + v
    if not out.get("lost_messages"):
        out.pop("lost_messages", None)  # printed (bench.cluster.SHOWN) only when there are some
    for lost in out.get("lost_messages", ()):
        try:  # waiting in the device store, or never stored?
            tags = stored_tags(a.host, ctx.services.redis_port, f"{ctx.prefix}:", lost["sub"])
            lost["stored"] = len(tags)
            lost["in_store"] = tags.get((lost["pair"], lost["seq"]))
        except Exception as e:  # noqa: BLE001 - a clue, not a result
            lost["in_store"] = f"unknown: {e}"
    if out.get("lost_messages"):
        # on the bus? (tbmq.msg.all: the publish; tbmq.msg.persisted: the match)
        prefix = f"{ctx.prefix}."
        try:
            where = tags_in_topics(f"127.0.0.1:{ctx.services.kafka_port}",
                                   [prefix + "tbmq.msg.all", prefix + "tbmq.msg.persisted"],
                                   {(x["pair"], x["seq"]) for x in out["lost_messages"]})
            for lost in out["lost_messages"]:
                lost["on_bus"] = where[(lost["pair"], lost["seq"])]
        except Exception as e:  # noqa: BLE001 - a clue, not a result
            for lost in out["lost_messages"]:
                lost["on_bus"] = f"unknown: {e}"
    out["all_back"] = all(x["all_up"] for x in back)
    out["value"] = out.get("reconnect_s")
    return out
