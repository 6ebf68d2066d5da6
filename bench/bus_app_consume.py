"""Instructions per record of the Kafka bus's consumer reading an
APPLICATION client's topic (``tbmq.msg.app.<clientId>``: one Kafka record
per delivery), as the reader of a persistent APPLICATION session does:
each poll's ``--records`` records handed over by the consumer thread, the
session's result per record (a Deferred, fired when the client acknowledges
it) or per batch (a ``Progress``, one record finished per
acknowledgement), every record acknowledged in order, the commits queued
to the thread (a fake one: no Kafka).  With ``--messages N`` (N > 1) each
record is a ``DeliveryRun`` of N messages (the router's on Kafka), each
message acknowledged (``Progress.parts``), and the figure is per message.

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


def run(records: int, messages: int = 1) -> None:
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
        for i, d in enumerate(deliveries):
            if type(d) is r.DeliveryRun:
                progress.parts(i, len(d.messages))
                finishers.extend([lambda i=i: finished(i)] * len(d.messages))
            else:
                finishers.append(lambda i=i: finished(i))
        return progress

    codec = r.APPLICATION if messages > 1 else r.DELIVERY  # (a tree before runs has no union)
    consumer = KafkaConsumer(FakeBus(), "tbmq.msg.app.c1", "tbmq-app-c1", handler, codec,
                             10_000, 100_000, batch_handler=batch)
    consumer.loop = FakeLoop()
    consumer._assigned([0], {0: 0})
    if messages > 1:  # each record a run of ``messages`` (the router's, on Kafka)
        value = r.APPLICATION.encode(
            r.DeliveryRun("c1", [Message("a/b", b"x" * 64, 1)] * messages, 1))
    else:
        value = r.DELIVERY.encode(r.Delivery("c1", Message("a/b", b"x" * 64, 1), 1))
    offset = 0
    for _ in range(POLLS):
        raws = [RawRecord(0, offset + i, b"c1", value, ()) for i in range(records)]
        offset += records
        consumer._batch(raws, [])
        for _ in range(records * messages // 256 + 1):  # the turns a slice of 256 messages takes
            consumer.bus.clock.advance(0)
        for finish in finishers:
            finish()
        finishers.clear()
    assert consumer.loop.commits[-1] == (0, offset), consumer.loop.commits[-1:]


def instructions(tree: str, records: int, messages: int = 1) -> int:
    return counted(tree, __file__, ["--run", str(records), "--messages", str(messages)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[])
    parser.add_argument("--records", type=int, default=110, help="records per poll")
    parser.add_argument("--messages", type=int, default=1,
                        help="messages per record (a DeliveryRun when more than 1)")
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run is not None:
        sys.path.insert(0, os.getcwd())
        run(args.run, args.messages)
        return 0
    n = args.messages
    for tree in args.tree or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]:
        extra = instructions(tree, args.records, n) - instructions(tree, 10, n)
        per = extra / ((args.records - 10) * POLLS * n)
        unit = f"message read ({n} a record)" if n > 1 else "record read"
        print(f"{tree}: {per:,.0f} instructions per APPLICATION {unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
