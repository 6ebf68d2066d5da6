"""The hot path of a transient record on a durable topic of the in-process
bus (:class:`HeldPublishes`, a part of
:class:`tbmq.backends.inprocess_bus.InProcessBus`): a clean session's
``tbmq.client.session`` record, one per CONNECT of the embedded node, is
held and handed to the topic's one consumer during its publish, without
the generic hand-off (``_publish``, ``_pump``, ``_next``, ``_hand``,
``_handled``) that a record which waits, or goes to the topic log, takes.
"""

from __future__ import annotations

from twisted.python.failure import Failure

from tbmq.cluster.records import new_record
from tbmq.cluster.topics import transient

__all__ = ["HeldPublishes"]


class HeldPublishes:
    """``_held_now`` of :class:`~tbmq.backends.inprocess_bus.InProcessBus`
    (which has the ``encodes``, ``_handled``, ``_track``, ``_committed``,
    ``_pump`` and ``_retain`` used here)."""

    def _held_now(self, state, member, cursor, part, key, value, headers: tuple) -> bool:
        """Publish a transient record (:func:`~tbmq.cluster.topics.transient`
        headers: the topic log never gets it) on the durable topic ``state``
        of one partition ``part`` and one member ``member``, whose
        ``cursor`` committed every record before it.

        The record is held as the object published, as ``_publish`` holds
        it (kept for a later reader of the topic: a compacted topic's last
        value per key), then handed to the member at once; it is durable for
        its publisher at once, whatever the handler does (a failure or a
        pending result is settled as the generic hand-off settles it:
        ``_handled``, ``_track``).

        :returns: False, with nothing done, for any other record, in the
            encoding mode, or while the member catches up (its
            ``caught_up`` is fired by the generic hand-off); else True.
        """
        if self.encodes or not headers or member.targets is not None or not transient(headers):
            return False
        o = part.append(key, value, headers, value)
        cursor.position = n = o + 1
        member.busy = True
        try:
            result = member.handler(new_record((state.name, key, value, headers, 0, o)))
        except Exception:
            member.busy = False
            self._handled(member, state, 0, cursor, o, Failure(), False)
        else:
            member.busy = False
            if result is None:
                cursor.committed = n
                self._committed(state, member.group_state, 0, cursor)
                member.redelivery.passed(0, n)
            else:
                self._track(member, state, 0, cursor, o, result)
        if member.wanted:
            self._pump(member)
        if not state.compacted:  # (a compacted topic keeps its last records)
            self._retain(state, part)
        return True
