"""The integrations' buffer, retries and matching (tbmq.integrations), on a
fake clock with a target the test answers by hand."""

from __future__ import annotations

import json

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock

from tbmq.config import load_config
from tbmq.errors import ConfigError
from tbmq.integrations.core import Integration, Rejected, Target
from tbmq.integrations.http import json_body
from tbmq.integrations.plugin import Integrations
from tbmq.integrations.settings import IntegrationConfig
from tbmq.model import Message
from tbmq.mqtt import Property


class HandTarget(Target):
    """Each send waits until the test answers it."""

    def __init__(self) -> None:
        super().__init__(None, None)
        self.sends: list[tuple[Message, defer.Deferred]] = []

    def send(self, message):
        d = defer.Deferred()
        self.sends.append((message, d))
        return d

    def answer(self, i: int, error: Exception | None = None) -> None:
        d = self.sends[i][1]
        if error is None:
            d.callback(None)
        else:
            d.errback(error)

    def topics(self) -> list[str]:
        return [m.topic for m, _ in self.sends]


def make(**settings) -> tuple[Integration, HandTarget, Clock]:
    defaults = {"name": "i", "type": "http", "topic_filters": ("t/#",),
                "url": "http://127.0.0.1:1/"}
    defaults.update(settings)
    clock, target = Clock(), HandTarget()
    integration = Integration(IntegrationConfig(**defaults), target, clock)
    integration.start()
    return integration, target, clock


def msg(topic: str, payload: bytes = b"x") -> Message:
    return Message(topic, payload, 1, False, {}, "c1", 1700000000.5)


def test_retry_with_back_off_keeps_order_and_counts():
    integration, target, clock = make(concurrency=1, retry_initial=1.0, retry_max=3.0)
    for i in range(3):
        integration.offer(msg(f"t/{i}"))
    assert target.topics() == ["t/0"]  # one in flight at a time
    target.answer(0, ConnectionError("refused"))
    assert integration.depth == 3 and integration.retried == 0
    # back-off 1, 2, then 3 s (the maximum): nothing is sent while it runs
    for n, delay in enumerate((1.0, 2.0, 3.0), start=1):
        clock.advance(delay - 0.01)
        assert len(target.sends) == n
        clock.advance(0.01)
        assert target.topics()[n] == "t/0"  # the failed message goes first
        if n < 3:
            target.answer(n, ConnectionError("refused"))
    target.answer(3)  # back: the rest follow in order
    target.answer(4)
    target.answer(5)
    assert target.topics()[-3:] == ["t/0", "t/1", "t/2"]
    assert (integration.sent, integration.retried, integration.failed) == (3, 3, 0)
    assert integration.depth == 0 and integration.depth_bytes == 0


def test_full_buffer_drops_new_messages_and_rejected_is_not_retried():
    integration, target, clock = make(concurrency=2, buffer_messages=3, timeout=1000.0)
    for i in range(5):
        integration.offer(msg(f"t/{i}"))
    assert integration.dropped == 2 and integration.depth == 3
    assert target.topics() == ["t/0", "t/1"]
    target.answer(0, Rejected("HTTP 400"))
    assert integration.failed == 1 and integration.depth == 2
    assert target.topics() == ["t/0", "t/1", "t/2"]
    clock.advance(100)
    assert len(target.sends) == 3  # nothing retried
    target.answer(1)
    target.answer(2)
    assert (integration.sent, integration.failed, integration.dropped) == (2, 1, 2)


def test_bytes_bound_and_timeout_retries():
    integration, target, clock = make(concurrency=1, buffer_bytes=2048, timeout=5.0,
                                      retry_initial=0.5)
    assert integration.offer(msg("t/a", b"a" * 2000))
    assert not integration.offer(msg("t/b", b"b" * 100))  # 2100 > 2048 bytes
    clock.advance(5.0)  # no answer within the timeout: sent again after 0.5 s
    assert target.sends[0][1].called
    clock.advance(0.5)
    assert len(target.sends) == 2
    target.answer(1)
    assert (integration.sent, integration.retried, integration.dropped) == (1, 1, 1)
    assert integration.snapshot()["last_error"] == "no answer within 5 s"


def test_plugin_offers_each_matching_integration_once():
    config = load_config(environ={}, overrides={"integrations": [
        {"name": "a", "type": "http", "url": "http://127.0.0.1:1/",
         "topic_filters": ["s/#", "s/+/t", "s/1/t"]},
        {"name": "b", "type": "http", "url": "http://127.0.0.1:1/", "topic_filters": ["x/#"]},
        {"name": "off", "type": "http", "url": "http://127.0.0.1:1/", "topic_filters": ["#"],
         "enabled": False}]})
    plugin = Integrations(config, Clock())
    for integration in plugin.integrations.values():
        integration.target = HandTarget()
    for topic in ("s/1/t", "x/y", "other"):
        plugin.hook.tbmq_message_published(None, msg(topic))
    depths = {i["name"]: i["buffer_messages"] for i in plugin.snapshot()}
    assert depths == {"a": 1, "b": 1, "off": 0}


