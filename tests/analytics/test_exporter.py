"""The event log exporter (tbmq/events.py): off unless the config says so,
records of every kind, rotation by size and time, gzip, crash leftovers,
the bounded buffer, the bus sink, and the config section."""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import os
import threading
import time
from types import SimpleNamespace

import pytest
from twisted.internet.task import Clock

from tbmq.broker.broker import Broker
from tbmq.config import load_config
from tbmq.errors import ConfigError
from tbmq.events import IN_PROGRESS_SUFFIX, EventExporter, EventsPlugin, FileSink, message_id
from tbmq.model import ClientType, Message, SubscriptionOptions
from tbmq.plugins import make_plugin_manager


def make_broker(tmp_path, **events):
    config = load_config(environ={}, overrides={
        "data_dir": str(tmp_path / "data"), "node": {"service_id": "node-a"},
        "storage": {"backend": "memory"}, "auth": {"credentials": "memory"},
        "events": events})
    pm = make_plugin_manager(config, load_entry_points=False)
    launcher = EventsPlugin()
    pm.register(launcher, name="events")
    clock = Clock()
    clock.advance(1700000000.0)
    broker = Broker(config, pm, clock=clock)
    started = broker.start()
    assert started.called, "the memory backends start at once"
    return broker, clock, launcher


def stop(broker, clock):
    broker.stop()
    for _ in range(5):
        clock.advance(0.1)


def session(client_id, client_type=ClientType.DEVICE, connected_at=None):
    return SimpleNamespace(client_id=client_id, client_type=client_type, persistent=False,
                           expiry_interval=0, protocol_level=5, connected_at=connected_at)


def address(host="127.0.0.1", port=50000):
    return SimpleNamespace(host=host, port=port)


def read_records(directory):
    records = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            records += [json.loads(line) for line in f]
    return records


def emit_one_of_each(broker, clock):
    now = clock.seconds()
    dev = session("dev-1", connected_at=now - 2.5)
    app = session("app-1", ClientType.APPLICATION, connected_at=now - 10)
    connect = SimpleNamespace(clean_start=True, username="u", client_id="dev-1")
    broker.hooks.client_connected(dev, connect, address())
    broker.hooks.client_subscribed(app, "a/#", SubscriptionOptions(qos=1), 1)
    broker.hooks.client_subscribed(app, "bad/#/x", None, 0x8F)
    broker.hooks.client_unsubscribed(app, "a/#", 0)
    msg = Message("a/b", b"12345", qos=1, retain=True, publisher="dev-1", received_at=now - 0.004)
    broker.hooks.message_published(dev, msg)
    broker.hooks.message_delivered(app, msg, 1)
    broker.hooks.message_dropped(app, msg, "queue_full")
    broker.hooks.message_dropped(app, None, "session_ended")
    will = Message("will/dev-1", b"bye", publisher="dev-1", received_at=now)
    broker.hooks.message_published(None, will)
    broker.hooks.authentication_failed(
        SimpleNamespace(client_id="intruder", username="root"), address("203.0.113.9", 4444),
        0x86)
    broker.hooks.client_disconnected(dev, None, True)
    return msg


def test_off_by_default_and_costs_nothing(tmp_path):
    broker, clock, launcher = make_broker(tmp_path)
    assert launcher.exporters == {}
    hook = broker.plugins.hook
    for name in ("tbmq_message_published", "tbmq_message_delivered", "tbmq_client_connected"):
        assert getattr(hook, name).get_hookimpls() == []
    stop(broker, clock)
    assert not os.path.exists(tmp_path / "data" / "events")


