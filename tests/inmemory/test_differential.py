"""Differential tests: leasequeue's own transports through the public kit.

``leasequeue.testing.check_differential`` drives two transports with the
same random operations and fails, with a shrunk reproduction, at the first
difference.  Here it compares

* the pure transport with the reference (``ReferenceTransport``),
* the Cython transport with the reference,
* the pure transport with the Cython one: long runs with many groups (the
  reference sorts every message on each claim, so it cannot keep up), every
  result compared, events by identity.

Part 2 (waiting, control plane, batches) is driven as soon as a transport
has it: the kit drives what both sides of a comparison have.

``TestDifferentialMachine`` is a hypothesis state machine over the reference
and both transports at once, built on the kit's ``Harness``.  Both generators
reach the common case (issue 14): about half of the runs use one priority
level, the clock lands exactly on expiries, and runs build up enough stale
heap entries for the pure transport to compact its heaps --
``test_random_runs_reach_the_common_case`` counts that it does.

Environment knobs (defaults keep the file around a minute):
``LEASEQUEUE_DIFF_OPS`` operations per long pure-vs-Cython seed (60000),
``LEASEQUEUE_DIFF_SEEDS`` long seeds (8), ``LEASEQUEUE_DIFF_REF_SEEDS`` seeds
per transport against the reference (16), ``LEASEQUEUE_DIFF_EXAMPLES``
hypothesis examples (150).
"""

from __future__ import annotations

import importlib
import math
import os
import random
from collections import Counter
from typing import Any, Callable, List

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from leasequeue.testing import ManualClock, ReferenceTransport, check_differential
from leasequeue.testing._differential import detect_capabilities
from leasequeue.testing._generator import BAD_CALLS, FAULTS, L, Capabilities, call
from leasequeue.testing._harness import SKIPPED, Harness, Side
from leasequeue.testing._ops import FOREIGN, OMIT, Batch, Forged, LeaseRef, Name

OPS_PER_SEED = int(os.environ.get("LEASEQUEUE_DIFF_OPS", "60000"))
LONG_SEEDS = int(os.environ.get("LEASEQUEUE_DIFF_SEEDS", "8"))
REF_SEEDS = int(os.environ.get("LEASEQUEUE_DIFF_REF_SEEDS", "16"))
EXAMPLES = int(os.environ.get("LEASEQUEUE_DIFF_EXAMPLES", "150"))
REF_OPS = 3000
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def load(name: str) -> Any:
    try:
        return importlib.import_module(f"leasequeue._backends.inmemory.transport_{name}")
    except ImportError as exc:
        if name == "c" and os.environ.get("LEASEQUEUE_NO_EXTENSIONS"):
            pytest.skip("Cython transport disabled by LEASEQUEUE_NO_EXTENSIONS")
        raise AssertionError(f"the {name} implementation did not import: {exc!r}") from exc


def factory(name: str) -> Callable[[ManualClock], Any]:
    cls = load(name).InMemoryTransport
    return lambda clock: cls(clock=clock)


def assert_did_something(summary: Any, ops: int) -> None:
    """A run that passes must have really run: leases issued, errors checked."""
    assert summary.operations + summary.skipped >= ops
    assert summary.tally.get("claim lease", 0) > 0
    assert summary.tally.get("ack None", 0) > 0
    assert any(key.endswith(" raise") for key in summary.tally)


# -- seeded runs through check_differential -------------------------------------


@pytest.mark.parametrize("seed", range(REF_SEEDS))
@pytest.mark.parametrize("impl", ["py", "c"])
def test_transport_matches_the_reference(impl: str, seed: int) -> None:
    summary = check_differential(factory(impl), ops=REF_OPS, seed=seed)
    assert_did_something(summary, REF_OPS)


@pytest.mark.parametrize("seed", range(LONG_SEEDS))
def test_pure_matches_cython(seed: int) -> None:
    summary = check_differential(
        factory("c"), reference=factory("py"), names=("pure", "cython"), ops=OPS_PER_SEED, seed=seed,
        groups=[7, 40, 300, 2000, 20000][seed % 5], single_level=seed % 2 == 0,
    )
    assert_did_something(summary, OPS_PER_SEED)


