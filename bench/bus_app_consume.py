"""Instructions per record of the Kafka bus's consumer reading an
APPLICATION client's topic (``tbmq.msg.app.<clientId>``: one Kafka record
per delivery), as the reader of a persistent APPLICATION session does:
each poll's ``--records`` records handed over by the consumer thread, the
session's result per record (a Deferred, fired when the client acknowledges
it) or per batch (a ``Progress``, one record finished per
acknowledgement), every record acknowledged in order, the commits queued
to the thread (a fake one: no Kafka).

Run from the repository root::

    PYTHONPATH=.:plugins python bench/bus_app_consume.py [--tree DIR ...]

Prints the instructions per record (valgrind's callgrind: a run of
``--records`` per poll less one of 10 per poll, 20 polls each).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bus_app_publish import counted  # noqa: E402

POLLS = 20


def run(records: int) -> None:
    from twisted.internet import defer

    from tbmq.cluster import completion
    from tbmq.cluster import records as r
    from tbmq.model import Message
    from tbmq_plugins.kafka.consumer import KafkaConsumer
    from tbmq_plugins.kafka.drivers import RawRecord
    from tests.unit.test_kafka_bus import FakeBus, FakeLoop

    finishers: list = []

    def handler(record):  # one Deferred per record (Outbox.deliver_app)
        d = defer.Deferred()
        finishers.append(lambda: d.callback(None))
        return d

    def batch(deliveries):  # one Progress per batch (Outbox.deliver_app_batch)
        progress = completion.Progress(len(deliveries))
        finished = progress.finished
        finishers.extend([lambda i=i: finished(i) for i in range(len(deliveries))])
        return progress

    consumer = KafkaConsumer(FakeBus(), "tbmq.msg.app.c1", "tbmq-app-c1", handler, r.DELIVERY,
                             10_000, 100_000, batch_handler=batch)
    consumer.loop = FakeLoop()
    consumer._assigned([0], {0: 0})
    value = r.DELIVERY.encode(r.Delivery("c1", Message("a/b", b"x" * 64, 1), 1))
    offset = 0
    for _ in range(POLLS):
        raws = [RawRecord(0, offset + i, b"c1", value, ()) for i in range(records)]
        offset += records
        consumer._batch(raws, [])
        for finish in finishers:
            finish()
        finishers.clear()
    assert consumer.loop.commits[-1] == (0, offset), consumer.loop.commits[-1:]


def instructions(tree: str, records: int) -> int:
    return counted(tree, __file__, ["--run", str(records)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[])
    parser.add_argument("--records", type=int, default=110, help="records per poll")
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run is not None:
        sys.path.insert(0, os.getcwd())
        run(args.run)
        return 0
    for tree in args.tree or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]:
        extra = instructions(tree, args.records) - instructions(tree, 10)
        per = extra / ((args.records - 10) * POLLS)
        print(f"{tree}: {per:,.0f} instructions per APPLICATION record read")
    return 0


if __name__ == "__main__":
    sys.exit(main())
