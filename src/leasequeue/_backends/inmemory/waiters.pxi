# The queue of waiting claims of the Cython transport (included by
# transport_c.pyx); the pure twin's "waiters" section explains it, and
# ``waiting.py`` (shared by both) is the sleeping and waking side.
#
# THE ENTRY POINT.  Every operation that may have made a message claimable
# (publish, ack, nack(0); the control plane's resume and set_priority; the
# batches publish_many and ack_many), or that read the clock and so may have
# expired locks or pushed an expiry earlier than the expiry timer is armed
# for (claim, stats, extend, nack(delay > 0), claim_many, group(),
# groups()), ends, *after* releasing the lock, with
#
#     if self._wq.count:
#         self._serve_waiters(now, have_now)    # its clock reading, if it read one
#
# ``resume``, ``set_priority``, ``publish_many`` and ``ack_many`` make that
# call (and so read the clock) only when they made a group claimable (see
# the pure twin's section).
#
# With nobody waiting that test is the whole cost (one load and one
# branch).  ``_wq.count`` is read without the lock, which is enough: a
# waiting claim queues itself and serves the queue in one locked step, so
# either that step sees the operation's message, or the operation's read
# (after its own locked step) sees the claim waiting.  ``_serve_waiters``
# takes the lock, hands every claimable message to the waiting claim it
# belongs to (``_serve_locked``), and wakes those claims after releasing it.
#
# A waiting claim is woken only when it was served or closed (or by its own
# deadline): expiry is watched by the transport's expiry timer
# (``waiting.py``), armed for ``_timer_at`` by ``_arm_timer`` and poked
# after the lock is released.
#
# Here: ``_Waiter``, the record of one waiting claim (allocated by the
# waiting side, before any lock), and ``WaiterQueues``: one FIFO of records
# per distinct floor (``min_priority``), the floors ascending in a C array,
# each FIFO a doubly linked list through the records.  The links are
# *borrowed* pointers: a queued record is always referenced by its owner
# (the waiting call, which takes it out of the queue under the lock before
# letting go of it, whatever happens), so linking and unlinking change no
# reference count and nothing can be freed under the lock.  Records promised
# a wake are chained through ``chain`` (strong references), which the
# operation detaches under the lock and walks after releasing it.
#
# Functions: waiters_init / waiters_free, waiters_reserve, waiters_find,
# waiters_push, waiters_remove.


# Waiter record states (the same numbers as _waiting.IDLE, WAITING, ...).
cdef enum:
    _W_IDLE = 0       # not queued: new, or its wait is over
    _W_WAITING = 1    # queued
    _W_HANDED = 2     # served: the record holds its lease (not queued)
    _W_CLOSED = 3     # woken by close() (not queued)


@cython.final
@cython.auto_pickle(False)
cdef class _Waiter:
    """A waiting claim, as the core keeps it."""

    cdef object worker_id
    cdef double visibility
    cdef int64_t floor             # min_priority
    cdef object wake               # the waiting side's wake-up primitive (called after the lock)
    cdef readonly int state        # _W_IDLE / _W_WAITING / _W_HANDED / _W_CLOSED
    cdef bint pending              # its wake is promised (or its owner is running): no other
    cdef int64_t arrival           # order of arrival in the queue
    cdef PyObject *prev            # neighbours in its floor's FIFO (borrowed)
    cdef PyObject *next
    cdef object chain              # next record promised a wake (strong)
    # the lease handed over
    cdef int64_t seq
    cdef int64_t attempt
    cdef int64_t delivery          # its claim number (fencing by delivery)
    cdef double expires_at
    cdef object gid
    cdef object event
    cdef int32_t slot
    # what the hand-off changed, for an exact undo
    cdef int64_t prev_key
    cdef double prev_claimed_at
    cdef uint8_t prev_open

    def __cinit__(self):
        self.prev = NULL
        self.next = NULL


ctypedef struct FloorQueue:
    int64_t floor
    PyObject *head       # borrowed _Waiter records
    PyObject *tail


