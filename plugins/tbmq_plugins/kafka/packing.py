"""Packed records: the records a node publishes to one partition of a
traffic topic in one reactor turn travel as **one** Kafka record
(``docs/bus.md``, "Packed records").

A cross-node message costs per Kafka record, not per byte: a produce call
and its delivery report, a consumer's fetch entry, the bookkeeping of its
offset.  So :class:`Packer` gathers, per ``(topic, partition)``, what
:meth:`~.bus.KafkaBus.publish` is asked during one reactor turn, and sends
it at the end of the turn: one record alone as it is, two or more as one
packed record.  The consumer (:mod:`.consumer`) expands a packed record back
into its records, which share its partition and offset; its offset is
committed once every one of them was handled.

**The format** (version 2, written; version 1 is still read).  A packed
record has the header ``tbmq.pack`` = ``b"2"``, no key, and a msgpack
value ``["pack", 2, [key, ...], [value, ...]]``: the records' keys
(``bin``, or nil for a keyless record) and values, in publish order, each
value **inline**: the msgpack object the record would be alone (its topic's
encoding is one msgpack array; nil for a tombstone), so that one unpacking
reads every record's fields, and the writer joins the records' bytes
without copying them into ``bin`` fields.  Version 1 (header ``b"1"``) had
each value as a ``bin`` of those bytes.  A consumer outside tbmq reads a
record with that header as the records it lists, in order.

**Placement.**  The producer places the records of these topics itself:
partition ``crc32(key) % partitions`` (as the in-process bus does), a
keyless record round robin, so that a key's records, packed or alone, are
in one partition, in publish order.

Only the traffic topics are packed
(:meth:`~tbmq.cluster.topics.TopicCatalogue.packable`): never a compacted
topic (each key's last value must be a record of its own), nor an
APPLICATION client's topic (its offsets are committed as the client
acknowledges, one message at a time), nor ``tbmq.events`` (read by tools
outside tbmq).
"""

from __future__ import annotations

from typing import Any, Callable

import msgpack
from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq.cluster.completion import Completion
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq_plugins.kafka.drivers import RawRecord
from tbmq_plugins.kafka.own import Own, hand_packed, handed, offer

__all__ = ["HEADER", "HEADER_V1", "MAX_BYTES", "MAX_RECORDS", "Packer", "expand",
           "pack", "unpacked"]

#: The header that marks a packed record, and its value (the format's
#: version): what :func:`pack` writes.
HEADER = ("tbmq.pack", b"2")
#: The header of a packed record of version 1 (each value a ``bin``), still read.
HEADER_V1 = ("tbmq.pack", b"1")
#: Most records in one packed record.
MAX_RECORDS = 1000
#: Most bytes of values in one packed record (Kafka's default
#: ``message.max.bytes`` is about 1 MB); a record larger than this alone is
#: sent alone.
MAX_BYTES = 256 * 1024

log = Logger(observer=LOG_OBSERVER)

_TAG = "pack"
_HEADERS = (HEADER,)
#: ``["pack", 2, `` of a version 2 value: a 4-item array, the tag, the version
_V2_START = b"\x94\xa4pack\x02"
_NIL = b"\xc0"


def _array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:  # array 16
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def pack(keys: list, values: list) -> bytes:
    """:param keys: ``bytes | None`` each, in publish order.
    :param values: ``bytes | None`` each: one msgpack object each (its
        topic's encoding), or None for a tombstone.
    :returns: the value of the packed record (version 2: the values joined
        inline, not copied into ``bin`` fields)."""
    return b"".join((_V2_START, msgpack.packb(keys, use_bin_type=True),
                     _array_header(len(values)),
                     *[_NIL if v is None else v for v in values]))


def unpacked(raw: RawRecord) -> tuple[tuple, tuple, bool] | None:
    """The keys and values of ``raw`` when it is a well-formed packed
    record; None when it is not one (no header, or not well-formed: see
    :func:`expand`).

    :returns: ``(keys, values, inline)``: ``keys`` ``bytes | None`` each
        (not checked: :func:`expand` checks them); ``values`` the decoded
        msgpack objects of version 2 (``inline`` True: each record's array,
        or None for a tombstone) or the ``bytes | None`` of version 1."""
    headers = raw.headers
    if HEADER in headers:
        return _unpacked(raw.value, 2)
    if HEADER_V1 in headers:
        return _unpacked(raw.value, 1)
    return None


def _unpacked(value: Any, version: int) -> tuple[tuple, tuple, bool] | None:
    """The keys and values of a packed record's value of ``version``; None
    when it is not a well-formed one."""
    try:
        data = msgpack.unpackb(value, raw=False, use_list=False, strict_map_key=True)
    except Exception:
        return None
    if (type(data) is not tuple or len(data) != 4 or data[0] != _TAG or data[1] != version
            or type(data[1]) is not int or type(data[2]) is not tuple
            or type(data[3]) is not tuple or len(data[2]) != len(data[3]) or not data[2]):
        return None
    if version == 1:
        for item in data[3]:
            if item is not None and type(item) is not bytes:
                return None
    return data[2], data[3], version != 1


