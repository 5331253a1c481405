"""Shutdown: stop() drains (running handlers finish and are acked, nothing new
starts), a thread handler is never handed back while it runs, async handlers
past ``drain_timeout`` are cancelled and handed back, a forced stop leaves
leases to expire, signals (main thread only); and an idle worker uses no CPU."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any, List

import pytest
from worker_helpers import wait_until

from leasequeue import Job, Worker


def test_stop_lets_running_handlers_finish_and_starts_nothing_new(backend: Any, start: Any) -> None:
    t = backend.make()
    for g in range(6):
        t.publish(f"g{g}", g)
    started: List[int] = []

    def handler(job: Job) -> None:
        started.append(job.event)
        time.sleep(0.4)

    w = Worker(t, handler, concurrency=2, visibility=10.0)
    running = start(w)
    wait_until(lambda: len(started) == 2)
    running.stop()
    assert len(started) == 2
    assert w.counts["succeeded"] == 2 and w.counts["handed_back"] == 0
    s = t.stats()
    assert s.messages == 4 and s.leased == 0 and s.parked == 0


def test_a_thread_handler_past_drain_timeout_is_waited_for_not_handed_back(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    t.publish("g", "slow")
    began = threading.Event()
    finished: List[float] = []

    def handler(job: Job) -> None:
        began.set()
        time.sleep(0.8)
        finished.append(time.monotonic())

    w = Worker(t, handler, visibility=0.3, drain_timeout=0.1)
    running = start(w)
    assert began.wait(10)
    w.stop()
    running.join(10)
    ended = time.monotonic()
    assert finished and ended >= finished[0], "run() returned while the handler still ran"
    assert w.counts["succeeded"] == 1 and w.counts["handed_back"] == 0 and w.counts["lost"] == 0
    assert len(t) == 0 and not w.forced


def test_a_forced_stop_returns_at_once_and_leaves_the_lease(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    t.publish("g", "stuck")
    began, release = threading.Event(), threading.Event()

    def handler(job: Job) -> None:
        began.set()
        release.wait(20)

    w = Worker(t, handler, visibility=10.0, drain_timeout=0.05)
    running = start(w)
    assert began.wait(10)
    w.stop()
    time.sleep(0.2)
    assert running.thread.is_alive(), "run() returned while a thread handler still ran"
    w.stop(force=True)
    running.join(5)
    assert w.forced
    assert t.stats().leased == 1 and w.counts["handed_back"] == 0
    release.set()


def test_async_handlers_past_drain_timeout_are_cancelled_and_handed_back(backend: Any, start: Any) -> None:
    t = backend.make()
    t.publish("g", "forever")
    t.publish("g", "next")
    cancelled: List[bool] = []
    began = threading.Event()

    async def handler(job: Job) -> None:
        began.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(job.lost)
            raise

    w = Worker(t, handler, visibility=10.0, drain_timeout=0.2)
    running = start(w, "asyncio")
    assert began.wait(10)
    t0 = time.monotonic()
    running.stop()
    assert time.monotonic() - t0 < 5
    assert cancelled == [False]
    assert w.counts["handed_back"] == 1 and w.counts["succeeded"] == 0
    s = t.stats()
    assert s.messages == 2 and s.leased == 0 and s.parked == 0
    lease = t.claim("check", 10.0)
    # Handed back at its group's head with release: the cancelled delivery does not count.
    assert lease.event == "forever" and lease.attempt == 1


def test_signals_on_the_main_thread_stop_then_force(inmemory: Any) -> None:
    assert threading.current_thread() is threading.main_thread()
    t = inmemory.make()
    t.publish("g", "job")
    began, release = threading.Event(), threading.Event()
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))

    def handler(job: Job) -> None:
        began.set()
        release.wait(20)

    w = Worker(t, handler, visibility=10.0, drain_timeout=0.05)

    def signaller() -> None:
        assert began.wait(10)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        assert not w.forced
        os.kill(os.getpid(), signal.SIGINT)

    th = threading.Thread(target=signaller, daemon=True)
    th.start()
    w.run()  # here, on the main thread: it installs SIGTERM/SIGINT handlers
    th.join(5)
    assert w.stopping and w.forced
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    release.set()


def test_no_signal_handlers_off_the_main_thread(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    w = Worker(t, lambda job: None, concurrency=2)
    running = start(w)
    time.sleep(0.2)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    running.stop()


def test_stop_from_a_hook_in_a_handler_thread(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    for i in range(5):
        t.publish("g", i)
    w = Worker(t, lambda job: None, visibility=10.0)
    w.on("succeeded", lambda job, err: w.stop() if job.event == 1 else None)
    running = start(w)
    running.join(10)
    assert w.counts["succeeded"] == 2 and len(t) == 3


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
@pytest.mark.serial(reason="measures the CPU time of an idle worker against a bound")
def test_an_idle_worker_uses_no_cpu(inmemory: Any, start: Any, runner: str) -> None:
    t = inmemory.make()

    async def ahandler(job: Job) -> None:
        pass

    w = Worker(t, ahandler if runner == "asyncio" else (lambda job: None), concurrency=8)
    running = start(w, runner)
    time.sleep(0.3)  # started and asleep
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(1.0)
    cpu = time.process_time() - cpu0
    assert time.monotonic() - wall0 >= 1.0
    running.stop()
    assert cpu < 0.015, f"an idle 8-way worker used {cpu * 1000:.1f} ms of CPU in 1 s"


class StopsOnClaim:
    """A real transport whose aclaim asks the worker to stop as it returns a
    lease: the claim that races a stop() (delegates everything else)."""

    def __init__(self, transport: Any) -> None:
        self._t = transport
        self.worker: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)

    async def aclaim(self, *args: Any, **kwargs: Any) -> Any:
        lease = await self._t.aclaim(*args, **kwargs)
        self.worker.stop()
        return lease


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_a_message_claimed_but_not_started_is_handed_back(inmemory: Any, start: Any, runner: str) -> None:
    real = inmemory.make()
    t = StopsOnClaim(real)
    ran: List[Any] = []

    def body(job: Job) -> None:
        ran.append(job.event)

    if runner == "asyncio":
        async def handler(job: Job) -> None:
            body(job)
    else:
        handler = body  # type: ignore[assignment]

    w = Worker(t, handler, concurrency=2, visibility=10.0)
    t.worker = w
    running = start(w, runner)
    time.sleep(0.1)
    real.publish("g", "claimed during stop")
    running.join(10)
    assert ran == [] and w.counts["handed_back"] == 1 and w.counts["started"] == 0
    assert real.stats().leased == 0
    lease = real.claim("check", 10.0)
    assert lease.event == "claimed during stop" and lease.attempt == 1  # released: not counted


def test_import_leasequeue_stays_light() -> None:
    import subprocess
    import sys

    code = ("import sys, leasequeue; heavy = ('sqlite3', 'psycopg', 'prometheus_client', 'asyncio', "
            "'leasequeue._worker'); print([m for m in heavy if m in sys.modules]); "
            "leasequeue.Worker, leasequeue.Retry, leasequeue.Job, leasequeue.RetryLater; "
            "print([m for m in ('sqlite3', 'psycopg', 'prometheus_client') if m in sys.modules])")
    # Not measured by coverage (CI measures the run): coverage keeps its data in SQLite.
    env = {k: v for k, v in os.environ.items() if k != "COVERAGE_PROCESS_START"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         env=env)
    assert out.stdout.split("\n")[:2] == ["[]", "[]"], out.stdout
