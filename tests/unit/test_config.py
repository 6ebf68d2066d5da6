"""Tests of :mod:`tbmq.config`: defaults, file, environment, overrides, and
errors that name the key path."""

from __future__ import annotations

import dataclasses
import os
import textwrap
import types

import pytest

from tbmq.config import (
    AuthConfig,
    Config,
    ListenerConfig,
    MqttConfig,
    NodeConfig,
    StorageConfig,
    load_config,
)
from tbmq.errors import ConfigError, TbmqError

ETC = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "tbmq.yml")


def write(tmp_path, text: str) -> str:
    path = tmp_path / "tbmq.yml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def error(**kwargs) -> str:
    """Load with ``kwargs`` (environ defaults to empty) and return the
    ConfigError's message."""
    kwargs.setdefault("environ", {})
    with pytest.raises(ConfigError) as info:
        load_config(**kwargs)
    return str(info.value)


# -- defaults -----------------------------------------------------------------


def test_defaults():
    config = load_config(environ={})
    assert config == Config()
    assert config.data_dir == "./data"
    assert config.node == NodeConfig(service_id=None, gc_threshold=5000, log_level="info")
    assert config.listeners == (
        ListenerConfig(
            name="tcp",
            type="tcp",
            endpoint="tcp:1883",
            max_packet_size=None,
            max_connections=0,
        ),
    )
    assert config.mqtt == MqttConfig()
    # the bounds on one client's cost (issue 12): 1 MB packets, 32 unacknowledged
    # PUBLISHes, 10 topic aliases, 128 topic levels, 1000 subscriptions
    assert config.mqtt.max_packet_size == 1048576
    assert config.mqtt.receive_maximum == 128
    assert config.mqtt.topic_alias_maximum == 10
    assert config.mqtt.max_topic_levels == 128
    assert config.mqtt.max_subscriptions == 1000
    assert config.mqtt.outbound_topic_aliases == 0
    assert config.mqtt.connect_timeout == 10.0
    assert config.mqtt.max_qos == 2
    assert config.mqtt.max_queued_messages == 10000
    assert config.storage == StorageConfig(backend="sqlite", sqlite_synchronous="FULL")
    assert config.auth == AuthConfig(allow_anonymous=True)
    assert config.auth.providers == ("basic", "x509", "scram", "jwt")
    assert config.bus == "memory"
    assert dict(config.plugins) == {}


def test_default_file_equals_builtin_defaults():
    assert load_config(ETC, environ={}) == load_config(None, environ={})


def test_default_file_documents_every_key():
    text = open(ETC).read()
    for cls in (Config, ListenerConfig, MqttConfig, StorageConfig, AuthConfig, NodeConfig):
        for f in dataclasses.fields(cls):
            assert f"{f.name}:" in text, f.name


