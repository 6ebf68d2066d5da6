"""The broker of one node: its config, backends, router and sessions, and the
calls into the plugin hooks.  Protocol instances talk to it; it never does
network I/O itself.
"""

from __future__ import annotations

import socket
from typing import Any

import pluggy
from twisted.internet import defer
from twisted.logger import Logger

from tbmq.auth.watch import CredentialsWatcher
from tbmq.broker.flow import Flusher
from tbmq.broker.router import Router
from tbmq.broker.sessions import SessionManager
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.plugins import call_decision, ordered_impls


def default_service_id() -> str:
    """TBMQ's service id default: the host name."""
    return socket.gethostname() or "tbmq"


class Broker:
    """One node.

    :param config: the :class:`tbmq.config.Config`.
    :param plugins: the :class:`pluggy.PluginManager` (see
        :func:`tbmq.plugins.make_plugin_manager`).
    :param clock: an ``IReactorTime``; ``clock.seconds()`` is the wall clock
        in seconds (a :class:`twisted.internet.task.Clock` in tests).
    :param bus, session_store, retained_store, device_store, credential_store:
        the backends; when None they come from the factory hooks.
    :raises tbmq.errors.ConfigError: when no plugin provides a backend the
        config names.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, config, plugins: pluggy.PluginManager, clock=None, *,
                 bus=None, session_store=None, retained_store=None, device_store=None,
                 credential_store=None) -> None:
        from tbmq.errors import ConfigError

        if clock is None:
            from twisted.internet import reactor as clock
        self.config = config
        self.plugins = plugins
        self.clock = clock
        self.service_id = config.node.service_id or default_service_id()
        hook = plugins.hook
        if bus is None:
            bus = hook.tbmq_message_bus(config=config)
            if bus is None:
                raise ConfigError(f"bus: no plugin provides the bus {config.bus!r}")
        if session_store is None:
            session_store = hook.tbmq_session_store(config=config)
        if retained_store is None:
            retained_store = hook.tbmq_retained_store(config=config)
        if device_store is None:
            device_store = hook.tbmq_device_message_store(config=config)
        if None in (session_store, retained_store, device_store):
            raise ConfigError(
                f"storage.backend: no plugin provides {config.storage.backend!r}")
        if credential_store is None:
            credential_store = hook.tbmq_credential_store(config=config, reactor=None)
            if credential_store is None:
                raise ConfigError(
                    f"auth.credentials: no plugin provides {config.auth.credentials!r}")
        self.credential_store = credential_store
        self.bus = bus
        self.session_store = session_store
        self.retained_store = retained_store
        self.device_store = device_store
        self.router = Router(self)
        self.sessions = SessionManager(self)
        self.connections: set = set()
        #: coalesces the writes of one batch (see tbmq.broker.flow)
        self.flusher = Flusher()
        #: the connection whose read is being handled, or None
        self.current_source = None
        #: topic names already found valid (a bounded cache of the check)
        self.valid_topics: set[str] = set()
        self.watcher: CredentialsWatcher | None = None
        self.dropped: dict[str, int] = {}
        self.refresh_hooks()

    def refresh_hooks(self) -> None:
        """Look again at which hooks plugins implement (after registering a
        plugin at run time): hooks nobody implements cost nothing per message."""
        hook = self.plugins.hook
        self._authorize_inline = all(
            [impl.plugin_name for impl in getattr(hook, name).get_hookimpls()] == ["rules"]
            for name in ("tbmq_authorize_publish", "tbmq_authorize_subscribe"))
        self._has = {name: bool(getattr(hook, name).get_hookimpls()) for name in (
            "tbmq_message_published", "tbmq_message_delivered", "tbmq_message_dropped",
            "tbmq_client_connected", "tbmq_client_disconnected", "tbmq_session_expired",
            "tbmq_client_subscribed", "tbmq_client_unsubscribed", "tbmq_authentication_failed")}
        self._auth_impls = ordered_impls(hook.tbmq_authenticate, self.config.auth.providers)
        self.notify_delivered = self._has["tbmq_message_delivered"]
        self.notify_published = self._has["tbmq_message_published"]

    def bus_topic(self, name: str) -> str:
        """The bus topic name for TBMQ topic ``name`` (a prefix may come later)."""
        return name

    # -- life cycle --------------------------------------------------------------

    @defer.inlineCallbacks
    def start(self):
        """Start the backends and reload retained messages and persistent
        sessions (with their queued deliveries).

        :returns: a Deferred that fires when the node can accept clients.
        """
        backends = self._backends()
        for backend in backends:
            yield backend.start()
        self.router.start()
        self.watcher = CredentialsWatcher(self, self.config.auth.refresh_interval)
        yield self.watcher.start()
        for message in (yield self.retained_store.load_all()):
            self.router.retained.set(message)
        records = yield self.session_store.load_all()
        deliveries = {}
        for record in records:
            deliveries[record.client_id] = yield self.device_store.load(record.client_id)
        self.sessions.restore(records, deliveries)
        self.log.info("broker {service_id} started: {sessions} persistent sessions, "
                      "{retained} retained messages", service_id=self.service_id,
                      sessions=len(records), retained=len(self.router.retained))
        self.plugins.hook.tbmq_broker_started(broker=self)

    def _backends(self) -> list:
        seen, out = set(), []
        for backend in (self.bus, self.session_store, self.retained_store, self.device_store,
                        self.credential_store):
            if id(backend) not in seen:
                seen.add(id(backend))
                out.append(backend)
        return out

    @defer.inlineCallbacks
    def stop(self):
        """Close every connection (v5 clients get DISCONNECT 0x8B), then
        flush and stop the backends."""
        self.plugins.hook.tbmq_broker_stopping(broker=self)
        if self.watcher is not None:
            self.watcher.stop()
        connections = list(self.connections)
        closed = [conn.when_closed() for conn in connections]
        for conn in connections:
            conn.disconnect(0x8B)  # SERVER_SHUTTING_DOWN; aborted after 5 s if stuck
        if closed:
            yield defer.DeferredList(closed)
        now = self.clock.seconds()
        for session in list(self.sessions.sessions.values()):
            if session.persistent and session.connection is None and session.disconnected_at is None:
                session.disconnected_at = now
        for backend in reversed(self._backends()):
            yield backend.stop()

    # -- decisions -----------------------------------------------------------------

    def authenticate(self, request, provider: str | None = None) -> defer.Deferred:
        """Ask the ``tbmq_authenticate`` hooks; see :mod:`tbmq.hookspecs`.

        :param request: the :class:`tbmq.auth.AuthRequest`.
        :param provider: ask only this plugin (the next step of an enhanced
            authentication exchange it continued).
        :returns: Deferred firing with ``(AuthResult or None, plugin name)``.
        """
        request.credentials = self.credential_store
        request.config = self.config
        if provider is None:
            return call_decision(self.plugins.hook.tbmq_authenticate, impls=self._auth_impls,
                                 request=request)
        hook = self.plugins.subset_hook_caller(
            "tbmq_authenticate",
            [p for name, p in self.plugins.list_name_plugin() if name != provider])
        return call_decision(hook, self.config.auth.providers, request=request)

    def authorize(self, action: str, session, auth, topic: str):
        """May ``session`` publish to / subscribe to ``topic``?

        :param action: ``"publish"`` (a topic name) or ``"subscribe"`` (a
            topic filter without ``$share/<group>/``).
        :returns: a bool when every hook answered at once (the usual case:
            only the built-in rules), else a Deferred firing with a bool.
            Every plugin passing means no [ARCHITECTURE §3].
        """
        if self._authorize_inline:
            rules = auth.rules if auth is not None else None
            if rules is None:
                return True
            return rules.may_publish(topic) if action == "publish" else rules.may_subscribe(topic)
        if action == "publish":
            d = call_decision(self.plugins.hook.tbmq_authorize_publish,
                              session=session, auth=auth, topic=topic)
        else:
            d = call_decision(self.plugins.hook.tbmq_authorize_subscribe,
                              session=session, auth=auth, topic_filter=topic)
        d.addCallback(lambda answer: bool(answer[0]))
        box: list = []

        def keep(result):
            box.append(result)
            return result

        d.addBoth(keep)
        if box and type(box[0]) is bool:
            return box[0]  # every plugin answered synchronously
        return d

    # -- notifications ---------------------------------------------------------------

    def stats_dropped(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def _notify(self, name: str, **kwargs: Any) -> None:
        if self._has[name]:
            try:
                getattr(self.plugins.hook, name)(**kwargs)
            except Exception:
                self.log.failure("plugin hook {name} failed", name=name)

    def hooks_message_published(self, session, message) -> None:
        if self._has["tbmq_message_published"]:
            self._notify("tbmq_message_published", session=session, message=message)

    def hooks_message_delivered(self, session, message, qos: int) -> None:
        if self._has["tbmq_message_delivered"]:
            self._notify("tbmq_message_delivered", session=session, message=message, qos=qos)

    def hooks_message_dropped(self, session, message, reason: str) -> None:
        if self._has["tbmq_message_dropped"]:
            self._notify("tbmq_message_dropped", session=session, message=message, reason=reason)

    def hooks_client_connected(self, session, connect, address) -> None:
        self._notify("tbmq_client_connected", session=session, connect=connect, address=address)

    def hooks_client_disconnected(self, session, reason_code, will: bool) -> None:
        self._notify("tbmq_client_disconnected", session=session,
                     reason_code=reason_code, will=will)

    def hooks_authentication_failed(self, connect, address, reason_code: int) -> None:
        self._notify("tbmq_authentication_failed", connect=connect, address=address,
                     reason_code=reason_code)

    def hooks_client_subscribed(self, session, topic_filter, options, reason_code) -> None:
        if self._has["tbmq_client_subscribed"]:
            self._notify("tbmq_client_subscribed", session=session, topic_filter=topic_filter,
                         options=options, reason_code=reason_code)

    def hooks_client_unsubscribed(self, session, topic_filter, reason_code) -> None:
        if self._has["tbmq_client_unsubscribed"]:
            self._notify("tbmq_client_unsubscribed", session=session,
                         topic_filter=topic_filter, reason_code=reason_code)

    def hooks_session_expired(self, client_id: str) -> None:
        self._notify("tbmq_session_expired", client_id=client_id)
