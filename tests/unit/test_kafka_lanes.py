"""The confluent driver's producer lanes, on a real (private) Tansu: each
partition goes through one lane (a producer connection of its own, one
request in flight), a topic's consecutive partitions through different
lanes, so the batches of several partitions are under way together while
each partition keeps the order records were sent in."""

from __future__ import annotations

import threading
import time

import pytest

from tbmq.config import KafkaConfig
from tbmq_plugins.kafka.drivers import TopicSpec
from tests.kafka import Tansu

confluent = pytest.importorskip("tbmq_plugins.kafka.confluent")


@pytest.fixture(scope="module")
def tansu():
    server = Tansu()
    server.start()
    yield server
    server.close()


class Acks:
    """What the driver reports: ``(done, error)`` pairs, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list = []

    def put(self, done, error=None) -> None:
        with self.lock:
            self.items.append((done, error))


def test_partitions_go_through_lanes_of_their_own_and_keep_their_order(tansu):
    config = KafkaConfig(bootstrap_servers=tansu.bootstrap, linger_ms=1,
                         request_timeout_ms=5000)
    topic = "lanes.t"
    admin = confluent.Admin(config)
    admin.create_topics([TopicSpec(topic, 4, 1)])
    admin.close()
    acks = Acks()
    producer = confluent.Producer(config, acks)
    try:
        assert producer.prepare(topic) == 4
        lanes = [producer.lane(topic, p) for p in range(4)]
        # consecutive partitions, different lanes; a partition, always the same one
        assert len({id(lane) for lane in lanes[:confluent.PRODUCER_LANES]}) == \
            confluent.PRODUCER_LANES > 1
        assert all(producer.lane(topic, p) is lanes[p] for p in range(4))
        assert producer.lane(topic, None) is producer.lane(topic, None)
        sent = 400
        for n in range(sent):  # interleaved over the partitions
            producer.send(topic, b"k%d" % n, b"%d" % n, (), ("placed", n), n % 4)
        for n in range(sent):
            producer.send(topic, b"key", b"%d" % n, (), ("keyed", n))
        deadline = time.monotonic() + 20
        while len(acks.items) < 2 * sent and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(done for done, error in acks.items if error is None) == sorted(
            [("placed", n) for n in range(sent)] + [("keyed", n) for n in range(sent)])
    finally:
        producer.close(5)
    client = confluent.SharedClient(config, "lanes-reader")
    try:
        client.add({(topic, p): 0 for p in range(4)})
        read: dict = {}
        deadline = time.monotonic() + 20
        while sum(len(v) for v in read.values()) < 2 * sent and time.monotonic() < deadline:
            records, _ = client.poll(0.2, 1000, set())
            for record in records.get(topic, ()):
                read.setdefault(record.partition, []).append(record)
    finally:
        client.close()
    for partition, records in read.items():
        placed = [int(r.value) for r in records if r.key != b"key"]
        assert placed == sorted(placed) and all(n % 4 == partition for n in placed)
        keyed = [int(r.value) for r in records if r.key == b"key"]
        assert keyed in ([], list(range(sent)))  # one key, one partition, in order
    assert sum(len(v) for v in read.values()) == 2 * sent
