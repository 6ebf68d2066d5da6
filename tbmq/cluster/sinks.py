"""Where a matched message goes for each kind of target (ARCHITECTURE §1.3):
each sink is one small class with one job.  The router
(:mod:`tbmq.broker.router`) matches and classifies; the sinks deliver.

===================================  =============================================
target                               sink
===================================  =============================================
non-persistent, connected here       the session itself (``Session.deliver``): written now
non-persistent, on node X            ``downlink`` :class:`BusSink`:
                                     ``tbmq.msg.downlink.basic.<X>``
persistent DEVICE (QoS 1/2)          ``persisted``: ``tbmq.msg.persisted`` →
                                     :class:`PersistedWriter` (device store) → the
                                     session here, or ``tbmq.msg.downlink.persisted.<X>``
persistent APPLICATION (QoS 1/2)     ``application``: ``tbmq.msg.app.<clientId>``,
                                     read by :class:`ApplicationReader` on the node
                                     where the client is connected
===================================  =============================================

A target on this node skips the downlink topic, as TBMQ's downlink proxy
does; :class:`DownlinkReader` hands what other nodes sent through the
downlink topics to the local sessions.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Mapping, NamedTuple

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq.backends.deliveries import run_deliveries
from tbmq.cluster.completion import Completion, deferred_done, publish_each
from tbmq.cluster.records import Delivery, DeliveryRun, Record, SessionMarker
from tbmq.errors import BackendError
from tbmq.log import OBSERVER as LOG_OBSERVER, debug_enabled
from tbmq.model import StoredDelivery
from tbmq.mqtt.topics import parse_shared_subscription

log = Logger(observer=LOG_OBSERVER)


class BusSink:
    """Sends records to one kind of bus topic, parameterised by the topic:
    the same class serves every target that is not a live session here
    (ARCHITECTURE §1.3):

    ==========================  ===============================================
    sink (:class:`Sinks`)       ``topic_of(where)``
    ==========================  ===============================================
    ``downlink``                ``tbmq.msg.downlink.basic.<serviceId>``: a
                                non-persistent client on node ``where``
    ``persisted``               ``tbmq.msg.persisted`` (whatever ``where``): a
                                persistent DEVICE, stored by
                                :class:`PersistedWriter` (a batch's messages
                                to one client as runs); also its
                                :class:`~tbmq.cluster.records.SessionMarker`
    ``application``             ``tbmq.msg.app.<clientId>``: a persistent
                                APPLICATION client ``where``
    ``application_shared``      ``tbmq.msg.app.shared.<filter>``: a share
                                group of persistent APPLICATION clients
    ==========================  ===============================================

    :param bus: the :class:`tbmq.interfaces.IMessageBus`.
    :param topic_of: ``where -> bus topic`` (``str -> str``).
    :param runs: True when the topic's record type takes a
        :class:`~tbmq.cluster.records.DeliveryRun` (a node's downlink,
        ``tbmq.msg.persisted``; a persistent APPLICATION client's topic): a
        batch's messages to one client there go as one run, not as a
        :class:`~tbmq.cluster.records.Delivery` each.
    :param run_qos: the highest QoS of a run (``int`` 0-2): a delivery of a
        higher QoS goes as a Delivery of its own.  An APPLICATION client's
        run is committed once the client acknowledged all of it, and comes
        again whole when its connection ends before: 1 there, so that a
        QoS 2 message completed is never sent again.
    """

    __slots__ = ("bus", "topic_of", "_publish_many", "sends_many", "runs", "run_qos")

    def __init__(self, bus, topic_of: Callable[[str], str], runs: bool = False,
                 run_qos: int = 2) -> None:
        self.bus = bus
        self.topic_of = topic_of
        self.runs = runs
        self.run_qos = run_qos
        #: the bus's ``publish_many(topic, keys, values, done)``, when it has one
        self._publish_many = getattr(bus, "publish_many", None)
        #: True when the bus publishes several records with one ``done``
        #: (``publish_many``: the Kafka bus, the in-process bus), so that
        #: :meth:`send_many` is cheaper than a :meth:`send` each
        self.sends_many = self._publish_many is not None

    def send(self, where: str, key: str, value, done=None):
        """Publish ``value`` (a record of the topic's type) with ``key`` to
        ``topic_of(where)``.

        :param done: ``done(None | Failure)`` or None: the bus's publish
            ``done`` (:meth:`tbmq.interfaces.IMessageBus.publish`), called
            exactly once, maybe during the call: on the in-process bus, a
            delivery to ``tbmq.msg.persisted`` is done once the device store
            has it, so the publisher's PUBACK waits for it; a Kafka publish
            once the brokers hold it.  A failure is a
            :class:`tbmq.errors.BusError`.
        :returns: None with ``done``; else the bus's publish result (None or
            a Deferred, as ``done`` would be called).
        """
        return self.bus.publish(self.topic_of(where), key, value, (), done)

    def send_many(self, where: str, keys: list, values: list, done) -> None:
        """Publish ``values`` (records of the topic's type) with ``keys``
        (``str`` each) to ``topic_of(where)``, in order, with one ``done``
        for all: the bus's ``publish_many`` when it has one (the Kafka bus,
        the in-process bus: one call and one outcome for the router's
        deliveries of a batch to one place), else one publish each under a
        :class:`~tbmq.cluster.completion.Completion`.

        :param done: ``done(None | Failure)``, called exactly once, maybe
            during the call: None once every record is durable (as
            :meth:`send`'s), else the first failure, a
            :class:`tbmq.errors.BusError`.
        """
        topic = self.topic_of(where)
        if self._publish_many is not None:
            self._publish_many(topic, keys, values, done)
        else:
            publish_each(self.bus.publish, topic, keys, values, done)


class Sinks(NamedTuple):
    """The node's :class:`BusSink` of each kind, built once by the broker
    and given to the router (and the persisted one to the sessions, for
    their markers).

    :ivar downlink: by service id.
    :ivar persisted: one topic.
    :ivar application: by client id.
    :ivar application_shared: by topic filter.
    """

    downlink: BusSink
    persisted: BusSink
    application: BusSink
    application_shared: BusSink

    @classmethod
    def build(cls, bus, topics) -> "Sinks":
        """:param topics: the :class:`~tbmq.cluster.topics.TopicCatalogue`.

        A persistent APPLICATION client's topic takes runs of QoS 1 on every
        bus: on Kafka each record costs a produce, a delivery report, a
        fetch entry, a decoding and a commit; on the in-process bus of the
        embedded node a topic log entry, a hand-off and a commit unit
        (``docs/bus.md``, "Runs of an APPLICATION client")."""
        persisted = topics.msg_persisted
        return cls(BusSink(bus, topics.downlink_basic, runs=True),
                   BusSink(bus, lambda _client_id: persisted, runs=True),
                   BusSink(bus, topics.app, runs=True, run_qos=1),
                   BusSink(bus, topics.app_shared))


def write_marker(sink: BusSink, service_id: str, client_id: str, session_id: str,
                 attached: bool):
    """Write a :class:`~tbmq.cluster.records.SessionMarker` to the client's
    partition of ``tbmq.msg.persisted``: the connection ``session_id`` of
    ``client_id`` on node ``service_id`` began (``attached``) or ended, in
    order with the client's deliveries (see :class:`PersistedWriter`).

    :param sink: the ``persisted`` :class:`BusSink`.
    :returns: the bus's publish result (None or a Deferred)."""
    return sink.send(client_id, client_id,
                     SessionMarker(client_id, service_id, session_id, attached))


def _stored(parts: list):
    """:returns: an iterator of the :class:`~tbmq.model.StoredDelivery` of
    ``parts`` (a stored delivery each, or ``(first seq, DeliveryRun)``:
    the run's messages with consecutive order keys), in order."""
    for part in parts:
        if type(part) is tuple:
            first, run = part
            yield from run_deliveries(first, run.messages, run.qos, run.retain,
                                      run.subscription_ids)
        else:
            yield part


def _settle(result, pending: Completion) -> None:
    """Make ``result`` (None or a Deferred) a part of ``pending``."""
    if result is None:
        return
    part = pending.part()
    result.addCallbacks(lambda _: part(None), part)


class PersistedWriter:
    """The consumer of ``tbmq.msg.persisted``: stores each delivery in the
    device message store, then hands it to the session when it is connected
    here, or to the node it is connected to through
    ``tbmq.msg.downlink.persisted.<serviceId>``; an offline session finds it
    in the store when it connects.

    **Where a client is connected** comes from the client's own partition:
    the :class:`~tbmq.cluster.records.SessionMarker` its node wrote there
    when the connection began or ended, so it is in order with the
    deliveries.  Until this writer has seen one (it started, or took the
    partition over, after the last connect), the session registry answers.
    An attach marker is passed on to the session, here or on its node, once
    every delivery this writer handled before it is in the store; the
    session then reads the store again
    (:meth:`~tbmq.broker.store_reads.StoreReader.on_attached`), and finds what this writer located elsewhere before it
    knew of the connection.

    :param store: the :class:`tbmq.interfaces.IDeviceMessageStore`.
    :param sessions: client id → the local :class:`~tbmq.broker.session.Session`.
    :param locate: ``client_id -> service id or None``: the node where the
        client is connected (None: offline or unknown).
    :param service_id: this node's service id.
    :param bus: the bus, and ``downlink_topic(service_id)``, for remote targets.
    :param clock: ``IReactorTime``.
    :param next_seq: ``next_seq(now_ns, count=1) -> int``: the order key
        of a new delivery (the first of ``count`` consecutive ones, for a
        run's messages).
    :param drops: the node's :class:`tbmq.broker.hooks.DropCounter`: the
        oldest deliveries the store removed to stay within its per-client
        limit (``storage.max_messages_per_client``) count as
        ``store_limit``.
    :param gone: ``service_id -> bool``: True for a node that left the
        cluster (:meth:`tbmq.cluster.membership.Membership.is_gone`); a
        marker's node that is gone no longer locates the client.
    """

    def __init__(self, store, sessions: Mapping[str, Any], locate: Callable, service_id: str,
                 bus, downlink_topic: Callable[[str], str], clock,
                 next_seq: Callable[[int], int], drops=None,
                 gone: Callable[[str], bool] = lambda service_id: False) -> None:
        self.store = store
        self.sessions = sessions
        self.locate = locate
        self.service_id = service_id
        self.bus = bus
        self.downlink_topic = downlink_topic
        self.clock = clock
        self.next_seq = next_seq
        self.drops = drops
        self.gone = gone
        self.consumer = None
        #: the store failing: seconds before the next attempt (None: healthy)
        self._retry_in: float | None = None
        #: client id → (service id, session id) of its last attach marker
        #: (removed by its detach marker, or when the node is gone)
        self.attached: dict[str, tuple[str, str]] = {}
        #: client id → the deliveries being stored, each a Deferred that
        #: fires once it is in the store (an attach marker waits for them)
        self._storing: dict[str, set] = {}

    #: seconds between attempts while the store fails: from the first, doubling
    RETRY_FIRST, RETRY_MAX = 0.5, 5.0

    def _store(self, client_id: str, write: Callable[[], defer.Deferred]) -> defer.Deferred:
        """``write()`` (a ``store.add`` or ``store.add_run`` of deliveries
        of ``client_id``, in order) until it succeeds: while the store is out
        (Redis or PostgreSQL gone) the consumer of ``tbmq.msg.persisted`` is
        paused, the deliveries are written again every few seconds (an add
        of the same ``seq`` replaces it), and the outage and the recovery
        are logged once each.  Nothing is skipped, so the order per client
        is kept.  An answer that is not the number of deliveries trimmed (a
        store whose replies came out of step with its calls, after a reply
        timeout) counts as a failure: the add is written again, never taken
        as done (the record would be committed with the deliveries nowhere).

        :returns: a Deferred firing with the number of deliveries trimmed.
        """
        done = defer.Deferred()
        storing = self._storing.setdefault(client_id, set())
        storing.add(done)

        def attempt():
            write().addCallbacks(succeeded, failed)

        def succeeded(removed):
            if not isinstance(removed, int):
                # not what an add answers: the store's replies are out of
                # step with its calls, so this add may not have been done
                return failed(Failure(BackendError(
                    f"the device store answered an add with {removed!r:.40}")))
            storing.discard(done)
            if not storing and self._storing.get(client_id) is storing:
                del self._storing[client_id]
            if self._retry_in is not None:
                self._retry_in = None
                log.info("device store writes again")
                if self.consumer is not None:
                    self.consumer.resume()
            done.callback(removed)

        def failed(failure):
            if self._retry_in is None:
                self._retry_in = self.RETRY_FIRST
                log.warn("device store write failed, retrying until it works: {error}",
                         error=failure.getErrorMessage())
                if self.consumer is not None:
                    self.consumer.pause()
            delay = self._retry_in
            self._retry_in = min(self.RETRY_MAX, delay * 2)
            self.clock.callLater(delay, attempt)

        attempt()
        return done

    def _trimmed(self, removed, client_id: str) -> None:
        if removed and self.drops is not None:
            self.drops.add("store_limit", removed)
            log.warn("device store limit: {removed} oldest messages of {client_id} removed",
                     removed=removed, client_id=client_id)

    def handle(self, record: Record):
        """One record: as :meth:`handle_batch`; a marker alone of a
        session of this node (one per persistent CONNECT of the embedded
        node) with nothing of its client being stored is followed at once
        (:meth:`_marker`: nothing to wait for), without a batch's
        containers.

        :returns: a :class:`~tbmq.cluster.completion.Completion`, or None
            (done)."""
        value = record.value
        if (type(value) is SessionMarker and value.service_id == self.service_id
                and not self._storing.get(value.client_id)):
            return self._marker(value)
        return self.handle_batch((value,))

    def handle_batch(self, values) -> Completion:
        """Records of ``tbmq.msg.persisted`` in order (a packed record's):
        the deliveries of each client stored with **one** store write (in
        their order, each with a new ``seq``), and a marker followed
        (:meth:`_marker`) after its client's deliveries before it.  A
        client's deliveries are written to its session at once when it is
        connected here; else, once stored, sent where it is connected.

        :param values: :class:`~tbmq.cluster.records.Delivery`,
            :class:`~tbmq.cluster.records.DeliveryRun` (several messages to
            one client) and :class:`~tbmq.cluster.records.SessionMarker`,
            in order.
        The attach markers passed on to other nodes at once (nothing of
        their client being stored) go together: those to one node in one
        ``publish_many`` (one outcome, a part of the batch's), sent before
        the next write of the batch and at its end, so every publish keeps
        its place in the batch's order (a burst of persistent CONNECTs
        costs one publish per node and batch, not a Deferred per marker).

        :returns: a :class:`~tbmq.cluster.completion.Completion` of the
            writes and of what they sent on (the records are committed,
            and on the in-process bus the publishers acknowledged, once
            every delivery is durable).
        """
        pending = Completion()
        groups: dict[str, list] = {}
        passing: dict[str, tuple[list, list]] = {}
        for d in values:
            if type(d) is SessionMarker:
                group = groups.pop(d.client_id, None)
                if group is not None:
                    if passing:
                        self._pass_on_many(passing, pending)
                    self._write(d.client_id, group, pending)
                _settle(self._marker(d, passing), pending)
                continue
            group = groups.get(d.client_id)
            if group is None:
                groups[d.client_id] = [d]
            else:
                group.append(d)
        if passing:
            self._pass_on_many(passing, pending)
        for client_id, group in groups.items():
            self._write(client_id, group, pending)
        return pending

    def _write(self, client_id: str, group: list, pending: Completion) -> None:
        """Store ``group`` (deliveries and runs to ``client_id``, in order),
        a part of ``pending``: each run with one ``store.add_run`` (its
        messages take consecutive order keys; no
        :class:`~tbmq.model.StoredDelivery` is made for a client that is
        not connected here), the lone deliveries between them with one
        ``store.add``."""
        now = self.clock.seconds()
        now_ns = int(now * 1e9)
        next_seq, store = self.next_seq, self.store
        writes: list = []  # a Deferred per store call, in order
        parts: list = []  # StoredDelivery, or (first seq, DeliveryRun), in order
        lone: list = []
        for d in group:
            if type(d) is DeliveryRun:
                if lone:
                    writes.append(self._store(client_id, partial(store.add, client_id, lone)))
                    lone = []
                messages = d.messages
                first = next_seq(now_ns, len(messages))
                writes.append(self._store(client_id, partial(
                    store.add_run, client_id, first, messages, d.qos, d.retain,
                    d.subscription_ids)))
                parts.append((first, d))
                continue
            one = StoredDelivery(next_seq(now_ns), d.message, d.qos, d.retain,
                                 d.subscription_ids)
            lone.append(one)
            parts.append(one)
        if lone:
            writes.append(self._store(client_id, partial(store.add, client_id, lone)))
        if len(writes) == 1:
            result = writes[0]
        else:  # (a store write never fails: it is written again until it works)
            result = defer.DeferredList(writes).addCallback(
                lambda outcomes: sum(trimmed for _, trimmed in outcomes))
        result.addCallback(self._trimmed, client_id)
        session = self.sessions.get(client_id)
        if session is not None and session.connection is not None:
            for one in _stored(parts):
                session.deliver_stored(one, None, now, self.consumer)
        else:
            # located once stored: a session that connects later reads it there
            result.addCallback(self._forward, client_id, parts)
        _settle(result, pending)

    def _forward(self, _trimmed: Any, client_id: str, parts: list):
        """``parts`` (what :meth:`_write` stored) are stored: to the node
        where ``client_id`` is connected (its persisted downlink, a
        :class:`~tbmq.cluster.records.Delivery` with its order key each),
        or to its session here.

        :returns: None, or a Deferred of the downlink publishes."""
        where = self.where(client_id)
        if where is not None and where != self.service_id:
            sent = Completion()
            topic = self.downlink_topic(where)
            publish = self.bus.publish
            for one in _stored(parts):
                publish(topic, client_id, Delivery(client_id, one.message, one.qos, one.retain,
                                                   one.subscription_ids, one.seq),
                        (), sent.part())
            return deferred_done(sent.then)
        if where == self.service_id:
            here = self.sessions.get(client_id)
            if here is not None and here.connection is not None:
                now = self.clock.seconds()
                for one in _stored(parts):
                    here.deliver_stored(one, None, now, self.consumer)
        return None

    def where(self, client_id: str) -> str | None:
        """:returns: the service id of the node ``client_id`` is connected
        to, by its last marker here, else by the registry; None when
        offline or unknown."""
        attached = self.attached.get(client_id)
        if attached is None:
            return self.locate(client_id)
        if self.gone(attached[0]):
            del self.attached[client_id]
            return self.locate(client_id)
        return attached[0]

    def session_changed(self, client_id: str, old, new) -> None:
        """A listener of the session registry: when the session of
        ``client_id`` ended (``new`` is None), what is known of its
        connection goes too."""
        if new is None:
            self.attached.pop(client_id, None)

    def _marker(self, marker: SessionMarker, passing: dict | None = None):
        """Follow ``marker``: a detach forgets the connection (unless a
        newer one attached meanwhile); an attach locates the client on its
        node and, once every delivery of the client handled before it is
        stored, is passed on to the session there.

        :param passing: service id → ``(client ids, markers)`` to pass on
            to that node (:meth:`_pass_on_many`): an attach marker of
            another node with nothing of its client being stored is added
            there instead of published now; None: published now.
        :returns: None, or a Deferred that fires once the marker is passed on.
        """
        client_id = marker.client_id
        if not marker.attached:
            if self.attached.get(client_id, (None, None))[1] == marker.session_id:
                del self.attached[client_id]
            return None
        self.attached[client_id] = (marker.service_id, marker.session_id)
        storing = self._storing.get(client_id)
        if debug_enabled():  # one per persistent CONNECT: not built at info
            log.debug("attach marker of {client_id}: connection {session_id} on {node}, after "
                      "{storing} deliveries being stored", client_id=client_id,
                      session_id=marker.session_id, node=marker.service_id,
                      storing=len(storing) if storing else 0)
        if not storing:
            if passing is not None and marker.service_id != self.service_id:
                to = passing.get(marker.service_id)
                if to is None:
                    passing[marker.service_id] = ([client_id], [marker])
                else:
                    to[0].append(client_id)
                    to[1].append(marker)
                return None
            return self._pass_on(marker)
        # DeferredList leaves each store's result to its own chain
        return defer.DeferredList(list(storing)).addCallback(lambda _: self._pass_on(marker))

    def _pass_on_many(self, passing: dict, pending: Completion) -> None:
        """Publish the attach markers gathered in ``passing`` (service id →
        ``(client ids, markers)``, emptied) on each node's persisted
        downlink, in order, one ``publish_many`` per node where the bus has
        it, each outcome a part of ``pending``."""
        publish_many = getattr(self.bus, "publish_many", None)
        for service_id, (keys, markers) in passing.items():
            topic = self.downlink_topic(service_id)
            if publish_many is not None:
                publish_many(topic, keys, markers, pending.part())
            else:
                publish_each(self.bus.publish, topic, keys, markers, pending.part())
        passing.clear()

    def _pass_on(self, marker: SessionMarker):
        if marker.service_id != self.service_id:
            return self.bus.publish(self.downlink_topic(marker.service_id), marker.client_id,
                                    marker)
        session = self.sessions.get(marker.client_id)
        if session is not None:
            session.on_attached(marker.session_id)
        return None


class DownlinkReader:
    """The consumer of this node's downlink topics: deliveries other nodes
    matched for clients connected here.

    :param sessions: client id → local session.
    :param clock: ``IReactorTime``.
    """

    def __init__(self, sessions: Mapping[str, Any], clock) -> None:
        self.sessions = sessions
        self.clock = clock
        self.basic = None
        self.persisted = None

    def handle_basic(self, record: Record) -> None:
        """One record of ``tbmq.msg.downlink.basic.<serviceId>``: the
        delivery to its session, when it is still connected here."""
        self.handle_basic_batch((record.value,))

    def handle_basic_batch(self, deliveries) -> None:
        """Several records of the basic downlink (a packed record's), in
        order: as :meth:`handle_basic`.  A
        :class:`~tbmq.cluster.records.DeliveryRun` is its messages to one
        session, in order (one look-up of the session for all of them)."""
        sessions = self.sessions
        now = self.clock.seconds()
        source = self.basic
        for d in deliveries:
            session = sessions.get(d.client_id)
            if session is None or session.connection is None:
                continue  # gone meanwhile: a non-persistent delivery ends here
            if type(d) is DeliveryRun:
                deliver = session.outbox.deliver
                qos, retain, sids = d.qos, d.retain, d.subscription_ids
                for message in d.messages:
                    deliver(message, qos, retain, sids, None, now, source)
                    if session.connection is None:
                        break  # it went during the run (overflow): the rest ends here
                continue
            session.outbox.deliver(d.message, d.qos, d.retain, d.subscription_ids, None, now, source)

    def handle_persisted(self, record: Record) -> None:
        """One record of ``tbmq.msg.downlink.persisted.<serviceId>``: a
        stored delivery, or a session marker, to its session here."""
        self.handle_persisted_batch((record.value,))

    def handle_persisted_batch(self, values) -> None:
        """Several records of the persisted downlink (a packed record's), in
        order: as :meth:`handle_persisted`."""
        sessions = self.sessions
        now = self.clock.seconds()
        source = self.persisted
        for d in values:
            session = sessions.get(d.client_id)
            if session is None or session.connection is None:
                continue  # it is in the store; the client finds it when it connects
            if type(d) is SessionMarker:
                session.on_attached(d.session_id)
                continue
            stored = StoredDelivery(d.seq, d.message, d.qos, d.retain, d.subscription_ids)
            session.deliver_stored(stored, None, now, source)


class ApplicationReader:
    """Reads the topics of a persistent APPLICATION session while it is
    connected to this node: ``tbmq.msg.app.<clientId>`` in the consumer
    group ``tbmq-app-<clientId>``, and for each of its shared subscriptions
    ``$share/<group>/<filter>`` the topic ``tbmq.msg.app.shared.<filter>``
    in the consumer group ``tbmq-app-shared-<group>`` (shared with the
    group's other members, wherever they are connected).  What one reactor
    turn published (the in-process bus), or what one poll brought (Kafka),
    reaches the session in one call
    (:meth:`~tbmq.broker.outbox.Outbox.deliver_app_batch`); a record is
    committed once the client acknowledged it (PUBACK, PUBCOMP; a
    :class:`~tbmq.cluster.records.DeliveryRun`: each of its messages) and
    every record before it, also inside a batch (its
    :class:`~tbmq.cluster.completion.Progress`), so exactly the records not
    acknowledged when the connection ended, and what followed, come again
    (a run partly acknowledged: whole).

    :param bus: the :class:`tbmq.interfaces.IMessageBus`.
    :param topic_of: ``client_id -> bus topic`` (the catalogue's ``app``).
    :param shared_topic_of: ``topic_filter -> bus topic`` (``app_shared``).
    :param delete_topics: ``kafka.enable_topic_deletion``: :meth:`remove`
        deletes the topic of an ended session.
    """

    def __init__(self, bus, topic_of: Callable[[str], str],
                 shared_topic_of: Callable[[str], str], delete_topics: bool = True) -> None:
        self.bus = bus
        self.topic_of = topic_of
        self.shared_topic_of = shared_topic_of
        self.delete_topics = delete_topics

    def attach(self, session) -> None:
        """Start reading the client's topic and its shared subscriptions'."""
        self._follow(session, None, self.topic_of(session.client_id),
                     "tbmq-app-" + session.client_id, None)
        for topic_filter in list(session.subscriptions):
            self.follow(session, topic_filter)

    def follow(self, session, topic_filter: str) -> None:
        """Read the shared topic of ``topic_filter`` when it is a shared
        subscription of ``session`` (no-op otherwise)."""
        share = parse_shared_subscription(topic_filter)
        if share is None or topic_filter in session.app_consumers:
            return
        group, real_filter = share

        def member_delivery(d: Delivery) -> Delivery:
            options = session.subscriptions.get(topic_filter)
            if options is None:
                return Delivery(session.client_id, d.message, 0)  # unsubscribed meanwhile
            sid = options.subscription_id
            return Delivery(session.client_id, d.message, min(options.qos, d.message.qos),
                            d.message.retain and options.retain_as_published,
                            () if sid is None else (sid,))

        self._follow(session, topic_filter, self.shared_topic_of(real_filter),
                     "tbmq-app-shared-" + group, member_delivery, exclusive=False)

    def _follow(self, session, key, topic: str, group: str,
                delivery_of: Callable[[Delivery], Delivery] | None,
                exclusive: bool = True) -> None:
        """Consume ``topic`` in ``group`` for ``session``: a batch reaches
        it in one call (:meth:`~tbmq.broker.outbox.Outbox.deliver_app_batch`,
        one :class:`~tbmq.cluster.completion.Progress` for the batch: each
        record commits once the client acknowledged it and every one before
        it).

        :param delivery_of: what the session gets for a record's
            :class:`Delivery` (None: the delivery itself)."""
        holder: list = []

        def handle(record: Record):
            d = record.value
            return session.deliver_app(d if delivery_of is None else delivery_of(d),
                                       holder[0] if holder else None)

        def handle_batch(values):
            if delivery_of is not None:
                values = [delivery_of(d) for d in values]
            return session.deliver_app_batch(values, holder[0] if holder else None)

        consumer = self.bus.subscribe(topic, group, handle, exclusive=exclusive,
                                      batch_handler=handle_batch)
        holder.append(consumer)
        consumers = session.app_consumers
        if not consumers:  # an idle session's is shared: its own dict from the first
            consumers = session.app_consumers = {}
        consumers[key] = consumer

    def unfollow(self, session, topic_filter: str) -> None:
        """Stop reading the shared topic of an unsubscribed filter."""
        consumer = session.app_consumers.pop(topic_filter, None)
        if consumer is not None:
            consumer.stop()

    def detach(self, session) -> list:
        """Stop reading: what is not acknowledged stays uncommitted.

        :returns: the stops' Deferreds (or None each), one per consumer."""
        consumers, session.app_consumers = session.app_consumers, {}
        return [consumer.stop() for consumer in consumers.values()]

    def remove(self, client_id: str, stops: list = ()) -> defer.Deferred | None:
        """The persistent APPLICATION session of ``client_id`` ended (expired, or
        removed by an administrator or by a clean start of a client that is
        no persistent APPLICATION any more): delete its
        topic ``tbmq.msg.app.<clientId>`` with what waited there (TBMQ's
        ``tbmq.sys.app.removed`` and ``TbQueueAdmin.deleteTopic``), unless
        ``kafka.enable_topic_deletion`` is false.  Called on the one node
        that ends the session.  A failure is logged, never raised: the
        topic then stays, as with the setting off.

        :param stops: what :meth:`detach` returned for the session (held
            here): the topic is deleted once its consumers stopped.
        :returns: a Deferred firing with None once the topic is deleted (or
            the deletion failed), or None when topics are kept.
        """
        stops = [d for d in stops if d is not None]
        if not self.delete_topics:
            return None
        topic = self.topic_of(client_id)

        def delete(_result):
            return self.bus.delete_topic(topic)

        def deleted(_result) -> None:
            log.info("APPLICATION client {client_id}: its session ended, topic {topic} "
                     "deleted", client_id=client_id, topic=topic)

        def failed(failure: Failure) -> None:
            log.warn("APPLICATION client {client_id}: topic {topic} not deleted: {error}",
                     client_id=client_id, topic=topic, error=failure.getErrorMessage())

        d = defer.DeferredList(stops, consumeErrors=True) if stops else defer.succeed(None)
        return d.addCallback(delete).addCallbacks(deleted, failed)
