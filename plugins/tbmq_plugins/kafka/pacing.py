"""When a consumer thread's client fetches: at once while records flow,
rarely once it has read nothing for a while (the *idle mode*).

A consumer client fetches all the time: each fetch waits at most
``kafka.fetch_max_wait_ms`` for records, then the next one goes.  A short
wait is what makes a hop between nodes fast on a broker that looks for
records only now and then while a fetch waits (Tansu: at its start, half, three
quarters... of it, so each hop waits for the next look); but
a client that fetches every few milliseconds costs its node and the
brokers CPU even when nothing flows.  So a :class:`Pacer` keeps the client
of one :class:`~.loop.SharedLoop` in one of two modes:

* **fast**: the client fetches continuously with the short wait, as long as
  its polls since the last record waited less than :data:`IDLE_AFTER`
  seconds, a partition was given, read again, resumed after back-pressure,
  or its end is not known yet, or the group rebalances.  A client that has
  read records for a while keeps fetching longer after the last one
  (:data:`FLOW_SHARE` of that while, :data:`FLOW_KEEP` at most): a gap in
  a steady flow (a publisher or a node that stalls for a moment) does not
  send it idle, where the flow's next record would wait up to the idle
  interval.  The quiet time counts what the polls waited, not the clock: a
  thread that did not run for a while (a loaded machine) has not seen its
  client quiet;
* **idle**: after that the client
  stops fetching, and once per ``kafka.idle_fetch_interval_ms`` looks for
  records: a client that fetches in the background (librdkafka) has its
  partitions paused, and asks the brokers for their latest offsets (one
  ListOffsets request per broker, much cheaper than a fetch: no pause and
  resume of every partition either); a client that fetches only inside its
  poll (kafka-python) is not polled, then polled once (one fetch wait and
  :data:`PROBE_MARGIN`).  A record brings it back to the fast mode at once.

While idle the thread still serves what the reactor asks (commits, seeks,
pause and resume, stop: they wake it, :meth:`Pacer.poke`) and, for a
background-fetching client, its group's callbacks (a poll that fetches
nothing, after each wait).  A partition the reactor paused for
back-pressure stays paused when the idle mode ends.  A record produced by
the node wakes its idle clients (:meth:`Pacer.nudge`): a node that writes
expects records soon (an answer to a request, a delivery of its own
message).  It keeps a fast client fast too: a node that writes all the
time would otherwise have each client that reads little go idle and be
woken again every :data:`IDLE_AFTER`, a pause and a resume of every
partition each time (librdkafka's wait for its threads, the GIL held:
the reactor stands still meanwhile) for the same fetches.

The cost of an idle client is one small request per interval instead of
one fetch per fetch wait (two idle nodes on Tansu: 27 requests/s each
instead of 97, Tansu at 2-3 % of a core instead of 17-21 %); the price is
the first record after a quiet spell, which waits up to the interval.  A
flow that stops costs :data:`FLOW_KEEP` seconds of fetching at most once
it ends; lone records (the nodes' heartbeats on an idle cluster) keep a
client fast for :data:`IDLE_AFTER` only, so an idle node costs what it
did.  A broker that answers a long poll as soon as records
arrive (Apache Kafka) needs none of this: there a long fetch wait costs no
latency.
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["FLOW_KEEP", "FLOW_SHARE", "IDLE_AFTER", "NEWS_WAIT", "POLL_TIMEOUT", "PROBE_MARGIN",
           "Pacer"]

#: Seconds one poll waits for records at most (commands wait that long at most).
POLL_TIMEOUT = 0.05
#: Seconds of polls without a record after which a client goes idle.
IDLE_AFTER = 0.05
#: A client that has read records for a while stays fast this share of
#: that while after its last record (:data:`IDLE_AFTER` at least) ...
FLOW_SHARE = 0.25
#: ... and this many seconds at most.
FLOW_KEEP = 1.0
#: Seconds an idle client that saw offsets past its positions fetches at
#: most until records come (a fetcher slow to notice a resume, or busy).
NEWS_WAIT = 1.0
#: Seconds an idle client's fetch is given beyond the fetch wait (its round trip).
PROBE_MARGIN = 0.005


class Pacer:
    """The fetching mode of one :class:`~.loop.SharedLoop`'s client (see the
    module doc).  Its thread calls :meth:`before_poll` and :meth:`read`;
    :meth:`nudge` and :meth:`poke` are thread-safe.

    :param interval: seconds between two fetches while idle, > 0.
    :param fetch_wait: the client's fetch wait (``kafka.fetch_max_wait_ms``
        in seconds): an idle client's single fetch is given that and
        :data:`PROBE_MARGIN`.
    :param wake: the thread's :class:`threading.Event`, set to end a wait.
    :param idle_after: seconds without a record before the idle mode.
    :ivar idle: the client does not fetch (``bool``).
    :ivar idle_fetches: looks for records made while idle so far (``int``).
    """

    def __init__(self, interval: float, fetch_wait: float, wake: threading.Event,
                 idle_after: float = IDLE_AFTER) -> None:
        self.interval = interval
        self.idle_after = idle_after
        self.probe = fetch_wait + PROBE_MARGIN
        self._wake = wake
        self.idle = False
        self.idle_fetches = 0
        self._nudged = False
        self._allowed = idle_after  # seconds of polls without a record before the idle mode
        self._quiet = 0.0  # seconds the polls since the last record waited for nothing
        self._busy_since: float | None = None  # the flow of records began then
        self._due = 0.0  # idle: the next fetch

    # -- any thread ------------------------------------------------------------------------

    def nudge(self) -> None:
        """Records are expected soon: an idle client fetches again now, a
        fast one stays fast for :attr:`idle_after` more."""
        self._nudged = True
        if self.idle:
            self._wake.set()

    def poke(self) -> None:
        """The reactor asked something of the thread: an idle thread serves
        it now (and stays idle)."""
        if self.idle:
            self._wake.set()

    # -- the thread ------------------------------------------------------------------------

    def read(self) -> None:
        """The last poll read records: fast for :attr:`idle_after` more of
        polls without records, and longer the longer records have been
        flowing (:data:`FLOW_SHARE` of that time, :data:`FLOW_KEEP` at most):
        a steady flow is not left for a gap in it."""
        now = time.monotonic()
        if self._busy_since is None:
            self._busy_since = now
        # what a look found (NEWS_WAIT) ends here: it came
        self._allowed = min(FLOW_KEEP, max(self.idle_after, (now - self._busy_since) * FLOW_SHARE))
        self._quiet = 0.0

    def waited(self, seconds: float, timeout: float) -> None:
        """A poll of ``timeout`` seconds read nothing in ``seconds``: the
        quiet time grows by that, ``timeout`` at most (a thread that did
        not run meanwhile has not seen the client quiet)."""
        self._quiet += min(seconds, timeout)

    def _keep(self, seconds: float) -> None:
        """Fast for at least ``seconds`` more of polls without records."""
        self._allowed = max(self._allowed - self._quiet, seconds)
        self._quiet = 0.0

    def before_poll(self, client: Any, members: dict, active: bool) -> float | None:
        """Decide the next poll, stopping or resuming the fetches of the
        members' partitions when the mode changes; may wait (idle).

        :param client: the :class:`~.drivers.SharedClient`; its
            ``fetches_in_background`` says how it stops fetching.
        :param members: :class:`~.loop.ConsumerLoop` → its
            :class:`~.drivers.TopicView`.
        :param active: something to read now (a partition given, read
            again or resumed, an end not known, a rebalance).
        :returns: the poll's timeout in seconds, or None: no poll this turn
            (idle, and a poll of this client would fetch).
        """
        now = time.monotonic()
        if active or self._nudged:
            self._nudged = False
            self._keep(self.idle_after)
            if self.idle:
                self._fast(client, members)
            return _poll_timeout(self._allowed)
        background = client.fetches_in_background
        if self.idle:
            left = self._due - now
            if left > 0:
                self._wake.wait(left)
                return 0.0 if background else None
            self.idle_fetches += 1
            if not background:  # one poll: one fetch
                self.idle = False
                self._allowed, self._quiet = self.probe, 0.0
                return _poll_timeout(self.probe)
            if not self._news(client, members):
                self._due = time.monotonic() + self.interval
                return 0.0
            self._allowed, self._quiet = NEWS_WAIT, 0.0  # records are there: fetch until they come
            self._fast(client, members)
            return _poll_timeout(NEWS_WAIT)
        if self._quiet >= self._allowed:
            self.idle = True
            self._busy_since = None
            self._due = now + self.interval
            if background:
                client.rest(_partitions(members, True))
            return 0.0 if background else None
        return _poll_timeout(self._allowed - self._quiet)

    def _news(self, client: Any, members: dict) -> bool:
        """Whether a partition not paused for the reactor has records past
        its position (one request per broker, no fetch)."""
        positions = {(view.topic, p): o for member, view in members.items()
                     if not member.paused for p, o in member.positions().items()}
        if not positions:
            return False
        try:
            latest = client.latest_offsets(list(positions))
        except Exception:  # noqa: BLE001 - no answer: fetch, which tells more
            return True
        return any(latest.get(tp, -1) > o for tp, o in positions.items())

    def _fast(self, client: Any, members: dict) -> None:
        self.idle = False
        if client.fetches_in_background:
            client.wake(_partitions(members, False))


def _partitions(members: dict, everything: bool) -> list:
    """The members' partitions, as ``(topic, partition)``; not
    ``everything``: without those the reactor has paused (back-pressure)."""
    return [(view.topic, p) for member, view in members.items()
            if everything or not member.paused for p in member.positions()]


def _poll_timeout(left: float) -> float:
    return min(POLL_TIMEOUT, max(0.001, left))
