from tests.postgres import postgres_dsn  # noqa: F401
