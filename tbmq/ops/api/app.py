"""The REST admin API (``/api/``) on twisted.web: sessions, subscriptions,
retained messages, credentials, nodes and a metrics snapshot, for the whole
cluster (:mod:`tbmq.ops.api.routes` lists them; ``/api/openapi.json``
documents them).

* Every route but the login and the OpenAPI document needs a login token
  (:class:`tbmq.ops.admins.AdminAuth`): 401 without one or with a bad one,
  403 for a ``viewer`` asking for a change, 403 for everything while no
  admin user exists.
* Answers and errors are JSON; an error is ``{"error": {"status",
  "message", "details"?}}`` with a status that fits: 400 a body that is not
  JSON or a bad query parameter, 404 an unknown path or id, 405 a method
  the path does not take, 409 a conflict, 422 a body that does not fit its
  schema.  A failure of the node itself is a 500 with its message, and is
  logged; no client input leads there.
* Every change is logged with the user who made it, and kept in the last
  :data:`AUDIT_SIZE` entries of ``/api/audit``.
"""

from __future__ import annotations

import base64
import json
import time
from collections import deque
from typing import Any

from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.web import resource, server

from tbmq.errors import ConfigError, CredentialsError
from tbmq.integrations.plugin import IntegrationConflict
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import ClientType
from tbmq.mqtt.topics import TopicError, parse_shared_subscription, validate_topic_filter
from tbmq.mqtt.topics import validate_topic_name
from tbmq.ops.admins import TokenError
from tbmq.ops.api import credentials as creds
from tbmq.ops.api.blocked import ClientListsApi
from tbmq.ops.api.kafka import BusNotDescribed
from tbmq.ops.api.openapi import document
from tbmq.ops.api.routes import PUBLIC, WRITE, match
from tbmq.ops.api.schemas import BodyError, parse_body

log = Logger(observer=LOG_OBSERVER)

#: changes kept for ``/api/audit``
AUDIT_SIZE = 200
#: seconds a disconnect or a removal waits for the registry to show it
SETTLE_TIMEOUT = 5.0
#: the most items of one page
MAX_LIMIT = 1000


class ApiError(Exception):
    """An answer other than success.

    :ivar status: the HTTP status.
    :ivar details: more lines about it.
    """

    def __init__(self, status: int, message: str, details: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.details = details or []


def _flag(request, name: str) -> bool | None:
    raw = request.args.get(name.encode())
    if not raw:
        return None
    text = raw[0].decode("utf-8", "replace").lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ApiError(400, f"query parameter {name} must be true or false, not {text!r}")


def _text(request, name: str, default: str | None = None) -> str | None:
    raw = request.args.get(name.encode())
    if not raw:
        return default
    try:
        return raw[0].decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, f"query parameter {name} is not UTF-8") from None


def _paging(request) -> tuple[int, int]:
    values = []
    for name, default, top in (("offset", 0, None), ("limit", 50, MAX_LIMIT)):
        text = _text(request, name)
        try:
            value = default if text is None else int(text)
        except ValueError:
            raise ApiError(400, f"query parameter {name} must be an integer, not {text!r}") \
                from None
        if value < 0 or (top is not None and not 1 <= value <= top):
            raise ApiError(400, f"query parameter {name} is out of range"
                           + (f" (1..{top})" if top else " (>= 0)"))
        values.append(value)
    return values[0], values[1]


def _page(found: list, offset: int, limit: int, as_json) -> dict:
    """One page of ``found``, its items made JSON by ``as_json``."""
    return {"items": [as_json(x) for x in found[offset:offset + limit]], "total": len(found),
            "offset": offset, "limit": limit}


def _subscription(topic_filter: str, options) -> dict:
    share = parse_shared_subscription(topic_filter)
    return {"topic_filter": topic_filter, "qos": options.qos, "no_local": options.no_local,
            "retain_as_published": options.retain_as_published,
            "retain_handling": options.retain_handling,
            "subscription_id": options.subscription_id,
            "share_group": share[0] if share else None}


def _session(info, subscriptions: int) -> dict:
    return {"client_id": info.client_id, "node": info.service_id, "connected": info.connected,
            "persistent": info.persistent, "client_type": ClientType(info.client_type).value,
            "protocol_level": info.protocol_level,
            "session_expiry_interval": info.session_expiry_interval,
            "connected_at": info.connected_at, "disconnected_at": info.disconnected_at,
            "subscriptions": subscriptions, "address": info.address,
            "username": info.username, "credentials_name": info.credentials_name}


