"""The ``http`` integration: one HTTP request per message, with treq on
Twisted's ``Agent`` and a pool of persistent connections.

The answer decides: a 2xx status acknowledges the message; a 4xx refuses
it for good (:class:`~tbmq.integrations.core.Rejected`, counted as failed,
not sent again: the request itself is wrong), except 408 Request Timeout
and 429 Too Many Requests, which are retried like a 5xx, a refused
connection or a timeout.
"""

from __future__ import annotations

import base64
import json
from string import Template

from treq.client import HTTPClient
from twisted.web.client import Agent, HTTPConnectionPool

from tbmq.integrations.core import Rejected, Target
from tbmq.model import Message
from tbmq.mqtt import Property

__all__ = ["HttpError", "HttpTarget", "json_body", "payload_text", "user_properties"]

#: 4xx statuses that are retried (the service asks the client to come back)
RETRIED_4XX = frozenset((408, 429))


class HttpError(Exception):
    """A status that is retried (5xx, 408, 429)."""


def payload_text(payload: bytes, encoding: str = "auto") -> tuple[str, bool]:
    """The payload as JSON text.

    :param encoding: ``auto`` (UTF-8 text when it decodes, else base64) or
        ``base64``.
    :returns: ``(text, is_base64)``.
    """
    if encoding != "base64":
        try:
            return payload.decode("utf-8"), False
        except UnicodeDecodeError:
            pass
    return base64.b64encode(payload).decode("ascii"), True


def user_properties(message: Message) -> list[list[str]]:
    """The MQTT 5 user properties of ``message`` [MQTT-3.3.2-17], in order,
    as ``[[name, value], ...]`` (a name may repeat)."""
    return [[name, value] for name, value in message.properties.get(Property.USER_PROPERTY, ())]


def timestamp_ms(message: Message) -> int:
    """:returns: the time ``message`` was received, milliseconds since the epoch."""
    return int(message.received_at * 1000)


def json_body(message: Message, encoding: str = "auto") -> bytes:
    """The default body: one JSON object, ``{"topic", "payload", "qos",
    "retain", "client_id", "user_properties", "timestamp"}`` plus
    ``"payload_encoding": "base64"`` when the payload is base64.

    ``timestamp`` is the time of receipt in milliseconds since the epoch;
    ``client_id`` the publisher's ("" for a message without one);
    ``user_properties`` as :func:`user_properties`.
    """
    text, is_base64 = payload_text(message.payload, encoding)
    body = {"topic": message.topic, "payload": text, "qos": message.qos,
            "retain": message.retain, "client_id": message.publisher,
            "user_properties": user_properties(message), "timestamp": timestamp_ms(message)}
    if is_base64:
        body["payload_encoding"] = "base64"
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


class HttpTarget(Target):
    """Sends each message as one request to ``url``.

    :param config: the :class:`~tbmq.integrations.settings.IntegrationConfig`
        (``url``, ``method``, ``headers``, ``body``, ``payload_encoding``,
        ``concurrency`` persistent connections at most).
    :param reactor: the reactor.
    """

    def __init__(self, config, reactor) -> None:
        super().__init__(config, reactor)
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = config.concurrency
        self.client = HTTPClient(Agent(reactor, pool=self.pool))
        self.method = config.method.upper()
        self.url = config.url
        headers = {name: [value] for name, value in config.headers.items()}
        names = {name.lower() for name in headers}
        self.template = Template(config.body) if config.body is not None else None
        if "content-type" not in names:
            headers["Content-Type"] = ["application/json" if self.template is None
                                       else "text/plain; charset=utf-8"]
        self.headers = headers

    def body(self, message: Message) -> bytes:
        """The request body of ``message``: :func:`json_body`, or the
        ``body`` template with ``${topic}``, ``${payload}`` (as
        :func:`payload_text`), ``${client_id}``, ``${qos}``, ``${retain}``
        (``true``/``false``) and ``${timestamp}`` (ms) replaced; other
        ``${...}`` are left as they are."""
        encoding = self.config.payload_encoding
        if self.template is None:
            return json_body(message, encoding)
        return self.template.safe_substitute(
            topic=message.topic, payload=payload_text(message.payload, encoding)[0],
            client_id=message.publisher, qos=message.qos,
            retain="true" if message.retain else "false",
            timestamp=timestamp_ms(message)).encode("utf-8")

    def send(self, message: Message):
        d = self.client.request(self.method, self.url, headers=self.headers,
                                data=self.body(message))
        return d.addCallback(self._answer)

    def _answer(self, response):
        code = response.code
        # the body is read so that the connection goes back to the pool
        d = response.content()

        def decide(_body):
            if 200 <= code < 300:
                return None
            if 400 <= code < 500 and code not in RETRIED_4XX:
                raise Rejected(f"HTTP {code}")
            raise HttpError(f"HTTP {code}")

        return d.addCallback(decide)

    def stop(self):
        return self.pool.closeCachedConnections()
