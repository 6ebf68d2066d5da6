"""The embedded store: retained messages, deliveries and the in-process
bus's topic log (which keeps the sessions and subscriptions) in one SQLite
file, used from one dedicated thread.

:class:`SQLiteStore` puts the stores of the embedded store file on one
:class:`~tbmq.backends.sqlite_runner.SQLiteRunner` (its queue, thread,
transactions and life cycle are described there): each call becomes an
operation of the next transaction, and its Deferred fires after the COMMIT
that made it durable.  Values are serialised in the reactor thread when the
call is made, so a caller may mutate a record as soon as the call returns.
The views :attr:`SQLiteStore.retained`, :attr:`SQLiteStore.deliveries`
(:mod:`tbmq.backends.sqlite_deliveries`) and :attr:`SQLiteStore.topic_log`
(:mod:`tbmq.backends.sqlite_topic_log`, the in-process bus's) each provide
one interface and share the connection.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from twisted.internet import defer
from zope.interface import implementer

from tbmq.backends.sqlite_deliveries import SQLiteDeviceMessageStore
from tbmq.backends.sqlite_runner import SYNCHRONOUS_MODES, Operation, SQLiteRunner
from tbmq.backends.sqlite_schema import (
    EMBEDDED_SCHEMA,
    SCHEMA_VERSION,
    message_columns,
    message_from,
)
from tbmq.backends.sqlite_topic_log import SQLiteTopicLog
from tbmq.backends.sqlite_view import OnRunner, RunnerView
from tbmq.interfaces import IRetainedStore
from tbmq.model import Message

__all__ = [
    "FILE_NAME",
    "SCHEMA_VERSION",
    "SYNCHRONOUS_MODES",
    "SQLiteRetainedStore",
    "SQLiteStore",
]

#: The file name of the embedded store in the data directory.
FILE_NAME = "tbmq.sqlite3"


class SQLiteStore(OnRunner):
    """The embedded store of retained messages, deliveries and the topic
    log of the in-process bus.

    :param path: the database file (its directory is created if missing), or
        ``":memory:"``; ignored when ``runner`` is given.
    :param reactor: the reactor that receives results; the global one when
        None (ignored when ``runner`` is given).
    :param threadpool: the pool running database work.  When None the store
        creates, starts and stops its own ``ThreadPool(1, 1)``; a pool given
        here must run one call at a time and is started and stopped by its
        owner (tests pass a synchronous one).  Ignored when ``runner`` is
        given.
    :param synchronous: ``PRAGMA synchronous``, one of
        :data:`~tbmq.backends.sqlite_runner.SYNCHRONOUS_MODES`; ``FULL`` by
        default, so that no acknowledged message is lost even on power
        loss.  Ignored when ``runner`` is given.
    :param runner: the :class:`~tbmq.backends.sqlite_runner.SQLiteRunner`
        of the file, shared with other stores; a new one when None.
    :param max_messages_per_client: the most deliveries the device store
        keeps per client (the oldest are removed beyond it); None for no
        limit.
    :raises ValueError: for an unknown ``synchronous`` mode, or a limit
        below 1.
    :raises TypeError: when neither ``path`` nor ``runner`` is given.

    The store is running while its runner is: between a successful
    :meth:`start` and :meth:`stop`, or while one of its views is started.
    Calls made at other times fail with :class:`~tbmq.errors.BackendError`;
    calls made while it is starting wait for the database to open.
    """

    def __init__(
        self,
        path: str | None = None,
        reactor: Any = None,
        threadpool: Any = None,
        synchronous: str = "FULL",
        runner: SQLiteRunner | None = None,
        max_messages_per_client: int | None = None,
    ) -> None:
        if runner is None:
            if path is None:
                raise TypeError("SQLiteStore needs a path or a runner")
            runner = SQLiteRunner(path, reactor, threadpool, synchronous)
        self.runner = runner
        self.retained = SQLiteRetainedStore(runner)
        self.deliveries = SQLiteDeviceMessageStore(runner, max_messages_per_client)
        self.topic_log = SQLiteTopicLog(runner)

    def start(self) -> defer.Deferred:
        """Open the database and create the schema
        (:meth:`tbmq.interfaces.IBackend.start`); see
        :meth:`~tbmq.backends.sqlite_runner.SQLiteRunner.start`.

        :returns: a Deferred firing with None when the store is usable.
        """
        return self.runner.start()

    def stop(self) -> defer.Deferred:
        """Write what was accepted, then close the file, for every store on
        it (:meth:`tbmq.interfaces.IBackend.stop`).

        :returns: a Deferred firing with None when closed.
        """
        return self.runner.stop()

    def submit(self, operation: Operation, write: bool = True) -> defer.Deferred:
        """Queue ``operation`` in the next transaction; see
        :meth:`~tbmq.backends.sqlite_runner.SQLiteRunner.submit`."""
        return self.runner.submit(operation, write)


@implementer(IRetainedStore)
class SQLiteRetainedStore(RunnerView):
    """:class:`~tbmq.interfaces.IRetainedStore` on the table ``retained``
    (one row per topic name, properties serialised as MQTT v5 properties).

    :param runner: the runner of the embedded store file.
    """

    def __init__(self, runner: SQLiteRunner) -> None:
        super().__init__(runner, EMBEDDED_SCHEMA)

    def load_all(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IRetainedStore.load_all`.

        :returns: a Deferred firing with a ``list[Message]`` ordered by topic.
        """

        def load_all(conn: sqlite3.Connection) -> list[Message]:
            rows = conn.execute(
                "SELECT topic, payload, qos, retain, properties, publisher, "
                "received_at, expires_at FROM retained ORDER BY topic"
            ).fetchall()
            return [message_from(row) for row in rows]

        return self._submit(load_all, write=False)

    def put(self, message: Message) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IRetainedStore.put`
        [MQTT-3.3.1-5].

        :param message: the :class:`~tbmq.model.Message`; its values are read
            now.
        :returns: a Deferred firing with None when committed.
        """

        def build() -> Operation:
            row = message_columns(message)

            def put(conn: sqlite3.Connection) -> None:
                conn.execute(
                    "INSERT OR REPLACE INTO retained VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )

            return put

        return self._call(build)

    def remove(self, topic: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IRetainedStore.remove`
        [MQTT-3.3.1-6].

        :param topic: the topic name; a topic without one is ignored.
        :returns: a Deferred firing with None when committed.
        """

        def remove(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM retained WHERE topic = ?", (topic,))

        return self._submit(remove)