def test_default_json_body():
    message = Message("t/1", b"\xff\x00", 1, True,
                      {Property.USER_PROPERTY: [("k", "v"), ("k", "w")]}, "dev-1", 1700000000.25)
    body = json.loads(json_body(message))
    assert body == {"topic": "t/1", "payload": "/wA=", "payload_encoding": "base64", "qos": 1,
                    "retain": True, "client_id": "dev-1",
                    "user_properties": [["k", "v"], ["k", "w"]], "timestamp": 1700000000250}
    text = json.loads(json_body(Message("t", "héllo".encode(), 0, False, {}, "c", 1.0)))
    assert text["payload"] == "héllo" and "payload_encoding" not in text


@pytest.mark.parametrize("entry, problem", [
    ({"name": "h", "type": "http", "topic_filters": ["a/#"]}, "integrations[0].url"),
    ({"name": "h", "type": "http", "url": "http://x/", "topic_filters": []},
     "integrations[0].topic_filters: at least one"),
    ({"name": "h", "type": "http", "url": "http://x/", "topic_filters": ["a/#/b"]},
     "integrations[0].topic_filters[0]"),
    ({"name": "k", "type": "kafka", "topic_filters": ["a"]}, "integrations[0].topic"),
    ({"name": "m", "type": "mqtt", "topic_filters": ["a"], "host": "h", "qos": 2},
     "integrations[0].qos: must be 0 or 1"),
    ({"name": "m", "type": "smtp", "topic_filters": ["a"]}, "integrations[0].type"),
    ({"name": "m", "type": "http", "url": "http://x/", "topic_filters": ["a"], "colour": 1},
     "integrations[0].colour: unknown key"),
])
def test_config_errors_name_the_key(entry, problem):
    with pytest.raises(ConfigError) as e:
        load_config(environ={}, overrides={"integrations": [entry]})
    assert str(e.value).startswith(problem), str(e.value)


def test_duplicate_names_are_refused():
    entry = {"name": "h", "type": "http", "url": "http://x/", "topic_filters": ["a"]}
    with pytest.raises(ConfigError, match=r"integrations\[1\].name: duplicate"):
        load_config(environ={}, overrides={"integrations": [entry, entry]})


def test_the_commented_example_of_etc_tbmq_yml_is_a_valid_config():
    import pathlib

    import yaml

    text = (pathlib.Path(__file__).parents[2] / "etc" / "tbmq.yml").read_text()
    block = text[text.index("# integrations:"):text.index("\nintegrations: []")]
    example = yaml.safe_load("\n".join(line[2:] for line in block.splitlines()))
    config = load_config(environ={}, overrides=example)
    assert [(i.name, i.type) for i in config.integrations] == [
        ("web", "http"), ("to-kafka", "kafka"), ("upstream", "mqtt")]
    assert config.integrations[2].topic_prefix == "site-1/"


class Record:
    def __init__(self, key, value) -> None:
        self.key, self.value = key, value


def test_records_of_the_api_topic_add_replace_and_remove_and_the_hook_comes_with_the_first():
    from tbmq.plugins import make_plugin_manager

    config = load_config(environ={}, overrides={"integrations": [
        {"name": "file", "type": "http", "url": "http://127.0.0.1:1/", "topic_filters": ["f/#"],
         "enabled": False}]})
    plugins = make_plugin_manager(config)
    plugin = Integrations(config, Clock(), plugins)
    refreshed = []
    plugin.refresh_hooks = lambda: refreshed.append(1)
    # a disabled integration alone: nobody implements tbmq_message_published
    assert not plugins.hook.tbmq_message_published.get_hookimpls()
    entry = {"name": "api", "type": "http", "url": "http://127.0.0.1:1/", "topic_filters": ["a/#"]}
    plugin._on_record(Record("api", json.dumps(entry).encode()))
    assert plugins.hook.tbmq_message_published.get_hookimpls() and refreshed == [1]
    plugin.integrations["api"].target = HandTarget()
    plugin.offer(msg("a/1"))
    assert plugin.integrations["api"].depth == 1
    entry["topic_filters"] = ["b/#"]  # replaced: the old filters no longer match
    plugin._on_record(Record("api", json.dumps(entry).encode()))
    plugin.integrations["api"].target = HandTarget()
    plugin.offer(msg("a/2"))
    plugin.offer(msg("b/1"))
    assert plugin.integrations["api"].depth == 1
    plugin._on_record(Record("file", json.dumps(entry | {"name": "file"}).encode()))
    assert plugin.integrations["file"].config.topic_filters == ("f/#",)  # the file wins
    plugin._on_record(Record("bad", b'{"name": "bad", "type": "http"}'))
    assert "bad" not in plugin.integrations  # logged, not applied
    plugin._on_record(Record("api", b""))
    assert sorted(plugin.integrations) == ["file"]
    assert [item["source"] for item in plugin.snapshot()] == ["config"]
