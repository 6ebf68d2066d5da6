"""Pure transforms: each takes the valid events of
:func:`tbmq.analytics.reading.prepare` (and parameters) and returns one
table as a lazy DataFrame.  No I/O, no session state: they are tested on
small hand-made inputs.

Conventions: *in* is what publishers sent (``publish`` records), *out* what
subscribers received (``deliver`` records); bytes are payload bytes; times
are UTC; latencies are milliseconds; percentiles are nearest-rank
(``percentile_approx`` with a high accuracy, exact on small inputs).
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from tbmq.analytics.schema import DISCONNECT_REASONS, EVENT_TYPES

__all__ = [
    "DURATION_BUCKETS",
    "PERCENTILE_ACCURACY",
    "TIME_BUCKETS",
    "TIMELINE_POINTS",
    "auth_failures_by_address",
    "auth_failures_by_client",
    "disconnect_reasons",
    "drops_by_reason",
    "fanout",
    "latency_by_node",
    "latency_by_rollup",
    "qos_mix",
    "reconnect_storms",
    "session_duration_histogram",
    "session_durations",
    "summary",
    "throughput",
    "throughput_peaks",
    "throughput_timeline",
    "time_bucket",
    "topic_rollup",
    "traffic_by_client",
    "traffic_by_client_type",
    "traffic_by_rollup",
    "traffic_by_topic",
]

#: accuracy of ``percentile_approx`` (relative error 1/accuracy)
PERCENTILE_ACCURACY = 100000

#: session duration buckets: (label, upper bound in seconds, exclusive)
DURATION_BUCKETS = (
    ("< 1 s", 1), ("1-10 s", 10), ("10-60 s", 60), ("1-10 min", 600),
    ("10-60 min", 3600), ("1-24 h", 86400), (">= 24 h", None),
)

#: the buckets of the throughput timeline: (label, length in milliseconds)
TIME_BUCKETS = (
    ("1 s", 1000), ("5 s", 5000), ("10 s", 10000), ("15 s", 15000), ("30 s", 30000),
    ("1 min", 60000), ("2 min", 120000), ("5 min", 300000), ("10 min", 600000),
    ("15 min", 900000), ("30 min", 1800000), ("1 h", 3600000), ("2 h", 7200000),
    ("3 h", 10800000), ("6 h", 21600000), ("12 h", 43200000), ("1 day", 86400000),
    ("7 days", 604800000), ("30 days", 2592000000), ("365 days", 31536000000),
)

#: the most buckets the throughput timeline spans (unless the log spans
#: more than that many years)
TIMELINE_POINTS = 240

_UNKNOWN = "UNKNOWN"


def topic_rollup(topic: Column | str, levels: int) -> Column:
    """The first ``levels`` levels of a topic name (``a/b/c`` at 2 → ``a/b``).

    :param topic: a topic name column (or its name).
    :param levels: number of levels kept, >= 1.
    """
    col = F.col(topic) if isinstance(topic, str) else topic
    return F.array_join(F.slice(F.split(col, "/", -1), 1, levels), "/")


def _flows(events: DataFrame) -> DataFrame:
    """publish and deliver records with a direction (``in``/``out``)."""
    return (events.where(F.col("type").isin("publish", "deliver"))
            .select("topic", "client_id", "client_type", "bytes", "qos", "retain", "time",
                    "msg_id",
                    F.when(F.col("type") == "publish", F.lit("in")).otherwise(F.lit("out"))
                    .alias("direction")))


def _traffic_metrics() -> list[Column]:
    is_in = F.col("direction") == "in"
    is_out = F.col("direction") == "out"
    return [
        F.count(F.when(is_in, 1)).alias("messages_in"),
        F.coalesce(F.sum(F.when(is_in, F.col("bytes"))), F.lit(0)).cast("long").alias("bytes_in"),
        F.count(F.when(is_out, 1)).alias("messages_out"),
        F.coalesce(F.sum(F.when(is_out, F.col("bytes"))), F.lit(0)).cast("long").alias("bytes_out"),
    ]


def traffic_by_topic(events: DataFrame) -> DataFrame:
    """Messages and bytes in and out per topic name.

    :returns: ``topic, messages_in, bytes_in, messages_out, bytes_out``,
        most messages in first.
    """
    return (_flows(events).groupBy("topic").agg(*_traffic_metrics())
            .orderBy(F.desc("messages_in"), F.desc("messages_out"), "topic"))


def traffic_by_rollup(events: DataFrame, levels: Iterable[int] = (1, 2)) -> DataFrame:
    """Traffic rolled up to the first N topic levels, for each N of
    ``levels``.

    :returns: ``levels, topic_prefix, messages_in, bytes_in, messages_out,
        bytes_out``.
    """
    flows = _flows(events)
    parts = [flows.withColumn("levels", F.lit(int(n))).withColumn(
        "topic_prefix", topic_rollup("topic", int(n))) for n in levels]
    df = parts[0]
    for part in parts[1:]:
        df = df.unionByName(part)
    return (df.groupBy("levels", "topic_prefix").agg(*_traffic_metrics())
            .orderBy("levels", F.desc("messages_in"), F.desc("messages_out"), "topic_prefix"))


def traffic_by_client(events: DataFrame) -> DataFrame:
    """Per client: messages and bytes it published (in) and received (out).

    :returns: ``client_id, client_type, messages_in, bytes_in,
        messages_out, bytes_out`` (``client_type`` UNKNOWN for will messages).
    """
    return (_flows(events)
            .withColumn("client_type", F.coalesce("client_type", F.lit(_UNKNOWN)))
            .groupBy("client_id", "client_type").agg(*_traffic_metrics())
            .orderBy(F.desc("messages_in"), F.desc("messages_out"), "client_id"))


def traffic_by_client_type(events: DataFrame) -> DataFrame:
    """Per client type (DEVICE, APPLICATION): clients seen in the traffic and
    their messages and bytes in and out.

    :returns: ``client_type, clients, messages_in, bytes_in, messages_out,
        bytes_out``.
    """
    return (_flows(events)
            .withColumn("client_type", F.coalesce("client_type", F.lit(_UNKNOWN)))
            .groupBy("client_type")
            .agg(F.countDistinct("client_id").alias("clients"), *_traffic_metrics())
            .orderBy("client_type"))


def throughput(events: DataFrame, unit: str = "minute") -> DataFrame:
    """Messages and bytes in and out per minute or per hour (only periods
    with traffic appear).

    :param unit: ``minute`` or ``hour``.
    :returns: ``period`` (start, UTC timestamp), ``messages_in, bytes_in,
        messages_out, bytes_out``, in time order.
    """
    if unit not in ("minute", "hour"):
        raise ValueError("unit must be minute or hour")
    return (_flows(events).withColumn("period", F.date_trunc(unit, "time"))
            .groupBy("period").agg(*_traffic_metrics()).orderBy("period"))


def time_bucket(span_ms: int, points: int = TIMELINE_POINTS) -> tuple[str, int]:
    """The bucket of a time chart over ``span_ms``: the shortest of
    :data:`TIME_BUCKETS` that covers the span in at most ``points`` buckets
    (the longest when none does), so that a log of minutes is charted by
    seconds and one of days by hours, not one point on an axis of years.

    :param span_ms: last minus first event time, milliseconds (>= 0).
    :param points: the most buckets wanted, >= 1.
    :returns: ``(label, length_ms)``, e.g. ``("15 s", 15000)``.
    :raises ValueError: for a negative span or ``points < 1``.
    """
    if span_ms < 0 or points < 1:
        raise ValueError("span_ms must be >= 0 and points >= 1")
    for label, length in TIME_BUCKETS:
        # buckets are aligned on multiples of their length: a span may
        # straddle one more bucket than span / length
        if span_ms // length + 1 <= points:
            return label, length
    return TIME_BUCKETS[-1]


def throughput_timeline(events: DataFrame, bucket_ms: int, first_ms: int,
                        last_ms: int) -> DataFrame:
    """Messages and bytes in and out per time bucket from ``first_ms`` to
    ``last_ms``, buckets without traffic included (zeros).

    :param bucket_ms: the bucket length, milliseconds, a multiple of 1000
        (:func:`time_bucket`); buckets start at multiples of it since the epoch (UTC).
    :param first_ms: the first event time, epoch milliseconds.
    :param last_ms: the last event time, epoch milliseconds.
    :returns: ``period`` (bucket start, UTC timestamp), ``bucket_s``
        (its length, whole seconds), ``messages_in, bytes_in, messages_out,
        bytes_out``, in time order.
    """
    first, last = first_ms // bucket_ms, last_ms // bucket_ms
    counts = (_flows(events).withColumn("idx", F.floor(F.unix_millis("time") / bucket_ms))
              .groupBy("idx").agg(*_traffic_metrics()))
    buckets = events.sparkSession.range(first, last + 1).withColumnRenamed("id", "idx")
    zero = F.lit(0).cast("long")
    return (buckets.join(counts, "idx", "left")
            .select(F.timestamp_millis(F.col("idx") * bucket_ms).alias("period"),
                    F.lit(bucket_ms // 1000).cast("long").alias("bucket_s"),
                    *[F.coalesce(c, zero).alias(c)
                      for c in ("messages_in", "bytes_in", "messages_out", "bytes_out")],
                    "idx")
            .orderBy("idx").drop("idx"))


def throughput_peaks(per_minute: DataFrame, per_hour: DataFrame) -> DataFrame:
    """The peak of each throughput series.

    :param per_minute: :func:`throughput` by minute.
    :param per_hour: :func:`throughput` by hour.
    :returns: ``unit, direction, peak_messages, peak_period`` (the first
        period with the peak), ``mean_messages`` (over periods with traffic),
        ``peak_per_second`` and ``periods``.
    """
    rows = []
    for unit, df, seconds in (("minute", per_minute, 60), ("hour", per_hour, 3600)):
        for direction in ("in", "out"):
            col = f"messages_{direction}"
            w = Window.orderBy(F.desc(col), "period")
            ranked = df.select("period", F.col(col).alias("m"),
                               F.row_number().over(w).alias("rank"),
                               F.avg(col).over(Window.partitionBy()).alias("mean"),
                               F.count(F.lit(1)).over(Window.partitionBy()).alias("periods"))
            rows.append(ranked.where("rank = 1").select(
                F.lit(unit).alias("unit"), F.lit(direction).alias("direction"),
                F.col("m").alias("peak_messages"), F.col("period").alias("peak_period"),
                F.round("mean", 3).alias("mean_messages"),
                F.round(F.col("m") / seconds, 3).alias("peak_per_second"),
                F.col("periods")))
    out = rows[0]
    for df in rows[1:]:
        out = out.unionByName(df)
    return out


def _latency_stats(df: DataFrame, keys: list[str]) -> DataFrame:
    pct = F.percentile_approx("latency_ms", [0.5, 0.95, 0.99], PERCENTILE_ACCURACY)
    return (df.groupBy(*keys)
            .agg(F.count(F.lit(1)).alias("deliveries"), pct.alias("_p"),
                 F.round(F.avg("latency_ms"), 3).alias("mean_ms"),
                 F.max("latency_ms").alias("max_ms"))
            .select(*keys, "deliveries", F.col("_p")[0].alias("p50_ms"),
                    F.col("_p")[1].alias("p95_ms"), F.col("_p")[2].alias("p99_ms"),
                    "mean_ms", "max_ms")
            .orderBy(*keys))


def _live_deliveries(events: DataFrame) -> DataFrame:
    """Deliveries whose latency measures the pipeline: retained messages are
    left out (a retained message sent on subscribe may be hours old)."""
    return events.where((F.col("type") == "deliver") & F.col("latency_ms").isNotNull()
                        & ~F.coalesce(F.col("retain"), F.lit(False)))


def latency_by_rollup(events: DataFrame, levels: int = 1) -> DataFrame:
    """Delivery latency percentiles per topic roll-up (retained messages
    excluded).

    :param levels: topic levels kept, >= 1.
    :returns: ``topic_prefix, deliveries, p50_ms, p95_ms, p99_ms, mean_ms,
        max_ms``.
    """
    df = _live_deliveries(events).withColumn("topic_prefix", topic_rollup("topic", levels))
    return _latency_stats(df, ["topic_prefix"])


def latency_by_node(events: DataFrame) -> DataFrame:
    """Delivery latency percentiles per broker node (retained messages
    excluded).

    :returns: ``node, deliveries, p50_ms, p95_ms, p99_ms, mean_ms, max_ms``.
    """
    return _latency_stats(_live_deliveries(events), ["node"])


def qos_mix(events: DataFrame) -> DataFrame:
    """Messages by direction, QoS and RETAIN flag, with their share of the
    direction's messages.

    :returns: ``direction, qos, retain, messages, share`` (0..1, 4 decimals).
    """
    counts = (_flows(events).withColumn("retain", F.coalesce("retain", F.lit(False)))
              .groupBy("direction", "qos", "retain").agg(F.count(F.lit(1)).alias("messages")))
    total = F.sum("messages").over(Window.partitionBy("direction"))
    return (counts.withColumn("share", F.round(F.col("messages") / total, 4))
            .orderBy("direction", "qos", "retain"))


def fanout(events: DataFrame) -> DataFrame:
    """How many deliveries each published message had (a retained message
    counts its later deliveries on subscribe too).

    :returns: ``fanout, messages``: the number of published messages with
        that many deliveries, by fan-out.
    """
    published = events.where(F.col("type") == "publish").select("msg_id").distinct()
    delivered = (events.where(F.col("type") == "deliver").groupBy("msg_id")
                 .agg(F.count(F.lit(1)).alias("fanout")))
    return (published.join(delivered, "msg_id", "left")
            .select(F.coalesce("fanout", F.lit(0)).alias("fanout"))
            .groupBy("fanout").agg(F.count(F.lit(1)).alias("messages")).orderBy("fanout"))


def _sessions(events: DataFrame) -> DataFrame:
    return (events.where((F.col("type") == "disconnect") & F.col("duration_ms").isNotNull())
            .withColumn("client_type", F.coalesce("client_type", F.lit(_UNKNOWN)))
            .withColumn("duration_s", F.col("duration_ms") / 1000.0))


def session_durations(events: DataFrame) -> DataFrame:
    """Connection durations (from disconnect records) per client type.

    :returns: ``client_type, sessions, mean_s, p50_s, p95_s, max_s``
        (seconds).
    """
    pct = F.percentile_approx("duration_s", [0.5, 0.95], PERCENTILE_ACCURACY)
    return (_sessions(events).groupBy("client_type")
            .agg(F.count(F.lit(1)).alias("sessions"), F.round(F.avg("duration_s"), 3).alias("mean_s"),
                 pct.alias("_p"), F.max("duration_s").alias("max_s"))
            .select("client_type", "sessions", "mean_s", F.col("_p")[0].alias("p50_s"),
                    F.col("_p")[1].alias("p95_s"), "max_s")
            .orderBy("client_type"))


def session_duration_histogram(events: DataFrame) -> DataFrame:
    """Connections by duration bucket (:data:`DURATION_BUCKETS`; empty
    buckets included).

    :returns: ``bucket, upper_s`` (exclusive bound, null for the last),
        ``sessions``, in bucket order.
    """
    spark = events.sparkSession
    labels = spark.createDataFrame(
        [(i, label, None if high is None else float(high))
         for i, (label, high) in enumerate(DURATION_BUCKETS)],
        "idx int, bucket string, upper_s double")
    idx = None
    for i, (_, high) in enumerate(DURATION_BUCKETS):
        if high is None:
            idx = idx.otherwise(F.lit(i)) if idx is not None else F.lit(i)
        else:
            cond = F.col("duration_s") < high
            idx = F.when(cond, F.lit(i)) if idx is None else idx.when(cond, F.lit(i))
    counts = _sessions(events).groupBy(idx.alias("idx")).agg(F.count(F.lit(1)).alias("sessions"))
    return (labels.join(counts, "idx", "left")
            .select("bucket", "upper_s", F.coalesce("sessions", F.lit(0)).alias("sessions"),
                    "idx").orderBy("idx").drop("idx"))


def disconnect_reasons(events: DataFrame) -> DataFrame:
    """Disconnections by reason code.

    :returns: ``reason_code`` (null: connection lost without DISCONNECT),
        ``reason`` (its name), ``disconnects``; most frequent first.
    """
    spark = events.sparkSession
    names = spark.createDataFrame(list(DISCONNECT_REASONS.items()), "code int, name string")
    counts = (events.where(F.col("type") == "disconnect").groupBy("reason_code")
              .agg(F.count(F.lit(1)).alias("disconnects")))
    return (counts.join(names, counts.reason_code == names.code, "left")
            .select("reason_code",
                    F.when(F.col("reason_code").isNull(), F.lit("connection lost"))
                    .otherwise(F.coalesce("name", F.format_string("0x%02X", "reason_code")))
                    .alias("reason"),
                    "disconnects")
            .orderBy(F.desc("disconnects"), "reason_code"))


def reconnect_storms(events: DataFrame, connects: int = 5, minutes: float = 10) -> DataFrame:
    """Clients that connected more than ``connects`` times within some
    ``minutes``-minute window.

    :param connects: the threshold K (a client is flagged above it).
    :param minutes: the window W, minutes.
    :returns: ``client_id, max_connects`` (most connects in one window),
        ``window_start`` (UTC timestamp of the first connect of the first
        such window), ``total_connects``; worst first.
    """
    span = int(minutes * 60000) - 1
    conn = events.where(F.col("type") == "connect").select("client_id", "ts")
    w = Window.partitionBy("client_id").orderBy("ts").rangeBetween(0, span)
    counted = (conn.withColumn("in_window", F.count(F.lit(1)).over(w))
               .withColumn("total_connects", F.count(F.lit(1)).over(Window.partitionBy("client_id"))))
    best = Window.partitionBy("client_id").orderBy(F.desc("in_window"), "ts")
    return (counted.withColumn("rank", F.row_number().over(best))
            .where((F.col("rank") == 1) & (F.col("in_window") > connects))
            .select("client_id", F.col("in_window").alias("max_connects"),
                    F.timestamp_millis("ts").alias("window_start"), "total_connects")
            .orderBy(F.desc("max_connects"), "client_id"))


def _auth_failures(events: DataFrame, key: str, other: str, other_name: str,
                   threshold: int) -> DataFrame:
    fails = events.where(F.col("type") == "auth_fail")
    return (fails.groupBy(key)
            .agg(F.count(F.lit(1)).alias("failures"),
                 F.countDistinct(other).alias(other_name),
                 F.min("time").alias("first_seen"), F.max("time").alias("last_seen"))
            .withColumn("flagged", F.col("failures") > threshold)
            .orderBy(F.desc("failures"), key))


def auth_failures_by_address(events: DataFrame, threshold: int = 10) -> DataFrame:
    """Authentication failures per peer address.

    :param threshold: an address with more failures than this is flagged.
    :returns: ``address, failures, distinct_client_ids, first_seen,
        last_seen, flagged``.
    """
    return _auth_failures(events, "address", "client_id", "distinct_client_ids", threshold)


def auth_failures_by_client(events: DataFrame, threshold: int = 10) -> DataFrame:
    """Authentication failures per client id.

    :param threshold: a client id with more failures than this is flagged.
    :returns: ``client_id, failures, distinct_addresses, first_seen,
        last_seen, flagged``.
    """
    return _auth_failures(events, "client_id", "address", "distinct_addresses", threshold)


def drops_by_reason(events: DataFrame) -> DataFrame:
    """Messages not delivered, by reason.

    :returns: ``reason, messages, bytes, clients`` (distinct sessions
        affected); most first.
    """
    return (events.where(F.col("type") == "drop").groupBy("reason")
            .agg(F.count(F.lit(1)).alias("messages"),
                 F.coalesce(F.sum("bytes"), F.lit(0)).cast("long").alias("bytes"),
                 F.countDistinct("client_id").alias("clients"))
            .orderBy(F.desc("messages"), "reason"))


def summary(events: DataFrame, bad: DataFrame) -> DataFrame:
    """One row per headline figure.

    :returns: ``metric, value`` (long): ``events``, ``events_<type>`` for
        each type, ``bad_records``, ``clients``, ``topics``,
        ``messages_in``, ``bytes_in``, ``messages_out``, ``bytes_out``,
        ``first_ts``, ``last_ts`` (epoch ms; absent without events).
    """
    is_pub = F.col("type") == "publish"
    is_del = F.col("type") == "deliver"
    aggs = [F.count(F.lit(1)).alias("events")]
    aggs += [F.count(F.when(F.col("type") == t, 1)).alias(f"events_{t}") for t in EVENT_TYPES]
    aggs += [
        F.countDistinct("client_id").alias("clients"),
        F.countDistinct(F.when(is_pub | is_del, F.col("topic"))).alias("topics"),
        F.count(F.when(is_pub, 1)).alias("messages_in"),
        F.coalesce(F.sum(F.when(is_pub, F.col("bytes"))), F.lit(0)).alias("bytes_in"),
        F.count(F.when(is_del, 1)).alias("messages_out"),
        F.coalesce(F.sum(F.when(is_del, F.col("bytes"))), F.lit(0)).alias("bytes_out"),
        F.min("ts").alias("first_ts"),
        F.max("ts").alias("last_ts"),
    ]
    row = events.agg(*aggs).crossJoin(bad.agg(F.count(F.lit(1)).alias("bad_records")))
    names = [c for c in row.columns]
    stack = F.expr("stack({}, {})".format(
        len(names), ", ".join(f"'{n}', cast(`{n}` as bigint)" for n in names)))
    return row.select(stack.alias("metric", "value")).where(F.col("value").isNotNull())
