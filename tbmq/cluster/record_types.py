"""The record types the bus carries (:mod:`tbmq.cluster.records` gives each
its one encoding, and exports them all): plain values, checked when they
are encoded, never when they are built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from tbmq.model import ClientType, Message, SubscriptionOptions

#: :attr:`SessionEvent.kind`: a client sent CONNECT (TBMQ's name).
CONNECTION_REQUEST = "CONNECTION_REQUEST"
#: :attr:`SessionEvent.kind`: a client's connection ended.
DISCONNECTED = "DISCONNECTED"
#: :attr:`SessionEvent.kind`: forget the client's session (expired, or
#: cleaned by an administrator).
CLEAR_SESSION = "CLEAR_SESSION"
#: :attr:`SessionEvent.kind`: the node :attr:`SessionEvent.service_id`, which
#: held the session :attr:`SessionEvent.session_id`, is gone; the deciding
#: node takes the session over (its will and expiry).
NODE_GONE = "NODE_GONE"
#: Every valid :attr:`SessionEvent.kind`.
SESSION_EVENT_KINDS = (CONNECTION_REQUEST, DISCONNECTED, CLEAR_SESSION, NODE_GONE)
#: :attr:`SessionInfo.service_id` of a session no node holds yet: the node
#: that starts on the data where it was found adopts it (the sessions an
#: older embedded store kept in its own tables,
#: :mod:`tbmq.backends.sqlite_session_migration`).
UNCLAIMED = ""


# -- the record types ------------------------------------------------------------


class Record(NamedTuple):
    """One record as a consumer's handler receives it (immutable).

    :ivar topic: the bus topic name (prefix included), ``str``.
    :ivar key: the partition key (``str``) or None.
    :ivar value: the decoded value (the topic's record type), or None for a
        tombstone.
    :ivar headers: ``tuple[tuple[str, bytes], ...]``.
    :ivar partition: the partition it was read from, ``int``.
    :ivar offset: its offset in that partition, ``int`` (-1 when unknown).

    A bus makes one per record it hands over, with :data:`new_record`.
    """

    topic: str
    key: str | None
    value: Any
    headers: tuple = ()
    partition: int = 0
    offset: int = -1


#: ``new_record((topic, key, value, headers, partition, offset)) ->
#: Record``: a :class:`Record` of all six fields from a tuple, the way a bus
#: makes one per record (C-level: a third of the cost of calling the class,
#: whose ``__new__`` is Python code).
new_record = partial(tuple.__new__, Record)


@dataclass(slots=True)
class Delivery:
    """One message for one target client.

    :ivar client_id: the target client id (the topic filter on
        ``tbmq.msg.app.shared.<filter>``).
    :ivar message: the :class:`tbmq.model.Message`.
    :ivar qos: the QoS of the delivery (the lower of the message's and the
        subscription's).
    :ivar retain: the RETAIN flag to send.
    :ivar subscription_ids: the identifiers of the matching subscriptions.
    :ivar seq: the order key of the message in the target's persisted queue
        (0 where there is none).
    """

    client_id: str
    message: Message
    qos: int
    retain: bool = False
    subscription_ids: tuple[int, ...] = ()
    seq: int = 0


@dataclass(slots=True)
class DeliveryRun:
    """Several messages for one target client, in order, at one QoS with
    one RETAIN flag and one set of subscription identifiers: what a
    routing node sends a node's ``tbmq.msg.downlink.basic.<serviceId>``
    for one client from one batch of ``tbmq.msg.all`` (one record, one
    decoding and one session look-up for all of them, not one
    :class:`Delivery` each), and, at QoS 1 on a bus that packs (Kafka),
    what it sends a persistent APPLICATION client's
    ``tbmq.msg.app.<clientId>`` (one Kafka record, committed once the
    client acknowledged each of its messages).  Equivalent to a
    :class:`Delivery` per message, in order.

    :ivar client_id: the target client id.
    :ivar messages: the :class:`tbmq.model.Message` s, in order (a list
        while the router gathers them, a tuple as read); at least one.
    :ivar qos: the QoS of every delivery.
    :ivar retain: the RETAIN flag to send with each.
    :ivar subscription_ids: the identifiers of the matching subscriptions.
    :ivar size: the payload bytes of :attr:`messages` while the router
        gathers them (its bound, :data:`RUN_MAX_BYTES`); not an argument,
        not written, not compared.
    """

    client_id: str
    messages: list | tuple
    qos: int
    retain: bool = False
    subscription_ids: tuple[int, ...] = ()
    size: int = field(default=0, init=False, repr=False, compare=False)


#: Most messages a router puts in one :class:`DeliveryRun` (a consumer
#: counts a run's messages, not the record, against its buffer's limit).
RUN_MAX_MESSAGES = 128
#: Most payload bytes a router puts in one :class:`DeliveryRun` (a message
#: past it starts the next run): a run stays well under a Kafka record's
#: size limit, as the records the packer joins (``packing.MAX_BYTES``).
RUN_MAX_BYTES = 64 * 1024


@dataclass(slots=True)
class SessionMarker:
    """A persistent DEVICE session's connection began (``attached``) or
    ended on node ``service_id``.  That node writes it to
    ``tbmq.msg.persisted`` with the client id as key, so it sits in the
    partition of the client's deliveries, in order with them.  The
    consumer of that partition (:class:`tbmq.cluster.sinks.PersistedWriter`)
    sends the client's later deliveries to that node.  It first waits until
    the earlier ones are in the device store, then passes an attach marker
    on to the node, whose session reads the store again: a delivery that
    the writer located elsewhere (its registry did not know of the new
    connection yet) is found there.

    :ivar client_id: the client id.
    :ivar service_id: the node of the connection.
    :ivar session_id: the connection (:attr:`SessionInfo.session_id`).
    :ivar attached: True when the connection began, False when it ended.
    """

    client_id: str
    service_id: str
    session_id: str
    attached: bool = True


@dataclass(slots=True)
class WillRecord:
    """A will message as CONNECT gave it [MQTT-3.1.2-7].

    :ivar topic: the will topic.
    :ivar payload: the will payload, bytes.
    :ivar qos: the will QoS (0-2).
    :ivar retain: the will RETAIN flag.
    :ivar properties: the will properties (``WILL_DELAY_INTERVAL`` among them).
    """

    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict


@dataclass(slots=True)
class SessionInfo:
    """Where a client's session is and what it is (``tbmq.client.session``,
    key client id; a tombstone means the session ended).

    :ivar client_id: the client id.
    :ivar service_id: the node the client is (or was last) connected to;
        :data:`UNCLAIMED` for a session the next node to start adopts.
    :ivar session_id: the connection, a uuid hex string.
    :ivar connected: True while the connection is open.
    :ivar persistent: see ARCHITECTURE §1, "Client types".
    :ivar client_type: :class:`tbmq.model.ClientType`.
    :ivar session_expiry_interval: seconds; ``0xFFFFFFFF`` never expires.
    :ivar protocol_level: 3, 4 or 5.
    :ivar connected_at: seconds since the epoch, or None.
    :ivar disconnected_at: seconds since the epoch, or None while connected.
    :ivar updated_at: seconds since the epoch of this record.
    :ivar will: the will of the connection, or None.
    :ivar address: the network address of the client's (last) connection,
        ``host:port`` (``[host]:port`` for IPv6), or None when not known
        (a record of version 1).
    :ivar username: the user name it authenticated with (CONNECT's, or
        the SCRAM user name), or None.
    :ivar credentials_name: the name of the credentials record that
        admitted it (:attr:`tbmq.auth.AuthResult.credentials_name`), or
        None (anonymous, JWT, a record of version 1).
    :ivar stamp: the order stamp of the grant of the connection
        :attr:`session_id` (:attr:`SessionEventResponse.stamp`, integer
        microseconds of a hybrid logical clock): every record of one
        connection carries it, and the registry applies a client id's
        records by it (:class:`tbmq.cluster.registry.SessionRegistry`); 0
        for a record of version 1 or 2 (older than any stamped grant).
    """

    client_id: str
    service_id: str
    session_id: str
    connected: bool
    persistent: bool
    client_type: ClientType
    session_expiry_interval: int
    protocol_level: int
    connected_at: float | None
    disconnected_at: float | None
    updated_at: float
    will: WillRecord | None = None
    address: str | None = None
    username: str | None = None
    credentials_name: str | None = None
    stamp: int = 0


@dataclass(slots=True)
class SubscriptionsRecord:
    """Every subscription of a client (``tbmq.client.subscriptions``).

    :ivar client_id: the client id.
    :ivar subscriptions: topic filter (``$share/g/f`` kept whole) →
        :class:`tbmq.model.SubscriptionOptions`.
    """

    client_id: str
    subscriptions: dict[str, SubscriptionOptions] = field(default_factory=dict)


@dataclass(slots=True)
class SessionEvent:
    """A request about a client's session, decided by the one consumer of
    its key (TBMQ's ``ClientSessionEvent``).

    :ivar kind: :data:`CONNECTION_REQUEST`, :data:`DISCONNECTED`,
        :data:`CLEAR_SESSION` or :data:`NODE_GONE`.
    :ivar client_id: the client id.
    :ivar service_id: the node that sends the request (the answer goes to
        its ``tbmq.client.session.event.response.<serviceId>``).
    :ivar session_id: the connection, a uuid hex string.
    :ivar request_id: matches the response to the request.
    :ivar clean_start: CONNECT's clean start / clean session flag; of a
        :data:`CLEAR_SESSION`: True when the node holding the session asks
        to end it (its expiry: the deciding member answers it, and that
        node ends the session), False for an administrator's request (the
        deciding node ends it).
    :ivar persistent: whether the new session is persistent.
    :ivar client_type: :class:`tbmq.model.ClientType`.
    :ivar session_expiry_interval: seconds.
    :ivar protocol_level: 3, 4 or 5.
    :ivar at: seconds since the epoch when the event happened.
    """

    kind: str
    client_id: str
    service_id: str
    session_id: str
    request_id: str
    clean_start: bool = False
    persistent: bool = False
    client_type: ClientType = ClientType.DEVICE
    session_expiry_interval: int = 0
    protocol_level: int = 4
    at: float = 0.0


@dataclass(slots=True)
class SessionEventResponse:
    """The answer to a :class:`SessionEvent`.

    :ivar client_id: the client id.
    :ivar request_id: the request's id.
    :ivar success: whether the node may go on (accept the connection).
    :ivar session_present: the CONNACK flag.
    :ivar session: the session as now recorded, or None.
    :ivar reason: why not, for logs ("" on success).
    :ivar stamp: the grant's order stamp (integer microseconds, greater
        than any the deciding member knew for the client id:
        :meth:`tbmq.cluster.registry.SessionRegistry.next_stamp`), which the
        asking node puts in every record of the connection
        (:attr:`SessionInfo.stamp`); 0 from a node that does not stamp.
    """

    client_id: str
    request_id: str
    success: bool
    session_present: bool
    session: SessionInfo | None = None
    reason: str = ""
    stamp: int = 0


@dataclass(slots=True)
class NodeInfo:
    """A node's heartbeat (``tbmq.cluster.nodes``, key service id).

    :ivar service_id: the node's service id.
    :ivar started_at: seconds since the epoch when the node started.
    :ivar sent_at: seconds since the epoch when this heartbeat was sent.
    :ivar stopping: True in the last heartbeat of a node that stops
        cleanly: the others take its sessions over at once.
    :ivar listeners: ``tuple[str, ...]``, the node's listeners as
        ``name=endpoint``, or ``endpoint`` for one named by its endpoint
        (:attr:`tbmq.config.ListenerConfig.label`; for operators).
    :ivar counters: ``dict[str, int]``, the node's totals since it started
        as of ``sent_at`` (:data:`HEARTBEAT_COUNTERS` names them; a reader
        ignores a name it does not know, and a name missing counts as
        absent, not 0); empty in a record of version 1.  The admin API sums
        the live nodes' counters into the cluster's figures and rates
        (:mod:`tbmq.ops.cluster_stats`).
    """

    service_id: str
    started_at: float
    sent_at: float
    stopping: bool = False
    listeners: tuple = ()
    counters: dict = field(default_factory=dict)


#: The :attr:`NodeInfo.counters` a node sends, all ``int`` >= 0:
#: ``received``/``sent`` MQTT PUBLISH packets from/to clients,
#: ``received_bytes``/``sent_bytes`` their payload bytes,
#: ``bytes_read``/``bytes_written`` bytes of every MQTT packet,
#: ``dropped`` messages not delivered (every reason) — totals since the
#: node started; ``connections`` MQTT connections open and ``sessions``
#: sessions held, now (:func:`tbmq.broker.traffic.heartbeat_counters`).
HEARTBEAT_COUNTERS = ("received", "sent", "received_bytes", "sent_bytes", "bytes_read",
                      "bytes_written", "dropped", "connections", "sessions")


@dataclass(slots=True)
class DisconnectCommand:
    """Tells a node to drop a client's connection (session taken over).

    :ivar client_id: the client id.
    :ivar session_id: the connection to drop (a newer one is kept).
    :ivar reason_code: the MQTT 5.0 DISCONNECT reason code
        (SESSION_TAKEN_OVER, or ADMINISTRATIVE_ACTION for an administrator's
        request).
    """

    client_id: str
    session_id: str
    reason_code: int
