"""Blocked clients for the whole cluster (TBMQ's ``tbmq.client.blocked``).

An operator blocks a client by client id, user name, IP address, or a
regular expression over one of those, optionally until a time.  The list
lives on the compacted bus topic ``tbmq.client.blocked`` (key = entry id, a
tombstone removes the entry): every node reads it from the beginning at
start, in a consumer group of its own, and keeps the last value per key
(compaction is not relied upon).  The embedded node's in-process bus keeps
the topic in its topic log, so the list survives a restart.

* A CONNECT that matches a current entry gets CONNACK BANNED (0x8A; v3:
  0x05 Not authorized), before any authentication (as TBMQ does at the
  session's start) — :meth:`BlockedClients.match`: one dict lookup per
  exact type, then the regexes, each compiled once when its entry arrives.
  Nothing is looked up on the publish path.
* A client connected to a node when an entry matching it arrives there is
  disconnected: MQTT 5 DISCONNECT ADMINISTRATIVE_ACTION (0x98; BANNED is
  not a DISCONNECT reason code, MQTT 5.0 §3.14.2.1), a v3 client's
  connection is closed.
* An entry past its ``expires_at`` no longer matches; every node drops it
  at that time and publishes its tombstone (several nodes publishing the
  same tombstone is harmless: a tombstone of a missing key changes nothing).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from typing import Callable

from twisted.internet import defer
from twisted.logger import Logger

from tbmq.cluster.client_records import BLOCKED_TYPES, REGEX_TARGETS, BlockedClient
from tbmq.cluster.records import Record
from tbmq.cluster.topics import node_group
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.mqtt import ReasonCode

__all__ = ["BlockedClients", "InvalidEntry", "entry_id", "new_entry"]

log = Logger(observer=LOG_OBSERVER)

#: the longest value an entry may have, characters
MAX_VALUE_LENGTH = 1024


class InvalidEntry(ValueError):
    """An entry that cannot be added (an unknown type, a bad regex...)."""


def entry_id(kind: str, value: str, regex_target: str | None) -> str:
    """:returns: the id of the entry: 16 hex digits of the SHA-1 of its
    type, regex target and value, so that the same entry added twice (on
    any node) is one key of the topic."""
    text = "\0".join((kind, regex_target or "", value))
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def new_entry(kind: str, value: str, regex_target: str | None = None,
              expires_at: float | None = None, now: float = 0.0,
              description: str | None = None) -> BlockedClient:
    """Check and build an entry.

    :param kind: one of :data:`~tbmq.cluster.client_records.BLOCKED_TYPES`.
    :param value: the client id, user name, IP address (IPv4 or IPv6,
        stored in its compressed form) or regular expression (Python ``re``
        syntax, matched against the whole field).
    :param regex_target: for ``regex``: ``client_id`` (the default),
        ``username`` or ``ip_address``; must be None for the other types.
    :param expires_at: seconds since the epoch, later than ``now``, or None.
    :param now: seconds since the epoch (the entry's creation time).
    :raises InvalidEntry: with a message naming the field.
    """
    if kind not in BLOCKED_TYPES:
        raise InvalidEntry(f"type: {kind!r} is not one of {', '.join(BLOCKED_TYPES)}")
    if not isinstance(value, str) or not value:
        raise InvalidEntry("value: must be a non-empty string")
    if len(value) > MAX_VALUE_LENGTH:
        raise InvalidEntry(f"value: longer than {MAX_VALUE_LENGTH} characters")
    if kind == "regex":
        regex_target = regex_target or "client_id"
        if regex_target not in REGEX_TARGETS:
            raise InvalidEntry(f"regex_target: {regex_target!r} is not one of "
                               f"{', '.join(REGEX_TARGETS)}")
        try:
            re.compile(value)
        except re.error as e:
            raise InvalidEntry(f"value: not a regular expression: {e}") from None
    elif regex_target is not None:
        raise InvalidEntry("regex_target: only for type regex")
    if kind == "ip_address":
        try:
            value = ipaddress.ip_address(value).compressed
        except ValueError:
            raise InvalidEntry(f"value: {value!r} is not an IP address") from None
    if expires_at is not None:
        if isinstance(expires_at, bool) or not isinstance(expires_at, (int, float)):
            raise InvalidEntry("expires_at: must be a number of seconds since the epoch or null")
        if expires_at <= now:
            raise InvalidEntry("expires_at: already past")
        expires_at = float(expires_at)
    if description is not None and not isinstance(description, str):
        raise InvalidEntry("description: must be a string or null")
    return BlockedClient(entry_id(kind, value, regex_target), kind, value, regex_target,
                         expires_at, float(now), description)


class BlockedClients:
    """The node's copy of the blocked-client list, and its changes.

    :param bus: the :class:`tbmq.interfaces.IMessageBus`.
    :param topic: the ``tbmq.client.blocked`` topic name.
    :param service_id: this node's service id (names the consumer group).
    :param clock: ``IReactorTime`` (``seconds()`` is the wall clock).
    :param connections: the node's live connections
        (:class:`tbmq.broker.protocol.MQTTProtocol`), for disconnecting
        the ones a new entry matches.
    :ivar entries: entry id → :class:`BlockedClient`.
    :ivar refused: CONNECTs refused on this node because of an entry.
    :ivar disconnected: connections this node closed because of an entry.
    """

    def __init__(self, bus, topic: str, service_id: str, clock, connections: set) -> None:
        self.bus = bus
        self.topic = topic
        self.service_id = service_id
        self.clock = clock
        self.connections = connections
        self.entries: dict[str, BlockedClient] = {}
        # type -> value -> entry (client_id, username, ip_address)
        self._exact: dict[str, dict[str, BlockedClient]] = {
            t: {} for t in REGEX_TARGETS}
        # id -> (compiled fullmatch, target, entry)
        self._regexes: dict[str, tuple[Callable, str, BlockedClient]] = {}
        self._timer = None
        self.consumer = None
        self.refused = 0
        self.disconnected = 0

    # -- the topic --------------------------------------------------------------------

    def start(self) -> defer.Deferred:
        """Replay ``tbmq.client.blocked`` from the beginning, then follow it.

        :returns: a Deferred firing once the replay is done.
        """
        self.consumer = self.bus.subscribe(self.topic, node_group(self.service_id),
                                           self._on_record, from_beginning=True,
                                           exclusive=True)
        return self.consumer.caught_up

    def stop(self) -> None:
        """Stop the expiry timer (the consumer stops with the node's)."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _on_record(self, record: Record) -> None:
        if record.value is None:
            self._forget(record.key)
        else:
            self._apply(record.value)

    def _apply(self, entry: BlockedClient) -> None:
        old = self.entries.get(entry.id)
        if old == entry:
            return
        if old is not None:
            self._forget(entry.id)
        if entry.expires_at is not None and entry.expires_at <= self.clock.seconds():
            # expired while nobody removed it (every node down): removed now,
            # after the handler (a publish from inside it would nest)
            self.clock.callLater(0, self._publish, entry.id, None)
            return
        self.entries[entry.id] = entry
        if entry.type == "regex":
            try:
                pattern = re.compile(entry.value)
            except re.error:  # checked when added; another writer's bad record
                log.warn("blocked client entry {id}: bad regex {value!r} ignored",
                         id=entry.id, value=entry.value)
                del self.entries[entry.id]
                return
            self._regexes[entry.id] = (pattern.fullmatch, entry.regex_target, entry)
        else:
            self._exact[entry.type][entry.value] = entry
        self._schedule()
        self._disconnect_matching(entry)

    def _forget(self, entry_id: str) -> None:
        entry = self.entries.pop(entry_id, None)
        if entry is None:
            return
        if entry.type == "regex":
            self._regexes.pop(entry_id, None)
        else:
            values = self._exact[entry.type]
            if values.get(entry.value) is entry:
                del values[entry.value]

    # -- expiry -----------------------------------------------------------------------

    def _schedule(self) -> None:
        """Time :meth:`_expire` for the earliest ``expires_at``."""
        soonest = min((e.expires_at for e in self.entries.values() if e.expires_at is not None),
                      default=None)
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if soonest is not None:
            delay = max(0.0, soonest - self.clock.seconds())
            self._timer = self.clock.callLater(delay, self._expire)

    def _expire(self) -> None:
        """Drop the entries past their time and publish their tombstones."""
        self._timer = None
        now = self.clock.seconds()
        for entry in [e for e in self.entries.values()
                      if e.expires_at is not None and e.expires_at <= now]:
            self._forget(entry.id)
            log.info("blocked client entry {id} ({type} {value!r}) expired", id=entry.id,
                     type=entry.type, value=entry.value)
            self._publish(entry.id, None)
        self._schedule()

    def _publish(self, key: str, value: BlockedClient | None):
        try:
            published = self.bus.publish(self.topic, key, value)
        except Exception as e:
            log.warn("blocked client entry {id} not published: {error}", id=key, error=e)
            return defer.fail(e)
        if isinstance(published, defer.Deferred):
            return published
        return defer.succeed(None)

    # -- matching ---------------------------------------------------------------------

    def match(self, client_id: str, username: str | None, address: str | None
              ) -> BlockedClient | None:
        """:returns: the first current entry matching a client, or None.

        :param client_id: the CONNECT's client id (the assigned one when it
            was empty).
        :param username: the CONNECT's user name, or None.
        :param address: the client's host (IP address), or None.
        """
        if not self.entries:
            return None
        exact = self._exact
        entry = exact["client_id"].get(client_id)
        if entry is None and username is not None:
            entry = exact["username"].get(username)
        if entry is None and address is not None:
            entry = exact["ip_address"].get(address)
        now = None
        if entry is not None:
            now = self.clock.seconds()
            if entry.expires_at is None or entry.expires_at > now:
                return entry
        fields = {"client_id": client_id, "username": username, "ip_address": address}
        for fullmatch, target, entry in self._regexes.values():
            value = fields[target]
            if value is not None and fullmatch(value):
                if now is None:
                    now = self.clock.seconds()
                if entry.expires_at is None or entry.expires_at > now:
                    return entry
        return None

    def _disconnect_matching(self, entry: BlockedClient) -> None:
        """Close this node's connections that ``entry`` (just added)
        matches: DISCONNECT ADMINISTRATIVE_ACTION (0x98) for MQTT 5."""
        for conn in list(self.connections):
            # a connected client's session, else the CONNECT waiting for its CONNACK
            client = conn.session or conn.connect_packet
            if client is None or conn._closing:
                continue
            if self.match(client.client_id, client.username, conn._peer()) is None:
                continue
            self.disconnected += 1
            log.info("client {client_id} disconnected: blocked ({type} {value!r})",
                     client_id=client.client_id, type=entry.type, value=entry.value)
            conn.disconnect(ReasonCode.ADMINISTRATIVE_ACTION, "blocked")

    # -- changes ----------------------------------------------------------------------

    def add(self, entry: BlockedClient) -> defer.Deferred:
        """Add (or replace) ``entry`` on every node: applied here at once,
        then published.

        :returns: a Deferred firing with None once the bus accepted it
            (failing with the bus's :class:`~tbmq.errors.BusError`).
        """
        self._apply(entry)
        return self._publish(entry.id, entry)

    def remove(self, entry_id: str) -> defer.Deferred | None:
        """Remove the entry ``entry_id`` on every node.

        :returns: None when there is no such entry, else a Deferred as
            :meth:`add`'s.
        """
        if entry_id not in self.entries:
            return None
        self._forget(entry_id)
        self._schedule()
        return self._publish(entry_id, None)

    def listing(self) -> list[BlockedClient]:
        """:returns: the current entries, oldest first."""
        now = self.clock.seconds()
        return sorted((e for e in self.entries.values()
                       if e.expires_at is None or e.expires_at > now),
                      key=lambda e: (e.created_at, e.id))
