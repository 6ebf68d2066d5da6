"""What every device message store shares
(:class:`~tbmq.interfaces.IDeviceMessageStore`): the checks of the paging
arguments of ``load`` and of the per-client limit."""

from __future__ import annotations

__all__ = ["check_limit", "check_page"]


def check_page(after_seq: int | None, limit: int | None) -> None:
    """Check the paging arguments of
    :meth:`tbmq.interfaces.IDeviceMessageStore.load`.

    :raises ValueError: for a negative ``limit``.
    :raises TypeError: for a ``limit`` or ``after_seq`` that is not an int.
    """
    for name, value in (("after_seq", after_seq), ("limit", limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an int or None, not {value!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")


def check_limit(max_messages_per_client: int | None) -> int | None:
    """:returns: ``max_messages_per_client`` when it is None or >= 1.
    :raises ValueError: otherwise."""
    if max_messages_per_client is not None and max_messages_per_client < 1:
        raise ValueError(
            f"max_messages_per_client must be >= 1 or None, not {max_messages_per_client}")
    return max_messages_per_client
