"""The Kafka bus when Kafka goes away, on a real (private) Tansu that the
tests stop and start again on the same port: publishes fail with
BusPublishError within ``kafka.request_timeout_ms`` and work again when it
is back; consumers resume by themselves; a start without Kafka fails with a
BusError within the request timeout.  Both drivers."""

from __future__ import annotations

import time

import pytest
from twisted.internet import defer

from tbmq.config import KafkaConfig
from tbmq.errors import BusError, BusPublishError
from tbmq_plugins.kafka.bus import KafkaBus, topic_spec
from tests.kafka import Tansu, free_port

DRIVERS = ["kafka-python", "confluent"]
#: the request timeout of these tests, ms
TIMEOUT_MS = 2000


@pytest.fixture
def tansu():
    """A Tansu of this test's own, which it may stop and start."""
    server = Tansu()
    server.start()
    yield server
    server.close()


def config(bootstrap: str, driver: str) -> KafkaConfig:
    # 4 partitions: what Tansu gives a topic it creates by itself
    return KafkaConfig(bootstrap_servers=bootstrap, driver=driver, topic_prefix="outage.",
                       partitions=4, linger_ms=2, fetch_max_wait_ms=10,
                       request_timeout_ms=TIMEOUT_MS, session_timeout_ms=3000,
                       heartbeat_interval_ms=500)


def wait_until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


@pytest.mark.parametrize("driver", DRIVERS)
def test_publish_fails_in_an_outage_and_works_again_after_it(driver, tansu, reactor_thread):
    rt = reactor_thread
    bus = KafkaBus(config(tansu.bootstrap, driver), clock=rt.reactor)
    rt.call(bus.start)
    topic = bus.catalogue.events
    got: list = []
    consumer = rt.call(lambda: [bus.subscribe(topic, "g", got.append, exclusive=True)])[0]
    try:
        wait_until(lambda: rt.call(lambda: consumer.positioned), 20)
        rt.call(bus.publish, topic, "k", b"before")
        wait_until(lambda: [rec.value for rec in got] == [b"before"], 10)

        tansu.stop()
        started = time.monotonic()
        with pytest.raises(BusPublishError):
            rt.call(bus.publish, topic, "k", b"lost")
        elapsed = time.monotonic() - started
        assert TIMEOUT_MS / 1000 * 0.75 <= elapsed <= TIMEOUT_MS / 1000 + 3

        tansu.start()  # the same port; Tansu forgot everything, Kafka would not
        settings = config(tansu.bootstrap, driver)
        bus.driver.Admin(settings).create_topics([topic_spec(settings, bus.catalogue, topic)])
        deadline = time.monotonic() + 30
        while True:
            try:
                rt.call(bus.publish, topic, "k", b"refill")
                break
            except BusPublishError:
                assert time.monotonic() < deadline, "publishes still fail after the restart"
        # offsets start again at 0 on the empty Tansu: "refill" takes the
        # offset of "before", which the consumer has read; "after" is new
        rt.call(bus.publish, topic, "k", b"after")
        wait_until(lambda: b"after" in [rec.value for rec in got], 30)  # by itself
        assert b"lost" not in [rec.value for rec in got]
    finally:
        rt.call(bus.stop)


@pytest.mark.parametrize("driver", DRIVERS)
def test_start_fails_with_a_bus_error_when_no_broker_answers(driver, reactor_thread):
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    bus = KafkaBus(config(bootstrap, driver), clock=reactor_thread.reactor)
    started = time.monotonic()
    with pytest.raises(BusError) as info:
        reactor_thread.call(bus.start)
    assert time.monotonic() - started < TIMEOUT_MS / 1000 + 5
    assert bootstrap in str(info.value) and "cannot start the bus" in str(info.value)
    assert not bus.running
    d = reactor_thread.call(lambda: [bus.publish(bus.catalogue.events, "k", b"x")])[0]
    assert isinstance(d, defer.Deferred)
    failures: list = []
    reactor_thread.call(lambda: d.addErrback(failures.append))
    assert failures and failures[0].check(BusError)
