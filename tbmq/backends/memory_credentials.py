"""The in-memory credential store.

:class:`MemoryCredentialStore` implements
:class:`~tbmq.interfaces.ICredentialStore` with already-fired Deferreds
(``auth.credentials: memory``); nothing survives a restart.  It is also the
reference the contract suite holds the SQLite and PostgreSQL stores to.  It
validates and stamps records with the rules every credential store applies
on ``save`` (:mod:`tbmq.backends.credential_rows`).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Callable, Iterable

from twisted.internet import defer
from zope.interface import implementer

from tbmq.backends.credential_rows import (
    conflict_message,
    prepare_for_save,
    save_times,
)
from tbmq.errors import CredentialsError
from tbmq.interfaces import ICredentialStore
from tbmq.model import Credentials, CredentialsType

__all__ = ["MemoryCredentialStore", "copy_credentials"]


def copy_credentials(credentials: Credentials) -> Credentials:
    """:param credentials: a :class:`~tbmq.model.Credentials`.
    :returns: an independent copy (the ``value`` document deep-copied)."""
    return dataclasses.replace(credentials, value=copy.deepcopy(credentials.value))


def _by_name(records: Iterable[Credentials]) -> list[Credentials]:
    return sorted(records, key=lambda c: c.name)


@implementer(ICredentialStore)
class MemoryCredentialStore:
    """:class:`~tbmq.interfaces.ICredentialStore` in a dict of this process.

    :param clock: the wall clock, seconds since the epoch
        (:func:`time.time`).

    Records are copied on the way in and out; every call returns an
    already-fired Deferred, so calls are applied in order.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._records: dict[str, Credentials] = {}
        self._versions: dict[str, int] = {}
        self._by_key: dict[tuple[CredentialsType, str], str] = {}
        self._by_name: dict[str, str] = {}
        self._deleted: dict[str, int] = {}
        self._version = 0

    def start(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.start` (nothing to open).

        :returns: a fired Deferred.
        """
        return defer.succeed(None)

    def stop(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.stop` (the records stay,
        for a later start).

        :returns: a fired Deferred.
        """
        return defer.succeed(None)

    def find(self, credentials_type: CredentialsType | str, credentials_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.find`.

        :param credentials_type: a :class:`~tbmq.model.CredentialsType` or
            its name.
        :param credentials_id: the lookup key (exact match).
        :returns: a Deferred firing with a copy of the record, or None.
        """
        try:
            key = (CredentialsType(credentials_type), credentials_id)
        except ValueError:
            return defer.succeed(None)
        record_id = self._by_key.get(key)
        if record_id is None:
            return defer.succeed(None)
        return defer.succeed(copy_credentials(self._records[record_id]))

    def find_all(self, credentials_type: CredentialsType | str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.find_all`.

        :returns: a Deferred firing with copies of the records of that
            type, by name (an unknown type has none).
        """
        try:
            wanted = CredentialsType(credentials_type)
        except ValueError:
            return defer.succeed([])
        return defer.succeed(
            [
                copy_credentials(c)
                for c in _by_name(self._records.values())
                if c.credentials_type == wanted
            ]
        )

    def get(self, id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.get`.

        :returns: a Deferred firing with a copy of the record, or None.
        """
        record = self._records.get(id)
        return defer.succeed(None if record is None else copy_credentials(record))

    def list(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.list`.

        :returns: a Deferred firing with copies of every record, ordered by
            name (code point order, as the SQL stores' binary collation).
        """
        return defer.succeed([copy_credentials(c) for c in _by_name(self._records.values())])

    def save(self, credentials: Credentials) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.save`.

        :param credentials: the record; read now, never modified.
        :returns: a Deferred firing with a copy of the saved record (its
            times set, see
            :func:`~tbmq.backends.credential_rows.save_times`), or failing with
            :class:`~tbmq.errors.CredentialsError` when it is invalid or
            its name or (type, credentials id) belongs to another record.
        """
        try:
            record = prepare_for_save(credentials)
            key = (record.credentials_type, record.credentials_id)
            other = self._by_name.get(record.name)
            if other is not None and other != record.id:
                raise CredentialsError(conflict_message("name", record.name, other))
            other = self._by_key.get(key)
            if other is not None and other != record.id:
                raise CredentialsError(
                    conflict_message(
                        "id", f"{key[0].value}:{record.credentials_id}", other
                    )
                )
        except CredentialsError:
            return defer.fail()
        old = self._records.get(record.id)
        if old is not None:
            del self._by_name[old.name]
            del self._by_key[(old.credentials_type, old.credentials_id)]
        record.created_time, record.updated_time = save_times(
            self._clock(),
            None if old is None else old.created_time,
            None if old is None else old.updated_time,
        )
        self._version += 1
        self._records[record.id] = record
        self._versions[record.id] = self._version
        self._by_name[record.name] = record.id
        self._by_key[key] = record.id
        self._deleted.pop(record.id, None)
        return defer.succeed(copy_credentials(record))

    def delete(self, id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.delete`.

        :returns: a Deferred firing with True when a record was removed,
            False when there was none.
        """
        record = self._records.pop(id, None)
        if record is None:
            return defer.succeed(False)
        del self._versions[id]
        del self._by_name[record.name]
        del self._by_key[(record.credentials_type, record.credentials_id)]
        self._version += 1
        self._deleted[id] = self._version
        return defer.succeed(True)

    def unchanged_since(self, version: int) -> bool:
        """Know at once that nothing changed after ``version`` (every write
        goes through this store).

        :returns: True when :meth:`changed_since` would answer ``([], [],
            version)``."""
        return version == self._version

    def changed_since(self, version: int) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ICredentialStore.changed_since`.

        :param version: 0, or the ``new_version`` of an earlier answer.  A
            version this store never gave (greater than its current one)
            counts as 0.
        :returns: a Deferred firing with ``(changed, deleted_ids,
            new_version)``: the records saved after ``version`` by name,
            the ids deleted after it (and not saved again), and the version
            to pass next time.
        """
        if version > self._version:
            version = 0
        changed = [
            copy_credentials(self._records[i])
            for i, v in self._versions.items()
            if v > version
        ]
        deleted = sorted(i for i, v in self._deleted.items() if v > version)
        return defer.succeed((_by_name(changed), deleted, self._version))
