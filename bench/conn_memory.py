#!/usr/bin/env python3
"""What an idle connection holds in memory, by the line that allocated it
(``tracemalloc``), on an in-process node (memory stores, a fake clock,
StringTransport connections: the kernel's socket buffers and Twisted's
TCP transport are not counted).

    PYTHONPATH=.:plugins python bench/conn_memory.py [--clients 2000] [--top 25]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=2000)
    ap.add_argument("--level", type=int, default=4)
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    from tests.helpers import Harness

    h = Harness()
    h.client("warm-up", level=args.level, keep_alive=60)
    gc.collect()
    tracemalloc.start(1)
    before = tracemalloc.take_snapshot()
    clients = [h.client(f"idle-{i}", level=args.level, keep_alive=60, clean_start=not args.persistent)
               for i in range(args.clients)]
    gc.collect()
    after = tracemalloc.take_snapshot()
    diff = after.compare_to(before, "lineno")
    total = sum(d.size_diff for d in diff)
    print(f"{total / args.clients:,.0f} bytes per connection ({args.clients} clients, MQTT level {args.level}, "
          f"{'persistent' if args.persistent else 'clean'} sessions)\n")
    print("| bytes per connection | allocated at |\n|---|---|")
    for d in diff[:args.top]:
        frame = d.traceback[0]
        name = frame.filename
        for mark in ("site-packages/", "/tbmq/", "/tests/"):
            if mark in name:
                name = mark.strip("/") + "/" + name.split(mark, 1)[1] if mark != "site-packages/" else name.split(mark, 1)[1]
                break
        print(f"| {d.size_diff / args.clients:,.0f} | `{name}:{frame.lineno}` |")
    del clients
    return 0


if __name__ == "__main__":
    sys.exit(main())
