"""The node's calls into the plugin hooks (:mod:`tbmq.hookspecs`), all
through pluggy.

Decision hooks: authentication asks one provider at a time in the order of
``auth.providers``, so a provider that passes hands over to the next one,
even after a Deferred.  pluggy stays the registry: the providers and their
implementations are read from it once per change of the plugin set
(:meth:`Hooks.refresh`), and each plain implementation is then called as
pluggy's own loop would call it (its arguments by name, in its plugin's
order) without pluggy's per-call machinery, which a CONNECT would otherwise
pay once per provider; a provider with a wrapper implementation goes
through a pluggy subset caller of its own.  A provider's answer given at
once is passed on at once (no Deferred).  A provider is asked only the
requests in the scope it told for the node's configuration
(``tbmq_authentication_scope``, :class:`tbmq.auth.AuthScope`): the
providers to ask are found once per shape of request (which of a password,
a user name and a certificate chain a CONNECT carries, or its
Authentication Method), so a CONNECT with none of them is not asked of the
certificate, token or SCRAM providers.  Authorization uses pluggy's
``firstresult`` (the first answer that is not None wins; every plugin
passing means no, ARCHITECTURE §3).
Notification hooks on the message path cost nothing while no plugin
implements them.  The core names no plugin.
"""

from __future__ import annotations

import time
from typing import Any

import pluggy
from twisted.internet import defer
from twisted.logger import Logger

from tbmq.auth import EVERY_REQUEST, AuthResult
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.plugins import ordered_impls

#: notification hooks the node looks up to skip when nobody implements them
NOTIFICATIONS = (
    "tbmq_message_published", "tbmq_message_delivered", "tbmq_message_dropped",
    "tbmq_client_connected", "tbmq_client_disconnected", "tbmq_session_expired",
    "tbmq_client_subscribed", "tbmq_client_unsubscribed", "tbmq_authentication_failed",
)


def _direct_call(impls: list):
    """:param impls: one plugin's plain ``tbmq_authenticate``
        :class:`pluggy.HookImpl` objects, in pluggy's call order.
    :returns: ``call(request)`` giving the first answer that is not None,
        or None: what pluggy's loop would do with them."""
    if len(impls) == 1 and tuple(impls[0].argnames) == ("request",):
        return impls[0].function
    # pluggy checked at registration that an implementation takes
    # ``request`` or nothing
    calls = [(impl.function, bool(impl.argnames)) for impl in impls]

    def call(request):
        for function, takes_request in calls:
            result = function(request) if takes_request else function()
            if result is not None:
                return result
        return None

    return call


def _subset_call(caller):
    """:param caller: a pluggy subset hook caller of one plugin.
    :returns: ``call(request)`` giving its first result, or None."""

    def call(request):
        results = caller(request=request)
        return results[0] if results else None

    return call


