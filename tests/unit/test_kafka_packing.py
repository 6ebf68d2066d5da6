"""Packed records on the Kafka bus (``plugins/tbmq_plugins/kafka/packing.py``,
``docs/bus.md`` "Packed records"): what one reactor turn publishes to one
partition of a traffic topic is one Kafka record, and a consumer hands it
back as the records it carries, committing its offset once all are done.
On fakes (the driver and the consumer thread of test_kafka_bus); the
contract suite checks the same on Tansu with both drivers."""

from __future__ import annotations

import threading
import zlib

import msgpack
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq.cluster import records as r
from tbmq.cluster.completion import Completion, Progress
from tbmq.errors import BusClosedError, BusPublishError, RecordEncodingError
from tbmq.model import Message
from tbmq_plugins.kafka import drivers, packing
from tbmq_plugins.kafka.consumer import KafkaConsumer
from tbmq_plugins.kafka.drivers import RawRecord
from tests.unit.test_kafka_bus import FakeBus, FakeDriver, FakeLoop, fired, started


def _partition(key: bytes) -> int:
    return zlib.crc32(key) % 6  # the fake driver's topics have 6 partitions


def _same_partition_keys(n: int) -> list[str]:
    keys, i = [], 0
    while len(keys) < n:
        k = f"t/{i}"
        if _partition(k.encode()) == _partition(b"t/0"):
            keys.append(k)
        i += 1
    return keys


def test_the_records_of_one_turn_for_one_partition_go_as_one_packed_record():
    driver = FakeDriver()
    bus, reactor = started(driver)
    topic = bus.catalogue.msg_all
    keys = _same_partition_keys(3)
    messages = [Message(k, b"%d" % i, 1) for i, k in enumerate(keys)]
    pending = [bus.publish(topic, k, m) for k, m in zip(keys, messages)]
    assert driver.sent == []  # at the end of the turn
    reactor.advance(0)
    assert len(driver.sent) == 1
    sent_topic, key, value, headers, outcome = driver.sent[0]
    assert (sent_topic, key, headers) == (topic, None, (packing.HEADER,))
    assert driver.partitions == [_partition(keys[0].encode())]
    tag, version, packed_keys, values = msgpack.unpackb(value)
    assert (tag, version) == ("pack", 2)
    assert packed_keys == [k.encode() for k in keys]
    # each inline: the msgpack object it would be alone, read by one unpacking
    assert values == [msgpack.unpackb(r.MESSAGE.encode(m)) for m in messages]
    assert value.endswith(b"".join(r.MESSAGE.encode(m) for m in messages))
    bus._acks.put(outcome, None)
    reactor.drain()
    assert [fired(d) for d in pending] == [[None]] * 3


def test_a_packed_record_that_fails_fails_every_publish_it_carries():
    driver = FakeDriver()
    bus, reactor = started(driver)
    keys = _same_partition_keys(2)
    pending = [bus.publish(bus.catalogue.msg_all, k, Message(k, b"x")) for k in keys]
    reactor.advance(0)
    bus._acks.put(driver.sent[0][4], "timed out")
    reactor.drain()
    for d in pending:
        assert fired(d)[0].check(BusPublishError)


def test_publishes_with_done_are_packed_without_a_deferred_each_done_called_once(
        monkeypatch):
    events: list = []
    monkeypatch.setattr(packing, "log", Logger(observer=events.append))
    driver = FakeDriver()
    bus, reactor = started(driver)
    topic = bus.catalogue.msg_all
    keys = _same_partition_keys(3)
    outcomes: list = []

    def raising(outcome):
        raise RuntimeError("a done that raises")

    dones = [lambda outcome: outcomes.append(("a", outcome)), raising,
             lambda outcome: outcomes.append(("c", outcome))]
    for k, done in zip(keys, dones):
        assert bus.publish(topic, k, Message(k, b"x"), (), done) is None
    reactor.advance(0)
    (_topic, _key, _value, _headers, fanout), = driver.sent
    assert type(fanout) is packing.Fanout and fanout.dones == dones  # no Deferred
    bus._acks.put(fanout, None)
    reactor.drain()
    # one that raises is logged; the others are still told, once
    assert outcomes == [("a", None), ("c", None)]
    assert [e["log_level"].name for e in events] == ["critical"]


