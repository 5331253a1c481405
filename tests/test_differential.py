"""Differential tests: the referee, the pure transport and the Cython transport
driven with the same operations must agree on every result and exception.

* ``TestDifferential``: a hypothesis state machine over all three (referee,
  ``_inmemory_py``, ``_inmemory_c``): publish, claim, ack/nack/extend of
  current and stale leases, forged leases and leases of another instance,
  bad arguments, a misbehaving clock, clock jumps both ways, stats, len.
* ``test_seeded_random_pure_vs_cython``: long seeded runs (hundreds of
  thousands of operations) comparing the two transports.
* ``test_seeded_random_against_referee``: shorter seeded runs with the
  referee too (it sorts every message on each claim).

Every side has its own clock with the same times.  Leases are compared field
by field (with the exact field types), events by identity (every side gets
the same event object), exceptions by type.

Environment knobs (defaults keep the whole file well under a minute):
``LEASEQUEUE_DIFF_OPS`` operations per long seed (100000),
``LEASEQUEUE_DIFF_SEEDS`` long seeds (8), ``LEASEQUEUE_DIFF_EXAMPLES``
hypothesis examples (300).
"""

from __future__ import annotations

import importlib
import math
import os
import random
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from referee import INT64_MAX, INT64_MIN, Referee, RefLease, ScriptedClock

OPS_PER_SEED = int(os.environ.get("LEASEQUEUE_DIFF_OPS", "100000"))
LONG_SEEDS = int(os.environ.get("LEASEQUEUE_DIFF_SEEDS", "8"))
EXAMPLES = int(os.environ.get("LEASEQUEUE_DIFF_EXAMPLES", "300"))
OMIT = object()  # "call without this optional argument"
NAN = float("nan")


class Name(str):
    """A str subclass: ids must be stored (and returned) as exact str."""


def load(name: str) -> Any:
    try:
        return importlib.import_module(f"leasequeue._inmemory_{name}")
    except ImportError as exc:
        if name == "c" and os.environ.get("LEASEQUEUE_NO_EXTENSIONS"):
            pytest.skip("Cython transport disabled by LEASEQUEUE_NO_EXTENSIONS")
        raise AssertionError(f"the {name} implementation did not import: {exc!r}") from exc


# -- one side of the comparison ------------------------------------------------


class Side:
    """A transport (or the referee) with its own clock and a foreign lease."""

    def __init__(self, name: str, factory: Callable[[Any], Any], forge: Callable[..., Any]) -> None:
        self.name = name
        self.clock = ScriptedClock()
        self.transport = factory(self.clock)
        self.forge = forge
        other_clock = ScriptedClock()
        other = factory(other_clock)  # another instance: its leases are foreign here
        other.publish("a", FOREIGN_EVENT)
        self.foreign = other.claim("w1", math.inf)
        self._other = other


FOREIGN_EVENT = ["foreign"]


def referee_side() -> Side:
    return Side("referee", Referee, lambda *fields: RefLease(*fields, owner=None))


def impl_side(name: str) -> Side:
    module = load(name)
    return Side(name, module.InMemoryTransport, module.Lease)


def refereed_sides() -> list[Side]:
    """Referee, pure and Cython; in a pure-only run without the extension,
    referee and pure (so the pure twin is still refereed)."""
    try:
        compiled = [impl_side("c")]
    except pytest.skip.Exception:
        compiled = []
    return [referee_side(), impl_side("py"), *compiled]


