#!/usr/bin/env python3
"""Instructions per clean CONNECT (valgrind's callgrind, so the machine's
load does not move the count), on the Harness broker of one or more source
trees: the difference of a run of ``--connects`` CONNECTs and one of
``--base``, divided by the extra ones.  The count includes the Harness
client's side (encoding CONNECT, decoding CONNACK), the same in every tree.

    PYTHONPATH=. .venv/bin/python bench/icount_connect.py --trees worktree,main --level 4
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.brokers import tbmq_source  # noqa: E402
from bench.icount import REACTOR_CLOCK, callgrind  # noqa: E402

#: ``python - COUNT LEVEL`` with the tree on PYTHONPATH: prints the CONNACKs
#: with reason code 0, and the CONNECTs sent
CHILD = REACTOR_CLOCK + r"""
from tests.helpers import Harness

n, level = int(sys.argv[1]), int(sys.argv[2])
h = Harness()
h.client("warm-up", level=level, keep_alive=60)
ok = 0
for i in range(n):
    c = h.client(f"conn-{i}", level=level, keep_alive=60)
    ok += c.connack is not None and c.connack.reason_code == 0
print(ok, n)
"""


def count(tree: str, n: int, level: int) -> int:
    """:returns: the instructions of one run of ``n`` CONNECTs on ``tree``.
    :raises SystemExit: when the run failed or a CONNECT was refused."""
    instructions, ok, sent = callgrind(tree, CHILD, [n, level], f"{tree}:{tree}/plugins")
    if ok < sent:
        raise SystemExit(f"{tree}: {ok} of {sent} CONNECTs accepted")
    return instructions


def connect_parser(description: str, connects: int) -> argparse.ArgumentParser:
    """The options of every CONNECT count: ``--trees``, ``--level``, ``--connects``."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", default="worktree",
                        help="comma-separated: worktree, or a git revision")
    parser.add_argument("--level", type=int, default=4, help="MQTT level: 3, 4 or 5")
    parser.add_argument("--connects", type=int, default=connects)
    return parser


def print_counts(heading: str, trees: list[str], figures: list[float]) -> None:
    """One Markdown row per tree: its count under ``heading``."""
    print(f"| tree | {heading} |\n|---|---|")
    for tree, figure in zip(trees, figures):
        print(f"| {tree} | {figure:,.0f} |")


def main(argv=None) -> None:
    parser = connect_parser(__doc__, 1100)
    parser.add_argument("--base", type=int, default=100)
    args = parser.parse_args(argv)
    trees = args.trees.split(",")
    figures = []
    for tree in trees:
        src = tbmq_source(tree)
        figures.append((count(src, args.connects, args.level) - count(src, args.base, args.level))
                       / (args.connects - args.base))
    print_counts("instructions per clean CONNECT", trees, figures)


if __name__ == "__main__":
    main()
