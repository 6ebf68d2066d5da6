"""The explicit Spark schema of the exported event log, version
:data:`SCHEMA_VERSION` (``docs/events.md`` describes every field).

Every record is one JSON object on one line with the common fields ``v``,
``type``, ``ts`` and ``node``; the other fields depend on ``type``.  A field
that does not apply to a type is absent (read as null).  The reader adds
``_corrupt_record`` (the raw line of a record that could not be parsed
against this schema).
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

__all__ = [
    "CORRUPT_COLUMN",
    "DISCONNECT_REASONS",
    "EVENT_SCHEMA",
    "EVENT_TYPES",
    "READ_SCHEMA",
    "REQUIRED_FIELDS",
    "SCHEMA_VERSION",
]

#: The newest schema version this package reads (records with a larger
#: ``v`` are reported as bad input).
SCHEMA_VERSION = 1

#: The values of ``type``.
EVENT_TYPES = ("connect", "disconnect", "subscribe", "unsubscribe", "publish",
               "deliver", "drop", "auth_fail")

#: The column holding the raw text of a record that could not be parsed.
CORRUPT_COLUMN = "_corrupt_record"

#: The fields of a record: name, Spark type, meaning (unit).
FIELDS = (
    ("v", IntegerType(), "schema version"),
    ("type", StringType(), "event type, one of EVENT_TYPES"),
    ("ts", LongType(), "when it happened, milliseconds since the epoch (UTC)"),
    ("node", StringType(), "service id of the broker node"),
    ("client_id", StringType(), "the client of the event (publisher, subscriber, ...)"),
    ("client_type", StringType(), "DEVICE or APPLICATION"),
    ("protocol_version", IntegerType(), "MQTT protocol level: 3 (3.1), 4 (3.1.1), 5 (5.0)"),
    ("address", StringType(), "peer IP address (or UNIX socket path)"),
    ("port", IntegerType(), "peer TCP port"),
    ("clean_start", BooleanType(), "Clean Start / Clean Session flag"),
    ("session_expiry", LongType(), "granted session expiry interval, seconds"),
    ("persistent", BooleanType(), "persistent session (TBMQ's rule)"),
    ("username", StringType(), "CONNECT user name"),
    ("reason_code", IntegerType(), "MQTT reason code"),
    ("duration_ms", LongType(), "connection duration, milliseconds"),
    ("will", BooleanType(), "disconnect: will published; publish: a will message"),
    ("topic_filter", StringType(), "subscription topic filter"),
    ("qos", IntegerType(), "QoS 0, 1 or 2"),
    ("msg_id", StringType(), "message id, equal in publish, deliver and drop records"),
    ("topic", StringType(), "topic name"),
    ("retain", BooleanType(), "RETAIN flag of the message"),
    ("bytes", LongType(), "payload size, bytes"),
    ("publisher", StringType(), "client id of the message's publisher"),
    ("latency_ms", DoubleType(), "delivery time minus receipt time, milliseconds"),
    ("reason", StringType(), "why a message was dropped"),
)

#: The schema of valid records.
EVENT_SCHEMA = StructType([StructField(name, kind, True) for name, kind, _ in FIELDS])

#: :data:`EVENT_SCHEMA` plus the corrupt-record column, for reading JSON.
READ_SCHEMA = StructType(EVENT_SCHEMA.fields + [StructField(CORRUPT_COLUMN, StringType(), True)])

#: Fields a record of each type must have (besides ``v``, ``type``, ``ts``).
REQUIRED_FIELDS = {
    "connect": ("client_id",),
    "disconnect": ("client_id",),
    "subscribe": ("client_id", "topic_filter"),
    "unsubscribe": ("client_id", "topic_filter"),
    "publish": ("topic", "qos", "bytes"),
    "deliver": ("client_id", "topic", "qos", "bytes"),
    "drop": ("reason",),
    "auth_fail": (),
}

#: MQTT 5 DISCONNECT reason codes by value (null: connection lost without
#: a DISCONNECT packet).
DISCONNECT_REASONS = {
    0x00: "normal disconnection",
    0x04: "disconnect with will",
    0x80: "unspecified error",
    0x81: "malformed packet",
    0x82: "protocol error",
    0x83: "implementation specific error",
    0x87: "not authorized",
    0x89: "server busy",
    0x8B: "server shutting down",
    0x8D: "keep alive timeout",
    0x8E: "session taken over",
    0x8F: "topic filter invalid",
    0x90: "topic name invalid",
    0x93: "receive maximum exceeded",
    0x94: "topic alias invalid",
    0x95: "packet too large",
    0x96: "message rate too high",
    0x97: "quota exceeded",
    0x98: "administrative action",
    0x99: "payload format invalid",
    0x9A: "retain not supported",
    0x9B: "QoS not supported",
    0x9C: "use another server",
    0x9D: "server moved",
    0x9E: "shared subscriptions not supported",
    0x9F: "connection rate exceeded",
    0xA0: "maximum connect time",
    0xA1: "subscription identifiers not supported",
    0xA2: "wildcard subscriptions not supported",
}
