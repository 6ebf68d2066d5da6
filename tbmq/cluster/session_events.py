"""The connect path without a coordinator (TBMQ's
``DefaultClientSessionEventService`` and disconnect-client commands).

A CONNECT is published on ``tbmq.client.session.event.request`` (key =
client id), so the one member of the ``tbmq-session-events`` consumer group
that owns the client's partition decides for that client, in order:

* a session still connected on another node is dropped there through
  ``tbmq.client.disconnect.<serviceId>`` (DISCONNECT SESSION_TAKEN_OVER,
  [MQTT-3.1.4-3]);
* the answer — whether a session is present [MQTT-3.2.2-2] and what the
  cluster knew of it — returns on
  ``tbmq.client.session.event.response.<serviceId>`` of the asking node.

A session the registry still records on a node that is gone
(:mod:`tbmq.cluster.membership`) is taken over by the member that decides
for its client id, once: a :data:`~tbmq.cluster.records.NODE_GONE` event
names the gone node and the session seen there, and only a registry that
still shows that session there is acted upon.

On a bus that packs records (Kafka), the requests of one packed record are
decided in one call and each asking node's answers sent in one
``publish_many``; a request of the deciding node itself is answered in
process; and the deciding member takes this node's own requests when they
are acknowledged (:meth:`tbmq.interfaces.IConsumer.hand_own`), so a request
of the node that decides its partition is decided then, once every record
before it in the partition was handed, and is not read back (``docs/bus.md``,
"The CONNECT path in batches").

A connect whose client id this node's own member decides, while it hands
that partition and has read it to its end with nothing of it waiting
(:meth:`tbmq.interfaces.IConsumer.decides`; on Kafka only while the brokers
acknowledge this node's records), is decided at once, during
:meth:`SessionEvents.request_connect`, and not published: the same
decision the member would make reading it, by the one member deciding
that client id, with no produce and no read back.  What this gives up is
the place of the request in the partition's order, only before records
that landed there since the member's last fetch and that it has not read
yet: requests whose CONNACK is not sent yet, concurrent with this one, so
either order is one the clients could see; when both connections are
granted, their grants' order stamps order their records in the session
registry and the node whose grant is the older drops its connection
(:meth:`on_registry_change`, :meth:`on_late_record`), as for two requests
decided back to back from the partition, the registry lagging the
decisions either way.

Every grant is stamped (:attr:`~tbmq.cluster.records.SessionEventResponse.stamp`,
:meth:`tbmq.cluster.registry.SessionRegistry.next_stamp`) and the asking
node's records of the connection carry the stamp, so every node's registry
applies a client id's records by grant, not by arrival (``docs/bus.md``,
"Order stamps of the session registry").  A gone node's takeover event read after
it finds the grant (:meth:`_grant`) and leaves the session alone, as one
read after a request does.  Nothing is left in the partition to decide
again when it moves, and a node that dies takes the connection it
answered with it.

The member deciding a client id decides from what it knows of its
session (:meth:`SessionEvents.held`): the registry's record, or the
connection it granted later whose record its registry has not read yet
(kept until read, at most :attr:`SessionEvents.GRANT_MEMORY` seconds).  TBMQ's
deciding node writes the session record itself, so its view holds its
grants at once; here the asking node writes the record, and without the
member's own grants a Clean Start 0 reconnect to another node moments
after a grant was answered "no session present" for a session that
exists [MQTT-3.2.2-2], and the first connection was not dropped by a
DisconnectCommand.  Every grant of a session that can outlive its
connection (a persistent one) is made by that member (the shortcut below
is for non-persistent sessions only), so its answer to a Clean Start 0
connect names every such session granted before the request, read or
not; what it still does not know is a grant of the partition's previous
member not read yet after the partition moved.

The other side of that lag is a session's end: the node holding an
offline session whose expiry interval passed asks the member to let it
end it (:meth:`SessionEvents.request_end`, TBMQ's
``CLEAR_SESSION_REQUEST``), and ends it once answered; the member
remembers the end until its registry reads it, so a Clean Start 0
reconnect after the session's effects are gone (an APPLICATION client's
topic deleted) presents no session though the registry still shows the
offline record.

A Clean Start connect of a non-persistent session (it ends with its
connection [MQTT-3.1.2-23]: no later connect can ask for it) of a client
id the session registry shows no session of (no node holds one,
connected or offline, as far as this node has read) is decided at once
on any node whose bus can tell that its brokers answer (Kafka,
:meth:`_unseen`): there is nothing to take over and no session to present
[MQTT-3.2.2-2], and a session of it that this node's registry does not
show yet is one the client asks to discard [MQTT-3.1.2-4], so the deciding
member would grant it, unless a connect of the same client id on another
node, not yet in the registry, is concurrent with it.  Such a race is settled by the grants' order
stamps, as the one above: this node stamps its grant from its own clock
(:meth:`tbmq.cluster.registry.SessionRegistry.next_stamp`), and of the
two connections the one with the greater stamp stays on every node,
whatever order their records land in.  What this gives up is TBMQ's
decision by the partition for the first connect of a client id: of two
first connects racing, the one stamped later is kept, not the one the
partition would have ordered last (the nodes' clocks order them); and a
session another node made moments ago, whose record this node has not
read yet, is ended on that node when this connection's record, stamped
later, reaches it, as Clean Start asks.  A Clean Start 0 connect, which
asks for the session present, and a connect that makes a persistent
session, which a later connect may ask for, are decided by the
partition's member as before: only that member knows every grant at once
(see above); another node's registry never shows that no grant came since
it last read, so a Clean Start 0 connect decided there could answer "no
session present" for a session that exists.

A node that sees, in the session registry, one of its sessions now held by
another connection elsewhere forgets it: the will and the session expiry of
a session belong to the one node that last held it, so no node fires them
twice and none forgets them (:meth:`SessionEvents.on_registry_change`).
"""

