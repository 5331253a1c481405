"""``arun()`` on a durable transport batches (issue #32), as ``run()`` does:
the claimer claims for every free task slot, and the prefetch, with one
``claim_many``; a finished job's ack waits in the runner's buffer for one
``ack_many``, sent by a flusher task.  Part 4's rules hold: one job per
group in flight, group order, the heartbeat extends every held lease
(prefetched ones too), claimed jobs that never started go back uncounted at
a stop (also when ``arun()``'s task is cancelled), a refused ack is
``lost``, and the buffered acks are sent before ``arun()`` returns.  The
in-memory twins keep their path.  The real SQLite file and the real server;
the transports are wrapped only to record their calls."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any, Dict, List

import pytest
from test_worker_ack_and_claim import Counting, publish
from test_worker_batched_acks import SlowAcks, Sizes
from worker_helpers import wait_until

from leasequeue import Job, Middleware, Retry, Worker
from leasequeue.worker.runners.async_acks import AsyncAckBuffer
from leasequeue.worker.runners.prefetch import PREFETCH_WINDOW


class AsyncExclusiveProbe:
    """ExclusiveProbe's async twin: records a job that starts while another
    job of its group runs (``overlaps``) and the events in the order their
    jobs ended (``seen``); each job awaits ``asyncio.sleep(sleep)``, so the
    tasks interleave.  Everything runs on the loop's one thread."""

    def __init__(self, sleep: float) -> None:
        self.sleep = sleep
        self.overlaps: List[str] = []
        self.seen: List[Any] = []
        self._active: Dict[str, int] = collections.Counter()

    async def handler(self, job: Job) -> None:
        if self._active[job.group_id]:
            self.overlaps.append(job.group_id)
        self._active[job.group_id] += 1
        await asyncio.sleep(self.sleep)
        self._active[job.group_id] -= 1
        self.seen.append(job.event)


class Awrapping(Middleware):
    """A middleware that wraps the async handler (the general path)."""

    async def awrap(self, call_next: Any, job: Job) -> Any:
        return await call_next(job)


