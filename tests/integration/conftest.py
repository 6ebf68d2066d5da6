"""Fixtures of the end-to-end suite (ARCHITECTURE.md §6.5): the real broker
in a ``twistd -n tbmq`` subprocess and real clients.

* ``broker``: one broker per test module (unique topics and client ids keep
  the tests apart); a module sets ``BROKER_ENV = {...}`` to configure it.
* ``broker_factory``: ``broker_factory(env=..., config=...)`` starts a fresh
  broker for one test (stopped at the end).
* ``mqtt``: ``mqtt(version, client_id=None, clean_session=True)`` makes a
  :class:`~tests.integration.helpers.PahoClient` on the ``broker``;
  ``mqtt.connect(version, ...)`` also connects it; all closed at the end.
* ``raw``: ``raw(level=5)`` opens a raw socket to the ``broker``.
* ``mqtt_version``: 4 (3.1.1) and 5.

When a test fails, the output of every broker still running is printed
(pytest shows it under "Captured stdout teardown"); a broker that died during
a test fails the test.
"""

from __future__ import annotations

import pytest

from tests.certs import make_pki
from tests.integration.helpers import Broker, PahoClient, RawClient

#: brokers currently started by a fixture
_LIVE: list[Broker] = []


def _start(workdir, env=None, config=None) -> Broker:
    broker = Broker(workdir, env=env, config=config)
    broker.start()
    _LIVE.append(broker)
    return broker


def _finish(broker: Broker) -> None:
    crashed = broker.crashed
    try:
        broker.stop()
    finally:
        broker.kill()
        if broker in _LIVE:
            _LIVE.remove(broker)
    if crashed:
        pytest.fail(f"the broker on port {broker.port} died (exit {broker.proc.returncode}):\n"
                    f"{broker.log()[-30000:]}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(autouse=True)
def _broker_watch(request):
    """Print the broker logs when a test failed; fail a test that crashed
    the broker."""
    yield
    rep = getattr(request.node, "rep_call", None)
    failed = rep is not None and rep.failed
    dead = [b for b in _LIVE if b.crashed]
    if failed or dead:
        for b in _LIVE:
            print(f"\n===== broker on port {b.port} (running={b.running}) =====")
            print(b.log()[-30000:])
    if dead:
        pytest.fail(f"broker process(es) died during the test: "
                    f"{[(b.port, b.proc.returncode) for b in dead]}")


@pytest.fixture(scope="module")
def broker(request, tmp_path_factory):
    """One broker for the module, configured by the module's ``BROKER_ENV``."""
    env = getattr(request.module, "BROKER_ENV", None)
    workdir = tmp_path_factory.mktemp("broker")
    b = _start(workdir, env=env)
    yield b
    _finish(b)


@pytest.fixture
def broker_factory(tmp_path):
    """``broker_factory(env=None, config=None)`` → a started :class:`Broker`
    for this test only."""
    started: list[Broker] = []

    def make(env=None, config=None) -> Broker:
        b = _start(tmp_path / f"broker{len(started)}", env=env, config=config)
        started.append(b)
        return b

    yield make
    for b in started:
        _finish(b)


class ClientFactory:
    """Makes paho clients on one broker port and closes them all at the end."""

    def __init__(self, port_of) -> None:
        self._port_of = port_of
        self.clients: list[PahoClient] = []

    def __call__(self, version: int = 4, client_id: str | None = None,
                 clean_session: bool = True, port: int | None = None) -> PahoClient:
        client = PahoClient(port or self._port_of(), version, client_id, clean_session)
        self.clients.append(client)
        return client

    def connect(self, version: int = 4, client_id: str | None = None,
                clean_session: bool = True, port: int | None = None, **kwargs) -> PahoClient:
        """A new client, connected (``kwargs`` go to ``connect_and_wait``)."""
        return self(version, client_id, clean_session, port).connect_and_wait(**kwargs)

    def close(self) -> None:
        for client in self.clients:
            client.close()


@pytest.fixture
def mqtt(request):
    """Paho clients on the module's ``broker``."""
    factory = ClientFactory(lambda: request.getfixturevalue("broker").port)
    yield factory
    factory.close()


@pytest.fixture
def raw(request):
    """``raw(level=5, port=None, decode=True)`` → a :class:`RawClient` on the
    ``broker``."""
    sockets: list[RawClient] = []

    def make(level: int = 5, port: int | None = None, decode: bool = True) -> RawClient:
        client = RawClient(port or request.getfixturevalue("broker").port, level, decode=decode)
        sockets.append(client)
        return client

    yield make
    for client in sockets:
        client.close()


@pytest.fixture(params=[4, 5], ids=["v311", "v5"])
def mqtt_version(request) -> int:
    return request.param


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A test CA, a server certificate and client certificates
    (:func:`tests.certs.make_pki`), one set per module."""
    return make_pki(tmp_path_factory.mktemp("pki"))