def test_publishes_with_done_wait_for_their_topic_and_fail_at_stop_or_when_not_created():
    driver = FakeDriver()
    bus, reactor = started(driver)
    delivery = r.Delivery("c", Message("a", b"x"), 1)
    driver.refuse = True
    refused: list = []
    bus.publish(bus.catalogue.app("c1"), "c1", delivery, (), refused.append)
    reactor.wait(lambda: refused)
    assert len(refused) == 1 and refused[0].check(BusPublishError)
    assert "cannot be created" in str(refused[0].value)
    driver.refuse = False
    driver.gate.clear()  # the next creation hangs
    waiting: list = []
    for i in range(2):
        bus.publish(bus.catalogue.downlink_basic("n9"), "c", delivery, (), waiting.append)
    reactor.drain()
    assert waiting == []  # queued while the topic is created
    stopping = bus.stop()
    assert [o.check(BusClosedError) for o in waiting] == [BusClosedError] * 2
    driver.gate.set()
    reactor.wait(lambda: stopping.called)
    assert len(waiting) == 2


def test_a_lone_record_goes_alone_on_the_partition_of_its_key():
    driver = FakeDriver()
    bus, reactor = started(driver)
    done = []
    bus.publish(bus.catalogue.downlink_basic("n1"), "client-1",
                r.Delivery("client-1", Message("a", b"x"), 1), (), done.append)
    reactor.wait(lambda: reactor.advance(0) or driver.sent)  # created, then sent
    # alone: the producer reports to the publish's own done
    assert [(s[1], s[3], s[4]) for s in driver.sent] == [(b"client-1", (), done.append)]
    assert driver.partitions == [_partition(b"client-1")]


def test_a_record_with_headers_is_sent_alone_after_what_waits_for_its_partition():
    driver = FakeDriver()
    bus, reactor = started(driver)
    topic = bus.catalogue.msg_all
    first, second = _same_partition_keys(2)
    bus.publish(topic, first, Message(first, b"1"))
    bus.publish(topic, second, Message(second, b"2"), (("h", b"v"),))
    assert [(s[1], s[3]) for s in driver.sent] == [(first.encode(), ()),
                                                   (second.encode(), (("h", b"v"),))]
    assert driver.partitions == [_partition(first.encode())] * 2


def test_topics_that_are_not_packed_go_at_once_placed_by_the_client():
    driver = FakeDriver()
    bus, reactor = started(driver)
    c = bus.catalogue
    bus.publish(c.events, "k", b"1")
    bus.publish(c.client_session, "c", None)
    bus.publish(c.app("app-1"), "app-1", r.Delivery("app-1", Message("a", b"x"), 1))
    assert len(driver.sent) == 2  # the app topic is being created
    assert driver.partitions == [None, None]
    assert not any(c.packable(t) for t in (c.events, c.client_session, c.app("a"),
                                           c.app_shared("a/b"), c.msg_retained, c.nodes))
    assert all(c.packable(t) for t in (c.msg_all, c.msg_persisted, c.downlink_basic("n"),
                                       c.downlink_persisted("n"), c.session_event_request,
                                       c.session_event_response("n"), c.client_disconnect("n")))


def test_a_packed_record_is_split_at_its_limits(monkeypatch):
    monkeypatch.setattr(packing, "MAX_RECORDS", 2)
    driver = FakeDriver()
    bus, reactor = started(driver)
    keys = _same_partition_keys(5)
    for k in keys:
        bus.publish(bus.catalogue.msg_all, k, Message(k, b"x"))
    reactor.advance(0)
    counts = [len(msgpack.unpackb(s[2])[2]) if s[3] else 1 for s in driver.sent]
    assert counts == [2, 2, 1]
    order = []
    for s in driver.sent:
        order += msgpack.unpackb(s[2])[2] if s[3] else [s[1]]
    assert order == [k.encode() for k in keys]  # publish order kept


def test_stop_sends_what_this_turn_published():
    driver = FakeDriver()
    bus, reactor = started(driver)
    bus.publish(bus.catalogue.msg_all, "a", Message("a", b"x"))
    stopping = bus.stop()
    reactor.wait(lambda: stopping.called)
    assert len(driver.sent) == 1


# -- the consumer side ---------------------------------------------------------------------

