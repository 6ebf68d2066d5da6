"""MQTT basic authentication (TBMQ's MQTT_BASIC credentials): client id
and/or username, with a bcrypt-hashed password.

Credentials are looked up by TBMQ's keys, most specific first:
``mixed|<clientId>|<username>``, then ``username|<username>``, then
``client_id|<clientId>``: credentials with a client id and a user name
match a client that presents both; credentials with a user name only match
that user name whatever the client id; credentials with a client id only
match that client id whatever the user name.  Credentials without a password
accept any password.  A wrong password gives CONNACK
BAD_USER_NAME_OR_PASSWORD (0x86; v3: 4).

No matching credentials passes to the next provider.  When anonymous access
is on (``auth.allow_anonymous``), a client whose client id or user name is
half of some credentials with both (the right user name with another client
id, say) is marked as known (:attr:`tbmq.auth.AuthRequest.known_by`): it
presented credentials that were refused, so the anonymous fallback refuses
it (BAD_USER_NAME_OR_PASSWORD) instead of letting it in, as Mosquitto refuses a wrong password
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

from tbmq.auth import AuthResult, AuthScope
from tbmq.auth.watch import bind_rules
from tbmq.hookspecs import hookimpl
from tbmq.model import CredentialsType
from tbmq.mqtt import ReasonCode


def credentials_ids(client_id: str, username: str | None) -> list[str]:
    """TBMQ's lookup keys for a client, most specific first."""
    keys = []
    if username is not None:
        keys.append(f"mixed|{client_id}|{username}")
        keys.append(f"username|{username}")
    keys.append(f"client_id|{client_id}")
    return keys


class BasicIndex:
    """The lookup keys of one credential store's MQTT_BASIC credentials,
    and the client ids and user names of those that name both, kept current
    through :meth:`tbmq.interfaces.ICredentialStore.changed_since` (the
    first call reads every record, the later ones only what changed, by an
    indexed version).  A client matching no key then costs no lookup in the
    store, and one matching a key one lookup (:meth:`BasicAuth._authenticate`);
    only names are kept, never the records.

    :meth:`current` asks the store what changed at most once at a time:
    the CONNECTs that arrive while a question is under way share the next
    one, so that a burst costs a few questions, not one per CONNECT, and
    each still sees every change committed before it arrived.  A store
    that can tell at once that nothing changed (an ``unchanged_since(version)
    -> bool`` method: the embedded stores) is not asked at all then
    (:meth:`keys_now`).

    :param store: the :class:`tbmq.interfaces.ICredentialStore`.
    :ivar version: the store's version the index is current with.
    """

    def __init__(self, store) -> None:
        self.store = store
        #: the store's ``unchanged_since``, or None (asked once per CONNECT)
        self._unchanged = getattr(store, "unchanged_since", None)
        self.version = 0
        self._keys: dict[str, str] = {}  # record id -> credentials id
        self._present: set[str] = set()  # the credentials ids
        self._names: dict[str, tuple[str, str]] = {}  # record id -> (client id, user name)
        self._client_ids: collections.Counter = collections.Counter()
        self._usernames: collections.Counter = collections.Counter()
        self._asking = False
        self._next: list[defer.Deferred] = []  # waiting for a question not asked yet

    def keys_now(self, client_id: str, username: str | None) -> list[str] | None:
        """:meth:`keys_of` when the store tells at once that the index holds
        every change it committed (then :meth:`current` need not be asked);
        None when it cannot tell."""
        unchanged = self._unchanged
        if unchanged is None or not unchanged(self.version):
            return None
        return self.keys_of(client_id, username) if self._present else []

    def current(self) -> defer.Deferred:
        """:returns: a Deferred firing with None once the index holds every
        change the store had committed when this was called, or failing with
        the store's error (:class:`~tbmq.errors.BackendError`...)."""
        d = defer.Deferred()
        self._next.append(d)
        if not self._asking:
            self._ask()
        return d

    def _ask(self) -> None:
        waiting, self._next = self._next, []
        self._asking = True
        self.store.changed_since(self.version).addCallbacks(
            self._answered, self._failed, callbackArgs=(waiting,), errbackArgs=(waiting,))

    def _answered(self, answer, waiting: list) -> None:
        changed, deleted, version = answer
        if version < self.version:  # a store recreated: it answered from 0
            self._clear()
        self.version = version
        for record_id in deleted:
            self._forget(record_id)
        for record in changed:
            self._forget(record.id)
            if CredentialsType(record.credentials_type) is CredentialsType.MQTT_BASIC:
                self._add(record)
        self._settle(waiting, None)

    def _clear(self) -> None:
        for index in (self._keys, self._present, self._names, self._client_ids,
                      self._usernames):
            index.clear()

    def _failed(self, failure, waiting: list) -> None:
        self._settle(waiting, failure)

    def _settle(self, waiting: list, failure) -> None:
        self._asking = False
        if self._next:
            self._ask()
        for d in waiting:
            if failure is None:
                d.callback(None)
            else:
                d.errback(failure)

    def _add(self, record) -> None:
        self._keys[record.id] = record.credentials_id
        self._present.add(record.credentials_id)
        value = record.value or {}
        if value.get("clientId") is not None and value.get("userName") is not None:
            names = (value["clientId"], value["userName"])
            self._names[record.id] = names
            self._client_ids[names[0]] += 1
            self._usernames[names[1]] += 1

    def _forget(self, record_id: str) -> None:
        key = self._keys.pop(record_id, None)
        if key is not None:
            self._present.discard(key)  # unique per type: no other record has it
        names = self._names.pop(record_id, None)
        if names is not None:
            for counter, name in ((self._client_ids, names[0]), (self._usernames, names[1])):
                counter[name] -= 1
                if counter[name] <= 0:
                    del counter[name]

    def has(self, credentials_id: str) -> bool:
        """:returns: True when some MQTT_BASIC credentials have that lookup key."""
        return credentials_id in self._present

    def keys_of(self, client_id: str, username: str | None) -> list[str]:
        """:returns: the lookup keys of a client (:func:`credentials_ids`)
        that some credentials have, most specific first; none, and no key
        made, when the store holds no MQTT_BASIC credentials."""
        present = self._present
        if not present:
            return []
        return [key for key in credentials_ids(client_id, username) if key in present]

    def knows(self, client_id: str, username: str | None) -> bool:
        """:returns: True when some credentials with a client id and a user
        name name ``client_id`` or ``username``."""
        return client_id in self._client_ids or (
            username is not None and username in self._usernames)


