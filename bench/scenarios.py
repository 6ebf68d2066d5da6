"""The scenarios of issue 5: each runs the generator's workers (one OS process
each) against one running broker and returns its figures.

Every figure is measured from the common start time ``t0`` (the publishers'
first byte) to the last delivery the subscribers saw, so a broker that takes
messages in faster than it delivers them is charged for its backlog.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import time

from . import workers as gen
from .brokers import VENV, Broker, ensure_venv

now = time.monotonic
_ctx = mp.get_context("fork")

PAYLOAD = 64
#: the throughput workers sleep this long after each loop turn that did
#: something (see mqttgen.Loop); BENCH_COALESCE overrides it
COALESCE = 0.0005


class ScenarioError(Exception):
    pass


def _recv(conn, kinds, timeout, who):
    if not conn.poll(timeout):
        raise ScenarioError(f"{who}: no {kinds} in {timeout:.0f}s")
    msg = conn.recv()
    if msg[0] == "error":
        raise ScenarioError(f"{who}: {msg[1]}")
    if msg[0] not in kinds:
        raise ScenarioError(f"{who}: expected {kinds}, got {msg[0]}")
    return msg[1]


class Workers:
    """Worker processes, each with a control pipe."""

    def __init__(self, target, roles: list[dict]) -> None:
        self.roles = roles
        self.procs = []
        self.conns = []
        for i, role in enumerate(roles):
            parent, child = _ctx.Pipe()
            p = _ctx.Process(target=target, args=(child, role), name=f"gen-{i}", daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)

    def gather(self, kinds, timeout):
        deadline = now() + timeout
        return [_recv(c, kinds, max(0.1, deadline - now()), f"worker {i}") for i, c in enumerate(self.conns)]

    def send_all(self, msg):
        for c in self.conns:
            c.send(msg)

    def close(self):
        for c in self.conns:
            try:
                c.send(("abort",))
            except (OSError, BrokenPipeError):
                pass
        for p in self.procs:
            p.join(3)
            if p.is_alive():
                p.terminate()
                p.join(2)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self.conns:
            c.close()


class Profiler:
    """py-spy attached to the broker for the measured phase (raw collapsed
    stacks, summarised by :mod:`bench.pyspy_top`). It pauses the broker for each
    sample (200 Hz): --nonblocking gave torn stacks."""

    def __init__(self, pid: int, path: str | None, duration: float) -> None:
        self.proc = None
        if path:
            ensure_venv()
            self.proc = subprocess.Popen(
                [os.path.join(VENV, "bin", "py-spy"), "record", "-p", str(pid), "-r", "200",
                 "-d", str(max(1, int(duration))), "--format", "raw", "-o", path],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait(self):
        if self.proc is not None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _throughput(broker: Broker, level: int, roles: list[dict], duration: float,
                profile: str | None = None) -> dict:
    common = {"host": broker.host, "port": broker.port, "level": level, "payload_size": PAYLOAD,
              "duration": duration, "coalesce": float(os.environ.get("BENCH_COALESCE", COALESCE))}
    roles = [{**common, **r} for r in roles]
    w = Workers(gen.clients_worker, roles)
    try:
        w.gather(("ready",), 120)
        t0 = now() + 0.3
        cpu0 = broker.cpu_s()
        w.send_all(("go", t0))
        prof = Profiler(broker.pid, profile, duration)
        published = w.gather(("published",), duration + 120)
        prof.wait()
        total_sent = sum(p["sent"] for p in published)
        drain_timeout = max(10.0, 2 * duration)
        for conn, role, pub in zip(w.conns, roles, published):
            n_subs = len(role["subs"])
            expect = {"all": total_sent, "all_per_sub": total_sent * n_subs,
                      "own": pub["sent"]}[role["expect"]] if n_subs else 0
            role["_expected"] = expect
            conn.send(("drain", expect, drain_timeout))
        done = w.gather(("done",), drain_timeout + 30)
        cpu1 = broker.cpu_s()
        rss, hwm = broker.rss_kb()
    finally:
        w.close()
    expected = sum(r["_expected"] for r in roles)
    received = sum(sum(d["received"]) for d in done)
    t_last = max(d["t_last"] for d, r in zip(done, roles) if r["subs"])
    wall = max(1e-6, t_last - t0)
    gen_cpu = sum(d["cpu"] for d in done)
    return {
        "value": received / wall,
        "sent": total_sent,
        "expected": expected,
        "received": received,
        "lost": expected - received,
        "loss_pct": 100.0 * (expected - received) / expected if expected else 0.0,
        "unacked": sum(p["unacked"] for p in published),
        "offered_rate": total_sent / max(1e-6, max(p.get("t_pub_end", t0) for p in published) - t0),
        "wall_s": wall,
        "gen_cpu_s": gen_cpu,
        "gen_cpu_pct": 100.0 * gen_cpu / wall,
        "broker_cpu_pct": 100.0 * (cpu1 - cpu0) / wall,
        "broker_rss_mb": rss / 1024,
        "broker_hwm_mb": hwm / 1024,
        "errors": [e for d in done for e in d.get("errors", []) if e],
    }


def fanin(broker, level, qos, duration, profile=None, window=100):
    """10 publishers → 1 subscriber on ``bench/fanin/+``."""
    pubs = [(f"fi-pub{i:02d}", f"bench/fanin/{i:02d}") for i in range(10)]
    roles = [
        {"subs": [("fi-sub", "bench/fanin/+")], "pubs": [], "sub_qos": qos, "qos": qos,
         "window": window, "expect": "all"},
        {"subs": [], "pubs": pubs, "sub_qos": qos, "qos": qos, "window": window, "expect": "all"},
    ]
    return _throughput(broker, level, roles, duration, profile)


def fanout(broker, level, qos, duration, profile=None, window=100, n_subs=100, sub_workers=2):
    """1 publisher → 100 subscribers of ``bench/fanout/t``."""
    roles = [{"subs": [], "pubs": [("fo-pub", "bench/fanout/t")], "sub_qos": qos, "qos": qos,
              "window": window, "expect": "all_per_sub"}]
    per = n_subs // sub_workers
    for k in range(sub_workers):
        subs = [(f"fo-sub{k * per + i:03d}", "bench/fanout/t") for i in range(per)]
        roles.append({"subs": subs, "pubs": [], "sub_qos": qos, "qos": qos, "window": window,
                      "expect": "all_per_sub"})
    return _throughput(broker, level, roles, duration, profile)


def p2p(broker, level, qos, duration, profile=None, window=20, pairs=100, workers=2):
    """100 publisher/subscriber pairs, each on its own topic."""
    roles = []
    per = pairs // workers
    for k in range(workers):
        ids = range(k * per, (k + 1) * per)
        roles.append({"subs": [(f"pp-sub{i:03d}", f"bench/p2p/{i:03d}") for i in ids],
                      "pubs": [(f"pp-pub{i:03d}", f"bench/p2p/{i:03d}") for i in ids],
                      "sub_qos": qos, "qos": qos, "window": window, "expect": "own"})
    return _throughput(broker, level, roles, duration, profile)


def latency(broker, level, qos, duration, rate=1000, profile=None):
    """One pair at ``rate`` messages/s; p50/p99/max of publish → delivery."""
    role = {"host": broker.host, "port": broker.port, "level": level, "qos": qos, "rate": rate,
            "duration": duration, "payload_size": PAYLOAD, "topic": "bench/lat/t",
            "prefix": f"lat{qos}"}
    w = Workers(gen.latency_worker, [role])
    try:
        w.gather(("ready",), 60)
        cpu0 = broker.cpu_s()
        t0 = now() + 0.2
        w.send_all(("go", t0))
        d = w.gather(("done",), duration + 60)[0]
        cpu1 = broker.cpu_s()
    finally:
        w.close()
    wall = now() - t0
    n = d["received"][0]
    return {"value": d["p50"], "p50_ms": d["p50"], "p99_ms": d["p99"], "max_ms": d["max"],
            "sent": d["sent"], "received": n, "expected": d["sent"], "lost": d["sent"] - n,
            "loss_pct": 100.0 * (d["sent"] - n) / d["sent"] if d["sent"] else 0.0,
            "gen_cpu_s": d["cpu"], "gen_cpu_pct": 100.0 * d["cpu"] / wall,
            "broker_cpu_pct": 100.0 * (cpu1 - cpu0) / wall, "errors": [e for e in d["errors"] if e]}


def connections(broker, level, count=10000, workers=2, hold=2.0):
    """``count`` idle clients: connect rate and broker RSS per connection."""
    time.sleep(1.0)
    rss0, _ = broker.rss_kb()
    per = count // workers
    roles = [{"host": broker.host, "port": broker.port, "level": level, "count": per,
              "prefix": f"idle{k}", "timeout": 180, "window": 100} for k in range(workers)]
    w = Workers(gen.idle_worker, roles)
    try:
        w.gather(("ready",), 60)
        cpu0 = broker.cpu_s()
        t0 = now() + 0.2
        w.send_all(("go", t0))
        got = w.gather(("connected",), 240)
        t1 = max(g["t_done"] for g in got)
        cpu1 = broker.cpu_s()
        time.sleep(hold)
        rss1, hwm = broker.rss_kb()
        w.send_all(("close",))
        ends = w.gather(("done",), 60)
    finally:
        w.close()
    n = sum(g["connected"] for g in got)
    wall = max(1e-6, t1 - t0)
    gen_cpu = sum(g["cpu"] for g in got)
    return {"value": n / wall, "connected": n, "expected": count, "lost": count - n,
            "loss_pct": 100.0 * (count - n) / count,
            "alive_at_end": sum(e["alive_at_end"] for e in ends),
            "rss_before_mb": rss0 / 1024, "rss_after_mb": rss1 / 1024,
            "kb_per_conn": (rss1 - rss0) / n if n else None,
            "wall_s": wall, "gen_cpu_s": gen_cpu, "gen_cpu_pct": 100.0 * gen_cpu / wall,
            "broker_cpu_pct": 100.0 * (cpu1 - cpu0) / wall,
            "errors": [e for g in got for e in g["errors"] if e]}


def persistent(broker, level, count=100000, window=100, username="bench"):
    """A persistent QoS 1 subscriber offline while ``count`` messages are
    queued, then reconnecting: time to drain, nothing lost.

    The clients send a user name (no password): amqtt keeps no offline
    messages for a client it authenticated as anonymous."""
    role = {"host": broker.host, "port": broker.port, "level": level, "count": count,
            "payload_size": PAYLOAD, "topic": "bench/persist", "prefix": f"ps{level}",
            "window": window, "publish_timeout": 600, "drain_timeout": 600, "idle_timeout": 10,
            "username": username}
    w = Workers(gen.persistent_worker, [role])
    try:
        w.gather(("ready",), 60)
        cpu0 = broker.cpu_s()
        w.send_all(("go", now()))
        d = w.gather(("done",), 1300)[0]
        cpu1 = broker.cpu_s()
        rss, hwm = broker.rss_kb()
    finally:
        w.close()
    n = d["received"][0]
    wall = d["publish_s"] + d["drain_s"]
    return {"value": n / d["drain_s"] if d["drain_s"] > 0 else None,
            "drain_s": d["drain_s"], "publish_rate": d["acked"] / d["publish_s"] if d["publish_s"] else None,
            "sent": d["sent"], "acked": d["acked"], "received": n, "duplicates": d["duplicates"],
            "expected": count, "lost": count - n, "loss_pct": 100.0 * (count - n) / count,
            "session_present": d["session_present"],
            "gen_cpu_s": d["cpu"], "gen_cpu_pct": 100.0 * d["cpu"] / wall if wall else None,
            "broker_cpu_pct": 100.0 * (cpu1 - cpu0) / wall if wall else None,
            "broker_rss_mb": rss / 1024, "broker_hwm_mb": hwm / 1024,
            "errors": [e for e in d["errors"] if e]}
