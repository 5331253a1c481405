"""Where a PostgreSQL ``Worker``'s time goes (issue #32): per job, the
commits, the statements the server ran (``pg_stat_statements``, mean
execution time) and the writes of each table (``pg_stat_user_tables``:
updates, of which HOT, deletes, dead row versions left).

It starts a throwaway server (``fsync=on``, ``synchronous_commit=on``,
``shared_preload_libraries = pg_stat_statements``), and for each slot count
fills a queue with ``jobs`` jobs over 200 groups, runs one ``Worker``
process-locally (a no-op handler, as ``leasequeue worker`` would) until
every job succeeded, and reads the server's counters.  It profiles the
leasequeue on its path: run it once per tree to compare trees.

Run: ``python benchmarks/pg_worker_profile.py [jobs] [slots,...]``
(default 4000 jobs, slots 1,4; a slot count ``Np0`` runs N slots with
``prefetch=0``, ``NpK`` with ``prefetch=K``, plain ``N`` the default
adaptive prefetch; results: docs/postgres.md, "Where the time goes").
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from typing import Any, Dict, List

import psycopg

from leasequeue import PostgresTransport, Worker
from leasequeue.testing._postgres_server import ThrowawayServer

GROUPS = 200


def _counters(conninfo: str) -> Dict[str, Any]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
        tables = conn.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup FROM pg_stat_user_tables "
            "WHERE schemaname = 'leasequeue' AND relname IN ('groups', 'messages')").fetchall()
        statements = conn.execute(
            "SELECT query, calls, mean_exec_time, total_exec_time FROM pg_stat_statements "
            "WHERE query LIKE '%leasequeue.%' ORDER BY total_exec_time DESC LIMIT 6").fetchall()
    return {"commits": int(commits[0]) if commits else 0,
            "tables": {r[0]: {"upd": int(r[1]), "hot": int(r[2]), "del": int(r[3]), "dead": int(r[4])}
                       for r in tables},
            "statements": [(q, int(c), float(m), float(t)) for q, c, m, t in statements]}


def _reset(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("SELECT pg_stat_statements_reset()")
        conn.execute("SELECT pg_stat_reset()")
    time.sleep(1.2)  # the reset is seen by the next reads


def profile(conninfo: str, jobs: int, variant: str) -> Dict[str, Any]:
    slots_text, _, prefetch_text = variant.partition("p")
    slots = int(slots_text)
    prefetch = int(prefetch_text) if prefetch_text else None
    queue = f"p{uuid.uuid4().hex[:8]}"
    PostgresTransport.create_queue(conninfo, queue)
    with PostgresTransport(conninfo, queue=queue) as t:
        for base in range(0, jobs, 1000):
            t.publish_many([(f"g{i % GROUPS}", i) for i in range(base, min(base + 1000, jobs))])
    _reset(conninfo)
    before = _counters(conninfo)
    t = PostgresTransport(conninfo, queue=queue)
    w = Worker(t, lambda job: None, concurrency=slots, prefetch=prefetch, signals=False)
    done = [0.0]

    def watch() -> None:
        while w.counts["succeeded"] < jobs:
            time.sleep(0.002)
        done[0] = time.perf_counter()
        w.stop()

    watcher = threading.Thread(target=watch)
    cpu = time.process_time()
    began = time.perf_counter()
    watcher.start()
    w.run()
    watcher.join()
    cpu = time.process_time() - cpu
    t.close()
    time.sleep(1.5)  # the backends' counters reach the statistics
    after = _counters(conninfo)
    tables = {name: {k: after["tables"][name][k] - before["tables"].get(name, {}).get(k, 0)
                     for k in after["tables"][name]} for name in after["tables"]}
    return {"slots": slots, "prefetch": prefetch, "jobs": jobs, "jobs_per_s": jobs / (done[0] - began),
            "client_cpu_ms_per_job": 1e3 * cpu / jobs,
            "commits_per_job": (after["commits"] - before["commits"]) / jobs,
            "tables_per_job": {n: {k: v / jobs for k, v in d.items()} for n, d in tables.items()},
            "statements": [{"query": q[:70], "calls_per_job": c / jobs, "mean_us": 1e3 * m,
                            "us_per_job": 1e3 * tot / jobs} for q, c, m, tot in after["statements"]]}


def main(argv: List[str]) -> int:
    jobs = int(argv[1]) if len(argv) > 1 else 4000
    counts = argv[2].split(",") if len(argv) > 2 else ["1", "4"]
    server = ThrowawayServer(settings={"shared_preload_libraries": "pg_stat_statements",
                                       "pg_stat_statements.track": "top"})
    server.start()
    try:
        with psycopg.connect(server.conninfo, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        PostgresTransport.install(server.conninfo)
        results = [profile(server.conninfo, jobs, n) for n in counts]
    finally:
        server.stop()
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
