"""The SPEC's bad-input table, row by row, for every method, on both
implementations.

Each case runs the same history on two transports, makes the bad call on
one of them, checks the exception type, then compares everything observable
about the two (``len``, ``stats()``, which claims succeed next and in which
order, the drain order: ``helpers.fingerprint``).  The clock is made to
raise during the bad call, so an argument error also proves that arguments
are validated before the clock is read (docs/decisions.md).
"""

from __future__ import annotations

import importlib
import math
import os
from contextlib import nullcontext
from decimal import Decimal
from fractions import Fraction
from types import ModuleType
from typing import Any, Callable

import pytest

from helpers import INT64_MAX, INT64_MIN, fingerprint
from leasequeue.testing import ManualClock, ReferenceLease

import leasequeue

NAN = float("nan")


class ClockTouched(Exception):
    """Raised by the clock during a call that must fail before reading it."""


def history(t: Any, clock: ManualClock) -> dict[str, Any]:
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
                  ("referee-lease", ReferenceLease(1, "a", "a1", "w", 1010.0, 1))):
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
    clocks = [ManualClock(), ManualClock()]
    subject, control = (make_transport(clock=c) for c in clocks)
    leases = history(subject, clocks[0])
    history(control, clocks[1])
    reads = clocks[0].reads
    with clocks[0].misbehave(clock_during_call) if clock_during_call is not None else nullcontext():
        with pytest.raises(error):
            call(subject, leases)
    if isinstance(clock_during_call, ClockTouched):
        assert clocks[0].reads == reads, "the clock was read before the arguments were checked"
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
    """decisions.md: the type check is against *this* implementation's Lease;
    if both ever share one class, a foreign lease is simply not current."""
    other = other_module(impl)
    if other is None:
        pytest.skip("only one implementation available")
    foreign_clock = ManualClock()
    foreign = history(other.InMemoryTransport(clock=foreign_clock), foreign_clock)["current"]
    error = leasequeue.LeaseLost if other.Lease is impl.Lease else TypeError
    for call in (
        lambda t, l: t.ack(foreign),
        lambda t, l: t.nack(foreign),
        lambda t, l: t.nack(foreign, 3),
        lambda t, l: t.extend(foreign, 3),
    ):
        assert_changes_nothing(make_transport, call, error)


@pytest.mark.parametrize(
    "call",
    [
        lambda t, l: t.publish("new", "e", priority=INT64_MAX),
        lambda t, l: t.publish("new", "e", priority=INT64_MIN),
        lambda t, l: t.claim("w", 10, min_priority=INT64_MAX),
        lambda t, l: t.claim("w", 10, min_priority=INT64_MIN),
        lambda t, l: t.claim("w", math.inf),
        lambda t, l: t.claim("w", 10**400),
        lambda t, l: t.claim("w", 0),
        lambda t, l: t.claim("w", -0.0),
        lambda t, l: t.extend(l["current"], math.inf),
        lambda t, l: t.nack(l["current"], math.inf),
        lambda t, l: t.nack(l["current"], -0.0),
        lambda t, l: t.publish("", "e"),
        lambda t, l: t.claim("", 1),
    ],
    ids=["prio-max", "prio-min", "floor-max", "floor-min", "vis-inf", "vis-huge-int", "vis-0", "vis-neg0",
         "extend-inf", "nack-inf", "nack-neg0", "empty-group", "empty-worker"],
)
def test_edge_values_accepted(make_transport: Callable[..., Any], call: Call) -> None:
    clock = ManualClock()
    t = make_transport(clock=clock)
    leases = history(t, clock)
    call(t, leases)  # must not raise


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
