"""The ``confluent`` driver (``kafka.driver: confluent``, the default;
``pip install 'tbmq[kafka]'``): confluent-kafka on librdkafka, about ten
times kafka-python's throughput.

* The producer's :meth:`~confluent_kafka.Producer.produce` is thread-safe
  and never blocks; delivery callbacks are served by
  :meth:`~confluent_kafka.Producer.poll`, which a thread of the driver calls
  in a loop, and go to the :class:`~.bridge.AckBatcher`.  The partitioner is
  ``murmur2_random``, Java's (and kafka-python's), so both drivers put a key
  on the same partition.  Idempotence is off and one request is in flight
  per connection, as in the other driver.
* A :class:`~confluent_kafka.Consumer` must not be polled from several
  threads: one consumer thread owns each (:class:`~.loop.SharedLoop`, for
  a :class:`SharedClient` over several topics).
  ``enable.partition.eof`` tells when a partition is read to its end; the
  high watermark cached from the last fetch gives the end otherwise.
* librdkafka's log lines go to the Twisted log at debug level; the bus
  logs the state changes that matter itself.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable

from confluent_kafka import (Consumer, ConsumerGroupTopicPartitions, KafkaError,
                             KafkaException, TopicPartition)
from confluent_kafka import Producer as _Producer
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from twisted.logger import Logger

from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq_plugins.kafka import drivers
from tbmq_plugins.kafka.describe import assemble, state_name
from tbmq_plugins.kafka.drivers import RawRecord, TopicSpec

__all__ = ["LOCATES", "Admin", "Producer", "SharedClient", "Statistics"]

#: The producer tells where an acknowledged record landed (a ``done`` whose
#: ``located`` is True gets ``where``): the bus may hand this node's records
#: to its own members on acknowledgement (:mod:`.own`).
LOCATES = True

log = Logger(observer=LOG_OBSERVER)

#: Seconds between two calls of the producer's poll (serves delivery callbacks).
PRODUCER_POLL = 0.05
#: Seconds a resume waits at most for the metadata request that wakes the fetcher.
WAKE_TIMEOUT = 1.0
#: Most milliseconds between two reconnection attempts to a broker.
RECONNECT_BACKOFF_MAX_MS = 1000


class _LibrdkafkaLog:
    """librdkafka's log lines, to the Twisted log at debug level."""

    def log(self, level: int, fmt: str, *args: Any) -> None:
        log.debug("librdkafka: {line}", line=fmt % args if args else fmt)


_LOG = _LibrdkafkaLog()

#: librdkafka's windows of one broker that :class:`Statistics` logs (µs).
WINDOWS = (("rtt", "rtt"), ("queue", "int_latency"), ("behind", "outbuf_latency"))


class Statistics:
    """librdkafka's ``stats_cb`` (``kafka.statistics_interval_ms``): once
    per interval, one info log line per broker a client talked to, with
    the p50 and p99 in milliseconds of librdkafka's windows since the
    previous line: ``rtt`` (request to answer; for a consumer's fetch it
    includes the fetch wait), ``queue`` (a record's time in the
    producer's queue before its request, ``linger.ms`` included) and
    ``behind`` (a request's wait for the one in flight on its
    connection), and ``n``, the requests answered.  Called in a thread of
    librdkafka's client (a poll); it blocks nothing.

    :param client: ``"producer"`` or the consumer's group id, in each line.
    """

    def __init__(self, client: str) -> None:
        self.client = client

    def __call__(self, text: str) -> None:
        try:
            brokers = json.loads(text)["brokers"].values()
        except (ValueError, KeyError, AttributeError, TypeError):
            return  # not librdkafka's statistics: nothing to say
        for broker in brokers:
            if broker.get("nodeid", -1) < 0 or not broker.get("rtt", {}).get("cnt"):
                continue  # the bootstrap entry, or nothing answered in the window
            figures = " ".join(
                f"{name} {window.get('p50', 0) / 1000:.2f}/{window.get('p99', 0) / 1000:.2f}"
                for name, window in ((n, broker.get(key) or {}) for n, key in WINDOWS))
            log.info("Kafka client {client}, broker {broker}: {figures} ms (p50/p99), "
                     "n {n}", client=self.client, broker=broker.get("name"),
                     figures=figures, n=broker["rtt"]["cnt"])