#: what the provider answers (:func:`tbmq.hookspecs.tbmq_authentication_scope`)
_SCOPE = AuthScope()


class BasicAuth:
    """The ``basic`` provider."""

    def __init__(self) -> None:
        self._indexes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        #: the index asked last (a node has one store: no lookup per CONNECT)
        self._index: BasicIndex | None = None

    @hookimpl
    def tbmq_authentication_scope(self, config):
        """Every CONNECT without an Authentication Method (credentials may
        name its client id alone)."""
        return _SCOPE

    @hookimpl
    def tbmq_authenticate(self, request):
        """:returns: None at once when the index is known current and no
        credentials match the client (it passes: the next provider is
        asked at once); else a Deferred firing with the
        :class:`~tbmq.auth.AuthResult` or None."""
        if request.auth_method is not None or request.reauthenticate:
            return None
        store = request.credentials
        index = self._index
        if index is None or index.store is not store:
            index = self._indexes.get(store)
            if index is None:
                index = self._indexes[store] = BasicIndex(store)
            self._index = index
        keys = index.keys_now(request.client_id, request.username)
        if keys is None:
            return index.current().addCallback(self._indexed, index, request)
        if not keys:
            return self._unknown(index, request)
        return defer.ensureDeferred(self._authenticate(request, index, keys))

    def _indexed(self, _, index: BasicIndex, request):
        keys = index.keys_of(request.client_id, request.username)
        if not keys:
            return self._unknown(index, request)
        return defer.ensureDeferred(self._authenticate(request, index, keys))

    @staticmethod
    def _unknown(index: BasicIndex, request) -> None:
        """No credentials match: pass, marking a half-known client (see the
        module's docstring)."""
        config = request.config
        if config is None or config.auth.allow_anonymous:  # else refused anyway
            if index.knows(request.client_id, request.username):
                request.known_by = "basic"
        return None

    async def _authenticate(self, request, index: BasicIndex, keys: list[str]):
        store = request.credentials
        credentials = None
        for key in keys:
            credentials = await store.find(CredentialsType.MQTT_BASIC, key)
            if credentials is not None:
                break
        if credentials is None:  # removed since the index saw it
            return self._unknown(index, request)
        hashed = credentials.value.get("password")
        if hashed:
            if request.password is None or not await request.check_password(request.password, hashed):
                return AuthResult(False, reason_code=ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                                  provider="basic")
        return AuthResult(True, credentials.client_type, provider="basic",
                          rules=bind_rules(credentials, request), credentials=credentials.id,
                          credentials_name=credentials.name)

plugin = BasicAuth()
