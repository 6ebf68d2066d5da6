#!/usr/bin/env python3
"""Instructions per message of ``bench/run.py``'s persistent scenario on the
embedded node (SQLite device store, synchronous FULL), counted by valgrind's
callgrind so that the machine's load does not move the figure.

A persistent DEVICE subscriber (clean session 0, QoS 1, one filter) goes
offline; one publisher sends QoS 1 messages of 64 bytes, 1,000 PUBLISH
packets per read, and waits for their PUBACKs (released when the device
store's transaction commits) before the next read: the ``queue`` phase.  The
``drain`` phase then reconnects the subscriber and acknowledges every
PUBLISH it gets, until all are drained and the deletes committed.  Both
threads (the reactor's and the database's) are counted.

The figure of a phase is the difference of a run of ``--rounds`` rounds
(10,000 messages each) and one of one round, divided by the extra
messages; the drain's figure is that of the whole run less the queue's.
With ``--client-type application`` the subscriber is a persistent
APPLICATION client (its messages in its own topic log,
``tbmq.msg.app.<clientId>``); ``--callgrind-dir`` keeps each run's
callgrind output for ``callgrind_annotate``.
The wait for the database thread polls every 2 ms: a few hundred
instructions per read of 1,000 messages.  The publisher's reads are
encoded once, before the rounds (the client's encoding is not the
broker's cost: about 12,000 instructions per message when each round
encoded its own).

    PYTHONPATH=. .venv/bin/python bench/icount_persistent.py --trees worktree,main --protocol 4

:raises SystemExit: when valgrind is missing, or a run acknowledged or
    delivered fewer messages than it sent.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.brokers import tbmq_source, tree_pythonpath
from bench.icount import REACTOR_CLOCK, callgrind

#: messages of one round
PER_ROUND = 10000

#: ``python - PHASE ROUNDS LEVEL`` (PHASE ``queue`` or ``drain``) with the
#: tree on PYTHONPATH: prints the messages acknowledged (queue) or delivered
#: (drain), and those sent
CHILD = REACTOR_CLOCK + r"""
import time, tempfile
from tests.helpers import Harness
from tbmq.mqtt import Connect, Publish, Subscribe, SubscriptionRequest
from tbmq.mqtt.codec import encode

phase, rounds, level, client_type = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
PER_READ = 1000
PAYLOAD = b"x" * 64
tmp = tempfile.mkdtemp()
replace = {}
if client_type == "application":
    # the subscriber authenticated as a persistent APPLICATION client: its
    # messages go to its own topic log (tbmq.msg.app.<clientId>)
    from tbmq.auth import AuthResult
    from tbmq.hookspecs import hookimpl
    from tbmq.model import ClientType

    class Applications:
        @hookimpl(tryfirst=True)
        def tbmq_authenticate(self, request):
            if request.client_id == "ps-sub":
                return AuthResult(True, client_type=ClientType.APPLICATION, provider="bench",
                                  credentials_name="applications")
            return None

    replace["bench-applications"] = Applications()
h = Harness({"storage": {"backend": "sqlite"}, "data_dir": tmp,
             "auth": {"credentials": "memory"}}, replace=replace)
gc.set_threshold(50000)


def settle(until):
    # run reactor turns (the database thread's results come through
    # callFromThread) until until() holds
    for _ in range(100000):
        reactor.runUntilCurrent()
        if until():
            return
        time.sleep(0.002)
    print("no progress", flush=True); import os; os._exit(1)


settle(lambda: h.started.called)


def connect(client_id, clean):
    c = h.raw(level)
    c.protocol.dataReceived(encode(Connect(protocol_level=level, client_id=client_id,
                                           keep_alive=300, clean_start=clean), level))
    settle(lambda: c.transport.value())
    c.transport.clear()
    return c


sub = connect("ps-sub", False)
sub.protocol.dataReceived(encode(Subscribe(1, [SubscriptionRequest("bench/persist/t", 1)]), level))
settle(lambda: sub.transport.value())
sub.transport.clear()
sub.protocol.connectionLost(None)
settle(lambda: True)
pub = connect("ps-pub", True)
topic = "bench/persist/t"
# one round's reads, encoded once and sent every round (their packet ids
# are free again once the round's PUBACKs came): the publisher's encoding
# is not counted per message
datas = [b"".join(encode(Publish(topic, PAYLOAD, qos=1, packet_id=n + 1), level)
                  for n in range(r * PER_READ, (r + 1) * PER_READ)) for r in range(10)]
