"""The contract's Part 5 (docs/contract.md) on PostgreSQL, what the
conformance kit cannot see: other processes and real concurrent connections,
the server's clock, the keys kept past their messages, and bad input leaving
the database as it was.

* A waiting claim in another process wakes for a delayed message when it
  becomes due, without polling: it sleeps until the queue's earliest lock
  end (a scheduled head is a lock until its due), which a delayed publish,
  or an ack exposing a scheduled message, tells its timekeeper of.  Counted
  in claims (round trips) made while it waits, not in seconds.
* Two connections publishing one key at once: one message.
* A key held past its message (``dedup_window``) lives in ``leasequeue.keys``
  and is dropped lazily once its hold is over.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable, List, Tuple

import psycopg
import pytest

from leasequeue import LeaseLost, LeaseQueueError, PostgresTransport
from leasequeue._backends.sqlfiles import load_script
from leasequeue.testing import ManualClock

INT64_MIN = -(2**63)

# The waiting process: one claim(timeout=) on the queue; it reports what it
# got and how many claims (round trips) it made meanwhile.
_WAITER = r"""
import json, sys, time
from leasequeue import PostgresTransport
conninfo, queue = sys.argv[1:3]
t = PostgresTransport(conninfo, queue=queue)
looks = []
real = t._claim_report
def counted(*args):
    looks.append(time.time())
    return real(*args)
t._claim_report = counted
cpu = time.process_time()
lease = t.claim("far", 60.0, timeout=30.0)
cpu = time.process_time() - cpu
print(json.dumps({"seq": lease and lease.seq, "group_id": lease and lease.group_id,
                  "claimed_at": lease and lease.expires_at - 60.0, "looks": len(looks), "cpu": cpu}))
