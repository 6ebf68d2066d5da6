"""The Kafka message bus (``bus: kafka``): :class:`KafkaBus`.

It carries TBMQ's topic catalogue (:mod:`tbmq.cluster.topics`, names
prefixed with ``kafka.topic_prefix``) with the contract of
:class:`tbmq.interfaces.IMessageBus` (``docs/bus.md``), on one of two client
libraries (:mod:`.drivers`).

* **Topics** are created with ``kafka.partitions`` (one partition for
  those TBMQ gives one:
  :meth:`~tbmq.cluster.topics.TopicCatalogue.partitioned`),
  ``kafka.replication_factor`` and, unless compacted,
  ``retention.ms = kafka.retention_ms``; the compacted ones
  (:meth:`~tbmq.cluster.topics.TopicCatalogue.compacted`) get
  ``cleanup.policy=compact`` and ``min.compaction.lag.ms =
  kafka.min_compaction_lag_ms`` (:mod:`.order`).  The fixed topics are created by
  :meth:`KafkaBus.start`, the per-id ones (a node's downlinks, responses
  and disconnects, ``tbmq.msg.app.<clientId>``,
  ``tbmq.msg.app.shared.<filter>``) before their first publish or
  subscription; a topic that already exists is fine.  Publishes to a topic
  being created wait for it, in order.
* **Publish** encodes the value with its topic's codec, the key as UTF-8,
  and hands the record to the producer from the reactor thread (the
  producer never blocks there).  Its ``done`` is called (or its Deferred
  fires) once the brokers acknowledged it (``kafka.acks``);
  acknowledgements come back to the reactor in batches
  (:class:`~.bridge.AckBatcher`), and a publish given a ``done`` costs no
  Deferred.  The records of one
  reactor turn for one partition of a traffic topic go as one packed
  record (:mod:`.packing`).
* **Consumers**: the exclusive subscriptions of one group share one thread
  and one client over all their topics (:class:`~.loop.SharedLoop`), and so
  do the joining subscriptions of one bundle (one member of one Kafka group
  over their topics), so that a node's topics cost a few fetches, not one
  per topic (:mod:`.loop`); another joining subscription has a thread and a
  client of its own.  The handing and commit bookkeeping is in the reactor
  (:mod:`.consumer`).
* **Blocking calls** of the bus itself (topic creation, metadata, closing)
  run one at a time in the bus's worker thread (:class:`~.bridge.Worker`).
* **Outages**: a publish that Kafka does not acknowledge within
  ``kafka.request_timeout_ms`` fails with :class:`~tbmq.errors.BusPublishError`;
  the first such failure and the first success after it are logged, not
  every record.  Consumers retry by themselves (:mod:`.loop`).
"""

from __future__ import annotations

from typing import Any, Callable
from zlib import crc32

from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from tbmq.cluster.completion import Completion, deferred_done, publish_each
from tbmq.cluster.topics import TopicCatalogue
from tbmq.errors import BusClosedError, BusError, BusPublishError, RecordEncodingError
from tbmq.interfaces import IDescribableBus, IMessageBus
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq_plugins.kafka.bridge import AckBatcher, Worker
from tbmq_plugins.kafka.consumer import KafkaConsumer
from tbmq_plugins.kafka.describe import describe_bus
from tbmq_plugins.kafka.drivers import TopicSpec, load_driver
from tbmq_plugins.kafka.loop import ConsumerLoop, SharedLoop
from tbmq_plugins.kafka.own import Own
from tbmq_plugins.kafka.packing import Packer

__all__ = ["KafkaBus", "kafka_group", "topic_spec"]

log = Logger(observer=LOG_OBSERVER)

#: Seconds between two attempts to create a topic a consumer waits for.
CREATE_RETRY_DELAY = 1.0


def _report(done: Callable, failure: Failure) -> None:
    """Call a publish's ``done`` with ``failure``; what it raises is logged."""
    try:
        done(failure)
    except Exception:
        log.failure("Kafka bus: the outcome of a publish could not be reported")


def topic_spec(config: Any, catalogue: TopicCatalogue, topic: str) -> TopicSpec:
    """The topic ``topic`` is created as.

    :param config: the :class:`tbmq.config.KafkaConfig`.
    :returns: its :class:`~.drivers.TopicSpec`: ``kafka.partitions``, or
        1 for a topic the catalogue does not spread
        (:meth:`~tbmq.cluster.topics.TopicCatalogue.partitioned`: TBMQ's
        layout), ``kafka.replication_factor``, ``cleanup.policy=compact`` and
        ``min.compaction.lag.ms`` (unless ``kafka.min_compaction_lag_ms`` is
        0) when compacted, else ``cleanup.policy=delete`` and
        ``retention.ms``.
    """
    if catalogue.compacted(topic):
        configs = {"cleanup.policy": "compact"}
        if config.min_compaction_lag_ms:  # what order.Gaps relies on
            configs["min.compaction.lag.ms"] = str(config.min_compaction_lag_ms)
    else:
        configs = {"cleanup.policy": "delete", "retention.ms": str(config.retention_ms)}
    partitions = config.partitions if catalogue.partitioned(topic) else 1
    return TopicSpec(topic, partitions, config.replication_factor, configs)


