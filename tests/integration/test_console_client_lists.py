"""The console's "Blocked clients" and "Unauthorized clients" pages in
headless Chromium (Selenium; the fixtures of ``test_ops_console``): block
a client id and a regex on the page and see a client refused (CONNACK
0x8A), a bad regex refused with the API's message, an entry removed and
the client let in again; refused logins listed with their address, user
name and reason, then cleared.  Screenshots: ``docs/screenshots/
blocked-clients.png`` and ``unauthorized-clients.png``."""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.integration.helpers import uid
from tests.integration.test_ops_console import (  # noqa: F401  (fixtures)
    _api, _basic_credentials, browser, click, console_broker, fill, go, logged_in, shot,
    visible, wait,
)

BANNED = 0x8A
BAD_USER_NAME_OR_PASSWORD = 0x86


def _rows(browser, table: str) -> list:
    return browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")


def test_block_and_unblock_clients_on_the_page(logged_in, console_broker, mqtt):
    browser = logged_in
    go(browser, console_broker, "blocked")
    visible(browser, "#blocked-empty")
    tag = uid()[:6]
    fill(browser, "#block-value", f"evil-{tag}")
    fill(browser, "#block-description", "sent garbage all night")
    click(browser, "#block-add")
    wait(browser, lambda b: len(_rows(b, "blocked-table")) == 1)
    Select(visible(browser, "#block-type")).select_by_value("regex")
    Select(visible(browser, "#block-target")).select_by_value("username")
    fill(browser, "#block-value", "(unclosed")
    click(browser, "#block-add")
    assert "not a regular expression" in visible(browser, "#block-error").text
    fill(browser, "#block-value", f"scanner-{tag}-.*")
    fill(browser, "#block-expires", "90")
    click(browser, "#block-add")
    wait(browser, lambda b: len(_rows(b, "blocked-table")) == 2)
    table = browser.find_element(By.ID, "blocked-table").text
    assert f"evil-{tag}" in table and "regex (username)" in table and "never" in table
    shot(browser, "blocked-clients")
    refused = mqtt(5, client_id=f"evil-{tag}", port=console_broker.port)
    refused.connect_and_wait(expect_rc=BANNED)
    entry_id = _rows(browser, "blocked-table")[0].get_attribute("data-id")
    click(browser, f'tr[data-id="{entry_id}"] button.remove')
    click(browser, "#confirm-ok")
    wait(browser, lambda b: len(_rows(b, "blocked-table")) == 1)
    assert f"evil-{tag}" not in browser.find_element(By.ID, "blocked-table").text
    mqtt(5, client_id=f"evil-{tag}", port=console_broker.port).connect_and_wait(expect_rc=0)
    # the regex entry goes too: the page shows its empty state
    click(browser, "#blocked-table tbody tr button.remove")
    click(browser, "#confirm-ok")
    visible(browser, "#blocked-empty")


def test_refused_logins_are_listed_and_cleared_on_the_page(logged_in, console_broker, mqtt,
                                                           reactor_thread):
    browser = logged_in
    http = _api(console_broker, reactor_thread)
    assert http.request("DELETE", "/api/unauthorized-clients").status == 200
    name = f"sensor-{uid()[:6]}"
    _basic_credentials(http, name, name, "right-password")
    for n, version in ((1, 5), (2, 4)):
        client = mqtt(version, client_id=f"{name}-{n}", port=console_broker.port)
        client.client.username_pw_set(name, "wrong-password")
        client.connect_and_wait(expect_rc=BAD_USER_NAME_OR_PASSWORD if version == 5 else None)
    go(browser, console_broker, "unauthorized")
    wait(browser, lambda b: len(_rows(b, "unauthorized-table")) == 2
         or (click(b, "#view-unauthorized .toolbar button") and False))
    text = browser.find_element(By.ID, "unauthorized-table").text
    assert f"{name}-1" in text and f"{name}-2" in text and "127.0.0.1" in text
    assert "BAD_USER_NAME_OR_PASSWORD (0x86)" in text
    assert visible(browser, "#unauthorized-count").text.startswith("2 client ids")
    shot(browser, "unauthorized-clients")
    click(browser, "#unauthorized-clear")
    click(browser, "#confirm-ok")
    visible(browser, "#unauthorized-empty")
