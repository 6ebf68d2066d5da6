"""The cluster's message figures, from the nodes' heartbeats.

Every node sends its totals since it started in its heartbeat
(:attr:`tbmq.cluster.records.NodeInfo.counters`, every
``node.heartbeat_interval`` seconds, :mod:`tbmq.cluster.membership`).  A
node's *rates* are the differences of its last two heartbeats over the time
between them (this node's own: of its live counters over the last
``interval`` seconds); the cluster's totals and rates are the sums over the
live nodes.  Nothing here runs per message: a sample every ``interval``
seconds reads a few dicts.

On the embedded node (no other node) the figures are the node's own.
"""

from __future__ import annotations

import time
from collections import deque

from tbmq.cluster.records import HEARTBEAT_COUNTERS
from tbmq.ops.stats import Periodic

#: the counters that are totals since the node started (a rate each); the
#: others (``connections``, ``sessions``) are counts at the heartbeat
TOTALS = ("received", "sent", "dropped", "received_bytes", "sent_bytes", "bytes_read",
          "bytes_written")
#: the counters that are counts now
GAUGES = tuple(name for name in HEARTBEAT_COUNTERS if name not in TOTALS)


def rates(last: dict, before: dict, seconds: float) -> dict[str, float]:
    """Per-second rates of the totals between two readings.

    :param last: the later counters (``name → int``).
    :param before: the earlier ones, of the same run of the node.
    :param seconds: the time between them, > 0.
    :returns: :data:`TOTALS` name → per second, for the names both readings
        have; a total that went down (a counter reset) counts 0.
    """
    return {name: max(0, last[name] - before[name]) / seconds
            for name in TOTALS if name in last and name in before}


def node_rates(latest, previous) -> dict[str, float]:
    """:param latest: a node's last :class:`~tbmq.cluster.records.NodeInfo`.
    :param previous: the one before, or None.
    :returns: the node's rates between the two heartbeats (:func:`rates`);
        ``{}`` when there is no earlier heartbeat of the same run (the node
        restarted, or sent one heartbeat so far)."""
    if previous is None or previous.started_at != latest.started_at:
        return {}
    seconds = latest.sent_at - previous.sent_at
    if seconds <= 0:
        return {}
    return rates(latest.counters, previous.counters, seconds)


def cluster_sum(rows: list[dict]) -> tuple[dict, dict]:
    """Sum the live nodes' figures.

    :param rows: the rows of :meth:`ClusterStats.nodes`.
    :returns: ``(totals, rates)``: name → the sum over the rows with
        ``alive`` true; every name of :data:`HEARTBEAT_COUNTERS` (totals)
        and :data:`TOTALS` (rates) present (0 when no node has it).
    """
    totals = dict.fromkeys(HEARTBEAT_COUNTERS, 0)
    per_second = dict.fromkeys(TOTALS, 0.0)
    for row in rows:
        if not row["alive"]:
            continue
        for name, value in row["counters"].items():
            if name in totals:
                totals[name] += value
        for name, value in row["rates"].items():
            per_second[name] += value
    return totals, per_second


class ClusterStats(Periodic):
    """The cluster's totals and rates, and their history for the console's
    charts (one point every ``interval`` seconds).

    Each point is ``{t, received, sent, dropped, connections, sessions,
    nodes}``: ``t`` seconds since the epoch; the first three messages per
    second summed over the live nodes; ``connections`` and ``sessions``
    the MQTT connections open and the sessions held, summed; ``nodes`` the
    live nodes counted.

    :param node: the node's :class:`tbmq.node_view.NodeView` (its
        ``service_id``, ``known_nodes()``, ``previous_heartbeats()``,
        ``alive_nodes()`` and ``heartbeat_counters()``).
    :param clock: ``IReactorTime``.
    :param wall: ``wall() -> float``, seconds since the epoch.
    :param interval: seconds between two points, > 0.
    :param size: points kept.
    """

    def __init__(self, node, clock, wall=time.time, interval: float = 1.0,
                 size: int = 300) -> None:
        self.node = node
        self.clock = clock
        self.wall = wall
        self.interval = interval
        self.points: deque = deque(maxlen=size)
        self._own: dict = {}  # this node's rates over the last interval
        self._last: tuple[float, dict] | None = None

    def _counters(self) -> dict:
        return self.node.heartbeat_counters()

    def tick(self) -> None:
        """Read this node's counters (its rates), and take one point."""
        now, counters = self.wall(), self._counters()
        last, self._last = self._last, (now, counters)
        if last is None:
            return
        self._own = rates(counters, last[1], max(1e-6, now - last[0]))
        rows = self.nodes()
        totals, per_second = cluster_sum(rows)
        self.points.append({
            "t": now, "received": per_second["received"], "sent": per_second["sent"],
            "dropped": per_second["dropped"], "connections": totals["connections"],
            "sessions": totals["sessions"], "nodes": sum(1 for r in rows if r["alive"])})

    def nodes(self) -> list[dict]:
        """:returns: one row per node heard from, this one first:
            ``{service_id, this, alive, sent_at, counters, rates}``
            (``sent_at`` the time of the heartbeat the figures come from,
            seconds since the epoch; this node's counters are read now, its
            rates are those of the last ``interval``; ``counters`` as
            :attr:`~tbmq.cluster.records.NodeInfo.counters`, ``rates``
            :data:`TOTALS` name → per second, ``{}`` until two heartbeats
            were heard)."""
        node = self.node
        alive = set(node.alive_nodes())
        known, previous = node.known_nodes(), node.previous_heartbeats()
        rows = [{"service_id": node.service_id, "this": True, "alive": True,
                 "sent_at": self.wall(), "counters": self._counters(),
                 "rates": dict(self._own)}]
        for sid in sorted(known):
            if sid == node.service_id:
                continue
            info = known[sid]
            live = sid in alive and not info.stopping
            rows.append({"service_id": sid, "this": False, "alive": live,
                         "sent_at": info.sent_at, "counters": dict(info.counters),
                         "rates": node_rates(info, previous.get(sid)) if live
                         else {}})
        return rows

    def snapshot(self) -> dict:
        """:returns: ``{time, interval, nodes, totals, rates, by_node,
            points}`` (the ``ClusterMetrics`` schema of the admin API):
            ``nodes`` the live nodes counted, ``totals`` and ``rates`` their
            sums (:func:`cluster_sum`), ``by_node`` the rows of
            :meth:`nodes`, ``points`` the history (oldest first)."""
        rows = self.nodes()
        totals, per_second = cluster_sum(rows)
        return {"time": self.wall(), "interval": self.interval,
                "nodes": sum(1 for r in rows if r["alive"]), "totals": totals,
                "rates": per_second, "by_node": rows, "points": list(self.points)}
