"""Building credentials records, shared by the ``tbmq credentials`` command
(:mod:`tbmq.cli`) and the admin API's credentials resource
(:mod:`tbmq.ops.api.credentials`): both turn their options into the
``(credentials_id, value)`` of a :class:`tbmq.model.Credentials` record with
:func:`credentials_value`, so a record the API adds is the record the
command would add.  Neither imports the other for it.

Records follow TBMQ's ``mqtt_client_credentials``: MQTT_BASIC by client id
and/or user name (password as a bcrypt hash), X_509 by certificate CN (or a
CN regex), SCRAM by user name (salted keys, RFC 5802/7677).
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Sequence

from twisted.internet import defer, threads

from tbmq.errors import CredentialsError
from tbmq.model import CredentialsType

__all__ = ["UsageError", "basic_credentials_id", "credentials_value"]


class UsageError(Exception):
    """The options do not fit the record (exit status 2)."""


def basic_credentials_id(client_id: str | None, username: str | None) -> str:
    """TBMQ's lookup key of MQTT_BASIC credentials.

    :param client_id: the client id it authenticates, or None.
    :param username: the user name, or None.
    :returns: ``mixed|<c>|<u>``, ``username|<u>`` or ``client_id|<c>``.
    :raises UsageError: when both are None (TBMQ requires one).
    """
    if client_id is not None and username is not None:
        return f"mixed|{client_id}|{username}"
    if username is not None:
        return f"username|{username}"
    if client_id is not None:
        return f"client_id|{client_id}"
    raise UsageError("basic credentials need a --client-id, a --username or both")


def _rules(args: argparse.Namespace, old: dict | None) -> dict | None:
    """The ``authRules`` after the options; None when there are none."""
    rules = dict(old or {})
    for direction, key in (("pub", "pubAuthRulePatterns"), ("sub", "subAuthRulePatterns")):
        patterns = getattr(args, direction)
        if patterns is not None:
            rules[key] = list(patterns)
        elif getattr(args, f"no_{direction}"):
            rules[key] = []
        elif getattr(args, f"any_{direction}"):
            rules.pop(key, None)
    return rules or None


def _optional(value: str | None, old: Any) -> Any:
    """An option that may remove a field: None keeps ``old``, "" removes."""
    if value is None:
        return old
    return value or None


def _reject(args: argparse.Namespace, kind: CredentialsType, names: Sequence[str]) -> None:
    """:raises UsageError: when an option of another type is given."""
    given = [n for n in names if getattr(args, n.replace("-", "_"), None) not in (None, False)]
    if given:
        raise UsageError(
            f"{kind.value} credentials take no " + ", ".join(f"--{n}" for n in given))


def _in_thread(reactor: Any, f: Any, *args: Any) -> defer.Deferred:
    """Run ``f(*args)`` in ``reactor``'s thread pool (the global reactor's
    when None)."""
    if reactor is None:
        return threads.deferToThread(f, *args)
    return threads.deferToThreadPool(reactor, reactor.getThreadPool(), f, *args)


async def credentials_value(args: Any, kind: CredentialsType, old: dict | None,
                            password: str | None, reactor: Any = None) -> tuple[str, dict]:
    """Build ``(credentials_id, value)`` from the options and the old value
    (``tbmq credentials`` and the admin API, :mod:`tbmq.ops.api.credentials`).

    Hashing runs in a thread (bcrypt and PBKDF2 take tens of milliseconds).

    :param args: the parsed options (an ``argparse.Namespace`` or any
        object with the same attributes).
    :param kind: the :class:`~tbmq.model.CredentialsType`.
    :param old: the value being changed, or None for a new record.
    :param password: the new password, or None.
    :raises UsageError: options that do not fit the type, or a missing one.
    :raises CredentialsError: an invalid regex or password.
    """
    from tbmq.auth.passwords import hash_password, scram_credentials  # noqa: PLC0415

    old = dict(old or {})
    value: dict = {}
    if kind is CredentialsType.MQTT_BASIC:
        _reject(args, kind, ["cn", "cn-regex", "algorithm", "iterations"])
        rounds = getattr(args, "rounds", None) or 10
        if not 4 <= rounds <= 31:
            raise UsageError("--rounds must be between 4 and 31")
        client_id = _optional(args.client_id, old.get("clientId"))
        username = _optional(args.username, old.get("userName"))
        hashed = old.get("password")
        if getattr(args, "no_password", False):
            hashed = None
        elif password is not None:
            hashed = await _in_thread(reactor, hash_password, password, rounds)
        value = {"clientId": client_id, "userName": username, "password": hashed}
        credentials_id = basic_credentials_id(client_id, username)
    elif kind is CredentialsType.X_509:
        _reject(args, kind, ["client-id", "username", "password", "password-stdin",
                             "no-password", "algorithm", "iterations", "rounds"])
        cn = args.cn if args.cn is not None else old.get("certCnPattern")
        if not cn:
            raise UsageError("x509 credentials need a --cn")
        is_regex = args.cn_regex if args.cn_regex is not None else bool(old.get("certCnIsRegex"))
        if is_regex:
            try:
                re.compile(cn)
            except re.error as e:
                raise CredentialsError(f"--cn {cn!r} is not a valid regex: {e}") from None
        value = {"certCnPattern": cn, "certCnIsRegex": is_regex}
        credentials_id = cn
    else:
        _reject(args, kind, ["client-id", "cn", "cn-regex", "no-password", "rounds"])
        username = args.username if args.username is not None else old.get("userName")
        if not username:
            raise UsageError("scram credentials need a --username")
        algorithm = args.algorithm or old.get("algorithm") or "SHA256"
        keys = {k: old[k] for k in ("salt", "storedKey", "serverKey", "iterations") if k in old}
        if password is not None:
            iterations = args.iterations or old.get("iterations") or 4096
            keys = await _in_thread(reactor, scram_credentials, password, algorithm,
                                    iterations)
            algorithm = keys.pop("algorithm")
        elif not keys:
            raise UsageError("scram credentials need a --password or --password-stdin")
        elif args.algorithm or args.iterations:
            raise UsageError("changing --algorithm or --iterations needs the --password")
        value = {"userName": username, "algorithm": algorithm, **keys}
        credentials_id = f"scram|{algorithm}|{username}"
    rules = _rules(args, old.get("authRules"))
    if rules is not None:
        value["authRules"] = rules
    return credentials_id, value
