# Message and group storage of the Cython transport (included by
# transport_c.pyx, after the structures that index into it).
#
# Records live in C arrays addressed by slot, unused slots chained in a
# free list:
#
# * ``MessageStore``: packed 12-byte ``Message`` records; each group's
#   messages form a singly linked FIFO through ``next``.  The events sit in
#   a Python list indexed by the same slot (owned by the transport), so the
#   garbage collector sees them.
# * ``GroupStore``: 64-byte ``Group`` records, the fields a claim touches
#   together.  Only a group's head message can be leased or parked, so the
#   lock state lives on the group.  The ids sit in a list by group slot
#   (owned by the transport); a group keeps a borrowed pointer to its id.
#   A slot is in use while its ``gid`` is set: a paused group may hold no
#   message (``count == 0``).  Beside the records, by slot: the worker of
#   the group's latest claim (``holder``, for ``group()``), the reason of a
#   buried group (``reason``: set exactly while the group is buried) and
#   the links of a list of the groups in creation order (``older``/
#   ``newer``, for ``groups()``).
#
# Growing comes before any change (publish grows first, then commits);
# shrinking is best effort: when under a quarter of the slots is in use the
# live records are renumbered 0..n-1 into arrays half as full (amortised
# O(1)), and a failed allocation just skips it.  Renumbering groups renumbers
# every structure indexed by group slot: the id table, the ready heaps and
# the expiry heap.  A lease keeps the slot it was issued with; the
# transport's ``_current`` finds a moved group again by its id.
#
# The pure twin keeps a ``_Group`` object per group, its messages in a list
# on it; ``groups_forget`` is its ``InMemoryTransport._forget``.  What Part 5
# adds to some messages (a due time, a key) is in the mark table
# (marks.pxi), not in these records.
#
# Functions: messages_grow, messages_reserve, message_add, messages_sparse /
# messages_compact; groups_grow, groups_reserve, groups_add, group_append,
# group_shift / group_take, group_clear, group_hold, group_view,
# groups_forget / groups_forget_ref, groups_compact.


cdef struct Group:       # forward-declared in ids.pxi
    PyObject *gid        # the group id (borrowed: the transport's _group_ids owns it)
    int64_t key          # round-robin key
    int64_t attempt      # deliveries of the head message so far
    double expires_at    # end of the lease/park (when lock != _FREE)
    double claimed_at    # time of the last claim (recorded, as the seed does)
    int32_t head         # oldest message slot (free list link when unused)
    int32_t tail         # newest message slot
    int32_t count        # messages held; 0 = slot unused
    int32_t level        # priority level (treap node)
    uint8_t lock         # _FREE / _LEASED / _PARKED / _SCHED
    uint8_t open         # the head's latest delivery is still current
    uint8_t paused       # by pause(): never made ready while set
    uint8_t marks        # _M_DUE / _M_KEY: a message of it may be in the mark table (marks.pxi)


# One message: its seq and the next message of its group (or the free-list
# link).  Packed to 12 bytes; ``claim`` reads ``seq`` and the ``ack`` right
# after it reads ``next`` of the same message: one cache line, not two.
ctypedef packed struct Message:
    int64_t seq
    int32_t next


ctypedef struct MessageStore:
    Message *at          # by message slot; len(events) >= cap
    int32_t cap
    int32_t free         # first unused slot (chained through ``next``), -1 if none
    int64_t used         # messages held


ctypedef struct GroupStore:
    Group *at            # by group slot; len(group_ids) >= cap
    PyObject **holder    # by group slot: worker id of the latest claim (owned, an exact str), or NULL
    PyObject **reason    # by group slot: the bury reason (owned, an exact str) while buried, else NULL
    int32_t *older       # by group slot: the group created just before, -1 if none
    int32_t *newer       # by group slot: the group created just after, -1 if none
    int32_t oldest       # first group in creation order, -1 if none
    int32_t newest       # last group in creation order, -1 if none
    int32_t cap
    int32_t free         # first unused slot (chained through ``head``), -1 if none
    int32_t used         # groups held (empty paused ones included)


# What ``group()`` / ``groups()`` report of one group, copied under the lock
# (the references are owned: the GroupInfo is built after the lock).
ctypedef struct GroupView:
    PyObject *gid
    PyObject *holder     # the worker of a live lease or of the buried delivery, else NULL
    PyObject *reason     # the bury reason while buried, else NULL
    int64_t priority
    int64_t head_seq     # when messages > 0
    int64_t attempt
    double expires_at
    double claimed_at
    double due_at        # the head's due while it is scheduled (lock == _SCHED)
    int32_t messages
    uint8_t lock
    uint8_t paused
    uint8_t claimed      # ever claimed (its key is a claim number)


