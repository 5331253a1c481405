# The plan of a ``publish_many`` batch (included by _inmemory_c.pyx, after
# the storage).
#
# A batch must allocate everything it will need before it publishes
# anything (a MemoryError must leave the transport as it was), and it may
# create many groups, over many new priority levels.  ``publish_many``
# checks every item first, keeping each one's priority and id hash here.
# Then, under the lock, ``InMemoryTransport._publish_known`` looks every
# group up: when all exist (the common case) it only makes room for the
# messages and publishes them.  Otherwise, having changed nothing, it lets
# go of the lock, and ``publish_many`` works out which distinct groups the
# batch names (in order of first appearance: the order in which new ones
# will be created) and with which priority each would be created (its first
# item's); under the lock again ``InMemoryTransport._publish_batch`` looks
# them up, counts the new groups per priority (``plan_count``), reserves
# message and group slots, id-table room and level heaps for exactly that,
# and only then commits, item by item, as ``publish`` would.
#
# The pure twin needs no plan: it adds the items one by one and takes them
# back if one fails (``InMemoryTransport._add_batch``).
#
# Functions: plan_init / plan_alloc / plan_free, plan_add_group, plan_count.


ctypedef struct BatchPlan:
    int64_t *item_prio   # by item: its priority
    Py_hash_t *item_hash # by item: hash of its group id
    int32_t *item_slot   # by item: its group's slot (_publish_known)
    int32_t *item_group  # by item: index of its group among the distinct groups
    Py_hash_t *hash      # by distinct group: hash of its id
    int64_t *priority    # by distinct group: the priority it would be created with
    int32_t *level       # by distinct group: index of that priority among the distinct ones
    int32_t *slot        # by distinct group: its slot, -1 when it does not exist (set under the lock)
    int64_t *level_prio  # by distinct priority: the priority
    int32_t *level_pos   # by distinct priority: its index in new_prio, -1 if no new group has it
    int64_t *new_prio    # the priorities of new groups, in order of their first new group...
    int64_t *new_count   # ...and how many new groups have each
    int32_t groups       # distinct groups
    int32_t levels       # distinct priorities
    int32_t new_levels   # entries of new_prio / new_count
    int32_t new_groups


cdef inline void plan_init(BatchPlan *plan) noexcept:
    memset(plan, 0, sizeof(BatchPlan))


cdef void plan_free(BatchPlan *plan) noexcept:
    PyMem_Free(plan.item_prio)
    PyMem_Free(plan.item_hash)
    PyMem_Free(plan.item_slot)
    PyMem_Free(plan.item_group)
    PyMem_Free(plan.hash)
    PyMem_Free(plan.priority)
    PyMem_Free(plan.level)
    PyMem_Free(plan.slot)
    PyMem_Free(plan.level_prio)
    PyMem_Free(plan.level_pos)
    PyMem_Free(plan.new_prio)
    PyMem_Free(plan.new_count)
    plan_init(plan)


cdef int plan_alloc(BatchPlan *plan, Py_ssize_t items) noexcept:
    """Room for a batch of ``items`` (each array by its largest possible
    size: as many groups and priorities as items); a result code."""
    cdef size_t n = <size_t>items
    plan.item_prio = <int64_t *>PyMem_Malloc(n * sizeof(int64_t))
    plan.item_hash = <Py_hash_t *>PyMem_Malloc(n * sizeof(Py_hash_t))
    plan.item_slot = <int32_t *>PyMem_Malloc(n * sizeof(int32_t))
    plan.item_group = <int32_t *>PyMem_Malloc(n * sizeof(int32_t))
    plan.hash = <Py_hash_t *>PyMem_Malloc(n * sizeof(Py_hash_t))
    plan.priority = <int64_t *>PyMem_Malloc(n * sizeof(int64_t))
    plan.level = <int32_t *>PyMem_Malloc(n * sizeof(int32_t))
    plan.slot = <int32_t *>PyMem_Malloc(n * sizeof(int32_t))
    plan.level_prio = <int64_t *>PyMem_Malloc(n * sizeof(int64_t))
    plan.level_pos = <int32_t *>PyMem_Malloc(n * sizeof(int32_t))
    plan.new_prio = <int64_t *>PyMem_Malloc(n * sizeof(int64_t))
    plan.new_count = <int64_t *>PyMem_Malloc(n * sizeof(int64_t))
    if (plan.item_prio == NULL or plan.item_hash == NULL or plan.item_slot == NULL
            or plan.item_group == NULL or plan.hash == NULL or plan.priority == NULL or plan.level == NULL
            or plan.slot == NULL or plan.level_prio == NULL or plan.level_pos == NULL or plan.new_prio == NULL
            or plan.new_count == NULL):
        return _NOMEM
    return _OK


cdef inline void plan_add_group(BatchPlan *plan, Py_hash_t h, int64_t prio, int32_t level) noexcept:
    """One more distinct group (id hash ``h``), created with priority
    ``prio``, the ``level``-th distinct priority (a new one: ``level ==
    plan.levels``)."""
    cdef int32_t j = plan.groups
    plan.hash[j] = h
    plan.priority[j] = prio
    plan.level[j] = level
    if level == plan.levels:
        plan.level_prio[level] = prio
        plan.level_pos[level] = -1
        plan.levels += 1
    plan.groups = j + 1


cdef void plan_count(BatchPlan *plan) noexcept:
    """With ``slot`` set: count the new groups, and per priority, listing the
    priorities in the order of their first new group (the order in which
    their levels would be created)."""
    cdef int32_t j, k, p
    plan.new_groups = 0
    plan.new_levels = 0
    for j in range(plan.groups):
        if plan.slot[j] >= 0:
            continue
        plan.new_groups += 1
        k = plan.level[j]
        p = plan.level_pos[k]
        if p < 0:
            p = plan.new_levels
            plan.new_levels += 1
            plan.level_pos[k] = p
            plan.new_prio[p] = plan.level_prio[k]
            plan.new_count[p] = 0
        plan.new_count[p] += 1
