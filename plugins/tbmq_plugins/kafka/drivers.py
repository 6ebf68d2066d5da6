"""The small interface between the Kafka bus and a Kafka client library.

A *driver* (``kafka.driver``) wraps one client library behind three
objects; the bus and the consumer loop only ever talk to these:

* :class:`Admin` creates topics (blocking; the bus's worker thread);
* :class:`Producer` sends records: :meth:`Producer.send` (one record) and
  :meth:`Producer.send_many` (several, one outcome) are called in the
  reactor thread and never block, their outcomes are reported (from the
  client's own thread) to an :class:`~.bridge.AckBatcher`;
* :class:`SharedClient` is one consumer client of one group over several
  topics, owned by one consumer thread (:class:`~.loop.SharedLoop`): it
  either has partitions assigned directly (the exclusive subscriptions of
  one group) or joins its group over all its topics (the joining
  subscriptions of one bundle); one fetch covers all of them.  Every method
  is called from that thread only, between polls, and may block.

A driver module whose producer tells where an acknowledged record landed
(sets ``done.where = (partition, offset)`` on a ``done`` whose ``located``
is True) says so with ``LOCATES = True`` (:mod:`.own`).

Two drivers implement it: :mod:`.confluent` (``confluent``: confluent-kafka
on librdkafka, the default) and :mod:`.kafka_python` (``kafka-python``).  :func:`load_driver` imports one lazily, so that a node that
uses neither needs neither installed.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from tbmq.errors import ConfigError

__all__ = ["Admin", "Producer", "RawRecord", "Reports", "SharedClient", "TopicSpec", "TopicView",
           "load_driver"]

#: driver name → (module of this package, what to install)
DRIVERS = {
    "confluent": (".confluent", "pip install 'tbmq[kafka]' (confluent-kafka)"),
    "kafka-python": (".kafka_python",
                     "pip install 'tbmq[kafka-python]' (kafka-python and crc32c)"),
}


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create.

    :ivar name: the topic name.
    :ivar partitions: its partition count, >= 1.
    :ivar replication_factor: its replica count, >= 1.
    :ivar config: its topic configs (``cleanup.policy``, ``retention.ms``),
        ``dict[str, str]``.
    """

    name: str
    partitions: int
    replication_factor: int
    config: dict = field(default_factory=dict)


class RawRecord(NamedTuple):
    """One record as a consumer client read it (not decoded).

    :ivar partition: ``int``.
    :ivar offset: ``int``.
    :ivar key: ``bytes`` or None.
    :ivar value: ``bytes`` or None (a tombstone).
    :ivar headers: ``tuple[tuple[str, bytes], ...]``.
    :ivar timestamp: the record's timestamp (``int`` milliseconds since the
        epoch: the producer's CreateTime, or the broker's LogAppendTime), or
        None when the broker gave none; :class:`~.order.Gaps` reads it on
        compacted topics.
    """

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple
    timestamp: int | None = None


