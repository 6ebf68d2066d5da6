"""The records carried by the bus and their one encoding each (ARCHITECTURE §3,
"the bus carries records, not objects").

Every encoded value is a msgpack array ``[tag, version, field, ...]``
(``msgpack.packb(..., use_bin_type=True)``; read back with
``unpackb(raw=False, strict_map_key=False)``).  The ``tag`` names the record
type and ``version`` its field list; a reader that meets another tag, an
unknown version, a field count or a field type it does not expect raises
:class:`tbmq.errors.RecordEncodingError`, and nothing else, whatever bytes it
is fed.  A writer raises the same error for a value that is not the codec's
type or whose fields do not fit.  ``None`` is a *tombstone* ("this key has
no value any more") on the topics that allow it; it is never encoded (Kafka
carries it as a null value).

All records are version 1, but ``ses``, version 2; its reader reads
version 1 too (a record an older node wrote, kept on
``tbmq.client.session`` or nested in a ``ser``).  A node that knows only
version 1 refuses a version 2 record: run one version on every node of a
cluster.  Times are seconds since the epoch (msgpack float 64); intervals
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
``tbmq.msg.persisted``                         client id   Delivery (``dlv``) or        no
                                                           SessionMarker (``mrk``)
``tbmq.msg.downlink.basic.<serviceId>``        client id   Delivery (``dlv``)           no
``tbmq.msg.downlink.persisted.<serviceId>``    client id   Delivery (``dlv``) or        no
                                                           SessionMarker (``mrk``)
``tbmq.msg.app.<clientId>``                    client id   Delivery (``dlv``)           no
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
``ses`` SessionInfo, version 2
    client_id (str), service_id (str), session_id (str, uuid hex), connected
    (bool), persistent (bool), client_type (str ``DEVICE``/``APPLICATION``),
    session_expiry_interval (int, s), protocol_level (int), connected_at
    (float s|nil), disconnected_at (float s|nil), updated_at (float s), will
    (``will`` array|nil), address (str ``host:port``|nil), username
    (str|nil), credentials_name (str|nil).  Version 1: the first twelve
    fields; read with address, username and credentials_name None.
``subs`` SubscriptionsRecord
    client_id (str), subscriptions (map str → [qos (int 0-2), no_local
    (bool), retain_as_published (bool), retain_handling (int 0-2),
    subscription_id (int|nil)]).
``sev`` SessionEvent
    kind (str, one of :data:`SESSION_EVENT_KINDS`), client_id, service_id,
    session_id, request_id (str), clean_start (bool), persistent (bool),
    client_type (str), session_expiry_interval (int, s), protocol_level
    (int), at (float, s).
``ser`` SessionEventResponse
    client_id (str), request_id (str), success (bool), session_present
    (bool), session (``ses`` array|nil), reason (str).
``dis`` DisconnectCommand
    client_id (str), session_id (str), reason_code (int 0-255, an MQTT 5.0
    reason code).

:class:`Record` is what a consumer's handler receives: the topic, key,
decoded value, headers, partition and offset of one record.
"""

from __future__ import annotations

from typing import Any, Callable

import msgpack