def _common(config: Any, client: str | None = None) -> dict:
    """librdkafka's settings of every client; ``client`` (a producer's or
    a consumer's name) adds its statistics when
    ``kafka.statistics_interval_ms`` asks for them."""
    statistics = {}
    if client is not None and config.statistics_interval_ms > 0:
        statistics = {"statistics.interval.ms": config.statistics_interval_ms,
                      "stats_cb": Statistics(client)}
    return {
        **statistics,
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": "tbmq",
        "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
        # a request goes out at once, not after the previous one's TCP
        # acknowledgement (Nagle): kafka-python sets TCP_NODELAY too
        "socket.nagle.disable": True,
        "socket.timeout.ms": config.request_timeout_ms,
        "logger": _LOG,
    }


def _consumer_config(config: Any, group: str, on_error: Callable) -> dict:
    return {
        **_common(config, group),
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": config.fetch_max_wait_ms,
        "fetch.min.bytes": config.fetch_min_bytes,
        "session.timeout.ms": config.session_timeout_ms,
        "heartbeat.interval.ms": config.heartbeat_interval_ms,
        "enable.partition.eof": True,
        "error_cb": on_error,
    }


class Admin(drivers.Admin):
    """:class:`confluent_kafka.admin.AdminClient`."""

    def __init__(self, config: Any) -> None:
        self._timeout = config.request_timeout_ms / 1000.0
        self._client = AdminClient(_common(config))

    def create_topics(self, specs: list[TopicSpec]) -> None:
        topics = [NewTopic(s.name, s.partitions, s.replication_factor, config=dict(s.config))
                  for s in specs]
        self._wait(self._client.create_topics(topics, request_timeout=self._timeout,
                                              operation_timeout=self._timeout),
                   KafkaError.TOPIC_ALREADY_EXISTS)

    def _wait(self, futures: dict, fine: int) -> None:
        """Wait for the admin request's ``futures``; an error of code
        ``fine`` is no error.

        :raises KafkaException: any other error of a topic.
        """
        for future in futures.values():
            try:
                future.result(timeout=self._timeout * 2)
            except KafkaException as e:
                if e.args[0].code() != fine:
                    raise

    def delete_topics(self, names: list[str]) -> None:
        self._wait(self._client.delete_topics(names, request_timeout=self._timeout,
                                              operation_timeout=self._timeout),
                   KafkaError.UNKNOWN_TOPIC_OR_PART)

    def committed(self, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p)
                                                       for p in partitions])
        futures = self._client.list_consumer_group_offsets([request],
                                                           request_timeout=self._timeout)
        found = futures[group].result(timeout=self._timeout * 2)
        return {tp.partition: offset for tp, offset in _committed(found.topic_partitions)}

    def describe(self, topic_prefix: str, known_groups: list[str]) -> dict:
        client, timeout, errors = self._client, self._timeout, []
        topics = {name: sorted(t.partitions)
                  for name, t in client.list_topics(timeout=timeout).topics.items()}
        latest: dict = {}
        wanted = {TopicPartition(name, p): OffsetSpec.latest()
                  for name, parts in topics.items() if name.startswith(topic_prefix)
                  for p in parts}
        if wanted:
            futures = client.list_offsets(wanted, request_timeout=timeout)
            for tp, future in futures.items():
                try:
                    latest[(tp.topic, tp.partition)] = future.result(timeout=timeout * 2).offset
                except Exception as e:
                    errors.append(f"latest offset of {tp.topic}[{tp.partition}]: {e}")
        groups: dict = {g: {"state": None, "members": None} for g in known_groups}
        try:
            listed = client.list_consumer_groups(request_timeout=timeout).result(
                timeout=timeout * 2)
            for g in listed.valid:
                groups[g.group_id] = {"state": state_name(g.state), "members": None}
        except Exception as e:
            errors.append(f"consumer groups not listed: {e}")
        committed: dict = {}
        futures = {g: client.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(g)], request_timeout=timeout)[g] for g in groups}
        for g, future in futures.items():
            try:
                found = future.result(timeout=timeout * 2).topic_partitions or []
            except Exception as e:
                errors.append(f"offsets of group {g}: {e}")
                continue
            committed[g] = {(tp.topic, tp.partition): tp.offset for tp in found}
        if groups:
            try:
                described = client.describe_consumer_groups(list(groups),
                                                            request_timeout=timeout)
                for g, future in described.items():
                    d = future.result(timeout=timeout * 2)
                    groups[g] = {"state": state_name(d.state) or groups[g]["state"],
                                 "members": len(d.members)}
            except Exception as e:
                errors.append(f"consumer groups not described: {e}")
        return assemble(topic_prefix, known_groups, topics, latest, groups, committed, errors)

    def close(self) -> None:
        self._client = None


