"""Small edges of the worker's options (issue 31): one message for a
``visibility`` that is not > 0, a warning for ``exhausted="skip"`` without a
dead letter, a warning for ``signals=True`` off the main thread (and the
embedded pattern: a worker on its own thread stopped by ``stop()``), and
``drain_timeout=inf``."""

from __future__ import annotations

import asyncio
import math
import threading
import warnings
from typing import Any, List

import pytest
from worker_helpers import wait_until

from leasequeue import Job, Retry, Worker
from leasequeue.worker._job import REFCOUNT


def _h(job: Job) -> None:
    pass


@pytest.mark.parametrize("visibility", [0, 0.0, -1, -0.5, math.nan, math.inf])
def test_visibility_not_above_zero_says_must_be_above_zero(inmemory: Any, visibility: float) -> None:
    t = inmemory.make()
    with pytest.raises(ValueError, match=r"^visibility must be > 0 and finite, not "):
        Worker(t, _h, visibility=visibility)


def test_exhausted_skip_without_dead_letter_warns_at_construction() -> None:
    with pytest.warns(UserWarning, match="drops exhausted messages.*dead_letter"):
        policy = Retry(max_attempts=1, exhausted="skip")
    assert policy.exhausted == "skip" and policy.dead_letter is None  # still built: a warning, not an error
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Retry(exhausted="skip", dead_letter=lambda job, error: None)
        Retry(exhausted="bury")
        Retry(exhausted=lambda job, error: "skip")


def test_signals_true_off_the_main_thread_warns_once_and_stop_still_works(inmemory: Any) -> None:
    t = inmemory.make()
    done: List[Any] = []
    caught: List[warnings.WarningMessage] = []
    errors: List[BaseException] = []
    w = Worker(t, lambda job: done.append(job.event), signals=True, visibility=5.0)

    def target() -> None:
        try:
            with warnings.catch_warnings(record=True) as got:
                warnings.simplefilter("always")
                w.run()
            caught.extend(got)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    th = threading.Thread(target=target, daemon=True)
    th.start()
    t.publish("g", 1)
    wait_until(lambda: done == [1])
    w.stop()
    th.join(10)
    assert not th.is_alive() and not errors
    runtime = [c for c in caught if issubclass(c.category, RuntimeWarning)]
    assert len(runtime) == 1, [str(c.message) for c in caught]
    assert "signals=True" in str(runtime[0].message) and "worker.stop()" in str(runtime[0].message)
    assert runtime[0].filename == __file__  # points at the run() call


def test_signals_default_off_the_main_thread_does_not_warn(inmemory: Any) -> None:
    t = inmemory.make()
    caught: List[warnings.WarningMessage] = []
    w = Worker(t, _h, visibility=5.0)

    def target() -> None:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            w.run()
        caught.extend(got)

    th = threading.Thread(target=target, daemon=True)
    th.start()
    wait_until(lambda: w._loop is not None)
    w.stop()
    th.join(10)
    assert not th.is_alive()
    assert not [c for c in caught if issubclass(c.category, RuntimeWarning)]


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_drain_timeout_inf_waits_for_the_running_handler(inmemory: Any, start: Any, runner: str) -> None:
    t = inmemory.make()
    release = threading.Event()
    began = threading.Event()
    finished: List[Any] = []
    if runner == "threads":
        def handler(job: Job) -> None:
            began.set()
            release.wait(10)
            finished.append(job.event)
    else:
        import asyncio

        async def handler(job: Job) -> None:  # type: ignore[misc]
            began.set()
            while not release.is_set():
                await asyncio.sleep(0.01)
            finished.append(job.event)

    w = Worker(t, handler, drain_timeout=float("inf"), visibility=5.0)
    assert w.drain_timeout == math.inf
    running = start(w, runner)
    t.publish("g", 1)
    assert began.wait(10)
    w.stop()
    running.thread.join(0.3)
    assert running.thread.is_alive(), "an infinite drain_timeout did not wait"
    release.set()
    running.join()
    assert finished == [1] and w.counts["succeeded"] == 1 and w.counts["handed_back"] == 0
    assert len(t) == 0


