"""The contract suites of the storage interfaces, run against every backend.

One suite per interface (:class:`~tbmq.interfaces.IRetainedStore`,
:class:`~tbmq.interfaces.IDeviceMessageStore`), written once.  The fixtures
are parametrised over :data:`BACKENDS`: adding a backend is one entry
there, a class with ``open()``, ``close()``, ``durable``, ``retained`` (it
has a retained store too) and ``result(d)``.

The embedded backends answer synchronously here: the memory stores return
fired Deferreds, and the SQLite store runs on a synchronous thread pool and
reactor (:class:`SyncThreadPool`, :class:`SyncReactor`).  The SQLite-specific
tests, in ``test_sqlite_store.py``, drive its queue by hand
(:class:`ManualThreadPool`).  The cluster's device stores run against real
servers (:mod:`tests.redis_server`, :mod:`tests.postgres`) on the private
reactor thread of :mod:`tests.postgres`; the tests call them through
:class:`~tests.postgres.InReactorThread`, which waits for each call there.  Each test gets
a clean store: a key prefix of its own in Redis, a database of its own in
PostgreSQL.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

import pytest
from tbmq_plugins.postgres_devices import PostgresDeviceMessageStore
from tbmq_plugins.redis_store import RedisDeviceMessageStore
from twisted.internet import defer
from twisted.python.failure import Failure
from zope.interface.verify import verifyObject

from tbmq.backends.memory import MemoryDeviceMessageStore, MemoryRetainedStore
from tbmq.backends.sqlite import SQLiteStore
from tbmq.interfaces import IDeviceMessageStore, IRetainedStore
from tbmq.model import DeliveryState, Message, StoredDelivery
from tbmq.mqtt.constants import Property
from tests.postgres import InReactorThread, ReactorThread, new_database

# -- synchronous stand-ins for the reactor and the thread pool -----------------


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


class ManualThreadPool(SyncThreadPool):
    """Keeps jobs until the test runs them: lets a test see what is queued
    while the database thread is busy."""

    def __init__(self) -> None:
        self.jobs: list[tuple] = []

    def callInThreadWithCallback(
        self, on_result: Callable, f: Callable, *args: Any, **kwargs: Any
    ) -> None:
        self.jobs.append((on_result, f, args, kwargs))

    def run_one(self) -> None:
        on_result, f, args, kwargs = self.jobs.pop(0)
        SyncThreadPool.callInThreadWithCallback(self, on_result, f, *args, **kwargs)

    def run_all(self) -> None:
        while self.jobs:
            self.run_one()


def fired(d: defer.Deferred) -> Any:
    """:returns: the result of the already-fired Deferred ``d``.
    :raises: its failure's exception."""
    results: list = []
    d.addBoth(results.append)
    assert results, "the Deferred has not fired"
    result = results[0]
    if isinstance(result, Failure):
        result.raiseException()
    return result


def failure_of(d: defer.Deferred) -> Failure:
    """:returns: the Failure of the already-failed Deferred ``d``."""
    results: list = []
    d.addBoth(results.append)
    assert results, "the Deferred has not fired"
    assert isinstance(results[0], Failure), results[0]
    return results[0]


def real(store: Any) -> Any:
    """:returns: the store behind an :class:`InReactorThread`, or ``store``."""
    return store.target if isinstance(store, InReactorThread) else store


# -- backends -------------------------------------------------------------------


class Stores:
    """The stores of one backend, started (``retained`` is None for a
    backend with a device store only)."""

    def __init__(self, backend: Any, retained: Any, deliveries: Any):
        self.backend = backend
        self.retained = retained
        self.deliveries = deliveries

    def result(self, d: defer.Deferred) -> Any:
        return self.backend.result(d)

    def concurrently(self, calls: Callable[[Any], defer.Deferred]) -> Any:
        """Run ``calls(device store)`` where the store lives, without
        waiting between the calls it makes; :returns: the result of the
        Deferred it returns."""
        return self.backend.concurrently(calls, real(self.deliveries))

    def reopen(self, **options: Any) -> "Stores":
        """Close these stores and open new ones on the same data."""
        self.backend.close(self)
        return self.backend.open(**options)


