"""The lighter transport of accepted TCP connections (tbmq.broker.tcp_server)."""

from __future__ import annotations

import socket

import pytest

from twisted.internet import protocol, tcp

from tbmq.broker.tcp_server import Server, lighten


class Named(protocol.Protocol):
    pass


def test_a_connection_keeps_no_description_strings_but_reads_as_twisteds():
    from twisted.internet import reactor  # noqa: PLC0415
    ours, peer = socket.socketpair()
    try:
        transport = Server(ours, Named(), ("10.0.0.9", 50001), None, 7, reactor)
        try:
            held = vars(transport)
            assert "logstr" not in held and "repstr" not in held  # made when read
            assert transport.logstr == "Named,7,10.0.0.9"  # as tcp.Server's
            assert repr(transport) == "<Named #7 on 50001>"
            assert transport.logPrefix() == "Named"  # asked at every read: no text made
            assert transport.getPeer().host == "10.0.0.9"
        finally:
            transport.stopReading()
    finally:
        ours.close()
        peer.close()


def test_lighten_changes_a_tcp_port_only():
    from twisted.internet import reactor  # noqa: PLC0415
    port = reactor.listenTCP(0, protocol.Factory.forProtocol(Named), interface="127.0.0.1")
    try:
        assert port.transport is tcp.Server
        assert lighten(port) is port and port.transport is Server
        assert type(port.socket).accept is not socket.socket.accept  # family, type read once
        client = socket.create_connection(("127.0.0.1", port.getHost().port))
        try:
            accepted, addr = port.socket.accept()  # as Twisted's accept loop calls it
            try:
                assert type(accepted) is socket.socket and addr == client.getsockname()
                assert accepted.family == socket.AF_INET and accepted.type == socket.SOCK_STREAM
                accepted.sendall(b"ok")
                assert client.recv(2) == b"ok"
            finally:
                accepted.close()
        finally:
            client.close()
    finally:
        port.stopListening()
    assert lighten("listening") == "listening"  # not a TCP port: as it is


def _server(ours):
    from twisted.internet import reactor  # noqa: PLC0415
    return Server(ours, Named(), ("10.0.0.9", 50001), None, 7, reactor)


def test_a_write_with_nothing_waiting_is_sent_at_once():
    ours, peer = socket.socketpair()
    try:
        transport = _server(ours)
        try:
            transport.write(b"\x20\x02\x00\x00")  # a CONNACK
            peer.settimeout(1)
            assert peer.recv(100) == b"\x20\x02\x00\x00"  # no reactor turn needed
            assert not transport.dataBuffer and not transport._tempDataBuffer
            assert transport not in transport.reactor.getWriters()  # never watched for writability
        finally:
            transport.stopReading()
    finally:
        ours.close()
        peer.close()


def test_what_the_kernel_does_not_take_waits_in_order():
    ours, peer = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        transport = _server(ours)
        try:
            big = bytes(range(256)) * 4096  # 1 MiB: more than the socket takes
            transport.write(big)
            waiting = len(transport.dataBuffer) - transport.offset
            assert 0 < waiting < len(big)  # part sent, the rest buffered
            assert transport in transport.reactor.getWriters()  # the rest: when writable
            transport.write(b"after")  # behind what waits, never before it
            assert transport._tempDataBuffer == [b"after"]
            received = bytearray()
            peer.settimeout(2)
            while len(received) < len(big) + 5:
                received += peer.recv(65536)
                if transport.dataBuffer or transport._tempDataBuffer:
                    transport.doWrite()
            assert bytes(received) == big + b"after"
        finally:
            transport.stopReading()
            transport.stopWriting()
    finally:
        ours.close()
        peer.close()


