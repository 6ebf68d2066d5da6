"""The markdown tables of :mod:`bench.cluster`: one per kind of scenario
(traffic, idle, connect, kill, storm), medians over the repeats."""

from __future__ import annotations

#: table → (title, columns): (heading, result key, format); format "list"
#: joins a per-node list, "codes" a reason code → count dict
TABLES = {
    "traffic": ("Traffic", [
        ("msg/s", "value", ",.0f"), ("p50 ms", "p50_ms", ".2f"), ("p99 ms", "p99_ms", ".2f"),
        ("lost", "lost", "d"), ("CPU % per node", "node_cpu_pct", "list"),
        ("CPU s / 1,000 msg", "cpu_s_per_1000", ".3f"), ("node CPU µs / msg", "cpu_us_per_msg", ".0f"),
        ("× embedded", "cpu_ratio", ".2f")]),
    "queue": ("Offline persistent subscriber: queueing, then drain", [
        ("queueing msg/s", "queue_rate", ",.0f"), ("drain msg/s", "value", ",.0f"),
        ("lost", "lost", "d"), ("duplicates", "duplicates", "d"),
        ("CPU % per node", "node_cpu_pct", "list"), ("node CPU µs / msg", "cpu_us_per_msg", ".0f"),
        ("× embedded", "cpu_ratio", ".2f")]),
    "idle": ("Idle (no client)", [
        ("CPU % per node", "node_cpu_pct", "list"), ("Tansu CPU %", "tansu_cpu_pct", ".1f"),
        ("Redis CPU %", "redis_cpu_pct", ".1f")]),
    "connect": ("CONNECT burst to node A", [
        ("CONNECT/s", "value", ",.0f"), ("CONNACK p50 ms", "p50_ms", ".1f"),
        ("p99 ms", "p99_ms", ".1f"), ("accepted", "accepted", "d"), ("refused", "refused", "d"),
        ("refusals", "codes", "codes"), ("failed", "failed", "d"),
        ("CPU % per node", "node_cpu_pct", "list"),
        ("node CPU µs / CONNECT", "cpu_us_per_connect", ".0f"), ("× embedded", "cpu_ratio", ".2f")]),
    "kill": ("Node B killed: a new client every 100 ms to node A", [
        ("accepted steadily after s", "recovered_s", ".1f"),
        ("longest CONNACK wait s", "longest_wait_s", ".2f"), ("CONNECTs", "attempts", "d"),
        ("refused", "refused", "d"), ("refused, persistent", "refused_persistent", "d"),
        ("refusals", "codes", "codes"), ("no CONNACK", "unanswered", "d"),
        ("before the kill, ms", "baseline_ms", ".1f")]),
    "storm": ("Reconnect storm: node B killed, its clients reconnect to node A", [
        ("clients", "clients", "d"), ("all back after s", "reconnect_s", ".1f"),
        ("sent before the kill, delivered after s", "delivered_s", ".1f"),
        ("all delivered after s", "all_delivered_s", ".1f"), ("acknowledged", "acked", "d"),
        ("lost", "lost", "d"), ("duplicates", "duplicates", "d"), ("CONNECTs", "attempts", "d"),
        ("refused", "refused", "d"), ("refusals", "codes", "codes"), ("no CONNACK", "timeouts", "d"),
        ("sessions lost", "sessions_lost", "d")]),
}


def _median(values):
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if values else None


def _cell(runs: list, key: str, fmt: str) -> str:
    if fmt in ("list", "codes"):
        values = [r[key] for r in runs if r.get(key)]
        if not values:
            return ""
        v = values[len(values) // 2]
        if fmt == "list":
            return " / ".join(f"{x:.0f}" for x in v)
        return ", ".join(f"{code}: {n}" for code, n in sorted(v.items()))
    v = _median([r.get(key) for r in runs if isinstance(r.get(key), (int, float))])
    if v is None:
        return ""
    return format(int(v), fmt) if fmt == "d" else format(v, fmt)


def tables(results: list, configs: list, names: list, kinds: dict) -> str:
    """The markdown tables of ``results`` (the records of
    :func:`bench.cluster.main`: config, scenario, result), configurations
    and scenarios in run order.

    :param kinds: scenario name → the name of its table in :data:`TABLES`.
    """
    out = []
    for table, (title, columns) in TABLES.items():
        rows = []
        for name in [n for n in names if kinds.get(n) == table]:
            for config in configs:
                runs = [r["result"] for r in results if r["config"] == config and r["scenario"] == name]
                if runs:
                    rows.append(f"| {name} | {config} | "
                                + " | ".join(_cell(runs, key, fmt) for _, key, fmt in columns) + " |")
        if rows:
            out += [f"\n### {title}\n", "| scenario | config | " + " | ".join(c[0] for c in columns) + " |",
                    "|---|---|" + "---|" * len(columns), *rows]
    return "\n".join(out)
