"""The ``done`` of a session's publish: what the bus answers about a
PUBLISH from the client, kept so that the hot path allocates nothing (see
:meth:`tbmq.broker.session.Session.on_publish`); a later answer goes to the
session's :class:`~tbmq.broker.publisher_acks.PublisherAcks`."""

from __future__ import annotations

from typing import Any

#: :attr:`PublishDone.answer` until the bus calls it
WAITING = object()


class PublishDone:
    """The ``done`` of one publish of a :class:`~tbmq.broker.session.Session` (see
    :meth:`tbmq.interfaces.IMessageBus.publish`): its bound method
    :attr:`call`, kept so that passing and calling it costs no allocation.
    Called during the publish, it keeps the answer for the session to act
    on at once, and the session reuses it for its next publish (nothing
    allocated when the bus holds a message during the call: the embedded
    hot path); called later, once :meth:`wait` said what for, it hands the
    answer to the session's acknowledgements
    (:meth:`tbmq.broker.publisher_acks.PublisherAcks.published`).

    :ivar acks: the session's
        :class:`~tbmq.broker.publisher_acks.PublisherAcks`, which a later
        answer goes to.
    :ivar call: ``call(failure=None)``: the ``done`` given to the bus.
    :ivar answer: :data:`WAITING`, or what the bus answered during the call
        (None, or a :class:`~twisted.python.failure.Failure`).
    """

    __slots__ = ("acks", "call", "answer", "waiting", "entry", "conn", "accepting")

    def __init__(self, acks) -> None:
        """:param acks: the session's
            :class:`~tbmq.broker.publisher_acks.PublisherAcks`."""
        self.acks = acks
        self.call = self._answered
        self.answer: Any = WAITING
        self.waiting = False
        self.entry: list | None = None
        self.conn = None
        self.accepting = None

    def wait(self, entry: list | None, conn, accepting) -> None:
        """The answer is for :meth:`PublisherAcks.published
        <tbmq.broker.publisher_acks.PublisherAcks.published>`: the acknowledgement
        ``entry`` (None at QoS 0) queued on ``conn`` for the publisher
        connection ``accepting``."""
        self.waiting = True
        self.entry = entry
        self.conn = conn
        self.accepting = accepting

    def _answered(self, failure=None) -> None:
        """:param failure: None (the bus holds the message), or a
            :class:`~twisted.python.failure.Failure` of a
            :class:`tbmq.errors.BusError`."""
        if self.waiting:
            self.waiting = False
            self.call = None  # (no cycle left behind)
            self.acks.published(failure, self.entry, self.conn, self.accepting)
        else:
            self.answer = failure
