"""``ReferenceTransport``: the contract as a slow, obviously right program.

This is the referee of the conformance kit.  It is the seed note's algorithm
(``seed/000_a670dcc8f940ceb3.txt``) written as plainly as possible -- a list
of message dicts, sorted on every claim -- with exactly the differences that
the contract (``docs/contract.md``) names and the choices of ``docs/decisions.md``:

* round-robin by the *order of claims* (a claim counter) instead of the
  ``last_claimed_at`` timestamp; never-claimed groups first (key 0), in the
  order of their oldest message (the ``seq`` tie-break of the sort);
* fencing: each message counts its deliveries (``attempt``) and remembers
  its open delivery's number (``delivery``, None when closed);
  ``ack``/``nack``/``extend`` with a lease that is not current raise
  ``LeaseLost`` and change nothing;
* the SPEC's bad-input table, each argument validated in signature order
  before the clock is read and before anything changes;
* expiry applied, permanently, by the operations that read the clock for it
  (``claim``, ``claim_many``, ``ack_and_claim``, ``stats``, ``group``,
  ``groups``, ``skip``);
* the transport's time never runs backwards: an operation that reads the
  clock acts at ``max(clock(), latest time used)``, and one that raises
  leaves that time alone;
* Part 2: ``close``/``closed`` and ``claim(timeout=)``, the control plane
  (``pause``, ``resume``, ``purge``, ``set_priority``, ``group``,
  ``groups``, ``stats().paused``) and the batches (``publish_many``,
  ``claim_many``, ``ack_many``), with the choices pinned in the "Part 2"
  section of ``docs/decisions.md``;
* Part 4's quarantine: ``bury`` (the group waits, its head kept, until
  ``resume`` or ``skip``), ``skip`` (the head removed unless a live lease
  holds it), ``peek``, ``GroupInfo.reason`` and ``stats().buried``, with the
  choices pinned in the "Part 4" section of ``docs/decisions.md``;
* ``ack_and_claim``: ``ack`` then a non-waiting ``claim``, one clock reading
  for both, nothing changed when the lease is not current (the
  "ack_and_claim" section of ``docs/decisions.md``);
* Part 5 (the "Part 5 ... pinned" section of ``docs/decisions.md``):
  *later* -- a message dict carries its ``due`` time (``None`` without a
  delay), and a group whose head has ``due >= now`` is not eligible;
  *once* -- a message dict carries its ``key``, and a key is held per
  ``(group_id, key)`` while its message is held and, with a
  ``dedup_window``, until ``now >= published_at + dedup_window`` (a list of
  the keys whose message has left); *honest attempts* -- ``release`` is
  ``nack`` with the attempt handed back, ``retry`` resets the head, and
  fencing is by delivery: each claim is numbered by the claim counter
  (the round-robin key), a message remembers the number of its open
  delivery, and an issued lease carries its number privately.

It was written from the SPEC and the decisions, never from a transport's
code, so that a differential test against it is a test against the contract
and not against a second copy of the same mistakes.  Every claim costs
O(N log N) on purpose: the sort *is* the specification.  Use it as the
oracle for your own backend (``check_differential`` does), or read it to
learn what each operation must do.

What it does not do: wait.  It is single-threaded and has nobody to wait
for, so ``claim(..., timeout=t)`` with ``t != 0`` (or ``None``) returns at
once what a non-waiting claim returns -- which is what a waiting claim
returns when nothing happens before its deadline -- and after ``close()``
returns ``None`` as the SPEC says.  There is no ``aclaim``.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

from .._errors import LeaseLost, LeaseQueueError
from .._types import PARKED, GroupInfo, Message, TransportStats

__all__ = ["ReferenceLease", "ReferenceTransport"]

# The signed 64-bit ends, written out: the referee (and the rest of the kit,
# which imports them from here) never takes the code under test's constants.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class ReferenceLease:
    """A lease as the reference issues it: the SPEC's six fields, immutable.

    Equal when the five non-event fields are equal and the events are the
    same object; the hash ignores the event.  A lease built by hand (six
    positional fields) has no issuing transport and no delivery number, and
    is never current (unless the referee accepts rebuilt leases).  An issued
    lease carries, privately, the number of the delivery it names
    (``_delivery``: the claim counter's value at that claim).
    """

    __slots__ = ("seq", "group_id", "event", "worker_id", "expires_at", "attempt", "_owner", "_delivery")

    seq: int
    group_id: str
    event: Any
    worker_id: str
    expires_at: float
    attempt: int
    _owner: Any
    _delivery: Optional[int]

    def __init__(
        self, seq: int, group_id: str, event: Any, worker_id: str, expires_at: float, attempt: int
    ) -> None:
        for name, value in zip(self.__slots__, (seq, group_id, event, worker_id, expires_at, attempt, None, None)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a lease is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a lease is immutable: cannot delete {name!r}")

    def _fields(self) -> tuple[Any, ...]:
        return (self.seq, self.group_id, self.worker_id, self.expires_at, self.attempt)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReferenceLease):
            return NotImplemented
        return self._fields() == other._fields() and self.event is other.event

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"ReferenceLease(seq={self.seq!r}, group_id={self.group_id!r}, event={self.event!r}, "
            f"worker_id={self.worker_id!r}, expires_at={self.expires_at!r}, attempt={self.attempt!r})"
        )


def _issue(owner: Any, m: dict[str, Any]) -> ReferenceLease:
    """The lease of ``m``'s open delivery, naming it by its number."""
    lease = ReferenceLease(m["seq"], m["group_id"], m["event"], m["locked_by"], m["lock_expiry"], m["attempt"])
    object.__setattr__(lease, "_owner", owner)
    object.__setattr__(lease, "_delivery", m["delivery"])
    return lease


# -- argument checks: the SPEC's bad-input table ------------------------------
# Written here again, on purpose, rather than imported from the transports.


def _check_id(value: Any, name: str) -> str:
    """``group_id``/``worker_id``: a ``str``; a subclass becomes an exact str."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return str.__getitem__(value, slice(None))


def _check_worker(value: Any) -> str:
    worker_id = _check_id(value, "worker_id")
    if worker_id == PARKED:
        raise ValueError(f"worker_id {PARKED!r} is reserved for parked messages")
    return worker_id


def _check_priority(value: Any, name: str) -> int:
    """``priority``/``min_priority``: an int (not bool) in the signed 64-bit range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise OverflowError(f"{name} is outside the signed 64-bit range")
    return int(value)


def _seconds(value: Any, name: str) -> float:
    """An int or float (not bool) as a float; an int beyond float range is +-inf."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be an int or float, not {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _check_duration(value: Any, name: str) -> float:
    """``visibility``/``delay``: not negative, not NaN; ``+inf`` never expires."""
    seconds = _seconds(value, name)
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{name} must be >= 0 and not NaN, not {value!r}")
    return seconds


def _check_timeout(value: Any) -> Optional[float]:
    """``timeout``: ``None`` (no deadline) or a duration; ``-0.0`` is 0."""
    if value is None:
        return None
    return _check_duration(value, "timeout")


def _check_count(value: Any) -> int:
    """``max_count``: an int (not bool) >= 0, with no upper bound."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_count must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"max_count must be >= 0, not {value!r}")
    return int(value)


def _check_reason(value: Any) -> str:
    """``bury``'s ``reason``: a ``str``; a subclass becomes an exact str."""
    if not isinstance(value, str):
        raise TypeError(f"reason must be a str, not {type(value).__name__}")
    return str.__getitem__(value, slice(None))


def _check_key(value: Any) -> Optional[str]:
    """``key``: ``None`` or a ``str``; a subclass becomes an exact str."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"key must be a str or None, not {type(value).__name__}")
    return str.__getitem__(value, slice(None))


def _check_clock_value(value: Any) -> float:
    """What the clock returned: int or float (not bool), finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"clock() must return an int or float, not {type(value).__name__}")
    try:
        now = float(value)
    except OverflowError:
        raise ValueError("clock() returned an int beyond float range") from None
    if not math.isfinite(now):
        raise ValueError(f"clock() returned {now!r}, which is not finite")
    return now


