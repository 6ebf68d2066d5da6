#!/usr/bin/env python3
"""Where the latency of a message between two cluster nodes goes, stage by
stage: runs ``bench/cluster.py``'s ``latency_qos1`` (or another scenario)
with every node traced, then prints the p50 / p90 of each stage in
milliseconds, per topic family (``msg.all``, ``msg.downlink.basic``, ...).

    PYTHONPATH=.:plugins python bench/latency_stages.py                   # this tree
    PYTHONPATH=.:plugins python bench/latency_stages.py --trees worktree,cad8637 --duration 6

The nodes are not changed: a ``sitecustomize`` module put on their
``PYTHONPATH`` wraps the confluent driver as its modules are imported (as
``bench/connect_stages.py`` does), and each node writes what it saw to
``bench/out/latency-stages-*/stages.<pid>.json``.  Per record, keyed by
its topic family, partition and offset (both nodes run on this machine,
so their clocks are one):

* ``produce``: the driver handed the record to librdkafka
  (``Producer.produce``), and ``ack``: librdkafka's delivery report ran
  (in the producer's poll thread);
* ``fetched``: the consumer thread took the record from librdkafka's
  queue (``SharedClient._message``);
* ``handed``: the reactor began the batch that holds it
  (``KafkaConsumer._batch``: the ``callFromThread`` hand-off).

Stages: ``produce → ack`` (librdkafka's queue and linger, the wait behind
the request in flight, the broker's round trip, the poll thread's wait for
the GIL), ``produce → fetched`` (the above without the report, and the
fetch: on Tansu the wait until the next check of a waiting fetch),
``fetched → handed``; then ``produce → fetched`` by quarter of the run
(its time course).  A record of ``msg.all`` its own node routes is
never fetched for that (it is handed on acknowledgement).  Wall-clock
figures: on a loaded machine compare trees in the same run, and repeat.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.stage_trace import FINDER, quantiles, run_traced  # noqa: E402

#: the tracer each node imports at start (``sitecustomize``)
TRACER = r'''
import importlib.abc, importlib.util, json, os, sys, threading, time
_OUT = os.environ.get("TBMQ_LATENCY_STAGES")
_now = time.time
_seen = {"produce": {}, "ack": {}, "fetched": {}, "handed": {}}
_count = [0]


def _family(topic):
    name = topic.split("tbmq.", 1)[-1]
    for family in ("msg.downlink.basic", "msg.downlink.persisted", "msg.app",
                   "client.session.event.response"):
        if name.startswith(family):
            return family
    return name


def _dump():
    path = os.path.join(_OUT, f"stages.{os.getpid()}.json")
    for _ in range(5):
        try:
            seen = {k: [[*key, t] for key, t in list(v.items())] for k, v in _seen.items()}
            break
        except RuntimeError:  # changed meanwhile
            continue
    else:
        return
    with open(path + ".tmp", "w") as f:
        json.dump({"service_id": os.environ.get("TBMQ_NODE__SERVICE_ID"),
                   "tree": sys.path[1] if len(sys.path) > 1 else None, **seen}, f)
    os.replace(path + ".tmp", path)


def _dumper():
    while True:
        time.sleep(1.0)
        if _count[0]:
            _dump()


def _tick():
    _count[0] += 1


def _confluent(m):
    base = m._Producer

    class Producer(base):
        def produce(self, topic, *args, **kwargs):
            sent = _now()
            cb = kwargs.get("on_delivery")

            def delivered(error, message, _cb=cb):
                if error is None:
                    key = (_family(message.topic()), message.partition(), message.offset())
                    _seen["produce"][key] = sent
                    _seen["ack"][key] = _now()
                    _tick()
                if _cb is not None:
                    _cb(error, message)
            kwargs["on_delivery"] = delivered
            return base.produce(self, topic, *args, **kwargs)
    m._Producer = Producer
    original = m.SharedClient._message

    def message(self, msg, *args, **kwargs):
        if msg.error() is None:
            _seen["fetched"][(_family(msg.topic()), msg.partition(), msg.offset())] = _now()
        return original(self, msg, *args, **kwargs)
    m.SharedClient._message = message


def _consumer(m):
    original = m.KafkaConsumer._batch

    def batch(self, records, *args, **kwargs):
        now = _now()
        family = _family(self.topic)
        for r in records:
            _seen["handed"][(family, r.partition, r.offset)] = now
        _tick()
        return original(self, records, *args, **kwargs)
    m.KafkaConsumer._batch = batch


_PATCHES = {"tbmq_plugins.kafka.confluent": _confluent, "tbmq_plugins.kafka.consumer": _consumer}


'''

TRACER += FINDER + r'''
if _OUT:
    sys.meta_path.insert(0, _Finder())
    threading.Thread(target=_dumper, name="latency-stages", daemon=True).start()
'''

STAGES = (("produce → ack", "produce", "ack"), ("produce → fetched", "produce", "fetched"),
          ("ack → fetched", "ack", "fetched"), ("fetched → handed", "fetched", "handed"),
          ("produce → handed", "produce", "handed"))
FAMILIES = ("msg.all", "msg.downlink.basic")
#: Slices of the run in the time course of ``produce → fetched``.
SLICES = 4


def report(folder: str) -> None:
    """Print the stage table of each cluster start traced in ``folder``
    (its tree and its nodes' service id without the node's suffix: the
    records of two starts, ``--repeat``, share families and offsets)."""
    trees = collections.defaultdict(lambda: collections.defaultdict(dict))
    for path in sorted(glob.glob(os.path.join(folder, "stages.*.json"))):
        with open(path) as f:
            data = json.load(f)
        start = (data["service_id"] or "").rsplit("-", 1)[0]
        seen = trees[f"{data['tree']} ({start})"]
        for kind in ("produce", "ack", "fetched", "handed"):
            for family, partition, offset, t in data[kind]:
                seen[kind][(family, partition, offset)] = t
    for tree, seen in trees.items():
        print(f"\n## {tree}: ms p50 / p90 (records)\n")
        print("| stage | " + " | ".join(FAMILIES) + " |")
        print("|---|" + "---|" * len(FAMILIES))
        for title, a, b in STAGES:
            cells = []
            for family in FAMILIES:
                cells.append(quantiles([seen[b][k] - t for k, t in seen[a].items()
                                        if k[0] == family and k in seen[b]], 2))
            print(f"| {title} | " + " | ".join(cells) + " |")
        course(seen)


def course(seen: dict) -> None:
    """Print ``produce → fetched`` of each family by quarter of the run (by
    produce time): a broker whose fetch costs grow with what a partition
    holds (Tansu's memory engine) shows it growing from the first quarter
    to the last at a steady rate."""
    print(f"\nproduce → fetched by {SLICES}ths of the run, ms p50 / p90 (records):\n")
    for family in FAMILIES:
        stamps = sorted((t, seen["fetched"][k] - t) for k, t in seen["produce"].items()
                        if k[0] == family and k in seen["fetched"])
        if len(stamps) < SLICES:
            continue
        first, last = stamps[0][0], stamps[-1][0]
        width = (last - first) / SLICES or 1.0
        slices = [[] for _ in range(SLICES)]
        for t, d in stamps:
            slices[min(SLICES - 1, int((t - first) / width))].append(d)
        print(f"- {family}: " + "; ".join(quantiles(s, 2) for s in slices))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="latency_qos1")
    ap.add_argument("--trees", default="worktree")
    ap.add_argument("--report", help="only print the report of this folder of a past run")
    args, rest = ap.parse_known_args()
    if args.report:
        report(args.report)
        return
    for tree in args.trees.split(","):
        folder = run_traced(TRACER, "TBMQ_LATENCY_STAGES", "latency-stages-",
                            ["--drivers", "confluent", "--scenarios", args.scenarios,
                             "--trees", tree, "--no-mosquitto", *rest])
        report(folder)


if __name__ == "__main__":
    main()
