"""A broker on StringTransports and a task.Clock, for protocol and session
tests; an in-memory topic log; the store file an older tbmq wrote."""

from __future__ import annotations

import sqlite3

from twisted.internet import defer, task
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from tbmq.backends import sqlite_schema
from tbmq.backends.topic_records import expand
from tbmq.broker.broker import Broker
from tbmq.broker.protocol import MQTTFactory
from tbmq.config import load_config
from tbmq.mqtt import Connect
from tbmq.mqtt.codec import Decoder, encode
from tbmq.plugins import make_plugin_manager


class Client:
    """One fake connection: feed packets in, read decoded packets out.

    :param peer: the client's IPv4 address (StringTransport's 192.168.1.1
        when None).
    """

    def __init__(self, harness: "Harness", level: int, peer: str | None = None) -> None:
        self.harness = harness
        self.level = level
        self.protocol = harness.factory.buildProtocol(None)
        self.transport = (StringTransport() if peer is None
                          else StringTransport(peerAddress=IPv4Address("TCP", peer, 50000)))
        self.protocol.makeConnection(self.transport)
        self.decoder = Decoder(protocol_level=level, server_side=False)

    def send(self, *packets) -> None:
        for packet in packets:
            self.protocol.dataReceived(encode(packet, self.level))
        self.harness.turn()

    def send_bytes(self, data: bytes) -> None:
        self.protocol.dataReceived(data)
        self.harness.turn()

    def received(self) -> list:
        """The packets the broker wrote since the last call."""
        self.harness.turn()
        data = self.transport.value()
        self.transport.clear()
        return self.decoder.feed(data)

    @property
    def closed(self) -> bool:
        return self.transport.disconnecting

    def lose(self) -> None:
        """The network connection drops (no DISCONNECT)."""
        self.protocol.connectionLost(None)
        self.harness.turn()


class Harness:
    """A broker with memory stores (or the given backends) on a fake clock.

    :param overrides: config overrides (nested dict).
    :param clock: the :class:`task.Clock`; a new one at 0 s when None.
    :param replace: plugin name → a plugin registered in place of the
        built-in one of that name (an ``EmbeddedBackends`` whose SQLite
        work runs on a synchronous thread pool).
    """

    def __init__(self, overrides: dict | None = None, entry_points: bool = False,
                 clock: task.Clock | None = None, replace: dict | None = None,
                 **backends) -> None:
        data = {"storage": {"backend": "memory"}, "node": {"service_id": "test"},
                "auth": {"credentials": "memory"}}
        for key, value in (overrides or {}).items():
            if isinstance(value, dict):
                data.setdefault(key, {}).update(value)
            else:
                data[key] = value
        self.config = load_config(None, environ={}, overrides=data)
        self.clock = task.Clock() if clock is None else clock
        self.plugins = make_plugin_manager(self.config, load_entry_points=entry_points)
        for name, plugin in (replace or {}).items():
            self.plugins.unregister(name=name)
            self.plugins.register(plugin, name=name)
        self.broker = Broker(self.config, self.plugins, self.clock, **backends)
        #: the Deferred of the broker's start
        self.started = self.broker.start()
        self.factory = MQTTFactory(self.broker, self.config.listeners[0])

    def turn(self) -> None:
        """End the reactor turn: what was put off until then (the outbound
        queues' flush) runs."""
        self.clock.advance(0)

    def client(self, client_id: str = "c", level: int = 4, peer: str | None = None,
               **connect) -> Client:
        """Connect a client and consume its CONNACK (kept in ``client.connack``)."""
        c = Client(self, level, peer)
        c.send(Connect(protocol_level=level, client_id=client_id,
                       protocol_name="MQIsdp" if level == 3 else "MQTT", **connect))
        got = c.received()
        c.connack = got[0] if got else None
        c.pending = got[1:]
        return c

    def raw(self, level: int = 4, peer: str | None = None) -> Client:
        return Client(self, level, peer)