class _Wrapped:
    """A transport passed through, noting the thread of each ack; its
    ``blocking`` capability is what the test declares (or nothing)."""

    def __init__(self, t: Any, blocking: Any) -> None:
        self._t = t
        self.threads: List[str] = []
        if blocking is not None:
            self.blocking = blocking

    def ack_and_claim(self, *args: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        return self._t.ack_and_claim(*args)

    def __getattr__(self, name: str) -> Any:
        if name == "blocking":  # not declared by this wrapper (None): not passed through either
            raise AttributeError(name)
        return getattr(self._t, name)


@pytest.mark.parametrize("blocking, on_loop", [(False, True), (True, False), (None, False)])
def test_the_blocking_capability_decides_where_arun_calls_the_transport(inmemory: Any, start: Any,
                                                                        blocking: Any, on_loop: bool) -> None:
    """``blocking = False`` (declared by the in-memory twins): called on the
    loop; ``True`` or not declared: on the worker's I/O pool.  ``prefetch=0``:
    one task acking with ``ack_and_claim`` (a blocking transport with
    ``ack_many`` otherwise batches: test_worker_async_batched.py)."""
    raw = inmemory.make()
    assert raw.blocking is False and type(raw).blocking is False
    t = _Wrapped(raw, blocking)
    for i in range(3):
        t.publish("g", i)
    loop_threads: List[str] = []

    async def handler(job: Job) -> None:
        loop_threads.append(threading.current_thread().name)

    w = Worker(t, handler, visibility=5.0, name="cap", prefetch=0)
    running = start(w, "asyncio")
    wait_until(lambda: w.counts["succeeded"] == 3)
    running.stop()
    assert t.threads, "ack_and_claim was not used"
    if on_loop:
        assert set(t.threads) == set(loop_threads)
    else:
        assert all(name.startswith("cap-io") for name in t.threads), t.threads


def test_async_handlers_that_never_await_still_share_the_loop(inmemory: Any, start: Any) -> None:
    """The asyncio runner's fast path runs a task's next job without a
    hand-off; with handlers that never await, it still yields to the loop
    now and then, so the claimer runs and a second task gets work long
    before the first task's stream of jobs ends."""
    t = inmemory.make()
    for i in range(400):
        t.publish("a", i)
        t.publish("b", i)
    tasks: List[int] = []

    async def handler(job: Job) -> None:
        tasks.append(id(asyncio.current_task()))  # no await: CPU-only

    w = Worker(t, handler, concurrency=2, visibility=10.0, batch=1)
    running = start(w, "asyncio")
    wait_until(lambda: len(tasks) == 800)
    running.stop()
    first = tasks[0]
    second = next((i for i, task in enumerate(tasks) if task != first), None)
    assert second is not None and second < 200, second


@pytest.mark.skipif(REFCOUNT is None, reason="a Job is reused on CPython 3.9-3.13 with the GIL only")
@pytest.mark.parametrize("hooks", [False, True])
def test_a_job_nobody_kept_is_reused_by_the_thread_fast_path(inmemory: Any, start: Any, hooks: bool) -> None:
    """Both thread fast paths (pure and compiled) run every delivery of an
    uninterrupted stream with one ``Job``, when neither the handler nor a
    hook keeps it (a new ``Job`` per delivery would alternate between two
    addresses: the next one is made while the last one still exists)."""
    t = inmemory.make()
    for i in range(40):
        t.publish(f"g{i % 4}", i)
    ids: List[int] = []
    events: List[int] = []

    def handler(job: Job) -> None:
        ids.append(id(job))
        events.append(job.event)

    w = Worker(t, handler, concurrency=1, visibility=10.0,
               hooks={"succeeded": lambda job, error: None} if hooks else None)
    running = start(w, "threads")
    wait_until(lambda: w.counts["succeeded"] == 40)
    running.stop()
    assert sorted(events) == list(range(40))
    assert len(set(ids)) == 1, len(set(ids))


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
@pytest.mark.parametrize("keeper", ["handler", "hook"])
def test_a_job_someone_kept_is_never_reused_for_another_delivery(backend: Any, start: Any, runner: str,
                                                                 keeper: str) -> None:
    """The fast paths reuse a ``Job`` nobody kept (CPython with the GIL);
    one the handler or a hook kept keeps its delivery: its event, seq and
    lease stay those of the message it was made for."""
    t = backend.make()
    for i in range(60):
        t.publish(f"g{i % 3}", i)
    kept: List[Job] = []
    lock = threading.Lock()

    def keep(job: Job) -> None:
        with lock:
            kept.append(job)

    def body(job: Job) -> None:
        if keeper == "handler" and job.event % 2 == 0:
            keep(job)

    if runner == "threads":
        handler: Any = body
    else:
        async def handler(job: Job) -> None:
            body(job)

    hooks = {"succeeded": lambda job, error: keep(job) if job.event % 2 == 0 else None} if keeper == "hook" else None
    w = Worker(t, handler, visibility=10.0, hooks=hooks)
    running = start(w, runner)
    wait_until(lambda: w.counts["succeeded"] == 60)
    running.stop()
    assert sorted(j.event for j in kept) == list(range(0, 60, 2))
    for j in kept:
        assert (j.lease.event, j.group_id, j.lease.group_id) == (j.event, f"g{j.event % 3}", f"g{j.event % 3}")
    assert len({id(j) for j in kept}) == 30
