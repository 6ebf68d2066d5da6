"""Throughput of the cluster's device stores (Redis, PostgreSQL): deliveries
of 1 KB added in calls of 100 (a catch-up batch) and one by one (the
persisted sink: one ``add`` per message, many clients), then read back in
pages of 100, and the deliveries added one by one are sent and
acknowledged (an ``update`` then a ``remove`` each, as a drain does).

Run from the repository root against servers of your own::

    PYTHONPATH=.:plugins python bench/device_stores.py \\
        --redis redis://127.0.0.1:6379/0 --postgres 'host=127.0.0.1 dbname=bench'

Each run uses a fresh key prefix (Redis) and empties ``device_messages``
(PostgreSQL).  Timings on a shared machine are noisy: compare ratios.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from twisted.internet import defer, task

from tbmq.model import Message, StoredDelivery

PAYLOAD = b"x" * 1024


def deliveries(first: int, n: int) -> list[StoredDelivery]:
    return [StoredDelivery(seq, Message(f"sensors/{seq % 100}/v", PAYLOAD, 1), 1)
            for seq in range(first, first + n)]


async def run_calls(calls: list, window: int) -> float:
    """Run the thunks in ``calls`` with at most ``window`` in flight.

    :returns: the seconds it took."""
    started = time.perf_counter()
    semaphore = defer.DeferredSemaphore(window)
    await defer.gatherResults([semaphore.run(call) for call in calls], consumeErrors=True)
    return time.perf_counter() - started


async def bench(store: Any, name: str, total: int) -> None:
    await store.start()
    try:
        clients = [f"bench-{i}" for i in range(50)]
        batches = [(clients[i % len(clients)], deliveries(1 + 100 * i, 100))
                   for i in range(total // 100)]
        took = await run_calls([lambda c=c, b=b: store.add(c, b) for c, b in batches], 8)
        print(f"{name:9} add, calls of 100 x 1 KB, 50 clients, 8 in flight: "
              f"{total / took:9.0f} deliveries/s")
        many = [f"single-{i}" for i in range(1000)]
        singles = [(many[i % len(many)], deliveries(10 ** 9 + i, 1)) for i in range(total)]
        took = await run_calls([lambda c=c, b=b: store.add(c, b) for c, b in singles], 200)
        print(f"{name:9} add, one 1 KB delivery a call, 1000 clients, 200 in flight: "
              f"{total / took:9.0f} deliveries/s")
        started, loaded = time.perf_counter(), 0
        for client in clients:
            after = None
            while True:
                page = await store.load(client, after_seq=after, limit=100)
                if not page:
                    break
                loaded += len(page)
                after = page[-1].seq
        took = time.perf_counter() - started
        print(f"{name:9} load, pages of 100, one client at a time: "
              f"{loaded / took:9.0f} deliveries/s")
        acks = [lambda c=c, s=s: store.update(c, s, 1, 1).addCallback(
                    lambda _, c=c, s=s: store.remove(c, [s]))
                for c, batch in singles for s in [batch[0].seq]]
        took = await run_calls(acks, 200)
        print(f"{name:9} update then remove, one delivery a call, 1000 clients, "
              f"200 in flight: {total / took:9.0f} deliveries/s")
        for client in clients + many:
            store.clear(client)
    finally:
        await store.stop()


async def main(reactor: Any, options: argparse.Namespace) -> None:
    if options.redis:
        from tbmq_plugins.redis_store import RedisDeviceMessageStore

        await bench(RedisDeviceMessageStore(
            options.redis, pool_size=4, key_prefix=f"bench:{uuid.uuid4().hex[:8]}:",
            reactor=reactor), "redis", options.total)
    if options.postgres:
        import psycopg2

        conn = psycopg2.connect(options.postgres)
        with conn, conn.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS device_messages")
        conn.close()
        from tbmq_plugins.postgres_devices import PostgresDeviceMessageStore

        await bench(PostgresDeviceMessageStore(options.postgres, 1, 4, reactor=reactor),
                    "postgres", options.total)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", help="a redis:// URL")
    parser.add_argument("--postgres", help="a libpq DSN")
    parser.add_argument("--total", type=int, default=20000, help="deliveries per scenario")
    options = parser.parse_args()
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, options)))
