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
  owns each (:class:`~.loop.SharedLoop`).  The high watermark of each
  fetch (:meth:`~kafka.KafkaConsumer.highwater`) gives the end of a
  partition; ``end_offsets`` is wrong on Tansu.
* kafka-python 3 runs the rebalance listener in its I/O thread, where the
  consumer's blocking calls are refused.  So the listener only pauses the
  partitions it is given and notes them; the loop positions them in its own
  thread at the start of the next :meth:`SharedClient.poll`, and resumes
  them.  Partitions taken away are handed to the loop's ``on_revoke`` at
  once (it asks the reactor), and what it returns is committed before the
  group moves on (the listener is a coroutine that awaits the commit).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from kafka import AsyncConsumerRebalanceListener, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic, OffsetSpec
from kafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError
from kafka.structs import OffsetAndMetadata

from tbmq_plugins.kafka import drivers
from tbmq_plugins.kafka.describe import assemble, state_name
from tbmq_plugins.kafka.drivers import RawRecord, TopicSpec

__all__ = ["Admin", "Producer", "SharedClient"]

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
        fetch_min_bytes=config.fetch_min_bytes,
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

    def delete_topics(self, names: list[str]) -> None:
        for name in names:
            try:
                self._client.delete_topics([name], timeout_ms=self._timeout)
            except UnknownTopicOrPartitionError:
                pass

    def committed(self, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
        found = self._client.list_group_offsets(
            {group: [TopicPartition(topic, p) for p in partitions]})[group]
        out: dict[int, int | None] = dict.fromkeys(partitions)
        for tp, meta in found.items():
            if tp.topic == topic and meta is not None and meta.offset >= 0:
                out[tp.partition] = meta.offset
        return out

    def describe(self, topic_prefix: str, known_groups: list[str]) -> dict:
        client, errors = self._client, []
        names = client.list_topics()
        topics = {t["name"]: sorted(p["partition_index"] for p in t["partitions"])
                  for t in client.describe_topics(
                      [n for n in names if n.startswith(topic_prefix)])} if names else {}
        latest: dict = {}
        wanted = {TopicPartition(name, p): OffsetSpec.LATEST
                  for name, parts in topics.items() for p in parts}
        if wanted:
            try:
                for tp, found in client.list_partition_offsets(wanted).items():
                    latest[(tp.topic, tp.partition)] = found.offset
            except Exception as e:
                errors.append(f"latest offsets: {e}")
        groups: dict = {g: {"state": None, "members": None} for g in known_groups}
        try:
            for g in client.list_groups():
                groups[g["group_id"]] = {"state": state_name(g.get("group_state")),
                                         "members": None}
        except Exception as e:
            errors.append(f"consumer groups not listed: {e}")
        committed: dict = {}
        for g in groups:  # one at a time: older brokers take one group per request
            try:
                found = client.list_group_offsets({g: None})[g]
            except Exception as e:
                errors.append(f"offsets of group {g}: {e}")
                continue
            committed[g] = {(tp.topic, tp.partition): meta.offset
                            for tp, meta in found.items() if meta is not None}
        if groups:
            try:
                for g, d in client.describe_groups(list(groups)).items():
                    groups[g] = {"state": state_name(d.get("group_state"))
                                 or groups[g]["state"], "members": len(d.get("members") or ())}
            except Exception as e:
                errors.append(f"consumer groups not described: {e}")
        return assemble(topic_prefix, known_groups, topics, latest, groups, committed, errors)

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
             done: Any, partition: int | None = None) -> None:
        future = self._producer.send(topic, value=value, key=key,
                                     headers=list(headers) if headers else None,
                                     partition=partition)
        put = self._put
        future.add_callback(lambda _metadata: put(done, None))
        future.add_errback(lambda error: put(done, error))

    def send_many(self, topic: str, keys: list, values: list, done: Any) -> None:
        reports = drivers.Reports(self._put, done, len(keys))
        report = reports.report

        def acknowledged(_metadata) -> None:
            report()

        send = self._producer.send
        queued = 0
        try:
            for key, value in zip(keys, values):
                future = send(topic, value=value, key=key)
                future.add_callback(acknowledged)
                future.add_errback(report)
                queued += 1
        except Exception as e:
            reports.refused(len(keys) - queued, f"the producer refused the record: {e}")

    def prepare(self, topic: str) -> int:
        return len(self._producer.partitions_for(topic))

    def close(self, timeout: float) -> None:
        self._producer.close(timeout=timeout)


