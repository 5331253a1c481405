# The ready heaps and the level treap of the Cython transport (included by
# transport_c.pyx).
#
# A group is ready when it holds messages and nothing of it is leased or
# parked.  Each distinct priority is a ``Level`` with an indexed 4-ary
# min-heap of its ready groups, keyed by their round-robin key; ``pos`` maps
# a group slot to its position in its level's heap (-1: not ready), so a
# group leaves its heap at once when it is locked (the pure twin's heaps are
# lazy instead).  The levels are the nodes of a treap ordered by priority
# (heap-ordered by random weights); every node knows the smallest ready key
# of its subtree (``best``/``best_key``), so "the smallest key among the
# levels with priority >= p" is one walk from the root: O(log L).
#
# Capacity: a level's heap always has room for every group of its priority
# (``Level.cap >= Level.groups``), reserved by ready_reserve_group when a
# group is created, so making a group ready never allocates.
#
# Functions (pure twin's counterpart in brackets):
#   ready_push [InMemoryTransport._make_ready], ready_remove [_unready],
#   ready_best / ready_find [_find], ready_pop [_take_top],
#   ready_repair [_repair], treap_pull / treap_split / treap_merge /
#   treap_insert / treap_delete [_treap_pull, ...], and the level lifecycle
#   ready_reserve_group / ready_reserve_levels / ready_add_group /
#   ready_drop_group [_add, _add_batch, _set_level, _forget];
#   for the group storage ready_resize_index / ready_renumber.


ctypedef struct ReadyEntry:
    int64_t key
    int32_t group


ctypedef struct Level:
    int64_t priority
    int64_t best_key     # smallest ready key of the subtree (valid if best >= 0)
    int64_t groups       # groups of this priority (any state)
    ReadyEntry *heap     # ready groups of this priority, min-heap on key
    int32_t size
    int32_t cap          # >= groups: pushes never allocate
    int32_t best         # level holding best_key, -1 when none is ready
    int32_t left         # treap children, -1 for none; free-list link
    int32_t right
    uint32_t weight      # treap heap order (max at the root)


ctypedef struct ReadySet:
    Level *levels        # treap nodes; unused ones are chained through ``left``
    int32_t *pos         # group slot -> position in its level's heap, -1 if not ready
    int32_t cap          # levels allocated
    int32_t free         # first unused level, -1 if none
    int32_t root         # treap root, -1 when there is no level
    uint32_t rng         # xorshift32 state for the treap weights


cdef inline void ready_init(ReadySet *rs) noexcept:
    rs.levels = NULL
    rs.pos = NULL
    rs.cap = 0
    rs.free = -1
    rs.root = -1
    rs.rng = 0x1EA5E


cdef void ready_free(ReadySet *rs) noexcept:
    cdef int32_t i
    if rs.levels != NULL:
        for i in range(rs.cap):
            PyMem_Free(rs.levels[i].heap)
        PyMem_Free(rs.levels)
    PyMem_Free(rs.pos)
    ready_init(rs)


# -- the heaps


cdef inline bint ready_contains(const ReadySet *rs, int32_t slot) noexcept:
    """Whether group ``slot`` is in its level's heap."""
    return rs.pos[slot] >= 0


cdef void ready_push(ReadySet *rs, int32_t slot, int32_t lv, int64_t key) noexcept:
    """Put a free group in its level's heap under its round-robin key."""
    cdef Level *level = &rs.levels[lv]
    cdef int32_t pos = level.size
    cdef int32_t node
    cdef int64_t prio
    level.size += 1
    pos = ready_sift_up(rs, level.heap, pos, key, slot)
    if pos == 0:
        # A new minimum for this level: lower ``best`` on the path to it.
        prio = level.priority
        node = rs.root
        while True:
            if rs.levels[node].best < 0 or key < rs.levels[node].best_key:
                rs.levels[node].best = lv
                rs.levels[node].best_key = key
            if rs.levels[node].priority == prio:
                break
            if prio < rs.levels[node].priority:
                node = rs.levels[node].left
            else:
                node = rs.levels[node].right


