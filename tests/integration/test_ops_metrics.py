"""``/metrics`` scraped while real clients publish, parsed with
prometheus-client's parser and checked against what the clients sent; the
``$SYS/broker`` topics; authentication failures counted."""

from __future__ import annotations

import socket
import threading

from tbmq.auth import AUTH_FAILURE_CODES
from tbmq.broker.hooks import DROP_REASONS
from tbmq.mqtt import Connack, Connect, Disconnect, Publish, Suback, Subscribe
from tbmq.mqtt.codec import Decoder, encode
from tbmq.mqtt.packets import SubscriptionRequest
from tests.integration.conftest import _finish
from tests.integration.helpers import HOST, PahoClient, uid, wait_for
from tests.integration.ops import Http, USERS, ops_broker, scrape, start_ops_broker  # noqa: F401
from tests.integration.ops import value

COUNTS = {0: 300, 1: 150, 2: 60}
PAYLOAD = b"x" * 37


def test_metrics_count_what_clients_send(ops_broker, reactor_thread, mqtt):
    http = Http(reactor_thread, ops_broker.url)
    prefix = f"m/{uid()}"
    subscriber = mqtt.connect(4, port=ops_broker.port)
    subscriber.subscribe(prefix + "/#", qos=2)
    publishers = {qos: mqtt.connect(5 if qos == 2 else 4, port=ops_broker.port) for qos in COUNTS}
    before = scrape(http)

    scraped_during = []
    done = threading.Event()

    def publish_all():
        for qos, n in COUNTS.items():
            for i in range(n):
                publishers[qos].publish(f"{prefix}/q{qos}", PAYLOAD, qos=qos, wait=qos > 0)
        done.set()

    worker = threading.Thread(target=publish_all)
    worker.start()
    # scraped while the clients publish: served from the same reactor
    while not done.is_set():
        scraped_during.append(scrape(http))
    worker.join()
    total = sum(COUNTS.values())
    received = subscriber.get_many(total, timeout=20)
    assert len(received) == total
    after = wait_for(lambda: (lambda s: s if value(s, "tbmq_messages_sent_total", qos=0)
                              - value(before, "tbmq_messages_sent_total", qos=0)
                              >= COUNTS[0] else None)(scrape(http)), what="QoS 0 counted")

    for qos, n in COUNTS.items():
        assert value(after, "tbmq_messages_received_total", qos=qos) - value(
            before, "tbmq_messages_received_total", qos=qos) == n
        assert value(after, "tbmq_received_payload_bytes_total", qos=qos) - value(
            before, "tbmq_received_payload_bytes_total", qos=qos) == n * len(PAYLOAD)
        assert value(after, "tbmq_messages_sent_total", qos=qos) - value(
            before, "tbmq_messages_sent_total", qos=qos) == n
        # payload bytes both ways: one subscriber, the same bytes out as in
        assert value(after, "tbmq_sent_payload_bytes_total", qos=qos) - value(
            before, "tbmq_sent_payload_bytes_total", qos=qos) == n * len(PAYLOAD)
    # the counters only grow, scrape after scrape
    series = [before] + scraped_during + [after]
    for older, newer in zip(series, series[1:]):
        for qos in COUNTS:
            assert value(newer, "tbmq_messages_received_total", qos=qos) >= value(
                older, "tbmq_messages_received_total", qos=qos)
    assert len(scraped_during) >= 1
    # one latency observation per delivery
    assert value(after, "tbmq_delivery_latency_seconds_count") - value(
        before, "tbmq_delivery_latency_seconds_count") == total
    assert value(after, "tbmq_delivery_latency_seconds_bucket", le="+Inf") == value(
        after, "tbmq_delivery_latency_seconds_count")
    # the wire both ways: every packet, headers and acknowledgements included
    for name in ("tbmq_received_bytes_total", "tbmq_sent_bytes_total"):
        assert value(after, name) - value(before, name) > total * len(PAYLOAD), name
    # connections by listener (named by its --listen endpoint), sessions by
    # kind, subscriptions
    assert value(after, "tbmq_connections", listener=ops_broker_endpoint(ops_broker)) >= 4
    assert value(after, "tbmq_sessions", persistent="false", client_type="DEVICE",
                 connected="true") >= 4
    assert value(after, "tbmq_subscriptions") >= 1
    assert value(after, "tbmq_cluster_nodes") == 1
    assert value(after, "tbmq_info", service_id=after_service_id(after),
                 version=after_version(after)) == 1
    # bus call latencies (sampled) and consumer lag per group
    assert value(after, "tbmq_backend_call_seconds_count", backend="bus", method="publish") > 0
    assert any(name == "tbmq_consumer_lag_records" and dict(labels).get("group") == "tbmq-msg-all"
               for name, labels in after)
    assert value(after, "process_cpu_seconds_total") > 0


