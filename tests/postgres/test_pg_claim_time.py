"""A claim's time on the server's clock: read once the claim holds its group.

A claim that read the server's clock and was then held up before it locked
its group (a busy machine; here, deterministically, its expiry announcement
waiting for the queue's listen lock) could take a group whose previous
message was claimed and acked meanwhile, and lease the next message at its
old reading: "before" the previous lease, which broke docs/decisions.md's
"the transport's time never runs backwards" per group (the many-process
test saw it as two live leases in one group), and with a hold-up longer
than the visibility the new lease was over before it was granted, so a
second worker was given the same message at once.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, List

import psycopg
import pytest


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def server_now(conn: Any) -> float:
    return float(conn.execute("SELECT extract(epoch FROM clock_timestamp())::double precision").fetchone()[0])


# How the held-up claim is made: a claim (floor 5: it cannot take the group
# it frees), a batch that takes both groups in one index walk, and a batch
# with a floor (claim by claim).
HOW = {
    "claim": lambda t: [t.claim("slow", 0.3, min_priority=5)],
    "claim_many": lambda t: t.claim_many("slow", 0.3, 2),
    "claim_many-floor": lambda t: t.claim_many("slow", 0.3, 2, min_priority=5),
}


@pytest.mark.parametrize("how", sorted(HOW))
def test_a_held_up_claim_leases_at_a_time_after_the_previous_ack(conninfo: str, make_pg: Any,
                                                                 queue_name: str, how: str) -> None:
    t = make_pg(queue_name)
    slow = make_pg(queue_name)
    other = make_pg(queue_name)
    # An expired lease (priority 0): the next claim frees it.
    t.publish("expired", "x")
    assert t.claim("w0", 0.0) is not None
    t.publish("g", "first", priority=5)
    t.publish("g", "second", priority=5)
    time.sleep(0.01)  # the lease of "expired" is now strictly over
    hold = 7_340_033  # an advisory lock key of this test's own
    name = f"leasequeue_test_hold_{queue_name}"
    with psycopg.connect(conninfo, autocommit=True) as admin:
        # A hold-up, injected: the slow claim reads the clock, starts freeing
        # the expired lock and then waits for a lock this test holds (a
        # trigger on that one row of this queue; nothing else touches it).
        admin.execute(f"""
            CREATE FUNCTION public.{name}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_advisory_xact_lock({hold}); RETURN NEW; END $$""")
        admin.execute(f"""
            CREATE TRIGGER {name} BEFORE UPDATE ON leasequeue.groups FOR EACH ROW
            WHEN (OLD.queue = {t._queue} AND OLD.group_id = 'expired')
            EXECUTE FUNCTION public.{name}()""")
        try:
            admin.execute("BEGIN")
            admin.execute("SELECT pg_advisory_xact_lock(%s)", (hold,))
            got: List[Any] = []
            errors: List[BaseException] = []

            def run() -> None:
                try:
                    got.extend(HOW[how](slow))
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            thread = threading.Thread(target=run)
            thread.start()
            try:
                with psycopg.connect(conninfo, autocommit=True) as watch:
                    wait_until(lambda: watch.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE '%leasequeue.claim%'").fetchone()[0] > 0)
                    time.sleep(0.5)  # longer than the slow claim's visibility
                    # Meanwhile "g"'s first message is claimed and acked.
                    first = t.claim("w1", 30, min_priority=5)
                    assert first is not None and first.event == "first"
                    t.ack(first)
                    acked_at = server_now(watch)
            finally:
                admin.execute("COMMIT")
                thread.join(30)
        finally:
            admin.execute(f"DROP TRIGGER {name} ON leasequeue.groups")
            admin.execute(f"DROP FUNCTION public.{name}()")
    assert not errors, errors
    if how == "claim_many":  # the freed group first (the smaller round-robin key), at the same time
        freed, second = got
        assert freed.event == "x" and freed.attempt == 2 and freed.expires_at == second.expires_at
    else:
        (second,) = got
    assert second is not None and second.event == "second" and second.attempt == 1
    granted = second.expires_at - 0.3
    # Granted after the previous lease of the group, and after its ack.
    assert granted >= first.expires_at - 30
    assert granted >= acked_at, f"leased at {granted}, before the previous message's ack at {acked_at}"
    # So the lease is live: nobody else gets the message now.
    assert other.claim("w2", 30, min_priority=5) is None
    info = t.group("g")
    assert info is not None and info.last_claimed_at == granted
