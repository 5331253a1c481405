"""What ``conn=`` costs on PostgreSQL: server time per statement, measured
with ``pg_stat_statements``, of a publish and an ack made by the transport
on its own connection (autocommit) against the same made in the
application's transaction (``conn=``), in one run, interleaved.

It starts a throwaway server with ``shared_preload_libraries =
pg_stat_statements`` (a restart-time setting: a unit test cannot set it on
the suite's server), runs ``rounds`` rounds of ``n`` operations of each
kind, and reports, per kind, the server's mean execution time of the
operation's statement (``mean_exec_time``; the commit is not part of it),
and the client's wall time per operation including its commit (the
transport's own: the implicit commit of its statement; ``conn=``: the
application's ``COMMIT``, one per operation, as a web handler would make).

Run: ``python benchmarks/pg_conn_cost.py [n] [rounds]`` (results: docs/postgres.md,
"What conn= costs").
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List

import psycopg

from leasequeue import PostgresTransport
from leasequeue.testing._postgres_server import ThrowawayServer


def _reset(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def _server_times(conninfo: str) -> Dict[str, Any]:
    """mean_exec_time (ms) and calls of the transport's publish and ack statements, by kind."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query, calls, mean_exec_time, total_exec_time FROM pg_stat_statements "
            "WHERE query LIKE 'SELECT leasequeue.publish(%' OR query LIKE 'SELECT leasequeue.ack(%'"
        ).fetchall()
    out: Dict[str, Any] = {}
    for query, calls, mean, total in rows:
        op = "publish" if "leasequeue.publish(" in query else "ack"
        kind = "conn" if "app_tx" in query else "own"
        out[f"{op} {kind}"] = {"calls": int(calls), "mean_ms": float(mean), "total_ms": float(total)}
    return out


def one_round(conninfo: str, t: Any, n: int, app: Any) -> Dict[str, float]:
    """Wall seconds per operation of each kind, each in its own transaction,
    the two kinds alternating op by op and taking turns to go first (a noisy
    shared machine slows both alike); for conn=, also the share of its COMMIT."""
    spent = {"publish own": 0.0, "publish conn": 0.0, "publish conn: its commit": 0.0,
             "ack own": 0.0, "ack conn": 0.0, "ack conn: its commit": 0.0}
    clock = time.perf_counter

    def own(op: str, call: Any) -> None:
        started = clock()
        call()
        spent[f"{op} own"] += clock() - started

    def mine(op: str, call: Any) -> None:
        started = clock()
        call()
        committing = clock()
        app.commit()
        done = clock()
        spent[f"{op} conn"] += done - started
        spent[f"{op} conn: its commit"] += done - committing

    for i in range(n):
        pair = [lambda: own("publish", lambda: t.publish(f"own-{i % 64}", i)),
                lambda: mine("publish", lambda: t.publish(f"app-{i % 64}", i, conn=app))]
        for step in (pair if i % 2 == 0 else pair[::-1]):
            step()
    t.publish_many([(f"ack-{i}", i) for i in range(2 * n)])
    leases = []
    while True:
        more = t.claim_many("w", 600, 4 * n)
        leases += more
        if not more:
            break
    acks = [lease for lease in leases if lease.group_id.startswith("ack-")]
    for i, (a, b) in enumerate(zip(acks[0::2], acks[1::2])):
        pair = [lambda: own("ack", lambda: t.ack(a)), lambda: mine("ack", lambda: t.ack(b, conn=app))]
        for step in (pair if i % 2 == 0 else pair[::-1]):
            step()
    t.ack_many([lease for lease in leases if not lease.group_id.startswith("ack-")])
    while True:  # leave the queue empty for the next round
        rest = t.claim_many("w", 600, 10 ** 6)
        if not rest:
            break
        t.ack_many(rest)
    pairs = max(len(acks) // 2, 1)
    return {k: v / (n if k.startswith("publish") else pairs) for k, v in spent.items()}


def main(argv: List[str]) -> int:
    n = int(argv[1]) if len(argv) > 1 else 2000
    rounds = int(argv[2]) if len(argv) > 2 else 3
    with ThrowawayServer(settings={"shared_preload_libraries": "pg_stat_statements"}) as server:
        conninfo = server.conninfo  # started by the with
        PostgresTransport.install(conninfo, queues=["bench"])
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            version = conn.execute("SHOW server_version").fetchone()[0]
        t = PostgresTransport(conninfo, queue="bench")
        app = psycopg.connect(conninfo)
        if os.environ.get("PG_CONN_COST_GENERIC"):  # diagnosis: the application's session plans as the transport's
            app.execute("SET plan_cache_mode = force_generic_plan")
            app.commit()
        one_round(conninfo, t, min(n, 200), app)  # warm-up: plans cached on both connections
        walls: Dict[str, List[float]] = {}
        per_round: List[Dict[str, Any]] = []
        for _ in range(rounds):
            _reset(conninfo)
            for kind, seconds in one_round(conninfo, t, n, app).items():
                walls.setdefault(kind, []).append(seconds)
            per_round.append(_server_times(conninfo))
        server_side = {k: {"mean_ms": statistics.median(r[k]["mean_ms"] for r in per_round),
                           "calls": sum(r[k]["calls"] for r in per_round)} for k in per_round[0]}
        app.close()
        t.close()
    report = {
        "postgres": version, "n": n, "rounds": rounds,
        "server_mean_exec_ms_median_of_rounds": {k: round(v["mean_ms"], 4) for k, v in sorted(server_side.items())},
        "server_calls": {k: v["calls"] for k, v in sorted(server_side.items())},
        "client_wall_us_median_of_rounds": {k: round(statistics.median(v) * 1e6, 1) for k, v in sorted(walls.items())},
    }
    for op in ("publish", "ack"):
        ratios = [r[f"{op} conn"]["mean_ms"] / r[f"{op} own"]["mean_ms"] for r in per_round]
        report[f"{op}_server_ratio_conn_over_own_per_round"] = [round(x, 3) for x in ratios]
        report[f"{op}_server_ratio_conn_over_own_median"] = round(statistics.median(ratios), 3)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
