"""The topic log of the in-process bus in the embedded store file
(:class:`~tbmq.interfaces.ITopicLog`).

:class:`SQLiteTopicLog` keeps the records of the bus's durable topics in
the table ``topic_log`` (one row per record, keyed by topic, partition and
offset), except the records of one partition at consecutive offsets that
one transaction writes (what a reactor turn routed to an APPLICATION
client, given as one :class:`~tbmq.backends.topic_records.RecordRun`),
which go as one packed row of ``topic_log_packs`` (keyed by its
last offset; see :func:`_write_rows`, :func:`_write_runs`), and the consumer groups' committed
offsets in ``topic_log_offsets``, in the file of the other embedded stores,
on their
:class:`~tbmq.backends.sqlite_runner.SQLiteRunner`.  In a compacted topic a
record replaces the earlier one of its key and a tombstone removes the key,
so the table holds the last value per key.

Writes (append, commit, truncate) accepted while the database thread is
busy are merged into one :class:`TopicLogWrites` operation of the next
transaction, as the device store's are; ``delete_topic`` and ``load`` keep
their place after the writes made before them.  Every Deferred fires after
the COMMIT that made the call durable.
"""

from __future__ import annotations

import heapq
import sqlite3
from typing import Iterable

import msgpack
from twisted.internet import defer
from zope.interface import implementer

from tbmq.backends.sqlite_bulk import by_first, delete_listed, insert_rows
from tbmq.backends.sqlite_runner import SQLiteRunner
from tbmq.backends.sqlite_view import MergedWrites, RunnerView
from tbmq.backends.sqlite_schema import EMBEDDED_SCHEMA
from tbmq.backends.topic_records import RecordRun, check_records
from tbmq.interfaces import ITopicLog

__all__ = ["PACK_MIN", "SQLiteTopicLog", "TopicLogWrites", "pack_headers", "unpack_headers"]

#: The fewest records of one partition at consecutive offsets, written
#: together, that go as one packed row of ``topic_log_packs``: one
#: B-tree insertion and one blob for the batch instead of one row each.
PACK_MIN = 2

#: The row of a record without headers in a topic that is not compacted
#: (nearly every one): five columns bound instead of seven, a tenth less
#: of the database thread's work per row.
_PLAIN_TAIL = ",NULL,0"

def pack_headers(headers: tuple) -> bytes | None:
    """:returns: ``headers`` as a msgpack array of ``[str, bin]`` pairs, or
    None when there are none."""
    if not headers:
        return None
    return msgpack.packb([list(pair) for pair in headers], use_bin_type=True)


def unpack_headers(data: bytes | None) -> tuple:
    """:returns: the ``((str, bytes), ...)`` of :func:`pack_headers`'s
    output."""
    if not data:
        return ()
    return tuple((name, value) for name, value in msgpack.unpackb(bytes(data), raw=False))