def expand(raw: RawRecord) -> list[RawRecord]:
    """The records of ``raw``: itself when it is not packed; the records it
    lists when it is, each with ``raw``'s partition and offset, no headers
    and its value as bytes (of version 2, packed again alone: the codec
    reads it as it would the original).  A record marked packed that is not
    well-formed is returned as it is: its topic's codec then refuses it, as
    any record it cannot read (logged, left uncommitted).

    :param raw: a :class:`~.drivers.RawRecord` as a consumer client read it.
    """
    found = unpacked(raw)
    if found is None:
        return [raw]
    keys, values, inline = found
    for key in keys:
        if key is not None and type(key) is not bytes:
            return [raw]
    if inline:
        values = [None if v is None else msgpack.packb(v, use_bin_type=True) for v in values]
    p, o = raw.partition, raw.offset
    return [RawRecord(p, o, k, v, ()) for k, v in zip(keys, values)]


class Fanout:
    """The ``done`` of one packed record: calls the ``done`` of each publish
    it carries with the record's outcome (the producer's ack batcher calls
    it as it calls a lone publish's ``done``).  An exception a ``done``
    raises is logged; the others are still called.

    :ivar dones: ``list`` of ``done(None | Failure)`` callables, in publish
        order.
    :ivar located: True when the records are handed to the members that
        take them once acknowledged (:mod:`.own`): it carries their
        :attr:`items`, or one of :attr:`dones` is an :class:`~.own.Own`
        (:func:`~.own.hand_packed`); the driver then sets :attr:`where`.
    :ivar records: the records it carries.
    :ivar takers: None, or the members that take the records.
    :ivar items: None, or ``(key, value, headers)`` of each record it
        carries, in order (every one this node's publish), offered to
        :attr:`takers` as one unit (:func:`~.own.offer`).
    """

    __slots__ = ("dones", "located", "where", "records", "takers", "items")

    def __init__(self, dones: list, located: bool = False, records: int = 0,
                 takers: list | None = None, items: list | None = None) -> None:
        self.dones = dones
        self.located = located
        self.records = records
        self.takers = takers
        self.items = items
        self.where: tuple[int, int] | None = None

    def __call__(self, outcome: Failure | None) -> None:
        """:param outcome: None (acknowledged) or a
        :class:`~twisted.python.failure.Failure`."""
        where = self.where
        if where is not None and outcome is None:
            if self.items is not None:
                offer(self.takers, where, self.items)
            else:
                hand_packed(self.dones, self.records, where)
        for done in self.dones:
            try:
                done(outcome)
            except Exception:
                log.failure("Kafka bus: the outcome of a packed record's publish could not "
                            "be reported")


