"""The in-process message bus of the embedded default (ARCHITECTURE §4).

It carries TBMQ's topic catalogue (:mod:`tbmq.cluster.topics`) with the contract of
:class:`tbmq.interfaces.IMessageBus` (``docs/bus.md``), the same as the Kafka bus, so the code
above it is the same in a cluster of one and of many.  Several nodes in one process may share
one bus (that is how two broker nodes are tested in one process).

* **Partitions and offsets.**  Every topic has ``partitions`` partitions;
  a record goes to ``zlib.crc32(key) % partitions`` (keyless records round
  robin) and gets the next offset of that partition.
* **Consumer groups.**  Every group of a topic gets every record; within a
  group the partitions are shared among the live members (partition ``p``
  to member ``p % members``, rebalanced when a member joins or stops).  A
  group starts at the end of the topic, or at its first held record with
  ``from_beginning``.
* **Commit after the handler.**  A group's committed offset on a partition
  moves over the contiguous records whose handler results fired with
  success.  A failed result leaves the record uncommitted and stops the
  member's partition there: after a delay
  (:class:`~tbmq.cluster.redelivery.Redelivery`: 1 s, doubling to 30 s
  while it keeps failing) the member reads the partition again from the
  committed offset (a new cursor: results of the old one do not commit),
  the failed record first, then what follows it (at least once, in order).
  A rebalance or a restart meanwhile hands it to the partition's owner.
* **Handing.**  A member's handler is never re-entered (a record published
  from inside it is handed right after it returns), gets the records of a
  partition in order, has at most ``max_uncommitted`` results pending, and
  nothing while paused; waiting records go :data:`SLICE` per reactor turn.
* **The hot path.**  One group, its member idle and not paused, nothing
  waiting, direct mode, a non-durable topic: ``publish`` calls the handler
  at once and, when it returns None (or a
  :class:`~tbmq.cluster.completion.Completion` that has succeeded), calls
  ``done`` at once or returns None; no Deferred, the record not even
  stored.  A durable topic of one partition and one idle member has its own
  (:mod:`tbmq.backends.inprocess_held`): the record is held (and given to
  the topic log's next flush, unless transient) and handed during the
  publish.
* **Memory.**  A record goes once every group that ever subscribed has
  committed past it.  Records that no group with a live member needs (on a
  durable topic: no known group) are kept at most ``retention_records`` per
  partition, oldest dropped first, counted and logged at most once per
  :data:`DROP_LOG_INTERVAL` seconds.  Compacted topics keep the last record
  per key (a tombstone goes once every group passed it).
* **Encoding mode** (``encode=True``): every value is encoded with its
  topic's codec at publish and decoded for each consumer.  Durable topics
  are always held encoded and written to the topic log
  (:class:`tbmq.interfaces.ITopicLog`; not a record marked
  :func:`~tbmq.cluster.topics.transient`), which ``start`` reads back; in
  direct mode a group live at publish gets the object itself.
* **Group commit.**  What a reactor turn publishes to durable topics goes to the log in one
  append at the start of the next turn, then the turn's commits
  (:mod:`tbmq.backends.inprocess_writes`); a batch's Progress commits once per turn
  (:mod:`tbmq.backends.inprocess_progress`).
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from tbmq.backends.inprocess_consumer import Consumer, Handler
from tbmq.backends.inprocess_describe import Describable
from tbmq.backends.inprocess_held import LOGGING as _LOGGING
from tbmq.backends.inprocess_held import HeldPublishes
from tbmq.backends.inprocess_log import Cursor, Group, Partition, TopicState, Waiter, partition_of
from tbmq.backends.inprocess_many import ManyPublishes
from tbmq.backends.inprocess_progress import ProgressRuns
from tbmq.backends.inprocess_writes import LogWrites
from tbmq.backends.topic_records import check_record
from tbmq.cluster.completion import Completion, Progress, deferred_done
from tbmq.cluster.records import new_record
from tbmq.cluster.topics import TopicCatalogue, transient
from tbmq.errors import BusClosedError, BusPublishError, ConsumerFailedError, RecordEncodingError
from tbmq.interfaces import IDescribableBus, IMessageBus
from tbmq.log import OBSERVER as LOG_OBSERVER

__all__ = ["DROP_LOG_INTERVAL", "SLICE", "Consumer", "InProcessBus"]

#: Most records handed to one member per reactor turn when a backlog drains.
SLICE = 256
#: Seconds between two log lines about records dropped by retention.
DROP_LOG_INTERVAL = 10.0

log = Logger(observer=LOG_OBSERVER)


def _answer(outcome, done):
    """What ``publish`` does with the ``outcome`` of a record: None (it is
    durable now), an exception (the publish failed now), the record's
    :class:`~.inprocess_log.Waiter` (it is not durable yet), or what waits
    for the topic log: :data:`_LOGGING` (it took ``done``) or a Deferred.

    :param done: the publish's ``done``, or None.
    :returns: what ``publish`` returns: None with ``done``; else None, a
        failed Deferred, or a Deferred that fires once the record is durable.
    """
    if outcome is None:
        if done is not None:
            done(None)
        return None
    if type(outcome) is Waiter:
        if done is None:
            return deferred_done(outcome.settle)
        outcome.settle(done)
        return None
    if outcome is _LOGGING:
        return None
    if type(outcome) is defer.Deferred:
        return outcome
    if done is None:
        return defer.fail(outcome)
    done(Failure(outcome))
    return None


@implementer(IMessageBus, IDescribableBus)
class InProcessBus(Describable, ManyPublishes, HeldPublishes):
    """The in-process bus; see the module doc and ``docs/bus.md``.

    :param partitions: partitions per topic (``int`` ≥ 1).
    :param max_uncommitted: most records a member may have whose handler
        results have not fired; beyond that it waits.
    :param retention_records: most records per partition kept for nobody
        (see the module doc).
    :param encode: the encoding mode (:attr:`encodes`).
    :param log: the :class:`tbmq.interfaces.ITopicLog` of the durable topics,
        or None (they are then held in memory only).
    :param catalogue: the :class:`~tbmq.cluster.topics.TopicCatalogue` that
        gives each topic its codec and says which are durable or compacted.
    :param clock: the ``IReactorTime`` used for slices and log flushes (the
        global reactor when None).
    :ivar encodes: True in the encoding mode.
    :ivar packs: False: each record is handed on its own (during the
        publish when nothing waits for the member).
    :ivar dropped: records dropped by retention so far.
    """

    log = log
    packs = False

    def __init__(self, partitions: int = 1, max_uncommitted: int = 10000,
                 retention_records: int = 100000, encode: bool = False, log=None,
                 catalogue: TopicCatalogue | None = None, clock=None) -> None:
        if partitions < 1 or max_uncommitted < 1 or retention_records < 0:
            raise ValueError("partitions and max_uncommitted must be >= 1, "
                             "retention_records >= 0")
        if clock is None:
            from twisted.internet import reactor as clock
        self.partitions = partitions
        self.max_uncommitted = max_uncommitted
        self.retention_records = retention_records
        self.encodes = encode
        self.topic_log = log
        self.catalogue = catalogue if catalogue is not None else TopicCatalogue()
        self.clock = clock
        self.running = False
        self.dropped = 0
        self._dropped_logged = 0
        self._drop_logged_at: float | None = None
        self._topics: dict[str, TopicState] = {}
        #: topic name → ``(member, cursor, partition, held)`` of the topics
        #: whose publish may call the one member's handler at once (the hot
        #: path; ``held``: the TopicState of a durable topic, else None)
        self._fast: dict[str, tuple] = {}
        #: what waits to be written to the topic log (one flush per turn)
        self._writes = LogWrites(log, clock) if log is not None else None
        self._runs = ProgressRuns(clock, self._settled_batch)  # batches with a Progress

    # -- life cycle ---------------------------------------------------------------

    @defer.inlineCallbacks
    def start(self):
        """Read the topic log back (durable topics, their groups' committed
        offsets), then accept publishes.

        :returns: a Deferred firing with None once started.
        """
        if self.running:
            return
        if self.topic_log is not None:
            yield self.topic_log.start()
            records, offsets = yield self.topic_log.load()
            self._restore(records, offsets)
        self.running = True
        if self._writes is not None:
            self._writes.active = True
            self._writes.soon()  # what groups made before the start wrote
        for state in self._topics.values():
            self._refresh_fast(state)
            for group in state.groups.values():
                for member in group.members:
                    self._schedule(member)

    def stop(self) -> defer.Deferred:
        """Refuse publishes, fail the pending ones with
        :class:`~tbmq.errors.BusClosedError`, write the pending commits to
        the topic log and stop it.

        :returns: a Deferred firing with None once done.
        """
        if not self.running:
            return defer.succeed(None)
        self._runs.settle_now()  # what the clients acknowledged is committed
        self.running = False
        self._fast.clear()
        for state in self._topics.values():
            for group in state.groups.values():
                for member in group.members:
                    if member.scheduled is not None and member.scheduled.active():
                        member.scheduled.cancel()
                    member.scheduled = None
            for part in state.parts:
                waiters, part.waiters = part.waiters, {}
                for waiter in waiters.values():
                    waiter.close()
        if self.topic_log is None:
            return defer.succeed(None)
        self._writes.active = False
        flushed = self._writes.flush()
        return flushed.addCallback(lambda _: self.topic_log.stop())

    def _restore(self, records: list, offsets: dict) -> None:
        """Hold what the topic log kept (durable topics of this catalogue
        only; anything else in it is left alone)."""
        catalogue = self.catalogue
        for topic, p, o, key, value, headers in records:
            if not catalogue.durable(topic):
                continue
            state = self._topic(topic)
            part = self._part(state, p)
            part.put(o, key, value, tuple(headers or ()))
            if o >= part.next:
                part.next = part.logged_next = o + 1
        for (group_name, topic, p), offset in offsets.items():
            if not catalogue.durable(topic):
                continue
            state = self._topic(topic)
            part = self._part(state, p)
            part.next = part.logged_next = max(part.next, offset)
            group = self._group(state, group_name, restoring=True)
            cursor = group.cursors[p]
            cursor.committed = cursor.position = cursor.logged = offset
        for state in self._topics.values():
            for group in state.groups.values():
                group.assign(reset=True)

    def _part(self, state: TopicState, p: int) -> Partition:
        while p >= len(state.parts):
            state.parts.append(Partition(len(state.parts), state.compacted))
            for group in state.groups.values():
                group.cursors.append(Cursor(0))
                group.owners.append(None)
        return state.parts[p]

    # -- topics and groups -----------------------------------------------------------

    def _topic(self, topic: str) -> TopicState:
        state = self._topics.get(topic)
        if state is None:
            catalogue = self.catalogue
            durable = catalogue.durable(topic)
            codec = catalogue.codec_for(topic) if (durable or self.encodes) else None
            state = self._topics[topic] = TopicState(
                topic, self.partitions, codec, durable, catalogue.compacted(topic))
        return state

    def _group(self, state: TopicState, name: str, restoring: bool = False) -> Group:
        """The group ``name`` of ``state``, made when new: at the end of a
        non-durable topic, at the first held record of a durable one (what
        waited for an application client that never connected before is
        its), its offsets then written to the topic log so that a restart
        knows the group."""
        group = state.groups.get(name)
        if group is None:
            if restoring:
                starts = [0] * len(state.parts)
            elif state.durable:
                starts = [part.first_held() for part in state.parts]
            else:
                starts = [part.next for part in state.parts]
            group = state.groups[name] = Group(name, starts)
            if state.durable and not restoring and self._writes is not None:
                for p, offset in enumerate(starts):
                    group.cursors[p].logged = offset
                    self._writes.commit(name, state.name, p, offset)
        return group

    def _refresh_fast(self, state: TopicState) -> None:
        """Whether publish may call the one member's handler directly; and
        the groups with a live member (:attr:`TopicState.live`), after
        every join and leave."""
        state.live = [g for g in state.groups.values() if g.members]
        self._fast.pop(state.name, None)
        if (not self.running or (state.codec is not None and not state.durable)
                or len(state.parts) != 1 or len(state.groups) != 1):
            return
        group = next(iter(state.groups.values()))
        member = group.owners[0]
        if member is not None and not member.paused:
            self._fast[state.name] = (member, group.cursors[0], state.parts[0],
                                      state if state.durable else None)

    def acknowledging(self) -> bool:
        """:returns: whether a record published now is taken (``bool``):
        while the bus runs; what its members' ``decides`` asks first, as
        on the Kafka bus."""
        return self.running

    def topics(self) -> list[str]:
        """:returns: the names of the topics the bus knows."""
        return list(self._topics)

    def held(self, topic: str) -> int:
        """:returns: how many records of ``topic`` are held in memory."""
        state = self._topics.get(topic)
        return 0 if state is None else sum(len(p.entries) for p in state.parts)

    def delete_topic(self, topic: str) -> defer.Deferred:
        """Forget ``topic``, its records and its groups' offsets (and in the
        topic log).  Nobody may consume it any more.

        :returns: a Deferred firing with None when done.
        :raises ValueError: (in the Deferred) while a member consumes it.
        """
        state = self._topics.get(topic)
        if state is None:
            return defer.succeed(None)
        if any(group.members for group in state.groups.values()):
            return defer.fail(ValueError(f"{topic}: still consumed"))
        del self._topics[topic]
        for part in state.parts:
            for waiter in part.waiters.values():
                waiter.close()
        if self._writes is not None:
            self._writes.forget(topic)
        if state.durable and self.topic_log is not None:
            return self.topic_log.delete_topic(topic)
        return defer.succeed(None)

    # -- subscribe ------------------------------------------------------------------------

    def subscribe(self, topic: str, group: str, handler: Handler,
                  from_beginning: bool = False, exclusive: bool = False,
                  bundle: str | None = None, batch_handler: Handler | None = None) -> Consumer:
        """Join ``group`` on ``topic``; see
        :meth:`tbmq.interfaces.IMessageBus.subscribe`.  Records are handed
        from the next reactor turn on (never inside this call).
        ``exclusive`` and ``bundle`` change nothing here: joining a group
        costs nothing.  With a ``batch_handler``, the records that waited
        for the member in one partition (a publish finds the member still
        busy with earlier ones: the device store's write under way) are
        handed to it together, up to the slice; a record published while
        nothing waits goes to ``handler`` during the publish.

        :returns: the :class:`Consumer`.
        :raises RecordEncodingError: in the encoding mode, or for a durable
            topic, when ``topic`` is not in the catalogue.
        """
        state = self._topic(topic)
        g = self._group(state, group)
        member = Consumer(self, state, g, handler, batch_handler)
        g.members.append(member)
        if from_beginning:
            for part, cursor in zip(state.parts, g.cursors):
                cursor.committed = part.first_held()
        g.assign(reset=from_beginning)
        member.targets = [part.next for part in state.parts]
        self._refresh_fast(state)
        for other in g.members:
            self._schedule(other)
        self._check_caught_up(member)
        return member

    def _leave(self, member: Consumer) -> None:
        self._runs.settle_now()  # the next member starts after what was acknowledged
        member.stopped = True
        member.redelivery.forget()
        if member.scheduled is not None and member.scheduled.active():
            member.scheduled.cancel()
        member.scheduled = None
        state, group = member.state, member.group_state
        group.members.remove(member)
        group.assign()
        self._refresh_fast(state)
        if not group.members:  # nobody handles it for this group now: not awaited
            for part in state.parts:
                for o, waiter in list(part.waiters.items()):
                    if waiter.complete(group.name, True, o):
                        del part.waiters[o]
        for other in group.members:
            self._schedule(other)

    # -- publish ----------------------------------------------------------------------------

    def publish(self, topic: str, key: str | None, value: Any, headers: tuple = (),
                done: Callable[[Failure | None], None] | None = None) -> defer.Deferred | None:
        """Append a record; see :meth:`tbmq.interfaces.IMessageBus.publish`.

        The record is "durable" once every group with a live member has
        handled it (its handler's result fired: None, a Deferred or a
        :class:`~tbmq.cluster.completion.Completion`) on a non-durable
        topic, or once the topic log stored it on a durable topic (at once
        without a log: there the consumers' results only commit).

        :param done: ``done(None | Failure)``, or None.  Called exactly
            once: with None once the record is durable (during the call when
            it already is: the hot path), or with a
            :class:`~twisted.python.failure.Failure` of
            :class:`~tbmq.errors.ConsumerFailedError` (a handler failed; the
            other groups still get the record),
            :class:`~tbmq.errors.BusClosedError` (not started; stopped
            before every group handled it),
            :class:`~tbmq.errors.RecordEncodingError` (during the call: the
            value does not fit the topic's codec, or the topic is not in
            the catalogue in the encoding mode) or
            :class:`~tbmq.errors.BusPublishError` (the topic log failed).
            An exception it raises when called later is logged.
        :returns: None with ``done``; else None when the record was durable
            during the call, or a Deferred that fires (or fails) as ``done``
            would be called.  Never raises.
        """
        fast = self._fast.get(topic)
        if fast is not None:
            member, cursor, part, held = fast
            o = part.next
            if held is not None:  # durable: handed during the publish (inprocess_held)
                if cursor.committed == o:
                    if headers and self._held_now(held, member, cursor, part, key, value, headers):
                        if done is not None:  # (_answer's None: durable now)
                            done(None)
                        return None
                    if (member.batch_handler is None and member.targets is None
                            and not self.encodes):
                        return _answer(self._logged_now(held, member, cursor, part, key, value,
                                                        headers, done), done)
            elif cursor.committed == o:
                # the hot path: nothing waits, hand it now (a handler of this
                # member running now has not committed: not here)
                part.next = cursor.position = n = o + 1
                member.busy = True
                try:
                    result = member.handler(new_record((topic, key, value, headers, 0, o)))
                except Exception:
                    member.busy = False
                    return _answer(self._hot_failed(
                        self._topics[topic], member, cursor, part,
                        new_record((topic, key, value, headers, 0, o)), Failure()), done)
                member.busy = False
                if result is None or (type(result) is Completion and result.succeeded):
                    cursor.committed = n
                    if member.wanted:
                        self._pump(member)
                    if done is not None:
                        done(None)
                    return None
                return _answer(self._hot_pending(
                    self._topics[topic], member, cursor, part,
                    new_record((topic, key, value, headers, 0, o)), result), done)
            if held is None and member.batch_handler is not None and done is not None:
                self._queued(member, part, topic, key, value, headers, done)
                return None
        return _answer(self._publish(self._topics.get(topic), topic, key, value, headers, done),
                       done)

    def _hot_failed(self, state, member, cursor, part, record, failure) -> Exception:
        o = record.offset
        part.put(o, record.key, record.value, record.headers)
        self._handled(member, state, 0, cursor, o, failure, False)
        if member.wanted:
            self._pump(member)
        return ConsumerFailedError(
            f"{state.name}: the handler of consumer group {member.group!r} failed; "
            "the record is not committed for it", group=member.group)

    def _hot_pending(self, state, member, cursor, part, record, result):
        o = record.offset
        part.put(o, record.key, record.value, record.headers)
        waiter = part.waiters[o] = Waiter(state.name, {member.group})
        self._track(member, state, 0, cursor, o, result)
        if member.wanted:
            self._pump(member)
        if waiter.done:
            part.waiters.pop(o, None)
        return waiter.outcome()

    def _publish(self, state: TopicState | None, topic: str, key, value, headers, done):
        """The publish of a record off the hot path.

        :param done: the publish's ``done`` or None; on a durable topic
            with a log it is called once the log has the record.
        :returns: None (durable now), an exception (failed now), the
            record's :class:`~.inprocess_log.Waiter`, :data:`_LOGGING` (the
            log calls ``done``) or a Deferred (of the log; ``done`` None):
            see :func:`_answer`.
        """
        if not self.running:
            return BusClosedError(f"{topic}: the bus is not running")
        # a transient record never reaches the topic log: held as the object
        # it was published with, never encoded (unless in the encoding mode)
        short = headers and transient(headers)
        try:
            if state is None:
                state = self._topic(topic)
            stored = value if state.codec is None or (short and not self.encodes) \
                else state.codec.encode(value)
        except RecordEncodingError as e:
            return e
        logged = state.durable and self._writes is not None and not short
        if headers and logged:
            try:  # alone: it would fail the whole turn's append
                check_record((topic, 0, 0, key, stored, headers, False))
            except (TypeError, ValueError) as e:
                return BusPublishError(f"{topic}: the topic log did not store the record: {e}")
        parts = state.parts
        n = len(parts)
        if n == 1:
            p = 0
        elif key is None:
            p = state.rr % n
            state.rr += 1
        else:
            p = partition_of(key, n)
        part = parts[p]
        groups = state.live
        waiter = result = None
        if state.durable:
            # held as Kafka would once it is logged: its publisher does not
            # wait for the consumers (a persistent APPLICATION commits when
            # its client acknowledges); a live group gets the object itself
            # (encoded once, for the log), unless in the encoding mode
            o = part.append(key, stored, headers,
                            value if (groups or stored is value) and not self.encodes else None)
            if logged:
                if done is None:
                    result = defer.Deferred()
                    done = result.callback  # a Failure: errback
                else:
                    result = _LOGGING
                self._writes.append((topic, p, o, key, stored, headers, state.compacted), done)
                part.logged_next = o + 1
        else:
            o = part.append(key, stored, headers)
            if groups:
                waiter = part.waiters[o] = Waiter(topic, {groups[0].name} if len(groups) == 1
                                                  else {g.name for g in groups})
        for g in groups:  # a batch handler gets what the turn publishes together
            member = g.owners[p]
            if member.batch_handler is None:
                self._pump(member)
            else:
                self._schedule(member)
        self._retain(state, part)
        if waiter is None:
            return result
        if waiter.done:
            part.waiters.pop(o, None)
        return waiter.outcome()

    # -- handing records ----------------------------------------------------------------------

    def _schedule(self, member: Consumer) -> None:
        """Hand ``member`` its waiting records from the next reactor turn."""
        if (member.scheduled is None and self.running and not member.stopped
                and not member.paused):
            member.scheduled = self.clock.callLater(0, self._slice, member)

    def _slice(self, member: Consumer) -> None:
        member.scheduled = None
        if self._writes is not None:  # what its handlers log goes at its end: LogWrites.slice
            return self._writes.slice(self._pump, member)
        self._pump(member)

    def _pump(self, member: Consumer) -> None:
        """Hand ``member`` its waiting records: at most :data:`SLICE` now,
        the rest from the next reactor turn."""
        if member.busy:
            member.wanted = True
            return
        member.wanted = False
        if member.paused or member.stopped or not self.running:
            return
        state = member.state
        limit = self.max_uncommitted
        budget = SLICE
        member.busy = True
        try:
            while member.inflight < limit:
                found = self._next(member, state)
                if found is None:
                    break
                if budget <= 0:
                    self._schedule(member)
                    break
                if member.batch_handler is None:
                    budget -= 1
                    self._hand(member, state, *found)
                else:
                    budget -= self._hand_batch(member, state, min(budget, limit - member.inflight),
                                               *found)
        finally:
            member.busy = False
            member.wanted = False  # the loop above took what came meanwhile
        self._check_group_caught_up(member.group_state)

    def _next(self, member: Consumer, state: TopicState):
        """The next record for ``member``: ``(p, cursor, part, offset,
        entry)``, or None."""
        owned = member.partitions
        n = len(owned)
        cursors = member.group_state.cursors
        parts = state.parts
        for i in range(n):
            p = owned[(member.cursor + i) % n]
            cursor, part = cursors[p], parts[p]
            if cursor.failed:  # stopped there until it is read again
                continue
            if cursor.position < part.first:
                cursor.position = part.first
            entries = part.entries
            while cursor.position < part.next:
                o = cursor.position
                entry = entries.get(o)
                if entry is not None:
                    member.cursor = (member.cursor + i + 1) % n
                    return p, cursor, part, o, entry
                cursor.position = o + 1  # a hole: compacted away or dropped
                waiter = part.waiters.get(o)
                # superseded before this group got it
                if waiter is not None and waiter.complete(member.group, True, o):
                    del part.waiters[o]
            if cursor.advance():
                self._committed(state, member.group_state, p, cursor)
        return None

    def _hand(self, member: Consumer, state: TopicState, p: int, cursor, part: Partition,
              o: int, entry: tuple) -> None:
        cursor.position = o + 1
        key, value, headers, decoded = entry
        try:
            if decoded is not None:
                value = decoded
            elif state.codec is not None:
                value = state.codec.decode(value)
            result = member.handler(new_record((state.name, key, value, headers, p, o)))
        except Exception:
            self._handled(member, state, p, cursor, o, Failure(), False)
            return
        if result is None:
            self._handled(member, state, p, cursor, o, None, False)
        else:
            self._track(member, state, p, cursor, o, result)

    def _hand_batch(self, member: Consumer, state: TopicState, most: int, p: int, cursor,
                    part: Partition, o: int, entry: tuple) -> int:
        """Hand ``member.batch_handler`` the records of partition ``p`` that
        wait in a row from ``o`` (at most ``most``); their one result settles
        each (:meth:`_handled`).  :returns: how many were handed."""
        offsets, values = part.run(o, most, state.codec)
        if not offsets:  # it alone fails
            self._hand(member, state, p, cursor, part, o, entry)
            return 1
        cursor.position = o + len(offsets)
        try:
            result = member.batch_handler(values)
        except Exception:
            self._settled_batch(Failure(), member, state, p, cursor, offsets, False)
            return len(offsets)
        if type(result) not in (Completion, Progress) and not isinstance(result, defer.Deferred):
            self._settled_batch(None, member, state, p, cursor, offsets, False)
            return len(offsets)
        cursor.inflight.update(offsets)
        member.inflight += len(offsets)
        if type(result) is Progress:  # each settles once its leading run passes it (per turn)
            self._runs.track(result, member, state, p, cursor, offsets)
        elif type(result) is Completion:
            result.then(self._settled_batch, member, state, p, cursor, offsets, True)
        else:
            result.addCallbacks(self._settled_batch, self._settled_batch,
                                callbackArgs=(member, state, p, cursor, offsets, True),
                                errbackArgs=(member, state, p, cursor, offsets, True))
        return len(offsets)

    def _settled_batch(self, outcome, member, state, p, cursor, offsets: list,
                       deferred: bool) -> None:
        """A batch's result fired (a Failure fails each record); a success: one commit."""
        if isinstance(outcome, Failure):
            for o in offsets:
                self._handled(member, state, p, cursor, o, outcome, deferred)
            return
        group = member.group_state
        n = len(offsets)
        if deferred:
            member.inflight -= n
            cursor.inflight.difference_update(offsets)
        if group.cursors[p] is cursor and cursor.advance(range(offsets[0], offsets[-1] + 1)):
            self._committed(state, group, p, cursor)
            member.redelivery.passed(p, cursor.committed)
            if cursor.committed in cursor.failed:
                self._read_again(member, p, cursor)
        waiters = state.parts[p].waiters
        if waiters:
            # each waiter settles the offsets of the batch that are its own
            # (a QueuedRun: all of them at once)
            name, get = group.name, waiters.get
            o, end = offsets[0], offsets[-1] + 1
            while o < end:
                waiter = get(o)
                o = o + 1 if waiter is None else waiter.complete_span(name, o, end, waiters)
        if deferred:
            limit = self.max_uncommitted
            if not member.busy and member.inflight < limit <= member.inflight + n:
                self._schedule(member)
            self._check_group_caught_up(group)

    def _track(self, member, state, p, cursor, o, result) -> None:
        """Wait for a handler's result that is not None (Completion, Deferred; else: success)."""
        if type(result) is Completion:
            cursor.inflight.add(o)
            member.inflight += 1
            result.then(self._settled, member, state, p, cursor, o)
            return
        if not isinstance(result, defer.Deferred):
            self._handled(member, state, p, cursor, o, None, False)
            return
        cursor.inflight.add(o)
        member.inflight += 1
        result.addCallbacks(self._fired, self._fired,
                            callbackArgs=(member, state, p, cursor, o, False),
                            errbackArgs=(member, state, p, cursor, o, True))

    def _fired(self, outcome, member, state, p, cursor, o, failed) -> None:
        self._handled(member, state, p, cursor, o, outcome if failed else None, True)

    def _settled(self, failure, member, state, p, cursor, o) -> None:
        self._handled(member, state, p, cursor, o, failure, True)

    def _handled(self, member: Consumer, state: TopicState, p: int, cursor, o: int,
                 failure: Failure | None, deferred: bool) -> None:
        """The handler's result for record ``o`` of partition ``p`` fired
        (``failure`` when it failed)."""
        group = member.group_state
        current = group.cursors[p] is cursor
        if deferred:
            member.inflight -= 1
            cursor.inflight.discard(o)
        if failure is not None:
            if current:
                cursor.failed[o] = failure
                if cursor.committed == o:
                    self._read_again(member, p, cursor)
            else:
                self.log.debug("consumer group {group} of {topic} failed on partition "
                               "{partition} offset {offset}; it is read again",
                               group=group.name, topic=state.name, partition=p, offset=o)
        elif current and cursor.advance():
            self._committed(state, group, p, cursor)
            member.redelivery.passed(p, cursor.committed)
            if cursor.committed in cursor.failed:
                self._read_again(member, p, cursor)
        part = state.parts[p]
        waiter = part.waiters.get(o)
        if waiter is not None and waiter.complete(group.name, failure is None, o):
            del part.waiters[o]
        if deferred:
            if not member.busy and member.inflight == self.max_uncommitted - 1:
                self._schedule(member)
            self._check_group_caught_up(group)

    def _read_again(self, member: Consumer, p: int, cursor) -> None:
        """The record at ``cursor.committed`` failed (every one before it handled): ``p`` is
        read again from there after the delay (:class:`~tbmq.cluster.redelivery.Redelivery`)."""
        failure = cursor.failed[cursor.committed]
        member.redelivery.failed(p, cursor.committed, failure,
                                 lambda: self._again(member, p, cursor))

    def _again(self, member: Consumer, p: int, cursor) -> None:
        group = member.group_state
        if member.stopped or group.cursors[p] is not cursor or group.owners[p] is not member:
            return  # taken away meanwhile: its new cursor starts at the committed offset
        group.cursors[p] = Cursor(cursor.committed)
        self._refresh_fast(member.state)
        self._schedule(member)

    def _check_group_caught_up(self, group: Group) -> None:
        for member in group.members:
            if member.targets is not None:
                self._check_caught_up(member)

    def _check_caught_up(self, member: Consumer) -> None:
        targets = member.targets
        cursors = member.group_state.cursors
        for p, target in enumerate(targets):
            cursor = cursors[p]
            if not cursor.handled_below(target) and cursor.committed not in cursor.failed:
                return  # (stopped at a failed record: it has a result)
        member.targets = None
        member.caught_up.callback(None)

    # -- commits and memory ---------------------------------------------------------------------

    def _committed(self, state: TopicState, group: Group, p: int, cursor) -> None:
        """``group``'s committed offset on partition ``p`` moved."""
        writes = self._writes
        part = state.parts[p]
        if state.durable and writes is not None:
            # past the last logged record only transient ones were read: the
            # log holds none of them, so their commit need not be written
            # (a restart starts at the end of what the log holds anyway)
            offset = cursor.committed
            if offset > part.logged_next:
                offset = part.logged_next
            if offset != cursor.logged:
                cursor.logged = offset
                writes.commit(group.name, state.name, p, offset)
        groups = state.groups
        # one group (a node's own topics): its commit is the lowest
        before = group.cursors[p].committed if len(groups) == 1 else min(
            [g.cursors[p].committed for g in groups.values()])
        # (a compacted partition releases its tombstones alone: the keys'
        # last records stay, whatever was committed)
        if part.tombstones or (before > part.first and not state.compacted):
            if part.release(before) and state.durable and not state.compacted \
                    and writes is not None:
                writes.truncate(state.name, p, before)

    def _retain(self, state: TopicState, part: Partition) -> None:
        """Keep at most ``retention_records`` records that no group needs
        (see the module doc)."""
        if len(part.entries) <= self.retention_records or state.compacted:
            return
        p = part.index
        groups = state.groups.values()
        if not state.durable:
            groups = [g for g in groups if g.members]
        below = min((g.cursors[p].committed for g in groups), default=part.next)
        dropped = part.drop_oldest(self.retention_records, below)
        if not dropped:
            return
        self.dropped += dropped
        now = self.clock.seconds()
        if self._drop_logged_at is None or now - self._drop_logged_at >= DROP_LOG_INTERVAL:
            self.log.warn("in-process bus: {n} records dropped by retention ({total} in all; "
                          "last from {topic})", n=self.dropped - self._dropped_logged,
                          total=self.dropped, topic=state.name)
            self._drop_logged_at = now
            self._dropped_logged = self.dropped
