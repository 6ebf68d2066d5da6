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

__all__ = ["LEVELS", "OBSERVER", "set_log_level"]

#: the accepted ``node.log_level`` values
LEVELS = ("debug", "info", "warn", "error", "critical")

_PREDICATE = LogLevelFilterPredicate(defaultLogLevel=LogLevel.info)

#: the observer of every tbmq logger: the global publisher behind the level filter
OBSERVER = FilteringLogObserver(globalLogPublisher, [_PREDICATE])


def set_log_level(name: str) -> None:
    """Drop tbmq's log events below ``name``.

    :param name: one of :data:`LEVELS`.
    :raises ValueError: for another name.
    """
    if name not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {name!r}")
    _PREDICATE.setLogLevelForNamespace("", LogLevel.levelWithName(name))
