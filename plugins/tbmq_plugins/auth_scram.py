"""SCRAM-SHA-256 and SCRAM-SHA-512 through MQTT 5 enhanced authentication
(RFC 5802 / RFC 7677; TBMQ's SCRAM credentials), with the ``scramp`` library.

The exchange [MQTT-4.12]: CONNECT carries the Authentication Method
(``SCRAM-SHA-256`` or ``SCRAM-SHA-512``) and the client-first message; the
broker answers AUTH CONTINUE_AUTHENTICATION (0x18) with the server-first
message; the client's AUTH CONTINUE_AUTHENTICATION carries the
client-final message; CONNACK SUCCESS carries the server-final message, or
CONNACK BAD_USER_NAME_OR_PASSWORD (0x86) ends a failed proof.  The stored
credentials hold only the salt, StoredKey and ServerKey.
"""

from __future__ import annotations

import base64

import scramp
from twisted.internet import defer

from tbmq.auth import AuthResult, AuthScope
from tbmq.auth.watch import bind_rules
from tbmq.hookspecs import hookimpl
from tbmq.model import CredentialsType
from tbmq.mqtt import ReasonCode

#: authentication method → TBMQ's algorithm name
METHODS = {"SCRAM-SHA-256": "SHA256", "SCRAM-SHA-512": "SHA512"}

#: what the provider answers (:func:`tbmq.hookspecs.tbmq_authentication_scope`)
_SCOPE = AuthScope(plain=False, methods=frozenset(METHODS))


def client_first_username(data: bytes) -> str | None:
    """The ``n=`` user name of a SCRAM client-first message (RFC 5802 §5.1),
    or None when the message is malformed."""
    try:
        parts = data.decode("utf-8").split(",")
    except UnicodeDecodeError:
        return None
    for part in parts[2:]:
        if part.startswith("n="):
            return part[2:].replace("=2C", ",").replace("=3D", "=")
    return None


class ScramAuth:
    """The ``scram`` provider."""

    @hookimpl
    def tbmq_authentication_scope(self, config):
        """The SCRAM Authentication Methods only."""
        return _SCOPE

    @hookimpl
    def tbmq_authenticate(self, request):
        algorithm = METHODS.get(request.auth_method or "")
        if algorithm is None:
            return None
        state = request.state
        if "server" not in state:
            return defer.ensureDeferred(self._first(request, algorithm))
        return self._final(request)

    async def _first(self, request, algorithm):
        refuse = AuthResult(False, reason_code=ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                            provider="scram")
        if not request.auth_data:
            return refuse
        username = client_first_username(request.auth_data)
        if username is None:
            return refuse
        credentials = await request.credentials.find(
            CredentialsType.SCRAM, f"scram|{algorithm}|{username}")
        if credentials is None:
            return refuse
        value = credentials.value
        info = (base64.b64decode(value["salt"]), base64.b64decode(value["storedKey"]),
                base64.b64decode(value["serverKey"]), int(value["iterations"]))
        server = scramp.ScramMechanism(request.auth_method).make_server(lambda _: info)
        try:
            server.set_client_first(request.auth_data.decode("utf-8"))
            server_first = server.get_server_first()
        except scramp.ScramException:
            return refuse
        request.state.update(server=server, credentials=credentials, username=username)
        return AuthResult(False, continue_auth=True, auth_data=server_first.encode("utf-8"),
                          provider="scram")

    def _final(self, request):
        server = request.state.pop("server")
        credentials = request.state.pop("credentials")
        try:
            server.set_client_final((request.auth_data or b"").decode("utf-8"))
            server_final = server.get_server_final()
        except (scramp.ScramException, UnicodeDecodeError):
            return AuthResult(False, reason_code=ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                              provider="scram")
        # the rules' ${username} is the SCRAM user name
        request.username = request.state.get("username", request.username)
        return AuthResult(True, credentials.client_type, provider="scram",
                          rules=bind_rules(credentials, request), credentials=credentials.id,
                          credentials_name=credentials.name,
                          auth_data=server_final.encode("utf-8"))


plugin = ScramAuth()