cdef inline void messages_init(MessageStore *ms) noexcept:
    ms.at = NULL
    ms.cap = 0
    ms.free = -1
    ms.used = 0


cdef inline void groups_init(GroupStore *gs) noexcept:
    gs.at = NULL
    gs.holder = NULL
    gs.reason = NULL
    gs.older = NULL
    gs.newer = NULL
    gs.oldest = -1
    gs.newest = -1
    gs.cap = 0
    gs.free = -1
    gs.used = 0


cdef void groups_free(GroupStore *gs) noexcept:
    cdef int32_t i
    if gs.holder != NULL:
        for i in range(gs.cap):
            Py_XDECREF(gs.holder[i])
    if gs.reason != NULL:
        for i in range(gs.cap):
            Py_XDECREF(gs.reason[i])
    PyMem_Free(gs.at)
    PyMem_Free(gs.holder)
    PyMem_Free(gs.reason)
    PyMem_Free(gs.older)
    PyMem_Free(gs.newer)
    groups_init(gs)


# -- messages


cdef int messages_grow(MessageStore *ms, list events) except -1:
    """More unused message slots; a result code."""
    cdef int64_t new_cap = <int64_t>ms.cap + ms.cap // 4 + 64
    cdef int32_t i
    cdef void *p
    if ms.cap >= INT32_MAX - 1:
        return _FULL
    if new_cap > INT32_MAX - 1:
        new_cap = INT32_MAX - 1
    while len(events) < new_cap:
        PyList_Append(events, None)
    p = PyMem_Realloc(ms.at, <size_t>new_cap * sizeof(Message))
    if p == NULL:
        return _NOMEM
    ms.at = <Message *>p
    for i in range(<int32_t>new_cap - 1, ms.cap - 1, -1):
        ms.at[i].next = ms.free
        ms.free = i
    ms.cap = <int32_t>new_cap
    return _OK


cdef int messages_reserve(MessageStore *ms, list events, int64_t need) except -1:
    """At least ``need`` unused message slots; a result code."""
    cdef int rc
    while ms.cap - ms.used < need:
        rc = messages_grow(ms, events)
        if rc != _OK:
            return rc
    return _OK


cdef inline int32_t message_add(MessageStore *ms, list events, int64_t seq, object event) noexcept:
    """Store message ``seq`` in an unused slot (there is one); its slot,
    linked to nothing yet."""
    cdef int32_t m = ms.free
    ms.free = ms.at[m].next
    ms.at[m].seq = seq
    ms.at[m].next = -1
    lq_list_swap(events, m, event)
    ms.used += 1
    return m


cdef inline bint messages_sparse(const MessageStore *ms) noexcept:
    """Whether under a quarter of the slots is in use (``messages_compact`` would shrink them)."""
    return ms.cap > _MIN_MESSAGE_CAP and ms.used * 4 < ms.cap


cdef void messages_compact(MessageStore *ms, list events, GroupStore *gs) noexcept:
    """Renumber live messages 0..n-1 (group by group) into smaller arrays."""
    cdef int64_t live = ms.used
    cdef int64_t new_cap = live * 2
    cdef Message *msgs
    cdef PyObject **moved
    cdef int32_t s, m, following, k = 0, i
    cdef Group *g
    if new_cap < _MIN_MESSAGE_CAP:
        new_cap = _MIN_MESSAGE_CAP
    if new_cap >= ms.cap:
        return
    msgs = <Message *>PyMem_Malloc(<size_t>new_cap * sizeof(Message))
    moved = <PyObject **>PyMem_Malloc(<size_t>(live + 1) * sizeof(PyObject *))
    if msgs == NULL or moved == NULL:
        PyMem_Free(msgs)
        PyMem_Free(moved)
        return
    for s in range(gs.cap):
        g = &gs.at[s]
        if g.count == 0:
            continue
        m = g.head
        g.head = k
        while m >= 0:
            msgs[k].seq = ms.at[m].seq
            moved[k] = lq_list_take(events, m)
            following = ms.at[m].next
            if following >= 0:
                msgs[k].next = k + 1
            else:
                msgs[k].next = -1
                g.tail = k
            k += 1
            m = following
    for i in range(k):
        lq_list_put(events, i, moved[i])
    PyMem_Free(moved)
    ms.free = -1
    for i in range(<int32_t>new_cap - 1, k - 1, -1):
        msgs[i].next = ms.free
        ms.free = i
    PyMem_Free(ms.at)
    ms.at = msgs
    ms.cap = <int32_t>new_cap
    lq_list_truncate(events, new_cap)


