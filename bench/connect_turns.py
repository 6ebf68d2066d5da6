#!/usr/bin/env python3
"""Where the CONNACK latency of a CONNECT burst goes: the accept loops of a
node of one or more trees while ``bench/connload.c`` connects ``--connects``
clean clients (100 handshakes in flight, as the connections scenario of
``bench/run.py``).

The node runs with Twisted's ``tcp.Port.doRead`` (one accept loop: accept,
read the CONNECT that waited, answer it) timed between two signals: for
each loop its wall time, the node thread's CPU time (``time.thread_time``)
and the clients it accepted.  A loop whose wall time passes its CPU time
was stopped meanwhile: the node waited for a core (the run-queue wait of
``/proc/self/task/*/schedstat`` over the burst is printed beside it) or in
the kernel.  Such a stop delays every handshake in flight at once, so the
CONNACK p99 is about the p50 plus the longest stop; the p50 itself is
about the window over the rate (Little's law: 100 in flight ÷ CONNECT/s).

    PYTHONPATH=$PWD:$PWD/plugins .venv/bin/python bench/connect_turns.py --trees worktree,main
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import time

#: this checkout, on the path of the controlling process only (the node's
#: process runs its own tree: its PYTHONPATH)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: a loop stopped this much longer (wall − CPU, seconds) than it ran counts as a stop
STOP = 0.005


def run_queue_wait() -> float:
    """:returns: seconds the threads of this process waited for a core
    since they started (``/proc/self/task/*/schedstat``, second field)."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def node(out: str, launch: str, argv: list[str]) -> None:
    """The node's process: ``launch`` (a tree's ``bench/tbmq_launch.py``)
    with the accept loops timed from SIGUSR1 to SIGUSR2, then written to
    ``out`` as JSON: ``loops`` ([wall s, CPU s, accepted] each),
    ``run_queue_wait`` (seconds)."""
    from twisted.internet import tcp

    loops: list = []
    state = {"on": False, "wait": 0.0}
    accept_loop = tcp.Port.doRead

    def timed(port) -> None:
        if not state["on"]:
            return accept_loop(port)
        wall, cpu, before = time.perf_counter(), time.thread_time(), port.sessionno
        accept_loop(port)
        loops.append((time.perf_counter() - wall, time.thread_time() - cpu,
                      port.sessionno - before))

    def on(*_) -> None:
        state["wait"] = run_queue_wait()
        state["on"] = True

    def off(*_) -> None:
        state["on"] = False
        with open(out, "w") as f:
            json.dump({"loops": loops, "run_queue_wait": run_queue_wait() - state["wait"]}, f)

    tcp.Port.doRead = timed
    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    sys.argv = [launch] + argv
    runpy.run_path(launch, run_name="__main__")


def burst(tree: str, n: int) -> dict:
    """One node of ``tree``, ``n`` clients connecting.

    :returns: connload's figures (``rate``, ``p50_ms``, ``p99_ms``) and
        the node's (``loops``, ``run_queue_wait``).
    :raises SystemExit: when the node does not start or a client got no CONNACK.
    """
    from bench.brokers import OUT, free_port, wait_node, tree_pythonpath
    from bench.connections import PER_SOURCE, connload

    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="connect-turns-", dir=OUT) as tmp:
        port, out = free_port(), os.path.join(tmp, "turns.json")
        env = {**os.environ, "PYTHONPATH": tree_pythonpath(tree),
               "TBMQ_MQTT__MAX_PERSISTENT_SESSIONS_PER_ADDRESS": "0"}
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--node", out,
             os.path.join(tree, "bench", "tbmq_launch.py"), "-n", "--pidfile=", "tbmq",
             "--listen", f"tcp:{port}:interface=127.0.0.1", "--data-dir", os.path.join(tmp, "data")],
            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_node(proc, port, tree, 120, 0.3)
            time.sleep(1)
            proc.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            clients = subprocess.Popen(
                [connload(), "127.0.0.1", str(port), str(n), "100", "4", "1", "0", "60",
                 f"turns-{os.getpid()}", str(max(1, -(-n // PER_SOURCE))), "300"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            line = clients.stdout.readline()
            proc.send_signal(signal.SIGUSR2)
            while not os.path.exists(out) and proc.poll() is None:
                time.sleep(0.1)
            time.sleep(0.2)
            clients.stdin.write("close\n")
            clients.stdin.flush()
            clients.stdout.readline()
            clients.wait(60)
            with open(out) as f:
                figures = json.load(f)
        finally:
            proc.terminate()
            proc.wait(60)
    words = dict(re.findall(r"(\w+) (\S+)", line))
    if int(words.get("connected", 0)) < n:
        raise SystemExit(f"{tree}: not every client connected: {line.strip()!r}")
    figures["rate"] = n / (float(words["t_last"]) - float(words["t_first"]))
    figures["p50_ms"] = float(words["p50_us"]) / 1000
    figures["p99_ms"] = float(words["p99_us"]) / 1000
    return figures


def row(tree: str, f: dict) -> str:
    """One Markdown row of the table :func:`main` prints."""
    loops = f["loops"]
    stops = [wall - cpu for wall, cpu, _ in loops if wall - cpu > STOP]
    accepted = sum(n for _, _, n in loops) or 1
    return (f"| {tree} | {f['rate']:,.0f} | {f['p50_ms']:.1f} | {f['p99_ms']:.1f} | "
            f"{100 / f['rate'] * 1000:.1f} | {len(loops)} | {max((n for *_, n in loops), default=0)} | "
            f"{sum(cpu for _, cpu, _ in loops) / accepted * 1e6:.0f} | "
            f"{len(stops)}; {max(stops, default=0) * 1000:.1f} | {f['run_queue_wait'] * 1000:.0f} |")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--node"]:
        node(argv[1], argv[2], argv[3:])
        return
    sys.path.insert(0, HERE)
    from bench.brokers import tbmq_source

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", default="worktree",
                        help="comma-separated: worktree, or a git revision")
    parser.add_argument("--connects", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each tree, alternating")
    args = parser.parse_args(argv)
    trees = args.trees.split(",")
    rows = [row(tree, burst(tbmq_source(tree), args.connects))
            for _ in range(args.repeat) for tree in trees]
    print("| tree | CONNECT/s | p50 ms | p99 ms | 100 ÷ rate, ms | accept loops | most accepted "
          "in one | node CPU µs / accept loop's client | loops stopped > 5 ms; longest stop, ms "
          "| node's run-queue wait, ms |\n|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
