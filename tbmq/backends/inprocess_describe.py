"""What the in-process bus holds, for operators
(:meth:`tbmq.interfaces.IMessageBus.describe`): its topics with their latest
offsets and its consumer groups with their committed offsets, read from the
bus's own state in the reactor thread (a few dict reads per topic and
group; nothing is asked of anything else).
"""

from __future__ import annotations

from twisted.internet import defer

__all__ = ["Describable", "describe_topics"]


def describe_topics(states) -> dict:
    """:param states: the bus's
        :class:`~tbmq.backends.inprocess_log.TopicState` objects.
    :returns: ``{"topics": [{name, partitions, latest_offsets}], "groups":
        [{group, state, members, committed: [{topic, partition, offset}]}],
        "errors": []}`` sorted by name: ``latest_offsets`` the offset the
        next record of each partition gets; a group (one name over every
        topic it reads) ``stable`` while it has live members on one of
        them, else ``empty``, ``members`` the most live members it has on
        one topic."""
    topics, groups = [], {}
    for state in sorted(states, key=lambda s: s.name):
        topics.append({"name": state.name, "partitions": len(state.parts),
                       "latest_offsets": [part.next for part in state.parts]})
        for name, group in state.groups.items():
            entry = groups.setdefault(name, {"group": name, "state": "empty", "members": 0,
                                             "committed": []})
            if group.members:
                entry["state"] = "stable"
                entry["members"] = max(entry["members"], len(group.members))
            entry["committed"] += [{"topic": state.name, "partition": p,
                                    "offset": cursor.committed}
                                   for p, cursor in enumerate(group.cursors)]
    return {"topics": topics, "groups": [groups[g] for g in sorted(groups)], "errors": []}


class Describable:
    """The ``describe`` of :class:`tbmq.backends.inprocess_bus.InProcessBus`
    (its ``_topics``: topic name → ``TopicState``)."""

    _topics: dict

    def describe(self) -> defer.Deferred:
        """See :meth:`tbmq.interfaces.IMessageBus.describe`.

        :returns: a Deferred (already fired) with ``{bus: "in-process",
            driver: None, topics, groups, errors}`` (:func:`describe_topics`).
        """
        return defer.succeed({"bus": "in-process", "driver": None,
                              **describe_topics(list(self._topics.values()))})
