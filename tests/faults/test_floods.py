"""Floods against a real ``twistd -n tbmq``, a good client served throughout:

* 3,000 connections that never send CONNECT, each closed by the connect
  timeout;
* 500 sockets sending wrong passwords (issue 12, item 9), from the good
  client's own address: the good client connects in under a second;
* connections announcing 256 MB and 1 MB packets before CONNECT (item 10):
  each closed at once, the broker's memory unchanged;
* subscribers that never read while publishers send 82 MB to them: the
  broker's memory stays bounded.

The hostile clients run in processes of their own (:mod:`tests.faults.flood`).
"""

from __future__ import annotations

import collections
import selectors
import socket
import time

import pytest

from tbmq.mqtt import Connect
from tests.faults.helpers import (
    Hostile, RoundTrips, assert_clean_log, assert_round_trips, raise_fd_limit, rss_kb,
)
from tests.integration.helpers import HOST, PahoClient, RawClient, uid
from tests.integration.test_auth_e2e import cli
from tests.integration.test_flow_control import RawPublisher, RssWatch, StuckSubscriber

pytestmark = pytest.mark.timeout(120)

#: seconds a round trip of the good client may take during a flood
ROUND_TRIP_BOUND = 2.0


# -- connections that never send CONNECT -------------------------------------------------

IDLE_CONNECTIONS = 3000
CONNECT_TIMEOUT = 2.0


def test_connections_that_never_send_connect_are_closed_by_the_connect_timeout(broker_factory):
    raise_fd_limit(IDLE_CONNECTIONS + 1000)
    broker = broker_factory(env={"TBMQ_MQTT__CONNECT_TIMEOUT": str(CONNECT_TIMEOUT)})
    rtt = RoundTrips(broker.port)
    rtt.start()
    selector = selectors.DefaultSelector()
    opened: dict[socket.socket, float] = {}
    closed_after: list[float] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            sock = socket.create_connection((HOST, broker.port), timeout=10)
            sock.setblocking(False)
            opened[sock] = time.monotonic()
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + CONNECT_TIMEOUT + 30
        while len(closed_after) < IDLE_CONNECTIONS and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.5):
                sock = key.fileobj
                try:
                    data = sock.recv(1024)
                except OSError:  # reset: closed as well
                    data = b""
                assert data == b"", f"the broker sent {data!r} to a connection without CONNECT"
                closed_after.append(time.monotonic() - opened[sock])
                selector.unregister(sock)
                sock.close()
    finally:
        stats = rtt.finish()
        for sock in list(opened):
            sock.close()
        selector.close()
    print(f"{len(closed_after)} idle connections closed after {min(closed_after):.2f} to "
          f"{max(closed_after):.2f} s; good client's round trips: {stats}")
    assert len(closed_after) == IDLE_CONNECTIONS, f"{len(closed_after)} closed by the broker"
    assert min(closed_after) >= CONNECT_TIMEOUT - 0.1, "closed before the connect timeout"
    assert_round_trips(rtt, stats, ROUND_TRIP_BOUND)
    broker.stop()
    log = broker.log()
    assert_clean_log(broker)
    # a line per connection at most 20 times in 10 s (then one line counts them)
    assert 1 <= log.count("no CONNECT from 127.0.0.1 in 2 s") <= 20, log.count("no CONNECT")


# -- a wrong-password flood (item 9) -----------------------------------------------------

FLOOD_SOCKETS = 500
#: seconds a good client may take to connect during the flood
CONNECT_BOUND = 1.0


def good_connect(port: int, client_id: str) -> float:
    """Connect with the right password; :returns: the seconds CONNACK took."""
    start = time.monotonic()
    client = RawClient(port, level=4, timeout=15)
    try:
        client.send(Connect(client_id=client_id, protocol_level=4, username="app",
                            password=b"apppw"))
        ack = client.expect(timeout=15)
    finally:
        client.close()
    took = time.monotonic() - start
    assert ack.reason_code == 0, f"{client_id}: CONNACK {ack.reason_code:#x} after {took:.2f} s"
    return took


