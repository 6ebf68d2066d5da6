"""One timer for the deadlines of every connection of a node (the connect
timeout [MQTT-3.1.4], the keep alive's one and a half times
[MQTT-3.1.2-24]), instead of one ``IDelayedCall`` per connection.

A connection's deadline moves with every packet it sends: with a delayed
call each, a node of many idle connections pays one ~550-byte
``DelayedCall`` per connection and a ``reset`` per read.  Here the
deadlines sit in buckets of :data:`TICK` seconds (a timing wheel keyed by
the tick a deadline falls in); a read only moves the connection's
deadline, a plain float, and a bucket that comes due hands each of its
connections either its timeout (deadline passed) or a later bucket (it was
active meanwhile).  A deadline is never acted on early, and at most one
tick late.
"""

from __future__ import annotations

import heapq
import math
import weakref

from twisted.logger import Logger

from tbmq.log import OBSERVER as LOG_OBSERVER

#: seconds per bucket: how late a deadline may be acted on
TICK = 0.1

_NODE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def deadlines_for(clock) -> "Deadlines":
    """:param clock: an ``IReactorTime`` (the reactor, or a
        :class:`twisted.internet.task.Clock` in tests).
    :returns: the :class:`Deadlines` of that clock, made at the first call:
        one per node (the nodes of one process share it, harmlessly)."""
    wheel = _NODE.get(clock)
    if wheel is None:
        wheel = _NODE[clock] = Deadlines(clock)
    return wheel


class Deadlines:
    """Owners (connections) with a deadline, each told ``timeout()`` once it
    passed.

    An owner is any object with the attributes ``deadline`` (seconds of
    ``clock.seconds()``, or None) and ``deadline_slot`` (kept by this
    class: the bucket it is in, or None) and a method ``deadline_passed()``.

    :param clock: ``IReactorTime``.
    :param tick: seconds per bucket.
    :ivar count: the owners with a deadline.
    """

    __slots__ = ("clock", "tick", "count", "_buckets", "_keys", "_call", "_call_key")

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, clock, tick: float = TICK) -> None:
        self.clock = clock
        self.tick = tick
        self.count = 0
        # key → (the key, its owners): the owners in a bucket share its one key
        # object as their deadline_slot (an int past 256 is 32 bytes each)
        self._buckets: dict[int, tuple[int, set]] = {}
        self._keys: list[int] = []  # heap of the keys of _buckets
        self._call = None
        self._call_key: int | None = None

    def set(self, owner, at: float | None) -> None:
        """Give ``owner`` the deadline ``at`` (seconds), or none (None).

        A later deadline than the bucket the owner is in costs nothing but
        the attribute (the bucket moves it when due); an earlier one moves
        it now."""
        owner.deadline = at
        slot = owner.deadline_slot
        if at is None:
            if slot is not None:
                self._remove(owner, slot)
            return
        key = math.ceil(at / self.tick)
        if slot is not None:
            if slot <= key:
                return
            self._remove(owner, slot)
        self._add(owner, key)

    def touch(self, owner, at: float) -> None:
        """Move the deadline of an owner that has one later, to ``at``: the
        keep alive of a connection that sent a packet.  Nothing for an
        owner without a deadline."""
        if owner.deadline_slot is not None and at > owner.deadline:
            owner.deadline = at

    def _add(self, owner, key: int) -> None:
        held = self._buckets.get(key)
        if held is None:
            held = self._buckets[key] = (key, set())
            heapq.heappush(self._keys, key)
            if self._call_key is None or key < self._call_key:
                self._arm(key)
        held[1].add(owner)
        owner.deadline_slot = held[0]
        self.count += 1

    def _remove(self, owner, slot: int) -> None:
        owner.deadline_slot = None
        held = self._buckets.get(slot)
        bucket = None if held is None else held[1]
        if bucket is not None and owner in bucket:
            bucket.discard(owner)
            self.count -= 1
            # an empty bucket stays until due: its key is in the heap

    def _arm(self, key: int) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call_key = key
        self._call = self.clock.callLater(max(0.0, key * self.tick - self.clock.seconds()), self._due)

    def _due(self) -> None:
        self._call = None
        self._call_key = None
        now = self.clock.seconds()
        # (a bucket's time, key × tick, may be a rounding off the clock's:
        # what is not yet due in it goes to a later bucket below)
        limit = now + self.tick / 1000
        keys, buckets = self._keys, self._buckets
        while keys and keys[0] * self.tick <= limit:
            key = heapq.heappop(keys)
            _key, bucket = buckets.pop(key, (key, ()))
            for owner in bucket:
                self.count -= 1
                owner.deadline_slot = None
                at = owner.deadline
                if at is None:
                    continue
                if at > now:
                    self._add_quietly(owner, max(math.ceil(at / self.tick), key + 1))
                    continue
                owner.deadline = None
                try:
                    owner.deadline_passed()
                except Exception:
                    self.log.failure("a connection's timeout failed")
        if keys:
            self._arm(keys[0])

    def _add_quietly(self, owner, key: int) -> None:
        """:meth:`_add` without arming (``_due`` arms once at its end)."""
        held = self._buckets.get(key)
        if held is None:
            held = self._buckets[key] = (key, set())
            heapq.heappush(self._keys, key)
        held[1].add(owner)
        owner.deadline_slot = held[0]
        self.count += 1
