"""The group side of a joining :class:`~.loop.SharedLoop`: subscribe to
the members' topics, leave the group, join it again when no assignment
comes, and split each rebalance per topic (see :mod:`.loop`)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from twisted.logger import Logger

from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq_plugins.kafka.drivers import SharedClient

__all__ = ["Joining"]

log = Logger(observer=LOG_OBSERVER)


def _by_topic(tps: list[tuple]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = defaultdict(list)
    for topic, p in tps:
        found[topic].append(p)
    return found


class Joining:
    """The joining steps of :class:`~.loop.SharedLoop` (a mixin: they use
    its attributes ``_topics``, ``_subscribed``, ``_assignment``,
    ``_rebalancing``, ``_rebalance_deadline``, ``_closing``, ``_grace``,
    ``_timeout``, ``_stuck``, ``_lock``, and its ``_turn`` and ``_close``)."""

    _topics: dict
    _subscribed: list
    _assignment: set
    _rebalancing: bool
    _rebalance_deadline: float
    _closing: bool
    _grace: float
    _timeout: float
    _stuck: float
    _lock: Any
    name: str

    def _keep_joined(self, client: SharedClient) -> SharedClient:
        """Subscribe to the members' topics when they changed (a client
        that cannot change them in place leaves the group, and the next one
        joins with them); join again when no assignment came for too long.

        :returns: the client, or None when it was closed."""
        if self._rebalancing and time.monotonic() > self._rebalance_deadline:
            log.warn("Kafka consumer {name}: no partitions assigned for {seconds:.0f} s; "
                     "joining the group again", name=self.name, seconds=self._stuck)
            self._close(client)
            return None
        topics = sorted(self._topics)
        if topics and topics != self._subscribed:
            if self._subscribed and not client.resubscribes:
                if self._rebalancing:
                    return client  # the join under way first (see _leave)
                self._leave(client)  # the next client joins with the topics
                return None
            try:
                client.subscribe(topics, self._on_assign, self._on_revoke)
            except Exception as e:
                self._trouble(e)
                return client
            self._subscribed = topics
            self._rebalancing = True  # joining
            self._rebalance_deadline = time.monotonic() + self._stuck
        return client

    def _leave(self, client: SharedClient) -> None:
        """Before leaving the group: notice a rebalance under way (within
        two heartbeats) and take part in it until the assignment.  Tansu
        keeps a member that leaves between its join and its assignment as
        the group's leader, and the group never gets an assignment again."""
        now = time.monotonic()
        grace, deadline = now + self._grace, now + self._grace + self._timeout
        while now < deadline and (self._rebalancing or now < grace):
            self._turn(client, fast=True)
            now = time.monotonic()
        self._close(client)

    def _on_assign(self, tps: list[tuple]) -> None:
        """The group gave ``tps`` (in this thread, during a poll): each
        topic's member positions its partitions."""
        self._rebalancing = False
        with self._lock:
            self._assignment.update(tps)
        for topic, partitions in _by_topic(tps).items():
            member = self._topics.get(topic)
            if member is not None:
                member.on_assign(partitions)

    def _on_revoke(self, tps: list[tuple]) -> dict[tuple, int]:
        """The group takes ``tps`` back (possibly in the client's own
        thread).  :returns: the offsets to commit before they go."""
        if not self._closing and not self._rebalancing:
            self._rebalancing = True
            self._rebalance_deadline = time.monotonic() + self._stuck
        with self._lock:
            self._assignment.difference_update(tps)
        offsets = {}
        for topic, partitions in _by_topic(tps).items():
            member = self._topics.get(topic)
            if member is not None:
                offsets.update({(topic, p): o for p, o in member.on_revoke(partitions).items()})
        return offsets
