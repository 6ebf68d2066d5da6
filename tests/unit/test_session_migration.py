"""The sessions and subscriptions that an older tbmq kept in the tables
``sessions`` and ``subscriptions`` of the embedded store file move to the
topic log when the file is opened (schema 2 → 3,
:mod:`tbmq.backends.sqlite_session_migration`), and a broker started on that
data directory adopts them: a client that reconnects without a clean start
finds its session and its subscriptions.

The SQLite work runs on a synchronous reactor and thread pool; the broker on
a :class:`task.Clock` (:class:`~tests.helpers.Harness`).
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from twisted.internet import task

from tbmq.backends.sqlite import FILE_NAME, SCHEMA_VERSION, SQLiteStore
from tbmq.cluster.records import UNCLAIMED, SessionInfo, SubscriptionsRecord
from tbmq.cluster.topics import TopicCatalogue
from tbmq.embedded import EmbeddedBackends
from tbmq.errors import BackendError
from tbmq.model import ClientType, SubscriptionOptions
from tbmq.mqtt import Disconnect, Property, Puback, Publish
from tests.helpers import Harness, legacy_file
from tests.unit.test_stores import SyncReactor, SyncThreadPool, failure_of, fired

TOPICS = TopicCatalogue()
#: the wall clock of the tests, seconds since the epoch
NOW = 1_700_000_000.0
NEVER = 0xFFFFFFFF


def query(path: str, sql: str) -> list:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def opened(path: str) -> tuple[SQLiteStore, list[tuple]]:
    """:returns: the started store of ``path`` and the records of its topic log."""
    store = SQLiteStore(path, reactor=SyncReactor(), threadpool=SyncThreadPool())
    fired(store.start())
    records, _ = fired(store.topic_log.load())
    return store, records


def decoded(records: list[tuple], topic: str) -> list[tuple[int, str, Any]]:
    """:returns: ``(offset, key, value)`` of the records of ``topic`` (partition 0)."""
    codec = TOPICS.codec_for(topic)
    assert all(p == 0 for t, p, *_ in records if t == topic)
    return [(o, k, codec.decode(v)) for t, _, o, k, v, _ in records if t == topic]


# -- the migration ----------------------------------------------------------------------


def test_sessions_and_subscriptions_become_records_in_client_id_order(tmp_path):
    path = str(tmp_path / FILE_NAME)
    legacy_file(path, sessions=[
        ("b", 4, NEVER, "DEVICE", NOW - 10),
        ("a", 5, 3600, "APPLICATION", NOW - 20.5),
        ("c", 3, NEVER, "DEVICE", None),
    ], subscriptions=[
        ("a", "z/#", 2, 0, 1, 1, None),
        ("b", "$share/g/t", 1, 0, 0, 0, None),
        ("orphan", "o", 1, 0, 0, 0, None),  # no session: the old loader skipped it
        ("a", "a/b", 0, 1, 0, 2, 268435455),
    ])
    store, records = opened(path)
    sessions = decoded(records, TOPICS.client_session)
    assert [(o, k) for o, k, _ in sessions] == [(0, "a"), (1, "b"), (2, "c")]
    a, b, c = (info for _, _, info in sessions)
    assert a == SessionInfo("a", UNCLAIMED, a.session_id, False, True, ClientType.APPLICATION,
                            3600, 5, None, NOW - 20.5, a.updated_at)
    assert (b.protocol_level, b.session_expiry_interval, b.disconnected_at) == (4, NEVER, NOW - 10)
    assert (c.protocol_level, c.client_type, c.disconnected_at) == (3, ClientType.DEVICE, None)
    assert all(re.fullmatch("[0-9a-f]{32}", s.session_id) for s in (a, b, c))
    assert len({a.session_id, b.session_id, c.session_id}) == 3
    subscriptions = decoded(records, TOPICS.client_subscriptions)
    assert subscriptions == [
        (0, "a", SubscriptionsRecord("a", {"z/#": SubscriptionOptions(2, False, True, 1, None),
                                           "a/b": SubscriptionOptions(0, True, False, 2,
                                                                      268435455)})),
        (1, "b", SubscriptionsRecord("b", {"$share/g/t": SubscriptionOptions(1)})),
    ]
    assert list(subscriptions[0][2].subscriptions) == ["z/#", "a/b"]  # as saved
    fired(store.stop())
    assert query(path, "SELECT DISTINCT compacted, headers FROM topic_log") == [(1, None)]
    assert query(path, "SELECT name FROM sqlite_master WHERE name IN "
                       "('sessions', 'subscriptions', 'subscriptions_client_id')") == []
    assert query(path, "SELECT name, version FROM tbmq_schema") == [("embedded", SCHEMA_VERSION)]
    assert query(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert opened(path)[1] == records  # opened again: nothing moves twice


def test_tables_that_the_topic_log_replaced_are_dropped_unmoved(tmp_path):
    """A tbmq keeping its sessions on the bus opened the file already: the
    tables were unread since, and their rows are stale."""
    path = str(tmp_path / FILE_NAME)
    newer = TOPICS.codec_for(TOPICS.client_session).encode(SessionInfo(
        "x", "node", "s1", False, True, ClientType.DEVICE, 60, 5, NOW, NOW, NOW))
    legacy_file(path, sessions=[("x", 4, NEVER, "DEVICE", None), ("y", 4, NEVER, "DEVICE", None)],
                subscriptions=[("y", "t", 1, 0, 0, 0, None)],
                log=[(TOPICS.client_session, 0, 4, "x", newer, None, 1)])
    store, records = opened(path)
    assert records == [(TOPICS.client_session, 0, 4, "x", newer, ())]
    fired(store.stop())
    assert query(path, "SELECT name FROM sqlite_master WHERE name = 'sessions'") == []

    other = str(tmp_path / "other.sqlite3")  # a group's offset is enough to know it
    legacy_file(other, sessions=[("y", 4, NEVER, "DEVICE", None)],
                offsets=[("tbmq-subscriptions-node", TOPICS.client_subscriptions, 0, 0)])
    store, records = opened(other)
    assert records == []
    fired(store.stop())


def test_a_row_no_record_can_carry_fails_the_open_and_changes_nothing(tmp_path):
    path = str(tmp_path / FILE_NAME)
    legacy_file(path, sessions=[("a", 4, 60, "DEVICE", None), ("r", 4, 60, "ROBOT", None)])
    store = SQLiteStore(path, reactor=SyncReactor(), threadpool=SyncThreadPool())
    failure = failure_of(store.start())
    failure.trap(BackendError)
    assert "'r'" in failure.getErrorMessage()
    assert not store.running
    assert query(path, "SELECT client_id FROM sessions ORDER BY client_id") == [("a",), ("r",)]
    assert query(path, "SELECT count(*) FROM topic_log") == [(0,)]
    assert query(path, "SELECT name, version FROM tbmq_schema") == [("embedded", 2)]


# -- a broker on the migrated data -----------------------------------------------------------


def embedded_node(data_dir: str, clock: task.Clock) -> Harness:
    """A started broker (service id ``test``) on the SQLite store of
    ``data_dir``, its SQLite work on a synchronous pool."""
    h = Harness({"storage": {"backend": "sqlite"}, "data_dir": data_dir}, clock=clock,
                replace={"embedded": EmbeddedBackends(SyncReactor(), SyncThreadPool())})
    h.turn()
    assert fired(h.started) is None
    h.turn()  # the expiry of sessions that expired while no broker ran
    return h


def test_a_broker_on_an_older_data_directory_resumes_its_sessions(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    legacy_file(str(data_dir / FILE_NAME), sessions=[
        ("dev", 4, NEVER, "DEVICE", NOW - 100),
        ("v5", 5, 3600, "DEVICE", NOW - 60),
        ("gone", 5, 60, "DEVICE", NOW - 120),  # expired while no broker ran
    ], subscriptions=[
        ("dev", "cmd/dev/#", 1, 0, 0, 0, None),
        ("v5", "a/+", 1, 1, 0, 0, 7),
        ("gone", "x", 1, 0, 0, 0, None),
    ])
    clock = task.Clock()
    clock.advance(NOW)
    h = embedded_node(str(data_dir), clock)
    assert sorted(h.broker.sessions.sessions) == ["dev", "v5"]
    info = h.broker.registry.get("dev")
    assert (info.service_id, info.connected, info.persistent) == ("test", False, True)
    assert h.broker.registry.get("gone") is None

    dev = h.client("dev", level=4, clean_start=False)
    assert dev.connack.session_present is True
    v5 = h.client("v5", level=5, clean_start=False,
                  properties={Property.SESSION_EXPIRY_INTERVAL: 3600})
    assert v5.connack.session_present is True
    gone = h.client("gone", level=5, clean_start=False,
                    properties={Property.SESSION_EXPIRY_INTERVAL: 60})
    assert gone.connack.session_present is False
    p = h.client("p")
    p.send(Publish("cmd/dev/1", b"on", qos=1, packet_id=1),
           Publish("a/b", b"v", qos=1, packet_id=2), Publish("x", b"no", qos=1, packet_id=3))
    assert p.received() == [Puback(1), Puback(2), Puback(3)]
    assert [(m.topic, m.payload, m.qos) for m in dev.received()] == [("cmd/dev/1", b"on", 1)]
    (got,) = v5.received()
    assert (got.topic, got.payload, got.properties[Property.SUBSCRIPTION_IDENTIFIER]) == (
        "a/b", b"v", [7])
    v5.send(Puback(got.packet_id), Publish("a/c", b"own", qos=1, packet_id=9))
    assert v5.received() == [Puback(9)]  # no local: its own message does not come back
    assert gone.received() == []

    for client in (dev, v5, gone, p):
        client.send(Disconnect())
        client.lose()
    fired(h.broker.stop())
    again = embedded_node(str(data_dir), clock)  # adopted for good: this node's now
    assert again.broker.registry.get("dev").service_id == "test"
    assert sorted(again.broker.sessions.sessions) == ["dev", "gone", "v5"]  # gone's new one
    dev = again.client("dev", level=4, clean_start=False)
    assert dev.connack.session_present is True
    assert "cmd/dev/#" in again.broker.sessions.sessions["dev"].subscriptions