def connect_times_during(broker, flood: Hostile, client_ids) -> list[float]:
    """Connect each client in turn during the flood (1 s after it started,
    0.3 s apart); :returns: the seconds each CONNACK took."""
    flood.wait_started()
    time.sleep(1.0)  # the flood in full swing
    times = []
    for client_id in client_ids:
        times.append(good_connect(broker.port, client_id))
        time.sleep(0.3)
    assert flood.proc.poll() is None, f"the flood ended before the good clients were done: {times}"
    return times


def test_a_good_client_connects_within_a_second_during_a_wrong_password_flood(broker_factory):
    """500 sockets on 127.0.0.1 send wrong passwords for ``dev`` as fast as
    they are answered (today's main: a good client needs 9 s or is closed
    unanswered at 10 s).  A new good client from the same address connects
    within a second each time: the flood's user name failed, so it may hold
    one of the address's two places of check and gets 0x03 at once beyond
    (0x05 once the address is over its budget), while the other place is
    kept for names without failures.  Then a flood that
    changes its user name every attempt (it cannot be told from new
    clients before their check): a client that logged in before is trusted
    at the address and still connects within a second."""
    broker = broker_factory(env={"TBMQ_AUTH__ALLOW_ANONYMOUS": "false",
                                 "TBMQ_STORAGE__BACKEND": "memory"})
    broker.stop()
    cli(broker.data_dir, "add", "--type", "basic", "--name", "dev", "--username", "dev",
        "--password", "right")
    cli(broker.data_dir, "add", "--type", "basic", "--name", "app", "--username", "app",
        "--password", "apppw")
    broker.start()
    rtt = RoundTrips(broker.port, credentials=("app", "apppw"))
    trusted = f"trusted-{uid()}"
    good_connect(broker.port, trusted)
    rtt.start()
    try:
        flood = Hostile("flood", "--port", str(broker.port), "--sockets", str(FLOOD_SOCKETS),
                        "--duration", "8", "login", "--username", "dev")
        fresh = connect_times_during(broker, flood, [f"good-{i}-{uid()}" for i in range(5)])
        same_name = flood.report()
        flood = Hostile("flood", "--port", str(broker.port), "--sockets", str(FLOOD_SOCKETS),
                        "--duration", "8", "login", "--username", "*")
        known = connect_times_during(broker, flood, [trusted] * 5)
        new_names = flood.report()
    finally:
        stats = rtt.finish()
    print(f"good clients' connect times during the flood of user dev: {fresh}; "
          f"flood: {same_name}")
    print(f"a trusted client's connect times during the flood of new user names: {known}; "
          f"flood: {new_names}")
    print(f"good client's round trips: {stats}")
    assert max(fresh) < CONNECT_BOUND, fresh
    assert max(known) < CONNECT_BOUND, known
    assert_round_trips(rtt, stats, ROUND_TRIP_BOUND)
    # every attempt answered; at most the address's budget of them checked
    # (0x04), the rest at once: 0x05 once banned, 0x03 while the one place
    # a failed user name may hold is taken
    for report in (same_name, new_names):
        codes = collections.Counter({int(k): v for k, v in report["codes"].items()})
        assert report["attempts"] == sum(codes.values()) > FLOOD_SOCKETS, report
        assert report["open_at_end"] == report["closed"] == 0, report
    assert same_name["codes"].get("4", 0) <= 20 + 2, same_name
    assert new_names["codes"]["3"] > 0.8 * new_names["attempts"], new_names
    broker.stop()
    log = broker.log()
    assert_clean_log(broker)
    assert "logins refused without a password check in the last 10 s" in log
    assert "no CONNECT" not in log


# -- announcements of large packets before CONNECT (item 10) -----------------------------

#: KiB the broker may grow by while 20,000 announcing connections come and
#: go (20 to 30 MB measured: connection objects, reads of 64 KB); the 64
#: announced packets of 1,000,000 bytes buffered would pass it
ANNOUNCE_RSS_GROWTH_KB = 64 * 1024


