"""A mutation fuzzer over live sockets, in a process of its own::

    python -m tests.faults.fuzz --port P --cases 20000 --seed 12 --concurrency 24

Each case opens a connection and sends a sequence built from valid packets
of MQTT 3.1, 3.1.1 and 5.0 (:mod:`tbmq.mqtt.codec`): a CONNECT with random
flags, will, credentials and properties, then up to four packets a client
sends (PUBLISH at each QoS with properties and topic aliases, SUBSCRIBE,
UNSUBSCRIBE, the acknowledgements, PINGREQ, AUTH, DISCONNECT).  One or
more of them is mutated (bit flips, bytes replaced, inserted, removed or
repeated, a truncation, a remaining length changed, garbage appended), and
the bytes go out in up to three writes.  The case then reads until the
broker closes the connection, stays silent for ``--idle`` seconds or has
answered for ``--max-case-time`` seconds, and closes it.

Client ids and topics start with ``fz``, apart from the good client's.  The
process prints one JSON line: ``cases``, ``outcomes`` (``closed`` by the
broker, ``answered`` and left open, ``silent``, ``refused`` connects),
``connack`` (CONNACK codes seen first) and ``seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import sys
import time

from tbmq.mqtt import (
    Auth, Connect, Disconnect, Pingreq, Property, Puback, Pubcomp, Publish, Pubrec, Pubrel,
    Subscribe, SubscriptionRequest, Unsubscribe, Will,
)
from tbmq.mqtt.codec import encode

HOST = "127.0.0.1"

TOPICS = ["fz/a", "fz/a/b", "fz/+/b", "fz/#", "fz/x/y/z", "$share/g/fz/s", "fz/é/ü", "fz//e", "#",
          "+", "fz/a\x00b", "$SYS/fz", "fz/" + "l/" * 40]


def _text(rng: random.Random, n: int = 8) -> str:
    return "".join(rng.choice("abcxyz/+#é$\x00 ") for _ in range(rng.randrange(n)))


def _props(rng: random.Random, choices) -> dict:
    props = {}
    for prop, value in choices:
        if rng.random() < 0.3:
            props[prop] = value(rng) if callable(value) else value
    return props


_USER = (Property.USER_PROPERTY, lambda r: [("k", _text(r)), ("fz", "v")])

CONNECT_PROPS = [
    (Property.SESSION_EXPIRY_INTERVAL, lambda r: r.choice([0, 10, 3600, 0xFFFFFFFF])),
    (Property.RECEIVE_MAXIMUM, lambda r: r.choice([1, 10, 65535])),
    (Property.MAXIMUM_PACKET_SIZE, lambda r: r.choice([64, 1024, 1 << 20])),
    (Property.TOPIC_ALIAS_MAXIMUM, lambda r: r.choice([0, 5, 65535])),
    (Property.REQUEST_RESPONSE_INFORMATION, lambda r: r.choice([0, 1])),
    (Property.REQUEST_PROBLEM_INFORMATION, lambda r: r.choice([0, 1])),
    (Property.AUTHENTICATION_METHOD, lambda r: r.choice(["SCRAM-SHA-256", "fz"])),
    (Property.AUTHENTICATION_DATA, lambda r: r.randbytes(r.randrange(40))),
    _USER,
]
WILL_PROPS = [
    (Property.WILL_DELAY_INTERVAL, lambda r: r.choice([0, 1, 100])),
    (Property.PAYLOAD_FORMAT_INDICATOR, lambda r: r.choice([0, 1])),
    (Property.MESSAGE_EXPIRY_INTERVAL, lambda r: r.choice([0, 1, 3600])),
    (Property.CONTENT_TYPE, "text/plain"),
    (Property.RESPONSE_TOPIC, lambda r: r.choice(TOPICS)),
    (Property.CORRELATION_DATA, b"corr"),
    _USER,
]
PUBLISH_PROPS = WILL_PROPS[1:] + [
    (Property.TOPIC_ALIAS, lambda r: r.choice([1, 2, 10, 11, 65535])),
    (Property.SUBSCRIPTION_IDENTIFIER, lambda r: r.choice([1, 268435455])),
]


def connect_packet(rng: random.Random, level: int, n: int) -> Connect:
    will = None
    if rng.random() < 0.3:
        will = Will(rng.choice(TOPICS), rng.randbytes(rng.randrange(20)), rng.randrange(3),
                    rng.random() < 0.3, _props(rng, WILL_PROPS) if level == 5 else {})
    client_id = rng.choice([f"fz-{n}", f"fz-{n % 50}", "", "fz-" + "i" * 30])
    username = rng.choice([None, None, "fz", "dev"])
    password = rng.choice([None, b"pw", b"x" * 80]) if username or level == 5 else None
    return Connect(protocol_name="MQIsdp" if level == 3 else "MQTT", protocol_level=level,
                   clean_start=rng.random() < 0.7, keep_alive=rng.choice([0, 1, 60, 65535]),
                   client_id=client_id, will=will, username=username, password=password,
                   properties=_props(rng, CONNECT_PROPS) if level == 5 else {})


def client_packet(rng: random.Random, level: int):
    v5 = level == 5
    pid = rng.choice([1, 2, 7, 65535])
    reason = rng.choice([0, 0x10, 0x80, 0x83, 0x92]) if v5 else 0
    kind = rng.randrange(9)
    if kind <= 2:
        qos = rng.randrange(3)
        props = _props(rng, PUBLISH_PROPS) if v5 else {}
        topic = "" if v5 and Property.TOPIC_ALIAS in props and rng.random() < 0.5 else rng.choice(TOPICS)
        return Publish(topic, rng.randbytes(rng.randrange(64)), qos, rng.random() < 0.2,
                       qos > 0 and rng.random() < 0.2, pid if qos else None, props)
    if kind == 3:
        requests = [SubscriptionRequest(rng.choice(TOPICS), rng.randrange(3), rng.random() < 0.2,
                                        rng.random() < 0.2, rng.randrange(3))
                    for _ in range(rng.randrange(1, 4))]
        props = _props(rng, [(Property.SUBSCRIPTION_IDENTIFIER, lambda r: r.randrange(1, 9)),
                             _USER]) if v5 else {}
        return Subscribe(pid, requests, props)
    if kind == 4:
        return Unsubscribe(pid, [rng.choice(TOPICS) for _ in range(rng.randrange(1, 3))])
    if kind == 5:
        return rng.choice([Puback, Pubrec, Pubrel, Pubcomp])(pid, reason)
    if kind == 6:
        return Pingreq()
    if kind == 7 and v5:
        return Auth(rng.choice([0, 0x18, 0x19]),
                    {Property.AUTHENTICATION_METHOD: "SCRAM-SHA-256",
                     Property.AUTHENTICATION_DATA: rng.randbytes(rng.randrange(30))})
    props = _props(rng, [(Property.SESSION_EXPIRY_INTERVAL, lambda r: r.choice([0, 10])),
                         _USER]) if v5 else {}
    return Disconnect(rng.choice([0, 4, 0x81]) if v5 else 0, props)


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to three mutations of ``data``."""
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(9)
        n = len(out)
        at = rng.randrange(n) if n else 0
        if op == 0 and n:
            out[at] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            out[at] = rng.randrange(256)
        elif op == 2:
            out[at:at] = rng.randbytes(rng.randrange(1, 8))
        elif op == 3 and n:
            del out[at:at + rng.randrange(1, 8)]
        elif op == 4 and n:
            out += out[at:at + rng.randrange(1, 64)]
        elif op == 5 and n > 1:
            del out[rng.randrange(1, n):]
        elif op == 6 and n > 1:  # a remaining length of any size
            out[1:2] = bytes(rng.choice([[0x00], [0x7F], [0xFF, 0x7F], [0xFF, 0xFF, 0xFF, 0x7F],
                                         [0xFF, 0xFF, 0xFF, 0xFF], [0x80, 0x00]]))
        elif op == 7:
            out += rng.randbytes(rng.randrange(1, 32))
        elif op == 8 and n:  # the packet type and flags
            out[0] = rng.randrange(256)
    return bytes(out)


