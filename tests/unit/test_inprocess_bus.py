"""What the in-process bus promises beyond the common contract (which
tests/contract/test_bus.py checks): the hot path, memory, retention,
slices, back-pressure, the topic log."""

from __future__ import annotations

from twisted.internet import defer
from twisted.internet.task import Clock

from tbmq.backends import inprocess_bus
from tbmq.backends.inprocess_bus import SLICE, InProcessBus
from tbmq.cluster import records as r
from tbmq.cluster.topics import TopicCatalogue
from tbmq.errors import BusClosedError, BusPublishError, ConsumerFailedError
from tbmq.cluster.completion import Progress
from tbmq.model import ClientType, Message
from tests.helpers import MemoryTopicLog

C = TopicCatalogue()


def make(**options) -> tuple[InProcessBus, Clock]:
    clock = Clock()
    bus = InProcessBus(clock=clock, **options)
    assert bus.start().called
    return bus, clock


def outcome(d):
    """:returns: ``[result]`` of a fired Deferred (None: done during the call)."""
    if d is None:
        return [None]
    out = []
    d.addBoth(out.append)
    return out


def test_hot_path_hands_at_once_and_returns_none():
    bus, clock = make()
    got = []
    bus.subscribe("tbmq.msg.all", "g", got.append)
    message = Message("a/b", b"x")
    assert bus.publish("tbmq.msg.all", "a/b", message) is None  # before any reactor turn
    assert len(got) == 1 and got[0].value is message  # the object itself
    assert (got[0].topic, got[0].key, got[0].partition, got[0].offset) == (
        "tbmq.msg.all", "a/b", 0, 0)
    assert bus.publish("tbmq.msg.all", "a/b", message) is None
    assert got[1].offset == 1
    assert bus.held("tbmq.msg.all") == 0  # nothing kept


def test_a_handler_deferred_makes_publish_wait_for_it():
    bus, clock = make()
    results = []
    bus.subscribe("tbmq.msg.all", "g", lambda rec: results.append(defer.Deferred()) or results[-1])
    d = bus.publish("tbmq.msg.all", "a", Message("a", b""))
    assert isinstance(d, defer.Deferred) and not d.called
    assert bus.held("tbmq.msg.all") == 1  # kept until committed
    # the next record waits behind the uncommitted one but is handed (in order)
    d2 = bus.publish("tbmq.msg.all", "a", Message("a", b"2"))
    assert len(results) == 2 and not d2.called
    results[1].callback(None)
    assert d2.called and not d.called and bus.held("tbmq.msg.all") == 2
    results[0].callback(None)
    assert d.called and bus.held("tbmq.msg.all") == 0


def test_records_are_released_once_every_known_group_passed_them():
    bus, clock = make()
    topic = "tbmq.msg.all"
    a, b = [], []
    bus.subscribe(topic, "a", a.append)
    consumer_b = bus.subscribe(topic, "b", b.append)
    clock.advance(0)
    consumer_b.stop()  # "b" is known: its records wait for it
    for i in range(10):
        bus.publish(topic, "k", Message("k", b"%d" % i))
    assert len(a) == 10 and bus.held(topic) == 10
    again = []
    bus.subscribe(topic, "b", again.append)
    clock.advance(0)
    assert [rec.value.payload for rec in again] == [b"%d" % i for i in range(10)]
    assert bus.held(topic) == 0


def test_retention_bounds_what_nobody_reads():
    bus, clock = make(retention_records=100)
    topic = "tbmq.msg.persisted"
    for i in range(250):
        assert bus.publish(topic, "c", r.Delivery("c", Message("t", b""), 0, seq=i)) is None
    assert bus.held(topic) == 100 and bus.dropped == 150
    got = []
    bus.subscribe(topic, "late", got.append, from_beginning=True)
    clock.advance(0)
    assert [rec.value.seq for rec in got] == list(range(150, 250))
    assert [rec.offset for rec in got] == list(range(150, 250))


