"""The message bus contract (``docs/bus.md``, :class:`tbmq.interfaces.IMessageBus`),
run against every bus through the ``bus_factory`` fixture (see conftest).

A subscription passes ``exclusive=True`` where its group has one member for
the whole test (the Kafka bus then assigns the partitions without a group
join); the tests of groups with several members, and a few single members
(``test_every_group_gets_every_record``, the ``tail`` group of
``test_from_beginning_and_caught_up``), join their group."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from twisted.internet import defer
from zope.interface.verify import verifyObject

from tbmq.cluster import records as r
from tbmq.cluster import redelivery
from tbmq.cluster.completion import Completion, Progress
from tbmq.errors import BusClosedError, ConsumerFailedError, RecordEncodingError
from tbmq.interfaces import IConsumer, IDescribableBus, IMessageBus
from tbmq.model import ClientType, Message, SubscriptionOptions
from tbmq.mqtt.constants import Property


def collector(into: list, results=None):
    """A handler that appends the record; returns ``results(record)`` when given."""
    def handler(record):
        into.append(record)
        return None if results is None else results(record)
    return handler


def values(got: list) -> list:
    return [rec.value for rec in got]


def publish_all(env, bus, topic, items) -> None:
    """Publish ``(key, value)`` items and wait for every publish."""
    pending = [env.publish(bus, topic, key, value) for key, value in items]
    for d in pending:
        env.run(d)


def test_the_bus_and_its_consumers_provide_the_interfaces(env):
    bus = env.bus()
    assert verifyObject(IMessageBus, bus)
    assert bus.encodes is env.encodes
    consumer = env.subscribe(bus, env.catalogue.events, "g", collector([]), exclusive=True)
    assert verifyObject(IConsumer, consumer)
    assert consumer.topic == env.catalogue.events and consumer.group == "g"


def test_records_of_one_key_arrive_in_publish_order(env):
    bus = env.bus(partitions=4)
    topic = env.catalogue.events
    got: list = []
    env.subscribe(bus, topic, "g", collector(got), exclusive=True)
    env.settle()
    keys = [f"key-{k}" for k in range(13)]
    items = [(keys[i % 13], f"{keys[i % 13]}:{i // 13}".encode()) for i in range(13 * 25)]
    publish_all(env, bus, topic, items)
    env.wait_until(lambda: len(got) == len(items))
    by_key = defaultdict(list)
    partition_of = {}
    for rec in got:
        assert rec.topic == topic and rec.headers == ()
        by_key[rec.key].append(int(rec.value.split(b":")[1]))
        assert partition_of.setdefault(rec.key, rec.partition) == rec.partition
    assert set(by_key) == set(keys)
    for key in keys:
        assert by_key[key] == list(range(25)), key
    # offsets grow within each partition
    last: dict = {}
    for rec in got:
        assert rec.offset > last.get(rec.partition, -1)
        last[rec.partition] = rec.offset
    assert len(set(partition_of.values())) > 1  # 13 keys over 4 partitions


def test_headers_reach_the_consumer(env):
    bus = env.bus()
    got: list = []
    env.subscribe(bus, env.catalogue.events, "g", collector(got), exclusive=True)
    env.settle()
    env.run(env.publish(bus, env.catalogue.events, "k", b"v", (("trace", b"\x01\x02"),)))
    env.wait_until(lambda: got)
    assert got[0].headers == (("trace", b"\x01\x02"),) and got[0].key == "k"


def test_every_group_gets_every_record(env):
    bus = env.bus(partitions=3)
    topic = env.catalogue.events
    got = {g: [] for g in ("a", "b", "c")}
    for g, into in got.items():
        env.subscribe(bus, topic, g, collector(into))
    env.settle()
    items = [(f"k{i % 7}", b"%d" % i) for i in range(60)]
    publish_all(env, bus, topic, items)
    env.wait_until(lambda: all(len(v) == 60 for v in got.values()))
    for into in got.values():
        assert sorted(values(into)) == sorted(v for _, v in items)


def test_members_of_one_group_share_the_partitions(env):
    bus = env.bus(partitions=4)
    topic = env.catalogue.events
    first, second = [], []
    env.subscribe(bus, topic, "g", collector(first))
    env.subscribe(bus, topic, "g", collector(second))
    env.settle()
    items = [(f"k{i}", b"%d" % i) for i in range(200)]
    publish_all(env, bus, topic, items)
    env.wait_until(lambda: len(first) + len(second) >= 200)
    env.settle()
    assert len(first) + len(second) == 200  # each record to exactly one member
    assert sorted(values(first) + values(second)) == sorted(v for _, v in items)
    assert first and second
    assert not {rec.partition for rec in first} & {rec.partition for rec in second}


def test_a_stopped_members_uncommitted_records_go_to_the_other_member(env):
    bus = env.bus()
    topic = env.catalogue.events
    first, second = [], []
    never = []  # handler results that never fire

    def pending(record):
        d = defer.Deferred()
        never.append(d)
        return d

    a = env.subscribe(bus, topic, "g", collector(first, pending))
    env.settle()
    items = [("k", b"%d" % i) for i in range(5)]
    for key, value in items:
        env.publish(bus, topic, key, value)
    env.wait_until(lambda: len(first) == 5)
    env.subscribe(bus, topic, "g", collector(second))
    env.run(env.call(a.stop))
    env.wait_until(lambda: len(second) >= 5)
    assert values(second)[:5] == [v for _, v in items]


def test_a_failed_handler_result_leaves_the_record_uncommitted(env, monkeypatch):
    monkeypatch.setattr(redelivery, "FIRST_DELAY", 60.0)  # a rebalance comes first
    bus = env.bus()
    topic = env.catalogue.events
    first, second = [], []

    def fail_on_two(record):
        if record.value == b"2":
            return defer.fail(RuntimeError("cannot store it"))
        return defer.succeed(None)

    a = env.subscribe(bus, topic, "g", collector(first, fail_on_two))
    env.settle()
    for i in range(5):
        d = env.publish(bus, topic, "k", b"%d" % i)
        if i == 2 and env.consumer_failures_fail_publish:
            with pytest.raises(ConsumerFailedError):
                env.run(d)
    env.wait_until(lambda: len(first) == 3)
    env.settle()
    assert values(first) == [b"0", b"1", b"2"]  # the partition stopped at the failure
    env.subscribe(bus, topic, "g", collector(second))
    env.run(env.call(a.stop))
    env.wait_until(lambda: len(second) >= 3)
    env.settle()
    # handed again from the failed record; the records before it were committed
    assert values(second) == [b"2", b"3", b"4"]


@pytest.mark.parametrize("exclusive", [True, False], ids=["exclusive", "joining"])
def test_a_failed_record_is_handed_again_by_the_same_member_in_order_without_a_rebalance(
        env, monkeypatch, exclusive):
    monkeypatch.setattr(redelivery, "FIRST_DELAY", 0.2)
    bus = env.bus()
    topic = env.catalogue.events
    got: list = []
    failures = {b"2": 1, b"4": 2}  # transient: the device store timing out

    def flaky(record):
        if failures.get(record.value):
            failures[record.value] -= 1
            return defer.fail(RuntimeError("store timed out"))
        return defer.succeed(None)

    env.subscribe(bus, topic, "g", collector(got, flaky), exclusive=exclusive)
    env.settle()
    for i in range(6):
        env.publish(bus, topic, "k", b"%d" % i)
    env.wait_until(lambda: b"5" in values(got))
    env.settle()
    assert values(got) == [b"0", b"1", b"2", b"2", b"3", b"4", b"4", b"4", b"5"]
    # everything is committed: a new member of the group gets nothing again
    later: list = []
    env.subscribe(bus, topic, "other", collector(later), exclusive=exclusive)
    env.settle()
    env.run(env.publish(bus, topic, "k", b"6"))
    env.wait_until(lambda: b"6" in values(got) and later)
    env.settle()
    assert values(got)[9:] == [b"6"] and values(later) == [b"6"]


def test_a_raising_handler_is_a_failed_result_handed_again_until_it_passes(env, monkeypatch):
    monkeypatch.setattr(redelivery, "FIRST_DELAY", 0.2)
    bus = env.bus()
    topic = env.catalogue.events
    got: list = []

    def handler(record):
        got.append(record.value)
        if record.value == b"bad" and got.count(b"bad") < 3:
            raise ValueError("boom")

    env.subscribe(bus, topic, "g", handler, exclusive=True)
    env.settle()
    d = env.publish(bus, topic, "k", b"bad")
    if env.consumer_failures_fail_publish:
        with pytest.raises(ConsumerFailedError) as info:
            env.run(d)
        assert info.value.group == "g"
    env.run(env.publish(bus, topic, "k", b"good"))
    env.wait_until(lambda: b"good" in got)
    assert got == [b"bad", b"bad", b"bad", b"good"]


def test_commit_only_after_the_handlers_deferred_fired(env):
    bus = env.bus()
    topic = env.catalogue.events
    first, second = [], []
    results: dict = {}

    def keep(record):
        d = results[record.value] = defer.Deferred()
        return d

    a = env.subscribe(bus, topic, "g", collector(first, keep))
    env.settle()
    for i in range(4):
        env.publish(bus, topic, "k", b"%d" % i)
    env.wait_until(lambda: len(first) == 4)
    # 0 and 1 done, 2 not yet, 3 done: the commit stops before 2
    for v in (b"0", b"1", b"3"):
        env.call(results[v].callback, None)
    env.settle()
    env.subscribe(bus, topic, "g", collector(second))
    env.run(env.call(a.stop))
    env.wait_until(lambda: len(second) >= 2)
    env.settle()
    assert values(second) == [b"2", b"3"]


def test_lag_counts_the_records_the_group_has_not_committed(env):
    bus = env.bus()
    topic = env.catalogue.events
    handed: list = []
    results: list = []

    def hold(record):
        d = defer.Deferred()
        results.append(d)
        return d

    consumer = env.subscribe(bus, topic, "g", collector(handed, hold), exclusive=True)
    env.settle()
    assert env.call(consumer.lag) == 0
    for i in range(4):
        env.publish(bus, topic, "k", b"%d" % i)
    env.wait_until(lambda: len(handed) == 4)
    assert env.call(consumer.lag) == 4  # handed, results not fired
    env.call(lambda: [d.callback(None) for d in results[:3]])
    env.wait_until(lambda: env.call(consumer.lag) == 1)
    env.call(results[3].callback, None)
    env.wait_until(lambda: env.call(consumer.lag) == 0)


def test_a_member_is_never_reentered(env):
    bus = env.bus()
    topic = env.catalogue.events
    depth = [0]
    seen = []

    def handler(record):
        assert depth[0] == 0, "re-entered"
        depth[0] += 1
        try:
            seen.append(record.value)
            if record.value == b"first":  # published from inside the handler
                env.publish(bus, topic, "k", b"second")
        finally:
            depth[0] -= 1

    env.subscribe(bus, topic, "g", handler, exclusive=True)
    env.settle()
    env.publish(bus, topic, "k", b"first")
    env.wait_until(lambda: len(seen) == 2)
    assert seen == [b"first", b"second"]


def test_pause_and_resume(env):
    bus = env.bus()
    topic = env.catalogue.events
    got: list = []
    consumer = env.subscribe(bus, topic, "g", collector(got), exclusive=True)
    env.settle()
    env.run(env.publish(bus, topic, "k", b"before"))
    env.wait_until(lambda: len(got) == 1)
    env.call(consumer.pause)
    env.call(consumer.pause)  # idempotent
    pending = [env.publish(bus, topic, "k", b"%d" % i) for i in range(10)]
    env.settle()
    assert values(got) == [b"before"]
    if env.publish_waits_for_consumers:
        assert all(isinstance(d, defer.Deferred) and not d.called for d in pending)
    env.call(consumer.resume)
    env.call(consumer.resume)
    env.wait_until(lambda: len(got) == 11)
    assert values(got)[1:] == [b"%d" % i for i in range(10)]
    for d in pending:
        env.run(d)


def test_from_beginning_and_caught_up(env):
    bus = env.bus()
    topic = env.catalogue.events
    items = [("k%d" % (i % 3), b"%d" % i) for i in range(6)]
    publish_all(env, bus, topic, items)  # nobody consumes yet
    got: list = []
    results: list = []

    def later(record):
        d = defer.Deferred()
        results.append(d)
        return d

    consumer = env.subscribe(bus, topic, "replay", collector(got, later), from_beginning=True,
                             exclusive=True)
    env.wait_until(lambda: len(got) == 6)
    assert sorted(values(got)) == sorted(v for _, v in items)
    caught = []
    consumer.caught_up.addCallback(caught.append)
    env.settle()
    assert caught == []  # the handlers' results have not fired
    for d in results:
        env.call(d.callback, None)
    env.run(consumer.caught_up)
    assert caught == [None]
    # a group that starts at the end gets only what comes next, caught up at once
    late: list = []
    tail = env.subscribe(bus, topic, "tail", collector(late))
    env.run(tail.caught_up)
    d = env.publish(bus, topic, "k0", b"new")
    env.wait_until(lambda: late and len(results) == 7)
    env.call(results[6].callback, None)
    env.run(d)
    env.settle()
    assert values(late) == [b"new"]



def _slow_and_fast(env, bus, topic) -> list:
    """Two exclusive groups on ``topic``: "slow", whose handler returns a
    Deferred per record (appended to the list returned, for the test to
    fire), and "fast", which handles at once; settled."""
    results: list = []

    def later(record):
        d = defer.Deferred()
        results.append(d)
        return d

    env.subscribe(bus, topic, "slow", later, exclusive=True)
    env.subscribe(bus, topic, "fast", collector([]), exclusive=True)
    env.settle()
    return results

def test_publish_and_the_handlers_results(env):
    bus = env.bus()
    topic = env.catalogue.events
    results = _slow_and_fast(env, bus, topic)
    d = env.publish(bus, topic, "k", b"x")
    env.wait_until(lambda: results)
    env.settle()
    if env.publish_waits_for_consumers:
        # in process, "durable" means every group handled it
        assert isinstance(d, defer.Deferred) and not d.called
        env.call(results[0].callback, None)
        assert env.run(d) is None
    else:
        assert env.run(d) is None  # the brokers have it; the handler is another matter
        assert not results[0].called


def test_publish_fails_typed_when_the_bus_is_not_running(env):
    bus = env.unstarted_bus()
    d = env.publish(bus, env.catalogue.events, "k", b"x")  # never raised
    with pytest.raises(BusClosedError):
        env.run(d)
    env.run(env.call(bus.start))
    env.run(env.publish(bus, env.catalogue.events, "k", b"x"))
    env.run(env.call(bus.stop))
    with pytest.raises(BusClosedError):
        env.run(env.publish(bus, env.catalogue.events, "k", b"x"))


def test_a_value_of_the_wrong_type_fails_typed(env):
    bus = env.bus()
    c = env.catalogue
    got: list = []
    env.subscribe(bus, c.client_session, "g", collector(got), exclusive=True)
    env.settle()
    # a durable topic is encoded on every bus
    with pytest.raises(RecordEncodingError):
        env.run(env.publish(bus, c.client_session, "c", Message("t", b"")))
    d = env.publish(bus, c.msg_all, "t", "not a message")
    if env.encodes:
        with pytest.raises(RecordEncodingError):
            env.run(d)
    else:  # the direct mode hands the object over as it is
        assert env.run(d) is None
    d = env.publish(bus, c.events, "k", {"not": "bytes"})
    if env.encodes:
        with pytest.raises(RecordEncodingError):
            env.run(d)
    env.settle()
    assert got == []


def test_publish_fails_with_consumer_failed_but_other_groups_get_the_record(env):
    bus = env.bus()
    topic = env.catalogue.events
    good: list = []
    env.subscribe(bus, topic, "bad", lambda record: defer.fail(OSError("disk full")),
                  exclusive=True)
    env.subscribe(bus, topic, "good", collector(good), exclusive=True)
    env.settle()
    d = env.publish(bus, topic, "k", b"x")
    if env.consumer_failures_fail_publish:
        with pytest.raises(ConsumerFailedError) as info:
            env.run(d)
        assert info.value.group == "bad"
    else:
        assert env.run(d) is None
    env.wait_until(lambda: good)
    assert values(good) == [b"x"]


def test_publish_with_done_calls_it_exactly_once_when_durable(env):
    bus = env.bus()
    c = env.catalogue
    topic = c.events
    results = _slow_and_fast(env, bus, topic)
    returned, outcomes = env.publish_done(bus, topic, "k", b"x", (("trace", b"1"),))
    assert returned is None  # no Deferred with done
    env.wait_until(lambda: results)
    if env.publish_waits_for_consumers:
        # in process, "durable" means every group handled it
        env.settle()
        assert outcomes == []
        env.call(results[0].callback, None)
    env.wait_until(lambda: outcomes)
    env.settle()
    assert outcomes == [None]  # once
    if not env.publish_waits_for_consumers:
        assert not results[0].called  # the brokers have it; the handler is another matter
    # many in one reactor turn (Kafka: packed records): each done once
    many: list = []

    def burst():
        for i in range(40):
            name = f"t/{i % 3}"
            bus.publish(c.msg_all, name, Message(name, b"%d" % i), (),
                        lambda outcome, i=i: many.append((i, outcome)))

    env.call(burst)
    env.wait_until(lambda: len(many) >= 40)
    env.settle()
    assert sorted(many) == [(i, None) for i in range(40)]


def test_publish_with_done_reports_the_typed_failures_once(env):
    c = env.catalogue
    bus = env.unstarted_bus()
    returned, closed = env.publish_done(bus, c.events, "k", b"x")
    # during the call
    assert returned is None and len(closed) == 1 and closed[0].check(BusClosedError)
    env.run(env.call(bus.start))
    _, wrong = env.publish_done(bus, c.client_session, "c", Message("t", b""))
    assert len(wrong) == 1 and wrong[0].check(RecordEncodingError)
    good: list = []
    env.subscribe(bus, c.events, "bad", lambda record: defer.fail(OSError("disk full")),
                  exclusive=True)
    env.subscribe(bus, c.events, "good", collector(good), exclusive=True)
    env.settle()
    _, failed = env.publish_done(bus, c.events, "k", b"y")
    env.wait_until(lambda: failed and good)
    if env.consumer_failures_fail_publish:
        assert failed[0].check(ConsumerFailedError) and failed[0].value.group == "bad"
    else:
        assert failed == [None]
    pending: list = []
    if env.publish_waits_for_consumers:
        env.subscribe(bus, c.msg_retained, "held", lambda record: defer.Deferred(),
                      exclusive=True)
        env.settle()
        _, pending = env.publish_done(bus, c.msg_retained, "a/b", Message("a/b", b"r"))
        env.settle()
        assert pending == []
    env.run(env.call(bus.stop))
    _, stopped = env.publish_done(bus, c.events, "k", b"z")
    env.settle()
    assert len(stopped) == 1 and stopped[0].check(BusClosedError)
    if env.publish_waits_for_consumers:  # what was pending at the stop
        assert len(pending) == 1 and pending[0].check(BusClosedError)
    assert len(closed) == len(wrong) == len(failed) == 1


def test_a_completion_result_commits_once_every_part_is_done(env):
    bus = env.bus()
    topic = env.catalogue.events
    first, second = [], []
    parts: dict = {}

    def two_parts(record):
        pending = Completion()
        one, two = pending.part(), pending.part()
        if record.value == b"3":  # complete when returned
            one(None)
            two(None)
        elif record.value == b"1":  # one part done during the handler
            one(None)
            parts[record.value] = [two]
        else:
            parts[record.value] = [one, two]
        return pending

    a = env.subscribe(bus, topic, "g", collector(first, two_parts))
    env.settle()
    for i in range(4):
        env.publish(bus, topic, "k", b"%d" % i)
    env.wait_until(lambda: len(first) == 4)
    # 0 and 1 done, 2 has a part open, 3 was done: the commit stops before 2
    env.call(lambda: [done(None) for value in (b"0", b"1") for done in parts[value]])
    env.call(parts[b"2"][1], None)
    env.settle()
    env.subscribe(bus, topic, "g", collector(second))
    env.run(env.call(a.stop))
    env.wait_until(lambda: len(second) >= 2)
    env.settle()
    assert values(second) == [b"2", b"3"]


def test_a_completion_of_publishes_commits_once_they_are_durable_or_is_handed_again(
        env, monkeypatch):
    """The router's way: a record's handler publishes with ``done`` parts of
    one completion and returns it."""
    monkeypatch.setattr(redelivery, "FIRST_DELAY", 0.2)
    bus = env.bus()
    c = env.catalogue
    source, target = c.events, c.client_disconnect("node-b")
    seen, relayed, held = [], [], []
    command = r.DisconnectCommand("c1", "1" * 32, 0x8E)

    def slow(record):
        if not held:  # the first one is held
            held.append(defer.Deferred())
            return held[0]
        return None

    def relay(record):
        pending = Completion()
        bus.publish(target, "c1", command, (), pending.part())
        if record.value == b"bad" and seen.count(b"bad") < 3:
            # refused by its codec: the record fails
            bus.publish(c.client_session, "c1", Message("t", b""), (), pending.part())
        return pending

    env.subscribe(bus, target, "slow", collector(relayed, slow), exclusive=True)
    consumer = env.subscribe(bus, source, "relay", lambda record: (
        seen.append(record.value), relay(record))[1], exclusive=True)
    env.settle()
    _, outcome = env.publish_done(bus, source, "k", b"ok")
    env.wait_until(lambda: len(relayed) == 1)
    if env.publish_waits_for_consumers:
        # in process the relayed record is durable once its consumer handled
        # it: until then the relay's record is not committed
        env.settle()
        assert outcome == [] and env.call(consumer.lag) == 1
        env.call(held[0].callback, None)
    env.wait_until(lambda: outcome == [None] and env.call(consumer.lag) == 0)
    _, bad = env.publish_done(bus, source, "k", b"bad")
    env.wait_until(lambda: seen.count(b"bad") == 3 and env.call(consumer.lag) == 0)
    env.settle()
    assert seen == [b"ok", b"bad", b"bad", b"bad"]  # handed again until it passed
    assert len(relayed) == 4  # at least once: the failed tries' relays too
    if env.consumer_failures_fail_publish:
        assert len(bad) == 1 and bad[0].check(ConsumerFailedError)
    else:
        assert bad == [None]


def test_a_batch_handler_gets_a_turns_records_in_one_call_and_a_failed_batch_again(
        env, monkeypatch):
    """``batch_handler``: the records one reactor turn published to one
    partition of a traffic topic come in one call where the bus carries them
    together (Kafka's packed records); the in-process bus hands a record
    published while nothing waits to ``handler`` at once, and the records
    that waited together to ``batch_handler``.  Either way each in order,
    and a failed result hands the records it covered again."""
    monkeypatch.setattr(redelivery, "FIRST_DELAY", 0.2)
    bus = env.bus()
    topic = env.catalogue.msg_all
    handed, batches, failed = [], [], []

    def fail_once(payloads):
        if not failed and b"5" in payloads:
            failed.append(True)
            return defer.fail(RuntimeError("the first try fails"))
        return None

    def batch(messages):
        batches.append([m.payload for m in messages])
        handed.extend(batches[-1])
        return fail_once(batches[-1])

    def single(record):
        handed.append(record.value.payload)
        return fail_once([handed[-1]])

    env.subscribe(bus, topic, "g", single, exclusive=True, batch_handler=batch)
    env.settle()
    outcomes: list = []
    env.call(lambda: [bus.publish(topic, "k", Message("k", b"%d" % i), (), outcomes.append)
                      for i in range(10)])
    every = [b"%d" % i for i in range(10)]
    env.wait_until(lambda: len(outcomes) == 10)
    env.wait_until(lambda: handed[-5:] == every[5:] and handed.count(b"5") == 2)
    env.settle()
    # the failed result fails the publish only where a bus says so
    assert (outcomes[5] is not None) == env.consumer_failures_fail_publish
    if env.batches:
        assert batches == [every, every]  # one call; handed again whole
    else:
        # in order; handed again from the failed one, or from the first of
        # its batch (at once, or together at the end of the turn)
        assert any(handed == every[:i] + every[j:] for i in range(6, 11) for j in range(6))
        assert batches[-1][-5:] == every[5:]  # what waited meanwhile: one call


def every_record(c):
    message = Message("a/b", b"\x00payload", 1, True,
                      {Property.USER_PROPERTY: [("k", "v")], Property.CONTENT_TYPE: "text/plain",
                       Property.MESSAGE_EXPIRY_INTERVAL: 60},
                      "pub-1", 1700000000.25, 1700000060.25)
    will = r.WillRecord("will/c", b"bye", 1, False, {Property.WILL_DELAY_INTERVAL: 5})
    session = r.SessionInfo("c1", "node-a", "0" * 32, True, True, ClientType.APPLICATION, 3600,
                            5, 1700000000.0, None, 1700000001.5, will)
    delivery = r.Delivery("c1", message, 1, True, (3, 7), 42)
    return [
        (c.msg_all, "a/b", message),
        (c.msg_retained, "a/b", message),
        (c.msg_persisted, "c1", delivery),
        (c.downlink_basic("node-a"), "c1", delivery),
        (c.downlink_persisted("node-a"), "c1", delivery),
        (c.app("c1"), "c1", delivery),
        # a routing node's run of QoS 1 messages to an APPLICATION client (Kafka)
        (c.app("c2"), "c2", r.DeliveryRun("c2", (message, message), 1, True, (3,))),
        (c.app_shared("a/+"), "share", r.Delivery("share", message, 0)),
        (c.client_session, "c1", session),
        (c.client_subscriptions, "c1", r.SubscriptionsRecord(
            "c1", {"a/#": SubscriptionOptions(1, True, False, 1, 9),
                   "$share/g/x": SubscriptionOptions()})),
        (c.session_event_request, "c1", r.SessionEvent(
            r.CONNECTION_REQUEST, "c1", "node-a", "1" * 32, "req-1", True, True,
            ClientType.APPLICATION, 3600, 5, 1700000000.0)),
        (c.session_event_response("node-a"), "c1", r.SessionEventResponse(
            "c1", "req-1", True, False, session, "")),
        (c.client_disconnect("node-b"), "c1", r.DisconnectCommand("c1", "1" * 32, 0x8E)),
        (c.events, "c1", b'{"v":1}'),
        (c.msg_retained, "gone", None),
        (c.client_session, "gone", None),
        (c.client_subscriptions, "gone", None),
    ]


def test_every_record_type_round_trips_through_the_bus(env):
    bus = env.bus()
    cases = every_record(env.catalogue)
    got: dict = defaultdict(list)
    for topic in {topic for topic, _, _ in cases}:
        env.subscribe(bus, topic, "g", collector(got[topic]), exclusive=True)
    env.settle()
    for topic, key, value in cases:
        env.run(env.publish(bus, topic, key, value))
    env.wait_until(lambda: sum(len(v) for v in got.values()) == len(cases))
    for topic, key, value in cases:
        match = [rec for rec in got[topic] if rec.key == key]
        assert len(match) == 1, (topic, key)
        received = match[0].value
        assert received == value
        if value is not None and not isinstance(value, bytes):
            assert type(received) is type(value)
            if env.encodes:
                assert received is not value  # decoded, not the published object


def test_durable_topics_are_replayed_after_a_restart(env):
    c = env.catalogue
    bus = env.bus()
    app = c.app("app-1")
    got: list = []
    results: dict = {}

    def keep(record):
        d = results[record.value.seq] = defer.Deferred()
        return d

    env.subscribe(bus, app, "app-1", collector(got, keep), exclusive=True)
    env.settle()
    message = Message("a/b", b"x", 1)
    pending = [env.publish(bus, app, "app-1", r.Delivery("app-1", message, 1, seq=i))
               for i in range(5)]
    env.wait_until(lambda: len(got) == 5)
    for seq in (0, 1):
        env.call(results[seq].callback, None)
    for d in pending[:2]:
        env.run(d)
    # sessions: the last value per key, across the restart
    env.run(env.publish(bus, c.client_session, "c1", session_info("c1", "node-a")))
    env.run(env.publish(bus, c.client_session, "c1", session_info("c1", "node-b")))
    env.run(env.publish(bus, c.client_session, "c2", session_info("c2", "node-a")))
    env.run(env.publish(bus, c.client_session, "c2", None))
    env.run(env.publish(bus, c.client_session, "c3", session_info("c3", "node-a")))

    bus = env.restart(bus)
    again: list = []
    consumer = env.subscribe(bus, app, "app-1", collector(again), exclusive=True)
    env.run(consumer.caught_up)
    env.wait_until(lambda: len(again) >= 3)
    assert [rec.value.seq for rec in again] == [2, 3, 4]
    assert again[0].value == r.Delivery("app-1", message, 1, seq=2)
    sessions: list = []
    replay = env.subscribe(bus, c.client_session, "registry-x", collector(sessions),
                           from_beginning=True, exclusive=True)
    env.run(replay.caught_up)
    last = {}
    for rec in sessions:
        last[rec.key] = rec.value
    last = {k: v for k, v in last.items() if v is not None}
    assert {k: v.service_id for k, v in last.items()} == {"c1": "node-b", "c3": "node-a"}
    if env.compacts:
        assert [rec.value.service_id for rec in sessions if rec.key == "c1"] == ["node-b"]


def session_info(client_id, service_id):
    return r.SessionInfo(client_id, service_id, "ab" * 16, True, True, ClientType.DEVICE, 60, 5,
                         1700000000.0, None, 1700000000.0)


def test_compacted_topics_keep_the_last_value_per_key(env):
    c = env.catalogue
    bus = env.bus(partitions=2)
    subs = c.client_subscriptions
    first = r.SubscriptionsRecord("c1", {"a": SubscriptionOptions(0)})
    second = r.SubscriptionsRecord("c1", {"a": SubscriptionOptions(1), "b": SubscriptionOptions()})
    other = r.SubscriptionsRecord("c2", {"x": SubscriptionOptions()})
    for key, value in (("c1", first), ("c2", other), ("c1", second), ("c2", None),
                       ("c3", other)):
        env.run(env.publish(bus, subs, key, value))
    got: list = []
    consumer = env.subscribe(bus, subs, "g", collector(got), from_beginning=True,
                             exclusive=True)
    env.run(consumer.caught_up)
    last = {}
    for rec in got:
        last[rec.key] = rec.value
    assert {k: v for k, v in last.items() if v is not None} == {"c1": second, "c3": other}
    if env.compacts:
        assert [rec.value for rec in got if rec.key == "c1"] == [second]


def test_a_new_group_on_an_application_topic_gets_what_waited(env):
    c = env.catalogue
    bus = env.bus()
    topic = c.app("newcomer")
    message = Message("a/b", b"x", 1)
    publish_all(env, bus, topic, [("newcomer", r.Delivery("newcomer", message, 1, seq=i))
                                  for i in range(3)])
    got: list = []
    consumer = env.subscribe(bus, topic, "newcomer", collector(got), exclusive=True)
    env.run(consumer.caught_up)
    assert [rec.value.seq for rec in got] == [0, 1, 2]
    # a non-durable topic: a new group starts at the end
    events: list = []
    publish_all(env, bus, c.events, [("k", b"old")])
    tail = env.subscribe(bus, c.events, "newcomer", collector(events), exclusive=True)
    env.run(tail.caught_up)
    env.run(env.publish(bus, c.events, "k", b"new"))
    env.wait_until(lambda: events)
    env.settle()
    assert values(events) == [b"new"]


def test_a_progress_commits_its_leading_run_so_the_next_member_gets_exactly_the_rest(env):
    """A persistent APPLICATION client's reader returns a ``Progress`` per
    batch (``Outbox.deliver_app_batch``): whether the records come one by
    one or in batches, the group's position follows the records finished
    in order, so the next member (a reconnect) gets exactly the others;
    one finished after a gap comes again (``docs/bus.md``, "Handlers and
    commits")."""
    bus = env.bus()
    topic = env.catalogue.app("resumer")
    seqs: list = []
    finishers: list = []  # one per handed record, in order

    def batch(deliveries):
        progress = Progress(len(deliveries))
        for i, d in enumerate(deliveries):
            seqs.append(d.seq)
            finishers.append(lambda i=i: progress.finished(i))
        return progress

    def single(record):
        seqs.append(record.value.seq)
        d = defer.Deferred()
        finishers.append(lambda: d.callback(None))
        return d

    consumer = env.subscribe(bus, topic, "resumer", single, exclusive=True, batch_handler=batch)
    env.run(consumer.caught_up)
    outcomes: list = []
    message = Message("a/b", b"x", 1)
    env.call(lambda: [bus.publish(topic, "resumer", r.Delivery("resumer", message, 1, seq=i),
                                  (), outcomes.append) for i in range(6)])
    env.wait_until(lambda: len(outcomes) == 6 and len(seqs) == 6)
    assert seqs == list(range(6)) and outcomes == [None] * 6
    env.call(lambda: [finishers[i]() for i in (0, 1, 2, 4)])  # 3 is not acknowledged
    env.settle()
    env.run(env.call(consumer.stop))
    again: list = []
    env.subscribe(bus, topic, "resumer", collector(again), exclusive=True)
    env.wait_until(lambda: len(again) >= 3)
    env.settle()
    assert [rec.value.seq for rec in again] == [3, 4, 5]


def test_exclusive_subscriptions_of_one_group_on_several_topics_are_independent(env):
    """A node's own topics are one group's exclusive subscriptions (the Kafka
    bus reads them with one client): each topic keeps its own records,
    commits, pause and stop."""
    bus = env.bus(partitions=2)
    c = env.catalogue
    first, second = c.events, c.client_disconnect("node-b")
    got_first: list = []
    got_second: list = []
    one = env.subscribe(bus, first, "node", collector(got_first), exclusive=True)
    env.subscribe(bus, second, "node", collector(got_second), exclusive=True)
    env.settle()
    command = r.DisconnectCommand("c1", "1" * 32, 0x8E)
    publish_all(env, bus, first, [("k%d" % i, b"%d" % i) for i in range(4)])
    publish_all(env, bus, second, [("c1", command)])
    env.wait_until(lambda: len(got_first) == 4 and len(got_second) == 1)
    assert values(got_second) == [command]
    stop_one_the_other_goes_on(
        env, bus, one, (first, second), (got_first, got_second),
        lambda handler: env.subscribe(bus, first, "node", handler, exclusive=True))


def stop_one_the_other_goes_on(env, bus, one, topics, got, subscribe_again) -> None:
    """Stop ``one`` (of ``topics[0]``, which has handled ``b"0"``..``b"3"``
    into ``got[0]``): the subscription of ``topics[1]`` reads on; the
    stopped one, subscribed again (``subscribe_again(handler)``), reads from
    its committed offsets."""
    first, second = topics
    got_first, got_second = got
    env.run(env.call(one.stop))
    publish_all(env, bus, first, [("k9", b"after")])
    publish_all(env, bus, second, [("c3", r.DisconnectCommand("c3", "2" * 32, 0x8E))])
    env.wait_until(lambda: any(rec.key == "c3" for rec in got_second))
    env.settle()
    assert sorted(values(got_first)) == [b"0", b"1", b"2", b"3"]
    again: list = []
    subscribe_again(collector(again))
    env.wait_until(lambda: len(again) == 1)
    env.settle()
    assert values(again) == [b"after"]


def bundle_threads() -> list:
    """The Kafka bus's consumer threads (none in process)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("tbmq-kafka-consumer")]


def test_the_joining_groups_of_a_bundle_are_independent(env):
    """The groups a node joins together (a bundle: the Kafka bus reads them
    with one client, one member of one Kafka group over their topics) keep
    their own records, commits, pause and stop."""
    bus = env.bus(partitions=2)
    c = env.catalogue
    first, second = c.events, c.client_disconnect("node-b")
    got_first: list = []
    got_second: list = []
    one = env.subscribe(bus, first, "ga", collector(got_first), bundle="bundle")
    two = env.subscribe(bus, second, "gb", collector(got_second), bundle="bundle")
    env.run(one.caught_up)
    env.run(two.caught_up)
    env.settle()
    if env.name.startswith("kafka"):  # one client, one thread for both
        threads = bundle_threads()
        assert threads.count(f"tbmq-kafka-consumer {c.prefix}bundle") == 1
        assert not [name for name in threads if f"@{first}" in name or f"@{second}" in name]
    env.call(one.pause)
    pending = [env.publish(bus, first, "k%d" % i, b"%d" % i) for i in range(4)]
    command = r.DisconnectCommand("c1", "1" * 32, 0x8E)
    publish_all(env, bus, second, [("c1", command)])
    env.wait_until(lambda: len(got_second) == 1)
    env.settle()
    assert got_first == [] and values(got_second) == [command]  # the paused one waits
    env.call(one.resume)
    env.wait_until(lambda: len(got_first) == 4)
    for d in pending:
        env.run(d)
    stop_one_the_other_goes_on(
        env, bus, one, (first, second), (got_first, got_second),
        lambda handler: env.subscribe(bus, first, "ga", handler, bundle="bundle"))


def test_a_bundle_joined_later_on_another_node_shares_the_partitions_of_each_topic(env):
    bus = env.bus(partitions=4)
    c = env.catalogue
    # two topics the bus spreads over ``partitions`` (a node's disconnect
    # topic has one partition: TopicCatalogue.partitioned)
    first, second = c.events, c.msg_persisted
    got = {(node, topic): [] for node in (1, 2) for topic in (first, second)}
    for topic, group in ((first, "ga"), (second, "gb")):
        env.subscribe(bus, topic, group, collector(got[1, topic]), bundle="bundle")
    env.settle()
    other = env.another_node(bus, partitions=4)
    for topic, group in ((first, "ga"), (second, "gb")):
        env.subscribe(other, topic, group, collector(got[2, topic]), bundle="bundle")
    env.settle()
    events = [(f"k{i}", b"%d" % i) for i in range(100)]
    commands = [(f"c{i}", r.Delivery(f"c{i}", Message("a/b", b"%d" % i, 1), 1, seq=i))
                for i in range(100)]
    publish_all(env, bus, first, events)
    publish_all(env, other, second, commands)
    for topic, items in ((first, events), (second, commands)):
        env.wait_until(lambda: len(got[1, topic]) + len(got[2, topic]) >= len(items))
    env.settle()
    for topic, items in ((first, events), (second, commands)):
        one, two = got[1, topic], got[2, topic]
        assert sorted(rec.key for rec in one + two) == sorted(k for k, _ in items)
        assert one and two, topic  # each node has partitions of each topic
        assert not {rec.partition for rec in one} & {rec.partition for rec in two}


def test_a_deleted_topic_is_gone_with_its_records_and_offsets(env):
    """``delete_topic`` (TBMQ's removal of an ended APPLICATION session's
    ``tbmq.msg.app.<clientId>``): refused while a member of the bus reads
    the topic; then its records and its groups' offsets are gone, the same
    group reads only what is published after, and deleting a topic that
    does not exist succeeds."""
    c = env.catalogue
    bus = env.bus()
    topic = c.app("gone-app")
    message = Message("a/b", b"x", 1)
    publish_all(env, bus, topic, [("gone-app", r.Delivery("gone-app", message, 1, seq=i))
                                  for i in range(3)])
    got: list = []
    consumer = env.subscribe(bus, topic, "gone-app", collector(got), exclusive=True)
    env.run(consumer.caught_up)
    env.wait_until(lambda: len(got) == 3)
    with pytest.raises(ValueError):
        env.run(env.call(bus.delete_topic, topic))
    env.run(env.call(consumer.stop))
    assert env.run(env.call(bus.delete_topic, topic)) is None
    assert env.run(env.call(bus.delete_topic, topic)) is None  # gone already
    assert env.run(env.call(bus.delete_topic, c.app("never-was"))) is None
    env.run(env.publish(bus, topic, "gone-app", r.Delivery("gone-app", message, 1, seq=9)))
    again: list = []
    consumer = env.subscribe(bus, topic, "gone-app", collector(again), exclusive=True)
    env.run(consumer.caught_up)
    env.wait_until(lambda: again)
    env.settle()
    assert [rec.value.seq for rec in again] == [9]


def _committed(described: dict, group: str, topic: str) -> int:
    """The offsets ``group`` committed on ``topic``, summed over the
    partitions (what ``describe`` says)."""
    for g in described["groups"]:
        if g["group"] == group:
            return sum(c["offset"] for c in g["committed"] if c["topic"] == topic)
    return -1


def test_describe_lists_the_topics_and_the_offsets_a_group_committed(env):
    """The optional ``describe`` (the admin API's ``/api/kafka``): the
    catalogue's topics with their latest offsets, and a group's committed
    offsets once its handlers are done."""
    bus = env.bus(partitions=2)
    assert verifyObject(IDescribableBus, bus)
    topic = env.catalogue.events
    got: list = []
    env.subscribe(bus, topic, "g-described", collector(got), exclusive=True)
    env.settle()
    publish_all(env, bus, topic, [(f"k{i}", b"%d" % i) for i in range(9)])
    env.wait_until(lambda: len(got) == 9)
    env.wait_until(lambda: _committed(env.run(env.call(bus.describe)), "g-described",
                                      topic) == 9)
    described = env.run(env.call(bus.describe))
    assert described["bus"] in ("kafka", "in-process")
    topics = {t["name"]: t for t in described["topics"]}
    assert set(topics) <= {name for name in topics if name.startswith(env.catalogue.prefix)}
    assert topics[topic]["partitions"] == 2 and len(topics[topic]["latest_offsets"]) == 2
    assert all(isinstance(o, int) and o >= 0 for o in topics[topic]["latest_offsets"])
    assert isinstance(described["errors"], list)


def test_a_record_from_another_node_reaches_a_quiet_subscription_soon(env):
    """A consumer that has read nothing for a while (on Kafka an idle client:
    ``kafka.idle_fetch_interval_ms``, 100 ms, then a fetch; librdkafka must
    be woken when its partitions are resumed, or it notices them up to a
    second later) still gets a record another node publishes within a
    fraction of a second, every time."""

    bus = env.bus()
    other = env.another_node(bus)
    topic = env.catalogue.events
    got: list = []
    arrived: dict = {}

    def handler(record):
        arrived[record.value] = time.monotonic()
        got.append(record)

    env.subscribe(bus, topic, "g", handler, exclusive=True)
    env.settle()
    delays = []
    for i in range(5):
        time.sleep(0.4)  # quiet: the client goes idle
        sent = time.monotonic()
        env.run(env.publish(other, topic, "k", b"%d" % i))
        env.wait_until(lambda i=i: b"%d" % i in arrived)
        delays.append(arrived[b"%d" % i] - sent)
    assert max(delays) < 0.6, delays


def test_a_member_taking_its_own_records_gets_each_once_in_partition_order(env):
    """A member that takes its node's records when they are acknowledged
    (``IConsumer.hand_own``, which the router asks for ``tbmq.msg.all``:
    the Kafka bus with confluent-kafka does it, the others answer False) still
    gets every record of its partitions exactly once, in offset order, while
    another node publishes to the same partition in between."""
    bus = env.bus(partitions=2)
    other = env.another_node(bus)
    topic = env.catalogue.msg_all
    got: list = []

    def batch(messages):
        got.extend((None, m.payload) for m in messages)

    consumer = env.subscribe(bus, topic, "g", lambda rec: got.append((rec.offset, rec.value.payload)),
                             batch_handler=batch)
    # the buses that can: confluent-kafka reports where a record landed
    assert env.call(consumer.hand_own) is (env.name == "kafka (confluent)")
    env.settle()
    pending = []
    for i in range(60):
        node = bus if i % 3 else other  # two of three from the member's node
        pending.append(env.publish(node, topic, "a/b", Message("a/b", b"%d" % i, 1)))
        if i % 7 == 0:
            for d in pending:
                env.run(d)
            pending = []
    for d in pending:
        env.run(d)
    env.wait_until(lambda: len(got) >= 60)
    env.settle()
    payloads = [payload for _, payload in got]
    assert sorted(payloads, key=int) == [b"%d" % i for i in range(60)]  # each once
    for node in (0, 1):  # one key: each node's records in its publish order
        mine = [int(x) for x in payloads if (int(x) % 3 == 0) == (node == 0)]
        assert mine == sorted(mine)
    offsets = [o for o, _ in got if o is not None]
    assert offsets == sorted(set(offsets))


def test_a_member_decides_a_key_while_it_hands_and_has_read_its_partition(env):
    """``IConsumer.decides`` (the session events decide their node's
    connect requests at once when it is True): the only member of a
    group, once it has read its partitions to the end, decides every key
    while its bus takes records (Kafka: one of this node's records
    acknowledged within the last half second; the in-process bus: while
    it runs), none while it is paused, none once it left the group, and
    on Kafka none once nothing was acknowledged for longer."""
    bus = env.bus(partitions=2)
    topic = env.catalogue.session_event_request
    consumer = env.subscribe(bus, topic, "deciding", lambda rec: None)
    env.run(consumer.caught_up)
    env.settle()
    kafka = env.name.startswith("kafka")

    def acknowledged():  # a record of this node, on another topic
        env.run(env.publish(bus, env.catalogue.msg_all, "x", Message("x", b"1", 1)))

    acknowledged()
    assert [env.call(consumer.decides, key) for key in ("a", "b", "c")] == [True] * 3
    env.call(consumer.pause)
    assert env.call(consumer.decides, "a") is False
    env.call(consumer.resume)
    acknowledged()
    assert env.call(consumer.decides, "a") is True
    if kafka:
        time.sleep(0.7)  # nothing acknowledged since: Kafka may be away
        assert env.call(consumer.decides, "a") is False
        acknowledged()
        assert env.call(consumer.decides, "a") is True
    env.run(env.call(consumer.stop))
    assert [env.call(consumer.decides, key) for key in ("a", "b", "c")] == [False] * 3


def test_publish_many_to_an_application_topic_has_one_outcome_and_keeps_the_order(env):
    """The router's deliveries to a persistent APPLICATION client
    (``publish_many`` to ``tbmq.msg.app.<clientId>``, one record each):
    one ``done`` per call, once every record is durable, before the topic
    exists and after; the reader gets them in order."""
    bus = env.bus()
    topic = env.catalogue.app("many")
    got: list = []
    consumer = env.subscribe(bus, topic, "many", collector(got), exclusive=True)
    env.run(consumer.caught_up)
    message = Message("a/b", b"x", 1)
    outcomes: list = []
    for start, n in ((0, 3), (3, 40), (43, 1)):
        deliveries = [r.Delivery("many", message, 1, seq=start + i) for i in range(n)]
        env.call(bus.publish_many, topic, ["many"] * n, deliveries, outcomes.append)
        env.wait_until(lambda: len(got) >= start + n)
    env.settle()
    assert outcomes == [None, None, None]  # once each
    assert [rec.value.seq for rec in got] == list(range(44))

    # runs (the router's on Kafka) among deliveries, in order, each one record
    run = r.DeliveryRun("many", (Message("a/b", b"r1", 1), Message("a/b", b"r2", 1)), 1)
    values = [run, r.Delivery("many", message, 1, seq=44), run]
    env.call(bus.publish_many, topic, ["many"] * 3, values, outcomes.append)
    env.wait_until(lambda: len(got) >= 47)
    assert [rec.value for rec in got[44:]] == values and outcomes[-1] is None
