"""The batches of the in-process bus whose result is a
:class:`~tbmq.cluster.completion.Progress` (a persistent APPLICATION
client's, :meth:`tbmq.broker.outbox.Outbox.deliver_app_batch`): their
leading runs settled once per reactor turn, not once per acknowledgement
(``docs/bus.md``, "Handlers and commits").

A client acknowledges its messages one by one (PUBACK, PUBCOMP), so a batch's
leading run grows by one record at a time.  Settling each growth at once
(the commit of the group, its topic log write, the release of what every
group passed) costs as much per record as the delivery itself; settling
what grew during a turn at the end of it commits the same offsets, one turn
later at most.  A member that leaves, and the bus that stops, settle what
grew first, so the next member (a reconnect, a restart) starts exactly at
the first record not finished.
"""

from __future__ import annotations

from typing import Callable

from tbmq.cluster.completion import Progress

__all__ = ["ProgressRuns"]


class _Run:
    """One batch handed with a Progress: ``offsets`` of partition ``p``,
    the first ``settled`` of them settled (no reference to the Progress,
    which refers to it: no cycle to collect)."""

    __slots__ = ("args", "offsets", "settled")

    def __init__(self, args: tuple, offsets: list) -> None:
        self.args = args  # (member, state, p, cursor)
        self.offsets = offsets
        self.settled = 0


class ProgressRuns:
    """The batches whose Progress grew since their last settle.

    :param clock: ``callLater(0, f)`` for the settle at the end of the turn.
    :param settle: ``settle(None, member, state, p, cursor, offsets,
        True)``: the records ``offsets`` (a slice of one batch, in order)
        finished with success (the in-process bus's ``_settled_batch``).
        Reactor thread only.
    """

    __slots__ = ("clock", "settle", "_grown", "_call")

    def __init__(self, clock, settle: Callable[..., None]) -> None:
        self.clock = clock
        self.settle = settle
        self._grown: list[tuple] = []  # (progress, run): told once until taken
        self._call = None

    def track(self, progress: Progress, member, state, p: int, cursor, offsets: list) -> None:
        """Settle the leading run of ``progress`` (whose records are
        ``offsets``, in order) as it grows, once per turn: the Progress
        tells at its first growth after each settle
        (:meth:`~tbmq.cluster.completion.Progress.watch`), not at each
        acknowledgement."""
        progress.watch(self._grew, _Run((member, state, p, cursor), offsets))

    def _grew(self, progress: Progress, run: _Run) -> None:
        self._grown.append((progress, run))
        if self._call is None:
            self._call = self.clock.callLater(0, self.settle_now)

    def settle_now(self) -> None:
        """Settle every leading run that grew (before a member leaves, the
        bus stops, and at the end of each turn where one grew)."""
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()
        while self._grown:
            grown, self._grown = self._grown, []
            for progress, run in grown:
                start, end = run.settled, progress.take()
                if end > start:
                    run.settled = end
                    self.settle(None, *run.args, run.offsets[start:end], True)
