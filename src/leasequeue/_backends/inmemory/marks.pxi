# What Part 5 adds to some messages (included by transport_c.pyx, before
# the storage): a due time (``publish(..., delay > 0)``) and an idempotency
# key (``publish(..., key=...)``).  Only the messages that have them pay:
# the 12-byte message record and the 64-byte group record do not grow (a
# group only has a ``marks`` byte in its padding: "some message of mine may
# be in the mark table", reset when the group is refilled, so an unmarked
# group's publish, claim and ack never look here).
#
# * ``MarkTable``: seq -> (due, key) for every held message published with
#   a delay or a key; open addressing with linear probing, at most half
#   full, deletion by backward shift (no tombstones).  Room is made before a
#   publish changes anything (``marks_reserve``, which also shrinks a table
#   a drained backlog left sparse); lookups and deletions never allocate.
#   A message is in the table exactly while it is held, which is also how a
#   key's holder is known to be held.
# * ``SchedHeap``: (due, seq) of the messages published with a finite
#   delay, for ``stats().scheduled``: a min-heap on ``due`` with lazy
#   deletion.  ``stats`` pops the entries that became due (``due < now``);
#   a message that leaves before that is discounted when it leaves, its
#   entry skipped when popped (its seq is no longer in the mark table).  A
#   heap holding more than twice the live entries (plus some) is compacted
#   in place before a push.
# * ``KeyRing``: (published_at, seq, key) of each keyed publish, in publish
#   order, while ``dedup_window > 0``: the keys whose window has passed are
#   dropped from the transport's key dict from its front (lazily, at the
#   next keyed publish), so memory stays O(keys published within the
#   window) plus the held ones.
#
# The keys themselves are a dict on the transport, ``(group_id, key) ->
# seq`` (its holder's), and ``(group_id, key) -> published_at`` while
# ``dedup_window > 0``: the (group_id, key) tuples are built before the
# lock, and a dict whose keys are tuples of exact str runs no user code.
#
# The pure twin keeps the same three things in a dict, a heapq list and a
# deque.
#
# Functions: marks_init / marks_free, marks_reserve, marks_find,
# marks_insert, marks_delete; sched_init / sched_free, sched_reserve,
# sched_push, sched_pop, sched_compact; ring_init / ring_free,
# ring_reserve, ring_push.


# Group.marks bits.
cdef enum:
    _M_DUE = 1           # some message of the group may have a due time
    _M_KEY = 2           # some message of the group may have a key


ctypedef struct MarkEntry:
    int64_t seq          # 0: an empty entry (seqs start at 1)
    double due           # the due time it was published with (has_due)
    PyObject *kt         # (group_id, key) it holds (owned), or NULL
    uint8_t has_due


ctypedef struct MarkTable:
    MarkEntry *entries   # NULL while empty and never used
    size_t mask          # size - 1 (a power of two); 0 while entries is NULL
    int64_t used


cdef inline void marks_init(MarkTable *mt) noexcept:
    mt.entries = NULL
    mt.mask = 0
    mt.used = 0


cdef void marks_free(MarkTable *mt) noexcept:
    cdef size_t i
    if mt.entries != NULL:
        for i in range(mt.mask + 1):
            if mt.entries[i].seq:
                Py_XDECREF(mt.entries[i].kt)
    PyMem_Free(mt.entries)
    marks_init(mt)


cdef inline size_t marks_home(const MarkTable *mt, int64_t seq) noexcept:
    return <size_t>((<uint64_t>seq * <uint64_t>0x9E3779B97F4A7C15) >> 20) & mt.mask


cdef int marks_rehash(MarkTable *mt, size_t size) noexcept:
    """Move every entry into a new table of ``size`` entries; a result code."""
    cdef MarkEntry *old = mt.entries
    cdef size_t old_size = mt.mask + 1 if old != NULL else 0
    cdef MarkEntry *table = <MarkEntry *>PyMem_Malloc(size * sizeof(MarkEntry))
    cdef size_t i, pos
    if table == NULL:
        return _NOMEM
    memset(table, 0, size * sizeof(MarkEntry))
    mt.entries = table
    mt.mask = size - 1
    for i in range(old_size):
        if old[i].seq:
            pos = marks_home(mt, old[i].seq)
            while table[pos].seq:
                pos = (pos + 1) & mt.mask
            table[pos] = old[i]
    PyMem_Free(old)
    return _OK


cdef int marks_reserve(MarkTable *mt, int64_t need) noexcept:
    """Room for ``need`` more entries (the table stays at most half full);
    a sparse table is made smaller.  A result code."""
    cdef int64_t want = (mt.used + need) * 2
    cdef size_t size = 16
    if mt.entries != NULL and want <= <int64_t>(mt.mask + 1) and (
            mt.mask + 1 <= 64 or want * 4 > <int64_t>(mt.mask + 1)):
        return _OK
    while <int64_t>size < want:
        size *= 2
    if mt.entries != NULL and size == mt.mask + 1:
        return _OK
    return marks_rehash(mt, size)


cdef inline MarkEntry *marks_find(const MarkTable *mt, int64_t seq) noexcept:
    """Message ``seq``'s entry, or NULL."""
    cdef size_t pos
    if mt.used == 0:
        return NULL
    pos = marks_home(mt, seq)
    while mt.entries[pos].seq:
        if mt.entries[pos].seq == seq:
            return &mt.entries[pos]
        pos = (pos + 1) & mt.mask
    return NULL