class StoredEnds:
    """What the topic log knows of the rows it stores, kept in the
    database thread only: per ``(topic, partition)``, the offset above
    every stored record, and whether single rows (``topic_log``) and
    packed rows (``topic_log_packs``) are stored.  A write above that
    offset replaces nothing, so it does without the look-up of stored
    records at its positions; a truncation touches only the table that
    holds rows of the partition: two or three statements fewer per
    transaction, each one wait for the GIL less for the database thread.
    Nothing is known (every statement made) until the log was loaded.

    A truncation above the last single (packed) row of a partition leaves
    none of that kind, and the next truncations of the partition skip that
    table until a row of it is written again (the APPLICATION topics, where
    a turn with one record writes a single row now and then: one DELETE
    less in most transactions).  A transaction rolled back after the
    statements leaves it knowing more rows gone than are: their next
    truncation may miss them (rows below every committed offset, kept
    until a restart reloads what is known).

    :ivar above: ``(topic, partition)`` → that offset; None until loaded.
    :ivar singles: the partitions that may have single rows → the highest
        offset of one written.
    :ivar packed: the partitions that may have packed rows → the highest
        last offset of one written.
    """

    __slots__ = ("above", "singles", "packed")

    def __init__(self) -> None:
        self.above: dict[tuple[str, int], int] | None = None
        self.singles: dict[tuple[str, int], int] = {}
        self.packed: dict[tuple[str, int], int] = {}

    def loaded(self, records: list, packs: list) -> None:
        """The log was read: ``records`` the single rows' and ``packs``
        the packed rows' ``(topic, partition, offset, ...)``."""
        above: dict[tuple[str, int], int] = {}
        for kind, rows in ((self.singles, records), (self.packed, packs)):
            kind.clear()
            for row in rows:
                key = row[:2]
                if row[2] > kind.get(key, -1):
                    kind[key] = row[2]
                if row[2] >= above.get(key, 0):
                    above[key] = row[2] + 1
        self.above = above

    def beyond(self, topic: str, partition: int, low: int) -> bool:
        """Whether nothing is stored at ``low`` or above in the partition."""
        above = self.above
        return above is not None and low >= above.get((topic, partition), 0)

    def wrote(self, topic: str, partition: int, high: int, packed: bool) -> None:
        """Rows up to offset ``high`` were written (``packed``: a packed row)."""
        key = (topic, partition)
        kind = self.packed if packed else self.singles
        if high > kind.get(key, -1):
            kind[key] = high
        above = self.above
        if above is not None and high >= above.get(key, 0):
            above[key] = high + 1

    def holds(self, topic: str, partition: int, packed: bool) -> bool:
        """Whether rows of that kind may be stored for the partition."""
        return self.above is None or (topic, partition) in (self.packed if packed
                                                             else self.singles)

    def truncated(self, topic: str, partition: int, before: int) -> None:
        """The rows of the partition below ``before`` went (a packed one
        holding ``before`` or more kept): a kind whose rows all lay below
        it has none left."""
        key = (topic, partition)
        for kind in (self.singles, self.packed):
            high = kind.get(key)
            if high is not None and high < before:
                del kind[key]

    def forget(self, topic: str) -> None:
        """``topic`` was deleted: nothing of it is stored."""
        for kind in (self.singles, self.packed):
            for key in [key for key in kind if key[0] == topic]:
                del kind[key]
        if self.above is not None:
            for key in [key for key in self.above if key[0] == topic]:
                del self.above[key]


