"""The PUBLISH packets of one socket read handed to the pipeline together:
a session gathers the messages of a run of its client's PUBLISHes
(:meth:`tbmq.broker.session.Session.gather_publishes`, opened by the
connection for a read of several packets), and hands them on with **one**
``publish_many`` and one ``done`` when the run ends (the read ends, or a
packet that is not a PUBLISH comes, or an acknowledgement is queued out of
the run).  Their acknowledgements go into the session's
:class:`~tbmq.broker.publisher_acks.PublisherAcks` as one entry per run
of QoS 1 PUBLISHes (their packet ids) and one per QoS 2 one, and are sent
once the bus says the whole run is durable [MQTT-4.3.2-4, MQTT-4.3.3-8],
in the order of the PUBLISHes [MQTT-4.6.0-2]: one waiter, one answer and
one write of PUBACKs for the run instead of one each.
"""

from __future__ import annotations

from operator import attrgetter

from tbmq.broker.publish_done import LATER, WAITING
from tbmq.mqtt import Publish, Pubrec

__all__ = ["PublishRun", "plain_columns", "plain_run"]

_TOPIC, _PAYLOAD, _QOS, _RETAIN, _PACKET_ID, _PROPERTIES = map(attrgetter, (
    "topic", "payload", "qos", "retain", "packet_id", "properties"))


class PublishRun:
    """The messages of a run of one connection's PUBLISHes, in order, and
    what their acknowledgements are.

    :ivar conn: the publisher's :class:`~tbmq.broker.link.Link` (the live
        one when the run was opened).
    :ivar messages: :class:`~tbmq.model.Message` each, in order; the
        session appends each PUBLISH's here and its packet id to
        :attr:`packet_ids` (no call per message).
    :ivar packet_ids: the packet id of each of :attr:`messages` (None at
        QoS 0).
    :ivar qos2: True once one of :attr:`messages` is at QoS 2 (set by the
        session).
    :ivar entries: the acknowledgement entries of the run, in order, made
        when it is handed on (see :attr:`PublisherAcks.queue
        <tbmq.broker.publisher_acks.PublisherAcks.queue>`): ``[packet ids,
        ready, False]`` for QoS 1 PUBLISHes in a row (a list of ``int``),
        ``[Pubrec, ready, False]`` for a QoS 2 one.
    :ivar answer: :data:`~tbmq.broker.publish_done.WAITING`, what the bus
        answered during the call (None, or a
        :class:`~twisted.python.failure.Failure`), or
        :data:`~tbmq.broker.publish_done.LATER` once queued for a later one.
    :ivar acks: the session's
        :class:`~tbmq.broker.publisher_acks.PublisherAcks` (once handed on).
    :ivar link: the session's live link when it was handed on.
    :ivar qos0: True when one of :attr:`messages` is at QoS 0 (found when
        it is handed on).
    """

    __slots__ = ("conn", "messages", "packet_ids", "qos2", "entries", "answer", "acks",
                 "link", "qos0")

    def __init__(self, conn) -> None:
        self.conn = conn
        self.messages: list = []
        self.packet_ids: list = []
        self.qos2 = False
        self.entries: list = []
        self.answer = WAITING
        self.acks = None
        self.link = None
        self.qos0 = False

    def _entries(self) -> list:
        """The acknowledgement entries of :attr:`messages` (see :attr:`entries`)."""
        pids = self.packet_ids
        self.qos0 = None in pids  # (in C)
        if not self.qos2:
            if not self.qos0:  # all at QoS 1: one entry
                return [[pids, False, False]]
            pids = [pid for pid in pids if pid is not None]
            return [[pids, False, False]] if pids else []
        entries: list = []
        for message, pid in zip(self.messages, pids):
            qos = message.qos
            if qos == 1:
                if entries and type(entries[-1][0]) is list:
                    entries[-1][0].append(pid)
                else:
                    entries.append([[pid], False, False])
            elif qos == 2:
                entries.append([Pubrec(pid), False, False])
        return entries

    def hand_on(self, publish_many, acks, link) -> None:
        """``publish_many(messages, done)`` (the pipeline:
        :meth:`tbmq.broker.router.Router.publish_many`), then the
        acknowledgements: sent at once when the bus answered during the
        call, else queued until it does (:meth:`PublisherAcks.pending_run
        <tbmq.broker.publisher_acks.PublisherAcks.pending_run>`).

        :param acks: the session's
            :class:`~tbmq.broker.publisher_acks.PublisherAcks`.
        :param link: the session's live link now."""
        self.acks = acks
        self.link = link
        self.entries = self._entries()
        publish_many(self.messages, self.answered)
        answer = self.answer
        if answer is WAITING:  # the bus answers later
            acks.pending_run(self)
            return
        acks.run_answered(answer, self)

    def answered(self, failure=None) -> None:
        """The ``done`` of the run's publish: None (every message is
        durable), or the :class:`~twisted.python.failure.Failure` of a
        :class:`tbmq.errors.BusError`."""
        if self.answer is LATER:
            self.acks.run_answered(failure, self)
        else:
            self.answer = failure


