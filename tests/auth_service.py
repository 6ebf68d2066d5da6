"""An HTTP authentication service for the tests of the ``http`` provider:
:class:`http.server.ThreadingHTTPServer` in a thread on a free loopback
port, recording every request and answering what the test sets."""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


@dataclass
class Seen:
    """One request the service received.

    :ivar method: ``GET`` or ``POST``.
    :ivar path: the path, query included.
    :ivar query: the query parameters (name → first value).
    :ivar headers: header name (lower case) → value.
    :ivar body: the raw body.
    """

    method: str
    path: str
    query: dict
    headers: dict
    body: bytes

    @property
    def json(self):
        return json.loads(self.body)


class AuthService:
    """The service; ``with AuthService() as s:`` starts and stops it.

    :param tls: ``(certificate chain file, key file)`` to serve HTTPS, or None.
    :ivar url: ``http://127.0.0.1:<port>/auth``, or ``https://localhost:<port>/auth``.
    :ivar seen: the requests received, in order.
    :ivar answer: ``answer(seen) -> (status, body, delay)``: what to send
        (the body a dict is JSON-encoded; ``delay`` seconds waited first).
    """

    def __init__(self, tls: tuple[str, str] | None = None) -> None:
        self.seen: list[Seen] = []
        self.answer: Callable = lambda seen: (200, {"result": "allow"}, 0)
        self._lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                query = {k: v[0] for k, v in urllib.parse.parse_qs(
                    urllib.parse.urlsplit(self.path).query, keep_blank_values=True).items()}
                seen = Seen(self.command, self.path, query,
                            {k.lower(): v for k, v in self.headers.items()}, body)
                with service._lock:
                    service.seen.append(seen)
                status, answer, delay = service.answer(seen)
                if delay:
                    time.sleep(delay)
                data = json.dumps(answer).encode() if isinstance(answer, dict) else answer
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (a timeout test)

            do_GET = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{port}/auth"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.url = f"https://localhost:{port}/auth"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "AuthService":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset(self, answer: Callable | None = None) -> None:
        """Forget the requests seen; answer with ``answer`` from now on."""
        with self._lock:
            self.seen.clear()
        if answer is not None:
            self.answer = answer
