"""A node's own records, handed to its member when they are acknowledged
(``docs/bus.md``, "Own records, handed on acknowledgement").

A record this node publishes to a partition that its own member of a group
hands (assigned, not paused) need not wait to be fetched back: once Kafka
acknowledged it, the producer knows its partition and offset
(confluent-kafka's delivery report; kafka-python reports none, and keeps
the fetch), and once every record before that offset was handed, the
member hands it (the value objects as published, not decoded) and skips it
when the fetch brings it.  A subscription opts in with
:meth:`~.consumer.KafkaConsumer.hand_own` (the router's ``tbmq.msg.all``,
the deciding member of the session event requests, the session registry).

* The publish side: a record of such a topic that the
  :class:`~.packing.Packer` gathers (the hot path: a message, a
  delivery) is kept as its item (key, value, headers) in its unit, when a
  member here hands the unit's partition as the unit starts (:func:`handed`;
  another node's partition keeps nothing: half of a two-node cluster's
  publishes); a packed record's ``Fanout`` offers the items (:func:`offer`)
  as **one** unit with its offset, and only when every record it carries
  is this node's publish (a ``publish_many`` to such a topic keeps its
  records' items too, :meth:`~.packing.Packer.add_many`; one to another
  topic keeps none, and a unit with its records is fetched); a lone record
  is handed by an :class:`Own`.
  Any other record (headers, no key, a topic being created) has its
  ``done`` wrapped in an :class:`Own` at once by
  :meth:`~.bus.KafkaBus.publish`, which carries the record and the
  members that take it (a packed record of those: :func:`hand_packed`).
* The member side (:meth:`~.consumer.KafkaConsumer.take_own`): per
  partition, :attr:`~.consumer.Track.top` is the offset after the last record that arrived from the fetch or was
  handed here; a unit at ``top`` is handed at once when nothing of the
  partition waits in the buffer, the handler is not busy and fewer than
  ``max_uncommitted`` results are pending; a unit further ahead waits in
  :attr:`~.consumer.Track.held` until the fetch brings what comes before
  it (then it is handed in offset order), or brings it (then the held
  copy is handed in the fetched record's place, an
  :class:`~.consumer.Owned`: not decoded).  Commits are
  unchanged: the unit is an :class:`~.consumer.Entry` of its partition,
  committed once its result fired and everything before it committed.
* A partition that moves (revoked, read again after a failure, or the
  member paused or stopped) forgets what was held: its next owner (or the
  next reading) reads it as usual; a unit handed early whose result had
  not committed is read again there, as any record handed twice (at least
  once).
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq.log import OBSERVER as LOG_OBSERVER

__all__ = ["Own", "hand_packed", "handed", "offer"]

log = Logger(observer=LOG_OBSERVER)


class Own:
    """The ``done`` of a publish to a topic whose member on this node takes
    its own records (:meth:`~.consumer.KafkaConsumer.hand_own`).

    The driver sets :attr:`where` (``located`` is True) before it reports
    the outcome; a ``Fanout`` of a packed record hands the unit itself
    (:func:`hand_packed`) and leaves :attr:`where` unset.

    :param done: the publish's own ``done(None | Failure)``.
    :param takers: the members (:class:`~.consumer.KafkaConsumer`) that
        take the topic's own records: a list the bus keeps up to date.
    :param key: ``str | None``, as published.
    :param value: the value object, as published.
    :param headers: ``tuple`` of ``(str, bytes)``.
    """

    __slots__ = ("done", "takers", "key", "value", "headers", "where")
    located = True

    def __init__(self, done: Callable[[Failure | None], None], takers: list, key: str | None,
                 value: Any, headers: tuple) -> None:
        self.done = done
        self.takers = takers
        self.key = key
        self.value = value
        self.headers = headers
        self.where: tuple[int, int] | None = None

    def __call__(self, outcome: Failure | None) -> None:
        """:param outcome: None (acknowledged) or a Failure; the members
        take the record first, then the publish's ``done`` is called."""
        where = self.where
        if outcome is None and where is not None:
            offer(self.takers, where, ((self.key, self.value, self.headers),))
        self.done(outcome)


def offer(takers: list, where: tuple[int, int], items: tuple | list) -> None:
    """Hand ``items`` (one unit at ``where``: ``(key, value, headers)``
    each) to each member of ``takers``; what one raises is logged (the
    publish's outcome is still reported)."""
    for member in list(takers):
        try:
            member.take_own(where[0], where[1], items)
        except Exception:
            log.failure("Kafka bus: a record of this node could not be handed on its "
                        "acknowledgement")


def hand_packed(dones: list, records: int, where: tuple[int, int]) -> None:
    """A packed record carrying ``records`` records was acknowledged at
    ``where``: when each of them is this node's publish (an :class:`Own`
    each, in order), its members take them as one unit.

    :param dones: the packed record's ``done`` callables, in publish order.
    """
    if len(dones) != records or type(dones[0]) is not Own:
        return  # a publish_many's records: fetched
    takers = dones[0].takers
    if not handed(takers, where[0]):
        return  # no member here hands the partition (another node's): nothing to build
    for done in dones:
        if type(done) is not Own:
            return
    offer(takers, where, [(d.key, d.value, d.headers) for d in dones])


def handed(takers: list, partition: int) -> bool:
    """:returns: True when a member of ``takers`` hands ``partition`` now
    (:meth:`~.consumer.KafkaConsumer.hands`)."""
    for member in takers:
        if member.hands(partition):
            return True
    return False
