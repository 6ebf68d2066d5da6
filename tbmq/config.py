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
   value is parsed as YAML (``true``, ``10``, ``null`` …);
4. ``overrides``, a nested dict (the command line).

Unknown keys, wrong types and values out of range raise
:class:`~tbmq.errors.ConfigError` whose message starts with the key path:
``listeners[1].endpoint: expected a string``.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from tbmq.errors import ConfigError
from tbmq.log import LEVELS as LOG_LEVELS

__all__ = [
    "Config",
    "ListenerConfig",
    "MqttConfig",
    "StorageConfig",
    "AuthConfig",
    "LoginLimitsConfig",
    "JwtConfig",
    "PostgresConfig",
    "RedisConfig",
    "KafkaConfig",
    "NodeConfig",
    "EventsConfig",
    "HttpConfig",
    "load_config",
    "ENV_PREFIX",
    "LISTENER_TYPES",
    "TLS_LISTENER_TYPES",
    "TLS_CLIENT_AUTH",
    "STORAGE_BACKENDS",
    "DEVICE_STORES",
    "KAFKA_DRIVERS",
]

#: The prefix of environment variables read by :func:`load_config`.
ENV_PREFIX = "TBMQ_"

#: Transport of a listener: plain TCP, TLS, WebSocket, WebSocket over TLS.
LISTENER_TYPES = ("tcp", "tls", "ws", "wss")

#: Listener types that run TLS.
TLS_LISTENER_TYPES = ("tls", "wss")

#: Values of ``listeners[].tls_client_auth``.
TLS_CLIENT_AUTH = ("none", "optional", "required")

#: Values of ``events.sink``: JSON Lines files, or records on the message bus.
EVENT_SINKS = ("file", "bus")

#: Values of ``storage.backend``.
STORAGE_BACKENDS = ("sqlite", "memory")

#: Values of ``storage.device_store`` (None: the same as ``storage.backend``).
DEVICE_STORES = ("sqlite", "memory", "redis", "postgres")

#: Values of ``kafka.driver``.
KAFKA_DRIVERS = ("kafka-python", "confluent")

#: Values of ``kafka.acks``.
KAFKA_ACKS = ("all", "1", "0")

#: Values of ``storage.sqlite_synchronous`` (SQLite's ``PRAGMA synchronous``).
SQLITE_SYNCHRONOUS = ("OFF", "NORMAL", "FULL")

#: The largest packet MQTT can encode: 268,435,455 bytes of remaining length
#: [MQTT-2.2.3] (and the largest Maximum Packet Size property).
MAX_PACKET_SIZE = 268435455


@dataclass(frozen=True)
class ListenerConfig:
    """One listening socket (built by :mod:`tbmq.listeners`).

    :ivar name: unique name of the listener (logs, metrics).
    :ivar type: ``tcp``, ``tls``, ``ws`` (MQTT over WebSocket) or ``wss``
        (MQTT over WebSocket over TLS).
    :ivar endpoint: a Twisted server endpoint string for the TCP socket
        underneath (``tcp:1883``, ``tcp:8883:interface=127.0.0.1``); TLS,
        WebSocket and the PROXY protocol are layered on it by ``type``,
        ``tls_*`` and ``proxy_protocol``, not by the endpoint string.
    :ivar max_packet_size: bytes; None means ``mqtt.max_packet_size``.
    :ivar max_connections: simultaneous MQTT connections; 0 means unlimited
        (for ``ws``/``wss`` a connection counts once its WebSocket upgrade is
        accepted).
    :ivar backlog: connections the kernel accepts and queues for the
        broker, >= 1 (capped by ``net.core.somaxconn``), for ``tcp:``,
        ``tcp6:`` and ``unix:`` endpoints without their own ``backlog=``.
    :ivar tls_cert: ``tls``/``wss``: PEM file with the server certificate
        followed by its intermediate CA certificates.
    :ivar tls_key: ``tls``/``wss``: PEM file with the (unencrypted) private
        key of ``tls_cert``.
    :ivar tls_ca: PEM file of the CA certificates that client certificates
        must chain to; required when ``tls_client_auth`` is not ``none``.
    :ivar tls_client_auth: ``none`` (no client certificate asked for),
        ``optional`` (asked for; one that does not verify fails the
        handshake, none at all is accepted) or ``required``.
    :ivar ws_path: ``ws``/``wss``: the HTTP path of the WebSocket upgrade;
        other paths get 404.  ``/mqtt`` is paho-mqtt's and EMQX's default.
    :ivar proxy_protocol: expect a PROXY protocol v1/v2 header (HAProxy,
        load balancers) first on each connection; the client's address is
        then the one in the header.
    """

    name: str = "tcp"
    type: str = "tcp"
    endpoint: str = "tcp:1883"
    max_packet_size: int | None = None
    max_connections: int = 0
    backlog: int = 1024
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_client_auth: str = "none"
    ws_path: str = "/mqtt"
    proxy_protocol: bool = False


