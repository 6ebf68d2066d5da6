"""A persistent session drains its device store a page at a time
(:data:`tbmq.broker.store_reads.StoreReader.READ_PAGE`): sending starts
after the first page, the next is read while less than a page waits, and
every stored message comes once, in order."""

from __future__ import annotations

from tbmq.broker.store_reads import StoreReader
from tbmq.mqtt.constants import Property
from tbmq.mqtt.packets import Disconnect, Puback, Publish
from tests.helpers import Harness
from tests.unit.test_protocol import sub


def test_a_drain_reads_pages_of_at_most_read_page_and_keeps_about_one_ahead(monkeypatch):
    monkeypatch.setattr(StoreReader, "READ_PAGE", 3)
    h = Harness({"mqtt": {"max_queued_messages": 1000}})
    s = h.client("s", level=5, properties={Property.SESSION_EXPIRY_INTERVAL: 60,
                                           Property.RECEIVE_MAXIMUM: 2})
    sub(s, "t")
    s.send(Disconnect())
    s.lose()
    p = h.client("p")
    for i in range(20):
        p.send(Publish("t", b"%d" % i, qos=1, packet_id=i + 1))
    reads = []  # (limit, deliveries waiting in memory when the read began)
    store = h.broker.device_store
    load = store.load

    def recorded(client_id, after_seq=None, limit=None):
        session = h.broker.sessions.sessions.get(client_id)
        reads.append((limit, len(session.queue) if session is not None else 0))
        return load(client_id, after_seq, limit)

    monkeypatch.setattr(store, "load", recorded)
    s2 = h.client("s", level=5, clean_start=False,
                  properties={Property.SESSION_EXPIRY_INTERVAL: 60, Property.RECEIVE_MAXIMUM: 2})
    got, batch = [], list(s2.pending) + s2.received()
    for _ in range(60):
        if not batch:
            break
        got += batch
        for m in batch:
            s2.send(Puback(m.packet_id))
        batch = s2.received()
    assert [m.payload for m in got] == [b"%d" % i for i in range(20)]
    # 20 messages, pages of 3 (half the queue limit would be 500): 7 reads or more
    assert len(reads) >= 7 and all(limit == 3 for limit, _ in reads)
    assert all(waiting < 3 for _, waiting in reads), reads
    session = h.broker.sessions.sessions["s"]
    assert not session.outbox.paged_out and len(session.queue) == 0
