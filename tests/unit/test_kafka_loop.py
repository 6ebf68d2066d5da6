"""The consumer threads of the Kafka bus (tbmq_plugins.kafka.loop) on a
scripted client: where partitions start, what is committed and when, the
records below a fetched end skipped, pause and resume, rebalances, stop, and
several subscriptions on one client."""

from __future__ import annotations

import queue
import time

import pytest

from tbmq_plugins.kafka.drivers import RawRecord, SharedClient
from tbmq_plugins.kafka.loop import ConsumerLoop, SharedLoop
from tests.unit.test_kafka_bus import QueueReactor

T = "t"


def tps(partitions, topic=T) -> dict:
    """``{p: value}`` as the client sees it: ``{(topic, p): value}``."""
    return {(topic, p): v for p, v in partitions.items()}


class ScriptedClient(SharedClient):
    """Answers polls from a queue the test fills; records every call (with
    the partitions of topic :data:`T` as ``int``, the others as tuples)."""

    def __init__(self, partitions=(0, 1), committed=None, reported_end=2) -> None:
        self._partitions = list(partitions)
        self._committed = dict(committed or {})
        self._reported_end = reported_end
        self.polls: queue.SimpleQueue = queue.SimpleQueue()
        self.calls: list = []
        self.high: dict = {}  # the high watermarks "fetched"
        self.on_assign = self.on_revoke = None
        self.seek_fails = 0

    @staticmethod
    def _plain(tps_):
        return {(p if t == T else (t, p)): v for (t, p), v in tps_.items()}

    @staticmethod
    def _list(tps_):
        return sorted(p if t == T else (t, p) for t, p in tps_)

    def partitions(self, topic):
        return self._partitions

    def add(self, offsets):
        self.calls.append(("start_at", self._plain(offsets), True))

    def remove(self, tps_):
        self.calls.append(("remove", self._list(tps_)))

    def subscribe(self, topics, on_assign, on_revoke):
        self.on_assign, self.on_revoke = on_assign, on_revoke
        self.calls.append(("subscribe", list(topics)))

    def seek(self, offsets):
        self.calls.append(("seek", self._plain(offsets)))
        if self.seek_fails:
            self.seek_fails -= 1
            raise RuntimeError("Local: Erroneous state")

    def committed(self, tps_):
        return {(t, p): self._committed.get(p if t == T else (t, p)) for t, p in tps_}

    def first_offsets(self, tps_):
        return {tp: 0 for tp in tps_}

    def end_offsets(self, tps_):
        return {tp: self._reported_end for tp in tps_}

    def high_watermarks(self, tps_):
        return {(t, p): self.high[p] for t, p in tps_ if p in self.high}

    def poll(self, timeout, max_records, want_ends):
        self.calls.append(("want", self._list(want_ends)))
        try:
            step = self.polls.get(timeout=timeout)
        except queue.Empty:
            return {}, {}
        if callable(step):
            step = step()
        records, ends = step
        if isinstance(records, list):
            records = {T: records} if records else {}
        return records, {(k if isinstance(k, tuple) else (T, k)): v for k, v in ends.items()}

    def commit(self, offsets, wait):
        self.calls.append(("commit", self._plain(offsets), wait))

    def pause(self, tps_):
        self.calls.append(("pause", self._list(tps_)))

    def resume(self, tps_):
        self.calls.append(("resume", self._list(tps_)))

    def close(self):
        self.calls.append(("close",))


class Sink:
    """The reactor side, recording what the thread hands it."""

    def __init__(self) -> None:
        self.assigned: list = []
        self.starts: list = []
        self.batches: list = []
        self.tops: list = []
        self.revoked: list = []
        self.closed = False

    def _assigned(self, partitions, starts=None):
        self.assigned.append(partitions)
        self.starts.append(starts)

    def _batch(self, records, reached, tops=None):
        self.batches.append(([(r.partition, r.offset) for r in records], reached))
        self.tops.append(tops)

    def _revoke(self, partitions):
        self.revoked.append(partitions)

    def _closed(self):
        self.closed = True


