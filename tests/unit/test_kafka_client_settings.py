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
