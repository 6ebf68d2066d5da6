"""The contracts between the broker and its backends (zope.interface).

A backend is a plugin that provides one of these interfaces; the choice is
config (see :mod:`tbmq.hookspecs`).  The interfaces speak of topics, keys,
bytes and client ids, and of the records of :mod:`tbmq.model`, never of a
Kafka, Redis or SQL type.  Methods that touch storage return a
:class:`twisted.internet.defer.Deferred`; a backend must apply the calls it
receives for one client id in the order it received them (ARCHITECTURE §3,
per-session order).
"""

from __future__ import annotations

from zope.interface import Attribute, Interface


class IBackend(Interface):
    """Anything with a life cycle bound to the broker's service."""

    def start():
        """Open connections, create schema.

        :returns: a Deferred that fires when the backend is usable.
        """

    def stop():
        """Flush what is buffered and close.

        :returns: a Deferred that fires when everything accepted so far is
            durable and the backend is closed.
        """


class IMessageBus(IBackend):
    """The bus that carries TBMQ's topics (``tbmq.msg.all``, the downlinks,
    the session topics): in-process in the embedded default, Kafka in a
    cluster.  Values are opaque to the bus."""

    durable = Attribute(
        "bool: True when a fired publish Deferred means the value survives a "
        "crash of this node (Kafka acks); False for the in-process bus, where "
        "durability is the consumers' business (the local store)."
    )

    def publish(topic, key, value):
        """Append ``value`` to ``topic``, partitioned by ``key``.

        :param topic: the bus topic name, ``str`` (prefix already applied).
        :param key: the partition key, ``str`` (a topic name or client id).
        :param value: the record; bytes for a remote bus, any object for the
            in-process bus.
        :returns: None when the value is already accepted (and, for the
            in-process bus, every consumer has handled it synchronously), or a
            Deferred that fires when it is accepted and, for the in-process
            bus, when every consumer's returned Deferred has fired.
        """

    def subscribe(topic, group, handler):
        """Consume ``topic`` as a member of consumer group ``group``.

        :param handler: ``handler(key, value) -> Deferred | None``; called in
            the reactor thread, in partition order.  A returned Deferred
            delays the acknowledgement (the commit of the offset) until it
            fires.
        """


class ISessionStore(IBackend):
    """Persistent sessions and their subscriptions (``tbmq.client.session``
    and ``tbmq.client.subscriptions`` in TBMQ)."""

    def load_all():
        """:returns: Deferred firing with ``list[SessionRecord]``, each with
        its subscriptions."""

    def save(record):
        """Insert or replace the session ``record`` (a
        :class:`tbmq.model.SessionRecord`) and replace all its subscriptions.

        :returns: Deferred firing with None when durable.
        """

    def delete(client_id):
        """Remove the session and its subscriptions.

        :returns: Deferred firing with None when durable.
        """


class IRetainedStore(IBackend):
    """Retained messages, one per topic name [MQTT-3.3.1-5]."""

    def load_all():
        """:returns: Deferred firing with ``list[Message]``."""

    def put(message):
        """Store ``message`` (a :class:`tbmq.model.Message`) as the retained
        message of ``message.topic``, replacing the previous one.

        :returns: Deferred firing with None when durable.
        """

    def remove(topic):
        """Remove the retained message of topic name ``topic``, if any
        [MQTT-3.3.1-6].

        :returns: Deferred firing with None when durable.
        """


class IDeviceMessageStore(IBackend):
    """Messages queued for, or in flight to, persistent sessions (TBMQ's
    device persisted messages: Redis, PostgreSQL, or SQLite embedded)."""

    def add(client_id, deliveries):
        """Append ``deliveries`` (``list[StoredDelivery]``, increasing
        ``seq``) to the queue of ``client_id``.

        :returns: Deferred firing with None when durable.
        """

    def update(client_id, seq, packet_id, state):
        """Record that delivery ``seq`` was sent with ``packet_id`` (int) and
        is now in ``state`` (:class:`tbmq.model.DeliveryState`).

        :returns: Deferred firing with None when durable.
        """

    def remove(client_id, seqs):
        """Remove the deliveries ``seqs`` (an iterable of int) of ``client_id``.

        :returns: Deferred firing with None when durable.
        """

    def load(client_id):
        """:returns: Deferred firing with the ``list[StoredDelivery]`` of
        ``client_id`` in ``seq`` order."""

    def clear(client_id):
        """Remove every delivery of ``client_id``.

        :returns: Deferred firing with None when durable.
        """


class ICredentialStore(IBackend):
    """Client credentials (TBMQ's ``mqtt_client_credentials``): SQLite
    embedded, PostgreSQL in a cluster.  Records are
    :class:`tbmq.model.Credentials`."""

    def find(credentials_type, credentials_id):
        """:returns: Deferred firing with the :class:`Credentials` of that
        type and lookup key, or None."""

    def find_all(credentials_type):
        """:returns: Deferred firing with every ``Credentials`` of that type
        (X.509 CN regexes are matched by scanning them)."""

    def get(id):
        """:returns: Deferred firing with the ``Credentials`` of that id, or None."""

    def list():
        """:returns: Deferred firing with every ``Credentials``, by name."""

    def save(credentials):
        """Insert or replace by ``id``; sets ``updated_time`` (and
        ``created_time`` when new).

        :returns: Deferred firing with the saved ``Credentials``.
        :raises tbmq.errors.CredentialsError: (in the Deferred) when the name
            or the (type, credentials id) pair belongs to another record.
        """

    def delete(id):
        """:returns: Deferred firing with True when a record was removed."""

    def changed_since(version):
        """What changed after ``version`` (an opaque int; 0 at first).

        :returns: Deferred firing with ``(changed, deleted_ids, new_version)``
            where ``changed`` is a list of ``Credentials`` saved since.
        """
