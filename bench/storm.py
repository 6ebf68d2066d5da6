"""Clients that lose their node and come back, for the ``kill`` and
``storm`` scenarios of :mod:`bench.cluster` and for
``tests/integration/test_cluster_storm.py``.

* :class:`StormFleet`: pairs of a QoS 1 publisher and a persistent QoS 1
  subscriber (v5 Session Expiry Interval 3600) on ``<topic>/<index>``, over
  non-blocking sockets in one :class:`~bench.mqttgen.Loop`. Every payload is
  tagged (pair index, sequence number). A client whose connection is lost
  reconnects, to :attr:`StormFleet.port`, after a random delay of 0 to
  ``first_delay`` seconds, then every ``retry`` seconds until a CONNACK
  accepts it (as a client with automatic reconnect does); a publisher then
  sends its unacknowledged PUBLISH again with DUP set [MQTT-4.4.0-1], a
  subscriber whose session was not kept (Session Present 0) subscribes again
  and is counted. :meth:`StormFleet.report` compares, message by message,
  what was acknowledged to the publishers with what reached the subscribers.
* :func:`storm_worker`: a fleet in a worker process of
  :class:`bench.scenarios.Workers`.
* :func:`probe_connects`: a new client every ``interval`` seconds (its own
  client id each time) while a node is killed: how long a CONNACK takes,
  which are refused, and when CONNECTs are accepted again steadily.
"""

from __future__ import annotations

import heapq
import os
import random
import socket
import struct
import time
from array import array

from .mqttgen import (
    Client, Loop, connect_packet, cpu_seconds, disconnect_packet, now, pid_offset, publish_packet,
    raise_nofile, subscribe_packet,
)

#: (pair index, sequence number) at the start of a payload
TAG = struct.Struct("!II")

#: a CONNECT answered later than this (seconds) is not "accepted steadily"
PROMPT = 1.0

#: the most lost messages :meth:`StormFleet.report` describes one by one
LOST_SHOWN = 8


class Conn(Client):
    """A :class:`~bench.mqttgen.Client` that tells its fleet
    what it read and that it was lost."""

    __slots__ = ("owner", "fleet", "port")

    def readable(self) -> None:
        super().readable()
        self.fleet.activity(self)

    def fail(self, exc) -> None:
        was_closed = self.closed
        super().fail(exc)
        if not was_closed:
            self.fleet.lost(self)


class Member:
    """One client of a :class:`StormFleet` and its counters.

    :ivar kind: ``"pub"`` or ``"sub"``.
    :ivar state: ``"down"``, ``"connecting"`` or ``"up"``.
    :ivar t_up: when the last accepted CONNACK came (``now()`` seconds).
    :ivar t_lost: when the connection was last lost, or None.
    :ivar ups: the accepted connections so far, each ``[t_up, port,
        session present, t_lost or None]``; connection ``n`` (from 1) is
        ``ups[n - 1]``.
    """

    def __init__(self, kind: str, index: int, client_id: str) -> None:
        self.kind, self.index, self.client_id = kind, index, client_id
        self.conn: Conn | None = None
        self.state = "down"
        self.fresh = True      # the first CONNECT: Clean Start, a new session
        self.subscribed = kind == "pub"
        self.t_up = self.t_lost = None
        self.ups: list[list] = []
        self.attempts = self.refused = self.timeouts = self.failures = 0
        self.codes: dict[int, int] = {}
        self.losses = self.sessions_lost = 0
        # a publisher's messages (those before ``base`` were sent while
        # the subscriptions were still on their way: not counted)
        self.seq = self.base = 0
        self.sent_at: list[float] = []
        # per seq: the connection (a number of ``ups``) it was first sent
        # on and the one its PUBACK came on (0: none yet), and when
        self.sent_on = array("H")
        self.acked_on = array("H")
        self.acked_at: list[float] = []
        self.inflight: dict[int, tuple[int, bytes]] = {}  # packet id -> (seq, PUBLISH)
        self.next_pid = 1
        self.acked = bytearray()
        self.acked_n = self.refused_acks = self.skipped = 0
        # a subscriber's deliveries: seq -> first delivery time
        self.first: dict[int, float] = {}
        self.duplicates = self.strays = 0

    def on_publish(self, payload: bytes, _u=TAG.unpack_from) -> None:
        index, seq = _u(payload, 0)
        if index != self.index:
            self.strays += 1
        elif seq in self.first:
            self.duplicates += 1
        else:
            self.first[seq] = now()


