"""``arun()`` with an ``async def`` handler: one task per job up to
``concurrency`` on the running loop, a claimer task and a heartbeat task.

A task that finishes a job claims the next one itself (with
``ack_and_claim``: the ack and the claim in one call).  A transport that
declares ``blocking = False`` (the in-memory twins: their calls never wait
beyond a lock) is called directly from the loop; any other transport's
calls run on a small thread pool, so they do not block the loop.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any, List, Optional, Set

from ..._errors import LeaseLost
from ..._serializers import EventDecodeError
from .. import _steps
from .._job import REFCOUNT, Job
from .._lifecycle import install_signals, remove_signals
from .._record import STARTED, SUCCEEDED
from .._retry import HANDBACK, RETURN, Action, Outcome

if TYPE_CHECKING:
    from .._worker import Worker

__all__ = ["AsyncRunner"]

_NONE = _steps.STOP  # "no next lease yet" (the ack did not claim one)

#: The fast path yields to the loop after this many jobs in a row.
_FAIR = 64


def _uncancel() -> None:
    """Forget a cancellation the worker asked for itself (Python 3.11+ counts them)."""
    task = asyncio.current_task()
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()


class AsyncRunner:
    """Runs a worker's ``async def`` handler as tasks (``Worker.arun``)."""

    def __init__(self, worker: "Worker") -> None:
        self.worker = worker

    async def job_task(self, lease: Any) -> None:
        """One task: run the delivery, then the next it claims without waiting, and so on."""
        w = self.worker
        t = w.transport
        wid = f"{w.worker_id}/a"
        while lease is not None:
            if w._inline and w._ack_and_claim is not None and not w._awrapping:
                following = await self.fast(lease, wid)
            else:
                following = await self.run_job(lease, wid)
            if w._stopping:
                if following is not _NONE and following is not None:
                    await w._acall(w._recorder.handback, following)  # claimed as the stop came
                return
            if following is not _NONE:
                lease = following
                continue
            if w._inline:  # the in-memory transport: a plain call, no coroutine
                lease = _steps.claim_now(w, t.claim, wid, 0)
            else:
                lease = await w._acall(_steps.claim_now, w, t.claim, wid, -1)

    async def fast(self, lease: Any, wid: str) -> Any:
        """The fast path of a non-blocking transport (in memory) when no
        middleware wraps the handler: run, ``ack_and_claim``, run the next,
        on this task, while every handler returns and the worker runs.
        Anything else (an error, a lost lease, a crash loop, a stop) goes to
        the general path.  Returns what ``run_job`` returns."""
        w = self.worker
        rec = w._recorder
        handler = w._acall_handler
        ack_and_claim = w._ack_and_claim
        assert ack_and_claim is not None
        vis, floor = w.visibility, w.min_priority
        max_attempts = w.retry.max_attempts
        held = w.heartbeat.held
        mine = rec.slot_counts[0]  # this loop's thread only
        task = asyncio.current_task()
        fair = _FAIR
        observed = rec.observers  # read once per run of the fast path
        refcount = REFCOUNT
        job: Optional[Job] = None
        while lease.attempt <= max_attempts:
            if job is None or refcount is None or refcount(job) != 2:
                job = Job(w, lease)
                job._task = task
            else:
                # Nobody kept the last Job (its only references: this frame and the
                # call's argument): reuse it for this delivery.
                job.lease = lease
                job._finished = False
            held.add(job)
            if observed:
                rec.emit(Outcome.STARTED, job, None, 0)
            else:
                mine[STARTED] += 1
            try:
                await handler(job)
            except BaseException as exc:
                return await self.run_job(lease, wid, job, exc)
            finally:
                held.discard(job)
            job._finished = True
            if job.lost or job._acked or w._stopping:
                return await self.run_job(lease, wid, job, None)
            try:
                following = ack_and_claim(job.lease, wid, vis, floor)
            except LeaseLost as exc:
                rec.failed(job, exc)  # nothing acked, nothing claimed
                return _NONE
            except EventDecodeError as exc:
                # The ack stood; the claim's message does not decode: bury its group.
                rec.emit(Outcome.SUCCEEDED, job, None, 0)
                rec.undecodable(exc, 0)
                return _NONE
            except Exception as exc:
                rec.failed(job, exc)
                return _NONE
            if observed:
                rec.emit(Outcome.SUCCEEDED, job, None, 0)
            else:
                mine[SUCCEEDED] += 1
            if following is None or w._stopping:
                return following
            lease = following
            fair -= 1
            if not fair:  # a handler that never awaits: let the loop's other tasks run now and then
                fair = _FAIR
                await asyncio.sleep(0)
        return await self.run_job(lease, wid)

    async def run_job(self, lease: Any, wid: str, job: Optional[Job] = None,
                      first: Optional[BaseException] = None) -> Any:
        """Run one delivery and record its outcome; the next lease when the
        ack claimed it (``ack_and_claim``), else ``_NONE``.  ``job``: the fast
        path already ran it once, and it raised ``first`` (or returned)."""
        w = self.worker
        rec = w._recorder
        inline = w._inline
        ran = job is not None
        if job is None:
            job = Job(w, lease)
            crashed = _steps.begin(w, job)
            if crashed is not None:
                await w._acall(rec.apply, job, crashed[0], crashed[1])
                return _NONE
        job._task = asyncio.current_task()
        # In-memory: everything runs on this loop's thread, so it counts
        # like a thread slot (no lock); otherwise the recorder runs on the I/O pool.
        slot = 0 if inline else -1
        held = w.heartbeat.held
        held.add(job)
        call = w._acall_handler
        try:
            while True:
                error: Optional[BaseException] = None
                try:
                    if ran:  # the fast path ran it: its outcome
                        ran = False
                        job._finished = False
                        if first is not None:
                            raise first
                    else:
                        rec.emit(Outcome.STARTED, job, None, slot)
                        await call(job)
                except asyncio.CancelledError:
                    if job.lost:
                        _uncancel()
                        return _NONE  # the heartbeat cancelled it: neither ack nor nack
                    job._finished = True
                    # Cancelled by the shutdown: released, uncounted.  A CancelledError
                    # the handler raised itself while the worker runs is an outcome: nack.
                    back = HANDBACK if w._stopping else RETURN
                    await asyncio.shield(w._acall(rec.apply, job, back, None))
                    raise
                except Exception as exc:
                    error = exc
                decision = _steps.after(w, job, error)
                if decision is None:
                    return _NONE
                if _steps.waits_in_place(w, job, decision):
                    # A transport without release: keep the lease and wait in this task (Part 4).
                    rec.emit(Outcome.RETRIED, job, error, slot)
                    try:
                        await asyncio.sleep(decision.delay)
                    except asyncio.CancelledError:
                        if job.lost:
                            _uncancel()
                            return _NONE
                        job._finished = True
                        await asyncio.shield(w._acall(rec.apply, job, HANDBACK, None))
                        raise
                    if job.lost:
                        return _NONE
                    continue
                job._finished = True
                if job.lost:
                    return _NONE
                if decision.action is Action.ACK and not job._acked and w._ack_and_claim is not None \
                        and not w._stopping:
                    return await self._ack_and_claim(job, wid, slot)
                if inline:
                    rec.apply(job, decision, error, slot)
                else:
                    await w._acall(rec.apply, job, decision, error)
                return _NONE
        finally:
            job._finished = True
            held.discard(job)

    async def _ack_and_claim(self, job: Job, wid: str, slot: int) -> Any:
        """The ack and the next claim in one call (as the thread runner's fast path)."""
        w = self.worker
        rec = w._recorder
        ack_and_claim = w._ack_and_claim
        assert ack_and_claim is not None  # run_job checked it
        try:
            if w._inline:
                following = ack_and_claim(job.lease, wid, w.visibility, w.min_priority)
            else:
                following = await w._acall(ack_and_claim, job.lease, wid, w.visibility, w.min_priority)
        except LeaseLost as exc:
            await w._acall(rec.failed, job, exc)  # nothing acked, nothing claimed
            return _NONE
        except EventDecodeError as exc:
            # The ack stood; the claim's message does not decode: bury its group.
            rec.emit(Outcome.SUCCEEDED, job, None, slot)
            await w._acall(rec.undecodable, exc, slot)
            return _NONE
        except Exception as exc:
            await w._acall(rec.failed, job, exc)
            return _NONE
        rec.emit(Outcome.SUCCEEDED, job, None, slot)
        return following

    async def run(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        w = self.worker
        loop = asyncio.get_running_loop()
        t = w.transport
        rec = w._recorder
        n = w.concurrency
        w._io = None if w._inline else ThreadPoolExecutor(min(n, 4) + 1, thread_name_prefix=f"{w.name}-io")
        tasks: Set["asyncio.Task[Any]"] = set()
        wakeup = asyncio.Event()
        claim_task: List[Optional["asyncio.Task[Any]"]] = [None]

        def wake() -> None:
            wakeup.set()
            task = claim_task[0]
            if task is not None and w._stopping:
                task.cancel()

        def done(task: "asyncio.Task[Any]") -> None:
            tasks.discard(task)
            wakeup.set()
            if not task.cancelled() and task.exception() is not None:
                w.logger.error("job task failed: %r", task.exception())

        w._loop, w._wake = loop, wake
        installed = install_signals(w, loop)
        hb = loop.create_task(w.heartbeat.run_task(w._acall))
        w.logger.info("worker %s started: %d tasks, visibility %gs, %r", w.worker_id, n, w.visibility, w.retry)
        try:
            vis, floor, wid = w.visibility, w.min_priority, w.worker_id
            # The claim waits for a wake-up; the deadline only bounds what a
            # missed one could cost (one idle wake-up per visibility / 3).
            rewait = max(w.heartbeat.interval, 0.5)
            while not w._stopping:
                if len(tasks) >= n:
                    wakeup.clear()
                    if len(tasks) >= n and not w._stopping:
                        await wakeup.wait()
                    continue
                lease = await _steps.wait_claim(w, loop, claim_task, rewait)
                if lease is _steps.STOP:
                    break
                if lease is None:
                    continue
                leases = [lease]
                extra = min(n - len(tasks) - 1, w.batch - 1)
                if extra > 0 and not w._stopping:
                    try:
                        leases += await w._acall(t.claim_many, wid, vis, extra, floor)
                    except EventDecodeError as exc:
                        await w._acall(rec.undecodable, exc)
                    except Exception:
                        pass
                for lease in leases:
                    if w._stopping:
                        await w._acall(rec.handback, lease)
                        continue
                    task = loop.create_task(self.job_task(lease))
                    tasks.add(task)
                    task.add_done_callback(done)
        except asyncio.CancelledError:
            # arun() itself was cancelled: stop, cancel the handlers, hand back.
            w.stop()
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.wait(list(tasks))
            raise
        finally:
            if tasks:
                await self._drain(tasks, wakeup)
            hb.cancel()
            remove_signals(loop, installed)
            w._loop = w._wake = None
            if w._io is not None:
                w._io.shutdown(wait=False)

    async def _drain(self, tasks: Set["asyncio.Task[Any]"], wakeup: asyncio.Event) -> None:
        w = self.worker
        loop = asyncio.get_running_loop()
        deadline = loop.time() + w.drain_timeout
        while tasks and not w._forced:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            wakeup.clear()
            try:
                await asyncio.wait_for(wakeup.wait(), None if remaining == math.inf else remaining)
            except asyncio.TimeoutError:
                break
        if tasks:
            w.logger.warning("cancelling %d handler(s) still running; their messages are handed back", len(tasks))
            for task in list(tasks):
                task.cancel()
            await asyncio.wait(list(tasks))

