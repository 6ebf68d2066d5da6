"""What the Kafka bus holds, for operators (:meth:`tbmq.interfaces.IMessageBus.describe`):
the cluster's topics with their latest offsets, and the consumer groups
with the offsets they committed on them.

The drivers' :meth:`~.drivers.Admin.describe` ask Kafka (admin requests,
blocking) and hand what they found to :func:`assemble`, which keeps what
belongs to the cluster and shapes it; :func:`describe_bus` runs one of them
in a pool thread with an admin client of its own (the bus's worker thread
and its clients are left to the bus), never in the reactor thread.

A group belongs to the cluster when it committed an offset on one of the
cluster's topics, when its id starts with ``kafka.topic_prefix`` (the
bundles), or when the node uses it.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import threads

__all__ = ["assemble", "describe_bus", "state_name"]


def state_name(state: Any) -> str | None:
    """A group state as the client reported it (an enum, or a name), as a
    lower-case name (``"stable"``, ``"empty"``, ``"preparing_rebalance"``),
    or None when Kafka said it does not know."""
    name = getattr(state, "name", state)
    if not isinstance(name, str) or not name or name.upper() == "UNKNOWN":
        return None
    out = []
    for i, c in enumerate(name):
        if c.isupper() and i and name[i - 1].islower():
            out.append("_")
        out.append(c.lower())
    return "".join(out)


def assemble(topic_prefix: str, known_groups: list[str], topics: dict[str, list[int]],
             latest: dict[tuple, int], groups: dict[str, dict],
             committed: dict[str, dict[tuple, int]], errors: list[str]) -> dict:
    """Keep and shape what a driver found.

    :param topic_prefix: the cluster's topics start with it
        (``kafka.topic_prefix`` + ``"tbmq."``).
    :param known_groups: Kafka group ids the node uses.
    :param topics: topic name → its partitions (every topic Kafka listed).
    :param latest: ``(topic, partition)`` → latest offset (the next offset
        to be written), where Kafka answered.
    :param groups: group id → ``{"state": str | None, "members": int |
        None}`` (every group listed or known).
    :param committed: group id → ``(topic, partition)`` → committed offset.
    :param errors: what could not be read, one line each.
    :returns: ``{"topics": [{name, partitions, latest_offsets}], "groups":
        [{group, state, members, committed: [{topic, partition, offset}]}],
        "errors"}``, sorted by name; ``latest_offsets`` one entry per
        partition (None where not known).
    """
    ours = {name: parts for name, parts in topics.items() if name.startswith(topic_prefix)}
    out_topics = [{"name": name, "partitions": len(parts),
                   "latest_offsets": [latest.get((name, p)) for p in range(len(parts))]}
                  for name, parts in sorted(ours.items())]
    known = set(known_groups)
    cluster_prefix = topic_prefix[:-len("tbmq.")] if topic_prefix.endswith("tbmq.") else ""
    out_groups = []
    for group in sorted(set(groups) | known):
        offsets = {tp: o for tp, o in committed.get(group, {}).items()
                   if tp[0].startswith(topic_prefix) and o is not None and o >= 0}
        if not offsets and group not in known and not (
                cluster_prefix and group.startswith(cluster_prefix)):
            continue
        info = groups.get(group, {})
        out_groups.append({
            "group": group, "state": info.get("state"), "members": info.get("members"),
            "committed": [{"topic": t, "partition": p, "offset": o}
                          for (t, p), o in sorted(offsets.items())]})
    return {"topics": out_topics, "groups": out_groups, "errors": list(errors)}


def describe_bus(reactor: Any, driver: Any, config: Any, topic_prefix: str,
                 known_groups: list[str]):
    """Describe the bus in a thread of ``reactor``'s pool.

    :param driver: the driver module (:func:`~.drivers.load_driver`).
    :param config: the ``kafka`` config.
    :returns: a Deferred firing with the driver's
        :meth:`~.drivers.Admin.describe` answer, or failing with the
        client's error (no broker answered).
    """

    def run() -> dict:
        admin = driver.Admin(config)
        try:
            return admin.describe(topic_prefix, known_groups)
        finally:
            admin.close()

    return threads.deferToThreadPool(reactor, reactor.getThreadPool(), run)
