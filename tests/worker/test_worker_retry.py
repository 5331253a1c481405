"""The retry policy: backoff parks the head (the group waits, in order, other
groups go on), poison messages are buried after ``max_attempts`` with a reason
naming the error, non-retryable errors, a handler-requested delay that is not
a failure, and the exhausted actions (bury, skip + dead letter, a callable)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any, List, Optional, Tuple

import pytest
from worker_helpers import wait_until

from leasequeue import Job, Retry, RetryLater, Worker

# ---------------------------------------------------------------- Retry itself


def test_backoff_is_exponential_and_capped_without_jitter() -> None:
    r = Retry(max_attempts=10, backoff=0.5, factor=3.0, max_delay=10.0, jitter=0.0)
    assert [r.delay(n) for n in range(1, 6)] == [0.5, 1.5, 4.5, 10.0, 10.0]
    assert r.delay(10_000) == 10.0  # no overflow
    assert Retry(backoff=0.0, jitter=0.0).delay(3) == 0.0


def test_jitter_stays_within_its_band_and_the_cap() -> None:
    r = Retry(backoff=2.0, factor=2.0, max_delay=5.0, jitter=0.5)
    first = [r.delay(1) for _ in range(500)]
    assert all(1.0 <= d <= 3.0 for d in first)
    assert max(first) - min(first) > 0.5, "no jitter"
    assert all(d <= 5.0 for d in (r.delay(3) for _ in range(200)))


def test_retryable() -> None:
    r = Retry(retry_on=(OSError,), give_up_on=(FileNotFoundError,))
    assert r.retryable(ConnectionError())
    assert not r.retryable(FileNotFoundError())
    assert not r.retryable(ValueError())
    assert Retry(retry_on=KeyError).retryable(KeyError())


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"max_attempts": 0}, ValueError),
        ({"max_attempts": 1.5}, TypeError),
        ({"max_attempts": True}, TypeError),
        ({"backoff": -1}, ValueError),
        ({"backoff": math.nan}, ValueError),
        ({"backoff": "1"}, TypeError),
        ({"factor": 0.5}, ValueError),
        ({"max_delay": -1}, ValueError),
        ({"jitter": 1.5}, ValueError),
        ({"retry_on": "ValueError"}, TypeError),
        ({"retry_on": (ValueError, 3)}, TypeError),
        ({"give_up_on": 7}, TypeError),
        ({"exhausted": "drop"}, ValueError),
        ({"dead_letter": 3, "exhausted": "skip"}, TypeError),
        ({"dead_letter": print}, ValueError),  # only with exhausted="skip"
    ],
)
def test_bad_retry_options(kwargs: Any, error: type) -> None:
    with pytest.raises(error):
        Retry(**kwargs)


def test_retry_later_checks_its_delay() -> None:
    with pytest.raises(ValueError):
        RetryLater(-1)
    with pytest.raises(TypeError):
        RetryLater("soon")  # type: ignore[arg-type]
    assert "rate limited" in str(RetryLater(2, "rate limited"))


# ---------------------------------------------------------------- on a transport


def run_until(backend: Any, start: Any, handler: Any, done: Any, runner: str = "threads", **kw: Any) -> Worker:
    t = backend.make()  # in memory: the same transport; durable: a second connection to the queue
    kw.setdefault("visibility", 10.0)
    w = Worker(t, handler, **kw)
    running = start(w, runner)
    wait_until(done, timeout=30)
    running.stop()
    return w


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_retry_keeps_the_group_waiting_in_order_while_others_go_on(backend: Any, start: Any, runner: str) -> None:
    t = backend.make()
    for i in range(3):
        t.publish("slow", ("slow", i))
    for g in range(3):
        for i in range(3):
            t.publish(f"g{g}", (f"g{g}", i))
    log: List[Tuple[str, int, int, float]] = []
    lock = threading.Lock()

    def body(job: Job) -> None:
        with lock:
            log.append((job.event[0], job.event[1], job.attempt, time.monotonic()))
        if job.event == ("slow", 0) and job.attempt < 3:
            raise ConnectionError("flaky")

    if runner == "asyncio":
        async def handler(job: Job) -> None:
            body(job)
    else:
        handler = body  # type: ignore[assignment]

    retry = Retry(max_attempts=5, backoff=0.3, factor=1.0, jitter=0.0)
    w = Worker(t, handler, concurrency=2, visibility=10.0, retry=retry)
    running = start(w, runner)
    wait_until(lambda: len([e for e in log if e[2] == 1 or e[0] == "slow"]) >= 14, timeout=30)
    time.sleep(0.1)  # nothing more is to come: check that below
    running.stop()
    slow = [(i, a) for g, i, a, _ in log if g == "slow"]
    assert slow == [(0, 1), (0, 2), (0, 3), (1, 1), (2, 1)], slow
    first_fail = next(ts for g, i, a, ts in log if g == "slow")
    retried = next(ts for g, i, a, ts in log if g == "slow" and a == 2)
    assert retried - first_fail >= 0.25, "the backoff was not applied"
    others = [ts for g, i, a, ts in log if g != "slow"]
    assert len(others) == 9 and max(others) < retried, "other groups waited for the retrying one"
    assert w.counts["retried"] == 2 and w.counts["succeeded"] == 12
    assert len(t) == 0


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_poison_message_is_buried_after_max_attempts(backend: Any, start: Any, runner: str) -> None:
    t = backend.make()
    t.publish("poison", "bad")
    t.publish("poison", "after-1")
    t.publish("poison", "after-2")
    for g in range(3):
        t.publish(f"ok{g}", "fine")
    seen: List[Tuple[Any, int]] = []
    buried: List[Tuple[Job, Optional[BaseException]]] = []

    def body(job: Job) -> None:
        seen.append((job.event, job.attempt))
        if job.event == "bad":
            raise ValueError("cannot parse 'bad'")

    if runner == "asyncio":
        async def handler(job: Job) -> None:
            body(job)
    else:
        handler = body  # type: ignore[assignment]

    w = Worker(t, handler, concurrency=2, visibility=10.0, hooks={"buried": lambda j, e: buried.append((j, e))},
               retry=Retry(max_attempts=3, backoff=0.01, jitter=0.0))
    running = start(w, runner)
    wait_until(lambda: buried and w.counts["succeeded"] == 3)
    time.sleep(0.1)
    running.stop()
    assert [a for e, a in seen if e == "bad"] == [1, 2, 3]
    assert not [e for e, a in seen if str(e).startswith("after")], "the rest of the group did not wait"
    info = t.group("poison")
    assert info.state == "buried" and info.messages == 3 and info.attempt == 3
    assert "ValueError" in info.reason and "cannot parse" in info.reason and "attempt 3 of 3" in info.reason
    assert [m.event for m in t.peek("poison", 5)] == ["bad", "after-1", "after-2"]
    assert t.stats().buried == 1
    job, error = buried[0]
    assert isinstance(error, ValueError) and job.event == "bad"
    # The operator skips the poison head: the rest of the group runs, in order.
    assert t.skip("poison")
    w2 = Worker(t, handler, visibility=10.0)
    running = start(w2, runner)
    wait_until(lambda: w2.counts["succeeded"] == 2)
    running.stop()
    assert [e for e, a in seen if str(e).startswith("after")] == ["after-1", "after-2"]
    assert len(t) == 0


def test_a_non_retryable_error_is_buried_at_once(backend: Any, start: Any) -> None:
    t = backend.make()
    t.publish("g", "x")
    w = run_until(backend, start, lambda job: (_ for _ in ()).throw(KeyError("missing")),
                  lambda: t.group("g") is not None and t.group("g").state == "buried",
                  retry=Retry(max_attempts=5, give_up_on=(KeyError,)))
    assert w.counts["started"] == 1 and w.counts["buried"] == 1 and w.counts["retried"] == 0
    assert "KeyError" in t.group("g").reason and "attempt 1 of 5" in t.group("g").reason


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_a_requested_delay_is_not_a_failure(backend: Any, start: Any, runner: str) -> None:
    t = backend.make()
    t.publish("rate", "call-api")
    t.publish("rate", "next")
    calls: List[Tuple[Any, int, float]] = []

    def body(job: Job) -> None:
        calls.append((job.event, job.attempt, time.monotonic()))
        if job.event == "call-api" and len(calls) <= 4:
            raise RetryLater(0.05, "429 Too Many Requests")

    if runner == "asyncio":
        async def handler(job: Job) -> None:
            body(job)
    else:
        handler = body  # type: ignore[assignment]

    w = run_until(backend, start, handler, lambda: len(calls) >= 6 and len(t) == 0, runner=runner,
                  retry=Retry(max_attempts=2))
    assert [(e, a) for e, a, _ in calls] == [("call-api", 1)] * 5 + [("next", 1)]
    assert all(b[2] - a[2] >= 0.04 for a, b in zip(calls[:4], calls[1:5]))
    assert w.counts["retried"] == 4 and w.counts["buried"] == 0 and w.counts["succeeded"] == 2


def test_exhausted_skip_hands_the_message_to_the_dead_letter_callback(backend: Any, start: Any) -> None:
    t = backend.make()
    t.publish("g", "bad")
    t.publish("g", "good")
    dead: List[Tuple[Any, str]] = []
    ok: List[Any] = []

    def handler(job: Job) -> None:
        if job.event == "bad":
            raise RuntimeError("boom")
        ok.append(job.event)

    w = run_until(backend, start, handler, lambda: ok,
                  retry=Retry(max_attempts=2, backoff=0.01, exhausted="skip",
                              dead_letter=lambda job, exc: dead.append((job.event, repr(exc)))))
    assert dead == [("bad", "RuntimeError('boom')")] and ok == ["good"]
    assert w.counts["skipped"] == 1 and w.counts["retried"] == 1
    assert len(t) == 0


def test_a_failing_dead_letter_callback_buries_instead(backend: Any, start: Any) -> None:
    t = backend.make()
    t.publish("g", "bad")

    def dead_letter(job: Job, exc: BaseException) -> None:
        raise OSError("dead-letter store down")

    run_until(backend, start, lambda job: 1 / 0, lambda: t.group("g") and t.group("g").state == "buried",
              retry=Retry(max_attempts=1, exhausted="skip", dead_letter=dead_letter))
    reason = t.group("g").reason
    assert "ZeroDivisionError" in reason and "dead_letter raised OSError" in reason


@pytest.mark.parametrize("decision, state", [("bury", "buried"), (None, None), ("skip", None)])
def test_an_exhausted_callable_decides(inmemory: Any, start: Any, decision: Any, state: Any) -> None:
    t = inmemory.make()
    t.publish("g", "bad")
    calls: List[Any] = []

    def exhausted(job: Job, exc: BaseException) -> Any:
        calls.append((job.attempt, type(exc).__name__))
        return decision

    w = Worker(t, lambda job: 1 / 0, visibility=10.0, retry=Retry(max_attempts=2, backoff=0.01,
                                                                  exhausted=exhausted))
    running = start(w)
    wait_until(lambda: w.counts["buried"] + w.counts["skipped"] == 1)
    running.stop()
    assert calls == [(2, "ZeroDivisionError")]
    info = t.group("g")
    assert (info.state if info else None) == state


def test_an_exhausted_callable_may_ask_for_another_retry(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    t.publish("g", "bad")
    attempts: List[int] = []

    def handler(job: Job) -> None:
        attempts.append(job.attempt)
        if job.attempt < 3:
            raise ValueError

    def exhausted(job: Job, exc: BaseException) -> Any:
        return 0.01 if job.attempt < 3 else "bury"

    w = Worker(t, handler, visibility=10.0, retry=Retry(max_attempts=3, backoff=0.01, exhausted=exhausted))
    running = start(w)
    wait_until(lambda: w.counts["succeeded"] == 1)
    running.stop()
    assert attempts == [1, 2, 3]


def test_a_raising_exhausted_callable_buries(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    t.publish("g", "bad")

    def exhausted(job: Job, exc: BaseException) -> Any:
        raise RuntimeError("policy bug")

    w = Worker(t, lambda job: 1 / 0, visibility=10.0, retry=Retry(max_attempts=1, exhausted=exhausted))
    running = start(w)
    wait_until(lambda: w.counts["buried"] == 1)
    running.stop()
    assert "policy bug" in t.group("g").reason


def test_hooks_see_every_outcome_with_its_error(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    t.publish("a", "ok")
    t.publish("b", "fails-once")
    events: List[Tuple[str, Any, Optional[str]]] = []

    def hook(name: str) -> Any:
        return lambda job, err: events.append((name, job.event, type(err).__name__ if err else None))

    def handler(job: Job) -> None:
        if job.event == "fails-once" and job.attempt == 1:
            raise TimeoutError("slow upstream")

    w = Worker(t, handler, visibility=10.0, retry=Retry(backoff=0.01))
    for outcome in ("started", "succeeded", "retried"):
        w.on(outcome, hook(outcome))
    w.on("succeeded", lambda job, err: 1 / 0)  # a raising hook is logged and ignored
    running = start(w)
    wait_until(lambda: w.counts["succeeded"] == 2)
    running.stop()
    assert ("retried", "fails-once", "TimeoutError") in events
    assert events.count(("started", "fails-once", None)) == 2
    assert ("succeeded", "ok", None) in events and ("succeeded", "fails-once", None) in events


def test_async_handler_exceptions_follow_the_policy_too(inmemory: Any) -> None:
    t = inmemory.make()
    t.publish("g", "x")

    async def handler(job: Job) -> None:
        await asyncio.sleep(0)
        raise LookupError("nope")

    w = Worker(t, handler, visibility=10.0, retry=Retry(max_attempts=2, backoff=0.01))

    async def main() -> None:
        task = asyncio.ensure_future(w.arun())
        while not w.counts["buried"]:
            await asyncio.sleep(0.01)
        w.stop()
        await task

    asyncio.run(main())
    assert w.counts["retried"] == 1 and "LookupError" in t.group("g").reason