def test_every_kind_of_record(tmp_path):
    broker, clock, launcher = make_broker(tmp_path, enabled=True)
    exporter = launcher.exporters[broker.view]
    msg = emit_one_of_each(broker, clock)
    stop(broker, clock)
    assert exporter.closed and exporter.lost == 0 and exporter.exported == 11
    directory = tmp_path / "data" / "events"
    names = os.listdir(directory)
    assert len(names) == 1 and names[0].startswith("events-node-a-") and names[0].endswith(".jsonl.gz")
    records = read_records(directory)
    ts = 1700000000000
    mid = message_id("dev-1", "a/b", msg.received_at)
    common = {"v": 1, "ts": ts, "node": "node-a"}
    assert records == [
        {**common, "type": "connect", "client_id": "dev-1", "client_type": "DEVICE",
         "protocol_version": 5, "address": "127.0.0.1", "port": 50000, "clean_start": True,
         "session_expiry": 0, "persistent": False, "username": "u"},
        {**common, "type": "subscribe", "client_id": "app-1", "client_type": "APPLICATION",
         "topic_filter": "a/#", "qos": 1, "reason_code": 1},
        {**common, "type": "subscribe", "client_id": "app-1", "client_type": "APPLICATION",
         "topic_filter": "bad/#/x", "reason_code": 0x8F},
        {**common, "type": "unsubscribe", "client_id": "app-1", "client_type": "APPLICATION",
         "topic_filter": "a/#", "reason_code": 0},
        {**common, "type": "publish", "client_id": "dev-1", "client_type": "DEVICE",
         "msg_id": mid, "topic": "a/b", "qos": 1, "retain": True, "bytes": 5, "will": False},
        {**common, "type": "deliver", "client_id": "app-1", "client_type": "APPLICATION",
         "msg_id": mid, "topic": "a/b", "qos": 1, "bytes": 5, "retain": True,
         "publisher": "dev-1", "latency_ms": 4.0},
        {**common, "type": "drop", "client_id": "app-1", "client_type": "APPLICATION",
         "reason": "queue_full", "msg_id": mid, "topic": "a/b", "qos": 1, "bytes": 5,
         "publisher": "dev-1"},
        {**common, "type": "drop", "client_id": "app-1", "client_type": "APPLICATION",
         "reason": "session_ended"},
        {**common, "type": "publish", "client_id": "dev-1",
         "msg_id": message_id("dev-1", "will/dev-1", ts / 1000), "topic": "will/dev-1",
         "qos": 0, "retain": False, "bytes": 3, "will": True},
        {**common, "type": "auth_fail", "client_id": "intruder", "username": "root",
         "address": "203.0.113.9", "port": 4444, "reason_code": 0x86},
        {**common, "type": "disconnect", "client_id": "dev-1", "client_type": "DEVICE",
         "duration_ms": 2500, "will": True},
    ]


def test_message_id_is_stable():
    a = message_id("p", "t/1", 1700000000.123456)
    assert a == message_id("p", "t/1", 1700000000.123456)
    assert len(a) == 16 and int(a, 16) >= 0
    assert a != message_id("p", "t/1", 1700000000.123457)
    assert a != message_id("q", "t/1", 1700000000.123456)


def test_rotation_by_size_plain_files(tmp_path):
    broker, clock, launcher = make_broker(tmp_path, enabled=True, max_file_bytes=2048,
                                          compress=False, flush_interval=0.01)
    exporter = launcher.exporters[broker.view]
    dev = session("dev-1")
    for i in range(300):
        broker.hooks.message_published(dev, Message(f"t/{i}", b"x" * i, publisher="dev-1",
                                                    received_at=clock.seconds()))
        if i % 30 == 29:  # let the writer write this batch (> 2048 bytes: one file each)
            deadline = time.monotonic() + 10
            while exporter.exported < i + 1 and time.monotonic() < deadline:
                time.sleep(0.005)
    stop(broker, clock)
    names = sorted(os.listdir(tmp_path / "data" / "events"))
    assert len(names) >= 5 and all(n.endswith(".jsonl") and not n.startswith(".") for n in names)
    records = read_records(tmp_path / "data" / "events")
    assert [r["topic"] for r in records] == [f"t/{i}" for i in range(300)]


def test_file_sink_rotates_by_age_and_recovers_leftovers(tmp_path):
    now = [1000.0]
    sink = FileSink(str(tmp_path), "node/1", 1 << 20, 60.0, True, now=lambda: now[0])
    sink.open()
    sink.write(['{"a":1}'])
    current = os.listdir(tmp_path)
    # the file being written is visible, with the in-progress suffix
    assert len(current) == 1 and current[0].startswith("events-node_1-")
    assert current[0].endswith(".jsonl" + IN_PROGRESS_SUFFIX)
    assert (tmp_path / current[0]).read_text() == '{"a":1}\n'
    now[0] += 59
    sink.tick()
    assert os.listdir(tmp_path) == current
    now[0] += 1
    sink.tick()
    sink.write(['{"a":2}'])
    sink.close()
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 2 and all(n.endswith(".jsonl.gz") for n in names)
    assert names[0] == current[0][:-len(IN_PROGRESS_SUFFIX)] + ".gz"
    assert read_records(tmp_path) == [{"a": 1}, {"a": 2}]
    # a crash leaves the file in progress (and maybe a partial .gz); an
    # earlier version left a hidden one
    (tmp_path / "events-node_1-20240101T000000-000000-0001.jsonl.inprogress").write_text(
        '{"a":3}\n{"tru')
    (tmp_path / ".events-node_1-20240101T000000-000000-0001.jsonl.gz.tmp").write_bytes(b"\x1f")
    (tmp_path / ".events-node_1-20231231T000000-000000-0001.jsonl").write_text('{"a":0}\n')
    (tmp_path / "events-other-20240101T000000-000000-0001.jsonl.inprogress").write_text("{}\n")
    sink = FileSink(str(tmp_path), "node/1", 1 << 20, 60.0, True, now=lambda: now[0])
    sink.open()
    names = sorted(os.listdir(tmp_path))
    assert "events-node_1-20240101T000000-000000-0001.jsonl.gz" in names
    assert "events-node_1-20231231T000000-000000-0001.jsonl.gz" in names
    assert "events-other-20240101T000000-000000-0001.jsonl.inprogress" in names  # another node's
    assert not any(n.endswith(".tmp") or n.startswith(".") for n in names)
    assert len([n for n in names if n.endswith(IN_PROGRESS_SUFFIX)]) == 1


