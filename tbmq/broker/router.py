"""The publish pipeline (ARCHITECTURE §1): every message goes to the bus
topic ``tbmq.msg.all`` (key = topic name); the consumer of that topic matches
it in the subscription trie once and hands it to each matched session.
Retained messages also go to ``tbmq.msg.retained``, which every node consumes
in its own group to keep its retained tree and store current.

The same code runs in a cluster of one (in-process bus) and of many (Kafka):
only the bus differs.
"""

from __future__ import annotations

from functools import partial
from operator import attrgetter

from twisted.logger import Logger

from tbmq.broker.retained import RetainedTree
from tbmq.broker.trie import SubscriptionTrie
from tbmq.cluster.completion import Completion, publish_each
from tbmq.cluster.records import RUN_MAX_BYTES, RUN_MAX_MESSAGES, Delivery, DeliveryRun
from tbmq.cluster.sinks import Sinks
from tbmq.cluster.topics import CLUSTER_BUNDLE, node_group
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import ClientType, Message, SubscriptionOptions

#: ``payload`` of a :class:`~tbmq.model.Message` (the run checks in C)
_payload = attrgetter("payload")
_topic = attrgetter("topic")
_retain = attrgetter("retain")


class SharedGroup:
    """The members of one shared subscription ``$share/<group>/<filter>``;
    each message goes to one of them [MQTT-4.8.2]: round robin among DEVICE
    members, or, when every member is a persistent APPLICATION, through
    ``tbmq.msg.app.shared.<filter>`` read by the members' consumer group
    (TBMQ's rule).

    :ivar name: the share name.
    :ivar topic_filter: the filter without ``$share/<group>/``.
    :ivar members: client id → options, in subscription order.
    """

    __slots__ = ("name", "topic_filter", "members", "_cursor")

    def __init__(self, name: str, topic_filter: str = "") -> None:
        self.name = name
        self.topic_filter = topic_filter
        self.members: dict[str, SubscriptionOptions] = {}
        self._cursor = 0

    def pick(self, online) -> tuple[str, SubscriptionOptions] | None:
        """The next member, preferring members with a live connection.

        :param online: ``callable(client_id) -> bool``.
        """
        members = list(self.members.items())
        n = len(members)
        if not n:
            return None
        start = self._cursor % n
        for i in range(n):
            candidate = members[(start + i) % n]
            if online(candidate[0]):
                self._cursor = start + i + 1
                return candidate
        self._cursor = start + 1
        return members[start]


class DeliveryGroup:
    """The deliveries of a batch to one sink and place (``(sink, where)``
    of :attr:`Gathered.groups`), sent with one
    :meth:`~tbmq.cluster.sinks.BusSink.send_many`; also the entry of
    :attr:`Gathered.targets` of each client whose class sends there one
    :class:`~tbmq.cluster.records.Delivery` per message (a sink that does
    not take runs, or not at the delivery's QoS).

    :ivar keys: the client id of each of :attr:`values`.
    :ivar values: the records, in the order routed.
    """

    __slots__ = ("keys", "values")

    #: A group keeps its place in :attr:`Gathered.targets` for the batch.
    lasts = True

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.values: list = []

    def join(self, client_id: str, message: Message, qos: int, retain: bool,
             sids: tuple) -> bool:
        """Append a delivery of ``message`` to ``client_id``.

        :returns: True."""
        self.keys.append(client_id)
        self.values.append(Delivery(client_id, message, qos, retain, sids))
        return True

    def join_many(self, client_id: str, messages: list, start: int, qos: int, retain: bool,
                  sids: tuple) -> int:
        """:meth:`join` of each of ``messages[start:]``, in order.

        :returns: how many joined: all of them."""
        for message in messages[start:]:
            self.join(client_id, message, qos, retain, sids)
        return len(messages) - start


