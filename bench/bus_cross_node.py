"""CPU per message of the cross-node bus path alone, without Kafka: the
Kafka bus's code with a fake producer, in one process, stage by stage.

A message published on node A (``KafkaBus.publish`` to ``tbmq.msg.all``,
packed at the end of the turn, acknowledged), routed by the router of the
partition's node (the consumer of ``tbmq.msg.all``, decoding, matching, a
``DeliveryRun`` per target and batch sent with ``BusSink.send_many`` to node
B's ``tbmq.msg.downlink.basic``), read by node B's ``DownlinkReader`` (the
consumer of the downlink, decoding, a session's ``deliver`` per message
that does nothing).  Every target is on node B, so every message crosses both topics.

Run from the repository root::

    PYTHONPATH=.:plugins python bench/bus_cross_node.py [--scenario fanin|p2p] [--tree DIR]
    PYTHONPATH=.:plugins python bench/bus_cross_node.py --instructions --tree DIR [--tree DIR2]
    PYTHONPATH=.:plugins python bench/bus_cross_node.py --own ...

``fanin``: 10 publishers (topics ``bench/fanin/NN``), 20 messages each per
turn, one subscriber (``bench/fanin/+``); ``p2p``: 50 pairs, 4 messages
each per turn.  Prints µs per message per stage (process CPU time, the
turns after the first 20; the minimum of ``--repeat`` runs).  A shared
machine is noisy: compare two trees in alternate runs (``--tree``), or
count instructions (``--instructions``: valgrind's callgrind, a run of
``--rounds`` turns less one of 10 turns, per message, every stage
together; the machine's load does not move it).  ``--own``: node A's
consumer of ``tbmq.msg.all`` takes its node's records when they are
acknowledged (``KafkaConsumer.hand_own``, as the router asks) and skips
them when they are read back.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time


def run(scenario: str, rounds: int, own: bool = False, mixed: bool = False) -> dict:
    from types import SimpleNamespace

    from tbmq.broker.router import Router
    from tbmq.cluster.records import SessionInfo
    from tbmq.cluster.sinks import DownlinkReader
    from tbmq.config import KafkaConfig
    from tbmq.model import Message, SubscriptionOptions
    from tbmq_plugins.kafka import consumer as consumer_module
    from tbmq_plugins.kafka.bus import KafkaBus
    from tbmq_plugins.kafka.consumer import KafkaConsumer
    from tbmq_plugins.kafka.drivers import RawRecord

    consumer_module.SLICE = 10 ** 9  # a turn's records in one go

    class Clock:
        seconds = staticmethod(time.time)

        def callLater(self, delay, f, *args):  # the harness ends the turns itself
            return None

    class Producer:
        def __init__(self) -> None:
            self.out: list = []

        def send(self, topic, key, value, headers, done, partition=None) -> None:
            self.out.append((topic, partition, key, value, headers, done))

    class Loop:
        want_paused = False
        backlog = 0

        def commit(self, partition, offset) -> None:
            pass

    class Session:
        persistent = False
        connection = object()
        delivered = 0

        @property
        def outbox(self):  # the reader calls session.outbox.deliver
            return self

        def deliver(self, message, qos, retain, sids, cache, now, source) -> None:
            Session.delivered += 1

    clock = Clock()
    bus = KafkaBus(KafkaConfig(bootstrap_servers="unused", driver="confluent"), clock=clock)
    bus.running = True
    bus._producer = Producer()
    topics = bus.catalogue
    downlink = topics.downlink_basic("node-b")
    for topic in (topics.msg_all, downlink):
        bus._ready.add(topic)
        bus._placed[topic] = 12
    if scenario == "fanin":
        per_turn, pairs = 20, [(f"bench/fanin/{i:02d}", "fi-sub") for i in range(10)]
        filters = {"fi-sub": "bench/fanin/+"}
    else:
        per_turn, pairs = 4, [(f"bench/p2p/{i:03d}", f"pp-sub{i:03d}") for i in range(50)]
        filters = {sub: topic for topic, sub in pairs}
    infos = {sub: SessionInfo(sub, "node-b", "s", True, False, None, 0, 5, 1.0, None, 1.0)
             for sub in filters}
    router = Router(bus, topics, "node-a", clock, SimpleNamespace(), {}, infos.get)
    for sub, topic_filter in filters.items():
        router.add_subscription(sub, topic_filter, None, SubscriptionOptions(1))
    on_all = KafkaConsumer(bus, topics.msg_all, "g", router._on_message,
                           bus._codec(topics.msg_all), 10 ** 9, 10 ** 9,
                           batch_handler=router._on_messages)
    reader = DownlinkReader({sub: Session() for sub in filters}, clock)
    on_downlink = KafkaConsumer(bus, downlink, "g", reader.handle_basic, bus._codec(downlink),
                                10 ** 9, 10 ** 9, batch_handler=reader.handle_basic_batch)
    reader.basic = on_downlink
    for consumer in (on_all, on_downlink):
        consumer.loop = Loop()
        consumer._assigned(list(range(12)), {p: 0 for p in range(12)})
    if own:  # node A routes its records on acknowledgement, skips them when read back
        assert on_all.hand_own()
    messages = [Message(topic, b"x" * 64, 1, False, {}, "pub-" + topic, 1.0 + i, None)
                for i in range(per_turn) for topic, _ in pairs]
    ends: dict = {}  # (topic, partition) -> the offset of its next record

    def sent() -> list:
        """The Kafka records of the turn, acknowledged (where each landed
        given to those that ask), as a consumer reads them."""
        bus._packer.flush()
        out, bus._producer.out = bus._producer.out, []
        records = []
        for topic, partition, key, value, headers, done in out:
            if mixed and topic == msg_all:  # another node's record comes first
                offset = ends.get((topic, partition), 0)
                ends[topic, partition] = offset + 1
                records.append(RawRecord(partition, offset, key, value, headers))
            offset = ends.get((topic, partition), 0)
            ends[topic, partition] = offset + 1
            if getattr(done, "located", False):
                done.where = (partition, offset)
            records.append(RawRecord(partition, offset, key, value, headers))
        bus._acknowledged([(record[5], None) for record in out])
        return records

    def ignore(failure) -> None:
        pass

    stages = {"publish (A)": 0.0, "pack, acknowledge (A)": 0.0, "route (consumer of msg.all)": 0.0,
              "pack, acknowledge (router)": 0.0, "downlink (B)": 0.0}
    names = list(stages)
    clock_ = time.process_time
    publish, msg_all = bus.publish, topics.msg_all
    for turn in range(rounds + 20):
        t = [clock_()]
        for m in messages:
            publish(msg_all, m.topic, m, (), ignore)
        t.append(clock_())
        records = sent()
        t.append(clock_())
        on_all._batch(records, [])
        t.append(clock_())
        records = sent()
        t.append(clock_())
        on_downlink._batch(records, [])
        t.append(clock_())
        if turn >= 20:
            for i, name in enumerate(names):
                stages[name] += t[i + 1] - t[i]
    expected = (rounds + 20) * len(messages) * (2 if mixed else 1)
    assert Session.delivered == expected, ("a delivery was lost", Session.delivered, expected)
    n = rounds * len(messages)
    return {name: seconds / n * 1e6 for name, seconds in stages.items()}


#: messages per turn of each scenario
MESSAGES = {"fanin": 200, "p2p": 200}


def instructions(tree: str, scenario: str, rounds: int, own: bool = False,
                 mixed: bool = False) -> int:
    """Instructions (callgrind) of a run of ``rounds`` turns on ``tree``.

    :raises SystemExit: when the run fails or valgrind gives no count."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
             sys.executable, os.path.abspath(__file__), "--tree", tree, "--scenario", scenario,
             "--rounds", str(rounds), "--repeat", "1"] + (["--own"] if own else [])
            + (["--mixed"] if mixed else []),
            capture_output=True, text=True, env=env)
        found = re.search(r"Collected\s*:\s*(\d+)", run.stderr)
        if run.returncode != 0 or found is None:
            raise SystemExit(f"{tree}: the run failed:\n{run.stderr[-3000:]}")
        return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=["fanin", "p2p"], default="fanin")
    parser.add_argument("--tree", action="append", default=[],
                        help="the tbmq tree to import (default: this one's); with "
                             "--instructions, one or more")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--own", action="store_true",
                        help="node A's consumer of tbmq.msg.all takes its own records on "
                             "acknowledgement (KafkaConsumer.hand_own) and skips them read back")
    parser.add_argument("--mixed", action="store_true",
                        help="another node's copy of each of A's records of tbmq.msg.all comes "
                             "first in its partition (routed too: twice the deliveries); with "
                             "--own, A's records wait, held, until the fetch brings both")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per message with valgrind, for each --tree")
    args = parser.parse_args()
    if args.instructions:
        for tree in args.tree or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]:
            extra = instructions(tree, args.scenario, args.rounds, args.own, args.mixed) - (
                instructions(tree, args.scenario, 10, args.own, args.mixed))
            per = extra / ((args.rounds - 10) * MESSAGES[args.scenario] * (2 if args.mixed else 1))
            own = " (own records on acknowledgement)" if args.own else ""
            own += " (mixed with another node's)" if args.mixed else ""
            print(f"{tree}: {args.scenario}{own}: {per:,.0f} instructions per message")
        return 0
    if args.tree:
        sys.path[:0] = [args.tree[0], args.tree[0] + "/plugins"]
    best: dict = {}
    for _ in range(args.repeat):
        for name, us in run(args.scenario, args.rounds, args.own, args.mixed).items():
            best[name] = min(us, best.get(name, us))
    for name, us in best.items():
        print(f"{name:30s} {us:6.2f} µs/msg")
    print(f"{'total':30s} {sum(best.values()):6.2f} µs/msg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
