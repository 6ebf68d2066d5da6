"""README.md as a reader runs it: every fenced shell block, in order, on real
nodes, so a command of the README that stops working fails the suite.

Each shell block is known by its section (the ``## `` heading up to a
colon) and its number within the section; :data:`STEPS` says what the test
does with each, and :func:`test_every_shell_block_has_a_step` fails for a
block that has no step (a new block needs one) or a step whose block is
gone.  The blocks are read from README.md when the test runs, never copied.

How a block is run (:class:`Reader`):

* in a fresh folder of its own per test (the reader's checkout: ``./data``,
  ``twistd.pid``, ``cluster.yml``... land there), by ``bash`` with ``set -e
  -o pipefail``, in the environment of this test run, which stands for the
  README's ``. .venv/bin/activate``: ``twistd``, ``tbmq``, ``pip`` and
  ``tbmq-analytics`` are those of the interpreter running the tests, and
  ``PYTHONPATH`` holds this checkout (the editable install's caveat);
* with the README's ports moved to free ones (:data:`PORTS`: 1883, 1884,
  1885, 8083, 19092, 16379, 5432), a ``tcp:PORT`` endpoint also bound to
  127.0.0.1; the default listener (``tcp:1883`` in the config) is moved by
  ``TBMQ_LISTENERS__0__ENDPOINT`` and the mosquitto clients' default port
  by their own options files (``$XDG_CONFIG_HOME/mosquitto_pub``);
* ``sudo`` runs its command as it is (the tests run as root, as CI does,
  where ``.ci/run`` does the same); ``service postgresql start`` is
  answered by the test's own PostgreSQL (:mod:`tests.postgres`), already
  running on a free port that ``PGHOST``/``PGPORT`` name for ``psql``;
  ``xdg-open URL`` fetches the page and prints its status and start;
* a block whose last command runs a node in the foreground (``twistd -n``)
  is a *server*: it runs in a second shell, as the reader's first terminal,
  until the test sends it SIGINT (Ctrl-C) and checks that it stopped
  cleanly.

Install lines are verified, not run (:func:`verify_install`):
``apt-get install PKG...``: each package is installed (``dpkg-query``);
``python3 -m venv``: Python's ``venv`` and ``ensurepip`` are there;
``. .venv/bin/activate``: the commands the README uses resolve to this
run's environment; ``pip install SPEC...``: a path is a directory of this
repository with a ``setup.py``, each ``[extra]`` exists in ``setup.py``
and each of its requirements is installed, a name is an installed
distribution.  The README's test command (``<!-- test-command -->``) is
not run here: :func:`test_ci_extracts_the_test_command` checks that
``.ci/run`` still finds it.

:func:`test_paths_and_links_stay_in_the_repository` checks that every
relative link and every file path the README names exists in the
repository and that none points outside it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

from tbmq.auth.rules import AuthorizationRules
from tbmq.mqtt import Property
from tests.integration.helpers import HOST, REPO_ROOT, RawClient, free_port

README = REPO_ROOT / "README.md"

#: the README's ports, moved to free ones
PORTS = (1883, 1884, 1885, 8083, 19092, 16379, 5432)

#: what the test does with each shell block: (section, number) -> how
STEPS = {
    ("Run it", 1): "installs: verified",
    ("Run it", 2): "server: the first node, on ./data and twistd.pid",
    ("Run it", 3): "run: the mosquitto clients print the two messages",
    ("Run it", 4): "server: a second node in the same folder, with --pidfile=",
    ("Run it", 5): "run: a node in the background, stopped with its pid file",
    ("Configuration", 1): "server: its CONNACK announces the maximum packet size",
    ("Authentication and authorization", 1): "run: credentials added, listed, changed, "
                                             "removed, without a warning",
    ("Plugins", 1): "installs: verified (tests/integration/test_auth_e2e.py installs it)",
    ("Cluster", 1): "installs: verified",
    ("Cluster", 2): "run: Tansu, Redis, the role and database on the test's PostgreSQL",
    ("Cluster", 3): "run: three nodes in the background",
    ("Cluster", 4): "run: a persistent session across the nodes",
    ("Cluster", 5): "run: the nodes stopped, then Tansu and Redis",
    ("Operations", 1): "server: an admin user, a node with the HTTP endpoint",
    ("Operations", 2): "run: the console page fetched; the admin logs in to the API",
    ("Blocked clients and unauthorized clients", 1): "run: on the Operations node, three "
                                                     "entries added, listed, one removed",
    ("Analytics", 1): "server: a node with the event log, Run it's clients, Ctrl-C",
    ("Analytics", 2): "installs verified, then the report made from the node's events",
}

SHELLS = ("", "sh", "bash", "shell", "console")
#: fenced blocks that are not shell
OTHER_LANGUAGES = ("yaml",)

INSTALL = re.compile(r"^(sudo )?apt-get |^pip install |^python3 -m venv |^\. \.venv/bin/activate$")


# -- reading the README ------------------------------------------------------------------


@dataclass
class Block:
    section: str
    number: int
    line: int
    info: str
    text: str
    test_command: bool

    @property
    def key(self) -> tuple[str, int]:
        return (self.section, self.number)


def fenced_blocks(text: str) -> list[Block]:
    """:returns: every fenced block of ``text``; shell blocks are numbered
    within their section."""
    blocks: list[Block] = []
    section, counts, previous = "", {}, ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].split(":")[0].strip()
        elif line.startswith("```"):
            info = line[3:].strip()
            start = i
            body = []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            number = 0
            if info in SHELLS:
                number = counts[section] = counts.get(section, 0) + 1
            blocks.append(Block(section, number, start + 1, info, "\n".join(body) + "\n",
                                previous.strip() == "<!-- test-command -->"))
        if line.strip():
            previous = line
        i += 1
    return blocks


def shell_blocks() -> dict[tuple[str, int], Block]:
    return {b.key: b for b in fenced_blocks(README.read_text()) if b.info in SHELLS}


def block(key: tuple[str, int]) -> Block:
    assert key in STEPS, f"{key} has no step in STEPS"
    blocks = shell_blocks()
    assert key in blocks, f"README.md has no shell block {key} any more"
    return blocks[key]


def logical_lines(text: str) -> list[tuple[str, bool]]:
    """:returns: ``(line, is_command)`` per line, continuation lines joined;
    the lines of a here-document are not commands."""
    out: list[tuple[str, bool]] = []
    heredoc = None
    pending = ""
    for line in text.splitlines():
        if heredoc is not None:
            out.append((line, False))
            if line.strip() == heredoc:
                heredoc = None
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        line, pending = pending + line, ""
        out.append((line, True))
        match = re.search(r"<<-?\s*'?\"?(\w+)", line)
        if match:
            heredoc = match.group(1)
    return out


def split_installs(text: str) -> tuple[list[str], str]:
    """:returns: the install lines of a block, and the rest to run."""
    installs, rest = [], []
    for line, command in logical_lines(text):
        if command and INSTALL.match(line.strip()):
            installs.append(line.strip())
        else:
            rest.append(line)
    return installs, "\n".join(rest).strip() + "\n" if any(r.strip() for r in rest) else ""


# -- verifying install lines ---------------------------------------------------------------


def setup_extras() -> dict[str, list[str]]:
    """:returns: ``extras_require`` of setup.py, read without running it."""
    tree = ast.parse((REPO_ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "extras_require":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no extras_require")


def installed(requirement: str) -> bool:
    name = re.split(r"[<>=!~\[;\s]", requirement, maxsplit=1)[0]
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def verify_install(line: str, env: dict) -> None:
    """Check what an install line would install is there (see the module
    docstring); fail naming the line."""
    words = shlex.split(line)
    if words[0] == "sudo":
        words = words[1:]
    if words[0] == "apt-get":
        assert words[1] in ("install", "update"), line
        for package in (w for w in words[2:] if not w.startswith("-")):
            status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                                    capture_output=True, text=True)
            assert status.stdout == "install ok installed", f"{line}: {package} is not installed"
    elif words[:3] == ["python3", "-m", "venv"]:
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
        subprocess.run([python, "-c", "import venv, ensurepip"], check=True)
    elif words[0] == ".":
        bindir = os.path.dirname(sys.executable)
        for command in ("twistd", "tbmq", "tbmq-analytics", "pip", "python"):
            found = shutil.which(command, path=env["PATH"])
            assert found and os.path.dirname(found) == bindir, (line, command, found)
    else:
        assert words[:2] == ["pip", "install"], line
        extras = setup_extras()
        for spec in (w for w in words[2:] if not w.startswith("-")):
            if not spec.startswith("."):
                assert installed(spec), f"{line}: {spec} is not installed"
                continue
            path, _, wanted = spec.partition("[")
            directory = (REPO_ROOT / path).resolve()
            assert directory.is_relative_to(REPO_ROOT), f"{line}: {path} is outside"
            assert (directory / "setup.py").is_file(), f"{line}: {path} has no setup.py"
            for extra in filter(None, wanted.rstrip("]").split(",")):
                assert extra in extras, f"{line}: setup.py has no extra {extra!r}"
                missing = [r for r in extras[extra] if not installed(r)]
                assert not missing, f"{line}: {extra}'s {missing} not installed"


# -- running blocks ------------------------------------------------------------------------


PRELUDE_ROOT = "sudo() { \"$@\"; }\n"
PRELUDE_USER = ('sudo() { "$@"; }\n'
                'runuser() { while [ "$1" != "--" ]; do shift; done; shift; '
                'PGUSER=postgres "$@"; }\n')
PRELUDE = r"""set -e -o pipefail
service() {
  if [ "$*" = "postgresql start" ]; then echo "(PostgreSQL runs already, port $PGPORT)"
  else echo "service $*: not expected by tests/integration/test_readme.py" >&2; return 1; fi
}
xdg-open() {
  python -c 'import sys, urllib.request
r = urllib.request.urlopen(sys.argv[1], timeout=10)
print(r.status, r.headers.get_content_type()); print(r.read(300).decode())' "$1"
}
"""


class Reader:
    """A reader's checkout folder and shells, with the ports of
    :data:`PORTS` moved to free ones (``ports[1883]`` ...).

    :param folder: the folder the blocks run in.
    :param env: more environment variables (``PGPORT`` ...).
    """

    def __init__(self, folder: Path, env: dict | None = None) -> None:
        self.folder = folder
        self.ports: dict[int, int] = {}
        for port in PORTS:
            moved = free_port()
            while moved in self.ports.values():
                moved = free_port()
            self.ports[port] = moved
        # this reader's own files beside the folder: logs, the clients' options
        self.home = xdg = folder.parent / f"reader-{self.ports[1883]}"
        xdg.mkdir()
        for client in ("mosquitto_pub", "mosquitto_sub"):
            (xdg / client).write_text(f"-h {HOST}\n-p {self.ports[1883]}\n")
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("TBMQ_", "PG", "XDG_"))}
        self.env = dict(base, **(env or {}))
        self.env.update(
            PATH=os.path.dirname(sys.executable) + os.pathsep + base.get("PATH", ""),
            VIRTUAL_ENV=sys.prefix,
            PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "plugins")]),
            PYTHONUNBUFFERED="1", XDG_CONFIG_HOME=str(xdg),
            TBMQ_LISTENERS__0__ENDPOINT=f"tcp:{self.ports[1883]}:interface={HOST}")
        self.prelude = PRELUDE + (PRELUDE_ROOT if os.geteuid() == 0 else PRELUDE_USER)
        self.servers: list[subprocess.Popen] = []
        self.runs = 0

    def localize(self, text: str) -> str:
        """The block with its ports moved, ``tcp:PORT`` endpoints on 127.0.0.1."""
        numbers = "|".join(map(str, PORTS))
        text = re.sub(rf"(?<![\d.])({numbers})(?!\d)",
                      lambda m: str(self.ports[int(m.group(1))]), text)
        moved = "|".join(str(p) for p in self.ports.values())
        return re.sub(rf"\btcp:({moved})(?![\d:])", rf"tcp:\1:interface={HOST}", text)

    def script(self, key) -> str:
        installs, rest = split_installs(block(key).text)
        for line in installs:
            verify_install(line, self.env)
        return self.localize(rest)

    def _log(self, name: str) -> Path:
        self.runs += 1
        return self.home / f"{self.runs:02d}-{name}.log"

    def run(self, key, stdin: str = "", timeout: float = 120.0) -> str:
        """Run block ``key`` to its end; fail unless it exits 0.

        :returns: what it printed (standard output and error)."""
        text = self.script(key)
        log = self._log("run")
        with open(log, "w") as out:
            proc = subprocess.Popen(["bash", "-c", self.prelude + text], cwd=self.folder,
                                    env=self.env, stdin=subprocess.PIPE, stdout=out,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            try:
                proc.communicate(stdin, timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        printed = log.read_text(errors="replace")
        assert proc.returncode == 0, (f"README block {key} exited with {proc.returncode}:\n"
                                      f"{text}\n--- it printed:\n{printed}")
        return printed

    def serve(self, key, *ports: int, stdin: str = "") -> "Server":
        """Start server block ``key`` in a shell of its own; wait until it
        listens on each of the README's ``ports`` (moved)."""
        text = self.script(key)
        assert re.search(r"(^|\n)[^\n]*twistd -n[^\n]*\n$", text), f"{key} is no server block"
        log = self._log("server")
        out = open(log, "w")
        proc = subprocess.Popen(["bash", "-c", self.prelude + text], cwd=self.folder,
                                env=self.env, stdin=subprocess.PIPE, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        out.close()
        proc.stdin.write(stdin)
        proc.stdin.close()
        self.servers.append(proc)
        server = Server(key, proc, log)
        for port in ports:
            server.wait_port(self.ports[port])
        return server

    def wait_gone(self, *pid_files: str, timeout: float = 60.0) -> None:
        """Wait until twistd removed each pid file (its process exited)."""
        deadline = time.monotonic() + timeout
        while any((self.folder / name).exists() for name in pid_files):
            assert time.monotonic() < deadline, f"still there after {timeout} s: {pid_files}"
            time.sleep(0.2)

    def clean_up(self) -> None:
        """Kill what the blocks started and left running: the servers'
        process groups, and the processes of the pid files in the folder."""
        for proc in self.servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for path in self.folder.glob("*.pid"):
            try:
                os.kill(int(path.read_text().strip()), signal.SIGKILL)
            except (ValueError, ProcessLookupError):
                pass


class Server:
    """A server block running in its own shell."""

    def __init__(self, key, proc: subprocess.Popen, log: Path) -> None:
        self.key, self.proc, self.log = key, proc, log

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_port(self, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, (f"README block {self.key} exited with "
                                              f"{self.proc.returncode}:\n{self.output()}")
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                return
            except OSError:
                assert time.monotonic() < deadline, (f"README block {self.key}: nothing "
                                                     f"listens on {port}:\n{self.output()}")
                time.sleep(0.1)

    def interrupt(self, timeout: float = 30.0) -> str:
        """Ctrl-C: SIGINT to its shell's process group; fail unless the
        node shut down cleanly (twistd then ends by the signal it got, and
        so does its shell).

        :returns: what it printed."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.key} did not stop on SIGINT:\n{self.output()}")
        assert self.proc.returncode in (0, -signal.SIGINT), (
            self.key, self.proc.returncode, self.output())
        assert "Server Shut Down." in self.output()
        return self.output()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """The reader's folder, one for the whole module: the tests follow the
    README's order in it, as a reader does (a file one section leaves
    behind can trouble the next)."""
    folder = tmp_path_factory.mktemp("readme") / "checkout"
    folder.mkdir()
    return folder


@pytest.fixture
def reader(checkout):
    """A :class:`Reader` in the reader's folder; what it left running is
    killed."""
    made = Reader(checkout)
    yield made
    made.clean_up()


def connack_0(port: int, timeout: float = 90.0) -> None:
    """Wait until a node on ``port`` accepts an MQTT connection (a cluster
    node answers 0x88 until it has joined)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client = RawClient(port, level=4)
            try:
                if client.connect().reason_code == 0:
                    return
            finally:
                client.close()
        except (OSError, AssertionError):
            pass
        assert time.monotonic() < deadline, f"no node accepts clients on {port}"
        time.sleep(0.5)


# -- the steps -----------------------------------------------------------------------------


def test_every_shell_block_has_a_step():
    blocks = [b for b in fenced_blocks(README.read_text())]
    assert {b.info for b in blocks} <= set(SHELLS) | set(OTHER_LANGUAGES), (
        "a fenced block of a language the docs test does not know")
    commands = [b for b in blocks if b.test_command]
    assert len(commands) == 1 and commands[0].key == ("Test it", 1)
    keys = {b.key for b in blocks if b.info in SHELLS and not b.test_command}
    assert keys == set(STEPS), (f"shell blocks without a step: {keys - set(STEPS)}; "
                                f"steps without a block: {set(STEPS) - keys}")


def test_run_it(reader):
    """Run it: install (verified), the first node, the mosquitto clients, a
    second node in the same folder (--pidfile=), a node in the background
    stopped with its pid file; a second plain ``twistd -n tbmq`` in the
    folder fails on the pid file, as the README says."""
    for line in split_installs(block(("Run it", 1)).text)[0]:
        verify_install(line, reader.env)
    assert split_installs(block(("Run it", 1)).text)[1] == ""
    first = reader.serve(("Run it", 2), 1883)
    assert (reader.folder / "twistd.pid").exists() and (reader.folder / "data").is_dir()
    printed = reader.run(("Run it", 3))
    assert "sensors/s1/temperature 21.5\nsensors/s2/temperature 19.0\n" in printed, printed
    # the README's premise: a second node with the default pid file is refused
    clash = subprocess.run(["twistd", "-n", "tbmq", "--listen", f"tcp:{free_port()}:interface={HOST}",
                            "--data-dir", "other"], cwd=reader.folder, env=reader.env,
                           capture_output=True, text=True, timeout=60)
    assert clash.returncode != 0 and "Another twistd server is running" in clash.stdout + clash.stderr
    second = reader.serve(("Run it", 4), 1884)
    assert (reader.folder / "data2").is_dir()
    reader.run(("Run it", 5))
    reader.wait_gone("background.pid")
    assert "Server Shut Down." in (reader.folder / "background.log").read_text()
    second.interrupt()
    first.interrupt()
    assert not (reader.folder / "twistd.pid").exists()


def test_configuration(reader):
    """Configuration: the environment sets the listener and the maximum
    packet size, which a v5 CONNACK announces."""
    node = reader.serve(("Configuration", 1), 1884)
    client = RawClient(reader.ports[1884], level=5)
    try:
        connack = client.connect()
        assert connack.reason_code == 0
        assert connack.properties[Property.MAXIMUM_PACKET_SIZE] == 65536
    finally:
        client.close()
    node.interrupt()


def test_credentials(reader):
    """Authentication and authorization: the credentials commands run as
    written, print no warning (the rules are regular expressions), and
    sensor-1's subscribe rule allows ``commands/sensor-1/reboot``."""
    printed = reader.run(("Authentication and authorization", 1))
    assert "warning" not in printed, printed
    for line in ("added sensor-1", "added fleet", "added app", "changed sensor-1",
                 "removed fleet"):
        assert line in printed, printed
    show = subprocess.run(["tbmq", "credentials", "show", "sensor-1"], cwd=reader.folder,
                          env=reader.env, capture_output=True, text=True, timeout=60, check=True)
    rules = AuthorizationRules.from_value(json.loads(show.stdout)["value"]["authRules"])
    bound = rules.bind("sensor-1", "s1")
    assert bound.may_subscribe("commands/sensor-1/reboot")
    assert bound.may_subscribe("commands/sensor-1/#")
    assert not bound.may_subscribe("commands/sensor-2/reboot")


def test_plugins(reader):
    installs, rest = split_installs(block(("Plugins", 1)).text)
    assert installs and rest == ""
    for line in installs:
        verify_install(line, reader.env)


def test_cluster(checkout, postgres_dsn):
    """Cluster: Tansu, Redis, the role and database on PostgreSQL, three
    nodes, a persistent session across them, everything stopped."""
    import psycopg2  # noqa: PLC0415
    from psycopg2.extensions import make_dsn, parse_dsn  # noqa: PLC0415

    server = parse_dsn(postgres_dsn)
    folder = checkout
    reader = Reader(folder, env={"PGHOST": server["host"], "PGPORT": server["port"]})
    reader.ports[5432] = int(server["port"])
    admin = make_dsn(postgres_dsn, dbname="postgres")
    try:
        assert split_installs(block(("Cluster", 1)).text)[1] == ""
        reader.script(("Cluster", 1))  # verifies its install lines
        printed = reader.run(("Cluster", 2))
        assert "CREATE ROLE" in printed and "CREATE DATABASE" in printed, printed
        reader.run(("Cluster", 3), timeout=60)
        for port in (1883, 1884, 1885):
            connack_0(reader.ports[port])
        printed = reader.run(("Cluster", 4), timeout=60)
        assert printed.endswith("sensors/s1/temperature 21.5\n"), printed
        reader.run(("Cluster", 5), timeout=90)
        for name in ("tansu.pid", "redis.pid"):
            path = folder / name
            if path.exists():  # redis-server removes its pid file as it exits
                pid = int(path.read_text())
                deadline = time.monotonic() + 30
                while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert not os.path.exists(f"/proc/{pid}"), f"{name}: {pid} still runs"
    finally:
        reader.clean_up()
        conn = psycopg2.connect(admin)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS tbmq WITH (FORCE)")
            cur.execute("DROP ROLE IF EXISTS tbmq")
        conn.close()


def test_operations(reader):
    """Operations: ``tbmq admin add`` asks for the password (given on its
    standard input), the node serves the console, and the admin logs in;
    then "Blocked clients" adds, lists and removes entries through it."""
    node = reader.serve(("Operations", 1), 1883, 8083, stdin="pw-alice\npw-alice\n")
    printed = reader.run(("Operations", 2))
    assert printed.startswith("200 text/html"), printed
    request = urllib.request.Request(
        f"http://{HOST}:{reader.ports[8083]}/api/auth/login", method="POST",
        data=json.dumps({"username": "alice", "password": "pw-alice"}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200 and json.loads(answer.read())["token"]
    printed = reader.run(("Blocked clients and unauthorized clients", 1))
    assert "blocked client_id evil-device (ed3776c39efd8182)" in printed, printed
    listed = [line.split()[:3] for line in printed.splitlines() if line.startswith("ed37")]
    assert listed == [["ed3776c39efd8182", "client_id", "evil-device"]], printed
    assert printed.rstrip().endswith("removed ed3776c39efd8182"), printed
    node.interrupt()


def test_analytics(reader):
    """Analytics: a node with the event log, Run it's clients, Ctrl-C, then
    the report of its events."""
    node = reader.serve(("Analytics", 1), 1883)
    assert "sensors/s2/temperature 19.0" in reader.run(("Run it", 3))
    node.interrupt()
    assert any((reader.folder / "data" / "events").glob("events-*.jsonl*"))
    reader.run(("Analytics", 2), timeout=600)
    html = (reader.folder / "report" / "report.html").read_text()
    assert "sensors" in html
    with open(reader.folder / "report" / "csv" / "traffic_by_topic.csv") as f:
        assert "sensors/s1/temperature" in f.read()


# -- the README's files and the CI's test command --------------------------------------


def repository_files() -> set[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True,
                            text=True, check=True).stdout.split("\n")
    return {name for name in listed if name}


def mentioned_paths(text: str) -> tuple[list[str], list[str]]:
    """:returns: the link targets of ``text`` (not URLs), and the paths it
    names in code spans and shell blocks that start with a top-level entry
    of the repository (``tbmq/...``, ``docs/...``, ``setup.py``)."""
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", text)
             if not re.match(r"[a-z]+://|mailto:|#", t)]
    top = {name.split("/")[0] for name in repository_files()}
    words = re.findall(r"`([^`\n]+)`", text)
    for b in fenced_blocks(text):
        words += b.text.split()
    paths = []
    for word in words:
        for token in word.split():
            token = token.strip("'\"(),;:")
            token = token[2:] if token.startswith("./") else token
            first = token.split("/")[0]
            if token.startswith("../") or (first in top and ("/" in token or "." in first)):
                paths.append(token)
    return links, paths


@pytest.mark.parametrize("document", ["README.md", "docs/architecture.md"])
def test_paths_and_links_stay_in_the_repository(document):
    """Every relative link and every repository path the document names
    exists in the repository (``git ls-files``), and none points outside it
    (the README once pointed at ``../shared/ARCHITECTURE.md``)."""
    files = repository_files()
    directories = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    links, paths = mentioned_paths((REPO_ROOT / document).read_text())
    if document == "README.md":
        assert "docs/architecture.md" in links
        assert "etc/tbmq.yml" in paths and "plugins/examples/tbmq-example-plugin" in paths
    base = os.path.dirname(document)
    for target in links + paths:
        path = target.split("#")[0].rstrip("/")
        assert not path.startswith(("/", "../")) and "/../" not in path, (
            f"{document} points outside the repository: {target}")
        if target in links:  # relative to the document
            path = os.path.normpath(os.path.join(base, path))
        assert path in files or path in directories, f"{document} names a missing file: {target}"


def test_ci_extracts_the_test_command():
    """``.ci/run`` reads the command between ``<!-- test-command -->`` and
    the next fence: run its own extraction (the awk program) on README.md."""
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    program = re.search(r"cmd=\$\(awk '([^']+)' README\.md\)", ci).group(1)
    extracted = subprocess.run(["awk", program, "README.md"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout
    (command,) = [b for b in fenced_blocks(README.read_text()) if b.test_command]
    assert extracted == command.text
    assert extracted.count("\n") == 1 and "python -m pytest" in extracted
    assert ". .venv/bin/activate" in extracted and "'.[test]'" in extracted