class Producer(drivers.Producer):
    """:class:`confluent_kafka.Producer` and the thread that polls it."""

    def __init__(self, config: Any, acks: Any) -> None:
        self._put = acks.put
        self._timeout = config.request_timeout_ms / 1000.0
        self._producer = _Producer({
            **_common(config, "producer"),
            "acks": config.acks,
            "linger.ms": config.linger_ms,
            "request.timeout.ms": config.request_timeout_ms,
            "message.timeout.ms": config.request_timeout_ms + config.linger_ms,
            "partitioner": "murmur2_random",
            "enable.idempotence": False,
            "max.in.flight.requests.per.connection": 1,
        })
        self._running = True
        self._thread = threading.Thread(target=self._poll, name="tbmq-kafka-producer-poll",
                                        daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        producer = self._producer
        while self._running:
            producer.poll(PRODUCER_POLL)

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: tuple,
             done: Any, partition: int | None = None) -> None:
        put = self._put

        def delivered(error, message) -> None:
            if error is None and getattr(done, "located", False):
                done.where = (message.partition(), message.offset())  # .own.Own, .packing.Fanout
            put(done, error)

        if partition is None:
            self._producer.produce(topic, value, key,
                                   headers=list(headers) if headers else None,
                                   on_delivery=delivered)
        else:
            self._producer.produce(topic, value, key, partition,
                                   headers=list(headers) if headers else None,
                                   on_delivery=delivered)

    def send_many(self, topic: str, keys: list, values: list, done: Any) -> None:
        """Each record produced with one delivery callback for all of them
        (:class:`~.drivers.Reports`: no closure per record, one outcome put)."""
        reports = drivers.Reports(self._put, done, len(keys))
        delivered = reports.delivered
        produce = self._producer.produce
        queued = 0
        try:
            for key, value in zip(keys, values):
                produce(topic, value, key, on_delivery=delivered)
                queued += 1
        except Exception as e:  # (BufferError: the queue is full) those left are refused
            reports.refused(len(keys) - queued, f"the producer refused the record: {e}")

    def prepare(self, topic: str) -> int:
        """``produce`` never blocks; the topic's partition count from its
        metadata."""
        found = self._producer.list_topics(topic, timeout=self._timeout).topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise KafkaException(found.error if found is not None else "no metadata")
        return len(found.partitions)

    def close(self, timeout: float) -> None:
        self._producer.flush(timeout)
        self._running = False
        self._thread.join(PRODUCER_POLL * 10)
        self._producer.poll(0)


def _committed(found: list) -> list:
    """``(TopicPartition, offset or None)`` of what ``Consumer.committed``
    returned: None where the group has no offset.

    :raises KafkaException: when the answer for a partition is an error
        (the group's coordinator loading or moving, a rebalance): "no
        offset" would start the partition at its end and skip what its last
        owner had not finished, so the caller asks again.
    """
    out = []
    for tp in found:
        if tp.error is not None:
            raise KafkaException(tp.error)
        out.append((tp, tp.offset if tp.offset >= 0 else None))
    return out


