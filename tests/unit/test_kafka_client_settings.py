"""The consumer settings each Kafka driver gives its client
(tbmq_plugins.kafka.confluent, tbmq_plugins.kafka.kafka_python): the
fetch wait and ``kafka.fetch_min_bytes`` reach the client as its own keys."""

from __future__ import annotations

from tbmq.config import load_config
from tbmq_plugins.kafka import confluent, kafka_python

KAFKA = load_config(environ={"TBMQ_KAFKA__FETCH_MIN_BYTES": "4096",
                             "TBMQ_KAFKA__FETCH_MAX_WAIT_MS": "50"}).kafka


def test_librdkafka_gets_fetch_min_bytes_and_the_fetch_wait():
    settings = confluent._consumer_config(KAFKA, "g", lambda error: None)
    assert settings["fetch.min.bytes"] == 4096 and settings["fetch.wait.max.ms"] == 50
    default = confluent._consumer_config(load_config(environ={}).kafka, "g", lambda e: None)
    assert default["fetch.min.bytes"] == 1


def test_kafka_python_gets_fetch_min_bytes_and_the_fetch_wait(monkeypatch):
    made = {}
    monkeypatch.setattr(kafka_python, "KafkaConsumer", lambda **kwargs: made.update(kwargs))
    kafka_python._consumer(KAFKA, "g")
    assert made["fetch_min_bytes"] == 4096 and made["fetch_max_wait_ms"] == 50


def test_librdkafka_statistics_only_when_asked_and_logged_per_broker():
    """``kafka.statistics_interval_ms``: off by default; on, the producer
    and each consumer get librdkafka's ``statistics.interval.ms`` and a
    ``stats_cb`` that logs one line per broker that answered."""
    import json  # noqa: PLC0415

    from twisted.logger import formatEvent, globalLogPublisher  # noqa: PLC0415

    assert "stats_cb" not in confluent._consumer_config(KAFKA, "g", lambda e: None)
    on = load_config(environ={"TBMQ_KAFKA__STATISTICS_INTERVAL_MS": "2000"}).kafka
    settings = confluent._consumer_config(on, "tbmq-node-a", lambda e: None)
    assert settings["statistics.interval.ms"] == 2000
    stats = settings["stats_cb"]
    assert stats.client == "tbmq-node-a"
    assert "stats_cb" not in confluent._common(on)  # the admin client: none
    seen: list = []
    globalLogPublisher.addObserver(seen.append)
    try:
        stats(json.dumps({"brokers": {
            "bootstrap": {"nodeid": -1, "rtt": {"cnt": 4, "p50": 1, "p99": 1}},
            "idle": {"nodeid": 2, "name": "h:2/2", "rtt": {"cnt": 0}},
            "used": {"nodeid": 1, "name": "h:1/1", "rtt": {"cnt": 7, "p50": 1500, "p99": 4250},
                     "int_latency": {"cnt": 7, "p50": 1200, "p99": 2000},
                     "outbuf_latency": {"cnt": 7, "p50": 300, "p99": 900}}}}))
        stats("not json")
    finally:
        globalLogPublisher.removeObserver(seen.append)
    lines = [formatEvent(e) for e in seen if "Kafka client" in (e.get("log_format") or "")]
    assert lines == ["Kafka client tbmq-node-a, broker h:1/1: rtt 1.50/4.25 queue 1.20/2.00 "
                     "behind 0.30/0.90 ms (p50/p99), n 7"]
