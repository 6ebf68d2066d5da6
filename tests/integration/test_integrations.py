"""Integrations end to end: a real ``twistd -n tbmq`` node, paho
publishers, and the outside systems the messages go to (an HTTP server of
the test, a second broker, Tansu); what arrived is counted against what
was published, also after the target was down for a while."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import yaml

from tests.integration.helpers import HOST, free_port, props, uid
from tests.integration.ops import add_admin, wait_http
from tests.integration.integrations import Sink, integration_metrics, wait_for


def write_config(path, integrations: list[dict], http_port: int, **sections):
    config = {"http": {"endpoint": f"tcp:{http_port}:interface={HOST}"},
              "integrations": integrations, **sections}
    path.write_text(yaml.safe_dump(config))
    return path


def api_integrations(http_port: int, user: str, password: str) -> dict:
    """``GET /api/integrations`` after a login: ``{name: item}``."""
    base = f"http://{HOST}:{http_port}/api"
    login = urllib.request.Request(f"{base}/auth/login", method="POST",
                                   data=json.dumps({"username": user,
                                                    "password": password}).encode(),
                                   headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(login, timeout=5) as answer:
        token = json.load(answer)["token"]
    listing = urllib.request.Request(f"{base}/integrations",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(listing, timeout=5) as answer:
        return {item["name"]: item for item in json.load(answer)["items"]}


def test_http_integration_counts_retries_and_drops(broker_factory, mqtt, tmp_path):
    sink = Sink().start()
    http_port = free_port()
    prefix = uid()
    config = write_config(tmp_path / "tbmq.yml", [
        {"name": "web", "type": "http", "url": sink.url, "topic_filters": [f"{prefix}/s/#"],
         "headers": {"X-Token": "t1"}, "concurrency": 1, "retry_initial": 0.1,
         "retry_max": 0.4, "timeout": 3},
        {"name": "nowhere", "type": "http", "url": f"http://{HOST}:{free_port()}/",
         "topic_filters": [f"{prefix}/dead/#"], "buffer_messages": 5, "retry_initial": 0.1,
         "retry_max": 0.2},
    ], http_port)
    add_admin(tmp_path / "broker0" / "data", "root", "root-password-1")
    try:
        node = broker_factory(config=config)
        publisher = mqtt.connect(5, port=node.port)
        user = props(UserProperty=[("site", "a"), ("site", "b")])

        def publish(first: int, n: int) -> list[str]:
            sent = [f"m{i}" for i in range(first, first + n)]
            for payload in sent:
                publisher.publish(f"{prefix}/s/{payload}", payload, qos=1, properties=user)
            return sent

        # 1. the target is up: every message, as one JSON object each
        expected = publish(0, 10)
        publisher.publish(f"{prefix}/other", b"not matched", qos=1)
        publisher.publish(f"{prefix}/s/bin", b"\xff\x00", qos=0)
        wait_for(lambda: len(sink.bodies) == 11, "the first 11 messages")
        assert sink.payloads()[:10] == expected
        first = sink.bodies[0]
        assert first["topic"] == f"{prefix}/s/m0" and first["qos"] == 1
        assert first["retain"] is False and first["client_id"] == publisher.client_id
        assert first["user_properties"] == [["site", "a"], ["site", "b"]]
        assert isinstance(first["timestamp"], int) and "payload_encoding" not in first
        assert sink.bodies[10]["payload"] == "/wA=" and sink.bodies[10]["qos"] == 0
        assert sink.bodies[10]["payload_encoding"] == "base64"
        assert sink.headers[0]["X-Token"] == "t1"
        assert sink.headers[0]["Content-Type"] == "application/json"

        # 2. the target answers 500 for a while: the messages wait, then arrive in order
        sink.status = 500
        expected += publish(10, 10)
        wait_for(lambda: sink.refused >= 3, "three refused requests")
        sink.status = 200
        wait_for(lambda: len(sink.bodies) == 21, "the messages held during the 500s")

        # 3. the target is stopped (connection refused), then started again
        sink.stop()
        expected += publish(20, 10)
        wait_for(lambda: integration_metrics(http_port)[
            ("tbmq_integration_buffer_messages", "web")] == 10, "10 messages in the buffer")
        sink.start()
        wait_for(lambda: len(sink.bodies) == 31, "the messages held while it was down")
        assert [p for p in sink.payloads() if p != "/wA="] == expected  # once each, in order

        # 4. a 4xx refuses a message for good: counted as failed, not sent again
        sink.status = 400
        publish(30, 1)
        wait_for(lambda: integration_metrics(http_port).get(
            ("tbmq_integration_messages_failed_total", "web")) == 1, "one failed message")
        refused = sink.refused

        # 5. a target that never answers: 5 messages wait, the next 3 are dropped
        for i in range(8):
            publisher.publish(f"{prefix}/dead/{i}", b"x", qos=1)
        metrics = wait_for(lambda: (m := integration_metrics(http_port)) and m[
            ("tbmq_integration_messages_dropped_total", "nowhere")] == 3 and m, "3 drops")
        assert metrics[("tbmq_integration_buffer_messages", "nowhere")] == 5
        assert metrics[("tbmq_integration_messages_sent_total", "nowhere")] == 0
        assert metrics[("tbmq_integration_messages_sent_total", "web")] == 31
        assert metrics[("tbmq_integration_messages_retried_total", "web")] >= 4
        assert metrics[("tbmq_integration_messages_dropped_total", "web")] == 0
        assert metrics[("tbmq_integration_buffer_messages", "web")] == 0
        assert sink.refused == refused  # the message answered 400 was not sent again
        listed = api_integrations(http_port, "root", "root-password-1")
        assert listed["web"]["sent"] == 31 and listed["web"]["failed"] == 1
        assert listed["web"]["last_error"] == "HTTP 400" and listed["web"]["type"] == "http"
        assert listed["nowhere"]["dropped"] == 3 and listed["nowhere"]["buffer_messages"] == 5
        assert listed["nowhere"]["topic_filters"] == [f"{prefix}/dead/#"]
    finally:
        sink.stop()


def test_mqtt_bridge_to_a_second_broker_survives_its_restart(broker_factory, mqtt, tmp_path):
    remote = broker_factory()
    http_port = free_port()
    prefix = uid()
    config = write_config(tmp_path / "tbmq.yml", [
        {"name": "bridge", "type": "mqtt", "host": HOST, "port": remote.port,
         "topic_filters": [f"{prefix}/#"], "topic_prefix": "bridged/", "qos": 1,
         "retry_initial": 0.1, "retry_max": 0.5, "concurrency": 8}], http_port)
    node = broker_factory(config=config)
    subscriber_id = f"sub-{prefix}"
    subscriber = mqtt.connect(5, client_id=subscriber_id, port=remote.port, session_expiry=600)
    subscriber.subscribe(f"bridged/{prefix}/#", qos=1)
    publisher = mqtt.connect(5, port=node.port)
    user = props(UserProperty=[("site", "a")])

    # 1. both up: each message once, on the prefixed topic, with its user property
    for i in range(10):
        publisher.publish(f"{prefix}/t/{i}", f"m{i}", qos=1, properties=user)
    got = subscriber.get_many(10)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(10)]
    assert got[0].topic == f"bridged/{prefix}/t/0" and got[0].qos == 1
    assert got[0].prop("UserProperty") == [("site", "a")]
    subscriber.disconnect()

    # 2. the second broker is down: the messages wait in the buffer, then go on
    remote.stop()
    for i in range(10, 20):
        publisher.publish(f"{prefix}/t/{i}", f"m{i}", qos=1)
    wait_for(lambda: integration_metrics(http_port)[
        ("tbmq_integration_buffer_messages", "bridge")] == 10, "10 messages in the buffer")
    remote.start()
    metrics = wait_for(lambda: (m := integration_metrics(http_port))[
        ("tbmq_integration_messages_sent_total", "bridge")] == 20 and m, "20 messages sent")
    assert metrics[("tbmq_integration_buffer_messages", "bridge")] == 0
    assert metrics[("tbmq_integration_messages_dropped_total", "bridge")] == 0
    assert metrics[("tbmq_integration_messages_retried_total", "bridge")] >= 1
    again = mqtt(5, client_id=subscriber_id, port=remote.port)
    again.connect_and_wait(clean_start=False, session_expiry=600)
    got = again.get_many(10)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(10, 20)]


def read_records(bootstrap: str, topic: str, n: int) -> list:
    """``n`` records of ``topic``, read from the start of each partition
    (in order within a partition)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uid()}",
                         "enable.auto.commit": False})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    records = []
    try:
        def more():
            m = consumer.poll(0.2)
            if m is not None and m.error() is None:
                records.append(m)
            return len(records) >= n
        wait_for(more, f"{n} records on {topic}", timeout=30)
    finally:
        consumer.close()
    return records


