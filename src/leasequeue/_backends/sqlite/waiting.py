"""Waiting claims of one ``SQLiteTransport``: who waits, who is woken, and the
watcher that notices other processes' commits and lock expiries.

The rules (SPEC Part 2, "Waiting for work"), and how they are kept here:

* **One wake per claimable message (no herd), fairest first.**  An operation
  of this transport that makes a group claimable (publish into an idle group,
  ack exposing the next message, nack(0), expiry, resume, set_priority) hands
  one *token* per such group, tagged with the group's priority, to the
  longest-waiting claim whose floor admits it and that holds no token yet.
  Tokens are handed out while the transport's lock is held, so they are
  ordered with the claims; the wake-up calls (``Event.set``,
  ``loop.call_soon_threadsafe``) are made after it is released.
* **No lost wake-up.**  A waiting claim registers in the same critical
  section in which its claim attempt found nothing, so an operation that
  commits after that attempt sees it.  After every attempt of a woken claim,
  if no other claim holds a token, the transport checks whether a group is
  still claimable for the longest waiter that could take it and, if so, hands
  it a token (a *top-up*): a message that a woken claim left behind (its
  claim took another group, or its floor did not admit it) is not stranded.
* **Cancellation.**  A claim that ends (timeout, close, an exception, a
  cancelled task) while it holds a token passes the token on.  A claim whose
  caller was cancelled while its attempt ran is undone exactly (``unclaim``:
  the attempt count, round-robin key and previous delivery restored), so
  nothing stays leased on behalf of a caller who is gone.
* **Other processes.**  Their commits do not call into this process.  One
  watcher thread per transport (running only while claims wait) polls
  ``PRAGMA data_version`` -- which changes only when *another* connection
  commits -- with a backoff from 0.2 ms to ``POLL_CAP`` seconds (3 ms), and tops
  up on a change; it also applies expiry when the earliest lock end is due by
  the transport's clock, which wakes claims for the freed groups.

Everything here that holds ``WaitQueue._lock`` runs no user code and no I/O.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Iterable, List, Optional

__all__ = ["POLL_CAP", "POLL_START", "WaitQueue", "Waiter"]

#: Backoff of the watcher's ``PRAGMA data_version`` poll: first interval after
#: a change, and the cap (the bound of a cross-process wake-up's latency).
POLL_START = 0.0002
POLL_CAP = 0.003
#: A watcher with no claim waiting exits after this many seconds.
WATCHER_IDLE = 1.0

Wake = Callable[[], None]


class Waiter:
    """One waiting claim: its floor, its token, and how to wake it."""

    __slots__ = ("floor", "token", "wake", "cancelled", "result", "registered", "event")

    def __init__(self, floor: int, wake: Optional[Wake] = None) -> None:
        self.floor = floor
        self.token: Optional[int] = None  # priority of the group it was woken for
        self.cancelled = False  # the caller is gone: a claim made for it is undone
        self.result: Any = None  # a claim's raw row, until the caller takes it
        self.registered = False
        if wake is None:
            self.event: Optional[threading.Event] = threading.Event()
            self.wake: Wake = self.event.set
        else:
            self.event = None
            self.wake = wake


class WaitQueue:
    """The waiting claims of one transport, in arrival order (thread-safe).

    ``waiters`` is read without the lock on the hot path (a dict's truth
    value): an operation that sees no waiter skips all of this.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waiters: Dict[int, Waiter] = {}  # id -> waiter, oldest first
        self.tokens = 0  # waiters holding a token
        self.wakeups = 0  # wake-up calls made (tests count herds with it)

    # All methods return the wake-up calls to make after every lock is released.

    def signal(self, priorities: Iterable[int]) -> List[Wake]:
        """One token per priority, to the oldest token-less waiter it admits."""
        wakes: List[Wake] = []
        with self._lock:
            for priority in priorities:
                if self.tokens >= len(self.waiters):
                    break
                for waiter in self.waiters.values():
                    if waiter.token is None and waiter.floor <= priority:
                        waiter.token = priority
                        self.tokens += 1
                        wakes.append(waiter.wake)
                        break
            self.wakeups += len(wakes)
        return wakes

    def needs_topup(self) -> bool:
        """Nobody holds a token, yet somebody waits: the caller checks for work."""
        return self.tokens == 0 and bool(self.waiters)

    def lowest_floor(self) -> Optional[int]:
        with self._lock:
            floors = [w.floor for w in self.waiters.values() if w.token is None]
        return min(floors) if floors else None

    def attempted(self, waiter: Waiter, raw: Any) -> bool:
        """A claim attempt for ``waiter`` ended with ``raw`` (a row or None).

        Returns False when the caller was cancelled meanwhile and the attempt
        claimed something: the caller undoes that claim at once (still under
        the transport's lock).
        """
        with self._lock:
            if waiter.token is not None:
                waiter.token = None  # the attempt used it
                self.tokens -= 1
            if waiter.cancelled:
                self._remove(waiter)
                return raw is None
            if raw is not None:
                self._remove(waiter)
                waiter.result = raw
            elif not waiter.registered:
                waiter.registered = True
                self.waiters[id(waiter)] = waiter
            if waiter.event is not None:
                waiter.event.clear()
        return True

    def leave(self, waiter: Waiter) -> List[Wake]:
        """The claim ends (timeout, close, error, cancel): pass its token on."""
        with self._lock:
            waiter.cancelled = True
            self._remove(waiter)
            token = waiter.token
            if token is None:
                return []
            waiter.token = None
            self.tokens -= 1
        return self.signal([token])

    def take_result(self, waiter: Waiter) -> Any:
        """The row a finished attempt left for a caller that has gone (or None)."""
        with self._lock:
            waiter.cancelled = True
            raw, waiter.result = waiter.result, None
            return raw

    def close(self) -> List[Wake]:
        """Wake everyone (the transport is closing)."""
        with self._lock:
            wakes = [w.wake for w in self.waiters.values()]
            self.waiters.clear()
            self.tokens = 0
        return wakes

    def _remove(self, waiter: Waiter) -> None:
        if waiter.registered:
            waiter.registered = False
            self.waiters.pop(id(waiter), None)


