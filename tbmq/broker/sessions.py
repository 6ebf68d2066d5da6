"""The sessions of this node: connect (new, resumed, taken over), disconnect,
will messages with their delay, session expiry, and restore after a restart
(MQTT 5.0 §3.1.2.4, §3.1.3.2, §3.1.4, §4.1).
"""

from __future__ import annotations

import itertools
import os
from functools import partial

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from tbmq.broker.session import EXPIRY_NEVER, Session, SessionContext
from tbmq.cluster.records import UNCLAIMED, SessionInfo, WillRecord
from tbmq.errors import BusClosedError
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import ClientType, Message, SubscriptionOptions
from tbmq.mqtt import MQTT_5, Property, ReasonCode


#: this process's session ids: a random 64-bit prefix, then a counter
_SESSION_PREFIX = os.urandom(8).hex()
_session_count = itertools.count(1)


def new_session_id() -> str:
    """A new connection's session id: 32 hexadecimal digits (as a uuid
    hex), unique in the cluster: this process's random 64-bit prefix and a
    64-bit counter (a uuid4 costs a system call for its random bytes; the
    ids are only compared for equality)."""
    return f"{_SESSION_PREFIX}{next(_session_count):016x}"


def is_persistent(connect) -> bool:
    """TBMQ's persistent client: v3 ``cleanSession=0``; v5 a session expiry
    interval above 0.  (TBMQ also counts v5 ``cleanStart=0`` with no expiry;
    here such a session resumes state but ends with its connection, as
    [MQTT-3.1.2-23] requires, so it is kept in memory only.)"""
    if connect.protocol_level < MQTT_5:
        return not connect.clean_start
    return connect.properties.get(Property.SESSION_EXPIRY_INTERVAL, 0) > 0


class Opening:
    """The answer to one connect request
    (:meth:`tbmq.cluster.session_events.SessionEvents.request_connect`'s
    ``answer``: a Deferred's ``callback``/``errback``, called once), for a
    fraction of a Deferred's cost: ``bind(*args, response)`` binds the
    session (``args``: what it takes before the response, kept here: no
    partial per CONNECT), then ``opened`` gets what it returned;
    ``refused(failure)`` follows a failed request or a failed ``bind``;
    ``failed(failure)`` catches what ``opened`` or ``refused`` raised.
    Nothing reaches the caller of ``callback``/``errback`` (the cluster's
    answer, maybe in a bus handler).
    """

    __slots__ = ("bind", "opened", "refused", "failed", "args")

    def __init__(self, bind, opened, refused, failed, args: tuple = ()) -> None:
        self.bind = bind
        self.opened = opened
        self.refused = refused
        self.failed = failed
        self.args = args

    def callback(self, response) -> None:
        try:
            bound = self.bind(*self.args, response)
        except Exception:
            self.errback(Failure())
            return
        try:
            self.opened(bound)
        except Exception:
            self.failed(Failure())

    def errback(self, failure) -> None:
        """:param failure: a :class:`~twisted.python.failure.Failure` or an
            exception (as a Deferred's ``errback`` takes)."""
        if not isinstance(failure, Failure):
            failure = Failure(failure)
        try:
            self.refused(failure)
        except Exception:
            self.failed(Failure())


def address_text(address) -> str | None:
    """:param address: an ``IAddress`` (or None).
    :returns: ``host:port``, ``[host]:port`` for IPv6, a UNIX socket's
        path, or None when nothing is known."""
    if address is None:
        return None
    host = getattr(address, "host", None)
    if host is None:
        name = getattr(address, "name", None)
        return name.decode("utf-8", "replace") if isinstance(name, bytes) else name
    port = getattr(address, "port", None)
    host = f"[{host}]" if ":" in host else host
    return host if port is None else f"{host}:{port}"


