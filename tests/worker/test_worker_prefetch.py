"""Prefetch (issue #32): on a durable transport the thread runner may claim
more messages than it has idle slots, with one ``claim_many``, and run them
as slots free up; their acks go in batches.  Part 4's rules hold for the
messages waiting in the worker: one job per group in flight, group order,
their leases extended by the heartbeat (no other worker gets them), and at
a stop they go back uncounted (``release``).  ``prefetch=None`` adapts to
the handlers: nothing before a first job ran, nothing for slow handlers.
The real SQLite file and the real server; the transports are wrapped only
to record their calls."""

from __future__ import annotations

import threading
import time
from typing import Any, List

import pytest
from test_worker_ack_and_claim import ExclusiveProbe, publish
from test_worker_batched_acks import Sizes
from test_worker_honest_attempts import as_runner
from worker_helpers import wait_until

from leasequeue import Job, Worker
from leasequeue.worker.runners.threads import PREFETCH_WINDOW, ThreadRunner


def test_prefetch_is_checked(backend: Any) -> None:
    t = backend.make()
    for bad, kind in ((-1, ValueError), ("4", TypeError), (True, TypeError), (2.0, TypeError)):
        with pytest.raises(kind, match="prefetch"):
            Worker(t, lambda job: None, prefetch=bad)
    assert Worker(t, lambda job: None).prefetch is None
    assert Worker(t, lambda job: None, prefetch=0).prefetch == 0


def test_the_adaptive_prefetch_follows_the_handlers_run_time(backend: Any) -> None:
    """None before a first job; as many as the slots run in PREFETCH_WINDOW
    at the average run time, at most ``batch``; a fixed prefetch is itself."""
    t = backend.make()
    runner = ThreadRunner(Worker(t, lambda job: None, concurrency=2, batch=16))
    assert runner.prefetch() == 0  # nothing ran yet
    runner.average = 0.0
    assert runner.prefetch() == 16
    runner.average = PREFETCH_WINDOW / 10  # two slots run 20 in the window
    assert runner.prefetch() == 16
    runner.average = PREFETCH_WINDOW / 3  # two slots: 6
    assert runner.prefetch() == 6
    runner.average = PREFETCH_WINDOW * 1.5  # two slots: 1
    assert runner.prefetch() == 1
    runner.average = PREFETCH_WINDOW * 3  # slower than the slots' window: none
    assert runner.prefetch() == 0
    fixed = ThreadRunner(Worker(t, lambda job: None, prefetch=5))
    fixed.average = PREFETCH_WINDOW * 100
    assert fixed.prefetch() == 5
    assert PREFETCH_WINDOW == 0.05  # what docs/worker.md promises


def test_the_run_time_average_moves_a_tenth_of_the_way(backend: Any) -> None:
    """The first job's run time is the average; each next one moves it a
    tenth of the way (one slow job does not stop the prefetch at once)."""
    runner = ThreadRunner(Worker(backend.make(), lambda job: None))
    runner.note_run_time(1.0)
    assert runner.average == 1.0
    runner.note_run_time(2.0)
    assert runner.average == pytest.approx(1.1)
    runner.note_run_time(0.1)
    assert runner.average == pytest.approx(1.0)


def test_one_slot_prefetches_in_batches_and_keeps_groups_exclusive_and_in_order(durable: Any, start: Any) -> None:
    """One slot, fast handlers: claims ask for several messages at once and
    acks go several at a time; no group runs two jobs at once, each group
    runs in order, and everything is acked."""
    t = durable.make()
    publish(t, 12, 10)
    probe = ExclusiveProbe(0.0)
    sizes = Sizes(t)
    w = Worker(sizes, probe.handler, concurrency=1, visibility=30.0)
    running = start(w, "threads")
    wait_until(lambda: w.counts["succeeded"] == 120, timeout=60)
    running.stop()
    assert not probe.overlaps
    for g in range(12):
        assert [i for gid, i in probe.seen if gid == f"g{g}"] == list(range(10))
    assert sizes.calls["ack_and_claim"] == 0 and sizes.calls["ack"] == 0
    assert max(sizes.asked) > 1  # prefetching claims
    assert max(sizes.acked) > 1  # batched acks
    assert len(t) == 0 and t.stats().leased == 0
    assert w.counts["started"] == 120 and w.counts["handed_back"] == 0


