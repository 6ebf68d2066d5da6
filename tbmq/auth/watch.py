"""Changed credentials take effect on connected clients without a reconnect.

:class:`CredentialsWatcher` asks the credential store every
``auth.refresh_interval`` seconds what changed
(:meth:`tbmq.interfaces.ICredentialStore.changed_since`); connections
authenticated by changed credentials get their authorization rules rebound
and lose the subscriptions the new rules no longer allow; connections whose
credentials were deleted are disconnected with NOT_AUTHORIZED (0x87).
"""

from __future__ import annotations

import dataclasses

from twisted.internet import task
from twisted.logger import Logger

from tbmq.auth.rules import AuthorizationRules
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.mqtt.constants import ReasonCode


def bind_rules(credentials, request):
    """The bound rules of ``credentials`` for the client of ``request``.

    :param credentials: a :class:`tbmq.model.Credentials`.
    :param request: the connection's :class:`tbmq.auth.AuthRequest`.
    :returns: a :class:`tbmq.auth.rules.BoundRules`.
    :raises tbmq.errors.CredentialsError: when a pattern is not a regex.
    """
    rules = AuthorizationRules.from_value(credentials.value.get("authRules"))
    return rules.bind(request.client_id, request.username, request.certificate_cn)


class CredentialsWatcher:
    """Polls the credential store and applies changes to live connections.

    :param store: the :class:`tbmq.interfaces.ICredentialStore`.
    :param connections: the node's live connections (a set).
    :param clock: ``IReactorTime``.
    :param interval: seconds between polls.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, store, connections, clock, interval: float) -> None:
        self.store = store
        self.connections = connections
        self.clock = clock
        self.interval = interval
        self.version = 0
        self._loop: task.LoopingCall | None = None
        self._busy = False

    def start(self):
        """Take the current version as the baseline, then poll.

        :returns: a Deferred that fires once the baseline is known.
        """
        d = self.store.changed_since(0)

        def baseline(answer):
            self.version = answer[2]
            self._loop = task.LoopingCall(self.poll)
            self._loop.clock = self.clock
            self._loop.start(self.interval, now=False).addErrback(
                lambda f: self.log.failure("credentials watcher stopped", f))

        return d.addCallback(baseline)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()

    def poll(self):
        """One check; overlapping checks are skipped."""
        if self._busy:
            return None
        self._busy = True
        d = self.store.changed_since(self.version)
        d.addCallback(self._apply)
        d.addErrback(lambda f: self.log.failure("checking changed credentials failed", f))

        def done(_):
            self._busy = False

        return d.addBoth(done)

    def _apply(self, answer) -> None:
        changed, deleted, version = answer
        self.version = version
        if not changed and not deleted:
            return
        by_id = {c.id: c for c in changed}
        deleted = set(deleted)
        for conn in list(self.connections):
            auth = conn.auth
            if auth is None or auth.credentials is None:
                continue
            if auth.credentials in deleted:
                self.log.info("credentials of {client_id} were removed; disconnecting",
                              client_id=conn.auth_request.client_id)
                conn.disconnect(ReasonCode.NOT_AUTHORIZED)
                continue
            credentials = by_id.get(auth.credentials)
            if credentials is None:
                continue
            try:
                rules = bind_rules(credentials, conn.auth_request)
            except Exception:
                self.log.failure("bad rules in credentials {name}", name=credentials.name)
                continue
            conn.auth = dataclasses.replace(auth, rules=rules)
            self.log.info("authorization rules of {client_id} changed",
                          client_id=conn.auth_request.client_id)
            conn.recheck_subscriptions()
