"""The records carried by the bus and their one encoding each (ARCHITECTURE §3,
"the bus carries records, not objects").

Every encoded value is a msgpack array ``[tag, version, field, ...]``
(``msgpack.packb(..., use_bin_type=True)``; read back with
``unpackb(raw=False, strict_map_key=False, use_list=False)``).  The
``tag`` names the record type and ``version`` its field list; a reader
that meets another tag, an unknown version, a field count or a field type
it does not expect raises :class:`tbmq.errors.RecordEncodingError`, and
nothing else, whatever bytes it is fed.  A writer raises the same error
for a value that is not the codec's type or whose fields do not fit.
``None`` is a *tombstone* ("this key has no value any more") on the topics
that allow it; it is never encoded (Kafka carries it as a null value).

All records are version 1, but ``ses`` and ``node``, version 2; their
readers read version 1 too (a record an older node wrote, kept on
``tbmq.client.session`` or nested in a ``ser``; an older node's
heartbeat).  A node that knows only version 1 refuses a version 2 record:
run one version on every node of a cluster.  Times are seconds since the epoch (msgpack float 64); intervals
are whole seconds; properties are the MQTT 5.0 properties of
:mod:`tbmq.mqtt.properties` packed with
:func:`~tbmq.mqtt.properties.pack_properties` into a bin field, or nil when
there are none.  Nested records (a message in a delivery, a will in a
session, a session in a response) are the nested array of their own codec,
tag and version included.

============================================== =========== ============================ ====
topic                                          key         record (tag)                 tomb
============================================== =========== ============================ ====
``tbmq.msg.all``                               topic name  Message (``msg``)            no
``tbmq.msg.retained``                          topic name  Message (``msg``)            yes
``tbmq.msg.persisted``                         client id   Delivery (``dlv``),          no
                                                           DeliveryRun (``dlr``) or
                                                           SessionMarker (``mrk``)
``tbmq.msg.downlink.basic.<serviceId>``        client id   Delivery (``dlv``)           no
``tbmq.msg.downlink.persisted.<serviceId>``    client id   Delivery (``dlv``) or        no
                                                           SessionMarker (``mrk``)
``tbmq.msg.app.<clientId>``                    client id   Delivery (``dlv``) or        no
                                                           DeliveryRun (``dlr``, QoS 1)
``tbmq.msg.app.shared.<filter>``               topic name  Delivery (``dlv``)           no
``tbmq.client.session``                        client id   SessionInfo (``ses``)        yes
``tbmq.client.subscriptions``                  client id   SubscriptionsRecord          yes
                                                           (``subs``)
``tbmq.client.session.event.request``          client id   SessionEvent (``sev``)       no
``tbmq.client.session.event.response.<sid>``   client id   SessionEventResponse         no
                                                           (``ser``)
``tbmq.client.disconnect.<serviceId>``         client id   DisconnectCommand (``dis``)  no
``tbmq.events``                                client id   raw bytes (``BytesCodec``)   no
                                               or node
============================================== =========== ============================ ====

The fields of each array, after ``tag, version``:

``msg`` Message
    topic (str), payload (bin), qos (int 0-2), retain (bool), properties
    (bin|nil), publisher (str), received_at (float, s), expires_at (float
    s|nil).
``dlv`` Delivery
    client_id (str; the topic filter on ``tbmq.msg.app.shared.<filter>``),
    message (``msg`` array), qos (int 0-2), retain (bool), subscription_ids
    (array of int), seq (int).
``mrk`` SessionMarker
    client_id (str), service_id (str), session_id (str, uuid hex), attached
    (bool).
``will`` WillRecord (nested in a session)
    topic (str), payload (bin), qos (int 0-2), retain (bool), properties
    (bin|nil).
``ses`` SessionInfo, version 3
    client_id (str), service_id (str), session_id (str, uuid hex), connected
    (bool), persistent (bool), client_type (str ``DEVICE``/``APPLICATION``),
    session_expiry_interval (int, s), protocol_level (int), connected_at
    (float s|nil), disconnected_at (float s|nil), updated_at (float s), will
    (``will`` array|nil), address (str ``host:port``|nil), username
    (str|nil), credentials_name (str|nil), stamp (int >= 0, the grant's
    order stamp, microseconds).  Version 2: the first fifteen fields, read
    with stamp 0 (older than any stamped grant); version 1: the first
    twelve, read with address, username and credentials_name None too.
``subs`` SubscriptionsRecord
    client_id (str), subscriptions (map str → [qos (int 0-2), no_local
    (bool), retain_as_published (bool), retain_handling (int 0-2),
    subscription_id (int|nil)]).
``sev`` SessionEvent
    kind (str, one of :data:`SESSION_EVENT_KINDS`), client_id, service_id,
    session_id, request_id (str), clean_start (bool), persistent (bool),
    client_type (str), session_expiry_interval (int, s), protocol_level
    (int), at (float, s).
``ser`` SessionEventResponse, version 2
    client_id (str), request_id (str), success (bool), session_present
    (bool), session (``ses`` array|nil), reason (str), stamp (int >= 0, the
    grant's order stamp).  Version 1: the first six fields, read with stamp 0.
``dis`` DisconnectCommand
    client_id (str), session_id (str), reason_code (int 0-255, an MQTT 5.0
    reason code).
``node`` NodeInfo, version 2 (``tbmq.cluster.nodes``, key service id)
    service_id (str), started_at (float s), sent_at (float s), stopping
    (bool), listeners (array of str), counters (map str → int >= 0,
    :data:`HEARTBEAT_COUNTERS`).  Version 1: the first five fields; read
    with counters ``{}``.

:class:`Record` is what a consumer's handler receives: the topic, key,
decoded value, headers, partition and offset of one record.

The codecs are :class:`~tbmq.cluster.record_codec.RecordCodec`,
:class:`~tbmq.cluster.record_codec.RecordUnion` and
:class:`~tbmq.cluster.record_codec.BytesCodec`.  Each record type has a
writer and a reader per version that check field by field (and say which
field is wrong); the records the bus carries per message (``msg``,
``dlv``) or per CONNECT (``mrk``, ``ses``, ``sev``, ``ser``) also have a
hot path that writes or reads a record whose fields all have their plain
type in one go and leaves any other to the field checks.  A message the
hot path reads keeps the ``msg`` array it came in (``Message.wire``, as
msgpack read it), one the hot path writes keeps the array it wrote, and
the writers write that array again as it is: a routing node's deliveries
carry the publishing node's encoding of the message, neither checked nor
its properties packed a second time.
"""

