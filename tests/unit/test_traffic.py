"""The node's traffic totals (tbmq.broker.traffic): what the session and the
outbox count per PUBLISH, and the latency histogram kept only where the
HTTP listener can read it."""

from __future__ import annotations

from tbmq.mqtt import Publish, Subscribe
from tbmq.mqtt.packets import SubscriptionRequest

from tests.helpers import Harness


def _one_delivery(harness: Harness) -> None:
    sub = harness.client("sub")
    sub.send(Subscribe(packet_id=1, subscriptions=[SubscriptionRequest("t/#", 1)]))
    sub.received()
    pub = harness.client("pub")
    pub.send(Publish(topic="t/1", payload=b"abc", qos=0))
    assert [type(p).__name__ for p in sub.received()] == ["Publish"]


def test_without_an_http_listener_the_latency_histogram_is_not_kept():
    harness = Harness()
    _one_delivery(harness)
    traffic = harness.broker.traffic
    assert traffic.observe_latency is False
    assert traffic.received == [1, 0, 0] and traffic.received_bytes == [3, 0, 0]
    # payload bytes both ways: the same three bytes in and out
    assert traffic.sent[0] == 1 and traffic.sent_bytes == [3, 0, 0]
    assert sum(traffic.latency) == 0 and traffic.latency_sum == 0.0
    assert "observe_latency" not in traffic.snapshot()


def test_with_an_http_listener_every_delivery_is_observed():
    harness = Harness({"http": {"endpoint": "tcp:0:interface=127.0.0.1"}})
    _one_delivery(harness)
    traffic = harness.broker.traffic
    assert traffic.observe_latency is True
    assert traffic.sent[0] == 1
    assert sum(traffic.latency) == 1  # the fake clock stood still: the first bucket
    assert traffic.latency[0] == 1 and traffic.latency_sum == 0.0
