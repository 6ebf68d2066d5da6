"""The web console in a real browser: Debian's headless Chromium driven by
Selenium (``chromium`` and ``chromium-driver``).  Log in; see failed MQTT
logins counted on the dashboard; watch the dashboard's message rate rise
while a publisher runs; see who a client is (address, user name,
credentials) in the session list and details, disconnect it from the page
and see its connection closed; add a credential on the page (listed by
what it matches, not its internal id) and connect with it; change its
rules on the page and see a publish refused.  Every page is saved as a
screenshot: in ``docs/screenshots/`` when ``TBMQ_SCREENSHOTS=docs/screenshots``
is set (a run that refreshes the README's pictures), else in a directory of
the system's temporary files, so a test run leaves the checkout as it was."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.integration.conftest import _finish
from tests.integration.helpers import REPO_ROOT, props, uid, wait_for
from tests.integration.ops import USERS, Http, start_ops_broker

SCREENSHOTS = REPO_ROOT / os.environ["TBMQ_SCREENSHOTS"] if os.environ.get("TBMQ_SCREENSHOTS") \
    else Path(tempfile.gettempdir()) / "tbmq-screenshots"
ROOT = "root"
WAIT = 15


@pytest.fixture(scope="module")
def console_broker(tmp_path_factory):
    broker = start_ops_broker(tmp_path_factory.mktemp("console"), USERS,
                              env={"TBMQ_AUTH__REFRESH_INTERVAL": "1"})
    yield broker
    _finish(broker)


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1440,960", "--hide-scrollbars"):
        options.add_argument(argument)
    service = Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_window_size(1440, 960)
    yield driver
    driver.quit()


def shot(browser, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    time.sleep(0.3)  # transitions end
    assert browser.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def wait(browser, condition, timeout: float = WAIT):
    return WebDriverWait(browser, timeout).until(condition)


def visible(browser, css: str):
    return wait(browser, ec.visibility_of_element_located((By.CSS_SELECTOR, css)))


def click(browser, css: str) -> None:
    wait(browser, ec.element_to_be_clickable((By.CSS_SELECTOR, css))).click()


def fill(browser, css: str, text: str) -> None:
    field = visible(browser, css)
    # select and delete (clear() fires no input event for the page to see)
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE)
    if text:
        field.send_keys(text)


def go(browser, broker, view: str) -> None:
    browser.get(f"{broker.url}/console/#/{view}")
    visible(browser, f"#view-{view}")


@pytest.fixture(scope="module")
def logged_in(browser, console_broker):
    """Log in through the page (a wrong password first: its error shows)."""
    browser.get(f"{console_broker.url}/console/")
    visible(browser, "#login-form")
    shot(browser, "login")
    fill(browser, "#login-user", ROOT)
    fill(browser, "#login-password", "not-the-password")
    click(browser, "#login-submit")
    error = visible(browser, "#login-error")
    assert "wrong user name or password" in error.text
    fill(browser, "#login-password", USERS[ROOT][0])
    click(browser, "#login-submit")
    visible(browser, "#view-dashboard")
    assert browser.find_element(By.ID, "user-name").text == ROOT
    return browser


def test_log_in(logged_in):
    assert logged_in.find_element(By.CSS_SELECTOR, "#nav-dashboard.active")


def _api(console_broker, reactor_thread) -> Http:
    http = Http(reactor_thread, console_broker.url)
    http.login(ROOT, USERS[ROOT][0])
    return http


def _basic_credentials(http: Http, name: str, username: str, password: str) -> dict:
    answer = http.request("POST", "/api/credentials", json_body={
        "type": "basic", "name": name, "username": username, "password": password,
        "rounds": 4})
    assert answer.status == 201, answer
    return answer.json


def test_dashboard_shows_failed_logins(logged_in, console_broker, mqtt, reactor_thread):
    browser = logged_in
    go(browser, console_broker, "dashboard")

    def failed() -> int:
        text = browser.find_element(By.ID, "stat-auth-failures").text
        return int(text) if text.isdigit() else -1

    wait(browser, lambda _: failed() >= 0)
    before = failed()
    http = _api(console_broker, reactor_thread)
    name = f"meter-{uid()[:6]}"
    record = _basic_credentials(http, name, name, "right-password")
    for _ in range(2):
        client = mqtt(5, port=console_broker.port)
        client.client.username_pw_set(name, "wrong-password")
        client.connect_and_wait(expect_rc=0x86)  # BAD_USER_NAME_OR_PASSWORD
        client.close()
    wait(browser, lambda _: failed() == before + 2, timeout=10)
    recent = browser.find_element(By.ID, "auth-failures-recent")
    wait(browser, lambda _: recent.text.startswith(f"{before + 2} in the last minute"),
         timeout=10)
    assert http.request("DELETE", f"/api/credentials/{record['id']}").status == 200


def test_dashboard_rate_rises_while_a_publisher_runs(logged_in, console_broker, mqtt):
    browser = logged_in
    go(browser, console_broker, "dashboard")
    subscriber = mqtt.connect(4, port=console_broker.port)
    subscriber.subscribe("load/#")
    publisher = mqtt.connect(4, port=console_broker.port)
    stop = threading.Event()

    def publish():
        while not stop.is_set():
            for _ in range(20):
                publisher.publish("load/x", b"payload", qos=0, wait=False)
            time.sleep(0.02)

    def rate() -> float:
        text = browser.find_element(By.ID, "rate-in").text.replace(",", "")
        return float(text) if text not in ("", "–") else 0.0

    worker = threading.Thread(target=publish, daemon=True)
    worker.start()
    try:
        wait(browser, lambda _: rate() >= 100, timeout=20)
        wait(browser, lambda _: float(browser.find_element(By.ID, "rate-out").text
                                      .replace(",", "") or 0) >= 100, timeout=10)
        # the chart drew the rise
        assert browser.find_elements(By.CSS_SELECTOR, "#chart-messages canvas")
        time.sleep(2.5)  # a few points on the chart
        shot(browser, "dashboard")
    finally:
        stop.set()
        worker.join(5)
    wait(browser, lambda _: rate() < 5, timeout=20)


def test_disconnect_a_session_from_the_page(logged_in, console_broker, mqtt, reactor_thread):
    browser = logged_in
    client_id = f"device-{uid()}"
    http = _api(console_broker, reactor_thread)
    user = f"installer-{uid()[:4]}"
    record = _basic_credentials(http, f"field-devices-{uid()[:4]}", user, "device-pw-1")
    client = mqtt(5, client_id=client_id, port=console_broker.port)
    client.client.username_pw_set(user, "device-pw-1")
    client.connect_and_wait(clean_start=False, session_expiry=3600)
    address = "%s:%d" % client.client.socket().getsockname()[:2]
    client.subscribe(f"devices/{client_id}/#", qos=1)
    for i in range(3):
        mqtt.connect(4, client_id=f"sensor-{i}-{uid()[:4]}", port=console_broker.port)
    go(browser, console_broker, "sessions")
    visible(browser, "#sessions-table")
    fill(browser, "#session-search", client_id)
    row = f'tr[data-client-id="{client_id}"]'
    wait(browser, lambda b: len(b.find_elements(By.CSS_SELECTOR, "#sessions-table tbody tr")) == 1)
    # who the client is, in its row: address, user name, credentials name
    cells = browser.find_element(By.CSS_SELECTOR, row)
    assert cells.find_element(By.CSS_SELECTOR, ".address").text == address
    assert cells.find_element(By.CSS_SELECTOR, ".username").text == user
    assert cells.find_element(By.CSS_SELECTOR, ".credentials-name").text == record["name"]
    click(browser, row)
    visible(browser, "#session-detail")
    assert client_id in browser.find_element(By.ID, "session-detail").text
    assert f"devices/{client_id}/#" in browser.find_element(By.ID, "session-detail").text
    assert browser.find_element(By.ID, "detail-address").text == address
    assert browser.find_element(By.ID, "detail-username").text == user
    assert browser.find_element(By.ID, "detail-credentials").text == record["name"]
    # the search finds it by its user name too
    fill(browser, "#session-search", user)
    wait(browser, lambda b: [r.get_attribute("data-client-id") for r in b.find_elements(
        By.CSS_SELECTOR, "#sessions-table tbody tr")] == [client_id])
    fill(browser, "#session-search", "")
    wait(browser, lambda b: len(b.find_elements(By.CSS_SELECTOR, "#sessions-table tbody tr")) >= 4)
    shot(browser, "sessions")
    click(browser, "#disconnect-session")
    visible(browser, "#confirm-dialog")
    click(browser, "#confirm-ok")
    client.wait_disconnected()
    assert client.disconnects[-1][0] == 0x98
    notice = visible(browser, "#notice")
    assert client_id in notice.text
    wait(browser, lambda b: "disconnected" in b.find_element(By.CSS_SELECTOR, row).text)
    # offline, it is still known who it was
    assert browser.find_element(By.CSS_SELECTOR, f"{row} .username").text == user
    # the search finds nothing: an empty state, not an empty table
    fill(browser, "#session-search", "no-such-client-anywhere")
    visible(browser, "#sessions-empty")
    shot(browser, "sessions-empty")
    assert http.request("DELETE", f"/api/credentials/{record['id']}").status == 200


def test_add_a_credential_then_change_its_rules(logged_in, console_broker, mqtt):
    browser = logged_in
    name = f"sensor-{uid()[:6]}"
    go(browser, console_broker, "credentials")
    visible(browser, "#credentials-empty")
    shot(browser, "credentials-empty")
    click(browser, "#add-credentials")
    visible(browser, "#credentials-form")
    fill(browser, "#cred-name", name)
    fill(browser, "#cred-username", name)
    fill(browser, "#cred-password", "s3cret-pw")
    Select(visible(browser, "#cred-pub-mode")).select_by_value("some")
    fill(browser, "#cred-pub", "sensors/${username}/.*")
    shot(browser, "credentials-form")
    click(browser, "#cred-save")
    row = f'#credentials-table tr[data-name="{name}"]'
    visible(browser, row)
    assert "sensors/${username}/.*" in browser.find_element(By.CSS_SELECTOR, row).text
    # what the record matches, in words, not its internal id (username|<name>)
    identity = browser.find_element(By.CSS_SELECTOR, f"{row} .identity").text
    assert identity == f"user name {name}"
    assert "|" not in browser.find_element(By.CSS_SELECTOR, row).text

    # a record the API refuses shows its error in the form
    click(browser, "#add-credentials")
    fill(browser, "#cred-name", name)
    fill(browser, "#cred-username", "another")
    click(browser, "#cred-save")
    assert "belongs to another record" in visible(browser, "#form-error").text
    click(browser, "#credentials-form button.ghost")

    # connect with it; publishing is allowed where the rules say
    client = mqtt(5, port=console_broker.port)
    codes = []
    client.client.on_publish = lambda c, u, mid, rc, p: codes.append(int(rc.value))
    client.client.username_pw_set(name, "s3cret-pw")
    client.connect_and_wait()
    client.publish(f"sensors/{name}/t", b"20.5", qos=1, properties=props())
    wait_for(lambda: codes == [0], what="PUBACK 0")
    shot(browser, "credentials")

    # change its rules on the page: it may publish nothing now
    click(browser, f"{row} button.edit")
    visible(browser, "#credentials-form")
    Select(visible(browser, "#cred-pub-mode")).select_by_value("none")
    click(browser, "#cred-save")
    wait(browser, lambda b: "nothing" in b.find_element(By.CSS_SELECTOR, row).text)

    def refused() -> bool:
        codes.clear()
        client.publish(f"sensors/{name}/t", b"21.0", qos=1, properties=props())
        wait_for(lambda: codes, what="a PUBACK")
        return codes == [0x87]

    wait_for(refused, timeout=15, interval=0.3, what="the publish refused (0x87)")
    client.close()


def test_retained_and_nodes_pages(logged_in, console_broker, mqtt):
    browser = logged_in
    publisher = mqtt.connect(4, port=console_broker.port)
    for room, value in (("kitchen", "21.5"), ("hall", "19.0"), ("garage", "12.25")):
        publisher.publish(f"home/{room}/temperature", value, qos=1, retain=True)
    publisher.publish("home/status", '{"online": true, "since": "08:00"}', qos=1, retain=True)
    go(browser, console_broker, "retained")
    wait(browser, lambda b: len(b.find_elements(By.CSS_SELECTOR, "#retained-table tbody tr")) >= 4)
    shot(browser, "retained")
    click(browser, 'tr[data-topic="home/garage/temperature"] button.delete')
    click(browser, "#confirm-ok")
    wait(browser, lambda b: not b.find_elements(By.CSS_SELECTOR,
                                                'tr[data-topic="home/garage/temperature"]'))
    fill(browser, "#retained-filter", "a/#/b")
    click(browser, "#view-retained .toolbar button")
    assert "invalid topic filter" in visible(browser, "#error-banner").text
    shot(browser, "retained-error")
    go(browser, console_broker, "nodes")
    visible(browser, "#nodes-table")
    assert "this node" in browser.find_element(By.ID, "nodes-table").text
    shot(browser, "nodes")
