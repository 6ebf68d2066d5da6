"""What the PostgreSQL stores share (the credential store of
:mod:`tbmq_plugins.postgres`, the device store of
:mod:`tbmq_plugins.postgres_devices`): :class:`PostgresBackend`, the life
cycle of a store on a :class:`twisted.enterprise.adbapi.ConnectionPool` of
psycopg2 connections, and the translation of their errors.

Queries run in the pool's threads, results arrive in the reactor thread.
``cp_reconnect`` replaces a connection the server dropped.  A transaction
that finds its connection dead (the server restarted, or an administrator
terminated the backend, while it sat idle in the pool) runs once more on a
new connection: nothing of it had been committed.  When that fails too,
the call fails with :class:`~tbmq.errors.BackendError`, and the next one
tries a new connection again.
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq.errors import BackendError
from tbmq.log import OBSERVER as LOG_OBSERVER

__all__ = ["PostgresBackend", "lock_writers", "translate"]

log = Logger(observer=LOG_OBSERVER)


def _connection_errors() -> tuple:
    import psycopg2  # noqa: PLC0415
    from twisted.enterprise.adbapi import ConnectionLost  # noqa: PLC0415

    return psycopg2.OperationalError, psycopg2.InterfaceError, ConnectionLost


def translate(failure: Failure, what: str) -> Failure:
    """:param what: the store, for the message (``"PostgreSQL device
        store"``).
    :returns: a :class:`~tbmq.errors.BackendError` failure for a lost or
        refused connection (psycopg2's ``OperationalError`` and
        ``InterfaceError``, adbapi's ``ConnectionLost``), else ``failure``.
    """
    if failure.check(*_connection_errors()):
        return Failure(BackendError(f"{what}: {failure.getErrorMessage().strip()}"))
    return failure


def lock_writers(txn: Any, key: int) -> None:
    """Take the transaction-scoped advisory lock ``key`` (a bigint)."""
    txn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))


def _on_a_live_connection(interaction: Callable) -> Callable:
    """:returns: ``interaction(txn, *args)``, run once more on a new
    connection when it fails on a connection that turns out closed."""

    def run(txn: Any, *args: Any) -> Any:
        try:
            return interaction(txn, *args)
        except _connection_errors():
            if not txn.connection.closed:
                raise
        txn.reconnect()
        txn.reopen()
        return interaction(txn, *args)

    return run


class PostgresBackend:
    """The life cycle of a PostgreSQL store: the pool, the schema, the calls
    in flight.

    :param dsn: a libpq connection string (``host=... port=... dbname=...``)
        or URI.
    :param min_connections: connections the pool keeps open, >= 1.
    :param max_connections: the pool's upper bound (and threads).
    :param reactor: the reactor of the pool; the global one when None.
    :param pool: a started-on-demand :class:`~twisted.enterprise.adbapi.ConnectionPool`
        to use instead of making one (its owner closes it); when None
        :meth:`start` makes ``ConnectionPool("psycopg2", dsn, cp_min,
        cp_max, cp_reconnect=True)`` and :meth:`stop` closes it.

    A subclass names itself in :attr:`what` and creates its tables in
    :meth:`_create_schema`.
    """

    #: The store, in messages.
    what = "PostgreSQL store"

    def __init__(self, dsn: str, min_connections: int = 1, max_connections: int = 5,
                 reactor: Any = None, pool: Any = None) -> None:
        self.dsn = dsn
        self.min_connections = max(1, int(min_connections))
        self.max_connections = max(self.min_connections, int(max_connections))
        self._reactor = reactor
        self._given_pool = pool
        self._pool: Any = pool
        self._running = False
        self._starting: list[defer.Deferred] | None = None
        self._pending: set[defer.Deferred] = set()

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._running

    def start(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.start`: make the pool
        and create the schema if missing (:meth:`_create_schema`, in one
        transaction).

        :returns: a Deferred firing with None when usable, or failing with
            :class:`~tbmq.errors.BackendError` when PostgreSQL cannot be
            reached or the schema is not the store's.
        """
        if self._running:
            return defer.succeed(None)
        waiter: defer.Deferred = defer.Deferred()
        if self._starting is not None:
            self._starting.append(waiter)
            return waiter
        self._starting = [waiter]
        try:
            if self._pool is None:
                from twisted.enterprise import adbapi  # noqa: PLC0415

                kwargs: dict = {}
                if self._reactor is not None:
                    kwargs["cp_reactor"] = self._reactor
                self._pool = adbapi.ConnectionPool(
                    "psycopg2", self.dsn, cp_min=self.min_connections,
                    cp_max=self.max_connections, cp_reconnect=True, cp_noisy=False, **kwargs)
        except Exception:
            self._starting = None
            return defer.fail()
        d = self._pool.runInteraction(_on_a_live_connection(self._create_schema))
        d.addErrback(translate, self.what)
        d.addBoth(self._started)
        return waiter

    def _started(self, result: Any) -> None:
        waiters, self._starting = self._starting or [], None
        if isinstance(result, Failure):
            log.failure("cannot start the {what}", result, what=self.what)
            self._close_pool()
            for d in waiters:
                d.errback(result)
            return
        self._running = True
        for d in waiters:
            d.callback(None)

    def _create_schema(self, txn: Any) -> None:
        """In a pool thread: create what is missing, check what exists.

        :raises BackendError: when existing tables are not the store's."""
        raise NotImplementedError

    def stop(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.stop`: wait for the
        calls accepted so far, then close the pool (if this store made it).

        :returns: a Deferred firing with None when closed.
        """
        self._running = False
        pending = list(self._pending)
        d = defer.DeferredList(pending, consumeErrors=True) if pending else defer.succeed(None)
        d.addCallback(lambda _: self._close_pool())
        return d

    def _close_pool(self) -> None:
        """Close our own pool; its threads are idle, so this does not wait."""
        if self._given_pool is None and self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()

    def _refused(self) -> defer.Deferred | None:
        """:returns: a failed Deferred when the store does not take calls
        (not started, or stopped), else None."""
        if self._running:
            return None
        return defer.fail(BackendError(f"{self.what} is not running"))

    def _track(self, d: defer.Deferred) -> defer.Deferred:
        """Count ``d`` among the calls :meth:`stop` waits for.

        :returns: ``d``."""
        self._pending.add(d)

        def finished(result: Any) -> Any:
            self._pending.discard(d)
            return result

        return d.addBoth(finished)

    def _interaction(self, interaction: Callable, *args: Any) -> defer.Deferred:
        """Run ``interaction(txn, *args)`` in one transaction of the pool (once
        more on a new connection when its connection was dead).

        :returns: a Deferred firing with its result, connection errors
            turned into :class:`~tbmq.errors.BackendError`."""
        d = self._pool.runInteraction(_on_a_live_connection(interaction), *args)
        return d.addErrback(translate, self.what)