def test_frozen():
    config = load_config(environ={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.bus = "kafka"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.mqtt.max_qos = 1  # type: ignore[misc]
    assert isinstance(config.plugins, types.MappingProxyType)


def test_uses_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("TBMQ_BUS", "other")
    assert load_config().bus == "other"


# -- file ---------------------------------------------------------------------


def test_file_merged_over_defaults(tmp_path):
    path = write(
        tmp_path,
        """
        data_dir: /var/lib/tbmq
        node:
          service_id: node-1
        listeners:
          - name: plain
            endpoint: "tcp:11883"
          - name: secure
            type: tls
            endpoint: "tcp:8883"
            tls_cert: cert.pem
            tls_key: key.pem
            max_packet_size: 1024
            max_connections: 10
        mqtt:
          max_qos: 1
          connect_timeout: 5
          response_information: here
        storage:
          backend: memory
          sqlite_synchronous: normal
        auth:
          allow_anonymous: false
        plugins:
          kafka:
            servers: [a, b]
            options: {acks: all}
        """,
    )
    config = load_config(path, environ={})
    assert config.data_dir == "/var/lib/tbmq"
    assert config.node.service_id == "node-1"
    assert config.listeners == (
        ListenerConfig(name="plain", endpoint="tcp:11883"),
        ListenerConfig(
            name="secure",
            type="tls",
            endpoint="tcp:8883",
            tls_cert="cert.pem",
            tls_key="key.pem",
            max_packet_size=1024,
            max_connections=10,
        ),
    )
    # Merged key by key: untouched keys keep their defaults.
    assert config.mqtt == MqttConfig(
        max_qos=1, connect_timeout=5.0, response_information="here"
    )
    assert isinstance(config.mqtt.connect_timeout, float)
    assert config.storage == StorageConfig(backend="memory", sqlite_synchronous="NORMAL")
    assert config.auth.allow_anonymous is False
    assert config.plugins["kafka"]["servers"] == ("a", "b")
    assert config.plugins["kafka"]["options"]["acks"] == "all"
    with pytest.raises(TypeError):
        config.plugins["kafka"]["servers2"] = 1  # type: ignore[index]


def test_empty_file(tmp_path):
    path = write(tmp_path, "# nothing\n")
    assert load_config(path, environ={}) == Config()


def test_empty_section_keeps_defaults(tmp_path):
    path = write(tmp_path, "mqtt:\n")
    assert load_config(path, environ={}).mqtt == MqttConfig()


def test_missing_file(tmp_path):
    message = error(path=str(tmp_path / "nope.yml"))
    assert "nope.yml" in message


def test_invalid_yaml(tmp_path):
    path = write(tmp_path, "mqtt: [unclosed\n")
    assert "invalid YAML" in error(path=path)


def test_top_level_not_a_mapping(tmp_path):
    path = write(tmp_path, "- a\n- b\n")
    assert "top level must be a mapping" in error(path=path)


# -- environment --------------------------------------------------------------


def test_env_nested():
    config = load_config(
        environ={
            "TBMQ_MQTT__MAX_PACKET_SIZE": "1024",
            "TBMQ_MQTT__RETAIN_AVAILABLE": "false",
            "TBMQ_MQTT__MAX_INFLIGHT_MESSAGES": "25",
            "TBMQ_NODE__SERVICE_ID": "node-7",
            "TBMQ_DATA_DIR": "/tmp/x",
            "PATH": "/bin",
            "OTHER_MQTT__MAX_QOS": "7",
        }
    )
    assert config.mqtt.max_packet_size == 1024
    assert config.mqtt.retain_available is False
    assert config.mqtt.max_inflight_messages == 25
    assert config.node.service_id == "node-7"
    assert config.data_dir == "/tmp/x"


def test_env_case_insensitive():
    config = load_config(environ={"tbmq_Mqtt__Max_QoS": "1"})
    assert config.mqtt.max_qos == 1


def test_env_list_index():
    config = load_config(environ={"TBMQ_LISTENERS__0__ENDPOINT": "tcp:1884"})
    assert config.listeners == (ListenerConfig(endpoint="tcp:1884"),)


def test_env_list_append():
    config = load_config(
        environ={
            "TBMQ_LISTENERS__1__NAME": "ws",
            "TBMQ_LISTENERS__1__TYPE": "ws",
            "TBMQ_LISTENERS__1__ENDPOINT": "tcp:8083",
        }
    )
    assert config.listeners == (
        ListenerConfig(),
        ListenerConfig(name="ws", type="ws", endpoint="tcp:8083"),
    )


def test_env_overrides_file(tmp_path):
    path = write(tmp_path, "mqtt:\n  max_qos: 1\n  receive_maximum: 10\n")
    config = load_config(path, environ={"TBMQ_MQTT__MAX_QOS": "0"})
    assert config.mqtt.max_qos == 0
    assert config.mqtt.receive_maximum == 10


def test_env_string_values_stay_strings():
    config = load_config(
        environ={
            "TBMQ_MQTT__RESPONSE_INFORMATION": "",
            "TBMQ_LISTENERS__0__ENDPOINT": "tcp:1883:interface=127.0.0.1",
        }
    )
    assert config.mqtt.response_information == ""
    assert config.listeners[0].endpoint == "tcp:1883:interface=127.0.0.1"


def test_env_null():
    config = load_config(
        environ={"TBMQ_NODE__SERVICE_ID": "x", "TBMQ_LISTENERS__0__MAX_PACKET_SIZE": "null"}
    )
    assert config.listeners[0].max_packet_size is None


def test_env_plugins_free_form():
    config = load_config(environ={"TBMQ_PLUGINS__KAFKA__SERVERS": "[a, b]"})
    assert config.plugins["kafka"]["servers"] == ("a", "b")


def test_env_variables_that_name_no_section_are_not_overrides(log):
    """The ``tbmq`` CLI's own variables and a deployment tool's are left
    alone (they used to stop the broker: ``admin_password: unknown key``);
    the top-level scalars ``bus`` and ``sys_interval`` still apply."""
    environ = {"TBMQ_ADMIN_USER": "admin", "TBMQ_ADMIN_PASSWORD": "secret",
               "TBMQ_ADMIN_TOKEN": "t0k3n", "TBMQ_VERSION": "1.2", "TBMQ_HOME": "/opt/tbmq",
               "TBMQ_": "", "TBMQ_BUS": "kafka", "TBMQ_SYS_INTERVAL": "5"}
    config = load_config(environ=environ)
    assert config == dataclasses.replace(Config(), bus="kafka", sys_interval=5.0)
    assert not [line for line in log if "TBMQ_ADMIN" in line]  # debug level only


def test_env_unknown_key_in_a_section_names_variable():
    message = error(environ={"TBMQ_MQTT__MAX_QOSS": "1", "TBMQ_ADMIN_PASSWORD": "x"})
    assert message == "mqtt.max_qoss: unknown key (from TBMQ_MQTT__MAX_QOSS)"


def test_env_single_underscore_is_ignored_with_a_warning(log):
    config = load_config(environ={"TBMQ_MQTT_MAX_QOS": "1",
                                  "TBMQ_AUTH_LOGIN_LIMITS__WINDOW": "3"})
    assert config == Config()
    assert [line for line in log if "TBMQ_" in line] == [
        "environment variable TBMQ_MQTT_MAX_QOS is ignored: overrides are "
        "TBMQ_<SECTION>__<KEY> (two underscores); did you mean TBMQ_MQTT__MAX_QOS?",
        "environment variable TBMQ_AUTH_LOGIN_LIMITS__WINDOW is ignored: overrides are "
        "TBMQ_<SECTION>__<KEY> (two underscores); did you mean "
        "TBMQ_AUTH__LOGIN_LIMITS__WINDOW?",
    ]


def test_env_bad_value_names_key_and_variable():
    message = error(environ={"TBMQ_MQTT__MAX_QOS": "3"})
    assert message == "mqtt.max_qos: must be 0, 1 or 2 (from TBMQ_MQTT__MAX_QOS)"


def test_env_index_out_of_range():
    message = error(environ={"TBMQ_LISTENERS__2__NAME": "x"})
    assert message.startswith("listeners[2]: index out of range")


def test_env_index_into_mapping():
    message = error(environ={"TBMQ_MQTT__0": "x"})
    assert message.startswith("mqtt: is not a list")


def test_env_key_into_scalar():
    message = error(environ={"TBMQ_BUS__NAME": "x"})
    assert message.startswith("bus: is not a mapping")


# -- overrides ----------------------------------------------------------------


def test_overrides_win_over_env_and_file(tmp_path):
    path = write(tmp_path, "mqtt:\n  max_qos: 1\nbus: filebus\n")
    config = load_config(
        path,
        environ={"TBMQ_MQTT__MAX_QOS": "0", "TBMQ_BUS": "envbus"},
        overrides={"mqtt": {"max_qos": 2}, "data_dir": "/srv"},
    )
    assert config.mqtt.max_qos == 2
    assert config.bus == "envbus"
    assert config.data_dir == "/srv"


def test_overrides_replace_lists():
    config = load_config(
        environ={}, overrides={"listeners": [{"name": "a", "endpoint": "tcp:0"}]}
    )
    assert config.listeners == (ListenerConfig(name="a", endpoint="tcp:0"),)


def test_overrides_not_mutated():
    overrides = {"mqtt": {"max_qos": 1}}
    load_config(environ={}, overrides=overrides)
    assert overrides == {"mqtt": {"max_qos": 1}}


# -- errors name the key path -------------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"nope": 1}, "nope: unknown key"),
        ({"mqtt": {"nope": 1}}, "mqtt.nope: unknown key"),
        ({"mqtt": 5}, "mqtt: expected a mapping, got int"),
        ({"mqtt": {"max_qos": 3}}, "mqtt.max_qos: must be 0, 1 or 2"),
        ({"mqtt": {"max_qos": "2"}}, "mqtt.max_qos: expected an integer, got str"),
        ({"mqtt": {"max_qos": True}}, "mqtt.max_qos: expected an integer, got bool"),
        ({"mqtt": {"retain_available": 1}}, "mqtt.retain_available: expected true or false"),
        ({"mqtt": {"connect_timeout": 0}}, "mqtt.connect_timeout: must be > 0"),
        ({"mqtt": {"connect_timeout": "x"}}, "mqtt.connect_timeout: expected a number"),
        ({"mqtt": {"max_packet_size": 0}}, "mqtt.max_packet_size: must be between"),
        ({"mqtt": {"max_packet_size": 268435456}}, "mqtt.max_packet_size: must be between"),
        ({"mqtt": {"receive_maximum": 0}}, "mqtt.receive_maximum: must be between 1 and 65535"),
        ({"mqtt": {"receive_maximum": 65536}}, "mqtt.receive_maximum: must be between"),
        ({"mqtt": {"topic_alias_maximum": -1}}, "mqtt.topic_alias_maximum: must be between"),
        ({"mqtt": {"outbound_topic_aliases": 65536}}, "mqtt.outbound_topic_aliases: must be between"),
        ({"mqtt": {"max_topic_levels": 0}}, "mqtt.max_topic_levels: must be between 1 and 65535"),
        ({"mqtt": {"max_subscriptions": -1}}, "mqtt.max_subscriptions: must be >= 0"),
        ({"mqtt": {"max_keep_alive": 65536}}, "mqtt.max_keep_alive: must be between"),
        (
            {"mqtt": {"max_session_expiry_interval": 2**32}},
            "mqtt.max_session_expiry_interval: must be between",
        ),
        ({"mqtt": {"max_client_id_length": 22}}, "mqtt.max_client_id_length: must be between"),
        ({"mqtt": {"max_queued_messages": 0}}, "mqtt.max_queued_messages: must be >= 1"),
        ({"mqtt": {"max_pending_messages": 0}}, "mqtt.max_pending_messages: must be >= 1"),
        ({"mqtt": {"max_inflight_messages": 0}}, "mqtt.max_inflight_messages: must be between"),
        ({"auth": {"credentials": "ldap"}}, "auth.credentials: must be one of"),
        ({"mqtt": {"response_information": None}}, "mqtt.response_information: expected a string"),
        ({"storage": {"backend": "mongo"}}, "storage.backend: must be one of sqlite, memory"),
        ({"storage": {"sqlite_synchronous": "SOMETIMES"}}, "storage.sqlite_synchronous: must be one of"),
        ({"storage": {"max_messages_per_client": 0}}, "storage.max_messages_per_client: must be >= 1"),
        ({"auth": {"allow_anonymous": "yes"}}, "auth.allow_anonymous: expected true or false"),
        ({"node": {"service_id": ""}}, "node.service_id: must not be empty"),
        ({"node": {"service_id": 5}}, "node.service_id: expected a string"),
        ({"node": {"gc_threshold": -1}}, "node.gc_threshold: must be >= 0"),
        ({"node": {"switch_interval": 0}}, "node.switch_interval: must be > 0"),
        ({"node": {"log_level": "chatty"}}, "node.log_level: must be one of debug, info"),
        ({"data_dir": ""}, "data_dir: must not be empty"),
        ({"bus": None}, "bus: expected a string"),
        ({"plugins": []}, "plugins: expected a mapping"),
        ({"plugins": {"x": {1: 2}}}, "plugins.x: keys must be strings"),
        ({"listeners": {}}, "listeners: expected a list"),
        ({"listeners": []}, "listeners: at least one listener is required"),
        ({"listeners": ["tcp:1883"]}, "listeners[0]: expected a mapping"),
        ({"listeners": [{"name": "a"}, {"name": "b", "endpoint": 1883}]}, "listeners[1].endpoint: expected a string"),
        ({"listeners": [{"type": "udp"}]}, "listeners[0].type: must be one of tcp, tls, ws, wss"),
        ({"listeners": [{"name": ""}]}, "listeners[0].name: must not be empty"),
        ({"listeners": [{"endpoint": ""}]}, "listeners[0].endpoint: must not be empty"),
        ({"listeners": [{"max_packet_size": 0}]}, "listeners[0].max_packet_size: must be between"),
        ({"listeners": [{"max_connections": -1}]}, "listeners[0].max_connections: must be >= 0"),
        ({"listeners": [{"bogus": 1}]}, "listeners[0].bogus: unknown key"),
        ({"listeners": [{}, {}]}, "listeners[1].name: duplicate listener name 'tcp'"),
    ],
)
def test_errors_name_the_key(overrides, expected):
    message = error(overrides=overrides)
    assert message.startswith(expected), message


