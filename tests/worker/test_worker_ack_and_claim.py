"""The thread runner's fast path (one slot; ``prefetch=0`` on a durable
transport, which otherwise prefetches and batches: test_worker_prefetch.py)
acks a job and claims the next in one call (``ack_and_claim``: one commit
per job on PostgreSQL), on every transport;
a transport without it is served by ``ack`` + ``claim``; a stop that comes
as the call returns hands the claimed lease back; a next message that does
not decode leaves the ack counted.  Real threads, real files, the real
server; the transports are wrapped only to count their calls."""

from __future__ import annotations

import collections
import logging
import sqlite3
import sys
import threading
import time
from typing import Any, Callable, Dict, List

import pytest
from worker_helpers import wait_until

from leasequeue import Job, Middleware, Worker

COUNTED = ("ack", "ack_and_claim", "ack_many", "claim", "claim_many", "aclaim", "nack")


class Counting:
    """A transport with every call passed through; it counts the settling
    ones, hides the names in ``hide``, and runs ``after[name]()`` once a
    call of that name returned."""

    def __init__(self, t: Any, hide: tuple = (), after: Dict[str, Callable[[Any], None]] = None) -> None:
        self._t = t
        self._hide = hide
        self._after = after or {}
        self._lock = threading.Lock()
        self.calls: Dict[str, int] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        if name in self._hide:
            raise AttributeError(name)
        attr = getattr(self._t, name)
        if name not in COUNTED:
            return attr
        after = self._after.get(name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            result = attr(*args, **kwargs)
            if after is not None:
                after(result)
            return result

        return counted


class ExclusiveProbe:
    """A handler that records every time a job starts while another job of
    its group is running (``overlaps``) and the events in the order their
    jobs ended (``seen``); each job takes ``sleep`` seconds."""

    def __init__(self, sleep: float) -> None:
        self.sleep = sleep
        self.overlaps: List[str] = []
        self.seen: List[Any] = []
        self._lock = threading.Lock()
        self._active: Dict[str, int] = collections.Counter()

    def handler(self, job: Job) -> None:
        with self._lock:
            if self._active[job.group_id]:
                self.overlaps.append(job.group_id)
            self._active[job.group_id] += 1
        time.sleep(self.sleep)
        with self._lock:
            self._active[job.group_id] -= 1
            self.seen.append(job.event)


def publish(t: Any, groups: int, per_group: int) -> None:
    for i in range(per_group):
        for g in range(groups):
            t.publish(f"g{g}", (f"g{g}", i))


def run_all(w: Worker, start: Any, seen: List[Any], total: int) -> None:
    running = start(w, "threads")
    wait_until(lambda: w.counts["succeeded"] == total, timeout=60)
    running.stop()
    assert len(seen) == total


def test_the_fast_path_acks_and_claims_in_one_call(backend: Any, start: Any) -> None:
    """One slot: after the runner's first claim, every job's ack is also the
    next job's claim; the last call finds nothing.  No lone ack is sent, and
    every job ran once, in group order."""
    t = backend.make()
    publish(t, 3, 5)
    counting = Counting(t)
    seen: List[Any] = []
    w = Worker(counting, lambda job: seen.append(job.event), concurrency=1, visibility=30.0, prefetch=0)
    run_all(w, start, seen, 15)
    assert counting.calls["ack_and_claim"] == 15 and counting.calls["ack"] == 0
    for g in range(3):
        assert [i for gid, i in seen if gid == f"g{g}"] == list(range(5))
    assert len(t) == 0 and t.stats().leased == 0


def test_each_in_memory_twin_runs_its_own_fast_path(inmemory: Any, start: Any) -> None:
    """The suite runs both fast paths, not one twice: with the pure twin the
    handler is called from the pure loop (``ThreadRunner.fast``); with the
    Cython twin from the compiled one, which has no Python frame (the frame
    under the handler's is the slot's)."""
    t = inmemory.make()
    publish(t, 2, 3)
    callers: List[str] = []
    seen: List[Any] = []

    def handler(job: Job) -> None:
        callers.append(sys._getframe(1).f_code.co_name)
        seen.append(job.event)

    w = Worker(t, handler, concurrency=1, visibility=30.0)
    run_all(w, start, seen, 6)
    assert set(callers) == {"fast" if inmemory.name == "python" else "slot"}, callers


def test_a_handler_in_c_still_lets_other_threads_in(inmemory: Any, start: Any) -> None:
    """A handler that runs no Python code (a bound builtin here; a Cython
    function in practice), on a stream that never runs dry: the fast path
    still lets the other threads run (the pure loop through the
    interpreter's switch interval, the compiled one by handing the GIL over
    every 256 jobs), so a stop() from another thread ends the stream early
    instead of once every message ran."""
    t = inmemory.make()
    # A stream long enough (about 0.3 s for the compiled loop) for the stop
    # to get in on a loaded machine: 200,000 jobs once all ran first in CI.
    n = 1_000_000
    t.publish_many([(f"g{i % 100}", i) for i in range(n)])
    w = Worker(t, collections.deque(maxlen=0).append, concurrency=1, visibility=30.0)
    running = start(w, "threads")
    wait_until(lambda: w.counts["started"] > 0, interval=0.001)
    running.stop()
    assert w.counts["succeeded"] < n
    assert w.counts["succeeded"] + len(t) == n


def test_a_transport_without_ack_and_claim_gets_ack_then_claim(backend: Any, start: Any) -> None:
    """A transport written before ack_and_claim: the worker acks, then claims."""
    t = backend.make()
    publish(t, 2, 4)
    counting = Counting(t, hide=("ack_and_claim",))
    seen: List[Any] = []
    w = Worker(counting, lambda job: seen.append(job.event), concurrency=1, visibility=30.0, prefetch=0)
    run_all(w, start, seen, 8)
    assert counting.calls["ack"] == 8 and counting.calls["ack_and_claim"] == 0
    assert counting.calls["claim"] >= 7  # the slot's claims after each ack
    assert len(t) == 0


def test_hooks_keep_the_fast_path_and_see_every_job(inmemory: Any, start: Any) -> None:
    """Hooks only observe: the fast path (ack_and_claim) is kept, and they
    are called for every job."""
    t = inmemory.make()
    publish(t, 1, 3)
    counting = Counting(t)
    seen: List[Any] = []
    hooked: List[Any] = []
    w = Worker(counting, lambda job: seen.append(job.event), concurrency=1, visibility=30.0, prefetch=0)
    w.on("started", lambda job, error: hooked.append(("started", job.event)))
    w.on("succeeded", lambda job, error: hooked.append(("succeeded", job.event, error)))
    run_all(w, start, seen, 3)
    assert counting.calls["ack_and_claim"] == 3 and counting.calls["ack"] == 0
    assert hooked == [x for i in range(3) for x in (("started", ("g0", i)), ("succeeded", ("g0", i), None))]


def test_a_wrapping_middleware_takes_the_general_path(inmemory: Any, start: Any) -> None:
    """A middleware that overrides wrap: the general path records the outcome
    (ack, then claim), and wrap runs around every handler call."""
    t = inmemory.make()
    publish(t, 1, 3)
    counting = Counting(t)
    seen: List[Any] = []
    wrapped: List[Any] = []

    class Around(Middleware):
        def wrap(self, call_next: Any, job: Job) -> Any:
            wrapped.append(job.event)
            return call_next(job)

    w = Worker(counting, lambda job: seen.append(job.event), concurrency=1, visibility=30.0, prefetch=0,
               middleware=[Around()])
    run_all(w, start, seen, 3)
    assert counting.calls["ack"] == 3 and counting.calls["ack_and_claim"] == 0
    assert wrapped == seen


def test_a_stop_as_ack_and_claim_returns_hands_the_claimed_lease_back(backend: Any, start: Any) -> None:
    """The stop comes while ack_and_claim runs: the lease it claimed is not
    run, and it is handed back with release (free again, its delivery not
    counted), not left leased until it runs out."""
    t = backend.make()
    publish(t, 1, 3)
    holder: List[Worker] = []
    counting = Counting(t, after={"ack_and_claim": lambda result: holder[0].stop()})
    seen: List[Any] = []
    w = Worker(counting, lambda job: seen.append(job.event), concurrency=1, visibility=30.0, prefetch=0)
    holder.append(w)
    running = start(w, "threads")
    running.join(30)
    assert seen == [("g0", 0)]
    assert w.counts["succeeded"] == 1 and w.counts["handed_back"] == 1
    assert t.stats().leased == 0 and len(t) == 2
    assert t.peek("g0", 1)[0].attempt == 0  # released: the hand-back spent no attempt
    lease = t.claim("check", 30.0)
    assert (lease.event, lease.attempt) == (("g0", 1), 1)


def test_a_job_that_ends_after_stop_is_acked_alone(backend: Any, start: Any) -> None:
    """stop() came while the handler ran: its job is acked with a lone ack,
    and the next message is not claimed (never delivered, nothing to hand
    back)."""
    t = backend.make()
    publish(t, 1, 2)
    holder: List[Worker] = []
    counting = Counting(t)
    seen: List[Any] = []

    def handler(job: Job) -> None:
        seen.append(job.event)
        holder[0].stop()

    w = Worker(counting, handler, concurrency=1, visibility=30.0, prefetch=0)
    holder.append(w)
    start(w, "threads").join(30)
    assert seen == [("g0", 0)] and w.counts["succeeded"] == 1 and w.counts["handed_back"] == 0
    assert counting.calls["ack"] == 1 and counting.calls["ack_and_claim"] == 0
    lease = t.claim("check", 30.0)
    assert (lease.event, lease.attempt) == (("g0", 1), 1)


def test_an_undecodable_next_message_leaves_the_ack_counted_and_is_buried(sqlite_backend: Any, start: Any,
                                                                          caplog: Any, fast_path: str) -> None:
    """The ack stood and the claim's message does not decode: the job counts
    as succeeded, and the undecodable message is a poison message (Part 5,
    "Operating it"): its group is buried with the decode error as the reason
    and counted as buried, not left leased to come back again."""
    t = sqlite_backend.make()
    publish(t, 1, 2)
    with sqlite3.connect(sqlite_backend.path) as db:
        assert db.execute("UPDATE lq_messages SET event = x'ff00' WHERE seq = 2").rowcount == 1
    counting = Counting(t)
    seen: List[Any] = []
    w = Worker(counting, lambda job: seen.append(job.event), concurrency=1, visibility=30.0, prefetch=0)
    with caplog.at_level(logging.WARNING, logger="leasequeue.worker"):
        running = start(w, "threads")
        wait_until(lambda: w.counts["succeeded"] == 1 and w.counts["buried"] == 1, timeout=30)
        running.stop()
    assert seen == [("g0", 0)] and w.counts["succeeded"] == 1
    assert counting.calls["ack_and_claim"] == 1 and counting.calls["ack"] == 0
    assert any("buried at seq 2: undecodable event: " in r.getMessage() for r in caplog.records), caplog.text
    info = t.group("g0")
    assert (info.state, info.head_seq, info.attempt, info.messages) == ("buried", 2, 1, 1)
    assert info.reason is not None and info.reason.startswith("undecodable event: UnpicklingError"), info.reason


@pytest.mark.parametrize("concurrency", [1, 3])
def test_ack_and_claim_keeps_groups_exclusive(backend: Any, start: Any, concurrency: int) -> None:
    """The claims ack_and_claim makes are claims like any other: never two
    jobs of one group at once, each group in order, across slots."""
    t = backend.make()
    publish(t, 4, 6)
    probe = ExclusiveProbe(0.001)
    counting = Counting(t)
    w = Worker(counting, probe.handler, concurrency=concurrency, visibility=30.0, prefetch=0)
    run_all(w, start, probe.seen, 24)
    assert not probe.overlaps
    for g in range(4):
        assert [i for gid, i in probe.seen if gid == f"g{g}"] == list(range(6))
    if backend.durable and concurrency > 1:
        # Several slots on a durable transport batch their acks (ack_many;
        # ack_and_claim for one ack and one idle slot): never a lone ack.
        assert counting.calls["ack_many"] + counting.calls["ack_and_claim"] >= 1
        assert counting.calls["ack"] == 0
    else:
        assert counting.calls["ack_and_claim"] >= 1
