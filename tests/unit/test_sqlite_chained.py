"""The SQLite runner's database thread takes the next batch itself
(:meth:`tbmq.backends.sqlite_runner.SQLiteRunner._run_chained`): the next
COMMIT starts as soon as one ends, before the reactor has fired the
Deferreds of the batch that ended, and another runner's jobs on the same
thread still take their turn.  With a real thread: nothing merged into a
queued write is lost while the thread takes batches on its own.
"""

from __future__ import annotations

import queue
import sqlite3
import time
from typing import Any, Callable

from twisted.python.threadpool import ThreadPool

from tbmq.backends.sqlite import SQLiteStore
from tbmq.backends.sqlite_runner import SQLiteDatabases
from tests.unit.test_stores import ManualThreadPool, delivery, fired, message


class HeldReactor:
    """Keeps ``callFromThread`` calls until the test runs them: the reactor
    thread busy elsewhere while the database thread goes on."""

    def __init__(self) -> None:
        self.calls: "queue.Queue[tuple[Callable, tuple, dict]]" = queue.Queue()

    def callFromThread(self, f: Callable, *args: Any, **kwargs: Any) -> None:
        self.calls.put((f, args, kwargs))

    def run_calls(self) -> int:
        n = 0
        while True:
            try:
                f, args, kwargs = self.calls.get_nowait()
            except queue.Empty:
                return n
            f(*args, **kwargs)
            n += 1


def open_store(tmp_path, pool, reactor) -> SQLiteStore:
    store = SQLiteStore(str(tmp_path / "db.sqlite"), reactor=reactor, threadpool=pool)
    started = store.start()
    pool.run_one()
    reactor.run_calls()
    assert fired(started) is None
    return store


def test_the_next_batch_starts_before_the_reactor_fires_the_previous(tmp_path):
    pool, reactor = ManualThreadPool(), HeldReactor()
    store = open_store(tmp_path, pool, reactor)
    first = store.deliveries.add("c", [delivery(1)])
    assert len(pool.jobs) == 1  # handed at once: the thread was idle
    second = store.deliveries.add("c", [delivery(2)])  # queued while it runs
    pool.run_one()
    # the thread queued the next batch itself; the reactor has not yet
    # seen the first batch's outcome
    assert len(pool.jobs) == 1 and not first.called and not second.called
    pool.run_one()
    assert not pool.jobs and not first.called
    # one call into the reactor per batch: its outcome (no Deferred of the job itself)
    assert reactor.run_calls() == 2
    assert fired(first) == 0 and fired(second) == 0
    # the thread went idle: the next call is handed by the reactor again
    loaded = store.deliveries.load("c")
    assert len(pool.jobs) == 1
    pool.run_one()
    reactor.run_calls()
    assert [d.seq for d in fired(loaded)] == [1, 2]


def test_a_write_after_the_thread_took_the_batch_goes_to_the_next(tmp_path):
    """The thread seals what it takes: a later add merges into a new
    operation, which the thread runs next, and each add reports its own
    result."""
    pool, reactor = ManualThreadPool(), HeldReactor()
    store = open_store(tmp_path, pool, reactor)
    first = store.deliveries.add("c", [delivery(1)])
    second = store.deliveries.add("c", [delivery(2)])
    pool.run_one()  # runs the first; takes the operation holding the second
    third = store.deliveries.add("c", [delivery(3)])  # not into the taken one
    pool.run_one()
    assert len(pool.jobs) == 1  # the third, taken by the thread too
    pool.run_one()
    reactor.run_calls()
    assert [fired(d) for d in (first, second, third)] == [0, 0, 0]
    conn = sqlite3.connect(store.deliveries.path)
    try:
        assert [r[0] for r in conn.execute("SELECT seq FROM deliveries ORDER BY seq")] == [1, 2, 3]
    finally:
        conn.close()


def test_another_runner_on_the_thread_takes_its_turn_between_batches(tmp_path):
    pool, reactor = ManualThreadPool(), HeldReactor()
    databases = SQLiteDatabases(reactor=reactor, threadpool=pool)
    busy = SQLiteStore(runner=databases.runner(str(tmp_path / "a.sqlite")))
    other = SQLiteStore(runner=databases.runner(str(tmp_path / "b.sqlite")))
    started = [busy.start(), other.start()]
    pool.run_all()
    reactor.run_calls()
    assert all(fired(d) is None for d in started)
    busy.deliveries.add("c", [delivery(1)])
    busy.deliveries.add("c", [delivery(2)])  # waits for the first
    put = other.retained.put(message("t", b"x"))  # queued on the thread now
    pool.run_one()  # the first add; the second is queued behind the put
    assert len(pool.jobs) == 2
    pool.run_one()
    reactor.run_calls()
    assert fired(put) is None


