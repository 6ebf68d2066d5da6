"""The retained-message tree: topic names → their retained message.

A subscribe looks up every retained message its filter matches by walking the
levels of the filter (``+`` fans out to every child, ``#`` takes the whole
subtree), never by scanning all retained topics.  Topic names starting with
``$`` are not matched by a filter starting with a wildcard [MQTT-4.7.2-1].
"""

from __future__ import annotations

from typing import Iterator

from tbmq.model import Message


class _Node:
    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.message: Message | None = None


class RetainedTree:
    """In-memory index of retained messages, one per topic name [MQTT-3.3.1-5]."""

    __slots__ = ("_root", "_count")

    def __init__(self) -> None:
        self._root = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def set(self, message: Message) -> None:
        """Make ``message`` the retained message of ``message.topic``."""
        node = self._root
        for level in message.topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if node.message is None:
            self._count += 1
        node.message = message

    def get(self, topic: str) -> Message | None:
        """:returns: the retained message of topic name ``topic``, or None."""
        node = self._root
        for level in topic.split("/"):
            node = node.children.get(level)
            if node is None:
                return None
        return node.message

    def remove(self, topic: str) -> Message | None:
        """Clear the retained message of ``topic`` [MQTT-3.3.1-6] and prune.

        :returns: the removed message, or None.
        """
        levels = topic.split("/")
        path = [self._root]
        node = self._root
        for level in levels:
            node = node.children.get(level)
            if node is None:
                return None
            path.append(node)
        message = node.message
        if message is None:
            return None
        node.message = None
        self._count -= 1
        for i in range(len(levels), 0, -1):
            child = path[i]
            if child.message is not None or child.children:
                break
            del path[i - 1].children[levels[i - 1]]
        return message

    def match(self, topic_filter: str) -> list[Message]:
        """Every retained message whose topic name matches ``topic_filter``.

        :param topic_filter: a valid topic filter (no ``$share`` prefix).
        :returns: the messages, in no particular order.
        """
        levels = topic_filter.split("/")
        out: list[Message] = []
        nodes = [self._root]
        for depth, level in enumerate(levels):
            at_root = depth == 0
            if level == "#":
                for node in nodes:
                    if not at_root and node.message is not None:
                        out.append(node.message)  # "a/#" matches "a"
                    for name, child in node.children.items():
                        if at_root and name.startswith("$"):
                            continue
                        self._collect(child, out)
                return out
            next_nodes = []
            if level == "+":
                for node in nodes:
                    for name, child in node.children.items():
                        if at_root and name.startswith("$"):
                            continue
                        next_nodes.append(child)
            else:
                for node in nodes:
                    child = node.children.get(level)
                    if child is not None:
                        next_nodes.append(child)
            nodes = next_nodes
            if not nodes:
                return out
        for node in nodes:
            if node.message is not None:
                out.append(node.message)
        return out

    @staticmethod
    def _collect(node: _Node, out: list[Message]) -> None:
        stack = [node]
        while stack:
            node = stack.pop()
            if node.message is not None:
                out.append(node.message)
            stack.extend(node.children.values())

    def __iter__(self) -> Iterator[Message]:
        out: list[Message] = []
        self._collect(self._root, out)
        return iter(out)
