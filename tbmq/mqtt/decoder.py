"""Sans-IO MQTT decoding: the incremental :class:`Decoder`, bytes in,
complete packets out, for MQTT 3.1 (level 3), 3.1.1 (level 4) and 5.0
(level 5).

Bad input raises :class:`MalformedPacket` carrying the reason code to close
the connection with; nothing here does I/O or logs.  The first byte of each
fixed header selects its decoding function from a table made once per side
and protocol level (:func:`dispatch_table`), so a packet of a valid type and
flags costs one call; the payload of a PUBLISH is sliced out of the received
bytes once.  The PUBLISHes after one that repeat its header but for the
packet identifier (a client's run of messages to one topic, of one size)
are decoded together, their bytes compared per position for the run.
"""

from __future__ import annotations

import functools
import struct
from itertools import repeat

from .constants import (MAX_PACKET_SIZE, MQTT_3_1, MQTT_5, REASON_CODES, SUPPORTED_PROTOCOLS,
                        WILL_PROPERTIES, PacketType, Property)
from .packets import (Auth, Connack, Connect, Disconnect, Packet, Pingreq, Pingresp, Puback,
                      Pubcomp, Publish, Pubrec, Pubrel, Suback, Subscribe, SubscriptionRequest,
                      Unsuback, Unsubscribe, Will)
from .properties import MalformedPacket, decode_binary, decode_properties, decode_string

__all__ = ["Decoder", "MalformedPacket", "dispatch_table"]

_PROTOCOL_ERROR = 0x82
_PACKET_TOO_LARGE = 0x95

#: Packet types a server must not receive (section 2.1.2, direction column).
_NOT_TO_SERVER = frozenset((PacketType.CONNACK, PacketType.SUBACK, PacketType.UNSUBACK, PacketType.PINGRESP))
#: Packet types a client must not receive.
_NOT_TO_CLIENT = frozenset((PacketType.CONNECT, PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE, PacketType.PINGREQ))
#: Packet types whose reserved fixed-header flags are 0b0010 (section 2.1.3).
_FLAGS_0010 = frozenset((PacketType.PUBREL, PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE))

_V3_SUBACK_CODES = frozenset((0x00, 0x01, 0x02, 0x80))


def _need(ok: bool, message: str, reason_code: int = 0x81) -> None:
    if not ok:
        raise MalformedPacket(message, reason_code)


def _packet_id(data: bytes, pos: int, end: int) -> int:
    """Read a non-zero Packet Identifier [MQTT-2.2.1-3]."""
    if pos + 2 > end:
        raise MalformedPacket("truncated packet identifier")
    pid = (data[pos] << 8) | data[pos + 1]
    if not pid:
        raise MalformedPacket("packet identifier 0 [MQTT-2.2.1-3]")
    return pid


def _reason(code: int, ptype: PacketType) -> int:
    """Check a 5.0 reason code is one the packet type may carry (section 2.4)."""
    if code not in REASON_CODES[ptype]:
        raise MalformedPacket(f"reason code 0x{code:02x} not valid in {ptype.name}", _PROTOCOL_ERROR)
    return code


#: PacketType by the fixed header's type nibble (a tuple beats the Enum call)
_PACKET_TYPES = (None,) + tuple(PacketType(i) for i in range(1, 16))

#: distinct topic names a decoder, and :func:`encode_publish`, remember (emptied when full)
_TOPIC_CACHE_SIZE = 1024

#: what a decoder holds between packets: no buffer (a ``bytearray`` is made
#: when a read ends inside a packet, and let go once the packet is complete)
_NO_BYTES = b""
#: the topic table of a decoder that has decoded no PUBLISH yet: never
#: written (a dict is made at the first topic name; an empty one is 64 bytes)
_NO_TOPICS: dict = {}
#: the properties of every CONNECT that has none (all before 5.0): never
#: written
_NO_PROPERTIES: dict = {}
#: the protocol names decoded, one string each for all connections
_PROTOCOL_NAMES = {name: name for name, _level in SUPPORTED_PROTOCOLS}
#: the protocol name of 3.1.1 and 5.0 as CONNECT encodes it (a UTF-8
#: Encoded String, section 1.5.4): matched as bytes, not decoded
_MQTT_NAME = b"\x00\x04MQTT"

