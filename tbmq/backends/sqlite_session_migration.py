"""Version 3 of the embedded store file: the sessions and subscriptions that
an older tbmq kept in the tables ``sessions`` and ``subscriptions`` move to
the topic log of the in-process bus, as the records of
``tbmq.client.session`` and ``tbmq.client.subscriptions`` that the broker
replays at start (ARCHITECTURE §1, "Sessions without a coordinator").

:func:`move_sessions_to_topic_log` is the step from version 2 to 3 of
:data:`~tbmq.backends.sqlite_schema.EMBEDDED_SCHEMA`.  It runs in the
transaction that opens the file, so the rows are moved and the old tables
dropped together, or (when it fails) the file stays as it was:

* each row of ``sessions`` becomes a :class:`~tbmq.cluster.records.SessionInfo`:
  offline (``connected=False``), persistent, with the row's session expiry
  interval (seconds), protocol level, client type and ``disconnected_at``
  (seconds since the epoch, or NULL), a new session id, and the service id
  :data:`~tbmq.cluster.records.UNCLAIMED`, so that the node starting on this
  data adopts it (:meth:`tbmq.broker.sessions.SessionManager.restore`);
* the subscriptions of each such client become one
  :class:`~tbmq.cluster.records.SubscriptionsRecord`, in the order they were
  saved; rows of a client without a session are left out, as the older
  tbmq's loader left them out;
* both are encoded with their topic's codec
  (:meth:`tbmq.cluster.topics.TopicCatalogue.codec_for`; the embedded node's
  catalogue has no prefix) and stored as compacted records of partition 0
  at offsets 0, 1, ... in client id order, without headers.

A version-2 file that a tbmq keeping its sessions on the bus has already
opened -- the topic log knows ``tbmq.client.session`` or
``tbmq.client.subscriptions``: a record, or a consumer group's offset --
has had its tables unread since: their rows are stale (a session that ended
since would come back), so the tables are dropped without being moved.
"""

from __future__ import annotations

import sqlite3
import time
import uuid

from tbmq.cluster.records import UNCLAIMED, SessionInfo, SubscriptionsRecord
from tbmq.cluster.topics import TopicCatalogue
from tbmq.errors import BackendError, RecordEncodingError
from tbmq.model import ClientType, SubscriptionOptions

__all__ = ["move_sessions_to_topic_log"]

#: The tables of versions 1 and 2 that version 3 moves to the topic log.
LEGACY_TABLES = ("subscriptions", "sessions")


def move_sessions_to_topic_log(conn: sqlite3.Connection) -> None:
    """In the database thread, inside the transaction opening a file of
    version 2: write the sessions and subscriptions of the old tables to
    ``topic_log`` (see the module doc), then drop the tables.

    :param conn: the connection, in a write transaction; ``topic_log`` and
        ``topic_log_offsets`` exist (version 2).
    :raises BackendError: for a row that no record can carry (an unknown
        client type, a value out of range); nothing is changed then.
    """
    tables = {name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    catalogue = TopicCatalogue()
    topics = (catalogue.client_session, catalogue.client_subscriptions)
    if set(LEGACY_TABLES) <= tables and not _known(conn, topics):
        conn.executemany("INSERT INTO topic_log VALUES (?, ?, ?, ?, ?, ?, ?)",
                         _records(conn, catalogue, time.time()))
    for table in LEGACY_TABLES:
        conn.execute(f"DROP TABLE IF EXISTS {table}")


def _known(conn: sqlite3.Connection, topics: tuple[str, ...]) -> bool:
    """:returns: True when the topic log holds a record of one of
    ``topics`` or a consumer group's offset on one."""
    for table in ("topic_log", "topic_log_offsets"):
        for topic in topics:
            if conn.execute(f"SELECT 1 FROM {table} WHERE topic = ? LIMIT 1",
                            (topic,)).fetchone():
                return True
    return False


def _records(conn: sqlite3.Connection, catalogue: TopicCatalogue, now: float) -> list[tuple]:
    """:returns: the ``topic_log`` rows ``(topic, partition, offset, key,
    value, headers, compacted)`` of the old tables' sessions and
    subscriptions.

    :param now: ``updated_at`` of the session records, seconds since the
        epoch.
    :raises BackendError: for a row that cannot be encoded.
    """
    subscriptions: dict[str, dict[str, SubscriptionOptions]] = {}
    for client_id, topic_filter, qos, no_local, rap, rh, sub_id in conn.execute(
        "SELECT client_id, topic_filter, qos, no_local, retain_as_published, "
        "retain_handling, subscription_id FROM subscriptions ORDER BY rowid"
    ):
        subscriptions.setdefault(client_id, {})[topic_filter] = SubscriptionOptions(
            qos=qos, no_local=bool(no_local), retain_as_published=bool(rap),
            retain_handling=rh, subscription_id=sub_id)
    session_topic, subs_topic = catalogue.client_session, catalogue.client_subscriptions
    session_codec = catalogue.codec_for(session_topic)
    subs_codec = catalogue.codec_for(subs_topic)
    sessions: list[tuple] = []
    subs: list[tuple] = []
    for client_id, level, expiry, client_type, disconnected_at in conn.execute(
        "SELECT client_id, protocol_level, session_expiry_interval, client_type, "
        "disconnected_at FROM sessions ORDER BY client_id"
    ).fetchall():
        try:
            info = SessionInfo(
                client_id, UNCLAIMED, uuid.uuid4().hex, connected=False, persistent=True,
                client_type=ClientType(client_type), session_expiry_interval=expiry,
                protocol_level=level, connected_at=None, disconnected_at=disconnected_at,
                updated_at=now)
            sessions.append((session_topic, 0, len(sessions), client_id,
                             session_codec.encode(info), None, 1))
            own = subscriptions.get(client_id)
            if own:
                subs.append((subs_topic, 0, len(subs), client_id,
                             subs_codec.encode(SubscriptionsRecord(client_id, own)), None, 1))
        except (ValueError, TypeError, RecordEncodingError) as e:
            raise BackendError(f"session {client_id!r}: cannot move it to the topic log: {e}") from e
    return sessions + subs
