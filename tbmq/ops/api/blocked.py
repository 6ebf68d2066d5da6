"""The blocked clients and the unauthorized-client log in the admin API
(TBMQ's ``/api/blockedClient`` and ``/api/unauthorizedClient``):

* ``GET /api/blocked-clients``: the current entries (``BlockedClientList``);
* ``POST /api/blocked-clients`` with ``BlockedClientInput``
  (``{"type": "client_id", "value": "evil", "regex_target": null,
  "expires_at": null}``): adds the entry on every node and answers it
  (``BlockedClient``, with its ``id``), 201; an entry that cannot be made
  (an unknown type, a regex that does not compile, a bad IP address, an
  expiry already past, ``regex_target`` with another type) is a 400 saying
  which field; a body whose fields have the wrong JSON types a 422;
* ``DELETE /api/blocked-clients/{id}``: removes it on every node, 404 for
  an unknown id;
* ``GET /api/unauthorized-clients``: the last refused attempt per client
  id, newest first (``UnauthorizedClientList``); ``DELETE`` forgets them on
  every node.

The handlers are a mixin of :class:`tbmq.ops.api.app.AdminApi` (the route
table, :mod:`tbmq.ops.api.routes`, names them); they use the node's
blocked clients and unauthorized-client log through its
:class:`tbmq.node_view.NodeView` (``blocked_clients``, ``block_client``,
``unauthorized_attempts``, ...).
"""

from __future__ import annotations

import time

from tbmq.cluster.blocked import InvalidEntry, new_entry

_NUM = {"type": "number"}
_OPT_NUM = {"type": ["number", "null"]}
_STR = {"type": "string"}
_OPT_STR = {"type": ["string", "null"]}
_TYPE_TEXT = "client_id, username, ip_address or regex"
_TARGET_TEXT = "for regex: the field it matches (client_id, username or ip_address; " \
               "client_id when null); null for the other types"


def _object(properties: dict, required: list) -> dict:
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


def _list(item: str) -> dict:
    return _object({"items": {"type": "array", "items": {"$ref": f"#/components/schemas/{item}"}},
                    "total": {"type": "integer", "minimum": 0}}, ["items", "total"])


#: the schemas of these resources (merged into :data:`tbmq.ops.api.schemas.SCHEMAS`)
SCHEMAS: dict[str, dict] = {
    "BlockedClientInput": _object({
        "type": {"type": "string", "description": _TYPE_TEXT},
        "value": {"type": "string", "description": "the client id, user name, IP address or "
                                                   "regular expression (Python re, matched "
                                                   "against the whole field)"},
        "regex_target": {"type": ["string", "null"], "description": _TARGET_TEXT},
        "expires_at": {"type": ["number", "null"],
                       "description": "seconds since the epoch; null: never"},
        "description": _OPT_STR}, ["type", "value"]),
    "BlockedClient": _object({
        "id": {"type": "string", "description": "derived from type, regex_target and value: "
                                                "adding the same entry again replaces it"},
        "type": {"enum": ["client_id", "username", "ip_address", "regex"]},
        "value": _STR, "regex_target": {"enum": ["client_id", "username", "ip_address", None]},
        "expires_at": _OPT_NUM, "created_at": _NUM, "description": _OPT_STR},
        ["id", "type", "value", "regex_target", "expires_at", "created_at", "description"]),
    "BlockedClientList": _list("BlockedClient"),
    "UnauthorizedClient": _object({
        "client_id": _STR, "address": _OPT_STR, "username": _OPT_STR,
        "reason": {"type": "string", "description": "the CONNACK reason code and the provider "
                                                    "that refused"},
        "time": _NUM, "password_provided": {"type": "boolean"},
        "certificate_provided": {"type": "boolean"},
        "node": {"type": "string", "description": "the service id of the refusing node"}},
        ["client_id", "address", "username", "reason", "time", "password_provided",
         "certificate_provided", "node"]),
    "UnauthorizedClientList": _object({
        "items": {"type": "array", "items": {"$ref": "#/components/schemas/UnauthorizedClient"}},
        "total": {"type": "integer", "minimum": 0},
        "evicted": {"type": "integer", "minimum": 0,
                    "description": "attempts this node dropped at "
                                   "mqtt.unauthorized_clients.max_entries"}},
        ["items", "total", "evicted"]),
}


def blocked_json(entry) -> dict:
    """:returns: a :class:`~tbmq.cluster.client_records.BlockedClient` as
    the ``BlockedClient`` schema."""
    return {"id": entry.id, "type": entry.type, "value": entry.value,
            "regex_target": entry.regex_target, "expires_at": entry.expires_at,
            "created_at": entry.created_at, "description": entry.description}


def attempt_json(attempt) -> dict:
    """:returns: an :class:`~tbmq.cluster.client_records.UnauthorizedAttempt`
    as the ``UnauthorizedClient`` schema."""
    return {"client_id": attempt.client_id, "address": attempt.address,
            "username": attempt.username, "reason": attempt.reason, "time": attempt.at,
            "password_provided": attempt.password_provided,
            "certificate_provided": attempt.certificate_provided, "node": attempt.service_id}


class ClientListsApi:
    """The handlers (a mixin of :class:`~tbmq.ops.api.app.AdminApi`, which
    gives ``node``, ``clock`` and ``_changed``)."""

    async def list_blocked(self, request, user, body):
        entries = self.node.blocked_clients()
        return {"items": [blocked_json(e) for e in entries], "total": len(entries)}

    async def add_blocked(self, request, user, body):
        from tbmq.ops.api.app import ApiError  # noqa: PLC0415 (app imports this module)

        try:
            entry = new_entry(body["type"], body["value"], body.get("regex_target"),
                              body.get("expires_at"), time.time(), body.get("description"))
        except InvalidEntry as e:
            raise ApiError(400, str(e)) from None
        await self.node.block_client(entry)
        self._changed(user, "blocked", f"{entry.type} {entry.value!r} ({entry.id})")
        return blocked_json(entry)

    async def remove_blocked(self, request, user, body, id):
        from tbmq.ops.api.app import ApiError  # noqa: PLC0415

        entry = self.node.blocked_client(id)
        removed = self.node.unblock_client(id)
        if removed is None:
            raise ApiError(404, f"no blocked client entry {id!r}")
        await removed
        self._changed(user, "unblocked", f"{entry.type} {entry.value!r} ({id})")
        return {"status": "removed", "target": id}

    async def list_unauthorized(self, request, user, body):
        attempts = self.node.unauthorized_attempts()
        return {"items": [attempt_json(a) for a in attempts], "total": len(attempts),
                "evicted": self.node.unauthorized_evicted}

    async def clear_unauthorized(self, request, user, body):
        count = await self.node.clear_unauthorized()
        self._changed(user, "cleared", f"{count} unauthorized client attempts")
        return {"status": "cleared", "target": str(count)}
