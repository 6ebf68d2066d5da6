"""Throughput of the Kafka bus on Tansu, per driver: one process publishes
``Message`` records (100-byte payloads) to ``tbmq.msg.all`` with at most
``--window`` publishes unacknowledged, while one consumer of the same bus
(exclusive, 12 partitions) hands them to a handler that counts them.

Run from the repository root::

    PYTHONPATH=.:plugins python bench/kafka_bus.py [--driver kafka-python|confluent]
        [--count 50000] [--window 5000]

It prints the publish rate (acknowledged records per second) and the end-to-end
rate (records handled per second, from the first publish to the last record
handled).  A shared 2-core machine is noisy: compare runs made together.
"""

from __future__ import annotations

import argparse
import time

from twisted.internet import defer, task

from tbmq.config import KafkaConfig
from tbmq.model import Message
from tbmq_plugins.kafka.bus import KafkaBus
from tests.kafka import Tansu


async def run(reactor, args) -> None:
    server = Tansu()
    server.start()
    try:
        config = KafkaConfig(bootstrap_servers=server.bootstrap, driver=args.driver,
                             topic_prefix="bench.", partitions=12, linger_ms=5,
                             fetch_max_wait_ms=20, max_poll_records=5000)
        bus = KafkaBus(config, clock=reactor)
        await bus.start()
        handled = [0]
        done = defer.Deferred()

        def handler(record) -> None:
            handled[0] += 1
            if handled[0] == args.count:
                done.callback(None)

        consumer = bus.subscribe(bus.catalogue.msg_all, "bench", handler, exclusive=True)
        await consumer.caught_up
        payload = b"x" * 100
        window = defer.DeferredSemaphore(args.window)
        started = time.perf_counter()
        acked = []
        for i in range(args.count):
            await window.acquire()
            topic = f"bench/{i % 1000}"
            d = bus.publish(bus.catalogue.msg_all, topic, Message(topic, payload, 1))
            d.addBoth(lambda _: window.release())
            acked.append(d)
        await defer.gatherResults(acked)
        published = time.perf_counter() - started
        await done
        total = time.perf_counter() - started
        print(f"{args.driver}: {args.count} records, publish {args.count / published:,.0f}/s, "
              f"publish+consume {args.count / total:,.0f}/s")
        await bus.stop()
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", default="kafka-python", choices=["kafka-python", "confluent"])
    parser.add_argument("--count", type=int, default=50000)
    parser.add_argument("--window", type=int, default=5000)
    args = parser.parse_args()
    task.react(lambda reactor: defer.ensureDeferred(run(reactor, args)))


if __name__ == "__main__":
    main()
