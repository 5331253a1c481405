"""``leasequeue.Middleware``: a user middleware sees every outcome of every
job (on both runners), wraps the handler (the first given outermost; an
exception it raises is the handler's error), and is told of the run's start
and stop.  Real transports, real threads and loops."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, List, Optional, Tuple

import pytest
from worker_helpers import wait_until

from leasequeue import Job, Middleware, Retry, Worker
from leasequeue.worker import Outcome


class Recording(Middleware):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: List[Tuple[Any, str, Optional[str]]] = []
        self.events: List[str] = []

    def on_outcome(self, job: Job, outcome: Outcome, error: Optional[BaseException]) -> None:
        assert isinstance(outcome, Outcome)
        with self.lock:
            self.outcomes.append((job.event, outcome.value, type(error).__name__ if error is not None else None))

    def on_start(self, worker: Worker) -> None:
        self.events.append("start")

    def on_stop(self, worker: Worker) -> None:
        self.events.append("stop")

    def of(self, event: Any) -> List[Tuple[str, Optional[str]]]:
        with self.lock:
            return [(o, e) for ev, o, e in self.outcomes if ev == event]


def _exhausted(job: Job, error: BaseException) -> Any:
    return "skip" if isinstance(error, KeyError) else "bury"


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_a_middleware_sees_every_outcome(inmemory: Any, start: Any, runner: str) -> None:
    t = inmemory.make()
    for group, event in [("ok", "ok"), ("retry", "retry"), ("bury", "bury"), ("skip", "skip"), ("lose", "lose")]:
        t.publish(group, event)
    tries: List[str] = []
    lose_started = threading.Event()

    def body(job: Job) -> Optional[str]:
        tries.append(job.event)
        if job.event == "retry" and job.attempt == 1:
            raise ValueError("once")
        if job.event == "bury":
            raise ValueError("always")
        if job.event == "skip":
            raise KeyError("skip me")
        if job.event == "lose":
            lose_started.set()
            return "lose"
        return None

    if runner == "threads":
        def handler(job: Job) -> None:
            if body(job) == "lose":
                t.purge("lose")
                while not job.lost:
                    time.sleep(0.01)
    else:
        async def handler(job: Job) -> None:  # type: ignore[misc]
            if body(job) == "lose":
                t.purge("lose")
                await asyncio.sleep(30)  # cancelled by the heartbeat's LeaseLost

    m = Recording()
    w = Worker(t, handler, visibility=0.3, concurrency=2, middleware=[m],
               retry=Retry(max_attempts=2, backoff=0.0, jitter=0.0, exhausted=_exhausted))
    running = start(w, runner)
    wait_until(lambda: ("lost", "LeaseLost") in m.of("lose") and ("succeeded", None) in m.of("retry")
               and m.of("bury") and m.of("skip") and m.of("ok"), timeout=20)
    running.stop()
    assert m.events == ["start", "stop"]
    assert m.of("ok") == [("started", None), ("succeeded", None)]
    assert m.of("retry") == [("started", None), ("retried", "ValueError"), ("started", None), ("succeeded", None)]
    assert m.of("bury") == [("started", None), ("retried", "ValueError"), ("started", None), ("buried", "ValueError")]
    assert m.of("skip") == [("started", None), ("retried", "KeyError"), ("started", None), ("skipped", "KeyError")]
    assert m.of("lose") == [("started", None), ("lost", "LeaseLost")]
    counts = w.counts
    assert sum(1 for _, o, _ in m.outcomes if o == "started") == counts["started"]
    for outcome in ("succeeded", "retried", "buried", "skipped", "lost"):
        assert sum(1 for _, o, _ in m.outcomes if o == outcome) == counts[outcome], outcome


def test_a_middleware_sees_a_hand_back_at_shutdown(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    t.publish("g", "slow")
    began = threading.Event()

    async def handler(job: Job) -> None:
        began.set()
        await asyncio.sleep(30)

    m = Recording()
    w = Worker(t, handler, visibility=10.0, drain_timeout=0.05, middleware=m)
    running = start(w, "asyncio")
    assert began.wait(10)
    running.stop()
    assert m.of("slow") == [("started", None), ("handed_back", None)]
    assert m.events == ["start", "stop"]


def test_wrap_runs_around_the_handler_first_given_outermost(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    t.publish("g", 1)
    t.publish("g", 2)
    trace: List[str] = []

    class Named(Middleware):
        def __init__(self, name: str) -> None:
            self.name = name

        def wrap(self, call_next: Any, job: Job) -> Any:
            trace.append(f"{self.name}>")
            try:
                return call_next(job)
            finally:
                trace.append(f"<{self.name}")

    class Refuses(Middleware):
        def wrap(self, call_next: Any, job: Job) -> Any:
            if job.event == 2:
                raise PermissionError("not allowed")
            return call_next(job)

    w = Worker(t, lambda job: trace.append(f"handler {job.event}"), visibility=10.0,
               middleware=[Named("outer"), Named("inner"), Refuses()], retry=Retry(max_attempts=1))
    running = start(w, "threads")
    wait_until(lambda: w.counts["succeeded"] == 1 and w.counts["buried"] == 1)
    running.stop()
    assert trace[:5] == ["outer>", "inner>", "handler 1", "<inner", "<outer"]
    assert trace[5:] == ["outer>", "inner>", "<inner", "<outer"]  # the handler did not run for 2
    info = t.group("g")
    assert info.state == "buried" and info.reason.startswith("PermissionError: not allowed")


def test_awrap_runs_around_an_async_handler(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    t.publish("g", 1)
    trace: List[str] = []

    class Around(Middleware):
        async def awrap(self, call_next: Any, job: Job) -> Any:
            trace.append("before")
            result = await call_next(job)
            trace.append("after")
            return result

    async def handler(job: Job) -> None:
        trace.append("handler")

    w = Worker(t, handler, visibility=10.0, middleware=[Around()])
    running = start(w, "asyncio")
    wait_until(lambda: w.counts["succeeded"] == 1)
    running.stop()
    assert trace == ["before", "handler", "after"]


def test_a_middleware_raising_in_on_outcome_is_logged_and_ignored(inmemory: Any, start: Any, caplog: Any) -> None:
    t = inmemory.make()
    t.publish("g", 1)

    class Broken(Middleware):
        def on_outcome(self, job: Job, outcome: Outcome, error: Optional[BaseException]) -> None:
            raise RuntimeError("observer bug")

    w = Worker(t, lambda job: None, visibility=10.0, middleware=[Broken()])
    running = start(w, "threads")
    wait_until(lambda: w.counts["succeeded"] == 1)
    running.stop()
    assert len(t) == 0 and "observer bug" in caplog.text


def test_middleware_must_be_middleware(inmemory: Any) -> None:
    t = inmemory.make()
    with pytest.raises(TypeError, match="Middleware"):
        Worker(t, lambda job: None, middleware=[object()])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="Middleware"):
        Worker(t, lambda job: None, middleware=3)  # type: ignore[arg-type]