@dataclass(frozen=True)
class MqttConfig:
    """Protocol limits and the capabilities announced in CONNACK.

    :ivar max_packet_size: bytes, 1..268435455; larger packets are refused
        [MQTT-3.1.2-24] and announced as Maximum Packet Size.
    :ivar max_connect_packet_size: bytes, 1..268435455: the largest packet
        read before a CONNECT is accepted (a CONNECT, will included); a
        connection announcing a larger one is closed as soon as its fixed
        header is read, nothing of it buffered.  The lower of it and
        ``max_packet_size`` applies.
    :ivar connect_timeout: seconds a connection may stay without CONNECT.
    :ivar incomplete_packet_timeout: seconds, > 0, a packet may take from
        its first byte to its last once CONNECT is accepted; a connection
        whose packet is not complete by then is closed (v5: DISCONNECT 0x8D),
        whatever its keep alive, 0 included.
    :ivar receive_maximum: QoS 1/2 PUBLISHes a v5 client may have
        unacknowledged towards the broker, 1..65535 [MQTT-3.2.2.3.3] (a v3
        client, never told, is held to the packet identifier space).
    :ivar max_qos: the Maximum QoS announced, 0..2 [MQTT-3.2.2.3.4].
    :ivar retain_available: whether retained messages are supported.
    :ivar topic_alias_maximum: client → broker topic aliases, 0..65535.
    :ivar outbound_topic_aliases: broker → client topic aliases the broker
        assigns per connection, 0..65535 (0: none); the client's Topic
        Alias Maximum applies when lower [MQTT-3.3.2-11].
    :ivar max_topic_levels: levels of a topic name or filter accepted,
        1..65535.
    :ivar max_subscriptions: subscriptions one session may hold, >= 0 (0:
        no limit).
    :ivar wildcard_subscription_available: whether ``+``/``#`` are allowed.
    :ivar subscription_identifier_available: whether v5 subscription
        identifiers are supported.
    :ivar shared_subscription_available: whether ``$share/`` is supported.
    :ivar max_keep_alive: seconds, 0..65535; a client asking for more gets
        this as Server Keep Alive; 0 means no limit.
    :ivar max_session_expiry_interval: seconds, 0..4294967295; a longer
        requested session expiry is cut to this (v5 clients are told in
        CONNACK), and a v3 persistent session (``cleanSession=0``) expires
        this long after its client disconnected; 4294967295 means never.
        ``auth.anonymous_max_session_expiry`` applies to anonymous clients
        when lower.
    :ivar max_persistent_sessions_per_address: persistent sessions that
        clients connecting from one network address may create on this
        node, >= 0 (0: no limit); one more gets CONNACK 0x97 Quota exceeded
        (v3: 0x03 Server unavailable).  Resuming or replacing a session
        that exists is always allowed.
    :ivar max_client_id_length: characters, 23..65535 (the server must accept
        1 to 23 [MQTT-3.1.3-5]).
    :ivar allow_empty_client_id: assign an id to a client sending none.
    :ivar max_queued_messages: messages of a persistent session kept in
        memory, >= 1; the rest wait in the device store.
    :ivar max_pending_messages: the high-water mark of a non-persistent
        session's queue, >= 1, and of a publisher's publishes not yet
        accepted by the bus (see :mod:`tbmq.broker.outbox`).
    :ivar max_pending_bytes: the high-water mark of any session's queue in
        bytes, >= 65536.
    :ivar max_inflight_messages: cap on the outbound inflight window,
        1..65535.
    :ivar response_information: sent in CONNACK to a v5 client requesting
        it, when not empty.
    :ivar max_outbound_buffer: bytes written to a full socket after which
        its client counts as slow, >= 65536.
    :ivar outbound_pause_timeout: seconds a congested session may hold the
        sources that feed it: a credit refilled over ten times as long, > 0.
    """

    max_packet_size: int = 1048576
    max_connect_packet_size: int = 65536
    connect_timeout: float = 10.0
    incomplete_packet_timeout: float = 60.0
    receive_maximum: int = 128
    max_qos: int = 2
    retain_available: bool = True
    topic_alias_maximum: int = 10
    outbound_topic_aliases: int = 0
    max_topic_levels: int = 128
    max_subscriptions: int = 1000
    wildcard_subscription_available: bool = True
    subscription_identifier_available: bool = True
    shared_subscription_available: bool = True
    max_keep_alive: int = 65535
    max_session_expiry_interval: int = 604800
    max_persistent_sessions_per_address: int = 1000
    max_client_id_length: int = 65535
    allow_empty_client_id: bool = True
    max_queued_messages: int = 10000
    max_pending_messages: int = 1000
    max_pending_bytes: int = 16777216
    max_inflight_messages: int = 65535
    response_information: str = ""
    max_outbound_buffer: int = 4194304
    outbound_pause_timeout: float = 1.0