def member(reactor, exclusive=True, from_beginning=False, durable=False, contiguous=False,
           compaction_lag_ms=None):
    sink = Sink()
    loop = ConsumerLoop(reactor, sink, exclusive=exclusive, from_beginning=from_beginning,
                        durable=durable, timeout=2.0, name="test", contiguous=contiguous,
                        compaction_lag_ms=compaction_lag_ms)
    return loop, sink


def shared(client, reactor, exclusive=True, stuck=60.0) -> SharedLoop:
    return SharedLoop(reactor, lambda: client, joining=not exclusive, max_records=100,
                      timeout=2.0, grace=0.0, stuck=stuck, name="test")


def start(client, exclusive=True, from_beginning=False, durable=False, stuck=60.0,
          contiguous=False, compaction_lag_ms=None):
    reactor = QueueReactor()
    loop, sink = member(reactor, exclusive, from_beginning, durable, contiguous,
                        compaction_lag_ms)
    shared(client, reactor, exclusive, stuck).add(loop, T)
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
    assert sink.starts == [{}]  # where they start was not known: at the end
    assert sink.tops == [{0: 5, 1: 2}]  # now it is (what .own relies on)
    reactor.wait(lambda: commits(client))
    assert commits(client)[0] == ({0: 5, 1: 2}, False)  # the group starts there
    client.polls.put((records(0, [5, 6]), {}))
    reactor.wait(lambda: len(sink.batches) == 2)
    assert sink.batches[1] == ([(0, 5), (0, 6)], [])
    stop(loop, sink, reactor)
    assert client.calls[-1] == ("remove", [0, 1])  # the client is closed once idle


def test_a_new_group_of_a_durable_topic_starts_at_the_first_offsets_at_once_committed():
    client = ScriptedClient(committed={1: 7})
    loop, sink, reactor = start(client, durable=True)
    reactor.wait(lambda: sink.assigned)
    assert ("start_at", {0: 0, 1: 7}, True) in client.calls
    assert sink.starts == [{0: 0, 1: 7}]  # known: told to the reactor
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
    # the last commit waits, for what was committed without waiting too
    assert client.calls[-2:] == [("commit", {0: 5, 1: 2}, True), ("remove", [0, 1])]


def test_commits_that_do_not_wait_go_once_per_interval_with_the_latest_offsets():
    """A commit asked right after one was sent waits for COMMIT_EVERY, and
    the offsets asked meanwhile go as one commit of the latest of each
    partition; a stop commits what waits at once."""
    from tbmq_plugins.kafka.loop import COMMIT_EVERY

    client = ScriptedClient(committed={0: 0, 1: 0})
    loop, sink, reactor = start(client)
    reactor.wait(lambda: sink.assigned)
    loop.commit(0, 1)
    reactor.wait(lambda: commits(client))
    sent = time.monotonic()
    loop.commit(0, 2)
    loop.commit(1, 4)
    loop.commit(0, 3)
    reactor.wait(lambda: len(commits(client)) == 2)
    assert time.monotonic() - sent >= COMMIT_EVERY * 0.9
    assert commits(client) == [({0: 1}, False), ({0: 3, 1: 4}, False)]
    loop.commit(0, 9)  # asked within the interval: the stop does not wait for it
    stop(loop, sink, reactor)
    assert ("commit", {0: 9, 1: 4}, True) in client.calls


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
    client.polls.put(lambda: (client.on_assign([(T, 0), (T, 1)]), ([], {0: 10, 1: 20}))[1])
    reactor.wait(lambda: sink.batches)
    positioned = [call for call in client.calls if call[0] == "seek"]  # by the assignment

    def rebalance():
        loop.seek(0, 10)  # asked just before the partition went
        client.on_revoke([(T, 0)])
        return [], {}

    client.polls.put(rebalance)
    reactor.wait(lambda: sink.revoked)
    time.sleep(0.2)
    assert [call for call in client.calls if call[0] == "seek"] == positioned
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
    client.polls.put(lambda: (client.on_assign([(T, 0), (T, 1)]), ([], {0: 10, 1: 20}))[1])
    reactor.wait(lambda: sink.batches)
    assert sink.assigned == [[0, 1]] and sink.batches == [([], [0, 1])]
    taken: list = []

    def rebalance():
        loop.commit(0, 12)  # what the reactor finished just before
        taken.append(client.on_revoke([(T, 0), (T, 1)]))  # asks the reactor, waits
        client.on_assign([(T, 1)])
        return records(0, [12]) + records(1, [20]), {1: 21}

    client.polls.put(rebalance)
    reactor.wait(lambda: len(sink.batches) == 2)
    assert sink.revoked == [[0, 1]] and taken == [{(T, 0): 12}]  # for the driver to commit
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
    client.polls.put(lambda: (client.on_assign([(T, 0)]), ([], {}))[1])
    reactor.wait(lambda: sink.closed)
    assert client.calls[-1] == ("close",)


