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

from cpython.dict cimport PyDict_GetItemWithError
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_REFCNT, Py_XDECREF

import sys
import types

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
#: Jobs between two GIL hand-overs (see ``run``).
cdef unsigned int _SWITCH_EVERY = 256


# ---------------------------------------------------------------- Job's slots

cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member

# The member type of a __slots__ entry (structmember.h's T_OBJECT_EX).
cdef enum:
    _T_OBJECT_EX = 16


#: Whether reading an object's storage directly is safe here: CPython with
#: the GIL (without it, another thread's write could free what we read).
cdef bint _GIL = sys.implementation.name == "cpython" and getattr(sys, "_is_gil_enabled", lambda: True)()


cdef Py_ssize_t _slot(str name) except -2:
    """The offset of ``Job``'s slot ``name`` in its instances, or -1: read
    and write it through ``getattr``/``setattr`` (not ``_GIL``; a ``Job``
    that is not the plain class with ``__slots__``)."""
    if not _GIL:
        return -1
    member = _Job.__dict__.get(name)
    if type(member) is not types.MemberDescriptorType or getattr(member, "__objclass__", None) is not _Job:
        return -1
    cdef PyMemberDef *d = (<PyMemberDescrObject *> <PyObject *> member).d_member
    if d.type != _T_OBJECT_EX or d.offset <= 0:
        return -1
    return d.offset


# What ``job.lease``, ``job.lost``, ``job._acked``, ``job._finished`` cost as
# attribute accesses (a type lookup and a descriptor call each: about a
# fifth of this loop's instructions), as a read or write of the slot itself:
# the member descriptor's own code, without the lookup.
cdef Py_ssize_t _LEASE = _slot("lease")
cdef Py_ssize_t _LOST = _slot("lost")
cdef Py_ssize_t _ACKED = _slot("_acked")
cdef Py_ssize_t _FINISHED = _slot("_finished")
#: Whether the loop reads and writes the Job's slots directly.
DIRECT_SLOTS = _LEASE > 0 and _LOST > 0 and _ACKED > 0 and _FINISHED > 0


cdef inline object _get(object job, Py_ssize_t offset, str name):
    """``job.<name>``: the slot at ``offset`` when it is known and set, else getattr."""
    cdef PyObject *value
    if offset > 0:
        value = (<PyObject **> ((<char *> <PyObject *> job) + offset))[0]
        if value is not NULL:
            return <object> value
    return getattr(job, name)  # unset: AttributeError, as the descriptor raises


cdef dict _instance_dict(object w, str name):
    """``w.__dict__`` when ``w.<name>`` is an entry of it (no class attribute
    of that name can come first), else None: read it with getattr."""
    if not _GIL or hasattr(type(w), name):
        return None
    d = getattr(w, "__dict__", None)
    return d if type(d) is dict else None


cdef inline object _entry(object w, dict d, str name):
    """``w.<name>``, ``d`` being ``_instance_dict(w, name)``."""
    cdef PyObject *value
    if d is not None:
        value = PyDict_GetItemWithError(d, name)  # an error (none for a str key) propagates
        if value is not NULL:
            return <object> value
    return getattr(w, name)


cdef extern from *:
    """
    /* A data descriptor's __get__, as the attribute lookup calls it. */
    static PyObject *lq_descr_get(PyObject *descr, PyObject *obj, PyObject *type) {
        return Py_TYPE(descr)->tp_descr_get(descr, obj, type);
    }
    """
    object lq_descr_get(object descr, object obj, object type)

cdef extern from "Python.h":
    ctypedef struct PyTypeObject:
        void *tp_descr_get
        void *tp_descr_set
        unsigned long tp_flags
    enum:
        Py_TPFLAGS_HEAPTYPE

# Py_TPFLAGS_IMMUTABLETYPE (3.10+; unused before): a heap type whose attributes cannot be set.
cdef enum:
    _TPFLAGS_IMMUTABLETYPE = 1 << 8


cdef object _attempt_descriptor(type lease_type):
    """The data descriptor that ``lease.attempt`` is on ``lease_type`` when
    that type cannot change (a compiled Lease), else None: getattr."""
    if not _GIL:
        return None
    cdef unsigned long flags = (<PyTypeObject *> lease_type).tp_flags
    if flags & Py_TPFLAGS_HEAPTYPE and not flags & _TPFLAGS_IMMUTABLETYPE:
        return None
    cdef PyTypeObject *kind
    cdef type d_type
    for klass in lease_type.__mro__:
        d = klass.__dict__.get("attempt")
        if d is not None:
            d_type = type(d)
            kind = <PyTypeObject *> d_type
            if kind.tp_descr_get is not NULL and kind.tp_descr_set is not NULL:
                return d
            return None
    return None


cdef inline int _set(object job, Py_ssize_t offset, str name, object value) except -1:
    """``job.<name> = value``: the member descriptor's store, or setattr."""
    cdef PyObject **slot
    cdef PyObject *old
    if offset > 0:
        slot = <PyObject **> ((<char *> <PyObject *> job) + offset)
        old = slot[0]
        Py_INCREF(value)
        slot[0] = <PyObject *> value
        Py_XDECREF(old)
        return 0
    setattr(job, name, value)
    return 0


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
    cdef unsigned int jobs = 0
    # lease.attempt: the descriptor's __get__ itself, for a lease type that cannot change.
    cdef type lease_type = None
    cdef object attempt_of = None
    # w._stopping, as an entry of the worker's __dict__ (the stop() of another thread sets it).
    cdef dict wdict = _instance_dict(w, "_stopping")
    try:
        while True:
            if type(lease) is not lease_type:
                lease_type = type(lease)
                attempt_of = _attempt_descriptor(lease_type)
            if attempt_of is not None:
                if not lq_descr_get(attempt_of, lease, lease_type) <= max_attempts:
                    break
            elif not lease.attempt <= max_attempts:
                break
            if job is None or not _REUSE or Py_REFCNT(job) != 2:
                job = _Job(w, lease)
                current[index] = job
            else:
                # Nobody kept the last Job (its only references: this loop and
                # the heartbeat's slot): reuse it for this delivery.
                _set(job, _LEASE, "lease", lease)
                _set(job, _FINISHED, "_finished", False)
            if observed:
                rec.emit(_O_STARTED, job, None, index)
            else:
                mine[_STARTED] += 1
            try:
                handler(job)
            except BaseException as exc:
                runner.run_job(job, exc, index)
                return _NONE
            _set(job, _FINISHED, "_finished", True)
            if _get(job, _LOST, "lost"):
                return _NONE
            if _get(job, _ACKED, "_acked") or _entry(w, wdict, "_stopping"):
                rec.apply(job, _ACK, None, index)  # the handler's own ack, or ack alone at a stop
                return _NONE
            try:
                # One call (one commit on PostgreSQL): the ack and the next claim.
                following = ack_and_claim(_get(job, _LEASE, "lease"), wid, vis, floor)
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
            if following is None or _entry(w, wdict, "_stopping"):
                return following
            lease = following
            jobs += 1
            if jobs == _SWITCH_EVERY:
                # The pure loop's interpreter lets a thread that waits for the
                # GIL (the heartbeat, a stop()) take it every switch interval;
                # with a handler in C (a Cython function, a bound builtin) this
                # loop would never run Python code: offer it here (every 256
                # jobs: well under a millisecond of no-op jobs).
                jobs = 0
                with nogil:
                    pass
    finally:
        current[index] = None
    return runner.one(lease, index)
