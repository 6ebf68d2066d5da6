"""Reading the event log: JSON Lines (plain or gzipped) or Parquet, from a
local path or any Hadoop path (``hdfs://``, ``s3a://``, ``file://``), and
splitting it into valid events and bad input.

Bad input is never fatal: a line that is not a JSON object matching the
schema (a truncated or corrupt line), a record of an unknown type or of a
newer schema version, or one missing a field its type needs, is counted and
reported by :func:`prepare` with a sample of its text.

The log of a running broker is read whole: the file the exporter is writing
(``*.jsonl.inprogress``, see :mod:`tbmq.events`) is read like the others,
except for its last line while that line is still incomplete (not bad input:
it is read once complete), and except when its completed name
(``*.jsonl``, ``*.jsonl.gz``) is also listed (a rotation under way: the
completed file is read instead).  A file rotated between the listing and the
read is picked up by :func:`load_events`, which reads again.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from tbmq.analytics.schema import (
    CORRUPT_COLUMN,
    EVENT_SCHEMA,
    EVENT_TYPES,
    READ_SCHEMA,
    REQUIRED_FIELDS,
    SCHEMA_VERSION,
)

__all__ = ["BAD_REASONS", "IN_PROGRESS_SUFFIX", "detect_format", "load_events", "parse_time",
           "prepare", "read_events"]

#: The suffix of the file the exporter is writing (:data:`tbmq.events.IN_PROGRESS_SUFFIX`).
IN_PROGRESS_SUFFIX = ".inprogress"

#: Reads of :func:`load_events` before a file that keeps vanishing is an error.
READ_ATTEMPTS = 4

#: The reasons of the bad-input table.
BAD_REASONS = ("corrupt", "unsupported_version", "unknown_type", "missing_field")

#: characters of a bad record kept as a sample
SAMPLE_CHARS = 200


def _hadoop_files(spark: SparkSession, path: str) -> list[str]:
    """Names of the files under ``path`` (recursively, hidden ones skipped),
    through the Hadoop FileSystem API (any scheme Spark knows)."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(conf)
    if not fs.exists(hpath):
        raise FileNotFoundError(path)
    names: list[str] = []
    stack = [hpath]
    while stack and len(names) < 10000:
        status = fs.getFileStatus(stack.pop())
        if status.isDirectory():
            for child in fs.listStatus(status.getPath()):
                name = child.getPath().getName()
                if not name.startswith((".", "_")):
                    stack.append(child.getPath())
        else:
            names.append(status.getPath().getName())
    return names


def detect_format(spark: SparkSession, path: str) -> str:
    """``parquet`` when ``path`` is or holds ``*.parquet`` files, else
    ``json``.

    :raises FileNotFoundError: when ``path`` does not exist.
    """
    if path.rstrip("/").endswith(".parquet"):
        return "parquet"
    names = _hadoop_files(spark, path)
    return "parquet" if any(n.endswith(".parquet") for n in names) else "json"


def superseded_files(files: list[str]) -> list[str]:
    """The in-progress files of ``files`` whose completed file is listed too
    (the exporter is rotating them: they hold the same records).

    :param files: file paths or URIs, as listed by Spark.
    :returns: the ``*.inprogress`` paths of ``files`` to leave out.
    """
    listed = set(files)
    out = []
    for f in files:
        if f.endswith(IN_PROGRESS_SUFFIX):
            completed = f[:-len(IN_PROGRESS_SUFFIX)]
            if completed in listed or completed + ".gz" in listed:
                out.append(f)
    return out


def read_events(spark: SparkSession, paths: str | list[str], fmt: str = "auto") -> DataFrame:
    """Read raw event records, as much as has been written.

    :param spark: the session.
    :param paths: one or more files or directories (directories are read
        recursively; hidden files are skipped); JSON Lines may be gzipped
        (``.gz``).  The exporter's in-progress file is read too, but for an
        incomplete last line and when its completed file is listed (see the
        module docstring).
    :param fmt: ``json``, ``parquet`` or ``auto`` (see :func:`detect_format`).
    :returns: a DataFrame of :data:`~tbmq.analytics.schema.READ_SCHEMA`
        (``_corrupt_record`` set on unparsable lines).  Spark refuses a query
        of JSON input that only uses ``_corrupt_record``: persist the frame
        first (as :func:`load_events` does).  A file that vanishes before
        the read (a rotation) fails the read with Spark's
        ``FAILED_READ_FILE.FILE_NOT_EXIST``; :func:`load_events` reads again.
    :raises FileNotFoundError: when a path does not exist.
    """
    if isinstance(paths, str):
        paths = [paths]
    if fmt == "auto":
        kinds = {detect_format(spark, p) for p in paths}
        fmt = kinds.pop() if len(kinds) == 1 else "json"
    if fmt == "parquet":
        df = spark.read.option("recursiveFileLookup", "true").parquet(*paths)
        present = set(df.columns)
        cols = [F.col(f.name).cast(f.dataType).alias(f.name) if f.name in present
                else F.lit(None).cast(f.dataType).alias(f.name) for f in EVENT_SCHEMA.fields]
        cols.append(F.lit(None).cast("string").alias(CORRUPT_COLUMN))
        return df.select(*cols)
    if fmt != "json":
        raise ValueError(f"unknown input format {fmt!r}")
    df = (spark.read.schema(READ_SCHEMA)
          .option("mode", "PERMISSIVE")
          .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
          .option("recursiveFileLookup", "true")
          .json(list(paths)))
    files = df.inputFiles()
    if not any(f.endswith(IN_PROGRESS_SUFFIX) for f in files):
        return df
    source = F.input_file_name()
    # the exporter writes whole records: the only unparsable line of a file
    # in progress is its last one, while it is being written
    keep = ~(source.endswith(IN_PROGRESS_SUFFIX) & F.col(CORRUPT_COLUMN).isNotNull())
    superseded = superseded_files(files)
    if superseded:
        keep = keep & ~source.isin(*superseded)
    return df.where(keep)


