"""``mqtt.rate_limits`` and the session limits on a real ``twistd -n tbmq``
node with paho clients: the exact reason codes a client gets over a limit,
what its subscribers receive, and the counts in ``/metrics``."""

from __future__ import annotations

import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tbmq.mqtt import Puback, Pubcomp, Publish, Pubrec, Pubrel, ReasonCode
from tests.integration.conftest import _finish
from tests.integration.helpers import HOST, PahoClient, RawClient, uid, wait_for
from tests.integration.ops import start_ops_broker, tbmq_cli

pytestmark = pytest.mark.timeout(90)

#: per minute: nothing refills during a test
LIMITS_ENV = {
    "TBMQ_MQTT__RATE_LIMITS__INCOMING_PUBLISH__ENABLED": "true",
    "TBMQ_MQTT__RATE_LIMITS__INCOMING_PUBLISH__CLIENT_CONFIG": "3:60",
    "TBMQ_MQTT__RATE_LIMITS__OUTGOING_PUBLISH__ENABLED": "true",
    "TBMQ_MQTT__RATE_LIMITS__OUTGOING_PUBLISH__CLIENT_CONFIG": "4:60,1000:3600",
    "TBMQ_MQTT__RATE_LIMITS__DEVICE_PERSISTED_MESSAGES__ENABLED": "true",
    "TBMQ_MQTT__RATE_LIMITS__DEVICE_PERSISTED_MESSAGES__CONFIG": "2:60",
}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    broker = start_ops_broker(tmp_path_factory.mktemp("limits"), env=LIMITS_ENV)
    yield broker
    _finish(broker)


def dropped(node, reason: str) -> float:
    """``tbmq_messages_dropped_total{reason=...}`` of ``/metrics``."""
    return metric(node, "tbmq_messages_dropped_total", reason=reason)


