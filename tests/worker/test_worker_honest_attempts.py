"""Honest attempts (SPEC Part 5): the worker's waits free its slot at once
(a failure's backoff is ``nack(lease, delay)``, ``RetryLater(d)`` is
``release(lease, d)`` and does not count), its hand-backs at a graceful
shutdown are ``release(lease)`` (rolling restarts spend no retry budget and
never trip the crash-loop rule), the crash-loop bury says only what is
known, and ``retry`` (not ``resume``) gives a buried message a fresh budget.
A transport without ``release`` (a user's older backend) gets ``nack``.

On every transport of the worker's tests: both in-memory twins, a real
SQLite file, the suite's PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, List, Tuple

import pytest
from worker_helpers import wait_until

from leasequeue import Job, Retry, RetryLater, Worker


def as_runner(body: Callable[[Job], Any], runner: str) -> Any:
    """``body`` as a plain function (``threads``) or an ``async def`` (``asyncio``)."""
    if runner == "asyncio":
        async def handler(job: Job) -> Any:
            return body(job)

        return handler
    return body


class StopsOnClaim:
    """A real transport whose ``aclaim`` (and ``claim_many``) asks the worker to stop as it returns
    a lease (the claim that races a stop: claimed, never started); every
    other name is the transport's own."""

    def __init__(self, transport: Any) -> None:
        self._t = transport
        self.worker: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)

    async def aclaim(self, *args: Any, **kwargs: Any) -> Any:
        lease = await self._t.aclaim(*args, **kwargs)
        if lease is not None:
            self.worker.stop()
        return lease

    def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        # The thread runner's batched path (a durable transport) claims with claim_many.
        leases = self._t.claim_many(*args, **kwargs)
        if leases:
            self.worker.stop()
        return leases


class WithoutRelease:
    """A transport as a backend written before 0.6 sees it: no ``release``
    (every other name is the transport's own; ``nack`` calls are counted)."""

    def __init__(self, transport: Any) -> None:
        self._t = transport
        self.nacks: List[float] = []

    def __getattr__(self, name: str) -> Any:
        if name in ("release", "retry"):
            raise AttributeError(name)
        return getattr(self._t, name)

    def nack(self, lease: Any, delay: float = 0.0) -> None:
        self.nacks.append(delay)
        self._t.nack(lease, delay)


def head_attempt(t: Any, group_id: str) -> int:
    """The head's deliveries so far (``peek``)."""
    return t.peek(group_id, 1)[0].attempt


# ---------------------------------------------------------------- waits free the slot


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_retry_later_frees_the_slot_for_another_group(backend: Any, start: Any, runner: str) -> None:
    """concurrency=1: while one group's head waits out RetryLater(1.5), another
    group's job runs at once; the waiting head comes back with the same
    attempt, after the delay, and nothing is handed back."""
    t = backend.make()
    t.publish("rate", "call-api")
    t.publish("other", "meanwhile")
    log: List[Tuple[Any, int, float]] = []

    def body(job: Job) -> None:
        log.append((job.event, job.attempt, time.monotonic()))
        if job.event == "call-api" and sum(e == "call-api" for e, _, _ in log) == 1:
            raise RetryLater(1.5, "429 Too Many Requests")

    w = Worker(t, as_runner(body, runner), concurrency=1, visibility=10.0, retry=Retry(max_attempts=1))
    running = start(w, runner)
    wait_until(lambda: len(log) >= 3 and len(t) == 0, timeout=30)
    running.stop()
    assert [(e, a) for e, a, _ in log] == [("call-api", 1), ("meanwhile", 1), ("call-api", 1)]
    first, other, again = (ts for _, _, ts in log)
    assert other - first < 1.0, "the other group waited for the RetryLater delay: the slot slept through it"
    assert again - first >= 1.45, "the requested delay was not kept"
    assert w.counts["retried"] == 1 and w.counts["succeeded"] == 2
    assert w.counts["buried"] == 0 and w.counts["handed_back"] == 0


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_a_failure_backoff_frees_the_slot_and_counts(backend: Any, start: Any, runner: str) -> None:
    """A failure's backoff parks with nack(delay): the slot is free at once
    for another group, and the next delivery is the next attempt."""
    t = backend.make()
    t.publish("flaky", "call")
    t.publish("other", "meanwhile")
    log: List[Tuple[Any, int, float]] = []

    def body(job: Job) -> None:
        log.append((job.event, job.attempt, time.monotonic()))
        if job.event == "call" and job.attempt == 1:
            raise ConnectionError("upstream down")

    w = Worker(t, as_runner(body, runner), concurrency=1, visibility=10.0,
               retry=Retry(max_attempts=3, backoff=1.5, jitter=0.0))
    running = start(w, runner)
    wait_until(lambda: len(log) >= 3 and len(t) == 0, timeout=30)
    running.stop()
    assert [(e, a) for e, a, _ in log] == [("call", 1), ("meanwhile", 1), ("call", 2)]
    first, other, again = (ts for _, _, ts in log)
    assert other - first < 1.0 and again - first >= 1.45
    assert w.counts["retried"] == 1 and w.counts["succeeded"] == 2


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_retry_later_many_times_never_exhausts_the_budget(backend: Any, start: Any, runner: str) -> None:
    """Five RetryLater with max_attempts=1: every run is attempt 1, nothing
    is buried, and the group's next message waits behind its head."""
    t = backend.make()
    t.publish("rate", "call-api")
    t.publish("rate", "next")
    calls: List[Tuple[Any, int]] = []

    def body(job: Job) -> None:
        calls.append((job.event, job.attempt))
        if job.event == "call-api" and len(calls) <= 5:
            raise RetryLater(0.02)

    w = Worker(t, as_runner(body, runner), concurrency=2, visibility=10.0, retry=Retry(max_attempts=1))
    running = start(w, runner)
    wait_until(lambda: len(calls) >= 7 and len(t) == 0, timeout=30)
    running.stop()
    assert calls == [("call-api", 1)] * 6 + [("next", 1)]
    assert w.counts["retried"] == 5 and w.counts["buried"] == 0


