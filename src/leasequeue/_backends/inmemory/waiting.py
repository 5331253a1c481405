"""Waiting for work: the blocking and the asyncio side of a waiting claim,
and the expiry timer.

Shared by both in-memory transports (``transport_py`` and ``transport_c``).
The transport's core keeps the waiting claims in a queue under its own lock
and *hands messages off* to them there: an operation that makes a message
claimable claims it on behalf of the longest waiting claim whose priority
floor admits it, records the lease in that claim's *waiter record*, and
after releasing its lock wakes exactly the waiters it served.  A waiting
claim is woken only then: when it was served, when the transport is closed,
or by its own deadline; it never looks at the clock again while it waits.
This module is the other half: it puts a caller to sleep until then, with no
lock held and no CPU used, and turns an exception in the waiting caller into
an exact undo of a hand-off.

The core's side (both twins, same names; see their "waiters" section):

``t._waiter(worker_id, visibility, min_priority, wake)``
    a new waiter record.  ``wake()`` is this module's wake-up primitive; the
    core calls it after releasing its lock, at most once per record (a
    record is promised one wake: when it is served or closed).
``t._wait_start(rec)``
    reads the clock, then under the lock: returns ``None`` with
    ``rec.state == CLOSED`` on a closed transport; else applies expiry,
    queues the record and serves the queue (the caller first if it is the
    longest waiter its floor admits).  Returns the lease if the caller got
    one at once, else ``None``: the record is queued, and from the moment the
    lock is released another thread may hand it a lease (or close it), so
    the caller must end with ``_wait_end`` whatever it reads.
``t._wait_end(rec, keep)``
    ends the wait: a record still queued is taken out; a record that was
    handed a lease returns it when ``keep`` (a deadline racing a hand-off:
    the lease was granted) or, when not (the caller was interrupted or
    cancelled), the hand-off is undone exactly and the message goes to the
    next waiter.  Never raises; idempotent.
``t._timer_fire()``
    for the expiry timer, when the time it is armed for is due: reads the
    clock and, if claims wait, applies expiry and serves the queue (nothing
    changes when none waits); returns the clock time used.
``t._timer_due()``
    ``(timer_at, time)``: the clock time the timer is armed for (``+inf``:
    nothing to watch) and the transport's latest time.

Expiry: a waiting claim must get a message whose lease or park expired,
without any other operation happening.  Each transport that ever had a
waiting claim and a lock to watch has one *expiry timer*: a daemon thread,
started on first use, holding only a weak reference to the transport.  The
core arms it (``timer_at``) whenever claims wait and the earliest expiry is
earlier than the time it is armed for, and pokes it after releasing its
lock; the timer sleeps until ``timer_at`` is due by the clock (which is
assumed to count seconds), measured from the transport's latest time, then
calls ``t._timer_fire()``: it reads the clock only then, never when poked.  When the clock
stands still between two firings (a manual clock in a test) the timer backs
off, doubling its sleep up to ``_MAX_TIMER_SLEEP``: it never spins.  It is
not a waiter, so poking it wakes no claim; it exits when the transport is
closed or garbage-collected, and uses no CPU while nothing is armed.

Threads: one ``_thread`` lock per waiting claim, acquired by its owner;
``wake`` releases it.  On the main thread the wait is cut into slices of
``_MAIN_SLICE`` seconds, because ``_thread.interrupt_main()`` only sets
the signal flag (a real SIGINT interrupts the wait itself): the handler then
runs between two slices and its ``KeyboardInterrupt`` ends the claim.

asyncio: the waiting coroutine awaits one future of its running loop;
``wake`` resolves it with ``call_soon_threadsafe`` (directly on the loop's
own thread).  If the loop is closed, the waiter is abandoned like a
cancelled one: its hand-off is undone and the message goes to the next
waiter.

Any exception in the waiting caller (``KeyboardInterrupt``, task
cancellation, ``asyncio.timeout``, ``GeneratorExit``) ends in
``_wait_end(rec, keep=False)`` before it propagates: nothing stays leased on
the caller's behalf.
"""

from __future__ import annotations

import math
import threading
import weakref
from _thread import allocate_lock, get_ident
from time import monotonic
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import asyncio

__all__ = ["CLOSED", "HANDED", "IDLE", "WAITING", "aclaim_wait", "claim_wait", "poke_timer"]

#: Waiter record states (the Cython core has the same numbers in a C enum).
IDLE = 0  #: not queued: new, or its wait is over
WAITING = 1  #: queued
HANDED = 2  #: served: the record holds its lease (not queued)
CLOSED = 3  #: woken by ``close()`` (not queued)

_INF = math.inf
#: Longest single blocking wait accepted by ``lock.acquire`` (longer: no timeout).
_TIMEOUT_MAX = threading.TIMEOUT_MAX
#: Slice of a blocking wait on the main thread, so that a signal handler
#: tripped by ``_thread.interrupt_main()`` runs promptly.
_MAIN_SLICE = 0.05
#: The expiry timer's shortest sleep, and its longest while the clock stands still.
_MIN_TIMER_SLEEP = 0.001
_MAX_TIMER_SLEEP = 0.5

_MAIN_IDENT = threading.main_thread().ident


