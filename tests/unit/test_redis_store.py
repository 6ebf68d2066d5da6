"""The Redis device store beyond the contract of ``test_stores.py``: TBMQ's
key layout, the TTL, scripts lost by the server, outages, the URL, and the
plugin.  Stores run on the private reactor thread of :mod:`tests.postgres`
against real ``redis-server`` processes (:mod:`tests.redis_server`); the
raw reads go through txredisapi's protocol on the same reactor.
"""

from __future__ import annotations

import ast
import pathlib
import threading
import time
import uuid
from typing import Any

import msgpack
import pytest
from tbmq_plugins.redis_connections import RedisConnection, parse_redis_url
from tbmq_plugins.redis_store import RedisDeviceMessageStore, RedisPlugin
from twisted.internet import defer, task
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure

from tbmq.backends.deliveries import encode_delivery
from tbmq.cluster.records import DELIVERY
from tbmq.config import load_config
from tbmq.errors import BackendError
from tbmq.model import DeliveryState
from tests.postgres import Blocking, failure_of
from tests.redis_server import RedisServer
from tests.unit.test_stores import delivery


@pytest.fixture
def open_store(started, reactor_thread):
    """``open_store(url, **options)``: a started store with a key prefix
    of its own (blocking), stopped at the end of the test."""

    def open_store(url: str, **options: Any) -> Blocking:
        options.setdefault("key_prefix", f"test:{uuid.uuid4().hex[:12]}:")
        return started(lambda: RedisDeviceMessageStore(
            url, reactor=reactor_thread.reactor, **options))

    return open_store


@pytest.fixture
def raw(redis_url, reactor_thread):
    """A txredisapi protocol connected to the test server (blocking)."""
    connection = RedisConnection(parse_redis_url(redis_url), reactor_thread.reactor)
    reactor_thread.call(connection.start)
    yield Blocking(reactor_thread, connection.protocol)
    reactor_thread.call(connection.stop)


# -- the layout ----------------------------------------------------------------------


def test_keys_follow_tbmq_layout(open_store, raw, redis_url):
    store = open_store(redis_url, message_ttl=None)
    prefix = store.key_prefix
    store.add("dev/1", [delivery(5), delivery(1_700_000_000_123_456_789)])
    store.update("dev/1", 5, 77, DeliveryState.SENT)
    queue = f"{prefix}{{dev/1}}_messages"
    assert sorted(raw.keys(f"{prefix}*")) == sorted([
        queue.encode(), f"{queue}_{5:019d}".encode(),
        f"{queue}_{1_700_000_000_123_456_789:019d}".encode()])
    assert raw.type(queue) == "zset"
    members = raw.zrange(queue, 0, -1, withscores=True)
    assert [m for m, _ in members] == [b"%019d" % 5, b"%019d" % 1_700_000_000_123_456_789]
    assert [float(score) for _, score in members] == [5.0, 1.7000000001234568e18]
    fields = raw.hgetall(f"{queue}_{5:019d}")
    assert (fields[b"p"], fields[b"s"]) == (b"77", b"1")
    record = DELIVERY.decode(fields[b"d"])
    assert (record.client_id, record.seq, record.message) == ("dev/1", 5, delivery(5).message)


def test_ttl_is_set_on_every_key(open_store, raw, redis_url):
    store = open_store(redis_url, message_ttl=300)
    store.add("c", [delivery(1), delivery(2)])
    keys = raw.keys(f"{store.key_prefix}*")
    assert len(keys) == 3
    assert all(290 <= raw.ttl(key) <= 300 for key in keys)
    store.update("c", 1, 3, DeliveryState.SENT)  # an update keeps the TTL
    assert all(290 <= raw.ttl(key) <= 300 for key in keys)
    never = open_store(redis_url, message_ttl=None)
    never.add("c", [delivery(1)])
    assert {raw.ttl(key) for key in raw.keys(f"{never.key_prefix}*")} == {-1}


