"""Helpers of the operations tests: a broker with its HTTP listener, admin
users added with ``tbmq admin add``, and a treq client of its REST API
running in the private reactor thread of :mod:`tests.postgres`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer
from twisted.web.iweb import IBodyProducer
from zope.interface import implementer

from tests.integration.conftest import _finish, _start
from tests.integration.helpers import HOST, REPO_ROOT, TIMEOUT, free_port

#: the admin users of :func:`ops_broker`: name → (password, role)
USERS = {"root": ("root-password-1", "admin"), "watcher": ("watcher-password-1", "viewer")}


def tbmq_cli(data_dir: Path, *args: str, stdin: str = "", env: dict | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
    """Run the ``tbmq`` command (``python -m tbmq.cli``) on ``data_dir``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TBMQ_")}
    environ["PYTHONPATH"] = str(REPO_ROOT)
    environ.update(env or {})
    result = subprocess.run([sys.executable, "-m", "tbmq.cli", "--data-dir", str(data_dir), *args],
                            input=stdin, capture_output=True, text=True, env=environ,
                            timeout=60)
    if check:
        assert result.returncode == 0, f"tbmq {' '.join(args)}: {result.stderr}{result.stdout}"
    return result


def add_admin(data_dir: Path, name: str, password: str, role: str = "admin") -> None:
    """``tbmq admin add`` (bcrypt cost 4: tests only)."""
    tbmq_cli(data_dir, "admin", "add", name, "--role", role, "--password-stdin",
             "--rounds", "4", stdin=password + "\n")


def wait_http(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((HOST, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on HTTP port {port}") from None
            time.sleep(0.05)


def start_ops_broker(workdir: Path, users: dict | None = None, env: dict | None = None):
    """A broker with ``http.endpoint`` on a free loopback port and ``$SYS``
    every second; ``users`` added first.

    :returns: the :class:`~tests.integration.helpers.Broker`, with
        ``http_port`` and ``url``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir = workdir / "data"
    for name, (password, role) in (users or {}).items():
        add_admin(data_dir, name, password, role)
    http_port = free_port()
    settings = {"TBMQ_HTTP__ENDPOINT": f"tcp:{http_port}:interface={HOST}",
                "TBMQ_SYS_INTERVAL": "1"}
    settings.update(env or {})
    broker = _start(workdir, env=settings)
    broker.http_port = http_port
    broker.url = f"http://{HOST}:{http_port}"
    wait_http(http_port)
    return broker


@pytest.fixture(scope="module")
def ops_broker(tmp_path_factory):
    """One broker with HTTP and the admin users of :data:`USERS`, per module."""
    broker = start_ops_broker(tmp_path_factory.mktemp("ops"), USERS)
    yield broker
    _finish(broker)


@implementer(IBodyProducer)
class BytesProducer:
    """A request body written at once (treq's own producer would run on
    the global reactor's cooperator, which does not run in the tests)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)

    def startProducing(self, consumer):
        consumer.write(self.data)
        return defer.succeed(None)

    def pauseProducing(self):
        pass

    def resumeProducing(self):
        pass

    def stopProducing(self):
        pass


class Answer:
    """An HTTP answer: ``status``, ``headers`` (lower-case names), ``body``
    (bytes) and ``json`` (decoded, or None)."""

    def __init__(self, status: int, headers: dict, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        try:
            self.json = json.loads(body) if body else None
        except ValueError:
            self.json = None

    def __repr__(self) -> str:
        return f"<{self.status} {self.body[:300]!r}>"


class Http:
    """treq over real HTTP, in the private reactor thread.

    :param reactor_thread: the :class:`tests.postgres.ReactorThread`.
    :param url: the node's base URL.
    """

    def __init__(self, reactor_thread, url: str) -> None:
        self.rt = reactor_thread
        self.url = url
        self.token: str | None = None

    def request(self, method: str, path: str, *, json_body: Any = None, data: bytes | None = None,
                token: str | None = "default", headers: dict | None = None,
                params: dict | None = None) -> Answer:
        """:param token: "default" sends this client's token, None none."""
        sent = dict(headers or {})
        if token == "default":
            token = self.token
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if json_body is not None:
            data = json.dumps(json_body).encode()
            sent["Content-Type"] = "application/json"

        async def call():
            body = None if data is None else BytesProducer(data)
            response = await treq.request(method, self.url + path, data=body, headers=sent,
                                          params=params, reactor=self.rt.reactor,
                                          timeout=TIMEOUT)
            body = await treq.content(response)
            names = {k.decode().lower(): v[-1].decode()
                     for k, v in response.headers.getAllRawHeaders()}
            return Answer(response.code, names, body)

        return self.rt.run(call)

    def login(self, name: str, password: str) -> str:
        answer = self.request("POST", "/api/auth/login", token=None,
                              json_body={"username": name, "password": password})
        assert answer.status == 200, answer
        self.token = answer.json["token"]
        return self.token

    def get(self, path: str, **kwargs) -> Answer:
        return self.request("GET", path, **kwargs)


def scrape(http: Http) -> dict:
    """``/metrics`` parsed with prometheus-client's parser.

    :returns: ``(sample name, frozenset of label items)`` → value.
    """
    answer = http.get("/metrics", token=None)
    assert answer.status == 200, answer
    assert answer.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(answer.body.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    """One sample of :func:`scrape` (0 when absent)."""
    return samples.get((name, frozenset((k, str(v)) for k, v in labels.items())), 0.0)


def api_session(api: str, client_id: str, admin: tuple[str, str]) -> dict:
    """The session of ``client_id`` as ``GET /api/sessions`` lists it, read
    with the standard library (no reactor thread needed).

    :param api: the node's base URL (``http://127.0.0.1:<port>``).
    :param admin: ``(name, password)`` of an admin user.
    """
    login = urllib.request.Request(
        api + "/api/auth/login", method="POST",
        data=json.dumps({"username": admin[0], "password": admin[1]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(login, timeout=TIMEOUT) as r:
        token = json.load(r)["token"]
    listing = urllib.request.Request(
        api + "/api/sessions?" + urllib.parse.urlencode({"q": client_id}),
        headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(listing, timeout=TIMEOUT) as r:
        items = [s for s in json.load(r)["items"] if s["client_id"] == client_id]
    assert len(items) == 1, items
    return items[0]