@dataclass(frozen=True)
class StorageConfig:
    """The embedded store.

    :ivar backend: ``sqlite`` (a file in ``data_dir``) or ``memory``.
    :ivar sqlite_synchronous: SQLite's ``PRAGMA synchronous``: ``FULL``
        survives power loss, ``NORMAL`` a process crash only, ``OFF`` neither.
    :ivar max_messages_per_client: the most deliveries the device message
        store keeps per persistent client, >= 1; beyond it the oldest are
        removed (TBMQ trims its Redis store the same way).  None: no limit.
    :ivar device_store: where persistent DEVICE sessions' messages live:
        ``sqlite``, ``memory``, ``redis`` (see :class:`RedisConfig`) or
        ``postgres`` (see :class:`PostgresConfig`); None: the same as
        ``backend``.
    """

    backend: str = "sqlite"
    sqlite_synchronous: str = "FULL"
    max_messages_per_client: int | None = None
    device_store: str | None = None

    @property
    def device_store_name(self) -> str:
        """:returns: the device message store to use: ``device_store``, or
        ``backend`` when that is None."""
        return self.device_store or self.backend


@dataclass(frozen=True)
class JwtConfig:
    """The JWT authentication provider: the token is the CONNECT password.

    :ivar algorithms: accepted JWS algorithms (``HS256``, ``RS256`` ...).
    :ivar secret: the HMAC key, for ``HS*`` algorithms.
    :ivar public_key_file: a PEM public key file, for ``RS*``/``ES*``.
    :ivar audience: the required ``aud`` claim, or None.
    :ivar issuer: the required ``iss`` claim, or None.
    :ivar leeway: seconds of clock skew allowed on ``exp``/``nbf``.
    :ivar client_id_claim: when set, this claim must equal the client id.
    :ivar client_type_claim: the claim naming the client type
        (``DEVICE``/``APPLICATION``); DEVICE when absent.
    :ivar pub_claim: the claim with the list of publish topic regexes, or
        None for no restriction.
    :ivar sub_claim: the claim with the list of subscribe topic-filter
        regexes, or None for no restriction.
    """

    algorithms: tuple[str, ...] = ("HS256",)
    secret: str | None = None
    public_key_file: str | None = None
    audience: str | None = None
    issuer: str | None = None
    leeway: float = 0.0
    client_id_claim: str | None = None
    client_type_claim: str = "client_type"
    pub_claim: str | None = "pub"
    sub_claim: str | None = "sub_rules"


