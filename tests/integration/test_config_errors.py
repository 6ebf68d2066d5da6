"""A bad configuration stops ``twistd tbmq`` and ``tbmq`` with one line on
standard error naming the key path, and exit status 2, never a traceback
(issue 12, item 8)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.helpers import REPO_ROOT, TWISTD


def run(command: list[str], tmp_path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TBMQ_")}
    environ["PYTHONPATH"] = str(REPO_ROOT)
    environ["TBMQ_DATA_DIR"] = str(tmp_path / "data")
    environ.update(env)
    return subprocess.run(command, cwd=tmp_path, env=environ, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def twistd(*args: str) -> list[str]:
    return [sys.executable, "-c", TWISTD, "-n", "--pidfile=", "tbmq", *args]


def tbmq(*args: str) -> list[str]:
    return [sys.executable, "-m", "tbmq.cli", *args, "credentials", "list"]


def assert_one_line(result: subprocess.CompletedProcess, expected: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.splitlines() == [f"tbmq: {expected}"], result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("command", [twistd, tbmq], ids=["twistd", "tbmq"])
def test_unknown_key_in_the_file(tmp_path, command):
    path = tmp_path / "tbmq.yml"
    path.write_text("dashboard:\n  port: 8080\n")
    assert_one_line(run(command("--config", str(path)), tmp_path), "dashboard: unknown key")


@pytest.mark.parametrize("command", [twistd, tbmq], ids=["twistd", "tbmq"])
def test_bad_value_names_the_key_path(tmp_path, command):
    path = tmp_path / "tbmq.yml"
    path.write_text("listeners:\n  - {name: a, endpoint: 5}\n")
    assert_one_line(run(command("--config", str(path)), tmp_path),
                    "listeners[0].endpoint: expected a string, got int")


@pytest.mark.parametrize("command", [twistd, tbmq], ids=["twistd", "tbmq"])
def test_invalid_yaml_is_one_line(tmp_path, command):
    path = tmp_path / "tbmq.yml"
    path.write_text("mqtt: [\n  a: 1\n")
    result = run(command("--config", str(path)), tmp_path)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"tbmq: {path}: invalid YAML: line 3, column 1: ")


@pytest.mark.parametrize("command", [twistd, tbmq], ids=["twistd", "tbmq"])
def test_bad_environment_variable(tmp_path, command):
    result = run(command(), tmp_path, TBMQ_MQTT__MAX_QOS="3")
    assert_one_line(result, "mqtt.max_qos: must be 0, 1 or 2 (from TBMQ_MQTT__MAX_QOS)")


def test_a_backend_no_plugin_provides(tmp_path):
    assert_one_line(run(twistd(), tmp_path, TBMQ_BUS="nope"),
                    "bus: no plugin provides the bus 'nope'")
