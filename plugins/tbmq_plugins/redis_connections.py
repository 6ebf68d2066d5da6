"""The connections of the Redis device store (:mod:`tbmq_plugins.redis_store`):
txredisapi's protocol on a reactor of the caller's choosing.

txredisapi's own pools (``ConnectionPool``, ``lazyConnectionPool``) run on
the global reactor and send each command on whichever connection is free,
so two calls for one client could overtake each other.  Here each
:class:`RedisConnection` keeps one :class:`txredisapi.RedisProtocol`
connected (authenticating and selecting the database as the URL says,
through txredisapi), loads the store's Lua scripts on it before it is used,
and reconnects with a capped exponential backoff when it is lost.  The
store sends every call of one client on one connection, where Redis runs
them in the order they were sent.

txredisapi is imported on first use: importing it installs the global
reactor.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Iterable
from urllib.parse import unquote, urlsplit

from twisted.internet import defer, error
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

__all__ = ["RedisConnection", "RedisTarget", "parse_redis_url"]


@dataclass(frozen=True)
class RedisTarget:
    """Where a Redis server is, from a ``redis://`` URL.

    :ivar host: host name or address.
    :ivar port: TCP port.
    :ivar db: the database number to SELECT, or None.
    :ivar username: the ACL user name for AUTH, or None.
    :ivar password: the password for AUTH, or None.
    :ivar tls: True for ``rediss://``.
    """

    host: str
    port: int
    db: int | None = None
    username: str | None = None
    password: str | None = None
    tls: bool = False

    def __str__(self) -> str:
        """The URL without its credentials (for messages)."""
        db = "" if self.db is None else f"/{self.db}"
        return f"{'rediss' if self.tls else 'redis'}://{self.host}:{self.port}{db}"


def parse_redis_url(url: str) -> RedisTarget:
    """:param url: ``redis://[[user]:password@]host[:port][/db]`` (or
        ``rediss://`` for TLS); the port defaults to 6379.
    :returns: the :class:`RedisTarget`.
    :raises ValueError: for another scheme, a bad port or database number.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"not a redis:// URL: {url!r}")
    try:
        port = parts.port or 6379
    except ValueError:
        raise ValueError(f"bad port in {url!r}") from None
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ValueError(f"the path of {url!r} must be a database number")
    return RedisTarget(
        host=parts.hostname or "127.0.0.1",
        port=port,
        db=int(path) if path else None,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        tls=parts.scheme == "rediss",
    )


_PROTOCOL: type | None = None


def _protocol_class() -> type:
    """:returns: txredisapi's ``RedisProtocol`` scheduling its timers on its
    factory's reactor (txredisapi's own uses the global one), and whose
    replies never answer a call made after its connection began to close:
    txredisapi hands the rest of a read that followed a bulk reply over a
    reactor turn later, so after a reply timeout (which fails every call
    waiting and aborts the connection) those replies would be queued and
    taken by the next calls, which a closing transport never sends: an add
    answered "done" that Redis never ran.  Calls made then fail at once
    (``txredisapi.ConnectionError``, as on a connection that is closed)."""
    global _PROTOCOL
    if _PROTOCOL is None:
        import txredisapi  # noqa: PLC0415

        class ReactorRedisProtocol(txredisapi.RedisProtocol):
            def callLater(self, delay: float, f: Callable, *args: Any, **kwargs: Any) -> Any:
                return self.factory.reactor.callLater(delay, f, *args, **kwargs)

            def _dropped(self) -> bool:
                """The connection is being closed (a reply timeout aborts
                it): its reply stream no longer matches its calls."""
                t = self.transport
                return t is None or bool(t.disconnecting or getattr(t, "disconnected", False)
                                         or getattr(t, "_aborting", False)
                                         or getattr(t, "_aborted", False))

            def execute_command(self, *args: Any, **kwargs: Any) -> Any:
                # written to a closing transport, a call would never be
                # sent, and could take a reply still queued for an earlier one
                if self._dropped():
                    raise txredisapi.ConnectionError("the connection is closing")
                return super().execute_command(*args, **kwargs)

            def replyReceived(self, reply: Any) -> None:
                # txredisapi reads the rest of a buffer a reactor turn after a
                # bulk reply: once a reply timeout failed every waiting call
                # and aborted the connection, those replies answer none of
                # the calls made since (errors for the calls still waiting,
                # from connectionLost, go through)
                if self._dropped() and not isinstance(reply, Exception):
                    return
                super().replyReceived(reply)

        _PROTOCOL = ReactorRedisProtocol
    return _PROTOCOL


class _ProtocolFactory(Factory):
    """Builds the protocols of the connections to one target, and is the
    factory txredisapi's protocol reports to.

    :ivar error: the last error txredisapi reported (a failed AUTH or
        SELECT), or None.
    """

    noisy = False
    #: txredisapi: report a failed AUTH or SELECT here rather than raising.
    isLazy = True

    def __init__(self, target: RedisTarget, reactor: Any, reply_timeout: float | None) -> None:
        self.target = target
        self.reactor = reactor
        self.reply_timeout = reply_timeout
        self.error: str | None = None

    def buildProtocol(self, addr: Any) -> Any:
        protocol = _protocol_class()(
            charset=None, replyTimeout=self.reply_timeout, password=self.target.password,
            dbid=self.target.db, convertNumbers=False, username=self.target.username)
        protocol.factory = self
        return protocol

    def stopTrying(self) -> None:
        """txredisapi: AUTH or SELECT failed; the connection keeps retrying
        (the server may be fixed), the error is kept for the caller."""

    def connectionError(self, why: str) -> None:
        """txredisapi: why the connection failed."""
        self.error = why