total = rounds * 10 * PER_READ
acked = 0
for data in datas * rounds:
    pub.protocol.dataReceived(data)
    reactor.runUntilCurrent()
    # the PUBACKs come once the batch is committed
    got = len(pub.transport.value()) // 4
    while got < PER_READ:
        time.sleep(0.002)
        reactor.runUntilCurrent()
        got = len(pub.transport.value()) // 4
    pub.transport.clear()
    acked += got
if phase == "queue":
    print(acked, total, flush=True)
    import os; os._exit(0)
# the drain: the subscriber comes back and acknowledges what it gets
size = len(encode(Publish(topic, PAYLOAD, qos=1, packet_id=1), level))
pid_at = 4 + len(topic)
sub = h.raw(level)
sub.protocol.dataReceived(encode(Connect(protocol_level=level, client_id="ps-sub",
                                         keep_alive=300, clean_start=False), level))
delivered = 0
skip = 4  # the CONNACK
idle = 0
while delivered < total and idle < 20000:
    reactor.runUntilCurrent()
    data = sub.transport.value()[skip:]
    sub.transport.clear()
    skip = 0
    if not data:
        idle += 1
        time.sleep(0.002)
        continue
    idle = 0
    got = len(data) // size
    sub.protocol.dataReceived(b"".join(b"\x40\x02" + data[o:o + 2]
                                       for o in range(pid_at, len(data), size)))
    delivered += got
# the last PUBACKs' deletes committed
settle(lambda: True)
print(delivered, total, flush=True)
import os; os._exit(0)
"""


def count(tree: str, phase: str, rounds: int, level: int, client_type: str = "device",
          keep: str | None = None) -> int:
    """Instructions of one run of ``phase`` (``queue``, or ``drain``: the
    queueing then the drain) of ``rounds`` rounds on ``tree``, the
    subscriber of ``client_type`` (``device`` or ``application``); ``keep``:
    a directory the callgrind output is copied to, when given.

    :raises SystemExit: when fewer messages were acknowledged or delivered
        than sent."""
    out = None if keep is None else os.path.join(
        keep, f"callgrind.{os.path.basename(tree.rstrip('/'))}.{client_type}.{phase}.{rounds}.{level}")
    instructions, done, expected = callgrind(tree, CHILD, [phase, rounds, level, client_type],
                                             tree_pythonpath(tree), keep=out)
    if done < expected:
        raise SystemExit(f"{tree} {phase}: {done} of {expected} messages")
    return instructions


def per_message(tree: str, rounds: int, level: int, client_type: str = "device",
                keep: str | None = None) -> tuple[float, float]:
    """:returns: instructions per queued message and per drained message."""
    extra = (rounds - 1) * PER_ROUND

    def run(phase, n):
        return count(tree, phase, n, level, client_type, keep)

    queued = (run("queue", rounds) - run("queue", 1)) / extra
    both = (run("drain", rounds) - run("drain", 1)) / extra
    return queued, both - queued


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", default="worktree",
                        help="comma-separated: worktree or git revisions (default worktree)")
    parser.add_argument("--rounds", type=int, default=3,
                        help=f"rounds of {PER_ROUND} messages, >= 2 (default 3)")
    parser.add_argument("--protocol", default="4",
                        help="comma-separated MQTT protocol levels: 3, 4 (3.1.1), 5 (default 4)")
    parser.add_argument("--client-type", default="device", choices=("device", "application"),
                        help="the offline subscriber's client type (default device)")
    parser.add_argument("--callgrind-dir", default=None,
                        help="a directory each run's callgrind output is copied to "
                             "(callgrind.<tree>.<type>.<phase>.<rounds>.<level>)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install -y valgrind)")
    if args.rounds < 2:
        raise SystemExit("--rounds must be at least 2")
    trees = args.trees.split(",")
    print(f"{args.client_type.upper()} subscriber")
    print("| phase | MQTT | " + " | ".join(f"{t} (instructions/message)" for t in trees)
          + "".join(f" | {trees[0]} speed ÷ {t}'s" for t in trees[1:]) + " |")
    print("|---|---|" + "---|" * (2 * len(trees) - 1))
    for level in map(int, args.protocol.split(",")):
        figures = [per_message(tbmq_source(t), args.rounds, level, args.client_type, args.callgrind_dir)
                   for t in trees]
        name = "3.1" if level == 3 else "3.1.1" if level == 4 else "5.0"
        for i, phase in enumerate(("queued", "drained")):
            row = [f[i] for f in figures]
            print(f"| {phase} | {name} | " + " | ".join(f"{x:,.0f}" for x in row)
                  + "".join(f" | {x / row[0]:.3f}" for x in row[1:]) + " |", flush=True)


if __name__ == "__main__":
    main()
