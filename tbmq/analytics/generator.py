"""A synthetic traffic generator: realistic event logs of exactly N records
(schema v1) for tests and benchmarks.

The model, per shard (one output file, one process): devices (in sites of a hundred) connected to
one of the nodes publish telemetry (``site-<n>/<id>/telemetry``, QoS 0 or
1) that every application receives (a few deliveries are dropped as
``slow_consumer``), and attributes (``site-<n>/<id>/attributes``, QoS 1,
some retained) that the first application receives; applications send RPC
requests (``site-<n>/<id>/rpc/request``) that the device receives or
that are dropped (``queue_full``).  Devices disconnect and reconnect (normal,
lost connections, keep-alive timeouts, session take-overs); one device in a
hundred flaps, reconnecting many times within minutes.  Authentication
fails now and then from random addresses, and often from two attacking
addresses.  The rate follows a daily curve, so throughput has peaks.
Latencies are log-normal, slower on some nodes and for QoS 1.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import math
import multiprocessing
import os
import random
from dataclasses import dataclass

from tbmq.mqtt import ReasonCode

__all__ = ["GeneratorParams", "generate", "generate_shard"]


@dataclass(frozen=True)
class GeneratorParams:
    """What to generate.

    :ivar events: total records, >= 1.
    :ivar seed: the random seed (same seed, same logs).
    :ivar devices: number of devices; None: one per 1,000 events, >= 20.
    :ivar applications: number of applications (telemetry subscribers), >= 1.
    :ivar nodes: broker nodes, >= 1.
    :ivar hours: time span of the log, hours (approximately).
    :ivar start: the first event's time, ISO 8601 (UTC).
    :ivar corrupt_rate: fraction of lines written truncated, 0..1.
    """

    events: int
    seed: int = 1
    devices: int | None = None
    applications: int = 4
    nodes: int = 2
    hours: float = 24.0
    start: str = "2024-01-01T00:00:00"
    corrupt_rate: float = 0.0

    def device_count(self) -> int:
        return self.devices if self.devices else max(20, self.events // 1000)


#: (DISCONNECT reason code, ``int``, or None for a connection lost, weight)
_REASONS = ((int(ReasonCode.NORMAL_DISCONNECTION), 0.5), (None, 0.3),
            (int(ReasonCode.KEEP_ALIVE_TIMEOUT), 0.15), (int(ReasonCode.SESSION_TAKEN_OVER), 0.05))
#: the CONNACK reason code of an ``auth_fail`` record
_AUTH_FAIL_CODE = int(ReasonCode.BAD_USER_NAME_OR_PASSWORD)
_ATTACKERS = ("203.0.113.66", "198.51.100.23")


class _Shard:
    """One shard's simulation; :meth:`run` writes its records to ``out``."""

    def __init__(self, params: GeneratorParams, shard: int, shards: int, events: int) -> None:
        self.p = params
        self.shard = shard
        self.rng = random.Random(params.seed * 1000003 + shard)
        self.limit = events
        self.written = 0
        self.counter = 0
        start = _dt.datetime.fromisoformat(params.start.replace("Z", "+00:00"))
        if start.tzinfo is None:
            start = start.replace(tzinfo=_dt.UTC)
        self.t0 = start.timestamp() * 1000.0
        self.now = self.t0
        self.span = params.hours * 3600000.0
        self.nodes = [f"node-{i + 1}" for i in range(max(1, params.nodes))]
        self.devices = [f"dev-{i:06d}" for i in range(shard, params.device_count(), shards)] or [
            f"dev-s{shard}"]
        self.apps = [f"app-{i}" for i in range(max(1, params.applications))]
        self.node_of = {d: self.nodes[self.rng.randrange(len(self.nodes))] for d in self.devices}
        sites = max(1, params.device_count() // 100)
        self.site = {d: f"site-{int(d[4:]) % sites:03d}" if d[4:].isdigit() else "site-000"
                     for d in self.devices}
        self.connected_at: dict[str, float] = {}
        self.flappers = set(self.rng.sample(self.devices, max(1, len(self.devices) // 100)))
        # mean records per action ~ 0.8 * (1 + apps) (telemetry dominates)
        actions = events / (0.8 * (1 + len(self.apps)) + 0.3)
        self.step = self.span / max(1.0, actions)

    # -- output ------------------------------------------------------------------

    def emit(self, line: str) -> bool:
        if self.written >= self.limit:
            return False
        if self.p.corrupt_rate and self.rng.random() < self.p.corrupt_rate:
            line = line[: max(1, len(line) // 2)]
        self.out.write(line + "\n")
        self.written += 1
        return True

    def head(self, kind: str, ts: float, node: str) -> str:
        return f'{{"v":1,"type":"{kind}","ts":{int(ts)},"node":"{node}"'

    # -- events ------------------------------------------------------------------

    def connect(self, client: str, ctype: str, node: str, persistent: bool, ts: float) -> None:
        self.connected_at[client] = ts
        addr = f"10.{self.rng.randrange(256)}.{self.rng.randrange(256)}.{self.rng.randrange(1, 255)}"
        self.emit(self.head("connect", ts, node) +
                  f',"client_id":"{client}","client_type":"{ctype}","protocol_version":'
                  f'{5 if self.rng.random() < 0.6 else 4},"address":"{addr}","port":'
                  f'{self.rng.randrange(1024, 65535)},"clean_start":{"false" if persistent else "true"},'
                  f'"session_expiry":{3600 if persistent else 0},"persistent":'
                  f'{"true" if persistent else "false"}}}')

    def subscribe(self, client: str, ctype: str, node: str, topic_filter: str, qos: int,
                  ts: float) -> None:
        self.emit(self.head("subscribe", ts, node) +
                  f',"client_id":"{client}","client_type":"{ctype}","topic_filter":"{topic_filter}",'
                  f'"qos":{qos},"reason_code":{qos}}}')

    def disconnect(self, client: str, ctype: str, node: str, ts: float) -> None:
        r = self.rng.random()
        reason = None
        for code, weight in _REASONS:
            if r < weight:
                reason = code
                break
            r -= weight
        duration = int(ts - self.connected_at.pop(client, ts))
        code = "" if reason is None else f',"reason_code":{reason}'
        self.emit(self.head("disconnect", ts, node) +
                  f',"client_id":"{client}","client_type":"{ctype}"{code},'
                  f'"duration_ms":{duration},"will":{"true" if reason is None else "false"}}}')

    def msg_id(self) -> str:
        self.counter += 1
        return f"{self.shard:02x}{self.counter:014x}"

    def publish(self, client: str, ctype: str, node: str, topic: str, qos: int, retain: bool,
                size: int, ts: float) -> str:
        mid = self.msg_id()
        self.emit(self.head("publish", ts, node) +
                  f',"client_id":"{client}","client_type":"{ctype}","msg_id":"{mid}",'
                  f'"topic":"{topic}","qos":{qos},"retain":{"true" if retain else "false"},'
                  f'"bytes":{size},"will":false}}')
        return mid

    def latency(self, node: str, qos: int) -> float:
        factor = 1.0 + 0.6 * self.nodes.index(node)
        ms = self.rng.lognormvariate(0.7, 0.6) * factor
        if qos:
            ms += self.rng.lognormvariate(1.2, 0.5)
        return round(ms, 3)

    def deliver(self, client: str, ctype: str, node: str, mid: str, topic: str, qos: int,
                retain: bool, size: int, publisher: str, ts: float) -> None:
        lat = self.latency(node, qos)
        self.emit(self.head("deliver", ts + lat, node) +
                  f',"client_id":"{client}","client_type":"{ctype}","msg_id":"{mid}",'
                  f'"topic":"{topic}","qos":{qos},"bytes":{size},"retain":'
                  f'{"true" if retain else "false"},"publisher":"{publisher}","latency_ms":{lat}}}')

    def drop(self, client: str, ctype: str, node: str, reason: str, mid: str, topic: str,
             qos: int, size: int, publisher: str, ts: float) -> None:
        self.emit(self.head("drop", ts, node) +
                  f',"client_id":"{client}","client_type":"{ctype}","reason":"{reason}",'
                  f'"msg_id":"{mid}","topic":"{topic}","qos":{qos},"bytes":{size},'
                  f'"publisher":"{publisher}"}}')

    def auth_fail(self, ts: float) -> None:
        rng = self.rng
        if rng.random() < 0.7:
            addr = _ATTACKERS[rng.randrange(2)]
            client = rng.choice(("admin", "root", "test", f"dev-{rng.randrange(10**6):06d}"))
        else:
            addr = f"192.0.2.{rng.randrange(1, 255)}"
            client = rng.choice(self.devices)
        self.emit(self.head("auth_fail", ts, rng.choice(self.nodes)) +
                  f',"client_id":"{client}","username":"{client}","address":"{addr}",'
                  f'"port":{rng.randrange(1024, 65535)},"reason_code":{_AUTH_FAIL_CODE}}}')

    # -- the simulation ----------------------------------------------------------

    def advance(self) -> float:
        phase = 2 * math.pi * ((self.now - self.t0) / 86400000.0)
        rate = 1.0 + 0.6 * math.sin(phase - math.pi / 2)  # quiet at midnight, busy at noon
        # actions come denser when the rate is high: on average this spans ``hours``
        self.now += self.rng.expovariate(1.0) * self.step / max(0.2, rate)
        return self.now

    def run(self, out) -> None:
        self.out = out
        rng = self.rng
        app_node = {a: self.nodes[i % len(self.nodes)] for i, a in enumerate(self.apps)}
        if self.shard == 0:
            for i, app in enumerate(self.apps):
                self.connect(app, "APPLICATION", app_node[app], True, self.now)
                self.subscribe(app, "APPLICATION", app_node[app], "+/+/telemetry",
                               1 if i == 0 else 0, self.now)
                if i == 0:
                    self.subscribe(app, "APPLICATION", app_node[app], "+/+/attributes",
                                   1, self.now)
        for dev in self.devices:
            if rng.random() < 0.9:
                ts = self.advance() if self.shard else self.now
                self.connect(dev, "DEVICE", self.node_of[dev], False, ts)
                self.subscribe(dev, "DEVICE", self.node_of[dev], f"{self.site[dev]}/{dev}/rpc/request",
                               1, ts)
        devices = self.devices
        while self.written < self.limit:
            ts = self.advance()
            r = rng.random()
            dev = devices[rng.randrange(len(devices))]
            node = self.node_of[dev]
            if dev not in self.connected_at:
                self.connect(dev, "DEVICE", node, False, ts)
                self.subscribe(dev, "DEVICE", node, f"{self.site[dev]}/{dev}/rpc/request", 1, ts)
            elif r < 0.80:
                topic = f"{self.site[dev]}/{dev}/telemetry"
                qos = 1 if rng.random() < 0.3 else 0
                size = rng.randrange(40, 400)
                mid = self.publish(dev, "DEVICE", node, topic, qos, False, size, ts)
                for i, app in enumerate(self.apps):
                    aq = min(qos, 1 if i == 0 else 0)
                    if rng.random() < 0.004:
                        self.drop(app, "APPLICATION", app_node[app], "slow_consumer", mid, topic,
                                  aq, size, dev, ts)
                    else:
                        self.deliver(app, "APPLICATION", app_node[app], mid, topic, aq, False,
                                     size, dev, ts)
            elif r < 0.88:
                topic = f"{self.site[dev]}/{dev}/attributes"
                retain = rng.random() < 0.2
                size = rng.randrange(60, 200)
                mid = self.publish(dev, "DEVICE", node, topic, 1, retain, size, ts)
                self.deliver(self.apps[0], "APPLICATION", app_node[self.apps[0]], mid, topic, 1,
                             retain, size, dev, ts)
            elif r < 0.93:
                app = self.apps[rng.randrange(len(self.apps))]
                topic = f"{self.site[dev]}/{dev}/rpc/request"
                size = rng.randrange(30, 120)
                mid = self.publish(app, "APPLICATION", app_node[app], topic, 1, False, size, ts)
                if rng.random() < 0.03:
                    self.drop(dev, "DEVICE", node, "queue_full", mid, topic, 1, size, app, ts)
                else:
                    self.deliver(dev, "DEVICE", node, mid, topic, 1, False, size, app, ts)
            elif r < 0.985:
                self.disconnect(dev, "DEVICE", node, ts)
                if dev in self.flappers:
                    t = ts
                    for _ in range(rng.randrange(6, 13)):
                        t += rng.uniform(2000, 30000)
                        self.connect(dev, "DEVICE", node, False, t)
                        t += rng.uniform(500, 5000)
                        self.disconnect(dev, "DEVICE", node, t)
            else:
                self.auth_fail(ts)


def generate_shard(path: str, params: GeneratorParams, shard: int, shards: int,
                   events: int, compress: bool = False) -> str:
    """Write one shard of ``events`` records to ``path``.

    :returns: ``path``.
    """
    opener = (lambda p: gzip.open(p, "wt", encoding="utf-8", compresslevel=1)) if compress else (
        lambda p: open(p, "w", encoding="utf-8", buffering=1 << 20))
    with opener(path) as out:
        _Shard(params, shard, shards, events).run(out)
    return path


def _run(args) -> str:
    return generate_shard(*args)


def generate(directory: str, params: GeneratorParams, files: int | None = None,
             workers: int | None = None, compress: bool = False) -> list[str]:
    """Write ``params.events`` records in ``files`` JSON Lines files.

    :param directory: the output directory (created).
    :param params: see :class:`GeneratorParams`.
    :param files: number of files (shards); default ``workers``.
    :param workers: processes; default the CPU count.
    :param compress: write ``.jsonl.gz``.
    :returns: the paths written.
    """
    if params.events < 1:
        raise ValueError("events must be >= 1")
    workers = workers or os.cpu_count() or 1
    files = max(1, min(files or workers, params.events))
    os.makedirs(directory, exist_ok=True)
    base, extra = divmod(params.events, files)
    ext = ".jsonl.gz" if compress else ".jsonl"
    jobs = [(os.path.join(directory, f"events-gen-{i:03d}{ext}"), params, i, files,
             base + (1 if i < extra else 0), compress) for i in range(files)]
    if workers == 1 or files == 1:
        return [_run(job) for job in jobs]
    with multiprocessing.get_context("spawn").Pool(min(workers, files)) as pool:
        return pool.map(_run, jobs)