def test_announcements_of_large_packets_before_connect_are_closed_unread(broker_factory):
    """64 sockets announce a 256 MB packet and 64 a 1,000,000-byte one
    (under ``mqtt.max_packet_size``, over ``mqtt.max_connect_packet_size``),
    then send its bytes at 400 KB/s, reconnecting whenever the broker
    closes them: each is closed as soon as its fixed header is read, the
    broker's memory does not grow, and the good client is served.  (On
    today's main the 64 connections announcing 1,000,000 bytes stay open,
    each buffering what it sent: 64 MB to 142 MB of RSS in 5 s.)"""
    broker = broker_factory()
    rtt = RoundTrips(broker.port)
    watch = RssWatch(broker.proc.pid)
    before = rss_kb(broker.proc.pid)
    rtt.start()
    watch.start()
    try:
        huge = Hostile("flood", "--port", str(broker.port), "--sockets", "64", "--duration", "5",
                       "announce")
        large = Hostile("flood", "--port", str(broker.port), "--sockets", "64", "--duration", "5",
                        "announce", "--length", "1000000")
        reports = [huge.report(), large.report()]
    finally:
        watch.stop.set()
        watch.join()
        stats = rtt.finish()
    print(f"256 MB and 1 MB announcements: {reports}; the broker's RSS "
          f"{before} KiB before, {watch.peak_kb} KiB at most; round trips: {stats}")
    for report in reports:
        # each connection lived a short while: many per socket, none left open
        assert report["attempts"] > 64 * 10 and report["open_at_end"] == 0, report
        assert report["closed"] == report["attempts"], report
    assert watch.peak_kb - before < ANNOUNCE_RSS_GROWTH_KB, (before, watch.peak_kb)
    assert_round_trips(rtt, stats, ROUND_TRIP_BOUND)
    broker.stop()
    assert_clean_log(broker)
    assert "exceeds the maximum CONNECT size 65536" in broker.log()


# -- a stuck subscriber under load ---------------------------------------------------------

STUCK_PUBLISHERS = 2
STUCK_MESSAGES = 20_000
STUCK_PAYLOAD = 4096  # 82 MB in all
#: KiB the broker may grow by: what the default limits let it hold for the
#: two stuck subscribers (mqtt.max_pending_bytes 16 MB and the 4 MB outbound
#: buffer for one; mqtt.max_queued_messages 10,000 x 4 KB in memory for the
#: persistent one, the rest in its store), about 61 MB, times 2 for
#: Python's overhead (42 MB measured); 82 MB are published to each, so a
#: broker that kept them all would pass it
STUCK_RSS_GROWTH_KB = 120 * 1024


def test_a_subscriber_that_never_reads_under_load_keeps_the_broker_bounded(broker_factory):
    broker = broker_factory()
    topic = f"stuck/{uid()}"
    stuck = StuckSubscriber(broker.port, 4, f"{topic}/#")
    persistent = PahoClient(broker.port, 5, f"stuck-p-{uid()}").connect_and_wait(
        clean_start=True, session_expiry=600)
    assert persistent.subscribe(f"{topic}/#", 1) == [1]
    persistent.stop_loop()  # connected, never reads again
    rtt = RoundTrips(broker.port)
    watch = RssWatch(broker.proc.pid)
    before = rss_kb(broker.proc.pid)
    publishers = [RawPublisher(broker.port, 4, f"{topic}/t", i, STUCK_MESSAGES // 2,
                               STUCK_PAYLOAD, window=100, timeout=90)
                  for i in range(STUCK_PUBLISHERS)]
    rtt.start()
    watch.start()
    try:
        for p in publishers:
            p.start()
        for p in publishers:
            p.join(100)
    finally:
        watch.stop.set()
        watch.join()
        stats = rtt.finish()
        stuck.close()
        persistent.close()
    acked = sum(len(p.acked) for p in publishers)
    published_mb = STUCK_MESSAGES * STUCK_PAYLOAD / 1e6
    print(f"{acked:,} of {STUCK_MESSAGES:,} messages ({published_mb:.0f} MB) acknowledged "
          f"with two subscribers stuck; the broker's RSS {before} KiB before, "
          f"{watch.peak_kb} KiB at most; round trips: {stats}")
    assert all(p.error is None and not p.is_alive() for p in publishers), \
        [(p.error, p.sent, len(p.acked)) for p in publishers]
    assert acked == STUCK_MESSAGES
    assert watch.peak_kb - before < STUCK_RSS_GROWTH_KB, (before, watch.peak_kb)
    assert_round_trips(rtt, stats, ROUND_TRIP_BOUND)
    broker.stop()
    assert_clean_log(broker)
