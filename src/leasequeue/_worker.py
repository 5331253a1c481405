"""The worker's old home: it is the package :mod:`leasequeue.worker` now.

Kept so that ``from leasequeue._worker import Worker, Retry`` (as the
command line did) goes on working.
"""

from __future__ import annotations

from .worker import OUTCOMES, CrashLoop, Job, Middleware, Retry, RetryLater, Task, Worker, task

__all__ = ["OUTCOMES", "CrashLoop", "Job", "Middleware", "Retry", "RetryLater", "Task", "Worker", "task"]
