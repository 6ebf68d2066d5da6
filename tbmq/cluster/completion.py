"""A light completion of several publishes, for the hot path of a cluster
(``docs/bus.md``, "Handlers and commits").

A bus reports the outcome of a publish to a ``done`` callable
(:meth:`tbmq.interfaces.IMessageBus.publish`), without a Deferred per
message.  A consumer's handler whose record caused several publishes (the
router of ``tbmq.msg.all`` sending deliveries to downlink and persisted
topics) returns a :class:`Completion` of them instead of a Deferred: the
record is committed once every publish was acknowledged, and left
uncommitted (read again) when one failed.  The consumers of every bus take a
handler result of None, a Deferred or a :class:`Completion`.

Usage::

    pending = Completion()
    bus.publish(topic, key, value, (), pending.part())
    bus.publish(other, key, value, (), pending.part())
    pending.then(callback, *args)  # callback(None or Failure, *args), once
"""

from __future__ import annotations

from itertools import groupby
from typing import Any, Callable

from twisted.internet import defer
from twisted.python.failure import Failure

__all__ = ["Completion", "Progress", "deferred_done", "finished_runs", "publish_each"]


def deferred_done(start: Callable[[Callable[[Any], None]], Any]) -> defer.Deferred:
    """A Deferred for an operation that reports to a ``done`` callable (a
    bus publish, :meth:`tbmq.interfaces.IMessageBus.publish`): for callers
    that want one.

    :param start: ``start(done)`` begins the operation; ``done(None |
        Failure)`` is called exactly once, maybe during the call.
    :returns: a Deferred that fires with None, or fails with the
        :class:`~twisted.python.failure.Failure`, as ``done`` is called.
    """
    d = defer.Deferred()
    start(d.callback)  # a Failure: errback
    return d


class Completion:
    """The outcome of a number of parts (publishes), each reported once to
    the ``done`` callable that :meth:`part` gave for it.

    It is **complete** once every part is done with success, or as soon as
    one fails (the first failure wins; the parts still open are then
    ignored).  Parts are taken before :meth:`then` is called; a part may be
    done at once (during the publish that takes it), so a completion may
    already be complete when it is handed over.  Reactor thread only.

    :ivar failure: the first :class:`~twisted.python.failure.Failure` a part
        reported, or None.
    """

    __slots__ = ("_open", "failure", "_callback", "_args", "_fired")

    def __init__(self) -> None:
        self._open = 0
        self.failure: Failure | None = None
        self._callback: Callable | None = None
        self._args: tuple = ()
        self._fired = False

    def part(self) -> Callable[[Failure | None], None]:
        """One more part.

        :returns: its ``done``: a callable to call exactly once, with None
            when the part succeeded or a :class:`~twisted.python.failure.Failure`
            when it failed (the ``done`` of
            :meth:`tbmq.interfaces.IMessageBus.publish`).
        """
        self._open += 1
        return self._done

    def parts(self, n: int) -> Callable[[Failure | None], None]:
        """``n`` more parts (``n`` >= 0) with one ``done``, called once for
        each of them (as :meth:`part` each, in one call: a batch's
        deliveries).

        :returns: the ``done`` to call ``n`` times."""
        self._open += n
        return self._done

    def _done(self, failure: Failure | None = None) -> None:
        self._open -= 1
        if failure is not None:
            if self.failure is not None:
                return  # the first failure decided
            self.failure = failure
        elif self._open or self.failure is not None:
            return
        if self._callback is not None and not self._fired:
            self._fire()

    @property
    def complete(self) -> bool:
        """True once every part is done, or one failed."""
        return self.failure is not None or self._open == 0

    @property
    def succeeded(self) -> bool:
        """True once every part is done with success."""
        return self._open == 0 and self.failure is None

    def then(self, callback: Callable[..., Any], *args: Any) -> None:
        """Register the one callback: ``callback(failure, *args)`` is called
        exactly once, with None once every part succeeded or with the first
        :class:`~twisted.python.failure.Failure`; at once when the
        completion is complete already.  Every part must have been taken
        (:meth:`part`) before.

        :raises RuntimeError: when a callback was registered already.
        """
        if self._callback is not None:
            raise RuntimeError("a Completion has one callback")
        self._callback = callback
        self._args = args
        if self.failure is not None or self._open == 0:
            self._fire()

    def _fire(self) -> None:
        self._fired = True
        callback, args = self._callback, self._args
        self._args = ()
        callback(self.failure, *args)

    def __repr__(self) -> str:
        state = ("failed" if self.failure is not None
                 else "succeeded" if self._open == 0 else f"{self._open} open")
        return f"<Completion {state}>"


