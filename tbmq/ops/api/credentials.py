"""The credentials resource of the admin API: the records of the broker's
credential store, built and validated by the same code as ``tbmq
credentials`` (:func:`tbmq.auth.records.credentials_value`, then the store's own
``prepare_for_save``).

JSON in (``CredentialsInput``, ``CredentialsChange``): ``pub``/``sub``
absent keeps the rules (``add``: any topic), null allows any topic, ``[]``
none, a list of regexes those topics.  A ``password`` of null removes a
basic record's password.  JSON out (``Credentials``) never carries a
password hash or SCRAM keys, only ``has_password``.
"""

from __future__ import annotations

import dataclasses
import re
import types
import uuid
from typing import Any

from tbmq.auth.records import UsageError, credentials_value
from tbmq.errors import CredentialsError
from tbmq.model import ClientType, Credentials, CredentialsType

#: the API's type names
TYPES = {"basic": CredentialsType.MQTT_BASIC, "x509": CredentialsType.X_509,
         "scram": CredentialsType.SCRAM}
_NAMES = {kind: name for name, kind in TYPES.items()}


def as_json(record: Credentials) -> dict:
    """:returns: ``record`` as the ``Credentials`` schema (no secrets)."""
    value = record.value or {}
    kind = CredentialsType(record.credentials_type)
    rules = value.get("authRules") or {}
    return {
        "id": record.id, "name": record.name, "type": _NAMES[kind],
        "client_type": ClientType(record.client_type).value,
        "credentials_id": record.credentials_id,
        "client_id": value.get("clientId"), "username": value.get("userName"),
        "has_password": bool(value.get("password") or value.get("storedKey")),
        "cn": value.get("certCnPattern"), "cn_regex": bool(value.get("certCnIsRegex")),
        "algorithm": value.get("algorithm"),
        "pub": rules.get("pubAuthRulePatterns"), "sub": rules.get("subAuthRulePatterns"),
        "created_time": record.created_time, "updated_time": record.updated_time,
    }


def _arguments(body: dict, adding: bool) -> types.SimpleNamespace:
    """The options of ``tbmq credentials add/change`` that ``body`` means."""
    args = types.SimpleNamespace(
        client_id=body.get("client_id"), username=body.get("username"),
        password=None, password_stdin=False, no_password=False,
        cn=body.get("cn"), cn_regex=body.get("cn_regex"),
        algorithm=body.get("algorithm"), iterations=body.get("iterations"),
        rounds=body.get("rounds"), name=body.get("name"),
        client_type=body.get("client_type"))
    if "password" in body:
        if body["password"] is None:
            if adding:
                args.password = None
            else:
                args.no_password = True
        else:
            args.password = body["password"]
    if not adding:
        # the CLI reads "" as "remove": JSON says that with null
        for field, key in (("client_id", "client_id"), ("username", "username")):
            if key in body and body[key] is None:
                setattr(args, field, "")
    for direction in ("pub", "sub"):
        setattr(args, direction, None)
        setattr(args, f"no_{direction}", False)
        setattr(args, f"any_{direction}", False)
        if direction in body:
            patterns = body[direction]
            if patterns is None:
                setattr(args, f"any_{direction}", True)
            elif not patterns:
                setattr(args, f"no_{direction}", True)
            else:
                setattr(args, direction, list(patterns))
    return args


class InvalidCredentials(Exception):
    """Options that do not make a valid record (HTTP 422)."""


async def build(body: dict, old: Credentials | None, reactor: Any = None) -> Credentials:
    """The record a ``CredentialsInput`` (``old`` None) or a
    ``CredentialsChange`` of ``old`` describes.

    :raises InvalidCredentials: when the fields do not fit the type, a
        regex does not compile, or a required field is missing.
    """
    adding = old is None
    args = _arguments(body, adding)
    kind = TYPES[body["type"]] if adding else CredentialsType(old.credentials_type)
    try:
        credentials_id, value = await credentials_value(
            args, kind, None if adding else old.value, args.password, reactor)
    except (UsageError, CredentialsError) as e:
        # the CLI's option names, as the JSON fields
        message = re.sub(r"--([a-z-]+)", lambda m: m.group(1).replace("-", "_"), str(e))
        raise InvalidCredentials(message) from None
    if adding:
        return Credentials(id=str(uuid.uuid4()), name=body["name"], credentials_type=kind,
                           credentials_id=credentials_id,
                           client_type=ClientType(body.get("client_type") or "DEVICE"),
                           value=value)
    return dataclasses.replace(
        old, name=body.get("name") or old.name, credentials_id=credentials_id, value=value,
        client_type=ClientType(body["client_type"]) if body.get("client_type")
        else old.client_type)