def test_every_acknowledged_add_is_stored_with_a_real_thread(tmp_path):
    """Adds merged from this thread while a real database thread takes
    batches on its own: every Deferred fires once, after its rows are
    committed, and no row is lost."""
    reactor = HeldReactor()
    pool = ThreadPool(1, 1, name="test-sqlite")
    pool.start()
    try:
        store = SQLiteStore(str(tmp_path / "db.sqlite"), reactor=reactor, threadpool=pool,
                            synchronous="OFF")
        started = store.start()
        deadline = time.monotonic() + 30
        while not started.called and time.monotonic() < deadline:
            reactor.run_calls()
        acked: list[int] = []
        committed_then: list[int] = []
        reader = sqlite3.connect(store.deliveries.path, check_same_thread=False)

        def on_ack(_result, seq):
            acked.append(seq)
            if seq % 250 == 0:  # committed before the acknowledgement
                committed_then.append(reader.execute(
                    "SELECT count(*) FROM deliveries WHERE seq = ?", (seq,)).fetchone()[0])

        total = 3000
        for seq in range(1, total + 1):
            store.deliveries.add("c", [delivery(seq)]).addCallback(on_ack, seq)
            if seq % 7 == 0:
                reactor.run_calls()
        while len(acked) < total and time.monotonic() < deadline:
            if not reactor.run_calls():
                time.sleep(0.001)
        assert sorted(acked) == list(range(1, total + 1))
        assert committed_then == [1] * (total // 250)
        assert reader.execute("SELECT count(*) FROM deliveries").fetchone()[0] == total
        reader.close()
        stopped = store.stop()
        while not stopped.called and time.monotonic() < deadline:
            reactor.run_calls()
            time.sleep(0.001)
        assert fired(stopped) is None
    finally:
        pool.stop()


def test_a_failing_operation_alone_in_its_batch_is_rolled_back_and_reported(tmp_path):
    """A batch of one operation runs without a savepoint: its failure rolls
    its whole transaction back (what it wrote is gone), fails its Deferred
    alone, and the next batch commits."""
    pool, reactor = ManualThreadPool(), HeldReactor()
    store = open_store(tmp_path, pool, reactor)
    runner = store.deliveries.runner

    def half_then_fail(conn):
        conn.execute("INSERT INTO retained (topic, payload, qos, retain, properties, publisher, "
                     "received_at, expires_at) VALUES ('half', x'00', 0, 1, NULL, 'p', 0, NULL)")
        raise ValueError("refused")

    failed = runner.submit(half_then_fail)
    pool.run_one()
    reactor.run_calls()
    assert isinstance(failed.result.value, ValueError)
    failed.addErrback(lambda _f: None)
    after = store.deliveries.add("c", [delivery(1)])
    pool.run_one()
    reactor.run_calls()
    assert fired(after) == 0
    conn = sqlite3.connect(runner.path)
    try:
        assert conn.execute("SELECT count(*) FROM retained").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 1
        assert not conn.in_transaction
    finally:
        conn.close()


def test_an_operation_alone_in_its_batch_takes_no_savepoint(tmp_path):
    pool, reactor = ManualThreadPool(), HeldReactor()
    store = open_store(tmp_path, pool, reactor)
    statements: list[str] = []
    store.deliveries.runner._conn.set_trace_callback(statements.append)
    alone = store.deliveries.add("c", [delivery(1)])
    pool.run_one()
    reactor.run_calls()
    assert fired(alone) == 0
    assert statements[0] == "BEGIN IMMEDIATE" and statements[-1] == "COMMIT"
    assert not [s for s in statements if "SAVEPOINT" in s or "RELEASE" in s]
    del statements[:]
    # the add runs alone; the next add and the put share the next batch
    calls = [store.deliveries.add("c", [delivery(2)]), store.deliveries.add("c", [delivery(3)]),
             store.retained.put(message("t", b"x"))]
    pool.run_all()
    reactor.run_calls()
    assert [fired(d) for d in calls] == [0, 0, None]
    assert sum(s == "SAVEPOINT op" for s in statements) == 2