def _packed_raw(partition: int, offset: int, items: list) -> RawRecord:
    """A packed record of version 1 (each value a ``bin``: these tests' raw
    bytes are no msgpack values), which consumers still read."""
    value = msgpack.packb(["pack", 1, [k for k, _ in items], [v for _, v in items]],
                          use_bin_type=True)
    return RawRecord(partition, offset, None, value, (packing.HEADER_V1,))


def _pending_consumer(partition: int):
    """A consumer of ``partition`` whose handler's results fire when the
    test says: :returns: ``(consumer, results, seen)``."""
    seen, results = [], []

    def pending(record):
        seen.append((record.key, record.value, record.partition, record.offset))
        d = defer.Deferred()
        results.append(d)
        return d

    consumer = KafkaConsumer(FakeBus(), "t", "g", pending, r.BYTES, 100, 1000)
    consumer.loop = FakeLoop()
    consumer._assigned([partition])
    return consumer, results, seen


def test_a_packed_record_is_handed_as_its_records_and_committed_once_all_are_done():
    consumer, results, seen = _pending_consumer(3)
    consumer._batch([_packed_raw(3, 7, [(b"a", b"1"), (b"b", b"2"), (None, b"3")]),
                     RawRecord(3, 8, b"c", b"4", ())], [])
    assert seen == [("a", b"1", 3, 7), ("b", b"2", 3, 7), (None, b"3", 3, 7), ("c", b"4", 3, 8)]
    results[0].callback(None)
    results[1].callback(None)
    assert consumer.loop.commits == []  # the third record of offset 7 is not done
    results[3].callback(None)
    assert consumer.loop.commits == []
    results[2].callback(None)
    assert consumer.loop.commits == [(3, 9)]


def test_a_failed_record_of_a_packed_record_leaves_its_offset_uncommitted():
    consumer, results, _seen = _pending_consumer(0)
    consumer._batch([_packed_raw(0, 0, [(b"a", b"1"), (b"b", b"2")])], [])
    results[0].callback(None)
    results[1].errback(RuntimeError("cannot store it"))
    assert consumer.loop.commits == []
    consumer.bus.clock.advance(1.0)
    assert consumer.loop.seeks == [(0, 0)]  # the whole Kafka record, read again
    consumer._assigned([0])  # the thread sought it
    consumer._batch([_packed_raw(0, 0, [(b"a", b"1"), (b"b", b"2")])], [])
    assert len(results) == 4  # both records handed again
    results[2].callback(None)
    results[3].callback(None)
    assert consumer.loop.commits == [(0, 1)]


def test_a_completion_result_commits_a_packed_record_once_its_parts_are_done():
    seen, parts = [], []

    def relayed(record):
        seen.append(record.value)
        pending = Completion()
        parts.append(pending.part())
        if record.value != b"2":
            parts.append(pending.part())
        else:
            pending.part()(None)  # done during the handler
        return pending

    consumer = KafkaConsumer(FakeBus(), "t", "g", relayed, r.BYTES, 100, 1000)
    consumer.loop = FakeLoop()
    consumer._assigned([1])
    consumer._batch([_packed_raw(1, 4, [(b"a", b"1"), (b"b", b"2")]),
                     RawRecord(1, 5, b"c", b"3", ())], [])
    assert seen == [b"1", b"2", b"3"] and len(parts) == 5
    for done in parts[:4]:
        done(None)
    assert consumer.loop.commits == [(1, 5)]  # the packed record; 5 has a part open
    parts[4](Failure(BusPublishError("not acknowledged")))
    assert consumer.loop.commits == [(1, 5)]
    consumer.bus.clock.advance(1.0)
    assert consumer.loop.seeks == [(1, 5)]  # read again from the failed one


