"""TBMQ's rate limits and session limits on one node (``mqtt.rate_limits``,
``mqtt.sessions_limit``, ``mqtt.application_clients_limit``).

Per-client limits (``incoming_publish``, ``outgoing_publish``) keep a
:class:`~tbmq.ratelimit.TokenBucket` in the client's session, made at its
first message when the limit is enabled.

Cluster limits (``total``, ``device_persisted_messages``): TBMQ keeps one
bucket in Redis for the cluster; tbmq's nodes share no store that could
(the embedded node has none), so each node enforces its share of the limit:
the limit divided by the number of live nodes its
:class:`~tbmq.cluster.membership.Membership` knows (itself included, at
least one), looked at again at most every :data:`RESPLIT_INTERVAL` seconds
and the buckets re-split when it changed.  The cluster's total stays within
the limit when the traffic is spread evenly over the nodes; a node that
takes most of it refuses earlier than TBMQ would.

Session limits count the sessions of the session registry (every node
replays ``tbmq.client.session``, so each knows the cluster's): a soft limit,
as TBMQ's, since two nodes may admit the last place at the same moment.

What each refusal costs the client (TBMQ's answers):

* a v5 QoS 1/2 PUBLISH over ``incoming_publish`` or ``total``: PUBACK /
  PUBREC 0x97 Quota exceeded, the message not routed (0x96 Message rate
  too high is not a PUBACK or PUBREC reason code [MQTT-3.4.2.1,
  MQTT-3.5.2.1], only a DISCONNECT one);
* a v5 QoS 0 PUBLISH over them: dropped (nothing to answer with; TBMQ does
  the same);
* any v3.1/3.1.1 PUBLISH over them: the connection is closed (no negative
  acknowledgement exists [MQTT-3.3.5-2]; TBMQ disconnects too);
* a QoS 0 delivery to a non-persistent subscriber over ``outgoing_publish``
  or ``total``: dropped;
* a delivery to a persistent DEVICE's store over
  ``device_persisted_messages``: not stored;
* a CONNECT creating a session over ``sessions_limit`` or
  ``application_clients_limit``: CONNACK 0x97 Quota exceeded (v3: 0x03
  Server unavailable).

Every refusal is counted (the node's :class:`~tbmq.broker.hooks.DropCounter`
for messages, :attr:`NodeLimits.refused` for CONNECTs) and logged at most
once per limit every :data:`LOG_INTERVAL` seconds, with the count of those
not logged.
"""

from __future__ import annotations

import time
from typing import Callable

from twisted.logger import Logger

from tbmq.log import OBSERVER as LOG_OBSERVER, LogThrottle
from tbmq.model import ClientType
from tbmq.ratelimit import Bands, TokenBucket, parse_limits

__all__ = ["NodeLimits", "RESPLIT_INTERVAL", "LOG_INTERVAL", "SESSION_LIMITS"]

#: the keys of :attr:`NodeLimits.refused` (config keys of ``mqtt``)
SESSION_LIMITS = ("sessions_limit", "application_clients_limit")

#: seconds between two looks at the number of live nodes
RESPLIT_INTERVAL = 1.0

#: seconds between two log lines about one limit
LOG_INTERVAL = 10.0


def _is_app(info) -> bool:
    return info is not None and info.persistent and info.client_type is ClientType.APPLICATION