def test_a_member_without_an_assignment_for_too_long_joins_again():
    client = ScriptedClient()
    loop, sink, reactor = start(client, exclusive=False, stuck=0.3)
    reactor.wait(lambda: client.calls.count(("subscribe", [T])) == 2)
    first = client.calls.index(("subscribe", [T]))
    assert ("close",) in client.calls[first:]  # left, then joined as a new member
    client.polls.put(lambda: (client.on_assign([(T, 0), (T, 1)]), ([], {0: 0, 1: 0}))[1])
    reactor.wait(lambda: sink.batches)
    assert sink.assigned == [[0, 1]]
    time.sleep(0.5)
    assert client.calls.count(("subscribe", [T])) == 2  # assigned: no more rejoining
    stop(loop, sink, reactor)


def joined_on_t_and_u(client):
    """Two joining subscriptions, of topics T and ``u``, on one client,
    joined.  :returns: the reactor, the SharedLoop and each ``(loop, sink)``."""
    reactor = QueueReactor()
    loop = shared(client, reactor, exclusive=False)
    members = [member(reactor, exclusive=False) for _topic in (T, "u")]
    for (one, _sink), topic in zip(members, (T, "u")):
        loop.add(one, topic)
    reactor.wait(lambda: client.on_assign is not None)
    return reactor, loop, *members


def test_joining_subscriptions_made_together_are_one_member_over_their_topics():
    """A bundle's subscriptions: one subscribe for both topics (gathered),
    each topic's partitions and records to its own subscription, pause and
    stop of one leave the other reading."""
    client = ScriptedClient(committed={0: 0, 1: 0, ("u", 0): 5})
    reactor, loop, (first, first_sink), (second, second_sink) = joined_on_t_and_u(client)
    assert [c for c in client.calls if c[0] == "subscribe"] == [("subscribe", [T, "u"])]
    client.polls.put(lambda: (client.on_assign([(T, 0), (T, 1), ("u", 0)]),
                              ({}, {0: 0, 1: 0, ("u", 0): 5}))[1])
    reactor.wait(lambda: first_sink.batches and second_sink.batches)
    assert first_sink.assigned == [[0, 1]] and second_sink.assigned == [[0]]
    assert ("seek", {("u", 0): 5}) in client.calls
    second.want_paused = True
    reactor.wait(lambda: ("pause", [("u", 0)]) in client.calls)
    assert not any(c[0] == "pause" and 0 in c[1] for c in client.calls)  # T reads on
    client.polls.put(({T: records(0, [0, 1]), "u": []}, {}))
    reactor.wait(lambda: len(first_sink.batches) == 2)
    assert first_sink.batches[1] == ([(0, 0), (0, 1)], [])
    second.commit(0, 6)
    stop(second, second_sink, reactor)  # its commit, then the topic leaves the subscription
    assert ({("u", 0): 6}, True) in commits(client)
    reactor.wait(lambda: ("subscribe", [T]) in client.calls)
    assert ("close",) not in client.calls
    client.polls.put(lambda: (client.on_revoke([(T, 0), (T, 1), ("u", 0)]),
                              client.on_assign([(T, 0), (T, 1)]),
                              ({T: records(1, [0])}, {}))[2])
    reactor.wait(lambda: len(first_sink.batches) == 3)
    assert first_sink.batches[2] == ([(1, 0)], [])
    assert second_sink.revoked == []  # stopped: not asked any more
    stop(first, first_sink, reactor)  # the last one: the client leaves the group
    assert client.calls[-1] == ("close",)


