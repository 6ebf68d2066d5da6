from tests.postgres import postgres_dsn, reactor_thread  # noqa: F401