def ops_broker_endpoint(broker) -> str:
    return f"tcp:{broker.port}:interface={HOST}"


def after_service_id(samples) -> str:
    return next(dict(labels)["service_id"] for name, labels in samples if name == "tbmq_info")


def after_version(samples) -> str:
    return next(dict(labels)["version"] for name, labels in samples if name == "tbmq_info")


def test_retained_messages_and_drops_are_gauged(ops_broker, reactor_thread, mqtt):
    http = Http(reactor_thread, ops_broker.url)
    before = scrape(http)
    publisher = mqtt.connect(4, port=ops_broker.port)
    topic = f"r/{uid()}"
    publisher.publish(topic, b"kept", qos=1, retain=True)
    wait_for(lambda: value(scrape(http), "tbmq_retained_messages")
             == value(before, "tbmq_retained_messages") + 1, what="a retained message counted")
    publisher.publish(topic, b"", qos=1, retain=True)
    wait_for(lambda: value(scrape(http), "tbmq_retained_messages")
             == value(before, "tbmq_retained_messages"), what="the retained message removed")


def test_sys_topics_with_mosquitto_names(ops_broker, mqtt):
    watcher = mqtt.connect(4, port=ops_broker.port)
    everything = mqtt.connect(4, port=ops_broker.port)
    everything.subscribe("#")  # $SYS is not matched by # [MQTT-4.7.2-1]
    watcher.subscribe("$SYS/broker/#")
    seen = {}

    def collect():
        while True:
            try:
                message = watcher.get(timeout=0.1)
            except AssertionError:
                break
            seen[message.topic] = message.payload.decode()
        return {"$SYS/broker/uptime", "$SYS/broker/clients/connected",
                "$SYS/broker/load/messages/received/1min"} <= set(seen)

    # the retained values come at once, the changed ones at the next tick
    wait_for(lambda: collect() and int(seen["$SYS/broker/clients/connected"]) >= 2,
             timeout=10, what="$SYS topics")
    assert seen["$SYS/broker/version"].startswith("tbmq version ")
    assert seen["$SYS/broker/uptime"].endswith(" seconds")
    assert int(seen["$SYS/broker/clients/connected"]) >= 2
    for name in ("messages/received", "messages/sent", "publish/messages/dropped",
                 "bytes/received", "bytes/sent", "subscriptions/count",
                 "retained messages/count", "clients/total", "clients/maximum"):
        assert int(seen[f"$SYS/broker/{name}"]) >= 0, name
    float(seen["$SYS/broker/load/bytes/received/5min"])
    # a second tick arrives (uptime is published every interval)
    first = seen["$SYS/broker/uptime"]
    wait_for(lambda: collect() and seen["$SYS/broker/uptime"] != first, timeout=10,
             what="the next $SYS tick")
    assert not [m for m in _drain(everything) if m.topic.startswith("$SYS")]


def _drain(client: PahoClient) -> list:
    out = []
    while True:
        try:
            out.append(client.get(timeout=0.2))
        except AssertionError:
            return out


