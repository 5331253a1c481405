"""What an open application transaction (conn=) holds up on PostgreSQL, as
docs/decisions.md pins it: an open ack holds its group (publishes to it
wait; claims serve the other groups); an open nack holds the group's row
only (publishes to it go on); drop_queue waits for an open publish and
leaves nothing of it behind.  Real threads, real server."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, List

import psycopg

from leasequeue import PostgresTransport, QueueNotFound

LIVENESS = 30.0


def _in_thread(call: Callable[[], Any]) -> Any:
    done: List[Any] = []

    def run() -> None:
        try:
            done.append(call())
        except BaseException as exc:  # reported to the test
            done.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


def test_an_open_ack_holds_its_group_not_the_others(conninfo: str, make_pg: Callable[..., Any],
                                                    queue_name: str) -> None:
    t = make_pg(queue_name)
    t.publish("g", "g1")
    t.publish("h", "h1")
    lease = t.claim("w", 60)
    assert lease.group_id == "g"
    with psycopg.connect(conninfo) as conn:
        t.ack(lease, conn=conn)
        thread, done = _in_thread(lambda: t.publish("g", "g2"))
        other = t.claim("w", 60)  # the other group is served meanwhile
        assert other is not None and other.group_id == "h"
        t.publish("k", "k1")  # and other groups take publishes
        time.sleep(0.3)
        assert done == []  # the publish to g waits for the ack's commit
        conn.commit()
        thread.join(LIVENESS)
    assert len(done) == 1 and isinstance(done[0], int)
    assert [m.event for m in t.peek("g", 5)] == ["g2"]


def test_an_open_nack_holds_the_groups_row_only(conninfo: str, make_pg: Callable[..., Any],
                                                queue_name: str) -> None:
    t = make_pg(queue_name)
    t.publish("g", "g1")
    lease = t.claim("w", 60)
    with psycopg.connect(conninfo) as conn:
        t.nack(lease, conn=conn)
        started = time.monotonic()
        t.publish("g", "g2")  # goes on
        assert time.monotonic() - started < 5.0
        assert t.claim("w", 60) is None  # the group's row is held: claims skip it
        conn.commit()
    again = t.claim("w", 60)
    assert (again.event, again.attempt) == ("g1", 2)


def test_drop_queue_waits_for_an_open_publish_and_leaves_nothing(conninfo: str, queue_name: str) -> None:
    t = PostgresTransport(conninfo, queue=queue_name)
    try:
        with psycopg.connect(conninfo) as conn:
            t.publish("new-group", "open", conn=conn)
            thread, done = _in_thread(lambda: PostgresTransport.drop_queue(conninfo, queue_name))
            time.sleep(0.3)
            assert done == []  # the drop waits for the publishing transaction
            conn.commit()
            thread.join(LIVENESS)
        assert done == [True]
        with psycopg.connect(conninfo, autocommit=True) as admin:
            orphans = admin.execute(
                "SELECT (SELECT count(*) FROM leasequeue.messages m WHERE NOT EXISTS "
                "(SELECT 1 FROM leasequeue.queues q WHERE q.id = m.queue)), "
                "(SELECT count(*) FROM leasequeue.groups g WHERE NOT EXISTS "
                "(SELECT 1 FROM leasequeue.queues q WHERE q.id = g.queue))").fetchone()
        assert orphans == (0, 0)
        try:
            t.stats()
        except QueueNotFound:
            pass
        else:
            raise AssertionError("stats() of a dropped queue did not fail")
    finally:
        t.close()


def test_a_waiting_claim_backs_off_while_an_expired_lease_is_held(conninfo: str, make_pg: Callable[..., Any],
                                                                   queue_name: str) -> None:
    """An ack in an open transaction holds a lease past its end: a waiting
    claim cannot take it and cannot know when the transaction ends (a
    rollback frees it without a notification).  It looks again after 2, 4,
    8 ... ms, at most 100 ms apart: a handful of looks, not one every 2 ms;
    and after the rollback it gets the message within that bound."""
    t = make_pg(queue_name)
    waiter_t = make_pg(queue_name)
    t.publish("g", "x")
    lease = t.claim("w", 0.3)
    looks: List[float] = []
    real = waiter_t._claim_report

    def counted(*args: Any) -> Any:
        looks.append(time.monotonic())
        return real(*args)

    waiter_t._claim_report = counted
    with psycopg.connect(conninfo) as conn:
        t.ack(lease, conn=conn)
        thread, got = _in_thread(lambda: waiter_t.claim("waiter", 60, timeout=30.0))
        time.sleep(2.0)  # the lease ended 0.3 s in; the transaction stays open
        assert got == []
        held_looks = len(looks)
        conn.rollback()
        rolled_back = time.monotonic()
        thread.join(LIVENESS)
    assert got and got[0] is not None and (got[0].event, got[0].attempt) == ("x", 2)
    assert held_looks < 60, f"{held_looks} looks in 2 s: the claim polled"
    assert looks[-1] - rolled_back < 1.0
