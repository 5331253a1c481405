# The group-id table of the Cython transport (included by transport_c.pyx).
#
# Group id -> group slot: open addressing with linear probing, kept at most
# half full.  An entry is 8 bytes, (slot, low 32 bits of the id's hash),
# where a dict would spend ~50 bytes plus a 32-byte int per group.  The ids
# themselves live on the groups (``Group.gid``, borrowed from the list by
# slot that owns them), so a lookup compares a candidate's id only when its
# cached hash bits match.
#
# The pure twin uses a dict (``InMemoryTransport._groups``) instead.
#
# Functions: ids_init / ids_free, ids_lookup, ids_insert, ids_delete,
# ids_reserve (grow before a new group is entered), and ids_new_table /
# ids_renumber (the group array was compacted: rehash every entry).


cdef struct Group        # a group's record (storage.pxi): ``gid`` is its id


ctypedef struct IdEntry:
    int32_t group        # group slot, -1 for an empty entry
    uint32_t hash        # low 32 bits of the id's hash: probes skip most misses


ctypedef struct IdTable:
    IdEntry *entries     # NULL until the first group is entered
    size_t mask          # table size - 1 (a power of two); 0 while entries is NULL


cdef inline void ids_init(IdTable *ids) noexcept:
    ids.entries = NULL
    ids.mask = 0


cdef inline void ids_free(IdTable *ids) noexcept:
    PyMem_Free(ids.entries)
    ids.entries = NULL
    ids.mask = 0


cdef inline int32_t ids_lookup(const IdTable *ids, const Group *groups, PyObject *gid, uint32_t h32) noexcept:
    """The slot of group ``gid`` (an exact str, low hash bits ``h32``), or -1."""
    cdef size_t mask = ids.mask, i
    cdef IdEntry *entries = ids.entries
    cdef int32_t s
    if entries == NULL:
        return -1
    i = h32 & mask
    while True:
        s = entries[i].group
        if s < 0:
            return -1
        if entries[i].hash == h32 and lq_str_eq(gid, groups[s].gid):
            return s
        i = (i + 1) & mask


cdef inline void ids_insert(IdTable *ids, int32_t slot, uint32_t h32) noexcept:
    """Enter a group known to be absent (the table has room)."""
    cdef size_t mask = ids.mask
    cdef size_t i = h32 & mask
    while ids.entries[i].group >= 0:
        i = (i + 1) & mask
    ids.entries[i].group = slot
    ids.entries[i].hash = h32


cdef void ids_delete(IdTable *ids, int32_t slot, PyObject *gid) noexcept:
    """Remove group ``slot`` (id ``gid``); later entries of its probe run shift back."""
    cdef size_t mask = ids.mask
    # The id's hash is cached on the str: no user code, cannot fail.
    cdef uint32_t h32 = <uint32_t>lq_str_hash(<object>gid)
    cdef size_t i = h32 & mask, j, home
    cdef IdEntry *entries = ids.entries
    while entries[i].group != slot:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        if entries[j].group < 0:
            break
        home = entries[j].hash & mask
        # Move entry j into the hole at i unless its home lies in (i, j].
        if ((j - home) & mask) >= ((j - i) & mask):
            entries[i] = entries[j]
            i = j
    entries[i].group = -1


cdef int ids_grow(IdTable *ids) noexcept:
    """Double the table (rehashing every group into it)."""
    cdef size_t old_size = ids.mask + 1 if ids.entries != NULL else 0
    cdef size_t size = old_size * 2 if old_size else 16
    cdef size_t i
    cdef IdEntry *old = ids.entries
    cdef IdEntry *table
    if size > (<size_t>1) << 32:
        return _FULL
    table = <IdEntry *>PyMem_Malloc(size * sizeof(IdEntry))
    if table == NULL:
        return _NOMEM
    for i in range(size):
        table[i].group = -1
    ids.entries = table
    ids.mask = size - 1
    for i in range(old_size):
        if old[i].group >= 0:
            ids_insert(ids, old[i].group, old[i].hash)
    PyMem_Free(old)
    return _OK


cdef inline int ids_reserve(IdTable *ids, int64_t groups) noexcept:
    """Make room for ``groups`` groups (at most half full); a result code."""
    cdef int rc
    while <size_t>groups * 2 > ids.mask:
        rc = ids_grow(ids)
        if rc != _OK:
            return rc
    return _OK


cdef IdEntry *ids_new_table(int64_t groups, size_t *size) noexcept:
    """An uninitialised table big enough for ``groups`` groups (NULL if out
    of memory), for ``ids_renumber``: allocated before anything changes."""
    cdef size_t n = 16
    while n < <size_t>(groups + 1) * 2 + 1:
        n *= 2
    size[0] = n
    return <IdEntry *>PyMem_Malloc(n * sizeof(IdEntry))


cdef void ids_renumber(IdTable *ids, IdEntry *table, size_t size, const int32_t *remap) noexcept:
    """Move every entry into ``table`` (from ``ids_new_table``) with its group
    slot s renumbered to ``remap[s]``; the old table is freed."""
    cdef IdEntry *old = ids.entries
    cdef size_t old_size = ids.mask + 1
    cdef size_t i
    for i in range(size):
        table[i].group = -1
    ids.entries = table
    ids.mask = size - 1
    for i in range(old_size):
        if old[i].group >= 0:
            ids_insert(ids, remap[old[i].group], old[i].hash)
    PyMem_Free(old)
