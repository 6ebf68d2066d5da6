"""A bad configuration stops ``twistd tbmq`` and ``tbmq`` with one line on
standard error naming the key path, and exit status 2, never a traceback
(issue 12, item 8); a node that cannot listen stops with one line and exit
status 1; ``TBMQ_*`` variables that are not overrides stop nothing (issue
23)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.integration.helpers import HOST, REPO_ROOT, TWISTD, Broker, free_port


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


def assert_one_line(result: subprocess.CompletedProcess, expected: str, status: int = 2) -> None:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
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


# -- TBMQ_* variables that are no config overrides (issue 23) ------------------------

#: the ``tbmq`` CLI's own variables, and a deployment tool's
NOT_OVERRIDES = {"TBMQ_ADMIN_USER": "admin", "TBMQ_ADMIN_PASSWORD": "secret",
                 "TBMQ_ADMIN_TOKEN": "t0k3n", "TBMQ_VERSION": "1.0", "TBMQ_HOME": "/opt/tbmq"}


def test_the_cli_variables_do_not_stop_twistd(tmp_path):
    with Broker(tmp_path, env=NOT_OVERRIDES) as b:
        assert b.running
    assert "unknown key" not in b.log()


def test_credentials_list_with_the_admin_password_set(tmp_path):
    result = run(tbmq(), tmp_path, **NOT_OVERRIDES)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stderr == ""


def test_a_top_level_key_is_still_an_override(tmp_path):
    """``TBMQ_BUS`` names the top-level key ``bus``: still read (and here
    refused, no plugin provides it) next to the variables that are not."""
    assert_one_line(run(twistd(), tmp_path, TBMQ_BUS="nope", **NOT_OVERRIDES),
                    "bus: no plugin provides the bus 'nope'")


def test_a_mistyped_key_in_a_section_is_still_an_error(tmp_path):
    assert_one_line(run(twistd(), tmp_path, TBMQ_MQTT__MAX_QOSS="1", **NOT_OVERRIDES),
                    "mqtt.max_qoss: unknown key (from TBMQ_MQTT__MAX_QOSS)")


# -- start-up failures: one line, a non-zero status (issue 23) -----------------------


def test_an_invalid_listen_endpoint(tmp_path):
    assert_one_line(run(twistd("--listen", "tcp:abc"), tmp_path),
                    "listeners[0].endpoint: invalid endpoint 'tcp:abc': "
                    "invalid literal for int() with base 10: 'abc'")


@pytest.fixture
def busy_port():
    """A loopback port some other socket listens on."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_listen_address_in_use(tmp_path, busy_port):
    endpoint = f"tcp:{busy_port}:interface={HOST}"
    result = run(twistd("--listen", endpoint), tmp_path)
    message = f"cannot listen on {endpoint}: address already in use (listeners[0].endpoint)"
    assert_one_line(result, message, status=1)
    assert f"tbmq could not start: {message}" in result.stdout  # the log


def test_an_http_address_in_use_once_the_reactor_runs(tmp_path, busy_port):
    """The HTTP listener binds after the broker has started: the node
    stops its reactor and the process still exits with status 1."""
    result = run(twistd("--listen", f"tcp:{free_port()}:interface={HOST}"), tmp_path,
                 TBMQ_HTTP__ENDPOINT=f"tcp:{busy_port}")
    message = f"cannot listen on tcp:{busy_port}: address already in use (http.endpoint)"
    assert_one_line(result, message, status=1)
    assert "Main loop terminated" in result.stdout  # stopped by the node, not killed


def test_a_daemonized_twistd_reports_an_address_in_use(tmp_path, busy_port):
    endpoint = f"tcp:{busy_port}:interface={HOST}"
    command = [sys.executable, "-c", TWISTD, f"--pidfile={tmp_path / 'tbmq.pid'}",
               f"--logfile={tmp_path / 'tbmq.log'}", "tbmq", "--listen", endpoint]
    result = run(command, tmp_path)
    assert result.returncode == 1, (result.stdout, result.stderr)
    # twistd's parent prints the first 100 bytes the daemon reported
    assert f"StartupError: cannot listen on {endpoint}: address already in use" \
        in result.stderr
    assert ("tbmq could not start: cannot listen on "
            f"{endpoint}: address already in use (listeners[0].endpoint)"
            in (tmp_path / "tbmq.log").read_text())
    assert not (tmp_path / "tbmq.pid").exists()


# -- what the log says of the plugins (issue 23) ---------------------------------------


def test_the_embedded_node_logs_what_each_plugin_serves(tmp_path):
    with Broker(tmp_path, env={"TBMQ_AUTH__PROVIDERS": "[basic]"}) as b:
        log = b.log()
    assert ("plugin active: embedded (bus memory; retained store sqlite; "
            "device store sqlite; credentials sqlite)") in log
    for name in ("kafka", "postgres", "redis"):
        assert f"plugin loaded, unused: {name} (provides nothing this config uses)" in log
        assert f"plugin active: {name}" not in log
    for name in ("jwt", "scram", "x509"):
        assert f"plugin disabled: {name} (not in auth.providers)" in log
        assert f"plugin active: {name}" not in log
