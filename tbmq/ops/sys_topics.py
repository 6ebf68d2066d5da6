"""The ``$SYS/broker/...`` topics, with Mosquitto's names, published every
``sys_interval`` seconds.

Each node publishes its own: a client reads the figures of the node it is
connected to, as a Mosquitto client reads its broker's.  The ``clients``,
``subscriptions`` and ``retained messages`` figures are the cluster's (the
session registry and the subscription book, the same on every node); the
message, byte and load figures are this node's.  The messages are retained
in the node's own retained tree only (a new subscriber gets the last values
at once, as from Mosquitto), never on the bus nor in the retained store, and
are delivered at QoS 0 to this node's subscribers.  A value is published
when it changed (``uptime`` every time).  As for any topic starting with
``$``, a filter starting with a wildcard (``#``, ``+/...``) does not match
them [MQTT-4.7.2-1]: subscribe to ``$SYS/#``.

Topics (``<n>`` ``1min``, ``5min`` or ``15min``):

* ``version``, ``uptime`` ("<seconds> seconds");
* ``clients/connected``, ``clients/disconnected`` (persistent sessions
  offline), ``clients/total``, ``clients/maximum`` (most connections open
  at once on this node), ``clients/active`` and ``clients/inactive``
  (Mosquitto's older names of the same);
* ``messages/received``, ``messages/sent`` (PUBLISH packets),
  ``publish/messages/received``, ``publish/messages/sent``,
  ``publish/messages/dropped``, ``publish/bytes/received``,
  ``publish/bytes/sent`` (PUBLISH payload bytes), ``bytes/received``,
  ``bytes/sent`` (every MQTT byte);
* ``subscriptions/count``, ``retained messages/count``;
* ``load/messages/received/<n>``, ``load/messages/sent/<n>``,
  ``load/publish/dropped/<n>``, ``load/bytes/received/<n>``,
  ``load/bytes/sent/<n>``, ``load/connections/<n>``: per-minute rates
  averaged over 1, 5 and 15 minutes (exponentially decaying, as
  Mosquitto's);
* tbmq's own: ``cluster/nodes`` (nodes alive) and ``service_id``.
"""

from __future__ import annotations

import math

from tbmq.model import Message
from tbmq.ops.stats import Periodic

PREFIX = "$SYS/broker/"
#: the windows of the load averages, in seconds, by topic suffix
LOAD_WINDOWS = (("1min", 60.0), ("5min", 300.0), ("15min", 900.0))


class SysTopics(Periodic):
    """Publishes the ``$SYS/broker/...`` topics of one node.

    :param stats: the node's :class:`tbmq.ops.stats.NodeStats`.
    :param node: the node's :class:`tbmq.node_view.NodeView` (it keeps and
        delivers the node's own ``$SYS`` messages, :meth:`~tbmq.node_view.NodeView.publish_local`).
    :param clock: ``IReactorTime``.
    :param interval: seconds between two publications, > 0.
    :ivar published: topic → the payload last published.
    """

    def __init__(self, stats, node, clock, interval: float) -> None:
        self.stats = stats
        self.node = node
        self.clock = clock
        self.interval = interval
        self.published: dict[str, bytes] = {}
        self._loads: dict[str, float] = {}
        self._last: dict[str, float] | None = None

    def values(self) -> dict[str, str]:
        """:returns: topic (without ``$SYS/broker/``) → value now, the load
        averages updated."""
        stats = self.stats
        traffic = stats.traffic()
        connections = sum(stats.connections().values())
        sessions = stats.cluster_sessions()
        offline = sessions.total - sessions.connected
        dropped = sum(stats.dropped().values())
        received, sent = sum(traffic.received), sum(traffic.sent)
        values = {
            "version": f"tbmq version {stats.version}",
            "uptime": f"{int(stats.uptime())} seconds",
            "service_id": stats.service_id,
            "clients/connected": sessions.connected,
            "clients/active": sessions.connected,
            "clients/disconnected": offline,
            "clients/inactive": offline,
            "clients/total": sessions.total,
            "clients/maximum": stats.max_connections,
            "messages/received": received,
            "messages/sent": sent,
            "publish/messages/received": received,
            "publish/messages/sent": sent,
            "publish/messages/dropped": dropped,
            "publish/bytes/received": sum(traffic.received_bytes),
            "publish/bytes/sent": sum(traffic.sent_bytes),
            "bytes/received": traffic.bytes_read,
            "bytes/sent": traffic.bytes_written,
            "subscriptions/count": stats.cluster_subscriptions(),
            "retained messages/count": stats.retained_messages(),
            "cluster/nodes": len(self.node.alive_nodes()),
        }
        totals = {"messages/received": received, "messages/sent": sent,
                  "publish/dropped": dropped, "bytes/received": traffic.bytes_read,
                  "bytes/sent": traffic.bytes_written, "connections": connections}
        now = self.clock.seconds()
        last, self._last = self._last, dict(totals, at=now)
        for name, total in totals.items():
            for suffix, window in LOAD_WINDOWS:
                key = f"load/{name}/{suffix}"
                if last is not None and now > last["at"]:
                    elapsed = now - last["at"]
                    if name == "connections":
                        rate = float(total)  # a level, averaged as it is
                    else:
                        rate = (total - last[name]) * 60.0 / elapsed  # per minute
                    alpha = 1.0 - math.exp(-elapsed / window)
                    self._loads[key] = self._loads.get(key, rate) + alpha * (
                        rate - self._loads.get(key, rate))
                values[key] = f"{self._loads.get(key, 0.0):.2f}"
        return {k: str(v) for k, v in values.items()}

    def tick(self) -> None:
        """Publish the values that changed (``uptime`` always)."""
        for name, value in self.values().items():
            topic = PREFIX + name
            payload = value.encode("utf-8")
            if self.published.get(topic) == payload and name != "uptime":
                continue
            self.published[topic] = payload
            self.publish(topic, payload)
        self.stats.sys_retained = len(self.published)

    def publish(self, topic: str, payload: bytes) -> None:
        """Keep ``payload`` as this node's retained message of ``topic`` and
        deliver it at QoS 0 to this node's connected subscribers."""
        message = Message(topic, payload, 0, True, {}, "", self.clock.seconds(), None)
        self.node.publish_local(message)
