"""A non-persistent session's ``tbmq.client.session`` record is transient
(the in-process bus does not write it to its topic log), except where it
replaces a record the log may hold: a restart never brings back a
persistent session that a clean one replaced, and every consumer still
reads every record."""

from __future__ import annotations

from twisted.internet import task

from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.backends.sqlite_runner import SQLiteRunner
from tbmq.backends.sqlite_topic_log import SQLiteTopicLog
from tbmq.cluster.records import Record, SessionInfo
from tbmq.cluster.registry import SessionRegistry
from tbmq.cluster.topics import TRANSIENT, TopicCatalogue, transient
from tbmq.model import ClientType
from tests.unit.test_stores import SyncReactor, SyncThreadPool, fired


def info(client_id: str, persistent: bool, session_id: str = "s1") -> SessionInfo:
    return SessionInfo(client_id, "me", session_id, True, persistent, ClientType.DEVICE,
                       60 if persistent else 0, 4, 0.0, None, 0.0)


class Node:
    """A bus on an SQLite topic log with this node's registry; the log's
    appends and commits are counted (made alone or in a turn's write)."""

    def __init__(self, path: str) -> None:
        self.topics = TopicCatalogue()
        self.log = SQLiteTopicLog(SQLiteRunner(path, SyncReactor(), SyncThreadPool()))
        self.appended: list = []
        append = self.log.append

        def counting(entries):
            self.appended.extend((e[3], e[4] is not None) for e in entries)
            return append(entries)

        self.log.append = counting
        self.commits: list = []
        commit = self.log.commit

        def counting_commits(group, topic, partition, offset):
            self.commits.append((group, offset))
            return commit(group, topic, partition, offset)

        self.log.commit = counting_commits
        write = self.log.write

        def counting_write(records, commits, truncates):  # the bus's writes of a turn
            self.appended.extend((e[3], e[4] is not None) for e in records)
            self.commits.extend((group, offset) for (group, _, _), offset in commits.items())
            return write(records, commits, truncates)

        self.log.write = counting_write
        self.clock = task.Clock()
        self.bus = InProcessBus(clock=self.clock, catalogue=self.topics, log=self.log)
        fired(self.bus.start())
        self.registry = SessionRegistry(self.bus, self.topics.client_session, "me")
        caught_up = self.registry.start()
        self.clock.advance(0)  # the replay
        fired(caught_up)
        self.read: list = []
        self.bus.subscribe(self.topics.client_session, "other", self.read.append)

    def turn(self) -> None:
        """The next reactor turn: the last one's group commit to the log."""
        self.clock.advance(0)

    def stop(self) -> None:
        fired(self.bus.stop())


def test_a_clean_session_record_and_its_tombstone_are_not_logged_but_are_read(tmp_path):
    node = Node(str(tmp_path / "db"))
    assert node.registry.put(info("c", False)) is None  # not waited for
    assert node.registry.get("c") is not None
    node.registry.remove("c")
    assert node.registry.get("c") is None
    node.turn()
    assert node.appended == []
    assert [r.key for r in node.read] == ["c", "c"]  # another group still reads both
    assert all(transient(r.headers) for r in node.read)
    node.registry.put(info("p", True))
    node.turn()
    assert node.appended == [("p", True)]
    node.stop()


def test_a_clean_session_replacing_a_persistent_one_is_logged_and_a_restart_keeps_it_gone(
        tmp_path):
    path = str(tmp_path / "db")
    node = Node(path)
    node.registry.put(info("x", True, "old"))
    node.registry.put(info("x", False, "new"))  # replaces the logged record
    node.registry.remove("x")  # its tombstone: logged too
    node.registry.put(info("x", False, "newer"))  # the log ends with a tombstone now
    node.registry.remove("x")
    node.turn()
    assert [key for key, _ in node.appended] == ["x", "x", "x"]
    node.stop()
    again = Node(path)
    assert again.registry.get("x") is None
    assert len(again.read) == 0 or again.read[-1].value is None
    again.stop()


def test_a_persistent_session_replayed_from_the_log_is_replaced_durably(tmp_path):
    path = str(tmp_path / "db")
    node = Node(path)
    node.registry.put(info("x", True, "old"))
    node.stop()
    again = Node(path)
    assert again.registry.get("x").session_id == "old"
    again.registry.put(info("x", False, "new"))
    again.turn()
    assert again.appended == [("x", True)]
    again.stop()
    third = Node(path)
    assert third.registry.get("x").session_id == "new"  # not the persistent one
    assert not third.registry.get("x").persistent
    third.stop()


def test_transient_finds_the_header_among_others():
    assert transient((("x", b""), ("tbmq-transient", b"1")))
    assert not transient((("x", b""),)) and not transient(())


def test_reading_only_clean_session_records_writes_no_commit_and_a_restart_reads_on(tmp_path):
    """The groups' commits over transient records only are not written (a
    SQLite write per burst of CONNECTs); a commit over a logged record is,
    capped at the end of what the log holds, and after a restart the next
    record is read."""
    path = str(tmp_path / "db")
    node = Node(path)
    node.registry.put(info("first", False))  # makes the partition: each group's
    node.turn()                               # offset 0 is written once
    node.turn()
    node.commits.clear()
    for i in range(3):
        node.registry.put(info(f"c{i}", False))
    node.turn()
    node.turn()
    assert node.commits == []
    node.registry.put(info("p", True))  # logged at offset 4
    node.turn()
    node.turn()
    assert sorted(set(o for _, o in node.commits)) == [5]
    node.commits.clear()
    node.registry.put(info("c9", False))
    node.turn()
    node.turn()
    assert node.commits == []
    node.stop()
    again = Node(path)
    assert again.registry.get("p") is not None and again.registry.get("c9") is None
    again.registry.put(info("q", True))
    again.turn()
    assert [r.key for r in again.read][-1] == "q"
    assert again.registry.get("q") is not None
    again.stop()


class PackingBus:
    """A bus that packs records (as Kafka's): its publishes are recorded,
    not carried."""

    packs = True

    def __init__(self) -> None:
        self.published: list = []

    def publish(self, topic, key, value, headers=(), done=None):
        self.published.append((key, value, headers))
        if done is not None:
            done(None)


def test_on_a_bus_that_packs_no_record_is_marked_transient_and_none_is_remembered():
    """Kafka keeps every topic and ignores the mark; a record with headers
    would not be packed, and the client ids remembered for the mark would
    grow with every clean session the node reads."""
    bus = PackingBus()
    registry = SessionRegistry(bus, "tbmq.client.session", "me")
    registry.put(info("c", False))
    registry.remove("c")
    registry.put(info("p", True))
    registry.remove("p")
    assert [(key, headers) for key, _, headers in bus.published] == [
        ("c", ()), ("c", ()), ("p", ()), ("p", ())]
    for n in range(3):  # records of other nodes, with and without the mark
        registry._on_record(Record("tbmq.client.session", f"o{n}", info(f"o{n}", n == 0),
                                   TRANSIENT if n == 1 else ()))
    assert len(registry.sessions) == 3 and not registry._logged
