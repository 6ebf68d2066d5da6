"""The hot reader of the ``msg`` arrays (:mod:`tbmq.cluster.records`): a
packed record's messages, a run's, each one made field by field.
"""

from __future__ import annotations

from typing import Any

from tbmq.errors import RecordEncodingError
from tbmq.model import Message
from tbmq.mqtt.properties import unpack_properties

__all__ = ["message_from_array", "messages_from_arrays", "props_in"]


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
