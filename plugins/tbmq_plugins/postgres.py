"""The PostgreSQL credential store (``auth.credentials: postgres``).

TBMQ keeps client credentials in PostgreSQL's ``mqtt_client_credentials``;
so does :class:`PostgresCredentialStore`, with the same columns (the value
as ``jsonb``) plus ``updated_time`` and a ``version`` for
:meth:`~PostgresCredentialStore.changed_since`, so that every node of a
cluster sees changes made on any node (or by ``tbmq credentials``) within
``auth.refresh_interval``.

Queries run through :class:`twisted.enterprise.adbapi.ConnectionPool` with
psycopg2 (``pip install 'tbmq[postgres]'``): blocking calls in the pool's
threads, results in the reactor thread (the life cycle and the handling of
lost connections are :class:`tbmq_plugins.postgres_pool.PostgresBackend`'s).

Versions come from the sequence ``mqtt_client_credentials_version_seq``,
taken under a transaction-scoped advisory lock: writers commit in the order
of their versions, so a reader that has seen version *n* has seen every
change up to *n* and ``changed_since(n)`` never misses one (a bare sequence
hands out numbers out of commit order).

The module is also a plugin: :data:`plugin` implements
:func:`tbmq.hookspecs.tbmq_credential_store`, and
:func:`tbmq.hookspecs.tbmq_device_message_store` with the store of
:mod:`tbmq_plugins.postgres_devices`, registered as the ``tbmq`` entry
point ``postgres``.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from twisted.internet import defer
from twisted.python.failure import Failure
from zope.interface import implementer

from tbmq.backends.credential_rows import CREDENTIALS_COLUMNS as _COLUMNS
from tbmq.backends.credential_rows import credentials_from_row as _record
from tbmq.backends.credential_rows import (
    delete_in_transaction,
    encode_value,
    prepare_for_save,
    save_in_transaction,
    type_name,
)
from tbmq.errors import BackendError, CredentialsError
from tbmq.hookspecs import hookimpl
from tbmq.interfaces import ICredentialStore
from tbmq.model import Credentials, CredentialsType
from tbmq_plugins.postgres_devices import PostgresDeviceMessageStore
from tbmq_plugins.postgres_pool import PostgresBackend, lock_writers, translate

__all__ = ["PostgresCredentialStore", "PostgresPlugin", "plugin"]

#: The key of the advisory lock that serialises writers (and schema
#: creation): ``b"tbmqcred"`` as a big-endian bigint.
LOCK_KEY = int.from_bytes(b"tbmqcred", "big") - (1 << 63)

_SCHEMA = (
    "CREATE SEQUENCE IF NOT EXISTS mqtt_client_credentials_version_seq",
    """CREATE TABLE IF NOT EXISTS mqtt_client_credentials (
        id varchar(255) PRIMARY KEY,
        created_time double precision NOT NULL,
        updated_time double precision NOT NULL,
        name varchar(255) NOT NULL,
        client_type varchar(32) NOT NULL,
        credentials_id text NOT NULL,
        credentials_type varchar(32) NOT NULL,
        credentials_value jsonb NOT NULL,
        version bigint NOT NULL,
        CONSTRAINT mqtt_client_credentials_name_unq UNIQUE (name),
        CONSTRAINT mqtt_client_credentials_id_unq UNIQUE (credentials_type, credentials_id)
    )""",
    """CREATE TABLE IF NOT EXISTS deleted_credentials (
        id varchar(255) PRIMARY KEY,
        version bigint NOT NULL
    )""",
)

#: Created once the tables are known to have the columns.
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS mqtt_client_credentials_version_idx "
    "ON mqtt_client_credentials (version)",
    "CREATE INDEX IF NOT EXISTS deleted_credentials_version_idx "
    "ON deleted_credentials (version)",
)

#: The columns a usable existing table must have.
_REQUIRED_COLUMNS = {
    "id",
    "created_time",
    "updated_time",
    "name",
    "client_type",
    "credentials_id",
    "credentials_type",
    "credentials_value",
    "version",
}



def _lock_writers(txn: Any) -> None:
    """Take the writers' advisory lock until the end of the transaction."""
    lock_writers(txn, LOCK_KEY)


def _next_version(txn: Any) -> int:
    txn.execute("SELECT nextval('mqtt_client_credentials_version_seq')")
    return txn.fetchone()[0]