cdef void ready_remove(ReadySet *rs, int32_t slot, int32_t lv) noexcept:
    """Take a ready group (of level ``lv``) out of its level's heap."""
    cdef int32_t pos = rs.pos[slot]
    ready_remove_at(rs, lv, pos)
    if pos == 0:
        ready_repair(rs, rs.root, rs.levels[lv].priority)


cdef inline int32_t ready_best(ReadySet *rs, int64_t minp) noexcept:
    """The level holding the smallest ready key among priorities >= minp, or -1."""
    cdef int32_t root = rs.root
    cdef Level *level
    if root < 0:
        return -1
    level = &rs.levels[root]
    if level.left < 0 and level.right < 0:
        # One priority level: its heap top is the answer.
        if level.size == 0 or level.priority < minp:
            return -1
        return root
    return ready_find(rs, minp)


cdef inline int32_t ready_pop(ReadySet *rs, int32_t lv) noexcept:
    """Take the top group out of level ``lv``'s heap; its slot."""
    cdef int32_t slot = rs.levels[lv].heap[0].group
    ready_remove_at(rs, lv, 0)
    ready_repair(rs, rs.root, rs.levels[lv].priority)
    return slot


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline int32_t ready_sift_up(
    ReadySet *rs, ReadyEntry *heap, int32_t pos, int64_t key, int32_t slot,
) noexcept:
    """Place (key, slot) in the hole at ``pos`` moving it up; its final position."""
    cdef int32_t parent
    cdef int32_t *rpos = rs.pos
    while pos > 0:
        parent = (pos - 1) >> 2
        if heap[parent].key <= key:
            break
        heap[pos] = heap[parent]
        rpos[heap[pos].group] = pos
        pos = parent
    heap[pos].key = key
    heap[pos].group = slot
    rpos[slot] = pos
    return pos


cdef void ready_remove_at(ReadySet *rs, int32_t lv, int32_t pos) noexcept:
    """Remove the entry at ``pos`` of level ``lv``'s heap (``best`` is not repaired)."""
    cdef Level *level = &rs.levels[lv]
    cdef ReadyEntry *heap = level.heap
    cdef int32_t *rpos = rs.pos
    cdef int32_t n, child, c, a, b, end
    cdef int64_t ckey
    cdef ReadyEntry last
    rpos[heap[pos].group] = -1
    level.size -= 1
    end = level.size
    if pos == end:
        return
    last = heap[end]
    if pos > 0 and heap[(pos - 1) >> 2].key > last.key:
        ready_sift_up(rs, heap, pos, last.key, last.group)
        return
    # Sift the hole down to a leaf along the smallest children, then up
    # (heapq's strategy: ``last`` is usually large and belongs low).
    # A 4-ary heap: half the depth of a binary one, and a node's four
    # children share one or two cache lines.
    n = pos
    child = 4 * n + 1
    while child < end:
        if child + 3 < end:
            # All four children: a branch-free tournament (the outcomes
            # are coin flips, so branches would mispredict half the time).
            a = child + <int32_t>(heap[child + 1].key < heap[child].key)
            b = child + 2 + <int32_t>(heap[child + 3].key < heap[child + 2].key)
            child = b if heap[b].key < heap[a].key else a
        else:
            ckey = heap[child].key
            c = child + 1
            while c < end:
                if heap[c].key < ckey:
                    child = c
                    ckey = heap[c].key
                c += 1
        heap[n] = heap[child]
        rpos[heap[n].group] = n
        n = child
        child = 4 * n + 1
    ready_sift_up_bounded(rs, heap, n, pos, last.key, last.group)


cdef inline void ready_sift_up_bounded(
    ReadySet *rs, ReadyEntry *heap, int32_t pos, int32_t top, int64_t key, int32_t slot,
) noexcept:
    """``ready_sift_up`` that stops at position ``top``."""
    cdef int32_t parent
    cdef int32_t *rpos = rs.pos
    while pos > top:
        parent = (pos - 1) >> 2
        if heap[parent].key <= key:
            break
        heap[pos] = heap[parent]
        rpos[heap[pos].group] = pos
        pos = parent
    heap[pos].key = key
    heap[pos].group = slot
    rpos[slot] = pos


