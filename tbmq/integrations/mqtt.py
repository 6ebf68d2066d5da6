"""The ``mqtt`` integration: a bridge that publishes the messages to
another MQTT broker, as an MQTT 5.0 client whose packets are made and read
by :mod:`tbmq.mqtt` only.

The connection is kept by Twisted's
:class:`~twisted.application.internet.ClientService` (reconnects with an
exponential back-off from ``retry_initial`` to ``retry_max``).  At QoS 1 a
message is acknowledged by its PUBACK [MQTT-4.3.2]; a PUBACK with a failure
reason code refuses it for good
(:class:`~tbmq.integrations.core.Rejected`), except QUOTA_EXCEEDED,
MESSAGE_RATE_TOO_HIGH and SERVER_BUSY, which are retried; a connection
lost before the PUBACK makes the message be sent again (on the next
connection, after the integration's back-off).  At QoS 0 a message is
acknowledged once written to the connection.
"""

from __future__ import annotations

from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet import defer, protocol, task
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.error import ConnectionLost
from twisted.logger import Logger

from tbmq.integrations.core import Rejected, Target
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import Message
from tbmq.mqtt import (
    MQTT_5, Connack, Connect, Disconnect, MalformedPacket, Pingreq, Property, Puback,
    Publish, ReasonCode, encode, is_failure,
)
from tbmq.mqtt.codec import Decoder

__all__ = ["BridgeProtocol", "MqttTarget"]

#: PUBACK reason codes after which the message is sent again
RETRIED_CODES = frozenset((ReasonCode.QUOTA_EXCEEDED, ReasonCode.MESSAGE_RATE_TOO_HIGH,
                           ReasonCode.SERVER_BUSY))


class NotConnected(Exception):
    """The bridge has no connection to the other broker now."""