def test_expired_deliveries_are_gone(open_store, raw, redis_url):
    store = open_store(redis_url, message_ttl=1)
    store.add("c", [delivery(1), delivery(2)])
    store.add("c", [delivery(3)])
    queue = f"{store.key_prefix}{{c}}_messages"
    raw.persist(queue)  # the sorted set outlives its messages: the reads clean it up
    time.sleep(1.2)
    assert store.load("c") == []
    assert raw.zcard(queue) == 0
    store.add("c", [delivery(4)])
    raw.persist(queue)
    time.sleep(1.2)
    store.add("c", [delivery(5)])
    assert store.count("c") == 1
    assert raw.zrange(queue, 0, -1) == [b"%019d" % 5]
    assert [d.seq for d in store.load("c")] == [5]


def test_trim_does_not_count_expired_deliveries(open_store, raw, redis_url):
    store = open_store(redis_url, message_ttl=1,
                       max_messages_per_client=2)
    store.add("c", [delivery(1), delivery(2)])
    raw.persist(f"{store.key_prefix}{{c}}_messages")
    time.sleep(1.2)
    assert store.add("c", [delivery(3)]) == 0  # 1 leaves the set, but had expired
    assert store.add("c", [delivery(4), delivery(5)]) == 1
    assert [d.seq for d in store.load("c")] == [4, 5]


def test_a_flushed_script_is_loaded_again(open_store, raw, redis_url):
    store = open_store(redis_url)
    store.add("c", [delivery(1)])
    assert raw.script_flush() == "OK"
    assert store.add("c", [delivery(2)]) == 0
    assert [d.seq for d in store.load("c", after_seq=1)] == [2]
    raw.script_flush()
    assert store.count("c") == 2


def test_seqs_outside_the_member_range_are_refused(open_store, redis_url):
    store = open_store(redis_url)
    assert isinstance(failure_of(store.add, "c", [delivery(-1)]), ValueError)
    assert isinstance(failure_of(store.add, "c", [delivery(2 ** 63)]), ValueError)
    assert isinstance(failure_of(store.remove, "c", ["1"]), TypeError)
    assert store.load("c", after_seq=2 ** 64) == []
    store.add("c", [delivery(0), delivery(2 ** 63 - 1)])
    assert [d.seq for d in store.load("c", after_seq=-5)] == [0, 2 ** 63 - 1]
    assert [d.seq for d in store.load("c", after_seq=2 ** 63 - 2)] == [2 ** 63 - 1]
    assert store.load("c", after_seq=2 ** 63 - 1) == []


def test_database_and_password_from_the_url(reactor_thread):
    server = RedisServer(args=["--requirepass", "s3cret"])
    server.start()
    try:
        def store(url: str) -> Blocking:
            return Blocking(reactor_thread, reactor_thread.call(
                lambda: RedisDeviceMessageStore(url, pool_size=1, reactor=reactor_thread.reactor)))

        wrong = store(f"redis://:nope@127.0.0.1:{server.port}/0")
        error = failure_of(wrong.start)
        assert isinstance(error, BackendError) and "auth" in str(error).lower()
        assert not wrong.running
        good = store(f"redis://:s3cret@127.0.0.1:{server.port}/3")
        good.start()
        good.add("c", [delivery(1)])
        connection = Blocking(reactor_thread, RedisConnection(
            parse_redis_url(f"redis://:s3cret@127.0.0.1:{server.port}/3"),
            reactor_thread.reactor))
        connection.start()
        raw = Blocking(reactor_thread, connection.protocol)
        assert sorted(raw.keys("tbmq:*")) == [
            b"tbmq:{c}_messages", b"tbmq:{c}_messages_%019d" % 1]
        assert raw.select(0) == "OK"
        assert raw.keys("tbmq:*") == []
        connection.stop()
        good.stop()
    finally:
        server.close()


# -- outages --------------------------------------------------------------------------