def test_a_malformed_packed_record_is_refused_like_any_record_that_does_not_decode():
    got = []
    consumer = KafkaConsumer(FakeBus(), "t", "g", got.append, r.MESSAGE, 10, 10)
    consumer.loop = FakeLoop()
    consumer._assigned([0])
    good = r.MESSAGE.encode(Message("a", b""))
    v1 = (packing.HEADER_V1,)
    bad = [RawRecord(0, 0, None, b"\xc1garbage", (packing.HEADER,)),
           RawRecord(0, 1, None, msgpack.packb(["pack", 2, [b"k"], [good]]), v1),
           RawRecord(0, 2, None, msgpack.packb(["pack", 1, [b"k"], []]), v1),
           RawRecord(0, 3, None, msgpack.packb(["pack", 1, [7], [good]]), v1),
           RawRecord(0, 4, None, msgpack.packb(["pack", 1, [b"k"], [good]]),
                     (packing.HEADER,)),
           RawRecord(0, 5, None, msgpack.packb(["pack", 2, [b"k", b"l"], [None]]),
                     (packing.HEADER,))]
    consumer._batch(bad + [RawRecord(0, 6, b"a", good, ())], [])
    assert got == []  # the partition stops at the first bad one
    assert consumer.loop.commits == []  # nothing commits past it
    consumer.bus.clock.advance(1.0)
    assert consumer.loop.seeks == [(0, 0)]  # read again, not skipped
    assert [len(packing.expand(b)) for b in bad] == [1] * 6


# -- the batch handler ---------------------------------------------------------------------

def _batch_consumer(handler, batch_handler, buffer_limit: int = 1000):
    consumer = KafkaConsumer(FakeBus(), "t", "g", handler, r.BYTES, 100, buffer_limit,
                             batch_handler=batch_handler)
    consumer.loop = FakeLoop()
    consumer._assigned([2])
    return consumer


def test_a_batch_handler_gets_a_packed_records_values_in_one_call_one_result_one_commit():
    singles, batches, results = [], [], []

    def batch(values):
        batches.append(values)
        results.append(defer.Deferred())
        return results[-1]

    consumer = _batch_consumer(lambda record: singles.append(record.value), batch)
    consumer._batch([_packed_raw(2, 7, [(b"a", b"1"), (b"b", b"2"), (None, b"3")]),
                     RawRecord(2, 8, b"c", b"4", ())], [])
    assert batches == [[b"1", b"2", b"3"]]
    assert singles == [b"4"]  # a lone record: to the handler
    assert consumer.loop.commits == []  # offset 7's one result is open
    results[0].callback(None)
    assert consumer.loop.commits == [(2, 9)]


def test_a_failed_batch_is_read_again_whole():
    batches, failing = [], [True]

    def batch(values):
        batches.append(values)
        if failing:
            failing.clear()
            raise RuntimeError("cannot deliver")
        return None

    consumer = _batch_consumer(lambda record: None, batch)
    packed = _packed_raw(2, 0, [(b"a", b"1"), (b"b", b"2")])
    consumer._batch([packed], [])
    assert consumer.loop.commits == []
    consumer.bus.clock.advance(1.0)
    assert consumer.loop.seeks == [(2, 0)]
    consumer._assigned([2])  # the thread sought it
    consumer._batch([packed], [])
    assert batches == [[b"1", b"2"], [b"1", b"2"]]
    assert consumer.loop.commits == [(2, 1)]


def test_the_buffer_and_the_slice_count_a_packed_records_records(monkeypatch):
    """A packed record counts as the records it carries: the buffer limit
    pauses the client at that many records (not Kafka records), and one
    reactor turn hands at most ``SLICE`` records."""
    from tbmq_plugins.kafka import consumer as consumer_module
    monkeypatch.setattr(consumer_module, "SLICE", 4)
    batches = []
    consumer = _batch_consumer(lambda record: None, batches.append, buffer_limit=6)
    consumer.pause()
    consumer.loop.want_paused = False
    consumer._batch([_packed_raw(2, 0, [(b"k", b"%d" % i) for i in range(3)])], [])
    assert consumer.loop.want_paused is False  # 3 records held, under 6
    consumer._batch([_packed_raw(2, 1, [(b"k", b"%d" % i) for i in range(3, 6)])], [])
    assert consumer.loop.want_paused is True  # 6 records held
    consumer._paused = False  # as resume, without the thread's pause
    consumer._pump()
    assert batches == [[b"0", b"1", b"2"], [b"3", b"4", b"5"]]
    assert consumer._held == 0 and consumer.loop.want_paused is False
    consumer._batch([_packed_raw(2, 2, [(b"k", b"x")] * 5), _packed_raw(2, 3, [(b"k", b"y")])],
                    [])
    assert len(batches) == 3  # 5 records: the turn's slice is spent
    consumer.bus.clock.advance(0)
    assert len(batches) == 4