class Admin:
    """Creates and deletes topics.  Every method blocks."""

    def create_topics(self, specs: list[TopicSpec]) -> None:
        """Create ``specs``; a topic that already exists is fine.

        :raises Exception: the client's error when a topic cannot be
            created (or no broker answered within the request timeout).
        """
        raise NotImplementedError

    def delete_topics(self, names: list[str]) -> None:
        """Delete the topics ``names`` (DeleteTopics); one that does not
        exist is fine.

        :raises Exception: the client's error when a topic cannot be
            deleted (or no broker answered within the request timeout).
        """
        raise NotImplementedError

    def committed(self, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
        """The offsets Kafka group ``group`` committed on ``topic``.

        :returns: partition → offset, None where the group has none.
        :raises Exception: the client's error (no answer, a partition's error).
        """
        raise NotImplementedError

    def describe(self, topic_prefix: str, known_groups: list[str]) -> dict:
        """The topics whose names start with ``topic_prefix``, their latest
        offsets, and the consumer groups with their committed offsets on
        them (:func:`.describe.assemble` says which and gives the shape).
        A part Kafka does not answer (a request the broker does not support,
        as Tansu's DescribeGroups) is left out and named in ``errors``.

        :param known_groups: group ids the node uses (described even when
            Kafka does not list them).
        :raises Exception: the client's error when not even the topics
            can be listed.
        """
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Producer:
    """Sends records; see the module doc."""

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: tuple,
             done: Any, partition: int | None = None) -> None:
        """Queue one record; its outcome goes to the ack batcher as
        ``(done, None)`` or ``(done, error)`` once the brokers
        acknowledged it or gave up (``kafka.request_timeout_ms``).  Called in
        the reactor thread; never blocks.

        :param done: what the outcome is for (a publish's ``done`` callable,
            or a :class:`~.packing.Fanout`: the bus's business).
        :param partition: the partition to write to; None: the client's
            partitioner places it by its key (murmur2, Java's).
        :raises Exception: when the record cannot even be queued.
        """
        raise NotImplementedError

    def send_many(self, topic: str, keys: list, values: list, done: Any) -> None:
        """Queue several records (no headers), each placed by the client's
        partitioner, with **one** outcome: ``(done, None)`` to the ack
        batcher once every one was acknowledged, else ``(done, error)``
        with the first error a record got, once all of them were reported
        (:class:`Reports`).  A record the client refuses (its queue full)
        counts as one that failed with that error.  Called in the reactor
        thread; never blocks, never raises.

        :param keys: ``bytes | None`` each (at least one).
        :param values: ``bytes | None`` each, as many.
        """
        raise NotImplementedError

    def prepare(self, topic: str) -> int:
        """Block until :meth:`send` to ``topic`` no longer blocks (topic
        metadata cached).

        :returns: the topic's partition count.
        """
        raise NotImplementedError

    def close(self, timeout: float) -> None:
        """Send what is queued (``timeout`` seconds at most), then close."""
        raise NotImplementedError


class Reports:
    """The reports of the records of one :meth:`Producer.send_many`, from
    the client's own thread (its delivery callbacks) and from the reactor
    thread (a record refused while queued): counted, and the last one puts
    ``(done, error)`` to the ack batcher, ``error`` the first a record
    reported (None when every one was acknowledged).  One report per record,
    not one put, one closure and one call in the reactor each.

    Thread-safe: a report stores its error before it counts itself, and the
    count is one step of an :func:`itertools.count` (atomic under the GIL),
    so exactly one report is the last, and it sees every error.

    :param put: the ack batcher's ``put``.
    :param done: what the outcome is for (the bus's business).
    :param n: the records (at least one).
    :ivar error: the first error reported, or None.
    """

    __slots__ = ("_put", "_done", "_last", "_count", "error")

    def __init__(self, put: Callable[[Any, Any], None], done: Any, n: int) -> None:
        self._put = put
        self._done = done
        self._last = n - 1
        self._count = itertools.count()
        self.error: Any = None

    def report(self, error: Any = None) -> None:
        """One record's outcome: None (acknowledged) or the client's error."""
        if error is not None and self.error is None:
            self.error = error
        if next(self._count) == self._last:
            self._put(self._done, self.error)

    def delivered(self, error: Any, message: Any) -> None:
        """:meth:`report`, as a delivery callback ``(error, message)``."""
        if error is not None and self.error is None:
            self.error = error
        if next(self._count) == self._last:
            self._put(self._done, self.error)

    def refused(self, n: int, error: Any) -> None:
        """``n`` records the client refused (never queued): each reported
        failed with ``error``."""
        for _ in range(n):
            self.report(error)


#: ``(topic, partition)``: a partition of a :class:`SharedClient`.
TP = tuple


