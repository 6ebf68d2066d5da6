"""A member hands its own node's records when Kafka acknowledges them
(plugins/tbmq_plugins/kafka/own.py): once, in offset order, skipped when the
fetch brings them, never while the partition is paused or not this
member's, forgotten when it moves, and committed as any record.  On fakes:
the consumer's thread is a FakeLoop, the producer a fake driver's."""

from __future__ import annotations

from zlib import crc32

from twisted.internet import defer

from tbmq.cluster import records as r
from tbmq.model import ClientType, Message
from tbmq_plugins.kafka.bus import KafkaBus
from tbmq_plugins.kafka.consumer import KafkaConsumer
from tbmq_plugins.kafka.drivers import RawRecord
from tbmq_plugins.kafka.consumer import OWN_HELD_MAX
from tbmq_plugins.kafka.own import Own
from tbmq_plugins.kafka.packing import HEADER, pack

from tests.unit.test_kafka_bus import CONFIG, FakeDriver, FakeLoop, Pending, started


class Counting:
    """A codec that counts what it decodes (bytes as they are)."""

    def __init__(self) -> None:
        self.decoded: list = []

    def decode(self, data):
        self.decoded.append(data)
        return data

    def decode_arrays(self, objs):
        self.decoded.extend(objs)
        return list(objs)

    def count_arrays(self, objs):
        return len(objs)


class OwnBus:
    """What a KafkaConsumer asks of its bus, taking own records."""

    def __init__(self) -> None:
        from twisted.internet.task import Clock
        self.clock = Clock()

    def _take_own(self, consumer) -> bool:
        return True

    def _forget(self, consumer) -> None:
        pass


def member(handler, batch_handler=None, max_uncommitted: int = 100, starts=None):
    """A member taking its own records, given partition 0 from offset 10."""
    codec = Counting()
    consumer = KafkaConsumer(OwnBus(), "t", "g", handler, codec, max_uncommitted, 1000,
                             batch_handler=batch_handler)
    consumer.loop = FakeLoop()
    assert consumer.hand_own()
    consumer._assigned([0], {0: 10} if starts is None else starts)
    return consumer, codec


def raw(o: int, value: bytes | None = None) -> RawRecord:
    return RawRecord(0, o, b"k", value if value is not None else b"%d" % o, ())


def mine(o: int) -> tuple:
    """This node's record at offset ``o``: (key, value object, headers)."""
    return (("k", f"own {o}", ()),)


def test_an_own_record_is_handed_once_on_acknowledgement_and_skipped_when_fetched():
    handler = Pending()
    got = []
    consumer, codec = member(lambda record: (got.append(record), handler(record))[1])
    consumer.take_own(0, 10, (("k", "the object", (("h", b"1"),)),))
    assert [(x.topic, x.key, x.value, x.headers, x.partition, x.offset) for x in got] == [
        ("t", "k", "the object", (("h", b"1"),), 0, 10)]  # the shape a fetch gives
    assert consumer.handed(0) == 11
    consumer._batch([raw(10), raw(11)], [])  # the fetch brings it back, then another's
    assert handler.seen == [(0, 10), (0, 11)]  # 10 once, 11 as read
    assert codec.decoded == [b"11"]  # the own record is not decoded
    handler.results[(0, 10)].callback(None)
    handler.results[(0, 11)].callback(None)
    assert consumer.loop.commits == [(0, 11), (0, 12)]


def test_an_acknowledgement_ahead_of_the_records_before_it_waits_for_them_in_order():
    handler = Pending()
    consumer, codec = member(handler)
    consumer.take_own(0, 12, mine(12))  # 10 and 11: another node's, not read yet
    consumer.take_own(0, 14, mine(14))
    assert handler.seen == []
    consumer._batch([raw(10)], [])
    assert handler.seen == [(0, 10)]  # 11 still missing: 12 waits
    consumer._batch([raw(11)], [])
    assert handler.seen == [(0, 10), (0, 11), (0, 12)]  # 12 right after 11
    consumer._batch([raw(12), raw(13)], [])  # 12 skipped; 14 follows 13 at once
    assert handler.seen == [(0, 10), (0, 11), (0, 12), (0, 13), (0, 14)]
    consumer._batch([raw(14), raw(15)], [])
    assert handler.seen == [(0, 10), (0, 11), (0, 12), (0, 13), (0, 14), (0, 15)]
    assert codec.decoded == [b"10", b"11", b"13", b"15"]
    assert consumer._holding == set()