def test_kafka_integration_keys_and_headers(broker_factory, mqtt, tmp_path, kafka_bootstrap):
    http_port = free_port()
    prefix = uid()
    by_topic, by_client = f"mqtt-{prefix}-t", f"mqtt-{prefix}-c"
    config = write_config(tmp_path / "tbmq.yml", [
        {"name": "k-topic", "type": "kafka", "bootstrap_servers": kafka_bootstrap,
         "topic": by_topic, "key": "topic", "topic_filters": [f"{prefix}/t/#"],
         "retry_initial": 0.2, "retry_max": 1.0},
        {"name": "k-client", "type": "kafka", "topic": by_client, "key": "client_id",
         "topic_filters": [f"{prefix}/c/#"], "retry_initial": 0.2, "retry_max": 1.0},
    ], http_port, kafka={"bootstrap_servers": kafka_bootstrap, "partitions": 1})
    # (the second integration takes the node's own kafka.bootstrap_servers)
    node = broker_factory(config=config)
    publisher = mqtt.connect(5, port=node.port)
    user = props(UserProperty=[("site", "a"), ("unit", "°C")])
    for i in range(10):
        publisher.publish(f"{prefix}/t/{i}", f"m{i}", qos=1, properties=user)
        publisher.publish(f"{prefix}/c/{i}", f"c{i}", qos=0)
    records = read_records(kafka_bootstrap, by_topic, 10)
    assert [r.value() for r in records] == [f"m{i}".encode() for i in range(10)]
    assert [r.key() for r in records] == [f"{prefix}/t/{i}".encode() for i in range(10)]
    assert records[0].headers() == [("site", b"a"), ("unit", "°C".encode())]
    records = read_records(kafka_bootstrap, by_client, 10)
    assert [r.value() for r in records] == [f"c{i}".encode() for i in range(10)]
    assert {r.key() for r in records} == {publisher.client_id.encode()}
    metrics = wait_for(lambda: (m := integration_metrics(http_port))[
        ("tbmq_integration_messages_sent_total", "k-client")] == 10 and m, "10 sent")
    assert metrics[("tbmq_integration_messages_sent_total", "k-topic")] == 10
    assert metrics[("tbmq_integration_messages_dropped_total", "k-topic")] == 0


