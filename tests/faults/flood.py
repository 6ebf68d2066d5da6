"""Hostile clients in a process of their own (asyncio), so that the test
process measuring a good client shares no interpreter lock with them::

    python -m tests.faults.flood --port P --sockets 500 --duration 8 \\
        login --username dev --password wrong
    python -m tests.faults.flood --port P --sockets 4 --duration 8 announce

``login``: each socket sends CONNECT (MQTT 3.1.1) with a user name and a
wrong password, reads the answer until the broker closes, and starts again
at once.  ``announce``: each socket sends a CONNECT fixed header announcing
a packet of ``--length`` bytes of remaining length (268,435,455 by
default: 256 MB, the most MQTT can encode), then 4 KB of it every 10 ms,
and starts again when the broker closes.

The process prints ``started`` when its sockets start, and one JSON line
when it is done: ``attempts``, ``codes``
(CONNACK return code → count), ``closed`` (closed without CONNACK),
``open_at_end`` (connections the broker had not closed when the time was
up, or a second after they opened), ``errors`` (refused or reset connects) and, for ``announce``,
``bytes_accepted`` (the most bytes of one announced packet the broker read
before closing).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time

from tbmq.mqtt import Connect
from tbmq.mqtt.codec import encode
from tbmq.mqtt.properties import encode_variable_byte_integer

HOST = "127.0.0.1"

#: the largest remaining length MQTT can encode (256 MB)
MAX_REMAINING_LENGTH = 268435455


class Stats:
    def __init__(self) -> None:
        self.attempts = 0
        self.codes: collections.Counter = collections.Counter()
        self.closed = 0
        self.errors = 0
        self.open_at_end = 0
        self.bytes_accepted = 0

    def as_dict(self) -> dict:
        return {"attempts": self.attempts, "codes": {str(k): v for k, v in self.codes.items()},
                "closed": self.closed, "errors": self.errors, "open_at_end": self.open_at_end,
                "bytes_accepted": self.bytes_accepted}


async def _open(args, stats: Stats):
    """:returns: ``(reader, writer)`` of a new connection (counted in
    ``stats.attempts``), or None when it failed (counted in ``errors``)."""
    local = (args.source, 0) if args.source else None
    try:
        connection = await asyncio.open_connection(HOST, args.port, local_addr=local)
    except OSError:
        stats.errors += 1
        await asyncio.sleep(0.05)
        return None
    stats.attempts += 1
    return connection


async def _read_to_close(reader, deadline: float) -> bytes:
    """Everything the broker sends until it closes; raises TimeoutError at
    ``deadline``."""
    data = b""
    while True:
        chunk = await asyncio.wait_for(reader.read(65536), max(0.001, deadline - time.monotonic()))
        if not chunk:
            return data
        data += chunk


async def login_socket(n: int, args, stats: Stats, end: float) -> None:
    attempt = 0
    while time.monotonic() < end:
        attempt += 1
        client_id = f"flood-{n}" if args.fixed_client_ids else f"flood-{n}-{attempt}"
        username = args.username if args.username != "*" else f"user-{n}-{attempt}"
        packet = encode(Connect(client_id=client_id, protocol_level=4, username=username,
                                password=args.password.encode()), 4)
        connection = await _open(args, stats)
        if connection is None:
            continue
        reader, writer = connection
        try:
            writer.write(packet)
            try:
                data = await _read_to_close(reader, end + 30)
            except (TimeoutError, asyncio.TimeoutError):
                stats.open_at_end += 1
                return
            if len(data) >= 4 and data[0] == 0x20:
                stats.codes[data[3]] += 1
            else:
                stats.closed += 1
        except OSError:
            stats.errors += 1
        finally:
            writer.close()


async def announce_socket(n: int, args, stats: Stats, end: float) -> None:
    chunk = b"\x00" * 4096
    header = b"\x10" + encode_variable_byte_integer(args.length)
    while time.monotonic() < end:
        connection = await _open(args, stats)
        if connection is None:
            continue
        reader, writer = connection
        opened = time.monotonic()
        sent = 0
        try:
            writer.write(header)
            # keep sending the announced body until the broker closes (a
            # connection opened just before the end has a second more)
            while time.monotonic() < max(end, opened + 1.0):
                try:
                    data = await asyncio.wait_for(reader.read(65536), 0.01)
                    if not data:
                        break
                except (TimeoutError, asyncio.TimeoutError):
                    pass
                writer.write(chunk)
                await writer.drain()
                sent += len(chunk)
            else:
                stats.open_at_end += 1
                return
            stats.closed += 1
        except OSError:  # reset by the broker: closed as well
            stats.closed += 1
        finally:
            stats.bytes_accepted = max(stats.bytes_accepted, sent)
            writer.close()


async def main_async(args) -> Stats:
    stats = Stats()
    sys.stdout.write("started\n")
    sys.stdout.flush()
    end = time.monotonic() + args.duration
    worker = login_socket if args.mode == "login" else announce_socket
    await asyncio.gather(*(worker(n, args, stats, end) for n in range(args.sockets)))
    return stats


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sockets", type=int, default=500)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds")
    parser.add_argument("--source", default=None, help="the local address to connect from")
    modes = parser.add_subparsers(dest="mode", required=True)
    login = modes.add_parser("login")
    login.add_argument("--username", default="dev", help="'*': a new one per attempt")
    login.add_argument("--password", default="wrong")
    login.add_argument("--fixed-client-ids", action="store_true",
                       help="one client id per socket instead of one per attempt")
    announce = modes.add_parser("announce")
    announce.add_argument("--length", type=int, default=MAX_REMAINING_LENGTH,
                          help="the remaining length announced, bytes")
    args = parser.parse_args(argv)
    stats = asyncio.run(main_async(args))
    sys.stdout.write(json.dumps(stats.as_dict()) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
