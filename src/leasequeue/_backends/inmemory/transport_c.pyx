# cython: language_level=3, embedsignature=False, annotation_typing=False
# cython: freethreading_compatible=True
"""Cython ``InMemoryTransport``: the compiled twin of ``transport_py``.

Same contract (``docs/contract.md``, ``docs/decisions.md``), same names, signatures,
docstrings and error messages as the pure module; the algorithm is explained
there.  Here the same structures live in C arrays, each in a file of its
own (included below, in the order of the pure module's sections):

* groups (``storage.pxi``): an array of 64-byte ``Group`` structs
  (the fields a claim touches together); freed slots are chained in a free
  list.  A buried group (``bury``) is one with a reason in the array of
  reasons by slot: like a paused group, it is just not in the ready heaps,
  so publish, claim and ack never look at it.  A group id finds its slot through an open-addressing table of
  (slot, 32 bits of the id's hash) pairs, 8 bytes an entry
  (``ids.pxi``); the group keeps a borrowed pointer to its id,
  whose reference a list by slot owns.  Only a group's head message can be
  leased or parked, so lock state lives on the group, with its pause.  A
  paused group may hold no message (a slot is in use while its id is set).
  Beside the records, by slot: the worker of the group's latest claim (for
  ``group()``) and a doubly linked list of the groups in creation order
  (for ``groups()``).
* messages (``storage.pxi``): an array of packed 12-byte
  ``Message`` records (``seq`` and ``next``: a singly linked FIFO per
  group), events in a ``list`` indexed by the same slot so the garbage
  collector sees them.
* ready groups (``ready.pxi``): an indexed 4-ary heap per priority
  level, keyed by the round-robin key; the levels form a treap whose nodes
  know the smallest ready key of their subtree (claim with a priority floor
  is one walk).
* locked groups with a finite expiry (``expiry.pxi``): an indexed
  min-heap keyed by expiry.  A head published with a delay and not due is
  one more lock state (``_SCHED``, like a park with no holder, ending at its
  due): the expiry machinery, and the expiry timer of waiting claims, free
  it.
* what Part 5 adds to some messages (``marks.pxi``): a table seq -> (due,
  key) of the messages published with a delay or a key, a heap of dues for
  ``stats().scheduled`` and a ring of keyed publishes for
  ``dedup_window``; the keys themselves are a dict ``(group_id, key) ->
  seq``.  A group's ``marks`` byte says whether any of this can concern it,
  so an unmarked group's publish, claim and ack never look there.
* fencing by delivery (``lease.pxi``): an issued lease carries the claim
  number of the claim that made it, which is its group's round-robin key
  from then on; it is current while the key still is that number and the
  delivery is open.
* waiting claims (``waiters.pxi``): a FIFO of waiter records per
  priority floor; the sleeping and waking is ``waiting.py``, shared with
  the pure twin.
* a ``publish_many`` batch (``batch.pxi``): what it works out
  before publishing anything (its new groups, and how many per priority).

Each structure is a C struct the transport holds, with ``cdef ...
noexcept`` functions (``inline`` where hot) taking a pointer to it
(``ids_lookup``, ``ready_push``, ``expiry_push``, ...); the ``Lease`` class
and the argument checks have files of their own too.  The transport's
methods below are the operations.

Memory is only allocated before anything changes, so a ``MemoryError``
leaves the transport as it was: ``publish`` grows the message, group, id
table and level arrays first and reserves a ready-heap slot for every group
of a level; ``claim``, ``nack`` and ``extend`` first make room for one more
expiry entry.  Expiry and ``stats`` never need memory, nor does ``ack``
but for an expiry entry when its group's next message is scheduled (made
room for first).  Of the
control plane and the batches: ``pause`` of an unknown group and
``set_priority`` reserve as ``publish`` does; ``publish_many`` reserves for
the whole batch (messages, new groups, their levels); ``claim_many`` makes
room for all its claims (records and expiry entries, which the expiries it
applies first must not give back); ``purge``, ``groups`` and ``ack_many``
allocate the arrays that carry what they release or report past the lock.
Of the quarantine: ``bury`` never needs memory, ``skip`` only an expiry
entry for a scheduled next head (``skip`` re-keys a never-claimed group
through its reserved ready-heap slot), and ``peek`` allocates the array it
copies the messages into first.  A publish with a delay or a key, and a
batch of them, makes room in the mark table, the heap of dues, the ring and
the key dict (which allocates no object the collector tracks: its keys are
tuples made before the lock, its values ints and floats) before it changes
anything; ``publish_many`` makes its result first too.  Storage is
given back when a backlog drains: when under a quarter of the message or
group slots is in use, ``ack`` renumbers the live ones into arrays half as
full (amortised O(1); a lease whose group moved is found again by its id),
and the heaps shrink likewise.

Locking: one lock (``PyMutex`` on 3.13+, as ``cython.pymutex``; the GIL
before 3.13, see ``lq_mutex`` below for why that is sound and faster).  No
user code runs under it and no object the garbage collector tracks is
allocated under it (a collection could run a finaliser that calls back into
this transport): the clock is read and str subclasses are converted before
it, leases, results and exceptions are built after it, and the references
to acked and purged events are dropped after it.
"""

cimport cython
from cpython.dict cimport PyDict_DelItem, PyDict_GetItem, PyDict_SetItem
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_Append
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.exc cimport PyErr_Clear
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF, Py_XINCREF
from cpython.tuple cimport PyTuple_Check, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport INT32_MAX, INT64_MAX, INT64_MIN, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memmove, memset

import time

from ..._errors import LeaseLost
from ..._types import PARKED, GroupInfo, TransportStats
from ..._types import Message as _PeekedMessage  # `Message` is the C record of a message here
from .waiting import aclaim_wait as _aclaim_wait
from .waiting import claim_wait as _claim_wait
from .waiting import poke_timer as _poke_timer

__all__ = ["PARKED", "InMemoryTransport", "Lease", "TransportStats"]

cdef str _PARKED_STR = PARKED
cdef object _time_time = time.time
cdef double _INF = float("inf")
cdef double _NAN = float("nan")


cdef extern from "lq_build.h":
    object lq_cython_version()

#: The Cython version that compiled this module (recorded at build time).
CYTHON_VERSION = lq_cython_version()


cdef extern from "lq_platform.h":
    # The C read of time.time and the lock primitive (see the header).
    double lq_wall_time() noexcept nogil
    bint LQ_HAVE_WALL_TIME
    ctypedef struct lq_mutex:
        pass
    void lq_lock(lq_mutex *m) noexcept
    void lq_unlock(lq_mutex *m) noexcept


cdef extern from *:
    """
    /* Equality of two exact str objects (no user code can run). */
    static CYTHON_INLINE int lq_str_eq(PyObject *a, PyObject *b) {
        return a == b || PyUnicode_Compare(a, b) == 0;
    }
    /* Store v in list[i] (taking a new reference) and hand back the old item
       (the caller now owns that reference). No allocation, no decref. */
    static CYTHON_INLINE PyObject *lq_list_swap(PyObject *list, Py_ssize_t i, PyObject *v) {
        PyObject *old = PyList_GET_ITEM(list, i);
        Py_INCREF(v);
        PyList_SET_ITEM(list, i, v);
        return old;
    }
    /* Move list[i] out (the caller owns it), leaving None there. */
    static CYTHON_INLINE PyObject *lq_list_take(PyObject *list, Py_ssize_t i) {
        PyObject *item = PyList_GET_ITEM(list, i);
        Py_INCREF(Py_None);
        PyList_SET_ITEM(list, i, Py_None);
        return item;
    }
    /* Put an owned reference at list[i], which holds None. */
    static CYTHON_INLINE void lq_list_put(PyObject *list, Py_ssize_t i, PyObject *item) {
        PyObject *old = PyList_GET_ITEM(list, i);
        PyList_SET_ITEM(list, i, item);
        Py_DECREF(old);
    }
    /* Drop list[n:] (all None) if the list can shrink; never raises. */
    static void lq_list_truncate(PyObject *list, Py_ssize_t n) {
        if (PyList_GET_SIZE(list) > n && PyList_SetSlice(list, n, PyList_GET_SIZE(list), NULL) < 0)
            PyErr_Clear();  /* keep the longer list: len(list) >= capacity still holds */
    }
    /* The hash of an exact str: the one it caches, else computed (no user code). */
    static CYTHON_INLINE Py_hash_t lq_cached_hash(PyObject *s) {
        Py_hash_t h = ((PyASCIIObject *)s)->hash;
        return h != -1 ? h : PyObject_Hash(s);
    }
    /* A new, empty instance of a tuple subclass (a named tuple) with n items,
       to be filled with PyTuple_SET_ITEM: what tuple.__new__(cls, items)
       makes, without the intermediate tuple and the call. */
    static PyObject *lq_new_record(PyObject *type, Py_ssize_t n) {
        return ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, n);
    }
    /* Store an owned reference in a fresh record (no old item to release). */
    static CYTHON_INLINE void lq_record_put(PyObject *record, Py_ssize_t i, PyObject *item) {
        PyTuple_SET_ITEM(record, i, item);
    }
    /* A new reference to list[i]. */
    static CYTHON_INLINE PyObject *lq_list_get(PyObject *list, Py_ssize_t i) {
        PyObject *item = PyList_GET_ITEM(list, i);
        Py_INCREF(item);
        return item;
    }
    """
    object lq_list_swap(object lst, Py_ssize_t i, object v)
    object lq_list_get(object lst, Py_ssize_t i)
    object lq_new_record(object type, Py_ssize_t n)
    void lq_record_put(object record, Py_ssize_t i, object item)  # steals: INCREF first
    # An owned reference handed over to Cython as it is (no new reference).
    object lq_steal "(PyObject *)"(PyObject *owned)
    PyObject *lq_list_ref "lq_list_get"(object lst, Py_ssize_t i) noexcept
    int lq_str_eq(PyObject *a, PyObject *b) noexcept
    PyObject *lq_list_take(object lst, Py_ssize_t i) noexcept
    void lq_list_put(object lst, Py_ssize_t i, PyObject *item) noexcept
    void lq_list_truncate(object lst, Py_ssize_t n) noexcept
    Py_hash_t lq_str_hash "PyObject_Hash"(object s) noexcept
    Py_hash_t lq_cached_hash(PyObject *s) noexcept
    PyObject *PyList_GET_ITEM(object lst, Py_ssize_t i)


# Lock states of a group's head message.
cdef enum:
    _FREE = 0  # not locked (possibly an expired lease whose delivery is still open)
    _LEASED = 1
    _PARKED = 2
    _SCHED = 3  # the head is scheduled, not due: like a park with no holder, ending at its due

# Result codes of the locked sections (exceptions are raised after unlock).
cdef enum:
    _OK = 0
    _NOMEM = 2
    _FULL = 3
    _HELD = 4  # a publish whose key is held: nothing published

# Storage shrinks (compacting live entries to the front) when less than a
# quarter of it is in use, down to these sizes.
cdef enum:
    _MIN_MESSAGE_CAP = 1024
    _MIN_GROUP_CAP = 256
    _MIN_HEAP_CAP = 16

# Never-claimed groups are keyed ``first seq - 2**62``: before every claimed
# group (keyed by claim number >= 1).
cdef int64_t _NEVER_CLAIMED = (<int64_t>1) << 62


# The pieces, each in a file of its own, in the order of the pure twin's
# sections (a module-level include: Cython allows none in a class body).
include "lease.pxi"          # Lease, _issue, _lost_message
include "validation.pxi"     # argument checks
include "ids.pxi"            # IdTable: group id -> group slot
include "ready.pxi"          # ReadySet: a heap of ready groups per level, the level treap
include "expiry.pxi"         # ExpiryHeap: locked groups by expiry
include "marks.pxi"          # MarkTable, SchedHeap, KeyRing: due times and keys of the messages that have them
include "storage.pxi"        # MessageStore, GroupStore: the records, grow, forget, compact
include "waiters.pxi"        # _Waiter, WaiterQueues: the waiting claims (THE ENTRY POINT: see there)
include "batch.pxi"          # BatchPlan: what publish_many works out before the lock


cdef inline void _put(object record, Py_ssize_t i, object item):
    Py_INCREF(item)
    lq_record_put(record, i, item)


cdef object _group_info(const GroupView *view):
    """The ``GroupInfo`` of a view (its references stay the caller's)."""
    cdef object state, worker, expires_at = None, attempt = None, reason = None
    cdef object info
    if view.reason != NULL:  # buried: the buried delivery's worker and attempt, no end
        state = "buried"
        worker = <object>view.holder
        attempt = view.attempt
        reason = <object>view.reason
    elif view.lock == _LEASED:
        state = "leased"
        worker = <object>view.holder
    elif view.lock == _PARKED:
        state = "parked"
        worker = _PARKED_STR
    else:
        state = "paused" if view.paused else ("scheduled" if view.lock == _SCHED else "ready")
        worker = None
    if view.lock == _LEASED or view.lock == _PARKED:
        expires_at = view.expires_at
        attempt = view.attempt
    info = lq_new_record(GroupInfo, 12)
    _put(info, 0, <object>view.gid)
    _put(info, 1, view.priority)
    _put(info, 2, view.messages)
    _put(info, 3, state)
    _put(info, 4, True if view.paused else False)
    _put(info, 5, view.head_seq if view.messages else None)
    _put(info, 6, worker)
    _put(info, 7, expires_at)
    _put(info, 8, attempt)
    _put(info, 9, view.claimed_at if view.claimed else None)
    _put(info, 10, reason)
    _put(info, 11, view.due_at if view.lock == _SCHED else None)
    return info


