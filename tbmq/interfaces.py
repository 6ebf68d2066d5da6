"""The contracts between the broker and its backends (zope.interface).

A backend is a plugin that provides one of these interfaces; the choice is
config (see :mod:`tbmq.hookspecs`).  The interfaces speak of topics, keys,
bytes and client ids, and of the records of :mod:`tbmq.model`, never of a
Kafka, Redis or SQL type.  Methods that touch storage return a
:class:`twisted.internet.defer.Deferred`; a backend must apply the calls it
receives for one client id in the order it received them (ARCHITECTURE §3,
per-session order).
"""

from __future__ import annotations

from zope.interface import Attribute, Interface


class IBackend(Interface):
    """Anything with a life cycle bound to the broker's service."""

    def start():
        """Open connections, create schema.

        :returns: a Deferred that fires when the backend is usable.
        """

    def stop():
        """Flush what is buffered and close.

        :returns: a Deferred that fires when everything accepted so far is
            durable and the backend is closed.
        """


class IMessageBus(IBackend):
    """The bus that carries TBMQ's topic catalogue (``tbmq.msg.all``, the
    downlinks, the session topics; :mod:`tbmq.cluster.topics`): in-process
    in the embedded default, Kafka in a cluster.  See ``docs/bus.md`` for the
    contract, which ``tests/contract/test_bus.py`` checks on every bus.

    A record is a topic, a key (``str``; the partition key), a value and
    headers.  On a bus that ``encodes``, every value crosses it as the bytes
    of its topic's codec (:mod:`tbmq.cluster.records`: one documented,
    versioned msgpack encoding per record type) and each consumer gets the
    decoded object; the in-process bus in its direct mode hands the
    published object itself to the consumers (the hot path).  Consumers see
    the same object type either way.

    Delivery is at least once: a consumer commits a record only after its
    handler's result (None, a Deferred or a
    :class:`tbmq.cluster.completion.Completion`) has fired with success;
    records of one key arrive in publish order (one partition per key).
    """

    encodes = Attribute(
        "bool: True when every value is encoded on publish and decoded for "
        "each consumer (Kafka; the in-process bus in its encoding mode)."
    )

    packs = Attribute(
        "bool: True when the bus carries the records published together in "
        "one (Kafka's packed records, docs/bus.md), so that a consumer's "
        "batch_handler gets them in one call; False when each record is "
        "handed on its own, during the publish when nothing waits (the "
        "in-process bus)."
    )

    catalogue = Attribute(
        "the tbmq.cluster.topics.TopicCatalogue whose names this bus carries "
        "(its prefix: kafka.topic_prefix on Kafka); the node names every "
        "topic through it."
    )

    def publish(topic, key, value, headers=(), done=None):
        """Append a record to ``topic``, partitioned by ``key``.

        :param topic: the bus topic name, ``str`` (prefix already applied).
        :param key: the partition key, ``str`` (a topic name or client id),
            or None (any partition).
        :param value: the record object of the topic's type (see
            :meth:`tbmq.cluster.topics.TopicCatalogue.codec_for`), or None (a tombstone:
            "this key has no value any more").
        :param headers: ``tuple[tuple[str, bytes], ...]``.
        :param done: ``done(outcome) -> None`` or None.  When given, the bus
            calls it **exactly once**, in the reactor thread, possibly
            synchronously during this call: with ``outcome`` None once the
            bus holds the record as durably as it promises (below), or with
            a :class:`twisted.python.failure.Failure` of the errors below.
            No Deferred is made (the hot path of a cluster: one message,
            one callable, :class:`tbmq.cluster.completion.Completion` for
            several).  ``done`` should not raise: what it raises when called
            later is logged by the bus, during the call it reaches the
            caller.
        :returns: None when ``done`` is given.  Otherwise a Deferred that
            fires with None (or fails) as ``done`` would be called; the
            in-process bus may return None instead, meaning the record was
            held during the call (no Deferred on the hot path,
            ARCHITECTURE §3).

        "Durable": Kafka once the brokers acknowledged the record
        (``acks=all``); the in-process bus once every consumer group of the
        topic has handled it (each handler's result fired), so a consumer
        that persists the record (the device store) has stored it — except
        on a durable topic (``tbmq.msg.app.*``, the session topics), which
        holds the record itself once its topic log stored it, as Kafka
        does.

        Failures, all :class:`tbmq.errors.BusError` (never raised by the
        call): :class:`~tbmq.errors.BusClosedError` (bus not started or
        stopped), :class:`~tbmq.errors.RecordEncodingError` (the value does
        not fit the topic's codec), :class:`~tbmq.errors.ConsumerFailedError`
        (in-process: a handler failed, the record is not committed for its
        group) or :class:`~tbmq.errors.BusPublishError` (the bus refused or
        timed out).
        """

    def subscribe(topic, group, handler, from_beginning=False, exclusive=False, bundle=None,
                  batch_handler=None):
        """Consume ``topic`` as one member of consumer group ``group``.

        The topic's partitions are shared among the group's live members;
        every group gets every record.  A new group starts at the end of
        the topic, except on the durable topics (the session and
        subscription topics, ``tbmq.msg.app.*``) where it starts at the
        first record held: what waited for a client is its.

        :param handler: ``handler(record) -> None | Deferred |
            Completion`` with ``record`` a
            :class:`tbmq.cluster.records.Record` (``value`` decoded);
            called in the reactor thread, in partition order, never
            re-entered for the same consumer.  The record is committed once
            the result has fired with success (None: at once; a
            :class:`tbmq.cluster.completion.Completion`, maybe complete
            already: once its parts are all done); a failure, or a handler
            that raises, leaves it uncommitted (it is handed again, to this
            member after a delay or to the group's next member after a
            rebalance or restart).
        :param from_beginning: start at the first record the bus holds
            instead of the group's committed offset (TBMQ replays the
            session topics from the beginning at every start; compaction
            and ``latest`` offsets are never relied upon).
        :param exclusive: the caller promises that the group never has
            more than one live member (a group of one node, or of the one
            connection of one client).  A bus may then give that member
            every partition at once, without a group join (Kafka: the
            partitions assigned directly, reading from the group's committed
            offsets, which takes milliseconds where a join takes seconds);
            the in-process bus ignores it.
        :param bundle: ``str`` or None: the name of a set of groups, one
            per topic, that the nodes join together (TBMQ's cluster-wide
            groups, :data:`tbmq.cluster.topics.CLUSTER_BUNDLE`).  A bus may
            then read a node's subscriptions of one bundle with one client,
            as one member of one group over their topics (Kafka: one
            consumer, one fetch for all; the group is joined once for the
            subscriptions made together, a later one costs a rebalance).
            Each subscription keeps its own records, commits, pause,
            ``caught_up`` and stop.  Another group may not take a topic of
            the bundle (:class:`ValueError`, where the bus can tell).  The
            in-process bus ignores it, and so does ``exclusive``.
        :param batch_handler: ``batch_handler(values) -> None | Deferred |
            Completion | Progress``, or None.  A bus that carries several
            records in one (Kafka's packed records, ``docs/bus.md``) may
            hand their decoded values (a ``list``, in partition order) in
            one call instead of one by one to ``handler``: the same rules,
            with the one result committing (or failing: all of them are
            handed again) the whole batch.  A
            :class:`~tbmq.cluster.completion.Progress` commits the batch's
            records as its leading run of finished records grows (a packed
            record as a whole, once all of it finished).  The in-process bus
            hands it the records that waited for the member in one
            partition; Kafka also the single records of one partition a
            poll brought in a row.
        :returns: an :class:`IConsumer`.
        """

    def delete_topic(topic):
        """Delete ``topic`` with its records and every group's offsets on it
        (TBMQ's ``TbQueueAdmin.deleteTopic``: the ``tbmq.msg.app.<clientId>``
        topic of a persistent APPLICATION session that ended, when
        ``kafka.enable_topic_deletion`` is on).  A topic that does not
        exist is deleted already.  The caller makes sure nobody consumes it
        any more; a later ``publish`` or ``subscribe`` creates it again,
        empty.

        :param topic: the bus topic name (the catalogue's prefix applied).
        :returns: a Deferred firing with None once the topic is gone (Kafka:
            the DeleteTopics request answered, run in a thread); failing
            with :class:`ValueError` (in-process: a member of this bus still
            consumes it), :class:`~tbmq.errors.BusClosedError` (Kafka: the
            bus is not running) or :class:`~tbmq.errors.BusError` (the request
            failed or timed out).
        """


