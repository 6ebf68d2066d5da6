"""The ``tbmq credentials`` command against a data directory (and against
PostgreSQL); the store's content is read back with the store itself.

Most tests run the command in this process (the ``cli`` fixture: the
parser, then :func:`tbmq.cli.execute` on the private reactor of
:func:`tests.postgres.reactor_thread`); a few run the real ``tbmq`` console
script in a subprocess (:func:`tbmq`), including one while a store — the
broker's — has the same file open."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from twisted.python.failure import Failure

from tbmq.auth.passwords import check_password, check_scram_password
from tbmq.backends.sqlite_credentials import FILE_NAME, SQLiteCredentialStore
from tbmq.cli import basic_credentials_id, build_parser, execute
from tbmq.model import ClientType, CredentialsType
from tests.postgres import Blocking, new_database

BIN = os.path.dirname(sys.executable)


def tbmq(*args: str, input: str | None = None, status: int = 0,
         script: bool = False) -> subprocess.CompletedProcess:
    """Run ``tbmq ARGS`` and check its exit status."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TBMQ_")}
    command = [os.path.join(BIN, "tbmq")] if script else [sys.executable, "-m", "tbmq.cli"]
    result = subprocess.run(command + list(args), input=input, capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    return result


@pytest.fixture
def cli(reactor_thread):
    """``cli(*argv, input=None, status=0)`` runs ``tbmq ARGV`` in this
    process, checks its exit status and returns ``(stdout, stderr)``."""

    def cli(*argv: str, input: str | None = None, status: int = 0) -> tuple[str, str]:
        out, err = io.StringIO(), io.StringIO()
        args = build_parser().parse_args(list(argv))
        stdin = sys.stdin
        if input is not None:
            sys.stdin = io.StringIO(input)
        try:
            code = reactor_thread.run(execute, args, out, err, reactor_thread.reactor)
        finally:
            sys.stdin = stdin
        assert code == status, (code, out.getvalue(), err.getvalue())
        return out.getvalue(), err.getvalue()

    return cli


@pytest.fixture(autouse=True)
def no_tbmq_environment(monkeypatch):
    for key in list(os.environ):
        if key.startswith("TBMQ_"):
            monkeypatch.delenv(key)


def fired(d: Any) -> Any:
    results: list = []
    d.addBoth(results.append)
    assert results, "the Deferred has not fired"
    if isinstance(results[0], Failure):
        results[0].raiseException()
    return results[0]


class SyncReactor:
    def callFromThread(self, f, *args, **kwargs):
        f(*args, **kwargs)


class SyncThreadPool:
    def callInThreadWithCallback(self, on_result, f, *args, **kwargs):
        try:
            result = f(*args, **kwargs)
        except BaseException:
            on_result(False, Failure())
        else:
            on_result(True, result)


def stored(data_dir: Any) -> dict:
    """:returns: name → record of the SQLite store in ``data_dir``."""
    store = SQLiteCredentialStore(os.path.join(str(data_dir), FILE_NAME),
                                  reactor=SyncReactor(), threadpool=SyncThreadPool())
    fired(store.start())
    try:
        return {c.name: c for c in fired(store.list())}
    finally:
        fired(store.stop())


@pytest.fixture
def data_dir(tmp_path):
    return str(tmp_path / "data")


def test_basic_credentials_id_follows_tbmq():
    assert basic_credentials_id("c", "u") == "mixed|c|u"
    assert basic_credentials_id(None, "u") == "username|u"
    assert basic_credentials_id("c", None) == "client_id|c"


def test_add_basic_with_rules(data_dir):
    out = tbmq("--data-dir", data_dir, "credentials", "add", "--type", "basic", "--name", "dev1",
               "--client-id", "c1", "--username", "u1", "--password", "s3cret",
               "--client-type", "application", "--pub", "sensors/${clientId}/.*", "--pub", "status",
               "--sub", "cmd/#", script=True).stdout
    assert "dev1" in out and "mixed|c1|u1" in out
    record = stored(data_dir)["dev1"]
    assert record.credentials_type is CredentialsType.MQTT_BASIC
    assert record.credentials_id == "mixed|c1|u1"
    assert record.client_type is ClientType.APPLICATION
    value = record.value
    assert (value["clientId"], value["userName"]) == ("c1", "u1")
    assert value["password"].startswith("$2b$10$") and check_password(b"s3cret", value["password"])
    assert value["authRules"] == {"pubAuthRulePatterns": ["sensors/${clientId}/.*", "status"],
                                  "subAuthRulePatterns": ["cmd/#"]}
    assert record.id in out


def test_add_basic_keys_and_password_stdin(data_dir, cli):
    cli("credentials", "add", "--data-dir", data_dir, "--type", "basic", "--name", "by-user",
        "--username", "alice", "--password-stdin", "--no-sub", input="from stdin\nignored\n")
    cli("credentials", "add", "--data-dir", data_dir, "--type", "basic", "--name", "by-client",
        "--client-id", "dev-7")
    records = stored(data_dir)
    user = records["by-user"]
    assert user.credentials_id == "username|alice"
    assert check_password(b"from stdin", user.value["password"])
    assert user.value["authRules"] == {"subAuthRulePatterns": []}
    client = records["by-client"]
    assert client.credentials_id == "client_id|dev-7"
    assert client.value == {"clientId": "dev-7", "userName": None, "password": None}
    assert client.client_type is ClientType.DEVICE
    err = (cli("--data-dir", data_dir, "credentials", "add", "--type", "basic", "--name", "x",
               status=2))[1]
    assert "--client-id" in err


def test_add_x509_and_scram(data_dir, cli):
    cli("--data-dir", data_dir, "credentials", "add", "--type", "x509", "--name", "certs",
        "--cn", "dev-[0-9]+", "--cn-regex", "--pub", "d/.*")
    cli("--data-dir", data_dir, "credentials", "add", "--type", "scram", "--name", "scram-bob",
        "--username", "bob", "--password", "pencil", "--algorithm", "sha512")
    records = stored(data_dir)
    cert = records["certs"]
    assert cert.credentials_type is CredentialsType.X_509
    assert cert.credentials_id == "dev-[0-9]+"
    assert cert.value == {"certCnPattern": "dev-[0-9]+", "certCnIsRegex": True,
                          "authRules": {"pubAuthRulePatterns": ["d/.*"]}}
    scram = records["scram-bob"]
    assert scram.credentials_type is CredentialsType.SCRAM
    assert scram.credentials_id == "scram|SHA512|bob"
    assert scram.value["userName"] == "bob" and scram.value["algorithm"] == "SHA512"
    assert scram.value["iterations"] == 4096
    assert check_scram_password("pencil", scram.value)
    err = (cli("--data-dir", data_dir, "credentials", "add", "--type", "x509", "--name", "bad",
               "--cn", "(", "--cn-regex", status=1))[1]
    assert "regex" in err
    err = (cli("--data-dir", data_dir, "credentials", "add", "--type", "scram", "--name", "np",
               "--username", "x", status=2))[1]
    assert "--password" in err
    cli("--data-dir", data_dir, "credentials", "add", "--type", "x509", "--name", "bad",
        "--cn", "x", "--username", "u", status=2)


def test_change_only_what_is_given(data_dir, cli):
    cli("--data-dir", data_dir, "credentials", "add", "--type", "basic", "--name", "dev",
        "--client-id", "c", "--username", "u", "--password", "one", "--pub", "a/.*")
    before = stored(data_dir)["dev"]
    cli("--data-dir", data_dir, "credentials", "change", "dev", "--sub", "s/#",
        "--client-type", "APPLICATION")
    after = stored(data_dir)["dev"]
    assert after.value["password"] == before.value["password"]
    assert after.value["authRules"] == {"pubAuthRulePatterns": ["a/.*"], "subAuthRulePatterns": ["s/#"]}
    assert after.client_type is ClientType.APPLICATION
    assert after.created_time == before.created_time and after.updated_time > before.updated_time
    # by id: new password, no username any more, publish unrestricted, renamed
    cli("--data-dir", data_dir, "credentials", "change", before.id, "--password", "two",
        "--username", "", "--any-pub", "--name", "dev-renamed")
    changed = stored(data_dir)["dev-renamed"]
    assert changed.id == before.id
    assert changed.credentials_id == "client_id|c"
    assert check_password(b"two", changed.value["password"])
    assert not check_password(b"one", changed.value["password"])
    assert changed.value["authRules"] == {"subAuthRulePatterns": ["s/#"]}
    cli("--data-dir", data_dir, "credentials", "change", "dev-renamed", "--no-password")
    assert stored(data_dir)["dev-renamed"].value["password"] is None
    err = (cli("--data-dir", data_dir, "credentials", "change", "nobody", "--sub", "x",
               status=1))[1]
    assert "nobody" in err
    cli("--data-dir", data_dir, "credentials", "change", "dev-renamed", "--cn", "x", status=2)


def test_change_scram_password_and_username(data_dir, cli):
    cli("--data-dir", data_dir, "credentials", "add", "--type", "scram", "--name", "s",
        "--username", "bob", "--password", "one")
    first = stored(data_dir)["s"]
    cli("--data-dir", data_dir, "credentials", "change", "s", "--username", "robert")
    renamed = stored(data_dir)["s"]
    assert renamed.credentials_id == "scram|SHA256|robert"
    assert renamed.value["storedKey"] == first.value["storedKey"]
    cli("--data-dir", data_dir, "credentials", "change", "s", "--algorithm", "SHA512", status=2)
    cli("--data-dir", data_dir, "credentials", "change", "s", "--algorithm", "SHA512",
        "--password", "two")
    changed = stored(data_dir)["s"]
    assert changed.credentials_id == "scram|SHA512|robert"
    assert check_scram_password("two", changed.value)


def test_conflicts_are_refused(data_dir, cli):
    cli("--data-dir", data_dir, "credentials", "add", "--type", "basic", "--name", "a",
        "--client-id", "c")
    err = (cli("--data-dir", data_dir, "credentials", "add", "--type", "basic", "--name", "a",
               "--client-id", "other", status=1))[1]
    assert "'a'" in err
    err = (cli("--data-dir", data_dir, "credentials", "add", "--type", "basic", "--name", "b",
               "--client-id", "c", status=1))[1]
    assert "client_id|c" in err
    err = (cli("--data-dir", data_dir, "credentials", "add", "--type", "basic", "--name", "b",
               "--client-id", "d", "--pub", "a/(", status=1))[1]
    assert "a/(" in err
    assert list(stored(data_dir)) == ["a"]


def test_list_show_remove(data_dir, cli):
    for name, client_id in (("zeta", "z"), ("alpha", "a")):
        cli("--data-dir", data_dir, "credentials", "add", "--type", "basic", "--name", name,
            "--client-id", client_id)
    lines = (cli("--data-dir", data_dir, "credentials", "list"))[0].splitlines()
    assert lines[0].split()[:2] == ["NAME", "TYPE"]
    assert [line.split()[0] for line in lines[1:]] == ["alpha", "zeta"]
    assert "client_id|a" in lines[1]
    listed = json.loads((cli("--data-dir", data_dir, "credentials", "list", "--json"))[0])
    assert [r["name"] for r in listed] == ["alpha", "zeta"]
    assert listed[0]["credentials_type"] == "MQTT_BASIC" and listed[0]["value"]["clientId"] == "a"
    assert json.loads((cli("--data-dir", data_dir, "credentials", "list", "--json", "--type",
                           "x509"))[0]) == []
    shown = json.loads((cli("--data-dir", data_dir, "credentials", "show", "zeta"))[0])
    assert shown["credentials_id"] == "client_id|z"
    out = (cli("--data-dir", data_dir, "credentials", "remove", "zeta"))[0]
    assert "zeta" in out
    cli("--data-dir", data_dir, "credentials", "remove", listed[0]["id"])
    assert stored(data_dir) == {}
    assert "no credentials" in (cli("--data-dir", data_dir, "credentials", "remove", "zeta",
                                    status=1))[1]


def test_config_file_finds_the_store(tmp_path, cli):
    data = tmp_path / "from-config"
    config = tmp_path / "tbmq.yml"
    config.write_text(f"data_dir: {data}\n")
    cli("--config", str(config), "credentials", "add", "--type", "basic", "--name", "n",
        "--client-id", "c")
    assert list(stored(data)) == ["n"]
    config.write_text("auth:\n  credentials: memory\n")
    assert "memory" in (cli("--config", str(config), "credentials", "list", status=2))[1]
    config.write_text("auth:\n  credentials: nosuch\n")
    assert "auth.credentials" in (cli("--config", str(config), "credentials", "list",
                                      status=2))[1]


def test_usage_errors_exit_2():
    parser = build_parser()
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["credentials", "add", "--name", "x"])  # no --type
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["credentials", "add", "--type", "basic", "--name", "x",
                           "--pub", "a", "--no-pub"])
    args = parser.parse_args(["--data-dir", "d", "credentials", "list"])
    assert args.data_dir == "d"
    args = parser.parse_args(["credentials", "list", "--data-dir", "e"])
    assert args.data_dir == "e"