# ---------------------------------------------------------------- graceful stops do not count


def test_async_handlers_cancelled_by_stops_do_not_spend_the_budget(backend: Any, start: Any) -> None:
    """max_attempts=2 and three graceful stops that each cancel the running
    async handler: the message is released each time (its count stays 0) and
    the fourth worker runs it at attempt 1 instead of burying it."""
    t = backend.make()
    t.publish("g", "long job")
    began: List[int] = []

    async def interrupted(job: Job) -> None:
        began.append(job.attempt)
        await asyncio.sleep(60)

    for round_ in range(3):
        w = Worker(t, interrupted, visibility=10.0, drain_timeout=0.05, retry=Retry(max_attempts=2))
        running = start(w, "asyncio")
        wait_until(lambda: len(began) == round_ + 1, timeout=30)
        running.stop()
        assert w.counts["handed_back"] == 1 and w.counts["buried"] == 0
        assert t.stats().leased == 0 and head_attempt(t, "g") == 0
    assert began == [1, 1, 1]
    done: List[int] = []

    async def finishes(job: Job) -> None:
        done.append(job.attempt)

    w = Worker(t, finishes, visibility=10.0, retry=Retry(max_attempts=2))
    running = start(w, "asyncio")
    wait_until(lambda: done and len(t) == 0, timeout=30)
    running.stop()
    assert done == [1] and w.counts["buried"] == 0 and t.group("g") is None


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_messages_claimed_at_stops_do_not_spend_the_budget(backend: Any, start: Any, runner: str) -> None:
    """max_attempts=2 and three stops that each come as a claim returns: the
    message, claimed but never started, is released each time; the next
    worker runs it at attempt 1."""
    real = backend.make()
    real.publish("g", "job")
    ran: List[int] = []
    body = as_runner(lambda job: ran.append(job.attempt), runner)
    for _ in range(3):
        t = StopsOnClaim(real)
        w = Worker(t, body, visibility=10.0, retry=Retry(max_attempts=2))
        t.worker = w
        running = start(w, runner)
        running.join(30)
        assert ran == [] and w.counts["handed_back"] == 1 and w.counts["started"] == 0
        assert real.stats().leased == 0 and head_attempt(real, "g") == 0
    w = Worker(real, body, visibility=10.0, retry=Retry(max_attempts=2))
    running = start(w, runner)
    wait_until(lambda: ran and len(real) == 0, timeout=30)
    running.stop()
    assert ran == [1] and w.counts["buried"] == 0


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_a_job_in_retry_later_at_a_stop_is_already_parked(backend: Any, start: Any, runner: str) -> None:
    """RetryLater(30) released the message parked at once: a stop then finds
    nothing to hand back, and the wait spent no attempt."""
    t = backend.make()
    t.publish("g", "rate-limited")

    def body(job: Job) -> None:
        raise RetryLater(30)

    w = Worker(t, as_runner(body, runner), visibility=10.0, drain_timeout=0.2)
    running = start(w, runner)
    wait_until(lambda: w.counts["retried"] == 1)
    info = t.group("g")
    assert info.state == "parked" and info.attempt == 0 and t.stats().leased == 0
    running.stop()
    assert w.counts["handed_back"] == 0
    assert t.group("g").state == "parked" and head_attempt(t, "g") == 0


