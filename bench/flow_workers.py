"""The generator's worker processes for the flow-control scenarios
(``fanin_qos1_loss``, ``slow_subscribers``, ``persistent_slow_reader``):
every message is tagged in its payload with (publisher index, sequence
number), so what was acknowledged to the publishers and what reached the
subscribers are compared message by message, not by counts. Started by
:mod:`bench.scenarios` like the workers of :mod:`bench.workers`."""

from __future__ import annotations

import os
import socket
import struct
import time

from .mqttgen import (
    PUB_SNDBUF, Client, Loop, cpu_seconds, disconnect_packet, end_clients, now, open_clients, pid_offset,
    publish_packet, raise_nofile, receive_maximum,
)
from .workers import _await_go

#: linux/tcp_states.h: what the kernel says of a connection
TCP_STATES = {1: "open", 7: "closed (reset)", 8: "closed by the broker (FIN)"}

TAG = struct.Struct("!II")  # (publisher index, sequence number) at the start of the payload


class SeqSet:
    """Sequence numbers seen, per publisher index: one byte per number (0/1)."""

    def __init__(self) -> None:
        self.maps: dict[int, bytearray] = {}
        self.count = 0

    def add(self, index: int, seq: int) -> bool:
        """Mark; False when it was marked already (a duplicate)."""
        m = self.maps.get(index)
        if m is None:
            m = self.maps[index] = bytearray()
        if seq >= len(m):
            m.extend(bytes(max(seq + 1 - len(m), 4096)))
        if m[seq]:
            return False
        m[seq] = 1
        self.count += 1
        return True

    def export(self) -> dict[int, bytes]:
        return {i: bytes(m) for i, m in self.maps.items()}


def missing(acked: dict[int, bytes], delivered: dict[int, bytes]) -> int:
    """How many numbers ``acked`` has that ``delivered`` lacks (both from
    :meth:`SeqSet.export`)."""
    lost = 0
    for i, a in acked.items():
        d = delivered.get(i, b"")
        n = max(len(a), len(d))
        ai = int.from_bytes(a.ljust(n, b"\0"), "big")
        di = int.from_bytes(d.ljust(n, b"\0"), "big")
        lost += (ai & ~di).bit_count()
    return lost


class TaggedPublisher:
    """Publishes PUBLISH whose payload starts with (``index``, sequence
    number), QoS 1 with at most ``window`` unacknowledged (or the broker's
    Receive Maximum) and the acknowledged numbers recorded, or QoS 0.

    :meth:`top_up` sends up to a number of messages: all of them (a count,
    as fast as acknowledged) or those due at a fixed rate; a message due
    while the window is full (QoS 1) or while 256 KiB wait unsent (QoS 0) is
    skipped, not sent later (:attr:`skipped`): the offered rate is kept, a
    held publisher does not catch up in a burst."""

    BACKLOG = 1 << 18

    def __init__(self, client: Client, topic: str, index: int, payload_size: int, qos: int,
                 level: int, window: int) -> None:
        self.c = client
        self.qos = qos
        one = publish_packet(topic, bytes(max(TAG.size, payload_size)), qos, level, packet_id=1)
        self.length = len(one)
        self.pkt = bytearray(one)
        self.pay_at = len(one) - max(TAG.size, payload_size)
        self.pid_at = pid_offset(one) if qos else 0
        self.index = index
        self.window = receive_maximum(client, window) if qos else 0
        self.sent = 0      # PUBLISH handed to the socket (QoS 1) or queued (QoS 0)
        self.ticked = 0    # messages due so far (rate mode)
        self.skipped = 0
        self.inflight: dict[int, int] = {}  # packet id -> sequence number
        self.acked = SeqSet()
        self.bytes0 = client.bytes_sent
        if qos:
            client.stream.ack_ids = []

    def collect(self) -> None:
        """Take the PUBACKs received."""
        ids = self.c.stream.ack_ids
        if ids:
            inflight, acked, index = self.inflight, self.acked, self.index
            for pid in ids:
                seq = inflight.pop(pid, None)
                if seq is not None:
                    acked.add(index, seq)
            ids.clear()

    def top_up(self, due: int) -> None:
        """Send messages up to number ``due`` (what the window allows)."""
        if self.qos:
            self.collect()
            room = self.window - len(self.inflight)
        else:
            room = (self.BACKLOG - len(self.c.outbuf)) // self.length
        n_due = due - self.ticked
        if n_due <= 0:
            return
        n = min(n_due, max(0, room))
        self.ticked = due
        self.skipped += n_due - n
        if n <= 0 or self.c.closed:
            return
        pkt, pid_at, tag_at, index = self.pkt, self.pid_at, self.pay_at, self.index
        inflight = self.inflight
        chunk = bytearray()
        pack = TAG.pack_into
        for _ in range(n):
            seq = self.sent
            if self.qos:
                pid = seq % 65535 + 1
                pkt[pid_at] = pid >> 8
                pkt[pid_at + 1] = pid & 0xFF
                inflight[pid] = seq
            pack(pkt, tag_at, index, seq)
            chunk += pkt
            self.sent = seq + 1
        self.c.send(chunk)

    def fill(self, count: int) -> None:
        """As fast as acknowledged: keep the window full, up to ``count``."""
        self.ticked = self.sent  # nothing is skipped in this mode
        self.top_up(min(count, self.sent + max(1, self.window)))

    @property
    def written(self) -> int:
        """QoS 0: whole PUBLISH the kernel took."""
        return (self.c.bytes_sent - self.bytes0) // self.length

    @property
    def n_acked(self) -> int:
        return self.acked.count if self.qos else self.written


