"""Authentication and authorization: the request a provider sees and the
answer it gives (:func:`tbmq.hookspecs.tbmq_authenticate`).

Providers are plugins; the built-in ``anonymous`` and ``rules`` plugins live
in :mod:`tbmq.embedded`, the credential-based ones (basic, X.509, SCRAM) and
JWT in the ``tbmq_plugins`` package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tbmq.model import ClientType
from tbmq.mqtt.constants import ReasonCode

#: The CONNACK reason codes the broker refuses an authentication with
#: (:attr:`AuthResult.reason_code` of the built-in providers; a refusal
#: without a result is NOT_AUTHORIZED, or BAD_AUTHENTICATION_METHOD for an
#: enhanced authentication [MQTT-4.12.0-1]): the ``reason_code`` labels of
#: ``tbmq_authentication_failures_total``, each there from the start.  A
#: v3 client gets their :func:`tbmq.mqtt.connack_return_code`: 4 Bad user
#: name or password for BAD_USER_NAME_OR_PASSWORD, else 5 Not authorized.
AUTH_FAILURE_CODES = (ReasonCode.BAD_USER_NAME_OR_PASSWORD, ReasonCode.NOT_AUTHORIZED,
                      ReasonCode.BAD_AUTHENTICATION_METHOD)


@dataclass(slots=True)
class AuthRequest:
    """What an authentication provider decides on.

    :ivar client_id: the client identifier (assigned already if it was empty).
    :ivar username: the CONNECT user name, or None.
    :ivar password: the CONNECT password (bytes), or None.
    :ivar protocol_level: 3, 4 or 5.
    :ivar address: the peer's ``IAddress`` (the proxied address behind the
        PROXY protocol).
    :ivar listener: the :class:`tbmq.config.ListenerConfig` it came through.
    :ivar certificate_chain: the verified client certificate chain of a TLS
        listener, leaf first (``cryptography.x509.Certificate``), or None.
    :ivar auth_method: the v5 Authentication Method, or None.
    :ivar auth_data: the v5 Authentication Data of this step, or None.
    :ivar reauthenticate: True for an AUTH RE_AUTHENTICATE (0x19) after the
        connection is up.
    :ivar state: scratch space a provider keeps across the steps of one
        enhanced-authentication exchange.
    :ivar credentials: the :class:`tbmq.interfaces.ICredentialStore`.
    :ivar config: the :class:`tbmq.config.Config`.
    :ivar checker: ``checker(password, hashed) -> Deferred[bool]``: the
        node's password checks (:meth:`tbmq.auth.guard.Attempt.check_password`,
        a thread pool of their own, skipped once the connection is gone);
        None: :func:`tbmq.auth.passwords.check_password_async`.
    :ivar known_by: the name of a provider that passed although the
        client's client id or user name belongs to credentials it knows
        (the client presented credentials that were refused), or None.
        The built-in ``anonymous`` provider does not accept such a client:
        CONNACK BAD_USER_NAME_OR_PASSWORD (0x86; v3: 4) when it sent a
        user name or a password, else NOT_AUTHORIZED (0x87; v3: 5).
    :ivar undecided: the name of a provider that passed because it could not
        decide (its service failed: the ``http`` provider's 5xx answers,
        timeouts), or None.  The built-in ``anonymous`` provider does not
        accept such a client: NOT_AUTHORIZED (0x87; v3: 5) unless a later
        provider accepts it.
    """

    client_id: str
    username: str | None
    password: bytes | None
    protocol_level: int
    address: Any = None
    listener: Any = None
    certificate_chain: list | None = None
    auth_method: str | None = None
    auth_data: bytes | None = None
    reauthenticate: bool = False
    state: dict = field(default_factory=dict)
    credentials: Any = None
    config: Any = None
    checker: Any = None
    known_by: str | None = None
    undecided: str | None = None

    def check_password(self, password: bytes | str, hashed: str | bytes | None):
        """Check a password against a bcrypt hash without blocking the
        reactor; providers call this rather than bcrypt.

        :returns: a Deferred firing with True when they match (False for a
            missing or malformed hash).
        """
        if self.checker is not None:
            return self.checker(password, hashed)
        from tbmq.auth import passwords  # noqa: PLC0415

        return passwords.check_password_async(password, hashed)

    @property
    def certificate_cn(self) -> str | None:
        """The common name of the leaf client certificate, or None."""
        if not self.certificate_chain:
            return None
        from cryptography.x509.oid import NameOID

        names = self.certificate_chain[0].subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return str(names[0].value) if names else None


@dataclass(frozen=True, slots=True)
class AuthResult:
    """What a provider decided.

    :ivar allowed: True to accept the client.
    :ivar client_type: DEVICE or APPLICATION, from the credentials (TBMQ).
    :ivar reason_code: the v5 CONNACK reason code when refused (a
        :class:`~tbmq.mqtt.ReasonCode`): BAD_USER_NAME_OR_PASSWORD (0x86),
        NOT_AUTHORIZED (0x87), BAD_AUTHENTICATION_METHOD (0x8C); v3 clients
        get its :func:`~tbmq.mqtt.connack_return_code` (4 / 5).
    :ivar provider: the name of the provider that decided, for the log.
    :ivar rules: the client's bound authorization rules
        (:class:`tbmq.auth.rules.BoundRules`), or None for no restriction.
    :ivar credentials: the id of the :class:`tbmq.model.Credentials` that
        authenticated the client, so changed rules can be applied to it.
    :ivar credentials_name: the name of that record, for operators (the
        session's ``credentials_name`` in the admin API and the console).
    :ivar auth_data: v5 Authentication Data to send (in AUTH
        CONTINUE_AUTHENTICATION when ``continue_auth``, else in CONNACK /
        AUTH SUCCESS).
    :ivar continue_auth: True to send AUTH CONTINUE_AUTHENTICATION (0x18) with
        ``auth_data`` and ask the same provider again with the client's answer.
    """

    allowed: bool
    client_type: ClientType = ClientType.DEVICE
    reason_code: int = ReasonCode.NOT_AUTHORIZED
    provider: str = ""
    rules: Any = None
    credentials: str | None = None
    auth_data: bytes | None = None
    continue_auth: bool = False
    credentials_name: str | None = None


#: the fields of a CONNECT an :class:`AuthScope` may need (the
#: :class:`AuthRequest` attributes, in the order of a request's shape: see
#: :meth:`AuthScope.answers`)
SCOPE_FIELDS = ("password", "username", "certificate_chain")


@dataclass(frozen=True, slots=True)
class AuthScope:
    """The authentications an authentication provider's
    ``tbmq_authenticate`` can answer, which it tells once per configuration
    (:func:`tbmq.hookspecs.tbmq_authentication_scope`); the node asks it
    only those, and the others pass it as if it had returned None.  A
    provider that tells nothing is asked every time.

    :ivar plain: it answers a CONNECT without an Authentication Method
        (MQTT 5 enhanced authentication).
    :ivar needs: :data:`SCOPE_FIELDS` names: such a CONNECT is asked of it
        only when it carries one of them (a ``password``, a ``username``, a
        ``certificate_chain``); empty: every such CONNECT.
    :ivar methods: the Authentication Methods it answers (a CONNECT or an
        AUTH with one, a re-authentication included); None: every method.
    """

    plain: bool = True
    needs: frozenset = frozenset()
    methods: frozenset | None = frozenset()

    def answers(self, shape: tuple | str) -> bool:
        """:param shape: what decides which providers may answer a request
            (:meth:`tbmq.broker.hooks.Hooks.authenticate` finds the callers
            once per shape): for a request without an Authentication Method,
            one bool per :data:`SCOPE_FIELDS` (the CONNECT carries a
            password, a user name, a verified certificate chain); else its
            method when some provider's scope names it, or ``""`` for any
            other (a few shapes in all, whatever the clients send).
        :returns: True when a request of that shape is to be asked of it."""
        if type(shape) is str:
            return self.methods is None or shape in self.methods
        if not self.plain:
            return False
        return not self.needs or any(
            present for name, present in zip(SCOPE_FIELDS, shape) if name in self.needs)


#: the scope of a provider that tells none: asked every time
EVERY_REQUEST = AuthScope(True, frozenset(), None)
#: the scope of a provider that can answer nothing with this configuration
NO_REQUEST = AuthScope(False, frozenset(), frozenset())