class IDescribableBus(Interface):
    """An optional method of an :class:`IMessageBus` (both Kafka drivers and
    the in-process bus have it; the admin API's ``/api/kafka`` answers 501
    for a bus without it)."""

    def describe():
        """What the bus holds, for operators.

        Runs no blocking call in the reactor thread (Kafka: admin requests
        in a pool thread, with an admin client of their own).

        :returns: a Deferred firing with ``{"bus": "kafka" | "in-process",
            "driver": str | None, "topics": [{"name", "partitions",
            "latest_offsets"}], "groups": [{"group", "state", "members",
            "committed": [{"topic", "partition", "offset"}]}], "errors":
            [str]}``: the cluster's topics (prefix included) with the offset
            the next record of each partition gets (None where not known);
            the consumer groups that read them, their state (lower-case,
            ``"stable"``, ``"empty"``..., or None), live members (None where
            the bus cannot tell) and committed offsets; what could not be
            read, one line each.  Fails with
            :class:`~tbmq.errors.BusClosedError` when the bus is not
            running, or the client's error when nothing could be read.
        """


class IConsumer(Interface):
    """One member of a consumer group (see :meth:`IMessageBus.subscribe`)."""

    group = Attribute("str: the consumer group.")
    topic = Attribute("str: the topic consumed.")
    caught_up = Attribute(
        "Deferred: fires with None once the consumer has handled (and its "
        "handlers' results fired for) every record the topic held when it "
        "joined; a session registry waits for it before the node accepts "
        "clients."
    )

    def pause():
        """Stop handing records to the handler (back-pressure); records that
        arrive meanwhile wait in the bus.  Idempotent."""

    def resume():
        """Hand records again, starting with those that waited.  Idempotent."""

    def hand_own():
        """Ask for the records this node publishes to the member's
        partitions to be handed once the bus acknowledged them, rather than
        when they are read back (``docs/bus.md``, "Own records, handed on
        acknowledgement"): the same records, in offset order, each once;
        commits are unchanged.  The router asks it for ``tbmq.msg.all``,
        the session events for their requests, the session registry for
        ``tbmq.client.session``.

        :returns: ``bool``: True when the bus does it from now on (the
            Kafka bus with a driver that reports where a record landed),
            False when records are handed
            as before (kafka-python; the in-process bus, which hands a
            record in process as soon as it is published anyway).
        """

    def decides(key):
        """Whether a record published now with ``key`` (``str``) would go
        to a partition that this member hands now and has read to its end
        (nothing of it waiting here): then this member is the one that
        reads it, after every record of the partition it knew of.  The
        session events decide such a connect request of their own node at
        once, without publishing it (``docs/bus.md``, "The CONNECT path in
        batches").

        :returns: ``bool``; False too while the bus cannot tell that its
            brokers answer (the Kafka bus: no record of this node
            acknowledged within the last 0.5 s, or one failed since; the
            in-process bus: once stopped).  The in-process bus reads its
            partition to the end when every record of it was handled and
            its result fired (the group's committed offset is the
            partition's end), and decides nothing during the member's own
            handler.
        """

    def lag():
        """:returns: ``int``, records of this member's partitions that its
        group has not committed yet (not handed yet, or handed and their
        results not all fired); a Kafka consumer counts the records it has
        not read from the high watermarks of its last fetches, so the figure
        may be a second old.  For the operations metrics."""

    def stop():
        """Leave the group: the member's partitions go to the other members,
        from the group's committed offsets.

        :returns: a Deferred firing with None once the member is gone.
        """


