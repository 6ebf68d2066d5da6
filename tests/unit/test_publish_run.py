"""The PUBLISH packets of one read handed to the pipeline together
(:mod:`tbmq.broker.publish_run`): one ``publish_many`` and one answer for a
run, the acknowledgements sent once the whole run is durable, in the order
of the PUBLISHes [MQTT-4.6.0-2], a refusal answered for each."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import task
from twisted.python.failure import Failure

from tbmq.broker.protocol import MQTTProtocol
from tbmq.broker.publish_run import plain_columns, plain_run
from tbmq.errors import BusPublishError
from tbmq.mqtt import Property, Puback, Publish, Pubrec, encode
from tbmq.mqtt.codec import encode_puback, encode_pubrec
from tests.helpers import Harness
from tests.unit.test_session_publish import LateBus, subscribed


class LateManyBus(LateBus):
    """:class:`LateBus` whose ``publish_many`` answers late too; each call's
    keys are kept in :attr:`runs`."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.runs: list = []

    def publish_many(self, topic, keys, values, done):
        self.runs.append((topic, list(keys)))
        if self.late:
            answer = [done, None]
            self.held.append(answer)

            def hold(outcome):
                answer[1] = outcome

            return super().publish_many(topic, keys, values, hold)
        return super().publish_many(topic, keys, values, done)


def harness(**config):
    clock = task.Clock()
    clock.advance(1_700_000_000)
    bus = LateManyBus(clock=clock)
    return Harness(config or None, clock=clock, bus=bus), bus


def one_read(client, *packets) -> None:
    client.send_bytes(b"".join(encode(p, client.level) for p in packets))


def test_a_read_of_publishes_is_one_publish_and_its_acknowledgements_one_write():
    h, bus = harness()
    sub = subscribed(h)
    pub = h.client("pub", level=4)
    session = h.broker.sessions.sessions["pub"]
    bus.late = True
    runs = len(bus.runs)
    one_read(pub, *(Publish("t/1", b"%d" % i, qos=1, packet_id=i) for i in (1, 2, 3)),
             Publish("t/2", b"q2", qos=2, packet_id=4), Publish("t/3", b"q0"))
    msg_all = h.broker.topics.msg_all
    assert [keys for topic, keys in bus.runs[runs:] if topic == msg_all] == [
        ["t/1", "t/1", "t/1", "t/2", "t/3"]]
    assert len(bus.held) == 1  # one answer for the run
    assert pub.received() == [] and session.inbound_unacked == 3
    assert [m.payload for m in sub.received()] == [b"1", b"2", b"3", b"q2", b"q0"]
    writes = []
    write = session.link.write
    session.link.write = lambda data: writes.append(data) or write(data)
    bus.release(0)
    h.turn()
    assert writes == [encode_puback(1) + encode_puback(2) + encode_puback(3), encode_pubrec(4)]
    assert pub.received() == [Puback(1), Puback(2), Puback(3), Pubrec(4)]
    assert session.inbound_unacked == 0 and session.acks.unaccepted == 0
    assert not pub.closed


def test_a_run_answered_during_the_call_is_acknowledged_at_once():
    h, bus = harness()
    pub = h.client("pub", level=4)
    one_read(pub, *(Publish("t/1", b"x", qos=1, packet_id=i) for i in range(1, 6)))
    assert pub.received() == [Puback(i) for i in range(1, 6)]
    assert h.broker.sessions.sessions["pub"].inbound_unacked == 0


def test_a_run_refused_later_is_a_0x83_for_each_of_its_publishes():
    h, bus = harness()
    pub = h.client("pub", level=5)
    bus.late = True
    one_read(pub, Publish("t/1", b"a", qos=1, packet_id=1),
             Publish("t/1", b"b", qos=1, packet_id=2), Publish("t/1", b"c", qos=2, packet_id=3))
    assert len(bus.held) == 1
    bus.release(0, Failure(BusPublishError("Kafka did not acknowledge the record")))
    h.turn()
    assert pub.received() == [Puback(1, 0x83), Puback(2, 0x83), Pubrec(3, 0x83)]
    assert h.broker.dropped.get("bus_refused") == 3 and not pub.closed


def test_an_acknowledgement_out_of_the_run_keeps_its_place():
    """A v5 PUBLISH to a topic past ``mqtt.max_topic_levels`` is answered
    0x90 at once: the run before it is handed on first, so the PUBACKs
    stay in the order of the PUBLISHes."""
    h, bus = harness(mqtt={"max_topic_levels": 3})
    pub = h.client("pub", level=5)
    bus.late = True
    one_read(pub, Publish("t/1", b"a", qos=1, packet_id=1),
             Publish("t/1", b"b", qos=1, packet_id=2),
             Publish("a/b/c/d", b"deep", qos=1, packet_id=3),
             Publish("t/1", b"c", qos=1, packet_id=4),
             Publish("t/1", b"d", qos=1, packet_id=5))
    # the run before it; those after it one by one (the run ended there)
    assert len(bus.held) == 3
    assert pub.received() == []
    bus.release(1)
    bus.release(2)
    h.turn()
    assert pub.received() == []  # behind the first run and the 0x90
    bus.release(0)
    h.turn()
    assert pub.received() == [Puback(1), Puback(2), Puback(3, 0x90), Puback(4), Puback(5)]


