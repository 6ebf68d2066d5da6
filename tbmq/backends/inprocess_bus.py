"""The in-process message bus of the embedded default.

It carries the same topics as the Kafka bus (``tbmq.msg.all``,
``tbmq.msg.retained``, ...) so the code above it is the same in a cluster of
one and of many (ARCHITECTURE §4).  Values are Python objects, handed to the
consumers synchronously: a consumer group of one node has one member, and
every group subscribed to a topic gets every record, as in Kafka.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from tbmq.cluster.records import Record
from tbmq.interfaces import IMessageBus
from tbmq.log import OBSERVER as LOG_OBSERVER

Handler = Callable[[Record], "defer.Deferred | None"]


class _Consumer:
    """The one member of a group on this bus; records wait while paused."""

    def __init__(self, bus, topic: str, group: str, handler: Handler) -> None:
        self.bus = bus
        self.topic = topic
        self.group = group
        self.handler = handler
        self.paused = False
        self.waiting: deque = deque()
        self.caught_up = defer.succeed(None)

    def offer(self, record: Record):
        if self.paused or self.waiting:
            d = defer.Deferred()
            self.waiting.append((record, d))
            return d
        return self.handler(record)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        if not self.paused:
            return
        self.paused = False
        while self.waiting and not self.paused:
            record, d = self.waiting.popleft()
            try:
                result = self.handler(record)
            except Exception as e:
                d.errback(e)
                continue
            if result is None:
                d.callback(None)
            else:
                result.chainDeferred(d)

    def stop(self) -> defer.Deferred:
        self.bus._remove(self)
        return defer.succeed(None)


@implementer(IMessageBus)
class InProcessBus:
    """Topics → consumer groups → one member each.

    ``publish`` calls each group's handler at once, in subscription order,
    unless the member is paused (the record then waits).  Its result is None
    when no handler returned a Deferred, so the QoS 0 path allocates no
    Deferred; otherwise a Deferred that fires (with None) when all of them
    have fired.  A handler that raises is logged and does not stop the
    other groups.
    """

    encodes = False
    log = Logger(observer=LOG_OBSERVER)

    def __init__(self) -> None:
        self._topics: dict[str, list[_Consumer]] = {}

    def start(self) -> defer.Deferred:
        return defer.succeed(None)

    def stop(self) -> defer.Deferred:
        return defer.succeed(None)

    def subscribe(self, topic: str, group: str, handler: Handler,
                  from_beginning: bool = False) -> _Consumer:
        """Consume ``topic`` as consumer group ``group``; a second handler for
        the same group replaces the first (one member per group here)."""
        consumers = self._topics.setdefault(topic, [])
        consumer = _Consumer(self, topic, group, handler)
        for i, other in enumerate(consumers):
            if other.group == group:
                consumers[i] = consumer
                return consumer
        consumers.append(consumer)
        return consumer

    def _remove(self, consumer) -> None:
        consumers = self._topics.get(consumer.topic, [])
        if consumer in consumers:
            consumers.remove(consumer)

    def publish(self, topic: str, key, value, headers=()) -> defer.Deferred | None:
        """Hand ``value`` to every group of ``topic``; see the class doc."""
        consumers = self._topics.get(topic)
        if not consumers:
            return None
        record = Record(topic, key, value, headers)
        if len(consumers) == 1:  # one consumer group: no bookkeeping
            try:
                return consumers[0].offer(record)
            except Exception:
                self.log.failure("consumer of {topic} failed", topic=topic)
                return None
        pending = None
        for consumer in consumers:
            try:
                result = consumer.offer(record)
            except Exception:
                self.log.failure("consumer of {topic} failed", topic=topic)
                continue
            if result is not None:
                if pending is None:
                    pending = [result]
                else:
                    pending.append(result)
        if pending is None:
            return None
        if len(pending) == 1:
            return pending[0]
        return defer.gatherResults(pending, consumeErrors=True).addCallback(lambda _: None)
