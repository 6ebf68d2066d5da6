"""Embedded storage backends: in-memory and SQLite (ARCHITECTURE §4).

* :mod:`tbmq.backends.memory` -- dict-backed stores; nothing survives a
  restart.  For tests and for ``storage.backend: memory``.
* :mod:`tbmq.backends.sqlite` -- one SQLite file, used from one dedicated
  thread; the embedded default.

Each store provides one interface of :mod:`tbmq.interfaces`
(:class:`~tbmq.interfaces.ISessionStore`,
:class:`~tbmq.interfaces.IRetainedStore`,
:class:`~tbmq.interfaces.IDeviceMessageStore`).
"""
