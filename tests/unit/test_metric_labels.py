"""The label values of the labelled counters are known before the first
event: every drop reason the node counts and every reason code it refuses
an authentication with is listed where it is defined, and each has its
zero from the start; ``--listen`` listeners are named by their endpoint."""

from __future__ import annotations

import re
from pathlib import Path

from tbmq.auth import AUTH_FAILURE_CODES, AuthResult
from tbmq.broker.hooks import DROP_REASONS, DropCounter
from tbmq.mqtt.constants import ReasonCode
from tbmq.ops.stats import NodeStats
from tbmq.tap import Options, config_from_options
from tests.helpers import Harness

ROOT = Path(__file__).resolve().parents[2]


def _sources(*folders: str) -> str:
    return "\n".join(path.read_text() for folder in folders
                     for path in sorted((ROOT / folder).rglob("*.py"))
                     if "analytics" not in path.parts)  # its generator makes up events


def test_every_drop_reason_counted_is_listed_and_every_listed_one_is_counted():
    calls = r'(?:\.drop|drops\.add|self\.add)\(\s*"([a-z0-9_]+)"'
    counted = set(re.findall(calls, _sources("tbmq")))
    assert counted == set(DROP_REASONS)
    assert len(DROP_REASONS) == len(set(DROP_REASONS))


def test_the_drop_counter_starts_with_every_reason_at_zero():
    drops = DropCounter()
    assert drops.counts == dict.fromkeys(DROP_REASONS, 0)
    drops.add("expired", 2)
    assert drops.counts["expired"] == 2 and sum(drops.counts.values()) == 2


def test_every_refusal_code_of_the_providers_is_listed():
    refusals = r"AuthResult\(\s*False[^)]*reason_code=(?:ReasonCode\.(\w+)|(0x[0-9A-Fa-f]+))"
    found = re.findall(refusals, _sources("tbmq", "plugins"))
    assert len(found) > 5
    codes = {ReasonCode[name] if name else int(raw, 16) for name, raw in found}
    codes.add(AuthResult(False).reason_code)
    codes.add(ReasonCode.BAD_AUTHENTICATION_METHOD)  # an enhanced authentication nobody took
    assert codes == set(AUTH_FAILURE_CODES)


def test_the_node_starts_with_every_refusal_code_at_zero():
    stats = NodeStats(Harness().broker.view)
    assert dict(stats.auth_failures) == {int(code): 0 for code in AUTH_FAILURE_CODES}
    assert stats.snapshot()["node"]["authentication_failures"] == 0
    assert set(stats.dropped()) == set(DROP_REASONS)


def test_listen_options_name_their_listener_by_the_endpoint():
    options = Options()
    options.parseOptions(["--listen", "tcp:1884:interface=127.0.0.1",
                          "--listen", "tcp:1885:interface=127.0.0.1"])
    config = config_from_options(options)
    assert [(lc.name, lc.endpoint) for lc in config.listeners] == [
        ("tcp:1884:interface=127.0.0.1", "tcp:1884:interface=127.0.0.1"),
        ("tcp:1885:interface=127.0.0.1", "tcp:1885:interface=127.0.0.1")]
    # in the node list and heartbeats: the endpoint once, not name=endpoint
    assert [lc.label for lc in config.listeners] == [
        "tcp:1884:interface=127.0.0.1", "tcp:1885:interface=127.0.0.1"]
