"""Embedded storage backends: in-memory and SQLite (ARCHITECTURE §4).

* :mod:`tbmq.backends.memory` -- dict-backed stores; nothing survives a
  restart.  For tests and for ``storage.backend: memory``.
* :mod:`tbmq.backends.sqlite_runner` -- one SQLite file used from one
  dedicated thread (a queue of operations, one transaction per batch),
  shared by every SQLite store kept in that file.
* :mod:`tbmq.backends.sqlite` (with :mod:`tbmq.backends.sqlite_deliveries`
  and :mod:`tbmq.backends.sqlite_schema`) -- the session, retained and
  device stores of the embedded default, one file.
* :mod:`tbmq.backends.sqlite_credentials` -- the credential store, a file of
  its own that ``tbmq credentials`` may change while the broker runs.

Each store provides one interface of :mod:`tbmq.interfaces`
(:class:`~tbmq.interfaces.ISessionStore`,
:class:`~tbmq.interfaces.IRetainedStore`,
:class:`~tbmq.interfaces.IDeviceMessageStore`,
:class:`~tbmq.interfaces.ICredentialStore`).
"""