class StormFleet:
    """``len(pairs)`` publisher/subscriber pairs that reconnect when their
    node goes away (see the module docstring).

    :param host: the brokers' address.
    :param pairs: the pair indexes (client ids ``<prefix>-p<i>``,
        ``<prefix>-s<i>``, topic ``<topic>/<i>``).
    :param rate_each: messages/s of each publisher.
    :param level: the MQTT level (5: reason codes and session expiry).
    :param first_delay: seconds, the most a client waits before its first
        reconnect after a loss (uniformly random from 0).
    :param retry: seconds between attempts after a refusal or a failure.
    :param connack_timeout: seconds an attempt waits for its CONNACK.
    :param window: the most unacknowledged PUBLISH per publisher; a message
        due beyond it (or while disconnected) is skipped, not queued.
    :param loop: the :class:`~bench.mqttgen.Loop` (a new one when None).
    """

    def __init__(self, host: str, pairs, prefix: str, topic: str, rate_each: float,
                 level: int = 5, expiry: int = 3600, payload_size: int = 64, first_delay: float = 1.0,
                 retry: float = 1.0, connack_timeout: float = 15.0, window: int = 100,
                 seed: int | None = None, loop: Loop | None = None) -> None:
        self.host, self.topic, self.level, self.expiry = host, topic, level, expiry
        self.rate_each, self.first_delay, self.retry = rate_each, first_delay, retry
        self.connack_timeout, self.window = connack_timeout, window
        self.payload_size = max(TAG.size, payload_size)
        self.loop = loop or Loop()
        self.random = random.Random(seed)
        self.port: int | None = None
        #: port → a name for :meth:`report` (``"A"``, ``"B"``)
        self.port_names: dict[int, str] = {}
        self.subs = [Member("sub", i, f"{prefix}-s{i}") for i in pairs]
        self.pubs = [Member("pub", i, f"{prefix}-p{i}") for i in pairs]
        self.members = self.subs + self.pubs
        self.templates = {}
        for m in self.pubs:
            one = publish_packet(f"{topic}/{m.index}", bytes(self.payload_size), 1, level, packet_id=1)
            self.templates[m.index] = (one, pid_offset(one), len(one) - self.payload_size)
        self.timers: list = []
        self._n = 0
        self.publishing = False
        self.cap: int | None = None
        self.waiting: list[Member] = []
        self.connecting = 0
        self.cold = 0  # subscribers that had received nothing at the end of warm_up
        self._settled_at = 0.0

    # -- timers and the loop --------------------------------------------------

    def at(self, t: float, fn, *args) -> None:
        self._n += 1
        heapq.heappush(self.timers, (t, self._n, fn, args))

    def step(self, timeout: float = 0.05) -> None:
        """Run the timers due, then serve the sockets for up to ``timeout`` s."""
        t = now()
        while self.timers and self.timers[0][0] <= t:
            _, _, fn, args = heapq.heappop(self.timers)
            fn(*args)
        if self.timers:
            timeout = max(0.0, min(timeout, self.timers[0][0] - now()))
        self.loop.run_once(timeout)

    def run(self, cond, timeout: float) -> bool:
        """Serve until ``cond()`` is true (:returns: True) or ``timeout`` s."""
        deadline = now() + timeout
        while not cond():
            if now() >= deadline:
                return False
            self.step(min(0.05, max(0.0, deadline - now())))
        return True

    def idle(self, seconds: float) -> None:
        """Serve for ``seconds``."""
        self.run(lambda: False, seconds)

    # -- connections ----------------------------------------------------------

    def connect(self, port: int, timeout: float = 120.0, window: int = 200) -> bool:
        """Connect (and subscribe) every client to ``port``, at most
        ``window`` handshakes at a time; :returns: whether all are up
        within ``timeout`` s. The counters start again from zero after."""
        self.port = port
        self.cap = window
        for m in self.members:
            self.attempt(m)
        ok = self.run(self.all_up, timeout)
        self.cap = None
        for m in self.members:
            m.attempts = m.refused = m.timeouts = m.failures = 0
            m.codes.clear()
        return ok

    def _state(self, m: Member, state: str) -> None:
        self.connecting += (state == "connecting") - (m.state == "connecting")
        m.state = state

    def attempt(self, m: Member) -> None:
        if m.state != "down":
            return
        if self.cap is not None and self.connecting >= self.cap:
            self.waiting.append(m)
            return
        m.attempts += 1
        c = Conn(self.loop, m.client_id, self.level, m.on_publish if m.kind == "sub" else None)
        c.owner, c.fleet, c.port = m, self, self.port
        if m.kind == "pub":
            c.stream.ack_ids, c.stream.refused_ids = [], []
        try:
            c.start_connect(self.host, self.port)
        except OSError:
            m.failures += 1
            self.at(now() + self.retry, self.attempt, m)
            return
        m.conn = c
        self._state(m, "connecting")
        if m.kind == "sub":
            c.send(connect_packet(m.client_id, self.level, m.fresh, 300, self.expiry))
        else:
            c.send(connect_packet(m.client_id, self.level, True, 300, 0))
        self.at(now() + self.connack_timeout, self._timed_out, m, c)

    def _next_waiting(self) -> None:
        while self.waiting and self.cap is not None and self.connecting < self.cap:
            self.attempt(self.waiting.pop(0))

    def _timed_out(self, m: Member, c: Conn) -> None:
        if m.conn is c and m.state == "connecting":
            m.timeouts += 1
            self._down(m, self.retry)

    def _down(self, m: Member, delay: float) -> None:
        if m.conn is not None and not m.conn.closed:
            m.conn.close()
        self._state(m, "down")
        self.at(now() + delay, self.attempt, m)
        self._next_waiting()

    def lost(self, c: Conn) -> None:
        """``c`` failed or the broker closed it."""
        m = c.owner
        if m.conn is not c:
            return
        if m.state == "up":
            m.losses += 1
            m.t_lost = now()
            if m.ups:
                m.ups[-1][3] = m.t_lost
            self._down(m, self.random.uniform(0.0, self.first_delay))
        elif m.state == "connecting":
            m.failures += 1
            self._down(m, self.retry)

    def activity(self, c: Conn) -> None:
        """``c`` read something: a CONNACK, a SUBACK, PUBACKs."""
        m = c.owner
        if m.conn is not c or c.closed:
            return
        st = c.stream
        if m.state == "connecting":
            if st.connack is None:
                return
            code = st.connack.reason_code
            if code:
                m.refused += 1
                m.codes[code] = m.codes.get(code, 0) + 1
                self._down(m, self.retry)
                return
            self._state(m, "up")
            m.t_up = now()
            m.ups.append([m.t_up, c.port, bool(st.connack.session_present), None])
            if m.kind == "sub":
                if not m.fresh and not st.connack.session_present:
                    m.sessions_lost += 1
                if m.fresh or not st.connack.session_present:
                    m.subscribed = False
                    c.send(subscribe_packet(f"{self.topic}/{m.index}", 1, self.level))
                m.fresh = False
            else:
                for pid, (seq, pkt) in sorted(m.inflight.items(), key=lambda kv: kv[1][0]):
                    dup = bytearray(pkt)
                    dup[0] |= 0x08  # DUP [MQTT-3.3.1-1]
                    c.send(dup)
            self._next_waiting()
        if m.kind == "sub":
            if not m.subscribed and st.suback is not None:
                m.subscribed = True
        else:
            self._collect(m, st)

    def _collect(self, m: Member, st) -> None:
        for pid in st.ack_ids:
            entry = m.inflight.pop(pid, None)
            if entry is not None and not m.acked[entry[0]]:
                seq = entry[0]
                m.acked[seq] = 1
                m.acked_n += 1
                m.acked_on[seq] = len(m.ups)
                m.acked_at[seq] = now()
        st.ack_ids.clear()
        for pid in st.refused_ids:
            if m.inflight.pop(pid, None) is not None:
                m.refused_acks += 1
        st.refused_ids.clear()

    # -- publishing -----------------------------------------------------------

    def start_publishing(self) -> None:
        """Every publisher sends ``rate_each`` messages/s from a random
        phase on, until :meth:`stop_publishing`."""
        self.publishing = True
        t = now()
        for m in self.pubs:
            self.at(t + self.random.uniform(0.0, 1.0 / self.rate_each), self._tick, m)

    def stop_publishing(self) -> None:
        self.publishing = False

    def warm_up(self, timeout: float = 60.0) -> bool:
        """Publish (:meth:`start_publishing` first) until every subscriber
        has received a message: then the node that matches each topic (the
        partition of ``tbmq.msg.all`` is chosen by topic name) knows its
        subscriber. The messages sent until then are left out of
        :meth:`report` (but ``warmup_lost``). :returns: whether all came
        within ``timeout`` s."""
        ok = self.run(lambda: all(s.first for s in self.subs), timeout)
        self.cold = sum(1 for s in self.subs if not s.first)
        for p in self.pubs:
            p.base = p.seq
        return ok

    def _tick(self, m: Member) -> None:
        if not self.publishing:
            return
        self.at(now() + 1.0 / self.rate_each, self._tick, m)
        if m.state != "up" or len(m.inflight) >= self.window:
            m.skipped += 1
            return
        one, pid_at, pay_at = self.templates[m.index]
        pid = m.next_pid
        while pid in m.inflight:
            pid = pid % 65535 + 1
        m.next_pid = pid % 65535 + 1
        pkt = bytearray(one)
        pkt[pid_at], pkt[pid_at + 1] = pid >> 8, pid & 0xFF
        TAG.pack_into(pkt, pay_at, m.index, m.seq)
        m.inflight[pid] = (m.seq, bytes(pkt))
        m.sent_at.append(now())
        m.sent_on.append(len(m.ups))
        m.acked_on.append(0)
        m.acked_at.append(0.0)
        m.acked.append(0)
        m.seq += 1
        m.conn.send(pkt)

    # -- state ----------------------------------------------------------------

    def all_up(self) -> bool:
        """Every client connected (and every subscriber subscribed)."""
        return all(m.state == "up" and m.subscribed for m in self.members)

    def all_back(self) -> bool:
        """Every client lost its connection (the node was killed: it may
        take a moment to notice) and is up again."""
        return all(m.losses for m in self.members) and self.all_up()

    def missing(self) -> int:
        """Messages acknowledged to a publisher and not delivered (yet)."""
        lost = 0
        for p, s in zip(self.pubs, self.subs):
            first = s.first
            lost += sum(1 for seq in range(p.base, p.seq) if p.acked[seq] and seq not in first)
        return lost

    def settled(self) -> bool:
        """Every client up, nothing unacknowledged, every acknowledged
        message delivered (looked at every 0.2 s at most)."""
        if now() - self._settled_at < 0.2:
            return False
        self._settled_at = now()
        return self.all_up() and not any(p.inflight for p in self.pubs) and not self.missing()

    def report(self, t_kill: float) -> dict:
        """The figures, times in seconds from ``t_kill``:

        * reconnect_s: until the last client that lost its connection was
          accepted again (None if one is still down);
        * delivered_s: until every acknowledged message sent before the kill
          was delivered; all_delivered_s: every acknowledged message;
        * sent, acked, lost (acknowledged and never delivered: must be 0),
          after the warm-up (:meth:`warm_up`); duplicates;
          unacked_delivered: delivered though its PUBACK never came;
        * attempts, refused (CONNACK >= 0x80), codes, timeouts (no CONNACK
          in ``connack_timeout``), failures (connection closed or failed);
          sessions_lost: subscribers back with Session Present 0;
          disconnects: connections lost (the kill's, and any later);
          cold_subscribers: those :meth:`warm_up` gave up on.
        """
        hit = [m for m in self.members if m.losses]
        down = [m for m in self.members if m.state != "up"]
        lost = dup = unacked_delivered = warmup_lost = 0
        last_pre = last_all = t_kill
        lost_messages = []
        for p, s in zip(self.pubs, self.subs):
            first = s.first
            dup += s.duplicates
            warmup_lost += sum(1 for seq in range(p.base) if p.acked[seq] and seq not in first)
            for seq in range(p.base, p.seq):
                a, t = p.acked[seq], first.get(seq)
                if not a:
                    unacked_delivered += t is not None
                elif t is None:
                    lost += 1
                    if len(lost_messages) < LOST_SHOWN:
                        lost_messages.append(self.describe_lost(p, s, seq, t_kill))
                else:
                    last_all = max(last_all, t)
                    if p.sent_at[seq] < t_kill:
                        last_pre = max(last_pre, t)
        codes: dict[int, int] = {}
        for m in self.members:
            for code, n in m.codes.items():
                codes[code] = codes.get(code, 0) + n
        total = lambda attr: sum(getattr(m, attr) for m in self.members)  # noqa: E731
        return {
            "clients": len(self.members), "lost_connection": len(hit), "still_down": len(down),
            "reconnect_s": None if down or not hit else max(m.t_up for m in hit) - t_kill,
            "delivered_s": last_pre - t_kill, "all_delivered_s": last_all - t_kill,
            "sent": sum(p.seq - p.base for p in self.pubs),
            "acked": sum(sum(p.acked[p.base:]) for p in self.pubs), "warmup_lost": warmup_lost,
            "refused_pubacks": sum(p.refused_acks for p in self.pubs),
            "unacked": sum(len(p.inflight) for p in self.pubs),
            "skipped": sum(p.skipped for p in self.pubs),
            "received": sum(sum(1 for seq in s.first if seq >= p.base) for p, s in zip(self.pubs, self.subs)),
            "lost": lost, "duplicates": dup,
            "strays": sum(s.strays for s in self.subs), "unacked_delivered": unacked_delivered,
            "attempts": total("attempts"), "refused": total("refused"), "codes": codes,
            "timeouts": total("timeouts"), "failures": total("failures"),
            "sessions_lost": total("sessions_lost"), "disconnects": total("losses"),
            "cold_subscribers": self.cold, "lost_messages": lost_messages,
        }

    def describe_lost(self, p: Member, s: Member, seq: int, t_kill: float) -> dict:
        """One lost message of :meth:`report`, to match with the nodes'
        logs: times in seconds from ``t_kill`` (``kill_utc``: the kill's
        wall clock time), connections as ``[number, node, up at, session
        present, lost at]`` (a node named by :attr:`port_names`).

        :returns: pair, seq, pub and sub (client ids), sent and acked
            (times), sent_on and acked_on (the publisher's connections),
            sub_conns (every connection of the subscriber), before and
            after (the nearest seqs delivered on either side, with their
            delivery times)."""
        rel = lambda t: None if t is None else round(t - t_kill, 3)  # noqa: E731

        def conn(m: Member, n: int) -> list | None:
            if not n:
                return None
            t_up, port, present, t_lost = m.ups[n - 1]
            return [n, self.port_names.get(port, port), rel(t_up), present, rel(t_lost)]

        first = s.first
        before = max((q for q in first if q < seq), default=None)
        after = min((q for q in first if q > seq), default=None)
        wall = time.time() - (now() - t_kill)
        return {
            "pair": p.index, "seq": seq, "pub": p.client_id, "sub": s.client_id,
            "kill_utc": time.strftime("%H:%M:%S", time.gmtime(wall)) + f"{wall % 1:.3f}"[1:],
            "sent": rel(p.sent_at[seq]), "acked": rel(p.acked_at[seq]),
            "sent_on": conn(p, p.sent_on[seq]), "acked_on": conn(p, p.acked_on[seq]),
            "sub_conns": [conn(s, n) for n in range(1, len(s.ups) + 1)],
            "before": None if before is None else [before, rel(first[before])],
            "after": None if after is None else [after, rel(first[after])],
        }

    def close(self) -> None:
        """DISCONNECT (Session Expiry 0 is not sent: the sessions stay) and
        close every connection."""
        self.publishing = False
        for m in self.members:
            c = m.conn
            if c is not None and not c.closed:
                try:
                    c.sock.send(disconnect_packet(self.level))
                except OSError:
                    pass
                c.close()