class MemoryBackend:
    durable = False
    retained = True

    def __init__(self, request: Any, tmp_path: Any) -> None:
        pass

    def result(self, d: defer.Deferred) -> Any:
        return fired(d)

    def concurrently(self, calls: Callable[[Any], defer.Deferred], store: Any) -> Any:
        return fired(calls(store))

    def open(self, **options: Any) -> Stores:
        stores = Stores(self, MemoryRetainedStore(), MemoryDeviceMessageStore(**options))
        for store in (stores.retained, stores.deliveries):
            fired(store.start())
        return stores

    def close(self, stores: Stores) -> None:
        for store in (stores.retained, stores.deliveries):
            fired(store.stop())


class SQLiteBackend(MemoryBackend):
    durable = True

    def __init__(self, request: Any, tmp_path: Any) -> None:
        self.path = str(tmp_path / "data" / "tbmq.sqlite")

    def open(self, **options: Any) -> Stores:
        store = SQLiteStore(
            self.path, reactor=SyncReactor(), threadpool=SyncThreadPool(), **options
        )
        stores = Stores(self, store.retained, store.deliveries)
        for view in (stores.retained, stores.deliveries):
            fired(view.start())
        return stores


class ThreadedBackend:
    """A device store on a real server, in the private reactor thread."""

    durable = True
    retained = False

    def __init__(self, request: Any, tmp_path: Any) -> None:
        self.rt: ReactorThread = request.getfixturevalue("reactor_thread")

    def result(self, d: defer.Deferred) -> Any:
        return fired(d)

    def concurrently(self, calls: Callable[[Any], defer.Deferred], store: Any) -> Any:
        return self.rt.call(calls, store)

    def make(self, **options: Any) -> Any:
        """:returns: a new store (in the reactor thread)."""
        raise NotImplementedError

    def open(self, **options: Any) -> Stores:
        store = self.rt.call(lambda: self.make(**options))
        self.rt.call(store.start)
        return Stores(self, None, InReactorThread(self.rt, store))

    def close(self, stores: Stores) -> None:
        self.rt.call(real(stores.deliveries).stop)


class RedisBackend(ThreadedBackend):
    """Two connections, so that a client's calls must stay on one."""

    def __init__(self, request: Any, tmp_path: Any) -> None:
        super().__init__(request, tmp_path)
        self.url = request.getfixturevalue("redis_url")
        self.prefix = f"test:{uuid.uuid4().hex[:12]}:"

    def make(self, **options: Any) -> Any:
        return RedisDeviceMessageStore(self.url, pool_size=2, key_prefix=self.prefix,
                                       reactor=self.rt.reactor, **options)


class PostgresBackend(ThreadedBackend):
    def __init__(self, request: Any, tmp_path: Any) -> None:
        super().__init__(request, tmp_path)
        self.dsn = new_database(request.getfixturevalue("postgres_dsn"))

    def make(self, **options: Any) -> Any:
        return PostgresDeviceMessageStore(self.dsn, 1, 3, reactor=self.rt.reactor, **options)


#: name → backend class; the contract suites run once per entry (the
#: retained store suite on those with ``retained``).
BACKENDS = {
    "memory": MemoryBackend,
    "sqlite": SQLiteBackend,
    "redis": RedisBackend,
    "postgres": PostgresBackend,
}


def _names(durable: bool = False, retained: bool = False) -> list[str]:
    return sorted(name for name, cls in BACKENDS.items()
                  if (cls.durable or not durable) and (cls.retained or not retained))


def _open(request: Any, tmp_path: Any, **options: Any):
    backend = BACKENDS[request.param](request, tmp_path)
    opened = backend.open(**options)
    holder = [opened]
    opened.holder = holder
    yield opened
    backend.close(holder[-1])


@pytest.fixture(params=_names())
def stores(request: Any, tmp_path: Any):
    """Every backend's device store (and retained store, if it has one)."""
    yield from _open(request, tmp_path)