def test_two_nodes_on_kafka_send_each_message_once(tmp_path, mqtt, kafka_bootstrap):
    """The same integration on two nodes of one cluster: each message goes
    out once, from the node that accepted it, not once per node."""
    from tests.integration.cluster import ClusterNode, Services

    sink = Sink().start()
    prefix = uid()
    services = Services(kafka_bootstrap, "redis://127.0.0.1:1/0", "dbname=unused",
                        f"c{prefix[:8]}")  # neither is used: memory stores
    env = {"TBMQ_AUTH__CREDENTIALS": "memory", "TBMQ_STORAGE__DEVICE_STORE": "memory",
           "TBMQ_INTEGRATIONS__0__NAME": "web", "TBMQ_INTEGRATIONS__0__TYPE": "http",
           "TBMQ_INTEGRATIONS__0__URL": sink.url,
           "TBMQ_INTEGRATIONS__0__TOPIC_FILTERS": f'["{prefix}/#"]'}
    nodes = []
    try:
        for name in ("n1", "n2"):
            nodes.append(ClusterNode(tmp_path, services, f"{prefix}-{name}", env=env).start())
        for node in nodes:
            node.wait_log("integration web (http)")
        publishers = [mqtt.connect(5, port=node.port) for node in nodes]
        subscriber = mqtt.connect(5, port=nodes[1].port)
        subscriber.subscribe(f"{prefix}/#", qos=1)
        expected = []
        for i in range(20):
            for n, publisher in enumerate(publishers):
                payload = f"n{n}-{i}"
                publisher.publish(f"{prefix}/s/{payload}", payload, qos=1)
                expected.append(payload)
        assert len(subscriber.get_many(40)) == 40  # the cluster routed them all
        wait_for(lambda: len(sink.bodies) >= 40, "40 requests")
        time.sleep(1.0)  # a copy sent by the other node too would come now
        assert sorted(sink.payloads()) == sorted(expected)
        by_node = {n: [p for p in sink.payloads() if p.startswith(f"n{n}-")] for n in (0, 1)}
        assert by_node == {n: [f"n{n}-{i}" for i in range(20)] for n in (0, 1)}
    finally:
        for node in nodes:
            node.stop()
        sink.stop()