cdef MarkEntry *marks_insert(MarkTable *mt, int64_t seq) noexcept:
    """A new entry for message ``seq`` (absent; room was made): no due, no key."""
    cdef size_t pos = marks_home(mt, seq)
    while mt.entries[pos].seq:
        pos = (pos + 1) & mt.mask
    mt.entries[pos].seq = seq
    mt.entries[pos].due = 0.0
    mt.entries[pos].kt = NULL
    mt.entries[pos].has_due = 0
    mt.used += 1
    return &mt.entries[pos]


cdef void marks_delete(MarkTable *mt, MarkEntry *entry) noexcept:
    """Remove ``entry`` (its ``kt`` reference is the caller's: already moved
    or released), shifting the entries of its probe run back."""
    cdef size_t hole = <size_t>(entry - mt.entries), pos = hole, home
    while True:
        pos = (pos + 1) & mt.mask
        if not mt.entries[pos].seq:
            break
        home = marks_home(mt, mt.entries[pos].seq)
        # move it back unless its home lies cyclically in (hole, pos]
        if ((pos - home) & mt.mask) >= ((pos - hole) & mt.mask):
            mt.entries[hole] = mt.entries[pos]
            hole = pos
    mt.entries[hole].seq = 0
    mt.entries[hole].kt = NULL
    mt.used -= 1


ctypedef struct SchedEntry:
    double due
    int64_t seq


ctypedef struct SchedHeap:
    SchedEntry *entries  # min-heap on ``due``
    int64_t size
    int64_t cap


cdef inline void sched_init(SchedHeap *sh) noexcept:
    sh.entries = NULL
    sh.size = 0
    sh.cap = 0


cdef inline void sched_free(SchedHeap *sh) noexcept:
    PyMem_Free(sh.entries)
    sched_init(sh)


cdef int sched_reserve(SchedHeap *sh, int64_t need) noexcept:
    """Room for ``need`` more entries; a result code."""
    cdef int64_t new_cap
    cdef void *p
    if sh.size + need <= sh.cap:
        return _OK
    new_cap = sh.size + need + (sh.size + need) // 4 + 16
    p = PyMem_Realloc(sh.entries, <size_t>new_cap * sizeof(SchedEntry))
    if p == NULL:
        return _NOMEM
    sh.entries = <SchedEntry *>p
    sh.cap = new_cap
    return _OK


cdef void sched_sift_down(SchedHeap *sh, int64_t n, SchedEntry item) noexcept:
    cdef SchedEntry *heap = sh.entries
    cdef int64_t child = 2 * n + 1
    while child < sh.size:
        if child + 1 < sh.size and heap[child + 1].due < heap[child].due:
            child += 1
        if heap[child].due >= item.due:
            break
        heap[n] = heap[child]
        n = child
        child = 2 * n + 1
    heap[n] = item


cdef void sched_push(SchedHeap *sh, double due, int64_t seq) noexcept:
    """Enter (due, seq) (there is room)."""
    cdef SchedEntry *heap = sh.entries
    cdef int64_t pos = sh.size, parent
    sh.size += 1
    while pos > 0:
        parent = (pos - 1) >> 1
        if heap[parent].due <= due:
            break
        heap[pos] = heap[parent]
        pos = parent
    heap[pos].due = due
    heap[pos].seq = seq


cdef int64_t sched_pop(SchedHeap *sh) noexcept:
    """Remove the earliest entry (there is one); its seq."""
    cdef int64_t seq = sh.entries[0].seq
    sh.size -= 1
    if sh.size:
        sched_sift_down(sh, 0, sh.entries[sh.size])
    return seq


cdef void sched_compact(SchedHeap *sh, const MarkTable *mt) noexcept:
    """Drop the entries of messages no longer held, in place, and heapify."""
    cdef int64_t i, k = 0
    for i in range(sh.size):
        if marks_find(mt, sh.entries[i].seq) != NULL:
            sh.entries[k] = sh.entries[i]
            k += 1
    sh.size = k
    i = k // 2 - 1
    while i >= 0:
        sched_sift_down(sh, i, sh.entries[i])
        i -= 1


ctypedef struct RingEntry:
    double at            # the publish's now
    int64_t seq          # the message it stored
    PyObject *kt         # (group_id, key) (owned)


ctypedef struct KeyRing:
    RingEntry *entries   # a circular buffer: ``size`` entries from ``head``
    int64_t head
    int64_t size
    int64_t cap


cdef inline void ring_init(KeyRing *kr) noexcept:
    kr.entries = NULL
    kr.head = 0
    kr.size = 0
    kr.cap = 0


cdef void ring_free(KeyRing *kr) noexcept:
    cdef int64_t i
    for i in range(kr.size):
        Py_XDECREF(kr.entries[(kr.head + i) % kr.cap].kt)
    PyMem_Free(kr.entries)
    ring_init(kr)


cdef int ring_reserve(KeyRing *kr, int64_t need) noexcept:
    """Room for ``need`` more entries; a result code."""
    cdef int64_t new_cap, i
    cdef RingEntry *p
    if kr.size + need <= kr.cap:
        return _OK
    new_cap = (kr.size + need) * 2 + 16
    p = <RingEntry *>PyMem_Malloc(<size_t>new_cap * sizeof(RingEntry))
    if p == NULL:
        return _NOMEM
    for i in range(kr.size):
        p[i] = kr.entries[(kr.head + i) % kr.cap]
    PyMem_Free(kr.entries)
    kr.entries = p
    kr.head = 0
    kr.cap = new_cap
    return _OK


cdef void ring_push(KeyRing *kr, double at, int64_t seq, PyObject *kt) noexcept:
    """Append (at, seq, kt) (there is room), taking a reference to ``kt``."""
    cdef RingEntry *e = &kr.entries[(kr.head + kr.size) % kr.cap]
    e.at = at
    e.seq = seq
    Py_INCREF(<object>kt)
    e.kt = kt
    kr.size += 1
