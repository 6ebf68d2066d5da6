"""Prometheus metrics of one node (``/metrics``), with ``prometheus-client``.

Nothing here runs on the message path: :class:`NodeCollector` is a custom
collector that reads the node's plain-int counters
(:class:`tbmq.broker.traffic.Traffic`, the drop counter) and its registries
at scrape time.  Each node has its own
:class:`~prometheus_client.CollectorRegistry` (with the process, platform
and garbage-collector collectors), so several nodes in one process do not
mix.

Metrics (all prefixed ``tbmq_``; *node* figures are this node's, the
*cluster* ones the same on every node):

==========================================  =========  ==========================================
name                                        type       labels / meaning
==========================================  =========  ==========================================
``info``                                    gauge      ``service_id``, ``version``; always 1
``uptime_seconds``                          gauge      since the node started
``connections``                             gauge      ``listener``: open MQTT connections
``sessions``                                gauge      ``persistent``, ``client_type``,
                                                       ``connected``: sessions this node holds
``subscriptions``                           gauge      of the sessions this node holds
``cluster_sessions``                        gauge      ``persistent``, ``client_type``,
                                                       ``connected``: the session registry
``cluster_subscriptions``                   gauge      the subscription book
``cluster_nodes``                           gauge      nodes alive, this one included
``retained_messages``                       gauge      retained messages
``messages_received_total``                 counter    ``qos``: PUBLISH accepted from clients
``messages_sent_total``                     counter    ``qos``: PUBLISH written to clients
``received_bytes_total``                    counter    bytes of MQTT packets read (the wire in)
``sent_bytes_total``                        counter    bytes of MQTT packets written (out)
``received_payload_bytes_total``            counter    ``qos``: payload bytes of PUBLISH received
``sent_payload_bytes_total``                counter    ``qos``: payload bytes of PUBLISH sent
``messages_dropped_total``                  counter    ``reason``: messages not delivered
``delivery_latency_seconds``                histogram  receipt of a PUBLISH to the write of a copy
``backend_call_seconds``                    histogram  ``backend``, ``method``: bus and stores
``consumer_lag_records``                    gauge      ``group``, ``topic``: not yet committed
``authentication_failures_total``           counter    ``reason_code``: refused CONNECTs
``sessions_refused_total``                  counter    ``limit``: CONNECTs over ``mqtt.sessions_limit``
                                                       or ``mqtt.application_clients_limit``
==========================================  =========  ==========================================

Every labelled counter has its series from the start, at 0: each QoS, each
reason of :data:`tbmq.broker.hooks.DROP_REASONS`, each reason code of
:data:`tbmq.auth.AUTH_FAILURE_CODES` (as ``0x86``), so that ``rate()`` and
``increase()`` see the first event.  ``connections`` has a series for each
configured listener, named by ``listeners[].name`` (a ``--listen``
listener by its endpoint string).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import gc_collector, platform_collector, process_collector
from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from tbmq.broker.traffic import LATENCY_BOUNDS

__all__ = ["CONTENT_TYPE", "NodeCollector", "make_registry", "render"]

#: the Content-Type of the text exposition format
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _histogram(family: HistogramMetricFamily, labels: list[str], bounds, counts, total) -> None:
    """Add one series of ``family`` from per-bucket counts (cumulated here)."""
    cumulative = []
    running = 0
    for bound, n in zip(bounds, counts):
        running += n
        cumulative.append((repr(float(bound)), running))
    running += counts[-1]
    cumulative.append(("+Inf", running))
    family.add_metric(labels, cumulative, total)


def _sessions(name: str, doc: str, counts) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["persistent", "client_type", "connected"])
    for (persistent, client_type, connected), n in sorted(counts.by_kind.items()):
        family.add_metric([str(persistent).lower(), client_type, str(connected).lower()], n)
    return family


class NodeCollector(Collector):
    """Reads a node's figures at scrape time.

    :param stats: the node's :class:`tbmq.ops.stats.NodeStats`.
    """

    def __init__(self, stats) -> None:
        self.stats = stats

    def collect(self):
        stats = self.stats
        node = stats.node
        traffic = stats.traffic()
        info = GaugeMetricFamily("tbmq_info", "The node's service id and version.",
                                 labels=["service_id", "version"])
        info.add_metric([stats.service_id, stats.version], 1)
        yield info
        yield GaugeMetricFamily("tbmq_uptime_seconds", "Seconds since the node started.",
                                value=stats.uptime())
        connections = GaugeMetricFamily("tbmq_connections",
                                        "Open MQTT connections, by listener.",
                                        labels=["listener"])
        by_listener = stats.connections()
        for lc in node.config.listeners:
            by_listener.setdefault(lc.name, 0)
        for name, n in sorted(by_listener.items()):
            connections.add_metric([name], n)
        yield connections
        yield _sessions("tbmq_sessions", "Sessions this node holds.", stats.local_sessions())
        yield GaugeMetricFamily("tbmq_subscriptions",
                                "Subscriptions of the sessions this node holds.",
                                value=stats.local_subscriptions())
        yield _sessions("tbmq_cluster_sessions", "Sessions of the whole cluster.",
                        stats.cluster_sessions())
        yield GaugeMetricFamily("tbmq_cluster_subscriptions",
                                "Subscriptions of the whole cluster.",
                                value=stats.cluster_subscriptions())
        yield GaugeMetricFamily("tbmq_cluster_nodes", "Nodes alive, this one included.",
                                value=len(node.alive_nodes()))
        yield GaugeMetricFamily("tbmq_retained_messages", "Retained messages.",
                                value=stats.retained_messages())
        for name, doc, values in (
                ("tbmq_messages_received", "PUBLISH packets accepted from clients.",
                 traffic.received),
                ("tbmq_messages_sent", "PUBLISH packets written to clients.", traffic.sent),
                ("tbmq_received_payload_bytes",
                 "Application payload bytes of the PUBLISH packets received.",
                 traffic.received_bytes),
                ("tbmq_sent_payload_bytes",
                 "Application payload bytes of the PUBLISH packets written.",
                 traffic.sent_bytes)):
            family = CounterMetricFamily(name, doc, labels=["qos"])
            for qos, n in enumerate(values):
                family.add_metric([str(qos)], n)
            yield family
        yield CounterMetricFamily("tbmq_received_bytes",
                                  "Bytes of the MQTT packets read from connections "
                                  "(every packet type).", value=traffic.bytes_read)
        yield CounterMetricFamily("tbmq_sent_bytes",
                                  "Bytes of the MQTT packets written to connections "
                                  "(every packet type).", value=traffic.bytes_written)
        dropped = CounterMetricFamily("tbmq_messages_dropped",
                                      "Messages not delivered, by reason.", labels=["reason"])
        for reason, n in sorted(stats.dropped().items()):
            dropped.add_metric([reason], n)
        yield dropped
        latency = HistogramMetricFamily(
            "tbmq_delivery_latency_seconds",
            "Seconds from the receipt of a PUBLISH to the write of its copy to a subscriber.")
        _histogram(latency, [], LATENCY_BOUNDS, traffic.latency, traffic.latency_sum)
        yield latency
        calls = HistogramMetricFamily(
            "tbmq_backend_call_seconds",
            "Seconds of the node's calls to its bus and stores, until their result.",
            labels=["backend", "method"])
        times = node.call_times
        if times is not None:
            for (role, method), buckets in sorted(times.series.items()):
                _histogram(calls, [role, method], buckets.bounds, buckets.counts, buckets.total)
        yield calls
        lag = GaugeMetricFamily("tbmq_consumer_lag_records",
                                "Records of the bus not yet committed, by consumer group.",
                                labels=["group", "topic"])
        for (group, topic), n in sorted(stats.consumer_lag().items()):
            lag.add_metric([group, topic], n)
        yield lag
        failures = CounterMetricFamily("tbmq_authentication_failures",
                                       "CONNECTs refused by authentication, by reason code.",
                                       labels=["reason_code"])
        for code, n in sorted(stats.auth_failures.items()):
            failures.add_metric([f"0x{code:02X}"], n)
        yield failures
        refused = CounterMetricFamily("tbmq_sessions_refused",
                                      "CONNECTs refused by a session limit of mqtt.",
                                      labels=["limit"])
        for limit, n in sorted(node.sessions_refused().items()):
            refused.add_metric([limit], n)
        yield refused


def make_registry(stats) -> CollectorRegistry:
    """:returns: a registry with the node's collector and the process,
    platform and garbage-collector collectors."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(stats))
    process_collector.ProcessCollector(registry=registry)
    platform_collector.PlatformCollector(registry=registry)
    gc_collector.GCCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """:returns: the text exposition of ``registry`` (:data:`CONTENT_TYPE`)."""
    return generate_latest(registry)
