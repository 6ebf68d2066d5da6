"""A real PostgreSQL server for the tests, started once per test run.

:func:`postgres_dsn` (a session-scoped pytest fixture, imported by
``tests/conftest.py``) runs Debian's ``postgresql`` server binaries
(``apt-get install postgresql``; ``/usr/lib/postgresql/<version>/bin``, or
the directory in ``TBMQ_PG_BINDIR``): ``initdb`` into a fresh temporary
directory with trust authentication, then ``postgres`` listening on
127.0.0.1 on a free port (and a Unix socket in the same directory), with
durability switched off for speed.  It yields a libpq DSN of a database
made for the run, and stops the server (fast shutdown) and removes the
directory at the end.  PostgreSQL refuses to run as root, so under root the
server runs as the ``postgres`` user the package creates.

:func:`new_database` makes one more, empty database on that server, for a
test that needs its own.

Code that talks to PostgreSQL through adbapi needs a running reactor.
:func:`reactor_thread` (session-scoped) runs a private reactor — not the
global one, which the other tests keep to themselves — in a thread of its
own; :class:`ReactorThread` calls into it from the test and waits for the
answer, and :class:`Blocking` turns a Deferred-returning object into a
blocking one for a plain test function (:class:`InReactorThread` into one
returning fired Deferreds; :func:`failure_of` catches what a call raised).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Iterator

import pytest
from twisted.internet import defer
from twisted.internet.threads import blockingCallFromThread
from twisted.protocols.portforward import ProxyFactory, ProxyServer

__all__ = [
    "Blocking",
    "Proxy",
    "TcpProxy",
    "InReactorThread",
    "PostgresServer",
    "ReactorThread",
    "failure_of",
    "find_bindir",
    "new_database",
    "postgres_dsn",
    "reactor_thread",
    "started",
]

#: Seconds to wait for the server to accept connections.
START_TIMEOUT = 60.0


def find_bindir() -> str:
    """:returns: the directory of ``initdb`` and ``postgres``.
    :raises RuntimeError: when PostgreSQL is not installed."""
    candidates = []
    if os.environ.get("TBMQ_PG_BINDIR"):
        candidates.append(os.environ["TBMQ_PG_BINDIR"])

    def version(path: str) -> tuple:
        name = path.rstrip("/").split("/")[-2]
        return tuple(int(p) for p in name.split(".") if p.isdigit())

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(os.path.dirname(initdb))
    for directory in candidates:
        if os.path.isfile(os.path.join(directory, "initdb")) and os.path.isfile(
            os.path.join(directory, "postgres")
        ):
            return directory
    raise RuntimeError(
        "PostgreSQL server binaries not found: install Debian's package "
        "'postgresql' (apt-get install -y postgresql) or set TBMQ_PG_BINDIR"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connect(dsn: str):
    import psycopg2  # noqa: PLC0415

    return psycopg2.connect(dsn, connect_timeout=5)


def new_database(dsn: str, name: str | None = None) -> str:
    """Create an empty database on the server of ``dsn``.

    :param dsn: a DSN of any database of that server.
    :param name: the new database's name; a unique one when None.
    :returns: the DSN of the new database.
    """
    from psycopg2.extensions import make_dsn  # noqa: PLC0415

    name = name or f"tbmq_{uuid.uuid4().hex[:12]}"
    conn = _connect(dsn)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}" TEMPLATE template0 ENCODING \'UTF8\'')
    finally:
        conn.close()
    return make_dsn(dsn, dbname=name)


class PostgresServer:
    """Debian's PostgreSQL server binaries run on a free loopback port:
    ``initdb`` into a fresh temporary directory with trust authentication,
    durability off (a server for tests and benchmarks, never for data).

    :ivar admin_dsn: the DSN of its ``postgres`` database, ``str``.
    :raises RuntimeError: from :meth:`start`, when PostgreSQL is not
        installed, ``initdb`` fails, the server exits or does not accept
        connections within :data:`START_TIMEOUT` seconds (the message has
        the server's log).
    """

    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="tbmq-pg-")
        self.proc: subprocess.Popen | None = None
        self.admin_dsn = ""

    def start(self) -> "PostgresServer":
        """Start the server and wait until it accepts connections.

        :returns: self."""
        bindir = find_bindir()
        root = self.root
        data = os.path.join(root, "data")
        log_path = os.path.join(root, "server.log")
        kwargs: dict = {}
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root but there is no 'postgres' user: "
                                   "install 'postgresql'") from None
            os.chown(root, account.pw_uid, account.pw_gid)
            kwargs = dict(user=account.pw_uid, group=account.pw_gid, extra_groups=[])
        env = dict(os.environ, LC_ALL="C", HOME=root)
        try:
            subprocess.run(
                [os.path.join(bindir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres",
                 "-E", "UTF8", "--locale=C", "--no-sync"],
                check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=root,
                **kwargs,
            )
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"initdb failed: {e.stdout.decode(errors='replace')}") from None
        port = _free_port()
        with open(log_path, "ab") as log:
            if kwargs:
                os.chown(log_path, kwargs["user"], kwargs["group"])
            self.proc = subprocess.Popen(
                [os.path.join(bindir, "postgres"), "-D", data, "-k", root,
                 "-c", "listen_addresses=127.0.0.1", "-p", str(port),
                 "-c", "fsync=off", "-c", "synchronous_commit=off",
                 "-c", "full_page_writes=off", "-c", "max_connections=200"],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, **kwargs,
            )
        self.admin_dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                with open(log_path, errors="replace") as f:
                    raise RuntimeError(f"PostgreSQL exited with {self.proc.returncode}:\n{f.read()}")
            try:
                _connect(self.admin_dsn).close()
                return self
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start in {START_TIMEOUT:.0f} s") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its directory."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A PostgreSQL server (:class:`PostgresServer`) for the whole test run.

    :returns: (yields) a libpq DSN, ``host=127.0.0.1 port=... user=postgres
        dbname=tbmq_test``, of an empty database.
    """
    server = PostgresServer()
    try:
        try:
            server.start()
        except RuntimeError as e:
            pytest.fail(str(e))
        yield new_database(server.admin_dsn, "tbmq_test")
    finally:
        server.stop()


class ReactorThread:
    """A private reactor (:class:`~twisted.internet.pollreactor.PollReactor`,
    never installed as the global one) running in a daemon thread.

    :ivar reactor: the reactor; give it to the code under test.
    """

    def __init__(self) -> None:
        from twisted.internet.pollreactor import PollReactor  # noqa: PLC0415

        self.reactor = PollReactor()
        self._thread = threading.Thread(
            target=self.reactor.run, kwargs={"installSignalHandlers": False},
            name="test-reactor", daemon=True)
        self._thread.start()
        self.call(lambda: None)  # wait until it runs

    def in_thread(self) -> bool:
        """:returns: True when called from the reactor thread itself."""
        return threading.current_thread() is self._thread

    def call(self, f: Callable, *args: Any, **kwargs: Any) -> Any:
        """Call ``f`` in the reactor thread and wait for its result (a
        Deferred's result when it returns one).

        :raises: the exception it raised, or its Deferred's failure.
        """
        return blockingCallFromThread(self.reactor, f, *args, **kwargs)

    def run(self, coroutine_function: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``await coroutine_function(*args, **kwargs)`` in the reactor
        thread and wait for its result."""
        return self.call(lambda: defer.ensureDeferred(coroutine_function(*args, **kwargs)))

    def stop(self) -> None:
        """Stop the reactor (its shutdown triggers run) and the thread."""
        if self.reactor.running:
            self.reactor.callFromThread(self.reactor.stop)
        self._thread.join(30)


class Blocking:
    """A blocking face of an object whose methods return Deferreds: each
    method call runs in the reactor thread and returns the result (or
    raises the failure).

    :ivar target: the wrapped object.
    """

    def __init__(self, reactor_thread: ReactorThread, target: Any) -> None:
        self.target = target
        self._rt = reactor_thread

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.target, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._answer(attribute, args, kwargs)

        return call

    def _answer(self, method: Callable, args: tuple, kwargs: dict) -> Any:
        """Call ``method`` in the reactor thread; :returns: its result."""
        return self._rt.call(method, *args, **kwargs)


class InReactorThread(Blocking):
    """The face of an object that lives in a :class:`ReactorThread`: each
    method call runs there, waits, and returns an already-fired Deferred
    with its outcome (for tests written against Deferred-returning
    objects).

    :ivar target: the wrapped object.
    """

    def _answer(self, method: Callable, args: tuple, kwargs: dict) -> defer.Deferred:
        try:
            return defer.succeed(super()._answer(method, args, kwargs))
        except Exception:
            return defer.fail()


def failure_of(f: Callable, *args: Any) -> BaseException:
    """:returns: the exception ``f(*args)`` raised (a :class:`Blocking`
    method's failure, say).
    :raises AssertionError: when it returned."""
    try:
        f(*args)
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError("the call did not fail")


class TcpProxy:
    """A TCP proxy on the reactor thread to ``host:port``, listening on a
    port of its own: an outage is that port closed and its connections cut
    (:meth:`down`); :meth:`up` listens again on the same port.

    :ivar port_number: the port it listens on.
    """

    def __init__(self, reactor_thread: Any, host: str, port: int,
                 listen_port: int = 0) -> None:
        self.rt = reactor_thread
        self.factory = ProxyFactory(host, port)
        self.servers: list = []
        proxy = self

        class Server(ProxyServer):
            reactor = reactor_thread.reactor

            def connectionMade(self) -> None:
                proxy.servers.append(self)
                super().connectionMade()

        self.factory.protocol = Server
        self.port_number = listen_port
        self.listening: Any = None
        self.up()

    def up(self) -> None:
        def listen() -> None:
            self.listening = self.rt.reactor.listenTCP(
                self.port_number, self.factory, interface="127.0.0.1")
            self.port_number = self.listening.getHost().port

        self.rt.call(listen)

    def down(self) -> None:
        def cut() -> defer.Deferred:
            for server in self.servers:
                server.transport.abortConnection()
                if server.peer is not None:
                    server.peer.transport.abortConnection()
            self.servers.clear()
            return self.listening.stopListening()

        self.rt.call(cut)


class Proxy(TcpProxy):
    """A :class:`TcpProxy` to the PostgreSQL server of ``dsn``.

    :ivar dsn: ``dsn`` through the proxy (3 s connect timeout).
    """

    def __init__(self, reactor_thread: Any, dsn: str) -> None:
        import psycopg2.extensions  # noqa: PLC0415

        params = psycopg2.extensions.parse_dsn(dsn)
        super().__init__(reactor_thread, params["host"], int(params["port"]))
        self.dsn = psycopg2.extensions.make_dsn(dsn, port=self.port_number, connect_timeout=3)


@pytest.fixture(scope="session")
def reactor_thread() -> Iterator[ReactorThread]:
    """:returns: (yields) a :class:`ReactorThread`, stopped at the end of
    the run."""
    thread = ReactorThread()
    yield thread
    thread.stop()


@pytest.fixture
def started(reactor_thread: ReactorThread) -> Iterator[Callable[[Callable[[], Any]], Blocking]]:
    """``started(make)``: the backend ``make()`` builds in the reactor
    thread, started, as a :class:`Blocking`; stopped at the end of the
    test."""
    backends: list[Blocking] = []

    def start(make: Callable[[], Any]) -> Blocking:
        backend = Blocking(reactor_thread, reactor_thread.call(make))
        backend.start()
        backends.append(backend)
        return backend

    yield start
    for backend in backends:
        backend.stop()
