"""The settings of one integration (``integrations[]`` in the config): a
flat mapping, the common keys first, then the keys of each target type.

This module imports nothing of tbmq, so that :mod:`tbmq.config.schema`
can name :class:`IntegrationConfig` without a cycle.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["INTEGRATION_TYPES", "IntegrationConfig", "problems"]

#: the target types
INTEGRATION_TYPES = ("http", "kafka", "mqtt")

#: ``payload_encoding`` of an ``http`` integration
PAYLOAD_ENCODINGS = ("auto", "base64")

#: ``key`` of a ``kafka`` integration
KAFKA_KEYS = ("topic", "client_id")


def _empty_mapping() -> Mapping:
    return types.MappingProxyType({})


@dataclass(frozen=True)
class IntegrationConfig:
    """One integration: the messages whose topic name matches one of
    ``topic_filters`` are sent to an outside system (TBMQ's integrations,
    EMQX's data bridges).

    Common keys:

    :ivar name: unique among the integrations: the label of its metrics and
        its name in the API.
    :ivar type: ``http``, ``kafka`` or ``mqtt``.
    :ivar topic_filters: MQTT topic filters (wildcards allowed, no
        ``$share/``), at least one.
    :ivar enabled: False keeps the entry but sends nothing.
    :ivar buffer_messages: messages waiting for the target at most, >= 1;
        one more is dropped (and counted).
    :ivar buffer_bytes: payload bytes waiting at most, >= 1024.
    :ivar retry_initial: seconds before the first retry after a failure,
        > 0; doubled at each failure in a row.
    :ivar retry_max: the longest wait between two retries, seconds,
        >= ``retry_initial``.
    :ivar concurrency: messages sent and not yet acknowledged at once,
        >= 1 (HTTP requests in flight, MQTT QoS 1 PUBLISH without PUBACK,
        Kafka records not yet acknowledged).
    :ivar timeout: seconds a send may take before it counts as failed and is
        retried, > 0.

    ``http``:

    :ivar url: the ``http://`` or ``https://`` URL.
    :ivar method: ``POST`` (default), ``PUT`` ...
    :ivar headers: header name → value.
    :ivar body: a template (``${topic}``, ``${payload}``, ``${client_id}``,
        ``${qos}``, ``${retain}``, ``${timestamp}``), or None for the JSON
        object of :func:`tbmq.integrations.http.json_body`.
    :ivar payload_encoding: ``auto`` (UTF-8 text, base64 when the payload
        is not valid UTF-8) or ``base64`` (always).

    ``kafka``:

    :ivar bootstrap_servers: ``host:port[,...]``; None: ``kafka.bootstrap_servers``.
    :ivar topic: the Kafka topic.
    :ivar key: the record key: ``topic`` (the MQTT topic name) or ``client_id``.

    ``mqtt`` (a bridge to another broker):

    :ivar host: the broker's host.
    :ivar port: its port (1883).
    :ivar client_id: the bridge's client id (``tbmq-bridge-<name>`` when None).
    :ivar username: the user name, or None.
    :ivar password: the password, or None.
    :ivar qos: 0 or 1 (default): at 1 a PUBACK acknowledges each message.
    :ivar topic_prefix: prepended to each topic name.
    :ivar tls: connect with TLS.
    :ivar tls_ca: a PEM file of the CA certificates to trust (TLS), or None
        for the system's.
    :ivar keep_alive: the MQTT Keep Alive, seconds, 0..65535.
    """

    name: str = ""
    type: str = "http"
    topic_filters: tuple[str, ...] = ()
    enabled: bool = True
    buffer_messages: int = 10000
    buffer_bytes: int = 16777216
    retry_initial: float = 1.0
    retry_max: float = 60.0
    concurrency: int = 4
    timeout: float = 10.0
    # http
    url: str | None = None
    method: str = "POST"
    headers: Mapping = field(default_factory=_empty_mapping, hash=False)
    body: str | None = None
    payload_encoding: str = "auto"
    # kafka
    bootstrap_servers: str | None = None
    topic: str | None = None
    key: str = "topic"
    # mqtt
    host: str | None = None
    port: int = 1883
    client_id: str | None = None
    username: str | None = None
    password: str | None = None
    qos: int = 1
    topic_prefix: str = ""
    tls: bool = False
    tls_ca: str | None = None
    keep_alive: int = 60


def _filter_problem(topic_filter: str) -> str | None:
    from tbmq.mqtt import TopicError, validate_topic_filter

    if topic_filter.startswith("$share/"):
        return "a shared subscription is not a topic filter here"
    try:
        validate_topic_filter(topic_filter)
    except TopicError as e:
        return str(e)
    return None


def problems(config: IntegrationConfig) -> list[tuple[str, str]]:
    """What is wrong with one integration's settings.

    :returns: ``[(key, message), ...]``, empty when it is usable.
    """
    found: list[tuple[str, str]] = []

    def need(ok: bool, key: str, message: str) -> None:
        if not ok:
            found.append((key, message))

    need(bool(config.name), "name", "must not be empty")
    need(config.type in INTEGRATION_TYPES, "type",
         "must be one of " + ", ".join(INTEGRATION_TYPES))
    need(bool(config.topic_filters), "topic_filters", "at least one topic filter is required")
    for i, topic_filter in enumerate(config.topic_filters):
        problem = _filter_problem(topic_filter)
        need(problem is None, f"topic_filters[{i}]", problem or "")
    need(config.buffer_messages >= 1, "buffer_messages", "must be >= 1")
    need(config.buffer_bytes >= 1024, "buffer_bytes", "must be >= 1024")
    need(config.retry_initial > 0, "retry_initial", "must be > 0")
    need(config.retry_max >= config.retry_initial, "retry_max", "must be >= retry_initial")
    need(config.concurrency >= 1, "concurrency", "must be >= 1")
    need(config.timeout > 0, "timeout", "must be > 0")
    if config.type == "http":
        need(config.url is not None and config.url.startswith(("http://", "https://")),
             "url", "an http:// or https:// URL is required for type http")
        need(bool(config.method) and config.method.isalpha(), "method",
             "must be an HTTP method")
        need(config.payload_encoding in PAYLOAD_ENCODINGS, "payload_encoding",
             "must be one of " + ", ".join(PAYLOAD_ENCODINGS))
        for name, value in config.headers.items():
            need(isinstance(value, str), f"headers.{name}", "must be a string")
    elif config.type == "kafka":
        need(bool(config.topic), "topic", "a Kafka topic is required for type kafka")
        need(config.key in KAFKA_KEYS, "key", "must be one of " + ", ".join(KAFKA_KEYS))
        need(config.bootstrap_servers is None or bool(config.bootstrap_servers),
             "bootstrap_servers", "must not be empty")
    elif config.type == "mqtt":
        need(bool(config.host), "host", "a host is required for type mqtt")
        need(1 <= config.port <= 65535, "port", "must be between 1 and 65535")
        need(config.qos in (0, 1), "qos", "must be 0 or 1")
        need(0 <= config.keep_alive <= 65535, "keep_alive", "must be between 0 and 65535")
        need(config.client_id is None or bool(config.client_id), "client_id",
             "must not be empty")
    return found
