"""What every topic log shares (:class:`~tbmq.interfaces.ITopicLog`): the
check of the records given to ``append``."""

from __future__ import annotations

from typing import Any

__all__ = ["check_record"]


def check_record(record: Any) -> tuple:
    """Check one record given to :meth:`~tbmq.interfaces.ITopicLog.append`.

    :param record: ``(topic, partition, offset, key, value, headers,
        compacted)``.
    :returns: the same, with ``headers`` a tuple of ``(str, bytes)`` pairs
        and ``compacted`` a bool.
    :raises TypeError: when a field is not of its type (topic str,
        partition and offset int, key str or None, value bytes or None,
        headers pairs of str and bytes).
    :raises ValueError: when the record has not seven fields.
    """
    topic, partition, offset, key, value, headers, compacted = record
    if (not headers and type(topic) is str and type(partition) is int and type(offset) is int
            and (key is None or type(key) is str) and (value is None or type(value) is bytes)):
        # the record a bus appends: exact types and no headers, nothing to convert
        if headers == () and type(compacted) is bool and type(record) is tuple:
            return record
        return (topic, partition, offset, key, value, (), bool(compacted))
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, not {topic!r}")
    for name, number in (("partition", partition), ("offset", offset)):
        if isinstance(number, bool) or not isinstance(number, int):
            raise TypeError(f"{name} must be an int, not {number!r}")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a str or None, not {key!r}")
    if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"value must be bytes or None, not {type(value).__name__}")
    pairs = []
    for pair in headers:
        name, data = pair
        if not isinstance(name, str) or not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"a header must be (str, bytes), not {pair!r}")
        pairs.append((name, bytes(data)))
    return (topic, partition, offset, key, None if value is None else bytes(value),
            tuple(pairs), bool(compacted))
