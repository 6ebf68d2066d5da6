"""Several records to one topic of the in-process bus with one outcome
(:class:`ManyPublishes`, a part of
:class:`tbmq.backends.inprocess_bus.InProcessBus`): the router's deliveries
of a batch of ``tbmq.msg.all`` to one sink
(:meth:`tbmq.cluster.sinks.BusSink.send_many`) take one waiter and one
``done``, not one each (ARCHITECTURE §4, group commit of the embedded node).
"""

from __future__ import annotations

from typing import Callable

from twisted.python.failure import Failure

from tbmq.backends.inprocess_log import RangeWaiter
from tbmq.cluster.completion import Completion

__all__ = ["ManyPublishes"]


class ManyPublishes:
    """``publish_many`` of :class:`~tbmq.backends.inprocess_bus.InProcessBus`
    (which has the ``_topics``, ``running``, ``publish``, ``_pump``,
    ``_schedule`` and ``_retain`` used here)."""

    def publish_many(self, topic: str, keys: list, values: list,
                     done: Callable[[Failure | None], None]) -> None:
        """Append several records to ``topic``, in order, with **one**
        ``done`` for all of them (the router's deliveries of a batch to one
        sink: :meth:`tbmq.cluster.sinks.BusSink.send_many`).  On a
        non-durable topic of one partition held as objects (the device
        store's ``tbmq.msg.persisted`` in the embedded node) they take one
        :class:`~.inprocess_log.RangeWaiter`, and a batch handler gets them
        together; elsewhere each is published as by :meth:`publish`, under
        one :class:`~tbmq.cluster.completion.Completion`.

        :param keys: ``str | None`` each.
        :param values: the topic's record type each.
        :param done: ``done(None | Failure)``, called exactly once, maybe
            during the call: None once every record is durable (as
            :meth:`publish` says for each), else the first failure
            (:class:`~tbmq.errors.ConsumerFailedError`,
            :class:`~tbmq.errors.BusClosedError`, ...).
        """
        state = self._topics.get(topic)
        if (state is None or not self.running or state.durable or state.codec is not None
                or len(state.parts) != 1 or not values):
            sent = Completion()
            publish = self.publish
            for key, value in zip(keys, values):
                publish(topic, key, value, (), sent.part())
            sent.then(done)
            return
        part = state.parts[0]
        first = part.next
        append = part.append
        for key, value in zip(keys, values):
            append(key, value, ())
        groups = [g for g in state.groups.values() if g.members]
        if groups:
            waiter = RangeWaiter(topic, [g.name for g in groups], first, len(values))
            waiters = part.waiters
            for o in range(first, part.next):
                waiters[o] = waiter
            waiter.settle(done)
        for g in groups:  # a batch handler gets what the turn publishes together
            member = g.owners[0]
            if member.batch_handler is None:
                self._pump(member)
            else:
                self._schedule(member)
        self._retain(state, part)
        if not groups:
            done(None)
