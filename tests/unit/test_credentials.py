"""The contract suite of :class:`~tbmq.interfaces.ICredentialStore`, run
against every backend: memory, SQLite and a real PostgreSQL
(:mod:`tests.postgres`).

The suite is written once: the ``store`` fixture is parametrised over
:data:`BACKENDS` (a class with ``open(reactor)`` per backend), the
``durable`` fixture over those whose records survive a restart.  Stores run
on a private reactor in a thread of its own (:mod:`tests.postgres`), and the
tests call them through :class:`~tests.postgres.Blocking`, which waits for
each Deferred.  The memory store answers at once, the SQLite store runs on a
synchronous thread pool here (its own thread in the SQLite-specific tests at
the end), the PostgreSQL store on adbapi's pool threads.  Each PostgreSQL
test gets a database of its own.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import stat
import uuid
from typing import Any, Callable

import pytest
from tbmq_plugins.postgres import PostgresCredentialStore, PostgresPlugin
from twisted.internet import defer
from twisted.python.failure import Failure
from zope.interface.verify import verifyObject

from tbmq.backends.memory_credentials import MemoryCredentialStore
from tbmq.backends.sqlite_credentials import (
    FILE_NAME,
    SQLiteCredentialStore,
    make_sqlite_credential_store,
)
from tbmq.config import load_config
from tbmq.errors import BackendError, CredentialsError
from tbmq.interfaces import ICredentialStore
from tbmq.model import ClientType, Credentials, CredentialsType
from tests.postgres import Blocking, failure_of, new_database

BASIC, X509, SCRAM = CredentialsType.MQTT_BASIC, CredentialsType.X_509, CredentialsType.SCRAM


# -- synchronous stand-ins for the SQLite store's thread -------------------------------


class SyncReactor:
    """Runs ``callFromThread`` at once (there is only one thread)."""

    def callFromThread(self, f: Callable, *args: Any, **kwargs: Any) -> None:
        f(*args, **kwargs)


class SyncThreadPool:
    """Runs each job at once in the calling thread."""

    def callInThreadWithCallback(
        self, on_result: Callable, f: Callable, *args: Any, **kwargs: Any
    ) -> None:
        try:
            result = f(*args, **kwargs)
        except BaseException:
            on_result(False, Failure())
        else:
            on_result(True, result)


class Clock:
    """A wall clock that moves one second per reading."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


# -- backends -------------------------------------------------------------------------


class MemoryBackend:
    durable = False

    def __init__(self, request: Any, tmp_path: Any) -> None:
        self.clock = Clock()

    def open(self, reactor: Any) -> Any:
        return MemoryCredentialStore(clock=self.clock)


class SQLiteBackend:
    durable = True

    def __init__(self, request: Any, tmp_path: Any) -> None:
        self.clock = Clock()
        self.path = str(tmp_path / "data" / FILE_NAME)

    def open(self, reactor: Any) -> Any:
        return SQLiteCredentialStore(
            self.path, reactor=SyncReactor(), threadpool=SyncThreadPool(), clock=self.clock
        )


class PostgresBackend:
    durable = True

    def __init__(self, request: Any, tmp_path: Any) -> None:
        self.clock = Clock()
        self.dsn = new_database(request.getfixturevalue("postgres_dsn"))

    def open(self, reactor: Any) -> Any:
        return PostgresCredentialStore(self.dsn, 1, 3, reactor=reactor, clock=self.clock)


BACKENDS = {"memory": MemoryBackend, "sqlite": SQLiteBackend, "postgres": PostgresBackend}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request, tmp_path):
    return BACKENDS[request.param](request, tmp_path)


@pytest.fixture(params=sorted(name for name, cls in BACKENDS.items() if cls.durable))
def durable(request, tmp_path):
    return BACKENDS[request.param](request, tmp_path)


@pytest.fixture
def store(backend, reactor_thread):
    store = Blocking(reactor_thread, backend.open(reactor_thread.reactor))
    store.start()
    yield store
    store.stop()


def opened(backend: Any, reactor_thread: Any) -> Blocking:
    """A new store of ``backend`` (not started), blocking."""
    return Blocking(reactor_thread, backend.open(reactor_thread.reactor))


def creds(name: str = "dev", credentials_id: str | None = None, kind: CredentialsType = BASIC,
          **kwargs: Any) -> Credentials:
    """A record with a fresh id."""
    return Credentials(
        id=kwargs.pop("id", None) or str(uuid.uuid4()),
        name=name,
        credentials_type=kind,
        credentials_id=credentials_id or f"client_id|{name}",
        **kwargs,
    )