def test_a_held_record_the_fetch_brings_first_is_handed_once_from_the_held_copy():
    """Another node's record comes first in the partition: this node's own
    record waits, held; when one fetch brings both, the held copy is handed
    in its place (the value as published: not decoded) and commits as read."""
    values = []
    handler = Pending()

    def seeing(record):
        values.append(record.value)
        return handler(record)

    consumer, codec = member(seeing)
    consumer.take_own(0, 11, mine(11))
    consumer._batch([raw(10), raw(11)], [])
    assert handler.seen == [(0, 10), (0, 11)] and values == [b"10", "own 11"]
    assert codec.decoded == [b"10"]  # 11: the held copy, not decoded
    assert not consumer._tracks[0].held
    handler.results[(0, 11)].callback(None)
    handler.results[(0, 10)].callback(None)
    assert consumer.loop.commits == [(0, 12)]


def test_a_held_packed_unit_the_fetch_brings_goes_to_the_batch_handler_from_its_copy():
    batches = []
    consumer, codec = member(lambda record: None, lambda values: batches.append(values))
    consumer.take_own(0, 11, [("a", "v1", ()), ("b", "v2", ())])
    packed = RawRecord(0, 11, None, pack([b"a", b"b"], [b"\xa1x", b"\xa1y"]), (HEADER,))
    consumer._batch([raw(10), packed], [])
    assert batches == [["v1", "v2"]] and codec.decoded == [b"10"]
    assert consumer.loop.commits == [(0, 11), (0, 12)]


def test_records_behind_what_the_buffer_holds_of_their_partition_are_left_to_the_fetch():
    handler = Pending()
    consumer, _ = member(handler, max_uncommitted=1)
    consumer._batch([raw(10), raw(11)], [])  # 11 waits: one result pending at most
    consumer.take_own(0, 12, mine(12))  # the fetch is ahead: not held
    assert handler.seen == [(0, 10)] and not consumer._holding
    handler.results[(0, 10)].callback(None)
    consumer.bus.clock.advance(0)
    handler.results[(0, 11)].callback(None)
    assert handler.seen == [(0, 10), (0, 11)]
    consumer._batch([raw(12)], [])
    consumer.bus.clock.advance(0)
    assert handler.seen == [(0, 10), (0, 11), (0, 12)]  # once, as fetched


def test_a_partition_holds_a_few_units_at_most():
    consumer, _ = member(Pending())
    # 10 and 11 are another node's, not read yet: this node's 12, 13, ... wait
    for offset in range(12, 12 + OWN_HELD_MAX + 3):
        consumer.take_own(0, offset, mine(offset))
    assert sorted(consumer._tracks[0].held) == list(range(12, 12 + OWN_HELD_MAX))


def test_nothing_is_handed_early_while_paused_or_for_a_partition_not_assigned():
    handler = Pending()
    consumer, codec = member(handler)
    consumer.take_own(1, 0, mine(0))  # not this member's partition
    consumer.take_own(0, 11, mine(11))  # held, ahead of 10
    consumer.pause()
    assert not consumer._tracks[0].held  # left to the fetch
    consumer.take_own(0, 10, mine(10))
    assert handler.seen == [] and consumer.handed(0) is None
    consumer._batch([raw(10), raw(11)], [])
    consumer.resume()
    consumer.bus.clock.advance(0)
    assert handler.seen == [(0, 10), (0, 11)]
    assert codec.decoded == [b"10", b"11"]  # both read as any record


def test_a_partition_without_a_known_start_is_not_handed_early_until_reached():
    handler = Pending()
    consumer, _ = member(handler, starts={})  # starts at its end: not known yet
    consumer.take_own(0, 40, mine(40))
    assert handler.seen == []
    consumer._batch([], [0], {0: 41})  # reached: the end is 41, 40 was read before
    consumer.take_own(0, 41, mine(41))
    assert handler.seen == [(0, 41)]


