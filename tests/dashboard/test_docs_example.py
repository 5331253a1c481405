"""docs/dashboard.md's mounting example runs as written (a real SQLite file
instead of /var/lib/app): mounted under its prefix, served by uvicorn, and
its lifespan closes the transport when the server stops."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Dict

import pytest
from dashboard_helpers import Served

from leasequeue import LeaseQueueError

PAGE = Path(__file__).resolve().parents[2] / "docs" / "dashboard.md"


@pytest.mark.skipif(not PAGE.is_file(), reason="needs the source tree's docs/ (a wheel test has only tests/)")
def test_the_mount_example_runs(tmp_path: Path, serve: Callable[[Any], Served]) -> None:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S) if "Mount(" in b]
    assert len(blocks) == 1
    code = blocks[0].replace("/var/lib/app/queue.db", str(tmp_path / "queue.db"))
    ns: Dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(code, str(PAGE), "exec"), ns)  # noqa: S102
    ns["queue"].publish("order-17", {"step": "charge"})
    s = serve(ns["app"])
    status, data = s.get_json("/ops/queue/api/stats")
    assert status == 200 and data["messages"] == 1
    status, body = s.get("/ops/queue/groups/order-17")
    assert status == 200 and "&#39;charge&#39;" in body
    s.stop()
    with pytest.raises(LeaseQueueError, match="closed"):
        ns["queue"].stats()
