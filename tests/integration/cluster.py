"""Helpers of the cluster suite: ``twistd -n tbmq`` nodes on one Kafka
(Tansu), one Redis and one PostgreSQL, and a publisher that counts what it
was acknowledged for.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as paho

from tests.integration.helpers import Broker, PahoClient, uid


@dataclass
class Services:
    """Where the cluster's outside services are.

    :ivar bootstrap: Kafka's ``host:port``.
    :ivar redis_url: ``redis://host:port/0``.
    :ivar dsn: the PostgreSQL DSN of the cluster's database.
    :ivar prefix: the Kafka topic and Redis key prefix of this cluster (so
        clusters of several test modules never meet).
    """

    bootstrap: str
    redis_url: str
    dsn: str
    prefix: str


class ClusterNode(Broker):
    """One ``twistd -n tbmq`` node of a cluster: ``bus: kafka``, the device
    store in Redis, credentials in PostgreSQL, retained messages rebuilt
    from Kafka; short heartbeats and group timeouts so a test sees a dead
    node taken over within seconds.

    :param driver: ``kafka-python`` or ``confluent``.
    :param device_store: ``redis`` or ``postgres``.
    """

    #: joining the consumer groups takes a few seconds on Tansu
    START_TIMEOUT = 90.0

    def __init__(self, workdir: Path, services: Services, service_id: str,
                 driver: str = "kafka-python", device_store: str = "redis",
                 env: dict | None = None) -> None:
        self.service_id = service_id
        base = {
            "TBMQ_BUS": "kafka",
            "TBMQ_KAFKA__BOOTSTRAP_SERVERS": services.bootstrap,
            "TBMQ_KAFKA__DRIVER": driver,
            "TBMQ_KAFKA__TOPIC_PREFIX": services.prefix + ".",
            "TBMQ_KAFKA__PARTITIONS": "4",
            "TBMQ_KAFKA__SESSION_TIMEOUT_MS": "6000",
            "TBMQ_KAFKA__HEARTBEAT_INTERVAL_MS": "1000",
            "TBMQ_KAFKA__REQUEST_TIMEOUT_MS": "5000",
            "TBMQ_NODE__SERVICE_ID": service_id,
            "TBMQ_NODE__HEARTBEAT_INTERVAL": "1",
            "TBMQ_NODE__NODE_TIMEOUT": "6",
            "TBMQ_STORAGE__BACKEND": "memory",
            "TBMQ_STORAGE__DEVICE_STORE": device_store,
            "TBMQ_REDIS__URL": services.redis_url,
            "TBMQ_REDIS__KEY_PREFIX": f'"{services.prefix}:"',  # quoted: YAML
            "TBMQ_AUTH__CREDENTIALS": "postgres",
            "TBMQ_POSTGRES__DSN": services.dsn,
            "TBMQ_NODE__LOG_LEVEL": "info",
        }
        base.update(env or {})
        super().__init__(Path(workdir) / service_id, env=base)

    def wait_log(self, text: str, timeout: float = 60.0) -> None:
        """Wait until the node's log contains ``text``."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.service_id}: {text!r} not logged in {timeout} s:\n"
                                     f"{self.log()[-5000:]}")
            time.sleep(0.2)


class CountingPublisher:
    """Publishes ``prefix/<n>`` payloads at QoS 1 on its own thread and keeps
    the numbers whose PUBACK (reason code < 0x80) it received; reconnects to
    the next port of ``ports`` when its connection is lost.

    :ivar acked: the payload numbers acknowledged.
    :ivar sent: how many were handed to paho.
    """

    def __init__(self, ports: list[int], topic: str, rate: float = 200.0,
                 version: int = 5) -> None:
        self.ports = list(ports)
        self.topic = topic
        self.rate = rate
        self.version = version
        self.acked: set[int] = set()
        self.refused: int = 0
        self.sent = 0
        # (client generation, paho mid) -> payload number / early reason code
        self._mids: dict[tuple[int, int], int] = {}
        self._early: dict[tuple[int, int], int] = {}
        self._generation = 0  # of the current client: each numbers its messages from 1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.client: PahoClient | None = None
        self.reconnects = 0

    def start(self) -> "CountingPublisher":
        self._connect()
        self._thread.start()
        return self

    def _connect(self) -> None:
        while True:
            port = self.ports[0]
            client = PahoClient(port, self.version, client_id=f"pub-{uid()}")
            # a new client numbers its messages from 1 again: an ack is
            # matched with the message of the same client only
            self._generation += 1
            client.client.on_publish = functools.partial(self._on_publish, self._generation)
            try:
                client.connect_and_wait(timeout=15)
                with self._lock:
                    # the old client's messages that are not acknowledged by
                    # now never will be: they stay not acknowledged
                    self._mids = {k: n for k, n in self._mids.items()
                                  if k[0] == self._generation}
                    self._early = {}
                    self.client = client
                return
            except (AssertionError, OSError):
                client.close()
                self.ports.append(self.ports.pop(0))
                if self._stop.is_set():
                    return

    def _on_publish(self, generation, client, userdata, mid, reason_code, properties) -> None:
        code = getattr(reason_code, "value", reason_code)
        key = (generation, mid)
        with self._lock:
            n = self._mids.pop(key, None)
            if n is None:
                self._early[key] = code  # acknowledged before _run recorded it
                return
            self._record(n, code)

    def _record(self, n: int, code) -> None:
        if code is None or code < 0x80:
            self.acked.add(n)
        else:
            self.refused += 1

    def _run(self) -> None:
        n = 0
        interval = 1.0 / self.rate
        while not self._stop.is_set():
            client = self.client
            if client is None or not client.client.is_connected():
                if client is not None:
                    client.close()
                self.ports.append(self.ports.pop(0))
                self.reconnects += 1
                self._connect()
                continue
            # not under self._lock: paho's thread takes it in _on_publish
            # while holding paho's own lock, which publish() also takes
            info = client.client.publish(self.topic, str(n).encode(), 1)
            if info.rc == paho.MQTT_ERR_SUCCESS:
                key = (self._generation, info.mid)
                with self._lock:
                    self.sent += 1
                    code = self._early.pop(key, None)
                    if code is None:
                        self._mids[key] = n
                    else:
                        self._record(n, code)
                n += 1
            time.sleep(interval)

    def stop(self, drain: float = 10.0) -> None:
        """Stop publishing and wait up to ``drain`` seconds for the
        outstanding acknowledgements."""
        self._stop.set()
        self._thread.join(30)
        deadline = time.monotonic() + drain
        while self._mids and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.client is not None:
            self.client.close()