def test_a_paused_member_keeps_its_records_beyond_retention():
    bus, clock = make(retention_records=10)
    topic = "tbmq.msg.all"
    got = []
    consumer = bus.subscribe(topic, "g", got.append)
    consumer.pause()
    for i in range(3 * SLICE):
        bus.publish(topic, "k", Message("k", b"%d" % i))
    assert got == [] and bus.held(topic) == 3 * SLICE and bus.dropped == 0
    consumer.resume()
    assert got == []  # from the next reactor turn, in slices
    call = clock.getDelayedCalls()[0]
    clock.calls.remove(call)
    call.func(*call.args)
    assert len(got) == SLICE
    clock.advance(0)
    assert [rec.value.payload for rec in got] == [b"%d" % i for i in range(3 * SLICE)]
    assert bus.held(topic) == 0


def test_max_uncommitted_holds_the_member_back():
    bus, clock = make(max_uncommitted=3)
    topic = "tbmq.msg.all"
    results = []

    def handler(rec):
        results.append(defer.Deferred())
        return results[-1]

    bus.subscribe(topic, "g", handler)
    pending = [bus.publish(topic, "k", Message("k", b"%d" % i)) for i in range(5)]
    assert len(results) == 3
    results[0].callback(None)
    assert len(results) == 3  # from the next reactor turn
    clock.advance(0)
    assert len(results) == 4
    for d in results[1:]:
        d.callback(None)
    clock.advance(0)
    results[-1].callback(None)
    assert len(results) == 5 and all(d.called for d in pending)


def test_a_record_published_by_its_own_handler_waits_for_it_to_return():
    bus, clock = make()
    topic = "tbmq.msg.all"
    order = []

    def handler(rec):
        order.append(("in", rec.value.payload))
        if rec.value.payload == b"1":
            d = bus.publish(topic, "k", Message("k", b"2"))
            order.append(("published", d is None))
        order.append(("out", rec.value.payload))

    bus.subscribe(topic, "g", handler)
    assert bus.publish(topic, "k", Message("k", b"1")) is None
    assert order == [("in", b"1"), ("published", False), ("out", b"1"), ("in", b"2"),
                     ("out", b"2")]


def test_the_encoding_mode_decodes_for_each_group():
    bus, clock = make(encode=True)
    a, b = [], []
    bus.subscribe("tbmq.msg.all", "a", a.append)
    bus.subscribe("tbmq.msg.all", "b", b.append)
    message = Message("t", b"x")
    assert bus.encodes
    assert bus.publish("tbmq.msg.all", "t", message) is None
    assert a[0].value == message == b[0].value
    assert a[0].value is not message and a[0].value is not b[0].value


def test_durable_publish_waits_for_the_topic_log():
    log = MemoryTopicLog()
    log.hold = True
    bus, clock = make(log=log)
    topic = C.client_session
    got = []
    bus.subscribe(topic, "registry", got.append)
    info = r.SessionInfo("c", "n", "s", True, True, ClientType.DEVICE, 10, 5, 1.0, None, 1.0)
    d = bus.publish(topic, "c", info)
    # the live group gets the object itself: encoded once, for the log only
    assert len(got) == 1 and got[0].value is info
    assert not d.called and log.calls == []  # handled; written in the next turn
    clock.advance(0)
    assert log.calls == ["append", "commit"]  # compacted: never truncated
    assert not d.called  # not yet on disk
    log.release()
    assert outcome(d) == [None]
    assert log.offsets == {("registry", topic, 0): 1}


def test_a_failing_topic_log_fails_the_publish():
    class BrokenLog(MemoryTopicLog):
        def append(self, records):
            return defer.fail(OSError("disk full"))

    bus, clock = make(log=BrokenLog())
    d = bus.publish(C.app("a"), "a", r.Delivery("a", Message("t", b""), 0))
    other = bus.publish(C.app("b"), "b", r.Delivery("b", Message("t", b""), 0))
    clock.advance(0)  # the turn's appends fail together
    assert outcome(d)[0].check(BusPublishError) and outcome(other)[0].check(BusPublishError)


