"""The idle mode of a consumer thread (tbmq_plugins.kafka.pacing, driven by
SharedLoop) on a scripted client: an idle client stops fetching and
fetches once per interval, records (or a produce) bring the continuous
fetching back at once, partitions paused for back-pressure stay paused,
and what the reactor asks (commits, seeks, stop) is served while idle."""

from __future__ import annotations

import time

from tbmq_plugins.kafka.loop import SharedLoop
from tests.unit.test_kafka_bus import QueueReactor
from tests.unit.test_kafka_loop import T, ScriptedClient, commits, member, records

U = "u"


class TimedClient(ScriptedClient):
    """Records when each poll began and its timeout.

    :param background: what ``fetches_in_background`` says (True: as
        librdkafka, partitions paused to stop fetching; False: as
        kafka-python, not polled)."""

    def __init__(self, background: bool, **kwargs) -> None:
        super().__init__(committed={0: 0, 1: 0, (U, 0): 0, (U, 1): 0}, **kwargs)
        self.fetches_in_background = background
        self.timed: list = []
        self.latest: dict = {}  # what latest_offsets reports
        self.asked = 0  # latest_offsets calls
        self.stopped: set = set()  # paused partitions

    def latest_offsets(self, tps_):
        self.asked += 1
        return {tp: self.latest[tp] for tp in tps_ if tp in self.latest}

    @staticmethod
    def _list(tps_):  # the partitions of two topics: ints and tuples
        return sorted((p if t == T else (t, p) for t, p in tps_), key=str)

    def pause(self, tps_):
        self.stopped.update(tps_)
        super().pause(tps_)

    def resume(self, tps_):
        self.stopped.difference_update(tps_)
        super().resume(tps_)

    def poll(self, timeout, max_records, want_ends):
        self.timed.append((time.monotonic(), timeout))
        if (T, 0) in self.stopped:  # paused: nothing fetched (what the test queued waits)
            time.sleep(timeout)
            return {}, {}
        return super().poll(timeout, max_records, want_ends)

    def fetching_polls(self, since: float) -> int:
        """Polls since ``since`` that could fetch: any poll of a client that
        fetches inside its poll, else those that wait for records."""
        return sum(1 for at, timeout in self.timed
                   if at >= since and (not self.fetches_in_background or timeout > 0))


def idle_loop(client, interval=0.2, topics=(T,)):
    reactor = QueueReactor()
    shared = SharedLoop(reactor, lambda: client, max_records=100, timeout=2.0, name="test",
                        idle_interval=interval, fetch_wait=0.01)
    found = []
    for topic in topics:
        loop, sink = member(reactor)
        shared.add(loop, topic)
        found.append((loop, sink))
    for _loop, sink in found:
        reactor.wait(lambda sink=sink: sink.assigned)
    client.polls.put(({T: [], U: []}, {(T, 0): 0, (T, 1): 0, (U, 0): 0, (U, 1): 0}))
    for _loop, sink in found:  # every end known: nothing keeps the client fast
        reactor.wait(lambda sink=sink: sink.batches)
    return shared, reactor, found


def gone_idle(background: bool, interval: float, idle_after: float | None = None):
    """A paced loop over a :class:`TimedClient`, once it has gone idle."""
    client = TimedClient(background=background)
    shared, reactor, found = idle_loop(client, interval=interval)
    if idle_after is not None:
        shared.pacer.idle_after = idle_after
    wait_until(lambda: shared.pacer.idle)
    return client, shared, reactor, found


def wait_until(predicate, timeout=3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.005)


def close(found, reactor) -> None:
    for loop, _sink in found:
        loop.stop()
    for _loop, sink in found:
        reactor.wait(lambda sink=sink: sink.closed)


def test_an_idle_client_that_fetches_in_its_poll_is_polled_once_per_interval():
    client, shared, reactor, found = gone_idle(False, 0.2)
    since = time.monotonic()
    time.sleep(1.0)
    # fetching all the time: a poll every POLL_TIMEOUT (0.05 s) at least,
    # 20 in a second; idle: one fetch per 0.2 s
    assert 3 <= client.fetching_polls(since) <= 7
    assert 3 <= shared.pacer.idle_fetches <= 7
    assert not [c for c in client.calls if c[0] in ("pause", "resume")]  # polls stopped instead
    close(found, reactor)


