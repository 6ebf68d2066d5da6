"""Fixtures of the unit tests."""

import pytest
from twisted.logger import formatEvent, globalLogPublisher


@pytest.fixture
def log():
    """The text of the log events emitted during the test, one string each."""
    events: list[str] = []

    def observe(event):
        events.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    yield events
    globalLogPublisher.removeObserver(observe)
