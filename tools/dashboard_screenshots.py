"""The dashboard's screenshots in the docs (docs/images/dashboard-*.png).

    PYTHONPATH=src python3 tools/dashboard_screenshots.py

Fills a SQLite queue in a temporary directory with a small shop's orders
(some buried with their errors, some paused, leased, parked and scheduled),
serves ``leasequeue.dashboard.app`` with uvicorn on a loopback port and takes
the overview and a buried group's page with headless Chromium (Debian's
``chromium`` and ``chromium-driver``, through selenium: the browser tests'
``tests/dashboard/browser.py``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "dashboard"))

from browser import chromium  # noqa: E402
from dashboard_helpers import Served, page_path  # noqa: E402

from leasequeue import SQLiteTransport, dashboard  # noqa: E402

OUT = ROOT / "docs" / "images"
BURIED = "eu/order-1042"


def fill(t: SQLiteTransport) -> None:
    t.publish(BURIED, {"step": "charge", "order": 1042, "amount": "129.90", "currency": "EUR"})
    t.publish(BURIED, {"step": "ship", "order": 1042})
    t.publish(BURIED, {"step": "email", "order": 1042, "template": "shipped"})
    lease = t.claim("worker-3", 30)
    t.bury(lease, "PaymentDeclined: card ending 4242 declined (insufficient_funds) after 5 attempts")
    t.publish("us/order-2211", {"step": "charge", "order": 2211})
    lease = t.claim("worker-1", 30)
    t.bury(lease, "KeyError: 'shipping_address' (order 2211 has no address)")
    for i in range(40):
        t.publish(f"eu/order-{1100 + i}", {"step": "charge", "order": 1100 + i})
    for _ in range(6):
        t.claim("worker-2", 300)
    lease = t.claim("worker-2", 300)
    t.nack(lease, 120)
    t.pause("eu/order-1139")
    t.publish("eu/order-1200", {"step": "reminder", "order": 1200}, delay=3600)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        t = SQLiteTransport(os.path.join(d, "shop.db"))
        fill(t)
        s = Served(dashboard.app(t))
        driver = chromium(1200, 760)
        try:
            driver.get(s.url + "/")
            driver.save_screenshot(str(OUT / "dashboard-overview.png"))
            driver.get(s.url + page_path(BURIED))
            driver.save_screenshot(str(OUT / "dashboard-buried-group.png"))
        finally:
            driver.quit()
            s.stop()
            t.close()
    print(f"wrote {OUT / 'dashboard-overview.png'} and {OUT / 'dashboard-buried-group.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
