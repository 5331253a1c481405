"""SIGKILL of the application's process in the middle of its transaction
(conn=) on PostgreSQL: nothing is lost and nothing is duplicated.  Killed
before its commit: its row, its publish and its ack are all undone (the
acked message comes back once, after its lease's expiry, to another
process).  Killed after its commit: all three stand, once.  Real processes,
real server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable

import pytest

from tx_helpers import LIVENESS, app_rows, app_table, child_env, other_claim

# The application: claims the order's message, then in one transaction
# writes its row, publishes the next step and acks; reports, then sleeps
# (before or after the commit) until killed.
_APP = r"""
import sys, time
import psycopg
from leasequeue import PostgresTransport
conninfo, queue, table, when = sys.argv[1:5]
t = PostgresTransport(conninfo, queue=queue)
lease = t.claim("app", 2.0)
assert lease is not None and lease.event == "charge"
conn = psycopg.connect(conninfo)
conn.execute(f"INSERT INTO {table} VALUES (17, 'charged')")
t.publish("order-17", "ship", conn=conn)
t.ack(lease, conn=conn)
if when == "after commit":
    conn.commit()
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("when", ["before commit", "after commit"])
def test_sigkill_inside_the_transaction_loses_and_duplicates_nothing(
        conninfo: str, make_pg: Callable[..., Any], queue_name: str, when: str) -> None:
    t = make_pg(queue_name)
    table = app_table(conninfo)
    charge = t.publish("order-17", "charge")
    app = subprocess.Popen([sys.executable, "-c", _APP, conninfo, queue_name, table, when], env=child_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert app.stdout is not None
        line = app.stdout.readline().strip()
        assert line == "ready", app.stderr.read() if app.stderr else ""
        os.kill(app.pid, signal.SIGKILL)
        app.wait(LIVENESS)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    # The server notices the dead client and ends its transaction (rolled
    # back if it had not committed).
    deadline = time.monotonic() + LIVENESS
    if when == "before commit":
        time.sleep(2.2)  # past the app's lease
        got = None
        while got is None:
            got = other_claim(conninfo, queue_name)
            assert got is not None or time.monotonic() < deadline
        assert (got["seq"], got["event"], got["attempt"]) == (charge, "charge", 2)
        assert app_rows(conninfo, table) == []
        assert [m.event for m in t.peek("order-17", 10)] == ["charge"]  # no "ship": once, not twice
    else:
        assert app_rows(conninfo, table) == [(17, "charged")]
        assert [m.event for m in t.peek("order-17", 10)] == ["ship"]  # the charge acked, once
        got = other_claim(conninfo, queue_name)
        assert got is not None and (got["event"], got["attempt"]) == ("ship", 1)
        assert other_claim(conninfo, queue_name) is None