# -- groups


cdef int groups_grow(GroupStore *gs, list group_ids, ReadySet *rs, ExpiryHeap *xh) except -1:
    """More unused group slots (and room for them in the heaps' indexes); a
    result code."""
    cdef int64_t new_cap = <int64_t>gs.cap + gs.cap // 4 + 16
    cdef int32_t i
    cdef void *p
    if gs.cap >= INT32_MAX - 1:
        return _FULL
    if new_cap > INT32_MAX - 1:
        new_cap = INT32_MAX - 1
    while len(group_ids) < new_cap:
        PyList_Append(group_ids, None)
    # Each array keeps its old contents, so a failure half-way leaves some
    # of them longer than ``cap``, which is harmless.
    p = PyMem_Realloc(gs.at, <size_t>new_cap * sizeof(Group))
    if p == NULL:
        return _NOMEM
    gs.at = <Group *>p
    p = PyMem_Realloc(gs.holder, <size_t>new_cap * sizeof(PyObject *))
    if p == NULL:
        return _NOMEM
    gs.holder = <PyObject **>p
    for i in range(gs.cap, <int32_t>new_cap):
        gs.holder[i] = NULL
    p = PyMem_Realloc(gs.reason, <size_t>new_cap * sizeof(PyObject *))
    if p == NULL:
        return _NOMEM
    gs.reason = <PyObject **>p
    for i in range(gs.cap, <int32_t>new_cap):
        gs.reason[i] = NULL
    p = PyMem_Realloc(gs.older, <size_t>new_cap * sizeof(int32_t))
    if p == NULL:
        return _NOMEM
    gs.older = <int32_t *>p
    p = PyMem_Realloc(gs.newer, <size_t>new_cap * sizeof(int32_t))
    if p == NULL:
        return _NOMEM
    gs.newer = <int32_t *>p
    if ready_resize_index(rs, gs.cap, new_cap) != _OK:
        return _NOMEM
    if expiry_resize_index(xh, gs.cap, new_cap) != _OK:
        return _NOMEM
    for i in range(<int32_t>new_cap - 1, gs.cap - 1, -1):
        gs.at[i].gid = NULL
        gs.at[i].count = 0
        gs.at[i].head = gs.free
        gs.free = i
    gs.cap = <int32_t>new_cap
    return _OK


cdef int groups_reserve(GroupStore *gs, list group_ids, ReadySet *rs, ExpiryHeap *xh, int64_t need) except -1:
    """At least ``need`` unused group slots; a result code."""
    cdef int rc
    while gs.cap - gs.used < need:
        rc = groups_grow(gs, group_ids, rs, xh)
        if rc != _OK:
            return rc
    return _OK


cdef inline int32_t groups_add(GroupStore *gs, list group_ids, IdTable *ids, str gid, uint32_t h32) noexcept:
    """Enter group ``gid`` (absent; low hash bits ``h32``) in an unused slot
    (there is one, and room in the id table); its slot.  Its fields are the
    caller's to set."""
    cdef int32_t slot = gs.free
    gs.free = gs.at[slot].head
    gs.at[slot].gid = <PyObject *>gid
    ids_insert(ids, slot, h32)
    gs.used += 1
    lq_list_swap(group_ids, slot, gid)
    # last in creation order
    gs.older[slot] = gs.newest
    gs.newer[slot] = -1
    if gs.newest >= 0:
        gs.newer[gs.newest] = slot
    else:
        gs.oldest = slot
    gs.newest = slot
    return slot


cdef inline void group_append(MessageStore *ms, Group *g, int32_t m) noexcept:
    """Put message slot ``m`` at the end of group ``g``'s FIFO (not empty)."""
    ms.at[g.tail].next = m
    g.tail = m
    g.count += 1


cdef inline object group_shift(MessageStore *ms, list events, Group *g):
    """Take group ``g``'s head message out and free its slot.  Returns its
    event: the caller drops that reference after releasing the lock."""
    cdef int32_t m = g.head
    cdef object spent = lq_list_swap(events, m, None)
    g.head = ms.at[m].next
    ms.at[m].next = ms.free
    ms.free = m
    g.count -= 1
    ms.used -= 1
    return spent


