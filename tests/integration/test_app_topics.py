"""TBMQ's removal of APPLICATION topics on two ``twistd -n tbmq`` nodes on
Tansu: when the session of a persistent APPLICATION client expires, the one
node that held it deletes its ``tbmq.msg.app.<clientId>`` topic from Kafka
(``kafka.enable_topic_deletion``, true by default); with the setting false
the topic stays."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from kafka.admin import KafkaAdminClient

from tbmq.cluster.topics import TopicCatalogue
from tests.integration.cluster import ClusterNode, Services
from tests.integration.conftest import _LIVE, _finish
from tests.integration.helpers import REPO_ROOT, PahoClient, uid
from tests.postgres import new_database

pytestmark = pytest.mark.timeout(600)

APP_USER, APP_PASSWORD = "app-user", "app-secret"
EXPIRY = 6  # seconds: the offline session outlives its three messages' publish and the
# check of its topic on a loaded machine (3 s did not, under a 2-core load)


@pytest.fixture(scope="module")
def postgres(postgres_dsn):
    """One database for the module's clusters, with APPLICATION credentials."""
    dsn = new_database(postgres_dsn)
    workdir_config = f"auth:\n  credentials: postgres\npostgres:\n  dsn: \"{dsn}\"\n"
    return dsn, workdir_config


def _cluster(tmp_path_factory, kafka_bootstrap, redis_url, postgres, driver, env=None):
    """Two nodes (A, B) of a cluster of their own (its own topic prefix)."""
    dsn, cli_config = postgres
    services = Services(kafka_bootstrap, redis_url, dsn, f"t{uid()[:8]}")
    workdir = tmp_path_factory.mktemp("apptopics")
    config = workdir / "cli.yml"
    config.write_text(cli_config)
    subprocess.run(
        [sys.executable, "-m", "tbmq.cli", "credentials", "add", "--config", str(config),
         "--type", "basic", "--name", f"app-{services.prefix}", "--client-type", "APPLICATION",
         "--username", APP_USER + services.prefix, "--password", APP_PASSWORD,
         "--rounds", "4"], check=True, cwd=REPO_ROOT, capture_output=True)
    nodes = []
    for service_id in ("node-a", "node-b"):
        node = ClusterNode(workdir, services, service_id, driver, "redis", env=env)
        _LIVE.append(node)
        nodes.append(node)
    for node in nodes:
        node.start()
    return services, nodes


def _stop(nodes) -> None:
    """Stop the nodes (a node that died fails the test)."""
    for node in nodes:
        _finish(node)


def _topics(bootstrap: str) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def _offline_application(services, a, b) -> tuple[str, str]:
    """A persistent APPLICATION session on node A (expiry :data:`EXPIRY`),
    offline with three messages waiting in its topic (published on B).

    :returns: ``(client id, its Kafka topic)``."""
    cid, topic_filter = f"app-{uid()}", f"apps/{uid()}"
    app = PahoClient(a.port, 5, client_id=cid)
    app.client.username_pw_set(APP_USER + services.prefix, APP_PASSWORD)
    app.connect_and_wait(clean_start=False, session_expiry=EXPIRY, timeout=30)
    assert app.subscribe(topic_filter, qos=1) == [1]
    time.sleep(1.0)  # the subscription reaches node B through Kafka
    app.disconnect()
    pub = PahoClient(b.port, 5)
    pub.connect_and_wait(timeout=30)
    for i in range(3):
        pub.publish(topic_filter, b"%d" % i, qos=1)
    pub.close()
    topic = TopicCatalogue(services.prefix + ".").app(cid)
    assert topic in _topics(services.bootstrap)
    return cid, topic


@pytest.mark.parametrize("driver", ["kafka-python", "confluent"])
def test_an_expired_application_session_deletes_its_topic_from_kafka(
        driver, tmp_path_factory, kafka_bootstrap, redis_url, postgres):
    services, (a, b) = _cluster(tmp_path_factory, kafka_bootstrap, redis_url, postgres, driver)
    try:
        cid, topic = _offline_application(services, a, b)
        deadline = time.monotonic() + EXPIRY + 30
        while topic in _topics(services.bootstrap):
            assert time.monotonic() < deadline, f"{topic} still in Kafka"
            time.sleep(0.5)
        line = f"APPLICATION client {cid}: its session ended, topic {topic} deleted"
        a.wait_log(line, timeout=10)
        assert line not in b.log()  # the node that held the session, only
        # the client comes back later: a new, empty session and topic
        again = PahoClient(b.port, 5, client_id=cid)
        again.client.username_pw_set(APP_USER + services.prefix, APP_PASSWORD)
        again.connect_and_wait(clean_start=False, session_expiry=EXPIRY, timeout=30)
        assert again.session_present is False
        time.sleep(2.0)  # what waited in the old topic would come now
        assert again.messages.empty()
        again.close()
        assert not a.crashed and not b.crashed
    finally:
        _stop([a, b])


def test_with_topic_deletion_off_the_topic_stays_in_kafka(
        tmp_path_factory, kafka_bootstrap, redis_url, postgres):
    services, (a, b) = _cluster(tmp_path_factory, kafka_bootstrap, redis_url, postgres,
                                "confluent", env={"TBMQ_KAFKA__ENABLE_TOPIC_DELETION": "false"})
    try:
        cid, topic = _offline_application(services, a, b)
        a.wait_log(f"session {cid} expired", timeout=EXPIRY + 30)
        time.sleep(2.0)
        assert topic in _topics(services.bootstrap)
        assert f"topic {topic} deleted" not in a.log() + b.log()
    finally:
        _stop([a, b])
