"""The topic-filter trie: which subscriptions match a topic name.

It matches and never delivers (ARCHITECTURE §3).  Each node is one topic
level; a subscription is stored at the node of its filter's last level under a
key chosen by the caller (a client id, or a shared-subscription group), so one
publish costs one walk of the topic's levels, whatever the number of
subscriptions.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterator


class _Node:
    __slots__ = ("children", "subs")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.subs: dict[Hashable, Any] = {}


class SubscriptionTrie:
    """Topic filters → ``{key: value}``.

    Matching follows [MQTT-4.7.1-2] (``#`` matches the parent level and any
    number of child levels), [MQTT-4.7.1-3] (``+`` matches exactly one level,
    empty included) and [MQTT-4.7.2-1] (a topic name starting with ``$`` is
    not matched by a filter starting with a wildcard).
    """

    __slots__ = ("_root", "_count", "_cache")

    #: topic names whose matches are remembered (the cache is emptied when full)
    CACHE_SIZE = 10000

    def __init__(self) -> None:
        self._root = _Node()
        self._count = 0
        # topic name -> match result; emptied on every change of the trie
        self._cache: dict[str, list] = {}

    def __len__(self) -> int:
        """:returns: the number of (filter, key) entries."""
        return self._count

    def add(self, topic_filter: str, key: Hashable, value: Any) -> bool:
        """Store ``value`` for ``key`` at ``topic_filter``.

        :param topic_filter: a valid topic filter (validated by the caller).
        :returns: True when the key is new for this filter, False when it
            replaced a value (a subscription renewed, [MQTT-3.8.4-3]).
        """
        if self._cache:
            self._cache = {}
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        is_new = key not in node.subs
        node.subs[key] = value
        if is_new:
            self._count += 1
        return is_new

    def get(self, topic_filter: str, key: Hashable) -> Any:
        """:returns: the value stored for ``key`` at ``topic_filter``, or None."""
        node = self._find(topic_filter)
        return None if node is None else node.subs.get(key)

    def remove(self, topic_filter: str, key: Hashable) -> Any:
        """Remove ``key`` from ``topic_filter`` and prune empty nodes.

        :returns: the removed value, or None when there was none.
        """
        path = [self._root]
        node = self._root
        levels = topic_filter.split("/")
        for level in levels:
            node = node.children.get(level)
            if node is None:
                return None
            path.append(node)
        value = node.subs.pop(key, None)
        if value is None:
            return None
        self._count -= 1
        if self._cache:
            self._cache = {}
        for i in range(len(levels), 0, -1):
            child = path[i]
            if child.subs or child.children:
                break
            del path[i - 1].children[levels[i - 1]]
        return value

    def _find(self, topic_filter: str) -> _Node | None:
        node = self._root
        for level in topic_filter.split("/"):
            node = node.children.get(level)
            if node is None:
                return None
        return node

    def match(self, topic: str) -> list[dict[Hashable, Any]]:
        """Every subscription whose filter matches the topic name ``topic``.

        :param topic: a topic name (no wildcards).
        :returns: a list of the ``{key: value}`` dicts of the matching filters
            (live views: do not mutate; one key may appear in several dicts
            when a client's filters overlap).  The list is remembered per
            topic name until the trie changes: do not mutate it either.
        """
        cache = self._cache
        found = cache.get(topic)
        if found is None:
            found = self._match(topic)
            if len(cache) >= self.CACHE_SIZE:
                cache.clear()
            cache[topic] = found
        return found

    def _match(self, topic: str) -> list[dict[Hashable, Any]]:
        levels = topic.split("/")
        found: list[dict] = []
        nodes = [self._root]
        skip_wildcards = topic.startswith("$")
        for level in levels:
            next_nodes = []
            for node in nodes:
                children = node.children
                if not children:
                    continue
                if not skip_wildcards:
                    hash_node = children.get("#")
                    if hash_node is not None and hash_node.subs:
                        found.append(hash_node.subs)
                    plus = children.get("+")
                    if plus is not None:
                        next_nodes.append(plus)
                child = children.get(level)
                if child is not None:
                    next_nodes.append(child)
            skip_wildcards = False
            nodes = next_nodes
            if not nodes:
                return found
        for node in nodes:
            if node.subs:
                found.append(node.subs)
            hash_node = node.children.get("#")
            if hash_node is not None and hash_node.subs:
                found.append(hash_node.subs)
        return found

    def items(self) -> Iterator[tuple[str, Hashable, Any]]:
        """Every ``(topic_filter, key, value)``, depth first."""
        stack = [("", self._root, True)]
        while stack:
            prefix, node, is_root = stack.pop()
            for key, value in node.subs.items():
                yield prefix, key, value
            for level, child in node.children.items():
                stack.append((level if is_root else prefix + "/" + level, child, False))
