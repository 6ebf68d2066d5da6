"""What a session and its parts see of their connection: a :class:`Link`,
built by the connection (:meth:`tbmq.broker.protocol.MQTTProtocol.make_link`)
when a session attaches to it, not the connection itself.  The connection
keeps its ``paused`` and ``auth`` up to date.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["Link"]


class Link:
    """One connection as its session sees it.  The values are the client's
    (from its CONNECT, fixed for the connection); ``paused`` and ``auth``
    are kept by the connection.

    :param conn: the :class:`tbmq.broker.protocol.MQTTProtocol` (used for
        the rare calls: :meth:`send`, :meth:`disconnect`, reading back-pressure).
    :param send_quota: see :attr:`send_quota`.
    :param max_packet_size: see :attr:`max_packet_size`.
    :param topic_alias_maximum: see :attr:`topic_alias_maximum`.
    :param auth: see :attr:`auth`: the connection's (given by it: no
        property read per attach).
    :ivar protocol_level: 3, 4 or 5.
    :ivar send_quota: the client's Receive Maximum: QoS 1/2 PUBLISHes it
        takes unacknowledged (65535 before v5) [MQTT-3.3.4-7].
    :ivar max_packet_size: the client's Maximum Packet Size, bytes, or None
        [MQTT-3.1.2-24].
    :ivar topic_alias_maximum: topic aliases the broker may give towards the
        client, 0 for none [MQTT-3.1.2-26].
    :ivar paused: True while the connection's socket is full.
    :ivar auth: the :class:`tbmq.auth.AuthResult` the client is connected
        under (a re-authentication replaces it here too).
    :ivar write: ``write(data: bytes) -> None``: queue bytes for the client.
    """

    __slots__ = ("protocol_level", "send_quota", "max_packet_size", "topic_alias_maximum",
                 "paused", "auth", "write", "_conn")

    def __init__(self, conn, send_quota: int = 65535, max_packet_size: int | None = None,
                 topic_alias_maximum: int = 0, auth=None) -> None:
        self._conn = conn
        self.protocol_level: int = conn.protocol_level
        self.send_quota = send_quota
        self.max_packet_size = max_packet_size
        self.topic_alias_maximum = topic_alias_maximum
        self.paused: bool = conn.paused
        self.auth = auth
        self.write: Callable[[bytes], None] = conn.write

    @property
    def paused_bytes(self) -> int:
        """Bytes written since the socket became full."""
        return self._conn.paused_bytes

    def send(self, packet) -> None:
        """Encode ``packet`` for the client's protocol level and write it."""
        self._conn.send(packet)

    def disconnect(self, reason_code: int, reason: str | None = None) -> None:
        """End the connection: DISCONNECT with ``reason_code`` for a v5 client
        [MQTT-3.14.2], then the close."""
        self._conn.disconnect(reason_code, reason)

    def pause_reading(self) -> None:
        """Stop reading the client's packets (its publishes wait)."""
        self._conn.pause_reading()

    def resume_reading(self) -> None:
        """Read the client's packets again."""
        self._conn.resume_reading()