def test_a_runs_plain_publishes_are_handled_together_and_the_others_the_whole_way(monkeypatch):
    """Once a topic is checked and allowed (the first PUBLISH to it goes the
    whole way, :meth:`Session.on_publish`), the run's next plain PUBLISHes
    are taken together (:meth:`Session.on_publishes`: one time of receipt,
    no call each); one with properties, a new topic or QoS 2 goes the whole
    way in its place.  Every message reaches the subscriber in order, with
    the publisher's client id, and the PUBACKs / PUBREC follow in order."""
    h, bus = harness()
    sub = subscribed(h)
    pub = h.client("pub", level=5)
    session = h.broker.sessions.sessions["pub"]
    whole = []
    on_publish = MQTTProtocol._session_handlers[Publish]
    monkeypatch.setitem(MQTTProtocol._session_handlers, Publish, lambda self, packet: (
        whole.append(packet.payload), on_publish(self, packet))[1])
    bus.late = True
    one_read(pub, Publish("t/1", b"a", qos=1, packet_id=1),
             Publish("t/1", b"b", qos=1, packet_id=2),
             Publish("t/1", b"c", qos=0),
             Publish("t/1", b"d", qos=1, packet_id=3,
                     properties={Property.USER_PROPERTY: [("k", "v")]}),
             Publish("t/2", b"e", qos=1, packet_id=4),
             Publish("t/2", b"f", qos=2, packet_id=5),
             Publish("t/1", b"g", qos=1, packet_id=6),
             Publish("t/2", b"h", qos=1, packet_id=7))
    assert whole == [b"a", b"d", b"e", b"f"]
    assert len(bus.held) == 1 and session.inbound_unacked == 6
    got = sub.received()
    assert [m.payload for m in got] == [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"]
    bus.release(0)
    h.turn()
    assert pub.received() == [Puback(1), Puback(2), Puback(3), Puback(4), Pubrec(5), Puback(6),
                              Puback(7)]
    assert session.inbound_unacked == 0


_FIELDS = ("topic", "payload", "qos", "retain", "packet_id")


@settings(max_examples=300, deadline=None)
@given(
    kinds=st.lists(st.tuples(st.sampled_from(("a", "b", "new", "denied", "stale")),
                             st.sampled_from((0, 1, 1, 1, 2)), st.booleans(), st.booleans(),
                             st.sampled_from(("publish", "publish", "publish", "puback"))),
                   max_size=80),
    plain=st.integers(0, 120),
    start=st.integers(0, 5),
    unacked=st.integers(0, 40),
    room=st.one_of(st.sampled_from((15, 16, 47, 48, 111, 112)), st.integers(0, 160)),
    retained=st.integers(0, 130),
    v5=st.booleans(),
    max_qos=st.sampled_from((0, 1, 1)),
    retain_ok=st.booleans(),
)
def test_plain_columns_takes_the_run_plain_run_takes(kinds, plain, start, unacked, room,
                                                     retained, v5, max_qos, retain_ok):
    """:func:`plain_columns` ends the run where :func:`plain_run` does,
    counts the same QoS 1 flows and gives the fields of its packets, in
    order, for any mix of packets (other kinds, QoS 2, properties, topics
    unchecked, refused or with a stale authorization, RETAIN, the receive
    maximum reached), runs longer than its first stretch included."""
    packets = []
    for n, (topic, qos, retain, props, kind) in enumerate(
            [("a", 1, False, False, "publish")] * plain + kinds * 3):
        packets.append(Puback(n + 1) if kind == "puback" else Publish(
            topic, b"p%d" % n, qos, retain, False, n + 1 if qos else None,
            {Property.CONTENT_TYPE: "x"} if props and n % 3 == 0 else {}))
    if retained < len(packets) and type(packets[retained]) is Publish:
        packets[retained].retain = True
    limit = unacked + room
    topics = {"a", "b", "denied", "stale"}
    allowed = {"a": (True, 10.0), "b": (True, 10.0), "denied": (False, 10.0),
               "stale": (True, 5.0)}
    args = (v5, max_qos, retain_ok, topics, allowed, 5.0, limit)
    end, after = plain_run(packets, start, unacked, *args)
    got = plain_columns(packets, start, unacked, *args)
    assert got[:2] == (end, after)
    taken = packets[start:end]
    assert list(got[2:]) == [[getattr(p, f) for p in taken] for f in _FIELDS]
