# The plan of a ``publish_many`` batch (included by transport_c.pyx, after
# the storage).
#
# A batch must allocate everything it will need before it publishes
# anything (a MemoryError must leave the transport as it was), and it may
# create many groups, over many new priority levels.  ``publish_many``
# checks every item first, keeping each one's priority and id hash here,
# and allocates the plan's arrays.  Under the lock,
# ``InMemoryTransport._publish_batch`` looks every item's group up; the
# items whose group does not exist are gathered into distinct *new groups*
# (``plan_new_group``: a small open-addressing table over them, in order of
# first appearance, which is the order in which they will be created, each
# with its first item's priority), and the new groups are counted per
# priority, the priorities listed in the order of their first new group
# (``plan_count_level``: the order in which their levels would be created).
# With those counts it reserves group slots, id-table room and level heaps
# (``ready_reserve_levels``), then message slots, and only then commits,
# item by item, as ``publish`` would.  When every group exists (the common
# case) the plan is just the lookups.
#
# The pure twin needs no plan: it adds the items one by one and takes them
# back if one fails (``InMemoryTransport._add_batch``).
#
# Functions: plan_init / plan_alloc / plan_free, plan_new_group,
# plan_count_level.


ctypedef struct BatchPlan:
    int64_t *item_prio   # by item: its priority
    Py_hash_t *item_hash # by item: hash of its group id
    int32_t *item_slot   # by item: its group's slot, or -1 - j for the j-th new group
    int32_t *group_first # by new group: its first item
    int32_t *group_slot  # by new group: its slot once created, -1 before
    int32_t *group_table # open addressing over the new groups (index, -1 if empty)
    int64_t *new_prio    # the priorities of new groups, in order of their first new group...
    int64_t *new_count   # ...and how many new groups have each
    int32_t *prio_table  # open addressing over new_prio (index, -1 if empty)
    size_t mask          # both tables' size - 1 (a power of two, at least twice the items)
    int32_t groups       # new groups
    int32_t levels       # entries of new_prio / new_count
    # Part 5 (only a batch with a delay or keys): by item, whether it
    # publishes nothing (its key is held, or an earlier item of the batch
    # has it: ``item_seq`` is then the holder's seq, or -1 - the earlier
    # item), and the seq it gets.
    uint8_t *item_skip   # NULL: every item is published
    int64_t *item_seq
    int32_t skipped      # items skipped


cdef inline void plan_init(BatchPlan *plan) noexcept:
    memset(plan, 0, sizeof(BatchPlan))


cdef void plan_free(BatchPlan *plan) noexcept:
    PyMem_Free(plan.item_prio)
    PyMem_Free(plan.item_hash)
    PyMem_Free(plan.item_slot)
    PyMem_Free(plan.group_first)
    PyMem_Free(plan.group_slot)
    PyMem_Free(plan.group_table)
    PyMem_Free(plan.new_prio)
    PyMem_Free(plan.new_count)
    PyMem_Free(plan.prio_table)
    PyMem_Free(plan.item_skip)
    PyMem_Free(plan.item_seq)
    plan_init(plan)


cdef int plan_alloc(BatchPlan *plan, Py_ssize_t items) noexcept:
    """Room for a batch of ``items`` (as many new groups and priorities as
    items at most), the tables empty; a result code."""
    cdef size_t n = <size_t>items
    cdef size_t size = 16
    while size < 2 * n:
        size *= 2
    plan.mask = size - 1
    plan.item_prio = <int64_t *>PyMem_Malloc(n * sizeof(int64_t))
    plan.item_hash = <Py_hash_t *>PyMem_Malloc(n * sizeof(Py_hash_t))
    plan.item_slot = <int32_t *>PyMem_Malloc(n * sizeof(int32_t))
    plan.group_first = <int32_t *>PyMem_Malloc(n * sizeof(int32_t))
    plan.group_slot = <int32_t *>PyMem_Malloc(n * sizeof(int32_t))
    plan.group_table = <int32_t *>PyMem_Malloc(size * sizeof(int32_t))
    plan.new_prio = <int64_t *>PyMem_Malloc(n * sizeof(int64_t))
    plan.new_count = <int64_t *>PyMem_Malloc(n * sizeof(int64_t))
    plan.prio_table = <int32_t *>PyMem_Malloc(size * sizeof(int32_t))
    if (plan.item_prio == NULL or plan.item_hash == NULL or plan.item_slot == NULL or plan.group_first == NULL
            or plan.group_slot == NULL or plan.group_table == NULL or plan.new_prio == NULL
            or plan.new_count == NULL or plan.prio_table == NULL):
        return _NOMEM
    memset(plan.group_table, 0xFF, size * sizeof(int32_t))  # -1: empty
    memset(plan.prio_table, 0xFF, size * sizeof(int32_t))
    return _OK


cdef int plan_alloc_marked(BatchPlan *plan, Py_ssize_t items) noexcept:
    """The arrays of a batch with a delay or keys (none skipped yet); a
    result code."""
    cdef size_t n = <size_t>items
    plan.item_skip = <uint8_t *>PyMem_Malloc(n)
    plan.item_seq = <int64_t *>PyMem_Malloc(n * sizeof(int64_t))
    if plan.item_skip == NULL or plan.item_seq == NULL:
        return _NOMEM
    memset(plan.item_skip, 0, n)
    return _OK


cdef inline PyObject *plan_item_id(list batch, int32_t i) noexcept:
    """Item ``i``'s group id (borrowed: the batch holds it)."""
    return PyTuple_GET_ITEM(<object>PyList_GET_ITEM(batch, i), 0)


cdef int32_t plan_new_group(BatchPlan *plan, list batch, int32_t i) noexcept:
    """Item ``i``'s group does not exist: the index of its new group (a new
    one if no earlier item named it)."""
    cdef Py_hash_t h = plan.item_hash[i]
    cdef size_t pos = <size_t>h & plan.mask
    cdef int32_t j
    cdef PyObject *gid = plan_item_id(batch, i)
    while True:
        j = plan.group_table[pos]
        if j < 0:
            break
        if plan.item_hash[plan.group_first[j]] == h and lq_str_eq(gid, plan_item_id(batch, plan.group_first[j])):
            return j
        pos = (pos + 1) & plan.mask
    j = plan.groups
    plan.groups = j + 1
    plan.group_table[pos] = j
    plan.group_first[j] = i
    plan.group_slot[j] = -1
    plan_count_level(plan, plan.item_prio[i])
    return j


cdef void plan_count_level(BatchPlan *plan, int64_t prio) noexcept:
    """One more new group of priority ``prio``."""
    cdef size_t pos = <size_t>((<uint64_t>prio * <uint64_t>0x9E3779B97F4A7C15) >> 32) & plan.mask
    cdef int32_t p
    while True:
        p = plan.prio_table[pos]
        if p < 0:
            break
        if plan.new_prio[p] == prio:
            plan.new_count[p] += 1
            return
        pos = (pos + 1) & plan.mask
    p = plan.levels
    plan.levels = p + 1
    plan.prio_table[pos] = p
    plan.new_prio[p] = prio
    plan.new_count[p] = 1