class TopicLogWrites(MergedWrites):
    """Appends, commits and truncations accepted while the database thread
    is busy, merged into one operation of the next batch.

    Run, it deletes the rows of the compacted keys written again, the rows
    a tombstone took the place of and the truncated rows, then inserts the
    records left, then writes the offsets: the same rows as running the calls one by one, because every
    call also applies itself to what is merged already (a truncation drops
    the merged records below it, a compacted record the merged one of its
    key).  Once the runner hands its batch to the thread it is *sealed*
    and later writes open a new one.

    :ivar rows: (topic, partition, offset) → the row to INSERT OR REPLACE:
        ``(topic, partition, offset, key, value)`` for a record without
        headers in a topic that is not compacted, else the seven columns.
    :ivar keys: (topic, key) → the position in :attr:`rows` of the merged
        record of a compacted key.
    :ivar dropped_keys: (topic, key) of compacted keys whose stored record
        goes.
    :ivar dropped_positions: (topic, partition, offset) of stored records
        replaced by a tombstone (which is not stored).
    :ivar truncations: (topic, partition) → the offset below which stored
        records go.
    :ivar offsets: (group, topic, partition) → the committed offset.
    :ivar runs: the :class:`~tbmq.backends.topic_records.RecordRun` to
        write as packed rows (:data:`PACK_MIN` records or more), in order;
        none holds a position of another or of :attr:`rows` (a write there
        makes the run rows first).
    """

    __slots__ = ("rows", "keys", "dropped_keys", "dropped_positions", "truncations", "offsets",
                 "runs", "ends")

    def __init__(self, ends: StoredEnds | None = None) -> None:
        super().__init__()
        #: the log's :class:`StoredEnds` (a new one, knowing nothing, when None)
        self.ends = StoredEnds() if ends is None else ends
        self.runs: list[RecordRun] = []
        self.rows: dict[tuple[str, int, int], tuple] = {}
        self.keys: dict[tuple[str, str], tuple[str, int, int]] = {}
        self.dropped_keys: set[tuple[str, str]] = set()
        self.dropped_positions: set[tuple[str, int, int]] = set()
        self.truncations: dict[tuple[str, int], int] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}

    def _forget_row(self, position: tuple[str, int, int]) -> None:
        row = self.rows.pop(position, None)
        if row is not None and len(row) == 7 and row[6] and row[3] is not None:
            if self.keys.get((row[0], row[3])) == position:
                del self.keys[(row[0], row[3])]

    def append(self, record: tuple) -> None:
        """Merge one checked record
        (:func:`~tbmq.backends.topic_records.check_record`)."""
        topic, partition, offset, key, value, headers, compacted = record
        position = (topic, partition, offset)
        if self.runs:
            self._unrun(topic, partition, offset, offset)
        if position in self.rows:
            self._forget_row(position)
        if compacted and key is not None:
            earlier = self.keys.pop((topic, key), None)
            if earlier is not None:
                self.rows.pop(earlier, None)
            self.dropped_keys.add((topic, key))
            if value is None:
                self.dropped_positions.add(position)
                return
            self.keys[(topic, key)] = position
        if headers or compacted:
            self.rows[position] = (topic, partition, offset, key, value,
                                   pack_headers(headers) if headers else None,
                                   1 if compacted else 0)
        else:  # the usual record: five bound columns (see _PLAIN_TAIL)
            self.rows[position] = (topic, partition, offset, key, value)

    def extend(self, checked: list) -> None:
        """Merge checked records and runs in order, as :meth:`append` each
        (:meth:`append_run` each run): the usual record (no headers, not
        compacted, a new position, no run merged) in the loop itself."""
        rows = self.rows
        for record in checked:
            if type(record) is RecordRun:
                self.append_run(record)
                continue
            position = record[:3]
            if record[6] or record[5] or position in rows or self.runs:
                self.append(record)
            else:
                rows[position] = record[:5]

    def append_run(self, run: RecordRun) -> None:
        """Merge a checked :class:`~tbmq.backends.topic_records.RecordRun`:
        kept whole (one packed row, nothing per record), joined to the
        merged run it follows; as rows when it is short (below
        :data:`PACK_MIN`) or holds a position merged already (the rare
        write over a merged record: rows replace rows)."""
        topic, partition, first, last = run.topic, run.partition, run.first, run.last
        if self.runs:
            self._unrun(topic, partition, first, last)
        rows = self.rows
        if len(run) < PACK_MIN or (rows and any(
                p[1] == partition and first <= p[2] <= last and p[0] == topic for p in rows)):
            for record in run.records():
                self.append(record)
            return
        runs = self.runs
        if runs:
            before = runs[-1]
            if before.topic == topic and before.partition == partition and before.last + 1 == first:
                runs[-1] = RecordRun(topic, partition, before.first, before.keys + run.keys,
                                     before.values + run.values)
                return
        runs.append(run)

    def _unrun(self, topic: str, partition: int, low: int, high: int) -> None:
        """The merged runs of ``(topic, partition)`` that hold an offset from
        ``low`` to ``high`` become rows (a write there replaces them)."""
        runs = self.runs
        hit = [r for r in runs if r.partition == partition and r.topic == topic
               and r.first <= high and low <= r.last]
        if not hit:
            return
        self.runs = [r for r in runs if not any(r is h for h in hit)]
        rows = self.rows
        for run in hit:
            for record in run.records():
                rows[record[:3]] = record[:5]

    def truncate(self, topic: str, partition: int, before: int) -> None:
        """Merge a truncation of ``(topic, partition)`` below ``before``."""
        for position in [p for p in self.rows
                         if p[2] < before and p[1] == partition and p[0] == topic]:
            self._forget_row(position)
        if self.runs:
            runs = []
            for run in self.runs:
                if run.partition != partition or run.topic != topic or run.first >= before:
                    runs.append(run)
                elif run.last >= before:  # cut: the records from ``before`` on stay
                    runs.append(run.since(before))
            self.runs = runs
        key = (topic, partition)
        self.truncations[key] = max(before, self.truncations.get(key, before))

    def __call__(self, conn: sqlite3.Connection) -> None:
        """In the database thread: write the merged calls."""
        if self.dropped_keys:
            _delete_keys(conn, self.dropped_keys)
        if self.dropped_positions:
            conn.executemany(
                "DELETE FROM topic_log WHERE topic = ? AND partition_id = ? AND log_offset = ?",
                self.dropped_positions,
            )
        ends = self.ends
        if self.truncations:
            singles = [(t, p, before) for (t, p), before in self.truncations.items()
                       if ends.holds(t, p, False)]
            if singles:
                conn.executemany(
                    "DELETE FROM topic_log WHERE topic = ? AND partition_id = ? "
                    "AND log_offset < ?", singles)
            packs = [(t, p, before) for (t, p), before in self.truncations.items()
                     if ends.holds(t, p, True)]
            if packs:
                _truncate_packs(conn, packs)
            for (t, p), before in self.truncations.items():
                ends.truncated(t, p, before)
        if self.rows:
            _write_rows(conn, self.rows.values(), ends)
        if self.runs:
            _write_runs(conn, self.runs, ends)
        if self.offsets:
            conn.executemany(
                "INSERT OR REPLACE INTO topic_log_offsets VALUES (?, ?, ?, ?)",
                [(g, t, p, o) for (g, t, p), o in self.offsets.items()],
            )


