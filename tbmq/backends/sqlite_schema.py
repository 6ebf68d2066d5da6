"""The tables of the embedded store file (``<data_dir>/tbmq.sqlite3``) and
how a :class:`~tbmq.model.Message` is kept in a row.

:data:`EMBEDDED_SCHEMA` is the :class:`~tbmq.backends.sqlite_runner.Schema`
every store of that file attaches to its runner (retained messages,
deliveries, the topic log of the in-process bus, which keeps the sessions
and subscriptions); :data:`SCHEMA_VERSION` is its version.  A file of
version 1 gains the topic log's tables; one of version 2 has the rows of
its tables ``sessions`` and ``subscriptions`` moved to the topic log, and
those tables dropped (:mod:`tbmq.backends.sqlite_session_migration`); one
of version 3 loses the index ``deliveries_client_id_seq``, which repeated
the primary key's (every delivery written, deleted or read cost one more
B-tree); one of version 4 has its deliveries rewritten with the message in
one column (:func:`message_blob`) in a table without rowid
(:func:`pack_deliveries`); one of version 5 gains the table
``topic_log_packs`` (the topic log's packed rows; its other rows stay as
they are); one of version 6 gains the tables ``delivery_runs`` and
``delivery_run_heads`` (a run of deliveries to one client in one row,
:mod:`tbmq.backends.sqlite_delivery_runs`).

A row of ``deliveries`` (version 5) is ``client_id, seq, message, qos,
retain, subscription_ids, packet_id, state``: ``message`` is the ``msg``
record of :mod:`tbmq.cluster.records` (the documented, versioned msgpack
array of the bus), encoded once per message and the same bytes for every
subscriber it is queued for; ``subscription_ids`` is a JSON array, or NULL
for none.  Eight values to bind per row instead of fifteen, and one B-tree
(the primary key's) instead of two.
"""

from __future__ import annotations

import json
import sqlite3

import msgpack

from tbmq.backends.sqlite_runner import Schema
from tbmq.backends.sqlite_session_migration import move_sessions_to_topic_log
from tbmq.cluster.records import MESSAGE
from tbmq.model import Message
from tbmq.mqtt.properties import pack_properties, unpack_properties

__all__ = [
    "EMBEDDED_SCHEMA",
    "SCHEMA_VERSION",
    "ids_json",
    "message_blob",
    "message_blobs",
    "message_columns",
    "message_from",
    "message_of_blob",
    "messages_of_blobs",
    "messages_of_stream",
    "pack_deliveries",
]

#: The version of :data:`EMBEDDED_SCHEMA`: 1 sessions, retained messages
#: and deliveries; 2 adds the topic log of the in-process bus; 3 moves the
#: sessions and subscriptions to the topic log; 4 drops the index of
#: ``deliveries`` that repeated its primary key; 5 keeps a delivery's
#: message in one column, in a table without rowid; 6 adds the topic log's
#: packed rows (``topic_log_packs``); 7 adds the device store's runs
#: (``delivery_runs``).
SCHEMA_VERSION = 7

# Every version: retained messages; versions 1 to 4: deliveries, a column per
# field.  (Versions 1 and 2 also had the tables sessions and subscriptions,
# which version 3 moves to the topic log: tbmq.backends.sqlite_session_migration.)
_RETAINED = """
CREATE TABLE IF NOT EXISTS retained (
    topic TEXT PRIMARY KEY,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    properties BLOB,
    publisher TEXT NOT NULL,
    received_at REAL NOT NULL,
    expires_at REAL
);
"""
_DELIVERIES_V1 = """
CREATE TABLE IF NOT EXISTS deliveries (
    client_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    message_qos INTEGER NOT NULL,
    message_retain INTEGER NOT NULL,
    properties BLOB,
    publisher TEXT NOT NULL,
    received_at REAL NOT NULL,
    expires_at REAL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    subscription_ids TEXT NOT NULL,
    packet_id INTEGER,
    state INTEGER NOT NULL,
    PRIMARY KEY (client_id, seq)
);
"""
#: The tables of retained messages and deliveries of a version 1 file.
_STORE_TABLES = _RETAINED + _DELIVERIES_V1

