"""The built-in plugins: the in-process bus and the SQLite (or memory)
stores of the embedded default, anonymous access, and authorization by the
credentials' rules."""

from __future__ import annotations

import os
from typing import Any

from tbmq.auth import AuthResult, AuthScope
from tbmq.hookspecs import hookimpl
from tbmq.mqtt import ReasonCode


class EmbeddedBackends:
    """Provides ``bus: memory``, ``storage.backend: sqlite | memory`` and
    ``auth.credentials: sqlite | memory``.

    The SQLite stores of one config share one thread
    (:class:`~tbmq.backends.sqlite_runner.SQLiteDatabases`): the bus's
    topic log (sessions and subscriptions), the retained and the device
    stores one file and connection, the credential store its own file (so
    ``tbmq credentials`` can change it while the broker runs).

    :param reactor: the reactor (``IReactorFromThreads``) that receives the
        SQLite results; the global one when None.
    :param threadpool: the pool (``callInThreadWithCallback``) running the
        SQLite work, started and stopped by its owner and running one call
        at a time (tests pass a synchronous one); when None a
        ``ThreadPool(1, 1)`` of its own (see
        :class:`~tbmq.backends.sqlite_runner.DatabaseThread`).
    """

    def __init__(self, reactor: Any = None, threadpool: Any = None) -> None:
        self._sqlite: dict = {}
        self._memory: dict = {}
        self._databases: dict = {}
        self._reactor = reactor
        self._threadpool = threadpool

    def _sqlite_databases(self, config):
        """:returns: the :class:`~tbmq.backends.sqlite_runner.SQLiteDatabases`
        of ``config``: one thread for all its SQLite files."""
        databases = self._databases.get(id(config))
        if databases is None:
            from tbmq.backends.sqlite_runner import SQLiteDatabases
            databases = self._databases[id(config)] = SQLiteDatabases(
                self._reactor, self._threadpool, synchronous=config.storage.sqlite_synchronous)
        return databases

    def _runner(self, config):
        """The SQLite runner of the embedded store file in ``data_dir``."""
        from tbmq.backends.sqlite import FILE_NAME
        os.makedirs(config.data_dir, exist_ok=True)
        return self._sqlite_databases(config).runner(os.path.join(config.data_dir, FILE_NAME))

    @hookimpl(trylast=True)
    def tbmq_message_bus(self, config, clock):
        """The in-process bus; with ``storage.backend: sqlite`` its durable
        topics (sessions, subscriptions) live in the SQLite topic log of the
        store file, so a restart replays them (the sessions an older tbmq
        kept in that file are moved there when it is opened,
        :mod:`tbmq.backends.sqlite_session_migration`)."""
        if config.bus != "memory":
            return None
        from tbmq.backends.inprocess_bus import InProcessBus
        log = None
        if config.storage.backend == "sqlite":
            from tbmq.backends.sqlite_topic_log import SQLiteTopicLog
            log = SQLiteTopicLog(self._runner(config))
        return InProcessBus(clock=clock, log=log)

    def _stores(self, config, backend=None):
        """:returns: ``(retained store, device message store)`` of the
        embedded backend ``backend`` (``storage.backend`` when None), or
        None when it is not one of ours."""
        backend = backend or config.storage.backend
        if backend == "memory":
            stores = self._memory.get(id(config))
            if stores is None:
                from tbmq.backends import memory
                stores = self._memory[id(config)] = (
                    memory.MemoryRetainedStore(),
                    memory.MemoryDeviceMessageStore(config.storage.max_messages_per_client))
            return stores
        if backend == "sqlite":
            store = self._sqlite.get(id(config))
            if store is None:
                from tbmq.backends.sqlite import SQLiteStore
                store = self._sqlite[id(config)] = SQLiteStore(
                    runner=self._runner(config),
                    max_messages_per_client=config.storage.max_messages_per_client)
            return store.retained, store.deliveries
        return None

    @hookimpl(trylast=True)
    def tbmq_retained_store(self, config):
        stores = self._stores(config)
        return stores and stores[0]

    @hookimpl(trylast=True)
    def tbmq_device_message_store(self, config):
        """The memory or SQLite device store, when
        ``storage.device_store_name`` names one of them."""
        stores = self._stores(config, config.storage.device_store_name)
        return stores and stores[1]

    @hookimpl(trylast=True)
    def tbmq_credential_store(self, config, reactor=None):
        """The memory store, or the SQLite one: on the node's shared SQLite
        thread, or on a thread of its own delivering to ``reactor`` when
        one is given."""
        kind = config.auth.credentials
        if kind == "memory":
            from tbmq.backends.memory_credentials import MemoryCredentialStore
            return MemoryCredentialStore()
        if kind == "sqlite":
            from tbmq.backends.sqlite_credentials import make_sqlite_credential_store
            if reactor is not None:
                return make_sqlite_credential_store(config, reactor=reactor)
            return make_sqlite_credential_store(config, self._sqlite_databases(config))
        return None


