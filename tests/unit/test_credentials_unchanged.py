"""``unchanged_since``: the embedded credential stores tell without a
database round trip that nothing changed after a version, so the basic
provider does not ask its store for every burst of CONNECTs; a write by
another process (the CLI) on the SQLite file is still seen."""

from __future__ import annotations

import os
import time

from tbmq.backends.memory_credentials import MemoryCredentialStore
from tbmq.backends.sqlite_credentials import FILE_NAME, SQLiteCredentialStore
from tbmq.model import Credentials, CredentialsType
from tests.unit.test_credentials import SyncReactor, SyncThreadPool
from tests.unit.test_stores import fired


def creds(name: str) -> Credentials:
    return Credentials(name, name, CredentialsType.MQTT_BASIC, f"client_id|{name}",
                       value={"clientId": name, "password": None})


def settle(path: str) -> None:
    """Make the file and its write-ahead log look written long ago."""
    past = time.time() - 60
    for name in (path, path + "-wal"):
        if os.path.exists(name):
            os.utime(name, (past, past))


def sqlite_store(path: str) -> SQLiteCredentialStore:
    store = SQLiteCredentialStore(path, reactor=SyncReactor(), threadpool=SyncThreadPool())
    fired(store.start())
    return store


def test_memory_store_tells_nothing_changed_until_a_write():
    store = MemoryCredentialStore()
    _, _, version = fired(store.changed_since(0))
    assert store.unchanged_since(version)
    fired(store.save(creds("a")))
    assert not store.unchanged_since(version)
    _, _, version = fired(store.changed_since(version))
    assert store.unchanged_since(version)


def test_sqlite_store_tells_nothing_changed_until_another_process_writes(tmp_path):
    path = str(tmp_path / FILE_NAME)
    node, cli = sqlite_store(path), sqlite_store(path)
    try:
        _, _, version = fired(node.changed_since(0))
        assert not node.unchanged_since(version)  # written just now: cannot tell yet
        settle(path)
        assert not node.unchanged_since(version)  # not asked since it settled
        _, _, version = fired(node.changed_since(version))
        assert node.unchanged_since(version)
        assert node.unchanged_since(version)  # as often as asked, no question
        fired(cli.save(creds("from-cli")))
        assert not node.unchanged_since(version)
        changed, _, version2 = fired(node.changed_since(version))
        assert [c.name for c in changed] == ["from-cli"] and version2 == version + 1
        settle(path)
        assert fired(node.changed_since(version2)) == ([], [], version2)
        assert node.unchanged_since(version2)
        fired(node.save(creds("from-node")))  # its own write: asked again too
        assert not node.unchanged_since(version2)
    finally:
        fired(cli.stop())
        fired(node.stop())
    assert not node.unchanged_since(version2)  # stopped: ask (and fail) as before


def test_sqlite_store_in_memory_always_asks():
    store = sqlite_store(":memory:")
    try:
        _, _, version = fired(store.changed_since(0))
        assert not store.unchanged_since(version)
    finally:
        fired(store.stop())


def test_sqlite_store_takes_one_stat_per_reactor_turn(tmp_path, monkeypatch):
    """A burst of CONNECTs read in one turn of the reactor costs one
    ``stat`` of the write-ahead log; a write is seen from the next turn."""
    from twisted.internet import task  # noqa: PLC0415

    class Reactor(SyncReactor, task.Clock):
        def __init__(self) -> None:
            task.Clock.__init__(self)

    path = str(tmp_path / FILE_NAME)
    reactor = Reactor()
    node = SQLiteCredentialStore(path, reactor=reactor, threadpool=SyncThreadPool())
    fired(node.start())
    cli = sqlite_store(path)
    stats = []
    real_stat = os.stat
    monkeypatch.setattr("tbmq.backends.sqlite_credentials.os.stat",
                        lambda p, *a, **k: stats.append(p) or real_stat(p, *a, **k))
    try:
        settle(path)
        _, _, version = fired(node.changed_since(0))
        reactor.advance(0)
        del stats[:]
        assert all(node.unchanged_since(version) for _ in range(50))
        assert len(stats) == 1  # one for the turn
        fired(cli.save(creds("from-cli")))
        reactor.advance(0)  # the next turn
        assert not node.unchanged_since(version)
        assert len(stats) == 2
    finally:
        fired(cli.stop())
        fired(node.stop())
