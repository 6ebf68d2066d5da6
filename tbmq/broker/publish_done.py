"""The ``done`` of a session's publish: what the bus answers about a
PUBLISH from the client, kept so that the hot path allocates nothing (see
:meth:`tbmq.broker.session.Session.on_publish`); a later answer goes to the
session's :class:`~tbmq.broker.publisher_acks.PublisherAcks`."""

from __future__ import annotations

from typing import Any

#: :attr:`PublishDone.answer` until the bus calls it
WAITING = object()
#: :attr:`PublishDone.answer` once :meth:`PublisherAcks.pending
#: <tbmq.broker.publisher_acks.PublisherAcks.pending>` said what the
#: later answer is for
LATER = object()
#: most answered dones a session keeps for its next publishes
#: (:attr:`PublisherAcks.spares <tbmq.broker.publisher_acks.PublisherAcks.spares>`):
#: a publisher whose messages the bus answers later (a persistent
#: APPLICATION subscriber's topic log) makes no object per message
KEPT = 1024


class PublishDone:
    """The ``done`` of one publish of a :class:`~tbmq.broker.session.Session` (see
    :meth:`tbmq.interfaces.IMessageBus.publish`): its bound method
    :attr:`call`, kept so that passing and calling it costs no allocation
    (a bound method is called faster than an object with ``__call__``).
    Called during the publish, it keeps the answer for the
    session to act on at once, and the session reuses it for its next
    publish (nothing allocated when the bus holds a message during the
    call: the embedded hot path); called later, once :meth:`PublisherAcks.pending
    <tbmq.broker.publisher_acks.PublisherAcks.pending>` said
    what for, it hands the answer to the session's acknowledgements
    (:meth:`tbmq.broker.publisher_acks.PublisherAcks.published`) and goes
    to their :attr:`~tbmq.broker.publisher_acks.PublisherAcks.spares` for
    a later publish.

    :ivar acks: the session's
        :class:`~tbmq.broker.publisher_acks.PublisherAcks`, which a later
        answer goes to.
    :ivar call: ``call(failure=None)``: the ``done`` given to the bus
        (None once :meth:`close` d).
    :ivar answer: :data:`WAITING`, what the bus answered during the call
        (None, or a :class:`~twisted.python.failure.Failure`), or
        :data:`LATER` once
        :meth:`PublisherAcks.pending <tbmq.broker.publisher_acks.PublisherAcks.pending>`
        said what a later answer is for.
    :ivar entry: the acknowledgement queued for a later answer (None at QoS 0).
    :ivar conn: the session's live link when it was queued.
    :ivar accepting: the publisher connection it counts for.
    """

    __slots__ = ("acks", "call", "answer", "entry", "conn", "accepting")

    def __init__(self, acks) -> None:
        """:param acks: the session's
            :class:`~tbmq.broker.publisher_acks.PublisherAcks`."""
        self.acks = acks
        self.call = self._answered
        self.answer: Any = WAITING

    def close(self) -> None:
        """Not to be used any more: the cycle of :attr:`call` is broken
        (the spares of a connection that ended)."""
        self.call = None

    def _answered(self, failure=None) -> None:
        """:param failure: None (the bus holds the message), or a
            :class:`~twisted.python.failure.Failure` of a
            :class:`tbmq.errors.BusError`."""
        if self.answer is LATER:
            acks = self.acks
            acks.published(failure, self.entry, self.conn, self.accepting)
            # answered: kept for a later publish of the session (the bus calls
            # a done once), up to KEPT of them
            self.answer = WAITING
            spares = acks.spares
            if len(spares) < KEPT:
                spares.append(self)
        else:
            self.answer = failure
