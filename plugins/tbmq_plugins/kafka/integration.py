"""The ``kafka`` integration's target: each message becomes one record of
a Kafka topic, produced with the client library of the cluster's bus
(``kafka.driver``, through :mod:`.drivers`), whose threads do the
blocking work; the reactor only queues records and reads the outcomes.

A record is acknowledged when the producer reports it delivered (with the
``acks`` of ``kafka.acks``); a record Kafka will never take (too large)
refuses the message for good; any other error is retried by the
integration.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from twisted.internet import defer, threads
from twisted.logger import Logger

from tbmq.integrations.core import Rejected, Target
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.mqtt import Property

from .drivers import TopicSpec, load_driver

__all__ = ["KafkaTarget", "headers_of", "key_of"]

log = Logger(observer=LOG_OBSERVER)

#: parts of a producer error's text that mean the record is never taken
NEVER_TAKEN = ("MSG_SIZE_TOO_LARGE", "MessageSizeTooLarge", "RecordTooLarge",
               "INVALID_RECORD", "InvalidRecord")


class NotReady(Exception):
    """The producer is not built yet (the first connection)."""


def key_of(message, key: str) -> bytes:
    """The record key: the MQTT topic name (``key: topic``) or the
    publisher's client id (``key: client_id``), UTF-8."""
    return (message.topic if key == "topic" else message.publisher).encode("utf-8")


def headers_of(message) -> tuple:
    """The record headers: the message's MQTT 5 user properties, in order,
    ``((name, value bytes), ...)``."""
    return tuple((name, value.encode("utf-8"))
                 for name, value in message.properties.get(Property.USER_PROPERTY, ()))


class _Outcomes:
    """The driver's ack batcher: ``put(done, error)`` from the client's
    thread, handed to the reactor."""

    def __init__(self, reactor) -> None:
        self.reactor = reactor

    def put(self, done: defer.Deferred, error: Any) -> None:
        self.reactor.callFromThread(self._fire, done, error)

    @staticmethod
    def _fire(done: defer.Deferred, error: Any) -> None:
        if done.called:
            return  # timed out and abandoned already
        if error is None:
            done.callback(None)
        elif any(part in str(error) for part in NEVER_TAKEN):
            done.errback(Rejected(f"Kafka refused the record: {error}"))
        else:
            done.errback(ConnectionError(f"Kafka: {error}"))


class KafkaTarget(Target):
    """Produces each message to ``topic``: key as :func:`key_of`, value the
    payload, headers as :func:`headers_of`.

    :param config: the :class:`~tbmq.integrations.settings.IntegrationConfig`
        (``bootstrap_servers``, ``topic``, ``key``).
    :param reactor: the reactor.
    :param kafka: the node's :class:`tbmq.config.KafkaConfig`: the driver,
        ``acks``, timeouts, and the bootstrap servers when the integration
        names none.
    """

    def __init__(self, config, reactor, kafka) -> None:
        super().__init__(config, reactor)
        # the producer gives a record up (and reports it failed) a little
        # before the integration's timeout abandons it, so a record is not
        # both sent again and still queued in the client
        self.kafka = dataclasses.replace(
            kafka, bootstrap_servers=config.bootstrap_servers or kafka.bootstrap_servers,
            request_timeout_ms=max(1000, int(config.timeout * 800) - kafka.linger_ms))
        self.driver = load_driver(self.kafka.driver)
        self.producer = None
        self._starting = None
        self._stopped = False

    def start(self) -> None:
        self._connect()

    def _connect(self) -> None:
        if self._starting is not None or self._stopped:
            return
        self._starting = threads.deferToThread(self._build)
        self._starting.addCallbacks(self._built, self._not_built)

    def _build(self):
        """In a thread: create the topic (one that exists is fine), then the
        producer."""
        admin = self.driver.Admin(self.kafka)
        try:
            admin.create_topics([TopicSpec(self.config.topic, self.kafka.partitions,
                                           self.kafka.replication_factor)])
        finally:
            admin.close()
        return self.driver.Producer(self.kafka, _Outcomes(self.reactor))

    def _built(self, producer) -> None:
        self._starting = None
        if self._stopped:
            threads.deferToThread(producer.close, 1.0)
            return
        self.producer = producer
        log.info("integration {name}: producing to {topic} on {servers}",
                 name=self.config.name, topic=self.config.topic,
                 servers=self.kafka.bootstrap_servers)
        self.ready()

    def _not_built(self, failure) -> None:
        self._starting = None
        log.warn("integration {name}: no Kafka producer on {servers} yet: {error}",
                 name=self.config.name, servers=self.kafka.bootstrap_servers,
                 error=failure.getErrorMessage())

    def send(self, message):
        if self.producer is None:
            self._connect()
            raise NotReady(f"no Kafka producer on {self.kafka.bootstrap_servers} yet")
        done = defer.Deferred()
        self.producer.send(self.config.topic, key_of(message, self.config.key),
                           message.payload, headers_of(message), done)
        return done

    def stop(self):
        self._stopped = True
        producer, self.producer = self.producer, None
        if producer is None:
            return None
        return threads.deferToThread(producer.close, 2.0)