async def _until(predicate: Any, timeout: float = 30.0) -> None:
    """wait_until on the loop (test-side only)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("tasks", [1, 4])
def test_arun_batches_and_keeps_groups_exclusive_and_in_order(durable: Any, start: Any, tasks: int) -> None:
    """One task (the adaptive prefetch) or four: claims ask for several
    messages at once, acks go several at a time, never one ack_and_claim
    per job; no group runs two jobs at once, each group runs in order, and
    everything is acked."""
    t = durable.make()
    publish(t, 6, 8)
    probe = AsyncExclusiveProbe(0.0 if tasks == 1 else 0.002)
    sizes = Sizes(t)
    w = Worker(sizes, probe.handler, concurrency=tasks, visibility=30.0)
    running = start(w, "asyncio")
    wait_until(lambda: w.counts["succeeded"] == 48, timeout=60)
    running.stop()
    assert not probe.overlaps
    for g in range(6):
        assert [i for gid, i in probe.seen if gid == f"g{g}"] == list(range(8))
    assert sizes.calls["ack_and_claim"] == 0 and sizes.calls["ack"] == 0
    assert max(sizes.asked) > 1  # claims for several slots, or a prefetch
    assert max(sizes.acked) > 1  # acks of several jobs in one call
    assert sum(sizes.acked) == 48
    assert len(t) == 0 and t.stats().leased == 0
    assert w.counts["started"] == 48 and w.counts["handed_back"] == 0 and w.counts["lost"] == 0


def test_prefetch_0_with_one_task_keeps_ack_and_claim(durable: Any, start: Any) -> None:
    """The path that commits once per job, for a worker that asks for it."""
    t = durable.make()
    publish(t, 2, 3)
    counting = Counting(t)
    seen: List[Any] = []

    async def handler(job: Job) -> None:
        seen.append(job.event)

    w = Worker(counting, handler, concurrency=1, visibility=30.0, prefetch=0)
    running = start(w, "asyncio")
    wait_until(lambda: w.counts["succeeded"] == 6, timeout=60)
    running.stop()
    assert counting.calls["ack_many"] == 0 and counting.calls["ack_and_claim"] >= 5
    assert len(t) == 0


def test_the_in_memory_twins_keep_their_path(inmemory: Any, start: Any) -> None:
    """In memory (called on the loop, no commit to save): ack_and_claim, no ack_many."""
    t = inmemory.make()
    publish(t, 4, 3)
    counting = Counting(t)

    async def handler(job: Job) -> None:
        await asyncio.sleep(0)

    w = Worker(counting, handler, concurrency=4, visibility=30.0)
    running = start(w, "asyncio")
    wait_until(lambda: w.counts["succeeded"] == 12, timeout=60)
    running.stop()
    assert counting.calls["ack_many"] == 0 and counting.calls["ack_and_claim"] > 0
    assert len(t) == 0


def test_the_general_path_sends_its_acks_to_the_buffer(durable: Any, start: Any) -> None:
    """A middleware wraps the handler and every group's first job fails
    once: the retries are recorded as always (nack), the group order holds,
    and every success is acked by ack_many."""
    t = durable.make()
    publish(t, 4, 3)
    probe = AsyncExclusiveProbe(0.0)
    failed: List[str] = []

    async def handler(job: Job) -> None:
        if job.event[1] == 0 and job.group_id not in failed:
            failed.append(job.group_id)
            raise RuntimeError("once")
        await probe.handler(job)

    sizes = Sizes(t)
    w = Worker(sizes, handler, concurrency=2, visibility=30.0, middleware=[Awrapping()],
               retry=Retry(max_attempts=3, backoff=0.0, jitter=0.0))
    running = start(w, "asyncio")
    wait_until(lambda: w.counts["succeeded"] == 12, timeout=60)
    running.stop()
    assert sorted(failed) == [f"g{g}" for g in range(4)] and w.counts["retried"] == 4
    assert not probe.overlaps
    for g in range(4):
        assert [i for gid, i in probe.seen if gid == f"g{g}"] == [0, 1, 2]
    assert sizes.calls["ack_and_claim"] == 0 and sizes.calls["ack"] == 0 and sum(sizes.acked) == 12
    assert len(t) == 0 and t.stats().leased == 0


def test_prefetched_messages_are_held_by_the_heartbeat(durable: Any, start: Any) -> None:
    """A 1-second lease; the first job runs 2.5 s while two prefetched
    messages wait: the heartbeat extends them too, so nobody else can claim
    them, and they run on their first delivery."""
    t = durable.make()
    publish(t, 3, 1)
    attempts: List[int] = []
    go = threading.Event()

    async def handler(job: Job) -> None:
        attempts.append(job.attempt)
        if len(attempts) == 1:
            while not go.is_set():
                await asyncio.sleep(0.01)

    w = Worker(t, handler, concurrency=1, visibility=1.0, prefetch=2)
    running = start(w, "asyncio")
    try:
        wait_until(lambda: t.stats().leased == 3, timeout=30)
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert t.claim("other", 30.0) is None  # held past their first 1 s
            time.sleep(0.1)
    finally:
        go.set()
    wait_until(lambda: w.counts["succeeded"] == 3, timeout=30)
    running.stop()
    assert attempts == [1, 1, 1] and w.counts["lost"] == 0
    assert len(t) == 0 and t.stats().leased == 0


def _released_at_head(t: Any) -> None:
    for info in t.groups():
        if info.messages:
            assert info.state == "ready"
            assert t.peek(info.group_id, 1)[0].attempt == 0  # released: no attempt spent


def test_prefetched_messages_go_back_uncounted_at_once_at_a_stop(durable: Any, start: Any) -> None:
    """stop() while one job runs and three wait: the waiting ones are handed
    back at once (release: free, attempt 0) while the running one still
    runs; it is acked; nothing is left leased when arun() returns."""
    t = durable.make()
    publish(t, 4, 1)
    go = threading.Event()
    began = threading.Event()

    async def handler(job: Job) -> None:
        began.set()
        while not go.is_set():
            await asyncio.sleep(0.01)

    w = Worker(t, handler, concurrency=1, visibility=30.0, prefetch=3)
    running = start(w, "asyncio")
    assert began.wait(30)
    wait_until(lambda: t.stats().leased == 4, timeout=30)
    w.stop()
    wait_until(lambda: t.stats().leased == 1, timeout=30)  # handed back before the running job ends
    assert w.counts["started"] == 1
    go.set()
    running.join()
    assert w.counts["succeeded"] == 1 and w.counts["handed_back"] == 3 and w.counts["started"] == 1
    assert t.stats().leased == 0 and len(t) == 3
    _released_at_head(t)


def test_cancelling_arun_stops_and_hands_everything_back(durable: Any) -> None:
    """arun()'s task cancelled while one handler runs and three messages
    wait: the handler is cancelled, everything goes back uncounted, and the
    cancellation propagates."""
    t = durable.make()
    publish(t, 4, 1)

    async def handler(job: Job) -> None:
        await asyncio.sleep(60)

    w = Worker(t, handler, concurrency=1, visibility=30.0, prefetch=3, signals=False)

    async def main() -> None:
        task = asyncio.ensure_future(w.arun())
        await _until(lambda: w.counts["started"] == 1 and t.stats().leased == 4)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert w.stopping and w.counts["handed_back"] == 4 and w.counts["succeeded"] == 0
    assert t.stats().leased == 0 and len(t) == 4
    _released_at_head(t)


def test_buffered_acks_are_sent_before_arun_returns(durable: Any, start: Any) -> None:
    """A flush is slow; jobs finish meanwhile and wait in the buffer; stop()
    comes: arun() returns only once the slow flush and the buffered acks
    are done, and nothing is left leased."""
    t = durable.make()
    publish(t, 6, 1)
    slow = SlowAcks(t)
    finished: List[Any] = []

    async def handler(job: Job) -> None:
        finished.append(job.event)

    w = Worker(slow, handler, concurrency=3, visibility=30.0)
    running = start(w, "asyncio")
    assert slow.entered.wait(30)  # the first flush is under way (and stuck)
    wait_until(lambda: len(finished) == 6, timeout=30)  # the later acks wait in the buffer
    w.stop()
    time.sleep(0.05)
    assert running.thread.is_alive()  # arun() waits for the acks
    slow.go.set()
    running.join()
    assert w.counts["succeeded"] == 6 and len(t) == 0 and t.stats().leased == 0


def test_a_handler_that_loses_its_lease_is_lost_not_acked(durable: Any, start: Any) -> None:
    """A handler whose lease is handed back under it (another connection)
    returns; its buffered ack is refused: ``lost``; the message runs again
    and succeeds."""
    t = durable.make()
    publish(t, 3, 2)
    other = durable.make()
    done: List[Any] = []
    once: List[bool] = []

    async def handler(job: Job) -> None:
        if job.event == ("g1", 0) and not once:
            once.append(True)
            other.release(job.lease)
        done.append(job.event)

    w = Worker(t, handler, concurrency=3, visibility=30.0)
    running = start(w, "asyncio")
    wait_until(lambda: w.counts["succeeded"] == 6, timeout=60)
    running.stop()
    assert w.counts["lost"] == 1
    assert [e for e in done if e[0] == "g1"] == [("g1", 0), ("g1", 0), ("g1", 1)]
    assert len(t) == 0


def test_the_async_buffer_records_a_refused_ack_as_lost(durable: Any) -> None:
    """One ack_many with a lease that is no longer current: the other job is
    acked and counted, that one is ``lost``; the flusher ends after close()
    with the buffer empty and nothing held."""
    t = durable.make()
    t.publish("g0", "a")
    t.publish("g1", "b")
    w = Worker(t, lambda job: None, concurrency=2, visibility=30.0)
    lost: List[Any] = []
    w.on("lost", lambda job, error: lost.append((job.group_id, type(error).__name__)))
    first, second = t.claim("me", 30.0), t.claim("me", 30.0)
    t.release(second)  # no longer current

    async def main() -> None:
        buffer = AsyncAckBuffer(w)
        flusher = asyncio.ensure_future(buffer.run_task())
        buffer.add(Job(w, first))
        buffer.add(Job(w, second))
        buffer.close()
        await asyncio.wait_for(flusher, 30)
        assert buffer.pending == 0

    asyncio.run(main())
    assert w.counts["succeeded"] == 1 and w.counts["lost"] == 1
    assert lost == [(second.group_id, "LeaseLost")]
    assert not w.heartbeat.held and len(t) == 1 and t.peek(second.group_id, 1)


def test_slow_handlers_are_not_prefetched_for(durable: Any, start: Any) -> None:
    """The adaptive default with handlers slower than the window: the worker
    never claims more than its one task's message."""
    t = durable.make()
    publish(t, 6, 1)
    sizes = Sizes(t)

    async def handler(job: Job) -> None:
        await asyncio.sleep(PREFETCH_WINDOW * 2)

    w = Worker(sizes, handler, concurrency=1, visibility=30.0)
    running = start(w, "asyncio")
    wait_until(lambda: w.counts["succeeded"] == 6, timeout=60)
    running.stop()
    assert sizes.asked and max(sizes.asked) == 1, sizes.asked
    assert len(t) == 0


