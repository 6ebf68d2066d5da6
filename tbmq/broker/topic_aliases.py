"""The topic aliases the broker gives on one connection (MQTT 5.0
§3.3.2.3.4), used by :class:`tbmq.broker.outbox.Outbox`."""

from __future__ import annotations

from collections import OrderedDict


class TopicAliases:
    """The topic aliases the broker gave on one connection (outbound, MQTT
    5.0 §3.3.2.3.4): topic → alias, least recently used first.  Aliases
    1..``maximum`` go to new topics in turn [MQTT-3.3.2-8, MQTT-3.3.2-11];
    once all are taken, the least recently used one is given to the next new
    topic (its PUBLISH carries the topic name and the alias, which changes
    the client's mapping).  Mappings last as long as the connection
    [MQTT-3.3.2-7].

    :param maximum: aliases to give at most, >= 1.
    """

    __slots__ = ("maximum", "_by_topic")

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self._by_topic: OrderedDict[str, int] = OrderedDict()

    def choose(self, topic: str) -> tuple[int, bool]:
        """:returns: ``(alias, known)``: the alias to send ``topic`` with, and
        whether the client already maps it (then the topic name is left out).
        Nothing changes until :meth:`sent`."""
        by_topic = self._by_topic
        alias = by_topic.get(topic)
        if alias is not None:
            return alias, True
        if len(by_topic) < self.maximum:
            return len(by_topic) + 1, False
        return next(iter(by_topic.values())), False

    def sent(self, topic: str, alias: int, known: bool) -> None:
        """A PUBLISH chosen by :meth:`choose` was written to the client."""
        by_topic = self._by_topic
        if known:
            by_topic.move_to_end(topic)
            return
        if len(by_topic) >= self.maximum:
            by_topic.popitem(last=False)  # its alias now names ``topic``
        by_topic[topic] = alias
