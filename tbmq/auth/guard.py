"""What a client may cost the broker before it is authenticated: budgets of
failed logins with bans that expire, a cap on the password checks in
flight per network address and on the node, and a thread pool of their own
for the checks (``auth.login_limits``, :class:`tbmq.config.LoginLimitsConfig`).

bcrypt is slow on purpose (about 55 ms at cost 10 on one core): without a
bound, 500 sockets sending wrong passwords queue checks faster than the
pool runs them, and a good client waits behind all of them (9 s, or no
answer at all within the connect timeout, before these limits).  The
:class:`LoginGuard` is asked before the authentication providers run:

1. a **banned client id** (``max_failures_per_client_id`` failed logins in
   ``window``) gets CONNACK BANNED (0x8A; v3: 5 Not authorized) at once,
   with no password checked, for ``ban_time`` seconds, as EMQX's flapping
   detection bans a client id;
2. a **banned address** (``max_failures_per_address`` failed logins from
   it in ``window``) gets BANNED for the client ids and user names that
   failed to log in within ``window`` (from anywhere); a client id and
   user name without failures is still checked (rule 3).  A flood that
   repeats its user name or client ids from an address is so answered
   without bcrypt, while a good client behind the same address (a NAT, a
   proxy, a test on 127.0.0.1) still gets its password checked.  The
   trade: a flood that changes both its client id and its user name for
   every attempt cannot be told from good clients of its address before
   their passwords are checked; it keeps at most
   ``max_checks_per_address`` checks of the pool, and the new clients of
   that address compete with it for them (the other addresses do not);
   a client that logged in with a password from the address before is not
   held to rule 3 for that address, one check at a time (a *trusted* client
   id and user name, remembered :data:`TRUSTED_FOR` seconds or until it
   fails, as OWASP's "device cookies" let known devices past a lockout);
3. at most ``max_checks_per_address`` CONNECTs with a password (or a v5
   authentication method) from one address, and ``max_checks`` on the
   node, are being authenticated at once; one more gets SERVER_BUSY (0x89;
   v3: 3 Server unavailable) at once, so one address never holds more
   than that share of the ``check_threads`` threads and a good client's
   check waits behind at most that many of a flooding address.  Of those
   places, the last is kept for client ids and user names without a
   failure in ``window``: a flood that repeats its user name holds one
   place at most, even before its address is banned;
4. a check whose connection closed before a thread took it is skipped.

Refusals under a flood are logged as one line per ban and a count every
:data:`SUMMARY_INTERVAL` seconds, never one line per connection.
State is bounded: at most :data:`MAX_TRACKED` sources are remembered (the
least recently failed forgotten first).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from tbmq.auth import passwords
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.mqtt.constants import ReasonCode

__all__ = ["Attempt", "LoginGuard", "PasswordChecks", "BANNED", "BUSY", "MAX_TRACKED",
           "SUMMARY_INTERVAL", "TRUSTED_FOR"]

#: CONNACK BANNED (v5); v3 clients get 5 Not authorized
BANNED = ReasonCode.BANNED
#: CONNACK SERVER_BUSY (v5); v3 clients get 3 Server unavailable
BUSY = ReasonCode.SERVER_BUSY

#: sources (addresses, client ids, user names) whose failures or bans are
#: remembered at most
MAX_TRACKED = 65536

#: seconds between two log lines counting the logins refused without a check
SUMMARY_INTERVAL = 10.0

#: seconds a client id and user name that logged in from an address stay
#: trusted there (a failed login ends it sooner)
TRUSTED_FOR = 86400.0


class PasswordChecks:
    """bcrypt checks on a :class:`~twisted.python.threadpool.ThreadPool`
    of their own, so that a flood of checks neither waits behind nor holds
    the reactor's pool (which also resolves host names).

    :param threads: the pool's threads, >= 1 (bcrypt releases the
        interpreter lock: up to one per core runs at full speed).
    :param reactor: the reactor (``callFromThread``, system event
        triggers); the global one when None.
    """

    def __init__(self, threads: int, reactor: Any = None) -> None:
        self.threads = threads
        self._reactor = reactor
        self.pool: ThreadPool | None = None

    def _started_pool(self) -> ThreadPool:
        if self.pool is None:
            if self._reactor is None:
                from twisted.internet import reactor  # noqa: PLC0415

                self._reactor = reactor
            self.pool = ThreadPool(0, self.threads, name="tbmq-password-checks")
            self.pool.start()
            self._reactor.addSystemEventTrigger("during", "shutdown", self.stop)
        return self.pool

    def check(self, password: bytes | str, hashed: str | bytes | None,
              cancelled=None) -> defer.Deferred:
        """:func:`tbmq.auth.passwords.check_password_async` on this pool.

        :param cancelled: a callable, read by the thread before it hashes:
            True skips the check (its connection is gone), which then
            answers False.
        :returns: a Deferred firing in the reactor thread with the bool.
        """
        if not hashed:
            return defer.succeed(False)
        pool = self._started_pool()
        return passwords.check_password_async(password, hashed, self._reactor, pool, cancelled)

    def stop(self) -> None:
        """Stop the pool's threads (at reactor shutdown)."""
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.stop()