def call_all(wakes: List[Wake]) -> None:
    """Make the wake-up calls (after every lock is released)."""
    for wake in wakes:
        try:
            wake()
        except RuntimeError:  # an event loop that was closed meanwhile
            pass


class Watcher:
    """The thread that watches for other processes' commits and for expiry.

    ``poll()`` (the transport's) returns ``(changed, next_expiry)``;
    ``topup()`` hands out a token if work is claimable and nobody holds one;
    ``expire_due(next_expiry)`` applies expiry if it is due by the clock.
    The thread runs while claims wait and exits after ``WATCHER_IDLE``
    seconds without any.
    """

    def __init__(self, transport: Any, queue: WaitQueue) -> None:
        self._transport = transport
        self._queue = queue
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()

    def ensure(self) -> None:
        """Start the thread if it is not running."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="leasequeue-sqlite-watcher", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _run(self) -> None:
        transport = self._transport
        queue = self._queue
        stop = self._stop
        delay = POLL_START
        idle_since: Optional[float] = None
        import time

        monotonic = time.monotonic
        sleep = time.sleep
        while not stop.is_set():
            if not queue.waiters:
                now = monotonic()
                if idle_since is None:
                    idle_since = now
                elif now - idle_since > WATCHER_IDLE:
                    with self._lock:
                        # Exit unless a claim registered meanwhile (ensure()
                        # holds this lock while it checks is_alive()).
                        if not queue.waiters:
                            self._thread = None
                            return
                stop.wait(POLL_CAP)
                continue
            idle_since = None
            try:
                changed, next_expiry = transport._poll()
                if next_expiry is not None:
                    transport._expire_due(next_expiry)
                if changed:
                    transport._topup()
                    delay = POLL_START
                else:
                    delay = min(delay * 2, POLL_CAP)
            except Exception:  # a closed transport, a clock that raised: try again later
                if transport.closed:
                    return
                delay = POLL_CAP
            sleep(delay)  # cheaper than Event.wait(timeout); stop is checked each tick