class NodeLimits:
    """The limits of ``mqtt`` enforced on this node.

    :param mqtt: the :class:`tbmq.config.MqttConfig`.
    :param clock: ``IReactorTime`` (the log throttles' timers).
    :param drops: the node's :class:`~tbmq.broker.hooks.DropCounter`.
    :param nodes: ``nodes() -> int``: live nodes of the cluster, or None (one).
    :param now: a monotonic clock, seconds (the buckets').
    :ivar incoming: the :class:`~tbmq.ratelimit.Bands` of
        ``incoming_publish``, or None when off.
    :ivar outgoing: those of ``outgoing_publish``, or None.
    :ivar total: the node's :class:`~tbmq.ratelimit.TokenBucket` of
        ``total``, or None.
    :ivar device_persisted: the node's bucket of
        ``device_persisted_messages``, or None.
    :ivar applications: persistent APPLICATION sessions in the registry
        (kept by :meth:`session_changed` while the limit is on).
    :ivar refused: CONNECTs refused, by limit (``sessions_limit``,
        ``application_clients_limit``).
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, mqtt, clock, drops, nodes: Callable[[], int] | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        limits = mqtt.rate_limits
        self.now = now
        self.drops = drops
        self.nodes = nodes
        self.sessions_limit = mqtt.sessions_limit
        self.application_clients_limit = mqtt.application_clients_limit
        self.applications = 0
        self.refused = dict.fromkeys(SESSION_LIMITS, 0)
        self.incoming = (Bands(parse_limits(limits.incoming_publish.client_config))
                         if limits.incoming_publish.enabled else None)
        self.outgoing = (Bands(parse_limits(limits.outgoing_publish.client_config))
                         if limits.outgoing_publish.enabled else None)
        self._share = 1
        self._looked_at = float("-inf")
        start = now()
        self.total = (TokenBucket(Bands(parse_limits(limits.total.config)), start)
                      if limits.total.enabled else None)
        persisted = limits.device_persisted_messages
        self.device_persisted = (TokenBucket(Bands(parse_limits(persisted.config)), start)
                                 if persisted.enabled else None)
        self._logs: dict[str, LogThrottle] = {}
        self._clock = clock

    # -- which paths need a look ------------------------------------------------------

    @property
    def checks_incoming(self) -> bool:
        """Whether a PUBLISH from a client is checked."""
        return self.incoming is not None or self.total is not None

    @property
    def checks_outgoing(self) -> bool:
        """Whether a delivery to a live session is checked."""
        return self.outgoing is not None or self.total is not None

    @property
    def checks_sessions(self) -> bool:
        """Whether a CONNECT creating a session is checked."""
        return bool(self.sessions_limit or self.application_clients_limit)

    # -- logging ------------------------------------------------------------------------

    def note(self, limit: str, fmt: str, **kwargs) -> None:
        """Log one refusal by ``limit`` (a config key), at most one line
        per limit every :data:`LOG_INTERVAL` seconds; the next says how
        many were not logged."""
        throttle = self._logs.get(limit)
        if throttle is None:
            throttle = self._logs[limit] = LogThrottle(
                self._clock, self.log, f"refusals by mqtt.{limit}", interval=LOG_INTERVAL,
                burst=1)
        throttle.info(fmt, limit=limit, **kwargs)

    # -- cluster shares -----------------------------------------------------------------

    def _resplit(self, now: float) -> None:
        """Divide the cluster limits by the live nodes, when their number
        changed since the last look."""
        self._looked_at = now
        share = max(1, self.nodes()) if self.nodes is not None else 1
        if share == self._share:
            return
        self.log.info("cluster rate limits split among {nodes} node(s)", nodes=share)
        self._share = share
        for bucket in (self.total, self.device_persisted):
            if bucket is not None:
                bucket.rebase(Bands(bucket.bands.pairs, 1.0 / share))

    def _cluster_take(self, bucket: TokenBucket, now: float) -> bool:
        if now - self._looked_at >= RESPLIT_INTERVAL:
            self._resplit(now)
        return bucket.take(now)

    # -- messages -------------------------------------------------------------------------

    def admit_incoming(self, session) -> str | None:
        """A PUBLISH from ``session``'s client.

        :returns: None when admitted, else the drop reason
            (``incoming_rate_limited`` or ``total_rate_limited``), counted.
        """
        now = self.now()
        bands = self.incoming
        if bands is not None:
            bucket = session.rate_in
            if bucket is None:
                bucket = session.rate_in = TokenBucket(bands, now)
            if not bucket.take(now):
                self.drops.add("incoming_rate_limited")
                self.note("rate_limits.incoming_publish",
                          "PUBLISH of {client_id} refused: over {limit}",
                          client_id=session.client_id)
                return "incoming_rate_limited"
        total = self.total
        if total is None:
            return None
        if now - self._looked_at >= RESPLIT_INTERVAL:
            self._resplit(now)
        if not total.take(now):
            self.drops.add("total_rate_limited")
            self.note("rate_limits.total", "PUBLISH of {client_id} refused: over {limit}",
                      client_id=session.client_id)
            return "total_rate_limited"
        return None

    def admit_outgoing(self, session, qos: int, message) -> bool:
        """A delivery of ``message`` at ``qos`` to ``session``'s live
        connection.

        ``outgoing_publish`` applies to QoS 0 deliveries to a non-persistent
        session (TBMQ's); ``total`` to every delivery that can be dropped:
        QoS 0 ones and those to non-persistent sessions (a persistent
        session's QoS 1/2 messages are never dropped here).

        :returns: True when admitted; False when dropped (counted by
            :meth:`tbmq.broker.outbox.Outbox.drop` as
            ``outgoing_rate_limited`` or ``total_rate_limited``, logged).
        """
        now = self.now()
        bands = self.outgoing
        if bands is not None and qos == 0 and not session.persistent:
            bucket = session.rate_out
            if bucket is None:
                bucket = session.rate_out = TokenBucket(bands, now)
            if not bucket.take(now):
                session.drop("outgoing_rate_limited", message)
                self.note("rate_limits.outgoing_publish",
                          "message to {client_id} dropped: over {limit}",
                          client_id=session.client_id)
                return False
        total = self.total
        if total is None or (qos and session.persistent):
            return True
        if now - self._looked_at >= RESPLIT_INTERVAL:
            self._resplit(now)
        if not total.take(now):
            session.drop("total_rate_limited", message)
            self.note("rate_limits.total", "message to {client_id} dropped: over {limit}",
                      client_id=session.client_id)
            return False
        return True

    def admit_persisted(self, client_id: str) -> bool:
        """A delivery to be stored for the persistent DEVICE ``client_id``
        (``device_persisted_messages``; call only when
        :attr:`device_persisted` is not None).

        :returns: True when admitted; False when over the limit (counted as
            ``device_persisted_rate_limited`` and logged)."""
        if self._cluster_take(self.device_persisted, self.now()):
            return True
        self.drops.add("device_persisted_rate_limited")
        self.note("rate_limits.device_persisted_messages",
                  "message for {client_id} not stored: over {limit}", client_id=client_id)
        return False

    # -- sessions -----------------------------------------------------------------------

    def session_changed(self, client_id: str, old, new) -> None:
        """A session registry listener: keeps :attr:`applications`."""
        self.applications += _is_app(new) - _is_app(old)

    def admit_session(self, registry_size: int, persistent: bool, client_type,
                      known: bool, existing) -> str | None:
        """A CONNECT that authenticated.

        :param registry_size: sessions the registry knows.
        :param persistent: whether the session asked for is persistent.
        :param client_type: its :class:`~tbmq.model.ClientType`.
        :param known: whether its client id has a session (here or in the
            registry): it resumes or replaces it, and is never refused by
            ``sessions_limit`` (TBMQ's rule).
        :param existing: the registry's ``SessionInfo`` of its client id,
            or None: a persistent APPLICATION one already is not refused by
            ``application_clients_limit``.
        :returns: None when admitted, else the config key of the limit
            (counted in :attr:`refused`).
        """
        limit = self.sessions_limit
        if limit and not known and registry_size >= limit:
            self.refused["sessions_limit"] += 1
            return "sessions_limit"
        limit = self.application_clients_limit
        if limit and persistent and client_type is ClientType.APPLICATION \
                and not _is_app(existing) and self.applications >= limit:
            self.refused["application_clients_limit"] += 1
            return "application_clients_limit"
        return None
