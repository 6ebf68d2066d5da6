"""The Kafka bus's own logic, beyond the common contract (which
tests/contract/test_bus.py checks on Tansu): commit bookkeeping, handing,
pause and back-pressure, caught_up, acknowledgement batches, topic creation
and publish outcomes.  Everything here runs on fakes: a fake driver, a fake
consumer thread, a reactor whose ``callFromThread`` queues calls."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.logger import Logger

from tbmq.cluster import records as r
from tbmq.cluster.topics import TopicCatalogue
from tbmq.config import Config, KafkaConfig
from tbmq.errors import BusClosedError, BusPublishError, ConfigError, RecordEncodingError
from tbmq.model import Message
from tbmq_plugins import kafka as kafka_plugin
from tbmq_plugins.kafka import bus as bus_module
from tbmq_plugins.kafka import drivers
from tbmq_plugins.kafka.bridge import AckBatcher
from tbmq_plugins.kafka.bus import KafkaBus, kafka_group, topic_spec
from tbmq_plugins.kafka.consumer import SLICE, KafkaConsumer, Track
from tbmq_plugins.kafka.drivers import RawRecord, Reports


class QueueReactor(Clock):
    """A Clock whose ``callFromThread`` queues the call (from any thread)
    until :meth:`drain`."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.queued: list = []
        self.from_thread = 0

    def callFromThread(self, f, *args, **kwargs) -> None:
        with self.lock:
            self.from_thread += 1
            self.queued.append((f, args, kwargs))

    def drain(self) -> int:
        """Run the queued calls; :returns: how many ran."""
        with self.lock:
            calls, self.queued = self.queued, []
        for f, args, kwargs in calls:
            f(*args, **kwargs)
        return len(calls)

    def wait(self, predicate, timeout: float = 5.0) -> None:
        """Drain until ``predicate()`` holds."""
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "condition not met"
            if not self.drain():
                time.sleep(0.001)


def fired(d: defer.Deferred) -> list:
    out: list = []
    d.addBoth(out.append)
    return out


# -- commit bookkeeping --------------------------------------------------------------------

def test_a_track_commits_over_contiguous_successes_whatever_order_they_fire_in():
    track = Track(0)
    entries = {o: track.arrive(o) for o in (10, 11, 12, 13)}
    assert not track.done(entries[11], True)  # 10 still pending
    assert track.committed is None
    assert track.done(entries[10], True) and track.committed == 12
    assert not track.done(entries[13], True) and track.committed == 12
    assert track.done(entries[12], True) and track.committed == 14
    assert not track.pending  # nothing kept once committed


def test_a_failure_stops_the_commit_of_its_partition_for_the_assignment():
    track = Track(0)
    entries = [track.arrive(o) for o in range(4)]
    assert track.done(entries[0], True) and track.committed == 1
    assert not track.done(entries[1], False)
    assert track.blocked
    assert not track.done(entries[2], True) and not track.done(entries[3], True)
    later = track.arrive(4)
    assert not track.done(later, True)
    assert track.committed == 1 and not track.pending  # nothing held for nothing


def test_a_track_is_caught_up_once_what_came_before_reaching_the_end_is_done():
    track = Track(0)
    first, second = track.arrive(0), track.arrive(1)
    track.reach()
    newer = track.arrive(2)  # after the end: not waited for
    track.done(first, True)
    assert not track.caught_up
    track.done(second, False)  # a failed result is a result
    assert track.caught_up and newer.state == 0


# -- the reactor side of a consumer --------------------------------------------------------

class FakeLoop:
    """What a KafkaConsumer asks of its thread."""

    def __init__(self) -> None:
        self.commits: list = []
        self.seeks: list = []
        self.want_paused = False
        self.stopped = False

    def commit(self, partition: int, offset: int) -> None:
        self.commits.append((partition, offset))

    def seek(self, partition: int, offset: int) -> None:
        self.seeks.append((partition, offset))

    def stop(self) -> None:
        self.stopped = True


class FakeBus:
    def __init__(self) -> None:
        self.clock = Clock()
        self.forgotten: list = []

    def _forget(self, consumer) -> None:
        self.forgotten.append(consumer)