def test_authentication_failures_are_counted(ops_broker, reactor_thread, mqtt):
    http = Http(reactor_thread, ops_broker.url)
    name, (password, _) = next(iter(USERS.items()))
    http.login(name, password)
    user = f"u{uid()}"
    added = http.request("POST", "/api/credentials", json_body={
        "type": "basic", "name": user, "username": user, "password": "right-one", "rounds": 4})
    assert added.status == 201, added
    before = scrape(http)
    client = mqtt(5, port=ops_broker.port)
    client.client.username_pw_set(user, "wrong-one")
    client.connect_and_wait(expect_rc=0x86)
    after = wait_for(lambda: (lambda s: s if value(s, "tbmq_authentication_failures_total",
                                                   reason_code="0x86") > value(
        before, "tbmq_authentication_failures_total", reason_code="0x86") else None)(scrape(http)),
                     what="the failure counted")
    assert value(after, "tbmq_authentication_failures_total", reason_code="0x86") - value(
        before, "tbmq_authentication_failures_total", reason_code="0x86") == 1


def _exchange(port: int, payload: bytes) -> tuple[int, int]:
    """One MQTT 3.1.1 client on a raw socket: CONNECT, SUBSCRIBE to its own
    topic, PUBLISH QoS 0 to it, read the copy back, DISCONNECT.

    :returns: ``(bytes written, bytes read)`` by the client."""
    topic = f"wire/{uid()}"
    decoder = Decoder(protocol_level=4, server_side=False)
    got = []
    written = read = 0
    with socket.create_connection((HOST, port), timeout=10) as sock:

        def send(*packets) -> None:
            nonlocal written
            data = b"".join(encode(p, 4) for p in packets)
            sock.sendall(data)
            written += len(data)

        def receive(n: int) -> None:
            nonlocal read
            while len(got) < n:
                data = sock.recv(65536)
                assert data, f"closed after {got}"
                read += len(data)
                got.extend(decoder.feed(data))

        send(Connect(client_id=f"wire-{uid()}", protocol_level=4),
             Subscribe(1, [SubscriptionRequest(topic, 0)]))
        receive(2)
        send(Publish(topic, payload, qos=0))
        receive(3)
        assert [type(p) for p in got] == [Connack, Suback, Publish]
        assert got[2].payload == payload
        send(Disconnect())
        assert sock.recv(1) == b""  # the broker closes after DISCONNECT
    return written, read


def test_a_fresh_node_has_every_series_and_counts_bytes_both_ways(tmp_path, reactor_thread):
    """Before any event, every labelled counter has its series at 0 (each
    QoS, drop reason and authentication failure reason code; the
    listener's connections), so that ``rate()`` sees the first event.  The
    byte counters count the wire both ways, the payload pair the PUBLISH
    payloads both ways."""
    broker = start_ops_broker(tmp_path / "fresh", USERS)
    try:
        http = Http(reactor_thread, broker.url)
        fresh = scrape(http)
        zeros = [("tbmq_messages_dropped_total", {"reason": r}) for r in DROP_REASONS]
        zeros += [("tbmq_authentication_failures_total", {"reason_code": f"0x{int(c):02X}"})
                  for c in AUTH_FAILURE_CODES]
        zeros += [(name, {"qos": str(qos)}) for qos in range(3) for name in (
            "tbmq_messages_received_total", "tbmq_messages_sent_total",
            "tbmq_received_payload_bytes_total", "tbmq_sent_payload_bytes_total")]
        zeros += [("tbmq_connections", {"listener": ops_broker_endpoint(broker)}),
                  ("tbmq_received_bytes_total", {}), ("tbmq_sent_bytes_total", {})]
        for name, labels in zeros:
            key = (name, frozenset(labels.items()))
            assert key in fresh, f"no sample {name}{labels}"
            assert fresh[key] == 0, f"{name}{labels} = {fresh[key]}"
        assert not [labels for name, labels in fresh if name == "tbmq_connections"
                    and dict(labels)["listener"].startswith("listen")]

        payload = b"p" * 1000
        written, read = _exchange(broker.port, payload)
        after = wait_for(lambda: (lambda s: s if value(s, "tbmq_sent_bytes_total") >= read
                                  and value(s, "tbmq_received_bytes_total") >= written
                                  else None)(scrape(http)), what="the bytes counted")
        assert value(after, "tbmq_received_bytes_total") == written
        assert value(after, "tbmq_sent_bytes_total") == read
        assert value(after, "tbmq_received_payload_bytes_total", qos=0) == len(payload)
        assert value(after, "tbmq_sent_payload_bytes_total", qos=0) == len(payload)
    finally:
        _finish(broker)