# -- the contract ---------------------------------------------------------------------


def test_provides_the_interface(backend):
    assert verifyObject(ICredentialStore, backend.open(None))


def test_find_by_type_and_credentials_id(store):
    basic = store.save(creds("a", "username|bob"))
    # the same lookup key under another type is another record
    cert = store.save(creds("b", "username|bob", X509, client_type=ClientType.APPLICATION))
    assert store.find(BASIC, "username|bob") == basic
    assert store.find("X_509", "username|bob") == cert
    assert (store.find(X509, "username|bob")).client_type is ClientType.APPLICATION
    assert store.find(SCRAM, "username|bob") is None
    assert store.find(BASIC, "username|Bob") is None
    assert store.find("NO_SUCH_TYPE", "username|bob") is None


def test_find_all_by_type(store):
    store.save(creds("z-cert", "z.example", X509))
    store.save(creds("basic", "client_id|c"))
    regex = {"certCnPattern": "dev-.*", "certCnIsRegex": True}
    store.save(creds("a-cert", "dev-.*", X509, value=regex))
    found = store.find_all(X509)
    assert [c.name for c in found] == ["a-cert", "z-cert"]
    assert found[0].value == {"certCnPattern": "dev-.*", "certCnIsRegex": True}
    assert store.find_all(SCRAM) == []
    assert [c.name for c in store.find_all("MQTT_BASIC")] == ["basic"]


def test_get(store):
    saved = store.save(creds("a"))
    assert store.get(saved.id) == saved
    assert store.get("no-such-id") is None


def test_list_is_ordered_by_name(store):
    assert store.list() == []
    names = ["b", "A", "a", "\u00e4", "Z10", "Z2", "\u65e5\u672c"]
    for name in names:
        store.save(creds(name))
    assert [c.name for c in store.list()] == sorted(names)


def test_save_new_sets_both_times(store, backend):
    record = creds("a", value={"clientId": "a"})
    saved = store.save(record)
    assert saved.created_time == saved.updated_time == backend.clock.now
    assert record.created_time == record.updated_time == 0.0  # the argument is not modified
    assert dataclasses.replace(saved, created_time=0.0, updated_time=0.0) == record
    assert store.get(record.id) == saved


def test_save_replaces_by_id_and_keeps_created_time(store):
    first = store.save(creds("a", "client_id|a", value={"v": 1}))
    second = store.save(dataclasses.replace(
        first, name="renamed", credentials_id="username|u", client_type=ClientType.APPLICATION,
        value={"v": 2}, created_time=0.0, updated_time=0.0))
    assert second.created_time == first.created_time
    assert second.updated_time > first.updated_time
    assert store.get(first.id) == second
    assert [c.name for c in store.list()] == ["renamed"]
    assert store.find(BASIC, "client_id|a") is None  # the old key is free
    assert store.find(BASIC, "username|u") == second
    # the freed name and key can be taken by another record
    store.save(creds("a", "client_id|a"))


def test_updated_time_moves_on_every_save(store):
    saved = store.save(creds("a"))
    times = [saved.updated_time]
    for _ in range(3):
        saved = store.save(saved)
        times.append(saved.updated_time)
    assert times == sorted(set(times))


def test_unique_name(store):
    first = store.save(creds("same", "client_id|1"))
    error = failure_of(store.save, creds("same", "client_id|2"))
    assert isinstance(error, CredentialsError)
    assert "same" in str(error)
    assert store.list() == [first]
    assert store.find(BASIC, "client_id|2") is None


def test_unique_type_and_credentials_id(store):
    first = store.save(creds("one", "mixed|c|u"))
    error = failure_of(store.save, creds("two", "mixed|c|u"))
    assert isinstance(error, CredentialsError)
    assert "mixed|c|u" in str(error)
    assert store.list() == [first]
    # renaming into a conflict fails too, and changes nothing
    other = store.save(creds("other", "client_id|x"))
    error = failure_of(store.save, dataclasses.replace(other, credentials_id="mixed|c|u"))
    assert isinstance(error, CredentialsError)
    assert store.get(other.id) == other


@pytest.mark.parametrize(
    "change",
    [
        {"name": ""},
        {"credentials_id": ""},
        {"id": ""},
        {"credentials_type": "NOPE"},
        {"client_type": "ROBOT"},
        {"value": {"password": b"bytes"}},
        {"value": {"authRules": {"pubAuthRulePatterns": ["a/(b"]}}},
        {"value": {"authRules": {"subAuthRulePatterns": "not a list"}}},
    ],
)
def test_invalid_records_are_refused(store, change):
    record = creds("a")
    for key, value in change.items():
        object.__setattr__(record, key, value)
    error = failure_of(store.save, record)
    assert isinstance(error, CredentialsError), error
    assert store.list() == []


