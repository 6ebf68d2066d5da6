"""The generator's worker processes: each ``*_worker`` function runs in its
own OS process (started by :mod:`bench.scenarios`) and talks to the parent
through a :class:`multiprocessing.connection.Connection`."""

from __future__ import annotations

import os
import socket
import struct
import time

from .mqttgen import (
    PUB_LOW_WATER, PUB_SNDBUF, Client, Loop, connect_packet, cpu_seconds, disconnect_packet, end_clients, now,
    open_clients, pid_offset, publish_packet, qos1_blob, raise_nofile, receive_maximum,
)

class Publisher:
    """Publishes to one client as fast as allowed from :meth:`start` (the
    common start time) to :meth:`stop`: QoS 0 keeps the socket full; QoS 1
    keeps ``window`` PUBLISH unacknowledged.

    ``sent`` (QoS 0): the PUBLISH packets the kernel accepted in whole
    (``send()``'s byte count ÷ packet length), set by :meth:`settle` once the
    last partial packet has been written; what is still queued in user space
    at :meth:`stop` beyond that partial packet is discarded, never counted.
    (QoS 1: the PUBLISH queued, all of which are written and acknowledged.)"""

    def __init__(self, client: Client, topic: str, payload: bytes, qos: int, level: int,
                 window: int) -> None:
        self.c = client
        self.qos = qos
        self.sent = 0
        self.stopped = False
        if qos == 0:
            one = publish_packet(topic, payload, 0, level)
            self.length = len(one)
            self.blob = one * max(1, PUB_LOW_WATER // len(one))
            self.bytes0 = 0
        else:
            self.blob, self.length = qos1_blob(topic, payload, level)
            self.window = receive_maximum(client, window)
            self.next = 0  # index (0-based) of the next packet id in the blob

    def start(self) -> None:
        """Begin publishing (not before: the subscribers count from t0).
        QoS 0 refills whenever the socket can take more; QoS 1 is topped up
        as acknowledgements arrive (see _run_publishers), never by spinning."""
        c = self.c
        if self.qos == 0:
            assert not c.outbuf
            if PUB_SNDBUF:
                c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PUB_SNDBUF)
            self.bytes0 = c.bytes_sent
            c.on_writable = self.fill
            c.flush()  # register for write events
        else:
            self.top_up()
            c.flush()

    def fill(self, c: Client) -> None:
        if self.stopped:
            c.on_writable = None
            return
        if self.qos == 0:
            c.outbuf += self.blob
        else:
            self.top_up()

    def top_up(self) -> None:
        if self.stopped:
            return
        c = self.c
        room = self.window - (self.sent - c.stream.acks)
        while room > 0:
            n = min(room, 65535 - self.next)
            L = self.length
            c.outbuf += self.blob[self.next * L:(self.next + n) * L]
            self.next = (self.next + n) % 65535
            self.sent += n
            room -= n

    def stop(self) -> None:
        """Stop; QoS 0: keep queued only the rest of a partially written packet."""
        self.stopped = True
        c = self.c
        if self.qos == 0:
            c.on_writable = None
            del c.outbuf[(self.bytes0 - c.bytes_sent) % self.length:]
            if not c.closed:
                c.flush()  # (un)register for write events

    def settle(self) -> None:
        """QoS 0: count the whole packets written (after the outbuf drained)."""
        if self.qos == 0:
            self.sent = (self.c.bytes_sent - self.bytes0) // self.length

    @property
    def outstanding(self) -> int:
        return self.sent - self.c.stream.acks if self.qos else 0


def _run_publishers(loop, pubs, until):
    for p in pubs:
        p.start()
    qos1 = [p for p in pubs if p.qos]
    while True:
        t = now()
        if t >= until:
            break
        loop.run_once(min(0.02, until - t))
        for p in qos1:
            if p.sent - p.c.stream.acks < p.window:
                p.top_up()
                if p.c.outbuf and not p.c.want_write:
                    p.c.flush()
        if loop.ctl_msgs and loop.ctl_msgs[0] == "abort":
            break
    for p in pubs:
        p.stop()


