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
from tbmq.mqtt import Pingreq, Pingresp, Puback, Publish, Pubrec, Pubrel, Pubcomp, ReasonCode
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
    assert session.acks is None and not session.inbound_qos2
    assert not isinstance(session.inbound_qos2, set)
    c.send(Publish("t/a", b"x", qos=2, packet_id=7))
    assert any(isinstance(p, Pubrec) and p.packet_id == 7 for p in c.received())
    assert session.inbound_qos2 == {7}  # a set now, held until PUBREL [MQTT-4.3.3-10]
    assert session.acks is not None and session.acks.queue == ()  # made, none waits
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


def test_an_idle_clean_connection_holds_under_2_75_kilobytes():
    # 4,463 B before the connection kept its CONNECT's AuthRequest, two empty
    # lists and the incomplete-packet fields; 3,855 B after (2,000 clients);
    # 2,884 B with the parts made at first use, the shared values and a clean
    # session's registry record held unencoded by the in-process bus; about
    # 2,670 B (400 clients) without the CONNECT kept after its CONNACK, a
    # bound deliver per session, an empty inflight dict and a timeout float
    # per connection; 2,682 B → 2,666 B with the publisher acknowledgements
    # (queue, unanswered count, paused flag: three slots) a part of the
    # session made at the first PUBLISH (2,730 B if made with the session)
    assert _bytes_per_connection(400) < 2750


def test_an_idle_persistent_connection_holds_under_3_3_kilobytes():
    # 3,640 B (400 clients) while each connected persistent session kept the
    # empty set of its last store read; 3,170 B without it (and the above)
    assert _bytes_per_connection(400, clean_start=False) < 3300


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


def test_a_decoder_holds_no_buffer_between_packets_nor_a_topic_table_before_a_publish():
    from tbmq.mqtt import Connect, encode
    from tbmq.mqtt.decoder import Decoder
    decoder, other = Decoder(), Decoder()
    assert decoder.partial == b"" and decoder._topics is other._topics  # shared, empty
    assert decoder.feed(encode(Connect(client_id="d"), 4))[0].client_id == "d"
    assert decoder.partial == b"" and not isinstance(decoder.partial, bytearray)
    data = encode(Publish("t/a", b"x" * 100, qos=1, packet_id=3), 4)
    assert decoder.feed(data[:10]) == []
    assert isinstance(decoder.partial, bytearray) and decoder.pending == 10  # a packet waits
    [publish] = decoder.feed(data[10:])
    assert (publish.topic, publish.packet_id) == ("t/a", 3)
    assert decoder.partial == b"" and not isinstance(decoder.partial, bytearray)
    assert decoder._topics == {b"t/a": "t/a"} and not other._topics  # its own from the first


def test_connects_share_their_protocol_name_and_empty_properties():
    from tbmq.mqtt import Connect, Property, encode
    from tbmq.mqtt.decoder import Decoder
    first, second = (Decoder().feed(encode(Connect(client_id=f"c{i}"), 4))[0] for i in range(2))
    assert first.protocol_name == "MQTT" and first.protocol_name is second.protocol_name
    assert first.properties == {} and first.properties is second.properties
    v5 = Decoder().feed(encode(Connect(protocol_level=5, client_id="c5"), 5))[0]
    assert v5.properties is first.properties
    asked = Decoder().feed(encode(Connect(protocol_level=5, client_id="c6", properties={
        Property.SESSION_EXPIRY_INTERVAL: 60}), 5))[0]
    assert asked.properties == {Property.SESSION_EXPIRY_INTERVAL: 60}  # its own


def test_anonymous_clients_share_one_auth_result():
    h = Harness()
    h.client("a1", keep_alive=60)
    h.client("a2", keep_alive=60)
    sessions = h.broker.sessions.sessions
    first, second = sessions["a1"].connection.auth, sessions["a2"].connection.auth
    assert first.allowed and first.provider == "anonymous" and first is second


