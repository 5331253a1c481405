"""Heartbeats and lost leases: a handler that runs 5x ``visibility`` is
delivered once; a purge while a handler runs marks the job lost (an async
handler is cancelled within about ``visibility / 3``), the worker neither
acks nor nacks it, and goes on; a crash loop is buried without running."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, List

import pytest
from worker_helpers import wait_until

from leasequeue import Job, LeaseLost, Retry, Worker

VIS = 0.3


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_a_handler_running_five_visibilities_is_delivered_once(backend: Any, start: Any, runner: str) -> None:
    t1 = backend.make()
    t2 = backend.make()
    t1.publish("long", "work")
    t1.publish("other", "x")
    deliveries: List[Any] = []
    lock = threading.Lock()

    def record(job: Job) -> None:
        with lock:
            deliveries.append((job.event, job.attempt, job.worker_id))

    if runner == "asyncio":
        async def handler(job: Job) -> None:
            record(job)
            if job.event == "work":
                await asyncio.sleep(5 * VIS)
    else:
        def handler(job: Job) -> None:  # type: ignore[misc]
            record(job)
            if job.event == "work":
                time.sleep(5 * VIS)

    # Two competing workers: without the heartbeat the second would take the expired lease.
    w1 = Worker(t1, handler, concurrency=2, visibility=VIS, worker_id="one")
    w2 = Worker(t2, handler, concurrency=2, visibility=VIS, worker_id="two")
    r1, r2 = start(w1, runner), start(w2, runner)
    wait_until(lambda: w1.counts["succeeded"] + w2.counts["succeeded"] == 2, timeout=20)
    time.sleep(VIS)
    r1.stop()
    r2.stop()
    assert [d[:2] for d in deliveries if d[0] == "work"] == [("work", 1)], deliveries
    assert w1.counts["lost"] == w2.counts["lost"] == 0
    assert len(t1) == 0


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_a_purge_while_running_marks_the_job_lost(backend: Any, start: Any, runner: str) -> None:
    t = backend.make()
    t.publish("doomed", "long")
    began = threading.Event()
    result: List[Any] = []
    lost_hook: List[Any] = []

    if runner == "asyncio":
        async def handler(job: Job) -> None:
            if job.group_id != "doomed":
                result.append(("next", job.event))
                return
            began.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                result.append(("cancelled", job.lost, time.monotonic()))
                raise
    else:
        def handler(job: Job) -> None:  # type: ignore[misc]
            if job.group_id != "doomed":
                result.append(("next", job.event))
                return
            began.set()
            deadline = time.monotonic() + 30
            while not job.lost and time.monotonic() < deadline:
                time.sleep(0.005)
            result.append(("saw lost", job.lost, time.monotonic()))

    w = Worker(t, handler, visibility=VIS, hooks={"lost": lambda job, err: lost_hook.append((job.event, err))})
    running = start(w, runner)
    assert began.wait(20)
    purged_at = time.monotonic()
    assert t.purge("doomed") == 1
    wait_until(lambda: result, timeout=10)
    kind, lost, at = result[0]
    assert kind in ("cancelled", "saw lost") and lost is True
    assert at - purged_at < VIS / 3 + 1.0, "the lost lease was noticed late"
    wait_until(lambda: lost_hook, timeout=10)  # the hook runs once the handler has ended
    assert len(lost_hook) == 1 and isinstance(lost_hook[0][1], LeaseLost)
    # The worker goes on.
    t.publish("after", "next one")
    wait_until(lambda: ("next", "next one") in result, timeout=10)
    running.stop()
    assert w.counts["lost"] == 1 and w.counts["succeeded"] == 1
    assert w.counts["retried"] == w.counts["handed_back"] == w.counts["buried"] == 0
    assert len(t) == 0 and t.group("doomed") is None


def test_a_crash_loop_is_buried_without_running(backend: Any, start: Any) -> None:
    """Deliveries that ended with no outcome (here: leases left to expire) count:
    a claim at attempt > max_attempts buries the group unrun."""
    t = backend.make()
    t.publish("crashy", "kills the process")
    for _ in range(2):  # two deliveries whose worker "died"
        wait_until(lambda: t.claim("dead-worker", 0.05), timeout=10)
        time.sleep(0.1)
    t.publish("fine", "ok")
    ran: List[Any] = []
    buried: List[Any] = []
    w = Worker(t, lambda job: ran.append(job.event), visibility=10.0, retry=Retry(max_attempts=2),
               hooks={"buried": lambda job, err: buried.append(err)})
    running = start(w)
    wait_until(lambda: w.counts["buried"] == 1 and w.counts["succeeded"] == 1)
    running.stop()
    assert ran == ["ok"]
    info = t.group("crashy")
    assert info.state == "buried" and "attempt 3 is beyond the budget of max_attempts 2" in info.reason
    # It says what is known, and claims no crash it cannot know of.
    assert "failed, were buried, or ended without an outcome" in info.reason and "crash loop" not in info.reason
    assert type(buried[0]).__name__ == "CrashLoop"