def _await_go(loop, ctl, timeout: float = 120.0) -> float | None:
    """Tell the runner this worker is ready, wait for ``("go", t0)`` and
    sleep until t0.

    :returns: t0 (``now()`` seconds), or None when told something else.
    """
    ctl.send(("ready", {"pid": os.getpid()}))
    msg = loop.ctl_wait(timeout)
    if msg[0] != "go":
        return None
    t0 = msg[1]
    while now() < t0:
        time.sleep(min(0.01, max(0.0, t0 - now())))
    return t0


def clients_worker(ctl, role: dict) -> None:
    """A worker process for the throughput scenarios.

    ``role``: host, port, level, qos, payload_size, duration, window,
    ``pubs``: [(client_id, topic)], ``subs``: [(client_id, filter)],
    sub_qos, receive_maximum; ``sub_port``/``pub_port`` put the subscribers
    or the publishers on another node of a cluster; ``sub_expiry`` (v5
    Session Expiry Interval, seconds, default 0) makes the subscribers
    persistent sessions in v5, ``sub_clean`` False (default True) in v3.1.1.

    Protocol with the parent: → ("ready", info) ← ("go", t0) → ("published",
    info) ← ("drain", expected_total_for_this_worker, timeout) → ("done", info).
    """
    try:
        raise_nofile()
        loop = Loop(ctl, role.get("coalesce", 0.0))
        level = role["level"]
        specs = [{"id": cid, "sub": flt, "qos": role["sub_qos"], "port": role.get("sub_port"),
                  "receive_maximum": role.get("receive_maximum"), "tag": "sub", "clean": role.get("sub_clean", True),
                  "expiry": role.get("sub_expiry", 0)} for cid, flt in role["subs"]]
        specs += [{"id": cid, "tag": "pub", "topic": topic, "port": role.get("pub_port")}
                  for cid, topic in role["pubs"]]
        clients = open_clients(loop, role["host"], role["port"], specs, level, timeout=role.get("connect_timeout", 60))
        subs = [c for c in clients if c.tag == "sub"]
        pub_clients = [c for c in clients if c.tag == "pub"]
        topics = dict(role["pubs"])
        payload = os.urandom(role["payload_size"])
        pubs = [Publisher(c, topics[c.name], payload, role["qos"], level, role["window"]) for c in pub_clients]
        t0 = _await_go(loop, ctl, role.get("ready_timeout", 120))
        if t0 is None:
            return
        cpu0 = cpu_seconds()
        # nothing was published before t0 (Publisher.start): the subscribers
        # count everything they got, as the publishers count everything they sent
        if pubs:
            _run_publishers(loop, pubs, t0 + role["duration"])
            t_pub_end = now()
            # QoS 0: the last partial packet written; QoS 1: the outstanding acknowledgements
            loop.run_until(lambda: all(p.c.closed or (not p.c.outbuf and p.outstanding <= 0) for p in pubs),
                           role.get("ack_timeout", 30))
            for p in pubs:
                p.settle()
            t_acked = now()
            # DISCONNECT, shut down writes, wait for the broker's close: then
            # the broker has read (and routed) every message counted as sent
            # and the subscribers only wait for its output
            end_timeout = role.get("end_timeout", 60)
            unclosed = end_clients(loop, pub_clients, end_timeout)
            info = {"sent": sum(p.sent for p in pubs), "unacked": sum(max(0, p.outstanding) for p in pubs),
                    "t_pub_end": t_pub_end, "t_acked": t_acked, "t_read": now(),
                    "errors": [c.error for c in pub_clients if c.error]
                    + [f"{c.name}: no close from the broker in {end_timeout} s after DISCONNECT (not all read?)"
                       for c in unclosed if not c.error]}
        else:
            info = {"sent": 0, "unacked": 0}
        ctl.send(("published", info))
        # keep receiving until told how many to expect, then until done or idle
        last_count = -1
        last_change = now()
        expected = None
        deadline = None
        idle = role.get("idle_timeout", 3.0)
        while True:
            loop.run_once(0.02)
            if loop.ctl_msgs:
                m = loop.ctl_msgs.pop(0)
                if m[0] == "drain":
                    expected, deadline = m[1], now() + m[2]
                elif m[0] == "abort":
                    break
            total = sum(s.stream.publishes for s in subs)
            if total != last_count:
                last_count = total
                last_change = now()
            if expected is not None:
                if total >= expected:
                    break
                if now() - last_change > idle or now() > deadline:
                    break
        t_end = now()
        cpu1 = cpu_seconds()
        # the time of the last delivery: the last change we saw
        ctl.send(("done", {
            **info,
            "received": [s.stream.publishes for s in subs],
            "t_last": last_change if subs else t_end,
            "cpu": cpu1 - cpu0,
            "errors": info.get("errors", []) + [c.error for c in subs if c.error],
        }))
        for c in clients:
            if not c.closed:
                try:
                    c.sock.send(disconnect_packet(level))
                except OSError:
                    pass
                c.close()
    except Exception as e:  # report, never hang the parent
        import traceback
        try:
            ctl.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))
        except Exception:
            pass


