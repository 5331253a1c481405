"""The SQLite transport's statements go through indexes, never a scan of the
messages or of all groups (SPEC Part 3: claims are O(log G)).

``EXPLAIN QUERY PLAN`` of every statement of ``queries.sql`` that a hot
operation runs (claim, ack, nack, extend, expiry, publish), and of the
statements inside the schema's triggers, on a file holding many groups and
messages.  Allowed: ``SEARCH`` through an index or the primary key; the one
ordered walk ``SCAN ... USING INDEX lq_groups_ready`` that ``LIMIT`` stops at
the first entries (claims with the common floor); scans of the recursive
``level`` table (one row per distinct ready priority) and of claim_many's
picks (at most ``max_count`` per level); a constant row.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from leasequeue import SQLiteTransport
from leasequeue._backends.sqlfiles import load_queries, load_statements

QUERIES = load_queries("sqlite")

#: statement -> parameters to explain it with
HOT = {
    "publish": ("g1", 0, b"x"),
    "last_seq": (),
    "group_state": ("g1",),
    "use_time": (5.0,),
    "use_time_and_expire": (5.0,),
    "claimed": (5.0,),
    "expire": (),
    "take_claims": (1,),
    "now": (),
    "find_claimable": (0, 5.0),
    "find_claimable_many": (0, 64),
    "batch_add": ("g1", 0, b"x", None),
    "batch_take_seqs": (),
    "batch_groups": (100,),
    "batch_heads": (100,),
    "batch_messages": (100, None),
    "batch_clear": (),
    "lease": (1, "w", 10.0, 5, 1.0),
    "unclaim_count": ("g1", 1, 1, "w", 7),
    "unclaim": ("g1", 1, 1, "w", 7),
    "ack": ("g1", 1, 1, "w", 7),
    "nack_now": ("g1", 1, 1, "w", 7),
    "park_time": ("g1", 1, 1, "w", 7, 5.0),
    "park": ("g1", 1, 1, "w", 7, 5.0),
    "extend_time": ("g1", 1, 1, "w", 7, 5.0),
    "extend": ("g1", 1, 1, "w", 7, 5.0),
    "counts": (),
    "count_messages": (),
    "top_ready_priority": (),
    "next_expiry": (),
    "find_group": ("g1",),
    "pause": (1,),
    "count_paused": (1,),
    "count_purged": (3, 0, 1, 0),
    "count_buried": (1,),
    "bury_count": ("g1", 1, 1, "w", 7),
    "bury": ("g1", 1, 1, "w", 7, "why"),
    "find_head": ("g1",),
    "skip_count": (1,),
    "skip": (1,),
    "peek": ("g1", 10),
    "resume": (1,),
    "purge_messages": (1,),
    "forget_group": (1,),
    "set_priority": ("g1", 3),
    "group_info": ("g1",),
    # Part 5 (version 5)
    "publish_extras": ("g1", 3, 9.0, "k"),
    "schedule_head": ("g1",),
    "schedule_batch_heads": (),
    "key_holder": ("g1", "k"),
    "keep_key": ("g1", "k", 3, 9.0),
    "keep_batch_keys": (100, 9.0),
    "drop_keys": (),
    "defer_keys": (),
    "release_now": ("g1", 1, 1, "w", 7),
    "release_park": ("g1", 1, 1, "w", 7, 5.0),
    "retry": (1,),
    "count_due": (3, 9.0),
    "count_batch_due": (100, 9.0),
    "drop_due": (),
    "skip_due": (3,),
    "purge_due": (1,),
}

OK_SCAN = re.compile(
    r"^(SCAN lq_groups USING (COVERING )?INDEX lq_groups_ready\b"  # ORDER BY rr_key LIMIT 1: first entry
    r"|SCAN level\b|SCAN CONSTANT ROW|SCAN lq_state\b|SCAN s\b"  # levels; lq_state (alias s) is one row
    r"|SCAN picked\b|SCAN \(subquery-\d+\)"  # claim_many's picks: at most max_count per level
    r"|SCAN (temp\.)?(lq_batch|b)\b)"  # publish_many's staged items: the batch itself
)


def trigger_statements() -> list[str]:
    """The statements inside the schema's triggers, with new./old. made parameters."""
    out = []
    for statement in load_statements("sqlite"):
        if not statement.upper().startswith("CREATE TRIGGER"):
            continue
        body = statement[statement.upper().index("BEGIN") + len("BEGIN"): statement.upper().rindex("END")]
        for inner in body.split(";"):
            inner = inner.strip()
            if inner:
                out.append(re.sub(r"\b(new|old)\.\w+", "?", inner))
    return out


