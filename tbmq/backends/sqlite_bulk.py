"""Many rows in few SQLite statements, for the database thread of
:class:`~tbmq.backends.sqlite_runner.SQLiteRunner`.

:mod:`sqlite3` releases the GIL around every step of a statement, and
``executemany`` steps once per row: each row then waits for the GIL again,
which the reactor thread holds while it works (up to the interpreter's
switch interval, 5 ms, each time).  Under load that wait, not SQLite, was
what a delivery written or deleted cost.  Here a batch's rows go in
statements of up to :data:`CHUNK_ROWS` rows each (a multi-row ``VALUES``, a
``seq IN (...)`` list): one step, one wait, per statement.
"""

from __future__ import annotations

import json
import sqlite3
from itertools import chain
from typing import Iterable, Sequence

__all__ = ["CHUNK_ROWS", "bind_as_is", "by_first", "delete_listed", "delete_seqs", "has_json",
           "insert_rows", "update_states"]

def bind_as_is() -> None:
    """Register :mod:`sqlite3` adapters that give ``bytes`` and ``None``
    values back as they are (both bind as before: a BLOB, a NULL).

    :mod:`sqlite3` binds an exact ``int``, ``float``, ``str`` or
    ``bytearray`` directly; any other value -- ``bytes`` and ``None``
    included -- goes through its adapter protocol: a look-up of
    ``(type, PrepareProtocol)`` in ``sqlite3.adapters``, then, when none is
    registered, ``PrepareProtocol.__adapt__`` and ``value.__conform__``, whose
    first miss formats an ``AttributeError`` (about 1,200 instructions per
    value, counted with callgrind; three per message queued for an offline
    session: the delivery row's message is ``bytes``, its subscription
    identifiers and packet identifier ``None``; the topic log's records are
    ``bytes`` too).  A registered adapter ends the look-up at the first step;
    both are C callables (``bytes`` of an exact ``bytes`` is that object,
    ``{}.get`` answers None).  The registry is the process's; registering
    again replaces the entries with the same callables.
    """
    sqlite3.register_adapter(bytes, bytes)
    sqlite3.register_adapter(type(None), _NONE)


#: a C callable whose answer is None (the adapter of ``None``)
_NONE = {}.get

#: Most rows per statement: 64 rows (of 8 columns for ``deliveries``, 5 for
#: the topic log) stay below 999 bound parameters, the smallest limit of an
#: SQLite build (before 3.32).
CHUNK_ROWS = 64

#: the values of rows, one after another (a C loop, not a comprehension's)
_flat = chain.from_iterable

#: (table, columns, rows, tail) → the INSERT statement's text, made once
_INSERTS: dict[tuple[str, int, int, str], str] = {}


def _insert_sql(table: str, width: int, n: int, replace: bool, tail: str = "") -> str:
    key = (table if not replace else "!" + table, width, n, tail)
    sql = _INSERTS.get(key)
    if sql is None:
        row = "(" + ",".join("?" * width) + tail + ")"
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        sql = _INSERTS[key] = f"{verb} INTO {table} VALUES " + ",".join([row] * n)
    return sql


def insert_rows(conn: sqlite3.Connection, table: str, rows: Sequence[Sequence],
                width: int, replace: bool = True, tail: str = "",
                columns: Sequence[str] = (), nullable: Sequence[int] = ()) -> None:
    """Insert ``rows`` (each ``width`` values, in the table's column order)
    into ``table``, :data:`CHUNK_ROWS` per statement, in order (a later row
    of the same key replaces an earlier one when ``replace``).

    :param table: a table name of the schema (never client input).
    :param tail: SQL literals of the columns after the ``width`` bound ones,
        the same for every row, with a leading comma (``",NULL,0"``).
    :param columns: the table's column names, in order (with ``nullable``).
    :param nullable: indexes of columns whose default is NULL: one that is
        None in every row of a statement's chunk is left out of it (its
        default binds nothing: :mod:`sqlite3` passes a None through its
        adapter protocol, about 1,800 instructions per value with the bind,
        counted with callgrind; a message queued for an offline session has
        two, its subscription identifiers and packet identifier).
    :raises sqlite3.Error: as the statement does.
    """
    n = len(rows)
    for start in range(0, n, CHUNK_ROWS):
        chunk = rows[start:start + CHUNK_ROWS]
        values = list(_flat(chunk))
        if nullable:
            size = len(chunk)
            # a column's values are a slice of the flat list: counted, and
            # taken out, by C loops (no tuple per row)
            unset = [i for i in nullable if values[i::width].count(None) == size]
            if unset:
                left = width
                for i in reversed(unset):  # the higher first: the lower keep their place
                    del values[i::left]
                    left -= 1
                conn.execute(_insert_some_sql(table, columns, tuple(unset), width, size,
                                              replace), values)
                continue
        conn.execute(_insert_sql(table, width, len(chunk), replace, tail), values)


#: (table, columns left out, rows, replace) → the INSERT statement naming
#: its columns, made once
_SOME_INSERTS: dict[tuple, str] = {}


