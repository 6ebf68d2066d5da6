"""The admin users' store (SQLite and PostgreSQL): add, replace, list, remove, the login
check and the token key, with the errors ``tbmq admin`` reports."""

from __future__ import annotations

import pytest

from tbmq.config import load_config
from tbmq.ops.admins import AdminError, open_admin_store
from tests.postgres import new_database


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    """The embedded store, and PostgreSQL's (every node of a cluster shares it)."""
    overrides = {"data_dir": str(tmp_path)}
    if request.param == "postgres":
        dsn = new_database(request.getfixturevalue("postgres_dsn"))
        overrides.update(auth={"credentials": "postgres"}, postgres={"dsn": dsn})
    return open_admin_store(load_config(None, environ={}, overrides=overrides))


def test_add_list_replace_remove(store, tmp_path):
    assert store.list_sync() == []
    alice = store.add_sync("alice", "password-1", "admin", rounds=4)
    store.add_sync("bob", "password-2", "viewer", rounds=4)
    assert [(u.name, u.role) for u in store.list_sync()] == [("alice", "admin"), ("bob", "viewer")]
    assert (tmp_path / "admins.sqlite3").exists() == (store.paramstyle == "qmark")
    with pytest.raises(AdminError, match="exists"):
        store.add_sync("alice", "password-3", rounds=4)
    changed = store.add_sync("alice", "password-3", "viewer", rounds=4, replace=True)
    assert changed.created_time == alice.created_time and changed.role == "viewer"
    user, hashed = store.password_of_sync("alice")
    assert user.role == "viewer" and hashed.startswith("$2b$04$")
    assert store.remove_sync("alice") is True
    assert store.remove_sync("alice") is False
    assert store.password_of_sync("alice") is None


@pytest.mark.parametrize("name, password, role, error", [
    ("", "password-1", "admin", "printable"),
    ("with space", "password-1", "admin", "printable"),
    ("x" * 65, "password-1", "admin", "printable"),
    ("ok", "short", "admin", "at least 8"),
    ("ok", "password-1", "root", "role must be"),
])
def test_refused_users(store, name, password, role, error):
    with pytest.raises(AdminError, match=error):
        store.add_sync(name, password, role, rounds=4)


def test_the_token_key_is_made_once(store):
    key = store.secret_sync()
    assert len(key) == 64 and store.secret_sync() == key


def test_nodes_starting_together_create_the_postgres_schema_one_after_the_other(postgres_dsn):
    """Eight nodes' admin stores read a new PostgreSQL database at the same
    moment: each creates the schema if missing under the advisory lock, and
    none fails (``CREATE TABLE IF NOT EXISTS`` alone is not safe against
    itself: a duplicate row type in ``pg_type``)."""
    import threading

    config = load_config(None, environ={}, overrides={
        "auth": {"credentials": "postgres"}, "postgres": {"dsn": new_database(postgres_dsn)}})
    stores = [open_admin_store(config) for _ in range(8)]
    start = threading.Barrier(len(stores))
    outcomes: list = []

    def read(store) -> None:
        start.wait()
        try:
            outcomes.append(store.list_sync())
        except Exception as e:  # noqa: BLE001 (the outcome is what is checked)
            outcomes.append(e)

    threads = [threading.Thread(target=read, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes == [[]] * len(stores)
