"""The consumer thread of the Kafka bus (tbmq_plugins.kafka.loop) on a
scripted client: where partitions start, what is committed and when, the
records below a fetched end skipped, pause and resume, rebalances, stop."""

from __future__ import annotations

import queue
import time

import pytest

from tbmq_plugins.kafka.drivers import ConsumerClient, RawRecord
from tbmq_plugins.kafka.loop import ConsumerLoop
from tests.unit.test_kafka_bus import QueueReactor


class ScriptedClient(ConsumerClient):
    """Answers polls from a queue the test fills; records every call."""

    def __init__(self, partitions=(0, 1), committed=None, reported_end=2) -> None:
        self._partitions = list(partitions)
        self._committed = dict(committed or {})
        self._reported_end = reported_end
        self.polls: queue.SimpleQueue = queue.SimpleQueue()
        self.calls: list = []
        self.high: dict = {}  # the high watermarks "fetched"
        self.on_assign = self.on_revoke = None
        self.seek_fails = 0

    def partitions(self):
        return self._partitions

    def subscribe(self, on_assign, on_revoke):
        self.on_assign, self.on_revoke = on_assign, on_revoke
        self.calls.append(("subscribe",))

    def start_at(self, offsets, assign):
        self.calls.append(("start_at", dict(offsets), assign))

    def committed(self, partitions):
        return {p: self._committed.get(p) for p in partitions}

    def first_offsets(self, partitions):
        return {p: 0 for p in partitions}

    def end_offsets(self, partitions):
        return {p: self._reported_end for p in partitions}

    def high_watermarks(self, partitions):
        return {p: self.high[p] for p in partitions if p in self.high}

    def poll(self, timeout, max_records, want_ends):
        self.calls.append(("want", sorted(want_ends)))
        try:
            step = self.polls.get(timeout=timeout)
        except queue.Empty:
            return [], {}
        if callable(step):
            return step()
        return step

    def commit(self, offsets, wait):
        self.calls.append(("commit", dict(offsets), wait))

    def seek(self, offsets):
        self.calls.append(("seek", dict(offsets)))
        if self.seek_fails:
            self.seek_fails -= 1
            raise RuntimeError("Local: Erroneous state")

    def pause(self, partitions):
        self.calls.append(("pause", sorted(partitions)))

    def resume(self, partitions):
        self.calls.append(("resume", sorted(partitions)))

    def close(self):
        self.calls.append(("close",))


class Sink:
    """The reactor side, recording what the thread hands it."""

    def __init__(self) -> None:
        self.assigned: list = []
        self.batches: list = []
        self.revoked: list = []
        self.closed = False

    def _assigned(self, partitions):
        self.assigned.append(partitions)

    def _batch(self, records, reached):
        self.batches.append(([(r.partition, r.offset) for r in records], reached))

    def _revoke(self, partitions):
        self.revoked.append(partitions)

    def _closed(self):
        self.closed = True


def start(client, exclusive=True, from_beginning=False, durable=False, stuck=60.0):
    reactor = QueueReactor()
    sink = Sink()
    loop = ConsumerLoop(reactor, lambda: client, sink, exclusive=exclusive,
                        from_beginning=from_beginning, durable=durable, max_records=100,
                        timeout=2.0, grace=0.0, stuck=stuck, name="test")
    loop.start()
    return loop, sink, reactor


def commits(client) -> list:
    return [call[1:] for call in client.calls if call[0] == "commit"]


def stop(loop, sink, reactor) -> None:
    loop.stop()
    reactor.wait(lambda: sink.closed)


def records(p, offsets):
    return [RawRecord(p, o, None, b"v", ()) for o in offsets]


def test_a_new_group_starts_at_the_fetched_end_and_skips_what_was_there():
    client = ScriptedClient(reported_end=2)  # Tansu: the last batch's base + 1
    loop, sink, reactor = start(client)
    reactor.wait(lambda: sink.assigned)
    assert sink.assigned == [[0, 1]]
    assert ("start_at", {0: 2, 1: 2}, True) in client.calls
    # the first fetch: partition 0 really ends at 5
    client.polls.put((records(0, [2, 3, 4]), {0: 5, 1: 2}))
    reactor.wait(lambda: sink.batches)
    assert sink.batches == [([], [0, 1])]  # nothing handed, both read to their end
    reactor.wait(lambda: commits(client))
    assert commits(client)[0] == ({0: 5, 1: 2}, False)  # the group starts there
    client.polls.put((records(0, [5, 6]), {}))
    reactor.wait(lambda: len(sink.batches) == 2)
    assert sink.batches[1] == ([(0, 5), (0, 6)], [])
    stop(loop, sink, reactor)
    assert client.calls[-1] == ("close",)