class TaggedReader:
    """Records the tags of the PUBLISH one subscriber receives; with
    ``ack_rate`` (QoS 1) it sends its PUBACKs at that many per second at
    most, so the broker's window for it stays full (a slow reader)."""

    def __init__(self, ack_rate: float | None = None) -> None:
        self.seen = SeqSet()
        self.duplicates = 0
        self.other = 0
        self.t_first = None
        self.t_last = None
        self.ack_rate = ack_rate
        self.acks_sent = 0
        self.max_owed = 0  # the most PUBLISH seen unacknowledged: above Receive Maximum is the broker's fault
        self._t_acks = None

    def on_publish(self, payload: bytes, _u=TAG.unpack_from) -> None:
        if len(payload) < TAG.size:
            self.other += 1
            return
        index, seq = _u(payload, 0)
        if not self.seen.add(index, seq):
            self.duplicates += 1
        t = now()
        if self.t_first is None:
            self.t_first = t
        self.t_last = t

    def attach(self, c: Client) -> None:
        if self.ack_rate:
            c.stream.owed = []

    def ack_some(self, c: Client) -> None:
        """Send the PUBACKs the rate allows (a bucket of at most 0.1 s)."""
        owed = c.stream.owed
        if not owed or c.closed:
            return
        if len(owed) > self.max_owed:
            self.max_owed = len(owed)
        t = now()
        if self._t_acks is None:
            self._t_acks = t
        allowed = int((t - self._t_acks) * self.ack_rate)
        # never more than 0.1 s worth at once (after a quiet period)
        burst = max(1, int(self.ack_rate / 10))
        if allowed > burst:
            self._t_acks = t - burst / self.ack_rate
            allowed = burst
        n = min(allowed, len(owed))
        if n <= 0:
            return
        self._t_acks += n / self.ack_rate
        c.send(b"".join(b"\x40\x02" + pid for pid in owed[:n]))
        del owed[:n]
        self.acks_sent += n


