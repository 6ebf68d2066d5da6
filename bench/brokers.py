"""Start and stop the brokers under test, each on a free loopback port, and
read their memory and CPU from ``/proc``.

* tbmq: ``twistd -n --pidfile= tbmq --listen tcp:PORT:interface=127.0.0.1
  --data-dir TMP`` with this checkout on ``PYTHONPATH`` (the embedded default:
  in-process bus, SQLite store);
* Mosquitto: Debian's ``/usr/sbin/mosquitto -c CONF`` with a minimal config;
* amqtt: the ``amqtt`` command of a private virtualenv under ``bench/out/``
  (created on first use with ``pip install amqtt``), minimal YAML config.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT = os.path.join(HERE, "out")
VENV = os.path.join(OUT, "venv")
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
CLK_TCK = os.sysconf("SC_CLK_TCK")

#: Mosquitto's config, beside the listener: everything else is the default
#: (max_inflight_messages 20, max_connections unlimited, no persistence)
MOSQUITTO_CONF = """\
listener {port} 127.0.0.1
allow_anonymous true
max_queued_messages 200000
log_dest stderr
log_type error
log_type warning
"""

AMQTT_CONF = """\
listeners:
  default:
    type: tcp
    bind: 127.0.0.1:{port}
plugins:
  amqtt.plugins.authentication.AnonymousAuthPlugin:
    allow_anonymous: {allow_anonymous}
"""


def tbmq_source(rev: str | None) -> str:
    """The tbmq source tree to run: this checkout's work tree (``rev`` None
    or ``worktree``), or a committed revision extracted once with ``git
    archive`` under ``bench/out/src-SHA`` (the work tree may be half-edited
    while a benchmark runs)."""
    if not rev or rev == "worktree":
        return REPO
    sha = subprocess.check_output(["git", "-C", REPO, "rev-parse", "--verify", rev + "^{commit}"],
                                  text=True).strip()
    dest = os.path.join(OUT, f"src-{sha[:12]}")
    if not os.path.exists(os.path.join(dest, "tbmq")):
        os.makedirs(dest, exist_ok=True)
        archive = subprocess.Popen(["git", "-C", REPO, "archive", sha], stdout=subprocess.PIPE)
        subprocess.check_call(["tar", "-x", "-C", dest], stdin=archive.stdout)
        archive.wait()
    return dest


def tree_pythonpath(src: str, rest: str | None = None) -> str:
    """The ``PYTHONPATH`` that runs the tree ``src``: its ``tbmq`` and its
    first-party plugins (``src/plugins``, the ``tbmq_plugins`` package:
    auth, Kafka, Redis, PostgreSQL), before ``rest`` (the inherited
    ``PYTHONPATH``, may be None). Without ``src/plugins`` a node imports the
    plugins of the installed (editable) checkout, not the tree's."""
    return os.pathsep.join([src, os.path.join(src, "plugins")] + ([rest] if rest else []))


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ensure_venv(packages=("amqtt", "py-spy")) -> str:
    """The private virtualenv for amqtt and py-spy (not the project's
    dependencies); created once."""
    py = os.path.join(VENV, "bin", "python")
    missing = [p for p in packages if not os.path.exists(os.path.join(VENV, "bin", p))]
    if not os.path.exists(py) or missing:
        os.makedirs(OUT, exist_ok=True)
        if not os.path.exists(py):
            subprocess.check_call([sys.executable, "-m", "venv", VENV])
        subprocess.check_call([py, "-m", "pip", "install", "-q", *packages])
    return VENV


def proc_rss_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in KiB."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


