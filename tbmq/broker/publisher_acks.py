"""The acknowledgements a session owes its client's publishes (PUBACK,
PUBREC), sent in the order of the PUBLISHes [MQTT-4.6.0-2] once each
message is durable [MQTT-4.3.2-4, MQTT-4.3.3-8], and the count of the
publishes the bus has not answered yet (a publisher never fills memory).

The bus answers a QoS 1/2 publish once the message is durable: in the
embedded node, once the topic log committed the transaction that holds it
(an APPLICATION client's record), which answers every publish of that
commit in a row.  The first answer of a run at the head of the queue asks
for one flush when the turn ends; the PUBACKs ready then go out in one
write (:meth:`PublisherAcks.flush`), not one call and one write each.

A part the :class:`~tbmq.broker.session.Session` owns (``session.acks``),
made at its client's first PUBLISH: the session queues an acknowledgement with
:meth:`PublisherAcks.ack_when`, counts a publish the bus did not answer
during the call in :attr:`PublisherAcks.unaccepted` and queues its entry
(``Session._publish``, :meth:`PublisherAcks.pending`), and the bus's later answer comes to
:meth:`PublisherAcks.published` through the publish's
:class:`~tbmq.broker.publish_done.PublishDone`.
"""

from __future__ import annotations

from collections import deque

from tbmq.broker.publish_done import LATER
from tbmq.mqtt import MQTT_5, Puback, Pubrec, ReasonCode, is_failure
from tbmq.mqtt.codec import encode_puback, encode_pubacks, encode_pubrec

__all__ = ["PublisherAcks"]

#: ``ReasonCode.SUCCESS``, read once (a class attribute of an enum is a slow
#: lookup on the path of every acknowledgement)
_SUCCESS = ReasonCode.SUCCESS


