"""The unauthorized-client log for the whole cluster (TBMQ's unauthorized
clients): the last refused connection attempt per client id, kept
``mqtt.unauthorized_clients.ttl`` seconds, at most
``mqtt.unauthorized_clients.max_entries`` of them.

A node that refuses a CONNECT because its authentication failed publishes
the attempt on ``tbmq.client.unauthorized`` (key = client id); every node
reads that topic from the beginning in a consumer group of its own and
keeps the last attempt per client id, so the API of any node lists the
attempts refused on every node.  TBMQ keeps them in PostgreSQL; here the
bus is the store: on Kafka the topic's retention (``kafka.retention_ms``)
bounds what a starting node reads back, on the embedded node the log
starts empty at each start (the topic is not durable: a flood of refusals
is not written to disk).

Memory is bounded: past ``max_entries`` client ids the oldest attempt is
evicted and counted (:attr:`UnauthorizedLog.evicted`), so a flood of random
client ids costs at most ``max_entries`` entries on every node.  The bus
carries one record per refusal, no more than the refused CONNECTs
themselves; the login guard (``auth.login_limits``) bans repeated failures
before they reach the authentication providers, and a banned attempt is
not recorded again.
"""

from __future__ import annotations

from collections import OrderedDict

from twisted.internet import defer
from twisted.logger import Logger

from tbmq.cluster.client_records import UnauthorizedAttempt
from tbmq.cluster.records import Record
from tbmq.cluster.topics import node_group
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.mqtt import ReasonCode

__all__ = ["UnauthorizedLog", "refusal_reason"]

log = Logger(observer=LOG_OBSERVER)


def refusal_reason(code: int, provider: str | None) -> str:
    """:returns: the reason of a refused attempt as listed: the CONNACK
    reason code's name and value, and the provider that refused it
    (``"BAD_USER_NAME_OR_PASSWORD (0x86) by basic"``)."""
    try:
        name = ReasonCode(code).name
    except ValueError:
        name = "REASON_CODE"
    text = f"{name} (0x{code:02X})"
    return f"{text} by {provider}" if provider else text


