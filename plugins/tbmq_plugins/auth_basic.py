"""MQTT basic authentication (TBMQ's MQTT_BASIC credentials): client id
and/or username, with a bcrypt-hashed password.

Credentials are looked up by TBMQ's keys, most specific first:
``mixed|<clientId>|<username>``, then ``username|<username>``, then
``client_id|<clientId>``.  Credentials without a password accept any
password.  A wrong password gives CONNACK 0x86 BAD_USER_NAME_OR_PASSWORD
(v3: 0x04); no matching credentials passes to the next provider.  The bcrypt
check runs in a thread of the node's password-check pool
(:meth:`tbmq.auth.AuthRequest.check_password`), so wrong passwords never
block the reactor, and :mod:`tbmq.auth.guard` bounds what they cost.
"""

from __future__ import annotations

from twisted.internet import defer

from tbmq.auth import AuthResult
from tbmq.auth.watch import bind_rules
from tbmq.hookspecs import hookimpl
from tbmq.model import CredentialsType


def credentials_ids(client_id: str, username: str | None) -> list[str]:
    """TBMQ's lookup keys for a client, most specific first."""
    keys = []
    if username is not None:
        keys.append(f"mixed|{client_id}|{username}")
        keys.append(f"username|{username}")
    keys.append(f"client_id|{client_id}")
    return keys


class BasicAuth:
    """The ``basic`` provider."""

    @hookimpl
    def tbmq_authenticate(self, request):
        if request.auth_method is not None or request.reauthenticate:
            return None
        return defer.ensureDeferred(self._authenticate(request))

    async def _authenticate(self, request):
        store = request.credentials
        credentials = None
        for key in credentials_ids(request.client_id, request.username):
            credentials = await store.find(CredentialsType.MQTT_BASIC, key)
            if credentials is not None:
                break
        if credentials is None:
            return None
        hashed = credentials.value.get("password")
        if hashed:
            if request.password is None or not await request.check_password(request.password, hashed):
                return AuthResult(False, reason_code=0x86, provider="basic")
        return AuthResult(True, credentials.client_type, provider="basic",
                          rules=bind_rules(credentials, request), credentials=credentials.id,
                          credentials_name=credentials.name)


plugin = BasicAuth()