class Hooks:
    """The plugin hooks as the node calls them.

    :param plugins: the :class:`pluggy.PluginManager`.
    :param providers: ``auth.providers``: plugin names asked first, in order.
    :param config: the :class:`tbmq.config.Config` the providers tell their
        scope for (``tbmq_authentication_scope``); None: every provider is
        asked every request.
    :ivar wants_published: True when some plugin implements
        ``tbmq_message_published``.
    :ivar wants_delivered: the same for ``tbmq_message_delivered``.
    :ivar wants_connected: the same for ``tbmq_client_connected``.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, plugins: pluggy.PluginManager, providers=(), config=None) -> None:
        self.plugins = plugins
        self.providers = tuple(providers)
        self.config = config
        self.refresh()

    def refresh(self) -> None:
        """Look again at which plugins implement which hooks (after a plugin
        is registered at run time)."""
        hook = self.plugins.hook
        self._has = {name: bool(getattr(hook, name).get_hookimpls()) for name in NOTIFICATIONS}
        self.wants_published = self._has["tbmq_message_published"]
        self.wants_delivered = self._has["tbmq_message_delivered"]
        self.wants_dropped = self._has["tbmq_message_dropped"]
        self.wants_connected = self._has["tbmq_client_connected"]
        impls = ordered_impls(hook.tbmq_authenticate, self.providers)
        names = list(dict.fromkeys(impl.plugin_name for impl in impls))
        everyone = [plugin for _, plugin in self.plugins.list_name_plugin()]
        self._auth_callers = []
        for name in names:
            mine = self.plugins.get_plugin(name)
            own = [impl for impl in reversed(hook.tbmq_authenticate.get_hookimpls())
                   if impl.plugin is mine]
            if any(impl.hookwrapper or impl.wrapper for impl in own):
                self._auth_callers.append((name, _subset_call(self.plugins.subset_hook_caller(
                    "tbmq_authenticate", remove_plugins=[p for p in everyone if p is not mine]))))
            else:
                self._auth_callers.append((name, _direct_call(own)))
        self._scopes = [self._scope(name) for name in names]
        self._methods = frozenset(method for scope in self._scopes
                                  for method in (scope.methods or ()))
        #: a request's shape (:meth:`tbmq.auth.AuthScope.answers`) → the callers to ask
        self._by_shape: dict = {}

    def _scope(self, name: str):
        """:returns: the :class:`~tbmq.auth.AuthScope` the plugin ``name``
        tells for :attr:`config` (:data:`~tbmq.auth.EVERY_REQUEST` when it
        tells none)."""
        if self.config is None:
            return EVERY_REQUEST
        mine = self.plugins.get_plugin(name)
        for impl in self.plugins.hook.tbmq_authentication_scope.get_hookimpls():
            if impl.plugin is mine:
                try:
                    scope = impl.function(**{arg: self.config for arg in impl.argnames})
                except Exception:
                    self.log.failure("plugin hook tbmq_authentication_scope of {name} failed: "
                                     "it is asked every request", name=name)
                    return EVERY_REQUEST
                return EVERY_REQUEST if scope is None else scope
        return EVERY_REQUEST

    # -- decisions -------------------------------------------------------------------

    def authenticate(self, request, provider: str | None = None):
        """Ask the ``tbmq_authenticate`` hooks, one provider at a time.

        :param request: the :class:`tbmq.auth.AuthRequest`.
        :param provider: ask only this plugin (the next step of an enhanced
            authentication exchange it continued).
        :returns: ``(AuthResult or None, plugin name)`` when every provider
            asked answered at once, else a Deferred firing with it;
            ``(None, None)`` when every plugin passed.  A provider raising
            gives a failed Deferred.
        """
        if provider is not None:
            callers = [c for c in self._auth_callers if c[0] == provider]
        else:
            # (AuthScope.answers; inline: no call per CONNECT)
            method = request.auth_method
            if method is None:
                shape = (request.password is not None, request.username is not None,
                         True if request.certificate_chain else False)
            else:
                shape = method if method in self._methods else ""
            callers = self._by_shape.get(shape)
            if callers is None:
                callers = self._by_shape[shape] = [
                    caller for caller, scope in zip(self._auth_callers, self._scopes)
                    if scope.answers(shape)]
        try:
            return self._ask(request, callers, 0)
        except Exception:
            return defer.fail()

    def _ask(self, request, callers: list, index: int):
        """Ask ``callers[index:]`` in turn until one answers (see
        :meth:`authenticate`)."""
        for index in range(index, len(callers)):
            name, call = callers[index]
            result = call(request)
            if result is None:
                continue
            # an answer given at once is no Deferred: told by its type, not
            # isinstance (Deferred is an Awaitable: an ABC's check, a call
            # of Python code per answer)
            if type(result) is not AuthResult and isinstance(result, defer.Deferred):
                return result.addCallback(self._asked, request, callers, index + 1, name)
            return result, name
        return None, None

    def _asked(self, answer, request, callers: list, index: int, name: str):
        """A provider's Deferred fired with ``answer``: its answer, or the
        next providers' when it passed (None)."""
        if answer is not None:
            return answer, name
        return self._ask(request, callers, index)

    def authorize(self, action: str, session, auth, topic: str):
        """May ``session`` publish to / subscribe to ``topic``?

        :param action: ``"publish"`` (a topic name) or ``"subscribe"`` (a
            topic filter without ``$share/<group>/``).
        :param session: the :class:`tbmq.broker.session.Session` (plugins get
            its :class:`tbmq.views.SessionView`), or None for a will checked
            at CONNECT.
        :returns: a bool when the answer is known at once, else a Deferred
            firing with a bool.  No answer means no.
        """
        hook = self.plugins.hook
        view = None if session is None else session.view
        if action == "publish":
            answer = hook.tbmq_authorize_publish(session=view, auth=auth, topic=topic)
        else:
            answer = hook.tbmq_authorize_subscribe(session=view, auth=auth, topic_filter=topic)
        if isinstance(answer, defer.Deferred):
            return answer.addCallback(bool)
        return bool(answer)

    # -- notifications -------------------------------------------------------------------

    def notify(self, name: str, **kwargs: Any) -> None:
        """Call notification hook ``name`` when some plugin implements it; a
        failing plugin is logged and the others go on.  A ``session``
        argument (a :class:`~tbmq.broker.session.Session`) reaches plugins as
        its :class:`tbmq.views.SessionView`."""
        if self._has.get(name):
            session = kwargs.get("session")
            if session is not None:
                kwargs["session"] = getattr(session, "view", session)
            try:
                getattr(self.plugins.hook, name)(**kwargs)
            except Exception:
                self.log.failure("plugin hook {name} failed", name=name)

    def message_published(self, session, message) -> None:
        if self.wants_published:
            self.notify("tbmq_message_published", session=session, message=message)

    def message_delivered(self, session, message, qos: int) -> None:
        if self.wants_delivered:
            self.notify("tbmq_message_delivered", session=session, message=message, qos=qos)

    def message_dropped(self, session, message, reason: str) -> None:
        if self.wants_dropped:
            self.notify("tbmq_message_dropped", session=session, message=message, reason=reason)

    def client_connected(self, session, connect, address) -> None:
        if self.wants_connected:  # once per CONNECT: no arguments built for nobody
            self.notify("tbmq_client_connected", session=session, connect=connect,
                        address=address)

    def client_disconnected(self, session, reason_code, will: bool) -> None:
        self.notify("tbmq_client_disconnected", session=session, reason_code=reason_code,
                    will=will)

    def authentication_failed(self, connect, address, reason_code: int) -> None:
        self.notify("tbmq_authentication_failed", connect=connect, address=address,
                    reason_code=reason_code)

    def client_subscribed(self, session, topic_filter, options, reason_code) -> None:
        self.notify("tbmq_client_subscribed", session=session, topic_filter=topic_filter,
                    options=options, reason_code=reason_code)

    def client_unsubscribed(self, session, topic_filter, reason_code) -> None:
        self.notify("tbmq_client_unsubscribed", session=session, topic_filter=topic_filter,
                    reason_code=reason_code)

    def session_expired(self, client_id: str) -> None:
        self.notify("tbmq_session_expired", client_id=client_id)


