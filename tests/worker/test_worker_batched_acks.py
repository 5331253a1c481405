"""Several slots on a durable transport batch their acks (issue #32): a
finished job's ack waits in the runner's buffer for one ``ack_many``, and
the runner claims for every idle slot with one ``claim_many``.  Part 4's
rules hold: one job per group in flight, group order, a heartbeat for every
held lease (buffered acks too), a refused ack is ``lost``, and no finished
job is left leased when ``run()`` returns.  The real SQLite file and the
real server; the transports are wrapped only to record their calls."""

from __future__ import annotations

import threading
import time
from typing import Any, List

from test_worker_ack_and_claim import Counting, ExclusiveProbe, publish

from leasequeue import Job, Worker
from leasequeue.worker.runners.acks import AckBuffer, batches_acks


class Sizes(Counting):
    """Counting, and the sizes of each ack_many and claim_many."""

    def __init__(self, t: Any) -> None:
        super().__init__(t)
        self.acked: List[int] = []
        self.asked: List[int] = []

    def ack_many(self, leases: Any, **kw: Any) -> Any:
        leases = list(leases)
        self.acked.append(len(leases))
        return self._t.ack_many(leases, **kw)

    def claim_many(self, worker_id: str, visibility: float, max_count: int, *rest: Any) -> Any:
        self.asked.append(max_count)
        return self._t.claim_many(worker_id, visibility, max_count, *rest)


def test_which_workers_batch(backend: Any) -> None:
    t = backend.make()
    assert batches_acks(Worker(t, lambda job: None, concurrency=4)) is backend.durable
    assert batches_acks(Worker(t, lambda job: None, concurrency=4, prefetch=0)) is backend.durable
    # One slot batches when it may prefetch (adaptive by default, or a number).
    assert batches_acks(Worker(t, lambda job: None, concurrency=1)) is backend.durable
    assert batches_acks(Worker(t, lambda job: None, concurrency=1, prefetch=3)) is backend.durable
    assert not batches_acks(Worker(t, lambda job: None, concurrency=1, prefetch=0))
    assert not batches_acks(Worker(t, lambda job: None, concurrency=4, batch=1))


def test_batched_acks_keep_groups_exclusive_and_in_order(durable: Any, start: Any) -> None:
    """Four slots, jobs that end together: acks go in batches, claims ask
    for every idle slot, and still no group runs two jobs at once and each
    group runs in order; every job is acked (the queue ends empty)."""
    t = durable.make()
    publish(t, 6, 8)
    probe = ExclusiveProbe(0.002)
    sizes = Sizes(t)
    w = Worker(sizes, probe.handler, concurrency=4, visibility=30.0)
    running = start(w, "threads")
    deadline = time.monotonic() + 60
    while w.counts["succeeded"] < 48 and time.monotonic() < deadline:
        time.sleep(0.01)
    running.stop()
    assert w.counts["succeeded"] == 48 and not probe.overlaps
    for g in range(6):
        assert [i for gid, i in probe.seen if gid == f"g{g}"] == list(range(8))
    assert sizes.calls["ack"] == 0  # no lone ack while it ran
    assert max(sizes.asked) > 1  # claims for several idle slots at once
    assert max(sizes.acked, default=0) > 1  # acks of several jobs in one call
    assert len(t) == 0 and t.stats().leased == 0


def test_no_finished_job_is_left_leased_when_run_returns(durable: Any) -> None:
    """stop() while four handlers run: each one finishes, its ack is sent
    before run() returns, nothing is left leased, the rest stay queued."""
    t = durable.make()
    publish(t, 8, 2)
    release = threading.Event()
    running = threading.Semaphore(0)

    def handler(job: Job) -> None:
        running.release()
        release.wait(30)

    w = Worker(t, handler, concurrency=4, visibility=30.0, signals=False)
    th = threading.Thread(target=w.run)
    th.start()
    for _ in range(4):
        assert running.acquire(timeout=30)
    w.stop()
    release.set()
    th.join(30)
    assert not th.is_alive()
    assert w.counts["succeeded"] == 4
    assert t.stats().leased == 0 and len(t) == 12


def test_a_buffered_ack_is_flushed_at_stop_and_its_lease_kept_alive(durable: Any) -> None:
    """A job in the ack buffer keeps its lease: the heartbeat extends it
    like a running job's; a flush acks it and counts it succeeded."""
    t = durable.make()
    t.publish("g0", "a")
    w = Worker(t, lambda job: None, concurrency=2, visibility=2.0)
    buffer = AckBuffer(w)
    lease = t.claim("me", 2.0)
    job = Job(w, lease)
    buffer.add(job)
    before = t.group("g0").expires_at
    time.sleep(0.05)
    w.heartbeat.beat()
    assert t.group("g0").expires_at > before  # extended while buffered
    assert job.lease.expires_at > lease.expires_at
    buffer.flush()
    assert buffer.pending == 0 and job not in w.heartbeat.held
    assert w.counts["succeeded"] == 1 and len(t) == 0


