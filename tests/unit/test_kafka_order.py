"""Holes in a partition's offsets (tbmq_plugins.kafka.order): found, read
again, and passed once they stayed for the wait."""

from __future__ import annotations

from tbmq_plugins.kafka.drivers import RawRecord
from tbmq_plugins.kafka.order import Gaps


def recs(p, offsets):
    return [RawRecord(p, o, None, b"v", ()) for o in offsets]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_records_in_order_pass_and_a_hole_cuts_its_partition_only():
    gaps = Gaps("t", wait=5.0, clock=Clock())
    kept, again = gaps.filter(recs(0, [3, 4]) + recs(1, [7, 9, 10]), {0: 3, 1: 7})
    assert [(r.partition, r.offset) for r in kept] == [(0, 3), (0, 4), (1, 7)]
    assert again == {1: 8}
    assert gaps.refetches == 1


def test_a_partition_without_an_expected_offset_starts_at_its_first_record():
    gaps = Gaps("t", clock=Clock())
    kept, again = gaps.filter(recs(2, [5, 6]), {})
    assert [r.offset for r in kept] == [5, 6] and again == {}
    kept, again = gaps.filter(recs(3, [5, 9]), {})  # a hole within one fetch
    assert [r.offset for r in kept] == [5] and again == {3: 6}


def test_a_hole_that_stays_for_the_wait_is_passed_and_one_filled_is_forgotten():
    clock = Clock()
    gaps = Gaps("t", wait=5.0, clock=clock)
    assert gaps.filter(recs(0, [12]), {0: 10})[1] == {0: 10}
    clock.now += 4.9
    assert gaps.filter(recs(0, [12]), {0: 10})[1] == {0: 10}  # still read again
    clock.now += 0.2
    kept, again = gaps.filter(recs(0, [12, 13]), {0: 10})  # 5.1 s: passed
    assert [r.offset for r in kept] == [12, 13] and again == {}
    # a new hole starts its own wait; filling it forgets it
    assert gaps.filter(recs(0, [20]), {0: 14})[1] == {0: 14}
    clock.now += 10.0
    assert gaps.filter(recs(0, [14, 15]), {0: 14}) == (recs(0, [14, 15]), {})
    assert gaps.filter(recs(0, [17]), {0: 16})[1] == {0: 16}  # a fresh wait, not passed


def test_forgotten_partitions_start_a_fresh_wait():
    clock = Clock()
    gaps = Gaps("t", wait=1.0, clock=clock)
    gaps.filter(recs(0, [5]), {0: 3})
    clock.now += 2.0
    gaps.forget([0])
    assert gaps.filter(recs(0, [5]), {0: 3})[1] == {0: 3}