def test_a_rebalance_drops_what_was_held_and_the_next_owner_reads_it():
    handler = Pending()
    consumer, _ = member(handler)
    consumer.take_own(0, 10, mine(10))  # handed, its result open
    consumer.take_own(0, 12, mine(12))  # held, 11 missing
    consumer._revoke([0])
    assert consumer._holding == set()
    handler.results[(0, 10)].callback(None)
    assert consumer.loop.commits == []  # the partition went: not committed here
    consumer._batch([raw(11), raw(12)], [])  # (read before the revocation: dropped)
    assert handler.seen == [(0, 10)]
    other = Pending()
    owner, codec = member(other)  # the next owner, from the committed offset 10
    owner._batch([raw(10), raw(11), raw(12)], [])
    assert other.seen == [(0, 10), (0, 11), (0, 12)]  # 10 again: at least once
    assert codec.decoded == [b"10", b"11", b"12"]


def test_a_commit_never_passes_an_early_record_whose_result_has_not_fired():
    handler = Pending()
    consumer, _ = member(handler)
    consumer._batch([raw(10)], [])
    consumer.take_own(0, 11, mine(11))
    consumer._batch([raw(11), raw(12)], [])
    assert handler.seen == [(0, 10), (0, 11), (0, 12)]
    handler.results[(0, 10)].callback(None)
    handler.results[(0, 12)].callback(None)
    assert consumer.loop.commits == [(0, 11)]  # 11's result is still open
    handler.results[(0, 11)].callback(None)
    assert consumer.loop.commits == [(0, 11), (0, 13)]


def test_an_early_record_that_fails_has_its_partition_read_again_from_it():
    consumer, _ = member(lambda record: defer.fail(RuntimeError("no")))
    consumer.take_own(0, 10, mine(10))
    consumer.bus.clock.advance(1.0)
    assert consumer.loop.seeks == [(0, 10)] and consumer.loop.commits == []


def test_a_packed_records_values_go_to_the_batch_handler_as_one_unit():
    batches, singles = [], []
    consumer, codec = member(singles.append, lambda values: batches.append(values))
    consumer.take_own(0, 10, [("a", "v1", ()), ("b", "v2", ())])
    assert batches == [["v1", "v2"]] and singles == []
    packed = RawRecord(0, 10, None, pack([b"a", b"b"], [b"\xa1x", b"\xa1y"]), (HEADER,))
    consumer._batch([packed], [])
    assert batches == [["v1", "v2"]] and codec.decoded == []
    assert consumer.loop.commits == [(0, 11)]


# -- through the bus ----------------------------------------------------------------------

def _acknowledge(driver, offsets: dict) -> None:
    """The fake producer acknowledges what it was sent, each record at the
    next offset of its partition, telling where as confluent-kafka does."""
    for (_topic, _key, _value, _headers, done), partition in zip(driver.sent, driver.partitions):
        if getattr(done, "located", False):
            done.where = (partition, offsets[partition])
        offsets[partition] += 1
        done(None)
    driver.sent.clear()
    driver.partitions.clear()


def test_the_bus_hands_its_own_messages_as_published_and_packed_records_as_one_unit():
    driver = FakeDriver()
    driver.LOCATES = True
    bus, reactor = started(driver)
    topic = bus.catalogue.msg_all
    batches, singles = [], []
    consumer = KafkaConsumer(bus, topic, "g", singles.append, bus._codec(topic), 100, 1000,
                             batch_handler=batches.append)
    consumer.loop = FakeLoop()
    assert consumer.hand_own()
    p = crc32(b"a/b") % CONFIG.partitions
    consumer._assigned([p], {p: 0})
    first, second = Message("a/b", b"1", 1), Message("a/b", b"2", 1)
    acked = []
    bus.publish(topic, "a/b", first, (), acked.append)
    bus.publish(topic, "a/b", second, (), acked.append)
    reactor.advance(0)  # one packed record
    _acknowledge(driver, {p: 0})
    assert len(batches) == 1 and batches[0][0] is first and batches[0][1] is second
    assert acked == [None, None] and singles == []
    lone = Message("a/b", b"3", 1)
    bus.publish(topic, "a/b", lone, (), acked.append)
    reactor.advance(0)
    _acknowledge(driver, {p: 1})
    assert [s.value for s in singles] == [lone] and singles[0].offset == 1
    assert consumer.loop.commits == [(p, 1), (p, 2)]
    consumer.stop()
    assert topic not in bus._takers
    bus.publish(topic, "a/b", lone, (), acked.append)
    reactor.advance(0)
    assert type(driver.sent[0][4]) is not Own  # no member takes them any more