def test_random_runs_reach_the_common_case() -> None:
    """Issue 14: the runs must visit the pure twin's one-level fast path with
    stale heap entries, land on expiries and compact both kinds of heap.
    Counted on an instrumented subclass of the pure transport."""
    pure = load("py").InMemoryTransport
    hits: Counter[str] = Counter()

    class Counting(pure):  # type: ignore[misc, valid-type]
        def claim(self, *args: Any, **kwargs: Any) -> Any:
            root = self._root
            if root is not None and root.left is None and root.right is None:
                hits["one-level claim"] += 1
                if root.stale:
                    hits["one-level claim with stale entries"] += 1
            return super().claim(*args, **kwargs)

        def _compact(self, level: Any) -> None:
            hits["level heap compacted"] += 1
            super()._compact(level)

        def _lock_group(self, *args: Any) -> None:
            before = self._expiry
            super()._lock_group(*args)
            if self._expiry is not before:
                hits["expiry heap compacted"] += 1

    single = 0
    landings = 0
    seeds = 12  # the first seeds of test_transport_matches_the_reference
    for seed in range(seeds):
        # Parts 1-4's stream: Part 5's operations dilute it (every other run here drives them)
        summary = check_differential(lambda clock: Counting(clock=clock), ops=REF_OPS, seed=seed,
                                     later=False, once=False, release=False)
        single += summary.single_level
        landings += summary.tally.get("set None", 0)
    assert 3 <= single <= 9, f"{single} of {seeds} runs on one level"
    assert landings >= seeds, "the clock rarely lands on an expiry"
    for what in ("one-level claim with stale entries", "level heap compacted", "expiry heap compacted"):
        assert hits[what] >= 3, f"{what}: {hits[what]} times in {seeds} runs ({dict(hits)})"


# -- the hypothesis state machine -------------------------------------------------------


def refereed_sides() -> List[Side]:
    """Reference, pure and Cython; in a pure-only run without the extension,
    reference and pure (so the pure twin is still refereed)."""
    sides = [Side("reference", ReferenceTransport), Side("pure", factory("py"))]
    try:
        sides.append(Side("cython", factory("c")))
    except pytest.skip.Exception:
        pass
    return sides


def machine_capabilities() -> Capabilities:
    caps = detect_capabilities(factory("py"))
    try:
        c_caps = detect_capabilities(factory("c"))
    except pytest.skip.Exception:
        return caps
    return caps._replace(methods=caps.methods & c_caps.methods, waiting=caps.waiting and c_caps.waiting)


GROUPS = ["a", "b", "c", "d", "e", Name("a")]
WORKERS = ["w1", "w2", "w3", Name("w2"), ""]
PRIORITIES = [OMIT, 0, 0, 1, 2, -1, INT64_MAX, INT64_MIN]
FLOORS = [OMIT, 0, 1, 2, -1, INT64_MIN, INT64_MAX]
VISIBILITIES = [0, 0.0, -0.0, 1, 2.5, 5, 10, 30, math.inf, 10**400]
DELAYS = [OMIT, 0, 0.0, -0.0, 1, 3.5, 10, math.inf]
STEPS = [0, 0.5, 1, 2.5, 5, 10, 11, 31, 100, 1e6, -1, -5, -40]