def test_an_idle_session_has_no_view_subscriptions_or_consumers_of_its_own():
    from tbmq.mqtt import Suback, Subscribe, SubscriptionRequest
    h = Harness()
    c = h.client("s1", level=5, keep_alive=60)
    h.client("s2", level=5, keep_alive=60)
    s1, s2 = h.broker.sessions.sessions["s1"], h.broker.sessions.sessions["s2"]
    assert s1._view is None  # made when a plugin is first shown the session
    assert s1.subscriptions is s2.subscriptions is s1.app_consumers  # the shared empty one
    assert s1.view is s1.view and s1.view.client_id == "s1"
    c.send(Subscribe(1, [SubscriptionRequest("a/b", 1)]))
    assert any(isinstance(p, Suback) for p in c.received())
    assert list(s1.subscriptions) == ["a/b"] and s2.subscriptions == {}  # its own dict now


def test_a_connected_client_keeps_no_address_object():
    h = Harness()
    h.client("addr", keep_alive=60, peer="10.1.2.3")
    session = h.broker.sessions.sessions["addr"]
    conn = session.connection
    assert conn._peer_address is None and session.address == "10.1.2.3:50000"
    assert conn._peer() == "10.1.2.3"  # asked of the transport again


def test_the_link_gets_the_client_capabilities_from_its_connect(monkeypatch):
    from tbmq.mqtt import Property
    h = Harness({"mqtt": {"outbound_topic_aliases": 8}})
    h.client("caps", level=5, keep_alive=60, properties={
        Property.RECEIVE_MAXIMUM: 7, Property.MAXIMUM_PACKET_SIZE: 5000,
        Property.TOPIC_ALIAS_MAXIMUM: 20})
    session = h.broker.sessions.sessions["caps"]
    link, conn = session.link, session.connection
    assert (link.send_quota, link.max_packet_size, link.topic_alias_maximum) == (7, 5000, 8)
    assert not hasattr(conn, "send_quota") and conn.handshake is None


def test_no_certificate_chain_is_looked_for_on_a_listener_without_client_certificates(monkeypatch):
    from tbmq.broker import connect

    def walked(transport):
        raise AssertionError("the transport's layers were walked")

    monkeypatch.setattr(connect, "peer_certificate_chain", walked)
    h = Harness()
    assert h.config.listeners[0].tls_client_auth == "none"
    assert h.client("plain", keep_alive=60).connack.reason_code == 0


def test_a_clean_session_record_is_held_by_the_bus_unencoded():
    # transient (never in the topic log): the bus keeps the SessionInfo it was
    # given, not its packed bytes (140 B per connection)
    from tbmq.cluster.records import SessionInfo
    h = Harness()
    h.client("clean", keep_alive=60)
    h.client("kept", keep_alive=60, clean_start=False)
    [state] = [s for name, s in h.broker.bus._topics.items() if name.endswith("client.session")]
    held = {entry[0]: entry for part in state.parts for entry in part.entries.values()}
    key, value, headers, decoded = held["clean"]
    assert isinstance(value, SessionInfo) and value is decoded and not value.persistent
    assert isinstance(held["kept"][1], bytes)  # a persistent one's goes to the log: encoded


def test_connections_whose_deadlines_share_a_bucket_share_its_key():
    h = Harness()
    h.client("k0", keep_alive=60)
    h.client("k1", keep_alive=60)  # the same clock: the same 0.1 s bucket
    # (in the connect timeout's bucket until it is due, then the keep alive's)
    h.clock.advance(h.config.mqtt.connect_timeout + 1)
    sessions = h.broker.sessions.sessions
    first, second = sessions["k0"].connection, sessions["k1"].connection
    assert first.deadline_slot > 256 and first.deadline_slot is second.deadline_slot


def test_a_connected_client_keeps_no_connect_packet_only_the_expiry_it_asked_for():
    from tbmq.mqtt import Disconnect, Property
    h = Harness()
    c = h.client("none", level=5, keep_alive=60)
    kept = h.client("kept", level=5, keep_alive=60,
                    properties={Property.SESSION_EXPIRY_INTERVAL: 600})
    conn = h.broker.sessions.sessions["none"].connection
    kept_conn = h.broker.sessions.sessions["kept"].connection
    assert conn.connect_packet is None and kept_conn.connect_packet is None
    assert (conn.expiry_asked, kept_conn.expiry_asked) == (0, 600)
    assert conn._client_id() == "none"  # for its log lines, from the session
    # [MQTT-3.14.2-2] still holds without the CONNECT: 0 may not become 10 ...
    c.send(Disconnect(ReasonCode.NORMAL_DISCONNECTION, {Property.SESSION_EXPIRY_INTERVAL: 10}))
    assert [p.reason_code for p in c.received() if isinstance(p, Disconnect)] == [
        ReasonCode.PROTOCOL_ERROR]
    # ... while 600 may become 30
    session = h.broker.sessions.sessions["kept"]
    kept.send(Disconnect(ReasonCode.NORMAL_DISCONNECTION, {Property.SESSION_EXPIRY_INTERVAL: 30}))
    assert kept.closed and session.expiry_interval == 30


