"""The JSON schemas of the admin API's resources (JSON Schema 2020-12, as
OpenAPI 3.1 uses), and the validation of request bodies with
``jsonschema``.  :mod:`tbmq.ops.api.openapi` puts them in the OpenAPI
document; the tests check every answer against them.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator

from tbmq.ops.api.blocked import SCHEMAS as CLIENT_LIST_SCHEMAS

_NUM = {"type": "number"}
_INT = {"type": "integer", "minimum": 0}
_STR = {"type": "string"}
_OPT_NUM = {"type": ["number", "null"]}
_OPT_STR = {"type": ["string", "null"]}
_REGEXES = {"type": ["array", "null"], "items": {"type": "string"},
            "description": "regexes of the topics allowed; null: any, []: none"}


def _object(properties: dict, required: list | None = None, **extra: Any) -> dict:
    schema = {"type": "object", "properties": properties,
              "required": list(properties) if required is None else required,
              "additionalProperties": False}
    schema.update(extra)
    return schema


def _page(item: str) -> dict:
    return _object({"items": {"type": "array", "items": {"$ref": f"#/components/schemas/{item}"}},
                    "total": _INT, "offset": _INT, "limit": _INT})


SCHEMAS: dict[str, dict] = {
    "Error": _object({"error": {"type": "object", "properties": {
        "status": {"type": "integer"}, "message": _STR,
        "details": {"type": "array", "items": _STR}},
        "required": ["status", "message"], "additionalProperties": False}}),
    "Login": _object({"username": {"type": "string", "minLength": 1, "maxLength": 64},
                      "password": {"type": "string", "minLength": 1, "maxLength": 200}}),
    "Token": _object({"token": _STR, "expires_at": _INT, "user": {"$ref": "#/components/schemas/User"}}),
    "User": _object({"name": _STR, "role": {"enum": ["admin", "viewer"]}}),
    "Subscription": _object({
        "topic_filter": _STR, "qos": {"enum": [0, 1, 2]}, "no_local": {"type": "boolean"},
        "retain_as_published": {"type": "boolean"}, "retain_handling": {"enum": [0, 1, 2]},
        "subscription_id": {"type": ["integer", "null"]},
        "share_group": _OPT_STR}),
    "Session": _object({
        "client_id": _STR, "node": _STR, "connected": {"type": "boolean"},
        "persistent": {"type": "boolean"}, "client_type": {"enum": ["DEVICE", "APPLICATION"]},
        "protocol_level": {"enum": [3, 4, 5]}, "session_expiry_interval": _INT,
        "connected_at": _OPT_NUM, "disconnected_at": _OPT_NUM, "subscriptions": _INT,
        "address": {"type": ["string", "null"],
                    "description": "host:port ([host]:port for IPv6) of the client's last "
                                   "connection (behind the PROXY protocol, the proxied one); "
                                   "null: not known"},
        "username": {"type": ["string", "null"],
                     "description": "the user name the client last authenticated with "
                                    "(CONNECT's, or the SCRAM user name); null: none"},
        "credentials_name": {"type": ["string", "null"],
                             "description": "the name of the credentials record that "
                                            "admitted the client; null: none (anonymous, "
                                            "JWT)"}}),
    "SessionDetail": _object({
        "session": {"$ref": "#/components/schemas/Session"},
        "subscriptions": {"type": "array", "items": {"$ref": "#/components/schemas/Subscription"}},
        "queued": {"type": ["integer", "null"],
                   "description": "messages waiting for the client (null: not known here)"},
        "inflight": {"type": ["integer", "null"]},
        "will_topic": _OPT_STR}),
    "SessionPage": _page("Session"),
    "SubscriptionList": _object({"client_id": _STR, "items": {
        "type": "array", "items": {"$ref": "#/components/schemas/Subscription"}}}),
    "Accepted": _object({"status": _STR, "target": {
        "type": "string", "description": "the client id, topic or record id acted upon"}}),
    "RetainedMessage": _object({
        "topic": _STR, "qos": {"enum": [0, 1, 2]}, "payload": _OPT_STR,
        "payload_base64": _STR, "payload_size": _INT, "received_at": _NUM,
        "publisher": _OPT_STR, "expires_at": _OPT_NUM}),
    "RetainedPage": _page("RetainedMessage"),
    "Credentials": _object({
        "id": _STR, "name": _STR, "type": {"enum": ["basic", "x509", "scram"]},
        "client_type": {"enum": ["DEVICE", "APPLICATION"]}, "credentials_id": _STR,
        "client_id": _OPT_STR, "username": _OPT_STR, "has_password": {"type": "boolean"},
        "cn": _OPT_STR, "cn_regex": {"type": "boolean"}, "algorithm": _OPT_STR,
        "pub": _REGEXES, "sub": _REGEXES, "created_time": _OPT_NUM, "updated_time": _OPT_NUM}),
    "CredentialsList": _object({"items": {"type": "array",
                                          "items": {"$ref": "#/components/schemas/Credentials"}}}),
    "CredentialsInput": _object({
        "type": {"enum": ["basic", "x509", "scram"]},
        "name": {"type": "string", "minLength": 1, "maxLength": 255},
        "client_type": {"enum": ["DEVICE", "APPLICATION"]},
        "client_id": _OPT_STR, "username": _OPT_STR,
        "password": {"type": ["string", "null"], "maxLength": 72,
                     "description": "basic, scram; null (basic) removes it"},
        "cn": _STR, "cn_regex": {"type": "boolean"},
        "algorithm": {"enum": ["SHA256", "SHA512"]},
        "iterations": {"type": "integer", "minimum": 4096},
        "rounds": {"type": "integer", "minimum": 4, "maximum": 31},
        "pub": _REGEXES, "sub": _REGEXES}, required=["type", "name"]),
    "CredentialsChange": _object({
        "name": {"type": "string", "minLength": 1, "maxLength": 255},
        "client_type": {"enum": ["DEVICE", "APPLICATION"]},
        "client_id": _OPT_STR, "username": _OPT_STR,
        "password": {"type": ["string", "null"], "maxLength": 72},
        "cn": _STR, "cn_regex": {"type": "boolean"},
        "algorithm": {"enum": ["SHA256", "SHA512"]},
        "iterations": {"type": "integer", "minimum": 4096},
        "rounds": {"type": "integer", "minimum": 4, "maximum": 31},
        "pub": _REGEXES, "sub": _REGEXES}, required=[], minProperties=1),
    "Node": _object({
        "service_id": _STR, "alive": {"type": "boolean"}, "this": {"type": "boolean"},
        "started_at": _OPT_NUM, "last_seen": _OPT_NUM, "stopping": {"type": "boolean"},
        "listeners": {"type": "array", "items": _STR}, "sessions": _INT}),
    "NodeList": _object({"items": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}}),
    "MetricsSnapshot": {
        "type": "object",
        "required": ["service_id", "version", "time", "uptime", "node", "cluster"],
        "properties": {
            "service_id": _STR, "version": _STR, "time": _NUM, "uptime": _NUM,
            "node": {"type": "object", "description": "this node's figures"},
            "cluster": {"type": "object", "description": "the whole cluster's figures"}},
        "additionalProperties": False},
    "MetricsHistory": _object({"interval": _NUM, "points": {"type": "array", "items": _object({
        "t": _NUM, "received": _NUM, "sent": _NUM, "dropped": _NUM, "auth_failures": _NUM,
        "connections": _INT,
        "sessions": _INT, "cluster_sessions": _INT})}}),
    "ClusterMetrics": _object({
        "time": _NUM, "interval": _NUM,
        "nodes": {"type": "integer", "minimum": 1, "description": "live nodes summed"},
        "totals": {"type": "object", "additionalProperties": _INT,
                   "description": "the live nodes' heartbeat counters summed: received, sent, "
                                  "received_bytes, sent_bytes, bytes_read, bytes_written, "
                                  "dropped (since each node started), connections, sessions "
                                  "(now)"},
        "rates": {"type": "object", "additionalProperties": _NUM,
                  "description": "per second, summed over the live nodes: received, sent, "
                                 "dropped, received_bytes, sent_bytes, bytes_read, "
                                 "bytes_written"},
        "by_node": {"type": "array", "items": _object({
            "service_id": _STR, "this": {"type": "boolean"}, "alive": {"type": "boolean"},
            "sent_at": {"type": "number", "description": "when the figures were read "
                                                         "(the node's last heartbeat)"},
            "counters": {"type": "object", "additionalProperties": _INT},
            "rates": {"type": "object", "additionalProperties": _NUM,
                      "description": "over the node's last two heartbeats; empty until "
                                     "two were heard"}})},
        "points": {"type": "array", "items": _object({
            "t": _NUM, "received": _NUM, "sent": _NUM, "dropped": _NUM, "connections": _INT,
            "sessions": _INT, "nodes": _INT})}}),
    "KafkaOverview": _object({
        "bus": {"enum": ["kafka", "in-process"]}, "driver": _OPT_STR, "time": _NUM,
        "topics": {"type": "array", "items": _object({
            "name": _STR, "partitions": _INT,
            "latest_offsets": {"type": "array", "items": {"type": ["integer", "null"]},
                               "description": "per partition, the offset of the next record "
                                              "(Tansu: too low, see the README)"},
            "records": {"type": ["integer", "null"],
                         "description": "the latest offsets summed: the records written "
                                       "(the Kafka bus packs several messages per record)"}})},
        "consumer_groups": {"type": "array", "items": _object({
            "group": _STR, "state": _OPT_STR,
            "members": {"type": ["integer", "null"], "description": "null: not known"},
            "total_lag": {"type": ["integer", "null"]},
            "topics": {"type": "array", "items": _object({
                "topic": _STR, "lag": {"type": ["integer", "null"]},
                "partitions": {"type": "array", "items": _object({
                    "partition": _INT, "committed": {"type": ["integer", "null"]},
                    "latest": {"type": ["integer", "null"]},
                    "lag": {"type": ["integer", "null"]}})}})}})},
        "errors": {"type": "array", "items": _STR,
                   "description": "what the bus could not read (e.g. Tansu's DescribeGroups)"}}),
    "Integration": _object({
        "name": _STR, "type": {"enum": ["http", "kafka", "mqtt"]},
        "topic_filters": {"type": "array", "items": _STR}, "enabled": {"type": "boolean"},
        "sent": _INT, "failed": _INT, "retried": _INT, "dropped": _INT,
        "buffer_messages": _INT, "buffer_bytes": _INT, "in_flight": _INT,
        "retrying": {"type": "boolean"}, "last_error": _OPT_STR,
        "source": {"enum": ["config", "api"]}}),
    "IntegrationInput": {
        "type": "object", "required": ["name", "type", "topic_filters"],
        "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 200},
                       "type": {"enum": ["http", "kafka", "mqtt"]},
                       "topic_filters": {"type": "array", "items": _STR, "minItems": 1}},
        "description": "the keys of an entry of the config file's integrations "
                       "(checked as the config file is)"},
    "IntegrationList": _object({"items": {"type": "array",
                                          "items": {"$ref": "#/components/schemas/Integration"}}}),
    "AuditEntry": _object({"time": _NUM, "user": _STR, "action": _STR, "target": _STR}),
    "AuditList": _object({"items": {"type": "array", "items": {"$ref": "#/components/schemas/AuditEntry"}}}),
}
SCHEMAS.update(CLIENT_LIST_SCHEMAS)


def resolved(name: str) -> dict:
    """:returns: the schema ``name`` with its ``$ref`` inlined (for
    validation outside the OpenAPI document)."""
    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if ref is not None:
                return inline(SCHEMAS[ref.rsplit("/", 1)[1]])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(SCHEMAS[name])


_VALIDATORS: dict[str, Draft202012Validator] = {}


class BodyError(Exception):
    """A request body that is not JSON (``status`` 400) or does not fit its
    schema (422).

    :ivar details: what is wrong, one line per error.
    """

    def __init__(self, message: str, status: int, details: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.details = details or []


def validate(name: str, value: Any) -> None:
    """Check ``value`` against schema ``name``.

    :raises BodyError: 422 with one line per error.
    """
    validator = _VALIDATORS.get(name)
    if validator is None:
        validator = _VALIDATORS[name] = Draft202012Validator(resolved(name))
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
    if errors:
        details = [f"{'/'.join(map(str, e.path)) or '(body)'}: {e.message}" for e in errors]
        raise BodyError(f"the body does not fit {name}", 422, details)


def parse_body(data: bytes, name: str) -> Any:
    """Decode a JSON body and check it against schema ``name``.

    :raises BodyError: 400 when it is not UTF-8 JSON, 422 when it does not
        fit.
    """
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise BodyError(f"the body is not JSON: {e}", 400) from None
    validate(name, value)
    return value
