"""What every topic log shares (:class:`~tbmq.interfaces.ITopicLog`): the
check of the records given to ``append``, and :class:`RecordRun`, the
records of one partition at consecutive offsets given as one item (what a
reactor turn routed to one APPLICATION client: one object for the run, not
a tuple per record)."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

__all__ = ["RecordRun", "check_record", "check_records", "expand"]

_PLAIN_KEYS = frozenset((str, type(None)))
_PLAIN_VALUES = frozenset((bytes, type(None)))


class RecordRun:
    """Records of one partition of a topic that is not compacted, at
    consecutive offsets from ``first``, without headers: one item of
    :meth:`~tbmq.interfaces.ITopicLog.append` (Kafka's record batch), the
    same records as ``(topic, partition, first + i, keys[i], values[i], (),
    False)`` each.

    :ivar topic: the topic, str.
    :ivar partition: int.
    :ivar first: the offset of the first record, int.
    :ivar keys: ``str | None`` each.
    :ivar values: ``bytes | None`` each (None: a tombstone), as many as
        ``keys``.
    """

    __slots__ = ("topic", "partition", "first", "keys", "values")

    def __init__(self, topic: str, partition: int, first: int, keys: list, values: list) -> None:
        self.topic = topic
        self.partition = partition
        self.first = first
        self.keys = keys
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    @property
    def last(self) -> int:
        """The offset of the last record."""
        return self.first + len(self.values) - 1

    def records(self) -> list[tuple]:
        """:returns: the run as ``(topic, partition, offset, key, value,
            headers, compacted)`` tuples, in order."""
        topic, partition, first = self.topic, self.partition, self.first
        return [(topic, partition, first + i, key, value, (), False)
                for i, (key, value) in enumerate(zip(self.keys, self.values))]

    def since(self, offset: int) -> "RecordRun":
        """:returns: the records from ``offset`` on (``first <= offset <=
            last + 1``), as a run."""
        skip = offset - self.first
        return RecordRun(self.topic, self.partition, offset, self.keys[skip:], self.values[skip:])

    def __repr__(self) -> str:
        return f"RecordRun({self.topic!r}, {self.partition}, {self.first}..{self.last})"


def check_run(run: RecordRun) -> RecordRun:
    """Check a :class:`RecordRun` given to
    :meth:`~tbmq.interfaces.ITopicLog.append`.

    :returns: ``run``, or a new one with its values made ``bytes`` (a
        ``bytearray`` or ``memoryview`` given).
    :raises TypeError: when a field is not of its type (as
        :func:`check_record` says).
    :raises ValueError: when it has not as many keys as values.
    """
    topic, partition, first, keys, values = (run.topic, run.partition, run.first, run.keys,
                                             run.values)
    if len(keys) != len(values):
        raise ValueError(f"a run of {len(keys)} keys and {len(values)} values")
    if (type(topic) is str and type(partition) is int and type(first) is int
            and set(map(type, keys)) <= _PLAIN_KEYS and set(map(type, values)) <= _PLAIN_VALUES):
        return run  # what a bus appends: every type exact, checked in C
    checked = [check_record((topic, partition, first + i, key, value, (), False))
               for i, (key, value) in enumerate(zip(keys, values))]
    if not checked:
        check_record((topic, partition, first, None, None, (), False))
    return RecordRun(topic, partition, first, [r[3] for r in checked], [r[4] for r in checked])


def check_records(records: Iterable) -> list:
    """Check what is given to :meth:`~tbmq.interfaces.ITopicLog.append`:
    :func:`check_record` each, :func:`check_run` each :class:`RecordRun`.

    :returns: the checked items, in order.
    :raises TypeError, ValueError: as those say, for the first that fails.
    """
    return [check_run(r) if type(r) is RecordRun else check_record(r) for r in records]


def expand(records: Iterable) -> Iterator[tuple]:
    """:returns: the records of ``records`` one tuple each (a
        :class:`RecordRun` expanded), in order: for a log that keeps a row
        per record."""
    for r in records:
        if type(r) is RecordRun:
            yield from r.records()
        else:
            yield r


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