class ITopicLog(IBackend):
    """Where the in-process bus keeps the records of its durable topics
    (the session and subscription topics, ``tbmq.msg.app.<clientId>``) so
    that a restart of the embedded node replays them, as Kafka would.
    SQLite in the embedded default (one file with the other stores).

    Values are the encoded bytes of :mod:`tbmq.cluster.records` (None for a
    tombstone); headers ``tuple[tuple[str, bytes], ...]``.  Calls are applied
    in the order they are made.
    """

    def append(records):
        """Store ``records``: a list of
        ``(topic, partition, offset, key, value, headers, compacted)``
        and of :class:`~tbmq.backends.topic_records.RecordRun` (records of
        one partition at consecutive offsets, without headers, not
        compacted: one item for the run; the bus gives the records a turn
        routed to one APPLICATION client so).
        ``compacted`` (bool) means the topic keeps the last record per key
        only: an earlier record of the same ``(topic, key)`` is replaced, and
        a tombstone (``value`` None) removes the key.

        :returns: Deferred firing with None when durable.
        """

    def commit(group, topic, partition, offset):
        """Record that consumer group ``group`` has handled every record of
        ``(topic, partition)`` below ``offset`` (the next offset to read).

        :returns: Deferred firing with None when durable.
        """

    def truncate(topic, partition, before):
        """Forget the records of ``(topic, partition)`` whose offset is
        below ``before`` (every group has committed past them).

        :returns: Deferred firing with None when durable.
        """

    def write(records, commits, truncates):
        """What a reactor turn of the bus writes, in **one** durable step
        (one transaction of the SQLite topic log): :meth:`append` of
        ``records`` (when any), then :meth:`commit` of each of ``commits``,
        then :meth:`truncate` of each of ``truncates``, applied as those
        calls in that order would be.

        :param records: as for :meth:`append` (may be empty).
        :param commits: ``{(group, topic, partition): offset}``.
        :param truncates: ``{(topic, partition): before}``.
        :returns: Deferred firing with None once all of it is durable, or
            failing with nothing of it stored (:class:`TypeError` or
            :class:`ValueError` for a malformed record, the store's error).
        """

    def delete_topic(topic):
        """Forget ``topic``: its records and every group's offsets on it.

        :returns: Deferred firing with None when durable.
        """

    def load():
        """Everything kept.

        :returns: Deferred firing with ``(records, offsets)``: ``records`` a
            list of ``(topic, partition, offset, key, value, headers)`` in
            ``(topic, partition, offset)`` order; ``offsets`` a dict
            ``{(group, topic, partition): offset}``.
        """