def storm_worker(ctl, role: dict) -> None:
    """A :class:`StormFleet` in a worker process: it connects its clients
    to node B, publishes and warms up (:meth:`StormFleet.warm_up`), then
    waits for node B to be killed.

    ``role``: host, port (node B, where the clients start), port_a (where
    they reconnect), first, pairs (indexes ``first .. first+pairs-1``),
    prefix, topic, rate_each, seed, reconnect_timeout, drain_timeout.

    Protocol: → ("ready") ← ("killed", t_kill) → ("reconnected", info)
    ← ("stop",) → ("done", :meth:`StormFleet.report` plus cpu).
    """
    try:
        raise_nofile()
        loop = Loop(ctl)
        fleet = StormFleet(role["host"], range(role["first"], role["first"] + role["pairs"]),
                           role["prefix"], role["topic"], role["rate_each"], seed=role.get("seed"),
                           loop=loop)
        if not fleet.connect(role["port"], timeout=role.get("connect_timeout", 300)):
            raise TimeoutError(f"{sum(m.state != 'up' for m in fleet.members)} clients not "
                               f"connected to node B")
        fleet.port = role["port_a"]
        fleet.port_names = {role["port"]: "B", role["port_a"]: "A"}
        cpu0 = cpu_seconds()
        fleet.start_publishing()
        fleet.warm_up(role.get("warm_up_timeout", 60))  # else reported: cold_subscribers
        ctl.send(("ready", {"pid": os.getpid()}))

        def ctl_msg(kind: str, timeout: float):
            if not fleet.run(lambda: bool(loop.ctl_msgs), timeout):
                raise TimeoutError(f"no {kind} from the runner")
            msg = loop.ctl_msgs.pop(0)
            if msg[0] != kind:
                raise RuntimeError(f"expected {kind}, got {msg[0]}")
            return msg

        t_kill = ctl_msg("killed", 3600)[1]
        up = fleet.run(fleet.all_back, role.get("reconnect_timeout", 300))
        ctl.send(("reconnected", {"all_up": up, "t": now()}))
        ctl_msg("stop", 3600)
        fleet.stop_publishing()
        fleet.run(fleet.settled, role.get("drain_timeout", 120))
        report = fleet.report(t_kill)
        report["cpu"] = cpu_seconds() - cpu0
        ctl.send(("done", report))
        fleet.close()
    except Exception as e:
        import traceback
        ctl.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))


