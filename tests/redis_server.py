"""A real Redis server for the tests.

:func:`redis_server` (a session-scoped pytest fixture, imported by
``tests/conftest.py``) runs Debian's ``redis-server`` (``apt-get install
redis-server``, or the binary in ``TBMQ_REDIS_SERVER``) once per test run,
on a free loopback port, in a temporary directory, with persistence off
(``--save '' --appendonly no``), and yields its :class:`RedisServer`;
:func:`redis_url` yields its URL.  A test that stops the server (an
outage) starts one of its own: :class:`RedisServer` can be stopped and
started again on the same port.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Iterator

import pytest

__all__ = ["RedisServer", "find_redis_server", "redis_server", "redis_url"]

#: Seconds to wait for the server to answer PING.
START_TIMEOUT = 30.0


def find_redis_server() -> str:
    """:returns: the path of ``redis-server``.
    :raises pytest.fail.Exception: when it is not installed."""
    path = os.environ.get("TBMQ_REDIS_SERVER") or shutil.which("redis-server")
    if not path or not os.path.isfile(path):
        pytest.fail("redis-server not found: install Debian's package 'redis-server' "
                    "(apt-get install -y redis-server) or set TBMQ_REDIS_SERVER")
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ping(port: int, timeout: float = 1.0) -> bool:
    """:returns: True when a Redis server on 127.0.0.1:``port`` answers
    PING (spoken over a plain socket: the tests' own reactor stays out)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))  # up, with a password
    except OSError:
        return False


class RedisServer:
    """A ``redis-server`` process on 127.0.0.1, in a directory of its own.

    :param port: the port; a free one when None.
    :param args: more ``redis-server`` options (``["--requirepass", "x"]``).
    :ivar port: the port it listens on, kept across :meth:`stop` and
        :meth:`start`.
    :ivar url: ``redis://127.0.0.1:<port>/0``.
    """

    def __init__(self, port: int | None = None, args: list[str] = ()) -> None:
        self.binary = find_redis_server()
        self.args = list(args)
        self.port = port or _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.directory = tempfile.mkdtemp(prefix="tbmq-redis-")
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the server (on the same port as before) and wait until it
        answers PING.

        :raises pytest.fail.Exception: when it exits or does not answer in
            :data:`START_TIMEOUT` seconds."""
        log_path = os.path.join(self.directory, "server.log")
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", self.directory, *self.args],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.directory)
        deadline = time.monotonic() + START_TIMEOUT
        while not ping(self.port):
            if self.process.poll() is not None:
                with open(log_path, errors="replace") as f:
                    pytest.fail(f"redis-server exited with {self.process.returncode}:\n"
                                f"{f.read()}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"redis-server did not answer in {START_TIMEOUT:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill the server (SIGKILL: an outage, not a shutdown) and wait
        for it to exit."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(30)

    def close(self) -> None:
        """Stop it and remove its directory."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A Redis server for the whole test run; do not stop it (start a
    :class:`RedisServer` of your own for that).

    :returns: (yields) the running :class:`RedisServer`.
    """
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    """:returns: the URL of :func:`redis_server`."""
    return redis_server.url
