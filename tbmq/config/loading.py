"""Building a :class:`~tbmq.config.schema.Config` from its layers (built-in
defaults, YAML file, ``TBMQ_*`` environment variables, overrides), and
checking every value: the layers are described in :mod:`tbmq.config`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Callable

import yaml
from twisted.logger import Logger

from tbmq.config.schema import (
    AuthConfig,
    Config,
    ENV_PREFIX,
    EVENT_SINKS,
    EventsConfig,
    CLIENT_TYPES,
    HTTP_AUTH_METHODS,
    HTTP_AUTH_PLACEHOLDERS,
    HttpAuthConfig,
    HttpConfig,
    JwtConfig,
    KAFKA_ACKS,
    KAFKA_DRIVERS,
    KafkaConfig,
    LISTENER_TYPES,
    ListenerConfig,
    ClientRateLimitConfig,
    ClusterRateLimitConfig,
    LoginLimitsConfig,
    UnauthorizedClientsConfig,
    MAX_PACKET_SIZE,
    MqttConfig,
    NodeConfig,
    PostgresConfig,
    RedisConfig,
    SQLITE_SYNCHRONOUS,
    STORAGE_BACKENDS,
    StorageConfig,
    TLS_CLIENT_AUTH,
    TLS_LISTENER_TYPES,
)
from tbmq.errors import ConfigError
from tbmq.ratelimit import parse_limits
from tbmq.integrations.settings import problems as integration_problems
from tbmq.log import LEVELS as LOG_LEVELS, OBSERVER as LOG_OBSERVER

log = Logger(observer=LOG_OBSERVER)


# -- validation rules ---------------------------------------------------------

Check = Callable[[Any], "str | None"]


def _range(low: float, high: float | None = None) -> Check:
    def check(value: Any) -> str | None:
        if value is None:
            return None
        if value < low or (high is not None and value > high):
            if high is None:
                return f"must be >= {low}"
            return f"must be between {low} and {high}"
        return None

    return check


def _positive(value: Any) -> str | None:
    return "must be > 0" if value <= 0 else None


def _one_of(*choices: Any, message: str | None = None) -> Check:
    def check(value: Any) -> str | None:
        if value not in choices:
            return message or "must be one of " + ", ".join(map(str, choices))
        return None

    return check


def _not_empty(value: Any) -> str | None:
    return "must not be empty" if value is not None and not value else None


def _http_path(value: Any) -> str | None:
    if not value.startswith("/") or any(c in value for c in "?# \t\r\n"):
        return "must be an HTTP path starting with / (no query, no spaces)"
    return None


def _limit_pairs(value: Any) -> str | None:
    try:
        parse_limits(value)
    except ValueError as e:
        return str(e)
    return None


_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def _templates(value: Any) -> str | None:
    """A string, or every value of a mapping, may name only the placeholders
    of :data:`HTTP_AUTH_PLACEHOLDERS`."""
    items = value.items() if isinstance(value, Mapping) else [(None, value)]
    for key, text in items:
        where = "" if key is None else f"{key}: "
        if not isinstance(text, str):
            return f"{where}expected a string, got {_describe(text)}"
        for name in _PLACEHOLDER.findall(text):
            if name not in HTTP_AUTH_PLACEHOLDERS:
                return (f"{where}unknown placeholder ${{{name}}} (known: "
                        + ", ".join(f"${{{p}}}" for p in HTTP_AUTH_PLACEHOLDERS) + ")")
    return None


def _http_url(value: Any) -> str | None:
    if value is None:
        return None
    if not re.match(r"https?://[^/?#\s]+", value):
        return "must be an http:// or https:// URL"
    return _templates(value)


def _header_values(value: Any) -> str | None:
    for name, text in value.items():
        if not isinstance(text, str) or any(c in text for c in "\r\n"):
            return f"{name}: expected a string on one line"
    return None


def _regexes(value: Any) -> str | None:
    from tbmq.auth.rules import AuthorizationRules  # noqa: PLC0415 (loaded only when used)
    from tbmq.errors import CredentialsError  # noqa: PLC0415

    for i, pattern in enumerate(value or ()):
        try:
            AuthorizationRules((pattern,))
        except CredentialsError:
            return f"[{i}]: invalid regex {pattern!r}"
    return None


_CHECKS: dict[type, dict[str, Check]] = {
    ClientRateLimitConfig: {"client_config": _limit_pairs},
    ClusterRateLimitConfig: {"config": _limit_pairs},
    ListenerConfig: {
        "name": _not_empty,
        "type": _one_of(*LISTENER_TYPES),
        "endpoint": _not_empty,
        "max_packet_size": _range(1, MAX_PACKET_SIZE),
        "max_connections": _range(0),
        "backlog": _range(1),
        "tls_cert": _not_empty,
        "tls_key": _not_empty,
        "tls_ca": _not_empty,
        "tls_client_auth": _one_of(*TLS_CLIENT_AUTH),
        "ws_path": _http_path,
    },
    MqttConfig: {
        "max_packet_size": _range(1, MAX_PACKET_SIZE),
        "max_connect_packet_size": _range(1, MAX_PACKET_SIZE),
        "connect_timeout": _positive,
        "incomplete_packet_timeout": _positive,
        "receive_maximum": _range(1, 65535),
        "max_qos": _one_of(0, 1, 2, message="must be 0, 1 or 2"),
        "topic_alias_maximum": _range(0, 65535),
        "outbound_topic_aliases": _range(0, 65535),
        "max_topic_levels": _range(1, 65535),
        "max_subscriptions": _range(0),
        "max_keep_alive": _range(0, 65535),
        "max_session_expiry_interval": _range(0, 4294967295),
        "max_persistent_sessions_per_address": _range(0),
        "max_client_id_length": _range(23, 65535),
        "max_queued_messages": _range(1),
        "max_pending_messages": _range(1),
        "max_pending_bytes": _range(65536),
        "max_inflight_messages": _range(1, 65535),
        "max_outbound_buffer": _range(65536),
        "outbound_pause_timeout": _positive,
        "sessions_limit": _range(0),
        "application_clients_limit": _range(0),
    },
    StorageConfig: {
        "backend": _one_of(*STORAGE_BACKENDS),
        "sqlite_synchronous": _one_of(*SQLITE_SYNCHRONOUS),
        "max_messages_per_client": _range(1),
        "device_store": _not_empty,
    },
    NodeConfig: {"service_id": _not_empty, "gc_threshold": _range(0),
                 "switch_interval": _positive,
                 "log_level": _one_of(*LOG_LEVELS), "heartbeat_interval": _positive,
                 "node_timeout": _positive, "connect_answer_timeout": _positive},
    RedisConfig: {"url": _not_empty, "pool_size": _range(1), "key_prefix": _not_empty,
                  "message_ttl": _range(1)},
    KafkaConfig: {
        "bootstrap_servers": _not_empty,
        "driver": _one_of(*KAFKA_DRIVERS),
        "partitions": _range(1),
        "replication_factor": _range(1),
        "retention_ms": _range(1),
        "min_compaction_lag_ms": _range(0),
        "acks": _one_of(*KAFKA_ACKS),
        "linger_ms": _range(0),
        "fetch_max_wait_ms": _range(1),
        "fetch_min_bytes": _range(1),
        "idle_fetch_interval_ms": _range(0),
        "max_poll_records": _range(1),
        "session_timeout_ms": _range(1000),
        "heartbeat_interval_ms": _range(100),
        "request_timeout_ms": _range(1000),
        "statistics_interval_ms": _range(0),
    },
    AuthConfig: {
        "credentials": _one_of("sqlite", "postgres", "memory"),
        "refresh_interval": _positive,
        "cache_size": _range(0),
        "cache_ttl": _positive,
        "anonymous_max_session_expiry": _range(0, 4294967295),
    },
    UnauthorizedClientsConfig: {"ttl": _positive, "max_entries": _range(1)},
    LoginLimitsConfig: {
        "window": _positive,
        "ban_time": _positive,
        "max_failures_per_client_id": _range(0),
        "max_failures_per_address": _range(0),
        "max_checks_per_address": _range(0),
        "max_checks": _range(1),
        "check_threads": _range(1),
    },
    JwtConfig: {"leeway": _range(0)},
    HttpAuthConfig: {
        "url": _http_url,
        "method": _one_of(*HTTP_AUTH_METHODS),
        "headers": _header_values,
        "body": lambda value: None if value is None else _templates(value),
        "timeout": _positive,
        "cache_ttl": _range(0),
        "tls_ca": _not_empty,
        "default_client_type": _one_of(*CLIENT_TYPES),
        "default_pub": _regexes,
        "default_sub": _regexes,
    },
    PostgresConfig: {"dsn": _not_empty, "min_connections": _range(1), "max_connections": _range(1)},
    Config: {"data_dir": _not_empty, "bus": _not_empty, "sys_interval": _range(0)},
    HttpConfig: {"endpoint": _not_empty, "token_ttl": _range(60)},
    EventsConfig: {
        "sink": _one_of(*EVENT_SINKS),
        "directory": _not_empty,
        "max_file_bytes": _range(1024),
        "rotate_interval": _positive,
        "buffer_size": _range(1),
        "flush_interval": _positive,
        "bus_topic": _not_empty,
    },
}

#: Fields whose string value is normalised to upper case before the checks.
_UPPER = {(StorageConfig, "sqlite_synchronous"), (HttpAuthConfig, "method"),
          (HttpAuthConfig, "default_client_type")}


# -- building -----------------------------------------------------------------


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _fail(path: str, message: str) -> typing.NoReturn:
    raise ConfigError(f"{path or '<root>'}: {message}", key=path or None)


def _describe(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _convert(hint: Any, value: Any, path: str) -> Any:
    """Check ``value`` against the type ``hint`` and convert it.

    :raises ConfigError: naming ``path`` when it does not fit.
    """
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, path)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path)
    if origin is tuple:
        item_hint = typing.get_args(hint)[0]
        if not isinstance(value, (list, tuple)):
            _fail(path, f"expected a list, got {_describe(value)}")
        return tuple(
            _convert(item_hint, item, _join(path, i)) for i, item in enumerate(value)
        )
    if hint is Mapping or origin is Mapping:
        if not isinstance(value, Mapping):
            _fail(path, f"expected a mapping, got {_describe(value)}")
        return _freeze(value, path)
    if hint is bool:
        if not isinstance(value, bool):
            _fail(path, f"expected true or false, got {_describe(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, f"expected an integer, got {_describe(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(path, f"expected a number, got {_describe(value)}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            _fail(path, f"expected a string, got {_describe(value)}")
        return value
    raise TypeError(f"unsupported config type {hint!r}")  # pragma: no cover


def _freeze(value: Any, path: str) -> Any:
    """Make a free-form YAML value read-only: mappings → MappingProxyType
    (string keys only), lists → tuples."""
    if isinstance(value, Mapping):
        frozen = {}
        for key, item in value.items():
            if not isinstance(key, str):
                _fail(path, f"keys must be strings, got {_describe(key)}")
            frozen[key] = _freeze(item, _join(path, key))
        return types.MappingProxyType(frozen)
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(item, _join(path, i)) for i, item in enumerate(value))
    return value


def _build(cls: type, data: Any, path: str) -> Any:
    """Build the dataclass ``cls`` from the mapping ``data`` (missing keys
    take their defaults) and validate it.

    :raises ConfigError: for an unknown key, a wrong type or a bad value.
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        _fail(path, f"expected a mapping, got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            _fail(_join(path, str(key)), "unknown key")
    checks = _CHECKS.get(cls, {})
    kwargs = {}
    for name in names:
        if name not in data:
            continue
        key_path = _join(path, name)
        value = _convert(hints[name], data[name], key_path)
        if (cls, name) in _UPPER and isinstance(value, str):
            value = value.upper()
        check = checks.get(name)
        message = check(value) if check is not None else None
        if message:
            _fail(key_path, message)
        kwargs[name] = value
    return cls(**kwargs)


def _validate(config: Config) -> None:
    """The checks that involve more than one field."""
    if not config.listeners:
        _fail("listeners", "at least one listener is required")
    if config.node.node_timeout <= config.node.heartbeat_interval:
        _fail("node.node_timeout", "must be greater than node.heartbeat_interval")
    if config.kafka.heartbeat_interval_ms * 3 > config.kafka.session_timeout_ms:
        _fail("kafka.heartbeat_interval_ms", "must be at most a third of kafka.session_timeout_ms")
    seen: dict[str, int] = {}
    for i, listener in enumerate(config.listeners):
        if listener.name in seen:
            _fail(
                f"listeners[{i}].name",
                f"duplicate listener name {listener.name!r} "
                f"(also listeners[{seen[listener.name]}])",
            )
        seen[listener.name] = i
        _validate_listener(f"listeners[{i}]", listener)
    if "http" in config.auth.providers and config.auth.http.url is None:
        _fail("auth.http.url", "required when http is in auth.providers")
    names: dict[str, int] = {}
    for i, integration in enumerate(config.integrations):
        for key, message in integration_problems(integration):
            _fail(f"integrations[{i}].{key}", message)
        if integration.name in names:
            _fail(f"integrations[{i}].name", f"duplicate integration name {integration.name!r} "
                                             f"(also integrations[{names[integration.name]}])")
        names[integration.name] = i


def _validate_listener(path: str, listener: ListenerConfig) -> None:
    """The checks across the fields of one listener.

    :raises ConfigError: ``listeners[1].tls_cert: required for type tls`` …
    """
    tls = listener.type in TLS_LISTENER_TYPES
    for key in ("tls_cert", "tls_key"):
        if tls and getattr(listener, key) is None:
            _fail(f"{path}.{key}", f"required for type {listener.type}")
    for key in ("tls_cert", "tls_key", "tls_ca"):
        if not tls and getattr(listener, key) is not None:
            _fail(f"{path}.{key}", f"only used by types tls and wss, not {listener.type}")
    if listener.tls_client_auth != "none":
        if not tls:
            _fail(f"{path}.tls_client_auth", f"only used by types tls and wss, not {listener.type}")
        if listener.tls_ca is None:
            _fail(f"{path}.tls_ca", f"required for tls_client_auth {listener.tls_client_auth}")
    prefix = listener.endpoint.split(":", 1)[0].lower()
    if tls and prefix in ("ssl", "tls"):
        _fail(f"{path}.endpoint", f"give the TCP endpoint (tcp:...): type {listener.type} "
                                  "adds TLS from tls_cert and tls_key")
    if listener.trust_proxy and listener.type not in ("ws", "wss"):
        _fail(f"{path}.trust_proxy", f"only used by types ws and wss, not {listener.type}")
    if listener.proxy_protocol and prefix == "haproxy":
        _fail(f"{path}.endpoint", "give the inner endpoint: proxy_protocol adds haproxy:")


# -- layers -------------------------------------------------------------------


def _raw(value: Any) -> Any:
    """A config value as plain YAML data (dicts, lists, scalars)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _raw(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _raw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_raw(v) for v in value]
    return value


def defaults() -> dict:
    """:returns: the built-in defaults as plain YAML data."""
    return _raw(Config())


def _merge(base: Any, update: Any) -> Any:
    """Merge ``update`` over ``base``: mappings key by key, anything else
    (lists included) replaced."""
    if isinstance(base, dict) and isinstance(update, Mapping):
        merged = dict(base)
        for key, value in update.items():
            merged[key] = _merge(base[key], value) if key in base else _raw(value)
        return merged
    return _raw(update)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error on one line: where (line and column, counted from 1)
    and what (PyYAML's own message spans several lines)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(str(problem).split())


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without YAML 1.1's base 60 numbers: ``10:1``
    (a ``limit:seconds`` pair of ``mqtt.rate_limits``) stays the string it
    is in YAML 1.2 instead of becoming the integer 601."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"""^(?:[-+]?0b[0-1_]+
    |[-+]?0[0-7_]+
    |[-+]?(?:0|[1-9][0-9_]*)
    |[-+]?0x[0-9a-fA-F_]+)$""", re.X),
    list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _yaml_load(stream) -> Any:
    return yaml.load(stream, Loader=_Loader)


def _read_file(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            data = _yaml_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {_yaml_problem(e)}") from e
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data


def _parse_env_value(text: str) -> Any:
    """An environment value as a YAML scalar; empty or unparsable text stays
    a string."""
    if text == "":
        return ""
    try:
        return _yaml_load(text)
    except yaml.YAMLError:
        return text


def _env_path(name: str) -> list[str | int]:
    parts = name[len(ENV_PREFIX):].lower().split("__")
    return [int(p) if p.isdigit() else p for p in parts]


def _sort_key(path: list[str | int]) -> tuple:
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in path)


def _sections() -> dict[str, Any]:
    """The top-level keys of the config (``mqtt``, ``listeners``, ``bus``,
    ``data_dir`` …) → the dataclass of a section, or None for a list or a
    scalar."""
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] if dataclasses.is_dataclass(hints[f.name]) else None
            for f in dataclasses.fields(Config)}


def _not_an_override(name: str, first: str | int, sections: dict[str, Any]) -> None:
    """Log a ``TBMQ_*`` variable that names no section: at debug level (a
    deployment tool's ``TBMQ_VERSION``, the CLI's ``TBMQ_ADMIN_PASSWORD``),
    or as a warning with the name it was probably meant to be when it is a
    section and one of its keys joined by a single underscore
    (``TBMQ_MQTT_MAX_QOS`` for ``TBMQ_MQTT__MAX_QOS``)."""
    if isinstance(first, str):
        for section, cls in sections.items():
            key = first[len(section) + 1:]
            if cls is None or not first.startswith(section + "_"):
                continue
            if key in {f.name for f in dataclasses.fields(cls)}:
                tail = name[len(ENV_PREFIX) + len(first):]
                suggestion = f"{ENV_PREFIX}{section}__{key}{tail}".upper()
                log.warn("environment variable {name} is ignored: overrides are "
                         "TBMQ_<SECTION>__<KEY> (two underscores); did you mean "
                         "{suggestion}?", name=name, suggestion=suggestion)
                return
    log.debug("environment variable {name} is not a config override "
              "({first!r} is not a section of the config)", name=name, first=first)


def _apply_env(data: dict, environ: Mapping[str, str]) -> dict[str, str]:
    """Set each ``TBMQ_A__B__0__C`` variable at key path ``a.b[0].c`` of
    ``data`` (in place).

    Only a variable whose first key ``A`` is a top-level key of the config
    (a section such as ``mqtt`` or ``listeners``, or a scalar such as
    ``bus`` or ``data_dir``) is an override; any other ``TBMQ_*`` variable
    (``TBMQ_ADMIN_PASSWORD`` of the ``tbmq`` CLI, a deployment tool's
    ``TBMQ_VERSION``) is left alone and logged (:func:`_not_an_override`).
    A list index may be the list's length, which appends a new entry (so
    ``TBMQ_LISTENERS__1__ENDPOINT`` adds a second listener to the default
    one).  Unknown keys inside a section are reported when the config is
    built.

    :returns: key path → the name of the variable that set it.
    :raises ConfigError: for an empty key, an index out of range, or a key
        path through a value of another kind (``TBMQ_BUS__NAME``).
    """
    sources: dict[str, str] = {}
    sections = _sections()
    settings = []
    for name, text in environ.items():
        if not name.upper().startswith(ENV_PREFIX):
            continue
        path = _env_path(name)
        if path[0] not in sections:
            _not_an_override(name, path[0], sections)
            continue
        if any(p == "" for p in path):
            raise ConfigError(f"environment variable {name}: empty key")
        settings.append((path, name, _parse_env_value(text)))
    settings.sort(key=lambda s: _sort_key(s[0]))
    for path, name, value in settings:
        node: Any = data
        where = ""
        for i, key in enumerate(path):
            last = i == len(path) - 1
            if isinstance(key, int):
                if not isinstance(node, list):
                    raise ConfigError(
                        f"{where or '<root>'}: is not a list (from {name})",
                        key=where or None,
                    )
                if key > len(node):
                    raise ConfigError(
                        f"{_join(where, key)}: index out of range, the list has "
                        f"{len(node)} entries (from {name})",
                        key=_join(where, key),
                    )
                if key == len(node):
                    node.append({})
            elif not isinstance(node, dict):
                raise ConfigError(
                    f"{where or '<root>'}: is not a mapping (from {name})",
                    key=where or None,
                )
            where = _join(where, key)
            if last:
                node[key] = value
                sources[where] = name
            else:
                if isinstance(key, str) and key not in node:
                    node[key] = {}
                node = node[key]
    return sources


def load_config(
    path: str | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: dict | None = None,
) -> Config:
    """Load the configuration (see the module docstring for the layers).

    :param path: a YAML file, or None for the built-in defaults only.
    :param environ: the environment to read ``TBMQ_*`` variables from;
        :data:`os.environ` when None (pass ``{}`` to ignore it).
    :param overrides: a nested dict merged last (the command line).
    :returns: the frozen :class:`Config`.
    :raises ConfigError: for an unreadable file, an unknown key, a wrong type
        or a value out of range; the message names the key path.
    """
    data = defaults()
    if path is not None:
        data = _merge(data, _read_file(path))
    sources = _apply_env(data, os.environ if environ is None else environ)
    if overrides:
        data = _merge(data, overrides)
    try:
        config = _build(Config, data, "")
    except ConfigError as e:
        source = sources.get(e.key or "")
        if source is None:
            raise
        raise ConfigError(f"{e} (from {source})", key=e.key) from None
    _validate(config)
    return config
