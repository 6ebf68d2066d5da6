"""Several records to one topic of the in-process bus with one outcome
(:class:`ManyPublishes`, a part of
:class:`tbmq.backends.inprocess_bus.InProcessBus`), and a record queued
for a member that takes batches (``_queued``): the router's deliveries
of a batch of ``tbmq.msg.all`` to one sink
(:meth:`tbmq.cluster.sinks.BusSink.send_many`) take one waiter and one
``done``, not one each (ARCHITECTURE §4, group commit of the embedded node).
"""

from __future__ import annotations

from typing import Callable

from twisted.python.failure import Failure

from tbmq.backends.inprocess_log import QueuedRun, RangeWaiter
from tbmq.backends.topic_records import RecordRun
from tbmq.cluster.completion import publish_each
from tbmq.errors import RecordEncodingError

__all__ = ["ManyPublishes"]


class ManyPublishes:
    """``publish_many`` of :class:`~tbmq.backends.inprocess_bus.InProcessBus`
    (which has the ``_topics``, ``_writes``, ``encodes``, ``running``,
    ``publish``, ``_pump``, ``_schedule`` and ``_retain`` used here)."""

    def publish_many(self, topic: str, keys: list, values: list,
                     done: Callable[[Failure | None], None]) -> None:
        """Append several records to ``topic``, in order, with **one**
        ``done`` for all of them (the router's deliveries of a batch to one
        sink: :meth:`tbmq.cluster.sinks.BusSink.send_many`).  On a
        non-durable topic of one partition held as objects (the device
        store's ``tbmq.msg.persisted`` in the embedded node) they take one
        :class:`~.inprocess_log.RangeWaiter`, and a batch handler gets them
        together; on a durable topic of one partition (an APPLICATION
        client's ``tbmq.msg.app.<clientId>``) they go to the topic log's
        next append with one ``done``; elsewhere each is published as by
        :meth:`publish`, under one
        :class:`~tbmq.cluster.completion.Completion`.

        :param keys: ``str | None`` each.
        :param values: the topic's record type each.
        :param done: ``done(None | Failure)``, called exactly once, maybe
            during the call: None once every record is durable (as
            :meth:`publish` says for each), else the first failure
            (:class:`~tbmq.errors.ConsumerFailedError`,
            :class:`~tbmq.errors.BusClosedError`, ...).
        """
        state = self._topics.get(topic)
        if state is None or not self.running or len(state.parts) != 1 or not values:
            self._each(topic, keys, values, done)
            return
        if state.durable:
            self._logged_many(state, keys, values, done)
            return
        if state.codec is not None:
            self._each(topic, keys, values, done)
            return
        part = state.parts[0]
        if part.keys is None:  # not compacted: held in one pass
            first = part.extend(keys, values)
        else:
            first = part.next
            append = part.append
            for key, value in zip(keys, values):
                append(key, value, ())
        groups = state.live
        if groups:
            waiter = RangeWaiter(topic, [g.name for g in groups], first, len(values))
            part.waiters.update(dict.fromkeys(range(first, part.next), waiter))
            waiter.settle(done)
        self._hand_on(state, part, groups)
        if not groups:
            done(None)

    def _queued(self, member, part, topic: str, key, value, headers: tuple,
                done: Callable) -> None:
        """``publish`` with ``done`` to a topic of the hot path (one
        partition, one group, held as objects) whose member takes batches
        (the router of ``tbmq.msg.all``) while records wait for its
        results: what the general path does there, in one step: the record
        is held, its ``done`` joins the partition's
        :class:`~.inprocess_log.QueuedRun` (one object for a run of such
        records, not a waiter each), and it is handed with the others from
        the next turn (``done`` once the group's result for it fired)."""
        o = part.append(key, value, headers)
        run = part.queued
        if member.scheduled is None:  # (once per turn: the checks of _schedule)
            self._schedule(member)
            run = None  # a run per turn at most: its list goes once all are done
        if run is None or run.end != o:
            run = part.queued = QueuedRun(topic, member.group, o)
        run.dones.append(done)  # it joins the run
        run.end = o + 1
        part.waiters[o] = run
        if len(part.entries) > self.retention_records:  # (the check of _retain)
            self._retain(member.state, part)

    def _each(self, topic: str, keys: list, values: list, done: Callable) -> None:
        """One :meth:`publish` each, under one
        :class:`~tbmq.cluster.completion.Completion`."""
        publish_each(self.publish, topic, keys, values, done)

    def _logged_many(self, state, keys: list, values: list, done: Callable) -> None:
        """``publish_many`` to a durable topic of one partition: the values
        encoded together (:meth:`~tbmq.cluster.record_codec.RecordCodec.encode_many`;
        one that does not fit: :meth:`_each`, which fails it alone), then
        appended and given to the topic log's next flush as one
        :class:`~tbmq.backends.topic_records.RecordRun` with one ``done``
        (:meth:`~tbmq.backends.inprocess_writes.LogWrites.append_run`):
        no tuple per record.  The flush writes them in one ``append``
        (where the SQLite topic log keeps the run as one packed row), so
        they are stored, or fail, together."""
        writes = self._writes
        if writes is None or state.compacted:  # in memory only: durable at once
            self._each(state.name, keys, values, done)
            return
        try:  # one packer and one pass for the batch
            stored = state.codec.encode_many(values)
        except RecordEncodingError:
            self._each(state.name, keys, values, done)
            return
        part = state.parts[0]
        groups = state.live
        # a live group gets the object itself (encoded once, for the log)
        first = part.extend(keys, stored, values if groups and not self.encodes else None)
        writes.append_run(RecordRun(state.name, 0, first, keys, stored), done)
        part.logged_next = part.next
        self._hand_on(state, part, groups)

    def _hand_on(self, state, part, groups: list) -> None:
        """The records just appended to ``part`` go to each live group's
        owner of it (a batch handler gets what the turn publishes together,
        from the next turn), then retention."""
        for g in groups:
            member = g.owners[0]
            if member.batch_handler is None:
                self._pump(member)
            else:
                self._schedule(member)
        self._retain(state, part)
