#!/usr/bin/env python3
"""CPU of the node's side of the Redis device store's reads in a burst:
``--loads`` reads of different clients called in one reactor turn (a
burst of resumed persistent sessions, each reading its first page), the
process's CPU per read, the least of ``--rounds`` rounds, against a Redis
server of its own.  The store is the one of the tree on ``PYTHONPATH``:

    PYTHONPATH=.:plugins python bench/redis_loads.py
    PYTHONPATH=bench/out/src-<sha>:bench/out/src-<sha>/plugins python bench/redis_loads.py

(``bench/out/src-<sha>`` is a revision ``bench/cluster.py --trees`` extracted.)
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import uuid

from twisted.internet import defer, reactor

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.redis_server import RedisServer


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _measure(url: str, loads: int, rounds: int) -> float:
    """:returns: the least CPU seconds per read over the rounds (the
        first three left out: warm-up)."""
    from tbmq_plugins.redis_store import RedisDeviceMessageStore

    store = RedisDeviceMessageStore(url, key_prefix=f"b{uuid.uuid4().hex[:6]}:",
                                    reactor=reactor)
    await store.start()
    best = None
    try:
        for r in range(rounds):
            start = _cpu()
            await defer.gatherResults([store.load(f"client-{i}", limit=100)
                                       for i in range(loads)])
            spent = _cpu() - start
            if r >= 3:
                best = spent if best is None else min(best, spent)
    finally:
        await store.stop()
    return best / loads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=30)
    options = parser.parse_args()
    import tbmq_plugins.redis_store as store_module

    server = RedisServer()
    server.start()
    out: list = []

    def run() -> None:
        d = defer.ensureDeferred(_measure(server.url, options.loads, options.rounds))
        d.addBoth(out.append).addBoth(lambda _: reactor.stop())

    try:
        reactor.callWhenRunning(run)
        reactor.run()
    finally:
        server.stop()
    if not out or not isinstance(out[0], float):
        print(f"failed: {out[0] if out else 'no result'}", file=sys.stderr)
        return 1
    print(f"{store_module.__file__}: {out[0] * 1e6:.1f} µs of CPU per read "
          f"({options.loads} in one turn)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
