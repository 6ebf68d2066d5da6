"""The in-process message bus of the embedded default.

It carries the same topics as the Kafka bus (``tbmq.msg.all``,
``tbmq.msg.retained``, ...) so the code above it is the same in a cluster of
one and of many (ARCHITECTURE §4).  Values are Python objects, handed to the
consumers synchronously: a consumer group of one node has one member, and
every group subscribed to a topic gets every record, as in Kafka.
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from tbmq.interfaces import IMessageBus
from tbmq.log import OBSERVER as LOG_OBSERVER

Handler = Callable[[str, Any], "defer.Deferred | None"]


@implementer(IMessageBus)
class InProcessBus:
    """Topics → consumer groups → one handler each.

    ``publish`` calls each group's handler at once, in subscription order.
    Its result is None when no handler returned a Deferred, so the QoS 0 path
    allocates no Deferred; otherwise a Deferred that fires (with None) when
    all of them have fired.  A handler that raises is logged and does not stop
    the other groups.
    """

    durable = False
    log = Logger(observer=LOG_OBSERVER)

    def __init__(self) -> None:
        self._topics: dict[str, list[tuple[str, Handler]]] = {}

    def start(self) -> defer.Deferred:
        return defer.succeed(None)

    def stop(self) -> defer.Deferred:
        return defer.succeed(None)

    def subscribe(self, topic: str, group: str, handler: Handler) -> None:
        """Consume ``topic`` as consumer group ``group``; a second handler for
        the same group replaces the first (one member per group here)."""
        groups = self._topics.setdefault(topic, [])
        for i, (name, _) in enumerate(groups):
            if name == group:
                groups[i] = (group, handler)
                return
        groups.append((group, handler))

    def publish(self, topic: str, key: str, value: Any) -> defer.Deferred | None:
        """Hand ``value`` to every group of ``topic``; see the class doc."""
        groups = self._topics.get(topic)
        if not groups:
            return None
        if len(groups) == 1:  # one consumer group: no bookkeeping
            try:
                return groups[0][1](key, value)
            except Exception:
                self.log.failure("consumer of {topic} failed", topic=topic)
                return None
        pending = None
        for _, handler in groups:
            try:
                result = handler(key, value)
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
