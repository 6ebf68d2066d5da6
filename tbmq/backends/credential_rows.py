"""What every credential store shares: the rules of ``save`` and the rows
of TBMQ's ``mqtt_client_credentials``.

The memory store (:mod:`tbmq.backends.memory_credentials`), the SQLite
store (:mod:`tbmq.backends.sqlite_credentials`) and the PostgreSQL plugin
(``tbmq_plugins.postgres``) validate and stamp records alike
(:func:`prepare_for_save`, :func:`save_times`, :func:`conflict_message`),
name credential types alike (:func:`type_name`), and the two SQL stores map
rows alike (:data:`CREDENTIALS_COLUMNS`, :func:`credentials_from_row`) and
write them with the same statements (:func:`save_in_transaction`,
:func:`delete_in_transaction`, on any DB-API cursor).  This module imports
no store and no plugin.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from tbmq.auth.rules import AuthorizationRules
from tbmq.errors import CredentialsError
from tbmq.model import ClientType, Credentials, CredentialsType

__all__ = [
    "CREDENTIALS_COLUMNS",
    "TIME_STEP",
    "conflict_message",
    "credentials_from_row",
    "decode_value",
    "delete_in_transaction",
    "encode_value",
    "prepare_for_save",
    "save_in_transaction",
    "save_times",
    "type_name",
]

#: The smallest step between two ``updated_time`` of one record, seconds:
#: a save always moves it forward, even within one clock tick.
TIME_STEP = 1e-6


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
    PostgreSQL ``jsonb`` column is decoded already).
    :raises ValueError: when ``text`` is not JSON."""
    if isinstance(text, dict):
        return text
    return json.loads(text)


def type_name(credentials_type: Any) -> str:
    """:returns: the stored name of a :class:`~tbmq.model.CredentialsType`
    (or of its value), "" for an unknown one (which finds nothing)."""
    try:
        return CredentialsType(credentials_type).value
    except ValueError:
        return ""


#: The columns of ``mqtt_client_credentials`` that make a
#: :class:`~tbmq.model.Credentials`, in :func:`credentials_from_row` order
#: (the SQLite and PostgreSQL stores select them).
CREDENTIALS_COLUMNS = (
    "id, name, credentials_type, credentials_id, client_type, "
    "credentials_value, created_time, updated_time"
)


def credentials_from_row(row: tuple) -> Credentials:
    """:param row: the columns of :data:`CREDENTIALS_COLUMNS`.
    :returns: the record they describe.
    :raises ValueError: for an unknown type name or a value that is not
        JSON."""
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


# -- the SQL stores' writes ------------------------------------------------------------

_UPSERT = (
    "INSERT INTO mqtt_client_credentials (id, created_time, updated_time, name, "
    "client_type, credentials_id, credentials_type, credentials_value, version) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?{cast}, ?) "
    "ON CONFLICT (id) DO UPDATE SET created_time = excluded.created_time, "
    "updated_time = excluded.updated_time, name = excluded.name, "
    "client_type = excluded.client_type, credentials_id = excluded.credentials_id, "
    "credentials_type = excluded.credentials_type, "
    "credentials_value = excluded.credentials_value, version = excluded.version"
)


def _sql(statement: str, paramstyle: str) -> str:
    """:returns: ``statement`` (written with ``?``) in ``paramstyle``:
    ``qmark`` (sqlite3) or ``format`` (psycopg2)."""
    if paramstyle == "qmark":
        return statement
    if paramstyle == "format":
        return statement.replace("?", "%s")
    raise ValueError(f"unsupported paramstyle {paramstyle!r}")


def save_in_transaction(
    cursor: Any,
    record: Credentials,
    value_text: str,
    now: float,
    next_version: Callable[[Any], int],
    paramstyle: str = "qmark",
    value_cast: str = "",
) -> Credentials:
    """Insert or replace ``record`` by id, inside the caller's write
    transaction: refuse a name or (type, credentials id) of another record,
    stamp the times (:func:`save_times`), take the next version, forget the
    id's deletion.

    :param cursor: a DB-API cursor (``execute``, ``fetchone``).
    :param record: the output of :func:`prepare_for_save`; its times are
        set here.
    :param value_text: ``encode_value(record.value)``.
    :param now: the clock, seconds since the epoch.
    :param next_version: ``next_version(cursor) -> int``, the store's change
        counter.
    :param paramstyle: ``qmark`` or ``format``.
    :param value_cast: appended to the value's placeholder (``::jsonb``).
    :returns: ``record``.
    :raises CredentialsError: when the name or the (type, credentials id)
        belongs to another record.
    :raises ValueError: for an unsupported ``paramstyle``.
    """
    for field, where, params, shown in (
        ("name", "name = ?", (record.name,), record.name),
        (
            "id",
            "credentials_type = ? AND credentials_id = ?",
            (record.credentials_type.value, record.credentials_id),
            f"{record.credentials_type.value}:{record.credentials_id}",
        ),
    ):
        cursor.execute(
            _sql(f"SELECT id FROM mqtt_client_credentials WHERE {where} AND id <> ?", paramstyle),
            params + (record.id,),
        )
        row = cursor.fetchone()
        if row is not None:
            raise CredentialsError(conflict_message(field, shown, row[0]))
    cursor.execute(
        _sql("SELECT created_time, updated_time FROM mqtt_client_credentials WHERE id = ?",
             paramstyle),
        (record.id,),
    )
    old = cursor.fetchone()
    record.created_time, record.updated_time = save_times(now, *(old or (None, None)))
    version = next_version(cursor)
    cursor.execute(
        _sql(_UPSERT.format(cast=value_cast), paramstyle),
        (
            record.id,
            record.created_time,
            record.updated_time,
            record.name,
            record.client_type.value,
            record.credentials_id,
            record.credentials_type.value,
            value_text,
            version,
        ),
    )
    cursor.execute(_sql("DELETE FROM deleted_credentials WHERE id = ?", paramstyle), (record.id,))
    return record


def delete_in_transaction(
    cursor: Any, id: str, next_version: Callable[[Any], int], paramstyle: str = "qmark"
) -> bool:
    """Delete the record ``id`` inside the caller's write transaction and
    keep the id in ``deleted_credentials`` with the next version (for
    ``changed_since``).

    :param cursor: a DB-API cursor.
    :param next_version: as for :func:`save_in_transaction`.
    :param paramstyle: ``qmark`` or ``format``.
    :returns: True when a record was removed (the version is taken only
        then).
    """
    cursor.execute(_sql("DELETE FROM mqtt_client_credentials WHERE id = ?", paramstyle), (id,))
    if not cursor.rowcount:
        return False
    cursor.execute(
        _sql("INSERT INTO deleted_credentials (id, version) VALUES (?, ?) "
             "ON CONFLICT (id) DO UPDATE SET version = excluded.version", paramstyle),
        (id, next_version(cursor)),
    )
    return True
