"""MQTT basic authentication (TBMQ's MQTT_BASIC credentials): client id
and/or username, with a bcrypt-hashed password.

Credentials are looked up by TBMQ's keys, most specific first:
``mixed|<clientId>|<username>``, then ``username|<username>``, then
``client_id|<clientId>``: credentials with a client id and a user name
match a client that presents both; credentials with a user name only match
that user name whatever the client id; credentials with a client id only
match that client id whatever the user name.  Credentials without a password
accept any password.  A wrong password gives CONNACK 0x86
BAD_USER_NAME_OR_PASSWORD (v3: 0x04).

No matching credentials passes to the next provider.  When anonymous access
is on (``auth.allow_anonymous``), a client whose client id or user name is
half of some credentials with both (the right user name with another client
id, say) is marked as known (:attr:`tbmq.auth.AuthRequest.known_by`): it
presented credentials that were refused, so the anonymous fallback refuses
it (0x86) instead of letting it in, as Mosquitto refuses a wrong password
with a password file and ``allow_anonymous true``; a later provider may
still accept it.  Only a client that matches no credentials at all is
anonymous.

The bcrypt check runs in a thread of the node's password-check pool
(:meth:`tbmq.auth.AuthRequest.check_password`), so wrong passwords never
block the reactor, and :mod:`tbmq.auth.guard` bounds what they cost.
"""

from __future__ import annotations

import collections
import weakref

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


class MixedNames:
    """The client ids and user names of one credential store's MQTT_BASIC
    credentials that name both, kept current through
    :meth:`tbmq.interfaces.ICredentialStore.changed_since` (the first call
    reads every record, the later ones only what changed, by an indexed
    version), so that a client matching no key costs no scan of the store.

    :ivar version: the store's version the names are current with.
    """

    def __init__(self) -> None:
        self.version = 0
        self._names: dict[str, tuple[str, str]] = {}  # record id -> (client id, user name)
        self._client_ids: collections.Counter = collections.Counter()
        self._usernames: collections.Counter = collections.Counter()

    async def knows(self, store, client_id: str, username: str | None) -> bool:
        """Bring the names up to date with ``store``, then answer.

        :param store: the :class:`tbmq.interfaces.ICredentialStore`.
        :param client_id: the CONNECT's client id.
        :param username: its user name, or None.
        :returns: True when some credentials with a client id and a user
            name name ``client_id`` or ``username``.
        """
        changed, deleted, version = await store.changed_since(self.version)
        if version >= self.version:  # an older answer that arrives late is not applied
            self.version = version
            for record_id in deleted:
                self._forget(record_id)
            for record in changed:
                self._forget(record.id)
                value = record.value or {}
                if (CredentialsType(record.credentials_type) is CredentialsType.MQTT_BASIC
                        and value.get("clientId") is not None
                        and value.get("userName") is not None):
                    names = (value["clientId"], value["userName"])
                    self._names[record.id] = names
                    self._client_ids[names[0]] += 1
                    self._usernames[names[1]] += 1
        return client_id in self._client_ids or (
            username is not None and username in self._usernames)

    def _forget(self, record_id: str) -> None:
        names = self._names.pop(record_id, None)
        if names is not None:
            for counter, name in ((self._client_ids, names[0]), (self._usernames, names[1])):
                counter[name] -= 1
                if counter[name] <= 0:
                    del counter[name]


class BasicAuth:
    """The ``basic`` provider."""

    def __init__(self) -> None:
        self._mixed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

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
            config = request.config
            if config is None or config.auth.allow_anonymous:  # else refused anyway
                mixed = self._mixed.get(store)
                if mixed is None:
                    mixed = self._mixed[store] = MixedNames()
                if await mixed.knows(store, request.client_id, request.username):
                    request.known_by = "basic"
            return None
        hashed = credentials.value.get("password")
        if hashed:
            if request.password is None or not await request.check_password(request.password, hashed):
                return AuthResult(False, reason_code=0x86, provider="basic")
        return AuthResult(True, credentials.client_type, provider="basic",
                          rules=bind_rules(credentials, request), credentials=credentials.id,
                          credentials_name=credentials.name)


plugin = BasicAuth()
