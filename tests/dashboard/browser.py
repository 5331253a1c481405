"""Headless Chromium through selenium, for the browser tests and the docs'
screenshots: Debian's ``chromium`` and ``chromium-driver`` (.ci/run installs
them), named explicitly so that selenium never tries to download a driver."""

from __future__ import annotations

import os
import shutil
from typing import Any, Optional

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"


def find_browser() -> "tuple[Optional[str], Optional[str]]":
    browser = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    return browser, shutil.which(DRIVER)


def chromium(width: int = 1280, height: int = 900) -> Any:
    """A headless Chromium WebDriver.  Without one: a failure in CI (CI=true,
    where .ci/run installs it), a skip with the reason elsewhere.
    ``LEASEQUEUE_SKIP_BROWSER=1`` skips on purpose (the wheel test machines,
    which have no browser: pyproject's cibuildwheel environment)."""
    if os.environ.get("LEASEQUEUE_SKIP_BROWSER") == "1":
        pytest.skip("browser tests skipped on purpose (LEASEQUEUE_SKIP_BROWSER=1)")
    browser, driver = find_browser()
    missing = [name for name, path in (("chromium", browser), ("chromedriver", driver)) if path is None]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip)")
    if missing:
        why = f"the browser tests need {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(why + ": .ci/run installs them")
        pytest.skip(why)
    options = webdriver.ChromeOptions()
    options.binary_location = browser  # type: ignore[assignment]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--lang=en-US"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))