def consumer_of(handler, max_uncommitted: int = 100, buffer_limit: int = 1000):
    bus = FakeBus()
    consumer = KafkaConsumer(bus, "t", "g", handler, r.BYTES, max_uncommitted, buffer_limit)
    consumer.loop = FakeLoop()
    return consumer, bus.clock


def raw(p: int, o: int, value: bytes | None = None) -> RawRecord:
    return RawRecord(p, o, b"k", value if value is not None else b"%d" % o, ())


class Pending:
    """A handler whose results fire when the test says."""

    def __init__(self) -> None:
        self.seen: list = []
        self.results: dict = {}

    def __call__(self, record):
        self.seen.append((record.partition, record.offset))
        d = self.results[(record.partition, record.offset)] = defer.Deferred()
        return d


def test_records_are_handed_in_order_and_committed_once_their_results_fired():
    handler = Pending()
    consumer, clock = consumer_of(handler)
    consumer._assigned([0, 1])
    consumer._batch([raw(0, 5), raw(0, 6), raw(1, 0), raw(0, 7)], [])
    assert handler.seen == [(0, 5), (0, 6), (1, 0), (0, 7)]
    handler.results[(0, 6)].callback(None)
    handler.results[(0, 7)].callback(None)
    assert consumer.loop.commits == []  # 5 has not fired
    handler.results[(0, 5)].callback(None)
    assert consumer.loop.commits == [(0, 8)]
    handler.results[(1, 0)].errback(RuntimeError("cannot store it"))
    assert consumer.loop.commits == [(0, 8)]  # the failure is not committed


def test_the_decoded_record_reaches_the_handler():
    got = []
    consumer = KafkaConsumer(FakeBus(), "t", "g", got.append, r.MESSAGE, 10, 10)
    consumer.loop = FakeLoop()
    consumer._assigned([2])
    message = Message("a/b", b"x", 1)
    consumer._batch([RawRecord(2, 9, "é".encode(), r.MESSAGE.encode(message), (("h", b"1"),))],
                    [])
    assert len(got) == 1
    record = got[0]
    assert (record.topic, record.key, record.value, record.headers, record.partition,
            record.offset) == ("t", "é", message, (("h", b"1"),), 2, 9)
    assert consumer.loop.commits == [(2, 10)]  # None is a success at once


def test_a_record_that_does_not_decode_is_a_failed_result():
    got = []
    consumer = KafkaConsumer(FakeBus(), "t", "g", got.append, r.MESSAGE, 10, 10)
    consumer.loop = FakeLoop()
    consumer._assigned([0])
    good = r.MESSAGE.encode(Message("a", b""))
    consumer._batch([raw(0, 0, b"\x01not msgpack"), raw(0, 1, good)], [])
    assert got == []  # the partition stops at the bad one
    assert consumer.loop.commits == []  # nothing commits past it
    consumer.bus.clock.advance(1.0)
    assert consumer.loop.seeks == [(0, 0)]  # read again, not skipped


def test_pause_keeps_what_was_handed_over_in_order_until_resume():
    seen = []
    consumer, clock = consumer_of(None)

    def handler(record):
        seen.append(record.offset)
        if record.offset == 0:
            consumer.pause()  # from inside the handler

    consumer.handler = handler
    consumer._assigned([0])
    consumer._batch([raw(0, 0), raw(0, 1), raw(0, 2)], [])
    assert seen == [0] and consumer.loop.want_paused  # the client's partitions too
    consumer._batch([raw(0, 3)], [])  # already on its way from the thread
    clock.advance(0)
    assert seen == [0]
    consumer.pause()
    consumer.resume()
    consumer.resume()
    assert not consumer.loop.want_paused
    clock.advance(0)
    assert seen == [0, 1, 2, 3]
    assert consumer.loop.commits[-1] == (0, 4)


def test_a_full_buffer_pauses_the_client_until_it_drains():
    handler = Pending()
    consumer, clock = consumer_of(handler, max_uncommitted=2, buffer_limit=4)
    consumer._assigned([0])
    consumer._batch([raw(0, o) for o in range(8)], [])
    assert handler.seen == [(0, 0), (0, 1)]  # at most max_uncommitted pending
    assert consumer.loop.want_paused  # 6 buffered >= 4
    for o in range(8):
        clock.advance(0)
        handler.results[(0, o)].callback(None)
    clock.advance(0)
    assert len(handler.seen) == 8
    assert not consumer.loop.want_paused
    assert consumer.loop.commits[-1] == (0, 8)


