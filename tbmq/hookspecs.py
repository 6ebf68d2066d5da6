"""The pluggy hook specifications of tbmq.

Three kinds of hooks (ARCHITECTURE §3):

* **factory** hooks (``firstresult=True``) return the provider of a backend
  interface of :mod:`tbmq.interfaces`, or None to let another plugin answer;
* **decision** hooks return an answer or None to pass to the next plugin;
  when every plugin passes, the answer is no (as Mosquitto's DEFER);
* **notification** hooks return nothing; they are called in the reactor
  thread and must not block.

Any hook may return a :class:`twisted.internet.defer.Deferred`; the caller
wraps each call with ``maybeDeferred``.  Notification hooks on the message
path are only called when some plugin implements them.
"""

from __future__ import annotations

import pluggy

PROJECT = "tbmq"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- configuration ---------------------------------------------------------------

@hookspec(historic=True)
def tbmq_configure(config):
    """Configure the plugin, once: a historic hook, so a plugin registered
    after the plugin manager was built (at run time) is configured when it
    is registered.

    :param config: the whole :class:`tbmq.config.Config`; a plugin's own
        settings are ``config.plugins.get(<name>, {})`` (a read-only
        mapping), ``<name>`` being the name it is registered under (its
        entry-point name).
    """


# -- factories -----------------------------------------------------------------

@hookspec(firstresult=True)
def tbmq_message_bus(config, clock):
    """Build the message bus when ``config.bus`` names this plugin's bus.

    :param config: the :class:`tbmq.config.Config`.
    :param clock: the node's reactor (``IReactorTime``, and
        ``callFromThread`` on a real reactor).
    :returns: an :class:`tbmq.interfaces.IMessageBus` provider, or None.
    """


@hookspec(firstresult=True)
def tbmq_retained_store(config):
    """Build the retained-message store when ``config.storage.backend`` names it.

    :returns: an :class:`tbmq.interfaces.IRetainedStore` provider, or None.
    """


@hookspec(firstresult=True)
def tbmq_device_message_store(config):
    """Build the store of persistent sessions' queued messages when
    ``config.storage.backend`` names it.

    :returns: an :class:`tbmq.interfaces.IDeviceMessageStore` provider, or None.
    """


@hookspec(firstresult=True)
def tbmq_credential_store(config, reactor):
    """Build the credential store when ``config.auth.credentials`` names it.

    :param config: the :class:`tbmq.config.Config`.
    :param reactor: the reactor the store's results are delivered on, or
        None for the global one (the broker passes None; ``tbmq
        credentials`` passes the reactor it runs on).  An implementation
        that has no use for it need not declare it.

    :returns: an :class:`tbmq.interfaces.ICredentialStore` provider, or None.
    """


@hookspec(firstresult=True)
def tbmq_integration_target(config, node_config, reactor):
    """Build the target of an integration whose ``type`` this plugin
    provides (``http`` and ``mqtt`` are built in; the ``kafka`` plugin
    provides ``kafka``).

    :param config: the integration's
        :class:`tbmq.integrations.settings.IntegrationConfig`.
    :param node_config: the node's :class:`tbmq.config.Config`.
    :param reactor: the reactor.
    :returns: a :class:`tbmq.integrations.core.Target`, or None.
    """


# -- decisions -----------------------------------------------------------------

@hookspec
def tbmq_authenticate(request):
    """Decide whether a client may connect (or re-authenticate).

    Called for each CONNECT after it is validated, before the session is
    looked up; and for MQTT 5 enhanced authentication, again for each AUTH
    packet of the exchange — then only the plugin that answered "continue"
    is asked.  Plugins are asked in the order of ``auth.providers`` (by
    plugin name), then the others, the built-in ``anonymous`` last.

    :param request: an :class:`tbmq.auth.AuthRequest` (client id, username,
        password, certificate chain, authentication method and data, a
        ``state`` dict kept across one exchange, the credential store).
    :returns: an :class:`tbmq.auth.AuthResult` (allowed, refused, or
        ``continue_auth`` with data for an AUTH CONTINUE_AUTHENTICATION), or
        None to pass to the next plugin.  When every plugin passes the client
        is refused with NOT_AUTHORIZED (0x87; v3: 5), or
        BAD_AUTHENTICATION_METHOD (0x8C) when it asked for an authentication
        method nobody handled.
    """


@hookspec
def tbmq_authentication_scope(config):
    """Which authentications this plugin's :func:`tbmq_authenticate` can
    answer with ``config``, so that the node asks it only those.

    Asked of each plugin that implements :func:`tbmq_authenticate`, once
    when the node builds its hooks (and again when the plugin set changes),
    never per CONNECT.  A plugin that does not implement it is asked every
    time, as before.  A request outside the scope passes the plugin as if
    it had returned None.

    :param config: the node's :class:`tbmq.config.Config`.
    :returns: an :class:`tbmq.auth.AuthScope` (whether it answers a CONNECT
        without an Authentication Method, and only one carrying a password,
        a user name or a certificate chain; which Authentication Methods it
        answers), or None for every request.
    """


