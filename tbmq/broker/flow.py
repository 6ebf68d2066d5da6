"""Output of a connection: coalesced writes and flow control.

Two things keep the publish path fast and memory bounded:

* **Coalesced writes.**  While the broker handles one read of a connection
  (a batch of packets), everything written to any connection is appended to
  that connection's list and written with one transport call when the batch
  ends (:class:`Flusher`).  Writes outside a batch (timers, store callbacks)
  go straight to the transport.
* **Flow control.**  A connection whose transport's write buffer is full
  (Twisted calls :meth:`FlowControl.pauseProducing`) is *paused*.  A message
  for a paused connection stops the reading of the connection it came from
  until the paused one drains, so a fast publisher slows down to its
  subscribers' pace instead of losing messages.  A connection that stays
  paused longer than ``mqtt.outbound_pause_timeout`` seconds, or takes more
  than ``mqtt.max_outbound_buffer`` bytes while paused, is *stalled*: it no
  longer holds publishers back, its QoS 0 messages are dropped (counted) and
  its QoS 1/2 messages wait in its bounded queue.  A client that never reads
  cannot stop the others.
"""

from __future__ import annotations

from twisted.logger import Logger

from tbmq.log import OBSERVER as LOG_OBSERVER


class Flusher:
    """Writes the output of every connection written to during a batch once
    the batch ends, then runs what was put off until then.

    :ivar depth: how many batches are running (nested reads are possible).
    """

    __slots__ = ("depth", "dirty", "_later")

    def __init__(self) -> None:
        self.depth = 0
        self.dirty: list = []
        self._later: list = []

    def later(self, call) -> None:
        """Run ``call()`` when the batch ends (at once outside a batch): work
        that many packets of one read share, such as one store write for all
        the deliveries they completed."""
        if self.depth:
            self._later.append(call)
        else:
            call()

    def flush(self) -> None:
        """Write out every pending connection's buffer, then run the put-off
        calls."""
        dirty, self.dirty = self.dirty, []
        for conn in dirty:
            conn.flush()
        if self._later:
            later, self._later = self._later, []
            for call in later:
                call()


class FlowControl:
    """The output half of :class:`tbmq.broker.protocol.MQTTProtocol` (a mixin).

    :ivar paused: True while the transport's write buffer is full.
    :ivar stalled: True when paused for too long or with too many bytes:
        deliveries no longer hold publishers back.
    """

    log = Logger(observer=LOG_OBSERVER)

    def _init_flow(self) -> None:
        self.paused = False
        self.stalled = False
        self._out: list[bytes] = []
        self._paused_bytes = 0
        self._stall_call = None
        self._holding: set | None = None  # connections whose reading we stopped
        self._held_by = 0  # how many paused connections stopped our reading

    # -- writing -----------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Write encoded bytes, coalesced with the rest of the batch."""
        if self.paused:
            self._paused_bytes += len(data)
            if (not self.stalled
                    and self._paused_bytes > self.broker.config.mqtt.max_outbound_buffer):
                self._stall()
        flusher = self.broker.flusher
        if flusher.depth:
            if not self._out:
                flusher.dirty.append(self)
            self._out.append(data)
        elif self.transport is not None:
            self.transport.write(data)

    def flush(self) -> None:
        """Write what this connection collected during the batch."""
        out = self._out
        if not out:
            return
        self._out = []
        if self.transport is not None and self.transport.connected:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    # -- IPushProducer: the transport says when its write buffer is full --------------

    def pauseProducing(self) -> None:
        if self.paused:
            return
        self.paused = True
        self._paused_bytes = 0
        timeout = self.broker.config.mqtt.outbound_pause_timeout
        self._stall_call = self.broker.clock.callLater(timeout, self._stall)

    def resumeProducing(self) -> None:
        if not self.paused:
            return
        self.paused = False
        self.stalled = False
        if self._stall_call is not None and self._stall_call.active():
            self._stall_call.cancel()
        self._stall_call = None
        self._release_holds()
        if self.session is not None:
            self.session.pump()

    def stopProducing(self) -> None:
        self.paused = True
        self.stalled = True
        self._release_holds()

    def _stall(self) -> None:
        """Paused too long or too much: stop holding publishers back."""
        self._stall_call = None
        if self.paused and not self.stalled:
            self.stalled = True
            self.log.info("{client_id} does not read its messages; QoS 0 messages for it are "
                          "dropped until it does", client_id=self._client_id())
            self._release_holds()

    # -- holding publishers back ---------------------------------------------------------

    def hold(self, source) -> bool:
        """A message for this paused connection came from ``source``: stop
        reading ``source`` until this connection drains.

        :param source: the connection whose packets are being handled, or
            None (a will, a timer).
        :returns: False when this connection is stalled (the caller drops a
            QoS 0 message instead).
        """
        if self.stalled:
            return False
        if source is None or source is self:
            return True
        holding = self._holding
        if holding is None:
            holding = self._holding = set()
        if source not in holding:
            holding.add(source)
            source._held_by += 1
            if source._held_by == 1 and source.transport is not None:
                source.transport.pauseProducing()
        return True

    def _release_holds(self) -> None:
        holding, self._holding = self._holding, None
        for source in holding or ():
            source._held_by -= 1
            if source._held_by == 0 and source.transport is not None and not source._closing:
                source.transport.resumeProducing()