def test_delete(store):
    keep = store.save(creds("keep"))
    gone = store.save(creds("gone", "username|g"))
    assert store.delete(gone.id) is True
    assert store.get(gone.id) is None
    assert store.find(BASIC, "username|g") is None
    assert store.list() == [keep]
    assert store.delete(gone.id) is False
    assert store.delete("never-was") is False
    store.save(creds("gone", "username|g"))  # name and key are free again


def test_changed_since(store):
    changed, deleted, v0 = store.changed_since(0)
    assert (changed, deleted) == ([], [])
    a = store.save(creds("a"))
    b = store.save(creds("b"))
    changed, deleted, v1 = store.changed_since(v0)
    assert (changed, deleted) == ([a, b], [])
    assert v1 > v0
    assert store.changed_since(v1) == ([], [], v1)  # nothing new since
    a2 = store.save(dataclasses.replace(a, value={"v": 2}))
    assert store.delete(b.id)
    changed, deleted, v2 = store.changed_since(v1)
    assert (changed, deleted) == ([a2], [b.id])
    assert v2 > v1
    assert store.changed_since(v2) == ([], [], v2)
    # from the start: what exists, and what was deleted
    assert store.changed_since(0) == ([a2], [b.id], v2)
    # saved then deleted in between: only the delete is reported
    c = store.save(creds("c"))
    store.delete(c.id)
    changed, deleted, v3 = store.changed_since(v2)
    assert (changed, deleted) == ([], [c.id])
    # deleted then saved again: only the save is reported
    b2 = store.save(b)
    changed, deleted, v4 = store.changed_since(v3)
    assert (changed, deleted) == ([b2], [])
    assert store.changed_since(v4) == ([], [], v4)
    # a failed save changes nothing
    failure_of(store.save, creds("a"))
    assert store.changed_since(v4) == ([], [], v4)


def test_values_round_trip(store):
    value = {
        "clientId": "ger\u00e4t-\u65e5\u672c",
        "userName": None,
        "password": "$2b$10$abcdefghijklmnopqrstuu",
        "nested": {"list": [1, 2.5, True, False, None, "\u00fc", {"deep": ["x"]}], "empty": {}},
        "authRules": {"pubAuthRulePatterns": ["sensors/${clientId}/.*"], "subAuthRulePatterns": []},
        "quote\"and\\backslash": "tab\tnewline\n",
        "emoji": "\U0001f600",
    }
    name, key = "G\u00e9r\u00e4t \u2116 1", "client_id|\u00e4\u00f6\u00fc"
    saved = store.save(creds(name, key, value=value))
    for found in (
        store.get(saved.id),
        store.find(BASIC, key),
        (store.list())[0],
        (store.changed_since(0))[0][0],
    ):
        assert found == saved
        assert found.value == value
        assert found.credentials_type is BASIC
        assert found.client_type is ClientType.DEVICE


def test_records_are_copies(store):
    record = creds("a", value={"list": [1]})
    saved = store.save(record)
    record.value["list"].append(2)
    saved.value["list"].append(3)
    got = store.get(saved.id)
    assert got.value == {"list": [1]}
    got.value["list"].append(4)
    assert (store.get(saved.id)).value == {"list": [1]}


def test_calls_in_order(store, reactor_thread):
    """Calls made without waiting are applied in the order they were made."""
    record = creds("a")
    results = reactor_thread.call(lambda: defer.gatherResults([
        store.target.save(dataclasses.replace(record, value={"n": n})) for n in range(5)]))
    assert [r.value["n"] for r in results] == list(range(5))
    assert (store.get(record.id)).value == {"n": 4}


# -- durable backends -----------------------------------------------------------------


def test_records_survive_a_restart(durable, reactor_thread):
    store = opened(durable, reactor_thread)
    store.start()
    kept = store.save(creds("kept", value={"authRules": {"pubAuthRulePatterns": ["a"]}}))
    changed = store.save(creds("changed"))
    gone = store.save(creds("gone"))
    changed = store.save(dataclasses.replace(changed, value={"v": 2}))
    store.delete(gone.id)
    _, _, version = store.changed_since(0)
    store.stop()

    store = opened(durable, reactor_thread)
    store.start()
    try:
        assert store.list() == [changed, kept]
        assert store.find(BASIC, changed.credentials_id) == changed
        assert store.changed_since(version) == ([], [], version)
        assert store.changed_since(0) == ([changed, kept], [gone.id], version)
        again = store.save(kept)
        assert again.created_time == kept.created_time
        changed_now, deleted, new_version = store.changed_since(version)
        assert (changed_now, deleted) == ([again], [])
        assert new_version > version
    finally:
        store.stop()


