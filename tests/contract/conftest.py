"""The bus contract suite's fixtures: one :class:`BusEnv` per test, made by
the ``bus_factory`` fixture for each bus under test.

Tests only talk to the bus through a :class:`BusEnv`, so a bus that needs a
real reactor in a thread and real time (the Kafka bus against a Kafka-protocol
server started once per session) is one more ``bus_factory`` param with its
own :class:`BusEnv` subclass and no change to the tests:

* :meth:`BusEnv.bus` makes a started bus on the test's own topic catalogue
  (a fresh prefix per test, so topics never carry over between tests);
* :meth:`BusEnv.call` runs a function where the bus lives (its reactor
  thread) and returns its result; handlers run there too, so tests keep what
  handlers see in plain lists and read them after :meth:`BusEnv.wait_until`;
* :meth:`BusEnv.run` waits for a Deferred (or passes None through) and
  returns its result or raises its failure; :meth:`BusEnv.publish_done`
  publishes with a ``done`` and gives the list of its outcomes;
* :meth:`BusEnv.settle` lets whatever is under way happen, before a test
  checks that something did *not* happen;
* :meth:`BusEnv.restart` stops a bus and makes a new one that finds what the
  old one kept (the topic log here, the brokers for Kafka).

The flags say what a bus promises beyond the common contract:
``publish_waits_for_consumers`` (in-process: publish fires after the
handlers), ``compacts`` (old values of a key are really gone),
``consumer_failures_fail_publish`` (ConsumerFailedError), ``batches``
(what one reactor turn published to a partition of a traffic topic goes to
a ``batch_handler`` in one call, rather than only what waited).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.cluster.topics import TopicCatalogue
from tbmq.config import KafkaConfig
from tests.helpers import MemoryTopicLog

_prefixes = itertools.count(1)


class BusEnv:
    """What a contract test needs of one bus implementation (see the module
    doc).  Subclasses implement :meth:`_make`, :meth:`call`, :meth:`run`,
    :meth:`wait_until` and :meth:`settle`."""

    name = "?"
    encodes = True
    publish_waits_for_consumers = False
    compacts = False
    consumer_failures_fail_publish = False
    batches = False

    def __init__(self) -> None:
        self.catalogue = TopicCatalogue(f"t{next(_prefixes)}.")
        self.buses: list = []

    def bus(self, **options):
        """:returns: a started bus on :attr:`catalogue` (``partitions``,
        ``max_uncommitted`` may be given)."""
        bus = self._make(**options)
        self.run(self.call(bus.start))
        self.buses.append(bus)
        return bus

    def unstarted_bus(self, **options):
        """:returns: a bus that has not been started."""
        bus = self._make(**options)
        self.buses.append(bus)
        return bus

    def restart(self, bus, **options):
        """Stop ``bus``; :returns: a new started bus that reads back what it
        kept (durable topics, committed offsets)."""
        self.run(self.call(bus.stop))
        return self.bus(**options)

    def publish(self, bus, topic, key, value, headers=()):
        """Publish from the bus's thread; :returns: what publish returned."""
        return self.call(bus.publish, topic, key, value, headers)

    def publish_done(self, bus, topic, key, value, headers=()):
        """Publish with a ``done`` from the bus's thread.

        :returns: ``(returned, outcomes)``: what publish returned, and the
            list ``done`` appends each outcome to (None or a Failure)."""
        outcomes: list = []
        returned = self.call(bus.publish, topic, key, value, headers, outcomes.append)
        return returned, outcomes

    def subscribe(self, bus, topic, group, handler, from_beginning=False, exclusive=False,
                  bundle=None, batch_handler=None):
        """Subscribe from the bus's thread.  ``exclusive`` is the test's
        promise that ``group`` never gets a second member."""
        return self.call(bus.subscribe, topic, group, handler, from_beginning, exclusive,
                         bundle, batch_handler)

    def another_node(self, bus, **options):
        """:returns: the bus as another node of the cluster sees it: ``bus``
        itself in process (one bus is the whole cluster), a new started bus
        on the same brokers for Kafka (its own clients)."""
        return bus

    def close(self) -> None:
        for bus in self.buses:
            try:
                self.run(self.call(bus.stop))
            except Exception:
                pass

    # -- implemented per bus -------------------------------------------------------

    def _make(self, **options):
        raise NotImplementedError

    def call(self, f, *args, **kwargs):
        raise NotImplementedError

    def run(self, d, timeout: float = 10.0):
        raise NotImplementedError

    def wait_until(self, predicate, timeout: float = 10.0) -> None:
        raise NotImplementedError

    def settle(self) -> None:
        raise NotImplementedError


