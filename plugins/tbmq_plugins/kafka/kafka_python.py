"""The ``kafka-python`` driver (``kafka.driver: kafka-python``; pure Python,
``pip install 'tbmq[kafka-python]'``).

* The producer's :meth:`~kafka.KafkaProducer.send` is thread-safe and does
  not block once the topic's metadata is cached (:meth:`Producer.prepare`
  warms it); its futures complete in the client's I/O thread, which puts
  the outcome in the :class:`~.bridge.AckBatcher`.
* Idempotence is off and one request is in flight per connection: records
  of a key keep their order through retries, and the producer survives a
  broker that lost its producer ids (a restarted Tansu answers
  ``UnknownProducerId`` for ever to an idempotent producer).
* A :class:`kafka.KafkaConsumer` is not thread-safe: one consumer thread
  owns each (:class:`~.loop.ConsumerLoop`).  The high watermark of each
  fetch (:meth:`~kafka.KafkaConsumer.highwater`) gives the end of a
  partition; ``end_offsets`` is wrong on Tansu.
* kafka-python 3 runs the rebalance listener in its I/O thread, where the
  consumer's blocking calls are refused.  So the listener only pauses the
  partitions it is given and notes them; the loop positions them in its own
  thread at the start of the next :meth:`ConsumerClient.poll`, and resumes
  them.  Partitions taken away are handed to the loop's ``on_revoke`` at
  once (it asks the reactor), and what it returns is committed before the
  group moves on (the listener is a coroutine that awaits the commit).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from kafka import AsyncConsumerRebalanceListener, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

from tbmq_plugins.kafka import drivers
from tbmq_plugins.kafka.drivers import RawRecord, TopicSpec

__all__ = ["Admin", "ConsumerClient", "ExclusiveClient", "Producer"]

#: Most milliseconds between two reconnection attempts to a broker.
RECONNECT_BACKOFF_MAX_MS = 1000


def _common(config: Any) -> dict:
    return dict(
        bootstrap_servers=[s.strip() for s in config.bootstrap_servers.split(",") if s.strip()],
        client_id="tbmq",
        request_timeout_ms=config.request_timeout_ms,
        reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
        bootstrap_timeout_ms=config.request_timeout_ms,
    )


def _acks(value: str) -> Any:
    return "all" if value == "all" else int(value)


def _consumer(config: Any, group: str) -> KafkaConsumer:
    return KafkaConsumer(
        **_common(config),
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=config.fetch_max_wait_ms,
        max_poll_records=config.max_poll_records,
        session_timeout_ms=config.session_timeout_ms,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
    )


class Admin(drivers.Admin):
    """:class:`kafka.admin.KafkaAdminClient`."""

    def __init__(self, config: Any) -> None:
        self._timeout = config.request_timeout_ms
        self._client = KafkaAdminClient(**_common(config))

    def create_topics(self, specs: list[TopicSpec]) -> None:
        for spec in specs:
            topic = NewTopic(spec.name, spec.partitions, spec.replication_factor,
                             topic_configs=dict(spec.config))
            try:
                self._client.create_topics([topic], timeout_ms=self._timeout)
            except TopicAlreadyExistsError:
                pass

    def committed(self, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
        found = self._client.list_group_offsets(
            {group: [TopicPartition(topic, p) for p in partitions]})[group]
        out: dict[int, int | None] = dict.fromkeys(partitions)
        for tp, meta in found.items():
            if tp.topic == topic and meta is not None and meta.offset >= 0:
                out[tp.partition] = meta.offset
        return out

    def close(self) -> None:
        self._client.close()


class Producer(drivers.Producer):
    """:class:`kafka.KafkaProducer`; outcomes to ``acks.put``."""

    def __init__(self, config: Any, acks: Any) -> None:
        self._put = acks.put
        self._producer = KafkaProducer(
            **_common(config),
            acks=_acks(config.acks),
            linger_ms=config.linger_ms,
            delivery_timeout_ms=config.request_timeout_ms + config.linger_ms,
            max_block_ms=config.request_timeout_ms,
            retry_backoff_ms=100,
            enable_idempotence=False,
            max_in_flight_requests_per_connection=1,
        )

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: tuple,
             deferred: Any, partition: int | None = None) -> None:
        future = self._producer.send(topic, value=value, key=key,
                                     headers=list(headers) if headers else None,
                                     partition=partition)
        put = self._put
        future.add_callback(lambda _metadata: put(deferred, None))
        future.add_errback(lambda error: put(deferred, error))

    def prepare(self, topic: str) -> int:
        return len(self._producer.partitions_for(topic))

    def close(self, timeout: float) -> None:
        self._producer.close(timeout=timeout)


class _Listener(AsyncConsumerRebalanceListener):
    """Runs in kafka-python's I/O thread (see the module doc)."""

    def __init__(self, client: "ConsumerClient", on_revoke: Callable) -> None:
        self._client = client
        self._on_revoke = on_revoke

    async def on_partitions_revoked(self, revoked) -> None:
        offsets = self._on_revoke(sorted(tp.partition for tp in revoked))
        if offsets:
            data = self._client._offsets(offsets)
            # the coordinator's own coroutine: the commit is done before the
            # group moves on (the public commit() may not block here)
            commit = getattr(self._client._consumer._coordinator,
                             "_commit_offsets_sync_async", None)
            try:
                if commit is not None:
                    await commit(data)
                else:
                    self._client._consumer.commit_async(data)
            except Exception as e:
                self._client.error = f"commit before a rebalance failed: {e}"

    async def on_partitions_assigned(self, assigned) -> None:
        if assigned:
            self._client._consumer.pause(*assigned)
        self._client._assigned.append(sorted(tp.partition for tp in assigned))