def test_error_from_file_names_the_key(tmp_path):
    path = write(tmp_path, "listeners:\n  - name: a\n  - name: b\n    endpoint: 1\n")
    assert error(path=path) == "listeners[1].endpoint: expected a string, got int"


def test_config_error_carries_key():
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, overrides={"mqtt": {"max_qos": 9}})
    assert info.value.key == "mqtt.max_qos"
    assert isinstance(info.value, TbmqError)


def test_synchronous_normalised_to_upper_case():
    config = load_config(environ={"TBMQ_STORAGE__SQLITE_SYNCHRONOUS": "normal"})
    assert config.storage.sqlite_synchronous == "NORMAL"


def test_config_hashable():
    assert hash(load_config(environ={})) == hash(Config())


def test_tune_gc_sets_the_young_threshold_and_the_middle_one_after_it():
    import gc  # noqa: PLC0415

    from tbmq.tap import tune_gc  # noqa: PLC0415

    before = gc.get_threshold()
    try:
        tune_gc(5000)  # the middle generation every 500,000 allocations
        assert gc.get_threshold() == (5000, 100, before[2])
        tune_gc(12345)  # rounded up
        assert gc.get_threshold() == (12345, 41, before[2])
        tune_gc(100000)  # never under Python's ratio, 10
        assert gc.get_threshold() == (100000, 10, before[2])
        tune_gc(0)  # keeps what is set
        assert gc.get_threshold() == (100000, 10, before[2])
    finally:
        gc.set_threshold(*before)


