"""A session's publishes answered through the bus's ``done`` (no Deferred
per message): the PUBACK / PUBREC waits for the answer, in order, a refusal
answered later is a 0x83, and the answer given during the call costs no
allocation."""

from __future__ import annotations

from twisted.internet import task
from twisted.python.failure import Failure

from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.errors import BusPublishError
from tbmq.mqtt import Puback, Publish, Pubrec, Subscribe, SubscriptionRequest
from tests.helpers import Harness


class LateBus(InProcessBus):
    """The in-process bus, except that while :attr:`late` the answer to a
    publish given a ``done`` reaches the publisher only at :meth:`release`
    (as Kafka's acknowledgements come back in a later reactor turn).

    :ivar held: ``[done, outcome]`` of each answer held, in publish order.
    """

    late = False

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.held: list = []

    def publish(self, topic, key, value, headers=(), done=None):
        if done is not None and self.late:
            answer = [done, None]
            self.held.append(answer)

            def hold(outcome):
                answer[1] = outcome

            return super().publish(topic, key, value, headers, hold)
        return super().publish(topic, key, value, headers, done)

    def release(self, index: int, failure: Failure | None = None) -> None:
        done, outcome = self.held[index]
        done(failure if failure is not None else outcome)


def harness():
    clock = task.Clock()
    clock.advance(1_700_000_000)
    bus = LateBus(clock=clock)
    return Harness(clock=clock, bus=bus), bus


def subscribed(h):
    sub = h.client("sub", level=5)
    sub.send(Subscribe(1, [SubscriptionRequest("t/#", 1)]))
    sub.received()
    return sub


def test_the_acknowledgements_wait_for_the_bus_answers_and_keep_their_order():
    h, bus = harness()
    sub = subscribed(h)
    pub = h.client("pub", level=5)
    bus.late = True
    pub.send(Publish("t/1", b"a", qos=1, packet_id=1), Publish("t/2", b"b", qos=2, packet_id=2))
    assert [m.payload for m in sub.received()] == [b"a", b"b"]  # routed at once
    assert pub.received() == [] and len(bus.held) == 2  # not acknowledged yet
    bus.release(1)
    assert pub.received() == []  # the PUBREC waits for the PUBACK before it
    bus.release(0)
    assert pub.received() == [Puback(1), Pubrec(2)]
    assert not pub.closed


def test_a_refusal_answered_later_is_a_0x83_once():
    h, bus = harness()
    pub = h.client("pub", level=5)
    bus.late = True
    pub.send(Publish("t/1", b"a", qos=1, packet_id=1),
             Publish("t/r", b"kept", qos=1, packet_id=2, retain=True))
    assert len(bus.held) == 3  # the retained one: tbmq.msg.retained and tbmq.msg.all
    refused = Failure(BusPublishError("Kafka did not acknowledge the record"))
    bus.release(0, refused)
    assert pub.received() == [Puback(1, 0x83)]
    bus.release(1, refused)  # the first failure of a retained message decides
    assert pub.received() == [Puback(2, 0x83)]
    bus.release(2)
    assert pub.received() == [] and not pub.closed
    assert h.broker.dropped.get("bus_refused") == 2


def test_a_qos0_publisher_is_not_read_until_the_bus_answers():
    h, bus = harness()
    pub = h.client("pub", level=5)
    bus.late = True
    pub.send(Publish("t/1", b"a"))
    assert pub.transport.producerState == "paused"
    bus.release(0)
    h.turn()
    assert pub.transport.producerState == "producing"


def test_an_answer_during_the_call_acknowledges_at_once_and_reuses_the_done():
    h, bus = harness()
    subscribed(h)
    pub = h.client("pub", level=5)
    session = h.broker.sessions.sessions["pub"]
    pub.send(Publish("t/1", b"a", qos=1, packet_id=1))
    assert pub.received() == [Puback(1)]
    done = session._spare
    assert done is not None
    pub.send(Publish("t/2", b"b", qos=1, packet_id=2), Publish("t/3", b"c", qos=0))
    assert pub.received() == [Puback(2)]
    assert session._spare is done  # no allocation per message on the hot path


def test_the_acknowledgements_one_commit_answers_go_out_in_one_write_when_the_turn_ends():
    """The embedded node answers every publish of a topic log commit in a
    row: the PUBACKs ready then are written together, in order, once the
    turn ends (the PUBREC after them), and each ends its inbound flow."""
    from tbmq.mqtt.codec import encode_puback, encode_pubrec
    h, bus = harness()
    subscribed(h)
    pub = h.client("pub", level=4)
    session = h.broker.sessions.sessions["pub"]
    bus.late = True
    pub.send(*(Publish("t/1", b"a", qos=1, packet_id=i) for i in (1, 2, 3)),
             Publish("t/2", b"b", qos=2, packet_id=4))
    assert pub.received() == [] and session.inbound_unacked == 3
    writes = []
    write = session.link.write
    session.link.write = lambda data: writes.append(data) or write(data)
    for i in (1, 0, 2, 3):
        bus.release(i)
    assert writes == []  # asked for once, when the turn ends
    h.turn()
    assert writes == [encode_puback(1) + encode_puback(2) + encode_puback(3), encode_pubrec(4)]
    assert pub.received() == [Puback(1), Puback(2), Puback(3), Pubrec(4)]
    assert session.inbound_unacked == 0 and not pub.closed
