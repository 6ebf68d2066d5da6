"""The SENT states of a persistent session's QoS 1 deliveries, written to
the device store only for those the client has not acknowledged a moment
later (a part of :class:`tbmq.broker.outbox.Outbox`, made at the first such
send).

A delivery read from the device store is sent with a packet identifier; the
store keeps that identifier and the state SENT (``update``) so that after a
reconnect the delivery is sent again with DUP and the same identifier
[MQTT-4.4.0-1].  A live client acknowledges most QoS 1 deliveries within
milliseconds, and the acknowledgement removes the row: the update of a row
that is deleted a moment later is a write of every page the drain touches
(and of its WAL frames, and of their fsync) for nothing.  So the SENT state
of a QoS 1 delivery waits here :data:`SentStates.DELAY` to
2 × :data:`SentStates.DELAY` seconds after the client last acknowledged
anything or acknowledged a delivery sent after it (at most
:data:`SentStates.MOST_TICKS` + 1 ticks while it keeps acknowledging others
in order); the PUBACK that comes meanwhile cancels it (only the
row's removal is written), the others are written in one ``update_many``.
A client that acknowledges in order, as fast as it reads, is a drain's
whole window behind the broker (a window of 65,535 PUBLISHes before v5):
aged by the clock alone, nearly every SENT state of a drain was written,
each turning a part of a run of the store into a row (the database thread
busy, and the reactor waiting for the GIL, for deliveries acknowledged a
moment later).  When the connection ends, every state held is
written at once, before the next connection reads the store (the store runs
a client's calls in order), so a reconnect or a clean stop resends them as
before.

Only a crash (SIGKILL, power loss) within that time loses a held state: the
QoS 1 delivery is then sent again after the restart as a new one (new
packet identifier, no DUP), which QoS 1's at-least-once allows (the
duplicates after a crash of ``docs/guarantees.md``).  QoS 2 deliveries and
PUBREL states are not held (exactly once needs them).
"""

from __future__ import annotations

from collections import deque
from itertools import repeat

from tbmq.backends.deliveries import update_many
from tbmq.model import DeliveryState

__all__ = ["SentStates"]

_SENT = int(DeliveryState.SENT)

#: runs an iterator to its end, keeping nothing
_consume = deque(maxlen=0).extend


class SentStates:
    """The held SENT states of one session's QoS 1 deliveries, each in send
    (``seq``) order: ``young`` (sent since the last tick), ``old`` (sent
    before it).  A tick after which the client acknowledged nothing, or the
    :data:`MOST_TICKS`-th one in a row after which it did, writes ``old``
    and ages ``young``.  The other ticks (the client is acknowledging, in
    order: a drain's window) write only the states of ``old`` the client
    passed over (it acknowledged a later ``seq``) and age ``young`` into
    ``old`` unwritten.

    :param outbox: the :class:`~tbmq.broker.outbox.Outbox` (its ``ctx``,
        ``client_id``).
    """

    __slots__ = ("outbox", "young", "old", "call", "acknowledged", "waited", "newest", "due")

    #: seconds a held state waits at least (at most twice that) after the
    #: client's last acknowledgement before it is written
    DELAY = 0.05

    #: ticks in a row that wait while the client acknowledges others, at
    #: most (a held state is written within (MOST_TICKS + 1) × DELAY seconds)
    MOST_TICKS = 20

    def __init__(self, outbox) -> None:
        self.outbox = outbox
        #: seq → packet identifier, sent since the last tick
        self.young: dict[int, int] = {}
        #: seq → packet identifier, sent before the last tick
        self.old: dict[int, int] = {}
        self.call = None
        #: the client acknowledged (or refused) a delivery since the last tick
        self.acknowledged = False
        #: ticks in a row that waited (the client acknowledging)
        self.waited = 0
        #: the highest seq acknowledged (or refused)
        self.newest = 0
        #: when the next tick is due, seconds since the epoch
        self.due = 0.0

    def hold(self, seq: int, packet_id: int) -> None:
        """Delivery ``seq`` was sent with ``packet_id``: its state waits."""
        self.young[seq] = packet_id
        if self.call is None:
            self._arm()

    def hold_many(self, sent: list) -> None:
        """As :meth:`hold` for each ``(seq, packet_id)`` of ``sent``."""
        self.young.update(sent)
        if self.call is None:
            self._arm()

    def finished(self, seqs: list) -> None:
        """The deliveries ``seqs`` (a non-empty list of ``seq``) are done
        (acknowledged, refused): their states are not written (their rows
        are removed)."""
        self.acknowledged = True
        newest = max(seqs)
        if newest > self.newest:
            self.newest = newest
        # each popped where it is, by map (no bytecode per seq)
        _consume(map(self.young.pop, seqs, repeat(None)))
        if self.old:
            _consume(map(self.old.pop, seqs, repeat(None)))

    def _tick(self) -> None:
        """Write what waited a whole tick; the rest waits one more.  While
        the client acknowledges (at most :data:`MOST_TICKS` ticks in a
        row), only what it passed over is written."""
        self.call = None
        old = self.old
        # a tick a whole DELAY late: the reactor was busy (a drain's long
        # turn), it read nothing of the client's meanwhile: as acknowledged
        if (self.acknowledged or self.outbox.ctx.clock.seconds() > self.due + self.DELAY) \
                and self.waited < self.MOST_TICKS:
            self.waited += 1
            if old:
                newest = self.newest
                passed = []  # at the front of old (acknowledged in order: none)
                for seq in old:
                    if seq > newest:
                        break
                    passed.append(seq)
                if passed:
                    self._write({seq: old.pop(seq) for seq in passed})
            young = self.young
            if young:
                if old:
                    old.update(young)
                    self.young = {}
                else:
                    self.old, self.young = young, {}
        else:
            self.waited = 0
            self.old, self.young = self.young, {}
            self._write(old)
        self.acknowledged = False
        if self.old or self.young:
            self._arm()

    def _arm(self) -> None:
        """The next tick, :data:`DELAY` seconds from now."""
        clock = self.outbox.ctx.clock
        self.due = clock.seconds() + self.DELAY
        self.call = clock.callLater(self.DELAY, self._tick)

    def flush(self) -> None:
        """The connection ends: write every held state now."""
        self._cancel()
        held = self.old
        held.update(self.young)
        self.old, self.young = {}, {}
        self._write(held)

    def forget(self) -> None:
        """The session ends (its deliveries go): write nothing."""
        self._cancel()
        self.old, self.young = {}, {}

    def _cancel(self) -> None:
        call, self.call = self.call, None
        if call is not None and call.active():
            call.cancel()

    def _write(self, held: dict[int, int]) -> None:
        if held:
            outbox = self.outbox
            outbox.ctx.drops.store_write(
                update_many(outbox.ctx.device_store, outbox.client_id,
                            [(seq, pid, _SENT) for seq, pid in held.items()]), "update")
