"""Random operations for the differential test, aimed at where bugs hide.

``RandomOps`` yields operations one at a time and looks at the harness in
between (which leases exist, what the last claim returned), so it can act on
real leases.  A run is a sequence of *phases*:

* ``fill`` / ``drain`` / ``churn`` / ``time``: the everyday mix with
  different weights, so queues grow, empty out and groups are forgotten;
* ``flush``: every lease runs out, then the backlog is claimed and acked;
* ``wave``: 70-140 groups claimed with a short lease, expired together and
  seen expired, then extended, acked or parked one by one: a transport that
  keeps lazily deleted heap entries builds up many stale ones (and compacts);
* ``heartbeat``: one lease extended a hundred times (stale expiry entries);
* ``edge``: the clock set *exactly* on a lease's or park's ``expires_at``
  (still live: expiry is ``expires_at < now``), a claim or stats there, then
  one float step later;
* ``control`` / ``batch``: Part 2's control plane and batches, when driven;
* ``quarantine``: Part 4's ``bury`` / ``skip`` / ``peek`` (with ``resume``,
  ``pause`` and ``group`` around them), when driven: poison messages buried
  and resumed or skipped, heads skipped in every state.

``ack_and_claim``, when driven, comes in every phase but the four special
ones: alone (a current, stale, forged or foreign lease, any floor), or as a
worker's loop (a claim, then each lease acked with the next claim while
there is one); its bad arguments and clock faults are among the others.

About half of the runs use one priority level only (``single_level``), the
case most users are in and the one a transport may optimise separately.
Bad input of every row of the SPEC's table, forged and foreign leases, a
misbehaving clock and "observe an expiry, then turn the clock back" steps
are mixed in everywhere.
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any, Deque, FrozenSet, Iterator, List, NamedTuple, Optional, Tuple

from ._harness import Harness
from ._ops import FOREIGN, OMIT, Batch, ClockFault, Forged, LeaseRef, Name, Op, Seconds
from ._reference import INT64_MAX, INT64_MIN

__all__ = ["Capabilities", "RandomOps"]

NAN = math.nan
INF = math.inf

#: methods of Part 2 that the generator may drive, by group
CONTROL_PLANE = ("pause", "resume", "purge", "set_priority", "group", "groups")
BATCHES = ("publish_many", "claim_many", "ack_many")
#: methods of Part 4's quarantine; a transport without them runs exactly the
#: streams it ran before they existed (nothing of them draws on the seed)
QUARANTINE = ("bury", "skip", "peek")
#: a job's ack and the next claim in one call; likewise, a transport without
#: it runs exactly the streams it ran before it existed
ACK_AND_CLAIM = ("ack_and_claim",)


class Capabilities(NamedTuple):
    """What the transports under test promise (what is driven)."""

    #: Part 2 and 4 methods to drive (a subset of CONTROL_PLANE + BATCHES + QUARANTINE + ACK_AND_CLAIM)
    methods: FrozenSet[str] = frozenset()
    #: ``claim(timeout=...)`` and the ``closed`` attribute
    waiting: bool = False
    #: hand-built leases (never current) and leases of another instance
    forged: bool = True
    foreign: bool = True
    #: a clock that raises or returns garbage
    clock_faults: bool = True
    #: calls work after ``close()``; False: ``close()`` comes among the last
    #: operations, and every call after it but a waiting claim must raise
    usable_after_close: bool = True
    #: Part 5: ``publish(delay=)`` / ``publish_many(delay=)`` (later),
    #: ``publish(key=)`` and 4-tuple items (once), ``release`` and ``retry``
    later: bool = False
    once: bool = False
    release: bool = False
    #: the ``dedup_window`` both sides were built with (0.0: the default)
    dedup_window: float = 0.0


WORKERS = ["w1", "w2", "w3", Name("w2"), ""]
PRIORITIES_MANY = [OMIT, 0, 0, 1, 2, -1, INT64_MAX, INT64_MIN]
FLOORS_MANY = [OMIT, 0, 1, 2, -1, INT64_MIN, INT64_MAX]
PRIORITIES_ONE = [OMIT, 0, 0]
#: floors above the only level see expiries without claiming anything
FLOORS_ONE = [OMIT, OMIT, 0, -1, INT64_MIN, 1, INT64_MAX]
VISIBILITIES = [(0, 2), (-0.0, 1), (1, 10), (2.5, 10), (5, 20), (10, 20), (30, 10), (INF, 0.5), (10**400, 0.3)]
DELAYS = [(OMIT, 20), (0, 10), (-0.0, 2), (1, 10), (3.5, 10), (10, 10), (INF, 0.3)]
STEPS = [0, 0.5, 1, 2.5, 5, 10, 11, 31, 100, 1e6, -1, -5, -40]
TIMEOUTS = [(0, 3), (0.0, 1), (-0.0, 1), (0.001, 3), (None, 1), (INF, 0.5), (5, 0.5),
            (-1, 0.5), (NAN, 0.5), (True, 0.5), ("1", 0.5)]
#: what a misbehaving clock does: errors, and valid surprises (an int, a float
#: subclass, a jump ahead, a step back)
FAULTS = [ClockFault, NAN, "noon", True, INF, -INF, None, 10**400, 1500, Seconds(1234.5), 2**40, -5.0]

L = LeaseRef(-1)  # placeholder in BAD_CALLS: "a recent lease"

#: (needs, method, args, kwargs): each breaks one row of the bad-input table
#: (or of Part 2's rules); ``needs`` is None (Part 1), "waiting" or a method
BAD_CALLS: List[Tuple[Optional[str], str, Tuple[Any, ...], Tuple[Tuple[str, Any], ...]]] = [
    (None, "publish", (7, "e"), ()),
    (None, "publish", ("a", "e", 1.5), ()),
    (None, "publish", ("a", "e", True), ()),
    (None, "publish", ("a", "e", 2**63), ()),
    (None, "publish", ("fresh", "e", INT64_MIN - 1), ()),
    (None, "publish", (b"a", "e"), ()),
    (None, "claim", (None, 1), ()),
    (None, "claim", ("__parked__", 1), ()),
    (None, "claim", (Name("__parked__"), 1), ()),
    (None, "claim", ("w1", "1"), ()),
    (None, "claim", ("w1", False), ()),
    (None, "claim", ("w1", -1), ()),
    (None, "claim", ("w1", NAN), ()),
    (None, "claim", ("w1", -INF), ()),
    (None, "claim", ("w1", -(10**400)), ()),
    (None, "claim", ("w1", 1, 0.0), ()),
    (None, "claim", ("w1", 1, 2**64), ()),
    (None, "claim", ("w1", -1, "x"), ()),
    (None, "ack", (None,), ()),
    (None, "ack", ((1, "a"),), ()),
    (None, "nack", ("lease",), ()),
    (None, "nack", (L, -0.5), ()),
    (None, "nack", (L, NAN), ()),
    (None, "nack", (L, True), ()),
    (None, "nack", (L, "1"), ()),
    (None, "nack", (L, -(10**400)), ()),
    (None, "extend", (L, NAN), ()),
    (None, "extend", (L, -3), ()),
    (None, "extend", (L, None), ()),
    (None, "extend", (0, 5), ()),
    ("waiting", "claim", ("w1", 1), (("timeout", -1),)),
    ("waiting", "claim", ("w1", 1), (("timeout", NAN),)),
    ("waiting", "claim", ("w1", 1), (("timeout", -INF),)),
    ("waiting", "claim", ("w1", 1), (("timeout", True),)),
    ("waiting", "claim", ("w1", 1), (("timeout", "1"),)),
    ("waiting", "claim", ("w1", 1, "x"), (("timeout", -1),)),
    ("waiting", "claim", ("w1", NAN, 0), (("timeout", "x"),)),
    ("pause", "pause", (5,), ()),
    ("pause", "pause", (None,), ()),
    ("resume", "resume", (b"a",), ()),
    ("purge", "purge", (1.0,), ()),
    ("set_priority", "set_priority", (3, 1), ()),
    ("set_priority", "set_priority", ("g0", 1.5), ()),
    ("set_priority", "set_priority", ("g0", 2**63), ()),
    ("set_priority", "set_priority", ("g0", True), ()),
    ("set_priority", "set_priority", ("zz", "x"), ()),
    ("group", "group", (None,), ()),
    ("publish_many", "publish_many", (5,), ()),
    ("publish_many", "publish_many", (None,), ()),
    ("publish_many", "publish_many", ("ab",), ()),
    ("publish_many", "publish_many", (Batch("list", (("g0",),)),), ()),
    ("publish_many", "publish_many", (Batch("list", ((),)),), ()),
    ("publish_many", "publish_many", (Batch("list", (("g0", "e", 0, 1),)),), ()),
    ("publish_many", "publish_many", (Batch("list", (["g0", "e"],)),), ()),
    ("publish_many", "publish_many", (Batch("list", (("g0", "e"), (7, "e"))),), ()),
    ("publish_many", "publish_many", (Batch("iter", (("g0", "e"), ("g1", "e", 2**63))),), ()),
    ("publish_many", "publish_many", (Batch("list", (("g0", "e", True),)),), ()),
    ("claim_many", "claim_many", ("w1", 1, -1), ()),
    ("claim_many", "claim_many", ("w1", 1, 1.0), ()),
    ("claim_many", "claim_many", ("w1", 1, True), ()),
    ("claim_many", "claim_many", ("w1", 1, None), ()),
    ("claim_many", "claim_many", ("__parked__", 1, 1), ()),
    ("claim_many", "claim_many", ("w1", -1, 1), ()),
    ("claim_many", "claim_many", ("w1", 1, 1, 2**63), ()),
    ("claim_many", "claim_many", ("w1", 1, -1, "x"), ()),
    ("ack_many", "ack_many", (None,), ()),
    ("ack_many", "ack_many", (5,), ()),
    ("ack_many", "ack_many", (Batch("list", (L, None)),), ()),
    ("ack_many", "ack_many", (Batch("list", (L, "x")),), ()),
    ("ack_many", "ack_many", (Batch("iter", (L, (1, "a"))),), ()),
    ("bury", "bury", ("lease",), ()),
    ("bury", "bury", (None, 5), ()),
    ("bury", "bury", (L, 5), ()),
    ("bury", "bury", (L, None), ()),
    ("bury", "bury", (L, b"why"), ()),
    ("bury", "bury", (L,), (("reason", ["x"]),)),
    ("skip", "skip", (5,), ()),
    ("skip", "skip", (None,), ()),
    ("skip", "skip", (b"g0",), ()),
    ("peek", "peek", (None,), ()),
    ("peek", "peek", (7, -1), ()),
    ("peek", "peek", ("g0", -1), ()),
    ("peek", "peek", ("g0", True), ()),
    ("peek", "peek", ("g0", False), ()),
    ("peek", "peek", ("g0", 1.0), ()),
    ("peek", "peek", ("g0", "2"), ()),
    ("peek", "peek", ("g0", None), ()),
    ("peek", "peek", ("g1",), (("max_count", -(2**70)),)),
    # ack_and_claim: the lease's type as ack checks it, then claim's three, in signature order
    ("ack_and_claim", "ack_and_claim", (None, "w1", 1), ()),
    ("ack_and_claim", "ack_and_claim", ((1, "a"), "w1", 1), ()),
    ("ack_and_claim", "ack_and_claim", ("lease", "__parked__", -1, "x"), ()),
    ("ack_and_claim", "ack_and_claim", (L, None, 1), ()),
    ("ack_and_claim", "ack_and_claim", (L, 5, -1), ()),
    ("ack_and_claim", "ack_and_claim", (L, "__parked__", 1), ()),
    ("ack_and_claim", "ack_and_claim", (L, Name("__parked__"), 1), ()),
    ("ack_and_claim", "ack_and_claim", (L, "w1", "1"), ()),
    ("ack_and_claim", "ack_and_claim", (L, "w1", False), ()),
    ("ack_and_claim", "ack_and_claim", (L, "w1", -1), ()),
    ("ack_and_claim", "ack_and_claim", (L, "w1", NAN), ()),
    ("ack_and_claim", "ack_and_claim", (L, "w1", -(10**400)), ()),
    ("ack_and_claim", "ack_and_claim", (L, "w1", -1, "x"), ()),
    ("ack_and_claim", "ack_and_claim", (L, "w1", 1, 0.0), ()),
    ("ack_and_claim", "ack_and_claim", (L, "w1", 1, True), ()),
    ("ack_and_claim", "ack_and_claim", (L, "w1", 1, 2**64), ()),
    ("ack_and_claim", "ack_and_claim", (L, "w1", 1), (("min_priority", INT64_MIN - 1),)),
    ("ack_and_claim", "ack_and_claim", (L, "w1", 1), (("min_priority", "0"),)),
]

#: reasons a bury gives (a str subclass must come back as an exact str)
REASONS = [OMIT, "", "boom", "TypeError: attempt 3", Name("poison")]
#: how many messages a peek asks for
PEEK_COUNTS = [OMIT, OMIT, 0, 1, 2, 3, 10, 2**70]


def call(method: str, *args: Any, **kwargs: Any) -> Op:
    """A ``call`` operation (trailing ``OMIT`` arguments are left out)."""
    return ("call", method, args, tuple(kwargs.items()))


class RandomOps:
    """A seeded stream of operations for ``harness`` (see module doc).

    Iterate it and apply each operation to the harness before asking for the
    next: the generator reads the harness between operations.
    """

    def __init__(self, harness: Harness, seed: int, count: int, *, caps: Capabilities,
                 groups: Optional[int] = None, single_level: Optional[bool] = None) -> None:
        self.h = harness
        self.rng = rng = random.Random(seed)
        self.count = count
        self.caps = caps
        if groups is None:
            groups = rng.choice([3, 5, 8, 20, 50, 300])
        if single_level is None:
            single_level = rng.random() < 0.5
        self.single_level = single_level
        self.names: List[str] = [f"g{i}" for i in range(groups)] + [Name("g0"), Name("g1")]
        self.priorities = PRIORITIES_ONE if single_level else PRIORITIES_MANY
        self.floors = FLOORS_ONE if single_level else FLOORS_MANY
        self.refs: Deque[LeaseRef] = deque(maxlen=64)
        self.parks: Deque[float] = deque(maxlen=16)  # estimated ends of recent parks
        self.events = 0
        self.emitted = 0
        self.close_at = rng.randrange(count) if count and rng.random() < 0.3 else -1
        if self.close_at >= 0 and not caps.usable_after_close:
            self.close_at = max(self.close_at, count - 40)  # a few calls on the closed transport
        self.bad = [b for b in BAD_CALLS if b[0] is None or b[0] in caps.methods
                    or (b[0] == "waiting" and caps.waiting)]

    # -- helpers ---------------------------------------------------------------

    def pick(self, pool: List[Tuple[Any, float]]) -> Any:
        return self.rng.choices([v for v, _ in pool], [w for _, w in pool])[0]

    def event(self) -> List[Any]:
        """A fresh event: a list (unhashable, has an identity, prints as Python)."""
        self.events += 1
        return ["e", self.events]

    def lease(self) -> LeaseRef:
        """Mostly one of the newest leases (likely current), else any recent one."""
        refs = self.refs
        if self.rng.random() < 0.7:
            return refs[-self.rng.randint(1, min(4, len(refs)))]
        return refs[self.rng.randrange(len(refs))]

    def group(self) -> str:
        return self.rng.choice(self.names) if self.rng.random() < 0.95 else "zz"  # zz: unknown

    def now(self) -> float:
        return self.h.sides[0].clock.now

    def _after(self, op: Op) -> None:
        """Bookkeeping once ``op`` has been applied."""
        self.emitted += 1
        uid = self.h.next_uid - 1
        result = self.h.results.get(uid)
        if result is not None:
            if isinstance(result[0], list):
                self.refs.extend(LeaseRef(uid, k) for k in range(len(result[0])))
            else:
                self.refs.append(LeaseRef(uid))
        if op[0] == "call" and op[1] == "nack" and len(op[2]) > 1 and self.h.last is None:
            delay = op[2][1]
            if isinstance(delay, (int, float)) and 0 < delay < INF:
                self.parks.append(self.now() + delay)

    # -- single operations ---------------------------------------------------------

    def publish(self) -> Op:
        priority = self.rng.choice(self.priorities)
        if priority is OMIT:
            return call("publish", self.rng.choice(self.names), self.event())
        if self.rng.random() < 0.2:
            return call("publish", self.rng.choice(self.names), self.event(), priority=priority)
        return call("publish", self.rng.choice(self.names), self.event(), priority)

    def claim(self, worker: Any = None, visibility: Any = None) -> Op:
        worker = self.rng.choice(WORKERS) if worker is None else worker
        visibility = self.pick(VISIBILITIES) if visibility is None else visibility
        floor = self.rng.choice(self.floors)
        args: Tuple[Any, ...] = (worker, visibility) if floor is OMIT else (worker, visibility, floor)
        if self.caps.waiting and self.rng.random() < 0.12:
            return ("call", "claim", args, (("timeout", self.pick(TIMEOUTS)),))
        return ("call", "claim", args, ())

    def observe(self) -> Op:
        """Something that reads the clock (and so applies expiry)."""
        choices = [call("stats"), call("claim", "w3", 1, INT64_MAX), self.claim()]
        if "group" in self.caps.methods:
            choices.append(call("group", self.group()))
        if "groups" in self.caps.methods:
            choices.append(call("groups"))
        return self.rng.choice(choices)

    def bad_call(self) -> Op:
        _, method, args, kwargs = self.rng.choice(self.bad)
        if method == "publish_many" and not self.caps.once:
            # a 4-tuple item carries a key since Part 5: without it, the same
            # draw makes a 5-tuple (a ValueError before and after Part 5)
            args = tuple(Batch(a.form, tuple(x + (None,) if isinstance(x, tuple) and len(x) == 4 else x
                                             for x in a.items)) if isinstance(a, Batch) else a for a in args)
        if L in args or any(isinstance(a, Batch) and L in a.items for a in args):
            if not self.refs:
                return call("stats")
            ref = self.lease()
            args = tuple(Batch(a.form, tuple(ref if x == L else x for x in a.items)) if isinstance(a, Batch)
                         else ref if a == L else a for a in args)
        return ("call", method, args, kwargs)

    def fault(self) -> Op:
        inner = [self.claim(), call("stats"), call("publish", "g0", self.event())]
        if self.refs:
            ref = self.lease()
            inner += [call("extend", ref, 3), call("nack", ref, 3), call("nack", ref, 0), call("ack", ref)]
        methods = self.caps.methods
        if "group" in methods:
            inner.append(call("group", self.group()))
        if "groups" in methods:
            inner.append(call("groups"))
        if "claim_many" in methods:
            inner.append(call("claim_many", "w1", 5, self.rng.choice([0, 2])))
        if "pause" in methods:
            inner.append(call("pause", self.group()))
        if "skip" in methods:  # reads the clock
            inner.append(call("skip", self.group()))
        if "peek" in methods:  # reads no clock
            inner.append(call("peek", self.group(), 3))
        if "bury" in methods and self.refs:  # reads no clock
            inner.append(call("bury", self.lease(), "x"))
        if "resume" in methods:
            inner.append(call("resume", self.group()))
        if "publish_many" in methods:
            inner.append(call("publish_many", Batch("list", (("g1", self.event()),))))
        if "ack_many" in methods and self.refs:
            inner.append(call("ack_many", Batch("list", (self.lease(),))))
        if "ack_and_claim" in methods and self.refs:  # reads the clock before the currency
            inner.append(call("ack_and_claim", self.lease(), "w1", 3, self.rng.choice([0, INT64_MIN])))
        return ("fault", self.rng.choice(FAULTS), self.rng.choice(inner))

    def misc(self) -> Iterator[Op]:
        rng = self.rng
        roll = rng.random()
        if roll < 0.1:
            yield from self._edge()
        elif roll < 0.2:  # an expiry seen (or not), then the clock turned back
            yield ("advance", rng.choice([2, 6, 11, 40]))
            yield rng.choice([self.observe(), ("len",)])
            yield ("advance", -rng.choice([1, 5, 10, 39]))
        elif roll < 0.35:
            yield call("stats")
        elif roll < 0.45:
            yield ("len",)
        elif roll < 0.5 and self.caps.waiting:
            yield ("attr", "closed")
        elif roll < 0.8 and self.caps.clock_faults:
            yield self.fault()
        elif self.refs and self.caps.forged and roll < 0.9:
            yield self._fenced(Forged(self.lease()))
        elif self.caps.foreign:
            yield self._fenced(FOREIGN)
        else:
            yield call("stats")

    def _fenced(self, lease: Any) -> Op:
        methods = ["ack", "nack", "extend"]
        if "ack_and_claim" in self.caps.methods:
            methods.append("ack_and_claim")
        method = self.rng.choice(methods)
        if method == "ack":
            return call("ack", lease)
        if method == "ack_and_claim":
            return call("ack_and_claim", lease, "w2", self.rng.choice([0, 5]))
        return call(method, lease, self.rng.choice([0, 5]))

    def control(self) -> Op:
        methods = [m for m in CONTROL_PLANE if m in self.caps.methods]
        method = self.rng.choices(methods, [{"pause": 3, "resume": 4, "purge": 1, "set_priority": 2,
                                             "group": 3, "groups": 2}[m] for m in methods])[0]
        if method == "groups":
            return call("groups")
        if method == "set_priority":
            priority = self.rng.choice([p for p in self.priorities if p is not OMIT])
            return call("set_priority", self.group(), priority)
        return call(method, self.group())

    def quarantine(self) -> Op:
        """One of bury / skip / peek, or a resume to lift a bury."""
        rng = self.rng
        methods = [m for m in QUARANTINE if m in self.caps.methods]
        weights = {"bury": 4, "skip": 3, "peek": 3}
        if "resume" in self.caps.methods:
            methods.append("resume")
            weights["resume"] = 2
        method = rng.choices(methods, [weights[m] for m in methods])[0]
        if method == "bury":
            if not self.refs:
                return self.claim()
            reason = rng.choice(REASONS)
            if reason is OMIT:
                return call("bury", self.lease())
            if rng.random() < 0.3:
                return call("bury", self.lease(), reason=reason)
            return call("bury", self.lease(), reason)
        if method == "peek":
            count = rng.choice(PEEK_COUNTS)
            if count is OMIT:
                return call("peek", self.group())
            if rng.random() < 0.3:
                return call("peek", self.group(), max_count=count)
            return call("peek", self.group(), count)
        return call(method, self.group())

    def batch(self) -> Op:
        rng = self.rng
        methods = [m for m in BATCHES if m in self.caps.methods]
        method = rng.choice(methods)
        if method == "publish_many":
            items = []
            for _ in range(rng.choice([0, 1, 2, 3, 5, 8])):
                priority = rng.choice(self.priorities)
                group = rng.choice(self.names)
                items.append((group, self.event()) if priority is OMIT else (group, self.event(), priority))
            form = rng.choices(["list", "iter", "tuple"], [7, 2, 1])[0]
            return call("publish_many", Batch(form, tuple(items)))
        if method == "claim_many":
            floor = rng.choice(self.floors)
            args = (rng.choice(WORKERS), self.pick(VISIBILITIES), rng.choice([0, 1, 2, 3, 5, 8, 2**70]))
            return ("call", "claim_many", args if floor is OMIT else (*args, floor), ())
        leases: List[Any] = [self.lease() for _ in range(rng.randint(0, 4))] if self.refs else []
        if self.refs and rng.random() < 0.2:
            if leases and rng.random() < 0.5:
                leases.append(leases[0])
            elif self.caps.forged:
                leases.append(Forged(self.lease()))
        if self.caps.foreign and rng.random() < 0.1:
            leases.append(FOREIGN)
        return call("ack_many", Batch(rng.choice(["list", "list", "iter"]), tuple(leases)))

    def ack_and_claim(self, lease: Any = None) -> Op:
        """``ack_and_claim`` of ``lease`` (default: a recent lease, now and
        then a forged or foreign one), with claim's arguments drawn as for a
        claim."""
        rng = self.rng
        if lease is None:
            roll = rng.random()
            if roll < 0.06 and self.caps.forged:
                lease = Forged(self.lease())
            elif roll < 0.1 and self.caps.foreign:
                lease = FOREIGN
            else:
                lease = self.lease()
        worker = rng.choice(WORKERS)
        visibility = self.pick(VISIBILITIES)
        floor = rng.choice(self.floors)
        if floor is OMIT:
            return call("ack_and_claim", lease, worker, visibility)
        if rng.random() < 0.2:
            return call("ack_and_claim", lease, worker, visibility, min_priority=floor)
        return call("ack_and_claim", lease, worker, visibility, floor)

    def _worker_loop(self, left: int) -> Iterator[Op]:
        """A worker's loop: a claim, then each lease acked with the next
        claim, while a lease comes back (and the clock now and then moves)."""
        rng = self.rng
        yield self.claim()
        for _ in range(min(left, rng.randint(1, 25))):
            uid = self.h.next_uid - 1
            if not self.h.results.get(uid):
                return  # the last claim found nothing (or that was not a claim)
            if rng.random() < 0.15:
                yield ("advance", rng.choice(STEPS))  # the lease may run out (and be stale by the ack)
            yield self.ack_and_claim(LeaseRef(uid))

    # -- phases ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Op]:
        rng = self.rng
        left = self.count
        phases = ["fill", "drain", "churn", "churn", "time", "flush", "wave", "heartbeat", "edge", "edge"]
        if any(m in self.caps.methods for m in CONTROL_PLANE):
            # another "wave" too, so that the phase that piles up lazily
            # deleted heap entries keeps its share among the Part 2 phases
            phases += ["control", "churn", "wave"]
        if any(m in self.caps.methods for m in BATCHES):
            phases += ["batch"]
        if any(m in self.caps.methods for m in QUARANTINE):
            phases += ["quarantine", "quarantine"]
        while self.emitted < self.count:
            phase = rng.choice(phases)
            left = self.count - self.emitted
            for op in self._phase(phase, left):
                if self.emitted == self.close_at:
                    yield call("close")
                    self._after(("call", "close", (), ()))
                yield op
                self._after(op)
                if self.emitted >= self.count:
                    return

    def _phase(self, phase: str, left: int) -> Iterator[Op]:
        rng = self.rng
        if phase == "flush":  # every lease runs out, then the backlog is claimed and acked
            yield ("advance", 1e6)
            for _ in range(min(left, rng.randint(50, 4000)) // 2):
                yield call("claim", rng.choice(WORKERS), 5, INT64_MIN)
                if not self.h.results.get(self.h.next_uid - 1):
                    break
                yield call("ack", LeaseRef(self.h.next_uid - 1))
            return
        if phase == "wave":
            yield from self._wave(min(left, rng.randint(70, 140)))
            return
        if phase == "heartbeat":
            yield self.claim(visibility=rng.choice([5, 30]))
            if self.h.results.get(self.h.next_uid - 1):
                ref = LeaseRef(self.h.next_uid - 1)
                for _ in range(min(left, rng.randint(40, 150))):
                    yield call("extend", ref, rng.choice([5, 10, 30]))
                yield rng.choice([call("ack", ref), call("nack", ref), call("nack", ref, 2)])
            return
        if phase == "edge":
            yield from self._edge()
            return
        has_control = any(m in self.caps.methods for m in CONTROL_PLANE)
        has_batch = any(m in self.caps.methods for m in BATCHES)
        has_quarantine = any(m in self.caps.methods for m in QUARANTINE)
        has_ack_and_claim = "ack_and_claim" in self.caps.methods
        weights = {  # publish claim ack nack extend bad advance misc control batch quarantine ack_and_claim
            "fill": [60, 20, 5, 5, 2, 3, 2, 6, 2, 3, 2, 3],
            "drain": [5, 45, 30, 8, 4, 3, 3, 5, 2, 3, 3, 12],
            "churn": [25, 30, 20, 10, 6, 3, 2, 6, 5, 4, 4, 8],
            "time": [10, 30, 10, 10, 10, 3, 22, 6, 3, 2, 3, 6],
            "control": [20, 25, 15, 5, 3, 2, 5, 3, 25, 3, 3, 3],
            "batch": [10, 15, 10, 5, 3, 3, 5, 3, 5, 40, 2, 8],
            "quarantine": [18, 25, 10, 5, 3, 3, 6, 3, 4, 2, 30, 3],
        }[phase]
        if not has_quarantine:  # the weight goes, the draws stay those of the streams before Part 4
            weights[10] = 0
        if not has_ack_and_claim:  # likewise: a trailing zero weight changes no draw
            weights[11] = 0
        for _ in range(min(left, rng.randint(30, 1500 if phase == "fill" else 600))):
            kind = rng.choices(["publish", "claim", "ack", "nack", "extend", "bad", "advance", "misc", "control",
                                "batch", "quarantine", "ack_and_claim"], weights)[0]
            if kind in ("ack", "nack", "extend") and not self.refs:
                kind = "claim"
            if (kind == "control" and not has_control) or (kind == "batch" and not has_batch):
                kind = "publish"
            if kind == "quarantine" and not self.refs and rng.random() < 0.5:
                kind = "claim"  # a bury needs a lease: claim one first, now and then
            if kind == "publish":
                yield self.publish()
            elif kind == "claim":
                yield self.claim()
            elif kind == "ack":
                yield call("ack", self.lease())
            elif kind == "nack":
                delay = self.pick(DELAYS)
                yield call("nack", self.lease()) if delay is OMIT else call("nack", self.lease(), delay)
            elif kind == "extend":
                yield call("extend", self.lease(), self.pick(VISIBILITIES))
            elif kind == "bad":
                yield self.bad_call()
            elif kind == "advance":
                yield ("advance", rng.choice(STEPS))
            elif kind == "control":
                yield self.control()
            elif kind == "batch":
                yield self.batch()
            elif kind == "quarantine":
                yield self.quarantine()
            elif kind == "ack_and_claim":
                if self.refs and rng.random() < 0.6:
                    yield self.ack_and_claim()
                else:
                    yield from self._worker_loop(left)
            else:
                yield from self.misc()

    def _wave(self, size: int) -> Iterator[Op]:
        """Many groups claimed, expired and seen expired together, then each
        lease extended/acked/parked: lazily deleted heap entries pile up."""
        rng = self.rng
        names = [f"v{i}" for i in range(size)]
        for name in names:
            yield call("publish", name, self.event())
            if rng.random() < 0.3:
                yield call("publish", name, self.event())
        refs = []
        for _ in names:
            yield call("claim", "w1", 1, INT64_MIN)
            if self.h.results.get(self.h.next_uid - 1):
                refs.append(LeaseRef(self.h.next_uid - 1))
        yield ("advance", 2)
        yield rng.choice([call("stats"), call("claim", "w3", 1, INT64_MAX)])
        rng.shuffle(refs)
        for ref in refs:
            yield rng.choice([call("extend", ref, 30), call("ack", ref), call("nack", ref, 5),
                              call("extend", ref, 30)])
        if rng.random() < 0.5:
            yield from (self.claim() for _ in range(rng.randint(1, 10)))

    def _edge(self) -> Iterator[Op]:
        """The clock exactly on an expiry (still live), then just past it."""
        rng = self.rng
        ends: List[float] = list(self.parks)
        for ref in list(self.refs)[-8:]:
            result = self.h.results.get(ref.uid)
            if result is not None:
                lease = result[0][ref.k] if ref.k >= 0 else result[0]
                ends.append(lease.expires_at)
        ends = [e for e in ends if math.isfinite(e)]
        if not ends:
            yield ("advance", rng.choice(STEPS))
            return
        end = rng.choice(ends)
        yield ("set", end)
        yield self.observe()
        if rng.random() < 0.7:
            yield ("set", math.nextafter(end, INF) if hasattr(math, "nextafter") else end + 1e-6)
            yield self.observe()
