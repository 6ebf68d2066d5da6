"""The log level of tbmq's own log events.

Every tbmq logger is ``Logger(observer=OBSERVER)``: its events pass a
:class:`twisted.logger.LogLevelFilterPredicate` before they reach the
process's observers (``twistd``'s log file), so events below the level
cost no formatting and no I/O.  ``twistd tbmq`` sets the level from
``node.log_level``; elsewhere (tests, embedding) it stays ``info``.
"""

from __future__ import annotations

from twisted.logger import (
    FilteringLogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    globalLogPublisher,
)

__all__ = ["LEVELS", "LogThrottle", "OBSERVER", "debug_enabled", "set_log_level"]

#: the accepted ``node.log_level`` values
LEVELS = ("debug", "info", "warn", "error", "critical")

_PREDICATE = LogLevelFilterPredicate(defaultLogLevel=LogLevel.info)

#: the observer of every tbmq logger: the global publisher behind the level filter
OBSERVER = FilteringLogObserver(globalLogPublisher, [_PREDICATE])


_debug = False  # whether the level is debug (set_log_level)


def debug_enabled() -> bool:
    """:returns: True when tbmq's debug events are written: a line logged
    once per CONNECT or per message is then worth building, else skipped
    (an event built and filtered costs several microseconds)."""
    return _debug


def set_log_level(name: str) -> None:
    """Drop tbmq's log events below ``name``.

    :param name: one of :data:`LEVELS`.
    :raises ValueError: for another name.
    """
    if name not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {name!r}")
    global _debug
    _PREDICATE.setLogLevelForNamespace("", LogLevel.levelWithName(name))
    _debug = name == "debug"


class LogThrottle:
    """At most ``burst`` log lines per ``interval`` seconds for one kind of
    event that a flood may repeat (connections closed before CONNECT,
    logins refused); the lines beyond are counted and reported in one line
    when the interval ends.

    :param clock: ``IReactorTime`` (``seconds``, ``callLater``).
    :param logger: the :class:`twisted.logger.Logger` to write with.
    :param interval: seconds, > 0.
    :param burst: lines written per interval, >= 1.
    :param what: what the lines are about, for the count.
    :ivar suppressed: lines not written since the start.
    """

    def __init__(self, clock, logger, what: str, interval: float = 10.0,
                 burst: int = 20) -> None:
        self.what = what
        self.clock = clock
        self.logger = logger
        self.interval = interval
        self.burst = burst
        self.suppressed = 0
        self._started = None
        self._written = 0
        self._held = 0
        self._report = None

    def info(self, fmt: str, **kwargs) -> None:
        """``logger.info(fmt, **kwargs)``, unless this interval's burst is
        spent."""
        now = self.clock.seconds()
        if self._started is None or now - self._started >= self.interval:
            self._started = now
            self._written = 0
        if self._written < self.burst:
            self._written += 1
            self.logger.info(fmt, **kwargs)
            return
        self._held += 1
        self.suppressed += 1
        if self._report is None:
            self._report = self.clock.callLater(
                max(0.0, self._started + self.interval - now), self._flush)

    def _flush(self) -> None:
        self._report = None
        held, self._held = self._held, 0
        if held:
            self.logger.info("{count} more lines about {what} not written in the last "
                             "{interval:g} s", count=held, what=self.what,
                             interval=self.interval)
