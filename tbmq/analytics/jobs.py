"""Thin jobs: read the event log, build every table with the pure
transforms of :mod:`tbmq.analytics.transforms`, write each table as Parquet
and CSV, and the HTML report (:mod:`tbmq.analytics.report`).

Output layout under ``DIR``::

    report.html             the report (open it in a browser)
    charts/<chart>.png      its charts
    csv/<table>.csv         each table, one CSV file with a header
    parquet/<table>/        each table as Parquet
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlparse

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tbmq.analytics import transforms as T
from tbmq.analytics.reading import load_events, prepare

__all__ = ["TABLES", "NoEventsError", "ReportParams", "ReportResult", "build_tables",
           "event_span", "run_report"]

#: rows of each table kept in the driver for the HTML report and charts
COLLECT_ROWS = 100000


@dataclass(frozen=True)
class ReportParams:
    """What the report computes.

    :ivar levels: topic levels of the traffic roll-ups.
    :ivar latency_levels: topic levels of the latency roll-up.
    :ivar storm_connects: a client connecting more than this many times...
    :ivar storm_minutes: ...within this many minutes is in a reconnect storm.
    :ivar auth_threshold: addresses and client ids with more authentication
        failures than this are flagged.
    """

    levels: tuple[int, ...] = (1, 2)
    latency_levels: int = 1
    storm_connects: int = 5
    storm_minutes: float = 10.0
    auth_threshold: int = 10


#: name → (title, description) of every table, in report order
TABLES = {
    "summary": ("Summary", "Headline figures of the log."),
    "bad_records": ("Bad input", "Records that could not be used, by reason, with a sample."),
    "traffic_by_topic": ("Traffic by topic", "Messages and payload bytes in (published) "
                         "and out (delivered) per topic."),
    "traffic_by_rollup": ("Traffic by topic roll-up", "Traffic rolled up to the first N "
                          "topic levels."),
    "traffic_by_client": ("Traffic by client", "Messages and bytes each client published "
                          "(in) and received (out)."),
    "traffic_by_client_type": ("Traffic by client type", "DEVICE and APPLICATION clients."),
    "throughput_timeline": ("Throughput over time", "Messages and bytes per time bucket, "
                            "from the first event to the last; the bucket (bucket_s) is "
                            f"chosen from the log's span: at most {T.TIMELINE_POINTS} buckets."),
    "throughput_per_minute": ("Throughput per minute", "Messages and bytes per minute."),
    "throughput_per_hour": ("Throughput per hour", "Messages and bytes per hour."),
    "throughput_peaks": ("Throughput peaks", "The busiest minute and hour, in and out."),
    "latency_by_rollup": ("Delivery latency by topic roll-up", "Milliseconds from receipt "
                          "to delivery (retained messages excluded)."),
    "latency_by_node": ("Delivery latency by node", "Milliseconds from receipt to delivery "
                        "per broker node."),
    "qos_mix": ("QoS and retain mix", "Messages by QoS and RETAIN flag."),
    "fanout": ("Fan-out", "Published messages by number of deliveries."),
    "session_durations": ("Session durations", "Connection durations by client type, "
                          "seconds."),
    "session_duration_histogram": ("Session duration histogram", "Connections by duration."),
    "disconnect_reasons": ("Disconnect reasons", "Disconnections by reason code."),
    "reconnect_storms": ("Reconnect storms", "Clients reconnecting too often."),
    "auth_failures_by_address": ("Authentication failures by address",
                                 "Flagged above the threshold."),
    "auth_failures_by_client": ("Authentication failures by client id",
                                "Flagged above the threshold."),
    "drops_by_reason": ("Dropped messages", "Messages not delivered, by reason."),
}


class NoEventsError(ValueError):
    """The input holds no event to report: no record at all, only bad ones,
    or none in the ``--since``/``--until`` window.

    :param inputs: the input paths.
    :param records: records read (valid and bad).
    :param valid: valid events among them, window aside.
    """

    def __init__(self, inputs: list[str], records: int, valid: int) -> None:
        self.records, self.valid = records, valid
        where = ", ".join(inputs)
        if records == 0:
            detail = f"no records in {where}"
        elif valid == 0:
            detail = f"{records:,} records in {where}, none valid"
        else:
            detail = f"{records:,} records in {where}, {valid:,} valid, none in the time window"
        super().__init__(f"no events to report: {detail}; no report written")


def event_span(events: DataFrame) -> tuple[int, int, int]:
    """``(events, first_ts, last_ts)`` of valid events (epoch milliseconds;
    the times are 0 when there is no event).  One Spark job."""
    row = events.agg(F.count(F.lit(1)).alias("n"), F.min("ts").alias("first"),
                     F.max("ts").alias("last")).first()
    return int(row["n"]), int(row["first"] or 0), int(row["last"] or 0)


def build_tables(events: DataFrame, bad: DataFrame, params: ReportParams = ReportParams(),
                 span: tuple[int, int] | None = None) -> dict[str, DataFrame]:
    """Every table of the report, lazily.

    :param events: valid events (:func:`tbmq.analytics.reading.prepare`).
    :param bad: bad input records (``reason``, ``sample``).
    :param params: the report's parameters.
    :param span: ``(first_ts, last_ts)`` of ``events``, epoch milliseconds,
        which sets the bucket of ``throughput_timeline``
        (:func:`tbmq.analytics.transforms.time_bucket`); None runs
        :func:`event_span` (one Spark job).
    :returns: table name → DataFrame, in :data:`TABLES` order.
    """
    if span is None:
        span = event_span(events)[1:]
    first, last = span
    _, bucket_ms = T.time_bucket(last - first)
    per_minute = T.throughput(events, "minute")
    per_hour = T.throughput(events, "hour")
    bad_summary = (bad.groupBy("reason")
                   .agg(F.count(F.lit(1)).alias("records"), F.first("sample").alias("sample"))
                   .orderBy(F.desc("records"), "reason"))
    tables = {
        "summary": T.summary(events, bad),
        "bad_records": bad_summary,
        "traffic_by_topic": T.traffic_by_topic(events),
        "traffic_by_rollup": T.traffic_by_rollup(events, params.levels),
        "traffic_by_client": T.traffic_by_client(events),
        "traffic_by_client_type": T.traffic_by_client_type(events),
        "throughput_timeline": T.throughput_timeline(events, bucket_ms, first, last),
        "throughput_per_minute": per_minute,
        "throughput_per_hour": per_hour,
        "throughput_peaks": T.throughput_peaks(per_minute, per_hour),
        "latency_by_rollup": T.latency_by_rollup(events, params.latency_levels),
        "latency_by_node": T.latency_by_node(events),
        "qos_mix": T.qos_mix(events),
        "fanout": T.fanout(events),
        "session_durations": T.session_durations(events),
        "session_duration_histogram": T.session_duration_histogram(events),
        "disconnect_reasons": T.disconnect_reasons(events),
        "reconnect_storms": T.reconnect_storms(events, params.storm_connects,
                                               params.storm_minutes),
        "auth_failures_by_address": T.auth_failures_by_address(events, params.auth_threshold),
        "auth_failures_by_client": T.auth_failures_by_client(events, params.auth_threshold),
        "drops_by_reason": T.drops_by_reason(events),
    }
    assert list(tables) == list(TABLES)
    return tables


@dataclass
class ReportResult:
    """What :func:`run_report` produced.

    :ivar output: the output directory.
    :ivar tables: table name → its rows as a pandas DataFrame (at most
        :data:`COLLECT_ROWS`).
    :ivar rows: table name → its total number of rows.
    :ivar charts: chart file names (under ``charts/``).
    :ivar seconds: wall time of the run.
    """

    output: str
    tables: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)
    charts: list = field(default_factory=list)
    seconds: float = 0.0


def _is_local(path: str) -> bool:
    """A plain local path (a ``file:`` URI goes through Hadoop like any other)."""
    scheme = urlparse(path).scheme
    return scheme == "" or len(scheme) == 1  # a Windows drive letter


class _Output:
    """Writes under the output directory through the Hadoop FileSystem API,
    so that ``DIR`` may be any Hadoop path."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.root = root.rstrip("/")
        jvm = spark.sparkContext._jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        self.fs = self._Path(self.root).getFileSystem(conf)

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def write_table(self, name: str, df: DataFrame) -> None:
        df.write.mode("overwrite").parquet(self.path("parquet", name))
        tmp = self.path("csv", f"_{name}.tmp")
        (df.write.mode("overwrite").option("header", "true")
         .option("timestampFormat", "yyyy-MM-dd HH:mm:ss").csv(tmp))
        target = self._Path(self.path("csv", f"{name}.csv"))
        parts = [s.getPath() for s in self.fs.listStatus(self._Path(tmp))
                 if s.getPath().getName().startswith("part-")]
        self.fs.delete(target, False)
        if parts:
            self.fs.rename(parts[0], target)
        else:  # pragma: no cover - coalesce(1) always writes one part
            self.fs.create(target).close()
        self.fs.delete(self._Path(tmp), True)

    def put_tree(self, local_dir: str) -> None:
        """Copy the files of ``local_dir`` (report, charts) under the root."""
        if _is_local(self.root):
            os.makedirs(self.root, exist_ok=True)
            shutil.copytree(local_dir, self.root, dirs_exist_ok=True)
            return
        for dirpath, _, files in os.walk(local_dir):
            rel = os.path.relpath(dirpath, local_dir)
            for name in files:
                dest = self.path(name) if rel == "." else self.path(rel, name)
                self.fs.copyFromLocalFile(False, True, self._Path("file://" + os.path.join(dirpath, name)),
                                          self._Path(dest))


