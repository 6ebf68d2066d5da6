"""The exported event log: a plugin that writes what happens in the broker as
records for :mod:`tbmq.analytics` (schema version :data:`SCHEMA_VERSION`,
documented field by field in ``docs/events.md``).

Switched on by ``events.enabled: true`` (``TBMQ_EVENTS__ENABLED=true``); off,
it costs nothing: the entry-point plugin :data:`plugin` implements only
``tbmq_broker_started``, and registers a per-broker :class:`EventExporter`
(which implements the notification hooks) only when the config enables it.

Off the hot path: in the reactor thread a hook only appends a small tuple to
a bounded buffer (full → the event is dropped and counted, the broker never
waits).  One writer thread turns the tuples into JSON records and writes them
to the sink:

* ``sink: file`` -- JSON Lines files in ``events.directory`` (default
  ``<data_dir>/events``).  The file being written is
  ``events-<node>-<stamp>.jsonl.inprogress`` (:data:`IN_PROGRESS_SUFFIX`):
  visible, so that a report over a running broker reads what it holds so far
  (the reader leaves out its last line while that line is incomplete, and
  the file once its completed name exists).  Once it holds
  ``max_file_bytes`` or is ``rotate_interval`` seconds old, or when the
  broker stops, it is *rotated*: renamed ``events-<node>-<stamp>.jsonl``, or
  gzipped to ``events-<node>-<stamp>.jsonl.gz`` when ``compress`` is set (in
  a second thread, through a hidden temporary file; the ``.gz`` name appears
  only once it is complete, and the ``.inprogress`` file is removed after).
  Files left in progress by a crash are rotated when the exporter starts
  again (also the hidden ``.events-<node>-<stamp>.jsonl`` of earlier
  versions).
* ``sink: bus`` -- each record, as UTF-8 JSON bytes, is published to the bus
  topic ``events.bus_topic`` (``tbmq.events``; key: the client id, else the
  node), from the reactor thread, in batches.

The writer drains its buffer when the broker stops: after the last
connection has closed (so the disconnect events are in), and at the latest in
a reactor ``during shutdown`` trigger.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

from tbmq.hookspecs import hookimpl
from tbmq.log import OBSERVER as LOG_OBSERVER

__all__ = [
    "EVENT_TYPES",
    "IN_PROGRESS_SUFFIX",
    "SCHEMA_VERSION",
    "EventExporter",
    "EventsPlugin",
    "FileSink",
    "message_id",
    "plugin",
]

log = Logger(observer=LOG_OBSERVER)

#: The version of the record schema, written as ``"v"`` in every record.
SCHEMA_VERSION = 1

#: The suffix of the file the exporter is writing (``docs/events.md``).
IN_PROGRESS_SUFFIX = ".inprogress"

#: The values of a record's ``"type"``.
EVENT_TYPES = ("connect", "disconnect", "subscribe", "unsubscribe", "publish",
               "deliver", "drop", "auth_fail")

# tuple tags of the buffer (index into EVENT_TYPES)
(_CONNECT, _DISCONNECT, _SUBSCRIBE, _UNSUBSCRIBE, _PUBLISH, _DELIVER, _DROP,
 _AUTH_FAIL) = range(8)

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def message_id(publisher: str, topic: str, received_at: float) -> str:
    """The ``msg_id`` of a message: the same for its publish, delivery and
    drop records, on any node and across restarts (it only depends on what
    the message carries through the bus and the stores).

    :param publisher: the publisher's client id ("" for a will without one).
    :param topic: the topic name.
    :param received_at: the time of receipt, seconds since the epoch.
    :returns: 16 hexadecimal characters.
    """
    key = f"{publisher}\0{topic}\0{received_at!r}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(key, digest_size=8).hexdigest()


def _address(address) -> tuple[str | None, int | None]:
    """``(host, port)`` of an ``IAddress`` (a UNIX socket gives its path)."""
    if address is None:
        return None, None
    host = getattr(address, "host", None)
    if host is None:
        name = getattr(address, "name", None)
        return (name.decode("utf-8", "replace") if isinstance(name, bytes) else name), None
    return host, getattr(address, "port", None)


def _type(client_type) -> str | None:
    if client_type is None:
        return None
    return getattr(client_type, "value", str(client_type))


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000.0))


def to_record(item: tuple, node: str) -> dict:
    """Turn a buffered tuple into its record (a JSON-ready dict, None fields
    left out).

    :param item: a tuple made by one of :class:`EventExporter`'s hooks.
    :param node: the service id of this node.
    :returns: the record of schema :data:`SCHEMA_VERSION`.
    """
    tag, now = item[0], item[1]
    rec: dict[str, Any] = {"v": SCHEMA_VERSION, "type": EVENT_TYPES[tag],
                           "ts": _ms(now), "node": node}
    if tag == _DELIVER:
        _, _, cid, ctype, publisher, topic, qos, size, received_at, retain = item
        rec.update(client_id=cid, client_type=_type(ctype),
                   msg_id=message_id(publisher, topic, received_at), topic=topic,
                   qos=qos, bytes=size, retain=retain, publisher=publisher,
                   latency_ms=round((now - received_at) * 1000.0, 3))
    elif tag == _PUBLISH:
        _, _, cid, ctype, topic, qos, retain, size, received_at, will = item
        rec.update(client_id=cid, client_type=_type(ctype),
                   msg_id=message_id(cid, topic, received_at), topic=topic, qos=qos,
                   retain=retain, bytes=size, will=will)
    elif tag == _DROP:
        _, _, cid, ctype, reason, publisher, topic, qos, size, received_at = item
        rec.update(client_id=cid, client_type=_type(ctype), reason=reason)
        if topic is not None:
            rec.update(msg_id=message_id(publisher, topic, received_at), topic=topic,
                       qos=qos, bytes=size, publisher=publisher)
    elif tag == _CONNECT:
        (_, _, cid, ctype, level, host, port, clean, expiry, persistent, username) = item
        rec.update(client_id=cid, client_type=_type(ctype), protocol_version=level,
                   address=host, port=port, clean_start=clean, session_expiry=expiry,
                   persistent=persistent, username=username)
    elif tag == _DISCONNECT:
        _, _, cid, ctype, reason, connected_at, will = item
        rec.update(client_id=cid, client_type=_type(ctype), reason_code=reason,
                   duration_ms=None if connected_at is None else _ms(now - connected_at),
                   will=will)
    elif tag == _SUBSCRIBE:
        _, _, cid, ctype, topic_filter, qos, reason = item
        rec.update(client_id=cid, client_type=_type(ctype), topic_filter=topic_filter,
                   qos=qos, reason_code=reason)
    elif tag == _UNSUBSCRIBE:
        _, _, cid, ctype, topic_filter, reason = item
        rec.update(client_id=cid, client_type=_type(ctype), topic_filter=topic_filter,
                   reason_code=reason)
    elif tag == _AUTH_FAIL:
        _, _, cid, username, host, port, reason = item
        rec.update(client_id=cid, username=username, address=host, port=port,
                   reason_code=reason)
    return {k: v for k, v in rec.items() if v is not None}


def encode_record(record: dict) -> str:
    """One JSON Lines line (no newline) for ``record``."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