@dataclass(eq=False, slots=True)
class Attempt:
    """One CONNECT's passage through the guard.

    :ivar refusal: None when the CONNECT may be authenticated, else the v5
        CONNACK reason code to refuse it with (:data:`BANNED` or
        :data:`BUSY`).
    :ivar why: what the refusal is about, for the log.
    :ivar costly: it carries a password or an authentication method, and
        holds a place among the checks in flight until :meth:`LoginGuard.done`.
    :ivar trusted: its place is its trusted client id's, not its address's.
    :ivar cancelled: set when its connection is gone: a password check not
        yet started is skipped.
    :ivar skipped: a password check of it was skipped.
    """

    host: str
    client_id: str
    username: str | None
    costly: bool = False
    trusted: bool = False
    refusal: int | None = None
    why: str = ""
    cancelled: bool = False
    skipped: bool = False
    finished: bool = False
    checks: Any = None

    def check_password(self, password: bytes | str, hashed: str | bytes | None) -> defer.Deferred:
        """Check ``password`` against the bcrypt hash ``hashed`` on the
        guard's pool, skipped once the connection is gone.

        :returns: a Deferred firing with True when they match.
        """

        def cancelled() -> bool:
            if self.cancelled:
                self.skipped = True
            return self.cancelled

        return self.checks.check(password, hashed, cancelled)


