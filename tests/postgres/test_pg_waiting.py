"""Waiting on PostgreSQL beyond the conformance kit's waiting rules
(``test_pg_contract.py``): LISTEN/NOTIFY between transports of one queue,
notifications only while someone listens, a sign-up racing a publish, the
timekeeper waking on the server's clock, one round trip per wake, a wake
handed on, and claims cut short mid round trip (cancelled ``aclaim``, an
interrupt) leaving nothing leased.  Real threads, a real server."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, List, Optional




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


def test_wake_from_another_transport_of_the_queue(make_pg: Any, queue_name: str) -> None:
    a, b = make_pg(queue_name), make_pg(queue_name)
    [c] = start_waiters(a, [("w1", 0)])
    b.publish("g", "from b")
    c.join(30)
    assert c.result.event == "from b"


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


def test_expiry_wakes_a_waiter_server_clock(pg: Any) -> None:
    pg.publish("g", "x")
    first = pg.claim("w0", 0.4)
    [c] = start_waiters(pg, [("w1", 0)])
    c.join(30)
    assert c.result.seq == first.seq and c.result.attempt == 2
    assert c.took >= 0.2


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


def test_notify_only_while_a_claim_sleeps(conninfo: str, make_pg: Any) -> None:
    """Writers NOTIFY only while some process has a waiting claim asleep (a
    NOTIFY serialises commits database-wide): not for a waiting claim that
    finds a message at once, yes once one slept, and no more once none has
    slept for the listener's hold time."""
    import psycopg

    t = make_pg()
    t._listener.hold = 0.3
    raw = psycopg.connect(conninfo, autocommit=True)
    raw.execute(f"LISTEN leasequeue_{t._queue}")
    t.publish("a", 1)
    assert list(raw.notifies(timeout=0.3)) == []
    assert t.claim("w", 30, timeout=5) is not None  # found at once: no sign-up
    t.publish("b", 2)
    assert list(raw.notifies(timeout=0.3)) == []
    assert t.claim("w", 30, timeout=5) is not None
    assert t.claim("w", 30, timeout=0.05) is None  # slept: signed up
    t.publish("c", 3)
    notes = list(raw.notifies(timeout=2, stop_after=1))
    assert [n.payload for n in notes] == ["0:3"]
    with psycopg.connect(conninfo, autocommit=True) as other:
        def signed_up() -> int:
            row = other.execute("SELECT count(*) FROM leasequeue.listeners WHERE queue = %s", (t._queue,)).fetchone()
            return int(row[0])

        assert signed_up() == 1
        wait_until(lambda: signed_up() == 0)  # nobody slept for the hold time: withdrawn
    t.publish("d", 4)
    assert list(raw.notifies(timeout=0.3)) == []
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