@pytest.fixture(params=_names(durable=True))
def durable_stores(request: Any, tmp_path: Any):
    """The backends whose data outlives the process: the restart tests."""
    yield from _open(request, tmp_path)


@pytest.fixture(params=_names())
def limited_stores(request: Any, tmp_path: Any):
    """Stores whose device store keeps at most 3 deliveries per client."""
    yield from _open(request, tmp_path, max_messages_per_client=3)


@pytest.fixture(params=_names(retained=True))
def retained_stores(request: Any, tmp_path: Any):
    """The backends with a retained store."""
    yield from _open(request, tmp_path)


@pytest.fixture(params=_names(durable=True, retained=True))
def durable_retained_stores(request: Any, tmp_path: Any):
    """The backends with a retained store that outlives the process."""
    yield from _open(request, tmp_path)


def reopen(stores: Stores, **options: Any) -> Stores:
    """Close and reopen a durable backend."""
    new = stores.reopen(**options)
    stores.holder.append(new)
    new.holder = stores.holder
    return new


# -- records --------------------------------------------------------------------


def full_properties() -> dict:
    return {
        Property.PAYLOAD_FORMAT_INDICATOR: 1,
        Property.MESSAGE_EXPIRY_INTERVAL: 3600,
        Property.CONTENT_TYPE: "application/json",
        Property.RESPONSE_TOPIC: "reply/here",
        Property.CORRELATION_DATA: b"\x00\xffcorr",
        Property.USER_PROPERTY: [("k", "v1"), ("k", "v2"), ("ü", "")],
    }


def message(topic: str = "a/b", payload: bytes = b"hello", **kwargs: Any) -> Message:
    return Message(topic=topic, payload=payload, **kwargs)


def rich_message(topic: str = "sensors/1/temp") -> Message:
    return Message(
        topic=topic,
        payload=b"\x00\x01binary\xff",
        qos=2,
        retain=True,
        properties=full_properties(),
        publisher="publisher-1",
        received_at=1700000000.25,
        expires_at=1700003600.25,
    )


def delivery(seq: int, **kwargs: Any) -> StoredDelivery:
    kwargs.setdefault("message", message(f"t/{seq}", b"p%d" % seq, qos=1))
    kwargs.setdefault("qos", 1)
    return StoredDelivery(seq=seq, **kwargs)


def by_topic(messages: list[Message]) -> dict[str, Message]:
    return {m.topic: m for m in messages}


# -- IRetainedStore -------------------------------------------------------------------


