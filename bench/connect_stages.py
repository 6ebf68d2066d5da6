#!/usr/bin/env python3
"""Where a cluster node's CONNACK wait goes, stage by stage: runs
``bench/cluster.py``'s CONNECT bursts with every node traced, then prints
the p50 / p90 of each stage in milliseconds.

    PYTHONPATH=. python bench/connect_stages.py                  # connect_clean, this tree
    PYTHONPATH=. python bench/connect_stages.py --scenarios connect_clean,connect_persistent \\
        --trees worktree,07df37d

The nodes are not changed: a ``sitecustomize`` module put on their
``PYTHONPATH`` (they inherit it, after the tree's own paths) wraps a few
methods as their modules are imported, and each node writes what it saw to
``bench/out/connect-stages-*/stages.<pid>.json``.  For each CONNECT of node
A, keyed by its connection:

* ``accepted``: the connection was made (``MQTTProtocol.connectionMade``:
  the TCP connection accepted, its CONNECT not read yet);
* ``read``: the CONNECT passed the checks before authentication
  (``ConnectHandler.handle_connect``);
* ``request``: the session event request is asked
  (``SessionManager.connect`` → ``SessionEvents.request_connect``);
* ``produce``: the request's (packed) record was handed to the producer
  (``Producer.send`` of its partition of the request topic, at the end of
  the reactor turn that asked it; confluent driver);
* ``ack``: the bus reported the request acknowledged
  (``SessionEvents._sent``; a request that the node decides itself is
  decided before that report reaches ``_sent``, so it has none);
* ``answer``: the answer reached the session manager
  (``SessionManager._open``), ``at once`` when this node decided it while
  asking (its deciding member decides the client id and has read its
  partition: the request is not published), ``local`` when this node
  decided it from the partition (its own record, handed on
  acknowledgement, or read), ``remote`` when the answer came back on
  ``tbmq.client.session.event.response.<serviceId>``;
* ``connack``: the CONNACK was handed to the connection
  (``ConnectHandler._session_opened``; it goes out at the end of the turn).

A connect answered through another node (``remote``) is also traced on the
node that decided it (B), joined by its request id: ``B handed`` (its
request handed to B's deciding member, ``SessionEvents._decide_many``),
``B send`` (its answer, packed with the others of B's turn, handed to B's
producer) and ``B report`` (that answer's delivery report), so that the
way there and back splits into A's produce with B's fetch, B's turn, B's
produce, and A's fetch of the answer with its hand-off to A's reactor
(the nodes share one clock: one machine).

Per node, for the confluent driver: ``produce → report`` per topic (from
``Producer.send`` to the delivery report put to the ack batcher, in
librdkafka's poll thread: the produce round trip, librdkafka's queue and
the poll thread's wait for the GIL) and ``report → reactor`` (from the
first report of a batch to the reactor's drain of it); and per call of the
producer's poll that served reports, how many, and the time from its first
to its last and the longest gap between two (each report's Python callback
takes the GIL in turn: long gaps would be the poll thread waiting for the
reactor).  The client's
CONNECT → CONNACK (the burst's p50) also holds what is outside the node's
``accepted → CONNACK``: the TCP handshake and accept queue, the CONNACK's
way out and the load generator's own scheduling.  Wall-clock
figures: on a loaded machine compare trees in the same run, and repeat.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.stage_trace import FINDER, quantiles, run_traced  # noqa: E402

#: the tracer each node imports at start (``sitecustomize``)
TRACER = r'''
import importlib.abc, importlib.util, json, os, sys, threading, time, zlib
_OUT = os.environ.get("TBMQ_CONNECT_STAGES")
_now = time.time
_rows, _done, _produced, _drains, _sent, _polls = {}, [], [], [], {}, []
#: request id -> [handed to the deciding member, its answer handed to the
#: producer, the answer's delivery report] of another node's connect request
_decided = {}
_state = {"cur": None, "deciding": 0, "asking": 0, "req": {}, "first": {}, "produce": {},
          "answering": [], "answers": {}}


def _dump():
    path = os.path.join(_OUT, f"stages.{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"bus": os.environ.get("TBMQ_BUS", "embedded"),
                   "service_id": os.environ.get("TBMQ_NODE__SERVICE_ID"),
                   "tree": sys.path[1] if len(sys.path) > 1 else None,
                   "rows": _done, "produced": _produced[-50000:], "drains": _drains[-50000:],
                   "polls": _polls[-50000:],
                   "decided": dict(list(_decided.items())[-50000:])}, f)
    os.replace(path + ".tmp", path)


def _stamp(key, stage, value=None):
    _rows.setdefault(key, {})[stage] = _now() if value is None else value


def _wrap(cls, name, before=None, after=None):
    original = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        if before is not None:
            before(self, *args, **kwargs)
        result = original(self, *args, **kwargs)
        if after is not None:
            after(self, *args, **kwargs)
        return result
    setattr(cls, name, wrapper)


def _protocol(m):
    _wrap(m.MQTTProtocol, "connectionMade", before=lambda self, *a, **k: _stamp(id(self), "accepted"))


def _connect(m):
    def opened(self, *a, **k):
        row = _rows.pop(id(self.conn), None)
        if row is not None:
            row["connack"] = _now()
            _done.append(row)
            if len(_done) % 500 == 0:
                _dump()
    _wrap(m.ConnectHandler, "handle_connect", before=lambda self, *a, **k: _stamp(id(self.conn), "read"))
    _wrap(m.ConnectHandler, "_session_opened", after=opened)


def _sessions(m):
    def connect(self, conn, *a, **k):
        _stamp(id(conn), "request")
        _state["cur"] = id(conn)

    def open_(self, conn, *a, **k):
        _stamp(id(conn), "answer")
        _stamp(id(conn), "path", "at once" if _state["asking"] else
               "local" if _state["deciding"] else "remote")
    _wrap(m.SessionManager, "connect", before=connect)
    _wrap(m.SessionManager, "_open", before=open_)


def _events(m):
    def asking(self, *a, **k):
        _state["asking"] += 1

    def asked(self, client_id, *a, **k):
        _state["asking"] -= 1
        request_id = f"{self._request_prefix}{self._requests}"
        _state["req"][request_id] = _state["cur"]
        if _state["cur"] in _rows:
            _stamp(_state["cur"], "request_id", request_id)
        partitions = getattr(self.bus, "_placed", {}).get(self.topics.session_event_request)
        if partitions and _state["cur"] in _rows:  # the bus's placement (Kafka)
            partition = zlib.crc32(client_id.encode()) % partitions
            _stamp(_state["cur"], "partition", partition)
            if "answer" not in _rows[_state["cur"]]:  # published (not decided at once)
                _state["produce"].setdefault(partition, []).append(_state["cur"])

    def sent(self, request_id, failure):
        key = _state["req"].pop(request_id, None)
        if key in _rows:
            _stamp(key, "ack")
    original = m.SessionEvents._decide_many

    def decide_many(self, events):
        now = _now()
        for event in events:  # another node's connect request, decided here
            if event.kind == m.CONNECTION_REQUEST and event.service_id != self.service_id:
                _decided[event.request_id] = [now, None, None]
                _state["answering"].append(event.request_id)
        if len(_decided) // 500 > _state.get("dumps", 0):  # (a node without CONNECTs)
            _state["dumps"] = len(_decided) // 500
            _dump()
        _state["deciding"] += 1
        try:
            return original(self, events)
        finally:
            _state["deciding"] -= 1
    m.SessionEvents._decide_many = decide_many
    _wrap(m.SessionEvents, "request_connect", before=asking, after=asked)
    _wrap(m.SessionEvents, "_sent", before=sent)


def _bridge(m):
    lock = threading.Lock()

    def put(self, done, error=None):
        sent = _sent.pop(id(done), None)
        now = _now()
        for request_id in _state["answers"].pop(id(done), ()):
            _decided[request_id][2] = now
        if sent is not None:
            _produced.append((now - sent[0], sent[1], sent[2]))
        puts = _state.get("puts")
        if puts is not None:
            puts.append(now)
        with lock:
            _state["first"].setdefault(id(self), now)
    original = m.AckBatcher._drain

    def drain(self):
        with lock:
            first = _state["first"].pop(id(self), None)
        if first is not None:
            _drains.append(_now() - first)
        return original(self)
    _wrap(m.AckBatcher, "put", before=put)
    m.AckBatcher._drain = drain


def _confluent(m):
    def send(self, topic, key, value, headers, done, partition=None):
        now = _sent[id(done)] = (_now(), topic, partition)
        answering = _state["answering"]
        if answering and "session.event.response" in topic:
            # the answers decided since the last send of one (packed: one
            # send at the turn's end carries them)
            for request_id in answering:
                _decided[request_id][1] = now[0]
            _state["answers"][id(done)] = list(answering)
            answering.clear()
        waiting = _state["produce"]
        if topic.endswith("session.event.request") and waiting:
            # the requests of this partition asked since the last send of it
            # (packed: one send at the turn's end carries them)
            for row in waiting.pop(partition, ()):
                if row in _rows:
                    _stamp(row, "produce", now[0])
    _wrap(m.Producer, "send", before=send)

    def poll_loop(self):
        producer = self._producer
        while self._running:
            puts = _state["puts"] = []  # the reports this poll serves (AckBatcher.put)
            producer.poll(m.PRODUCER_POLL)
            if puts:  # (how many, first to last, the longest gap between two)
                gaps = [b - a for a, b in zip(puts, puts[1:])]
                _polls.append((len(puts), puts[-1] - puts[0], max(gaps) if gaps else 0.0))
    m.Producer._poll = poll_loop


_PATCHES = {"tbmq.broker.protocol": _protocol, "tbmq.broker.connect": _connect, "tbmq.broker.sessions": _sessions,
            "tbmq.cluster.session_events": _events, "tbmq_plugins.kafka.bridge": _bridge,
            "tbmq_plugins.kafka.confluent": _confluent}


'''

TRACER += FINDER + r'''
if _OUT:
    sys.meta_path.insert(0, _Finder())
'''

STAGES = (("accepted → read", "accepted", "read"), ("read → request", "read", "request"), ("request → ack", "request", "ack"),
          ("request → produce", "request", "produce"), ("produce → ack", "produce", "ack"),
          ("ack → answer", "ack", "answer"), ("request → answer", "request", "answer"),
          ("answer → CONNACK", "answer", "connack"), ("read → CONNACK", "read", "connack"),
          ("accepted → CONNACK", "accepted", "connack"))


def topic_family(topic: str) -> str:
    """``prefix.tbmq.client.session.event.request`` → ``session.event.request``;
    a per-node topic loses its service id."""
    name = topic.split("tbmq.", 1)[-1]
    for family in ("client.session.event.response", "msg.downlink.basic", "msg.downlink.persisted",
                   "client.disconnect"):
        if name.startswith(family):
            return family
    return name


#: the stages of a request another node decided, from both nodes' traces:
#: (title, the stage it starts at, the stage it ends at); ``B:`` stages are
#: the deciding node's (:data:`TRACER`'s ``_decided``), the others node A's
REMOTE = (("A produce → B handed (A's produce, B's fetch and hand-off)", "produce", "B:handed"),
          ("B handed → B answer to its producer (B's turn)", "B:handed", "B:send"),
          ("B answer to producer → B report (B's produce)", "B:send", "B:report"),
          ("B report → A answer (A's fetch and hand-off)", "B:report", "answer"),
          ("A produce → A report (A's produce, for comparison)", "produce", "ack"))


def _cluster_of(service_id: str | None) -> str | None:
    """``b0c1g0x4844-a`` → ``b0c1g0x4844``: the nodes of one configuration."""
    return service_id.rsplit("-", 1)[0] if service_id else None


def _remote_stages(rows: list, decided: dict) -> None:
    """Print :data:`REMOTE` for the ``rows`` answered through another node
    whose trace holds their requests (``decided``, by request id)."""
    joined = []
    for r in rows:
        d = decided.get(r.get("request_id")) if r.get("path") == "remote" else None
        if d is not None and None not in d:
            joined.append({**r, "B:handed": d[0], "B:send": d[1], "B:report": d[2]})
    if not joined:
        return
    print(f"\nremote connects traced on both nodes ({len(joined)}), ms p50 / p90 (count):\n")
    print("| stage | remote |\n|---|---|")
    for title, a, b in REMOTE:
        print(f"| {title} | {quantiles([r[b] - r[a] for r in joined if a in r and b in r])} |")


def report(folder: str) -> None:
    traces = []
    for path in sorted(glob.glob(os.path.join(folder, "stages.*.json"))):
        with open(path) as f:
            traces.append(json.load(f))
    decided: dict = collections.defaultdict(dict)  # configuration -> request id -> stamps
    for data in traces:
        decided[_cluster_of(data["service_id"])].update(data.get("decided") or {})
    for data in traces:
        rows = data["rows"]
        if not rows:
            continue
        print(f"\n## {data['bus']} node {data['service_id'] or ''} ({data['tree']}): "
              f"{len(rows)} CONNECTs, ms p50 / p90 (count)\n")
        paths = sorted({row.get("path", "?") for row in rows})
        print("| stage | " + " | ".join(paths) + " |")
        print("|---|" + "---|" * len(paths))
        for title, a, b in STAGES:
            cells = [quantiles([r[b] - r[a] for r in rows if r.get("path", "?") == p
                                and a in r and b in r]) for p in paths]
            print(f"| {title} | " + " | ".join(cells) + " |")
        by_partition = collections.defaultdict(list)
        for r in rows:
            if "partition" in r and "answer" in r:
                by_partition[(r["partition"], r.get("path", "?"))].append(r["answer"] - r["request"])
        for (partition, path), values in sorted(by_partition.items()):
            print(f"| request → answer, partition {partition} of the requests, {path} | "
                  f"{quantiles(values)} |")
        produced = collections.defaultdict(list)
        for seconds, topic, partition in data["produced"]:
            produced[topic_family(topic)].append(seconds)
            if topic_family(topic) == "client.session.event.request":
                produced[f"{topic_family(topic)} [{partition}]"].append(seconds)
        for family, values in sorted(produced.items()):
            if len(values) >= 10:
                print(f"| produce → report, {family} | {quantiles(values)} |")
        if data["drains"]:
            print(f"| report → reactor | {quantiles(data['drains'])} |")
        polls = data.get("polls") or []
        if polls:
            print(f"| producer poll: reports per poll | p50 {sorted(p[0] for p in polls)[len(polls) // 2]}, "
                  f"p90 {sorted(p[0] for p in polls)[int(len(polls) * 0.9)]} ({len(polls)} polls) |")
            print(f"| producer poll: first → last report of a poll | {quantiles([p[1] for p in polls])} |")
            print(f"| producer poll: longest gap between two reports | {quantiles([p[2] for p in polls])} |")
        _remote_stages(rows, decided[_cluster_of(data["service_id"])])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="connect_clean")
    ap.add_argument("--trees", default="worktree")
    ap.add_argument("--drivers", default="confluent")
    ap.add_argument("--report", help="only print the report of this folder of a past run")
    args, rest = ap.parse_known_args()
    if args.report:
        report(args.report)
        return
    folder = run_traced(TRACER, "TBMQ_CONNECT_STAGES", "connect-stages-",
                        ["--drivers", args.drivers, "--scenarios", args.scenarios,
                         "--trees", args.trees, "--no-mosquitto", *rest])
    report(folder)


if __name__ == "__main__":
    main()
