"""Helpers of the end-to-end suite: the broker as a ``twistd`` subprocess,
paho clients that collect what they receive, and a raw-socket client that
speaks bytes (built with :mod:`tbmq.mqtt.codec`) for misbehaving clients.

Every wait is on an event with a generous timeout, never a fixed sleep, so the
suite holds on a loaded CI machine.
"""

from __future__ import annotations

import collections
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tbmq.mqtt import Connect, Disconnect
from tbmq.mqtt.codec import Decoder, MalformedPacket, encode

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"

#: seconds to wait for anything that should happen
TIMEOUT = 10.0

#: ``twistd`` has no ``__main__``; this runs it from ``python -c``
TWISTD = "from twisted.scripts.twistd import run; run()"


def uid() -> str:
    """A short unique string for client ids and topic prefixes."""
    return uuid.uuid4().hex[:12]


#: the ports :func:`free_port` gave last (the kernel may give a port that
#: was just given and closed again: two listeners of one broker then ask
#: for the same port)
_GIVEN: "collections.deque[int]" = collections.deque(maxlen=2000)


def free_port() -> int:
    """A TCP port on the loopback interface that was free a moment ago and
    is none of the last 2,000 this process was given."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.append(port)
            return port
    raise RuntimeError("no free loopback port that was not given already")


# --------------------------------------------------------------------------
# The broker process
# --------------------------------------------------------------------------


class BrokerError(AssertionError):
    pass


class Broker:
    """``twistd -n tbmq`` on a free loopback port with its own data dir.

    :param workdir: the process's cwd; logs go there, data in ``workdir/data``.
    :param env: extra environment variables (``TBMQ_MQTT__...``).
    :param config: path of a YAML config file, or None.
    """

    START_TIMEOUT = 20.0
    STOP_TIMEOUT = 20.0

    def __init__(self, workdir: Path, env: dict[str, str] | None = None,
                 config: Path | None = None, port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.workdir / "data"
        self.env = dict(env or {})
        self.config = config
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.runs = 0
        #: True after stop()/kill(): not running is then no crash
        self.expected_down = True
        self._log_paths: list[Path] = []
        self._log_file = None

    # -- life cycle ------------------------------------------------------------

    def command(self) -> list[str]:
        cmd = [sys.executable, "-c", TWISTD, "-n", "--pidfile=", "tbmq",
               "--listen", f"tcp:{self.port}:interface={HOST}",
               "--data-dir", str(self.data_dir)]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        return cmd

    def start(self) -> "Broker":
        if self.proc is not None and self.proc.poll() is None:
            raise BrokerError("broker already running")
        self.runs += 1
        self.expected_down = False
        log_path = self.workdir / f"broker-{self.runs}.log"
        self._log_paths.append(log_path)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TBMQ_")}
        # this checkout's tbmq and first-party plugins, before any installed copy
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), str(REPO_ROOT / "plugins")]
            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        self._log_file = open(log_path, "wb")
        self.proc = subprocess.Popen(
            self.command(), cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
            stdout=self._log_file, stderr=subprocess.STDOUT)
        self._wait_listening()
        return self

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + self.START_TIMEOUT
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise BrokerError(f"broker exited with {rc} while starting:\n{self.log()}")
            try:
                with socket.create_connection((HOST, self.port), timeout=1):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise BrokerError(f"broker not listening on {self.port} after "
                                  f"{self.START_TIMEOUT} s:\n{self.log()}")
            time.sleep(0.05)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM and wait; SIGKILL (and fail) if it does not stop.

        :returns: the exit code.
        """
        proc = self.proc
        if proc is None:
            return None
        self.expected_down = True
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout or self.STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
                    raise BrokerError(f"broker did not stop on SIGTERM:\n{self.log()}")
            return proc.returncode
        finally:
            self._close_log()

    def __enter__(self) -> "Broker":
        """Start it; on leaving, stop it (SIGTERM), and kill it if that fails."""
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self.kill()

    def kill(self) -> None:
        self.expected_down = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def restart(self) -> "Broker":
        """Stop (SIGTERM) and start again on the same port and data dir."""
        self.stop()
        return self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def crashed(self) -> bool:
        """It exited without being stopped."""
        return not self.expected_down and self.proc is not None and self.proc.poll() is not None

    def log(self) -> str:
        """The output of every run so far."""
        parts = []
        for i, path in enumerate(self._log_paths, 1):
            try:
                text = path.read_bytes().decode("utf-8", "replace")
            except OSError:
                text = "<no log>"
            parts.append(f"----- broker run {i} ({path.name}) -----\n{text}")
        return "\n".join(parts)


