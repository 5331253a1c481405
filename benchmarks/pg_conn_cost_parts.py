"""Where a ``conn=`` statement's server time goes (companion of
``pg_conn_cost.py``): the same publish statement from five sessions, op by
op in rotating order, on a throwaway server with ``pg_stat_statements``,
each session a role of its own so that its statements are counted apart:

* ``postgres``: the transport's own connection (autocommit);
* ``marked_tx`` / ``marked_auto``: ``publish(..., conn=)`` on an
  application connection in a transaction (committed after each) / in
  autocommit mode;
* ``plain_tx`` / ``plain_auto``: the transport's own, unmarked statement
  sent on such a connection (what ``conn=`` would cost without
  ``leasequeue.app_tx``).

All application sessions use the transport's session settings
(``prepare_threshold=0``, ``plan_cache_mode = force_generic_plan``), so the
differences are the mark and the transaction block (every session
publishes the same pickled ints to 64 groups of its own).  Prints each role's
``mean_exec_time`` per round and the median (µs).

Run: ``python benchmarks/pg_conn_cost_parts.py [n] [rounds]`` (results:
docs/postgres.md, "What conn= costs").
"""

from __future__ import annotations

import statistics
import sys
from typing import Any, Dict, List

import psycopg

from leasequeue import PostgresTransport
from leasequeue._backends.postgres.transport import _Q
from leasequeue._serializers import serialize_bytes
from leasequeue.testing._postgres_server import ThrowawayServer

USERS = ("marked_tx", "marked_auto", "plain_tx", "plain_auto")


def main(argv: List[str]) -> int:
    n = int(argv[1]) if len(argv) > 1 else 1000
    rounds = int(argv[2]) if len(argv) > 2 else 5
    with ThrowawayServer(settings={"shared_preload_libraries": "pg_stat_statements"}) as server:
        conninfo = server.conninfo
        PostgresTransport.install(conninfo, queues=["bench"])
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute("CREATE EXTENSION pg_stat_statements")
            for user in USERS:
                admin.execute(f"CREATE ROLE {user} LOGIN SUPERUSER")
        t = PostgresTransport(conninfo, queue="bench")
        conns = {u: psycopg.connect(f"{conninfo} user={u}", autocommit=u.endswith("auto"), prepare_threshold=0)
                 for u in USERS}
        for conn in conns.values():
            conn.execute("SET plan_cache_mode = force_generic_plan")
            if not conn.autocommit:
                conn.commit()
        sql = _Q["publish"]

        def publish(user: str, i: int) -> None:
            if user == "postgres":
                t.publish(f"own-{i % 64}", i)
                return
            conn = conns[user]
            if user.startswith("marked"):
                t.publish(f"{user}-{i % 64}", i, conn=conn)
            else:
                payload = serialize_bytes(t._dumps, i)  # as publish serializes it
                t._app.run(conn, "publish", sql, (t._queue, t._seq_oid, f"{user}-{i % 64}", payload, 0))
            if not conn.autocommit:
                conn.commit()

        order = ["postgres", *USERS]
        for i in range(200):  # warm-up
            for user in order:
                publish(user, i)
        results: Dict[str, List[float]] = {}
        for _ in range(rounds):
            with psycopg.connect(conninfo, autocommit=True) as admin:
                admin.execute("SELECT pg_stat_statements_reset()")
            for i in range(n):
                k = i % len(order)
                for user in order[k:] + order[:k]:
                    publish(user, i)
            with psycopg.connect(conninfo, autocommit=True) as admin:
                rows: Any = admin.execute(
                    "SELECT r.rolname, s.mean_exec_time FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid "
                    "WHERE s.query LIKE 'SELECT leasequeue.publish(%'").fetchall()
            for user, mean in rows:
                results.setdefault(user, []).append(float(mean) * 1000)
        for conn in conns.values():
            conn.close()
        t.close()
    for user, means in sorted(results.items()):
        print(f"{user:12} median {statistics.median(means):6.1f} us   rounds {[round(m, 1) for m in means]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
