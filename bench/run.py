#!/usr/bin/env python3
"""Run the benchmark scenarios against tbmq, Mosquitto and amqtt, in turn,
on this machine, and print one table with tbmq's ratio to each.

    python bench/run.py                                  # all but the flow-control scenarios, medians of 3
    python bench/run.py --scenarios fanin_qos0 --duration 2 --repeat 1 --brokers tbmq,mosquitto
    python bench/run.py --scenarios flow --brokers tbmq,mosquitto   # the flow-control scenarios
    python bench/run.py --brokers tbmq,tbmq@5b0764d,mosquitto      # the work tree beside a revision

Each (repeat, scenario, protocol, broker) gets a freshly started broker on a
free loopback port; the runs are interleaved (repeat-major) so slow drifts of
the machine hit every broker alike. Raw figures go to
``bench/out/results-*.json`` as they come.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.brokers import BROKERS, OUT, kind, known, levels_of, make_broker, tbmq_source  # noqa: E402
from bench.brokers import commit_of as _commit_of  # noqa: E402


def _tbmq_rev_from_argv(argv) -> str | None:
    for i, a in enumerate(argv):
        if a == "--tbmq-rev" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--tbmq-rev="):
            return a.split("=", 1)[1]
    return None


# the generator imports the codec of the tbmq tree under test: choose it first
if "BENCH_TBMQ_SRC" not in os.environ:
    os.environ["BENCH_TBMQ_SRC"] = tbmq_source(_tbmq_rev_from_argv(sys.argv[1:]))

from bench import connections as conns  # noqa: E402
from bench import scenarios as sc  # noqa: E402
from bench.mqttgen import raise_nofile  # noqa: E402

#: name → (title, function, kwargs, main metric, unit, higher is better)
SCENARIOS = {
    "fanin_qos0": ("fan-in 10→1, QoS 0", sc.fanin, {"qos": 0}, "delivered", "msg/s", True),
    "fanin_qos1": ("fan-in 10→1, QoS 1", sc.fanin, {"qos": 1}, "delivered", "msg/s", True),
    "fanout_qos0": ("fan-out 1→100, QoS 0", sc.fanout, {"qos": 0}, "delivered", "msg/s", True),
    "p2p_qos1": ("point-to-point 100 pairs, QoS 1", sc.p2p, {"qos": 1}, "delivered", "msg/s", True),
    "latency_qos0": ("latency 1 pair @1000/s, QoS 0", sc.latency, {"qos": 0}, "p50", "ms", False),
    "latency_qos1": ("latency 1 pair @1000/s, QoS 1", sc.latency, {"qos": 1}, "p50", "ms", False),
    "connections": ("idle connections, clean sessions", conns.connections, {}, "connect rate", "CONNECT/s", True),
    "connections_persistent": ("idle connections, persistent sessions", conns.connections, {"persistent": True},
                               "connect rate", "CONNECT/s", True),
    "persistent": ("persistent session drain, QoS 1", sc.persistent, {}, "drain rate", "msg/s", True),
    # issue 21: the persistent APPLICATION client (tbmq: credentials of that client type; Mosquitto: the
    # same persistent client) beside the DEVICE, and QoS 2
    "persistent_qos2": ("persistent session drain, QoS 2", sc.persistent, {"qos": 2}, "drain rate", "msg/s", True),
    "persistent_app": ("persistent APPLICATION drain, QoS 1", sc.persistent, {"app_client": sc.APP_CLIENT_ID},
                       "drain rate", "msg/s", True),
    "persistent_app_qos2": ("persistent APPLICATION drain, QoS 2", sc.persistent,
                            {"qos": 2, "app_client": sc.APP_CLIENT_ID}, "drain rate", "msg/s", True),
    "fanin_app_qos1": ("fan-in 10→1 to a live persistent APPLICATION, QoS 1", sc.fanin,
                       {"qos": 1, "app_client": sc.APP_CLIENT_ID}, "delivered", "msg/s", True),
    # flow control (see "Flow control" in RESULTS.md); fanin_qos1_loss_<size> for each --payload-sizes
    "slow_subscribers": ("4 subscribers beside a stuck and a drip-reading #, QoS 1", sc.slow_subscribers,
                         {"qos": 1}, "worst subscriber's rate with ÷ without them", "%", True),
    "slow_subscribers_qos0": ("4 subscribers beside a stuck and a drip-reading #, QoS 0", sc.slow_subscribers,
                              {"qos": 0}, "worst subscriber's rate with ÷ without them", "%", True),
    "persistent_slow_reader": ("persistent subscriber, Receive Maximum 100, 500 acks/s", sc.persistent_slow_reader,
                               {}, "acknowledged, never delivered", "%", False),
}

#: the fan-in loss scenario at each payload size: --scenarios fanin_qos1_loss runs them all
LOSS = "fanin_qos1_loss"


def loss_scenario(size: int) -> str:
    """Register (once) and name the fan-in loss scenario for ``size`` bytes."""
    label = f"{size // 1024}k" if size % 1024 == 0 else str(size)
    name = f"{LOSS}_{label}"
    if name not in SCENARIOS:
        SCENARIOS[name] = (f"fan-in 10→1 QoS 1, {label}B payloads", sc.fanin_loss, {"payload_size": size},
                           "acknowledged, never delivered", "%", False)
        EXTRA[name] = [("delivered_rate", "delivered", "msg/s", True),
                       ("broker_peak_rss_mb", "broker peak RSS", "MB", False)]
    return name


def _known(name: str) -> bool:
    if name.startswith(LOSS + "_") and name not in SCENARIOS:
        label = name[len(LOSS) + 1:]
        size = int(label[:-1]) * 1024 if label.endswith("k") else int(label)
        loss_scenario(size)
    return name in SCENARIOS


#: --scenarios flow: the flow-control scenarios (not in "all": persistent_slow_reader alone takes
#: 100,000 ÷ 500 acks/s = 200 s per broker)
FLOW = [LOSS, "slow_subscribers", "slow_subscribers_qos0", "persistent_slow_reader"]
BASIC = list(SCENARIOS)[:list(SCENARIOS).index("slow_subscribers")]
#: the drain scenarios of a persistent subscriber (``persistent`` and its variants)
PERSISTENT = {n for n, v in SCENARIOS.items() if v[1] is sc.persistent}

#: scenarios that exist in some MQTT versions only
ONLY_LEVELS = {"persistent_slow_reader": (5,)}

#: extra rows: scenario → [(result key, label, unit, higher is better)]
EXTRA = {
    "latency_qos0": [("p99_ms", "p99", "ms", False), ("max_ms", "max", "ms", False)],
    "latency_qos1": [("p99_ms", "p99", "ms", False), ("max_ms", "max", "ms", False)],
    "connections": conns.EXTRA,
    "connections_persistent": conns.EXTRA,
    **{n: [("drain_s", "time to drain", "s", False), ("publish_rate", "queueing (publish) rate", "msg/s", True)]
       for n in PERSISTENT},
    "slow_subscribers": [("pub_pct", "publishers' rate with ÷ without them", "%", True),
                         ("max_gap_s", "longest a subscriber got nothing", "s", False),
                         ("sub_rate_alone", "subscribers' rate without them", "msg/s", True)],
    "slow_subscribers_qos0": [("pub_pct", "publishers' rate with ÷ without them", "%", True),
                              ("max_gap_s", "longest a subscriber got nothing", "s", False),
                              ("sub_rate_alone", "subscribers' rate without them", "msg/s", True)],
    "persistent_slow_reader": [("acked", "acknowledged to the publisher", "msg", True),
                               ("received", "delivered (unique)", "msg", True),
                               ("acked_rate", "publish (acknowledged) rate", "msg/s", True),
                               ("max_unacked", "most PUBLISH unacknowledged at the subscriber", "msg", False),
                               ("broker_peak_rss_mb", "broker peak RSS", "MB", False)],
}

#: the figures printed per run as it ends
SHOWN = ("value", "lost", "gen_cpu_pct", "broker_cpu_pct", "kb_per_conn", "p99_ms", "drain_s", "error", "errors",
         "seconds", "offered_rate", "other_cpu_pct", "acked", "received", "loss_pct", "delivered_rate",
         "broker_peak_rss_mb", "idle_cpu_pct", "sub_pct", "pub_pct", "max_gap_alone_s", "max_gap_s", "stuck", "drip",
         "drip_received", "duplicates", "max_unacked")

THROUGHPUT = {"fanin_qos0", "fanin_qos1", "fanout_qos0", "p2p_qos1", "fanin_app_qos1"}


def run_one(name: str, broker_name: str, level: int, args, profile: str | None) -> dict:
    title, fn, kw, *_ = SCENARIOS[name]
    env = {}
    kw = dict(kw)
    small = broker_name == "amqtt"
    if name.startswith("connections"):
        kw["count"] = args.amqtt_connections if small else args.connections
        if kw.get("persistent") and kind(broker_name) == "tbmq":
            # all the clients come from 127.0.0.x (default 1,000 persistent sessions per address)
            env["TBMQ_MQTT__MAX_PERSISTENT_SESSIONS_PER_ADDRESS"] = "0"
    elif name in PERSISTENT:
        kw["count"] = args.amqtt_persistent if small else args.persistent
        if kind(broker_name) == "tbmq":
            # the queue of one persistent session must hold them all (default 10,000),
            # as Mosquitto's max_queued_messages 200000
            env["TBMQ_MQTT__MAX_QUEUED_MESSAGES"] = str(2 * kw["count"])
        elif broker_name == "amqtt":
            # the clients send a user name: amqtt queues nothing for anonymous clients
            env["BENCH_AMQTT_ALLOW_ANONYMOUS"] = "false"
    elif name.startswith("latency"):
        kw["duration"] = args.latency_duration or args.duration
    elif name.startswith("slow_subscribers"):
        kw["duration"] = args.slow_duration
        kw["rate"] = args.slow_rate
        kw["drip_bytes"] = args.drip_bytes
    elif name == "persistent_slow_reader":
        kw["count"] = args.slow_reader_count
        kw["ack_rate"] = args.slow_reader_rate
    else:
        kw["duration"] = args.duration
    if profile and (name in THROUGHPUT or name in PERSISTENT):
        kw["profile"] = profile
    waited, others_before = wait_for_quiet(args.quiet_wait, args.quiet_level)
    broker = make_broker(broker_name, env)
    t = time.monotonic()
    try:
        if kw.get("app_client") and kind(broker_name) == "tbmq":
            broker.add_credentials(kw["app_client"], "APPLICATION")
        broker.start()
        busy0, gen0, bro0, t0 = machine_busy_s(), children_cpu_s(), broker.cpu_s(), time.monotonic()
        res = fn(broker, level, **kw)
        res.setdefault("broker_peak_rss_mb", broker.rss_peak_kb() / 1024)
        wall = time.monotonic() - t0
        others = machine_busy_s() - busy0 - (children_cpu_s() - gen0) - (broker.cpu_s() - bro0)
        # CPU used meanwhile by processes that are neither the broker nor the generator
        res["other_cpu_pct"] = max(0.0, 100.0 * others / wall)
        res["loadavg"] = os.getloadavg()[0]
        res["quiet_wait_s"], res["others_before_pct"] = waited, others_before
        if not broker.alive():
            res["errors"] = res.get("errors", []) + [f"broker exited: {broker.log_tail(400)}"]
    except Exception as e:
        res = {"value": None, "error": f"{type(e).__name__}: {e}".strip()[:600]}
        if not args.quiet:
            traceback.print_exc()
        if broker.proc is not None and not broker.alive():
            res["error"] += f" | broker exited {broker.proc.returncode}: {broker.log_tail(400)}"
    finally:
        broker.stop()
        if args.keep_logs:
            res["log"] = broker.log_tail(4000)
        broker.cleanup()
    res["seconds"] = time.monotonic() - t
    return res


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(budget: float, level: float) -> tuple[float, float]:
    """Wait (at most ``budget`` s) until the machine's busy CPU over one
    second is below ``level`` % of one core: other people's test suites share
    this machine. Returns (seconds waited, the last busy %)."""
    t0 = time.monotonic()
    while True:
        b0 = machine_busy_s()
        time.sleep(1.0)
        busy = 100.0 * (machine_busy_s() - b0)
        waited = time.monotonic() - t0
        if busy <= level or waited >= budget:
            return waited, busy


def children_cpu_s() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def fmt(v, unit):
    if v is None:
        return "—"
    if unit in ("ms",):
        return f"{v:.2f}"
    if unit == "%":
        return f"{v:.1f}"
    if unit in ("s", "KB", "MB"):
        return f"{v:.1f}" if v < 100 else f"{v:,.0f}"
    return f"{v:,.0f}"


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def table(results: list[dict], brokers: list[str], scen: list[str], levels: list[int]) -> str:
    """Markdown table: medians over repeats."""
    by = {}
    for r in results:
        by.setdefault((r["scenario"], r["level"], r["broker"]), []).append(r["result"])
    others = [b for b in brokers if b != "tbmq"]
    head = ["scenario", "MQTT", "metric", *brokers]
    if "tbmq" in brokers:
        head += [f"tbmq ÷ {o}" for o in others]
    head += ["lost (max of runs) " + "/".join(brokers), "gen CPU % " + "/".join(brokers),
             "broker CPU % " + "/".join(brokers), "others' CPU % " + "/".join(brokers)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in scen:
        title, _, _, metric, unit, higher = SCENARIOS[name]
        for level in levels:
            runs = {b: by.get((name, level, b)) for b in brokers}
            if not any(runs.values()):
                continue
            rows = [("value", metric, unit, higher)] + EXTRA.get(name, [])
            for i, (key, label, u, hi) in enumerate(rows):
                vals = {}
                cells = []
                for b in brokers:
                    rs = runs[b]
                    if rs is None:
                        cells.append("n/a (no MQTT 5)" if level not in levels_of(b) else "—")
                        vals[b] = None
                        continue
                    ok = [r for r in rs if r.get(key) is not None and not r.get("error")]
                    fails = [r for r in rs if r.get("error")]
                    v = median([r[key] for r in ok])
                    vals[b] = v
                    c = fmt(v, u)
                    if fails:
                        c += f" ({len(fails)}/{len(rs)} failed)"
                    cells.append(c)
                ratios = []
                if "tbmq" in brokers:
                    for o in others:
                        a, bb = vals.get("tbmq"), vals.get(o)
                        ratios.append(f"{a / bb:.2f}" if a and bb else "—")
                extra = []
                if i == 0:
                    lost, gen, bro, oth = [], [], [], []
                    for b in brokers:
                        rs = [r for r in (runs[b] or []) if not r.get("error")]
                        if not rs:
                            lost.append("—"), gen.append("—"), bro.append("—"), oth.append("—")
                            continue
                        o = median([r.get("other_cpu_pct") for r in rs])
                        oth.append(f"{o:.0f}" if o is not None else "—")
                        mx = max(rs, key=lambda r: r.get("lost") or 0)
                        lost.append(f"{mx.get('lost', 0):,}" + (f" ({mx['loss_pct']:.1f}%)" if mx.get("lost") else ""))
                        g = median([r.get("gen_cpu_pct") for r in rs])
                        gen.append(f"{g:.0f}" if g is not None else "—")
                        bc = median([r.get("broker_cpu_pct") for r in rs])
                        bro.append(f"{bc:.0f}" if bc is not None else "—")
                    extra = [" / ".join(lost), " / ".join(gen), " / ".join(bro), " / ".join(oth)]
                else:
                    extra = ["", "", "", ""]
                label_full = f"{label} ({u}, {'higher' if hi else 'lower'} is better)"
                lines.append("| " + " | ".join([title if i == 0 else "", f"{'5.0' if level == 5 else '3.1.1'}",
                                                label_full, *cells, *ratios, *extra]) + " |")
    return "\n".join(lines)


def machine() -> str:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, {platform.platform()}, "
            f"Python {platform.python_version()}")


def print_saved(paths: list[str]) -> int:
    groups: dict = {}
    order_b, order_l = [], []
    for path in paths:
        with open(path) as f:
            saved = json.load(f)
        print(f"<!-- {path}: {saved['date']}, {saved['command']}, tbmq {saved.get('tbmq_commit')} -->")
        mine: dict = {}
        for r in saved["results"]:
            mine.setdefault((r["scenario"], r["level"], r["broker"]), []).append(r)
            if r["broker"] not in order_b:
                order_b.append(r["broker"])
            if r["level"] not in order_l:
                order_l.append(r["level"])
        groups.update(mine)
    results = [r for rs in groups.values() for r in rs]
    brokers = [b for b in BROKERS if b in order_b] + [b for b in order_b if b not in BROKERS]
    for k in groups:
        _known(k[0])
    scen = [s for s in SCENARIOS if any(k[0] == s for k in groups)]
    print(table(results, brokers, scen, sorted(order_l)))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="all",
                    help="comma list of " + ",".join([*SCENARIOS, LOSS])
                    + "; all (" + ",".join(BASIC) + "); flow (" + ",".join(FLOW) + ")")
    ap.add_argument("--brokers", default="tbmq,mosquitto,amqtt",
                    help="comma list of tbmq, mosquitto, amqtt and tbmq@REV (tbmq of git revision REV, "
                         "extracted under bench/out/src-SHA, run in turn with the others)")
    ap.add_argument("--protocol", default="4,5", help="MQTT levels: 4 (3.1.1), 5 (5.0) or 4,5")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0, help="publishing time of throughput scenarios, s")
    ap.add_argument("--latency-duration", type=float, default=None, help="default: --duration")
    ap.add_argument("--connections", type=int, default=10000)
    ap.add_argument("--amqtt-connections", type=int, default=2000)
    ap.add_argument("--persistent", type=int, default=100000)
    ap.add_argument("--amqtt-persistent", type=int, default=10000)
    ap.add_argument("--payload-sizes", default="1024,4096,16384",
                    help=f"payload bytes of {LOSS} (one scenario {LOSS}_<size> each)")
    ap.add_argument("--slow-duration", type=float, default=10.0,
                    help="each of the two phases of slow_subscribers, s")
    ap.add_argument("--slow-rate", type=float, default=1000.0,
                    help="messages/s of each of the 4 publishers of slow_subscribers")
    ap.add_argument("--drip-bytes", type=int, default=65536,
                    help="bytes the drip-reading subscriber of slow_subscribers reads every 2 s")
    ap.add_argument("--slow-reader-count", type=int, default=100000,
                    help="messages published in persistent_slow_reader")
    ap.add_argument("--slow-reader-rate", type=float, default=500.0,
                    help="acknowledgements/s of the subscriber of persistent_slow_reader")
    ap.add_argument("--quiet-wait", type=float, default=0.0,
                    help="before each run wait up to this many seconds for the machine to be quiet")
    ap.add_argument("--quiet-level", type=float, default=30.0,
                    help="'quiet' = the machine busy below this %% of one core over 1 s")
    ap.add_argument("--tbmq-rev", default=None,
                    help="run tbmq from this git revision (extracted under bench/out/src-SHA) "
                         "instead of the work tree, e.g. HEAD")
    ap.add_argument("--mosquitto-conf", default="",
                    help="extra Mosquitto config lines, ';'-separated, e.g. 'max_inflight_messages 1000'")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy tbmq during the throughput scenarios and the queueing of the persistent ones "
                         "(first repeat) into bench/out/")
    ap.add_argument("--json", default=None, help="raw results file (default bench/out/results-DATE.json)")
    ap.add_argument("--markdown", default=None, help="also write the table to this file")
    ap.add_argument("--table-from", nargs="+", metavar="JSON", default=None,
                    help="run nothing: print the table of saved results; for each (scenario, protocol, broker) "
                         "the last file that has it wins (to replace one scenario's runs)")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    if args.table_from:
        return print_saved(args.table_from)
    scen = []
    names = []
    for s in args.scenarios.split(","):
        names += BASIC if s == "all" else FLOW if s == "flow" else [s]
    for s in names:
        if s == LOSS:
            scen += [loss_scenario(int(x)) for x in args.payload_sizes.split(",")]
        elif _known(s):
            scen.append(s)
        else:
            ap.error(f"unknown scenario {s}")
    brokers = args.brokers.split(",")
    for b in brokers:
        if not known(b):
            ap.error(f"unknown broker {b}")
    levels = [int(x) for x in args.protocol.split(",")]
    os.environ["BENCH_MOSQUITTO_CONF"] = args.mosquitto_conf
    nofile = raise_nofile()  # inherited by the brokers and the workers
    os.makedirs(OUT, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    json_path = args.json or os.path.join(OUT, f"results-{stamp}.json")
    header = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "machine": machine(), "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
              "nofile": nofile, "args": vars(args), "tbmq_src": os.environ["BENCH_TBMQ_SRC"],
              "tbmq_commit": _commit_of(os.environ["BENCH_TBMQ_SRC"])}
    print(f"# {header['date']} — {header['machine']} — tbmq {header['tbmq_commit']}", flush=True)
    results = []
    t_all = time.monotonic()
    for rep in range(args.repeat):
        for name in scen:
            for level in levels:
                for b in brokers:
                    if level not in levels_of(b) or level not in ONLY_LEVELS.get(name, (level,)):
                        continue
                    prof = None
                    if args.profile and kind(b) == "tbmq" and rep == 0 and (name in THROUGHPUT or name in PERSISTENT):
                        prof = os.path.join(OUT, f"profile-{name}-v{level}-{b.replace('@', '-')}.raw")
                    res = run_one(name, b, level, args, prof)
                    results.append({"repeat": rep, "scenario": name, "level": level, "broker": b, "result": res})
                    short = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()
                             if k in SHOWN and v not in (None, [])}
                    print(f"[{rep + 1}/{args.repeat}] {name} v{level} {b}: {short}", flush=True)
                    with open(json_path, "w") as f:
                        json.dump({**header, "results": results}, f, indent=1)
    md = table(results, brokers, scen, levels)
    print()
    print(md)
    print(f"\n{len(results)} runs in {time.monotonic() - t_all:.0f}s; raw: {json_path}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"{header['date']} — {header['machine']}\n\n`{header['command']}`\n\n{md}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