class InProcessEnv(BusEnv):
    """The in-process bus on a :class:`task.Clock`; a :class:`MemoryTopicLog`
    stands for the disk across restarts."""

    publish_waits_for_consumers = True
    compacts = True
    consumer_failures_fail_publish = True

    def __init__(self, encode: bool) -> None:
        super().__init__()
        self.encodes = encode
        self.name = "inprocess-encoded" if encode else "inprocess-direct"
        self.clock = Clock()
        self.clock.advance(1700000000.0)
        self.log = MemoryTopicLog()

    def _make(self, **options):
        return InProcessBus(encode=self.encodes, log=self.log, catalogue=self.catalogue,
                            clock=self.clock, **options)

    def call(self, f, *args, **kwargs):
        return f(*args, **kwargs)

    def run(self, d, timeout: float = 10.0):
        if not isinstance(d, defer.Deferred):
            return d
        out: list = []
        d.addBoth(out.append)
        steps = int(timeout / 0.01)
        while not out and steps > 0:
            self.clock.advance(0.01)
            steps -= 1
        assert out, f"the Deferred did not fire within {timeout} s of bus time"
        result = out[0]
        if isinstance(result, Failure):
            result.raiseException()
        return result

    def wait_until(self, predicate, timeout: float = 10.0) -> None:
        steps = int(timeout / 0.01)
        while not predicate():
            assert steps > 0, f"condition not met within {timeout} s of bus time"
            self.clock.advance(0.01)
            steps -= 1

    def settle(self) -> None:
        for _ in range(20):
            self.clock.advance(0.01)


class KafkaEnv(BusEnv):
    """The Kafka bus with one driver, against the run's Tansu, in the
    private reactor thread (real time).

    Group timeouts are small (a join takes about half the session timeout on
    Tansu).  :meth:`settle` waits until every live consumer is positioned
    (has its partitions and read them to their end: a record published from
    then on reaches it), then a little longer.
    """

    # Kafka promises only what the brokers acknowledged, and Tansu does not
    # compact
    publish_waits_for_consumers = False
    compacts = False
    consumer_failures_fail_publish = False
    batches = True  # packed records

    #: Seconds :meth:`settle` waits after the consumers are positioned.
    SETTLE = 0.3

    def __init__(self, driver: str, bootstrap: str, reactor_thread) -> None:
        super().__init__()
        self.name = f"kafka ({driver})"
        self.rt = reactor_thread
        self.consumers: list = []
        self.config = KafkaConfig(
            bootstrap_servers=bootstrap, driver=driver, topic_prefix=self.catalogue.prefix,
            partitions=1, linger_ms=2, fetch_max_wait_ms=10, max_poll_records=500,
            session_timeout_ms=3000, heartbeat_interval_ms=500, request_timeout_ms=10000)

    def _make(self, partitions: int = 1, **options):
        from tbmq_plugins.kafka.bus import KafkaBus

        config = dataclasses.replace(self.config, partitions=partitions)
        return KafkaBus(config, clock=self.rt.reactor, **options)

    def another_node(self, bus, **options):
        return self.bus(**options)

    def subscribe(self, bus, topic, group, handler, from_beginning=False, exclusive=False,
                  bundle=None, batch_handler=None):
        consumer = super().subscribe(bus, topic, group, handler, from_beginning, exclusive,
                                     bundle, batch_handler)
        self.consumers.append(consumer)
        return consumer

    def call(self, f, *args, **kwargs):
        if self.rt.in_thread():  # from a handler
            return f(*args, **kwargs)
        # a Deferred comes back as it is: the tests wait for it with run()
        return self.rt.call(lambda: [f(*args, **kwargs)])[0]

    def run(self, d, timeout: float = 20.0):
        if not isinstance(d, defer.Deferred):
            return d
        done = threading.Event()
        out: list = []

        def keep(result):
            out.append(result)
            done.set()

        self.rt.reactor.callFromThread(d.addBoth, keep)
        assert done.wait(timeout), f"the Deferred did not fire within {timeout} s"
        result = out[0]
        if isinstance(result, Failure):
            result.raiseException()
        return result

    def wait_until(self, predicate, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"condition not met within {timeout} s"
            time.sleep(0.01)

    def settle(self) -> None:
        def positioned():
            return all(c.positioned for c in self.consumers if not c.stopped)

        self.wait_until(lambda: self.call(positioned), timeout=30.0)
        time.sleep(self.SETTLE)


BUSES = ["inprocess-encoded", "inprocess-direct", "kafka-python", "confluent"]


@pytest.fixture(params=BUSES)
def bus_factory(request):
    """The :class:`BusEnv` of one bus implementation."""
    if request.param == "inprocess-encoded":
        env = InProcessEnv(encode=True)
    elif request.param == "inprocess-direct":
        env = InProcessEnv(encode=False)
    else:
        env = KafkaEnv(request.param, request.getfixturevalue("kafka_bootstrap"),
                       request.getfixturevalue("reactor_thread"))
    yield env
    env.close()


@pytest.fixture
def env(bus_factory):
    return bus_factory