def test_the_buffer_counts_the_messages_of_a_downlinks_runs():
    """On a node's downlink, a :class:`DeliveryRun` counts as the messages
    it carries (the codec's ``count_arrays``), so the buffer's limit is in
    messages whether the router sent runs or a delivery each."""
    m = [Message(f"t/{i}", b"x", 1) for i in range(8)]
    values = [r.DeliveryRun("a", m[:5], 1), r.DeliveryRun("b", m[5:], 1), r.Delivery("c", m[0], 1)]
    value = packing.pack([b"a", b"b", b"c"], r.DOWNLINK.encode_many(values))
    batches = []
    consumer = KafkaConsumer(FakeBus(), "t", "g", lambda record: None, r.DOWNLINK, 100, 9,
                             batch_handler=batches.append)
    consumer.loop = FakeLoop()
    consumer._assigned([2])
    consumer.pause()
    consumer.loop.want_paused = False
    consumer._batch([RawRecord(2, 0, None, value, (packing.HEADER,))], [])
    assert consumer._held == 9 and consumer.loop.want_paused is True
    consumer._paused = False
    consumer._pump()
    assert consumer._held == 0 and consumer.loop.want_paused is False
    ((a, b, c),) = batches
    assert (list(a.messages), list(b.messages), c.message) == (m[:5], m[5:], m[0])


def test_a_packed_record_of_version_2_is_read_with_one_unpacking_by_both_handlers():
    messages = [Message(f"t/{i}", b"%d" % i, 1, properties={}) for i in range(3)]
    value = packing.pack([m.topic.encode() for m in messages],
                         [r.MESSAGE.encode(m) for m in messages])
    raw = RawRecord(2, 7, None, value, (packing.HEADER,))
    batches, singles = [], []
    consumer = KafkaConsumer(FakeBus(), "t", "g", singles.append, r.MESSAGE, 100, 1000,
                             batch_handler=batches.append)
    consumer.loop = FakeLoop()
    consumer._assigned([2])
    consumer._batch([raw], [])
    assert batches == [messages] and singles == []
    assert consumer.loop.commits == [(2, 8)]
    plain = KafkaConsumer(FakeBus(), "t", "g", singles.append, r.MESSAGE, 100, 1000)
    plain.loop = FakeLoop()
    plain._assigned([2])
    plain._batch([raw], [])
    assert [(s.key, s.value, s.offset) for s in singles] == [
        (m.topic, m, 7) for m in messages]
    # a tombstone is nil inline; each expanded value is its record's bytes
    tomb = packing.expand(RawRecord(0, 1, None, packing.pack([b"k", b"l"], [None, value]),
                                    (packing.HEADER,)))
    assert [(t.key, t.value) for t in tomb] == [(b"k", None), (b"l", msgpack.packb(
        msgpack.unpackb(value)))]


def test_a_version_2_value_that_is_not_a_record_fails_its_batch():
    good = msgpack.unpackb(r.MESSAGE.encode(Message("a", b"x")), use_list=False)
    assert r.MESSAGE.decode_arrays((good,)) == [Message("a", b"x")]
    for bad in [(good, ("msg", 9)), (good, None), (b"bytes",), (("dlv", 1),)]:
        try:
            r.MESSAGE.decode_arrays(bad)
        except RecordEncodingError:
            continue
        raise AssertionError(f"{bad!r} was read")
    delivery = r.Delivery("c", Message("a", b"x"), 1)
    marker = r.SessionMarker("c", "n", "s")
    arrays = tuple(msgpack.unpackb(r.PERSISTED.encode(v), use_list=False)
                   for v in (delivery, marker))
    assert r.PERSISTED.decode_arrays(arrays) == [delivery, marker]
    try:
        r.PERSISTED.decode_arrays((None,))
    except RecordEncodingError:
        pass
    else:
        raise AssertionError("a tombstone was read")