#: Every reason the node counts a message as not delivered (the keys of
#: :attr:`DropCounter.counts`, the ``reason`` labels of
#: ``tbmq_messages_dropped_total``; the first five, and a delivery's
#: ``outgoing_rate_limited`` and ``total_rate_limited``, also reach the
#: ``tbmq_message_dropped`` hook, from :meth:`tbmq.broker.outbox.Outbox.drop`,
#: which also hears of ``session_ended``, not counted here):
#:
#: * ``expired``: its Message Expiry Interval passed before it could be sent
#:   [MQTT-3.3.2-5];
#: * ``offline_qos0``: QoS 0 for a persistent session while its client is
#:   offline (not stored);
#: * ``slow_consumer``: QoS 0 for a client whose socket stays full past
#:   ``mqtt.max_outbound_buffer``;
#: * ``quota_exceeded``: the queue of a non-persistent session overflowed:
#:   the client is disconnected (QUOTA_EXCEEDED), what it had queued or
#:   in flight is counted;
#: * ``too_large_for_client``: larger than the client's Maximum Packet Size
#:   [MQTT-3.1.2-25];
#: * ``store_limit``: the oldest stored messages of a persistent DEVICE
#:   session, removed at the device store's limit;
#: * ``not_authorized``: a PUBLISH its client may not publish (NOT_AUTHORIZED
#:   for a v5 QoS 1/2 publisher);
#: * ``bus_refused``: a PUBLISH the bus did not take (not acknowledged);
#: * ``incoming_rate_limited``: a PUBLISH over its client's
#:   ``mqtt.rate_limits.incoming_publish`` (see :mod:`tbmq.broker.limits`);
#: * ``outgoing_rate_limited``: a QoS 0 delivery over its non-persistent
#:   subscriber's ``mqtt.rate_limits.outgoing_publish``;
#: * ``total_rate_limited``: a PUBLISH or a delivery over this node's share
#:   of ``mqtt.rate_limits.total``;
#: * ``device_persisted_rate_limited``: a message not stored for a
#:   persistent DEVICE, over this node's share of
#:   ``mqtt.rate_limits.device_persisted_messages``.
DROP_REASONS = ("expired", "offline_qos0", "slow_consumer", "quota_exceeded",
                "too_large_for_client", "store_limit", "not_authorized", "bus_refused",
                "incoming_rate_limited", "outgoing_rate_limited", "total_rate_limited",
                "device_persisted_rate_limited")


