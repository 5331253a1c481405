"""The SPEC's bad-input table, row by row, for every method, on both
implementations.

Each case runs the same history on two transports, makes the bad call on
one of them, checks the exception type, then compares everything observable
about the two (``len``, ``stats()``, which claims succeed next and in which
order, the drain order: ``referee.fingerprint``).  The clock is made to
raise during the bad call, so an argument error also proves that arguments
are validated before the clock is read (docs/decisions.md).
"""

from __future__ import annotations

import importlib
import math
import os
from decimal import Decimal
from fractions import Fraction
from types import ModuleType
from typing import Any, Callable

import pytest

from referee import INT64_MAX, INT64_MIN, RefLease, ScriptedClock, fingerprint

import leasequeue

NAN = float("nan")


class ClockTouched(Exception):
    """Raised by the clock during a call that must fail before reading it."""


def history(t: Any, clock: ScriptedClock) -> dict[str, Any]:
    """A little of everything: a current lease, a stale one, a parked group,
    a never-claimed group, a group below the default floor."""
    t.publish("a", "a1", priority=3)
    t.publish("a", "a2")
    t.publish("b", "b1")
    t.publish("c", "c1", priority=-2)
    t.publish("d", "d1")
    stale = t.claim("w", 10)  # a, attempt 1
    t.nack(stale)  # closed: stale from now on
    current = t.claim("w", 10)  # b (never claimed comes first)
    parked = t.claim("w", 10)  # d
    t.nack(parked, 100)
    clock.advance(5)
    return {"current": current, "stale": stale}


def other_module(impl: ModuleType) -> ModuleType | None:
    """The other implementation's module, when it can be imported."""
    name = "leasequeue._inmemory_c" if impl.__name__.endswith("_py") else "leasequeue._inmemory_py"
    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("LEASEQUEUE_NO_EXTENSIONS"):
            return None
        raise


Call = Callable[[Any, dict[str, Any]], Any]

#: (call, expected exception) rows; every call is invalid before the clock.
ARGUMENT_ROWS: list[Any] = []


def row(id: str, call: Call, error: type[BaseException]) -> None:
    ARGUMENT_ROWS.append(pytest.param(call, error, id=id))


# group_id / worker_id not a str -> TypeError
for name, bad in (("int", 5), ("none", None), ("bytes", b"g"), ("list", ["g"])):
    row(f"publish-group_id-{name}", lambda t, l, bad=bad: t.publish(bad, "e"), TypeError)
    row(f"claim-worker_id-{name}", lambda t, l, bad=bad: t.claim(bad, 10), TypeError)
# worker_id == "__parked__" -> ValueError
row("claim-worker_id-parked-sentinel", lambda t, l: t.claim("__parked__", 10), ValueError)
# priority / min_priority not an int (bool rejected) -> TypeError
for name, bad in (("float", 1.0), ("str", "1"), ("true", True), ("false", False), ("none", None),
                  ("decimal", Decimal(1)), ("fraction", Fraction(1))):
    row(f"publish-priority-{name}", lambda t, l, bad=bad: t.publish("a", "e", bad), TypeError)
    row(f"claim-min_priority-{name}", lambda t, l, bad=bad: t.claim("w", 10, bad), TypeError)
# priority / min_priority outside int64 -> OverflowError
for name, bad in (("2**63", INT64_MAX + 1), ("-2**63-1", INT64_MIN - 1), ("10**30", 10**30)):
    row(f"publish-priority-{name}", lambda t, l, bad=bad: t.publish("new", "e", priority=bad), OverflowError)
    row(f"claim-min_priority-{name}", lambda t, l, bad=bad: t.claim("w", 10, min_priority=bad), OverflowError)
# visibility / delay not an int or float (bool rejected) -> TypeError
for name, bad in (("str", "10"), ("true", True), ("false", False), ("none", None),
                  ("decimal", Decimal(1)), ("complex", 1j), ("list", [1])):
    row(f"claim-visibility-{name}", lambda t, l, bad=bad: t.claim("w", bad), TypeError)
    row(f"extend-visibility-{name}", lambda t, l, bad=bad: t.extend(l["current"], bad), TypeError)
    row(f"nack-delay-{name}", lambda t, l, bad=bad: t.nack(l["current"], bad), TypeError)
# visibility / delay negative or NaN -> ValueError
for name, bad in (("-1", -1), ("-tiny", -1e-300), ("nan", NAN), ("-inf", -math.inf), ("-huge-int", -(10**400))):
    row(f"claim-visibility-{name}", lambda t, l, bad=bad: t.claim("w", bad), ValueError)
    row(f"extend-visibility-{name}", lambda t, l, bad=bad: t.extend(l["current"], bad), ValueError)
    row(f"nack-delay-{name}", lambda t, l, bad=bad: t.nack(l["current"], bad), ValueError)
