"""The configuration's sections: frozen dataclasses whose field defaults are
the built-in defaults (documented in ``etc/tbmq.yml``), and the choices some
fields allow.  :mod:`tbmq.config.loading` builds them from YAML, the
environment and the command line; :mod:`tbmq.config` exports both.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field

from tbmq.integrations.settings import IntegrationConfig

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
KAFKA_DRIVERS = ("confluent", "kafka-python")

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
    :ivar trust_proxy: ``ws``/``wss``: the HTTP proxy in front of the
        listener is trusted to say who the client is: the client's address
        is the first address of the upgrade request's ``X-Forwarded-For``
        header, else its ``X-Real-IP`` header (TBMQ 2.4).  Off (the
        default), both headers are ignored, since any client can send them.
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
    trust_proxy: bool = False

    @property
    def label(self) -> str:
        """``name=endpoint`` for operators, or the endpoint alone when it is
        the name (a ``--listen`` listener)."""
        return self.endpoint if self.name == self.endpoint else f"{self.name}={self.endpoint}"


@dataclass(frozen=True)
class ClientRateLimitConfig:
    """A limit per client (TBMQ's ``mqtt.rate-limits.incoming-publish`` and
    ``outgoing-publish``; see :mod:`tbmq.broker.limits`).

    :ivar enabled: whether the limit applies.
    :ivar client_config: ``limit:seconds`` pairs, comma separated
        (``10:1,300:60``: at most 10 messages in any second and 300 in any
        minute; every pair holds); TBMQ's default ``10:1,300:60``.
    """

    enabled: bool = False
    client_config: str = "10:1,300:60"


@dataclass(frozen=True)
class ClusterRateLimitConfig:
    """A limit for the whole cluster (TBMQ's ``mqtt.rate-limits.total`` and
    ``device-persisted-messages``), shared out among the live nodes (see
    :mod:`tbmq.broker.limits`).

    :ivar enabled: whether the limit applies.
    :ivar config: ``limit:seconds`` pairs, comma separated, as
        :attr:`ClientRateLimitConfig.client_config`.
    """

    enabled: bool = False
    config: str = "1000:1,50000:60"


@dataclass(frozen=True)
class RateLimitsConfig:
    """TBMQ's ``mqtt.rate-limits``, each off by default with TBMQ's default
    pairs.

    :ivar incoming_publish: PUBLISH packets per publishing client.
    :ivar outgoing_publish: QoS 0 PUBLISH packets per non-persistent
        subscriber.
    :ivar total: incoming and outgoing messages of the whole cluster.
    :ivar device_persisted_messages: messages stored for persistent DEVICE
        clients, the whole cluster.
    """

    incoming_publish: ClientRateLimitConfig = field(default_factory=ClientRateLimitConfig)
    outgoing_publish: ClientRateLimitConfig = field(default_factory=ClientRateLimitConfig)
    total: ClusterRateLimitConfig = field(default_factory=ClusterRateLimitConfig)
    device_persisted_messages: ClusterRateLimitConfig = field(
        default_factory=lambda: ClusterRateLimitConfig(config="100:1,1000:60"))


@dataclass(frozen=True)
class UnauthorizedClientsConfig:
    """The unauthorized-client log (TBMQ's unauthorized clients,
    :mod:`tbmq.cluster.unauthorized`): the last refused connection attempt
    per client id, listed by ``/api/unauthorized-clients``.

    :ivar ttl: seconds an attempt is kept, > 0 (TBMQ's
        ``sql.ttl.unauthorized_client.ttl``: three days).
    :ivar max_entries: client ids kept at most on each node, >= 1; past it
        the oldest attempt is evicted (and counted), so a flood of random
        client ids cannot grow memory without bound.
    """

    ttl: float = 259200.0
    max_entries: int = 10000


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
        whose packet is not complete by then is closed (v5: DISCONNECT 0x8D
        Keep alive timeout), whatever its keep alive, 0 included.
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
    :ivar rate_limits: see :class:`RateLimitsConfig`.
    :ivar sessions_limit: sessions in the cluster (persistent ones and
        connected clean ones, as the session registry knows them), >= 0 (0:
        no limit); a CONNECT that would make one more gets CONNACK 0x97
        Quota exceeded (v3: 0x03 Server unavailable).  TBMQ's
        ``mqtt.sessions-limit``; a soft limit (two nodes may admit the
        last place at once).
    :ivar application_clients_limit: persistent APPLICATION sessions in the
        cluster, >= 0 (0: no limit), refused as ``sessions_limit``.
    :ivar unauthorized_clients: see :class:`UnauthorizedClientsConfig`.
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
    rate_limits: RateLimitsConfig = field(default_factory=RateLimitsConfig)
    sessions_limit: int = 0
    application_clients_limit: int = 0
    unauthorized_clients: UnauthorizedClientsConfig = field(
        default_factory=UnauthorizedClientsConfig)


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


#: The placeholders of ``auth.http.url`` and ``auth.http.body`` (each
#: written ``${name}``).
HTTP_AUTH_PLACEHOLDERS = ("clientId", "username", "password", "certificateCn", "peerhost")

#: Values of ``auth.http.method``.
HTTP_AUTH_METHODS = ("GET", "POST")

#: Values of ``auth.http.default_client_type`` (TBMQ's client types).
CLIENT_TYPES = ("DEVICE", "APPLICATION")


@dataclass(frozen=True)
class HttpAuthConfig:
    """The ``http`` authentication provider (TBMQ 2.3's HTTP provider,
    EMQX's HTTP authenticator): each CONNECT is decided by an HTTP service
    (:mod:`tbmq_plugins.auth_http`).

    :ivar url: the service's ``http://`` or ``https://`` URL; required when
        ``http`` is in ``auth.providers``.  May hold placeholders (each
        value URL-quoted).
    :ivar method: ``GET`` (the ``body`` fields as URL query parameters) or
        ``POST`` (the ``body`` fields as a JSON object, or form-encoded when
        ``headers`` give ``Content-Type: application/x-www-form-urlencoded``).
    :ivar headers: HTTP header name → value, sent with each request.
    :ivar body: field name → template, with the placeholders ``${clientId}``,
        ``${username}``, ``${password}``, ``${certificateCn}`` and
        ``${peerhost}`` (the client's address); a value the client did not
        give is the empty string.  None: ``clientId``, ``username`` and
        ``password``.
    :ivar timeout: seconds to wait for the whole answer, > 0.
    :ivar cache_ttl: seconds an answer (allow or deny) is reused for the
        same values of the placeholders the request uses, >= 0; 0 caches
        nothing.
    :ivar tls_ca: a PEM file of the CA certificates an ``https://``
        service's certificate must chain to; None: the system's CA
        certificates.
    :ivar default_client_type: ``DEVICE`` or ``APPLICATION``: the client
        type of an accepted client whose answer names none.
    :ivar default_pub: topic-name regexes for an answer without ``pub``
        (:mod:`tbmq.auth.rules`); None: no restriction.
    :ivar default_sub: topic-filter regexes for an answer without ``sub``;
        None: no restriction.
    """

    url: str | None = None
    method: str = "POST"
    headers: Mapping = field(default_factory=lambda: types.MappingProxyType({}), hash=False)
    body: Mapping | None = field(default=None, hash=False)
    timeout: float = 5.0
    cache_ttl: float = 0.0
    tls_ca: str | None = None
    default_client_type: str = "DEVICE"
    default_pub: tuple[str, ...] | None = None
    default_sub: tuple[str, ...] | None = None


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
        node, >= 1; one more gets 0x89 Server busy (v3: 0x03 Server
        unavailable).
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
        authentication, SCRAM-SHA-256/512), ``jwt`` (a token as the password),
        ``http`` (an HTTP service decides, see :class:`HttpAuthConfig`).
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
    :ivar http: see :class:`HttpAuthConfig`.
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
    http: HttpAuthConfig = field(default_factory=HttpAuthConfig)


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
    :ivar driver: ``confluent`` (confluent-kafka on librdkafka, the
        default) or ``kafka-python`` (pure Python, about a tenth of the
        throughput).
    :ivar topic_prefix: prepended to every topic of the catalogue, so
        several clusters can share one Kafka.
    :ivar partitions: partitions of each topic created, >= 1.
    :ivar replication_factor: replicas of each topic created, >= 1.
    :ivar retention_ms: ``retention.ms`` of the topics created that are not
        compacted, >= 1 (milliseconds).
    :ivar min_compaction_lag_ms: ``min.compaction.lag.ms`` of the compacted
        topics created, >= 0 (milliseconds): Kafka keeps every record
        younger than that, so a consumer reads a hole right after a younger
        record again instead of taking it for compaction (Tansu's holes);
        0: not set, and holes in compacted topics are never read again.
    :ivar acks: the producer's ``acks``: ``all`` (the default: a PUBACK
        waits until every in-sync replica has the message), ``1`` or ``0``.
    :ivar linger_ms: milliseconds the producer waits to fill a batch, >= 0.
    :ivar fetch_max_wait_ms: milliseconds a fetch waits for records, >= 1.
    :ivar fetch_min_bytes: bytes of records a fetch waits for (Kafka's
        ``fetch.min.bytes``), at most ``fetch_max_wait_ms``, >= 1: 1
        answers as soon as a record is there (on a broker that answers
        early, Apache Kafka).
    :ivar idle_fetch_interval_ms: milliseconds between two looks for
        records of a consumer client that has read nothing for 50 ms (its
        idle mode: it does not fetch; confluent asks the brokers for the
        latest offsets, kafka-python fetches once), >= 0; records, or a
        record the node produces, bring it back to fetching continuously.
        0: a client always fetches (one fetch per ``fetch_max_wait_ms``).
    :ivar max_poll_records: records one poll hands over at most, >= 1.
    :ivar session_timeout_ms: milliseconds after which a silent consumer
        leaves its group, >= 1000.
    :ivar heartbeat_interval_ms: milliseconds between consumer heartbeats,
        >= 100.
    :ivar request_timeout_ms: milliseconds a produce or admin request may
        take before it fails, >= 1000.
    :ivar statistics_interval_ms: milliseconds between two log lines of
        librdkafka's latency figures per client and broker (its
        ``statistics.interval.ms``: round trip, time in its queue, time
        waiting behind a request in flight), >= 0; 0 (the default): none.
        The confluent driver only.
    :ivar enable_topic_deletion: TBMQ's ``queue.kafka.enable-topic-deletion``:
        when the session of a persistent APPLICATION client ends (expired,
        or removed), the node that ends it deletes its
        ``tbmq.msg.app.<clientId>`` topic and what waited there (on any bus,
        the embedded in-process one included); false keeps the topics
        (Kafka's ``delete.topic.enable`` off, or topics managed by hand).
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    driver: str = "confluent"
    topic_prefix: str = ""
    partitions: int = 12
    replication_factor: int = 1
    retention_ms: int = 604800000
    min_compaction_lag_ms: int = 60000
    acks: str = "all"
    linger_ms: int = 1
    fetch_max_wait_ms: int = 5
    fetch_min_bytes: int = 1
    idle_fetch_interval_ms: int = 100
    max_poll_records: int = 5000
    session_timeout_ms: int = 6000
    heartbeat_interval_ms: int = 1000
    request_timeout_ms: int = 30000
    statistics_interval_ms: int = 0
    enable_topic_deletion: bool = True


@dataclass(frozen=True)
class NodeConfig:
    """This node's identity in a cluster, and its process's settings.

    :ivar service_id: the node's service id; None derives it from the host
        name.
    :ivar gc_threshold: container allocations between two collections of
        Python's youngest garbage-collector generation in a ``twistd tbmq``
        process, >= 0 (the middle generation's follows: every 500,000
        allocations, :func:`tbmq.tap.tune_gc`); 0 keeps Python's
        thresholds (700, 10, 10).
    :ivar switch_interval: seconds, > 0: at most how long a thread that
        wants the GIL back (the SQLite database thread after each statement
        and its COMMIT, the Kafka client's consumer thread) waits while the
        reactor thread runs Python, in a ``twistd tbmq`` process
        (``sys.setswitchinterval``; Python's default is 0.005): the
        PUBACKs of messages to a persistent APPLICATION client wait for
        those COMMITs (:func:`tbmq.tap.tune_threads`).
    :ivar log_level: the lowest level of tbmq's log events that a ``twistd
        tbmq`` process writes: debug, info, warn, error or critical.
    :ivar heartbeat_interval: seconds between two of this node's heartbeats
        on the bus, > 0.
    :ivar node_timeout: seconds without a heartbeat after which another
        node counts a node as gone and its sessions as disconnected,
        > ``heartbeat_interval``.
    :ivar connect_answer_timeout: seconds a CONNECT waits at most for the
        cluster's decision (``tbmq.client.session.event.request``), > 0;
        without one it gets CONNACK 0x88 Server unavailable and the client
        retries.  The decision is late while the partition of its client id
        belongs to a dead node (``kafka.session_timeout_ms`` and a group
        join); at most 0.8 of ``mqtt.connect_timeout``.
    """

    service_id: str | None = None
    gc_threshold: int = 5000
    switch_interval: float = 0.001
    log_level: str = "info"
    heartbeat_interval: float = 5.0
    node_timeout: float = 30.0
    connect_answer_timeout: float = 2.5


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
    :ivar integrations: the outbound integrations, each a
        :class:`tbmq.integrations.settings.IntegrationConfig` (unique names).
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
    integrations: tuple[IntegrationConfig, ...] = ()
