"""Authentication and authorization end to end: the real broker with the
providers loaded through their entry points, credentials managed with the
``tbmq credentials`` command while it runs, and real clients (paho-mqtt
3.1.1 and 5.0, a raw MQTT 5 client doing SCRAM, TLS clients with
certificates from :mod:`tests.certs`)."""

from __future__ import annotations

import collections
import os
import ssl
import statistics
import subprocess
import sys
import threading
import time

import jwt
import pytest
import scramp
import yaml

from tbmq.mqtt import Auth, Connack, Connect, Property, Puback, Publish
from tests.integration.helpers import (
    HOST, REPO_ROOT, TIMEOUT, ListenersBroker, PahoClient, RawClient, free_port, uid,
)

SECRET = "e2e-secret-key-0123456789abcdef0123"
REFRESH = 0.3  # auth.refresh_interval of the broker under test, seconds


def cli(data_dir, *args: str, stdin: str | None = None) -> str:
    """Run ``tbmq credentials ...`` against the broker's data directory."""
    proc = subprocess.run(
        [sys.executable, "-m", "tbmq.cli", "credentials", *args, "--data-dir", str(data_dir)],
        input=stdin, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout


@pytest.fixture(scope="module")
def broker(tmp_path_factory, pki):
    workdir = tmp_path_factory.mktemp("auth")
    ports = {"tcp": free_port(), "tls": free_port()}
    config = {
        "listeners": [
            {"name": "tcp", "type": "tcp", "endpoint": f"tcp:{ports['tcp']}:interface={HOST}"},
            {"name": "tls", "type": "tls", "endpoint": f"tcp:{ports['tls']}:interface={HOST}",
             "tls_cert": str(pki.server.chain_path), "tls_key": str(pki.server.key_path),
             "tls_ca": str(pki.ca.cert_path), "tls_client_auth": "required"},
        ],
        "storage": {"backend": "memory"},
        "auth": {"allow_anonymous": False, "refresh_interval": REFRESH,
                 "jwt": {"secret": SECRET, "algorithms": ["HS256"]}},
    }
    path = workdir / "tbmq.yml"
    path.write_text(yaml.safe_dump(config))
    b = ListenersBroker(workdir, path, ports)
    b.data_dir.mkdir(parents=True, exist_ok=True)
    cli(b.data_dir, "add", "--type", "basic", "--name", "dev", "--username", "dev",
        "--password", "right", "--rounds", "4", "--pub", "dev/${clientId}/.*", "--sub", "cmd/.*")
    cli(b.data_dir, "add", "--type", "basic", "--name", "app", "--username", "app",
        "--password", "apppw", "--rounds", "4", "--client-type", "APPLICATION")
    cli(b.data_dir, "add", "--type", "x509", "--name", "cert", "--cn", "client",
        "--pub", "x509/.*", "--any-sub")
    cli(b.data_dir, "add", "--type", "scram", "--name", "scram", "--username", "scrammer",
        "--password", "pencil", "--algorithm", "SHA512")
    with b:
        yield b


def paho(broker, version, username=None, password=None, client_id=None, expect_rc=0):
    c = PahoClient(broker.ports["tcp"], version, client_id)
    if username is not None:
        c.client.username_pw_set(username, password)
    c.connect_and_wait(expect_rc=expect_rc)
    return c


@pytest.fixture
def clients():
    made = []
    yield made
    for c in made:
        c.close()


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_basic_password(broker, clients, version):
    clients.append(paho(broker, version, "dev", "right"))
    clients.append(paho(broker, version, "dev", "wrong", expect_rc=0x86))
    # an unknown user gets what a wrong password gets: no user name is revealed
    clients.append(paho(broker, version, "nobody", "x", expect_rc=0x86))


def test_v311_return_codes_on_the_wire(broker):
    raw = RawClient(broker.ports["tcp"], level=4)
    assert raw.connect(username="dev", password=b"wrong") == Connack(False, 0x04)
    raw = RawClient(broker.ports["tcp"], level=4)
    assert raw.connect(username="nobody", password=b"x") == Connack(False, 0x04)


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_acl_allow_and_deny(broker, clients, version):
    cid = f"d{uid()}"
    dev = paho(broker, version, "dev", "right", client_id=cid)
    app = paho(broker, 5, "app", "apppw")
    clients += [dev, app]
    assert app.subscribe("dev/#", 1) == [1]
    assert dev.subscribe(f"cmd/{cid}", 1) == [1]
    assert dev.subscribe("secret/#", 1) == [0x87 if version == 5 else 0x80]
    dev.publish(f"dev/{cid}/t", b"allowed", 1)
    dev.publish("dev/other/t", b"denied", 1)
    dev.publish(f"dev/{cid}/t", b"after", 1)
    got = [m.payload for m in app.get_many(2)]
    assert got == [b"allowed", b"after"]
    app.assert_empty()


def test_rule_changed_while_connected(broker, clients):
    cid = f"d{uid()}"
    raw = RawClient(broker.ports["tcp"], level=5)
    assert raw.connect(client_id=cid, username="dev", password=b"right").reason_code == 0
    raw.send(Publish(f"dev/{cid}/a", b"1", qos=1, packet_id=1))
    assert raw.expect() == Puback(1)
    cli(broker.data_dir, "change", "dev", "--pub", "other/.*")
    try:
        deadline = time.monotonic() + TIMEOUT
        pid = 2
        while True:  # the change is picked up within auth.refresh_interval
            raw.send(Publish(f"dev/{cid}/a", b"2", qos=1, packet_id=pid))
            ack = raw.expect()
            if ack.reason_code == 0x87:
                break
            assert time.monotonic() < deadline, "the changed rule never applied"
            time.sleep(REFRESH / 3)
            pid += 1
        raw.send(Publish("other/x", b"3", qos=1, packet_id=pid + 1))
        assert raw.expect() == Puback(pid + 1)
    finally:
        cli(broker.data_dir, "change", "dev", "--pub", "dev/${clientId}/.*")


@pytest.fixture(scope="module")
def anonymous_broker(tmp_path_factory):
    """A broker with anonymous access on (the default) and basic
    credentials of the three kinds: client id and user name
    (``sensor-1``/``s1``), user name only (``u2``), client id only (``c3``)."""
    workdir = tmp_path_factory.mktemp("anonymous")
    port = free_port()
    config = {"listeners": [{"name": "tcp", "type": "tcp",
                             "endpoint": f"tcp:{port}:interface={HOST}"}],
              "storage": {"backend": "memory"},
              "auth": {"allow_anonymous": True, "refresh_interval": REFRESH}}
    path = workdir / "tbmq.yml"
    path.write_text(yaml.safe_dump(config))
    b = ListenersBroker(workdir, path, {"tcp": port})
    b.data_dir.mkdir(parents=True, exist_ok=True)
    cli(b.data_dir, "add", "--type", "basic", "--name", "sensor-1", "--client-id", "sensor-1",
        "--username", "s1", "--password", "right", "--rounds", "4",
        "--pub", "sensors/${clientId}/.*", "--sub", "commands/${clientId}/.*")
    cli(b.data_dir, "add", "--type", "basic", "--name", "u2", "--username", "u2",
        "--password", "right", "--rounds", "4")
    cli(b.data_dir, "add", "--type", "basic", "--name", "c3", "--client-id", "c3",
        "--password", "right", "--rounds", "4")
    with b:
        yield b


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_refused_credentials_do_not_fall_back_to_anonymous(anonymous_broker, clients, version):
    """With anonymous access on, a client that presented credentials that
    were refused gets CONNACK 0x86 (v3.1.1: 0x04), as Mosquitto does with a
    password file and ``allow_anonymous true``; only a client that matches
    no credentials at all is let in anonymously."""
    b = anonymous_broker

    def connect(client_id, username=None, password=None, expect_rc=0):
        clients.append(paho(b, version, username, password, client_id=client_id,
                            expect_rc=expect_rc))
        return clients[-1]

    # credentials with a client id and a user name: both must match
    sensor = connect("sensor-1", "s1", "right")
    assert sensor.subscribe("commands/sensor-1/reboot", 1) == [1]  # the README's rule
    connect("sensor-1", "s1", "wrong", expect_rc=0x86)
    connect(f"other-{uid()}", "s1", "wrong", expect_rc=0x86)
    connect(f"other-{uid()}", "s1", "right", expect_rc=0x86)  # right user name, other client id
    connect("sensor-1", expect_rc=0x87)  # its client id without a user name: not anonymous
    # a user name only: any client id, the password checked
    connect(f"any-{uid()}", "u2", "right")
    connect(f"any-{uid()}", "u2", "wrong", expect_rc=0x86)
    # a client id only: any user name, the password checked
    connect("c3", "whoever", "right")
    connect("c3", "whoever", "wrong", expect_rc=0x86)
    connect("c3", expect_rc=0x86)  # no password at all
    # no credentials match: anonymous
    connect(f"anon-{uid()}", "nobody", "x")
    connect(f"anon-{uid()}")


def test_new_credentials_reserve_their_names_at_once(anonymous_broker, clients):
    """A user name that credentials added while the broker runs name (with a
    client id) is no longer let in anonymously under another client id; once
    they are removed it is again."""
    b = anonymous_broker
    name = f"late-{uid()}"
    clients.append(paho(b, 5, name, "x", client_id=f"a-{uid()}"))  # unknown: anonymous
    cli(b.data_dir, "add", "--type", "basic", "--name", name, "--client-id", f"dev-{name}",
        "--username", name, "--password", "pw", "--rounds", "4")
    clients.append(paho(b, 5, name, "pw", client_id=f"a-{uid()}", expect_rc=0x86))
    clients.append(paho(b, 5, name, "pw", client_id=f"dev-{name}"))
    cli(b.data_dir, "remove", name)
    clients.append(paho(b, 5, name, "pw", client_id=f"a-{uid()}"))


def test_scram_sha512_from_a_v5_client(broker):
    for password, expected in (("pencil", 0), ("wrong", 0x86)):
        client = scramp.ScramClient(["SCRAM-SHA-512"], "scrammer", password)
        raw = RawClient(broker.ports["tcp"], level=5)
        raw.send(Connect(protocol_level=5, client_id=f"s{uid()}", properties={
            Property.AUTHENTICATION_METHOD: "SCRAM-SHA-512",
            Property.AUTHENTICATION_DATA: client.get_client_first().encode()}))
        challenge = raw.expect()
        assert isinstance(challenge, Auth) and challenge.reason_code == 0x18
        client.set_server_first(challenge.properties[Property.AUTHENTICATION_DATA].decode())
        raw.send(Auth(0x18, {Property.AUTHENTICATION_METHOD: "SCRAM-SHA-512",
                             Property.AUTHENTICATION_DATA: client.get_client_final().encode()}))
        connack = raw.expect()
        assert isinstance(connack, Connack) and connack.reason_code == expected
        if expected == 0:
            client.set_server_final(connack.properties[Property.AUTHENTICATION_DATA].decode())


def test_jwt_valid_and_expired(broker, clients):
    now = int(time.time())
    good = jwt.encode({"exp": now + 60, "client_type": "APPLICATION"}, SECRET, algorithm="HS256")
    expired = jwt.encode({"exp": now - 60}, SECRET, algorithm="HS256")
    clients.append(paho(broker, 5, "jwt-user", good))
    clients.append(paho(broker, 5, "jwt-user", expired, expect_rc=0x86))
    clients.append(paho(broker, 4, "jwt-user", good))


def tls_client(broker, pki, cert, client_id=None):
    c = PahoClient(broker.ports["tls"], 5, client_id)
    c.client.tls_set(ca_certs=str(pki.ca.cert_path), certfile=str(cert.chain_path),
                     keyfile=str(cert.key_path), cert_reqs=ssl.CERT_REQUIRED)
    return c


def test_x509_certificate_signed_by_the_ca_and_not(broker, clients, pki, tmp_path):
    good = tls_client(broker, pki, pki.client)
    clients.append(good)
    good.connect_and_wait()
    assert good.subscribe("x509/#", 1) == [1]
    good.publish("x509/t", b"by cert", 1)
    assert good.get().payload == b"by cert"
    # signed by the CA but no credentials for its CN: refused (anonymous is off)
    stranger = tls_client(broker, pki, pki.ca.issue("stranger", "stranger"))
    clients.append(stranger)
    stranger.connect_and_wait(expect_rc=0x87)
    # signed by another CA: the TLS handshake fails
    bad = tls_client(broker, pki, pki.untrusted_client)
    with pytest.raises((ssl.SSLError, OSError)):
        bad.client.connect(HOST, broker.ports["tls"])
        bad.client.loop_start()
        bad._loop_started = True
        if not bad.connected.wait(3):
            raise ssl.SSLError("no CONNACK: handshake refused")
    bad.close()


def test_a_thousand_wrong_passwords_do_not_slow_other_clients(broker, clients):
    """Four threads send 1,000 wrong passwords for ``dev``: once ``dev``
    failed, one is checked at a time (0x03 Server unavailable for more),
    the address is banned for ``dev`` after 20 failures (0x05, no bcrypt),
    and the other clients' round trips stay short.  (It leaves 127.0.0.1
    banned for ``dev``: the module's last test of ``dev``.)"""
    pub = paho(broker, 5, "app", "apppw")
    sub = paho(broker, 5, "app", "apppw")
    clients += [pub, sub]
    topic = f"rtt/{uid()}"
    assert sub.subscribe(topic, 1) == [1]
    refused = []

    def flood(n: int) -> None:
        for _ in range(n):
            raw = RawClient(broker.ports["tcp"], level=4)
            refused.append(raw.connect(username="dev", password=b"wrong").reason_code)
            raw.sock.close()

    threads = [threading.Thread(target=flood, args=(250,)) for _ in range(4)]
    for t in threads:
        t.start()
    rtts = []
    while any(t.is_alive() for t in threads):
        start = time.monotonic()
        pub.publish(topic, b"ping", 1)
        sub.get()
        rtts.append(time.monotonic() - start)
    for t in threads:
        t.join()
    assert len(refused) == 1000 and set(refused) <= {0x03, 0x04, 0x05}, set(refused)
    # auth.login_limits: max_failures_per_address, and the two checks in flight at the ban;
    # the others refused without bcrypt
    assert refused.count(0x04) <= 20 + 2, collections.Counter(refused)
    assert refused.count(0x05) > 0, collections.Counter(refused)
    assert len(rtts) >= 10
    # bcrypt runs in threads: the reactor keeps serving the others
    assert statistics.median(rtts) < 0.25, rtts


def test_example_plugin_installed_from_its_directory(tmp_path):
    """The third-party plugin, pip-installed as its own distribution, is
    found through its entry point; its hooks are observed."""
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(site), str(REPO_ROOT / "plugins" / "examples" / "tbmq-example-plugin")],
        check=True, timeout=300)
    audit = tmp_path / "audit.log"
    port = free_port()
    config = {
        "listeners": [{"name": "tcp", "type": "tcp", "endpoint": f"tcp:{port}:interface={HOST}"}],
        "storage": {"backend": "memory"},
        "plugins": {"example": {"audit_file": str(audit), "deny_prefix": "forbidden/"}},
    }
    path = tmp_path / "tbmq.yml"
    path.write_text(yaml.safe_dump(config))
    b = ListenersBroker(tmp_path / "run", path, {"tcp": port})
    b.env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(site)])
    with b:
        assert "plugin active: example" in b.log()
        c = PahoClient(port, 5)
        c.connect_and_wait()
        assert c.subscribe("#", 1) == [1]
        c.publish("open/t", b"1", 1)
        c.publish("forbidden/t", b"2", 1)
        c.publish("open/t", b"3", 1)
        assert [m.payload for m in c.get_many(2)] == [b"1", b"3"]
        c.close()
        lines = audit.read_text().splitlines()
        assert lines[0].startswith("started ")
        assert f"connected {c.client_id}" in lines
        assert f"published {c.client_id} open/t" in lines
