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

* ``later``: Part 5, when driven: delayed and keyed publishes to a few
  groups, releases and retries, and the clock set on (and just past) due
  times and the ends of dedup windows.

Part 5, when driven (``later``, ``once``, ``release`` capabilities), also
comes in every everyday phase: a publish gets a delay (0, small, ``inf``)
and/or a key from a small alphabet (so that duplicates are frequent, the
keyed publishes go to a few groups), ``publish_many`` gets 4-tuple items
and a ``delay``, ``release`` (current, stale, forged and foreign leases,
with and without a delay) and ``retry`` (of the group of a recent lease:
leased, expired, parked or buried; or any group) are drawn, and the time
model tracks due times and window ends besides parks, so that the
``edge`` steps land on them.  A transport without Part 5 runs exactly the
streams it ran before (nothing of it draws on the seed), but for one bad
``publish_many`` item that had four fields and now has five.

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

#: Part 5: how long a publish is delayed (OMIT: no delay), keys (a small
#: alphabet, so duplicates are frequent; OMIT: no key argument), and the
#: few groups keyed and delayed publishes mostly go to
PUBLISH_DELAYS: List[Tuple[Any, float]] = [(OMIT, 50), (0, 4), (-0.0, 1), (0.5, 4), (1, 8), (3.5, 8), (10, 6),
                                           (40, 3), (INF, 1), (10**400, 0.3)]
KEYS: List[Tuple[Any, float]] = [(OMIT, 30), (None, 5), ("a", 25), ("b", 15), (Name("a"), 5), ("", 3)]
FEW_GROUPS = ["g0", "g1", Name("g0")]
#: the dedup windows a run with keys draws from its seed (0: held while the
#: message is; a window comparable to the time steps; for ever)
WINDOWS = [0.0, 7.5, INF]

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
    # five fields (this was a four-field item before Part 5 gave the fourth field to a key)
    ("publish_many", "publish_many", (Batch("list", (("g0", "e", 0, 1, None),)),), ()),
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

#: Part 5's bad input (kept apart from BAD_CALLS, whose draws stay those of
#: the streams before Part 5); ``needs`` is one capability or a tuple of them
PART5_BAD_CALLS: List[Tuple[Any, str, Tuple[Any, ...], Tuple[Tuple[str, Any], ...]]] = [
    ("later", "publish", ("g0", "e"), (("delay", -1),)),
    ("later", "publish", ("g0", "e"), (("delay", NAN),)),
    ("later", "publish", ("g0", "e"), (("delay", True),)),
    ("later", "publish", ("g0", "e"), (("delay", "1"),)),
    ("later", "publish", ("g0", "e"), (("delay", None),)),
    ("later", "publish", ("g0", "e"), (("delay", -INF),)),
    ("later", "publish", ("g0", "e"), (("delay", -(10**400)),)),
    ("later", "publish", (7, "e"), (("delay", -1),)),
    ("later", "publish", ("fresh", "e", 1.5), (("delay", -1),)),
    ("later", "publish", ("g0", "e", 0, 5), ()),  # delay is keyword-only
    ("once", "publish", ("g0", "e"), (("key", 1),)),
    ("once", "publish", ("g0", "e"), (("key", b"x"),)),
    ("once", "publish", ("fresh", "e"), (("key", ["a"]),)),
    ("once", "publish", (7, "e"), (("key", 1),)),
    ("once", "publish", ("g0", "e", 2**63), (("key", 1),)),
    (("later", "once"), "publish", ("g0", "e"), (("delay", -1), ("key", 1))),
    (("later", "once"), "publish", ("g0", "e"), (("delay", "x"), ("key", "a"))),
    (("once", "publish_many"), "publish_many", (Batch("list", (("g0", "e", 0, "a"), ("g1", "e", 0, 1))),), ()),
    (("once", "publish_many"), "publish_many", (Batch("list", (("g0", "e", 0, "a", None),)),), ()),
    (("once", "publish_many"), "publish_many", (Batch("iter", (("g0", "e", 0, b"x"),)),), ()),
    (("once", "publish_many"), "publish_many", (Batch("list", (("g0", "e", 1.5, "a"),)),), ()),
    (("later", "publish_many"), "publish_many", (Batch("list", (("g0", "e"),)),), (("delay", -1),)),
    (("later", "publish_many"), "publish_many", (Batch("list", (("g0", "e"),)),), (("delay", True),)),
    (("later", "publish_many"), "publish_many", (Batch("list", ()),), (("delay", NAN),)),
    (("later", "publish_many"), "publish_many", (Batch("list", ((7, "e"),)),), (("delay", -1),)),
    (("later", "publish_many"), "publish_many", (Batch("list", (("g0", "e"),)), 5), ()),  # keyword-only
    ("release", "release", ("lease",), ()),
    ("release", "release", (None, -1), ()),
    ("release", "release", ((1, "a"),), ()),
    ("release", "release", (L, -0.5), ()),
    ("release", "release", (L, NAN), ()),
    ("release", "release", (L, True), ()),
    ("release", "release", (L, "1"), ()),
    ("release", "release", (L,), (("delay", -(10**400)),)),
    ("release", "release", (L,), (("delay", None),)),
    ("release", "retry", (5,), ()),
    ("release", "retry", (None,), ()),
    ("release", "retry", (b"g0",), ()),
]