from __future__ import annotations

from itertools import product, repeat
from operator import attrgetter, is_
from typing import Any

from tbmq.cluster.message_arrays import message_from_array as _message_from_array
from tbmq.cluster.message_arrays import messages_from_arrays as _messages_from_arrays
from tbmq.cluster.message_arrays import messages_packed as _messages_packed
from tbmq.cluster.message_arrays import props_in as _props_in
from tbmq.cluster.message_arrays import templated_stream as _templated_stream
from tbmq.cluster.record_fields import (
    _Bad, _bool, _bytes, _client_type, _count, _float, _int, _opt_float, _opt_str,
    _props_out, _qos, _str,
)
from tbmq.cluster.record_codec import ARRAY_TYPES, VERSION, BytesCodec, RecordCodec, RecordUnion
from tbmq.cluster.record_types import (
    CLEAR_SESSION,
    CONNECTION_REQUEST,
    DISCONNECTED,
    HEARTBEAT_COUNTERS,
    NODE_GONE,
    RUN_MAX_BYTES,
    RUN_MAX_MESSAGES,
    SESSION_EVENT_KINDS,
    UNCLAIMED,
    Delivery,
    DeliveryRun,
    DisconnectCommand,
    NodeInfo,
    Record,
    SessionEvent,
    SessionEventResponse,
    SessionInfo,
    SessionMarker,
    SubscriptionsRecord,
    WillRecord,
    new_record,
)
from tbmq.model import ClientType, Message, SubscriptionOptions

__all__ = [
    "APPLICATION",
    "BYTES",
    "CLEAR_SESSION",
    "CONNECTION_REQUEST",
    "DELIVERY",
    "DELIVERY_RUN",
    "DOWNLINK",
    "DISCONNECT",
    "DISCONNECTED",
    "MARKER",
    "MESSAGE",
    "HEARTBEAT_COUNTERS",
    "NODE",
    "NODE_GONE",
    "NODE_VERSION",
    "PERSISTED",
    "PERSISTED_RUNS",
    "RETAINED",
    "RUN_MAX_BYTES",
    "RUN_MAX_MESSAGES",
    "SESSION",
    "SESSION_EVENT",
    "SESSION_EVENT_KINDS",
    "SESSION_EVENT_RESPONSE",
    "SESSION_VERSION",
    "SUBSCRIPTIONS",
    "UNCLAIMED",
    "VERSION",
    "BytesCodec",
    "Delivery",
    "DeliveryRun",
    "DisconnectCommand",
    "NodeInfo",
    "Record",
    "RecordCodec",
    "RecordUnion",
    "SessionEvent",
    "SessionEventResponse",
    "SessionInfo",
    "SessionMarker",
    "SubscriptionsRecord",
    "WillRecord",
    "new_record",
]

#: The version :data:`SESSION` writes (it reads 1 and 2 too).
SESSION_VERSION = 3

# -- hot paths (RecordCodec's ``fast``) ----------------------------------------------
#
# A record whose fields all have their plain type and fit is written and read
# in one go.  Message and Delivery check each field inline (they pass per
# message); the per-CONNECT records compare the types of their whole array
# with the rows of types they accept (one C-level pass), then the values.

_N = type(None)
#: :class:`ClientType` by its value (what ``ClientType(value)`` accepts
#: from msgpack: a str).
_CLIENT_TYPES = {t.value: t for t in ClientType}


