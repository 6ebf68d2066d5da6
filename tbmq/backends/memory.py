"""In-memory stores: every record lives in a dict of this process.

They implement the storage interfaces of :mod:`tbmq.interfaces` with
already-fired Deferreds, so they never block and never reorder calls.  Records
are copied on the way in and on the way out: mutating a record passed to, or
returned by, a store never changes what the store holds.  Nothing survives a
restart (``storage.backend: memory``).  :class:`MemoryTopicLog` is the
in-process bus's topic log when nothing is to outlive the process.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Iterable

from twisted.internet import defer
from zope.interface import implementer

from tbmq.backends.deliveries import RunsAsAdds, check_limit, check_page
from tbmq.backends.topic_records import check_records, expand
from tbmq.interfaces import IDeviceMessageStore, IRetainedStore, ITopicLog
from tbmq.model import (
    DeliveryState,
    Message,
    StoredDelivery,
)

__all__ = [
    "MemoryRetainedStore",
    "MemoryDeviceMessageStore",
    "MemoryTopicLog",
    "copy_properties",
    "copy_message",
    "copy_delivery",
]


def copy_properties(properties: dict) -> dict:
    """Copy a v5 properties dict deep enough that no list is shared.

    :param properties: ``Property`` → value, with ``USER_PROPERTY`` and
        ``SUBSCRIPTION_IDENTIFIER`` lists.
    :returns: a new dict whose list values are new lists (their items --
        str, int, bytes, tuples of str -- are immutable).
    """
    return {
        key: list(value) if isinstance(value, list) else value
        for key, value in properties.items()
    }


def copy_message(message: Message) -> Message:
    """:param message: a :class:`~tbmq.model.Message`.
    :returns: an independent copy of it."""
    return dataclasses.replace(
        message, properties=copy_properties(message.properties)
    )


def copy_delivery(delivery: StoredDelivery) -> StoredDelivery:
    """:param delivery: a :class:`~tbmq.model.StoredDelivery`.
    :returns: an independent copy of it."""
    return dataclasses.replace(
        delivery,
        message=copy_message(delivery.message),
        subscription_ids=tuple(delivery.subscription_ids),
    )


class _MemoryBackend:
    """The life cycle shared by the memory stores: nothing to open or close."""

    def start(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.start`.

        :returns: an already-fired Deferred (None).
        """
        return defer.succeed(None)

    def stop(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.stop`; the content is
        kept, so a stopped store may be started again.

        :returns: an already-fired Deferred (None).
        """
        return defer.succeed(None)


@implementer(IRetainedStore)
class MemoryRetainedStore(_MemoryBackend):
    """Retained messages, one per topic name, in a dict keyed by topic
    (:class:`~tbmq.interfaces.IRetainedStore`)."""

    def __init__(self) -> None:
        self._messages: dict[str, Message] = {}

    def load_all(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IRetainedStore.load_all`.

        :returns: a fired Deferred with a ``list[Message]`` of copies.
        """
        return defer.succeed([copy_message(m) for m in self._messages.values()])

    def put(self, message: Message) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IRetainedStore.put`
        [MQTT-3.3.1-5]: replace the retained message of ``message.topic``.

        :param message: the :class:`~tbmq.model.Message` to keep (copied).
        :returns: a fired Deferred (None).
        """
        self._messages[message.topic] = copy_message(message)
        return defer.succeed(None)

    def remove(self, topic: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IRetainedStore.remove`
        [MQTT-3.3.1-6].

        :param topic: the topic name; a topic without a retained message is
            ignored.
        :returns: a fired Deferred (None).
        """
        self._messages.pop(topic, None)
        return defer.succeed(None)


@implementer(IDeviceMessageStore)
class MemoryDeviceMessageStore(RunsAsAdds, _MemoryBackend):
    """Deliveries queued for persistent sessions: client id → seq →
    :class:`~tbmq.model.StoredDelivery`
    (:class:`~tbmq.interfaces.IDeviceMessageStore`).

    :param max_messages_per_client: the most deliveries kept per client
        (the oldest are removed beyond it); None for no limit.
    :raises ValueError: for a limit below 1.
    """

    def __init__(self, max_messages_per_client: int | None = None) -> None:
        self.max_messages_per_client = check_limit(max_messages_per_client)
        self._queues: dict[str, dict[int, StoredDelivery]] = {}

    def add(
        self, client_id: str, deliveries: Iterable[StoredDelivery]
    ) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.add`.  A
        delivery whose ``seq`` is already queued replaces it.

        :param client_id: the persistent session's client id.
        :param deliveries: the deliveries to append (copied).
        :returns: a fired Deferred with the number of the client's oldest
            deliveries removed to stay within ``max_messages_per_client``.
        """
        queue = self._queues.setdefault(client_id, {})
        for delivery in deliveries:
            queue[delivery.seq] = copy_delivery(delivery)
        removed = 0
        limit = self.max_messages_per_client
        if limit is not None and len(queue) > limit:
            removed = len(queue) - limit
            for seq in heapq.nsmallest(removed, queue):
                del queue[seq]
        return defer.succeed(removed)

    def update(
        self, client_id: str, seq: int, packet_id: int | None, state: int
    ) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.update`.

        :param client_id: the persistent session's client id.
        :param seq: the delivery's order key; an unknown one is ignored.
        :param packet_id: the packet identifier it was sent with.
        :param state: its new :class:`~tbmq.model.DeliveryState`.
        :returns: a fired Deferred (None).
        """
        queue = self._queues.get(client_id)
        if queue is not None and seq in queue:
            queue[seq] = dataclasses.replace(
                queue[seq], packet_id=packet_id, state=DeliveryState(state)
            )
        return defer.succeed(None)

    def remove(self, client_id: str, seqs: Iterable[int]) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.remove`.

        :param client_id: the persistent session's client id.
        :param seqs: the order keys to drop; unknown ones are ignored.
        :returns: a fired Deferred (None).
        """
        queue = self._queues.get(client_id)
        if queue is not None:
            for seq in seqs:
                queue.pop(seq, None)
            if not queue:
                del self._queues[client_id]
        return defer.succeed(None)

    def load(
        self, client_id: str, after_seq: int | None = None, limit: int | None = None
    ) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.load`.

        :param client_id: the persistent session's client id.
        :param after_seq: only deliveries with a greater ``seq``; all when
            None.
        :param limit: at most this many (>= 0); all when None.
        :returns: a fired Deferred with the ``list[StoredDelivery]`` (copies)
            in ``seq`` order, or failed with :class:`ValueError` (a
            negative ``limit``) or :class:`TypeError` (not an int).
        """
        try:
            check_page(after_seq, limit)
        except (TypeError, ValueError):
            return defer.fail()
        queue = self._queues.get(client_id, {})
        seqs = sorted(queue if after_seq is None else (s for s in queue if s > after_seq))
        if limit is not None:
            seqs = seqs[:limit]
        return defer.succeed([copy_delivery(queue[s]) for s in seqs])

    def count(self, client_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.count`.

        :param client_id: the persistent session's client id.
        :returns: a fired Deferred with the number of its deliveries.
        """
        return defer.succeed(len(self._queues.get(client_id, ())))

    def clear(self, client_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.clear`.

        :param client_id: the persistent session's client id.
        :returns: a fired Deferred (None).
        """
        self._queues.pop(client_id, None)
        return defer.succeed(None)


@implementer(ITopicLog)
class MemoryTopicLog(_MemoryBackend):
    """The records of the in-process bus's durable topics and the groups'
    committed offsets, in dicts of this process
    (:class:`~tbmq.interfaces.ITopicLog`); nothing survives a restart.

    Records are checked and copied on the way in (values and headers are
    bytes, so the tuples handed out share nothing mutable).
    """

    def __init__(self) -> None:
        #: (topic, partition) → offset → (key, value, headers, compacted)
        self._partitions: dict[tuple[str, int], dict[int, tuple]] = {}
        #: (topic, key) → (partition, offset) of a compacted key's record
        self._keys: dict[tuple[str, str], tuple[int, int]] = {}
        self._offsets: dict[tuple[str, str, int], int] = {}

    def _drop(self, topic: str, partition: int, offset: int) -> None:
        """Forget one stored record, and its key if it is compacted."""
        stored = self._partitions.get((topic, partition), {}).pop(offset, None)
        if stored is not None and stored[3] and stored[0] is not None:
            if self._keys.get((topic, stored[0])) == (partition, offset):
                del self._keys[(topic, stored[0])]

    def append(self, records: Iterable[tuple]) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ITopicLog.append`: a record at
        the position of a stored one replaces it; in a compacted topic a
        record replaces the one of its key, a tombstone removes it (a
        record without a key is kept like any other).

        :param records: ``(topic, partition, offset, key, value, headers,
            compacted)`` tuples and
            :class:`~tbmq.backends.topic_records.RecordRun`.
        :returns: a fired Deferred (None), or a failed one with
            :class:`TypeError`/:class:`ValueError` (nothing stored) for a
            malformed record.
        """
        try:
            checked = check_records(records)
        except (TypeError, ValueError):
            return defer.fail()
        for topic, partition, offset, key, value, headers, compacted in expand(checked):
            self._drop(topic, partition, offset)
            if compacted and key is not None:
                earlier = self._keys.pop((topic, key), None)
                if earlier is not None:
                    self._drop(topic, *earlier)
                if value is None:
                    continue
                self._keys[(topic, key)] = (partition, offset)
            self._partitions.setdefault((topic, partition), {})[offset] = (
                key, value, headers, compacted)
        return defer.succeed(None)

    def commit(self, group: str, topic: str, partition: int, offset: int) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ITopicLog.commit` (the last
        commit wins).

        :returns: a fired Deferred (None).
        """
        self._offsets[(group, topic, int(partition))] = int(offset)
        return defer.succeed(None)

    def truncate(self, topic: str, partition: int, before: int) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ITopicLog.truncate`.

        :returns: a fired Deferred (None).
        """
        stored = self._partitions.get((topic, int(partition)), {})
        for offset in [o for o in stored if o < before]:
            self._drop(topic, int(partition), offset)
        return defer.succeed(None)

    def write(self, records: list, commits: dict, truncates: dict) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ITopicLog.write`: :meth:`append`,
        then :meth:`commit` and :meth:`truncate` each, in order.

        :returns: a fired Deferred (None), or a failed one with
            :class:`TypeError`/:class:`ValueError` (nothing written) for a
            malformed record.
        """
        try:
            check_records(records)
        except (TypeError, ValueError):
            return defer.fail()
        if records:
            self.append(records)
        for (group, topic, partition), offset in commits.items():
            self.commit(group, topic, partition, offset)
        for (topic, partition), before in truncates.items():
            self.truncate(topic, partition, before)
        return defer.succeed(None)

    def delete_topic(self, topic: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ITopicLog.delete_topic`.

        :returns: a fired Deferred (None).
        """
        for key in [k for k in self._partitions if k[0] == topic]:
            del self._partitions[key]
        for key in [k for k in self._keys if k[0] == topic]:
            del self._keys[key]
        for key in [k for k in self._offsets if k[1] == topic]:
            del self._offsets[key]
        return defer.succeed(None)

    def load(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ITopicLog.load`.

        :returns: a fired Deferred with ``(records, offsets)`` as
            :meth:`tbmq.interfaces.ITopicLog.load` describes.
        """
        records = [
            (topic, partition, offset) + self._partitions[(topic, partition)][offset][:3]
            for topic, partition in sorted(self._partitions)
            for offset in sorted(self._partitions[(topic, partition)])
        ]
        return defer.succeed((records, dict(self._offsets)))
