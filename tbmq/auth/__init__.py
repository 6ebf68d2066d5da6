"""The answer of an authentication decision (:func:`tbmq.hookspecs.tbmq_authenticate`)."""

from __future__ import annotations

from dataclasses import dataclass

from tbmq.model import ClientType


@dataclass(frozen=True, slots=True)
class AuthResult:
    """What an authentication provider decided.

    :ivar allowed: True to accept the CONNECT.
    :ivar client_type: DEVICE or APPLICATION, from the credentials (TBMQ).
    :ivar reason_code: the v5 CONNACK reason code when refused: 0x86
        BAD_USER_NAME_OR_PASSWORD or 0x87 NOT_AUTHORIZED (v3 gets 0x04 / 0x05).
    :ivar provider: the name of the provider that decided, for the log.
    """

    allowed: bool
    client_type: ClientType = ClientType.DEVICE
    reason_code: int = 0x87
    provider: str = ""
