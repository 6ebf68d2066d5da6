"""What an idle connection holds, kept from growing back: the connection
and its session keep their attributes in slots (no dict of their own), the
parts a client may never use are made at first use, and the connect timeout
and keep alive of every connection share one timer of the node."""

from __future__ import annotations

from tbmq.mqtt import Publish, Pubrec, Pubrel, Pubcomp
from tests.helpers import Harness


def test_an_idle_connection_and_its_session_have_no_instance_dict():
    h = Harness()
    h.client("idle", level=5, keep_alive=60)
    session = h.broker.sessions.sessions["idle"]
    conn = session.connection
    # every attribute of a connected idle client is in a slot: CPython
    # gave each a 1.6 KB dict once it had over 30 attributes
    assert getattr(conn, "__dict__", {}) == {}
    assert getattr(session, "__dict__", {}) == {}


def test_an_idle_session_has_no_acknowledgement_queue_until_one_waits():
    h = Harness()
    c = h.client("q2", level=5, keep_alive=60)
    session = h.broker.sessions.sessions["q2"]
    assert session._acks == () and not session.inbound_qos2
    assert not isinstance(session.inbound_qos2, set)
    c.send(Publish("t/a", b"x", qos=2, packet_id=7))
    assert any(isinstance(p, Pubrec) and p.packet_id == 7 for p in c.received())
    assert session.inbound_qos2 == {7}  # a set now, held until PUBREL [MQTT-4.3.3-10]
    c.send(Pubrel(7))
    assert any(isinstance(p, Pubcomp) and p.packet_id == 7 for p in c.received())
    assert not session.inbound_qos2


def test_many_connections_share_one_timer():
    h = Harness()
    h.client("first", keep_alive=60)
    calls = len(h.clock.getDelayedCalls())
    for i in range(50):
        h.client(f"c{i}", keep_alive=60)
    assert len(h.clock.getDelayedCalls()) == calls
