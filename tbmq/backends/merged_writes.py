"""The base of a write operation that merges the calls a store accepts
while its database is busy into one operation of the next transaction:
the SQLite stores' (:meth:`tbmq.backends.sqlite_view.RunnerView._merge`)
and the PostgreSQL device store's.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.python.failure import Failure

__all__ = ["MergedWrites"]


class MergedWrites:
    """Base of an operation that merges the writes a store accepts while
    the database is busy into one operation of the next batch
    (:meth:`tbmq.backends.sqlite_view.RunnerView._merge`).  Once the store
    hands its batch to the database it is *sealed*, and later writes open a
    new one.

    :ivar waiters: ``(Deferred, tag)`` of the merged calls, fired together
        after the COMMIT; the tag is the store's (see :meth:`results`).
    """

    __slots__ = ("waiters", "submitted", "sealed")

    def __init__(self) -> None:
        self.waiters: list[tuple[defer.Deferred, Any]] = []
        self.submitted = False
        self.sealed = False

    def seal(self) -> None:
        """Its batch is handed to the thread: no more merges."""
        self.sealed = True

    def results(self, outcome: Any, tags: list) -> list:
        """:param outcome: what the operation returned.
        :param tags: the merged calls' tags, in order.
        :returns: each merged call's result (None by default)."""
        return [None] * len(tags)

    def done(self, outcome: Any) -> None:
        """In the reactor thread: fire every merged call's Deferred with its
        result or the failure.  Nothing merges into it any more (it is done
        even when it never ran: the file failed to open)."""
        self.sealed = True
        waiters, self.waiters = self.waiters, []
        if isinstance(outcome, Failure):
            for d, _ in waiters:
                d.errback(outcome)
            return
        for (d, _), value in zip(waiters, self.results(outcome, [t for _, t in waiters])):
            d.callback(value)
