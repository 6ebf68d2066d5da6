"""Holes in a partition's offsets (tbmq_plugins.kafka.order): found, read
again, and passed once they stayed for the wait; on compacted topics only
after a young record.  The last test runs on the run's Tansu."""

from __future__ import annotations

import time

import pytest

from tbmq.cluster.topics import TopicCatalogue
from tbmq.config import KafkaConfig
from tbmq_plugins.kafka import order
from tbmq_plugins.kafka.bus import topic_spec
from tbmq_plugins.kafka.drivers import RawRecord, load_driver
from tbmq_plugins.kafka.order import Gaps


def recs(p, offsets):
    return [RawRecord(p, o, None, b"v", ()) for o in offsets]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_records_in_order_pass_and_a_hole_cuts_its_partition_only():
    gaps = Gaps("t", wait=5.0, clock=Clock())
    kept, again = gaps.filter(recs(0, [3, 4]) + recs(1, [7, 9, 10]), {0: 3, 1: 7})
    assert [(r.partition, r.offset) for r in kept] == [(0, 3), (0, 4), (1, 7)]
    assert again == {1: 8}
    assert gaps.refetches == 1


def test_a_partition_without_an_expected_offset_starts_at_its_first_record():
    gaps = Gaps("t", clock=Clock())
    kept, again = gaps.filter(recs(2, [5, 6]), {})
    assert [r.offset for r in kept] == [5, 6] and again == {}
    kept, again = gaps.filter(recs(3, [5, 9]), {})  # a hole within one fetch
    assert [r.offset for r in kept] == [5] and again == {3: 6}


def test_a_hole_that_stays_for_the_wait_is_passed_and_one_filled_is_forgotten():
    clock = Clock()
    gaps = Gaps("t", wait=5.0, clock=clock)
    assert gaps.filter(recs(0, [12]), {0: 10})[1] == {0: 10}
    clock.now += 4.9
    assert gaps.filter(recs(0, [12]), {0: 10})[1] == {0: 10}  # still read again
    clock.now += 0.2
    kept, again = gaps.filter(recs(0, [12, 13]), {0: 10})  # 5.1 s: passed
    assert [r.offset for r in kept] == [12, 13] and again == {}
    # a new hole starts its own wait; filling it forgets it
    assert gaps.filter(recs(0, [20]), {0: 14})[1] == {0: 14}
    clock.now += 10.0
    assert gaps.filter(recs(0, [14, 15]), {0: 14}) == (recs(0, [14, 15]), {})
    assert gaps.filter(recs(0, [17]), {0: 16})[1] == {0: 16}  # a fresh wait, not passed


def test_forgotten_partitions_start_a_fresh_wait():
    clock = Clock()
    gaps = Gaps("t", wait=1.0, clock=clock)
    gaps.filter(recs(0, [5]), {0: 3})
    clock.now += 2.0
    gaps.forget([0])
    assert gaps.filter(recs(0, [5]), {0: 3})[1] == {0: 3}


# -- compacted topics: only a hole after a young record is read again ------------------

LAG_MS = 60000  # min.compaction.lag.ms


def stamped(p, offsets, stamp):
    return [RawRecord(p, o, None, b"v", (), stamp) for o in offsets]


class Log:
    """Stands for order.log: what was logged, by level."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def debug(self, fmt, **kw):
        self.lines.append(("debug", fmt))

    def warn(self, fmt, **kw):
        self.lines.append(("warn", fmt))


def compacted(monkeypatch, clock):
    log = Log()
    monkeypatch.setattr(order, "log", log)
    wall = Clock()
    wall.now = 1_800_000_000.0
    return Gaps("t", wait=5.0, clock=clock, compaction_lag_ms=LAG_MS, wall=wall), wall, log


def test_a_hole_after_a_young_record_of_a_compacted_topic_is_read_again(monkeypatch):
    """Written less than half min.compaction.lag.ms ago: what follows it
    cannot have been compacted, so a hole is Tansu's, read again (a session
    or subscription record skipped would stop this node's routing)."""
    clock = Clock()
    gaps, wall, log = compacted(monkeypatch, clock)
    young = int(wall.now * 1000) - LAG_MS // 2 + 1000  # 29 s old
    kept, again = gaps.filter(stamped(0, [10, 11], young) + stamped(0, [14], young), {0: 10})
    assert [r.offset for r in kept] == [10, 11] and again == {0: 12}
    assert gaps.refetches == 1
    # the next poll (the hole read again) finds it filled
    kept, again = gaps.filter(stamped(0, [12, 13, 14], young), {0: 12})
    assert [r.offset for r in kept] == [12, 13, 14] and again == {}
    # a hole after a young record in a later poll: read again, the warning after the wait
    assert gaps.filter(stamped(0, [17], young), {0: 15})[1] == {0: 15}
    clock.now += 5.1
    assert [r.offset for r in gaps.filter(stamped(0, [17], young), {0: 15})[0]] == [17]
    assert [level for level, _ in log.lines].count("warn") == 1