def _delete_keys(conn: sqlite3.Connection, keys: Iterable[tuple[str, str]]) -> None:
    """In the database thread: delete the stored records of the compacted
    keys ``keys`` (``(topic, key)`` each), per topic one statement of up to
    :data:`~tbmq.backends.sqlite_bulk.CHUNK_ROWS` keys (``key IN (...)``,
    the partial index ``topic_log_compacted_key`` searched once per key):
    one step and one wait for the GIL per statement, not per key
    (:mod:`tbmq.backends.sqlite_bulk`)."""
    for topic, held in by_first(keys).items():
        delete_listed(conn, "DELETE FROM topic_log WHERE topic = ? AND compacted = 1 AND key IN (",
                      topic, held)


def _truncate_packs(conn: sqlite3.Connection, rows: list) -> None:
    """In the database thread: the packed rows wholly below a truncation
    (``(topic, partition, before)`` each of ``rows``) go; the one it cuts
    keeps its records from the truncation on (its ``first_offset`` moves
    up)."""
    conn.executemany(
        "DELETE FROM topic_log_packs WHERE topic = ? AND partition_id = ? AND last_offset < ?",
        rows)
    conn.executemany(
        "UPDATE topic_log_packs SET first_offset = ?3 WHERE rowid = ("
        "SELECT rowid FROM topic_log_packs WHERE topic = ?1 AND partition_id = ?2 "
        "AND last_offset >= ?3 ORDER BY last_offset LIMIT 1) AND first_offset < ?3", rows)


