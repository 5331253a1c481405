"""The referee: a small, literal model of the seed's InMemoryTransport.

This is *not* an implementation to ship.  It is the seed note's algorithm
(``seed/000_a670dcc8f940ceb3.txt``) written as plainly as possible -- a list
of message dicts, sorted on every claim -- with exactly the differences that
``SPEC.md`` names and the choices of ``docs/decisions.md``:

* round-robin by the *order of claims* (a claim counter) instead of the
  ``last_claimed_at`` timestamp; never-claimed groups first (key 0), in the
  order of their oldest message (the ``seq`` tie-break of the sort);
* fencing: each message counts its deliveries (``attempt``) and knows whether
  the current delivery is still open; ``ack``/``nack``/``extend`` with a lease
  that is not current raise ``LeaseLost`` and change nothing;
* ``extend``, ``stats``, ``len``, ``close`` and the context manager;
* the SPEC's bad-input table, validated in signature order before the clock
  is read, before anything changes;
* expiry applied (permanently) by the operations that read ``now`` for it:
  ``claim`` and ``stats``;
* the transport's time never runs backwards: an operation that reads the
  clock acts at ``max(clock(), latest time used)``, and one that raises
  leaves that time alone.

It was written from the SPEC and the decisions, not from either transport,
so that the differential tests have an independent referee.  Every claim
costs O(N log N) on purpose: the sort *is* the specification.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

from leasequeue._errors import LeaseLost

PARKED = "__parked__"  # the seed's park sentinel in ``locked_by``
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class RefLease(NamedTuple):
    """A lease as the referee issues it (``owner`` is the issuing referee)."""

    seq: int
    group_id: str
    event: Any
    worker_id: str
    expires_at: float
    attempt: int
    owner: Any = None  # a forged lease has no owner and is never current


class RefStats(NamedTuple):
    """The referee's ``stats()``; compared field by field with the real one."""

    messages: int
    groups: int
    leased: int
    parked: int
    paused: int = 0


# -- argument checks: the SPEC's bad-input table, in decisions.md's words ----


def check_id(value: Any) -> str:
    """``group_id``/``worker_id``: a ``str``; a subclass becomes an exact str."""
    if not isinstance(value, str):
        raise TypeError("id must be a str")
    return str.__getitem__(value, slice(None))


def check_worker_id(value: Any) -> str:
    worker_id = check_id(value)
    if worker_id == PARKED:
        raise ValueError("worker_id is the park sentinel")
    return worker_id


def check_priority(value: Any) -> int:
    """``priority``/``min_priority``: an int (not bool) in the signed 64-bit range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("priority must be an int")
    if not INT64_MIN <= value <= INT64_MAX:
        raise OverflowError("priority outside the signed 64-bit range")
    return int(value)


def check_duration(value: Any) -> float:
    """``visibility``/``delay``: int or float (not bool), not NaN, not negative."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("duration must be an int or float")
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float: +inf (or -inf)
        seconds = math.inf if value > 0 else -math.inf
    if math.isnan(seconds) or seconds < 0:
        raise ValueError("duration must be >= 0 and not NaN")
    return seconds