def test_a_new_group_of_a_durable_topic_starts_at_the_first_offsets_at_once_committed():
    client = ScriptedClient(committed={1: 7})
    loop, sink, reactor = start(client, durable=True)
    reactor.wait(lambda: sink.assigned)
    assert ("start_at", {0: 0, 1: 7}, True) in client.calls
    assert commits(client) == [({0: 0}, True)]  # before anything is read
    stop(loop, sink, reactor)


def test_from_beginning_ignores_the_commits_but_does_not_move_them_back():
    client = ScriptedClient(committed={0: 4, 1: 9})
    loop, sink, reactor = start(client, from_beginning=True)
    reactor.wait(lambda: sink.assigned)
    assert ("start_at", {0: 0, 1: 0}, True) in client.calls
    client.polls.put((records(0, [0, 1]), {0: 2, 1: 0}))
    reactor.wait(lambda: sink.batches)
    assert sink.batches == [([(0, 0), (0, 1)], [0, 1])]
    stop(loop, sink, reactor)
    assert commits(client) == []


def test_the_backlog_is_what_the_partitions_hold_beyond_what_was_handed():
    client = ScriptedClient(committed={0: 0, 1: 0})
    loop, sink, reactor = start(client)
    reactor.wait(lambda: sink.assigned)
    client.high = {0: 10, 1: 3}
    client.polls.put((records(0, [0, 1, 2, 3]), {}))
    reactor.wait(lambda: sink.batches)
    deadline = time.monotonic() + 5
    while loop.backlog != 6 + 3:  # read again within BACKLOG_EVERY
        assert time.monotonic() < deadline, f"backlog {loop.backlog}"
        time.sleep(0.05)
    stop(loop, sink, reactor)


def test_the_reactor_asks_and_the_thread_does_between_polls():
    client = ScriptedClient(committed={0: 0, 1: 0})
    loop, sink, reactor = start(client)
    reactor.wait(lambda: sink.assigned)
    loop.commit(0, 3)
    loop.commit(0, 5)  # only the latest is sent
    loop.want_paused = True
    reactor.wait(lambda: ("pause", [0, 1]) in client.calls)
    assert ({0: 5}, False) in commits(client)
    loop.want_paused = False
    reactor.wait(lambda: ("resume", [0, 1]) in client.calls)
    loop.commit(1, 2)
    stop(loop, sink, reactor)
    done = client.calls[-2:]
    assert done in ([("commit", {1: 2}, True), ("close",)],
                    [("commit", {1: 2}, False), ("close",)])


def test_a_partition_is_read_again_from_the_offset_the_reactor_asks():
    client = ScriptedClient(committed={0: 0, 1: 0})
    client.seek_fails = 1  # retried between the next polls
    loop, sink, reactor = start(client)
    reactor.wait(lambda: sink.assigned)
    client.polls.put((records(0, [0, 1, 2]) + records(1, [0]), {0: 3, 1: 1}))
    reactor.wait(lambda: sink.batches)
    loop.commit(0, 1)
    loop.seek(0, 1)  # the record at offset 1 failed
    reactor.wait(lambda: len(sink.assigned) == 2)
    assert sink.assigned == [[0, 1], [0]]  # a new track for partition 0 only
    seeks = [call for call in client.calls if call[0] == "seek"]
    assert seeks == [("seek", {0: 1})] * 2
    done = client.calls.index(seeks[-1])
    assert ("commit", {0: 1}, False) in client.calls[:done]  # commits go first
    assert ("want", [0]) in client.calls[done:]  # its end is fetched again
    client.polls.put((records(0, [1, 2]), {0: 3}))
    reactor.wait(lambda: len(sink.batches) == 2)
    assert sink.batches[1] == ([(0, 1), (0, 2)], [0])  # reached again
    stop(loop, sink, reactor)