class DropCounter:
    """Messages not delivered, by reason, for the whole node (the totals the
    log and the metrics report).

    :ivar counts: reason → count; every one of :data:`DROP_REASONS` from the
        start (0), so a metric has its series before the first drop.
    """

    __slots__ = ("counts", "_refused_logged_at", "_refused_since_log", "_store_logged_at",
                 "_store_since_log")

    #: seconds between two log lines about messages the bus refused
    REFUSED_LOG_INTERVAL = 10.0

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._refused_logged_at = float("-inf")
        self._refused_since_log = 0
        self._store_logged_at = float("-inf")
        self._store_since_log = 0

    def add(self, reason: str, n: int = 1) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + n

    def refused(self, failure) -> None:
        """A publisher's message was not taken by the bus (``failure`` of a
        :class:`tbmq.errors.BusError`): counted as ``bus_refused`` (it was
        never acknowledged) and logged at most once every
        :data:`REFUSED_LOG_INTERVAL` seconds with the count since the last
        line, so an outage does not flood the log."""
        self.add("bus_refused")
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._refused_logged_at >= self.REFUSED_LOG_INTERVAL:
            self.log.warn("{count} message(s) not accepted by the bus, not acknowledged: "
                          "{error}", count=self._refused_since_log,
                          error=failure.getErrorMessage())
            self._refused_logged_at = now
            self._refused_since_log = 0

    def store_write(self, result, operation: str) -> None:
        """A session's write to the device store whose outcome nobody waits
        for: its failure goes to :meth:`store_failed` (counted and logged,
        not an unhandled error per delivery).

        :param result: the store call's Deferred, or None (a store that
            wrote at once).
        :param operation: what the call did (``"update"``, ``"remove"``),
            named in the log line."""
        if result is not None:
            result.addErrback(self.store_failed, operation)

    def store_failed(self, failure, operation: str) -> None:
        """A session's write to the device store (``operation``: ``update``
        of a delivery's state, ``remove`` of acknowledged ones) failed: the
        delivery stays as the store had it, so it is sent again at the
        client's next connection (a duplicate, never a loss).  Logged at
        most once every :data:`REFUSED_LOG_INTERVAL` seconds with the count
        since the last line (a store outage touches every session).

        :returns: None (the failure is handled)."""
        self._store_since_log += 1
        now = time.monotonic()
        if now - self._store_logged_at >= self.REFUSED_LOG_INTERVAL:
            self.log.warn("{count} device store write(s) ({operation}) failed; those deliveries "
                          "are sent again at the next connection: {error}",
                          count=self._store_since_log, operation=operation,
                          error=failure.getErrorMessage())
            self._store_logged_at = now
            self._store_since_log = 0
