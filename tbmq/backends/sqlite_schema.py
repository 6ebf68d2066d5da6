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
B-tree); one of version 4 gains the table ``topic_log_packs`` (the topic
log's packed rows; its other rows stay as they are).
"""

from __future__ import annotations

import json
import sqlite3

from tbmq.backends.sqlite_runner import Schema
from tbmq.backends.sqlite_session_migration import move_sessions_to_topic_log
from tbmq.model import Message
from tbmq.mqtt.properties import pack_properties, unpack_properties

__all__ = [
    "EMBEDDED_SCHEMA",
    "SCHEMA_VERSION",
    "ids_json",
    "message_columns",
    "message_from",
]

#: The version of :data:`EMBEDDED_SCHEMA`: 1 sessions, retained messages
#: and deliveries; 2 adds the topic log of the in-process bus; 3 moves the
#: sessions and subscriptions to the topic log; 4 drops the index of
#: ``deliveries`` that repeated its primary key; 5 adds the topic log's
#: packed rows (``topic_log_packs``).
SCHEMA_VERSION = 5

# Every version: retained messages and deliveries.  (Versions 1 and 2 also
# had the tables sessions and subscriptions, which version 3 moves to the
# topic log: tbmq.backends.sqlite_session_migration.)
_STORE_TABLES = """
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

# Version 5: a run of records of one partition written together, as one
# packed row (tbmq.backends.sqlite_topic_log): keyed by its last offset,
# the records from ``first_offset`` on are kept.
_TOPIC_LOG_PACKS_V5 = """
CREATE TABLE IF NOT EXISTS topic_log_packs (
    topic TEXT NOT NULL,
    partition_id INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    first_offset INTEGER NOT NULL,
    records BLOB NOT NULL,
    PRIMARY KEY (topic, partition_id, last_offset)
);
"""

#: The schema of the embedded store file.
EMBEDDED_SCHEMA = Schema(
    name="embedded",
    version=SCHEMA_VERSION,
    marker="retained",
    create=_STORE_TABLES + _TOPIC_LOG_V2 + _TOPIC_LOG_PACKS_V5,
    migrations={1: _TOPIC_LOG_V2, 2: move_sessions_to_topic_log, 3: _DROP_DELIVERIES_INDEX_V4,
                4: _TOPIC_LOG_PACKS_V5},
)


def ids_json(subscription_ids: tuple[int, ...]) -> str:
    """:returns: the subscription identifiers as a JSON array."""
    if not subscription_ids:
        return "[]"
    return json.dumps([int(i) for i in subscription_ids])


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