def tagged_worker(ctl, role: dict) -> None:
    """Tagged publishers or tagged subscribers (fan-in loss, slow persistent
    reader).

    ``role``: host, port, level, kind ("pub" or "sub"), payload_size, window;
    pub: ``pubs`` [(client_id, topic, index)], and ``count`` (per publisher,
    as fast as acknowledged, up to ``publish_timeout``) or ``duration``
    (unlimited rate); sub: ``subs`` [(client_id, filter)], receive_maximum,
    expiry (v5 session expiry, 3.1.1: clean session 0 when > 0), ack_rate.

    pub: → ("ready") ← ("go", t0) → ("published", info with ``acked``: the
    numbers acknowledged, per index). sub: → ("ready") ← ("drain",
    expected, timeout, idle) → ("done", info with ``seen``).
    """
    try:
        raise_nofile()
        loop = Loop(ctl, role.get("coalesce", 0.0))
        level = role["level"]
        host, port = role["host"], role["port"]
        if role["kind"] == "sub":
            readers = []
            specs = []
            for cid, flt in role["subs"]:
                r = TaggedReader(role.get("ack_rate"))
                readers.append(r)
                expiry = role.get("expiry", 0)
                specs.append({"id": cid, "sub": flt, "qos": 1, "receive_maximum": role.get("receive_maximum"),
                              "expiry": expiry if level == 5 else 0,
                              "clean": level == 5 or not expiry, "on_publish": r.on_publish})
            subs = open_clients(loop, host, port, specs, level)
            for r, c in zip(readers, subs):
                r.attach(c)
            ctl.send(("ready", {"pid": os.getpid()}))
            expected = deadline = None
            idle = 5.0
            cpu0 = cpu_seconds()
            t_start = now()
            while True:
                loop.run_once(0.005 if role.get("ack_rate") else 0.02)
                for r, c in zip(readers, subs):
                    if r.ack_rate:
                        r.ack_some(c)
                while loop.ctl_msgs:
                    m = loop.ctl_msgs.pop(0)
                    if m[0] == "drain":
                        expected, deadline, idle = m[1], now() + m[2], m[3]
                    elif m[0] == "abort":
                        return
                if expected is not None:
                    total = sum(r.seen.count for r in readers)
                    last = max([r.t_last or t_start for r in readers])
                    if total >= expected or now() > deadline or now() - last > idle:
                        break
                    if all(c.closed for c in subs):
                        break
            ctl.send(("done", {
                "seen": [r.seen.export() for r in readers],
                "unique": [r.seen.count for r in readers],
                "duplicates": sum(r.duplicates for r in readers),
                "t_first": min((r.t_first for r in readers if r.t_first), default=None),
                "t_last": max((r.t_last for r in readers if r.t_last), default=None),
                "acks_sent": sum(r.acks_sent for r in readers),
                "max_unacked": max(r.max_owed for r in readers),
                "closed": sum(1 for c in subs if c.closed),
                "disconnect": [c.stream.disconnect.reason_code for c in subs if c.stream.disconnect],
                "cpu": cpu_seconds() - cpu0,
                "errors": [c.error for c in subs if c.error]}))
            for c in subs:
                if not c.closed:
                    try:
                        c.sock.send(disconnect_packet(level))
                    except OSError:
                        pass
                    c.close()
            return
        # publishers
        specs = [{"id": cid, "tag": "pub"} for cid, _, _ in role["pubs"]]
        clients = open_clients(loop, host, port, specs, level)
        pubs = [TaggedPublisher(c, topic, index, role["payload_size"], 1, level, role["window"])
                for c, (_, topic, index) in zip(clients, role["pubs"])]
        t0 = _await_go(loop, ctl, role.get("ready_timeout", 120))
        if t0 is None:
            return
        cpu0 = cpu_seconds()
        count = role.get("count")
        until = t0 + (role.get("publish_timeout", 600) if count else role["duration"])
        while now() < until:
            if count:
                for p in pubs:
                    p.fill(count)
                p_done = all(p.c.closed or (p.sent >= count and not p.inflight) for p in pubs)
                if p_done:
                    break
            else:
                for p in pubs:
                    p.fill(1 << 62)
            loop.run_once(0.02)
            for p in pubs:
                p.collect()
            if loop.ctl_msgs and loop.ctl_msgs[0] == "abort":
                return
            if all(p.c.closed for p in pubs):
                break
        t_pub_end = now()
        # the outstanding acknowledgements
        loop.run_until(lambda: all(p.collect() or p.c.closed or not p.inflight for p in pubs),
                       role.get("ack_timeout", 60))
        t_acked = now()
        unclosed = end_clients(loop, clients, role.get("end_timeout", 30))
        for p in pubs:
            p.collect()
        acked = {}
        for p in pubs:
            acked.update(p.acked.export())
        ctl.send(("published", {
            "sent": sum(p.sent for p in pubs), "acked_n": sum(p.acked.count for p in pubs),
            "unacked": sum(len(p.inflight) for p in pubs), "refused": sum(p.c.stream.refused for p in pubs),
            "acked": acked, "t_pub_end": t_pub_end, "t_acked": t_acked, "cpu": cpu_seconds() - cpu0,
            "errors": [c.error for c in clients if c.error]
            + [f"{c.name}: not closed by the broker after DISCONNECT" for c in unclosed if not c.error]}))
    except Exception as e:
        import traceback
        try:
            ctl.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))
        except Exception:
            pass