def _member_of_one_partition():
    """A started bus whose ``tbmq.msg.all`` member here hands the partition
    of the key ``a/b`` (``here``) and not that of ``there``.

    :returns: ``(driver, bus, reactor, topic, batches, here, there)``,
        ``batches`` the member's handed batches."""
    driver = FakeDriver()
    driver.LOCATES = True
    bus, reactor = started(driver)
    topic = bus.catalogue.msg_all
    batches = []
    consumer = KafkaConsumer(bus, topic, "g", lambda record: None, bus._codec(topic), 100, 1000,
                             batch_handler=batches.append)
    consumer.loop = FakeLoop()
    assert consumer.hand_own()
    here = crc32(b"a/b") % CONFIG.partitions
    names = [f"t/{i}" for i in range(50)]
    there = next(n for n in names if crc32(n.encode()) % CONFIG.partitions != here)
    consumer._assigned([here], {here: 0})
    return driver, bus, reactor, topic, batches, here, there


def test_the_bus_keeps_own_records_only_for_a_partition_a_member_here_hands():
    """A packed record of the publishes to a partition another node routes
    keeps nothing of them (no ``Own`` per publish, no unit: the other node
    fetches it); one of a partition handed here carries them as one unit
    for the member, and so does a ``publish_many`` to it (each record
    published as by ``publish``)."""
    driver, bus, reactor, topic, batches, here, there = _member_of_one_partition()
    acked = []
    for name in ("a/b", there, "a/b", there):
        bus.publish(topic, name, Message(name, b"x", 1), (), acked.append)
    reactor.advance(0)
    fanouts = {partition: sent[4] for sent, partition in zip(driver.sent, driver.partitions)}
    other = fanouts[crc32(there.encode()) % CONFIG.partitions]
    assert other.items is None and not other.located
    assert all(type(done) is not Own for done in other.dones)
    mine_ = fanouts[here]
    assert [item[0] for item in mine_.items] == ["a/b", "a/b"] and mine_.located
    _acknowledge(driver, {p: 0 for p in range(CONFIG.partitions)})
    assert acked == [None] * 4 and len(batches) == 1
    assert [m.payload for m in batches[0]] == [b"x", b"x"]
    bus.publish(topic, "a/b", Message("a/b", b"y", 1), (), acked.append)
    bus.publish_many(topic, ["a/b"], [Message("a/b", b"z", 1)], acked.append)
    reactor.advance(0)
    # a publish_many to a topic a member here takes goes as publish does: kept, handed
    assert [item[0] for item in driver.sent[0][4].items] == ["a/b", "a/b"]
    _acknowledge(driver, {here: 1})
    assert len(batches) == 2 and [m.payload for m in batches[1]] == [b"y", b"z"]
    assert acked == [None] * 6


