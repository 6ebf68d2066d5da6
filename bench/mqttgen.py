"""A lean MQTT load generator: non-blocking sockets, pre-built packets, bulk
stream scanning.

Why not paho: a Python client that builds one packet object per message and
calls ``send`` per packet spends more CPU per message than the broker under
test. Here

* packets are encoded once (with :func:`tbmq.mqtt.codec.encode`) and sent as
  large pre-built blobs, many PUBLISH per ``send`` call;
* incoming streams are *counted*, not decoded: once a run of equal-length
  packets has been seen, whole runs are checked and counted with byte-string
  slicing in C (``buf[pos:stop:L]``), and the PUBACKs a QoS 1 subscriber owes
  are built the same way (interleaved slices of the packet ids);
* each worker process runs its own ``selectors`` loop over many sockets.

The module is imported by :mod:`bench.scenarios`; each ``*_worker`` function
runs in its own OS process and talks to the parent through a
:class:`multiprocessing.connection.Connection`.
"""

from __future__ import annotations

import errno
import os
import resource
import selectors
import socket
import struct
import sys
import time

# the codec of the tbmq tree under test (run.py --tbmq-rev), else this checkout's
sys.path.insert(0, os.environ.get("BENCH_TBMQ_SRC") or os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tbmq.mqtt.codec import Decoder, encode  # noqa: E402
from tbmq.mqtt.constants import Property  # noqa: E402
from tbmq.mqtt.packets import (  # noqa: E402
    Connack, Connect, Disconnect, Publish, Subscribe, SubscriptionRequest,
)

now = time.monotonic  # CLOCK_MONOTONIC: one clock for every process of the machine

READ_SIZE = 1 << 18
#: bytes kept queued per publisher socket by an unlimited-rate QoS 0 publisher
PUB_LOW_WATER = 1 << 16

# maps a PUBLISH first byte with DUP set to the same byte without it
_NODUP = bytes((b & ~0x08) if (b >> 4) == 3 else b for b in range(256))


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def raise_nofile() -> int:
    """Raise the soft open-files limit to the hard limit; return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# --------------------------------------------------------------------------
# packets


def connect_packet(client_id: str, level: int, clean: bool = True, keep_alive: int = 300,
                   session_expiry: int = 0, receive_maximum: int | None = None) -> bytes:
    props = {}
    if level == 5:
        if session_expiry:
            props[Property.SESSION_EXPIRY_INTERVAL] = session_expiry
        if receive_maximum:
            props[Property.RECEIVE_MAXIMUM] = receive_maximum
    return encode(Connect(protocol_level=level, clean_start=clean, keep_alive=keep_alive,
                          client_id=client_id, properties=props), level)


def subscribe_packet(topic_filter: str, qos: int, level: int, packet_id: int = 1) -> bytes:
    return encode(Subscribe(packet_id=packet_id,
                            subscriptions=[SubscriptionRequest(topic_filter, qos=qos)]), level)


def publish_packet(topic: str, payload: bytes, qos: int, level: int, packet_id: int = 1) -> bytes:
    return encode(Publish(topic=topic, payload=payload, qos=qos,
                          packet_id=packet_id if qos else None), level)


def disconnect_packet(level: int) -> bytes:
    return encode(Disconnect(), level)


def qos1_blob(topic: str, payload: bytes, level: int, count: int = 65535) -> tuple[bytes, int]:
    """``count`` QoS 1 PUBLISH with packet ids 1..count back to back; returns
    (blob, packet length)."""
    one = publish_packet(topic, payload, 1, level, packet_id=1)
    length = len(one)
    pid_at = pid_offset(one)
    ids = bytearray(2 * count)
    ids[0::2] = bytes((i >> 8) & 0xFF for i in range(1, count + 1))
    ids[1::2] = bytes(i & 0xFF for i in range(1, count + 1))
    blob = bytearray(one * count)
    blob[pid_at::length] = ids[0::2]
    blob[pid_at + 1::length] = ids[1::2]
    return bytes(blob), length


def pid_offset(pkt: bytes) -> int:
    i = 1
    while pkt[i] & 0x80:
        i += 1
    i += 1
    return i + 2 + ((pkt[i] << 8) | pkt[i + 1])


# --------------------------------------------------------------------------
# incoming stream


class Stream:
    """Counts the packets of one incoming byte stream.

    :ivar publishes: PUBLISH packets received.
    :ivar acks: PUBACK packets received.
    :ivar out: bytes to send back (PUBACKs owed for QoS 1 PUBLISH).
    :ivar on_publish: if set, called as ``on_publish(payload: bytes)`` for
        every PUBLISH and the bulk path is off (latency, persistent runs).
    """

    __slots__ = ("buf", "level", "publishes", "acks", "pingresps", "other", "out", "on_publish",
                 "connack", "suback", "disconnect", "_fl", "_fh", "_frl", "_fpid", "_cool",
                 "_ack_owed")

    def __init__(self, level: int, on_publish=None) -> None:
        self.buf = bytearray()
        self.level = level
        self.publishes = 0
        self.acks = 0
        self.pingresps = 0
        self.other = 0
        self.out = bytearray()
        self.on_publish = on_publish
        self.connack: Connack | None = None
        self.suback = None
        self.disconnect = None
        self._fl = 0        # length of the packets of the current run, 0 = none
        self._fh = 0        # their first byte (DUP cleared)
        self._frl = 0       # their remaining-length byte
        self._fpid = 0      # offset of the packet id in a QoS 1 PUBLISH, else 0
        self._cool = 0      # packets to walk one by one before trying the bulk path again

    def feed(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        end = len(buf)
        while end - pos >= 2:
            length = self._fl
            if length and not self._cool:
                k = (end - pos) // length
                if k >= 2:
                    stop = pos + k * length
                    if (buf[pos + 1:stop:length] == bytes((self._frl,)) * k
                            and buf[pos:stop:length].translate(_NODUP) == bytes((self._fh,)) * k):
                        self._bulk(buf, pos, stop, k)
                        pos = stop
                        continue
                    self._cool = 8
            n = self._walk(buf, pos, end)
            if not n:
                break
            pos += n
            if self._cool:
                self._cool -= 1
        if pos:
            del buf[:pos]

    def _bulk(self, buf, pos, stop, k):
        first = self._fh
        if first >> 4 == 3:
            self.publishes += k
            if self._fpid:
                at = pos + self._fpid
                acks = bytearray(4 * k)
                acks[0::4] = b"\x40" * k
                acks[1::4] = b"\x02" * k
                acks[2::4] = buf[at:stop:self._fl]
                acks[3::4] = buf[at + 1:stop:self._fl]
                self.out += acks
        else:
            self.acks += k

    def _walk(self, buf, pos, end) -> int:
        """Handle one packet at ``pos``; return its length, 0 if incomplete."""
        first = buf[pos]
        i = pos + 1
        rl = 0
        mult = 1
        while True:
            if i >= end:
                return 0
            b = buf[i]
            rl += (b & 0x7F) * mult
            i += 1
            if not b & 0x80:
                break
            mult <<= 7
        total = i - pos + rl
        if pos + total > end:
            return 0
        ptype = first >> 4
        if ptype == 3:
            self.publishes += 1
            qos = (first >> 1) & 3
            tl = (buf[i] << 8) | buf[i + 1]
            j = i + 2 + tl
            pid_at = 0
            if qos:
                pid_at = j
                j += 2
            if self.level == 5:
                plen = 0
                mult = 1
                while True:
                    b = buf[j]
                    j += 1
                    plen += (b & 0x7F) * mult
                    if not b & 0x80:
                        break
                    mult <<= 7
                j += plen
            if qos == 1:
                self.out += b"\x40\x02" + bytes(buf[pid_at:pid_at + 2])
            elif qos == 2:
                self.out += b"\x50\x02" + bytes(buf[pid_at:pid_at + 2])
            if self.on_publish is not None:
                self.on_publish(bytes(buf[j:pos + total]))
            elif rl < 128 and qos < 2:
                self._fl, self._fh, self._frl = total, first & ~0x08, rl
                self._fpid = pid_at - pos if qos else 0
        elif ptype == 4:
            self.acks += 1
            if rl < 128 and self.on_publish is None:
                self._fl, self._fh, self._frl, self._fpid = total, first, rl, 0
        elif ptype == 13:
            self.pingresps += 1
        elif ptype == 5:  # PUBREC (unused here): answer PUBREL
            self.out += b"\x62\x02" + bytes(buf[i:i + 2])
        else:
            self.other += 1
            dec = Decoder(protocol_level=self.level, server_side=False)
            pkt = dec.feed(bytes(buf[pos:pos + total]))[0]
            name = type(pkt).__name__
            if name == "Connack":
                self.connack = pkt
            elif name == "Suback":
                self.suback = pkt
            elif name == "Disconnect":
                self.disconnect = pkt
        return total


# --------------------------------------------------------------------------
# connections


class Client:
    """One non-blocking MQTT connection driven by a :class:`Loop`."""

    __slots__ = ("name", "sock", "stream", "outbuf", "loop", "closed", "want_write", "error",
                 "on_writable", "tag")

    def __init__(self, loop: "Loop", name: str, level: int, on_publish=None, tag=None) -> None:
        self.loop = loop
        self.name = name
        self.sock = None
        self.stream = Stream(level, on_publish)
        self.outbuf = bytearray()
        self.closed = False
        self.want_write = False
        self.error = None
        self.on_writable = None  # called when the socket can take more and outbuf is small
        self.tag = tag

    def start_connect(self, host: str, port: int) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        err = s.connect_ex((host, port))
        if err not in (0, errno.EINPROGRESS):
            s.close()
            raise OSError(err, os.strerror(err))
        self.sock = s
        self.loop.sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, self)
        self.want_write = True

    def send(self, data) -> None:
        self.outbuf += data
        if not self.want_write and not self.closed:
            self.flush()

    def flush(self) -> None:
        ob = self.outbuf
        if ob:
            try:
                n = self.sock.send(ob)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                self.fail(e)
                return
            if n:
                del ob[:n]
        want = bool(ob) or self.on_writable is not None
        if want != self.want_write:
            self.want_write = want
            self.loop.sel.modify(self.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0), self)

    def readable(self) -> None:
        try:
            data = self.sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.fail(e)
            return
        if not data:
            self.fail(ConnectionError("closed by broker"))
            return
        st = self.stream
        st.feed(data)
        if st.out:
            self.outbuf += st.out
            st.out.clear()
            self.flush()

    def writable(self) -> None:
        if self.on_writable is not None and len(self.outbuf) < PUB_LOW_WATER:
            self.on_writable(self)
        self.flush()

    def fail(self, exc) -> None:
        if not self.closed:
            self.error = repr(exc)
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.loop.sel.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        self.sock.close()


class Loop:
    def __init__(self, ctl=None) -> None:
        self.sel = selectors.DefaultSelector()
        self.ctl = ctl
        self.ctl_msgs: list = []
        if ctl is not None:
            self.sel.register(ctl.fileno(), selectors.EVENT_READ, None)

    def run_once(self, timeout: float) -> None:
        for key, ev in self.sel.select(timeout):
            c = key.data
            if c is None:
                while self.ctl.poll():
                    self.ctl_msgs.append(self.ctl.recv())
                continue
            if ev & selectors.EVENT_READ:
                c.readable()
            if ev & selectors.EVENT_WRITE and not c.closed:
                c.writable()

    def run_until(self, cond, timeout: float, step: float = 0.05) -> bool:
        deadline = now() + timeout
        while not cond():
            left = deadline - now()
            if left <= 0:
                return False
            self.run_once(min(step, left))
        return True

    def ctl_wait(self, timeout: float):
        """Keep the sockets served until a control message arrives."""
        deadline = now() + timeout
        while not self.ctl_msgs:
            left = deadline - now()
            if left <= 0:
                raise TimeoutError("no control message")
            self.run_once(min(0.05, left))
        return self.ctl_msgs.pop(0)


def open_clients(loop: Loop, host: str, port: int, specs: list[dict], level: int,
                 timeout: float = 60.0, window: int = 200) -> list[Client]:
    """Connect (CONNECT/CONNACK) and subscribe (SUBSCRIBE/SUBACK) every spec:
    ``{"id": str, "sub": filter or None, "qos": int, "clean": bool,
    "expiry": int, "on_publish": callable or None}``, at most ``window``
    handshakes at a time."""
    clients = []
    pending = []
    todo = list(specs)
    deadline = now() + timeout
    while todo or pending:
        while todo and len(pending) < window:
            spec = todo.pop(0)
            c = Client(loop, spec["id"], level, spec.get("on_publish"), spec.get("tag"))
            c.start_connect(host, port)
            c.send(connect_packet(spec["id"], level, spec.get("clean", True), spec.get("keep_alive", 300),
                                  spec.get("expiry", 0), spec.get("receive_maximum")))
            pending.append((c, spec))
            clients.append(c)
        loop.run_once(0.02)
        still = []
        for c, spec in pending:
            if c.closed:
                raise ConnectionError(f"{c.name}: {c.error}")
            st = c.stream
            if st.connack is None:
                still.append((c, spec))
                continue
            if st.connack.reason_code:
                raise ConnectionError(f"{c.name}: CONNACK {st.connack.reason_code:#x}")
            if spec.get("sub"):
                if st.suback is None:
                    if not getattr(c, "tag", None) == "subscribing":
                        c.tag = "subscribing"
                        c.send(subscribe_packet(spec["sub"], spec.get("qos", 0), level))
                    still.append((c, spec))
                    continue
                if st.suback.reason_codes[0] >= 0x80:
                    raise ConnectionError(f"{c.name}: SUBACK {st.suback.reason_codes}")
            c.tag = spec.get("tag")
        pending = still
        if now() > deadline:
            raise TimeoutError(f"{len(pending) + len(todo)} clients not connected in {timeout}s")
    return clients


def receive_maximum(c: Client, default: int) -> int:
    ca = c.stream.connack
    if ca is not None and ca.properties:
        rm = ca.properties.get(Property.RECEIVE_MAXIMUM)
        if rm:
            return min(default, rm)
    return default


# --------------------------------------------------------------------------
# workers (each runs in its own process)


class Publisher:
    """Publishes to one client as fast as allowed: QoS 0 keeps the socket
    full; QoS 1 keeps ``window`` PUBLISH unacknowledged."""

    def __init__(self, client: Client, topic: str, payload: bytes, qos: int, level: int,
                 window: int) -> None:
        self.c = client
        self.qos = qos
        self.sent = 0
        self.stopped = False
        if qos == 0:
            one = publish_packet(topic, payload, 0, level)
            n = max(1, PUB_LOW_WATER // len(one))
            self.blob = one * n
            self.per_blob = n
        else:
            self.blob, self.length = qos1_blob(topic, payload, level)
            self.window = receive_maximum(client, window)
            self.next = 0  # index (0-based) of the next packet id in the blob
        # QoS 0 refills whenever the socket can take more; QoS 1 is topped up
        # as acknowledgements arrive (see _run_publishers), never by spinning
        client.on_writable = self.fill if qos == 0 else None
        client.flush()  # (re)register for write events

    def fill(self, c: Client) -> None:
        if self.stopped:
            c.on_writable = None
            return
        if self.qos == 0:
            c.outbuf += self.blob
            self.sent += self.per_blob
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
        self.stopped = True

    @property
    def outstanding(self) -> int:
        return self.sent - self.c.stream.acks if self.qos else 0


def _run_publishers(loop, pubs, until):
    qos1 = [p for p in pubs if p.qos]
    for p in qos1:
        p.top_up()
        p.c.flush()
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


def clients_worker(ctl, role: dict) -> None:
    """A worker process for the throughput scenarios.

    ``role``: host, port, level, qos, payload_size, duration, window,
    ``pubs``: [(client_id, topic)], ``subs``: [(client_id, filter)],
    sub_qos, receive_maximum.

    Protocol with the parent: → ("ready", info) ← ("go", t0) → ("published",
    info) ← ("drain", expected_total_for_this_worker, timeout) → ("done", info).
    """
    try:
        raise_nofile()
        loop = Loop(ctl)
        level = role["level"]
        specs = [{"id": cid, "sub": flt, "qos": role["sub_qos"],
                  "receive_maximum": role.get("receive_maximum"), "tag": "sub"} for cid, flt in role["subs"]]
        specs += [{"id": cid, "tag": "pub", "topic": topic} for cid, topic in role["pubs"]]
        clients = open_clients(loop, role["host"], role["port"], specs, level, timeout=role.get("connect_timeout", 60))
        subs = [c for c in clients if c.tag == "sub"]
        pub_clients = [c for c in clients if c.tag == "pub"]
        topics = dict(role["pubs"])
        payload = os.urandom(role["payload_size"])
        pubs = [Publisher(c, topics[c.name], payload, role["qos"], level, role["window"]) for c in pub_clients]
        ctl.send(("ready", {"pid": os.getpid()}))
        msg = loop.ctl_wait(role.get("ready_timeout", 120))
        if msg[0] != "go":
            return
        t0 = msg[1]
        while now() < t0:
            time.sleep(min(0.01, max(0.0, t0 - now())))
        cpu0 = cpu_seconds()
        for s in subs:
            s.stream.publishes = 0
        if pubs:
            _run_publishers(loop, pubs, t0 + role["duration"])
            t_pub_end = now()
            # QoS 1: wait for the outstanding acknowledgements
            loop.run_until(lambda: all(not p.c.outbuf and p.outstanding <= 0 for p in pubs),
                           role.get("ack_timeout", 30))
            info = {"sent": sum(p.sent for p in pubs), "unacked": sum(max(0, p.outstanding) for p in pubs),
                    "t_pub_end": t_pub_end, "t_acked": now(),
                    "errors": [c.error for c in pub_clients if c.error]}
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
            {"id": role["prefix"] + "-lsub", "sub": role["topic"], "qos": qos, "on_publish": on_publish, "tag": "sub"},
            {"id": role["prefix"] + "-lpub", "tag": "pub"},
        ], level)
        sub, pub = clients
        pad = bytes(role["payload_size"] - 8)
        template = publish_packet(role["topic"], b"\0" * 8 + pad, qos, level, packet_id=1)
        pay_at = len(template) - role["payload_size"]
        pid_at = pid_offset(template) if qos else 0
        ctl.send(("ready", {"pid": os.getpid()}))
        msg = loop.ctl_wait(120)
        t0 = msg[1]
        while now() < t0:
            time.sleep(0.001)
        cpu0 = cpu_seconds()
        rate, dur = role["rate"], role["duration"]
        n_total = int(rate * dur)
        interval = 1.0 / rate
        i = 0
        pkt = bytearray(template)
        while i < n_total:
            t = now()
            due = min(n_total, int((t - t0) / interval) + 1)
            while i < due:
                if qos:
                    pid = i % 65535 + 1
                    pkt[pid_at] = pid >> 8
                    pkt[pid_at + 1] = pid & 0xFF
                struct.pack_into("!d", pkt, pay_at, now())
                pub.send(bytes(pkt))
                i += 1
            nxt = t0 + i * interval
            loop.run_once(max(0.0, nxt - now()))
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


def idle_worker(ctl, role: dict) -> None:
    """Open ``count`` idle connections; → ("connected", info) ← ("close")."""
    try:
        raise_nofile()
        loop = Loop(ctl)
        level = role["level"]
        ctl.send(("ready", {"pid": os.getpid()}))
        msg = loop.ctl_wait(120)
        t0 = msg[1]
        while now() < t0:
            time.sleep(0.001)
        cpu0 = cpu_seconds()
        specs = [{"id": f"{role['prefix']}-{i}", "keep_alive": 0} for i in range(role["count"])]
        err = None
        try:
            clients = open_clients(loop, role["host"], role["port"], specs, level,
                                   timeout=role.get("timeout", 120), window=role.get("window", 100))
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
            clients = []
        t1 = now()
        ctl.send(("connected", {"t_done": t1, "connected": len(clients), "cpu": cpu_seconds() - cpu0,
                                "errors": [err] if err else []}))
        # stay connected (and answer nothing: keep alive 0) until told to close
        while True:
            try:
                m = loop.ctl_wait(300)
            except TimeoutError:
                break
            if m[0] == "close":
                break
        alive = sum(1 for c in clients if not c.closed)
        for c in clients:
            c.close()
        ctl.send(("done", {"alive_at_end": alive}))
    except Exception as e:
        import traceback
        ctl.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))


def persistent_worker(ctl, role: dict) -> None:
    """Persistent session: subscribe, go offline, publish ``count`` QoS 1
    messages (payload = sequence number), reconnect and drain."""
    try:
        loop = Loop(ctl)
        level = role["level"]
        count = role["count"]
        host, port = role["host"], role["port"]
        sub_id = role["prefix"] + "-psub"
        expiry = 3600 if level == 5 else 0
        # 1. a fresh persistent session with a QoS 1 subscription, then offline
        first = open_clients(loop, host, port, [{"id": sub_id, "sub": role["topic"] + "/#", "qos": 1,
                                                 "clean": True if level == 5 else False, "expiry": expiry}], level)[0]
        if level != 5:
            # cleanSession=0 may resume an old session: that is fine, it is new per run (fresh broker)
            pass
        first.send(disconnect_packet(level))
        loop.run_until(lambda: not first.outbuf, 5)
        first.close()
        time.sleep(0.2)
        ctl.send(("ready", {"pid": os.getpid()}))
        msg = loop.ctl_wait(120)
        # 2. publish
        pub = open_clients(loop, host, port, [{"id": role["prefix"] + "-ppub"}], level)[0]
        window = receive_maximum(pub, role["window"])
        one = publish_packet(role["topic"] + "/t", b"\0" * role["payload_size"], 1, level)
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
        sub = open_clients(loop, host, port, [{"id": sub_id, "clean": False, "expiry": expiry,
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
