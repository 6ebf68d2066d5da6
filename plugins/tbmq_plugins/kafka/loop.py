"""The consumer thread: one per consumer, owner of its Kafka client.

Kafka consumer clients are not thread-safe, so one thread
(:class:`ConsumerLoop`) does everything with one: join the group (or assign
the partitions, for an exclusive group), position the partitions, poll, and
between two polls commit, pause and resume as the reactor asked.  Each poll's
records go to the reactor with **one** ``callFromThread``; the reactor side
(:class:`~.consumer.KafkaConsumer`) hands them to the handler.

**Where a partition starts** when it is assigned: at the group's committed
offset; with none, at the first offset the partition holds on a durable
topic (:meth:`~tbmq.cluster.topics.TopicCatalogue.durable`) and at its end
otherwise; ``from_beginning`` starts the first assignment at the first
offset whatever the group committed.  A start the group had no committed
offset for is committed at once, so a member that gets the partition later
(a rebalance, a restart) starts where this one did.

**Ends, without trusting ``end_offsets``.**  Tansu's ``end_offsets`` (and
``seek_to_end``, ``auto_offset_reset='latest'``) give the base offset of the
last batch + 1, which is too low.  The high watermark a *fetch* reports is
right, on Tansu and on Kafka, so the end of a partition is the high
watermark of the first fetch after it was assigned (confluent-kafka: its
end-of-partition event, or the watermark cached from the fetch that brought
its first record).  A partition that starts at the end is positioned at the
reported end, and the records below the fetched end are skipped: they were
there before the group started.  A partition is *reached* once everything
below its end was handed to the reactor, which then fires ``caught_up`` when
the handlers' results of those records have fired.

**Reading a partition again.**  When a handler's result failed, the
reactor asks (:meth:`ConsumerLoop.seek`) for the partition from the failed
record's offset: between two polls the thread seeks the client there and
tells the reactor as for a new assignment of that partition (same thread,
so every record read before the seek reaches the reactor before).

**Outages.**  A client that cannot be built, or a poll that fails, is
retried every :data:`RETRY_DELAY` seconds; the loop logs the first failure
and the recovery, not each retry.

**Exclusive subscriptions share a thread and a client.**  The exclusive
subscriptions of one group (a node's own topics: its downlinks, session
answers and disconnects, and the replays of the session, subscription,
retained and node topics) are read by one :class:`SharedLoop`: one thread,
one :class:`~.drivers.ExclusiveClient` over the partitions of all their
topics, so that one fetch covers them all (an idle node sends a few fetches
per wait, not one per topic).  Each subscription keeps its own
:class:`ConsumerLoop` state (positions, ends, commits, pause), driven by the
shared thread through a :class:`TopicView` of the client.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from twisted.logger import Logger

from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq_plugins.kafka.bridge import ask_reactor
from tbmq_plugins.kafka.drivers import ConsumerClient, ExclusiveClient, RawRecord

__all__ = ["BACKLOG_EVERY", "POLL_TIMEOUT", "RETRY_DELAY", "ConsumerLoop", "SharedLoop",
           "TopicView"]

log = Logger(observer=LOG_OBSERVER)

#: Seconds one poll waits for records at most (commands wait that long at most).
POLL_TIMEOUT = 0.05
#: Seconds between two attempts while Kafka fails.
RETRY_DELAY = 0.5
#: Seconds between two readings of the backlog (:attr:`ConsumerLoop.backlog`).
BACKLOG_EVERY = 1.0


class _Outage:
    """Logs the first failure of a consumer thread and its recovery, not
    each retry (:attr:`name`, :attr:`_failing`)."""

    name: str
    _failing: str | None

    def _trouble(self, error: Any) -> None:
        if self._failing is None:
            log.warn("Kafka consumer {name}: {error}; retrying until it works",
                     name=self.name, error=error)
        self._failing = str(error)

    def _recovered(self) -> None:
        if self._failing is not None:
            log.info("Kafka consumer {name}: reading again", name=self.name)
            self._failing = None


class ConsumerLoop(_Outage):
    """The thread of one consumer (see the module doc).

    :param reactor: the reactor of ``sink``.
    :param make_client: ``make_client() -> ConsumerClient`` (may block).
    :param sink: the reactor side: ``_assigned(partitions)``,
        ``_batch(records, reached)``, ``_revoke(partitions)`` (asked, its
        result awaited), ``_closed()``; called in the reactor thread.
    :param exclusive: assign every partition without joining the group.
    :param from_beginning: start the first assignment at the first offsets.
    :param durable: a new group starts at the first offsets, not at the end.
    :param max_records: most records per poll.
    :param timeout: seconds a rebalance waits for the reactor at most.
    :param grace: seconds a member leaving its group keeps polling to
        notice a rebalance under way (two heartbeat intervals).
    :param stuck: seconds without an assignment after which a member joins
        its group again as a new member.
    :param name: the thread's name (and the consumer's, in log lines).
    A loop runs in a thread of its own (:meth:`start`), or is driven by a
    :class:`SharedLoop` (:meth:`SharedLoop.add`; exclusive only,
    ``make_client`` unused).
    :ivar backlog: records the partitions of this member hold beyond what
        the thread handed to the reactor (high watermarks of the last
        fetches), read every :data:`BACKLOG_EVERY` seconds; ``int``.
    """

    def __init__(self, reactor: Any, make_client: Callable[[], ConsumerClient], sink: Any, *,
                 exclusive: bool, from_beginning: bool, durable: bool, max_records: int,
                 timeout: float, grace: float, stuck: float, name: str) -> None:
        self._reactor = reactor
        self._make_client = make_client
        self._sink = sink
        self._exclusive = exclusive
        self._from_beginning = from_beginning
        self._durable = durable
        self._max_records = max_records
        self._timeout = timeout
        self._grace = grace
        self._stuck = stuck
        self.name = name
        self._lock = threading.Lock()
        self._commits: dict[int, int] = {}
        self._seeks: dict[int, int] = {}
        self.want_paused = False
        self._stopping = False
        self._client: ConsumerClient | None = None
        self._paused = False  # what the client was last told
        self._failing: str | None = None
        self._first_assignment = True
        # the current assignment (thread side)
        self._next: dict[int, int] = {}  # next offset to hand over
        self._ends: dict[int, int | None] = {}  # None: not fetched yet
        self._at_end: set[int] = set()  # starts at the end, not known yet
        self._skip: dict[int, int] = {}  # records below are skipped
        self._reached: set[int] = set()
        self._want: set[int] = set()  # partitions whose end is not known (given to poll)
        self._revoked: set[int] = set()  # taken away, state not dropped yet
        self._rebalancing = False  # partitions revoked (or none yet), none assigned since
        self._closing = False
        self._rebalance_deadline = 0.0
        self.backlog = 0
        self._backlog_at = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- from the reactor (thread-safe) -------------------------------------------------

    def start(self) -> None:
        """Start its own thread (see :meth:`SharedLoop.add` for the other way)."""
        self._thread.start()

    def commit(self, partition: int, offset: int) -> None:
        """Have ``offset`` committed for ``partition`` before the next poll."""
        with self._lock:
            self._commits[partition] = offset

    def seek(self, partition: int, offset: int) -> None:
        """Have ``partition`` read again from ``offset`` before the next
        poll (a record there failed); the sink's ``_assigned([partition])``
        follows, as for a new assignment.  Nothing for a partition revoked
        meanwhile."""
        with self._lock:
            self._seeks[partition] = offset

    def stop(self) -> None:
        """Commit what was asked, close the client (leaving the group), then
        call the sink's ``_closed``."""
        self._stopping = True

    # -- driven by a SharedLoop's thread ---------------------------------------------------

    @property
    def stopping(self) -> bool:
        """:meth:`stop` was called (the thread closes the client next)."""
        return self._stopping

    @property
    def wanted(self) -> set[int]:
        """Partitions whose end the loop does not know yet (thread side)."""
        return self._want

    def attach(self, view: "TopicView") -> bool:
        """Take every partition of the view's topic (exclusive).

        :returns: False when Kafka failed (try again later)."""
        self._client = view
        try:
            partitions = view.partitions()
        except Exception as e:
            self._trouble(e)
            return False
        return self._assign(partitions, assign=True)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        client = None
        try:
            client = self._retry(self._make_client)
            if client is None:
                return
            self._client = client
            if self._exclusive:
                partitions = self._retry(client.partitions)
                while not self._stopping and not self._assign(partitions, assign=True):
                    time.sleep(RETRY_DELAY)
            else:
                client.subscribe(self._on_assign, self._on_revoke)
                self._rebalancing = True  # joining
                self._rebalance_deadline = time.monotonic() + self._stuck
            while not self._stopping:
                self.between_polls(client)
                self.poll_once(client)
                if self._rebalancing and time.monotonic() > self._rebalance_deadline:
                    client = self._client = self._rejoin(client)
            if client is not None and not self._exclusive:
                self._finish_rebalance(client)
        finally:
            self.close_client(client)

    def _finish_rebalance(self, client: ConsumerClient) -> None:
        """Before leaving the group: notice a rebalance under way (within
        two heartbeats) and take part in it until the assignment.  Tansu
        keeps a member that leaves between its join and its assignment as
        the group's leader, and the group never gets an assignment again."""
        now = time.monotonic()
        grace, deadline = now + self._grace, now + self._grace + self._timeout
        while now < deadline and (self._rebalancing or now < grace):
            self.poll_once(client)
            now = time.monotonic()

    def _rejoin(self, client: ConsumerClient) -> ConsumerClient:
        """The group gave no assignment for too long (see
        :meth:`_finish_rebalance`): join again as a new member."""
        log.warn("Kafka consumer {name}: no partitions assigned for {seconds:.0f} s; "
                 "joining the group again", name=self.name, seconds=self._stuck)
        self._closing = True
        try:
            client.close()
        except Exception as e:
            self._trouble(e)
        self._closing = False
        self._drop_revoked()
        client = self._retry(self._make_client)
        if client is not None:
            client.subscribe(self._on_assign, self._on_revoke)
        self._rebalance_deadline = time.monotonic() + self._stuck
        return client

    def _retry(self, f: Callable) -> Any:
        """``f()``, retried until it works or the loop stops (then None)."""
        while not self._stopping:
            try:
                result = f()
            except Exception as e:
                self._trouble(e)
                time.sleep(RETRY_DELAY)
                continue
            self._recovered()
            return result
        return None


    def _take_commits(self) -> dict[int, int]:
        with self._lock:
            offsets, self._commits = self._commits, {}
        return offsets

    def _commit(self, client: ConsumerClient, wait: bool) -> None:
        """Commit what the reactor asked for; what fails without ``wait`` is
        tried again next time, unless newer offsets came meanwhile."""
        offsets = self._take_commits()
        if offsets:
            try:
                client.commit(offsets, wait=wait)
            except Exception as e:
                self._trouble(e)
                if not wait:
                    with self._lock:
                        for p, o in offsets.items():
                            self._commits.setdefault(p, o)

    def between_polls(self, client: ConsumerClient) -> None:
        """Commit, pause and resume what the reactor asked (thread side)."""
        self._commit(client, wait=False)
        if self._seeks:
            self._seek(client)
        paused = self.want_paused
        if paused != self._paused and self._next:
            (client.pause if paused else client.resume)(list(self._next))
        self._paused = paused

    def _seek(self, client: ConsumerClient) -> None:
        """Seek what the reactor asked (:meth:`seek`); what fails is tried
        again next time."""
        with self._lock:
            seeks, self._seeks = self._seeks, {}
            seeks = {p: o for p, o in seeks.items() if p in self._next and p not in self._revoked}
        if not seeks:
            return
        try:
            client.seek(seeks)
        except Exception as e:
            self._trouble(e)
            with self._lock:
                for p, o in seeks.items():
                    self._seeks.setdefault(p, o)
            return
        log.debug("Kafka consumer {name}: partitions read again from {seeks}", name=self.name,
                  seeks=seeks)
        self._track(list(seeks), seeks, set())

    def poll_once(self, client: ConsumerClient) -> None:
        """One poll of ``client``; its records and reached partitions to the
        reactor in one call (thread side)."""
        self._drop_revoked()
        try:
            records, ends = client.poll(POLL_TIMEOUT, self._max_records, self._want)
        except Exception as e:
            self._trouble(e)
            time.sleep(RETRY_DELAY)
            return
        gone = self._drop_revoked()
        if gone:
            records = [r for r in records if r.partition not in gone]
        error = client.take_error()
        if error is not None:
            self._trouble(error)
        elif records or ends:
            self._recovered()
        for p, end in ends.items():
            if p in self._ends and self._ends[p] is None:
                self._ends[p] = end
                self._want.discard(p)
                if p in self._at_end:
                    self._at_end.discard(p)
                    self._skip[p] = end
                    self._next[p] = max(self._next[p], end)
                    self.commit(p, end)
        if self._skip:
            records = [r for r in records if r.offset >= self._skip.get(r.partition, -1)]
        nexts = self._next
        for r in records:
            nexts[r.partition] = r.offset + 1
        reached = [p for p, end in self._ends.items()
                   if end is not None and p not in self._reached and nexts[p] >= end]
        self._reached.update(reached)
        if records or reached:
            self._reactor.callFromThread(self._sink._batch, records, reached)
        now = time.monotonic()
        if now >= self._backlog_at:
            self._backlog_at = now + BACKLOG_EVERY
            self._read_backlog(client)

    def _read_backlog(self, client: ConsumerClient) -> None:
        nexts = self._next
        try:
            ends = client.high_watermarks(list(nexts))
        except Exception:  # noqa: BLE001 - a figure for the metrics, read again later
            return
        self.backlog = sum(max(0, end - nexts[p]) for p, end in ends.items() if p in nexts)

    # -- assignments -----------------------------------------------------------------------

    def _on_assign(self, partitions: list[int]) -> None:
        """The group gave ``partitions`` (in this thread, during a poll).
        While Kafka fails, positioning is tried again for ``timeout``
        seconds; then the client reads them from the committed offsets (the
        first ones without), which never skips a record."""
        self._rebalancing = False
        deadline = time.monotonic() + self._timeout
        while not self._assign(partitions, assign=False):
            if self._stopping or time.monotonic() > deadline:
                self._client.resume(partitions)
                self._track(partitions, {p: 0 for p in partitions}, set())
                return
            time.sleep(RETRY_DELAY)

    def _assign(self, partitions: list[int], assign: bool) -> bool:
        """Position ``partitions`` (see the module doc) and tell the reactor.

        :returns: False when Kafka failed meanwhile.
        """
        client = self._client
        try:
            committed = client.committed(partitions)
            restart = self._from_beginning and self._first_assignment
            first = [p for p in partitions
                     if restart or (committed.get(p) is None and self._durable)]
            at_end = [p for p in partitions if p not in first and committed.get(p) is None]
            starts = {p: committed.get(p) for p in partitions}
            if first:
                starts.update(client.first_offsets(first))
            if at_end:
                starts.update(client.end_offsets(at_end))
            client.start_at(starts, assign)
            new = {p: starts[p] for p in first if committed.get(p) is None}
            if new:  # the group is known from now on
                client.commit(new, wait=True)
        except Exception as e:
            self._trouble(e)
            return False
        self._first_assignment = False
        log.debug("Kafka consumer {name}: partitions {partitions} from {starts} "
                  "(at the end: {at_end})", name=self.name, partitions=partitions,
                  starts=starts, at_end=at_end)
        if at_end:  # a group's first assignment of these: once in their life
            log.info("Kafka consumer {name}: partitions {at_end} have no committed offset: "
                     "starting at their end", name=self.name, at_end=at_end)
        self._track(partitions, starts, set(at_end))
        return True

    def _track(self, partitions: list[int], starts: dict[int, int], at_end: set[int]) -> None:
        with self._lock:  # given again within the same poll
            self._revoked.difference_update(partitions)
        for p in partitions:
            self._next[p] = starts[p]
            self._ends[p] = None
            self._want.add(p)
            self._skip.pop(p, None)
            self._reached.discard(p)
        self._at_end |= at_end
        if self._paused and partitions:
            self._client.pause(partitions)
        self._reactor.callFromThread(self._sink._assigned, partitions)

    def _on_revoke(self, partitions: list[int]) -> dict[int, int]:
        """The group takes ``partitions`` back (during a poll or the close;
        possibly in the client's own thread, so only thread-safe work here):
        the reactor stops handing them and queues what it finished.

        :returns: the offsets to commit before they go (the driver does).
        """
        if not self._closing and not self._rebalancing:
            self._rebalancing = True
            self._rebalance_deadline = time.monotonic() + self._stuck
        if partitions:
            log.debug("Kafka consumer {name}: partitions {partitions} revoked",
                      name=self.name, partitions=partitions)
            if not self._stopping:
                ask_reactor(self._reactor, self._sink._revoke, partitions,
                            timeout=self._timeout)
            with self._lock:
                self._revoked.update(partitions)
        return self._take_commits()

    def _drop_revoked(self) -> set[int]:
        """Forget the partitions revoked since the last call.

        :returns: them."""
        with self._lock:
            gone, self._revoked = self._revoked, set()
        for p in gone:
            self._next.pop(p, None)
            self._ends.pop(p, None)
            self._want.discard(p)
            self._skip.pop(p, None)
            self._at_end.discard(p)
            self._reached.discard(p)
        return gone

    def close_client(self, client: ConsumerClient | None) -> None:
        """Commit what was asked (waiting), close ``client`` and tell the
        reactor (thread side)."""
        try:
            if client is not None:
                self._commit(client, wait=True)
                self._closing = True
                try:
                    client.close()
                except Exception as e:
                    self._trouble(e)
        finally:
            self._reactor.callFromThread(self._sink._closed)