# -- the treap of levels


cdef inline void treap_pull(ReadySet *rs, int32_t n) noexcept:
    """Recompute ``best`` of node ``n`` from its heap top and its children."""
    cdef Level *lv = rs.levels
    cdef Level *node = &lv[n]
    cdef int32_t best = -1, c
    cdef int64_t key = INT64_MAX
    if node.size:
        best = n
        key = node.heap[0].key
    c = node.left
    if c >= 0 and lv[c].best >= 0 and (best < 0 or lv[c].best_key < key):
        best = lv[c].best
        key = lv[c].best_key
    c = node.right
    if c >= 0 and lv[c].best >= 0 and (best < 0 or lv[c].best_key < key):
        best = lv[c].best
        key = lv[c].best_key
    node.best = best
    node.best_key = key


cdef void ready_repair(ReadySet *rs, int32_t node, int64_t prio) noexcept:
    """Recompute ``best`` on the path from ``node`` down to level ``prio``."""
    cdef Level *n = &rs.levels[node]
    if n.priority != prio:
        ready_repair(rs, n.left if prio < n.priority else n.right, prio)
    treap_pull(rs, node)


cdef int32_t ready_find(ReadySet *rs, int64_t minp) noexcept:
    """The level holding the smallest ready key among priorities >= minp, or -1."""
    cdef Level *lv = rs.levels
    cdef int32_t node = rs.root, best = -1, r
    cdef int64_t key = INT64_MAX
    while node >= 0:
        if lv[node].priority >= minp:
            if lv[node].size and (best < 0 or lv[node].heap[0].key < key):
                best = node
                key = lv[node].heap[0].key
            r = lv[node].right
            if r >= 0 and lv[r].best >= 0 and (best < 0 or lv[r].best_key < key):
                best = lv[r].best
                key = lv[r].best_key
            node = lv[node].left
        else:
            node = lv[node].right
    return best


cdef int32_t ready_find_level(const ReadySet *rs, int64_t prio) noexcept:
    """The level of priority ``prio``, or -1."""
    cdef int32_t node = rs.root
    while node >= 0:
        if rs.levels[node].priority == prio:
            return node
        node = rs.levels[node].left if prio < rs.levels[node].priority else rs.levels[node].right
    return -1


cdef inline uint32_t treap_next_weight(ReadySet *rs) noexcept:
    # xorshift32: the treap only needs weights that look random.
    cdef uint32_t x = rs.rng
    x ^= x << 13
    x ^= x >> 17
    x ^= x << 5
    rs.rng = x
    return x


cdef void treap_split(ReadySet *rs, int32_t node, int64_t prio, int32_t *low, int32_t *high) noexcept:
    """Split a treap into (< prio, > prio); ``prio`` is absent."""
    cdef int32_t a, b
    if node < 0:
        low[0] = -1
        high[0] = -1
        return
    if rs.levels[node].priority < prio:
        treap_split(rs, rs.levels[node].right, prio, &a, &b)
        rs.levels[node].right = a
        treap_pull(rs, node)
        low[0] = node
        high[0] = b
    else:
        treap_split(rs, rs.levels[node].left, prio, &a, &b)
        rs.levels[node].left = b
        treap_pull(rs, node)
        low[0] = a
        high[0] = node


cdef int32_t treap_merge(ReadySet *rs, int32_t low, int32_t high) noexcept:
    """Merge two treaps where every priority of ``low`` < every one of ``high``."""
    if low < 0:
        return high
    if high < 0:
        return low
    if rs.levels[low].weight > rs.levels[high].weight:
        rs.levels[low].right = treap_merge(rs, rs.levels[low].right, high)
        treap_pull(rs, low)
        return low
    rs.levels[high].left = treap_merge(rs, low, rs.levels[high].left)
    treap_pull(rs, high)
    return high