class Decoder:
    """Incremental decoder: bytes in, complete packets out.

    :param max_packet_size: the largest packet accepted, fixed header
        included (``Maximum Packet Size``, section 3.1.2.11.4); a larger one
        raises :class:`MalformedPacket` with 0x95 as soon as its fixed header
        is read, before its body is buffered.
    :param max_connect_size: server side: the largest packet accepted until
        a CONNECT is decoded (the lower of it and ``max_packet_size``
        applies), so a connection not yet known buffers no more than this;
        None: ``max_packet_size``.
    :param protocol_level: the level to decode with, or None. A server-side
        decoder sets it from the CONNECT it decodes; a client-side decoder is
        told it by the caller (None is read as 4).
    :param server_side: True when decoding what a client sends to a server.
    :ivar partial: the bytes of a packet not complete yet: a ``bytearray``
        while a packet is incomplete, an empty ``bytes`` between packets;
        read only.

    Once :meth:`feed` has raised, the decoder stays failed: every later call
    raises again (the connection is to be closed, section 4.13).
    """

    __slots__ = ("max_packet_size", "max_connect_size", "server_side", "partial", "_level",
                 "_table", "_need", "_connect_seen", "_error", "_topics")

    def __init__(
        self,
        max_packet_size: int = MAX_PACKET_SIZE,
        protocol_level: int | None = None,
        server_side: bool = True,
        max_connect_size: int | None = None,
    ) -> None:
        self.max_packet_size = max_packet_size
        self.max_connect_size = max_connect_size
        self.server_side = server_side
        # (the protocol_level setter's work, without its call: one per connection)
        self._level = protocol_level
        self._table = dispatch_table(server_side, 4 if protocol_level is None
                                     and not server_side else protocol_level)
        self.partial: bytearray | bytes = _NO_BYTES
        self._need = 0
        self._connect_seen = False
        self._error: MalformedPacket | None = None
        self._topics: dict[bytes, str] = _NO_TOPICS  # a dict from the first topic name

    @property
    def protocol_level(self) -> int | None:
        """The level packets are decoded with (3, 4 or 5), or None until a
        server-side decoder has decoded a supported CONNECT."""
        return self._level

    @protocol_level.setter
    def protocol_level(self, level: int | None) -> None:
        self._level = level
        self._table = dispatch_table(self.server_side,
                                     4 if level is None and not self.server_side else level)

    def feed(self, data: bytes) -> list[Packet]:
        """Add received bytes; return every packet they complete.

        :param data: the next bytes from the connection.
        :returns: the complete packets, in order (possibly none).
        :raises MalformedPacket: for anything invalid; its ``packets`` holds
            the packets completed by this call before the bad one.
        """
        if self._error is not None:
            raise MalformedPacket(f"decoder failed earlier: {self._error}", self._error.reason_code)
        if data.__class__ is not bytes:
            data = bytes(data)
        buf = self.partial
        if buf:
            buf += data
            if len(buf) < self._need:
                return []
            data = bytes(buf)
            self.partial = _NO_BYTES
        elif not data:
            return []
        try:
            return self._parse(data)
        except MalformedPacket as exc:
            self._error = exc
            self.partial = _NO_BYTES
            raise

    @property
    def pending(self) -> int:
        """Bytes of a packet not complete yet (buffered): ``len(partial)``."""
        return len(self.partial)

    def _parse(self, data: bytes) -> list[Packet]:
        packets: list[Packet] = []
        n = len(data)
        pos = 0
        need = 0
        max_size = self.max_packet_size
        before_connect = (self.server_side and not self._connect_seen
                          and self.max_connect_size is not None
                          and self.max_connect_size < max_size)
        if before_connect:
            max_size = self.max_connect_size
        try:
            while pos < n:
                # Fixed header: type/flags byte and Remaining Length (2.1.4).
                if pos + 1 >= n:
                    need = n - pos + 1
                    break
                b = data[pos + 1]
                if b < 0x80:
                    length = b
                    body = pos + 2
                else:
                    length = b & 0x7F
                    i = pos + 2
                    shift = 7
                    while True:
                        if i >= n:
                            break
                        b = data[i]
                        i += 1
                        length |= (b & 0x7F) << shift
                        if b < 0x80:
                            break
                        shift += 7
                        if shift > 21:
                            raise MalformedPacket("remaining length longer than 4 bytes")
                    if b >= 0x80:
                        need = n - pos + 1
                        break
                    body = i
                end = body + length
                if end - pos > max_size:
                    self._check_first(data[pos])  # a forbidden type is named first
                    what = "the maximum CONNECT size" if before_connect else "the maximum packet size"
                    raise MalformedPacket(
                        f"packet of {end - pos} bytes exceeds {what} {max_size}",
                        _PACKET_TOO_LARGE,
                    )
                if end > n:
                    need = end - pos
                    break
                first = data[pos]
                decode = self._table[first]
                packet = decode(self, first, data, body, end)
                packets.append(packet)
                if decode is _DECODE_PUBLISH and end - pos <= n - end and not packet.properties:
                    # the packets that repeat its header, decoded together
                    end = self._same_publishes(packet, data, pos, end, n, packets)
                pos = end
                if before_connect and self._connect_seen:
                    before_connect = False
                    max_size = self.max_packet_size
            if pos < n and self._table[data[pos]] is _CHECKING:
                # a packet waits for more bytes: its first byte may already
                # be one no packet starts with here (section 4.13)
                self._check_first(data[pos])
        except MalformedPacket as exc:
            exc.packets = packets
            raise
        if pos < n:
            self.partial = bytearray(memoryview(data)[pos:])
            self._need = need
        return packets

    def _decode(self, first: int, data: bytes, pos: int, end: int) -> Packet:
        """Decode one packet whose body is ``data[pos:end]``, whatever its
        first byte: :meth:`_check_first` makes the checks of type and flags
        that :func:`dispatch_table` makes once, for the bytes that table
        does not send straight to a decoder (before the level is known,
        CONNECT, and everything malformed, which raises there)."""
        self._check_first(first)
        ptype = first >> 4
        if ptype == 3:
            return self._decode_publish(first, data, pos, end)
        if ptype == 1:
            # the flags' rule depends on the protocol level, in the body
            return self._decode_connect(data, pos, end, first & 0x0F)
        return _DECODERS[ptype](self, first, data, pos, end)

    def _decode_first_connect(self, first: int, data: bytes, pos: int, end: int) -> Connect:
        """A CONNECT read by a server-side decoder before the protocol level
        is known (:func:`dispatch_table`'s entry for its first bytes then):
        of what :meth:`_check_first` checks, only that no CONNECT came
        before applies to it; that one is refused by :meth:`_decode`."""
        if self._connect_seen:
            return self._decode(first, data, pos, end)
        return self._decode_connect(data, pos, end, first & 0x0F)

    def _check_first(self, first: int) -> None:
        """Check the first byte of a fixed header on its own, before the
        rest of the packet is read: what it says is enough to refuse the
        packet (section 4.13).

        :param first: the packet type (high nibble) and flags (low nibble).
        :raises MalformedPacket: 0x82 Protocol Error for anything but
            CONNECT as a server's first packet [MQTT-3.1.0-1], a packet
            after an unsupported CONNECT, a second CONNECT [MQTT-3.1.0-2]
            and a packet type this side must not receive (section 2.1.2);
            0x81 Malformed Packet for the reserved type 0, AUTH before
            MQTT 5.0, PUBLISH with QoS 3 [MQTT-3.3.1-4] or with DUP and
            QoS 0 [MQTT-3.3.1-2], and fixed-header flags other than those
            of the type [MQTT-2.1.3-1] (MQTT 3.1 may set DUP on PUBREL,
            SUBSCRIBE and UNSUBSCRIBE).  CONNECT's flags are checked with
            its body: their rule depends on its protocol level.
        """
        ptype = first >> 4
        level = self._level
        if level is None:
            if not self.server_side:
                level = 4
            elif ptype != 1:
                if self._connect_seen:
                    raise MalformedPacket("no packet may follow an unsupported CONNECT", _PROTOCOL_ERROR)
                raise MalformedPacket("the first packet must be CONNECT [MQTT-3.1.0-1]", _PROTOCOL_ERROR)
        if ptype == 3:
            qos = (first >> 1) & 0x03
            if qos == 3:
                raise MalformedPacket("PUBLISH with QoS 3 [MQTT-3.3.1-4]")
            if first & 0x08 and not qos:
                raise MalformedPacket("PUBLISH with QoS 0 and DUP set [MQTT-3.3.1-2]")
            return
        if ptype == 0:
            raise MalformedPacket("packet type 0 is reserved")
        if ptype == 15 and level != MQTT_5:
            raise MalformedPacket("AUTH exists only in MQTT 5.0")
        # (PacketType is an IntEnum: the sets match the plain int)
        if ptype in (_NOT_TO_SERVER if self.server_side else _NOT_TO_CLIENT):
            side = "server" if self.server_side else "client"
            raise MalformedPacket(f"a {side} must not receive {_PACKET_TYPES[ptype].name}",
                                  _PROTOCOL_ERROR)
        flags = first & 0x0F
        if ptype == 1:
            if self._connect_seen:
                raise MalformedPacket("second CONNECT [MQTT-3.1.0-2]", _PROTOCOL_ERROR)
        elif ptype in _FLAGS_0010:
            if level == MQTT_3_1:
                flags &= 0x07  # MQTT 3.1 sets DUP on resent PUBREL/SUBSCRIBE/UNSUBSCRIBE
            if flags != 0x02:
                raise MalformedPacket(
                    f"{_PACKET_TYPES[ptype].name} fixed header flags must be 0010 [MQTT-2.1.3-1]")
        elif flags:
            raise MalformedPacket(
                f"{_PACKET_TYPES[ptype].name} fixed header flags must be 0 [MQTT-2.1.3-1]")

    def _decode_publish(self, first: int, data: bytes, pos: int, end: int) -> Publish:
        # topic names repeat: each distinct one is decoded and checked once
        # (QoS 3 and DUP with QoS 0 never reach here: _check_first refuses them)
        topics = self._topics
        qos = (first >> 1) & 0x03
        p = pos + 2
        if p > end:
            raise MalformedPacket("truncated topic name")
        p += (data[pos] << 8) | data[pos + 1]
        if p > end:
            raise MalformedPacket("truncated topic name")
        raw_topic = data[pos + 2:p]
        topic = topics.get(raw_topic)
        if topic is None:
            try:
                topic = raw_topic.decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedPacket("topic name is not well-formed UTF-8 [MQTT-1.5.4-1]") from None
            if "\x00" in topic:
                raise MalformedPacket("topic name contains U+0000 [MQTT-1.5.4-2]")
            if topics is _NO_TOPICS:
                topics = self._topics = {}
            elif len(topics) >= _TOPIC_CACHE_SIZE:
                topics.clear()
            topics[raw_topic] = topic
        if qos:
            if p + 2 > end:
                raise MalformedPacket("truncated packet identifier")
            pid = (data[p] << 8) | data[p + 1]
            if not pid:
                raise MalformedPacket("PUBLISH QoS > 0 with packet identifier 0 [MQTT-2.2.1-3]")
            p += 2
        else:
            pid = None
        if self._level == MQTT_5:
            if p < end and not data[p]:
                props = {}
                p += 1
            else:
                props, p = decode_properties(data, p, PacketType.PUBLISH, end)
                if self.server_side and Property.SUBSCRIPTION_IDENTIFIER in props:
                    raise MalformedPacket(
                        "a client must not send a Subscription Identifier [MQTT-3.3.4-6]", _PROTOCOL_ERROR
                    )
        else:
            props = {}
        return Publish(topic, data[p:end], qos, bool(first & 0x01), bool(first & 0x08), pid, props)

    def _same_publishes(self, packet: Publish, data: bytes, start: int, end: int, n: int,
                        packets: list) -> int:
        """After ``packet``, a PUBLISH without properties decoded from
        ``data[start:end]``, the complete packets of ``data[end:n]`` in a row
        whose bytes up to their payload are the same as its own but for the
        packet identifier (a client's run of messages to one topic, of one
        size): each then has its length, flags and topic name, and no
        properties, so they are decoded together, each as
        :meth:`_decode_publish` would (one :class:`~tbmq.mqtt.Publish`
        each, appended to ``packets``), the comparisons made per byte
        position for the whole run, not per packet.  A packet identifier 0
        ends the run (that packet is decoded alone and refused).

        :returns: the position after the last packet taken (``end`` when
            none is)."""
        size = end - start
        count = (n - end) // size
        qos = packet.qos
        payload = end - len(packet.payload)  # the payload's start
        pid_at = payload - (1 if self._level == MQTT_5 else 0) - 2
        # the fixed header and the topic name, then (5.0) the property length 0
        same = range(start, pid_at if qos else payload)
        if qos and self._level == MQTT_5:
            same = [*same, payload - 1]
        stop = end + count * size
        for at in same:
            column = data[at + size:stop + at - start:size]  # that byte of each packet after it
            count -= len(column.lstrip(data[at:at + 1]))  # (a run of its own value)
            if not count:
                return end
            stop = end + count * size
        offset = payload - start
        payloads = [data[at:at + size - offset] for at in range(end + offset, stop + offset, size)]
        if qos:
            at = pid_at + size
            words = bytearray(2 * count)
            words[0::2] = data[at:stop + at - start - size:size]
            words[1::2] = data[at + 1:stop + at - start - size + 1:size]
            pids = list(struct.unpack(f">{count}H", words))  # (big-endian)
            if 0 in pids:  # [MQTT-2.2.1-3]: decoded alone, and refused
                count = pids.index(0)
                if not count:
                    return end
                del pids[count:], payloads[count:]
                stop = end + count * size
        else:
            pids = repeat(None, count)
        packets += map(Publish, repeat(packet.topic, count), payloads, repeat(qos, count),
                       repeat(packet.retain, count), repeat(packet.dup, count), pids,
                       map(dict.copy, repeat(_NO_PROPERTIES, count)))
        return stop

    def _decode_connect(self, data: bytes, pos: int, end: int, header_flags: int) -> Connect:
        """CONNECT (section 3.1).  MQTT 3.1 (``MQIsdp``, level 3) had no
        rule about the fixed-header flags or the reserved connect flag, and
        old devices set them: for that level both are ignored, as Mosquitto
        does; 3.1.1 and 5.0 require them to be 0 [MQTT-2.1.3-1,
        MQTT-3.1.2-3].

        :param header_flags: the low nibble of the fixed header.
        :raises MalformedPacket: with ``connect_level`` set to the protocol
            level once the protocol name and level read are ones this
            decoder speaks, so that the server may answer a v5 client with
            CONNACK and the error's reason code [MQTT-4.13.1-1].
        """
        self._connect_seen = True  # (a second one: refused by _check_first)
        if data.startswith(_MQTT_NAME, pos, end):
            name, p = "MQTT", pos + 6
        else:
            name, p = decode_string(data, pos, end)
        _need(p < end, "truncated CONNECT")
        level = data[p]
        p += 1
        if (name, level) not in SUPPORTED_PROTOCOLS:
            _need(not header_flags, "CONNECT fixed header flags must be 0 [MQTT-2.1.3-1]")
            # The broker answers CONNACK 0x01 / 0x84 [MQTT-3.1.2-2].
            return Connect(protocol_name=name, protocol_level=level)
        name = _PROTOCOL_NAMES[name]  # the shared string, not this packet's copy
        try:
            return self._connect_fields(name, level, data, p, end, header_flags)
        except MalformedPacket as exc:
            exc.connect_level = level
            raise

    def _connect_fields(self, name: str, level: int, data: bytes, p: int, end: int,
                        header_flags: int) -> Connect:
        """The rest of a CONNECT of a supported protocol, from its Connect
        Flags on (sections 3.1.2.3 - 3.1.3); ``p`` is their offset.  (Its
        checks raise in line, without a call of ``_need`` each: one CONNECT
        per connection, nine checks.)"""
        lenient = level == MQTT_3_1
        if header_flags and not lenient:
            raise MalformedPacket("CONNECT fixed header flags must be 0 [MQTT-2.1.3-1]")
        v5 = level == MQTT_5
        if p + 3 > end:
            raise MalformedPacket("truncated CONNECT")
        flags = data[p]
        keep_alive = (data[p + 1] << 8) | data[p + 2]
        p += 3
        if flags & 0x01 and not lenient:
            raise MalformedPacket("CONNECT reserved flag set [MQTT-3.1.2-3]")
        will_flag = flags & 0x04
        will_qos = (flags >> 3) & 0x03
        will_retain = flags & 0x20
        if not will_flag:
            if will_qos:
                raise MalformedPacket("Will QoS without Will Flag [MQTT-3.1.2-11]")
            if will_retain:
                raise MalformedPacket("Will Retain without Will Flag [MQTT-3.1.2-13]")
        if will_qos == 3:
            raise MalformedPacket("Will QoS 3 [MQTT-3.1.2-12]")
        has_password = flags & 0x40
        has_username = flags & 0x80
        if not v5:
            if has_password and not has_username:
                raise MalformedPacket("password without user name [MQTT-3.1.2-22]")
        props: dict = _NO_PROPERTIES
        if v5:
            props, p = decode_properties(data, p, PacketType.CONNECT, end)
            if not props:
                props = _NO_PROPERTIES
        client_id, p = decode_string(data, p, end)
        will = None
        if will_flag:
            will_props: dict = {}
            if v5:
                will_props, p = decode_properties(data, p, WILL_PROPERTIES, end)
            will_topic, p = decode_string(data, p, end)
            will_payload, p = decode_binary(data, p, end)
            will = Will(will_topic, will_payload, will_qos, bool(will_retain), will_props)
        username = password = None
        if has_username:
            username, p = decode_string(data, p, end)
        if has_password:
            password, p = decode_binary(data, p, end)
        if p != end:
            raise MalformedPacket("bytes left over after CONNECT payload")
        # (the protocol_level setter's work, without its call: once per connection)
        self._level = level
        self._table = dispatch_table(self.server_side, level)
        return Connect(name, level, bool(flags & 0x02), keep_alive, client_id, will, username, password, props)

    def _decode_connack(self, first: int, data: bytes, pos: int, end: int) -> Connack:
        _need(end - pos >= 2, "truncated CONNACK")
        flags = data[pos]
        code = data[pos + 1]
        if self._level == MQTT_3_1:
            flags = 0  # 3.1: the first byte is reserved
        _need(not flags & 0xFE, "CONNACK reserved flags set [MQTT-3.2.2-1]")
        if self._level == MQTT_5:
            _reason(code, PacketType.CONNACK)
            props, p = decode_properties(data, pos + 2, PacketType.CONNACK, end)
            _need(p == end, "bytes left over after CONNACK")
            return Connack(bool(flags), code, props)
        _need(end - pos == 2, "CONNACK remaining length must be 2")
        _need(code <= 5, f"CONNACK return code {code} is reserved")
        return Connack(bool(flags), code)

    def _decode_suback(self, first: int, data: bytes, pos: int, end: int) -> Suback:
        pid = _packet_id(data, pos, end)
        p = pos + 2
        props: dict = {}
        if self._level == MQTT_5:
            props, p = decode_properties(data, p, PacketType.SUBACK, end)
            allowed = REASON_CODES[PacketType.SUBACK]
        else:
            allowed = _V3_SUBACK_CODES
        codes = list(data[p:end])
        for code in codes:
            _need(code in allowed, f"SUBACK reason code 0x{code:02x} not valid", _PROTOCOL_ERROR)
        return Suback(pid, codes, props)

    def _decode_subscribe(self, first: int, data: bytes, pos: int, end: int) -> Subscribe:
        pid = _packet_id(data, pos, end)
        p = pos + 2
        props: dict = {}
        subscriptions = []
        append = subscriptions.append
        if self._level == MQTT_5:
            props, p = decode_properties(data, p, PacketType.SUBSCRIBE, end)
            while p < end:
                topic_filter, p = decode_string(data, p, end)
                _need(p < end, "truncated subscription options")
                opts = data[p]
                p += 1
                _need(not opts & 0xC0, "subscription options reserved bits set [MQTT-3.8.3-5]")
                qos = opts & 0x03
                _need(qos != 3, "subscription QoS 3", _PROTOCOL_ERROR)
                retain_handling = (opts >> 4) & 0x03
                _need(retain_handling != 3, "Retain Handling 3", _PROTOCOL_ERROR)
                append(SubscriptionRequest(topic_filter, qos, bool(opts & 0x04), bool(opts & 0x08), retain_handling))
        else:
            while p < end:
                topic_filter, p = decode_string(data, p, end)
                _need(p < end, "truncated requested QoS")
                opts = data[p]
                p += 1
                _need(opts <= 2, "requested QoS byte invalid [MQTT-3.8.3-4]")
                append(SubscriptionRequest(topic_filter, opts))
        _need(bool(subscriptions), "SUBSCRIBE without topic filters [MQTT-3.8.3-2]", _PROTOCOL_ERROR)
        return Subscribe(pid, subscriptions, props)

    def _decode_unsubscribe(self, first: int, data: bytes, pos: int, end: int) -> Unsubscribe:
        pid = _packet_id(data, pos, end)
        p = pos + 2
        props: dict = {}
        if self._level == MQTT_5:
            props, p = decode_properties(data, p, PacketType.UNSUBSCRIBE, end)
        filters = []
        while p < end:
            topic_filter, p = decode_string(data, p, end)
            filters.append(topic_filter)
        _need(bool(filters), "UNSUBSCRIBE without topic filters [MQTT-3.10.3-2]", _PROTOCOL_ERROR)
        return Unsubscribe(pid, filters, props)

    def _decode_unsuback(self, first: int, data: bytes, pos: int, end: int) -> Unsuback:
        pid = _packet_id(data, pos, end)
        if self._level != MQTT_5:
            _need(end - pos == 2, "UNSUBACK remaining length must be 2")
            return Unsuback(pid)
        props, p = decode_properties(data, pos + 2, PacketType.UNSUBACK, end)
        codes = list(data[p:end])
        for code in codes:
            _reason(code, PacketType.UNSUBACK)
        return Unsuback(pid, codes, props)

    def _decode_pingreq(self, first: int, data: bytes, pos: int, end: int) -> Pingreq:
        _need(end == pos, "PINGREQ remaining length must be 0")
        return Pingreq()

    def _decode_pingresp(self, first: int, data: bytes, pos: int, end: int) -> Pingresp:
        _need(end == pos, "PINGRESP remaining length must be 0")
        return Pingresp()

    def _decode_disconnect(self, first: int, data: bytes, pos: int, end: int) -> Disconnect:
        if self._level != MQTT_5:
            _need(end == pos, "DISCONNECT remaining length must be 0")
            return Disconnect()
        code, props = _reason_and_props(data, pos, end, PacketType.DISCONNECT)
        return Disconnect(code, props)

    def _decode_auth(self, first: int, data: bytes, pos: int, end: int) -> Auth:
        code, props = _reason_and_props(data, pos, end, PacketType.AUTH)
        return Auth(code, props)


