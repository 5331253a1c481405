# cython: language_level=3, embedsignature=True, annotation_typing=False
# cython: freethreading_compatible=True
"""The thread runner's fast path, compiled: ``ThreadRunner.fast`` in C.

The same loop as ``ThreadRunner.fast`` (``threads.py``), line for line, with
the same behaviour: run the handler, then ack the job and claim the next
with one ``ack_and_claim``, and run that, on this slot, while every handler
returns and the worker runs; a delivery past ``max_attempts``, a handler
that raises, a lost lease, the handler's own ack or a stop leave it as
``fast`` does.  A ``Job`` nobody kept is reused for the next delivery (its
only references are then this loop's and the heartbeat's slot: a reference
count of 2 here, 3 for ``sys.getrefcount`` in the pure loop), where
``REFCOUNT`` says the count is exact (CPython 3.9-3.13 with the GIL).

What it saves is the interpreter's work on the per-job bookkeeping (about
0.1 us a job in memory); the handler, the transport and the hooks are the
same Python calls.  ``fastpath.py`` picks it, or ``fast`` where it was not
built (a pure install, ``LEASEQUEUE_NO_EXTENSIONS=1``).

Not part of the public API.
"""

from cpython.ref cimport Py_REFCNT

from leasequeue._errors import LeaseLost
from leasequeue._serializers import EventDecodeError
from leasequeue.worker import _steps
from leasequeue.worker._job import REFCOUNT, Job
from leasequeue.worker._record import STARTED, SUCCEEDED
from leasequeue.worker._retry import ACK, Outcome

cdef object _NONE = _steps.STOP
cdef bint _REUSE = REFCOUNT is not None
cdef Py_ssize_t _STARTED = STARTED
cdef Py_ssize_t _SUCCEEDED = SUCCEEDED
cdef object _O_STARTED = Outcome.STARTED
cdef object _O_SUCCEEDED = Outcome.SUCCEEDED
cdef object _Job = Job
cdef object _ACK = ACK
cdef object _LeaseLost = LeaseLost
cdef object _EventDecodeError = EventDecodeError


def run(object runner, object lease, Py_ssize_t index):
    """``runner.fast(lease, index)``, compiled: the next lease when the last
    ack claimed it, ``None`` when it claimed nothing, else ``_steps.STOP``."""
    cdef object w = runner.worker
    cdef object rec = w._recorder
    cdef object handler = w._call
    cdef object ack_and_claim = w._ack_and_claim
    assert ack_and_claim is not None
    cdef object wid = f"{w.worker_id}/{index}"
    cdef object vis = w.visibility
    cdef object floor = w.min_priority
    cdef object max_attempts = w.retry.max_attempts
    cdef list current = w.heartbeat.current
    cdef list mine = rec.slot_counts[index]
    # Read once per run of the fast path (a hook added meanwhile counts from the next one).
    cdef object observed = rec.observers
    cdef object job = None
    cdef object following
    try:
        while lease.attempt <= max_attempts:
            if job is None or not _REUSE or Py_REFCNT(job) != 2:
                job = _Job(w, lease)
                current[index] = job
            else:
                # Nobody kept the last Job (its only references: this loop and
                # the heartbeat's slot): reuse it for this delivery.
                job.lease = lease
                job._finished = False
            if observed:
                rec.emit(_O_STARTED, job, None, index)
            else:
                mine[_STARTED] += 1
            try:
                handler(job)
            except BaseException as exc:
                runner.run_job(job, exc, index)
                return _NONE
            job._finished = True
            if job.lost:
                return _NONE
            if job._acked or w._stopping:
                rec.apply(job, _ACK, None, index)  # the handler's own ack, or ack alone at a stop
                return _NONE
            try:
                # One call (one commit on PostgreSQL): the ack and the next claim.
                following = ack_and_claim(job.lease, wid, vis, floor)
            except _LeaseLost as exc:
                rec.failed(job, exc)  # nothing acked, nothing claimed
                return _NONE
            except _EventDecodeError as exc:
                # The ack stood; the claim's message does not decode: bury its group.
                rec.emit(_O_SUCCEEDED, job, None, index)
                rec.undecodable(exc, index)
                return _NONE
            except Exception as exc:
                rec.failed(job, exc)
                return _NONE
            if observed:
                rec.emit(_O_SUCCEEDED, job, None, index)
            else:
                mine[_SUCCEEDED] += 1
            if following is None or w._stopping:
                return following
            lease = following
    finally:
        current[index] = None
    return runner.one(lease, index)
