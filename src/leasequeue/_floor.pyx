# cython: language_level=3, embedsignature=True, freethreading_compatible=True
"""The benchmarks' *floor*: what a compiled transport call costs at the least.

``FloorTransport`` has the transport's method signatures (``publish``,
``claim``, ``ack``, ``nack``) and does only what every correct transport call
has to do anyway: take a ``cython.pymutex``, read the clock in ``claim`` (the
same user-supplied callable the real transport calls, ``time.time`` by
default), and allocate one small lease object.  It keeps no messages.  The
benchmark reports the real transport's time as a multiple of this one, so
the report says how much of the cost is the queue itself and how much is
the unavoidable price of a Python-level call.

Not part of the public API; used only by ``python -m leasequeue bench``.
"""

cimport cython

import time


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

    cdef cython.pymutex _lock
    cdef object _clock
    cdef long long _seq

    def __init__(self, clock=time.time):
        if not callable(clock):
            raise TypeError("clock must be callable")
        self._clock = clock
        self._seq = 0

    def publish(self, group_id, event, priority=0):
        """Take the lock, bump the sequence number, return it."""
        cdef long long seq
        with self._lock:
            self._seq += 1
            seq = self._seq
        return seq

    def claim(self, worker_id, visibility, min_priority=0):
        """Read the clock, take the lock, return a freshly allocated lease."""
        cdef double now = self._clock()
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
