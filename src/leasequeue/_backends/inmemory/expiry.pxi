# The expiry heap of the Cython transport (included by transport_c.pyx).
#
# Every locked group (leased or parked) with a finite expiry has one entry,
# (expires_at, group slot), in an indexed binary min-heap: ``pos`` maps a
# group slot to its entry's position, so releasing a lock removes its entry
# at once (the pure twin's heap is lazy instead and skips stale entries).
# A claim, ``stats`` and the like pop every entry with ``at < now`` first.
#
# Capacity: ``claim``, ``nack`` and ``extend`` make room for one more entry
# (expiry_make_room) before they change anything, so a push never
# allocates; removing entries gives memory back when under a quarter of the
# capacity is in use, but never below ``floor``: ``claim_many`` reserves
# room for all its claims (expiry_reserve) and sets ``floor`` while the
# expiries it applies first pop entries.
#
# Functions: expiry_init / expiry_free, expiry_make_room, expiry_due,
# expiry_top, expiry_push, expiry_remove, and for the group storage
# expiry_resize_index / expiry_renumber.


ctypedef struct ExpiryEntry:
    double at
    int32_t group


ctypedef struct ExpiryHeap:
    ExpiryEntry *entries # min-heap on ``at``
    int32_t *pos         # group slot -> position in ``entries``, -1 if absent
    int32_t size
    int32_t cap          # entries allocated; >= groups locked with a finite expiry
    int32_t floor        # removals keep at least this capacity (0 but during claim_many)


cdef inline void expiry_init(ExpiryHeap *xh) noexcept:
    xh.entries = NULL
    xh.pos = NULL
    xh.size = 0
    xh.cap = 0
    xh.floor = 0


cdef inline void expiry_free(ExpiryHeap *xh) noexcept:
    PyMem_Free(xh.entries)
    PyMem_Free(xh.pos)
    expiry_init(xh)


cdef int expiry_reserve(ExpiryHeap *xh, int64_t need) noexcept:
    """Room for ``need`` entries; a result code."""
    cdef int64_t new_cap
    cdef void *p
    if need <= xh.cap:
        return _OK
    new_cap = need + need // 4 + 4
    if new_cap > INT32_MAX - 1:
        new_cap = INT32_MAX - 1
    p = PyMem_Realloc(xh.entries, <size_t>new_cap * sizeof(ExpiryEntry))
    if p == NULL:
        return _NOMEM
    xh.entries = <ExpiryEntry *>p
    xh.cap = <int32_t>new_cap
    return _OK


cdef inline int expiry_make_room(ExpiryHeap *xh) noexcept:
    """Room for one more entry, so that the next push cannot fail; a result code."""
    if xh.size == xh.cap:
        return expiry_reserve(xh, xh.size + 1)
    return _OK


cdef inline bint expiry_due(const ExpiryHeap *xh, double now) noexcept:
    """Whether some entry has ``at < now``."""
    return xh.size != 0 and xh.entries[0].at < now


cdef inline int32_t expiry_top(const ExpiryHeap *xh) noexcept:
    """The group slot of the earliest entry (the heap is not empty)."""
    return xh.entries[0].group


cdef void expiry_push(ExpiryHeap *xh, int32_t slot, double at) noexcept:
    """Enter group ``slot`` (absent) expiring at ``at`` (there is room)."""
    cdef int32_t pos = xh.size
    xh.size += 1
    expiry_sift_up(xh, pos, at, slot)


cdef inline void expiry_sift_up(ExpiryHeap *xh, int32_t pos, double at, int32_t slot) noexcept:
    """Place (at, slot) in the hole at ``pos``, moving it up."""
    cdef ExpiryEntry *heap = xh.entries
    cdef int32_t *xpos = xh.pos
    cdef int32_t parent
    while pos > 0:
        parent = (pos - 1) >> 1
        if heap[parent].at <= at:
            break
        heap[pos] = heap[parent]
        xpos[heap[pos].group] = pos
        pos = parent
    heap[pos].at = at
    heap[pos].group = slot
    xpos[slot] = pos


cdef void expiry_remove_at(ExpiryHeap *xh, int32_t pos) noexcept:
    """Remove the entry at ``pos``."""
    cdef ExpiryEntry *heap = xh.entries
    cdef int32_t *xpos = xh.pos
    cdef int32_t n, child, end
    cdef ExpiryEntry last
    cdef void *p
    xpos[heap[pos].group] = -1
    xh.size -= 1
    end = xh.size
    if xh.cap > _MIN_HEAP_CAP * 4 and end * 4 < xh.cap:
        expiry_shrink(xh, end)
        heap = xh.entries
    if pos == end:
        return
    last = heap[end]
    if pos > 0 and heap[(pos - 1) >> 1].at > last.at:
        expiry_sift_up(xh, pos, last.at, last.group)
        return
    n = pos
    child = 2 * n + 1
    while child < end:
        if child + 1 < end and heap[child + 1].at < heap[child].at:
            child += 1
        if heap[child].at >= last.at:
            break
        heap[n] = heap[child]
        xpos[heap[n].group] = n
        n = child
        child = 2 * n + 1
    heap[n] = last
    xpos[last.group] = n


cdef void expiry_shrink(ExpiryHeap *xh, int32_t end) noexcept:
    """Give memory back (best effort), keeping the entries in [0, end] and
    at least ``floor`` entries of room."""
    cdef int32_t new_cap = end * 2 + 1
    cdef void *p
    if new_cap < xh.floor:
        new_cap = xh.floor
    if new_cap >= xh.cap:
        return
    p = PyMem_Realloc(xh.entries, <size_t>new_cap * sizeof(ExpiryEntry))
    if p != NULL:
        xh.entries = <ExpiryEntry *>p
        xh.cap = new_cap


cdef inline void expiry_remove(ExpiryHeap *xh, int32_t slot) noexcept:
    """Remove group ``slot``'s entry, if it has one."""
    cdef int32_t pos = xh.pos[slot]
    if pos >= 0:
        expiry_remove_at(xh, pos)


# -- for the group storage: the index follows the group array


cdef int expiry_resize_index(ExpiryHeap *xh, int32_t old_cap, int64_t new_cap) noexcept:
    """Resize ``pos`` for ``new_cap`` (> old_cap) group slots, the new ones absent."""
    cdef void *p = PyMem_Realloc(xh.pos, <size_t>new_cap * sizeof(int32_t))
    cdef int64_t i
    if p == NULL:
        return _NOMEM
    xh.pos = <int32_t *>p
    for i in range(old_cap, new_cap):
        xh.pos[i] = -1
    return _OK


cdef void expiry_renumber(
    ExpiryHeap *xh, int32_t *new_pos, int32_t new_cap, const int32_t *remap, int32_t old_cap,
) noexcept:
    """Group slot s became ``remap[s]`` (-1: gone): renumber the entries and
    move the index into ``new_pos`` (``new_cap`` slots, allocated by the
    caller before anything changed); the old index is freed."""
    cdef int32_t s
    for s in range(new_cap):
        new_pos[s] = -1
    for s in range(old_cap):
        if remap[s] >= 0:
            new_pos[remap[s]] = xh.pos[s]
    for s in range(xh.size):
        xh.entries[s].group = remap[xh.entries[s].group]
    PyMem_Free(xh.pos)
    xh.pos = new_pos
