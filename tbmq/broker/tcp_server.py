"""The transport of an accepted TCP connection, lighter than Twisted's.

Twisted's :class:`twisted.internet.tcp.Server` keeps two strings per
connection that are only read to describe it: ``logstr`` (the legacy log's
``system`` field, ``MQTTProtocol,<session number>,<host>``) and ``repstr``
(its ``repr``), about 130 bytes each connection, and makes them as it
accepts it (asking the protocol whether it provides ``ILoggingContext``).
:class:`Server` makes them when they are read, and :meth:`Server.logPrefix`,
asked at every read event by the reactor, gives the protocol's name alone
(the broker's own log lines name the client and its address themselves).

:meth:`Server.write` also sends at once what it is given while nothing
waits in the transport's buffer, where Twisted's buffers every write and
sends it when the reactor next finds the socket writable: a CONNACK cost two
``epoll_ctl`` calls (watch for writability, then stop) and a turn of the
reactor before it left.  The connection's protocol already gathers a turn's
packets into one write (:class:`~tbmq.broker.outbound.TurnFlusher`), so one
``send`` per connection and turn is what this costs; what the kernel does
not take is buffered and sent as Twisted does.

:meth:`Server.read_waiting` reads what the client sent before the
connection was accepted (a client sends its CONNECT as soon as its connect
completes, usually before the node accepts), so the protocol can handle it
while it is being connected instead of in a later turn of the reactor.
"""

from __future__ import annotations

import fcntl
import os
import resource
import socket
from errno import EAGAIN, EINTR, ENOBUFS, EWOULDBLOCK

from twisted.internet import address, tcp
from twisted.logger import Logger

from tbmq.log import OBSERVER as LOG_OBSERVER

log = Logger(observer=LOG_OBSERVER)

#: ``send`` errors that mean "the socket's buffer is full": the data waits
_FULL = frozenset((EAGAIN, EWOULDBLOCK, ENOBUFS, EINTR))

__all__ = ["Server", "lighten", "reserve_descriptors"]

#: the most descriptors :func:`reserve_descriptors` makes room for (a
#: table of 65,536 takes ~520 KiB of kernel memory; more grows as needed)
RESERVED_DESCRIPTORS = 1 << 16


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

    def __init__(self, sock, protocol, client: tuple, server, sessionno: int, reactor) -> None:
        """:class:`twisted.internet.tcp.Server`'s, without the strings.

        :param sock: the accepted socket.
        :param protocol: the connection's protocol, not yet connected.
        :param client: the peer's address tuple (2 items: IPv4).
        :param server: the listening ``tcp.Port``, or None.
        :param sessionno: the port's number of the connection.
        :param reactor: the reactor that reads it.
        """
        tcp.Connection.__init__(self, sock, protocol, reactor)
        if len(client) != 2:
            self._addressType = address.IPv6Address
        self.server = server
        self.client = client
        self.sessionno = sessionno
        self.hostname = client[0]
        self.startReading()
        self.connected = 1

    def write(self, data: bytes) -> None:
        """Send ``data`` now when nothing waits to be sent before it (the
        transport's buffer is empty, the connection is open and not being
        closed, no ``startTLS`` layer); what the kernel does not take, and any write while data
        waits, is buffered and sent by the reactor as
        :meth:`twisted.internet.abstract.FileDescriptor.write` does (its
        producer paused when the buffer passes ``bufferSize``).

        A ``send`` that fails otherwise than with a full socket buffers the
        data too: the reactor's next write finds the error and closes the
        connection, as it would have.

        :param data: bytes (anything else raises ``TypeError``, as Twisted's).
        """
        if (type(data) is not bytes or not data or self.dataBuffer or self._tempDataBuffer
                or not self.connected or self.disconnecting or self._writeDisconnecting
                or self._writeDisconnected or self.TLS):
            tcp.Server.write(self, data)
            return
        try:
            sent = self.socket.send(data)
        except OSError as e:
            if e.args[0] not in _FULL:
                tcp.Server.write(self, data)
                return
            sent = 0
        if sent < len(data):
            # what is left waits in Twisted's buffer, from where doWrite sends on
            self.dataBuffer = data
            self.offset = sent
            self._maybePauseProducer()
            self.startWriting()

    def read_waiting(self) -> None:
        """Read now what the peer has already sent (one ``recv``), as the
        reactor would when it next finds the socket readable; nothing when
        nothing waits.  For the ``connectionMade`` of the protocol connected
        to this transport itself (not of one behind a layer of its own:
        that layer reads).

        The end of the stream or a socket error is left to the reactor (the
        socket stays readable: it sees them at its next poll).  An exception
        of the protocol's ``dataReceived`` is logged and the connection
        aborted (the reactor would close it with that failure).
        """
        if not self.connected or self.disconnecting:
            return
        try:
            self.doRead()
        except Exception:
            log.failure("reading a connection as it was accepted failed; aborting it")
            self.abortConnection()

    def logPrefix(self) -> str:
        """:returns: the protocol's class name (the reactor asks at every
        read: no text is made per call)."""
        return self.protocol.__class__.__name__


