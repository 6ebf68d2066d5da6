"""The OpenAPI 3.1 document of the admin API (``/api/openapi.json``), made
from the route table (:mod:`tbmq.ops.api.routes`) and the resource schemas
(:mod:`tbmq.ops.api.schemas`)."""

from __future__ import annotations

import copy
import functools

from tbmq import __version__
from tbmq.ops.api.routes import PUBLIC, ROUTES, WRITE
from tbmq.ops.api.schemas import SCHEMAS

_STATUS_TEXT = {400: "Bad request (not JSON, bad query parameter)",
                401: "No valid login token", 403: "Not allowed (viewer, or no admin user)",
                404: "Unknown resource or id", 405: "Method not allowed",
                409: "Conflict", 422: "The body does not fit its schema",
                501: "Not implemented by this node's bus",
                503: "An outside service (Kafka) did not answer"}


def _error(status: int) -> dict:
    return {"description": _STATUS_TEXT[status], "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Error"}}}}


@functools.lru_cache(maxsize=1)
def _document() -> dict:
    paths: dict = {}
    for route in ROUTES:
        path = "/api/" + "/".join(route.path)
        operation: dict = {
            "operationId": route.handler, "summary": route.summary,
            "tags": [route.path[0]],
            "responses": {str(route.status): {"description": "Success", "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{route.response}"}}}}},
        }
        parameters = [{"name": p[1:-1], "in": "path", "required": True,
                       "schema": {"type": "string"},
                       "description": "percent-encoded (a / is %2F)"}
                      for p in route.path if p.startswith("{")]
        parameters += [{"name": name, "in": "query", "required": False,
                        "schema": {"type": kind}, "description": text}
                       for name, kind, text in route.query]
        if parameters:
            operation["parameters"] = parameters
        if route.body is not None:
            operation["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{route.body}"}}}}
        statuses = set(route.errors)
        if route.access == PUBLIC:
            operation["security"] = []
        else:
            statuses |= {401, 403}
            if route.access == WRITE:
                operation["description"] = "Needs the role admin; every call is logged."
        for status in sorted(statuses):
            operation["responses"][str(status)] = _error(status)
        paths.setdefault(path, {})[route.method.lower()] = operation
    paths["/api/openapi.json"] = {"get": {
        "operationId": "openapi", "summary": "This document", "security": [],
        "tags": ["meta"], "responses": {"200": {"description": "The OpenAPI document",
                                                "content": {"application/json": {}}}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "tbmq admin API", "version": __version__,
                 "description": "Sessions, subscriptions, retained messages, credentials, "
                                "nodes and metrics of a tbmq cluster. Log in at "
                                "/api/auth/login and send the token as "
                                "'Authorization: Bearer <token>'."},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": copy.deepcopy(SCHEMAS),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "bearerFormat": "JWT"}},
        },
        "security": [{"bearer": []}],
    }


def document() -> dict:
    """:returns: the OpenAPI document (a fresh copy)."""
    return copy.deepcopy(_document())
