"""Issue 30's report, as a test: a PostgreSQL restart (``pg_ctl restart -m
immediate``, a crash) while handlers are between their work and their ack.
Work and ack as two transactions: the work committed, the ack was lost
with the server, the message came back, and the charge ran again.  Work and
``ack(conn=)`` in one transaction: the crash takes both or neither, so
every charge is recorded once (the message may still be delivered again:
delivery is at least once; the charge is not applied twice)."""

from __future__ import annotations

import time
from typing import Any, Dict

import psycopg
import pytest

from leasequeue import LeaseQueueError, PostgresTransport

ORDERS = 6


def _charges(conninfo: str, table: str) -> Dict[int, int]:
    for _ in range(100):
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                rows = conn.execute(f"SELECT order_id, count(*) FROM {table} GROUP BY order_id").fetchall()
                return {int(order): int(n) for order, n in rows}
        except psycopg.OperationalError:
            time.sleep(0.1)
    raise AssertionError("the server did not come back")


@pytest.mark.parametrize("how", ["one transaction", "two transactions"])
def test_a_restart_between_the_work_and_the_ack(own_server: Any, queue_name: str, how: str) -> None:
    """Half the handlers finished before the crash; the other half had done
    their charge and not yet acked when it came (one transaction: work and
    ack done, not committed; two transactions: the charge committed, the
    ack not yet sent, and it fails on the dead connection).  Then workers
    carry on until the queue is empty."""
    conninfo = own_server.conninfo
    table = f"charges_{queue_name}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (order_id int NOT NULL)")
    t = PostgresTransport(conninfo, queue=queue_name)
    try:
        for order in range(ORDERS):
            t.publish(f"order-{order}", {"charge": order})
        leases = [t.claim("w", 1.0) for _ in range(ORDERS)]
        assert all(lease is not None for lease in leases)
        half = ORDERS // 2

        def charge(conn: Any, lease: Any) -> None:
            conn.execute(f"INSERT INTO {table} (order_id) VALUES (%s)", (lease.event["charge"],))

        with psycopg.connect(conninfo) as conn:  # the first half: done before the crash
            for lease in leases[:half]:
                charge(conn, lease)
                if how == "one transaction":
                    t.ack(lease, conn=conn)
                    conn.commit()
                else:
                    conn.commit()
                    t.ack(lease)
        app = psycopg.connect(conninfo)  # the second half: mid-handler at the crash
        for lease in leases[half:]:
            charge(app, lease)
            if how == "one transaction":
                t.ack(lease, conn=app)  # not committed yet
            else:
                app.commit()  # the charge committed; the ack is next
        own_server.owned.restart_immediate()
        app.close()
        if how == "two transactions":
            for lease in leases[half:]:
                try:
                    t.ack(lease)  # the dead pooled connection fails it
                except LeaseQueueError:
                    break
        time.sleep(1.2)  # past the leases' end
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:  # workers carry on, each handler in one transaction
            try:
                lease = t.claim("w2", 30.0)
                if lease is None:
                    if len(t) == 0:
                        break
                    time.sleep(0.1)
                    continue
            except LeaseQueueError:
                time.sleep(0.1)
                continue
            with psycopg.connect(conninfo) as conn:
                charge(conn, lease)
                t.ack(lease, conn=conn)
        assert len(t) == 0
        charges = _charges(conninfo, table)
        assert sorted(charges) == list(range(ORDERS))
        if how == "one transaction":
            assert charges == {order: 1 for order in range(ORDERS)}  # every charge once
        else:
            assert max(charges.values()) == 2  # the report: a completed charge ran again
    finally:
        t.close()
