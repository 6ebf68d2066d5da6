"""The PostgreSQL device store beyond the contract of ``test_stores.py``:
merged transactions, two nodes writing for one client, lost connections and
outages, the schema check, and the plugin.  Stores run on the private
reactor thread of :mod:`tests.postgres` against the test run's server, each
test in a database of its own.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg2
import pytest
from tbmq_plugins.postgres import PostgresPlugin
from tbmq_plugins.postgres_devices import PostgresDeviceMessageStore, client_lock_key
from twisted.internet import defer

from tbmq.config import load_config
from tbmq.errors import BackendError
from tbmq.model import DeliveryState
from tests.postgres import Blocking, Proxy, failure_of, new_database
from tests.unit.test_stores import delivery


@pytest.fixture
def dsn(postgres_dsn):
    return new_database(postgres_dsn)


@pytest.fixture
def open_store(started, reactor_thread):
    """``open_store(dsn, **options)``: a started store (blocking), stopped
    at the end of the test."""

    def open_store(dsn: str, **options: Any) -> Blocking:
        return started(lambda: PostgresDeviceMessageStore(
            dsn, reactor=reactor_thread.reactor, **options))

    return open_store


def test_calls_made_together_share_a_transaction(dsn, open_store, reactor_thread):
    store = open_store(dsn, max_connections=3, max_messages_per_client=50)
    transactions = []
    pool = store.target._pool
    run = pool.runInteraction

    def counting(interaction: Any, *args: Any, **kwargs: Any) -> defer.Deferred:
        transactions.append(interaction)
        return run(interaction, *args, **kwargs)

    pool.runInteraction = counting

    def burst() -> defer.Deferred:
        calls = []
        for i in range(200):
            client = f"c{i % 20}"
            calls += [store.target.add(client, [delivery(i)]),
                      store.target.update(client, i, 1 + i % 100, DeliveryState.SENT)]
            if i % 2:
                calls.append(store.target.remove(client, [i]))
        return defer.gatherResults(calls)

    reactor_thread.call(burst)
    assert len(transactions) <= 3  # the first alone, the rest merged
    loaded = store.load("c4")
    assert [(d.seq, d.packet_id, d.state) for d in loaded] == [
        (i, 1 + i % 100, DeliveryState.SENT) for i in range(4, 200, 20)]
    assert store.load("c3") == []  # odd seqs: removed in the same burst


def test_two_nodes_adding_for_one_client_keep_the_limit(dsn, reactor_thread):
    """Two stores (two nodes, two pools) add for one client at once: the
    advisory lock makes each add and its trim see the other's rows, so the
    client never has more than the limit once both adds are in."""
    nodes = [Blocking(reactor_thread, PostgresDeviceMessageStore(
        dsn, 1, 2, max_messages_per_client=10, reactor=reactor_thread.reactor))
        for _ in range(2)]
    for node in nodes:
        node.start()
    try:
        removed = 0
        for i in range(40):
            both = reactor_thread.call(lambda: defer.gatherResults([
                node.target.add("shared", [delivery(4 * i + 2 * n), delivery(4 * i + 2 * n + 1)])
                for n, node in enumerate(nodes)]))
            removed += sum(both)
            assert nodes[i % 2].count("shared") == min(10, 4 * (i + 1)), i
        assert removed == 160 - 10
        assert [d.seq for d in nodes[1].load("shared")] == list(range(150, 160))
    finally:
        for node in nodes:
            node.stop()


def test_lock_keys_are_stable_and_distinct():
    assert client_lock_key("a") == client_lock_key("a")
    assert len({client_lock_key(f"client-{i}") for i in range(1000)}) == 1000
    assert all(-(2 ** 63) <= client_lock_key(c) < 2 ** 63 for c in ("", "ü", "x" * 1000))


def test_terminated_connections_are_replaced_without_failing_calls(dsn, open_store):
    store = open_store(dsn, min_connections=3, max_connections=3)
    store.add("c", [delivery(1)])
    for i in range(6):  # every pool thread has its connection
        assert store.count(f"x{i}") == 0
    admin = psycopg2.connect(dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        assert len(cur.fetchall()) >= 1
    for i in range(6):  # each thread finds its connection dead, and retries
        assert store.add("c", [delivery(10 + i)]) == 0
        assert len(store.load("c")) == 2 + i
    with admin.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        assert cur.fetchone()[0] >= 1
    admin.close()


def test_outage_fails_calls_then_recovers(dsn, reactor_thread):
    proxy = Proxy(reactor_thread, dsn)
    store = Blocking(reactor_thread, PostgresDeviceMessageStore(
        proxy.dsn, 1, 2, reactor=reactor_thread.reactor))
    store.start()
    try:
        store.add("c", [delivery(1)])
        proxy.down()
        started = time.monotonic()
        for i in range(4):  # on both pool threads
            assert isinstance(failure_of(store.add, "c", [delivery(2)]), BackendError)
            assert isinstance(failure_of(store.load, "c"), BackendError)
        assert time.monotonic() - started < 20
        proxy.up()  # the same port
        for i in range(4):
            assert store.add("c", [delivery(3 + i)]) == 0
        assert [d.seq for d in store.load("c")] == [1, 3, 4, 5, 6]
    finally:
        store.stop()
        proxy.down()


def test_unreachable_postgres_fails_start(reactor_thread):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = Blocking(reactor_thread, PostgresDeviceMessageStore(
        f"host=127.0.0.1 port={port} dbname=x connect_timeout=2",
        reactor=reactor_thread.reactor))
    assert isinstance(failure_of(store.start), BackendError)
    assert not store.running and store.target._pool is None
    assert isinstance(failure_of(store.add, "c", [delivery(1)]), BackendError)


def test_a_foreign_table_is_refused(dsn, reactor_thread):
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE device_messages (client_id text, serial_number bigint)")
    conn.close()
    store = Blocking(reactor_thread, PostgresDeviceMessageStore(
        dsn, reactor=reactor_thread.reactor))
    error = failure_of(store.start)
    assert isinstance(error, BackendError)
    assert "delivery" in str(error) and "seq" in str(error)


def test_bad_arguments_fail_alone(dsn, open_store):
    store = open_store(dsn)
    assert isinstance(failure_of(store.add, "c\x00", [delivery(1)]), ValueError)
    assert isinstance(failure_of(store.add, "c", [delivery(2 ** 63)]), ValueError)
    assert isinstance(failure_of(store.update, "c", "1", 1, DeliveryState.SENT), TypeError)
    store.add("c", [delivery(1), delivery(2 ** 63 - 1), delivery(-5)])
    assert [d.seq for d in store.load("c", after_seq=2 ** 70)] == []
    assert [d.seq for d in store.load("c", after_seq=-(2 ** 70))] == [-5, 1, 2 ** 63 - 1]


def test_plugin_builds_the_store_when_configured():
    config = load_config(None, environ={}, overrides={
        "storage": {"device_store": "postgres", "max_messages_per_client": 9},
        "postgres": {"dsn": "host=db dbname=x", "min_connections": 2, "max_connections": 7}})
    store = PostgresPlugin().tbmq_device_message_store(config=config)
    assert isinstance(store, PostgresDeviceMessageStore)
    assert (store.dsn, store.min_connections, store.max_connections,
            store.max_messages_per_client) == ("host=db dbname=x", 2, 7, 9)
    assert PostgresPlugin().tbmq_device_message_store(
        config=load_config(None, environ={})) is None