def _progress_printer(stream=sys.stderr) -> Callable[[str], None]:
    def show(message: str) -> None:
        print(f"tbmq-analytics: {message}", file=stream, flush=True)

    return show


def run_report(spark: SparkSession, inputs: str | list[str], output: str, *,
               fmt: str = "auto", since_ms: int | None = None, until_ms: int | None = None,
               params: ReportParams = ReportParams(), title: str | None = None,
               progress: Callable[[str], None] | None = None) -> ReportResult:
    """Read the log, write every table (Parquet and CSV), the charts and the
    HTML report.

    :param spark: the session (any master).
    :param inputs: file(s) or directory(ies), local or Hadoop paths.
    :param output: the output directory, local or Hadoop path.
    :param fmt: ``auto``, ``json`` or ``parquet``.
    :param since_ms: only events at or after this time (epoch ms).
    :param until_ms: only events before this time (epoch ms).
    :param params: see :class:`ReportParams`.
    :param title: the report's title.
    :param progress: called with one line per step; None prints to stderr.
    :returns: a :class:`ReportResult`.
    :raises FileNotFoundError: when an input does not exist.
    :raises NoEventsError: when no valid event is in the window (nothing is
        written then).
    """
    from tbmq.analytics import report

    show = progress or _progress_printer()
    started = time.monotonic()
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    show(f"reading {', '.join(inputs)}")
    raw, records = load_events(spark, inputs, fmt, notify=show)
    try:
        show(f"{records:,} records read ({time.monotonic() - started:.1f} s)")
        events, bad = prepare(raw, since_ms, until_ms)
        count, first, last = event_span(events)
        if count == 0:
            windowed = since_ms is not None or until_ms is not None
            valid = prepare(raw)[0].count() if records and windowed else 0
            raise NoEventsError(inputs, records, valid)
        tables = build_tables(events, bad, params, span=(first, last))
        out = _Output(spark, output)
        result = ReportResult(output=output)
        for i, (name, df) in enumerate(tables.items(), 1):
            t0 = time.monotonic()
            # the tables are aggregates: one partition each
            df = df.coalesce(1).persist(StorageLevel.MEMORY_AND_DISK)
            try:
                out.write_table(name, df)
                rows = df.count()
                result.rows[name] = rows
                result.tables[name] = df.limit(COLLECT_ROWS).toPandas()
            finally:
                df.unpersist()
            show(f"[{i:2d}/{len(tables)}] {name}: {rows:,} rows ({time.monotonic() - t0:.1f} s)")
    finally:
        raw.unpersist()
    with tempfile.TemporaryDirectory(prefix="tbmq-report-") as tmp:
        result.charts = report.render_charts(result.tables, os.path.join(tmp, "charts"))
        show(f"{len(result.charts)} charts drawn")
        result.seconds = time.monotonic() - started
        html = report.render_html(result, TABLES, inputs=inputs, since_ms=since_ms,
                                  until_ms=until_ms, params=params, title=title)
        with open(os.path.join(tmp, "report.html"), "w", encoding="utf-8") as f:
            f.write(html)
        out.put_tree(tmp)
    show(f"report written to {out.path('report.html')} ({result.seconds:.1f} s)")
    return result