def test_a_late_lost_lease_does_not_cancel_the_task_that_moved_on(backend: Any) -> None:
    """The heartbeat finds a job lost just as its handler returned and its
    task left it in the ack buffer to run another job: the cancel, already
    on its way to the loop, must not reach that task (the other job would be
    handed back for nothing).  The loop is held while the heartbeat's thread
    records the loss, so the cancel arrives after the task moved on."""
    t = backend.make()
    t.publish("g0", "a")
    w = Worker(t, lambda job: None, concurrency=2, visibility=30.0)
    job = Job(w, t.claim("me", 30.0))

    async def main() -> bool:
        w._loop = asyncio.get_running_loop()
        other = asyncio.ensure_future(asyncio.sleep(0.2))  # the task, now running another job
        job._task = other
        heartbeat = threading.Thread(target=w._recorder.lost, args=(job, RuntimeError("lease lost")))
        heartbeat.start()
        heartbeat.join()  # the loop is held: the cancel waits in its queue
        job._task = None  # what the batched path does as it buffers the job
        await asyncio.sleep(0.05)  # the cancel runs now
        cancelled = other.cancelled()
        other.cancel()
        return cancelled

    try:
        assert asyncio.run(main()) is False
    finally:
        w._loop = None
    assert job.lost and w.counts["lost"] == 1

