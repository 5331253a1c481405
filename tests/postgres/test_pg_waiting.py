"""Part 2 waiting on PostgreSQL: wake-ups, floors, fairness, no herd, close,
cancellation, expiry, LISTEN/NOTIFY across transports (real threads, a real
server)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any, Callable, List, Optional

import pytest

from helpers import FakeClock
from leasequeue import LeaseQueueError


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


class Claimer(threading.Thread):
    """A thread running one waiting claim; ``result`` when done."""

    def __init__(self, t: Any, worker: str, floor: int = 0, timeout: Optional[float] = 60.0) -> None:
        super().__init__(daemon=True)
        self.t, self.worker, self.floor, self.timeout = t, worker, floor, timeout
        self.result: Any = "pending"
        self.error: Optional[BaseException] = None
        self.took = 0.0

    def run(self) -> None:
        start = time.monotonic()
        try:
            self.result = self.t.claim(self.worker, 30, self.floor, timeout=self.timeout)
        except BaseException as exc:  # noqa: B036 - reported to the test
            self.error = exc
        self.took = time.monotonic() - start


def asleep(t: Any, n: int) -> bool:
    """``n`` waiting claims of ``t`` sleep (made their first claim, not woken)."""
    room = t._room
    with room._lock:
        return sum(1 for w in room._waiters if not w.claiming and not w.woken) >= n


def start_waiters(t: Any, specs: List[tuple]) -> List[Claimer]:
    """Start claimers one after the other, each asleep before the next."""
    out = []
    for worker, floor in specs:
        c = Claimer(t, worker, floor)
        c.start()
        n = len(out) + 1
        wait_until(lambda: asleep(t, n))
        out.append(c)
    return out


def test_timeout_validated_before_anything(pg: Any) -> None:
    pg.publish("g", 1)
    for bad, err in [(-1, ValueError), (math.nan, ValueError), ("1", TypeError), (True, TypeError)]:
        with pytest.raises(err):
            pg.claim("w", 30, timeout=bad)
    assert pg.stats().leased == 0


def test_waiting_claim_wakes_on_publish_and_times_out(pg: Any) -> None:
    start = time.monotonic()
    assert pg.claim("w", 30, timeout=0.3) is None
    assert 0.25 <= time.monotonic() - start < 5
    [c] = start_waiters(pg, [("w1", 0)])
    pg.publish("g", {"n": 1})
    c.join(30)
    assert c.result.event == {"n": 1} and c.result.worker_id == "w1"


def test_wake_from_another_transport_of_the_queue(make_pg: Any, queue_name: str) -> None:
    a, b = make_pg(queue_name), make_pg(queue_name)
    [c] = start_waiters(a, [("w1", 0)])
    b.publish("g", "from b")
    c.join(30)
    assert c.result.event == "from b"


def test_floor_decides_who_is_woken(pg: Any) -> None:
    high, low = start_waiters(pg, [("high", 5), ("low", 0)])
    pg.publish("g0", "low prio", 0)
    low.join(30)
    assert low.result.event == "low prio"
    assert high.is_alive()  # a priority-0 message does not wake a floor-5 claim
    pg.publish("g5", "high prio", 5)
    high.join(30)
    assert high.result.event == "high prio"


def test_fair_longest_waiter_first(pg: Any) -> None:
    claimers = start_waiters(pg, [(f"w{i}", 0) for i in range(4)])
    for i in range(4):
        pg.publish(f"g{i}", i)
        claimers[i].join(30)
        assert claimers[i].result.event == i, f"waiter {i} should have been served"
        assert all(c.is_alive() for c in claimers[i + 1:])


class CountingClaims:
    """Counts the waiting claims' round trips (to see a herd)."""

    def __init__(self, t: Any) -> None:
        self.calls = 0
        inner = t._claim_report

        def counted(*args: Any) -> Any:
            self.calls += 1
            return inner(*args)

        t._claim_report = counted


