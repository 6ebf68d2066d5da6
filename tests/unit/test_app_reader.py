"""The reader of a live persistent APPLICATION session
(:class:`tbmq.cluster.sinks.ApplicationReader`): what a reactor turn
published to ``tbmq.msg.app.<clientId>`` reaches the session in one call
(:meth:`tbmq.broker.outbox.Outbox.deliver_app_batch`), and a record is
committed only once it and every record before it were acknowledged (a
:class:`~tbmq.cluster.records.DeliveryRun`: each of its messages)."""

from __future__ import annotations

from tbmq.broker.outbox import Outbox
from tbmq.cluster.records import Delivery, DeliveryRun
from tbmq.model import Message
from tbmq.mqtt import Property, Puback, Pubcomp, Publish, Pubrec, Pubrel
from tests.unit.test_cluster_of_two import cluster, sub  # noqa: F401 (a fixture)

EXPIRY = {Property.SESSION_EXPIRY_INTERVAL: 600}


def online_application(cluster):
    app = cluster.a.client("app-1", level=5, clean_start=False, properties=dict(EXPIRY))
    sub(app, "telemetry/#")
    session = cluster.a.broker.sessions.sessions["app-1"]
    return app, session.app_consumers[None]


def publish(p, first: int, n: int) -> None:
    """``n`` QoS 1 messages in one reactor turn."""
    p.send(*[Publish("telemetry/1", b"%d" % i, qos=1, packet_id=i + 1)
             for i in range(first, first + n)])


def publish_deliveries(cluster, first: int, n: int) -> None:
    """``n`` records of one QoS 1 message each (a Delivery) on the
    client's topic, in one reactor turn."""
    node = cluster.b.broker
    for i in range(first, first + n):
        node.bus.publish(node.topics.app("app-1"), "app-1",
                         Delivery("app-1", Message("telemetry/1", b"%d" % i, 1, False, {}, "p",
                                                   1.0), 1))
    cluster.clock.advance(0)


def test_a_turns_records_reach_the_session_in_one_call(cluster, monkeypatch):
    calls = []
    deliver = Outbox.deliver_app_batch

    def counted(self, deliveries, source):
        calls.append((len(deliveries), sum(len(d.messages) if type(d) is DeliveryRun else 1
                                            for d in deliveries)))
        return deliver(self, deliveries, source)

    monkeypatch.setattr(Outbox, "deliver_app_batch", counted)
    app, consumer = online_application(cluster)
    p = cluster.b.client("p")
    publish(p, 0, 5)
    got = app.received()
    assert [m.payload for m in got] == [b"%d" % i for i in range(5)]
    ((records, messages),) = calls
    assert messages == 5
    # handed together (the encoding mode: no record handed during its publish):
    # routed as one batch, one run; handed one by one: a Delivery each
    assert records == (1 if cluster.bus.encodes else 5)
    assert consumer.lag() == records  # nothing acknowledged yet
    for m in got:
        app.send(Puback(m.packet_id))
    assert consumer.lag() == 0


def test_a_record_is_committed_once_it_and_every_one_before_it_were_acknowledged(cluster):
    app, consumer = online_application(cluster)
    publish_deliveries(cluster, 0, 3)
    first = app.received()
    publish_deliveries(cluster, 3, 3)
    second = app.received()
    assert [m.payload for m in first + second] == [b"%d" % i for i in range(6)]
    for m in second + first[1:]:
        app.send(Puback(m.packet_id))
    assert consumer.lag() == 6  # the first record holds every later one back
    app.lose()
    again = cluster.b.client("app-1", level=5, clean_start=False, properties=dict(EXPIRY))
    got = again.pending + again.received()
    # at least once: what followed the unacknowledged record comes again
    assert [m.payload for m in got] == [b"%d" % i for i in range(6)]
    for m in got:
        again.send(Puback(m.packet_id))
    again.lose()
    third = cluster.a.client("app-1", level=5, clean_start=False, properties=dict(EXPIRY))
    assert third.pending + third.received() == []  # all committed


def test_a_batch_is_committed_up_to_its_first_unacknowledged_record(cluster):
    app, consumer = online_application(cluster)
    publish_deliveries(cluster, 0, 4)
    got = app.received()
    assert len(got) == 4
    for m in got[:3]:
        app.send(Puback(m.packet_id))
    assert consumer.lag() == 1  # exact: only the unacknowledged one is left
    app.send(Puback(got[3].packet_id))
    assert consumer.lag() == 0


def test_a_connection_lost_in_the_middle_of_a_batch_gets_exactly_the_rest_again(cluster):
    app, consumer = online_application(cluster)
    publish_deliveries(cluster, 0, 5)
    got = app.received()
    assert [m.payload for m in got] == [b"%d" % i for i in range(5)]
    app.send(Puback(got[0].packet_id), Puback(got[1].packet_id), Puback(got[3].packet_id))
    assert consumer.lag() == 3  # 3 was acknowledged, but after 2: the leading run is 0-1
    app.lose()
    again = cluster.b.client("app-1", level=5, clean_start=False, properties=dict(EXPIRY))
    rest = again.pending + again.received()
    assert [m.payload for m in rest] == [b"2", b"3", b"4"]