def latency_worker(ctl, role: dict) -> None:
    """One publisher and one subscriber at ``rate`` messages/s; payload
    carries the send time. → ("ready") ← ("go", t0) → ("done", info)."""
    try:
        loop = Loop(ctl)
        level, qos = role["level"], role["qos"]
        lat = []
        seen = [0]

        def on_publish(payload: bytes, _t=now, _u=struct.unpack_from):
            sent_at, = _u("!d", payload, 0)
            lat.append(_t() - sent_at)
            seen[0] += 1

        clients = open_clients(loop, role["host"], role["port"], [
            {"id": role["prefix"] + "-lsub", "sub": role["topic"], "qos": qos, "on_publish": on_publish, "tag": "sub",
             "port": role.get("sub_port")},
            {"id": role["prefix"] + "-lpub", "tag": "pub", "port": role.get("pub_port")},
        ], level)
        sub, pub = clients
        pad = bytes(role["payload_size"] - 8)
        template = publish_packet(role["topic"], b"\0" * 8 + pad, qos, level, packet_id=1)
        pay_at = len(template) - role["payload_size"]
        pid_at = pid_offset(template) if qos else 0
        t0 = _await_go(loop, ctl)
        cpu0 = cpu_seconds()
        rate, dur = role["rate"], role["duration"]
        n_total = int(rate * dur)
        interval = 1.0 / rate
        i = 0
        pkt = bytearray(template)
        # a client keeps at most the server's Receive Maximum of QoS 1/2
        # PUBLISHes unacknowledged [MQTT-4.9.0-1]: when acknowledgements are
        # late the publisher waits (each message is stamped when sent)
        room = receive_maximum(pub, 65535)
        while i < n_total:
            t = now()
            due = min(n_total, int((t - t0) / interval) + 1)
            while i < due:
                if qos and i - pub.stream.acks >= room:
                    break
                if qos:
                    pid = i % 65535 + 1
                    pkt[pid_at] = pid >> 8
                    pkt[pid_at + 1] = pid & 0xFF
                struct.pack_into("!d", pkt, pay_at, now())
                pub.send(bytes(pkt))
                i += 1
            nxt = t0 + i * interval
            loop.run_once(max(0.001, nxt - now()))
            if pub.closed or sub.closed:
                break
        loop.run_until(lambda: seen[0] >= i and pub.stream.acks >= (i if qos else 0), 10)
        cpu = cpu_seconds() - cpu0
        lat.sort()
        n = len(lat)

        def pct(p):
            return lat[min(n - 1, int(p * n))] * 1e3 if n else None

        ctl.send(("done", {"sent": i, "received": [n], "p50": pct(0.50), "p99": pct(0.99),
                           "max": lat[-1] * 1e3 if n else None, "cpu": cpu,
                           "errors": [c.error for c in clients if c.error]}))
        for c in clients:
            c.close()
    except Exception as e:
        import traceback
        ctl.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))


