# cython: language_level=3, embedsignature=False, annotation_typing=False
# cython: freethreading_compatible=True
"""The benchmarks' *floor*: what a compiled transport call costs at the least.

``FloorTransport`` has the transport's method signatures (``publish``,
``claim``, ``ack``, ``nack``) and does only what every correct transport call
has to do anyway: take the transport's lock (the same primitive as
``_backends/inmemory/transport_c.pyx``: ``PyMutex`` on 3.13+, the GIL before), read the clock in ``claim``
(exactly as the real transport does: ``time.time`` -- the default -- is read
in C with ``clock_gettime`` on Linux, any other clock or platform calls it), and allocate one
small lease object.  The module directives are the real transport's.  It keeps no messages.  The
benchmark reports the real transport's time as a multiple of this one, so
the report says how much of the cost is the queue itself and how much is
the unavoidable price of a Python-level call.

Not part of the public API; used only by ``python -m leasequeue bench``.
"""

cimport cython

import time

cdef object _time_time = time.time


cdef extern from "lq_build.h":
    object lq_cython_version()

#: The Cython version that compiled this module (recorded at build time).
CYTHON_VERSION = lq_cython_version()


cdef extern from "lq_platform.h":
    # Exactly the transport's C read of time.time and its lock primitive.
    double lq_wall_time() noexcept nogil
    bint LQ_HAVE_WALL_TIME
    ctypedef struct lq_mutex:
        pass
    void lq_lock(lq_mutex *m) noexcept
    void lq_unlock(lq_mutex *m) noexcept


@cython.final
cdef class FloorLease:
    """A lease-shaped value with the transport lease's six fields."""

    cdef readonly long long seq
    cdef readonly object group_id
    cdef readonly object event
    cdef readonly object worker_id
    cdef readonly double expires_at
    cdef readonly long long attempt


@cython.final
cdef class FloorTransport:
    """Same call shape as ``InMemoryTransport``; does no queueing at all."""

    cdef lq_mutex _lock
    cdef object _clock
    cdef bint _wall_clock
    cdef long long _seq

    def __init__(self, clock=time.time):
        if not callable(clock):
            raise TypeError("clock must be callable")
        self._clock = clock
        self._wall_clock = LQ_HAVE_WALL_TIME and clock is _time_time
        self._seq = 0

    cdef double _now(self) except? -1.0:
        if self._wall_clock:
            return lq_wall_time()
        return self._clock()

    def publish(self, group_id, event, priority=0):
        """Take the lock, bump the sequence number, return it."""
        cdef long long seq
        lq_lock(&self._lock)
        self._seq += 1
        seq = self._seq
        lq_unlock(&self._lock)
        return seq

    def claim(self, worker_id, visibility, min_priority=0):
        """Read the clock, take the lock, return a freshly allocated lease."""
        cdef double now = self._now()
        cdef double vis = visibility
        cdef long long seq
        lq_lock(&self._lock)
        seq = self._seq
        lq_unlock(&self._lock)
        cdef FloorLease lease = FloorLease.__new__(FloorLease)
        lease.seq = seq
        lease.group_id = "g"
        lease.event = None
        lease.worker_id = worker_id
        lease.expires_at = now + vis
        lease.attempt = 1
        return lease

    def ack(self, lease):
        """Check the lease type, take the lock, return None."""
        if not isinstance(lease, FloorLease):
            raise TypeError("not a FloorLease")
        lq_lock(&self._lock)
        lq_unlock(&self._lock)

    def nack(self, lease, delay=0.0):
        """Check the lease type, take the lock, return None."""
        if not isinstance(lease, FloorLease):
            raise TypeError("not a FloorLease")
        lq_lock(&self._lock)
        lq_unlock(&self._lock)

    def __len__(self):
        return 0

    def close(self):
        """No-op, as on the real transport."""


@cython.final
cdef class FloorPymutexTransport:
    """``FloorTransport`` with a ``cython.pymutex`` instead of the transport's
    lock primitive.  Identical to it on 3.13+; before 3.13 Cython implements
    ``pymutex`` with a ``PyThread`` lock, which the transport does not use,
    so this variant shows what that lock alone costs (``--impls
    floor_pymutex``)."""

    cdef cython.pymutex _lock
    cdef object _clock
    cdef bint _wall_clock
    cdef long long _seq

    def __init__(self, clock=time.time):
        if not callable(clock):
            raise TypeError("clock must be callable")
        self._clock = clock
        self._wall_clock = LQ_HAVE_WALL_TIME and clock is _time_time
        self._seq = 0

    cdef double _now(self) except? -1.0:
        if self._wall_clock:
            return lq_wall_time()
        return self._clock()

    def publish(self, group_id, event, priority=0):
        """Take the lock, bump the sequence number, return it."""
        cdef long long seq
        with self._lock:
            self._seq += 1
            seq = self._seq
        return seq

    def claim(self, worker_id, visibility, min_priority=0):
        """Read the clock, take the lock, return a freshly allocated lease."""
        cdef double now = self._now()
        cdef double vis = visibility
        cdef long long seq
        with self._lock:
            seq = self._seq
        cdef FloorLease lease = FloorLease.__new__(FloorLease)
        lease.seq = seq
        lease.group_id = "g"
        lease.event = None
        lease.worker_id = worker_id
        lease.expires_at = now + vis
        lease.attempt = 1
        return lease

    def ack(self, lease):
        """Check the lease type, take the lock, return None."""
        if not isinstance(lease, FloorLease):
            raise TypeError("not a FloorLease")
        with self._lock:
            pass

    def nack(self, lease, delay=0.0):
        """Check the lease type, take the lock, return None."""
        if not isinstance(lease, FloorLease):
            raise TypeError("not a FloorLease")
        with self._lock:
            pass

    def __len__(self):
        return 0

    def close(self):
        """No-op, as on the real transport."""