class NewestRecord:
    """A client's newest record of a batch to a sink that takes runs, an
    entry of :attr:`Gathered.targets`: its first
    :class:`~tbmq.cluster.records.Delivery`, at ``values[index]`` of its
    :class:`DeliveryGroup`, until a second message makes it a
    :class:`~tbmq.cluster.records.DeliveryRun` in that place (a client with
    one message in the batch sends a lone Delivery).

    :ivar values: the group's records.
    :ivar index: where the record is in :attr:`values`.
    :ivar run: the run once there is one (its ``messages`` a list while
        gathered), else None.
    """

    __slots__ = ("values", "index", "run")

    #: A newer record of the client takes its place.
    lasts = False

    def __init__(self, values: list, index: int) -> None:
        self.values = values
        self.index = index
        self.run = None

    def join(self, client_id: str, message: Message, qos: int, retain: bool,
             sids: tuple) -> bool:
        """Append ``message`` to the record: the run's messages, or, to the
        first delivery, a run of its message and ``message`` in its place.

        :returns: False, nothing changed, when ``message`` has another QoS,
            RETAIN flag or subscription identifiers than the record, or the
            record is full (:data:`RUN_MAX_MESSAGES`, :data:`RUN_MAX_BYTES`
            of payload)."""
        run = self.run
        if run is not None:
            size = run.size + len(message.payload)
            if not (run.qos == qos and run.retain == retain and size <= RUN_MAX_BYTES
                    and len(run.messages) < RUN_MAX_MESSAGES and (
                        run.subscription_ids is sids or run.subscription_ids == sids)):
                return False
            run.messages.append(message)
            run.size = size
            return True
        first = self.values[self.index]
        size = len(first.message.payload) + len(message.payload)
        if not (first.qos == qos and first.retain == retain and size <= RUN_MAX_BYTES and (
                first.subscription_ids is sids or first.subscription_ids == sids)):
            return False
        run = self.run = self.values[self.index] = DeliveryRun(
            client_id, [first.message, message], qos, retain, sids)
        run.size = size
        return True

    def join_many(self, client_id: str, messages: list, start: int, qos: int, retain: bool,
                  sids: tuple) -> int:
        """:meth:`join` of ``messages[start:]`` (of one QoS and RETAIN flag,
        in order) for as many as the record takes, the run's limits checked
        once for all of them when they fit (the usual case).

        :returns: how many of them joined, from ``messages[start]`` on (0:
            none, as :meth:`join` returning False)."""
        run = self.run
        i = start
        if run is None:
            if not self.join(client_id, messages[i], qos, retain, sids):
                return 0
            run = self.run
            i += 1
        elif not (run.qos == qos and run.retain == retain and (
                run.subscription_ids is sids or run.subscription_ids == sids)):
            return 0
        end = min(len(messages), i + RUN_MAX_MESSAGES - len(run.messages))
        if i < end:
            take = messages[i:end]
            size = run.size + sum(map(len, map(_payload, take)))
            if size <= RUN_MAX_BYTES:
                run.messages.extend(take)
                run.size = size
                return end - start
            for message in take:  # up to the byte limit
                if not self.join(client_id, message, qos, retain, sids):
                    break
                i += 1
        return i - start