def test_an_idle_client_that_fetches_in_the_background_is_paused_and_asks_for_offsets():
    client, shared, reactor, found = gone_idle(True, 0.2)
    assert client.calls.count(("pause", [0, 1])) == 1
    since, asked = time.monotonic(), client.asked
    time.sleep(1.0)
    assert client.fetching_polls(since) == 0  # its polls serve callbacks: no fetch
    assert 3 <= client.asked - asked <= 7  # the latest offsets, once per interval
    assert ("resume", [0, 1]) not in client.calls  # nothing came: paused all along
    close(found, reactor)


def test_records_bring_continuous_fetching_back_at_once():
    client, shared, reactor, found = gone_idle(True, 1.0, idle_after=0.3)
    (loop, sink), = found
    client.polls.put((records(0, [0, 1]), {}))
    time.sleep(0.3)
    assert len(sink.batches) == 1  # not fetched: the brokers report nothing new
    client.latest = {(T, 0): 1}  # Tansu: the last batch's base + 1, past position 0
    reactor.wait(lambda: len(sink.batches) == 2, timeout=3.0)
    assert ("resume", [0, 1]) in client.calls
    assert not shared.pacer.idle and client.calls[-1] != ("pause", [0, 1])
    sent = time.monotonic()
    client.polls.put((records(0, [2]), {}))  # no interval to wait for now
    reactor.wait(lambda: len(sink.batches) == 3)
    assert time.monotonic() - sent < 0.2
    assert sink.batches[1:] == [([(0, 0), (0, 1)], []), ([(0, 2)], [])]
    close(found, reactor)


def test_a_produce_wakes_an_idle_client():
    client, shared, reactor, found = gone_idle(False, 5.0)
    since = time.monotonic()
    time.sleep(0.2)
    assert client.fetching_polls(since) == 0
    shared.nudge()
    wait_until(lambda: client.fetching_polls(since) >= 1, timeout=0.5)
    close(found, reactor)


def test_partitions_paused_for_back_pressure_stay_paused_when_the_idle_mode_ends():
    client = TimedClient(background=True)
    shared, reactor, found = idle_loop(client, interval=5.0, topics=(T, U))
    (held, _), (other, _) = found
    held.want_paused = True  # the reactor holds too many records of T
    wait_until(lambda: ("pause", [0, 1]) in client.calls)
    wait_until(lambda: shared.pacer.idle)
    assert ("pause", [(U, 0), (U, 1), 0, 1]) in client.calls  # every partition
    mark = len(client.calls)
    shared.nudge()
    wait_until(lambda: not shared.pacer.idle, timeout=0.5)
    wait_until(lambda: ("resume", [(U, 0), (U, 1)]) in client.calls[mark:])
    assert ("resume", [0, 1]) not in client.calls[mark:]
    held.want_paused = False  # the reactor caught up: T is read again
    wait_until(lambda: ("resume", [0, 1]) in client.calls[mark:], timeout=0.5)
    close(found, reactor)


def test_commits_seeks_and_stop_are_served_while_idle():
    client, shared, reactor, found = gone_idle(False, 5.0)
    (loop, sink), = found
    loop.commit(0, 3)
    wait_until(lambda: ({0: 3}, False) in commits(client), timeout=0.5)
    assert shared.pacer.idle  # a commit reads nothing: still idle
    loop.seek(0, 1)  # read again: fetching now
    wait_until(lambda: ("seek", {0: 1}) in client.calls, timeout=0.5)
    wait_until(lambda: not shared.pacer.idle, timeout=0.5)
    client.polls.put(([], {0: 3}))  # until its end is known
    wait_until(lambda: shared.pacer.idle)
    started = time.monotonic()
    loop.stop()
    reactor.wait(lambda: sink.closed, timeout=0.5)
    assert time.monotonic() - started < 0.5
    assert client.calls[-1] == ("remove", [0, 1])


