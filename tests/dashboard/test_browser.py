"""The dashboard in a real browser (headless Chromium, selenium): the
overview, a buried group's page, a confirmed ``retry``, and no script of an
event ever running.  The server is uvicorn on a loopback port; the state is
checked through the transport."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import pytest
from browser import chromium
from dashboard_helpers import Served, page_path

from leasequeue import dashboard

GROUP = "orders/<b>17</b> eu"
EVENT = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">"
REASON = "<img src=x onerror=\"window.__pwned=3\"> ValueError: bad total"


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = chromium()
    try:
        yield driver
    finally:
        driver.quit()


def _until(condition: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_retry_a_buried_group_in_the_browser(make_transport: Callable[..., Any], serve: Callable[[Any], Served],
                                             browser: Any) -> None:
    from selenium.webdriver.common.by import By

    t = make_transport()
    t.publish(GROUP, EVENT)
    t.publish("other", 1)
    lease = t.claim("worker-1", 60)
    if lease.group_id != GROUP:  # round-robin: bury the evil group whichever came first
        t.ack(lease)
        lease = t.claim("worker-1", 60)
    t.bury(lease, REASON)
    s = serve(dashboard.app(t))

    browser.get(s.url + "/")
    assert browser.find_element(By.CSS_SELECTOR, '[data-stat="buried"]').text == "1"
    link = browser.find_element(By.LINK_TEXT, GROUP)  # the id shown as text, tags and all
    assert browser.find_element(By.CSS_SELECTOR, "td.reason").text == REASON
    link.click()
    _until(lambda: "/groups/" in browser.current_url)
    assert browser.current_url == s.url + page_path(GROUP)
    assert browser.find_element(By.ID, "group-id").text == GROUP
    assert browser.find_element(By.ID, "group-state").text == "buried"
    assert browser.find_element(By.ID, "reason").text == REASON
    assert browser.find_element(By.CSS_SELECTOR, "pre.event").text == repr(EVENT)
    assert browser.execute_script("return typeof window.__pwned") == "undefined"
    assert not browser.find_elements(By.CSS_SELECTOR, "main img, main script, main b")

    # Dismissing the confirmation sends nothing.
    browser.find_element(By.CSS_SELECTOR, "#action-retry button").click()
    alert = _until(lambda: _alert(browser))
    assert alert is not None and GROUP in alert.text and "retry" in alert.text.lower()
    alert.dismiss()
    time.sleep(0.3)
    assert t.group(GROUP).state == "buried"

    # Accepting it retries the group and comes back to its page.
    browser.find_element(By.CSS_SELECTOR, "#action-retry button").click()
    alert = _until(lambda: _alert(browser))
    assert alert is not None
    alert.accept()
    _until(lambda: "msg=" in browser.current_url)
    assert browser.find_element(By.ID, "message").text.startswith(f"retried {GROUP}")
    assert browser.find_element(By.ID, "group-state").text == "ready"
    info = t.group(GROUP)
    assert info.state == "ready" and info.reason is None and t.peek(GROUP)[0].attempt == 0
    assert browser.execute_script("return typeof window.__pwned") == "undefined"


def test_read_only_page_has_no_actions(make_transport: Callable[..., Any], serve: Callable[[Any], Served],
                                       browser: Any) -> None:
    from selenium.webdriver.common.by import By

    t = make_transport()
    t.publish("g", EVENT)
    s = serve(dashboard.app(t, read_only=True))
    browser.get(s.url + page_path("g"))
    assert browser.find_element(By.CSS_SELECTOR, "header .mode").text == "read-only"
    assert browser.find_elements(By.CSS_SELECTOR, "form[method=post]") == []
    assert browser.find_element(By.CSS_SELECTOR, "pre.event").text == repr(EVENT)
    assert browser.execute_script("return typeof window.__pwned") == "undefined"


def _alert(browser: Any) -> Any:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        alert = browser.switch_to.alert
        alert.text  # noqa: B018  (raises while there is none)
        return alert
    except NoAlertPresentException:
        return None
