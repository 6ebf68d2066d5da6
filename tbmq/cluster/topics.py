"""TBMQ's topic catalogue: the bus topic names, their record types, and
which of them are compacted or (on the in-process bus) durable.

============================================== ============================ ========= =======
name (after the prefix)                        codec (:mod:`.records`)      compacted durable
============================================== ============================ ========= =======
``tbmq.msg.all``                               ``MESSAGE``                  no        no
``tbmq.msg.retained``                          ``RETAINED`` (tombstones)    yes       no
``tbmq.msg.persisted``                         ``PERSISTED_RUNS``           no        no
``tbmq.msg.downlink.basic.<serviceId>``        ``DOWNLINK``                 no        no
``tbmq.msg.downlink.persisted.<serviceId>``    ``PERSISTED``                no        no
``tbmq.msg.app.<clientId>``                    ``DELIVERY``                 no        yes
``tbmq.msg.app.shared.<filter>``               ``DELIVERY``                 no        yes
``tbmq.client.session``                        ``SESSION`` (tombstones)     yes       yes
``tbmq.client.subscriptions``                  ``SUBSCRIPTIONS`` (tomb.)    yes       yes
``tbmq.client.blocked``                        ``BLOCKED`` (tombstones)     yes       yes
``tbmq.client.unauthorized``                   ``UNAUTHORIZED``             no        no
``tbmq.client.session.event.request``          ``SESSION_EVENT``            no        no
``tbmq.client.session.event.response.<sid>``   ``SESSION_EVENT_RESPONSE``   no        no
``tbmq.client.disconnect.<serviceId>``         ``DISCONNECT``               no        no
``tbmq.cluster.nodes``                         ``NODE``                     no        no
``tbmq.events``                                ``BYTES``                    no        no
``tbmq.integrations``                          ``BYTES`` (JSON; b"": gone) yes       yes
============================================== ============================ ========= =======

*Compacted* topics keep the last value per key (Kafka's
``cleanup.policy=compact``; readers still build last-value maps
themselves, compaction is never relied upon).  *Durable* topics are the ones
the in-process bus writes to its topic log so that a restarted embedded node
replays them (:class:`tbmq.interfaces.ITopicLog`); on Kafka every topic is.
A record of a durable topic that carries the :data:`TRANSIENT_HEADER` need
not survive a restart (a clean session's ``tbmq.client.session`` record):
the in-process bus hands it to every consumer but does not write it to its
topic log (:func:`transient`).

**Names that are not safe are hashed.**  Kafka allows ``[a-zA-Z0-9._-]``
and at most 249 characters in a topic name, and refuses a topic whose name
equals an existing one once ``.`` and ``_`` are taken as the same
character.  A client id, service id or topic filter (the ``<...>`` part) is
therefore used as it is only when it

* is made of ``[A-Za-z0-9_-]`` and is not empty (no ``.``: the dot separates
  the catalogue's levels, and ``a.b`` would collide with ``a_b``),
* is not itself of the hashed form ``h`` + 40 hexadecimal digits,
* in ``tbmq.msg.app.<clientId>``, does not start with ``shared_`` (that
  would collide with ``tbmq.msg.app.shared.<filter>``),
* keeps the whole name within 249 characters;

otherwise it is replaced by ``h`` followed by the 40 lowercase hexadecimal
digits of the SHA-1 of its UTF-8 bytes (stable across nodes and restarts;
see :func:`safe_name`).  Topic filters nearly always contain ``/``, ``+``
or ``#`` and so are nearly always hashed.
"""

from __future__ import annotations

import hashlib
import re

from tbmq.cluster import client_records, records
from tbmq.errors import RecordEncodingError

__all__ = ["CLUSTER_BUNDLE", "MAX_TOPIC_LENGTH", "TRANSIENT", "TRANSIENT_HEADER",
           "TopicCatalogue", "hashed_name", "node_group", "safe_name", "transient"]

#: The header of a record of a durable topic that need not survive a
#: restart (its value is not read).
TRANSIENT_HEADER = "tbmq-transient"
#: The headers of a record that carries only :data:`TRANSIENT_HEADER`.
TRANSIENT = ((TRANSIENT_HEADER, b"1"),)


def transient(headers) -> bool:
    """:param headers: a record's ``(name, value)`` pairs.
    :returns: True when they hold :data:`TRANSIENT_HEADER`."""
    if headers is TRANSIENT:
        return True
    for name, _ in headers:
        if name == TRANSIENT_HEADER:
            return True
    return False

#: Kafka's longest topic name.
MAX_TOPIC_LENGTH = 249

_SAFE = re.compile(r"[A-Za-z0-9_-]+\Z")
_HASHED = re.compile(r"h[0-9a-f]{40}\Z")
_PREFIX = re.compile(r"[A-Za-z0-9._-]*\Z")

