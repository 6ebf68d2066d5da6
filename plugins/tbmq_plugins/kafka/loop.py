"""The consumer threads: one per shared client, owner of that Kafka client.

Kafka consumer clients are not thread-safe, so one thread
(:class:`SharedLoop`) does everything with one client
(:class:`~.drivers.SharedClient`): assign the partitions (exclusive) or join
the group, position the partitions, poll, and between two polls commit,
pause and resume as the reactor asked.  A client reads the topics of
several subscriptions, so that one fetch covers them all:

* the **exclusive** subscriptions of one group (a node's own topics: its
  downlinks, session answers and disconnects, and the replays of the
  session, subscription, retained and node topics): every partition is
  assigned directly, no group join; a subscription added later is assigned
  its partitions on the next turn, one stopped has its partitions removed;
* the **joining** subscriptions of one bundle (TBMQ's cluster-wide groups
  of ``tbmq.msg.all``, ``tbmq.msg.persisted`` and the session events): one
  member of one group over all their topics.  A group rebalances all its
  topics together and a change of its topics is a rebalance (seconds on
  Tansu), so the thread gathers the subscriptions made within
  :data:`GATHER` seconds of each other, and those whose topic is being
  created meanwhile (:meth:`SharedLoop.expect`), before it joins; one made
  later joins the topic with another rebalance, one stopped leaves it with
  another.  A joining subscription outside a bundle (a shared subscription
  of an application) has a client of its own.

Each subscription keeps its own :class:`ConsumerLoop` state (positions,
ends, commits, pause) and sees its topic through a :class:`TopicView` of
the shared client; each poll's records of a subscription go to the reactor
with **one** ``callFromThread``; the reactor side
(:class:`~.consumer.KafkaConsumer`) hands them to the handler.  A rebalance
is split per topic: each subscription positions what it was given and
answers for what is taken from it (commits before the partitions go).

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

**Idle clients** (:mod:`.pacing`): a client that read nothing for a while
stops fetching, then fetches once per ``kafka.idle_fetch_interval_ms``,
until records come; the thread still serves the reactor meanwhile.
The group side of a joining client is :mod:`.joining`.

**Outages.**  A client that cannot be built, or a poll that fails, is
retried every :data:`RETRY_DELAY` seconds; the loop logs the first failure
and the recovery, not each retry.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from twisted.logger import Logger

from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq_plugins.kafka.bridge import ask_reactor
from tbmq_plugins.kafka.drivers import RawRecord, SharedClient, TopicView
from tbmq_plugins.kafka.joining import Joining
from tbmq_plugins.kafka.order import Gaps
from tbmq_plugins.kafka.pacing import POLL_TIMEOUT, Pacer

__all__ = ["BACKLOG_EVERY", "COMMIT_EVERY", "GATHER", "POLL_TIMEOUT", "RETRY_DELAY", "ConsumerLoop",
           "SharedLoop", "TopicView"]

log = Logger(observer=LOG_OBSERVER)

#: Seconds between two attempts while Kafka fails.
RETRY_DELAY = 0.5
#: Seconds between two readings of the backlog (:attr:`ConsumerLoop.backlog`).
BACKLOG_EVERY = 1.0
#: Seconds a joining client waits for more subscriptions before it joins
#: (or changes its topics): those made within it cost one rebalance.
GATHER = 0.2
#: Seconds between two commits of a subscription that do not wait (the
#: latest offsets asked meanwhile go in one; those before partitions go and
#: at a stop are not held back): a commit per record read is a request each.
COMMIT_EVERY = 0.1


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


def _nothing() -> None:
    pass


class _Wanted:
    """The partitions whose end the members do not know yet, as
    ``(topic, partition)``: read when asked, so that those a rebalance
    assigns during a poll are in it after (what a driver's poll reads)."""

    __slots__ = ("_views", "_by_topic")

    def __init__(self, members: dict) -> None:
        self._views = members  # member -> view; the map by topic made when first asked
        self._by_topic: dict | None = None

    def _members(self) -> dict:
        if self._by_topic is None:
            self._by_topic = {view.topic: member for member, view in self._views.items()}
        return self._by_topic

    def __contains__(self, tp: object) -> bool:
        member = self._members().get(tp[0])
        return member is not None and tp[1] in member.wanted

    def __iter__(self):
        return iter([(topic, p) for topic, member in self._members().items()
                     for p in member.wanted])

    def __bool__(self) -> bool:
        return any([member.wanted for member in self._views])


class ConsumerLoop(_Outage):
    """The state of one subscription, driven by the thread of a
    :class:`SharedLoop` (see the module doc) through its public thread-side
    steps; its topic is a :class:`TopicView`.

    :param reactor: the reactor of ``sink``.
    :param sink: the reactor side: ``_assigned(partitions)``,
        ``_batch(records, reached)``, ``_revoke(partitions)`` (asked, its
        result awaited), ``_closed()``; called in the reactor thread.
    :param exclusive: take every partition without joining the group.
    :param from_beginning: start the first assignment at the first offsets.
    :param durable: a new group starts at the first offsets, not at the end.
    :param timeout: seconds a rebalance waits for the reactor at most.
    :param name: the consumer's name in log lines.
    :param contiguous: every offset of the topic is a record (not
        compacted, no transactions): a partition whose fetch skipped
        offsets is read again from the first one missing (:mod:`.order`).
    :param compaction_lag_ms: the topic is compacted with this
        ``min.compaction.lag.ms`` (``int`` ms, > 0): a hole right after a
        record younger than half of it is read again, the others are passed
        (:mod:`.order`); None or 0: not checked (unless ``contiguous``).
    :ivar want_paused: what the reactor asks (``bool``).
    :ivar backlog: records the partitions of this member hold beyond what
        the thread handed to the reactor (high watermarks of the last
        fetches), read every :data:`BACKLOG_EVERY` seconds; ``int``.
    """

    def __init__(self, reactor: Any, sink: Any, *, exclusive: bool, from_beginning: bool,
                 durable: bool, timeout: float, name: str, contiguous: bool = False,
                 compaction_lag_ms: int | None = None) -> None:
        self._reactor = reactor
        self._sink = sink
        self._exclusive = exclusive
        self._from_beginning = from_beginning
        self._durable = durable
        self._timeout = timeout
        self.name = name
        self._lock = threading.Lock()
        self._commits: dict[int, int] = {}
        self._commit_due = 0.0  # the next commit that does not wait, not before
        self._unconfirmed: dict[int, int] = {}  # committed without waiting
        self._seeks: dict[int, int] = {}
        self._want_paused = False
        self.notify: Callable[[], None] = _nothing  # wakes an idle thread
        self.stirred = False  # something to read: a partition given, read again, resumed
        self._stopping = False
        self._client: TopicView | None = None
        self._paused = False  # what the client was last told
        self._failing: str | None = None
        self._first_assignment = True
        # the current assignment (thread side)
        self._next: dict[int, int] = {}  # next offset to hand over
        self._ends: dict[int, int | None] = {}  # None: not fetched yet
        self._at_end: set[int] = set()  # starts at the end, not known yet
        self._skip: dict[int, int] = {}  # records below are skipped
        self._reached: set[int] = set()
        self._want: set[int] = set()  # partitions whose end is not known
        self._revoked: set[int] = set()  # taken away, state not dropped yet
        if contiguous:
            self.gaps: Gaps | None = Gaps(name)
        elif compaction_lag_ms:
            self.gaps = Gaps(name, compaction_lag_ms=compaction_lag_ms)
        else:
            self.gaps = None
        self._refetch: dict[int, int] = {}  # read again from there: the seek failed
        self.backlog = 0
        self._backlog_at = 0.0

    # -- from the reactor (thread-safe) -------------------------------------------------

    @property
    def want_paused(self) -> bool:
        """What the reactor asks: the topic's partitions paused (``bool``)."""
        return self._want_paused

    @want_paused.setter
    def want_paused(self, paused: bool) -> None:
        self._want_paused = paused
        self.notify()

    def commit(self, partition: int, offset: int) -> None:
        """Have ``offset`` committed for ``partition`` before the next poll."""
        with self._lock:
            self._commits[partition] = offset
        self.notify()

    def seek(self, partition: int, offset: int) -> None:
        """Have ``partition`` read again from ``offset`` before the next
        poll (a record there failed); the sink's ``_assigned([partition])``
        follows, as for a new assignment.  Nothing for a partition revoked
        meanwhile."""
        with self._lock:
            self._seeks[partition] = offset
        self.notify()

    def stop(self) -> None:
        """Have the thread commit what was asked, stop reading the topic
        (leaving the group with the last subscription of a joining client),
        then call the sink's ``_closed``."""
        self._stopping = True
        self.notify()

    # -- thread side (a SharedLoop's thread) ---------------------------------------------

    @property
    def stopping(self) -> bool:
        """:meth:`stop` was called (the thread lets the topic go next)."""
        return self._stopping

    @property
    def wanted(self) -> set[int]:
        """Partitions whose end the loop does not know yet."""
        return self._want

    def attach(self, view: "TopicView") -> bool:
        """Read the view's topic: exclusive, take every partition; joining,
        wait for the group's assignment (:meth:`on_assign`).

        :returns: False when Kafka failed (try again later)."""
        self._client = view
        if not self._exclusive:
            return True
        try:
            partitions = view.partitions()
        except Exception as e:
            self._trouble(e)
            return False
        return self._assign(partitions, assign=True)

    def _take_commits(self, unconfirmed: Any = ()) -> dict[int, int]:
        """What the reactor asked to commit, and the offsets of
        ``unconfirmed`` partitions last committed without waiting (an
        asynchronous commit still under way when the group rebalances or
        the member leaves may fail unseen: a partition that started at its
        end and was never read would have no committed offset, and its next
        owner would start past what came meanwhile)."""
        with self._lock:
            offsets, self._commits = self._commits, {}
            for p in unconfirmed:
                o = self._unconfirmed.pop(p, None)
                if o is not None:
                    offsets.setdefault(p, o)
        return offsets

    def _commit(self, client: "TopicView", wait: bool) -> None:
        """Commit what the reactor asked for; what fails without ``wait`` is
        tried again next time, unless newer offsets came meanwhile."""
        offsets = self._take_commits(list(self._unconfirmed) if wait else ())
        if offsets:
            if not wait:
                with self._lock:
                    self._unconfirmed.update(offsets)
            try:
                client.commit(offsets, wait=wait)
            except Exception as e:
                self._trouble(e)
                if not wait:
                    with self._lock:
                        for p, o in offsets.items():
                            self._commits.setdefault(p, o)

    def between_polls(self, client: "TopicView") -> None:
        """Commit (once per :data:`COMMIT_EVERY` seconds at most: the
        latest offsets asked), pause and resume what the reactor asked.
        Nothing asked, nothing is done (not even the lock taken: a member
        idle in a shared client costs each turn little; an offset the
        reactor asks meanwhile is committed at the next turn, as one asked
        just after the lock would be)."""
        if self._commits:
            now = time.monotonic()
            if now >= self._commit_due:
                self._commit_due = now + COMMIT_EVERY
                self._commit(client, wait=False)
        if self._seeks:
            self._seek(client)
        paused = self._want_paused
        if paused != self._paused and self._next:
            (client.pause if paused else client.resume)(list(self._next))
            self.stirred = self.stirred or not paused
        self._paused = paused

    @property
    def paused(self) -> bool:
        """The partitions are paused for the reactor (back-pressure)."""
        return self._paused

    def positions(self) -> dict[int, int]:
        """:returns: partition → the next offset to hand over, for the
        partitions held (not revoked)."""
        with self._lock:
            revoked = set(self._revoked)
        return {p: o for p, o in self._next.items() if p not in revoked}

    def _seek(self, client: "TopicView") -> None:
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

    def poll_once(self, client: "TopicView") -> None:
        """Take what the shared poll read for the topic; its records and
        reached partitions to the reactor in one call.  A poll that read
        nothing for the topic, with nothing revoked and no seek to retry,
        only checks the backlog when due: a partition is reached only when
        records move it or its end becomes known, so nothing else could
        change (most members of a shared client read nothing in a turn)."""
        records, ends = client.poll()
        if not records and not ends and not self._revoked and not self._refetch:
            self._backlog_due(client)
            return
        gone = self._drop_revoked()
        if gone:
            records = [r for r in records if r.partition not in gone]
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
        if self.gaps is not None:
            records = self._in_order(client, records)
        nexts = self._next
        for r in records:
            nexts[r.partition] = r.offset + 1
        reached = [p for p, end in self._ends.items()
                   if end is not None and p not in self._reached and nexts[p] >= end]
        if reached:
            self._reached.update(reached)
            self._reactor.callFromThread(self._sink._batch, records, reached,
                                         {p: nexts[p] for p in reached})
        elif records:
            self._reactor.callFromThread(self._sink._batch, records, reached)
        self._backlog_due(client)

    def quiet_turn(self, client: "TopicView", now: float) -> None:
        """The shared poll read nothing for the topic (most members of a
        shared client, most turns): as :meth:`poll_once` with nothing read
        (its view is not even asked, ``now`` is the turn's
        :func:`time.monotonic`), unless partitions were revoked or a seek
        waits to be tried again."""
        if self._revoked or self._refetch:
            self.poll_once(client)
        elif now >= self._backlog_at:
            self._backlog_at = now + BACKLOG_EVERY
            self._read_backlog(client)

    def _backlog_due(self, client: "TopicView") -> None:
        """Read the backlog when :data:`BACKLOG_EVERY` seconds passed."""
        now = time.monotonic()
        if now >= self._backlog_at:
            self._backlog_at = now + BACKLOG_EVERY
            self._read_backlog(client)

    def _in_order(self, client: "TopicView", records: list) -> list:
        """The records that follow what was handed over; a partition whose
        records skip offsets is read again from the first one missing
        (:class:`~.order.Gaps`), its records from there dropped."""
        retry = self._refetch
        if retry:  # the client is still past the hole
            records = [r for r in records if r.partition not in retry]
        records, again = self.gaps.filter(records, self._next)
        if again or retry:
            seeks = {**retry, **again}
            try:
                client.seek(seeks)
                if self._paused:  # a seek resumes the partition
                    client.pause(list(seeks))
            except Exception as e:
                self._trouble(e)
                self._refetch = seeks
            else:
                self._refetch = {}
        return records

    def _read_backlog(self, client: "TopicView") -> None:
        nexts = self._next
        try:
            ends = client.high_watermarks(list(nexts))
        except Exception:  # noqa: BLE001 - a figure for the metrics, read again later
            return
        self.backlog = sum(max(0, end - nexts[p]) for p, end in ends.items() if p in nexts)

    # -- assignments -----------------------------------------------------------------------

    def on_assign(self, partitions: list[int]) -> None:
        """The group gave ``partitions`` (in the thread, during a poll).
        While Kafka fails, positioning is tried again for ``timeout``
        seconds; then the client reads them from the committed offsets (the
        first ones without), which never skips a record."""
        deadline = time.monotonic() + self._timeout
        while not self._assign(partitions, assign=False):
            if self._stopping or time.monotonic() > deadline:
                self._client.resume(partitions)
                self._track(partitions, {p: 0 for p in partitions}, set(), known=False)
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
        if at_end and not self._exclusive:  # a joined group's first start: once in its life
            log.info("Kafka consumer {name}: partitions {at_end} have no committed offset: "
                     "starting at their end", name=self.name, at_end=at_end)
        self._track(partitions, starts, set(at_end))
        return True

    def _track(self, partitions: list[int], starts: dict[int, int], at_end: set[int],
               known: bool = True) -> None:
        """Read ``partitions`` from ``starts``; tell the reactor those it may
        rely on (not ``at_end``, all unknown without ``known``)."""
        with self._lock:  # given again within the same poll
            self._revoked.difference_update(partitions)
        self._forget_gaps(partitions)
        for p in partitions:
            self._next[p] = starts[p]
            self._ends[p] = None
            self._want.add(p)
            self._skip.pop(p, None)
            self._reached.discard(p)
        self._at_end |= at_end
        self.stirred = True
        if self._paused and partitions:
            self._client.pause(partitions)
        self._reactor.callFromThread(
            self._sink._assigned, partitions,
            {p: starts[p] for p in partitions if p not in at_end} if known else None)

    def on_revoke(self, partitions: list[int]) -> dict[int, int]:
        """The group takes ``partitions`` back (during a poll or the close;
        possibly in the client's own thread, so only thread-safe work here):
        the reactor stops handing them and queues what it finished.

        :returns: the offsets to commit before they go (the driver does).
        """
        if partitions:
            log.debug("Kafka consumer {name}: partitions {partitions} revoked",
                      name=self.name, partitions=partitions)
            if not self._stopping:
                ask_reactor(self._reactor, self._sink._revoke, partitions,
                            timeout=self._timeout)
            with self._lock:
                self._revoked.update(partitions)
        return self._take_commits(partitions)

    def _drop_revoked(self) -> set[int]:
        """Forget the partitions revoked since the last call.

        :returns: them."""
        with self._lock:
            gone, self._revoked = self._revoked, set()
        self._forget_gaps(gone)
        for p in gone:
            self._next.pop(p, None)
            self._ends.pop(p, None)
            self._want.discard(p)
            self._skip.pop(p, None)
            self._at_end.discard(p)
            self._reached.discard(p)
        return gone

    def _forget_gaps(self, partitions: Any) -> None:
        if self.gaps is not None:
            self.gaps.forget(partitions)
            for p in partitions:
                self._refetch.pop(p, None)

    def finish(self, client: "TopicView | None") -> None:
        """Commit what was asked, waiting."""
        if client is not None:
            self._commit(client, wait=True)

    def closed(self) -> None:
        """Tell the reactor that the subscription let its topic go."""
        self._reactor.callFromThread(self._sink._closed)

    def close_client(self, client: "TopicView | None") -> None:
        """Commit what was asked (waiting), let the topic go and tell the
        reactor."""
        try:
            if client is not None:
                self.finish(client)
                try:
                    client.close()
                except Exception as e:
                    self._trouble(e)
        finally:
            self.closed()


class SharedLoop(Joining, _Outage):
    """The thread and the client of several subscriptions of one group (see
    the module doc): every turn it commits, pauses and resumes what each
    subscription asked, polls the one client, and lets each subscription's
    :class:`ConsumerLoop` take its topic's records.  When the last one is
    gone the client is closed (a joining one leaves the group) and the
    thread ends (:attr:`dead`).

    :param reactor: the reactor of the subscriptions' sinks.
    :param make_client: ``make_client() -> SharedClient`` (may block).
    :param joining: join the group over the topics; else every subscription
        is exclusive (its partitions assigned directly).
    :param max_records: most records per poll.
    :param timeout: seconds a rebalance waits for the reactor at most.
    :param grace: seconds a joining client that leaves keeps polling to
        notice a rebalance under way (two heartbeat intervals).
    :param stuck: seconds without an assignment after which a joining
        client joins its group again as a new member.
    :param name: the thread's name.
    :param idle_interval: seconds between two fetches of an idle client
        (:mod:`.pacing`); 0: the client fetches all the time.
    :param fetch_wait: the client's fetch wait in seconds (an idle
        client's single fetch is given that long).
    :ivar dead: True once the thread ended; :meth:`add` refuses then.
    :ivar pacer: the :class:`~.pacing.Pacer`, or None without idle mode.
    """

    def __init__(self, reactor: Any, make_client: Callable[[], SharedClient], *,
                 joining: bool = False, max_records: int, timeout: float = 10.0,
                 grace: float = 0.0, stuck: float = 60.0, name: str,
                 idle_interval: float = 0.0, fetch_wait: float = 0.0) -> None:
        self._reactor = reactor
        self._make_client = make_client
        self._joining = joining
        self._max_records = max_records
        self._timeout = timeout
        self._grace = grace
        self._stuck = stuck
        self.name = name
        self._lock = threading.Lock()
        self._adding: list[tuple[ConsumerLoop, str]] = []
        self._added_at = 0.0
        self._expected: dict[ConsumerLoop, float] = {}  # joining: added once its topic exists
        self._waiting: list[tuple[ConsumerLoop, str]] = []  # thread side: not attached yet
        self._members: dict[ConsumerLoop, TopicView] = {}  # thread side
        self._topics: dict[str, ConsumerLoop] = {}  # joining: the member of each topic
        self._subscribed: list[str] = []  # joining: the client's subscription
        self._assignment: set[tuple] = set()  # joining: what the group gave the client
        self._rebalancing = False  # partitions revoked (or none yet), none assigned since
        self._rebalance_deadline = 0.0
        self._closing = False
        self._wake = threading.Event()
        self.pacer = Pacer(idle_interval, fetch_wait, self._wake) if idle_interval > 0 else None
        self._thread: threading.Thread | None = None
        self._failing: str | None = None
        self.dead = False

    @property
    def finished(self) -> bool:
        """True once the thread ended and closed its client (or never ran)."""
        return self.dead and (self._thread is None or not self._thread.is_alive())

    def expect(self, member: ConsumerLoop) -> None:
        """``member`` will be added once its topic exists (thread-safe): a
        joining client waits for it, ``timeout`` seconds at most, before it
        joins, so that the subscriptions made together join together."""
        with self._lock:
            self._expected[member] = time.monotonic()

    def forget(self, member: ConsumerLoop) -> None:
        """``member`` will not be added after all (stopped before)."""
        with self._lock:
            self._expected.pop(member, None)
        self._wake.set()

    def add(self, member: ConsumerLoop, topic: str) -> bool:
        """Have the thread read ``topic`` for ``member`` (thread-safe).

        :returns: False when the thread has ended (make another loop)."""
        with self._lock:
            self._expected.pop(member, None)
            if self.dead:
                return False
            if self.pacer is not None:
                member.notify = self.pacer.poke
            self._adding.append((member, topic))
            self._added_at = time.monotonic()
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
                    gathered = self._added_at + GATHER
                    if self._expected:
                        gathered = max(gathered, min(self._expected.values()) + self._timeout)
                self._wake.clear()
                if client is None:
                    client = self._open()
                    if client is None:
                        continue
                client = self._detach(client)
                if client is None:
                    continue
                now = time.monotonic()
                if self._joining and self._waiting and now < gathered:
                    self._wake.wait(gathered - now)  # more may come: one join for all
                    continue
                self._attach(client)
                if self._joining:
                    client = self._keep_joined(client)
                    if client is None:
                        continue
                if self._members:
                    self._turn(client)
                else:
                    self._wake.wait(RETRY_DELAY if self._waiting else POLL_TIMEOUT)
        finally:
            for member, view in list(self._members.items()):
                member.close_client(view)
            self._members.clear()
            self._topics.clear()
            if client is not None:
                self._close(client)

    def _open(self) -> SharedClient | None:
        """A client, or None (retried later) while Kafka fails; members that
        stop meanwhile are closed.  The members of a client closed before
        (a joining client that joins again) read through the new one."""
        try:
            client = self._make_client()
        except Exception as e:
            self._trouble(e)
            stopped = [m for m, _topic in self._waiting if m.stopping]
            self._waiting = [w for w in self._waiting if not w[0].stopping]
            for member in [m for m in self._members if m.stopping]:
                self._topics.pop(self._members.pop(member).topic, None)
                stopped.append(member)
            for member in stopped:
                member.close_client(None)
            self._wake.wait(RETRY_DELAY)
            return None
        self._recovered()
        self._subscribed = []
        for member, view in self._members.items():
            view = self._members[member] = TopicView(client, view.topic)
            member.attach(view)
        return client

    def _close(self, client: SharedClient) -> None:
        self._closing = True
        try:
            client.close()
        except Exception as e:
            self._trouble(e)
        self._closing = False
        self._rebalancing = False
        with self._lock:
            self._assignment.clear()

    def _attach(self, client: SharedClient) -> None:
        still = []
        for member, topic in self._waiting:
            if member.stopping:
                member.close_client(None)
                continue
            view = TopicView(client, topic)
            if member.attach(view):
                self._members[member] = view
                if self._joining:
                    self._topics[topic] = member
                    with self._lock:  # the client holds some already: they are its
                        held = sorted(p for t, p in self._assignment if t == topic)
                    if held:
                        member.on_assign(held)
            else:
                still.append((member, topic))
        self._waiting = still

    def _detach(self, client: SharedClient) -> SharedClient | None:
        """Let the topics of stopped members go.  :returns: the client, or
        None when the last member of a joining client left the group."""
        for member in [m for m in self._members if m.stopping]:
            view = self._members.pop(member)
            if not self._joining:
                member.close_client(view)
                continue
            del self._topics[view.topic]
            if self._members:
                member.close_client(view)  # the topic leaves the subscription next
                continue
            member.finish(view)  # the last one: leave the group, then say so
            self._leave(client)
            member.closed()
            return None
        return client

    # -- polling ---------------------------------------------------------------------------

    def nudge(self) -> None:
        """Records are expected soon (thread-safe): an idle client fetches
        again now (:mod:`.pacing`)."""
        if self.pacer is not None:
            self.pacer.nudge()

    def _turn(self, client: SharedClient, fast: bool = False) -> None:
        members = self._members
        stirred = fast
        for member, view in members.items():
            member.between_polls(view)
            if member.stirred:
                member.stirred, stirred = False, True
        wanted = _Wanted(members)
        timeout: float | None = POLL_TIMEOUT
        if self.pacer is not None:
            timeout = self.pacer.before_poll(client, members,
                                             stirred or self._rebalancing or bool(wanted))
            if timeout is None:
                return
        began = time.monotonic()
        try:
            records, ends = client.poll(timeout, self._max_records, wanted)
        except Exception as e:
            self._trouble(e)
            time.sleep(RETRY_DELAY)
            return
        error = client.take_error()
        if error is not None:
            self._trouble(error)
        elif records or ends:
            self._recovered()
        if self.pacer is not None:
            if records:
                self.pacer.read()
            else:
                self.pacer.waited(time.monotonic() - began, timeout)
        by_topic: dict = {}
        for tp, end in ends.items():  # (usually none)
            found = by_topic.get(tp[0])
            if found is None:
                found = by_topic[tp[0]] = {}
            found[tp[1]] = end
        now = time.monotonic()
        for member, view in list(members.items()):
            topic = view.topic
            read = records.get(topic) if records else None
            reached = by_topic.get(topic) if by_topic else None
            if read is None and reached is None:
                member.quiet_turn(view, now)  # nothing read for it: nothing handed
                continue
            view.records = [] if read is None else read
            view.ends = {} if reached is None else reached
            member.poll_once(view)