class RssSampler:
    """Polls a process's VmRSS every ``interval`` seconds in a daemon thread
    and keeps the peak since the last :meth:`reset` (VmHWM is the peak since
    the process started, startup included, and cannot be reset)."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_kb = 0
        self.last_kb = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rss, _ = proc_rss_kb(self.pid)
            except (OSError, ValueError):
                return  # the process is gone
            self.last_kb = rss
            self.samples += 1
            if rss > self.peak_kb:
                self.peak_kb = rss
            self._stop.wait(self.interval)

    def reset(self) -> None:
        """Start a new peak from the current RSS."""
        self.peak_kb = self.last_kb

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1)


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu_s(pid: int) -> dict[str, float]:
    """User + system CPU seconds of a process's threads by name: ``main``
    (the thread of the process id: the reactor), the others by their
    ``comm`` (librdkafka names its threads ``rdk:main``, ``rdk:broker1``...;
    Python's threads are all ``python``), summed per name."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        name = "main" if int(tid) == pid else head.split("(", 1)[1]
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def mqtt_probe(port: int, timeout: float = 2.0) -> bool:
    """True when a CONNECT gets a CONNACK."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"\x10\x11\x00\x04MQTT\x04\x02\x00\x3c\x00\x05probe")
            data = s.recv(4)
            ok = data[:1] == b"\x20"
            s.sendall(b"\xe0\x00")
            return ok
    except OSError:
        return False


def wait_node(proc: subprocess.Popen, port: int, tree: str, timeout: float,
              step: float) -> None:
    """Wait until the node ``proc`` (of ``tree``) answers a CONNECT on
    ``port`` (:func:`mqtt_probe`), polling every ``step`` seconds.

    :raises SystemExit: when the process ends or ``timeout`` seconds pass
        first."""
    deadline = time.monotonic() + timeout
    while not mqtt_probe(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{tree}: the node did not start")
        time.sleep(step)


class Broker:
    """A broker process on ``127.0.0.1:port``; use as a context manager."""

    name = "?"

    def __init__(self, extra_env: dict | None = None) -> None:
        self.port = free_port()
        self.host = "127.0.0.1"
        self.tmp = tempfile.mkdtemp(prefix=f"bench-{self.name}-", dir=OUT)
        self.proc: subprocess.Popen | None = None
        self.extra_env = extra_env or {}
        self.log_path = os.path.join(self.tmp, "broker.log")
        self.sampler: RssSampler | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict:
        env = dict(os.environ)
        env.update(self.extra_env)
        return env

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self, timeout: float = 30.0) -> "Broker":
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), cwd=self.tmp, env=self.env(), stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")
            if mqtt_probe(self.port):
                time.sleep(0.2)
                self.sampler = RssSampler(self.proc.pid)
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer on port {self.port} in {timeout}s: {self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_kb(self) -> tuple[int, int]:
        return proc_rss_kb(self.pid)

    def rss_peak_kb(self) -> int:
        """The peak VmRSS sampled (every 50 ms) since the start or the last
        :meth:`rss_reset`, and the current one: 0 before the start."""
        s = self.sampler
        if s is None:
            return 0
        try:
            rss, _ = self.rss_kb()
            s.peak_kb = max(s.peak_kb, rss)
        except OSError:
            pass
        return s.peak_kb

    def rss_reset(self) -> None:
        if self.sampler is not None:
            self.sampler.reset()

    def cpu_s(self) -> float:
        return proc_cpu_s(self.pid)

    def log_tail(self, n: int = 1500) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "Broker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.cleanup()


class Tbmq(Broker):
    name = "tbmq"

    def command(self) -> list[str]:
        # twistd through bench/tbmq_launch.py (no __main__ in twistd; a revision
        # under test sees only its own entry points)
        return [sys.executable, os.path.join(HERE, "tbmq_launch.py"), "-n", "--pidfile=", "tbmq",
                "--listen", f"tcp:{self.port}:interface=127.0.0.1",
                "--data-dir", os.path.join(self.tmp, "data")]

    def env(self) -> dict:
        env = super().env()
        src = os.environ.get("BENCH_TBMQ_SRC") or REPO
        env["PYTHONPATH"] = tree_pythonpath(src, env.get("PYTHONPATH"))
        return env

    @property
    def data_dir(self) -> str:
        return os.path.join(self.tmp, "data")

    def add_credentials(self, client_id: str, client_type: str) -> None:
        """``tbmq credentials add`` (of the tree) in the broker's credential
        store (SQLite in its data dir), before it starts: basic credentials
        of ``client_id``, no password (any is accepted), of ``client_type``
        (``DEVICE`` or ``APPLICATION``).

        :raises subprocess.CalledProcessError: when the command fails."""
        os.makedirs(self.data_dir, exist_ok=True)
        subprocess.run([sys.executable, "-m", "tbmq.cli", "credentials", "add", "--data-dir", self.data_dir,
                        "--type", "basic", "--name", client_id, "--client-id", client_id,
                        "--client-type", client_type],
                       env=self.env(), cwd=self.tmp, check=True, capture_output=True)


class Mosquitto(Broker):
    name = "mosquitto"

    def command(self) -> list[str]:
        conf = os.path.join(self.tmp, "mosquitto.conf")
        extra = os.environ.get("BENCH_MOSQUITTO_CONF", "").replace(";", "\n")
        with open(conf, "w") as f:
            f.write(MOSQUITTO_CONF.format(port=self.port) + extra + "\n")
        return [MOSQUITTO, "-c", conf]


class Amqtt(Broker):
    name = "amqtt"

    def command(self) -> list[str]:
        ensure_venv()
        conf = os.path.join(self.tmp, "amqtt.yaml")
        with open(conf, "w") as f:
            # allow_anonymous false: a client that sends a user name is let in
            # (no password check) as non-anonymous, which amqtt needs to queue
            # offline messages; set for the persistent scenario only
            f.write(AMQTT_CONF.format(port=self.port,
                                      allow_anonymous=self.extra_env.get("BENCH_AMQTT_ALLOW_ANONYMOUS", "true")))
        return [os.path.join(VENV, "bin", "amqtt"), "-c", conf]


class TreeTbmq(Tbmq):
    """tbmq of the source tree ``src``: the node imports that tree's
    ``tbmq`` and first-party plugins (:func:`tree_pythonpath`), not the
    installed checkout's.

    :param src: a tree from :func:`tbmq_source` (this checkout by default).
    """

    def __init__(self, extra_env: dict | None = None, src: str = REPO) -> None:
        self.src = src
        super().__init__(extra_env)

    def env(self) -> dict:
        env = Broker.env(self)
        env["PYTHONPATH"] = tree_pythonpath(self.src, env.get("PYTHONPATH"))
        env["BENCH_TBMQ_SRC"] = self.src  # tbmq_launch.py: only that tree's entry points
        return env


class TbmqAt(TreeTbmq):
    """tbmq of a committed revision (``tbmq@REV``), run beside the work
    tree's in the same run so that both meet the same machine.

    :param rev: a git revision of this repository, extracted once under
        ``bench/out/src-SHA`` (:func:`tbmq_source`).
    """

    def __init__(self, rev: str, extra_env: dict | None = None) -> None:
        self.name = f"tbmq@{rev}"
        super().__init__(extra_env, tbmq_source(rev))


def commit_of(src: str) -> str:
    """The commit tree ``src`` runs: a ``src-SHA`` extract's, or this
    checkout's HEAD, ``+dirty work tree`` when its ``tbmq`` or ``plugins``
    differ from it."""
    base = os.path.basename(src)
    if base.startswith("src-"):
        return base[4:]
    try:
        sha = subprocess.check_output(["git", "-C", src, "rev-parse", "--short=12", "HEAD"], text=True).strip()
        dirty = subprocess.call(["git", "-C", src, "diff", "--quiet", "HEAD", "--", "tbmq", "plugins"])
        return sha + ("+dirty work tree" if dirty else "")
    except Exception:
        return "?"


BROKERS = {"tbmq": Tbmq, "mosquitto": Mosquitto, "amqtt": Amqtt}

#: MQTT levels each broker speaks
LEVELS = {"tbmq": (4, 5), "mosquitto": (4, 5), "amqtt": (4,)}


def kind(name: str) -> str:
    """The broker kind of a ``--brokers`` name: ``tbmq@REV`` is a tbmq."""
    return name.split("@", 1)[0]


def known(name: str) -> bool:
    """Is ``name`` a broker :func:`make_broker` can start?"""
    return name in BROKERS or (kind(name) == "tbmq" and "@" in name)


def make_broker(name: str, extra_env: dict | None = None) -> Broker:
    """A broker of ``--brokers`` name ``name``: ``tbmq``, ``mosquitto``,
    ``amqtt``, or ``tbmq@REV`` (tbmq of git revision REV).

    :raises KeyError: for another name."""
    if name in BROKERS:
        return BROKERS[name](extra_env)
    if known(name):
        return TbmqAt(name.split("@", 1)[1], extra_env)
    raise KeyError(name)


def levels_of(name: str) -> tuple[int, ...]:
    """The MQTT levels broker ``name`` speaks."""
    return LEVELS[kind(name)]