class RedisConnection:
    """One connection kept open to a Redis server.

    :param target: the server.
    :param reactor: the reactor to run on.
    :param scripts: :class:`~tbmq_plugins.redis_scripts.Script` objects to
        ``SCRIPT LOAD`` on each new connection before it is used.
    :param on_up: ``on_up(connection)``: the connection is usable (again).
    :param on_down: ``on_down(connection)``: a usable connection was lost.
    :param connect_timeout: seconds to wait for the TCP connection.
    :param reply_timeout: seconds to wait for a reply before dropping the
        connection (txredisapi's ``replyTimeout``), or None.
    :param initial_delay: seconds before the first reconnection attempt;
        each failure doubles it up to ``max_delay``.

    :ivar protocol: the usable txredisapi protocol, or None while
        disconnected.
    """

    def __init__(self, target: RedisTarget, reactor: Any, scripts: Iterable[Any] = (),
                 on_up: Callable[[Any], None] = lambda c: None,
                 on_down: Callable[[Any], None] = lambda c: None,
                 connect_timeout: float = 5.0, reply_timeout: float | None = 10.0,
                 initial_delay: float = 0.1, max_delay: float = 5.0) -> None:
        self.target = target
        self.protocol: Any = None
        self._reactor = reactor
        self._scripts = tuple(scripts)
        self._on_up = on_up
        self._on_down = on_down
        self._factory = _ProtocolFactory(target, reactor, reply_timeout)
        endpoint: Any = HostnameEndpoint(reactor, target.host, target.port,
                                         timeout=connect_timeout)
        if target.tls:
            from twisted.internet.ssl import optionsForClientTLS  # noqa: PLC0415

            endpoint = wrapClientTLS(optionsForClientTLS(target.host), endpoint)
        self._endpoint = endpoint
        self._initial_delay = initial_delay
        self._max_delay = max_delay
        self._failures = 0
        self._stopped = True
        self._attempt: defer.Deferred | None = None
        self._preparing: Any = None
        self._timer: Any = None
        self._waiters: list[defer.Deferred] = []

    def start(self) -> defer.Deferred:
        """Connect, and keep connected until :meth:`stop`.

        :returns: a Deferred firing with None once usable, or failing with
            the first attempt's error (the connection keeps retrying).
        """
        waiter: defer.Deferred = defer.Deferred()
        if self.protocol is not None:
            waiter.callback(None)
            return waiter
        self._waiters.append(waiter)
        if self._stopped:
            self._stopped = False
            self._connect()
        return waiter

    def stop(self) -> defer.Deferred:
        """Stop reconnecting and close the connection.

        :returns: a Deferred firing with None once it is closed.
        """
        self._stopped = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        closing = [p for p in (self.protocol, self._preparing) if p is not None]
        if self._attempt is not None:
            self._attempt.cancel()
        if not closing:
            return defer.succeed(None)
        done = [p.whenDisconnected() for p in closing]
        for p in closing:
            p.transport.loseConnection()
        return defer.gatherResults(done, consumeErrors=True).addCallback(lambda _: None)

    # -- connecting -----------------------------------------------------------

    def _connect(self) -> None:
        self._timer = None
        attempt = self._attempt = self._endpoint.connect(self._factory)
        attempt.addCallback(self._prepare)
        attempt.addCallbacks(self._usable, self._failed)

    def _prepare(self, protocol: Any) -> defer.Deferred:
        """Wait for txredisapi's AUTH and SELECT, then load the scripts.

        :returns: a Deferred firing with the protocol, or failing when the
            connection closes first or a script does not load."""
        self._preparing = protocol
        ready: defer.Deferred = defer.Deferred()

        def gone(_: Any) -> None:
            if self.protocol is protocol:
                self.protocol = None
                if not self._stopped:
                    self._on_down(self)
                    self._schedule()
            elif not ready.called:
                ready.errback(error.ConnectionClosed(
                    self._factory.error or "closed before it was ready"))

        def load(_: Any) -> defer.Deferred:
            return defer.gatherResults(
                [protocol.script_load(s.source) for s in self._scripts], consumeErrors=True)

        def loaded(_: Any) -> None:
            if not ready.called:
                ready.callback(protocol)

        def not_loaded(failure: Failure) -> None:
            if isinstance(failure.value, defer.FirstError):
                failure = failure.value.subFailure
            if not ready.called:
                ready.errback(failure)
            protocol.transport.loseConnection()

        protocol.whenDisconnected().addCallback(gone)
        protocol.whenConnected().addCallback(load).addCallbacks(loaded, not_loaded)
        return ready

    def _usable(self, protocol: Any) -> None:
        self._attempt = self._preparing = None
        if self._stopped:
            protocol.transport.loseConnection()
            return
        self._failures = 0
        self.protocol = protocol
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)
        self._on_up(self)

    def _failed(self, failure: Failure) -> None:
        self._attempt = self._preparing = None
        if self._stopped:
            return
        self._failures += 1
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.errback(failure)
        self._schedule()

    def _schedule(self) -> None:
        """Reconnect after the backoff delay (with 10 % jitter)."""
        if self._stopped or self._timer is not None:
            return
        delay = min(self._max_delay, self._initial_delay * 2 ** self._failures)
        delay *= random.uniform(0.9, 1.1)
        self._timer = self._reactor.callLater(delay, self._connect)
