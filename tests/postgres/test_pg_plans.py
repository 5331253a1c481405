"""The claim's statements are index scans at 100k groups (the contract,
docs/contract.md, Part 3: "Claims are O(log G) through indexes at any table
size"), seen through
``auto_explain`` inside the server-side claim function."""

from __future__ import annotations

import math
from typing import Any, List

import psycopg


def test_claim_plans_use_indexes_at_100k_groups(conninfo: str, make_pg: Any) -> None:
    """The statements inside the claim function (seen through auto_explain)
    are index scans, never sequential scans, with 100k groups queued."""
    t = make_pg()
    q = t._queue
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO leasequeue.groups (queue, group_id, priority, rr_key) "
            "SELECT %s, 'g' || i, i %% 3, i - 4611686018427387904 FROM generate_series(1, 100000) i", (q,))
        conn.execute(
            "INSERT INTO leasequeue.messages (queue, group_id, seq, payload) "
            "SELECT %s, 'g' || i, i, '\\x80054b012e'::bytea FROM generate_series(1, 100000) i", (q,))
        conn.execute(f"SELECT setval({t._seq_oid}::regclass, 100000)")
        conn.execute("ANALYZE leasequeue.groups")
        conn.execute("ANALYZE leasequeue.messages")
        plans: List[str] = []
        conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_level = notice"):
            conn.execute(f"SET auto_explain.{setting}")
        calls = [
            ("claim", "SELECT * FROM leasequeue.claim(%s, 'w', 30, 0, NULL, 1, false, NULL)"),
            ("floor", "SELECT * FROM leasequeue.claim(%s, 'w', 30, 2, NULL, 1, false, NULL)"),
            ("claim_many", "SELECT * FROM leasequeue.claim(%s, 'w', 30, 0, NULL, 64, true, 7)"),
            ("stats-expire", "SELECT leasequeue.expire(%s, 1e18)"),
        ]
        for name, sql in calls:
            plans.clear()
            conn.execute(sql, (q,)).fetchall()
            text = "\n".join(plans)
            assert "Index" in text, f"{name}: no index scan in\n{text}"
            if name != "stats-expire":
                assert "using groups_ready" in text and "using messages_pkey" in text, text
            for line in text.splitlines():
                if "Seq Scan" in line:
                    assert "leasequeue.groups" not in line and "leasequeue.messages" not in line, (
                        f"{name}: sequential scan\n{text}")
                    assert "on groups" not in line and "on messages" not in line, f"{name}: {text}"
        lease = t.claim("w", 30)
        assert lease is not None and lease.event == 1 and lease.attempt == 1
    assert math.isfinite(lease.expires_at)