def kafka_group(topic: str, group: str, exclusive: bool = False, bundle: str | None = None,
                prefix: str = "") -> str:
    """The Kafka group id of the bus's group ``group`` on ``topic``.

    A bus group belongs to one topic (two topics' groups of the same name are
    two groups, as on the in-process bus), while a Kafka group spans topics
    and rebalances all its members together; so the topic (prefix included)
    is part of the id of a group whose members join it.  An exclusive group
    never joins (its partitions are assigned) and its committed offsets are
    per topic and partition, so the exclusive groups of one name on several
    topics are one Kafka group, read by one client.  The joining groups of
    one bundle are one Kafka group over their topics: one topic has one
    group in a bundle, and a Kafka group assigns each topic's partitions
    among the members that subscribed to it, so each bus group keeps its own
    partitions and offsets; they only rebalance together.

    :param bundle: the bundle of a joining group (see
        :meth:`KafkaBus.subscribe`).
    :param prefix: ``kafka.topic_prefix``, which a bundle's id starts with
        (several clusters on one Kafka keep their groups apart).
    :returns: ``"<group>@<topic>"``, ``group`` when ``exclusive``, else
        ``"<prefix><bundle>"`` with a bundle.
    """
    if exclusive:
        return group
    if bundle is not None:
        return prefix + bundle
    return f"{group}@{topic}"


class _Creating:
    """A topic being created: what waits for it."""

    __slots__ = ("sends", "waiters")

    def __init__(self) -> None:
        self.sends: list = []  # (key, value, headers, done), in publish order
        self.waiters: list[defer.Deferred] = []


