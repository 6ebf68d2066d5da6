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

from tbmq.mqtt import ReasonCode as _R

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

#: MQTT 5 DISCONNECT reason codes (section 3.14.2.1) by value, ``int``
#: (a Spark integer column takes no ``IntEnum``), with the name a report
#: shows (null: connection lost without a DISCONNECT packet).
DISCONNECT_REASONS = {int(code): name for code, name in (
    (_R.NORMAL_DISCONNECTION, "normal disconnection"),
    (_R.DISCONNECT_WITH_WILL_MESSAGE, "disconnect with will"),
    (_R.UNSPECIFIED_ERROR, "unspecified error"),
    (_R.MALFORMED_PACKET, "malformed packet"),
    (_R.PROTOCOL_ERROR, "protocol error"),
    (_R.IMPLEMENTATION_SPECIFIC_ERROR, "implementation specific error"),
    (_R.NOT_AUTHORIZED, "not authorized"),
    (_R.SERVER_BUSY, "server busy"),
    (_R.SERVER_SHUTTING_DOWN, "server shutting down"),
    (_R.KEEP_ALIVE_TIMEOUT, "keep alive timeout"),
    (_R.SESSION_TAKEN_OVER, "session taken over"),
    (_R.TOPIC_FILTER_INVALID, "topic filter invalid"),
    (_R.TOPIC_NAME_INVALID, "topic name invalid"),
    (_R.RECEIVE_MAXIMUM_EXCEEDED, "receive maximum exceeded"),
    (_R.TOPIC_ALIAS_INVALID, "topic alias invalid"),
    (_R.PACKET_TOO_LARGE, "packet too large"),
    (_R.MESSAGE_RATE_TOO_HIGH, "message rate too high"),
    (_R.QUOTA_EXCEEDED, "quota exceeded"),
    (_R.ADMINISTRATIVE_ACTION, "administrative action"),
    (_R.PAYLOAD_FORMAT_INVALID, "payload format invalid"),
    (_R.RETAIN_NOT_SUPPORTED, "retain not supported"),
    (_R.QOS_NOT_SUPPORTED, "QoS not supported"),
    (_R.USE_ANOTHER_SERVER, "use another server"),
    (_R.SERVER_MOVED, "server moved"),
    (_R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, "shared subscriptions not supported"),
    (_R.CONNECTION_RATE_EXCEEDED, "connection rate exceeded"),
    (_R.MAXIMUM_CONNECT_TIME, "maximum connect time"),
    (_R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED, "subscription identifiers not supported"),
    (_R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED, "wildcard subscriptions not supported"),
)}