@dataclass(frozen=True)
class LoginLimitsConfig:
    """What one network address or client id may cost the broker before it
    is authenticated (see :class:`tbmq.auth.guard.LoginGuard`).  Failed
    logins are counted over ``window``, as EMQX's flapping detection counts
    disconnects; a source over its budget is banned for ``ban_time``
    (EMQX's ``banned``: CONNACK 0x8A Banned, v3: 0x05 Not authorized, with
    no password checked).

    :ivar window: seconds over which failed logins are counted, > 0.
    :ivar ban_time: seconds a ban lasts, > 0.
    :ivar max_failures_per_client_id: failed logins of one client id in
        ``window`` that ban it, >= 0 (0: never).
    :ivar max_failures_per_address: failed logins from one address in
        ``window`` that ban it, >= 0 (0: never).  A banned address is
        refused for client ids and user names that failed to log in within
        ``window``; the others from it are still checked, within
        ``max_checks_per_address``, so the clients of a shared address (a
        NAT, a proxy) that did nothing wrong keep connecting.
    :ivar max_checks_per_address: CONNECTs with a password (or a v5
        authentication method) from one address being authenticated at
        once, >= 0 (0: no limit); one more gets CONNACK 0x89 Server busy
        (v3: 0x03 Server unavailable) at once; the last place is kept for
        client ids and user names without failures in ``window``.
    :ivar max_checks: such CONNECTs being authenticated at once on the
        node, >= 1; one more gets 0x89 (v3: 0x03).
    :ivar check_threads: threads of the password-check pool, >= 1 (bcrypt
        runs there, apart from the reactor's own pool).
    """

    window: float = 60.0
    ban_time: float = 300.0
    max_failures_per_client_id: int = 5
    max_failures_per_address: int = 20
    max_checks_per_address: int = 2
    max_checks: int = 256
    check_threads: int = 4


@dataclass(frozen=True)
class AuthConfig:
    """Authentication and authorization.

    :ivar allow_anonymous: accept clients no provider recognised (as DEVICE,
        with no authorization rules).
    :ivar providers: the authentication providers to run, in order: any of
        ``basic`` (client id / username and bcrypt password), ``x509`` (client
        certificate on a TLS listener), ``scram`` (MQTT 5 enhanced
        authentication, SCRAM-SHA-256/512), ``jwt`` (a token as the password).
    :ivar credentials: the credential store: ``sqlite`` (in ``data_dir``),
        ``postgres`` (see :class:`PostgresConfig`) or ``memory``.
    :ivar cache_size: topic names whose publish authorization each
        connection remembers, >= 0 (0: ask the hooks every time), as EMQX's
        authorization cache.
    :ivar cache_ttl: seconds a remembered answer is used, > 0; changed
        credentials clear it at once.
    :ivar refresh_interval: seconds between checks for changed credentials;
        changed authorization rules apply to connected clients.
    :ivar anonymous_max_session_expiry: seconds, 0..4294967295: the longest
        session expiry an anonymous client gets (its persistent session
        ends this long after it disconnected), when lower than
        ``mqtt.max_session_expiry_interval``.
    :ivar login_limits: see :class:`LoginLimitsConfig`.
    :ivar jwt: see :class:`JwtConfig`.
    """

    allow_anonymous: bool = True
    anonymous_max_session_expiry: int = 3600
    providers: tuple[str, ...] = ("basic", "x509", "scram", "jwt")
    credentials: str = "sqlite"
    refresh_interval: float = 5.0
    cache_size: int = 32
    cache_ttl: float = 60.0
    login_limits: LoginLimitsConfig = field(default_factory=LoginLimitsConfig)
    jwt: JwtConfig = field(default_factory=JwtConfig)


@dataclass(frozen=True)
class PostgresConfig:
    """PostgreSQL, for the backends that use it (``auth.credentials:
    postgres``, ``storage.device_store: postgres``).

    :ivar dsn: a libpq connection string (``host=... port=... dbname=...``).
    :ivar min_connections: connections kept open, >= 1.
    :ivar max_connections: the pool's upper bound, >= min_connections.
    """

    dsn: str = "dbname=tbmq"
    min_connections: int = 1
    max_connections: int = 5


@dataclass(frozen=True)
class RedisConfig:
    """Redis, for ``storage.device_store: redis`` (TBMQ's store of
    persistent DEVICE messages).

    :ivar url: ``redis://[[user]:password@]host[:port][/db]`` (``rediss://``
        for TLS).
    :ivar pool_size: connections kept open, >= 1.
    :ivar key_prefix: prepended to every key, so several clusters can share
        one Redis.
    :ivar message_ttl: seconds a stored message is kept, > 0 (TBMQ's
        ``mqtt.persistent-session.device.persisted-messages.ttl``); None:
        for ever.
    """

    url: str = "redis://127.0.0.1:6379/0"
    pool_size: int = 4
    key_prefix: str = "tbmq:"
    message_ttl: int | None = 604800


