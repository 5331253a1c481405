"""Differential tests: ``SQLiteTransport`` and the referee (``tests/referee.py``,
the seed's algorithm with the SPEC's differences) driven with the same
operations on a manual clock must agree on every result and exception.

Events are serialized by the SQLite transport, so they are compared by
``==`` (the kit's ``preserves_identity=False``), not by identity.  Two kinds
of operation are left out because the SQLite transport answers them
differently *by design* (see docs/sqlite.md): a lease rebuilt from its fields
is accepted (any process may ack a lease it rebuilt), and so the referee's
"forged lease" and "lease of another instance" operations are tested on their
own in ``test_sqlite_rules.py``.

Environment knobs: ``LEASEQUEUE_SQLITE_DIFF_OPS`` operations per seed (3000),
``LEASEQUEUE_SQLITE_DIFF_EXAMPLES`` hypothesis examples (60).
"""

from __future__ import annotations

import math
import os
import random
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from leasequeue import SQLiteTransport
from referee import INT64_MAX, INT64_MIN, Referee, ScriptedClock

OPS_PER_SEED = int(os.environ.get("LEASEQUEUE_SQLITE_DIFF_OPS", "3000"))
EXAMPLES = int(os.environ.get("LEASEQUEUE_SQLITE_DIFF_EXAMPLES", "60"))
OMIT = object()
NAN = float("nan")


class Name(str):
    """A str subclass: ids must come back as exact str."""


class Seconds(float):
    """A float subclass a clock may return."""


BAD_CLOCK_VALUES = [RuntimeError("clock broke"), NAN, "noon", True, math.inf, -math.inf, None, 10**400,
                    1500, Seconds(1234.5), 2**70, -5.0]


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


class Side:
    def __init__(self, name: str, transport: Any, clock: ScriptedClock) -> None:
        self.name = name
        self.transport = transport
        self.clock = clock


def normalize(value: Any) -> Any:
    """A result as comparable data: leases field by field (exact types), events by ==."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return ("int", type(value).__name__, value)
    if hasattr(value, "attempt"):
        return (
            "lease", value.seq, value.group_id, value.event, value.worker_id, value.expires_at, value.attempt,
            type(value.seq).__name__, type(value.group_id).__name__, type(value.worker_id).__name__,
            type(value.expires_at).__name__, type(value.attempt).__name__,
        )
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # stats: the referee's has no `paused` use
        return ("stats", tuple((type(x).__name__, x) for x in value))
    return ("other", repr(value))


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
    raise AssertionError(f"unknown operation {op!r}")


class Harness:
    """Applies each operation to the referee and the SQLite transport."""

    def __init__(self, path: str, keep_leases: int = 0) -> None:
        ref_clock, sq_clock = ScriptedClock(), ScriptedClock()
        self.sides = [
            Side("referee", Referee(ref_clock), ref_clock),
            Side("sqlite", SQLiteTransport(path, clock=sq_clock), sq_clock),
        ]
        self.leases: list[tuple[Any, ...]] = []
        self.keep = keep_leases
        self.count = 0
        self.last: Any = None
        self.history: list[tuple[Any, ...]] = []

    def close(self) -> None:
        self.sides[1].transport.close()

    def apply(self, op: tuple[Any, ...]) -> Any:
        self.count += 1
        self.history.append(op)
        outcomes, results = [], []
        for index, side in enumerate(self.sides):
            try:
                result = perform(side, op, self.leases, index)
            except Exception as exc:
                outcomes.append(("raise", type(exc).__name__))
                results.append(None)
            else:
                outcomes.append(normalize(result))
                results.append(result)
        if outcomes[0] != outcomes[1]:
            recent = "\n".join(f"    {describe(o)}" for o in self.history[-25:])
            raise AssertionError(
                f"operation #{self.count} {describe(op)} disagrees:\n"
                f"  referee: {outcomes[0]!r}\n  sqlite : {outcomes[1]!r}\n  last operations:\n{recent}"
            )
        if outcomes[0] is not None and outcomes[0][0] == "lease":
            self.leases.append(tuple(results))
            if self.keep and len(self.leases) > self.keep:
                del self.leases[: len(self.leases) - self.keep]
        self.last = outcomes[0]
        return outcomes[0]

    def check_len(self) -> None:
        assert len(self.sides[0].transport) == len(self.sides[1].transport)


def describe(op: tuple[Any, ...]) -> str:
    if op[0] == "bad":
        return f"bad call #{op[1]} (lease {op[2]})"
    if op[0] == "badclock":
        return f"with clock -> {BAD_CLOCK_VALUES[op[1]]!r}: {describe(op[2])}"
    return repr(tuple("<default>" if x is OMIT else x for x in op))


GROUPS = ["a", "b", "c", "d", "e", Name("a")]
WORKERS = ["w1", "w2", "w3", Name("w2"), ""]
PRIORITIES = [OMIT, 0, 0, 1, 2, -1, INT64_MAX, INT64_MIN]
MIN_PRIORITIES = [OMIT, 0, 1, 2, -1, INT64_MIN, INT64_MAX]
VISIBILITIES = [0, 0.0, -0.0, 1, 2.5, 5, 10, 30, math.inf, 10**400]
DELAYS = [OMIT, 0, 0.0, -0.0, 1, 3.5, 10, math.inf]
STEPS = [0, 0.5, 1, 2.5, 5, 10, 11, 31, 100, 1e6, -1, -5, -40]


class SQLiteDifferential(RuleBasedStateMachine):
    """Referee and SQLite transport under one random operation stream."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = tempfile.TemporaryDirectory()
        self.h = Harness(os.path.join(self.dir.name, "q.db"))
        self.events = 0

    def teardown(self) -> None:
        self.h.close()
        self.dir.cleanup()

    def lease_index(self, i: int) -> int:
        return i % len(self.h.leases)

    @rule(group=st.sampled_from(GROUPS), priority=st.sampled_from(PRIORITIES))
    def publish(self, group: str, priority: Any) -> None:
        self.events += 1
        self.h.apply(("publish", group, ("event", self.events), priority))

    @rule(worker=st.sampled_from(WORKERS), visibility=st.sampled_from(VISIBILITIES),
          floor=st.sampled_from(MIN_PRIORITIES))
    def claim(self, worker: str, visibility: Any, floor: Any) -> None:
        self.h.apply(("claim", worker, visibility, floor))

    @rule(visibility=st.sampled_from([1, 5, 10]), data=st.data())
    def claim_and_settle(self, visibility: float, data: st.DataObject) -> None:
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

    @rule(k=st.integers(0, len(BAD_CALLS) - 1), i=st.integers(0, 1000))
    def bad_input(self, k: int, i: int) -> None:
        self.h.apply(("bad", k, self.lease_index(i) if self.h.leases else 0))

    @rule(step=st.sampled_from(STEPS))
    def advance(self, step: float) -> None:
        self.h.apply(("advance", step))

    @rule(step=st.sampled_from([2, 6, 11, 40]), back=st.sampled_from([1, 5, 10, 39]),
          observe=st.sampled_from(["stats", "claim-nothing", "none"]))
    def observe_then_rewind(self, step: float, back: float, observe: str) -> None:
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
            ("nack", j, 0) if has else ("len",),
            ("ack", j) if has else ("len",),
            ("publish", "b", ("event", -1), OMIT),
            ("len",),
        ][which]
        self.h.apply(("badclock", mode, inner))

    @rule()
    def stats(self) -> None:
        self.h.apply(("stats",))

    @invariant()
    def same_len(self) -> None:
        self.h.check_len()