class Progress:
    """The outcome of a batch whose records finish one by one, in any order
    (a persistent APPLICATION client acknowledges each message: PUBACK, or
    PUBCOMP for QoS 2), for a consumer whose commit must name the first
    record not finished (``docs/bus.md``, "Handlers and commits"): it
    reports each growth of the **leading run**, the records ``0 ..
    leading - 1`` all finished.  A batch handler returns it in place of a
    :class:`Completion`; it never fails (a record that never finishes, its
    connection gone, leaves the rest uncommitted).  Reactor thread only.

    A consumer that settles what grew once per reactor turn
    (:class:`tbmq.backends.inprocess_progress.ProgressRuns`) registers with
    :meth:`watch` instead of :meth:`then`: it is told once, at the first
    growth after each :meth:`take`, not at every acknowledgement.

    :param size: the records of the batch (``int`` >= 0).
    :ivar leading: how many records at the start of the batch are finished.
    """

    __slots__ = ("size", "leading", "_later", "_parts", "_callback", "_args", "_watcher",
                 "_watch")

    def __init__(self, size: int) -> None:
        self.size = size
        self.leading = 0
        self._later: set[int] | None = None  # finished, after a gap
        self._parts: dict[int, int] | None = None  # index -> finishes still due (parts)
        self._callback: Callable | None = None
        self._args: tuple = ()
        self._watcher: Callable | None = None  # armed: told at the next growth
        self._watch: Callable | None = None

    def finished(self, index: int, count: int = 1) -> None:
        """Record ``index`` (0-based, in batch order) finished; each index
        is reported once (a record of several :meth:`parts`: once each, or
        ``count`` of them at once)."""
        parts = self._parts
        if parts is not None and index in parts:
            left = parts[index] - count
            if left > 0:
                parts[index] = left
                return
            del parts[index]
        leading = self.leading
        if index != leading:
            later = self._later
            if later is None:
                later = self._later = set()
            later.add(index)
            return
        leading += 1
        later = self._later
        if later:
            while leading in later:
                later.discard(leading)
                leading += 1
        self.leading = leading
        if self._callback is not None:
            self._callback(index, leading, *self._args)
        elif self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            watcher(self, *self._args)

    def parts(self, index: int, count: int) -> None:
        """Record ``index`` finishes at the ``count``-th :meth:`finished`
        of it, not the first (a Kafka record carrying ``count`` messages:
        a :class:`~tbmq.cluster.records.DeliveryRun` of an APPLICATION
        client's topic, done once the client acknowledged each).  Called
        before the first :meth:`finished` of ``index``; ``count`` >= 1."""
        if count > 1:
            parts = self._parts
            if parts is None:
                parts = self._parts = {}
            parts[index] = count

    @property
    def complete(self) -> bool:
        """True once every record finished."""
        return self.leading == self.size

    def then(self, callback: Callable[..., Any], *args: Any) -> None:
        """Register the one callback: ``callback(start, end, *args)`` each
        time the leading run grows from ``start`` to ``end`` records (``end
        == size``: the batch is complete), at once for what finished
        already (``(0, 0)`` for an empty batch).

        :raises RuntimeError: when a callback was registered already.
        """
        if self._callback is not None or self._watch is not None:
            raise RuntimeError("a Progress has one callback")
        self._callback = callback
        self._args = args
        if self.leading or not self.size:
            callback(0, self.leading, *args)

    def watch(self, callback: Callable[..., Any], *args: Any) -> None:
        """Register the one watcher (in place of :meth:`then`):
        ``callback(progress, *args)`` at the first growth of the leading
        run, and again at the first growth after each :meth:`take`; at once
        when records finished already.

        :raises RuntimeError: when a callback was registered already."""
        if self._callback is not None or self._watch is not None:
            raise RuntimeError("a Progress has one callback")
        self._watch = callback
        self._args = args
        if self.leading:
            callback(self, *args)
        else:
            self._watcher = callback

    def take(self) -> int:
        """:returns: :attr:`leading`, now; the watcher of :meth:`watch` is
        told again at the next growth."""
        self._watcher = self._watch
        return self.leading

    def __repr__(self) -> str:
        return f"<Progress {self.leading}/{self.size}>"


def finished_runs(dones: list) -> bool:
    """Acknowledged deliveries of batches with a :class:`Progress`
    (:meth:`Outbox.deliver_app_batch <tbmq.broker.outbox.Outbox.deliver_app_batch>`),
    in order: ``(progress, index)`` each, the messages of one record (a
    :class:`~tbmq.cluster.record_types.DeliveryRun`) sharing one pair.  A
    run of equal pairs is one ``progress.finished(index, count)``, found
    in C (:func:`itertools.groupby`), not one call per message.

    :returns: False, having told nothing, when one item is not such a
        pair (a Deferred of a single delivery: the caller tells each)."""
    runs = [(done, len(list(same))) for done, same in groupby(dones)]
    if any(type(done) is not tuple for done, _ in runs):
        return False
    for (progress, index), count in runs:
        progress.finished(index, count)
    return True


def publish_each(publish: Callable, topic: str, keys: list, values: list,
                 done: Callable[[Any], None]) -> None:
    """Several records with one outcome on a bus without ``publish_many``:
    ``publish(topic, key, value, (), part)`` for each, in order, under one
    :class:`Completion`.

    :param publish: the bus's :meth:`~tbmq.interfaces.IMessageBus.publish`.
    :param done: ``done(None | Failure)``, called exactly once (maybe
        during the call): None once every record is durable, else the
        first failure.
    """
    sent = Completion()
    for key, value in zip(keys, values):
        publish(topic, key, value, (), sent.part())
    sent.then(done)
