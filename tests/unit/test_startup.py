"""Tests of a node's start (:mod:`tbmq.service`, :mod:`tbmq.plugins`): a
listener that cannot listen is one line naming the cause and the setting,
a listener accepts nothing before the broker has started, and the log tells
what each plugin serves for this config (issue 23)."""

from __future__ import annotations

import errno

import pytest
from twisted.internet import error
from twisted.internet.testing import MemoryReactorClock

from tbmq.backends.memory import MemoryDeviceMessageStore
from tbmq.broker.broker import Broker
from tbmq.config import load_config
from tbmq.errors import ConfigError, StartupError
from tbmq.hookspecs import hookimpl
from tbmq.plugins import first_result, make_plugin_manager
from tbmq.service import BrokerService

MEMORY = {"storage": {"backend": "memory"}, "auth": {"credentials": "memory"},
          "node": {"service_id": "test"}, "sys_interval": 0}


def config_of(**overrides):
    return load_config(None, environ={}, overrides={**MEMORY, **overrides})


class Port:
    """A listening port that records whether the reactor reads it."""

    def __init__(self, number: int, calls: list) -> None:
        self.number = number
        self.calls = calls

    def stopReading(self) -> None:
        self.calls.append(("stop reading", self.number))

    def startReading(self) -> None:
        self.calls.append(("start reading", self.number))

    def getHost(self):
        return type("Host", (), {"host": "127.0.0.1", "port": self.number})()

    def stopListening(self) -> None:
        self.calls.append(("closed", self.number))


class Reactor(MemoryReactorClock):
    """A memory reactor whose ports in ``busy`` are in use."""

    def __init__(self, busy=()) -> None:
        super().__init__()
        self.busy = set(busy)
        self.calls: list = []

    def listenTCP(self, port, factory, backlog=50, interface=""):
        if port in self.busy:
            raise error.CannotListenError(
                interface, port, OSError(errno.EADDRINUSE, "Address already in use"))
        self.calls.append(("listen", port))
        return Port(port, self.calls)


def listeners(*endpoints):
    return [{"name": f"l{i}", "endpoint": e} for i, e in enumerate(endpoints)]


# -- listening ------------------------------------------------------------------


def test_an_endpoint_twisted_does_not_read_fails_when_the_node_is_made():
    config = config_of(listeners=listeners("tcp:abc"))
    with pytest.raises(ConfigError) as info:
        BrokerService(config, reactor=Reactor())
    assert str(info.value) == ("listeners[0].endpoint: invalid endpoint 'tcp:abc': "
                               "invalid literal for int() with base 10: 'abc'")


def test_an_http_endpoint_twisted_does_not_read_fails_when_the_node_is_made():
    config = config_of(http={"endpoint": "tcp:x"})
    with pytest.raises(ConfigError) as info:
        BrokerService(config, reactor=Reactor())
    assert str(info.value).startswith("http.endpoint: invalid endpoint 'tcp:x': ")


def test_an_address_in_use_fails_the_privileged_start_in_one_line(log):
    reactor = Reactor(busy={1884})
    config = config_of(listeners=listeners("tcp:1883", "tcp:1884:interface=127.0.0.1"))
    node = BrokerService(config, reactor=reactor)
    with pytest.raises(StartupError) as info:
        node.privilegedStartService()
    message = ("cannot listen on tcp:1884:interface=127.0.0.1: address already in use "
               "(listeners[1].endpoint)")
    assert str(info.value) == message
    assert f"tbmq could not start: {message}" in log
    # the listener bound before it is closed again
    assert reactor.calls == [("listen", 1883), ("stop reading", 1883), ("closed", 1883)]
    assert node.ports == []


def test_a_listener_accepts_once_the_broker_has_started():
    reactor = Reactor()
    node = BrokerService(config_of(listeners=listeners("tcp:1883", "tcp:1884")),
                         reactor=reactor)
    started = []
    node.broker.start = lambda: reactor.calls.append("broker started") or _succeed()
    node.privilegedStartService()  # twistd: before the reactor runs
    assert reactor.calls == [("listen", 1883), ("stop reading", 1883),
                             ("listen", 1884), ("stop reading", 1884)]
    node.started.addCallback(started.append)
    node.startService()
    assert reactor.calls[4:] == ["broker started", ("start reading", 1883),
                                 ("start reading", 1884)]
    assert started == [node]


def test_without_the_privileged_step_start_binds_paused_first():
    reactor = Reactor()
    node = BrokerService(config_of(listeners=listeners("tcp:1883")), reactor=reactor)
    node.broker.start = lambda: reactor.calls.append("broker started") or _succeed()
    node.startService()
    assert reactor.calls == [("listen", 1883), ("stop reading", 1883), "broker started",
                             ("start reading", 1883)]