def _identify(session: Session, conn, connect) -> None:
    """Record on ``session`` who its new connection's client is: the
    address (behind the PROXY protocol, the proxied one), the user name it
    authenticated with (a SCRAM provider's, else CONNECT's) and the name
    of the credentials record that admitted it."""
    request = getattr(conn, "auth_request", None)
    if request is not None:
        address, username = request.address, request.username
    else:
        transport = getattr(conn, "transport", None)
        address = transport.getPeer() if transport is not None else None
        username = connect.username
    auth = getattr(conn, "auth", None)
    session.address = address_text(address)
    session.username = username
    session.credentials_name = getattr(auth, "credentials_name", None)


class SessionManager:
    """Client id → :class:`Session` for every session this node holds.

    :param ctx: a :class:`SessionContext` factory: ``make_context(manager)``
        builds the context its sessions share (this manager is their
        subscription book).
    :param router: the :class:`tbmq.broker.router.Router` (subscriptions in
        its trie; wills published through it).
    :param registry: the :class:`tbmq.cluster.registry.SessionRegistry`
        (``tbmq.client.session``).
    :param book: the :class:`tbmq.cluster.registry.SubscriptionBook`
        (``tbmq.client.subscriptions``; it keeps the trie).
    :param service_id: this node's service id.
    :param sessions: the dict to keep the sessions in (shared with the
        router and sinks, which look targets up in it).
    :ivar sessions: client id → the sessions of this node, connected or not.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, make_context, router, registry, book, service_id: str,
                 sessions: dict, events=None) -> None:
        self.ctx: SessionContext = make_context(self)
        self.clock = self.ctx.clock
        self.mqtt = self.ctx.mqtt
        self.hooks = self.ctx.hooks
        self.device_store = self.ctx.device_store
        self.router = router
        self.registry = registry
        self.book = book
        #: the :class:`tbmq.cluster.session_events.SessionEvents` (set by the node)
        self.events = events
        self.service_id = service_id
        self.sessions: dict[str, Session] = sessions
        # the persistent sessions created here since the start, by the
        # address their client connected from (mqtt.max_persistent_sessions_per_address)
        self._origin: dict[str, str] = {}
        self._by_address: dict[str, set[str]] = {}

    # -- connect ---------------------------------------------------------------

    def expiry_for(self, connect, cap: int | None = None) -> int:
        """The session expiry interval granted, in seconds.

        :param cap: the longest granted (an anonymous client's is lower);
            ``mqtt.max_session_expiry_interval`` when None.  A v3
            persistent session gets the cap (4294967295: it never expires).
        """
        if cap is None:
            cap = self.mqtt.max_session_expiry_interval
        if connect.protocol_level < MQTT_5:
            asked = 0 if connect.clean_start else EXPIRY_NEVER
        else:
            asked = connect.properties.get(Property.SESSION_EXPIRY_INTERVAL, 0)
        return min(asked, cap)

    def known(self, client_id: str) -> bool:
        """:returns: True when a session of ``client_id`` exists, on this
        node or another (a CONNECT for it resumes or replaces it)."""
        return client_id in self.sessions or self.registry.get(client_id) is not None

    def persistent_from(self, address: str) -> int:
        """:returns: the persistent sessions that clients connecting from
        ``address`` created on this node since it started and that have
        not ended."""
        return len(self._by_address.get(address, ()))

    def _track_origin(self, client_id: str, address: str | None) -> None:
        self._forget_origin(client_id)
        if address is not None:
            self._origin[client_id] = address
            self._by_address.setdefault(address, set()).add(client_id)

    def _forget_origin(self, client_id: str) -> None:
        address = self._origin.pop(client_id, None)
        if address is not None:
            held = self._by_address[address]
            held.discard(client_id)
            if not held:
                del self._by_address[address]

    def connect(self, conn, connect, client_type: ClientType, expiry_cap: int | None = None,
                address: str | None = None, *, opened, refused, failed) -> None:
        """Ask the cluster for the session of ``connect.client_id`` (a
        session event, :mod:`tbmq.cluster.session_events`), then bind
        ``conn`` to it.  No Deferred: the answer goes to an :class:`Opening`
        (a CONNECT is answered during the call on the embedded node).

        :param expiry_cap: the longest session expiry interval granted,
            seconds; ``mqtt.max_session_expiry_interval`` when None.
        :param address: the client's network address: a persistent session
            it creates counts towards :meth:`persistent_from`; None: it is
            not counted (``mqtt.max_persistent_sessions_per_address`` off).
        :param opened: ``opened((session, session_present))`` once bound.
        :param refused: ``refused(failure)`` when the cluster did not answer
            (:class:`~tbmq.errors.BusPublishError`) or binding failed.
        :param failed: ``failed(failure)`` when ``opened`` or ``refused`` raised.
        """
        persistent = is_persistent(connect)
        session_id = new_session_id()
        expiry = self.expiry_for(connect, expiry_cap)
        self.events.request_connect(
            connect.client_id, session_id, clean_start=connect.clean_start,
            persistent=persistent, client_type=client_type,
            session_expiry_interval=expiry, protocol_level=connect.protocol_level,
            answer=Opening(self._open, opened, refused, failed,
                           (conn, connect, client_type, persistent, expiry, address, session_id)))

    def _open(self, conn, connect, client_type: ClientType, persistent: bool, expiry: int,
              address: str | None, session_id: str | None, response) -> tuple[Session, bool]:
        """Bind ``conn`` to the session the cluster answered about
        (``response``, last: :meth:`connect` gives the others positionally,
        through its :class:`Opening`), with ``expiry`` (:meth:`expiry_for`)
        as its session expiry interval; ``persistent`` is
        :func:`is_persistent` of ``connect``.

        The session gets ``session_id``, the one its connect request named
        (the deciding member remembers the grant under it until the
        registry shows it: :meth:`tbmq.cluster.session_events.SessionEvents.on_registry_change`);
        a new one when None.

        A session still connected here is taken over: its connection gets
        DISCONNECT SESSION_TAKEN_OVER (0x8E) in v5 and is closed
        [MQTT-3.1.4-3] (one connected on another node was dropped there by
        the deciding node).  A clean start
        ends any existing session [MQTT-3.1.2-4]; otherwise an existing
        session resumes [MQTT-3.2.2-2], here or from what the cluster holds
        (its subscriptions, its deliveries in the device store).

        A will waiting for its Will Delay Interval is never published once a
        new connection for the client id arrives, whether that connection
        resumes the session (Clean Start 0) or starts a new one (Clean Start
        1): [MQTT-3.1.3-9] (§3.1.3.2.2) says the Server MUST NOT send the
        Will Message when a new Network Connection to the Session is made
        before the delay has passed, and §3.1.2.5 [MQTT-3.1.2-8] lists "a
        new Network Connection for the ClientID is opened before the Will
        Delay Interval has elapsed" among the cases where it is not
        published, with no condition on Clean Start.  The non-normative
        comment of §3.1.3.2.2 reads a Clean Start as ending the old Session,
        which would publish the will at once ("whichever happens first");
        tbmq follows the normative statements: the client is back, so the
        will, which announces that it is gone, is not sent.  A will without
        a delay is published when the old connection closes, a takeover
        included.
        """
        now = self.clock.seconds()
        client_id = connect.client_id
        existing = self.sessions.get(client_id)
        if existing is not None:
            old = existing.connection
            if old is not None:
                self.log.info("session {client_id} taken over", client_id=client_id)
                existing.detach(now)
                old.session = None
                self._will_on_close(existing, publish=True)
                old.disconnect(ReasonCode.SESSION_TAKEN_OVER)
            # a new connection before the will delay passed: no will
            self._cancel_timers(existing)
            existing.will = None
            if connect.clean_start or not existing.persistent:
                self.end_session(existing, expired=False,
                                 keep_topic=self._application(connect, client_type))
                existing = None
        elif response.session is not None:
            existing = self._adopt(response, self._application(connect, client_type))
        present = existing is not None
        if existing is None:
            session = Session(self.ctx, client_id, persistent, expiry,
                              connect.protocol_level, client_type)
            self.sessions[client_id] = session
            if persistent and address is not None:
                self._track_origin(client_id, address)
        else:
            # a resumed persistent session asked for expiry 0 stays stored
            # until this connection ends, then ends [MQTT-3.1.2-23]
            session = existing
            persistent = True
            session.expiry_interval = expiry
            session.client_type = client_type
        session.will = connect.will
        session.attach(conn)
        session.session_id = session_id or new_session_id()
        session.connected_at = now
        _identify(session, conn, connect)
        self.publish_info(session)
        return session, present

    @staticmethod
    def _application(connect, client_type: ClientType) -> bool:
        """Whether ``connect`` makes a persistent APPLICATION session (which
        keeps the client's ``tbmq.msg.app`` topic)."""
        return is_persistent(connect) and ClientType(client_type) is ClientType.APPLICATION

    def _app_topic_gone(self, info, keep_topic: bool = False) -> None:
        """The persistent APPLICATION session ``info`` (a
        :class:`~tbmq.cluster.records.SessionInfo`) that this node does not
        hold ended here: its topic goes (:meth:`ApplicationReader.remove
        <tbmq.cluster.sinks.ApplicationReader.remove>`)."""
        applications = self.ctx.applications
        if (not keep_topic and info.persistent and applications is not None
                and ClientType(info.client_type) is ClientType.APPLICATION):
            applications.remove(info.client_id)

    def _adopt(self, response, keep_topic: bool = False) -> Session | None:
        """The cluster knows a session of this client that another node held
        (or this node before a restart): resume it here when it is present,
        else clear what is left of it (its subscriptions, its stored
        deliveries, the topic of a persistent APPLICATION unless
        ``keep_topic``: the new session is one too)."""
        info = response.session
        client_id = info.client_id
        if not response.session_present:
            if self.book.of(client_id):
                self._put_subscriptions(client_id, {})
            if info.persistent:
                self.device_store.clear(client_id)
            self._app_topic_gone(info, keep_topic)
            return None
        return self._rebuilt(info)

    def _rebuilt(self, info) -> Session:
        """A persistent session of this node rebuilt from its registry record
        and its subscriptions (its deliveries stay in the stores)."""
        session = Session(self.ctx, info.client_id, persistent=True,
                          expiry_interval=info.session_expiry_interval,
                          protocol_level=info.protocol_level, client_type=info.client_type)
        session.subscriptions = self.book.of(info.client_id)
        session.address, session.username = info.address, info.username
        session.credentials_name = info.credentials_name
        self.sessions[info.client_id] = session
        return session

    # -- what other nodes decide ----------------------------------------------------

    def drop_local(self, client_id: str, session_id: str, reason_code: int) -> None:
        """A :class:`~tbmq.cluster.records.DisconnectCommand`: close this
        node's connection of that session (taken over elsewhere)."""
        session = self.sessions.get(client_id)
        if session is None or session.session_id != session_id or session.connection is None:
            return
        taken_over = reason_code == ReasonCode.SESSION_TAKEN_OVER
        self.log.info("session {client_id} closed for the cluster (0x{code:02X}: "
                      "{why})", client_id=client_id, code=reason_code,
                      why="taken over by another node" if taken_over else
                      "an administrator's request")
        session.connection.disconnect(reason_code)

    def forget_local(self, client_id: str, info) -> None:
        """The session of ``client_id`` is now held by a connection on
        another node: this node no longer owns its will or its expiry."""
        session = self.sessions.get(client_id)
        if session is None or session.session_id == info.session_id:
            return
        if session.connection is not None:
            session.connection.disconnect(ReasonCode.SESSION_TAKEN_OVER)
            return
        self._cancel_timers(session)
        session.will = None
        del self.sessions[client_id]
        self._forget_origin(client_id)

    def take_over(self, info) -> None:
        """The node that held ``info`` (a
        :class:`~tbmq.cluster.records.SessionInfo`) is gone: this node owns
        the session now (it was asked once, by the session events).

        A connection open there when the node died ended then: its will is
        due now, after its Will Delay Interval, or when the session ends,
        whichever is first [MQTT-3.1.3-9]; a delayed will the node had not
        yet published is due at the time it was due there.  A persistent
        session is kept here, offline, and expires ``expiry_interval`` after
        its disconnect; a non-persistent one ends now (its will published,
        its subscriptions removed).
        """
        now = self.clock.seconds()
        client_id = info.client_id
        if client_id in self.sessions:
            return
        disconnected_at = now if info.connected else (info.disconnected_at or now)
        if not info.persistent or info.session_expiry_interval == 0:
            if info.will is not None:
                self.publish_will(client_id, info.will)
            if self.book.of(client_id):
                self._put_subscriptions(client_id, {})
            self._remove_info(client_id)
            self._app_topic_gone(info)
            self.hooks.session_expired(client_id)
            return
        session = self._rebuilt(info)
        session.session_id = new_session_id()
        session.connected_at = info.connected_at
        session.disconnected_at = disconnected_at
        session.will = info.will
        if info.will is not None:
            delay = info.will.properties.get(Property.WILL_DELAY_INTERVAL, 0)
            session.will_timer = self.clock.callLater(
                max(0.0, disconnected_at + delay - now), self._will_due, session)
        self.publish_info(session)
        self._schedule_expiry(session, disconnected_at + session.expiry_interval - now)

    def clear_offline(self, info) -> None:
        """An administrator removes the offline session ``info`` (a
        :class:`~tbmq.cluster.records.SessionInfo`); this node decides for
        its client id (:meth:`tbmq.cluster.session_events.SessionEvents.clear_session`).
        Held here, it ends now; held by another node, it is taken here and
        ended (that node forgets it once the registry shows it moved): its
        subscriptions, stored messages and registry record are removed.
        """
        client_id = info.client_id
        session = self.sessions.get(client_id)
        if session is not None and session.connection is not None:
            return  # connected again meanwhile
        if session is None or session.session_id != info.session_id:
            if session is not None:
                self._cancel_timers(session)
            session = self._rebuilt(info)
            session.session_id = new_session_id()
            session.disconnected_at = self.clock.seconds()
            self.publish_info(session)  # the node that held it forgets it
            self.registry.remove(client_id)  # after the record above, on the same key
        self.log.info("session {client_id} removed by an administrator", client_id=client_id)
        self.end_session(session, expired=False)

    def restate(self, client_id: str, current, late) -> None:
        """A late record about ``client_id`` reached the registry (see
        :attr:`tbmq.cluster.registry.SessionRegistry.stale_listeners`): if
        this node holds the current session, publish it again."""
        session = self.sessions.get(client_id)
        if session is not None and session.session_id == current.session_id:
            self.publish_info(session)

    def _logged(self, result, what: str, client_id: str):
        """Log the failure of a record published without waiting for it (a
        bus stopped under it, at shutdown, is no error: the record last
        stored stands, and a restart reads the session as offline).

        :returns: ``result``, its failure handled.
        """
        if isinstance(result, defer.Deferred):
            def failed(failure):
                if failure.check(BusClosedError):
                    self.log.debug("{what} of {client_id} not recorded: the bus stopped",
                                   what=what, client_id=client_id)
                else:
                    self.log.warn("{what} of {client_id} not recorded: {error}", what=what,
                                  client_id=client_id, error=failure.getErrorMessage())

            result.addErrback(failed)
        return result

    def _report(self, what: str, client_id: str, failure) -> None:
        """The ``done`` of a record published without waiting for it: log
        its failure as :meth:`_logged` does (no Deferred per record)."""
        if failure is not None:
            self._logged(defer.fail(failure), what, client_id)

    def _put_subscriptions(self, client_id: str, subscriptions: dict):
        return self._logged(self.book.put(client_id, subscriptions), "the subscriptions",
                            client_id)

    def _remove_info(self, client_id: str):
        self.registry.remove(client_id, partial(self._report, "the end of the session",
                                                client_id))

    def publish_info(self, session: Session):
        """Tell the cluster where ``session`` is and what it is
        (``tbmq.client.session``).

        A failure of the record is logged, not passed on.
        """
        will = session.will
        self.registry.put(SessionInfo(
            session.client_id, self.service_id, session.session_id,
            session.connection is not None, session.persistent, session.client_type,
            session.expiry_interval, session.protocol_level, session.connected_at,
            session.disconnected_at, self.clock.seconds(),
            None if will is None else WillRecord(will.topic, will.payload, will.qos,
                                                 will.retain, dict(will.properties)),
            session.address, session.username, session.credentials_name),
            partial(self._report, "the session record", session.client_id))

    def save(self, session: Session):
        """Publish the subscriptions of ``session`` (``tbmq.client.subscriptions``).

        :returns: None or a Deferred that fires once the bus holds them and
            this node's trie has them
            (:meth:`tbmq.cluster.registry.SubscriptionBook.put`).
        """
        return self.book.put(session.client_id, session.subscriptions)

    # -- disconnect, will, expiry ------------------------------------------------

    def connection_lost(self, session: Session, conn, publish_will: bool) -> None:
        """The connection of ``session`` ended (DISCONNECT, error or loss).

        :param publish_will: True unless the client sent DISCONNECT
            NORMAL_DISCONNECTION [MQTT-3.14.4-3]; DISCONNECT_WITH_WILL_MESSAGE
            keeps the will (§3.14.2.1).
        """
        if session.connection is not conn:
            return  # already taken over
        now = self.clock.seconds()
        session.detach(now)
        self._will_on_close(session, publish_will)
        if not session.persistent or session.expiry_interval == 0:
            self.end_session(session, expired=False)
            return
        info = self.registry.get(session.client_id)
        if info is not None and info.session_id != session.session_id:
            self.forget_local(session.client_id, info)  # held elsewhere meanwhile
            return
        self.publish_info(session)
        self._schedule_expiry(session, session.expiry_interval)

    def _will_on_close(self, session: Session, publish: bool) -> None:
        will = session.will
        if will is None:
            return
        if not publish:
            session.will = None
            return
        delay = will.properties.get(Property.WILL_DELAY_INTERVAL, 0)
        if delay <= 0:
            session.will = None
            self.publish_will(session.client_id, will)
            return
        # published after the delay, or when the session ends first [MQTT-3.1.3-9]
        session.will_timer = self.clock.callLater(delay, self._will_due, session)

    def _will_due(self, session: Session) -> None:
        session.will_timer = None
        will, session.will = session.will, None
        if will is not None:
            self.publish_will(session.client_id, will)

    def publish_will(self, client_id: str, will) -> None:
        """Publish a will message through the pipeline like any PUBLISH."""
        now = self.clock.seconds()
        props = dict(will.properties)
        props.pop(Property.WILL_DELAY_INTERVAL, None)
        expiry = props.get(Property.MESSAGE_EXPIRY_INTERVAL)
        message = Message(will.topic, will.payload, will.qos, will.retain, props,
                          client_id, now, None if expiry is None else now + expiry)
        self.log.info("publishing will of {client_id} to {topic}",
                      client_id=client_id, topic=will.topic)
        self.hooks.message_published(None, message)

        def done(failure) -> None:
            if failure is not None:
                self.log.failure("will of {client_id} not published", failure,
                                 client_id=client_id)

        self.router.publish(message, done)

    def _schedule_expiry(self, session: Session, delay: float) -> None:
        if session.expiry_interval == EXPIRY_NEVER:
            return
        if session.expiry_timer is not None and session.expiry_timer.active():
            session.expiry_timer.cancel()
        session.expiry_timer = self.clock.callLater(
            max(0.0, delay), self._expire, session)

    def _expire(self, session: Session) -> None:
        """The session expiry interval of the offline ``session`` passed: it
        ends once the member deciding its client id knows it
        (:meth:`tbmq.cluster.session_events.SessionEvents.request_end`), so
        that a connect decided after it presents no session
        [MQTT-3.2.2-2]; a later connection the member granted keeps it
        (its record makes this node forget it; asked again after the
        connect timeout if none comes)."""
        session.expiry_timer = None
        if session.connection is None and self.sessions.get(session.client_id) is session:
            if self.events is None:
                self._expired(session, True)
            else:
                self.events.request_end(session.client_id, session.session_id,
                                        partial(self._expired, session))

    def _expired(self, session: Session, ends: bool) -> None:
        if session.connection is not None or self.sessions.get(session.client_id) is not session:
            return  # connected again, or forgotten, meanwhile
        if ends:
            self.log.info("session {client_id} expired", client_id=session.client_id)
            self.end_session(session, expired=True)
        else:
            self._schedule_expiry(session, self.events.timeout)

    def _cancel_timers(self, session: Session) -> None:
        for name in ("will_timer", "expiry_timer"):
            timer = getattr(session, name)
            if timer is not None and timer.active():
                timer.cancel()
            setattr(session, name, None)

    def end_session(self, session: Session, expired: bool, keep_topic: bool = False) -> None:
        """End ``session``: publish a delayed will now, drop its
        subscriptions, queued messages and stored state; the topic of a
        persistent APPLICATION session is deleted
        (:meth:`tbmq.cluster.sinks.ApplicationReader.remove`) unless
        ``keep_topic`` (a clean start of a persistent APPLICATION session
        replaces it)."""
        if session.will_timer is not None:
            if session.will_timer.active():
                session.will_timer.cancel()
            session.will_timer = None
            will, session.will = session.will, None
            if will is not None:
                self.publish_will(session.client_id, will)
        self._cancel_timers(session)
        had = bool(session.subscriptions)
        session.subscriptions.clear()
        if had:
            self._put_subscriptions(session.client_id, {})
        if session.reads_application_topics() and not keep_topic:
            self.ctx.applications.remove(session.client_id,
                                         self.ctx.applications.detach(session))
        session.discard()
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
            self._forget_origin(session.client_id)
        info = self.registry.get(session.client_id)
        if info is not None and info.session_id == session.session_id:
            self._remove_info(session.client_id)
        self.hooks.session_expired(session.client_id)

    # -- restart -----------------------------------------------------------------

    def restore(self) -> int:
        """After a start, once the registry and the subscriptions are
        replayed: the sessions this node held before are offline now.  A
        persistent one is rebuilt (its deliveries stay in the device store
        until the client connects) and expires ``expiry_interval`` after its
        last disconnect; a non-persistent one ended with the old process.
        A session no node holds (service id
        :data:`~tbmq.cluster.records.UNCLAIMED`: moved from an older
        embedded store) is adopted as one of this node's, and published
        again with this node's service id.

        :returns: how many persistent sessions were restored.
        """
        now = self.clock.seconds()
        restored = 0
        for info in list(self.registry.sessions.values()):
            adopted = info.service_id == UNCLAIMED
            mine = adopted or info.service_id == self.service_id
            if not mine or info.client_id in self.sessions:
                continue
            if not info.persistent:
                self._remove_info(info.client_id)
                if self.book.of(info.client_id):
                    self._put_subscriptions(info.client_id, {})
                continue
            session = self._rebuilt(info)
            session.session_id = info.session_id
            session.connected_at = info.connected_at
            session.disconnected_at = info.disconnected_at or now
            if info.connected or adopted:
                self.publish_info(session)
            remaining = session.disconnected_at + session.expiry_interval - now
            self._schedule_expiry(session, remaining)
            restored += 1
        return restored

    def subscribe(self, session: Session, topic_filter: str,
                  options: SubscriptionOptions) -> bool:
        """Add a subscription to ``session``; :meth:`save` publishes the
        subscriptions (and so updates every node's trie).

        :returns: True when it is new (for retain handling 1).
        """
        subscriptions = session.subscriptions
        is_new = topic_filter not in subscriptions
        if is_new and not subscriptions:  # the session's own dict from the first
            subscriptions = session.subscriptions = {}
        subscriptions[topic_filter] = options
        if session.connection is not None and session.reads_application_topics():
            self.ctx.applications.follow(session, topic_filter)
        return is_new

    def unsubscribe(self, session: Session, topic_filter: str) -> bool:
        """:returns: True when the subscription existed."""
        if session.subscriptions.pop(topic_filter, None) is None:
            return False
        if session.app_consumers:
            self.ctx.applications.unfollow(session, topic_filter)
        return True