def test_a_partition_revoked_before_its_seek_is_not_sought():
    client = ScriptedClient(committed={0: 10, 1: 20})
    loop, sink, reactor = start(client, exclusive=False)
    reactor.wait(lambda: client.on_assign is not None)
    client.polls.put(lambda: (client.on_assign([0, 1]), ([], {0: 10, 1: 20}))[1])
    reactor.wait(lambda: sink.batches)

    def rebalance():
        loop.seek(0, 10)  # asked just before the partition went
        client.on_revoke([0])
        return [], {}

    client.polls.put(rebalance)
    reactor.wait(lambda: sink.revoked)
    time.sleep(0.2)
    assert not [call for call in client.calls if call[0] == "seek"]
    assert sink.assigned == [[0, 1]]
    stop(loop, sink, reactor)


def test_a_topic_view_seeks_the_shared_client_on_its_topic():
    from tbmq_plugins.kafka.loop import TopicView

    class Shared:
        def __init__(self):
            self.sought = []

        def seek(self, offsets):
            self.sought.append(offsets)

    shared = Shared()
    TopicView(shared, "t1").seek({0: 4, 2: 9})
    assert shared.sought == [{("t1", 0): 4, ("t1", 2): 9}]


def test_a_rebalance_asks_the_reactor_and_commits_before_the_partitions_go():
    client = ScriptedClient(committed={0: 10, 1: 20})
    loop, sink, reactor = start(client, exclusive=False)
    reactor.wait(lambda: client.on_assign is not None)
    client.polls.put(lambda: (client.on_assign([0, 1]), ([], {0: 10, 1: 20}))[1])
    reactor.wait(lambda: sink.batches)
    assert sink.assigned == [[0, 1]] and sink.batches == [([], [0, 1])]
    taken: list = []

    def rebalance():
        loop.commit(0, 12)  # what the reactor finished just before
        taken.append(client.on_revoke([0, 1]))  # asks the reactor, waits
        client.on_assign([1])
        return records(0, [12]) + records(1, [20]), {1: 21}

    client.polls.put(rebalance)
    reactor.wait(lambda: len(sink.batches) == 2)
    assert sink.revoked == [[0, 1]] and taken == [{0: 12}]  # for the driver to commit
    assert sink.assigned[-1] == [1]
    # partition 0 went: its record read before the rebalance is not handed
    assert sink.batches[1] == ([(1, 20)], [1])
    stop(loop, sink, reactor)


def test_a_member_stopping_finishes_a_rebalance_under_way_before_it_leaves():
    client = ScriptedClient(committed={0: 0, 1: 0})
    loop, sink, reactor = start(client, exclusive=False)
    reactor.wait(lambda: client.on_assign is not None)
    client.polls.put(lambda: (client.on_revoke([]), ([], {}))[1])  # joining
    reactor.wait(lambda: client.polls.empty() and len(client.calls) > 3)
    loop.stop()
    time.sleep(0.3)
    assert not sink.closed  # still in the rebalance: not leaving now
    client.polls.put(lambda: (client.on_assign([0]), ([], {}))[1])
    reactor.wait(lambda: sink.closed)
    assert client.calls[-1] == ("close",)


def test_a_member_without_an_assignment_for_too_long_joins_again():
    client = ScriptedClient()
    loop, sink, reactor = start(client, exclusive=False, stuck=0.3)
    reactor.wait(lambda: client.calls.count(("subscribe",)) == 2)
    first = client.calls.index(("subscribe",))
    assert ("close",) in client.calls[first:]  # left, then joined as a new member
    client.polls.put(lambda: (client.on_assign([0, 1]), ([], {0: 0, 1: 0}))[1])
    reactor.wait(lambda: sink.batches)
    assert sink.assigned == [[0, 1]]
    time.sleep(0.5)
    assert client.calls.count(("subscribe",)) == 2  # assigned: no more rejoining
    stop(loop, sink, reactor)


def test_an_offset_fetch_error_for_a_partition_is_not_read_as_no_offset():
    """confluent: a partition whose committed offset came back with an error
    (its coordinator loading, a rebalance) raises, so the loop asks again;
    read as "no offset", the partition would start at its end and skip what
    its last owner had not finished."""
    from confluent_kafka import KafkaError, KafkaException
    from tbmq_plugins.kafka.confluent import _committed

    class Answer:  # what Consumer.committed returns per partition
        def __init__(self, partition, offset, error=None):
            self.topic, self.partition, self.offset, self.error = "t", partition, offset, error

    assert [(tp.partition, o) for tp, o in _committed([Answer(0, 7), Answer(1, -1001)])] == \
        [(0, 7), (1, None)]
    with pytest.raises(KafkaException):
        _committed([Answer(0, 7), Answer(1, -1001, KafkaError(KafkaError.REBALANCE_IN_PROGRESS))])
