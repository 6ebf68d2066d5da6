"""The pure transforms on small hand-made inputs (tests/analytics/helpers.py)
against hand-computed results."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from tbmq.analytics import transforms as T
from tests.analytics.helpers import AUTH, SESSIONS, T0, TRAFFIC, at, events_frame, rec

TRAFFIC_COLS = "messages_in long, bytes_in long, messages_out long, bytes_out long"


@pytest.fixture(scope="module")
def traffic(spark):
    return events_frame(spark, TRAFFIC).cache()


@pytest.fixture(scope="module")
def sessions(spark):
    return events_frame(spark, SESSIONS).cache()


@pytest.fixture(scope="module")
def auth(spark):
    return events_frame(spark, AUTH).cache()


def test_topic_rollup(spark):
    df = spark.createDataFrame([("a/b/c",), ("/a/b",), ("a",)], "topic string")
    got = df.select("topic", T.topic_rollup("topic", 1).alias("l1"),
                    T.topic_rollup(F.col("topic"), 2).alias("l2"),
                    T.topic_rollup("topic", 5).alias("l5"))
    expected = spark.createDataFrame(
        [("a/b/c", "a", "a/b", "a/b/c"), ("/a/b", "", "/a", "/a/b"), ("a", "a", "a", "a")],
        "topic string, l1 string, l2 string, l5 string")
    assertDataFrameEqual(got, expected)


def test_traffic_by_topic(spark, traffic):
    expected = spark.createDataFrame(
        [("s1/d1/t", 2, 30, 3, 40), ("s2/d2/t", 2, 107, 1, 100), ("s1/d1/rpc", 1, 5, 1, 5)],
        f"topic string, {TRAFFIC_COLS}")
    assertDataFrameEqual(T.traffic_by_topic(traffic), expected, checkRowOrder=True)


def test_traffic_by_rollup(spark, traffic):
    expected = spark.createDataFrame(
        [(1, "s1", 3, 35, 4, 45), (1, "s2", 2, 107, 1, 100),
         (2, "s1/d1", 3, 35, 4, 45), (2, "s2/d2", 2, 107, 1, 100)],
        f"levels int, topic_prefix string, {TRAFFIC_COLS}")
    assertDataFrameEqual(T.traffic_by_rollup(traffic, (1, 2)), expected, checkRowOrder=True)


def test_traffic_by_client(spark, traffic):
    expected = spark.createDataFrame(
        [("d1", "DEVICE", 2, 30, 1, 5), ("d2", "DEVICE", 2, 107, 0, 0),
         ("a1", "APPLICATION", 1, 5, 3, 130), ("a2", "APPLICATION", 0, 0, 1, 10)],
        f"client_id string, client_type string, {TRAFFIC_COLS}")
    assertDataFrameEqual(T.traffic_by_client(traffic), expected, checkRowOrder=True)


def test_traffic_by_client_type(spark, traffic):
    expected = spark.createDataFrame(
        [("APPLICATION", 2, 1, 5, 4, 140), ("DEVICE", 2, 4, 137, 1, 5)],
        f"client_type string, clients long, {TRAFFIC_COLS}")
    assertDataFrameEqual(T.traffic_by_client_type(traffic), expected)


def test_will_messages_have_an_unknown_client_type(spark):
    events = events_frame(spark, [rec("publish", 0, client_id="gone", topic="w", qos=0,
                                      bytes=3, msg_id="w1", will=True)])
    expected = spark.createDataFrame([("UNKNOWN", 1, 1, 3, 0, 0)],
                                     f"client_type string, clients long, {TRAFFIC_COLS}")
    assertDataFrameEqual(T.traffic_by_client_type(events), expected)


def test_throughput_per_minute_and_hour(spark, traffic):
    schema = f"period timestamp, {TRAFFIC_COLS}"
    minute = spark.createDataFrame(
        [(at(0), 2, 30, 3, 40), (at(60000), 2, 107, 1, 100), (at(3600000), 1, 5, 1, 5)], schema)
    hour = spark.createDataFrame([(at(0), 4, 137, 4, 140), (at(3600000), 1, 5, 1, 5)], schema)
    assertDataFrameEqual(T.throughput(traffic, "minute"), minute, checkRowOrder=True)
    assertDataFrameEqual(T.throughput(traffic, "hour"), hour, checkRowOrder=True)
    with pytest.raises(ValueError):
        T.throughput(traffic, "day")


MINUTE, HOUR, DAY = 60000, 3600000, 86400000


@pytest.mark.parametrize("span_ms, bucket", [
    (0, ("1 s", 1000)),                       # one instant
    (3 * MINUTE, ("1 s", 1000)),              # minutes: seconds
    (10 * MINUTE, ("5 s", 5000)),
    (HOUR, ("30 s", 30000)),                  # an hour: half minutes (15 s: 241 buckets)
    (6 * HOUR, ("2 min", 120000)),            # hours: minutes
    (DAY, ("10 min", 600000)),
    (7 * DAY, ("1 h", 3600000)),              # days: hours
    (1826 * DAY, ("30 days", 2592000000)),    # five years: months, not 1826 points
    (1000 * 365 * DAY, ("365 days", 31536000000)),  # beyond: the longest bucket
])
def test_time_bucket(span_ms, bucket):
    assert T.time_bucket(span_ms) == bucket


def test_time_bucket_is_the_shortest_within_the_points():
    lengths = [length for _, length in T.TIME_BUCKETS]
    for span in (1, 999, 1000, 239999, 240000, 5 * HOUR + 7, 40 * DAY, 3 * 365 * DAY):
        _, length = T.time_bucket(span)
        assert span // length + 1 <= T.TIMELINE_POINTS
        shorter = lengths[:lengths.index(length)]
        assert all(span // s + 1 > T.TIMELINE_POINTS for s in shorter), span
    assert T.time_bucket(HOUR, points=2) == ("1 h", HOUR)
    with pytest.raises(ValueError):
        T.time_bucket(-1)
    with pytest.raises(ValueError):
        T.time_bucket(HOUR, points=0)


def test_throughput_timeline(spark, traffic):
    # TRAFFIC spans T0 .. T0 + 3,620,000 ms: 61 one-minute buckets, 58 empty
    got = (T.throughput_timeline(traffic, MINUTE, T0, T0 + 3620000)
           .withColumn("start_ms", F.unix_millis("period")).collect())
    assert len(got) == 61 and {r.bucket_s for r in got} == {60}
    assert [r.start_ms for r in got] == [T0 + i * MINUTE for i in range(61)]
    busy = {i: (r.messages_in, r.bytes_in, r.messages_out, r.bytes_out)
            for i, r in enumerate(got) if r.messages_in or r.messages_out}
    assert busy == {0: (2, 30, 3, 40), 1: (2, 107, 1, 100), 60: (1, 5, 1, 5)}
    assert all(r.bytes_in == r.bytes_out == 0 for i, r in enumerate(got) if i not in busy)
    # the bucket chosen for that span: 30 s, 121 buckets
    label, length = T.time_bucket(3620000)
    assert (label, T.throughput_timeline(traffic, length, T0, T0 + 3620000).count()) == ("30 s", 121)


def test_throughput_peaks(spark, traffic):
    peaks = T.throughput_peaks(T.throughput(traffic, "minute"), T.throughput(traffic, "hour"))
    expected = spark.createDataFrame(
        [("minute", "in", 2, at(0), 1.667, 0.033, 3),  # tie with 00:01: the first wins
         ("minute", "out", 3, at(0), 1.667, 0.05, 3),
         ("hour", "in", 4, at(0), 2.5, 0.001, 2),
         ("hour", "out", 4, at(0), 2.5, 0.001, 2)],
        "unit string, direction string, peak_messages long, peak_period timestamp, "
        "mean_messages double, peak_per_second double, periods long")
    assertDataFrameEqual(peaks, expected)


LATENCY_COLS = ("deliveries long, p50_ms double, p95_ms double, p99_ms double, "
                "mean_ms double, max_ms double")


def test_latency_by_rollup_excludes_retained(spark, traffic):
    # s1: 1, 3, 2, 4 ms (nearest rank: p50 = 2); s2's only delivery is retained
    expected = spark.createDataFrame([("s1", 4, 2.0, 4.0, 4.0, 2.5, 4.0)],
                                     f"topic_prefix string, {LATENCY_COLS}")
    assertDataFrameEqual(T.latency_by_rollup(traffic, 1), expected)


def test_latency_by_node(spark, traffic):
    expected = spark.createDataFrame(
        [("n1", 3, 2.0, 4.0, 4.0, 2.333, 4.0), ("n2", 1, 3.0, 3.0, 3.0, 3.0, 3.0)],
        f"node string, {LATENCY_COLS}")
    assertDataFrameEqual(T.latency_by_node(traffic), expected, checkRowOrder=True)


def test_latency_percentiles_on_a_hundred_values(spark):
    records = [rec("deliver", i, client_id="c", client_type="DEVICE", topic="t", qos=0,
                   bytes=1, msg_id=f"m{i}", latency_ms=float(i)) for i in range(1, 101)]
    got = T.latency_by_node(events_frame(spark, records))
    expected = spark.createDataFrame([("n1", 100, 50.0, 95.0, 99.0, 50.5, 100.0)],
                                     f"node string, {LATENCY_COLS}")
    assertDataFrameEqual(got, expected)


def test_qos_mix(spark, traffic):
    expected = spark.createDataFrame(
        [("in", 0, False, 2, 0.4), ("in", 1, False, 1, 0.2), ("in", 1, True, 1, 0.2),
         ("in", 2, False, 1, 0.2),
         ("out", 0, False, 2, 0.4), ("out", 1, False, 1, 0.2), ("out", 1, True, 1, 0.2),
         ("out", 2, False, 1, 0.2)],
        "direction string, qos int, retain boolean, messages long, share double")
    assertDataFrameEqual(T.qos_mix(traffic), expected, checkRowOrder=True)


def test_fanout(spark, traffic):
    # m1 → 2 deliveries, m2, m3, m4 → 1, m5 → none (its drop is not a delivery)
    expected = spark.createDataFrame([(0, 1), (1, 3), (2, 1)], "fanout long, messages long")
    assertDataFrameEqual(T.fanout(traffic), expected, checkRowOrder=True)


def test_session_durations(spark, sessions):
    expected = spark.createDataFrame(
        [("APPLICATION", 1, 7200.0, 7200.0, 7200.0, 7200.0),
         ("DEVICE", 3, 41.833, 5.0, 120.0, 120.0)],
        "client_type string, sessions long, mean_s double, p50_s double, p95_s double, "
        "max_s double")
    assertDataFrameEqual(T.session_durations(sessions), expected, checkRowOrder=True)


def test_session_duration_histogram(spark, sessions):
    expected = spark.createDataFrame(
        [("< 1 s", 1.0, 1), ("1-10 s", 10.0, 1), ("10-60 s", 60.0, 0), ("1-10 min", 600.0, 1),
         ("10-60 min", 3600.0, 0), ("1-24 h", 86400.0, 1), (">= 24 h", None, 0)],
        "bucket string, upper_s double, sessions long")
    assertDataFrameEqual(T.session_duration_histogram(sessions), expected, checkRowOrder=True)


def test_disconnect_reasons(spark, sessions):
    expected = spark.createDataFrame(
        [(0, "normal disconnection", 2), (None, "connection lost", 1),
         (0x8D, "keep alive timeout", 1), (0x8E, "session taken over", 1)],
        "reason_code int, reason string, disconnects long")
    assertDataFrameEqual(T.disconnect_reasons(sessions), expected)


def test_disconnect_reason_without_a_name(spark):
    events = events_frame(spark, [rec("disconnect", 0, client_id="c", reason_code=0x42)])
    expected = spark.createDataFrame([(0x42, "0x42", 1)],
                                     "reason_code int, reason string, disconnects long")
    assertDataFrameEqual(T.disconnect_reasons(events), expected)


def test_reconnect_storms(spark, sessions):
    # d1: 4 connects in [0, 10 min) > 3; d2: 2 connects
    expected = spark.createDataFrame([("d1", 4, at(0), 5)],
                                     "client_id string, max_connects long, "
                                     "window_start timestamp, total_connects long")
    assertDataFrameEqual(T.reconnect_storms(sessions, connects=3, minutes=10), expected)
    # a window of 1 minute holds one connect only (the next one is 60 s later)
    assert T.reconnect_storms(sessions, connects=1, minutes=1).count() == 0
    # the window is half open: 2 minutes hold the connects at 0 and 60 s, not 120 s
    two = T.reconnect_storms(sessions, connects=1, minutes=2).collect()
    assert [(r.client_id, r.max_connects) for r in two] == [("d1", 2)]


def test_auth_failures_by_address(spark, auth):
    expected = spark.createDataFrame(
        [("203.0.113.1", 4, 3, at(1000), at(4000), True),
         ("192.0.2.5", 1, 1, at(5000), at(5000), False)],
        "address string, failures long, distinct_client_ids long, first_seen timestamp, "
        "last_seen timestamp, flagged boolean")
    assertDataFrameEqual(T.auth_failures_by_address(auth, threshold=3), expected,
                         checkRowOrder=True)


def test_auth_failures_by_client(spark, auth):
    expected = spark.createDataFrame(
        [("x", 3, 2, at(1000), at(5000), False), ("y", 1, 1, at(2000), at(2000), False),
         ("z", 1, 1, at(4000), at(4000), False)],
        "client_id string, failures long, distinct_addresses long, first_seen timestamp, "
        "last_seen timestamp, flagged boolean")
    assertDataFrameEqual(T.auth_failures_by_client(auth, threshold=3), expected,
                         checkRowOrder=True)
    flagged = T.auth_failures_by_client(auth, threshold=2).where("flagged").collect()
    assert [r.client_id for r in flagged] == ["x"]


def test_drops_by_reason(spark, traffic):
    expected = spark.createDataFrame(
        [("session_ended", 1, 0, 1), ("slow_consumer", 1, 20, 1)],
        "reason string, messages long, bytes long, clients long")
    assertDataFrameEqual(T.drops_by_reason(traffic), expected, checkRowOrder=True)


def test_summary(spark, traffic):
    bad = spark.createDataFrame([("corrupt", "{")], "reason string, sample string")
    got = {r.metric: r.value for r in T.summary(traffic, bad).collect()}
    assert got == {
        "events": 12, "events_connect": 0, "events_disconnect": 0, "events_subscribe": 0,
        "events_unsubscribe": 0, "events_publish": 5, "events_deliver": 5, "events_drop": 2,
        "events_auth_fail": 0, "clients": 5, "topics": 3, "messages_in": 5, "bytes_in": 142,
        "messages_out": 5, "bytes_out": 145, "first_ts": 1704067200000,
        "last_ts": 1704067200000 + 3620000, "bad_records": 1,
    }


def test_empty_input(spark):
    events = events_frame(spark, [])
    assert T.traffic_by_topic(events).count() == 0
    assert T.fanout(events).count() == 0
    assert T.session_duration_histogram(events).where("sessions > 0").count() == 0
    got = {r.metric: r.value for r in T.summary(events, events.select(
        F.lit("x").alias("reason")).limit(0)).collect()}
    assert got["events"] == 0 and "first_ts" not in got