class PublisherAcks:
    """The acknowledgements a :class:`~tbmq.broker.session.Session` owes
    its client, in order, and its publishes the bus has not answered yet.
    It sees the session through its public attributes only: ``ctx``
    (``mqtt.max_pending_messages``, ``flusher``, ``drops``), ``link`` (the
    live :class:`~tbmq.broker.link.Link`, or None), ``log``, ``client_id``,
    and the inbound QoS state it ends: ``inbound_unacked`` (QoS 1
    PUBLISHes not acknowledged yet, less one for each PUBACK sent) and
    ``inbound_qos2`` (a refused PUBREC ends its QoS 2 flow).

    :ivar session: the owning session.
    :ivar queue: the acknowledgements waiting for earlier ones: an empty
        tuple while none waits, a ``deque`` from the first
        (:meth:`waiting`).  An entry is ``[packet, ready, duplicate]``:
        ``packet`` a :class:`~tbmq.mqtt.Puback` or :class:`~tbmq.mqtt.Pubrec`
        to send, or the packet id (``int``) of a QoS 1 PUBLISH whose PUBACK
        is a success with no properties (no packet object per message).
    :ivar unaccepted: publishes handed to the bus and not answered yet
        (counted by :meth:`pending`, uncounted by :meth:`published`).
    :ivar spares: answered :class:`~tbmq.broker.publish_done.PublishDone`
        objects, reused by the session's next publishes (at most
        :data:`~tbmq.broker.publish_done.KEPT`; dropped at :meth:`detach`).
    :ivar reading_paused: True while the connection stops reading because
        of them (past ``mqtt.max_pending_messages``, or a QoS 0 one held
        back by a consumer), until half of them are answered.
    """

    __slots__ = ("session", "queue", "unaccepted", "reading_paused", "spares")

    def __init__(self, session) -> None:
        self.session = session
        # a deque (760 bytes) from the first waiting acknowledgement: waiting()
        self.queue: deque[list] | tuple = ()
        self.unaccepted = 0
        self.reading_paused = False
        self.spares: list = []

    def attach(self) -> None:
        """A new connection: the acknowledgements pending for the old one
        are void, and nothing of it is waited for."""
        self.queue = ()
        self.unaccepted = 0
        self.reading_paused = False

    def detach(self) -> None:
        """The connection is gone: its acknowledgements are void, and the
        spare dones go (an idle session keeps none)."""
        self.queue = ()
        spares, self.spares = self.spares, []
        for done in spares:
            done.close()

    def pending(self, done, conn, qos: int, packet_id: int | None, link) -> None:
        """A publish of ``conn`` that the bus did not answer during the call
        (``Session._publish``): counted in :attr:`unaccepted` (past
        ``mqtt.max_pending_messages`` of them, or at once for QoS 0, which
        waits for nothing but a held-back consumer, ``conn`` stops reading
        until half of them are answered: a publisher never fills memory),
        and at QoS 1/2 its acknowledgement queued, not ready.  Its ``done``
        (a :class:`~tbmq.broker.publish_done.PublishDone`) is told what its
        later answer is for (its ``entry``, ``conn``, ``accepting``), and
        hands that answer to :meth:`published`.

        :param done: the publish's :class:`~tbmq.broker.publish_done.PublishDone`.
        :param conn: the publisher's :class:`~tbmq.broker.link.Link`.
        :param qos: the PUBLISH's QoS (0, 1, 2).
        :param packet_id: its packet identifier (None at QoS 0).
        :param link: the session's live link now.
        """
        done.conn = link
        done.accepting = conn
        done.answer = LATER
        unaccepted = self.unaccepted = self.unaccepted + 1
        if (qos == 0 or unaccepted >= self.session.ctx.mqtt.max_pending_messages) \
                and not self.reading_paused:
            self.reading_paused = True
            conn.pause_reading()
        if not qos:
            done.entry = None
            return
        # a QoS 1 one as its packet id: a PUBACK with success, unless
        # refused (_ack_refused)
        entry = [packet_id if qos == 1 else Pubrec(packet_id), False, False]
        queue = self.queue
        if not queue:  # (the check of waiting(), which makes the deque)
            queue = self.waiting()
        queue.append(entry)
        done.entry = entry

    def _accepted(self, value, conn):
        """The bus answered one publish that it did not accept during the
        call (counted by :meth:`pending`): success or failure,
        ``value`` passes through."""
        self.unaccepted -= 1
        if self.reading_paused:
            session = self.session
            ctx = session.ctx
            if self.unaccepted <= ctx.mqtt.max_pending_messages // 2:
                self.reading_paused = False
                # not from inside the consumer that accepted it: the packets
                # read meanwhile are handled when this turn ends
                ctx.flusher.later(lambda: session.link is conn and conn.resume_reading())
        return value

    def _qos0_refused(self, failure, conn) -> None:
        self._accepted(None, conn)
        session = self.session
        session.log.failure("QoS 0 message of {client_id} not accepted", failure,
                            client_id=session.client_id)

    # -- acknowledgements to the client, in order ---------------------------------------

    def ack_when(self, result, packet, duplicate: bool = False, accepting=None) -> None:
        """Send ``packet`` (PUBACK or PUBREC) when ``result`` (None or a
        Deferred) is done, after every ack queued before it [MQTT-4.6.0-2].
        If the Deferred fails, the message was not accepted (the bus is
        unreachable or refused it): a v5 client gets the PUBACK / PUBREC
        with 0x83 Implementation specific error, in its turn, and may send
        the message again; a v3 client, which has no negative
        acknowledgement, is disconnected without one, so it resends the
        message when it reconnects [MQTT-4.4.0-1].

        :param accepting: the connection whose publish ``result`` is, counted
            by :meth:`pending` (its answer also counts for
            :meth:`_accepted`), or None.
        """
        if result is None and not self.queue:
            self._send_ack(packet, duplicate)
            return
        entry = [packet, result is None, duplicate]
        self.waiting().append(entry)
        link = self.session.link
        if result is not None:
            args = (entry, link, accepting)
            result.addCallbacks(self._ack_ready, self._ack_refused, callbackArgs=args,
                                errbackArgs=args)
        else:
            self.flush(link)

    def published(self, failure, entry: list | None, conn, accepting) -> None:
        """The bus answered a publish of ``Session._publish`` that it did
        not hold during the call (``failure``: None, or a
        :class:`~twisted.python.failure.Failure` of why it refused it);
        ``entry`` is its acknowledgement in :attr:`queue` (None at QoS 0),
        queued while ``conn`` was the live link, for the publisher
        connection ``accepting`` (called by
        :class:`~tbmq.broker.publish_done.PublishDone`)."""
        if entry is None:
            if failure is None:
                self._accepted(None, accepting)
            else:
                self._qos0_refused(failure, accepting)
        elif failure is None:
            if self.reading_paused:
                self._accepted(None, accepting)
            else:
                self.unaccepted -= 1  # (what _accepted does then)
            entry[1] = True
            acks = self.queue
            if acks and acks[0] is entry:
                session = self.session
                if session.link is conn:
                    # the first of a run that the bus answers together (a
                    # commit of the topic log): sent together when the turn
                    # ends, in one write (the ones answered meanwhile behind it)
                    session.ctx.flusher.later(self.flush)
        else:
            self._ack_refused(failure, entry, conn, accepting)

    def pending_run(self, run) -> None:
        """A :class:`~tbmq.broker.publish_run.PublishRun` that the bus did
        not answer during the call: as :meth:`pending` for each of its
        messages, with one count and its entries queued together; its
        later answer comes to :meth:`run_answered`."""
        run.answer = LATER
        conn = run.conn
        n = len(run.messages)
        unaccepted = self.unaccepted = self.unaccepted + n
        if (run.qos0 or unaccepted >= self.session.ctx.mqtt.max_pending_messages) \
                and not self.reading_paused:
            self.reading_paused = True
            conn.pause_reading()
        if run.entries:
            queue = self.queue
            if not queue:
                queue = self.waiting()
            queue.extend(run.entries)

    def run_answered(self, failure, run) -> None:
        """The bus answered a :class:`~tbmq.broker.publish_run.PublishRun`
        (``failure``: None, or the
        :class:`~twisted.python.failure.Failure` of why it refused it),
        during the call or later (:meth:`pending_run`): its
        acknowledgements are ready, sent in their turn; refused, each is as
        :meth:`_ack_refused` says."""
        conn = run.conn
        entries = run.entries
        later = run.answer is LATER
        if later:
            if self.reading_paused:
                self.unaccepted -= len(run.messages) - 1
                self._accepted(None, conn)
            else:
                self.unaccepted -= len(run.messages)
        if failure is not None:
            self._run_refused(failure, run, later)
            return
        for entry in entries:
            entry[1] = True
        if not later:
            if not entries:
                return
            if self.queue:
                self.queue.extend(entries)
                self.flush(run.link)
                return
            session = self.session
            link = session.link
            if link is not run.link or link is None:
                return
            for packet, _, _ in entries:
                if type(packet) is list:
                    self._send_pubacks(link, packet)
                else:
                    self._send_ack(packet)
            return
        acks = self.queue
        if entries and acks and acks[0] is entries[0] and self.session.link is run.link:
            # sent together when the turn ends (see published)
            self.session.ctx.flusher.later(self.flush)

    def _run_refused(self, failure, run, queued: bool) -> None:
        session = self.session
        if run.qos0:
            session.log.failure("QoS 0 message of {client_id} not accepted", failure,
                                client_id=session.client_id)
        entries = run.entries
        if not entries:
            return
        drops = session.ctx.drops
        for entry in entries:
            for _ in (entry[0] if type(entry[0]) is list else (entry,)):
                drops.refused(failure)
        conn = run.link
        if conn is not None and conn.protocol_level >= MQTT_5:
            code = ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
            for entry in entries:
                packet = entry[0]
                entry[0] = (tuple(Puback(pid, code) for pid in packet) if type(packet) is list
                            else type(packet)(packet.packet_id, code))
                entry[1] = True
            if not queued:
                self.waiting().extend(entries)
            self.flush(conn)
            return
        if session.link is conn and conn is not None:
            conn.disconnect(ReasonCode.UNSPECIFIED_ERROR)
        self.queue = ()

    def _ack_ready(self, _result, entry: list, conn, accepting) -> None:
        if accepting is not None:
            self._accepted(None, accepting)
        entry[1] = True
        self.flush(conn)

    def _ack_refused(self, failure, entry: list, conn, accepting) -> None:
        if accepting is not None:
            self._accepted(None, accepting)
        session = self.session
        session.ctx.drops.refused(failure)
        if conn is not None and conn.protocol_level >= MQTT_5:
            packet = entry[0]
            entry[0] = (Puback(packet, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
                        if type(packet) is int else
                        type(packet)(packet.packet_id, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR))
            entry[1] = True
            self.flush(conn)
            return
        if session.link is conn and conn is not None:
            conn.disconnect(ReasonCode.UNSPECIFIED_ERROR)
        self.queue = ()

    def waiting(self) -> deque:
        """:returns: :attr:`queue`, the acknowledgements waiting for earlier
        ones, made at the first (an idle session holds an empty tuple)."""
        acks = self.queue
        if not isinstance(acks, deque):
            acks = self.queue = deque()
        return acks

    def flush(self, conn=None) -> None:
        """Send the acknowledgements ready at the head of :attr:`queue`, on
        ``conn`` (a :class:`~tbmq.broker.link.Link`; default: the live one;
        one that is not live any more sends nothing): the PUBACKs in a row
        (an entry of a packet id) in one write."""
        acks = self.queue
        link = self.session.link
        if conn is None:
            conn = link
        live = link is conn and conn is not None
        pids = None
        while acks and acks[0][1]:
            packet, _, duplicate = acks.popleft()
            if not live:
                continue
            kind = type(packet)
            if kind is int:  # PUBACK, success: ends an inbound QoS 1 flow
                if pids is None:
                    pids = [packet]
                else:
                    pids.append(packet)
                continue
            if kind is list:  # a run's PUBACKs (PublishRun), success
                if pids is None:
                    pids = packet
                else:
                    pids.extend(packet)
                continue
            if pids is not None:
                self._send_pubacks(conn, pids)
                pids = None
            if kind is tuple:  # a run's refused PUBACKs
                for one in packet:
                    self._send_ack(one)
                continue
            self._send_ack(packet, duplicate)
        if pids is not None:
            self._send_pubacks(conn, pids)

    def _send_pubacks(self, conn, pids: list) -> None:
        """PUBACK with success for each of ``pids`` (packet ids), in one write."""
        self.session.inbound_unacked -= len(pids)
        conn.write(encode_pubacks(pids))

    def _send_ack(self, packet, duplicate: bool = False) -> None:
        session = self.session
        conn = session.link
        if conn is None:
            return
        is_puback = type(packet) is Puback
        if is_puback:  # PUBACK ends an inbound QoS 1 flow
            session.inbound_unacked -= 1
        elif is_failure(packet.reason_code) and not duplicate:
            # a refused QoS 2 PUBLISH ends its flow with the PUBREC [MQTT-4.3.3-9]
            if packet.packet_id in session.inbound_qos2:
                session.inbound_qos2.discard(packet.packet_id)
        if packet.reason_code == _SUCCESS and not packet.properties:
            conn.write(encode_puback(packet.packet_id) if is_puback
                       else encode_pubrec(packet.packet_id))
        else:
            conn.send(packet)