# -------------------------------------------------------------- transport


@cython.final
cdef class InMemoryTransport:
    """In-process message transport with per-group leases.

    Messages are published into groups (one group = one workflow execution).
    At most one message per group is leased or parked at a time, a group's
    messages are delivered in publish order, groups are served round-robin
    (the group claimed least recently first; never-claimed groups first, in
    the order of their oldest message), ``min_priority`` skips groups below a
    priority floor, and an expired lease frees its message for redelivery.
    Events are held by reference, never copied.

    ``clock`` is a zero-argument callable returning the time in seconds as a
    float (default ``time.time``); it is read once by ``claim``,
    ``claim_many``, ``ack_and_claim``, ``extend``, ``stats``, ``group``,
    ``groups``, ``skip``, ``retry``, ``nack(delay > 0)``, ``release(delay >
    0)``, and ``publish`` / ``publish_many`` with ``delay > 0`` or with a key
    and ``dedup_window > 0`` (and by ``publish``, ``ack``, ``nack(0)``,
    ``release(0)``, ``resume``, ``set_priority``, ``publish_many`` and
    ``ack_many`` while a claim waits for work), never while the transport's lock is held.  The
    transport's time never runs backwards: an operation whose clock reading
    is older than a time an earlier operation used (a racing thread, or a
    clock turned back) uses that later time instead.  Every method is atomic
    and thread-safe.

    ``claim(..., timeout=)`` and ``aclaim`` wait for work, in a thread or an
    asyncio event loop; ``close()`` ends every wait.

    ``dedup_window`` (seconds, default ``0.0``; ``+inf`` accepted) is how
    long an idempotency key stays held after the publish that stored it,
    once its message has left (see ``publish``).
    """

    #: A declared capability (the worker reads it): calls never wait beyond a lock, so an
    #: event loop may call them directly.  Durable transports (and those that do not say) block.
    blocking = False

    cdef lq_mutex _lock
    cdef object __weakref__
    cdef object _clock
    cdef bint _wall_clock           # clock is time.time: read it in C
    cdef object _owner              # stamped on every lease this transport issues

    # messages and groups by slot (storage.pxi), and the objects
    # they refer to in lists by the same slots, so the garbage collector
    # sees them: len(_events) >= _messages.cap, len(_group_ids) >= _groups.cap
    cdef MessageStore _messages
    cdef GroupStore _groups
    cdef list _events               # message slot -> event (None when unused)
    cdef list _group_ids            # group slot -> group id (None when unused)

    # group id -> group slot (ids.pxi)
    cdef IdTable _ids

    # ready groups by priority level, and the treap of levels (ready.pxi)
    cdef ReadySet _ready

    # locked groups with a finite expiry (expiry.pxi)
    cdef ExpiryHeap _expiry

    # due times and keys of the messages that have them (marks.pxi)
    cdef MarkTable _marks
    cdef SchedHeap _sched           # (due, seq) of delayed messages, for stats().scheduled
    cdef KeyRing _ring              # keyed publishes in order, while _window > 0
    cdef int64_t _scheduled         # held messages whose due >= _sched_at
    cdef double _sched_at           # the now of the latest sweep of _sched (-inf before)
    cdef double _window             # dedup_window
    cdef dict _keys                 # (group_id, key) -> seq of the message that stored it
    cdef dict _key_at               # (group_id, key) -> the now of that publish (_window > 0)

    cdef double _time               # the latest ``now`` an operation used
    cdef int64_t _seq
    cdef int64_t _claims
    cdef int64_t _leased            # groups whose lock is _LEASED
    cdef int64_t _parked            # groups whose lock is _PARKED
    cdef int64_t _paused            # groups paused
    cdef int64_t _idle              # groups holding no message (each one paused)
    cdef int64_t _buried            # groups buried

    # waiting claims (waiters.pxi)
    cdef WaiterQueues _wq           # the queued records; _wq.count: anyone waiting?
    cdef object _chain              # records promised a wake, detached and woken after the lock
    cdef double _timer_at           # clock time the expiry timer is armed for
    cdef bint _poke                 # the timer must be poked after the lock is released
    cdef public object _timer       # the expiry timer (waiting.py), started on first use
    cdef readonly bint _closed
    cdef int64_t _wakeups[2]        # wakes promised: hand-offs, close (for tests)

    def __cinit__(self, *args, **kwargs):
        messages_init(&self._messages)
        groups_init(&self._groups)
        ids_init(&self._ids)
        ready_init(&self._ready)
        expiry_init(&self._expiry)
        marks_init(&self._marks)
        sched_init(&self._sched)
        ring_init(&self._ring)
        self._sched_at = -_INF
        self._keys = {}
        self._key_at = {}
        waiters_init(&self._wq)
        self._chain = None
        self._timer = None
        self._timer_at = _INF
        self._group_ids = []
        self._events = []
        self._owner = object()
        self._time = -_INF

    def __dealloc__(self):
        PyMem_Free(self._messages.at)
        groups_free(&self._groups)
        ids_free(&self._ids)
        ready_free(&self._ready)
        expiry_free(&self._expiry)
        marks_free(&self._marks)
        sched_free(&self._sched)
        ring_free(&self._ring)
        waiters_free(&self._wq)

    def __init__(self, clock: Callable[[], float] = time.time, *, dedup_window: float = 0.0) -> None:
        if not callable(clock):
            raise TypeError(f"clock must be callable, not {type(clock).__name__}")
        self._window = _check_duration(dedup_window, "dedup_window")
        self._clock = clock
        self._wall_clock = LQ_HAVE_WALL_TIME and clock is _time_time

    # -------------------------------------------------------------- public

    def publish(
        self, group_id: str, event: Any, priority: int = 0, *, delay: float = 0.0, key: Optional[str] = None
    ) -> int:
        """Append ``event`` to group ``group_id``; return its sequence number.

        Sequence numbers are 1, 2, 3, ... and never reused.  ``priority`` is
        taken when the group is created (its first message, or the first after
        it was emptied) and ignored otherwise.

        ``delay > 0`` schedules the message until ``due = now + delay``: it is
        not delivered while ``due >= now``, and while it is its group's oldest
        message and not due its group waits behind it (FIFO holds).  ``key``
        (a ``str``, scoped to the group) makes the publish idempotent: while
        the key is held (its message is in the transport, or was published
        less than ``dedup_window`` seconds ago), a publish with it publishes
        nothing and returns the holder's seq.  The clock is read once when
        ``delay > 0``, or with a key and ``dedup_window > 0``.
        """
        cdef str gid = group_id if type(group_id) is str else _check_id(group_id, "group_id")
        cdef int64_t prio = _priority(priority, "priority")
        if delay is not 0.0 or key is not None:
            return self._publish_ext(gid, event, prio, delay, key)
        return _publish_plain(self, gid, event, priority)

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, *, timeout: Optional[float] = 0.0
    ) -> Optional[Lease]:
        """Lease the next message to ``worker_id`` for ``visibility`` seconds.

        First every lease or park whose ``expires_at < now`` expires.  Then,
        among the groups with priority ``>= min_priority`` that hold a free
        message and have nothing leased or parked, the one claimed least
        recently (never-claimed groups first, by their oldest message) has
        its oldest message leased until ``now + visibility``.  Returns the
        ``Lease``, or ``None`` when no group is eligible.

        ``timeout`` (seconds of real time) makes the claim wait, when no
        group is eligible, for a message to become claimable: ``0`` (the
        default) never waits, ``None`` waits with no deadline.  Among waiting
        claims whose ``min_priority`` admits a message, the one that has
        waited longest gets it.  A waiting claim returns ``None`` at its
        deadline, and at once when the transport is closed (``close()``).
        An exception in the waiting thread (``KeyboardInterrupt``) ends the
        wait and leaves nothing leased on its behalf.
        """
        cdef str wid
        cdef double vis, now, wait, expires_at = 0.0
        cdef int64_t minp
        cdef int32_t lv = -1, slot = -1, head
        cdef int64_t seq = 0, attempt = 0, delivery = 0
        cdef Group *g
        cdef object gid = None, event = None
        if type(worker_id) is str and not (<str>worker_id == _PARKED_STR):
            wid = <str>worker_id
        else:
            wid = _check_worker(worker_id)
        if type(visibility) is float and <double>visibility >= 0.0:
            vis = <double>visibility
        else:
            vis = _check_duration(visibility, "visibility")
        minp = _priority(min_priority, "min_priority")
        if timeout is not 0.0:  # the default object: a claim that does not wait pays this test
            wait = _check_timeout(timeout)
            if wait != 0.0:
                return self._claim_wait(wid, vis, minp, wait)
        if self._wall_clock:  # _now() by hand: gcc no longer inlines it here
            now = lq_wall_time()
        else:
            now = self._now()
        lq_lock(&self._lock)
        try:
            if expiry_make_room(&self._expiry) != _OK:
                lv = -2  # MemoryError, nothing changed
            else:
                if now < self._time:  # another thread already used a later time
                    now = self._time
                else:
                    self._time = now
                if expiry_due(&self._expiry, now):
                    self._expire(now)
                lv = ready_best(&self._ready, minp)
            if lv >= 0:
                slot = ready_pop(&self._ready, lv)
                g = &self._groups.at[slot]
                self._claims += 1
                delivery = self._claims
                g.key = delivery
                g.claimed_at = now
                g.attempt += 1
                attempt = g.attempt
                g.open = 1
                g.lock = _LEASED
                expires_at = now + vis
                g.expires_at = expires_at
                self._leased += 1
                if expires_at != _INF:
                    expiry_push(&self._expiry, slot, expires_at)
                group_hold(&self._groups, slot, <PyObject *>wid)
                head = g.head
                seq = self._messages.at[head].seq
                event = lq_list_get(self._events, head)
                gid = <object>g.gid
        finally:
            lq_unlock(&self._lock)
        if self._wq.count:  # expiry may have freed groups; our lease may expire first
            self._serve_waiters(now, 1)
        if slot < 0:
            if lv == -2:
                raise MemoryError()
            return None
        return _issue(seq, gid, event, wid, expires_at, attempt, self._owner, slot, delivery)

    def ack(self, lease: Lease) -> None:
        """Done: remove the leased message; its group may serve its next one.

        A group left without messages is forgotten (priority and round-robin
        position included).  Raises ``LeaseLost`` if the lease is not current;
        an expired lease whose message nobody has claimed since is accepted.
        """
        cdef int32_t slot
        cdef Group *g
        cdef object spent = None      # dropped after the lock is released
        cdef object spent_id = None
        cdef PyObject *refs[2]        # the same, from a marked group (_ack_slot)
        cdef Py_ssize_t kept = 0, i
        _check_lease(lease)
        lq_lock(&self._lock)
        try:
            slot = self._current(<Lease>lease)
            if slot >= 0:
                g = &self._groups.at[slot]
                if g.marks:  # a due time or a key in the group (marks.pxi)
                    if self._ack_slot(slot, refs, &kept) != _OK:
                        slot = -2  # MemoryError, nothing changed
                else:
                    if g.lock != _FREE:
                        self._unlock(slot)
                    g.open = 0
                    g.attempt = 0
                    spent = group_shift(&self._messages, self._events, g)
                    if g.count == 0:
                        if g.paused:
                            self._idle += 1  # a paused group is kept, empty
                        else:
                            spent_id = self._forget(slot)
                    elif not ready_contains(&self._ready, slot) and not g.paused:
                        self._make_ready(slot)
                if messages_sparse(&self._messages):
                    self._compact_messages()
        finally:
            lq_unlock(&self._lock)
        if slot < 0:
            if slot == -2:
                raise MemoryError()
            raise LeaseLost(_lost_message(<Lease>lease))
        if kept:
            for i in range(kept):
                Py_XDECREF(refs[i])  # the event's __del__ may run here, outside the lock
        if self._wq.count:
            spent = None  # the event's __del__ may run here, outside the lock
            self._serve_waiters(0.0, 0)

    def nack(self, lease: Lease, delay: float = 0.0) -> None:
        """Give the message back: retry now (``delay == 0``) or park it.

        ``delay == 0`` frees it for immediate redelivery (it is still its
        group's oldest message, so it comes next for that group, with
        ``attempt + 1``).  ``delay > 0`` parks it until ``now + delay``: while
        parked it blocks its whole group.  The group keeps its round-robin
        position.  Raises ``LeaseLost`` if the lease is not current.
        """
        self._give_back(lease, delay, 1)

    def release(self, lease: Lease, delay: float = 0.0) -> None:
        """Hand a delivery back without counting it: ``nack`` that does not spend an attempt.

        Exactly ``nack(lease, delay)`` (the delivery ends; ``delay == 0``
        frees the message now, ``delay > 0`` parks it; same checks, clock
        reading, round-robin position and wake-ups), then the message's
        attempt count goes back to ``lease.attempt - 1``: its next delivery
        carries the same ``attempt`` as this one.  The released lease is
        never current again.  Raises ``LeaseLost`` if the lease is not current.
        """
        self._give_back(lease, delay, 0)

    cdef int _give_back(self, object lease, object delay, bint counted) except -1:
        """``nack`` (``counted``) or ``release``."""
        cdef double d, now = 0.0, expires_at
        cdef int32_t slot
        cdef Group *g
        _check_lease(lease)
        d = _check_duration(delay, "delay")
        if d > 0.0:
            now = self._now()
        lq_lock(&self._lock)
        try:
            slot = self._current(<Lease>lease)
            if slot >= 0 and expiry_make_room(&self._expiry) != _OK:
                slot = -2  # MemoryError, nothing changed
            if slot >= 0:
                if d > 0.0:
                    if now < self._time:
                        now = self._time
                    else:
                        self._time = now
                g = &self._groups.at[slot]
                if g.lock != _FREE:
                    self._unlock(slot)
                g.open = 0
                if not counted:  # release: this delivery does not count
                    g.attempt = (<Lease>lease)._cattempt - 1
                if d == 0.0:
                    if not ready_contains(&self._ready, slot) and not g.paused:
                        self._make_ready(slot)
                else:
                    if ready_contains(&self._ready, slot):
                        self._unready(slot)
                    g.lock = _PARKED
                    expires_at = now + d
                    g.expires_at = expires_at
                    self._parked += 1
                    if expires_at != _INF:
                        expiry_push(&self._expiry, slot, expires_at)
        finally:
            lq_unlock(&self._lock)
        if slot < 0:
            if slot == -2:
                raise MemoryError()
            raise LeaseLost(_lost_message(<Lease>lease))
        if self._wq.count:
            self._serve_waiters(now, d > 0.0)
        return 0

    def extend(self, lease: Lease, visibility: float) -> Lease:
        """Heartbeat: lease the same message again until ``now + visibility``.

        Returns a new ``Lease`` (same ``seq``, ``attempt`` and ``worker_id``,
        new ``expires_at``); the old and the new lease name the same
        delivery.  A lease whose time ran out but whose message nobody has
        claimed since may be extended: its group is locked again.  Raises
        ``LeaseLost`` if the lease is not current.
        """
        cdef double vis, now, expires_at = 0.0
        cdef int32_t slot
        cdef Group *g
        cdef Lease old
        _check_lease(lease)
        old = <Lease>lease
        vis = _check_duration(visibility, "visibility")
        now = self._now()
        lq_lock(&self._lock)
        try:
            slot = self._current(old)
            if slot >= 0 and expiry_make_room(&self._expiry) != _OK:
                slot = -2  # MemoryError, nothing changed
            if slot >= 0:
                if now < self._time:
                    now = self._time
                else:
                    self._time = now
                g = &self._groups.at[slot]
                if g.lock != _FREE:
                    self._unlock(slot)
                if ready_contains(&self._ready, slot):
                    self._unready(slot)
                g.lock = _LEASED
                expires_at = now + vis
                g.expires_at = expires_at
                self._leased += 1
                if expires_at != _INF:
                    expiry_push(&self._expiry, slot, expires_at)
        finally:
            lq_unlock(&self._lock)
        if slot < 0:
            if slot == -2:
                raise MemoryError()
            raise LeaseLost(_lost_message(old))
        if self._wq.count:
            self._serve_waiters(now, 1)
        return _issue(
            old._cseq, old.group_id, old.event, old.worker_id, expires_at,
            old._cattempt, self._owner, slot, old._cdelivery,
        )

    def stats(self) -> TransportStats:
        """Counts now: messages held, groups, live leases, parked messages,
        paused and buried groups, scheduled messages.

        Expired leases and parks (``expires_at < now``) count as neither;
        ``scheduled`` counts the messages published with a delay whose
        ``due >= now``, wherever they stand in their group.
        """
        cdef double now = self._now()
        cdef int64_t messages, groups, leased, parked, paused, buried, scheduled
        lq_lock(&self._lock)
        try:
            if now < self._time:
                now = self._time
            else:
                self._time = now
            if expiry_due(&self._expiry, now):
                self._expire(now)
            if self._sched.size and self._sched.entries[0].due < now:
                self._sweep_scheduled(now)
            scheduled = self._scheduled
            messages = self._messages.used
            groups = self._groups.used - self._idle
            leased = self._leased
            parked = self._parked
            paused = self._paused
            buried = self._buried
        finally:
            lq_unlock(&self._lock)
        if self._wq.count:
            self._serve_waiters(now, 1)
        return TransportStats(messages, groups, leased, parked, paused, buried, scheduled)

    # -------------------------------------------------------- control plane

    def pause(self, group_id: str) -> bool:
        """Stop serving group ``group_id``; ``True`` if it was not paused.

        A paused group is never served by ``claim`` (like a park with no
        end).  A message already leased stays leased: its worker may ack,
        nack or extend it, and a ``nack(lease, 0)`` or an expiry leaves it in
        the still-paused group.  A group that does not exist is created,
        paused, with priority 0, so that messages published later wait in
        it.  A paused group is not forgotten while paused, even when empty.
        """
        cdef str gid = group_id if type(group_id) is str else _check_id(group_id, "group_id")
        cdef Py_hash_t h = hash(gid)  # exact str: no user code
        cdef int32_t slot
        cdef int rc = _OK
        cdef bint changed = 0
        cdef Group *g
        lq_lock(&self._lock)
        try:
            slot = ids_lookup(&self._ids, self._groups.at, <PyObject *>gid, <uint32_t>h)
            if slot < 0:
                rc = self._add_paused(gid, h, &slot)
                changed = rc == _OK
            else:
                g = &self._groups.at[slot]
                if not g.paused:
                    g.paused = 1
                    self._paused += 1
                    if ready_contains(&self._ready, slot):
                        self._unready(slot)
                    changed = 1
        finally:
            lq_unlock(&self._lock)
        if rc != _OK:
            if rc == _FULL:
                raise OverflowError("the transport is full: too many messages or groups")
            raise MemoryError()
        return changed

    def resume(self, group_id: str) -> bool:
        """Lift a pause and a bury, and end a park; ``True`` if any was there.

        A parked or buried message is claimable at once, its attempt count
        unchanged (its next delivery is ``attempt + 1``).  A schedule stays:
        a group whose head is only scheduled returns ``False``.

        ``resume`` reads no clock: a park whose time ran out is still a park
        until an operation that reads the clock has seen it expire.  The
        group keeps its round-robin position; a group left without messages
        is forgotten.  ``False`` (and nothing created) for a group that does
        not exist.
        """
        cdef str gid = group_id if type(group_id) is str else _check_id(group_id, "group_id")
        cdef Py_hash_t h = hash(gid)
        cdef int32_t slot
        cdef bint lifted = 0, ready = 0
        cdef Group *g
        cdef object spent_id = None  # released after the lock
        lq_lock(&self._lock)
        try:
            slot = ids_lookup(&self._ids, self._groups.at, <PyObject *>gid, <uint32_t>h)
            if slot >= 0:
                g = &self._groups.at[slot]
                if g.paused or g.lock == _PARKED or self._groups.reason[slot] != NULL:
                    lifted = 1
                    if g.paused:
                        g.paused = 0
                        self._paused -= 1
                    if self._groups.reason[slot] != NULL:
                        self._unbury(slot)
                    if g.lock == _PARKED:
                        self._unlock(slot)  # the park ends; the attempt count stays
                    if g.count == 0:
                        self._idle -= 1
                        spent_id = self._forget(slot)
                    elif g.lock == _FREE and not ready_contains(&self._ready, slot):
                        self._make_ready(slot)
                        ready = 1
        finally:
            lq_unlock(&self._lock)
        if ready and self._wq.count:  # the group is claimable now
            self._serve_waiters(0.0, 0)
        return lifted

    def purge(self, group_id: str) -> int:
        """Remove every message of group ``group_id``; return how many.

        The leased or parked message goes too (its lease is no longer
        current: ``LeaseLost``), and the group is forgotten, pause and
        priority included.  The events are released after the transport's
        lock.  ``0`` for a group that does not exist.
        """
        cdef str gid = group_id if type(group_id) is str else _check_id(group_id, "group_id")
        cdef Py_hash_t h = hash(gid)
        cdef int32_t slot, removed = 0, i
        cdef PyObject **spent = NULL  # the events: dropped after the lock is released
        cdef object spent_id = None
        cdef bint nomem = 0
        lq_lock(&self._lock)
        try:
            slot = ids_lookup(&self._ids, self._groups.at, <PyObject *>gid, <uint32_t>h)
            if slot >= 0:
                removed = self._groups.at[slot].count
                if removed:
                    spent = <PyObject **>PyMem_Malloc(<size_t>removed * sizeof(PyObject *))
                    nomem = spent == NULL
                if not nomem:
                    spent_id = self._purge(slot, spent)
        finally:
            lq_unlock(&self._lock)
        if nomem:
            raise MemoryError()
        for i in range(removed):
            Py_XDECREF(spent[i])  # the events' __del__ may run here, outside the lock
        PyMem_Free(spent)
        return removed

    def set_priority(self, group_id: str, priority: int) -> bool:
        """Change group ``group_id``'s priority; ``False`` if there is no such group.

        The group keeps its round-robin position and its pause; no group is
        created.  ``True`` for any existing group, even when the priority
        does not change.
        """
        cdef str gid = group_id if type(group_id) is str else _check_id(group_id, "group_id")
        cdef int64_t prio = _priority(priority, "priority")
        cdef Py_hash_t h = hash(gid)
        cdef int32_t slot
        cdef int rc = _OK
        cdef bint moved = 0
        lq_lock(&self._lock)
        try:
            slot = ids_lookup(&self._ids, self._groups.at, <PyObject *>gid, <uint32_t>h)
            if slot >= 0 and self._ready.levels[self._groups.at[slot].level].priority != prio:
                rc = self._set_level(slot, prio)
                moved = rc == _OK and ready_contains(&self._ready, slot)
        finally:
            lq_unlock(&self._lock)
        if rc != _OK:
            raise MemoryError()
        if moved and self._wq.count:  # a waiting claim's floor may admit it now
            self._serve_waiters(0.0, 0)
        return slot >= 0

    def group(self, group_id: str) -> Optional[GroupInfo]:
        """What group ``group_id`` is doing now, or ``None`` if there is no such group.

        Reads the clock and applies expiry first, as ``stats`` does, so the
        state is as of ``now``: ``"buried"`` (``reason`` says why), else
        ``"leased"`` or ``"parked"`` while the head message's lease or park
        has not expired (paused or not), else ``"paused"``, ``"scheduled"``
        (the head was published with a delay and is not due: ``due_at``, also
        reported while paused) or ``"ready"``.
        """
        cdef str gid = group_id if type(group_id) is str else _check_id(group_id, "group_id")
        cdef Py_hash_t h = hash(gid)
        cdef double now = self._read_clock()
        cdef int32_t slot
        cdef GroupView view
        lq_lock(&self._lock)
        try:
            if now < self._time:
                now = self._time
            else:
                self._time = now
            if expiry_due(&self._expiry, now):
                self._expire(now)
            slot = ids_lookup(&self._ids, self._groups.at, <PyObject *>gid, <uint32_t>h)
            if slot >= 0:
                group_view(&self._groups, &self._messages, &self._ready, slot, &view)
        finally:
            lq_unlock(&self._lock)
        info = None
        if slot >= 0:
            try:
                info = _group_info(&view)
            finally:
                Py_XDECREF(view.gid)
                Py_XDECREF(view.holder)
                Py_XDECREF(view.reason)
        if self._wq.count:  # expiry may have freed groups
            self._serve_waiters(now, 1)
        return info

    def groups(self) -> List[GroupInfo]:
        """Every group now, in the order the groups were created: O(G).

        Reads the clock and applies expiry first, as ``group`` does.  A group
        forgotten and created again comes after the others.
        """
        cdef double now = self._read_clock()
        cdef GroupView *views = NULL
        cdef int32_t n = 0, k = 0, s
        cdef bint nomem = 0
        cdef list out
        lq_lock(&self._lock)
        try:
            n = self._groups.used
            if n:
                views = <GroupView *>PyMem_Malloc(<size_t>n * sizeof(GroupView))  # first, while nothing changed
                nomem = views == NULL
            if not nomem:
                if now < self._time:
                    now = self._time
                else:
                    self._time = now
                if expiry_due(&self._expiry, now):
                    self._expire(now)
                s = self._groups.oldest
                while s >= 0:
                    group_view(&self._groups, &self._messages, &self._ready, s, &views[k])
                    k += 1
                    s = self._groups.newer[s]
        finally:
            lq_unlock(&self._lock)
        if nomem:
            raise MemoryError()
        try:
            out = [_group_info(&views[s]) for s in range(k)]
        finally:
            for s in range(k):
                Py_XDECREF(views[s].gid)
                Py_XDECREF(views[s].holder)
                Py_XDECREF(views[s].reason)
            PyMem_Free(views)
        if self._wq.count:  # expiry may have freed groups
            self._serve_waiters(now, 1)
        return out

    # ------------------------------------------------------------ quarantine

    def bury(self, lease: Lease, reason: str = "") -> None:
        """Set a poison message aside without breaking its group's order.

        The lease's delivery ends (the lease stops being current), the
        message stays at the head of its group, and the group is *buried*:
        no claim serves it, whatever the floor, until ``resume`` (the same
        message again, its next delivery ``attempt + 1``) or ``skip`` (the
        message removed).  Its later messages wait behind it, in order;
        every other group goes on.  ``reason`` (a ``str``) is kept with the
        group (``group().reason``).  Reads no clock.  Raises ``LeaseLost``
        if the lease is not current; an expired lease whose message nobody
        has claimed since is accepted.
        """
        cdef int32_t slot
        cdef Group *g
        cdef str why
        _check_lease(lease)
        why = <str>reason if type(reason) is str else _check_reason(reason)
        lq_lock(&self._lock)
        try:
            slot = self._current(<Lease>lease)
            if slot >= 0:
                g = &self._groups.at[slot]
                if g.lock != _FREE:
                    self._unlock(slot)
                if ready_contains(&self._ready, slot):  # its lease ran out: expiry made it ready
                    self._unready(slot)
                g.open = 0
                Py_INCREF(why)
                self._groups.reason[slot] = <PyObject *>why  # NULL before: a current delivery is not buried
                self._buried += 1
        finally:
            lq_unlock(&self._lock)
        if slot < 0:
            raise LeaseLost(_lost_message(<Lease>lease))

    def skip(self, group_id: str) -> bool:
        """Remove group ``group_id``'s head message; ``True`` if it did.

        The head goes whatever its state -- ready, parked (the park ends),
        paused, buried, or under a lease that ran out (which stops being
        current) -- unless a lease that has not expired holds it.  A bury is
        lifted (a pause is not); the next message, if any, becomes the head
        and is claimable unless the group is paused.  A group left without
        messages is forgotten unless paused.  ``False``, and nothing
        changed, for an unknown group, an empty paused group, or a head
        under a live lease.  Reads the clock and applies expiry first, as
        ``group`` does.  The removed event is released after the lock.
        """
        cdef str gid = group_id if type(group_id) is str else _check_id(group_id, "group_id")
        cdef Py_hash_t h = hash(gid)
        cdef double now = self._read_clock()
        cdef int32_t slot
        cdef bint skipped = 0
        cdef Group *g
        cdef object spent = None      # dropped after the lock is released
        cdef object spent_id = None
        lq_lock(&self._lock)
        try:
            # a scheduled next head takes an expiry entry: room first (a MemoryError changes nothing)
            if self._marks.used and expiry_make_room(&self._expiry) != _OK:
                raise MemoryError()
            if now < self._time:
                now = self._time
            else:
                self._time = now
            if expiry_due(&self._expiry, now):
                self._expire(now)
            slot = ids_lookup(&self._ids, self._groups.at, <PyObject *>gid, <uint32_t>h)
            # after expiry a lock still set is live: a lease holds the head
            if slot >= 0 and self._groups.at[slot].count and self._groups.at[slot].lock != _LEASED:
                skipped = 1
                g = &self._groups.at[slot]
                if g.lock != _FREE:
                    self._unlock(slot)  # a park (or a schedule) ends with its message
                g.open = 0
                g.attempt = 0
                if self._groups.reason[slot] != NULL:
                    self._unbury(slot)
                if g.marks:
                    self._leave(self._messages.at[g.head].seq)
                spent = group_shift(&self._messages, self._events, g)
                if g.count == 0:
                    if g.paused:
                        self._idle += 1  # a paused group is kept, empty
                    else:
                        spent_id = self._forget(slot)
                else:
                    if g.key < 0:  # never claimed: placed by its oldest message, now the next one
                        if ready_contains(&self._ready, slot):
                            self._unready(slot)
                        g.key = self._messages.at[g.head].seq - _NEVER_CLAIMED
                    if self._settle(slot, now):
                        pass  # its next message is scheduled
                    elif not ready_contains(&self._ready, slot) and not g.paused:
                        self._make_ready(slot)
                if messages_sparse(&self._messages):
                    self._compact_messages()
        finally:
            lq_unlock(&self._lock)
        spent = None  # the event's __del__ may run here, outside the lock
        if self._wq.count:  # the next message, and whatever expiry freed
            self._serve_waiters(now, 1)
        return skipped

    def retry(self, group_id: str) -> bool:
        """The operator's "run it again from scratch": ``True`` if done.

        Reads the clock and applies expiry first, as ``skip`` does.  Unless
        the group is unknown, holds no message, or its head is under a lease
        that has not expired (then ``False``, nothing changed): the head's
        attempt count goes back to 0 (its next delivery is attempt 1), a
        bury is lifted, a park ends, and an expired lease's delivery is
        closed (that lease stops being current); a pause and a schedule
        stay, and so do the round-robin position and ``last_claimed_at``.
        The head is then claimable unless the group is paused or the head
        is scheduled, and wakes a waiting claim.
        """
        cdef str gid = group_id if type(group_id) is str else _check_id(group_id, "group_id")
        cdef Py_hash_t h = hash(gid)
        cdef double now = self._read_clock()
        cdef int32_t slot
        cdef bint retried = 0
        cdef Group *g
        lq_lock(&self._lock)
        try:
            if now < self._time:
                now = self._time
            else:
                self._time = now
            if expiry_due(&self._expiry, now):
                self._expire(now)
            slot = ids_lookup(&self._ids, self._groups.at, <PyObject *>gid, <uint32_t>h)
            # after expiry a lock still set is live: a lease holds the head
            if slot >= 0 and self._groups.at[slot].count and self._groups.at[slot].lock != _LEASED:
                retried = 1
                g = &self._groups.at[slot]
                if g.lock == _PARKED:
                    self._unlock(slot)  # the park ends
                g.open = 0  # an expired lease's delivery is closed
                g.attempt = 0
                if self._groups.reason[slot] != NULL:
                    self._unbury(slot)
                if g.lock == _FREE and not g.paused and not ready_contains(&self._ready, slot):
                    self._make_ready(slot)
        finally:
            lq_unlock(&self._lock)
        if self._wq.count:  # the head, and whatever expiry freed
            self._serve_waiters(now, 1)
        return retried

    def peek(self, group_id: str, max_count: int = 1) -> List[Message]:
        """The oldest ``max_count`` messages of group ``group_id``, head first.

        Whatever their state (ready, leased, parked, paused, buried,
        scheduled), as ``Message(seq, event, attempt, due_at, key)`` with the
        event by reference, ``attempt`` the deliveries so far, ``due_at`` the
        due time it was published with (``None`` without a delay) and ``key``
        its idempotency key (or ``None``); ``[]`` for an unknown group.
        ``max_count`` is an ``int >= 0``.  Reads no clock and changes
        nothing: O(1 + max_count).
        """
        cdef str gid = group_id if type(group_id) is str else _check_id(group_id, "group_id")
        cdef int64_t k = max_count if type(max_count) is int and 0 <= max_count <= 1 else _check_count(max_count)
        cdef Py_hash_t h = hash(gid)
        cdef int32_t slot, m, n = 0, i
        cdef int64_t attempt = 0
        cdef int64_t *seqs = NULL
        cdef PyObject **events = NULL  # owned references, taken under the lock
        cdef PyObject **keys = NULL    # the same (NULL: no key)
        cdef double *dues = NULL       # NaN: published without delay
        cdef MarkEntry *e
        cdef bint nomem = 0
        cdef list out
        cdef object message
        lq_lock(&self._lock)
        try:
            slot = ids_lookup(&self._ids, self._groups.at, <PyObject *>gid, <uint32_t>h)
            if slot >= 0 and k > 0:
                n = self._groups.at[slot].count
                if n > k:
                    n = <int32_t>k
            if n:
                seqs = <int64_t *>PyMem_Malloc(<size_t>n * (sizeof(int64_t) + 2 * sizeof(PyObject *) + sizeof(double)))
                nomem = seqs == NULL
                if nomem:
                    n = 0
                else:
                    dues = <double *>(seqs + n)
                    events = <PyObject **>(dues + n)
                    keys = events + n
                    attempt = self._groups.at[slot].attempt
                    m = self._groups.at[slot].head
                    for i in range(n):
                        seqs[i] = self._messages.at[m].seq
                        events[i] = lq_list_ref(self._events, m)
                        dues[i] = _NAN
                        keys[i] = NULL
                        if self._groups.at[slot].marks:
                            e = marks_find(&self._marks, seqs[i])
                            if e != NULL:
                                if e.has_due:
                                    dues[i] = e.due
                                if e.kt != NULL:
                                    keys[i] = PyTuple_GET_ITEM(<object>e.kt, 1)
                                    Py_XINCREF(keys[i])
                        m = self._messages.at[m].next
        finally:
            lq_unlock(&self._lock)
        if nomem:
            raise MemoryError()
        try:
            out = []
            for i in range(n):
                message = lq_new_record(_PeekedMessage, 5)
                _put(message, 0, seqs[i])
                _put(message, 1, <object>events[i])
                _put(message, 2, attempt if i == 0 else 0)  # only the head has been delivered
                _put(message, 3, dues[i] if dues[i] == dues[i] else None)
                _put(message, 4, <object>keys[i] if keys[i] != NULL else None)
                out.append(message)
        finally:
            for i in range(n):
                Py_XDECREF(events[i])
                Py_XDECREF(keys[i])
            PyMem_Free(seqs)
        return out

    # -------------------------------------------------------------- batches

    def publish_many(self, items: Iterable[Tuple[Any, ...]], *, delay: float = 0.0) -> List[int]:
        """Publish ``(group_id, event[, priority[, key]])`` items; return their seqs.

        Every item is checked before any is published (one bad item: its
        error, nothing published), then ``delay``; then they are published
        in order under one lock, leaving the transport exactly as publishing
        them one by one would (``publish(group_id, event, priority,
        delay=delay, key=key)``, with one clock reading for the lot).  An
        item whose key is held, or repeats the key of an earlier item of the
        batch in the same group, publishes nothing and gets the holder's
        seq; the new messages get consecutive seqs in item order.  Items
        must be tuples.
        """
        cdef list batch = list(items)  # our own copy: its items are read under the lock
        cdef Py_ssize_t n = len(batch), i
        cdef int64_t first = 0
        cdef int rc = _OK
        cdef list out = None
        cdef list kts = None  # by item: (group_id, key) or None, when some item has a key
        cdef dict seen = None
        cdef object item, k
        cdef double d = 0.0, now = 0.0, before
        cdef bint marked, read = 0
        cdef Py_ssize_t skipped = 0
        cdef PyObject *p
        cdef BatchPlan plan
        plan_init(&plan)
        try:
            if n and plan_alloc(&plan, n) != _OK:
                raise MemoryError()
            for i in range(n):  # every item checked before anything else
                p = PyList_GET_ITEM(batch, i)
                if (type(<object>p) is tuple and PyTuple_GET_SIZE(<object>p) == 2
                        and type(<object>PyTuple_GET_ITEM(<object>p, 0)) is str):
                    plan.item_prio[i] = 0  # the common case, at no cost
                else:
                    item = <object>p
                    gid = _check_item(item, &plan.item_prio[i])
                    if PyTuple_GET_SIZE(item) == 4:
                        k = _check_key(<object>PyTuple_GET_ITEM(item, 3))
                        if k is not None:
                            if kts is None:
                                kts = [None] * n
                            kts[i] = (gid, k)
                    if <PyObject *>gid != PyTuple_GET_ITEM(item, 0):
                        # a str subclass: the copy holds the exact str instead
                        batch[i] = (gid, <object>PyTuple_GET_ITEM(item, 1))
                # the group id, an exact str: its hash runs no user code
                plan.item_hash[i] = lq_cached_hash(PyTuple_GET_ITEM(<object>PyList_GET_ITEM(batch, i), 0))
            if delay is not 0.0:
                d = _check_duration(delay, "delay")
            if n == 0:
                return []
            if n >= INT32_MAX:
                raise OverflowError("the transport is full: too many messages or groups")
            marked = d > 0.0 or kts is not None
            out = [None] * n  # the result, filled under the lock before anything changes
            if marked:
                if plan_alloc_marked(&plan, n) != _OK:
                    raise MemoryError()
                if kts is not None:
                    seen = {}
                read = d > 0.0 or (kts is not None and self._window > 0.0)
                if read:
                    now = self._read_clock()
            lq_lock(&self._lock)
            try:
                if marked:
                    before = self._time
                    if read:
                        if now < self._time:
                            now = self._time
                        else:
                            self._time = now
                    rc = _NOMEM  # if it raises
                    try:
                        rc = self._publish_batch_marked(batch, &plan, kts, seen, d, now, out)
                    finally:
                        if rc != _OK:
                            self._time = before  # a call that raises does not move the time
                else:
                    rc = self._publish_batch(batch, &plan, &first, out)
            finally:
                lq_unlock(&self._lock)
            skipped = plan.skipped
        finally:
            plan_free(&plan)
        if rc != _OK:
            if rc == _FULL:
                raise OverflowError("the transport is full: too many messages or groups")
            raise MemoryError()
        if self._wq.count and skipped < n:  # a group may be claimable
            self._serve_waiters(now, read)
        return out

    def claim_many(self, worker_id: str, visibility: float, max_count: int, min_priority: int = 0) -> List[Lease]:
        """Up to ``max_count`` leases at one ``now``, one per group.

        Exactly what ``max_count`` successive ``claim`` calls at the same
        ``now`` would return, up to the first that finds nothing: one clock
        read and one lock for the lot.  ``max_count`` is an ``int >= 0``.
        Never waits.
        """
        cdef str wid
        cdef double vis, now, expires_at = 0.0
        cdef int64_t limit, minp, bound = 0, room
        cdef int32_t n = 0, i, built
        cdef int rc = _OK
        cdef Claimed *taken = NULL
        cdef Claimed *c
        cdef list out
        if type(worker_id) is str and not (<str>worker_id == _PARKED_STR):
            wid = <str>worker_id
        else:
            wid = _check_worker(worker_id)
        vis = _check_duration(visibility, "visibility")
        limit = _check_count(max_count)
        minp = _priority(min_priority, "min_priority")
        now = self._read_clock()
        lq_lock(&self._lock)
        try:
            # Each claim takes another group: at most one per group.  Room
            # for the records and the expiry entries first.
            bound = limit if limit < self._groups.used else self._groups.used
            # the expiry heap afterwards: at most one entry per group
            room = self._expiry.size + bound if self._expiry.size + bound < self._groups.used else self._groups.used
            if bound:
                taken = <Claimed *>PyMem_Malloc(<size_t>bound * sizeof(Claimed))
                if taken == NULL:
                    rc = _NOMEM
                elif vis != _INF:
                    rc = expiry_reserve(&self._expiry, room)
            if rc == _OK:
                if now < self._time:
                    now = self._time
                else:
                    self._time = now
                if expiry_due(&self._expiry, now):
                    self._expiry.floor = <int32_t>room  # keep the room made above
                    self._expire(now)
                    self._expiry.floor = 0
                expires_at = now + vis
                while n < bound and self._claim_next(<PyObject *>wid, now, expires_at, minp, &taken[n]):
                    n += 1
        finally:
            lq_unlock(&self._lock)
        if rc != _OK:
            PyMem_Free(taken)
            raise MemoryError()
        built = 0
        try:
            out = [None] * n
            while built < n:
                c = &taken[built]
                built += 1  # its references go to the lease, whatever happens
                out[built - 1] = _issue(c.seq, lq_steal(c.group_id), lq_steal(c.event), wid, expires_at,
                                        c.attempt, self._owner, c.slot, c.delivery)
        finally:
            for i in range(built, n):
                Py_XDECREF(taken[i].group_id)
                Py_XDECREF(taken[i].event)
            PyMem_Free(taken)
        if self._wq.count:  # expiries it did not claim; its leases may expire first
            self._serve_waiters(now, 1)
        return out

    def ack_many(self, leases: Iterable[Lease]) -> List[Lease]:
        """Ack every current lease, in order; return the ones that were not current.

        Every element is type-checked first (``TypeError``, nothing acked).
        A lease that is not current at its turn (acked before, re-delivered,
        a duplicate in the batch) is returned instead of raising
        ``LeaseLost``: the list holds the very objects passed in, in order.
        The events are released after the transport's lock.
        """
        cdef list batch = list(leases)
        cdef Py_ssize_t n = len(batch), i, kept = 0
        cdef PyObject **spent      # events and group ids (owned): dropped after the lock is released
        cdef uint8_t *lost
        cdef list out
        for lease in batch:
            _check_lease(lease)
        if n == 0:
            return []
        # One block: 2n references (an event and maybe a group id per lease), n flags.
        spent = <PyObject **>PyMem_Malloc(<size_t>n * (2 * sizeof(PyObject *) + 1))
        if spent == NULL:
            raise MemoryError()
        lost = <uint8_t *>(spent + 2 * n)
        try:
            lq_lock(&self._lock)
            try:
                if self._marks.used:  # a scheduled next head takes an expiry entry: room first
                    if expiry_reserve(&self._expiry, self._groups.used) != _OK:
                        raise MemoryError()  # nothing changed
                    self._expiry.floor = self._expiry.cap  # acks must not give it back meanwhile
                for i in range(n):
                    lost[i] = not self._ack_current(<Lease>PyList_GET_ITEM(batch, i), spent, &kept)
                self._expiry.floor = 0
                if messages_sparse(&self._messages):
                    self._compact_messages()
            finally:
                lq_unlock(&self._lock)
            out = [batch[i] for i in range(n) if lost[i]]
        finally:
            for i in range(kept):
                Py_XDECREF(spent[i])  # the events' __del__ may run here, outside the lock
            PyMem_Free(spent)
        if len(out) < n and self._wq.count:  # an ack may expose a group's next message
            self._serve_waiters(0.0, 0)
        return out

    def ack_and_claim(
        self, lease: Lease, worker_id: str, visibility: float, min_priority: int = 0
    ) -> Optional[Lease]:
        """``ack(lease)`` then ``claim(worker_id, visibility, min_priority)``, as one operation.

        Every argument is checked first (as ``ack`` and ``claim`` check
        them), then the clock is read once, then, under one lock: a lease
        that is not current raises ``LeaseLost`` and nothing changes (no
        ack, no claim); else the message is acked exactly as ``ack`` does
        and the claim runs at that ``now`` exactly as ``claim`` does (expiry
        first; the group just acked may be the one served, when it is the
        eligible group claimed least recently).  Returns the claim's
        ``Lease``, or ``None`` when no group is eligible (the ack stands).
        Never waits; waiting claims are served from what the claim leaves.
        The acked event is released after the lock.
        """
        cdef str wid
        cdef double vis, now, expires_at = 0.0
        cdef int64_t minp
        cdef int rc = _OK
        cdef bint acked = 0, claimed = 0
        cdef Py_ssize_t kept = 0, i
        cdef PyObject *spent[2]      # the event and maybe a group id (owned): dropped after the lock
        cdef Claimed taken
        cdef object result = None
        _check_lease(lease)
        if type(worker_id) is str and not (<str>worker_id == _PARKED_STR):
            wid = <str>worker_id
        else:
            wid = _check_worker(worker_id)
        vis = _check_duration(visibility, "visibility")
        minp = _priority(min_priority, "min_priority")
        now = self._read_clock()
        lq_lock(&self._lock)
        try:
            # Room for the claim's expiry entry first (and for a scheduled next
            # head's): a MemoryError changes nothing.
            if expiry_make_room(&self._expiry) != _OK or (
                    self._marks.used and expiry_reserve(&self._expiry, self._expiry.size + 2) != _OK):
                rc = _NOMEM
            else:
                self._expiry.floor = self._expiry.cap if self._marks.used else 0
                acked = self._ack_current(<Lease>lease, spent, &kept)
                if acked:
                    if now < self._time:
                        now = self._time
                    else:
                        self._time = now
                    if expiry_due(&self._expiry, now):
                        self._expire(now)
                    expires_at = now + vis
                    claimed = self._claim_next(<PyObject *>wid, now, expires_at, minp, &taken)
                self._expiry.floor = 0
                if acked:
                    if messages_sparse(&self._messages):
                        self._compact_messages()
        finally:
            lq_unlock(&self._lock)
        if rc != _OK:
            raise MemoryError()
        if not acked:
            raise LeaseLost(_lost_message(<Lease>lease))
        for i in range(kept):
            Py_XDECREF(spent[i])  # the event's __del__ may run here, outside the lock
        if claimed:  # the lease takes the claim's references (an error here drops them)
            result = _issue(taken.seq, lq_steal(taken.group_id), lq_steal(taken.event), wid, expires_at,
                            taken.attempt, self._owner, taken.slot, taken.delivery)
        if self._wq.count:  # served from what the claim left (the ack's next message, expiries)
            self._serve_waiters(now, 1)
        return result

    def __len__(self) -> int:
        """Messages held: ready + leased + parked."""
        cdef int64_t n
        lq_lock(&self._lock)
        n = self._messages.used
        lq_unlock(&self._lock)
        return n

    async def aclaim(
        self, worker_id: str, visibility: float, min_priority: int = 0, *, timeout: Optional[float] = None
    ) -> Optional[Lease]:
        """``claim`` for asyncio: wait in the running event loop, not a thread.

        The arguments are those of ``claim``, checked when the coroutine
        runs; ``timeout`` defaults to ``None`` (no deadline), ``0`` never
        waits.  A publish, ack or nack from any thread, or from another
        event loop, wakes it.  Cancelling the task (or ``asyncio.timeout``)
        ends the wait and leaves nothing leased on its behalf: a message that
        was about to go to it goes to the next waiting claim.
        """
        wid = _check_worker(worker_id)
        vis = _check_duration(visibility, "visibility")
        minp = _check_priority(min_priority, "min_priority")
        wait = _check_timeout(timeout)
        if wait == 0.0:
            return self.claim(wid, vis, minp)
        return await _aclaim_wait(self, wid, vis, minp, wait)

    def close(self) -> None:
        """End the waiting: every waiting claim returns ``None`` now, and from
        now on a claim with a non-zero ``timeout`` returns ``None`` at once.

        Everything else works as before (``timeout=0`` claims, publish, ack,
        nack...).  Idempotent; ``closed`` tells whether it was called.
        """
        cdef object chain
        lq_lock(&self._lock)
        self._closed = 1
        self._close_waiters()
        chain = self._chain
        self._chain = None
        self._poke = 0
        lq_unlock(&self._lock)
        wake_chain(chain)
        if self._timer is not None:
            self._timer.poke()  # it sees the transport closed and ends

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def __enter__(self: "_Self") -> "_Self":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        cdef int64_t messages, groups, buried_count
        lq_lock(&self._lock)
        messages = self._messages.used
        groups = self._groups.used
        buried_count = self._buried
        lq_unlock(&self._lock)
        buried = f" buried={buried_count}" if buried_count else ""
        return (
            f"<{type(self).__module__}.{type(self).__qualname__} "
            f"messages={messages} groups={groups}{buried}>"
        )

    # ------------------------------------------------------------ internals

    cdef inline double _now(self) except? -1.0:
        """``clock()``, checked; called before the lock is taken."""
        if self._wall_clock:
            return lq_wall_time()
        value = self._clock()
        if type(value) is float and <double>value - <double>value == 0.0:
            return <double>value
        return _check_time(value)

    cdef double _read_clock(self) except? -1.0:
        """``_now`` for everything but the Part 1 operations (the control
        plane, the batches, the waiting paths): a copy, so that the compiler
        keeps inlining ``_now`` into those (it stops when ``_now`` has more
        callers)."""
        if self._wall_clock:
            return lq_wall_time()
        value = self._clock()
        if type(value) is float and <double>value - <double>value == 0.0:
            return <double>value
        return _check_time(value)

    # Everything below runs with self._lock held.

    cdef inline int32_t _current(self, Lease lease) noexcept:
        """The lease's group slot if the lease is current, else -1."""
        cdef int32_t slot = lease._slot
        cdef Group *g
        if lease._owner is not self._owner:
            return -1
        if slot < 0 or slot >= self._groups.cap or self._groups.at[slot].count == 0 or (
            self._messages.at[self._groups.at[slot].head].seq != lease._cseq
        ):
            # Not at the slot it was issued for: acked, or the group moved
            # when the group array was compacted.  Find the group by id (an
            # issued lease's group_id is an exact str: no user code).
            slot = ids_lookup(
                &self._ids, self._groups.at, <PyObject *>lease.group_id, <uint32_t>lq_str_hash(lease.group_id),
            )
            if (slot < 0 or self._groups.at[slot].count == 0  # an empty paused group
                    or self._messages.at[self._groups.at[slot].head].seq != lease._cseq):
                return -1
        g = &self._groups.at[slot]
        if not g.open or g.key != lease._cdelivery:  # fencing by delivery: its claim is the latest
            return -1
        return slot

    # -- publishing

    cdef int _publish_slow(
        self, str gid, Py_hash_t h, object event, int64_t prio, int32_t found, int64_t *seq_out,
    ) except -1:
        """publish() when a group or a message slot must be created.

        Every allocation comes first, then the commit, which cannot fail.
        Returns a result code (_OK, _NOMEM, _FULL).
        """
        cdef int32_t slot, m, lv = -1
        cdef int rc
        if self._messages.free < 0:
            rc = messages_grow(&self._messages, self._events)
            if rc != _OK:
                return rc
        if found < 0:
            rc = self._reserve_group(prio, &lv)
            if rc != _OK:
                return rc
            # --- commit: nothing below can fail
            slot = self._new_group(gid, h, prio, lv)
        else:
            slot = found
        self._seq += 1
        seq_out[0] = self._seq
        m = message_add(&self._messages, self._events, self._seq, event)
        if self._groups.at[slot].count:
            group_append(&self._messages, &self._groups.at[slot], m)
        else:  # a new group, or an empty paused one
            if found >= 0:
                self._idle -= 1
            self._refill(slot, m, self._seq)
            if not self._groups.at[slot].paused:
                self._make_ready(slot)
        return _OK

    cdef object _publish_ext(self, str gid, object event, int64_t prio, object delay, object key):
        """``publish`` with a ``delay`` or a ``key`` argument (checked here)."""
        cdef double d = _check_duration(delay, "delay")
        cdef object k = _check_key(key)
        cdef object kt = None
        cdef bint read = d > 0.0 or (k is not None and self._window > 0.0)
        cdef double now = 0.0, before
        cdef int64_t seq = 0
        cdef int rc = _NOMEM
        cdef Py_hash_t h
        if k is None and d == 0.0:
            return self.publish(gid, event, prio)  # exactly the publish of Part 1
        if k is not None:
            kt = (gid, k)  # built before the lock: the key dict's key
        if read:
            now = self._read_clock()
        h = hash(gid)  # exact str: no user code
        lq_lock(&self._lock)
        try:
            before = self._time
            if read:
                if now < self._time:
                    now = self._time
                else:
                    self._time = now
            try:
                rc = self._publish_marked(gid, h, event, prio, d, kt, now, &seq)
            finally:
                if rc != _OK and rc != _HELD:
                    self._time = before  # a call that raises does not move the time
        finally:
            lq_unlock(&self._lock)
        if rc == _HELD:
            return seq  # nothing published, nobody woken
        if rc != _OK:
            if rc == _FULL:
                raise OverflowError("the transport is full: too many messages or groups")
            raise MemoryError()
        if self._wq.count:  # a scheduled head arms the expiry timer
            self._serve_waiters(now, read)
        return seq

    cdef int _publish_marked(
        self, str gid, Py_hash_t h, object event, int64_t prio, double d, object kt, double now, int64_t *seq_out,
    ) except -1:
        """``publish`` of a message with a due time (``d > 0``) or a key
        (``kt``: ``(gid, key)``) at ``now`` (the transport's time when the
        clock was read).  Allocations first (the key dict included), then the
        commit.  A result code; ``_HELD`` with the holder's seq when the key
        is held."""
        cdef int32_t slot, m, lv = -1
        cdef int rc
        cdef int64_t seq, holder
        cdef double due = now + d
        cdef bint window = kt is not None and self._window > 0.0
        cdef bint empty, found
        cdef Group *g
        cdef MarkEntry *e
        if kt is not None:
            if window:
                self._prune_keys(now)
            holder = self._holder(kt, now)
            if holder:
                seq_out[0] = holder
                return _HELD
        slot = ids_lookup(&self._ids, self._groups.at, <PyObject *>gid, <uint32_t>h)
        found = slot >= 0
        empty = not found or self._groups.at[slot].count == 0
        if self._messages.free < 0:
            rc = messages_grow(&self._messages, self._events)
            if rc != _OK:
                return rc
        if slot < 0:
            rc = self._reserve_group(prio, &lv)
            if rc != _OK:
                return rc
        if marks_reserve(&self._marks, 1) != _OK:
            return _NOMEM
        if d > 0.0:
            if empty and expiry_make_room(&self._expiry) != _OK:
                return _NOMEM
            if due != _INF:
                if self._sched.size > 2 * self._scheduled + 64:
                    sched_compact(&self._sched, &self._marks)
                if sched_reserve(&self._sched, 1) != _OK:
                    return _NOMEM
        if window and ring_reserve(&self._ring, 1) != _OK:
            return _NOMEM
        seq = self._seq + 1
        if kt is not None:  # may raise MemoryError: nothing else has changed
            self._keys[kt] = seq
            if window:
                try:
                    self._key_at[kt] = now
                except BaseException:
                    del self._keys[kt]  # it held nothing (a key held returned above)
                    raise
        # --- commit: nothing below can fail
        if slot < 0:
            slot = self._new_group(gid, h, prio, lv)
        self._seq = seq
        seq_out[0] = seq
        m = message_add(&self._messages, self._events, seq, event)
        g = &self._groups.at[slot]
        if g.count:
            group_append(&self._messages, g, m)
        else:  # a new group, or an empty paused one
            if found:
                self._idle -= 1
            self._refill(slot, m, seq)
        e = marks_insert(&self._marks, seq)
        if d > 0.0:
            e.has_due = 1
            e.due = due
            g.marks |= _M_DUE
            self._scheduled += 1
            if due != _INF:
                sched_push(&self._sched, due, seq)
        if kt is not None:
            Py_INCREF(kt)
            e.kt = <PyObject *>kt
            g.marks |= _M_KEY
            if window:
                ring_push(&self._ring, now, seq, <PyObject *>kt)
        if empty and not self._settle(slot, now) and not g.paused:
            self._make_ready(slot)
        return _OK

    cdef int64_t _holder(self, object kt, double now) except -1:
        """The seq of the message holding key ``kt`` (``(gid, key)``) at
        ``now``, or 0 if it is not held."""
        cdef PyObject *v = PyDict_GetItem(self._keys, kt)
        cdef PyObject *at
        cdef int64_t seq
        if v == NULL:
            return 0
        seq = <int64_t><object>v
        if marks_find(&self._marks, seq) != NULL:
            return seq  # its message is held
        if self._window > 0.0:
            at = PyDict_GetItem(self._key_at, kt)
            if at != NULL and now < PyFloat_AS_DOUBLE(<object>at) + self._window:
                return seq  # gone, but within the window
        return 0

    cdef int _prune_keys(self, double now) except -1:
        """Drop the keys whose window has passed at ``now`` and whose message
        is gone, from the front of the ring (``dedup_window > 0``)."""
        cdef RingEntry *e
        cdef PyObject *v
        while self._ring.size and self._ring.entries[self._ring.head].at + self._window <= now:
            e = &self._ring.entries[self._ring.head]
            self._ring.head = (self._ring.head + 1) % self._ring.cap
            self._ring.size -= 1
            v = PyDict_GetItem(self._keys, <object>e.kt)
            if v != NULL and <int64_t><object>v == e.seq and marks_find(&self._marks, e.seq) == NULL:
                PyDict_DelItem(self._keys, <object>e.kt)
                PyDict_DelItem(self._key_at, <object>e.kt)
            Py_XDECREF(e.kt)  # a tuple of exact str: no user code
            e.kt = NULL
        return 0

    cdef void _leave(self, int64_t seq) noexcept:
        """Message ``seq`` leaves the transport (ack, skip, purge): out of
        the mark table, out of the scheduled count, its key released unless
        the window still holds it."""
        cdef MarkEntry *e = marks_find(&self._marks, seq)
        cdef PyObject *kt
        cdef PyObject *at
        if e == NULL:
            return
        if e.has_due and e.due >= self._sched_at:  # still counted (its heap entry is skipped when popped)
            self._scheduled -= 1
        kt = e.kt
        marks_delete(&self._marks, e)
        if kt != NULL:
            if self._window > 0.0:
                at = PyDict_GetItem(self._key_at, <object>kt)
                if at == NULL or self._time >= PyFloat_AS_DOUBLE(<object>at) + self._window:
                    self._drop_key(kt)
                # else the ring drops it once the window has passed
            else:
                self._drop_key(kt)
            Py_DECREF(<object>kt)  # a tuple of exact str: no user code

    cdef void _drop_key(self, PyObject *kt) noexcept:
        """Forget key ``kt`` in the key dicts (where it is: deleting allocates nothing)."""
        if PyDict_GetItem(self._keys, <object>kt) != NULL:
            PyDict_DelItem(self._keys, <object>kt)
        if PyDict_GetItem(self._key_at, <object>kt) != NULL:
            PyDict_DelItem(self._key_at, <object>kt)

    cdef void _sweep_scheduled(self, double now) noexcept:
        """The delayed messages whose due passed (``due < now``) stop counting
        as scheduled (those gone already were discounted when they left)."""
        while self._sched.size and self._sched.entries[0].due < now:
            if marks_find(&self._marks, sched_pop(&self._sched)) != NULL:
                self._scheduled -= 1
        self._sched_at = now

    cdef bint _settle(self, int32_t slot, double t) noexcept:
        """Group ``slot``'s head just became its head (at transport time
        ``t``): if it is scheduled (``due >= t``) the group is locked as
        ``_SCHED`` until its due (out of the ready heap, in the expiry heap,
        which has room).  Whether it is."""
        cdef Group *g = &self._groups.at[slot]
        cdef MarkEntry *e
        if not (g.marks & _M_DUE):
            return 0
        e = marks_find(&self._marks, self._messages.at[g.head].seq)
        if e == NULL or not e.has_due or e.due < t:
            return 0
        if ready_contains(&self._ready, slot):
            self._unready(slot)
        g.lock = _SCHED
        g.expires_at = e.due
        if e.due != _INF:
            expiry_push(&self._expiry, slot, e.due)
        return 1

    cdef int _reserve_group(self, int64_t prio, int32_t *lv) except -1:
        """Allocate what one more group of priority ``prio`` needs (a group
        slot, room in its level and in the id table); ``lv[0]`` as
        ``ready_reserve_group`` sets it.  A result code."""
        cdef int rc
        if self._groups.free < 0:
            rc = groups_grow(&self._groups, self._group_ids, &self._ready, &self._expiry)
            if rc != _OK:
                return rc
        rc = ready_reserve_group(&self._ready, prio, lv)
        if rc != _OK:
            return rc
        return ids_reserve(&self._ids, self._groups.used + 1)

    cdef int32_t _new_group(self, str gid, Py_hash_t h, int64_t prio, int32_t lv) noexcept:
        """Enter group ``gid`` (allocations done): no message yet, never
        claimed, not ready.  Its slot."""
        cdef int32_t slot = groups_add(&self._groups, self._group_ids, &self._ids, gid, <uint32_t>h)
        cdef Group *g = &self._groups.at[slot]
        g.key = -_NEVER_CLAIMED  # keyed by its first message when that comes
        g.attempt = 0
        g.expires_at = 0.0
        g.claimed_at = 0.0
        g.head = -1
        g.tail = -1
        g.count = 0
        g.level = ready_add_group(&self._ready, prio, lv)
        g.lock = _FREE
        g.open = 0
        g.paused = 0
        g.marks = 0
        self._ready.pos[slot] = -1
        self._expiry.pos[slot] = -1
        return slot

    cdef void _refill(self, int32_t slot, int32_t m, int64_t seq) noexcept:
        """Message slot ``m`` (seq ``seq``) is the first of an empty group:
        a never-claimed group is placed by it, its marks start afresh.  The
        caller makes it ready (unless paused or scheduled)."""
        cdef Group *g = &self._groups.at[slot]
        g.head = m
        g.tail = m
        g.count = 1
        g.marks = 0
        if g.key < 0:
            g.key = seq - _NEVER_CLAIMED

    cdef int _add_paused(self, str gid, Py_hash_t h, int32_t *slot) except -1:
        """Create group ``gid`` for ``pause``: priority 0, no message, paused.
        A result code; the slot in ``slot[0]``."""
        cdef int32_t lv = -1
        cdef int rc = self._reserve_group(0, &lv)
        if rc != _OK:
            return rc
        slot[0] = self._new_group(gid, h, 0, lv)
        self._groups.at[slot[0]].paused = 1
        self._paused += 1
        self._idle += 1
        return _OK

    cdef int _publish_batch(self, list batch, BatchPlan *plan, int64_t *first, list out) except -1:
        """``publish_many`` under the lock (``batch.pxi``): look the
        groups up, plan the new ones, allocate everything the batch needs,
        then publish each item as ``publish`` would.  A result code; the
        first seq in ``first[0]``."""
        cdef Py_ssize_t n = len(batch), i
        cdef int32_t j, slot, m
        cdef int rc
        cdef Group *g
        for i in range(n):
            slot = ids_lookup(&self._ids, self._groups.at, plan_item_id(batch, i), <uint32_t>plan.item_hash[i])
            if slot < 0:
                slot = -1 - plan_new_group(plan, batch, i)
            plan.item_slot[i] = slot
        if plan.groups:
            rc = groups_reserve(&self._groups, self._group_ids, &self._ready, &self._expiry, plan.groups)
            if rc != _OK:
                return rc
            rc = ids_reserve(&self._ids, self._groups.used + plan.groups)
            if rc != _OK:
                return rc
            rc = ready_reserve_levels(&self._ready, plan.new_prio, plan.new_count, plan.levels)
            if rc != _OK:
                return rc
        rc = messages_reserve(&self._messages, self._events, n)
        if rc != _OK:
            return rc
        for i in range(n):  # the result's ints (may raise MemoryError: nothing has changed)
            out[i] = self._seq + 1 + i
        # --- commit: nothing below can fail
        first[0] = self._seq + 1
        for i in range(n):
            slot = plan.item_slot[i]
            if slot < 0:  # a new group: created by its first item
                j = -1 - slot
                slot = plan.group_slot[j]
                if slot < 0:
                    slot = self._new_group(
                        <str>plan_item_id(batch, i), plan.item_hash[i], plan.item_prio[i],
                        ready_find_level(&self._ready, plan.item_prio[i]),
                    )
                    plan.group_slot[j] = slot
            self._seq += 1
            m = message_add(
                &self._messages, self._events, self._seq, <object>PyTuple_GET_ITEM(<object>PyList_GET_ITEM(batch, i), 1),
            )
            g = &self._groups.at[slot]
            if g.count:
                group_append(&self._messages, g, m)
            else:  # a new group, or an empty paused one
                if plan.item_slot[i] >= 0:
                    self._idle -= 1
                self._refill(slot, m, self._seq)
                if not g.paused:
                    self._make_ready(slot)
        return _OK

    cdef int _publish_batch_marked(
        self, list batch, BatchPlan *plan, list kts, dict seen, double d, double now, list out,
    ) except -1:
        """``publish_many`` with a delay (``d > 0``) or keys (``kts``: by
        item, ``(group_id, key)`` or None), under the lock at ``now``: the
        items whose key is held or repeated skipped, then as
        ``_publish_batch``, each message marked.  A result code; every
        item's seq in ``plan.item_seq``."""
        cdef Py_ssize_t n = len(batch), i, done = 0
        cdef int32_t j, slot, m
        cdef int64_t seq, holder, fresh, keyed = 0
        cdef double due = now + d
        cdef bint window = kts is not None and self._window > 0.0, refilled
        cdef int rc
        cdef Group *g
        cdef MarkEntry *e
        cdef PyObject *kt = NULL
        cdef PyObject *v
        if kts is not None:
            if window:
                self._prune_keys(now)
            for i in range(n):
                kt = PyList_GET_ITEM(kts, i)
                if kt == <PyObject *>None:
                    continue
                holder = self._holder(<object>kt, now)
                if holder:
                    plan.item_skip[i] = 1
                    plan.item_seq[i] = holder
                    plan.skipped += 1
                    continue
                v = PyDict_GetItem(seen, <object>kt)
                if v != NULL:  # an earlier item of the batch has it
                    plan.item_skip[i] = 1
                    plan.item_seq[i] = -1 - <int64_t><object>v
                    plan.skipped += 1
                    continue
                seen[<object>kt] = i
                keyed += 1
        for i in range(n):
            if plan.item_skip[i]:
                continue
            slot = ids_lookup(&self._ids, self._groups.at, plan_item_id(batch, i), <uint32_t>plan.item_hash[i])
            if slot < 0:
                slot = -1 - plan_new_group(plan, batch, i)
            plan.item_slot[i] = slot
        fresh = n - plan.skipped
        if fresh == 0:  # nothing published, nothing changed
            for i in range(n):
                out[i] = plan.item_seq[i]
            return _OK
        if plan.groups:
            rc = groups_reserve(&self._groups, self._group_ids, &self._ready, &self._expiry, plan.groups)
            if rc != _OK:
                return rc
            rc = ids_reserve(&self._ids, self._groups.used + plan.groups)
            if rc != _OK:
                return rc
            rc = ready_reserve_levels(&self._ready, plan.new_prio, plan.new_count, plan.levels)
            if rc != _OK:
                return rc
        rc = messages_reserve(&self._messages, self._events, fresh)
        if rc != _OK:
            return rc
        if marks_reserve(&self._marks, fresh) != _OK:
            return _NOMEM
        if d > 0.0:
            # each group's new head may be scheduled: one entry per group at most
            if expiry_reserve(&self._expiry, self._groups.used + plan.groups) != _OK:
                return _NOMEM
            if due != _INF:
                if self._sched.size > 2 * self._scheduled + 64:
                    sched_compact(&self._sched, &self._marks)
                if sched_reserve(&self._sched, fresh) != _OK:
                    return _NOMEM
        if window and ring_reserve(&self._ring, keyed) != _OK:
            return _NOMEM
        seq = self._seq
        for i in range(n):
            if not plan.item_skip[i]:
                seq += 1
                plan.item_seq[i] = seq
        for i in range(n):  # a repeated key: the seq its first item gets
            if plan.item_seq[i] < 0:
                plan.item_seq[i] = plan.item_seq[-1 - plan.item_seq[i]]
        # The key dicts and the result's ints (may raise MemoryError: the keys
        # are taken back, nothing else has changed).
        try:
            if kts is not None:
                for i in range(n):
                    kt = PyList_GET_ITEM(kts, i)
                    if plan.item_skip[i] or kt == <PyObject *>None:
                        done = i + 1
                        continue
                    done = i + 1  # (a failed insert leaves nothing to take back)
                    self._keys[<object>kt] = plan.item_seq[i]
                    if window:
                        self._key_at[<object>kt] = now
            for i in range(n):
                out[i] = plan.item_seq[i]
        except BaseException:
            for i in range(done):
                kt = PyList_GET_ITEM(kts, i)
                if not plan.item_skip[i] and kt != <PyObject *>None:
                    self._drop_key(kt)  # it held nothing: its holder would have skipped it
            raise
        # --- commit: nothing below can fail
        for i in range(n):
            if plan.item_skip[i]:
                continue
            slot = plan.item_slot[i]
            if slot < 0:  # a new group: created by its first item
                j = -1 - slot
                slot = plan.group_slot[j]
                if slot < 0:
                    slot = self._new_group(
                        <str>plan_item_id(batch, i), plan.item_hash[i], plan.item_prio[i],
                        ready_find_level(&self._ready, plan.item_prio[i]),
                    )
                    plan.group_slot[j] = slot
            seq = plan.item_seq[i]
            self._seq = seq
            m = message_add(
                &self._messages, self._events, seq, <object>PyTuple_GET_ITEM(<object>PyList_GET_ITEM(batch, i), 1),
            )
            g = &self._groups.at[slot]
            refilled = g.count == 0
            if refilled:  # a new group, or an empty paused one
                if plan.item_slot[i] >= 0:
                    self._idle -= 1
                self._refill(slot, m, seq)
            else:
                group_append(&self._messages, g, m)
            kt = PyList_GET_ITEM(kts, i) if kts is not None else <PyObject *>None
            if d > 0.0 or kt != <PyObject *>None:
                e = marks_insert(&self._marks, seq)
            if d > 0.0:
                e.has_due = 1
                e.due = due
                g.marks |= _M_DUE
                self._scheduled += 1
                if due != _INF:
                    sched_push(&self._sched, due, seq)
            if kt != <PyObject *>None:
                Py_INCREF(<object>kt)
                e.kt = kt
                g.marks |= _M_KEY
                if window:
                    ring_push(&self._ring, now, seq, kt)
            if refilled and not self._settle(slot, now) and not g.paused:
                self._make_ready(slot)
        return _OK

    # -- claiming and acking in batches

    cdef bint _claim_next(
        self, PyObject *wid, double now, double expires_at, int64_t minp, Claimed *out,
    ) noexcept:
        """One claim of ``claim_many`` or ``ack_and_claim`` (expiry applied,
        room made): records the message leased in ``out``; false when no
        group is eligible."""
        cdef int32_t lv = ready_best(&self._ready, minp), slot
        cdef Group *g
        if lv < 0:
            return 0
        slot = ready_pop(&self._ready, lv)
        g = &self._groups.at[slot]
        self._claims += 1
        g.key = self._claims
        g.claimed_at = now
        g.attempt += 1
        g.open = 1
        g.lock = _LEASED
        g.expires_at = expires_at
        self._leased += 1
        if expires_at != _INF:
            expiry_push(&self._expiry, slot, expires_at)
        group_hold(&self._groups, slot, wid)
        out.seq = self._messages.at[g.head].seq
        out.attempt = g.attempt
        out.delivery = self._claims
        out.slot = slot
        out.event = lq_list_ref(self._events, g.head)
        out.group_id = g.gid
        Py_XINCREF(out.group_id)
        return 1

    cdef inline bint _ack_current(self, Lease lease, PyObject **spent, Py_ssize_t *kept) noexcept:
        """One ack of ``ack_many`` (or ``ack_and_claim``): false if the lease is not current.  The
        event (and the id of a group forgotten) go to ``spent[kept[0]...]``
        (owned references), dropped by the caller after the lock."""
        cdef int32_t slot = self._current(lease)
        if slot < 0:
            return 0
        self._ack_slot(slot, spent, kept)  # the caller made expiry room when marks exist
        return 1

    cdef inline int _ack_slot(self, int32_t slot, PyObject **spent, Py_ssize_t *kept) noexcept:
        """Ack the head of group ``slot`` (its delivery current): as
        ``_ack_current``.  A result code: _NOMEM (nothing changed) when a
        scheduled next head could need an expiry entry there is no room for."""
        cdef Group *g = &self._groups.at[slot]
        if g.marks & _M_DUE and expiry_make_room(&self._expiry) != _OK:
            return _NOMEM
        if g.lock != _FREE:
            self._unlock(slot)
        g.open = 0
        g.attempt = 0
        if g.marks:
            self._leave(self._messages.at[g.head].seq)
        spent[kept[0]] = group_take(&self._messages, self._events, g)
        kept[0] += 1
        if g.count == 0:
            if g.paused:
                self._idle += 1  # a paused group is kept, empty
            else:
                spent[kept[0]] = groups_forget_ref(
                    &self._groups, self._group_ids, &self._ids, &self._ready, &self._expiry, slot,
                )
                kept[0] += 1
        elif g.marks & _M_DUE and self._settle(slot, self._time):
            pass  # its next message is scheduled
        elif not ready_contains(&self._ready, slot) and not g.paused:
            self._make_ready(slot)
        return _OK

    # -- ready heaps and the level treap (ready.pxi)

    cdef inline void _make_ready(self, int32_t slot) noexcept:
        """Put a free group in its level's heap under its round-robin key."""
        cdef Group *g = &self._groups.at[slot]
        ready_push(&self._ready, slot, g.level, g.key)

    cdef inline void _unready(self, int32_t slot) noexcept:
        """Take a ready group out of its level's heap."""
        ready_remove(&self._ready, slot, self._groups.at[slot].level)

    cdef int _set_level(self, int32_t slot, int64_t prio) noexcept:
        """Move group ``slot`` to the level of ``prio`` (a new one if need be),
        keeping its round-robin key and, if it is ready, its readiness.  A
        result code: the allocation comes first."""
        cdef int32_t lv = -1, old = self._groups.at[slot].level
        cdef bint ready
        cdef int rc = ready_reserve_group(&self._ready, prio, &lv)
        if rc != _OK:
            return rc
        ready = ready_contains(&self._ready, slot)
        if ready:
            ready_remove(&self._ready, slot, old)
        # The new level first: a new one takes the unused level reserved
        # above, before the old one (if emptied) is given back.
        lv = ready_add_group(&self._ready, prio, lv)
        ready_drop_group(&self._ready, old)
        self._groups.at[slot].level = lv
        if ready:
            self._make_ready(slot)
        return _OK

    # -- lock state and the expiry heap (expiry.pxi)

    cdef inline void _unlock(self, int32_t slot) noexcept:
        """Release the group's lock and drop its expiry entry."""
        cdef Group *g = &self._groups.at[slot]
        if g.lock == _LEASED:
            self._leased -= 1
        elif g.lock == _PARKED:
            self._parked -= 1
        g.lock = _FREE
        expiry_remove(&self._expiry, slot)

    cdef void _expire(self, double now) noexcept:
        """Free every lock with ``expires_at < now``; their groups become ready."""
        cdef int32_t slot
        while expiry_due(&self._expiry, now):
            slot = expiry_top(&self._expiry)
            self._unlock(slot)  # the delivery (open) stays current
            if not self._groups.at[slot].paused:
                self._make_ready(slot)

    # -- storage (storage.pxi)
    #
    # Methods rather than calls of the storage functions in place: gcc
    # inlines a static function called once, and these rarely run ones
    # inlined into ``ack`` cost it ~20 instructions on every call.

    cdef object _forget(self, int32_t slot):
        """Drop an emptied group; returns its id (released after unlock)."""
        return groups_forget(&self._groups, self._group_ids, &self._ids, &self._ready, &self._expiry, slot)

    cdef void _compact_messages(self) noexcept:
        """Renumber live messages into smaller arrays (``messages_compact``)."""
        messages_compact(&self._messages, self._events, &self._groups)

    cdef inline void _unbury(self, int32_t slot) noexcept:
        """Lift group ``slot``'s bury (it is buried): its reason, an exact
        str, is released (no user code)."""
        Py_XDECREF(self._groups.reason[slot])
        self._groups.reason[slot] = NULL
        self._buried -= 1

    cdef object _purge(self, int32_t slot, PyObject **spent):
        """Drop group ``slot`` and its messages, their events moved to
        ``spent`` (room for ``count``): the caller releases them after the
        lock, and the group's id, returned."""
        cdef Group *g = &self._groups.at[slot]
        cdef int32_t m
        if g.lock != _FREE:
            self._unlock(slot)
        g.open = 0
        g.attempt = 0
        if self._groups.reason[slot] != NULL:
            self._unbury(slot)
        if g.marks:
            m = g.head
            while m >= 0 and self._marks.used:
                self._leave(self._messages.at[m].seq)
                m = self._messages.at[m].next
        if g.paused:
            g.paused = 0
            self._paused -= 1
            if g.count == 0:
                self._idle -= 1
        group_clear(&self._messages, self._events, g, spent)
        gid = self._forget(slot)
        if messages_sparse(&self._messages):
            self._compact_messages()
        return gid

    # -- waiting claims (waiters.pxi; waiting.py is the other side)

    cdef object _claim_wait(self, str wid, double vis, int64_t minp, double wait):
        """``claim`` with a non-zero ``timeout``: ``_waiting.claim_wait``."""
        return _claim_wait(self, wid, vis, minp, wait)

    cdef int _serve_waiters(self, double now, bint have_now) except -1:
        """THE ENTRY POINT (see waiters.pxi): serve the waiting claims.

        Call it *after* releasing the lock, when ``self._wq.count``, at the
        end of any operation that may have made a message claimable or that
        read the clock; ``now`` is that operation's clock reading when
        ``have_now``, else the clock is read here.  If that read fails,
        nothing is handed over and the expiry timer is asked to look for
        itself: the operation does not fail.
        """
        cdef object chain
        cdef object error = None
        cdef bint poke
        if not have_now:
            try:
                now = self._read_clock()
                have_now = 1
            except BaseException as exc:
                error = exc
        lq_lock(&self._lock)
        if self._wq.count:
            if have_now:
                if now < self._time:
                    now = self._time
                else:
                    self._time = now
                self._serve_locked(now)
            else:
                self._timer_at = -_INF  # the timer looks now, with its own reading
                self._poke = 1
        chain = self._chain
        self._chain = None
        poke = self._poke
        self._poke = 0
        lq_unlock(&self._lock)
        self._wake(chain, poke)
        if error is not None and not isinstance(error, Exception):
            raise error  # KeyboardInterrupt and the like: not swallowed
        return 0

    cdef int _wake(self, object chain, bint poke) except -1:
        """Run the promised wakes and poke the timer (after the lock is released)."""
        wake_chain(chain)
        if poke:
            _poke_timer(self)
        return 0

    # Everything below runs with self._lock held.

    cdef int _serve_locked(self, double now) noexcept:
        """Hand every claimable message to the waiting claim it belongs to
        (``now``: the transport time), then arm the timer.  _NOMEM if the
        expiry heap could not grow (hand-offs stop there)."""
        cdef int32_t i
        cdef _Waiter best, head
        cdef int rc = _OK
        if self._closed:
            self._close_waiters()
            return _OK
        if expiry_due(&self._expiry, now):
            self._expire(now)
        while self._wq.count:
            best = None
            for i in range(self._wq.n):
                if ready_best(&self._ready, self._wq.q[i].floor) < 0:
                    break  # nor does any higher floor admit a ready group
                head = <_Waiter>self._wq.q[i].head
                if best is None or head.arrival < best.arrival:
                    best = head
            if best is None:
                break
            if expiry_make_room(&self._expiry) != _OK:
                rc = _NOMEM
                break
            self._hand_off(best, ready_best(&self._ready, best.floor), now)
            if self._promise(best):
                self._wakeups[0] += 1
        self._arm_timer()
        return rc

    cdef void _hand_off(self, _Waiter w, int32_t lv, double now) noexcept:
        """Claim for ``w`` (queued) the top group of level ``lv`` as ``claim``
        would, keep the lease and the undo data on it, take it off the queue.
        The expiry heap has room."""
        cdef int32_t slot = ready_pop(&self._ready, lv)
        cdef Group *g = &self._groups.at[slot]
        cdef double expires_at
        w.prev_key = g.key
        w.prev_claimed_at = g.claimed_at
        w.prev_open = g.open
        self._claims += 1
        g.key = self._claims
        g.claimed_at = now
        g.attempt += 1
        g.open = 1
        g.lock = _LEASED
        expires_at = now + w.visibility
        g.expires_at = expires_at
        self._leased += 1
        if expires_at != _INF:
            expiry_push(&self._expiry, slot, expires_at)
        group_hold(&self._groups, slot, <PyObject *>w.worker_id)  # for group(): an exact str
        w.seq = self._messages.at[g.head].seq
        w.attempt = g.attempt
        w.delivery = self._claims
        w.expires_at = expires_at
        w.slot = slot
        w.event = lq_list_get(self._events, g.head)  # the record held None: nothing is freed
        w.gid = <object>g.gid
        waiters_remove(&self._wq, w)
        w.state = _W_HANDED

    cdef bint _undo(self, _Waiter w) noexcept:
        """Take back the claim ``_hand_off`` made for ``w``, exactly, if that
        delivery is still current: the group is ready again with its old
        round-robin key, attempt count, open flag and ``last_claimed_at``."""
        cdef int32_t slot = w.slot
        cdef Group *g
        if slot < 0 or slot >= self._groups.cap or self._groups.at[slot].count == 0 or (
            self._messages.at[self._groups.at[slot].head].seq != w.seq
        ):
            # the group moved (compaction) or is gone: find it by its id
            slot = ids_lookup(&self._ids, self._groups.at, <PyObject *>w.gid, <uint32_t>lq_str_hash(w.gid))
            if (slot < 0 or self._groups.at[slot].count == 0  # an empty paused group: no head
                    or self._messages.at[self._groups.at[slot].head].seq != w.seq):
                return 0
        g = &self._groups.at[slot]
        if not g.open or g.key != w.delivery:
            return 0  # re-delivered since (its lease expired): nothing of it left
        if ready_contains(&self._ready, slot):  # expired: ready under the hand-off's key
            self._unready(slot)
        if g.lock != _FREE:
            self._unlock(slot)
        g.attempt = w.attempt - 1
        g.open = w.prev_open
        g.key = w.prev_key
        g.claimed_at = w.prev_claimed_at
        if not g.paused:  # paused meanwhile: it stays out of the ready set until resumed
            self._make_ready(slot)
        return 1

    cdef inline bint _promise(self, _Waiter w) noexcept:
        """Promise ``w`` a wake (run after the lock); False if it has one."""
        if w.pending:
            return 0
        w.pending = 1
        w.chain = self._chain  # w.chain was None: nothing is freed
        self._chain = w        # the old head is referenced by w.chain now
        return 1

    cdef inline void _arm_timer(self) noexcept:
        """While claims wait, the expiry timer must fire by the earliest expiry."""
        if self._wq.count and self._expiry.size and self._expiry.entries[0].at < self._timer_at:
            self._timer_at = self._expiry.entries[0].at
            self._poke = 1

    cdef void _close_waiters(self) noexcept:
        """``close()``: every queued record is woken as CLOSED."""
        cdef int32_t i
        cdef PyObject *p
        cdef _Waiter w
        for i in range(self._wq.n):
            p = self._wq.q[i].head
            while p != NULL:
                w = <_Waiter>p
                p = w.next
                w.prev = NULL
                w.next = NULL
                w.state = _W_CLOSED
                if self._promise(w):
                    self._wakeups[1] += 1
        self._wq.n = 0
        self._wq.count = 0

    cdef bint _end_locked(self, _Waiter w, bint keep) noexcept:
        """``_wait_end`` under the lock: True if ``w`` keeps a handed lease."""
        if w.state == _W_WAITING:
            waiters_remove(&self._wq, w)
            w.state = _W_IDLE
        elif w.state == _W_HANDED:
            w.state = _W_IDLE
            if keep:
                return 1
            if self._undo(w) and self._wq.count:
                self._serve_locked(self._time)
        else:
            w.state = _W_IDLE
        return 0

    # -- waiting claims: what waiting.py calls (see its docstring)

    def _waiter(self, worker_id, visibility, min_priority, wake):
        """A new waiter record (arguments already checked)."""
        cdef _Waiter w = _Waiter.__new__(_Waiter)
        w.worker_id = worker_id
        w.visibility = visibility
        w.floor = min_priority
        w.wake = wake
        return w

    def _wait_start(self, _Waiter w):
        """Read the clock; claim for ``w`` or queue it (see ``waiting.py``)."""
        cdef double now = self._read_clock()
        cdef int rc = _OK
        cdef object chain
        cdef bint poke
        lq_lock(&self._lock)
        if self._closed:
            w.state = _W_CLOSED
        elif waiters_reserve(&self._wq) != _OK:
            rc = _NOMEM
        else:
            if now < self._time:
                now = self._time
            else:
                self._time = now
            waiters_push(&self._wq, w)
            w.state = _W_WAITING
            w.pending = 1  # its owner is running this: no wake for it
            rc = self._serve_locked(now)
            if w.state == _W_WAITING:
                w.pending = 0
                if rc != _OK:  # its own claim could not be made
                    waiters_remove(&self._wq, w)
                    w.state = _W_IDLE
            else:
                rc = _OK
        chain = self._chain
        self._chain = None
        poke = self._poke
        self._poke = 0
        lq_unlock(&self._lock)
        self._wake(chain, poke)
        if rc != _OK:
            raise MemoryError()
        if w.state == _W_HANDED:
            w.state = _W_IDLE
            return _issue(w.seq, w.gid, w.event, w.worker_id, w.expires_at, w.attempt, self._owner, w.slot, w.delivery)
        return None

    def _wait_end(self, _Waiter w, bint keep):
        """End ``w``'s wait: its handed lease if ``keep``, else an exact undo
        of the hand-off (the message goes to the next waiter).  Never raises."""
        cdef bint kept, poke
        cdef object chain
        lq_lock(&self._lock)
        kept = self._end_locked(w, keep)
        chain = self._chain
        self._chain = None
        poke = self._poke
        self._poke = 0
        lq_unlock(&self._lock)
        self._wake(chain, poke)
        if kept:
            return _issue(w.seq, w.gid, w.event, w.worker_id, w.expires_at, w.attempt, self._owner, w.slot, w.delivery)
        return None

    def _timer_fire(self):
        """For the expiry timer, when the time it is armed for is due: read
        the clock; if claims wait, expire and serve.  Returns the time used."""
        cdef double now = self._read_clock()
        cdef object chain
        lq_lock(&self._lock)
        self._timer_at = _INF
        if self._wq.count:
            if now < self._time:
                now = self._time
            else:
                self._time = now
            self._serve_locked(now)  # arms the timer again if claims still wait
        self._poke = 0  # this is the timer: it knows
        chain = self._chain
        self._chain = None
        lq_unlock(&self._lock)
        wake_chain(chain)
        return now

    def _timer_due(self):
        """For the expiry timer: (the clock time it is armed for, the transport time)."""
        cdef double at, base
        lq_lock(&self._lock)
        at = self._timer_at
        base = self._time
        lq_unlock(&self._lock)
        return (at, base)

    def _waiting_count(self):
        """Waiting claims queued now; for tests."""
        return self._wq.count

    def _wake_counts(self):
        """Wakes promised to waiting claims so far: (hand-offs, close); for tests."""
        return (self._wakeups[0], self._wakeups[1])