ctypedef struct WaiterQueues:
    FloorQueue *q        # ascending by floor, ``n`` in use
    int32_t n
    int32_t cap
    int64_t count        # queued records, all floors (the transport's "anyone waiting?")
    int64_t arrivals


cdef inline void waiters_init(WaiterQueues *wq) noexcept:
    wq.q = NULL
    wq.n = 0
    wq.cap = 0
    wq.count = 0
    wq.arrivals = 0


cdef inline void waiters_free(WaiterQueues *wq) noexcept:
    PyMem_Free(wq.q)
    wq.q = NULL
    wq.cap = 0


cdef int waiters_reserve(WaiterQueues *wq) noexcept:
    """Room for one more floor, so that a push cannot fail; a result code."""
    cdef int32_t new_cap
    cdef void *p
    if wq.n < wq.cap:
        return _OK
    new_cap = wq.cap * 2 + 4
    p = PyMem_Realloc(wq.q, <size_t>new_cap * sizeof(FloorQueue))
    if p == NULL:
        return _NOMEM
    wq.q = <FloorQueue *>p
    wq.cap = new_cap
    return _OK


cdef int32_t waiters_find(const WaiterQueues *wq, int64_t floor) noexcept:
    """The index of ``floor``'s FIFO, or ``-1 - i`` where it would go."""
    cdef int32_t lo = 0, hi = wq.n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if wq.q[mid].floor < floor:
            lo = mid + 1
        else:
            hi = mid
    if lo < wq.n and wq.q[lo].floor == floor:
        return lo
    return -1 - lo


cdef void waiters_push(WaiterQueues *wq, _Waiter w) noexcept:
    """Put ``w`` at the end of its floor's FIFO (there is room for a new floor)."""
    cdef int32_t i = waiters_find(wq, w.floor)
    cdef FloorQueue *fq
    if i < 0:
        i = -1 - i
        if i < wq.n:
            memmove(&wq.q[i + 1], &wq.q[i], <size_t>(wq.n - i) * sizeof(FloorQueue))
        wq.n += 1
        fq = &wq.q[i]
        fq.floor = w.floor
        fq.head = NULL
        fq.tail = NULL
    else:
        fq = &wq.q[i]
    w.prev = fq.tail
    w.next = NULL
    if fq.tail == NULL:
        fq.head = <PyObject *>w
    else:
        (<_Waiter>fq.tail).next = <PyObject *>w
    fq.tail = <PyObject *>w
    wq.arrivals += 1
    w.arrival = wq.arrivals
    wq.count += 1


cdef void waiters_remove(WaiterQueues *wq, _Waiter w) noexcept:
    """Take queued ``w`` out of its floor's FIFO (an emptied floor goes too)."""
    cdef int32_t i = waiters_find(wq, w.floor)
    cdef FloorQueue *fq = &wq.q[i]
    if w.prev == NULL:
        fq.head = w.next
    else:
        (<_Waiter>w.prev).next = w.next
    if w.next == NULL:
        fq.tail = w.prev
    else:
        (<_Waiter>w.next).prev = w.prev
    w.prev = NULL
    w.next = NULL
    wq.count -= 1
    if fq.head == NULL:
        wq.n -= 1
        if i < wq.n:
            memmove(&wq.q[i], &wq.q[i + 1], <size_t>(wq.n - i) * sizeof(FloorQueue))


cdef int wake_chain(object chain) except -1:
    """Run the promised wakes of a detached chain (after the lock is released).

    Each record leaves the chain before its wake runs: once woken, its owner
    may consume the wake and be promised another one (chained anew).  The
    waiting side's wakes do not raise; if one did, the others still run and
    the first error is raised at the end."""
    cdef _Waiter w
    cdef object error = None
    while chain is not None:
        w = <_Waiter>chain
        chain = w.chain
        w.chain = None
        try:
            w.wake()
        except BaseException as exc:
            if error is None:
                error = exc
    if error is not None:
        raise error
    return 0
