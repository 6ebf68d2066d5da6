"""TBMQ's publish/subscribe authorization rules (``PubSubAuthorizationRules``).

Credentials carry ``authRules``: ``{"pubAuthRulePatterns": [regex, ...],
"subAuthRulePatterns": [regex, ...]}``.  A client authenticated by them may
publish to a topic name, or subscribe to a topic filter, when the whole name
(or filter, taken literally: ``+`` and ``#`` are ordinary characters to the
regex) matches one of the patterns — TBMQ's
``DefaultAuthorizationRuleService``: ``Pattern.matcher(topic).matches()``,
i.e. :func:`re.fullmatch`.

tbmq departs from TBMQ on one point, as :class:`tbmq.model.Credentials`
documents: a *missing* list means no restriction, while an *empty* list
allows nothing (in TBMQ both deny).

Patterns may contain placeholders, replaced by the connecting client's values
when the rules are bound to a connection (:meth:`AuthorizationRules.bind`):
``${clientId}``, ``${username}``, ``${certificateCn}`` (and TBMQ's
``${cn}``, the same as ``${certificateCn}``).  The value is inserted as a
literal (:func:`re.escape`, as TBMQ quotes the CN with ``\\Q..\\E``), so a
client id ``dev.42`` does not let ``dev/42`` through.  A pattern whose
placeholder has no value (no username, no certificate) matches nothing.

The check runs for every PUBLISH, so :class:`BoundRules` remembers its last
answers (a bounded LRU, as TBMQ caches per client and topic).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any, Iterable, Mapping

from tbmq.errors import CredentialsError

__all__ = [
    "AuthorizationRules",
    "BoundRules",
    "PLACEHOLDERS",
    "filter_like",
    "PUB_KEY",
    "SUB_KEY",
    "UNRESTRICTED",
]

#: The key of the publish patterns in ``authRules``.
PUB_KEY = "pubAuthRulePatterns"
#: The key of the subscribe patterns in ``authRules``.
SUB_KEY = "subAuthRulePatterns"

#: Placeholder → the :meth:`AuthorizationRules.bind` argument it stands for.
PLACEHOLDERS = {
    "${clientId}": "client_id",
    "${username}": "username",
    "${certificateCn}": "certificate_cn",
    "${cn}": "certificate_cn",  # TBMQ's AuthRulesUtil.COMMON_NAME_PLACEHOLDER
}

_PLACEHOLDER_RE = re.compile(
    "|".join(re.escape(p) for p in sorted(PLACEHOLDERS, key=len, reverse=True))
)

#: A literal put in place of every placeholder to check a pattern's syntax
#: before it is bound (TBMQ validates ``${cn}`` patterns with a dummy CN).
_DUMMY = "tbmq"

#: Default bound of the per-connection answer cache, in topics.
DEFAULT_CACHE_SIZE = 1024

#: A topic level that is exactly ``+`` (MQTT's single-level wildcard).
_PLUS_LEVEL = re.compile(r"(?<![^/])\+(?![^/])")


def filter_like(pattern: str) -> str | None:
    """Does a rule look like an MQTT topic filter rather than a regex?

    Rules are regular expressions over the whole topic name (or, for
    subscribe rules, the whole topic filter taken literally), where ``#`` is
    an ordinary character and ``+`` repeats what precedes it: the rule
    ``commands/${clientId}/#`` allows publishing to no topic name and
    subscribing only to the filter ``commands/<id>/#`` itself, not to
    ``commands/<id>/reboot``.  A rule with a level that is a lone ``+``, a
    trailing ``/#``, or that is ``#`` alone was most likely written as a
    topic filter [MQTT-4.7.1].

    :param pattern: a publish or subscribe rule, placeholders unbound.
    :returns: the regular expression it probably meant (``+`` levels as
        ``[^/]*``, a trailing ``/#`` as ``/.*``, ``#`` as ``.*``), or None
        when it does not look like a topic filter.
    """
    if pattern == "#":
        return ".*"
    meant = pattern
    if meant.endswith("/#"):
        meant = meant[:-1] + ".*"
    meant = _PLUS_LEVEL.sub("[^/]*", meant)
    return None if meant == pattern else meant


def _patterns(value: Any, key: str) -> tuple[str, ...] | None:
    """Read one pattern list of an ``authRules`` document.

    :param value: the list, or None when the key is absent.
    :param key: its key, for the error message.
    :returns: the patterns, or None for no restriction.
    :raises CredentialsError: when it is not a list of strings.
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise CredentialsError(f"authRules.{key}: expected a list of regexes")
    patterns = tuple(value)
    for i, pattern in enumerate(patterns):
        if not isinstance(pattern, str):
            raise CredentialsError(
                f"authRules.{key}[{i}]: expected a string, got "
                f"{type(pattern).__name__}"
            )
    return patterns


def _check_syntax(patterns: tuple[str, ...] | None, key: str) -> None:
    """Compile every pattern with its placeholders replaced by a dummy.

    :raises CredentialsError: naming the first invalid pattern.
    """
    for i, pattern in enumerate(patterns or ()):
        try:
            re.compile(_PLACEHOLDER_RE.sub(_DUMMY, pattern))
        except re.error as e:
            raise CredentialsError(
                f"authRules.{key}[{i}]: invalid regex {pattern!r}: {e}"
            ) from None


class AuthorizationRules:
    """The unbound rules of one credentials record.

    :param pub_patterns: regexes a topic name must match to be published
        to; None means no restriction, an empty tuple allows nothing.
    :param sub_patterns: regexes a topic filter must match to be
        subscribed to; None means no restriction, an empty tuple allows
        nothing.
    :raises CredentialsError: when a pattern is not a valid regex (with its
        placeholders replaced by a literal), the message naming it.
    """

    __slots__ = ("pub_patterns", "sub_patterns")

    def __init__(
        self,
        pub_patterns: Iterable[str] | None = None,
        sub_patterns: Iterable[str] | None = None,
    ) -> None:
        self.pub_patterns = _patterns(pub_patterns, PUB_KEY)
        self.sub_patterns = _patterns(sub_patterns, SUB_KEY)
        _check_syntax(self.pub_patterns, PUB_KEY)
        _check_syntax(self.sub_patterns, SUB_KEY)

    @classmethod
    def from_value(cls, auth_rules: Mapping | None) -> "AuthorizationRules":
        """Read TBMQ's ``authRules`` document.

        :param auth_rules: ``{"pubAuthRulePatterns": [...],
            "subAuthRulePatterns": [...]}``, either key optional; None (no
            ``authRules`` at all) means no restriction.
        :returns: the rules.
        :raises CredentialsError: when it is not a mapping, a list is not a
            list of strings, or a pattern is not a valid regex.
        """
        if auth_rules is None:
            return UNRESTRICTED
        if not isinstance(auth_rules, Mapping):
            raise CredentialsError("authRules: expected a mapping")
        return cls(auth_rules.get(PUB_KEY), auth_rules.get(SUB_KEY))

    def to_value(self) -> dict:
        """:returns: the ``authRules`` document of these rules (a missing
        key for no restriction)."""
        value: dict = {}
        if self.pub_patterns is not None:
            value[PUB_KEY] = list(self.pub_patterns)
        if self.sub_patterns is not None:
            value[SUB_KEY] = list(self.sub_patterns)
        return value

    def bind(
        self,
        client_id: str,
        username: str | None = None,
        certificate_cn: str | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> "BoundRules":
        """Substitute the connection's values into the placeholders and
        compile the patterns.

        :param client_id: the client identifier of the connection.
        :param username: the CONNECT user name, or None.
        :param certificate_cn: the CN of the client certificate, or None.
        :param cache_size: how many answers each of ``may_publish`` and
            ``may_subscribe`` remember, >= 0.
        :returns: the rules of this connection.
        :raises CredentialsError: when a substituted pattern is not a valid
            regex.
        """
        values = {
            "client_id": client_id,
            "username": username,
            "certificate_cn": certificate_cn,
        }
        return BoundRules(
            _bind(self.pub_patterns, values, PUB_KEY),
            _bind(self.sub_patterns, values, SUB_KEY),
            cache_size,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AuthorizationRules):
            return NotImplemented
        return (self.pub_patterns, self.sub_patterns) == (
            other.pub_patterns,
            other.sub_patterns,
        )

    def __hash__(self) -> int:
        return hash((self.pub_patterns, self.sub_patterns))

    def __repr__(self) -> str:
        return (
            f"AuthorizationRules(pub_patterns={self.pub_patterns!r}, "
            f"sub_patterns={self.sub_patterns!r})"
        )


def _bind(
    patterns: tuple[str, ...] | None, values: dict, key: str
) -> tuple[re.Pattern, ...] | None:
    """Substitute and compile ``patterns``; drop those with a placeholder
    whose value is None (they match nothing).

    :raises CredentialsError: naming a pattern that does not compile.
    """
    if patterns is None:
        return None
    compiled = []
    for i, pattern in enumerate(patterns):
        missing = False

        def substitute(match: re.Match) -> str:
            nonlocal missing
            value = values[PLACEHOLDERS[match.group(0)]]
            if value is None:
                missing = True
                return ""
            return re.escape(value)

        text = _PLACEHOLDER_RE.sub(substitute, pattern)
        if missing:
            continue
        try:
            compiled.append(re.compile(text))
        except re.error as e:
            raise CredentialsError(
                f"authRules.{key}[{i}]: invalid regex {pattern!r} "
                f"(bound: {text!r}): {e}"
            ) from None
    return tuple(compiled)


class _Answers:
    """A bounded LRU of ``topic -> bool`` over a fixed pattern tuple."""

    __slots__ = ("patterns", "size", "cache")

    def __init__(self, patterns: tuple[re.Pattern, ...], size: int) -> None:
        self.patterns = patterns
        self.size = size
        self.cache: OrderedDict[str, bool] = OrderedDict()

    def allowed(self, topic: str) -> bool:
        cache = self.cache
        answer = cache.get(topic)
        if answer is not None:
            cache.move_to_end(topic)
            return answer
        answer = any(p.fullmatch(topic) is not None for p in self.patterns)
        if self.size > 0:
            cache[topic] = answer
            if len(cache) > self.size:
                cache.popitem(last=False)
        return answer


class BoundRules:
    """The authorization rules of one connection, compiled.

    :param pub_patterns: compiled publish patterns, None for no
        restriction.
    :param sub_patterns: compiled subscribe patterns, None for no
        restriction.
    :param cache_size: answers remembered per direction (LRU), >= 0.

    Not thread-safe: use it from the reactor thread.
    """

    __slots__ = ("pub_patterns", "sub_patterns", "_pub", "_sub")

    def __init__(
        self,
        pub_patterns: tuple[re.Pattern, ...] | None,
        sub_patterns: tuple[re.Pattern, ...] | None,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        if cache_size < 0:
            raise ValueError("cache_size must be >= 0")
        self.pub_patterns = pub_patterns
        self.sub_patterns = sub_patterns
        self._pub = None if pub_patterns is None else _Answers(pub_patterns, cache_size)
        self._sub = None if sub_patterns is None else _Answers(sub_patterns, cache_size)

    def may_publish(self, topic_name: str) -> bool:
        """May the client publish to ``topic_name``?

        TBMQ's ``isPubAuthorized``: True when there is no publish restriction
        or the whole topic name matches one of the patterns
        (:func:`re.fullmatch`); a client that may not gets PUBACK/PUBREC
        NOT_AUTHORIZED (0x87, v5) or is disconnected (v3), the broker's call.

        :param topic_name: the topic name, aliases resolved.
        :returns: the answer; remembered (bounded LRU).
        """
        answers = self._pub
        return True if answers is None else answers.allowed(topic_name)

    def may_subscribe(self, topic_filter: str) -> bool:
        """May the client subscribe to ``topic_filter``?

        TBMQ's ``isSubAuthorized``: True when there is no subscribe
        restriction or the whole filter, wildcards taken literally, matches
        one of the patterns; a refused filter gets SUBACK NOT_AUTHORIZED
        (0x87, v5) or FAILURE (0x80, v3.1.1) [MQTT-3.9.3].  A shared subscription is
        checked as given (``$share/<group>/<filter>``) — the caller decides
        whether to pass the whole filter or the inner one.

        :param topic_filter: the topic filter.
        :returns: the answer; remembered (bounded LRU).
        """
        answers = self._sub
        return True if answers is None else answers.allowed(topic_filter)

    def __repr__(self) -> str:
        def show(patterns: tuple[re.Pattern, ...] | None) -> Any:
            return None if patterns is None else [p.pattern for p in patterns]

        return (
            f"BoundRules(pub={show(self.pub_patterns)!r}, "
            f"sub={show(self.sub_patterns)!r})"
        )


#: The rules of credentials without ``authRules``: everything allowed.
UNRESTRICTED = AuthorizationRules(None, None)
