"""The subscription book on its own (:class:`tbmq.cluster.registry.SubscriptionBook`):
a write is done once this node's consumer read it back, so that a SUBACK
sent then is true on this node, whatever the bus's acknowledgement means."""

from __future__ import annotations

from twisted.internet import defer, task

from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.cluster.records import Record, SubscriptionsRecord
from tbmq.cluster.registry import SubscriptionBook
from tbmq.cluster.topics import TopicCatalogue
from tbmq.errors import BusPublishError
from tbmq.model import SubscriptionOptions

TOPIC = "tbmq.client.subscriptions"


class AckFirstBus:
    """Kafka's order of things: the publish is acknowledged (or refused) at
    once, and the consumer reads the record when :meth:`read` says so."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.written: list[Record] = []
        self.handler = None

    def subscribe(self, topic, group, handler, from_beginning=False, exclusive=False,
                  bundle=None):
        self.handler = handler

        class Consumer:
            caught_up = defer.succeed(None)

        return Consumer()

    def publish(self, topic, key, value, headers=()):
        if self.fail:
            return defer.fail(BusPublishError("not acknowledged"))
        self.written.append(Record(topic, key, value, tuple(headers), 0, len(self.written)))
        return defer.succeed(None)

    def read(self) -> None:
        written, self.written = self.written, []
        for record in written:
            self.handler(record)


class Trie:
    def __init__(self) -> None:
        self.filters: set[tuple[str, str]] = set()

    def add_subscription(self, client_id, topic_filter, share, options):
        self.filters.add((client_id, topic_filter))

    def remove_subscription(self, client_id, topic_filter, share):
        self.filters.discard((client_id, topic_filter))


def book_on(bus, clock=None):
    trie = Trie()
    book = SubscriptionBook(bus, TOPIC, "node-a", trie, clock or task.Clock())
    book.start()
    return book, trie


OPTIONS = SubscriptionOptions(1)


def test_a_write_is_done_once_this_nodes_consumer_read_it_not_at_the_acknowledgement():
    bus = AckFirstBus()
    book, trie = book_on(bus)
    done = []
    book.put("dev-1", {"a/b": OPTIONS}).addCallback(done.append)
    assert done == [] and trie.filters == set()  # acknowledged, not read yet
    bus.read()
    assert done == [None]
    assert trie.filters == {("dev-1", "a/b")}
    assert book._unread == {}


def test_another_writers_record_of_the_same_client_does_not_end_the_wait():
    bus = AckFirstBus()
    book, trie = book_on(bus)
    done = []
    book.put("dev-1", {"a/b": OPTIONS}).addCallback(done.append)
    mine = bus.written.pop()
    # another node restates the client's subscriptions first, with its own write id
    bus.handler(Record(TOPIC, "dev-1", SubscriptionsRecord("dev-1", {"x": OPTIONS}),
                       ((SubscriptionBook.WRITE_HEADER, b"node-b/0000/1"),), 0, 0))
    assert done == []
    bus.handler(mine)
    assert done == [None] and ("dev-1", "a/b") in trie.filters


def test_a_write_not_read_back_in_time_fails_and_is_forgotten():
    bus = AckFirstBus()
    clock = task.Clock()
    book, _ = book_on(bus, clock)
    failures = []
    book.put("dev-1", {"a/b": OPTIONS}).addErrback(failures.append)
    clock.advance(SubscriptionBook.READ_BACK_TIMEOUT - 1)
    assert failures == []
    clock.advance(1)
    assert len(failures) == 1 and failures[0].check(BusPublishError)
    assert book._unread == {}
    bus.read()  # read late: nothing left to fire, nothing raised
    assert clock.getDelayedCalls() == []


def test_a_refused_write_fails_with_the_bus_error_and_leaves_no_wait():
    book, trie = book_on(AckFirstBus(fail=True))
    failures = []
    book.put("dev-1", {"a/b": OPTIONS}).addErrback(failures.append)
    assert failures[0].check(BusPublishError)
    assert book._unread == {} and trie.filters == set()


def test_on_the_in_process_bus_the_trie_has_it_when_the_call_returns():
    clock = task.Clock()
    topics = TopicCatalogue()
    bus = InProcessBus(clock=clock, catalogue=topics, encode=True)
    bus.start()
    trie = Trie()
    book = SubscriptionBook(bus, topics.client_subscriptions, "node-a", trie, clock)
    book.start()
    result = book.put("dev-1", {"a/b": OPTIONS})
    fired = []
    if isinstance(result, defer.Deferred):
        result.addCallback(fired.append)
    else:
        fired.append(result)
    assert fired == [None]
    assert trie.filters == {("dev-1", "a/b")}
    assert book._unread == {}
    assert [c for c in clock.getDelayedCalls() if c.func == book._not_read_back] == []
    book.put("dev-1", {})
    assert trie.filters == set()
