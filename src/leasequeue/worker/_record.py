"""Carrying a :class:`Decision` out: the transport call (ack, nack, bury,
skip, release), the outcome it reaches, the counts, the middleware that
observe it, and what happens when the transport refuses (``LeaseLost``: the
job is lost; another failure: logged, its lease will expire).

Sync code: it runs on a slot thread, on the event loop (in memory), or on
the asyncio runner's I/O pool (durable transports).
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from .._errors import LeaseLost
from .._serializers import EventDecodeError
from ._checks import error_name
from ._job import ACKED, Job
from ._middleware import Middleware, overrides
from ._retry import HANDBACK, Action, CrashLoop, Decision, Outcome, bounded, reason

if TYPE_CHECKING:
    from ._worker import Worker

__all__ = ["INDEX", "Recorder"]

#: An outcome's place in a counts list (``Recorder.slot_counts[i][INDEX[o]]``).
INDEX = {o: i for i, o in enumerate(Outcome)}
STARTED, SUCCEEDED = INDEX[Outcome.STARTED], INDEX[Outcome.SUCCEEDED]


class Recorder:
    """One per worker.  ``slot_counts[i]`` is written by thread slot ``i``
    only (no lock); every other writer takes the lock."""

    def __init__(self, worker: "Worker", slots: int) -> None:
        self.worker = worker
        self.transport = worker.transport
        self.logger = worker.logger
        self._lock = threading.Lock()
        self.shared = [0] * len(INDEX)
        self.slot_counts: List[List[int]] = [[0] * len(INDEX) for _ in range(slots)]
        self.observers: List[Middleware] = []
        # Part 5: hand-backs and RetryLater do not count (a user's older backend: nack, see give_back).
        release = getattr(self.transport, "release", None)
        self.release: Optional[Callable[..., None]] = release if callable(release) else None

    def observe(self, middleware: Sequence[Middleware]) -> None:
        """The middleware that see outcomes (those that override ``on_outcome``)."""
        self.observers = [m for m in middleware if overrides(m, "on_outcome")]

    def counts(self) -> Dict[str, int]:
        totals = list(self.shared)
        for counts in self.slot_counts:
            for i, n in enumerate(counts):
                totals[i] += n
        return {o.value: n for o, n in zip(INDEX, totals)}

    # ------------------------------------------------------------ outcomes

    def emit(self, outcome: Outcome, job: Job, error: Optional[BaseException], slot: int = -1) -> None:
        if slot >= 0:
            self.slot_counts[slot][INDEX[outcome]] += 1  # only that slot's thread writes it
        else:
            with self._lock:
                self.shared[INDEX[outcome]] += 1
        for m in self.observers:
            try:
                m.on_outcome(job, outcome, error)
            except Exception:
                self.logger.exception("middleware %r raised in on_outcome(%s) (ignored)", m, outcome.value)

    def succeeded(self, jobs: Sequence[Job]) -> None:
        """``jobs`` were acked together (the thread runner's ack buffer)."""
        if not self.observers:
            with self._lock:
                self.shared[SUCCEEDED] += len(jobs)
            return
        for job in jobs:
            self.emit(Outcome.SUCCEEDED, job, None)

    def apply(self, job: Job, decision: Decision, error: Optional[BaseException], slot: int = -1) -> None:
        """Record ``decision`` with the transport."""
        action = decision.action
        acked = job._acked
        if acked:
            if action is Action.ACK:  # the handler acked: leave that ack alone
                self.emit(Outcome.SUCCEEDED, job, None, slot)
                return
            if acked == ACKED:
                self.acked_then_failed(job, error, slot)
                return
        t = self.transport
        lease = job.lease
        log = self.logger
        try:
            if action is Action.ACK:
                t.ack(lease)
                self.emit(Outcome.SUCCEEDED, job, None, slot)
            elif action is Action.RETRY:
                t.nack(lease, decision.delay)
                log.info("job %r seq %d attempt %d failed (%s): retry in %.3gs", job.group_id, job.seq,
                         job.attempt, error_name(error) if error else "", decision.delay)
                self.emit(Outcome.RETRIED, job, error, slot)
            elif action is Action.BURY:
                t.bury(lease, decision.reason)
                log.warning("group %r buried at seq %d: %s", job.group_id, job.seq, decision.reason,
                            exc_info=error if not isinstance(error, (CrashLoop, EventDecodeError)) else None)
                self.emit(Outcome.BURIED, job, error, slot)
            elif action is Action.SKIP:
                dead_letter = self.worker.retry.dead_letter
                if dead_letter is not None and error is not None:
                    try:
                        dead_letter(job, error)
                    except Exception as exc:
                        text = bounded(reason(self.worker.retry, job, error)
                                       + f"; dead_letter raised {error_name(exc)}")
                        log.exception("dead_letter raised: burying group %r", job.group_id)
                        t.bury(lease, text)
                        self.emit(Outcome.BURIED, job, error, slot)
                        return
                t.ack(lease)
                log.warning("job %r seq %d skipped after attempt %d (%s)", job.group_id, job.seq, job.attempt,
                            error_name(error) if error else "")
                self.emit(Outcome.SKIPPED, job, error, slot)
            elif action is Action.DEFER:
                t.release(lease, decision.delay)
                log.info("job %r seq %d attempt %d asked to run again in %.3gs (%s)", job.group_id, job.seq,
                         job.attempt, decision.delay, error)
                self.emit(Outcome.RETRIED, job, error, slot)
            elif action is Action.HANDBACK:
                self.give_back(lease, decision.delay)
                self.emit(Outcome.HANDED_BACK, job, None, slot)
            else:  # Action.RETURN
                t.nack(lease, 0.0)
                self.emit(Outcome.HANDED_BACK, job, None, slot)
        except Exception as exc:
            if acked and isinstance(exc, LeaseLost):
                self.acked_then_failed(job, error, slot)  # the handler's transaction committed its ack
            else:
                self.failed(job, exc)

    def acked_then_failed(self, job: Job, error: Optional[BaseException], slot: int) -> None:
        """The handler acked its delivery (``job.ack``), then raised: the ack
        stands, so the job succeeded; the error is logged and given to the
        ``succeeded`` observers."""
        self.logger.error("job %r seq %d attempt %d raised after its handler acked it (%s): the ack stands",
                          job.group_id, job.seq, job.attempt, error_name(error) if error else "handed back",
                          exc_info=error if isinstance(error, Exception) else None)
        self.emit(Outcome.SUCCEEDED, job, error, slot)

    def handback(self, lease: Any, slot: int = -1) -> None:
        """Hand back a delivery that was claimed and never started."""
        job = Job(self.worker, lease)
        job._finished = True
        self.apply(job, HANDBACK, None, slot)

    def undecodable(self, exc: EventDecodeError, slot: int = -1) -> None:
        """A claim raised ``EventDecodeError``: a poison message like any
        other (docs/contract.md, Part 5, "Operating it").  Its group is buried
        with the decode error as the reason (counted and observed as
        ``buried``; never run, never claimed again in a loop).  The other
        leases of a ``claim_many`` batch are handed back uncounted
        (``release``): the next claim serves them (any other undecodable one
        is buried then)."""
        bad = exc.lease
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        job = Job(self.worker, bad)
        job._finished = True
        text = bounded(f"undecodable event: {error_name(cause)} (attempt {bad.attempt})")
        self.apply(job, Decision(Action.BURY, reason=text), exc, slot)
        for lease in exc.leases:
            if lease is not bad:
                self.handback(lease, slot)

    def give_back(self, lease: Any, delay: float) -> None:
        """Hand a delivery back uncounted (``release``), or with ``nack`` on a
        transport without ``release`` (then it counts as an attempt)."""
        release = self.release
        if release is not None:
            release(lease, delay)
        else:
            self.transport.nack(lease, delay)

    def failed(self, job: Job, exc: Exception) -> None:
        """Recording an outcome raised: the lease was lost, or the transport
        failed (closed, database down) and the lease will expire."""
        if not isinstance(exc, LeaseLost):
            self.logger.error("job %r seq %d: recording the outcome failed (%s); its lease will expire",
                              job.group_id, job.seq, error_name(exc))
        self.lost(job, exc)

    def lost(self, job: Job, error: BaseException) -> None:
        if job.lost:
            return
        job.lost = True
        self.logger.warning("job %r seq %d lost its lease (%s): neither acked nor nacked", job.group_id,
                            job.seq, error_name(error))
        task = job._task
        loop = self.worker._loop
        if task is not None and not job._finished and loop is not None:
            def cancel() -> None:
                # Still in that job's handler (or its deferral): not finished, and
                # the task still runs it (a job whose ack waits in the asyncio
                # runner's buffer is unfinished, and its task runs another job).
                if not job._finished and job._task is task:
                    task.cancel()

            if _on(loop):
                cancel()
            else:
                loop.call_soon_threadsafe(cancel)
        self.emit(Outcome.LOST, job, error)


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