def _write_rows(conn: sqlite3.Connection, rows: Iterable[tuple], ends: StoredEnds) -> None:
    """In the database thread: write the merged rows of
    :attr:`TopicLogWrites.rows`.  The plain rows of one partition at
    consecutive offsets (:data:`PACK_MIN` or more: the records one turn
    published to an APPLICATION client's topic) go as one packed row of
    ``topic_log_packs``; the others one row each in ``topic_log``.  A
    record written at the position of a stored one replaces it, packed or
    not (:func:`_unpack_overlaps`; not looked for above what ``ends``
    knows to be stored)."""
    plain, full = [], []
    parts: dict[tuple[str, int], list] = {}
    for row in rows:
        if len(row) == 5:
            part = parts.get((row[0], row[1]))
            if part is None:
                parts[(row[0], row[1])] = [row]
            else:
                part.append(row)
        else:
            full.append(row)
            if (row[0], row[1]) not in parts:
                parts[(row[0], row[1])] = []
    packs, over = [], []
    for (topic, partition), part in parts.items():
        offsets = [row[2] for row in full if row[0] == topic and row[1] == partition] \
            if full else []
        if part:
            part.sort(key=_offset)
            offsets += (part[0][2], part[-1][2])
        low, high = min(offsets), max(offsets)
        fresh = ends.beyond(topic, partition, low)
        if not fresh:
            _unpack_overlaps(conn, topic, partition, low, high, ends)
        start, n = 0, len(part)
        while start < n:  # split into runs of consecutive offsets
            end = start + 1
            while end < n and part[end][2] == part[end - 1][2] + 1:
                end += 1
            if end - start >= PACK_MIN:
                run = part[start:end]
                packs.append((topic, partition, run[-1][2], run[0][2], msgpack.packb(
                    [[row[3] for row in run], [row[4] for row in run]], use_bin_type=True)))
                if not fresh:
                    over.append((topic, partition, run[0][2], run[-1][2]))
                ends.wrote(topic, partition, run[-1][2], True)
            else:
                plain += part[start:end]
                ends.wrote(topic, partition, part[end - 1][2], False)
            start = end
        if full:
            ends.wrote(topic, partition, high, False)
    if over:
        # a packed run written over single rows of its positions replaces them
        conn.executemany(
            "DELETE FROM topic_log WHERE topic = ? AND partition_id = ? "
            "AND log_offset BETWEEN ? AND ?", over)
    if packs:
        conn.executemany("INSERT INTO topic_log_packs VALUES (?, ?, ?, ?, ?)", packs)
    if plain:
        # multi-row statements, not executemany: one wait for the GIL per
        # statement, not per row (tbmq.backends.sqlite_bulk)
        insert_rows(conn, "topic_log", plain, 5, tail=_PLAIN_TAIL)
    if full:
        # (the records of a compacted topic or with headers: a persistent
        # session's records of its CONNECT and disconnect) as the plain ones
        insert_rows(conn, "topic_log", full, 7)


def _write_runs(conn: sqlite3.Connection, runs: list, ends: StoredEnds) -> None:
    """In the database thread: write the merged runs
    (:attr:`TopicLogWrites.runs`), one packed row of ``topic_log_packs``
    each, its keys and values packed in one ``msgpack`` call (nothing per
    record in Python); a run over stored rows of its positions replaces
    them, as :func:`_write_rows` does (looked for only below what ``ends``
    knows to be stored: the bus appends above it, one INSERT for all)."""
    over = [r for r in runs if not ends.beyond(r.topic, r.partition, r.first)]
    for run in over:
        _unpack_overlaps(conn, run.topic, run.partition, run.first, run.last, ends)
    if over:
        conn.executemany(
            "DELETE FROM topic_log WHERE topic = ? AND partition_id = ? "
            "AND log_offset BETWEEN ? AND ?", [(r.topic, r.partition, r.first, r.last)
                                               for r in over])
    for run in runs:
        ends.wrote(run.topic, run.partition, run.last, True)
    conn.executemany("INSERT INTO topic_log_packs VALUES (?, ?, ?, ?, ?)", [
        (r.topic, r.partition, r.last, r.first,
         msgpack.packb([r.keys, r.values], use_bin_type=True)) for r in runs])