def test_a_record_the_log_cannot_take_fails_alone_not_its_turn():
    log = MemoryTopicLog()
    bus, clock = make(log=log)
    good = bus.publish(C.app("a"), "a", r.Delivery("a", Message("t", b""), 1))
    bad = bus.publish(C.app("a"), "a", r.Delivery("a", Message("t", b""), 1),
                      headers=(("h", "not bytes"),))
    assert outcome(bad)[0].check(BusPublishError)  # at once
    clock.advance(0)
    assert outcome(good) == [None] and log.held_count(C.app("a")) == 1


def test_the_appends_of_a_turn_are_one_append_of_the_log():
    """Group commit: what one reactor turn publishes to durable topics goes
    to the log in one call, and no publish of it is done before that call
    fired (an acknowledged record is on disk)."""
    log = MemoryTopicLog()
    log.hold = True
    bus, clock = make(log=log, partitions=2)
    published = [bus.publish(C.app(c), c, r.Delivery(c, Message("t", b"%d" % i), 1, seq=i))
                 for i in range(5) for c in ("a", "b")]
    assert log.calls == [] and not any(d.called for d in published)
    clock.advance(0)
    assert log.calls == ["append"] and len(log.held) == 1
    assert sum(log.held_count(C.app(c)) for c in ("a", "b")) == 10
    assert not any(d.called for d in published)
    log.release()
    assert all(outcome(d) == [None] for d in published)
    later = bus.publish(C.app("a"), "a", r.Delivery("a", Message("t", b""), 1))
    clock.advance(0)
    assert log.calls == ["append", "append"] and not later.called


def test_application_topics_are_truncated_in_the_log_once_handled():
    log = MemoryTopicLog()
    bus, clock = make(log=log)
    topic = C.app("app")
    bus.subscribe(topic, "app", lambda rec: None)
    published = [bus.publish(topic, "app", r.Delivery("app", Message("t", b""), 0, seq=i))
                 for i in range(3)]
    clock.advance(0)
    assert all(outcome(d) == [None] for d in published)
    assert log.held_count(topic) == 0 and log.offsets[("app", topic, 0)] == 3
    assert "truncate" in log.calls


def test_stop_fails_what_is_pending_and_writes_the_commits():
    log = MemoryTopicLog()
    bus, clock = make(log=log)
    topic = C.app("app")
    results = []
    bus.subscribe(topic, "app", lambda rec: results.append(defer.Deferred()) or results[-1])
    done = bus.publish(topic, "app", r.Delivery("app", Message("t", b""), 0, seq=0))
    pending = bus.publish(topic, "app", r.Delivery("app", Message("t", b""), 0, seq=1))
    clock.advance(0)
    results[0].callback(None)
    # a durable topic's publish fires once the log has it, not when its
    # consumer is done (that only commits)
    assert outcome(done) == [None] and outcome(pending) == [None]
    assert outcome(bus.stop()) == [None]
    assert log.offsets[("app", topic, 0)] == 1  # written by stop, no reactor turn needed
    unlogged = bus.publish(topic, "app", r.Delivery("app", Message("t", b""), 0, seq=2))
    assert outcome(unlogged)[0].check(BusClosedError)


def test_restart_replays_from_the_committed_offset():
    log = MemoryTopicLog()
    bus, clock = make(log=log, partitions=3)
    topic = C.app_shared("a/+")
    got = []
    bus.subscribe(topic, "share", lambda rec: got.append(rec) or defer.Deferred())
    pending = [bus.publish(topic, f"k{i}", r.Delivery("share", Message("t", b""), 0, seq=i))
               for i in range(9)]
    assert len(got) == 9
    bus.stop()
    assert all(outcome(d) == [None] for d in pending)  # logged: held durably
    bus2, clock2 = make(log=log, partitions=3)
    assert bus2.held(topic) == 9
    again = []
    consumer = bus2.subscribe(topic, "share", again.append)
    assert not consumer.caught_up.called
    clock2.advance(0)
    assert consumer.caught_up.called
    assert sorted(rec.value.seq for rec in again) == list(range(9))
    assert {(rec.partition, rec.offset) for rec in again} == {
        (rec.partition, rec.offset) for rec in got}


