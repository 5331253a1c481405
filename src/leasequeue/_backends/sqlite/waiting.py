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
  the transport's clock, which wakes claims for the freed groups.  A lock end
  is a lease's or a park's end, or the due time of a scheduled head (SPEC
  Part 5, "Later": lock 4 in ``lq_groups``, ``later.py``), so a head becoming
  due wakes waiting claims the same way, in this process and in others.

Everything here that holds ``WaitQueue._lock`` runs no user code and no I/O.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional

from .watch import ENV, FileWatch, choose_mechanism, open_watch

__all__ = ["POLL_CAP", "POLL_START", "SETTLE", "WaitQueue", "Waiter", "Watcher"]

#: The fallback poll of ``PRAGMA data_version`` (no kernel watch): first
#: interval after a change, and the cap it backs off to (the bound of a
#: cross-process wake-up's latency in the fallback; idle, about 10 polls/s).
POLL_START = 0.0002
POLL_CAP = 0.1
#: With a kernel watch: re-checks after the last write reported (seconds
#: after each other), in case the commit was not visible yet when the write
#: was reported (SQLite publishes it in the ``-shm`` index after writing the
#: WAL; a ``durable=True`` commit fsyncs in between).  Five looks per burst of
#: writes, none while nothing is written.
SETTLE = (0.001, 0.004, 0.02, 0.1, 0.5)
#: With a kernel watch, the shortest gap between two looks (a burst of
#: writes costs at most one look per gap).
MIN_LOOK_GAP = 0.0002
#: The sleep before looking again at an expiry that is due yet still the
#: earliest (a clock standing still): doubling from the first to the second.
EXPIRY_MIN_SLEEP = 0.001
EXPIRY_MAX_SLEEP = 0.5
#: With a kernel watch, the longest sleep between two looks when nothing is
#: written and no lock ends sooner: a safety net (against a wall clock that
#: jumps, or a write the kernel did not report) that costs one look a minute.
MAX_SLEEP = 60.0
#: A watcher with no claim waiting exits after this many seconds.
WATCHER_IDLE = 1.0

_INF = math.inf

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


_warned = False  # the fallback to the poll was reported (once per process)


def _warn_fallback(path: str, mechanism: str, why: BaseException) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"leasequeue: SQLiteTransport({path!r}) cannot watch its WAL file with {mechanism} ({why}); "
        f"its waiting claims poll PRAGMA data_version instead, backing off to one poll every "
        f"{POLL_CAP * 1000:.0f} ms (a wake-up from another process can take that long). "
        f"Set {ENV}=poll to choose the poll and silence this warning.",
        RuntimeWarning,
        stacklevel=2,
    )


def _note_no_watch(path: str) -> None:
    """This platform has no kernel watch (Windows, ...): say so once, in the log."""
    global _warned
    if _warned:
        return
    _warned = True
    logging.getLogger("leasequeue").warning(
        "leasequeue: no kernel file watch on this platform (%s): the waiting claims of SQLiteTransport(%r) "
        "poll PRAGMA data_version, backing off to one poll every %.0f ms (a wake-up from another process can "
        "take that long). Set %s=poll to choose the poll and silence this.",
        sys.platform, path, POLL_CAP * 1000, ENV,
    )


