"""Output of the node: per-connection outbound queues whose writes are
coalesced to the end of the reactor turn, and the holds by which a
congested session slows the sources that feed it.

* **Coalesced writes.**  A connection appends what it sends to its own
  outbound queue; the first write of a turn asks the node's
  :class:`TurnFlusher` to flush it when the turn ends, so every PUBLISH a
  read (or a batch of bus records) produces for one client leaves in one
  transport write, whoever produced it.
* **Holds.**  A session whose queue is above its high-water mark, or whose
  socket is full, *holds* the source that handed it the message (a bus
  consumer, :class:`tbmq.interfaces.IConsumer`): the source is paused until
  every session holding it has drained to its low-water mark, or has used up
  its hold credit (:class:`HoldCredit`) and counts as slow.  A source held by
  several sessions is paused once and resumed when the last one lets go
  (:class:`Holds`).
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.logger import Logger

from tbmq.log import OBSERVER as LOG_OBSERVER


class TurnFlusher:
    """Work put off until the end of the current reactor turn.

    :param clock: an ``IReactorTime``; one ``callLater(0, ...)`` per turn in
        which something was put off.
    """

    __slots__ = ("_clock", "_dirty", "_later", "_call")

    def __init__(self, clock) -> None:
        self._clock = clock
        self._dirty: list = []
        self._later: list[Callable[[], Any]] = []
        self._call = None

    def mark(self, conn) -> None:
        """Call ``conn.flush()`` when the turn ends (once per call of this)."""
        self._dirty.append(conn)
        if self._call is None:
            self._call = self._clock.callLater(0, self.run)

    def later(self, call: Callable[[], Any]) -> None:
        """Run ``call()`` when the turn ends, after the flushes: work that
        several packets of one turn share (one store write for the
        deliveries they completed)."""
        self._later.append(call)
        if self._call is None:
            self._call = self._clock.callLater(0, self.run)

    def run(self) -> None:
        """Flush every connection written to, then run the put-off calls
        (called by the clock; tests may call it)."""
        self._call = None
        while self._dirty or self._later:
            dirty, self._dirty = self._dirty, []
            for conn in dirty:
                conn.flush()
            later, self._later = self._later, []
            for call in later:
                try:
                    call()
                except Exception:
                    Logger(observer=LOG_OBSERVER).failure("end-of-turn call failed")


class Holds:
    """Which sessions hold which sources.

    A source is anything with ``pause()`` and ``resume()`` (a bus consumer).
    It is paused when its first holder takes it and resumed when its last
    holder lets go.
    """

    __slots__ = ("_holders",)

    def __init__(self) -> None:
        #: source → the set of holders
        self._holders: dict[Any, set] = {}

    def hold(self, source, holder) -> None:
        """``holder`` (a session) holds ``source``."""
        holders = self._holders.get(source)
        if holders is None:
            self._holders[source] = {holder}
            source.pause()
        else:
            holders.add(holder)

    def release(self, sources, holder) -> None:
        """``holder`` lets go of each of ``sources``."""
        for source in sources:
            holders = self._holders.get(source)
            if holders is None:
                continue
            holders.discard(holder)
            if not holders:
                del self._holders[source]
                source.resume()

    def held(self, source) -> bool:
        """True while someone holds ``source``."""
        return source in self._holders


class HoldCredit:
    """How long a session may still hold its sources: a token bucket of
    ``capacity`` seconds, refilled at ``capacity / window`` seconds per
    second.  A session that reads a little now and then (a drip reader)
    therefore holds the others for at most ``capacity`` seconds per
    ``window`` seconds, and a stuck one for ``capacity`` seconds once.

    :param capacity: seconds (``mqtt.outbound_pause_timeout``).
    :param window: seconds over which the credit refills, ``> capacity``.
    :param now: the current time, seconds.
    """

    __slots__ = ("capacity", "rate", "_credit", "_at")

    def __init__(self, capacity: float, window: float, now: float) -> None:
        self.capacity = capacity
        self.rate = capacity / window
        self._credit = capacity
        self._at = now

    def available(self, now: float) -> float:
        """Seconds of holding left at ``now``."""
        credit = self._credit + (now - self._at) * self.rate
        return credit if credit < self.capacity else self.capacity

    def spend(self, seconds: float, now: float) -> None:
        """Take ``seconds`` of holding that ended at ``now``."""
        self._credit = max(0.0, self.available(now) - seconds)
        self._at = now