class BridgeProtocol(protocol.Protocol):
    """One connection of the bridge: CONNECT, then PUBLISH / PUBACK.

    :ivar ready: True once a CONNACK SUCCESS was received.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, target: "MqttTarget") -> None:
        self.target = target
        self.decoder = Decoder(protocol_level=MQTT_5, server_side=False)
        self.ready = False
        self.pending: dict[int, defer.Deferred] = {}
        self._next_id = 0
        self._ping = None

    def connectionMade(self) -> None:
        config = self.target.config
        password = config.password.encode("utf-8") if config.password is not None else None
        self.transport.write(encode(Connect(
            protocol_level=MQTT_5, clean_start=True, keep_alive=config.keep_alive,
            client_id=self.target.client_id, username=config.username, password=password), MQTT_5))

    def dataReceived(self, data: bytes) -> None:
        try:
            packets = self.decoder.feed(data)
        except MalformedPacket as e:
            self.log.warn("integration {name}: malformed packet from {host}: {error}",
                          name=self.target.config.name, host=self.target.config.host, error=e)
            self.transport.loseConnection()
            return
        for packet in packets:
            if isinstance(packet, Puback):
                self._puback(packet)
            elif isinstance(packet, Connack):
                self._connack(packet)
            elif isinstance(packet, Disconnect):
                self.log.info("integration {name}: {host} disconnected the bridge ({reason})",
                              name=self.target.config.name, host=self.target.config.host,
                              reason=_reason_name(packet.reason_code))
                self.transport.loseConnection()

    def _connack(self, packet: Connack) -> None:
        config = self.target.config
        if packet.reason_code != ReasonCode.SUCCESS:
            self.log.warn("integration {name}: {host}:{port} refused the bridge: CONNACK {reason}",
                          name=config.name, host=config.host, port=config.port,
                          reason=_reason_name(packet.reason_code))
            self.transport.loseConnection()
            return
        self.ready = True
        self.target.connected(self)
        if config.keep_alive:
            self._ping = task.LoopingCall(self._send, Pingreq())
            self._ping.clock = self.target.reactor
            self._ping.start(config.keep_alive * 0.75, now=False)

    def _puback(self, packet: Puback) -> None:
        d = self.pending.pop(packet.packet_id, None)
        if d is None:
            return  # abandoned (timed out) before its PUBACK came
        code = packet.reason_code
        if not is_failure(code):
            d.callback(None)
        elif code in RETRIED_CODES:
            d.errback(NotConnected(f"PUBACK {_reason_name(code)}"))
        else:
            d.errback(Rejected(f"PUBACK {_reason_name(code)}"))

    def _send(self, packet) -> None:
        self.transport.write(encode(packet, MQTT_5))

    def publish(self, message: Message, topic: str, qos: int, now: float) -> defer.Deferred:
        """Write one PUBLISH.

        :returns: a Deferred firing at its PUBACK (QoS 1), or fired (QoS 0).
        """
        properties = dict(message.properties)
        if message.expires_at is not None:
            # the remaining lifetime [MQTT-3.3.2-6]
            properties[Property.MESSAGE_EXPIRY_INTERVAL] = max(1, int(message.expires_at - now))
        if qos == 0:
            self._send(Publish(topic, message.payload, 0, message.retain, False, None,
                               properties))
            return defer.succeed(None)
        packet_id = self._packet_id()
        d = defer.Deferred(lambda _: self.pending.pop(packet_id, None))
        self.pending[packet_id] = d
        self._send(Publish(topic, message.payload, 1, message.retain, False, packet_id,
                           properties))
        return d

    def _packet_id(self) -> int:
        for _ in range(65535):
            self._next_id = self._next_id % 65535 + 1
            if self._next_id not in self.pending:
                return self._next_id
        raise NotConnected("no packet identifier free")

    def connectionLost(self, reason) -> None:
        self.ready = False
        if self._ping is not None and self._ping.running:
            self._ping.stop()
        self.target.disconnected(self)
        pending, self.pending = self.pending, {}
        for d in pending.values():
            d.errback(ConnectionLost("the connection to the broker was lost before the PUBACK"))


def _reason_name(code: int) -> str:
    try:
        return f"{ReasonCode(code).name} (0x{code:02X})"
    except ValueError:
        return f"0x{code:02X}"


class _Factory(protocol.Factory):
    def __init__(self, target: "MqttTarget") -> None:
        self.target = target

    def buildProtocol(self, addr):
        return BridgeProtocol(self.target)


class MqttTarget(Target):
    """Publishes each message to another broker, at ``qos``, on
    ``topic_prefix`` + its topic name, with its RETAIN flag and MQTT 5
    properties (user properties, content type ...; the message expiry
    interval as what remains of it).

    :param config: the :class:`~tbmq.integrations.settings.IntegrationConfig`
        (``host``, ``port``, ``client_id``, ``username``, ``password``,
        ``qos``, ``topic_prefix``, ``tls``, ``tls_ca``, ``keep_alive``).
    :param reactor: the reactor.
    :ivar protocol: the connected :class:`BridgeProtocol`, or None.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, config, reactor) -> None:
        super().__init__(config, reactor)
        self.client_id = config.client_id or f"tbmq-bridge-{config.name}"
        self.protocol: BridgeProtocol | None = None
        endpoint = HostnameEndpoint(reactor, config.host, config.port)
        if config.tls:
            from twisted.internet.ssl import Certificate, optionsForClientTLS

            trust = None
            if config.tls_ca is not None:
                with open(config.tls_ca, "rb") as f:
                    trust = Certificate.loadPEM(f.read())
            endpoint = wrapClientTLS(optionsForClientTLS(config.host, trustRoot=trust),
                                     endpoint)
        self.service = ClientService(
            endpoint, _Factory(self), clock=reactor,
            retryPolicy=backoffPolicy(initialDelay=config.retry_initial,
                                      maxDelay=config.retry_max))

    def start(self) -> None:
        self.service.startService()

    def connected(self, proto: BridgeProtocol) -> None:
        config = self.config
        self.log.info("integration {name}: connected to {host}:{port} as {client_id}",
                      name=config.name, host=config.host, port=config.port,
                      client_id=self.client_id)
        self.protocol = proto
        self.ready()

    def disconnected(self, proto: BridgeProtocol) -> None:
        if self.protocol is proto:
            self.protocol = None

    def send(self, message: Message):
        proto = self.protocol
        if proto is None or not proto.ready:
            raise NotConnected(f"not connected to {self.config.host}:{self.config.port}")
        return proto.publish(message, self.config.topic_prefix + message.topic,
                             self.config.qos, self.reactor.seconds())

    def stop(self):
        proto = self.protocol
        if proto is not None and proto.ready:
            proto._send(Disconnect(ReasonCode.SUCCESS))
        return self.service.stopService()