class Gathered:
    """The deliveries of one batch of ``tbmq.msg.all`` (:meth:`Router._on_messages`)
    that go to bus sinks, gathered to be sent with one
    :meth:`~tbmq.cluster.sinks.BusSink.send_many` per sink and place.

    :ivar groups: ``(sink, where)`` → :class:`DeliveryGroup`, in the order
        the batch routed them.
    :ivar targets: ``(QoS 0 targets, QoS 1/2 targets)``, each client id →
        an entry whose ``join(client_id, message, qos, retain, subscription
        ids)`` appends a delivery or returns False (then the delivery is
        classified: :meth:`Router._to_sink`): its :class:`DeliveryGroup`,
        or, for a sink that takes runs at the delivery's QoS
        (:attr:`~tbmq.cluster.sinks.BusSink.runs` and ``run_qos``: a node's
        downlink; ``tbmq.msg.persisted``; a persistent APPLICATION client's
        topic at QoS 1 on Kafka), the client's newest record there, a
        :class:`NewestRecord`.  A new record there takes the place of an
        older one of the same group (``(sink, where)``) in the other class
        too (where a message of that class finds a record of another QoS and
        is classified again): only the newest record of a client in a group
        grows, so its messages keep their order there.
        A client that is not written to at once (no session here, or a
        persistent one at QoS 1/2: an APPLICATION client's topic, a
        DEVICE's store) is classified once per batch and QoS class (its
        class cannot change while the batch is routed: the registry and
        the sessions change in other reactor calls); its later
        deliveries are appended to the group found, or its messages to the
        run when they have the run's QoS, RETAIN flag and subscription
        identifiers (else a new run starts, so the client's messages keep
        their order).  Deliveries to the device store under
        ``mqtt.rate_limits.device_persisted_messages`` are not kept here
        (each is admitted on its own).
    """

    __slots__ = ("groups", "targets")

    def __init__(self) -> None:
        self.groups: dict[tuple, DeliveryGroup] = {}
        self.targets: tuple[dict, dict] = ({}, {})

    def add(self, sink, where: str, delivery: Delivery, keep: bool) -> None:
        """Append ``delivery`` to the group of ``(sink, where)``.

        :param keep: whether the delivery's client and class keep an entry
            in :attr:`targets` for their next deliveries of the batch."""
        groups = self.groups
        group = groups.get((sink, where))
        if group is None:
            group = groups[(sink, where)] = DeliveryGroup()
        client_id = delivery.client_id
        group.keys.append(client_id)
        values = group.values
        if keep:
            targets = self.targets
            qos = delivery.qos
            if sink.runs and qos <= sink.run_qos:  # its next message makes this a run
                first = targets[qos != 0][client_id] = NewestRecord(values, len(values))
                other = targets[qos == 0]
                older = other.get(client_id)
                # an older record of the same group: not to grow (one of
                # another sink or place keeps its order there)
                if older is None or (not older.lasts and older.values is values):
                    other[client_id] = first
            else:
                targets[qos != 0][client_id] = group
        values.append(delivery)