def rate_worker(ctl, role: dict) -> None:
    """The slow-subscribers scenario: publishers at a fixed rate, the
    subscribers that read as fast as they can, or the two bad subscribers.

    ``role``: host, port, level, qos, kind: "pubs" (``pubs`` [(client_id,
    topic, index)], ``rate`` per publisher, payload_size, window), "subs"
    (``subs`` [(client_id, filter)]) or "bad" (``stuck`` and ``drip``:
    (client_id, filter), drip_bytes, drip_interval).

    pubs/subs, per phase: ← ("go", t0, duration) → ("phase", info): what
    was acknowledged (QoS 1) or written whole (QoS 0) / received between t0
    and t0 + duration, and the longest time a subscriber got nothing.
    bad: → ("ready") at once, ← ("report") → ("done", info).
    """
    try:
        raise_nofile()
        loop = Loop(ctl, role.get("coalesce", 0.0))
        level, qos = role["level"], role["qos"]
        host, port = role["host"], role["port"]
        kind = role["kind"]
        if kind == "bad":
            cid, flt = role["stuck"]
            did, dflt = role["drip"]
            stuck, drip = open_clients(loop, host, port, [
                {"id": cid, "sub": flt, "qos": qos, "keep_alive": 0},
                {"id": did, "sub": dflt, "qos": qos, "keep_alive": 0}], level)
            for c in (stuck, drip):  # from now on read by hand (drip) or never (stuck)
                loop.sel.unregister(c.sock)
                c.sock.setblocking(False)
            ctl.send(("ready", {"pid": os.getpid()}))
            nbytes, every = role.get("drip_bytes", 4096), role.get("drip_interval", 2.0)
            next_drip = now() + every
            drip_eof = False
            while True:
                try:
                    m = loop.ctl_wait(max(0.0, next_drip - now()) + 0.001)
                except TimeoutError:
                    m = None
                if m is not None and m[0] in ("report", "abort"):
                    break
                if now() >= next_drip and not drip_eof:
                    next_drip += every
                    try:
                        data = drip.sock.recv(nbytes)
                    except (BlockingIOError, InterruptedError):
                        data = None
                    except OSError:
                        data = b""
                    if data == b"":
                        drip_eof = True
                    elif data:
                        drip.stream.feed(data)
                        if drip.stream.out:  # its PUBACKs, as any client would send
                            try:
                                drip.sock.send(drip.stream.out)
                            except OSError:
                                pass
                            drip.stream.out.clear()

            def state(c):
                """Whether the broker closed it, from the kernel's TCP state
                (its data, and a DISCONNECT behind it, stay unread)."""
                try:
                    st = c.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
                except OSError as e:
                    return f"closed ({e.__class__.__name__})"
                return TCP_STATES.get(st, str(st))

            ctl.send(("done", {"stuck": state(stuck), "drip": "closed (EOF)" if drip_eof else state(drip),
                               "drip_received": drip.stream.publishes,
                               "drip_disconnect": drip.stream.disconnect.reason_code
                               if drip.stream.disconnect else None}))
            for c in (stuck, drip):
                c.closed = True
                c.sock.close()
            return
        if kind == "subs":
            clients = open_clients(loop, host, port, [
                {"id": cid, "sub": flt, "qos": qos} for cid, flt in role["subs"]], level)
        else:
            clients = open_clients(loop, host, port, [{"id": cid} for cid, _, _ in role["pubs"]], level)
            pubs = [TaggedPublisher(c, topic, index, role["payload_size"], qos, level, role["window"])
                    for c, (_, topic, index) in zip(clients, role["pubs"])]
            if qos == 0 and PUB_SNDBUF:
                # what a held QoS 0 publisher writes is counted when the kernel takes it: keep its buffer small
                for c in clients:
                    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PUB_SNDBUF)
        ctl.send(("ready", {"pid": os.getpid()}))
        while True:
            m = loop.ctl_wait(600)
            if m[0] != "go":
                break
            t0, duration = m[1], m[2]
            t1 = t0 + duration
            if kind == "subs":
                while now() < t0:
                    loop.run_once(min(0.02, max(0.0, t0 - now())))
                c0 = [c.stream.publishes for c in clients]
                last = list(c0)
                t_change = [now()] * len(clients)
                gaps = [0.0] * len(clients)
                while True:
                    t = now()
                    loop.run_once(min(0.01, max(0.0, t1 - t)))
                    t = min(now(), t1)
                    for k, c in enumerate(clients):
                        n = c.stream.publishes
                        if n != last[k]:
                            gaps[k] = max(gaps[k], t - t_change[k])
                            t_change[k], last[k] = t, n
                    if now() >= t1:
                        break
                c1 = [c.stream.publishes for c in clients]
                for k in range(len(clients)):
                    gaps[k] = max(gaps[k], t1 - t_change[k])
                # the rest of the phase's messages, then the next phase starts clean
                n_prev, t_prev = -1, now()
                while now() - t_prev < role.get("settle", 1.0) and now() < t1 + 30:
                    loop.run_once(0.02)
                    n = sum(c.stream.publishes for c in clients)
                    if n != n_prev:
                        n_prev, t_prev = n, now()
                ctl.send(("phase", {"in_window": [b - a for a, b in zip(c0, c1)],
                                    "after": [c.stream.publishes - b for c, b in zip(clients, c1)],
                                    "max_gap_s": gaps, "closed": [c.closed for c in clients],
                                    "errors": [c.error for c in clients if c.error]}))
            else:
                while now() < t0:
                    time.sleep(min(0.01, max(0.0, t0 - now())))
                base = []
                for p in pubs:
                    p.collect()
                    p.skipped = 0
                    p.acked0 = p.n_acked
                    base.append(p.ticked)  # messages due are counted from this phase's t0
                rate = role["rate"]
                while True:
                    t = now()
                    if t >= t1:
                        break
                    due = int((t - t0) * rate) + 1
                    for p, b in zip(pubs, base):
                        p.top_up(b + due)
                    loop.run_once(min(0.005, t1 - t))
                for p in pubs:
                    p.collect()
                n_in_window = [p.n_acked - p.acked0 for p in pubs]
                skipped = [p.skipped for p in pubs]
                loop.run_until(lambda: all(p.collect() or p.c.closed or not p.inflight for p in pubs), 30)
                ctl.send(("phase", {"in_window": n_in_window, "offered": int(duration * rate) * len(pubs),
                                    "skipped": skipped, "unacked_after": [len(p.inflight) for p in pubs],
                                    "closed": [p.c.closed for p in pubs],
                                    "errors": [c.error for c in clients if c.error]}))
        for c in clients:
            if not c.closed:
                try:
                    c.sock.send(disconnect_packet(level))
                except OSError:
                    pass
                c.close()
    except Exception as e:
        import traceback
        try:
            ctl.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))
        except Exception:
            pass
