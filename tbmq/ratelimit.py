"""Token buckets for TBMQ's rate limits (``mqtt.rate_limits``).

A limit is a list of ``limit:seconds`` pairs (TBMQ's format, bucket4j's
bandwidths): ``10:1,300:60`` allows at most 10 messages in any second and
300 in any minute, every pair at once.  Each pair is a token bucket of
``limit`` tokens refilled continuously at ``limit / seconds`` tokens per
second, full at the start; a message takes one token from every bucket, and
is refused (taking nothing) when one of them has less than one.

The code is the simplest correct one rather than a library's
(``pyrate-limiter``, ``limits``, ``token-bucket`` keep a lock, a storage
object or a list of timestamps per key): a bucket is one small object per
client with ``__slots__``, made only when its limit is enabled.
"""

from __future__ import annotations

__all__ = ["parse_limits", "Bands", "TokenBucket"]


def parse_limits(text: str) -> tuple[tuple[int, float], ...]:
    """Parse ``limit:seconds`` pairs.

    :param text: comma separated pairs, e.g. ``"10:1,300:60"``; spaces
        around the numbers are allowed.
    :returns: ``((limit, seconds), ...)``: ``limit`` an int >= 1,
        ``seconds`` a number > 0.
    :raises ValueError: for empty text, a pair that is not two numbers, a
        limit < 1 or not whole, or seconds <= 0.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("expected limit:seconds pairs, e.g. 10:1,300:60")
    pairs = []
    for part in text.split(","):
        fields = part.split(":")
        if len(fields) != 2:
            raise ValueError(f"{part.strip()!r} is not a limit:seconds pair")
        try:
            limit = int(fields[0])
            seconds = float(fields[1])
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not a limit:seconds pair of numbers") from None
        if limit < 1:
            raise ValueError(f"{part.strip()!r}: the limit must be >= 1")
        if not seconds > 0 or seconds == float("inf"):
            raise ValueError(f"{part.strip()!r}: the seconds must be > 0")
        pairs.append((limit, seconds))
    return tuple(pairs)


class Bands:
    """The buckets' sizes and refill rates of one limit, shared by all the
    :class:`TokenBucket` s of that limit.

    :param pairs: ``((limit, seconds), ...)`` as :func:`parse_limits` gives.
    :param share: the fraction of each limit this node enforces, in
        ``(0, 1]`` (a cluster limit split among its nodes); a bucket never
        holds less than one token.
    :ivar capacity: tokens of each bucket when full.
    :ivar rate: tokens per second added to each bucket.
    """

    __slots__ = ("pairs", "capacity", "rate", "single", "capacity0", "rate0")

    def __init__(self, pairs: tuple[tuple[int, float], ...], share: float = 1.0) -> None:
        self.pairs = pairs
        self.capacity = tuple(max(1.0, limit * share) for limit, _ in pairs)
        self.rate = tuple(max(1.0, limit * share) / seconds for limit, seconds in pairs)
        #: one pair (the usual case): :meth:`TokenBucket.take` takes a shorter way
        self.single = len(pairs) == 1
        self.capacity0 = self.capacity[0]
        self.rate0 = self.rate[0]


class TokenBucket:
    """One client's (or one node's) buckets of a limit.

    :param bands: the :class:`Bands` of the limit.
    :param now: seconds of a monotonic clock; the buckets start full.
    """

    __slots__ = ("bands", "tokens", "stamp")

    def __init__(self, bands: Bands, now: float) -> None:
        self.bands = bands
        self.tokens = list(bands.capacity)
        self.stamp = now

    def take(self, now: float, count: int = 1) -> bool:
        """Take ``count`` tokens from every bucket if each has them.

        :param now: seconds of the clock given at construction.
        :returns: True when taken; False when one bucket has fewer (nothing
            is taken then).
        """
        bands = self.bands
        tokens = self.tokens
        elapsed = now - self.stamp
        self.stamp = now
        if bands.single:
            level = tokens[0]
            if elapsed > 0:
                level += elapsed * bands.rate0
                if level > bands.capacity0:
                    level = bands.capacity0
            if level < count:
                tokens[0] = level
                return False
            tokens[0] = level - count
            return True
        allowed = True
        for i, capacity in enumerate(bands.capacity):
            level = tokens[i]
            if elapsed > 0:
                level += elapsed * bands.rate[i]
                if level > capacity:
                    level = capacity
                tokens[i] = level
            if level < count:
                allowed = False
        if allowed:
            for i in range(len(tokens)):
                tokens[i] -= count
        return allowed

    def rebase(self, bands: Bands) -> None:
        """Use ``bands`` from now on (a new share of a cluster limit): each
        bucket keeps its fill ratio."""
        old = self.bands
        self.tokens = [level * new / cap for level, new, cap in
                       zip(self.tokens, bands.capacity, old.capacity)]
        self.bands = bands
