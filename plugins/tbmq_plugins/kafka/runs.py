"""Runs of single records for a consumer's ``batch_handler`` (the
:class:`Runs` part of :class:`~.consumer.KafkaConsumer`).

A topic whose records are not packed (an APPLICATION client's
``tbmq.msg.app.<clientId>``: its commits follow the client's
acknowledgements one message at a time, ``docs/bus.md``) still reaches a
``batch_handler`` in one call per poll: the single records of one partition
that wait in a row in the buffer are handed together, each an entry of its
own, so that a :class:`~tbmq.cluster.completion.Progress` result commits
each as the leading run of finished records passes it (exact per record),
while a Completion or a Deferred settles them all at once.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.python.failure import Failure

from tbmq.cluster.completion import Completion, Progress
from tbmq_plugins.kafka.drivers import RawRecord

__all__ = ["Runs"]


class Runs:
    """The run handing of :class:`~.consumer.KafkaConsumer` (a mixin: it
    uses the consumer's buffer, tracks, loop and pending count)."""

    def _take_run(self, track: Any, entry: Any, raw: RawRecord, budget: int) -> int:
        """Hand ``raw`` and the single records of ``track`` that follow it
        in the buffer (no headers) to the ``batch_handler`` in **one**
        call, each still an entry of its own (:meth:`_hand_run`): an
        APPLICATION client's topic, whose records are not packed, costs one
        call per poll rather than one per record.  Each record is decoded
        as it is taken and weighed by the topic's codec (``weigh``: a
        :class:`~tbmq.cluster.records.DeliveryRun` carries several
        messages), and the run stops once it carries ``budget`` messages,
        so that a reactor turn hands at most the slice's messages whatever
        the records carry.  A record that does not decode ends the run
        before it, and is handed alone (:meth:`_hand`: it alone fails).

        :returns: the messages handed (at least one)."""
        codec = self.codec
        decode, weigh = codec.decode, codec.weigh
        try:
            value = decode(raw.value)
        except Exception:  # handed alone: it fails there
            self._held -= 1
            track.queued -= 1
            if track.live:
                track.handed = entry.offset + 1
                self._hand(track, entry, raw)
            return 1
        buffer = self._buffer
        entries, values = [entry], [value]
        left = budget - weigh(value)
        while (buffer and left > 0 and buffer[0][0] is track
               and type(buffer[0][2]) is RawRecord and not buffer[0][2].headers):
            try:
                value = decode(buffer[0][2].value)
            except Exception:
                break  # handed alone next
            entries.append(buffer.popleft()[1])
            values.append(value)
            left -= weigh(value)
        n = len(entries)
        self._held -= n
        track.queued -= n
        if track.live:
            track.handed = entries[-1].offset + 1
            self._hand_run(track, entries, values)
        return max(budget - left, n)

    def _hand_run(self, track: Any, entries: list, values: list) -> None:
        """Hand ``values``, the decoded values of single records of one
        partition in order (``entries`` theirs), to the ``batch_handler``.
        A :class:`~tbmq.cluster.completion.Progress` result settles each
        entry as the leading run of the batch grows (the commit names the
        first record not finished); a Completion or a Deferred settles them
        all together."""
        try:
            result = self.batch_handler(values)
        except Exception:
            self._done_many(track, entries, Failure())
            return
        if type(result) is Progress:
            self._inflight += 1
            result.then(self._progressed, track, entries)
        elif type(result) is Completion:
            self._inflight += 1
            result.then(self._settled_run, track, entries)
        elif isinstance(result, defer.Deferred):
            self._inflight += 1
            result.addBoth(self._fired_run, track, entries)
        else:
            self._done_many(track, entries, None)

    def _progressed(self, start: int, end: int, track: Any, entries: list) -> None:
        """The leading run of a :meth:`_hand_run` batch grew from ``start``
        to ``end`` records: they are done (committed in order)."""
        if end - start == 1:  # one acknowledgement, the usual growth: no slice, no loop
            self._moved(track, track.done(entries[start], True))
        else:
            self._done_many(track, entries[start:end], None)
        if end == len(entries):
            self._unload()

    def _fired_run(self, outcome: Any, track: Any, entries: list) -> None:
        self._settled_run(outcome if isinstance(outcome, Failure) else None, track, entries)

    def _settled_run(self, failure: Failure | None, track: Any, entries: list) -> None:
        """The one result of a :meth:`_hand_run` batch fired."""
        self._done_many(track, entries, failure)
        self._unload()

    def _unload(self) -> None:
        """One pending result fewer (:meth:`_settled`)."""
        self._inflight -= 1
        self._room_freed()

    def _room_freed(self) -> None:
        """A pending result settled: hand more when the room was full, and
        what the node's own records hold back."""
        if not self._busy:
            if self._inflight == self.max_uncommitted - 1:
                self._schedule()
            if self._holding:
                self._advance_own()

    def _done_many(self, track: Any, entries: list, failure: Failure | None) -> None:
        """As :meth:`_done` for each of ``entries`` (one partition), with
        one commit."""
        moved = False
        ok = failure is None
        for entry in entries:
            if not ok and entry.failure is None:
                entry.failure = failure
            if track.done(entry, ok):
                moved = True
        self._moved(track, moved)

    def _moved(self, track: Any, moved: bool) -> None:
        """After :meth:`Track.done <.consumer.Track.done>` of some of
        ``track``'s entries (``moved``: its commit moved): queue the commit,
        read again from a failed record, tell whether it caught up."""
        if moved and track.live:
            self.loop.commit(track.partition, track.committed)
            self._redelivery.passed(track.partition, track.committed)
        if track.blocked and track.live:
            self._read_again(track)
        if track.reached and not self.caught_up.called:
            self._check_caught_up()

    def _progress_one(self, start: int, end: int, track: Any, entry: Any,
                      size: int) -> None:
        """A :class:`~tbmq.cluster.completion.Progress` for one Kafka record
        (a packed record's values) grew: the record is done once all of it
        is (its offset names no record inside it)."""
        if end == size:
            self._settled(None, track, entry)