def _type_rows(*columns: type | tuple[type, ...]) -> frozenset:
    """:returns: every tuple of types of an array whose item ``i`` may be
        of the type(s) ``columns[i]``."""
    return frozenset(product(*(c if isinstance(c, tuple) else (c,) for c in columns)))


def _types(array: Any) -> tuple:
    """:returns: the exact types of the items of ``array``."""
    return tuple(map(type, array))


# Message ------------------------------------------------------------------------

def _write_message(m: Message) -> list:
    return [_str(m.topic, "topic"), _bytes(m.payload, "payload"), _qos(m.qos, "qos"),
            _bool(m.retain, "retain"), _props_out(m.properties, "properties"),
            _str(m.publisher, "publisher"), _float(m.received_at, "received_at"),
            _opt_float(m.expires_at, "expires_at")]


def _read_message_v1(f: list) -> Message:
    topic, payload, qos, retain, props, publisher, received_at, expires_at = _count(
        f, 8, "message")
    return Message(_str(topic, "topic"), _bytes(payload, "payload"), _qos(qos, "qos"),
                   _bool(retain, "retain"), _props_in(props, "properties"),
                   _str(publisher, "publisher"), _float(received_at, "received_at"),
                   _opt_float(expires_at, "expires_at"))


def _message_array(m: Message) -> tuple | None:
    wire = m.wire
    if wire is not None:  # read from the bus, or written once: its array (checked then)
        return wire
    topic, payload, qos, retain, props, publisher, received_at, expires_at = (
        m.topic, m.payload, m.qos, m.retain, m.properties, m.publisher, m.received_at,
        m.expires_at)
    if (type(topic) is str and type(payload) is bytes and type(qos) is int and 0 <= qos <= 2
            and type(retain) is bool and type(props) is dict and type(publisher) is str
            and type(received_at) is float and (expires_at is None or type(expires_at) is float)):
        # kept: a message written again (its deliveries, when the node that
        # published it routes it: the Kafka bus's own records) is not
        # checked nor its properties packed a second time
        wire = m.wire = ("msg", 1, topic, payload, qos, retain,
                         _props_out(props, "properties") if props else None, publisher,
                         received_at, expires_at)
        return wire
    return None


#: ``tbmq.msg.all``: :class:`tbmq.model.Message`, no tombstone.
MESSAGE = RecordCodec("Message", Message, "msg", _write_message, {1: _read_message_v1},
                      fast=(_message_array, _message_from_array, _messages_from_arrays),
                      write_many=_messages_packed)
#: ``tbmq.msg.retained``: :class:`tbmq.model.Message` or a tombstone.
RETAINED = MESSAGE.with_tombstone()


# Delivery -----------------------------------------------------------------------

def _write_delivery(d: Delivery) -> list:
    ids = d.subscription_ids
    if not isinstance(ids, (tuple, list)):
        raise _Bad(f"subscription_ids: expected a tuple, got {type(ids).__name__}")
    return [_str(d.client_id, "client_id"), MESSAGE.to_list(d.message), _qos(d.qos, "qos"),
            _bool(d.retain, "retain"), [_int(i, "subscription_ids") for i in ids],
            _int(d.seq, "seq")]


def _read_delivery_v1(f: list) -> Delivery:
    client_id, message, qos, retain, ids, seq = _count(f, 6, "delivery")
    if type(ids) not in ARRAY_TYPES:
        raise _Bad("subscription_ids: expected an array")
    return Delivery(_str(client_id, "client_id"), MESSAGE.from_list(message), _qos(qos, "qos"),
                    _bool(retain, "retain"), tuple(_int(i, "subscription_ids") for i in ids),
                    _int(seq, "seq"))


def _delivery_array(d: Delivery) -> list | None:
    client_id, message, qos, retain, ids, seq = (
        d.client_id, d.message, d.qos, d.retain, d.subscription_ids, d.seq)
    if (type(client_id) is str and type(message) is Message and type(qos) is int
            and 0 <= qos <= 2 and type(retain) is bool and type(ids) is tuple
            and type(seq) is int and (not ids or _all_int(ids))):
        m = message.wire  # read or written before (a routed message): as it was
        if m is None:
            m = _message_array(message)
        if m is not None:
            return ["dlv", 1, client_id, m, qos, retain, ids, seq]
    return None


#: The fields the deliveries of one batch to one client share (the
#: router's: the same objects), each read by itself
_SHARED = tuple(map(attrgetter, ("client_id", "qos", "retain", "subscription_ids", "seq")))
_MESSAGE_OF = attrgetter("message")
#: The msgpack header of a delivery's array (a fixarray of 8 items)
_DELIVERY_HEADER = b"\x98"