class ConsumerClient(drivers.ConsumerClient):
    """:class:`kafka.KafkaConsumer` of one topic and group."""

    def __init__(self, config: Any, topic: str, group: str) -> None:
        self.topic = topic
        self.error: str | None = None
        self._tps: dict[int, TopicPartition] = {}
        self._assigned: deque[list[int]] = deque()  # from the listener, not positioned yet
        self._on_assign: Callable | None = None
        self._consumer = _consumer(config, group)

    def _tp(self, partition: int) -> TopicPartition:
        tp = self._tps.get(partition)
        if tp is None:
            tp = self._tps[partition] = TopicPartition(self.topic, partition)
        return tp

    def partitions(self) -> list[int]:
        return sorted(self._consumer.partitions_for_topic(self.topic))

    def subscribe(self, on_assign: Callable, on_revoke: Callable) -> None:
        self._on_assign = on_assign
        self._consumer.subscribe([self.topic], listener=_Listener(self, on_revoke))

    def start_at(self, offsets: dict[int, int], assign: bool) -> None:
        consumer = self._consumer
        tps = [self._tp(p) for p in offsets]
        if assign:
            consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, offsets[tp.partition])
        consumer.resume(*tps)

    def seek(self, offsets: dict[int, int]) -> None:
        for p, o in offsets.items():
            self._consumer.seek(self._tp(p), o)

    def take_error(self) -> str | None:
        error, self.error = self.error, None
        return error

    def committed(self, partitions: list[int]) -> dict[int, int | None]:
        return {p: self._consumer.committed(self._tp(p)) for p in partitions}

    def first_offsets(self, partitions: list[int]) -> dict[int, int]:
        found = self._consumer.beginning_offsets([self._tp(p) for p in partitions])
        return {tp.partition: offset for tp, offset in found.items()}

    def end_offsets(self, partitions: list[int]) -> dict[int, int]:
        found = self._consumer.end_offsets([self._tp(p) for p in partitions])
        return {tp.partition: offset for tp, offset in found.items()}

    def high_watermarks(self, partitions: list[int]) -> dict[int, int]:
        found = {}
        for p in partitions:
            end = self._consumer.highwater(self._tp(p))
            if end is not None:
                found[p] = end
        return found

    def poll(self, timeout: float, max_records: int,
             want_ends: set[int]) -> tuple[list[RawRecord], dict[int, int]]:
        consumer = self._consumer
        if self._assigned:  # position them here, out of the I/O thread
            while self._assigned:  # the latest counts: earlier ones were revoked since
                latest = self._assigned.popleft()
            assigned = {tp.partition for tp in consumer.assignment()}
            self._on_assign([p for p in latest if p in assigned])
        batches = consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        records = []
        for tp, batch in sorted(batches.items(), key=lambda item: item[0].partition):
            p = tp.partition
            records += [RawRecord(p, r.offset, r.key, r.value, tuple(r.headers or ()))
                        for r in batch]
        ends = {}
        if want_ends:
            assigned = consumer.assignment()
            for p in want_ends:
                tp = self._tp(p)
                if tp in assigned:
                    end = consumer.highwater(tp)
                    if end is not None:
                        ends[p] = end
        return records, ends

    def _offsets(self, offsets: dict[int, int]) -> dict:
        return {self._tp(p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}

    def commit(self, offsets: dict[int, int], wait: bool) -> None:
        data = self._offsets(offsets)
        if wait:
            self._consumer.commit(data)
        else:
            self._consumer.commit_async(data)

    def pause(self, partitions: list[int]) -> None:
        self._consumer.pause(*(self._tp(p) for p in partitions))

    def resume(self, partitions: list[int]) -> None:
        self._consumer.resume(*(self._tp(p) for p in partitions))

    def close(self) -> None:
        self._consumer.close(autocommit=False)



class ExclusiveClient(drivers.ExclusiveClient):
    """:class:`kafka.KafkaConsumer` of one group over directly assigned
    partitions of several topics (:class:`~.drivers.ExclusiveClient`)."""

    def __init__(self, config: Any, group: str) -> None:
        self._consumer = _consumer(config, group)
        self._assigned: set[TopicPartition] = set()

    def partitions(self, topic: str) -> list[int]:
        found = self._consumer.partitions_for_topic(topic)
        if not found:
            raise LookupError(f"{topic}: no metadata")
        return sorted(found)

    def add(self, offsets: dict) -> None:
        consumer = self._consumer
        tps = [TopicPartition(*tp) for tp in offsets]
        self._assigned.update(tps)
        consumer.assign(list(self._assigned))
        for tp in tps:
            consumer.seek(tp, offsets[tuple(tp)])

    def remove(self, tps: list) -> None:
        self._assigned.difference_update(TopicPartition(*tp) for tp in tps)
        if self._assigned:
            self._consumer.assign(list(self._assigned))
        else:
            self._consumer.unsubscribe()

    def seek(self, offsets: dict) -> None:
        for tp, o in offsets.items():
            self._consumer.seek(TopicPartition(*tp), o)

    def committed(self, tps: list) -> dict:
        return {tp: self._consumer.committed(TopicPartition(*tp)) for tp in tps}

    def first_offsets(self, tps: list) -> dict:
        found = self._consumer.beginning_offsets([TopicPartition(*tp) for tp in tps])
        return {(tp.topic, tp.partition): offset for tp, offset in found.items()}

    def end_offsets(self, tps: list) -> dict:
        found = self._consumer.end_offsets([TopicPartition(*tp) for tp in tps])
        return {(tp.topic, tp.partition): offset for tp, offset in found.items()}

    def high_watermarks(self, tps: list) -> dict:
        found = {}
        for tp in tps:
            end = self._consumer.highwater(TopicPartition(*tp))
            if end is not None:
                found[tp] = end
        return found

    def poll(self, timeout: float, max_records: int, want_ends: set) -> tuple[dict, dict]:
        consumer = self._consumer
        records: dict[str, list] = {}
        if self._assigned:
            batches = consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
            for tp, batch in sorted(batches.items()):
                p = tp.partition
                records.setdefault(tp.topic, []).extend(
                    RawRecord(p, r.offset, r.key, r.value, tuple(r.headers or ()))
                    for r in batch)
        ends = {}
        for tp in want_ends:
            ktp = TopicPartition(*tp)
            if ktp in self._assigned:
                end = consumer.highwater(ktp)
                if end is not None:
                    ends[tp] = end
        return records, ends

    def commit(self, offsets: dict, wait: bool) -> None:
        data = {TopicPartition(*tp): OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()}
        if wait:
            self._consumer.commit(data)
        else:
            self._consumer.commit_async(data)

    def pause(self, tps: list) -> None:
        self._consumer.pause(*(TopicPartition(*tp) for tp in tps))

    def resume(self, tps: list) -> None:
        self._consumer.resume(*(TopicPartition(*tp) for tp in tps))

    def close(self) -> None:
        self._consumer.close(autocommit=False)
