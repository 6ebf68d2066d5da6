"""Flow control (ARCHITECTURE.md, "Flow control: nothing acknowledged is
dropped, nobody is held for long"), end to end: the real broker, real
sockets, and every message tagged with (publisher, sequence number) in its
payload, so the tests compare the *sets* of messages acknowledged to the
publishers (PUBACK received) and delivered to the subscribers. They count;
no assertion is about time (the waits are generous and only end a test that
would otherwise hang).

The broker runs with small queues, through keys that exist in
``tbmq/config/schema.py`` today (``mqtt.max_inflight_messages``,
``mqtt.max_pending_messages``, ``mqtt.max_queued_messages``,
``mqtt.receive_maximum``, ``mqtt.max_outbound_buffer``,
``mqtt.outbound_pause_timeout``), so that the publishers go far past the
limits:

* a subscriber that reads as fast as it can gets every acknowledged
  message, and the broker's memory stays within what those limits allow;
* a persistent v5 subscriber announcing Receive Maximum 100 that
  acknowledges ~500 messages/s gets every acknowledged message (past the
  in-memory queue they wait in its store);
* a non-persistent subscriber that never reads is either still connected
  with every acknowledged message there to read, or disconnected (v5:
  DISCONNECT 0x97 Quota exceeded when it gets that far); a well-behaved
  subscriber beside it gets everything.

The publishers are raw sockets (tbmq's codec, pre-built packets) so that
they can outpace any subscriber; the subscribers are paho clients.
"""

from __future__ import annotations

import collections
import socket
import struct
import threading
import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes

from tbmq.mqtt import Connack, Connect, Disconnect, Puback, Publish, Suback, Subscribe, SubscriptionRequest
from tbmq.mqtt.codec import Decoder, encode
from tests.integration.helpers import HOST, PahoClient, props, uid

pytestmark = pytest.mark.timeout(90)

TAG = struct.Struct("!II")  # (publisher index, sequence number)

#: the limits every test runs with (``mqtt.*``)
INFLIGHT = 100        # max_inflight_messages: a subscriber's outbound window
PENDING = 100         # max_pending_messages: a non-persistent session's queue
QUEUED = 1000         # max_queued_messages: a persistent session's in-memory queue
RECEIVE_MAXIMUM = 20  # receive_maximum: QoS 1 PUBLISH a publisher may have unacknowledged
OUTBOUND = 65536      # max_outbound_buffer: bytes a paused connection may take
PAUSE_TIMEOUT = 1.0   # outbound_pause_timeout: how long one slow connection may hold publishers

ENV = {
    "TBMQ_MQTT__MAX_INFLIGHT_MESSAGES": str(INFLIGHT),
    "TBMQ_MQTT__MAX_PENDING_MESSAGES": str(PENDING),
    "TBMQ_MQTT__MAX_QUEUED_MESSAGES": str(QUEUED),
    "TBMQ_MQTT__RECEIVE_MAXIMUM": str(RECEIVE_MAXIMUM),
    "TBMQ_MQTT__MAX_OUTBOUND_BUFFER": str(OUTBOUND),
    "TBMQ_MQTT__OUTBOUND_PAUSE_TIMEOUT": str(PAUSE_TIMEOUT),
}

#: nothing new for this long after the publishers are done: the delivery is over
IDLE = 5.0


# --------------------------------------------------------------------------
# clients


