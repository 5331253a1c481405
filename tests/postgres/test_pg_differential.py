"""PostgresTransport against the referee (Part 1), on an injected manual clock.

Seeded random operations -- publish, claim, ack/nack/extend of current and
stale leases, bad arguments, a misbehaving clock, clock jumps both ways,
stats, len, and the batches (against successive calls on the referee) -- go
to the referee (``tests/referee.py``) and to a PostgresTransport on a fresh
queue; every result and every exception type
must agree.  Events are compared by ``==`` (the backend stores them
serialized), everything else as in the in-memory differential.  Forged and
foreign leases are left out: a durable backend names a delivery by its
fields (see ``docs/postgres.md``), which ``test_pg_rules`` covers.

``LEASEQUEUE_PG_DIFF_OPS`` operations per seed (1500), ``LEASEQUEUE_PG_DIFF_SEEDS``
seeds (4).
"""

from __future__ import annotations

import math
import os
import random
from typing import Any, List, Tuple

import pytest

from leasequeue import LeaseLost
from referee import INT64_MAX, INT64_MIN, Referee, ScriptedClock

OPS = int(os.environ.get("LEASEQUEUE_PG_DIFF_OPS", "1500"))
SEEDS = int(os.environ.get("LEASEQUEUE_PG_DIFF_SEEDS", "4"))
NAN = float("nan")
OMIT = object()


class Name(str):
    """A str subclass: ids must come back as exact str."""


class Seconds(float):
    pass


BAD_CLOCK = [RuntimeError("clock broke"), NAN, "noon", True, math.inf, -math.inf, None, 10**400,
             1500, Seconds(1234.5), 2**70, -5.0]


def bad_calls() -> List[Any]:
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


BAD = bad_calls()
GROUPS = ["a", "b", "c", "d", "e", Name("a")]
WORKERS = ["w1", "w2", "w3", Name("w2"), ""]
PRIORITIES = [OMIT, 0, 0, 1, 2, -1, INT64_MAX, INT64_MIN]
FLOORS = [OMIT, 0, 1, 2, -1, INT64_MIN, INT64_MAX]
VISIBILITIES = [0, 0.0, -0.0, 1, 2.5, 5, 10, 30, math.inf, 10**400]
DELAYS = [OMIT, 0, 0.0, 1, 3.5, 10, math.inf]
STEPS = [0, 0.5, 1, 2.5, 5, 10, 11, 31, 100, -1, -5, -40]