cdef int32_t treap_insert(ReadySet *rs, int32_t node, int32_t new) noexcept:
    cdef int32_t a, b
    if node < 0:
        treap_pull(rs, new)
        return new
    if rs.levels[new].weight > rs.levels[node].weight:
        treap_split(rs, node, rs.levels[new].priority, &a, &b)
        rs.levels[new].left = a
        rs.levels[new].right = b
        treap_pull(rs, new)
        return new
    if rs.levels[new].priority < rs.levels[node].priority:
        rs.levels[node].left = treap_insert(rs, rs.levels[node].left, new)
    else:
        rs.levels[node].right = treap_insert(rs, rs.levels[node].right, new)
    treap_pull(rs, node)
    return node


cdef int32_t treap_delete(ReadySet *rs, int32_t node, int64_t prio) noexcept:
    if rs.levels[node].priority == prio:
        return treap_merge(rs, rs.levels[node].left, rs.levels[node].right)
    if prio < rs.levels[node].priority:
        rs.levels[node].left = treap_delete(rs, rs.levels[node].left, prio)
    else:
        rs.levels[node].right = treap_delete(rs, rs.levels[node].right, prio)
    treap_pull(rs, node)
    return node


# -- levels: created with their first group, dropped with their last


cdef int levels_grow(ReadySet *rs) noexcept:
    """More unused levels; a result code."""
    cdef int64_t new_cap = <int64_t>rs.cap * 2 + 4
    cdef int32_t i
    cdef void *p
    if new_cap > INT32_MAX - 1:
        if rs.cap >= INT32_MAX - 1:
            return _FULL
        new_cap = INT32_MAX - 1
    p = PyMem_Realloc(rs.levels, <size_t>new_cap * sizeof(Level))
    if p == NULL:
        return _NOMEM
    rs.levels = <Level *>p
    for i in range(<int32_t>new_cap - 1, rs.cap - 1, -1):
        rs.levels[i].heap = NULL
        rs.levels[i].size = 0
        rs.levels[i].cap = 0
        rs.levels[i].groups = 0
        rs.levels[i].left = rs.free
        rs.free = i
    rs.cap = <int32_t>new_cap
    return _OK


cdef int level_reserve(ReadySet *rs, int32_t lv, int64_t need) noexcept:
    """Room for ``need`` entries in level ``lv``'s heap; a result code."""
    cdef Level *level = &rs.levels[lv]
    cdef int64_t new_cap
    cdef void *p
    if need <= level.cap:
        return _OK
    new_cap = need + need // 4 + 4
    if new_cap > INT32_MAX - 1:
        new_cap = INT32_MAX - 1
    p = PyMem_Realloc(level.heap, <size_t>new_cap * sizeof(ReadyEntry))
    if p == NULL:
        return _NOMEM
    level.heap = <ReadyEntry *>p
    level.cap = <int32_t>new_cap
    return _OK


cdef void level_shrink(ReadySet *rs, int32_t lv) noexcept:
    """Give heap memory back (best effort: a failed allocation skips it)."""
    cdef Level *level = &rs.levels[lv]
    cdef int64_t new_cap = level.groups * 2
    cdef void *p
    if new_cap < _MIN_HEAP_CAP:
        new_cap = _MIN_HEAP_CAP
    p = PyMem_Realloc(level.heap, <size_t>new_cap * sizeof(ReadyEntry))
    if p != NULL:
        level.heap = <ReadyEntry *>p
        level.cap = <int32_t>new_cap


cdef int ready_reserve_group(ReadySet *rs, int64_t prio, int32_t *lv) noexcept:
    """Allocate what one more group of priority ``prio`` needs: its level (an
    unused one if the priority has none yet) and room in the level's heap.
    ``lv[0]`` is set to the priority's level, or -1 if it has none yet.
    Nothing visible changes; a result code."""
    cdef int32_t node
    cdef int rc
    lv[0] = ready_find_level(rs, prio)
    if lv[0] < 0:
        if rs.free < 0:
            rc = levels_grow(rs)
            if rc != _OK:
                return rc
        node = rs.free
    else:
        node = lv[0]
    return level_reserve(rs, node, rs.levels[node].groups + 1 if lv[0] >= 0 else 1)