def _matches(info, q: str) -> bool:
    """Whether the lower-case text ``q`` is in the client id, the address,
    the user name or the credentials name of ``info``."""
    return any(q in text.lower() for text in (info.client_id, info.address, info.username,
                                              info.credentials_name) if text)


def _retained(message) -> dict:
    try:
        text = message.payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"topic": message.topic, "qos": message.qos, "payload": text,
            "payload_base64": base64.b64encode(message.payload).decode("ascii"),
            "payload_size": len(message.payload), "received_at": message.received_at,
            "publisher": message.publisher or None, "expires_at": message.expires_at}


class AdminApi(ClientListsApi, resource.Resource):
    """``/api/``: dispatches each request to its route's handler.

    :param node: the node's :class:`tbmq.node_view.NodeView`.
    :param stats: the :class:`tbmq.ops.stats.NodeStats`.
    :param history: the :class:`tbmq.ops.stats.History`.
    :param auth: the :class:`tbmq.ops.admins.AdminAuth`.
    :param clock: ``IReactorTime``.
    :param cluster: the :class:`tbmq.ops.cluster_stats.ClusterStats`
        (``/api/metrics/cluster``), or None (404).
    :param bus: the :class:`tbmq.ops.api.kafka.BusOverview` (``/api/kafka``),
        or None (404).
    :ivar audit_log: the last changes, newest last.
    """

    isLeaf = True

    def __init__(self, node, stats, history, auth, clock, cluster=None, bus=None) -> None:
        super().__init__()
        self.node = node
        self.cluster = cluster
        self.bus = bus
        self.stats = stats
        self.history = history
        self.auth = auth
        self.clock = clock
        self.audit_log: deque = deque(maxlen=AUDIT_SIZE)

    # -- dispatching ------------------------------------------------------------------

    def render(self, request):
        d = defer.ensureDeferred(self._dispatch(request))
        d.addCallback(lambda answer: self._write(request, *answer))
        d.addErrback(self._failed, request)
        return server.NOT_DONE_YET

    async def _dispatch(self, request) -> tuple[int, Any]:
        try:
            # twisted.web splits the path on "/" before percent-decoding
            # each segment: a client id "a/b" sent as "a%2Fb" arrives whole
            segments = [s.decode("utf-8") for s in request.postpath]
        except UnicodeDecodeError:
            raise ApiError(400, "the path is not UTF-8") from None
        if segments and segments[-1] == "":
            segments.pop()
        method = request.method.decode("ascii", "replace")
        if segments == ["openapi.json"] and method == "GET":
            return 200, document()
        route, params, allowed = match(method, segments)
        if route is None:
            if allowed:
                request.setHeader(b"Allow", ", ".join(sorted(allowed)).encode())
                raise ApiError(405, f"{method} is not allowed here (allowed: "
                                    f"{', '.join(sorted(allowed))})")
            raise ApiError(404, f"no such resource: /api/{'/'.join(segments)}")
        user = None
        if route.access != PUBLIC:
            try:
                user = await self.auth.authenticate(
                    (request.getHeader("authorization") or "").strip() or None)
            except TokenError as e:
                if e.status == 401:
                    request.setHeader(b"WWW-Authenticate", b'Bearer realm="tbmq"')
                raise ApiError(e.status, str(e)) from None
            if route.access == WRITE and user.role != "admin":
                raise ApiError(403, f"user {user.name} ({user.role}) may not change anything")
        body = None
        if route.body is not None:
            try:
                body = parse_body(request.content.read(), route.body)
            except BodyError as e:
                raise ApiError(e.status, str(e), e.details) from None
        handler = getattr(self, route.handler)
        result = await handler(request, user=user, body=body, **params)
        return route.status, result

    def _write(self, request, status: int, value: Any) -> None:
        if request._disconnected:
            return
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        request.setResponseCode(status)
        request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
        request.setHeader(b"Cache-Control", b"no-store")
        request.write(data)
        request.finish()

    def _failed(self, failure, request) -> None:
        error = failure.value
        if isinstance(error, ApiError):
            status, message, details = error.status, str(error), error.details
        else:
            log.failure("admin API {method} {path} failed", failure,
                        method=request.method.decode("ascii", "replace"),
                        path=request.uri.decode("latin-1"))
            status, message, details = 500, f"internal error: {error}", []
        body = {"status": status, "message": message}
        if details:
            body["details"] = details
        self._write(request, status, {"error": body})

    def _changed(self, user, action: str, target: str) -> None:
        """Log a change and keep it for ``/api/audit``."""
        log.info("admin {user} {action} {target}", user=user.name, action=action, target=target)
        self.audit_log.append({"time": time.time(), "user": user.name, "action": action,
                               "target": target})

    # -- auth ------------------------------------------------------------------------------

    async def login(self, request, user, body):
        try:
            return await self.auth.login(body["username"], body["password"])
        except TokenError as e:
            log.info("admin login of {name} refused: {why}", name=body["username"], why=str(e))
            raise ApiError(e.status, str(e)) from None

    async def me(self, request, user, body):
        return {"name": user.name, "role": user.role}

    # -- sessions ------------------------------------------------------------------------------

    def _info(self, client_id: str):
        info = self.node.cluster_session(client_id)
        if info is None:
            raise ApiError(404, f"no session of client {client_id!r}")
        return info

    async def list_sessions(self, request, user, body):
        q = (_text(request, "q") or "").lower()
        node = _text(request, "node")
        connected = _flag(request, "connected")
        persistent = _flag(request, "persistent")
        client_type = _text(request, "client_type")
        if client_type is not None and client_type.upper() not in ("DEVICE", "APPLICATION"):
            raise ApiError(400, "query parameter client_type must be DEVICE or APPLICATION")
        offset, limit = _paging(request)
        book = self.node.subscriptions()
        sessions = self.node.cluster_sessions()
        found = []
        for client_id in sorted(sessions):
            info = sessions[client_id]
            if ((q and not _matches(info, q))
                    or (node and info.service_id != node)
                    or (connected is not None and info.connected != connected)
                    or (persistent is not None and info.persistent != persistent)
                    or (client_type and ClientType(info.client_type).value
                        != client_type.upper())):
                continue
            found.append(info)
        return _page(found, offset, limit,
                     lambda info: _session(info, len(book.get(info.client_id, ()))))

    async def show_session(self, request, user, body, client_id):
        info = self._info(client_id)
        subs = self.node.subscriptions_of(client_id)
        backlog = self.node.backlog(client_id)
        queued = inflight = None
        if info.persistent and ClientType(info.client_type) is ClientType.DEVICE:
            queued = await self.node.stored_messages(client_id)
        elif backlog is not None:
            queued = backlog[0]
        if backlog is not None:
            inflight = backlog[1]
        return {"session": _session(info, len(subs)),
                "subscriptions": [_subscription(f, o) for f, o in sorted(subs.items())],
                "queued": queued, "inflight": inflight,
                "will_topic": info.will.topic if info.will is not None else None}

    async def session_subscriptions(self, request, user, body, client_id):
        self._info(client_id)
        subs = self.node.subscriptions_of(client_id)
        return {"client_id": client_id,
                "items": [_subscription(f, o) for f, o in sorted(subs.items())]}

    async def _settle(self, done) -> bool:
        """Wait (at most :data:`SETTLE_TIMEOUT`) until ``done()`` is true."""
        deadline = self.clock.seconds() + SETTLE_TIMEOUT
        while not done():
            if self.clock.seconds() >= deadline:
                return False
            await task.deferLater(self.clock, 0.02, lambda: None)
        return True

    async def disconnect_session(self, request, user, body, client_id):
        info = self._info(client_id)
        if not info.connected:
            raise ApiError(409, f"client {client_id!r} is not connected")
        self.node.disconnect_client(client_id)
        self._changed(user, "disconnected", f"session {client_id} (on {info.service_id})")
        node = self.node

        def gone():
            now = node.cluster_session(client_id)
            return now is None or not now.connected or now.session_id != info.session_id

        done = await self._settle(gone)
        return {"status": "disconnected" if done else "disconnecting", "target": client_id}

    async def remove_session(self, request, user, body, client_id):
        info = self._info(client_id)
        if info.connected:
            raise ApiError(409, f"client {client_id!r} is connected: disconnect it first")
        self.node.clear_session(client_id)
        self._changed(user, "removed", f"session {client_id} (on {info.service_id})")
        node = self.node
        done = await self._settle(lambda: node.cluster_session(client_id) is None)
        return {"status": "removed" if done else "removing", "target": client_id}

    # -- retained messages -------------------------------------------------------------------

    async def list_retained(self, request, user, body):
        topic_filter = _text(request, "filter", "#")
        try:
            validate_topic_filter(topic_filter)
        except TopicError as e:
            raise ApiError(400, f"invalid topic filter {topic_filter!r}: {e}") from None
        if parse_shared_subscription(topic_filter):
            raise ApiError(400, "a shared subscription is not a retained-message filter")
        offset, limit = _paging(request)
        messages = sorted(self.node.retained_for(topic_filter), key=lambda m: m.topic)
        return _page(messages, offset, limit, _retained)

    async def delete_retained(self, request, user, body):
        topic = _text(request, "topic")
        if topic is None:
            raise ApiError(400, "query parameter topic is required")
        try:
            validate_topic_name(topic)
        except TopicError as e:
            raise ApiError(400, f"invalid topic name {topic!r}: {e}") from None
        node = self.node
        if node.retained(topic) is None:
            raise ApiError(404, f"no retained message on {topic!r}")
        # a tombstone on tbmq.msg.retained: every node's tree and store
        # forget it; subscribers get nothing (no empty message is routed)
        result = node.delete_retained(topic)
        if result is not None:
            await result
        self._changed(user, "deleted", f"retained message {topic}")
        await self._settle(lambda: node.retained(topic) is None)
        return {"status": "deleted", "target": topic}

    # -- credentials ------------------------------------------------------------------------------

    async def _record(self, ref: str):
        store = self.node.credential_store
        record = await store.get(ref)
        if record is None:
            for candidate in await store.list():
                if candidate.name == ref:
                    return candidate
            raise ApiError(404, f"no credentials with id or name {ref!r}")
        return record

    async def list_credentials(self, request, user, body):
        records = await self.node.credential_store.list()
        return {"items": [creds.as_json(r) for r in records]}

    async def show_credentials(self, request, user, body, id):
        return creds.as_json(await self._record(id))

    async def _save(self, record):
        try:
            return await self.node.credential_store.save(record)
        except CredentialsError as e:
            status = 409 if "belongs to another record" in str(e) else 422
            raise ApiError(status, str(e)) from None

    async def add_credentials(self, request, user, body):
        try:
            record = await creds.build(body, None)
        except creds.InvalidCredentials as e:
            raise ApiError(422, str(e)) from None
        saved = await self._save(record)
        self._changed(user, "added", f"credentials {saved.name} ({saved.id})")
        return creds.as_json(saved)

    async def change_credentials(self, request, user, body, id):
        old = await self._record(id)
        try:
            record = await creds.build(body, old)
        except creds.InvalidCredentials as e:
            raise ApiError(422, str(e)) from None
        saved = await self._save(record)
        self._changed(user, "changed", f"credentials {saved.name} ({saved.id}): "
                                    f"{', '.join(sorted(k for k in body if k != 'password'))}"
                                    + (", password" if "password" in body else ""))
        return creds.as_json(saved)

    async def remove_credentials(self, request, user, body, id):
        record = await self._record(id)
        await self.node.credential_store.delete(record.id)
        self._changed(user, "removed", f"credentials {record.name} ({record.id})")
        return {"status": "removed", "target": record.id}

    # -- nodes, metrics, audit --------------------------------------------------------------------

    async def list_nodes(self, request, user, body):
        return {"items": self.stats.nodes()}

    async def metrics(self, request, user, body):
        return self.stats.snapshot()

    async def metrics_history(self, request, user, body):
        return {"interval": self.history.interval, "points": list(self.history.points)}

    async def cluster_metrics(self, request, user, body):
        if self.cluster is None:
            raise ApiError(404, "no cluster figures on this node")
        return self.cluster.snapshot()

    async def kafka(self, request, user, body):
        if self.bus is None:
            raise ApiError(404, "no bus overview on this node")
        try:
            return await self.bus.overview()
        except BusNotDescribed as e:
            raise ApiError(501, str(e)) from None
        except Exception as e:  # noqa: BLE001 - Kafka did not answer: said, not a 500
            log.warn("admin API: the bus could not be described: {error}", error=e)
            raise ApiError(503, f"the bus could not be described: {e}") from None

    def _integrations(self):
        integrations = self.node.integrations
        if integrations is None:
            raise ApiError(404, "this node has no integrations")
        return integrations

    async def list_integrations(self, request, user, body):
        return {"items": self._integrations().snapshot()}

    async def put_integration(self, request, user, body):
        try:
            name = await self._integrations().put(body)
        except ConfigError as e:
            raise ApiError(422, str(e)) from None
        except IntegrationConflict as e:
            raise ApiError(409, str(e)) from None
        self._changed(user, "set", f"integration {name}")
        return {"status": "accepted", "target": name}

    async def remove_integration(self, request, user, body, name):
        try:
            await self._integrations().delete(name)
        except KeyError:
            raise ApiError(404, f"no integration {name}") from None
        except IntegrationConflict as e:
            raise ApiError(409, str(e)) from None
        self._changed(user, "removed", f"integration {name}")
        return {"status": "accepted", "target": name}

    async def audit(self, request, user, body):
        return {"items": list(reversed(self.audit_log))}