def _deliveries_packed(ds: list, pack) -> list | None:
    """The hot path of :meth:`~tbmq.cluster.record_codec.RecordCodec.encode_many`
    for deliveries (``write_many``): the deliveries of one batch to one
    client (:meth:`tbmq.cluster.sinks.BusSink.send_many`) share their
    client id, QoS, RETAIN flag, subscription identifiers and ``seq`` (the
    very same objects, checked in C, no bytecode per delivery); those
    are checked and packed once, and each delivery is its message's array
    packed alone between them: a msgpack array is its header followed by
    its items, so each is byte for byte what
    :meth:`~tbmq.cluster.record_codec.RecordCodec.encode` gives it, for
    a third of the packing and no array per delivery.

    :param ds: :class:`Delivery` objects, more than two.
    :param pack: this thread's ``msgpack.Packer(use_bin_type=True).pack``.
    :returns: their encodings, or None (fewer than three, no such shared
        fields, a field of another type: each is then written alone).
    :raises Exception: what ``pack`` raises (each is then written alone).
    """
    if len(ds) < 3:  # (the checks would cost more than they save)
        return None
    first = ds[0]
    array = _delivery_array(first)  # the shared fields' checks, once
    if array is None:
        return None
    for field, shared in zip(_SHARED, (first.client_id, first.qos, first.retain,
                                       first.subscription_ids, first.seq)):
        if not all(map(is_, map(field, ds), repeat(shared))):
            return None
    messages = list(map(_MESSAGE_OF, ds))
    if len(set(map(type, messages))) != 1:  # the first one's is Message
        return None
    arrays = list(map(_message_array, messages))
    if None in arrays:
        return None
    head = _DELIVERY_HEADER + pack(array[:3])[1:]  # "dlv", 1, client id
    tail = pack(array[4:])[1:]  # QoS, RETAIN, subscription identifiers, seq
    return list(map(b"".join, zip(repeat(head), map(pack, arrays), repeat(tail))))


def _delivery_from_array(obj: Any) -> Delivery | None:
    if len(obj) == 8:
        tag, version, client_id, message, qos, retain, ids, seq = obj
        if (tag == "dlv" and version == 1 and type(version) is int and type(client_id) is str
                and type(message) is tuple and type(qos) is int and 0 <= qos <= 2
                and type(retain) is bool and type(ids) is tuple and type(seq) is int
                and (not ids or _all_int(ids))):
            m = _message_from_array(message)
            if m is not None:
                return Delivery(client_id, m, qos, retain, ids, seq)
    return None


def _all_int(values: tuple) -> bool:
    """Whether every item of ``values`` is an ``int`` (not a bool)."""
    for v in values:
        if type(v) is not int:
            return False
    return True


#: The downlink, persisted and application topics: :class:`Delivery`.
DELIVERY = RecordCodec("Delivery", Delivery, "dlv", _write_delivery, {1: _read_delivery_v1},
                       fast=(_delivery_array, _delivery_from_array),
                       write_many=_deliveries_packed)


# DeliveryRun --------------------------------------------------------------------

def _write_run(r: DeliveryRun) -> list:
    ids, messages = r.subscription_ids, r.messages
    if not isinstance(ids, (tuple, list)):
        raise _Bad(f"subscription_ids: expected a tuple, got {type(ids).__name__}")
    if not isinstance(messages, (tuple, list)) or not messages:
        raise _Bad("messages: expected a non-empty sequence of messages")
    return [_str(r.client_id, "client_id"), [MESSAGE.to_list(m) for m in messages],
            _qos(r.qos, "qos"), _bool(r.retain, "retain"),
            [_int(i, "subscription_ids") for i in ids]]


def _read_run_v1(f: list) -> DeliveryRun:
    client_id, messages, qos, retain, ids = _count(f, 5, "run")
    if type(messages) not in ARRAY_TYPES or not messages:
        raise _Bad("messages: expected a non-empty array")
    if type(ids) not in ARRAY_TYPES:
        raise _Bad("subscription_ids: expected an array")
    return DeliveryRun(_str(client_id, "client_id"),
                       tuple(MESSAGE.from_list(m) for m in messages), _qos(qos, "qos"),
                       _bool(retain, "retain"),
                       tuple(_int(i, "subscription_ids") for i in ids))


def _run_array(r: DeliveryRun) -> list | None:
    client_id, messages, qos, retain, ids = (
        r.client_id, r.messages, r.qos, r.retain, r.subscription_ids)
    if (type(client_id) is str and type(qos) is int and 0 <= qos <= 2
            and type(retain) is bool and type(ids) is tuple and (not ids or _all_int(ids))
            and type(messages) in ARRAY_TYPES and messages):
        # the arrays the messages were read in or first written as (a
        # routing node's messages have theirs: no call per message); a
        # run whose first has none (the embedded node's: routed as
        # published) is written for the first time here
        first = messages[0]
        arrays = ([m.wire if type(m) is Message else None for m in messages]
                  if type(first) is Message and first.wire is not None else [None])
        if None in arrays:
            arrays = [_message_array(m) if type(m) is Message else None for m in messages]
            if None in arrays:
                return None  # the field by field writer says what is wrong
        return ["dlr", 1, client_id, arrays, qos, retain, ids]
    return None


#: The msgpack header of a run's array (a fixarray of 7 items)
_RUN_HEADER = b"\x97"


