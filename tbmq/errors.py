"""The exception types of tbmq (ARCHITECTURE §5: ``tbmq.errors`` holds them).

Every exception raised on purpose by tbmq derives from :class:`TbmqError`, so
a caller can tell tbmq's decisions from programming errors.
"""

from __future__ import annotations


class TbmqError(Exception):
    """The base of every exception tbmq raises on purpose."""


class ConfigError(TbmqError):
    """The configuration is invalid.

    The message starts with the key path of the offending setting, e.g.
    ``listeners[1].endpoint: expected a string``.

    :ivar key: the key path (``str``), or None when the error is not about
        one key (an unreadable file, for instance).
    """

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class StartupError(TbmqError):
    """The node could not start although its configuration reads well: a
    listener could not listen (address already in use, permission denied).
    The message is one line naming the cause and the setting,
    ``cannot listen on tcp:1883: address already in use
    (listeners[0].endpoint)``."""


class BackendError(TbmqError):
    """A storage or bus backend cannot serve a call (not started, stopping,
    closed)."""


class CredentialsError(TbmqError):
    """Client credentials or their authorization rules are invalid, or
    conflict with stored ones (a name or a (type, credentials id) pair that
    belongs to another record, TBMQ's unique constraints on
    ``mqtt_client_credentials``)."""


class BusError(BackendError):
    """A message-bus call failed (the base of the typed publish failures of
    :meth:`tbmq.interfaces.IMessageBus.publish`)."""


class BusClosedError(BusError):
    """The bus is not started, or is stopping or stopped."""


class RecordEncodingError(BusError):
    """A record value does not fit its topic's codec, or bytes read from the
    bus are not a record of the expected type and version."""


class ConsumerFailedError(BusError):
    """In-process bus: a consumer's handler failed on the record, which is
    left uncommitted for that consumer group.

    :ivar group: the consumer group whose handler failed.
    """

    def __init__(self, message: str, group: str | None = None) -> None:
        super().__init__(message)
        self.group = group


class BusPublishError(BusError):
    """The bus refused a record or did not acknowledge it in time."""


class ProtocolViolation(TbmqError):
    """A packet broke a rule of the MQTT specification: the connection ends
    with ``reason_code`` (DISCONNECT in v5, a close in v3).

    :ivar reason_code: the MQTT 5 reason code, ``int``.
    """

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code