class _Listener(AsyncConsumerRebalanceListener):
    """Runs in kafka-python's I/O thread (see the module doc)."""

    def __init__(self, client: "SharedClient", on_revoke: Callable) -> None:
        self._client = client
        self._on_revoke = on_revoke

    async def on_partitions_revoked(self, revoked) -> None:
        offsets = self._on_revoke(sorted((tp.topic, tp.partition) for tp in revoked))
        if offsets:
            data = _offsets(offsets)
            consumer = self._client._consumer
            # the coordinator's own coroutine: the commit is done before the
            # group moves on (the public commit() may not block here)
            commit = getattr(consumer._coordinator, "_commit_offsets_sync_async", None)
            try:
                if commit is not None:
                    await commit(data)
                else:
                    consumer.commit_async(data)
            except Exception as e:
                self._client.error = f"commit before a rebalance failed: {e}"

    async def on_partitions_assigned(self, assigned) -> None:
        if assigned:
            self._client._consumer.pause(*assigned)
        self._client._given.append(sorted((tp.topic, tp.partition) for tp in assigned))


def _offsets(offsets: dict) -> dict:
    return {TopicPartition(*tp): OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()}


class SharedClient(drivers.SharedClient):
    """:class:`kafka.KafkaConsumer` of one group over several topics
    (:class:`~.drivers.SharedClient`).  Its rejoin with changed topics gets
    no assignment from Tansu (until the loop gives up on it), so a change
    of topics is a new client (:attr:`resubscribes` False)."""

    resubscribes = False
    fetches_in_background = False  # fetches inside poll only (an in-flight one completes)

    def __init__(self, config: Any, group: str) -> None:
        self.error: str | None = None
        self._consumer = _consumer(config, group)
        self._assigned: set[TopicPartition] = set()  # assigned directly
        self._joined = False
        self._given: deque[list] = deque()  # from the listener, not positioned yet
        self._on_assign: Callable | None = None

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

    def subscribe(self, topics: list, on_assign: Callable, on_revoke: Callable) -> None:
        self._on_assign = on_assign
        self._joined = True
        self._consumer.subscribe(topics=list(topics), listener=_Listener(self, on_revoke))

    def seek(self, offsets: dict) -> None:
        consumer = self._consumer
        tps = [TopicPartition(*tp) for tp in offsets]
        for tp in tps:
            consumer.seek(tp, offsets[tuple(tp)])
        consumer.resume(*tps)

    def take_error(self) -> str | None:
        error, self.error = self.error, None
        return error

    def committed(self, tps: list) -> dict:
        return {tp: self._consumer.committed(TopicPartition(*tp)) for tp in tps}

    def first_offsets(self, tps: list) -> dict:
        found = self._consumer.beginning_offsets([TopicPartition(*tp) for tp in tps])
        return {(tp.topic, tp.partition): offset for tp, offset in found.items()}

    def end_offsets(self, tps: list) -> dict:
        found = self._consumer.end_offsets([TopicPartition(*tp) for tp in tps])
        return {(tp.topic, tp.partition): offset for tp, offset in found.items()}

    def latest_offsets(self, tps: list) -> dict:
        return self.end_offsets(tps)

    def high_watermarks(self, tps: list) -> dict:
        found = {}
        for tp in tps:
            end = self._consumer.highwater(TopicPartition(*tp))
            if end is not None:
                found[tp] = end
        return found

    def poll(self, timeout: float, max_records: int, want_ends: set) -> tuple[dict, dict]:
        consumer = self._consumer
        if self._given:  # position them here, out of the I/O thread
            while self._given:  # the latest counts: earlier ones were revoked since
                latest = self._given.popleft()
            assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
            self._on_assign([tp for tp in latest if tp in assigned])
        records: dict[str, list] = {}
        if self._assigned or self._joined:
            batches = consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
            for tp, batch in sorted(batches.items()):
                p = tp.partition
                records.setdefault(tp.topic, []).extend(
                    RawRecord(p, r.offset, r.key, r.value, tuple(r.headers or ()),
                              r.timestamp if (r.timestamp or -1) >= 0 else None)
                    for r in batch)
        ends = {}
        if want_ends:
            assigned = consumer.assignment()
            for tp in want_ends:
                ktp = TopicPartition(*tp)
                if ktp in assigned:
                    end = consumer.highwater(ktp)
                    if end is not None:
                        ends[tp] = end
        return records, ends

    def commit(self, offsets: dict, wait: bool) -> None:
        data = _offsets(offsets)
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