def test_running_broker_sees_the_cli_changes(data_dir, reactor_thread):
    """The broker's store is open (its own thread, WAL) while the CLI
    writes; changed_since picks the change up."""
    store = Blocking(reactor_thread, SQLiteCredentialStore(
        os.path.join(data_dir, FILE_NAME), reactor=reactor_thread.reactor))
    store.start()
    try:
        _, _, version = store.changed_since(0)
        tbmq("--data-dir", data_dir, "credentials", "add", "--type", "basic", "--name", "live",
             "--username", "u", "--password", "p")
        changed, deleted, version = store.changed_since(version)
        assert [c.name for c in changed] == ["live"] and deleted == []
        tbmq("--data-dir", data_dir, "credentials", "remove", "live")
        assert store.changed_since(version) == ([], [changed[0].id], version + 1)
    finally:
        store.stop()


def test_postgres_store(postgres_dsn, tmp_path, cli, reactor_thread):
    from tbmq_plugins.postgres import PostgresCredentialStore

    dsn = new_database(postgres_dsn)
    config = tmp_path / "tbmq.yml"
    config.write_text(json.dumps({"auth": {"credentials": "postgres"},
                                  "postgres": {"dsn": dsn, "max_connections": 2}}))
    tbmq("--config", str(config), "credentials", "add", "--type", "basic", "--name", "pg",
         "--username", "u", "--password", "p", "--sub", "a/#")
    cli("--config", str(config), "credentials", "change", "pg", "--client-id", "c")
    listed = json.loads((cli("--config", str(config), "credentials", "list", "--json"))[0])
    assert [r["credentials_id"] for r in listed] == ["mixed|c|u"]
    store = Blocking(reactor_thread, PostgresCredentialStore(dsn, reactor=reactor_thread.reactor))
    store.start()
    try:
        record = store.find(CredentialsType.MQTT_BASIC, "mixed|c|u")
        assert record.name == "pg"
        assert check_password(b"p", record.value["password"])
        assert record.value["authRules"] == {"subAuthRulePatterns": ["a/#"]}
    finally:
        store.stop()
    cli("--config", str(config), "credentials", "remove", "pg")
    assert json.loads((cli("--config", str(config), "credentials", "list", "--json"))[0]) == []