def test_publish_failures_are_typed():
    bus, clock = make()
    bus.subscribe("tbmq.msg.all", "g", lambda rec: 1 / 0)
    assert outcome(bus.publish("tbmq.msg.all", "k", Message("k", b"")))[0].check(
        ConsumerFailedError)


def test_delete_topic():
    log = MemoryTopicLog()
    bus, clock = make(log=log)
    topic = C.app("gone")
    consumer = bus.subscribe(topic, "gone", lambda rec: defer.Deferred())
    bus.publish(topic, "gone", r.Delivery("gone", Message("t", b""), 0))
    assert outcome(bus.delete_topic(topic))[0].check(ValueError)
    consumer.stop()
    assert outcome(bus.delete_topic(topic)) == [None]
    assert topic not in bus.topics() and log.held_count(topic) == 0
    assert "delete_topic" in log.calls


def test_deleting_a_topic_fails_its_publishes_not_yet_written_and_writes_nothing_of_it():
    log = MemoryTopicLog()
    bus, clock = make(log=log)
    gone, kept = C.app("gone"), C.app("kept")
    lost = bus.publish(gone, "gone", r.Delivery("gone", Message("t", b""), 1))
    calls = []
    assert bus.publish(kept, "kept", r.Delivery("kept", Message("t", b""), 1),
                       done=calls.append) is None
    assert outcome(bus.delete_topic(gone)) == [None]
    assert outcome(lost)[0].check(BusClosedError)
    clock.advance(0)
    assert calls == [None] and log.held_count(kept) == 1 and log.held_count(gone) == 0


def test_a_value_compacted_away_before_a_paused_group_got_it_does_not_hold_its_publish():
    bus, clock = make()
    topic = C.msg_retained
    got = []
    consumer = bus.subscribe(topic, "g", got.append)
    consumer.pause()
    first = bus.publish(topic, "a/b", Message("a/b", b"1", retain=True))
    second = bus.publish(topic, "a/b", Message("a/b", b"2", retain=True))
    assert not first.called and not second.called
    assert bus.held(topic) == 1  # the last value per key only
    consumer.resume()
    clock.advance(0)
    assert [rec.value.payload for rec in got] == [b"2"]
    assert outcome(first) == [None] and outcome(second) == [None]


def test_a_failed_record_stops_the_partition_and_the_member_hands_it_again():
    bus, clock = make()
    got = []
    fail = {"left": 2}

    def handler(record):
        got.append(record.value)
        if record.value == b"1" and fail["left"]:
            fail["left"] -= 1
            raise ValueError("store timed out")

    bus.subscribe("tbmq.msg.all", "g", handler)
    clock.advance(0)
    outcomes = [outcome(bus.publish("tbmq.msg.all", None, b"%d" % i)) for i in range(4)]
    assert got == [b"0", b"1"]  # the hot path; then the partition waits at 1
    assert isinstance(outcomes[1][0].value, ConsumerFailedError)
    assert outcomes[2:] == [[], []]  # not handed yet: not done
    clock.advance(0.99)
    assert got == [b"0", b"1"]
    clock.advance(0.01)
    assert got == [b"0", b"1", b"1"]  # failed again: 2 s now
    clock.advance(1.99)
    assert got == [b"0", b"1", b"1"]
    clock.advance(0.01)
    assert got == [b"0", b"1", b"1", b"1", b"2", b"3"]  # in order, at least once
    assert outcomes[2:] == [[None], [None]]
    assert bus.held("tbmq.msg.all") == 0  # all committed
    assert clock.getDelayedCalls() == []
    got.clear()
    assert bus.publish("tbmq.msg.all", None, b"4") is None  # the hot path again
    assert got == [b"4"]


