"""``run()`` with a plain function: ``concurrency`` slot threads.

A slot that finishes a job claims the next one itself without waiting (no
hand-off while there is work): with ``ack_and_claim``, the ack and the next
claim are one call (one commit on PostgreSQL).  A slot that finds nothing
goes idle.  While a slot is idle, one claimer waits in ``aclaim`` on a
private asyncio loop in the thread that called ``run()`` (a cancelled
``aclaim`` leaves nothing leased, so ``stop()`` takes effect at once) and
hands what it gets to idle slots.  One heartbeat thread extends every held
lease.

On a durable transport (``ack_many`` and ``claim_many``; :mod:`.acks`),
with several slots or with prefetching, a slot whose handler returned
leaves the ack in a buffer and goes idle instead: a flusher thread acks the
buffer with one ``ack_many`` while the loop claims for every idle slot, and
for the prefetch, with one ``claim_many`` (two overlapping commits for a
batch of jobs instead of one per job).

Prefetch (that path only): the loop may claim up to ``prefetch`` messages
more than its idle slots; they wait in the slots' inbox as jobs, held by
the heartbeat like running ones, and go back uncounted (``release``) at a
stop.  ``prefetch=None`` adapts it to the handlers: as many as the slots
finish in about ``PREFETCH_WINDOW`` seconds at their average run time (up
to ``batch``), none until a first job ran, so that a prefetched message
waits in a worker about that long, not behind a slow job (the rule is
:mod:`.prefetch`'s, shared with the asyncio runner).  The loop claims
again once half the prefetch is used (or a slot is idle): batches, not one
claim per finished job.  A redelivered job (attempt > 1) runs alone
(``isolate``): what waits is handed back and the buffered acks are sent
first, so a job that kills the process charges no neighbour an attempt.
"""

from __future__ import annotations

import asyncio
import math
import queue as _queue
import threading
import time
from typing import TYPE_CHECKING, Any, List, Optional

from ..._errors import LeaseLost
from ..._serializers import EventDecodeError
from .. import _steps
from .._checks import error_name
from .._job import REFCOUNT, Job
from .._lifecycle import install_signals, remove_signals
from .._record import STARTED, SUCCEEDED
from .._retry import ACK, RETURN, Action, Decision, Outcome
from . import fastpath
from .acks import AckBuffer, batches_acks
from .prefetch import PREFETCH_WINDOW, averaged, prefetch_now

if TYPE_CHECKING:
    from .._worker import Worker

__all__ = ["PREFETCH_WINDOW", "ThreadRunner"]

_NONE = _steps.STOP  # "no next lease yet" (the ack did not claim one)


class _SlotState:
    """Idle and live slot counts (slots increment ``idle``, only the claimer
    decrements it, once per lease it hands over: with prefetched leases
    waiting in the inbox ``idle`` goes below zero).  The claimer sleeps
    while ``idle < low`` and the slot that brings ``idle`` up to ``low``
    wakes it (``low`` is 1 without prefetch: an idle slot)."""

    __slots__ = ("idle", "alive", "low", "_lock", "_loop", "_wakeup")

    def __init__(self, n: int, loop: asyncio.AbstractEventLoop, wakeup: asyncio.Event) -> None:
        self.idle = n
        self.alive = n
        self.low = 1
        self._lock = threading.Lock()
        self._loop = loop
        self._wakeup = wakeup

    def set_low(self, low: int) -> None:
        """The claimer only (while awake): wake it when ``idle`` reaches ``low``."""
        with self._lock:
            self.low = low

    def _notify(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._wakeup.set)
        except RuntimeError:
            pass  # the loop has closed (a forced stop)

    def idle_one(self) -> None:
        with self._lock:
            self.idle += 1
            first = self.idle == self.low
        if first:
            self._notify()

    def take(self) -> None:
        with self._lock:
            self.idle -= 1

    def exited(self) -> None:
        with self._lock:
            self.alive -= 1
        self._notify()


