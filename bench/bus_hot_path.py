"""The in-process bus's hot path against the bus before the contract
(commit e7ffebf): per-publish cost of ``publish`` with one group whose
handler does nothing, and of ``Router.publish`` (QoS 0, one local subscriber).

Run from the repository root::

    PYTHONPATH=. python bench/bus_hot_path.py

Timings on a shared machine are noisy: compare the ratios of several runs.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import timeit

OLD_COMMIT = "e7ffebf"


def module_at(rev: str, path: str, name: str):
    """:returns: the module ``path`` (from the repository root) of commit
        ``rev`` (``git show``), loaded as ``name`` beside this tree's
        modules, which it imports."""
    source = subprocess.run(["git", "show", f"{rev}:{path}"],
                            check=True, capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def old_bus_module():
    return module_at(OLD_COMMIT, "tbmq/backends/inprocess_bus.py", "old_inprocess_bus")


def per_call_ns(f, n: int) -> float:
    return min(timeit.repeat(f, number=n, repeat=7)) / n * 1e9


def bus_only(old, new) -> tuple[float, float]:
    from twisted.internet.task import Clock

    from tbmq.model import Message

    message = Message("a/b", b"x")
    ob = old.InProcessBus()
    ob.start()
    ob.subscribe("tbmq.msg.all", "g", lambda key, value: None)
    nb = new(clock=Clock())
    nb.start()
    nb.subscribe("tbmq.msg.all", "g", lambda record: None)
    return (per_call_ns(lambda: ob.publish("tbmq.msg.all", "a/b", message), 500000),
            per_call_ns(lambda: nb.publish("tbmq.msg.all", "a/b", message), 500000))


def through_router(bus) -> float:
    from tbmq.model import Message
    from tbmq.mqtt import Subscribe, SubscriptionRequest
    from tests.helpers import Harness

    h = Harness(bus=bus)
    client = h.client("sub")
    client.send(Subscribe(1, [SubscriptionRequest("a/+", 0)]))
    client.received()
    publish = h.broker.router.publish
    message = Message("a/b", b"x" * 16)
    n = 50000

    def batch():
        for _ in range(n):
            publish(message)
        client.transport.clear()

    return per_call_ns(batch, 1) / n


def main() -> None:
    from tbmq.backends.inprocess_bus import InProcessBus

    old = old_bus_module()
    o, n = bus_only(old, InProcessBus)
    print(f"publish, no-op handler:        old {o:6.0f} ns  new {n:6.0f} ns  ratio {n / o:.2f}")
    o, n = through_router(old.InProcessBus()), through_router(InProcessBus())
    print(f"Router.publish, QoS 0, 1 sub:  old {o:6.0f} ns  new {n:6.0f} ns  ratio {n / o:.2f}")


if __name__ == "__main__":
    sys.exit(main())