def test_a_stopped_member_does_not_hand_its_failed_record_again():
    bus, clock = make()
    got = []
    member = bus.subscribe("tbmq.msg.all", "g", lambda record: got.append(record.value)
                           or defer.fail(RuntimeError("no")))
    clock.advance(0)
    bus.publish("tbmq.msg.all", None, b"x")
    member.stop()
    assert clock.getDelayedCalls() == []
    clock.advance(60)
    assert got == [b"x"]


def test_a_batch_to_a_durable_topic_is_told_once_when_the_log_fails_or_the_topic_goes():
    """The records of one ``publish_many`` to a durable topic are one run
    of the log's next flush with one ``done``: a failed append tells it
    once (BusPublishError), and deleting the topic before the flush tells
    it once (BusClosedError) while another topic's batch is still written."""

    class BrokenLog(MemoryTopicLog):
        def append(self, records):
            return defer.fail(OSError("disk full"))

    values = [r.Delivery("a", Message("a/b", str(i).encode()), 1) for i in range(3)]
    bus, clock = make(log=BrokenLog())
    failed = []
    bus.publish_many(C.app("a"), ["a"] * 3, values, failed.append)
    clock.advance(0)
    assert len(failed) == 1 and failed[0].check(BusPublishError)

    log = MemoryTopicLog()
    bus, clock = make(log=log)
    gone, kept = [], []
    bus.publish_many(C.app("gone"), ["gone"] * 3, values, gone.append)
    bus.publish_many(C.app("kept"), ["kept"] * 2, values[:2], kept.append)
    assert outcome(bus.delete_topic(C.app("gone"))) == [None]
    assert len(gone) == 1 and gone[0].check(BusClosedError)
    clock.advance(0)
    assert kept == [None] and len(gone) == 1
    assert log.held_count(C.app("kept")) == 2 and log.held_count(C.app("gone")) == 0
    assert log.calls.count("append") == 1


def test_records_behind_a_pending_result_go_to_the_batch_handler_together():
    """A member that takes batches (the router of ``tbmq.msg.all``): the
    first record goes to its handler during the publish; those published
    while its result is pending wait, each with its ``done``, and reach
    the batch handler together in the next turn; each ``done`` is called
    once its batch's result fired, not before."""
    bus, clock = make()
    results: list = []
    singles, batches = [], []

    def handler(record):
        singles.append(record.value)
        results.append(defer.Deferred())
        return results[-1]

    def batch_handler(values):
        batches.append(list(values))
        results.append(defer.Deferred())
        return results[-1]

    bus.subscribe("t", "g", handler, batch_handler=batch_handler)
    clock.advance(0)
    dones: list = []
    for i in range(3):
        assert bus.publish("t", None, i, done=lambda outcome, i=i: dones.append((i, outcome))) \
            is None
    assert singles == [0] and batches == [] and dones == []
    clock.advance(0)
    assert batches == [[1, 2]] and dones == []
    results[1].callback(None)  # the batch's result
    assert dones == [(1, None), (2, None)]
    results[0].callback(None)
    assert dones[-1] == (0, None) and bus.held("t") == 0


def test_a_partition_releases_the_records_below_an_offset():
    """``Partition.release``: the records below the offset go (all of them
    when it is past the last one, the usual commit), the others stay."""
    from tbmq.backends.inprocess_log import Partition  # noqa: PLC0415

    part = Partition(0)
    for i in range(5):
        part.append(None, i, ())
    assert part.release(2) == 2 and list(part.entries) == [2, 3, 4] and part.first == 2
    assert part.release(5) == 3 and part.entries == {} and part.first == 5
    part.append(None, 5, ())
    part.append(None, 6, ())
    assert part.release(7) == 2 and part.entries == {} and part.first_held() == 7
    assert part.append(None, 7, ()) == 7 and list(part.entries) == [7]