def test_publish_many_sends_the_records_packed_per_partition_with_one_done():
    driver = FakeDriver()
    bus, reactor = started(driver)
    topic = bus.catalogue.downlink_basic("n1")
    keys = _same_partition_keys(3) + ["other"]
    assert _partition(b"other") != _partition(keys[0].encode())
    deliveries = [r.Delivery(k, Message("t", b"%d" % i), 1) for i, k in enumerate(keys)]
    outcomes: list = []
    ready = bus._when_ready(topic)
    reactor.wait(lambda: ready.called)
    bus.publish_many(topic, keys, deliveries, outcomes.append)
    assert driver.sent == []  # at the end of the turn
    reactor.advance(0)
    assert sorted(len(msgpack.unpackb(s[2])[2]) if s[3] else 1 for s in driver.sent) == [1, 3]
    for s in driver.sent:
        assert outcomes == []  # one done, once both Kafka records are acknowledged
        bus._acks.put(s[4], None)
        reactor.drain()
    assert outcomes == [None]
    bad: list = []
    bus.publish_many(topic, ["a"], [Message("t", b"")], bad.append)  # not a Delivery
    assert len(bad) == 1 and bad[0].check(RecordEncodingError)


def test_records_added_together_spread_over_packed_records_report_once_all_are_acked():
    sent = []
    packer = packing.Packer(lambda *record: sent.append(record), lambda fn: None)
    outcomes: list = []
    packer.add("t", 0, b"first", b"\x01", (), outcomes.append)
    n = packing.MAX_RECORDS + 5
    packer.add_many("t", 0, [b"k"] * n, [b"\x02"] * n, outcomes.append)
    packer.flush()
    assert [len(msgpack.unpackb(s[3])[2]) for s in sent] == [packing.MAX_RECORDS, 6]
    first, second = sent[0][5], sent[1][5]
    second(None)
    assert outcomes == []  # the first Kafka record carries some of them too
    first(Failure(BusPublishError("not acknowledged")))
    assert outcomes[0].check(BusPublishError) and outcomes[1].check(BusPublishError)
    assert len(outcomes) == 2  # the lone publish's, and the group's once


def test_records_added_together_that_fit_join_what_waits_in_order():
    """Records added together that fit what waits for their partition join
    it as they are (keys, values and tombstones in order, one done); those
    that would pass MAX_BYTES spread as when added one by one."""
    sent = []
    packer = packing.Packer(lambda *record: sent.append(record), lambda fn: None)
    outcomes: list = []
    packer.add("t", 0, b"first", b"\x01", (), outcomes.append)
    packer.add_many("t", 0, [b"a", b"b", b"c"], [b"\x02", None, b"\x03"], outcomes.append)
    packer.flush()
    assert len(sent) == 1
    keys, values = packing._unpacked(sent[0][3], 2)[:2]
    assert keys == (b"first", b"a", b"b", b"c") and values == (1, 2, None, 3)
    sent[0][5](None)
    assert outcomes == [None, None]
    sent.clear()
    half = b"\xc5\x07\xd0" + b"x" * 2000  # a bin of 2,000 bytes: 2,003 bytes of msgpack
    n = packing.MAX_BYTES // len(half)  # with the first, one too many for a packed record
    packer.add("t", 0, b"first", half, (), outcomes.append)
    packer.add_many("t", 0, [b"k"] * n, [half] * n, outcomes.append)
    packer.flush()
    assert [len(packing._unpacked(s[3], 2)[0]) if s[4] else 1 for s in sent] == [n, 1]
    assert sum(len(v) for v in packing._unpacked(sent[0][3], 2)[1]) <= packing.MAX_BYTES


def test_publish_many_to_one_partition_or_several_places_each_key_as_publish_does():
    """Every key to one partition (a fan-in to one client) goes as one
    group; keys over several partitions, each to its key's partition: where
    a publish of the same key would go."""
    driver = FakeDriver()
    bus, reactor = started(driver)
    topic = bus.catalogue.downlink_basic("n1")
    ready = bus._when_ready(topic)
    reactor.wait(lambda: ready.called)
    for keys in (["c"] * 5, [f"c{i}" for i in range(20)]):
        driver.sent.clear()
        driver.partitions.clear()
        deliveries = [r.Delivery(k, Message("t", b"%d" % i), 1) for i, k in enumerate(keys)]
        outcomes: list = []
        bus.publish_many(topic, keys, deliveries, outcomes.append)
        reactor.advance(0)
        placed = {}
        for s, partition in zip(driver.sent, driver.partitions):
            found = packing._unpacked(s[2], 2) if s[3] else None
            for key in (found[0] if found else (s[1],)):
                placed[key.decode()] = partition
        assert sorted(placed) == sorted(set(keys))
        assert all(p == _partition(k.encode()) for k, p in placed.items())
        for s in driver.sent:
            bus._acks.put(s[4], None)
            reactor.drain()
        assert outcomes == [None]


