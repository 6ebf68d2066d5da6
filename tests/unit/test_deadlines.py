"""tbmq.broker.deadlines: one timer for the deadlines of all connections."""

from __future__ import annotations

from twisted.internet import task

from tbmq.broker.deadlines import TICK, Deadlines, deadlines_for


class Owner:
    deadline = None
    deadline_slot = None

    def __init__(self, log: list, name: str) -> None:
        self.log = log
        self.name = name

    def deadline_passed(self) -> None:
        self.log.append(self.name)


def make():
    clock = task.Clock()
    return clock, Deadlines(clock), []


def test_a_deadline_is_acted_on_at_its_time_not_before():
    clock, wheel, passed = make()
    a = Owner(passed, "a")
    wheel.set(a, 10.0)
    clock.advance(9.99)
    assert passed == []
    clock.advance(0.01)
    assert passed == ["a"]
    assert wheel.count == 0 and a.deadline is None


def test_many_owners_cost_one_delayed_call():
    clock, wheel, passed = make()
    owners = [Owner(passed, str(i)) for i in range(1000)]
    for i, o in enumerate(owners):
        wheel.set(o, 30.0 + i * 0.05)
    assert len(clock.getDelayedCalls()) == 1
    assert wheel.count == 1000
    clock.advance(30.0 + 999 * 0.05)
    assert len(passed) == 999  # the last one is in the bucket of the next tick: at most TICK late
    clock.advance(TICK)
    assert sorted(passed, key=int) == [o.name for o in owners]
    assert clock.getDelayedCalls() == []


def test_a_touched_deadline_moves_later_without_a_new_call():
    clock, wheel, passed = make()
    a = Owner(passed, "a")
    wheel.set(a, 15.0)
    clock.advance(14.0)
    wheel.touch(a, 14.0 + 15.0)  # a packet at 14 s: keep alive to 29 s
    clock.advance(14.9)  # 28.9
    assert passed == []
    clock.advance(0.1 + 1e-9)  # 29
    assert passed == ["a"]


def test_touch_gives_no_deadline_to_an_owner_without_one():
    clock, wheel, passed = make()
    a = Owner(passed, "a")
    wheel.touch(a, 5.0)
    clock.advance(10)
    assert passed == [] and a.deadline is None and wheel.count == 0


def test_an_earlier_deadline_moves_the_owner_forward():
    clock, wheel, passed = make()
    a = Owner(passed, "a")
    wheel.set(a, 100.0)
    wheel.set(a, 5.0)
    clock.advance(5.0)
    assert passed == ["a"]
    clock.advance(200)
    assert passed == ["a"]  # once


def test_no_deadline_removes_the_owner_and_frees_it():
    clock, wheel, passed = make()
    a = Owner(passed, "a")
    wheel.set(a, 10.0)
    wheel.set(a, None)
    assert wheel.count == 0 and a.deadline_slot is None
    clock.advance(20)
    assert passed == []


def test_a_failing_owner_does_not_stop_the_others():
    clock, wheel, passed = make()

    class Bad(Owner):
        def deadline_passed(self):
            raise RuntimeError("boom")

    wheel.set(Bad(passed, "bad"), 1.0)
    wheel.set(Owner(passed, "good"), 1.0)
    clock.advance(1.0)
    assert passed == ["good"]


def test_wall_clock_seconds_do_not_loop_on_rounding():
    # a clock at 1.7e9 s: key × tick differs from the deadline by a rounding
    clock, wheel, passed = make()
    clock.advance(1_700_000_000.123)
    a = Owner(passed, "a")
    wheel.set(a, clock.seconds() + 1.37)
    clock.advance(1.37)
    clock.advance(0.1)
    assert passed == ["a"]
    assert clock.getDelayedCalls() == []


def test_one_wheel_per_clock():
    c1, c2 = task.Clock(), task.Clock()
    assert deadlines_for(c1) is deadlines_for(c1)
    assert deadlines_for(c1) is not deadlines_for(c2)
