"""PageReads: the node's reads of the device store in flight are bounded;
the sessions past the bound wait in turn, and a session whose connection
went while it waited reads nothing."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.internet import defer

from tbmq.broker.store_reads import NO_SEQS, PageReads, StoreReader, delivery_size
from tbmq.model import Message, StoredDelivery


class Store:
    """A device store whose loads wait until answered."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, defer.Deferred]] = []

    def load(self, client_id, after_seq=0, limit=None):
        d = defer.Deferred()
        self.loads.append((client_id, d))
        return d


def reader(name: str, store: Store, reads: PageReads):
    link = SimpleNamespace(disconnected=[])
    link.disconnect = link.disconnected.append
    outbox = SimpleNamespace(
        log=SimpleNamespace(failures=[], failure=lambda *a, **k: outbox.log.failures.append(a)),
        client_id=name, link=link, queue_limit=100, _last_seq=0, inflight={}, paged_out=True,
        queued_bytes=0, queue=(),
        ctx=SimpleNamespace(device_store=store, page_reads=reads),
        _remove_completed=lambda: None, pump=lambda: None, _queue_to_fill=list)
    return StoreReader(outbox)


def test_reads_past_the_limit_wait_and_start_in_turn():
    store, reads = Store(), PageReads(limit=2)
    readers = [reader(f"c{n}", store, reads) for n in range(5)]
    for r in readers:
        r.page_in()
    assert all(r.loading for r in readers)
    assert [c for c, _ in store.loads] == ["c0", "c1"] and len(reads.waiting) == 3
    store.loads[1][1].callback([])  # c1 done: c2 starts
    assert [c for c, _ in store.loads] == ["c0", "c1", "c2"]
    assert not readers[1].loading and readers[1].outbox.paged_out is False
    store.loads[0][1].errback(RuntimeError("store down"))  # a failure lets the next go too
    assert readers[0].outbox.log.failures and readers[0].outbox.link.disconnected
    assert [c for c, _ in store.loads][3:] == ["c3"]
    readers[4].outbox.link = None  # its connection went while it waited
    store.loads[2][1].callback([])
    store.loads[3][1].callback([])
    assert [c for c, _ in store.loads] == ["c0", "c1", "c2", "c3"]  # c4 read nothing
    assert not readers[4].loading
    assert reads.running == 0 and not reads.waiting


def test_a_delivery_finished_during_a_read_makes_the_set_then():
    # a read from below a seq this connection took (read again from the
    # start) leaves out what finishes meanwhile
    store, reads = Store(), PageReads()
    r = reader("c", store, reads)
    r.outbox._last_seq = 9
    assert r.finished_in_read is NO_SEQS
    r.read_again()
    assert r.screened and r.rewound == 9
    assert r.finished_in_read is NO_SEQS  # none yet: no set per read
    r.finished([7])
    assert r.finished_in_read == {7}


def test_a_page_after_every_seq_taken_remembers_nothing():
    # a drain's page: it reads after every seq taken on this connection, so
    # nothing in flight or finished can be in it
    store, reads = Store(), PageReads()
    r = reader("c", store, reads)
    r.outbox._last_seq = 9
    r.page_in()
    assert r.loading and not r.screened
    r.finished([7, 8])
    assert r.finished_in_read is NO_SEQS


def test_a_page_of_queued_deliveries_is_queued_in_one_piece():
    # a drain's page (all queued, none left out): queued whole, its sizes
    # summed as delivery_size sums each, the last seq taken
    store, reads = Store(), PageReads()
    r = reader("c", store, reads)
    queue = []
    r.outbox._queue_to_fill = lambda: queue
    r.page_in()
    page = [StoredDelivery(seq, Message("t", b"x" * seq), 1) for seq in range(1, 51)]
    store.loads[0][1].callback(page)
    assert queue == page and r.outbox._last_seq == 50
    assert r.outbox.queued_bytes == sum(map(delivery_size, page))
    assert len(store.loads) == 1 and not r.loading and r.outbox.paged_out  # (the pump asks the next)