def test_a_fixed_prefetch_holds_that_many_beyond_the_busy_slots(durable: Any) -> None:
    """prefetch=3, one slot busy: the worker holds the running message and
    three more, and no more; another claimer gets the rest."""
    t = durable.make()
    publish(t, 8, 1)
    go = threading.Event()
    began = threading.Event()

    def handler(job: Job) -> None:
        began.set()
        go.wait(30)

    w = Worker(t, handler, concurrency=1, visibility=30.0, prefetch=3, signals=False)
    th = threading.Thread(target=w.run)
    th.start()
    try:
        assert began.wait(30)
        wait_until(lambda: t.stats().leased == 4, timeout=30)
        time.sleep(0.1)
        assert t.stats().leased == 4  # one running, three waiting in the worker
        other = t.claim_many("other", 30.0, 10)
        assert len(other) == 4  # the rest are free
        t.ack_many(other)
    finally:
        go.set()
        wait_until(lambda: w.counts["succeeded"] == 4, timeout=30)
        w.stop()
        th.join(30)
    assert not th.is_alive() and len(t) == 0 and t.stats().leased == 0


def test_prefetched_messages_are_held_by_the_heartbeat(durable: Any) -> None:
    """A 1-second lease; the first job runs 2.5 s while two prefetched
    messages wait: the heartbeat extends them too, so nobody else can claim
    them, and they run on their first delivery."""
    t = durable.make()
    publish(t, 3, 1)
    attempts: List[int] = []
    go = threading.Event()

    def handler(job: Job) -> None:
        attempts.append(job.attempt)
        if len(attempts) == 1:
            go.wait(30)

    w = Worker(t, handler, concurrency=1, visibility=1.0, prefetch=2, signals=False)
    th = threading.Thread(target=w.run)
    th.start()
    try:
        wait_until(lambda: t.stats().leased == 3, timeout=30)
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert t.claim("other", 30.0) is None  # held past their first 1 s
            time.sleep(0.1)
    finally:
        go.set()
    wait_until(lambda: w.counts["succeeded"] == 3, timeout=30)
    w.stop()
    th.join(30)
    assert attempts == [1, 1, 1] and w.counts["lost"] == 0
    assert len(t) == 0 and t.stats().leased == 0


def test_prefetched_messages_go_back_uncounted_at_a_stop(durable: Any) -> None:
    """stop() while one job runs and three wait: the running one is acked,
    the waiting ones are handed back with release (free, attempt 0), and
    nothing is left leased when run() returns."""
    t = durable.make()
    publish(t, 4, 1)
    go = threading.Event()
    began = threading.Event()

    def handler(job: Job) -> None:
        began.set()
        go.wait(30)

    w = Worker(t, handler, concurrency=1, visibility=30.0, prefetch=3, signals=False)
    th = threading.Thread(target=w.run)
    th.start()
    assert began.wait(30)
    wait_until(lambda: t.stats().leased == 4, timeout=30)
    w.stop()
    go.set()
    th.join(30)
    assert not th.is_alive()
    assert w.counts["succeeded"] == 1 and w.counts["handed_back"] == 3 and w.counts["started"] == 1
    assert t.stats().leased == 0 and len(t) == 3
    for info in t.groups():
        if info.messages:
            assert info.state == "ready"
            assert t.peek(info.group_id, 1)[0].attempt == 0  # released: no attempt spent


def test_slow_handlers_are_not_prefetched_for(durable: Any) -> None:
    """The adaptive default with handlers slower than the window: the worker
    never claims more than its one slot's message (a finished job's lease
    stays held until its batched ack, which is not a prefetch)."""
    t = durable.make()
    publish(t, 6, 1)
    sizes = Sizes(t)

    def handler(job: Job) -> None:
        time.sleep(PREFETCH_WINDOW * 2)

    w = Worker(sizes, handler, concurrency=1, visibility=30.0, signals=False)
    th = threading.Thread(target=w.run)
    th.start()
    wait_until(lambda: w.counts["succeeded"] == 6, timeout=60)
    w.stop()
    th.join(30)
    assert sizes.asked and max(sizes.asked) == 1, sizes.asked
    assert len(t) == 0