from tbmq.cluster.record_types import (
    CLEAR_SESSION,
    CONNECTION_REQUEST,
    DISCONNECTED,
    NODE_GONE,
    SESSION_EVENT_KINDS,
    UNCLAIMED,
    Delivery,
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
from tbmq.errors import RecordEncodingError
from tbmq.model import ClientType, Message, SubscriptionOptions
from tbmq.mqtt.properties import pack_properties, unpack_properties

__all__ = [
    "BYTES",
    "CLEAR_SESSION",
    "CONNECTION_REQUEST",
    "DELIVERY",
    "DISCONNECT",
    "DISCONNECTED",
    "MARKER",
    "MESSAGE",
    "NODE",
    "NODE_GONE",
    "PERSISTED",
    "RETAINED",
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

#: The version the writers of this module write, but :data:`SESSION`'s
#: (:data:`SESSION_VERSION`).
VERSION = 1
#: The version :data:`SESSION` writes (it reads 1 too).
SESSION_VERSION = 2

# -- field checks ----------------------------------------------------------------


_Bad = RecordEncodingError  # a field check failed


def _str(v: Any, name: str) -> str:
    if type(v) is not str:
        raise _Bad(f"{name}: expected str, got {type(v).__name__}")
    return v


def _bytes(v: Any, name: str) -> bytes:
    if type(v) is bytes:
        return v
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    raise _Bad(f"{name}: expected bytes, got {type(v).__name__}")


def _int(v: Any, name: str, low: int | None = None, high: int | None = None) -> int:
    if type(v) is not int and not (isinstance(v, int) and not isinstance(v, bool)):
        raise _Bad(f"{name}: expected int, got {type(v).__name__}")
    if (low is not None and v < low) or (high is not None and v > high):
        raise _Bad(f"{name}: {v} out of range [{low}, {high}]")
    return int(v)


def _qos(v: Any, name: str) -> int:
    return _int(v, name, 0, 2)


def _bool(v: Any, name: str) -> bool:
    if type(v) is not bool:
        raise _Bad(f"{name}: expected bool, got {type(v).__name__}")
    return v


def _float(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(f"{name}: expected a number, got {type(v).__name__}")
    return float(v)


def _opt_float(v: Any, name: str) -> float | None:
    return None if v is None else _float(v, name)


def _opt_str(v: Any, name: str) -> str | None:
    return None if v is None else _str(v, name)


def _client_type(v: Any, name: str) -> ClientType:
    try:
        return ClientType(v)
    except (ValueError, TypeError):
        raise _Bad(f"{name}: not a client type: {v!r}") from None


def _props_out(props: Any, name: str) -> bytes | None:
    if props is None:
        return None
    if not isinstance(props, dict):
        raise _Bad(f"{name}: expected dict, got {type(props).__name__}")
    if not props:
        return None
    try:
        return pack_properties(props)
    except Exception as e:
        raise _Bad(f"{name}: {e}") from None


def _props_in(v: Any, name: str) -> dict:
    if v is None:
        return {}
    if type(v) is not bytes:
        raise _Bad(f"{name}: expected bin or nil, got {type(v).__name__}")
    try:
        return unpack_properties(v)
    except Exception as e:
        raise _Bad(f"{name}: {e}") from None


def _count(fields: list, n: int, what: str) -> list:
    if len(fields) != n:
        raise _Bad(f"{what}: expected {n} fields, got {len(fields)}")
    return fields


# -- codecs ----------------------------------------------------------------------


class RecordCodec:
    """The encoding of one record type on one kind of topic.

    :param name: the record type's name, for error messages.
    :param cls: the record class.
    :param tag: the type tag written first in the array.
    :param write: ``write(value) -> list`` of the version-:data:`VERSION`
        fields, checking them (raises :class:`RecordEncodingError`).
    :param readers: version → ``read(fields) -> value`` (checks the fields).
    :param tombstone: whether None (a tombstone) is a valid value.
    :param version: the version :meth:`encode` writes (a key of
        ``readers``).
    :ivar version: the version :meth:`encode` writes.
    """

    __slots__ = ("name", "cls", "tag", "version", "tombstone", "_write", "_readers")

    def __init__(self, name: str, cls: type, tag: str, write: Callable[[Any], list],
                 readers: dict[int, Callable[[list], Any]], tombstone: bool = False,
                 version: int = VERSION) -> None:
        self.name = name
        self.cls = cls
        self.tag = tag
        self.version = version
        self.tombstone = tombstone
        self._write = write
        self._readers = readers

    def with_tombstone(self) -> "RecordCodec":
        """:returns: the same encoding, accepting None (a tombstone)."""
        return RecordCodec(self.name, self.cls, self.tag, self._write, self._readers, True,
                           self.version)

    def encode(self, value: Any) -> bytes | None:
        """:param value: an instance of :attr:`cls`, or None where tombstones
            are allowed.
        :returns: the encoded bytes (None for a tombstone).
        :raises RecordEncodingError: when ``value`` does not fit.
        """
        if value is None:
            if self.tombstone:
                return None
            raise RecordEncodingError(f"{self.name}: a tombstone (None) is not allowed here")
        try:
            return msgpack.packb(self.to_list(value), use_bin_type=True)
        except RecordEncodingError:
            raise
        except Exception as e:
            raise RecordEncodingError(f"{self.name}: cannot encode: {e}") from None

    def to_list(self, value: Any) -> list:
        """:returns: the ``[tag, version, fields...]`` array of ``value``
            (used for nested records).
        :raises RecordEncodingError: when ``value`` does not fit."""
        if not isinstance(value, self.cls):
            raise RecordEncodingError(
                f"{self.name}: expected {self.cls.__name__}, got {type(value).__name__}")
        try:
            return [self.tag, self.version, *self._write(value)]
        except RecordEncodingError:
            raise
        except Exception as e:
            raise RecordEncodingError(f"{self.name}: cannot encode: {e}") from None

    def decode(self, data: Any) -> Any:
        """:param data: bytes from :meth:`encode`, or None (a tombstone).
        :returns: the record, or None for a tombstone.
        :raises RecordEncodingError: for anything that is not a record of
            this type and a known version (and for a tombstone where none is
            allowed).
        """
        if data is None:
            if self.tombstone:
                return None
            raise RecordEncodingError(f"{self.name}: a tombstone (None) is not allowed here")
        return self.from_list(_unpack(self.name, data))

    def from_list(self, obj: Any) -> Any:
        """Inverse of :meth:`to_list`.

        :raises RecordEncodingError: as :meth:`decode`."""
        if type(obj) is not list or len(obj) < 2:
            raise RecordEncodingError(f"{self.name}: not a tagged record array")
        tag, version = obj[0], obj[1]
        if type(tag) is not str or tag != self.tag:
            raise RecordEncodingError(f"{self.name}: expected tag {self.tag!r}, got {tag!r}")
        reader = self._readers.get(version) if type(version) is int else None
        if reader is None:
            raise RecordEncodingError(f"{self.name}: unknown version {version!r}")
        try:
            return reader(obj[2:])
        except RecordEncodingError:
            raise
        except Exception as e:  # a check this module forgot: still the one error type
            raise RecordEncodingError(f"{self.name}: cannot decode: {e}") from None


def _unpack(name: str, data: Any) -> Any:
    """The msgpack object in ``data``.

    :raises RecordEncodingError: when ``data`` is not bytes or not msgpack."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RecordEncodingError(f"{name}: expected bytes, got {type(data).__name__}")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:
        raise RecordEncodingError(f"{name}: not msgpack: {e}") from None


class RecordUnion:
    """Several record types on one topic, told apart by their tag (no
    tombstone): each value is written by the codec of its class and read
    by the codec of its tag.

    :param name: the union's name, for error messages.
    :param codecs: the :class:`RecordCodec` of each record type (distinct
        tags and classes).
    """

    __slots__ = ("name", "codecs", "_by_tag")
    tombstone = False

    def __init__(self, name: str, *codecs: RecordCodec) -> None:
        self.name = name
        self.codecs = codecs
        self._by_tag = {codec.tag: codec for codec in codecs}

    def encode(self, value: Any) -> bytes:
        """:returns: ``value`` encoded by the codec of its class.
        :raises RecordEncodingError: for a value of no member's class (None
            included), or one whose fields do not fit."""
        for codec in self.codecs:
            if isinstance(value, codec.cls):
                return codec.encode(value)
        raise RecordEncodingError(f"{self.name}: expected one of "
                                  f"{', '.join(c.cls.__name__ for c in self.codecs)}, "
                                  f"got {type(value).__name__}")

    def decode(self, data: Any) -> Any:
        """:returns: the record ``data`` holds, read by the codec of its tag.
        :raises RecordEncodingError: for anything else (a tombstone, another
            tag, an unknown version, bad fields)."""
        if data is None:
            raise RecordEncodingError(f"{self.name}: a tombstone (None) is not allowed here")
        obj = _unpack(self.name, data)
        tag = obj[0] if type(obj) is list and obj else None
        codec = self._by_tag.get(tag) if type(tag) is str else None
        if codec is None:
            raise RecordEncodingError(f"{self.name}: expected a tag of {sorted(self._by_tag)}, "
                                      f"got {tag!r}")
        return codec.from_list(obj)


class BytesCodec:
    """Raw bytes passed through (``tbmq.events``): no tag, no version.

    :ivar tombstone: False; None is refused.
    """

    __slots__ = ()
    name = "bytes"
    tombstone = False

    def encode(self, value: Any) -> bytes:
        """:raises RecordEncodingError: unless ``value`` is bytes-like."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise RecordEncodingError(f"bytes: expected bytes, got {type(value).__name__}")

    def decode(self, data: Any) -> bytes:
        """:raises RecordEncodingError: unless ``data`` is bytes-like."""
        return self.encode(data)


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


#: ``tbmq.msg.all``: :class:`tbmq.model.Message`, no tombstone.
MESSAGE = RecordCodec("Message", Message, "msg", _write_message, {1: _read_message_v1})
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
    if type(ids) is not list:
        raise _Bad("subscription_ids: expected an array")
    return Delivery(_str(client_id, "client_id"), MESSAGE.from_list(message), _qos(qos, "qos"),
                    _bool(retain, "retain"), tuple(_int(i, "subscription_ids") for i in ids),
                    _int(seq, "seq"))


#: The downlink, persisted and application topics: :class:`Delivery`.
DELIVERY = RecordCodec("Delivery", Delivery, "dlv", _write_delivery, {1: _read_delivery_v1})


def _write_marker(m: SessionMarker) -> list:
    return [_str(m.client_id, "client_id"), _str(m.service_id, "service_id"),
            _str(m.session_id, "session_id"), _bool(m.attached, "attached")]


def _read_marker_v1(f: list) -> SessionMarker:
    client_id, service_id, session_id, attached = _count(f, 4, "marker")
    return SessionMarker(_str(client_id, "client_id"), _str(service_id, "service_id"),
                         _str(session_id, "session_id"), _bool(attached, "attached"))


#: :class:`SessionMarker` alone (nested in :data:`PERSISTED`).
MARKER = RecordCodec("SessionMarker", SessionMarker, "mrk", _write_marker, {1: _read_marker_v1})
#: ``tbmq.msg.persisted`` and ``tbmq.msg.downlink.persisted.<serviceId>``:
#: :class:`Delivery` or :class:`SessionMarker`.
PERSISTED = RecordUnion("Persisted", DELIVERY, MARKER)


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
            _opt_str(s.credentials_name, "credentials_name")]


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


_SESSION = RecordCodec("SessionInfo", SessionInfo, "ses", _write_session,
                       {1: _read_session_v1, 2: _read_session_v2}, version=SESSION_VERSION)
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
        if type(o) is not list:
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


#: ``tbmq.client.session.event.request``: :class:`SessionEvent`.
SESSION_EVENT = RecordCodec("SessionEvent", SessionEvent, "sev", _write_event,
                            {1: _read_event_v1})


def _write_response(r: SessionEventResponse) -> list:
    return [_str(r.client_id, "client_id"), _str(r.request_id, "request_id"),
            _bool(r.success, "success"), _bool(r.session_present, "session_present"),
            None if r.session is None else _SESSION.to_list(r.session), _str(r.reason, "reason")]


def _read_response_v1(f: list) -> SessionEventResponse:
    client_id, request_id, success, present, session, reason = _count(f, 6, "response")
    return SessionEventResponse(
        _str(client_id, "client_id"), _str(request_id, "request_id"), _bool(success, "success"),
        _bool(present, "session_present"),
        None if session is None else _SESSION.from_list(session), _str(reason, "reason"))


#: ``tbmq.client.session.event.response.<serviceId>``: :class:`SessionEventResponse`.
SESSION_EVENT_RESPONSE = RecordCodec("SessionEventResponse", SessionEventResponse, "ser",
                                     _write_response, {1: _read_response_v1})


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
            [_str(x, "listeners") for x in listeners]]


def _read_node_v1(f: list) -> NodeInfo:
    service_id, started_at, sent_at, stopping, listeners = _count(f, 5, "node")
    if type(listeners) is not list:
        raise _Bad("listeners: expected an array")
    return NodeInfo(_str(service_id, "service_id"), _float(started_at, "started_at"),
                    _float(sent_at, "sent_at"), _bool(stopping, "stopping"),
                    tuple(_str(x, "listeners") for x in listeners))


#: ``tbmq.cluster.nodes``: :class:`NodeInfo`.
NODE = RecordCodec("NodeInfo", NodeInfo, "node", _write_node, {1: _read_node_v1})

#: ``tbmq.events``: raw bytes.
BYTES = BytesCodec()
