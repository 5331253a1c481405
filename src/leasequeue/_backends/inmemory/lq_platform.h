/* Platform pieces shared by the transport (transport_c.pyx) and the
   benchmark's floor stub (_floor.pyx): one definition, so the floor pays
   exactly the transport's clock read and lock, never a drifted copy. */
#ifndef LEASEQUEUE_LQ_PLATFORM_H
#define LEASEQUEUE_LQ_PLATFORM_H

/* time.time() read in C, the same way CPython reads it on Linux
   (clock_gettime(CLOCK_REALTIME)).  Elsewhere (Windows, or macOS wheels
   built for releases older than clock_gettime) the default clock is
   called like any other, so leases agree with time.time() exactly. */
#if defined(__linux__)
#include <time.h>
#define LQ_HAVE_WALL_TIME 1
static double lq_wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)((long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec) / 1e9;
}
#else
#define LQ_HAVE_WALL_TIME 0
static double lq_wall_time(void) { return 0.0; }
#endif

/* The transport's lock.  On 3.13+ (where free-threaded builds exist) it
   is a PyMutex, exactly what ``cython.pymutex`` compiles to there: one
   atomic compare-and-swap, and a blocked thread parks without holding
   the GIL or its thread state.  Before 3.13 every build has a GIL, and
   ``cython.pymutex`` falls back to a PyThread lock costing ~30 ns per
   acquire/release pair (a semaphore plus a monotonic clock read in
   PyThread_acquire_lock_timed): ~90 ns of a ~150 ns publish+claim+ack
   cycle.  There the GIL serialises the critical sections by itself,
   because nothing in them can release the GIL: they run no Python code
   (no user __hash__/__eq__, no finaliser, no clock), allocate no object
   the garbage collector tracks (so no collection starts), and only call
   list/memory C-API functions that never release it.  ``held`` checks
   that: re-entry (which a real lock would turn into a deadlock) stops
   the process instead of corrupting the structures. */
#if PY_VERSION_HEX >= 0x030d0000
typedef PyMutex lq_mutex;
#define lq_lock(m) PyMutex_Lock(m)
#define lq_unlock(m) PyMutex_Unlock(m)
#else
typedef struct { char held; } lq_mutex;
static CYTHON_INLINE void lq_lock(lq_mutex *m) {
    if (m->held)
        Py_FatalError("leasequeue: transport lock re-entered");
    m->held = 1;
}
#define lq_unlock(m) ((m)->held = 0)
#endif

#endif /* LEASEQUEUE_LQ_PLATFORM_H */