def test_stopped_store_refuses_calls(durable, reactor_thread):
    store = opened(durable, reactor_thread)
    error = failure_of(store.list)
    assert isinstance(error, BackendError)
    store.start()
    store.start()  # idempotent
    store.save(creds("a"))
    store.stop()
    store.stop()
    error = failure_of(store.save, creds("b"))
    assert isinstance(error, BackendError)


# -- SQLite ---------------------------------------------------------------------------


def test_sqlite_factory_uses_the_data_dir(tmp_path):
    config = load_config(None, environ={}, overrides={"data_dir": str(tmp_path / "d")})
    store = make_sqlite_credential_store(config)
    assert store.path == os.path.join(str(tmp_path / "d"), "credentials.sqlite3")
    assert store.synchronous == config.storage.sqlite_synchronous
    assert isinstance(store, SQLiteCredentialStore)


def test_sqlite_file_is_private_and_in_wal_mode(tmp_path, reactor_thread):
    path = str(tmp_path / "new" / FILE_NAME)
    store = Blocking(reactor_thread, SQLiteCredentialStore(
        path, reactor=SyncReactor(), threadpool=SyncThreadPool()))
    store.start()
    store.save(creds("a"))
    store.stop()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        columns = {row[1] for row in conn.execute("PRAGMA table_info(mqtt_client_credentials)")}
        assert {"id", "created_time", "name", "client_type", "credentials_id",
                "credentials_type", "credentials_value", "version"} <= columns
    finally:
        conn.close()


def test_sqlite_calls_made_while_busy_share_one_thread_job(tmp_path):
    """A burst of lookups (many CONNECTs at once) costs one round trip to the
    database thread, in order, each call rolled back alone when it fails;
    calls made while the file opens wait for it; calls queued when stop()
    is called still run, before the close."""
    from tests.unit.test_stores import ManualThreadPool, fired  # noqa: PLC0415

    pool = ManualThreadPool()
    store = SQLiteCredentialStore(str(tmp_path / FILE_NAME), reactor=SyncReactor(),
                                  threadpool=pool, clock=Clock())
    started = store.start()
    saved = store.save(creds("a"))
    assert len(pool.jobs) == 1  # the open; the save waits for it
    pool.run_one()
    assert fired(started) is None
    finds = [store.find(BASIC, "client_id|a") for _ in range(50)]
    bad = store.save(creds("b", credentials_id="client_id|a"))  # the same key: refused
    missing = store.find(BASIC, "client_id|nobody")
    assert len(pool.jobs) == 1  # the save still runs; the 52 calls wait
    pool.run_one()
    saved = fired(saved)
    assert not finds[0].called
    assert len(pool.jobs) == 1  # handed together
    late = store.list()  # waits for that job
    stopped = store.stop()
    assert len(pool.jobs) == 1  # the 52 calls; the list, then the close, wait for them
    pool.run_one()
    assert all(fired(d) == saved for d in finds)
    with pytest.raises(CredentialsError):
        fired(bad)
    assert fired(missing) is None
    pool.run_all()
    assert fired(late) == [saved]
    assert fired(stopped) is None
    with pytest.raises(BackendError):
        fired(store.list())


def test_sqlite_newer_schema_is_refused(tmp_path, reactor_thread):
    path = str(tmp_path / FILE_NAME)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    store = Blocking(reactor_thread, SQLiteCredentialStore(
        path, reactor=SyncReactor(), threadpool=SyncThreadPool()))
    error = failure_of(store.start)
    assert isinstance(error, BackendError) and "99" in str(error)
    assert not store.running


def test_sqlite_in_its_own_thread_sees_another_process_writes(tmp_path, reactor_thread):
    """The broker's store (its own thread) and the CLI's (here another
    store on the same file) share the file: WAL readers, one writer at a
    time, changes found by changed_since."""
    path = str(tmp_path / FILE_NAME)
    broker = Blocking(reactor_thread, SQLiteCredentialStore(path, reactor=reactor_thread.reactor))
    cli = Blocking(reactor_thread, SQLiteCredentialStore(path, reactor=reactor_thread.reactor))
    broker.start()
    cli.start()
    try:
        _, _, version = broker.changed_since(0)
        saved = cli.save(creds("from-cli", value={"password": None}))
        changed, deleted, version2 = broker.changed_since(version)
        assert (changed, deleted) == ([saved], [])
        both = reactor_thread.call(lambda: defer.gatherResults(
            [broker.target.save(creds(f"b{i}")) for i in range(10)]
            + [cli.target.save(creds(f"c{i}")) for i in range(10)]))
        changed, _, version3 = broker.changed_since(version2)
        assert sorted(c.name for c in changed) == sorted(c.name for c in both)
        assert version3 == version2 + 20
        assert cli.delete(saved.id)
        assert broker.changed_since(version3) == ([], [saved.id], version3 + 1)
    finally:
        cli.stop()
        broker.stop()
    assert broker.target.runner.thread.pool is None and cli.target.runner.thread.pool is None


