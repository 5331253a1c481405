"""The batched path's ack buffer (a durable transport with ``ack_many``
and ``claim_many``, several slots or a prefetch; the asyncio runner's
``AsyncAckBuffer`` is this with a flusher task): a slot whose handler returned leaves
its job here and goes idle at once; a flusher thread acks everything left
here with one ``ack_many`` (one commit), while the runner's loop claims for
the idle slots with one ``claim_many``: the two commits overlap (the
server flushes its log once for both, group commit), where slots calling
``ack_and_claim`` each commit once per job.

How long an ack waits: the flusher acks the buffer as soon as a job is
left in it; jobs finishing during one flush go together into the next (the
busier the worker, the bigger the batches, no timer), so an ack waits at
most for the flush in progress (one round trip and its commit).

What a buffered job keeps: its lease, extended by the heartbeat like a
running job's (it is in ``Heartbeat.held``, unfinished until its ack is
sent); its group stays leased until then, so no claim takes its next
message early (group order, one job per group in flight).  An ack refused
(``LeaseLost``: the lease ran out, or the group was purged meanwhile)
makes the job ``lost``, as a single ack would; a failed ``ack_many`` (the
database is down) makes every job in it lost (their leases will expire).
At shutdown the runner stops the flusher after the last slot has finished;
the flusher's last flush is before ``run()`` returns.  ``sync()`` waits
until everything buffered so far is acked (a slot about to run a
redelivered job: see ``ThreadRunner.isolate``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, List, Optional

from ..._errors import LeaseLost
from .._job import Job

if TYPE_CHECKING:
    from .._worker import Worker

__all__ = ["AckBuffer", "batches_acks"]


def batches_acks(worker: "Worker") -> bool:
    """Whether the runners (threads and asyncio) batch for ``worker``: a blocking
    transport (the durable ones) with ``ack_many`` and ``claim_many``,
    ``batch`` above 1, and more than one slot or a prefetch that is not 0
    (``None``, adaptive, is not).  One slot with ``prefetch=0`` keeps
    ``ack_and_claim`` (one commit per job); the in-memory twins keep their
    path (no prefetch there)."""
    t = worker.transport
    return (not worker._inline and worker.batch > 1 and (worker.concurrency > 1 or worker.prefetch != 0)
            and callable(getattr(t, "ack_many", None)) and callable(getattr(t, "claim_many", None)))


class AckBuffer:
    """Jobs whose handler returned, waiting for their ack (slots add, the
    runner's loop takes)."""

    __slots__ = ("worker", "_jobs", "_lock", "_ready", "_idle", "_flushing", "_closing")

    def __init__(self, worker: "Worker") -> None:
        self.worker = worker
        self._jobs: List[Job] = []
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # the flusher waits for jobs
        self._idle = threading.Condition(self._lock)  # sync() waits for the flusher
        self._flushing = False
        self._closing = False

    @property
    def pending(self) -> int:
        return len(self._jobs)

    def add(self, job: Job) -> None:
        """Leave ``job`` (its handler returned; unfinished) for the next flush."""
        self.worker.heartbeat.held.add(job)  # extended until its ack is sent
        with self._lock:
            self._jobs.append(job)
            if len(self._jobs) == 1:
                self._ready.notify()

    def run_thread(self) -> None:
        """The flusher: ack what is buffered, as soon as it is, until
        ``close()``; then a last flush."""
        while True:
            with self._lock:
                while not self._jobs and not self._closing:
                    self._ready.wait()
                closing = self._closing
                jobs, self._jobs = self._jobs, []
                self._flushing = True
            try:
                for job in jobs:
                    # Before the ack: a heartbeat racing it must not call the job lost.
                    job._finished = True
                self.flush(jobs)
            except Exception:  # pragma: no cover - flush records the transport's errors itself
                self.worker.logger.exception("acking the buffered jobs failed")
            finally:
                with self._lock:
                    self._flushing = False
                    self._idle.notify_all()
            if closing:
                self.flush()  # anything left between the take and the close
                return

    def sync(self) -> None:
        """Wait until every job buffered so far is acked (or refused): the
        buffer is empty and no flush is under way.  Returns at once once the
        buffer is closing (the last flush is the runner's)."""
        with self._lock:
            while (self._jobs or self._flushing) and not self._closing:
                self._idle.wait()

    def close(self) -> None:
        """Flush what is left and end the flusher (after the last slot finished)."""
        with self._lock:
            self._closing = True
            self._ready.notify()

    def take(self) -> List[Job]:
        with self._lock:
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            # Before the ack: a heartbeat racing it must not call the job lost.
            job._finished = True
        return jobs

    def flush(self, jobs: Optional[List[Job]] = None) -> None:
        """Ack ``jobs`` (default: everything buffered) with one ``ack_many``
        and record each outcome (``succeeded``, or ``lost``)."""
        if jobs is None:
            jobs = self.take()
        if not jobs:
            return
        w = self.worker
        rec = w._recorder
        held = w.heartbeat.held
        try:
            refused = w.transport.ack_many([job.lease for job in jobs])
        except Exception as exc:
            for job in jobs:
                held.discard(job)
                if not job.lost:
                    rec.failed(job, exc)
            return
        gone = {id(lease) for lease in refused}
        done: List[Job] = []
        for job in jobs:
            held.discard(job)
            if job.lost:
                continue  # the heartbeat found it lost first
            if gone and id(job.lease) in gone:
                rec.failed(job, LeaseLost(f"the lease of job {job.group_id!r} seq {job.seq} is not current"))
            else:
                done.append(job)
        rec.succeeded(done)