def _translate(failure: Failure) -> Failure:
    """Turn psycopg2's and adbapi's errors into tbmq's: a unique violation
    is a :class:`~tbmq.errors.CredentialsError`, a lost or refused
    connection a :class:`~tbmq.errors.BackendError`."""
    import psycopg2  # noqa: PLC0415

    error = failure.value
    if isinstance(error, psycopg2.errors.UniqueViolation):
        return Failure(CredentialsError(f"credentials conflict: {error.pgerror or error}"))
    return translate(failure, PostgresCredentialStore.what)


@implementer(ICredentialStore)
class PostgresCredentialStore(PostgresBackend):
    """:class:`~tbmq.interfaces.ICredentialStore` in PostgreSQL.

    :param dsn, min_connections, max_connections, reactor, pool: the
        database and its pool, see
        :class:`~tbmq_plugins.postgres_pool.PostgresBackend`.
    :param clock: the wall clock for ``created_time``/``updated_time``.

    :meth:`start` creates the schema if missing (``CREATE ... IF NOT
    EXISTS``, under the advisory lock, so nodes starting together do not
    race), and fails with :class:`~tbmq.errors.BackendError` when
    PostgreSQL cannot be reached or an existing ``mqtt_client_credentials``
    lacks a column (a TBMQ database, say).

    Calls made before :meth:`start` or after :meth:`stop` fail with
    :class:`~tbmq.errors.BackendError`.  Each call is one transaction;
    writes are applied in the order they were called, reads run on up to
    ``max_connections`` connections at once after the writes called before
    them.
    """

    what = "PostgreSQL credential store"

    def __init__(
        self,
        dsn: str,
        min_connections: int = 1,
        max_connections: int = 5,
        reactor: Any = None,
        pool: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(dsn, min_connections, max_connections, reactor, pool)
        self._clock = clock
        self._last_write: defer.Deferred | None = None

    def _create_schema(self, txn: Any) -> None:
        """In a pool thread: create what is missing, check what exists."""
        _lock_writers(txn)
        for statement in _SCHEMA:
            txn.execute(statement)
        txn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() "
            "AND table_name = 'mqtt_client_credentials'"
        )
        missing = _REQUIRED_COLUMNS - {row[0] for row in txn.fetchall()}
        if missing:
            raise BackendError(
                "table mqtt_client_credentials exists without the column(s) "
                f"{', '.join(sorted(missing))}; is this a TBMQ database?"
            )
        for statement in _INDEXES:
            txn.execute(statement)

    # -- calls --------------------------------------------------------------

    def _run(self, interaction: Callable, *args: Any, write: bool = False) -> defer.Deferred:
        """Run ``interaction(txn, *args)`` in one transaction of the pool.

        Writes run one at a time, in the order they were called, and a read
        starts only once the writes called before it are done (it sees
        them); reads run side by side on the pool's connections
        (ARCHITECTURE §3, calls applied in order).

        :param write: True for a save or delete.
        :returns: a Deferred firing with its result, errors translated
            (:func:`_translate`).
        """
        refused = self._refused()
        if refused is not None:
            return refused
        d: defer.Deferred = defer.Deferred()

        def go(_: Any) -> None:
            self._interaction(interaction, *args).chainDeferred(d)

        previous = self._last_write
        if write:
            done: defer.Deferred = defer.Deferred()
            self._last_write = done
            d.addBoth(lambda result: (done.callback(None), result)[1])
        if previous is None:
            go(None)
        else:
            previous.addCallback(go)
        d.addErrback(_translate)
        return self._track(d)

    def find(self, credentials_type: CredentialsType | str, credentials_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.find` (the
        unique index on (credentials_type, credentials_id)).

        :returns: a Deferred firing with the record, or None.
        """

        def find(txn: Any) -> Credentials | None:
            txn.execute(
                f"SELECT {_COLUMNS} FROM mqtt_client_credentials "
                "WHERE credentials_type = %s AND credentials_id = %s",
                (type_name(credentials_type), credentials_id),
            )
            row = txn.fetchone()
            return None if row is None else _record(row)

        return self._run(find)

    def find_all(self, credentials_type: CredentialsType | str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.find_all`.

        :returns: a Deferred firing with the records of that type, by name.
        """

        def find_all(txn: Any) -> list:
            txn.execute(
                f"SELECT {_COLUMNS} FROM mqtt_client_credentials "
                'WHERE credentials_type = %s ORDER BY name COLLATE "C"',
                (type_name(credentials_type),),
            )
            return [_record(row) for row in txn.fetchall()]

        return self._run(find_all)

    def get(self, id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.get`.

        :returns: a Deferred firing with the record, or None.
        """

        def get(txn: Any) -> Credentials | None:
            txn.execute(f"SELECT {_COLUMNS} FROM mqtt_client_credentials WHERE id = %s", (id,))
            row = txn.fetchone()
            return None if row is None else _record(row)

        return self._run(get)

    def list(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.list`.

        :returns: a Deferred firing with every record, by name in code point
            order (``COLLATE "C"``, as SQLite and the memory store).
        """

        def list_all(txn: Any) -> list:
            txn.execute(
                f'SELECT {_COLUMNS} FROM mqtt_client_credentials ORDER BY name COLLATE "C"'
            )
            return [_record(row) for row in txn.fetchall()]

        return self._run(list_all)

    def save(self, credentials: Credentials) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.save`: insert
        or replace by id, with the next version, under the writers' lock.

        :param credentials: the record; read now, never modified.
        :returns: a Deferred firing with the saved record, or failing with
            :class:`~tbmq.errors.CredentialsError` when it is invalid or its
            name or (type, credentials id) belongs to another record (the
            unique constraints are the last word).
        """
        try:
            record = prepare_for_save(credentials)
            value_text = encode_value(record.value)
        except CredentialsError:
            return defer.fail()
        now = self._clock()

        def save(txn: Any) -> Credentials:
            _lock_writers(txn)
            return save_in_transaction(txn, record, value_text, now, _next_version,
                                       paramstyle="format", value_cast="::jsonb")

        return self._run(save, write=True)

    def delete(self, id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.delete`; the id
        is kept in ``deleted_credentials`` with a new version.

        :returns: a Deferred firing with True when a record was removed.
        """

        def delete(txn: Any) -> bool:
            _lock_writers(txn)
            return delete_in_transaction(txn, id, _next_version, paramstyle="format")

        return self._run(delete, write=True)

    def changed_since(self, version: int) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.changed_since`
        from one REPEATABLE READ snapshot.

        :param version: 0, or the ``new_version`` of an earlier answer; a
            version greater than any in the database (recreated tables)
            counts as 0.
        :returns: a Deferred firing with ``(changed, deleted_ids,
            new_version)``: records saved after ``version`` by name, ids
            deleted after it (sorted), and the highest version committed.
        """
        since = int(version)

        def changed_since(txn: Any) -> tuple:
            txn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            txn.execute(
                "SELECT GREATEST("
                "(SELECT COALESCE(max(version), 0) FROM mqtt_client_credentials), "
                "(SELECT COALESCE(max(version), 0) FROM deleted_credentials))"
            )
            current = txn.fetchone()[0]
            after = since if since <= current else 0
            txn.execute(
                f"SELECT {_COLUMNS} FROM mqtt_client_credentials WHERE version > %s "
                'ORDER BY name COLLATE "C"',
                (after,),
            )
            changed = [_record(row) for row in txn.fetchall()]
            txn.execute(
                'SELECT id FROM deleted_credentials WHERE version > %s ORDER BY id COLLATE "C"',
                (after,),
            )
            deleted = [row[0] for row in txn.fetchall()]
            return changed, deleted, current

        return self._run(changed_since)


class PostgresPlugin:
    """Provides ``auth.credentials: postgres``
    (:func:`tbmq.hookspecs.tbmq_credential_store`) and
    ``storage.device_store: postgres``
    (:func:`tbmq.hookspecs.tbmq_device_message_store`)."""

    @hookimpl
    def tbmq_credential_store(
        self, config: Any, reactor: Any = None
    ) -> PostgresCredentialStore | None:
        """:param config: the :class:`tbmq.config.Config`.
        :param reactor: the reactor of the store's pool; the global one
            when None.
        :returns: a :class:`PostgresCredentialStore` on ``config.postgres``
            when ``config.auth.credentials`` is ``postgres``, else None."""
        if config.auth.credentials != "postgres":
            return None
        pg = config.postgres
        return PostgresCredentialStore(pg.dsn, pg.min_connections, pg.max_connections,
                                       reactor=reactor)


    @hookimpl
    def tbmq_device_message_store(self, config: Any) -> PostgresDeviceMessageStore | None:
        """:param config: the :class:`tbmq.config.Config`.
        :returns: a :class:`~tbmq_plugins.postgres_devices.PostgresDeviceMessageStore`
            on ``config.postgres`` keeping at most
            ``storage.max_messages_per_client`` per client, when
            ``storage.device_store`` names ``postgres``; else None."""
        if config.storage.device_store_name != "postgres":
            return None
        pg = config.postgres
        return PostgresDeviceMessageStore(pg.dsn, pg.min_connections, pg.max_connections,
                                          config.storage.max_messages_per_client)


#: The plugin object of the ``tbmq`` entry point ``postgres``.
plugin = PostgresPlugin()
