"""The page queries read indexes, not whole tables: SQLite's plan walks the
``group_id`` index in order (no sort), a prefix a range of it; PostgreSQL's,
at 100,000 groups, walks the groups' key or reads the locked groups' index,
and counts messages through their key only."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any, List

from leasequeue import SQLiteTransport
from leasequeue._backends.sqlite import pages as sqlite_pages
from leasequeue.dashboard import STATES


def test_sqlite_pages_walk_the_group_id_index(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    with SQLiteTransport(path, durable=False) as t:
        t.publish_many([(f"g{i:05d}", i) for i in range(2000)])
        for _ in range(20):
            t.bury(t.claim("w", 3600), "x")
        t.pause("g01999")
    conn = sqlite3.connect(path)
    try:
        for state in (None, *STATES):
            for prefix in ("", "g001"):
                sql, params = sqlite_pages.page_query(state, prefix, 100, 51)
                plan = " | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
                assert "USING INDEX sqlite_autoindex_lq_groups_1" in plan, (state, prefix, plan)
                assert "TEMP B-TREE" not in plan, (state, prefix, plan)
                if prefix:
                    assert "(group_id>? AND group_id<?)" in plan, (state, prefix, plan)
        sql, params = sqlite_pages.page_query("ready", "", 0, 51, after="g01000")
        plan = " | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
        assert "SEARCH lq_groups USING INDEX sqlite_autoindex_lq_groups_1 (group_id>?)" in plan, plan
    finally:
        conn.close()


def test_postgres_pages_use_indexes_at_100k_groups(dash_pg_conninfo: str) -> None:
    """Every page at 100k groups: the messages counted through their key
    (never a scan of the messages); the groups read through their key or the
    groups_locked index.  The one exception, stated: paused groups have no
    index, so a paused filter without a prefix may scan the queue's groups."""
    import psycopg
    from dashboard_helpers import open_postgres

    from leasequeue._backends.postgres import pages as pg_pages

    t = open_postgres(dash_pg_conninfo, f"plan_{uuid.uuid4().hex[:12]}")
    q = t._queue
    try:
        with psycopg.connect(dash_pg_conninfo, autocommit=True) as conn:
            conn.execute("INSERT INTO leasequeue.groups (queue, group_id, priority, rr_key) "
                         "SELECT %s, 'g' || i, 0, i - 4611686018427387904 FROM generate_series(1, 100000) i", (q,))
            conn.execute("INSERT INTO leasequeue.messages (queue, group_id, seq, payload) "
                         "SELECT %s, 'g' || i, i, '\\x80054b012e'::bytea FROM generate_series(1, 100000) i", (q,))
            conn.execute("UPDATE leasequeue.groups SET lock_state = 3, reason = 'x' "
                         "WHERE queue = %s AND group_id LIKE 'g%%00'", (q,))
            conn.execute("UPDATE leasequeue.groups SET lock_state = 1, expires_at = 1e18, lock_worker = 'w' "
                         "WHERE queue = %s AND group_id LIKE 'g%%7'", (q,))
            conn.execute("ANALYZE leasequeue.groups")
            conn.execute("ANALYZE leasequeue.messages")
            for state in (None, *STATES):
                for prefix in ("", "g123"):
                    sql, params = pg_pages.page_query(q, state, prefix, 0, 51)
                    values: List[Any] = [p if isinstance(p, (int, str)) else None for p in params]
                    plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + sql, values))
                    where = f"{state} {prefix!r}:\n{plan}"
                    assert "using messages_pkey on messages" in plan and "Seq Scan on messages" not in plan, where
                    if state == "paused" and not prefix:
                        continue
                    assert "Seq Scan" not in plan, where
                    assert "groups_pkey on groups" in plan or "groups_locked" in plan, where
                    if state in (None, "ready") or prefix:
                        assert "Sort" not in plan, where  # the key walk, in order, stops after the page
            sql, params = pg_pages.page_query(q, "ready", "", 0, 51, after="g5000")
            values = [p if isinstance(p, (int, str)) else None for p in params]
            plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + sql, values))
            assert "Index Scan using groups_pkey on groups" in plan and "group_id > " in plan, plan
            assert "Sort" not in plan and "Seq Scan" not in plan, plan
    finally:
        t.close()