def test_a_batchs_progress_commits_record_by_record_and_a_restart_resumes_exactly():
    """A persistent APPLICATION client's batch (``Outbox.deliver_app_batch``
    returns a Progress): the committed offset follows the leading run of
    acknowledged records, so a restart hands exactly the others again."""
    log = MemoryTopicLog()
    bus, clock = make(log=log)
    topic = C.app("app")
    results, batches = [], []

    def handler(record):
        results.append(defer.Deferred())
        return results[-1]

    def batch(values):
        batches.append(([d.seq for d in values], Progress(len(values))))
        return batches[-1][1]

    bus.subscribe(topic, "tbmq-app-app", handler, exclusive=True, batch_handler=batch)
    clock.advance(0)
    for i in range(5):
        bus.publish(topic, "app", r.Delivery("app", Message("t", b""), 1, seq=i))
    clock.advance(0)
    clock.advance(0)
    assert results == [] and [seqs for seqs, _ in batches] == [[0, 1, 2, 3, 4]]
    progress = batches[0][1]
    progress.finished(0)
    progress.finished(1)
    progress.finished(3)  # after a gap: not committed
    bus.stop()
    bus2, clock2 = make(log=log)
    again = []
    bus2.subscribe(topic, "tbmq-app-app", again.append, exclusive=True)
    clock2.advance(0)
    assert [rec.value.seq for rec in again] == [2, 3, 4]


def _app_batch_of_six():
    """An APPLICATION client's consumer (a batch handler answering with a
    Progress per batch) that read six records in one batch.

    :returns: ``(log, bus, clock, topic, consumer, batches)``."""
    log = MemoryTopicLog()
    bus, clock = make(log=log)
    topic = C.app("app")
    batches = []

    def batch(values):
        batches.append(Progress(len(values)))
        return batches[-1]

    consumer = bus.subscribe(topic, "tbmq-app-app", lambda record: defer.Deferred(),
                             exclusive=True, batch_handler=batch)
    clock.advance(0)
    for i in range(6):
        bus.publish(topic, "app", r.Delivery("app", Message("t", b""), 1, seq=i))
    clock.advance(0)
    clock.advance(0)
    return log, bus, clock, topic, consumer, batches


def test_a_progress_that_grows_many_times_in_a_turn_commits_once_at_its_end():
    """Acknowledgements come one by one (``Outbox.deliver_app_batch``'s
    Progress grows per PUBACK): what grew during a turn is committed, and
    written to the topic log, once, at the end of the turn."""
    log, bus, clock, topic, consumer, batches = _app_batch_of_six()
    assert len(batches) == 1 and consumer.lag() == 6
    writes = []
    real_commit = log.commit
    log.commit = lambda *a: writes.append(a[3]) or real_commit(*a)
    for i in range(4):
        batches[0].finished(i)
    assert consumer.lag() == 6  # settled at the end of the turn
    clock.advance(0)
    assert consumer.lag() == 2
    clock.advance(0)  # the turn's commits are written
    assert writes == [4]


def test_a_batch_is_the_run_of_held_records_up_to_the_first_hole():
    from tbmq.backends.inprocess_log import Partition
    part = Partition(0)
    for value in "abcd":
        part.append(None, value, ())  # held as the objects (no codec)
    del part.entries[2]  # a hole: compacted away or dropped
    assert part.run(0, 10, None) == ([0, 1], ["a", "b"])
    assert part.run(0, 1, None) == ([0], ["a"])
    assert part.run(3, 10, None) == ([3], ["d"])
    durable = Partition(0)
    first, second = Message("t/1", b"1"), Message("t/2", b"2")
    durable.append(None, r.MESSAGE.encode(first), (), first)  # a live record: decoded kept
    durable.append(None, r.MESSAGE.encode(second), ())  # read back from the log
    durable.append(None, b"\xc1", ())  # does not decode
    assert durable.run(0, 10, r.MESSAGE) == ([0, 1], [first, second])
    assert durable.run(2, 10, r.MESSAGE) == ([], [])  # handed alone, to fail


def test_a_cursor_moves_past_a_settled_run_at_once_and_stops_where_records_wait():
    from tbmq.backends.inprocess_log import Cursor
    cursor = Cursor(0)
    cursor.position = 10
    cursor.inflight = {5, 6}
    assert cursor.advance(range(0, 5)) and cursor.committed == 5
    cursor.inflight = set()
    cursor.failed[8] = "failed"
    assert cursor.advance(range(5, 7)) and cursor.committed == 8  # then one by one
    other = Cursor(0)
    other.position = 4
    other.inflight = {0}
    assert not other.advance(range(1, 3)) and other.committed == 0  # 0 still waits