class TopicView(ConsumerClient):
    """One topic of a shared :class:`~.drivers.ExclusiveClient`, seen by a
    :class:`ConsumerLoop` as a :class:`~.drivers.ConsumerClient` of ``int``
    partitions.  Its :meth:`poll` returns what the shared thread's last poll
    read for the topic (:attr:`records`, :attr:`ends`) without waiting.

    :param client: the shared :class:`~.drivers.ExclusiveClient`.
    :param topic: the topic name.
    """

    def __init__(self, client: ExclusiveClient, topic: str) -> None:
        self._client = client
        self.topic = topic
        self.records: list[RawRecord] = []
        self.ends: dict[int, int] = {}
        self._mine: set[int] = set()

    def _tps(self, partitions: Any) -> list[tuple]:
        topic = self.topic
        return [(topic, p) for p in partitions]

    @staticmethod
    def _by_partition(found: dict) -> dict:
        return {tp[1]: value for tp, value in found.items()}

    def partitions(self) -> list[int]:
        return self._client.partitions(self.topic)

    def subscribe(self, on_assign: Callable, on_revoke: Callable) -> None:
        raise TypeError("a TopicView is for exclusive subscriptions (no group join)")

    def start_at(self, offsets: dict[int, int], assign: bool) -> None:
        self._client.add({(self.topic, p): o for p, o in offsets.items()})
        self._mine.update(offsets)

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

    def poll(self, timeout: float, max_records: int,
             want_ends: set[int]) -> tuple[list[RawRecord], dict[int, int]]:
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
        """Stop reading this topic's partitions; the client stays open."""
        mine, self._mine = sorted(self._mine), set()
        self._client.remove(self._tps(mine))


