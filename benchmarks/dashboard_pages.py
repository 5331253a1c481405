"""Page times of the dashboard at 100,000 groups, SQLite and PostgreSQL.

    python3 benchmarks/dashboard_pages.py                      # SQLite, and a throwaway PostgreSQL
    python3 benchmarks/dashboard_pages.py --groups 20000 --no-postgres
    python3 benchmarks/dashboard_pages.py --conninfo "dbname=bench" --markdown benchmarks/results/dashboard.md

Fills a queue with ``--groups`` groups (one message each; 1% buried, 0.5%
paused, 2% leased, the rest ready), serves ``leasequeue.dashboard.app`` with
uvicorn on a loopback port and times requests through urllib, as a browser
would make them: the overview, the JSON and HTML lists (first, middle and
last page; by state; by prefix), a group's page, stats.  Each figure is the
median [min-max] of ``--repeats`` requests, in milliseconds, wall clock on
this machine (run ``uptime`` alongside).  No assertion: the numbers are the
result.  PostgreSQL: ``--conninfo``, else the test suite's throwaway server
(``leasequeue.testing._postgres_server``: needs the PostgreSQL programs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "dashboard"))

from dashboard_helpers import Served  # noqa: E402

from leasequeue import dashboard  # noqa: E402


def fill(t: Any, groups: int) -> None:
    chunk = 10_000
    for start in range(0, groups, chunk):
        t.publish_many([(group_id(i), {"order": i, "total": i * 3})
                        for i in range(start, min(groups, start + chunk))])
    for _ in range(groups // 100):  # 1% buried, with a reason
        lease = t.claim("bench", 3600)
        t.bury(lease, f"ValueError: order {lease.group_id} has no total")
    for _ in range(groups // 50):  # 2% leased
        t.claim("bench", 3600)
    for i in range(0, groups, 200):  # 0.5% paused
        t.pause(group_id(i))


def time_requests(s: Served, path: str, repeats: int) -> Tuple[float, float, float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        with urllib.request.urlopen(s.url + path, timeout=60) as resp:
            resp.read()
            assert resp.status == 200, (path, resp.status)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), min(samples), max(samples)


def group_id(i: int) -> str:
    return f"tenant-{i % 97:02d}/order-{i:06d}"


def before_last(groups: int) -> str:
    """The last group id of the page before the last (what its next link carries)."""
    ids = sorted(group_id(i) for i in range(groups))
    last = (groups + 49) // 50
    return ids[(last - 1) * 50 - 1]


def paths(groups: int) -> List[Tuple[str, str]]:
    last = (groups + 49) // 50
    some = "tenant-13/order-000013"
    return [
        ("stats (JSON)", "/api/stats"),
        ("overview (HTML)", "/"),
        ("groups page 1 (JSON)", "/api/groups?page=1"),
        (f"groups page {last // 2} (JSON)", f"/api/groups?page={last // 2}"),
        (f"groups page {last}, the last (JSON)", f"/api/groups?page={last}"),
        (f"groups page {last} by after= (JSON: the next link)",
         f"/api/groups?page={last}&after=" + urllib.parse.quote(before_last(groups), safe="")),
        ("groups page 1 (HTML)", "/groups?page=1"),
        ("state=buried page 1 (JSON)", "/api/groups?state=buried"),
        ("state=paused page 1 (JSON)", "/api/groups?state=paused"),
        ("state=leased page 1 (JSON)", "/api/groups?state=leased"),
        ("state=ready page 100 (JSON)", "/api/groups?state=ready&page=100"),
        ("q=tenant-42/ page 1 (JSON)", "/api/groups?q=tenant-42%2F"),
        ("q=tenant-42/order-0042 + state=ready (JSON)", "/api/groups?q=tenant-42%2Forder-0042&state=ready"),
        ("a group's page (HTML)", "/groups/" + urllib.parse.quote(some, safe="")),
    ]


def measure(name: str, make: Callable[[], Any], groups: int, repeats: int) -> Dict[str, Any]:
    t = make()
    try:
        start = time.perf_counter()
        fill(t, groups)
        filled = time.perf_counter() - start
        s = Served(dashboard.app(t, read_only=True))
        try:
            rows = [(label, time_requests(s, path, repeats)) for label, path in paths(groups)]
        finally:
            s.stop()
        return {"backend": name, "groups": groups, "fill_s": filled, "rows": rows}
    finally:
        t.close()


def render(results: List[Dict[str, Any]], repeats: int) -> str:
    lines = [f"Dashboard page times: median [min-max] of {repeats} requests, ms (uvicorn + urllib, one machine).", ""]
    header = "| request | " + " | ".join(f"{r['backend']}, {r['groups']:,} groups" for r in results) + " |"
    lines += [header, "|---" * (len(results) + 1) + "|"]
    for i, (label, _) in enumerate(results[0]["rows"]):
        cells = []
        for r in results:
            med, lo, hi = r["rows"][i][1]
            cells.append(f"{med:.1f} [{lo:.1f}-{hi:.1f}]")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--conninfo", help="a PostgreSQL server (default: a throwaway one)")
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--markdown", metavar="FILE", help="also write the table to FILE")
    args = ap.parse_args()
    from leasequeue import SQLiteTransport

    results = []
    with tempfile.TemporaryDirectory() as d:
        results.append(measure("SQLite", lambda: SQLiteTransport(os.path.join(d, "q.db"), durable=False),
                               args.groups, args.repeats))
    if not args.no_postgres:
        from contextlib import ExitStack

        from leasequeue import PostgresTransport

        with ExitStack() as stack:
            conninfo = args.conninfo
            if conninfo is None:
                from leasequeue.testing._postgres_server import session_server

                conninfo = stack.enter_context(session_server()).conninfo
            queue = f"bench_{uuid.uuid4().hex[:8]}"

            def make_pg() -> Any:
                if hasattr(PostgresTransport, "create_queue"):
                    PostgresTransport.create_queue(conninfo, queue)
                return PostgresTransport(conninfo, queue=queue)

            results.append(measure("PostgreSQL", make_pg, args.groups, args.repeats))
    text = render(results, args.repeats)
    sys.stdout.write(text)
    for r in results:
        sys.stdout.write(f"{r['backend']}: filled {r['groups']:,} groups in {r['fill_s']:.1f} s\n")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
