"""What the integration tests send to: an HTTP server in a thread that can
answer errors or be stopped and started again, and helpers to read a node's
``/metrics`` and wait."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.parser import text_string_to_metric_families

from tests.integration import helpers
from tests.integration.helpers import HOST, TIMEOUT, free_port


class Sink:
    """An HTTP server on a free loopback port that records each request.

    :ivar status: the status it answers (200; a test sets 500 or 400).
    :ivar bodies: the JSON bodies of the requests answered 2xx, in order.
    :ivar refused: requests answered with another status.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}/ingest"
        self.status = 200
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.refused = 0
        self.connections: list = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> "Sink":
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with sink.lock:
                    sink.connections.append(self.connection)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with sink.lock:
                    status = sink.status
                    if 200 <= status < 300:
                        sink.bodies.append(json.loads(body))
                        sink.headers.append(dict(self.headers))
                    else:
                        sink.refused += 1
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer((HOST, self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close the open connections' server side."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            with self.lock:
                connections, self.connections = self.connections, []
            for connection in connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.thread.join(5)
            self.server = None

    def payloads(self) -> list[str]:
        with self.lock:
            return [b["payload"] for b in self.bodies]


def wait_for(check, what: str, timeout: float = TIMEOUT * 2):
    """:func:`tests.integration.helpers.wait_for`, ``what`` second and a
    longer default ``timeout``."""
    return helpers.wait_for(check, timeout, interval=0.05, what=what)


def integration_metrics(http_port: int) -> dict[tuple[str, str], float]:
    """``{(metric name, integration name): value}`` of the node's
    ``tbmq_integration_*`` series."""
    with urllib.request.urlopen(f"http://{HOST}:{http_port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("tbmq_integration_"):
                found[(sample.name, sample.labels["integration"])] = sample.value
    return found