class TestRetainedStore:
    @pytest.fixture
    def stores(self, retained_stores):
        return retained_stores

    @pytest.fixture
    def durable_stores(self, durable_retained_stores):
        return durable_retained_stores

    def test_provides_interface(self, stores):
        assert verifyObject(IRetainedStore, stores.retained)

    def test_empty(self, stores):
        assert stores.result(stores.retained.load_all()) == []

    def test_round_trip_with_properties(self, stores):
        original = rich_message()
        assert stores.result(stores.retained.put(original)) is None
        (loaded,) = stores.result(stores.retained.load_all())
        assert loaded == original
        assert loaded.properties[Property.USER_PROPERTY] == [
            ("k", "v1"),
            ("k", "v2"),
            ("ü", ""),
        ]
        assert loaded.properties[Property.CORRELATION_DATA] == b"\x00\xffcorr"
        assert isinstance(loaded.payload, bytes)

    def test_minimal_message(self, stores):
        original = message("x", b"", retain=True)
        stores.result(stores.retained.put(original))
        assert stores.result(stores.retained.load_all()) == [original]

    def test_put_replaces_same_topic(self, stores):
        stores.result(stores.retained.put(rich_message("a")))
        stores.result(stores.retained.put(message("b", b"other", retain=True)))
        newer = message("a", b"newer", qos=1, retain=True, publisher="p2")
        stores.result(stores.retained.put(newer))
        loaded = by_topic(stores.result(stores.retained.load_all()))
        assert loaded == {"a": newer, "b": message("b", b"other", retain=True)}

    def test_remove(self, stores):
        stores.result(stores.retained.put(rich_message("a")))
        stores.result(stores.retained.put(rich_message("b")))
        assert stores.result(stores.retained.remove("a")) is None
        assert stores.result(stores.retained.load_all()) == [rich_message("b")]

    def test_remove_unknown(self, stores):
        assert stores.result(stores.retained.remove("nothing/here")) is None

    def test_topics_are_exact(self, stores):
        stores.result(stores.retained.put(message("a/b", b"1")))
        stores.result(stores.retained.put(message("a/b/", b"2")))
        stores.result(stores.retained.put(message("A/b", b"3")))
        stores.result(stores.retained.remove("a/b"))
        assert sorted(m.topic for m in stores.result(stores.retained.load_all())) == [
            "A/b",
            "a/b/",
        ]

    def test_messages_are_copies(self, stores):
        original = rich_message()
        stores.result(stores.retained.put(original))
        original.properties[Property.USER_PROPERTY].append(("x", "y"))
        original.payload = b"changed"
        (loaded,) = stores.result(stores.retained.load_all())
        assert loaded == rich_message()
        loaded.properties[Property.USER_PROPERTY].clear()
        loaded.properties[Property.CONTENT_TYPE] = "text/plain"
        assert stores.result(stores.retained.load_all()) == [rich_message()]

    def test_survives_reopen(self, durable_stores):
        stores = durable_stores
        stores.result(stores.retained.put(rich_message("a")))
        stores.result(stores.retained.put(rich_message("b")))
        stores.result(stores.retained.remove("b"))
        stores = reopen(stores)
        assert stores.result(stores.retained.load_all()) == [rich_message("a")]


# -- IDeviceMessageStore ---------------------------------------------------------------