#: the answer to every client admitted anonymously: one frozen object for all
#: of them, not one per connection
_ANONYMOUS = AuthResult(True, provider="anonymous")
#: what the ``anonymous`` provider answers (:func:`tbmq.hookspecs.tbmq_authentication_scope`)
_ANONYMOUS_SCOPE = AuthScope()


class AnonymousAuth:
    """The last provider: decides on a client that no provider recognised.

    With ``auth.allow_anonymous`` it is accepted, as a DEVICE with no
    authorization rules, unless a provider knows its client id or user name
    (:attr:`tbmq.auth.AuthRequest.known_by`: it presented credentials that
    were refused, as Mosquitto refuses a wrong password with a password file
    and ``allow_anonymous true``).  Otherwise a client that sent a user name
    or a password is refused exactly as a wrong password is, so a refusal
    does not tell which user names exist: CONNACK BAD_USER_NAME_OR_PASSWORD
    (0x86; v3: 4), after a bcrypt check of its password against
    :data:`~tbmq.auth.passwords.UNKNOWN_USER_HASH` (the time a wrong
    password takes; none when it sent no password, as for known
    credentials).  A client without either passes, and is refused with
    NOT_AUTHORIZED (0x87; v3: 5).  A client that asked for a v5 authentication
    method, or that a provider could not decide on
    (:attr:`tbmq.auth.AuthRequest.undecided`), is never accepted
    anonymously."""

    def __init__(self, allow: bool) -> None:
        self.allow = allow

    @hookimpl
    def tbmq_authentication_scope(self, config):
        """Every CONNECT without an Authentication Method."""
        return _ANONYMOUS_SCOPE

    @hookimpl(trylast=True)
    def tbmq_authenticate(self, request):
        if request.auth_method is not None or request.undecided is not None:
            return None  # an authentication service that failed: refused, not anonymous
        if self.allow and request.known_by is None:
            return _ANONYMOUS
        if request.password is not None:
            from tbmq.auth import passwords

            d = request.check_password(request.password, passwords.UNKNOWN_USER_HASH)
            return d.addCallback(lambda _: AuthResult(
                False, reason_code=ReasonCode.BAD_USER_NAME_OR_PASSWORD, provider="anonymous"))
        if request.username is not None:
            return AuthResult(False, reason_code=ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                              provider="anonymous")
        return None


class RulesAuthorization:
    """Authorizes PUBLISH and SUBSCRIBE by the rules of the credentials that
    authenticated the client (TBMQ's PubSubAuthorizationRules); no rules
    means no restriction."""

    @hookimpl(trylast=True)
    def tbmq_authorize_publish(self, session, auth, topic):
        rules = auth.rules if auth is not None else None
        return True if rules is None else rules.may_publish(topic)

    @hookimpl(trylast=True)
    def tbmq_authorize_subscribe(self, session, auth, topic_filter):
        rules = auth.rules if auth is not None else None
        return True if rules is None else rules.may_subscribe(topic_filter)


def builtin_plugins(config):
    """:returns: ``[(name, plugin), ...]`` of the built-in plugins."""
    return [
        ("embedded", EmbeddedBackends()),
        ("anonymous", AnonymousAuth(config.auth.allow_anonymous)),
        ("rules", RulesAuthorization()),
    ]
