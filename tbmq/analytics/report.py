"""The HTML report: PNG charts drawn with matplotlib (Agg, no display) from
the collected tables, and one self-contained HTML page that links them
(``charts/<name>.png``) and shows the head of every table.
"""

from __future__ import annotations

import datetime as _dt
import html
import os
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import pandas as pd

from tbmq.analytics.transforms import TIME_BUCKETS

__all__ = ["CHARTS", "TABLE_ROWS", "date_format", "format_time", "render_charts", "render_html",
           "throughput_figure"]

#: rows of each table shown in the page
TABLE_ROWS = 25

_IN, _OUT, _ALERT = "#1f77b4", "#ff7f0e", "#d62728"


def _empty(df) -> bool:
    return df is None or len(df) == 0


def _finish(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def date_format(bucket_s: float) -> str:
    """The ``strftime`` format of a time axis with buckets of ``bucket_s``
    seconds: ISO 8601-like dates, with the time of day down to the seconds
    under a minute, to the minutes under a day."""
    if bucket_s < 60:
        return "%Y-%m-%d %H:%M:%S"
    if bucket_s < 86400:
        return "%Y-%m-%d %H:%M"
    return "%Y-%m-%d"


def _bucket_label(bucket_s: float) -> str:
    for label, length in TIME_BUCKETS:
        if length == round(bucket_s * 1000):
            return label
    return f"{bucket_s:g} s"


def throughput_figure(df):
    """The throughput chart: messages (top) and payload bytes (bottom) in
    and out per bucket of the ``throughput_timeline`` table, on a UTC time
    axis from the first bucket to the end of the last, dates as
    :func:`date_format` gives them.

    :param df: the ``throughput_timeline`` table (``period``, ``bucket_s``,
        ``messages_in`` ...), at least one row.
    :returns: the matplotlib figure (the caller closes it).
    """
    bucket_s = float(df["bucket_s"].iloc[0])
    label = _bucket_label(bucket_s)
    x = pd.to_datetime(df["period"])
    fig, axes = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    marker = "." if len(df) <= 60 else None
    for ax, kind, unit in ((axes[0], "messages", "messages"), (axes[1], "bytes", "payload bytes")):
        ax.plot(x, df[f"{kind}_in"], color=_IN, label="in (published)", lw=1.2, marker=marker)
        ax.plot(x, df[f"{kind}_out"], color=_OUT, label="out (delivered)", lw=1.2, marker=marker)
        ax.set_ylabel(f"{unit} / {label}")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right")
    axes[0].set_title(f"Throughput per {label} (UTC)")
    # the axis spans the data: from the first bucket to the end of the last
    end = x.iloc[-1] + pd.Timedelta(seconds=bucket_s)
    axes[1].set_xlim(x.iloc[0], end)
    if len(df) <= 12:  # a tick per bucket boundary, none between (a bucket is one time)
        axes[1].set_xticks([*x, end])
    else:
        axes[1].xaxis.set_major_locator(mdates.AutoDateLocator(minticks=3, maxticks=8, tz=_dt.UTC))
    axes[1].xaxis.set_major_formatter(mdates.DateFormatter(date_format(bucket_s), tz=_dt.UTC))
    axes[1].set_xlabel("time (UTC)")
    fig.autofmt_xdate()
    return fig


def _throughput(t: dict, path: str) -> bool:
    df = t.get("throughput_timeline")
    if _empty(df):
        return False
    _finish(throughput_figure(df), path)
    return True


def _hbar_in_out(df, label: str, title: str, path: str, top: int = 15) -> bool:
    if _empty(df):
        return False
    df = df.head(top).iloc[::-1]
    fig, ax = plt.subplots(figsize=(11, max(3.0, 0.35 * len(df) + 1.5)))
    y = range(len(df))
    ax.barh([i + 0.2 for i in y], df["messages_in"], height=0.4, color=_IN, label="in")
    ax.barh([i - 0.2 for i in y], df["messages_out"], height=0.4, color=_OUT, label="out")
    ax.set_yticks(list(y))
    ax.set_yticklabels([str(v)[:60] for v in df[label]])
    ax.set_xlabel("messages")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    ax.legend()
    _finish(fig, path)
    return True


def _top_topics(t: dict, path: str) -> bool:
    return _hbar_in_out(t.get("traffic_by_topic"), "topic", "Top topics by messages", path)


def _rollups(t: dict, path: str) -> bool:
    df = t.get("traffic_by_rollup")
    if _empty(df):
        return False
    df = df[df["levels"] == df["levels"].max()]
    return _hbar_in_out(df, "topic_prefix",
                        f"Top topic roll-ups ({int(df['levels'].iloc[0])} levels)", path)


def _client_types(t: dict, path: str) -> bool:
    return _hbar_in_out(t.get("traffic_by_client_type"), "client_type",
                        "Messages by client type", path)


def _latency(t: dict, path: str) -> bool:
    rollup, node = t.get("latency_by_rollup"), t.get("latency_by_node")
    if _empty(rollup) and _empty(node):
        return False
    frames = [(df.sort_values("deliveries", ascending=False).head(12), key, name)
              for df, key, name in ((rollup, "topic_prefix", "topic roll-up"), (node, "node", "node"))
              if not _empty(df)]
    fig, axes = plt.subplots(1, len(frames), figsize=(12, 4.5), squeeze=False)
    for ax, (df, key, name) in zip(axes[0], frames):
        x = range(len(df))
        for j, (col, color) in enumerate((("p50_ms", "#2ca02c"), ("p95_ms", _OUT), ("p99_ms", _ALERT))):
            ax.bar([i + (j - 1) * 0.27 for i in x], df[col], width=0.27, color=color,
                   label=col.replace("_ms", ""))
        ax.set_xticks(list(x))
        ax.set_xticklabels([str(v)[:20] for v in df[key]], rotation=30, ha="right")
        ax.set_ylabel("ms")
        ax.set_title(f"Delivery latency by {name}")
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    _finish(fig, path)
    return True


def _qos(t: dict, path: str) -> bool:
    df = t.get("qos_mix")
    if _empty(df):
        return False
    df = df.copy()
    df["kind"] = df.apply(lambda r: f"QoS {int(r['qos'])}" + (" retained" if r["retain"] else ""), axis=1)
    pivot = df.pivot_table(index="direction", columns="kind", values="messages", aggfunc="sum").fillna(0)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    left = [0.0] * len(pivot)
    colors = plt.get_cmap("tab10").colors
    for k, kind in enumerate(pivot.columns):
        ax.barh(list(pivot.index), pivot[kind], left=left, color=colors[k % 10], label=kind)
        left = [a + b for a, b in zip(left, pivot[kind])]
    ax.set_xlabel("messages")
    ax.set_title("QoS and retain mix")
    ax.legend(loc="lower right", fontsize=8)
    _finish(fig, path)
    return True


def _bar(df, x: str, y: str, title: str, xlabel: str, ylabel: str, path: str,
         color=_IN, rotate: int = 0, colors=None) -> bool:
    if _empty(df):
        return False
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.bar([str(v) for v in df[x]], df[y], color=colors if colors is not None else color)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if rotate:
        plt.setp(ax.get_xticklabels(), rotation=rotate, ha="right")
    _finish(fig, path)
    return True


def _fanout(t: dict, path: str) -> bool:
    df = t.get("fanout")
    return _bar(None if _empty(df) else df.head(40), "fanout", "messages",
                "Fan-out: deliveries per published message", "deliveries", "messages", path)


def _sessions(t: dict, path: str) -> bool:
    df = t.get("session_duration_histogram")
    if _empty(df) or df["sessions"].sum() == 0:
        return False
    return _bar(df, "bucket", "sessions", "Connection durations", "duration", "connections",
                path, color="#9467bd")


def _disconnects(t: dict, path: str) -> bool:
    df = t.get("disconnect_reasons")
    return _bar(None if _empty(df) else df.head(12), "reason", "disconnects",
                "Disconnect reasons", "", "disconnections", path, color="#8c564b", rotate=25)


def _auth(t: dict, path: str) -> bool:
    df = t.get("auth_failures_by_address")
    if _empty(df):
        return False
    df = df.head(15)
    colors = [_ALERT if f else "#7f7f7f" for f in df["flagged"]]
    return _bar(df, "address", "failures", "Authentication failures by address "
                "(red: above the threshold)", "", "failures", path, colors=colors, rotate=25)


def _drops(t: dict, path: str) -> bool:
    df = t.get("drops_by_reason")
    return _bar(df, "reason", "messages", "Dropped messages by reason", "", "messages",
                path, color=_ALERT)


#: chart name → (drawing function, the table whose section shows it)
CHARTS: dict[str, tuple[Callable[[dict, str], bool], str]] = {
    "throughput": (_throughput, "throughput_timeline"),
    "top_topics": (_top_topics, "traffic_by_topic"),
    "topic_rollups": (_rollups, "traffic_by_rollup"),
    "client_types": (_client_types, "traffic_by_client_type"),
    "latency": (_latency, "latency_by_rollup"),
    "qos_mix": (_qos, "qos_mix"),
    "fanout": (_fanout, "fanout"),
    "session_durations": (_sessions, "session_duration_histogram"),
    "disconnect_reasons": (_disconnects, "disconnect_reasons"),
    "auth_failures": (_auth, "auth_failures_by_address"),
    "drops": (_drops, "drops_by_reason"),
}


def render_charts(tables: dict, directory: str) -> list[str]:
    """Draw every chart whose table has data.

    :param tables: table name → pandas DataFrame.
    :param directory: where the PNG files go (created).
    :returns: the file names written (``<chart>.png``).
    """
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, (draw, _) in CHARTS.items():
        path = os.path.join(directory, f"{name}.png")
        if draw(tables, path):
            written.append(f"{name}.png")
    return written


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{margin-bottom:0}.meta{color:#666;margin-top:4px}
section{margin:28px 0;border-top:1px solid #ddd;padding-top:8px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f6f8}td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #eee;margin:6px 0}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{background:#f4f6f8;border-radius:6px;padding:10px 16px;min-width:140px}
.card b{display:block;font-size:22px}.bad{background:#fdecea}
.note{color:#666;font-size:13px}
"""


def format_time(value) -> str:
    """A time as the report shows it: ``2024-01-01 12:00:00`` (UTC), with
    milliseconds when it has any (``2024-01-01 12:00:00.125``).

    :param value: a :class:`datetime.datetime` or pandas ``Timestamp``
        (naive ones are UTC, as the tables' are), or epoch milliseconds.
    """
    if not isinstance(value, _dt.datetime):
        value = _dt.datetime.fromtimestamp(int(value) / 1000, _dt.UTC)
    if value.tzinfo is not None:
        value = value.astimezone(_dt.UTC)
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond // 1000:03d}"
    return text


def _fmt_ms(ms) -> str:
    if ms is None or pd.isna(ms):
        return "-"
    return format_time(ms) + " UTC"


def _cell(value) -> str:
    if value is None or (not isinstance(value, (list, tuple)) and pd.isna(value)):
        return ""
    if isinstance(value, _dt.datetime):  # pandas Timestamp too
        return format_time(value)
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return html.escape(str(value))


def _summary_rows(df):
    """The summary table as shown: its epoch-millisecond metrics (``*_ts``)
    as dates."""
    values = [_fmt_ms(v) if str(m).endswith("_ts") else v
              for m, v in zip(df["metric"], df["value"])]
    return pd.DataFrame({"metric": df["metric"], "value": pd.Series(values, dtype=object)})


def _table(df, rows: int) -> str:
    if _empty(df):
        return '<p class="note">No rows.</p>'
    head = df.head(TABLE_ROWS)
    out = ["<table><tr>", *(f"<th>{html.escape(str(c))}</th>" for c in head.columns), "</tr>"]
    for record in head.itertuples(index=False):
        out.append("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in record) + "</tr>")
    out.append("</table>")
    if rows > TABLE_ROWS:
        out.append(f'<p class="note">First {TABLE_ROWS} of {rows:,} rows.</p>')
    return "".join(out)


def render_html(result, tables_meta: dict, *, inputs: list[str], since_ms=None, until_ms=None,
                params=None, title: str | None = None) -> str:
    """The report page.

    :param result: the :class:`tbmq.analytics.jobs.ReportResult` (tables,
        row counts, chart file names).
    :param tables_meta: table name → (title, description).
    :param inputs: the input paths (shown).
    :returns: the HTML text; charts are linked as ``charts/<name>.png``.
    """
    t = result.tables
    summary = {}
    if not _empty(t.get("summary")):
        summary = {r.metric: r.value for r in t["summary"].itertuples(index=False)}
    title = title or "tbmq traffic report"
    generated = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    span = f"{_fmt_ms(summary.get('first_ts'))} → {_fmt_ms(summary.get('last_ts'))}"
    parts = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">Input: {html.escape(", ".join(inputs))}<br>Events: {span}',
    ]
    if since_ms is not None or until_ms is not None:
        parts.append(f"<br>Window: {_fmt_ms(since_ms)} → {_fmt_ms(until_ms)}")
    parts.append(f"<br>Generated {generated} in {result.seconds:.1f} s. Times are UTC.</p>")
    cards = [("events", "events"), ("messages in", "messages_in"), ("messages out", "messages_out"),
             ("bytes in", "bytes_in"), ("bytes out", "bytes_out"), ("clients", "clients"),
             ("topics", "topics"), ("auth failures", "events_auth_fail"), ("drops", "events_drop"),
             ("bad records", "bad_records")]
    parts.append('<div class="cards">')
    for label, key in cards:
        value = summary.get(key, 0)
        cls = "card bad" if key == "bad_records" and value else "card"
        parts.append(f'<div class="{cls}"><b>{_cell(int(value))}</b>{label}</div>')
    parts.append("</div>")
    if params is not None:
        parts.append(
            f'<p class="note">Reconnect storm: more than {params.storm_connects} connects in '
            f'{params.storm_minutes:g} minutes. Authentication failures flagged above '
            f'{params.auth_threshold}. Roll-ups: {", ".join(map(str, params.levels))} levels '
            f'(latency: {params.latency_levels}).</p>')
    charts_by_table: dict[str, list[str]] = {}
    for name, (_, table) in CHARTS.items():
        if f"{name}.png" in result.charts:
            charts_by_table.setdefault(table, []).append(f"{name}.png")
    for name, (heading, description) in tables_meta.items():
        rows = result.rows.get(name, 0)
        parts.append(f'<section id="{name}"><h2>{html.escape(heading)}</h2>')
        parts.append(f'<p class="note">{html.escape(description)} '
                     f'Full table: <a href="csv/{name}.csv">csv/{name}.csv</a>, '
                     f'<code>parquet/{name}/</code>.</p>')
        for chart in charts_by_table.get(name, []):
            parts.append(f'<img src="charts/{chart}" alt="{html.escape(chart)}">')
        df = t.get(name)
        parts.append(_table(_summary_rows(df) if name == "summary" and not _empty(df) else df,
                            rows))
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)
