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
import sys
import time

from . import flow_workers as fgen
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
    sample (200 Hz): --nonblocking gave torn stacks. ``BENCH_PYSPY_ARGS`` adds
    py-spy options (e.g. ``--threads --idle`` or ``--gil``)."""

    def __init__(self, pid: int, path: str | None, duration: float) -> None:
        self.proc = None
        if path:
            # the py-spy beside this Python (the project's venv has it), else the private venv's
            spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
            if not os.path.exists(spy):
                ensure_venv()
                spy = os.path.join(VENV, "bin", "py-spy")
            self.proc = subprocess.Popen(
                [spy, "record", "-p", str(pid), "-r", os.environ.get("BENCH_PYSPY_RATE", "200"),
                 "-d", str(max(1, int(duration))), "--format", "raw", "-o", path,
                 *os.environ.get("BENCH_PYSPY_ARGS", "").split()],
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


#: the client id of the APPLICATION subscriber of the ``*_app`` scenarios:
#: bench/run.py gives tbmq credentials of client type APPLICATION for it
#: (Mosquitto has no client types: there it is an ordinary persistent client)
APP_CLIENT_ID = "bench-app"


def fanin(broker, level, qos, duration, profile=None, window=100, app_client=None):
    """10 publishers → 1 subscriber on ``bench/fanin/+``.

    :param app_client: None, or the client id of a persistent subscriber
        (v5 Session Expiry 3600, v3.1.1 Clean Session 0) online throughout:
        a persistent APPLICATION client when the broker has its credentials."""
    pubs = [(f"fi-pub{i:02d}", f"bench/fanin/{i:02d}") for i in range(10)]
    persistent = {"sub_expiry": 3600, "sub_clean": level == 5} if app_client else {}
    roles = [
        {"subs": [(app_client or "fi-sub", "bench/fanin/+")], "pubs": [], "sub_qos": qos, "qos": qos,
         "window": window, "expect": "all", **persistent},
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


def persistent(broker, level, count=100000, window=100, username="bench", qos=1, app_client=None,
               profile=None, profile_s=4.0, sub_port=None, settle=0.2):
    """A persistent subscriber (QoS ``qos``, 1 or 2) offline while ``count``
    messages are queued at that QoS, then reconnecting: time to drain,
    nothing lost.

    The clients send a user name (no password): amqtt keeps no offline
    messages for a client it authenticated as anonymous.

    :param app_client: None (the subscriber is ``ps<level>-psub``, a DEVICE
        in tbmq), or the subscriber's client id (an APPLICATION client when
        the broker has its credentials).
    :param profile: None, or the file of a py-spy profile (raw) of the
        first ``profile_s`` seconds of the queueing phase.
    :param sub_port: None, or the port the subscriber uses (a cluster's
        other node); the publisher uses ``broker.port``.
    :param settle: seconds between the subscription and the first publish."""
    role = {"host": broker.host, "port": sub_port or broker.port, "pub_port": broker.port,
            "settle": settle, "level": level, "count": count,
            "payload_size": PAYLOAD, "topic": "bench/persist", "prefix": f"ps{level}",
            "window": window, "publish_timeout": 600, "drain_timeout": 600, "idle_timeout": 10,
            "username": username, "qos": qos, "client_id": app_client}
    w = Workers(gen.persistent_worker, [role])
    try:
        w.gather(("ready",), 60)
        cpu0 = broker.cpu_s()
        w.send_all(("go", now()))
        prof = Profiler(broker.pid, profile, profile_s)
        d = w.gather(("done",), 1300)[0]
        prof.wait()
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


# --------------------------------------------------------------------------
# flow control (ARCHITECTURE.md "Flow control: nothing acknowledged is
# dropped, nobody is held for long"): messages tagged (publisher, number)


def _loss_figures(acked: dict, done: dict, sent: int) -> dict:
    delivered = done["seen"][0]
    n_acked = sum(sum(m) for m in acked.values())
    lost = fgen.missing(acked, delivered)
    return {"sent": sent, "acked": n_acked, "received": done["unique"][0], "duplicates": done["duplicates"],
            "expected": n_acked, "lost": lost, "loss_pct": 100.0 * lost / n_acked if n_acked else 0.0,
            # delivered but never acknowledged to the publisher: allowed (its PUBACK was lost), counted
            "unacked_delivered": done["unique"][0] - (n_acked - lost)}


def fanin_loss(broker, level, payload_size, duration, window=100, publishers=10, drain_idle=5.0):
    """10 publishers → 1 subscriber at QoS 1, payloads tagged (publisher,
    number), unlimited rate for ``duration`` s; the subscriber reads as fast
    as it can. Loss = acknowledged to a publisher (PUBACK) and not delivered
    once nothing more came for ``drain_idle`` s. Peak broker RSS sampled."""
    common = {"host": broker.host, "port": broker.port, "level": level, "payload_size": payload_size,
              "window": window, "coalesce": float(os.environ.get("BENCH_COALESCE", COALESCE))}
    sub = Workers(fgen.tagged_worker, [{**common, "kind": "sub", "subs": [("fl-sub", "bench/fanin/+")]}])
    pub = None
    try:
        sub.gather(("ready",), 60)
        pub = Workers(fgen.tagged_worker, [{**common, "kind": "pub", "duration": duration, "pubs": [
            (f"fl-pub{i:02d}", f"bench/fanin/{i:02d}", i) for i in range(publishers)]}])
        pub.gather(("ready",), 60)
        broker.rss_reset()
        cpu0 = broker.cpu_s()
        t0 = now() + 0.3
        pub.send_all(("go", t0))
        p = pub.gather(("published",), duration + 200)[0]
        sub.send_all(("drain", p["acked_n"], max(60.0, 4 * duration), drain_idle))
        d = sub.gather(("done",), max(60.0, 4 * duration) + 30)[0]
        cpu1 = broker.cpu_s()
        peak = broker.rss_peak_kb()
        _, hwm = broker.rss_kb()
    finally:
        sub.close()
        if pub is not None:
            pub.close()
    res = _loss_figures(p["acked"], d, p["sent"])
    t_last = d["t_last"] or t0
    wall = max(1e-6, t_last - t0)
    res.update({
        "value": res["loss_pct"], "delivered_rate": res["received"] / wall,
        "acked_rate": res["acked"] / max(1e-6, p["t_pub_end"] - t0),
        "unacked": p["unacked"], "refused": p["refused"], "wall_s": wall,
        "broker_peak_rss_mb": peak / 1024, "broker_hwm_mb": hwm / 1024,
        "gen_cpu_pct": 100.0 * (p["cpu"] + d["cpu"]) / wall, "broker_cpu_pct": 100.0 * (cpu1 - cpu0) / wall,
        "errors": [e for e in p["errors"] + d["errors"] if e]})
    return res


def slow_subscribers(broker, level, qos, duration, normal=4, rate=1000, payload_size=1024, window=100,
                     drip_bytes=65536, drip_interval=2.0):
    """``normal`` publishers at ``rate`` msg/s each (fixed; a message due
    while the window is full is skipped) on ``bench/slow/<i>/t``, ``normal``
    subscribers of ``bench/slow/<i>/#`` that read as fast as they can. Two
    phases of ``duration`` s on the same broker: without, then with a stuck
    ``#`` subscriber (connects, subscribes, never reads its socket) and a
    drip-reading one (``drip_bytes`` every ``drip_interval`` s). Figures:
    each normal subscriber's messages in the second window ÷ the first."""
    common = {"host": broker.host, "port": broker.port, "level": level, "qos": qos,
              "coalesce": float(os.environ.get("BENCH_COALESCE", COALESCE))}
    w = Workers(fgen.rate_worker, [
        {**common, "kind": "subs", "subs": [(f"sl-sub{i}", f"bench/slow/{i}/#") for i in range(normal)]},
        {**common, "kind": "pubs", "rate": rate, "payload_size": payload_size, "window": window,
         "pubs": [(f"sl-pub{i}", f"bench/slow/{i}/t", i) for i in range(normal)]},
    ])
    bad = None
    phases = []
    try:
        w.gather(("ready",), 60)
        cpu0 = broker.cpu_s()
        broker.rss_reset()
        for phase in ("alone", "with bad subscribers"):
            if phase != "alone":
                bad = Workers(fgen.rate_worker, [{**common, "kind": "bad", "stuck": ("sl-stuck", "#"),
                                                   "drip": ("sl-drip", "#"), "drip_bytes": drip_bytes,
                                                   "drip_interval": drip_interval}])
                bad.gather(("ready",), 60)
                time.sleep(0.5)
            t0 = now() + 0.3
            w.send_all(("go", t0, duration))
            subs, pubs = w.gather(("phase",), duration + 120)
            phases.append((subs, pubs))
        bad.send_all(("report",))
        b = bad.gather(("done",), 30)[0]
        cpu1 = broker.cpu_s()
        peak = broker.rss_peak_kb()
    finally:
        w.close()
        if bad is not None:
            bad.close()
    (s0, p0), (s1, p1) = phases
    fractions = [100.0 * b1 / b0 if b0 else 0.0 for b0, b1 in zip(s0["in_window"], s1["in_window"])]
    pub_frac = 100.0 * sum(p1["in_window"]) / max(1, sum(p0["in_window"]))
    offered = p0["offered"]
    return {
        "value": min(fractions), "sub_pct": fractions, "mean_sub_pct": sum(fractions) / len(fractions),
        "pub_pct": pub_frac, "pub_pct_of_offered": 100.0 * sum(p1["in_window"]) / offered,
        "alone_pct_of_offered": 100.0 * sum(p0["in_window"]) / offered,
        "sub_rate_alone": sum(s0["in_window"]) / duration, "sub_rate_with_bad": sum(s1["in_window"]) / duration,
        "max_gap_alone_s": max(s0["max_gap_s"]), "max_gap_s": max(s1["max_gap_s"]),
        "offered_rate": offered / duration, "skipped_with_bad": sum(p1["skipped"]),
        "stuck": b["stuck"], "drip": b["drip"], "drip_received": b["drip_received"],
        "drip_disconnect": b["drip_disconnect"],
        "broker_peak_rss_mb": peak / 1024,
        "broker_cpu_pct": 100.0 * (cpu1 - cpu0) / (2 * duration),
        "errors": [e for ph in phases for x in ph for e in x["errors"] if e],
    }


