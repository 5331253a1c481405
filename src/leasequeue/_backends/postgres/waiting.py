"""Waiting claims of one ``PostgresTransport``: the wait room and the listener.

Every write that makes a message claimable (publish into a group with
nothing in flight, an ack exposing a group's next message, ``nack(0)``, an
expiry, ``resume``, ``set_priority``, an undone claim) sends
``NOTIFY leasequeue_<queue id>, '<priority>:<seq>'`` in its transaction, so
the notification arrives, on every machine, once the change is committed;
but only while some process is *signed up* (``leasequeue.listeners``): a
NOTIFY serialises the commits of every notifying transaction of the
database, so writers must not pay it while nobody sleeps.

A process signs up when one of its waiting claims is about to sleep, not
before: a waiting claim that finds a message at once (a busy worker) costs
the writers nothing.  A claim may sleep only if the process was signed up
before that claim began (``Waiter.epoch``); otherwise it signs up (which
waits for every writer that decided not to notify) and claims once more.
The listener thread withdraws the sign-up once no claim of this process has
slept for ``hold`` seconds, so a queue whose workers are all busy goes back
to silent commits.

In each process one listener thread holds a connection that ``LISTEN``s on
the queue's channel.  For each notification it wakes one waiting claim of
this transport: the one that has waited longest among those whose floor
admits the priority (``WaitRoom.notify``).  A woken claim that leaves
without using its wake (it timed out, was cancelled, or had already claimed
something) hands the wake on to the next eligible waiter, so a claimable
message and an admitting waiter never both stay idle within a process.

Expiries send nothing by themselves: the first waiter in line (the
*timekeeper*) sleeps no longer than until the queue's earliest lock end,
then claims, which frees the expired locks (and so notifies the others).
When the timekeeper leaves, the next waiter becomes timekeeper and is woken
to learn the next lock end.  Nothing polls: a waiter sleeps on a
``threading.Event`` (or an ``asyncio`` future) until a wake, its deadline,
or (timekeeper only) the next lock end.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

__all__ = ["Listener", "WaitRoom", "Waiter"]


class Waiter:
    """One waiting claim: its floor, and how to wake it (thread or coroutine)."""

    __slots__ = ("floor", "event", "loop", "future", "woken", "wake_priority", "gone", "rearm", "claiming",
                 "epoch", "asleep")

    def __init__(self, floor: int, loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        self.floor = floor
        self.loop = loop
        self.event: Optional[threading.Event] = None if loop is not None else threading.Event()
        self.future: Optional[asyncio.Future] = None
        self.woken = False  # a wake is pending (given, not yet used)
        self.wake_priority: Optional[int] = None
        self.gone = False
        self.rearm = False  # woken only to recompute its sleep (it became timekeeper)
        self.claiming = True  # from entry or take_wake until its next sleep
        self.epoch = 0  # the room's sign-up when its latest claim began (0: none)
        self.asleep = False  # counted in WaitRoom.sleepers

    def arm(self) -> None:
        """Before sleeping: a fresh future (asyncio) / a cleared event (thread)."""
        if self.loop is not None:
            self.future = self.loop.create_future()

    def _signal(self) -> None:
        if self.event is not None:
            self.event.set()
        elif self.loop is not None:
            future = self.future
            if future is not None:
                try:
                    self.loop.call_soon_threadsafe(_resolve, future)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    pass


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class WaitRoom:
    """The waiting claims of one transport, in arrival order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: List[Waiter] = []
        self.closed = False
        #: time.monotonic() of the earliest lock end this process knows of
        self.due = math.inf
        #: the current sign-up (``leasequeue.listeners``), 0 while not signed up
        self.armed = 0
        self._sign_ups = 0
        #: waiting claims asleep now (signed up), and since when none is
        self.sleepers = 0
        self.idle_since = time.monotonic()
        #: drop_queue announced the queue's end: a look that finds nothing checks it
        self.dropped = False

    # ---------------------------------------------------------- sign-up

    def signed_up(self) -> None:
        """The process's sign-up committed: claims begun from now on may sleep."""
        with self._lock:
            self._sign_ups += 1
            self.armed = self._sign_ups
            self.idle_since = time.monotonic()

    def signed_off(self) -> None:
        """The sign-up is gone (withdrawn, or the listener's connection was lost)."""
        with self._lock:
            self.armed = 0

    def disarm_in(self, hold: float) -> Optional[float]:
        """Seconds until the sign-up may be withdrawn (None: not now)."""
        with self._lock:
            if not self.armed or any(w.asleep and not w.woken for w in self._waiters):
                return None
            if self.sleepers:  # only woken ones, about to wake up
                return hold
            return max(self.idle_since + hold - time.monotonic(), 0.0)

    def try_disarm(self, hold: float) -> bool:
        """True (and no longer signed up) if no claim slept for ``hold`` s."""
        with self._lock:
            if not self.armed or self.sleepers or time.monotonic() - self.idle_since < hold:
                return False
            self.armed = 0
            return True

    def _awake(self, waiter: Waiter) -> None:
        """(Under the lock.)  The waiter no longer sleeps."""
        if waiter.asleep:
            waiter.asleep = False
            self.sleepers -= 1
            if not self.sleepers:
                self.idle_since = time.monotonic()

    def set_due(self, due: float) -> None:
        """What a claim's report said: the earliest lock end now."""
        self.due = due

    def note_due(self, due: float) -> None:
        """A lock this process just made ends at ``due``; an earlier end than
        the timekeeper sleeps towards re-arms it (without a claim)."""
        if due < self.due:
            self.due = due
            with self._lock:
                first = self._waiters[0] if self._waiters else None
                if first is not None:
                    first.rearm = True
            if first is not None:
                first._signal()

    def sleep_for(self, waiter: Waiter, deadline: float, busy: bool = False) -> Optional[float]:
        """How long ``waiter`` may sleep: to its deadline, and the timekeeper
        no later than the earliest known lock end.  None: the process was not
        signed up when the waiter's claim began, so it must sign up and claim
        again first (``busy``: it only naps until its next claim, ~2 ms, and
        may do so unsigned)."""
        now = time.monotonic()
        until = deadline
        with self._lock:
            signed = waiter.epoch != 0 and waiter.epoch == self.armed
            if not signed and not busy:
                return None
            waiter.rearm = False
            if signed:
                waiter.claiming = False
                if not waiter.asleep:
                    waiter.asleep = True
                    self.sleepers += 1
            if not waiter.woken and waiter.event is not None:
                waiter.event.clear()
            if self._waiters and self._waiters[0] is waiter and self.due < until:
                until = self.due
        return until - now

    def __len__(self) -> int:
        return len(self._waiters)

    def enter(self, waiter: Waiter) -> None:
        with self._lock:
            self._waiters.append(waiter)

    def is_timekeeper(self, waiter: Waiter) -> bool:
        with self._lock:
            return bool(self._waiters) and self._waiters[0] is waiter

    def take_wake(self, waiter: Waiter) -> None:
        """The waiter is about to claim: its pending wake is used."""
        with self._lock:
            waiter.woken = False
            waiter.wake_priority = None
            waiter.claiming = True
            waiter.epoch = self.armed
            self._awake(waiter)
            if waiter.event is not None:
                waiter.event.clear()

    def leave(self, waiter: Waiter, used: bool) -> None:
        """The waiter is done; an unused wake goes to the next eligible waiter,
        and a departing timekeeper wakes its successor."""
        to_wake: List[Waiter] = []
        with self._lock:
            waiters = self._waiters
            was_first = bool(waiters) and waiters[0] is waiter
            waiter.gone = True
            self._awake(waiter)
            try:
                waiters.remove(waiter)
            except ValueError:
                pass
            if waiter.woken and not used:
                nxt = self._pick(waiter.wake_priority)
                if nxt is not None:
                    self._give(nxt, waiter.wake_priority)
                    to_wake.append(nxt)
            if was_first and waiters and waiters[0] not in to_wake:
                first = waiters[0]  # the new timekeeper: it re-arms, no claim
                first.rearm = True
                to_wake.append(first)
        for w in to_wake:
            w._signal()

    def notify(self, priority: Optional[int]) -> None:
        """A message of this priority (None: unknown) became claimable."""
        with self._lock:
            waiter = self._pick(priority)
            if waiter is not None:
                self._give(waiter, priority)
        if waiter is not None:
            waiter._signal()

    def wake_first(self) -> None:
        """The timekeeper should look at the lock ends again."""
        with self._lock:
            waiter = self._waiters[0] if self._waiters else None
            if waiter is not None:
                self._give(waiter, None)
        if waiter is not None:
            waiter._signal()

    def wake_all(self) -> None:
        """Every waiter re-checks (close, or the listener reconnected)."""
        with self._lock:
            waiters = list(self._waiters)
            for waiter in waiters:
                self._give(waiter, None)
        for waiter in waiters:
            waiter._signal()

    def _pick(self, priority: Optional[int]) -> Optional[Waiter]:
        """The longest-waiting sleeper whose floor admits ``priority``; if
        none sleeps, one that is claiming right now (its claim may have
        missed the message, so it must look once more before sleeping)."""
        busy = None
        for waiter in self._waiters:
            if not waiter.woken and (priority is None or waiter.floor <= priority):
                if not waiter.claiming:
                    return waiter
                if busy is None:
                    busy = waiter
        return busy

    @staticmethod
    def _give(waiter: Waiter, priority: Optional[int]) -> None:
        waiter.woken = True
        waiter.wake_priority = priority