def test_sqlite_write_lock_held_too_long_is_a_backend_error(tmp_path, reactor_thread):
    path = str(tmp_path / FILE_NAME)
    store = Blocking(reactor_thread, SQLiteCredentialStore(
        path, reactor=reactor_thread.reactor, busy_timeout=0.2))
    store.start()
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        assert store.list() == []  # readers are not blocked (WAL)
        error = failure_of(store.save, creds("a"))
        assert isinstance(error, BackendError) and "locked" in str(error)
        blocker.execute("ROLLBACK")
        store.save(creds("a"))
    finally:
        blocker.close()
        store.stop()


# -- PostgreSQL -------------------------------------------------------------------------


def test_postgres_plugin_builds_the_store_when_configured():
    plugin = PostgresPlugin()
    config = load_config(None, environ={}, overrides={
        "auth": {"credentials": "postgres"},
        "postgres": {"dsn": "host=db dbname=x", "min_connections": 2, "max_connections": 7}})
    store = plugin.tbmq_credential_store(config=config)
    assert isinstance(store, PostgresCredentialStore)
    assert (store.dsn, store.min_connections, store.max_connections) == ("host=db dbname=x", 2, 7)
    assert plugin.tbmq_credential_store(config=load_config(None, environ={})) is None


def test_postgres_plugin_is_an_entry_point():
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="tbmq") if e.name == "postgres"]
    module = entry.load()
    assert isinstance(module, PostgresPlugin)


def test_postgres_unreachable_is_a_backend_error(reactor_thread):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = Blocking(reactor_thread, PostgresCredentialStore(
        f"host=127.0.0.1 port={port} dbname=x connect_timeout=2", reactor=reactor_thread.reactor))
    error = failure_of(store.start)
    assert isinstance(error, BackendError)
    assert not store.running and store.target._pool is None


def test_postgres_refuses_a_foreign_table(postgres_dsn, reactor_thread):
    import psycopg2

    dsn = new_database(postgres_dsn)
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:  # TBMQ's own table: no version column
        cur.execute("CREATE TABLE mqtt_client_credentials (id uuid PRIMARY KEY, "
                    "created_time bigint, name varchar(255), client_type varchar(255), "
                    "credentials_id varchar, credentials_type varchar(255), "
                    "credentials_value varchar)")
    conn.close()
    store = Blocking(reactor_thread, PostgresCredentialStore(dsn, reactor=reactor_thread.reactor))
    error = failure_of(store.start)
    assert isinstance(error, BackendError)
    assert "version" in str(error)


def test_postgres_nodes_share_records_and_versions(postgres_dsn, reactor_thread):
    """Two nodes (two stores, two pools) write at once: every change gets
    its own version and each node sees all of them, exactly once."""
    dsn = new_database(postgres_dsn)
    reactor = reactor_thread.reactor
    one = PostgresCredentialStore(dsn, 1, 4, reactor=reactor)
    two = PostgresCredentialStore(dsn, 1, 4, reactor=reactor)

    async def scenario() -> None:
        await defer.gatherResults([one.start(), two.start()])
        try:
            _, _, start = await one.changed_since(0)
            saves = [one.save(creds(f"one{i}")) for i in range(15)]
            saves += [two.save(creds(f"two{i}")) for i in range(15)]
            saved = await defer.gatherResults(saves)
            seen: list = []
            version = start
            # poll in small steps, as the broker does: nothing is lost
            for _ in range(3):
                changed, deleted, version = await two.changed_since(version)
                seen += changed
            assert sorted(c.id for c in seen) == sorted(c.id for c in saved)
            assert version == start + 30
            # the same name saved by both nodes at once: one wins
            results = await defer.DeferredList(
                [one.save(creds("race")), two.save(creds("race"))], consumeErrors=True)
            assert sorted(ok for ok, _ in results) == [False, True]
            (failure,) = [r for ok, r in results if not ok]
            assert failure.check(CredentialsError)
        finally:
            await defer.gatherResults([one.stop(), two.stop()])

    reactor_thread.run(scenario)
