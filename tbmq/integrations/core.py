"""One integration: its bounded buffer, its sends and their retries.

A message offered to an :class:`Integration` waits in its buffer until the
target acknowledges it (HTTP 2xx, MQTT PUBACK, Kafka's produce
acknowledgement) or refuses it for good (:class:`Rejected`: an HTTP 4xx);
a send that fails otherwise (a 5xx, a refused connection, a timeout) is
sent again after an exponential back-off, before any later message.  The
buffer is bounded in messages and in payload bytes; a message that does
not fit is dropped and counted.  ``docs/guarantees.md`` says what this
promises.
"""

from __future__ import annotations

from collections import deque

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq.log import LogThrottle, OBSERVER as LOG_OBSERVER
from tbmq.model import Message

__all__ = ["Entry", "Integration", "Rejected", "Target"]


class Rejected(Exception):
    """The target refused a message for good (an HTTP 4xx, a record Kafka
    will never take): counted as failed, not sent again."""


class Target:
    """What an integration sends to; each type subclasses it.

    :param config: the :class:`~tbmq.integrations.settings.IntegrationConfig`.
    :param reactor: the reactor.
    """

    def __init__(self, config, reactor) -> None:
        self.config = config
        self.reactor = reactor
        #: called by the target when it can take messages again (a
        #: connection is back): the integration's back-off ends at once
        self.ready = lambda: None

    def start(self) -> None:
        """Open what the target needs (connections, threads); must not block."""

    def send(self, message: Message) -> defer.Deferred:
        """Send one message.

        :returns: a Deferred firing once the target acknowledged it, or
            failing with :class:`Rejected` (not sent again) or any other
            exception (sent again after a back-off).  Cancelling it (the
            integration's ``timeout``) abandons the send.
        """
        raise NotImplementedError

    def stop(self) -> defer.Deferred | None:
        """Close the target's connections."""
        return None


class Entry:
    """A message in an integration's buffer.

    :ivar seq: its place in the order of arrival.
    :ivar message: the :class:`~tbmq.model.Message`.
    :ivar size: its payload bytes.
    :ivar attempts: sends so far.
    """

    __slots__ = ("seq", "message", "size", "attempts")

    def __init__(self, seq: int, message: Message) -> None:
        self.seq = seq
        self.message = message
        self.size = len(message.payload)
        self.attempts = 0