def test_a_prefetched_message_lost_while_it_waits_is_not_run(durable: Any) -> None:
    """A prefetched message's group is purged while it waits: the heartbeat
    finds its lease lost (counted once), the slot skips it (never run,
    nothing handed back), and the worker keeps its capacity: messages
    published after the queue ran dry are still served."""
    t = durable.make()
    t.publish("a", "first")
    t.publish("b", "doomed")
    go = threading.Event()
    seen: List[Any] = []

    def handler(job: Job) -> None:
        seen.append(job.event)
        if job.event == "first":
            go.wait(30)

    w = Worker(t, handler, concurrency=1, visibility=0.6, prefetch=1, signals=False)
    th = threading.Thread(target=w.run)
    th.start()
    try:
        wait_until(lambda: t.stats().leased == 2, timeout=30)  # "first" runs, "doomed" waits
        assert t.purge("b") == 1
        wait_until(lambda: w.counts["lost"] == 1, timeout=30)  # the heartbeat's extend found it gone
    finally:
        go.set()
    wait_until(lambda: w.counts["succeeded"] == 1, timeout=30)
    for i in range(3):  # after the queue ran dry
        t.publish(f"later{i}", f"later{i}")
    wait_until(lambda: w.counts["succeeded"] == 4, timeout=30)
    w.stop()
    th.join(30)
    assert not th.is_alive()
    assert "doomed" not in seen and sorted(seen) == ["first", "later0", "later1", "later2"]
    assert w.counts["lost"] == 1 and w.counts["handed_back"] == 0 and w.counts["started"] == 4
    assert w.heartbeat.in_flight() == 0  # the worker's in-flight gauge: nothing held after run()
    assert len(t) == 0 and t.stats().leased == 0


def test_a_wrapping_middleware_sees_every_prefetched_job(durable: Any) -> None:
    """A middleware that wraps the handler takes the general path, also for
    prefetched jobs: each runs through it once, and each is acked."""
    from leasequeue import Middleware

    t = durable.make()
    publish(t, 5, 4)
    wrapped: List[Any] = []

    class Around(Middleware):
        def wrap(self, call_next: Any, job: Job) -> Any:
            wrapped.append(job.event)
            return call_next(job)

    w = Worker(t, lambda job: None, concurrency=1, visibility=30.0, prefetch=4, middleware=[Around()],
               signals=False)
    th = threading.Thread(target=w.run)
    th.start()
    wait_until(lambda: w.counts["succeeded"] == 20, timeout=60)
    w.stop()
    th.join(30)
    assert sorted(wrapped) == sorted((f"g{g}", i) for g in range(5) for i in range(4))
    assert len(t) == 0 and w.heartbeat.in_flight() == 0


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_a_redelivered_job_runs_with_nothing_prefetched_behind_it(durable: Any, start: Any, runner: str) -> None:
    """A message whose earlier delivery's worker died (its lease expired:
    attempt 2) may crash this process too: before it runs, the worker hands
    back what it prefetched (uncounted) and sends the finished jobs' acks,
    so it holds that one lease alone, and a crash would charge no other
    message an attempt or run a finished one again.  Both runners."""
    t = durable.make()
    t.publish("r", "redelivered")
    dead = t.claim("died", 0.2)  # a worker that died holding it
    assert dead is not None and dead.event == "redelivered"
    for g in range(5):
        t.publish(f"g{g}", f"ok{g}")
    time.sleep(0.4)  # its lease has expired
    seen: List[Any] = []

    def body(job: Job) -> None:
        seen.append((job.event, job.attempt, t.stats().leased))

    w = Worker(t, as_runner(body, runner), concurrency=1, visibility=30.0, prefetch=5)
    running = start(w, runner)
    wait_until(lambda: w.counts["succeeded"] == 6, timeout=30)
    running.stop()
    assert sorted(e for e, _, _ in seen) == ["ok0", "ok1", "ok2", "ok3", "ok4", "redelivered"]
    [(_, attempt, leased)] = [s for s in seen if s[0] == "redelivered"]
    assert (attempt, leased) == (2, 1), seen  # alone: nothing prefetched, every finished job acked
    assert all(a == 1 for e, a, _ in seen if e != "redelivered")  # given back uncounted
    assert len(t) == 0 and t.stats().leased == 0