cdef inline PyObject *group_take(MessageStore *ms, list events, Group *g) noexcept:
    """``group_shift`` handing back an owned reference to the event, for a
    C array of them (``ack_many``)."""
    cdef int32_t m = g.head
    cdef PyObject *spent = lq_list_take(events, m)
    g.head = ms.at[m].next
    ms.at[m].next = ms.free
    ms.free = m
    g.count -= 1
    ms.used -= 1
    return spent


cdef void group_clear(MessageStore *ms, list events, Group *g, PyObject **spent) noexcept:
    """Take every message of group ``g`` out and free their slots; their
    events go to ``spent[0 .. count-1]`` (owned references, which the
    caller drops after releasing the lock)."""
    cdef int32_t m = g.head, following, i = 0
    while i < g.count:
        spent[i] = lq_list_take(events, m)
        following = ms.at[m].next
        ms.at[m].next = ms.free
        ms.free = m
        m = following
        i += 1
    ms.used -= g.count
    g.count = 0
    g.head = -1
    g.tail = -1


cdef inline void group_hold(GroupStore *gs, int32_t slot, PyObject *worker_id) noexcept:
    """Record ``worker_id`` (an exact str) as the worker of group ``slot``'s
    latest claim.  The one it replaces is an exact str too: releasing it
    runs no user code."""
    cdef PyObject *old = gs.holder[slot]
    if old != worker_id:
        Py_XINCREF(worker_id)
        gs.holder[slot] = worker_id
        Py_XDECREF(old)


cdef void group_view(const GroupStore *gs, const MessageStore *ms, const ReadySet *rs, int32_t slot,
                     GroupView *view) noexcept:
    """Copy what ``GroupInfo`` says of group ``slot`` into ``view`` (expiry
    already applied, so a lock still set is live), taking references to the
    id and the lease holder."""
    cdef const Group *g = &gs.at[slot]
    view.gid = g.gid
    Py_XINCREF(view.gid)
    view.holder = NULL
    view.reason = gs.reason[slot]
    Py_XINCREF(view.reason)
    if g.lock == _LEASED or view.reason != NULL:  # a buried group: the buried delivery's worker
        view.holder = gs.holder[slot]
        Py_XINCREF(view.holder)
    view.priority = rs.levels[g.level].priority
    view.head_seq = ms.at[g.head].seq if g.count else 0
    view.attempt = g.attempt
    view.expires_at = g.expires_at
    view.due_at = g.expires_at  # read only when lock == _SCHED: the due is its end
    view.claimed_at = g.claimed_at
    view.messages = g.count
    view.lock = g.lock
    view.paused = g.paused
    view.claimed = g.key > 0


cdef object groups_forget(
    GroupStore *gs, list group_ids, IdTable *ids, ReadySet *rs, ExpiryHeap *xh, int32_t slot,
):
    """Drop an emptied, unlocked group from every structure (its priority
    and round-robin position go too); returns its id, which the caller
    releases after the lock."""
    cdef Group *g = &gs.at[slot]
    cdef int32_t lv = g.level
    cdef object gid
    if ready_contains(rs, slot):
        ready_remove(rs, slot, lv)
    ids_delete(ids, slot, g.gid)
    gid = lq_list_swap(group_ids, slot, None)
    g.gid = NULL
    g.head = gs.free
    gs.free = slot
    gs.used -= 1
    # out of the creation order
    if gs.older[slot] >= 0:
        gs.newer[gs.older[slot]] = gs.newer[slot]
    else:
        gs.oldest = gs.newer[slot]
    if gs.newer[slot] >= 0:
        gs.older[gs.newer[slot]] = gs.older[slot]
    else:
        gs.newest = gs.older[slot]
    Py_XDECREF(gs.holder[slot])  # an exact str: no user code
    gs.holder[slot] = NULL
    Py_XDECREF(gs.reason[slot])  # NULL (a buried group is never forgotten), or an exact str
    gs.reason[slot] = NULL
    ready_drop_group(rs, lv)
    if gs.cap > _MIN_GROUP_CAP and gs.used * 4 < gs.cap:
        groups_compact(gs, group_ids, ids, rs, xh)
    return gid


