"""Topic Names, Topic Filters and Shared Subscriptions (sections 4.7, 4.8).

Validation raises :class:`TopicError`; :func:`topic_matches` is the naive
reference matcher the subscription trie is tested against.
"""

from __future__ import annotations

__all__ = [
    "TopicError",
    "TooManyLevels",
    "SHARED_PREFIX",
    "check_levels",
    "validate_topic_name",
    "validate_topic_filter",
    "parse_shared_subscription",
    "topic_matches",
]

#: The prefix of a Shared Subscription's Topic Filter (section 4.8.2).
SHARED_PREFIX = "$share/"

_MAX_LENGTH = 65535


class TopicError(ValueError):
    """A Topic Name or Topic Filter that is not valid."""


class TooManyLevels(TopicError):
    """A well-formed Topic Name or Topic Filter with more levels than the
    server accepts (a limit of the server, not a rule of MQTT: v5 answers
    0x90 Topic Name invalid / 0x8F Topic Filter invalid)."""


def check_levels(value: str, max_levels: int | None, what: str = "topic filter") -> None:
    """Check the number of levels of a Topic Name or Filter (a filter of a
    shared subscription without its ``$share/<group>/``).

    :param max_levels: the most levels accepted, or None for no limit.
    :raises TooManyLevels: for more than ``max_levels`` levels.
    """
    if max_levels is not None and value.count("/") >= max_levels:
        raise TooManyLevels(f"{what} has {value.count('/') + 1} levels, "
                            f"more than the {max_levels} accepted")


def _check_string(value: str, what: str) -> None:
    if not value:
        raise TopicError(f"{what} must be at least one character long [MQTT-4.7.3-1]")
    if "\x00" in value:
        raise TopicError(f"{what} must not contain U+0000 [MQTT-4.7.3-2]")
    # Each character is at most 4 bytes in UTF-8; only encode when it matters.
    if len(value) * 4 > _MAX_LENGTH and len(value.encode("utf-8", "surrogatepass")) > _MAX_LENGTH:
        raise TopicError(f"{what} longer than 65535 bytes [MQTT-4.7.3-3]")


def validate_topic_name(name: str, max_levels: int | None = None) -> None:
    """Check a Topic Name, as in PUBLISH or a Will Topic.

    :param name: the Topic Name.
    :param max_levels: the most levels accepted, or None for no limit.
    :raises TopicError: empty [MQTT-4.7.3-1], containing U+0000
        [MQTT-4.7.3-2], longer than 65,535 bytes [MQTT-4.7.3-3], or containing
        a wildcard character ``+`` or ``#`` (5.0 [MQTT-4.7.0-1], 3.1.1
        [MQTT-4.7.1-1]).
    :raises TooManyLevels: valid, but more than ``max_levels`` levels.
    """
    _check_string(name, "topic name")
    if "+" in name or "#" in name:
        raise TopicError("wildcards are not allowed in a topic name [MQTT-4.7.0-1]")
    check_levels(name, max_levels, "topic name")


def validate_topic_filter(topic_filter: str) -> None:
    """Check a Topic Filter, as in SUBSCRIBE or UNSUBSCRIBE.

    A Shared Subscription filter is syntactically an ordinary filter; use
    :func:`parse_shared_subscription` for its extra rules.

    :param topic_filter: the Topic Filter.
    :raises TopicError: empty [MQTT-4.7.3-1], containing U+0000
        [MQTT-4.7.3-2], longer than 65,535 bytes [MQTT-4.7.3-3], ``#`` not
        alone in the last level [MQTT-4.7.1-1] (3.1.1 [MQTT-4.7.1-2]), or
        ``+`` not alone in its level [MQTT-4.7.1-2] (3.1.1 [MQTT-4.7.1-3]).
    """
    _check_string(topic_filter, "topic filter")
    if "#" in topic_filter:
        if not (topic_filter == "#" or topic_filter.endswith("/#")) or topic_filter.count("#") != 1:
            raise TopicError("'#' must be the whole last level of a topic filter [MQTT-4.7.1-1]")
    if "+" in topic_filter:
        for level in topic_filter.split("/"):
            if "+" in level and level != "+":
                raise TopicError("'+' must occupy a whole level of a topic filter [MQTT-4.7.1-2]")


def parse_shared_subscription(topic_filter: str) -> tuple[str, str] | None:
    """Split a Shared Subscription ``$share/{ShareName}/{filter}`` (section
    4.8.2).

    :param topic_filter: a Topic Filter from SUBSCRIBE or UNSUBSCRIBE.
    :returns: ``(share name, topic filter)``, or None when the filter does not
        start with ``$share/``.
    :raises TopicError: the ShareName is empty [MQTT-4.8.2-1] or contains
        ``/``, ``+`` or ``#``, or is not followed by ``/`` and a valid Topic
        Filter [MQTT-4.8.2-2].
    """
    if not topic_filter.startswith(SHARED_PREFIX):
        return None
    group, sep, rest = topic_filter[len(SHARED_PREFIX):].partition("/")
    if not group:
        raise TopicError("shared subscription with an empty share name [MQTT-4.8.2-1]")
    if "+" in group or "#" in group:
        raise TopicError("share name must not contain '+' or '#' [MQTT-4.8.2-2]")
    if not sep or not rest:
        raise TopicError("share name must be followed by '/' and a topic filter [MQTT-4.8.2-2]")
    validate_topic_filter(rest)
    return group, rest


def topic_matches(topic_filter: str, topic_name: str) -> bool:
    """Whether a Topic Filter matches a Topic Name (section 4.7), naively.

    ``#`` matches its parent level and any number of child levels (``a/#``
    matches ``a``); ``+`` matches exactly one level, which may be empty;
    names starting with ``$`` are not matched by filters starting with a
    wildcard [MQTT-4.7.2-1]. Shared Subscription prefixes are not stripped.

    :param topic_filter: a valid Topic Filter.
    :param topic_name: a valid Topic Name.
    :returns: True when the filter matches the name.
    """
    if topic_name[:1] == "$" and topic_filter[:1] in ("+", "#"):
        return False
    if "+" not in topic_filter and "#" not in topic_filter:
        return topic_filter == topic_name
    names = topic_name.split("/")
    levels = topic_filter.split("/")
    count = len(names)
    for i, level in enumerate(levels):
        if level == "#":
            return True
        if i >= count:
            return False
        if level != "+" and level != names[i]:
            return False
    return len(levels) == count