def test_single_records_of_one_partition_go_to_the_batch_handler_in_one_call():
    """An APPLICATION client's topic is not packed: the records a poll
    brought for one partition reach the batch handler together, each still
    committed on its own as the batch's Progress grows (exact per record)."""
    singles, batches, progress = [], [], []

    def batch(values):
        batches.append(list(values))
        progress.append(Progress(len(values)))
        return progress[-1]

    consumer = _batch_consumer(lambda record: singles.append(record.value), batch)
    consumer._batch([RawRecord(2, o, b"c", b"%d" % o, ()) for o in range(5, 9)], [])
    assert batches == [[b"5", b"6", b"7", b"8"]] and singles == []
    done = progress[0]
    done.finished(1)
    assert consumer.loop.commits == []  # 5 is not finished
    done.finished(0)
    assert consumer.loop.commits == [(2, 7)]  # 5 and 6: the commit names 7
    done.finished(3)
    assert consumer.loop.commits == [(2, 7)]
    done.finished(2)
    assert consumer.loop.commits == [(2, 7), (2, 9)]
    assert consumer._inflight == 0


def test_a_run_of_single_records_stops_at_a_record_with_headers():
    singles, batches = [], []
    consumer = _batch_consumer(lambda record: singles.append(record.value),
                               lambda values: batches.append(list(values)))
    consumer._batch([RawRecord(2, 0, b"c", b"0", ()), RawRecord(2, 1, b"c", b"1", ()),
                     RawRecord(2, 2, b"c", b"2", (("h", b"1"),)),
                     RawRecord(2, 3, b"c", b"3", ())], [])
    assert batches == [[b"0", b"1"]] and singles == [b"2", b"3"]
    assert consumer.loop.commits == [(2, 2), (2, 3), (2, 4)]


def test_a_record_of_a_run_that_does_not_decode_fails_alone_after_those_before_it():
    singles, batches = [], []
    consumer = KafkaConsumer(FakeBus(), "t", "g", lambda record: singles.append(record.value),
                             r.MESSAGE, 100, 1000, batch_handler=batches.append)
    consumer.loop = FakeLoop()
    consumer._assigned([0])
    good = r.MESSAGE.encode(Message("a", b""))
    consumer._batch([RawRecord(0, 0, b"c", good, ()), RawRecord(0, 1, b"c", b"\x01bad", ()),
                     RawRecord(0, 2, b"c", good, ())], [])
    # the run stops before the bad one, which is handed alone (and fails)
    assert [[m.topic for m in batch] for batch in batches] == [["a"]] and singles == []
    assert consumer.loop.commits == [(0, 1)]  # the bad one holds the partition there
    consumer.bus.clock.advance(1.0)
    assert consumer.loop.seeks == [(0, 1)]


# -- several records with one outcome, placed by the client (an APPLICATION client's topic) --

def test_reports_put_one_outcome_after_the_last_record_with_the_first_error():
    put: list = []
    reports = drivers.Reports(lambda done, error: put.append((done, error)), "d", 3)
    reports.delivered(None, object())
    reports.report("timed out")
    assert put == []  # one record not reported yet
    reports.report("later")
    assert put == [("d", "timed out")]  # once, the first error
    ok: list = []
    one = drivers.Reports(lambda done, error: ok.append((done, error)), "e", 2)
    one.report()
    one.refused(1, "queue full")
    assert ok == [("e", "queue full")]


def test_reports_from_two_threads_put_once():
    """The client's thread and the reactor (a refusal) may report at the
    same time: exactly one report is the last."""
    for _ in range(20):
        put: list = []
        n = 20_000
        reports = drivers.Reports(lambda done, error: put.append(error), None, 2 * n)
        other = threading.Thread(target=lambda: [reports.report() for _ in range(n)])
        other.start()
        reports.refused(n, "refused")
        other.join()
        assert put == ["refused"]