@hookspec(firstresult=True)
def tbmq_authorize_publish(session, auth, topic):
    """May ``session`` publish to topic name ``topic``?

    Asked through pluggy with ``firstresult``: the first answer that is not
    None wins (``tryfirst``/``trylast`` order the plugins; the built-in
    rules answer last).  A Deferred is an answer: it must fire with True or
    False.

    Called for every PUBLISH (and a will message at CONNECT).

    :param session: the :class:`tbmq.views.SessionView` of the session.
    :param auth: the :class:`tbmq.auth.AuthResult` of its connection (its
        ``rules`` are the credentials' authorization rules, kept current).
    :returns: True, False, or None to pass; all pass → denied (v5 PUBACK /
        PUBREC NOT_AUTHORIZED, the message dropped).
    """


@hookspec(firstresult=True)
def tbmq_authorize_subscribe(session, auth, topic_filter):
    """May ``session`` subscribe to ``topic_filter`` (``$share/g/`` removed)?

    Asked like :func:`tbmq_authorize_publish`.

    :returns: True, False, or None to pass; all pass → denied (SUBACK
        NOT_AUTHORIZED in v5, FAILURE 0x80 in v3).
    """


# -- notifications ---------------------------------------------------------------

@hookspec
def tbmq_broker_started(broker):
    """The broker has loaded its state and listens.

    :param broker: the node's :class:`tbmq.node_view.NodeView` (not the
        ``Broker``, whose internals are no plugin's business): its service
        id, config and clock, its sessions as
        :class:`~tbmq.views.SessionView`, the cluster's session registry and
        subscriptions, the retained messages, its counters, the live nodes,
        the credential store, the bus, and the operations a plugin may ask
        (:meth:`~tbmq.node_view.NodeView.register_plugin`,
        ``disconnect_client``, ``clear_session``).  The same object for every
        hook call of one node (compare with ``is``).
    """


@hookspec
def tbmq_broker_stopping(broker):
    """The broker is about to close its listeners and backends.

    :param broker: the node's :class:`tbmq.node_view.NodeView`, the object
        :func:`tbmq_broker_started` got.
    """


@hookspec
def tbmq_client_connected(session, connect, address):
    """A CONNECT was accepted; CONNACK is on its way."""


@hookspec
def tbmq_client_disconnected(session, reason_code, will):
    """A connection ended.

    :param reason_code: the DISCONNECT reason code received or sent, or None
        when the connection was lost without one.
    :param will: True when the will message is to be published.
    """


@hookspec
def tbmq_authentication_failed(connect, address, reason_code):
    """A CONNECT was refused by authentication.

    :param connect: the :class:`tbmq.mqtt.Connect` (client id, username).
    :param address: the peer's ``IAddress``.
    :param reason_code: the v5 CONNACK reason code sent (v3 clients got the
        matching v3 return code).
    """


@hookspec
def tbmq_client_subscribed(session, topic_filter, options, reason_code):
    """A SUBSCRIBE filter was handled.

    :param topic_filter: the filter as sent (``$share/g/f`` kept whole).
    :param options: the granted :class:`tbmq.model.SubscriptionOptions`, or
        None when refused.
    :param reason_code: the SUBACK reason code for this filter.
    """


@hookspec
def tbmq_client_unsubscribed(session, topic_filter, reason_code):
    """An UNSUBSCRIBE filter was handled (reason code SUCCESS or
    NO_SUBSCRIPTION_EXISTED)."""


@hookspec
def tbmq_message_published(session, message):
    """A PUBLISH (or a will message, ``session`` None) entered the pipeline."""


@hookspec
def tbmq_message_delivered(session, message, qos):
    """A message reached ``session``: a QoS 0 PUBLISH was written to its
    connection, or a QoS 1/2 delivery was acknowledged (PUBACK / PUBCOMP).

    :param message: the :class:`tbmq.model.Message` (``received_at`` gives
        the latency).
    :param qos: the QoS of this delivery.
    """


@hookspec
def tbmq_message_dropped(session, message, reason):
    """A message was not delivered to ``session``.

    :param reason: ``expired``, ``offline_qos0``, ``slow_consumer``,
        ``quota_exceeded``, ``too_large_for_client`` (what each means:
        :data:`tbmq.broker.hooks.DROP_REASONS`) or ``session_ended`` (held
        by a session that ended; not in the node's drop counts).
    """


@hookspec
def tbmq_session_expired(client_id):
    """A session ended: its expiry interval passed, or a clean start replaced it."""