@pytest.fixture(scope="module")
def conn(tmp_path_factory: Any) -> Any:
    path = tmp_path_factory.mktemp("plans") / "q.db"
    with SQLiteTransport(path) as t:
        t.publish_many([(f"g{i % 5000}", i, i % 7) for i in range(20000)])
        for _ in range(100):
            t.claim("w", 30)
    import sqlite3

    connection = sqlite3.connect(path)
    connection.execute(QUERIES["create_batch_table"])
    connection.execute("ANALYZE")  # the planner with statistics, as a long-lived file has them
    yield connection
    connection.close()


def plan(conn: Any, sql: str, params: tuple[Any, ...]) -> list[str]:
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


def check(lines: list[str], what: str) -> None:
    for line in lines:
        if line.startswith("SCAN") and not OK_SCAN.match(line):
            raise AssertionError(f"{what}: a scan in its plan: {line!r}\n" + "\n".join(lines))
        if "TEMP B-TREE" in line:
            # only the level walk and publish_many sort: their rows are the distinct
            # ready priorities' picks, or the batch's own items
            bounded = ("SCAN level", "SCAN lq_batch", "SCAN temp.lq_batch", "SCAN b")
            assert any(x.startswith(bounded) for x in lines), f"{what}: {lines}"


@pytest.mark.parametrize("name", sorted(HOT))
def test_statement_uses_indexes(conn: Any, name: str) -> None:
    lines = plan(conn, QUERIES[name], HOT[name])
    check(lines, name)
    if name in ("find_claimable", "ack", "group_state", "find_group", "set_priority", "unclaim",
                "unclaim_count", "park_time", "extend_time", "bury_count", "bury", "find_head", "skip_count",
                "skip", "peek", "schedule_head", "key_holder", "release_now", "release_park", "retry"):
        assert any("SEARCH lq_groups USING" in line or "SEARCH g USING" in line for line in lines), lines


def test_every_hot_path_query_is_checked() -> None:
    """A query added to queries.sql without a plan check fails here."""
    # an INSERT; groups() is O(G) by contract; DDL
    unchecked = set(QUERIES) - set(HOT) - {"pause_new", "groups_info", "create_batch_table"}
    assert not unchecked


@pytest.mark.parametrize("index", range(len(trigger_statements())))
def test_trigger_statements_use_indexes(conn: Any, index: int) -> None:
    sql = trigger_statements()[index]
    params = tuple([1] * sql.count("?"))
    check(plan(conn, sql, params), sql[:60])


def test_the_claim_walks_priorities_only_for_an_uncommon_floor(conn: Any) -> None:
    lines = plan(conn, QUERIES["find_claimable"], (0, 5.0))
    assert "SCAN lq_groups USING INDEX lq_groups_ready" in lines
    assert any("lq_groups_ready_by_priority" in line for line in lines)
    assert not any("lq_messages" in line and not line.startswith("SEARCH") for line in lines)


def test_stats_reads_the_state_row_alone(conn: Any) -> None:
    """stats() is O(1) but for its scheduled count: its counts come from the
    one row lq_state and the one row lq_quarantine (each looked up by its
    primary key), never from a scan or a search of lq_groups, its expiry
    index included (counting leases and parks there is O(leased + parked));
    scheduled is a range of the due-time index, O(log n + scheduled)."""
    lines = plan(conn, QUERIES["counts"], HOT["counts"])
    assert any(line.startswith("SEARCH lq_state USING INTEGER PRIMARY KEY") for line in lines), lines
    assert any(line.startswith("SEARCH lq_quarantine USING INTEGER PRIMARY KEY") for line in lines), lines
    assert any(line.startswith("SEARCH lq_due USING COVERING INDEX lq_due_at (due_at>?)")
               for line in lines), lines
    assert all(line.startswith(("SEARCH lq_state USING INTEGER PRIMARY KEY", "SCALAR SUBQUERY", "CORRELATED SCALAR SUBQUERY",
                                "SEARCH lq_quarantine USING INTEGER PRIMARY KEY",
                                "SEARCH lq_due USING COVERING INDEX lq_due_at")) for line in lines), lines


def test_a_key_is_found_through_indexes(conn: Any) -> None:
    """A key check is index searches: the key's row by (group, key), its
    message by the group's row and the seq."""
    lines = plan(conn, QUERIES["key_holder"], HOT["key_holder"])
    assert any(line.startswith("SEARCH k USING PRIMARY KEY (group_id=? AND key=?)") for line in lines), lines
    assert any(line.startswith("SEARCH m USING PRIMARY KEY (gid=? AND seq=?)") for line in lines), lines


def test_no_index_was_added_to_the_messages() -> None:
    """Every index of lq_messages costs every publish and ack a cursor: Part 5
    keeps its keys and due times in tables of their own."""
    indexes = [s for s in load_statements("sqlite") if s.upper().startswith("CREATE INDEX") and "lq_messages" in s]
    assert indexes == []
