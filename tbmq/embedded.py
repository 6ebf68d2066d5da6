"""The built-in plugins of the embedded default: the in-process bus, the
SQLite (or memory) stores in the data directory, and anonymous access."""

from __future__ import annotations

import os

from tbmq.auth import AuthResult
from tbmq.hookspecs import hookimpl


class EmbeddedBackends:
    """Provides ``bus: memory`` and ``storage.backend: sqlite | memory``."""

    @hookimpl(trylast=True)
    def tbmq_message_bus(self, config):
        if config.bus != "memory":
            return None
        from tbmq.backends.inprocess_bus import InProcessBus
        return InProcessBus()

    @hookimpl(trylast=True)
    def tbmq_stores(self, config):
        backend = config.storage.backend
        if backend == "memory":
            from tbmq.backends import memory
            return (memory.MemorySessionStore(), memory.MemoryRetainedStore(),
                    memory.MemoryDeviceMessageStore())
        if backend == "sqlite":
            from tbmq.backends.sqlite import SQLiteStore
            os.makedirs(config.data_dir, exist_ok=True)
            store = SQLiteStore(os.path.join(config.data_dir, "tbmq.sqlite3"),
                                synchronous=config.storage.sqlite_synchronous)
            return store.sessions, store.retained, store.deliveries
        return None


class AnonymousAuth:
    """Accepts every client as a DEVICE when ``auth.allow_anonymous`` is set;
    otherwise passes, so that a client no provider accepts is refused."""

    def __init__(self, allow: bool) -> None:
        self.allow = allow

    @hookimpl(trylast=True)
    def tbmq_authenticate(self, connect, address, listener):
        if self.allow:
            return AuthResult(True, provider="anonymous")
        return None


def builtin_plugins(config):
    """:returns: ``[(name, plugin), ...]`` of the built-in plugins."""
    return [
        ("embedded", EmbeddedBackends()),
        ("anonymous", AnonymousAuth(config.auth.allow_anonymous)),
    ]