def test_a_publish_many_run_is_kept_whole_in_its_unit_with_one_outcome():
    """A run of one publisher's messages (``publish_many`` to a topic a
    member here takes) goes to the packer in one call per partition: its
    values are handed on acknowledgement as the very objects published, in
    order, after a record published before it; records of a partition
    another node routes keep nothing; ``done`` is called once, after every
    Kafka record carrying some of them was acknowledged."""
    driver, bus, reactor, topic, batches, here, there = _member_of_one_partition()
    acked = []
    bus.publish(topic, "a/b", Message("a/b", b"0", 1), (), acked.append)
    run = [Message("a/b", b"1", 1), Message("a/b", b"2", 1)]
    bus.publish_many(topic, ["a/b", "a/b"], run, acked.append)
    mixed = [Message("a/b", b"3", 1), Message(there, b"4", 1)]
    bus.publish_many(topic, ["a/b", there], mixed, acked.append)
    reactor.advance(0)
    assert len(driver.sent) == 2  # one packed record per partition
    fanouts = {partition: sent[4] for sent, partition in zip(driver.sent, driver.partitions)}
    other = fanouts[crc32(there.encode()) % CONFIG.partitions]
    assert type(other) is not Own and not getattr(other, "located", False)  # a lone record
    assert [item[1].payload for item in fanouts[here].items] == [b"0", b"1", b"2", b"3"]
    assert acked == []
    _acknowledge(driver, {p: 0 for p in range(CONFIG.partitions)})
    assert len(batches) == 1
    assert batches[0][1] is run[0] and batches[0][2] is run[1] and batches[0][3] is mixed[0]
    assert acked == [None, None, None]


def test_a_packed_record_of_a_partition_no_member_here_hands_is_not_offered():
    """Another node routes the partition: its acknowledgement builds no unit
    and asks no member to take it (half of a two-node cluster's publishes)."""
    from tbmq_plugins.kafka.own import hand_packed

    class Member:
        def __init__(self, partitions) -> None:
            self.partitions, self.taken = partitions, []

        def hands(self, partition) -> bool:
            return partition in self.partitions

        def take_own(self, partition, offset, items) -> None:
            self.taken.append((partition, offset, [item[1] for item in items]))

    elsewhere, here = Member({1}), Member({0})
    dones = [Own(lambda outcome: None, [elsewhere], "k", v, ()) for v in ("v1", "v2")]
    hand_packed(dones, 2, (0, 7))
    assert elsewhere.taken == []
    dones = [Own(lambda outcome: None, [elsewhere, here], "k", v, ()) for v in ("v1", "v2")]
    hand_packed(dones, 2, (0, 7))
    assert here.taken == [(0, 7, ["v1", "v2"])]
    hand_packed(dones[:1] + [lambda outcome: None], 2, (0, 8))  # not all this node's: fetched
    assert here.taken == [(0, 7, ["v1", "v2"])]


def test_a_driver_that_does_not_say_where_keeps_the_fetch():
    driver = FakeDriver()  # no LOCATES: kafka-python's case
    bus, reactor = started(driver)
    topic = bus.catalogue.msg_all
    consumer = KafkaConsumer(bus, topic, "g", lambda record: None, bus._codec(topic), 100, 1000)
    consumer.loop = FakeLoop()
    assert not consumer.hand_own()
    bus.publish(topic, "a/b", Message("a/b", b"1", 1), (), lambda outcome: None)
    reactor.advance(0)
    assert type(driver.sent[0][4]) is not Own


def test_a_compacted_topic_hands_its_own_lone_records_too():
    """The session registry's ``tbmq.client.session`` (compacted, not
    packed: one Kafka record per session record) takes part: a record
    acknowledged at the head of its partition is handed at once as
    published, and skipped undecoded when the fetch brings it."""
    driver = FakeDriver()
    driver.LOCATES = True
    bus, reactor = started(driver)
    topic = bus.catalogue.client_session
    got = []
    consumer = KafkaConsumer(bus, topic, "g", got.append, bus._codec(topic), 100, 1000)
    consumer.loop = FakeLoop()
    assert consumer.hand_own()
    consumer._assigned([2], {2: 5})
    info = r.SessionInfo("c", "node-a", "s1", True, False, ClientType.DEVICE, 0, 5, 0.0, None,
                         0.0)
    outcomes = []
    bus.publish(topic, "c", info, (), outcomes.append)
    reactor.advance(0)
    assert type(driver.sent[0][4]) is Own
    driver.partitions[0] = 2  # where the producer's partitioner put it
    _acknowledge(driver, {2: 5})
    assert len(got) == 1 and got[0].value is info and (got[0].partition, got[0].offset) == (2, 5)
    assert outcomes == [None]
    consumer._batch([RawRecord(2, 5, b"c", b"not decoded", ())], [], {})
    assert len(got) == 1 and consumer.loop.commits == [(2, 6)]