def test_no_herd_one_message_wakes_one_waiter(pg: Any) -> None:
    counter = CountingClaims(pg)
    claimers = start_waiters(pg, [(f"w{i}", 0) for i in range(6)])
    wait_until(lambda: counter.calls >= 6)
    time.sleep(0.2)
    before = counter.calls
    pg.publish("g", "one")
    wait_until(lambda: sum(not c.is_alive() for c in claimers) == 1)
    time.sleep(0.3)
    assert counter.calls - before == 1, "one message woke more than one waiting claim"
    assert sum(c.is_alive() for c in claimers) == 5
    pg.close()
    for c in claimers:
        c.join(30)


def test_close_wakes_everyone_with_none(pg: Any) -> None:
    claimers = start_waiters(pg, [("a", 0), ("b", 3), ("c", 0)])
    pg.close()
    for c in claimers:
        c.join(30)
        assert c.result is None and c.error is None
    assert pg.closed
    start = time.monotonic()
    assert pg.claim("w", 30, timeout=None) is None
    assert time.monotonic() - start < 1
    with pytest.raises(LeaseQueueError):
        pg.publish("g", 1)
    pg.close()  # idempotent


def test_expiry_wakes_a_waiter_server_clock(pg: Any) -> None:
    pg.publish("g", "x")
    first = pg.claim("w0", 0.4)
    [c] = start_waiters(pg, [("w1", 0)])
    c.join(30)
    assert c.result.seq == first.seq and c.result.attempt == 2
    assert c.took >= 0.2


def test_expiry_on_manual_clock_wakes_on_stats(make_pg: Any) -> None:
    clock = FakeClock()
    t = make_pg(clock=clock)
    t.publish("g", "x")
    t.claim("w0", 100)
    c = Claimer(t, "w1", timeout=10)
    c.start()
    wait_until(lambda: len(t._room) == 1)
    time.sleep(0.1)
    assert c.is_alive()
    clock.advance(101)
    t.stats()  # reads the clock and expires the lease: the waiter is woken
    c.join(30)
    assert c.result.attempt == 2 and c.result.worker_id == "w1"


def test_unused_wake_is_handed_on(pg: Any) -> None:
    """A woken waiter that leaves without claiming passes its wake on."""
    counter = CountingClaims(pg)
    first, second = start_waiters(pg, [("w1", 0), ("w2", 0)])
    wait_until(lambda: counter.calls >= 2)
    pg.publish("g1", 1)
    pg.publish("g2", 2)
    first.join(30)
    second.join(30)
    assert {first.result.event, second.result.event} == {1, 2}


def test_aclaim_wakes_on_publish_from_a_thread(pg: Any) -> None:
    async def main() -> Any:
        task = asyncio.ensure_future(pg.aclaim("aw", 30, timeout=10))
        await asyncio.sleep(0.3)
        threading.Thread(target=pg.publish, args=("g", "async")).start()
        return await task

    lease = asyncio.run(main())
    assert lease.event == "async" and lease.worker_id == "aw"
    assert asyncio.run(pg.aclaim("aw", 30, timeout=0)) is None
    assert asyncio.run(pg.aclaim("aw", 30, timeout=0.2)) is None


def test_aclaim_cancelled_leaves_nothing_leased(pg: Any) -> None:
    async def main() -> List[Any]:
        got = []
        for i in range(40):
            pg.publish(f"g{i}", i)
            # A task cancelled after 0-3.5 ms: in the wait, or mid round trip.
            # (Not asyncio.wait_for: before Python 3.12 it can drop a result
            # that arrives as its timeout fires, cpython gh-86296.)
            task = asyncio.ensure_future(pg.aclaim("c", 30, timeout=None))
            await asyncio.sleep(0.0005 * (i % 8))
            task.cancel()
            try:
                got.append(await task)
            except asyncio.CancelledError:
                pass
        # Claims that were under way finish (and are undone) in the
        # background: let them, before the loop closes.
        while len(asyncio.all_tasks()) > 1:
            await asyncio.sleep(0.01)
        return got

    got = asyncio.run(main())
    for lease in got:
        pg.ack(lease)
    wait_until(lambda: pg.stats().leased == 0, timeout=10)
    left = 0
    while (lease := pg.claim("drain", 30)) is not None:
        assert lease.attempt == 1, "a cancelled claim must not count as a delivery"
        pg.ack(lease)
        left += 1
    assert left + len(got) == 40


