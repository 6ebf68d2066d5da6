"""Instructions per record of the Kafka bus publishing to an APPLICATION
client's topic (``tbmq.msg.app.<clientId>``: not packed, one Kafka record
per delivery), as the router does for ``app_fanin``: ``publish_many`` of
``--records`` deliveries per reactor turn, with three consumer threads as
the bus sees them (their pacers; with ``--idle``, one of them idle, so
that a nudge wakes it), the producer a fake one (no Kafka).  With
``--messages N`` (N > 1) each record is a ``DeliveryRun`` of N messages,
as the router writes a batch's QoS 1 messages to the client on Kafka, and
the figure is per message.

Run from the repository root::

    PYTHONPATH=.:plugins python bench/bus_app_publish.py [--idle] [--tree DIR ...]

Prints the instructions per record (valgrind's callgrind: a run of
``--records`` per turn less one of 10 per turn, 20 turns each).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading

TURNS = 20


def run(records: int, idle: bool, messages: int = 1) -> None:
    from tbmq.cluster import records as r
    from tbmq.model import Message
    from tbmq_plugins.kafka.pacing import Pacer
    from tests.unit.test_kafka_bus import FakeDriver, started

    class Loop:  # a SharedLoop as the bus sees it
        dead = False

        def __init__(self, idle: bool) -> None:
            self.pacer = Pacer(0.1, 0.005, threading.Event())
            self.pacer.idle = idle

        def nudge(self) -> None:
            self.pacer.nudge()

    driver = FakeDriver()
    bus, reactor = started(driver)
    loops = bus._loops = [Loop(False), Loop(False), Loop(idle)]
    topic = bus.catalogue.app("c1")
    bus.publish(topic, "c1", r.Delivery("c1", Message("a", b"x"), 1))
    reactor.wait(lambda: len(driver.sent) == 1)  # the topic is created
    if messages > 1:  # each record a run of ``messages`` (the router's, on Kafka)
        deliveries = [r.DeliveryRun("c1", [Message("a/b", b"x" * 64, 1)] * messages, 1)
                      for _ in range(records)]
    else:
        deliveries = [r.Delivery("c1", Message("a/b", b"x" * 64, 1), 1) for _ in range(records)]
    for _ in range(TURNS):
        bus.publish_many(topic, ["c1"] * records, deliveries, lambda failure: None)
        loops[-1].pacer.idle = idle  # still idle: nothing fetched here
        reactor.advance(0)  # the turn ends
    assert len(driver.sent) == 1 + TURNS * records


def instructions(tree: str, records: int, idle: bool, messages: int = 1) -> int:
    return counted(tree, __file__, ["--run", str(records), "--messages", str(messages)]
                   + (["--idle"] if idle else []))


def counted(tree: str, script: str, args: list[str]) -> int:
    """The instructions valgrind's callgrind counts for ``python script
    *args`` run in ``tree`` (its ``plugins`` on the path too).

    :raises SystemExit: when the run fails."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONHASHSEED": "0",
               "PYTHONPATH": os.pathsep.join([tree, os.path.join(tree, "plugins")])}
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable,
             os.path.abspath(script), *args],
            capture_output=True, text=True, env=env, cwd=tree)
        found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
        if done.returncode != 0 or found is None:
            raise SystemExit(f"{tree}: the run failed:\n{done.stderr[-3000:]}")
        return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[])
    parser.add_argument("--records", type=int, default=110, help="records per turn")
    parser.add_argument("--idle", action="store_true", help="one consumer thread idle")
    parser.add_argument("--messages", type=int, default=1,
                        help="messages per record (a DeliveryRun when more than 1)")
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run is not None:
        sys.path.insert(0, os.getcwd())
        run(args.run, args.idle, args.messages)
        return 0
    n = args.messages
    for tree in args.tree or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]:
        extra = (instructions(tree, args.records, args.idle, n)
                 - instructions(tree, 10, args.idle, n))
        per = extra / ((args.records - 10) * TURNS * n)
        idle = " (one consumer thread idle)" if args.idle else ""
        unit = f"message ({n} a record)" if n > 1 else "record"
        print(f"{tree}: {per:,.0f} instructions per APPLICATION {unit}{idle}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