def normalize(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return ("int", type(value).__name__, value)
    if hasattr(value, "attempt"):
        return ("lease", value.seq, value.group_id, value.event, value.worker_id, value.expires_at,
                value.attempt, type(value.group_id).__name__, type(value.worker_id).__name__,
                type(value.expires_at).__name__)
    if isinstance(value, tuple):  # stats
        return ("stats", tuple(value)[:4], tuple(type(x).__name__ for x in value)[:4])
    return ("other", repr(value))


class Pair:
    def __init__(self, make_pg: Any) -> None:
        self.clocks = [ScriptedClock(), ScriptedClock()]
        self.sides = [Referee(self.clocks[0]), make_pg(clock=self.clocks[1])]
        self.leases: List[Tuple[Any, Any]] = []
        self.log: List[str] = []

    def perform(self, i: int, op: Tuple[Any, ...]) -> Any:
        t, clock = self.sides[i], self.clocks[i]
        kind = op[0]
        if kind == "publish":
            return t.publish(op[1], op[2]) if op[3] is OMIT else t.publish(op[1], op[2], op[3])
        if kind == "claim":
            return t.claim(op[1], op[2]) if op[3] is OMIT else t.claim(op[1], op[2], op[3])
        if kind == "ack":
            return t.ack(self.leases[op[1]][i])
        if kind == "nack":
            lease = self.leases[op[1]][i]
            return t.nack(lease) if op[2] is OMIT else t.nack(lease, op[2])
        if kind == "extend":
            return t.extend(self.leases[op[1]][i], op[2])
        if kind == "bad":
            return BAD[op[1]](t, self.leases[op[2]][i] if self.leases else None)
        if kind == "advance":
            clock.advance(op[1])
            return None
        if kind == "badclock":
            clock.bad = BAD_CLOCK[op[1]]
            try:
                return self.perform(i, op[2])
            finally:
                clock.behave()
        if kind == "claim_many":  # the referee: successive claims at one time
            _, worker, visibility, count, floor = op
            if i == 0:
                out = []
                while len(out) < count and (lease := t.claim(worker, visibility, floor)) is not None:
                    out.append(lease)
                return out
            return t.claim_many(worker, visibility, count, floor)
        if kind == "ack_many":  # the referee: ack each, keep the ones that were not current
            leases = [self.leases[j][i] for j in op[1]]
            if i == 0:
                lost = []
                for lease in leases:
                    try:
                        t.ack(lease)
                    except LeaseLost:
                        lost.append(lease)
                return [("lost", op[1][leases.index(x)]) for x in lost]
            return [("lost", op[1][leases.index(x)]) for x in t.ack_many(leases)]
        if kind == "publish_many":
            if i == 0:
                return [t.publish(*item) for item in op[1]]
            return t.publish_many(op[1])
        if kind == "stats":
            return t.stats()
        if kind == "len":
            return len(t)
        raise AssertionError(op)

    def apply(self, op: Tuple[Any, ...]) -> Any:
        self.log.append(repr(tuple("<default>" if x is OMIT else x for x in op)))
        outcomes, results = [], []
        for i in range(2):
            try:
                result = self.perform(i, op)
            except Exception as exc:
                outcomes.append(("raise", type(exc).__name__))
                results.append(None)
            else:
                if isinstance(result, list):
                    outcomes.append(("list", tuple(normalize(x) for x in result)))
                else:
                    outcomes.append(normalize(result))
                results.append(result)
        if outcomes[0] != outcomes[1]:
            tail = "\n  ".join(self.log[-25:])
            raise AssertionError(
                f"operation #{len(self.log)} disagrees:\n  referee : {outcomes[0]!r}\n  postgres: {outcomes[1]!r}"
                f"\nlast operations:\n  {tail}"
            )
        if outcomes[0] is not None and outcomes[0][0] == "lease":
            self.leases.append((results[0], results[1]))
        if outcomes[0] is not None and outcomes[0][0] == "list":
            for a, b in zip(results[0], results[1]):
                if hasattr(a, "attempt"):
                    self.leases.append((a, b))
        return outcomes[0]


def random_op(rng: random.Random, pair: Pair, n: int) -> Tuple[Any, ...]:
    has = bool(pair.leases)
    j = rng.randrange(len(pair.leases)) if has else 0
    if has and rng.random() < 0.6:  # favour recent leases: most are still current
        j = max(0, len(pair.leases) - 1 - int(rng.expovariate(0.5)))
    r = rng.random()
    if r < 0.25:
        return ("publish", rng.choice(GROUPS), ("ev", n), rng.choice(PRIORITIES))
    if r < 0.45:
        return ("claim", rng.choice(WORKERS), rng.choice(VISIBILITIES), rng.choice(FLOORS))
    if r < 0.55 and has:
        return ("ack", j)
    if r < 0.62 and has:
        return ("nack", j, rng.choice(DELAYS))
    if r < 0.68 and has:
        return ("extend", j, rng.choice(VISIBILITIES))
    if r < 0.75:
        return ("bad", rng.randrange(len(BAD)), j)
    if r < 0.85:
        return ("advance", rng.choice(STEPS))
    if r < 0.9:
        inner = rng.choice([
            ("claim", "w1", 5, OMIT), ("stats",), ("extend", j, 5) if has else ("stats",),
            ("nack", j, 5) if has else ("stats",), ("nack", j, 0) if has else ("len",),
            ("ack", j) if has else ("len",), ("publish", "b", ("bad", n), OMIT), ("len",),
        ])
        return ("badclock", rng.randrange(len(BAD_CLOCK)), inner)
    if r < 0.93:
        return ("claim_many", rng.choice(WORKERS[:3]), rng.choice([1, 5, 30]), rng.choice([0, 1, 2, 3, 8]),
                rng.choice([0, -1, 1, INT64_MIN]))
    if r < 0.94 and has:
        return ("ack_many", [max(0, len(pair.leases) - 1 - rng.randrange(6)) for _ in range(rng.randrange(5))])
    if r < 0.95:
        return ("publish_many", [(rng.choice(GROUPS[:5]), ("m", n, k)) + ((rng.choice([0, 1, 2]),) if k % 2 else ())
                                 for k in range(rng.randrange(4))])
    if r < 0.97:
        return ("stats",)
    return ("len",)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_operations_agree_with_referee(make_pg: Any, seed: int) -> None:
    rng = random.Random(seed)
    pair = Pair(make_pg)
    for n in range(OPS):
        pair.apply(random_op(rng, pair, n))
    # Drain: everything left comes out in the same order, far in the future.
    pair.apply(("advance", 1e6))
    for _ in range(400):
        outcome = pair.apply(("claim", "drain", 1.0, INT64_MIN))
        if outcome is None:
            break
        pair.apply(("ack", len(pair.leases) - 1))
    pair.apply(("len",))  # what is left (locks that never end) agrees too
    pair.apply(("stats",))
    assert len(pair.log) > OPS


def test_scenario_round_robin_and_expiry(make_pg: Any) -> None:
    """A fixed scenario with known answers, so a shared mistake of referee and
    backend cannot hide: round robin by claim order in one clock tick."""
    pair = Pair(make_pg)
    for n, g in enumerate("aabbc"):
        pair.apply(("publish", g, ("ev", n), OMIT))
    got = [pair.apply(("claim", "w1", 10, OMIT)) for _ in range(4)]
    assert [x[2] for x in got[:3]] == ["a", "b", "c"] and got[3] is None
    pair.apply(("nack", 0, OMIT))  # a's head back, keeps a's place (claimed first)
    pair.apply(("ack", 1))  # b's next message is free
    nxt = pair.apply(("claim", "w2", 10, OMIT))
    assert (nxt[2], nxt[1], nxt[6]) == ("a", 1, 2)
    pair.apply(("advance", 10))
    assert pair.apply(("claim", "w3", 10, OMIT))[2] == "b"
    pair.apply(("advance", 0.5))  # strictly after a's and c's lease ends
    assert pair.apply(("claim", "w3", 10, OMIT))[2] == "c"
