"""Helpers of the fault suite: a good client whose QoS 1 round trips are
timed while the broker is attacked, the broker's memory, its log, and the
hostile processes of :mod:`tests.faults.flood` and :mod:`tests.faults.fuzz`."""

from __future__ import annotations

import json
import os
import resource
import select
import statistics
import subprocess
import sys
import threading
import time

from tests.integration.helpers import REPO_ROOT, PahoClient, uid
from tests.integration.test_flow_control import RssWatch

#: what the broker's log must never hold
UNHANDLED = ("Unhandled", "Traceback")


class RoundTrips(threading.Thread):
    """A well-behaved client pair (a v3.1.1 publisher, a v5 subscriber) that
    sends QoS 1 messages to itself one at a time and times each round trip,
    from PUBLISH to the message received.

    :param credentials: ``(user name, password)`` of both clients, or None.
    :ivar times: the round trips completed, seconds.
    :ivar failures: what went wrong (a message not acknowledged or not
        received in ``timeout`` s, a disconnect).
    """

    def __init__(self, port: int, timeout: float = 10.0, pause: float = 0.02,
                 credentials: tuple[str, str] | None = None) -> None:
        super().__init__(name="round-trips", daemon=True)
        self.port, self.timeout, self.pause = port, timeout, pause
        self.topic = f"good/{uid()}/rtt"
        self.sub, self.pub = PahoClient(port, 5), PahoClient(port, 4)
        for client in (self.sub, self.pub):
            if credentials is not None:
                client.client.username_pw_set(*credentials)
            client.connect_and_wait()
        assert self.sub.subscribe(self.topic, 1) == [1]
        self.times: list[float] = []
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.halt.is_set():
            n += 1
            payload = f"rtt {n}".encode()
            start = time.monotonic()
            try:
                self.pub.publish(self.topic, payload, 1, timeout=self.timeout)
                got = self.sub.get(self.timeout)
                assert got.payload == payload, (got.payload, payload)
            except AssertionError as e:
                self.failures.append(str(e))
                if self.pub.disconnected.is_set() or self.sub.disconnected.is_set():
                    self.failures.append("the good client was disconnected")
                    return
                continue
            self.times.append(time.monotonic() - start)
            self.halt.wait(self.pause)

    def finish(self) -> dict:
        """Stop, close the clients, and return ``{"count", "median", "p99",
        "max"}`` of the round trips in seconds."""
        self.halt.set()
        self.join(self.timeout + 5)
        self.pub.close()
        self.sub.close()
        times = sorted(self.times) or [float("inf")]
        return {"count": len(self.times), "median": statistics.median(times),
                "p99": times[min(len(times) - 1, int(len(times) * 0.99))], "max": times[-1]}


def assert_round_trips(rtt: "RoundTrips", stats: dict, bound: float, at_least: int = 10) -> None:
    """The good client's round trips all completed, at least ``at_least``
    of them, each in under ``bound`` seconds."""
    assert not rtt.failures, rtt.failures[:5]
    assert stats["count"] >= at_least, stats
    assert stats["max"] < bound, stats


def rss_kb(pid: int) -> int:
    """The VmRSS of process ``pid``, KiB."""
    return RssWatch.rss_kb(pid)


def assert_clean_log(broker) -> None:
    """The broker's log holds no unhandled error."""
    log = broker.log()
    for word in UNHANDLED:
        assert word not in log, log[max(0, log.index(word) - 3000):log.index(word) + 3000]


def raise_fd_limit(wanted: int) -> None:
    """Raise this process's open-file limit (inherited by the brokers it
    starts) to ``wanted``, within the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert soft >= wanted, f"the open-file limit is {soft}; this test needs {wanted}"


class Hostile:
    """``python -m tests.faults.<module> ARGS`` in a process of its own; its
    JSON report read when it ends."""

    def __init__(self, module: str, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", f"tests.faults.{module}", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                     cwd=REPO_ROOT)

    def wait_started(self, timeout: float = 30.0) -> None:
        """Wait for the process's ``started`` line (at most ``timeout`` s)."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        assert line.strip() == b"started", (
            f"the hostile process did not start in {timeout} s: {line!r} "
            f"{self.proc.stderr.read().decode()[-3000:] if self.proc.poll() is not None else ''}")

    def report(self, timeout: float = 120.0) -> dict:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"the hostile process did not end: {err.decode()[-3000:]}")
        assert self.proc.returncode == 0, err.decode()[-3000:]
        return json.loads(out.decode().strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
