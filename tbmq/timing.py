"""Latencies of the calls the node makes to its bus and stores, for the
metrics (``tbmq_backend_call_seconds``).

:func:`instrument` wraps each backend in a :class:`Timed` proxy that
measures its storage calls from the call until the returned Deferred fires
(a synchronous result: until the call returns).  The bus's ``publish``,
called once per message, is timed in samples: the proxy's ``publish`` is
the bus's own bound method, and once every :data:`SAMPLE_INTERVAL` seconds
the timed wrapper takes its place for the next :data:`SAMPLE_CALLS` calls,
then gives it back; between samples the message path pays nothing.  The
broker instruments its backends only when the HTTP listener is on.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import Any, Callable

from twisted.internet import defer
from zope.interface import directlyProvides, providedBy

#: upper bounds, seconds, of the call latency buckets (+Inf after the last)
CALL_BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
               0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: seconds between two samples of the bus's ``publish``
SAMPLE_INTERVAL = 1.0
#: ``publish`` calls timed per sample
SAMPLE_CALLS = 64

#: the timed methods of each role (those of :mod:`tbmq.interfaces`)
METHODS = {
    "bus": ("publish",),
    "retained_store": ("load_all", "put", "remove"),
    "device_store": ("add", "update", "remove", "load", "count", "clear"),
    "credential_store": ("find", "find_all", "get", "list", "save", "delete",
                         "changed_since"),
}


class Buckets:
    """A latency histogram kept in plain ints.

    :ivar counts: ``counts[i]``: observations at most ``bounds[i]`` (and
        above the bound before); the last entry, above every bound.
    :ivar total: the sum of the observations, seconds.
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple = CALL_BOUNDS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds


class CallTimes:
    """``(backend role, method)`` → :class:`Buckets`.

    :ivar sample: ``sample()``: time the next calls of the bus's ``publish``
        (see :func:`instrument`).
    """

    def __init__(self) -> None:
        self.series: dict[tuple[str, str], Buckets] = {}
        self.sample: Callable[[], None] = lambda: None

    def buckets(self, role: str, method: str) -> Buckets:
        key = (role, method)
        found = self.series.get(key)
        if found is None:
            found = self.series[key] = Buckets()
        return found


def _timed(call: Callable, buckets: Buckets, done: Callable | None = None) -> Callable:
    """``call`` timed into ``buckets``; ``done()`` after each call, if given."""
    perf = time.perf_counter

    def timed(*args: Any, **kwargs: Any) -> Any:
        if done is not None:
            done()
        start = perf()
        result = call(*args, **kwargs)
        if isinstance(result, defer.Deferred):
            def fired(value: Any) -> Any:
                buckets.observe(perf() - start)
                return value

            result.addBoth(fired)
        else:
            buckets.observe(perf() - start)
        return result

    return timed


class Timed:
    """A backend whose storage calls are timed; every other attribute is
    the backend's own, and it provides the backend's interfaces.

    :param target: the backend.
    :param role: ``bus``, ``retained_store``, ``device_store`` or
        ``credential_store``.
    :param times: the :class:`CallTimes` to add to.
    """

    def __init__(self, target: Any, role: str, times: CallTimes) -> None:
        self._target = target
        self._left = 0
        self._sampled = None
        for name in METHODS[role]:
            method = getattr(target, name, None)
            if not callable(method):
                continue
            if role == "bus":
                # sampled: the bus's own method between samples
                self._sampled = (name, method, _timed(method, times.buckets(role, name),
                                                      self._count))
                setattr(self, name, method)
            else:
                setattr(self, name, _timed(method, times.buckets(role, name)))
        directlyProvides(self, *providedBy(target))

    def sample(self) -> None:
        """Time the next :data:`SAMPLE_CALLS` calls of the sampled method."""
        if self._sampled is not None:
            name, _, timed = self._sampled
            self._left = SAMPLE_CALLS
            object.__setattr__(self, name, timed)

    def _count(self) -> None:
        self._left -= 1
        if self._left <= 0:
            name, method, _ = self._sampled
            object.__setattr__(self, name, method)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or name in self.__dict__ or callable(value):
            object.__setattr__(self, name, value)
        else:
            setattr(self._target, name, value)

    def __repr__(self) -> str:
        return f"Timed({self._target!r})"


def instrument(bus, retained_store, device_store, credential_store) -> tuple:
    """Wrap the four backends (one object in two roles gets one proxy,
    named by its first role).

    :returns: ``(CallTimes, (bus, retained_store, device_store,
        credential_store))`` with the wrapped backends; the
        :class:`CallTimes`' ``sample()`` starts a sample of the bus's
        ``publish`` (call it every :data:`SAMPLE_INTERVAL` seconds).
    """
    times = CallTimes()
    made: dict[int, Timed] = {}
    out = []
    for role, backend in (("bus", bus), ("retained_store", retained_store),
                          ("device_store", device_store),
                          ("credential_store", credential_store)):
        proxy = made.get(id(backend))
        if proxy is None:
            proxy = made[id(backend)] = Timed(backend, role, times)
        out.append(proxy)
    times.sample = out[0].sample
    return times, tuple(out)
