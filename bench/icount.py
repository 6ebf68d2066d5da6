"""CPU instructions per delivery through a whole broker, counted by
valgrind: a figure that a shared, noisy machine does not move.

``bench/run.py`` measures rates on real sockets, and on a machine that
others share its single rounds can differ by a factor of two.  This
benchmark runs the broker of one or more source trees (``worktree``, or a
committed revision as ``bench/run.py``'s ``tbmq@REV`` does) in one process
on StringTransports, under ``valgrind --tool=callgrind``,
and counts the instructions of ``bench/run.py``'s throughput scenarios
(:data:`SCENARIOS`): the same client ids, topics, QoS and keep alive (300 s),
64-byte payloads,
the PUBLISH packets of one publisher arriving in one read, the reactor's
timed calls (a heap, as in ``twistd``) run after each read as one reactor
turn runs them (the outbound queues' flush), QoS 1 deliveries
acknowledged by their subscriber after each read, garbage collection as
``twistd tbmq`` sets it (``node.gc_threshold``).

Each tree runs twice, with ``--rounds`` and with one round; the difference
of the two counts divided by the deliveries of the extra rounds is the cost
of a delivery, without the start-up (imports, config, plugins) that both
runs share.  The subscribers' side (reading the transports, the PUBACKs)
is counted too, a few hundred instructions per delivery in every tree.

Usage::

    PYTHONPATH=. .venv/bin/python bench/icount.py --trees worktree,5b0764d \\
        --scenarios fanin_qos0,fanin_qos1,fanout_qos0,p2p_qos1 --protocol 4,5

prints a Markdown table: instructions per delivery for each tree, and the
first tree's speed ÷ each other tree's (that tree's count ÷ the first's).
A run of one scenario takes one to two minutes per tree.

:raises SystemExit: when valgrind is not installed, or a run delivers fewer
    messages than it should (the figure would not be the cost of a
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

#: the scenarios: publishers and subscribers as ``bench/scenarios.py`` names
#: them, QoS, PUBLISH packets per read of one publisher, deliveries per
#: message
SCENARIOS = {
    "fanin_qos0": "10 publishers → 1 subscriber of bench/fanin/+, QoS 0, 800 PUBLISH per read",
    "fanin_qos1": "10 publishers → 1 subscriber of bench/fanin/+, QoS 1, 800 PUBLISH per read",
    "fanout_qos0": "1 publisher → 100 subscribers of bench/fanout/t, QoS 0, 80 PUBLISH per read",
    "p2p_qos1": "100 publisher/subscriber pairs, each on its own topic, QoS 1, 80 PUBLISH per read",
    "fanin_app_qos1": "10 publishers → 1 live persistent APPLICATION subscriber of bench/fanin/+, QoS 1, "
                      "800 PUBLISH per read, the embedded node's SQLite store (its work counted in the "
                      "broker's thread)",
}

#: the start of every counted child: the reactor's own timed calls (a heap)
#: in place of task.Clock, whose every call sorts its whole list in Python;
#: advance() runs what is due, as one turn of the reactor does (the broker's
#: own time goes on as the wall clock's)
REACTOR_CLOCK = r"""
import gc, sys
from twisted.internet import reactor, task


class ReactorClock:
    seconds = staticmethod(reactor.seconds)
    callLater = staticmethod(reactor.callLater)
    getDelayedCalls = staticmethod(reactor.getDelayedCalls)

    def advance(self, amount):
        reactor.runUntilCurrent()


task.Clock = ReactorClock
"""

#: the broker run that valgrind counts: ``python - SCENARIO ROUNDS LEVEL``
#: with the tree on ``PYTHONPATH``; prints the deliveries made and expected
CHILD = REACTOR_CLOCK + r"""
from tests.helpers import Harness
from tbmq.mqtt import Connect, Publish, Subscribe, SubscriptionRequest
from tbmq.mqtt.codec import encode

