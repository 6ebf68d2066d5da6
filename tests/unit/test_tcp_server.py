"""The lighter transport of accepted TCP connections (tbmq.broker.tcp_server)."""

from __future__ import annotations

import socket

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
    finally:
        port.stopListening()
    assert lighten("listening") == "listening"  # not a TCP port: as it is