class SharedLoop(_Outage):
    """The thread and the client of the exclusive subscriptions of one group
    (see the module doc): every turn it commits, pauses and resumes what each
    subscription asked, polls the one client, and lets each subscription's
    :class:`ConsumerLoop` take its topic's records.  A subscription added
    later is assigned its partitions on the next turn (no group join); one
    stopped has its commits done and its partitions removed.  When the last
    one is gone the client is closed and the thread ends (:attr:`dead`).

    :param reactor: the reactor of the subscriptions' sinks.
    :param make_client: ``make_client() -> ExclusiveClient`` (may block).
    :param max_records: most records per poll.
    :param name: the thread's name.
    :ivar dead: True once the thread ended; :meth:`add` refuses then.
    """

    def __init__(self, reactor: Any, make_client: Callable[[], ExclusiveClient], *,
                 max_records: int, name: str) -> None:
        self._reactor = reactor
        self._make_client = make_client
        self._max_records = max_records
        self.name = name
        self._lock = threading.Lock()
        self._adding: list[tuple[ConsumerLoop, str]] = []
        self._waiting: list[tuple[ConsumerLoop, str]] = []  # thread side: not assigned yet
        self._members: dict[ConsumerLoop, TopicView] = {}  # thread side
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing: str | None = None
        self.dead = False

    def add(self, member: ConsumerLoop, topic: str) -> bool:
        """Have the thread read ``topic`` for ``member`` (thread-safe).

        :returns: False when the thread has ended (make another loop)."""
        with self._lock:
            if self.dead:
                return False
            self._adding.append((member, topic))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        self._wake.set()
        return True

    def _run(self) -> None:
        client = None
        try:
            while True:
                with self._lock:
                    self._waiting += self._adding
                    self._adding = []
                    if not self._waiting and not self._members:
                        self.dead = True
                        return
                self._wake.clear()
                if client is None:
                    client = self._open()
                    if client is None:
                        continue
                self._attach(client)
                self._detach()
                if self._members:
                    self._turn(client)
                else:
                    self._wake.wait(RETRY_DELAY if self._waiting else POLL_TIMEOUT)
        finally:
            for member, view in list(self._members.items()):
                member.close_client(view)
            self._members.clear()
            if client is not None:
                try:
                    client.close()
                except Exception as e:
                    self._trouble(e)

    def _open(self) -> ExclusiveClient | None:
        """A client, or None (retried later) while Kafka fails; members that
        stop meanwhile are closed."""
        try:
            client = self._make_client()
        except Exception as e:
            self._trouble(e)
            stopped = [m for m, _topic in self._waiting if m.stopping]
            self._waiting = [w for w in self._waiting if not w[0].stopping]
            for member in stopped:
                member.close_client(None)
            self._wake.wait(RETRY_DELAY)
            return None
        self._recovered()
        return client

    def _attach(self, client: ExclusiveClient) -> None:
        still = []
        for member, topic in self._waiting:
            if member.stopping:
                member.close_client(None)
                continue
            view = TopicView(client, topic)
            if member.attach(view):
                self._members[member] = view
            else:
                still.append((member, topic))
        self._waiting = still

    def _detach(self) -> None:
        for member in [m for m in self._members if m.stopping]:
            member.close_client(self._members.pop(member))

    def _turn(self, client: ExclusiveClient) -> None:
        members = self._members
        want = set()
        for member, view in members.items():
            member.between_polls(view)
            topic = view.topic
            want.update((topic, p) for p in member.wanted)
        try:
            records, ends = client.poll(POLL_TIMEOUT, self._max_records, want)
        except Exception as e:
            self._trouble(e)
            time.sleep(RETRY_DELAY)
            return
        error = client.take_error()
        if error is not None:
            self._trouble(error)
        elif records or ends:
            self._recovered()
        for member, view in members.items():
            topic = view.topic
            view.records = records.get(topic, [])
            view.ends = {tp[1]: end for tp, end in ends.items() if tp[0] == topic}
            member.poll_once(view)
