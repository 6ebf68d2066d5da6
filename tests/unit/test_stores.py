"""The contract suites of the storage interfaces, run against every backend.

One suite per interface (:class:`~tbmq.interfaces.ISessionStore`,
:class:`~tbmq.interfaces.IRetainedStore`,
:class:`~tbmq.interfaces.IDeviceMessageStore`), written once.  The ``stores``
fixture is parametrised over :data:`BACKENDS`: adding a backend is one entry
there, a class with ``open()``, ``close()``, ``durable`` and ``result(d)``.

The embedded backends answer synchronously here: the memory stores return
fired Deferreds, and the SQLite store runs on a synchronous thread pool and
reactor (:class:`SyncThreadPool`, :class:`SyncReactor`).  The SQLite-specific
tests at the end drive its queue by hand (:class:`ManualThreadPool`).
"""

from __future__ import annotations

import sqlite3
from typing import Any, Callable

import pytest
from twisted.internet import defer
from twisted.python.failure import Failure
from zope.interface.verify import verifyObject

from tbmq.backends.memory import (
    MemoryDeviceMessageStore,
    MemoryRetainedStore,
    MemorySessionStore,
)
from tbmq.backends.sqlite import SQLiteStore
from tbmq.errors import BackendError
from tbmq.interfaces import IDeviceMessageStore, IRetainedStore, ISessionStore
from tbmq.model import (
    ClientType,
    DeliveryState,
    Message,
    SessionRecord,
    StoredDelivery,
    SubscriptionOptions,
)
from tbmq.mqtt.constants import Property

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


# -- backends -------------------------------------------------------------------


class Stores:
    """The three stores of one backend, started."""

    def __init__(self, backend: Any, sessions: Any, retained: Any, deliveries: Any):
        self.backend = backend
        self.sessions = sessions
        self.retained = retained
        self.deliveries = deliveries

    def result(self, d: defer.Deferred) -> Any:
        return self.backend.result(d)

    def reopen(self, **options: Any) -> "Stores":
        """Close these stores and open new ones on the same data."""
        self.backend.close(self)
        return self.backend.open(**options)


class MemoryBackend:
    durable = False

    def __init__(self, tmp_path: Any) -> None:
        pass

    def result(self, d: defer.Deferred) -> Any:
        return fired(d)

    def open(self, **options: Any) -> Stores:
        stores = Stores(
            self, MemorySessionStore(), MemoryRetainedStore(),
            MemoryDeviceMessageStore(**options)
        )
        for store in (stores.sessions, stores.retained, stores.deliveries):
            fired(store.start())
        return stores

    def close(self, stores: Stores) -> None:
        for store in (stores.sessions, stores.retained, stores.deliveries):
            fired(store.stop())


class SQLiteBackend:
    durable = True

    def __init__(self, tmp_path: Any) -> None:
        self.path = str(tmp_path / "data" / "tbmq.sqlite")

    def result(self, d: defer.Deferred) -> Any:
        return fired(d)

    def open(self, **options: Any) -> Stores:
        store = SQLiteStore(
            self.path, reactor=SyncReactor(), threadpool=SyncThreadPool(), **options
        )
        stores = Stores(self, store.sessions, store.retained, store.deliveries)
        for view in (stores.sessions, stores.retained, stores.deliveries):
            fired(view.start())
        return stores

    def close(self, stores: Stores) -> None:
        for view in (stores.sessions, stores.retained, stores.deliveries):
            fired(view.stop())


#: name → backend class; the contract suites run once per entry.
BACKENDS = {"memory": MemoryBackend, "sqlite": SQLiteBackend}


def _open(name: str, tmp_path: Any, **options: Any):
    backend = BACKENDS[name](tmp_path)
    opened = backend.open(**options)
    holder = [opened]
    opened.holder = holder
    yield opened
    backend.close(holder[-1])


@pytest.fixture(params=sorted(BACKENDS))
def stores(request: Any, tmp_path: Any):
    yield from _open(request.param, tmp_path)


@pytest.fixture(params=sorted(name for name, cls in BACKENDS.items() if cls.durable))
def durable_stores(request: Any, tmp_path: Any):
    """The backends whose data outlives the process: the restart tests."""
    yield from _open(request.param, tmp_path)


@pytest.fixture(params=sorted(BACKENDS))
def limited_stores(request: Any, tmp_path: Any):
    """Stores whose device store keeps at most 3 deliveries per client."""
    yield from _open(request.param, tmp_path, max_messages_per_client=3)


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


def rich_session(client_id: str = "client-1") -> SessionRecord:
    return SessionRecord(
        client_id=client_id,
        protocol_level=5,
        session_expiry_interval=0xFFFFFFFF,
        client_type=ClientType.APPLICATION,
        disconnected_at=1700000000.5,
        subscriptions={
            "a/+/c": SubscriptionOptions(),
            "d/#": SubscriptionOptions(
                qos=2,
                no_local=True,
                retain_as_published=True,
                retain_handling=2,
                subscription_id=268435455,
            ),
            "$share/group/e/f": SubscriptionOptions(
                qos=1, retain_handling=1, subscription_id=1
            ),
        },
    )


def delivery(seq: int, **kwargs: Any) -> StoredDelivery:
    kwargs.setdefault("message", message(f"t/{seq}", b"p%d" % seq, qos=1))
    kwargs.setdefault("qos", 1)
    return StoredDelivery(seq=seq, **kwargs)


