"""The hot path of a record on a durable topic of the in-process bus
(:class:`HeldPublishes`, a part of
:class:`tbmq.backends.inprocess_bus.InProcessBus`) whose one consumer is
idle with nothing waiting for it:

* a transient record (a clean session's ``tbmq.client.session`` record, one
  per CONNECT of the embedded node) is held and handed to the topic's one
  consumer during its publish; it is durable for its publisher at once;
* any other record (a persistent session's ``tbmq.client.session`` record,
  a ``tbmq.client.subscriptions`` record) is held, given to the topic log's
  next flush, and handed to the consumer during its publish, as the generic
  hand-off would hand it then; its publisher is told once the log holds it.

Both go without the generic hand-off (``_publish``, ``_pump``, ``_next``,
``_hand``, ``_handled``) that a record which waits takes.
"""

from __future__ import annotations

from twisted.internet import defer
from twisted.python.failure import Failure

from tbmq.backends.topic_records import check_record
from tbmq.cluster.records import new_record
from tbmq.cluster.topics import transient
from tbmq.errors import BusPublishError, RecordEncodingError

__all__ = ["LOGGING", "HeldPublishes"]

#: what a publish's outcome is when the topic log's flush calls its
#: ``done`` (:class:`~tbmq.backends.inprocess_writes.LogWrites`)
LOGGING = object()


class HeldPublishes:
    """``_held_now`` and ``_logged_now`` of
    :class:`~tbmq.backends.inprocess_bus.InProcessBus` (which has the
    ``encodes``, ``_writes``, ``_handled``, ``_track``, ``_committed``,
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
        self._hand_now(state, member, cursor, part, key, value, headers, o)
        return True

    def _logged_now(self, state, member, cursor, part, key, value, headers: tuple, done):
        """Publish a record that the topic log is to hold on the durable
        topic ``state`` of one partition ``part`` and one member ``member``
        (no batch handler, not catching up), whose ``cursor`` committed
        every record before it, in direct mode: encoded for the log, held
        with the object published, given to the log's next flush
        (``_writes``; durable at once without a log), and handed to the
        member at once, as ``_publish`` and ``_pump`` would do.

        :param done: the publish's ``done``, or None.
        :returns: the publish's outcome for ``_answer`` of
            :mod:`~tbmq.backends.inprocess_bus`: None (durable now, no
            log), :data:`LOGGING` (the log calls ``done``), a Deferred of
            the log (``done`` None), or the exception of a record the log
            cannot take (nothing done).
        """
        codec = state.codec
        try:
            stored = value if codec is None else codec.encode(value)
        except RecordEncodingError as e:
            return e
        writes = self._writes
        if headers and writes is not None:
            try:  # alone: it would fail the whole turn's append
                check_record((state.name, 0, 0, key, stored, headers, False))
            except (TypeError, ValueError) as e:
                return BusPublishError(f"{state.name}: the topic log did not store the record: {e}")
        o = part.append(key, stored, headers, value)
        result = None
        if writes is not None:
            if done is None:
                result = defer.Deferred()
                done = result.callback  # a Failure: errback
            else:
                result = LOGGING
            writes.append((state.name, 0, o, key, stored, headers, state.compacted), done)
            part.logged_next = o + 1
        self._hand_now(state, member, cursor, part, key, value, headers, o)
        return result

    def _hand_now(self, state, member, cursor, part, key, value, headers: tuple, o: int) -> None:
        """Hand the record just held at offset ``o`` to ``member`` (idle, its
        ``cursor`` at ``o``) and settle its result as the generic hand-off
        does; then what waited for the member, and retention."""
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
                # (_committed, unless it has nothing to do: a compacted
                # topic of one group without tombstones, whose commit is
                # not past what the log holds, as after a transient record)
                if (not state.compacted or part.tombstones or cursor.logged != (
                        n if n < part.logged_next else part.logged_next)
                        and self._writes is not None):
                    self._committed(state, member.group_state, 0, cursor)
                member.redelivery.passed(0, n)
            else:
                self._track(member, state, 0, cursor, o, result)
        if member.wanted:
            self._pump(member)
        if not state.compacted:  # (a compacted topic keeps its last records)
            self._retain(state, part)
