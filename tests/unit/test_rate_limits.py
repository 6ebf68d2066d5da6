"""Tests of :mod:`tbmq.ratelimit` (token buckets, ``limit:seconds`` pairs),
:mod:`tbmq.broker.limits` (the node's limits, the cluster split, the session
rules) and the ``mqtt.rate_limits`` config keys."""

from __future__ import annotations

import textwrap

import pytest
from twisted.internet.task import Clock

from tbmq.broker.hooks import DropCounter
from tbmq.broker.limits import NodeLimits
from tbmq.cluster.records import SessionInfo
from tbmq.config import load_config
from tbmq.errors import ConfigError
from tbmq.model import ClientType
from tbmq.ratelimit import Bands, TokenBucket, parse_limits


# -- limit:seconds pairs ------------------------------------------------------------------

def test_parse_pairs():
    assert parse_limits("10:1,300:60") == ((10, 1.0), (300, 60.0))
    assert parse_limits(" 5 : 0.5 ") == ((5, 0.5),)


@pytest.mark.parametrize("text", ["", "10", "10:1:2", "a:1", "10:b", "0:1", "10:0", "10:-1",
                                  "10:1,", "1.5:1"])
def test_parse_refuses(text):
    with pytest.raises(ValueError):
        parse_limits(text)


# -- token buckets ------------------------------------------------------------------------

