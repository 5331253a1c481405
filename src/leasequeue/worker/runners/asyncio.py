"""``arun()`` with an ``async def`` handler: one task per job up to
``concurrency`` on the running loop, a claimer task and a heartbeat task.

A task that finishes a job claims the next one itself (with
``ack_and_claim``: the ack and the claim in one call).  A transport that
declares ``blocking = False`` (the in-memory twins: their calls never wait
beyond a lock) is called directly from the loop; any other transport's
calls run on a small thread pool, so they do not block the loop.

On a durable transport (``ack_many`` and ``claim_many``, ``batch`` above 1,
several tasks or a prefetch; :func:`.acks.batches_acks`, as the thread
runner) it batches instead: the claimer claims for every free task slot,
plus the prefetch (:mod:`.prefetch`), with one ``claim_many``; a task
whose handler returned leaves the ack in an
:class:`.async_acks.AsyncAckBuffer`, which a flusher task sends with one
``ack_many``, and runs the next claimed job, if one waits (claimed jobs
wait in ``ready``).  Two overlapping commits for a batch of jobs
instead of one per job.  A claimed job waiting for a task (prefetched) and
a job waiting for its ack are held by the heartbeat like a running one
(its group stays leased: one job per group in flight, group order); at a
stop the waiting ones go back uncounted (``release``), and the buffered
acks are sent before ``arun()`` returns.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import math
import time
from typing import TYPE_CHECKING, Any, Deque, List, Optional, Set

from ..._errors import LeaseLost
from ..._serializers import EventDecodeError
from .. import _steps
from .._checks import error_name
from .._job import REFCOUNT, Job
from .._lifecycle import install_signals, remove_signals
from .._record import STARTED, SUCCEEDED
from .._retry import HANDBACK, RETURN, Action, Outcome
from .acks import batches_acks
from .async_acks import AsyncAckBuffer
from .prefetch import averaged, prefetch_now

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
        #: The batched path (set by ``run``): its ack buffer, else None.
        self.acks: Optional[AsyncAckBuffer] = None
        #: The batched path: the handlers' moving average run time (seconds;
        #: None until a first job ran): ``prefetch=None`` follows it.
        self.average: Optional[float] = None
        #: The batched path: claimed jobs waiting for a task (held by the heartbeat).
        self.ready: Deque[Job] = collections.deque()
        #: The batched path: the claimer claims again once ``idle()`` reaches this.
        self.low = 1
        self._tasks: Set["asyncio.Task[Any]"] = set()
        self._wakeup: Optional[asyncio.Event] = None
        #: The batched path: redelivered jobs running now (``_isolate``): no prefetch meanwhile.
        self._isolating = 0

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
                      first: Optional[BaseException] = None, acks: Optional[AsyncAckBuffer] = None) -> Any:
        """Run one delivery and record its outcome; the next lease when the
        ack claimed it (``ack_and_claim``), else ``_NONE``.  ``job``: the fast
        path already ran it once, and it raised ``first`` (or returned).
        ``lease`` may be the batched path's job (claimed, not run yet);
        ``acks``: the batched path's buffer, where the ack of a handler that
        returned goes (the job stays held, unfinished, until it is sent)."""
        w = self.worker
        rec = w._recorder
        inline = w._inline
        ran = job is not None
        if job is None:
            job = lease if isinstance(lease, Job) else Job(w, lease)
            crashed = _steps.begin(w, job)
            if crashed is not None:
                w.heartbeat.held.discard(job)  # the batched path held it while it waited
                await w._acall(rec.apply, job, crashed[0], crashed[1])
                return _NONE
        job._task = asyncio.current_task()
        # In-memory: everything runs on this loop's thread, so it counts
        # like a thread slot (no lock); otherwise the recorder runs on the I/O pool.
        slot = 0 if inline else -1
        held = w.heartbeat.held
        held.add(job)
        call = w._acall_handler
        buffered = False
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
                if acks is not None and decision.action is Action.ACK and not job._acked and not job.lost:
                    # The batched path: the ack waits in the buffer; this task moves on
                    # (a lost lease must not cancel it any more).
                    job._task = None
                    acks.add(job)
                    buffered = True
                    return _NONE
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
            if not buffered:
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

    # ------------------------------------------------------------ the batched path

    def prefetch(self) -> int:
        """How many leases the batched claimer may hold beyond its free task slots now."""
        if self._isolating:
            return 0
        return prefetch_now(self.worker, self.average)  # the rule both runners share

    def idle(self) -> int:
        """Free task slots minus the claimed jobs waiting for one (below 0
        while prefetched jobs wait)."""
        return self.worker.concurrency - len(self._tasks) - len(self.ready)

    def _freed(self) -> bool:
        """A task slot freed up (a task took a waiting job, or ended): wake
        the claimer when ``idle()`` reached ``low`` (or to drain, at a stop).
        True when it woke it."""
        wakeup = self._wakeup
        if wakeup is None or wakeup.is_set():
            return False
        if self.idle() >= self.low or self.worker._stopping:
            wakeup.set()
            return True
        return False

    async def batch_task(self) -> None:
        """One task of the batched path: run the claimed jobs waiting in
        ``ready``, one after another, while the worker runs; it ends when
        none waits (the claimer starts another when it claims).  A job is
        in ``ready`` or taken by a running task: a task cancelled before it
        began leaves its job there, to be handed back."""
        try:
            await self._batch_jobs()
        finally:
            # Leave the slot now, not in a done callback: the claimer, running
            # before that callback, would leave its jobs waiting for this task.
            task = asyncio.current_task()
            assert task is not None
            self._tasks.discard(task)
            self._freed()

    async def _batch_jobs(self) -> None:
        w = self.worker
        acks = self.acks
        assert acks is not None
        ready = self.ready
        held = w.heartbeat.held
        plain = not w._awrapping
        wid = f"{w.worker_id}/a"
        perf = time.perf_counter
        woke = False
        while ready and not w._stopping:
            job = ready.popleft()
            if self._freed() or woke:
                # Let the claimer or the flusher start now: a handler that never
                # awaits would otherwise run every waiting job first.
                try:
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    ready.appendleft(job)  # never started: handed back with the rest
                    raise
            if job.lost:
                held.discard(job)  # lost while it waited (the heartbeat recorded it)
                continue
            if w._stopping:
                ready.appendleft(job)  # claimed, never started: handed back with the rest
                return
            redelivered = job.lease.attempt > 1
            if redelivered:
                self._isolating += 1
            try:
                if redelivered:
                    await self._isolate(acks)
                began = perf()
                if plain:
                    await self.deferred(job, wid, acks)
                else:
                    await self.run_job(job, wid, acks=acks)
            finally:
                if redelivered:
                    self._isolating -= 1
            self.average = averaged(self.average, perf() - began)
            woke = acks.pending == 1  # this job's ack woke the flusher

    async def _isolate(self, acks: AsyncAckBuffer) -> None:
        """Before a task runs a redelivered job (attempt > 1: a retry, or a
        delivery whose worker died), as the thread runner's ``isolate``:
        hand back uncounted the jobs waiting in ``ready``, and wait until the
        finished jobs' acks are sent, so that a job that kills the process
        charges no neighbour an attempt and re-runs no finished job."""
        await self._hand_back_ready()
        self._freed()
        await acks.sync()

    async def deferred(self, job: Job, wid: str, acks: AsyncAckBuffer) -> None:
        """The batched path when no middleware wraps the handler: run one
        delivery; when the handler returns, its ack goes to ``acks`` (the
        job stays held, unfinished, until the ack is sent).  Anything else
        (an error, a lost lease, the handler's own ack, a crash loop) goes
        to the general path, which records it."""
        w = self.worker
        rec = w._recorder
        if job.lease.attempt > w.retry.max_attempts:
            await self.run_job(job, wid, acks=acks)  # a crash loop: buried unrun
            return
        job._task = asyncio.current_task()
        if rec.observers:
            rec.emit(Outcome.STARTED, job, None, 0)
        else:
            # Slot 0's counts: only this loop's thread writes them (the pool's records take the lock).
            rec.slot_counts[0][STARTED] += 1
        try:
            await w._acall_handler(job)
        except BaseException as exc:
            await self.run_job(job.lease, wid, job, exc, acks)
            return
        if job.lost or job._acked:
            await self.run_job(job.lease, wid, job, None, acks)
            return
        job._task = None  # this task moves on: a lost lease must not cancel it any more
        acks.add(job)

    def _start(self, loop: asyncio.AbstractEventLoop, leases: List[Any]) -> None:
        """Claimed leases: into ``ready``, held by the heartbeat while they
        wait; a task for each while a slot is free (a task ends only when
        ``ready`` is empty, so the running ones are busy)."""
        w = self.worker
        held = w.heartbeat.held
        tasks = self._tasks
        ready = self.ready
        for lease in leases:
            job = Job(w, lease)
            held.add(job)  # extended while it waits for a task
            ready.append(job)
        for _ in range(min(w.concurrency - len(tasks), len(leases))):
            task = loop.create_task(self.batch_task())
            tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: "asyncio.Task[Any]") -> None:
        self._tasks.discard(task)  # batch_task left already, unless cancelled before it began
        self._freed()
        if not task.cancelled() and task.exception() is not None:
            self.worker.logger.error("job task failed: %r", task.exception())

    def _give_back(self, leases: List[Any]) -> None:
        """Hand back claimed leases that never ran (uncounted; on the pool)."""
        rec = self.worker._recorder
        for lease in leases:
            rec.handback(lease)

    async def _hand_back_ready(self) -> None:
        """At a stop: hand back every claimed job still waiting for a task."""
        w = self.worker
        held = w.heartbeat.held
        leases = []
        while self.ready:
            job = self.ready.popleft()
            held.discard(job)
            if not job.lost:
                job._finished = True  # the heartbeat leaves it alone now
                leases.append(job.lease)
        if leases:
            await w._acall(self._give_back, leases)

    async def _claim_many(self, loop: asyncio.AbstractEventLoop, size: int) -> Optional[List[Any]]:
        """One ``claim_many`` on the I/O pool: the leases, or None to claim
        again (a poison message buried; a failure, after a pause of 1 s; the
        transport closed: then the worker stops).  Cancelled (``arun()``'s
        task was), it lets the claim finish and hands back what it got."""
        w = self.worker
        t = w.transport
        fut = loop.run_in_executor(w._io, functools.partial(t.claim_many, w.worker_id, w.visibility, size,
                                                            w.min_priority))
        try:
            leases: List[Any] = await asyncio.shield(fut)
            return leases
        except asyncio.CancelledError:
            try:
                got = await fut
            except Exception:
                got = []
            if got:
                await w._acall(self._give_back, got)
            raise
        except EventDecodeError as exc:
            await w._acall(w._recorder.undecodable, exc)
            return None
        except Exception as exc:
            if getattr(t, "closed", False):
                w.logger.info("the transport was closed: stopping")
                w.stop()
                return None
            w.logger.error("claim failed (%s); trying again in 1s", error_name(exc))
            await asyncio.sleep(1.0)
            return None

    async def _batched(self, loop: asyncio.AbstractEventLoop, claim_task: List[Optional["asyncio.Task[Any]"]],
                       rewait: float) -> None:
        """The claimer of the batched path, until the worker stops: claim for
        the free task slots and the prefetch with one ``claim_many``; when it
        finds nothing, one waiting claim."""
        w = self.worker
        wakeup = self._wakeup
        assert wakeup is not None
        while not w._stopping:
            extra = self.prefetch()
            # Claim when a slot is free, or once half the prefetch is used.
            self.low = 1 - (extra + 1) // 2
            idle = self.idle()
            if idle < self.low:
                wakeup.clear()
                await wakeup.wait()
                continue
            leases = await self._claim_many(loop, min(idle + extra, w.batch))
            if leases is None:
                continue
            if leases:
                if w._stopping:
                    await w._acall(self._give_back, leases)
                    break
                self._start(loop, leases)
                continue
            if self.idle() <= 0:  # anew: a task may have ended during the claim
                # Nothing to prefetch and no free slot: wait for a slot, not for a message.
                self.low = 1
                wakeup.clear()
                await wakeup.wait()
                continue
            # Nothing to claim: wait for a message.
            lease = await _steps.wait_claim(w, loop, claim_task, rewait)
            if lease is _steps.STOP:
                break
            if lease is None:
                continue
            if w._stopping:
                await w._acall(w._recorder.handback, lease)
                break
            self._start(loop, [lease])

    # ------------------------------------------------------------ the run

    async def run(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        w = self.worker
        loop = asyncio.get_running_loop()
        t = w.transport
        rec = w._recorder
        n = w.concurrency
        w._io = None if w._inline else ThreadPoolExecutor(min(n, 4) + 1, thread_name_prefix=f"{w.name}-io")
        tasks = self._tasks
        wakeup = self._wakeup = asyncio.Event()
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
        flusher: Optional["asyncio.Task[Any]"] = None
        if batches_acks(w):
            self.acks = AsyncAckBuffer(w)
            flusher = loop.create_task(self.acks.run_task())
        installed = install_signals(w, loop)
        hb = loop.create_task(w.heartbeat.run_task(w._acall))
        w.logger.info("worker %s started: %d tasks, visibility %gs, %r", w.worker_id, n, w.visibility, w.retry)
        try:
            vis, floor, wid = w.visibility, w.min_priority, w.worker_id
            # The claim waits for a wake-up; the deadline only bounds what a
            # missed one could cost (one idle wake-up per visibility / 3).
            rewait = max(w.heartbeat.interval, 0.5)
            if self.acks is not None:
                await self._batched(loop, claim_task, rewait)
            while self.acks is None and not w._stopping:
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
            if self.ready:
                await self._hand_back_ready()  # claimed, never started: back at once
            if tasks:
                await self._drain(tasks, wakeup)
            if self.ready:
                await self._hand_back_ready()  # a task put back the job it took as the stop came
            if flusher is not None:
                assert self.acks is not None
                self.acks.close()  # a drained job's ack is sent before arun() returns
                if w._forced:
                    flusher.cancel()  # the buffered acks' leases expire
                await asyncio.wait([flusher])
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