class MemoryTopicLog:
    """An in-memory :class:`tbmq.interfaces.ITopicLog` for the in-process
    bus's tests: what a restarted bus reads back is what this object kept.

    :ivar hold: when True, ``append`` returns Deferreds that fire only at
        :meth:`release` (a slow disk).
    :ivar records: ``(topic, partition) → {offset: (key, value, headers)}``.
    :ivar offsets: ``(group, topic, partition) → offset``.
    :ivar calls: the names of the calls made, in order.
    """

    def __init__(self) -> None:
        self.records: dict = {}
        self.offsets: dict = {}
        self.calls: list[str] = []
        self.hold = False
        self.held: list = []
        self.started = False

    def start(self):
        self.started = True
        return defer.succeed(None)

    def stop(self):
        self.started = False
        return defer.succeed(None)

    def append(self, records):
        self.calls.append("append")
        for topic, partition, offset, key, value, headers, compacted in expand(records):
            assert value is None or isinstance(value, bytes), "the log stores encoded values"
            part = self.records.setdefault((topic, partition), {})
            if compacted:
                for o in [o for o, (k, _, _) in part.items() if k == key]:
                    del part[o]
                if value is None:
                    continue
            part[offset] = (key, value, tuple(headers))
        if self.hold:
            d = defer.Deferred()
            self.held.append(d)
            return d
        return defer.succeed(None)

    def release(self) -> None:
        """Fire the appends held so far."""
        held, self.held = self.held, []
        for d in held:
            d.callback(None)

    def commit(self, group, topic, partition, offset):
        self.calls.append("commit")
        self.offsets[(group, topic, partition)] = offset
        return defer.succeed(None)

    def truncate(self, topic, partition, before):
        self.calls.append("truncate")
        part = self.records.get((topic, partition), {})
        for o in [o for o in part if o < before]:
            del part[o]
        return defer.succeed(None)

    def write(self, records, commits, truncates):
        d = self.append(records) if records else defer.succeed(None)
        for (group, topic, partition), offset in commits.items():
            self.commit(group, topic, partition, offset)
        for (topic, partition), before in truncates.items():
            self.truncate(topic, partition, before)
        return d

    def delete_topic(self, topic):
        self.calls.append("delete_topic")
        for key in [k for k in self.records if k[0] == topic]:
            del self.records[key]
        for key in [k for k in self.offsets if k[1] == topic]:
            del self.offsets[key]
        return defer.succeed(None)

    def load(self):
        records = [(topic, p, o, key, value, headers)
                   for (topic, p), part in sorted(self.records.items())
                   for o, (key, value, headers) in sorted(part.items())]
        return defer.succeed((records, dict(self.offsets)))

    def held_count(self, topic: str) -> int:
        """:returns: how many records of ``topic`` the log keeps."""
        return sum(len(part) for (t, _), part in self.records.items() if t == topic)


#: The tables ``sessions`` and ``subscriptions`` as the tbmq of embedded
#: schema versions 1 and 2 created them (version 3 moves their rows to the
#: topic log).
SESSION_TABLES_V1 = """
CREATE TABLE IF NOT EXISTS sessions (
    client_id TEXT PRIMARY KEY,
    protocol_level INTEGER NOT NULL,
    session_expiry_interval INTEGER NOT NULL,
    client_type TEXT NOT NULL,
    disconnected_at REAL
);
CREATE TABLE IF NOT EXISTS subscriptions (
    client_id TEXT NOT NULL,
    topic_filter TEXT NOT NULL,
    qos INTEGER NOT NULL,
    no_local INTEGER NOT NULL,
    retain_as_published INTEGER NOT NULL,
    retain_handling INTEGER NOT NULL,
    subscription_id INTEGER,
    PRIMARY KEY (client_id, topic_filter)
);
CREATE INDEX IF NOT EXISTS subscriptions_client_id
    ON subscriptions (client_id);
"""

#: Every table of an embedded store file of version 1.
TABLES_V1 = SESSION_TABLES_V1 + sqlite_schema._STORE_TABLES


def legacy_file(path: str, sessions: list[tuple], subscriptions: list[tuple] = (),
                log: list[tuple] = (), offsets: list[tuple] = ()) -> None:
    """Write an embedded store file of schema 2, as a tbmq that kept its
    sessions in tables left it.

    :param sessions: rows ``(client_id, protocol_level, expiry s, client_type,
        disconnected_at s | None)``.
    :param subscriptions: rows ``(client_id, topic_filter, qos, no_local,
        retain_as_published, retain_handling, subscription_id)``, in the
        order they were saved.
    :param log: rows of ``topic_log``; ``offsets`` rows of ``topic_log_offsets``.
    """
    conn = sqlite3.connect(path)
    try:
        conn.executescript(TABLES_V1 + sqlite_schema._TOPIC_LOG_V2)
        conn.execute("CREATE TABLE tbmq_schema (name TEXT PRIMARY KEY, version INTEGER NOT NULL)")
        conn.execute("INSERT INTO tbmq_schema VALUES ('embedded', 2)")
        conn.executemany("INSERT INTO sessions VALUES (?, ?, ?, ?, ?)", sessions)
        conn.executemany("INSERT INTO subscriptions VALUES (?, ?, ?, ?, ?, ?, ?)", subscriptions)
        conn.executemany("INSERT INTO topic_log VALUES (?, ?, ?, ?, ?, ?, ?)", log)
        conn.executemany("INSERT INTO topic_log_offsets VALUES (?, ?, ?, ?)", offsets)
        conn.execute("PRAGMA user_version=2")
        conn.commit()
    finally:
        conn.close()