def test_publish_many_to_a_topic_the_client_places_is_one_send_many_with_one_outcome():
    driver = FakeDriver()
    bus, reactor = started(driver)
    topic = bus.catalogue.app("app-1")
    ready = bus._when_ready(topic)
    reactor.wait(lambda: ready.called)
    message = Message("a", b"x", 1)
    outcomes: list = []
    bus.publish_many(topic, ["app-1"] * 3, [r.Delivery("app-1", message, 1, seq=i)
                                            for i in range(3)], outcomes.append)
    assert [r.DELIVERY.decode(s[2]).seq for s in driver.sent] == [0, 1, 2]  # at once, in order
    assert driver.partitions == [None] * 3 and {s[1] for s in driver.sent} == {b"app-1"}
    for s in driver.sent:
        reactor.drain()
        assert outcomes == []  # one done, once all three are acknowledged
        s[4]()
    reactor.wait(lambda: outcomes)
    assert outcomes == [None]
    driver.sent.clear()
    failed: list = []
    bus.publish_many(topic, ["app-1"] * 2, [r.Delivery("app-1", message, 1)] * 2, failed.append)
    driver.sent[1][4]("timed out")
    driver.sent[0][4]()
    reactor.wait(lambda: failed)
    assert len(failed) == 1 and failed[0].check(BusPublishError)
    refused: list = []
    driver.refuse_send = True
    bus.publish_many(topic, ["app-1"], [r.Delivery("app-1", message, 1)], refused.append)
    reactor.wait(lambda: refused)
    assert len(refused) == 1 and refused[0].check(BusPublishError)
    empty: list = []
    bus.publish_many(topic, [], [], empty.append)
    assert empty == [None]


def test_a_run_of_single_records_stops_at_the_slices_messages_weighed_by_the_codec():
    """An APPLICATION client's records may be DeliveryRuns of many messages:
    a reactor turn hands single records until they carry the slice's 256
    messages (the codec's ``weigh``), not 256 records; the rest follow in
    the next turns, in order."""
    batches: list = []
    consumer = KafkaConsumer(FakeBus(), "t", "g", lambda record: None, r.APPLICATION, 100, 1000,
                             batch_handler=lambda values: batches.append(values))
    consumer.loop = FakeLoop()
    consumer._assigned([0])
    run = r.APPLICATION.encode(r.DeliveryRun("c", [Message("a", b"x", 1)] * 100, 1))
    lone = r.APPLICATION.encode(r.Delivery("c", Message("b", b"y", 1), 1))
    raws = [RawRecord(0, o, b"c", run if o < 5 else lone, ()) for o in range(7)]
    consumer._batch(raws, [])
    assert [[type(v).__name__ for v in b] for b in batches] == [["DeliveryRun"] * 3]
    consumer.bus.clock.advance(0)
    assert [len(b) for b in batches] == [3, 4]  # 200 messages, then the two lone ones
    assert [type(v).__name__ for b in batches for v in b] == ["DeliveryRun"] * 5 + ["Delivery"] * 2
    assert consumer.loop.commits[-1] == (0, 7)  # each handled (None): committed


def test_a_run_record_commits_once_each_of_its_messages_finished():
    """A DeliveryRun of an APPLICATION client's topic is one Kafka record:
    its offset commits once the batch's Progress finished each of its
    messages (``Progress.parts``), in order with the records around it."""
    progress: list = []

    def batch(values):
        p = Progress(len(values))
        for i, v in enumerate(values):
            if type(v) is r.DeliveryRun:
                p.parts(i, len(v.messages))
        progress.append(p)
        return p

    consumer = KafkaConsumer(FakeBus(), "t", "g", lambda record: None, r.APPLICATION, 100, 1000,
                             batch_handler=batch)
    consumer.loop = FakeLoop()
    consumer._assigned([0])
    lone = r.APPLICATION.encode(r.Delivery("c", Message("a", b"x", 1), 1))
    run = r.APPLICATION.encode(r.DeliveryRun("c", [Message("b", b"y", 1)] * 3, 1))
    consumer._batch([RawRecord(0, 0, b"c", lone, ()), RawRecord(0, 1, b"c", run, ()),
                     RawRecord(0, 2, b"c", lone, ())], [])
    (p,) = progress
    p.finished(0)
    assert consumer.loop.commits == [(0, 1)]
    p.finished(2)
    p.finished(1)
    p.finished(1)
    assert consumer.loop.commits == [(0, 1)]  # the run waits for its third message
    p.finished(1)
    assert consumer.loop.commits == [(0, 1), (0, 3)]