def plain_run(packets, start: int, unacked: int, v5: bool, max_qos: int, retain_ok: bool,
              topics, allowed: dict, now: float, limit: int) -> tuple[int, int]:
    """The run of ``packets`` from ``start`` on that takes the plain way of
    :meth:`~tbmq.broker.session.Session.on_publish` and its runs'
    (:meth:`~tbmq.broker.session.Session.on_publishes`): PUBLISHes
    of QoS 0 or 1 within ``max_qos``, no properties (or 3.1.1), a topic
    name checked before (in ``topics``), RETAIN only where available,
    within the receive maximum (``unacked`` QoS 1 flows open, below
    ``limit``: [MQTT-3.3.4-9]), allowed by a fresh entry of the
    authorization cache ``allowed`` (topic -> ``(bool, until)``); the
    arguments after ``unacked`` are ``Session._plain_way()``'s.  Any
    other PUBLISH goes the whole way (each broken rule its reason code).

    :returns: ``(end, unacked)``: ``packets[start:end]`` take it, and
        ``unacked`` counts their QoS 1 ones too."""
    n = len(packets)
    i = start
    cached = allowed.get
    while i < n:
        packet = packets[i]
        if type(packet) is not Publish:
            break
        qos = packet.qos
        topic = packet.topic
        if (qos > max_qos or (v5 and packet.properties) or topic not in topics
                or (packet.retain and not retain_ok) or (qos and unacked >= limit)):
            break
        hit = cached(topic)
        if hit is None or hit[0] is not True or hit[1] <= now:
            break
        unacked += qos  # 0 or 1
        i += 1
    return i, unacked


#: the first stretch :func:`plain_columns` checks as columns (then twice as
#: many each time, up to :data:`_MOST`): a run that ends soon wastes little
_FIRST, _MOST = 16, 1024


def plain_columns(packets, start: int, unacked: int, v5: bool, max_qos: int, retain_ok: bool,
                  topics, allowed: dict, now: float, limit: int) -> tuple:
    """:func:`plain_run` (the same arguments, the same run), its packets'
    fields read as columns: the checks made on the columns of a stretch of
    packets, in C, once per field and once per distinct topic name, not
    per packet; in a stretch where one fails, :func:`plain_run` finds where
    the run ends.  The stretches grow from 16 packets to 1,024.

    :returns: ``(end, unacked, topics, payloads, qoss, retains,
        packet_ids)``: ``end`` and ``unacked`` as :func:`plain_run`'s, then
        one list per field of ``packets[start:end]``, in order."""
    names: list = []
    payloads: list = []
    qoss: list = []
    retains: list = []
    pids: list = []
    cached = allowed.get
    at, size, n = start, _FIRST, len(packets)
    while at < n:
        taken = packets[at:at + size]
        plain = set(map(type, taken)) == {Publish}
        if plain:
            levels = list(map(_QOS, taken))
            ones = levels.count(1)
            flags = list(map(_RETAIN, taken))
            plain = (max(levels) <= max_qos and unacked + ones <= limit
                     and (retain_ok or not any(flags))
                     and not (v5 and any(map(_PROPERTIES, taken))))
        if plain:
            stretch = list(map(_TOPIC, taken))
            for name in set(stretch):
                hit = cached(name)
                if name not in topics or hit is None or hit[0] is not True or hit[1] <= now:
                    plain = False
                    break
        if plain:
            unacked += ones
        else:  # the run ends in this stretch: where, plain_run says
            end, unacked = plain_run(taken, 0, unacked, v5, max_qos, retain_ok, topics,
                                     allowed, now, limit)
            taken = taken[:end]
            stretch = list(map(_TOPIC, taken))
            levels = list(map(_QOS, taken))
            flags = list(map(_RETAIN, taken))
        # the stretch's columns (the whole stretch, or its part in the run)
        names += stretch
        qoss += levels
        retains += flags
        payloads += map(_PAYLOAD, taken)
        pids += map(_PACKET_ID, taken)
        at += len(taken)
        if not plain:
            break
        if size < _MOST:
            size *= 2
    return at, unacked, names, payloads, qoss, retains, pids
