"""Crash safety (SPEC Part 3): processes killed with SIGKILL at random moments,
mid-transaction included, lose nothing and break nothing.

Four worker processes claim -> ack messages of 1,000 groups on one file; a
fifth process runs long transactions on other groups of the same file
(``publish_many`` of hundreds of messages, ``purge``, and SPEC Part 5's
delayed and keyed publishes and ``retry``), so that many kills land inside a
transaction.  A killer sends SIGKILL to a random process every
50-400 ms and starts a new incarnation in its place.  Each worker logs every
claim and every ack (intent before the call, outcome after) with the time,
each line fsync'd.  Afterwards:

* ``PRAGMA integrity_check`` is ok, and every counter the statements and
  triggers keep (lq_state, which stats() reads alone; a lock has an end
  exactly when held; each group's message count and head) agrees with the rows;
* every published message was acked exactly once or is still in the file;
* no group ever had two live leases: a group's next delivery starts after
  the previous one ended (acked, or its lease expired: strictly after
  ``expires_at``), and a message's deliveries have consecutive attempts;
* FIFO held per group: a group's messages were delivered and acked in seq order.

``LEASEQUEUE_CRASH_SECONDS`` sets how long the killer runs (default 20).
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from typing import Any

import pytest

from leasequeue import SQLiteTransport
from leasequeue._backends.sqlfiles import load_queries

SECONDS = float(os.environ.get("LEASEQUEUE_CRASH_SECONDS", "20"))
GROUPS = 1000
PER_GROUP = 6
VISIBILITY = 0.6

WORKER = r"""
import json, os, random, sys, time
from leasequeue import SQLiteTransport, LeaseLost
path, log_path, worker_id, visibility = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
rng = random.Random(worker_id)
log = open(log_path, "a", buffering=1)
def write(*fields):
    log.write(json.dumps(fields) + "\n")
    log.flush()
    os.fsync(log.fileno())
t = SQLiteTransport(path, busy_timeout=30)
while True:
    lease = t.claim(worker_id, visibility, 5, timeout=1.5)
    if lease is None:
        break
    write("claim", lease.group_id, lease.seq, lease.attempt, lease.expires_at - visibility, lease.expires_at,
          lease.event)
    if rng.random() < 0.3:
        time.sleep(rng.random() * 0.01)  # "work"
    write("acking", lease.group_id, lease.seq, lease.attempt, time.time())
    try:
        t.ack(lease)
    except LeaseLost:
        write("lost", lease.group_id, lease.seq, lease.attempt, time.time())
    else:
        write("acked", lease.group_id, lease.seq, lease.attempt, time.time())
write("done")
"""

CHURNER = r"""
import random, sys
from leasequeue import SQLiteTransport
t = SQLiteTransport(sys.argv[1], busy_timeout=30, dedup_window=1.0)
rng = random.Random()
while True:
    t.publish_many([(f"churn{rng.randrange(20)}", "x" * rng.randrange(10, 400)) for _ in range(rng.randrange(50, 600))])
    if rng.random() < 0.5:
        t.purge(f"churn{rng.randrange(20)}")
    if rng.random() < 0.2:
        g = f"churn{rng.randrange(20)}"
        t.pause(g)
        t.resume(g)
    # Part 5's write paths, killed mid-transaction too: delayed and keyed batches and publishes.
    t.publish_many([(f"churn{rng.randrange(20)}", "later", 0, rng.choice([None, f"k{rng.randrange(50)}"]))
                    for _ in range(rng.randrange(1, 100))], delay=rng.choice([0.0, 0.05, 5.0]))
    t.publish(f"churn{rng.randrange(20)}", "once", delay=rng.choice([0.0, 0.5]), key=f"k{rng.randrange(50)}")
    if rng.random() < 0.3:
        t.retry(f"churn{rng.randrange(20)}")
