"""What one CONNECT costs the node, kept from growing back: the basic
provider asks the credential store one question for a burst of CONNECTs and
looks up only keys that exist; the connect requests waiting for the cluster
share one timer; a session keeps the id its request named; the debug line of
a CONNECT is built only at debug level."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from twisted.internet import defer, task

from tbmq import log
from tbmq.auth import passwords
from tbmq.auth.passwords import check_password
from tbmq.backends.memory_credentials import MemoryCredentialStore
from tbmq.model import Credentials, CredentialsType
from tbmq.broker.store_reads import StoreReader
from tbmq.mqtt import Connect, Publish, Subscribe, SubscriptionRequest
from tests.helpers import Harness


@pytest.fixture(autouse=True)
def inline_bcrypt(monkeypatch):
    """bcrypt in the test's thread (the harness's clock is no reactor)."""
    def inline(password, hashed, reactor=None, threadpool=None, cancelled=None):
        return defer.succeed(check_password(password, hashed))

    monkeypatch.setattr(passwords, "check_password_async", inline)


class CountingStore(MemoryCredentialStore):
    """The memory store, counting its reads; while :attr:`hold` is set,
    ``changed_since`` answers only at :meth:`release` (a store that takes
    its time); while :attr:`tells` is False it cannot tell at once that
    nothing changed (a store without ``unchanged_since``)."""

    def __init__(self) -> None:
        super().__init__()
        self.finds: list[str] = []
        self.questions = 0
        self.hold = False
        self.tells = True
        self._held: list = []

    def unchanged_since(self, version):
        return self.tells and super().unchanged_since(version)

    def find(self, credentials_type, credentials_id):
        self.finds.append(credentials_id)
        return super().find(credentials_type, credentials_id)

    def changed_since(self, version):
        self.questions += 1
        if not self.hold:
            return super().changed_since(version)
        d = defer.Deferred()
        self._held.append((d, version))
        return d

    def release(self) -> None:
        held, self._held = self._held, []
        for d, version in held:
            super().changed_since(version).chainDeferred(d)


def harness(store, **auth):
    settings = {"allow_anonymous": True, **auth}
    return Harness({"auth": settings}, entry_points=True, credential_store=store)


def save(store, name, key, value):
    d = store.save(Credentials(name, name, CredentialsType.MQTT_BASIC, key, value=value))
    assert d.called


def test_connects_that_arrive_together_share_one_question_to_the_store():
    store = CountingStore()
    h = harness(store)
    store.questions = 0  # the credentials watcher's first question
    store.hold = True
    store.tells = False
    clients = []
    for i in range(5):
        c = h.raw(5)
        c.send(Connect(protocol_level=5, client_id=f"c{i}"))
        clients.append(c)
    assert store.questions == 1  # the four later ones wait for the next question
    store.release()
    assert store.questions == 2
    store.release()
    assert store.questions == 2
    assert [c.received()[0].reason_code for c in clients] == [0] * 5
    assert store.finds == []  # no credentials: nothing looked up


def test_a_store_that_tells_nothing_changed_is_not_asked_and_connack_is_sent_at_once():
    store = CountingStore()
    h = harness(store)
    store.hold = True  # a question would never be answered
    store.questions = 0
    clients = []
    for i in range(3):
        c = h.raw(5)
        c.send(Connect(protocol_level=5, client_id=f"c{i}"))
        clients.append(c)
    assert store.questions == 0
    assert [c.received()[0].reason_code for c in clients] == [0] * 3
    save(store, "dev", "client_id|c9", {"clientId": "c9", "password": None})
    c = h.raw(5)
    c.send(Connect(protocol_level=5, client_id="c9"))
    assert store.questions == 1  # changed: asked, and the answer waits
    assert c.received() == []
    store.release()
    assert c.received()[0].reason_code == 0 and store.finds == ["client_id|c9"]


def test_only_a_key_that_exists_is_looked_up_and_a_change_is_seen_by_the_next_connect():
    store = CountingStore()
    h = harness(store, allow_anonymous=False)
    assert h.client("dev", 5, username="user", password=b"pw").connack.reason_code == 0x86
    assert store.finds == []
    save(store, "dev", "username|user", {"userName": "user", "password": None})
    assert h.client("dev", 5, username="user", password=b"pw").connack.reason_code == 0
    assert store.finds == ["username|user"]  # not mixed|dev|user, not client_id|dev
    d = store.delete("dev")
    assert d.called
    assert h.client("dev", 5, username="user", password=b"pw").connack.reason_code == 0x86


def test_a_half_known_name_is_still_refused_anonymous_access():
    store = CountingStore()
    save(store, "both", "mixed|dev|user", {"clientId": "dev", "userName": "user",
                                           "password": None})
    h = harness(store)
    assert h.client("other", 5, username="user").connack.reason_code == 0x86
    assert h.client("dev", 5, username="user").connack.reason_code == 0
    assert h.client("anon", 5).connack.reason_code == 0


def test_a_session_keeps_the_id_its_connect_request_named():
    h = Harness()
    requests = []
    events = h.broker.events
    ask = events.request_connect

    def spy(client_id, session_id, **kw):
        requests.append(session_id)
        return ask(client_id, session_id, **kw)

    events.request_connect = spy
    h.client("c", 5)
    session = h.broker.sessions.sessions["c"]
    assert requests == [session.session_id] == [h.broker.registry.get("c").session_id]
    assert "c" not in events._granted  # the registry shows the grant: forgotten


def test_connect_requests_without_an_answer_share_one_timer_and_fail_at_their_deadline():
    clock = task.Clock()
    clock.advance(1_000)
    h = Harness(clock=clock)
    events = h.broker.events
    events.consumers[0].pause()  # nobody decides
    waiting = []
    for i in range(3):
        waiting.append(h.raw(5))
        waiting[-1].send(Connect(protocol_level=5, client_id=f"w{i}"))
        clock.advance(0.5)
    timers = [c for c in clock.getDelayedCalls() if c.func == events._time_out]
    assert len(timers) == 1 and len(events._pending) == 3
    answer = events.timeout  # the first request was sent 1.5 s ago
    clock.advance(answer - 1.5 - 0.01)
    assert [c.received() for c in waiting] == [[], [], []]
    clock.advance(0.01)
    assert [p.reason_code for p in waiting[0].received()] == [0x88]
    assert waiting[1].received() == []
    clock.advance(0.5)
    assert [p.reason_code for p in waiting[1].received()] == [0x88]
    assert waiting[2].received() == []
    clock.advance(0.5)
    assert [p.reason_code for p in waiting[2].received()] == [0x88]
    assert not events._pending
    assert not [c for c in clock.getDelayedCalls() if c.func == events._time_out]


def test_the_debug_level_is_known_without_building_an_event():
    try:
        log.set_log_level("debug")
        assert log.debug_enabled()
        log.set_log_level("info")
        assert not log.debug_enabled()
    finally:
        log.set_log_level("info")


def test_a_clean_connect_makes_no_deferred(monkeypatch):
    """The session is asked for and bound through the connect request's
    :class:`~tbmq.broker.sessions.Opening`, not a chain of Deferreds."""
    h = Harness()
    h.client("warm-up", level=4)
    made = []
    init = defer.Deferred.__init__

    def counting(self, *args, **kwargs):
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(defer.Deferred, "__init__", counting)
    c = h.client("c1", level=4)
    assert c.connack.reason_code == 0
    assert made == []


def test_an_opening_passes_no_error_to_who_answers_it():
    from twisted.python.failure import Failure

    from tbmq.broker.sessions import Opening

    seen = []

    def boom(*args):
        raise ValueError("bug")

    # the binding failed: refused gets its failure
    Opening(boom, seen.append, lambda f: seen.append(("refused", f.type)), seen.append) \
        .callback("response")
    assert seen == [("refused", ValueError)]
    # opened raised: failed gets it
    seen.clear()
    Opening(lambda r: (r, False), boom, seen.append,
            lambda f: seen.append(("failed", f.type))).callback("response")
    assert seen == [("failed", ValueError)]
    # an exception given to errback (as a Deferred takes it) becomes a Failure;
    # refused raising goes to failed
    seen.clear()
    Opening(boom, seen.append, lambda f: seen.append(("refused", f.type)),
            seen.append).errback(KeyError("no answer"))
    Opening(boom, seen.append, boom, lambda f: seen.append(("failed", f.type))) \
        .errback(Failure(KeyError("no answer")))
    assert seen == [("refused", KeyError), ("failed", ValueError)]
    # its args go to bind before the response (what a partial would bind)
    seen.clear()
    Opening(lambda *a: a, seen.append, seen.append, seen.append, ("conn", 7)).callback("response")
    assert seen == [("conn", 7, "response")]


def test_a_connect_builds_no_notification_that_no_plugin_implements(monkeypatch):
    """``tbmq_client_connected`` with no plugin implementing it costs one
    attribute (tests/unit/test_node_view.py: a plugin that does gets it)."""
    h = Harness()
    called = []
    monkeypatch.setattr(h.broker.hooks, "notify", lambda name, **kwargs: called.append(name))
    assert h.client("c1", level=4).connack.reason_code == 0
    assert called == []


class CountedLoads:
    """Wraps a device store's ``load``: the client ids read, in order."""

    def __init__(self, store) -> None:
        self.store = store
        self.read: list[str] = []
        self._load = store.load

    def __call__(self, client_id, after_seq=0, limit=None):
        self.read.append(client_id)
        return self._load(client_id, after_seq=after_seq, limit=limit)


