"""What plugins see of the broker: read-only views, never internal objects
(ARCHITECTURE §3, "Plugins get documented public views").

* :class:`SessionView` is the ``session`` argument of every hook that has
  one (:mod:`tbmq.hookspecs`); one view per session, made when the session
  is, so a hook on the message path allocates nothing.
* A message is a :class:`tbmq.model.Message`, a plain record plugins must
  not change; a client's CONNECT is the :class:`tbmq.mqtt.Connect` packet it
  sent; its credentials' answer is the :class:`tbmq.auth.AuthResult`.
"""

from __future__ import annotations

from types import MappingProxyType


class SessionView:
    """A read-only view of one client's session.

    :ivar client_id: the client identifier, ``str``.
    :ivar client_type: :class:`tbmq.model.ClientType` (DEVICE or APPLICATION).
    :ivar persistent: True when the session outlives its connection.
    :ivar expiry_interval: the session expiry interval, seconds.
    :ivar protocol_level: 3, 4 or 5.
    :ivar connected: True while a connection is bound.
    :ivar connected_at: seconds since the epoch of the last connect, or None.
    :ivar disconnected_at: seconds since the epoch of the last disconnect,
        or None while connected.
    :ivar subscriptions: topic filter → :class:`tbmq.model.SubscriptionOptions`
        (a read-only mapping).
    :ivar session_id: the id of the connection that holds (or last held) it.
    :ivar address: ``host:port`` (``[host]:port`` for IPv6) of the client's
        last connection, ``str``, or None.
    :ivar username: the user name it last authenticated with, or None.
    :ivar credentials_name: the name of the credentials record that last
        admitted it (:attr:`tbmq.auth.AuthResult.credentials_name`), or None.
    """

    __slots__ = ("_session",)

    def __init__(self, session) -> None:
        self._session = session

    client_id = property(lambda self: self._session.client_id)
    client_type = property(lambda self: self._session.client_type)
    persistent = property(lambda self: self._session.persistent)
    expiry_interval = property(lambda self: self._session.expiry_interval)
    protocol_level = property(lambda self: self._session.protocol_level)
    connected = property(lambda self: self._session.connection is not None)
    connected_at = property(lambda self: self._session.connected_at)
    disconnected_at = property(lambda self: self._session.disconnected_at)
    session_id = property(lambda self: self._session.session_id)
    address = property(lambda self: self._session.address)
    username = property(lambda self: self._session.username)
    credentials_name = property(lambda self: self._session.credentials_name)

    @property
    def subscriptions(self):
        return MappingProxyType(self._session.subscriptions)

    def __repr__(self) -> str:
        return f"<SessionView {self.client_id!r}>"