scenario, rounds, level = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
PAYLOAD = b"x" * 64
app = "_app_" in scenario
if scenario.startswith("fanin"):
    pubs = [(f"fi-pub{i:02d}", f"bench/fanin/{i:02d}") for i in range(10)]
    subs = [("bench-app" if app else "fi-sub", "bench/fanin/+")]
    per_read, copies = 800, 1
    drained = lambda n: [0]
elif scenario == "fanout_qos0":
    pubs = [("fo-pub", "bench/fanout/t")]
    subs = [(f"fo-sub{i:03d}", "bench/fanout/t") for i in range(100)]
    per_read, copies = 80, 100
    drained = lambda n: range(100)
else:
    pubs = [(f"pp-pub{i:03d}", f"bench/p2p/{i:03d}") for i in range(100)]
    subs = [(f"pp-sub{i:03d}", f"bench/p2p/{i:03d}") for i in range(100)]
    per_read, copies = 80, 1
    drained = lambda n: [n]
qos = int(scenario[-1])
if app:
    # the embedded node: its SQLite store in a fresh data directory, the
    # SQLite work run at once in this thread (so it is counted), and the
    # subscriber authenticated as a persistent APPLICATION client
    import tempfile
    from tbmq.auth import AuthResult
    from tbmq.embedded import EmbeddedBackends
    from tbmq.hookspecs import hookimpl
    from tbmq.model import ClientType
    from tests.unit.test_stores import SyncReactor, SyncThreadPool

    class Applications:
        @hookimpl(tryfirst=True)
        def tbmq_authenticate(self, request):
            if request.client_id == "bench-app":
                return AuthResult(True, client_type=ClientType.APPLICATION, provider="bench",
                                  credentials_name="applications")
            return None

    h = Harness({"storage": {"backend": "sqlite"}, "data_dir": tempfile.mkdtemp()},
                replace={"embedded": EmbeddedBackends(SyncReactor(), SyncThreadPool()),
                         "bench-applications": Applications()})
    h.clock.advance(0)
else:
    h = Harness()
gc.set_threshold(50000)


def connect(client_id):
    c = h.raw(level)
    c.protocol.dataReceived(encode(Connect(protocol_level=level, client_id=client_id,
                                           keep_alive=300, clean_start=client_id != "bench-app"),
                                   level))
    h.clock.advance(0)
    c.transport.clear()
    return c


subscribers = []
for client_id, topic_filter in subs:
    c = connect(client_id)
    c.protocol.dataReceived(encode(Subscribe(1, [SubscriptionRequest(topic_filter, qos)]), level))
    h.clock.advance(0)
    c.transport.clear()
    subscribers.append(c)
publishers = []
for client_id, topic in pubs:
    data = b"".join(encode(Publish(topic, PAYLOAD, qos=qos, packet_id=(n + 1) if qos else None),
                           level) for n in range(per_read))
    publishers.append((connect(client_id), data,
                       [subscribers[k] for k in drained(len(publishers))]))
topic = pubs[0][1]
size = len(encode(Publish(topic, PAYLOAD, qos=qos, packet_id=1 if qos else None), level))
pid_at = 4 + len(topic)  # fixed header (2 bytes), topic length, topic name


def take(c):
    # the deliveries written to c since the last call, acknowledged (QoS 1)
    data = c.transport.value()
    c.transport.clear()
    if qos and data:
        c.protocol.dataReceived(b"".join(b"\x40\x02" + data[o:o + 2]
                                         for o in range(pid_at, len(data), size)))
    return len(data) // size


delivered = 0
for _ in range(rounds):
    for pub, data, matching in publishers:
        pub.protocol.dataReceived(data)
        h.clock.advance(0)
        pub.transport.clear()
        # turns until the read's deliveries all arrived: the session's flush
        # at the end of a turn, the log's flush and the hand-off take turns
        # of their own; a few idle turns end a read that stays short
        want, idle = per_read * len(matching), 0
        while want > 0 and idle < 4:
            got = sum(take(c) for c in matching)
            h.clock.advance(0)
            delivered += got
            want -= got
            idle = 0 if got else idle + 1