def test_a_new_persistent_session_does_not_read_the_store_and_still_gets_its_messages(
        monkeypatch):
    h = Harness()
    loads = CountedLoads(h.broker.device_store)
    monkeypatch.setattr(h.broker.device_store, "load", loads)
    sub = h.client("dev-1", clean_start=False)
    assert sub.connack.session_present is False
    assert loads.read == []  # a new session: the store holds nothing of it
    sub.send(Subscribe(1, [SubscriptionRequest("t/#", 1)]))
    assert sub.received()[0].packet_id == 1  # SUBACK
    pub = h.client("pub-1")
    pub.send(Publish("t/1", b"m1", qos=1, packet_id=7))
    got = [p for p in sub.received() if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"m1"]
    # the session comes back: present, its store read once
    sub.lose()
    pub.send(Publish("t/1", b"m2", qos=1, packet_id=8))
    again = h.client("dev-1", clean_start=False)
    assert again.connack.session_present is True
    assert loads.read == ["dev-1"]
    assert [p.payload for p in again.pending + again.received()
            if isinstance(p, Publish)] == [b"m1", b"m2"]


def test_a_new_session_that_subscribed_before_its_marker_came_back_reads_the_store():
    reads = []
    outbox = SimpleNamespace(
        link=object(), session=SimpleNamespace(session_id="s1"),
        paged_out=True, queue=(), queued_bytes=0, _last_seq=0,
        _remove_completed=lambda: None,
        ctx=SimpleNamespace(page_reads=SimpleNamespace(
            read=lambda reader, link: reads.append("read"))))
    reader = StoreReader(outbox)
    reader.start(True, stored=False)
    reader.on_subscribed()  # subscribed meanwhile (and unsubscribed: it stays subscribed since)
    reader.on_attached("s1")
    assert reads == ["read"]
    # without a subscription: no read, and the outbox takes live deliveries
    reads.clear()
    reader.start(True, stored=False)
    reader.on_attached("s1")
    assert reads == [] and outbox.paged_out is False and reader.new is False
    # a resumed session always reads at its marker
    outbox.paged_out = True
    reader.start(True, stored=True)
    reader.on_attached("s1")
    assert reads == ["read"]


def test_a_subscribe_tells_the_store_reader_of_a_new_persistent_session():
    # the signal StoreReader.on_attached reads: subscribed since the CONNECT
    from tests.helpers import Harness  # noqa: PLC0415
    from tbmq.mqtt import Subscribe, SubscriptionRequest  # noqa: PLC0415

    h = Harness()
    c = h.client("s", clean_start=False)
    reader = h.broker.sessions.sessions["s"].outbox.store_reader()
    reader.new = True  # (its marker not back yet, as on a cluster)
    c.send(Subscribe(1, [SubscriptionRequest("t/#", 1)]))
    assert reader.new is False
    clean = h.client("n")  # a clean session: no store, nothing told
    clean.send(Subscribe(1, [SubscriptionRequest("t/#", 1)]))
    assert h.broker.sessions.sessions["n"].outbox.reader is None