def test_without_an_interval_a_client_never_goes_idle():
    client = TimedClient(background=True)
    reactor = QueueReactor()
    shared = SharedLoop(reactor, lambda: client, max_records=100, timeout=2.0, name="test")
    loop, sink = member(reactor)
    shared.add(loop, T)
    reactor.wait(lambda: sink.assigned)
    since = time.monotonic()
    time.sleep(0.5)
    assert shared.pacer is None and client.fetching_polls(since) >= 8
    assert ("pause", [0, 1]) not in client.calls
    close([(loop, sink)], reactor)


class Nudged:
    """A consumer thread of the bus (:class:`SharedLoop`), as the bus sees it."""

    dead = False

    def __init__(self) -> None:
        self.nudges = 0

    def nudge(self) -> None:
        self.nudges += 1


def test_a_record_the_node_produces_wakes_its_idle_consumer_threads():
    from tbmq.cluster import records as r
    from tbmq.model import Message
    from tests.unit.test_kafka_bus import CONFIG, FakeDriver, started

    driver = FakeDriver()
    bus, reactor = started(driver)
    threads = bus._loops = [Nudged(), Nudged()]
    bus.publish(bus.catalogue.app("c1"), "c1", r.Delivery("c1", Message("a", b""), 1))
    reactor.wait(lambda: driver.sent)
    assert [t.nudges for t in threads] == [1, 1]
    # the bus's threads are paced by the configuration
    shared = bus._shared_loop("g", "g", joining=False)
    assert shared.pacer.interval == CONFIG.idle_fetch_interval_ms / 1000.0 == 0.1
    assert shared.pacer.probe > CONFIG.fetch_max_wait_ms / 1000.0
    assert shared in bus._loops


def test_the_records_of_one_reactor_turn_nudge_the_consumer_threads_once():
    """An APPLICATION client's topic is not packed: one record per
    delivery, and a nudge each would wake an idle thread each time."""
    from tbmq.cluster import records as r
    from tbmq.model import Message
    from tests.unit.test_kafka_bus import FakeDriver, started

    driver = FakeDriver()
    bus, reactor = started(driver)
    threads = bus._loops = [Nudged(), Nudged()]
    topic = bus.catalogue.app("c1")
    for i in range(3):
        bus.publish(topic, "c1", r.Delivery("c1", Message("a", b"%d" % i), 1))
    reactor.wait(lambda: len(driver.sent) == 3)
    assert [t.nudges for t in threads] == [1, 1]
    bus.publish(topic, "c1", r.Delivery("c1", Message("a", b"3"), 1))
    assert len(driver.sent) == 4 and [t.nudges for t in threads] == [1, 1]  # the same turn
    reactor.advance(0)  # the turn ends
    bus.publish(topic, "c1", r.Delivery("c1", Message("a", b"4"), 1))
    bus.publish(topic, "c1", r.Delivery("c1", Message("a", b"5"), 1))
    assert len(driver.sent) == 6 and [t.nudges for t in threads] == [2, 2]


def test_a_node_that_produces_all_the_time_keeps_its_clients_fetching():
    """A produce keeps a fast client fast: no pause and resume of every
    partition (librdkafka holds the GIL for them) each time it would go
    idle between two produces; once the produces stop, it goes idle."""
    client = TimedClient(background=True)
    shared, reactor, found = idle_loop(client, interval=5.0)
    shared.pacer.idle_after = 0.1
    client.polls.put((records(0, [0]), {}))  # fast again, as a record does
    wait_until(lambda: not shared.pacer.idle)
    paused = client.calls.count(("pause", [0, 1]))
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:  # 6 idle_after, a produce every 20 ms
        shared.nudge()
        assert not shared.pacer.idle
        time.sleep(0.02)
    assert client.calls.count(("pause", [0, 1])) == paused
    wait_until(lambda: shared.pacer.idle, timeout=1.0)
    assert client.calls.count(("pause", [0, 1])) == paused + 1
    close(found, reactor)