def claim_wait(t: Any, worker_id: str, visibility: float, min_priority: int, timeout: float) -> Any:
    """``t.claim(..., timeout=timeout)`` for ``timeout > 0`` (``+inf``: no
    deadline), arguments already checked: block this thread until a lease is
    handed over, the deadline passes (``None``) or ``t`` is closed (``None``)."""
    if t._closed:
        return None  # at once, without reading the clock
    deadline = monotonic() + timeout
    lock = allocate_lock()
    lock.acquire()
    rec = t._waiter(worker_id, visibility, min_priority, lock.release)
    try:
        lease = t._wait_start(rec)
        if lease is not None:
            return lease  # claimed at once
        # From here on every way out goes through _wait_end: the record may be
        # handed a lease by another thread at any moment, even before the loop.
        acquire = lock.acquire
        main = get_ident() == _MAIN_IDENT
        while rec.state == WAITING:
            wait = deadline - monotonic()
            if wait <= 0.0:
                break
            if main and wait > _MAIN_SLICE:
                wait = _MAIN_SLICE
            acquire(True, wait if wait <= _TIMEOUT_MAX else -1)
        return t._wait_end(rec, True)  # its lease (also one handed over at the deadline), or None
    except BaseException:
        t._wait_end(rec, False)
        raise


class _AsyncWaker:
    """Wakes one waiting ``aclaim`` from any thread (``wake``, called by the core
    after it released its lock)."""

    __slots__ = ("loop", "thread", "fut", "transport", "rec", "threadsafe")

    def __init__(self, loop: asyncio.AbstractEventLoop, fut: "asyncio.Future[bool]", transport: Any) -> None:
        self.loop = loop
        self.thread = get_ident()
        self.fut = fut
        self.transport = transport
        self.rec: Any = None
        self.threadsafe = loop.call_soon_threadsafe

    def wake(self) -> None:
        if get_ident() != self.thread:
            try:
                self.threadsafe(_resolve, self.fut, True)
            except RuntimeError:  # the loop is closed: nobody will ever take the lease
                self.transport._wait_end(self.rec, False)
        elif self.loop.is_closed():
            self.transport._wait_end(self.rec, False)
        else:
            _resolve(self.fut, True)  # on the loop's own thread: no need to go through it


def _resolve(fut: "asyncio.Future[bool]", woken: bool) -> None:
    if not fut.done():
        fut.set_result(woken)


async def aclaim_wait(t: Any, worker_id: str, visibility: float, min_priority: int, timeout: float) -> Any:
    """``await t.aclaim(..., timeout=timeout)`` for ``timeout > 0`` (``+inf``:
    no deadline), arguments already checked: suspend the calling task (no
    thread) until a lease is handed over, the deadline passes or ``t`` is
    closed."""
    if t._closed:
        return None
    import asyncio  # here, so that importing leasequeue does not import asyncio

    loop = asyncio.get_running_loop()
    fut: "asyncio.Future[bool]" = loop.create_future()
    waker = _AsyncWaker(loop, fut, t)
    rec = waker.rec = t._waiter(worker_id, visibility, min_priority, waker.wake)
    try:
        lease = t._wait_start(rec)
        if lease is not None:
            return lease
        if rec.state == WAITING:  # else already handed a lease (by another thread) or closed
            timer = loop.call_later(timeout, _resolve, fut, False) if timeout != _INF else None
            try:
                await fut
            finally:
                if timer is not None:
                    timer.cancel()
        return t._wait_end(rec, True)
    except BaseException:
        t._wait_end(rec, False)
        raise


# ------------------------------------------------------------- expiry timer

_timers_lock = threading.Lock()


def poke_timer(t: Any) -> None:
    """Tell ``t``'s expiry timer that ``t._timer_at`` moved earlier (start the
    timer on first use).  Called by the core after releasing its lock."""
    timer = t._timer
    if timer is None:
        with _timers_lock:
            timer = t._timer
            if timer is None:
                if t._closed:
                    return
                timer = t._timer = _ExpiryTimer(t)
                timer.start()
    timer.poke()


class _ExpiryTimer:
    """One transport's expiry timer: a daemon thread (see the module docstring)."""

    def __init__(self, t: Any) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._poked = False
        self._ref = weakref.ref(t, self._gone)
        self._thread = threading.Thread(target=self._run, name="leasequeue-expiry-timer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        with self._cond:
            self._poked = True
            self._cond.notify()

    def _gone(self, _ref: Any) -> None:  # the transport was collected
        self.poke()

    def _run(self) -> None:
        backoff = _MIN_TIMER_SLEEP
        last_now = -_INF
        fire = False
        cond = self._cond
        while True:
            t = self._ref()
            if t is None or t._closed:
                return
            if fire:
                try:
                    now = t._timer_fire()
                except Exception:  # noqa: BLE001 - a failing clock: try again later
                    now = last_now
                if now == last_now:  # the clock stood still since the last firing: back off
                    backoff = min(backoff * 2.0, _MAX_TIMER_SLEEP)
                else:
                    backoff = _MIN_TIMER_SLEEP
                    last_now = now
            # Poked or fired: sleep until the time armed, measured from the
            # transport's time (fresh: whoever armed the timer just used it).
            at, base = t._timer_due()
            del t  # sleep without keeping the transport alive
            sleep: Optional[float] = None
            if at != _INF:
                gap = at - base
                sleep = gap if gap > backoff else backoff
                if sleep > _TIMEOUT_MAX:
                    sleep = None
            with cond:
                fire = not self._poked and not cond.wait(sleep)
                self._poked = False