def _runs_packed(runs: list, pack) -> list | None:
    """The hot path of :meth:`~tbmq.cluster.record_codec.RecordCodec.encode_many`
    for runs (``write_many``): a run whose messages share one template (a
    published run's: :func:`~tbmq.cluster.message_arrays.templated_stream`
    makes their bytes in one call) is written around them, its own fields checked and packed
    once; a msgpack array is its header and then its items, so these are
    the bytes ``encode`` gives the run (a test compares them).

    :param runs: :class:`DeliveryRun` objects.
    :param pack: this thread's ``msgpack.Packer(use_bin_type=True).pack``.
    :returns: their encodings, or None (a field of another type, messages
        without one template: each is then written by its array)."""
    out = []
    for r in runs:
        client_id, messages, qos, retain, ids = (
            r.client_id, r.messages, r.qos, r.retain, r.subscription_ids)
        if not (type(client_id) is str and type(qos) is int and 0 <= qos <= 2
                and type(retain) is bool and type(ids) is tuple and (not ids or _all_int(ids))
                and type(messages) in ARRAY_TYPES and messages
                and getattr(messages[0], "template", None) is not None  # (a published run's)
                and set(map(type, messages)) == {Message}):
            return None
        stream = _templated_stream(messages)
        if stream is None:
            return None
        n = len(messages)
        out.append(b"".join((_RUN_HEADER, pack(("dlr", 1, client_id))[1:],
                             pack((None,) * n)[:-n],  # the header of an array of n
                             stream, pack((qos, retain, ids))[1:])))
    return out


def _run_from_array(obj: Any) -> DeliveryRun | None:
    if len(obj) == 7:
        tag, version, client_id, arrays, qos, retain, ids = obj
        if (tag == "dlr" and version == 1 and type(version) is int and type(client_id) is str
                and type(arrays) is tuple and arrays and type(qos) is int and 0 <= qos <= 2
                and type(retain) is bool and type(ids) is tuple
                and (not ids or _all_int(ids))):
            messages = _messages_from_arrays(arrays)
            if messages is not None:
                return DeliveryRun(client_id, tuple(messages), qos, retain, ids)
    return None


def _run_weight(obj: Any) -> int:
    """The messages a run's array carries (1 when it is not well-formed:
    its reader refuses it)."""
    if len(obj) == 7 and type(obj[3]) in ARRAY_TYPES and obj[3]:
        return len(obj[3])
    return 1


def _run_messages(run: DeliveryRun) -> int:
    """The messages a decoded run carries."""
    return len(run.messages)


#: :class:`DeliveryRun` alone (in :data:`DOWNLINK`).
DELIVERY_RUN = RecordCodec("DeliveryRun", DeliveryRun, "dlr", _write_run, {1: _read_run_v1},
                           fast=(_run_array, _run_from_array), weight=_run_weight,
                           value_weight=_run_messages, write_many=_runs_packed)
#: ``tbmq.msg.downlink.basic.<serviceId>``: :class:`Delivery` or
#: :class:`DeliveryRun`.
DOWNLINK = RecordUnion("Downlink", DELIVERY, DELIVERY_RUN)
#: ``tbmq.msg.app.<clientId>`` and ``tbmq.msg.app.shared.<filter>``:
#: :class:`Delivery`, or a :class:`DeliveryRun` of QoS 1 on an APPLICATION
#: client's own topic (``docs/bus.md``, "Runs of an APPLICATION client"):
#: records of tbmq before runs are still read.
APPLICATION = RecordUnion("Application", DELIVERY, DELIVERY_RUN)


def _write_marker(m: SessionMarker) -> list:
    return [_str(m.client_id, "client_id"), _str(m.service_id, "service_id"),
            _str(m.session_id, "session_id"), _bool(m.attached, "attached")]


def _read_marker_v1(f: list) -> SessionMarker:
    client_id, service_id, session_id, attached = _count(f, 4, "marker")
    return SessionMarker(_str(client_id, "client_id"), _str(service_id, "service_id"),
                         _str(session_id, "session_id"), _bool(attached, "attached"))


_MARKER_IN = (str, int, str, str, str, bool)


def _marker_array(m: SessionMarker) -> list | None:
    array = ["mrk", 1, m.client_id, m.service_id, m.session_id, m.attached]
    return array if _types(array) == _MARKER_IN else None


def _marker_from_array(obj: Any) -> SessionMarker | None:
    if _types(obj) == _MARKER_IN and obj[0] == "mrk" and obj[1] == 1:
        return SessionMarker(*obj[2:])
    return None


#: :class:`SessionMarker` alone (nested in :data:`PERSISTED`).
MARKER = RecordCodec("SessionMarker", SessionMarker, "mrk", _write_marker, {1: _read_marker_v1},
                     fast=(_marker_array, _marker_from_array))
#: ``tbmq.msg.downlink.persisted.<serviceId>``: :class:`Delivery` or
#: :class:`SessionMarker`.
PERSISTED = RecordUnion("Persisted", DELIVERY, MARKER)
#: ``tbmq.msg.persisted``: :class:`Delivery`, :class:`DeliveryRun` (a
#: routed batch's messages to one client) or :class:`SessionMarker`.
PERSISTED_RUNS = RecordUnion("PersistedRuns", DELIVERY, DELIVERY_RUN, MARKER)