class RawPublisher(threading.Thread):
    """Publishes ``count`` tagged QoS 1 messages as fast as they are
    acknowledged (at most ``window`` unacknowledged), on a raw socket in its
    own thread.

    :ivar acked: the sequence numbers acknowledged with a reason code < 0x80.
    :ivar refused: PUBACKs with a reason code >= 0x80 (not acknowledged).
    """

    def __init__(self, port: int, level: int, topic: str, index: int, count: int,
                 payload_size: int, window: int = RECEIVE_MAXIMUM, timeout: float = 60.0) -> None:
        super().__init__(name=f"publisher-{index}", daemon=True)
        self.port, self.level, self.index, self.count = port, level, index, count
        self.window, self.timeout = window, timeout
        template = encode(Publish(topic, bytes(max(payload_size, TAG.size)), qos=1, packet_id=1), level)
        self.template = bytearray(template)
        self.tag_at = len(template) - max(payload_size, TAG.size)
        self.pid_at = self.tag_at - 2 - (1 if level == 5 else 0)  # the id, then v5's empty properties
        assert self.template[self.pid_at:self.pid_at + 2] == b"\x00\x01"
        self.acked: set[int] = set()
        self.refused = 0
        self.sent = 0
        self.error: str | None = None
        self.disconnect_code: int | None = None

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # reported by the test
            self.error = f"{type(e).__name__}: {e}"

    def _run(self) -> None:
        sock = socket.create_connection((HOST, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        decoder = Decoder(protocol_level=self.level, server_side=False)
        sock.sendall(encode(Connect(client_id=f"pub{self.index}-{uid()}", protocol_level=self.level), self.level))
        pending = collections.deque()

        def read() -> bool:
            data = sock.recv(1 << 16)
            if not data:
                return False
            pending.extend(decoder.feed(data))
            return True

        while not pending:
            if not read():
                raise ConnectionError("closed before CONNACK")
        ack = pending.popleft()
        assert isinstance(ack, Connack) and ack.reason_code == 0, ack
        window = min(self.window, ack.properties.get(0x21, 65535) if self.level == 5 else 65535)
        inflight: dict[int, int] = {}
        pkt, pid_at, tag_at = self.template, self.pid_at, self.tag_at
        while self.sent < self.count or inflight:
            chunk = bytearray()
            while len(inflight) < window and self.sent < self.count:
                seq = self.sent
                pid = seq % 65535 + 1
                pkt[pid_at:pid_at + 2] = pid.to_bytes(2, "big")
                TAG.pack_into(pkt, tag_at, self.index, seq)
                chunk += pkt
                inflight[pid] = seq
                self.sent += 1
            if chunk:
                sock.sendall(chunk)  # blocks while the broker does not read us: that is its flow control
            if not pending and not read():
                break  # closed by the broker
            while pending:
                p = pending.popleft()
                if isinstance(p, Puback):
                    seq = inflight.pop(p.packet_id, None)
                    if seq is not None:
                        if p.reason_code < 0x80:
                            self.acked.add(seq)
                        else:
                            self.refused += 1
                elif isinstance(p, Disconnect):
                    self.disconnect_code = p.reason_code
        try:
            sock.sendall(encode(Disconnect(), self.level))
        except OSError:
            pass
        sock.close()


class Tags:
    """Tagged messages received, deduplicated: ``seen[(index, seq)]``."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, int]] = set()
        self.duplicates = 0
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def add(self, payload: bytes) -> None:
        key = TAG.unpack_from(payload, 0)
        with self.lock:
            if key in self.seen:
                self.duplicates += 1
            else:
                self.seen.add(key)
            self.last = time.monotonic()

    def __len__(self) -> int:
        return len(self.seen)


def acked_set(publishers) -> set[tuple[int, int]]:
    return {(p.index, s) for p in publishers for s in p.acked}


def drain_paho(client: PahoClient, tags: Tags, until) -> None:
    """Move what ``client`` received into ``tags`` until ``until()`` is true
    or nothing came for :data:`IDLE` seconds."""
    last = time.monotonic()
    while not until():
        try:
            msg = client.messages.get(timeout=0.2)
        except Exception:
            if time.monotonic() - last > IDLE:
                return
            continue
        tags.add(msg.payload)
        last = time.monotonic()


def run_publishers(publishers, timeout: float = 60.0) -> None:
    for p in publishers:
        p.start()
    deadline = time.monotonic() + timeout
    for p in publishers:
        p.join(max(0.1, deadline - time.monotonic()))
    stuck = [p.index for p in publishers if p.is_alive()]
    assert not stuck, (f"publishers {stuck} still publishing after {timeout} s: "
                       f"{[(p.index, p.sent, len(p.acked)) for p in publishers]}")


class RssWatch(threading.Thread):
    """The broker's peak VmRSS, polled every 20 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="rss", daemon=True)
        self.pid = pid
        self.peak_kb = 0
        self.stop = threading.Event()

    @staticmethod
    def rss_kb(pid: int) -> int:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak_kb = max(self.peak_kb, self.rss_kb(self.pid))
            except OSError:
                return
            self.stop.wait(0.02)


def describe_loss(name: str, acked: set, got: set) -> str:
    lost = acked - got
    by_pub = collections.Counter(i for i, _ in lost)
    return (f"{name}: {len(lost):,} of {len(acked):,} acknowledged messages never delivered "
            f"({100.0 * len(lost) / max(1, len(acked)):.1f} %; per publisher {dict(sorted(by_pub.items()))}); "
            f"delivered {len(got):,}")


# --------------------------------------------------------------------------
# 1. fan-in to a subscriber that reads as fast as it can


FANIN_PUBLISHERS = 5
FANIN_COUNT = 2000
FANIN_PAYLOAD = 4096


def rss_bound_kb(baseline_kb: int, connections: int) -> int:
    """What the configured limits let the broker hold beyond its baseline,
    times 2 for Python's per-object overhead and allocator slack, plus
    16 MiB. 5 × 2,000 × 4 KiB = 39 MiB are published: a broker that kept
    them all would pass it."""
    per_msg = FANIN_PAYLOAD + 1024
    queued = (PENDING + INFLIGHT) * per_msg                      # the subscriber's queue and window
    inbound = FANIN_PUBLISHERS * RECEIVE_MAXIMUM * per_msg      # unacknowledged from the publishers
    buffers = connections * (OUTBOUND + 2 * 65536)              # paused output, Twisted's buffer, a read
    return baseline_kb + 2 * (queued + inbound + buffers) // 1024 + 16 * 1024


def test_fanin_qos1_every_acknowledged_message_delivered(broker_factory, mqtt_version):
    """5 publishers × 2,000 QoS 1 messages of 4 KiB → 1 subscriber (paho,
    reading as fast as it can): the set delivered contains the set
    acknowledged, and the broker's RSS stays within the limits' bound.

    The subscriber may hold the publishers for 30 s of credit here, not the
    1 s of :data:`PAUSE_TIMEOUT`: a reader that a loaded machine does not
    run for a second is *slow* by design (disconnected, 0x97, its losses
    counted: ``unit/test_protocol.py::test_a_slow_subscriber_loses_qos0_and_holds_nobody_back``),
    and this test is about one that keeps up."""
    broker = broker_factory(env={**ENV, "TBMQ_MQTT__OUTBOUND_PAUSE_TIMEOUT": "30"})
    topic = f"fc/{uid()}"
    sub = PahoClient(broker.port, mqtt_version).connect_and_wait()
    try:
        assert sub.subscribe(f"{topic}/+", 1) == [1]
        pubs = [RawPublisher(broker.port, mqtt_version, f"{topic}/{i}", i, FANIN_COUNT, FANIN_PAYLOAD)
                for i in range(FANIN_PUBLISHERS)]
        baseline = RssWatch.rss_kb(broker.proc.pid)
        watch = RssWatch(broker.proc.pid)
        watch.start()
        tags = Tags()
        for p in pubs:  # the publishers run in their threads, this one reads
            p.start()
        while any(p.is_alive() for p in pubs):
            drain_paho(sub, tags, lambda: not any(p.is_alive() for p in pubs))
            if time.monotonic() - tags.last > 60:
                break
        acked = acked_set(pubs)
        drain_paho(sub, tags, lambda: acked <= tags.seen)
        watch.stop.set()
        watch.join(1)
    finally:
        sub.close()
    errors = [(p.index, p.error) for p in pubs if p.error]
    assert not errors, errors
    assert not any(p.is_alive() for p in pubs), "publishers still running"
    acked = acked_set(pubs)
    bound = rss_bound_kb(baseline, FANIN_PUBLISHERS + 1)
    problems = []
    if not acked <= tags.seen:
        problems.append(describe_loss("subscriber", acked, tags.seen))
    if watch.peak_kb > bound:
        problems.append(f"broker RSS {watch.peak_kb / 1024:.0f} MiB > bound {bound / 1024:.0f} MiB "
                        f"(baseline {baseline / 1024:.0f} MiB)")
    assert not problems, "; ".join(problems) + (
        f" [published {sum(p.sent for p in pubs):,}, acknowledged {len(acked):,}, refused "
        f"{sum(p.refused for p in pubs)}, peak RSS {watch.peak_kb / 1024:.0f} MiB, bound {bound / 1024:.0f} MiB, "
        f"subscriber's disconnects {[code for code, _ in sub.disconnects]}]")
    assert len(acked) == FANIN_PUBLISHERS * FANIN_COUNT


# --------------------------------------------------------------------------
# 2. a persistent v5 subscriber that acknowledges slowly


SLOW_COUNT = 5000
SLOW_RATE = 500.0
SLOW_RECEIVE_MAXIMUM = 100


class SlowAcker:
    """A persistent v5 paho subscriber (session expiry 3600, Receive
    Maximum 100, ``manual_ack``) that acknowledges at most ``rate`` messages
    per second, from its own thread.

    :ivar max_unacked: the most PUBLISH it held unacknowledged (the broker
        must keep it <= Receive Maximum).
    """

    def __init__(self, port: int, rate: float) -> None:
        self.rate = rate
        self.tags = Tags()
        self.owed: collections.deque = collections.deque()
        self.max_unacked = 0
        self.acks = 0
        self.disconnects: list[int] = []
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.stop = threading.Event()
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=f"slow-{uid()}",
                                  protocol=paho.MQTTv5, manual_ack=True, reconnect_on_failure=False)
        self.client.on_connect = lambda c, u, f, rc, p: self.connected.set()
        self.client.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.on_disconnect = lambda c, u, f, rc, p: self.disconnects.append(int(getattr(rc, "value", rc)))
        self.port = port
        self._acker = threading.Thread(target=self._ack_loop, name="acker", daemon=True)

    def _on_message(self, client, userdata, msg) -> None:
        self.tags.add(bytes(msg.payload))
        self.owed.append((msg.mid, msg.qos))
        self.max_unacked = max(self.max_unacked, len(self.owed))

    def _ack_loop(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(0.01):
            allowed = int((time.monotonic() - t0) * self.rate) - self.acks
            if allowed > self.rate / 10:  # no bursts after a quiet time
                t0 = time.monotonic() - (self.acks + self.rate / 10) / self.rate
                allowed = int(self.rate / 10)
            while allowed > 0 and self.owed:
                mid, qos = self.owed.popleft()
                self.client.ack(mid, qos)
                self.acks += 1
                allowed -= 1

    def start(self, topic_filter: str) -> None:
        self.client.connect(HOST, self.port, clean_start=True,
                            properties=props(PacketTypes.CONNECT, SessionExpiryInterval=3600,
                                             ReceiveMaximum=SLOW_RECEIVE_MAXIMUM))
        self.client.loop_start()
        assert self.connected.wait(10), "no CONNACK"
        self.client.subscribe(topic_filter, qos=1)
        assert self.subscribed.wait(10), "no SUBACK"
        self._acker.start()

    def close(self) -> None:
        self.stop.set()
        try:
            self.client.disconnect()
        except Exception:
            pass
        self.client.loop_stop()


def test_persistent_slow_reader_gets_every_acknowledged_message(broker_factory):
    """A persistent v5 subscriber with Receive Maximum 100 acknowledging
    ~500 messages/s while a publisher sends 5,000 QoS 1 messages as fast as
    they are acknowledged (5 × the in-memory queue of a persistent session):
    every acknowledged message is delivered."""
    broker = broker_factory(env=ENV)
    topic = f"fc/{uid()}"
    sub = SlowAcker(broker.port, SLOW_RATE)
    try:
        sub.start(f"{topic}/#")
        pub = RawPublisher(broker.port, 5, f"{topic}/t", 0, SLOW_COUNT, 64, window=100)
        run_publishers([pub], timeout=60)
        acked = acked_set([pub])
        # every acknowledged message, or nothing new for IDLE s (at 500/s that is 2,500 messages late)
        while not acked <= sub.tags.seen and time.monotonic() - sub.tags.last < IDLE:
            time.sleep(0.1)
    finally:
        sub.close()
    assert pub.error is None, pub.error
    detail = (f" [acknowledged {len(acked):,} of {pub.sent:,}, refused {pub.refused}, the subscriber's "
              f"acks {sub.acks:,}, most unacknowledged at once {sub.max_unacked} (Receive Maximum "
              f"{SLOW_RECEIVE_MAXIMUM}), duplicates {sub.tags.duplicates}, disconnects {sub.disconnects}]")
    assert acked <= sub.tags.seen, describe_loss("persistent subscriber", acked, sub.tags.seen) + detail
    assert sub.max_unacked <= SLOW_RECEIVE_MAXIMUM, detail
    assert len(acked) == SLOW_COUNT, detail


# --------------------------------------------------------------------------
# 3. a non-persistent subscriber that never reads


STUCK_COUNT = 3000
STUCK_PAYLOAD = 4096


class StuckSubscriber:
    """A raw socket with a small receive buffer that connects, subscribes at
    QoS 1 and reads nothing until :meth:`read_all`."""

    def __init__(self, port: int, level: int, topic_filter: str) -> None:
        self.level = level
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        self.sock.settimeout(10)
        self.sock.connect((HOST, port))
        self.decoder = Decoder(protocol_level=level, server_side=False)
        self.tags = Tags()
        self.disconnect_code: int | None = None
        self.closed = False
        self.sock.sendall(encode(Connect(client_id=f"stuck-{uid()}", protocol_level=level), level))
        self.sock.sendall(encode(Subscribe(1, [SubscriptionRequest(topic_filter, 1)]), level))
        got = []
        while not any(isinstance(p, Suback) for p in got):
            got += self.decoder.feed(self.sock.recv(4096))
        assert isinstance(got[0], Connack) and got[0].reason_code == 0, got
        self.pending = [p for p in got if isinstance(p, Publish)]

    def read_all(self, done) -> None:
        """Read (and acknowledge, as a client that woke up would) until the
        broker closes the connection, or ``done()``, or nothing came for
        :data:`IDLE` s."""
        self.sock.settimeout(IDLE)
        packets = self.pending
        while True:
            for p in packets:
                if isinstance(p, Publish):
                    self.tags.add(p.payload)
                    if p.qos == 1:
                        try:
                            self.sock.sendall(encode(Puback(p.packet_id), self.level))
                        except OSError:  # the broker closed the connection
                            self.closed = True
                            return
                elif isinstance(p, Disconnect):
                    self.disconnect_code = p.reason_code
            if done():
                return
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                return
            except OSError:  # reset
                data = b""
            if not data:
                self.closed = True
                return
            packets = self.decoder.feed(data)

    def close(self) -> None:
        self.sock.close()


def test_subscriber_that_never_reads_is_served_or_disconnected(broker_factory, mqtt_version):
    """A non-persistent QoS 1 subscriber that does not read while a publisher
    sends 3,000 messages of 4 KiB (far past its window, queue and socket
    buffers), then reads: it has every acknowledged message, or the broker
    disconnected it (v5: with 0x97 if it saw a DISCONNECT). A paho
    subscriber beside it gets every acknowledged message."""
    broker = broker_factory(env=ENV)
    topic = f"fc/{uid()}"
    stuck = StuckSubscriber(broker.port, mqtt_version, f"{topic}/#")
    good = PahoClient(broker.port, mqtt_version).connect_and_wait()
    try:
        assert good.subscribe(f"{topic}/#", 1) == [1]
        pub = RawPublisher(broker.port, mqtt_version, f"{topic}/t", 0, STUCK_COUNT, STUCK_PAYLOAD)
        good_tags = Tags()
        pub.start()
        while pub.is_alive():
            drain_paho(good, good_tags, lambda: not pub.is_alive())
            if time.monotonic() - good_tags.last > 60:
                break
        pub.join(1)
        acked = acked_set([pub])
        drain_paho(good, good_tags, lambda: acked <= good_tags.seen)
        stuck.read_all(lambda: acked <= stuck.tags.seen)
    finally:
        stuck.close()
        good.close()
    assert pub.error is None, pub.error
    assert not pub.is_alive(), f"the publisher is still held: {pub.sent:,} sent, {len(pub.acked):,} acknowledged"
    problems = []
    if not acked <= good_tags.seen:
        problems.append(describe_loss("the subscriber that reads", acked, good_tags.seen))
    if stuck.closed:
        if mqtt_version == 5 and stuck.disconnect_code is not None and stuck.disconnect_code != 0x97:
            problems.append(f"the stuck subscriber was disconnected with {stuck.disconnect_code:#x}, not 0x97")
    elif not acked <= stuck.tags.seen:
        problems.append(describe_loss("the stuck subscriber, still connected,", acked, stuck.tags.seen))
    assert not problems, "; ".join(problems) + (
        f" [published {pub.sent:,}, acknowledged {len(acked):,}, refused {pub.refused}; the stuck subscriber "
        f"{'was disconnected' if stuck.closed else 'is connected'} (DISCONNECT "
        f"{stuck.disconnect_code if stuck.disconnect_code is None else hex(stuck.disconnect_code)})]")
    assert len(acked) == STUCK_COUNT
