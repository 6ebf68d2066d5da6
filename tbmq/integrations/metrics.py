"""The Prometheus metrics of the integrations (``/metrics``), read at
scrape time as :mod:`tbmq.ops.metrics` reads the node's.

==========================================  =========  ==========================================
name                                        type       meaning (labels ``integration``, ``type``)
==========================================  =========  ==========================================
``integration_messages_sent_total``         counter    acknowledged by the target
``integration_messages_failed_total``       counter    refused by the target for good (HTTP 4xx)
``integration_messages_retried_total``      counter    sends repeated after a failure
``integration_messages_dropped_total``      counter    not taken: the buffer was full
``integration_buffer_messages``             gauge      messages in the buffer (in flight included)
``integration_buffer_bytes``                gauge      their payload bytes
==========================================  =========  ==========================================
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["IntegrationsCollector"]

_COUNTERS = (
    ("sent", "Messages an integration's target acknowledged."),
    ("failed", "Messages an integration's target refused for good (not retried)."),
    ("retried", "Sends an integration repeated after a failure."),
    ("dropped", "Messages an integration did not take: its buffer was full."),
)


class IntegrationsCollector(Collector):
    """:param integrations: the :class:`tbmq.integrations.plugin.Integrations`."""

    def __init__(self, integrations) -> None:
        self.integrations = integrations

    def collect(self):
        items = list(self.integrations.integrations.values())
        labels = ["integration", "type"]
        for what, doc in _COUNTERS:
            family = CounterMetricFamily(f"tbmq_integration_messages_{what}", doc, labels=labels)
            for i in items:
                family.add_metric([i.name, i.config.type], getattr(i, what))
            yield family
        for what, attr, doc in (
                ("messages", "depth", "Messages in an integration's buffer, in flight included."),
                ("bytes", "depth_bytes", "Payload bytes in an integration's buffer.")):
            family = GaugeMetricFamily(f"tbmq_integration_buffer_{what}", doc, labels=labels)
            for i in items:
                family.add_metric([i.name, i.config.type], getattr(i, attr))
            yield family