def persistent_slow_reader(broker, level, count=100000, ack_rate=500, receive_maximum=100, window=100,
                           payload_size=64, publishers=1, drain_idle=10.0):
    """A persistent subscriber (v5 session expiry 3600) of
    ``bench/slowreader/#`` announcing Receive Maximum ``receive_maximum``
    that acknowledges at most ``ack_rate`` messages/s, online throughout,
    while ``publishers`` publish ``count`` QoS 1 messages (in all) as fast as
    acknowledged. Loss = acknowledged and never delivered (the subscriber
    waits until it has all, or nothing came for ``drain_idle`` s)."""
    common = {"host": broker.host, "port": broker.port, "level": level, "payload_size": payload_size,
              "window": window}
    sub = Workers(fgen.tagged_worker, [{**common, "kind": "sub", "subs": [("sr-sub", "bench/slowreader/#")],
                                        "receive_maximum": receive_maximum, "expiry": 3600,
                                        "ack_rate": ack_rate}])
    pub = None
    try:
        sub.gather(("ready",), 60)
        pub = Workers(fgen.tagged_worker, [{**common, "kind": "pub", "count": count // publishers,
                                            "publish_timeout": 2 * count / ack_rate + 60,
                                            "pubs": [(f"sr-pub{i}", f"bench/slowreader/{i}", i)
                                                     for i in range(publishers)]}])
        pub.gather(("ready",), 60)
        broker.rss_reset()
        cpu0 = broker.cpu_s()
        t0 = now() + 0.3
        pub.send_all(("go", t0))
        p = pub.gather(("published",), 2 * count / ack_rate + 200)[0]
        drain = 1.5 * count / ack_rate + 120
        sub.send_all(("drain", p["acked_n"], drain, drain_idle))
        d = sub.gather(("done",), drain + 30)[0]
        cpu1 = broker.cpu_s()
        peak = broker.rss_peak_kb()
    finally:
        sub.close()
        if pub is not None:
            pub.close()
    res = _loss_figures(p["acked"], d, p["sent"])
    t_last = d["t_last"] or t0
    wall = max(1e-6, t_last - t0)
    res.update({
        "value": res["loss_pct"], "publish_s": p["t_acked"] - t0,
        "acked_rate": res["acked"] / max(1e-6, p["t_acked"] - t0),
        "delivered_rate": res["received"] / wall, "drain_s": wall, "acks_sent": d["acks_sent"],
        # the most PUBLISH the subscriber held unacknowledged (above receive_maximum: the broker ignored it)
        "max_unacked": d["max_unacked"],
        "unacked": p["unacked"], "refused": p["refused"], "sub_closed": d["closed"],
        "broker_peak_rss_mb": peak / 1024, "broker_cpu_pct": 100.0 * (cpu1 - cpu0) / wall,
        "errors": [e for e in p["errors"] + d["errors"] if e]})
    return res