def persistent_worker(ctl, role: dict) -> None:
    """Persistent session: subscribe, go offline, publish ``count`` messages
    at QoS ``role["qos"]`` (1 or 2, default 1; payload = sequence number),
    reconnect and drain. ``role["client_id"]`` names the subscriber
    (default ``<prefix>-psub``); the publisher connects to
    ``role["pub_port"]`` (default: the subscriber's ``port``), after
    ``role["settle"]`` seconds (default 0.2) for the broker to learn the
    subscription (a cluster's other node reads it from the bus)."""
    try:
        loop = Loop(ctl)
        level = role["level"]
        count = role["count"]
        host, port = role["host"], role["port"]
        sub_id = role.get("client_id") or role["prefix"] + "-psub"
        qos = role.get("qos", 1)
        expiry = 3600 if level == 5 else 0
        # 1. a fresh persistent session with a QoS 1 subscription, then offline
        user = role.get("username")
        first = open_clients(loop, host, port, [{"id": sub_id, "sub": role["topic"] + "/#", "qos": qos, "username": user,
                                                 "clean": True if level == 5 else False, "expiry": expiry}], level)[0]
        first.send(disconnect_packet(level))
        loop.run_until(lambda: not first.outbuf, 5)
        first.close()
        time.sleep(role.get("settle", 0.2))
        ctl.send(("ready", {"pid": os.getpid()}))
        loop.ctl_wait(120)  # ("go", t0)
        # 2. publish
        pub = open_clients(loop, host, role.get("pub_port", port),
                           [{"id": role["prefix"] + "-ppub", "username": user}], level)[0]
        window = receive_maximum(pub, role["window"])
        one = publish_packet(role["topic"] + "/t", b"\0" * role["payload_size"], qos, level)
        pid_at = pid_offset(one)
        pay_at = len(one) - role["payload_size"]
        cpu0 = cpu_seconds()
        t_pub0 = now()
        sent = 0
        deadline = t_pub0 + role.get("publish_timeout", 300)
        pkt = bytearray(one)
        while sent < count or pub.stream.acks < sent:
            room = min(window - (sent - pub.stream.acks), count - sent)
            if room > 0:
                chunk = bytearray()
                for _ in range(room):
                    pid = sent % 65535 + 1
                    pkt[pid_at] = pid >> 8
                    pkt[pid_at + 1] = pid & 0xFF
                    struct.pack_into("!I", pkt, pay_at, sent)
                    chunk += pkt
                    sent += 1
                pub.send(chunk)
            loop.run_once(0.02)
            if pub.closed:
                raise ConnectionError(f"publisher: {pub.error}")
            if now() > deadline:
                break
        t_pub1 = now()
        acked = pub.stream.acks
        pub.send(disconnect_packet(level))
        loop.run_until(lambda: not pub.outbuf, 5)
        pub.close()
        time.sleep(0.5)
        # 3. reconnect and drain
        seen = bytearray(count)
        got = [0, 0]  # unique, duplicates
        last = [now()]

        def on_publish(payload: bytes, _u=struct.unpack_from):
            n, = _u("!I", payload, 0)
            if n < count and not seen[n]:
                seen[n] = 1
                got[0] += 1
            else:
                got[1] += 1
            last[0] = now()

        t_re = now()
        sub = open_clients(loop, host, port, [{"id": sub_id, "clean": False, "expiry": expiry, "username": user,
                                               "on_publish": on_publish}], level)[0]
        present = bool(sub.stream.connack.session_present)
        idle = role.get("idle_timeout", 5.0)
        dl = now() + role.get("drain_timeout", 300)
        while got[0] < acked and now() < dl and now() - last[0] < idle + (t_re > last[0]) * 5:
            loop.run_once(0.05)
            if sub.closed:
                break
        t_done = last[0] if got[0] else now()
        cpu = cpu_seconds() - cpu0
        ctl.send(("done", {"sent": sent, "acked": acked, "received": [got[0]], "duplicates": got[1],
                           "session_present": present, "publish_s": t_pub1 - t_pub0,
                           "drain_s": t_done - t_re, "cpu": cpu,
                           "errors": [c.error for c in (sub,) if c.error]}))
        sub.send(disconnect_packet(level))
        loop.run_until(lambda: not sub.outbuf, 2)
        sub.close()
    except Exception as e:
        import traceback
        ctl.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))


