#!/usr/bin/env python3
"""Instructions per CONNECT of a real node on real sockets (valgrind's
callgrind, so the machine's load barely moves the count): a twistd node of
each tree under callgrind with its instrumentation off, switched on
(``callgrind_control -i on``) while ``bench/connload.c`` connects
``--connects`` clients over loopback (100 handshakes in flight) and off
once the last CONNACK arrived.  The count is the node's alone (every
thread): the accept, the first read, the CONNECT, the CONNACK's write;
not its start, not the closes.

:mod:`bench.icount_connect` counts the broker's CONNECT on StringTransports
(deterministic to the instruction, but without Twisted's sockets and
reactor); this one counts what the connections scenario of ``bench/run.py``
costs the node, within a few per cent from run to run.

    PYTHONPATH=$PWD:$PWD/plugins .venv/bin/python bench/icount_connect_tcp.py --trees worktree,main
"""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.brokers import OUT, free_port, wait_node, tbmq_source, tree_pythonpath  # noqa: E402
from bench.connections import PER_SOURCE, connload  # noqa: E402
from bench.icount_connect import connect_parser, print_counts  # noqa: E402


def count(tree: str, n: int, level: int, persistent: bool) -> int:
    """:returns: the instructions of a node of ``tree`` while ``n`` clients
    connect.

    :raises SystemExit: when the node does not start, or a client got no
        CONNACK."""
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="icount-tcp-", dir=OUT) as tmp:
        port = free_port()
        out = os.path.join(tmp, "callgrind.out")
        env = {**os.environ, "PYTHONPATH": tree_pythonpath(tree), "PYTHONHASHSEED": "0",
               # every client comes from 127.0.0.x
               "TBMQ_MQTT__MAX_PERSISTENT_SESSIONS_PER_ADDRESS": "0"}
        node = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
             sys.executable, os.path.join(tree, "bench", "tbmq_launch.py"), "-n", "--pidfile=",
             "tbmq", "--listen", f"tcp:{port}:interface=127.0.0.1",
             "--data-dir", os.path.join(tmp, "data")],
            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        try:
            wait_node(node, port, tree, 900, 0.5)
            time.sleep(2)
            subprocess.run(["callgrind_control", "-i", "on", str(node.pid)], check=True,
                           capture_output=True)
            clients = subprocess.Popen(
                [connload(), "127.0.0.1", str(port), str(n), "100", str(level),
                 "0" if persistent else "1", "3600" if persistent and level == 5 else "0", "60",
                 f"icount-{os.getpid()}", str(max(1, -(-n // PER_SOURCE))), "900"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            first = clients.stdout.readline()
            subprocess.run(["callgrind_control", "-i", "off", str(node.pid)], check=True,
                           capture_output=True)
            clients.stdin.write("close\n")
            clients.stdin.flush()
            clients.stdout.readline()
            clients.wait(60)
        finally:
            node.send_signal(signal.SIGTERM)
            node.wait(600)
        connected = re.search(r"connected (\d+)", first)
        if connected is None or int(connected.group(1)) < n:
            raise SystemExit(f"{tree}: not every client connected: {first.strip()!r}")
        total = 0
        for path in glob.glob(out + "*"):
            with open(path) as f:
                found = re.search(r"^totals:\s*(\d+)", f.read(), re.M)
            total += int(found.group(1)) if found else 0
        return total


def main(argv=None) -> None:
    parser = connect_parser(__doc__, 1000)
    parser.add_argument("--persistent", action="store_true",
                        help="persistent sessions (3.1.1 Clean Session 0; 5.0 expiry 3600 s)")
    args = parser.parse_args(argv)
    trees = args.trees.split(",")
    figures = [count(tbmq_source(t), args.connects, args.level, args.persistent) / args.connects
               for t in trees]
    kind = "persistent" if args.persistent else "clean"
    print_counts(f"node instructions per {kind} CONNECT, real sockets", trees, figures)

if __name__ == "__main__":
    main()