def test_a_progress_that_grows_again_after_a_settle_is_settled_again():
    """The bus watches a batch's Progress once per settle: what grows in a
    later turn is committed at the end of that turn, and a member that
    leaves first settles what grew (the next starts exactly after it)."""
    log, bus, clock, topic, consumer, batches = _app_batch_of_six()
    progress = batches[0]
    progress.finished(0)
    progress.finished(1)
    clock.advance(0)
    assert consumer.lag() == 4
    progress.finished(3)  # after a gap: nothing to settle
    clock.advance(0)
    assert consumer.lag() == 4
    progress.finished(2)
    clock.advance(0)
    assert consumer.lag() == 2
    progress.finished(4)
    consumer.stop()  # settled before it leaves
    bus.stop()
    bus2, clock2 = make(log=log)
    again = []
    bus2.subscribe(topic, "tbmq-app-app", again.append, exclusive=True)
    clock2.advance(0)
    assert [rec.value.seq for rec in again] == [5]


def test_a_member_decides_a_key_once_every_record_of_its_partition_was_handled():
    """``Consumer.decides`` on the in-process bus: True for a key of a
    partition whose records were all handed and their results fired (a
    record published now is handed next); False while one of them waits
    for its result, during the member's handler, for a partition of
    another member, and once the bus stopped."""
    bus, clock = make(partitions=2)
    topic = C.session_event_request
    results: list = []
    inside: list = []

    def handler(rec):
        inside.append(member.decides("d"))  # in its handler: not now
        d = defer.Deferred()
        results.append(d)
        return d

    member = bus.subscribe(topic, "g", handler)
    clock.advance(0)
    assert [member.decides(k) for k in ("a", "d")] == [True, True]  # partitions 1 and 0
    bus.publish(topic, "a", Message("a", b"1"))
    assert inside == [False] and len(results) == 1
    assert [member.decides(k) for k in ("a", "d")] == [False, True]  # "a"'s result waits
    results[0].callback(None)
    assert [member.decides(k) for k in ("a", "d")] == [True, True]
    other = bus.subscribe(topic, "g", handler)  # the group's partitions split
    clock.advance(0)
    mine = [[m.decides(k) for k in ("a", "d")] for m in (member, other)]
    assert sorted(mine) == [[False, True], [True, False]]
    assert bus.stop().called
    assert [member.decides(k) for k in ("a", "d")] == [False, False]


def test_what_a_slice_of_handing_logs_is_written_in_that_turn_and_done_after_it():
    """The router's slice of ``tbmq.msg.all`` (a batch handler) delivers a
    batch to an APPLICATION client's durable topic: its records go to the
    topic log when the slice ends, in the same reactor turn (not from the
    next turn, after its reads), and their publish is done only once the
    log has them."""

    class TurnClock(Clock):
        def turn(self) -> None:
            """One reactor turn: the calls due when it starts (those they
            make wait for the next turn, as in ``reactor.runUntilCurrent``)."""
            for call in [c for c in self.calls if c.getTime() <= self.seconds()]:
                self.calls.remove(call)
                call.called = 1
                call.func(*call.args, **call.kw)

    log = MemoryTopicLog()
    log.hold = True
    clock = TurnClock()
    bus = InProcessBus(clock=clock, log=log)
    assert bus.start().called
    app = C.app("a")
    logged: list = []

    def batch_handler(values):
        d = defer.Deferred()
        bus.publish_many(app, ["a"] * len(values),
                         [r.Delivery("a", Message("t", v), 1, seq=i) for i, v in enumerate(values)],
                         lambda outcome: (logged.append(outcome), d.callback(None)))
        return d

    first = defer.Deferred()
    bus.subscribe("t", "router", lambda record: first, batch_handler=batch_handler)
    clock.advance(0)
    log.calls.clear()
    dones: list = []
    bus.publish("t", None, b"0", done=dones.append)  # handed at once; its result pending
    for i in (1, 2):
        bus.publish("t", None, b"%d" % i, done=dones.append)
    assert log.calls == []
    clock.turn()  # the slice: the batch's records are written in it
    assert log.calls and set(log.calls) == {"append"} and log.held_count(app) == 2
    assert clock.getDelayedCalls() == []  # no flush left for the next turn
    assert logged == [] and dones == []  # not on disk yet: no PUBACK
    log.release()
    assert logged == [None] and dones == [None, None]
    first.callback(None)
    assert dones == [None, None, None]