def test_a_blocked_entry_disconnects_a_connected_client_by_its_session():
    from tbmq.cluster.blocked import new_entry
    from tbmq.mqtt import Disconnect
    h = Harness()
    c = h.client("dev-1", level=5, keep_alive=60, username="alice")
    other = h.client("dev-2", level=5, keep_alive=60, username="bob")
    h.broker.blocked.add(new_entry("username", "alice", now=h.clock.seconds()))
    h.turn()
    assert [p.reason_code for p in c.received() if isinstance(p, Disconnect)] == [
        ReasonCode.ADMINISTRATIVE_ACTION]
    assert c.closed and not other.closed


def test_an_idle_session_holds_no_inflight_dict_nor_bound_deliver():
    from tbmq.broker.session import Session
    from tbmq.broker.outbox import NO_ENTRIES
    from tbmq.mqtt import Subscribe, SubscriptionRequest
    h = Harness()
    c = h.client("sub", level=4, keep_alive=60)
    h.client("idle", level=4, keep_alive=60)
    sub, idle = h.broker.sessions.sessions["sub"], h.broker.sessions.sessions["idle"]
    assert "deliver" not in Session.__slots__
    assert idle.outbox.inflight is NO_ENTRIES and idle.inflight == {}
    assert idle.deliver == idle.outbox.deliver  # still there, looked up at each call
    c.send(Subscribe(1, [SubscriptionRequest("t/q", 1)]))
    c.received()
    pub = h.client("pub", level=4, keep_alive=60)
    pub.send(Publish("t/q", b"m", qos=1, packet_id=5))
    [sent] = [p for p in c.received() if isinstance(p, Publish)]
    assert sub.outbox.inflight is not NO_ENTRIES and list(sub.inflight) == [sent.packet_id]
    assert idle.outbox.inflight is NO_ENTRIES  # the shared one was never written
    c.send(Puback(sent.packet_id))
    assert sub.inflight == {}


def test_the_keep_alive_moves_the_connect_timeouts_deadline_without_a_bucket_change():
    h = Harness()
    c = h.client("late", keep_alive=60)
    conn = h.broker.sessions.sessions["late"].connection
    connect_bucket = conn.deadline_slot
    # the keep alive's deadline (90 s) is later than the connect timeout's:
    # one attribute now, the bucket moves it when due
    assert conn.deadline == h.clock.seconds() + 90 and conn.deadline_slot is connect_bucket
    h.clock.advance(h.config.mqtt.connect_timeout + 1)
    assert not c.closed and conn.deadline_slot > connect_bucket
    h.clock.advance(90)
    assert c.closed  # 1.5 x the keep alive without a packet [MQTT-3.1.2-24]


def test_connections_of_one_keep_alive_share_their_timeout_value():
    h = Harness()
    h.client("k1", keep_alive=60)
    h.client("k2", keep_alive=60)
    h.client("k3", keep_alive=30)
    sessions = h.broker.sessions.sessions
    first, second, third = (sessions[k].connection for k in ("k1", "k2", "k3"))
    assert first.timeOut == 90.0 and first.timeOut is second.timeOut
    assert third.timeOut == 45.0


def test_a_resumed_persistent_session_keeps_no_set_of_its_finished_read():
    from tbmq.broker.store_reads import NO_SEQS
    h = Harness()
    h.client("p1", level=4, keep_alive=60, clean_start=False)
    h.turn()
    reader = h.broker.sessions.sessions["p1"].outbox.reader
    # the store was read at the resume: its set of finished seqs went with the read
    assert reader is not None and not reader.loading
    assert reader.finished_in_read is NO_SEQS