# ack/nack/extend given something that is not a Lease -> TypeError
for name, bad in (("none", None), ("tuple", (1, "a", "a1", "w", 1010.0, 1)), ("int", 1),
                  ("referee-lease", RefLease(1, "a", "a1", "w", 1010.0, 1))):
    row(f"ack-{name}", lambda t, l, bad=bad: t.ack(bad), TypeError)
    row(f"nack-{name}", lambda t, l, bad=bad: t.nack(bad), TypeError)
    row(f"nack-park-{name}", lambda t, l, bad=bad: t.nack(bad, 5), TypeError)
    row(f"extend-{name}", lambda t, l, bad=bad: t.extend(bad, 5), TypeError)
# signature order: the first bad argument decides, each fully checked in turn
row("publish-order-group-first", lambda t, l: t.publish(5, "e", "x"), TypeError)
row("claim-order-worker-first", lambda t, l: t.claim(5, -1, "x"), TypeError)
row("claim-order-sentinel-before-visibility", lambda t, l: t.claim("__parked__", "x", "x"), ValueError)
row("claim-order-visibility-value-before-min_priority-type", lambda t, l: t.claim("w", -1, "x"), ValueError)
row("claim-order-visibility-before-min_priority-overflow", lambda t, l: t.claim("w", NAN, 2**64), ValueError)
row("nack-order-lease-before-delay", lambda t, l: t.nack(None, "x"), TypeError)
row("extend-order-lease-before-visibility", lambda t, l: t.extend("x", -1), TypeError)
row("nack-order-delay-before-currency", lambda t, l: t.nack(l["stale"], -1), ValueError)
row("extend-order-visibility-before-currency", lambda t, l: t.extend(l["stale"], NAN), ValueError)
row("extend-order-visibility-type-before-currency", lambda t, l: t.extend(l["stale"], "x"), TypeError)


def assert_changes_nothing(
    make_transport: Callable[..., Any],
    call: Call,
    error: type[BaseException],
    *,
    clock_during_call: Any = None,
) -> None:
    """Run ``history`` on two transports, ``call`` on one: it must raise
    ``error`` and leave the two indistinguishable."""
    clocks = [ScriptedClock(), ScriptedClock()]
    subject, control = (make_transport(clock=c) for c in clocks)
    leases = history(subject, clocks[0])
    history(control, clocks[1])
    if clock_during_call is not None:
        clocks[0].bad = clock_during_call
    reads = clocks[0].reads
    with pytest.raises(error):
        call(subject, leases)
    if isinstance(clock_during_call, ClockTouched):
        assert clocks[0].reads == reads, "the clock was read before the arguments were checked"
    clocks[0].behave()
    assert fingerprint(subject, clocks[0]) == fingerprint(control, clocks[1])


@pytest.mark.parametrize("call, error", ARGUMENT_ROWS)
def test_bad_argument(make_transport: Callable[..., Any], call: Call, error: type[BaseException]) -> None:
    assert_changes_nothing(make_transport, call, error, clock_during_call=ClockTouched())


@pytest.mark.parametrize(
    "call",
    [
        lambda t, l: t.ack(l["stale"]),
        lambda t, l: t.nack(l["stale"]),
        lambda t, l: t.nack(l["stale"], 7),
        lambda t, l: t.extend(l["stale"], 7),
    ],
    ids=["ack", "nack", "nack-park", "extend"],
)
def test_lease_not_current(make_transport: Callable[..., Any], call: Call) -> None:
    assert_changes_nothing(make_transport, call, leasequeue.LeaseLost)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda t, l: t.extend(l["stale"], 7), RuntimeError),
        (lambda t, l: t.nack(l["stale"], 7), RuntimeError),
        (lambda t, l: t.nack(l["stale"], 0), leasequeue.LeaseLost),  # nack(0) reads no clock
        (lambda t, l: t.ack(l["stale"]), leasequeue.LeaseLost),  # ack reads no clock
    ],
    ids=["extend", "nack-park", "nack0", "ack"],
)
def test_clock_is_read_before_currency(make_transport: Callable[..., Any], call: Call, error: type) -> None:
    assert_changes_nothing(make_transport, call, error, clock_during_call=RuntimeError("clock"))


def test_lease_of_the_other_implementation(make_transport: Callable[..., Any], impl: ModuleType) -> None:
    """decisions.md: the type check is against *this* implementation's Lease
    (each implementation has its own class), so a lease of the other one is a
    ``TypeError``, and changes nothing."""
    other = other_module(impl)
    if other is None:
        pytest.skip("only one implementation available")
    assert other.Lease is not impl.Lease
    foreign_clock = ScriptedClock()
    foreign = history(other.InMemoryTransport(clock=foreign_clock), foreign_clock)["current"]
    for call in (
        lambda t, l: t.ack(foreign),
        lambda t, l: t.nack(foreign),
        lambda t, l: t.nack(foreign, 3),
        lambda t, l: t.extend(foreign, 3),
    ):
        assert_changes_nothing(make_transport, call, TypeError)


# -- edge values: accepted, with the effect the SPEC gives them ---------------------
# After ``history`` (clock at 1005): a (priority 3, two messages, claimed once,
# nacked: free, claimed before b and d), b (current lease until 1010), c
# (priority -2, never claimed), d (parked until 1100).  Each check makes the
# edge call and then asserts what it did.

