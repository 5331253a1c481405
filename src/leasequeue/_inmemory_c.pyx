# cython: language_level=3, embedsignature=False, annotation_typing=False
# cython: freethreading_compatible=True
"""Cython ``InMemoryTransport``: the compiled twin of ``_inmemory_py``.

Same contract (``SPEC.md``, ``docs/decisions.md``), same names, signatures,
docstrings and error messages as the pure module; the algorithm is explained
there.  Here the same structures live in C arrays, each in a file of its
own (included below, in the order of the pure module's sections):

* groups (``_inmemory_storage.pxi``): an array of 64-byte ``Group`` structs
  (the fields a claim touches together); freed slots are chained in a free
  list.  A group id finds its slot through an open-addressing table of
  (slot, 32 bits of the id's hash) pairs, 8 bytes an entry
  (``_inmemory_ids.pxi``); the group keeps a borrowed pointer to its id,
  whose reference a list by slot owns.  Only a group's head message can be
  leased or parked, so lock state lives on the group.
* messages (``_inmemory_storage.pxi``): an array of packed 12-byte
  ``Message`` records (``seq`` and ``next``: a singly linked FIFO per
  group), events in a ``list`` indexed by the same slot so the garbage
  collector sees them.
* ready groups (``_inmemory_ready.pxi``): an indexed 4-ary heap per priority
  level, keyed by the round-robin key; the levels form a treap whose nodes
  know the smallest ready key of their subtree (claim with a priority floor
  is one walk).
* locked groups with a finite expiry (``_inmemory_expiry.pxi``): an indexed
  min-heap keyed by expiry.
* waiting claims (``_inmemory_waiters.pxi``): a FIFO of waiter records per
  priority floor; the sleeping and waking is ``_waiting.py``, shared with
  the pure twin.

Each structure is a C struct the transport holds, with ``cdef ...
noexcept`` functions (``inline`` where hot) taking a pointer to it
(``ids_lookup``, ``ready_push``, ``expiry_push``, ...); the ``Lease`` class
and the argument checks have files of their own too.  The transport's
methods below are the operations.

Memory is only allocated before anything changes, so a ``MemoryError``
leaves the transport as it was: ``publish`` grows the message, group, id
table and level arrays first and reserves a ready-heap slot for every group
of a level; ``claim``, ``nack`` and ``extend`` first make room for one more
expiry entry.  ``ack``, expiry and ``stats`` never need memory.  Storage is
given back when a backlog drains: when under a quarter of the message or
group slots is in use, ``ack`` renumbers the live ones into arrays half as
full (amortised O(1); a lease whose group moved is found again by its id),
and the heaps shrink likewise.

Locking: one lock (``PyMutex`` on 3.13+, as ``cython.pymutex``; the GIL
before 3.13, see ``lq_mutex`` below for why that is sound and faster).  No
user code runs under it and no object the garbage collector tracks is
allocated under it (a collection could run a finaliser that calls back into
this transport): the clock is read and str subclasses are converted before
it, leases, results and exceptions are built after it, and the reference to
an acked event is dropped after it.
"""

cimport cython
from cpython.list cimport PyList_Append
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from libc.stdint cimport INT32_MAX, INT64_MAX, INT64_MIN, int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memmove

import time

from ._errors import LeaseLost
from ._types import PARKED, TransportStats
from ._waiting import aclaim_wait as _aclaim_wait
from ._waiting import claim_wait as _claim_wait
from ._waiting import poke_timer as _poke_timer

__all__ = ["PARKED", "InMemoryTransport", "Lease", "TransportStats"]

cdef str _PARKED_STR = PARKED
cdef object _time_time = time.time
cdef double _INF = float("inf")


cdef extern from "_lq_build.h":
    object lq_cython_version()

#: The Cython version that compiled this module (recorded at build time).
CYTHON_VERSION = lq_cython_version()


