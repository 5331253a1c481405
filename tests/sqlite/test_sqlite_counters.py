"""The counters of ``lq_state`` that ``stats()`` reads (SQLite schema v4) equal
what the rows say after every kind of operation.

``stats()`` is O(1): it reads the one row ``lq_state``, whose counts of
leases and parks are kept by the statements that change a lock (claim,
claim_many, ack, ack_many, nack with and without a delay, extend, expiry,
pause/resume, purge, the undo of an interrupted claim, bury and skip).  A random mix of
those, with a manual clock that lets leases and parks run out, is checked
against the rows after each step, through a second connection.
"""

from __future__ import annotations

import random
import sqlite3
from typing import Any

import pytest

from leasequeue import LeaseLost, SQLiteTransport
from leasequeue.testing import ManualClock

GROUPS = [f"g{i}" for i in range(6)]


def rows_say(db: sqlite3.Connection) -> tuple[int, ...]:
    return (
        db.execute("SELECT count(*) FROM lq_messages").fetchone()[0],
        db.execute("SELECT count(*) FROM lq_groups WHERE messages > 0").fetchone()[0],
        db.execute("SELECT count(*) FROM lq_groups WHERE lock = 1").fetchone()[0],
        db.execute("SELECT count(*) FROM lq_groups WHERE lock = 2").fetchone()[0],
        db.execute("SELECT count(*) FROM lq_groups WHERE paused = 1").fetchone()[0],
        db.execute("SELECT count(*) FROM lq_groups WHERE lock = 3").fetchone()[0],
    )


def state_says(db: sqlite3.Connection) -> tuple[int, ...]:
    return db.execute(
        "SELECT s.messages, s.groups, s.leased, s.parked, s.paused, q.buried FROM lq_state AS s, lq_quarantine AS q"
    ).fetchone()


@pytest.mark.parametrize("seed", range(4))
def test_counters_follow_every_lock_change(tmp_path: Any, seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock()
    path = tmp_path / "q.db"
    leases: list[Any] = []
    done: list[str] = []
    dues: dict[int, float] = {}  # seq -> due time, of the messages published with a delay
    with SQLiteTransport(path, clock=clock) as t:
        db = sqlite3.connect(path)
        try:
            for step in range(400):
                op = rng.choice(
                    ["publish", "publish", "publish_many", "claim", "claim", "claim_many", "ack", "ack_many",
                     "nack", "park", "extend", "pause", "resume", "purge", "tick", "stats", "bury", "skip",
                     "later", "later_many", "release", "retry"]
                )
                group = rng.choice(GROUPS)
                try:
                    if op == "publish":
                        t.publish(group, step, rng.randrange(3))
                    elif op == "publish_many":
                        t.publish_many([(rng.choice(GROUPS), step) for _ in range(rng.randrange(4))])
                    elif op == "later":
                        delay = rng.choice([0.5, 3.0, 8.0])
                        seq = t.publish(group, step, key=rng.choice([None, "k1", "k2"]), delay=delay)
                        if seq not in dues:
                            dues[seq] = db.execute("SELECT due_at FROM lq_messages WHERE seq = ?", (seq,)).fetchone()[0]
                    elif op == "later_many":
                        seqs = t.publish_many([(rng.choice(GROUPS), step, 0, rng.choice([None, "k1"]))
                                               for _ in range(rng.randrange(4))], delay=rng.choice([1.0, 4.0]))
                        for seq in seqs:
                            if seq not in dues:
                                dues[seq] = db.execute("SELECT due_at FROM lq_messages WHERE seq = ?",
                                                       (seq,)).fetchone()[0]
                    elif op == "retry":
                        t.retry(group)
                    elif op == "claim":
                        lease = t.claim("w", rng.choice([1.0, 5.0]), rng.randrange(3))
                        if lease is not None:
                            leases.append(lease)
                    elif op == "claim_many":
                        leases += t.claim_many("w", rng.choice([1.0, 5.0]), rng.randrange(4))
                    elif op == "ack_many":
                        picked = rng.sample(leases, min(len(leases), 2))
                        t.ack_many(picked)
                    elif op == "pause":
                        t.pause(group)
                    elif op == "resume":
                        t.resume(group)
                    elif op == "purge":
                        t.purge(group)
                    elif op == "skip":
                        t.skip(group)
                    elif op == "tick":
                        clock.advance(rng.choice([0.5, 2.0, 6.0]))
                    elif op == "stats":
                        stats = t.stats()
                        assert tuple(stats[:6]) == state_says(db)  # expiry applied by stats() itself
                        now = db.execute("SELECT now FROM lq_state").fetchone()[0]
                        held = [seq for (seq,) in db.execute("SELECT seq FROM lq_messages")]
                        assert stats.scheduled == sum(1 for seq in held if dues.get(seq, -1e300) >= now)
                    elif leases:  # ack, nack, park, extend: an old lease now and then (LeaseLost)
                        lease = rng.choice(leases)
                        if op == "ack":
                            t.ack(lease)
                        elif op == "nack":
                            t.nack(lease)
                        elif op == "park":
                            t.nack(lease, rng.choice([1.0, 4.0]))
                        elif op == "bury":
                            t.bury(lease, f"step {step}")
                        elif op == "release":
                            t.release(lease, rng.choice([0.0, 0.0, 2.0]))
                        else:
                            leases.append(t.extend(lease, rng.choice([1.0, 5.0])))
                except LeaseLost:
                    pass
                done.append(op)
                assert state_says(db) == rows_say(db), done[-20:]
                # A scheduled head (lock 4) waits for its own due time, which is its lock's end.
                assert db.execute(
                    "SELECT count(*) FROM lq_groups AS g JOIN lq_messages AS m ON m.gid = g.gid AND m.seq = g.head_seq"
                    " WHERE g.lock = 4 AND (m.due_at IS NULL OR m.due_at != g.expires_at)").fetchone()[0] == 0
        finally:
            db.close()
    assert {"claim", "ack", "nack", "park", "extend", "resume", "purge", "tick", "bury", "skip", "later",
            "later_many", "release", "retry"} <= set(done)
    assert any(due is not None for due in dues.values())


def test_expiry_counts_out_leases_and_parks(tmp_path: Any) -> None:
    """A lease and a park that ran out count as neither, in stats() and in the
    row it reads; extending an expired (but still current) lease counts it in
    again; resume ends a park."""
    clock = ManualClock()
    with SQLiteTransport(tmp_path / "q.db", clock=clock) as t:
        for group in ("a", "b", "c"):
            t.publish(group, 1)
        a = t.claim("w", 1.0)
        t.nack(t.claim("w", 10.0), 1.0)  # b parked until 1
        c = t.claim("w", 10.0)
        assert tuple(t.stats())[2:4] == (2, 1)
        clock.advance(2.0)
        assert tuple(t.stats())[2:4] == (1, 0)  # a's lease and b's park ran out
        a = t.extend(a, 5.0)  # nobody claimed a since: still current, leased again
        assert tuple(t.stats())[2:4] == (2, 0)
        t.nack(c, 3.0)
        assert tuple(t.stats())[2:4] == (1, 1)
        assert t.resume("c")
        assert tuple(t.stats())[2:4] == (1, 0)
        t.pause("a")
        assert t.purge("a") == 1
        assert tuple(t.stats()) == (2, 2, 0, 0, 0, 0, 0)