def test_a_write_after_loseconnection_is_left_to_twisted():
    ours, peer = socket.socketpair()
    try:
        transport = _server(ours)
        try:
            transport.disconnecting = 1  # loseConnection() asked: the reactor closes
            transport.write(b"late")
            assert transport._tempDataBuffer == [b"late"]  # buffered, sent before the close
        finally:
            transport.stopReading()
            transport.stopWriting()
    finally:
        ours.close()
        peer.close()


def test_a_connection_from_ipv6_reads_its_peer_as_ipv6():
    from twisted.internet import address, reactor  # noqa: PLC0415
    ours, peer = socket.socketpair()
    try:
        transport = Server(ours, Named(), ("::1", 50002, 0, 0), None, 8, reactor)
        try:
            assert isinstance(transport.getPeer(), address.IPv6Address)
            assert transport.getPeer().host == "::1" and transport.connected
            assert transport in reactor.getReaders()  # read from the start
        finally:
            transport.stopReading()
    finally:
        ours.close()
        peer.close()


class Reads(protocol.Protocol):
    """Reads what waits as it is connected, as MQTTProtocol does."""

    def __init__(self, fail: bool = False) -> None:
        self.got: list[bytes] = []
        self.fail = fail

    def connectionMade(self) -> None:
        self.transport.read_waiting()

    def dataReceived(self, data: bytes) -> None:
        if self.fail:
            raise ValueError("bad input")
        self.got.append(data)


def _connected(ours, proto):
    from twisted.internet import reactor  # noqa: PLC0415
    transport = Server(ours, proto, ("10.0.0.9", 50001), None, 9, reactor)
    proto.makeConnection(transport)
    return transport


