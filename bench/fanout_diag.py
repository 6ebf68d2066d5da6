"""Where do the fan-out scenario's "lost" messages go?  The fan-out scenario's
clients (1 QoS 0 publisher → N subscribers, the generator's own
:class:`~bench.mqttgen.Client` and :class:`~bench.mqttgen.Stream`), with the
accounting measured instead of assumed:

* the publisher counts the bytes ``send()`` accepted, the packets it queued
  (what the harness used to count as published) and, when it stops, the bytes
  still in its kernel send queue (``SIOCOUTQ``);
* the subscribers' counts are sampled every 0.25 s for ``--observe``
  seconds (not until 3 s of quiet), with the publisher connection's queues on
  both ends (``ss``): so a late delivery shows as late, a loss as a plateau;
* ``--end`` chooses how the publisher ends: ``close`` (as the harness did
  before: once its user-space buffer is empty, a best-effort DISCONNECT with
  a non-blocking ``send`` and ``close()``, the process exits), ``open``
  (stays connected, sends nothing more), ``clean`` (as the harness does now,
  :func:`bench.mqttgen.end_clients`: DISCONNECT, ``shutdown(SHUT_WR)``, wait
  for the broker to close).

The publisher starts only once every subscriber has subscribed, and the
subscribers count from their SUBACK (the harness's QoS 0 publishers used to
start as soon as their own worker was connected, before the subscribers had
subscribed: see RESULTS.md, "The fan-out loss was the harness's").

    python bench/fanout_diag.py --broker tbmq --tbmq-rev HEAD --end close
    python bench/fanout_diag.py --broker mosquitto --end clean --observe 40
    python bench/fanout_diag.py --broker mosquitto --end clean --sndbuf 65536
"""

from __future__ import annotations

import argparse
import fcntl
import json
import multiprocessing as mp
import os
import socket
import struct
import subprocess
import sys
import termios
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench import brokers  # noqa: E402

SIOCOUTQ = termios.TIOCOUTQ  # bytes in the send queue not yet acknowledged by the peer
_ctx = mp.get_context("fork")


def outq(sock) -> int:
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0\0\0\0"))[0]


def sub_proc(port, level, ids, counts, ready, stop):
    from bench.mqttgen import Loop, open_clients
    loop = Loop(coalesce=0.0005)
    clients = open_clients(loop, "127.0.0.1", port, [{"id": i, "sub": "bench/fanout/t", "qos": 0} for i in ids], level)
    for c in clients:
        c.stream.publishes = 0
    ready.set()
    while not stop.is_set():
        loop.run_once(0.02)
        for k, c in enumerate(clients):
            counts[k] = c.stream.publishes