def test_kafka_integration_after_kafka_was_down(broker_factory, mqtt, tmp_path):
    from tests.kafka import Tansu

    tansu = Tansu()
    tansu.start()
    http_port = free_port()
    prefix = uid()
    topic = f"mqtt-{prefix}"
    config = write_config(tmp_path / "tbmq.yml", [
        {"name": "k", "type": "kafka", "bootstrap_servers": tansu.bootstrap, "topic": topic,
         "topic_filters": [f"{prefix}/#"], "concurrency": 1, "timeout": 3,
         "retry_initial": 0.2, "retry_max": 1.0}], http_port, kafka={"partitions": 1})
    try:
        node = broker_factory(config=config)
        publisher = mqtt.connect(5, port=node.port)
        for i in range(5):
            publisher.publish(f"{prefix}/{i}", f"m{i}", qos=1)
        assert [r.value() for r in read_records(tansu.bootstrap, topic, 5)] == [
            f"m{i}".encode() for i in range(5)]
        tansu.stop()
        for i in range(5, 10):
            publisher.publish(f"{prefix}/{i}", f"m{i}", qos=1)
        wait_for(lambda: integration_metrics(http_port)[
            ("tbmq_integration_messages_retried_total", "k")] >= 1, "a retry")
        tansu.start()  # empty: Tansu forgets its topics when it stops
        metrics = wait_for(lambda: (m := integration_metrics(http_port))[
            ("tbmq_integration_messages_sent_total", "k")] == 10 and m, "10 sent", timeout=60)
        assert metrics[("tbmq_integration_buffer_messages", "k")] == 0
        # the held messages reached the empty Tansu (its topic made again)
        values = sorted(r.value() for r in read_records(tansu.bootstrap, topic, 5))
        assert values == [f"m{i}".encode() for i in range(5, 10)]
    finally:
        tansu.close()


def api_call(http_port: int, method: str, path: str, body=None,
             admin=("root", "root-password-1")) -> tuple[int, dict]:
    """One admin API call after a login: ``(status, JSON answer)``."""
    base = f"http://{HOST}:{http_port}/api"
    login = urllib.request.Request(f"{base}/auth/login", method="POST",
                                   data=json.dumps({"username": admin[0],
                                                    "password": admin[1]}).encode(),
                                   headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(login, timeout=5) as answer:
        token = json.load(answer)["token"]
    request = urllib.request.Request(
        f"{base}/{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_an_integration_added_and_removed_through_the_api_survives_a_restart(
        broker_factory, mqtt, tmp_path):
    """``POST /api/integrations`` adds an integration on the node (through
    the bus topic ``tbmq.integrations``, kept across a restart of the
    embedded node); one from the config file cannot be replaced (409); a bad
    entry is refused (422); ``DELETE`` removes it, and nothing more is sent."""
    sink = Sink().start()
    http_port = free_port()
    prefix = uid()
    config = write_config(tmp_path / "tbmq.yml", [
        {"name": "from-file", "type": "http", "url": sink.url,
         "topic_filters": [f"{prefix}/file/#"]}], http_port)
    add_admin(tmp_path / "broker0" / "data", "root", "root-password-1")
    try:
        node = broker_factory(config=config)
        wait_http(http_port)
        entry = {"name": "from-api", "type": "http", "url": sink.url,
                 "topic_filters": [f"{prefix}/api/#"], "retry_initial": 0.1}
        assert api_call(http_port, "POST", "integrations", entry) == (
            202, {"status": "accepted", "target": "from-api"})
        status, _ = api_call(http_port, "POST", "integrations",
                             {**entry, "name": "from-file"})
        assert status == 409
        status, _ = api_call(http_port, "POST", "integrations",
                             {**entry, "name": "bad", "url": "ftp://x"})
        assert status == 422
        listed = wait_for(lambda: (m := api_integrations(http_port, "root", "root-password-1"))
                          and "from-api" in m and m, "the integration listed")
        assert listed["from-api"]["source"] == "api" and listed["from-file"]["source"] == "config"
        assert "bad" not in listed
        publisher = mqtt.connect(5, port=node.port)
        publisher.publish(f"{prefix}/api/1", b"one", qos=1)
        wait_for(lambda: sink.payloads() == ["one"], "the message of the API's integration")

        node.restart()
        wait_http(http_port)
        publisher = mqtt.connect(5, port=node.port)
        wait_for(lambda: "from-api" in api_integrations(http_port, "root", "root-password-1"),
                 "the integration back after the restart")
        publisher.publish(f"{prefix}/api/2", b"two", qos=1)
        wait_for(lambda: sink.payloads() == ["one", "two"], "a message after the restart")

        assert api_call(http_port, "DELETE", "integrations/from-api")[0] == 202
        assert api_call(http_port, "DELETE", "integrations/from-file")[0] == 409
        assert api_call(http_port, "DELETE", "integrations/never-was")[0] == 404
        wait_for(lambda: "from-api" not in api_integrations(http_port, "root", "root-password-1"),
                 "the integration removed")
        publisher.publish(f"{prefix}/api/3", b"three", qos=1)
        publisher.publish(f"{prefix}/file/4", b"four", qos=1)
        wait_for(lambda: "four" in sink.payloads(), "the config file's integration still sends")
        assert sink.payloads() == ["one", "two", "four"]
    finally:
        sink.stop()