# Version 5: a delivery's message in one column (message_blob), and the
# primary key as the table's only B-tree (WITHOUT ROWID: no rowid B-tree
# beside the key's index, each row written once).
_DELIVERIES_V5 = """
CREATE TABLE IF NOT EXISTS deliveries (
    client_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    subscription_ids TEXT,
    packet_id INTEGER,
    state INTEGER NOT NULL,
    PRIMARY KEY (client_id, seq)
) WITHOUT ROWID
"""
#: The values of a row of ``deliveries`` (version 5).
DELIVERY_COLUMNS = 8
#: The column names of ``deliveries`` (version 5), in order.
DELIVERY_COLUMN_NAMES = ("client_id", "seq", "message", "qos", "retain", "subscription_ids",
                         "packet_id", "state")
#: The columns of ``deliveries`` whose default is NULL (by index): the
#: subscription identifiers and the packet identifier, None in a row queued
#: for an offline session.
DELIVERY_NULLABLE = (5, 6)

# Version 4: the primary key's index serves every query of ``deliveries``
# (by client id, in seq order); the same index again only cost writes.
_DROP_DELIVERIES_INDEX_V4 = "DROP INDEX IF EXISTS deliveries_client_id_seq"

# Version 2: the records of the in-process bus's durable topics (one row
# per record; in a compacted topic one per key, found by the partial index)
# and the consumer groups' committed offsets.
_TOPIC_LOG_V2 = """
CREATE TABLE IF NOT EXISTS topic_log (
    topic TEXT NOT NULL,
    partition_id INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,
    key TEXT,
    value BLOB,
    headers BLOB,
    compacted INTEGER NOT NULL,
    PRIMARY KEY (topic, partition_id, log_offset)
);
CREATE INDEX IF NOT EXISTS topic_log_compacted_key
    ON topic_log (topic, key) WHERE compacted = 1;
CREATE TABLE IF NOT EXISTS topic_log_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition_id INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, partition_id)
);
"""

# Version 6: a run of records of one partition written together, as one
# packed row (tbmq.backends.sqlite_topic_log): keyed by its last offset,
# the records from ``first_offset`` on are kept.
_TOPIC_LOG_PACKS_V6 = """
CREATE TABLE IF NOT EXISTS topic_log_packs (
    topic TEXT NOT NULL,
    partition_id INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    first_offset INTEGER NOT NULL,
    records BLOB NOT NULL,
    PRIMARY KEY (topic, partition_id, last_offset)
);
"""

# Version 7: the deliveries of one add_run as one row (tbmq.backends.
# sqlite_delivery_runs): keyed by its last seq, ``messages`` holds the
# message_blob of each from ``base_seq`` on, one after another; a run whose
# first deliveries are gone has a row in ``delivery_run_heads`` with the
# first it keeps (the run's row, messages and all, is not written again).
_DELIVERY_RUNS_V7 = """
CREATE TABLE IF NOT EXISTS delivery_runs (
    client_id TEXT NOT NULL,
    last_seq INTEGER NOT NULL,
    base_seq INTEGER NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    subscription_ids TEXT,
    messages BLOB NOT NULL,
    PRIMARY KEY (client_id, last_seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS delivery_run_heads (
    client_id TEXT NOT NULL,
    last_seq INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    PRIMARY KEY (client_id, last_seq)
) WITHOUT ROWID
"""


def ids_json(subscription_ids: tuple[int, ...]) -> str:
    """:returns: the subscription identifiers as a JSON array."""
    if not subscription_ids:
        return "[]"
    return json.dumps([int(i) for i in subscription_ids])


def message_blob(message: Message) -> bytes:
    """:returns: the column ``message`` of ``deliveries``: the ``msg``
        record of ``message`` (:data:`tbmq.cluster.records.MESSAGE`; a
        message read from the bus is written as it came, ``Message.wire``).
    :raises tbmq.errors.RecordEncodingError: when a field does not fit
        (a payload that is not bytes, a QoS out of range, ...)."""
    return MESSAGE.encode(message)


def message_blobs(messages: list[Message]) -> list[bytes]:
    """:func:`message_blob` of each of ``messages``, with one packer and one
    pass (:meth:`~tbmq.cluster.record_codec.RecordCodec.encode_many`).

    :returns: the encodings, in order.
    :raises tbmq.errors.RecordEncodingError: as :func:`message_blob`, for
        the first message that does not fit."""
    return MESSAGE.encode_many(messages)


def message_of_blob(blob: bytes) -> Message:
    """Inverse of :func:`message_blob`.

    :raises tbmq.errors.RecordEncodingError: for bytes that are not a
        ``msg`` record of a known version."""
    return MESSAGE.decode(blob if type(blob) is bytes else bytes(blob))


