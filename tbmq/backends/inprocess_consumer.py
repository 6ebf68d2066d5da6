"""A member of a consumer group of the in-process bus
(:class:`tbmq.backends.inprocess_bus.InProcessBus`): its state, and the
calls it passes to the bus (which hands it its records)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from twisted.internet import defer
from zope.interface import implementer

from tbmq.backends.inprocess_log import Group, TopicState, partition_of
from tbmq.cluster.completion import Completion
from tbmq.cluster.records import Record
from tbmq.cluster.redelivery import Redelivery
from tbmq.interfaces import IConsumer

if TYPE_CHECKING:
    from tbmq.backends.inprocess_bus import InProcessBus

__all__ = ["Consumer", "Handler"]

Handler = Callable[[Record], "defer.Deferred | Completion | None"]


@implementer(IConsumer)
class Consumer:
    """One member of a consumer group of an :class:`InProcessBus` (made by
    :meth:`InProcessBus.subscribe`).

    :ivar topic: the topic name.
    :ivar group: the group name.
    :ivar caught_up: see :class:`tbmq.interfaces.IConsumer`.
    :ivar partitions: the partitions it owns now.
    """

    __slots__ = ("bus", "topic", "group", "handler", "batch_handler", "state", "group_state",
                 "partitions", "paused", "busy", "wanted", "stopped", "inflight", "cursor",
                 "scheduled", "caught_up", "targets", "redelivery")

    def __init__(self, bus: "InProcessBus", state: TopicState, group: Group,
                 handler: Handler, batch_handler: Handler | None = None) -> None:
        self.bus = bus
        self.topic = state.name
        self.group = group.name
        self.handler = handler
        self.batch_handler = batch_handler
        self.state = state
        self.group_state = group
        self.partitions: list[int] = []
        self.paused = False
        self.busy = False  # in its handler: never re-entered
        self.wanted = False  # records arrived while busy
        self.stopped = False
        self.inflight = 0  # handler results not fired
        self.cursor = 0  # round robin over its partitions
        self.scheduled = None  # the DelayedCall of the next slice
        self.caught_up: defer.Deferred = defer.Deferred()
        self.targets: list[int] | None = None
        self.redelivery = Redelivery(bus.clock,
                                     f"consumer group {group.name} of {state.name}")

    def pause(self) -> None:
        """Stop handing records; they wait in the bus.  Idempotent."""
        if not self.paused:
            self.paused = True
            self.bus._refresh_fast(self.state)

    def resume(self) -> None:
        """Hand records again, those that waited first (in slices of
        :data:`SLICE` per reactor turn).  Idempotent."""
        if self.paused:
            self.paused = False
            self.bus._refresh_fast(self.state)
            self.bus._schedule(self)

    def hand_own(self) -> bool:
        """:returns: False: a record published here is handed in process as
        soon as it is appended (see :meth:`tbmq.interfaces.IConsumer.hand_own`)."""
        return False

    def decides(self, key: str) -> bool:
        """See :meth:`tbmq.interfaces.IConsumer.decides`: the partition of
        ``key`` is this member's, and every record of it was handed and
        its result fired (the group's committed offset is the partition's
        end: a record published now would be handed next, after all of
        them), while the member is neither paused, stopped nor in its
        handler, and the bus takes records (:meth:`InProcessBus.acknowledging`).

        :returns: ``bool``."""
        if self.paused or self.busy or self.stopped or not self.bus.acknowledging():
            return False
        parts = self.state.parts
        n = len(parts)
        p = 0 if n <= 1 else partition_of(key, n)
        if p >= n or p not in self.partitions:
            return False
        return self.group_state.cursors[p].committed == parts[p].next

    def lag(self) -> int:
        """:returns: records of this member's partitions that its group has
        not committed yet (handed and pending, or waiting)."""
        parts = self.state.parts
        cursors = self.group_state.cursors
        return sum(max(0, parts[p].next - cursors[p].committed) for p in self.partitions
                   if p < len(parts) and p < len(cursors))

    def stop(self) -> defer.Deferred:
        """Leave the group; its partitions go to the other members from the
        committed offsets (records whose results have not fired are handed
        again).

        :returns: a Deferred that has fired with None.
        """
        if not self.stopped:
            self.bus._leave(self)
        return defer.succeed(None)