def _reason_and_props(data: bytes, pos: int, end: int, ptype: PacketType) -> tuple[int, dict]:
    """The optional reason code and properties of DISCONNECT / AUTH (sections
    3.14.2.1, 3.15.2.1): absent means 0 and no properties."""
    if pos == end:
        return 0, {}
    code = _reason(data[pos], ptype)
    if pos + 1 == end:
        return code, {}
    props, p = decode_properties(data, pos + 1, ptype, end)
    _need(p == end, f"bytes left over after {ptype.name}")
    return code, props


def _ack_decoder(cls, ptype: PacketType):
    of_packet_id = cls.of_packet_id

    def _decode_ack(self: Decoder, first: int, data: bytes, pos: int, end: int):
        if end - pos == 2:  # the usual case: the packet identifier alone
            pid = (data[pos] << 8) | data[pos + 1]
            if pid:
                return of_packet_id(pid)
        pid = _packet_id(data, pos, end)
        if end - pos == 2:
            return cls(pid)
        if self._level != MQTT_5:
            raise MalformedPacket(f"{ptype.name} remaining length must be 2")
        code = _reason(data[pos + 2], ptype)
        if end - pos == 3:
            return cls(pid, code)
        props, p = decode_properties(data, pos + 3, ptype, end)
        _need(p == end, f"bytes left over after {ptype.name}")
        return cls(pid, code, props)

    return _decode_ack


