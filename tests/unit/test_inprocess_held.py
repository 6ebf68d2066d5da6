"""A transient record on a durable topic of the in-process bus (a clean
session's ``tbmq.client.session``, one per CONNECT of the embedded node) is
held and handed to the topic's one consumer during its publish, with a few
calls of the bus and the generic results: kept for a later reader, read
again after a failure, in order with a record published by the handler."""

from __future__ import annotations

import os
import sys

from twisted.internet import task

import tbmq.backends
from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.cluster.topics import CLIENT_SESSION, TRANSIENT


def started_bus() -> tuple[InProcessBus, task.Clock]:
    clock = task.Clock()
    bus = InProcessBus(clock=clock)
    bus.start()
    return bus, clock


def follow(bus, clock, group: str, handler):
    consumer = bus.subscribe(CLIENT_SESSION, group, handler, from_beginning=True, exclusive=True)
    clock.advance(0)
    return consumer


def test_a_transient_record_is_handed_during_its_publish_and_kept_for_a_later_reader():
    bus, clock = started_bus()
    seen = []
    follow(bus, clock, "node-a", lambda r: seen.append((r.key, r.value)))
    assert bus.publish(CLIENT_SESSION, "c1", "first", TRANSIENT) is None
    assert bus.publish(CLIENT_SESSION, "c1", "second", TRANSIENT) is None
    assert bus.publish(CLIENT_SESSION, "c2", "other", TRANSIENT) is None
    assert seen == [("c1", "first"), ("c1", "second"), ("c2", "other")]
    later = []
    bus.subscribe(CLIENT_SESSION, "node-b", lambda r: later.append((r.key, r.value)),
                  from_beginning=True)
    clock.advance(0)
    assert later == [("c1", "second"), ("c2", "other")]  # compacted: the last per key


def test_a_failed_handler_reads_the_record_again_and_its_publisher_is_not_told():
    bus, clock = started_bus()
    calls = []

    def handler(record):
        calls.append(record.value)
        if len(calls) == 1:
            raise ValueError("not now")

    follow(bus, clock, "node-a", handler)
    outcomes = []
    bus.publish(CLIENT_SESSION, "c1", "v", TRANSIENT, outcomes.append)
    assert outcomes == [None]  # durable topic: the publisher does not wait for consumers
    assert calls == ["v"]
    clock.advance(60)
    assert calls == ["v", "v"]
    bus.publish(CLIENT_SESSION, "c2", "w", TRANSIENT)
    assert calls == ["v", "v", "w"]


def test_a_record_published_by_the_handler_is_handed_after_it_returns():
    bus, clock = started_bus()
    seen = []

    def handler(record):
        seen.append(("in", record.value))
        if record.value == "outer":
            bus.publish(CLIENT_SESSION, "c2", "inner", TRANSIENT)
        seen.append(("out", record.value))

    follow(bus, clock, "node-a", handler)
    bus.publish(CLIENT_SESSION, "c1", "outer", TRANSIENT)
    clock.advance(0)
    assert seen == [("in", "outer"), ("out", "outer"), ("in", "inner"), ("out", "inner")]


def test_the_publish_of_a_transient_record_takes_few_calls_of_the_bus():
    bus, clock = started_bus()
    follow(bus, clock, "node-a", lambda r: None)
    bus.publish(CLIENT_SESSION, "warm", "v", TRANSIENT)
    root = os.path.dirname(tbmq.backends.__file__)
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        bus.publish(CLIENT_SESSION, "c1", "v", TRANSIENT)
    finally:
        sys.setprofile(None)
    # the generic hand-off takes 19 (_publish, _pump, _next twice, _hand, _handled...)
    assert len(calls) <= 11, calls