def normalize(value: Any) -> Any:
    """A return value as comparable data (see referee.lease_key)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return ("int", type(value).__name__, value)
    if hasattr(value, "attempt"):
        return (
            "lease",
            value.seq, value.group_id, id(value.event), value.worker_id, value.expires_at, value.attempt,
            type(value.seq).__name__, type(value.group_id).__name__, type(value.worker_id).__name__,
            type(value.expires_at).__name__, type(value.attempt).__name__,
        )
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # stats
        return ("stats", tuple(value._fields), tuple((type(x).__name__, x) for x in value))
    return ("other", repr(value))


# -- operations ------------------------------------------------------------------
# An operation is a tuple; ``perform`` applies it to one side.  Lease-taking
# operations name a lease by its index in the harness's list of issued leases
# (each entry holds one lease per side, for the same delivery).


def bad_calls() -> list[Callable[[Any, Any], Any]]:
    """Calls that break a row of the bad-input table (``lease`` is a real one)."""
    return [
        lambda t, lease: t.publish(7, "e"),
        lambda t, lease: t.publish("a", "e", 1.5),
        lambda t, lease: t.publish("a", "e", True),
        lambda t, lease: t.publish("a", "e", 2**63),
        lambda t, lease: t.publish("fresh", "e", -(2**63) - 1),
        lambda t, lease: t.claim(None, 1),
        lambda t, lease: t.claim("__parked__", 1),
        lambda t, lease: t.claim(Name("__parked__"), 1),
        lambda t, lease: t.claim("w1", "1"),
        lambda t, lease: t.claim("w1", False),
        lambda t, lease: t.claim("w1", -1),
        lambda t, lease: t.claim("w1", NAN),
        lambda t, lease: t.claim("w1", -math.inf),
        lambda t, lease: t.claim("w1", -(10**400)),
        lambda t, lease: t.nack(lease, -(10**400)),
        lambda t, lease: t.claim("w1", 1, 0.0),
        lambda t, lease: t.claim("w1", 1, 2**64),
        lambda t, lease: t.claim("w1", -1, "x"),
        lambda t, lease: t.ack(None),
        lambda t, lease: t.ack((1, "a")),
        lambda t, lease: t.nack("lease"),
        lambda t, lease: t.nack(lease, -0.5),
        lambda t, lease: t.nack(lease, NAN),
        lambda t, lease: t.nack(lease, True),
        lambda t, lease: t.nack(lease, "1"),
        lambda t, lease: t.extend(lease, NAN),
        lambda t, lease: t.extend(lease, -3),
        lambda t, lease: t.extend(lease, None),
        lambda t, lease: t.extend(0, 5),
    ]


BAD_CALLS = bad_calls()
class Seconds(float):
    """A float subclass a clock may return: converted to an exact float."""


#: what a misbehaving clock returns for one operation: errors, and a few
#: valid surprises (an int, a float subclass, a jump far ahead or back)
BAD_CLOCK_VALUES = [RuntimeError("clock broke"), NAN, "noon", True, math.inf, -math.inf, None, 10**400,
                    1500, Seconds(1234.5), 2**70, -5.0]


def perform(side: Side, op: tuple[Any, ...], leases: list[tuple[Any, ...]], index: int) -> Any:
    t = side.transport
    kind = op[0]
    if kind == "publish":
        _, group_id, event, priority = op
        return t.publish(group_id, event) if priority is OMIT else t.publish(group_id, event, priority)
    if kind == "claim":
        _, worker_id, visibility, min_priority = op
        if min_priority is OMIT:
            return t.claim(worker_id, visibility)
        return t.claim(worker_id, visibility, min_priority)
    if kind == "ack":
        return t.ack(leases[op[1]][index])
    if kind == "nack":
        lease = leases[op[1]][index]
        return t.nack(lease) if op[2] is OMIT else t.nack(lease, op[2])
    if kind == "extend":
        return t.extend(leases[op[1]][index], op[2])
    if kind in ("forged", "foreign"):
        if kind == "forged":
            real = leases[op[1]][index]
            lease = side.forge(real.seq, real.group_id, real.event, real.worker_id, real.expires_at, real.attempt)
        else:
            lease = side.foreign
        method, arg = op[2], op[3]
        if method == "ack":
            return t.ack(lease)
        if method == "nack":
            return t.nack(lease, arg)
        return t.extend(lease, arg)
    if kind == "bad":
        lease = leases[op[2]][index] if leases else None
        return BAD_CALLS[op[1]](t, lease)
    if kind == "advance":
        side.clock.advance(op[1])
        return None
    if kind == "badclock":
        side.clock.bad = BAD_CLOCK_VALUES[op[1]]
        try:
            return perform(side, op[2], leases, index)
        finally:
            side.clock.behave()
    if kind == "stats":
        return t.stats()
    if kind == "len":
        return len(t)
    if kind == "close":
        return t.close()
    raise AssertionError(f"unknown operation {op!r}")


class Harness:
    """Applies each operation to every side and insists they agree."""

    def __init__(self, sides: list[Side], keep_leases: int = 0) -> None:
        self.sides = sides
        self.leases: list[tuple[Any, ...]] = []
        self.keep = keep_leases  # 0: keep all; else a sliding window
        self.count = 0
        self.last: Any = None  # the (agreed) outcome of the latest operation

    def apply(self, op: tuple[Any, ...]) -> Any:
        self.count += 1
        outcomes = []
        results = []
        for index, side in enumerate(self.sides):
            try:
                result = perform(side, op, self.leases, index)
            except Exception as exc:  # compared by type below
                outcomes.append(("raise", type(exc).__name__))
                results.append(None)
            else:
                outcomes.append(normalize(result))
                results.append(result)
        if any(o != outcomes[0] for o in outcomes):
            detail = "\n".join(f"  {s.name:8}: {o!r}" for s, o in zip(self.sides, outcomes))
            raise AssertionError(f"operation #{self.count} {describe(op)} disagrees:\n{detail}")
        if outcomes[0] is not None and outcomes[0][0] == "lease":
            self.leases.append(tuple(results))
            if self.keep and len(self.leases) > self.keep:
                del self.leases[: len(self.leases) - self.keep]
        self.last = outcomes[0]
        return outcomes[0]

    def check_len(self) -> None:
        lengths = [len(s.transport) for s in self.sides]
        assert len(set(lengths)) == 1, f"len differs: {lengths}"


def describe(op: tuple[Any, ...]) -> str:
    if op[0] == "bad":
        return f"bad call #{op[1]} (lease {op[2]})"
    if op[0] == "badclock":
        return f"with clock -> {BAD_CLOCK_VALUES[op[1]]!r}: {describe(op[2])}"
    return repr(tuple("<default>" if x is OMIT else x for x in op))


# -- the value pools shared by the generators --------------------------------------

GROUPS = ["a", "b", "c", "d", "e", Name("a")]
WORKERS = ["w1", "w2", "w3", Name("w2"), ""]
PRIORITIES = [OMIT, 0, 0, 1, 2, -1, INT64_MAX, INT64_MIN]
MIN_PRIORITIES = [OMIT, 0, 1, 2, -1, INT64_MIN, INT64_MAX]
VISIBILITIES = [0, 0.0, -0.0, 1, 2.5, 5, 10, 30, math.inf, 10**400]
DELAYS = [OMIT, 0, 0.0, -0.0, 1, 3.5, 10, math.inf]
STEPS = [0, 0.5, 1, 2.5, 5, 10, 11, 31, 100, 1e6, -1, -5, -40]


class Event:
    """A published event: unhashable, compared by identity only."""

    __slots__ = ("n",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:
        return f"Event({self.n})"


# -- the hypothesis state machine ----------------------------------------------------


class DifferentialMachine(RuleBasedStateMachine):
    """Referee, pure and Cython transports under one random operation stream."""

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(refereed_sides())
        self.events = 0

    def lease_index(self, i: int) -> int:
        return i % len(self.h.leases)

    @rule(group=st.sampled_from(GROUPS), priority=st.sampled_from(PRIORITIES))
    def publish(self, group: str, priority: Any) -> None:
        self.events += 1
        self.h.apply(("publish", group, Event(self.events), priority))

    @rule(groups=st.lists(st.sampled_from(GROUPS), min_size=2, max_size=6))
    def publish_many(self, groups: list[str]) -> None:
        for group in groups:
            self.events += 1
            self.h.apply(("publish", group, Event(self.events), OMIT))

    @rule(worker=st.sampled_from(WORKERS), visibility=st.sampled_from(VISIBILITIES),
          floor=st.sampled_from(MIN_PRIORITIES))
    def claim(self, worker: str, visibility: Any, floor: Any) -> None:
        self.h.apply(("claim", worker, visibility, floor))

    @rule(visibility=st.sampled_from([1, 5, 10]), data=st.data())
    def claim_and_settle(self, visibility: float, data: st.DataObject) -> None:
        """Several claims in one clock tick, then their leases settled in a
        shuffled order: the round-robin order shows only across groups."""
        first = len(self.h.leases)
        for _ in range(data.draw(st.integers(2, 5), label="claims")):
            self.h.apply(("claim", "w1", visibility, OMIT))
        issued = list(range(first, len(self.h.leases)))
        for i in data.draw(st.permutations(issued), label="order"):
            how = data.draw(st.sampled_from(["ack", "nack", "park", "keep"]), label="settle")
            if how == "ack":
                self.h.apply(("ack", i))
            elif how == "nack":
                self.h.apply(("nack", i, OMIT))
            elif how == "park":
                self.h.apply(("nack", i, 2))

    @precondition(lambda self: self.h.leases)
    @rule(i=st.integers(0, 1000))
    def ack(self, i: int) -> None:
        self.h.apply(("ack", self.lease_index(i)))

    @precondition(lambda self: self.h.leases)
    @rule(i=st.integers(0, 1000), delay=st.sampled_from(DELAYS))
    def nack(self, i: int, delay: Any) -> None:
        self.h.apply(("nack", self.lease_index(i), delay))

    @precondition(lambda self: self.h.leases)
    @rule(i=st.integers(0, 1000), visibility=st.sampled_from(VISIBILITIES))
    def extend(self, i: int, visibility: Any) -> None:
        self.h.apply(("extend", self.lease_index(i), visibility))

    @precondition(lambda self: self.h.leases)
    @rule(i=st.integers(0, 1000), method=st.sampled_from(["ack", "nack", "extend"]),
          arg=st.sampled_from([0, 5, math.inf]))
    def forged(self, i: int, method: str, arg: Any) -> None:
        self.h.apply(("forged", self.lease_index(i), method, arg))

    @rule(method=st.sampled_from(["ack", "nack", "extend"]), arg=st.sampled_from([0, 5]))
    def foreign(self, method: str, arg: Any) -> None:
        self.h.apply(("foreign", None, method, arg))

    @rule(k=st.integers(0, len(BAD_CALLS) - 1), i=st.integers(0, 1000))
    def bad_input(self, k: int, i: int) -> None:
        self.h.apply(("bad", k, self.lease_index(i) if self.h.leases else 0))

    @rule(step=st.sampled_from(STEPS))
    def advance(self, step: float) -> None:
        self.h.apply(("advance", step))

    @rule(step=st.sampled_from([2, 6, 11, 40]), back=st.sampled_from([1, 5, 10, 39]),
          observe=st.sampled_from(["stats", "claim-nothing", "none"]))
    def observe_then_rewind(self, step: float, back: float, observe: str) -> None:
        """Jump past some expiries, let (or not let) stats()/a claim see them,
        then turn the clock back: observed expiry is permanent."""
        self.h.apply(("advance", step))
        if observe == "stats":
            self.h.apply(("stats",))
        elif observe == "claim-nothing":
            self.h.apply(("claim", "w3", 1, INT64_MAX))
        self.h.apply(("advance", -back))

    @rule(mode=st.integers(0, len(BAD_CLOCK_VALUES) - 1), which=st.integers(0, 7), i=st.integers(0, 1000))
    def bad_clock(self, mode: int, which: int, i: int) -> None:
        has = bool(self.h.leases)
        j = self.lease_index(i) if has else 0
        inner = [
            ("claim", "w1", 5, OMIT),
            ("stats",),
            ("extend", j, 5) if has else ("stats",),
            ("nack", j, 5) if has else ("stats",),
            ("nack", j, 0) if has else ("len",),  # reads no clock: must succeed or fail as usual
            ("ack", j) if has else ("len",),  # reads no clock
            ("publish", "b", Event(-1), OMIT),  # reads no clock
            ("len",),
        ][which]
        self.h.apply(("badclock", mode, inner))

    @rule()
    def stats(self) -> None:
        self.h.apply(("stats",))

    @rule()
    def close(self) -> None:
        self.h.apply(("close",))

    @invariant()
    def same_len(self) -> None:
        self.h.check_len()


TestDifferential = DifferentialMachine.TestCase
TestDifferential.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- seeded random runs ------------------------------------------------------------------


#: weighted pools for the long runs: never-expiring values are rare there, or
#: every group ends up blocked for good and claims stop finding work
CLAIM_VISIBILITIES = [(0, 2), (-0.0, 1), (1, 10), (2.5, 10), (5, 20), (10, 20), (30, 10),
                      (math.inf, 0.5), (10**400, 0.3)]
NACK_DELAYS = [(OMIT, 20), (0, 10), (-0.0, 2), (1, 10), (3.5, 10), (10, 10), (math.inf, 0.3)]


def pick(rng: random.Random, pool: list[tuple[Any, float]]) -> Any:
    return rng.choices([v for v, _ in pool], [w for _, w in pool])[0]


def random_ops(seed: int, count: int, groups: int, events: list[Any], harness: Harness) -> Any:
    """A seeded stream of operations in phases (filling, draining, churning)
    so that queues grow large, empty out, and groups are forgotten."""
    rng = random.Random(seed)
    names = [f"g{i}" for i in range(groups)] + [Name("g0"), Name("g1")]
    n_leases = 0
    ops_left = count
    while ops_left > 0:
        phase = rng.choice(["fill", "drain", "churn", "churn", "time", "flush"])
        if phase == "flush":  # let every lease run out, then claim+ack the backlog away
            yield ("advance", 1e6)
            for _ in range(min(ops_left, rng.randint(500, 40000)) // 2):
                ops_left -= 2
                yield ("claim", rng.choice(WORKERS), 5, INT64_MIN)
                if harness.last is not None:  # a lease: the newest in the list
                    yield ("ack", len(harness.leases) - 1)
                else:
                    yield ("stats",)
                    break
            continue
        weights = {
            "fill": [60, 20, 5, 5, 2, 2, 1, 1, 2, 2],
            "drain": [5, 45, 30, 8, 4, 2, 1, 1, 3, 1],
            "churn": [25, 30, 20, 10, 6, 2, 2, 2, 2, 1],
            "time": [10, 30, 10, 10, 10, 2, 2, 2, 22, 2],
        }[phase]
        for _ in range(min(ops_left, rng.randint(50, 8000 if phase == "fill" else 2000))):
            ops_left -= 1
            kind = rng.choices(
                ["publish", "claim", "ack", "nack", "extend", "forged", "foreign", "bad", "advance", "misc"],
                weights,
            )[0]
            if rng.random() < 0.7:  # mostly one of the newest leases (likely current)
                recent = max(0, n_leases - rng.randint(1, 4))
            else:
                recent = rng.randrange(max(1, n_leases))
            if kind == "publish":
                event = rng.choice([object, list, lambda: None])()
                events.append(event)
                yield ("publish", rng.choice(names), event, rng.choice(PRIORITIES))
            elif kind == "claim":
                yield ("claim", rng.choice(WORKERS), pick(rng, CLAIM_VISIBILITIES), rng.choice(MIN_PRIORITIES))
            elif n_leases == 0 and kind in ("ack", "nack", "extend", "forged"):
                yield ("stats",)
            elif kind == "ack":
                yield ("ack", recent)
            elif kind == "nack":
                yield ("nack", recent, pick(rng, NACK_DELAYS))
            elif kind == "extend":
                yield ("extend", recent, pick(rng, CLAIM_VISIBILITIES))
            elif kind == "forged":
                yield ("forged", recent, rng.choice(["ack", "nack", "extend"]), rng.choice([0, 5]))
            elif kind == "foreign":
                yield ("foreign", None, rng.choice(["ack", "nack", "extend"]), rng.choice([0, 5]))
            elif kind == "bad":
                yield ("bad", rng.randrange(len(BAD_CALLS)), recent)
            elif kind == "advance":
                yield ("advance", rng.choice(STEPS))
            else:
                which = rng.random()
                if which < 0.2:  # expiry seen (or not), then the clock turned back
                    yield ("advance", rng.choice([2, 6, 11, 40]))
                    yield rng.choice([("stats",), ("claim", "w3", 1, INT64_MAX), ("len",)])
                    yield ("advance", -rng.choice([1, 5, 10, 39]))
                elif which < 0.5:
                    yield ("stats",)
                elif which < 0.7:
                    yield ("len",)
                else:
                    inner = rng.choice([("claim", "w1", 5, OMIT), ("stats",), ("publish", "g0", "x", OMIT)]
                                       + ([("extend", recent, 3), ("nack", recent, 3), ("nack", recent, 0),
                                           ("ack", recent)] if n_leases else []))
                    yield ("badclock", rng.randrange(len(BAD_CLOCK_VALUES)), inner)
            n_leases = len(harness.leases)


def run(harness: Harness, seed: int, count: int, groups: int) -> None:
    events: list[Any] = []
    for op in random_ops(seed, count, groups, events, harness):
        harness.apply(op)
        if len(events) > 10_000:
            del events[:5_000]  # the transports keep what they still hold
    harness.check_len()
    final = harness.apply(("stats",))
    assert final is not None


@pytest.mark.parametrize("seed", range(LONG_SEEDS))
def test_seeded_random_pure_vs_cython(seed: int) -> None:
    harness = Harness([impl_side("py"), impl_side("c")], keep_leases=256)
    run(harness, seed, OPS_PER_SEED, groups=[7, 40, 300, 2000, 20000][seed % 5])
    assert harness.count >= OPS_PER_SEED


@pytest.mark.parametrize("seed", range(6))
def test_seeded_random_against_referee(seed: int) -> None:
    harness = Harness(refereed_sides(), keep_leases=64)
    run(harness, 1000 + seed, 5000, groups=[3, 8, 20, 50, 5, 12][seed])
    assert harness.count >= 5000