#: reasons a bury gives (a str subclass must come back as an exact str)
REASONS = [OMIT, "", "boom", "TypeError: attempt 3", Name("poison")]
#: how many messages a peek asks for
PEEK_COUNTS = [OMIT, OMIT, 0, 1, 2, 3, 10, 2**70]


def _next_up(t: float) -> float:
    """The float just after ``t`` (one step past an expiry or a due time)."""
    return math.nextafter(t, INF) if hasattr(math, "nextafter") else t + 1e-6


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
        self.dues: Deque[float] = deque(maxlen=16)  # Part 5: due times and window ends
        self.events = 0
        self.emitted = 0
        self.close_at = rng.randrange(count) if count and rng.random() < 0.3 else -1
        if self.close_at >= 0 and not caps.usable_after_close:
            self.close_at = max(self.close_at, count - 40)  # a few calls on the closed transport
        self.bad = [b for b in BAD_CALLS if b[0] is None or b[0] in caps.methods
                    or (b[0] == "waiting" and caps.waiting)]
        self.part5 = caps.later or caps.once or caps.release
        self.bad += [b for b in PART5_BAD_CALLS if self._has(b[0])]

    def _has(self, needs: Any) -> bool:
        """Are the capabilities a (Part 5) bad call needs all driven?"""
        for need in needs if isinstance(needs, tuple) else (needs,):
            if need in ("later", "once", "release"):
                if not getattr(self.caps, need):
                    return False
            elif need not in self.caps.methods:
                return False
        return True

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
        if op[0] == "call" and op[1] in ("nack", "release") and self.h.last is None:
            delay = op[2][1] if len(op[2]) > 1 else dict(op[3]).get("delay")
            if isinstance(delay, (int, float)) and 0 < delay < INF:
                self.parks.append(self.now() + delay)
        if self.part5 and op[0] == "call" and op[1] in ("publish", "publish_many") and self.h.last is not None \
                and self.h.last[0] in ("int", "list"):
            kwargs = dict(op[3])
            delay = kwargs.get("delay")
            if isinstance(delay, (int, float)) and not isinstance(delay, bool) and 0 < delay < 1e300:
                self.dues.append(self.now() + delay)
            window = self.caps.dedup_window
            if 0 < window < INF and (kwargs.get("key", OMIT) not in (OMIT, None) or op[1] == "publish_many"):
                self.dues.append(self.now() + window)

    # -- single operations ---------------------------------------------------------

    def publish(self) -> Op:
        priority = self.rng.choice(self.priorities)
        if priority is OMIT:
            op = call("publish", self.rng.choice(self.names), self.event())
        elif self.rng.random() < 0.2:
            op = call("publish", self.rng.choice(self.names), self.event(), priority=priority)
        else:
            op = call("publish", self.rng.choice(self.names), self.event(), priority)
        return self._later_once(op) if self.part5 else op

    def _later_once(self, op: Op, rate: float = 0.35) -> Op:
        """Part 5: now and then a delay and/or a key for a ``publish``; a
        keyed or delayed one mostly goes to one of a few groups."""
        rng = self.rng
        if rng.random() >= rate:
            return op
        _, method, args, kwargs = op
        extra = []
        if self.caps.later:
            delay = self.pick(PUBLISH_DELAYS)
            if delay is not OMIT:
                extra.append(("delay", delay))
        if self.caps.once:
            key = self.pick(KEYS)
            if key is not OMIT:
                extra.append(("key", key))
        if extra and rng.random() < 0.7:
            args = (rng.choice(FEW_GROUPS),) + args[1:]
        if len(extra) == 2 and rng.random() < 0.5:
            extra.reverse()  # keyword order does not matter
        return ("call", method, args, kwargs + tuple(extra))

    def part5_op(self) -> Op:
        """One Part 5 operation: a delayed or keyed publish, a release, a
        retry, or the clock set on a due time or a window's end."""
        rng = self.rng
        kinds = []
        if self.caps.later or self.caps.once:
            kinds += ["publish", "publish"]
        if self.caps.release:
            kinds += ["release", "release", "retry", "retry"]
        if self.dues:
            kinds.append("due")
        kind = rng.choice(kinds)
        if kind == "publish":
            priority = rng.choice(self.priorities)
            args: Tuple[Any, ...] = (rng.choice(FEW_GROUPS), self.event())
            return self._later_once(call("publish", *args) if priority is OMIT else call("publish", *args, priority),
                                    rate=1.0)
        if kind == "due":
            due = rng.choice(list(self.dues))
            if not math.isfinite(due):
                return call("stats")
            return ("set", rng.choice([due, _next_up(due), due + 0.25]))
        if kind == "retry":
            return call("retry", self._recent_group())
        return self.release()

    def _recent_group(self) -> Any:
        """Mostly the group of a recent lease (leased, expired, parked,
        buried...), else any group."""
        if self.refs and self.rng.random() < 0.7:
            ref = self.lease()
            result = self.h.results.get(ref.uid)
            if result is not None:
                lease = result[0][ref.k] if ref.k >= 0 else result[0]
                return lease.group_id
        return self.group()

    def release(self, lease: Any = None) -> Op:
        """``release`` of a recent lease (now and then a forged or foreign
        one), with or without a delay."""
        rng = self.rng
        if lease is None:
            if not self.refs:
                return self.claim()
            roll = rng.random()
            if roll < 0.06 and self.caps.forged:
                lease = Forged(self.lease())
            elif roll < 0.1 and self.caps.foreign:
                lease = FOREIGN
            else:
                lease = self.lease()
        delay = self.pick(DELAYS)
        if delay is OMIT:
            return call("release", lease)
        if rng.random() < 0.3:
            return call("release", lease, delay=delay)
        return call("release", lease, delay)

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
        if any(a == L for a in args if isinstance(a, LeaseRef)) or any(isinstance(a, Batch) and L in a.items
                                                                      for a in args):
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
        if self.caps.later:  # reads the clock
            inner.append(call("publish", "g0", self.event(), delay=1))
        if self.caps.once:  # reads the clock with a window only
            inner.append(call("publish", "g1", self.event(), key="a"))
        if self.caps.release:
            if self.refs:  # a delay reads the clock before the currency
                inner += [call("release", self.lease(), 3), call("release", self.lease())]
            inner.append(call("retry", self._recent_group()))  # always reads the clock
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
        if self.caps.release:
            methods.append("release")
        method = self.rng.choice(methods)
        if method == "release":
            return self.release(lease)
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
            if not self.part5:
                return call("publish_many", Batch(form, tuple(items)))
            return self._later_once_batch(form, items)
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

    def _later_once_batch(self, form: str, items: List[Tuple[Any, ...]]) -> Op:
        """Part 5: 4-tuple items with keys (to a few groups), a ``delay``."""
        rng = self.rng
        if self.caps.once:
            keyed = []
            for item in items:
                if rng.random() < 0.5:
                    key = self.pick(KEYS)
                    priority = item[2] if len(item) == 3 else rng.choice([0, 0, 1])
                    group = rng.choice(FEW_GROUPS) if rng.random() < 0.7 else item[0]
                    item = (group, item[1], priority, None if key is OMIT else key)
                keyed.append(item)
            items = keyed
        kwargs: Tuple[Tuple[str, Any], ...] = ()
        if self.caps.later and rng.random() < 0.4:
            delay = self.pick(PUBLISH_DELAYS)
            kwargs = (("delay", 0 if delay is OMIT else delay),)
        return ("call", "publish_many", (Batch(form, tuple(items)),), kwargs)

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
        if self.part5:
            phases += ["later", "later"]
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
        weights = {  # publish claim ack nack extend bad advance misc control batch quarantine ack_and_claim part5
            "fill": [60, 20, 5, 5, 2, 3, 2, 6, 2, 3, 2, 3, 4],
            "drain": [5, 45, 30, 8, 4, 3, 3, 5, 2, 3, 3, 12, 6],
            "churn": [25, 30, 20, 10, 6, 3, 2, 6, 5, 4, 4, 8, 6],
            "time": [10, 30, 10, 10, 10, 3, 22, 6, 3, 2, 3, 6, 5],
            "control": [20, 25, 15, 5, 3, 2, 5, 3, 25, 3, 3, 3, 3],
            "batch": [10, 15, 10, 5, 3, 3, 5, 3, 5, 40, 2, 8, 3],
            "quarantine": [18, 25, 10, 5, 3, 3, 6, 3, 4, 2, 30, 3, 4],
            "later": [25, 25, 12, 4, 2, 4, 12, 6, 3, 4, 3, 3, 30],
        }[phase]
        if not has_quarantine:  # the weight goes, the draws stay those of the streams before Part 4
            weights[10] = 0
        if not has_ack_and_claim:  # likewise: a trailing zero weight changes no draw
            weights[11] = 0
        if not self.part5:  # likewise for Part 5
            weights[12] = 0
        for _ in range(min(left, rng.randint(30, 1500 if phase == "fill" else 600))):
            kind = rng.choices(["publish", "claim", "ack", "nack", "extend", "bad", "advance", "misc", "control",
                                "batch", "quarantine", "ack_and_claim", "part5"], weights)[0]
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
            elif kind == "part5":
                yield self.part5_op()
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
        ends: List[float] = list(self.parks) + list(self.dues)
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
            yield ("set", _next_up(end))
            yield self.observe()