cdef object _publish_plain(object transport, object group_id, object event, object priority):
    """``publish(group_id, event[, priority])``: the publish of Part 1.
    Positional calls come here straight from C (``lq_publish_entry``,
    below), without the argument parsing of ``publish``'s keyword-only
    ``delay`` and ``key``.  ``transport`` is an ``InMemoryTransport`` (the
    method descriptor checked it)."""
    cdef InMemoryTransport self = <InMemoryTransport>transport
    cdef str gid
    cdef int64_t prio
    cdef int64_t seq = 0
    cdef int rc
    cdef Py_hash_t h
    cdef int32_t slot, m
    if type(group_id) is str:
        gid = <str>group_id
    else:
        gid = _check_id(group_id, "group_id")
    prio = _priority(priority, "priority")
    h = hash(gid)  # exact str: no user code
    lq_lock(&self._lock)
    try:
        slot = ids_lookup(&self._ids, self._groups.at, <PyObject *>gid, <uint32_t>h)
        if slot >= 0 and self._messages.free >= 0 and self._groups.at[slot].count:
            # Fast path: an existing group with messages, a free message slot.
            self._seq = seq = self._seq + 1
            m = message_add(&self._messages, self._events, seq, event)
            group_append(&self._messages, &self._groups.at[slot], m)
            rc = _OK
        else:
            rc = self._publish_slow(gid, h, event, prio, slot, &seq)
    finally:
        lq_unlock(&self._lock)
    if self._wq.count:
        self._serve_waiters(0.0, 0)
    if rc != _OK:
        if rc == _FULL:
            raise OverflowError("the transport is full: too many messages or groups")
        raise MemoryError()
    return seq