def _offset(row: tuple) -> int:
    return row[2]


def _unpack_overlaps(conn: sqlite3.Connection, topic: str, partition: int, low: int,
                     high: int, ends: StoredEnds) -> None:
    """In the database thread: the stored packed rows of ``(topic,
    partition)`` that hold an offset from ``low`` to ``high`` (which a
    write is about to replace; never for the bus's appends, whose offsets
    are above every stored one: one index look-up finds none) are turned
    into single rows, which the write then replaces as any other (and
    ``ends`` learns that the partition has single rows)."""
    found = conn.execute(
        "SELECT last_offset, first_offset, records FROM topic_log_packs WHERE topic = ? "
        "AND partition_id = ? AND last_offset >= ? AND first_offset <= ?",
        (topic, partition, low, high)).fetchall()
    for last, first, data in found:
        conn.execute("DELETE FROM topic_log_packs WHERE topic = ? AND partition_id = ? "
                     "AND last_offset = ?", (topic, partition, last))
        insert_rows(conn, "topic_log", [(topic, partition, o, key, value) for o, key, value
                                        in _unpacked(last, first, data)], 5, tail=_PLAIN_TAIL)
        ends.wrote(topic, partition, last, False)


def _unpacked(last: int, first: int, data: bytes) -> list[tuple]:
    """:returns: the ``(offset, key, value)`` a packed row keeps (from
    ``first`` to ``last``)."""
    keys, values = msgpack.unpackb(data, raw=False)
    start = last - len(values) + 1
    skip = max(0, first - start)
    return [(start + i, keys[i], None if values[i] is None else bytes(values[i]))
            for i in range(skip, len(values))]