def _check_item(item: Any) -> tuple[str, Any, int, Optional[str]]:
    """One ``publish_many`` item: a tuple ``(group_id, event)``,
    ``(group_id, event, priority)`` or ``(group_id, event, priority, key)``,
    its fields checked in that order.  A tuple subclass (a named tuple) is
    read as the tuple it is; anything else is a ``TypeError``, a tuple of
    another length a ``ValueError``."""
    if not isinstance(item, tuple):
        raise TypeError(f"publish_many items must be tuples, not {type(item).__name__}")
    size = tuple.__len__(item)
    if size not in (2, 3, 4):
        raise ValueError(f"a publish_many item has 2, 3 or 4 fields, not {size}")
    group_id = _check_id(tuple.__getitem__(item, 0), "group_id")
    priority = _check_priority(tuple.__getitem__(item, 2), "priority") if size >= 3 else 0
    key = _check_key(tuple.__getitem__(item, 3)) if size == 4 else None
    return group_id, tuple.__getitem__(item, 1), priority, key


class ReferenceTransport:
    """The seed's algorithm, literally, with the SPEC's differences.

    ``ReferenceTransport(clock=time.time, *, dedup_window=0.0)``: the same
    constructor and methods as ``leasequeue.InMemoryTransport`` (Parts 1, 2,
    4 and 5, without waiting), returning ``ReferenceLease`` leases and the
    shared ``TransportStats``, ``GroupInfo`` and ``Message`` values.  Not
    thread-safe and O(N log N) per claim: it is a referee, not a transport
    to run.

    ``dedup_window`` (seconds, validated like ``delay``, after ``clock``):
    how long a key stays held after its message has left (Part 5, "Once");
    ``0.0`` holds a key exactly while its message is held, ``math.inf`` for
    the transport's life.

    ``accepts_rebuilt_leases=True`` makes it the referee of a backend that
    names a delivery by the lease's fields (a durable one, whose leases any
    process may rebuild): a lease it did not issue -- built by hand, or
    issued by another instance -- is then current when its ``seq``,
    ``group_id``, ``worker_id`` and ``attempt`` (exact ``int``/``str``) name
    the message's open delivery (and, for a lease that carries a delivery
    number, that number is the open delivery's); ``expires_at`` and
    ``event`` are not compared.  By default only the leases this instance
    issued are current, each while its delivery is open.

    ``usable_after_close=False`` makes it the referee of a backend whose
    ``close()`` releases its connection (docs/decisions.md, "Part 3"):
    after ``close()`` a claim with a non-zero timeout still returns None,
    and every other call validates its arguments and then raises
    ``LeaseQueueError`` (before reading the clock).  By default every call
    works after ``close()``, as Part 2 says of the in-memory transports.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        *,
        dedup_window: float = 0.0,
        accepts_rebuilt_leases: bool = False,
        usable_after_close: bool = True,
    ) -> None:
        if not callable(clock):
            raise TypeError(f"clock must be callable, not {type(clock).__name__}")
        self._window = _check_duration(dedup_window, "dedup_window")
        self._clock = clock
        self._accepts_rebuilt = bool(accepts_rebuilt_leases)
        self._usable_after_close = bool(usable_after_close)
        #: the seed's list of messages, in publish (seq) order
        self._messages: List[Dict[str, Any]] = []
        #: keys whose message has left, still held while the window runs
        #: (only with ``dedup_window > 0``): group_id, key, seq, published_at
        self._gone_keys: List[Dict[str, Any]] = []
        #: per group: priority, round-robin key, pause, bury, creation number
        self._groups: Dict[str, Dict[str, Any]] = {}
        self._seq = 0
        self._claims = 0  # the round-robin key: claim order, not a timestamp
        self._created = 0  # groups() lists groups in creation order
        self._latest = -math.inf  # the transport's time never runs back
        self._closed = False

    def _usable(self) -> None:
        """After validation: a closed transport that is not usable after
        ``close()`` refuses the call."""
        if self._closed and not self._usable_after_close:
            raise LeaseQueueError("the transport is closed")

    # -- time ---------------------------------------------------------------

    def _read_clock(self) -> float:
        return _check_clock_value(self._clock())

    def _use(self, now: float) -> float:
        """The time an operation acts at: never before one already used."""
        self._latest = max(self._latest, now)
        return self._latest

    def _now(self) -> float:
        """Read the clock, apply expiry: what claim/stats/group do first."""
        return self._expire(self._read_clock())

    def _expire(self, reading: float) -> float:
        """Act at ``reading`` (never before a time already used) and apply
        expiry there; the time acted at."""
        now = self._use(reading)
        for m in self._messages:
            if m["locked_by"] is not None and m["lock_expiry"] < now:
                m["locked_by"] = None  # free again; expiry is permanent once seen
                m["lock_expiry"] = 0.0
                # ``open`` stays: the lease is current until somebody re-claims
        return now

    # -- groups ---------------------------------------------------------------

    def _new_group(self, group_id: str, priority: int, paused: bool) -> Dict[str, Any]:
        self._created += 1
        group = {"claim_order": 0, "last_claimed_at": None, "priority": priority, "paused": paused,
                 "buried": False, "reason": None, "created": self._created}
        self._groups[group_id] = group
        return group

    def _of(self, group_id: str) -> List[Dict[str, Any]]:
        return [m for m in self._messages if m["group_id"] == group_id]

    def _forget_if_done(self, group_id: str) -> None:
        """A group with no message is forgotten, unless it is paused.  (A
        buried group always holds its head: skip lifts the bury with it.)"""
        group = self._groups.get(group_id)
        if group is not None and not group["paused"] and not self._of(group_id):
            del self._groups[group_id]  # priority and round-robin place go too

    # -- Part 1 ---------------------------------------------------------------

    def publish(
        self, group_id: str, event: Any, priority: int = 0, *, delay: float = 0.0, key: Optional[str] = None
    ) -> int:
        """Append ``event`` (scheduled until ``now + delay`` when ``delay >
        0``); with a ``key`` that is held in the group, publish nothing and
        return the seq of the message that holds it."""
        group_id = _check_id(group_id, "group_id")
        priority = _check_priority(priority, "priority")
        delay = _check_duration(delay, "delay")
        key = _check_key(key)
        self._usable()
        now = None
        if delay > 0 or (key is not None and self._window > 0):
            now = self._use(self._read_clock())  # moves the time; applies no expiry (as nack's reading)
        return self._publish(group_id, event, priority, delay, key, now)

    def _publish(self, group_id: str, event: Any, priority: int, delay: float, key: Optional[str],
                 now: Optional[float]) -> int:
        """One message; ``now`` is the reading (None when none was needed)."""
        if key is not None:
            holder = self._holder(group_id, key, now)
            if holder is not None:
                return holder  # nothing published, no seq used, no group created
        self._seq += 1
        self._messages.append({"seq": self._seq, "group_id": group_id, "event": event, "locked_by": None,
                               "lock_expiry": 0.0, "attempt": 0, "delivery": None, "holder": None,
                               "due": now + delay if delay > 0 else None,  # type: ignore[operator]
                               "key": key, "published_at": now})
        if group_id not in self._groups:  # the priority counts on creation only
            self._new_group(group_id, priority, paused=False)
        return self._seq

    def _holder(self, group_id: str, key: str, now: Optional[float]) -> Optional[int]:
        """The seq of the message holding ``key`` in ``group_id``, if held:
        a held message with that key, or (with a window) one gone for less
        than ``dedup_window`` since its publish."""
        for m in self._messages:
            if m["group_id"] == group_id and m["key"] == key:
                return m["seq"]
        if now is not None:
            self._gone_keys = [k for k in self._gone_keys if now < k["published_at"] + self._window]
            for k in self._gone_keys:
                if k["group_id"] == group_id and k["key"] == key:
                    return k["seq"]
        return None

    def _leave(self, m: Dict[str, Any]) -> None:
        """``m`` leaves the transport (ack, skip, purge): with a window, its
        key stays held until ``now >= published_at + dedup_window``."""
        self._messages.remove(m)
        if m["key"] is not None and self._window > 0:
            self._gone_keys.append({"group_id": m["group_id"], "key": m["key"], "seq": m["seq"],
                                    "published_at": m["published_at"]})

    @staticmethod
    def _scheduled(m: Dict[str, Any], now: float) -> bool:
        """Published with a delay and not due at ``now`` (due is ``due < now``)."""
        return m["due"] is not None and m["due"] >= now

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, *, timeout: Optional[float] = 0.0
    ) -> Optional[ReferenceLease]:
        """The seed's claim.  A non-zero ``timeout`` never waits here: it
        returns at once what ``timeout=0`` returns (``None`` once closed)."""
        worker_id = _check_worker(worker_id)
        visibility = _check_duration(visibility, "visibility")
        min_priority = _check_priority(min_priority, "min_priority")
        wait = _check_timeout(timeout)
        if wait != 0.0 and self._closed:
            return None  # a closed transport's waiting claim: at once, no clock
        self._usable()
        now = self._now()
        return self._claim(worker_id, visibility, min_priority, now)

    def _claim(self, worker_id: str, visibility: float, min_priority: int, now: float) -> Optional[ReferenceLease]:
        # after _now() every remaining lock has lock_expiry >= now: in flight
        in_flight = {m["group_id"] for m in self._messages if m["locked_by"] is not None}
        # only a group's head matters: a head not due holds its whole group
        heads: Dict[str, Dict[str, Any]] = {}
        for m in self._messages:  # in seq order: the first of a group is its head
            heads.setdefault(m["group_id"], m)
        waiting = {gid for gid, head in heads.items() if self._scheduled(head, now)}
        order = sorted(self._messages, key=lambda m: (self._groups[m["group_id"]]["claim_order"], m["seq"]))
        for m in order:
            group = self._groups[m["group_id"]]
            if m["group_id"] in in_flight or m["group_id"] in waiting or group["paused"] or group["buried"] \
                    or group["priority"] < min_priority:
                continue
            self._claims += 1  # numbers the delivery, and is the round-robin key
            m["locked_by"] = worker_id
            m["lock_expiry"] = now + visibility
            m["attempt"] += 1
            m["delivery"] = self._claims  # the open delivery: an older one's lease is no longer current
            m["holder"] = worker_id  # the delivery's worker, also once its lock expired
            group["claim_order"] = self._claims  # round-robin: to the back
            group["last_claimed_at"] = now
            return _issue(self, m)
        return None

    @staticmethod
    def _check_lease(lease: Any) -> ReferenceLease:
        if not isinstance(lease, ReferenceLease):
            raise TypeError(f"expected a lease, not {type(lease).__name__}")
        return lease

    def _current(self, lease: ReferenceLease) -> Optional[Dict[str, Any]]:
        """The lease's message if the lease is current, else None: an issued
        lease is current while its delivery is its message's open one."""
        if lease._owner is not self:
            if not self._accepts_rebuilt:
                return None  # forged, or issued by another transport
            return self._named_by_fields(lease)
        for m in self._messages:
            if m["seq"] == lease.seq:
                return m if m["delivery"] is not None and m["delivery"] == lease._delivery else None
        return None

    def _named_by_fields(self, lease: ReferenceLease) -> Optional[Dict[str, Any]]:
        """``accepts_rebuilt_leases``: the message whose open delivery the
        lease's fields name, if any (and, if the lease carries a delivery
        number, whose open delivery has that number)."""
        seq, group_id, worker_id, attempt = lease.seq, lease.group_id, lease.worker_id, lease.attempt
        if type(seq) is not int or type(attempt) is not int or type(group_id) is not str or type(worker_id) is not str:
            return None
        for m in self._messages:
            if m["seq"] == seq:
                named = m["delivery"] is not None and m["attempt"] == attempt and m["group_id"] == group_id
                if lease._delivery is not None and lease._delivery != m["delivery"]:
                    return None
                return m if named and m["holder"] == worker_id else None
        return None

    def _lost(self, lease: ReferenceLease) -> LeaseLost:
        return LeaseLost(f"lease of message {lease.seq} (attempt {lease.attempt}) is not current")

    def ack(self, lease: Any) -> None:
        lease = self._check_lease(lease)
        self._usable()
        m = self._current(lease)
        if m is None:
            raise self._lost(lease)
        self._ack(m)

    def _ack(self, m: Dict[str, Any]) -> None:
        self._leave(m)
        self._forget_if_done(m["group_id"])

    def nack(self, lease: Any, delay: float = 0.0) -> None:
        lease = self._check_lease(lease)
        delay = _check_duration(delay, "delay")
        self._usable()
        now = self._read_clock() if delay > 0 else 0.0
        m = self._current(lease)
        if m is None:
            raise self._lost(lease)
        if delay > 0:
            m["locked_by"] = PARKED
            m["lock_expiry"] = self._use(now) + delay
        else:
            m["locked_by"] = None
            m["lock_expiry"] = 0.0
        m["delivery"] = None  # closed; the group keeps its round-robin place

    def release(self, lease: Any, delay: float = 0.0) -> None:
        """``nack(lease, delay)`` whose delivery does not count: the
        message's attempt count goes back to ``lease.attempt - 1``."""
        self.nack(lease, delay)  # every check, error and clock reading of nack's
        for m in self._messages:
            if m["seq"] == lease.seq:
                m["attempt"] = lease.attempt - 1

    def extend(self, lease: Any, visibility: float) -> ReferenceLease:
        lease = self._check_lease(lease)
        visibility = _check_duration(visibility, "visibility")
        self._usable()
        now = self._read_clock()
        m = self._current(lease)
        if m is None:
            raise self._lost(lease)
        m["locked_by"] = lease.worker_id  # re-locks even if its time ran out
        m["lock_expiry"] = self._use(now) + visibility
        return _issue(self, m)

    def stats(self) -> TransportStats:
        self._usable()
        now = self._now()
        return TransportStats(
            messages=len(self._messages),
            groups=len({m["group_id"] for m in self._messages}),
            leased=sum(1 for m in self._messages if m["locked_by"] not in (None, PARKED)),
            parked=sum(1 for m in self._messages if m["locked_by"] == PARKED),
            paused=sum(1 for g in self._groups.values() if g["paused"]),
            buried=sum(1 for g in self._groups.values() if g["buried"]),
            scheduled=sum(1 for m in self._messages if self._scheduled(m, now)),
        )

    def __len__(self) -> int:
        self._usable()
        return len(self._messages)

    # -- Part 2: waiting (as far as a referee can) ------------------------------

    def close(self) -> None:
        """Idempotent; from now on a claim with a non-zero timeout returns None."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> ReferenceTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- Part 2: the control plane ------------------------------------------------

    def pause(self, group_id: str) -> bool:
        """True if the group was not paused; an unknown group is created, paused."""
        group_id = _check_id(group_id, "group_id")
        self._usable()
        group = self._groups.get(group_id)
        if group is None:
            self._new_group(group_id, 0, paused=True)
            return True
        if group["paused"]:
            return False
        group["paused"] = True
        return True

    def resume(self, group_id: str) -> bool:
        """Lift the pause and the bury, and end the park (expired or not,
        unless an operation that reads the clock already saw it expire); True
        if any was lifted.  An unknown group: False."""
        group_id = _check_id(group_id, "group_id")
        self._usable()
        group = self._groups.get(group_id)
        if group is None:
            return False
        lifted = bool(group["paused"] or group["buried"])
        group["paused"] = False
        group["buried"] = False  # the head is claimable again, attempt kept
        group["reason"] = None
        for m in self._of(group_id):
            if m["locked_by"] == PARKED:
                m["locked_by"] = None  # claimable now; attempt unchanged
                m["lock_expiry"] = 0.0
                lifted = True
        self._forget_if_done(group_id)
        return lifted

    def purge(self, group_id: str) -> int:
        """Remove the group's messages (leased and parked too) and forget it."""
        group_id = _check_id(group_id, "group_id")
        self._usable()
        if self._groups.pop(group_id, None) is None:
            return 0
        removed = self._of(group_id)
        for m in removed:
            self._leave(m)  # a key stays held while the window runs
        return len(removed)

    def set_priority(self, group_id: str, priority: int) -> bool:
        """Change an existing group's priority (position kept); False if none."""
        group_id = _check_id(group_id, "group_id")
        priority = _check_priority(priority, "priority")
        self._usable()
        group = self._groups.get(group_id)
        if group is None:
            return False
        group["priority"] = priority
        return True

    def group(self, group_id: str) -> Optional[GroupInfo]:
        group_id = _check_id(group_id, "group_id")
        self._usable()
        now = self._now()
        return self._info(group_id, now) if group_id in self._groups else None

    def groups(self) -> List[GroupInfo]:
        """Every group, in the order the groups were created."""
        self._usable()
        now = self._now()
        order = sorted(self._groups, key=lambda gid: self._groups[gid]["created"])
        return [self._info(gid, now) for gid in order]

    def _info(self, group_id: str, now: float) -> GroupInfo:
        group = self._groups[group_id]
        held = self._of(group_id)
        locked = [m for m in held if m["locked_by"] is not None]  # all live: _now() ran
        if locked:
            m = locked[0]
            state = "parked" if m["locked_by"] == PARKED else "leased"
            worker_id, expires_at, attempt = m["locked_by"], m["lock_expiry"], m["attempt"]
        elif group["buried"]:  # the buried delivery: its worker and attempt, no end
            state = "buried"
            worker_id, expires_at, attempt = held[0]["holder"], None, held[0]["attempt"]
        else:
            scheduled = bool(held) and self._scheduled(held[0], now)
            state = "paused" if group["paused"] else "scheduled" if scheduled else "ready"
            worker_id = expires_at = attempt = None
        due_at = held[0]["due"] if held and self._scheduled(held[0], now) else None
        return GroupInfo(
            group_id=group_id,
            priority=group["priority"],
            messages=len(held),
            state=state,
            paused=group["paused"],
            head_seq=held[0]["seq"] if held else None,
            worker_id=worker_id,
            expires_at=expires_at,
            attempt=attempt,
            last_claimed_at=group["last_claimed_at"],
            reason=group["reason"],
            due_at=due_at,
        )

    # -- Part 4: quarantine ---------------------------------------------------------

    def bury(self, lease: Any, reason: str = "") -> None:
        """End the lease's delivery and quarantine its group: the message
        stays at the head, and no claim serves the group until ``resume`` or
        ``skip``.  Reads no clock (like ``ack``)."""
        lease = self._check_lease(lease)
        reason = _check_reason(reason)
        self._usable()
        m = self._current(lease)
        if m is None:
            raise self._lost(lease)
        m["locked_by"] = None  # the delivery ends, as after nack(0) ...
        m["lock_expiry"] = 0.0
        m["delivery"] = None
        group = self._groups[m["group_id"]]
        group["buried"] = True  # ... but the group waits; its round-robin place is kept
        group["reason"] = reason

    def skip(self, group_id: str) -> bool:
        """Remove the group's head unless a lease that has not expired holds
        it, and lift the bury (not the pause).  Reads the clock and applies
        expiry first, as ``group`` does (also for an unknown group)."""
        group_id = _check_id(group_id, "group_id")
        self._usable()
        self._now()
        group = self._groups.get(group_id)
        held = self._of(group_id)
        if group is None or not held:
            return False  # unknown, or an empty paused group
        head = held[0]
        if head["locked_by"] not in (None, PARKED):  # a live lease (_now() dropped the expired ones)
            return False
        self._leave(head)  # a park ends with it; an open delivery stops being current
        group["buried"] = False
        group["reason"] = None
        self._forget_if_done(group_id)
        return True

    def peek(self, group_id: str, max_count: int = 1) -> List[Message]:
        """The group's oldest ``max_count`` messages, head first, whatever
        their state; ``[]`` for an unknown group.  Reads no clock."""
        group_id = _check_id(group_id, "group_id")
        max_count = _check_count(max_count)
        self._usable()
        return [Message(m["seq"], m["event"], m["attempt"], m["due"], m["key"]) for m in self._of(group_id)[:max_count]]

    # -- Part 5: retry -----------------------------------------------------------------

    def retry(self, group_id: str) -> bool:
        """The operator's "run it again from scratch": reads the clock and
        applies expiry (as ``skip``); ``False`` for an unknown or empty group
        or a head under a live lease; else the head's attempt count goes back
        to 0, a bury is lifted, a park ended, an expired lease's delivery
        closed (a pause, a schedule and the round-robin place stay)."""
        group_id = _check_id(group_id, "group_id")
        self._usable()
        self._now()
        group = self._groups.get(group_id)
        held = self._of(group_id)
        if group is None or not held:
            return False
        head = held[0]
        if head["locked_by"] not in (None, PARKED):  # a live lease (_now() dropped the expired ones)
            return False
        head["attempt"] = 0
        head["locked_by"] = None  # a park ends
        head["lock_expiry"] = 0.0
        head["delivery"] = None  # an expired lease stops being current
        group["buried"] = False
        group["reason"] = None
        return True

    # -- Part 2: batches -----------------------------------------------------------

    def publish_many(self, items: Iterable[Any], *, delay: float = 0.0) -> List[int]:
        """All items validated first, then ``delay``; then published in
        order, as one by one at one ``now`` (read if ``delay > 0`` or an item
        has a key and ``dedup_window > 0``; not for an empty batch).  An item
        whose key is held, by an earlier item too, gets the holder's seq."""
        checked = [_check_item(item) for item in list(items)]
        delay = _check_duration(delay, "delay")
        self._usable()
        if not checked:
            return []
        now = None
        if delay > 0 or (self._window > 0 and any(key is not None for _, _, _, key in checked)):
            now = self._use(self._read_clock())
        return [self._publish(group_id, event, priority, delay, key, now) for group_id, event, priority, key in checked]

    def claim_many(
        self, worker_id: str, visibility: float, max_count: int, min_priority: int = 0
    ) -> List[ReferenceLease]:
        """``max_count`` successive claims at one ``now``, up to the first None."""
        worker_id = _check_worker(worker_id)
        visibility = _check_duration(visibility, "visibility")
        max_count = _check_count(max_count)
        min_priority = _check_priority(min_priority, "min_priority")
        self._usable()
        now = self._now()  # read even for max_count == 0
        leases: List[ReferenceLease] = []
        while len(leases) < max_count:
            lease = self._claim(worker_id, visibility, min_priority, now)
            if lease is None:
                break
            leases.append(lease)
        return leases

    def ack_many(self, leases: Iterable[Any]) -> List[Any]:
        """Type-check all, then ack the current ones in order; return the rest."""
        batch = [self._check_lease(lease) for lease in list(leases)]
        self._usable()
        lost: List[Any] = []
        for lease in batch:
            m = self._current(lease)
            if m is None:
                lost.append(lease)
            else:
                self._ack(m)
        return lost

    # -- ack_and_claim: a job's ack and the next claim in one call ----------------------

    def ack_and_claim(
        self, lease: Any, worker_id: str, visibility: float, min_priority: int = 0
    ) -> Optional[ReferenceLease]:
        """``ack(lease)`` then a non-waiting ``claim``, literally, as one
        operation: every argument checked first (the lease's type as ``ack``
        checks it, the rest as ``claim`` does), the clock read once, then a
        lease that is not current raises ``LeaseLost`` having changed
        nothing; else the ack, then the claim at that same reading."""
        lease = self._check_lease(lease)
        worker_id = _check_worker(worker_id)
        visibility = _check_duration(visibility, "visibility")
        min_priority = _check_priority(min_priority, "min_priority")
        self._usable()
        reading = self._read_clock()
        m = self._current(lease)
        if m is None:
            raise self._lost(lease)  # nothing acked, no time used, no expiry applied
        self._ack(m)
        now = self._expire(reading)
        return self._claim(worker_id, visibility, min_priority, now)

    def __repr__(self) -> str:
        return f"<ReferenceTransport messages={len(self._messages)} groups={len(self._groups)}>"
