"""Reading the log: JSON Lines (plain, gzipped), Parquet, the exporter's
file in progress read (its incomplete last line left out, and the file left
out once its completed name exists), a rotation during the read, time
windows, and bad input counted, never fatal."""

from __future__ import annotations

import gzip
import json

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from tbmq.analytics import reading, schema
from tbmq.analytics.reading import (
    IN_PROGRESS_SUFFIX,
    detect_format,
    load_events,
    parse_time,
    prepare,
    read_events,
)
from tests.analytics.helpers import T0, TRAFFIC, raw_frame, rec


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


GOOD = [json.dumps(r) for r in TRAFFIC[:4]]
BAD = [
    GOOD[0][: len(GOOD[0]) // 2],                                # truncated line
    "garbage \x00 not json",                                     # not JSON
    "[1, 2, 3]",                                                 # not an object
    '{"v":1,"type":"publish","ts":"yesterday","topic":"t"}',    # wrong type
    '{"v":2,"type":"publish","ts":1,"topic":"t","qos":0,"bytes":1}',  # newer schema
    '{"v":1,"type":"teleport","ts":1}',                          # unknown type
    '{"v":1,"type":"publish","ts":1,"topic":"t"}',              # no qos, no bytes
    '{"type":"connect","ts":1,"client_id":"c"}',                # no version
]


def test_bad_input_is_counted_not_fatal(spark, tmp_path):
    path = write_lines(tmp_path / "log.jsonl", GOOD[:2] + BAD + GOOD[2:] + [""])
    raw = read_events(spark, str(path)).cache()
    events, bad = prepare(raw)
    assert events.count() == 4
    got = bad.groupBy("reason").count()
    expected = spark.createDataFrame(
        [("corrupt", 4), ("unsupported_version", 1), ("unknown_type", 1), ("missing_field", 2)],
        "reason string, count long")
    assertDataFrameEqual(got, expected)
    samples = {r.sample for r in bad.collect()}
    assert BAD[0] in samples and "garbage \x00 not json" in samples


def test_gzip_and_directories_and_hidden_files(spark, tmp_path):
    with gzip.open(tmp_path / "events-a.jsonl.gz", "wt") as f:
        f.write("\n".join(GOOD[:2]) + "\n")
    sub = tmp_path / "more"
    sub.mkdir()
    write_lines(sub / "events-b.jsonl", GOOD[2:])
    write_lines(tmp_path / ".events-n-1.jsonl", GOOD)  # hidden: skipped
    (tmp_path / ".events-n-1.jsonl.gz.tmp").write_bytes(b"\x1f\x8b")  # hidden: skipped
    events, bad = prepare(read_events(spark, str(tmp_path)))
    assert events.count() == 4 and bad.count() == 0


def test_the_file_in_progress_is_read(spark, tmp_path):
    # a complete file, and the one the exporter is writing: its last line
    # is half written
    with gzip.open(tmp_path / "events-n-1.jsonl.gz", "wt") as f:
        f.write(GOOD[0] + "\n")
    current = tmp_path / f"events-n-2.jsonl{IN_PROGRESS_SUFFIX}"
    current.write_text(GOOD[1] + "\n" + GOOD[2] + "\n" + GOOD[3][:25], encoding="utf-8")
    # a rotation under way: the gzipped file is complete, the file in
    # progress not removed yet; the same records are read once
    with gzip.open(tmp_path / "events-n-0.jsonl.gz", "wt") as f:
        f.write(GOOD[3] + "\n")
    write_lines(tmp_path / f"events-n-0.jsonl{IN_PROGRESS_SUFFIX}", [GOOD[3]])
    # a torn line in a complete file is still bad input
    write_lines(tmp_path / "events-torn.jsonl", [GOOD[0][:30]])
    raw = read_events(spark, str(tmp_path)).cache()
    events, bad = prepare(raw)
    assert sorted(r.ts for r in events.collect()) == sorted(json.loads(g)["ts"] for g in GOOD)
    assert [(r.reason, r.sample) for r in bad.collect()] == [("corrupt", GOOD[0][:30])]
    raw.unpersist()
    # once the line is complete, it is read
    with open(current, "a", encoding="utf-8") as f:
        f.write(GOOD[3][25:] + "\n")
    raw = read_events(spark, str(tmp_path)).cache()
    assert prepare(raw)[0].count() == 5
    raw.unpersist()


def test_a_rotation_during_the_read_reads_again(spark, tmp_path, monkeypatch):
    current = write_lines(tmp_path / f"events-n-1.jsonl{IN_PROGRESS_SUFFIX}", GOOD[:3])
    write_lines(tmp_path / "events-n-0.jsonl", GOOD[3:])
    listed = []
    real = reading.read_events

    def read_then_rotate(*args):
        df = real(*args)
        listed.append(df.inputFiles())
        if len(listed) == 1:  # the exporter rotates the file once it was listed
            current.rename(tmp_path / "events-n-1.jsonl")
        return df

    monkeypatch.setattr(reading, "read_events", read_then_rotate)
    lines: list[str] = []
    raw, records = load_events(spark, str(tmp_path), notify=lines.append)
    try:
        assert records == 4 and prepare(raw)[0].count() == 4
    finally:
        raw.unpersist()
    assert len(listed) == 2 and any(f.endswith(IN_PROGRESS_SUFFIX) for f in listed[0])
    assert lines == ["a file was rotated while it was read; reading the log again"]


def test_parquet_input_is_detected(spark, tmp_path):
    raw = raw_frame(spark, TRAFFIC).drop(schema.CORRUPT_COLUMN, "publisher", "will")
    raw.write.parquet(str(tmp_path / "log"))
    assert detect_format(spark, str(tmp_path / "log")) == "parquet"
    events, bad = prepare(read_events(spark, str(tmp_path / "log")))
    assert events.count() == len(TRAFFIC) and bad.count() == 0
    assert set(schema.EVENT_SCHEMA.fieldNames()) <= set(events.columns)
    assert events.where(F.col("publisher").isNotNull()).count() == 0


def test_missing_input(spark, tmp_path):
    with pytest.raises(FileNotFoundError):
        read_events(spark, str(tmp_path / "nothing"))


def test_file_uri(spark, tmp_path):
    path = write_lines(tmp_path / "log.jsonl", GOOD)
    assert detect_format(spark, f"file://{path}") == "json"
    assert prepare(read_events(spark, f"file://{path}"))[0].count() == 4


def test_since_until(spark):
    raw = raw_frame(spark, [rec("connect", ms, client_id="c") for ms in (0, 999, 1000, 2000)])
    events, _ = prepare(raw, since_ms=T0 + 999, until_ms=T0 + 2000)
    assert [r.ts - T0 for r in events.orderBy("ts").collect()] == [999, 1000]


def test_parse_time():
    assert parse_time(None) is None
    assert parse_time("2024-01-01") == T0
    assert parse_time("2024-01-01T01:00:00") == T0 + 3600000
    assert parse_time("2024-01-01T01:00:00+01:00") == T0
    assert parse_time("2024-01-01T00:00:00Z") == T0
    assert parse_time("1704067200") == T0
    with pytest.raises(ValueError):
        parse_time("last tuesday")


def test_schema_matches_the_exporter():
    from tbmq import events

    assert schema.SCHEMA_VERSION == events.SCHEMA_VERSION
    assert schema.EVENT_TYPES == events.EVENT_TYPES