def test_bounded_buffer_drops_and_counts(tmp_path):
    broker, clock, _ = make_broker(tmp_path)
    config = load_config(environ={}, overrides={"events": {"enabled": True, "buffer_size": 10}})
    fake = SimpleNamespace(config=config, clock=clock, service_id="n", bus=broker.bus,
                           bus_topic=lambda name: name)
    exporter = EventExporter(fake)  # not started: nothing drains the buffer
    dev = session("d")
    started = time.monotonic()
    for _ in range(15):
        exporter.tbmq_client_unsubscribed(dev, "x", 0)
    assert time.monotonic() - started < 1.0
    assert exporter.lost == 5 and len(exporter._buf) == 10


def test_bus_sink(tmp_path):
    broker, clock, _ = make_broker(tmp_path)
    config = load_config(environ={}, overrides={"events": {"enabled": True, "sink": "bus"}})
    fake = SimpleNamespace(config=config, clock=clock, service_id="node-b", bus=broker.bus,
                           bus_topic=lambda name: name)
    received = []
    broker.bus.subscribe("tbmq.events", "test",
                         lambda record: received.append((record.key, record.value)))
    calls = []
    reactor_thread = threading.current_thread()
    exporter = EventExporter(fake, call_from_thread=calls.append)
    exporter.start()
    dev = session("dev-9")
    exporter.tbmq_message_published(dev, Message("x/y", b"abc", publisher="dev-9",
                                                 received_at=clock.seconds()))
    exporter.tbmq_authentication_failed(SimpleNamespace(client_id="", username=None),
                                        address(), 0x87)
    exporter.close()  # drains, then publishes what is pending in this ("reactor") thread
    assert threading.current_thread() is reactor_thread
    assert [key for key, _ in received] == ["dev-9", "node-b"]
    records = [json.loads(value.decode("utf-8")) for _, value in received]
    assert records[0]["type"] == "publish" and records[0]["topic"] == "x/y"
    assert records[1] == {"v": 1, "type": "auth_fail", "ts": 1700000000000, "node": "node-b",
                          "client_id": "", "address": "127.0.0.1", "port": 50000,
                          "reason_code": 0x87}
    for call in calls:  # the reactor would run these later: nothing left to publish
        call()
    assert len(received) == 2


def test_events_config():
    config = load_config(environ={"TBMQ_EVENTS__ENABLED": "true", "TBMQ_EVENTS__SINK": "bus"})
    assert config.events.enabled and config.events.sink == "bus"
    assert load_config(environ={}).events.enabled is False
    for key, value, message in (
            ("sink", "kafka", "events.sink: must be one of file, bus"),
            ("max_file_bytes", 10, "events.max_file_bytes: must be >= 1024"),
            ("rotate_interval", 0, "events.rotate_interval: must be > 0"),
            ("buffer_size", 0, "events.buffer_size: must be >= 1"),
            ("enabled", "yes", "events.enabled: expected true or false"),
            ("directory", "", "events.directory: must not be empty"),
            ("colour", 1, "events.colour: unknown key")):
        with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
            load_config(environ={}, overrides={"events": {key: value}})


def test_default_file_documents_the_events_section():
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "etc", "tbmq.yml")).read()
    section = text[text.index("\nevents:"):]
    for name in ("enabled", "sink", "directory", "max_file_bytes", "rotate_interval",
                 "compress", "buffer_size", "flush_interval", "bus_topic"):
        assert f"  {name}:" in section, name


def test_registered_through_the_entry_point():
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="tbmq")}
    assert names.get("events") == "tbmq.events:plugin"
    config = load_config(environ={})
    pm = make_plugin_manager(config)
    assert pm.get_plugin("events") is not None