class Router:
    """Matches each message of ``tbmq.msg.all`` once and classifies its
    targets; the sinks of :mod:`tbmq.cluster.sinks` deliver.

    :param bus: the :class:`tbmq.interfaces.IMessageBus`.
    :param topics: the :class:`tbmq.cluster.topics.TopicCatalogue`.
    :param service_id: this node's service id.
    :param clock: ``IReactorTime``.
    :param retained_store: the :class:`tbmq.interfaces.IRetainedStore`.
    :param sessions: client id → the sessions of this node.
    :param lookup: ``client_id -> SessionInfo or None``: what the cluster
        knows of a client without a session here (the session registry).
    :param sinks: the node's :class:`~tbmq.cluster.sinks.Sinks` (built on
        ``bus`` when None).
    :ivar trie: topic filter → ``{client id: SubscriptionOptions}``: the
        plain subscriptions.
    :ivar shared: topic filter → ``{share name: SharedGroup}``: the shared
        subscriptions, kept apart so that nothing tests what a value is.
    :ivar retained: the retained tree.
    :ivar persisted_limit: the node's :class:`tbmq.broker.limits.NodeLimits`
        when ``mqtt.rate_limits.device_persisted_messages`` is enabled, else
        None: a delivery for a persistent DEVICE's store over it is not
        stored (TBMQ's).
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, bus, topics, service_id: str, clock, retained_store,
                 sessions, lookup=lambda client_id: None, sinks: Sinks | None = None) -> None:
        self.bus = bus
        self.topics = topics
        self.service_id = service_id
        self.clock = clock
        self.retained_store = retained_store
        self.sessions = sessions
        self.lookup = lookup
        self.trie = SubscriptionTrie()
        self.shared = SubscriptionTrie()
        self.retained = RetainedTree()
        self.sinks = sinks if sinks is not None else Sinks.build(bus, topics)
        self.persisted_limit = None
        self.consumer = None
        self._msg_all = topics.msg_all
        self._seconds = clock.seconds

    def start(self):
        """Join the consumer groups of ``tbmq.msg.all`` (one group for the
        whole cluster, in the cluster bundle: see
        :data:`~tbmq.cluster.topics.CLUSTER_BUNDLE`) and
        ``tbmq.msg.retained`` (one group per node, read from the beginning:
        on Kafka a node that joins learns every retained message there).
        Where the bus can, this node's own messages of the ``tbmq.msg.all``
        partitions it routes are routed when acknowledged
        (:meth:`tbmq.interfaces.IConsumer.hand_own`).

        :returns: a Deferred that fires once ``tbmq.msg.retained`` is replayed.
        """
        bus = self.bus
        self.consumer = bus.subscribe(self.topics.msg_all, "tbmq-msg-all", self._on_message,
                                      bundle=CLUSTER_BUNDLE, batch_handler=self._on_messages)
        # this node's messages to the partitions it routes: routed as soon
        # as the bus acknowledges them, not when read back (Kafka, docs/bus.md)
        self.consumer.hand_own()
        self.retained_consumer = bus.subscribe(
            self.topics.msg_retained, node_group(self.service_id), self._on_retained,
            from_beginning=True, exclusive=True)
        return self.retained_consumer.caught_up

    # -- publish -------------------------------------------------------------

    def publish(self, message: Message, done) -> None:
        """Put ``message`` on the bus: ``tbmq.msg.all``, and
        ``tbmq.msg.retained`` too when it is retained.

        :param done: ``done(None | Failure)``, called exactly once (maybe
            during the call): with None once the message is durable (the bus
            holds it and, on the in-process bus, every persistent
            subscriber's store has it): only then may a QoS 1/2 publisher be
            acknowledged; or with the
            :class:`~twisted.python.failure.Failure` of the first of its
            publishes that failed, a :class:`tbmq.errors.BusError` (see
            :meth:`tbmq.interfaces.IMessageBus.publish`).
            :func:`tbmq.cluster.completion.deferred_done` makes a Deferred
            of it.
        """
        bus = self.bus
        if message.retain:
            both = Completion()
            bus.publish(self.topics.msg_retained, message.topic,
                        message if message.payload else None, (), both.part())
            bus.publish(self._msg_all, message.topic, message, (), both.part())
            both.then(done)
        else:
            bus.publish(self._msg_all, message.topic, message, (), done)

    def publish_many(self, messages: list, done) -> None:
        """Put ``messages`` (a run of one publisher's, in order) on the bus
        with **one** ``done``: as :meth:`publish` for each, but
        ``tbmq.msg.all`` gets them with one ``publish_many`` where the bus
        has one (the in-process bus: one waiter and one hand-off for the
        run, not a call each), and the retained ones go to
        ``tbmq.msg.retained`` one by one, before.

        :param messages: :class:`~tbmq.model.Message` each, at least one.
        :param done: ``done(None | Failure)``, called exactly once (maybe
            during the call): None once every message is durable, else the
            first failure (see :meth:`publish`).
        """
        bus = self.bus
        many = getattr(bus, "publish_many", None) or partial(publish_each, bus.publish)
        topics = list(map(_topic, messages))  # (no bytecode per message)
        if not any(map(_retain, messages)):
            many(self._msg_all, topics, messages, done)
            return
        sent = Completion()
        for message in messages:
            if message.retain:
                bus.publish(self.topics.msg_retained, message.topic,
                            message if message.payload else None, (), sent.part())
        many(self._msg_all, topics, messages, sent.part())
        sent.then(done)

    def _on_retained(self, record):
        message = record.value
        store = self.retained_store
        if message is not None and message.payload:
            stored = Message(message.topic, message.payload, message.qos, True,
                             message.properties, message.publisher,
                             message.received_at, message.expires_at)
            self.retained.set(stored)
            return store.put(stored)
        # an empty retained payload clears the topic [MQTT-3.3.1-6]
        if self.retained.remove(record.key) is not None:
            return store.remove(record.key)
        return None

    def _on_message(self, record):
        """The consumer of ``tbmq.msg.all``: :meth:`route` its message.

        :returns: None, or a :class:`~tbmq.cluster.completion.Completion`
            (see :meth:`route`).
        """
        return self.route(record.value, None)

    def _on_messages(self, messages: list):
        """The consumer of ``tbmq.msg.all``, a batch of records (a packed
        record's): :meth:`route` each of ``messages`` in order, their
        publishes under one completion.

        On a bus with ``publish_many`` (Kafka, the in-process bus:
        :attr:`~tbmq.cluster.sinks.BusSink.sends_many`), the deliveries to
        one sink and place (a node's downlink, the persisted topic) are
        gathered while the batch is routed and sent with one
        :meth:`~tbmq.cluster.sinks.BusSink.send_many` each, in order: one
        call and one outcome for all of them.

        :returns: None, or a :class:`~tbmq.cluster.completion.Completion`
            of every record sent for them: the batch commits once all are
            durable, and is read again when one fails.
        """
        pending = None
        route = self.route
        if len(messages) == 1 or not self.sinks.downlink.sends_many:
            # nothing to gather: one message, or a bus that publishes one by one
            for message in messages:
                pending = route(message, pending)
            return pending
        gathered = Gathered()
        # one clock read, one look at the shared subscriptions for the batch
        # (routing changes neither: subscriptions change in other reactor calls)
        now = self._seconds()
        match = None if len(self.shared) else self.trie.match
        dispatch = self._dispatch_one
        last = None  # the topic matched last (a publisher's run: one topic, matched once)
        n = len(messages)
        i = 0
        while i < n:
            message = messages[i]
            i += 1
            if match is not None:  # no shared subscription: the plain filters only
                topic = message.topic
                if topic != last:
                    matches = match(topic)
                    last = topic
                if len(matches) == 1:  # the usual case: one filter
                    # the messages after it of its topic, QoS and RETAIN
                    # flag: routed together (one pass over the filter's
                    # subscribers for the run)
                    j = i
                    qos, retain = message.qos, message.retain
                    while j < n:
                        other = messages[j]
                        if other.topic != topic or other.qos != qos or other.retain != retain:
                            break
                        j += 1
                    if j > i:
                        pending = self._dispatch_run(matches[0], messages[i - 1:j], pending,
                                                     gathered, now)
                        i = j
                        continue
                    pending = dispatch(matches[0], message, pending, gathered, now)
                    continue
                if not matches:
                    continue
            pending = route(message, pending, gathered, now)
        for (sink, where), group in gathered.groups.items():
            sink.send_many(where, group.keys, group.values, pending.part())
        return pending

    def route(self, message: Message, pending: Completion | None,
              gathered: Gathered | None = None, now: float | None = None):
        """Deliver one message of ``tbmq.msg.all``: match once, then one target per
        client (at the highest QoS of its matching subscriptions, with all
        their identifiers [MQTT-3.3.4-2, -3, -4]), each to its sink.  A
        live session here is its own sink: written now.  A shared
        subscription gives one member per message [MQTT-4.8.2-2]; one whose
        members are all persistent APPLICATION clients gives one record on
        ``tbmq.msg.app.shared.<filter>``, which each share group reads in a
        consumer group of its own.

        :param pending: the completion of the records sent so far for the
            same batch, or None.
        :param gathered: None to send each delivery at once; or, for a batch
            (:meth:`_on_messages`), the batch's :class:`Gathered` that this
            call appends to, sent by the caller.
        :param now: the clock's seconds, read once for a batch (None: read here).
        :returns: ``pending``, or a new
            :class:`~tbmq.cluster.completion.Completion` when it was None
            and a record was sent: the records sent to the sinks (maybe
            complete already); the consumer commits the record once every
            one of them is durable, and reads it again when one fails.
        """
        topic = message.topic
        matches = self.trie.match(topic)
        groups = self.shared.match(topic) if len(self.shared) else None
        if not groups:
            if not matches:
                return pending
            if len(matches) == 1:
                return self._dispatch_one(matches[0], message, pending, gathered, now)
        targets, filters = self._targets(matches, groups, message)
        for topic_filter in filters:  # one record per filter
            if pending is None:
                pending = Completion()
            self.sinks.application_shared.send(
                topic_filter, topic, Delivery(topic_filter, message, message.qos,
                                              message.retain), pending.part())
        sessions = self.sessions
        # one target: encoded with its own packet id, nothing to share
        cache: dict | None = {} if len(targets) > 1 else None
        if now is None:
            now = self._seconds()
        retain = message.retain
        source = self.consumer
        for client_id, (qos, sids, rap) in targets.items():
            # live messages carry RETAIN 0 unless retain as published [MQTT-3.3.1-12]
            flag = retain and rap
            session = sessions.get(client_id)
            if session is not None and (qos == 0 or not session.persistent):
                session.outbox.deliver(message, qos, flag, sids, cache, now, source)
                continue
            if gathered is not None:
                entry = gathered.targets[qos != 0].get(client_id)
                if entry is not None and entry.join(client_id, message, qos, flag, sids):
                    continue
            pending = self._to_sink(client_id, session, message, qos, flag, sids, pending,
                                    gathered)
        return pending

    def _dispatch_one(self, subs: dict, message: Message, pending: Completion | None,
                      gathered: Gathered | None, now: float | None):
        """:meth:`route` for the plain subscriptions of one filter (the
        usual case: each client appears once), classified and handed over in
        one pass.

        :param now: the clock's seconds (None: read here)."""
        sessions = self.sessions
        publisher = message.publisher
        msg_qos = message.qos
        retain = message.retain
        cache: dict | None = {} if len(subs) > 1 else None
        if now is None:
            now = self._seconds()
        source = self.consumer
        for client_id, options in subs.items():  # nothing below changes subs
            if options.no_local and client_id == publisher:
                continue  # [MQTT-3.8.3-3]
            qos = options.qos if options.qos < msg_qos else msg_qos
            # live messages carry RETAIN 0 unless retain as published [MQTT-3.3.1-12]
            flag = retain and options.retain_as_published
            session = sessions.get(client_id)
            if session is not None and (qos == 0 or not session.persistent):
                session.outbox.deliver(message, qos, flag, options.subscription_ids, cache,
                                       now, source)
                continue
            if gathered is not None:
                entry = gathered.targets[qos != 0].get(client_id)
                if entry is not None and entry.join(client_id, message, qos, flag,
                                                    options.subscription_ids):
                    continue
            pending = self._to_sink(client_id, session, message, qos, flag,
                                    options.subscription_ids, pending, gathered)
        return pending

    def _dispatch_run(self, subs: dict, messages: list, pending: Completion | None,
                      gathered: Gathered, now: float):
        """:meth:`_dispatch_one` for ``messages`` (two or more of one topic,
        QoS and RETAIN flag, in order) of a batch: each subscriber of the
        filter classified once for all of them, a live session given them
        in order, a gathered target's record joined by the run at once
        (:meth:`NewestRecord.join_many`); each client gets the messages in
        their order.  A filter with a No Local subscriber is dispatched
        message by message (the publisher of each one decides)."""
        if any(options.no_local for options in subs.values()):
            dispatch = self._dispatch_one
            for message in messages:
                pending = dispatch(subs, message, pending, gathered, now)
            return pending
        sessions = self.sessions
        first = messages[0]
        msg_qos = first.qos
        retain = first.retain
        n = len(messages)
        # the encodings of each message shared by its subscribers (as in
        # _dispatch_one: one cache per message when there are several)
        caches = [{} for _ in messages] if len(subs) > 1 else None
        source = self.consumer
        for client_id, options in subs.items():  # nothing below changes subs
            qos = options.qos if options.qos < msg_qos else msg_qos
            # live messages carry RETAIN 0 unless retain as published [MQTT-3.3.1-12]
            flag = retain and options.retain_as_published
            sids = options.subscription_ids
            session = sessions.get(client_id)
            if session is not None and (qos == 0 or not session.persistent):
                deliver = session.outbox.deliver
                for k in range(n):
                    deliver(messages[k], qos, flag, sids, caches[k] if caches else None, now,
                            source)
                continue
            targets = gathered.targets[qos != 0]
            k = 0
            while k < n:
                entry = targets.get(client_id)
                if entry is not None:
                    joined = entry.join_many(client_id, messages, k, qos, flag, sids)
                    if joined:
                        k += joined
                        continue
                pending = self._to_sink(client_id, session, messages[k], qos, flag, sids,
                                        pending, gathered)
                k += 1
        return pending

    def _to_sink(self, client_id: str, session, message: Message, qos: int, retain: bool,
                 sids: tuple, pending: Completion | None,
                 gathered: Gathered | None) -> Completion | None:
        """A target that is not a live session here at its QoS, classified
        once (:meth:`classify`) and handed to its sink as a
        :class:`~tbmq.cluster.records.Delivery`.

        :param session: the local session of ``client_id``, or None.
        :param pending: the record's completion so far, or None.
        :param gathered: None, or the batch's :class:`Gathered` (see
            :meth:`route`): the delivery is appended there, not sent, and
            the target's group kept for the batch's later deliveries.
        :returns: ``pending`` (made when None) with the sink's publish as
            one more part, or ``pending`` as it was when nothing is sent.
        """
        sink, where = self.classify(client_id, session, qos)
        if sink is None:
            if qos and session is None and self.lookup(client_id) is None:
                # matched, but no node knows the session: rare, worth a trace
                self.log.debug("QoS {qos} delivery on {topic} to {client_id} dropped: the "
                               "session registry does not know it", qos=qos,
                               topic=message.topic, client_id=client_id)
            return pending
        limit = self.persisted_limit
        if limit is not None and sink is self.sinks.persisted \
                and not limit.admit_persisted(client_id):
            return pending
        if pending is None:
            pending = Completion()
        delivery = Delivery(client_id, message, qos, retain, sids)
        if gathered is None:
            sink.send(where, client_id, delivery, pending.part())
        else:
            gathered.add(sink, where, delivery,
                         limit is None or sink is not self.sinks.persisted)
        return pending

    def classify(self, client_id: str, session, qos: int) -> tuple:
        """Where a delivery at ``qos`` to ``client_id`` goes when it is not
        written to a live session here (TBMQ's rules, ARCHITECTURE §1.3): a
        persistent session at QoS 1/2 (here or elsewhere) to its store
        (DEVICE) or topic (APPLICATION), a live session on another node to
        that node's downlink, and nobody online to nothing.

        :param session: the local session of ``client_id``, or None.
        :returns: ``(sink, where)``: a :class:`~tbmq.cluster.sinks.BusSink`
            of :attr:`sinks` and its parameter (a service id or a client
            id), or ``(None, None)``.
        """
        sinks = self.sinks
        if session is not None:
            kind = session.client_type
        else:
            info = self.lookup(client_id)
            if info is None:
                return None, None
            if qos == 0 or not info.persistent:
                if not info.connected:
                    return None, None  # a non-persistent or QoS 0 delivery to nobody
                return sinks.downlink, info.service_id
            kind = info.client_type
        if kind is ClientType.APPLICATION:
            return sinks.application, client_id
        return sinks.persisted, client_id

    def _targets(self, matches: list, groups: list | None,
                 message: Message) -> tuple[dict, list]:
        """The targets of several filters, merged per client.

        :returns: ``({client id: [qos, subscription ids, retain as
            published]}, [topic filters of share groups of persistent
            APPLICATION clients])``.
        """
        publisher = message.publisher
        msg_qos = message.qos
        merged: dict[str, list] = {}

        def add(client_id: str, options: SubscriptionOptions) -> None:
            qos = options.qos if options.qos < msg_qos else msg_qos
            target = merged.get(client_id)
            if target is None:
                merged[client_id] = [qos, options.subscription_ids,
                                     options.retain_as_published]
            else:
                if qos > target[0]:
                    target[0] = qos
                target[1] = target[1] + options.subscription_ids
                target[2] = target[2] or options.retain_as_published

        for subs in matches:
            for client_id, options in subs.items():  # nothing below changes subs
                if options.no_local and client_id == publisher:
                    continue  # [MQTT-3.8.3-3]
                add(client_id, options)
        filters: list[str] = []
        for by_name in groups or ():
            for group in by_name.values():
                if self._applications(group):
                    if group.topic_filter not in filters:
                        filters.append(group.topic_filter)
                    continue
                picked = group.pick(self._online)
                if picked is not None:
                    add(*picked)
        return merged, filters

    def _applications(self, group: SharedGroup) -> bool:
        """True when every member of ``group`` is a persistent APPLICATION."""
        sessions = self.sessions
        for client_id in group.members:
            session = sessions.get(client_id)
            if session is not None:
                if not session.persistent or session.client_type is not ClientType.APPLICATION:
                    return False
                continue
            info = self.lookup(client_id)
            if info is None or not info.persistent or info.client_type is not ClientType.APPLICATION:
                return False
        return True

    def _online(self, client_id: str) -> bool:
        session = self.sessions.get(client_id)
        if session is not None:
            return session.connection is not None
        info = self.lookup(client_id)
        return info is not None and info.connected

    # -- subscriptions ---------------------------------------------------------

    def add_subscription(self, client_id: str, topic_filter: str,
                         share: tuple[str, str] | None, options: SubscriptionOptions) -> bool:
        """Add or replace a subscription in the trie.

        :param share: ``(group, filter)`` for a shared subscription, else None.
        :returns: True when it did not exist before.
        """
        if share is None:
            return self.trie.add(topic_filter, client_id, options)
        group_name, real_filter = share
        group = self.shared.get(real_filter, group_name)
        if group is None:
            group = SharedGroup(group_name, real_filter)
            self.shared.add(real_filter, group_name, group)
        is_new = client_id not in group.members
        group.members[client_id] = options
        return is_new

    def remove_subscription(self, client_id: str, topic_filter: str,
                            share: tuple[str, str] | None) -> bool:
        """:returns: True when the subscription existed."""
        if share is None:
            return self.trie.remove(topic_filter, client_id) is not None
        group_name, real_filter = share
        group = self.shared.get(real_filter, group_name)
        if group is None or group.members.pop(client_id, None) is None:
            return False
        if not group.members:
            self.shared.remove(real_filter, group_name)
        return True

    def retained_for(self, topic_filter: str) -> list[Message]:
        """The live retained messages matching ``topic_filter``; expired ones
        are removed on the way [MQTT-3.3.2-5]."""
        messages = self.retained.match(topic_filter)
        if not messages:
            return messages
        now = self._seconds()
        live = []
        for message in messages:
            if message.expires_at is not None and message.expires_at <= now:
                self.retained.remove(message.topic)
                self.retained_store.remove(message.topic)
            else:
                live.append(message)
        return live
