"""CPU instructions per message of fan-in QoS 0 through a whole broker,
counted by valgrind: a figure that a shared, noisy machine does not move.

``bench/run.py`` measures rates on real sockets, and on a machine that
others share its single rounds can differ by a factor of two.  This
benchmark runs the broker of one or more source trees (``worktree``, or a
committed revision as ``bench/run.py``'s ``tbmq@REV`` does) in one process
on StringTransports and a fake clock, under ``valgrind --tool=callgrind``,
and counts the instructions that fan-in QoS 0 costs: 10 publishers → 1
subscriber on ``bench/fanin/+``, 64-byte payloads, 800 PUBLISH packets per
read, the reactor turn ended after each read (the outbound queues' flush),
garbage collection as ``twistd tbmq`` sets it (``node.gc_threshold``).

Each tree runs twice, with ``--rounds`` and with one round; the difference
of the two counts divided by the messages of the extra rounds is the cost
of a message, without the start-up (imports, config, plugins) that both
runs share.

Usage::

    PYTHONPATH=. .venv/bin/python bench/icount.py --trees worktree,5b0764d

prints one line per tree: instructions per message, and the first tree's
speed ÷ this one's (this tree's count ÷ the first's).  A run takes about a minute per tree.

:raises SystemExit: when valgrind is not installed, or a run delivers fewer
    messages than it published (the figure would not be the cost of a
    delivery).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

from bench.brokers import tbmq_source

#: the broker run that valgrind counts: ``python - ROUNDS LEVEL`` with the
#: tree on ``PYTHONPATH``; prints the number of messages delivered
CHILD = r'''
import gc, sys
from tests.helpers import Harness
from tbmq.mqtt import Connect, Publish, Subscribe, SubscriptionRequest
from tbmq.mqtt.codec import encode

rounds, level = int(sys.argv[1]), int(sys.argv[2])
PUBLISHERS, PER_READ, PAYLOAD = 10, 800, b"x" * 64
h = Harness()
gc.set_threshold(50000)


def connect(client_id):
    c = h.raw(level)
    c.protocol.dataReceived(encode(Connect(protocol_level=level, client_id=client_id), level))
    h.clock.advance(0)
    return c


sub = connect("fi-sub")
sub.protocol.dataReceived(encode(Subscribe(1, [SubscriptionRequest("bench/fanin/+", 0)]), level))
h.clock.advance(0)
sub.transport.clear()
pubs = []
for i in range(PUBLISHERS):
    topic = f"bench/fanin/{i:02d}"
    pubs.append((connect(f"fi-pub{i:02d}"),
                 encode(Publish(topic, PAYLOAD, qos=0), level) * PER_READ))
h.clock.advance(0)
size = len(encode(Publish("bench/fanin/00", PAYLOAD, qos=0), level))
delivered = 0
for _ in range(rounds):
    for pub, data in pubs:
        pub.protocol.dataReceived(data)
        h.clock.advance(0)
        delivered += len(sub.transport.value()) // size
        sub.transport.clear()
print(delivered, rounds * PUBLISHERS * PER_READ)
'''

MESSAGES_PER_ROUND = 10 * 800


def count(tree: str, rounds: int, level: int) -> int:
    """Instructions of one broker run of ``rounds`` rounds on ``tree``.

    :raises SystemExit: when the run delivered fewer messages than it
        published.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        env = {**os.environ, "PYTHONPATH": tree, "PYTHONHASHSEED": "0"}
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, "-", str(rounds), str(level)],
            input=CHILD, capture_output=True, text=True, cwd=tree, env=env)
        if run.returncode != 0:
            raise SystemExit(f"{tree}: the run failed:\n{run.stderr[-3000:]}")
        delivered, published = map(int, run.stdout.split()[-2:])
        if delivered < published:
            raise SystemExit(f"{tree}: {delivered} of {published} messages delivered")
        found = re.search(r"Collected\s*:\s*(\d+)", run.stderr)
        if found is None:
            raise SystemExit(f"{tree}: no instruction count in valgrind's output")
        return int(found.group(1))


def per_message(tree: str, rounds: int, level: int) -> float:
    """Instructions per message of fan-in QoS 0 on ``tree``: the difference
    of a run of ``rounds`` rounds and one of a single round, divided by the
    messages of the ``rounds - 1`` extra rounds."""
    return (count(tree, rounds, level) - count(tree, 1, level)) / (
        (rounds - 1) * MESSAGES_PER_ROUND)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", default="worktree",
                        help="comma-separated: worktree or git revisions (default worktree)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of 10 reads of 800 PUBLISH packets, >= 2 (default 3)")
    parser.add_argument("--protocol", type=int, default=4, choices=(3, 4, 5),
                        help="MQTT protocol level (default 4: 3.1.1)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install -y valgrind)")
    if args.rounds < 2:
        raise SystemExit("--rounds must be at least 2")
    first = None
    for name in args.trees.split(","):
        figure = per_message(tbmq_source(name), args.rounds, args.protocol)
        first = first or figure
        print(f"{name:>12}: {figure:,.0f} instructions per message; the first tree's speed "
              f"÷ this one's: {figure / first:.3f}", flush=True)


if __name__ == "__main__":
    main()