@dataclass(frozen=True)
class KafkaConfig:
    """Kafka, for ``bus: kafka``: the cluster's message bus.

    :ivar bootstrap_servers: ``host:port[,host:port...]``.
    :ivar driver: ``kafka-python`` (pure Python) or ``confluent``
        (confluent-kafka on librdkafka, about ten times the throughput).
    :ivar topic_prefix: prepended to every topic of the catalogue, so
        several clusters can share one Kafka.
    :ivar partitions: partitions of each topic created, >= 1.
    :ivar replication_factor: replicas of each topic created, >= 1.
    :ivar retention_ms: ``retention.ms`` of the topics created that are not
        compacted, >= 1 (milliseconds).
    :ivar acks: the producer's ``acks``: ``all`` (the default: a PUBACK
        waits until every in-sync replica has the message), ``1`` or ``0``.
    :ivar linger_ms: milliseconds the producer waits to fill a batch, >= 0.
    :ivar fetch_max_wait_ms: milliseconds a fetch waits for records, >= 1.
    :ivar max_poll_records: records one poll hands over at most, >= 1.
    :ivar session_timeout_ms: milliseconds after which a silent consumer
        leaves its group, >= 1000.
    :ivar heartbeat_interval_ms: milliseconds between consumer heartbeats,
        >= 100.
    :ivar request_timeout_ms: milliseconds a produce or admin request may
        take before it fails, >= 1000.
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    driver: str = "kafka-python"
    topic_prefix: str = ""
    partitions: int = 12
    replication_factor: int = 1
    retention_ms: int = 604800000
    acks: str = "all"
    linger_ms: int = 5
    fetch_max_wait_ms: int = 20
    max_poll_records: int = 5000
    session_timeout_ms: int = 10000
    heartbeat_interval_ms: int = 1000
    request_timeout_ms: int = 30000


@dataclass(frozen=True)
class NodeConfig:
    """This node's identity in a cluster, and its process's settings.

    :ivar service_id: the node's service id; None derives it from the host
        name.
    :ivar gc_threshold: container allocations between two collections of
        Python's youngest garbage-collector generation in a ``twistd tbmq``
        process, >= 0; 0 keeps Python's default (700).
    :ivar log_level: the lowest level of tbmq's log events that a ``twistd
        tbmq`` process writes: debug, info, warn, error or critical.
    :ivar heartbeat_interval: seconds between two of this node's heartbeats
        on the bus, > 0.
    :ivar node_timeout: seconds without a heartbeat after which another
        node counts a node as gone and its sessions as disconnected,
        > ``heartbeat_interval``.
    """

    service_id: str | None = None
    gc_threshold: int = 50000
    log_level: str = "info"
    heartbeat_interval: float = 5.0
    node_timeout: float = 30.0


@dataclass(frozen=True)
class EventsConfig:
    """The exported event log (:mod:`tbmq.events`, schema in ``docs/events.md``).

    :ivar enabled: export connect, disconnect, subscribe, publish, delivery,
        drop and authentication-failure events.
    :ivar sink: ``file`` (JSON Lines files in ``directory``) or ``bus``
        (records on the message bus topic ``bus_topic``).
    :ivar directory: where the files go; None means ``<data_dir>/events``.
    :ivar max_file_bytes: bytes, >= 1024; a file is rotated once it is this
        large.
    :ivar rotate_interval: seconds, > 0; a file is rotated once it is this
        old.
    :ivar compress: gzip rotated files (``.jsonl.gz``).
    :ivar buffer_size: events held between the reactor and the writer
        thread, >= 1; events beyond it are dropped and counted.
    :ivar flush_interval: seconds, > 0, between the writer thread's flushes.
    :ivar bus_topic: the bus topic of ``sink: bus``.
    """

    enabled: bool = False
    sink: str = "file"
    directory: str | None = None
    max_file_bytes: int = 67108864
    rotate_interval: float = 3600.0
    compress: bool = True
    buffer_size: int = 100000
    flush_interval: float = 1.0
    bus_topic: str = "tbmq.events"


@dataclass(frozen=True)
class HttpConfig:
    """The node's HTTP listener (:mod:`tbmq.ops`): Prometheus metrics at
    ``/metrics``, the REST admin API under ``/api/`` and the web console
    under ``/console/``.

    :ivar endpoint: a Twisted server endpoint string (``tcp:8083``); None
        (the default) runs no HTTP listener.  An endpoint that names no
        ``interface=`` listens on the loopback interface only
        (``interface=0.0.0.0`` for every interface).
    :ivar token_ttl: seconds a console or API login token is valid, >= 60.
    :ivar metrics_auth: whether ``/metrics`` asks for a login token too
        (off: Prometheus scrapes it as it is).
    """

    endpoint: str | None = None
    token_ttl: float = 3600.0
    metrics_auth: bool = False


def _empty_mapping() -> Mapping:
    return types.MappingProxyType({})


@dataclass(frozen=True)
class Config:
    """The whole configuration (see ``etc/tbmq.yml``).

    :ivar data_dir: directory of the embedded store's files.
    :ivar node: see :class:`NodeConfig`.
    :ivar listeners: at least one :class:`ListenerConfig`, unique names.
    :ivar mqtt: see :class:`MqttConfig`.
    :ivar storage: see :class:`StorageConfig`.
    :ivar auth: see :class:`AuthConfig`.
    :ivar postgres: see :class:`PostgresConfig`.
    :ivar redis: see :class:`RedisConfig`.
    :ivar kafka: see :class:`KafkaConfig`.
    :ivar bus: the message bus provider's name: ``memory`` (in process, one
        node) or ``kafka`` (see :class:`KafkaConfig`).
    :ivar plugins: free-form settings per plugin name, read-only (nested
        mappings are read-only too, lists become tuples).
    :ivar events: see :class:`EventsConfig`.
    :ivar http: see :class:`HttpConfig`.
    :ivar sys_interval: seconds between two publications of the
        ``$SYS/broker/...`` topics, >= 0; 0 publishes none.
    """

    data_dir: str = "./data"
    node: NodeConfig = field(default_factory=NodeConfig)
    listeners: tuple[ListenerConfig, ...] = (ListenerConfig(),)
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    postgres: PostgresConfig = field(default_factory=PostgresConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    bus: str = "memory"
    plugins: Mapping = field(default_factory=_empty_mapping, hash=False)
    events: EventsConfig = field(default_factory=EventsConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    sys_interval: float = 10.0


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


_CHECKS: dict[type, dict[str, Check]] = {
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
    },
    StorageConfig: {
        "backend": _one_of(*STORAGE_BACKENDS),
        "sqlite_synchronous": _one_of(*SQLITE_SYNCHRONOUS),
        "max_messages_per_client": _range(1),
        "device_store": _not_empty,
    },
    NodeConfig: {"service_id": _not_empty, "gc_threshold": _range(0),
                 "log_level": _one_of(*LOG_LEVELS), "heartbeat_interval": _positive,
                 "node_timeout": _positive},
    RedisConfig: {"url": _not_empty, "pool_size": _range(1), "key_prefix": _not_empty,
                  "message_ttl": _range(1)},
    KafkaConfig: {
        "bootstrap_servers": _not_empty,
        "driver": _one_of(*KAFKA_DRIVERS),
        "partitions": _range(1),
        "replication_factor": _range(1),
        "retention_ms": _range(1),
        "acks": _one_of(*KAFKA_ACKS),
        "linger_ms": _range(0),
        "fetch_max_wait_ms": _range(1),
        "max_poll_records": _range(1),
        "session_timeout_ms": _range(1000),
        "heartbeat_interval_ms": _range(100),
        "request_timeout_ms": _range(1000),
    },
    AuthConfig: {
        "credentials": _one_of("sqlite", "postgres", "memory"),
        "refresh_interval": _positive,
        "cache_size": _range(0),
        "cache_ttl": _positive,
        "anonymous_max_session_expiry": _range(0, 4294967295),
    },
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
_UPPER = {(StorageConfig, "sqlite_synchronous")}


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


def _read_file(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
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
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _env_path(name: str) -> list[str | int]:
    parts = name[len(ENV_PREFIX):].lower().split("__")
    return [int(p) if p.isdigit() else p for p in parts]


def _sort_key(path: list[str | int]) -> tuple:
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in path)


def _apply_env(data: dict, environ: Mapping[str, str]) -> dict[str, str]:
    """Set each ``TBMQ_A__B__0__C`` variable at key path ``a.b[0].c`` of
    ``data`` (in place).

    A list index may be the list's length, which appends a new entry (so
    ``TBMQ_LISTENERS__1__ENDPOINT`` adds a second listener to the default
    one).  Unknown keys are reported when the config is built.

    :returns: key path → the name of the variable that set it.
    """
    sources: dict[str, str] = {}
    settings = []
    for name, text in environ.items():
        if not name.upper().startswith(ENV_PREFIX):
            continue
        path = _env_path(name)
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
