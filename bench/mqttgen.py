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

The worker processes that use these pieces are in :mod:`bench.workers`.
"""

from __future__ import annotations

import errno
import os
import resource
import selectors
import socket
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
#: SO_SNDBUF of an unlimited-rate QoS 0 publisher's socket (the kernel doubles
#: it), BENCH_PUB_SNDBUF to change it, 0 for the kernel's autotuned default
#: (up to tcp_wmem's 4 MiB: ~2.8 MB, 34,000 PUBLISH of 83 bytes, left queued
#: when publishing stops, which a broker needs 3 s (tbmq) to 17 s (Mosquitto)
#: to read in fan-out, and amqtt more than a minute)
PUB_SNDBUF = int(os.environ.get("BENCH_PUB_SNDBUF", 1 << 16))

# maps a PUBLISH first byte with DUP set to the same byte without it
_NODUP = bytes((b & ~0x08) if (b >> 4) == 3 else b for b in range(256))


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def raise_nofile(want: int = 1 << 18) -> int:
    """Raise the open-files limit to ``want`` (the hard limit too, which
    needs CAP_SYS_RESOURCE, and at most ``fs.nr_open``), else the soft limit
    to the hard one; return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        with open("/proc/sys/fs/nr_open") as f:
            want = min(want, int(f.read()))
    except (OSError, ValueError):
        pass
    if hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want
        except (ValueError, OSError):
            pass
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return max(soft, hard)


# --------------------------------------------------------------------------
# packets