class DifferentialMachine(RuleBasedStateMachine):
    """Reference, pure and Cython transports under one random operation stream."""

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(refereed_sides())
        self.caps = CAPS
        self.events = 0
        self.refs: List[LeaseRef] = []
        self.priorities = PRIORITIES
        self.floors = FLOORS

    @initialize(single_level=st.booleans())
    def levels(self, single_level: bool) -> None:
        """Half of the runs on one priority level (floors above it still
        apply expiries without claiming)."""
        if single_level:
            self.priorities = [OMIT, 0]
            self.floors = [OMIT, 0, -1, 1, INT64_MIN, INT64_MAX]

    # -- helpers ------------------------------------------------------------------

    def apply(self, op: Any) -> Any:
        outcome = self.h.apply(op)
        uid = self.h.next_uid - 1
        result = self.h.results.get(uid)
        if result is not None:
            if isinstance(result[0], list):
                self.refs.extend(LeaseRef(uid, k) for k in range(len(result[0])))
            else:
                self.refs.append(LeaseRef(uid))
        return outcome

    def event(self) -> List[Any]:
        self.events += 1
        return ["e", self.events]

    def ref(self, i: int) -> LeaseRef:
        return self.refs[i % len(self.refs)]

    def has(self, method: str) -> bool:
        return method in self.caps.methods

    # -- Part 1 -----------------------------------------------------------------

    @rule(group=st.sampled_from(GROUPS), data=st.data())
    def publish(self, group: str, data: st.DataObject) -> None:
        priority = data.draw(st.sampled_from(self.priorities), label="priority")
        args = (group, self.event()) if priority is OMIT else (group, self.event(), priority)
        self.apply(("call", "publish", args, ()))

    @rule(groups=st.lists(st.sampled_from(GROUPS), min_size=2, max_size=6))
    def publish_several(self, groups: List[str]) -> None:
        for group in groups:
            self.apply(call("publish", group, self.event()))

    @rule(worker=st.sampled_from(WORKERS), visibility=st.sampled_from(VISIBILITIES), data=st.data())
    def claim(self, worker: str, visibility: Any, data: st.DataObject) -> None:
        floor = data.draw(st.sampled_from(self.floors), label="floor")
        args = (worker, visibility) if floor is OMIT else (worker, visibility, floor)
        kwargs: Any = ()
        if self.caps.waiting and data.draw(st.booleans(), label="with timeout"):
            kwargs = (("timeout", data.draw(st.sampled_from([0, -0.0, 0.001, None, 5, -1, math.nan, True]),
                                            label="timeout")),)
        self.apply(("call", "claim", args, kwargs))

    @rule(visibility=st.sampled_from([1, 5, 10]), data=st.data())
    def claim_and_settle(self, visibility: float, data: st.DataObject) -> None:
        """Several claims in one clock tick, then their leases settled in a
        shuffled order: the round-robin order shows only across groups."""
        first = len(self.refs)
        for _ in range(data.draw(st.integers(2, 5), label="claims")):
            self.apply(call("claim", "w1", visibility))
        issued = self.refs[first:]
        for ref in data.draw(st.permutations(issued), label="order"):
            how = data.draw(st.sampled_from(["ack", "nack", "park", "keep"]), label="settle")
            if how == "ack":
                self.apply(call("ack", ref))
            elif how == "nack":
                self.apply(call("nack", ref))
            elif how == "park":
                self.apply(call("nack", ref, 2))

    @precondition(lambda self: self.refs)
    @rule(i=st.integers(0, 1000))
    def ack(self, i: int) -> None:
        self.apply(call("ack", self.ref(i)))

    @precondition(lambda self: self.refs)
    @rule(i=st.integers(0, 1000), delay=st.sampled_from(DELAYS))
    def nack(self, i: int, delay: Any) -> None:
        self.apply(call("nack", self.ref(i)) if delay is OMIT else call("nack", self.ref(i), delay))

    @precondition(lambda self: self.refs)
    @rule(i=st.integers(0, 1000), visibility=st.sampled_from(VISIBILITIES))
    def extend(self, i: int, visibility: Any) -> None:
        self.apply(call("extend", self.ref(i), visibility))

    @precondition(lambda self: self.refs)
    @rule(i=st.integers(0, 1000), method=st.sampled_from(["ack", "nack", "extend"]),
          arg=st.sampled_from([0, 5, math.inf]))
    def forged(self, i: int, method: str, arg: Any) -> None:
        lease = Forged(self.ref(i))
        self.apply(call("ack", lease) if method == "ack" else call(method, lease, arg))

    @rule(method=st.sampled_from(["ack", "nack", "extend"]), arg=st.sampled_from([0, 5]))
    def foreign(self, method: str, arg: Any) -> None:
        self.apply(call("ack", FOREIGN) if method == "ack" else call(method, FOREIGN, arg))

    @rule(k=st.integers(0, len(BAD_CALLS) - 1), i=st.integers(0, 1000))
    def bad_input(self, k: int, i: int) -> None:
        needs, method, args, kwargs = BAD_CALLS[k]
        if needs is not None and not (needs in self.caps.methods or (needs == "waiting" and self.caps.waiting)):
            return
        uses_lease = L in args or any(isinstance(a, Batch) and L in a.items for a in args)
        if uses_lease:
            if not self.refs:
                return
            ref = self.ref(i)
            args = tuple(Batch(a.form, tuple(ref if x == L else x for x in a.items)) if isinstance(a, Batch)
                         else ref if a == L else a for a in args)
        self.apply(("call", method, args, kwargs))

    @rule(step=st.sampled_from(STEPS))
    def advance(self, step: float) -> None:
        self.apply(("advance", step))

    @precondition(lambda self: self.refs)
    @rule(i=st.integers(0, 1000), past=st.booleans(), observe=st.sampled_from(["stats", "claim", "floor"]))
    def land_on_expiry(self, i: int, past: bool, observe: str) -> None:
        """The clock exactly on a lease's expiry (still live), or one float
        step past it (expired), then something that applies expiry."""
        ref = self.ref(i)
        result = self.h.results.get(ref.uid)
        if result is None:
            return
        end = (result[0][ref.k] if ref.k >= 0 else result[0]).expires_at
        if not math.isfinite(end):
            return
        self.apply(("set", math.nextafter(end, math.inf) if past else end))
        self.apply({"stats": call("stats"), "claim": call("claim", "w2", 5),
                    "floor": call("claim", "w3", 1, INT64_MAX)}[observe])

    @rule(step=st.sampled_from([2, 6, 11, 40]), back=st.sampled_from([1, 5, 10, 39]),
          observe=st.sampled_from(["stats", "claim-nothing", "none"]))
    def observe_then_rewind(self, step: float, back: float, observe: str) -> None:
        """Jump past some expiries, let (or not let) stats()/a claim see them,
        then turn the clock back: observed expiry is permanent."""
        self.apply(("advance", step))
        if observe == "stats":
            self.apply(call("stats"))
        elif observe == "claim-nothing":
            self.apply(call("claim", "w3", 1, INT64_MAX))
        self.apply(("advance", -back))

    @rule(size=st.integers(1, 80), mix=st.integers(0, 2**32))
    def wave(self, size: int, mix: int) -> None:
        """Many groups expired together and seen expired, then each lease
        extended/acked/parked: stale heap entries pile up (and compact).
        The order and the endings come from one drawn number (drawing each
        would make hypothesis spend its time on this rule)."""
        rng = random.Random(mix)
        first = len(self.refs)
        for j in range(size):
            self.apply(call("publish", f"v{j}", self.event()))
        for _ in range(size):
            self.apply(call("claim", "w1", 1, INT64_MIN))
        self.apply(("advance", 2))
        self.apply(call("stats"))
        issued = self.refs[first:]
        rng.shuffle(issued)
        for ref in issued:
            self.apply(rng.choice([call("extend", ref, 30), call("ack", ref), call("nack", ref, 5)]))

    @precondition(lambda self: self.refs)
    @rule(i=st.integers(0, 1000), beats=st.integers(1, 150), visibility=st.sampled_from([5, 30]))
    def heartbeat(self, i: int, beats: int, visibility: float) -> None:
        """One lease extended again and again: each extend leaves a stale
        expiry entry behind (a transport with an expiry heap compacts it)."""
        ref = self.ref(i)
        for _ in range(beats):
            self.apply(call("extend", ref, visibility))

    @rule(mode=st.integers(0, len(FAULTS) - 1), which=st.integers(0, 8), i=st.integers(0, 1000))
    def bad_clock(self, mode: int, which: int, i: int) -> None:
        has = bool(self.refs)
        ref = self.ref(i) if has else None
        inner = [
            call("claim", "w1", 5),
            call("stats"),
            call("extend", ref, 5) if has else call("stats"),
            call("nack", ref, 5) if has else call("stats"),
            call("nack", ref, 0) if has else call("publish", "b", self.event()),  # reads no clock
            call("ack", ref) if has else call("publish", "b", self.event()),  # reads no clock
            call("publish", "b", self.event()),  # reads no clock
            call("group", "a") if self.has("group") else call("stats"),
            call("ack_and_claim", ref, "w1", 5) if has and self.has("ack_and_claim") else call("stats"),
        ][which]
        self.apply(("fault", FAULTS[mode], inner))

    @rule()
    def stats(self) -> None:
        self.apply(call("stats"))

    @rule()
    def close(self) -> None:
        self.apply(call("close"))
        if self.caps.waiting:
            self.apply(("attr", "closed"))

    # -- Part 2, when both transports have it ---------------------------------------------

    @precondition(lambda self: self.has("pause"))
    @rule(method=st.sampled_from(["pause", "resume", "purge", "group"]), group=st.sampled_from(GROUPS + ["zz"]))
    def control(self, method: str, group: str) -> None:
        if self.has(method):
            self.apply(call(method, group))

    @precondition(lambda self: self.has("set_priority"))
    @rule(group=st.sampled_from(GROUPS + ["zz"]), data=st.data())
    def set_priority(self, group: str, data: st.DataObject) -> None:
        priority = data.draw(st.sampled_from([p for p in self.priorities if p is not OMIT]), label="priority")
        self.apply(call("set_priority", group, priority))

    @precondition(lambda self: self.has("groups"))
    @rule()
    def groups(self) -> None:
        self.apply(call("groups"))

    @precondition(lambda self: self.has("publish_many"))
    @rule(groups=st.lists(st.sampled_from(GROUPS), max_size=6), form=st.sampled_from(["list", "iter", "tuple"]),
          data=st.data())
    def publish_many(self, groups: List[str], form: str, data: st.DataObject) -> None:
        items = []
        for group in groups:
            priority = data.draw(st.sampled_from(self.priorities), label="priority")
            items.append((group, self.event()) if priority is OMIT else (group, self.event(), priority))
        self.apply(call("publish_many", Batch(form, tuple(items))))

    @precondition(lambda self: self.has("claim_many"))
    @rule(worker=st.sampled_from(WORKERS), visibility=st.sampled_from(VISIBILITIES),
          count=st.sampled_from([0, 1, 2, 3, 7, 2**70]), data=st.data())
    def claim_many(self, worker: str, visibility: Any, count: int, data: st.DataObject) -> None:
        floor = data.draw(st.sampled_from(self.floors), label="floor")
        args = (worker, visibility, count) if floor is OMIT else (worker, visibility, count, floor)
        self.apply(("call", "claim_many", args, ()))

    @precondition(lambda self: self.has("ack_many") and self.refs)
    @rule(picks=st.lists(st.integers(0, 1000), max_size=5), forged=st.booleans())
    def ack_many(self, picks: List[int], forged: bool) -> None:
        leases: List[Any] = [self.ref(i) for i in picks]
        if forged:
            leases.append(Forged(self.ref(0)))
        self.apply(call("ack_many", Batch("list", tuple(leases))))

    # -- Part 4, when both transports have it ---------------------------------------------

    @precondition(lambda self: self.has("bury") and self.refs)
    @rule(i=st.integers(0, 1000), reason=st.sampled_from([OMIT, "", "boom", Name("poison")]),
          then=st.sampled_from(["nothing", "resume", "skip", "claim"]))
    def bury(self, i: int, reason: Any, then: str) -> None:
        """A (maybe stale) lease buried, then the group resumed, skipped or
        claimed from (a buried group must not be served)."""
        ref = self.ref(i)
        self.apply(call("bury", ref) if reason is OMIT else call("bury", ref, reason))
        result = self.h.results.get(ref.uid)
        if result is None or then == "nothing":
            return
        group = (result[0][ref.k] if ref.k >= 0 else result[0]).group_id
        if then == "claim":
            self.apply(call("claim", "w1", 5, INT64_MIN))
        elif self.has("resume") or then == "skip":
            self.apply(call(then if then == "skip" else "resume", group))

    @precondition(lambda self: self.has("skip"))
    @rule(group=st.sampled_from(GROUPS + ["zz"]))
    def skip(self, group: str) -> None:
        self.apply(call("skip", group))

    @precondition(lambda self: self.has("peek"))
    @rule(group=st.sampled_from(GROUPS + ["zz"]), count=st.sampled_from([OMIT, 0, 1, 2, 5, 2**70, -1, True]))
    def peek(self, group: str, count: Any) -> None:
        self.apply(call("peek", group) if count is OMIT else call("peek", group, count))

    # -- ack_and_claim, when both transports have it ---------------------------------------------

    @precondition(lambda self: self.has("ack_and_claim") and self.refs)
    @rule(i=st.integers(0, 1000), lease=st.sampled_from(["recent", "recent", "forged", "foreign"]),
          worker=st.sampled_from(WORKERS), visibility=st.sampled_from(VISIBILITIES),
          loop=st.integers(0, 6), data=st.data())
    def ack_and_claim(self, i: int, lease: str, worker: str, visibility: Any, loop: int, data: st.DataObject) -> None:
        """A (maybe stale, forged or foreign) lease acked with the next
        claim; then, while a lease comes back, a worker's loop on it."""
        floor = data.draw(st.sampled_from(self.floors), label="floor")
        target: Any = {"recent": self.ref(i), "forged": Forged(self.ref(i)), "foreign": FOREIGN}[lease]
        for _ in range(loop + 1):
            args = (target, worker, visibility) if floor is OMIT else (target, worker, visibility, floor)
            self.apply(("call", "ack_and_claim", args, ()))
            uid = self.h.next_uid - 1
            if not self.h.results.get(uid):
                break
            target = LeaseRef(uid)

    @invariant()
    def same_len(self) -> None:
        assert self.h.apply(("len",)) is not SKIPPED


CAPS = machine_capabilities()
TestDifferentialMachine = DifferentialMachine.TestCase
TestDifferentialMachine.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