class IRetainedStore(IBackend):
    """Retained messages, one per topic name [MQTT-3.3.1-5]."""

    def load_all():
        """:returns: Deferred firing with ``list[Message]``."""

    def put(message):
        """Store ``message`` (a :class:`tbmq.model.Message`) as the retained
        message of ``message.topic``, replacing the previous one.

        :returns: Deferred firing with None when durable.
        """

    def remove(topic):
        """Remove the retained message of topic name ``topic``, if any
        [MQTT-3.3.1-6].

        :returns: Deferred firing with None when durable.
        """


class IDeviceMessageStore(IBackend):
    """Messages queued for, or in flight to, persistent sessions (TBMQ's
    device persisted messages: Redis, PostgreSQL, or SQLite embedded).

    A store may keep at most ``max_messages_per_client`` deliveries per
    client (a constructor argument or setting of the backend; None means
    unlimited, the default): when :meth:`add` would exceed it, the oldest
    deliveries of that client -- lowest ``seq``, whatever their state --
    are removed, as TBMQ's Redis store trims its sorted set, and
    :meth:`add` reports how many so the caller can count the loss.
    """

    def add(client_id, deliveries):
        """Append ``deliveries`` (``list[StoredDelivery]``, increasing
        ``seq``) to the queue of ``client_id``; a delivery whose ``seq`` is
        stored already replaces it.

        :returns: Deferred firing, when durable, with the number (``int``,
            0 usually) of deliveries of ``client_id`` removed to keep it
            within ``max_messages_per_client``.  Adds merged into one write
            by the backend may report their removals together, on the last
            of them (the others fire with 0); the sum is exact.
        """

    def add_run(client_id, first_seq, messages, qos, retain=False, subscription_ids=()):
        """Append one delivery per message of ``messages`` (a sequence of
        :class:`tbmq.model.Message`, in order) to the queue of
        ``client_id``, with the order keys ``first_seq``, ``first_seq + 1``,
        ... (increasing), each at ``qos`` with ``retain`` and
        ``subscription_ids``, queued (no packet id): the same as :meth:`add`
        of those :class:`~tbmq.model.StoredDelivery`, in one call (the
        messages of one :class:`~tbmq.cluster.records.DeliveryRun` of
        ``tbmq.msg.persisted``).

        :returns: Deferred firing as :meth:`add`'s.
        """

    def update(client_id, seq, packet_id, state):
        """Record that delivery ``seq`` was sent with ``packet_id`` (int) and
        is now in ``state`` (:class:`tbmq.model.DeliveryState`).

        :returns: Deferred firing with None when durable.
        """

    def remove(client_id, seqs):
        """Remove the deliveries ``seqs`` (an iterable of int) of ``client_id``.

        :returns: Deferred firing with None when durable.
        """

    def load(client_id, after_seq=None, limit=None):
        """Read the queue of ``client_id``, a page at a time if need be.

        :param after_seq: only deliveries with ``seq > after_seq`` (int);
            all when None.  The last ``seq`` of a page is the
            ``after_seq`` of the next.
        :param limit: at most this many deliveries (int >= 0); all when
            None.
        :returns: Deferred firing with the ``list[StoredDelivery]`` in
            ``seq`` order; it fails with :class:`ValueError` for a negative
            ``limit``, :class:`TypeError` for a ``limit`` or ``after_seq``
            that is not an int.
        """

    def count(client_id):
        """:returns: Deferred firing with the number (``int``) of
        deliveries stored for ``client_id``."""

    def clear(client_id):
        """Remove every delivery of ``client_id``.

        :returns: Deferred firing with None when durable.
        """