t.close()
"""


def _signed_up(conninfo: str, queue_id: int) -> bool:
    with psycopg.connect(conninfo) as conn:
        return bool(conn.execute("SELECT count(*) FROM leasequeue.listeners WHERE queue = %s",
                                 (queue_id,)).fetchone()[0])


@pytest.mark.parametrize("how", ["new group", "after an ack"])
def test_a_waiting_claim_in_another_process_wakes_when_the_message_is_due(
        conninfo: str, make_pg: Callable[..., Any], queue_name: str, how: str) -> None:
    """The other process's claim sleeps (it signed up as a listener: it only
    does so right before sleeping) when the delayed message is published or
    becomes its group's head; it gets the message after its due, by the
    server's clock, having made a handful of claims: one before it slept,
    one after signing up, one when told of the new lock end, one at the due
    (a poll would make one per poll interval: hundreds in the 1.5 s)."""
    t = make_pg(queue=queue_name)
    if how == "after an ack":
        t.publish("g", "first")
        first = t.claim("near", 60.0)
        t.publish("g", "later", delay=1.5)  # not the head: it holds nothing yet
        assert t.group("g").state == "leased" and t.stats().scheduled == 1
    child = subprocess.Popen([sys.executable, "-c", _WAITER, conninfo, queue_name],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 20
        while not _signed_up(conninfo, t._queue):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the other process never slept"
            time.sleep(0.02)
        time.sleep(0.2)  # asleep, not between a sign-up and its last look
        if how == "new group":
            seq = t.publish("g", "later", delay=1.5)
        else:
            seq = first.seq + 1
            t.ack(first)
        info = t.group("g")
        assert info.state == "scheduled" and info.due_at is not None
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    got = json.loads(out)
    assert (got["group_id"], got["seq"]) == ("g", seq)
    assert got["claimed_at"] > info.due_at  # never before its due (the server's clock)
    assert got["looks"] <= 6, got  # woken, not polling
    assert t.stats().scheduled == 0


def test_concurrent_publishes_of_one_key_make_one_message(make_pg: Callable[..., Any], queue_name: str) -> None:
    """Eight transports (eight connections) publish the same key into one
    group at the same instant, round after round, with and without a dedup
    window: each round stores one message, and every publisher gets its seq."""
    for window in (0.0, 30.0):
        ts = [make_pg(queue=queue_name, dedup_window=window) for _ in range(8)]
        for round_ in range(10):
            barrier = threading.Barrier(len(ts))
            seqs: List[int] = []
            errors: List[BaseException] = []

            def publish(t: Any, i: int) -> None:
                try:
                    barrier.wait()
                    seqs.append(t.publish("g", ("event", i), key=f"k{window}-{round_}"))
                except BaseException as exc:  # noqa: B036 - reported below
                    errors.append(exc)

            before = len(ts[0])
            threads = [threading.Thread(target=publish, args=(t, i)) for i, t in enumerate(ts)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(30)
            assert not errors, errors
            assert len(set(seqs)) == 1 and len(seqs) == len(ts), seqs
            assert len(ts[0]) == before + 1
            assert [m.key for m in ts[0].peek("g", 100)].count(f"k{window}-{round_}") == 1


def test_concurrent_keyed_batches_make_one_message_per_key(make_pg: Callable[..., Any], queue_name: str) -> None:
    """Batches with overlapping keys in several groups, their items in
    opposite orders, at once: no deadlock, and each key is stored once."""
    ts = [make_pg(queue=queue_name) for _ in range(6)]
    items = [(f"g{i % 3}", i, 0, f"k{i}") for i in range(12)]
    barrier = threading.Barrier(len(ts))
    results: List[List[int]] = []
    errors: List[BaseException] = []

    def publish(t: Any, i: int) -> None:
        try:
            barrier.wait()
            batch = items if i % 2 else list(reversed(items))
            seqs = t.publish_many(batch)
            results.append(seqs if i % 2 else list(reversed(seqs)))
        except BaseException as exc:  # noqa: B036 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(t, i)) for i, t in enumerate(ts)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors
    assert all(r == results[0] for r in results), results
    assert len(ts[0]) == len(items)
    assert sorted(m.key for g in ("g0", "g1", "g2") for m in ts[0].peek(g, 100)) == sorted(k for *_, k in items)


def test_a_key_outlives_its_message_in_the_keys_table(conninfo: str, make_pg: Callable[..., Any],
                                                      queue_name: str) -> None:
    """With a window the key stays held after its ack, also for a transport
    of the queue without a window (it tests the stored hold at the queue's
    latest time, reading no clock); once the window is over the key
    publishes again, and keyed publishes sweep holds that are over."""
    clock = ManualClock(1000.0)
    t = make_pg(queue=queue_name, clock=clock, dedup_window=10.0)
    plain = make_pg(queue=queue_name, clock=clock)
    seq = t.publish("g", "e", key="k")
    t.ack(t.claim("w", 30.0))
    assert len(t) == 0 and t.groups() == []
    assert plain.publish("g", "again", key="k") == seq and len(t) == 0  # held past its message
    clock.set(1009.5)
    assert t.publish("g", "again", key="k") == seq
    clock.set(1010.0)  # published at 1000, window 10: over at 1010
    again = t.publish("g", "again", key="k")
    assert again > seq and len(t) == 1

    def kept() -> int:
        with psycopg.connect(conninfo) as conn:
            return int(conn.execute("SELECT count(*) FROM leasequeue.keys WHERE queue = %s",
                                    (t._queue,)).fetchone()[0])

    for i in range(20):
        t.publish(f"h{i}", i, key="x")
    assert kept() == 21
    clock.set(1100.0)
    t.publish("z", 0, key="z")  # sweeps a few of the 21 holds that are over
    assert kept() == 21 + 1 - 8
    while kept() > 1:
        t.publish("z", 0, key="z")
    assert kept() == 1  # z's own


def test_delay_on_the_server_clock(pg: Any) -> None:
    """Without an injected clock, the due time is the server's: scheduled,
    then, once due, claimed; peek keeps the due time and the key."""
    seq = pg.publish("g", "e", delay=0.4, key="k")
    [message] = pg.peek("g")
    assert (message.seq, message.key) == (seq, "k") and message.due_at > time.time() - 5
    assert pg.claim("w", 30.0) is None and pg.stats().scheduled == 1
    lease = pg.claim("w", 30.0, timeout=5.0)
    assert lease is not None and lease.seq == seq
    assert lease.expires_at - 30.0 > message.due_at and pg.stats().scheduled == 0
    assert pg.peek("g")[0].due_at == message.due_at


def test_release_and_retry_wake_a_waiting_claim(make_pg: Callable[..., Any]) -> None:
    """release(lease) frees the message as nack does, and retry(group) of a
    buried group makes its head claimable: each wakes a waiting claim of
    another transport of the queue (its listener heard it), and the
    delivery it gets carries attempt 1 again."""
    a = make_pg()
    b = make_pg(queue=a._name)
    a.publish("g", "e")
    lease = a.claim("w", 60.0)

    def woken_by(act: Callable[[], None]) -> Any:
        got: List[Any] = []
        th = threading.Thread(target=lambda: got.append(b.claim("x", 60.0, timeout=20.0)))
        th.start()
        time.sleep(0.3)
        assert got == []
        act()
        th.join(20)
        assert got and got[0] is not None
        return got[0]

    again = woken_by(lambda: a.release(lease))
    assert (again.seq, again.attempt, again.worker_id) == (lease.seq, 1, "x")
    with pytest.raises(LeaseLost):
        a.ack(lease)  # its delivery was released
    b.bury(again, "why")
    assert a.group("g").state == "buried"
    fresh = woken_by(lambda: a.retry("g") or pytest.fail("retry found nothing"))
    assert (fresh.seq, fresh.attempt) == (lease.seq, 1)
    with pytest.raises(LeaseLost):
        b.ack(again)
    b.ack(fresh)
    assert len(a) == 0


def _state(conninfo: str, t: Any) -> Tuple[Any, ...]:
    """Everything of the queue in the database, and its clock."""
    with psycopg.connect(conninfo) as conn:
        rows = tuple(
            tuple(conn.execute(sql, (t._queue,)).fetchall())
            for sql in ("SELECT * FROM leasequeue.groups WHERE queue = %s ORDER BY group_id",
                        "SELECT * FROM leasequeue.messages WHERE queue = %s ORDER BY group_id, seq",
                        "SELECT * FROM leasequeue.keys WHERE queue = %s ORDER BY group_id, key",
                        "SELECT latest FROM leasequeue.queues WHERE id = %s"))
        last = conn.execute(f"SELECT last_value FROM leasequeue.seq_{t._queue}").fetchone()
    return rows + (last,)


class _Unpicklable:
    def __reduce__(self) -> Any:
        raise RuntimeError("no")


def test_bad_input_changes_nothing(conninfo: str, make_pg: Callable[..., Any]) -> None:
    """Every bad argument of the Part 5 calls raises its error and leaves the
    queue, its keys, its message sequence and its time exactly as they were
    (the clock is not read)."""
    clock = ManualClock(1000.0)
    t = make_pg(clock=clock, dedup_window=5.0)
    t.publish("g", "e", key="k")
    t.publish("g", "f", delay=3.0)
    lease = t.claim("w", 30.0)
    t.publish("h", "x", delay=math.inf)
    reads = []
    real_clock = clock

    def counting() -> float:
        reads.append(1)
        return real_clock()

    t._clock = counting
    clock.advance(1.0)
    before = _state(conninfo, t)
    calls: List[Tuple[Any, Callable[[], Any]]] = [
        (TypeError, lambda: t.publish("g", "e", delay="1")),
        (TypeError, lambda: t.publish("g", "e", delay=True)),
        (ValueError, lambda: t.publish("g", "e", delay=-1.0)),
        (ValueError, lambda: t.publish("g", "e", delay=math.nan)),
        (TypeError, lambda: t.publish("g", "e", key=1)),
        (TypeError, lambda: t.publish("g", "e", key=b"k")),
        (TypeError, lambda: t.publish(1, "e", delay=1.0, key="k")),
        (RuntimeError, lambda: t.publish("g", _Unpicklable(), delay=1.0, key="n")),
        (TypeError, lambda: t.publish_many([("g", "e", 0, 5)])),
        (ValueError, lambda: t.publish_many([("g", "e", 0, "k", 1)])),
        (TypeError, lambda: t.publish_many([("g", "e", 0, "a"), ("g", "e", "0", "b")], delay=1.0)),
        (ValueError, lambda: t.publish_many([("g", "e", 0, "a")], delay=-2)),
        (TypeError, lambda: t.publish_many([("g", "e", 0, "a")], delay=None)),
        (RuntimeError, lambda: t.publish_many([("g", "e", 0, "a"), ("g", _Unpicklable(), 0, "b")], delay=1.0)),
        (TypeError, lambda: t.release("lease")),
        (ValueError, lambda: t.release(lease, -1.0)),
        (TypeError, lambda: t.release(lease, "1")),
        (TypeError, lambda: t.retry(None)),
        (TypeError, lambda: t.retry(b"g")),
    ]
    for error, call in calls:
        with pytest.raises(error):
            call()
        assert _state(conninfo, t) == before, call
    assert reads == []
    for bad, error in (("1", TypeError), (True, TypeError), (-1.0, ValueError), (math.nan, ValueError)):
        with pytest.raises(error):
            PostgresTransport(conninfo, queue=t._name, dedup_window=bad)
    with pytest.raises(TypeError, match="clock"):  # clock is checked first
        PostgresTransport(conninfo, queue=t._name, clock=1, dedup_window="x")
    assert _state(conninfo, t) == before
    t.close()
    for call in (lambda: t.publish("g", "e", delay=1.0), lambda: t.publish("g", "e", key="k"),
                 lambda: t.publish_many([("g", "e", 0, "k")]), lambda: t.release(lease), lambda: t.retry("g")):
        with pytest.raises(LeaseQueueError, match="closed"):
            call()
    assert reads == [] and _state(conninfo, t) == before


def test_the_scheduled_count_is_a_range_of_its_index(conninfo: str, pg: Any) -> None:
    """stats().scheduled counts the messages not yet due through the partial
    index messages_due (delayed messages only), not by reading the queue's
    messages: the statement stats() runs, planned generically as the
    server-side functions' statements are, with 100k messages queued."""
    q = pg._queue
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO leasequeue.messages (queue, group_id, seq, payload, due_at) "
            "SELECT %s, 'g' || (i %% 1000), i, '\\x80'::bytea, CASE WHEN i %% 50 = 0 THEN 1e9 + i END "
            "FROM generate_series(1, 100000) i", (q,))
        try:
            conn.execute("ANALYZE leasequeue.messages")
            conn.execute("SET plan_cache_mode = force_generic_plan")
            conn.execute("PREPARE scheduled(int, float8) AS "
                         "SELECT count(*) FROM leasequeue.messages m WHERE m.queue = $1 AND m.due_at >= $2")
            plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN EXECUTE scheduled({q}, 1e9 + 99000)"))
            assert "messages_due" in plan and "Seq Scan" not in plan, plan
            assert conn.execute(f"EXECUTE scheduled({q}, 1e9 + 99000)").fetchone()[0] == 21
        finally:
            conn.execute("DELETE FROM leasequeue.messages WHERE queue = %s", (q,))
    # ... which is the statement stats() runs:
    assert "m.queue = p_queue AND m.due_at >= v_now" in load_script("postgres")