from __future__ import annotations

import os
import uuid
from collections import OrderedDict
from functools import partial
from typing import Callable

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq.cluster.completion import Completion, publish_each
from tbmq.cluster.records import (
    CLEAR_SESSION,
    CONNECTION_REQUEST,
    NODE_GONE,
    DisconnectCommand,
    Record,
    SessionEvent,
    SessionEventResponse,
    SessionInfo,
)
from tbmq.cluster.topics import CLUSTER_BUNDLE, node_group
from tbmq.errors import BusPublishError
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.mqtt import ReasonCode

log = Logger(observer=LOG_OBSERVER)


def _not_sent(what: str, client_id: str, failure: Failure | None) -> None:
    """The ``done`` of a publish nobody waits for: log its failure."""
    if failure is not None:
        log.warn("{what} of {client_id} was not sent: {error}", what=what,
                 client_id=client_id, error=failure.getErrorMessage())


class SessionEvents:
    """Asks for, decides and carries out connects across the cluster.

    :param bus: the :class:`tbmq.interfaces.IMessageBus`.
    :param topics: the :class:`tbmq.cluster.topics.TopicCatalogue`.
    :param service_id: this node's service id.
    :param registry: the :class:`tbmq.cluster.registry.SessionRegistry`.
    :param clock: ``IReactorTime``.
    :param drop_local: ``drop_local(client_id, session_id, reason_code)``:
        close this node's connection of that session (a
        :class:`~tbmq.cluster.records.DisconnectCommand` arrived).
    :param forget_local: ``forget_local(client_id, info)``: this node's
        offline session of ``client_id`` is now held elsewhere.
    :param take_over: ``take_over(info)``: this node now owns the session
        ``info`` (a :class:`~tbmq.cluster.records.SessionInfo`) of a node
        that is gone: its will and its expiry.
    :param timeout: seconds a connect waits for its answer.
    :param clear: ``clear(info)``: end the offline session ``info`` (a
        :class:`~tbmq.cluster.records.SessionInfo`) for an administrator;
        called on the node that decides for its client id.
    """

    def __init__(self, bus, topics, service_id: str, registry, clock,
                 drop_local: Callable, forget_local: Callable,
                 take_over: Callable = lambda info: None, timeout: float = 10.0,
                 clear: Callable = lambda info: None) -> None:
        self.bus = bus
        self.topics = topics
        self.service_id = service_id
        self.registry = registry
        self.clock = clock
        self.drop_local = drop_local
        self.forget_local = forget_local
        self.take_over = take_over
        self.clear = clear
        self.timeout = timeout
        #: client id -> session id taken over here, until the registry shows it
        self._taken: dict[str, str] = {}
        #: client id -> (session id, seconds, stamp, service id, what its
        #: request described or None: :meth:`_decision`) of the last
        #: connection this member granted, until the registry shows it (at
        #: most :attr:`GRANT_MEMORY` seconds), oldest first
        self._granted: OrderedDict[str, tuple] = OrderedDict()
        #: client id -> (session id, seconds, stamp) of the session this
        #: member let end (:meth:`request_end`), until the registry shows
        #: its end (at most :attr:`GRANT_MEMORY` seconds), oldest first: a
        #: record or grant older than the stamp is of an ended session
        self._ended: OrderedDict[str, tuple[str, float, int]] = OrderedDict()
        #: client id -> (session id, seconds) of its last persistent session
        #: whose tombstone the registry read, for :attr:`GRANT_MEMORY`
        #: seconds, oldest first (:meth:`_connect_decision`)
        self._gone: OrderedDict[str, tuple[str, float]] = OrderedDict()
        #: request id -> (its Deferred, the time its answer is due, the
        #: connection's session id, the client id once counted in
        #: :attr:`_asking`, else None), oldest first
        self._pending: dict[str, tuple[defer.Deferred, float, str, str | None]] = {}
        #: client id -> how many of its requests wait for their answer here
        #: (a client id with one waiting is not decided at once by
        #: :meth:`_unseen`: its connects here are granted in the order asked)
        self._asking: dict[str, int] = {}
        self._sweep = None  # the timer of _time_out while requests wait
        # request ids: unique per process (a counter after a random prefix),
        # so an answer to an earlier process of this node matches nothing
        self._request_prefix = os.urandom(6).hex() + "-"
        self._requests = 0
        #: the bus's ``publish_many(topic, keys, values, done)``, when it has one
        self._publish_many = getattr(bus, "publish_many", None)
        #: the bus's ``acknowledging()``, on a bus whose requests cross
        #: nodes (one that packs records: Kafka) and that can tell that its
        #: brokers answer: a connect of a client id the registry shows no
        #: session of is then decided at once (:meth:`_unseen`); not on the
        #: in-process bus, whose one member decides every client id
        #: (:meth:`tbmq.interfaces.IConsumer.decides`) and, paused, nothing
        self._acknowledging = (getattr(bus, "acknowledging", None)
                               if getattr(bus, "packs", False) else None)
        self.consumers: list = []
        self._deciding = None
        self._started = False

    def _batches(self, handler: Callable) -> Callable | None:
        """``handler`` as a consumer's ``batch_handler`` on a bus that packs
        several records in one (:attr:`~tbmq.interfaces.IMessageBus.packs`:
        Kafka, whose packed records of requests and answers are then read in
        one call), else None: the in-process bus hands each record at once,
        in the publisher's call, as an embedded node's CONNECT expects."""
        return handler if getattr(self.bus, "packs", False) else None

    def join(self) -> None:
        """Join the deciding group (``tbmq-session-events``, in the cluster
        bundle, :data:`~tbmq.cluster.topics.CLUSTER_BUNDLE`), paused: the
        node joins its cluster groups together, but decides nothing before
        :meth:`start` (after the registry replay: a decision reads the
        registry).  On a bus that packs records the member takes this
        node's own requests when they are acknowledged
        (:meth:`~tbmq.interfaces.IConsumer.hand_own`: a request of a
        partition this node decides is decided then, once every record
        before it was handed, and skipped when the fetch brings it; a
        paused member, or one that does not hand the partition, leaves it
        to the fetch).  Idempotent."""
        if self._deciding is None:
            self._deciding = self.bus.subscribe(
                self.topics.session_event_request, "tbmq-session-events", self._decide,
                bundle=CLUSTER_BUNDLE, batch_handler=self._batches(self._decide_many))
            self._deciding.pause()
            self._deciding.hand_own()
            self.consumers = [self._deciding]

    def start(self) -> None:
        """Decide (the deciding group joined by :meth:`join` if it was not)
        and follow this node's answer and disconnect topics."""
        self.join()
        bus, topics, sid = self.bus, self.topics, self.service_id
        self.consumers = [
            self._deciding,
            bus.subscribe(topics.session_event_response(sid), node_group(sid),
                          self._on_response, exclusive=True,
                          batch_handler=self._batches(self._on_responses)),
            bus.subscribe(topics.client_disconnect(sid), node_group(sid),
                          self._on_disconnect, exclusive=True),
        ]
        self.registry.listeners.append(self.on_registry_change)
        self.registry.stale_listeners.append(self.on_late_record)
        self._deciding.resume()
        self._started = True

    # -- asking -----------------------------------------------------------------------

    def request_connect(self, client_id: str, session_id: str, *, clean_start: bool,
                        persistent: bool, client_type, session_expiry_interval: int,
                        protocol_level: int, answer=None) -> defer.Deferred:
        """Ask the cluster to let ``client_id`` connect here: decided at
        once when this node's deciding member decides the client id and has
        read its partition (:meth:`tbmq.interfaces.IConsumer.decides`), or,
        for a Clean Start connect of a non-persistent session, when the
        registry shows no session of it and the bus's brokers answer
        (:meth:`_unseen`; see the module doc for both), else published on
        ``tbmq.client.session.event.request``.

        :param answer: what gets the answer instead of a new Deferred:
            anything with a Deferred's ``callback(response)`` and
            ``errback(failure)``, called once (maybe during this call), that
            raises nothing (:class:`tbmq.broker.sessions.Opening`).
        :returns: ``answer``, or a Deferred firing with the
            :class:`~tbmq.cluster.records.SessionEventResponse`, or failing
            with :class:`~tbmq.errors.BusPublishError` when no answer came in
            :attr:`timeout` seconds (or the bus refused the request).
        """
        self._requests += 1
        request_id = f"{self._request_prefix}{self._requests}"
        d = defer.Deferred() if answer is None else answer
        deciding = self._deciding
        if deciding is not None and ((clean_start and not persistent
                                      and self._unseen(client_id))
                                     or deciding.decides(client_id)):
            # a Clean Start connect of a non-persistent session of a client
            # id no node holds a session of, or this node's member decides
            # the client id and has read its partition: decided now, not
            # published (see the module doc); no request built (the cheaper
            # question first: the same decision either way)
            response = self._decision(client_id, self.service_id, session_id, request_id,
                                      clean_start, (persistent, client_type,
                                                    session_expiry_interval, protocol_level))
            self.registry.granted(client_id, session_id, response.stamp)
            d.callback(response)
            return d
        now = self.clock.seconds()
        event = SessionEvent(CONNECTION_REQUEST, client_id, self.service_id, session_id,
                             request_id, clean_start, persistent, client_type,
                             session_expiry_interval, protocol_level, now)
        pending = self._pending
        pending[request_id] = (d, now + self.timeout, session_id, None)
        # (_request's publish, without the call)
        self.bus.publish(self.topics.session_event_request, client_id, event, (),
                         partial(self._sent, request_id))
        if request_id in pending:  # not answered during the call: counted
            pending[request_id] = (d, now + self.timeout, session_id, client_id)
            asking = self._asking
            asking[client_id] = asking.get(client_id, 0) + 1
            if self._sweep is None:
                self._sweep = self.clock.callLater(self.timeout, self._time_out)
        return d

    def request_end(self, client_id: str, session_id: str, done: Callable) -> None:
        """Ask the member deciding ``client_id`` to let this node end its
        offline session ``session_id`` (its session expiry interval passed:
        TBMQ's ``CLEAR_SESSION_REQUEST``, in order with the client id's
        connects): the member knows of the end before this node ends it, so
        a connect it decides after (a Clean Start 0 reconnect once the
        session's effects are gone) is answered "no session present"
        [MQTT-3.2.2-2] though its session registry has not read the end's
        tombstone yet (:meth:`held`).  Decided at once when this node's
        member decides the client id (:meth:`tbmq.interfaces.IConsumer.decides`),
        else published on ``tbmq.client.session.event.request``
        (:data:`~tbmq.cluster.records.CLEAR_SESSION`, ``clean_start`` True:
        the node holding the session asks) and answered on this node's
        ``tbmq.client.session.event.response.<serviceId>``.

        :param done: ``done(ends)``, called once (maybe during this call):
            True to end the session now (also when no answer came within
            :attr:`timeout` seconds or the bus refused the request: the
            session ends as before, the member then learns of it from the
            registry), False when the member knows a later connection of
            the client id (the session is held by it: its record, when
            read, makes this node forget the session).
        """
        deciding = self._deciding
        if deciding is None or deciding.decides(client_id):
            done(self._end_decision(client_id, session_id))
            return
        self._requests += 1
        request_id = f"{self._request_prefix}{self._requests}"
        now = self.clock.seconds()
        d = defer.Deferred()

        def answered(response) -> None:
            done(response.success)

        def failed(failure: Failure) -> None:
            log.warn("the end of session {client_id} was not confirmed by its deciding "
                     "member ({error}); it ends here", client_id=client_id,
                     error=failure.getErrorMessage())
            done(True)

        d.addCallbacks(answered, failed)
        self._pending[request_id] = (d, now + self.timeout, session_id, None)
        self._request(SessionEvent(CLEAR_SESSION, client_id, self.service_id, session_id,
                                   request_id, True, at=now),
                      partial(self._sent, request_id))
        if self._sweep is None and request_id in self._pending:
            self._sweep = self.clock.callLater(self.timeout, self._time_out)

    def _unseen(self, client_id: str) -> bool:
        """Whether a connect of ``client_id`` may be decided here at once
        though another member decides its partition: the registry shows no
        session of it (none connected, none offline: nothing to take over,
        no session present [MQTT-3.2.2-2]), this node decides (started), no
        request of it from this node waits for its answer (its connects
        here are granted in the order they came), and the bus can tell that
        its brokers answer (Kafka: ``KafkaBus.acknowledging``, so the
        grant's registry record will be written).  See the module doc for
        the race of two such grants."""
        acknowledging = self._acknowledging
        return (acknowledging is not None and self._started
                and client_id not in self._asking
                and self.registry.get(client_id) is None and acknowledging())

    #: one timer for all the requests waiting, none per request: it fires at
    #: the oldest one's deadline, or :attr:`timeout` / SWEEPS seconds after
    #: it last fired when that is later, so a request fails between
    #: ``timeout`` and ``timeout`` × (1 + 1/SWEEPS) seconds after it was sent
    SWEEPS = 10

    def _sent(self, request_id: str, failure: Failure | None) -> None:
        """The bus's outcome of the request ``request_id`` (the ``done`` of
        its publish, no Deferred per request): a refused request fails its
        connect at once."""
        if failure is not None:
            pending = self._take(request_id)
            if pending is not None:
                pending[0].errback(failure)

    def _take(self, request_id: str) -> tuple | None:
        """:returns: the :attr:`_pending` entry of ``request_id``, removed
        (None when it is not there: answered, refused or timed out)."""
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            client_id = pending[3]
            if client_id is not None:  # counted in _asking
                left = self._asking.pop(client_id) - 1
                if left:
                    self._asking[client_id] = left
        return pending

    def _time_out(self) -> None:
        """Fail the requests whose answer is overdue (in the order they were
        sent: :attr:`_pending` keeps it), and look again later while some
        wait."""
        self._sweep = None
        now = self.clock.seconds()
        pending = self._pending
        overdue = []
        for request_id, (d, deadline, _, _) in pending.items():
            if deadline > now:
                break
            overdue.append(request_id)
        for request_id in overdue:
            d = self._take(request_id)[0]
            d.errback(BusPublishError("no answer to the connect request in time"))
        if pending and self._sweep is None:
            due = next(iter(pending.values()))[1]
            self._sweep = self.clock.callLater(
                max(due - self.clock.seconds(), self.timeout / self.SWEEPS), self._time_out)

    def _on_response(self, record: Record) -> None:
        self._on_responses((record.value,))

    def _on_responses(self, responses) -> None:
        """The answers to this node's connect requests, in the order they
        were read (one call for the answers of a packed record: the
        consumer's ``batch_handler``).

        :param responses: :class:`~tbmq.cluster.records.SessionEventResponse` each.
        """
        take = self._take
        granted = self.registry.granted
        for response in responses:
            waiting = take(response.request_id)
            if waiting is not None:
                if response.success:
                    granted(response.client_id, waiting[2], response.stamp)
                waiting[0].callback(response)
            else:
                log.debug("the answer to the connect request {request} of {client_id} came "
                          "after the CONNECT was refused", request=response.request_id,
                          client_id=response.client_id)

    def request_takeover(self, info) -> None:
        """Ask the cluster to take over ``info`` (a
        :class:`~tbmq.cluster.records.SessionInfo` held by a node that is
        gone); whichever node decides for the client id does it, once."""
        event = SessionEvent(NODE_GONE, info.client_id, info.service_id, info.session_id,
                             uuid.uuid4().hex, at=self.clock.seconds())
        self._request(event, partial(_not_sent, "the takeover request", info.client_id))

    def disconnect_client(self, client_id: str,
                          reason_code: int = ReasonCode.ADMINISTRATIVE_ACTION) -> bool:
        """Close the connection of ``client_id`` wherever it is (an
        administrator's request, DISCONNECT ADMINISTRATIVE_ACTION by
        default): the node holding it gets a
        :class:`~tbmq.cluster.records.DisconnectCommand`.

        :returns: False when the registry shows no connection of it.
        """
        info = self.registry.get(client_id)
        if info is None or not info.connected:
            return False
        self.bus.publish(self.topics.client_disconnect(info.service_id), client_id,
                         DisconnectCommand(client_id, info.session_id, reason_code))
        return True

    def clear_session(self, client_id: str) -> bool:
        """End the offline session of ``client_id`` wherever it is held (an
        administrator's request), through the member that decides for it
        (:data:`~tbmq.cluster.records.CLEAR_SESSION`), in order with its
        connects.

        :returns: False when the registry shows no session of it, or a
            connected one (disconnect it first).
        """
        info = self.registry.get(client_id)
        if info is None or info.connected:
            return False
        event = SessionEvent(CLEAR_SESSION, client_id, self.service_id, info.session_id,
                             uuid.uuid4().hex, at=self.clock.seconds())
        self._request(event, partial(_not_sent, "the removal request", client_id))
        return True

    def _request(self, event: SessionEvent, done: Callable) -> None:
        """Publish ``event`` on ``tbmq.client.session.event.request`` (key:
        its client id); ``done(None | Failure)`` gets the bus's outcome."""
        self.bus.publish(self.topics.session_event_request, event.client_id, event, (), done)

    # -- deciding (one member per client id) ----------------------------------------------

    def _decide(self, record: Record):
        """One request (a bus that hands each record alone: the in-process
        bus, during the request's publish): a connect request of this node
        is decided and its answer handed to its waiting connect at once,
        as :meth:`_decide_many` does, without the batch's containers."""
        event = record.value
        if event.kind != CONNECTION_REQUEST or event.service_id != self.service_id:
            return self._decide_many((event,))
        response = self._connect_decision(event)
        waiting = self._take(response.request_id)
        if waiting is None:
            self._on_responses((response,))  # (logged: came after the CONNECT was refused)
        else:
            self.registry.granted(response.client_id, waiting[2], response.stamp)
            waiting[0].callback(response)
        return None

    def _decide_many(self, events) -> Completion | None:
        """Decide the requests of one read, in order (one call for the
        requests of a packed record: the consumer's ``batch_handler``), and
        send the answers of each asking node together (``publish_many``
        where the bus has it: one packed record per node and partition, one
        outcome).  The answer to a request of this node is handed to its
        waiting connect at once (:meth:`_on_responses`), not sent: the
        decision is the same, made in the request's partition order; only
        the hop back through ``tbmq.client.session.event.response.<serviceId>``
        is saved (a request of an earlier process of this node finds no
        connect waiting, as its answer would).

        A connection still held on another node is dropped there first
        ([MQTT-3.1.4-3]: a :class:`~tbmq.cluster.records.DisconnectCommand`
        on ``tbmq.client.disconnect.<serviceId>``).  Read again (a failed
        answer fails the batch), a request is decided again: the asking
        node takes the first answer it gets.

        :param events: :class:`~tbmq.cluster.records.SessionEvent` each.
        :returns: None when nothing was answered, else a
            :class:`~tbmq.cluster.completion.Completion` of the answers'
            publishes (the records are committed once all were
            acknowledged).
        """
        answers: dict[str, tuple[list, list]] = {}
        here = self.service_id
        for event in events:
            kind = event.kind
            if kind == CONNECTION_REQUEST:
                response = self._connect_decision(event)
            elif kind == CLEAR_SESSION and event.clean_start:
                # the node holding the session asks to end it (expired)
                response = SessionEventResponse(
                    event.client_id, event.request_id,
                    self._end_decision(event.client_id, event.session_id), False)
            else:
                if kind == NODE_GONE:
                    self._take_over(event)
                elif kind == CLEAR_SESSION:
                    info = self.held(event.client_id)
                    if (info is not None and not info.connected
                            and info.session_id == event.session_id):
                        self.clear(info)
                        self._ended_here(event.client_id, event.session_id)
                continue
            if event.service_id == here:
                # this node's own request: answered in process, without
                # a publish and a read of its answer topic (one bus hop)
                self._on_responses((response,))
                continue
            to = answers.get(event.service_id)
            if to is None:
                answers[event.service_id] = ([event.client_id], [response])
            else:
                to[0].append(event.client_id)
                to[1].append(response)
        if not answers:
            return None
        sent = Completion()
        publish_many = self._publish_many
        for service_id, (keys, responses) in answers.items():
            topic = self.topics.session_event_response(service_id)
            if publish_many is not None:
                publish_many(topic, keys, responses, sent.part())
            else:
                publish_each(self.bus.publish, topic, keys, responses, sent.part())
        return sent

    def _connect_decision(self, event: SessionEvent) -> SessionEventResponse:
        """Decide one CONNECTION_REQUEST (:meth:`_decision` of its fields).
        Its grant is not kept for the next connect (``described`` None) when
        its connect no longer waits (the request older than
        :attr:`timeout`), or when the request is read again (its partition
        moved before the member that decided it committed it) after the
        registry read a record of its connection, or the end of that
        persistent session: a grant kept then would stand for a connection
        that is recorded already or ended.

        :returns: the answer for the asking node."""
        client_id, session_id = event.client_id, event.session_id
        recorded = self.registry.get(client_id)
        gone = self._gone.get(client_id) if self._gone else None
        described = ((event.persistent, event.client_type, event.session_expiry_interval,
                      event.protocol_level)
                     if (event.at + self.timeout > self.clock.seconds()
                         and (recorded is None or recorded.session_id != session_id)
                         and (gone is None or gone[0] != session_id)) else None)
        return self._decision(client_id, event.service_id, session_id,
                              event.request_id, event.clean_start, described)

    def held(self, client_id: str) -> SessionInfo | None:
        """The session of ``client_id`` as this member knows it: the
        registry's record, or the connection this member granted later
        whose record the registry has not read yet (:meth:`_grant`, at most
        :attr:`GRANT_MEMORY` seconds).  TBMQ's deciding node writes the
        session record itself, so its view holds its grants at once; here
        the asking node writes it, and the member keeps its grants until it
        reads them, so that a connect decided next (a Clean Start 0
        reconnect to another node moments after a grant) is answered with
        the session granted [MQTT-3.2.2-2] and drops its connection
        [MQTT-3.1.4-3].

        A grant decided when its connect had stopped waiting (its request
        older than :attr:`timeout`: the asking node refused it, no record
        of it will come) is not used, nor a record or grant older than the
        end of a session this member let end (:meth:`request_end`) while
        the registry has not read that end's tombstone.

        :returns: a :class:`~tbmq.cluster.records.SessionInfo` (the grant's
            is built from its request: connected since the grant, no will,
            address or user name), or None when neither shows a session."""
        info = self.registry.get(client_id)
        granted = self._granted.get(client_id)
        ended = self._ended.get(client_id) if self._ended else None
        if ended is not None:
            if ended[1] + self.GRANT_MEMORY < self.clock.seconds():
                ended = None
            elif info is not None and info.stamp < ended[2]:
                info = None  # the session ended here, its end not read yet
        if granted is None:
            return info
        session_id, at, stamp, service_id, described = granted
        if (described is None or (info is not None and info.stamp >= stamp)
                or at + self.GRANT_MEMORY < self.clock.seconds()
                or (ended is not None and stamp < ended[2])):
            return info
        persistent, client_type, expiry, protocol_level = described
        return SessionInfo(client_id, service_id, session_id, True, persistent, client_type,
                           expiry, protocol_level, at, None, at, stamp=stamp)

    def _decision(self, client_id: str, service_id: str, session_id: str, request_id: str,
                  clean_start: bool, described: tuple | None) -> SessionEventResponse:
        """Decide a connect of ``client_id`` by node ``service_id`` (its
        connection ``session_id``, request ``request_id``; ``described``:
        the session it makes as its request describes it, ``(persistent,
        client_type, session_expiry_interval, protocol_level)``, or None
        when its connect no longer waits): drop a connection of the client
        id held on another node (:meth:`held`: the registry's, or this
        member's later grant), remember the grant, stamp it
        (:meth:`tbmq.cluster.registry.SessionRegistry.next_stamp`:
        greater than any stamp this member made or read, than the
        registry's record of the client id and than the time now).  The
        grant is told to the registry of the asking node when its connect
        still waits for it (:meth:`request_connect`, :meth:`_decide`,
        :meth:`_on_responses`), so that its records carry the stamp: an
        answer nobody waits for any more (the connect was refused when no
        answer came in time, or asked by an earlier process of this node)
        leaves no grant of a connection that does not exist, whose greater
        stamp would make :meth:`tbmq.cluster.registry.SessionRegistry.granted_later`
        keep a session another node took over.

        :returns: the answer for the asking node."""
        info = self.held(client_id)
        if (info is not None and info.connected and info.session_id != session_id
                and info.service_id != service_id):
            # connected on another node: drop it there (session taken over)
            self.bus.publish(self.topics.client_disconnect(info.service_id), client_id,
                             DisconnectCommand(client_id, info.session_id,
                                               ReasonCode.SESSION_TAKEN_OVER),
                             (), partial(_not_sent, "the takeover's disconnect", client_id))
        stamp = self.registry.next_stamp(client_id)
        self._grant(client_id, session_id, stamp, service_id, described)
        return SessionEventResponse(client_id, request_id, True,
                                    info is not None and info.persistent
                                    and not clean_start, info, "", stamp)

    #: seconds a granted connection is remembered while the registry has
    #: not shown it yet (the lag of ``tbmq.client.session`` behind the
    #: session events)
    GRANT_MEMORY = 60.0

    def _end_decision(self, client_id: str, session_id: str) -> bool:
        """Decide the end of the offline session ``session_id`` of
        ``client_id`` asked by the node holding it (:meth:`request_end`):
        it ends unless :meth:`held` shows another session (a later
        connection, granted or recorded) or a connection of it (a
        reconnect this member granted whose record it has not read, or the
        registry not having read the disconnect yet: the node asks again
        later); an end is remembered (:meth:`_ended_here`).

        :returns: whether the session ends."""
        info = self.held(client_id)
        if info is not None and (info.session_id != session_id or info.connected):
            return False
        self._ended_here(client_id, session_id)
        return True

    def _ended_here(self, client_id: str, session_id: str) -> None:
        """Remember that this member let the session ``session_id`` of
        ``client_id`` end, stamped after every grant it made and record it
        read (:meth:`tbmq.cluster.registry.SessionRegistry.next_stamp`),
        until its registry reads the end (at most :attr:`GRANT_MEMORY`
        seconds): :meth:`held` ignores what is older."""
        _remember(self._ended, client_id,
                  (session_id, self.clock.seconds(), self.registry.next_stamp(client_id)),
                  self.GRANT_MEMORY)

    def _forget_later(self, client_id: str, session_id: str) -> None:
        """Remember for :attr:`GRANT_MEMORY` seconds that the persistent
        session ``session_id`` of ``client_id`` ended (:attr:`_gone`)."""
        _remember(self._gone, client_id, (session_id, self.clock.seconds()), self.GRANT_MEMORY)

    def _grant(self, client_id: str, session_id: str, stamp: int, service_id: str,
               described: tuple | None) -> None:
        """Remember the connection ``session_id`` of ``client_id`` granted
        here to node ``service_id`` with ``stamp``: a gone node's session
        that the registry still shows, because the new connection's record
        has not reached it yet, is not taken over, and the next connect of
        the client id is decided knowing it (:meth:`held`)."""
        _remember(self._granted, client_id, (session_id, self.clock.seconds(), stamp, service_id,
                                             described), self.GRANT_MEMORY)

    def _take_over(self, event: SessionEvent) -> None:
        info = self.registry.get(event.client_id)
        if (info is None or info.service_id != event.service_id
                or info.session_id != event.session_id
                or self._taken.get(event.client_id) == event.session_id):
            return  # moved, ended or taken over already
        granted = self._granted.get(event.client_id)
        if (granted is not None and granted[0] != event.session_id
                and granted[1] + self.GRANT_MEMORY >= self.clock.seconds()):
            # a connection granted since, decided before this event in the
            # client id's order: the gone node's session ended there
            log.info("session {client_id} of gone node {node} is not taken over: the client "
                     "connected again", client_id=event.client_id, node=event.service_id)
            return
        self._taken[event.client_id] = event.session_id
        log.info("taking over session {client_id} of gone node {node}",
                 client_id=event.client_id, node=event.service_id)
        self.take_over(info)

    # -- carrying out ------------------------------------------------------------------------

    def _on_disconnect(self, record: Record) -> None:
        command: DisconnectCommand = record.value
        self.drop_local(command.client_id, command.session_id, command.reason_code)

    def on_registry_change(self, client_id: str, old, new) -> None:
        """A session now held by another node's connection: if this node
        kept it (offline, with its will and expiry timers), forget it,
        unless this node's connection of the client id was granted later
        (a greater stamp: :meth:`tbmq.cluster.registry.SessionRegistry.granted_later`)
        and its record is still to come."""
        taken = self._taken.get(client_id)
        if taken is not None and (new is None or new.session_id != taken):
            del self._taken[client_id]
        granted = self._granted.get(client_id)
        if granted is not None and (new.session_id == granted[0] if new is not None
                                    else old is not None and old.stamp >= granted[2]):
            # the registry shows it now, or a tombstone removed a record as
            # new as it (a tombstone of an older connection, written by a
            # node that had not read the grant yet, leaves it: its record,
            # or its node's restatement, comes next)
            del self._granted[client_id]
        if self._ended:
            ended = self._ended.get(client_id)
            if ended is not None and (new is None or new.stamp >= ended[2]):
                del self._ended[client_id]  # the registry shows the end, or a later grant
        if new is None and old is not None and old.persistent:
            self._forget_later(client_id, old.session_id)
        if (new is not None and new.service_id != self.service_id
                and (old is None or old.session_id != new.session_id)
                and not self.registry.granted_later(client_id, new.stamp)):
            # (a connection granted here after that one, its record not read
            # yet, stays: its record replaces this one everywhere)
            self.forget_local(client_id, new)

    def on_late_record(self, client_id: str, current, late) -> None:
        """A record older than the registry's (``late``, a
        :class:`~tbmq.cluster.records.SessionInfo` with a smaller stamp than
        ``current``'s, ignored) is of this node's connection: a later grant
        elsewhere holds the client id now (granted before this node's
        record was read, or read here before this node's answer came), so
        this node forgets its session, closing its connection (DISCONNECT
        SESSION_TAKEN_OVER [MQTT-3.1.4-3]) as :meth:`on_registry_change`
        does for a newer record.  ``late`` None (a tombstone removed
        ``current``) is left to the node holding ``current``."""
        if (late is not None and late.service_id == self.service_id
                and current.service_id != self.service_id):
            self.forget_local(client_id, current)


def _remember(memory: OrderedDict, client_id: str, entry: tuple, seconds: float) -> None:
    """Put ``entry`` (its second field the time it was made, in the clock's
    seconds) last in ``memory`` (client id -> entry, oldest first) under
    ``client_id``, and drop the entries older than ``seconds`` before it."""
    memory.pop(client_id, None)
    memory[client_id] = entry
    now = entry[1]
    while memory:
        if next(iter(memory.values()))[1] + seconds >= now:
            break
        memory.popitem(last=False)