def test_a_joining_subscription_of_a_topic_the_client_holds_takes_its_partitions():
    """A topic stopped and subscribed again before the group rebalanced:
    the new subscription positions what the client still holds."""
    client = ScriptedClient(committed={0: 3, ("u", 0): 0})
    reactor, loop, (first, first_sink), _other = joined_on_t_and_u(client)
    client.polls.put(lambda: (client.on_assign([(T, 0), ("u", 0)]), ({}, {}))[1])
    reactor.wait(lambda: first_sink.assigned)
    again, again_sink = member(reactor, exclusive=False)
    first.stop()
    loop.add(again, T)
    reactor.wait(lambda: again_sink.assigned)
    assert first_sink.closed and again_sink.assigned == [[0]]
    assert client.calls.count(("seek", {0: 3})) == 2


def test_a_nodes_bundle_is_one_client_and_one_kafka_group_over_its_topics():
    import dataclasses

    from tests.unit.test_kafka_bus import CONFIG, FakeDriver, fired, started

    driver = FakeDriver()
    clients: list = []

    def make(config, group):
        clients.append((group, ScriptedClient()))
        return clients[-1][1]

    driver.SharedClient = make
    bus, reactor = started(driver, dataclasses.replace(CONFIG, heartbeat_interval_ms=100))
    c = bus.catalogue
    consumers = [bus.subscribe(c.msg_all, "tbmq-msg-all", lambda r: None, bundle="cluster"),
                 bus.subscribe(c.msg_persisted, "tbmq-msg-persisted", lambda r: None,
                               bundle="cluster")]
    reactor.wait(lambda: clients and clients[0][1].on_assign is not None)
    time.sleep(0.2)
    assert [group for group, _client in clients] == ["p.cluster"]  # CONFIG's prefix
    assert [call for call in clients[0][1].calls if call[0] == "subscribe"] == [
        ("subscribe", sorted([c.msg_all, c.msg_persisted]))]
    with pytest.raises(ValueError):  # one group per topic in a bundle
        bus.subscribe(c.msg_all, "another", lambda r: None, bundle="cluster")
    assert CONFIG.topic_prefix == "p."
    client = clients[0][1]
    client.polls.put(lambda: (client.on_assign([(c.msg_all, 0), (c.msg_persisted, 0)]),
                              ({}, {}))[1])
    reactor.wait(lambda: all(consumer._has_assignment for consumer in consumers))
    d = bus.stop()
    reactor.wait(lambda: d.called)
    assert fired(d) == [None] and all(consumer.stopped for consumer in consumers)
    assert clients[0][1].calls[-1] == ("close",)


def test_a_client_that_cannot_change_its_topics_in_place_joins_again_without_one():
    """kafka-python's rejoin with changed topics gets no assignment from
    Tansu: a stopped topic closes the client, and a new one joins with the
    topics left (from the committed offsets)."""
    client = ScriptedClient(committed={0: 4, ("u", 0): 0})
    client.resubscribes = False
    reactor, loop, (first, first_sink), (second, second_sink) = joined_on_t_and_u(client)
    client.polls.put(lambda: (client.on_assign([(T, 0), ("u", 0)]), ({}, {}))[1])
    reactor.wait(lambda: first_sink.assigned and second_sink.assigned)
    second.stop()
    reactor.wait(lambda: ("subscribe", [T]) in client.calls and second_sink.closed)
    calls = client.calls[client.calls.index(("close",)):]
    assert ("subscribe", [T]) in calls and not first_sink.closed
    client.polls.put(lambda: (client.on_assign([(T, 0)]), ({T: records(0, [4])}, {}))[1])
    reactor.wait(lambda: len(first_sink.assigned) == 2 and first_sink.batches)
    assert first_sink.batches[-1][0] == [(0, 4)]
    stop(first, first_sink, reactor)


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