# -- sinks ---------------------------------------------------------------------


class FileSink:
    """JSON Lines files rotated by size and age (see the module docstring).

    Used from the writer thread only (its compression thread aside).

    :param directory: where the files go (created).
    :param node: the node's service id (in the file names).
    :param max_bytes: rotate once the current file holds this many bytes.
    :param max_age: rotate once the current file is this old, seconds.
    :param compress: gzip rotated files.
    :param now: the wall clock, seconds (injectable for tests).
    """

    def __init__(self, directory: str, node: str, max_bytes: int, max_age: float,
                 compress: bool, now: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.node = _SAFE.sub("_", node) or "node"
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.compress = compress
        self.now = now
        self.rotated = 0
        self._file = None
        self._path: str | None = None
        self._opened_at = 0.0
        self._seq = 0
        self._jobs: collections.deque = collections.deque()
        self._compressor: threading.Thread | None = None

    def open(self) -> None:
        """Create the directory and rotate the files a crash left in
        progress (and the hidden current files of earlier versions)."""
        os.makedirs(self.directory, exist_ok=True)
        hidden, visible = f".events-{self.node}-", f"events-{self.node}-"
        names = sorted(os.listdir(self.directory))
        for name in names:
            if name.startswith(hidden) and name.endswith(".gz.tmp"):
                os.unlink(os.path.join(self.directory, name))
        for name in names:
            if ((name.startswith(visible) and name.endswith(".jsonl" + IN_PROGRESS_SUFFIX))
                    or (name.startswith(hidden) and name.endswith(".jsonl"))):
                self._finish(os.path.join(self.directory, name), now=True)

    def _new_file(self) -> None:
        self._seq += 1
        now = self.now()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
        name = (f"events-{self.node}-{stamp}-{int(now * 1e6) % 1000000:06d}-{self._seq:04d}"
                f".jsonl{IN_PROGRESS_SUFFIX}")
        self._path = os.path.join(self.directory, name)
        self._file = open(self._path, "a", encoding="utf-8", newline="\n")
        self._opened_at = now

    def write(self, lines: list[str]) -> None:
        """Append ``lines`` (without newlines) and rotate when due."""
        if self._file is None:
            self._new_file()
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()
        if self._file.tell() >= self.max_bytes:
            self.rotate()

    def tick(self) -> None:
        """Rotate the current file when it is ``max_age`` old."""
        if self._file is not None and self.now() - self._opened_at >= self.max_age:
            self.rotate()

    def rotate(self) -> None:
        """Close the current file (if any) and publish it under its visible
        name (gzipped in the compression thread when ``compress``)."""
        f, path = self._file, self._path
        self._file = self._path = None
        if f is None:
            return
        f.close()
        if os.path.getsize(path) == 0:
            os.unlink(path)
            return
        self.rotated += 1
        self._finish(path)

    def _finish(self, current: str, now: bool = False) -> None:
        """Publish ``current`` (an in-progress file, or an earlier version's
        hidden one) under its completed name."""
        directory, name = os.path.split(current)
        if name.endswith(IN_PROGRESS_SUFFIX):
            name = name[:-len(IN_PROGRESS_SUFFIX)]
        completed = os.path.join(directory, name.lstrip("."))
        if not self.compress:
            os.replace(current, completed)
            return
        self._jobs.append((current, completed + ".gz"))
        if now:
            self._drain_jobs()
            return
        if self._compressor is None or not self._compressor.is_alive():
            self._compressor = threading.Thread(target=self._drain_jobs,
                                                name="tbmq-events-gzip", daemon=True)
            self._compressor.start()

    def _drain_jobs(self) -> None:
        while True:
            try:
                source, target = self._jobs.popleft()
            except IndexError:
                return
            try:
                tmp = os.path.join(os.path.dirname(target), "." + os.path.basename(target) + ".tmp")
                with open(source, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.replace(tmp, target)
                os.unlink(source)
            except OSError:
                log.failure("events: cannot compress {path}", path=source)

    def close(self) -> None:
        """Rotate the current file and wait for the compression."""
        self.rotate()
        if self._compressor is not None:
            self._compressor.join()
        self._drain_jobs()


class _BusSink:
    """Records published on the message bus from the reactor thread."""

    def __init__(self, bus, topic: str, call_from_thread: Callable) -> None:
        self.bus = bus
        self.topic = topic
        self.call_from_thread = call_from_thread
        self.pending: collections.deque = collections.deque()
        self.published = 0

    def open(self) -> None:
        pass

    def write(self, items: list[tuple[str, bytes]]) -> None:
        self.pending.append(items)
        self.call_from_thread(self.flush)

    def tick(self) -> None:
        pass

    def flush(self) -> None:
        """Publish what the writer thread encoded (reactor thread)."""
        while True:
            try:
                items = self.pending.popleft()
            except IndexError:
                return
            for key, value in items:
                try:
                    d = self.bus.publish(self.topic, key, value)
                except Exception:
                    log.failure("events: publishing to {topic} failed", topic=self.topic)
                    continue
                self.published += 1
                if d is not None:
                    d.addErrback(lambda f: log.failure("events: publishing failed", f))

    def close(self) -> None:
        pass


# -- the exporter --------------------------------------------------------------


class EventExporter:
    """The per-broker exporter: the notification hooks append tuples to a
    bounded buffer, a writer thread drains it into the sink.

    :param broker: the node's :class:`tbmq.node_view.NodeView` (its
        ``config``, ``clock``, ``service_id``, ``bus`` and ``bus_topic``).
    :param now: the writer's wall clock for rotation, seconds.
    :param call_from_thread: runs a callable in the reactor thread (``sink:
        bus``); the reactor's ``callFromThread`` when None.
    :ivar exported: records handed to the sink.
    :ivar lost: events dropped because the buffer was full or the sink failed.
    """

    def __init__(self, broker, now: Callable[[], float] = time.time,
                 call_from_thread: Callable | None = None) -> None:
        cfg = broker.config.events
        self.broker = broker
        self.config = cfg
        self.node = broker.service_id
        self._seconds = broker.clock.seconds
        self._buf: collections.deque = collections.deque()
        self._limit = cfg.buffer_size
        self._wake_at = max(1, min(cfg.buffer_size // 4, 10000))
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.exported = 0
        self.lost = 0
        self.closed = False
        if cfg.sink == "bus":
            if call_from_thread is None:
                from twisted.internet import reactor
                call_from_thread = reactor.callFromThread
            self.sink: Any = _BusSink(broker.bus, broker.bus_topic(cfg.bus_topic),
                                      call_from_thread)
        else:
            directory = cfg.directory or os.path.join(broker.config.data_dir, "events")
            self.sink = FileSink(directory, self.node, cfg.max_file_bytes,
                                 cfg.rotate_interval, cfg.compress, now)

    # -- life cycle -------------------------------------------------------------

    def start(self) -> None:
        """Open the sink and start the writer thread."""
        self.sink.open()
        self._thread = threading.Thread(target=self._run, name="tbmq-events", daemon=True)
        self._thread.start()
        log.info("events: exporting schema v{v} to {sink}", v=SCHEMA_VERSION,
                 sink=getattr(self.sink, "directory", None) or self.config.bus_topic)

    def close(self) -> None:
        """Drain the buffer into the sink, rotate the last file and stop the
        writer thread (blocks until done).  Later events are lost."""
        if self.closed:
            return
        self.closed = True
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        if isinstance(self.sink, _BusSink):
            self.sink.flush()
        log.info("events: {exported} records exported, {lost} lost",
                 exported=self.exported, lost=self.lost)

    def _run(self) -> None:
        interval = self.config.flush_interval
        while True:
            self._wake.wait(interval)
            self._wake.clear()
            stopping = self._stop
            self._drain()
            try:
                self.sink.tick()
            except Exception:
                log.failure("events: rotation failed")
            if stopping:
                break
        self._drain()
        try:
            self.sink.close()
        except Exception:
            log.failure("events: closing the sink failed")

    def _drain(self) -> None:
        buf = self._buf
        pop = buf.popleft
        while buf:
            items = []
            try:
                for _ in range(5000):
                    items.append(pop())
            except IndexError:
                pass
            self._write(items)

    def _write(self, items: list[tuple]) -> None:
        node = self.node
        try:
            if isinstance(self.sink, _BusSink):
                out = []
                for item in items:
                    rec = to_record(item, node)
                    out.append((rec.get("client_id") or node,
                                encode_record(rec).encode("utf-8")))
                self.sink.write(out)
            else:
                self.sink.write([encode_record(to_record(item, node)) for item in items])
            self.exported += len(items)
        except Exception:
            self.lost += len(items)
            log.failure("events: writing {n} records failed", n=len(items))

    def _put(self, item: tuple) -> None:
        buf = self._buf
        n = len(buf)
        if n >= self._limit or self.closed:
            self.lost += 1
            if self.lost == 1 or self.lost % 10000 == 0:
                log.warn("events: buffer full or closed, {lost} events lost so far",
                         lost=self.lost)
            return
        buf.append(item)
        if n + 1 == self._wake_at:
            self._wake.set()

    # -- hooks (reactor thread: append one tuple, nothing more) ---------------------

    @hookimpl
    def tbmq_broker_stopping(self, broker):
        if broker is not self.broker:
            return
        clock = broker.clock
        deadline = clock.seconds() + 10.0

        def wait_for_connections():
            if self.closed:
                return
            if broker.connection_count() and clock.seconds() < deadline:
                clock.callLater(0.05, wait_for_connections)
            else:
                self.close()

        clock.callLater(0, wait_for_connections)

    @hookimpl
    def tbmq_client_connected(self, session, connect, address):
        host, port = _address(address)
        self._put((_CONNECT, self._seconds(), session.client_id, session.client_type,
                   session.protocol_level, host, port, connect.clean_start,
                   session.expiry_interval, session.persistent, connect.username))

    @hookimpl
    def tbmq_client_disconnected(self, session, reason_code, will):
        self._put((_DISCONNECT, self._seconds(), session.client_id, session.client_type,
                   reason_code, session.connected_at, will))

    @hookimpl
    def tbmq_client_subscribed(self, session, topic_filter, options, reason_code):
        self._put((_SUBSCRIBE, self._seconds(), session.client_id, session.client_type,
                   topic_filter, None if options is None else options.qos, reason_code))

    @hookimpl
    def tbmq_client_unsubscribed(self, session, topic_filter, reason_code):
        self._put((_UNSUBSCRIBE, self._seconds(), session.client_id, session.client_type,
                   topic_filter, reason_code))

    @hookimpl
    def tbmq_message_published(self, session, message):
        if session is None:
            self._put((_PUBLISH, self._seconds(), message.publisher, None, message.topic,
                       message.qos, message.retain, len(message.payload),
                       message.received_at, True))
        else:
            self._put((_PUBLISH, self._seconds(), session.client_id, session.client_type,
                       message.topic, message.qos, message.retain, len(message.payload),
                       message.received_at, False))

    @hookimpl
    def tbmq_message_delivered(self, session, message, qos):
        self._put((_DELIVER, self._seconds(), session.client_id, session.client_type,
                   message.publisher, message.topic, qos, len(message.payload),
                   message.received_at, message.retain))

    @hookimpl
    def tbmq_message_dropped(self, session, message, reason):
        if message is None:
            self._put((_DROP, self._seconds(), session.client_id, session.client_type,
                       reason, None, None, None, None, None))
        else:
            self._put((_DROP, self._seconds(), session.client_id, session.client_type,
                       reason, message.publisher, message.topic, message.qos,
                       len(message.payload), message.received_at))

    @hookimpl
    def tbmq_authentication_failed(self, connect, address, reason_code):
        host, port = _address(address)
        self._put((_AUTH_FAIL, self._seconds(), connect.client_id, connect.username,
                   host, port, reason_code))


class EventsPlugin:
    """The entry-point plugin (``tbmq = events = tbmq.events:plugin``): when
    the broker starts with ``events.enabled``, it registers an
    :class:`EventExporter` for that broker in the broker's plugin manager."""

    #: broker → its exporter (so tests may find it)
    exporters: dict

    def __init__(self) -> None:
        self.exporters = {}

    @hookimpl
    def tbmq_broker_started(self, broker):
        cfg = getattr(broker.config, "events", None)
        if cfg is None or not cfg.enabled:
            return
        try:
            self._start(broker)
        except Exception:
            log.failure("events: the exporter could not start; no events are exported")

    def _start(self, broker) -> None:
        exporter = EventExporter(broker)
        # the broker looks up which notification hooks have implementations
        # once: register_plugin tells it there are new ones
        broker.register_plugin(exporter, name=f"events-exporter-{id(broker):x}")
        exporter.start()
        self.exporters[broker] = exporter
        add_trigger = getattr(broker.clock, "addSystemEventTrigger", None)
        if add_trigger is not None:
            add_trigger("during", "shutdown", exporter.close)

    @hookimpl
    def tbmq_broker_stopping(self, broker):
        self.exporters.pop(broker, None)


#: The plugin registered by the ``tbmq`` entry point ``events``.
plugin = EventsPlugin()