def _plainly_accepting(listening: socket.socket) -> None:
    """Make ``listening``'s ``accept()`` build the accepted socket from the
    listening socket's family, type and protocol read once, as plain
    integers: :meth:`socket.socket.accept` reads ``family`` and ``type``
    at every call, each an ``IntEnum`` conversion (about 1.5 µs an accept
    together).  The accepted socket is the same :class:`socket.socket`."""
    family, kind, proto = int(listening.family), int(listening.type), listening.proto

    class Listening(socket.socket):
        __slots__ = ()

        def accept(self):
            fd, addr = self._accept()
            sock = socket.socket(family, kind, proto, fd)  # (a keyword costs a dict)
            if socket.getdefaulttimeout() is None and self.gettimeout():
                sock.setblocking(True)  # as socket.socket.accept
            return sock, addr

    listening.__class__ = Listening


def reserve_descriptors(count: int = RESERVED_DESCRIPTORS) -> int:
    """Grow the process's file descriptor table once, now, to ``count``
    entries (at most the soft ``RLIMIT_NOFILE``), so accepting connections
    does not grow it later.

    Linux doubles the table when a new descriptor passes its size (at 256,
    512, 1,024 ... descriptors) and, in a process with more than one thread
    (the SQLite store's), waits for an RCU grace period while it does: the
    ``accept4`` that crosses the size blocks the reactor 6-20 ms (measured
    with ``strace -T`` in a burst of 5,000 CONNECTs), with every handshake
    in flight.  The kernel never shrinks the table, so one descriptor made
    at ``count - 1`` and closed again leaves it at its full size.

    :param count: descriptors to make room for (>= 4; fewer does nothing).
    :returns: the descriptor number the table now covers (0 when nothing
        was done: ``count`` or the limit too small, or the kernel refused).
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = min(count, soft if soft != resource.RLIM_INFINITY else count) - 1
    if top < 3:
        return 0
    fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        # F_DUPFD takes the lowest free descriptor >= top: it never closes one in use
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, top)
    except OSError as e:
        log.warn("could not reserve {count} file descriptors: {error}", count=count, error=e)
        return 0
    finally:
        os.close(fd)
    os.close(high)
    return high


def lighten(port):
    """Make the connections ``port`` accepts use :class:`Server`, and its
    socket accept them without reading its family and type each time.

    :param port: what ``endpoint.listen`` gave: a
        :class:`twisted.internet.tcp.Port` (TLS and WebSocket listeners
        too: their layers are protocols above it) is changed; anything
        else (a UNIX socket's port, a test's fake) is left as it is.
    :returns: ``port``.
    """
    if isinstance(port, tcp.Port) and port.transport is tcp.Server:
        port.transport = Server
        if type(port.socket) is socket.socket:
            _plainly_accepting(port.socket)
    return port
