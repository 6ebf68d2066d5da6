"""The records of the operators' client lists (TBMQ's blocked clients and
unauthorized-client log) and their encodings, as :mod:`tbmq.cluster.records`
encodes the others (``[tag, version, field, ...]``, msgpack; documented in
``docs/bus.md``).

============================= ============== ============================== ====
topic                         key            record (tag)                   tomb
============================= ============== ============================== ====
``tbmq.client.blocked``       entry id       BlockedClient (``blk``)        yes
``tbmq.client.unauthorized``  client id      UnauthorizedAttempt (``una``)  yes
============================= ============== ============================== ====

``blk`` BlockedClient, version 1
    id (str), type (str ``client_id``/``username``/``ip_address``/``regex``),
    value (str), regex_target (str|nil; the field a ``regex`` entry
    matches), expires_at (float s|nil), created_at (float s), description
    (str|nil).
``una`` UnauthorizedAttempt, version 1
    client_id (str), address (str|nil, the host), username (str|nil), reason
    (str), at (float s), password_provided (bool), certificate_provided
    (bool), service_id (str, the refusing node).
"""

from __future__ import annotations

from dataclasses import dataclass

from tbmq.cluster.record_codec import RecordCodec
from tbmq.cluster.record_fields import _bool, _count, _float, _opt_float, _opt_str, _str
from tbmq.errors import RecordEncodingError

__all__ = ["BLOCKED", "BLOCKED_TYPES", "REGEX_TARGETS", "UNAUTHORIZED", "BlockedClient",
           "UnauthorizedAttempt"]

#: :attr:`BlockedClient.type`: the kinds of entries (TBMQ's ``BlockedClientType``)
BLOCKED_TYPES = ("client_id", "username", "ip_address", "regex")
#: :attr:`BlockedClient.regex_target`: what a ``regex`` entry matches
#: (TBMQ's ``RegexMatchTarget``)
REGEX_TARGETS = ("client_id", "username", "ip_address")


@dataclass(slots=True, frozen=True)
class BlockedClient:
    """One entry of the blocked-client list (``tbmq.client.blocked``, key
    :attr:`id`; a tombstone removes it).

    :ivar id: the entry's id, derived from ``type``, ``regex_target`` and
        ``value`` (:func:`tbmq.cluster.blocked.entry_id`): adding the same
        entry again replaces it.
    :ivar type: one of :data:`BLOCKED_TYPES`.
    :ivar value: the client id, user name, IP address (normalised) or
        regular expression (Python ``re``, matched with ``fullmatch``).
    :ivar regex_target: for ``regex``, one of :data:`REGEX_TARGETS`; else
        None.
    :ivar expires_at: seconds since the epoch after which the entry no
        longer applies, or None (never).
    :ivar created_at: seconds since the epoch of the addition.
    :ivar description: the operator's note, or None.
    """

    id: str
    type: str
    value: str
    regex_target: str | None
    expires_at: float | None
    created_at: float
    description: str | None = None


@dataclass(slots=True, frozen=True)
class UnauthorizedAttempt:
    """A refused connection attempt (``tbmq.client.unauthorized``, key
    client id; TBMQ's ``UnauthorizedClient``).

    :ivar client_id: the CONNECT's client id.
    :ivar address: the client's host (IP address), or None.
    :ivar username: the CONNECT's user name, or None.
    :ivar reason: why it was refused (a reason code name and a text).
    :ivar at: seconds since the epoch of the refusal.
    :ivar password_provided: whether CONNECT carried a password.
    :ivar certificate_provided: whether the client presented a TLS
        certificate.
    :ivar service_id: the node that refused it.
    """

    client_id: str
    address: str | None
    username: str | None
    reason: str
    at: float
    password_provided: bool
    certificate_provided: bool
    service_id: str


def _kind(v, name: str, allowed: tuple, optional: bool = False):
    if v is None and optional:
        return None
    if v not in allowed:
        raise RecordEncodingError(f"{name}: {v!r} is not one of {', '.join(allowed)}")
    return v


def _write_blocked(b: BlockedClient) -> list:
    return [_str(b.id, "id"), _kind(b.type, "type", BLOCKED_TYPES), _str(b.value, "value"),
            _kind(b.regex_target, "regex_target", REGEX_TARGETS, True),
            _opt_float(b.expires_at, "expires_at"), _float(b.created_at, "created_at"),
            _opt_str(b.description, "description")]


def _read_blocked_v1(f) -> BlockedClient:
    id_, type_, value, target, expires_at, created_at, description = _count(f, 7, "blocked")
    return BlockedClient(_str(id_, "id"), _kind(type_, "type", BLOCKED_TYPES),
                         _str(value, "value"),
                         _kind(target, "regex_target", REGEX_TARGETS, True),
                         _opt_float(expires_at, "expires_at"), _float(created_at, "created_at"),
                         _opt_str(description, "description"))


def _write_attempt(a: UnauthorizedAttempt) -> list:
    return [_str(a.client_id, "client_id"), _opt_str(a.address, "address"),
            _opt_str(a.username, "username"), _str(a.reason, "reason"), _float(a.at, "at"),
            _bool(a.password_provided, "password_provided"),
            _bool(a.certificate_provided, "certificate_provided"),
            _str(a.service_id, "service_id")]


def _read_attempt_v1(f) -> UnauthorizedAttempt:
    (client_id, address, username, reason, at, password, certificate,
     service_id) = _count(f, 8, "unauthorized")
    return UnauthorizedAttempt(_str(client_id, "client_id"), _opt_str(address, "address"),
                               _opt_str(username, "username"), _str(reason, "reason"),
                               _float(at, "at"), _bool(password, "password_provided"),
                               _bool(certificate, "certificate_provided"),
                               _str(service_id, "service_id"))


#: ``tbmq.client.blocked``: :class:`BlockedClient` (tombstones allowed).
BLOCKED = RecordCodec("BlockedClient", BlockedClient, "blk", _write_blocked,
                      {1: _read_blocked_v1}).with_tombstone()
#: ``tbmq.client.unauthorized``: :class:`UnauthorizedAttempt` (a tombstone:
#: an operator cleared the client id's attempts).
UNAUTHORIZED = RecordCodec("UnauthorizedAttempt", UnauthorizedAttempt, "una", _write_attempt,
                           {1: _read_attempt_v1}).with_tombstone()
