"""Fixtures of the fault suite: the end-to-end suite's (a real ``twistd -n
tbmq`` per test, its log printed when a test fails, a broker that died
failing the test)."""

from tests.integration.conftest import (  # noqa: F401
    _broker_watch,
    broker_factory,
    pytest_runtest_makereport,
)