def test_thread_interrupted_while_waiting_leaves_nothing(pg: Any) -> None:
    """An exception raised in the waiting thread ends its wait at once."""
    import ctypes

    c = Claimer(pg, "victim", timeout=None)
    c.start()
    wait_until(lambda: len(pg._room) == 1)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(c.ident), ctypes.py_object(KeyboardInterrupt))
    pg._room.wake_all()  # the async exception is raised when the thread runs Python code
    c.join(30)
    assert isinstance(c.error, KeyboardInterrupt)
    assert len(pg._room) == 0
    pg.publish("g", 1)
    assert pg.stats().leased == 0
    assert pg.claim("w", 30).attempt == 1


def test_no_notify_without_listeners_then_notify(conninfo: str, make_pg: Any) -> None:
    """Writers NOTIFY only while some transport listens for the queue (a
    NOTIFY serialises commits database-wide)."""
    import psycopg

    t = make_pg()
    raw = psycopg.connect(conninfo, autocommit=True)
    raw.execute(f"LISTEN leasequeue_{t._queue}")
    t.publish("a", 1)
    assert list(raw.notifies(timeout=0.3)) == []
    assert t.claim("w", 30, timeout=0.05) is not None  # signs this transport's listener up
    t.publish("b", 2)
    notes = list(raw.notifies(timeout=2, stop_after=1))
    assert [n.payload for n in notes] == ["0:2"]
    raw.close()


def test_sign_up_races_a_publish(make_pg: Any, queue_name: str) -> None:
    """A listener signing up while a publish commits: the first waiting claim
    either sees the message or is notified of it, every time."""
    import random

    rng = random.Random(5)
    publisher = make_pg(queue_name)
    for i in range(25):
        waiter = make_pg(queue_name)
        c = Claimer(waiter, f"w{i}", timeout=10)
        timer = threading.Timer(rng.uniform(0, 0.03), publisher.publish, args=(f"g{i}", i))
        c.start()
        timer.start()
        c.join(15)
        timer.join()
        assert c.result is not None and c.result.event == i, f"round {i}: {c.result!r}"
        waiter.ack(c.result)
        waiter.close()


def test_interrupt_during_the_claim_round_trip_gives_the_lease_back(conninfo: str, pg: Any) -> None:
    """A KeyboardInterrupt that lands while a waiting claim's round trip is
    under way (here: when it returns, after the claim committed): the lease
    it made is given back, so nothing stays leased on its behalf."""
    import ctypes

    import psycopg

    pg.publish("g", "x")
    lock = psycopg.connect(conninfo, autocommit=True)
    lock.execute("BEGIN")
    lock.execute("LOCK TABLE leasequeue.groups IN ACCESS EXCLUSIVE MODE")
    c = Claimer(pg, "victim", timeout=30)
    c.start()
    with psycopg.connect(conninfo, autocommit=True) as watch:
        wait_until(lambda: watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE '%leasequeue.claim%'").fetchone()[0] > 0)
    # Raised in the thread as soon as it runs Python code again: when the
    # claim's answer comes back, after the claim committed.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(c.ident), ctypes.py_object(KeyboardInterrupt))
    lock.execute("ROLLBACK")
    lock.close()
    c.join(30)
    assert isinstance(c.error, KeyboardInterrupt)
    stats = pg.stats()
    assert (stats.messages, stats.leased) == (1, 0)
    again = pg.claim("w", 30)
    assert again is not None and again.event == "x"