def test_a_hole_after_an_old_record_of_a_compacted_topic_is_passed_at_once(monkeypatch):
    """Older than half the lag: compaction may have removed what follows, so
    the hole is passed at once, without a wait, a read again or a warning."""
    clock = Clock()
    gaps, wall, log = compacted(monkeypatch, clock)
    old = int(wall.now * 1000) - LAG_MS // 2 - 1000  # 31 s old
    young = int(wall.now * 1000)
    kept, again = gaps.filter(stamped(0, [10], old) + stamped(0, [14, 15], young), {0: 10})
    assert [r.offset for r in kept] == [10, 14, 15] and again == {}
    # the same record grown old between two polls: its hole is passed too
    gaps.filter(stamped(1, [3], young), {1: 3})
    wall.now += LAG_MS / 2000 + 1
    assert [r.offset for r in gaps.filter(stamped(1, [9], young), {1: 4})[0]] == [9]
    assert gaps.refetches == 0 and log.lines == []


def test_a_compacted_partitions_first_hole_and_one_after_no_timestamp_are_passed(monkeypatch):
    """Nothing handed over since the partition (re)started, or a record
    without a timestamp: nothing says the missing records are young."""
    clock = Clock()
    gaps, wall, log = compacted(monkeypatch, clock)
    young = int(wall.now * 1000)
    assert gaps.filter(stamped(0, [7], young), {0: 3}) == (stamped(0, [7], young), {})
    assert gaps.filter(stamped(1, [4], None) + stamped(1, [6], young), {1: 4})[1] == {}
    gaps.filter(stamped(2, [1], young), {2: 1})
    gaps.forget([2])  # read from elsewhere: its last record is not known any more
    assert gaps.filter(stamped(2, [5], young), {2: 2})[1] == {}
    assert gaps.refetches == 0 and log.lines == []


# -- on Tansu: what the check needs from the broker and the drivers --------------------

@pytest.mark.parametrize("driver", ["confluent", "kafka-python"])
def test_on_tansu_a_compacted_topic_keeps_its_lag_and_records_carry_their_timestamp(
        driver, kafka_bootstrap):
    """The topic is created as the bus creates it (``topic_spec``) and Tansu
    keeps its ``min.compaction.lag.ms``; each driver gives the records read
    their timestamp (ms), which the check of compacted topics reads."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, ConfigResource

    config = KafkaConfig(bootstrap_servers=kafka_bootstrap, driver=driver,
                         topic_prefix=f"order-{driver}.", partitions=1)
    catalogue = TopicCatalogue(config.topic_prefix)
    topic = catalogue.client_session
    module = load_driver(driver)
    admin = module.Admin(config)
    try:
        admin.create_topics([topic_spec(config, catalogue, topic)])
    finally:
        admin.close()
    describer = AdminClient({"bootstrap.servers": kafka_bootstrap})
    described = describer.describe_configs([ConfigResource("topic", topic)])
    found = {n: e.value for n, e in next(iter(described.values())).result(10).items()}
    assert (found["cleanup.policy"], found["min.compaction.lag.ms"]) == ("compact", "60000")
    before = time.time() * 1000
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, b"v", b"k", partition=0)
    assert producer.flush(10) == 0
    client = module.SharedClient(config, f"order-{driver}")
    try:
        client.add({(topic, 0): 0})
        got: list = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = client.poll(0.2, 10, set())[0].get(topic, [])
    finally:
        client.close()
    assert [(r.offset, r.value) for r in got] == [(0, b"v")]
    assert before - 5000 <= got[0].timestamp <= time.time() * 1000 + 5000
