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
  returns its result or raises its failure;
* :meth:`BusEnv.settle` lets whatever is under way happen, before a test
  checks that something did *not* happen;
* :meth:`BusEnv.restart` stops a bus and makes a new one that finds what the
  old one kept (the topic log here, the brokers for Kafka).

The flags say what a bus promises beyond the common contract:
``publish_waits_for_consumers`` (in-process: publish fires after the
handlers), ``compacts`` (old values of a key are really gone),
``consumer_failures_fail_publish`` (ConsumerFailedError).
"""

from __future__ import annotations

import itertools

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from tbmq.backends.inprocess_bus import InProcessBus
from tbmq.cluster.topics import TopicCatalogue
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

    def subscribe(self, bus, topic, group, handler, from_beginning=False):
        return self.call(bus.subscribe, topic, group, handler, from_beginning)

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


@pytest.fixture(params=["inprocess-encoded", "inprocess-direct"])
def bus_factory(request):
    """The :class:`BusEnv` of one bus implementation."""
    if request.param == "inprocess-encoded":
        env = InProcessEnv(encode=True)
    else:
        env = InProcessEnv(encode=False)
    yield env
    env.close()


@pytest.fixture
def env(bus_factory):
    return bus_factory