def probe_connects(host: str, port: int, kill, prefix: str, before: float = 1.0,
                   interval: float = 0.1, window: float = 15.0, steady: float = 5.0,
                   limit: float = 120.0, level: int = 5) -> dict:
    """A new client every ``interval`` s CONNECTs to ``port`` (v5, Clean
    Start, every other one with Session Expiry 300: a persistent session
    too); ``kill()`` is called ``before`` s after the first. Each is
    disconnected once accepted. Runs at least ``window`` s after the kill
    and until every CONNECT sent in the last ``steady`` s was accepted
    within :data:`PROMPT` s (``limit`` s at most).

    :returns: longest_wait_s (CONNECT sent → CONNACK, an unanswered one up
        to the end), refused (reason code >= 0x80) and codes, unanswered,
        recovered_s (from the kill to the first CONNECT after which every
        one was accepted promptly; 0 when none was slow or refused),
        attempts, baseline_ms (the median wait before the kill),
        refused_persistent, all after the kill.
    """
    loop = Loop()
    tries: list[dict] = []
    pending: list[dict] = []
    t_start = now()
    t_kill = None
    n = 0

    def last_bad():
        bad = [t["sent"] for t in tries if t["sent"] >= t_kill and (
            t["code"] is None or t["code"] >= 0x80 or t["wait"] > PROMPT)]
        return max(bad) if bad else None

    while True:
        t = now()
        if t_kill is None and t - t_start >= before:
            kill()
            t_kill = now()
        if t >= t_start + n * interval:
            c = Client(loop, f"{prefix}-{n}", level)
            try:
                c.start_connect(host, port)
                c.send(connect_packet(c.name, level, True, 60, 300 if n % 2 else 0))
                pending.append({"c": c, "sent": now(), "persistent": bool(n % 2)})
            except OSError:
                tries.append({"sent": now(), "code": None, "wait": 0.0, "persistent": bool(n % 2)})
            n += 1
        loop.run_once(0.005)
        t = now()
        for p in [p for p in pending if p["c"].stream.connack is not None or p["c"].closed]:
            pending.remove(p)
            c = p.pop("c")
            ca = c.stream.connack
            p["code"] = None if ca is None else ca.reason_code
            p["wait"] = t - p["sent"]
            if ca is not None and not ca.reason_code:
                c.send(disconnect_packet(level))
            c.close()
            tries.append(p)
        if t_kill is None:
            continue
        lb = last_bad()
        if t - t_kill >= limit or (t - t_kill >= window and not pending
                                   and t - (lb if lb is not None else t_kill) >= steady):
            break
    t_end = now()
    for p in pending:
        c = p.pop("c")
        c.close()
        p.update(code=None, wait=t_end - p["sent"], unanswered=True)
        tries.append(p)
    after = [t for t in tries if t["sent"] >= t_kill]
    base = sorted(t["wait"] for t in tries if t["sent"] < t_kill and t["code"] == 0)
    lb = last_bad()
    later = [t["sent"] for t in after if lb is not None and t["sent"] > lb]
    codes: dict[int, int] = {}
    for t in after:
        if t["code"]:
            codes[t["code"]] = codes.get(t["code"], 0) + 1
    return {
        "attempts": len(after), "longest_wait_s": max((t["wait"] for t in after), default=0.0),
        "refused": sum(1 for t in after if t["code"] is not None and t["code"] >= 0x80),
        "refused_persistent": sum(1 for t in after if t["persistent"] and t["code"] is not None
                                  and t["code"] >= 0x80),
        "codes": codes, "unanswered": sum(1 for t in after if t.get("unanswered")),
        "failed": sum(1 for t in after if t["code"] is None and not t.get("unanswered")),
        "recovered_s": 0.0 if lb is None else ((min(later) if later else t_end) - t_kill),
        "baseline_ms": 1e3 * base[len(base) // 2] if base else None,
        "window_s": t_end - t_kill,
    }


def _redis(sock_file, *args):
    """One command over RESP (the bench has no Redis client library)."""
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    sock_file.write(b"".join(out))
    sock_file.flush()
    return _reply(sock_file)


def _reply(f):
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_reply(f) for _ in range(n)]
    if kind == b":":
        return int(rest)
    if kind == b"-":
        raise RuntimeError(rest.decode())
    return rest.decode()


