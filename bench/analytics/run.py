"""Benchmark of the analytics report: generate N synthetic events (10
million by default), run ``tbmq-analytics report`` over them, and print the
wall time and the peak memory (resident set size of the whole process tree:
the Python driver and its JVM), sampled every 0.2 s.

Not part of the test suite.  Usage::

    python bench/analytics/run.py [--events 10000000] [--workdir /tmp/tbmq-bench]
                                  [--driver-memory 2g] [--keep]

Record the figures in bench/analytics/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import threading
import time

import psutil


def tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of ``proc`` and all its descendants."""
    total = 0
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def measure(cmd: list[str], env: dict | None = None) -> tuple[float, int, int]:
    """Run ``cmd``; :returns: ``(wall seconds, peak tree RSS bytes, exit code)``."""
    peak = 0
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env)
    ps = psutil.Process(proc.pid)
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss(ps))
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    done.set()
    sampler.join()
    return time.monotonic() - started, peak, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--workdir", default="/tmp/tbmq-analytics-bench")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--keep", action="store_true", help="keep the generated log and report")
    args = parser.parse_args()

    log_dir = os.path.join(args.workdir, "events")
    out_dir = os.path.join(args.workdir, "report")
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    cli = [sys.executable, "-m", "tbmq.analytics.cli"]

    gen_s, gen_rss, code = measure(cli + ["generate", "--output", log_dir, "--events",
                                          str(args.events), "--corrupt-rate", "0.00001"])
    if code:
        return code
    size = sum(os.path.getsize(os.path.join(log_dir, n)) for n in os.listdir(log_dir))
    rep_s, rep_rss, code = measure(cli + ["report", "--input", log_dir, "--output", out_dir,
                                          "--master", args.master,
                                          "--driver-memory", args.driver_memory])
    if code:
        return code
    mib = 1024 * 1024
    print()
    print(f"machine:  {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"{psutil.virtual_memory().total / mib / 1024:.1f} GiB RAM, Python "
          f"{platform.python_version()}")
    print(f"date:     {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"events:   {args.events:,} ({size / mib:,.0f} MiB of JSON Lines)")
    print(f"generate: {gen_s:,.1f} s wall, peak RSS {gen_rss / mib:,.0f} MiB")
    print(f"report:   {rep_s:,.1f} s wall, peak RSS {rep_rss / mib:,.0f} MiB "
          f"(driver JVM + Python, --master {args.master}, --driver-memory {args.driver_memory})")
    print(f"rate:     {args.events / rep_s:,.0f} events/s")
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    else:
        print(f"report:   {out_dir}/report.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
