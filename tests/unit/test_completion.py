"""The light completion of several publishes (:mod:`tbmq.cluster.completion`)."""

from __future__ import annotations

import pytest
from twisted.python.failure import Failure

from tbmq.cluster.completion import Completion, Progress, finished_runs
from tbmq.errors import BusClosedError, BusPublishError


def watched(completion: Completion, *args) -> list:
    """:returns: the list of ``(failure, *args)`` its callback was called with."""
    calls: list = []
    completion.then(lambda failure, *rest: calls.append((failure, *rest)), *args)
    return calls


def test_it_fires_once_every_part_is_done_with_success():
    c = Completion()
    parts = [c.part() for _ in range(3)]
    calls = watched(c, "track", 7)
    assert calls == [] and not c.complete
    parts[2](None)
    parts[0]()  # done() without an argument is a success too
    assert calls == [] and not c.complete and not c.succeeded
    parts[1](None)
    assert calls == [(None, "track", 7)]  # the callback's own arguments follow
    assert c.complete and c.succeeded and c.failure is None


def test_the_first_failure_fires_it_at_once_and_wins():
    c = Completion()
    parts = [c.part() for _ in range(3)]
    calls = watched(c)
    first = Failure(BusPublishError("not acknowledged"))
    parts[1](first)
    assert calls == [(first,)]  # not waiting for the parts still open
    assert c.complete and not c.succeeded and c.failure is first
    parts[0](Failure(BusClosedError("stopped")))
    parts[2](None)
    assert calls == [(first,)] and c.failure is first


def test_parts_done_before_the_callback_is_registered():
    c = Completion()
    done = c.part()
    done(None)  # during the publish that took it: the in-process hot path
    assert c.complete and c.succeeded
    calls = watched(c, "x")
    assert calls == [(None, "x")]  # at once: it was complete when handed over

    failed = Completion()
    one, two = failed.part(), failed.part()
    error = Failure(BusClosedError("the bus is not running"))
    one(error)
    assert failed.complete and not failed.succeeded
    assert watched(failed) == [(error,)]
    two(None)


def test_a_completion_without_parts_is_complete():
    c = Completion()
    assert c.complete and c.succeeded
    assert watched(c) == [(None,)]


def test_the_callback_is_called_exactly_once_and_only_one_may_be_registered():
    c = Completion()
    parts = [c.part(), c.part(), c.part()]
    calls = watched(c)
    parts[0](None)
    parts[1](Failure(BusPublishError("first")))
    parts[2](Failure(BusPublishError("second")))  # after a failure nothing more
    assert len(calls) == 1 and calls[0][0].check(BusPublishError)
    assert str(calls[0][0].value) == "first"
    with pytest.raises(RuntimeError):
        c.then(lambda failure: None)
    ok = Completion()
    done = ok.part()
    calls = watched(ok)
    done(None)
    assert calls == [(None,)]
    with pytest.raises(RuntimeError):
        ok.then(lambda failure: None)
    assert calls == [(None,)]


def test_it_has_slots():
    c = Completion()
    with pytest.raises(AttributeError):
        c.anything = 1


def test_parts_takes_several_parts_with_one_done():
    c = Completion()
    done = c.parts(3)
    other = c.part()
    calls = watched(c)
    done(None)
    done(None)
    other(None)
    assert calls == [] and not c.complete  # one of the three is still open
    done(None)
    assert calls == [(None,)] and c.succeeded


def test_parts_of_none_leaves_it_complete():
    c = Completion()
    c.parts(0)
    assert watched(c) == [(None,)]


def test_a_watcher_is_told_once_until_it_takes_the_leading_run():
    """A consumer that settles once per turn (the in-process bus's
    ProgressRuns) is told at the first growth after each take, not at each
    acknowledgement."""
    told = []
    progress = Progress(4)
    progress.watch(lambda p, tag: told.append((tag, p.leading)), "w")
    progress.finished(1)
    assert told == []  # after a gap: the leading run did not grow
    progress.finished(0)
    assert told == [("w", 2)]
    progress.finished(2)
    assert told == [("w", 2)]  # not told again before it took the run
    assert progress.take() == 3
    progress.finished(3)
    assert told == [("w", 2), ("w", 4)] and progress.complete
    with pytest.raises(RuntimeError):
        progress.then(lambda *a: None)
    with pytest.raises(RuntimeError):
        progress.watch(lambda *a: None)


def test_a_watcher_of_a_batch_grown_already_is_told_at_once():
    progress = Progress(3)
    progress.finished(0)
    told = []
    progress.watch(lambda p: told.append(p.take()))
    assert told == [1]
    progress.finished(1)
    assert told == [1, 2]


def test_a_record_of_several_parts_finishes_at_its_last_part():
    """A DeliveryRun of an APPLICATION client's topic is one record of
    several messages: it finishes once each was acknowledged."""
    grown = []
    progress = Progress(3)
    progress.parts(1, 3)
    progress.parts(2, 1)  # one part: as any record
    progress.then(lambda start, end: grown.append((start, end)))
    progress.finished(1)
    progress.finished(0)
    assert grown == [(0, 1)]  # record 1 has two parts still due
    progress.finished(2)
    progress.finished(1)
    assert grown == [(0, 1)] and progress.leading == 1
    progress.finished(1)
    assert grown == [(0, 1), (1, 3)] and progress.complete


def test_a_record_of_several_parts_takes_a_count_of_them_at_once():
    grown = []
    progress = Progress(2)
    progress.parts(0, 4)
    progress.then(lambda start, end: grown.append((start, end)))
    progress.finished(0, 3)
    assert grown == [] and progress.leading == 0  # one part still due
    progress.finished(1)
    progress.finished(0, 1)
    assert grown == [(0, 2)] and progress.complete


def test_finished_runs_tells_each_record_once_per_run_of_its_messages():
    """The acknowledged messages of an APPLICATION client's batches: one
    ``finished`` per run of one record's messages, in order."""
    told = []

    class Recording(Progress):
        __slots__ = ()

        def finished(self, index, count=1):
            told.append((self, index, count))
            super().finished(index, count)

    a, b = Recording(2), Recording(1)
    a.parts(0, 3)
    first, second, other = (a, 0), (a, 1), (b, 0)
    assert finished_runs([first, first, second, other, first]) is True
    assert told == [(a, 0, 2), (a, 1, 1), (b, 0, 1), (a, 0, 1)]
    assert a.complete and b.complete


def test_finished_runs_tells_nothing_when_one_is_not_a_record():
    progress = Progress(1)
    assert finished_runs([(progress, 0), object()]) is False
    assert progress.leading == 0
