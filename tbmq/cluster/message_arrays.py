"""The hot reader of the ``msg`` arrays (:mod:`tbmq.cluster.records`): a
packed record's messages, a run's, each one made field by field.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from operator import attrgetter
from typing import Any

from msgpack import packb

from tbmq.errors import RecordEncodingError
from tbmq.model import Message
from tbmq.mqtt.properties import unpack_properties

__all__ = ["message_from_array", "messages_from_arrays", "messages_packed", "props_in",
           "published_messages", "templated", "templated_stream"]


def props_in(v: Any, name: str) -> dict:
    """The properties of a ``msg`` or ``will`` array's bin field (nil: none).

    :raises RecordEncodingError: naming ``name``, for anything else."""
    if v is None:
        return {}
    if type(v) is not bytes:
        raise RecordEncodingError(f"{name}: expected bin or nil, got {type(v).__name__}")
    try:
        return unpack_properties(v)
    except Exception as e:
        raise RecordEncodingError(f"{name}: {e}") from None


def message_from_array(obj: Any) -> Message | None:
    """The message of one ``msg`` array as msgpack read it, made field by
    field (``object.__new__``: the dataclass ``__init__`` costs as much as
    the checks), its array kept as :attr:`~tbmq.model.Message.wire`.

    :returns: the message, or None when ``obj`` is not a version 1 tuple of
        plain fields: the field by field reader then reads or refuses it.
    """
    if type(obj) is not tuple or len(obj) != 10:
        return None
    tag, version, topic, payload, qos, retain, props, publisher, received_at, expires_at = obj
    if not (tag == "msg" and version == 1 and type(version) is int and type(topic) is str
            and type(payload) is bytes and type(qos) is int and 0 <= qos <= 2
            and type(retain) is bool and type(publisher) is str
            and type(received_at) is float
            and (expires_at is None or type(expires_at) is float)):
        return None
    if props is None:
        props = {}
    elif type(props) is bytes:
        props = props_in(props, "properties")
    else:
        return None
    m = _new(Message)  # every field of Message set below (tests/unit/test_records_fast.py)
    m.topic = topic
    m.payload = payload
    m.qos = qos
    m.retain = retain
    m.properties = props
    m.publisher = publisher
    m.received_at = received_at
    m.expires_at = expires_at
    m.wire = obj  # as msgpack read it: kept, to be written again
    m.template = None
    return m


def messages_from_arrays(objs: Any) -> list | None:
    """The messages of several ``msg`` arrays as msgpack read them (a packed
    record's values, a run's), each as :func:`message_from_array` makes it.

    :returns: the messages, or None when one is not read so.
    """
    out = []
    append = out.append
    read = message_from_array
    for obj in objs:
        m = read(obj)
        if m is None:
            return None
        append(m)
    return out


_new = object.__new__


#: a message's fields in the order of its ``msg`` array
_FIELDS = attrgetter("topic", "payload", "qos", "retain", "properties", "publisher",
                     "received_at", "expires_at")
_WIRE = attrgetter("wire")
_TEMPLATE = attrgetter("template")
_PAYLOAD = attrgetter("payload")
_QOS = frozenset((0, 1, 2))
_NO_EXPIRY = (type(None), float)


def messages_packed(messages: list, pack) -> list | None:
    """The hot path of :meth:`~tbmq.cluster.record_codec.RecordCodec.encode_many`
    for messages (``write_many`` of ``tbmq.msg.all``'s codec): messages that
    each carry their array (``wire``: read, written before, or made with
    them by :func:`published_messages`) packed as they are; messages never
    written before (no ``wire``) and without properties, their fields
    checked column by column and their ``["msg", 1, ...]`` arrays made and
    packed by map, with no bytecode per message; each encoding is byte for
    byte what the codec's ``encode`` gives the message alone.  The
    ``wire`` of the latter is left unset.

    :param messages: :class:`~tbmq.model.Message` objects, at least one.
    :param pack: this thread's ``msgpack.Packer(use_bin_type=True).pack``.
    :returns: their encodings, in order (a published run's from its
        template, :func:`templated`); or None for fewer than three
        messages, or when some but not all of them carry their array, or
        one has properties or a field of another type (each is then
        written alone).
    :raises Exception: what ``pack`` raises (each is then written alone).
    """
    if len(messages) < 3:  # (the checks would cost more than they save)
        return None
    packed = templated(messages)
    if packed is not None:  # a published run's: its template around each payload
        return packed
    wires = list(map(_WIRE, messages))
    if None not in wires:  # each one's array made before (checked then): packed as it is
        return list(map(pack, wires))
    if wires.count(None) != len(wires):
        return None
    topics, payloads, qoss, retains, props, publishers, at, expiry = zip(*map(_FIELDS, messages))
    if not (set(map(type, topics)) == {str} and set(map(type, payloads)) == {bytes}
            and set(map(type, qoss)) == {int} and set(qoss) <= _QOS
            and set(map(type, retains)) == {bool} and set(map(type, props)) == {dict}
            and not any(props) and set(map(type, publishers)) == {str}
            and set(map(type, at)) == {float} and set(map(type, expiry)).issubset(_NO_EXPIRY)):
        return None
    return list(map(pack, zip(repeat("msg"), repeat(1), topics, payloads, qoss, retains,
                              repeat(None), publishers, at, expiry)))


#: sets a message's ``wire`` (the slot's setter: called by map, in C)
_SET_WIRE = Message.wire.__set__
#: a new empty dict from ``_new_dict(_EMPTY)``, called by map (each message its own)
_EMPTY: dict = {}
_new_dict = dict.copy


def published_messages(topics: list, payloads: list, qoss: list, retains: list,
                       publisher: str, received_at: float) -> list:
    """The :class:`~tbmq.model.Message` s of a run of one client's PUBLISHes
    without properties (:meth:`tbmq.broker.session.Session.on_publishes`),
    made by map from the run's columns, each with its ``["msg", 1, ...]``
    array as its ``wire`` when every field has its record type (as a
    decoded PUBLISH's have): a store or a bus then packs that array as it
    is (:func:`messages_packed`), without a check per field; otherwise
    without one (written as any message).

    :param topics: topic names (``str``), in order.
    :param payloads: payloads (``bytes``).
    :param qoss: QoS (``int`` 0-2).
    :param retains: RETAIN flags (``bool``).
    :param publisher: the client id of the publisher.
    :param received_at: the time of receipt, seconds since the epoch.
    :returns: the messages, in order (no properties, no expiry)."""
    n = len(topics)
    messages = list(map(Message, topics, payloads, qoss, retains, map(_new_dict, repeat(_EMPTY, n)),
                        repeat(publisher, n), repeat(received_at, n), repeat(None, n)))
    if (type(publisher) is str and type(received_at) is float and set(map(type, topics)) == {str}
            and set(map(type, payloads)) == {bytes} and set(map(type, qoss)) == {int}
            and set(qoss) <= _QOS and set(map(type, retains)) == {bool}):
        deque(map(_SET_WIRE, messages, zip(
            repeat("msg", n), repeat(1, n), topics, payloads, qoss, retains, repeat(None, n),
            repeat(publisher, n), repeat(received_at, n), repeat(None, n))), 0)
        if n > _FEWEST_TEMPLATED and len(set(topics)) == len(set(qoss)) == len(set(retains)) == 1 \
                and len(set(map(len, payloads))) == 1:
            template = _template(messages[0].wire)
            if template is not None:
                deque(map(_SET_TEMPLATE, messages, repeat(template, n)), 0)
    return messages


#: the shortest run whose messages :func:`published_messages` gives a
#: template (as :func:`messages_packed` packs three or more together)
_FEWEST_TEMPLATED = 2
#: sets a message's ``template`` (called by map)
_SET_TEMPLATE = Message.template.__set__
_join = b"".join


def _template(wire: tuple) -> tuple | None:
    """``(before, after)``: the msgpack bytes of ``wire`` (a ``msg`` array)
    before and after its payload.  msgpack writes an array as its length,
    then its values one after another, so an array that differs from
    ``wire`` in its payload alone, of the same size, packs into
    ``before``, that payload and ``after`` (a test compares them).

    :returns: the tuple, or None if the bytes do not come apart so (then
        each array is packed as it is)."""
    whole = packb(wire, use_bin_type=True)
    after = _join([packb(v, use_bin_type=True) for v in wire[4:]])
    payload = wire[3]
    before = whole[:len(whole) - len(after) - len(payload)]
    if before + payload + after != whole:
        return None
    return before, after


def _one_template(messages: list) -> tuple | None:
    """:returns: the template all of ``messages`` have, or None when one
        has none or another one."""
    templates = list(map(_TEMPLATE, messages))
    first = templates[0]
    if first is None or templates.count(first) != len(templates):
        return None
    return first


def templated_stream(messages: list) -> bytes | None:
    """The bytes of :func:`templated`, one after another (a run's
    ``msg`` arrays as the items of an array): the template's ``after``
    and ``before`` joined between the payloads in one call.

    :returns: the bytes, or None as :func:`templated`."""
    template = _one_template(messages)
    if template is None:
        return None
    before, after = template
    return before + (after + before).join(map(_PAYLOAD, messages)) + after


def templated(messages: list) -> list | None:
    """The msgpack bytes of the ``msg`` array of each of ``messages``, when
    they all have one :attr:`~tbmq.model.Message.template` (a published
    run's): its ``before``, the message's payload and its ``after``, joined
    by map (no array packed, no bytecode per message).

    :param messages: :class:`~tbmq.model.Message` objects, at least one.
    :returns: the bytes, in order, or None when one has no template or
        another one."""
    template = _one_template(messages)
    if template is None:
        return None
    before, after = template
    n = len(messages)
    return list(map(_join, zip(repeat(before, n), map(_PAYLOAD, messages), repeat(after, n))))
