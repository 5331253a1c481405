"""``conn=`` with a commit is the plain call, whatever the history: random
operations (publishes with and without delays and keys, batches with
repeated keys, claims, and every settling call, stale leases included) run
on two SQLite files, on one through the application's connection in its own
transaction and on the other plainly; some transactions are rolled back,
and then the other file does nothing.  Every answer and error, the groups
at each step, and at the end everything observable must be the same."""

from __future__ import annotations

import random
import sqlite3
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from leasequeue import LeaseLost, SQLiteTransport
from leasequeue.testing import ManualClock
from leasequeue.testing._contract_base import fingerprint


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        result = call()
    except LeaseLost:
        return "LeaseLost"
    if isinstance(result, list):
        return [(x.seq, x.group_id, x.attempt) if hasattr(x, "seq") else x for x in result]
    if hasattr(result, "seq"):
        return (result.seq, result.group_id, result.attempt, result.expires_at, result.event)
    return result


@pytest.mark.parametrize("seed", range(16))
def test_conn_then_commit_is_the_plain_call(tmp_path: Any, seed: int) -> None:
    rng = random.Random(seed)
    in_tx_clock, plain_clock = ManualClock(1000.0), ManualClock(1000.0)
    window = 5.0 if seed % 2 else 0.0
    in_tx = SQLiteTransport(tmp_path / "in_tx.db", clock=in_tx_clock, dedup_window=window)
    plain = SQLiteTransport(tmp_path / "plain.db", clock=plain_clock, dedup_window=window)
    conn = sqlite3.connect(in_tx.path)
    leases: List[Tuple[Any, Any]] = []  # (lease on in_tx, lease on plain)
    groups = ["a", "b", "c"]
    try:
        for step in range(500):
            kind = rng.choice(["publish", "publish", "publish_many", "claim", "claim", "claim", "settle", "settle",
                               "settle", "settle", "tick", "resume"])
            if kind == "resume":  # lifts a bury or a park: no group stays stuck
                group = rng.choice(groups)
                assert in_tx.resume(group) == plain.resume(group), step
                continue
            if kind == "tick":
                dt = rng.choice([0.5, 1.0, 3.0, 20.0])
                in_tx_clock.advance(dt)
                plain_clock.advance(dt)
                continue
            if kind == "claim":
                visibility = rng.choice([5.0, 30.0])
                a, b = in_tx.claim("w", visibility), plain.claim("w", visibility)
                assert _outcome(lambda: a) == _outcome(lambda: b), step
                if a is not None:
                    leases.append((a, b))
                continue
            rollback = rng.random() < 0.2
            tx_call: Callable[[Optional[sqlite3.Connection]], Any]
            if kind == "publish":
                group, event = rng.choice(groups), rng.randrange(100)
                options: Dict[str, Any] = {}
                if rng.random() < 0.3:
                    options["delay"] = rng.choice([1.0, 10.0])
                if rng.random() < 0.7:
                    options["key"] = "k1"
                priority = rng.randrange(3)

                def call_publish(c: Optional[sqlite3.Connection], g: str = group, e: int = event,
                                 p: int = priority, o: Dict[str, Any] = options) -> Any:
                    return in_tx.publish(g, e, p, conn=c, **o) if c is not None else plain.publish(g, e, p, **o)

                tx_call = call_publish
            elif kind == "publish_many":
                items = []
                for _ in range(rng.randrange(1, 4)):
                    item: Tuple[Any, ...] = (rng.choice(groups), rng.randrange(100), rng.randrange(3))
                    if rng.random() < 0.4:
                        item += (rng.choice(["k1", "k2", "k3"]),)
                    items.append(item)
                delay = rng.choice([0.0, 0.0, 4.0])

                def call_publish_many(c: Optional[sqlite3.Connection], i: List[Any] = items, d: float = delay) -> Any:
                    return in_tx.publish_many(i, delay=d, conn=c) if c is not None else plain.publish_many(i, delay=d)

                tx_call = call_publish_many
            else:
                if not leases:
                    continue
                a, b = rng.choice(leases[-3:])  # mostly current: some stale
                how = rng.choice(["ack", "ack", "ack", "ack_many", "nack", "nack_delay", "bury", "release",
                                  "release_delay"])

                def call_settle(c: Optional[sqlite3.Connection], how: str = how, a: Any = a, b: Any = b) -> Any:
                    t, lease = (in_tx, a) if c is not None else (plain, b)
                    kw: Dict[str, Any] = {"conn": c} if c is not None else {}
                    if how == "ack":
                        return t.ack(lease, **kw)
                    if how == "ack_many":
                        return len(t.ack_many([lease], **kw))
                    if how == "nack":
                        return t.nack(lease, **kw)
                    if how == "nack_delay":
                        return t.nack(lease, 7.0, **kw)
                    if how == "bury":
                        return t.bury(lease, "r", **kw)
                    if how == "release":
                        return t.release(lease, **kw)
                    return t.release(lease, 7.0, **kw)

                tx_call = call_settle

            conn.execute("BEGIN IMMEDIATE")
            got = _outcome(lambda: tx_call(conn))
            if rollback:
                conn.rollback()
            else:
                conn.commit()
                want = _outcome(lambda: tx_call(None))
                assert got == want, (step, kind)
            assert [tuple(g) for g in in_tx.groups()] == [tuple(g) for g in plain.groups()], (step, kind, rollback)
            assert tuple(in_tx.stats()) == tuple(plain.stats()), (step, kind, rollback)
        assert fingerprint(in_tx, in_tx_clock, False) == fingerprint(plain, plain_clock, False)
    finally:
        conn.close()
        in_tx.close()
        plain.close()
