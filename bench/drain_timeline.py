#!/usr/bin/env python3
"""The timeline of an offline persistent DEVICE client's drain (the
``persistent`` scenario of ``bench/run.py``): where the time of a drain
goes, page by page, and how busy the reactor and the database thread were.

A ``sitecustomize.py`` (:data:`TRACER`, with :data:`bench.stage_trace.FINDER`)
wraps, in the broker only, the device store's ``load`` (read submitted;
the page decoded), its ``remove``, the SQLite runner's batches (their
start, end, operations and the CPU time of the database thread) and the
outbox's sends and acknowledgement runs, and dumps the events at exit.
The broker runs unchanged code otherwise.

    PYTHONPATH=.:plugins python bench/drain_timeline.py --brokers tbmq,tbmq@bb65c5f --repeat 2

Printed per run: the drain's wall time (first page read submitted to the
last acknowledgement handled), the reactor thread's CPU share over it, the
database thread's busy share (wall time inside a batch) and CPU share;
per page the median time from its read's submission to the start of the
batch that ran it (waiting behind other batches), the batch itself, the
reactor's decoding, and from the decoded page to the first send; the
removals' batches: count, median duration.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from bench.stage_trace import FINDER  # noqa: E402

TRACER = r'''
import atexit, importlib.abc, importlib.util, json, os, sys, threading, time
_DIR = os.environ.get("TBMQ_DRAIN_TRACE")
_EV = []
_clock = time.perf_counter
_cpu = time.thread_time

def _ev(*a):
    _EV.append((_clock(), _cpu()) + a)

def _dump():
    if _EV:
        path = os.path.join(_DIR, "trace-%d.json" % os.getpid())
        with open(path + ".tmp", "w") as f:
            json.dump(list(_EV), f)
        os.replace(path + ".tmp", path)

def _deliveries(module):
    cls = module.SQLiteDeviceMessageStore
    load, remove = cls.load, cls.remove

    def traced_load(self, client_id, after_seq=None, limit=None):
        _ev("submit", client_id, after_seq or 0, limit)
        d = load(self, client_id, after_seq, limit)
        def got(page):
            _ev("decoded", client_id, len(page))
            return page
        return d.addCallback(got)

    def traced_remove(self, client_id, seqs):
        seqs = list(seqs)
        _ev("remove", client_id, len(seqs))
        return remove(self, client_id, seqs)
    cls.load, cls.remove = traced_load, traced_remove
    for name in ("_deliveries_of_page", "run_deliveries_of", "_merged"):
        f = getattr(module, name, None)
        if f is None:
            continue
        def wrap(f=f, name=name):
            def decode(*a, **k):
                t = _clock()
                try:
                    return f(*a, **k)
                finally:
                    _EV.append((t, _cpu(), "decode", name, _clock() - t))
            return decode
        setattr(module, name, wrap())

def _runner(module):
    cls = module.SQLiteRunner
    run, done = cls._run_batch, cls._batch_done

    def traced_run(self, operations, write):
        t, c = _clock(), _cpu()
        try:
            return run(self, operations, write)
        finally:
            _EV.append((t, c, "batch", len(operations), bool(write), _clock() - t, _cpu() - c))

    def traced_done(self, outcome, waiters):
        _ev("batch_done", len(waiters), 0)
        return done(self, outcome, waiters)
    cls._run_batch, cls._batch_done = traced_run, traced_done

def _outbox(module):
    cls = module.Outbox
    send, complete = cls._send_run, cls.complete_run

    def traced_send(self, deliveries, now, conn, cache=None):
        t = _clock()
        n = send(self, deliveries, now, conn, cache)
        _EV.append((t, _cpu(), "send", n, _clock() - t))
        return n

    def traced_complete(self, packet_ids):
        _ev("acks", len(packet_ids), 0)
        return complete(self, packet_ids)
    cls._send_run, cls.complete_run = traced_send, traced_complete

_PATCHES = {"tbmq.backends.sqlite_deliveries": _deliveries,
            "tbmq.backends.sqlite_runner": _runner,
            "tbmq.broker.outbox": _outbox}
''' + FINDER + r'''
if _DIR:  # (sys.argv is not set yet: every process; only the broker imports these modules)
    sys.meta_path.insert(0, _Finder())
    atexit.register(_dump)

    def _dumper():  # (twistd's exit does not always run atexit)
        seen = 0
        while True:
            time.sleep(0.1)
            if len(_EV) != seen:
                seen = len(_EV)
                _dump()
    threading.Thread(target=_dumper, daemon=True).start()
'''


def med(values) -> float:
    return statistics.median(values) if values else float("nan")


def analyse(events: list) -> dict | None:
    """The figures of the last drain in ``events`` (a trace's list of
    ``(t, thread_cpu, kind, ...)``)."""
    # the drain: from the last read from seq 0 of the subscriber to the last ack run
    starts = [i for i, e in enumerate(events) if e[2] == "submit" and e[4] == 0
              and str(e[3]).endswith("psub")]
    if not starts:
        return None
    ev = events[starts[-1]:]
    acks = [e for e in ev if e[2] == "acks"]
    if not acks:
        return None
    t0, t1 = ev[0][0], acks[-1][0]
    ev = [e for e in ev if e[0] <= t1]
    main = [e for e in ev if e[2] != "batch"]
    main_cpu = main[-1][1] - main[0][1]
    batches = [e for e in ev if e[2] == "batch"]
    db_busy = sum(e[5] for e in batches)
    db_cpu = sum(e[6] for e in batches)
    # pages: submit -> the batch that ran it (the first batch starting after
    # it with a read) -> decoded -> first send after
    pages = []
    submits = [e for e in ev if e[2] == "submit"]
    decoded = [e for e in ev if e[2] == "decoded"]
    for s, d in zip(submits, decoded):
        runs = [b for b in batches if s[0] <= b[0] <= d[0]]
        b = runs[-1] if runs else None
        sends = [e for e in ev if e[2] == "send" and e[0] >= d[0]]
        pages.append({
            "submit": s[0] - t0, "wait": (b[0] - s[0]) if b else None,
            "batch": b[5] if b else None, "batch_write": b[4] if b else None,
            "back": d[0] - (b[0] + b[5]) if b else None,
            "to_send": (sends[0][0] - d[0]) if sends else None, "n": d[4], "limit": s[5]})
    decodes = [e for e in ev if e[2] == "decode"]
    sends = [e for e in ev if e[2] == "send"]
    removes = [e for e in ev if e[2] == "remove"]
    write_batches = [b for b in batches if b[4]]
    sends_all = [e for e in ev if e[2] == "send"]
    phases = {"first_send_ms": (sends_all[0][0] - t0) * 1e3 if sends_all else None,
              "last_send_end_ms": (sends_all[-1][0] + sends_all[-1][4] - t0) * 1e3 if sends_all else None,
              "first_ack_ms": (acks[0][0] - t0) * 1e3}
    before = [e for e in events[max(0, starts[-1] - 200):starts[-1]] if e[2] == "batch"
              and e[0] + e[5] > t0 - 0.3]
    phases["batches_before"] = [(round((b[0] - t0) * 1e3, 1), b[3], b[4], round(b[5] * 1e3, 1))
                                for b in before]
    return {
        **phases,
        "drain_s": t1 - t0, "messages": sum(e[3] for e in acks),
        "reactor_cpu_share": main_cpu / (t1 - t0), "db_busy_share": db_busy / (t1 - t0),
        "db_cpu_share": db_cpu / (t1 - t0), "pages": len(pages),
        "read_wait_ms": med([p["wait"] for p in pages if p["wait"] is not None]) * 1e3,
        "read_wait_sum_s": sum(p["wait"] for p in pages if p["wait"] is not None),
        "read_batch_ms": med([p["batch"] for p in pages if p["batch"] is not None]) * 1e3,
        "read_in_write_batch": sum(1 for p in pages if p["batch_write"]),
        "back_ms": med([p["back"] for p in pages if p["back"] is not None]) * 1e3,
        "decode_ms_per_page": sum(e[4] for e in decodes) * 1e3 / max(1, len(pages)),
        "send_ms_per_page": sum(e[4] for e in sends) * 1e3 / max(1, len(pages)),
        "send_calls": len(sends), "ack_runs": len(acks), "remove_calls": len(removes),
        "write_batches": len(write_batches),
        "write_batch_ms": med([b[5] for b in write_batches]) * 1e3,
        "write_batch_sum_s": sum(b[5] for b in write_batches),
        "page_detail": pages,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", default="tbmq")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--protocol", default="4")
    ap.add_argument("--pages", action="store_true", help="print every page")
    args = ap.parse_args()
    os.makedirs(os.path.join(REPO, "bench", "out"), exist_ok=True)
    summary = {}
    for rnd in range(args.repeat):
        for broker in args.brokers.split(","):
            folder = tempfile.mkdtemp(prefix="drain-", dir=os.path.join(REPO, "bench", "out"))
            with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
                f.write(TRACER)
            env = dict(os.environ, TBMQ_DRAIN_TRACE=folder)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), folder) if p)
            subprocess.run([sys.executable, os.path.join(HERE, "run.py"), "--scenarios", "persistent",
                            "--brokers", broker, "--protocol", args.protocol, "--repeat", "1",
                            "--quiet", "--json", os.path.join(folder, "run.json")],
                           env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
            traces = glob.glob(os.path.join(folder, "trace-*.json"))
            if not traces:  # (another broker: its rate alone)
                with open(os.path.join(folder, "run.json")) as f:
                    run = json.load(f)["results"][0]["result"]
                summary.setdefault(broker, []).append({"rate": run["value"],
                                                       "client_drain_s": run["drain_s"]})
                print(f"{broker} (round {rnd + 1}): rate {run['value']:.0f}")
            for path in traces:
                with open(path) as f:
                    figures = analyse(json.load(f))
                if figures is None:
                    continue
                detail = figures.pop("page_detail")
                with open(os.path.join(folder, "run.json")) as f:
                    run = json.load(f)["results"][0]["result"]
                figures = {"rate": run["value"], "client_drain_s": run["drain_s"],
                           "lost": run["lost"], "duplicates": run["duplicates"], **figures}
                summary.setdefault(broker, []).append(figures)
                print(f"{broker} (round {rnd + 1}): " + ", ".join(
                    f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))
                if args.pages:
                    for p in detail:
                        print("   ", {k: (round(v * 1e3, 2) if isinstance(v, float) else v)
                                      for k, v in p.items()})
    for broker, runs in summary.items():
        keys = [k for k in runs[0] if isinstance(runs[0][k], (int, float))]
        print(f"{broker} medians of {len(runs)}: " + ", ".join(
            f"{k} {med([r[k] for r in runs]):.3f}" for k in keys))


if __name__ == "__main__":
    main()