def test_a_slice_of_handing_makes_no_timed_call_for_what_it_logs_and_flushes_when_it_raises():
    """The records a batch handler logs during its slice are flushed at the
    slice's end, with no timed call made (and cancelled) for them; a slice
    whose handler raises still writes what it logged."""

    class CountingClock(Clock):
        def __init__(self):
            super().__init__()
            self.made: list = []

        def callLater(self, delay, f, *args, **kw):  # noqa: N802 (Twisted's name)
            self.made.append(getattr(f, "__name__", f))
            return super().callLater(delay, f, *args, **kw)

    log = MemoryTopicLog()
    log.hold = True
    clock = CountingClock()
    bus = InProcessBus(clock=clock, log=log)
    assert bus.start().called
    app = C.app("a")
    fail = [False]

    def batch_handler(values):
        bus.publish_many(app, ["a"] * len(values),
                         [r.Delivery("a", Message("t", v), 1, seq=i) for i, v in enumerate(values)],
                         lambda outcome: None)
        if fail[0]:
            raise RuntimeError("the handler fails after logging")
        return defer.Deferred()

    bus.subscribe("t", "router", lambda record: defer.Deferred(), batch_handler=batch_handler)
    clock.advance(0)
    bus.publish("t", None, b"0", done=lambda outcome: None)  # handed at once; result pending
    for i in (1, 2):
        bus.publish("t", None, b"%d" % i, done=lambda outcome: None)
    clock.made.clear()
    log.calls.clear()
    clock.advance(0)  # the slice
    assert log.held_count(app) == 2 and "flush" not in clock.made
    log.release()
    fail[0] = True
    for i in (3, 4):
        bus.publish("t", None, b"%d" % i, done=lambda outcome: None)
    clock.made.clear()
    clock.advance(0)  # the slice: its handler raises after logging
    log.release()
    assert log.held_count(app) == 4 and "flush" not in clock.made


def test_commits_made_while_records_are_being_logged_wait_for_them_or_the_next_records():
    """While a write with records is under way (its publishers wait for
    it), a group's commit makes no write of its own: it goes with the next
    records, or, when none comes, once that write landed."""
    log = MemoryTopicLog()
    log.hold = True
    bus, clock = make(log=log)
    topic = C.app("a")
    results: list = []
    bus.subscribe(topic, "a", lambda record: results.append(defer.Deferred()) or results[-1])
    first = bus.publish(topic, "a", r.Delivery("a", Message("t", b"0"), 1, seq=0))
    clock.advance(0)
    assert "append" in log.calls and not first.called  # under way
    log.calls.clear()
    results[0].callback(None)  # handled: the commit waits, no write of its own
    assert clock.getDelayedCalls() == [] and log.offsets[("a", topic, 0)] == 0
    second = bus.publish(topic, "a", r.Delivery("a", Message("t", b"1"), 1, seq=1))
    clock.advance(0)  # the next records take the commit with them
    assert log.calls[:2] == ["append", "commit"] and log.offsets[("a", topic, 0)] == 1
    log.calls.clear()
    results[1].callback(None)
    assert clock.getDelayedCalls() == [] and log.calls == []
    log.release()  # both landed: what waited is written from the next turn
    assert outcome(first) == [None] and outcome(second) == [None]
    clock.advance(0)
    assert "commit" in log.calls and log.offsets[("a", topic, 0)] == 2
