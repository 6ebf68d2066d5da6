"""Cost of the bus record codec (tbmq/cluster/records.py) per record: encode
and decode of a typical Message (64-byte payload, QoS 1) and of a Delivery
that carries it, without and with MQTT 5.0 properties, plus a SessionEvent
and a SessionInfo (one each per CONNECT).  Prints µs per operation for this
tree, and for ``--rev REV`` (records.py of that commit, read with ``git
show`` and loaded beside this tree's record types) when given.

Run from the repository root::

    PYTHONPATH=. python bench/records_codec.py [--rev main] [--number 2000] [--repeat 200]

Timings on a shared machine are noisy: the best of many short rounds is
shown, the rounds of both columns interleaved.  Issue 19, on the 2-core
shared machine (``--rev main`` = 76eaef7, before the records' hot paths;
µs per op, encode / decode)::

    record                  main          hot paths
    Message                 1.54 / 1.56   0.73 / 0.85
    Message v5 props        3.79 / 4.91   2.89 / 4.14
    Delivery                2.47 / 2.87   1.14 / 1.35
    Delivery v5 props       4.86 / 6.48   3.40 / 4.76
    SessionEvent            2.27 / 2.34   1.33 / 1.69
    SessionInfo             2.69 / 3.13   1.57 / 1.99
    SessionEventResponse    3.28 / 4.09   2.34 / 3.05

(with properties, most of what is left is
:func:`tbmq.mqtt.properties.pack_properties` / ``unpack_properties``.)
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from functools import partial

from bench.bus_hot_path import module_at
from tbmq.cluster import records as current
from tbmq.model import ClientType, Message
from tbmq.mqtt.constants import Property


def records_at(rev: str):
    """:returns: the module records.py of commit ``rev``."""
    return module_at(rev, "tbmq/cluster/records.py", "records_at_rev")


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


def measure(modules: list, number: int, repeat: int) -> list[dict[str, tuple[float, float]]]:
    """Per module, label → (encode µs, decode µs): the best of ``repeat``
    rounds of ``number`` calls, the modules' rounds interleaved (the load
    of a shared machine falls on all of them alike)."""
    cases = []
    for r in modules:
        timers = {}
        for label, codec, value in samples(r):
            data = codec.encode(value)
            assert codec.decode(data) == value, label
            timers[label] = (timeit.Timer(partial(codec.encode, value)),
                             timeit.Timer(partial(codec.decode, data)))
        cases.append(timers)
    best = [{label: [float("inf"), float("inf")] for label in timers} for timers in cases]
    for _ in range(repeat):
        for timers, out in zip(cases, best):
            for label, pair in timers.items():
                for i, timer in enumerate(pair):
                    out[label][i] = min(out[label][i], timer.timeit(number) / number * 1e6)
    return [{label: tuple(v) for label, v in out.items()} for out in best]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", help="also measure records.py of this commit")
    parser.add_argument("--number", type=int, default=2000, help="calls per round")
    parser.add_argument("--repeat", type=int, default=200, help="rounds (the best is shown)")
    args = parser.parse_args(argv)
    names = ([args.rev] if args.rev else []) + ["this tree"]
    modules = ([records_at(args.rev)] if args.rev else []) + [current]
    columns = list(zip(names, measure(modules, args.number, args.repeat)))
    head = f"{'µs per op':<22}" + "".join(f"{name[:10] + ' enc':>16}{name[:10] + ' dec':>16}"
                                          for name, _ in columns)
    print(head)
    for label in columns[0][1]:
        print(f"{label:<22}" + "".join(f"{m[label][0]:>16.2f}{m[label][1]:>16.2f}"
                                       for _, m in columns))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