# ``publish``'s positional calls, straight to ``_publish_plain``.
#
# ``publish`` takes keyword-only ``delay`` and ``key`` (Part 5), and
# Cython's argument parsing takes and drops a reference to every argument,
# defaults included: ~30 instructions more on every publish, over the 2%
# the Part 1 cycle may slow by.  So the method's C function (its
# ``PyMethodDef`` is the module's own, read at every call by the method
# descriptor and by bound methods) is replaced, once, at import, by
# ``lq_publish_entry``: a call with 2 or 3 positional arguments and no
# keyword goes to ``_publish_plain`` with borrowed arguments; any other call
# goes to the function Cython generated, which parses it as declared.  If
# the method is not what this expects (another Cython, another layout),
# nothing is replaced and every call takes Cython's path.
cdef extern from *:
    """
    typedef PyObject *(*lq_fastcall_kw)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);
    typedef PyObject *(*lq_publish_fn)(PyObject *, PyObject *, PyObject *, PyObject *);
    static lq_fastcall_kw lq_publish_parsed = NULL;  /* Cython's wrapper: every form of call */
    static lq_publish_fn lq_publish_positional = NULL;
    static PyObject *lq_zero = NULL;                  /* priority's default */
    static PyTypeObject *lq_publish_type = NULL;      /* InMemoryTransport (final: no subclass) */
    static PyObject *lq_publish_entry(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
        if (kwnames == NULL && (nargs == 2 || nargs == 3) && Py_TYPE(self) == lq_publish_type)
            return lq_publish_positional(self, args[0], args[1], nargs == 3 ? args[2] : lq_zero);
        return lq_publish_parsed(self, args, nargs, kwnames);
    }
    #include <string.h>
    static int lq_install_publish(PyObject *descr, void *positional, PyObject *zero, PyObject *type) {
        PyMethodDef *def;
    #if defined(Py_LIMITED_API) || !defined(CYTHON_COMPILING_IN_CPYTHON) || !CYTHON_COMPILING_IN_CPYTHON
        return 0;
    #endif
        if (Py_TYPE(descr) == &PyMethodDescr_Type)  /* binding=False */
            def = ((PyMethodDescrObject *)descr)->d_method;
        else if (strstr(Py_TYPE(descr)->tp_name, "cython_function_or_method") != NULL)
            def = ((PyCFunctionObject *)descr)->m_ml;  /* a CyFunction is a PyCMethodObject there */
        else
            return 0;
        if (def->ml_flags != (METH_FASTCALL | METH_KEYWORDS) || lq_publish_parsed != NULL)
            return 0;
        Py_INCREF(zero);
        lq_zero = zero;
        Py_INCREF(type);
        lq_publish_type = (PyTypeObject *)type;
        lq_publish_parsed = (lq_fastcall_kw)(void (*)(void))def->ml_meth;
        lq_publish_positional = (lq_publish_fn)positional;
        def->ml_meth = (PyCFunction)(void (*)(void))lq_publish_entry;
        return 1;
    }
    """
    int lq_install_publish(object descr, void *positional, object zero, object type) noexcept


#: Whether positional publishes bypass the argument parsing (for tests).
_FAST_PUBLISH = bool(lq_install_publish(InMemoryTransport.__dict__["publish"], <void *>_publish_plain, 0, InMemoryTransport))