def test_a_large_batch_is_handed_in_slices():
    seen = []
    consumer, clock = consumer_of(lambda record: seen.append(record.offset),
                                  max_uncommitted=10000, buffer_limit=10000)
    consumer._assigned([0])
    consumer._batch([raw(0, o) for o in range(SLICE * 2 + 10)], [])
    assert len(seen) == SLICE  # the rest from the next reactor turns
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(0)
    assert seen == list(range(SLICE * 2 + 10))
    assert consumer.loop.commits[-1] == (0, SLICE * 2 + 10)


def test_revoked_partitions_are_dropped_and_their_results_no_longer_commit():
    handler = Pending()
    consumer, clock = consumer_of(handler)
    consumer._assigned([0, 1])
    consumer._batch([raw(0, 0), raw(1, 0)], [])
    consumer.pause()
    consumer._batch([raw(0, 1), raw(1, 1)], [])  # buffered while paused
    consumer._revoke([0])
    handler.results[(0, 0)].callback(None)  # finished after the partition went
    consumer.resume()
    clock.advance(0)
    assert handler.seen == [(0, 0), (1, 0), (1, 1)]  # (0, 1) goes to the next owner
    assert consumer.loop.commits == []
    consumer._assigned([0])  # given again: from the committed offset
    consumer._batch([raw(0, 0)], [])
    assert handler.seen[-1] == (0, 0)


def test_a_failed_record_is_read_again_by_the_same_member_in_order():
    handler = Pending()
    consumer, clock = consumer_of(handler, max_uncommitted=2)
    consumer._assigned([0, 1])
    consumer._batch([raw(0, 0), raw(0, 1), raw(0, 2), raw(1, 0)], [])
    assert handler.seen == [(0, 0), (0, 1)]  # (0, 2) and (1, 0) wait
    handler.results[(0, 0)].errback(RuntimeError("store timed out"))
    handler.results[(0, 1)].callback(None)  # of the old reading: never commits
    clock.advance(0)
    assert handler.seen[2:] == [(1, 0)]  # partition 0 stopped, (0, 2) dropped
    handler.results[(1, 0)].callback(None)  # the other partition goes on
    assert consumer.loop.commits == [(1, 1)]
    consumer._batch([raw(0, 3)], [])  # read before the seek: dropped
    clock.advance(0.99)
    assert consumer.loop.seeks == []  # the delay: 1 s, not blocking anything
    clock.advance(0.01)
    assert consumer.loop.seeks == [(0, 0)]  # from the failed record
    consumer._assigned([0])  # the thread sought: a new track
    consumer._batch([raw(0, 0), raw(0, 1)], [])
    assert handler.seen[3:] == [(0, 0), (0, 1)]  # again, in order
    handler.results[(0, 0)].callback(None)
    handler.results[(0, 1)].callback(None)
    assert consumer.loop.commits == [(1, 1), (0, 1), (0, 2)]


def test_a_poison_record_is_handed_again_at_growing_delays_and_logged_once_per_30_s(
        monkeypatch):
    from tbmq.cluster import redelivery
    events: list = []
    monkeypatch.setattr(redelivery, "log", Logger(
        observer=lambda e: events.append(dict(e, at=clock.seconds()))))
    calls = []

    def handler(record):
        calls.append((clock.seconds(), record.offset))
        raise ValueError("does not decode")

    consumer, clock = consumer_of(handler)
    consumer._assigned([0])
    while clock.seconds() < 300:  # five minutes of a record that never decodes
        consumer._batch([raw(0, 5), raw(0, 6)], [])
        (call,) = clock.getDelayedCalls()  # one timer, nothing spins
        clock.advance(call.getTime() - clock.seconds())
        assert consumer.loop.seeks[-1] == (0, 5)
        consumer._assigned([0])  # the thread sought
    assert [o for _, o in calls] == [5] * len(calls)  # never skipped, never past it
    assert [t for t, _ in calls][:8] == [0, 1, 3, 7, 15, 31, 61, 91]
    assert consumer.loop.commits == []
    assert all(e["log_level"].name == "warn" for e in events)
    assert "log_failure" in events[0]  # the traceback, once
    assert all(e["offset"] == 5 and e["partition"] == 0 for e in events)
    logged = [e["at"] for e in events]
    assert logged[0] == 0 and all(b - a >= 30 for a, b in zip(logged, logged[1:]))
    assert len(events) < len(calls)