def pub_proc(port, level, duration, end, go, res, observe, sndbuf):
    from bench.mqttgen import PUB_LOW_WATER, Loop, disconnect_packet, end_clients, open_clients, publish_packet, now
    loop = Loop(coalesce=0.0005)
    c = open_clients(loop, "127.0.0.1", port, [{"id": "fo-pub"}], level)[0]
    one = publish_packet("bench/fanout/t", os.urandom(64), 0, level)
    L = len(one)
    n = max(1, PUB_LOW_WATER // L)
    blob = one * n
    st = {"queued": 0}
    sock = c.sock

    def fill(cl):
        cl.outbuf += blob
        st["queued"] += n

    if sndbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    res["local_port"] = sock.getsockname()[1]
    res["packet_len"] = L
    go.wait()
    t0 = now()
    b0 = c.bytes_sent
    c.on_writable = fill
    c.flush()
    while now() < t0 + duration:
        loop.run_once(0.02)
    c.on_writable = None
    res["t_pub_end"] = now() - t0
    res["queued_at_stop"] = st["queued"]
    res["outbuf_at_stop"] = len(c.outbuf)
    res["accepted_at_stop"] = c.bytes_sent - b0
    loop.run_until(lambda: not c.outbuf or c.closed, 60)
    res["t_outbuf_empty"] = now() - t0
    res["queued"] = st["queued"]
    res["accepted"] = c.bytes_sent - b0
    res["whole_packets_accepted"] = res["accepted"] // L
    res["partial_bytes"] = res["accepted"] % L
    res["outq_at_end"] = outq(sock)
    res["error"] = c.error
    if end == "close":
        try:
            sock.send(disconnect_packet(level))
            res["disconnect_sent"] = True
        except OSError as e:
            res["disconnect_sent"] = repr(e)
        c.close()
        res["t_closed"] = now() - t0
        return
    if end == "open":
        time.sleep(observe)
        return
    # clean: DISCONNECT after the rest, shutdown(SHUT_WR), wait for the broker's close
    unclosed = end_clients(loop, [c], observe)
    res["broker_closed_after"] = now() - t0 if not unclosed else None


def ss_queues(port: int, pub_port: int):
    """(broker side Recv-Q, publisher side Send-Q) of the publisher connection."""
    out = subprocess.run(["ss", "-tnH", "state", "all", f"( sport = :{pub_port} or dport = :{pub_port} )"],
                         capture_output=True, text=True).stdout
    broker_rq = pub_sq = None
    states = []
    for line in out.splitlines():
        f = line.split()
        if len(f) < 5:
            continue
        state, rq, sq, local, peer = f[:5]
        states.append(state)
        if local.endswith(f":{port}"):
            broker_rq = int(rq)
        elif local.endswith(f":{pub_port}"):
            pub_sq = int(sq)
    return broker_rq, pub_sq, states


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", default="tbmq", choices=["tbmq", "mosquitto"])
    ap.add_argument("--tbmq-rev", default="HEAD")
    ap.add_argument("--level", type=int, default=5)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--subs", type=int, default=100)
    ap.add_argument("--end", default="close", choices=["close", "open", "clean"])
    ap.add_argument("--sndbuf", type=int, default=0,
                    help="the publisher's SO_SNDBUF (0: the kernel's default, as the harness before; it uses 65536)")
    ap.add_argument("--observe", type=float, default=25.0, help="seconds to sample after the start")
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ["BENCH_TBMQ_SRC"] = brokers.tbmq_source(args.tbmq_rev)
    b = brokers.BROKERS[args.broker]()
    b.start()
    try:
        run(b, args)
    finally:
        b.stop()
        log = b.log_tail(100000)
        b.cleanup()
    interesting = [line for line in log.splitlines() if "connected from" not in line]
    print("broker log (without the connect lines):")
    print("\n".join(interesting[-25:]))


def run(b, args):
    half = args.subs // 2
    groups = [[f"fo-sub{i:03d}" for i in range(k * half, (k + 1) * half)] for k in range(2)]
    counts = [_ctx.Array("q", len(g), lock=False) for g in groups]
    readies = [_ctx.Event() for _ in groups]
    stop = _ctx.Event()
    subs = [_ctx.Process(target=sub_proc, args=(b.port, args.level, g, cnt, r, stop), daemon=True)
            for g, cnt, r in zip(groups, counts, readies)]
    for p in subs:
        p.start()
    for r in readies:
        r.wait(60)
    mgr = _ctx.Manager()
    res = mgr.dict()
    go = _ctx.Event()
    pub = _ctx.Process(target=pub_proc, args=(b.port, args.level, args.duration, args.end, go, res, args.observe,
                                                       args.sndbuf),
                       daemon=True)
    pub.start()
    while "local_port" not in res:
        time.sleep(0.01)
    pub_port = res["local_port"]
    time.sleep(0.2)
    t0 = time.monotonic()
    go.set()
    samples = []
    last_total = -1
    while time.monotonic() - t0 < args.observe:
        time.sleep(0.25)
        per = [c for cnt in counts for c in cnt]
        total = sum(per)
        rq, sq, states = ss_queues(b.port, pub_port)
        t = time.monotonic() - t0
        samples.append((round(t, 2), total, min(per), max(per), rq, sq))
        if total != last_total or rq or sq:
            print(f"t={t:6.2f}s delivered={total:>10,} per sub min/max {min(per):,}/{max(per):,}"
                  f"  broker Recv-Q={rq} publisher Send-Q={sq} {','.join(states)}", flush=True)
        last_total = total
    stop.set()
    pub.join(5)
    if pub.is_alive():
        pub.terminate()
    for p in subs:
        p.join(5)
    r = dict(res)
    per = [c for cnt in counts for c in cnt]
    L = r["packet_len"]
    print(json.dumps(r, indent=1))
    print(f"queued (the old 'published'): {r['queued']:,}; whole packets accepted by send(): "
          f"{r['whole_packets_accepted']:,} (+{r['partial_bytes']} bytes); in the kernel send queue at the end: "
          f"{r['outq_at_end']:,} bytes = {r['outq_at_end'] / L:,.0f} packets")
    print(f"per subscriber: min {min(per):,} max {max(per):,}; missing vs accepted: "
          f"{r['whole_packets_accepted'] - min(per):,} .. {r['whole_packets_accepted'] - max(per):,}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "pub": r, "per_sub": per, "samples": samples}, f)


if __name__ == "__main__":
    main()
