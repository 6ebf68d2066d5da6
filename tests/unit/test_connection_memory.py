"""What an idle connection holds, kept from growing back: the connection
and its session keep their attributes in slots (no dict of their own), the
parts a client may never use are made at first use, and the connect timeout
and keep alive of every connection share one timer of the node."""

from __future__ import annotations

import gc
import tracemalloc

from tbmq.broker import acknowledgements
from tbmq.broker.outbox import Outbox
from tbmq.broker.protocol import MQTTProtocol
from tbmq.mqtt import Pingreq, Pingresp, Puback, Publish, Pubrec, Pubrel, Pubcomp
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


def _bytes_per_connection(count: int, **kw) -> float:
    """tracemalloc's bytes held per idle connection (the harness's own
    StringTransport and client objects included, as in bench/conn_memory.py)."""
    h = Harness()
    h.client("warm-up", keep_alive=60, **kw)
    gc.collect()
    tracemalloc.start(1)
    try:
        before = tracemalloc.take_snapshot()
        clients = [h.client(f"idle-{i}", keep_alive=60, **kw) for i in range(count)]
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert len(clients) == count
    return sum(d.size_diff for d in after.compare_to(before, "lineno")) / count


def test_an_idle_clean_connection_holds_under_4_kilobytes():
    # 4,463 B before the connection kept its CONNECT's AuthRequest, two empty
    # lists and the incomplete-packet fields; 3,855 B after (2,000 clients)
    assert _bytes_per_connection(400) < 4000


def test_an_anonymous_client_keeps_no_auth_request_after_connack():
    h = Harness()
    h.client("anon", level=5, keep_alive=60)
    conn = h.broker.sessions.sessions["anon"].connection
    # nothing reads it again: no re-authentication method, no credentials record
    assert conn.auth is not None and conn.auth_request is None


def test_an_idle_connection_holds_no_outbound_list_nor_packet_deadline():
    h = Harness()
    c = h.client("quiet", level=4, keep_alive=60)
    conn = h.broker.sessions.sessions["quiet"].connection
    assert conn._out == () and conn._waiting == () and conn._incomplete is None
    c.send(Pingreq())
    assert any(isinstance(p, Pingresp) for p in c.received())
    assert conn._out == ()  # written at the end of the turn, the list let go


def test_acknowledgements_go_from_the_protocol_to_their_handler_in_one_call():
    handlers = MQTTProtocol._session_handlers
    assert handlers[Puback] is acknowledgements.on_puback
    assert handlers[Pubrec] is acknowledgements.on_pubrec
    assert handlers[Pubcomp] is acknowledgements.on_pubcomp


def test_the_connection_and_the_outbox_have_at_most_35_methods():
    import ast
    import inspect
    from bench.class_sizes import own
    for cls in (MQTTProtocol, Outbox):
        node = ast.parse(inspect.getsource(inspect.getmodule(cls)))
        [cdef] = [n for n in node.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
        methods, _ = own(cdef)
        assert len(methods) <= 35, (cls.__name__, len(methods))