_DECODERS = (
    None,
    None,  # CONNECT is decoded before dispatch (its flags depend on its level)
    Decoder._decode_connack,
    None,  # PUBLISH is decoded before dispatch
    _ack_decoder(Puback, PacketType.PUBACK),
    _ack_decoder(Pubrec, PacketType.PUBREC),
    _ack_decoder(Pubrel, PacketType.PUBREL),
    _ack_decoder(Pubcomp, PacketType.PUBCOMP),
    Decoder._decode_subscribe,
    Decoder._decode_suback,
    Decoder._decode_unsubscribe,
    Decoder._decode_unsuback,
    Decoder._decode_pingreq,
    Decoder._decode_pingresp,
    Decoder._decode_disconnect,
    Decoder._decode_auth,
)


#: what :func:`dispatch_table` maps a byte to when it is not known valid
_CHECKING = Decoder._decode


#: the decoding function of a PUBLISH's first byte in :func:`dispatch_table`
_DECODE_PUBLISH = Decoder._decode_publish


@functools.cache
def dispatch_table(server_side: bool, level: int | None) -> tuple:
    """The decoding function of each first byte of a fixed header, made
    once per side and protocol level and shared by every decoder.

    A byte whose packet type may reach this side at ``level`` with the
    fixed-header flags that type requires [MQTT-2.1.3-1] (MQTT 3.1 may also
    set DUP on PUBREL, SUBSCRIBE and UNSUBSCRIBE) maps to that type's
    decoder, and so does a PUBLISH byte with a valid QoS and DUP bit
    [MQTT-3.3.1-2, MQTT-3.3.1-4]; while ``level`` is None, a server's
    CONNECT bytes map to :meth:`Decoder._decode_first_connect`.  Every
    other byte (all of them while ``level`` is None, CONNECT, whose flags'
    rule depends on the level in its body, and every malformed one) maps
    to :meth:`Decoder._decode`,
    which checks it again (:meth:`Decoder._check_first`) and raises the
    error; a decoder that waits for the rest of a packet whose first byte
    maps there checks that byte at once.

    :param server_side: decoding what a client sends to a server.
    :param level: 3, 4, 5 or None.
    :returns: a tuple of 256 functions ``f(decoder, first, data, pos, end)``
        returning the packet whose body is ``data[pos:end]``.
    """
    table = [Decoder._decode] * 256
    if level is None:
        if server_side:  # a server's first packet: a CONNECT is decoded at once
            table[0x10:0x20] = [Decoder._decode_first_connect] * 16
        return tuple(table)
    refused = _NOT_TO_SERVER if server_side else _NOT_TO_CLIENT
    for first in range(0x10, 0x100):
        ptype, flags = first >> 4, first & 0x0F
        if ptype == PacketType.PUBLISH:
            qos = (flags >> 1) & 0x03
            if qos != 3 and (qos or not flags & 0x08):
                table[first] = Decoder._decode_publish
        elif (ptype == PacketType.CONNECT or ptype in refused
              or (ptype == PacketType.AUTH and level != MQTT_5)):
            continue
        elif ptype in _FLAGS_0010:
            if (flags & 0x07 if level == MQTT_3_1 else flags) == 0x02:
                table[first] = _DECODERS[ptype]
        elif not flags:
            table[first] = _DECODERS[ptype]
    return tuple(table)