def test_what_the_client_sent_before_the_accept_is_read_as_it_is_connected():
    ours, peer = socket.socketpair()
    try:
        peer.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")  # a CONNECT
        proto = Reads()
        transport = _connected(ours, proto)
        try:
            assert proto.got == [b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00"]  # no reactor turn
        finally:
            transport.stopReading()
    finally:
        ours.close()
        peer.close()


def test_nothing_waiting_or_the_end_of_the_stream_is_left_to_the_reactor():
    ours, peer = socket.socketpair()
    try:
        proto = Reads()
        transport = _connected(ours, proto)  # nothing sent yet
        try:
            assert proto.got == [] and transport.connected
            peer.shutdown(socket.SHUT_WR)  # the end of the stream waits
            transport.read_waiting()
            assert proto.got == [] and transport.connected and not transport.disconnecting
            assert transport in transport.reactor.getReaders()  # the reactor sees the end
        finally:
            transport.stopReading()
    finally:
        ours.close()
        peer.close()


def test_a_protocol_failing_on_what_waited_aborts_its_connection():
    from twisted.logger import globalLogPublisher  # noqa: PLC0415
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    ours, peer = socket.socketpair()
    try:
        peer.sendall(b"\xff\xff")
        proto = Reads(fail=True)
        transport = _connected(ours, proto)
        try:
            assert transport._aborting  # closed: its connectionLost comes next turn
            assert transport not in transport.reactor.getReaders()
            assert [e for e in events if "log_failure" in e]  # the traceback logged
        finally:
            for call in transport.reactor.getDelayedCalls():
                if call.func == transport.connectionLost:
                    call.cancel()
            transport.stopReading()
            transport.stopWriting()
    finally:
        globalLogPublisher.removeObserver(events.append)
        ours.close()
        peer.close()


def test_the_mqtt_protocol_handles_a_connect_that_waited_as_it_is_connected():
    from twisted.internet.testing import StringTransport  # noqa: PLC0415

    from tbmq.mqtt import Connack, Connect  # noqa: PLC0415
    from tbmq.mqtt.codec import Decoder, encode  # noqa: PLC0415
    from tests.helpers import Harness  # noqa: PLC0415

    harness = Harness()
    proto = harness.factory.buildProtocol(None)

    class Waiting(StringTransport):
        """A transport whose client sent its CONNECT before the accept."""
        reads = 0

        def read_waiting(self):
            self.reads += 1
            proto.dataReceived(encode(Connect(protocol_level=4, client_id="early",
                                              keep_alive=60), 4))

    transport = Waiting()
    proto.makeConnection(transport)
    assert transport.reads == 1 and proto.session is not None  # handled in connectionMade
    harness.turn()
    (connack,) = Decoder(protocol_level=4, server_side=False).feed(transport.value())
    assert isinstance(connack, Connack) and connack.reason_code == 0


@pytest.mark.parametrize("sent", [True, False])
def test_a_connect_answered_as_it_is_accepted_sets_one_deadline(sent):
    """A connection whose CONNECT waited is answered in ``connectionMade``:
    its one deadline is the keep alive's (1.5 x 60 s), in the bucket of
    that time, no connect timeout before it; with nothing waiting the
    connect timeout is armed and closes it."""
    from twisted.internet.testing import StringTransport  # noqa: PLC0415

    from tbmq.mqtt import Connect  # noqa: PLC0415
    from tbmq.mqtt.codec import encode  # noqa: PLC0415
    from tests.helpers import Harness  # noqa: PLC0415

    harness = Harness()
    proto = harness.factory.buildProtocol(None)
    deadlines = proto._deadlines
    before = deadlines.count

    class Waiting(StringTransport):
        def read_waiting(self):
            if sent:
                proto.dataReceived(encode(Connect(protocol_level=4, client_id="early",
                                                  keep_alive=60), 4))

    transport = Waiting()
    proto.makeConnection(transport)
    now = harness.clock.seconds()
    if sent:
        assert proto.deadline == now + 90 and deadlines.count == before + 1
        assert proto.deadline_slot * deadlines.tick >= now + 90
    else:
        timeout = harness.config.mqtt.connect_timeout
        assert proto.deadline == now + timeout and deadlines.count == before + 1
        harness.clock.advance(timeout + 1)
        assert transport.disconnecting


def test_the_mqtt_protocol_behind_a_layer_leaves_reading_to_the_layer():
    """Behind TLS or the PROXY protocol (Twisted ProtocolWrappers, which hand
    on any attribute of the transport below) the MQTT protocol must not
    make the TCP transport read for the layer while it is being connected."""
    from twisted.internet.testing import StringTransport  # noqa: PLC0415
    from twisted.protocols.policies import ProtocolWrapper, WrappingFactory  # noqa: PLC0415

    from tests.helpers import Harness  # noqa: PLC0415

    harness = Harness()
    proto = harness.factory.buildProtocol(None)

    class Below(StringTransport):
        reads = 0

        def read_waiting(self):
            self.reads += 1

    below = Below()
    layer = ProtocolWrapper(WrappingFactory(harness.factory), proto)
    layer.makeConnection(below)
    assert layer.read_waiting == below.read_waiting  # what the wrapper hands on
    assert proto.transport is layer and proto.connected
    assert below.reads == 0  # the layer reads for itself


def _fd_table_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("FDSize:"):
                return int(line.split()[1])
    raise AssertionError("no FDSize in /proc/self/status")


def test_reserve_descriptors_grows_the_table_once_and_closes_nothing_open():
    """The table covers ``count`` descriptors after the call (the kernel
    keeps its size), and a descriptor open at the top is left open."""
    import fcntl
    import os
    import resource

    from tbmq.broker.tcp_server import reserve_descriptors

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    count = min(soft, 1 << 13)
    r, w = os.pipe()
    try:
        held = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, count - 1)  # occupies the top descriptor
        top = reserve_descriptors(count)
        assert top >= count - 1 and top != held
        os.fstat(held)  # still open: reserving did not close it
        os.close(held)
        assert _fd_table_size() >= count
        with pytest.raises(OSError):
            os.fstat(top)  # the reserving descriptor itself was closed
    finally:
        os.close(r)
        os.close(w)
    assert reserve_descriptors(3) == 0