class SharedClient:
    """One consumer client of one group over the partitions of several
    topics.  One thread (:class:`~.loop.SharedLoop`) calls it; every method
    may block.  Partitions are ``(topic, partition)`` tuples; offsets are
    the next offset to read.  A client either has partitions assigned
    directly (:meth:`add`, :meth:`remove`: the caller promises the group has
    no other member) or joins its group (:meth:`subscribe`), never both.

    :cvar resubscribes: a joined client changes its topics in place with
        :meth:`subscribe` (a rebalance); False: the caller closes it and
        joins with a new client instead.
    :cvar fetches_in_background: the client fetches between two
        :meth:`poll` calls (librdkafka prefetches): an idle consumer thread
        (:mod:`.pacing`) pauses its partitions to stop it, and still polls
        to serve the group's callbacks.  False: it fetches only inside
        :meth:`poll` (kafka-python), so an idle thread does not poll.
    """

    resubscribes = True
    fetches_in_background = True

    def partitions(self, topic: str) -> list[int]:
        """:returns: ``topic``'s partitions (metadata).

        :raises Exception: when the metadata cannot be read."""
        raise NotImplementedError

    def add(self, offsets: dict[TP, int]) -> None:
        """Read each partition of ``offsets`` from its offset, beside those
        already assigned."""
        raise NotImplementedError

    def remove(self, tps: list[TP]) -> None:
        """Stop reading ``tps`` (nothing is committed)."""
        raise NotImplementedError

    def subscribe(self, topics: list[str], on_assign: Callable[[list[TP]], None],
                  on_revoke: Callable[[list[TP]], dict[TP, int]]) -> None:
        """Join the group over ``topics`` (again: the subscription is
        replaced, which rebalances the group).

        :param on_assign: called with the partitions the group gave, in the
            consumer thread during :meth:`poll` (it may block; it calls
            :meth:`seek`).  No record of those partitions is returned before.
        :param on_revoke: called with the partitions the group takes away,
            before they go, during :meth:`poll` or :meth:`close` (possibly
            in the client's own thread: it must not call the client); it
            returns offsets that the driver commits before the partitions
            go.  Records of those partitions read before it was called are
            not returned any more.
        """
        raise NotImplementedError

    def seek(self, offsets: dict[TP, int]) -> None:
        """Read each partition of ``offsets`` from its offset, resumed: one
        the group gave (during ``on_assign``), or one assigned or given
        before, read again (a record read before is not returned any
        more)."""
        raise NotImplementedError

    def committed(self, tps: list[TP]) -> dict[TP, int | None]:
        """:returns: the group's committed offset of each (None: none)."""
        raise NotImplementedError

    def first_offsets(self, tps: list[TP]) -> dict[TP, int]:
        """:returns: the first offset each partition holds."""
        raise NotImplementedError

    def end_offsets(self, tps: list[TP]) -> dict[TP, int]:
        """:returns: the end offsets the brokers report (Tansu reports the
        base offset of the last batch + 1: too low; see :mod:`.loop`)."""
        raise NotImplementedError

    def high_watermarks(self, tps: list[TP]) -> dict[TP, int]:
        """:returns: the high watermark the last fetch of each reported (no
        request), for those fetched since they were assigned."""
        raise NotImplementedError

    def latest_offsets(self, tps: list[TP]) -> dict[TP, int]:
        """:returns: the latest offsets the brokers report (ListOffsets,
        one request per broker; Tansu reports the base offset of the last
        batch + 1: too low, yet above the next offset to read once a record
        came after it).  An idle client (:mod:`.pacing`) asks it instead of
        fetching."""
        raise NotImplementedError

    def rest(self, tps: list[TP]) -> None:
        """Stop fetching ``tps`` (the idle mode); the default pauses them."""
        self.pause(tps)

    def wake(self, tps: list[TP]) -> None:
        """Fetch ``tps`` again at once (the idle mode ends); the default
        resumes them."""
        self.resume(tps)

    def poll(self, timeout: float, max_records: int,
             want_ends: set[TP]) -> tuple[dict[str, list[RawRecord]], dict[TP, int]]:
        """Read what is there, waiting ``timeout`` seconds at most.

        :param want_ends: partitions whose end the caller does not know yet
            (``in``, iteration and truth only; read it after the client's
            poll, as ``on_assign`` may add partitions to it meanwhile).
        :returns: ``(records, ends)``: topic → its records in partition and
            offset order, and for partitions of ``want_ends`` that a fetch
            answered, the end offset (high watermark) it reported.
        """
        raise NotImplementedError

    def take_error(self) -> str | None:
        """:returns: an error reported without raising since the last call."""
        return None

    def commit(self, offsets: dict[TP, int], wait: bool) -> None:
        """Commit ``offsets`` for the group; with ``wait``, block until done.

        :raises Exception: with ``wait``, when the commit failed."""
        raise NotImplementedError

    def pause(self, tps: list[TP]) -> None:
        raise NotImplementedError

    def resume(self, tps: list[TP]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Close the client (commits nothing)."""
        raise NotImplementedError


def load_driver(name: str) -> Any:
    """Import the driver ``name`` (a value of ``kafka.driver``).

    :returns: its module, whose classes ``Admin(config)``,
        ``Producer(config, acks)`` and ``SharedClient(config, group)``
        implement :class:`Admin`, :class:`Producer` and :class:`SharedClient`
        (building one may block: do it in a thread).
    :raises ConfigError: for an unknown driver, or when its client library
        is not installed (the message says what to install).
    """
    if name not in DRIVERS:
        raise ConfigError(f"kafka.driver: {name!r} is not one of {', '.join(DRIVERS)}",
                          "kafka.driver")
    module, install = DRIVERS[name]
    try:
        return importlib.import_module(module, __package__)
    except ImportError as e:
        raise ConfigError(f"kafka.driver: {name} needs a library that is not installed "
                          f"({e}): {install}", "kafka.driver") from None


class TopicView:
    """One topic of a :class:`~.drivers.SharedClient`, seen by a
    :class:`ConsumerLoop` with ``int`` partitions.  Its :meth:`poll` returns
    what the shared thread's last poll read for the topic (:attr:`records`,
    :attr:`ends`).

    :param client: the shared :class:`~.drivers.SharedClient`.
    :param topic: the topic name.
    """

    def __init__(self, client: SharedClient, topic: str) -> None:
        self._client = client
        self.topic = topic
        self.records: list[RawRecord] = []
        self.ends: dict[int, int] = {}
        self._mine: set[int] = set()  # assigned directly

    def _tps(self, partitions: Any) -> list[tuple]:
        topic = self.topic
        return [(topic, p) for p in partitions]

    @staticmethod
    def _by_partition(found: dict) -> dict:
        return {tp[1]: value for tp, value in found.items()}

    def partitions(self) -> list[int]:
        """:returns: the topic's partitions (metadata; blocks)."""
        return self._client.partitions(self.topic)

    def start_at(self, offsets: dict[int, int], assign: bool) -> None:
        """Read each partition of ``offsets`` from its offset; with
        ``assign``, take those partitions without the group (exclusive)."""
        tps = {(self.topic, p): o for p, o in offsets.items()}
        if assign:
            self._client.add(tps)
            self._mine.update(offsets)
        else:
            self._client.seek(tps)

    def seek(self, offsets: dict[int, int]) -> None:
        self._client.seek({(self.topic, p): o for p, o in offsets.items()})

    def committed(self, partitions: list[int]) -> dict[int, int | None]:
        return self._by_partition(self._client.committed(self._tps(partitions)))

    def first_offsets(self, partitions: list[int]) -> dict[int, int]:
        return self._by_partition(self._client.first_offsets(self._tps(partitions)))

    def end_offsets(self, partitions: list[int]) -> dict[int, int]:
        return self._by_partition(self._client.end_offsets(self._tps(partitions)))

    def high_watermarks(self, partitions: list[int]) -> dict[int, int]:
        return self._by_partition(self._client.high_watermarks(self._tps(partitions)))

    def poll(self) -> tuple[list[RawRecord], dict[int, int]]:
        """:returns: ``(records, ends)`` of the last shared poll, once."""
        records, self.records = self.records, []
        ends, self.ends = self.ends, {}
        return records, ends

    def commit(self, offsets: dict[int, int], wait: bool) -> None:
        self._client.commit({(self.topic, p): o for p, o in offsets.items()}, wait)

    def pause(self, partitions: list[int]) -> None:
        self._client.pause(self._tps(partitions))

    def resume(self, partitions: list[int]) -> None:
        self._client.resume(self._tps(partitions))

    def close(self) -> None:
        """Stop reading the partitions assigned directly; the client stays
        open (a joining client drops the topic from its subscription)."""
        mine, self._mine = sorted(self._mine), set()
        if mine:
            self._client.remove(self._tps(mine))
