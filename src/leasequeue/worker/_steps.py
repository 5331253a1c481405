"""The job flow both runners drive: claim -> (decode) -> run -> decide ->
record.  The runners differ only in how they wait and call (a thread that
blocks, a task that awaits); the steps between are here, written once.

- :func:`wait_claim`: the runner's waiting claim (``aclaim``), which a
  ``stop()`` cancels; an undecodable message is buried and it claims again.
- :func:`claim_now`: a slot's or a task's own claim without waiting.
- :func:`begin`: before a run: a crash loop is buried unrun.
- :func:`after`: after a run: the :class:`Decision` (``None``: the job was
  lost, nothing to record); :func:`waits_in_place`: a ``RetryLater`` on a
  transport without ``release`` keeps its lease and runs again in place.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

from .._serializers import EventDecodeError
from ._checks import error_name
from ._job import Job
from ._retry import Action, CrashLoop, Decision, crash_loop, crash_loop_decision, decide

if TYPE_CHECKING:
    from ._worker import Worker

__all__ = ["STOP", "after", "begin", "claim_now", "wait_claim", "waits_in_place"]

#: What a runner's waiting claim returns to leave its claim loop.
STOP = object()


async def wait_claim(worker: "Worker", loop: asyncio.AbstractEventLoop,
                     claim_task: List[Optional["asyncio.Task[Any]"]], rewait: float) -> Any:
    """One waiting claim of a runner's claim loop: the lease; ``None`` to
    claim again (nothing came; a poison message buried; a failed claim
    after a pause of 1 s; or the transport closed: then the worker stops);
    or ``STOP`` to leave the loop (cancelled by ``stop()``, or a failure once
    the transport is closed).  ``claim_task[0]`` is the claim while it
    waits, so that ``stop()`` can cancel it."""
    t = worker.transport
    task = loop.create_task(t.aclaim(worker.worker_id, worker.visibility, worker.min_priority, timeout=rewait))
    claim_task[0] = task
    try:
        lease = await task
    except asyncio.CancelledError:
        if worker.stopping:
            return STOP
        raise
    except EventDecodeError as exc:
        # A poison message: bury its group and claim again at once.
        claim_task[0] = None
        await worker._acall(worker._recorder.undecodable, exc)
        return None
    except Exception as exc:
        if getattr(t, "closed", False):
            return STOP
        worker.logger.error("claim failed (%s); trying again in 1s", error_name(exc))
        await asyncio.sleep(1.0)
        return None
    finally:
        claim_task[0] = None
    if lease is None and getattr(t, "closed", False):
        worker.logger.info("the transport was closed: stopping")
        worker.stop()
    return lease


def claim_now(worker: "Worker", claim: Callable[..., Any], wid: str, slot: int) -> Any:
    """A claim without waiting: the lease or ``None``.  A message whose event
    does not decode is buried and it claims again."""
    t = worker.transport
    while True:
        try:
            return claim(wid, worker.visibility, worker.min_priority)
        except EventDecodeError as exc:
            worker._recorder.undecodable(exc, slot)
            if worker.stopping:
                return None
        except Exception as exc:
            if not worker.stopping and not getattr(t, "closed", False):
                worker.logger.error("claim failed (%s)", error_name(exc))
            return None


def begin(worker: "Worker", job: Job) -> Optional[Tuple[Decision, CrashLoop]]:
    """Before a run: a message claimed beyond its budget is buried unrun
    (the decision and its ``CrashLoop``), else ``None``: run it."""
    error = crash_loop(worker.retry, job)
    if error is None:
        return None
    job._finished = True
    return crash_loop_decision(error), error


def after(worker: "Worker", job: Job, error: Optional[BaseException]) -> Optional[Decision]:
    """After a run that raised ``error`` (``None``: returned): the decision,
    or ``None`` when the job was lost meanwhile (nothing is recorded)."""
    if job.lost:
        return None
    return decide(worker.retry, job, error, worker.logger)


def waits_in_place(worker: "Worker", job: Job, decision: Decision) -> bool:
    """A ``RetryLater`` on a transport without ``release`` (a backend written
    before 0.6): the job keeps its lease and runs again after the delay."""
    return decision.action is Action.DEFER and worker._recorder.release is None and not job._acked