class UnauthorizedLog:
    """Client id → its last :class:`UnauthorizedAttempt`, for the cluster.

    :param bus: the :class:`tbmq.interfaces.IMessageBus`.
    :param topic: the ``tbmq.client.unauthorized`` topic name.
    :param service_id: this node's service id.
    :param clock: ``IReactorTime`` (``seconds()`` is the wall clock).
    :param ttl: seconds an attempt is kept, > 0.
    :param max_entries: client ids kept at most, >= 1.
    :ivar attempts: client id → attempt, the oldest first.
    :ivar evicted: attempts dropped because ``max_entries`` was reached.
    :ivar unpublished: attempts this node could not hand to the bus.
    :ivar local_only: attempts past :data:`MAX_PUBLISHED_PER_SECOND`, kept
        on this node only.
    """

    #: seconds between two sweeps of the attempts past ``ttl`` at most
    SWEEP_INTERVAL = 60.0
    #: attempts a node publishes in one second at most; past it (a flood of
    #: refused CONNECTs) they are kept on the refusing node only, so the
    #: bus carries at most this many records per second and node
    MAX_PUBLISHED_PER_SECOND = 200

    def __init__(self, bus, topic: str, service_id: str, clock, ttl: float,
                 max_entries: int) -> None:
        self.bus = bus
        self.topic = topic
        self.service_id = service_id
        self.clock = clock
        self.ttl = ttl
        self.max_entries = max_entries
        self.attempts: OrderedDict[str, UnauthorizedAttempt] = OrderedDict()
        self.evicted = 0
        self.unpublished = 0
        self.local_only = 0
        self._second = 0  # the second of the last publish, and the count in it
        self._published = 0
        self.consumer = None
        self._sweeper = None

    def start(self) -> defer.Deferred:
        """Read ``tbmq.client.unauthorized`` from the beginning, then follow
        it, and sweep the attempts past ``ttl`` every
        min(ttl, :data:`SWEEP_INTERVAL`) seconds.

        :returns: a Deferred firing once the topic is read up to its end.
        """
        self.consumer = self.bus.subscribe(self.topic, node_group(self.service_id),
                                           self._on_record, from_beginning=True,
                                           exclusive=True)
        self._sweeper = self.clock.callLater(min(self.ttl, self.SWEEP_INTERVAL), self._sweep)
        return self.consumer.caught_up

    def stop(self) -> None:
        """Stop the sweeps."""
        if self._sweeper is not None and self._sweeper.active():
            self._sweeper.cancel()
        self._sweeper = None

    def _sweep(self) -> None:
        self.expire()
        self._sweeper = self.clock.callLater(min(self.ttl, self.SWEEP_INTERVAL), self._sweep)

    def expire(self) -> int:
        """Drop the attempts older than ``ttl``.

        :returns: how many were dropped."""
        oldest = self.clock.seconds() - self.ttl
        attempts = self.attempts
        dropped = 0
        # kept in arrival order; an attempt another node stamped a little
        # earlier may stand behind a newer one: it goes at the next sweep
        while attempts:
            client_id, attempt = next(iter(attempts.items()))
            if attempt.at > oldest:
                break
            del attempts[client_id]
            dropped += 1
        return dropped

    def _on_record(self, record: Record) -> None:
        attempt = record.value
        if attempt is None:  # cleared by an operator
            self.attempts.pop(record.key, None)
            return
        self._file(attempt)

    def _file(self, attempt: UnauthorizedAttempt) -> None:
        if attempt.at <= self.clock.seconds() - self.ttl:
            return
        attempts = self.attempts
        attempts.pop(attempt.client_id, None)
        attempts[attempt.client_id] = attempt
        while len(attempts) > self.max_entries:
            attempts.popitem(last=False)
            self.evicted += 1

    def refused(self, client_id: str, address: str | None, username: str | None, reason: str,
                password_provided: bool, certificate_provided: bool) -> None:
        """Record a refused CONNECT on every node (published; this node's
        own consumer files it as the others' do), or on this node only
        past :data:`MAX_PUBLISHED_PER_SECOND` (counted in
        :attr:`local_only`).  Never raises: a bus that refuses the record
        is counted in :attr:`unpublished` and logged."""
        now = self.clock.seconds()
        attempt = UnauthorizedAttempt(client_id, address, username, reason, now,
                                      password_provided, certificate_provided, self.service_id)
        second = int(now)
        if second != self._second:
            self._second, self._published = second, 0
        if self._published >= self.MAX_PUBLISHED_PER_SECOND:
            self.local_only += 1
            self._file(attempt)
            return
        self._published += 1
        try:
            published = self.bus.publish(self.topic, client_id, attempt)
        except Exception as e:
            self._not_published(e)
            return
        if isinstance(published, defer.Deferred):
            published.addErrback(lambda failure: self._not_published(failure.value))

    def _not_published(self, error) -> None:
        self.unpublished += 1
        if self.unpublished == 1 or self.unpublished % 1000 == 0:
            log.warn("unauthorized client attempts not published ({count} so far): {error}",
                     count=self.unpublished, error=error)

    def listing(self) -> list[UnauthorizedAttempt]:
        """:returns: the attempts younger than ``ttl``, the last arrived
        first."""
        oldest = self.clock.seconds() - self.ttl
        return [a for a in reversed(self.attempts.values()) if a.at > oldest]

    def clear(self) -> defer.Deferred:
        """Forget every attempt on every node: a tombstone (key client id)
        per attempt this node knows.

        :returns: a Deferred firing with how many were cleared once the bus
            accepted the tombstones (failing with its
            :class:`~tbmq.errors.BusError`)."""
        client_ids = list(self.attempts)
        published = []
        for client_id in client_ids:
            self.attempts.pop(client_id, None)
            result = self.bus.publish(self.topic, client_id, None)
            if isinstance(result, defer.Deferred):
                published.append(result)
        d = defer.gatherResults(published, consumeErrors=True)
        d.addCallback(lambda _: len(client_ids))
        return d
