"""The deadline of a packet that does not end (``mqtt.incomplete_packet_timeout``):
a part of a connection (:class:`~tbmq.broker.protocol.MQTTProtocol`), made
when a connected client's read first ends inside a packet (most never do).
"""

from __future__ import annotations

from tbmq.mqtt import ReasonCode

__all__ = ["IncompletePacket"]


class IncompletePacket:
    """When the packet being read began, and the timer that closes the
    connection if it is not complete ``mqtt.incomplete_packet_timeout``
    seconds later (a client that stops mid-packet would otherwise hold its
    connection and buffer forever).

    :param conn: the :class:`~tbmq.broker.protocol.MQTTProtocol`.
    :ivar since: when the incomplete packet began (seconds of the node's
        clock), or None when the last read ended on a packet boundary.
    :ivar timer: the ``IDelayedCall`` of :meth:`overdue`, or None.
    """

    __slots__ = ("conn", "since", "timer")

    def __init__(self, conn) -> None:
        self.conn = conn
        self.since: float | None = None
        self.timer = None

    def started(self) -> None:
        """An incomplete packet began in this read: it has
        ``mqtt.incomplete_packet_timeout`` seconds to be completed."""
        ctx = self.conn.ctx
        self.since = ctx.clock.seconds()
        if self.timer is None:
            self.timer = ctx.clock.callLater(ctx.config.mqtt.incomplete_packet_timeout, self.overdue)

    def overdue(self) -> None:
        """The timer fired: close the connection (KEEP_ALIVE_TIMEOUT, 0x8D)
        when the packet is still incomplete and the connection was read
        meanwhile; else wait for what is left of the timeout."""
        self.timer = None
        conn = self.conn
        since = self.since
        if since is None or conn._closing:
            return
        ctx = conn.ctx
        timeout = ctx.config.mqtt.incomplete_packet_timeout
        if conn._read_pauses:  # not read meanwhile: the client is not to blame
            self.started()
            return
        left = since + timeout - ctx.clock.seconds()
        if left > 0:
            self.timer = ctx.clock.callLater(left, self.overdue)
            return
        conn.log.info("packet from {client_id} not complete {timeout:g} s after it began "
                      "({pending} bytes of it read); closing", client_id=conn._client_id(),
                      timeout=timeout, pending=conn.decoder.pending)
        conn.disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "packet not complete in time")

    def cancel(self) -> None:
        """The connection is lost: no timer left."""
        timer, self.timer = self.timer, None
        if timer is not None and timer.active():
            timer.cancel()
