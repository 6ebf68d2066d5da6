#!/usr/bin/env python3
"""Instructions per turn of a Kafka consumer thread whose poll read nothing
(valgrind's callgrind, so the machine's load does not move the count): a
shared client of 11 subscriptions (a cluster node's own client: the session
registry, subscriptions, retained messages, nodes, its downlinks, answers,
disconnects...), 12 partitions each, every one reached, no pacer; the
difference of a run of ``--turns`` turns and one of ``--turns`` / 10,
divided by the extra turns.

    PYTHONPATH=.:plugins .venv/bin/python bench/consumer_turn.py --trees worktree,main
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.brokers import tbmq_source  # noqa: E402
from bench.icount import callgrind  # noqa: E402

#: ``python - TURNS`` with the tree on PYTHONPATH: runs TURNS turns, prints
#: TURNS twice (what :func:`bench.icount.callgrind` reads)
CHILD = r"""
import sys, time
from tbmq_plugins.kafka.drivers import TopicView
from tbmq_plugins.kafka.loop import ConsumerLoop, SharedLoop


class Reactor:
    def callFromThread(self, f, *args):
        pass


class Sink:
    def _batch(self, *args):
        pass


class Client:
    fetches_in_background = False

    def poll(self, timeout, max_records, want_ends):
        return {}, {}

    def high_watermarks(self, tps):
        return {}

    def take_error(self):
        return None


turns = int(sys.argv[1])
client = Client()
shared = SharedLoop(Reactor(), lambda: client, max_records=500, name="idle")
for k in range(11):
    loop = ConsumerLoop(Reactor(), Sink(), exclusive=True, from_beginning=True, durable=True,
                        timeout=2.0, name=f"m{k}", contiguous=k >= 3,
                        compaction_lag_ms=60000 if k < 3 else None)
    view = TopicView(client, f"t{k}")
    loop._client = view
    for p in range(12):
        loop._next[p] = loop._ends[p] = 10
        loop._reached.add(p)
    loop._backlog_at = time.monotonic() + 1e9
    shared._members[loop] = view
for _ in range(turns):
    shared._turn(client)
print(turns, turns)
"""


def per_turn(tree: str, turns: int) -> float:
    """:returns: instructions per idle turn on ``tree``."""
    path = f"{tree}:{tree}/plugins"
    few = callgrind(tree, CHILD, [turns // 10], path)[0]
    many = callgrind(tree, CHILD, [turns], path)[0]
    return (many - few) / (turns - turns // 10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", default="worktree",
                    help="comma list: worktree (this checkout) and git revisions")
    ap.add_argument("--turns", type=int, default=2000)
    args = ap.parse_args()
    for tree in args.trees.split(","):
        src = tbmq_source(tree)
        print(f"{tree}: {per_turn(src, args.turns):,.0f} instructions per idle turn "
              f"of 11 subscriptions")


if __name__ == "__main__":
    main()
