"""What flows through one node, counted in plain ints on the hot path.

The session and the connection add to a :class:`Traffic` as they go (a list
index and an add per message: no lock, no dict lookup); the metrics
collector (:mod:`tbmq.ops.metrics`) and the ``$SYS`` publisher
(:mod:`tbmq.ops.sys_topics`) read the totals when they are asked.
"""

from __future__ import annotations

from bisect import bisect_left

#: upper bounds, in seconds, of the delivery latency histogram's buckets
#: (the last bucket, past the last bound, is +Inf)
LATENCY_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                  2.5, 5.0, 10.0, 30.0, 60.0)

#: the first bound: most deliveries of a node take less (no search)
FIRST_LATENCY_BOUND = LATENCY_BOUNDS[0]


class Traffic:
    """The node's message and byte totals since it started.

    Lists indexed by QoS (0, 1, 2) count MQTT PUBLISH packets and their
    application payload bytes, the same way in and out (as Mosquitto's
    ``$SYS/broker/publish/bytes/*``); ``bytes_read``/``bytes_written`` count
    every byte of every MQTT packet read from and written to the node's
    connections (all packet types, as Mosquitto's ``$SYS/broker/bytes/*``).

    :ivar received: PUBLISH packets accepted from clients, by QoS.
    :ivar received_bytes: their payload bytes, by QoS.
    :ivar sent: PUBLISH packets written to clients (resends included), by QoS.
    :ivar sent_bytes: their payload bytes, by QoS.
    :ivar latency: delivery latency histogram: ``latency[i]`` counts the
        deliveries whose latency is at most ``LATENCY_BOUNDS[i]`` and above
        the bound before it; the last entry counts those above every bound.
        The latency is the time from the receipt of the PUBLISH (on
        whichever node) to the encoding of its copy for a subscriber here,
        in seconds: once per message and encoding, so the copies of a
        fan-out that share one encoded PUBLISH are observed once (their
        latency is the same); messages sent with RETAIN set and resends
        are not counted.
    :ivar latency_sum: the sum of the latencies counted, seconds (the
        outbox counts both, :meth:`observe`).
    :ivar observe_latency: whether ``latency`` and ``latency_sum`` are
        kept: only their readers (the HTTP listener's ``/metrics``, REST API
        and console) need them, and observing costs about 2 % of the CPU of
        a local delivery, so a node without an HTTP listener leaves both at
        zero.  ``$SYS`` topics read only the other totals.
    :ivar bytes_read: bytes read from MQTT connections.
    :ivar bytes_written: bytes written to MQTT connections.
    """

    #: the names of the totals, as :meth:`snapshot` gives them
    TOTALS = ("received", "received_bytes", "sent", "sent_bytes", "latency", "latency_sum",
              "bytes_read", "bytes_written")
    __slots__ = TOTALS + ("observe_latency",)

    def __init__(self, observe_latency: bool = True) -> None:
        self.observe_latency = observe_latency
        self.received = [0, 0, 0]
        self.received_bytes = [0, 0, 0]
        self.sent = [0, 0, 0]
        self.sent_bytes = [0, 0, 0]
        self.latency = [0] * (len(LATENCY_BOUNDS) + 1)
        self.latency_sum = 0.0
        self.bytes_read = 0
        self.bytes_written = 0

    def observe(self, received_at: float, now: float) -> None:
        """Count in :attr:`latency` and :attr:`latency_sum` the delivery
        latency of a message received at ``received_at`` and encoded for a
        subscriber at ``now`` (seconds since the epoch); only when
        :attr:`observe_latency`."""
        latency = now - received_at
        self.latency[0 if latency <= FIRST_LATENCY_BOUND
                     else bisect_left(LATENCY_BOUNDS, latency)] += 1
        self.latency_sum += latency

    def snapshot(self) -> dict:
        """:returns: the totals as plain data (lists copied)."""
        return {name: (list(value) if isinstance(value, list) else value)
                for name in self.TOTALS for value in (getattr(self, name),)}


def heartbeat_counters(traffic: Traffic, drops: dict, connections, sessions) -> dict:
    """What a node puts in its heartbeat
    (:attr:`tbmq.cluster.records.NodeInfo.counters`): its totals since it
    started, read once per heartbeat (a few sums, nothing per message or
    per session).

    :param traffic: the node's :class:`Traffic`.
    :param drops: reason → messages not delivered
        (:attr:`tbmq.broker.hooks.DropCounter.counts`).
    :param connections: the node's open MQTT connections (a sized
        collection).
    :param sessions: the sessions it holds (a sized collection).
    :returns: ``dict[str, int]`` with the names of
        :data:`tbmq.cluster.records.HEARTBEAT_COUNTERS`.
    """
    return {"received": sum(traffic.received), "sent": sum(traffic.sent),
            "received_bytes": sum(traffic.received_bytes), "sent_bytes": sum(traffic.sent_bytes),
            "bytes_read": traffic.bytes_read, "bytes_written": traffic.bytes_written,
            "dropped": sum(drops.values()), "connections": len(connections),
            "sessions": len(sessions)}
