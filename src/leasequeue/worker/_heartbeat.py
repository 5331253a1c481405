"""One heartbeat per worker: while handlers run, their leases are extended
about every ``visibility / 3`` from outside the handlers (a thread for
``run()``, a task for ``arun()``).  An ``extend`` that raises ``LeaseLost``
makes the job lost; another error is logged and tried again next beat."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, Awaitable, Callable, List, Optional, Set

from .._errors import LeaseLost
from ._checks import error_name
from ._job import Job

if TYPE_CHECKING:
    from ._worker import Worker

__all__ = ["Heartbeat"]


class Heartbeat:
    """The jobs a worker holds: ``held`` (the asyncio runner's jobs) and
    ``current`` (one place per thread slot, written by that slot only)."""

    def __init__(self, worker: "Worker", slots: int) -> None:
        self.worker = worker
        self.interval = worker.visibility / 3.0
        self.held: Set[Job] = set()
        self.current: List[Optional[Job]] = [None] * slots

    def in_flight(self) -> int:
        return len(self.held) + sum(j is not None for j in self.current)

    def beat(self) -> None:
        """One beat: extend every held lease (sync)."""
        worker = self.worker
        t, vis = worker.transport, worker.visibility
        for job in list(self.held) + [j for j in self.current if j is not None]:
            if job._finished or job.lost or job._acked:
                continue
            try:
                lease = t.extend(job.lease, vis)
            except LeaseLost as exc:
                if not job._finished and not job._acked:  # not acked by its handler meanwhile
                    worker._recorder.lost(job, exc)
            except Exception as exc:
                worker.logger.warning("heartbeat: extending job %r seq %d failed (%s); trying again next beat",
                                      job.group_id, job.seq, error_name(exc))
            else:
                if not job._finished:
                    job.lease = lease

    def run_thread(self, done: threading.Event) -> None:
        """The thread runner's heartbeat thread, until ``done`` is set."""
        while not done.wait(self.interval):
            try:
                self.beat()
            except Exception:  # pragma: no cover - beat catches the transport's errors
                self.worker.logger.exception("heartbeat failed")

    async def run_task(self, call: Callable[[Callable[[], None]], Awaitable[Any]]) -> None:
        """The asyncio runner's heartbeat task (cancelled at the end);
        ``call(fn)`` runs ``fn`` where transport calls may block."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await call(self.beat)
            except Exception:  # pragma: no cover - beat catches the transport's errors
                self.worker.logger.exception("heartbeat failed")
