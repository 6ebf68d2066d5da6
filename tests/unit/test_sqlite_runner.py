"""The SQLite runner shared by the stores (:mod:`tbmq.backends.sqlite_runner`):
one runner per file, one thread for several files, schema versions kept per
store kind, files of the previous layout opened and migrated.

The behaviour every store sees (batches, savepoints, life cycle) is checked
through the stores in ``test_stores.py`` and ``test_credentials.py``; this
file checks what only sharing shows.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from typing import Any

import pytest

from tbmq.backends.sqlite import SQLiteStore
from tbmq.backends.sqlite_credentials import (
    FILE_NAME as CREDENTIALS_FILE,
)
from tbmq.backends.sqlite_credentials import (
    SQLiteCredentialStore,
    make_sqlite_credential_store,
)
from tbmq.backends.sqlite_runner import (
    DatabaseThread,
    Schema,
    SQLiteDatabases,
    SQLiteRunner,
)
from tbmq.backends.sqlite_schema import SCHEMA_VERSION
from tbmq.config import load_config
from tbmq.embedded import EmbeddedBackends
from tbmq.errors import BackendError
from tbmq.model import Credentials, CredentialsType
from tests.helpers import TABLES_V1
from tests.unit.test_stores import (
    ManualThreadPool,
    delivery,
    SyncReactor,
    SyncThreadPool,
    failure_of,
    fired,
    message,
)


def creds(name: str) -> Credentials:
    return Credentials(id=str(uuid.uuid4()), name=name,
                       credentials_type=CredentialsType.MQTT_BASIC,
                       credentials_id=f"client_id|{name}")


def sync_databases() -> SQLiteDatabases:
    return SQLiteDatabases(reactor=SyncReactor(), threadpool=SyncThreadPool())


def table_names(path: str) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()


# -- one runner per file, one thread -----------------------------------------------------


def test_one_runner_per_file_whatever_its_spelling(tmp_path):
    databases = sync_databases()
    first = databases.runner(str(tmp_path / "a.sqlite3"))
    assert databases.runner(str(tmp_path / "x" / ".." / "a.sqlite3")) is first
    other = databases.runner(str(tmp_path / "b.sqlite3"))
    assert other is not first
    assert first.thread is other.thread is databases.thread


def test_conflicting_options_for_one_file_are_refused(tmp_path):
    databases = sync_databases()
    path = str(tmp_path / "a.sqlite3")
    databases.runner(path, synchronous="NORMAL")
    with pytest.raises(ValueError, match="synchronous"):
        databases.runner(path, synchronous="FULL")
    with pytest.raises(ValueError, match="busy_timeout"):
        databases.runner(path, busy_timeout=1.0)
    assert databases.runner(path, synchronous="normal").synchronous == "NORMAL"


def test_stores_of_one_file_share_one_connection(tmp_path):
    """The message store and the credential store in one file: one runner,
    one connection, both schemas, one transaction for calls made together."""
    pool = ManualThreadPool()
    databases = SQLiteDatabases(reactor=SyncReactor(), threadpool=pool)
    runner = databases.runner(str(tmp_path / "one.sqlite3"))
    store = SQLiteStore(runner=runner)
    credentials = SQLiteCredentialStore(runner=runner)
    started = [store.retained.start(), credentials.start()]
    assert len(pool.jobs) == 1  # one open for both
    pool.run_one()
    assert all(fired(d) is None for d in started)
    saved = credentials.save(creds("a"))
    retained = store.retained.put(message("a", b"1"))
    assert len(pool.jobs) == 1  # the save went at once; the put waits
    pool.run_all()
    listed = credentials.list()
    loaded = store.retained.load_all()
    assert len(pool.jobs) == 1  # both reads in one batch
    pool.run_all()
    assert fired(listed) == [fired(saved)] and fired(retained) is None
    assert fired(loaded) == [message("a", b"1")]
    fired_stop = credentials.stop()
    pool.run_all()
    assert fired(fired_stop) is None
    assert runner.running  # the retained store still uses the file
    stopped = store.retained.stop()
    pool.run_all()
    assert fired(stopped) is None and not runner.running
    assert {"retained", "deliveries", "topic_log", "mqtt_client_credentials",
            "tbmq_schema"} <= table_names(runner.path)
    conn = sqlite3.connect(runner.path)
    try:
        versions = dict(conn.execute("SELECT name, version FROM tbmq_schema"))
    finally:
        conn.close()
    assert versions == {"embedded": SCHEMA_VERSION, "credentials": 1}


def test_runners_share_one_owned_thread(tmp_path, monkeypatch):
    """Two files on one owned thread: it starts with the first runner and
    stops with the last (its pool is
    a synchronous stand-in)."""

    class Reactor(SyncReactor):
        def __init__(self) -> None:
            self.triggers: list = []

        def addSystemEventTrigger(self, *args: Any) -> Any:
            self.triggers.append(args)
            return len(self.triggers)

        def removeSystemEventTrigger(self, trigger: Any) -> None:
            self.triggers[trigger - 1] = None

    reactor = Reactor()
    thread = DatabaseThread(reactor)
    made: list = []

    class Pool(SyncThreadPool):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.started = self.stopped = False
            made.append(self)

        def start(self) -> None:
            self.started = True

        def stop(self) -> None:
            self.stopped = True

    monkeypatch.setattr("tbmq.backends.sqlite_runner.JobThread", Pool)
    one = SQLiteRunner(str(tmp_path / "1.sqlite3"), thread=thread)
    two = SQLiteRunner(str(tmp_path / "2.sqlite3"), thread=thread)
    fired(one.start())
    fired(two.start())
    assert len(made) == 1 and made[0].started
    assert len([t for t in reactor.triggers if t]) == 2  # each flushes at shutdown
    fired(one.stop())
    assert not made[0].stopped and thread.pool is made[0]
    fired(two.stop())
    assert made[0].stopped and thread.pool is None
    assert reactor.triggers == [None, None]
    fired(one.start())  # a new pool for a new start
    assert len(made) == 2
    fired(one.stop())


def test_embedded_default_shares_one_thread(tmp_path):
    config = load_config(None, environ={"TBMQ_STORAGE__MAX_MESSAGES_PER_CLIENT": "7"},
                         overrides={"data_dir": str(tmp_path / "d")})
    plugin = EmbeddedBackends()
    retained = plugin.tbmq_retained_store(config=config)
    devices = plugin.tbmq_device_message_store(config=config)
    credentials = plugin.tbmq_credential_store(config=config)
    bus = plugin.tbmq_message_bus(config=config, clock=SyncReactor())
    assert retained.runner is devices.runner is bus.topic_log.runner
    assert devices.max_messages_per_client == 7
    assert retained.runner.path == os.path.join(str(tmp_path / "d"), "tbmq.sqlite3")
    assert credentials.path == os.path.join(str(tmp_path / "d"), CREDENTIALS_FILE)
    assert credentials.runner is not retained.runner
    assert credentials.runner.thread is retained.runner.thread
    assert credentials.synchronous == retained.runner.synchronous == "FULL"
    assert credentials.runner.private and not retained.runner.private
    # tbmq credentials: a store of its own, on the reactor the command runs on
    reactor = SyncReactor()
    own = plugin.tbmq_credential_store(config=config, reactor=reactor)
    assert own.path == credentials.path
    assert own.runner is not credentials.runner and own.runner.thread.reactor is reactor


def test_embedded_memory_store_takes_the_limit(tmp_path):
    config = load_config(None, environ={}, overrides={
        "data_dir": str(tmp_path), "storage": {"backend": "memory", "max_messages_per_client": 2}})
    devices = EmbeddedBackends().tbmq_device_message_store(config=config)
    assert fired(devices.add("c", [delivery(1), delivery(2), delivery(3)])) == 1
    assert fired(devices.count("c")) == 2


def test_credential_factory_on_the_node_databases(tmp_path):
    config = load_config(None, environ={}, overrides={
        "data_dir": str(tmp_path), "storage": {"sqlite_synchronous": "NORMAL"}})
    databases = sync_databases()
    store = make_sqlite_credential_store(config, databases, busy_timeout=0.5)
    assert store.runner is databases.runner(store.path)
    assert (store.synchronous, store.busy_timeout) == ("NORMAL", 0.5)
    fired(store.start())
    saved = fired(store.save(creds("a")))
    assert fired(store.get(saved.id)) == saved
    fired(store.stop())


# -- schema versions ------------------------------------------------------------------------


#: Version 1 of the embedded schema, as the previous tbmq created it.
_OLD_EMBEDDED = TABLES_V1


def old_file(path: str, script: str, user_version: int = 1) -> None:
    """A file as the previous tbmq wrote it: the tables and PRAGMA
    user_version, no tbmq_schema."""
    conn = sqlite3.connect(path)
    try:
        conn.executescript(script)
        conn.execute(f"PRAGMA user_version={user_version}")
        conn.commit()
    finally:
        conn.close()


def test_a_file_of_the_previous_layout_keeps_its_data(tmp_path):
    path = str(tmp_path / "tbmq.sqlite3")
    old_file(path, _OLD_EMBEDDED
             + "INSERT INTO retained VALUES ('a', x'31', 0, 1, NULL, '', 0.0, NULL);")
    store = SQLiteStore(path, reactor=SyncReactor(), threadpool=SyncThreadPool())
    fired(store.start())
    assert fired(store.retained.load_all()) == [message("a", b"1", retain=True)]
    fired(store.stop())
    conn = sqlite3.connect(path)
    try:
        assert dict(conn.execute("SELECT name, version FROM tbmq_schema")) == {
            "embedded": SCHEMA_VERSION}
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()


def test_a_newer_schema_of_one_kind_is_refused(tmp_path):
    path = str(tmp_path / "tbmq.sqlite3")
    store = SQLiteStore(path, reactor=SyncReactor(), threadpool=SyncThreadPool())
    fired(store.start())
    fired(store.stop())
    conn = sqlite3.connect(path)
    newer = SCHEMA_VERSION + 1
    conn.execute("UPDATE tbmq_schema SET version = ? WHERE name = 'embedded'", (newer,))
    conn.commit()
    conn.close()
    error = failure_of(store.start()).value
    assert isinstance(error, BackendError) and f"embedded schema version {newer}" in str(error)
    assert not store.running
    # another kind of store in the same file is not held back by it
    credentials = SQLiteCredentialStore(path, reactor=SyncReactor(), threadpool=SyncThreadPool())
    fired(credentials.start())
    assert fired(credentials.list()) == []
    fired(credentials.stop())


def test_migrations_run_in_order(tmp_path):
    path = str(tmp_path / "m.sqlite3")
    v1 = Schema("things", 1, "things", "CREATE TABLE things (a INTEGER)")
    v3 = Schema("things", 3, "things", "CREATE TABLE things (a INTEGER, b, c)", {
        1: "ALTER TABLE things ADD COLUMN b; INSERT INTO things (a, b) VALUES (1, 'b')",
        2: "ALTER TABLE things ADD COLUMN c; UPDATE things SET c = b || 'c'",
    })

    def open_with(schema: Schema) -> list:
        runner = SQLiteRunner(path, SyncReactor(), SyncThreadPool())
        runner.attach(_Dummy(), schema)
        fired(runner.start())
        rows = fired(runner.submit(lambda c: c.execute("SELECT * FROM things").fetchall(),
                                   write=False))
        fired(runner.stop())
        return rows

    assert open_with(v1) == []
    assert open_with(v3) == [(1, "b", "bc")]
    assert open_with(v3) == [(1, "b", "bc")]  # migrated once
    # a step may be a function of the connection, in the opening transaction
    v4 = Schema("things", 4, "things", v3.create, {
        **v3.migrations, 3: lambda conn: conn.execute("UPDATE things SET a = a + 1")})
    assert open_with(v4) == [(2, "b", "bc")]

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM things")
        raise ValueError("cannot migrate")

    runner = SQLiteRunner(path, SyncReactor(), SyncThreadPool())
    runner.attach(_Dummy(), Schema("things", 5, "things", v3.create,
                                   {**v4.migrations, 4: broken}))
    failure_of(runner.start()).trap(ValueError)
    assert open_with(v4) == [(2, "b", "bc")]  # the failed open changed nothing
    with pytest.raises(ValueError):
        runner = SQLiteRunner(path, SyncReactor(), SyncThreadPool())
        runner.attach(_Dummy(), v1)
        runner.attach(_Dummy(), v3)


def test_a_schema_attached_while_open_is_applied_before_its_calls(tmp_path):
    runner = SQLiteRunner(str(tmp_path / "late.sqlite3"), SyncReactor(), SyncThreadPool())
    store = SQLiteStore(runner=runner)
    fired(store.start())
    credentials = SQLiteCredentialStore(runner=runner)
    saved = fired(credentials.save(creds("late")))
    assert fired(credentials.list()) == [saved]
    fired(store.stop())


class _Dummy:
    """A stand-in view: the runner only resets ``_started`` on it."""

    _started = False


def test_shutdown_waits_for_the_stores_to_stop_the_file_then_gives_up(tmp_path, monkeypatch):
    """The reactor's shutdown lets the node stop its stores in order (its
    last session records still need the file), for SHUTDOWN_GRACE seconds."""
    from twisted.internet import task

    class Reactor(SyncReactor, task.Clock):
        def __init__(self) -> None:
            task.Clock.__init__(self)
            self.triggers: list = []

        def addSystemEventTrigger(self, phase, event, f) -> Any:
            self.triggers.append(f)
            return len(self.triggers)

        def removeSystemEventTrigger(self, trigger: Any) -> None:
            self.triggers[trigger - 1] = None

    monkeypatch.setattr("tbmq.backends.sqlite_runner.JobThread",
                        lambda *a, **k: SyncThreadPool())
    monkeypatch.setattr(SyncThreadPool, "start", lambda self: None, raising=False)
    monkeypatch.setattr(SyncThreadPool, "stop", lambda self: None, raising=False)
    for user_stops in (True, False):
        reactor = Reactor()
        runner = SQLiteRunner(str(tmp_path / f"{user_stops}.sqlite3"),
                              thread=DatabaseThread(reactor))
        fired(runner.acquire())
        shutdown = reactor.triggers[0]()
        assert runner.running and not shutdown.called  # the store still writes
        fired(runner.submit(lambda conn: conn.execute("SELECT 1")))
        if user_stops:
            fired(runner.release())
        else:
            reactor.advance(SQLiteRunner.SHUTDOWN_GRACE)
        assert shutdown.called and not runner.running


def _made_by(obj, files: tuple) -> bool:
    """Whether ``obj`` (an object the collector found unreachable) is a
    function, frame or cell of code in one of ``files``."""
    import types  # noqa: PLC0415

    if isinstance(obj, types.CellType):
        try:
            obj = obj.cell_contents
        except ValueError:  # an empty cell
            return False
    if isinstance(obj, types.FunctionType):
        return obj.__code__.co_filename in files
    if isinstance(obj, types.FrameType):
        return obj.f_code.co_filename in files
    return False


def test_job_thread_runs_jobs_in_order_and_leaves_no_cyclic_garbage():
    """The owned database thread: jobs in order, each outcome to its
    ``on_result`` (a failure as a Failure), nothing a job used left for
    the cyclic collector (Twisted's ThreadPool leaves a closure cycle per
    job), and a stop after the queued jobs."""
    import gc  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from tbmq.backends.sqlite_runner import JobThread  # noqa: PLC0415

    outcomes: list = []
    done = threading.Event()

    def fail():
        raise ValueError("no")

    thread = JobThread("test-jobs")
    thread.start()
    gc.collect()
    gc.disable()
    try:
        for n in range(200):
            thread.callInThreadWithCallback(lambda ok, r: outcomes.append((ok, r)), int, str(n))
        thread.callInThreadWithCallback(lambda ok, r: outcomes.append((ok, r.type)), fail)
        thread.callInThreadWithCallback(lambda ok, r: done.set(), int)
        assert done.wait(10)
        assert outcomes.pop() == (False, ValueError)
        thread.callInThreadWithCallback(lambda ok, r: None, int)  # after the last job's end
        thread.stop()
        # what the jobs left for the collector: the unreachable objects made
        # by this test's or the runner's code (Twisted's ThreadPool: 830 for
        # these jobs, its closure cycle holding each job's callback); not
        # what other tests' threads still running make meanwhile
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        files = (__file__, sys.modules[JobThread.__module__].__file__)
        left = [o for o in gc.garbage if _made_by(o, files)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
    assert outcomes == [(True, n) for n in range(200)]
    thread.start()
    thread.callInThreadWithCallback(lambda ok, r: outcomes.append(r), int, "7")
    thread.stop()
    assert outcomes[-1] == 7


def test_job_thread_survives_a_result_handler_that_raises():
    """A result handler that raises is logged and the thread runs the next
    job (as Twisted's pool does): the database thread of a node never dies
    silently."""
    from tbmq.backends.sqlite_runner import JobThread  # noqa: PLC0415

    outcomes: list = []

    def broken(ok, result):
        raise RuntimeError("handler")

    thread = JobThread("test-jobs-raise")
    thread.start()
    thread.callInThreadWithCallback(broken, int, "1")
    thread.callInThreadWithCallback(lambda ok, r: outcomes.append((ok, r)), int, "2")
    thread.stop()
    assert outcomes == [(True, 2)]
