"""What every device message store shares
(:class:`~tbmq.interfaces.IDeviceMessageStore`): the checks of the paging
arguments of ``load`` and of the per-client limit, the merging of writes
accepted while the database is busy (:class:`DeliveryWrites`), and the
bytes a delivery is kept as by the cluster's stores (Redis, PostgreSQL):
the ``dlv`` record of :mod:`tbmq.cluster.records`, the one documented,
versioned encoding of ``tbmq.msg.persisted``.
"""

from __future__ import annotations

from itertools import repeat

from twisted.internet import defer

from tbmq.backends.merged_writes import MergedWrites
from tbmq.cluster.records import DELIVERY, Delivery
from tbmq.model import DeliveryState, StoredDelivery

__all__ = [
    "DeliveryWrites",
    "RunsAsAdds",
    "check_limit",
    "check_page",
    "decode_delivery",
    "encode_delivery",
    "run_deliveries",
    "update_many",
]


def check_page(after_seq: int | None, limit: int | None) -> None:
    """Check the paging arguments of
    :meth:`tbmq.interfaces.IDeviceMessageStore.load`.

    :raises ValueError: for a negative ``limit``.
    :raises TypeError: for a ``limit`` or ``after_seq`` that is not an int.
    """
    for name, value in (("after_seq", after_seq), ("limit", limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an int or None, not {value!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")


def check_limit(max_messages_per_client: int | None) -> int | None:
    """:returns: ``max_messages_per_client`` when it is None or >= 1.
    :raises ValueError: otherwise."""
    if max_messages_per_client is not None and max_messages_per_client < 1:
        raise ValueError(
            f"max_messages_per_client must be >= 1 or None, not {max_messages_per_client}")
    return max_messages_per_client


def run_deliveries(first_seq: int, messages, qos: int, retain: bool = False,
                   subscription_ids: tuple = ()) -> list[StoredDelivery]:
    """:returns: the :class:`~tbmq.model.StoredDelivery` of each of
    ``messages`` as :meth:`tbmq.interfaces.IDeviceMessageStore.add_run`
    queues them: order keys ``first_seq``, ``first_seq + 1``, ..., each at
    ``qos`` with ``retain`` and ``subscription_ids``, queued.
    :raises TypeError: for a ``first_seq`` that is not an int."""
    if isinstance(first_seq, bool) or not isinstance(first_seq, int):
        raise TypeError(f"first_seq must be an int, not {first_seq!r}")
    sids = tuple(subscription_ids)
    return [StoredDelivery(seq, message, qos, retain, sids)
            for seq, message in enumerate(messages, first_seq)]


class RunsAsAdds:
    """:meth:`~tbmq.interfaces.IDeviceMessageStore.add_run` for a device
    store that writes a run as an ``add`` of its deliveries
    (:func:`run_deliveries`: the cluster's stores, whose cost per message
    is the server's; the in-memory one)."""

    __slots__ = ()

    def add_run(self, client_id: str, first_seq: int, messages, qos: int,
                retain: bool = False, subscription_ids: tuple = ()) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.add_run`:
        ``self.add`` of the run's deliveries.

        :returns: a Deferred as ``add``'s, or failing with
            :class:`TypeError` for a ``first_seq`` that is not an int."""
        try:
            deliveries = run_deliveries(first_seq, messages, qos, retain, subscription_ids)
        except Exception:
            return defer.fail()
        return self.add(client_id, deliveries)


def update_many(store, client_id: str, updates: list[tuple[int, int | None, int]]):
    """Record several updates of ``client_id``'s deliveries in ``store``
    (an :class:`~tbmq.interfaces.IDeviceMessageStore`): with one call of
    its ``update_many`` when it has one (the embedded SQLite store: one
    merged write and one Deferred), else one
    :meth:`~tbmq.interfaces.IDeviceMessageStore.update` each.

    :param updates: ``(seq, packet_id, state)`` each, in order.
    :returns: a Deferred firing with None once all are committed, or
        failing with the first failure.
    """
    many = getattr(store, "update_many", None)
    if many is not None:
        return many(client_id, updates)
    if len(updates) == 1:
        return store.update(client_id, *updates[0])
    return defer.DeferredList(
        [store.update(client_id, seq, pid, state) for seq, pid, state in updates],
        fireOnOneErrback=True, consumeErrors=True,
    ).addCallbacks(lambda _: None, lambda failure: failure.value.subFailure)


def encode_delivery(client_id: str, delivery: StoredDelivery) -> bytes:
    """:returns: the ``dlv`` record (:data:`tbmq.cluster.records.DELIVERY`)
        of ``delivery`` for ``client_id``: everything but its packet id and
        state, which a store keeps beside it as they change.
    :raises tbmq.errors.RecordEncodingError: when a field does not fit
        (a retain flag that is not a bool, a QoS out of range, ...)."""
    return DELIVERY.encode(Delivery(
        client_id, delivery.message, delivery.qos, delivery.retain,
        tuple(delivery.subscription_ids), delivery.seq))


def decode_delivery(data: bytes, packet_id: int | None, state: int) -> StoredDelivery:
    """Inverse of :func:`encode_delivery`.

    :param data: the ``dlv`` record.
    :param packet_id: the packet identifier kept beside it, or None.
    :param state: the :class:`~tbmq.model.DeliveryState` kept beside it.
    :raises tbmq.errors.RecordEncodingError: for bytes that are not a
        ``dlv`` record of a known version."""
    d = DELIVERY.decode(data)
    return StoredDelivery(d.seq, d.message, d.qos, d.retain, d.subscription_ids,
                          packet_id, DeliveryState(state))


class DeliveryWrites(MergedWrites):
    """Device store writes accepted while the database is busy, merged per
    (client id, seq) into one operation of the next batch; a backend
    subclasses it with the ``__call__`` that writes them.

    A delivery queued, sent and acknowledged before its batch runs costs no
    row at all: its put and update are replaced by one delete (of a row
    that may exist from an earlier batch).  The operation keeps its place in
    the store's queue, the place of its first write; once the store hands
    it to the database it is *sealed*, and later writes open a new one, as
    do writes after a read or a clear (which must see, or follow, them in
    order).

    :ivar puts: (client id, seq) → the row to insert or replace, a list
        whose last two items are the packet id and the state, so that an
        update can patch them in place.
    :ivar updates: (client id, seq) → (packet id, state) of rows written by
        an earlier batch.
    :ivar deletes: (client id, seq) of rows to delete.
    :ivar waiters: ``(Deferred, client id)`` of the merged calls, fired
        together after the COMMIT; the client id of an ``add``, None for
        the others (:class:`~tbmq.backends.merged_writes.MergedWrites`).
    :ivar limit: the most deliveries kept per client (``add``'s trim), or
        None.

    Run, it writes the rows (deletes, updates, then puts), trims every
    client it added to down to ``limit`` rows (the lowest seqs go), and
    returns ``{client id: rows removed}``; each client's last ``add``
    reports its removals, the others 0.
    """

    __slots__ = ("puts", "updates", "deletes", "limit")

    def __init__(self, limit: int | None = None) -> None:
        super().__init__()
        self.puts: dict[tuple[str, int], list] = {}
        self.updates: dict[tuple[str, int], tuple[int | None, int]] = {}
        self.deletes: set[tuple[str, int]] = set()
        self.limit = limit

    def put(self, key: tuple[str, int], row: list) -> None:
        self.deletes.discard(key)
        self.updates.pop(key, None)
        self.puts[key] = row

    def put_all(self, client_id: str, rows: list) -> None:
        """:meth:`put` of each of ``rows`` (their second item is the seq):
        new keys of an ``add`` go straight in when nothing of this
        operation is to be updated or deleted."""
        puts = self.puts
        if self.deletes or self.updates:
            put = self.put
            for row in rows:
                put((client_id, row[1]), row)
            return
        for row in rows:
            puts[(client_id, row[1])] = row

    def update(self, key: tuple[str, int], packet_id: int | None, state: int) -> None:
        row = self.puts.get(key)
        if row is not None:
            row[-2] = packet_id
            row[-1] = state
        elif key not in self.deletes:
            self.updates[key] = (packet_id, state)

    def update_all(self, client_id: str, updates) -> None:
        """:meth:`update` of each ``(seq, packet_id, state)`` of
        ``updates``, in order (one loop: the outbox sends a turn's updates
        of a session together)."""
        puts, pending, deletes = self.puts, self.updates, self.deletes
        for seq, packet_id, state in updates:
            key = (client_id, int(seq))
            row = puts.get(key)
            if row is not None:
                row[-2] = packet_id
                row[-1] = int(state)
            elif key not in deletes:
                pending[key] = (packet_id, int(state))

    def delete(self, key: tuple[str, int]) -> None:
        self.puts.pop(key, None)
        self.updates.pop(key, None)
        self.deletes.add(key)

    def delete_all(self, client_id: str, seqs) -> None:
        """:meth:`delete` of ``(client_id, seq)`` for each of ``seqs``
        (without a merged put or update, a drain's removals: no bytecode
        per seq)."""
        puts, pending, add = self.puts, self.updates, self.deletes.add
        if not (puts or pending):
            self.deletes.update(zip(repeat(client_id), map(int, seqs)))
            return
        for seq in seqs:
            key = (client_id, int(seq))
            if puts:
                puts.pop(key, None)
            if pending:
                pending.pop(key, None)
            add(key)

    def added_clients(self) -> set[str]:
        """:returns: the client ids of the merged ``add`` calls (to trim)."""
        return {client for _, client in self.waiters if client is not None}

    def results(self, outcome: dict[str, int], tags: list) -> list:
        """:returns: per merged call, None for an update or remove, for an
        ``add`` the removals of its client when it is the client's last,
        else 0."""
        last = {client: i for i, client in enumerate(tags) if client is not None}
        return [
            None if client is None else (outcome.get(client, 0) if last[client] == i else 0)
            for i, client in enumerate(tags)
        ]