def test_the_delays_are_1_2_4_to_30_s_and_start_over_after_a_success():
    fail = {"on": True}

    def handler(record):
        if fail["on"]:
            raise ValueError("store timed out")

    consumer, clock = consumer_of(handler)
    consumer._assigned([0])
    delays = []
    for _ in range(7):
        consumer._batch([raw(0, 5)], [])
        (call,) = clock.getDelayedCalls()
        delays.append(call.getTime() - clock.seconds())
        clock.advance(delays[-1])
        consumer._assigned([0])
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    fail["on"] = False
    consumer._batch([raw(0, 5)], [])
    assert consumer.loop.commits == [(0, 6)]
    fail["on"] = True
    consumer._batch([raw(0, 6)], [])
    (call,) = clock.getDelayedCalls()
    assert call.getTime() - clock.seconds() == 1  # a new outage


def test_a_failed_partition_taken_away_or_a_stopped_member_is_not_sought():
    consumer, clock = consumer_of(lambda record: defer.fail(RuntimeError("no")))
    consumer._assigned([0, 1])
    consumer._batch([raw(0, 0), raw(1, 0)], [])
    consumer._revoke([0])
    assert len(clock.getDelayedCalls()) == 1  # partition 1's only
    consumer.stop()
    assert clock.getDelayedCalls() == []
    clock.advance(60)
    assert consumer.loop.seeks == []


def test_a_failed_partition_that_waits_counts_as_caught_up():
    handler = Pending()
    consumer, clock = consumer_of(handler)
    consumer._assigned([0])
    consumer._batch([raw(0, 0), raw(0, 1)], [0])
    handler.results[(0, 0)].errback(RuntimeError("failed, but it has a result"))
    assert fired(consumer.caught_up) == [None]


def test_caught_up_fires_once_the_records_before_the_end_are_handled():
    handler = Pending()
    consumer, clock = consumer_of(handler)
    consumer._batch([], [])
    consumer._assigned([0, 1])
    assert not consumer.caught_up.called and not consumer.positioned
    consumer._batch([raw(0, 0), raw(0, 1)], [0])
    consumer._batch([raw(0, 2)], [1])  # after partition 0's end
    assert consumer.positioned and not consumer.caught_up.called
    handler.results[(0, 0)].callback(None)
    handler.results[(0, 1)].errback(RuntimeError("failed, but handled"))
    assert fired(consumer.caught_up) == [None]


def test_a_member_without_partitions_is_caught_up_at_once():
    consumer, clock = consumer_of(Pending())
    consumer._assigned([])
    assert consumer.caught_up.called and consumer.positioned


def test_stop_forgets_the_buffer_and_fires_once_the_thread_closed():
    handler = Pending()
    consumer, clock = consumer_of(handler)
    consumer._assigned([0])
    consumer.pause()
    consumer._batch([raw(0, 0)], [])
    d = consumer.stop()
    again = consumer.stop()
    assert consumer.loop.stopped and not d.called and not again.called
    consumer.resume()
    clock.advance(0)
    assert handler.seen == []
    consumer._closed()
    assert fired(d) == [None] and fired(again) == [None]


# -- acknowledgements ----------------------------------------------------------------------

def test_acknowledgements_reach_the_reactor_one_call_per_batch():
    reactor = QueueReactor()
    batches: list = []
    acks = AckBatcher(reactor, batches.append)
    deferreds = [defer.Deferred() for _ in range(100)]

    def client_thread():
        for i, d in enumerate(deferreds):
            acks.put(d, None if i % 10 else "timed out")

    thread = threading.Thread(target=client_thread)
    thread.start()
    thread.join()
    assert reactor.from_thread == 1  # one call for 100 outcomes
    reactor.drain()
    assert len(batches) == 1 and [d for d, _ in batches[0]] == deferreds
    assert batches[0][10][1] == "timed out" and batches[0][11][1] is None
    acks.put(defer.Deferred())
    assert reactor.from_thread == 2 and acks.batches == 1


