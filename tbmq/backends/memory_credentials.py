"""The in-memory credential store, and what every credential store shares.

:class:`MemoryCredentialStore` implements
:class:`~tbmq.interfaces.ICredentialStore` with already-fired Deferreds
(``auth.credentials: memory``); nothing survives a restart.  It is also the
reference the contract suite holds the SQLite and PostgreSQL stores to.

The helpers (:func:`prepare_for_save`, :func:`save_times`,
:func:`encode_value`, :func:`decode_value`, :func:`copy_credentials`) are the
rules all three stores apply on ``save``, so they validate and stamp records
alike.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from typing import Any, Callable, Iterable

from twisted.internet import defer
from zope.interface import implementer

from tbmq.auth.rules import AuthorizationRules
from tbmq.errors import CredentialsError
from tbmq.interfaces import ICredentialStore
from tbmq.model import ClientType, Credentials, CredentialsType

__all__ = [
    "CREDENTIALS_COLUMNS",
    "MemoryCredentialStore",
    "credentials_from_row",
    "copy_credentials",
    "decode_value",
    "encode_value",
    "prepare_for_save",
    "save_times",
]

#: The smallest step between two ``updated_time`` of one record, seconds:
#: a save always moves it forward, even within one clock tick.
TIME_STEP = 1e-6


def copy_credentials(credentials: Credentials) -> Credentials:
    """:param credentials: a :class:`~tbmq.model.Credentials`.
    :returns: an independent copy (the ``value`` document deep-copied)."""
    return dataclasses.replace(credentials, value=copy.deepcopy(credentials.value))


def encode_value(value: Any) -> str:
    """Serialise a credentials value to JSON text (TBMQ's
    ``credentials_value``), non-ASCII characters kept as they are.

    :raises CredentialsError: when it is not JSON (bytes, sets, NaN ...).
    """
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise CredentialsError(f"credentials value is not JSON: {e}") from None


def decode_value(text: str | bytes | dict) -> dict:
    """:returns: the value of JSON ``text`` (a dict passes through, as a
    PostgreSQL ``jsonb`` column is decoded already)."""
    if isinstance(text, dict):
        return text
    return json.loads(text)


#: The columns of ``mqtt_client_credentials`` that make a
#: :class:`~tbmq.model.Credentials`, in :func:`credentials_from_row` order
#: (the SQLite and PostgreSQL stores select them).
CREDENTIALS_COLUMNS = (
    "id, name, credentials_type, credentials_id, client_type, "
    "credentials_value, created_time, updated_time"
)


def credentials_from_row(row: tuple) -> Credentials:
    """:param row: the columns of :data:`CREDENTIALS_COLUMNS`.
    :returns: the record they describe."""
    id_, name, ctype, cid, client_type, value, created, updated = row
    return Credentials(
        id=id_,
        name=name,
        credentials_type=CredentialsType(ctype),
        credentials_id=cid,
        client_type=ClientType(client_type),
        value=decode_value(value),
        created_time=created,
        updated_time=updated,
    )


def _non_empty(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise CredentialsError(f"credentials {field} must be a non-empty string, not {value!r}")
    return value


def prepare_for_save(credentials: Credentials) -> Credentials:
    """Check a record before it is stored and return a normalised copy.

    TBMQ validates credentials on save: the auth rule patterns must be valid
    regexes (``AuthRulesUtil.validateAndCompileAuthRules``).

    :param credentials: the record to save; not modified.
    :returns: a copy with enum fields as :class:`~tbmq.model.CredentialsType`
        and :class:`~tbmq.model.ClientType` and the value deep-copied
        through JSON (so it is exactly what a reload gives back).
    :raises CredentialsError: for an empty ``id``, ``name`` or
        ``credentials_id``, an unknown type, a value that is not a JSON
        object, or invalid ``authRules``.
    """
    if not isinstance(credentials, Credentials):
        raise CredentialsError(f"expected Credentials, not {type(credentials).__name__}")
    _non_empty(credentials.id, "id")
    _non_empty(credentials.name, "name")
    _non_empty(credentials.credentials_id, "credentials_id")
    try:
        credentials_type = CredentialsType(credentials.credentials_type)
    except ValueError:
        raise CredentialsError(
            f"unknown credentials type {credentials.credentials_type!r}"
        ) from None
    try:
        client_type = ClientType(credentials.client_type)
    except ValueError:
        raise CredentialsError(f"unknown client type {credentials.client_type!r}") from None
    if not isinstance(credentials.value, dict):
        raise CredentialsError("credentials value must be a JSON object")
    value = json.loads(encode_value(credentials.value))
    AuthorizationRules.from_value(value.get("authRules"))
    return dataclasses.replace(
        credentials,
        credentials_type=credentials_type,
        client_type=client_type,
        value=value,
    )


def save_times(
    now: float, created_time: float | None, updated_time: float | None
) -> tuple[float, float]:
    """The timestamps of a record being saved.

    :param now: the clock, seconds since the epoch.
    :param created_time: the stored record's, or None when it is new.
    :param updated_time: the stored record's, or None when it is new.
    :returns: ``(created_time, updated_time)``: a new record is created
        now; a replaced one keeps its creation time and its update time
        moves forward by at least :data:`TIME_STEP`.
    """
    if created_time is None or updated_time is None:
        return now, now
    return created_time, max(now, updated_time + TIME_STEP)


def conflict_message(field: str, value: Any, other_id: str) -> str:
    """:returns: the message of a unique-constraint :class:`CredentialsError`."""
    return f"credentials {field} {value!r} belongs to another record ({other_id})"


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
            times set, see :func:`save_times`), or failing with
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