EdgeCheck = Callable[[Any, dict[str, Any], ScriptedClock], None]
EDGE_ROWS: list[Any] = []


def edge(id: str) -> Callable[[EdgeCheck], EdgeCheck]:
    def register(check: EdgeCheck) -> EdgeCheck:
        EDGE_ROWS.append(pytest.param(check, id=id))
        return check

    return register


def groups_served(t: Any, floor: int = 0) -> list[str]:
    """Claim (infinitely) until nothing is eligible at ``floor``: the groups in order."""
    out = []
    while (lease := t.claim("probe", math.inf, floor)) is not None:
        out.append(lease.group_id)
    return out


@edge("prio-max")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    assert t.publish("new", "e", priority=INT64_MAX) == 6
    assert groups_served(t, INT64_MAX) == ["new"]


@edge("prio-min")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    assert t.publish("new", "e", priority=INT64_MIN) == 6
    assert groups_served(t, INT64_MIN + 1) == ["c", "a"]  # never-claimed c first, then a
    assert groups_served(t, INT64_MIN) == ["new"]


@edge("floor-max")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    assert t.claim("w", 10, min_priority=INT64_MAX) is None
    assert groups_served(t, 3) == ["a"]  # the empty claim changed nothing


@edge("floor-min")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    lease = t.claim("w", 10, min_priority=INT64_MIN)
    assert (lease.group_id, lease.attempt) == ("c", 1)  # never claimed: before a


@edge("vis-inf")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    lease = t.claim("w", math.inf)
    assert (lease.group_id, lease.attempt, lease.expires_at) == ("a", 2, math.inf)
    clock.advance(1e12)
    assert t.stats().leased == 1  # a's lease never expires; b's did
    assert "a" not in groups_served(t, INT64_MIN)


@edge("vis-huge-int")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    lease = t.claim("w", 10**400)
    assert (lease.group_id, lease.expires_at) == ("a", math.inf)
    clock.advance(1e12)
    assert t.stats().leased == 1


@edge("vis-0")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    lease = t.claim("w", 0)
    assert (lease.group_id, lease.expires_at) == ("a", 1005.0)
    assert t.stats().leased == 2  # expires_at == now: still live (a and b)
    assert groups_served(t) == []
    clock.advance(0.001)
    assert t.stats().leased == 1  # a's ran out at once; b's runs to 1010
    assert groups_served(t) == ["a"]


@edge("vis-neg0")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    lease = t.claim("w", -0.0)
    assert (lease.group_id, lease.expires_at) == ("a", 1005.0)
    assert math.copysign(1.0, lease.expires_at) == 1.0


@edge("extend-inf")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    lease = t.extend(l["current"], math.inf)
    assert (lease.group_id, lease.expires_at, lease.attempt) == ("b", math.inf, 1)
    clock.advance(1e12)
    assert t.stats().leased == 1
    assert "b" not in groups_served(t, INT64_MIN)
    t.ack(lease)  # still the current delivery


@edge("nack-inf")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    t.nack(l["current"], math.inf)
    assert t.stats().parked == 2  # b and d
    clock.advance(1e12)
    assert t.stats().parked == 1  # d's park ran out, b's never does
    assert "b" not in groups_served(t, INT64_MIN)


@edge("nack-neg0")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    t.nack(l["current"], -0.0)  # the same as nack(0): b is free now, its place kept
    assert t.stats().leased == 0 and t.stats().parked == 1
    assert [(x.group_id, x.attempt) for x in [t.claim("w", 10), t.claim("w", 10)]] == [("a", 2), ("b", 2)]


@edge("empty-group")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    assert t.publish("", "e") == 6
    assert t.stats().groups == 5
    assert groups_served(t) == ["", "a"]  # never claimed: first


@edge("empty-worker")
def _(t: Any, l: dict[str, Any], clock: ScriptedClock) -> None:
    lease = t.claim("", 1)
    assert (lease.group_id, lease.worker_id) == ("a", "")


@pytest.mark.parametrize("check", EDGE_ROWS)
def test_edge_values_accepted(make_transport: Callable[..., Any], check: EdgeCheck) -> None:
    clock = ScriptedClock()
    t = make_transport(clock=clock)
    check(t, history(t, clock), clock)


def test_priority_edges_order_groups(transport: Any) -> None:
    transport.publish("lo", "e", priority=INT64_MIN)
    transport.publish("hi", "e", priority=INT64_MAX)
    assert transport.claim("w", 1, min_priority=INT64_MAX).group_id == "hi"
    assert transport.claim("w", 1, min_priority=INT64_MIN + 1) is None
    assert transport.claim("w", 1, min_priority=INT64_MIN).group_id == "lo"


def test_int_subclass_priority_accepted(transport: Any) -> None:
    class Level(int):
        pass

    transport.publish("g", "e", priority=Level(4))
    assert transport.claim("w", 1, min_priority=Level(4)).group_id == "g"


def test_clock_not_callable(make_transport: Callable[..., Any]) -> None:
    for bad in (None, 1000.0, "time"):
        with pytest.raises(TypeError):
            make_transport(clock=bad)