class ThreadRunner:
    """Runs a worker's plain-function handler on threads (``Worker.run``)."""

    def __init__(self, worker: "Worker") -> None:
        self.worker = worker
        #: The ack buffer when acks are batched (set by ``run``), else None.
        self.acks: Optional[AckBuffer] = None
        #: The handlers' moving average run time on the batched path
        #: (seconds; None until a first job ran): ``prefetch=None`` follows it.
        self.average: Optional[float] = None
        #: Redelivered jobs running now (``isolate``): no prefetch meanwhile.
        self._isolating = 0
        self._isolation = threading.Lock()

    def note_run_time(self, took: float) -> None:
        """Fold one job's run time (seconds) into the handlers' moving average."""
        self.average = averaged(self.average, took)

    def isolate(self, index: int, inbox: "_queue.SimpleQueue[Any]", state: _SlotState) -> None:
        """Before a slot runs a redelivered job (attempt > 1: a retry, or a
        delivery whose worker died): stop prefetching until it ends, hand
        back uncounted (``release``) the jobs waiting in the inbox, and wait
        until the finished jobs' acks are sent.  If that job kills the
        process, the messages this worker held take no attempt with it
        (the crash-loop rule buries the job that crashes, not its
        neighbours) and no finished job runs again; only the jobs running
        on other slots at that moment share its fate, as without prefetch."""
        w = self.worker
        with self._isolation:
            self._isolating += 1
        while True:
            try:
                item = inbox.get_nowait()
            except _queue.Empty:
                break
            if item is None:  # a stop's sentinel (nothing follows it): leave it for a slot
                inbox.put(None)
                break
            self.give_back(item, index)
            if not w._stopping:
                state.idle_one()
        assert self.acks is not None
        self.acks.sync()

    def give_back(self, job: Job, index: int = -1) -> None:
        """A batched-path job that never started (a stop, an isolation, the
        drain's leftovers): out of the heartbeat's hands, and handed back
        uncounted unless its lease was found lost while it waited."""
        w = self.worker
        w.heartbeat.held.discard(job)
        if not job.lost:
            job._finished = True  # the heartbeat leaves it alone now
            w._recorder.handback(job.lease, index)

    def prefetch(self) -> int:
        """How many leases the batched loop may hold beyond its idle slots now."""
        if self._isolating:
            return 0
        return prefetch_now(self.worker, self.average)  # the rule both runners share

    # ------------------------------------------------------------ one job

    def run_job(self, job: Job, error: Any = None, slot: int = -1) -> None:
        """Run one delivery on this thread and record its outcome (the general
        path: middleware, failures, deferrals, crash loops).  ``error``: the
        first run already raised it (the fast path ran it)."""
        w = self.worker
        rec = w._recorder
        if error is None:
            crashed = _steps.begin(w, job)
            if crashed is not None:
                rec.apply(job, crashed[0], crashed[1], slot)
                return
            run = True
        else:
            run = False
        call = w._call
        while True:
            if run:
                rec.emit(Outcome.STARTED, job, None, slot)
                error = None
                try:
                    call(job)
                except BaseException as exc:
                    error = exc
            run = True
            if error is not None and not isinstance(error, Exception):
                # SystemExit / KeyboardInterrupt in a handler: hand the job back, stop the worker.
                w.logger.error("handler raised %s: handing the job back and stopping", error_name(error))
                job._finished = True
                if not job.lost:
                    rec.apply(job, RETURN, None, slot)
                w.stop()
                return
            decision = _steps.after(w, job, error)
            if decision is None:  # lost
                job._finished = True
                return
            if _steps.waits_in_place(w, job, decision):
                # A transport without release: keep the lease and wait on this slot (Part 4).
                rec.emit(Outcome.RETRIED, job, error, slot)
                due = time.monotonic() + decision.delay
                if w._stop_event.wait(decision.delay):
                    # Shutting down during the wait: hand it back, parked for
                    # what is left of the delay.
                    job._finished = True
                    if not job.lost:
                        rec.apply(job, Decision(Action.HANDBACK, delay=max(due - time.monotonic(), 0.0)), None,
                                  slot)
                    return
                if job.lost:
                    job._finished = True
                    return
                continue
            job._finished = True
            if not job.lost:
                rec.apply(job, decision, error, slot)
            return

    # ------------------------------------------------------------ a slot

    def slot(self, index: int, inbox: "_queue.SimpleQueue[Any]", state: _SlotState) -> None:
        w = self.worker
        t = w.transport
        rec = w._recorder
        wid = f"{w.worker_id}/{index}"
        claim = t.claim
        # A transport written before ack_and_claim (0.5) is served by ack + claim (the general path).
        ack_and_claim = w._ack_and_claim
        current = w.heartbeat.current
        # The fast path: no middleware wraps the handler (observers are told).
        plain = not w._wrapping
        acks = self.acks
        held = w.heartbeat.held
        perf = time.perf_counter
        compiled = fastpath.COMPILED  # the fast path in C, or None: fast() below
        try:
            while True:
                lease = inbox.get()
                if lease is None:
                    break
                if acks is not None:
                    # Batched acks: the inbox holds jobs (held by the heartbeat
                    # while they wait).  Run it, leave the ack in the buffer,
                    # go idle (the loop acks and claims for every idle slot at once).
                    job = lease
                    current[index] = job  # before it leaves ``held``: never unheld
                    held.discard(job)
                    if w._stopping or job.lost:
                        current[index] = None
                        self.give_back(job, index)
                        if not w._stopping:
                            state.idle_one()
                        continue
                    redelivered = job.lease.attempt > 1
                    if redelivered:
                        self.isolate(index, inbox, state)
                    began = perf()
                    try:
                        if plain:
                            self.deferred(job, index, acks)
                        else:
                            self.one(job, index)
                    finally:
                        if redelivered:
                            with self._isolation:
                                self._isolating -= 1
                    self.note_run_time(perf() - began)
                    if not w._stopping:
                        state.idle_one()
                    continue
                if w._stopping:
                    rec.handback(lease, index)
                    continue
                while lease is not None:
                    if plain and ack_and_claim is not None:
                        if compiled is not None:
                            following = compiled(self, lease, index)
                        else:
                            following = self.fast(lease, index)
                    else:
                        following = self.one(lease, index)
                    if w._stopping:
                        if following is not _NONE and following is not None:
                            rec.handback(following, index)  # claimed as the stop came
                        break
                    if following is not _NONE:
                        lease = following
                        continue
                    lease = _steps.claim_now(w, claim, wid, index)
                if w._stopping:
                    # Drain what the claimer handed over meanwhile.
                    continue
                state.idle_one()
        except BaseException:  # pragma: no cover - a bug in the worker itself
            w.logger.exception("worker slot %d crashed", index)
            raise
        finally:
            current[index] = None
            state.exited()

    def fast(self, lease: Any, index: int) -> Any:
        """The fast path (no middleware wraps the handler; the transport has
        ``ack_and_claim``): run, then ack and claim the next in one call, and
        run that, on this slot, while every handler returns and the worker
        runs.  Anything else goes to the general path.  Returns the next
        lease when the last ack claimed it, else ``_NONE``.

        The pure-Python loop: where ``_fastpath`` was built, the slots run
        its compiled twin instead (:mod:`.fastpath`), which must stay the
        same loop."""
        w = self.worker
        rec = w._recorder
        handler = w._call
        ack_and_claim = w._ack_and_claim
        assert ack_and_claim is not None
        wid = f"{w.worker_id}/{index}"
        vis, floor = w.visibility, w.min_priority
        max_attempts = w.retry.max_attempts
        current = w.heartbeat.current
        mine = rec.slot_counts[index]
        started_i, succeeded_i = STARTED, SUCCEEDED
        # Read once per run of the fast path (a hook added meanwhile counts from the next one).
        observed = rec.observers
        refcount = REFCOUNT
        job: Optional[Job] = None
        try:
            while lease.attempt <= max_attempts:
                if job is None or refcount is None or refcount(job) != 3:
                    job = Job(w, lease)
                    current[index] = job
                else:
                    # Nobody kept the last Job (its only references: this frame, the
                    # heartbeat's slot, the call's argument): reuse it for this delivery.
                    job.lease = lease
                    job._finished = False
                if observed:
                    rec.emit(Outcome.STARTED, job, None, index)
                else:
                    mine[started_i] += 1
                try:
                    handler(job)
                except BaseException as exc:
                    self.run_job(job, exc, index)
                    return _NONE
                job._finished = True
                if job.lost:
                    return _NONE
                if job._acked or w._stopping:
                    rec.apply(job, ACK, None, index)  # the handler's own ack, or ack alone at a stop
                    return _NONE
                try:
                    # One call (one commit on PostgreSQL): the ack and the next claim.
                    following = ack_and_claim(job.lease, wid, vis, floor)
                except LeaseLost as exc:
                    rec.failed(job, exc)  # nothing acked, nothing claimed
                    return _NONE
                except EventDecodeError as exc:
                    # The ack stood; the claim's message does not decode: bury its group.
                    rec.emit(Outcome.SUCCEEDED, job, None, index)
                    rec.undecodable(exc, index)
                    return _NONE
                except Exception as exc:
                    rec.failed(job, exc)
                    return _NONE
                if observed:
                    rec.emit(Outcome.SUCCEEDED, job, None, index)
                else:
                    mine[succeeded_i] += 1
                if following is None or w._stopping:
                    return following
                lease = following
        finally:
            current[index] = None
        return self.one(lease, index)

    def deferred(self, job: Job, index: int, acks: AckBuffer) -> None:
        """The batched path (no middleware wraps the handler): run one
        delivery; when the handler returns, its ack goes to ``acks`` (the
        job stays unfinished, its lease extended, until the ack is sent).
        Anything else goes to the general path, which records it itself."""
        w = self.worker
        rec = w._recorder
        if job.lease.attempt > w.retry.max_attempts:
            self.one(job, index)  # a crash loop: buried unrun
            return
        current = w.heartbeat.current
        current[index] = job
        try:
            if rec.observers:
                rec.emit(Outcome.STARTED, job, None, index)
            else:
                rec.slot_counts[index][STARTED] += 1
            try:
                w._call(job)
            except BaseException as exc:
                self.run_job(job, exc, index)
                return
            if job.lost:
                job._finished = True
                return
            if job._acked or w._stopping:
                job._finished = True
                rec.apply(job, ACK, None, index)  # the handler's own ack, or ack alone at a stop
                return
            acks.add(job)  # before it leaves ``current``: never unheld
        finally:
            current[index] = None

    def one(self, lease: Any, index: int) -> Any:
        """One delivery by the general path (middleware, crash loops, a
        transport without ``ack_and_claim``; ``lease`` may be the batched
        path's job); the result as ``fast``'s."""
        job = lease if isinstance(lease, Job) else Job(self.worker, lease)
        current = self.worker.heartbeat.current
        current[index] = job
        try:
            self.run_job(job, None, index)
        finally:
            current[index] = None
        return _NONE

    # ------------------------------------------------------------ the run

    async def run(self) -> None:
        w = self.worker
        loop = asyncio.get_running_loop()
        t = w.transport
        rec = w._recorder
        n = w.concurrency
        inbox: "_queue.SimpleQueue[Any]" = _queue.SimpleQueue()
        wakeup = asyncio.Event()
        state = _SlotState(n, loop, wakeup)
        claim_task: List[Optional["asyncio.Task[Any]"]] = [None]

        def wake() -> None:
            wakeup.set()
            task = claim_task[0]
            if task is not None and w._stopping:
                task.cancel()

        w._loop, w._wake = loop, wake
        flusher: Optional[threading.Thread] = None
        if batches_acks(w):
            self.acks = AckBuffer(w)
            flusher = threading.Thread(target=self.acks.run_thread, name=f"{w.name}-acks", daemon=True)
        installed = install_signals(w, loop)
        hb_done = threading.Event()
        hb = threading.Thread(target=w.heartbeat.run_thread, args=(hb_done,), name=f"{w.name}-heartbeat",
                              daemon=True)
        slots = [threading.Thread(target=self.slot, args=(i, inbox, state), name=f"{w.name}-{i}", daemon=True)
                 for i in range(n)]
        w.logger.info("worker %s started: %d threads, visibility %gs, %r", w.worker_id, n, w.visibility, w.retry)
        hb.start()
        if flusher is not None:
            flusher.start()
        for th in slots:
            th.start()
        try:
            vis, floor, wid = w.visibility, w.min_priority, w.worker_id
            # The claim waits for a wake-up; the deadline only bounds what a
            # missed one could cost (one idle wake-up per visibility / 3).
            rewait = max(w.heartbeat.interval, 0.5)
            if self.acks is not None:
                await self._batched(loop, state, inbox, wakeup, claim_task, rewait)
            while self.acks is None and not w._stopping:
                if state.idle == 0:
                    wakeup.clear()
                    if state.idle == 0 and not w._stopping:
                        await wakeup.wait()
                    continue
                lease = await _steps.wait_claim(w, loop, claim_task, rewait)
                if lease is _steps.STOP:
                    break
                if lease is None:
                    continue
                if w._stopping:
                    rec.handback(lease)
                    break
                state.take()
                inbox.put(lease)
                extra = min(state.idle, w.batch - 1)
                if extra > 0:
                    try:
                        more = t.claim_many(wid, vis, extra, floor)
                    except EventDecodeError as exc:
                        more = []
                        await w._acall(rec.undecodable, exc)
                    except Exception:
                        more = []
                    for lease in more:
                        state.take()
                        inbox.put(lease)
            # Draining: wake the idle slots, wait for the busy ones.
            for _ in range(n):
                inbox.put(None)
            await self._drain(loop, state, wakeup)
            if self.acks is not None and flusher is not None:
                self.acks.close()  # a drained job's ack is sent before run() returns
                if not w._forced:
                    await loop.run_in_executor(None, flusher.join)
            if not w._forced:
                while True:
                    try:
                        lease = inbox.get_nowait()
                    except _queue.Empty:
                        break
                    if isinstance(lease, Job):  # the batched path's
                        self.give_back(lease)
                    elif lease is not None:
                        rec.handback(lease)
        finally:
            hb_done.set()
            remove_signals(loop, installed)
            w._loop = w._wake = None

    async def _batched(self, loop: asyncio.AbstractEventLoop, state: _SlotState, inbox: "_queue.SimpleQueue[Any]",
                       wakeup: asyncio.Event, claim_task: List[Optional["asyncio.Task[Any]"]], rewait: float) -> None:
        """The claim loop with batched acks (the flusher sends them), until
        the worker stops: claim for the idle slots with one ``claim_many``;
        when it finds nothing, one waiting claim."""
        w = self.worker
        t = w.transport
        rec = w._recorder
        vis, floor, wid = w.visibility, w.min_priority, w.worker_id
        claim_many = t.claim_many
        held = w.heartbeat.held

        def hand(lease: Any) -> None:
            job = Job(w, lease)
            held.add(job)  # extended while it waits for a slot
            state.take()
            inbox.put(job)

        while not w._stopping:
            extra = self.prefetch()
            # Claim when a slot is idle, or once half the prefetch is used.
            low = 1 - (extra + 1) // 2
            if low != state.low:
                state.set_low(low)
            if state.idle < low:
                wakeup.clear()
                if state.idle < low and not w._stopping:
                    await wakeup.wait()
                continue
            try:
                leases = claim_many(wid, vis, min(state.idle + extra, w.batch), floor)
            except EventDecodeError as exc:
                rec.undecodable(exc)
                continue
            except Exception as exc:
                if getattr(t, "closed", False):
                    w.logger.info("the transport was closed: stopping")
                    w.stop()
                    break
                w.logger.error("claim failed (%s); trying again in 1s", error_name(exc))
                await asyncio.sleep(1.0)
                continue
            if leases:
                if w._stopping:
                    for lease in leases:
                        rec.handback(lease)
                    break
                for lease in leases:
                    hand(lease)
                continue
            if state.idle <= 0:
                # Nothing to prefetch and no idle slot: wait for a slot, not for a message.
                wakeup.clear()
                if state.idle <= 0 and not w._stopping:
                    state.set_low(1)
                    if state.idle <= 0:
                        await wakeup.wait()
                continue
            # Nothing to claim: wait for a message.
            lease = await _steps.wait_claim(w, loop, claim_task, rewait)
            if lease is _steps.STOP:
                break
            if lease is None:
                continue
            if w._stopping:
                rec.handback(lease)
                break
            hand(lease)

    async def _drain(self, loop: asyncio.AbstractEventLoop, state: _SlotState, wakeup: asyncio.Event) -> None:
        """Wait for the busy slots, ``drain_timeout`` then on (a thread cannot be killed)."""
        w = self.worker
        deadline = loop.time() + w.drain_timeout
        warned = False
        while state.alive and not w._forced:
            remaining = deadline - loop.time()
            wakeup.clear()
            if not state.alive or w._forced:
                break
            if remaining <= 0:
                if not warned:
                    w.logger.warning(
                        "drain_timeout passed with %d handler(s) still running: waiting for them (a thread "
                        "cannot be killed; a second signal exits and leaves their leases to expire)",
                        state.alive)
                    warned = True
                await wakeup.wait()
            elif remaining == math.inf:
                await wakeup.wait()
            else:
                try:
                    await asyncio.wait_for(wakeup.wait(), remaining)
                except asyncio.TimeoutError:
                    pass
