"""Crash safety of work done in the application's transaction (SPEC Part 5,
"With the application's data"): application processes killed with SIGKILL
at random moments, inside their transactions included, lose nothing and
do nothing twice.

Each application process loops: claim a message of an ``in-*`` group, then
in one ``sqlite3`` transaction of its own insert a row into its table
``done``, publish a message to group ``out`` and ack the lease (``conn=``),
then commit.  A killer sends SIGKILL to a random one every 30-150 ms
(``LEASEQUEUE_TX_CRASH_SECONDS``, default 4 s) and starts another in its
place.  Then the parent finishes the work the same way.  Afterwards:

* ``PRAGMA integrity_check`` is ok and the transport's counters agree with
  the rows (``check_counters`` of the crash test);
* every input message's work was done exactly once: one ``done`` row each
  (delivery was at least once; the work, committed with its ack, once);
* ``out`` holds exactly one message per ``done`` row: nothing published by a
  killed transaction survived, nothing committed was lost.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from typing import Any, List

import pytest

from leasequeue import LeaseLost, SQLiteTransport

from test_sqlite_crash import check_counters

SECONDS = float(os.environ.get("LEASEQUEUE_TX_CRASH_SECONDS", "4"))
MESSAGES = 400
GROUPS = 40
VISIBILITY = 0.5

APPLICATION = r"""
import random, sqlite3, sys, time
from leasequeue import LeaseLost, SQLiteTransport

path = sys.argv[1]
rng = random.Random()
t = SQLiteTransport(path, busy_timeout=30)
conn = sqlite3.connect(path, timeout=30)
while True:
    lease = t.claim("app", VISIBILITY, timeout=0.2)
    if lease is None:
        continue
    if lease.group_id == "out":  # not ours: hand it back uncounted
        t.release(lease)
        continue
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("INSERT INTO done (event) VALUES (?)", (lease.event,))
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.02)  # a longer transaction: more kills land inside it
        t.publish("out", lease.event, conn=conn)
        t.ack(lease, conn=conn)
    except LeaseLost:
        conn.rollback()  # its lease expired and another process took the message: not our work any more
        continue
    conn.commit()
""".replace("VISIBILITY", repr(VISIBILITY))


def _spawn(path: str) -> "subprocess.Popen[bytes]":
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p))
    return subprocess.Popen([sys.executable, "-c", APPLICATION, path], env=env, stdout=subprocess.DEVNULL)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_inside_the_applications_transaction_loses_nothing_and_repeats_nothing(tmp_path: Any) -> None:
    path = str(tmp_path / "q.db")
    with SQLiteTransport(path) as t:
        t.publish_many([(f"in-{i % GROUPS}", i) for i in range(MESSAGES)])
    with sqlite3.connect(path) as setup:
        setup.execute("CREATE TABLE done (event INTEGER NOT NULL)")
    rng = random.Random(2026)
    apps: List["subprocess.Popen[bytes]"] = [_spawn(path) for _ in range(2)]
    kills = 0
    try:
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.03, 0.15))
            victim = rng.randrange(len(apps))
            apps[victim].send_signal(signal.SIGKILL)
            apps[victim].wait()
            kills += 1
            apps[victim] = _spawn(path)
    finally:
        for app in apps:
            app.send_signal(signal.SIGKILL)
            app.wait()

    # Finish the work here, the same way (leases of the killed processes expire).
    conn = sqlite3.connect(path, timeout=30)
    with SQLiteTransport(path) as t:
        while any(g.group_id != "out" for g in t.groups()):
            lease = t.claim("finisher", 30, timeout=VISIBILITY * 4)
            if lease is None:
                continue
            if lease.group_id == "out":
                t.release(lease)
                continue
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO done (event) VALUES (?)", (lease.event,))
            t.publish("out", lease.event, conn=conn)
            try:
                t.ack(lease, conn=conn)
            except LeaseLost:
                conn.rollback()
                continue
            conn.commit()
        done = sorted(row[0] for row in conn.execute("SELECT event FROM done"))
        out = sorted(m.event for m in t.peek("out", MESSAGES * 2))
        assert done == list(range(MESSAGES)), "an input's work was lost or done twice"
        assert out == done, "a killed transaction's publish survived, or a committed one was lost"
        time.sleep(VISIBILITY * 2)  # a killed process's lease on an out message ends
        assert t.stats()[:4] == (MESSAGES, 1, 0, 0)
    conn.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    check_counters(db)
    db.close()
    assert kills > 5
    print(f"\ntransaction crash test: {kills} kills")
