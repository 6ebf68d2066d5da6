"""What only the SQLite embedded store shows: calls accepted while the
database thread is busy share one transaction (writes of the device store
merged into one operation), a failing operation is rolled back alone, the
life cycle of the store and of its views, the pragmas and the schema.

The store runs on a synchronous reactor and thread pool, or on a
hand-driven pool (:class:`~tests.unit.test_stores.ManualThreadPool`) where
the queue matters; the contract suites of its interfaces are in
``test_stores.py``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from zope.interface.verify import verifyObject

from tbmq.backends.memory import MemoryDeviceMessageStore
from tbmq.backends.sqlite import SQLiteStore
from tbmq.errors import BackendError
from tbmq.interfaces import IDeviceMessageStore, IRetainedStore
from tbmq.model import DeliveryState
from tbmq.mqtt.constants import Property
from tests.unit.test_stores import (
    ManualThreadPool,
    SyncReactor,
    SyncThreadPool,
    delivery,
    failure_of,
    fired,
    message,
)


def manual_store(tmp_path: Any, **kwargs: Any) -> tuple[SQLiteStore, ManualThreadPool]:
    pool = ManualThreadPool()
    store = SQLiteStore(
        str(tmp_path / "db.sqlite"), reactor=SyncReactor(), threadpool=pool, **kwargs
    )
    return store, pool


def sync_store(tmp_path: Any, **kwargs: Any) -> SQLiteStore:
    return SQLiteStore(
        str(tmp_path / "db.sqlite"),
        reactor=SyncReactor(),
        threadpool=SyncThreadPool(),
        **kwargs,
    )


class TestSQLiteStore:
    def test_calls_while_busy_share_one_transaction(self, tmp_path):
        store, pool = manual_store(tmp_path)
        started = store.start()
        # Accepted while the database opens: they wait.
        d1 = store.retained.put(message("a", b"1"))
        d2 = store.deliveries.add("c", [delivery(1)])
        d3 = store.retained.load_all()
        assert len(pool.jobs) == 1
        pool.run_one()  # open
        assert fired(started) is None
        assert len(pool.jobs) == 1  # one batch for the three calls
        assert not d1.called and not d2.called and not d3.called
        # Accepted while that batch runs: the next batch.
        d4 = store.retained.remove("a")
        d5 = store.retained.load_all()
        assert len(pool.jobs) == 1
        pool.run_one()
        assert fired(d1) is None and fired(d2) == 0  # add: no delivery removed
        assert fired(d3) == [message("a", b"1")]  # sees the earlier write
        assert not d4.called
        pool.run_one()
        assert fired(d4) is None
        assert fired(d5) == []
        assert pool.jobs == []
        stopped = store.stop()
        pool.run_all()
        assert fired(stopped) is None

    def test_callbacks_calls_join_the_next_batch(self, tmp_path):
        store, pool = manual_store(tmp_path)
        store.start()
        pool.run_one()
        later: list = []
        d1 = store.retained.put(message("a", b"1"))
        d1.addCallback(lambda _: later.append(store.retained.load_all()))
        pool.run_one()
        assert len(later) == 1 and not later[0].called
        pool.run_one()
        assert fired(later[0]) == [message("a", b"1")]

    def test_delivery_writes_while_busy_are_merged(self, tmp_path):
        store, pool = manual_store(tmp_path)
        store.start()
        pool.run_one()  # open
        first = store.deliveries.add("c", [delivery(1), delivery(2)])
        assert len(pool.jobs) == 1  # handed over at once: the thread was idle
        # while that batch runs: queued, sent and acknowledged, and a third
        # delivery queued and sent
        calls = [
            store.deliveries.add("c", [delivery(3), delivery(4)]),
            store.deliveries.update("c", 3, 7, DeliveryState.SENT),
            store.deliveries.remove("c", [3]),
            store.deliveries.update("c", 1, 9, DeliveryState.SENT),  # row of the running batch
            store.deliveries.update("c", 4, 8, DeliveryState.SENT),
            store.deliveries.remove("c", [2]),
            store.deliveries.update("c", 2, 5, DeliveryState.SENT),  # removed: ignored
        ]
        assert len(store.runner._pending) == 1  # one operation for the seven calls
        writes = store.runner._pending[0][0]
        assert set(writes.puts) == {("c", 4)} and writes.puts[("c", 4)][-2:] == [8, 1]
        assert writes.updates == {("c", 1): (9, int(DeliveryState.SENT))}
        assert writes.deletes == {("c", 2), ("c", 3)}
        pool.run_one()
        assert fired(first) == 0
        assert not any(d.called for d in calls)  # not before their COMMIT
        pool.run_one()
        assert [fired(d) for d in calls] == [0] + [None] * 6  # the add, then the others
        loaded = store.deliveries.load("c")
        pool.run_one()
        got = fired(loaded)
        assert [(d.seq, d.packet_id, d.state) for d in got] == [
            (1, 9, DeliveryState.SENT), (4, 8, DeliveryState.SENT)]

    def test_delivery_writes_after_a_read_or_clear_stay_after_it(self, tmp_path):
        store, pool = manual_store(tmp_path)
        store.start()
        pool.run_one()
        busy = store.retained.put(message("a", b"1"))  # keeps the thread busy
        store.deliveries.add("c", [delivery(1)])
        loaded = store.deliveries.load("c")
        store.deliveries.add("c", [delivery(2)])
        cleared = store.deliveries.clear("c")
        store.deliveries.add("c", [delivery(3)])
        assert len(store.runner._pending) == 5
        pool.run_all()
        assert fired(busy) is None
        assert [d.seq for d in fired(loaded)] == [1]
        assert fired(cleared) is None
        final = store.deliveries.load("c")
        pool.run_all()
        assert [d.seq for d in fired(final)] == [3]

    def test_merged_delivery_writes_fail_together(self, tmp_path):
        store, pool = manual_store(tmp_path)
        store.start()
        pool.run_one()
        busy = store.retained.put(message("a", b"1"))
        d1 = store.deliveries.add("c", [delivery(1)])
        d2 = store.deliveries.remove("c", [5])
        writes = store.runner._pending[0][0]
        writes.puts[("c", 1)][2] = None  # topic NOT NULL: the INSERT fails
        pool.run_all()
        assert fired(busy) is None
        for d in (d1, d2):
            with pytest.raises(sqlite3.IntegrityError):
                fired(d)

    def test_failing_operation_is_rolled_back_alone(self, tmp_path):
        store = sync_store(tmp_path)
        fired(store.start())

        def bad(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM retained")
            raise ValueError("boom")

        fired(store.retained.put(message("keep", b"1")))
        failure = failure_of(store.submit(bad))
        failure.trap(ValueError)
        assert [m.topic for m in fired(store.retained.load_all())] == ["keep"]
        fired(store.stop())

    def test_failing_operation_in_a_batch(self, tmp_path):
        store, pool = manual_store(tmp_path)
        store.start()
        pool.run_one()

        def bad(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM retained")
            raise ValueError("boom")

        d0 = store.retained.load_all()  # keeps the database thread busy
        d1 = store.retained.put(message("a", b"1"))
        d2 = store.submit(bad)
        d3 = store.retained.put(message("b", b"2"))
        pool.run_one()
        assert fired(d0) == []
        assert len(pool.jobs) == 1  # d1, d2, d3 in one transaction
        pool.run_one()
        assert fired(d1) is None and fired(d3) is None
        failure_of(d2).trap(ValueError)
        d4 = store.retained.load_all()
        pool.run_one()
        assert sorted(m.topic for m in fired(d4)) == ["a", "b"]

    def test_unserialisable_value_fails_the_call(self, tmp_path):
        store = sync_store(tmp_path)
        fired(store.start())
        bad = message("a", b"1", properties={Property.CONTENT_TYPE: object()})
        failure_of(store.retained.put(bad))
        assert fired(store.retained.load_all()) == []

    def test_calls_when_not_running_fail(self, tmp_path):
        store = sync_store(tmp_path)
        failure_of(store.retained.load_all()).trap(BackendError)
        fired(store.start())
        fired(store.stop())
        failure_of(store.deliveries.load("c")).trap(BackendError)

    def test_stop_commits_pending_writes(self, tmp_path):
        store, pool = manual_store(tmp_path)
        store.start()
        pool.run_one()
        d1 = store.retained.put(message("a", b"1"))
        stopped = store.stop()
        failure_of(store.retained.put(message("b", b"2"))).trap(BackendError)
        assert not stopped.called
        pool.run_one()  # the batch
        assert fired(d1) is None
        assert not stopped.called
        pool.run_one()  # close
        assert fired(stopped) is None
        again = sync_store(tmp_path)
        fired(again.start())
        assert fired(again.retained.load_all()) == [message("a", b"1")]
        fired(again.stop())

    def test_start_is_idempotent_and_views_are_counted(self, tmp_path):
        store = sync_store(tmp_path)
        fired(store.deliveries.start())
        fired(store.deliveries.start())
        fired(store.retained.start())
        fired(store.start())
        assert store.running
        fired(store.deliveries.stop())
        assert store.running
        fired(store.deliveries.stop())  # not started twice: no effect
        assert store.running
        fired(store.retained.stop())
        assert not store.running
        fired(store.stop())  # already stopped

    def test_store_stop_stops_everything(self, tmp_path):
        store = sync_store(tmp_path)
        fired(store.deliveries.start())
        fired(store.stop())
        assert not store.running
        failure_of(store.deliveries.load("c")).trap(BackendError)

    def test_stop_while_starting(self, tmp_path):
        store, pool = manual_store(tmp_path)
        started = store.start()
        d1 = store.retained.put(message("a", b"1"))
        stopped = store.stop()
        pool.run_all()
        assert fired(started) is None
        assert fired(d1) is None
        assert fired(stopped) is None
        assert not store.running
        failure_of(store.retained.load_all()).trap(
            BackendError
        )

    def test_views_restart_after_store_stop(self, tmp_path):
        store = sync_store(tmp_path)
        fired(store.retained.start())
        fired(store.stop())
        fired(store.retained.start())
        assert store.running
        fired(store.retained.stop())
        assert not store.running

    def test_restart(self, tmp_path):
        store = sync_store(tmp_path)
        fired(store.start())
        fired(store.retained.put(message("a", b"1")))
        fired(store.stop())
        fired(store.start())
        assert fired(store.retained.load_all()) == [message("a", b"1")]
        fired(store.stop())

    def test_start_failure(self, tmp_path):
        (tmp_path / "file").write_text("not a directory")
        store = SQLiteStore(
            str(tmp_path / "file" / "db.sqlite"),
            reactor=SyncReactor(),
            threadpool=SyncThreadPool(),
        )
        failure_of(store.start())
        assert not store.running

    def test_delivery_writes_of_a_failed_open_fail_and_a_restart_takes_new_ones(self, tmp_path):
        (tmp_path / "dir").write_text("not a directory yet")
        pool = ManualThreadPool()
        store = SQLiteStore(str(tmp_path / "dir" / "db.sqlite"), reactor=SyncReactor(),
                            threadpool=pool)
        started = store.start()
        lost = store.deliveries.add("c", [delivery(1)])  # waits for the open
        pool.run_all()
        failure_of(started)
        failure_of(lost)
        (tmp_path / "dir").unlink()
        (tmp_path / "dir").mkdir()
        started = store.start()
        kept = store.deliveries.add("c", [delivery(2)])
        pool.run_all()
        assert fired(started) is None and fired(kept) == 0
        loaded = store.deliveries.load("c")
        pool.run_all()
        assert [d.seq for d in fired(loaded)] == [2]

    def test_pragmas_and_schema(self, tmp_path):
        store = sync_store(tmp_path)
        fired(store.start())

        def pragmas(conn: sqlite3.Connection) -> tuple:
            journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
            sync = conn.execute("PRAGMA synchronous").fetchone()[0]
            tables = {
                row[0]
                for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            return journal, sync, tables

        journal, sync, tables = fired(store.submit(pragmas))
        assert journal == "wal"
        assert sync == 2  # FULL
        assert {"retained", "deliveries", "topic_log", "topic_log_offsets"} <= tables
        assert not {"sessions", "subscriptions"} & tables  # on the bus since schema 3
        fired(store.stop())

    def test_synchronous_option(self, tmp_path):
        store = sync_store(tmp_path, synchronous="normal")
        fired(store.start())
        sync = fired(
            store.submit(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
        )
        assert sync == 1  # NORMAL
        fired(store.stop())
        with pytest.raises(ValueError):
            SQLiteStore("x", reactor=SyncReactor(), synchronous="SOMETIMES")

    def test_views_share_one_store(self, tmp_path):
        store = sync_store(tmp_path)
        assert store.retained.runner is store.deliveries.runner is store.runner
        assert verifyObject(IRetainedStore, store.retained)
        assert verifyObject(IDeviceMessageStore, store.deliveries)

    def test_merged_adds_report_their_removals_on_the_last(self, tmp_path):
        store, pool = manual_store(tmp_path, max_messages_per_client=2)
        store.start()
        pool.run_one()
        busy = store.retained.put(message("a", b"1"))  # keeps the thread busy
        adds = [
            store.deliveries.add("c", [delivery(1), delivery(2)]),
            store.deliveries.add("d", [delivery(1)]),
            store.deliveries.add("c", [delivery(3)]),
            store.deliveries.add("c", [delivery(4)]),
        ]
        removed = store.deliveries.remove("c", [4])
        counted = store.deliveries.count("c")
        late = store.deliveries.add("c", [delivery(5)])
        assert len(store.runner._pending) == 3  # the merged writes, the count, the late add
        pool.run_all()
        assert fired(busy) is None and fired(removed) is None
        # seqs 1..3 were kept, 4 removed: one over the limit, on c's last add
        assert [fired(d) for d in adds] == [0, 0, 0, 1]
        assert fired(counted) == 2
        assert fired(late) == 1
        loaded = store.deliveries.load("c")
        pool.run_all()
        assert [d.seq for d in fired(loaded)] == [3, 5]

    def test_a_limit_below_one_is_refused(self, tmp_path):
        with pytest.raises(ValueError):
            sync_store(tmp_path, max_messages_per_client=0)
        with pytest.raises(ValueError):
            MemoryDeviceMessageStore(max_messages_per_client=0)