class Events:
    """The Redis store's log events, from any thread."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.lock = threading.Lock()

    def __call__(self, event: dict) -> None:
        if event.get("log_namespace") == "tbmq_plugins.redis_store":
            with self.lock:
                self.events.append(event)

    def formats(self) -> list[str]:
        with self.lock:
            return [e["log_format"] for e in self.events]


def test_outage_fails_calls_then_recovers_on_its_own(reactor_thread):
    server = RedisServer()
    server.start()
    events = Events()
    globalLogPublisher.addObserver(events)
    store = Blocking(reactor_thread, reactor_thread.call(lambda: RedisDeviceMessageStore(
        server.url, pool_size=2, reactor=reactor_thread.reactor)))
    try:
        store.start()
        assert store.add("c", [delivery(1)]) == 0
        server.stop()
        started = time.monotonic()
        for client in ("c", "d", "e", "f"):  # both connections, each call fails
            assert isinstance(failure_of(store.add, client, [delivery(2)]), BackendError)
            assert isinstance(failure_of(store.load, client), BackendError)
        assert time.monotonic() - started < 5
        server.start()  # the same port, an empty server
        deadline = time.monotonic() + 20
        while True:
            try:
                assert store.add("c", [delivery(3)]) == 0
                assert store.add("d", [delivery(3)]) == 0
                break
            except BackendError:
                assert time.monotonic() < deadline, "the store did not reconnect"
                time.sleep(0.1)
        assert [d.seq for d in store.load("c")] == [3]
        deadline = time.monotonic() + 10
        while not any("again" in f for f in events.formats()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        lost = [f for f in events.formats() if "lost" in f]
        again = [f for f in events.formats() if "again" in f]
        assert (len(lost), len(again)) == (1, 1), events.formats()
    finally:
        globalLogPublisher.removeObserver(events)
        store.stop()
        server.close()


def test_unreachable_redis_fails_start(reactor_thread):
    server = RedisServer()  # never started: its port is closed
    store = Blocking(reactor_thread, reactor_thread.call(lambda: RedisDeviceMessageStore(
        server.url, reactor=reactor_thread.reactor)))
    started = time.monotonic()
    error = failure_of(store.start)
    assert isinstance(error, BackendError) and str(server.port) in str(error)
    assert time.monotonic() - started < 5
    assert not store.running and store.target._connections == []
    assert isinstance(failure_of(store.add, "c", [delivery(1)]), BackendError)
    server.close()


def test_calls_after_stop_fail(open_store, redis_url):
    store = open_store(redis_url)
    store.stop()
    assert isinstance(failure_of(store.count, "c"), BackendError)
    assert isinstance(failure_of(store.add, "c", []), BackendError)


# -- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize("url, expected", [
    ("redis://127.0.0.1:6379/0", ("127.0.0.1", 6379, 0, None, None, False)),
    ("redis://cache", ("cache", 6379, None, None, None, False)),
    ("redis://:p%40ss@h:7000/2", ("h", 7000, 2, None, "p@ss", False)),
    ("rediss://user:pw@h/", ("h", 6379, None, "user", "pw", True)),
])
def test_parse_redis_url(url, expected):
    t = parse_redis_url(url)
    assert (t.host, t.port, t.db, t.username, t.password, t.tls) == expected
    assert "pw" not in str(t) and "ss" not in str(t).replace("rediss", "")


@pytest.mark.parametrize("url", ["http://h", "redis://h:port", "redis://h/db"])
def test_bad_redis_urls(url):
    with pytest.raises(ValueError):
        parse_redis_url(url)


def test_plugin_builds_the_store_when_configured():
    config = load_config(None, environ={}, overrides={
        "storage": {"device_store": "redis", "max_messages_per_client": 50},
        "redis": {"url": "redis://cache:7000/1", "pool_size": 3, "key_prefix": "x:",
                  "message_ttl": 60}})
    store = RedisPlugin().tbmq_device_message_store(config=config)
    assert isinstance(store, RedisDeviceMessageStore)
    assert (str(store.target), store.pool_size, store.key_prefix, store.message_ttl,
            store.max_messages_per_client) == ("redis://cache:7000/1", 3, "x:", 60, 50)
    assert RedisPlugin().tbmq_device_message_store(config=load_config(None, environ={})) is None


def test_plugin_is_declared_as_an_entry_point():
    setup = pathlib.Path(__file__).resolve().parents[2] / "setup.py"
    declared = [node.value for node in ast.walk(ast.parse(setup.read_text()))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    assert "redis = tbmq_plugins.redis_store:plugin" in declared
    from tbmq_plugins import redis_store

    assert isinstance(redis_store.plugin, RedisPlugin)


def test_load_reply_is_one_msgpack_array(open_store, raw, redis_url):
    """The load script answers with one bulk string (one msgpack array)."""
    store = open_store(redis_url)
    store.add("c", [delivery(1, packet_id=4, state=DeliveryState.SENT), delivery(2)])
    queue = f"{store.key_prefix}{{c}}_messages"
    from tbmq_plugins.redis_scripts import LOAD

    reply = raw.evalsha(LOAD.sha, [queue], ["-inf", "", -1])
    items = msgpack.unpackb(reply, raw=True)
    assert items[0::4] == [b"%019d" % 1, b"%019d" % 2]
    assert items[1::4] == [b"4", b""] and items[2::4] == [b"1", b"0"]


class _OutOfStepProtocol:
    """A txredisapi protocol whose replies came out of step with its calls:
    it answers each call with the reply queued for an earlier one."""

    def __init__(self, replies: list) -> None:
        self.replies = replies
        self.transport = self
        self.aborted = False

    def evalsha(self, sha, keys, args):
        return defer.succeed(self.replies.pop(0))

    def abortConnection(self):
        self.aborted = True


@pytest.mark.parametrize("call, reply", [
    (lambda s: s.add("c", [delivery(5)]), b"\x90"),
    (lambda s: s.load("c"), 3),
], ids=["add answered with bytes", "load answered with a count"])
def test_a_reply_of_the_wrong_type_drops_the_connection_and_fails_the_call(call, reply):
    """An add answered with bytes (another call's LOAD reply) or a load
    answered with a count: the call fails (its caller retries) and the
    connection, whose replies no longer match its calls, is dropped."""
    from types import SimpleNamespace

    clock = task.Clock()
    store = RedisDeviceMessageStore("redis://127.0.0.1:1/0", reactor=clock)
    protocol = _OutOfStepProtocol([reply])
    store._connections = [SimpleNamespace(protocol=protocol)]
    store._running = True
    out: list = []
    call(store).addBoth(out.append)
    clock.advance(0)  # the end of the reactor turn: the adds go
    assert len(out) == 1 and isinstance(out[0], Failure) and out[0].check(BackendError)
    assert protocol.aborted


class _Transport:
    """A TCP transport as txredisapi sees it: what is written, and an
    abort that closes it a reactor turn later."""

    def __init__(self, clock, protocol) -> None:
        self.clock, self.protocol = clock, protocol
        self.written: list[bytes] = []
        self.disconnecting = False
        self._aborting = False

    def write(self, data: bytes) -> None:
        if not self._aborting:
            self.written.append(data)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def abortConnection(self) -> None:
        from twisted.internet import error

        self._aborting = True
        self.clock.callLater(0, self.protocol.connectionLost, Failure(error.ConnectionAborted()))


def test_after_a_reply_timeout_no_call_takes_a_reply_meant_for_an_earlier_one():
    """Redis answered late: one read brings a bulk reply and, behind it, the
    reply of a call whose timeout fires before txredisapi reads that rest
    (a reactor turn later).  The timeout fails the calls waiting and
    aborts the connection; a call made before the close takes effect must
    fail, not take the stale reply as its own (it was never sent)."""
    from tbmq_plugins.redis_connections import _protocol_class
    from twisted.internet import task

    clock = task.Clock()
    protocol = _protocol_class()(charset=None, replyTimeout=1.0, convertNumbers=False)
    protocol.factory = type("F", (), {"reactor": clock})()
    protocol.transport = _Transport(clock, protocol)
    protocol.connected = 1
    outcomes: dict = {}

    def call(name):
        d = protocol.evalsha("sha", ("k",), ())
        d.addBoth(lambda r, name=name: outcomes.__setitem__(name, r))

    call("load")
    call("add")
    clock.rightNow = 1.2  # the reactor was late: the read comes after the timeout was due
    protocol.dataReceived(b"$3\r\nabc\r\n:0\r\n")  # the load's reply, then the add's
    assert outcomes["load"] == b"abc"
    clock.callLater(0, _later, protocol, outcomes)  # runs after txredisapi's read of the rest
    clock.advance(0)
    assert isinstance(outcomes["add"], Failure)  # timed out
    later = outcomes["late add"]
    assert isinstance(later, Failure), f"a call never sent got the reply {later!r}"
    assert len(protocol.transport.written) == 2  # the late add was not written either


def _later(protocol, outcomes) -> None:
    try:
        d = protocol.evalsha("sha", ("k",), ())
    except Exception:
        outcomes["late add"] = Failure()
        return
    d.addBoth(lambda r: outcomes.__setitem__("late add", r))


# -- adds batched per reactor turn ----------------------------------------------------


class _HeldProtocol:
    """A txredisapi protocol that keeps every call's Deferred for the test
    to fire: ``calls`` is ``[(script name, keys, args, Deferred)]``."""

    def __init__(self) -> None:
        from tbmq_plugins.redis_scripts import SCRIPTS

        self.names = {script.sha: script.name for script in SCRIPTS}
        self.calls: list = []

    def evalsha(self, sha, keys, args):
        d = defer.Deferred()
        self.calls.append((self.names[sha], tuple(keys), args, d))
        return d


def _held_store():
    from types import SimpleNamespace

    clock = task.Clock()
    store = RedisDeviceMessageStore("redis://127.0.0.1:1/0", pool_size=1, reactor=clock,
                                    key_prefix="p:")
    protocol = _HeldProtocol()
    store._connections = [SimpleNamespace(protocol=protocol)]
    store._running = True
    return store, protocol, clock


def test_adds_of_one_turn_go_as_one_call_and_each_fires_after_the_reply():
    """Three adds in one reactor turn: nothing is sent during the turn, one
    WRITE_BATCH at its end with the keys in call order (a client's twice, in
    order); no caller fires before the reply, then each gets its own count."""
    store, protocol, clock = _held_store()
    out: list = []
    for client, seq in [("a", 1), ("b", 2), ("a", 3)]:
        store.add(client, [delivery(seq)]).addBoth(lambda r, c=client: out.append((c, r)))
    assert protocol.calls == []
    clock.advance(0)
    [(name, keys, args, d)] = protocol.calls
    assert name == "write_batch" and keys == ("p:{a}_messages", "p:{b}_messages",
                                            "p:{a}_messages")
    assert [write[1][0] for write in msgpack.unpackb(args[2], raw=True)] == [
        b"%019d" % 1, b"%019d" % 2, b"%019d" % 3]
    assert out == []
    d.callback([0, 4, 1])
    assert out == [("a", 0), ("b", 4), ("a", 1)]


def test_adds_wait_for_the_batch_in_flight_and_other_calls_keep_their_order():
    """While a batch is in flight, later writes wait and go together when
    it is answered; a load joins the writes waiting in the batch, after
    them (Redis runs them in call order); a count called after them sends
    that batch first."""
    store, protocol, clock = _held_store()
    store.add("a", [delivery(1)])
    clock.advance(0)
    assert [c[0] for c in protocol.calls] == ["add"]
    later = [store.add("b", [delivery(2)]), store.add("c", [delivery(3)])]
    clock.advance(0)
    assert [c[0] for c in protocol.calls] == ["add"]  # waiting for the first one
    protocol.calls[0][3].callback(0)
    assert [c[0] for c in protocol.calls] == ["add", "write_batch"]
    assert protocol.calls[1][1] == ("p:{b}_messages", "p:{c}_messages")
    store.add("d", [delivery(4)])
    store.update("d", 4, 9, DeliveryState.SENT)
    store.load("d")
    store.count("d")
    assert [c[0] for c in protocol.calls] == ["add", "write_batch", "write_batch", "count"]
    assert [w[0] for w in msgpack.unpackb(protocol.calls[2][2][2], raw=True)] == [
        b"a", b"u", b"l"]
    protocol.calls[1][3].callback([0, 0])
    assert [d.called for d in later] == [True, True]


def test_loads_of_one_turn_go_in_the_turns_batch_and_each_gets_its_page():
    """Reads of several clients in one reactor turn, between writes: one
    WRITE_BATCH at its end, in call order, and each load gets its own
    page from the batch's reply (a read alone goes as LOAD)."""
    store, protocol, clock = _held_store()
    pages: dict = {}
    loads = {c: store.load(c, after_seq=after, limit=10)
             for c, after in (("a", None), ("b", 7))}
    store.add("a", [delivery(9)])
    for c, d in loads.items():
        d.addCallback(lambda found, c=c: pages.__setitem__(c, [x.seq for x in found]))
    assert protocol.calls == []
    clock.advance(0)
    [(name, keys, args, d)] = protocol.calls
    assert name == "write_batch"
    assert keys == ("p:{a}_messages", "p:{b}_messages", "p:{a}_messages")
    calls = msgpack.unpackb(args[2], raw=True)
    assert calls[0] == [b"l", b"-inf", b"", 10]
    assert calls[1] == [b"l", b"7", b"%019d" % 7, 10] and calls[2][0] == b"a"
    assert pages == {}
    page_a = msgpack.packb([f"{3:019d}", "", "0", encode_delivery("a", delivery(3))])
    d.callback([page_a, b"\x90", 0])
    assert pages == {"a": [3], "b": []}
    alone = store.load("c")
    clock.advance(0)
    assert protocol.calls[-1][0] == "load" and protocol.calls[-1][2] == ["-inf", "", -1]
    protocol.calls[-1][3].callback(b"\x90")
    assert alone.result == []


def test_a_failed_batch_fails_every_add_in_it_and_only_them():
    """A batch's script failing (it is atomic: nothing of it is written)
    fails each of its adds with BackendError; the next batch is not
    affected."""
    import txredisapi

    store, protocol, clock = _held_store()
    first = [store.add("a", [delivery(1)]), store.add("b", [delivery(2)])]
    clock.advance(0)
    out: list = []
    for d in first:
        d.addBoth(out.append)
    protocol.calls[0][3].errback(txredisapi.ResponseError("OOM command not allowed"))
    assert len(out) == 2 and all(isinstance(r, Failure) and r.check(BackendError) for r in out)
    second = store.add("c", [delivery(3)])
    clock.advance(0)
    protocol.calls[1][3].callback(0)
    assert second.result == 0


def test_batched_adds_keep_each_clients_order_in_redis(open_store, redis_url, reactor_thread):
    """Adds of many clients in one reactor turn, updated, removed and
    trimmed in the same turn: Redis has them as if called one
    by one (the later write of a seq wins, the trim counts per add)."""
    store = open_store(redis_url, max_messages_per_client=2, pool_size=2)

    def turn():
        calls = [store.target.add(c, [delivery(s)]) for c in ("x", "y") for s in (1, 2, 3)]
        calls.append(store.target.update("x", 3, 7, DeliveryState.SENT))
        calls.append(store.target.remove("y", [2]))
        return defer.gatherResults(calls)

    assert reactor_thread.call(turn) == [0, 0, 1, 0, 0, 1, None, None]
    loaded = store.load("x")
    assert [(d.seq, d.packet_id, d.state) for d in loaded] == [
        (2, None, DeliveryState.QUEUED), (3, 7, DeliveryState.SENT)]
    assert [d.seq for d in store.load("y")] == [3]


def test_a_batched_load_sees_the_writes_called_before_it_and_not_after(
        open_store, redis_url, reactor_thread):
    """Loads in one reactor turn with writes of their clients around them
    (one script call in Redis): each load's page holds what was written
    before it in the turn, not what came after; a client of the other
    connection reads its own page."""
    store = open_store(redis_url, pool_size=2)

    def turn():
        target = store.target
        calls = [target.add("x", [delivery(1), delivery(2)]), target.remove("x", [1]),
                 target.load("x"), target.add("x", [delivery(3)]),
                 target.add("y", [delivery(5)]), target.load("y", after_seq=5),
                 target.load("x", after_seq=2, limit=1)]
        return defer.gatherResults(calls)

    results = reactor_thread.call(turn)
    assert [d.seq for d in results[2]] == [2]
    assert results[5] == [] and [d.seq for d in results[6]] == [3]
    assert [d.seq for d in store.load("x")] == [2, 3]