# WillRecord, SessionInfo ----------------------------------------------------------

def _write_will(w: WillRecord) -> list:
    return [_str(w.topic, "topic"), _bytes(w.payload, "payload"), _qos(w.qos, "qos"),
            _bool(w.retain, "retain"), _props_out(w.properties, "properties")]


def _read_will_v1(f: list) -> WillRecord:
    topic, payload, qos, retain, props = _count(f, 5, "will")
    return WillRecord(_str(topic, "topic"), _bytes(payload, "payload"), _qos(qos, "qos"),
                      _bool(retain, "retain"), _props_in(props, "properties"))


#: The will nested in a :class:`SessionInfo`.
WILL = RecordCodec("WillRecord", WillRecord, "will", _write_will, {1: _read_will_v1})


def _write_session(s: SessionInfo) -> list:
    return [_str(s.client_id, "client_id"), _str(s.service_id, "service_id"),
            _str(s.session_id, "session_id"), _bool(s.connected, "connected"),
            _bool(s.persistent, "persistent"), _client_type(s.client_type, "client_type").value,
            _int(s.session_expiry_interval, "session_expiry_interval", 0),
            _int(s.protocol_level, "protocol_level", 0, 255),
            _opt_float(s.connected_at, "connected_at"),
            _opt_float(s.disconnected_at, "disconnected_at"),
            _float(s.updated_at, "updated_at"),
            None if s.will is None else WILL.to_list(s.will),
            _opt_str(s.address, "address"), _opt_str(s.username, "username"),
            _opt_str(s.credentials_name, "credentials_name"), _int(s.stamp, "stamp", 0)]


def _read_session_v3(f: list) -> SessionInfo:
    info = _read_session_v2(_count(f, 16, "session")[:15])
    info.stamp = _int(f[15], "stamp", 0)
    return info


def _read_session_v2(f: list) -> SessionInfo:
    info = _read_session_v1(_count(f, 15, "session")[:12])
    address, username, credentials_name = f[12:]
    info.address = _opt_str(address, "address")
    info.username = _opt_str(username, "username")
    info.credentials_name = _opt_str(credentials_name, "credentials_name")
    return info


def _read_session_v1(f: list) -> SessionInfo:
    (client_id, service_id, session_id, connected, persistent, client_type, expiry, level,
     connected_at, disconnected_at, updated_at, will) = _count(f, 12, "session")
    return SessionInfo(
        _str(client_id, "client_id"), _str(service_id, "service_id"),
        _str(session_id, "session_id"), _bool(connected, "connected"),
        _bool(persistent, "persistent"), _client_type(client_type, "client_type"),
        _int(expiry, "session_expiry_interval", 0), _int(level, "protocol_level", 0, 255),
        _opt_float(connected_at, "connected_at"), _opt_float(disconnected_at, "disconnected_at"),
        _float(updated_at, "updated_at"), None if will is None else WILL.from_list(will))


_OPT_FLOAT, _OPT_STR = (float, _N), (str, _N)
_SESSION_OUT = _type_rows(str, int, str, str, str, bool, bool, ClientType, int, int, _OPT_FLOAT,
                          _OPT_FLOAT, float, (WillRecord, _N), _OPT_STR, _OPT_STR, _OPT_STR,
                          int)
_SESSION_IN = _type_rows(str, int, str, str, str, bool, bool, str, int, int, _OPT_FLOAT,
                         _OPT_FLOAT, float, (tuple, _N), _OPT_STR, _OPT_STR, _OPT_STR, int)


def _session_array(s: SessionInfo) -> list | None:
    array = ["ses", 3, s.client_id, s.service_id, s.session_id, s.connected, s.persistent,
             s.client_type, s.session_expiry_interval, s.protocol_level, s.connected_at,
             s.disconnected_at, s.updated_at, s.will, s.address, s.username, s.credentials_name,
             s.stamp]
    if (_types(array) in _SESSION_OUT and array[8] >= 0 and 0 <= array[9] <= 255
            and array[17] >= 0):
        array[7] = array[7].value
        if array[13] is not None:
            array[13] = WILL.to_list(array[13])
        return array
    return None


def _session_from_array(obj: Any) -> SessionInfo | None:
    if (_types(obj) in _SESSION_IN and obj[0] == "ses" and obj[1] == 3 and obj[8] >= 0
            and 0 <= obj[9] <= 255 and obj[17] >= 0):
        client_type, will = _CLIENT_TYPES.get(obj[7]), obj[13]
        if client_type is not None:
            return SessionInfo(*obj[2:7], client_type, *obj[8:13],
                               None if will is None else WILL.from_list(will), *obj[14:])
    return None


_SESSION = RecordCodec("SessionInfo", SessionInfo, "ses", _write_session,
                       {1: _read_session_v1, 2: _read_session_v2, 3: _read_session_v3},
                       version=SESSION_VERSION,
                       fast=(_session_array, _session_from_array))
