"""Waiting claims on SQLite, beyond what the kit checks
(``test_sqlite_contract.py`` runs every rule of Part 2 "Waiting for work"):
the watcher noticing expiries on the real clock, a waiter in another
process, an interrupt of a claim waiting on the main thread, many cancelled
``aclaim`` tasks (whose claims run on the transport's helper thread), batch
wake-ups, and the window between a claim's commit and its caller.

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

from leasequeue import SQLiteTransport
from leasequeue.testing import ManualClock

LIVENESS = 10.0  # seconds: generous bound for "it woke up" on a loaded machine


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def t(tmp_path: Any, clock: ManualClock) -> Iterator[SQLiteTransport]:
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


# -- the watcher ----------------------------------------------------------------------------


@pytest.mark.serial(reason="a real-clock wait bounded on both sides")
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


# -- interrupts and cancellation ----------------------------------------------------------


@pytest.mark.serial(reason="interrupt_main in the test process, and how promptly the claim ends")
def test_interrupt_ends_a_blocking_claim(t: SQLiteTransport) -> None:
    import _thread
    import signal

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs the main thread")
    # A run started in the background (``cmd &``) inherits SIGINT ignored, and
    # interrupt_main() then does nothing: give the test Python's own handler.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer = threading.Timer(0.2, _thread.interrupt_main)
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            t.claim("w", 30, timeout=LIVENESS)
    finally:
        signal.signal(signal.SIGINT, old)
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


# -- an interrupt between the claim's commit and its caller ------------------------------------


class Interrupt(BaseException):
    """Stands for KeyboardInterrupt (which pytest would take for the user's)."""


def interrupting_serializer(armed: list[bool]) -> Any:
    """pickle, whose loads raises Interrupt while ``armed[0]`` is set: an
    interrupt that lands after the claim committed, before its caller has
    the lease."""
    import pickle

    def loads(data: bytes) -> Any:
        if armed[0]:
            armed[0] = False
            raise Interrupt()
        return pickle.loads(data)

    return (pickle.dumps, loads)


@pytest.mark.parametrize("how", ["waiting-ready", "waiting-woken", "aclaim", "claim", "claim_many"])
def test_an_interrupt_after_the_commit_leaves_nothing_leased(tmp_path: Any, how: str) -> None:
    """The claim committed, then the caller was interrupted before it had its
    lease (here while the event was deserialized): the claim is undone
    exactly -- the message is free, its attempt count and its group's
    round-robin place as before -- instead of staying leased until it expires."""
    armed = [False]
    clock = ManualClock()
    with SQLiteTransport(tmp_path / "q.db", clock=clock, serializer=interrupting_serializer(armed)) as t:
        t.publish("a", 1)
        t.publish("b", 2)
        first = t.claim("x", 30)
        t.ack(first)  # a has been claimed once: b comes first, then a
        if how != "waiting-woken":
            t.publish("c", 3)
        armed[0] = True
        with pytest.raises(Interrupt):
            if how == "waiting-ready":
                t.claim("w", 30, timeout=LIVENESS)
            elif how == "waiting-woken":
                t.pause("b")
                threading.Timer(0.2, t.publish, ("c", 3)).start()
                t.claim("w", 30, timeout=LIVENESS)
            elif how == "aclaim":
                asyncio.run(t.aclaim("w", 30, timeout=LIVENESS))
            elif how == "claim":
                t.claim("w", 30)
            else:
                t.claim_many("w", 30, 3)
        assert not armed[0], "the interrupt did not happen"
        until(lambda: t.stats().leased == 0, "the claim undone")  # aclaim undoes it on its helper thread
        if how == "waiting-woken":
            t.resume("b")
        assert t.group("b").last_claimed_at is None and t.group("c").last_claimed_at is None
        leases = t.claim_many("w", 30, 3)
        assert [(x.group_id, x.attempt) for x in leases] == [("b", 1), ("c", 1)]


# -- ack_and_claim ----------------------------------------------------------------------------


def test_a_waiter_on_another_connection_gets_what_ack_and_claim_leaves(tmp_path: Any) -> None:
    """Another connection (as another process would) notices the commit of an
    ack_and_claim as any: the caller's next message stays the caller's, and
    a next message its claim did not take wakes the other's waiting claim."""
    clock = ManualClock()
    path = tmp_path / "q.db"
    with SQLiteTransport(path, clock=clock) as t, SQLiteTransport(path, clock=clock) as other:
        for i in range(3):
            t.publish("g", i)
        lease = t.claim("w", 30)
        [waiting] = start_waiting(other)
        got = t.ack_and_claim(lease, "w", 30)
        assert (got.seq, got.worker_id) == (2, "w")
        time.sleep(0.3)  # the other's watcher saw that commit: its claim looked, found nothing
        assert waiting.result == "pending"
        assert t.ack_and_claim(got, "w", 30, min_priority=2**62) is None  # leaves seq 3
        woken = waiting.join()
        assert (woken.seq, woken.worker_id) == (3, "w0")


def test_an_interrupt_after_ack_and_claim_commits_undoes_its_claim_only(tmp_path: Any) -> None:
    """ack_and_claim committed, then its caller was interrupted before it had
    the lease (while the event was deserialized): the claim is undone
    exactly, the ack stands."""
    from leasequeue import LeaseLost

    armed = [False]
    with SQLiteTransport(tmp_path / "q.db", clock=ManualClock(), serializer=interrupting_serializer(armed)) as t:
        t.publish("a", 1)
        t.publish("a", 2)
        t.publish("b", 3)
        lease = t.claim("x", 30)
        armed[0] = True
        with pytest.raises(Interrupt):
            t.ack_and_claim(lease, "w", 30)  # acks a's first message, claims b
        assert not armed[0], "the interrupt did not happen"
        assert t.stats() == (2, 2, 0, 0, 0, 0, 0)
        assert t.group("b").last_claimed_at is None
        with pytest.raises(LeaseLost):
            t.ack(lease)
        leases = t.claim_many("w", 30, 3)
        assert [(x.group_id, x.seq, x.attempt) for x in leases] == [("b", 3, 1), ("a", 2, 1)]
