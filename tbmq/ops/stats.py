"""What the metrics, the ``$SYS`` topics and the admin API read of a node:
figures computed when asked (never on the message path) from the node's
:class:`tbmq.node_view.NodeView`.

Figures come in two scopes:

* **node**: what this node did or holds (messages and bytes, drops,
  connections, the sessions it holds, latencies) — from
  :class:`tbmq.broker.traffic.Traffic`, the drop counter and its sessions;
* **cluster**: what every node sees alike — the session registry
  (``tbmq.client.session``), the subscription book
  (``tbmq.client.subscriptions``), the retained messages and the nodes
  heard from (:mod:`tbmq.cluster`).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field

from twisted.internet import task
from twisted.logger import Logger

from tbmq import __version__
from tbmq.auth import AUTH_FAILURE_CODES
from tbmq.hookspecs import hookimpl
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import ClientType

log = Logger(observer=LOG_OBSERVER)


@dataclass
class SessionCounts:
    """Sessions counted by kind.

    :ivar total: every session.
    :ivar connected: those with a live connection.
    :ivar persistent: the persistent ones (TBMQ's rule).
    :ivar by_kind: ``(persistent, client type value, connected)`` → count.
    """

    total: int = 0
    connected: int = 0
    persistent: int = 0
    by_kind: Counter = field(default_factory=Counter)

    def add(self, persistent: bool, client_type, connected: bool) -> None:
        self.total += 1
        self.connected += connected
        self.persistent += persistent
        self.by_kind[(bool(persistent), ClientType(client_type).value, bool(connected))] += 1

    def as_json(self) -> dict:
        """:returns: ``{total, connected, disconnected, persistent,
        non_persistent, device, application}``."""
        device = sum(n for (_, kind, _), n in self.by_kind.items()
                     if kind == ClientType.DEVICE.value)
        return {"total": self.total, "connected": self.connected,
                "disconnected": self.total - self.connected,
                "persistent": self.persistent, "non_persistent": self.total - self.persistent,
                "device": device, "application": self.total - device}


class NodeStats:
    """A read-only view of one node for operators.

    :param node: the node's :class:`tbmq.node_view.NodeView`.
    :param wall: ``wall() -> float``, seconds since the epoch.
    :ivar started_at: seconds since the epoch when this view was made (the
        node's start).
    """

    def __init__(self, node, wall=time.time) -> None:
        self.node = node
        self.wall = wall
        self.started_at = wall()
        #: ``reason code → count`` of refused CONNECTs (the metrics plugin
        #: adds); every one of :data:`tbmq.auth.AUTH_FAILURE_CODES` from the
        #: start (0)
        self.auth_failures: Counter = Counter(dict.fromkeys(map(int, AUTH_FAILURE_CODES), 0))
        #: most connections seen open at once on this node
        self.max_connections = 0
        #: ``$SYS`` messages this node keeps in its retained tree (not counted)
        self.sys_retained = 0

    @hookimpl
    def tbmq_authentication_failed(self, connect, address, reason_code):
        """Count a refused CONNECT by its reason code (a notification hook:
        this view is registered as the ``ops`` plugin)."""
        self.auth_failures[int(reason_code)] += 1

    # -- node scope ------------------------------------------------------------------

    @property
    def service_id(self) -> str:
        return self.node.service_id

    @property
    def version(self) -> str:
        return __version__

    def uptime(self) -> float:
        """:returns: seconds since the node started."""
        return max(0.0, self.wall() - self.started_at)

    def connections(self) -> dict[str, int]:
        """:returns: listener name → MQTT connections open on it now
        (those still before CONNECT included)."""
        counts = self.node.connections_by_listener()
        total = sum(counts.values())
        if total > self.max_connections:
            self.max_connections = total
        return counts

    def local_sessions(self) -> SessionCounts:
        """:returns: the sessions this node holds, counted."""
        counts = SessionCounts()
        for session in self.node.sessions().values():
            counts.add(session.persistent, session.client_type, session.connected)
        return counts

    def local_subscriptions(self) -> int:
        """:returns: subscriptions of the sessions this node holds."""
        return sum(len(s.subscriptions) for s in self.node.sessions().values())

    def traffic(self):
        """:returns: the node's :class:`tbmq.broker.traffic.Traffic`."""
        return self.node.traffic

    def dropped(self) -> dict[str, int]:
        """:returns: reason → messages not delivered on this node."""
        return self.node.dropped()

    def consumer_lag(self) -> dict[tuple[str, str], int]:
        """:returns: ``(group, topic)`` → records not yet committed, for the
        bus consumers that report it (a ``lag()`` method)."""
        lags: Counter = Counter()
        for consumer in self.node.consumers():
            lag = getattr(consumer, "lag", None)
            if callable(lag):
                try:
                    lags[(consumer.group, consumer.topic)] += int(lag())
                except Exception:  # noqa: BLE001 - a consumer that cannot tell is left out
                    continue
        return dict(lags)

    # -- cluster scope -----------------------------------------------------------------

    def cluster_sessions(self) -> SessionCounts:
        """:returns: every session in the cluster (the session registry),
        counted."""
        counts = SessionCounts()
        for info in list(self.node.cluster_sessions().values()):
            counts.add(info.persistent, info.client_type, info.connected)
        return counts

    def cluster_subscriptions(self) -> int:
        """:returns: subscriptions of every session in the cluster."""
        return sum(len(subs) for subs in list(self.node.subscriptions().values()))

    def retained_messages(self) -> int:
        """:returns: retained messages (every node holds them all; this
        node's own ``$SYS`` topics not counted)."""
        return max(0, self.node.retained_count() - self.sys_retained)

    def nodes(self) -> list[dict]:
        """:returns: every node known, this one first: ``{service_id, alive,
        this, started_at, last_seen, stopping, listeners, sessions}``
        (``last_seen`` in seconds since the epoch, ``sessions`` the number
        the registry shows held there)."""
        node = self.node
        alive = set(node.alive_nodes())
        known = node.known_nodes()
        heard = node.last_heard()
        by_node = node.sessions_by_node()
        now = self.wall()
        clock_now = node.clock.seconds()
        out = [{
            "service_id": node.service_id, "alive": True, "this": True,
            "started_at": node.started_at or self.started_at, "last_seen": now,
            "stopping": False,
            "listeners": [lc.label for lc in node.config.listeners],
            "sessions": by_node.get(node.service_id, 0),
        }]
        for sid in sorted(set(known) | set(by_node)):
            if sid == node.service_id or not sid:
                continue
            info = known.get(sid)
            seen = heard.get(sid)
            out.append({
                "service_id": sid, "alive": sid in alive, "this": False,
                "started_at": info.started_at if info else None,
                "last_seen": (now - (clock_now - seen)) if seen is not None else
                (info.sent_at if info else None),
                "stopping": bool(info and info.stopping),
                "listeners": list(info.listeners) if info else [],
                "sessions": by_node.get(sid, 0),
            })
        return out

    # -- both ----------------------------------------------------------------------------

    def snapshot(self) -> dict:
        """:returns: the figures of both scopes as JSON-able data (the
        ``MetricsSnapshot`` schema of the admin API)."""
        traffic = self.traffic()
        connections = self.connections()
        latency = traffic.latency
        return {
            "service_id": self.service_id,
            "version": self.version,
            "time": self.wall(),
            "uptime": self.uptime(),
            "node": {
                "connections": sum(connections.values()),
                "connections_by_listener": connections,
                "max_connections": self.max_connections,
                "sessions": self.local_sessions().as_json(),
                "subscriptions": self.local_subscriptions(),
                "messages_received": sum(traffic.received),
                "messages_sent": sum(traffic.sent),
                "messages_dropped": sum(self.dropped().values()),
                "messages_received_by_qos": list(traffic.received),
                "messages_sent_by_qos": list(traffic.sent),
                "bytes_received": traffic.bytes_read,
                "bytes_sent": traffic.bytes_written,
                "payload_bytes_received": sum(traffic.received_bytes),
                "payload_bytes_sent": sum(traffic.sent_bytes),
                "dropped_by_reason": self.dropped(),
                "deliveries_timed": sum(latency),
                "delivery_latency_sum": traffic.latency_sum,
                "authentication_failures": sum(self.auth_failures.values()),
            },
            "cluster": {
                "nodes": len(self.node.alive_nodes()),
                "sessions": self.cluster_sessions().as_json(),
                "subscriptions": self.cluster_subscriptions(),
                "retained_messages": self.retained_messages(),
            },
        }


class Periodic:
    """Something done every ``interval`` seconds on ``clock``
    (:meth:`tick`), from :meth:`start` until :meth:`stop`."""

    interval: float
    clock: object
    _loop: task.LoopingCall | None = None

    def start(self) -> None:
        """Tick now and every ``interval`` seconds."""
        self._loop = task.LoopingCall(self.tick)
        self._loop.clock = self.clock
        self._loop.start(self.interval, now=True).addErrback(
            lambda f: log.failure("{what} stopped", f, what=type(self).__name__))

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def tick(self) -> None:
        raise NotImplementedError


class History(Periodic):
    """Per-second rates of the node's figures over the last minutes, for
    the console's charts (sampled every ``interval`` seconds, never on the
    message path).

    Each point is ``{t, received, sent, dropped, auth_failures,
    connections, sessions, cluster_sessions}``: ``t`` seconds since the
    epoch; the first three messages per second over the interval before
    ``t``, ``auth_failures`` CONNECTs refused by authentication per second
    (this node's); the others the counts at ``t`` (``sessions`` this
    node's, ``cluster_sessions`` the registry's).

    :param stats: the :class:`NodeStats`.
    :param clock: ``IReactorTime``.
    :param interval: seconds between two samples, > 0.
    :param size: points kept.
    """

    def __init__(self, stats: NodeStats, clock, interval: float = 1.0, size: int = 300) -> None:
        self.stats = stats
        self.clock = clock
        self.interval = interval
        self.points: deque = deque(maxlen=size)
        self._last: tuple | None = None

    def tick(self) -> None:
        """Take one point (and start a sample of the bus's call latency,
        :mod:`tbmq.timing`)."""
        stats = self.stats
        times = stats.node.call_times
        if times is not None:
            times.sample()
        traffic = stats.traffic()
        now = stats.wall()
        totals = (now, sum(traffic.received), sum(traffic.sent), sum(stats.dropped().values()),
                  sum(stats.auth_failures.values()))
        last, self._last = self._last, totals
        if last is None:
            return
        elapsed = max(1e-6, now - last[0])
        self.points.append({
            "t": now,
            "received": (totals[1] - last[1]) / elapsed,
            "sent": (totals[2] - last[2]) / elapsed,
            "dropped": (totals[3] - last[3]) / elapsed,
            "auth_failures": (totals[4] - last[4]) / elapsed,
            "connections": sum(stats.connections().values()),
            "sessions": stats.local_sessions().total,
            "cluster_sessions": len(stats.node.cluster_sessions()),
        })
