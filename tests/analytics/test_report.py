"""The report job on a generated log: every table as Parquet and CSV, the
HTML report with its charts (rendered by headless Chromium), bad input
counted; a report over a running exporter; no events is an error; the time
chart's axis and the dates shown; the command itself, and the job under
spark-submit."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from tbmq.analytics.generator import GeneratorParams, generate
from tbmq.analytics.jobs import TABLES, NoEventsError, ReportParams, ReportResult, run_report
from tbmq.analytics.report import render_html, throughput_figure
from tbmq.events import IN_PROGRESS_SUFFIX
from tbmq.model import ClientType, Message
from tests.analytics.test_exporter import make_broker, session, stop

REPO = Path(__file__).resolve().parents[2]
EVENTS = 6000


def line_counts(directory) -> tuple[int, int, dict]:
    """(good lines, corrupt lines, good lines per type) of a generated log."""
    good = bad = 0
    types: dict[str, int] = {}
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    bad += 1
                    continue
                good += 1
                types[record["type"]] = types.get(record["type"], 0) + 1
    return good, bad, types


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("log")
    generate(str(directory), GeneratorParams(events=EVENTS, seed=7, corrupt_rate=0.002),
             files=2, workers=1)
    return directory


@pytest.fixture(scope="module")
def report(spark, log_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    lines: list[str] = []
    params = ReportParams(storm_connects=3, auth_threshold=3)
    result = run_report(spark, str(log_dir), str(out), params=params, progress=lines.append)
    return out, result, lines


def test_generator_writes_exactly_n_records(tmp_path):
    generate(str(tmp_path), GeneratorParams(events=1001, seed=3), files=3, workers=1)
    good, bad, types = line_counts(tmp_path)
    assert (good, bad) == (1001, 0)
    assert {"connect", "subscribe", "publish", "deliver"} <= set(types)
    again = tmp_path / "again"
    generate(str(again), GeneratorParams(events=1001, seed=3), files=3, workers=1)
    for name in os.listdir(again):
        assert (again / name).read_bytes() == (tmp_path / name).read_bytes()


def test_every_table_in_parquet_and_csv(spark, report):
    out, result, lines = report
    for name in TABLES:
        assert (out / "parquet" / name).is_dir(), name
        assert spark.read.parquet(str(out / "parquet" / name)).count() == result.rows[name]
        with open(out / "csv" / f"{name}.csv", newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        assert rows[0] == list(result.tables[name].columns), name
        assert len(rows) - 1 == result.rows[name], name
    assert not [p for p in (out / "csv").iterdir() if p.is_dir()]
    assert any(line.startswith("[21/21] drops_by_reason") for line in lines)


def test_counts_equal_the_log(report, log_dir):
    out, result, _ = report
    good, bad, types = line_counts(log_dir)
    summary = dict(zip(result.tables["summary"]["metric"], result.tables["summary"]["value"]))
    assert summary["events"] == good and summary["bad_records"] == bad > 0
    for kind, count in types.items():
        assert summary[f"events_{kind}"] == count
    assert result.tables["traffic_by_topic"]["messages_in"].sum() == types["publish"]
    assert result.tables["traffic_by_topic"]["messages_out"].sum() == types["deliver"]
    assert result.tables["bad_records"]["records"].sum() == bad
    assert set(result.tables["bad_records"]["reason"]) == {"corrupt"}
    published, delivered = set(), []
    for name in os.listdir(log_dir):
        for line in open(os.path.join(log_dir, name), encoding="utf-8"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record["type"] == "publish":
                published.add(record["msg_id"])
            elif record["type"] == "deliver":
                delivered.append(record["msg_id"])
    fanout = result.tables["fanout"]
    assert fanout["messages"].sum() == len(published)
    # deliveries of messages whose publish line is corrupt have no message to count for
    assert (fanout["fanout"] * fanout["messages"]).sum() == sum(m in published for m in delivered)
    assert result.tables["drops_by_reason"]["messages"].sum() == types["drop"]
    # the timeline: the bucket chosen from the day the log spans, every
    # message in one of its buckets
    timeline = result.tables["throughput_timeline"]
    assert set(timeline["bucket_s"]) == {600} and 140 <= len(timeline) <= 241
    assert timeline["messages_in"].sum() == types["publish"]
    assert timeline["messages_out"].sum() == types["deliver"]
    flagged = result.tables["auth_failures_by_address"].query("flagged")
    assert set(flagged["address"]) == {"203.0.113.66", "198.51.100.23"}
    assert len(result.tables["reconnect_storms"]) >= 1


def test_html_references_existing_charts(report):
    out, result, _ = report
    html = (out / "report.html").read_text(encoding="utf-8")
    charts = re.findall(r'src="(charts/[^"]+\.png)"', html)
    assert len(charts) == len(result.charts) >= 10
    for chart in charts:
        data = (out / chart).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000, chart
    for name in TABLES:
        assert f'id="{name}"' in html and f'href="csv/{name}.csv"' in html


def test_report_over_a_running_exporter(spark, tmp_path):
    """The exporter is writing its first file (no rotation yet): the report
    reads what it holds."""
    broker, clock, launcher = make_broker(tmp_path, enabled=True, flush_interval=0.02)
    exporter = launcher.exporters[broker.view]
    dev, app = session("dev-1"), session("app-1", ClientType.APPLICATION)
    try:
        for i in range(60):
            msg = Message(f"live/{i % 3}", b"x" * 10, qos=1, publisher="dev-1",
                          received_at=clock.seconds())
            broker.hooks.message_published(dev, msg)
            broker.hooks.message_delivered(app, msg, 1)
            clock.advance(0.5)
        deadline = time.monotonic() + 10
        while exporter.exported < 120 and time.monotonic() < deadline:
            time.sleep(0.01)
        directory = tmp_path / "data" / "events"
        names = os.listdir(directory)
        assert len(names) == 1 and names[0].endswith(IN_PROGRESS_SUFFIX), names
        assert exporter.sink.rotated == 0 and not exporter.closed
        result = run_report(spark, str(directory), str(tmp_path / "report"),
                            progress=lambda _m: None)
    finally:
        stop(broker, clock)
    summary = dict(zip(result.tables["summary"]["metric"], result.tables["summary"]["value"]))
    assert summary["events"] == 120 and summary["bad_records"] == 0
    assert summary["messages_in"] == summary["messages_out"] == 60
    assert summary["last_ts"] - summary["first_ts"] == 29500
    timeline = result.tables["throughput_timeline"]  # 30 s: by the second
    assert len(timeline) == 30 and set(timeline["bucket_s"]) == {1}
    assert timeline["messages_in"].sum() == 60


def test_no_events_is_an_error(spark, tmp_path):
    out = tmp_path / "report"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NoEventsError, match=f"no records in {empty}; no report written"):
        run_report(spark, str(empty), str(out), progress=lambda _m: None)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "events-x.jsonl").write_text('{"v":1,"type":"publish","ts":1\nnot json\n')
    with pytest.raises(NoEventsError, match="2 records in .*, none valid; no report written"):
        run_report(spark, str(bad), str(out), progress=lambda _m: None)
    (bad / "events-y.jsonl").write_text('{"v":1,"type":"connect","ts":5000,"node":"n",'
                                        '"client_id":"c"}\n')
    with pytest.raises(NoEventsError, match="3 records in .*, 1 valid, none in the time window"):
        run_report(spark, str(bad), str(out), since_ms=6000, progress=lambda _m: None)
    assert not out.exists()


def test_command_over_no_events_exits_non_zero(tmp_path):
    empty = tmp_path / "events"
    empty.mkdir()
    exe = shutil.which("tbmq-analytics")
    cmd = [exe] if exe else [sys.executable, "-m", "tbmq.analytics.cli"]
    run = subprocess.run(cmd + ["report", "--input", str(empty), "--output", str(tmp_path / "r"),
                                "--master", "local[1]", "--quiet"],
                         capture_output=True, text=True, timeout=300)
    ours = [line for line in run.stderr.splitlines() if line.startswith("tbmq-analytics:")]
    assert run.returncode == 1, run.stderr[-3000:]
    assert ours == [f"tbmq-analytics: no events to report: no records in {empty}; "
                    "no report written"]
    assert not (tmp_path / "r").exists()


ISO = re.compile(r"^\d{4}-\d{2}-\d{2}( \d{2}:\d{2}(:\d{2})?)?$")


@pytest.mark.parametrize("rows, bucket_s, label", [
    (1, 1, "1 s"),          # everything in one second
    (121, 30, "30 s"),      # an hour
    (144, 1800, "30 min"),  # three days
])
def test_time_chart_spans_the_data_with_dates(rows, bucket_s, label):
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    start = pd.Timestamp("2024-05-01 10:00:00")
    df = pd.DataFrame({
        "period": [start + pd.Timedelta(seconds=i * bucket_s) for i in range(rows)],
        "bucket_s": bucket_s, "messages_in": range(rows), "bytes_in": range(rows),
        "messages_out": range(rows), "bytes_out": range(rows)})
    fig = throughput_figure(df)
    try:
        fig.canvas.draw()
        top, bottom = fig.axes
        assert top.get_title() == f"Throughput per {label} (UTC)"
        low, high = bottom.get_xlim()  # days: from the first bucket to the end of the last
        assert mdates.num2date(low).replace(tzinfo=None) == start
        assert round((high - low) * 86400) == rows * bucket_s
        labels = [t.get_text() for t in bottom.get_xticklabels() if t.get_text()]
        assert len(labels) >= 2 and all(ISO.match(text) for text in labels), labels
        assert len(set(labels)) == len(labels), labels  # no tick between two dates
        assert all(text.startswith("2024-05-0") for text in labels), labels
    finally:
        plt.close(fig)


def test_html_shows_times_as_dates():
    tables = {
        "summary": pd.DataFrame({"metric": ["events", "first_ts", "last_ts"],
                                 "value": [3, 1704067200000, 1704070800250]}),
        "auth_failures_by_address": pd.DataFrame({
            "address": ["203.0.113.1"], "failures": [2],
            "first_seen": [pd.Timestamp("2024-01-01 00:00:01.250")],
            "last_seen": [pd.Timestamp("2024-01-01 00:10:00")]}),
    }
    result = ReportResult(output="out", tables=tables,
                          rows={name: len(df) for name, df in tables.items()})
    page = render_html(result, {name: (name, "") for name in tables}, inputs=["in"])
    summary = page[page.index('id="summary"'):page.index("</section>")]
    assert "<td>first_ts</td><td>2024-01-01 00:00:00 UTC</td>" in summary
    assert "<td>last_ts</td><td>2024-01-01 01:00:00.250 UTC</td>" in summary
    assert "<td>events</td><td>3</td>" in summary
    assert "1,704,067,200,000" not in page and "1704067200000" not in page
    assert "<td>2024-01-01 00:00:01.250</td><td>2024-01-01 00:10:00</td>" in page
    assert "Events: 2024-01-01 00:00:00 UTC → 2024-01-01 01:00:00.250 UTC" in page


def test_report_renders_in_headless_chromium(report, tmp_path):
    import matplotlib.image as mpimg
    import numpy as np

    out, _, _ = report
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is needed (apt-get install chromium)"
    shot = tmp_path / "shot.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
         "--window-size=1280,2000", "--hide-scrollbars", (out / "report.html").as_uri()],
        capture_output=True, timeout=120, check=True)
    pixels = mpimg.imread(str(shot))[:, :, :3]
    assert pixels.shape[:2] == (2000, 1280)
    rgb = (pixels * 255).astype(np.uint8).reshape(-1, 3)
    colours = {tuple(c) for c in rgb[:: 7]}
    assert len(colours) > 200, "the page looks blank"
    # the charts' blue and orange bars are on screen: the images loaded
    blue = np.all(np.abs(rgb.astype(int) - (31, 119, 180)) < 12, axis=1).sum()
    orange = np.all(np.abs(rgb.astype(int) - (255, 127, 14)) < 12, axis=1).sum()
    assert blue > 2000 and orange > 2000, (blue, orange)


def test_command_help_and_generate(tmp_path):
    exe = shutil.which("tbmq-analytics")
    cmd = [exe] if exe else [sys.executable, "-m", "tbmq.analytics.cli"]
    run = subprocess.run(cmd + ["report", "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "--since" in run.stdout and "--master" in run.stdout
    run = subprocess.run(cmd + ["generate", "--output", str(tmp_path / "g"), "--events", "500",
                                "--workers", "1", "--gzip"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert [p.name for p in (tmp_path / "g").iterdir()] == ["events-gen-000.jsonl.gz"]
    run = subprocess.run(cmd + ["report", "--input", str(tmp_path / "g"), "--output",
                                str(tmp_path / "r"), "--since", "yesterday"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "bad --since" in run.stderr


def test_spark_submit(log_dir, tmp_path):
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    package = tmp_path / "tbmq.zip"
    with zipfile.ZipFile(package, "w") as z:
        for path in (REPO / "tbmq").rglob("*.py"):
            z.write(path, path.relative_to(REPO))
    out = tmp_path / "report"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    run = subprocess.run(
        [str(submit), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.shuffle.partitions=2", "--py-files", str(package),
         str(REPO / "tbmq" / "analytics" / "cli.py"), "report", "--input",
         str(log_dir), "--output", out.as_uri(), "--quiet"],  # a Hadoop path: file://
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-5000:]
    assert (out / "report.html").exists() and (out / "csv" / "summary.csv").exists()
    assert (out / "charts" / "throughput.png").exists()
    good, _, _ = line_counts(log_dir)
    with open(out / "csv" / "summary.csv", newline="") as f:
        summary = {r["metric"]: int(r["value"]) for r in csv.DictReader(f)}
    assert summary["events"] == good
