"""The outbound half of a session: QoS flows towards the client, the inflight
window, the queue, and flow control (MQTT 5.0 §4.3, §4.4, §4.9).

Flow control (ARCHITECTURE §1, "nothing acknowledged is dropped, nobody is
held for long"):

* The queue of a session is bounded in messages and bytes.  Above the
  high-water mark (``mqtt.max_pending_messages`` / ``max_pending_bytes`` for
  a non-persistent session) a delivery *holds* the source that handed it
  over (a bus consumer, see :mod:`tbmq.broker.outbound`): the source is
  paused until the queue drains to half the mark.  A full socket holds
  sources the same way for QoS 0.
* Holding is bounded by the session's :class:`~tbmq.broker.outbound.HoldCredit`
  (``mqtt.outbound_pause_timeout`` seconds, refilled over ten times that);
  a hold shorter than a tenth of it costs nothing, so a subscriber that
  reads as fast as it can but slower than its publishers send holds them
  to its pace for as long as it goes on reading.
  Past it the session is *slow*: it holds nobody; its QoS 0 messages are
  dropped (counted) while its socket is full; a non-persistent session whose
  queue overflows is disconnected with QUOTA_EXCEEDED (0x97) and its losses
  counted — never a message acknowledged to its publisher and silently
  dropped while the subscriber believes it is subscribed.
* A persistent session never holds anyone: its messages are in the device
  store before they reach it, so memory keeps at most
  ``mqtt.max_queued_messages`` of them (and ``max_pending_bytes``); the rest
  stay on disk (*paged out*) and are read back a page at a time as the
  queue drains.  An offline persistent session keeps nothing in memory.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from operator import attrgetter

from twisted.internet import defer
from twisted.logger import Logger

from tbmq.backends.deliveries import update_many
from tbmq.broker.holding import NO_SOURCES, SourceHolds
from tbmq.broker.sending import encode_for
from tbmq.broker.sent_states import SentStates
from tbmq.broker.store_reads import StoreReader, delivery_size, runs_size
from tbmq.broker.topic_aliases import TopicAliases
from tbmq.cluster.completion import Progress, finished_runs
from tbmq.cluster.record_types import DeliveryRun
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import DeliveryState, Message, StoredDelivery
from tbmq.mqtt import MQTT_5, Pubrel, ReasonCode
from tbmq.mqtt.codec import encode_publish_run, publish_with_packet_id

_SENT = DeliveryState.SENT
#: a delivery's order key (called by map, in C)
_SEQ = attrgetter("seq")
_RELEASED = DeliveryState.RELEASED
#: an empty queue before the first delivery that waits (a deque is 760
#: bytes; an idle session keeps none): see :meth:`Outbox._queue_to_fill`
NO_QUEUE: tuple = ()
#: an empty mapping shared by the outboxes that have none of their own yet
#: (``inflight``, ``dropped``, ``_app_done``): never written, a dict is made at the first
#: entry (an empty dict is 64 bytes)
NO_ENTRIES: dict = {}
#: the time of the last log line about drops before the first
NEVER = float("-inf")


class Outbox:
    """The outbound part of a :class:`tbmq.broker.session.Session`, which
    owns it: the inflight window, packet identifiers, the queue, holds of
    the sources that feed it, drops.

    :param session: the owner (its ``ctx``, ``client_id``, ``persistent``,
        ``session_id``); passed to the hooks and the node's limits.
    :param now: seconds since the epoch (the hold credit starts full).

    :ivar inflight: packet id → delivery sent and not yet acknowledged, in
        send order.
    :ivar queue: deliveries waiting for the inflight window.
    :ivar queued_bytes: what :func:`delivery_size` counts for ``queue``.
    :ivar slow: True once the session used up its hold credit and is still
        congested.
    :ivar paged_out: a persistent session's newer deliveries wait in the
        device store, not in ``queue``.
    :ivar dropped: reason → messages not delivered to this session.
    """

    log = Logger(observer=LOG_OBSERVER)

    # one per session: attributes in slots (the store reads' too)
    __slots__ = tuple("""session ctx client_id persistent link inflight queue queued_bytes
        _next_packet_id _max_inflight _completed _updates slow overflowed holder paged_out _last_seq reader
        _app_done dropped _drop_logged_at _drops_logged sent_aliases _traffic _latency _sent
        _sent_bytes sent_states pump_asked""".split())

    #: seconds between two log lines about drops for one session
    DROP_LOG_INTERVAL = 10.0

    def __init__(self, session, now: float) -> None:
        #: the owner, passed to the hooks and limits
        self.session = session
        ctx = self.ctx = session.ctx
        self.client_id = session.client_id
        self.persistent = session.persistent
        #: the :class:`~tbmq.broker.link.Link` of the live connection, or
        #: None while the session is offline
        self.link = None
        mqtt = ctx.mqtt
        # a dict from the first QoS 1/2 PUBLISH sent (an empty one is 64 bytes)
        self.inflight: dict[int, StoredDelivery] = NO_ENTRIES
        self.queue: deque[StoredDelivery] | tuple = NO_QUEUE  # a deque from the first wait
        self.queued_bytes = 0
        self._next_packet_id = 1
        self._max_inflight = mqtt.max_inflight_messages
        self._completed: list[int] | tuple = ()  # a list from the first
        self._updates: list[tuple] | tuple = ()  # (seq, packet id, state): a list from the first
        self.slow = False
        #: disconnected with QUOTA_EXCEEDED: what still comes before the close is
        #: lost, counted
        self.overflowed = False
        #: the :class:`~tbmq.broker.holding.SourceHolds`, made at the first hold
        self.holder: SourceHolds | None = None
        self.paged_out = False
        self._last_seq = 0
        #: a persistent session's :class:`~tbmq.broker.store_reads.StoreReader`,
        #: made at its first read (:meth:`store_reader`), else None
        self.reader: StoreReader | None = None
        #: id(delivery) → what its ``tbmq.msg.app`` record commits on: the
        #: Deferred of :meth:`deliver_app`, or ``(Progress, index)`` of
        #: :meth:`deliver_app_batch`
        self._app_done: dict[int, defer.Deferred | tuple] = NO_ENTRIES
        self.dropped: dict[str, int] = NO_ENTRIES
        self._drop_logged_at = NEVER
        self._drops_logged: dict[str, int] = NO_ENTRIES
        #: the topic aliases given on the current connection, or None when
        #: it takes none (``mqtt.outbound_topic_aliases``)
        self.sent_aliases: TopicAliases | None = None
        # the node's counters (tbmq.broker.traffic), held here: one list
        # index and one add per PUBLISH
        traffic = self._traffic = ctx.traffic
        #: the latency histogram, or None when nothing reads it
        self._latency = traffic.latency if traffic.observe_latency else None
        self._sent = traffic.sent
        self._sent_bytes = traffic.sent_bytes
        #: the :class:`~tbmq.broker.sent_states.SentStates` of a persistent
        #: session's QoS 1 deliveries, made at the first, else None
        self.sent_states: SentStates | None = None
        #: a pump is asked for the end of this turn (:meth:`ask_pump`)
        self.pump_asked = False

    # -- limits ------------------------------------------------------------------

    @property
    def queue_limit(self) -> int:
        """Messages the queue holds in memory at most (the high-water mark)."""
        mqtt = self.ctx.mqtt
        return mqtt.max_queued_messages if self.persistent else mqtt.max_pending_messages

    def _full(self) -> bool:
        return (len(self.queue) >= self.queue_limit
                or self.queued_bytes >= self.ctx.mqtt.max_pending_bytes)

    def _drained(self) -> bool:
        """At or below the low-water mark: half the high-water mark."""
        return (len(self.queue) <= self.queue_limit // 2
                and self.queued_bytes <= self.ctx.mqtt.max_pending_bytes // 2)

    def _queue_to_fill(self) -> deque:
        """:returns: :attr:`queue`, a deque made at the first delivery that
        waits (an idle session holds an empty tuple)."""
        queue = self.queue
        if type(queue) is not deque:
            queue = self.queue = deque()
        return queue

    def _clear_queue(self) -> None:
        """Empty :attr:`queue` (a loop that holds it stops) and give its
        memory back."""
        queue = self.queue
        if queue:
            queue.clear()
        self.queue = NO_QUEUE

    def _window(self) -> int:
        conn = self.link
        if conn is None:
            return 0
        quota = conn.send_quota
        limit = self._max_inflight
        return quota if quota < limit else limit

    # -- drops -----------------------------------------------------------------------

    def drop(self, reason: str, message: Message | None = None, count: int = 1) -> None:
        """Count ``count`` messages not delivered to this session.  The first
        drop is logged at once, then the totals at most every
        :attr:`DROP_LOG_INTERVAL` seconds while drops go on."""
        dropped = self.dropped
        if dropped is NO_ENTRIES:
            dropped = self.dropped = {}
        dropped[reason] = dropped.get(reason, 0) + count
        self.ctx.drops.add(reason, count)
        now = self.ctx.clock.seconds()
        if now >= self._drop_logged_at + self.DROP_LOG_INTERVAL:
            logged = self._drops_logged
            new = {reason: n - logged.get(reason, 0)
                   for reason, n in dropped.items() if n != logged.get(reason, 0)}
            if new:
                self._drop_logged_at = now
                self._drops_logged = dict(dropped)
                self.log.warn("dropped messages for {client_id}: {new} since the last report, "
                              "{dropped} in all", client_id=self.client_id, new=new,
                              dropped=dict(dropped))
        if self.ctx.hooks.wants_dropped and message is not None:
            self.ctx.hooks.message_dropped(self.session, message, reason)

    # -- packet identifiers -------------------------------------------------------

    def _packet_id(self) -> int:
        pid = self._next_packet_id
        inflight = self.inflight
        if pid in inflight:
            for _ in range(65535):
                if pid not in inflight:
                    break
                pid = pid + 1 if pid < 65535 else 1
            else:  # pragma: no cover - the window is at most 65535
                raise RuntimeError("no free packet identifier")
        self._next_packet_id = pid + 1 if pid < 65535 else 1
        return pid

    # -- delivering -------------------------------------------------------------------

    def deliver(self, message: Message, qos: int, retain: bool,
                subscription_ids: tuple[int, ...], cache: dict | None, now: float,
                source=None) -> None:
        """Deliver ``message`` at ``qos`` (already the minimum of the
        message's and the subscription's [MQTT-3.8.4-8]) to a live
        non-persistent session, or QoS 0 to any session.

        :param cache: shared by the targets of one message (None for a
            single target): the encoded PUBLISH per (QoS, retain, v5,
            identifiers) with the packet identifier patched per delivery.
        :param now: seconds since the epoch.
        :param source: what handed the message over (a bus consumer, with
            ``pause()``/``resume()``), held while this session is congested;
            None for a retained message replayed at SUBSCRIBE.
        """
        if message.expires_at is not None and message.expires_at <= now:
            self.drop("expired", message)
            return
        conn = self.link
        if conn is None:
            if self.persistent and qos == 0:
                self.drop("offline_qos0", message)
            return
        limits = self.ctx.limits_out
        if limits is not None and not limits.admit_outgoing(self.session, qos, message):
            return
        if qos == 0:
            paused = conn.paused
            if paused and (self.slow or conn.paused_bytes > self.ctx.mqtt.max_outbound_buffer):
                if not self.slow:
                    self.became_slow()  # past max_outbound_buffer on a full socket
                self.drop("slow_consumer", message)
                return
            data = self._encoded(message, 0, retain, subscription_ids, cache, now, conn, False, 0)
            if data is not None:
                conn.write(data)
                if paused and source not in (
                        NO_SOURCES if self.holder is None else self.holder.holding) \
                        and conn.paused_bytes >= self.ctx.mqtt.max_outbound_buffer // 4:
                    # a full socket past a quarter of the buffer: hold the source
                    # (a shorter burst is only buffered)
                    self._hold(source, now)
                if self.ctx.hooks.wants_delivered:
                    self.ctx.hooks.message_delivered(self.session, message, 0)
            return
        delivery = StoredDelivery(0, message, qos, retain, subscription_ids)
        if not self.queue and not conn.paused and not self.overflowed:
            quota = conn.send_quota
            limit = self._max_inflight
            if len(self.inflight) < (quota if quota < limit else limit):
                self._send_run((delivery,), now, conn, cache)  # the usual case
                return
        self._offer(delivery, cache, now, source, conn)

    def deliver_stored(self, delivery: StoredDelivery, cache: dict | None = None,
                       now: float | None = None, source=None) -> None:
        """Deliver a persistent session's ``delivery``, which the device
        store already has (or is writing): sent when the window allows,
        else queued in memory up to :attr:`queue_limit`, else left in the
        store (paged out) until the queue drains.  One older than what
        this connection took already is left to the store
        (:meth:`~tbmq.broker.store_reads.StoreReader.behind`)."""
        conn = self.link
        if conn is None:
            return
        if now is None:
            now = self.ctx.clock.seconds()
        if self.paged_out:
            reader = self.store_reader()
            if reader.loading:
                arrived = reader.arrived
                if not arrived:
                    arrived = reader.arrived = []
                arrived.append(delivery)
            elif self._drained():
                reader.page_in()
            return
        if delivery.seq <= self._last_seq:
            # read from the store already, or not shown by it
            self.store_reader().behind(delivery)
            return
        self._offer(delivery, cache, now, source, conn)

    def deliver_app(self, d, source) -> defer.Deferred | None:
        """Deliver a record of ``tbmq.msg.app.<clientId>`` (a
        :class:`tbmq.cluster.records.Delivery`) to this persistent
        APPLICATION session.

        :param source: the session's own consumer: held while the queue is
            full, for as long as it takes (it feeds nobody else; the topic
            keeps what waits).
        :returns: a Deferred that fires once the client acknowledged it (the
            record is then committed), or None when it needs no
            acknowledgement (QoS 0, expired, too large for the client).
        """
        if type(d) is DeliveryRun:  # several messages: done once each is (a Progress)
            return self.deliver_app_batch((d,), source)
        conn = self.link
        if conn is None:
            return defer.Deferred()  # never fires: the record stays uncommitted
        now = self.ctx.clock.seconds()
        if d.qos == 0:
            self.deliver(d.message, 0, d.retain, d.subscription_ids, None, now, source)
            return None
        delivery = StoredDelivery(0, d.message, d.qos, d.retain, d.subscription_ids)
        app_done = self._app_done
        if app_done is NO_ENTRIES:
            app_done = self._app_done = {}
        done = app_done[id(delivery)] = defer.Deferred()
        self._offer(delivery, None, now, source, conn)
        return done

    def deliver_app_batch(self, deliveries, source) -> Progress | defer.Deferred:
        """Deliver several records of ``tbmq.msg.app.<clientId>`` (or of a
        shared application topic) in order, as :meth:`deliver_app` each,
        with one :class:`~tbmq.cluster.completion.Progress` for all of them:
        the consumer commits up to the first one not finished, so that a
        connection that ends in the middle of the batch leaves exactly the
        unacknowledged ones (and those after them) to the next.

        :param deliveries: :class:`tbmq.cluster.records.Delivery` objects,
            or :class:`tbmq.cluster.records.DeliveryRun` s (one Kafka record
            of several messages, in order: ``docs/bus.md``, "Runs of an
            APPLICATION client").
        :param source: as for :meth:`deliver_app`.
        :returns: a :class:`~tbmq.cluster.completion.Progress` whose record
            ``i`` finishes once the client acknowledged delivery ``i`` (each
            message of a run: :meth:`Progress.parts
            <tbmq.cluster.completion.Progress.parts>`) (PUBACK, PUBCOMP), at
            once for one that needs no acknowledgement (QoS 0, expired, too
            large for the client), or a Deferred that never fires when the
            session has no connection (they stay uncommitted).
        """
        conn = self.link
        if conn is None:
            return defer.Deferred()  # never fires: the records stay uncommitted
        now = self.ctx.clock.seconds()
        progress = Progress(len(deliveries))
        app_done = self._app_done
        if app_done is NO_ENTRIES:
            app_done = self._app_done = {}
        window = self._window()
        # the usual case, as _offer's first: what the window takes (its room looked at
        # before a first QoS 1/2 send) is sent now (no sequence number to keep), in one
        # run (one _send_run, one encoding call, one write), before what must follow it
        run, room = [], None
        for i, d in enumerate(deliveries):
            qos, retain, sids = d.qos, d.retain, d.subscription_ids
            messages = d.messages if type(d) is DeliveryRun else (d.message,)
            if qos:  # a run's record: once each of its messages is acknowledged
                progress.parts(i, len(messages))
            if qos == 0:
                if run:
                    self._send_run(run, now, conn)
                    run = []
                for message in messages:
                    self.deliver(message, 0, retain, sids, None, now, source)
                progress.finished(i)  # nothing to wait for
                room = None
                continue
            if room is None:
                room = (0 if self.queue or conn.paused or self.overflowed
                        else window - len(self.inflight))
            # the record's deliveries made, and each given its record, by map (in C)
            made = list(map(StoredDelivery, repeat(0), messages, repeat(qos), repeat(retain),
                            repeat(sids)))
            app_done.update(zip(map(id, made), repeat((progress, i))))
            taken = made[:room] if room > 0 else ()
            run += taken
            room -= len(taken)
            if len(taken) < len(made):  # the rest as _offer says, after the run
                if run:
                    self._send_run(run, now, conn)
                    run = []
                for delivery in made[len(taken):]:
                    self._offer(delivery, None, now, source, conn)
        if run:
            self._send_run(run, now, conn)
        return progress

    def _offer(self, delivery: StoredDelivery, cache, now: float, source, conn) -> None:
        if self.overflowed:
            self.drop("quota_exceeded", delivery.message)
            return
        inflight = self.inflight
        queue = self.queue
        if not queue and not conn.paused and len(inflight) < self._window():
            if delivery.seq > self._last_seq:
                self._last_seq = delivery.seq
            self._send_run((delivery,), now, conn, cache)
            return
        if self._full():
            if id(delivery) in self._app_done:
                self._holder(now).add(source)  # its own topic keeps what waits
            elif self.persistent:
                self.paged_out = True  # it waits in the store
                return
            elif not self._hold(source, now):
                self._overflow(delivery.message)
                return
        if delivery.seq > self._last_seq:
            self._last_seq = delivery.seq
        if type(queue) is not deque:
            queue = self._queue_to_fill()
        queue.append(delivery)
        self.queued_bytes += delivery_size(delivery)
        if not self.persistent and source is not None and self._full():
            self._hold(source, now)  # at the high-water mark: hold what feeds us

    def _send_run(self, deliveries, now: float, conn, cache: dict | None = None) -> int:
        """Write ``deliveries`` (in order), each with a new packet id: their
        PUBLISHes in one write, the SENT states of those of the device store
        held together (QoS 1, :class:`~tbmq.broker.sent_states.SentStates`)
        or written with the turn's writes (QoS 2, :meth:`store_update`).
        The sends of one pump, or one delivery sent at once (a run of one:
        the only way a QoS 1/2 PUBLISH is sent the first time).  One that
        cannot be sent (expired, too large for the client) is finished
        (:meth:`_finished`).

        :param deliveries: :class:`~tbmq.model.StoredDelivery` objects of
            QoS 1 or 2 (a sequence), none in flight.
        :param now: seconds since the epoch.
        :param cache: the encodings shared by the targets of one message
            (see :meth:`deliver`), or None.
        :returns: how many were sent (now in flight)."""
        inflight = self.inflight
        if inflight is NO_ENTRIES:
            inflight = self.inflight = {}
        level = conn.protocol_level
        # without topic aliases, a shared encoding nor a maximum packet size,
        # the PUBLISHes below v5 are counted here (as _encoded does) and
        # encoded together at the end (encode_publish_run): no call per delivery
        direct = (cache is None and self.sent_aliases is None and level < MQTT_5
                  and conn.max_packet_size is None)
        counts = self._sent
        volumes = self._sent_bytes
        traffic = self._traffic if self._latency is not None else None
        datas = []  # the PUBLISHes, or with direct their fields
        held = None  # (seq, packet id) of the QoS 1 deliveries of the store: a list from the first
        for delivery in deliveries:
            message = delivery.message
            expires_at = message.expires_at
            if expires_at is not None and expires_at <= now:
                self.drop("expired", message)
                self._finished(delivery)
                continue
            pid = self._next_packet_id
            if pid in inflight:
                pid = self._packet_id()
            else:
                self._next_packet_id = pid + 1 if pid < 65535 else 1
            qos = delivery.qos
            if direct:
                payload = message.payload
                data = (message.topic, payload, qos, delivery.retain, pid)
                counts[qos] += 1
                volumes[qos] += len(payload)
                if traffic is not None and not delivery.retain:
                    traffic.observe(message.received_at, now)
            else:
                data = self._encoded(message, qos, delivery.retain, delivery.subscription_ids,
                                     cache, now, conn, False, pid)
                if data is None:
                    self._finished(delivery)
                    continue
            delivery.packet_id = pid
            delivery.state = _SENT
            inflight[pid] = delivery
            datas.append(data)
            seq = delivery.seq
            if seq:  # in the device store
                if qos == 1:  # written if not acknowledged soon
                    if held is None:
                        held = []
                    held.append((seq, pid))
                else:  # one write per turn for all
                    self.store_update(seq, pid, _SENT)
        if datas:
            if direct:
                conn.write(encode_publish_run(datas, level))
            else:
                conn.write(datas[0] if len(datas) == 1 else b"".join(datas))
        if held is not None:
            states = self.sent_states
            if states is None:
                states = self.sent_states = SentStates(self)
            states.hold_many(held)
        return len(datas)

    def store_update(self, seq: int, packet_id: int, state: int) -> None:
        """Record in the device store, with the other writes of this turn
        (one ``update_many`` when the turn ends, :meth:`_remove_completed`),
        that delivery ``seq`` was sent with ``packet_id`` and is in
        ``state`` (:class:`~tbmq.model.DeliveryState`)."""
        updates = self._updates
        if not updates:
            updates = self._updates = []
            if not self._completed:  # else asked already
                self.ctx.flusher.later(self._remove_completed)
        updates.append((seq, packet_id, state))

    def _encoded(self, message: Message, qos: int, retain: bool,
                 subscription_ids: tuple[int, ...], cache: dict | None, now: float,
                 conn, dup: bool, packet_id: int) -> bytes | None:
        """The PUBLISH bytes for this client, or None when they exceed the
        client's maximum packet size [MQTT-3.1.2-25] (counted as a drop).
        With topic aliases on the connection each delivery is encoded for
        it, with its alias (the shared encoding of ``cache`` is not used)."""
        aliases = self.sent_aliases
        level = conn.protocol_level
        if cache is None or dup or aliases is not None:
            if aliases is None:
                data = encode_for(message, qos, retain, subscription_ids, now, level, dup,
                                  packet_id)
            else:
                alias, known = aliases.choose(message.topic)
                data = encode_for(message, qos, retain, subscription_ids, now, level, dup,
                                  packet_id, alias, known)
            if self._latency is not None and not (dup or retain):
                self._traffic.observe(message.received_at, now)
        else:
            # the encoding's parameters; a small int without identifiers
            key = (qos | (4 if retain else 0) | (8 if level >= MQTT_5 else 0)
                   if not subscription_ids else (qos, retain, level >= MQTT_5, subscription_ids))
            data = cache.get(key)
            if data is None:
                data = cache[key] = encode_for(message, qos, retain, subscription_ids, now,
                                               level, False, 1)
                if self._latency is not None and not retain:
                    self._traffic.observe(message.received_at, now)  # once per message and encoding
            if qos:
                data = publish_with_packet_id(data, packet_id)
        size = len(data)
        if conn.max_packet_size is not None and size > conn.max_packet_size:
            self.drop("too_large_for_client", message)
            return None
        if aliases is not None:
            aliases.sent(message.topic, alias, known)
        self._sent[qos] += 1
        self._sent_bytes[qos] += len(message.payload)
        return data

    def _overflow(self, message: Message) -> None:
        """A slow non-persistent session's queue is full: disconnect it with
        QUOTA_EXCEEDED (0x97); what it had queued or in flight is lost,
        counted."""
        lost = len(self.queue) + len(self.inflight) + 1
        self.log.warn("{client_id} does not keep up and its queue is full ({queued} messages); "
                      "disconnecting it (quota exceeded), {lost} messages lost",
                      client_id=self.client_id, queued=len(self.queue), lost=lost)
        self.drop("quota_exceeded", message, lost)
        self.overflowed = True
        conn = self.link
        if self.holder is not None:
            self.holder.release(self.ctx.clock.seconds())
        self._clear_queue()
        self.queued_bytes = 0
        self.inflight.clear()
        if conn is not None:
            conn.disconnect(ReasonCode.QUOTA_EXCEEDED,
                            "the client does not read its messages fast enough")

    # -- holding sources back ----------------------------------------------------------------

    def _hold(self, source, now: float) -> bool:
        """Hold ``source`` while this session is congested.

        :returns: False when the session is slow (no hold credit left): the
            caller drops a QoS 0 message or overflows.
        """
        if self.slow:
            return False
        if source is None:
            return True
        self._holder(now).hold(source, now)
        return True

    def _holder(self, now: float) -> SourceHolds:
        """:returns: the :class:`~tbmq.broker.holding.SourceHolds`, made at
        first use."""
        holder = self.holder
        if holder is None:
            holder = self.holder = SourceHolds(self, now)
        return holder

    def became_slow(self) -> None:
        """The session used up its hold credit, or its socket stayed full
        past ``mqtt.max_outbound_buffer``: it holds nobody from now on."""
        now = self.ctx.clock.seconds()
        self.log.info("{client_id} is slow: it held its publishers for its whole credit; "
                      "its QoS 0 messages are dropped while it is congested",
                      client_id=self.client_id)
        if self.holder is not None:
            self.holder.release(now)
        self.slow = True

    def _relieved(self) -> None:
        """The socket is writable and the queue at its low-water mark: let the
        sources go; a slow session is not slow any more."""
        conn = self.link
        if (conn is not None and conn.paused) or not self._drained():
            return
        holder = self.holder
        if holder is not None and (holder.holding or holder.since is not None):
            holder.release(self.ctx.clock.seconds())
        self.slow = False

    # -- draining --------------------------------------------------------------------------

    def pump(self) -> None:
        """Send queued deliveries while the inflight window has room and the
        socket is writable; read the next page of a paged-out persistent
        session when the queue is drained."""
        self.pump_asked = False
        conn = self.link
        if conn is None:
            return
        queue = self.queue
        if queue and not conn.paused:  # (a write does not pause it: only a flush)
            room = self._window() - len(self.inflight)
            if room > 0:
                now = self.ctx.clock.seconds()
                while queue and room > 0:  # again for those not sent (expired...)
                    n = len(queue)
                    if room >= n:  # the whole queue (a drain's page): its bytes all go
                        run = list(queue)
                        queue.clear()
                        self.queued_bytes = 0
                    else:
                        popleft = queue.popleft
                        run = [popleft() for _ in range(room)]
                        self.queued_bytes -= runs_size(run)
                    room -= self._send_run(run, now, conn)
        if self.paged_out:
            reader = self.store_reader()
            if not reader.loading and self._drained():
                reader.page_in()
        if self.slow or (self.holder is not None and self.holder.holding):
            self._relieved()

    def ask_pump(self) -> None:
        """:meth:`pump` when this turn ends, once however many ask: the
        acknowledgements of one read free their window slots together, and
        the deliveries sent into them go in one run."""
        if not self.pump_asked:
            self.pump_asked = True
            self.ctx.flusher.later(self.pump)

    def on_writable(self) -> None:
        """The connection's socket drained (Twisted resumed its producer)."""
        self.pump()
        if self.link is not None:
            self._relieved()

    def _resend(self, delivery: StoredDelivery) -> None:
        """Send again, after a reconnect, a delivery that was in flight: the
        PUBLISH with DUP set, or the PUBREL [MQTT-4.4.0-1]."""
        conn = self.link
        pid = delivery.packet_id
        if delivery.state == _RELEASED:
            conn.send(Pubrel(pid))
            return
        data = self._encoded(delivery.message, delivery.qos, delivery.retain,
                             delivery.subscription_ids, None, self.ctx.clock.seconds(), conn,
                             True, pid)
        if data is None:
            self.complete(pid)
        else:
            conn.write(data)

    # -- acknowledgements from the client ------------------------------------------------

    def _finished(self, *deliveries: StoredDelivery) -> None:
        """Deliveries done: acknowledged, or never to be sent (expired, too
        large).  The application record of each is committed, or its row
        leaves the device store (the rows of all of them in one list)."""
        app_done = self._app_done
        if app_done:  # the records of deliver_app(_batch) committed, the rest as below
            dones = list(map(app_done.pop, map(id, deliveries), repeat(None)))
            if None not in dones and finished_runs(dones):
                return  # (each a record of a batch: one finished per record's run, in C)
            seqs = []
            for delivery, done in zip(deliveries, dones):
                if done is None:
                    if delivery.seq:
                        seqs.append(delivery.seq)
                elif type(done) is tuple:  # (Progress, index): deliver_app_batch
                    done[0].finished(done[1])
                else:
                    done.callback(None)
        else:  # the seqs by map (no bytecode per delivery)
            seqs = list(filter(None, map(_SEQ, deliveries)))
        if not seqs:
            return
        if self.sent_states is not None:
            self.sent_states.finished(seqs)
        completed = self._completed
        if not completed:
            completed = self._completed = []
            if not self._updates:  # else asked already
                self.ctx.flusher.later(self._remove_completed)
        completed += seqs
        reader = self.reader
        if reader is not None and reader.loading:
            reader.finished(seqs)

    def complete(self, packet_id: int) -> StoredDelivery | None:
        """The delivery in flight under ``packet_id`` is done (acknowledged,
        refused, or not to be sent again): out of the window, then
        :meth:`_finished`.

        :returns: the delivery, or None for an unknown packet id."""
        delivery = self.inflight.pop(packet_id, None)
        if delivery is not None:
            self._finished(delivery)
        return delivery

    def complete_run(self, packet_ids: list) -> None:
        """:meth:`complete` of each of ``packet_ids`` (each in flight), in
        order, with one :meth:`_finished` for all: the PUBACKs of one read
        (:func:`~tbmq.broker.acknowledgements.on_pubacks`).  A packet id
        repeated in the run is done once (an acknowledgement repeated is
        ignored, as :func:`~tbmq.broker.acknowledgements.on_puback` does)."""
        self._finished(*filter(None, map(self.inflight.pop, packet_ids, repeat(None))))

    def _remove_completed(self) -> None:
        """The device store writes of this turn: the updates
        (:meth:`store_update`) in one call, then the removal of the
        completed deliveries in one."""
        drops = self.ctx.drops
        updates, self._updates = self._updates, ()
        if updates:
            drops.store_write(update_many(self.ctx.device_store, self.client_id, updates),
                              "update")
        completed, self._completed = self._completed, ()
        if completed:
            drops.store_write(self.ctx.device_store.remove(self.client_id, completed), "remove")

    # -- life cycle ------------------------------------------------------------------------------

    def resume(self, marker: bool = False, stored: bool = True) -> None:
        """After CONNACK: resend what is in flight with DUP set, in order
        [MQTT-4.4.0-1], then send the queue.  A persistent session reads its
        deliveries from the store first (:meth:`StoreReader.start
        <tbmq.broker.store_reads.StoreReader.start>`; ``stored`` False: a
        new session, of which the store holds nothing)."""
        if self.persistent:
            self.inflight.clear()
            self._clear_queue()
            self.queued_bytes = 0
            self._last_seq = 0
            self.paged_out = True
            self.store_reader().start(marker, stored)
            return
        if self.inflight:  # (a new session's is the shared empty mapping)
            for delivery in list(self.inflight.values()):
                self._resend(delivery)
        self.pump()

    def store_reader(self) -> StoreReader:
        """:returns: the :class:`~tbmq.broker.store_reads.StoreReader` of a
        persistent session, made at first use."""
        reader = self.reader
        if reader is None:
            reader = self.reader = StoreReader(self)
        return reader

    def attach(self, conn) -> None:
        """A new connection (its :class:`~tbmq.broker.link.Link`): the topic
        aliases it takes start empty [MQTT-3.3.2-7]; none when
        ``conn.topic_alias_maximum`` is 0."""
        self.link = conn
        maximum = conn.topic_alias_maximum
        self.sent_aliases = TopicAliases(maximum) if maximum else None

    def detach(self) -> None:
        """The connection is gone: a persistent session gives its memory back
        (everything is in the store, the SENT states held written now);
        holds are let go."""
        if self.sent_states is not None:
            self.sent_states.flush()
        self.link = None
        if self.holder is not None:
            self.holder.release(self.ctx.clock.seconds())
        reader = self.reader
        if reader is not None:
            reader.stop_marker_wait()
        self.slow = False
        self.overflowed = False
        self.sent_aliases = None
        self._app_done = NO_ENTRIES  # never fired: the records stay uncommitted
        if self.persistent:
            self.inflight.clear()
            self._clear_queue()
            self.queued_bytes = 0
            self.paged_out = True
            if reader is not None:
                reader.arrived = ()

    def discard(self) -> None:
        """The session ends: forget what it holds (and its stored deliveries)."""
        hooks = self.ctx.hooks
        if hooks.wants_dropped:
            for delivery in list(self.inflight.values()) + list(self.queue):
                hooks.message_dropped(self.session, delivery.message, "session_ended")
        if self.holder is not None:
            self.holder.release(self.ctx.clock.seconds())
        self.inflight.clear()
        self._clear_queue()
        self.queued_bytes = 0
        self._completed = self._updates = ()
        if self.sent_states is not None:
            self.sent_states.forget()
        if self.persistent:
            self.ctx.device_store.clear(self.client_id)