class Watcher:
    """The thread that watches for other processes' commits and for expiry.

    The transport's calls: ``_poll()`` returns ``(changed, next_expiry)``
    (``PRAGMA data_version`` moved; the earliest lock end); ``_topup()``
    hands out a token if work is claimable and nobody holds one;
    ``_expire_due(next_expiry)`` applies expiry if it is due by the clock and
    returns the clock's reading.

    The thread runs while claims wait and exits after ``WATCHER_IDLE``
    seconds without any.  With a kernel watch (``mechanism`` ``inotify`` or
    ``kqueue``, ``watch.py``) each round is: look (``_poll``, expiry,
    top-up), then sleep in the kernel until the WAL file is written, the
    earliest lock end is due by the clock (measured from the clock's reading,
    the clock being assumed to count seconds), or a settle re-check is due
    (``SETTLE``: after a write, SQLite makes the commit visible in the
    ``-shm`` index *after* the WAL ``write()`` the watch reports, so a look
    right after the write may miss it).  The watch stays armed the whole
    time, so a commit after a look is always reported.  Without one
    (``mechanism == "poll"``) it polls, backing off from ``POLL_START`` to
    ``POLL_CAP``.
    """

    def __init__(self, transport: Any, queue: WaitQueue) -> None:
        self._transport = transport
        self._queue = queue
        # The database's absolute path now: a later os.chdir() must not move the watch.
        self._db_path = os.path.abspath(transport.path)
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._kick = threading.Event()  # wakes the idle or polling thread
        self._idle = False  # the thread sleeps on _kick: no claim waits
        self._watch: Optional[FileWatch] = None
        #: How the thread learns of other processes' commits: "inotify",
        #: "kqueue" or "poll" (None until it first ran).  For tests and benches.
        self.mechanism: Optional[str] = None

    def ensure(self) -> None:
        """Start the thread if it is not running (a claim is about to sleep)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                if self._idle:
                    self._idle = False
                    self._kick.set()
                return
            self._stop.clear()
            self._kick.clear()
            self._idle = False
            self._thread = threading.Thread(target=self._run, name="leasequeue-sqlite-watcher", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        watch = self._watch
        if watch is not None:
            watch.kick()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def forget(self) -> None:
        """In a child after fork(): close the inherited watch's descriptors
        (the thread did not survive the fork); take no lock."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.forget()

    def _open_watch(self) -> Optional[FileWatch]:
        try:
            mechanism = choose_mechanism()
        except ValueError as exc:
            _warn_fallback(self._transport.path, os.environ.get(ENV, ""), exc)
            return None
        if mechanism == "poll":
            if os.environ.get(ENV, "auto").strip().lower() != "poll":
                _note_no_watch(self._transport.path)  # auto, on a platform that has none
            return None
        try:
            return open_watch(self._db_path, mechanism)
        except OSError as exc:
            _warn_fallback(self._transport.path, mechanism, exc)
            return None

    def _run(self) -> None:
        try:
            watch = self._watch = self._open_watch()
            self.mechanism = "poll" if watch is None else watch.mechanism
            self._loop()
        finally:
            watch, self._watch = self._watch, None
            if watch is not None:
                watch.close()

    def _idle_wait(self) -> bool:
        """No claim waits: sleep until one does (True) or WATCHER_IDLE passes (False)."""
        queue = self._queue
        with self._lock:
            self._idle = True
            self._kick.clear()
        if not queue.waiters:
            self._kick.wait(WATCHER_IDLE)
        with self._lock:
            self._idle = False
            if not queue.waiters and not self._stop.is_set():
                # Exit unless a claim registered meanwhile (ensure() holds
                # this lock while it checks is_alive()).
                self._thread = None
                return False
        return True

    def _loop(self) -> None:
        transport = self._transport
        queue = self._queue
        stop = self._stop
        kick = self._kick
        monotonic = time.monotonic
        delay = POLL_START  # the poll's backoff (no kernel watch)
        expiry_backoff = EXPIRY_MIN_SLEEP  # when the clock stands still at a due expiry
        settle = len(SETTLE)  # index of the next settle re-check (none pending)
        recheck_at = _INF
        looked = -_INF
        while not stop.is_set():
            if not queue.waiters:
                if not self._idle_wait():
                    return
                continue
            # Look: other processes' commits, then expiry.
            if self._watch is not None:
                early = looked + MIN_LOOK_GAP - monotonic()
                if early > 0.0:
                    time.sleep(early)  # a burst of writes: they coalesce meanwhile
            looked = monotonic()
            timeout: Optional[float] = None
            try:
                changed, next_expiry = transport._poll()
                if changed:
                    transport._topup()
                if next_expiry is not None:
                    now = transport._expire_due(next_expiry)
                    gap = next_expiry - now
                    if gap > 0.0:
                        expiry_backoff = EXPIRY_MIN_SLEEP
                    else:  # due, yet still the earliest: the clock stands still (a manual clock)
                        gap = expiry_backoff
                        expiry_backoff = min(expiry_backoff * 2.0, EXPIRY_MAX_SLEEP)
                    timeout = gap
            except Exception:  # a closed transport, a clock that raised: try again later
                if transport.closed:
                    return
                changed = False
                timeout = POLL_CAP
            # Sleep.
            watch = self._watch
            if watch is None:
                delay = POLL_START if changed else min(delay * 2.0, POLL_CAP)
                timeout = delay if timeout is None else min(timeout, delay)
                kick.wait(timeout)
                if not self._idle:
                    kick.clear()
                continue
            if recheck_at != _INF:
                until = recheck_at - monotonic()
                timeout = until if timeout is None else min(timeout, until)
            if timeout is None or timeout > MAX_SLEEP:
                timeout = MAX_SLEEP
            try:
                written = watch.wait(max(timeout, 0.0))
            except Exception as exc:  # noqa: BLE001 - the kernel watch failed: poll from now on
                _warn_fallback(transport.path, watch.mechanism, exc)
                self._watch = None
                self.mechanism = "poll"
                watch.close()
                continue
            if written:
                settle = 0
            elif monotonic() < recheck_at:
                continue  # a kick or the expiry: no settle re-check is due yet
            if settle < len(SETTLE):
                recheck_at = monotonic() + SETTLE[settle]
                settle += 1
            else:
                recheck_at = _INF
