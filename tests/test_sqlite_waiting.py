"""SPEC Part 2 "Waiting for work" on SQLite, with real threads, event loops
and processes: wake-ups by every event, floors, fairness, no herd, close,
timeouts, interrupts and cancellation, and a waiter in another process.

Waiting claims are seen through the transport's wait queue (``_queue``:
``waiters`` registered, ``wakeups`` handed out), which is how these tests
tell "asleep" from "returned" without sleeping for a guess.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator

import pytest

from helpers import FakeClock
from leasequeue import LeaseQueueError, SQLiteTransport

LIVENESS = 10.0  # seconds: generous bound for "it woke up" on a loaded machine


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def t(tmp_path: Any, clock: FakeClock) -> Iterator[SQLiteTransport]:
    with SQLiteTransport(tmp_path / "q.db", clock=clock) as transport:
        yield transport


def until(predicate: Callable[[], bool], what: str, timeout: float = LIVENESS) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.001)


class Waiting:
    """A claim with a timeout running in its own thread."""

    def __init__(self, t: SQLiteTransport, worker: str = "w", floor: int = 0, timeout: Any = LIVENESS,
                 visibility: float = 30) -> None:
        self.result: Any = "pending"
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.result = t.claim(worker, visibility, floor, timeout=timeout)
            except BaseException as exc:  # noqa: B036 - reported by the test
                self.error = exc
                self.result = None

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> Any:
        self.thread.join(LIVENESS)
        assert not self.thread.is_alive(), "the waiting claim did not return"
        if self.error is not None:
            raise self.error
        return self.result


def start_waiting(t: SQLiteTransport, n: int = 1, **kw: Any) -> list[Waiting]:
    """Start n waiting claims one after another, each registered before the next."""
    waiters = []
    for i in range(n):
        before = len(t._queue.waiters)
        waiters.append(Waiting(t, **{"worker": f"w{i}", **kw}))
        until(lambda: len(t._queue.waiters) == before + 1, f"waiter {i} registered")
    return waiters


# -- wake-ups by each event -----------------------------------------------------------------


def test_wakes_on_publish(t: SQLiteTransport) -> None:
    (w,) = start_waiting(t)
    t.publish("a", "hello")
    lease = w.join()
    assert (lease.group_id, lease.event) == ("a", "hello")


def test_wakes_when_ack_exposes_the_next_message(t: SQLiteTransport) -> None:
    t.publish("a", 1)
    t.publish("a", 2)
    first = t.claim("x", 30)
    (w,) = start_waiting(t)
    t.ack(first)
    assert w.join().seq == 2


def test_wakes_on_nack_now(t: SQLiteTransport) -> None:
    t.publish("a", 1)
    first = t.claim("x", 30)
    (w,) = start_waiting(t)
    t.nack(first)
    lease = w.join()
    assert (lease.seq, lease.attempt) == (1, 2)


@pytest.mark.parametrize("how", ["lease", "park"])
def test_wakes_by_itself_when_a_lock_expires(tmp_path: Any, how: str) -> None:
    with SQLiteTransport(tmp_path / "q.db") as t:  # the real clock
        t.publish("a", 1)
        first = t.claim("x", 0.3)
        if how == "park":
            t.nack(first, delay=0.3)
        started = time.monotonic()
        lease = t.claim("w", 30, timeout=LIVENESS)
        assert lease is not None and lease.seq == 1
        assert 0.2 < time.monotonic() - started < LIVENESS


def test_stats_in_another_thread_applies_expiry_and_wakes(t: SQLiteTransport, clock: FakeClock) -> None:
    t.publish("a", 1)
    t.claim("x", 5)
    (w,) = start_waiting(t)
    clock.advance(6)  # a manual clock: nothing happens until an operation reads it
    threading.Thread(target=t.stats).start()
    assert w.join().attempt == 2


@pytest.mark.parametrize("how", ["resume-pause", "resume-park", "set_priority"])
def test_control_plane_wakes(t: SQLiteTransport, how: str) -> None:
    t.publish("a", 1)
    if how == "resume-pause":
        t.pause("a")
    elif how == "resume-park":
        t.nack(t.claim("x", 30), delay=1000)
    (w,) = start_waiting(t, floor=5 if how == "set_priority" else 0)
    if how == "set_priority":
        t.set_priority("a", 5)
    else:
        t.resume("a")
    assert w.join().group_id == "a"


# -- floors, fairness, herd -------------------------------------------------------------


def test_floor_decides_who_is_woken(t: SQLiteTransport) -> None:
    (high,) = start_waiting(t, floor=5)
    t.publish("low", 0, priority=0)
    time.sleep(0.05)
    assert high.result == "pending" and t._queue.wakeups == 0
    low = Waiting(t, worker="low", floor=0)
    assert low.join().group_id == "low"  # it found the message at once
    t.publish("high", 1, priority=5)
    assert high.join().group_id == "high"


def test_longest_waiter_first(t: SQLiteTransport) -> None:
    waiters = start_waiting(t, 8)
    for i in range(8):
        t.publish(f"g{i}", i)
        lease = waiters[i].join()
        assert (lease.worker_id, lease.group_id) == (f"w{i}", f"g{i}")


def test_fair_when_publishes_come_fast(t: SQLiteTransport) -> None:
    waiters = start_waiting(t, 8)
    for i in range(8):
        t.publish(f"g{i}", i)
    leases = [w.join() for w in waiters]
    assert sorted(lease.group_id for lease in leases) == [f"g{i}" for i in range(8)]
    assert t._queue.wakeups == 8


def test_one_publish_wakes_one_of_32(t: SQLiteTransport) -> None:
    waiters = start_waiting(t, 32, timeout=None)
    t.publish("a", 1)
    until(lambda: sum(w.result != "pending" for w in waiters) == 1, "one claim returned")
    time.sleep(0.1)
    assert sum(w.result != "pending" for w in waiters) == 1
    assert t._queue.wakeups == 1
    assert len(t._queue.waiters) == 31
    t.close()  # wakes the rest, which return None
    assert [w.join() for w in waiters].count(None) == 31


# -- close, timeouts, interrupts ----------------------------------------------------------


def test_close_wakes_threads_and_tasks(tmp_path: Any) -> None:
    t = SQLiteTransport(tmp_path / "q.db")
    threads = start_waiting(t, 3, timeout=None)

    async def main() -> list[Any]:
        tasks = [asyncio.ensure_future(t.aclaim(f"a{i}", 30)) for i in range(3)]
        await asyncio.sleep(0)
        until(lambda: len(t._queue.waiters) == 6, "tasks registered")
        threading.Timer(0.05, t.close).start()
        return await asyncio.gather(*tasks)

    assert asyncio.run(main()) == [None, None, None]
    assert [w.join() for w in threads] == [None, None, None]
    assert t.closed
    with pytest.raises(LeaseQueueError):  # a closed SQLite transport refuses every call
        t.claim("w", 30, timeout=None)


def test_timeout_returns_none(t: SQLiteTransport) -> None:
    started = time.monotonic()
    assert t.claim("w", 30, timeout=0.2) is None
    assert 0.15 < time.monotonic() - started < LIVENESS
    assert len(t._queue.waiters) == 0
    with pytest.raises(ValueError):
        t.claim("w", 30, timeout=-1)
    with pytest.raises(TypeError):
        t.claim("w", 30, timeout=True)
    with pytest.raises(ValueError):
        t.claim("w", 30, timeout=float("nan"))


def test_interrupt_ends_a_blocking_claim(t: SQLiteTransport) -> None:
    import _thread

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs the main thread")
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        t.claim("w", 30, timeout=LIVENESS)
    assert time.monotonic() - started < LIVENESS / 2
    assert len(t._queue.waiters) == 0
    t.publish("a", 1)
    assert t.stats().leased == 0


def test_async_claims_and_cancellation(t: SQLiteTransport) -> None:
    """Tasks cancelled at random moments while another thread publishes: every
    message goes to exactly one task that returned it; none stays leased."""
    n_messages = 150

    async def main() -> list[Any]:
        got: list[Any] = []
        rng = random.Random(5)

        async def worker(i: int) -> None:
            lease = await t.aclaim(f"task{i}", 1000, timeout=None)
            if lease is not None:
                got.append(lease)

        def publisher() -> None:
            for i in range(n_messages):
                t.publish(f"g{i}", i)
                if i % 10 == 0:
                    time.sleep(0.002)

        tasks = [asyncio.ensure_future(worker(i)) for i in range(400)]
        feeder = threading.Thread(target=publisher)
        feeder.start()
        for task in tasks:
            if rng.random() < 0.5:
                await asyncio.sleep(rng.random() * 0.002)
                task.cancel()
        deadline = time.monotonic() + 60
        while len(got) < n_messages and time.monotonic() < deadline:
            live = [task for task in tasks if not task.done()]
            if not live:
                more = [asyncio.ensure_future(worker(1000 + len(tasks) + j)) for j in range(20)]
                tasks += more
            await asyncio.sleep(0.01)
        feeder.join()
        t.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        return got

    got = asyncio.run(main())
    assert sorted(lease.event for lease in got) == list(range(n_messages))


def test_cancelled_async_claim_leaves_nothing_leased(t: SQLiteTransport) -> None:
    async def main() -> None:
        task = asyncio.ensure_future(t.aclaim("w", 1000))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        t.publish("a", 1)
        await asyncio.sleep(0.05)
        assert t.stats().leased == 0
        lease = await t.aclaim("v", 10, timeout=1.0)
        assert lease is not None and lease.worker_id == "v"

    asyncio.run(main())


def test_aclaim_times_out(t: SQLiteTransport) -> None:
    async def main() -> Any:
        return await t.aclaim("w", 10, timeout=0.1)

    assert asyncio.run(main()) is None


# -- another process -----------------------------------------------------------------------


WAITER = r"""
import sys, time, json
from leasequeue import SQLiteTransport
t = SQLiteTransport(sys.argv[1])
print("ready", flush=True)
lease = t.claim("far", 30, timeout=float(sys.argv[2]))
print(json.dumps(None if lease is None else [time.time(), lease.event]), flush=True)
t.close()
"""


def test_a_waiter_in_another_process_wakes_on_publish(tmp_path: Any) -> None:
    path = str(tmp_path / "q.db")
    with SQLiteTransport(path) as t:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        proc = subprocess.Popen([sys.executable, "-c", WAITER, path, str(LIVENESS)], stdout=subprocess.PIPE,
                                text=True, env=env)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(0.3)  # let it go to sleep in its claim
            sent = time.time()
            t.publish("a", "across")
            line = proc.stdout.readline()
            proc.wait(LIVENESS)
        finally:
            proc.kill()
        import json

        woke, event = json.loads(line)
        assert event == "across"
        assert woke - sent < 1.0  # the documented bound is a few ms; this is a liveness bound


def test_batches_wake_one_waiter_per_claimable_group(t: SQLiteTransport) -> None:
    waiters = start_waiting(t, 4)
    t.publish_many([("a", 1), ("a", 2), ("b", 3), ("c", 4)])  # three groups become claimable
    until(lambda: sum(w.result != "pending" for w in waiters) == 3, "three claims returned")
    assert t._queue.wakeups == 3
    first = [w.join() for w in waiters[:3]]
    assert sorted(lease.group_id for lease in first) == ["a", "b", "c"]
    assert t.ack_many(first) == []  # exposes a's second message: the fourth waiter gets it
    assert waiters[3].join().seq == 2