def test_bucket_every_pair_holds():
    bucket = TokenBucket(Bands(parse_limits("2:1,3:60")), now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [True, True, False]
    # one second later the 2:1 bucket is full again, the 3:60 one has 1 + 1/20
    assert bucket.take(1.0) is True
    assert bucket.take(1.0) is False  # 3:60 empty (0.05 left)
    assert bucket.take(21.0) is True  # 20 s refill one token of 3:60


def test_bucket_refills_continuously_and_caps():
    bucket = TokenBucket(Bands(((10, 1.0),)), now=0.0)
    assert all(bucket.take(0.0) for _ in range(10))
    assert not bucket.take(0.0)
    assert bucket.take(0.1)  # 0.1 s = one token
    assert not bucket.take(0.1)
    # a long idle time fills it to its capacity, no more
    assert sum(bucket.take(100.0) for _ in range(20)) == 10


def test_refused_take_takes_nothing():
    bucket = TokenBucket(Bands(((1, 1.0), (5, 1.0))), now=0.0)
    assert bucket.take(0.0)
    assert not bucket.take(0.0)
    assert bucket.tokens[1] == 4.0


def test_share_and_rebase():
    bands = Bands(((100, 1.0),), share=0.5)
    assert bands.capacity == (50.0,) and bands.rate == (50.0,)
    assert Bands(((1, 1.0),), share=0.25).capacity == (1.0,)  # never below one token
    bucket = TokenBucket(Bands(((100, 1.0),)), now=0.0)
    for _ in range(50):
        bucket.take(0.0)
    bucket.rebase(Bands(((100, 1.0),), share=0.5))
    assert bucket.tokens == [25.0]  # the fill ratio kept


# -- the node's limits --------------------------------------------------------------------

class FakeSession:
    __slots__ = ("client_id", "persistent", "rate_in", "rate_out", "dropped")

    def __init__(self, persistent: bool = False) -> None:
        self.client_id = "c"
        self.persistent = persistent
        self.rate_in = self.rate_out = None
        self.dropped: list = []

    def drop(self, reason: str, message=None) -> None:
        self.dropped.append(reason)


def limits_of(env: dict, nodes=None, now=None) -> tuple[NodeLimits, DropCounter, list]:
    t = [0.0]
    drops = DropCounter()
    limits = NodeLimits(load_config(environ=env).mqtt, Clock(), drops, nodes=nodes,
                        now=now or (lambda: t[0]))
    return limits, drops, t


def env(**values) -> dict:
    return {f"TBMQ_MQTT__{k.upper()}": v for k, v in values.items()}


def test_all_off_checks_nothing():
    limits, _, _ = limits_of({})
    assert not (limits.checks_incoming or limits.checks_outgoing or limits.checks_sessions)
    assert limits.total is None and limits.device_persisted is None


def test_incoming_per_client():
    limits, drops, t = limits_of(env(rate_limits__incoming_publish__enabled="true",
                                     rate_limits__incoming_publish__client_config="2:1"))
    a, b = FakeSession(), FakeSession()
    assert [limits.admit_incoming(a) for _ in range(3)] == [None, None, "incoming_rate_limited"]
    assert limits.admit_incoming(b) is None  # each client its own bucket
    assert drops.counts["incoming_rate_limited"] == 1
    t[0] = 1.0
    assert limits.admit_incoming(a) is None


def test_outgoing_only_qos0_to_non_persistent():
    limits, _, _ = limits_of(env(rate_limits__outgoing_publish__enabled="true",
                                     rate_limits__outgoing_publish__client_config="1:60"))
    live, persistent = FakeSession(), FakeSession(persistent=True)
    assert limits.admit_outgoing(live, 0, None) is True
    assert limits.admit_outgoing(live, 0, None) is False
    assert live.dropped == ["outgoing_rate_limited"]
    assert limits.admit_outgoing(live, 1, None) is True
    assert all(limits.admit_outgoing(persistent, 0, None) for _ in range(5))
    assert persistent.rate_out is None  # no bucket made where the limit does not apply


def test_cluster_limit_split_among_live_nodes():
    count = [1]
    limits, drops, t = limits_of(env(rate_limits__total__enabled="true",
                                     rate_limits__total__config="4:60"),
                                 nodes=lambda: count[0])
    count[0] = 2  # a second node joined: this one may take 2 of the 4
    session = FakeSession()
    assert [limits.admit_incoming(session) for _ in range(3)] == [
        None, None, "total_rate_limited"]
    assert drops.counts["total_rate_limited"] == 1
    # persistent QoS 1 deliveries are never dropped by total
    assert limits.admit_outgoing(FakeSession(persistent=True), 1, None) is True
    assert limits.admit_outgoing(session, 0, None) is False
    assert session.dropped == ["total_rate_limited"]


def test_device_persisted():
    limits, drops, _ = limits_of(env(rate_limits__device_persisted_messages__enabled="true",
                                     rate_limits__device_persisted_messages__config="1:60"))
    assert limits.admit_persisted("d") is True
    assert limits.admit_persisted("d") is False
    assert drops.counts["device_persisted_rate_limited"] == 1


def info(client_id: str, persistent: bool, kind: ClientType) -> SessionInfo:
    return SessionInfo(client_id, "n", "s", True, persistent, kind, 60, 5, 0.0, None, 0.0,
                       None, None, None, None)


def test_session_rules():
    limits, _, _ = limits_of(env(sessions_limit="2", application_clients_limit="1"))
    app = ClientType.APPLICATION
    assert limits.admit_session(2, False, ClientType.DEVICE, False, None) == "sessions_limit"
    assert limits.admit_session(2, True, ClientType.DEVICE, True, None) is None  # has one
    assert limits.admit_session(1, True, app, False, None) is None
    limits.session_changed("a", None, info("a", True, app))
    assert limits.applications == 1
    assert limits.admit_session(1, True, app, False, None) == "application_clients_limit"
    # its own session back, or a clean APPLICATION client (a DEVICE then)
    assert limits.admit_session(1, True, app, True, info("a", True, app)) is None
    assert limits.admit_session(1, False, app, False, None) is None
    limits.session_changed("a", info("a", True, app), None)
    assert limits.applications == 0
    assert limits.refused == {"sessions_limit": 1, "application_clients_limit": 1}


# -- config -------------------------------------------------------------------------------

def test_config_unquoted_pairs_stay_strings(tmp_path):
    path = tmp_path / "tbmq.yml"
    path.write_text(textwrap.dedent("""\
        mqtt:
          rate_limits:
            total: {enabled: true, config: 10:1}
          sessions_limit: 5
    """))
    config = load_config(str(path), environ={})
    assert config.mqtt.rate_limits.total.config == "10:1"  # not YAML 1.1's 601
    assert config.mqtt.sessions_limit == 5


@pytest.mark.parametrize("key,value,path", [
    ("TBMQ_MQTT__RATE_LIMITS__TOTAL__CONFIG", "10:x", "mqtt.rate_limits.total.config"),
    ("TBMQ_MQTT__RATE_LIMITS__INCOMING_PUBLISH__CLIENT_CONFIG", "0:1",
     "mqtt.rate_limits.incoming_publish.client_config"),
    ("TBMQ_MQTT__RATE_LIMITS__DEVICE_PERSISTED_MESSAGES__ENABLED", "maybe",
     "mqtt.rate_limits.device_persisted_messages.enabled"),
    ("TBMQ_MQTT__SESSIONS_LIMIT", "-1", "mqtt.sessions_limit"),
    ("TBMQ_MQTT__APPLICATION_CLIENTS_LIMIT", "x", "mqtt.application_clients_limit"),
])
def test_config_errors_name_the_key(key, value, path):
    with pytest.raises(ConfigError) as e:
        load_config(environ={key: value})
    assert str(e.value).startswith(path + ":")


def test_env_override():
    config = load_config(environ={"TBMQ_MQTT__RATE_LIMITS__OUTGOING_PUBLISH__CLIENT_CONFIG": "5:1",
                                  "TBMQ_MQTT__RATE_LIMITS__OUTGOING_PUBLISH__ENABLED": "true"})
    assert config.mqtt.rate_limits.outgoing_publish.enabled is True
    assert config.mqtt.rate_limits.outgoing_publish.client_config == "5:1"


# -- wiring -------------------------------------------------------------------------------

def broker_with(mqtt: dict):
    from twisted.internet.testing import MemoryReactorClock  # noqa: PLC0415

    from tbmq.broker.broker import Broker  # noqa: PLC0415
    from tbmq.plugins import make_plugin_manager  # noqa: PLC0415

    config = load_config(None, environ={}, overrides={"storage": {"backend": "memory"},
                                                      "mqtt": mqtt})
    return Broker(config, make_plugin_manager(config, load_entry_points=False),
                  MemoryReactorClock())


def test_all_off_leaves_the_paths_unchecked():
    broker = broker_with({})
    assert broker.limits is None
    assert broker.sessions.ctx.limits_in is None and broker.sessions.ctx.limits_out is None
    assert broker.connection_context().limits is None
    assert broker.router.persisted_limit is None


def test_each_limit_wired_where_it_applies():
    broker = broker_with({"rate_limits": {"outgoing_publish": {"enabled": True},
                                          "device_persisted_messages": {"enabled": True}}})
    assert broker.sessions.ctx.limits_in is None
    assert broker.sessions.ctx.limits_out is broker.limits
    assert broker.router.persisted_limit is broker.limits
    assert broker.connection_context().limits is None
    broker = broker_with({"sessions_limit": 10})
    assert broker.connection_context().limits is broker.limits
    assert broker.sessions.ctx.limits_in is None