def messages_of_blobs(blobs: list) -> list[Message]:
    """:func:`message_of_blob` of each of ``blobs`` (the column ``message``
    of a page of ``deliveries``): one msgpack pass over them all, then the
    records' checks (:meth:`~tbmq.cluster.record_codec.RecordCodec.
    decode_arrays`); one at a time when they do not come apart as one
    array each (the first bad one then raises).

    :returns: the messages, in order.
    :raises tbmq.errors.RecordEncodingError: for bytes that are not a
        ``msg`` record of a known version."""
    if not blobs:
        return []
    messages = messages_of_stream(b"".join(blobs), len(blobs))
    if messages is None:
        return [message_of_blob(blob) for blob in blobs]
    return messages


def messages_of_stream(data: bytes, count: int) -> list[Message] | None:
    """The messages of ``count`` :func:`message_blob` encodings one after
    another in ``data``: one msgpack pass, then the records' checks
    (:meth:`~tbmq.cluster.record_codec.RecordCodec.decode_arrays`).

    :returns: the messages, in order, or None when ``data`` does not come
        apart as ``count`` arrays.
    :raises tbmq.errors.RecordEncodingError: for an array that is not a
        ``msg`` record of a known version."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, use_list=False,
                                max_buffer_size=max(len(data), 1 << 20))
    try:
        unpacker.feed(data)
        arrays = list(unpacker)
    except Exception:
        return None
    if len(arrays) != count:
        return None
    return MESSAGE.decode_arrays(arrays)


#: rows of a version 4 file rewritten per statement by :func:`pack_deliveries`
_PACK_ROWS = 500


def pack_deliveries(conn: sqlite3.Connection) -> None:
    """Migration step 4 → 5, in the transaction that opens the file: every
    row of ``deliveries`` rewritten with its message in one column
    (:func:`message_blob`), in order, into the version 5 table.

    :raises tbmq.errors.RecordEncodingError: for a stored message that
        does not fit a ``msg`` record (the open fails, the file stays as it
        was)."""
    conn.execute("ALTER TABLE deliveries RENAME TO deliveries_v4")
    conn.execute(_DELIVERIES_V5)
    rows = conn.execute(
        "SELECT client_id, seq, topic, payload, message_qos, message_retain, properties, "
        "publisher, received_at, expires_at, qos, retain, subscription_ids, packet_id, state "
        "FROM deliveries_v4 ORDER BY client_id, seq")
    while True:
        chunk = rows.fetchmany(_PACK_ROWS)
        if not chunk:
            break
        conn.executemany(
            "INSERT INTO deliveries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(row[0], row[1], message_blob(message_from(row[2:10])), row[10], row[11],
              None if row[12] == "[]" else row[12], row[13], row[14]) for row in chunk])
    conn.execute("DROP TABLE deliveries_v4")


def message_columns(message: Message) -> tuple:
    """:returns: the columns topic .. expires_at of a message (properties
        serialised as MQTT v5 properties).
    :raises Exception: when a property cannot be serialised."""
    payload = message.payload
    properties = message.properties
    return (
        message.topic,
        payload if type(payload) is bytes else bytes(payload),
        int(message.qos),
        1 if message.retain else 0,
        pack_properties(properties) if properties else None,
        message.publisher,
        float(message.received_at),
        message.expires_at,
    )


def message_from(row: tuple | sqlite3.Row) -> Message:
    """:param row: the eight columns of :func:`message_columns`.
    :returns: the :class:`~tbmq.model.Message` they describe."""
    topic, payload, qos, retain, props, publisher, received_at, expires_at = row
    return Message(
        topic,
        payload if type(payload) is bytes else bytes(payload),
        qos,
        bool(retain),
        unpack_properties(bytes(props)) if props else {},
        publisher,
        received_at,
        expires_at,
    )


#: The schema of the embedded store file.
EMBEDDED_SCHEMA = Schema(
    name="embedded",
    version=SCHEMA_VERSION,
    marker="retained",
    create=(_RETAINED + _DELIVERIES_V5 + ";" + _TOPIC_LOG_V2 + _TOPIC_LOG_PACKS_V6 + ";"
            + _DELIVERY_RUNS_V7),
    migrations={1: _TOPIC_LOG_V2, 2: move_sessions_to_topic_log, 3: _DROP_DELIVERIES_INDEX_V4,
                4: pack_deliveries, 5: _TOPIC_LOG_PACKS_V6, 6: _DELIVERY_RUNS_V7},
)