class _Pending:
    """What waits for one ``(topic, partition)`` in this turn."""

    __slots__ = ("keys", "values", "dones", "size", "located", "takers", "items")

    def __init__(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.dones: list = []
        self.size = 0
        self.located = False  # a done is an Own
        self.takers: list | None = None
        #: the records' ``(key, value, headers)`` while each is one a member
        #: here takes (:mod:`.own`), decided as the unit starts; else None
        self.items: list | None = None


class Packer:
    """Gathers the records of one reactor turn per ``(topic, partition)``
    (reactor thread only).

    :param send: ``send(topic, partition, key, value, headers, done)``:
        hands one Kafka record to the producer; ``done(None | Failure)`` is
        the publish's own ``done``, or a :class:`Fanout` of those of a
        packed record.
    :param later: ``later(fn)``: calls ``fn`` at the end of this reactor
        turn (``reactor.callLater(0, fn)``).
    """

    __slots__ = ("_send", "_later", "_pending", "_scheduled")

    def __init__(self, send, later) -> None:
        self._send = send
        self._later = later
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._scheduled = False

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
            headers: tuple, done: Callable[[Failure | None], None],
            takers: list | None = None, own_key: str | None = None, obj: Any = None) -> None:
        """Queue one record for the end of the turn; a packed record that
        would grow past :data:`MAX_RECORDS` or :data:`MAX_BYTES` is sent
        first.  A record with headers is never packed (a packed record's
        records have none): what waits for its partition is sent, then it.

        :param done: called once with the record's outcome (None, or a
            :class:`~twisted.python.failure.Failure`), as
            :meth:`tbmq.interfaces.IMessageBus.publish` says.
        :param takers: None, or the members that take the topic's records
            when acknowledged (:mod:`.own`); then ``own_key`` and ``obj``
            are the record's key and value as published, kept in its unit
            when a member here hands ``partition`` as the unit starts."""
        slot = (topic, partition)
        if headers:
            waiting = self._pending.pop(slot, None)
            if waiting is not None:
                self._out(topic, partition, waiting)
            if takers is not None:
                done = Own(done, takers, own_key, obj, headers)
            self._send(topic, partition, key, value, headers, done)
            return
        pending = self._pending.get(slot)
        if pending is None:
            pending = self._open(slot)
        size = 0 if value is None else len(value)
        keys = pending.keys
        if keys and (pending.size + size > MAX_BYTES or len(keys) >= MAX_RECORDS):
            self._out(topic, partition, pending)
            pending = self._pending[slot] = _Pending()
            keys = pending.keys
        if takers is not None:
            items = pending.items
            if items is not None:
                items.append((own_key, obj, ()))
            elif not keys and handed(takers, partition):  # the unit starts
                pending.takers, pending.items = takers, [(own_key, obj, ())]
        elif pending.items is not None:
            pending.items = None  # not every record is one a member takes: fetched
        keys.append(key)
        pending.values.append(value)
        pending.dones.append(done)
        pending.size += size
        if type(done) is Own:
            pending.located = True

    def add_many(self, topic: str, partition: int, keys: list, values: list,
                 done: Callable[[Failure | None], None], takers: list | None = None,
                 items: list | None = None) -> None:
        """Queue several records (no headers) for the end of the turn, with
        **one** ``done`` for all of them: called once every Kafka record
        that carries some of them was acknowledged, or with the first
        failure (:class:`~tbmq.cluster.completion.Completion` parts when
        :data:`MAX_RECORDS` or :data:`MAX_BYTES` spread them over several).

        :param keys: ``bytes | None`` each.
        :param values: ``bytes | None`` each, as :meth:`add`'s.
        :param takers: None, or the members that take the topic's records
            when acknowledged (:mod:`.own`); then ``items`` are the
            records' ``(key, value, ())`` as published (``str`` key, the
            value object), kept in their unit as :meth:`add` keeps one
            record's when the records join one unit, so that the unit is
            handed on its acknowledgement rather than fetched back."""
        if not keys:
            done(None)
            return
        slot = (topic, partition)
        pending = self._pending.get(slot)
        if pending is None:
            pending = self._open(slot)
        if len(pending.keys) + len(keys) <= MAX_RECORDS:
            size = pending.size
            if None in values:
                size += sum([0 if v is None else len(v) for v in values])
            else:
                size += sum(map(len, values))
            if size <= MAX_BYTES:  # all of them fit: one extend, not an append each
                if takers is None:
                    pending.items = None  # values not kept: the unit is fetched
                elif pending.items is not None:
                    pending.items.extend(items)
                elif not pending.keys and handed(takers, partition):  # the unit starts
                    pending.takers, pending.items = takers, list(items)
                pending.keys.extend(keys)
                pending.values.extend(values)
                pending.size = size
                pending.dones.append(done)
                return
        pending.items = None  # spread over several units: fetched back
        spread = None
        carries = False  # ``pending`` holds some of these records
        for key, value in zip(keys, values):
            size = 0 if value is None else len(value)
            if pending.keys and (len(pending.keys) >= MAX_RECORDS
                                 or pending.size + size > MAX_BYTES):
                if carries:
                    if spread is None:
                        spread = Completion()
                    pending.dones.append(spread.part())
                self._out(topic, partition, pending)
                pending = self._pending[slot] = _Pending()
            pending.keys.append(key)
            pending.values.append(value)
            pending.size += size
            carries = True
        if spread is None:
            pending.dones.append(done)
        else:
            pending.dones.append(spread.part())
            spread.then(done)

    def _open(self, slot: tuple[str, int]) -> _Pending:
        """A new :class:`_Pending` for ``slot``, the flush scheduled."""
        pending = self._pending[slot] = _Pending()
        if not self._scheduled:
            self._scheduled = True
            self._later(self.flush)
        return pending

    def flush(self) -> None:
        """Send everything queued (at the end of the turn, and before the
        bus stops)."""
        self._scheduled = False
        pending, self._pending = self._pending, {}
        for (topic, partition), p in pending.items():
            self._out(topic, partition, p)

    def _out(self, topic: str, partition: int, p: _Pending) -> None:
        items = p.items
        if len(p.keys) == 1 and len(p.dones) == 1:
            done = p.dones[0]
            if items is not None:  # a lone record a member here takes
                own_key, obj, headers = items[0]
                done = Own(done, p.takers, own_key, obj, headers)
            self._send(topic, partition, p.keys[0], p.values[0], (), done)
        else:
            self._send(topic, partition, None, pack(p.keys, p.values), _HEADERS,
                       Fanout(p.dones, p.located or items is not None, len(p.keys), p.takers,
                              items))
