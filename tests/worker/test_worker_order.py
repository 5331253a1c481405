"""Every job runs once, in group order, never two of one group at once: on
every transport, at several concurrencies, with the thread and the asyncio
runner (real threads, real event loops, a real SQLite file, the real PostgreSQL)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Dict, List, Tuple

import pytest
from worker_helpers import wait_until

from leasequeue import Job, Retry, Worker

GROUPS, PER_GROUP = 6, 8


class Recorder:
    """What the handlers saw: the order per group, and any overlap within a group."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.lock = threading.Lock()
        self.active: Dict[str, int] = {}
        self.overlaps: List[str] = []
        self.seen: List[Tuple[str, int]] = []
        self.max_parallel = 0
        self.running = 0
        self.done = threading.Event()

    def enter(self, job: Job) -> None:
        with self.lock:
            if self.active.get(job.group_id):
                self.overlaps.append(job.group_id)
            self.active[job.group_id] = 1
            self.running += 1
            self.max_parallel = max(self.max_parallel, self.running)

    def leave(self, job: Job) -> None:
        with self.lock:
            self.active[job.group_id] = 0
            self.running -= 1
            self.seen.append(job.event)
            if len(self.seen) >= self.total:
                self.done.set()

    def check(self) -> None:
        assert not self.overlaps, f"two handlers of one group at once: {self.overlaps}"
        assert sorted(self.seen) == sorted((f"g{g}", i) for g in range(GROUPS) for i in range(PER_GROUP)), \
            "not every job exactly once"
        for g in range(GROUPS):
            assert [i for gid, i in self.seen if gid == f"g{g}"] == list(range(PER_GROUP)), f"g{g} out of order"


def publish_all(t: Any) -> None:
    for i in range(PER_GROUP):
        for g in range(GROUPS):
            t.publish(f"g{g}", (f"g{g}", i))


@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_every_job_once_in_group_order(backend: Any, start: Any, runner: str, concurrency: int) -> None:
    t = backend.make()
    publish_all(t)
    rec = Recorder(GROUPS * PER_GROUP)

    if runner == "asyncio":
        async def handler(job: Job) -> None:
            rec.enter(job)
            await asyncio.sleep(0.002)
            rec.leave(job)
    else:
        def handler(job: Job) -> None:  # type: ignore[misc]
            rec.enter(job)
            time.sleep(0.002)
            rec.leave(job)

    w = Worker(t, handler, concurrency=concurrency, visibility=10.0)
    running = start(w, runner)
    assert rec.done.wait(60), f"only {len(rec.seen)} of {rec.total} jobs ran"
    running.stop()
    rec.check()
    assert w.counts["succeeded"] == rec.total and w.counts["started"] == rec.total
    assert len(t) == 0
    if concurrency > 1:
        assert rec.max_parallel > 1, "the jobs never ran in parallel"


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_two_workers_share_a_queue(backend: Any, start: Any, runner: str) -> None:
    """Two workers (two connections for the durable ones): still once, in order, exclusive per group."""
    t1 = backend.make()
    t2 = backend.make()
    publish_all(t1)
    rec = Recorder(GROUPS * PER_GROUP)

    if runner == "asyncio":
        async def handler(job: Job) -> None:
            rec.enter(job)
            await asyncio.sleep(0.003)
            rec.leave(job)
    else:
        def handler(job: Job) -> None:  # type: ignore[misc]
            rec.enter(job)
            time.sleep(0.003)
            rec.leave(job)

    w1 = Worker(t1, handler, concurrency=3, visibility=10.0, worker_id="w1")
    w2 = Worker(t2, handler, concurrency=3, visibility=10.0, worker_id="w2")
    r1, r2 = start(w1, runner), start(w2, runner)
    assert rec.done.wait(60), f"only {len(rec.seen)} of {rec.total} jobs ran"
    r1.stop()
    r2.stop()
    rec.check()
    assert w1.counts["succeeded"] + w2.counts["succeeded"] == rec.total
    assert w1.counts["succeeded"] and w2.counts["succeeded"], "one worker did everything"


def test_work_published_while_idle_is_picked_up(backend: Any, start: Any) -> None:
    """The claim waits (no polling loop in the test either): a publish wakes it."""
    t = backend.make()
    got: List[Any] = []
    w = Worker(t, lambda job: got.append(job.event), concurrency=2, visibility=10.0)
    running = start(w)
    time.sleep(0.2)
    t.publish("late", "hello")
    wait_until(lambda: got, timeout=20)
    running.stop()
    assert got == ["hello"]


def test_the_job_carries_the_lease(backend: Any, start: Any) -> None:
    t = backend.make()
    seq = t.publish("g", {"k": 1})
    jobs: List[Job] = []
    w = Worker(t, jobs.append, visibility=10.0, worker_id="me")
    running = start(w)
    wait_until(lambda: jobs)
    running.stop()
    job = jobs[0]
    assert (job.event, job.group_id, job.seq, job.attempt, job.lost) == ({"k": 1}, "g", seq, 1, False)
    assert job.worker_id.startswith("me")
    assert job.transport is t and job.worker is w
    assert "g" in repr(job)


def test_transport_close_ends_run(backend: Any, start: Any) -> None:
    t = backend.make()
    w = Worker(t, lambda job: None, concurrency=2, visibility=10.0)
    running = start(w)
    time.sleep(0.2)
    assert running.thread.is_alive()
    t.close()
    running.join(20)
    assert w.stopping


def test_stop_before_run_returns_at_once(inmemory: Any) -> None:
    t = inmemory.make()
    t.publish("g", 1)
    w = Worker(t, lambda job: None)
    w.stop()
    w.run()
    assert len(t) == 1 and w.counts["started"] == 0
    with pytest.raises(RuntimeError):
        w.run()


def test_bad_options(inmemory: Any) -> None:
    t = inmemory.make()

    def h(job: Job) -> None:
        pass

    with pytest.raises(TypeError):
        Worker(object(), h)
    with pytest.raises(TypeError):
        Worker(t, "not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Worker(t, h, concurrency=0)
    with pytest.raises(TypeError):
        Worker(t, h, concurrency=True)
    with pytest.raises(ValueError):
        Worker(t, h, visibility=0)
    with pytest.raises(ValueError):
        Worker(t, h, visibility=float("inf"))
    with pytest.raises(TypeError):
        Worker(t, h, visibility="30")
    with pytest.raises(ValueError):
        Worker(t, h, drain_timeout=-1)
    with pytest.raises(TypeError):
        Worker(t, h, retry=5)
    with pytest.raises(ValueError):
        Worker(t, h, hooks={"finished": lambda j, e: None})
    with pytest.raises(TypeError):
        Worker(t, h, hooks={"succeeded": 3})
    with pytest.raises(TypeError):
        Worker(t, h, min_priority=1.5)
    with pytest.raises(ValueError):
        Worker(t, h, batch=0)
    with pytest.raises(TypeError):
        asyncio.run(Worker(t, h).arun())

    async def inside_a_loop() -> None:
        Worker(t, h).run()

    with pytest.raises(RuntimeError, match="arun"):
        asyncio.run(inside_a_loop())
    assert Worker(t, h, drain_timeout=float("inf")).drain_timeout == float("inf")
    assert Worker(t, h, retry=Retry(max_attempts=2)).retry.max_attempts == 2
