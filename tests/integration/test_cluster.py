"""A cluster of ``twistd -n tbmq`` processes on one Kafka-protocol broker
(Tansu), one Redis and one PostgreSQL: traffic between nodes, persistent
DEVICE and APPLICATION sessions that move between nodes, takeover, a node
that joins, and a node killed under load without losing an acknowledged
message.

Two nodes (A and B) run for the whole module; the join test adds C; the
last test kills A.  Each test uses its own topics and client ids.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time

import pytest

from tests.integration.cluster import ClusterNode, CountingPublisher, Services
from tests.integration.conftest import _LIVE
from tests.integration.helpers import REPO_ROOT, PahoClient, uid
from tests.postgres import new_database

pytestmark = pytest.mark.timeout(600)

APP_USER, APP_PASSWORD = "app-user", "app-secret"


#: (Kafka driver, device store) of each cluster the module runs
SETUPS = [("kafka-python", "redis"), ("confluent", "postgres")]


@pytest.fixture(scope="module", params=SETUPS, ids=[f"{d}+{s}" for d, s in SETUPS])
def setup(request):
    return request.param


@pytest.fixture(scope="module")
def services(setup, kafka_bootstrap, redis_url, postgres_dsn):
    return Services(kafka_bootstrap, redis_url, new_database(postgres_dsn), f"c{uid()[:8]}")


@pytest.fixture(scope="module")
def nodes(setup, services, tmp_path_factory):
    """Nodes A and B (C joins in a test); stopped when the module's tests of
    this setup are done."""
    driver, device_store = setup
    workdir = tmp_path_factory.mktemp("cluster")
    started: dict = {"setup": setup}

    def node(service_id: str) -> ClusterNode:
        made = ClusterNode(workdir, services, service_id, driver, device_store)
        _LIVE.append(made)  # its log printed when a test fails
        return made

    started["node"] = node
    a = node("node-a")
    b = node("node-b")
    started["a"], started["b"] = a.start(), b.start()
    started["workdir"] = workdir
    _add_application_credentials(services, workdir)
    yield started
    for key, node in started.items():
        if isinstance(node, ClusterNode):
            try:
                node.stop()
            finally:
                node.kill()
                if node in _LIVE:
                    _LIVE.remove(node)


def _add_application_credentials(services: Services, workdir) -> None:
    config = workdir / "cli.yml"
    config.write_text(f"auth:\n  credentials: postgres\npostgres:\n  dsn: \"{services.dsn}\"\n")
    subprocess.run(
        [sys.executable, "-m", "tbmq.cli", "credentials", "add", "--config", str(config),
         "--type", "basic", "--name", "app", "--client-type", "APPLICATION",
         "--username", APP_USER, "--password", APP_PASSWORD, "--rounds", "4"],
        check=True, cwd=REPO_ROOT, capture_output=True)


def _client(node: ClusterNode, client_id: str | None = None, version: int = 5,
            **connect) -> PahoClient:
    c = PahoClient(node.port, version, client_id=client_id)
    return c.connect_and_wait(timeout=30, **connect)


def _connect_until_accepted(node: ClusterNode, client_id: str, limit: float = 60.0,
                            **connect) -> PahoClient:
    """Connect as a client with automatic reconnect does after a node died:
    again after each CONNACK 0x88 Server unavailable, which a node answers
    while the member deciding for ``client_id`` is gone and its partition has
    not moved yet (the consumer group's session timeout, then a join), until
    accepted or ``limit`` seconds passed.  Any other answer fails the test."""
    deadline = time.monotonic() + limit
    while True:
        c = PahoClient(node.port, 5, client_id=client_id)
        c.connect_and_wait(timeout=30, expect_rc=None, **connect)
        if c.connack_code == 0:
            return c
        c.close()
        assert c.connack_code == 0x88, f"{client_id}: CONNACK {c.connack_code:#x}"
        assert time.monotonic() < deadline, f"{client_id}: refused for {limit} s"
        time.sleep(0.5)


def _payloads(client: PahoClient, n: int, timeout: float = 30.0) -> list[bytes]:
    return [m.payload for m in client.get_many(n, timeout)]


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_a_publisher_on_a_reaches_subscribers_on_b(nodes, qos):
    topic = f"x/{uid()}"
    subs = [_client(nodes["b"], version=v) for v in (4, 5)]
    for s in subs:
        assert s.subscribe(topic + "/#", qos=2) == [2]
    time.sleep(1.0)  # the subscription reaches node A's trie through Kafka
    pub = _client(nodes["a"])
    for i in range(20):
        pub.publish(f"{topic}/{i % 3}", str(i).encode(), qos=qos)
    for s in subs:
        got = s.get_many(20, timeout=30)
        # in order per topic [MQTT-4.6.0-5]; topics of different partitions interleave
        for t in range(3):
            assert [m.payload for m in got if m.topic == f"{topic}/{t}"] == [
                str(i).encode() for i in range(t, 20, 3)]
        assert {m.qos for m in got} == {qos}
    for c in (*subs, pub):
        c.close()


def test_a_persistent_device_gets_what_it_missed_on_another_node_in_order(nodes):
    topic, cid = f"dev/{uid()}", f"dev-{uid()}"
    device = _client(nodes["a"], cid, clean_start=False, session_expiry=300)
    assert device.subscribe(topic, qos=1) == [1]
    device.disconnect()
    pub = _client(nodes["b"])
    for i in range(50):
        pub.publish(topic, str(i).encode(), qos=1)
    again = _client(nodes["b"], cid, clean_start=False, session_expiry=300)
    assert again.session_present is True
    assert _payloads(again, 50) == [str(i).encode() for i in range(50)]
    for c in (again, pub):
        c.close()


def test_a_persistent_application_gets_what_it_missed_on_another_node_in_order(nodes):
    topic, cid = f"app/{uid()}", f"app-{uid()}"
    app = PahoClient(nodes["a"].port, 5, client_id=cid)
    app.client.username_pw_set(APP_USER, APP_PASSWORD)
    app.connect_and_wait(clean_start=False, session_expiry=300, timeout=30)
    assert app.subscribe(topic, qos=1) == [1]
    app.disconnect()
    pub = _client(nodes["b"])
    for i in range(50):
        pub.publish(topic, str(i).encode(), qos=1)
    again = PahoClient(nodes["b"].port, 5, client_id=cid)
    again.client.username_pw_set(APP_USER, APP_PASSWORD)
    again.connect_and_wait(clean_start=False, session_expiry=300, timeout=30)
    assert again.session_present is True
    assert _payloads(again, 50, timeout=60) == [str(i).encode() for i in range(50)]
    for c in (again, pub):
        c.close()


def test_a_session_is_taken_over_across_nodes(nodes):
    cid = f"dup-{uid()}"
    first = _client(nodes["a"], cid)
    second = _client(nodes["b"], cid)
    first.wait_disconnected(timeout=30)
    assert first.disconnects[-1][0] == 0x8E  # session taken over
    assert second.client.is_connected()
    for c in (first, second):
        c.close()


def _reaches(client: PahoClient, topic: str, publishers: dict, limit: float = 30.0) -> None:
    """Each of ``publishers`` (node name → a connected client) publishes on
    ``topic`` until ``client`` received a message of each: every node routes
    ``topic`` to the node its registry shows ``client`` connected to."""
    missing = set(publishers)
    deadline = time.monotonic() + limit
    while missing:
        assert time.monotonic() < deadline, f"{client.client_id}: nothing from {missing}"
        for name in missing:
            publishers[name].publish(topic, name.encode(), qos=1)
        try:
            while True:
                missing.discard(client.get(timeout=0.5).payload.decode())
        except AssertionError:
            pass


@pytest.mark.parametrize("persistent", [True, False], ids=["clean-start-0", "clean-start-1"])
def test_two_connects_of_a_new_client_id_on_two_nodes_at_once_end_with_one_session(
        nodes, persistent):
    """A client id no node holds a session of, connecting on A and on B at
    the same moment (Clean Start 0 with a session expiry, or Clean Start
    1): both may be granted before either node read the other's session
    record; the records' order stamps leave exactly one connection, the
    later grant, on every node: the other gets DISCONNECT SESSION_TAKEN_OVER
    [MQTT-3.1.4-3], and messages published through either node reach the
    one left.  Five races in a row."""
    publishers = {n: _client(nodes[n], f"race-pub-{uid()}") for n in ("a", "b")}
    connect = {"clean_start": False, "session_expiry": 300} if persistent else {}
    for _ in range(5):
        cid = f"race-{uid()}"
        clients: dict = {n: PahoClient(nodes[n].port, 5, client_id=cid) for n in ("a", "b")}
        threads = [threading.Thread(target=c.connect_and_wait,
                                    kwargs={"timeout": 30, "expect_rc": None, **connect})
                   for c in clients.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(c.connack_code == 0 for c in clients.values()), (
            cid, {n: c.connack_code for n, c in clients.items()})
        deadline = time.monotonic() + 30
        while (sum(not c.disconnected.is_set() for c in clients.values()) > 1
               and time.monotonic() < deadline):
            time.sleep(0.1)
        time.sleep(2.0)  # the records of both were read everywhere
        left = [n for n, c in clients.items() if not c.disconnected.is_set()]
        assert len(left) == 1, (f"connected after the race: {left}", cid,
                                {n: c.disconnects for n, c in clients.items()})
        gone = clients["b" if left == ["a"] else "a"]
        assert gone.disconnects[-1][0] == 0x8E  # session taken over
        survivor = clients[left[0]]
        survivor.subscribe(f"race/{cid}", qos=1)
        _reaches(survivor, f"race/{cid}", publishers)
        assert survivor.client.is_connected()
        for c in clients.values():
            c.close()
    for c in publishers.values():
        c.close()


def test_a_node_that_joins_serves_existing_subscriptions_and_retained_messages(nodes):
    topic = f"join/{uid()}"
    watcher = _client(nodes["a"], f"w-{uid()}", clean_start=False, session_expiry=300)
    assert watcher.subscribe(topic + "/#", qos=1) == [1]
    _client(nodes["b"]).publish(topic + "/kept", b"retained", qos=1, retain=True)
    assert watcher.get().payload == b"retained"
    c = nodes["node"]("node-c")
    nodes["c"] = c.start()
    # C's join rebalances the cluster's groups: while the partition of a
    # client id's connect requests moves, a CONNECT may get 0x88 Server
    # unavailable (node.connect_answer_timeout), and a client connects again
    late = _connect_until_accepted(c, f"late-{uid()}")
    late.subscribe(topic + "/#", qos=1)
    got = late.get(timeout=30)
    assert (got.topic, got.payload, got.retain) == (topic + "/kept", b"retained", True)
    pub = _connect_until_accepted(c, f"pub-{uid()}")
    pub.publish(topic + "/new", b"from-c", qos=1)
    assert watcher.get_for(topic + "/new", timeout=30).payload == b"from-c"
    for x in (watcher, late, pub):
        x.close()


@pytest.mark.timeout(420)
def test_a_node_killed_under_qos1_load_loses_no_acknowledged_message(nodes, capsys):
    """SIGKILL node A while publishers on A and C send QoS 1 and persistent
    subscribers on A and B receive: the clients of A reconnect to the
    others; every message a publisher was acknowledged for arrives at both
    subscribers (duplicates allowed, counted)."""
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    topic = f"load/{uid()}"
    subscribers = {}
    for name, node in (("on-a", a), ("on-b", b)):
        cid = f"s-{name}-{uid()}"
        s = _client(node, cid, clean_start=False, session_expiry=600)
        assert s.subscribe(topic + "/#", qos=1) == [1]
        subscribers[name] = (cid, s)
    time.sleep(1.0)
    publishers = {"pub-a": CountingPublisher([a.port, b.port], topic + "/a").start(),
                  "pub-c": CountingPublisher([c.port], topic + "/c").start()}
    time.sleep(3.0)
    a.kill()
    # A's persistent subscriber comes back on B at once (a client does not
    # wait for the cluster to notice)
    cid, lost = subscribers["on-a"]
    received_before = _drain(lost)
    lost.close()
    time.sleep(0.5)
    back = _connect_until_accepted(b, cid, clean_start=False, session_expiry=600)
    assert back.session_present is True
    subscribers["on-a"] = (cid, back)
    time.sleep(8.0)
    for p in publishers.values():
        p.stop()
    time.sleep(2.0)
    report = []
    missed = []
    wanted = {(topic + "/" + pub_name[-1], str(n).encode())
              for pub_name, p in publishers.items() for n in p.acked}
    for name, (cid, s) in subscribers.items():
        # the partitions the dead node consumed move after the group's
        # session timeout: wait for every acknowledged message (or 150 s)
        got = _collect(s, wanted, received_before if name == "on-a" else [], 150.0)
        for pub_name, p in publishers.items():
            suffix = "/" + pub_name[-1]
            numbers = [int(m.payload) for m in got if m.topic == topic + suffix]
            seen = set(numbers)
            missing = sorted(p.acked - seen)
            report.append(f"{name} from {pub_name}: sent {p.sent}, acknowledged "
                          f"{len(p.acked)}, received {len(numbers)} ({len(seen)} distinct, "
                          f"{len(numbers) - len(seen)} duplicates), acknowledged but missing "
                          f"{len(missing)}")
            if missing:
                missed.append(f"{name} from {pub_name}: {missing[:20]}")
        s.close()
    # every count first: which subscribers miss a message tells where it was lost
    assert not missed, "\n".join(report) + "\nmissing:\n" + "\n".join(missed)
    with capsys.disabled():  # the counts belong in the test run's output
        print(f"\nnode A killed under QoS 1 load ({' + '.join(nodes['setup'])}):\n  "
              + "\n  ".join(report))
    assert all(len(p.acked) > 100 for p in publishers.values()), report


def _collect(client: PahoClient, wanted: set, got: list, limit: float) -> list:
    """What ``client`` received on top of ``got``, until every ``(topic,
    payload)`` of ``wanted`` is there, or ``limit`` seconds passed; then
    what arrives within 2 s more (duplicates are counted too)."""
    got = list(got)
    missing = wanted - {(m.topic, m.payload) for m in got}
    deadline = time.monotonic() + limit
    while missing and time.monotonic() < deadline:
        try:
            m = client.messages.get(timeout=1.0)
        except queue.Empty:
            continue
        got.append(m)
        missing.discard((m.topic, m.payload))
    return got + _drain(client, settle=2.0)


def _drain(client: PahoClient, settle: float = 0.0, limit: float = 120.0) -> list:
    """Everything ``client`` received, waiting until nothing came for
    ``settle`` seconds (or not at all), for ``limit`` seconds at most."""
    out = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            out.append(client.messages.get(timeout=settle) if settle else
                       client.messages.get_nowait())
        except queue.Empty:
            return out
    raise AssertionError(f"{client.client_id} still receiving after {limit} s "
                         f"({len(out)} messages)")