def test_tune_threads_sets_the_switch_interval():
    import sys  # noqa: PLC0415

    from tbmq.tap import tune_threads  # noqa: PLC0415

    before = sys.getswitchinterval()
    try:
        tune_threads(0.001)
        assert abs(sys.getswitchinterval() - 0.001) < 1e-9
        assert load_config(environ={}).node.switch_interval == 0.001
    finally:
        sys.setswitchinterval(before)


def test_log_level_drops_tbmq_events_below_it():
    from twisted.logger import Logger, globalLogPublisher  # noqa: PLC0415

    from tbmq.log import OBSERVER, set_log_level  # noqa: PLC0415

    seen: list = []
    globalLogPublisher.addObserver(seen.append)
    log = Logger(namespace="tbmq.test", observer=OBSERVER)
    try:
        log.debug("hidden {n}", n=1)
        log.info("shown {n}", n=2)
        set_log_level("debug")
        log.debug("shown {n}", n=3)
        set_log_level("warn")
        log.info("hidden {n}", n=4)
        log.warn("shown {n}", n=5)
        with pytest.raises(ValueError):
            set_log_level("chatty")
    finally:
        set_log_level("info")
        globalLogPublisher.removeObserver(seen.append)
    assert [e["n"] for e in seen if e.get("log_namespace") == "tbmq.test"] == [2, 3, 5]


