"""20,000 mutated packet sequences over live sockets (:mod:`tests.faults.fuzz`)
while a well-behaved client exchanges QoS 1 messages: the broker never dies,
never logs an unhandled error, keeps its memory, and the good client's round
trips stay short."""

from __future__ import annotations

import pytest

from tests.faults.helpers import Hostile, RoundTrips, assert_clean_log, assert_round_trips, rss_kb

pytestmark = pytest.mark.timeout(240)

CASES = 20_000

#: seconds any one round trip of the good client may take while the fuzzer
#: runs (they take about 2 ms, 0.3 s at worst, on a loaded 2-core machine)
ROUND_TRIP_BOUND = 2.0

#: KiB the broker may grow by (about 12 MB measured: sessions, retained
#: messages and wills the fuzzer leaves, within their limits)
RSS_GROWTH_KB = 100 * 1024


def test_fuzzed_packets_over_live_sockets(broker_factory):
    broker = broker_factory(env={"TBMQ_MQTT__CONNECT_TIMEOUT": "2"})
    rtt = RoundTrips(broker.port)
    before = rss_kb(broker.proc.pid)
    rtt.start()
    fuzzer = Hostile("fuzz", "--port", str(broker.port), "--cases", str(CASES), "--seed", "12")
    try:
        report = fuzzer.report(timeout=200)
    finally:
        fuzzer.kill()
        stats = rtt.finish()
    print(f"fuzz: {report}; good client's round trips: {stats}")
    assert report["cases"] >= CASES, report
    assert broker.running, broker.log()[-5000:]
    assert_round_trips(rtt, stats, ROUND_TRIP_BOUND)
    grown = rss_kb(broker.proc.pid) - before
    assert grown < RSS_GROWTH_KB, f"the broker grew by {grown} KiB"
    # the broker answered: most cases were closed by it, some accepted
    assert report["outcomes"]["closed"] > CASES // 2, report
    assert report["connack"].get("0", 0) > 0, report
    broker.stop()
    assert_clean_log(broker)
