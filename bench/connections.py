"""The connection scenarios (issue 20): many idle clients connecting to one
node at once, as a fleet coming back after a failure.

The clients are opened by ``bench/connload.c`` (one C process on epoll,
compiled on first use into ``bench/out/``): a Python generator tops out near
9,000 CONNECT/s, below what Mosquitto accepts. Figures:

* ``value``: CONNECT/s, clients ÷ (last CONNACK − first connect());
* ``p50_ms``, ``p99_ms``: from a client's ``connect()`` to its CONNACK;
* ``kb_per_conn``: (broker RSS with the clients − RSS before) ÷ clients;
* ``idle_cpu_pct``: the broker's CPU, % of one core, over ``idle`` seconds
  starting one second after the last CONNACK, every client connected with
  keep alive 60 (the generator sends PINGREQ every 45 s).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time

from .brokers import OUT

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "connload.c")
#: clients per source address (127.0.0.1, .2, ...): the kernel's search for a
#: free ephemeral port of one address slows as they fill (19,500 clients from
#: one address: 208 µs of generator CPU per connect; from ten: 39 µs)
PER_SOURCE = 2000

#: the rows of run.py's table below the CONNECT/s: (result key, label, unit, higher is better)
EXTRA = [("p99_ms", "CONNACK p99", "ms", False),
         ("kb_per_conn", "RSS per connection", "KB", False),
         ("idle_cpu_pct", "idle CPU, all connected (keep alive 60)", "%", False)]


def connload() -> str:
    """Path of the compiled generator (``cc -O2``, once per source version).

    :raises subprocess.CalledProcessError: if it does not compile."""
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha1(f.read()).hexdigest()[:10]
    exe = os.path.join(OUT, f"connload-{digest}")
    if not os.path.exists(exe):
        os.makedirs(OUT, exist_ok=True)
        subprocess.run(["cc", "-O2", "-o", exe + ".tmp", SOURCE], check=True)
        os.replace(exe + ".tmp", exe)
    return exe


def _parse(line: str) -> dict:
    words = line.split()
    return {words[i]: words[i + 1] for i in range(0, len(words) - 1, 2)}


def connections(broker, level: int, count: int = 10000, window: int = 100, keep_alive: int = 60,
                persistent: bool = False, idle: float = 5.0, timeout: float = 300.0) -> dict:
    """``count`` idle clients connecting at once, at most ``window``
    handshakes in flight; clean sessions, or persistent ones (3.1.1: Clean
    Session 0; 5.0: Clean Start 0 and Session Expiry Interval 3600 s).

    :returns: the figures of the module docstring, ``lost`` (clients without
        a CONNACK) and ``errors``.
    """
    time.sleep(1.0)
    rss0, _ = broker.rss_kb()
    expiry = 3600 if persistent and level == 5 else 0
    prefix = f"{'p' if persistent else 'c'}{level}-{os.getpid()}"
    nsrc = max(1, -(-count // PER_SOURCE))
    cmd = [connload(), broker.host, str(broker.port), str(count), str(window), str(level),
           "0" if persistent else "1", str(expiry), str(keep_alive), prefix, str(nsrc), str(timeout)]
    cpu0 = broker.cpu_s()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        cpu1 = broker.cpu_s()
        if not first.startswith("connected"):
            raise RuntimeError(f"connload: {first!r} {p.stderr.read()[:400]}")
        r = _parse(first)
        n = int(r["connected"])
        t_first, t_last = float(r["t_first"]), float(r["t_last"])
        time.sleep(1.0)
        c0, t0 = broker.cpu_s(), time.monotonic()
        time.sleep(idle)
        c1, t1 = broker.cpu_s(), time.monotonic()
        rss1, _ = broker.rss_kb()
        p.stdin.write("close\n")
        p.stdin.flush()
        end = p.stdout.readline()
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    wall = max(1e-6, t_last - t_first)
    gen_cpu = float(r["cpu_s"])
    return {"value": n / wall, "connected": n, "expected": count, "lost": count - n,
            "loss_pct": 100.0 * (count - n) / count,
            "p50_ms": float(r["p50_us"]) / 1000, "p99_ms": float(r["p99_us"]) / 1000,
            "max_ms": float(r["max_us"]) / 1000,
            "rss_before_mb": rss0 / 1024, "rss_after_mb": rss1 / 1024,
            "kb_per_conn": (rss1 - rss0) / n if n else None,
            "idle_cpu_pct": 100.0 * (c1 - c0) / (t1 - t0),
            "alive_at_end": int(end.split()[-1]) if end.startswith("done alive") else None,
            "wall_s": wall, "gen_cpu_s": gen_cpu, "gen_cpu_pct": 100.0 * gen_cpu / wall,
            "broker_cpu_pct": 100.0 * (cpu1 - cpu0) / wall,
            "errors": [r["error"]] if r.get("error", "-") != "-" else []}