def _insert_some_sql(table: str, columns: Sequence[str], unset: tuple, width: int, n: int,
                     replace: bool) -> str:
    key = (table, unset, n, replace)
    sql = _SOME_INSERTS.get(key)
    if sql is None:
        names = [columns[i] for i in range(width) if i not in unset]
        row = "(" + ",".join("?" * len(names)) + ")"
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        sql = _SOME_INSERTS[key] = (f"{verb} INTO {table} ({','.join(names)}) VALUES "
                                    + ",".join([row] * n))
    return sql


def delete_seqs(conn: sqlite3.Connection, keys: Iterable[tuple[str, int]]) -> None:
    """Delete the rows of ``deliveries`` whose ``(client_id, seq)`` is in
    ``keys`` (unknown keys are ignored): per client, one statement whose
    seqs are one JSON array bound as one value (``seq IN (SELECT value FROM
    json_each(?))``), so a drain's removals of a transaction are one step
    and one wait for the GIL, not one per :data:`CHUNK_ROWS` rows; with an
    SQLite without JSON functions, or a few seqs, ``seq IN (...)`` lists of
    up to :data:`CHUNK_ROWS` seqs."""
    for client_id, seqs in by_first(keys).items():
        if len(seqs) > CHUNK_ROWS and has_json(conn):
            conn.execute(_DELETE_JSON, (client_id, _json_array(seqs)))
            continue
        delete_listed(conn, "DELETE FROM deliveries WHERE client_id = ? AND seq IN (",
                      client_id, seqs)


def by_first(pairs: Iterable[tuple]) -> dict:
    """:returns: ``{first: [second, ...]}`` of ``pairs`` (two values each),
    the seconds in the order of the pairs."""
    grouped: dict = {}
    for first, second in pairs:
        held = grouped.get(first)
        if held is None:
            grouped[first] = [second]
        else:
            held.append(second)
    return grouped


def delete_listed(conn: sqlite3.Connection, head: str, group, values: list) -> None:
    """Run ``head`` (a DELETE ending in ``... = ? AND <column> IN (``) for
    ``group`` and ``values``, :data:`CHUNK_ROWS` values per statement: one
    step and one wait for the GIL per statement, not per value.

    :param head: SQL of the schema (never client input), its first
        parameter ``group``."""
    for start in range(0, len(values), CHUNK_ROWS):
        chunk = values[start:start + CHUNK_ROWS]
        conn.execute(_listed_sql(head, len(chunk)), [group, *chunk])


#: (head, values) → the statement of :func:`delete_listed`, made once
_LISTED: dict[tuple[str, int], str] = {}


def _listed_sql(head: str, n: int) -> str:
    sql = _LISTED.get((head, n))
    if sql is None:
        sql = _LISTED[head, n] = head + ",".join("?" * n) + ")"
    return sql


_DELETE_JSON = ("DELETE FROM deliveries WHERE client_id = ? "
                "AND seq IN (SELECT value FROM json_each(?))")

#: a list of ints as a JSON array (a C loop)
_json_array = json.JSONEncoder(separators=(",", ":")).encode

#: whether the SQLite library has ``json_each`` (built in since 3.38, an
#: extension before), found out at the first use
_JSON: list[bool] = []


def has_json(conn: sqlite3.Connection) -> bool:
    """:returns: True when ``conn``'s SQLite library has ``json_each``
    (the answer is the library's, asked once per process)."""
    if not _JSON:
        try:
            conn.execute("SELECT count(*) FROM json_each('[1]')").fetchone()
        except sqlite3.OperationalError:
            _JSON.append(False)
        else:
            _JSON.append(True)
    return _JSON[0]


def update_states(conn: sqlite3.Connection,
                  updates: Iterable[tuple[tuple[str, int], tuple[int | None, int]]]) -> None:
    """Set ``packet_id`` and ``state`` of rows of ``deliveries``:
    ``((client_id, seq), (packet_id, state))`` each; unknown keys are
    ignored.  Per client and state, :data:`CHUNK_ROWS` rows per ``UPDATE
    ... SET packet_id = CASE seq WHEN ? THEN ? ... END, state = ? WHERE
    client_id = ? AND seq IN (...)``: one primary-key search per row, half
    the time of an ``UPDATE ... FROM (VALUES ...)``, which materializes the
    values and joins them (5,000 rows: 11 against 21 ms)."""
    groups: dict[tuple[str, int], list] = {}
    for (client_id, seq), (packet_id, state) in updates:
        group = groups.get((client_id, state))
        if group is None:
            groups[(client_id, state)] = [seq, packet_id]
        else:
            group.append(seq)
            group.append(packet_id)
    step = 2 * CHUNK_ROWS
    for (client_id, state), pairs in groups.items():
        for start in range(0, len(pairs), step):
            chunk = pairs[start:start + step]
            n = len(chunk) // 2
            conn.execute(_update_sql(n), [*chunk, state, client_id, *chunk[::2]])


#: rows → the UPDATE statement of :func:`update_states`, made once
_UPDATES: dict[int, str] = {}


def _update_sql(n: int) -> str:
    sql = _UPDATES.get(n)
    if sql is None:
        sql = _UPDATES[n] = (
            "UPDATE deliveries SET packet_id = CASE seq " + "WHEN ? THEN ? " * n
            + "END, state = ? WHERE client_id = ? AND seq IN (" + ",".join("?" * n) + ")")
    return sql