class Integration:
    """The buffer and the counters of one integration.

    :param config: its :class:`~tbmq.integrations.settings.IntegrationConfig`.
    :param target: its :class:`Target`.
    :param clock: ``IReactorTime``.
    :ivar sent: messages the target acknowledged.
    :ivar failed: messages the target refused for good (:class:`Rejected`).
    :ivar retried: sends repeated after a failure.
    :ivar dropped: messages not taken because the buffer was full.
    :ivar depth: messages in the buffer (waiting, in flight, or waiting for
        a retry).
    :ivar depth_bytes: their payload bytes.
    :ivar last_error: the last send failure, as text, or None.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, config, target: Target, clock) -> None:
        self.config = config
        self.name = config.name
        self.target = target
        self.clock = clock
        self.sent = 0
        self.failed = 0
        self.retried = 0
        self.dropped = 0
        self.depth = 0
        self.depth_bytes = 0
        self.last_error: str | None = None
        self.running = False
        self._seq = 0
        self._waiting: deque[Entry] = deque()
        self._retrying: list[Entry] = []
        self._in_flight: dict[int, defer.Deferred] = {}
        self._failures_in_row = 0
        self._timer = None
        self._drained: list[defer.Deferred] = []
        self._throttle = LogThrottle(clock, self.log, f"integration {config.name}")
        target.ready = self._retry_now

    # -- life cycle --------------------------------------------------------------

    def start(self) -> None:
        """Start the target and send what waits."""
        self.running = True
        self.target.start()
        self._pump()

    async def stop(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for the buffer to empty, then stop
        the target; what is still in the buffer is lost (logged).

        :param grace: seconds, >= 0.
        """
        if self.depth and self._timer is None and grace > 0:
            d = defer.Deferred()
            self._drained.append(d)
            d.addTimeout(grace, self.clock)
            try:
                await d
            except defer.TimeoutError:
                pass
        self.running = False
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        for d in list(self._in_flight.values()):
            d.cancel()
        if self.depth:
            self.log.warn("integration {name}: {count} message(s) of its buffer lost at stop",
                          name=self.name, count=self.depth)
        await defer.maybeDeferred(self.target.stop)

    # -- messages ----------------------------------------------------------------

    def offer(self, message: Message) -> bool:
        """Put ``message`` in the buffer, or drop it when the buffer is full.

        :returns: True when buffered, False when dropped (counted in
            :attr:`dropped`).
        """
        config = self.config
        size = len(message.payload)
        if self.depth >= config.buffer_messages or \
                self.depth_bytes + size > config.buffer_bytes:
            self.dropped += 1
            self._throttle.info("integration {name}: buffer full ({depth} messages, "
                                "{bytes} bytes): message on {topic} dropped",
                                name=self.name, depth=self.depth, bytes=self.depth_bytes,
                                topic=message.topic)
            return False
        self._seq += 1
        self._waiting.append(Entry(self._seq, message))
        self.depth += 1
        self.depth_bytes += size
        self._pump()
        return True

    def _pump(self) -> None:
        """Send waiting messages, in order, while fewer than
        ``concurrency`` are in flight and no back-off runs."""
        if not self.running or self._timer is not None:
            return
        waiting = self._waiting
        in_flight = self._in_flight
        limit = self.config.concurrency
        while waiting and len(in_flight) < limit:
            entry = waiting.popleft()
            entry.attempts += 1
            d = defer.maybeDeferred(self.target.send, entry.message)
            in_flight[entry.seq] = d
            d.addTimeout(self.config.timeout, self.clock)
            d.addCallbacks(self._acknowledged, self._failure,
                           callbackArgs=(entry,), errbackArgs=(entry,))

    def _remove(self, entry: Entry) -> None:
        self._in_flight.pop(entry.seq, None)
        self.depth -= 1
        self.depth_bytes -= entry.size
        if not self.depth and self._drained:
            drained, self._drained = self._drained, []
            for d in drained:
                d.callback(None)

    def _acknowledged(self, _result, entry: Entry) -> None:
        self._remove(entry)
        self.sent += 1
        self._failures_in_row = 0
        self._pump()

    def _failure(self, failure: Failure, entry: Entry) -> None:
        if not self.running and failure.check(defer.CancelledError):
            return  # abandoned at stop
        if failure.check(defer.TimeoutError, defer.CancelledError):
            error = f"no answer within {self.config.timeout:g} s"
        else:
            error = failure.getErrorMessage() or failure.type.__name__
        self.last_error = error
        if failure.check(Rejected):
            self._remove(entry)
            self.failed += 1
            self._throttle.info("integration {name}: message on {topic} refused: {error}",
                                name=self.name, topic=entry.message.topic, error=error)
            self._pump()
            return
        self._in_flight.pop(entry.seq, None)
        self._retrying.append(entry)
        if self._timer is None:
            self._failures_in_row += 1
            delay = min(self.config.retry_initial * 2 ** (self._failures_in_row - 1),
                        self.config.retry_max)
            self._throttle.info("integration {name}: send failed ({error}); {depth} message(s) "
                                "wait, retry in {delay:g} s", name=self.name, error=error,
                                depth=self.depth, delay=delay)
            if self.running:
                self._timer = self.clock.callLater(delay, self._retry)

    def _retry(self) -> None:
        """The back-off is over: the failed messages go first, in order."""
        self._timer = None
        retrying = sorted(self._retrying, key=lambda e: e.seq)
        self._retrying = []
        self.retried += len(retrying)
        self._waiting.extendleft(reversed(retrying))
        self._pump()

    def _retry_now(self) -> None:
        """The target is back: end the back-off now."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
            self._retry()

    def snapshot(self) -> dict:
        """:returns: the integration's state, for the API: ``{"name",
        "type", "topic_filters", "enabled", "sent", "failed", "retried",
        "dropped", "buffer_messages", "buffer_bytes", "in_flight",
        "retrying", "last_error"}``."""
        config = self.config
        return {"name": self.name, "type": config.type,
                "topic_filters": list(config.topic_filters), "enabled": config.enabled,
                "sent": self.sent, "failed": self.failed, "retried": self.retried,
                "dropped": self.dropped, "buffer_messages": self.depth,
                "buffer_bytes": self.depth_bytes, "in_flight": len(self._in_flight),
                "retrying": self._timer is not None, "last_error": self.last_error}
