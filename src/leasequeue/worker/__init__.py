"""The worker runtime: :class:`Worker`, :class:`Retry`, the :class:`Job` a
handler gets, :class:`Task` (a handler with its options) and
:class:`Middleware` (the seam around every job).

What every user otherwise writes around a transport (docs/contract.md,
Part 4, "The worker"): a claim loop that waits instead of polling, one
heartbeat for all the leases a worker holds, a retry policy that keeps a
group's order, crash-loop detection, graceful shutdown, outcome hooks,
logging and optional Prometheus metrics.  The worker is typed against
:class:`leasequeue.Transport`, so it works over every backend.

One idea per module:

- ``_job.py``: :class:`Job`, one delivery;
- ``_retry.py``: :class:`Retry`, :class:`RetryLater`, :class:`CrashLoop`,
  and :func:`decide`, the pure function from a finished run to a
  :class:`Decision` (an :class:`Action` with its delay or reason);
- ``_record.py``: carrying a decision out with the transport (and the
  outcome, :class:`Outcome`, and the counts);
- ``_middleware.py``: :class:`Middleware`; the hooks are one;
  ``_metrics.py``: the Prometheus metrics are another;
- ``_heartbeat.py``, ``_lifecycle.py`` (signals), ``_steps.py`` (the job
  flow both runners drive), ``runners/`` (threads, asyncio);
- ``_task.py``: :class:`Task` / :func:`task`; ``_worker.py``: the facade.
"""

from __future__ import annotations

from ._job import Job
from ._middleware import OUTCOMES, Middleware
from ._retry import Action, CrashLoop, Decision, Outcome, Retry, RetryLater, decide
from ._task import Task, task
from ._worker import Worker

__all__ = [
    "OUTCOMES",
    "Action",
    "CrashLoop",
    "Decision",
    "Job",
    "Middleware",
    "Outcome",
    "Retry",
    "RetryLater",
    "Task",
    "Worker",
    "decide",
    "task",
]