def test_what_was_committed_without_waiting_is_committed_again_before_partitions_go():
    """An asynchronous commit under way when the group rebalances may fail
    unseen: the start of a new group at the end of a partition never read
    would be lost, and the next owner would skip what came meanwhile."""
    client = ScriptedClient(reported_end=2)  # no committed offsets: a new group
    loop, sink, reactor = start(client, exclusive=False)
    reactor.wait(lambda: client.on_assign is not None)
    client.polls.put(lambda: (client.on_assign([(T, 0), (T, 1)]), ([], {0: 5, 1: 2}))[1])
    reactor.wait(lambda: ("commit", {0: 5, 1: 2}, False) in client.calls)
    taken: list = []
    client.polls.put(lambda: (taken.append(client.on_revoke([(T, 0)])), ([], {}))[1])
    reactor.wait(lambda: taken)
    assert taken == [{(T, 0): 5}]  # for the driver to commit, waiting
    stop(loop, sink, reactor)
    assert ("commit", {1: 2}, True) in client.calls  # the one left, at the stop


def test_a_fetch_that_skips_offsets_is_read_again_from_the_first_one_missing():
    """Tansu can make a later batch of a partition readable before an
    earlier one (two producers at once): records past the hole are not
    handed, the partition is read again from the hole, and the records
    come in order with none skipped (an acknowledged message was lost)."""
    client = ScriptedClient(committed={0: 0, 1: 0})
    loop, sink, reactor = start(client, contiguous=True)
    reactor.wait(lambda: sink.assigned)
    client.polls.put((records(0, [0, 1]), {0: 2, 1: 0}))
    reactor.wait(lambda: sink.batches)
    client.seek_fails = 1  # the first seek back fails: tried again at the next poll
    client.polls.put((records(0, [4, 5]) + records(1, [0]), {}))  # 2 and 3 not readable yet
    client.polls.put((records(0, [6]), {}))  # the client is still past the hole
    client.polls.put((records(0, [2, 3, 4, 5, 6]), {}))  # read again from 2
    reactor.wait(lambda: len(sink.batches) == 3)
    handed = [o for batch, _ in sink.batches for p, o in batch if p == 0]
    assert handed == [0, 1, 2, 3, 4, 5, 6]
    assert (1, 0) in sink.batches[1][0]  # the other partition goes on
    assert [c for c in client.calls if c[0] == "seek"] == [("seek", {0: 2})] * 2
    assert loop.gaps.refetches == 1
    stop(loop, sink, reactor)


def test_without_contiguous_offsets_a_hole_is_passed_at_once():
    """A compacted topic has holes by design: they are not read again."""
    client = ScriptedClient(committed={0: 0, 1: 0})
    loop, sink, reactor = start(client)
    reactor.wait(lambda: sink.assigned)
    client.polls.put((records(0, [0, 3]), {0: 4, 1: 0}))
    reactor.wait(lambda: sink.batches)
    assert sink.batches[0][0] == [(0, 0), (0, 3)]
    assert not [c for c in client.calls if c[0] == "seek"]
    stop(loop, sink, reactor)


def test_a_compacted_topic_reads_a_hole_after_a_young_record_again_and_passes_an_old_one():
    """With min.compaction.lag.ms, a hole right after a record written 1 s
    ago is Tansu's (nothing that young is compacted): read again; one
    after a record of 10 minutes ago may be compaction: passed at once."""
    client = ScriptedClient(committed={0: 0, 1: 0})
    loop, sink, reactor = start(client, compaction_lag_ms=60000)
    reactor.wait(lambda: sink.assigned)
    now = int(time.time() * 1000)

    def at(p, offsets, stamp):
        return [RawRecord(p, o, None, b"v", (), stamp) for o in offsets]

    client.polls.put((at(0, [0, 1], now - 1000) + at(1, [0], now - 600000), {0: 2, 1: 1}))
    reactor.wait(lambda: sink.batches)
    client.polls.put((at(0, [4], now) + at(1, [5, 6], now), {}))  # 0: 2, 3 not yet; 1: compacted
    client.polls.put((at(0, [2, 3, 4], now), {}))  # 0 read again from 2
    reactor.wait(lambda: len(sink.batches) == 3)
    handed = [(p, o) for batch, _ in sink.batches for p, o in batch]
    assert [o for p, o in handed if p == 0] == [0, 1, 2, 3, 4]
    assert [o for p, o in handed if p == 1] == [0, 5, 6]
    assert [c for c in client.calls if c[0] == "seek"] == [("seek", {0: 2})]
    assert loop.gaps.refetches == 1
    stop(loop, sink, reactor)