# -- tbmq admin add: the password asked twice ---------------------------------------


class _Terminal(io.StringIO):
    """Standard input that is a terminal (getpass answers)."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("answers,status", [
    (["first-password-1", "first-password-1"], 0),
    (["first-password-1", "first-passw0rd-1"], 1),
], ids=["same", "different"])
def test_admin_add_asks_for_the_password_twice_on_a_terminal(monkeypatch, data_dir, answers,
                                                              status):
    from tbmq.auth.passwords import check_password  # noqa: PLC0415
    from tbmq.config import load_config  # noqa: PLC0415
    from tbmq.ops import cli as ops_cli  # noqa: PLC0415
    from tbmq.ops.admins import open_admin_store  # noqa: PLC0415

    asked = []
    given = iter(answers)
    monkeypatch.setattr(ops_cli.getpass, "getpass",
                        lambda prompt="": asked.append(prompt) or next(given))
    monkeypatch.setattr(sys, "stdin", _Terminal())
    args = build_parser().parse_args(["admin", "add", "alice", "--data-dir", data_dir,
                                      "--rounds", "4"])
    out, err = io.StringIO(), io.StringIO()
    assert ops_cli.execute(args, out, err) == status, err.getvalue()
    assert asked == ["password of alice: ", "the same password again: "]
    store = open_admin_store(load_config(None, environ={}, overrides={"data_dir": data_dir}))
    if status:
        assert "the two passwords differ" in err.getvalue()
        assert store.list_sync() == []  # nothing added
    else:
        assert "added admin user alice" in out.getvalue()
        _, hashed = store.password_of_sync("alice")
        assert check_password("first-password-1", hashed)


def test_admin_add_reads_a_piped_password_once(monkeypatch, data_dir):
    from tbmq.ops import cli as ops_cli  # noqa: PLC0415

    monkeypatch.setattr(ops_cli.getpass, "getpass", lambda prompt="": pytest.fail("asked"))
    monkeypatch.setattr(sys, "stdin", io.StringIO("piped-password-1\n"))
    args = build_parser().parse_args(["admin", "add", "bob", "--data-dir", data_dir,
                                      "--rounds", "4", "--password-stdin"])
    out, err = io.StringIO(), io.StringIO()
    assert ops_cli.execute(args, out, err) == 0, err.getvalue()
    assert "added admin user bob" in out.getvalue()