def stored_tags(host: str, port: int, key_prefix: str, client_id: str) -> dict:
    """What the Redis device store (:mod:`tbmq_plugins.redis_store`'s
    layout) holds for ``client_id``: ``{(pair index, seq): (delivery state,
    packet id)}``, read after a storm to tell a lost message that waits in
    the store from one that never reached it."""
    from tbmq.backends.deliveries import decode_delivery  # the nodes' own format

    queue = f"{key_prefix}{{{client_id}}}_messages"
    found = {}
    with socket.create_connection((host, port), timeout=10) as sock:
        f = sock.makefile("rwb")
        for member in _redis(f, "ZRANGE", queue, 0, -1) or []:
            fields = _redis(f, "HGETALL", f"{queue}_".encode() + member) or []
            h = dict(zip(fields[::2], fields[1::2]))
            if b"d" not in h:
                continue
            pid = int(h[b"p"]) if h.get(b"p") else None
            d = decode_delivery(h[b"d"], pid, int(h.get(b"s") or 0))
            found[TAG.unpack_from(d.message.payload, 0)] = (int(d.state), pid)
    return found


def tags_in_topics(bootstrap: str, topics: list[str], wanted: set, limit_s: float = 60.0) -> dict:
    """Where the bus holds the tagged payloads ``wanted`` (``{(pair index,
    seq)}``): every record of ``topics`` is read from the start, and a
    value that holds a wanted tag followed by the payload's zero padding
    counts (a record carries the payload as it came).

    :returns: ``{(pair, seq): [[topic, partition, offset], ...]}``, every
        wanted tag present (an empty list: found nowhere).
    """
    from kafka import KafkaConsumer, TopicPartition

    needles = {TAG.pack(*w) + bytes(8): w for w in wanted}
    found: dict = {w: [] for w in wanted}
    consumer = KafkaConsumer(bootstrap_servers=[bootstrap], enable_auto_commit=False,
                             group_id=None, consumer_timeout_ms=3000)
    try:
        tps = [TopicPartition(t, p) for t in topics
               for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + limit_s
        for record in consumer:
            value = record.value or b""
            for needle, w in needles.items():
                if needle in value:
                    found[w].append([record.topic.rsplit(".", 3)[-1], record.partition,
                                     record.offset])
            if time.monotonic() > deadline:
                break
    finally:
        consumer.close()
    return found
