"""The thread runner's ack buffer (a durable transport with ``ack_many``
and ``claim_many``, several slots): a slot whose handler returned leaves
its job here and goes idle; the runner's loop acks everything left here
with one ``ack_many`` (one commit) before it claims for the idle slots with
one ``claim_many``.

How long an ack waits: the loop acks the buffer as soon as it is woken (the
first job left in an empty buffer wakes it), so an ack waits at most for the
transport call the loop is in (a flush or a claim that does not wait: one
round trip); while the loop waits for messages, an ack interrupts that wait.
Jobs finishing during one flush go together into the next: the busier the
worker, the bigger the batches, with no timer.

What a buffered job keeps: its lease, extended by the heartbeat like a
running job's (it is in ``Heartbeat.held``, unfinished until its ack is
sent); an ack refused (``LeaseLost``: the lease ran out, or the group was
purged meanwhile) makes it ``lost``, as a single ack would; a failed
``ack_many`` (the database is down) makes every job in it lost (their
leases will expire).  At shutdown the runner acks the buffer after the last
slot has finished, before ``run()`` returns.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, List, Optional

from ..._errors import LeaseLost
from ..._serializers import EventDecodeError
from .._job import Job

if TYPE_CHECKING:
    from .._worker import Worker

__all__ = ["AckBuffer", "batches_acks"]


def batches_acks(worker: "Worker") -> bool:
    """Whether the thread runner buffers acks for ``worker``: a blocking
    transport (the durable ones) with ``ack_many`` and ``claim_many``, more
    than one slot, and ``batch`` above 1.  One slot keeps ``ack_and_claim``
    (one commit per job already); the in-memory twins keep their path."""
    t = worker.transport
    return (not worker._inline and worker.concurrency > 1 and worker.batch > 1
            and callable(getattr(t, "ack_many", None)) and callable(getattr(t, "claim_many", None)))


class AckBuffer:
    """Jobs whose handler returned, waiting for their ack (slots add, the
    runner's loop takes)."""

    __slots__ = ("worker", "_jobs", "_lock", "_notify")

    def __init__(self, worker: "Worker", notify: Callable[[], None]) -> None:
        self.worker = worker
        self._jobs: List[Job] = []
        self._lock = threading.Lock()
        self._notify = notify  # wakes the runner's loop (thread-safe)

    @property
    def pending(self) -> int:
        return len(self._jobs)

    def add(self, job: Job) -> None:
        """Leave ``job`` (its handler returned; unfinished) for the next flush."""
        self.worker.heartbeat.held.add(job)  # extended until its ack is sent
        with self._lock:
            self._jobs.append(job)
            first = len(self._jobs) == 1
        if first:
            self._notify()

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

    def ack_and_claim(self, job: Job, wid: str) -> Any:
        """One buffered job and one idle slot: ack it and claim the next in
        one call (one commit), as the one-slot path does.  The new lease,
        or ``None``."""
        w = self.worker
        rec = w._recorder
        w.heartbeat.held.discard(job)
        ack_and_claim = w._ack_and_claim
        assert ack_and_claim is not None
        try:
            following = ack_and_claim(job.lease, wid, w.visibility, w.min_priority)
        except EventDecodeError as exc:
            # The ack stood; the claimed message does not decode: bury its group.
            rec.succeeded([job])
            rec.undecodable(exc)
            return None
        except Exception as exc:
            if not job.lost:
                rec.failed(job, exc)  # LeaseLost: nothing acked, nothing claimed
            return None
        if not job.lost:
            rec.succeeded([job])
        return following