cdef extern from "_lq_platform.h":
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
    /* A new reference to list[i]. */
    static CYTHON_INLINE PyObject *lq_list_get(PyObject *list, Py_ssize_t i) {
        PyObject *item = PyList_GET_ITEM(list, i);
        Py_INCREF(item);
        return item;
    }
    """
    object lq_list_swap(object lst, Py_ssize_t i, object v)
    object lq_list_get(object lst, Py_ssize_t i)
    int lq_str_eq(PyObject *a, PyObject *b) noexcept
    PyObject *lq_list_take(object lst, Py_ssize_t i) noexcept
    void lq_list_put(object lst, Py_ssize_t i, PyObject *item) noexcept
    void lq_list_truncate(object lst, Py_ssize_t n) noexcept
    Py_hash_t lq_str_hash "PyObject_Hash"(object s) noexcept
    PyObject *PyList_GET_ITEM(object lst, Py_ssize_t i)


# Lock states of a group's head message.
cdef enum:
    _FREE = 0  # not locked (possibly an expired lease whose delivery is still open)
    _LEASED = 1
    _PARKED = 2

# Result codes of the locked sections (exceptions are raised after unlock).
cdef enum:
    _OK = 0
    _NOMEM = 2
    _FULL = 3

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
include "_inmemory_lease.pxi"       # Lease, _issue, _lost_message
include "_inmemory_validation.pxi"  # argument checks
include "_inmemory_ids.pxi"         # IdTable: group id -> group slot
include "_inmemory_ready.pxi"       # ReadySet: a heap of ready groups per level, the level treap
include "_inmemory_expiry.pxi"      # ExpiryHeap: locked groups by expiry
include "_inmemory_storage.pxi"     # MessageStore, GroupStore: the records, grow, forget, compact
include "_inmemory_waiters.pxi"     # _Waiter, WaiterQueues: the waiting claims (THE ENTRY POINT: see there)


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
    float (default ``time.time``); it is read once by ``claim``, ``extend``,
    ``stats`` and ``nack(delay > 0)`` (and by ``publish``, ``ack`` and
    ``nack(0)`` while a claim waits for work), never while the transport's
    lock is held.  The transport's time never runs backwards: an operation
    whose clock reading is older than a time an earlier operation used (a
    racing thread, or a clock turned back) uses that later time instead.
    Every method is atomic and thread-safe.

    ``claim(..., timeout=)`` and ``aclaim`` wait for work, in a thread or an
    asyncio event loop; ``close()`` ends every wait.
    """

    cdef lq_mutex _lock
    cdef object __weakref__
    cdef object _clock
    cdef bint _wall_clock           # clock is time.time: read it in C
    cdef object _owner              # stamped on every lease this transport issues

    # messages and groups by slot (_inmemory_storage.pxi), and the objects
    # they refer to in lists by the same slots, so the garbage collector
    # sees them: len(_events) >= _messages.cap, len(_group_ids) >= _groups.cap
    cdef MessageStore _messages
    cdef GroupStore _groups
    cdef list _events               # message slot -> event (None when unused)
    cdef list _group_ids            # group slot -> group id (None when unused)

    # group id -> group slot (_inmemory_ids.pxi)
    cdef IdTable _ids

    # ready groups by priority level, and the treap of levels (_inmemory_ready.pxi)
    cdef ReadySet _ready

    # locked groups with a finite expiry (_inmemory_expiry.pxi)
    cdef ExpiryHeap _expiry

    cdef double _time               # the latest ``now`` an operation used
    cdef int64_t _seq
    cdef int64_t _claims
    cdef int64_t _leased            # groups whose lock is _LEASED
    cdef int64_t _parked            # groups whose lock is _PARKED

    # waiting claims (_inmemory_waiters.pxi)
    cdef WaiterQueues _wq           # the queued records; _wq.count: anyone waiting?
    cdef object _chain              # records promised a wake, detached and woken after the lock
    cdef double _timer_at           # clock time the expiry timer is armed for
    cdef bint _poke                 # the timer must be poked after the lock is released
    cdef public object _timer       # the expiry timer (_waiting.py), started on first use
    cdef readonly bint _closed
    cdef int64_t _wakeups[2]        # wakes promised: hand-offs, close (for tests)

    def __cinit__(self, *args, **kwargs):
        messages_init(&self._messages)
        groups_init(&self._groups)
        ids_init(&self._ids)
        ready_init(&self._ready)
        expiry_init(&self._expiry)
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
        PyMem_Free(self._groups.at)
        ids_free(&self._ids)
        ready_free(&self._ready)
        expiry_free(&self._expiry)
        waiters_free(&self._wq)

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        if not callable(clock):
            raise TypeError(f"clock must be callable, not {type(clock).__name__}")
        self._clock = clock
        self._wall_clock = LQ_HAVE_WALL_TIME and clock is _time_time

    # -------------------------------------------------------------- public

    def publish(self, group_id: str, event: Any, priority: int = 0) -> int:
        """Append ``event`` to group ``group_id``; return its sequence number.

        Sequence numbers are 1, 2, 3, ... and never reused.  ``priority`` is
        taken when the group is created (its first message, or the first after
        it was emptied) and ignored otherwise.
        """
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
            if slot >= 0 and self._messages.free >= 0:
                # Fast path: an existing group, a free message slot.
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
        cdef int64_t seq = 0, attempt = 0
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
                g.key = self._claims
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
        return _issue(seq, gid, event, wid, expires_at, attempt, self._owner, slot)

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
        _check_lease(lease)
        lq_lock(&self._lock)
        try:
            slot = self._current(<Lease>lease)
            if slot >= 0:
                g = &self._groups.at[slot]
                if g.lock != _FREE:
                    self._unlock(slot)
                g.open = 0
                g.attempt = 0
                spent = group_shift(&self._messages, self._events, g)
                if g.count == 0:
                    spent_id = self._forget(slot)
                elif not ready_contains(&self._ready, slot):
                    self._make_ready(slot)
                if messages_sparse(&self._messages):
                    self._compact_messages()
        finally:
            lq_unlock(&self._lock)
        if slot < 0:
            raise LeaseLost(_lost_message(<Lease>lease))
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
                if d == 0.0:
                    if not ready_contains(&self._ready, slot):
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
            old._cattempt, self._owner, slot,
        )

    def stats(self) -> TransportStats:
        """Counts now: messages held, groups, live leases, parked messages.

        Expired leases and parks (``expires_at < now``) count as neither.
        """
        cdef double now = self._now()
        cdef int64_t messages, groups, leased, parked
        lq_lock(&self._lock)
        try:
            if now < self._time:
                now = self._time
            else:
                self._time = now
            if expiry_due(&self._expiry, now):
                self._expire(now)
            messages = self._messages.used
            groups = self._groups.used
            leased = self._leased
            parked = self._parked
        finally:
            lq_unlock(&self._lock)
        if self._wq.count:
            self._serve_waiters(now, 1)
        return TransportStats(messages, groups, leased, parked)

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

    def __enter__(self) -> "InMemoryTransport":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        cdef int64_t messages, groups
        lq_lock(&self._lock)
        messages = self._messages.used
        groups = self._groups.used
        lq_unlock(&self._lock)
        return (
            f"<{type(self).__module__}.{type(self).__qualname__} "
            f"messages={messages} groups={groups}>"
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
            if slot < 0 or self._messages.at[self._groups.at[slot].head].seq != lease._cseq:
                return -1
        g = &self._groups.at[slot]
        if not g.open or g.attempt != lease._cattempt:
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
        cdef Group *g
        cdef int rc
        if self._messages.free < 0:
            rc = messages_grow(&self._messages, self._events)
            if rc != _OK:
                return rc
        if found < 0:
            if self._groups.free < 0:
                rc = groups_grow(&self._groups, self._group_ids, &self._ready, &self._expiry)
                if rc != _OK:
                    return rc
            rc = ready_reserve_group(&self._ready, prio, &lv)
            if rc != _OK:
                return rc
            rc = ids_reserve(&self._ids, self._groups.used + 1)
            if rc != _OK:
                return rc
            # --- commit: nothing below can fail
            slot = groups_add(&self._groups, self._group_ids, &self._ids, gid, <uint32_t>h)
            lv = ready_add_group(&self._ready, prio, lv)
        else:
            slot = found
        self._seq += 1
        seq_out[0] = self._seq
        m = message_add(&self._messages, self._events, self._seq, event)
        g = &self._groups.at[slot]
        if found >= 0:
            group_append(&self._messages, g, m)
        else:
            g.key = self._seq - _NEVER_CLAIMED
            g.attempt = 0
            g.expires_at = 0.0
            g.claimed_at = 0.0
            g.head = m
            g.tail = m
            g.count = 1
            g.level = lv
            g.lock = _FREE
            g.open = 0
            self._ready.pos[slot] = -1
            self._expiry.pos[slot] = -1
            self._make_ready(slot)
        return _OK

    # -- ready heaps and the level treap (_inmemory_ready.pxi)

    cdef inline void _make_ready(self, int32_t slot) noexcept:
        """Put a free group in its level's heap under its round-robin key."""
        cdef Group *g = &self._groups.at[slot]
        ready_push(&self._ready, slot, g.level, g.key)

    cdef inline void _unready(self, int32_t slot) noexcept:
        """Take a ready group out of its level's heap."""
        ready_remove(&self._ready, slot, self._groups.at[slot].level)

    # -- lock state and the expiry heap (_inmemory_expiry.pxi)

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
            self._make_ready(slot)

    # -- storage (_inmemory_storage.pxi)
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

    # -- waiting claims (_inmemory_waiters.pxi; _waiting.py is the other side)

    cdef object _claim_wait(self, str wid, double vis, int64_t minp, double wait):
        """``claim`` with a non-zero ``timeout``: ``_waiting.claim_wait``."""
        return _claim_wait(self, wid, vis, minp, wait)

    cdef double _read_clock(self) except? -1.0:
        """``_now`` for the waiting paths, apart so that ``_now`` stays inlined
        in the operations (gcc stops inlining it when it has more callers)."""
        if self._wall_clock:
            return lq_wall_time()
        return _check_time(self._clock())

    cdef int _serve_waiters(self, double now, bint have_now) except -1:
        """THE ENTRY POINT (see _inmemory_waiters.pxi): serve the waiting claims.

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
        w.seq = self._messages.at[g.head].seq
        w.attempt = g.attempt
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
            if slot < 0 or self._messages.at[self._groups.at[slot].head].seq != w.seq:
                return 0
        g = &self._groups.at[slot]
        if not g.open or g.attempt != w.attempt:
            return 0  # re-delivered since (its lease expired): nothing of it left
        if ready_contains(&self._ready, slot):  # expired: ready under the hand-off's key
            self._unready(slot)
        if g.lock != _FREE:
            self._unlock(slot)
        g.attempt = w.attempt - 1
        g.open = w.prev_open
        g.key = w.prev_key
        g.claimed_at = w.prev_claimed_at
        self._make_ready(slot)  # control plane (merge): not if the group was paused meanwhile
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

    # -- waiting claims: what _waiting.py calls (see its docstring)

    def _waiter(self, worker_id, visibility, min_priority, wake):
        """A new waiter record (arguments already checked)."""
        cdef _Waiter w = _Waiter.__new__(_Waiter)
        w.worker_id = worker_id
        w.visibility = visibility
        w.floor = min_priority
        w.wake = wake
        return w

    def _wait_start(self, _Waiter w):
        """Read the clock; claim for ``w`` or queue it (see ``_waiting.py``)."""
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
            return _issue(w.seq, w.gid, w.event, w.worker_id, w.expires_at, w.attempt, self._owner, w.slot)
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
            return _issue(w.seq, w.gid, w.event, w.worker_id, w.expires_at, w.attempt, self._owner, w.slot)
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
