"""``tbmq-analytics``: the report over an exported event log, and the
synthetic traffic generator.

::

    tbmq-analytics report --input PATH [--input PATH ...] --output DIR
                          [--master URL] [--since T] [--until T] ...
    tbmq-analytics generate --output DIR --events N [--seed S] ...

``--master`` defaults to ``local[*]``, except under ``spark-submit``, where
the master given to ``spark-submit`` is used::

    spark-submit --master spark://host:7077 tbmq/analytics/cli.py \\
        report --input hdfs:///tbmq/events --output hdfs:///tbmq/report
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["build_parser", "main", "make_session"]


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("expected levels like 1,2") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("levels must be >= 1")
    return levels


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    """:returns: the argument parser of ``tbmq-analytics``."""
    parser = argparse.ArgumentParser(
        prog="tbmq-analytics", description="Analytics of the tbmq exported event log (PySpark).")
    sub = parser.add_subparsers(dest="command", required=True)

    rep = sub.add_parser("report", help="tables (Parquet, CSV) and an HTML report")
    rep.add_argument("--input", "-i", action="append", required=True, metavar="PATH",
                     help="event log file or directory (JSON Lines, .gz, or Parquet); local or "
                          "any Hadoop path; may be repeated")
    rep.add_argument("--output", "-o", required=True, metavar="DIR",
                     help="output directory (local or Hadoop path)")
    rep.add_argument("--master", default=None, metavar="URL",
                     help="Spark master (default local[*], or spark-submit's)")
    rep.add_argument("--format", default="auto", choices=("auto", "json", "parquet"),
                     help="input format (default: auto-detect)")
    rep.add_argument("--since", metavar="TIME",
                     help="only events at or after TIME (ISO 8601, UTC unless an offset is "
                          "given, or epoch seconds)")
    rep.add_argument("--until", metavar="TIME", help="only events before TIME")
    rep.add_argument("--levels", type=_levels, default=(1, 2), metavar="N,M",
                     help="topic levels of the traffic roll-ups (default 1,2)")
    rep.add_argument("--latency-levels", type=int, default=1, metavar="N",
                     help="topic levels of the latency roll-up (default 1)")
    rep.add_argument("--storm-connects", type=_positive_int, default=5, metavar="K",
                     help="reconnect storm: more than K connects (default 5)...")
    rep.add_argument("--storm-minutes", type=float, default=10.0, metavar="W",
                     help="...within W minutes (default 10)")
    rep.add_argument("--auth-threshold", type=_positive_int, default=10, metavar="N",
                     help="flag addresses and client ids with more than N authentication "
                          "failures (default 10)")
    rep.add_argument("--title", default=None, help="the report's title")
    rep.add_argument("--driver-memory", default=None, metavar="SIZE",
                     help="Spark driver memory for a local master (default 2g)")
    rep.add_argument("--quiet", "-q", action="store_true", help="no progress output")

    gen = sub.add_parser("generate", help="write a synthetic event log")
    gen.add_argument("--output", "-o", required=True, metavar="DIR")
    gen.add_argument("--events", "-n", type=int, required=True, metavar="N")
    gen.add_argument("--seed", type=int, default=1)
    gen.add_argument("--devices", type=int, default=None,
                     help="default: one per 1,000 events, at least 20")
    gen.add_argument("--applications", type=int, default=4)
    gen.add_argument("--nodes", type=int, default=2)
    gen.add_argument("--hours", type=float, default=24.0, help="time span of the log")
    gen.add_argument("--start", default="2024-01-01T00:00:00", help="first event (UTC)")
    gen.add_argument("--files", type=int, default=None, help="output files (default: workers)")
    gen.add_argument("--workers", type=int, default=None, help="processes (default: CPUs)")
    gen.add_argument("--corrupt-rate", type=float, default=0.0,
                     help="fraction of lines written corrupt (truncated)")
    gen.add_argument("--gzip", action="store_true", help="write .jsonl.gz files")
    return parser


def make_session(master: str | None = None, driver_memory: str | None = None,
                 app_name: str = "tbmq-analytics"):
    """The SparkSession of a command.

    :param master: a Spark master URL; None means spark-submit's master when
        run by ``spark-submit``, else ``local[*]``.
    :param driver_memory: driver memory of a local master (``2g`` default).
    :returns: a :class:`pyspark.sql.SparkSession` with UTC as its time zone.
    """
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ or SparkConf().contains("spark.master")
    if master is None and not submitted:
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        # local Python workers run this interpreter (a venv's, not PATH's python3)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = (builder.config("spark.driver.memory", driver_memory or "2g")
                   .config("spark.ui.enabled", "false")
                   .config("spark.sql.shuffle.partitions", str(4 * (os.cpu_count() or 1))))
    builder = (builder.config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "true")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.sql.execution.arrow.pyspark.fallback.enabled", "true")
               .config("spark.sql.files.ignoreCorruptFiles", "true"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _report(args) -> int:
    from tbmq.analytics.jobs import NoEventsError, ReportParams, run_report
    from tbmq.analytics.reading import parse_time

    try:
        since, until = parse_time(args.since), parse_time(args.until)
    except ValueError as e:
        print(f"tbmq-analytics: bad --since/--until: {e}", file=sys.stderr)
        return 2
    params = ReportParams(levels=args.levels, latency_levels=args.latency_levels,
                          storm_connects=args.storm_connects, storm_minutes=args.storm_minutes,
                          auth_threshold=args.auth_threshold)
    spark = make_session(args.master, args.driver_memory)
    try:
        result = run_report(spark, args.input, args.output, fmt=args.format, since_ms=since,
                            until_ms=until, params=params, title=args.title,
                            progress=(lambda _m: None) if args.quiet else None)
    except FileNotFoundError as e:
        print(f"tbmq-analytics: input not found: {e}", file=sys.stderr)
        return 2
    except NoEventsError as e:
        print(f"tbmq-analytics: {e}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    bad = result.rows.get("bad_records", 0)
    if bad:
        counts = result.tables["bad_records"]
        total = int(counts["records"].sum())
        print(f"tbmq-analytics: {total:,} bad input records skipped "
              f"(see the report's Bad input section)", file=sys.stderr)
    return 0


def _generate(args) -> int:
    from tbmq.analytics.generator import GeneratorParams, generate

    params = GeneratorParams(
        events=args.events, seed=args.seed, devices=args.devices,
        applications=args.applications, nodes=args.nodes, hours=args.hours,
        start=args.start, corrupt_rate=args.corrupt_rate)
    paths = generate(args.output, params, files=args.files, workers=args.workers,
                     compress=args.gzip)
    print(f"tbmq-analytics: {args.events:,} events written to {len(paths)} file(s) in "
          f"{args.output}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The ``tbmq-analytics`` command.

    :param argv: the arguments (``sys.argv[1:]`` when None).
    :returns: the exit status: 0 success, 1 no event to report (a line on
        stderr says why; nothing is written), 2 bad usage or missing input.
    """
    args = build_parser().parse_args(argv)
    if args.command == "report":
        return _report(args)
    return _generate(args)


if __name__ == "__main__":  # spark-submit tbmq/analytics/cli.py report ...
    sys.exit(main())
