"""Hand-made event records for the transform tests."""

from __future__ import annotations

import datetime as dt

from tbmq.analytics.reading import prepare
from tbmq.analytics.schema import READ_SCHEMA

#: 2024-01-01 00:00:00 UTC in epoch milliseconds
T0 = 1704067200000

UTC = dt.UTC


def at(ms_after_t0: int) -> dt.datetime:
    """The aware UTC datetime ``ms_after_t0`` ms after :data:`T0`."""
    return dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=ms_after_t0)


def rec(kind: str, ts: int, **fields) -> dict:
    """A record of ``kind`` at ``T0 + ts`` ms (schema v1)."""
    out = {"v": 1, "type": kind, "ts": T0 + ts, "node": fields.pop("node", "n1")}
    out.update(fields)
    return out


def raw_frame(spark, records: list[dict]):
    """Records as a raw DataFrame of READ_SCHEMA."""
    names = [f.name for f in READ_SCHEMA.fields]
    for r in records:
        unknown = set(r) - set(names)
        assert not unknown, unknown
    return spark.createDataFrame([tuple(r.get(n) for n in names) for r in records], READ_SCHEMA)


def events_frame(spark, records: list[dict]):
    """Records as valid events (what :func:`prepare` keeps)."""
    events, _ = prepare(raw_frame(spark, records))
    return events


def pub(ts, client, ctype, topic, qos, size, msg_id, retain=False, node="n1"):
    return rec("publish", ts, client_id=client, client_type=ctype, topic=topic, qos=qos,
               bytes=size, msg_id=msg_id, retain=retain, will=False, node=node)


def dlv(ts, client, ctype, topic, qos, size, msg_id, latency, retain=False, node="n1",
        publisher=None):
    return rec("deliver", ts, client_id=client, client_type=ctype, topic=topic, qos=qos,
               bytes=size, msg_id=msg_id, latency_ms=latency, retain=retain, node=node,
               publisher=publisher)


#: the traffic of the transform tests (see test_transforms.py for the sums)
TRAFFIC = [
    pub(0, "d1", "DEVICE", "s1/d1/t", 0, 10, "m1"),
    dlv(1, "a1", "APPLICATION", "s1/d1/t", 0, 10, "m1", 1.0),
    dlv(3, "a2", "APPLICATION", "s1/d1/t", 0, 10, "m1", 3.0, node="n2"),
    pub(30000, "d1", "DEVICE", "s1/d1/t", 1, 20, "m2"),
    dlv(30002, "a1", "APPLICATION", "s1/d1/t", 1, 20, "m2", 2.0),
    rec("drop", 30002, client_id="a2", client_type="APPLICATION", reason="slow_consumer",
        msg_id="m2", topic="s1/d1/t", qos=1, bytes=20, node="n2"),
    pub(61000, "d2", "DEVICE", "s2/d2/t", 1, 100, "m3", retain=True),
    dlv(61005, "a1", "APPLICATION", "s2/d2/t", 1, 100, "m3", 5.0, retain=True),
    pub(62000, "d2", "DEVICE", "s2/d2/t", 0, 7, "m5"),
    pub(3610000, "a1", "APPLICATION", "s1/d1/rpc", 2, 5, "m4"),
    dlv(3610004, "d1", "DEVICE", "s1/d1/rpc", 2, 5, "m4", 4.0),
    rec("drop", 3620000, client_id="a3", client_type="APPLICATION", reason="session_ended"),
]

#: connections of the session tests
SESSIONS = [
    rec("connect", 0, client_id="d1", client_type="DEVICE"),
    rec("connect", 60000, client_id="d1", client_type="DEVICE"),
    rec("connect", 120000, client_id="d1", client_type="DEVICE"),
    rec("connect", 180000, client_id="d1", client_type="DEVICE"),
    rec("connect", 700000, client_id="d1", client_type="DEVICE"),
    rec("connect", 0, client_id="d2", client_type="DEVICE"),
    rec("connect", 1000000, client_id="d2", client_type="DEVICE"),
    rec("disconnect", 500, client_id="d1", client_type="DEVICE", reason_code=0, duration_ms=500),
    rec("disconnect", 65000, client_id="d1", client_type="DEVICE", duration_ms=5000),
    rec("disconnect", 120000, client_id="d2", client_type="DEVICE", reason_code=0x8D,
        duration_ms=120000),
    rec("disconnect", 7200000, client_id="a1", client_type="APPLICATION", reason_code=0x8E,
        duration_ms=7200000),
    rec("disconnect", 7300000, client_id="d1", client_type="DEVICE", reason_code=0),
]

#: authentication failures
AUTH = [
    rec("auth_fail", 1000, client_id="x", username="x", address="203.0.113.1", reason_code=134),
    rec("auth_fail", 2000, client_id="y", address="203.0.113.1", reason_code=134),
    rec("auth_fail", 3000, client_id="x", address="203.0.113.1", reason_code=135),
    rec("auth_fail", 4000, client_id="z", address="203.0.113.1", reason_code=134),
    rec("auth_fail", 5000, client_id="x", address="192.0.2.5", reason_code=134),
]