# -- topics and publish, on a fake driver --------------------------------------------------

class FakeAdmin:
    def __init__(self, driver) -> None:
        self.driver = driver

    def create_topics(self, specs) -> None:
        self.driver.gate.wait(5)
        if self.driver.refuse:
            raise RuntimeError("no broker")
        self.driver.created.extend(specs)

    def delete_topics(self, names) -> None:
        self.driver.deleted.extend(names)

    def close(self) -> None:
        self.driver.closed.append("admin")


class FakeProducer:
    def __init__(self, driver, acks) -> None:
        self.driver = driver
        self.acks = acks

    def send(self, topic, key, value, headers, deferred, partition=None) -> None:
        if self.driver.refuse_send:
            raise BufferError("queue full")
        self.driver.sent.append((topic, key, value, headers, deferred))
        self.driver.partitions.append(partition)

    def send_many(self, topic, keys, values, done) -> None:
        reports = Reports(self.acks.put, done, len(keys))
        if self.driver.refuse_send:
            reports.refused(len(keys), "queue full")
            return
        report = reports.report  # each record's done: its report
        self.driver.sent.extend([(topic, key, value, (), report)
                                 for key, value in zip(keys, values)])
        self.driver.partitions.extend([None] * len(keys))

    def prepare(self, topic) -> int:
        self.driver.prepared.append(topic)
        return 6

    def close(self, timeout) -> None:
        self.driver.closed.append("producer")