# --------------------------------------------------------------------------
# paho clients
# --------------------------------------------------------------------------

PAHO_PROTOCOLS = {3: paho.MQTTv31, 4: paho.MQTTv311, 5: paho.MQTTv5}


def _code(rc: Any) -> int:
    """A paho ReasonCode (or int) as an int."""
    value = getattr(rc, "value", rc)
    return int(value)


@dataclass
class Received:
    """One PUBLISH received by a :class:`PahoClient` (copied off the paho
    thread)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    properties: Any = None
    at: float = field(default_factory=time.monotonic)

    def prop(self, name: str, default: Any = None) -> Any:
        """A v5 property by paho's name (``"UserProperty"``, ...)."""
        if self.properties is None:
            return default
        return getattr(self.properties, name, default)


def props(packet_type=PacketTypes.PUBLISH, **values) -> Properties:
    """``props(PacketTypes.CONNECT, SessionExpiryInterval=60)``."""
    p = Properties(packet_type)
    for name, value in values.items():
        setattr(p, name, value)
    return p


class PahoClient:
    """A paho client on its own network thread that queues what it receives.

    :param port: the broker's port.
    :param version: 3 (3.1), 4 (3.1.1) or 5.
    :param client_id: None for a fresh unique id; ``""`` sends an empty one.
    :param clean_session: v3 only (v5 passes ``clean_start`` to connect).
    """

    def __init__(self, port: int, version: int = 4, client_id: str | None = None,
                 clean_session: bool = True) -> None:
        self.port = port
        self.version = version
        self.client_id = f"c-{uid()}" if client_id is None else client_id
        kwargs = {}
        if version != 5:
            kwargs["clean_session"] = clean_session
        self.client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id, protocol=PAHO_PROTOCOLS[version],
            reconnect_on_failure=False, **kwargs)
        self.messages: "queue.Queue[Received]" = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connack_code: int | None = None
        self.session_present: bool | None = None
        self.connack_properties: Any = None
        #: every on_disconnect: (reason code int, properties)
        self.disconnects: list[tuple[int, Any]] = []
        self._cond = threading.Condition()
        self._acks: dict[int, list[int]] = {}
        self._loop_started = False
        c = self.client
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        c.on_subscribe = self._on_ack
        c.on_unsubscribe = self._on_ack

    # -- callbacks (paho thread) ---------------------------------------------

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.connack_code = _code(reason_code)
        self.session_present = bool(getattr(flags, "session_present", False))
        self.connack_properties = properties
        if self.connack_code == 0:
            self.disconnected.clear()
        self.connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.disconnects.append((_code(reason_code), properties))
        self.disconnected.set()

    def _on_message(self, client, userdata, msg) -> None:
        self.messages.put(Received(
            msg.topic, bytes(msg.payload), msg.qos, bool(msg.retain), bool(msg.dup),
            msg.properties if self.version == 5 else None))

    def _on_ack(self, client, userdata, mid, reason_code_list, properties) -> None:
        with self._cond:
            self._acks[mid] = [_code(rc) for rc in reason_code_list]
            self._cond.notify_all()

    # -- actions (test thread) -------------------------------------------------

    def connect_and_wait(self, *, clean_start: bool = True, session_expiry: int | None = None,
                         keepalive: int = 60, properties: Properties | None = None,
                         will: dict | None = None, expect_rc: int | None = 0,
                         timeout: float = TIMEOUT) -> "PahoClient":
        """Connect, start the network thread, wait for CONNACK.

        :param session_expiry: v5 Session Expiry Interval.
        :param will: keyword arguments of ``will_set``.
        :param expect_rc: the CONNACK code to assert, None for any.
        """
        c = self.client
        if will is not None:
            c.will_set(**will)
        kwargs: dict[str, Any] = {"keepalive": keepalive}
        if self.version == 5:
            if session_expiry is not None:
                properties = properties or props(PacketTypes.CONNECT)
                properties.SessionExpiryInterval = session_expiry
            kwargs["clean_start"] = clean_start
            if properties is not None:
                kwargs["properties"] = properties
        self.connected.clear()
        c.connect(HOST, self.port, **kwargs)
        if not self._loop_started:
            c.loop_start()
            self._loop_started = True
        if not self.connected.wait(timeout):
            raise AssertionError(f"{self.client_id}: no CONNACK in {timeout} s")
        if expect_rc is not None:
            assert self.connack_code == expect_rc, (
                f"{self.client_id}: CONNACK {self.connack_code:#x}, expected {expect_rc:#x}")
        return self

    def _wait_ack(self, mid: int, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while mid not in self._acks:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.client_id}: no SUBACK/UNSUBACK for mid {mid}")
                self._cond.wait(left)
            return self._acks.pop(mid)

    def subscribe(self, topic: str, qos: int = 0, *, no_local: bool = False,
                  retain_as_published: bool = False, retain_handling: int = 0,
                  sub_id: int | None = None, timeout: float = TIMEOUT) -> list[int]:
        """Subscribe and wait for SUBACK.

        :returns: the SUBACK reason codes.
        """
        if self.version == 5:
            options = SubscribeOptions(qos=qos, noLocal=no_local,
                                       retainAsPublished=retain_as_published,
                                       retainHandling=retain_handling)
            properties = None
            if sub_id is not None:
                properties = props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=sub_id)
            rc, mid = self.client.subscribe(topic, options=options, properties=properties)
        else:
            rc, mid = self.client.subscribe(topic, qos)
        assert rc == paho.MQTT_ERR_SUCCESS, f"subscribe failed locally: {rc}"
        return self._wait_ack(mid, timeout)

    def unsubscribe(self, topic: str, timeout: float = TIMEOUT) -> list[int]:
        rc, mid = self.client.unsubscribe(topic)
        assert rc == paho.MQTT_ERR_SUCCESS, f"unsubscribe failed locally: {rc}"
        return self._wait_ack(mid, timeout)

    def publish(self, topic: str, payload: bytes | str = b"", qos: int = 0,
                retain: bool = False, properties: Properties | None = None,
                wait: bool = True, timeout: float = TIMEOUT):
        """Publish; with ``wait``, until PUBACK / PUBCOMP (QoS 0: sent)."""
        info = self.client.publish(topic, payload, qos, retain, properties)
        assert info.rc == paho.MQTT_ERR_SUCCESS, f"publish failed locally: {info.rc}"
        if wait:
            info.wait_for_publish(timeout)
            assert info.is_published(), f"{self.client_id}: {topic} not acknowledged in {timeout} s"
        return info

    def get(self, timeout: float = TIMEOUT) -> Received:
        """The next received message; fails after ``timeout``."""
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no message in {timeout} s") from None

    def get_many(self, n: int, timeout: float = TIMEOUT) -> list[Received]:
        """``n`` messages, the deadline moving with each one received."""
        got: list[Received] = []
        for _ in range(n):
            try:
                got.append(self.get(timeout))
            except AssertionError as e:
                raise AssertionError(f"{e} after {len(got)} of {n}: "
                                     f"{[m.payload[:20] for m in got[-10:]]}") from None
        return got

    def get_for(self, topic: str, timeout: float = TIMEOUT) -> Received:
        """The next message on ``topic``, skipping others."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.client_id}: nothing on {topic} in {timeout} s")
            msg = self.get(left)
            if msg.topic == topic:
                return msg

    def assert_empty(self) -> None:
        """Nothing received that was not consumed yet (no waiting)."""
        left = []
        while True:
            try:
                left.append(self.messages.get_nowait())
            except queue.Empty:
                break
        assert not left, f"{self.client_id}: unexpected messages {left}"

    def wait_disconnected(self, timeout: float = TIMEOUT) -> None:
        if not self.disconnected.wait(timeout):
            raise AssertionError(f"{self.client_id}: still connected after {timeout} s")

    def disconnect(self, timeout: float = TIMEOUT, properties: Properties | None = None) -> None:
        """A normal DISCONNECT; returns once the broker has closed the
        connection, so it is done with it (paho closes its socket right
        after sending DISCONNECT: a duplicate of the socket stays open and
        is read until the broker's close)."""
        watch = None
        sock = self.client.socket()
        if self.client.is_connected() and isinstance(sock, socket.socket):
            watch = socket.fromfd(sock.fileno(), sock.family, sock.type)
        try:
            if self.client.is_connected():
                self.client.disconnect(properties=properties)
                self.wait_disconnected(timeout)
            self.stop_loop()
            if watch is not None:
                _read_until_closed(watch, timeout, self.client_id)
        finally:
            if watch is not None:
                watch.close()

    def stop_loop(self) -> None:
        if self._loop_started:
            self.client.loop_stop()
            self._loop_started = False

    def close(self) -> None:
        """Best-effort cleanup."""
        try:
            if self.client.is_connected():
                self.client.disconnect()
        except Exception:
            pass
        try:
            self.stop_loop()
        except Exception:
            pass
        try:
            sock = self.client.socket()
            if sock is not None:
                sock.close()
        except Exception:
            pass


def _read_until_closed(sock: socket.socket, timeout: float, who: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{who}: the broker did not close the connection "
                                 f"{timeout} s after DISCONNECT")
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return
        except socket.timeout:
            continue
        except OSError:  # reset or the like: closed as well
            return


class ListenersBroker(Broker):
    """The helpers' broker process, started with a config file of several
    listeners (no ``--listen``), ready once every listener accepts."""

    def __init__(self, workdir: Path, config: Path, ports: dict[str, int]) -> None:
        super().__init__(workdir, config=config, port=ports["tcp"])
        self.ports = ports

    def command(self) -> list[str]:
        return [sys.executable, "-c", TWISTD, "-n", "--pidfile=", "tbmq",
                "--config", str(self.config), "--data-dir", str(self.data_dir)]

    def _wait_listening(self) -> None:
        for port in self.ports.values():  # listeners start in config order
            self.port = port
            super()._wait_listening()
        self.port = self.ports["tcp"]

    def wait_log(self, text: str, timeout: float = TIMEOUT) -> str:
        """The first log line containing ``text``; fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log().splitlines():
                if text in line:
                    return line
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not in the broker log:\n{self.log()[-5000:]}")
            time.sleep(0.05)


# --------------------------------------------------------------------------
# Raw sockets
# --------------------------------------------------------------------------


class RawClient:
    """A TCP socket speaking MQTT bytes; for what a real client never sends.

    :param level: the protocol level to decode replies with.
    :param decode: False to only collect the bytes (``received``).
    """

    def __init__(self, port: int, level: int = 5, timeout: float = TIMEOUT,
                 decode: bool = True) -> None:
        self.level = level
        self.decode = decode
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = Decoder(protocol_level=level, server_side=False)
        self.pending: list = []
        self.received = b""
        self.closed_by_peer = False

    def send(self, data) -> None:
        """Send bytes or a packet (encoded at ``self.level``)."""
        if not isinstance(data, (bytes, bytearray)):
            data = encode(data, self.level)
        self.sock.sendall(data)

    def _recv(self, deadline: float) -> bool:
        """Read once; False when the peer closed."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed_by_peer = True
            return False
        self.received += data
        if self.decode:
            self.pending.extend(self.decoder.feed(data))
        return True

    def expect(self, timeout: float = TIMEOUT):
        """The next packet from the broker; fails on timeout or close."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            try:
                if not self._recv(deadline):
                    raise AssertionError(f"connection closed by the broker; got {self.received!r}")
            except socket.timeout:
                raise AssertionError(f"no packet from the broker in {timeout} s") from None
        return self.pending.pop(0)

    def connect(self, client_id: str = None, **kwargs):
        """Send CONNECT (at ``self.level``) and return the CONNACK."""
        packet = Connect(client_id=client_id if client_id is not None else f"raw-{uid()}",
                         protocol_level=self.level, **kwargs)
        if self.level == 3:
            packet.protocol_name = "MQIsdp"
        self.send(packet)
        return self.expect()

    def wait_closed(self, timeout: float = TIMEOUT) -> list:
        """Read until the broker closes the connection.

        :returns: every packet received before the close (including ones
            :meth:`expect` has not consumed).
        :raises AssertionError: the connection stayed open ``timeout`` s.
        """
        deadline = time.monotonic() + timeout
        try:
            while self._recv(deadline):
                pass
        except socket.timeout:
            raise AssertionError(
                f"the broker did not close the connection in {timeout} s; "
                f"received {self.received!r}") from None
        except MalformedPacket as e:
            raise AssertionError(f"broker sent malformed bytes {self.received!r}: {e}") from None
        packets, self.pending = self.pending, []
        return packets

    def disconnect(self) -> None:
        """A normal DISCONNECT, then wait for the broker's close."""
        self.send(Disconnect())
        self.wait_closed()
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def wait_for(predicate, timeout: float = TIMEOUT, interval: float = 0.02, what: str = "condition"):
    """Poll ``predicate`` until it is true; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
