"""``GET /api/kafka``: the bus's topics and consumer groups, with the lag
of each group per topic and partition (the console's Kafka page).

The bus describes itself (:class:`tbmq.interfaces.IDescribableBus`: Kafka
through admin requests in a pool thread, the in-process bus from its own
state); :func:`overview` adds the lags.  One answer is kept for
:data:`MAX_AGE` seconds and shared by the requests that arrive meanwhile, so
a console polling every few seconds costs Kafka one describe at a time.
"""

from __future__ import annotations

import time

from twisted.internet import defer

__all__ = ["MAX_AGE", "BusNotDescribed", "BusOverview", "overview"]

#: seconds an answer is reused
MAX_AGE = 2.0


class BusNotDescribed(Exception):
    """The bus has no ``describe`` (a bus plugin without it)."""


def _lag(committed: int | None, latest: int | None) -> int | None:
    if committed is None or latest is None:
        return None
    return max(0, latest - committed)


def overview(described: dict, now: float) -> dict:
    """The admin API's answer (the ``KafkaOverview`` schema).

    :param described: what :meth:`tbmq.interfaces.IDescribableBus.describe`
        gave.
    :param now: seconds since the epoch.
    :returns: ``{bus, driver, time, topics: [{name, partitions,
        latest_offsets, records}], consumer_groups: [{group, state,
        members, total_lag, topics: [{topic, lag, partitions: [{partition,
        committed, latest, lag}]}]}], errors}``: ``records`` the sum of a
        topic's latest offsets (Kafka records written to it since it was
        created: on Kafka the bus packs the messages of one reactor turn
        for one partition into one record, so this is no message count); a lag is ``latest - committed`` (never below 0), None
        where either is not known; a topic's and a group's lag the sum of
        the lags known (None when none is).
    """
    latest = {t["name"]: t["latest_offsets"] for t in described["topics"]}
    topics = [{"name": t["name"], "partitions": t["partitions"],
               "latest_offsets": list(t["latest_offsets"]),
               "records": sum(o for o in t["latest_offsets"] if o is not None)
               if any(o is not None for o in t["latest_offsets"]) else None}
              for t in described["topics"]]
    groups = []
    for g in described["groups"]:
        by_topic: dict[str, list] = {}
        for c in g["committed"]:
            offsets = latest.get(c["topic"], ())
            end = offsets[c["partition"]] if c["partition"] < len(offsets) else None
            by_topic.setdefault(c["topic"], []).append({
                "partition": c["partition"], "committed": c["offset"], "latest": end,
                "lag": _lag(c["offset"], end)})
        group_topics = []
        for topic, partitions in sorted(by_topic.items()):
            lags = [p["lag"] for p in partitions if p["lag"] is not None]
            group_topics.append({"topic": topic, "lag": sum(lags) if lags else None,
                                 "partitions": sorted(partitions,
                                                      key=lambda p: p["partition"])})
        lags = [t["lag"] for t in group_topics if t["lag"] is not None]
        groups.append({"group": g["group"], "state": g["state"], "members": g["members"],
                       "total_lag": sum(lags) if lags else None, "topics": group_topics})
    return {"bus": described["bus"], "driver": described["driver"], "time": now,
            "topics": topics, "consumer_groups": groups, "errors": list(described["errors"])}


class BusOverview:
    """The bus's overview for the admin API, asked at most once per
    :data:`MAX_AGE` seconds.

    :param bus: the node's :class:`tbmq.interfaces.IMessageBus`.
    :param clock: ``IReactorTime`` (the age of an answer).
    :param wall: ``wall() -> float``, seconds since the epoch.
    """

    def __init__(self, bus, clock, wall=time.time) -> None:
        self.bus = bus
        self.clock = clock
        self.wall = wall
        self._kept: tuple[float, dict] | None = None
        self._waiting: list[defer.Deferred] | None = None

    def overview(self) -> defer.Deferred:
        """:returns: a Deferred firing with :func:`overview`'s answer;
            failing with :class:`BusNotDescribed` for a bus without
            ``describe``, or with the bus's error."""
        describe = getattr(self.bus, "describe", None)
        if describe is None:
            return defer.fail(BusNotDescribed("this bus does not describe its topics"))
        now = self.clock.seconds()
        if self._kept is not None and now - self._kept[0] < MAX_AGE:
            return defer.succeed(self._kept[1])
        d = defer.Deferred()
        if self._waiting is not None:
            self._waiting.append(d)
            return d
        self._waiting = [d]
        asked = defer.maybeDeferred(describe)
        asked.addCallback(lambda found: overview(found, self.wall()))
        asked.addBoth(self._answer)
        return d

    def _answer(self, result) -> None:
        waiting, self._waiting = self._waiting or [], None
        if isinstance(result, dict):
            self._kept = (self.clock.seconds(), result)
        for d in waiting:
            if isinstance(result, dict):
                d.callback(result)
            else:
                d.errback(result)
