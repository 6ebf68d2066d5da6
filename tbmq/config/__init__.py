"""The broker's configuration: YAML + environment → typed, frozen dataclasses.

:func:`load_config` builds a :class:`Config` in four layers, each overriding
the one before:

1. the built-in defaults (the field defaults below, documented in
   ``etc/tbmq.yml``);
2. the YAML file, when one is given (mappings are merged key by key, lists
   replace lists);
3. environment variables ``TBMQ_<SECTION>__<KEY>``: the name after ``TBMQ_``
   is split on double underscores into a key path, case-insensitively, with
   numbers as list indices (``TBMQ_LISTENERS__0__ENDPOINT=tcp:1884``,
   ``TBMQ_MQTT__MAX_PACKET_SIZE=1024``, ``TBMQ_DATA_DIR=/var/lib/tbmq``); the
   value is parsed as YAML (``true``, ``10``, ``null`` …).  Only a variable
   whose first key is a top-level key of :class:`Config` is an override;
   other ``TBMQ_*`` variables (the ``tbmq`` CLI's ``TBMQ_ADMIN_PASSWORD``, a
   deployment tool's ``TBMQ_VERSION``) are ignored;
4. ``overrides``, a nested dict (the command line).

Unknown keys, wrong types and values out of range raise
:class:`~tbmq.errors.ConfigError` whose message starts with the key path:
``listeners[1].endpoint: expected a string``.
"""

from tbmq.config.loading import defaults, load_config
from tbmq.config.schema import (
    ENV_PREFIX,
    LISTENER_TYPES,
    TLS_LISTENER_TYPES,
    TLS_CLIENT_AUTH,
    EVENT_SINKS,
    STORAGE_BACKENDS,
    DEVICE_STORES,
    KAFKA_DRIVERS,
    KAFKA_ACKS,
    SQLITE_SYNCHRONOUS,
    MAX_PACKET_SIZE,
    ListenerConfig,
    MqttConfig,
    StorageConfig,
    JwtConfig,
    HttpAuthConfig,
    HTTP_AUTH_PLACEHOLDERS,
    LoginLimitsConfig,
    UnauthorizedClientsConfig,
    AuthConfig,
    PostgresConfig,
    RedisConfig,
    KafkaConfig,
    NodeConfig,
    EventsConfig,
    HttpConfig,
    Config,
)

__all__ = [
    "ENV_PREFIX",
    "LISTENER_TYPES",
    "TLS_LISTENER_TYPES",
    "TLS_CLIENT_AUTH",
    "EVENT_SINKS",
    "STORAGE_BACKENDS",
    "DEVICE_STORES",
    "KAFKA_DRIVERS",
    "KAFKA_ACKS",
    "SQLITE_SYNCHRONOUS",
    "MAX_PACKET_SIZE",
    "ListenerConfig",
    "MqttConfig",
    "StorageConfig",
    "JwtConfig",
    "HttpAuthConfig",
    "HTTP_AUTH_PLACEHOLDERS",
    "LoginLimitsConfig",
    "UnauthorizedClientsConfig",
    "AuthConfig",
    "PostgresConfig",
    "RedisConfig",
    "KafkaConfig",
    "NodeConfig",
    "EventsConfig",
    "HttpConfig",
    "Config",
    "defaults",
    "load_config",
]