@implementer(IMessageBus, IDescribableBus)
class KafkaBus:
    """The bus on Kafka; see the module doc and ``docs/bus.md``.

    :param config: the :class:`tbmq.config.KafkaConfig`.
    :param clock: the reactor (``callFromThread``, ``callLater``); the
        global one when None.
    :param max_uncommitted: most handler results a consumer may have
        pending; beyond that it waits.
    :param driver: the driver module (:func:`~.drivers.load_driver` of
        ``config.driver`` when None).
    :raises ConfigError: when the driver's library is not installed.
    :ivar encodes: True: every value crosses Kafka as its codec's bytes.
    :ivar packs: True: the records of one reactor turn to one partition
        cross Kafka as one packed record (:mod:`.packing`).
    :ivar catalogue: the :class:`~tbmq.cluster.topics.TopicCatalogue` of
        ``config.topic_prefix``.
    """

    encodes = True
    packs = True

    def __init__(self, config: Any, clock: Any = None, max_uncommitted: int = 10000,
                 driver: Any = None) -> None:
        if clock is None:
            from twisted.internet import reactor as clock
        self.config = config
        self.clock = clock
        self.max_uncommitted = max_uncommitted
        self.driver = driver if driver is not None else load_driver(config.driver)
        self.catalogue = TopicCatalogue(config.topic_prefix)
        self.running = False
        self._worker: Worker | None = None
        self._admin = None
        self._producer = None
        self._acks = AckBatcher(clock, self._acknowledged)
        self._ready: set[str] = set()
        self._creating: dict[str, _Creating] = {}
        self._codecs: dict[str, Any] = {}
        self._consumers: set[KafkaConsumer] = set()
        self._shared: dict[str, SharedLoop] = {}  # by Kafka group id (exclusive, bundles)
        self._loops: list[SharedLoop] = []  # every consumer thread's, woken by a produce
        self._read_by: dict[str, set[SharedLoop]] = {}  # topic -> the clients that read it
        self._read_by_limit = 64
        self._keys: dict[KafkaConsumer, str | None] = {}  # its key in _shared
        self._group_ids: dict[KafkaConsumer, str] = {}  # its Kafka group id
        self._expected: dict[KafkaConsumer, tuple] = {}  # (SharedLoop, loop) until its topic exists
        self._bundled: dict[tuple[str, str], str] = {}  # (Kafka group id, topic) -> group
        self._unacknowledged = False  # the last outcome was a failure
        #: when (``clock.seconds()``) the last record was acknowledged
        self._acknowledged_at: float | None = None
        #: partition count of each ready topic the bus packs (and places) itself
        self._placed: dict[str, int] = {}
        self._round_robin = 0
        self._packer = Packer(self._send_placed, lambda fn: clock.callLater(0, fn))
        #: the consumer threads were nudged in this reactor turn (:meth:`_send_placed`)
        self._nudged = False
        #: topic -> the members here that take this node's records of it on
        #: acknowledgement (:meth:`~.consumer.KafkaConsumer.hand_own`)
        self._takers: dict[str, list[KafkaConsumer]] = {}

    # -- life cycle ------------------------------------------------------------------------

    @defer.inlineCallbacks
    def start(self):
        """Connect, create the fixed topics of the catalogue and warm the
        producer's metadata, in the worker thread.

        :returns: a Deferred firing with None once publishes are accepted;
            failing with :class:`~tbmq.errors.BusError` when no broker
            answered within ``kafka.request_timeout_ms`` (or a topic could
            not be created).
        """
        if self.running:
            return
        self._worker = Worker(self.clock, "tbmq-kafka-bus")
        c = self.catalogue
        fixed = [c.msg_all, c.msg_retained, c.msg_persisted, c.client_session,
                 c.client_subscriptions, c.session_event_request, c.events]
        try:
            yield self._worker.call(self._open, fixed)
        except Exception as e:
            try:
                yield self._worker.call(self._close_clients, 0)
            except Exception:
                pass  # what could be opened is closed as far as it goes
            self._worker.stop()
            self._worker = None
            raise BusError(f"Kafka at {self.config.bootstrap_servers}: cannot start the bus "
                           f"({self.config.driver}): {e}") from None
        self._ready.update(fixed)
        self.running = True
        log.info("Kafka bus started ({driver}, {servers}, topic prefix {prefix!r})",
                 driver=self.config.driver, servers=self.config.bootstrap_servers,
                 prefix=c.prefix)

    def _open(self, topics: list[str]) -> None:
        """(worker thread) Clients, fixed topics, metadata."""
        self._admin = self.driver.Admin(self.config)
        self._create(topics)
        self._producer = self.driver.Producer(self.config, self._acks)
        for topic in topics:
            self._note_partitions(topic, self._producer.prepare(topic))

    def _note_partitions(self, topic: str, partitions: int) -> None:
        """(worker thread) Remember the partition count of a topic whose
        records the bus places itself."""
        if self.catalogue.packable(topic):
            self._placed[topic] = partitions

    def _create(self, topics: list[str]) -> None:
        """(worker thread) Create ``topics``."""
        self._admin.create_topics([topic_spec(self.config, self.catalogue, t) for t in topics])

    def _prepare(self, topic: str) -> None:
        """(worker thread) Create ``topic`` and warm its metadata."""
        self._create([topic])
        self._note_partitions(topic, self._producer.prepare(topic))

    def _close_clients(self, timeout: float) -> None:
        """(worker thread) Flush and close the producer, close the admin client."""
        producer, self._producer = self._producer, None
        admin, self._admin = self._admin, None
        try:
            if producer is not None:
                producer.close(timeout)
        finally:
            if admin is not None:
                admin.close()

    @defer.inlineCallbacks
    def stop(self):
        """Refuse publishes from now on, stop the consumers (each commits
        what its handlers finished and leaves its group), send what the
        producer holds (``kafka.request_timeout_ms`` at most) and close.

        :returns: a Deferred firing with None once done.
        """
        if not self.running:
            return
        self._packer.flush()  # what this turn published still goes
        self.running = False
        creating, self._creating = self._creating, {}
        for state in creating.values():
            closed = Failure(BusClosedError("the bus stopped before the topic was created"))
            for _key, _value, _headers, done in state.sends:
                _report(done, closed)
            for d in state.waiters:
                d.errback(BusClosedError("the bus stopped"))
        yield defer.DeferredList([c.stop() for c in list(self._consumers)])
        try:
            yield self._worker.call(self._close_clients, self.config.request_timeout_ms / 1000.0)
        except Exception as e:
            log.warn("Kafka bus: closing the clients failed: {error}", error=e)
        self._worker.stop()
        self._worker = None
        self._ready.clear()

    def describe(self) -> defer.Deferred:
        """The cluster's topics, their latest offsets and the consumer groups
        with their committed offsets (:meth:`tbmq.interfaces.IMessageBus.describe`;
        :mod:`.describe`), asked in a pool thread with an admin client of
        its own.

        :returns: a Deferred firing with ``{bus, driver, topics, groups,
            errors}``; failing with :class:`~tbmq.errors.BusClosedError`
            when the bus is not running, or the client's error when no
            broker answered.
        """
        if not self.running:
            return defer.fail(BusClosedError("the bus is not running"))
        d = describe_bus(self.clock, self.driver, self.config, self.catalogue.prefix + "tbmq.",
                         sorted(set(self._group_ids.values())))
        d.addCallback(lambda found: {"bus": "kafka", "driver": self.config.driver, **found})
        return d

    # -- topics ----------------------------------------------------------------------------

    def _codec(self, topic: str):
        codec = self._codecs.get(topic)
        if codec is None:
            codec = self._codecs[topic] = self.catalogue.codec_for(topic)
        return codec

    def _creation(self, topic: str) -> _Creating:
        """The creation of ``topic``, started if it is not under way."""
        state = self._creating.get(topic)
        if state is None:
            state = self._creating[topic] = _Creating()
            self._worker.call(self._prepare, topic).addCallbacks(
                self._created, self._not_created, callbackArgs=(topic, state),
                errbackArgs=(topic, state))
        return state

    def _created(self, _result: Any, topic: str, state: _Creating) -> None:
        if self._creating.get(topic) is not state:
            return  # stopped meanwhile
        del self._creating[topic]
        self._ready.add(topic)
        for key, value, headers, done in state.sends:
            self._send(topic, key, value, headers, done)
        for d in state.waiters:
            d.callback(None)

    def _not_created(self, failure: Failure, topic: str, state: _Creating) -> None:
        if self._creating.get(topic) is not state:
            return
        del self._creating[topic]
        error = BusPublishError(f"{topic}: the topic cannot be created: {failure.value}")
        refused = Failure(error)
        for _key, _value, _headers, done in state.sends:
            _report(done, refused)
        for d in state.waiters:
            d.errback(error)

    def _when_ready(self, topic: str) -> defer.Deferred:
        """:returns: a Deferred firing once ``topic`` exists."""
        if topic in self._ready:
            return defer.succeed(None)
        d = defer.Deferred()
        self._creation(topic).waiters.append(d)
        return d

    # -- delete ----------------------------------------------------------------------------

    def delete_topic(self, topic: str) -> defer.Deferred:
        """Delete ``topic`` (DeleteTopics, with the admin client in the worker
        thread); see :meth:`tbmq.interfaces.IMessageBus.delete_topic`.  A
        later publish creates it again, as the catalogue says.

        :returns: a Deferred firing with None once Kafka answered; failing
            with :class:`ValueError` (a consumer of this bus still reads
            it), :class:`~tbmq.errors.BusClosedError` (not running) or
            :class:`~tbmq.errors.BusError` (Kafka refused, or no answer
            within ``kafka.request_timeout_ms``).
        """
        if not self.running:
            return defer.fail(BusClosedError(f"{topic}: the Kafka bus is not running"))
        if any(consumer.topic == topic for consumer in self._consumers):
            return defer.fail(ValueError(f"{topic}: still consumed"))
        # a librdkafka client that read the topic crashes the process
        # (SIGSEGV, confluent-kafka 2.16 on Tansu) once it is deleted: wait
        # until the clients that read it are closed (a client of an
        # exclusive group closes once its last subscription stopped)
        readers = self._read_by.get(topic, set())
        deadline = self.clock.seconds() + self.config.request_timeout_ms / 1000.0

        def closed() -> defer.Deferred:
            readers.difference_update([loop for loop in list(readers) if loop.finished])
            if not readers:
                self._read_by.pop(topic, None)
                return self._worker.call(self._admin.delete_topics, [topic])
            if self.clock.seconds() >= deadline:
                return defer.fail(BusError(f"{topic}: a client of this bus that read it "
                                           f"still reads other topics"))
            return task.deferLater(self.clock, 0.05, closed)

        def deleted(_result: Any) -> None:
            self._ready.discard(topic)
            self._placed.pop(topic, None)

        def failed(failure: Failure) -> None:
            raise BusError(f"{topic}: the topic cannot be deleted: {failure.value}")

        return closed().addCallbacks(deleted, failed)

    # -- publish ---------------------------------------------------------------------------

    def publish(self, topic: str, key: str | None, value: Any, headers: tuple = (),
                done: Callable[[Failure | None], None] | None = None) -> defer.Deferred | None:
        """Append a record; see :meth:`tbmq.interfaces.IMessageBus.publish`.

        :param topic: a topic of the catalogue.
        :param key: the partition key or None.
        :param value: the topic's record type, or None (a tombstone).
        :param headers: ``tuple[tuple[str, bytes], ...]``.
        :param done: ``done(None | Failure)``, or None.  Called exactly
            once: with None once the brokers acknowledged the record
            (``kafka.acks``, in the reactor thread, from a batch of
            acknowledgements), or with a
            :class:`~twisted.python.failure.Failure` of
            :class:`~tbmq.errors.BusClosedError` (not started, or stopped
            before the record's topic was created; during the call when not
            running), :class:`~tbmq.errors.RecordEncodingError` (during the
            call: the value does not fit the topic's codec, or the topic is
            not in the catalogue) or :class:`~tbmq.errors.BusPublishError`
            (refused, the topic cannot be created, or not acknowledged
            within ``kafka.request_timeout_ms`` milliseconds).  An exception
            ``done`` raises when called later is logged.
        :returns: None with ``done``; else a Deferred that fires (or fails)
            as ``done`` would be called.  Never raises.
        """
        if done is None:
            return deferred_done(lambda done: self.publish(topic, key, value, headers, done))
        if not self.running:
            done(Failure(BusClosedError(f"{topic}: the Kafka bus is not running")))
            return None
        codec = self._codecs.get(topic)
        try:
            data = (codec or self._codec(topic)).encode(value)
        except RecordEncodingError as e:
            done(Failure(e))
            return None
        key_bytes = None if key is None else key.encode("utf-8", "surrogatepass")
        # a member here takes the topic's records when acknowledged (.own)
        takers = self._takers.get(topic) if self._takers else None
        ready = topic in self._ready
        if ready:
            partitions = self._placed.get(topic)
            if partitions is not None and key_bytes is not None and not headers:
                # the hot path (a message, a delivery): as _send, in one call; a
                # record a member here takes is kept in its unit (no Own each)
                self._packer.add(topic, crc32(key_bytes) % partitions, key_bytes, data, (),
                                 done, takers, key, value)
                return None
        if takers is not None:
            done = Own(done, takers, key, value, headers)
        if ready:
            self._send(topic, key_bytes, data, headers, done)
        else:
            self._creation(topic).sends.append((key_bytes, data, headers, done))
        return None

    def publish_many(self, topic: str, keys: list, values: list,
                     done: Callable[[Failure | None], None]) -> None:
        """Append several records to ``topic``, in order, with **one**
        ``done`` for all of them (the router's deliveries of a packed
        record to one node: one call, one outcome, instead of one per
        delivery).  As :meth:`publish` for each record (no headers), but
        ``done`` is called once: with None once every record was
        acknowledged, or with the first failure (a value that does not fit
        the topic's codec fails them all during the call, none sent).

        :param keys: ``str | None`` each.
        :param values: the topic's record type each (no tombstone on the
            topics the router sends to; None is one where the codec takes it).
        """
        if not self.running:
            done(Failure(BusClosedError(f"{topic}: the Kafka bus is not running")))
            return
        takers = self._takers.get(topic) if self._takers else None
        if takers is not None and (topic not in self._placed or topic not in self._ready
                                   or None in keys):
            # a member here takes the topic's records as acknowledged (.own),
            # and the topic is not ready or a record has no key: each as
            # publish does (an Own each), one outcome
            publish_each(self.publish, topic, keys, values, done)
            return
        try:
            data = self._codec(topic).encode_many(values)
        except RecordEncodingError as e:
            done(Failure(e))
            return
        if takers is not None:  # ``tbmq.msg.all``: the values kept for the members here
            self._publish_taken(topic, keys, values, data, takers, done)
            return
        first = keys[0] if keys else None
        if first is not None and keys.count(first) == len(keys):
            # one key (a client's deliveries, an APPLICATION topic's): encoded once
            key_bytes = [first.encode("utf-8", "surrogatepass")] * len(keys)
        else:
            key_bytes = [None if key is None else key.encode("utf-8", "surrogatepass")
                         for key in keys]
        partitions = self._placed.get(topic) if topic in self._ready else None
        if partitions is None:  # not ready, or not placed here
            if not data:
                done(None)
            elif topic in self._ready:  # placed by the producer's partitioner, one outcome
                self._nudge()
                self._producer.send_many(topic, key_bytes, data, done)
            else:
                sent = Completion()
                each = sent.parts(len(data))  # one ``done`` called once per record
                sends = self._creation(topic).sends
                for key, value in zip(key_bytes, data):
                    sends.append((key, value, (), each))
                sent.then(done)
            return
        add_many = self._packer.add_many
        if key_bytes and None not in key_bytes:
            places = [crc32(key) % partitions for key in key_bytes]
            first = places[0]
            if places.count(first) == len(places):  # one partition: the lists as they are
                add_many(topic, first, key_bytes, data, done)
                return
        else:
            places = [self._place(key, partitions) for key in key_bytes]
        groups: dict[int, tuple[list, list]] = {}
        for partition, key, value in zip(places, key_bytes, data):
            group = groups.get(partition)
            if group is None:
                groups[partition] = ([key], [value])
            else:
                group[0].append(key)
                group[1].append(value)
        if len(groups) == 1:
            ((partition, (ks, vs)),) = groups.items()
            add_many(topic, partition, ks, vs, done)
            return
        sent = Completion()
        for partition, (ks, vs) in groups.items():
            add_many(topic, partition, ks, vs, sent.part())
        sent.then(done)

    #: seconds after the last acknowledgement that :meth:`acknowledging` holds
    ACKNOWLEDGING = 0.5

    def acknowledging(self) -> bool:
        """:returns: True when Kafka acknowledged a record of this node's
        within the last :attr:`ACKNOWLEDGING` seconds and has failed none
        since: the brokers answer (what a member asks before it decides a
        record that is not published, :meth:`.consumer.KafkaConsumer.decides`)."""
        at = self._acknowledged_at
        return (at is not None and not self._unacknowledged
                and self.clock.seconds() - at <= self.ACKNOWLEDGING)

    def partition_of(self, topic: str, key: str) -> int | None:
        """:returns: the partition (``int``) a record of ``topic`` with ``key``
        published now goes to, when the bus places the topic's records itself
        (a packable topic, once ready: ``crc32(key) % partitions``,
        :mod:`.packing`); else None (the producer's partitioner places them)."""
        partitions = self._placed.get(topic) if topic in self._ready else None
        if partitions is None:
            return None
        return crc32(key.encode("utf-8", "surrogatepass")) % partitions

    def _publish_taken(self, topic: str, keys: list, values: list, data: list, takers: list,
                       done: Callable[[Failure | None], None]) -> None:
        """:meth:`publish_many` to a ready topic this bus places whose
        records members here take on acknowledgement (:mod:`.own`;
        ``tbmq.msg.all``): encoded in one call, each partition's records
        queued with one :meth:`~.packing.Packer.add_many` that keeps their
        keys and values in their unit (a run of one publisher's messages:
        one topic, so one partition), one outcome, rather than a
        ``publish`` and a completion part each.

        :param keys: ``str`` each (none None); ``data``: ``values`` encoded (``bytes``)."""
        partitions = self._placed[topic]
        add_many = self._packer.add_many
        first = keys[0]
        if keys.count(first) == len(keys):  # one key: one partition, the lists as they are
            key = first.encode("utf-8", "surrogatepass")
            add_many(topic, crc32(key) % partitions, [key] * len(keys), data, done, takers,
                     [(first, value, ()) for value in values])
            return
        groups: dict[int, tuple[list, list, list]] = {}
        for key, value, encoded in zip(keys, values, data):
            key_bytes = key.encode("utf-8", "surrogatepass")
            partition = crc32(key_bytes) % partitions
            group = groups.get(partition)
            if group is None:
                group = groups[partition] = ([], [], [])
            group[0].append(key_bytes)
            group[1].append(encoded)
            group[2].append((key, value, ()))
        if len(groups) == 1:
            ((partition, (ks, vs, items)),) = groups.items()
            add_many(topic, partition, ks, vs, done, takers, items)
            return
        sent = Completion()
        for partition, (ks, vs, items) in groups.items():
            add_many(topic, partition, ks, vs, sent.part(), takers, items)
        sent.then(done)

    def _place(self, key: bytes | None, partitions: int) -> int:
        """The partition of a record this bus places (:mod:`.packing`):
        ``crc32(key) % partitions``, a keyless one round robin."""
        if key is None:
            partition = self._round_robin = (self._round_robin + 1) % partitions
            return partition
        return crc32(key) % partitions

    def _send(self, topic: str, key: bytes | None, value: bytes | None, headers: tuple,
              done: Callable) -> None:
        """One record of a ready topic: to the :class:`~.packing.Packer`
        when the bus places the topic's records itself, else to the
        producer, placed by its partitioner."""
        partitions = self._placed.get(topic)
        if partitions is None:
            self._send_placed(topic, None, key, value, headers, done)
            return
        self._packer.add(topic, self._place(key, partitions), key, value, headers, done)

    def _send_placed(self, topic: str, partition: int | None, key: bytes | None,
                     value: bytes | None, headers: tuple, done: Callable) -> None:
        """To the producer; ``done`` is a publish's own, or a
        :class:`~.packing.Fanout`.  The node's idle consumer threads fetch
        again at once: a node that writes expects records soon (an answer,
        its own message on its way to a subscriber; :mod:`.pacing`).  They
        are nudged once per reactor turn, not once per record: the records
        of a turn that are not packed (an APPLICATION client's topic: one
        record per delivery) would each wake an idle thread (a lock and a
        notify, and the GIL handed over) for nothing the first did not."""
        if not self._nudged:
            self._nudge()
        try:
            self._producer.send(topic, key, value, headers, done, partition)
        except Exception as e:
            _report(done, Failure(BusPublishError(
                f"{topic}: the producer refused the record: {e}")))

    def _nudge(self) -> None:
        """Nudge the node's idle consumer threads once this reactor turn
        (:meth:`_send_placed`)."""
        if not self._nudged:
            self._nudged = True
            for loop in self._loops:
                loop.nudge()
            self.clock.callLater(0, self._turn_ended)

    def _turn_ended(self) -> None:
        self._nudged = False

    def _acknowledged(self, items: list) -> None:
        """(reactor thread) A batch of outcomes from the producer:
        ``(done, error)``, ``error`` None for an acknowledged record."""
        now = self.clock.seconds()
        for done, error in items:
            if error is None:
                self._acknowledged_at = now
                if self._unacknowledged:
                    self._unacknowledged = False
                    log.info("Kafka bus: publishes are acknowledged again")
                try:
                    done(None)
                except Exception:
                    log.failure("Kafka bus: the outcome of a publish could not be reported")
            else:
                if not self._unacknowledged:
                    self._unacknowledged = True
                    log.warn("Kafka bus: a publish was not acknowledged ({error}); "
                             "publishes fail until Kafka answers again", error=error)
                _report(done, Failure(BusPublishError(
                    f"Kafka did not acknowledge the record: {error}")))

    # -- consumers -------------------------------------------------------------------------

    def subscribe(self, topic: str, group: str, handler: Callable,
                  from_beginning: bool = False, exclusive: bool = False,
                  bundle: str | None = None,
                  batch_handler: Callable | None = None) -> KafkaConsumer:
        """Join ``group`` on ``topic``; see
        :meth:`tbmq.interfaces.IMessageBus.subscribe`.  The consumer is read
        once its topic exists (it is created first when needed; retried
        every second while Kafka fails), by a client shared with other
        subscriptions (:class:`~.loop.SharedLoop`).

        :param exclusive: the group never has another member: its partitions
            are assigned directly, read from the group's committed offsets,
            without a group join, by the one client and thread of the
            group's exclusive subscriptions.
        :param bundle: a joining subscription of a bundle is read by the one
            client and thread of the bundle's subscriptions on this node, one
            member of the Kafka group of the bundle over all their topics
            (:func:`kafka_group`).  A second subscription of the bundle's
            topic on this node is a second member of that group, with a
            client of its own.  Ignored with ``exclusive``.
        :returns: the :class:`~.consumer.KafkaConsumer`.
        :raises RecordEncodingError: when ``topic`` is not in the catalogue.
        :raises BusClosedError: when the bus is not running.
        :raises ValueError: when another group of ``bundle`` has ``topic``.
        """
        if not self.running:
            raise BusClosedError(f"{topic}: the Kafka bus is not running")
        codec = self._codec(topic)
        config = self.config
        if exclusive:
            bundle = None
        group_id = kafka_group(topic, group, exclusive, bundle, self.catalogue.prefix)
        if bundle is not None:
            known = self._bundled.setdefault((group_id, topic), group)
            if known != group:
                raise ValueError(f"bundle {bundle!r}: {topic} is group {known!r}'s, "
                                 f"not {group!r}'s")
        consumer = KafkaConsumer(self, topic, group, handler, codec, self.max_uncommitted,
                                 buffer_limit=2 * config.max_poll_records,
                                 group_wide=not exclusive, batch_handler=batch_handler)
        loop = ConsumerLoop(
            self.clock, consumer, exclusive=exclusive, from_beginning=from_beginning,
            durable=self.catalogue.durable(topic), timeout=config.request_timeout_ms / 1000.0,
            name=f"{group_id} {topic}", contiguous=not self.catalogue.compacted(topic),
            compaction_lag_ms=config.min_compaction_lag_ms)
        self._consumers.add(consumer)
        if bundle is None and not exclusive:
            key = None  # a client of its own
        elif bundle is not None and any(c.topic == topic and self._keys.get(c) == group_id
                                        for c in self._consumers):
            key = None  # this node has the topic in the bundle: a second member
        else:
            key = group_id
        self._keys[consumer] = key
        self._group_ids[consumer] = group_id
        shared = self._shared_loop(key, group_id, not exclusive)
        shared.expect(loop)
        self._expected[consumer] = (shared, loop)
        self._begin(consumer, loop, (shared, key, group_id, not exclusive))
        return consumer

    def _shared_loop(self, key: str | None, group_id: str, joining: bool) -> SharedLoop:
        """The shared thread of ``key`` in :attr:`_shared` (a new one when
        it has ended), or a thread of its own when ``key`` is None."""
        shared = self._shared.get(key) if key is not None else None
        if shared is None or shared.dead:
            config = self.config
            shared = SharedLoop(
                self.clock, lambda: self.driver.SharedClient(config, group_id),
                joining=joining, max_records=config.max_poll_records,
                timeout=config.request_timeout_ms / 1000.0,
                grace=2 * config.heartbeat_interval_ms / 1000.0,
                stuck=4 * config.session_timeout_ms / 1000.0,
                name=f"tbmq-kafka-consumer {group_id}",
                idle_interval=config.idle_fetch_interval_ms / 1000.0,
                fetch_wait=config.fetch_max_wait_ms / 1000.0)
            self._loops = [loop for loop in self._loops if not loop.dead] + [shared]
            if key is not None:
                self._shared[key] = shared
        return shared

    def group_positioned(self, consumer: KafkaConsumer) -> defer.Deferred:
        """Whether every partition of ``consumer``'s topic has a committed
        offset in its Kafka group (asked in the worker thread).

        :returns: a Deferred firing with a bool (failing while Kafka fails).
        """
        if self._worker is None:
            return defer.succeed(False)
        group_id = self._group_ids.get(consumer) or kafka_group(consumer.topic, consumer.group)

        def ask() -> bool:
            # a bundle's topics are packable: their partition counts are known
            partitions = self._placed.get(consumer.topic) or self._producer.prepare(consumer.topic)
            found = self._admin.committed(group_id, consumer.topic, list(range(partitions)))
            return all(offset is not None for offset in found.values())

        return self._worker.call(ask)

    def _share(self, share: tuple, loop: ConsumerLoop, topic: str) -> None:
        """Have the shared thread of ``share`` (the :class:`SharedLoop`
        picked at subscribe, its key, the Kafka group id, joining) read
        ``topic`` for ``loop`` (a new thread when it has ended)."""
        shared, key, group_id, joining = share
        while not shared.add(loop, topic):
            shared = self._shared_loop(key, group_id, joining)
        read_by = self._read_by
        if len(read_by) >= self._read_by_limit:
            # forget the clients closed since (amortized: when it doubled)
            for name, loops in list(read_by.items()):
                loops.difference_update([done for done in list(loops) if done.finished])
                if not loops:
                    del read_by[name]
            self._read_by_limit = max(64, 2 * len(read_by))
        read_by.setdefault(topic, set()).add(shared)

    def _begin(self, consumer: KafkaConsumer, loop: ConsumerLoop, share: tuple,
               attempt: int = 0) -> None:
        """Hand ``consumer``'s loop to its shared thread (:meth:`_share`)
        once its topic exists."""
        def ready(_result: Any) -> None:
            if consumer in self._consumers:
                if attempt:
                    log.info("Kafka consumer {name}: its topic exists now", name=loop.name)
                consumer.loop = loop
                loop.want_paused = consumer._paused
                self._expected.pop(consumer, None)
                self._share(share, loop, consumer.topic)

        def failed(failure: Failure) -> None:
            if consumer in self._consumers and self.running:
                if not attempt:
                    log.warn("Kafka consumer {name}: {error}; retrying every {delay} s",
                             name=loop.name, error=failure.value, delay=CREATE_RETRY_DELAY)
                self.clock.callLater(CREATE_RETRY_DELAY, self._begin, consumer, loop, share,
                                     attempt + 1)

        self._when_ready(consumer.topic).addCallbacks(ready, failed)

    def _take_own(self, consumer: KafkaConsumer) -> bool:
        """Have ``consumer`` take this node's records of its topic on
        acknowledgement (:meth:`~.consumer.KafkaConsumer.hand_own`).

        A compacted topic takes part too: Kafka's log cleaner never
        compacts the records younger than ``min.compaction.lag.ms`` (nor the
        active segment), so the head of a partition, where this node's
        records land, has no holes; a record after an older hole is simply
        held until the fetch brings it.

        :returns: False when the driver does not report where a record
            landed (kafka-python)."""
        if not getattr(self.driver, "LOCATES", False) or consumer.stopped:
            return False
        self._takers.setdefault(consumer.topic, []).append(consumer)
        return True

    def _forget(self, consumer: KafkaConsumer) -> None:
        takers = self._takers.get(consumer.topic)
        if takers is not None and consumer in takers:
            takers.remove(consumer)
            if not takers:
                del self._takers[consumer.topic]
        self._consumers.discard(consumer)
        self._keys.pop(consumer, None)
        self._group_ids.pop(consumer, None)
        expected = self._expected.pop(consumer, None)
        if expected is not None:  # stopped before its topic existed
            expected[0].forget(expected[1])
