"""The sources a congested session holds back (see :mod:`tbmq.broker.outbox`
for the rules): a part of its :class:`~tbmq.broker.outbox.Outbox`, made at
its first hold (most sessions never hold anyone).
"""

from __future__ import annotations

from tbmq.broker.outbound import HoldCredit

__all__ = ["FREE_HOLD_SHARE", "HOLD_WINDOW_FACTOR", "NO_SOURCES", "SourceHolds"]

#: a hold credit refills over this many times its capacity
HOLD_WINDOW_FACTOR = 10.0
#: holds shorter than this share of the credit cost nothing: a subscriber
#: that is only the bottleneck drains quickly, again and again, and holds its
#: publishers to its pace for as long as it reads
FREE_HOLD_SHARE = 0.1
#: no sources held (a set is made at the next hold)
NO_SOURCES: frozenset = frozenset()


class SourceHolds:
    """What one outbox holds: the sources (bus consumers, each registered
    with the node's :class:`~tbmq.broker.outbound.Holds` under the outbox),
    since when, the timer that ends the hold when the credit runs out, and
    the :class:`~tbmq.broker.outbound.HoldCredit`
    (``mqtt.outbound_pause_timeout`` seconds, refilled over
    :data:`HOLD_WINDOW_FACTOR` times that).

    :param outbox: the :class:`~tbmq.broker.outbox.Outbox`.
    :param now: seconds since the epoch (the credit starts full).
    :ivar holding: the sources held now.
    :ivar since: when the current hold began (seconds), or None.
    """

    __slots__ = ("outbox", "holding", "since", "timer", "credit")

    def __init__(self, outbox, now: float) -> None:
        self.outbox = outbox
        self.holding: set | frozenset = NO_SOURCES
        self.since: float | None = None
        self.timer = None
        timeout = outbox.ctx.mqtt.outbound_pause_timeout
        self.credit = HoldCredit(timeout, timeout * HOLD_WINDOW_FACTOR, now)

    def add(self, source) -> None:
        """Hold ``source`` (paused while someone holds it), with no timer."""
        holding = self.holding
        if type(holding) is not set:
            holding = self.holding = set()
        holding.add(source)
        self.outbox.ctx.holds.hold(source, self.outbox)

    def hold(self, source, now: float) -> None:
        """Hold ``source`` until the outbox drains or the credit runs out
        (then :meth:`~tbmq.broker.outbox.Outbox.became_slow`); a short hold
        is always allowed: a subscriber that is merely the bottleneck drains
        to its low-water mark quickly and often."""
        if source not in self.holding:
            self.add(source)
        if self.timer is None:
            credit = self.credit
            left = max(credit.available(now), credit.capacity * FREE_HOLD_SHARE)
            self.since = now
            self.timer = self.outbox.ctx.clock.callLater(left, self._expired)

    def _expired(self) -> None:
        self.timer = None
        self.outbox.became_slow()

    def release(self, now: float) -> None:
        """Let every source go; a hold longer than the free share spends
        the credit."""
        timer = self.timer
        if timer is not None:
            self.timer = None
            if timer.active():
                timer.cancel()
        if self.since is not None:
            held = now - self.since
            if held > self.credit.capacity * FREE_HOLD_SHARE:
                self.credit.spend(held, now)  # only long holds use the credit up
            self.since = None
        if self.holding:
            holding, self.holding = self.holding, NO_SOURCES
            self.outbox.ctx.holds.release(holding, self.outbox)
