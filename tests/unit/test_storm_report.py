"""bench/storm.py's report describes each lost message (a few at most), so
that a run that lost one can be matched with the nodes' logs."""

from __future__ import annotations

from bench import storm
from bench.mqttgen import now
from bench.storm import StormFleet


def _up(fleet: StormFleet, m, port: int, present: bool) -> None:
    """``m`` accepted on ``port`` (what :meth:`StormFleet.activity` records)."""
    m.state = "up"
    m.t_up = now()
    m.ups.append([m.t_up, port, present, None])


def _send(fleet: StormFleet, p, acked: bool) -> int:
    seq = p.seq
    p.seq += 1
    p.sent_at.append(now())
    p.sent_on.append(len(p.ups))
    p.acked.append(1 if acked else 0)
    p.acked_on.append(len(p.ups) if acked else 0)
    p.acked_at.append(now() if acked else 0.0)
    return seq


def test_a_lost_message_is_described_with_its_connections_and_neighbours():
    fleet = StormFleet("127.0.0.1", range(2), "t", "storm", rate_each=1.0)
    fleet.port_names = {1001: "B", 1002: "A"}
    p, s = fleet.pubs[1], fleet.subs[1]
    _up(fleet, p, 1001, False)
    _up(fleet, s, 1001, False)
    delivered = _send(fleet, p, True)
    s.first[delivered] = now()
    lost = _send(fleet, p, False)  # sent on B, acknowledged by A after the kill
    t_kill = now()
    s.ups[-1][3] = p.ups[-1][3] = now()
    _up(fleet, p, 1002, False)
    _up(fleet, s, 1002, True)
    p.acked[lost], p.acked_on[lost], p.acked_at[lost] = 1, len(p.ups), now()
    later = _send(fleet, p, True)
    s.first[later] = now()

    report = fleet.report(t_kill)

    assert report["lost"] == 1
    [entry] = report["lost_messages"]
    assert (entry["pair"], entry["seq"], entry["pub"], entry["sub"]) == (1, lost, "t-p1", "t-s1")
    assert entry["sent"] <= 0 <= entry["acked"]
    assert entry["sent_on"][:2] == [1, "B"] and entry["acked_on"][:2] == [2, "A"]
    assert [c[1:2] + c[3:4] for c in entry["sub_conns"]] == [["B", False], ["A", True]]
    assert entry["sub_conns"][0][4] is not None and entry["sub_conns"][1][4] is None
    assert entry["before"][0] == delivered and entry["after"][0] == later


def test_only_a_few_lost_messages_are_described():
    fleet = StormFleet("127.0.0.1", range(1), "t", "storm", rate_each=1.0)
    p = fleet.pubs[0]
    _up(fleet, p, 1002, False)
    for _ in range(storm.LOST_SHOWN + 5):
        _send(fleet, p, True)
    report = fleet.report(now())
    assert report["lost"] == storm.LOST_SHOWN + 5
    assert len(report["lost_messages"]) == storm.LOST_SHOWN
    assert report["lost_messages"][0]["sent_on"][1] == 1002  # a port without a name
