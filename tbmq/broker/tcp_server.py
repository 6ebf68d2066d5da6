"""The transport of an accepted TCP connection, lighter than Twisted's.

Twisted's :class:`twisted.internet.tcp.Server` keeps two strings per
connection that are only read to describe it: ``logstr`` (the legacy log's
``system`` field, ``MQTTProtocol,<session number>,<host>``) and ``repstr``
(its ``repr``), about 130 bytes each connection.  :class:`Server` makes
them when they are read, and :meth:`Server.logPrefix`, asked at every read
event by the reactor, gives the protocol's name alone (the broker's own
log lines name the client and its address themselves).
"""

from __future__ import annotations

from twisted.internet import tcp

__all__ = ["Server", "lighten"]


def _log_text(server: "Server") -> str:
    return f"{server._getLogPrefix(server.protocol)},{server.sessionno},{server.hostname}"


def _repr_text(server: "Server") -> str:
    port = server.server
    where = port.getHost().port if port is not None else server.client[1]
    return f"<{server.protocol.__class__.__name__} #{server.sessionno} on {where}>"


def _ignored(server: "Server", value: str) -> None:
    """What Twisted assigns is not kept: the text is made when read."""


class Server(tcp.Server):
    """:class:`twisted.internet.tcp.Server` without its per-connection
    description strings (see the module).  ``logstr`` and ``repstr`` read as
    Twisted's; assigning them changes nothing."""

    logstr = property(_log_text, _ignored)
    repstr = property(_repr_text, _ignored)

    def logPrefix(self) -> str:
        """:returns: the protocol's class name (the reactor asks at every
        read: no text is made per call)."""
        return self.protocol.__class__.__name__


def lighten(port):
    """Make the connections ``port`` accepts use :class:`Server`.

    :param port: what ``endpoint.listen`` gave: a
        :class:`twisted.internet.tcp.Port` (TLS and WebSocket listeners
        too: their layers are protocols above it) is changed; anything
        else (a UNIX socket's port, a test's fake) is left as it is.
    :returns: ``port``.
    """
    if isinstance(port, tcp.Port) and port.transport is tcp.Server:
        port.transport = Server
    return port