def test_a_refused_buffered_ack_is_lost(durable: Any) -> None:
    """One ack_many with a lease that is no longer current (handed back
    meanwhile): the others are acked and counted; that one is ``lost``."""
    t = durable.make()
    t.publish("g0", "a")
    t.publish("g1", "b")
    w = Worker(t, lambda job: None, concurrency=2, visibility=30.0)
    lost: List[Any] = []
    w.on("lost", lambda job, error: lost.append((job.group_id, type(error).__name__)))
    buffer = AckBuffer(w)
    first, second = t.claim("me", 30.0), t.claim("me", 30.0)
    t.release(second)  # no longer current
    buffer.add(Job(w, first))
    buffer.add(Job(w, second))
    buffer.flush()
    assert w.counts["succeeded"] == 1 and w.counts["lost"] == 1
    assert lost == [(second.group_id, "LeaseLost")]
    assert len(t) == 1 and t.peek(second.group_id, 1)


def test_a_handler_that_loses_its_lease_is_lost_not_acked(durable: Any, start: Any) -> None:
    """Through the worker: a handler whose lease is handed back under it
    (another connection) returns; its buffered ack is refused: ``lost``;
    the message runs again and succeeds."""
    t = durable.make()
    publish(t, 3, 2)
    other = durable.make()
    done: List[Any] = []
    once: List[bool] = []

    def handler(job: Job) -> None:
        if job.event == ("g1", 0) and not once:
            once.append(True)
            other.release(job.lease)
        done.append((job.event, job.attempt))

    w = Worker(t, handler, concurrency=3, visibility=30.0)
    running = start(w, "threads")
    deadline = time.monotonic() + 60
    while w.counts["succeeded"] < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    running.stop()
    assert w.counts["succeeded"] == 6 and w.counts["lost"] == 1
    assert [e for e, _ in done if e[0] == "g1"] == [("g1", 0), ("g1", 0), ("g1", 1)]
    assert len(t) == 0


def test_the_flusher_acks_what_is_left_when_closed(durable: Any) -> None:
    """The flusher thread acks what is buffered; close() ends it after a
    last flush, so a job buffered just before the close is acked too."""
    t = durable.make()
    for g in range(3):
        t.publish(f"g{g}", g)
    w = Worker(t, lambda job: None, concurrency=2, visibility=30.0)
    buffer = AckBuffer(w)
    flusher = threading.Thread(target=buffer.run_thread)
    flusher.start()
    buffer.add(Job(w, t.claim("me", 30.0)))
    buffer.add(Job(w, t.claim("me", 30.0)))
    buffer.close()
    buffer.add(Job(w, t.claim("me", 30.0)))  # after close(), before the flusher's last flush ends
    flusher.join(30)
    assert not flusher.is_alive()
    buffer.flush()  # what the runner's close leaves: nothing, or this last one
    assert w.counts["succeeded"] == 3 and len(t) == 0 and t.stats().leased == 0
    assert not w.heartbeat.held


class SlowAcks(Counting):
    """The first ack_many waits for ``go`` (a slow database), the others pass."""

    def __init__(self, t: Any) -> None:
        super().__init__(t)
        self.entered = threading.Event()
        self.go = threading.Event()

    def ack_many(self, leases: Any, **kw: Any) -> Any:
        leases = list(leases)
        if not self.entered.is_set():
            self.entered.set()
            assert self.go.wait(30)
        return self._t.ack_many(leases, **kw)


def test_acks_buffered_at_stop_are_sent_before_run_returns(durable: Any) -> None:
    """A flush is slow; jobs finish meanwhile and wait in the buffer; stop()
    comes: run() returns only once the slow flush and the buffered acks
    are done, and nothing is left leased."""
    t = durable.make()
    publish(t, 6, 1)
    slow = SlowAcks(t)
    finished: List[Any] = []
    w = Worker(slow, lambda job: finished.append(job.event), concurrency=3, visibility=30.0, signals=False)
    th = threading.Thread(target=w.run)
    th.start()
    assert slow.entered.wait(30)  # the first flush is under way (and stuck)
    deadline = time.monotonic() + 30
    while len(finished) < 6 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(finished) == 6  # every job ran; the later ones' acks wait in the buffer
    w.stop()
    time.sleep(0.05)
    assert th.is_alive()  # run() waits for the acks
    slow.go.set()
    th.join(30)
    assert not th.is_alive()
    assert w.counts["succeeded"] == 6 and len(t) == 0 and t.stats().leased == 0
