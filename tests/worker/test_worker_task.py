"""``leasequeue.Task`` / ``leasequeue.task``: a handler with its options
(``retry``, ``hooks``, ``middleware``, ``min_priority``); ``Worker(t,
task)`` takes them as defaults, explicit keywords win."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any, List, Optional

import pytest
from worker_helpers import wait_until

import leasequeue
from leasequeue import Job, Middleware, Retry, Task, Worker, task
from leasequeue.worker import Outcome


def test_task_is_exported_lazily_and_is_the_packages() -> None:
    import leasequeue.worker

    assert leasequeue.Task is leasequeue.worker.Task and leasequeue.task is leasequeue.worker.task
    assert leasequeue.Middleware is leasequeue.worker.Middleware
    assert {"Task", "task", "Middleware"} <= set(leasequeue.__all__)
    code = ("import sys, leasequeue; assert 'leasequeue.worker' not in sys.modules; leasequeue.Task; "
            "assert 'leasequeue.worker' in sys.modules; from leasequeue._worker import Worker, Retry; "
            "assert Worker is leasequeue.Worker; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_the_decorator_bare_with_options_and_called() -> None:
    @task
    def plain(job: Any) -> str:
        """Doc."""
        return f"ran {job}"

    policy = Retry(max_attempts=2)

    @task(retry=policy, min_priority=3)
    def configured(job: Any) -> str:
        return "configured"

    assert isinstance(plain, Task) and plain("j") == "ran j" and plain.__name__ == "plain" and plain.__doc__ == "Doc."
    assert plain.retry is None and plain.hooks is None and plain.middleware == () and plain.min_priority is None
    assert configured.retry is policy and configured.min_priority == 3 and configured("x") == "configured"
    called = task(lambda job: 1, retry=policy)
    assert isinstance(called, Task) and called.retry is policy
    assert "retry=Retry(max_attempts=2" in repr(configured)

    async def coro(job: Any) -> int:
        return 5

    t = task(coro)
    assert t.is_async and not plain.is_async
    assert asyncio.run(t("job")) == 5


@pytest.mark.parametrize("kwargs, error", [
    ({"retry": 3}, TypeError),
    ({"hooks": {"finished": print}}, ValueError),
    ({"hooks": {"succeeded": 3}}, TypeError),
    ({"hooks": [print]}, TypeError),
    ({"middleware": [object()]}, TypeError),
    ({"min_priority": 1.5}, TypeError),
    ({"min_priority": True}, TypeError),
])
def test_bad_options_are_refused_when_the_task_is_made(kwargs: Any, error: type) -> None:
    with pytest.raises(error):
        Task(lambda job: None, **kwargs)
    with pytest.raises(TypeError):
        Task("not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="already a Task"):
        Task(Task(lambda job: None))


def test_a_workers_defaults_come_from_the_task(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    t.publish("low", "low", 0)
    t.publish("high", "bad", 5)
    t.publish("high", "good", 5)
    hooked: List[Any] = []
    wrapped: List[Any] = []

    class Around(Middleware):
        def wrap(self, call_next: Any, job: Job) -> Any:
            wrapped.append(job.event)
            return call_next(job)

    ran: List[Any] = []

    @task(retry=Retry(max_attempts=1), hooks={"buried": lambda job, error: hooked.append(job.event)},
          middleware=[Around()], min_priority=5)
    def handle(job: Job) -> None:
        ran.append(job.event)
        if job.event == "bad":
            raise ValueError("bad")

    w = Worker(t, handle, visibility=10.0)
    assert w.retry is handle.retry and w.min_priority == 5 and w.task is handle and w.handler is handle.handler
    running = start(w, "threads")
    wait_until(lambda: hooked == ["bad"])
    running.stop()
    assert ran == ["bad"] and wrapped == ["bad"]  # buried at its first attempt; "low" is below the floor
    assert t.group("high").state == "buried" and t.group("low").state == "ready"


def test_explicit_worker_keywords_win(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    t.publish("low", "low", 0)
    t.publish("g", "bad", 0)
    task_hooks: List[Any] = []
    worker_hooks: List[Any] = []
    task_mw: List[Any] = []

    class Seen(Middleware):
        def on_outcome(self, job: Job, outcome: Outcome, error: Optional[BaseException]) -> None:
            task_mw.append(outcome.value)

    @task(retry=Retry(max_attempts=1), hooks={"retried": lambda job, error: task_hooks.append(job.event)},
          middleware=Seen(), min_priority=5)
    def handle(job: Job) -> None:
        if job.event == "bad" and job.attempt == 1:
            raise ValueError("bad")

    policy = Retry(max_attempts=3, backoff=0.0, jitter=0.0)
    w = Worker(t, handle, visibility=10.0, retry=policy, min_priority=0, middleware=[],
               hooks={"retried": lambda job, error: worker_hooks.append(job.event)})
    assert w.retry is policy and w.min_priority == 0
    running = start(w, "threads")
    wait_until(lambda: w.counts["succeeded"] == 2)
    running.stop()
    assert worker_hooks == ["bad"] and task_hooks == [] and task_mw == []
    assert len(t) == 0


def test_an_async_task_runs_on_asyncio(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    t.publish("g", 1)
    seen: List[Any] = []

    @task(retry=Retry(max_attempts=2))
    async def handle(job: Job) -> None:
        await asyncio.sleep(0)
        seen.append(job.event)

    w = Worker(t, handle, visibility=10.0)
    assert w.is_async
    running = start(w, "asyncio")
    wait_until(lambda: seen == [1])
    running.stop()
    assert w.counts["succeeded"] == 1