cdef int ready_reserve_levels(ReadySet *rs, const int64_t *prios, const int64_t *counts, int32_t n) noexcept:
    """``ready_reserve_group`` for a batch: room for ``counts[i]`` more groups
    of priority ``prios[i]`` (distinct priorities), listed in the order in
    which their first groups will be added.  A priority without a level
    gets the next unused level in the order ``ready_add_group`` takes them.
    Nothing visible changes; a result code."""
    cdef int32_t i, lv, node, have, absent = 0
    cdef int rc
    for i in range(n):
        if ready_find_level(rs, prios[i]) < 0:
            absent += 1
    while True:  # enough unused levels for the new priorities
        have = 0
        node = rs.free
        while node >= 0 and have < absent:
            have += 1
            node = rs.levels[node].left
        if have >= absent:
            break
        rc = levels_grow(rs)
        if rc != _OK:
            return rc
    node = rs.free
    for i in range(n):
        lv = ready_find_level(rs, prios[i])
        if lv >= 0:
            rc = level_reserve(rs, lv, rs.levels[lv].groups + counts[i])
        else:
            rc = level_reserve(rs, node, counts[i])
            node = rs.levels[node].left
        if rc != _OK:
            return rc
    return _OK


cdef int32_t ready_add_group(ReadySet *rs, int64_t prio, int32_t lv) noexcept:
    """Count one more group of priority ``prio`` (after ``ready_reserve_group``
    set ``lv``): a new level enters the treap if ``lv < 0``.  The group's
    level."""
    cdef Level *level
    if lv < 0:
        lv = rs.free
        rs.free = rs.levels[lv].left
        level = &rs.levels[lv]
        level.priority = prio
        level.groups = 0
        level.size = 0
        level.best = -1
        level.best_key = INT64_MAX
        level.left = -1
        level.right = -1
        level.weight = treap_next_weight(rs)
        rs.root = treap_insert(rs, rs.root, lv)
    rs.levels[lv].groups += 1
    return lv


cdef void ready_drop_group(ReadySet *rs, int32_t lv) noexcept:
    """Count one group (not ready) fewer in level ``lv``; the last one takes
    the level out of the treap."""
    cdef Level *level = &rs.levels[lv]
    level.groups -= 1
    if level.groups == 0:
        rs.root = treap_delete(rs, rs.root, level.priority)
        level = &rs.levels[lv]
        PyMem_Free(level.heap)
        level.heap = NULL
        level.cap = 0
        level.size = 0
        level.left = rs.free
        rs.free = lv
    elif level.cap > _MIN_HEAP_CAP and level.groups * 4 < level.cap:
        level_shrink(rs, lv)


# -- for the group storage: the index follows the group array


cdef int ready_resize_index(ReadySet *rs, int32_t old_cap, int64_t new_cap) noexcept:
    """Resize ``pos`` for ``new_cap`` (> old_cap) group slots, the new ones not ready."""
    cdef void *p = PyMem_Realloc(rs.pos, <size_t>new_cap * sizeof(int32_t))
    cdef int64_t i
    if p == NULL:
        return _NOMEM
    rs.pos = <int32_t *>p
    for i in range(old_cap, new_cap):
        rs.pos[i] = -1
    return _OK


cdef void ready_renumber(
    ReadySet *rs, int32_t *new_pos, int32_t new_cap, const int32_t *remap, int32_t old_cap,
) noexcept:
    """Group slot s became ``remap[s]`` (-1: gone): renumber the heap entries
    and move the index into ``new_pos`` (``new_cap`` slots, allocated by the
    caller before anything changed); the old index is freed."""
    cdef int32_t s, lv, j
    cdef Level *level
    for s in range(new_cap):
        new_pos[s] = -1
    for s in range(old_cap):
        if remap[s] >= 0:
            new_pos[remap[s]] = rs.pos[s]
    for lv in range(rs.cap):
        level = &rs.levels[lv]
        for j in range(level.size):
            level.heap[j].group = remap[level.heap[j].group]
    PyMem_Free(rs.pos)
    rs.pos = new_pos