class LoginGuard:
    """Budgets of failed logins and the password checks in flight, for one
    node (see the module docstring for the rules).

    :param limits: the :class:`tbmq.config.LoginLimitsConfig`.
    :param clock: ``IReactorTime``: ``seconds()`` and ``callLater``.
    :param checks: the :class:`PasswordChecks` the attempts use.
    :ivar refused: logins refused without a check since the start, by
        ``"banned"`` / ``"busy"``.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, limits, clock, checks: PasswordChecks | None = None) -> None:
        self.limits = limits
        self.clock = clock
        self.checks = checks if checks is not None else PasswordChecks(limits.check_threads)
        # key ("a", host) / ("c", client id) / ("u", user name) → [first failure time, count],
        # least recently failed first
        self._failures: collections.OrderedDict = collections.OrderedDict()
        # key → the time its ban ends, earliest first
        self._bans: collections.OrderedDict = collections.OrderedDict()
        # (host, client id, user name) → the time it logged in last, earliest first
        self._trusted: collections.OrderedDict = collections.OrderedDict()
        self._trusted_checks: set = set()  # trusted ones being checked
        self._in_flight: dict[str, int] = {}
        self.in_flight = 0
        self.refused = collections.Counter()
        self._unreported = collections.Counter()
        self._summary = None

    # -- the questions -----------------------------------------------------------------

    def admit(self, host: str, client_id: str, username: str | None,
              costly: bool) -> Attempt | None:
        """Decide whether a CONNECT may be authenticated.

        :param host: the client's network address (the PROXY protocol's
            when used).
        :param client_id: the CONNECT's client id.
        :param username: its user name, or None.
        :param costly: it carries a password or a v5 authentication method
            (a check may cost a hash).
        :returns: None when the CONNECT may be authenticated and holds
            nothing (no check to hold a place for, nothing banned): if it
            is refused, :meth:`failed` counts it.  Else an :class:`Attempt`;
            when its ``refusal`` is not None the CONNECT is to be refused
            with that code, else :meth:`done` must be called once it is
            decided (or its connection is gone).
        """
        if self.admits_freely(costly):
            return None  # nothing banned and no check to hold a place for
        banning = bool(self._bans)
        # (positional: matching a keyword argument to its field costs a third of the call)
        attempt = Attempt(host, client_id, username, False, False, None, "", False, False,
                          False, self.checks)
        now = self.clock.seconds()
        if banning and self._banned(("c", client_id), now):
            return self._refuse(attempt, BANNED, "client id banned")
        who = (host, client_id, username)
        logged_in = self._trusted.get(who)
        trusted = logged_in is not None and now - logged_in < TRUSTED_FOR
        if not trusted and banning and self._banned(("a", host), now) and (
                self._failed(("c", client_id), now) or self._failed(("u", username), now)):
            return self._refuse(attempt, BANNED, "address banned")
        if costly:
            limits = self.limits
            here = self._in_flight.get(host, 0)
            places = limits.max_checks_per_address
            if places > 1 and (self._failed(("c", client_id), now)
                               or self._failed(("u", username), now)):
                places -= 1  # the last place is kept for names without failures
            if trusted and who not in self._trusted_checks:
                attempt.trusted = True  # its own place, apart from its address's
            elif places and here >= places:
                return self._refuse(attempt, BUSY, "too many logins in progress from the address")
            if self.in_flight >= limits.max_checks:
                return self._refuse(attempt, BUSY, "too many logins in progress")
            if attempt.trusted:
                self._trusted_checks.add(who)
            else:
                self._in_flight[host] = here + 1
            self.in_flight += 1
            attempt.costly = True
        return attempt

    def admits_freely(self, costly: bool) -> bool:
        """:param costly: as for :meth:`admit`.
        :returns: True when :meth:`admit` would answer None (nothing
            banned, no check to hold a place for): a caller may skip it,
            and the address it would give it."""
        return not (costly or self._bans)

    def done(self, attempt: Attempt, failed: bool | None) -> None:
        """The authentication of ``attempt`` is decided; safe to call again
        (later calls do nothing).

        :param failed: True when it was refused (counted against its
            address, client id and user name, unless its password check
            was skipped; the client id and user name are no longer trusted
            at the address), False when it succeeded (the client id's
            failures are forgotten; it is trusted at the address), None
            when nothing is known (the connection went away, an internal
            error).
        """
        if attempt.finished or attempt.refusal is not None:
            return
        attempt.finished = True
        costly = attempt.costly
        if not (costly or failed):
            return  # it held no place and leaves no trace
        who = (attempt.host, attempt.client_id, attempt.username)
        if costly:
            host = attempt.host
            if attempt.trusted:
                self._trusted_checks.discard(who)
            else:
                left = self._in_flight.get(host, 1) - 1
                if left > 0:
                    self._in_flight[host] = left
                else:
                    self._in_flight.pop(host, None)
            self.in_flight -= 1
        if failed and not attempt.skipped:
            self.failed(attempt.host, attempt.client_id, attempt.username)
        elif failed is False and attempt.costly:
            self._failures.pop(("c", attempt.client_id), None)
            trusted = self._trusted
            trusted[who] = self.clock.seconds()
            trusted.move_to_end(who)
            while len(trusted) > MAX_TRACKED:
                trusted.popitem(last=False)

    def failed(self, host: str, client_id: str, username: str | None) -> None:
        """A login was refused: one failure more for its address, client id
        and user name (see the module docstring), which are no longer
        trusted at the address.  :meth:`done` calls it for an
        :class:`Attempt`; a login :meth:`admit` answered None for is told
        here directly.

        :param host: the client's network address, as given to :meth:`admit`.
        """
        now = self.clock.seconds()
        limits = self.limits
        self._trusted.pop((host, client_id, username), None)
        self._count(("c", client_id), now, limits.max_failures_per_client_id)
        self._count(("a", host), now, limits.max_failures_per_address)
        if username is not None:
            self._count(("u", username), now, 0)

    def banned(self, kind: str, value: str) -> float | None:
        """:param kind: ``"address"`` or ``"client_id"``.
        :returns: the time (``clock.seconds()``) the ban of ``value`` ends,
            or None when it is not banned."""
        key = ("a" if kind == "address" else "c", value)
        if self._banned(key, self.clock.seconds()):
            return self._bans[key]
        return None

    # -- the bookkeeping --------------------------------------------------------------------

    def _banned(self, key, now: float) -> bool:
        until = self._bans.get(key)
        if until is None:
            return False
        if until > now:
            return True
        del self._bans[key]
        return False

    def _failed(self, key, now: float) -> bool:
        """Did ``key`` fail to log in within the window?"""
        record = self._failures.get(key)
        return record is not None and now - record[0] < self.limits.window

    def _count(self, key, now: float, budget: int) -> None:
        """One more failed login of ``key``; ban it once ``budget`` (> 0)
        failures fell within the window."""
        failures = self._failures
        record = failures.get(key)
        if record is None or now - record[0] >= self.limits.window:
            record = [now, 0]
        record[1] += 1
        failures[key] = record
        failures.move_to_end(key)
        while len(failures) > MAX_TRACKED:
            failures.popitem(last=False)
        if budget and record[1] >= budget and not self._banned(key, now):
            ban_time = self.limits.ban_time
            bans = self._bans
            bans[key] = now + ban_time
            while len(bans) > MAX_TRACKED:
                bans.popitem(last=False)
            kind = "address" if key[0] == "a" else "client id"
            self.log.warn("{kind} {value} banned for {ban_time:g} s: {count} failed logins "
                          "in {window:g} s", kind=kind, value=key[1], ban_time=ban_time,
                          count=record[1], window=self.limits.window)

    def _refuse(self, attempt: Attempt, code: int, why: str) -> Attempt:
        attempt.refusal = code
        attempt.why = why
        name = "banned" if code == BANNED else "busy"
        self.refused[name] += 1
        self._unreported[name] += 1
        if self._summary is None:
            self._summary = self.clock.callLater(SUMMARY_INTERVAL, self._report)
        return attempt

    def _report(self) -> None:
        self._summary = None
        counts, self._unreported = self._unreported, collections.Counter()
        self.log.info("{total} logins refused without a password check in the last "
                      "{interval:g} s: {banned} banned (0x8A), {busy} server busy (0x89)",
                      total=sum(counts.values()), interval=SUMMARY_INTERVAL,
                      banned=counts["banned"], busy=counts["busy"])
