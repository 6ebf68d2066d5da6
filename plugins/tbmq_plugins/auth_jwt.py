"""JWT authentication (PyJWT): the CONNECT password is a JSON Web Token,
signed with an HMAC secret or an RSA / EC key (``auth.jwt``).

The signature, ``exp``/``nbf`` (with ``auth.jwt.leeway``), and, when
configured, ``aud``, ``iss`` and a claim equal to the client id are
checked.  The client type and the publish / subscribe topic regexes come
from claims (``client_type_claim``, ``pub_claim``, ``sub_claim``).  A
password that is not a JWT passes to the next provider; an invalid or
expired token gives CONNACK BAD_USER_NAME_OR_PASSWORD (0x86; v3: 4), a
client id mismatch NOT_AUTHORIZED (0x87; v3: 5).
"""

from __future__ import annotations

import jwt
from twisted.logger import Logger

from tbmq.auth import NO_REQUEST, AuthResult, AuthScope
from tbmq.auth.rules import AuthorizationRules
from tbmq.hookspecs import hookimpl
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import ClientType
from tbmq.mqtt import ReasonCode


#: what the provider answers with a key
#: (:func:`tbmq.hookspecs.tbmq_authentication_scope`)
_SCOPE = AuthScope(needs=frozenset({"password"}))


def looks_like_jwt(password: bytes | None) -> bool:
    """True for three base64url segments separated by dots."""
    if not password or password.count(b".") != 2:
        return False
    return all(part and all(c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                            b"0123456789-_=" for c in part) for part in password.split(b"."))


class JwtAuth:
    """The ``jwt`` provider."""

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self) -> None:
        self._key_cache: dict = {}

    def _keys(self, cfg) -> list:
        cached = self._key_cache.get(cfg)
        if cached is None:
            cached = []
            if cfg.secret:
                cached.append(("HS", cfg.secret))
            if cfg.public_key_file:
                with open(cfg.public_key_file, "rb") as f:
                    cached.append(("PK", f.read()))
            self._key_cache[cfg] = cached
        return cached

    @hookimpl
    def tbmq_authentication_scope(self, config):
        """A CONNECT with a password (the token), without an Authentication
        Method; none without a key to check a token with (``auth.jwt.secret``,
        ``auth.jwt.public_key_file``)."""
        cfg = config.auth.jwt
        return _SCOPE if cfg.secret or cfg.public_key_file else NO_REQUEST

    @hookimpl
    def tbmq_authenticate(self, request):
        if request.auth_method is not None or request.reauthenticate:
            return None
        if not looks_like_jwt(request.password):
            return None
        cfg = request.config.auth.jwt
        keys = self._keys(cfg)
        if not keys:
            return None
        token = request.password.decode("ascii")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            return AuthResult(False, reason_code=ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                              provider="jwt")
        algorithm = header.get("alg", "")
        if algorithm not in cfg.algorithms:
            return AuthResult(False, reason_code=ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                              provider="jwt")
        key = next((k for kind, k in keys if (kind == "HS") == algorithm.startswith("HS")), None)
        if key is None:
            return AuthResult(False, reason_code=ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                              provider="jwt")
        try:
            claims = jwt.decode(token, key, algorithms=[algorithm], audience=cfg.audience,
                                issuer=cfg.issuer, leeway=cfg.leeway,
                                options={"verify_aud": cfg.audience is not None})
        except jwt.InvalidTokenError as e:
            self.log.info("JWT of {client_id} refused: {error}", client_id=request.client_id,
                          error=str(e))
            return AuthResult(False, reason_code=ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                              provider="jwt")
        if cfg.client_id_claim and claims.get(cfg.client_id_claim) != request.client_id:
            return AuthResult(False, reason_code=ReasonCode.NOT_AUTHORIZED, provider="jwt")
        try:
            client_type = ClientType(claims.get(cfg.client_type_claim, "DEVICE"))
        except ValueError:
            return AuthResult(False, reason_code=ReasonCode.NOT_AUTHORIZED, provider="jwt")
        pub = claims.get(cfg.pub_claim) if cfg.pub_claim else None
        sub = claims.get(cfg.sub_claim) if cfg.sub_claim else None
        rules = AuthorizationRules(tuple(pub) if pub is not None else None,
                                   tuple(sub) if sub is not None else None)
        return AuthResult(True, client_type, provider="jwt",
                          rules=rules.bind(request.client_id, request.username, request.certificate_cn))


plugin = JwtAuth()