def parse_payload(payload: str) -> Optional[int]:
    """The priority a notification announces (None: wake the timekeeper)."""
    head, _, _ = payload.partition(":")
    try:
        return int(head)
    except ValueError:
        return None


class Listener:
    """A thread that LISTENs on one channel and feeds a ``WaitRoom``.

    ``connect`` makes a new autocommit psycopg connection.  The first
    ``LISTEN`` happens in ``start`` (in the caller's thread, so a waiting
    claim never claims before the listener hears notifications).  A lost
    connection is re-made with back-off; the sign-up is then gone, and every
    waiter is woken to re-check (and sign up again before it sleeps), since
    notifications may have been missed meanwhile.

    ``sign_up(execute)`` records this process as a listener (under
    ``arm_lock``, with the listening connection's pid); the thread withdraws
    the record (``unregister``) once no waiting claim has slept for ``hold``
    seconds.
    """

    def __init__(self, connect: Callable[[], Any], channel: str, room: WaitRoom,
                 poke: Callable[[str], None], register: str = "", unregister: str = "",
                 queue: int = 0, hold: float = 1.0) -> None:
        self._connect = connect
        self._poke = poke
        self._register = register
        self._unregister = unregister
        self._queue = queue
        self._channel = channel
        self._room = room
        self.hold = hold
        self._conn: Any = None
        self.pid: Optional[int] = None  # the listening connection's backend
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: serialises sign-up and withdrawal (each one round trip)
        self.arm_lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Connect and LISTEN (raises on failure), then run the thread."""
        with self._lock:
            if self.running or self._stop.is_set():
                return
            self._conn = self._listen()
            self._thread = threading.Thread(target=self._run, name=f"leasequeue-listen-{self._channel}", daemon=True)
            self._thread.start()

    def _listen(self) -> Any:
        conn = self._connect()
        try:
            conn.execute(f"LISTEN {self._channel}")
        except BaseException:
            conn.close()
            raise
        with self.arm_lock:
            self.pid = int(conn.info.backend_pid)
            self._room.signed_off()
        return conn

    def sign_up(self, execute: Callable[[str, Sequence[Any]], Any]) -> None:
        """Sign this process up (if it is not), through ``execute(sql,
        params)`` on some connection; the listening connection's pid names
        the record.  Returns once the sign-up committed (it waited for every
        writer that decided not to notify)."""
        with self.arm_lock:
            if self._room.armed or self.pid is None:
                return
            execute(self._register, (self._queue, self.pid))
            self._room.signed_up()

    def _withdraw(self, conn: Any) -> None:
        """Withdraw the sign-up if no claim slept for ``hold`` seconds."""
        with self.arm_lock:
            if self._room.try_disarm(self.hold) and self._unregister:
                conn.execute(self._unregister, (self._queue,))

    def _run(self) -> None:
        delay = 0.05
        room = self._room
        while not self._stop.is_set():
            conn = self._conn
            try:
                if conn is None:
                    conn = self._conn = self._listen()
                    room.wake_all()
                    delay = 0.05
                due = room.disarm_in(self.hold)
                for note in conn.notifies(timeout=60.0 if due is None else due + 0.001):
                    if self._stop.is_set():
                        break
                    if note.payload == "stop":
                        continue  # a listener of this queue (maybe elsewhere) stops
                    if note.payload == "dropped":  # drop_queue: waiting claims look (and find it gone)
                        room.dropped = True
                        room.wake_all()
                        continue
                    priority = parse_payload(note.payload)
                    if priority is None:
                        room.wake_first()
                    else:
                        room.notify(priority)
                    if self._stop.is_set() or (due is None and room.disarm_in(self.hold) is not None):
                        break  # nobody sleeps any more: time the withdrawal
                if not self._stop.is_set():
                    self._withdraw(conn)
            except Exception:
                if self._stop.is_set():
                    break
                self._conn = None
                room.signed_off()
                try:
                    if conn is not None:
                        conn.close()
                except Exception:
                    pass
                self._stop.wait(delay)
                delay = min(delay * 2, 2.0)

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is None:
            return
        try:
            self._poke("stop")  # ends the thread's wait for notifications
        except Exception:
            pass
        if thread is not threading.current_thread():
            thread.join(timeout=5.0)
        conn = self._conn
        if conn is not None and not thread.is_alive():
            try:
                if self._unregister:
                    conn.execute(self._unregister, (self._queue,))
            except Exception:
                pass
            try:
                conn.close()
            except Exception:
                pass


def monotonic() -> float:
    return time.monotonic()
