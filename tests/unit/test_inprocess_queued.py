"""The publishes queued for a busy member that takes batches
(:class:`tbmq.backends.inprocess_log.QueuedRun`): one object for a turn's
run of them, each ``done`` told once, with its own outcome."""

from __future__ import annotations

from twisted.internet import defer
from twisted.internet.task import Clock

from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.backends.inprocess_log import QueuedRun, RangeWaiter
from tbmq.errors import BusClosedError, ConsumerFailedError


def _busy_bus(batch_result):
    """A bus whose one member (a batch handler) is busy with a first record
    (its handler's Deferred not fired), so that what follows is queued.

    :param batch_result: ``values -> result`` of the batch handler.
    :returns: ``(bus, clock, first, batches)``: ``first`` the first
        record's Deferred, ``batches`` the values of each batch handed."""
    clock = Clock()
    bus = InProcessBus(clock=clock)
    bus.start()
    first = defer.Deferred()
    batches = []

    def batch(values):
        batches.append(values)
        return batch_result(values)

    bus.subscribe("t", "g", lambda record: first, batch_handler=batch)
    clock.advance(0)
    bus.publish("t", "k", "first", (), lambda failure: None)
    return bus, clock, first, batches


def _queue(bus, n):
    outcomes = {}
    for i in range(n):
        bus.publish("t", "k", i, (), lambda failure, i=i: outcomes.setdefault(i, []).append(failure))
    return outcomes


def test_a_turns_queued_publishes_share_one_run_and_each_is_told_once():
    bus, clock, first, batches = _busy_bus(lambda values: None)
    outcomes = _queue(bus, 5)
    assert outcomes == {}
    first.callback(None)
    clock.advance(0)
    assert batches == [[0, 1, 2, 3, 4]]
    assert outcomes == {i: [None] for i in range(5)}


def test_a_failed_batch_tells_each_of_its_publishes_the_group_failed():
    bus, clock, first, batches = _busy_bus(lambda values: defer.fail(RuntimeError("no")))
    outcomes = _queue(bus, 3)
    first.callback(None)
    clock.advance(0)
    assert sorted(outcomes) == [0, 1, 2]
    for (failure,) in outcomes.values():
        assert failure.check(ConsumerFailedError)


def test_a_stopped_bus_tells_the_queued_publishes_once():
    bus, clock, first, batches = _busy_bus(lambda values: None)
    outcomes = _queue(bus, 3)
    bus.stop()
    assert sorted(outcomes) == [0, 1, 2]
    for (failure,) in outcomes.values():
        assert failure.check(BusClosedError)


def test_publishes_of_two_turns_are_each_told_when_their_batch_is_handled():
    handed = []
    bus, clock, first, batches = _busy_bus(lambda values: handed.append(defer.Deferred())
                                           or handed[-1])
    one = _queue(bus, 2)
    first.callback(None)
    clock.advance(0)  # the first two handed, their batch not done yet
    two = _queue(bus, 2)
    clock.advance(0)  # handed too: a second batch in flight
    assert batches == [[0, 1], [0, 1]] and one == {} and two == {}
    handed[0].callback(None)
    assert one == {0: [None], 1: [None]} and two == {}
    handed[1].callback(None)
    assert two == {0: [None], 1: [None]}


def test_a_run_settles_the_span_of_a_batch_that_is_its_own():
    told = []
    run = QueuedRun("t", "g", 10)
    for i in range(3):
        run.dones.append(lambda failure, i=i: told.append((i, failure)))
    run.end = 13
    waiters = {10: run, 11: run, 12: run, 13: "another"}
    assert run.complete_span("other", 10, 14, waiters) == 13  # another group: nothing
    assert told == [] and len(waiters) == 4
    assert run.complete_span("g", 11, 14, waiters) == 13
    assert told == [(1, None), (2, None)] and waiters == {10: run, 13: "another"}
    assert run.complete("g", False, 10) is True
    assert told[2][0] == 0 and told[2][1].check(ConsumerFailedError)
    run.close()  # nothing left to tell
    assert len(told) == 3 and run.done


def test_a_done_that_raises_is_logged_and_the_later_ones_are_still_told():
    told = []
    run = QueuedRun("t", "g", 0)

    def raises(failure):
        told.append("raised")
        raise RuntimeError("a broken done")

    run.dones.extend([lambda failure: told.append(0), raises, None,
                      lambda failure: told.append(3)])
    run.end = 4
    waiters = dict.fromkeys(range(4), run)
    assert run.complete_span("g", 0, 4, waiters) == 4
    assert told == [0, "raised", 3] and waiters == {}
    assert run.dones == [None] * 4 and run.done


def test_a_range_waiter_takes_a_batchs_span_at_once_and_its_entries_go_when_nobody_waits():
    """A ``publish_many``'s :class:`RangeWaiter` (records 10-13, two
    groups): a group's batch that handled some of them completes those at
    once; an entry leaves the partition's waiters only when no group waits
    for that record, and the publish is done when every group handled all."""
    told: list = []
    waiter = RangeWaiter("t", ["a", "b"], 10, 4)
    waiters = dict.fromkeys(range(10, 14), waiter)
    waiter.settle(told.append)
    assert waiter.complete_span("a", 10, 12, waiters) == 12  # a's batch ended at 12
    assert sorted(waiters) == [10, 11, 12, 13] and told == []  # b waits for all
    assert waiter.complete_span("b", 10, 20, waiters) == 14  # the rest is not its own
    assert sorted(waiters) == [12, 13] and told == []  # a waits for 12 and 13
    assert waiter.complete_span("a", 12, 14, waiters) == 14
    assert waiters == {} and told == [None]
