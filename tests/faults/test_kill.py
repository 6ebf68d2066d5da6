"""SIGKILL of the broker under QoS 1 load, at three points, for an online
and an offline persistent subscriber (and at two for an offline persistent
APPLICATION client): every message whose PUBACK the
publisher received arrives after the restarts (duplicates allowed, counted
and printed).  The broker runs with its defaults: SQLite with
``synchronous: FULL``.  (``tests/integration/test_restart.py`` covers a
SIGTERM and what a restart keeps; this is the crash.)

The kill points:

1. early in a stream, about 200 messages acknowledged;
2. in the middle of a stream, 3,000 acknowledged, the online subscriber
   behind;
3. right after a burst of 2,000 whose every PUBACK arrived, while the
   offline subscriber, back, is being sent its backlog (1,000 of it
   received).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import pytest

from tbmq.cluster.records import RUN_MAX_MESSAGES
from tests.faults.helpers import assert_clean_log
from tests.integration.conftest import _LIVE, _finish
from tests.integration.helpers import REPO_ROOT, Broker, PahoClient, uid
from tests.integration.test_flow_control import RawPublisher, Tags, describe_loss, drain_paho

pytestmark = pytest.mark.timeout(180)

PAYLOAD = 256
WINDOW = 100
SESSION_EXPIRY = 3600


def take_received(client: PahoClient, tags: Tags) -> None:
    """Move what ``client`` has received so far into ``tags``."""
    while not client.messages.empty():
        tags.add(client.messages.get_nowait().payload)


#: how a publisher's connection ends when the broker is killed
KILLED = ("ConnectionResetError", "BrokenPipeError", "ConnectionError")


def wait_acked(publisher: RawPublisher, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(publisher.acked) < count:
        assert publisher.error is None, publisher.error
        assert publisher.is_alive() or len(publisher.acked) >= count, \
            f"the publisher stopped at {len(publisher.acked)} acknowledged"
        assert time.monotonic() < deadline, f"{len(publisher.acked)} acknowledged in {timeout} s"
        time.sleep(0.005)



def start_publisher(broker, topic: str, publishers: list, count: int) -> RawPublisher:
    """Start publisher number ``len(publishers)`` of ``count`` QoS 1
    messages to ``<topic>/t`` (added to ``publishers``)."""
    p = RawPublisher(broker.port, 4, f"{topic}/t", len(publishers), count, PAYLOAD,
                     window=WINDOW, timeout=30)
    publishers.append(p)
    p.start()
    return p

def test_sigkill_under_qos1_load_loses_no_acknowledged_message(broker_factory):
    broker = broker_factory()
    topic = f"kill/{uid()}"
    online_id, offline_id = f"online-{uid()}", f"offline-{uid()}"
    offline = PahoClient(broker.port, 4, offline_id, clean_session=False).connect_and_wait()
    assert offline.subscribe(f"{topic}/#", 1) == [1]
    offline.disconnect()

    online_tags, offline_tags = Tags(), Tags()
    onlines = []

    def connect_online(clean_start: bool) -> PahoClient:
        client = PahoClient(broker.port, 5, online_id).connect_and_wait(
            clean_start=clean_start, session_expiry=SESSION_EXPIRY)
        onlines.append(client)
        return client

    online = connect_online(True)
    assert online.subscribe(f"{topic}/#", 1) == [1]
    publishers: list[RawPublisher] = []

    def publish(count: int) -> RawPublisher:
        return start_publisher(broker, topic, publishers, count)

    def kill_and_restart(point: str) -> None:
        acked = sum(len(p.acked) for p in publishers)
        broker.kill()  # SIGKILL
        for p in publishers:
            p.join(30)
            assert not p.is_alive(), f"publisher {p.index} still running after the kill"
        take_received(online, online_tags)
        print(f"killed {point}: {acked:,} acknowledged so far, the online subscriber has "
              f"{len(online_tags):,}, the offline one {len(offline_tags):,}")
        broker.start()

    try:
        # 1. early in a stream
        wait_acked(publish(1_000_000), 200)
        kill_and_restart("early in a stream")
        online = connect_online(False)
        assert online.session_present is True
        # 2. in the middle of a stream, the online subscriber behind
        wait_acked(publish(1_000_000), 3000)
        kill_and_restart("in the middle of a stream")
        online = connect_online(False)
        # 3. right after a burst, every PUBACK received, the offline
        # subscriber back and halfway through its backlog
        burst = publish(2000)
        burst.join(60)
        assert not burst.is_alive() and len(burst.acked) == 2000, (burst.error, len(burst.acked))
        offline = PahoClient(broker.port, 4, offline_id, clean_session=False).connect_and_wait()
        assert offline.session_present is True
        deadline = time.monotonic() + 30
        while len(offline_tags) < 1000 and time.monotonic() < deadline:
            take_received(offline, offline_tags)
            time.sleep(0.001)
        kill_and_restart("right after a burst, the offline subscriber receiving its backlog")
        take_received(offline, offline_tags)
        offline.close()
        online = connect_online(False)

        acked = {(p.index, seq) for p in publishers for seq in p.acked}
        offline = PahoClient(broker.port, 4, offline_id, clean_session=False).connect_and_wait()
        assert offline.session_present is True
        drain_paho(online, online_tags, lambda: acked <= online_tags.seen)
        drain_paho(offline, offline_tags, lambda: acked <= offline_tags.seen)
    finally:
        for client in onlines + [offline]:
            client.close()
    for p in publishers:
        assert p.error is None or p.error.split(":")[0] in KILLED, p.error
    print(f"{len(acked):,} messages acknowledged to the publishers; the online subscriber "
          f"received {len(online_tags):,} of them and {online_tags.duplicates:,} duplicates, "
          f"the offline one {len(offline_tags):,} and {offline_tags.duplicates:,} duplicates")
    assert acked <= online_tags.seen, describe_loss("the online subscriber", acked,
                                                     online_tags.seen)
    assert acked <= offline_tags.seen, describe_loss("the offline subscriber", acked,
                                                      offline_tags.seen)
    assert len(acked) >= 200 + 3000 + 2000
    broker.stop()
    assert_clean_log(broker)


def add_application_credentials(broker, client_id: str) -> None:
    """Basic credentials of client type APPLICATION for ``client_id`` (no
    password) in the credential store of ``broker``'s data dir, with the
    ``tbmq`` command, the broker stopped."""
    broker.data_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "tbmq.cli", "credentials", "add", "--data-dir", str(broker.data_dir),
                    "--type", "basic", "--name", client_id, "--client-id", client_id,
                    "--client-type", "APPLICATION"], check=True, cwd=REPO_ROOT, capture_output=True)


@pytest.mark.parametrize("live", [False, True], ids=["offline", "live"])
def test_sigkill_loses_nothing_acknowledged_for_an_application_client(tmp_path, live):
    """A persistent APPLICATION client (TBMQ: its messages in its own topic
    log, ``tbmq.msg.app.<clientId>``, not the device store; a routed batch's
    QoS 1 messages to it one record, a DeliveryRun) loses no acknowledged
    message to a SIGKILL in a stream published while it is offline, or
    while it is connected and receives it (``live``), nor to one while it
    receives its backlog."""
    app_id = f"app-{uid()}"
    topic = f"killapp/{uid()}"
    broker = Broker(tmp_path / "broker")
    add_application_credentials(broker, app_id)
    _LIVE.append(broker)
    publishers: list[RawPublisher] = []
    tags = Tags()
    app = None

    def connect_app(clean_start: bool) -> PahoClient:
        client = PahoClient(broker.port, 5, app_id)
        client.client.username_pw_set("app")
        return client.connect_and_wait(clean_start=clean_start, session_expiry=SESSION_EXPIRY)

    def publish(count: int) -> RawPublisher:
        return start_publisher(broker, topic, publishers, count)

    def kill_and_restart() -> None:
        broker.kill()  # SIGKILL
        for p in publishers:
            p.join(30)
            assert not p.is_alive(), f"publisher {p.index} still running after the kill"
        broker.start()

    try:
        broker.start()
        app = connect_app(True)
        assert app.subscribe(f"{topic}/#", 1) == [1]
        if not live:
            app.disconnect()
        # 1. in the middle of a stream, the APPLICATION client offline, or
        # receiving it
        wait_acked(publish(1_000_000), 3000)
        if live:
            take_received(app, tags)
            assert len(tags) > 0, "the live APPLICATION client received none of the stream"
        kill_and_restart()
        if live:
            take_received(app, tags)
            app.close()
        # 2. a burst, every PUBACK received, then the client back and
        # killed halfway through its backlog
        burst = publish(2000)
        burst.join(60)
        assert not burst.is_alive() and len(burst.acked) == 2000, (burst.error, len(burst.acked))
        app = connect_app(False)
        assert app.session_present is True
        deadline = time.monotonic() + 30
        while len(tags) < 1000 and time.monotonic() < deadline:
            take_received(app, tags)
            time.sleep(0.001)
        assert len(tags) >= 1000, f"{len(tags)} of the backlog received in 30 s"
        kill_and_restart()
        take_received(app, tags)
        app.close()
        acked = {(p.index, seq) for p in publishers for seq in p.acked}
        app = connect_app(False)
        assert app.session_present is True
        drain_paho(app, tags, lambda: acked <= tags.seen)
    finally:
        if app is not None:
            app.close()
        _finish(broker)
    for p in publishers:
        assert p.error is None or p.error.split(":")[0] in KILLED, p.error
    print(f"{len(acked):,} messages acknowledged; the APPLICATION client received {len(tags):,} "
          f"of them and {tags.duplicates:,} duplicates")
    assert acked <= tags.seen, describe_loss("the APPLICATION client", acked, tags.seen)
    assert len(acked) >= 3000 + 2000
    # its messages went through its own topic log, as an APPLICATION client's, not the device store
    offsets, deliveries = app_topic_and_deliveries(broker.data_dir, app_id)
    # a record carries at most RUN_MAX_MESSAGES of them (a DeliveryRun)
    assert offsets * RUN_MAX_MESSAGES >= len(acked), offsets
    assert deliveries == 0


def app_topic_and_deliveries(data_dir, client_id: str) -> tuple[int, int]:
    """:returns: (the highest committed offset of the topic
        ``tbmq.msg.app.<client_id>`` in the store files of ``data_dir``, the
        rows of ``client_id`` in the device store's table), the broker
        stopped."""
    offsets = deliveries = 0
    for path in data_dir.glob("*.sqlite3"):
        conn = sqlite3.connect(path)
        try:
            tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "topic_log_offsets" in tables:
                (n,) = conn.execute("SELECT coalesce(max(next_offset), 0) FROM topic_log_offsets WHERE topic = ?",
                                    (f"tbmq.msg.app.{client_id}",)).fetchone()
                offsets = max(offsets, n)
            if "deliveries" in tables:
                (n,) = conn.execute("SELECT count(*) FROM deliveries WHERE client_id = ?", (client_id,)).fetchone()
                deliveries += n
        finally:
            conn.close()
    return offsets, deliveries
