"""Instructions per record of the confluent driver's producer sending an
APPLICATION client's deliveries (``tbmq.msg.app.<clientId>``: one Kafka
record each, placed by librdkafka's partitioner), every thread counted
(the reactor's produce calls, librdkafka's threads, the poll thread's
delivery callbacks and the outcomes put to the ack batcher):

* ``each``: :meth:`Producer.send` per record, a delivery callback (a
  closure) and an outcome each (what ``KafkaBus.publish_many`` did before
  ``send_many``);
* ``many``: :meth:`Producer.send_many` per ``--records``, one delivery
  callback for all of them (``drivers.Reports``), one outcome.

No Kafka: the producer's brokers do not answer, its records time out
(``request_timeout_ms`` 10), so every report is a failure, the same for
both ways.

Run from the repository root::

    PYTHONPATH=.:plugins python bench/bus_app_producer.py [--records 100]

Prints the instructions per record of each way (valgrind's callgrind: a run
of 3,000 records less one of none).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bus_app_publish import counted  # noqa: E402

TOTAL = 3000


def run(total: int, way: str, records: int) -> None:
    from tbmq.config import KafkaConfig
    from tbmq_plugins.kafka import confluent

    reported: list = []

    class Acks:  # the AckBatcher as the producer sees it
        def put(self, done, error=None) -> None:
            reported.append(done)

    config = KafkaConfig(bootstrap_servers="127.0.0.1:1", request_timeout_ms=10, linger_ms=0)
    producer = confluent.Producer(config, Acks())
    keys, values = [b"bench-app"] * records, [b"x" * 120] * records
    for _ in range(total // records):
        done = object()
        if way == "each":
            for key, value in zip(keys, values):
                producer.send("tbmq.msg.app.bench-app", key, value, (), done)
        else:
            producer.send_many("tbmq.msg.app.bench-app", keys, values, done)
    producer._producer.flush(10)
    deadline = time.monotonic() + 10
    expected = total if way == "each" else total // records
    while len(reported) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    producer.close(1)
    assert len(reported) == expected, (len(reported), expected)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100, help="records per send_many")
    parser.add_argument("--run", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run is not None:
        sys.path.insert(0, os.getcwd())
        run(int(args.run[0]), args.run[1], args.records)
        return 0
    tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for way in ("each", "many"):
        extra = [str(TOTAL), way, "--records", str(args.records)]
        none = ["0", way, "--records", str(args.records)]
        per = (counted(tree, __file__, ["--run", *extra]) -
               counted(tree, __file__, ["--run", *none])) / TOTAL
        print(f"{way}: {per:,.0f} instructions per APPLICATION record")
    return 0


if __name__ == "__main__":
    sys.exit(main())