def test_qos2_a_completed_message_is_not_delivered_again_after_a_lost_connection(cluster):
    app = cluster.a.client("app-1", level=5, clean_start=False, properties=dict(EXPIRY))
    sub(app, "telemetry/#", qos=2)
    consumer = cluster.a.broker.sessions.sessions["app-1"].app_consumers[None]
    p = cluster.b.client("p")
    p.send(*[Publish("telemetry/1", b"%d" % i, qos=2, packet_id=i + 1) for i in range(4)])
    got = [m for m in app.received() if type(m) is Publish]
    assert [(m.payload, m.qos) for m in got] == [(b"%d" % i, 2) for i in range(4)]
    app.send(*[Pubrec(m.packet_id) for m in got[:3]])
    released = [m for m in app.received() if type(m) is Pubrel]
    assert [m.packet_id for m in released] == [m.packet_id for m in got[:3]]
    app.send(Pubcomp(got[0].packet_id), Pubcomp(got[1].packet_id))
    assert consumer.lag() == 2  # 0 and 1 completed; 2 released, not completed; 3 pending
    app.lose()
    again = cluster.b.client("app-1", level=5, clean_start=False, properties=dict(EXPIRY))
    rest = [m for m in again.pending + again.received() if type(m) is Publish]
    assert [m.payload for m in rest] == [b"2", b"3"]



def publish_run(cluster, first: int, n: int, qos: int = 1) -> None:
    """One record of ``n`` messages on the client's topic, as a routing
    node on Kafka writes it (a DeliveryRun)."""
    messages = [Message("telemetry/1", b"%d" % i, qos, False, {}, "p", 1.0)
                for i in range(first, first + n)]
    node = cluster.b.broker
    node.bus.publish(node.topics.app("app-1"), "app-1", DeliveryRun("app-1", messages, qos))
    cluster.clock.advance(0)


def test_a_run_is_delivered_in_order_and_committed_once_all_of_it_is_acknowledged(cluster):
    app, consumer = online_application(cluster)
    publish_run(cluster, 0, 4)
    publish_run(cluster, 4, 1)
    got = app.received()
    assert [m.payload for m in got] == [b"%d" % i for i in range(5)]
    assert consumer.lag() == 2  # two records
    app.send(*[Puback(m.packet_id) for m in got[1:4]])
    assert consumer.lag() == 2  # the run waits for its first message
    app.send(Puback(got[0].packet_id))
    assert consumer.lag() == 1
    app.send(Puback(got[4].packet_id))
    assert consumer.lag() == 0


def test_a_run_partly_acknowledged_comes_again_whole_after_a_lost_connection(cluster):
    app, consumer = online_application(cluster)
    publish_run(cluster, 0, 3)
    got = app.received()
    app.send(Puback(got[0].packet_id))
    app.lose()
    again = cluster.b.client("app-1", level=5, clean_start=False, properties=dict(EXPIRY))
    rest = again.pending + again.received()
    # at least once (QoS 1): the acknowledged message of the run comes again with it
    assert [m.payload for m in rest] == [b"0", b"1", b"2"]
    again.send(*[Puback(m.packet_id) for m in rest])
    again.lose()
    third = cluster.a.client("app-1", level=5, clean_start=False, properties=dict(EXPIRY))
    assert third.pending + third.received() == []  # all committed


def test_what_the_window_takes_of_a_batch_is_sent_as_one_run(cluster, monkeypatch):
    runs = []
    send_run = Outbox._send_run

    def counted(self, deliveries, now, conn, cache=None):
        runs.append([d.message.payload for d in deliveries])
        return send_run(self, deliveries, now, conn, cache)

    monkeypatch.setattr(Outbox, "_send_run", counted)
    app, consumer = online_application(cluster)
    runs.clear()
    publish_deliveries(cluster, 0, 5)
    got = app.received()
    assert [m.payload for m in got] == [b"%d" % i for i in range(5)]
    assert runs == [[b"%d" % i for i in range(5)]]  # one _send_run, not one per message
    app.send(*[Puback(m.packet_id) for m in got])
    assert consumer.lag() == 0


def test_a_batch_beyond_the_clients_receive_maximum_is_sent_in_order_as_room_comes(cluster):
    app = cluster.a.client("app-1", level=5, clean_start=False,
                           properties={**EXPIRY, Property.RECEIVE_MAXIMUM: 3})
    sub(app, "telemetry/#")
    consumer = cluster.a.broker.sessions.sessions["app-1"].app_consumers[None]
    publish_deliveries(cluster, 0, 7)
    got = app.received()
    assert [m.payload for m in got] == [b"0", b"1", b"2"]  # the window's worth
    seen = list(got)
    while len(seen) < 7:
        app.send(*[Puback(m.packet_id) for m in got])
        got = app.received()
        assert got, "nothing sent after the acknowledgements"
        assert len(got) <= 3
        seen += got
    assert [m.payload for m in seen] == [b"%d" % i for i in range(7)]
    app.send(*[Puback(m.packet_id) for m in got])
    assert consumer.lag() == 0


def test_a_qos0_record_between_qos1_records_keeps_its_place(cluster):
    app, consumer = online_application(cluster)
    node = cluster.b.broker
    for i, qos in enumerate((1, 1, 0, 1)):
        node.bus.publish(node.topics.app("app-1"), "app-1",
                         Delivery("app-1", Message("telemetry/1", b"%d" % i, qos, False, {}, "p",
                                                   1.0), qos))
    cluster.clock.advance(0)
    got = app.received()
    assert [(m.payload, m.qos) for m in got] == [(b"0", 1), (b"1", 1), (b"2", 0), (b"3", 1)]
    app.send(*[Puback(m.packet_id) for m in got if m.qos])
    assert consumer.lag() == 0
