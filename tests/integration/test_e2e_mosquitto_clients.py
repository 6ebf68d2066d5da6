"""End to end with Debian's ``mosquitto_sub`` / ``mosquitto_pub``
(mosquitto-clients 2.0) against the real broker.

``mosquitto_sub -d`` prints "received SUBACK" once subscribed, so the
publisher starts only then; its output (line-buffered with ``stdbuf -oL``)
is read line by line on a thread.
"""

from __future__ import annotations

import queue
import shutil
import subprocess
import threading
import time

import pytest

from tests.integration.helpers import HOST, TIMEOUT, uid

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not (shutil.which("mosquitto_sub") and shutil.which("mosquitto_pub")),
                       reason="mosquitto-clients not installed"),
    pytest.mark.skipif(not shutil.which("stdbuf"), reason="stdbuf (coreutils) not installed"),
]

VERSIONS = ["mqttv31", "mqttv311", "mqttv5"]


class Sub:
    """A running ``mosquitto_sub -d -v`` whose output lines are queued."""

    def __init__(self, port: int, *args: str) -> None:
        self.cmd = ["mosquitto_sub", "-h", HOST, "-p", str(port), "-d", "-v", *args]
        # its stdout is block-buffered on a pipe: make it line-buffered
        self.proc = subprocess.Popen(["stdbuf", "-oL", *self.cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, errors="replace")
        self.lines: "queue.Queue[str | None]" = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, predicate, timeout: float = TIMEOUT) -> str:
        """The first line (from now) satisfying ``predicate``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                line = ""
                if left <= 0:
                    raise AssertionError(f"{self.cmd}: expected line not seen in {timeout} s; "
                                         f"output: {self.seen}") from None
                continue
            if line is None:
                raise AssertionError(f"{self.cmd} exited ({self.proc.poll()}); output: {self.seen}")
            self.seen.append(line)
            if predicate(line):
                return line

    def wait_subscribed(self) -> None:
        self.wait_line(lambda line: "received SUBACK" in line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def sub(broker):
    subs: list[Sub] = []

    def make(*args: str) -> Sub:
        s = Sub(broker.port, *args)
        subs.append(s)
        return s

    yield make
    for s in subs:
        s.close()


def pub(port: int, *args: str) -> str:
    """Run ``mosquitto_pub``; fail on a non-zero exit."""
    cmd = ["mosquitto_pub", "-h", HOST, "-p", str(port), "-d", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT * 2)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


def publish_line(line: str, topic: str) -> bool:
    """mosquitto_sub -d prints 'Client ... received PUBLISH (d0, q1, r0, m1, 'topic', ...'."""
    return "received PUBLISH" in line and f"'{topic}'" in line


def test_sub_all_pub_one(broker, sub):
    """``mosquitto_sub -t '#' -v`` + ``mosquitto_pub -t a/b -m hi``."""
    topic = f"{uid()}/a/b"
    s = sub("-t", "#")
    s.wait_subscribed()
    pub(broker.port, "-t", topic, "-m", "hi")
    s.wait_line(lambda line: line == f"{topic} hi")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_versions_and_qos(broker, sub, version, qos):
    topic = f"{uid()}/a/b"
    s = sub("-V", version, "-q", str(qos), "-t", topic)
    s.wait_subscribed()
    out = pub(broker.port, "-V", version, "-q", str(qos), "-t", topic, "-m", f"hi {qos}")
    if qos == 1:
        assert "received PUBACK" in out
    elif qos == 2:
        assert "received PUBREC" in out and "received PUBCOMP" in out
    header = s.wait_line(lambda line: publish_line(line, topic))
    assert f"q{qos}," in header and "r0," in header
    s.wait_line(lambda line: line == f"{topic} hi {qos}")


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_retained(broker, sub, version):
    topic = f"{uid()}/retained"
    pub(broker.port, "-V", version, "-q", "1", "-r", "-t", topic, "-m", "kept")
    s = sub("-V", version, "-q", "1", "-t", topic)
    header = s.wait_line(lambda line: publish_line(line, topic))
    assert "r1," in header
    s.wait_line(lambda line: line == f"{topic} kept")
    s.close()

    # -n -r: an empty retained message clears it
    pub(broker.port, "-V", version, "-q", "1", "-r", "-n", "-t", topic)
    s2 = sub("-V", version, "-q", "1", "-t", topic)
    s2.wait_subscribed()
    pub(broker.port, "-V", version, "-q", "1", "-t", topic, "-m", "marker")
    line = s2.wait_line(lambda line: line.startswith(f"{topic} "))
    assert line == f"{topic} marker"


def test_count_and_exit(broker):
    """``mosquitto_sub -C 1`` exits after the retained message it gets."""
    topic = f"{uid()}/count"
    pub(broker.port, "-q", "1", "-r", "-t", topic, "-m", "once")
    done = subprocess.run(["mosquitto_sub", "-h", HOST, "-p", str(broker.port), "-t", topic,
                           "-C", "1", "-W", "10", "-v"],
                          capture_output=True, text=True, timeout=TIMEOUT * 2)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{topic} once"
    pub(broker.port, "-q", "1", "-r", "-n", "-t", topic)


def test_v5_user_properties(broker, sub):
    topic = f"{uid()}/props"
    s = sub("-V", "mqttv5", "-t", topic, "-F", "%t %p %P")
    s.wait_subscribed()
    pub(broker.port, "-V", "mqttv5", "-t", topic, "-m", "hi",
        "-D", "publish", "user-property", "k", "v")
    s.wait_line(lambda line: line == f"{topic} hi k:v")