cdef PyObject *groups_forget_ref(
    GroupStore *gs, list group_ids, IdTable *ids, ReadySet *rs, ExpiryHeap *xh, int32_t slot,
) noexcept:
    """``groups_forget`` handing back an owned reference to the id, for a C
    array of them (``ack_many``)."""
    cdef object gid = groups_forget(gs, group_ids, ids, rs, xh, slot)
    Py_XINCREF(<PyObject *>gid)
    return <PyObject *>gid


cdef void groups_compact(GroupStore *gs, list group_ids, IdTable *ids, ReadySet *rs, ExpiryHeap *xh) noexcept:
    """Renumber live groups 0..n-1 into smaller arrays, renumbering the id
    table and the heaps with them.

    Leases keep the slot they were issued with; ``_current`` finds a moved
    group again by its id.
    """
    cdef int64_t live = gs.used
    cdef int64_t new_cap = live * 2
    cdef size_t ids_size
    cdef Group *groups
    cdef PyObject **holder
    cdef PyObject **reason
    cdef int32_t *older
    cdef int32_t *newer
    cdef int32_t *rpos
    cdef int32_t *xpos
    cdef int32_t *remap
    cdef IdEntry *table
    cdef int32_t s, k = 0, j
    if new_cap < _MIN_GROUP_CAP:
        new_cap = _MIN_GROUP_CAP
    if new_cap >= gs.cap:
        return
    groups = <Group *>PyMem_Malloc(<size_t>new_cap * sizeof(Group))
    holder = <PyObject **>PyMem_Malloc(<size_t>new_cap * sizeof(PyObject *))
    reason = <PyObject **>PyMem_Malloc(<size_t>new_cap * sizeof(PyObject *))
    older = <int32_t *>PyMem_Malloc(<size_t>new_cap * sizeof(int32_t))
    newer = <int32_t *>PyMem_Malloc(<size_t>new_cap * sizeof(int32_t))
    rpos = <int32_t *>PyMem_Malloc(<size_t>new_cap * sizeof(int32_t))
    xpos = <int32_t *>PyMem_Malloc(<size_t>new_cap * sizeof(int32_t))
    remap = <int32_t *>PyMem_Malloc(<size_t>gs.cap * sizeof(int32_t))
    table = ids_new_table(live, &ids_size)
    if (groups == NULL or holder == NULL or reason == NULL or older == NULL or newer == NULL or rpos == NULL
            or xpos == NULL or remap == NULL or table == NULL):
        PyMem_Free(groups)
        PyMem_Free(holder)
        PyMem_Free(reason)
        PyMem_Free(older)
        PyMem_Free(newer)
        PyMem_Free(rpos)
        PyMem_Free(xpos)
        PyMem_Free(remap)
        PyMem_Free(table)
        return
    for s in range(gs.cap):
        if gs.at[s].gid == NULL:
            remap[s] = -1
            continue
        remap[s] = k
        groups[k] = gs.at[s]
        holder[k] = gs.holder[s]  # the reference moves
        reason[k] = gs.reason[s]  # this one too
        if k != s:  # k < s: position k already gave its id away (or had none)
            lq_list_put(group_ids, k, lq_list_take(group_ids, s))
        k += 1
    for s in range(gs.cap):  # the creation order, renumbered
        if remap[s] >= 0:
            older[remap[s]] = remap[gs.older[s]] if gs.older[s] >= 0 else -1
            newer[remap[s]] = remap[gs.newer[s]] if gs.newer[s] >= 0 else -1
    if gs.oldest >= 0:
        gs.oldest = remap[gs.oldest]
        gs.newest = remap[gs.newest]
    gs.free = -1
    for j in range(<int32_t>new_cap - 1, k - 1, -1):
        groups[j].gid = NULL
        groups[j].count = 0
        groups[j].head = gs.free
        holder[j] = NULL
        reason[j] = NULL
        gs.free = j
    ready_renumber(rs, rpos, <int32_t>new_cap, remap, gs.cap)
    expiry_renumber(xh, xpos, <int32_t>new_cap, remap, gs.cap)
    ids_renumber(ids, table, ids_size, remap)
    PyMem_Free(remap)
    PyMem_Free(gs.at)
    PyMem_Free(gs.holder)
    PyMem_Free(gs.reason)
    PyMem_Free(gs.older)
    PyMem_Free(gs.newer)
    gs.at = groups
    gs.holder = holder
    gs.reason = reason
    gs.older = older
    gs.newer = newer
    gs.cap = <int32_t>new_cap
    lq_list_truncate(group_ids, new_cap)
