#!/usr/bin/env python3
"""When Tansu answers a waiting fetch, and what a hop costs at a given
``fetch.wait.max.ms`` (confluent-kafka, one Tansu of its own).

    PYTHONPATH=.:plugins python bench/tansu_fetch.py probe --wait 100
    PYTHONPATH=.:plugins python bench/tansu_fetch.py flow --wait 5,3,2 --repeat 3

* ``probe``: one record produced ``--after`` ms (several values) after the
  consumer's previous record came, that is after its next fetch went out;
  prints when the record came.  Tansu 0.6.0 looks for records when the
  fetch arrives, then after half the wait, three quarters, seven eighths
  (...), and answers at the first look that finds some or when the wait
  ends: with a 100 ms wait, a record produced 5 ms in comes about 50 ms
  in, one produced 60 ms in about 75 ms in.
* ``flow``: 500 records/s to one partition (producer ``linger.ms`` 1, as
  tbmq's), produce → consume p50 / p90 / p99 in ms, and Tansu's CPU
  seconds, per fetch wait.

Wall-clock figures: on a loaded machine compare values of one run, and repeat.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.brokers import free_port  # noqa: E402
from bench.cluster import tansu_binary, wait_port  # noqa: E402


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list, p: float) -> float:
    return sorted(values)[min(len(values) - 1, int(p * len(values)))]


def _clients(servers: str, wait_ms: int, topic: str):
    from confluent_kafka import Consumer, Producer, TopicPartition
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 1, "acks": "all",
                         "socket.nagle.disable": True})
    producer.produce(topic, b"first", partition=0)
    producer.flush(10)
    consumer = Consumer({"bootstrap.servers": servers, "group.id": topic,
                         "fetch.wait.max.ms": wait_ms, "fetch.min.bytes": 1,
                         "enable.auto.commit": False, "socket.nagle.disable": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
    while consumer.poll(1) is None:
        pass
    return producer, consumer


def _next(consumer) -> bytes:
    while True:
        m = consumer.poll(1)
        if m is not None and m.error() is None:
            return m.value()


def probe(servers: str, wait_ms: int, afters: list, count: int) -> None:
    producer, consumer = _clients(servers, wait_ms, f"probe{wait_ms}")
    for after in afters:
        came = []
        for _ in range(count):
            time.sleep(after / 1000)
            sent = time.monotonic()
            producer.produce(f"probe{wait_ms}", b"x", partition=0)
            producer.poll(0)
            _next(consumer)
            came.append((time.monotonic() - sent) * 1e3)
        print(f"wait {wait_ms} ms, produced {after} ms after the fetch went: came "
              f"{_pct(came, 0.5):.1f} ms later (p50 of {count}; that is {after + _pct(came, 0.5):.0f} "
              f"ms into the fetch)", flush=True)
    consumer.close()


def flow(servers: str, wait_ms: int, records: int, tansu_pid: int, run: int) -> None:
    topic = f"flow{wait_ms}-{run}"
    producer, consumer = _clients(servers, wait_ms, topic)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            producer.poll(0.05)

    def publish() -> None:
        t0 = time.monotonic()
        for i in range(records):
            delay = t0 + i / 500 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            producer.produce(topic, repr(time.monotonic()).encode(), partition=0)
    threads = [threading.Thread(target=serve), threading.Thread(target=publish)]
    cpu = _cpu_s(tansu_pid)
    for t in threads:
        t.start()
    lat = [(time.monotonic() - float(_next(consumer))) * 1e3 for _ in range(records)]
    cpu = _cpu_s(tansu_pid) - cpu
    stop.set()
    for t in threads:
        t.join()
    consumer.close()
    print(f"wait {wait_ms} ms: produce → consume p50 {_pct(lat, 0.5):.1f} p90 {_pct(lat, 0.9):.1f} "
          f"p99 {_pct(lat, 0.99):.1f} ms; Tansu {cpu:.2f} CPU s for {records} records", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("probe", "flow"))
    ap.add_argument("--wait", default="100", help="fetch.wait.max.ms values, comma-separated")
    ap.add_argument("--after", default="5,30,60,90", help="probe: ms after the fetch went")
    ap.add_argument("--count", type=int, default=10, help="probe: records per --after")
    ap.add_argument("--records", type=int, default=2000, help="flow: records per run")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    port = free_port()
    tansu = subprocess.Popen([tansu_binary(), "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
                              "--advertised-listener-url", f"tcp://127.0.0.1:{port}",
                              "--storage-engine", "memory://tansu/"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        servers = f"127.0.0.1:{port}"
        for run in range(args.repeat):
            for wait_ms in (int(w) for w in args.wait.split(",")):
                if args.mode == "probe":
                    probe(servers, wait_ms, [int(a) for a in args.after.split(",")], args.count)
                else:
                    flow(servers, wait_ms, args.records, tansu.pid, run)
    finally:
        tansu.terminate()
        tansu.wait(10)


if __name__ == "__main__":
    main()