MSG_ALL = "tbmq.msg.all"
MSG_RETAINED = "tbmq.msg.retained"
MSG_PERSISTED = "tbmq.msg.persisted"
DOWNLINK_BASIC = "tbmq.msg.downlink.basic."
DOWNLINK_PERSISTED = "tbmq.msg.downlink.persisted."
APP = "tbmq.msg.app."
APP_SHARED = "tbmq.msg.app.shared."
CLIENT_SESSION = "tbmq.client.session"
CLIENT_SUBSCRIPTIONS = "tbmq.client.subscriptions"
CLIENT_BLOCKED = "tbmq.client.blocked"
CLIENT_UNAUTHORIZED = "tbmq.client.unauthorized"
SESSION_EVENT_REQUEST = "tbmq.client.session.event.request"
SESSION_EVENT_RESPONSE = "tbmq.client.session.event.response."
CLIENT_DISCONNECT = "tbmq.client.disconnect."
EVENTS = "tbmq.events"
NODES = "tbmq.cluster.nodes"
INTEGRATIONS = "tbmq.integrations"

#: the longest fixed part a variable name is appended to
_LONGEST_BASE = max(len(DOWNLINK_PERSISTED), len(SESSION_EVENT_RESPONSE), len(APP_SHARED))

_EXACT = {
    MSG_ALL: records.MESSAGE,
    MSG_RETAINED: records.RETAINED,
    MSG_PERSISTED: records.PERSISTED_RUNS,
    CLIENT_SESSION: records.SESSION,
    CLIENT_SUBSCRIPTIONS: records.SUBSCRIPTIONS,
    SESSION_EVENT_REQUEST: records.SESSION_EVENT,
    EVENTS: records.BYTES,
    NODES: records.NODE,
    CLIENT_BLOCKED: client_records.BLOCKED,
    CLIENT_UNAUTHORIZED: client_records.UNAUTHORIZED,
    INTEGRATIONS: records.BYTES,
}
# (base, codec): the topics named base + <part>; longest bases first
_FAMILIES = (
    (DOWNLINK_PERSISTED, records.PERSISTED),
    (DOWNLINK_BASIC, records.DOWNLINK),
    (APP, records.APPLICATION),  # tbmq.msg.app.shared.<filter> too
    (SESSION_EVENT_RESPONSE, records.SESSION_EVENT_RESPONSE),
    (CLIENT_DISCONNECT, records.DISCONNECT),
)
_COMPACTED = frozenset((MSG_RETAINED, CLIENT_SESSION, CLIENT_SUBSCRIPTIONS, CLIENT_BLOCKED,
                        INTEGRATIONS))
_DURABLE = frozenset((CLIENT_SESSION, CLIENT_SUBSCRIPTIONS, CLIENT_BLOCKED, INTEGRATIONS))
_PACKABLE = frozenset((MSG_ALL, MSG_PERSISTED, SESSION_EVENT_REQUEST))
# TBMQ's layout (one partition) for the topics every node reads whole and a
# node's answers and disconnect commands, except the compacted ones (see
# TopicCatalogue.partitioned)
_SINGLE = frozenset((CLIENT_UNAUTHORIZED, NODES))
_SINGLE_FAMILIES = (SESSION_EVENT_RESPONSE, CLIENT_DISCONNECT)
_PACKABLE_FAMILIES = (DOWNLINK_BASIC, DOWNLINK_PERSISTED, SESSION_EVENT_RESPONSE,
                      CLIENT_DISCONNECT)


def safe_name(part: str, room: int = MAX_TOPIC_LENGTH) -> str:
    """The form of ``part`` used in a topic name (see the module doc).

    :param part: a client id, service id or topic filter.
    :param room: how many characters the name leaves for it.
    :returns: ``part`` itself when safe, else ``"h"`` + 40 hex digits of
        the SHA-1 of its UTF-8 bytes (lone surrogates passed through).
    """
    if len(part) <= room and _SAFE.match(part) and not _HASHED.match(part):
        return part
    return hashed_name(part)


#: The bundle (:meth:`tbmq.interfaces.IMessageBus.subscribe`) of the groups
#: every node joins: ``tbmq-msg-all`` on ``tbmq.msg.all``,
#: ``tbmq-msg-persisted`` on ``tbmq.msg.persisted`` and
#: ``tbmq-session-events`` on ``tbmq.client.session.event.request``; a node
#: subscribes them together at its start (the Kafka bus: one consumer).
CLUSTER_BUNDLE = "tbmq-cluster"