def connect_packet(client_id: str, level: int, clean: bool = True, keep_alive: int = 300,
                   session_expiry: int = 0, receive_maximum: int | None = None,
                   username: str | None = None) -> bytes:
    props = {}
    if level == 5:
        if session_expiry:
            props[Property.SESSION_EXPIRY_INTERVAL] = session_expiry
        if receive_maximum:
            props[Property.RECEIVE_MAXIMUM] = receive_maximum
    return encode(Connect(protocol_level=level, clean_start=clean, keep_alive=keep_alive,
                          client_id=client_id, username=username, properties=props), level)


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
    :ivar acks: PUBACK packets received (and PUBCOMP, and PUBREC refusing
        its PUBLISH: the end of a QoS 2 exchange).
    :ivar out: bytes to send back (PUBACKs owed for QoS 1 PUBLISH).
    :ivar on_publish: if set, called as ``on_publish(payload: bytes)`` for
        every PUBLISH and the bulk path is off (latency, persistent runs).
    :ivar ack_ids: if a list, the packet id of every PUBACK that accepted
        its PUBLISH (reason code < 0x80) is appended to it (with
        ``on_publish`` set: the bulk path stays off).
    :ivar refused: PUBACKs with a reason code >= 0x80 (v5).
    :ivar refused_ids: if a list (with ``ack_ids`` a list too), the packet
        id of every such refused PUBACK is appended to it.
    :ivar owed: if a list, the QoS 1 PUBLISH are not acknowledged at once:
        their 2-byte packet ids are appended to it for the owner to
        acknowledge when it wants (a slow reader).
    """

    __slots__ = ("buf", "level", "publishes", "acks", "pingresps", "other", "out", "on_publish",
                 "connack", "suback", "disconnect", "_fl", "_fh", "_frl", "_fpid", "_cool",
                 "_ack_owed", "ack_ids", "refused", "owed", "refused_ids")

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
        self.ack_ids = None
        self.refused = 0
        self.refused_ids = None
        self.owed = None
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
                if self.owed is not None:
                    self.owed.append(bytes(buf[pid_at:pid_at + 2]))
                else:
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
            if self.ack_ids is not None:
                if rl >= 3 and buf[i + 2] >= 0x80:
                    self.refused += 1
                    if self.refused_ids is not None:
                        self.refused_ids.append((buf[i] << 8) | buf[i + 1])
                else:
                    self.ack_ids.append((buf[i] << 8) | buf[i + 1])
            elif rl < 128 and self.on_publish is None:
                self._fl, self._fh, self._frl, self._fpid = total, first, rl, 0
        elif ptype == 13:
            self.pingresps += 1
        elif ptype == 5:  # PUBREC: answer PUBREL, unless it refused the PUBLISH (v5, >= 0x80: done)
            if rl >= 3 and buf[i + 2] >= 0x80:
                self.acks += 1
                self.refused += 1
            else:
                self.out += b"\x62\x02" + bytes(buf[i:i + 2])
        elif ptype == 6:  # PUBREL of a QoS 2 delivery: answer PUBCOMP
            self.out += b"\x70\x02" + bytes(buf[i:i + 2])
        elif ptype == 7:  # PUBCOMP: a QoS 2 PUBLISH is acknowledged
            self.acks += 1
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
                 "on_writable", "tag", "bytes_sent", "ending", "eof_at")

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
        self.bytes_sent = 0  # bytes send() accepted (into the kernel's send queue)
        self.ending = False  # DISCONNECT sent (end_clients): the broker's close is expected
        self.eof_at = None  # when the broker closed the connection

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
                self.bytes_sent += n
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
            self.eof_at = now()
            if self.ending:
                self.close()
            else:
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
    """A ``selectors`` loop over :class:`Client` objects and the control pipe.

    :param coalesce: seconds to sleep after a turn that handled events, so
        that the next ``recv`` finds many packets instead of one (a broker
        that writes each packet with its own system call otherwise costs the
        generator one loop turn per packet). 0 for the latency scenario.
    """

    def __init__(self, ctl=None, coalesce: float = 0.0) -> None:
        self.sel = selectors.DefaultSelector()
        self.ctl = ctl
        self.coalesce = coalesce
        self.ctl_msgs: list = []
        if ctl is not None:
            self.sel.register(ctl.fileno(), selectors.EVENT_READ, None)

    def run_once(self, timeout: float) -> None:
        events = self.sel.select(timeout)
        for key, ev in events:
            c = key.data
            if c is None:
                while self.ctl.poll():
                    self.ctl_msgs.append(self.ctl.recv())
                continue
            if ev & selectors.EVENT_READ:
                c.readable()
            if ev & selectors.EVENT_WRITE and not c.closed:
                c.writable()
        if events and self.coalesce:
            time.sleep(self.coalesce)

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
    "expiry": int, "on_publish": callable or None, "username": str or None,
    "port": int or None}`` (``port`` another node of a cluster, default
    ``port``), at most ``window`` handshakes at a time."""
    clients = []
    pending = []
    todo = list(specs)
    deadline = now() + timeout
    while todo or pending:
        while todo and len(pending) < window:
            spec = todo.pop(0)
            c = Client(loop, spec["id"], level, spec.get("on_publish"), spec.get("tag"))
            c.start_connect(host, spec.get("port") or port)
            c.send(connect_packet(spec["id"], level, spec.get("clean", True), spec.get("keep_alive", 300),
                                  spec.get("expiry", 0), spec.get("receive_maximum"), spec.get("username")))
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


def end_clients(loop: Loop, clients: list[Client], timeout: float) -> list[Client]:
    """End connections cleanly: DISCONNECT after everything queued, then
    ``shutdown(SHUT_WR)``, then serve the loop until the broker closes each,
    i.e. until it has read every byte sent. (Not ``close()`` with data still
    queued, which leaves it to the kernel, or to a reset if input is unread,
    what the broker gets.)

    :returns: the clients the broker did not close within ``timeout``.
    """
    deadline = now() + timeout
    live = [c for c in clients if not c.closed]
    for c in live:
        c.on_writable = None
        c.ending = True
        c.send(disconnect_packet(c.stream.level))
    loop.run_until(lambda: all(c.closed or not c.outbuf for c in live), timeout)
    for c in live:
        if not c.closed and not c.outbuf:
            try:
                c.sock.shutdown(socket.SHUT_WR)
            except OSError as e:
                c.fail(e)
    loop.run_until(lambda: all(c.closed for c in live), max(0.0, deadline - now()))
    return [c for c in live if c.eof_at is None]


def receive_maximum(c: Client, default: int) -> int:
    ca = c.stream.connack
    if ca is not None and ca.properties:
        rm = ca.properties.get(Property.RECEIVE_MAXIMUM)
        if rm:
            return min(default, rm)
    return default