print(delivered, rounds * len(publishers) * per_read * copies)
"""


#: deliveries in one round of every scenario: every publisher's read, each
#: message to each subscriber whose filter matches
MESSAGES_PER_ROUND = 8000


def callgrind(tree: str, child: str, args: list, pythonpath: str,
              keep: str | None = None) -> tuple[int, int, int]:
    """Run the script ``child`` (read from stdin) under valgrind's callgrind
    in ``tree``, with ``args`` and ``PYTHONPATH=pythonpath``; ``keep``, when
    given, is a path the callgrind output is copied to (for
    ``callgrind_annotate``).

    :returns: ``(instructions, done, expected)``: the instructions valgrind
        collected, and the last two integers the script printed.
    :raises SystemExit: when the run failed or valgrind gave no count.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        env = {**os.environ, "PYTHONPATH": pythonpath, "PYTHONHASHSEED": "0"}
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, "-", *map(str, args)],
            input=child, capture_output=True, text=True, cwd=tree, env=env)
        if run.returncode != 0:
            raise SystemExit(f"{tree}: the run failed:\n{run.stderr[-3000:]}")
        done, expected = map(int, run.stdout.split()[-2:])
        found = re.search(r"Collected\s*:\s*(\d+)", run.stderr)
        if found is None:
            raise SystemExit(f"{tree}: no instruction count in valgrind's output")
        if keep is not None:
            shutil.copyfile(out, keep)
        return int(found.group(1)), done, expected


def count(tree: str, scenario: str, rounds: int, level: int) -> int:
    """Instructions of one broker run of ``rounds`` rounds of ``scenario``
    on ``tree``.

    :raises SystemExit: when the run failed, or delivered fewer messages
        than its publishers sent times the subscribers that match.
    """
    instructions, delivered, expected = callgrind(tree, CHILD, [scenario, rounds, level], tree)
    if delivered < expected:
        raise SystemExit(f"{tree} {scenario}: {delivered} of {expected} deliveries made")
    return instructions


def per_delivery(tree: str, scenario: str, rounds: int, level: int) -> float:
    """Instructions per delivery of ``scenario`` on ``tree``: the difference
    of a run of ``rounds`` rounds and one of a single round, divided by the
    deliveries of the ``rounds - 1`` extra rounds."""
    return (count(tree, scenario, rounds, level) - count(tree, scenario, 1, level)) / (
        (rounds - 1) * MESSAGES_PER_ROUND)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", default="worktree",
                        help="comma-separated: worktree or git revisions (default worktree)")
    parser.add_argument("--scenarios", default="fanin_qos0",
                        help="comma-separated, of: " + ", ".join(SCENARIOS))
    parser.add_argument("--rounds", type=int, default=3,
                        help=f"rounds of {MESSAGES_PER_ROUND} deliveries, >= 2 (default 3)")
    parser.add_argument("--protocol", default="4",
                        help="comma-separated MQTT protocol levels: 3, 4 (3.1.1), 5 (default 4)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install -y valgrind)")
    if args.rounds < 2:
        raise SystemExit("--rounds must be at least 2")
    scenarios = args.scenarios.split(",")
    unknown = [name for name in scenarios if name not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenarios: {', '.join(unknown)}")
    trees = args.trees.split(",")
    print("| scenario | MQTT | " + " | ".join(f"{t} (instructions/delivery)" for t in trees)
          + "".join(f" | {trees[0]} speed ÷ {t}'s" for t in trees[1:]) + " |")
    print("|---|---|" + "---|" * (2 * len(trees) - 1))
    for scenario in scenarios:
        for level in map(int, args.protocol.split(",")):
            figures = [per_delivery(tbmq_source(t), scenario, args.rounds, level) for t in trees]
            print(f"| {scenario} | {'3.1' if level == 3 else '3.1.1' if level == 4 else '5.0'} | "
                  + " | ".join(f"{f:,.0f}" for f in figures)
                  + "".join(f" | {f / figures[0]:.3f}" for f in figures[1:]) + " |", flush=True)


if __name__ == "__main__":
    main()