def node_group(service_id: str) -> str:
    """The consumer group of a node's exclusive subscriptions: its downlink,
    session answer and disconnect topics, and its replays of the session,
    subscription, retained and node topics.  One name for all of them lets
    a bus read them with one client (the Kafka bus: one fetch for all).

    :returns: ``"tbmq-node-<serviceId>"``.
    """
    return "tbmq-node-" + service_id


def hashed_name(part: str) -> str:
    """:returns: ``"h"`` + the 40 lowercase hex digits of the SHA-1 of
    ``part``'s UTF-8 bytes (lone surrogates passed through)."""
    return "h" + hashlib.sha1(part.encode("utf-8", "surrogatepass")).hexdigest()


class TopicCatalogue:
    """The bus topic names of one cluster (ARCHITECTURE §1).

    :param prefix: prepended to every name (e.g. ``"prod."``); made of
        ``[A-Za-z0-9._-]``, short enough that every name fits in 249
        characters.
    :raises ValueError: for a prefix that is not.
    :ivar msg_all, msg_retained, msg_persisted, client_session,
        client_subscriptions, session_event_request, events, nodes,
        client_blocked, client_unauthorized, integrations: the fixed names
        (``integrations``: the integrations added through the API,
        :mod:`tbmq.integrations.plugin`).
    """

    __slots__ = ("prefix", "msg_all", "msg_retained", "msg_persisted", "client_session",
                 "client_subscriptions", "session_event_request", "events", "nodes", "_room",
                 "_names", "client_blocked", "client_unauthorized", "integrations")

    #: most per-id names remembered (a publish names its topic each time)
    NAMES_CACHED = 65536

    def __init__(self, prefix: str = "") -> None:
        if not isinstance(prefix, str) or not _PREFIX.match(prefix):
            raise ValueError(f"topic prefix {prefix!r}: only [A-Za-z0-9._-] are allowed")
        room = MAX_TOPIC_LENGTH - len(prefix) - _LONGEST_BASE
        if room < 41:
            raise ValueError(f"topic prefix {prefix!r}: too long")
        self.prefix = prefix
        self._room = room
        self._names: dict[tuple[str, str], str] = {}
        self.msg_all = prefix + MSG_ALL
        self.msg_retained = prefix + MSG_RETAINED
        self.msg_persisted = prefix + MSG_PERSISTED
        self.client_session = prefix + CLIENT_SESSION
        self.client_subscriptions = prefix + CLIENT_SUBSCRIPTIONS
        self.session_event_request = prefix + SESSION_EVENT_REQUEST
        self.events = prefix + EVENTS
        self.nodes = prefix + NODES
        self.client_blocked = prefix + CLIENT_BLOCKED
        self.client_unauthorized = prefix + CLIENT_UNAUTHORIZED
        self.integrations = prefix + INTEGRATIONS

    def fixed(self) -> tuple[str, ...]:
        """:returns: every fixed topic name (prefix applied): the topics a
        bus creates at start."""
        return (self.msg_all, self.msg_retained, self.msg_persisted, self.client_session,
                self.client_subscriptions, self.session_event_request, self.nodes)

    # -- the families --------------------------------------------------------------

    def _named(self, base: str, part: str) -> str:
        """``prefix + base + safe_name(part)``, remembered (the sinks name a
        topic per delivery); at most :attr:`NAMES_CACHED` names, all
        forgotten when full."""
        names = self._names
        name = names.get((base, part))
        if name is None:
            if len(names) >= self.NAMES_CACHED:
                names.clear()
            if base == APP and part.startswith("shared_"):
                name = self.prefix + APP + hashed_name(part)
            else:
                name = self.prefix + base + safe_name(part, self._room)
            names[(base, part)] = name
        return name

    def downlink_basic(self, service_id: str) -> str:
        """:returns: ``tbmq.msg.downlink.basic.<serviceId>``: non-persistent
        deliveries for clients connected to node ``service_id``."""
        return self._named(DOWNLINK_BASIC, service_id)

    def downlink_persisted(self, service_id: str) -> str:
        """:returns: ``tbmq.msg.downlink.persisted.<serviceId>``: persistent
        deliveries for clients connected to node ``service_id``."""
        return self._named(DOWNLINK_PERSISTED, service_id)

    def app(self, client_id: str) -> str:
        """:returns: ``tbmq.msg.app.<clientId>``: the deliveries of a
        persistent APPLICATION client (a client id starting with
        ``shared_`` is hashed: it would read as an ``app.shared`` name)."""
        return self._named(APP, client_id)

    def app_shared(self, topic_filter: str) -> str:
        """:returns: ``tbmq.msg.app.shared.<filter>``: the deliveries of an
        APPLICATION shared subscription (``topic_filter`` without the
        ``$share/<group>/`` part)."""
        return self._named(APP_SHARED, topic_filter)

    def session_event_response(self, service_id: str) -> str:
        """:returns: ``tbmq.client.session.event.response.<serviceId>``."""
        return self._named(SESSION_EVENT_RESPONSE, service_id)

    def client_disconnect(self, service_id: str) -> str:
        """:returns: ``tbmq.client.disconnect.<serviceId>``."""
        return self._named(CLIENT_DISCONNECT, service_id)

    # -- what a name carries ----------------------------------------------------------

    def _base(self, topic: str) -> str | None:
        """``topic`` without the prefix, or None when it lacks it."""
        if not isinstance(topic, str) or not topic.startswith(self.prefix):
            return None
        return topic[len(self.prefix):]

    def codec_for(self, topic: str):
        """The codec of ``topic``'s records (:mod:`tbmq.cluster.records`).

        :param topic: a full bus topic name, prefix included.
        :returns: an object with ``encode(value) -> bytes | None`` and
            ``decode(bytes | None) -> value``.
        :raises RecordEncodingError: when ``topic`` is not in the catalogue.
        """
        name = self._base(topic)
        if name is not None:
            codec = _EXACT.get(name)
            if codec is not None:
                return codec
            for base, codec in _FAMILIES:
                if name.startswith(base) and len(name) > len(base):
                    return codec
        raise RecordEncodingError(f"{topic!r} is not a topic of the catalogue "
                                  f"(prefix {self.prefix!r})")

    def compacted(self, topic: str) -> bool:
        """:returns: True for ``tbmq.client.session``,
        ``tbmq.client.subscriptions``, ``tbmq.client.blocked`` and
        ``tbmq.msg.retained`` (the last value per key is what counts)."""
        return self._base(topic) in _COMPACTED

    def packable(self, topic: str) -> bool:
        """:returns: True for the traffic topics whose records a bus may
        pack, several in one record of the partition (the Kafka bus,
        ``docs/bus.md``): ``tbmq.msg.all``, ``tbmq.msg.persisted``, the
        downlinks, and the session events, answers and disconnects.  Not the
        compacted topics (a key's last value is a record of its own), an
        APPLICATION client's topics (committed one acknowledgement at a
        time) or ``tbmq.events`` (read by tools outside tbmq)."""
        name = self._base(topic)
        if name is None:
            return False
        if name in _PACKABLE:
            return True
        return any(name.startswith(base) and len(name) > len(base)
                   for base in _PACKABLE_FAMILIES)

    def partitioned(self, topic: str) -> bool:
        """Whether ``topic`` is spread over the bus's partitions (Kafka's
        ``kafka.partitions``) or has one partition (TBMQ's topic layout:
        ``partitions:1`` in its ``topic-properties``).

        One partition: the per-node answer and command topics
        (``tbmq.client.session.event.response.<serviceId>``,
        ``tbmq.client.disconnect.<serviceId>``), ``tbmq.cluster.nodes`` and
        ``tbmq.client.unauthorized``: nothing shares them out among a
        group's members, and one partition makes a node's records of one
        turn to one of them one batch, so one produce request, and each
        fetch of the node's client of them names one partition rather than
        ``kafka.partitions`` (a broker's cost per request grows with both).
        TBMQ gives one partition to its compacted topics too
        (``tbmq.client.session``, ``tbmq.client.subscriptions``,
        ``tbmq.msg.retained``, ``tbmq.client.blocked``); here they stay
        spread: every node writes them, and a broker that makes a record
        readable before an earlier one of another producer (Tansu) leaves
        a hole that the consumer of a compacted topic passes at once when
        nothing of the partition was read yet, or only old records
        (:mod:`tbmq_plugins.kafka.order`), so one partition written by
        every node would make that more likely.  The others
        (``tbmq.msg.all``, ``tbmq.msg.persisted``, the session event
        requests, the downlinks, an APPLICATION client's topics,
        ``tbmq.events``, ``tbmq.integrations``) are spread: a group shares
        them out among the nodes, or their traffic needs the spread.

        :returns: False for the one-partition topics above, else True (a
            name outside the catalogue included).
        """
        name = self._base(topic)
        if name is None:
            return True
        if name in _SINGLE:
            return False
        return not any(name.startswith(base) and len(name) > len(base)
                       for base in _SINGLE_FAMILIES)

    def durable(self, topic: str) -> bool:
        """:returns: True for the topics the in-process bus keeps in its
        topic log: ``tbmq.client.session``, ``tbmq.client.subscriptions``,
        ``tbmq.client.blocked``, ``tbmq.msg.app.<clientId>`` and ``tbmq.msg.app.shared.<filter>``."""
        name = self._base(topic)
        if name is None:
            return False
        return name in _DURABLE or (name.startswith(APP) and len(name) > len(APP))