class FakeDriver:
    """A driver module whose admin and producer record what they are asked."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.refuse = False
        self.refuse_send = False
        self.created: list = []
        self.prepared: list = []
        self.sent: list = []
        self.partitions: list = []  # the partition of each record sent (None: the client's)
        self.closed: list = []
        self.deleted: list = []

    def Admin(self, config):  # noqa: N802 (a driver module's class)
        return FakeAdmin(self)

    def Producer(self, config, acks):  # noqa: N802
        return FakeProducer(self, acks)


CONFIG = KafkaConfig(topic_prefix="p.", partitions=6, replication_factor=3,
                     retention_ms=3600000)


def started(driver: FakeDriver, config: KafkaConfig = CONFIG):
    reactor = QueueReactor()
    bus = KafkaBus(config, clock=reactor, driver=driver)
    d = bus.start()
    reactor.wait(lambda: d.called)
    assert fired(d) == [None]
    return bus, reactor


def test_start_creates_the_fixed_topics_as_configured():
    driver = FakeDriver()
    bus, reactor = started(driver)
    c = bus.catalogue
    by_name = {spec.name: spec for spec in driver.created}
    assert set(by_name) == {c.msg_all, c.msg_retained, c.msg_persisted, c.client_session,
                            c.client_subscriptions, c.session_event_request, c.events}
    assert all(name.startswith("p.tbmq.") for name in by_name)
    for name, spec in by_name.items():
        assert (spec.partitions, spec.replication_factor) == (6, 3)
        if name in (c.msg_retained, c.client_session, c.client_subscriptions):
            # what the consumers' hole check relies on (order.py)
            assert spec.config == {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"}
        else:
            assert spec.config == {"cleanup.policy": "delete", "retention.ms": "3600000"}
    assert set(driver.prepared) == set(by_name)  # metadata warmed before the first send
    assert topic_spec(CONFIG, c, c.app("x")).config["retention.ms"] == "3600000"
    off = KafkaConfig(min_compaction_lag_ms=0)
    assert topic_spec(off, c, c.client_session).config == {"cleanup.policy": "compact"}


def test_the_per_node_answer_and_command_topics_have_one_partition():
    """TBMQ's layout (``partitions:1`` in its topic properties): a node's
    answer and disconnect topics, the node and unauthorized-client topics
    get one partition, so a node's records of one turn to one of them are
    one batch (one produce request) and its fetches name few partitions;
    the compacted topics (written by every node: a Tansu hole there may be
    passed) and the topics a group shares out, or that carry the traffic,
    get ``kafka.partitions``."""
    c = TopicCatalogue("p.")
    single = [c.client_unauthorized, c.nodes, c.session_event_response("n"),
              c.client_disconnect("n")]
    spread = [c.msg_all, c.msg_persisted, c.session_event_request, c.downlink_basic("n"),
              c.downlink_persisted("n"), c.app("a"), c.app_shared("f/#"), c.events,
              c.client_session, c.client_subscriptions, c.msg_retained, c.client_blocked,
              c.integrations]
    assert [topic_spec(CONFIG, c, t).partitions for t in single] == [1] * len(single)
    assert [topic_spec(CONFIG, c, t).partitions for t in spread] == [6] * len(spread)
    # a name read as the family's base alone, or outside the prefix, is spread
    assert c.partitioned("p.tbmq.client.session.event.response.")
    assert c.partitioned("tbmq.client.session")


def test_a_per_id_topic_is_created_before_its_first_publish_which_waits_in_order():
    driver = FakeDriver()
    bus, reactor = started(driver)
    topic = bus.catalogue.downlink_basic("node/1")  # hashed: not a safe name
    driver.gate.clear()  # the creation hangs until the test says
    delivery = r.Delivery("c", Message("a", b"x"), 1)
    pending = [bus.publish(topic, "c", delivery, (("n", b"%d" % i),)) for i in range(3)]
    time.sleep(0.05)
    reactor.drain()
    assert driver.sent == [] and not any(d.called for d in pending)
    driver.gate.set()
    reactor.wait(lambda: len(driver.sent) == 3)
    assert [spec.name for spec in driver.created][-1] == topic
    assert driver.prepared[-1] == topic
    assert [headers for _, _, _, headers, _ in driver.sent] == [(("n", b"0"),), (("n", b"1"),),
                                                               (("n", b"2"),)]
    assert driver.sent[0][1] == b"c" and r.DELIVERY.decode(driver.sent[0][2]) == delivery
    bus.publish(topic, "c", delivery)
    reactor.advance(0)  # a downlink's records go at the end of the turn
    assert len(driver.sent) == 4  # created once, sent at once from now on
    assert len([s for s in driver.created if s.name == topic]) == 1


def test_publish_fires_with_the_brokers_answer():
    driver = FakeDriver()
    bus, reactor = started(driver)
    topic = bus.catalogue.events
    ok, late = bus.publish(topic, "k", b"1"), bus.publish(topic, None, b"2")
    assert driver.sent[1][1] is None  # a keyless record
    acks = driver.sent[0][4], driver.sent[1][4]
    assert acks == (ok.callback, late.callback)  # the producer reports to them
    bus._acks.put(acks[0], None)
    bus._acks.put(acks[1], "KafkaTimeoutError: 30000 ms has passed since batch creation")
    reactor.drain()
    assert fired(ok) == [None]
    failure = fired(late)[0]
    assert failure.check(BusPublishError) and "30000 ms" in str(failure.value)


def test_publish_failures_are_typed_and_never_raised():
    driver = FakeDriver()
    reactor = QueueReactor()
    bus = KafkaBus(CONFIG, clock=reactor, driver=driver)
    assert fired(bus.publish(bus.catalogue.events, "k", b"x"))[0].check(BusClosedError)
    d = bus.start()
    reactor.wait(lambda: d.called)
    wrong = bus.publish(bus.catalogue.client_session, "c", Message("t", b""))
    assert fired(wrong)[0].check(RecordEncodingError)  # at once
    assert fired(bus.publish("elsewhere", "k", b"x"))[0].check(RecordEncodingError)
    driver.refuse_send = True
    refused = fired(bus.publish(bus.catalogue.events, "k", b"x"))[0]
    assert refused.check(BusPublishError) and "queue full" in str(refused.value)
    driver.refuse_send = False
    stopping = bus.stop()
    reactor.wait(lambda: stopping.called)
    assert driver.closed == ["producer", "admin"]
    assert fired(bus.publish(bus.catalogue.events, "k", b"x"))[0].check(BusClosedError)


def test_a_topic_that_cannot_be_created_fails_its_publishes():
    driver = FakeDriver()
    bus, reactor = started(driver)
    driver.refuse = True
    d = bus.publish(bus.catalogue.app("c1"), "c1", r.Delivery("c1", Message("a", b""), 1))
    reactor.wait(lambda: d.called)
    failure = fired(d)[0]
    assert failure.check(BusPublishError) and "cannot be created" in str(failure.value)
    driver.refuse = False
    again = bus.publish(bus.catalogue.app("c1"), "c1", r.Delivery("c1", Message("a", b""), 1))
    reactor.wait(lambda: driver.sent)
    assert driver.sent[0][4] == again.callback  # tried again, created this time


def test_an_outage_is_logged_when_it_starts_and_when_it_ends(monkeypatch):
    events: list = []
    monkeypatch.setattr(bus_module, "log", Logger(observer=events.append))
    driver = FakeDriver()
    bus, reactor = started(driver)
    events.clear()
    ds = [bus.publish(bus.catalogue.events, "k", b"%d" % i) for i in range(5)]
    for d in ds[:3]:
        bus._acks.put(d.callback, "timed out")
    for d in ds[3:]:
        bus._acks.put(d.callback, None)
    reactor.drain()
    levels = [e["log_level"].name for e in events]
    assert levels == ["warn", "info"]  # not one line per record


def test_the_start_fails_with_a_bus_error_when_kafka_cannot_be_reached():
    driver = FakeDriver()
    driver.refuse = True
    reactor = QueueReactor()
    bus = KafkaBus(CONFIG, clock=reactor, driver=driver)
    d = bus.start()
    reactor.wait(lambda: d.called)
    failure = fired(d)[0]
    assert failure.check(bus_module.BusError) and "127.0.0.1:9092" in str(failure.value)
    assert not bus.running
    assert fired(bus.publish(bus.catalogue.events, "k", b"x"))[0].check(BusClosedError)


def test_groups_of_two_topics_are_two_kafka_groups():
    assert kafka_group("p.tbmq.msg.all", "g") != kafka_group("p.tbmq.events", "g")


# -- the plugin ----------------------------------------------------------------------------

def test_the_plugin_builds_the_bus_for_bus_kafka_only():
    clock = Clock()
    assert kafka_plugin.plugin.tbmq_message_bus(config=Config(), clock=clock) is None
    config = Config(bus="kafka", kafka=KafkaConfig(topic_prefix="x.", driver="confluent"))
    bus = kafka_plugin.plugin.tbmq_message_bus(config=config, clock=clock)
    assert isinstance(bus, KafkaBus) and bus.encodes is True
    assert bus.catalogue.msg_all == "x.tbmq.msg.all" and bus.clock is clock
    assert bus.driver.__name__ == "tbmq_plugins.kafka.confluent"


def test_a_missing_client_library_is_a_config_error_saying_what_to_install(monkeypatch):
    monkeypatch.setitem(drivers.DRIVERS, "kafka-python",
                        (".not_installed_here", "pip install 'tbmq[kafka]'"))
    with pytest.raises(ConfigError) as info:
        KafkaBus(KafkaConfig(driver="kafka-python"))
    assert info.value.key == "kafka.driver" and "pip install 'tbmq[kafka]'" in str(info.value)
    with pytest.raises(ConfigError):
        drivers.load_driver("kafka-go")


def test_the_hook_gives_the_kafka_bus_before_the_embedded_default():
    from tbmq.plugins import make_plugin_manager

    config = Config(bus="kafka", kafka=KafkaConfig(topic_prefix="h."))
    pm = make_plugin_manager(config, load_entry_points=False)
    pm.register(kafka_plugin.plugin, name="kafka")
    bus = pm.hook.tbmq_message_bus(config=config, clock=Clock())
    assert isinstance(bus, KafkaBus) and bus.catalogue.prefix == "h."
    assert pm.hook.tbmq_message_bus(config=Config(), clock=Clock()).__class__.__name__ \
        == "InProcessBus"


def test_the_entry_point_is_declared():
    import pathlib

    setup = (pathlib.Path(__file__).parents[2] / "setup.py").read_text()
    assert '"kafka = tbmq_plugins.kafka:plugin"' in setup



def test_a_failure_inside_a_slice_hands_the_other_partitions_records_once():
    seen = []

    def handler(record):
        seen.append((record.partition, record.offset))
        if (record.partition, record.offset) == (0, 0):
            raise ValueError("store timed out")

    consumer, clock = consumer_of(handler)
    consumer._assigned([0, 1])
    consumer._batch([raw(0, 0), raw(1, 0), raw(0, 1), raw(1, 1)], [])
    consumer._batch([], [])  # the next poll's batch
    clock.advance(0)
    assert seen == [(0, 0), (1, 0), (1, 1)]
    assert consumer.loop.commits == [(1, 1), (1, 2)]


def test_a_member_of_a_joining_group_is_caught_up_once_the_whole_group_has_a_position():
    """The cluster's groups get their first members one at a time: a member
    whose own partitions are read is caught up (and its node accepts
    clients) only once every partition of the topic has a committed offset
    in the group, so that nothing is published where no member has a
    position yet (it would start at the end and skip it)."""
    bus = FakeBus()
    answers = [False, False, True]
    asked = []

    def group_positioned(consumer):
        asked.append(consumer.group)
        return defer.succeed(answers.pop(0))

    bus.group_positioned = group_positioned
    consumer = KafkaConsumer(bus, "t", "g", lambda record: None, r.BYTES, 10, 10,
                             group_wide=True)
    consumer.loop = FakeLoop()
    consumer._assigned([0])
    consumer._batch([], [0])  # its own partition read to the end
    assert asked == ["g"] and not consumer.caught_up.called
    bus.clock.advance(KafkaConsumer.GROUP_CHECK_EVERY)
    assert len(asked) == 2 and not consumer.caught_up.called
    bus.clock.advance(KafkaConsumer.GROUP_CHECK_EVERY)
    assert len(asked) == 3 and consumer.caught_up.called
    exclusive = KafkaConsumer(bus, "t", "n", lambda record: None, r.BYTES, 10, 10)
    exclusive.loop = FakeLoop()
    exclusive._assigned([0])
    exclusive._batch([], [0])
    assert exclusive.caught_up.called and len(asked) == 3  # its group is itself


class Reader:
    """A client (:class:`~tbmq_plugins.kafka.loop.SharedLoop`) that read a topic."""

    def __init__(self, finished: bool) -> None:
        self.finished = finished


def test_a_topic_is_deleted_once_the_clients_that_read_it_closed():
    """librdkafka crashes a client that read a topic deleted since: the
    deletion waits for them (``kafka.request_timeout_ms`` at most), then a
    publish creates the topic again."""
    driver = FakeDriver()
    bus, reactor = started(driver, dataclasses.replace(CONFIG, request_timeout_ms=1000))
    topic = bus.catalogue.app("c1")
    delivery = r.Delivery("c1", Message("a", b""), 1)
    bus.publish(topic, "c1", delivery)
    reactor.wait(lambda: driver.sent)
    reader = Reader(finished=False)
    bus._read_by[topic] = {reader}
    outcome = fired(bus.delete_topic(topic))
    reactor.advance(0.2)
    reactor.drain()
    assert driver.deleted == [] and outcome == []  # the client still runs
    reader.finished = True
    reactor.advance(0.05)
    reactor.wait(lambda: outcome)
    assert outcome == [None] and driver.deleted == [topic] and topic not in bus._read_by
    bus.publish(topic, "c1", delivery)
    reactor.wait(lambda: len(driver.sent) == 2)
    assert [s.name for s in driver.created].count(topic) == 2  # created again
    # a client that goes on reading other topics: the deletion gives up
    bus._read_by[topic] = {Reader(finished=False)}
    late = fired(bus.delete_topic(topic))
    for _ in range(25):
        reactor.advance(0.05)
    failure = late[0]
    assert failure.check(bus_module.BusError) and "still reads" in str(failure.value)
    assert driver.deleted == [topic]


class Reading:
    """A consumer of the bus on ``topic``."""

    def __init__(self, topic: str) -> None:
        self.topic = topic


def test_a_topic_a_consumer_of_the_bus_reads_is_not_deleted():
    driver = FakeDriver()
    bus, reactor = started(driver)
    topic = bus.catalogue.app("c2")
    bus._consumers.add(Reading(topic))
    assert fired(bus.delete_topic(topic))[0].check(ValueError)
    assert driver.deleted == []
