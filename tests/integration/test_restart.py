"""Durability across a broker restart (SIGTERM, then the same data dir): what
was acknowledged is not lost."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tbmq.backends.sqlite import FILE_NAME
from tbmq.mqtt import Puback, Pubcomp, Pubrec, Pubrel, Suback, Subscribe, SubscriptionRequest
from tests.helpers import legacy_file
from tests.integration.helpers import TIMEOUT, uid

pytestmark = pytest.mark.timeout(90)

N = 200


def test_offline_messages_and_retained_survive_restart(broker_factory, mqtt):
    broker = broker_factory()
    port = broker.port
    cid = f"durable-{uid()}"
    topic = f"{uid()}/durable"
    retained_topic = f"{uid()}/retained"

    sub = mqtt(4, cid, clean_session=False, port=port).connect_and_wait()
    assert sub.subscribe(topic, 1) == [1]
    sub.disconnect()

    pub = mqtt.connect(4, port=port)
    infos = [pub.publish(topic, f"m{i:03d}", 1, wait=False) for i in range(N)]
    for i, info in enumerate(infos):
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"message {i} not PUBACKed"
    pub.publish(retained_topic, b"still here", 1, retain=True)
    pub.disconnect()

    rc = broker.stop()
    # twistd re-raises the signal that stopped it: -SIGTERM is a clean stop
    assert rc in (0, -signal.SIGTERM), f"broker exited with {rc} on SIGTERM:\n{broker.log()}"
    assert "Traceback" not in broker.log()
    broker.start()
    assert broker.port == port

    sub2 = mqtt(4, cid, clean_session=False, port=port).connect_and_wait()
    assert sub2.session_present is True
    got = [m.payload.decode() for m in sub2.get_many(N)]
    expected = [f"m{i:03d}" for i in range(N)]
    missing = sorted(set(expected) - set(got))
    assert not missing, f"{len(missing)} messages lost: {missing[:10]}..."
    assert got == expected, "messages out of order"

    # the subscription survived: live messages still arrive
    pub2 = mqtt.connect(4, port=port)
    pub2.publish(topic, b"after restart", 1)
    assert sub2.get().payload == b"after restart"

    # and the retained message
    r = mqtt.connect(5, port=port)
    r.subscribe(retained_topic, 1)
    m = r.get()
    assert (m.topic, m.payload, m.retain) == (retained_topic, b"still here", True)


def test_v5_session_survives_restart(broker_factory, mqtt):
    """A v5 session (expiry 300 s) keeps its subscription and queued QoS 1/2
    messages across a restart."""
    broker = broker_factory()
    port = broker.port
    cid = f"durable5-{uid()}"
    topic = f"{uid()}/durable5"
    sub = mqtt(5, cid, port=port).connect_and_wait(clean_start=True, session_expiry=300)
    sub.subscribe(topic, 2, sub_id=9)
    sub.disconnect()
    pub = mqtt.connect(5, port=port)
    pub.publish(topic, b"one", 1)
    pub.publish(topic, b"two", 2)
    pub.disconnect()

    broker.restart()

    sub2 = mqtt(5, cid, port=port).connect_and_wait(clean_start=False, session_expiry=300)
    assert sub2.session_present is True
    got = sub2.get_many(2)
    assert [(m.payload, m.qos) for m in got] == [(b"one", 1), (b"two", 2)]
    assert all(m.prop("SubscriptionIdentifier") in ([9], 9) for m in got)


def test_an_older_data_directory_keeps_its_sessions(broker_factory, mqtt):
    """A data directory of a tbmq that kept its sessions in tables of their
    own (schema 2): they move to the topic log when the broker starts, and
    a client resumes its session and subscription."""
    broker = broker_factory()
    port = broker.port
    broker.stop()
    cid = f"older-{uid()}"
    topic = f"{uid()}/older"
    for name in os.listdir(broker.data_dir):
        if name.startswith(FILE_NAME):  # the file, its WAL and shared memory
            os.remove(broker.data_dir / name)
    legacy_file(str(broker.data_dir / FILE_NAME),
                sessions=[(cid, 4, 0xFFFFFFFF, "DEVICE", time.time() - 60)],
                subscriptions=[(cid, topic, 1, 0, 0, 0, None)])
    broker.start()
    sub = mqtt(4, cid, clean_session=False, port=port).connect_and_wait()
    assert sub.session_present is True
    pub = mqtt.connect(4, port=port)
    pub.publish(topic, b"kept", 1)
    assert sub.get().payload == b"kept"
    assert "Traceback" not in broker.log()


def test_non_persistent_state_is_gone_after_restart(broker_factory, mqtt):
    broker = broker_factory()
    port = broker.port
    cid = f"volatile-{uid()}"
    s = mqtt.connect(4, cid, port=port)
    s.subscribe(f"{uid()}/x", 1)
    s.disconnect()
    broker.restart()
    s2 = mqtt(4, cid, clean_session=False, port=port).connect_and_wait()
    assert s2.session_present is False


def test_unacknowledged_deliveries_resent_after_restart(broker_factory, mqtt, raw):
    """QoS 1/2 messages sent to a subscriber that never acknowledged them are
    resent with DUP after a restart, and a PUBREC'd QoS 2 one gets its PUBREL
    resent, in the original order [MQTT-4.4.0-1]."""
    broker = broker_factory()
    port = broker.port
    cid = f"inflight-{uid()}"
    topic = f"{uid()}/inflight"
    c = raw(4, port=port)
    assert c.connect(cid, clean_start=False).reason_code == 0
    c.send(Subscribe(1, [SubscriptionRequest(topic, 2)]))
    assert isinstance(c.expect(), Suback)
    pub = mqtt.connect(4, port=port)
    for i in range(5):
        pub.publish(topic, f"n{i}", 1)
    pub.publish(topic, b"released", 2)
    pub.publish(topic, b"unreceived", 2)
    first = [c.expect() for _ in range(7)]
    assert [(p.payload, p.qos, p.dup) for p in first] == (
        [(f"n{i}".encode(), 1, False) for i in range(5)]
        + [(b"released", 2, False), (b"unreceived", 2, False)])
    released = first[5].packet_id
    c.send(Pubrec(released))
    assert c.expect() == Pubrel(released)
    c.close()  # nothing else acknowledged

    broker.restart()

    c2 = raw(4, port=port)
    ack = c2.connect(cid, clean_start=False)
    assert (ack.reason_code, ack.session_present) == (0, True)
    again = [c2.expect() for _ in range(7)]
    assert again[5] == Pubrel(released)
    publishes = again[:5] + again[6:]
    assert [(p.payload, p.qos, p.dup) for p in publishes] == (
        [(f"n{i}".encode(), 1, True) for i in range(5)] + [(b"unreceived", 2, True)])
    assert [p.packet_id for p in publishes] == [p.packet_id for p in first[:5] + first[6:]]
    for p in publishes[:5]:
        c2.send(Puback(p.packet_id))
    c2.send(Pubcomp(released))
    c2.send(Pubrec(publishes[5].packet_id))
    assert c2.expect() == Pubrel(publishes[5].packet_id)
    c2.send(Pubcomp(publishes[5].packet_id))
    c2.disconnect()

    # all done: a third connection gets nothing resent
    c3 = raw(4, port=port)
    assert c3.connect(cid, clean_start=False).session_present
    mqtt.connect(4, port=port).publish(topic, b"marker", 1)
    p = c3.expect()
    assert (p.payload, p.dup) == (b"marker", False)
    c3.send(Puback(p.packet_id))
    c3.disconnect()


def test_cleared_retained_and_shared_subscription_after_restart(broker_factory, mqtt):
    """A retained message cleared before the restart stays cleared; a
    persistent member of a shared subscription still gets its messages."""
    broker = broker_factory()
    port = broker.port
    p = uid()
    pub = mqtt.connect(4, port=port)
    pub.publish(f"{p}/gone", b"old", 1, retain=True)
    pub.publish(f"{p}/gone", b"", 1, retain=True)
    pub.publish(f"{p}/kept", b"v1", 1, retain=True)
    pub.publish(f"{p}/kept", b"v2", 1, retain=True)
    cid = f"sh-{uid()}"
    member = mqtt(5, cid, port=port).connect_and_wait(clean_start=True, session_expiry=300)
    member.subscribe(f"$share/g/{p}/shared", 1)
    member.disconnect()
    pub.disconnect()

    broker.restart()

    s = mqtt.connect(4, port=port)
    s.subscribe(f"{p}/#", 1)
    m = s.get()
    assert (m.topic, m.payload, m.retain) == (f"{p}/kept", b"v2", True)
    pub2 = mqtt.connect(4, port=port)
    pub2.publish(f"{p}/marker", b"marker", 1)
    assert s.get().topic == f"{p}/marker", "the cleared retained message came back"

    member2 = mqtt(5, cid, port=port).connect_and_wait(clean_start=False, session_expiry=300)
    assert member2.session_present
    pub2.publish(f"{p}/shared", b"to the group", 1)
    assert member2.get().payload == b"to the group"


def test_memory_backend_from_config_file(broker_factory, mqtt, tmp_path):
    """``--config`` with ``storage.backend: memory``: persistent sessions work
    while the process lives and are gone after a restart."""
    config = tmp_path / "tbmq.yml"
    config.write_text("storage:\n  backend: memory\nmqtt:\n  max_queued_messages: 100\n")
    broker = broker_factory(config=config)
    port = broker.port
    cid = f"mem-{uid()}"
    topic = f"{uid()}/mem"
    s = mqtt(4, cid, clean_session=False, port=port).connect_and_wait()
    s.subscribe(topic, 1)
    s.disconnect()
    mqtt.connect(4, port=port).publish(topic, b"queued", 1)
    s2 = mqtt(4, cid, clean_session=False, port=port).connect_and_wait()
    assert s2.session_present is True
    assert s2.get().payload == b"queued"
    s2.disconnect()

    broker.restart()
    s3 = mqtt(4, cid, clean_session=False, port=port).connect_and_wait()
    assert s3.session_present is False