class _Errors:
    """What librdkafka reported without raising (``error_cb``), taken once."""

    _error: str | None

    def _on_error(self, error) -> None:
        self._error = str(error)

    def take_error(self) -> str | None:
        error, self._error = self._error, None
        return error


class SharedClient(_Errors, drivers.SharedClient):
    """:class:`confluent_kafka.Consumer` of one group over several topics
    (:class:`~.drivers.SharedClient`).

    A poll waits for one message, then takes what else is there with one
    ``consume`` call (one release of the GIL for the batch, not one per
    record: a thread that takes the GIL back while the reactor runs waits
    for its switch interval).  Joined, a rebalance callback served inside
    that call is safe: the message read before it is dropped by the
    callback (it is in what the poll collected so far), and librdkafka
    purges from the batch it is filling every message of a partition whose
    version moved (an unassign, an assign or a seek enqueue a version
    barrier, ``rd_kafka_purge_outdated_messages``), so nothing read under
    the revoked assignment is returned.  The partitions the group gives are
    assigned once the callback positioned them all (an eager rebalance
    assigns with ``assign``, offsets included), and those paused meanwhile
    are paused then.

    A joined client does not change its topics in place (:attr:`resubscribes`
    False: a new client joins instead): on Tansu a rejoin with changed topics
    is sometimes never answered, as with kafka-python.

    librdkafka's fetcher does not notice a resumed partition until its
    broker thread wakes for something else: up to a second when every
    partition was paused (an idle client, :mod:`.pacing`).  So
    :meth:`wake` asks the leader of a resumed partition for its offsets,
    a request that wakes the thread of that broker, the one that fetches it
    (about 1 ms on Tansu; a seek to the position does not wake it when the
    position did not move, a metadata request may go to another broker).
    """

    resubscribes = False

    def __init__(self, config: Any, group: str) -> None:
        self._timeout = config.request_timeout_ms / 1000.0
        self._error: str | None = None
        self._joined = False
        self._collected: dict | None = None  # what a joined poll read so far
        self._starts: dict | None = None  # positions given during an assignment
        self._pausing: set | None = None  # paused during an assignment
        self._consumer = Consumer(_consumer_config(config, group, self._on_error))

    @staticmethod
    def _tps(tps, offsets: dict | None = None) -> list[TopicPartition]:
        if offsets is None:
            return [TopicPartition(t, p) for t, p in tps]
        return [TopicPartition(t, p, offsets[(t, p)]) for t, p in tps]

    def partitions(self, topic: str) -> list[int]:
        metadata = self._consumer.list_topics(topic, timeout=self._timeout)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            raise KafkaException(found.error if found is not None else "no metadata")
        return sorted(found.partitions)

    def add(self, offsets: dict) -> None:
        self._consumer.incremental_assign(self._tps(offsets, offsets))
        self._consumer.resume(self._tps(offsets))  # paused before it was removed

    def remove(self, tps: list) -> None:
        if tps:
            self._consumer.incremental_unassign(self._tps(tps))

    def subscribe(self, topics: list, on_assign: Callable, on_revoke: Callable) -> None:
        def assigned(consumer, partitions) -> None:
            tps = sorted((tp.topic, tp.partition) for tp in partitions)
            self._starts, self._pausing = {}, set()
            try:
                on_assign(tps)
            finally:
                starts, pausing = self._starts, self._pausing
                self._starts = self._pausing = None
                consumer.assign([TopicPartition(t, p, starts[(t, p)]) if (t, p) in starts
                                 else TopicPartition(t, p) for t, p in tps])
                # a partition paused before it was revoked stays paused when
                # given back: a partition is given to be read
                consumer.resume(self._tps(tps))
                if pausing:
                    consumer.pause(self._tps(pausing))

        def revoked(consumer, partitions) -> None:
            gone = {(tp.topic, tp.partition) for tp in partitions}
            offsets = on_revoke(sorted(gone))
            if offsets:
                try:
                    self.commit(offsets, wait=True)
                except KafkaException as e:
                    self._error = f"commit before a rebalance failed: {e}"
            consumer.unassign()
            for topic, records in (self._collected or {}).items():
                records[:] = [r for r in records if (topic, r.partition) not in gone]

        self._joined = True
        self._consumer.subscribe(list(topics), on_assign=assigned, on_revoke=revoked,
                                 on_lost=revoked)

    def seek(self, offsets: dict) -> None:
        if self._starts is not None:  # assigned at the end of the callback
            self._starts.update(offsets)
        else:
            for tp in self._tps(offsets, offsets):
                self._consumer.seek(tp)
            self._consumer.resume(self._tps(offsets))

    def committed(self, tps: list) -> dict:
        found = self._consumer.committed(self._tps(tps), timeout=self._timeout)
        return {(tp.topic, tp.partition): offset for tp, offset in _committed(found)}

    def _watermarks(self, tps: list, index: int) -> dict:
        return {tp: self._consumer.get_watermark_offsets(
                    TopicPartition(*tp), timeout=self._timeout, cached=False)[index]
                for tp in tps}

    def first_offsets(self, tps: list) -> dict:
        return self._watermarks(tps, 0)

    def end_offsets(self, tps: list) -> dict:
        return self._watermarks(tps, 1)

    def high_watermarks(self, tps: list) -> dict:
        found = {}
        for tp in tps:
            high = self._consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)[1]
            if high >= 0:
                found[tp] = high
        return found

    def poll(self, timeout: float, max_records: int, want_ends: set) -> tuple[dict, dict]:
        records: dict[str, list] = {}
        ends: dict = {}
        consumer = self._consumer
        m = consumer.poll(timeout)  # waits for one, then takes what is there
        if m is None:
            return records, ends
        message = self._message
        # a rebalance served by the consume drops the first one here (see
        # the class doc); the batch's own are purged by librdkafka
        self._collected = records
        try:
            message(m, records, ends, want_ends)
            batch = consumer.consume(max_records - 1, 0) if max_records > 1 else ()
        finally:
            self._collected = None
        for m in batch:
            message(m, records, ends, want_ends)
        return records, ends

    def _message(self, m, records: dict, ends: dict, want_ends: set) -> int:
        """Take message ``m`` into ``records`` or ``ends``.

        :returns: 1 for a record, else 0."""
        error = m.error()
        tp = (m.topic(), m.partition())
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                ends[tp] = m.offset()  # (the partition may be new since want_ends)
            else:
                self._error = str(error)
            return 0
        if tp in want_ends and tp not in ends:
            high = self._consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)[1]
            if high >= 0:
                ends[tp] = high
        found = records.get(tp[0])
        if found is None:
            found = records[tp[0]] = []
        stamp = m.timestamp()  # (type, ms); type 0: TIMESTAMP_NOT_AVAILABLE
        found.append(RawRecord(tp[1], m.offset(), m.key(), m.value(), tuple(m.headers() or ()),
                               stamp[1] if stamp[0] else None))
        return 1

    def commit(self, offsets: dict, wait: bool) -> None:
        self._consumer.commit(offsets=self._tps(offsets, offsets), asynchronous=not wait)

    def pause(self, tps: list) -> None:
        if self._pausing is not None:  # paused once assigned
            self._pausing.update(tps)
        else:
            self._consumer.pause(self._tps(tps))

    def resume(self, tps: list) -> None:
        if self._pausing is not None:
            self._pausing.difference_update(tps)
            return
        self._consumer.resume(self._tps(tps))

    def wake(self, tps: list) -> None:
        self.resume(tps)
        if tps:
            try:  # wakes the fetcher (see the class doc)
                self._consumer.get_watermark_offsets(TopicPartition(*tps[0]),
                                                     timeout=WAKE_TIMEOUT, cached=False)
            except KafkaException:
                pass  # no broker: the fetcher retries on its own

    def latest_offsets(self, tps: list) -> dict:
        # timestamp -1: the latest offset, all partitions of a broker in one request
        found = self._consumer.offsets_for_times(
            [TopicPartition(t, p, -1) for t, p in tps], timeout=self._timeout)
        return {(tp.topic, tp.partition): tp.offset for tp in found if tp.error is None}

    def close(self) -> None:
        self._consumer.close()
