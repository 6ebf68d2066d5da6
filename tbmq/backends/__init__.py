"""Embedded storage backends: in-memory and SQLite (ARCHITECTURE §4).

* :mod:`tbmq.backends.memory` -- dict-backed stores; nothing survives a
  restart.  For tests and for ``storage.backend: memory``.
* :mod:`tbmq.backends.sqlite_runner` -- one SQLite file used from one
  dedicated thread (a queue of operations, one transaction per batch),
  shared by every SQLite store kept in that file;
  :mod:`tbmq.backends.sqlite_view` the stores' side of it.
* :mod:`tbmq.backends.sqlite` (with :mod:`tbmq.backends.sqlite_deliveries`
  and :mod:`tbmq.backends.sqlite_schema`) -- the retained and device
  stores of the embedded default, one file.
* :mod:`tbmq.backends.sqlite_topic_log` -- the topic log of the in-process
  bus (the sessions and subscriptions among its topics), in the file of the
  embedded stores; :mod:`tbmq.backends.sqlite_session_migration` moves the
  sessions an older tbmq kept in tables of their own there.
* :mod:`tbmq.backends.sqlite_credentials` -- the credential store, a file of
  its own that ``tbmq credentials`` may change while the broker runs.
* :mod:`tbmq.backends.credential_rows`, :mod:`tbmq.backends.deliveries`,
  :mod:`tbmq.backends.topic_records` -- what the stores of one interface
  share, whatever their backend (the PostgreSQL plugin included).

Each store provides one interface of :mod:`tbmq.interfaces`
(:class:`~tbmq.interfaces.IRetainedStore`,
:class:`~tbmq.interfaces.IDeviceMessageStore`,
:class:`~tbmq.interfaces.ICredentialStore`,
:class:`~tbmq.interfaces.ITopicLog`).
"""