def _vanished(error: Exception) -> bool:
    """Whether ``error`` is Spark's failure to open a listed file that no
    longer exists."""
    text = str(error)
    return "FILE_NOT_EXIST" in text or "java.io.FileNotFoundException" in text


def load_events(spark: SparkSession, paths: str | list[str], fmt: str = "auto",
                notify: Callable[[str], None] | None = None) -> tuple[DataFrame, int]:
    """:func:`read_events`, persisted (memory and disk) and counted; read
    again when a listed file vanished before it was read (the exporter
    rotated it), at most :data:`READ_ATTEMPTS` times.

    :param notify: called with a line when the log is read again.
    :returns: ``(raw, records)``: the persisted raw records (unpersist them
        when done) and their number.
    :raises FileNotFoundError: when a path does not exist.
    :raises pyspark.errors.PySparkException: or py4j's ``Py4JJavaError``,
        when the read fails otherwise, or files kept vanishing.
    """
    attempt = 1
    while True:
        raw = read_events(spark, paths, fmt).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            return raw, raw.count()
        except Exception as e:
            raw.unpersist()
            if attempt >= READ_ATTEMPTS or not _vanished(e):
                raise
        attempt += 1
        if notify is not None:
            notify("a file was rotated while it was read; reading the log again")


def parse_time(text: str | None) -> int | None:
    """A ``--since``/``--until`` bound as epoch milliseconds.

    :param text: ISO 8601 (``2024-05-01``, ``2024-05-01T12:00``,
        ``2024-05-01T12:00:00+02:00``; UTC when no offset is given), or
        epoch seconds; None passes through.
    :returns: milliseconds since the epoch, or None.
    :raises ValueError: for text that is neither.
    """
    if text is None:
        return None
    try:
        return int(float(text) * 1000)
    except ValueError:
        pass
    value = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.UTC)
    return int(value.timestamp() * 1000)


def _missing(fields: tuple[str, ...]) -> Column:
    cond = F.lit(False)
    for name in fields:
        cond = cond | F.col(name).isNull()
    return cond


def _bad_reason() -> Column:
    """The reason a raw record is bad, or null for a valid one."""
    per_type = F.lit(False)
    for kind, fields in REQUIRED_FIELDS.items():
        if fields:
            per_type = per_type | ((F.col("type") == kind) & _missing(fields))
    return (F.when(F.col(CORRUPT_COLUMN).isNotNull(), F.lit("corrupt"))
            .when(F.col("v").isNull() | F.col("type").isNull() | F.col("ts").isNull(),
                  F.lit("missing_field"))
            .when(F.col("v") > SCHEMA_VERSION, F.lit("unsupported_version"))
            .when(~F.col("type").isin(*EVENT_TYPES), F.lit("unknown_type"))
            .when(per_type, F.lit("missing_field")))


def prepare(raw: DataFrame, since_ms: int | None = None,
            until_ms: int | None = None) -> tuple[DataFrame, DataFrame]:
    """Split raw records into valid events and bad input.

    :param raw: records of :data:`~tbmq.analytics.schema.READ_SCHEMA`.
    :param since_ms: keep events with ``ts >= since_ms`` (epoch ms), if set.
    :param until_ms: keep events with ``ts < until_ms`` (epoch ms), if set.
    :returns: ``(events, bad)``: ``events`` has the fields of
        :data:`~tbmq.analytics.schema.EVENT_SCHEMA` plus ``time`` (a UTC
        timestamp of ``ts``); ``bad`` has ``reason`` (one of
        :data:`BAD_REASONS`) and ``sample`` (the first 200 characters of the
        record).  Both are lazy; cache ``raw`` when it is read more than once.
    """
    flagged = raw.withColumn("_bad", _bad_reason())
    events = flagged.where(F.col("_bad").isNull()).drop("_bad", CORRUPT_COLUMN)
    if since_ms is not None:
        events = events.where(F.col("ts") >= F.lit(since_ms))
    if until_ms is not None:
        events = events.where(F.col("ts") < F.lit(until_ms))
    events = events.withColumn("time", F.timestamp_millis(F.col("ts")))
    record = F.coalesce(F.col(CORRUPT_COLUMN),
                        F.to_json(F.struct(*[F.col(f.name) for f in EVENT_SCHEMA.fields])))
    bad = (flagged.where(F.col("_bad").isNotNull())
           .select(F.col("_bad").alias("reason"),
                   F.substring(record, 1, SAMPLE_CHARS).alias("sample")))
    return events, bad
