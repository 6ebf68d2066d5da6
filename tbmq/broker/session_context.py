"""What a session uses of its node (:class:`SessionContext`), the node's
cache of valid topic names, and the order key of persistent deliveries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from tbmq.broker.store_reads import PageReads
from tbmq.broker.traffic import Traffic
from tbmq.mqtt.topics import validate_topic_name

__all__ = ["SessionContext", "TopicNameCache", "next_seq", "valid_utf8"]

_SEQ = [0]


def next_seq(now_ns: int, count: int = 1) -> int:
    """A process-wide increasing order key for persistent deliveries.

    :param now_ns: the wall clock in nanoseconds, so keys also increase across
        restarts.
    :param count: how many consecutive keys to take (>= 1): the keys of a
        run of messages are the one returned and the ``count - 1`` after it.
    """
    seq = _SEQ[0] + 1
    if now_ns > seq:
        seq = now_ns
    _SEQ[0] = seq + count - 1
    return seq


def valid_utf8(data: bytes) -> bool:
    """True when ``data`` is well-formed UTF-8 [MQTT-1.5.4-1]."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class TopicNameCache(set):
    """Topic names already found valid: a bounded cache of
    :func:`tbmq.mqtt.topics.validate_topic_name` (``name in cache`` is the
    fast check, :meth:`check` the full one).

    :param size: names kept at most; the cache is emptied when full.
    """

    def __init__(self, size: int = 10000) -> None:
        super().__init__()
        self.size = size

    def check(self, topic: str, max_levels: int | None = None) -> None:
        """Validate ``topic`` and remember it.

        :param max_levels: the most levels accepted (``mqtt.max_topic_levels``).
        :raises tbmq.mqtt.topics.TopicError: for an invalid topic name.
        :raises tbmq.mqtt.topics.TooManyLevels: for a deeper one.
        """
        validate_topic_name(topic, max_levels)
        if len(self) >= self.size:
            self.clear()
        self.add(topic)


@dataclass(frozen=True, slots=True)
class SessionContext:
    """What a session uses of its node.

    :ivar clock: ``IReactorTime``; ``seconds()`` is the wall clock.
    :ivar mqtt: the :class:`tbmq.config.MqttConfig`.
    :ivar hooks: the :class:`tbmq.broker.hooks.Hooks`.
    :ivar drops: the node's :class:`tbmq.broker.hooks.DropCounter`.
    :ivar flusher: the :class:`tbmq.broker.outbound.TurnFlusher`.
    :ivar holds: the :class:`tbmq.broker.outbound.Holds`.
    :ivar device_store: the :class:`tbmq.interfaces.IDeviceMessageStore`.
    :ivar publish: ``publish(message, done)``: the pipeline
        (:meth:`tbmq.broker.router.Router.publish`); ``done(None |
        Failure)`` is called once, maybe during the call.
    :ivar retained_for: ``retained_for(topic_filter) -> list[Message]``.
    :ivar subscriptions: ``subscribe(session, filter, options) -> bool`` and
        ``unsubscribe(session, filter) -> bool`` and ``save(session) ->
        Deferred`` (the :class:`tbmq.broker.sessions.SessionManager`).
    :ivar topics: the node's :class:`TopicNameCache`.
    :ivar auth: the :class:`tbmq.config.AuthConfig` (``cache_size``,
        ``cache_ttl`` of the publish authorization cache).
    :ivar applications: the :class:`tbmq.cluster.sinks.ApplicationReader`
        (``attach(session)``/``detach(session)``) of persistent APPLICATION
        sessions.
    :ivar mark: ``mark(client_id, session_id, attached)``: write the
        :class:`~tbmq.cluster.records.SessionMarker` of a persistent DEVICE
        session's connection (:func:`tbmq.cluster.sinks.write_marker` on
        the node's ``persisted`` sink, with this node's service id);
        returns None or a Deferred.  None: no markers (the session's first read of the store is its only one).
    :ivar limits_in: the node's :class:`tbmq.broker.limits.NodeLimits` when
        a limit applies to PUBLISH packets from clients, else None.
    :ivar limits_out: the same when a limit applies to deliveries to live
        sessions, else None.
    :ivar page_reads: the node's :class:`tbmq.broker.store_reads.PageReads`
        (its reads of the device store in flight, bounded).
    :ivar publish_many: ``publish_many(messages, done)``: several messages
        of one publisher, in order, with one ``done``
        (:meth:`tbmq.broker.router.Router.publish_many`); None: the
        PUBLISHes of a read are handed on one by one.
    """

    clock: Any
    mqtt: Any
    hooks: Any
    drops: Any
    flusher: Any
    holds: Any
    device_store: Any
    publish: Callable
    retained_for: Callable
    subscriptions: Any
    topics: TopicNameCache
    auth: Any = None
    applications: Any = None
    traffic: Traffic = field(default_factory=Traffic)
    mark: Callable | None = None
    limits_in: Any = None
    limits_out: Any = None
    page_reads: PageReads = field(default_factory=PageReads)
    publish_many: Callable | None = None