#: ``tbmq.client.session``: :class:`SessionInfo` or a tombstone.
SESSION = _SESSION.with_tombstone()


# SubscriptionsRecord -------------------------------------------------------------

def _write_subscriptions(r: SubscriptionsRecord) -> list:
    subs = r.subscriptions
    if not isinstance(subs, dict):
        raise _Bad(f"subscriptions: expected dict, got {type(subs).__name__}")
    out = {}
    for topic_filter, o in subs.items():
        if not isinstance(o, SubscriptionOptions):
            raise _Bad(f"subscriptions: expected SubscriptionOptions, got {type(o).__name__}")
        sid = o.subscription_id
        out[_str(topic_filter, "subscriptions")] = [
            _qos(o.qos, "qos"), _bool(o.no_local, "no_local"),
            _bool(o.retain_as_published, "retain_as_published"),
            _int(o.retain_handling, "retain_handling", 0, 2),
            None if sid is None else _int(sid, "subscription_id")]
    return [_str(r.client_id, "client_id"), out]


def _read_subscriptions_v1(f: list) -> SubscriptionsRecord:
    client_id, subs = _count(f, 2, "subscriptions")
    if type(subs) is not dict:
        raise _Bad("subscriptions: expected a map")
    out = {}
    for topic_filter, o in subs.items():
        if type(o) not in ARRAY_TYPES:
            raise _Bad("subscriptions: expected an options array")
        qos, no_local, rap, rh, sid = _count(o, 5, "subscription options")
        out[_str(topic_filter, "subscriptions")] = SubscriptionOptions(
            _qos(qos, "qos"), _bool(no_local, "no_local"), _bool(rap, "retain_as_published"),
            _int(rh, "retain_handling", 0, 2),
            None if sid is None else _int(sid, "subscription_id"))
    return SubscriptionsRecord(_str(client_id, "client_id"), out)


#: ``tbmq.client.subscriptions``: :class:`SubscriptionsRecord` or a tombstone.
SUBSCRIPTIONS = RecordCodec("SubscriptionsRecord", SubscriptionsRecord, "subs",
                            _write_subscriptions, {1: _read_subscriptions_v1}, tombstone=True)


# SessionEvent, SessionEventResponse, DisconnectCommand ------------------------------

def _kind(v: Any) -> str:
    if type(v) is not str or v not in SESSION_EVENT_KINDS:
        raise _Bad(f"kind: not a session event kind: {v!r}")
    return v


def _write_event(e: SessionEvent) -> list:
    return [_kind(e.kind), _str(e.client_id, "client_id"), _str(e.service_id, "service_id"),
            _str(e.session_id, "session_id"), _str(e.request_id, "request_id"),
            _bool(e.clean_start, "clean_start"), _bool(e.persistent, "persistent"),
            _client_type(e.client_type, "client_type").value,
            _int(e.session_expiry_interval, "session_expiry_interval", 0),
            _int(e.protocol_level, "protocol_level", 0, 255), _float(e.at, "at")]


def _read_event_v1(f: list) -> SessionEvent:
    (kind, client_id, service_id, session_id, request_id, clean_start, persistent, client_type,
     expiry, level, at) = _count(f, 11, "session event")
    return SessionEvent(
        _kind(kind), _str(client_id, "client_id"), _str(service_id, "service_id"),
        _str(session_id, "session_id"), _str(request_id, "request_id"),
        _bool(clean_start, "clean_start"), _bool(persistent, "persistent"),
        _client_type(client_type, "client_type"), _int(expiry, "session_expiry_interval", 0),
        _int(level, "protocol_level", 0, 255), _float(at, "at"))


_EVENT_OUT = (str, int, str, str, str, str, str, bool, bool, ClientType, int, int, float)
_EVENT_IN = (str, int, str, str, str, str, str, bool, bool, str, int, int, float)


def _event_array(e: SessionEvent) -> list | None:
    array = ["sev", 1, e.kind, e.client_id, e.service_id, e.session_id, e.request_id,
             e.clean_start, e.persistent, e.client_type, e.session_expiry_interval,
             e.protocol_level, e.at]
    if (_types(array) == _EVENT_OUT and array[2] in SESSION_EVENT_KINDS and array[10] >= 0
            and 0 <= array[11] <= 255):
        array[9] = array[9].value
        return array
    return None


def _event_from_array(obj: Any) -> SessionEvent | None:
    if (_types(obj) == _EVENT_IN and obj[0] == "sev" and obj[1] == 1
            and obj[2] in SESSION_EVENT_KINDS and obj[10] >= 0 and 0 <= obj[11] <= 255):
        client_type = _CLIENT_TYPES.get(obj[9])
        if client_type is not None:
            return SessionEvent(*obj[2:9], client_type, *obj[10:])
    return None


#: ``tbmq.client.session.event.request``: :class:`SessionEvent`.
SESSION_EVENT = RecordCodec("SessionEvent", SessionEvent, "sev", _write_event,
                            {1: _read_event_v1}, fast=(_event_array, _event_from_array))