def connect_worker(ctl, role: dict) -> None:
    """CONNECT ``count`` clients to one broker as fast as it answers, with
    at most ``window`` handshakes (TCP connect, CONNECT, CONNACK) under way
    at a time, and keep the accepted ones connected until told to close.

    ``role``: host, port, level, count, prefix (client ids are
    ``<prefix>-<n>``), window, clean (Clean Start / Clean Session),
    expiry (v5 Session Expiry Interval, seconds), timeout (seconds for the
    whole burst), cleanup (after the close: connect every client id again
    with Clean Start and expiry 0 and disconnect, so that no persistent
    session is left behind).

    Protocol: → ("ready") ← ("go", t0) → ("connected", info) ← ("close",)
    → ("done", info). ``info``: t_first (the first CONNECT queued), t_last
    (the last CONNACK), latencies (seconds from each CONNECT queued, its TCP
    connect included, to its CONNACK, accepted or not), accepted, refused
    (CONNACK reason code >= 0x80, v3: not 0), codes (refused reason code →
    count), failed (closed or unanswered), cpu (the worker's CPU seconds).
    """
    try:
        raise_nofile()
        loop = Loop(ctl)
        level, count, window = role["level"], role["count"], role.get("window", 100)
        prefix = role["prefix"]
        t0 = _await_go(loop, ctl)
        if t0 is None:
            return
        cpu0 = cpu_seconds()
        pending: dict = {}
        accepted, latencies, codes = [], [], {}
        refused = failed = 0
        started = 0
        t_first = now()
        t_last = t_first
        deadline = t_first + role.get("timeout", 120)
        while (started < count or pending) and now() < deadline:
            while started < count and len(pending) < window:
                c = Client(loop, f"{prefix}-{started}", level)
                started += 1
                try:
                    c.start_connect(role["host"], role["port"])
                except OSError as e:
                    c.error, c.closed = repr(e), True
                    failed += 1
                    continue
                c.send(connect_packet(c.name, level, role["clean"], 300, role.get("expiry", 0)))
                pending[c] = now()
            loop.run_once(0.005)
            t = now()
            for c in [c for c in pending if c.stream.connack is not None or c.closed]:
                sent = pending.pop(c)
                ca = c.stream.connack
                if ca is None:
                    failed += 1
                    continue
                latencies.append(t - sent)
                t_last = t
                if ca.reason_code:
                    refused += 1
                    codes[ca.reason_code] = codes.get(ca.reason_code, 0) + 1
                    c.close()
                else:
                    accepted.append(c)
        failed += len(pending) + (count - started)
        for c in pending:
            c.close()
        cpu = cpu_seconds() - cpu0
        ctl.send(("connected", {"t_first": t_first, "t_last": t_last, "latencies": latencies,
                                "accepted": len(accepted), "refused": refused, "codes": codes,
                                "failed": failed, "cpu": cpu}))
        while True:
            msg = loop.ctl_wait(600)
            if msg[0] in ("close", "abort"):
                break
        unclosed = end_clients(loop, accepted, 60)
        left = 0
        if role.get("cleanup") and msg[0] == "close":
            specs = [{"id": c.name, "clean": True, "expiry": 0} for c in accepted]
            again = open_clients(loop, role["host"], role["port"], specs, level, timeout=300, window=window)
            left = len(end_clients(loop, again, 60))
        ctl.send(("done", {"unclosed": len(unclosed) + left}))
    except Exception as e:
        import traceback
        ctl.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))
