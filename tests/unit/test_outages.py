"""What a node answers while its bus refuses work (Kafka unreachable): the
publisher is never acknowledged for a message the bus did not take, v5
clients hear why (PUBACK / PUBREC 0x83, CONNACK 0x88), and the node goes on
by itself once the bus takes records again."""

from __future__ import annotations

from twisted.internet import defer, task
from twisted.python.failure import Failure

from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.backends.memory import MemoryDeviceMessageStore
from tbmq.backends.memory_credentials import MemoryCredentialStore
from tbmq.broker.broker import Broker
from tbmq.errors import BackendError, BusPublishError
from tbmq.mqtt import Property, Puback, Publish, Pubrec, Subscribe, SubscriptionRequest
from tests.helpers import Harness


class FlakyBus(InProcessBus):
    """The in-process bus, except that while :attr:`down` every publish
    fails as a Kafka publish does when no broker answers."""

    down = False

    def publish(self, topic, key, value, headers=(), done=None):
        if self.down:
            error = BusPublishError(f"{topic}: no broker answered")
            if done is None:
                return defer.fail(error)
            done(Failure(error))
            return None
        return super().publish(topic, key, value, headers, done)

    def acknowledging(self):
        """As the Kafka bus: not while no broker answers (so no connect is
        decided without a publish)."""
        return not self.down


def harness():
    clock = task.Clock()
    clock.advance(1_700_000_000)
    bus = FlakyBus(clock=clock)
    return Harness(clock=clock, bus=bus), bus


def test_v5_publishers_get_0x83_while_the_bus_refuses_and_0x00_after():
    h, bus = harness()
    sub = h.client("sub", level=5)
    sub.send(Subscribe(1, [SubscriptionRequest("t/#", 1)]))
    sub.received()
    pub = h.client("pub", level=5)
    bus.down = True
    pub.send(Publish("t/1", b"a", qos=1, packet_id=1), Publish("t/2", b"b", qos=2, packet_id=2))
    assert pub.received() == [Puback(1, 0x83), Pubrec(2, 0x83)]
    assert not pub.closed
    assert h.broker.dropped.get("bus_refused") == 2
    assert sub.received() == []
    bus.down = False
    pub.send(Publish("t/3", b"c", qos=1, packet_id=3))
    assert pub.received() == [Puback(3)]
    assert [m.payload for m in sub.received()] == [b"c"]


def test_a_v3_publisher_is_closed_unacknowledged_so_it_sends_again():
    h, bus = harness()
    pub = h.client("pub", level=4)
    bus.down = True
    pub.send(Publish("t/1", b"a", qos=1, packet_id=1))
    assert pub.received() == [] and pub.closed


def test_a_connect_while_the_bus_refuses_gets_connack_0x88_then_succeeds():
    h, bus = harness()
    bus.down = True
    refused = h.client("c", level=5)
    assert refused.connack.reason_code == 0x88 and refused.closed
    v3 = h.client("c3", level=4)
    assert v3.connack.reason_code == 0x03 and v3.closed
    bus.down = False
    assert h.client("c", level=5).connack.reason_code == 0


class FlakyStore(MemoryDeviceMessageStore):
    """The memory device store, except that while :attr:`down` every add
    fails as a Redis add does when Redis is gone."""

    down = False

    def add(self, client_id, deliveries):
        if self.down:
            return defer.fail(BackendError("redis: connection refused"))
        return super().add(client_id, deliveries)


def test_a_device_store_outage_holds_persistent_messages_until_it_is_back():
    clock = task.Clock()
    clock.advance(1_700_000_000)
    store = FlakyStore()
    h = Harness(clock=clock, device_store=store)
    expiry = {Property.SESSION_EXPIRY_INTERVAL: 300}
    dev = h.client("dev", level=5, clean_start=False, properties=expiry)
    dev.send(Subscribe(1, [SubscriptionRequest("cmd/#", 1)]))
    dev.received()
    dev.lose()
    pub = h.client("pub", level=5)
    store.down = True
    pub.send(Publish("cmd/1", b"a", qos=1, packet_id=1))
    assert pub.received() == []  # held, not refused, while the store retries
    assert h.broker.persisted_writer.consumer.paused
    clock.advance(2)
    store.down = False
    clock.advance(5)
    assert pub.received() == [Puback(1)]
    assert not h.broker.persisted_writer.consumer.paused
    again = h.client("dev", level=5, clean_start=False, properties=expiry)
    got = again.pending + again.received()
    assert [m.payload for m in got] == [b"a"]


class UnreachableCredentials(MemoryCredentialStore):
    """A credential store whose server is gone (PostgreSQL down)."""

    down = False

    def find(self, credentials_type, credentials_id):
        if self.down:
            return defer.fail(BackendError("postgres: connection refused"))
        return super().find(credentials_type, credentials_id)

    def changed_since(self, version):
        if self.down:
            return defer.fail(BackendError("postgres: connection refused"))
        return super().changed_since(version)

    def unchanged_since(self, version):
        return False  # as a remote store: it cannot tell without asking


def test_a_connect_while_the_credential_store_is_out_gets_0x88_then_succeeds():
    store = UnreachableCredentials()
    h = Harness(entry_points=True, credential_store=store)
    store.down = True
    refused = h.client("c", level=5, username="u", password=b"p")
    assert refused.connack.reason_code == 0x88 and refused.closed
    v3 = h.client("c3", level=4, username="u", password=b"p")
    assert v3.connack.reason_code == 0x03
    store.down = False
    assert h.client("c", level=5, username="u", password=b"p").connack.reason_code == 0


def test_a_connect_nobody_decides_gets_connack_0x88_before_the_connect_timeout():
    """The member deciding for the client id is gone and its partition has
    not moved yet: the client hears 0x88 Server unavailable and retries,
    rather than being closed in silence by the connect timeout."""
    h, bus = harness()
    deciding = h.broker.events.consumers[0]
    deciding.pause()
    waiting = h.client("c", level=5)
    assert waiting.connack is None and not waiting.closed
    answer = h.config.node.connect_answer_timeout
    assert answer == 2.5 < Broker.CONNECT_ANSWER_SHARE * h.config.mqtt.connect_timeout
    h.clock.advance(answer - 0.01)
    assert waiting.connack is None and not waiting.closed
    h.clock.advance(0.01)  # within 3 s of the connect, whatever the connect timeout
    got = waiting.received()
    assert got[0].reason_code == 0x88 and waiting.closed
    deciding.resume()
    assert h.client("c", level=5).connack.reason_code == 0