def test_the_idle_fetch_interval_of_the_kafka_consumers_is_set_by_the_environment():
    """``kafka.idle_fetch_interval_ms``: 0 turns the idle mode off, a
    negative interval is refused with the key's path."""
    assert load_config(environ={}).kafka.idle_fetch_interval_ms == 100
    config = load_config(environ={"TBMQ_KAFKA__IDLE_FETCH_INTERVAL_MS": "1000"})
    assert config.kafka.idle_fetch_interval_ms == 1000
    assert load_config(environ={"TBMQ_KAFKA__IDLE_FETCH_INTERVAL_MS": "0"}
                       ).kafka.idle_fetch_interval_ms == 0
    assert "kafka.idle_fetch_interval_ms" in error(
        environ={"TBMQ_KAFKA__IDLE_FETCH_INTERVAL_MS": "-1"})


def test_the_fetch_min_bytes_of_the_kafka_consumers_is_set_by_the_environment():
    """``kafka.fetch_min_bytes``: 1 by default (a fetch answered as soon as a
    record is there), 0 refused with the key's path."""
    assert load_config(environ={}).kafka.fetch_min_bytes == 1
    config = load_config(environ={"TBMQ_KAFKA__FETCH_MIN_BYTES": "65536"})
    assert config.kafka.fetch_min_bytes == 65536
    assert "kafka.fetch_min_bytes" in error(environ={"TBMQ_KAFKA__FETCH_MIN_BYTES": "0"})