class TestDeviceMessageStore:
    def test_provides_interface(self, stores):
        assert verifyObject(IDeviceMessageStore, real(stores.deliveries))

    def test_empty(self, stores):
        assert stores.result(stores.deliveries.load("nobody")) == []

    def test_round_trip(self, stores):
        rich = StoredDelivery(
            seq=7,
            message=rich_message(),
            qos=1,
            retain=True,
            subscription_ids=(3, 268435455),
            packet_id=65535,
            state=DeliveryState.SENT,
        )
        plain = delivery(8)
        assert stores.result(stores.deliveries.add("c", [rich, plain])) == 0
        loaded = stores.result(stores.deliveries.load("c"))
        assert loaded == [rich, plain]
        assert loaded[0].state is DeliveryState.SENT
        assert loaded[1].state is DeliveryState.QUEUED
        assert loaded[1].packet_id is None
        assert loaded[1].subscription_ids == ()

    def test_load_in_seq_order(self, stores):
        stores.result(stores.deliveries.add("c", [delivery(1), delivery(2)]))
        stores.result(stores.deliveries.add("c", [delivery(10), delivery(11)]))
        stores.result(stores.deliveries.add("c", [delivery(3)]))
        loaded = stores.result(stores.deliveries.load("c"))
        assert [d.seq for d in loaded] == [1, 2, 3, 10, 11]

    def test_add_empty_list(self, stores):
        assert stores.result(stores.deliveries.add("c", [])) == 0
        assert stores.result(stores.deliveries.load("c")) == []

    # -- add_run

    def test_add_run_is_an_add_of_its_deliveries(self, stores):
        """A run's messages are stored as one delivery each, with
        consecutive seqs from the first, the run's QoS, RETAIN flag and
        subscription identifiers, queued; read back as :meth:`add` would
        have stored them."""
        base = 1_790_000_000_000_000_000  # nanoseconds, as the broker's seqs
        messages = [rich_message("r/0"), message("r/1", b""), message("r/2", b"\xff" * 300)]
        assert stores.result(stores.deliveries.add_run(
            "c", base, messages, 1, True, (7, 268435455))) == 0
        assert stores.result(stores.deliveries.add_run("c", base + 3, [message("r/3")], 2)) == 0
        loaded = stores.result(stores.deliveries.load("c"))
        expected = [StoredDelivery(base + i, m, 1, True, (7, 268435455))
                    for i, m in enumerate(messages)]
        expected.append(StoredDelivery(base + 3, message("r/3"), 2))
        assert loaded == expected
        assert {(d.packet_id, d.state) for d in loaded} == {(None, DeliveryState.QUEUED)}
        assert stores.result(stores.deliveries.count("c")) == 4

    def test_add_run_keeps_order_with_adds_updates_and_removes(self, stores):
        """Runs, adds, updates and removes made without waiting apply in
        the order made; a run's delivery can be updated and removed by its
        seq like any other."""

        def burst(store: Any) -> defer.Deferred:
            return defer.gatherResults([
                store.add("c", [delivery(1)]),
                store.add_run("c", 2, [message("t/2"), message("t/3"), message("t/4")], 1),
                store.update("c", 3, 21, DeliveryState.SENT),
                store.remove("c", [2]),
                store.add("c", [delivery(5)]),
                store.add_run("d", 1, [message("t/1")], 1),
                store.load("c"),
            ])

        results = stores.concurrently(burst)
        assert [(d.seq, d.message.topic, d.packet_id) for d in results[-1]] == [
            (1, "t/1", None), (3, "t/3", 21), (4, "t/4", None), (5, "t/5", None)]
        assert [d.seq for d in stores.result(stores.deliveries.load("d"))] == [1]

    def test_add_run_of_nothing(self, stores):
        assert stores.result(stores.deliveries.add_run("c", 1, [], 1)) == 0
        assert stores.result(stores.deliveries.load("c")) == []

    def test_add_run_with_a_bad_first_seq_fails(self, stores):
        for bad in ("1", 1.0, None):
            with pytest.raises(TypeError):
                stores.result(stores.deliveries.add_run("c", bad, [message()], 1))
        assert stores.result(stores.deliveries.load("c")) == []

    def test_update_packet_id_and_state(self, stores):
        stores.result(stores.deliveries.add("c", [delivery(1, qos=2), delivery(2)]))
        assert (
            stores.result(stores.deliveries.update("c", 1, 17, DeliveryState.SENT))
            is None
        )
        loaded = stores.result(stores.deliveries.load("c"))
        assert (loaded[0].packet_id, loaded[0].state) == (17, DeliveryState.SENT)
        assert (loaded[1].packet_id, loaded[1].state) == (None, DeliveryState.QUEUED)
        stores.result(stores.deliveries.update("c", 1, 17, DeliveryState.RELEASED))
        loaded = stores.result(stores.deliveries.load("c"))
        assert loaded[0] == delivery(
            1, qos=2, packet_id=17, state=DeliveryState.RELEASED
        )
        assert isinstance(loaded[0].state, DeliveryState)

    def test_update_unknown_is_ignored(self, stores):
        stores.result(stores.deliveries.add("c", [delivery(1)]))
        stores.result(stores.deliveries.update("c", 2, 5, DeliveryState.SENT))
        stores.result(stores.deliveries.update("other", 1, 5, DeliveryState.SENT))
        assert stores.result(stores.deliveries.load("c")) == [delivery(1)]
        assert stores.result(stores.deliveries.load("other")) == []

    def test_remove(self, stores):
        stores.result(stores.deliveries.add("c", [delivery(i) for i in range(1, 6)]))
        assert stores.result(stores.deliveries.remove("c", [2, 4])) is None
        stores.result(stores.deliveries.remove("c", (s for s in [5, 99])))
        loaded = stores.result(stores.deliveries.load("c"))
        assert [d.seq for d in loaded] == [1, 3]

    def test_remove_nothing(self, stores):
        assert stores.result(stores.deliveries.remove("nobody", [])) is None
        assert stores.result(stores.deliveries.remove("nobody", [1])) is None

    def test_clear(self, stores):
        stores.result(stores.deliveries.add("c", [delivery(1), delivery(2)]))
        stores.result(stores.deliveries.add("d", [delivery(1)]))
        assert stores.result(stores.deliveries.clear("c")) is None
        assert stores.result(stores.deliveries.load("c")) == []
        assert stores.result(stores.deliveries.load("d")) == [delivery(1)]
        assert stores.result(stores.deliveries.clear("nobody")) is None

    def test_clients_are_isolated(self, stores):
        stores.result(stores.deliveries.add("c", [delivery(1), delivery(2)]))
        stores.result(stores.deliveries.add("d", [delivery(1, qos=2), delivery(3)]))
        stores.result(stores.deliveries.update("c", 1, 9, DeliveryState.SENT))
        stores.result(stores.deliveries.remove("d", [3]))
        assert stores.result(stores.deliveries.load("c")) == [
            delivery(1, packet_id=9, state=DeliveryState.SENT),
            delivery(2),
        ]
        assert stores.result(stores.deliveries.load("d")) == [delivery(1, qos=2)]

    def test_deliveries_are_copies(self, stores):
        original = delivery(1, message=rich_message(), subscription_ids=(1,))
        stores.result(stores.deliveries.add("c", [original]))
        original.message.properties[Property.USER_PROPERTY].append(("x", "y"))
        original.state = DeliveryState.SENT
        expected = delivery(1, message=rich_message(), subscription_ids=(1,))
        (loaded,) = stores.result(stores.deliveries.load("c"))
        assert loaded == expected
        loaded.packet_id = 3
        loaded.message.properties.clear()
        assert stores.result(stores.deliveries.load("c")) == [expected]

    def test_survives_reopen(self, durable_stores):
        stores = durable_stores
        stores.result(
            stores.deliveries.add(
                "c", [delivery(1, message=rich_message()), delivery(2), delivery(3)]
            )
        )
        stores.result(stores.deliveries.update("c", 1, 4, DeliveryState.RELEASED))
        stores.result(stores.deliveries.remove("c", [2]))
        stores = reopen(stores)
        assert stores.result(stores.deliveries.load("c")) == [
            delivery(
                1, message=rich_message(), packet_id=4, state=DeliveryState.RELEASED
            ),
            delivery(3),
        ]


    # -- paging and counting

    def test_load_after_seq(self, stores):
        stores.result(stores.deliveries.add("c", [delivery(s) for s in (1, 2, 5, 9)]))
        stores.result(stores.deliveries.add("d", [delivery(3)]))
        load = stores.deliveries.load
        assert [d.seq for d in stores.result(load("c", after_seq=2))] == [5, 9]
        assert [d.seq for d in stores.result(load("c", after_seq=0))] == [1, 2, 5, 9]
        assert [d.seq for d in stores.result(load("c", after_seq=4))] == [5, 9]
        assert stores.result(load("c", after_seq=9)) == []
        assert stores.result(load("c", after_seq=5)) == [delivery(9)]

    def test_load_limit(self, stores):
        stores.result(stores.deliveries.add("c", [delivery(s) for s in (4, 1, 3, 2)]))
        load = stores.deliveries.load
        assert [d.seq for d in stores.result(load("c", limit=2))] == [1, 2]
        assert [d.seq for d in stores.result(load("c", limit=10))] == [1, 2, 3, 4]
        assert stores.result(load("c", limit=0)) == []
        assert [d.seq for d in stores.result(load("c", after_seq=1, limit=2))] == [2, 3]

    def test_pages_cover_the_queue_once(self, stores):
        stores.result(stores.deliveries.add("c", [delivery(s) for s in range(1, 12)]))
        stores.result(stores.deliveries.update("c", 5, 7, DeliveryState.SENT))
        pages, after = [], None
        while True:
            page = stores.result(stores.deliveries.load("c", after_seq=after, limit=4))
            if not page:
                break
            pages.append([d.seq for d in page])
            after = page[-1].seq
        assert pages == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]]
        assert stores.result(stores.deliveries.load("c")) == [
            delivery(s, packet_id=7, state=DeliveryState.SENT) if s == 5 else delivery(s)
            for s in range(1, 12)
        ]

    def test_bad_page_arguments_fail(self, stores):
        stores.result(stores.deliveries.add("c", [delivery(1)]))
        failure_of(stores.deliveries.load("c", limit=-1)).trap(ValueError)
        failure_of(stores.deliveries.load("c", after_seq="1")).trap(TypeError)
        assert stores.result(stores.deliveries.load("c")) == [delivery(1)]

    def test_count(self, stores):
        deliveries = stores.deliveries
        assert stores.result(deliveries.count("c")) == 0
        stores.result(deliveries.add("c", [delivery(1), delivery(2), delivery(3)]))
        stores.result(deliveries.add("d", [delivery(1)]))
        stores.result(deliveries.add("c", [delivery(2, qos=2)]))  # replaces seq 2
        assert stores.result(deliveries.count("c")) == 3
        stores.result(deliveries.remove("c", [1, 99]))
        assert stores.result(deliveries.count("c")) == 2
        assert stores.result(deliveries.count("d")) == 1
        stores.result(deliveries.clear("c"))
        assert stores.result(deliveries.count("c")) == 0
        assert stores.result(deliveries.count("nobody")) == 0

    def test_nanosecond_seqs_keep_their_order(self, stores):
        """The broker's seqs are nanosecond timestamps, beyond what a double
        tells apart (Redis scores): order and paging stay exact."""
        base = 1_700_000_000_123_456_000
        seqs = [base + i for i in (3, 0, 5, 1, 4, 2)] + [base + 1000, base - 1000]
        stores.result(stores.deliveries.add("c", [delivery(s) for s in seqs]))
        stores.result(stores.deliveries.update("c", base + 2, 9, DeliveryState.SENT))
        stores.result(stores.deliveries.remove("c", [base + 4]))
        load = stores.deliveries.load
        expected = [base - 1000, base, base + 1, base + 2, base + 3, base + 5, base + 1000]
        assert [d.seq for d in stores.result(load("c"))] == expected
        pages, after = [], None
        while True:
            page = stores.result(load("c", after_seq=after, limit=2))
            if not page:
                break
            pages.append([d.seq - base for d in page])
            after = page[-1].seq
        assert pages == [[-1000, 0], [1, 2], [3, 5], [1000]]
        assert [d.seq - base for d in stores.result(load("c", after_seq=base + 4))] == [5, 1000]
        (sent,) = stores.result(load("c", after_seq=base + 1, limit=1))
        assert (sent.seq, sent.packet_id, sent.state) == (base + 2, 9, DeliveryState.SENT)

    # -- order of calls

    def test_calls_of_a_client_keep_their_order(self, stores):
        """Calls made without waiting for each other apply, per client, in
        the order they were made (ARCHITECTURE §3): a remove after an add
        removes, a load sees the writes before it and none after it."""
        clients = [f"client-{i}" for i in range(16)]

        def burst(store: Any) -> defer.Deferred:
            calls = [store.add(c, [delivery(1), delivery(2), delivery(3)]) for c in clients]
            for i, c in enumerate(clients):
                calls += [
                    store.update(c, 1, 11, DeliveryState.SENT),
                    store.remove(c, [2]),
                    store.load(c),
                    store.add(c, [delivery(2, qos=2)]),
                    store.clear(c) if i % 4 == 0 else store.remove(c, [3]),
                    store.count(c),
                    store.update(c, 2, 12, DeliveryState.RELEASED),
                    store.load(c),
                ]
            return defer.gatherResults(calls)

        results = stores.concurrently(burst)
        assert results[:len(clients)] == [0] * len(clients)
        for i, c in enumerate(clients):
            (_, _, first_load, _, _, count, _, last_load) = results[
                len(clients) + 8 * i: len(clients) + 8 * (i + 1)]
            assert first_load == [delivery(1, packet_id=11, state=DeliveryState.SENT),
                                  delivery(3)], c
            if i % 4 == 0:
                assert (count, last_load) == (0, []), c
            else:
                assert count == 2, c
                assert last_load == [
                    delivery(1, packet_id=11, state=DeliveryState.SENT),
                    delivery(2, qos=2, packet_id=12, state=DeliveryState.RELEASED)], c
        assert stores.result(stores.deliveries.load(clients[1])) == last_load

    # -- max_messages_per_client

    def test_unlimited_by_default(self, stores):
        assert stores.result(
            stores.deliveries.add("c", [delivery(s) for s in range(1, 101)])) == 0
        assert stores.result(stores.deliveries.count("c")) == 100

    def test_limit_removes_the_oldest(self, limited_stores):
        stores, deliveries = limited_stores, limited_stores.deliveries
        assert stores.result(deliveries.add("c", [delivery(1), delivery(2)])) == 0
        assert stores.result(deliveries.update("c", 1, 5, DeliveryState.SENT)) is None
        assert stores.result(deliveries.add("c", [delivery(3)])) == 0
        # in flight or not, the lowest seqs go first
        assert stores.result(deliveries.add("c", [delivery(4)])) == 1
        assert [d.seq for d in stores.result(deliveries.load("c"))] == [2, 3, 4]
        assert stores.result(deliveries.add("c", [delivery(s) for s in (5, 6, 7, 8)])) == 4
        assert [d.seq for d in stores.result(deliveries.load("c"))] == [6, 7, 8]
        assert stores.result(deliveries.count("c")) == 3

    def test_limit_is_per_client_and_counts_replacements_once(self, limited_stores):
        stores, deliveries = limited_stores, limited_stores.deliveries
        stores.result(deliveries.add("c", [delivery(1), delivery(2), delivery(3)]))
        assert stores.result(deliveries.add("d", [delivery(1), delivery(2)])) == 0
        assert stores.result(deliveries.add("c", [delivery(3, qos=2)])) == 0  # a replacement
        stores.result(deliveries.remove("c", [1]))
        assert stores.result(deliveries.add("c", [delivery(4)])) == 0  # room again
        assert [d.seq for d in stores.result(deliveries.load("c"))] == [2, 3, 4]
        assert [d.seq for d in stores.result(deliveries.load("d"))] == [1, 2]

    def test_limit_counts_every_removal_once_under_concurrency(self, limited_stores):
        """Adds made without waiting (merged by some backends) report, in
        sum, each delivery the limit removed."""
        stores = limited_stores

        def burst(store: Any) -> defer.Deferred:
            calls = [store.add("c", [delivery(s)]) for s in range(1, 9)]
            calls += [store.add("d", [delivery(s), delivery(s + 100)]) for s in range(1, 4)]
            return defer.gatherResults(calls)

        results = stores.concurrently(burst)
        assert sum(results[:8]) == 5 and sum(results[8:]) == 3
        assert [d.seq for d in stores.result(stores.deliveries.load("c"))] == [6, 7, 8]
        assert [d.seq for d in stores.result(stores.deliveries.load("d"))] == [101, 102, 103]

    def test_limit_trims_after_a_run(self, limited_stores):
        stores, deliveries = limited_stores, limited_stores.deliveries
        assert stores.result(deliveries.add("c", [delivery(1)])) == 0
        assert stores.result(deliveries.add_run(
            "c", 2, [message(f"t/{s}") for s in range(2, 7)], 1)) == 3
        assert [d.seq for d in stores.result(deliveries.load("c"))] == [4, 5, 6]

    def test_a_run_survives_reopen(self, durable_stores):
        stores = durable_stores
        stores.result(stores.deliveries.add_run("c", 10, [rich_message(), message()], 1))
        stores = reopen(stores)
        assert stores.result(stores.deliveries.load("c")) == [
            StoredDelivery(10, rich_message(), 1), StoredDelivery(11, message(), 1)]

    def test_trimmed_deliveries_stay_gone_after_reopen(self, durable_stores):
        stores = reopen(durable_stores, max_messages_per_client=2)
        assert stores.result(
            stores.deliveries.add("c", [delivery(1), delivery(2), delivery(3)])) == 1
        stores = reopen(stores)  # no limit now: nothing more goes
        assert stores.result(stores.deliveries.add("c", [delivery(4)])) == 0
        assert [d.seq for d in stores.result(stores.deliveries.load("c"))] == [2, 3, 4]