class ICredentialStore(IBackend):
    """Client credentials (TBMQ's ``mqtt_client_credentials``): SQLite
    embedded, PostgreSQL in a cluster.  Records are
    :class:`tbmq.model.Credentials`."""

    def find(credentials_type, credentials_id):
        """:returns: Deferred firing with the :class:`Credentials` of that
        type and lookup key, or None."""

    def find_all(credentials_type):
        """:returns: Deferred firing with every ``Credentials`` of that type
        (X.509 CN regexes are matched by scanning them)."""

    def get(id):
        """:returns: Deferred firing with the ``Credentials`` of that id, or None."""

    def list():
        """:returns: Deferred firing with every ``Credentials``, by name."""

    def save(credentials):
        """Insert or replace by ``id``; sets ``updated_time`` (and
        ``created_time`` when new).

        :returns: Deferred firing with the saved ``Credentials``.
        :raises tbmq.errors.CredentialsError: (in the Deferred) when the name
            or the (type, credentials id) pair belongs to another record.
        """

    def delete(id):
        """:returns: Deferred firing with True when a record was removed."""

    def changed_since(version):
        """What changed after ``version`` (an opaque int; 0 at first).

        :returns: Deferred firing with ``(changed, deleted_ids, new_version)``
            where ``changed`` is a list of ``Credentials`` saved since.
        """