TestSQLiteDifferential = SQLiteDifferential.TestCase
TestSQLiteDifferential.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def random_ops(seed: int, count: int, groups: int, harness: Harness) -> Any:
    """A seeded stream of operations in phases (filling, draining, churning)."""
    rng = random.Random(seed)
    names = [f"g{i}" for i in range(groups)] + [Name("g0"), Name("g1")]
    ops_left = count
    n = 0
    while ops_left > 0:
        phase = rng.choice(["fill", "drain", "churn", "churn", "time"])
        weights = {
            "fill": [60, 20, 5, 5, 2, 2, 2, 2],
            "drain": [5, 45, 30, 8, 4, 2, 3, 1],
            "churn": [25, 30, 20, 10, 6, 2, 3, 2],
            "time": [10, 30, 10, 10, 10, 2, 24, 2],
        }[phase]
        for _ in range(min(ops_left, rng.randint(20, 400))):
            ops_left -= 1
            n_leases = len(harness.leases)
            kind = rng.choices(["publish", "claim", "ack", "nack", "extend", "bad", "advance", "misc"], weights)[0]
            recent = max(0, n_leases - rng.randint(1, 4)) if rng.random() < 0.7 else rng.randrange(max(1, n_leases))
            if kind == "publish":
                n += 1
                yield ("publish", rng.choice(names), rng.choice([n, ("t", n), {"n": n}, [n, "x"], None]),
                       rng.choice(PRIORITIES))
            elif kind == "claim":
                yield ("claim", rng.choice(WORKERS), rng.choice([0, 1, 2.5, 5, 10, 30, 30, math.inf]),
                       rng.choice(MIN_PRIORITIES))
            elif n_leases == 0 and kind in ("ack", "nack", "extend"):
                yield ("stats",)
            elif kind == "ack":
                yield ("ack", recent)
            elif kind == "nack":
                yield ("nack", recent, rng.choice(DELAYS))
            elif kind == "extend":
                yield ("extend", recent, rng.choice([0, 1, 5, 30]))
            elif kind == "bad":
                yield ("bad", rng.randrange(len(BAD_CALLS)), recent)
            elif kind == "advance":
                yield ("advance", rng.choice(STEPS))
            else:
                which = rng.random()
                if which < 0.3:
                    yield ("stats",)
                elif which < 0.5:
                    yield ("len",)
                else:
                    inner = rng.choice([("claim", "w1", 5, OMIT), ("stats",), ("publish", "g0", "x", OMIT)]
                                       + ([("extend", recent, 3), ("nack", recent, 3), ("ack", recent)]
                                          if n_leases else []))
                    yield ("badclock", rng.randrange(len(BAD_CLOCK_VALUES)), inner)


@pytest.mark.parametrize("seed", range(4))
def test_seeded_random_against_referee(seed: int, tmp_path: Any) -> None:
    harness = Harness(str(tmp_path / "q.db"), keep_leases=64)
    try:
        for op in random_ops(2000 + seed, OPS_PER_SEED, harness=harness, groups=[3, 12, 40, 7][seed]):
            harness.apply(op)
        harness.check_len()
        harness.apply(("stats",))
        assert harness.count >= OPS_PER_SEED
    finally:
        harness.close()


def test_state_survives_reopening(tmp_path: Any) -> None:
    """The referee's state equals what a *new* transport on the same file sees:
    nothing lives only in the process that wrote it."""
    path = str(tmp_path / "q.db")
    harness = Harness(path, keep_leases=64)
    try:
        for op in random_ops(77, 1500, harness=harness, groups=9):
            harness.apply(op)
    finally:
        harness.close()
    clock = harness.sides[1].clock
    with SQLiteTransport(path, clock=clock) as again:
        harness.sides[1].transport = again
        for op in random_ops(78, 1500, harness=harness, groups=9):
            harness.apply(op)
        harness.check_len()