class Polled:
    """A client as :class:`~tbmq_plugins.kafka.pacing.Pacer` sees it: one
    that fetches inside its poll (nothing to pause)."""

    fetches_in_background = False


def test_the_quiet_time_is_what_the_polls_waited_not_the_clock():
    """A thread that did not run for a while (a loaded machine) has not
    seen its client quiet: only the polls' waits count, each up to its
    timeout."""
    import threading

    from tbmq_plugins.kafka.pacing import Pacer

    pacer = Pacer(0.1, 0.005, threading.Event(), idle_after=0.05)
    pacer.read()
    time.sleep(0.08)  # the thread stood still: longer than idle_after
    assert pacer.before_poll(Polled(), {}, False) is not None and not pacer.idle
    pacer.waited(0.2, 0.03)  # a poll of 0.03 s that took 0.2 s counts 0.03
    assert pacer.before_poll(Polled(), {}, False) is not None and not pacer.idle
    pacer.waited(0.03, 0.03)
    assert pacer.before_poll(Polled(), {}, False) is None and pacer.idle


def test_a_steady_flow_keeps_its_client_fast_through_a_gap():
    """Records for a while: a gap of several idle_after does not send the
    client idle (the flow's next record would wait up to the interval);
    lone records keep it fast for idle_after only; once a flow ends it
    goes idle after FLOW_SHARE of the flow's length, FLOW_KEEP at most."""
    import threading

    from tbmq_plugins.kafka import pacing
    from tbmq_plugins.kafka.pacing import Pacer

    lone = Pacer(0.1, 0.005, threading.Event(), idle_after=0.05)
    lone.read()  # a lone record
    lone.waited(0.05, 0.05)
    assert lone.before_poll(Polled(), {}, False) is None and lone.idle

    flow = Pacer(0.1, 0.005, threading.Event(), idle_after=0.05)
    started = time.monotonic()
    while time.monotonic() - started < 0.8:  # a record every 10 ms for 0.8 s
        flow.read()
        time.sleep(0.01)
    flow.read()
    keep = pacing.FLOW_SHARE * (time.monotonic() - started)  # 0.2 s and a little
    for _ in range(3):  # a gap of 0.15 s, three idle_after
        flow.waited(0.05, 0.05)
        assert flow.before_poll(Polled(), {}, False) is not None and not flow.idle
    flow.waited(keep - 0.15 - 0.01, 1.0)
    assert flow.before_poll(Polled(), {}, False) is not None and not flow.idle
    flow.waited(0.02, 1.0)  # FLOW_SHARE of the flow's 0.8 s has passed
    assert flow.before_poll(Polled(), {}, False) is None and flow.idle

    long = Pacer(0.1, 0.005, threading.Event(), idle_after=0.05)
    long.read()
    long._busy_since -= 60  # records for a minute: FLOW_KEEP at most
    long.read()
    long.waited(pacing.FLOW_KEEP - 0.01, pacing.FLOW_KEEP)
    assert long.before_poll(Polled(), {}, False) is not None
    long.waited(0.01, 0.01)
    assert long.before_poll(Polled(), {}, False) is None and long.idle
    long.read()  # a record after the idle mode: a new flow
    long.waited(0.05, 0.05)
    assert long.before_poll(Polled(), {}, False) is None and long.idle


def test_the_record_a_look_found_ends_the_wait_for_it():
    """An idle client that saw offsets past its positions fetches until
    records come (NEWS_WAIT); once one came it goes idle idle_after later
    (a node's heartbeat on an idle cluster), not NEWS_WAIT later."""
    client, shared, reactor, found = gone_idle(True, 0.2)
    (loop, sink), = found
    pauses = client.calls.count(("pause", [0, 1]))
    client.latest = {(T, 0): 1}
    client.polls.put((records(0, [0]), {}))
    reactor.wait(lambda: len(sink.batches) == 2, timeout=3.0)
    came = time.monotonic()
    wait_until(lambda: client.calls.count(("pause", [0, 1])) == pauses + 1, timeout=3.0)
    assert time.monotonic() - came < 0.5  # idle_after (0.05 s) and a poll, not NEWS_WAIT (1 s)
    close(found, reactor)
