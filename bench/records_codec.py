"""Cost of the bus record codec (tbmq/cluster/records.py) per record: encode
and decode of a typical Message (64-byte payload, QoS 1) and of a Delivery
that carries it, without and with MQTT 5.0 properties, plus a SessionEvent
and a SessionInfo (one each per CONNECT).  Prints µs per operation for this
tree, and for ``--rev REV`` (records.py of that commit, read with ``git
show`` and loaded beside this tree's record types) when given.

Run from the repository root::

    PYTHONPATH=. python bench/records_codec.py [--rev main] [--number 20000]

Timings on a shared machine are noisy: the best of seven repeats is shown.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import timeit

from tbmq.cluster import records as current
from tbmq.model import ClientType, Message
from tbmq.mqtt.constants import Property


def records_at(rev: str):
    """:returns: the module records.py of commit ``rev``."""
    source = subprocess.run(["git", "show", f"{rev}:tbmq/cluster/records.py"], check=True,
                            capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "records_at_rev.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("records_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def samples(r) -> list[tuple[str, object, object]]:
    """``(label, codec, value)`` of each measured case."""
    now = time.time()
    payload = bytes(range(64))
    plain = Message("sensors/device-17/telemetry", payload, 1, False, {}, "device-17", now, None)
    props = {Property.CONTENT_TYPE: "application/json",
             Property.MESSAGE_EXPIRY_INTERVAL: 3600,
             Property.USER_PROPERTY: [("site", "north"), ("line", "7")]}
    v5 = Message("sensors/device-17/telemetry", payload, 1, False, props, "device-17", now,
                 now + 3600)
    session = r.SessionInfo("device-17", "node-a", "9f1c0d6e2b7a4c1e8d3f5a6b7c8d9e0f", True,
                            True, ClientType.DEVICE, 3600, 5, now, None, now, None,
                            "192.0.2.7:50123", "alice", "sensors")
    event = r.SessionEvent(r.CONNECTION_REQUEST, "device-17", "node-a",
                           "9f1c0d6e2b7a4c1e8d3f5a6b7c8d9e0f", "req-1", True, True,
                           ClientType.DEVICE, 3600, 5, now)
    return [
        ("Message", r.MESSAGE, plain),
        ("Message v5 props", r.MESSAGE, v5),
        ("Delivery", r.DELIVERY, r.Delivery("subscriber-3", plain, 1, False, (), 0)),
        ("Delivery v5 props", r.DELIVERY, r.Delivery("subscriber-3", v5, 1, False, (5,), 0)),
        ("SessionEvent", r.SESSION_EVENT, event),
        ("SessionInfo", r.SESSION, session),
        ("SessionEventResponse", r.SESSION_EVENT_RESPONSE,
         r.SessionEventResponse("device-17", "req-1", True, True, session, "")),
    ]


def per_call_us(f, n: int) -> float:
    return min(timeit.repeat(f, number=n, repeat=7)) / n * 1e6


def measure(r, n: int) -> dict[str, tuple[float, float]]:
    """label → (encode µs, decode µs)."""
    out = {}
    for label, codec, value in samples(r):
        data = codec.encode(value)
        assert codec.decode(data) == value, label
        encode, decode = codec.encode, codec.decode
        out[label] = (per_call_us(lambda: encode(value), n),
                      per_call_us(lambda: decode(data), n))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", help="also measure records.py of this commit")
    parser.add_argument("--number", type=int, default=20000, help="calls per repeat")
    args = parser.parse_args(argv)
    columns = [("this tree", measure(current, args.number))]
    if args.rev:
        columns.insert(0, (args.rev, measure(records_at(args.rev), args.number)))
    head = f"{'µs per op':<22}" + "".join(f"{name[:10] + ' enc':>16}{name[:10] + ' dec':>16}"
                                          for name, _ in columns)
    print(head)
    for label in columns[0][1]:
        print(f"{label:<22}" + "".join(f"{m[label][0]:>16.2f}{m[label][1]:>16.2f}"
                                       for _, m in columns))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