def metric(node, name: str, **labels) -> float:
    """One sample of the node's ``/metrics``."""
    with urllib.request.urlopen(f"http://{HOST}:{node.http_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"no {name}{labels}")


class Acks:
    """The PUBACK / PUBREC reason code of each publish of a paho v5 client
    (paho calls ``on_publish`` with it)."""

    def __init__(self, client: PahoClient) -> None:
        self.codes: dict[int, int] = {}
        self.cond = threading.Condition()
        client.client.on_publish = self._on_publish

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        with self.cond:
            self.codes[mid] = reason_code.value if hasattr(reason_code, "value") else reason_code
            self.cond.notify_all()

    def wait(self, mids: list[int]) -> list[int]:
        with self.cond:
            assert self.cond.wait_for(lambda: all(m in self.codes for m in mids), timeout=10), \
                f"acks of {mids}: {self.codes}"
            return [self.codes[m] for m in mids]


def test_v5_incoming_over_limit_gets_0x97_and_is_not_routed(node, mqtt):
    topic = f"in/{uid()}"
    sub = mqtt.connect(5, port=node.port)
    sub.subscribe(topic, qos=1)
    pub = mqtt(5, port=node.port)
    acks = Acks(pub)
    pub.connect_and_wait()
    before = dropped(node, "incoming_rate_limited")
    mids = [pub.publish(topic, f"m{i}", qos=1, wait=False).mid for i in range(3)]
    assert acks.wait(mids) == [ReasonCode.SUCCESS] * 3
    over = [pub.publish(topic, "over1", qos=1, wait=False).mid,
            pub.publish(topic, "over2", qos=1, wait=False).mid]
    assert acks.wait(over) == [ReasonCode.QUOTA_EXCEEDED] * 2
    pub.publish(topic, "over0", qos=0)  # dropped, nothing to answer with
    assert [m.payload for m in sub.get_many(3)] == [b"m0", b"m1", b"m2"]
    wait_for(lambda: dropped(node, "incoming_rate_limited") - before == 3,
             what="3 refusals counted")
    sub.assert_empty()
    assert pub.client.is_connected()  # a v5 client stays connected
    # one line per limit per interval, the rest counted in the next one
    log = node.log()
    assert log.count("over rate_limits.incoming_publish") == 1, log[-3000:]


def test_v5_qos2_over_limit_gets_pubrec_0x97(node, raw, mqtt):
    """paho sends PUBREL even after a refusing PUBREC, so a raw client shows
    the PUBREC itself: the QoS 2 flow ends there [MQTT-4.3.3-9]."""
    topic = f"in2/{uid()}"
    sub = mqtt.connect(5, port=node.port)
    sub.subscribe(topic, qos=2)
    pub = raw(5, port=node.port)
    assert pub.connect().reason_code == ReasonCode.SUCCESS
    for pid in (1, 2, 3):
        pub.send(Publish(topic, b"ok", qos=1, packet_id=pid))
        assert pub.expect() == Puback(pid)
    pub.send(Publish(topic, b"over", qos=2, packet_id=4))
    assert pub.expect() == Pubrec(4, ReasonCode.QUOTA_EXCEEDED)
    pub.send(Pubrel(4))
    assert pub.expect() == Pubcomp(4, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)
    assert len(sub.get_many(3)) == 3
    pub.disconnect()
    sub.assert_empty()


def test_v311_incoming_over_limit_is_disconnected(node, raw, mqtt):
    """A raw client: paho writes from the caller's thread and reports the
    close that the over-limit PUBLISH causes as that publish's own failure
    when its network thread sees the close first."""
    topic = f"in3/{uid()}"
    sub = mqtt.connect(4, port=node.port)
    sub.subscribe(topic, qos=1)
    pub = raw(4, port=node.port)
    assert pub.connect().reason_code == 0
    before = dropped(node, "incoming_rate_limited")
    for pid in (1, 2, 3):
        pub.send(Publish(topic, f"m{pid - 1}".encode(), qos=1, packet_id=pid))
        assert pub.expect() == Puback(pid)
    pub.send(Publish(topic, b"over", qos=1, packet_id=4))
    # no negative PUBACK in 3.1.1 [MQTT-3.3.5-2]: the connection is closed
    assert pub.wait_closed() == []
    assert [m.payload for m in sub.get_many(3)] == [b"m0", b"m1", b"m2"]
    wait_for(lambda: dropped(node, "incoming_rate_limited") - before == 1,
             what="the refusal counted")
    sub.assert_empty()


@pytest.mark.parametrize("version", [4, 5])
def test_outgoing_qos0_over_limit_dropped_for_non_persistent(node, mqtt, version):
    topic = f"out/{uid()}"
    sub = mqtt.connect(version, port=node.port)
    sub.subscribe(topic, qos=0)
    persistent = mqtt.connect(5, port=node.port, clean_start=False, session_expiry=60)
    persistent.subscribe(topic, qos=0)
    before = dropped(node, "outgoing_rate_limited")
    # 3 publishers of 2 messages (under their incoming limit of 3)
    publishers = [mqtt.connect(5, port=node.port) for _ in range(3)]
    for n, pub in enumerate(publishers):
        for i in range(2):
            pub.publish(topic, f"p{n}-{i}", qos=1)
    # the non-persistent subscriber gets 4 of the 6, the persistent one all
    assert len(persistent.get_many(6)) == 6
    assert len(sub.get_many(4)) == 4
    wait_for(lambda: dropped(node, "outgoing_rate_limited") - before == 2,
             what="2 deliveries dropped")
    sub.assert_empty()
    persistent.disconnect()


def test_device_persisted_over_limit_not_stored(node, mqtt):
    topic = f"dev/{uid()}"
    device = mqtt(5, port=node.port)
    device.connect_and_wait(clean_start=True, session_expiry=300)
    device.subscribe(topic, qos=1)
    device.disconnect()
    before = dropped(node, "device_persisted_rate_limited")
    pub = mqtt.connect(5, port=node.port)
    for i in range(3):
        pub.publish(topic, f"d{i}", qos=1)
    wait_for(lambda: dropped(node, "device_persisted_rate_limited") - before == 1,
             what="the third message not stored")
    back = PahoClient(node.port, 5, device.client_id)
    mqtt.clients.append(back)
    back.connect_and_wait(clean_start=False, session_expiry=300)
    assert [m.payload for m in back.get_many(2)] == [b"d0", b"d1"]
    wait_for(lambda: "over rate_limits.device_persisted_messages" in node.log(),
             what="the log line")
    back.assert_empty()


APP_USER, APP_PASSWORD = "app-user", "app-secret"


@pytest.fixture
def session_node(tmp_path):
    """sessions_limit 3, application_clients_limit 1, and an APPLICATION
    user."""
    workdir = tmp_path / "sessions"
    workdir.mkdir()
    tbmq_cli(workdir / "data", "credentials", "add", "--type", "basic", "--name", "app",
             "--client-type", "APPLICATION", "--username", APP_USER, "--password",
             APP_PASSWORD, "--rounds", "4")
    broker = start_ops_broker(workdir, env={"TBMQ_MQTT__SESSIONS_LIMIT": "3",
                                            "TBMQ_MQTT__APPLICATION_CLIENTS_LIMIT": "1"})
    yield broker
    _finish(broker)


def connect(port: int, version: int, client_id: str | None = None, app: bool = False,
            persistent: bool = False, expect_rc: int | None = 0) -> PahoClient:
    c = PahoClient(port, version, client_id, clean_session=not persistent)
    if app:
        c.client.username_pw_set(APP_USER, APP_PASSWORD)
    if version == 5:
        c.connect_and_wait(clean_start=not persistent, expect_rc=expect_rc,
                           session_expiry=300 if persistent else None)
    else:
        c.connect_and_wait(expect_rc=expect_rc)
    return c


def v3_connack(port: int, client_id: str, app: bool = False) -> int:
    """The CONNACK return code a 3.1.1 client gets (paho shows return code
    3 as 0x88: a raw client reads the byte itself)."""
    c = RawClient(port, 4)
    try:
        credentials = {"username": APP_USER, "password": APP_PASSWORD.encode()} if app else {}
        ack = c.connect(client_id, clean_start=not app, **credentials)
        return ack.reason_code
    finally:
        c.close()


def test_session_limits_on_one_node(session_node):
    port = session_node.port
    clients = []
    try:
        app = connect(port, 5, f"app-{uid()}", app=True, persistent=True)
        clients.append(app)
        # a second persistent APPLICATION session: over application_clients_limit
        clients.append(connect(port, 5, f"app2-{uid()}", app=True, persistent=True,
                               expect_rc=ReasonCode.QUOTA_EXCEEDED))
        assert v3_connack(port, f"app3-{uid()}", app=True) == 3  # v3: Server unavailable
        # the APPLICATION client's own session comes back
        app.disconnect()
        app = connect(port, 5, app.client_id, app=True, persistent=True)
        clients.append(app)
        assert app.session_present
        devices = [connect(port, v, f"dev-{uid()}") for v in (4, 5)]
        clients.extend(devices)
        # 3 sessions: one more is refused, v5 and v3.1.1
        clients.append(connect(port, 5, f"dev-{uid()}", expect_rc=ReasonCode.QUOTA_EXCEEDED))
        assert v3_connack(port, f"dev-{uid()}") == 3
        # a client that has a session is never refused
        app.disconnect()
        app = connect(port, 5, app.client_id, app=True, persistent=True)
        clients.append(app)
        # a clean session that ends makes room
        devices[0].disconnect()
        wait_for(lambda: (lambda c: clients.append(c) or c.connack_code == 0)(
            connect(port, 5, f"dev-{uid()}", expect_rc=None)), what="a place freed")
        assert metric(session_node, "tbmq_sessions_refused_total",
                      limit="application_clients_limit") == 2
        assert metric(session_node, "tbmq_sessions_refused_total",
                      limit="sessions_limit") >= 2
        log = session_node.log()
        assert log.count("over mqtt.application_clients_limit") == 1, log[-3000:]
    finally:
        for c in clients:
            c.close()
