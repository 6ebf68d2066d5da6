"""Between the reactor and the Kafka clients' threads.

The Kafka clients block; the reactor must not.  Everything that blocks runs
in a thread of its own, and what a thread learns goes back to the reactor
with ``reactor.callFromThread``, in batches:

* :class:`AckBatcher`: the producer's acknowledgements (called per record in
  the client's I/O thread) reach the reactor as one ``callFromThread`` per
  batch of acknowledgements, not one per record (a Deferred and a
  ``callFromThread`` per record cost a third of the throughput), each to
  its publish's ``done`` callable;
* :class:`Worker`: one thread for the bus's own blocking calls (topic
  creation, metadata, flush, close), in the order they were submitted;
* :func:`ask_reactor`: a client thread asks the reactor something and waits
  for the answer (a rebalance must know what the handlers have finished
  before the partitions go), with a timeout so that a stopped reactor never
  hangs the thread.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from twisted.internet import defer
from twisted.python.failure import Failure

__all__ = ["AckBatcher", "Worker", "ask_reactor"]


class AckBatcher:
    """Collects ``(done, error)`` outcomes from any thread and hands them to
    the reactor thread, one ``callFromThread`` per batch.

    :param reactor: the reactor (``callFromThread``).
    :param on_batch: ``on_batch(items)`` called in the reactor thread with
        the list of ``(done, error)`` collected since the previous call,
        in the order they were put; ``error`` is None for a success, else
        what the client reported (an exception or a string).
    :ivar batches: how many batches were handed to the reactor so far.
    """

    __slots__ = ("_reactor", "_on_batch", "_lock", "_items", "batches")

    def __init__(self, reactor: Any, on_batch: Callable[[list], None]) -> None:
        self._reactor = reactor
        self._on_batch = on_batch
        self._lock = threading.Lock()
        self._items: list = []
        self.batches = 0

    def put(self, done: Any, error: Any = None) -> None:
        """Record the outcome of one publish (any thread); ``done`` is what
        the outcome is for (the bus's business)."""
        with self._lock:
            items = self._items
            items.append((done, error))
            first = len(items) == 1
        if first:
            self._reactor.callFromThread(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        if items:
            self.batches += 1
            self._on_batch(items)


class Worker:
    """One daemon thread that runs blocking calls one at a time, in order.

    :param reactor: the reactor the results go back to.
    :param name: the thread's name.
    """

    def __init__(self, reactor: Any, name: str) -> None:
        self._reactor = reactor
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call(self, f: Callable, *args: Any, **kwargs: Any) -> defer.Deferred:
        """Run ``f(*args, **kwargs)`` in the thread.

        :returns: a Deferred (fired in the reactor thread) with its result
            or its exception.
        """
        d = defer.Deferred()
        self._calls.put((f, args, kwargs, d))
        return d

    def stop(self) -> None:
        """End the thread once the calls submitted so far have run."""
        self._calls.put(None)

    def _run(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            f, args, kwargs, d = item
            try:
                result = f(*args, **kwargs)
            except BaseException:
                result = Failure()
                self._reactor.callFromThread(d.errback, result)
            else:
                self._reactor.callFromThread(d.callback, result)


def ask_reactor(reactor: Any, f: Callable, *args: Any, timeout: float) -> tuple[bool, Any]:
    """Call ``f(*args)`` in the reactor thread and wait for it (from
    another thread).

    :param timeout: seconds to wait at most.
    :returns: ``(True, result)``, or ``(False, None)`` when the reactor did
        not answer in time (or ``f`` raised, which is logged by Twisted).
    """
    done = threading.Event()
    box: list = []

    def call() -> None:
        try:
            box.append(f(*args))
        finally:
            done.set()

    reactor.callFromThread(call)
    if done.wait(timeout) and box:
        return True, box[0]
    return False, None