def by_id(records: list[SessionRecord]) -> dict[str, SessionRecord]:
    return {r.client_id: r for r in records}


def by_topic(messages: list[Message]) -> dict[str, Message]:
    return {m.topic: m for m in messages}


# -- ISessionStore ----------------------------------------------------------------


class TestSessionStore:
    def test_provides_interface(self, stores):
        assert verifyObject(ISessionStore, stores.sessions)

    def test_empty(self, stores):
        assert stores.result(stores.sessions.load_all()) == []

    def test_round_trip(self, stores):
        record = rich_session()
        assert stores.result(stores.sessions.save(record)) is None
        (loaded,) = stores.result(stores.sessions.load_all())
        assert loaded == record
        assert loaded.client_type is ClientType.APPLICATION
        assert loaded.subscriptions["d/#"].no_local is True
        assert loaded.subscriptions["a/+/c"].subscription_id is None

    def test_defaults_round_trip(self, stores):
        record = SessionRecord(client_id="plain")
        stores.result(stores.sessions.save(record))
        assert stores.result(stores.sessions.load_all()) == [record]

    def test_several_sessions(self, stores):
        records = [rich_session("a"), SessionRecord("b", protocol_level=3), rich_session("c")]
        for record in records:
            stores.result(stores.sessions.save(record))
        assert by_id(stores.result(stores.sessions.load_all())) == by_id(records)

    def test_save_replaces_session_and_subscriptions(self, stores):
        stores.result(stores.sessions.save(rich_session("a")))
        stores.result(stores.sessions.save(rich_session("b")))
        replacement = SessionRecord(
            client_id="a",
            protocol_level=4,
            session_expiry_interval=60,
            client_type=ClientType.DEVICE,
            disconnected_at=None,
            subscriptions={"x/y": SubscriptionOptions(qos=1)},
        )
        stores.result(stores.sessions.save(replacement))
        loaded = by_id(stores.result(stores.sessions.load_all()))
        assert loaded["a"] == replacement
        assert loaded["b"] == rich_session("b")

    def test_save_without_subscriptions_removes_them(self, stores):
        stores.result(stores.sessions.save(rich_session("a")))
        stores.result(stores.sessions.save(SessionRecord("a", protocol_level=5)))
        (loaded,) = stores.result(stores.sessions.load_all())
        assert loaded.subscriptions == {}

    def test_delete(self, stores):
        stores.result(stores.sessions.save(rich_session("a")))
        stores.result(stores.sessions.save(rich_session("b")))
        assert stores.result(stores.sessions.delete("a")) is None
        assert [r.client_id for r in stores.result(stores.sessions.load_all())] == ["b"]

    def test_delete_unknown(self, stores):
        assert stores.result(stores.sessions.delete("nobody")) is None

    def test_delete_then_save_has_no_old_subscriptions(self, stores):
        stores.result(stores.sessions.save(rich_session("a")))
        stores.result(stores.sessions.delete("a"))
        stores.result(stores.sessions.save(SessionRecord("a")))
        assert stores.result(stores.sessions.load_all()) == [SessionRecord("a")]

    def test_records_are_copies(self, stores):
        record = rich_session("a")
        stores.result(stores.sessions.save(record))
        record.subscriptions["new/filter"] = SubscriptionOptions()
        record.protocol_level = 3
        (loaded,) = stores.result(stores.sessions.load_all())
        assert loaded == rich_session("a")
        loaded.subscriptions.clear()
        loaded.disconnected_at = None
        assert stores.result(stores.sessions.load_all()) == [rich_session("a")]

    def test_survives_reopen(self, durable_stores):
        stores = durable_stores
        stores.result(stores.sessions.save(rich_session("a")))
        stores.result(stores.sessions.save(rich_session("b")))
        stores.result(stores.sessions.delete("b"))
        stores = reopen(stores)
        assert stores.result(stores.sessions.load_all()) == [rich_session("a")]


# -- IRetainedStore -------------------------------------------------------------------


class TestRetainedStore:
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
        assert verifyObject(IDeviceMessageStore, stores.deliveries)

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

    def test_trimmed_deliveries_stay_gone_after_reopen(self, durable_stores):
        stores = reopen(durable_stores, max_messages_per_client=2)
        assert stores.result(
            stores.deliveries.add("c", [delivery(1), delivery(2), delivery(3)])) == 1
        stores = reopen(stores)  # no limit now: nothing more goes
        assert stores.result(stores.deliveries.add("c", [delivery(4)])) == 0
        assert [d.seq for d in stores.result(stores.deliveries.load("c"))] == [2, 3, 4]

# -- SQLite specifics -------------------------------------------------------------------


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
        assert set(writes.puts) == {("c", 4)} and writes.puts[("c", 4)][13:] == [8, 1]
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
        fired(store.sessions.start())
        fired(store.sessions.start())
        fired(store.retained.start())
        fired(store.start())
        assert store.running
        fired(store.sessions.stop())
        assert store.running
        fired(store.sessions.stop())  # not started twice: no effect
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
        fired(store.sessions.start())
        fired(store.stop())
        fired(store.sessions.start())
        assert store.running
        fired(store.sessions.stop())
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
        assert {"sessions", "subscriptions", "retained", "deliveries"} <= tables
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
        assert store.sessions.runner is store.retained.runner is store.deliveries.runner is store.runner
        assert verifyObject(ISessionStore, store.sessions)
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