def test_a_cancelled_error_raised_by_the_handler_itself_counts(inmemory: Any, start: Any) -> None:
    """Only a cancellation by the shutdown is released: a CancelledError an
    async handler raises itself while the worker runs is nacked (counted),
    so a handler that always does so still meets the attempt budget."""
    t = inmemory.make()
    t.publish("g", "job")
    runs: List[int] = []

    async def handler(job: Job) -> None:
        runs.append(job.attempt)
        if job.attempt == 1:
            raise asyncio.CancelledError()

    w = Worker(t, handler, visibility=10.0)
    running = start(w, "asyncio")
    wait_until(lambda: len(t) == 0)
    running.stop()
    assert runs == [1, 2] and w.counts["handed_back"] == 1 and w.counts["succeeded"] == 1


# ---------------------------------------------------------------- crash loops, resume and retry


def test_resume_of_a_buried_head_is_buried_again_unrun_and_retry_runs_it(backend: Any, start: Any) -> None:
    """Buried at attempt 1 of 1; resume: its next delivery is attempt 2, so
    the worker buries it again unrun, with a reason that says what is known;
    retry: it runs at attempt 1."""
    t = backend.make()
    t.publish("g", "poison")
    runs: List[int] = []
    fixed = threading.Event()

    def handler(job: Job) -> None:
        runs.append(job.attempt)
        if not fixed.is_set():
            raise ValueError("bad input")

    w = Worker(t, handler, visibility=10.0, retry=Retry(max_attempts=1))
    running = start(w)
    wait_until(lambda: w.counts["buried"] == 1)
    assert runs == [1] and "ValueError" in t.group("g").reason
    assert t.resume("g")
    wait_until(lambda: w.counts["buried"] == 2)
    assert runs == [1], "a head beyond its budget ran again"
    info = t.group("g")
    assert info.state == "buried" and info.attempt == 2
    assert "attempt 2 is beyond the budget of max_attempts 1" in info.reason
    assert "crash loop" not in info.reason and "retry" in info.reason
    fixed.set()
    assert t.retry("g")
    wait_until(lambda: len(t) == 0)
    running.stop()
    assert runs == [1, 1] and w.counts["succeeded"] == 1


# ---------------------------------------------------------------- a transport without release


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_without_release_hand_backs_fall_back_to_nack(inmemory: Any, start: Any, runner: str) -> None:
    """A transport written before 0.6: a message claimed at a stop is handed
    back with nack (its delivery then counts)."""
    real = inmemory.make()
    real.publish("g", "job")
    old = WithoutRelease(real)
    t = StopsOnClaim(old)
    w = Worker(t, as_runner(lambda job: None, runner), visibility=10.0)
    t.worker = w
    start(w, runner).join(30)
    assert w.counts["handed_back"] == 1 and old.nacks == [0.0]
    assert real.stats().leased == 0 and head_attempt(real, "g") == 1


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_without_release_retry_later_keeps_the_lease_and_the_attempt(inmemory: Any, start: Any,
                                                                      runner: str) -> None:
    """A transport written before 0.6: RetryLater keeps its lease and runs
    again on its slot after the delay (Part 4), so the wait still costs no
    attempt; nack is never called for it."""
    real = inmemory.make()
    real.publish("g", "call-api")
    t = WithoutRelease(real)
    calls: List[Tuple[int, float]] = []

    def body(job: Job) -> None:
        calls.append((job.attempt, time.monotonic()))
        if len(calls) <= 2:
            raise RetryLater(0.05)

    w = Worker(t, as_runner(body, runner), visibility=10.0, retry=Retry(max_attempts=1))
    running = start(w, runner)
    wait_until(lambda: len(calls) == 3 and len(real) == 0)
    running.stop()
    assert [a for a, _ in calls] == [1, 1, 1] and t.nacks == []
    assert calls[2][1] - calls[0][1] >= 0.09
    assert w.counts["retried"] == 2 and w.counts["succeeded"] == 1


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_without_release_a_job_waiting_on_retry_later_is_handed_back_parked(inmemory: Any, start: Any,
                                                                            runner: str) -> None:
    """A transport written before 0.6: a stop during RetryLater's wait hands
    the message back with nack, parked (threads: for what is left of the
    wait; asyncio: free at once)."""
    real = inmemory.make()
    real.publish("g", "rate-limited")
    t = WithoutRelease(real)

    def body(job: Job) -> None:
        raise RetryLater(30)

    w = Worker(t, as_runner(body, runner), visibility=10.0, drain_timeout=0.2)
    running = start(w, runner)
    wait_until(lambda: w.counts["retried"] == 1)
    assert real.stats().leased == 1  # the lease is kept through the wait
    running.stop()
    assert w.counts["handed_back"] == 1 and len(t.nacks) == 1
    info = real.group("g")
    assert info.state in ("parked", "ready") and info.messages == 1 and real.stats().leased == 0
    if runner == "threads":
        assert 20 < t.nacks[0] <= 30 and info.state == "parked"