@implementer(ITopicLog)
class SQLiteTopicLog(RunnerView):
    """:class:`~tbmq.interfaces.ITopicLog` on the tables ``topic_log`` and
    ``topic_log_offsets`` of the embedded store file.

    :param runner: the :class:`~tbmq.backends.sqlite_runner.SQLiteRunner`
        of that file (the one of :class:`~tbmq.backends.sqlite.SQLiteStore`).

    Calls made while the runner is not running fail with
    :class:`~tbmq.errors.BackendError`.
    """

    def __init__(self, runner: SQLiteRunner) -> None:
        super().__init__(runner, EMBEDDED_SCHEMA)
        #: what is known of the stored rows (database thread only)
        self._ends = StoredEnds()

    def _writes_op(self) -> TopicLogWrites:
        return TopicLogWrites(self._ends)

    def append(self, records: Iterable[tuple]) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ITopicLog.append`; a record at
        the position (topic, partition, offset) of a stored one replaces
        it.  A compacted record without a key is kept like any other.

        :param records: ``(topic, partition, offset, key, value, headers,
            compacted)`` tuples and
            :class:`~tbmq.backends.topic_records.RecordRun` (kept as one
            packed row each, nothing done per record); read now.
        :returns: a Deferred firing with None when committed, or failing
            with :class:`TypeError`/:class:`ValueError` (nothing stored)
            for a malformed record.
        """
        try:
            checked = check_records(records)
        except (TypeError, ValueError):
            return defer.fail()

        return self._merge(self._writes_op, lambda writes: writes.extend(checked))

    def write(self, records: list, commits: dict, truncates: dict) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ITopicLog.write`: the records,
        the commits and the truncations merged together into the next
        :class:`TopicLogWrites` (one transaction, one COMMIT for a turn's
        writes: not the append alone, then the rest in the transaction
        after it).

        :param records: as for :meth:`append`; read now.
        :param commits: ``{(group, topic, partition): offset}``.
        :param truncates: ``{(topic, partition): before}``.
        :returns: a Deferred firing with None when committed, or failing
            with :class:`TypeError`/:class:`ValueError` for a malformed
            record (nothing stored).
        """
        try:
            checked = check_records(records) if records else ()
        except (TypeError, ValueError):
            return defer.fail()
        offsets = {(g, t, int(p)): int(o) for (g, t, p), o in commits.items()}
        cuts = [(t, int(p), int(before)) for (t, p), before in truncates.items()]

        def merge(writes: TopicLogWrites) -> None:
            if checked:
                writes.extend(checked)
            if offsets:
                writes.offsets.update(offsets)
            for cut in cuts:
                writes.truncate(*cut)

        return self._merge(self._writes_op, merge)

    def commit(self, group: str, topic: str, partition: int, offset: int) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ITopicLog.commit`; the last
        commit of a group on a partition wins.

        :param group: the consumer group.
        :param topic: the topic.
        :param partition: the partition, int.
        :param offset: the next offset to read, int.
        :returns: a Deferred firing with None when committed.
        """
        key = (group, topic, int(partition))
        offset = int(offset)

        def merge(writes: TopicLogWrites) -> None:
            writes.offsets[key] = offset

        return self._merge(self._writes_op, merge)

    def truncate(self, topic: str, partition: int, before: int) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ITopicLog.truncate`.

        :param topic: the topic.
        :param partition: the partition, int.
        :param before: records with a lower offset go (compacted or not).
        :returns: a Deferred firing with None when committed.
        """
        partition, before = int(partition), int(before)
        return self._merge(self._writes_op,
                           lambda writes: writes.truncate(topic, partition, before))

    def delete_topic(self, topic: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ITopicLog.delete_topic`.

        :param topic: the topic; an unknown one is ignored.
        :returns: a Deferred firing with None when committed.
        """
        self._close_writes()
        ends = self._ends

        def delete_topic(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM topic_log WHERE topic = ?", (topic,))
            conn.execute("DELETE FROM topic_log_packs WHERE topic = ?", (topic,))
            conn.execute("DELETE FROM topic_log_offsets WHERE topic = ?", (topic,))
            ends.forget(topic)  # (before the COMMIT: a rollback leaves it knowing less)

        return self._submit(delete_topic)

    def load(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.ITopicLog.load`.

        :returns: a Deferred firing with ``(records, offsets)``: ``records``
            the ``(topic, partition, offset, key, value, headers)`` in
            (topic, partition, offset) order, ``offsets`` ``{(group, topic,
            partition): offset}``; every call made before included.
        """
        self._close_writes()
        ends = self._ends
        return self._submit(lambda conn: _load(conn, ends), write=False)


def _load(conn: sqlite3.Connection, ends: StoredEnds | None = None) -> tuple[list[tuple], dict]:
    """In the database thread: every record (the packed ones unpacked)
    and offset; ``ends`` learns what is stored."""
    records = [
        (topic, partition, offset, key, None if value is None else bytes(value),
         unpack_headers(headers))
        for topic, partition, offset, key, value, headers in conn.execute(
            "SELECT topic, partition_id, log_offset, key, value, headers FROM topic_log "
            "ORDER BY topic, partition_id, log_offset"
        )
    ]
    packed: list[tuple] = []
    for topic, partition, last, first, data in conn.execute(
            "SELECT topic, partition_id, last_offset, first_offset, records FROM topic_log_packs "
            "ORDER BY topic, partition_id, last_offset"):
        packed += [(topic, partition, o, key, value, ())
                   for o, key, value in _unpacked(last, first, data)]
    if ends is not None:
        ends.loaded(records, packed)
    if packed:  # both in order (packed rows never overlap): merged in one pass
        records = list(heapq.merge(records, packed, key=_position))
    offsets = {
        (group, topic, partition): offset
        for group, topic, partition, offset in conn.execute(
            "SELECT group_id, topic, partition_id, next_offset FROM topic_log_offsets"
        )
    }
    return records, offsets


def _position(record: tuple) -> tuple:
    return record[:3]