def build_case(rng: random.Random, n: int) -> bytes:
    level = rng.choice([3, 4, 5, 5])
    packets = [encode(connect_packet(rng, level, n), level)]
    packets += [encode(client_packet(rng, level), level) for _ in range(rng.randrange(5))]
    targets = [0] if rng.random() < 0.4 or len(packets) == 1 else []
    targets += rng.sample(range(1, len(packets)), k=min(len(packets) - 1, rng.randrange(1, 3))) \
        if len(packets) > 1 else []
    for i in targets:
        packets[i] = mutate(rng, packets[i])
    return b"".join(packets) or b"\x00"


async def run_case(data: bytes, rng: random.Random, args, stats: dict) -> None:
    try:
        reader, writer = await asyncio.open_connection(HOST, args.port)
    except OSError:
        stats["outcomes"]["refused"] += 1
        return
    try:
        cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randrange(3)))
                      ) if len(data) > 1 else []
        pieces = [data[i:j] for i, j in zip([0] + cuts, cuts + [len(data)])]
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        first = True
        # a case subscribed to "#" gets the good client's messages every few
        # milliseconds, so silence alone would never end it
        deadline = asyncio.get_running_loop().time() + args.max_case_time
        while True:
            try:
                async with asyncio.timeout(args.idle):
                    chunk = await reader.read(65536)
            except TimeoutError:
                stats["outcomes"]["answered" if not first else "silent"] += 1
                return
            if not chunk:
                stats["outcomes"]["closed"] += 1
                return
            if first and chunk[0] == 0x20 and len(chunk) >= 4:
                stats["connack"][chunk[3]] += 1
            first = False
            if asyncio.get_running_loop().time() > deadline:
                stats["outcomes"]["answered"] += 1
                return
    except OSError:  # reset by the broker
        stats["outcomes"]["closed"] += 1
    finally:
        writer.close()


async def main_async(args) -> dict:
    stats = {"outcomes": collections.Counter(), "connack": collections.Counter()}
    next_case = iter(range(args.cases))

    async def worker(w: int) -> None:
        rng = random.Random(args.seed * 1000 + w)
        for n in next_case:
            await run_case(build_case(rng, n), rng, args, stats)

    start = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(args.concurrency)))
    return {"cases": sum(stats["outcomes"].values()), "outcomes": dict(stats["outcomes"]),
            "connack": {str(k): v for k, v in sorted(stats["connack"].items())},
            "seconds": round(time.monotonic() - start, 1)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cases", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--idle", type=float, default=0.05,
                        help="seconds of silence after which a case ends")
    parser.add_argument("--max-case-time", type=float, default=1.0,
                        help="seconds after which a case that is still answered ends")
    args = parser.parse_args(argv)
    report = asyncio.run(main_async(args))
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