"""


def spawn(script: str, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p))
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdout=subprocess.DEVNULL)


def read_log(path: str) -> list[list[Any]]:
    lines: list[list[Any]] = []
    if not os.path.exists(path):  # killed before it opened its log
        return lines
    with open(path) as f:
        for line in f:
            try:
                lines.append(json.loads(line))
            except ValueError:  # a line cut by SIGKILL
                pass
    return lines


@pytest.mark.slow
@pytest.mark.serial(reason="a soak: worker processes on every core for a fixed time")
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_at_random_moments_loses_nothing(tmp_path: Any) -> None:
    path = str(tmp_path / "q.db")
    published = {}  # seq -> (group, index)
    with SQLiteTransport(path) as t:
        items = [(f"g{g}", [g, i], 5) for i in range(PER_GROUP) for g in range(GROUPS)]
        for seq, (group, event, _) in zip(t.publish_many(items), items):
            published[seq] = (group, event)
    rng = random.Random(12345)
    logs: list[str] = []
    incarnation = collections.Counter()

    def start_worker(slot: int) -> subprocess.Popen[bytes]:
        incarnation[slot] += 1
        log = str(tmp_path / f"w{slot}.{incarnation[slot]}.log")
        logs.append(log)
        return spawn(WORKER, path, log, f"w{slot}.{incarnation[slot]}", str(VISIBILITY))

    workers = {slot: start_worker(slot) for slot in range(4)}
    churner = spawn(CHURNER, path)
    kills = collections.Counter()
    deadline = time.monotonic() + SECONDS
    try:
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.05, 0.4))
            victim = rng.randrange(5)
            if victim == 4:
                churner.send_signal(signal.SIGKILL)
                churner.wait()
                kills["churner"] += 1
                churner = spawn(CHURNER, path)
            elif workers[victim].poll() is None:
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait()
                kills["worker"] += 1
                workers[victim] = start_worker(victim)
        churner.send_signal(signal.SIGKILL)
        churner.wait()
        # Let the workers drain what is left (killed leases expire and come back).
        finish = time.monotonic() + 120
        for proc in workers.values():
            proc.wait(max(1.0, finish - time.monotonic()))
    finally:
        for proc in [churner, *workers.values()]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert kills["worker"] >= 3 and kills["churner"] >= 1, kills

    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    check_counters(db)
    remaining = {seq for (seq,) in db.execute(
        "SELECT m.seq FROM lq_messages m JOIN lq_groups g USING (gid) WHERE g.group_id NOT LIKE 'churn%'")}
    db.close()

    claims: dict[str, list[tuple[float, float, int, int]]] = collections.defaultdict(list)  # group -> deliveries
    acked: collections.Counter[int] = collections.Counter()
    acking: set[int] = set()
    ack_times: dict[tuple[int, int], float] = {}
    for log in logs:
        for entry in read_log(log):
            kind = entry[0]
            if kind == "claim":
                _, group, seq, attempt, start, expires_at, event = entry
                assert published[seq] == (group, event), entry
                claims[group].append((start, expires_at, seq, attempt))
            elif kind == "acking":
                acking.add(entry[2])
                ack_times[(entry[2], entry[3])] = entry[4]
            elif kind == "acked":
                acked[entry[2]] += 1
    # Acked exactly once, or still in the file.
    assert all(n == 1 for n in acked.values()), [s for s, n in acked.items() if n > 1]
    assert not remaining & set(acked)
    for seq in published:
        assert seq in remaining or seq in acked or seq in acking, f"message {seq} was lost"
    assert len(acked) > GROUPS  # the run did real work
    # One live lease per group at a time, FIFO, consecutive attempts.
    for group, deliveries in claims.items():
        deliveries.sort()
        for (start1, end1, seq1, att1), (start2, _end2, seq2, att2) in zip(deliveries, deliveries[1:]):
            assert seq2 >= seq1, f"{group}: FIFO broken: {seq1} delivered after {seq2}"
            if seq2 == seq1:
                # Redelivery: only after the previous lease expired (strictly) or was given back.
                assert att2 > att1, (group, seq1, att1, att2)
                assert start2 > end1 or (seq1, att1) in ack_times, (group, seq1, start1, end1, start2)
            else:
                # The next message: the previous one was acked first.
                assert seq1 in acking or seq1 in acked, (group, seq1, seq2)
                assert start2 >= ack_times.get((seq1, att1), start1) - 1e-3, (group, seq1, seq2)
    # Whatever is left is the tail of its group (FIFO: nothing after it was acked).
    by_group = collections.defaultdict(list)
    for seq, (group, _) in published.items():
        by_group[group].append(seq)
    for group, seqs in by_group.items():
        left = [s for s in sorted(seqs) if s in remaining]
        if left:
            assert all(s not in acked for s in sorted(seqs) if s > left[0]), group
    print(f"\ncrash test: {dict(kills)} kills, {len(acked)} acks, {len(remaining)} left, "
          f"{sum(len(v) for v in claims.values())} deliveries")


QUERIES = load_queries("sqlite")


def check_counters(db: sqlite3.Connection) -> None:
    """What the statements and triggers keep equals what the rows say."""
    state = db.execute(QUERIES["counts"]).fetchone()[:6]  # what stats() reports, expiry aside (and scheduled)
    actual = (
        db.execute("SELECT count(*) FROM lq_messages").fetchone()[0],
        db.execute("SELECT count(*) FROM lq_groups WHERE messages > 0").fetchone()[0],
        db.execute("SELECT count(*) FROM lq_groups WHERE lock = 1").fetchone()[0],
        db.execute("SELECT count(*) FROM lq_groups WHERE lock = 2").fetchone()[0],
        db.execute("SELECT count(*) FROM lq_groups WHERE paused = 1").fetchone()[0],
        db.execute("SELECT count(*) FROM lq_groups WHERE lock = 3").fetchone()[0],
    )
    assert state == actual
    # the expiry index holds exactly the leased, parked and scheduled groups: a lease,
    # park or schedule has an end, a free or buried group none
    assert db.execute(
        "SELECT count(*) FROM lq_groups WHERE (lock IN (1, 2, 4)) != (expires_at IS NOT NULL)").fetchone() == (0,)
    bad = db.execute(
        "SELECT g.group_id FROM lq_groups g LEFT JOIN "
        "(SELECT gid, count(*) AS n, min(seq) AS head FROM lq_messages GROUP BY gid) m USING (gid) "
        "WHERE g.messages != coalesce(m.n, 0) OR g.head_seq IS NOT m.head"
    ).fetchall()
    assert not bad
    orphans = db.execute("SELECT count(*) FROM lq_messages WHERE gid NOT IN (SELECT gid FROM lq_groups)").fetchone()
    assert orphans == (0,)
    # stats().scheduled counts lq_due's rows not due yet: each of them is a message still held, with that due time
    assert db.execute(
        "SELECT count(*) FROM lq_due AS d WHERE d.due_at >= (SELECT now FROM lq_state) AND NOT EXISTS "
        "(SELECT 1 FROM lq_messages AS m WHERE m.seq = d.seq AND m.due_at = d.due_at)").fetchone() == (0,)
    # every scheduled head (lock 4) waits for its own due time
    assert db.execute(
        "SELECT count(*) FROM lq_groups AS g JOIN lq_messages AS m ON m.gid = g.gid AND m.seq = g.head_seq"
        " WHERE g.lock = 4 AND (m.due_at IS NULL OR m.due_at != g.expires_at)").fetchone() == (0,)
    last_seq = db.execute("SELECT last_seq FROM lq_state").fetchone()[0]
    assert db.execute("SELECT coalesce(max(seq), 0) FROM lq_messages").fetchone()[0] <= last_seq
