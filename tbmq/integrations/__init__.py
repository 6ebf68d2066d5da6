"""Outbound integrations (TBMQ's integrations, EMQX's data bridges): the
messages published to the node whose topic name matches an integration's
topic filters are sent to an outside system, an HTTP endpoint
(:mod:`~tbmq.integrations.http`), a Kafka topic
(:mod:`~tbmq.integrations.kafka`) or another MQTT broker
(:mod:`~tbmq.integrations.mqtt`).

:class:`~tbmq.integrations.plugin.Integrations` is the plugin that sees the
messages; :class:`~tbmq.integrations.core.Integration` holds one
integration's bounded buffer and retries.  What they promise is in
``docs/guarantees.md``.

This package's ``__init__`` imports nothing, so that the config schema can
import :mod:`tbmq.integrations.settings` alone.
"""