def check_clock_value(value: Any) -> float:
    """What a clock returned: int or float (not bool), finite (not NaN/inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("clock() must return a number")
    try:
        now = float(value)
    except OverflowError:  # an int beyond float range counts as infinite
        raise ValueError("clock() returned an infinite time") from None
    if not math.isfinite(now):
        raise ValueError("clock() returned NaN or an infinite time")
    return now


class Referee:
    """The seed's algorithm, literally, with the SPEC's differences."""

    def __init__(self, clock: Callable[[], float]) -> None:
        if not callable(clock):
            raise TypeError("clock must be callable")
        self._clock = clock
        self._messages: list[dict[str, Any]] = []
        self._groups: dict[str, dict[str, Any]] = {}
        self._seq = 0
        self._claims = 0  # the round-robin key: claim order, not a timestamp
        self._latest = -math.inf  # the transport's time never runs back (decisions.md)

    def _now(self) -> float:
        return check_clock_value(self._clock())

    def _use(self, now: float) -> float:
        """The time an operation acts at: never before one already used."""
        self._latest = max(self._latest, now)
        return self._latest

    # -- the seed's operations ------------------------------------------------

    def publish(self, group_id: Any, event: Any, priority: Any = 0) -> int:
        group_id = check_id(group_id)
        priority = check_priority(priority)
        self._seq += 1
        self._messages.append(
            {
                "seq": self._seq,
                "group_id": group_id,
                "event": event,
                "locked_by": None,
                "lock_expiry": 0.0,
                "attempt": 0,  # deliveries so far
                "open": False,  # is the latest delivery still open?
            }
        )
        # setdefault: the priority is set on first publish only
        self._groups.setdefault(
            group_id, {"claim_order": 0, "last_claimed_at": 0.0, "priority": priority}
        )
        return self._seq

    def _expire(self, now: float) -> None:
        """Expiry is permanent once observed (decisions.md)."""
        for m in self._messages:
            if m["locked_by"] is not None and m["lock_expiry"] < now:
                m["locked_by"] = None
                m["lock_expiry"] = 0.0
                # ``open`` stays: the lease is still current until a re-claim

    def claim(self, worker_id: Any, visibility: Any, min_priority: Any = 0) -> RefLease | None:
        worker_id = check_worker_id(worker_id)
        visibility = check_duration(visibility)
        min_priority = check_priority(min_priority)
        now = self._use(self._now())
        self._expire(now)
        # after _expire every remaining lock has lock_expiry >= now: in flight
        in_flight = {m["group_id"] for m in self._messages if m["locked_by"] is not None}
        order = sorted(
            self._messages,
            key=lambda m: (self._groups[m["group_id"]]["claim_order"], m["seq"]),
        )
        for m in order:
            available = m["locked_by"] is None
            if not available or m["group_id"] in in_flight:
                continue
            group = self._groups[m["group_id"]]
            if group["priority"] < min_priority:
                continue
            m["locked_by"] = worker_id
            m["lock_expiry"] = now + visibility
            m["attempt"] += 1
            m["open"] = True
            self._claims += 1
            group["claim_order"] = self._claims  # round-robin: to the back
            group["last_claimed_at"] = now
            return RefLease(
                m["seq"], m["group_id"], m["event"], worker_id, m["lock_expiry"], m["attempt"], self
            )
        return None

    def _current(self, lease: RefLease) -> dict[str, Any]:
        """The lease's message if the lease is current, else ``LeaseLost``."""
        if lease.owner is not self:
            raise LeaseLost("lease not issued by this transport")
        for m in self._messages:
            if m["seq"] == lease.seq:
                if m["attempt"] == lease.attempt and m["open"]:
                    return m
                break
        raise LeaseLost("lease is not current")

    @staticmethod
    def _check_lease(lease: Any) -> RefLease:
        if not isinstance(lease, RefLease):
            raise TypeError("not a Lease")
        return lease

    def ack(self, lease: Any) -> None:
        lease = self._check_lease(lease)
        m = self._current(lease)
        self._messages.remove(m)
        if not any(x["group_id"] == m["group_id"] for x in self._messages):
            del self._groups[m["group_id"]]  # forgotten: priority and position go

    def nack(self, lease: Any, delay: Any = 0.0) -> None:
        lease = self._check_lease(lease)
        delay = check_duration(delay)
        now = self._now() if delay > 0 else None
        m = self._current(lease)
        if now is not None:
            now = self._use(now)
            m["locked_by"] = PARKED
            m["lock_expiry"] = now + delay
        else:
            m["locked_by"] = None
            m["lock_expiry"] = 0.0
        m["open"] = False  # the group keeps its claim_order

    def extend(self, lease: Any, visibility: Any) -> RefLease:
        lease = self._check_lease(lease)
        visibility = check_duration(visibility)
        now = self._now()
        m = self._current(lease)
        now = self._use(now)
        m["locked_by"] = lease.worker_id  # re-locks even if its time ran out
        m["lock_expiry"] = now + visibility
        return lease._replace(expires_at=m["lock_expiry"])

    def stats(self) -> RefStats:
        now = self._use(self._now())
        self._expire(now)
        return RefStats(
            messages=len(self._messages),
            groups=len(self._groups),
            leased=sum(1 for m in self._messages if m["locked_by"] not in (None, PARKED)),
            parked=sum(1 for m in self._messages if m["locked_by"] == PARKED),
        )

    def __len__(self) -> int:
        return len(self._messages)

    def close(self) -> None:
        pass

    def __enter__(self) -> Referee:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- small tools shared by the tests -----------------------------------------


class ScriptedClock:
    """A manual clock that can also misbehave on demand.

    ``clock()`` returns ``now``; with ``bad`` set it instead raises ``bad``
    (an exception instance) or returns it (any other value, e.g. NaN or a
    str).  ``reads`` counts the calls, so tests can check which operations
    read the clock.
    """

    _UNSET: Any = object()

    def __init__(self, start: float = 1000.0) -> None:
        self.now = float(start)
        self.bad: Any = self._UNSET
        self.reads = 0

    def __call__(self) -> Any:
        self.reads += 1
        if self.bad is not self._UNSET:
            if isinstance(self.bad, BaseException):
                raise self.bad
            return self.bad
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now

    def behave(self) -> None:
        self.bad = self._UNSET


def lease_key(lease: Any) -> Any:
    """A lease as comparable data: every field, the event by identity, and
    the exact types of the fields (an implementation must not leak a str
    subclass or an int where a float belongs)."""
    if lease is None:
        return None
    return (
        lease.seq,
        lease.group_id,
        id(lease.event),
        lease.worker_id,
        lease.expires_at,
        lease.attempt,
        type(lease.seq).__name__,
        type(lease.group_id).__name__,
        type(lease.worker_id).__name__,
        type(lease.expires_at).__name__,
        type(lease.attempt).__name__,
    )


def fingerprint(transport: Any, clock: Any) -> list[Any]:
    """Everything observable about a transport, found by using it up.

    ``len``/``stats`` now; every claim that succeeds now (which groups are
    eligible, in which order, with which attempt); then, far in the future
    with all those leases acked, the drain order of everything left.
    Two transports with the same history give the same fingerprint.
    """
    out: list[Any] = [len(transport), tuple(transport.stats())]
    held = []
    while (lease := transport.claim("probe", math.inf, INT64_MIN)) is not None:
        out.append(lease_key(lease))
        held.append(lease)
    for lease in held:
        transport.ack(lease)
    out.append(tuple(transport.stats()))
    clock.now += 1e9
    while (lease := transport.claim("drain", 1.0, INT64_MIN)) is not None:
        out.append(lease_key(lease))
        transport.ack(lease)
    out.append((len(transport), tuple(transport.stats())))
    return out