class _CountingLock:
    """A lock that counts how often it was taken."""

    def __init__(self) -> None:
        self.taken = 0

    def __enter__(self):
        self.taken += 1
        return self

    def __exit__(self, *exc) -> None:
        return None


class _View:
    """A topic view whose next poll gives ``self.next`` (records, ends)."""

    topic = T

    def __init__(self) -> None:
        self.next = ([], {})
        self.committed: list = []

    def poll(self):
        step, self.next = self.next, ([], {})
        return step

    def commit(self, offsets, wait):
        self.committed.append((dict(offsets), wait))

    def high_watermarks(self, partitions):
        return {p: 0 for p in partitions}


class _Reactor:
    def __init__(self) -> None:
        self.calls: list = []

    def callFromThread(self, f, *args):
        self.calls.append((f.__name__, args))


def test_a_member_whose_poll_read_nothing_does_nothing_until_something_comes():
    """Most members of a shared client read nothing in a turn (a node's
    client reads about ten topics): such a turn takes no lock and runs no
    order check, yet a commit asked meanwhile goes at the next turn, an end
    that comes alone still reaches its partition, and records still go."""
    reactor = _Reactor()
    loop = ConsumerLoop(reactor, Sink(), exclusive=True, from_beginning=True, durable=True,
                        timeout=2.0, name="idle", contiguous=True)
    view = _View()
    loop._client = view
    loop._backlog_at = time.monotonic() + 3600
    for p in (0, 1):
        loop._next[p], loop._ends[p] = 0, None
    loop._want.update((0, 1))
    checked = []
    real_filter = loop.gaps.filter
    loop.gaps.filter = lambda records, nexts: checked.append(len(records)) or real_filter(
        records, nexts)
    lock = loop._lock = _CountingLock()
    for _ in range(3):
        loop.between_polls(view)
        loop.poll_once(view)
    assert (lock.taken, checked, reactor.calls, view.committed) == (0, [], [], [])
    view.next = ([], {0: 0})  # partition 0 is empty: reached with no record
    loop.poll_once(view)
    assert reactor.calls == [("_batch", ([], [0], {0: 0}))]
    view.next = ([RawRecord(1, 0, None, b"v", ())], {1: 1})
    loop.poll_once(view)
    assert reactor.calls[-1][1][1:] == ([1], {1: 1}) and len(reactor.calls[-1][1][0]) == 1
    loop.commit(1, 1)
    taken = lock.taken
    loop.between_polls(view)
    assert view.committed == [({1: 1}, False)] and lock.taken > taken


def test_a_quiet_turn_takes_nothing_but_still_drops_revoked_partitions_and_reads_the_backlog():
    """A member the shared poll read nothing for is not asked for its
    records (its view is left alone), takes no lock and tells the reactor
    nothing; a partition revoked meanwhile is still forgotten, and the
    backlog is read once due."""
    reactor = _Reactor()
    loop = ConsumerLoop(reactor, Sink(), exclusive=True, from_beginning=True, durable=True,
                        timeout=2.0, name="quiet")
    view = _View()
    view.next = ([RawRecord(0, 5, None, b"v", ())], {})  # not asked for: stays
    loop._client = view
    for p in (0, 1):
        loop._next[p], loop._ends[p] = 3, 3
        loop._reached.add(p)
    now = time.monotonic()
    loop._backlog_at = now + 3600
    lock = loop._lock = _CountingLock()
    loop.quiet_turn(view, now)
    assert (lock.taken, reactor.calls, loop.backlog) == (0, [], 0)
    assert view.next[0]  # its view was not polled
    loop._backlog_at = now - 1  # due: the high watermarks (0 here) give the backlog
    loop._next[0] = 0
    view.high_watermarks = lambda partitions: {p: 4 for p in partitions}
    loop.quiet_turn(view, now)
    assert loop.backlog == 4 + 1 and loop._backlog_at > now
    loop._revoked.add(1)  # revoked during the poll: forgotten even so
    view.next = ([], {})
    loop.quiet_turn(view, now)
    assert 1 not in loop._next and 0 in loop._next and reactor.calls == []