def _write_response(r: SessionEventResponse) -> list:
    return [_str(r.client_id, "client_id"), _str(r.request_id, "request_id"),
            _bool(r.success, "success"), _bool(r.session_present, "session_present"),
            None if r.session is None else _SESSION.to_list(r.session), _str(r.reason, "reason"),
            _int(r.stamp, "stamp", 0)]


def _read_response_v2(f: list) -> SessionEventResponse:
    response = _read_response_v1(_count(f, 7, "response")[:6])
    response.stamp = _int(f[6], "stamp", 0)
    return response


def _read_response_v1(f: list) -> SessionEventResponse:
    client_id, request_id, success, present, session, reason = _count(f, 6, "response")
    return SessionEventResponse(
        _str(client_id, "client_id"), _str(request_id, "request_id"), _bool(success, "success"),
        _bool(present, "session_present"),
        None if session is None else _SESSION.from_list(session), _str(reason, "reason"))


_RESPONSE_OUT = _type_rows(str, int, str, str, bool, bool, (SessionInfo, _N), str, int)
_RESPONSE_IN = _type_rows(str, int, str, str, bool, bool, (tuple, _N), str, int)


def _response_array(r: SessionEventResponse) -> list | None:
    array = ["ser", 2, r.client_id, r.request_id, r.success, r.session_present, r.session,
             r.reason, r.stamp]
    if _types(array) not in _RESPONSE_OUT or array[8] < 0:
        return None
    if array[6] is not None:
        array[6] = _SESSION.to_list(array[6])
    return array


def _response_from_array(obj: Any) -> SessionEventResponse | None:
    if _types(obj) in _RESPONSE_IN and obj[0] == "ser" and obj[1] == 2 and obj[8] >= 0:
        session = obj[6]
        return SessionEventResponse(*obj[2:6],
                                    None if session is None else _SESSION.from_list(session),
                                    obj[7], obj[8])
    return None


#: ``tbmq.client.session.event.response.<serviceId>``: :class:`SessionEventResponse`.
SESSION_EVENT_RESPONSE = RecordCodec("SessionEventResponse", SessionEventResponse, "ser",
                                     _write_response,
                                     {1: _read_response_v1, 2: _read_response_v2}, version=2,
                                     fast=(_response_array, _response_from_array))


def _write_disconnect(c: DisconnectCommand) -> list:
    return [_str(c.client_id, "client_id"), _str(c.session_id, "session_id"),
            _int(c.reason_code, "reason_code", 0, 255)]


def _read_disconnect_v1(f: list) -> DisconnectCommand:
    client_id, session_id, reason_code = _count(f, 3, "disconnect")
    return DisconnectCommand(_str(client_id, "client_id"), _str(session_id, "session_id"),
                             _int(reason_code, "reason_code", 0, 255))


#: ``tbmq.client.disconnect.<serviceId>``: :class:`DisconnectCommand`.
DISCONNECT = RecordCodec("DisconnectCommand", DisconnectCommand, "dis", _write_disconnect,
                         {1: _read_disconnect_v1})

def _write_node(n: NodeInfo) -> list:
    listeners = n.listeners
    if not isinstance(listeners, (tuple, list)):
        raise _Bad(f"listeners: expected a tuple, got {type(listeners).__name__}")
    return [_str(n.service_id, "service_id"), _float(n.started_at, "started_at"),
            _float(n.sent_at, "sent_at"), _bool(n.stopping, "stopping"),
            [_str(x, "listeners") for x in listeners], _counters(n.counters)]


def _counters(v: Any) -> dict:
    """The counters map of a heartbeat: ``str`` → ``int`` >= 0."""
    if not isinstance(v, dict):
        raise _Bad(f"counters: expected a map, got {type(v).__name__}")
    return {_str(k, "counters"): _int(n, f"counters.{k}", 0) for k, n in v.items()}


def _read_node_v1(f: list) -> NodeInfo:
    return _read_node(_count(f, 5, "node"), {})


def _read_node_v2(f: list) -> NodeInfo:
    fields = _count(f, 6, "node")
    return _read_node(fields[:5], _counters(fields[5]))


def _read_node(f: list, counters: dict) -> NodeInfo:
    service_id, started_at, sent_at, stopping, listeners = f
    if type(listeners) not in ARRAY_TYPES:
        raise _Bad("listeners: expected an array")
    return NodeInfo(_str(service_id, "service_id"), _float(started_at, "started_at"),
                    _float(sent_at, "sent_at"), _bool(stopping, "stopping"),
                    tuple(_str(x, "listeners") for x in listeners), counters)


#: The version :data:`NODE` writes (it reads 1 too).
NODE_VERSION = 2
#: ``tbmq.cluster.nodes``: :class:`NodeInfo`.
NODE = RecordCodec("NodeInfo", NodeInfo, "node", _write_node,
                   {1: _read_node_v1, 2: _read_node_v2}, version=NODE_VERSION)

#: ``tbmq.events``: raw bytes.
BYTES = BytesCodec()