def test_a_listener_failing_after_the_start_fails_started_with_the_line(log):
    reactor = Reactor(busy={1883})
    node = BrokerService(config_of(listeners=listeners("tcp:1883")), reactor=reactor)
    failures = []
    node.started.addErrback(failures.append)
    node.startService()
    (failure,) = failures
    assert failure.check(StartupError)
    assert failure.getErrorMessage() == ("cannot listen on tcp:1883: address already in use "
                                         "(listeners[0].endpoint)")
    assert ("tbmq could not start: cannot listen on tcp:1883: address already in use "
            "(listeners[0].endpoint)") in log


def test_a_stop_while_the_broker_starts_is_no_failure(log):
    """SIGTERM during the start: the start cut short is not reported as a
    failure (no traceback, ``started`` does not fail, so the process exits
    as after any stop), and no listener is opened afterwards."""
    from twisted.internet import defer  # noqa: PLC0415

    reactor = Reactor()
    node = BrokerService(config_of(listeners=listeners("tcp:1883")), reactor=reactor)
    starting = defer.Deferred()
    node.broker.start = lambda: starting
    node.broker.stop = lambda: _succeed()
    outcomes = []
    node.started.addBoth(outcomes.append)
    node.startService()
    node.stopService()
    starting.errback(RuntimeError("the device store was closed"))
    assert outcomes == []
    assert ("start reading", 1883) not in reactor.calls
    assert not [line for line in log if "could not start" in line]
    assert "tbmq stopped while it was starting (the device store was closed)" in log


def _succeed():
    from twisted.internet import defer  # noqa: PLC0415

    return defer.succeed(None)


# -- what the log says of each plugin -------------------------------------------


def plugin_lines(log) -> list[str]:
    return sorted(line for line in log if line.startswith("plugin "))


def test_disabled_plugins_are_logged_as_disabled(log):
    config = config_of(auth={"credentials": "memory", "providers": ["basic"]},
                       plugins={"events": {"enabled": False}})
    make_plugin_manager(config, load_entry_points=True)
    lines = plugin_lines(log)
    for line in ("plugin disabled: events (plugins.events.enabled: false)",
                 "plugin disabled: jwt (not in auth.providers)",
                 "plugin disabled: scram (not in auth.providers)",
                 "plugin disabled: x509 (not in auth.providers)"):
        assert line in lines
    assert not [line for line in lines if "active" in line and
                any(name in line for name in ("events", "jwt", "scram", "x509"))], lines


def test_the_embedded_node_logs_cluster_backends_as_unused(log):
    from tbmq_plugins.kafka import plugin as kafka  # noqa: PLC0415
    from tbmq_plugins.postgres import plugin as postgres  # noqa: PLC0415
    from tbmq_plugins.redis_store import plugin as redis  # noqa: PLC0415

    config = config_of()
    pm = make_plugin_manager(config, load_entry_points=False)
    for name, plugin in (("kafka", kafka), ("postgres", postgres), ("redis", redis)):
        pm.register(plugin, name=name)
    Broker(config, pm, MemoryReactorClock())
    assert plugin_lines(log) == [
        "plugin active: anonymous (authentication)",
        "plugin active: embedded (bus memory; retained store memory; device store memory; "
        "credentials memory)",
        "plugin active: rules (authorization)",
        "plugin disabled: http (not in auth.providers)",
        "plugin loaded, unused: kafka (provides nothing this config uses)",
        "plugin loaded, unused: postgres (provides nothing this config uses)",
        "plugin loaded, unused: redis (provides nothing this config uses)",
    ]


class DeviceStorePlugin:
    """Gives the device store ``redis`` (a memory one, for the test)."""

    @hookimpl
    def tbmq_device_message_store(self, config):
        if config.storage.device_store_name != "redis":
            return None
        return MemoryDeviceMessageStore(10)


def test_the_plugin_whose_factory_answered_is_named(log):
    config = config_of(storage={"backend": "memory", "device_store": "redis"})
    pm = make_plugin_manager(config, load_entry_points=False)
    pm.register(DeviceStorePlugin(), name="fake")
    store, name = first_result(pm.hook.tbmq_device_message_store, config=config)
    assert isinstance(store, MemoryDeviceMessageStore) and name == "fake"
    assert first_result(pm.hook.tbmq_device_message_store, config=config_of()) \
        [1] == "embedded"
    Broker(config, pm, MemoryReactorClock())
    assert "plugin active: fake (device store redis)" in log
    assert ("plugin active: embedded (bus memory; retained store memory; "
            "credentials memory)") in log
