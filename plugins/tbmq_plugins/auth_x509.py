"""X.509 certificate authentication (TBMQ's X_509 credentials): the client
certificate chain verified by a TLS listener, matched by common name.

Each certificate of the chain, leaf first, is matched against the
credentials: exactly by CN (``credentials_id``), then by the regular
expressions of credentials with ``certCnIsRegex``.  The authorization rules
may use ``${certificateCn}`` (the leaf's CN).  A client with no certificate,
or whose chain matches no credentials, passes to the next provider.
"""

from __future__ import annotations

import re

from twisted.internet import defer

from tbmq.auth import AuthResult, AuthScope
from tbmq.auth.watch import bind_rules
from tbmq.hookspecs import hookimpl
from tbmq.model import CredentialsType


def common_name(certificate) -> str | None:
    """The CN of a ``cryptography`` certificate's subject, or None."""
    from cryptography.x509.oid import NameOID

    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else None


#: what the provider answers (:func:`tbmq.hookspecs.tbmq_authentication_scope`)
_SCOPE = AuthScope(needs=frozenset({"certificate_chain"}))


class X509Auth:
    """The ``x509`` provider."""

    @hookimpl
    def tbmq_authentication_scope(self, config):
        """A CONNECT with a verified certificate chain, without an
        Authentication Method (none reaches it through a listener
        without ``tls_client_auth``)."""
        return _SCOPE

    @hookimpl
    def tbmq_authenticate(self, request):
        if not request.certificate_chain or request.auth_method is not None or request.reauthenticate:
            return None
        return defer.ensureDeferred(self._authenticate(request))

    async def _authenticate(self, request):
        store = request.credentials
        names = [cn for cn in map(common_name, request.certificate_chain) if cn]
        for cn in names:
            credentials = await store.find(CredentialsType.X_509, cn)
            if credentials is not None and not credentials.value.get("certCnIsRegex"):
                return self._accept(credentials, request)
        candidates = [c for c in await store.find_all(CredentialsType.X_509)
                      if c.value.get("certCnIsRegex")]
        for cn in names:
            for credentials in candidates:
                pattern = credentials.value.get("certCnPattern") or credentials.credentials_id
                try:
                    if re.fullmatch(pattern, cn):
                        return self._accept(credentials, request)
                except re.error:
                    continue
        return None

    @staticmethod
    def _accept(credentials, request):
        return AuthResult(True, credentials.client_type, provider="x509",
                          rules=bind_rules(credentials, request), credentials=credentials.id,
                          credentials_name=credentials.name)


plugin = X509Auth()
