"""The contract's bad-input table, row by row, for every Part 1 method
(``BadInputRules``) and for Part 5's new arguments (``Part5BadInputRules``).

Each case runs the same history on two transports, makes the bad call on
one of them, checks the exception type, then compares everything observable
about the two (``fingerprint``: ``len``, ``stats()``, which claims succeed
next and in which order, the drain order).  The clock is made to raise
during the bad call, so an argument error also proves that arguments are
checked before the clock is read (docs/decisions.md).  Edge values that are
*accepted* are checked for what they do.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable, Dict, List, NamedTuple

import pytest

from .._errors import LeaseLost
from ._contract_base import ContractBase, ContractClock, MakeTransport, fingerprint, requires
from ._reference import INT64_MAX, INT64_MIN

__all__ = ["BadInputRules", "ClockTouched", "Part5BadInputRules", "assert_changes_nothing", "bad_input_history"]

NAN = float("nan")


class ClockTouched(Exception):
    """Raised by the clock during a call that must fail before reading it."""


class LookalikeLease(NamedTuple):
    """Has every field of a lease, but is not one: ``TypeError``."""

    seq: int
    group_id: str
    event: Any
    worker_id: str
    expires_at: float
    attempt: int


def bad_input_history(t: Any, clock: ContractClock) -> Dict[str, Any]:
    """A little of everything: a current lease (b), a stale one (a's first
    delivery), a parked group (d, until 1100), a never-claimed group below
    the default floor (c, priority -2).  The clock ends at 1005."""
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


Call = Callable[[Any, Dict[str, Any]], Any]

#: (call, expected exception) rows; every call is invalid before the clock.
ARGUMENT_ROWS: List[Any] = []


def _row(id: str, call: Callable[..., Any], error: type) -> None:
    ARGUMENT_ROWS.append(pytest.param(call, error, id=id))


def _build_rows() -> None:
    name: str
    bad: Any
    # group_id / worker_id not a str -> TypeError
    for name, bad in (("int", 5), ("none", None), ("bytes", b"g"), ("list", ["g"])):
        _row(f"publish-group_id-{name}", lambda t, l, bad=bad: t.publish(bad, "e"), TypeError)
        _row(f"claim-worker_id-{name}", lambda t, l, bad=bad: t.claim(bad, 10), TypeError)
    # worker_id == "__parked__" -> ValueError
    _row("claim-worker_id-parked-sentinel", lambda t, l: t.claim("__parked__", 10), ValueError)
    # priority / min_priority not an int (bool rejected) -> TypeError
    for name, bad in (("float", 1.0), ("str", "1"), ("true", True), ("false", False), ("none", None),
                      ("decimal", Decimal(1)), ("fraction", Fraction(1))):
        _row(f"publish-priority-{name}", lambda t, l, bad=bad: t.publish("a", "e", bad), TypeError)
        _row(f"claim-min_priority-{name}", lambda t, l, bad=bad: t.claim("w", 10, bad), TypeError)
    # priority / min_priority outside int64 -> OverflowError
    for name, bad in (("2**63", INT64_MAX + 1), ("-2**63-1", INT64_MIN - 1), ("10**30", 10**30)):
        _row(f"publish-priority-{name}", lambda t, l, bad=bad: t.publish("new", "e", priority=bad), OverflowError)
        _row(f"claim-min_priority-{name}", lambda t, l, bad=bad: t.claim("w", 10, min_priority=bad), OverflowError)
    # visibility / delay not an int or float (bool rejected) -> TypeError
    for name, bad in (("str", "10"), ("true", True), ("false", False), ("none", None),
                      ("decimal", Decimal(1)), ("complex", 1j), ("list", [1])):
        _row(f"claim-visibility-{name}", lambda t, l, bad=bad: t.claim("w", bad), TypeError)
        _row(f"extend-visibility-{name}", lambda t, l, bad=bad: t.extend(l["current"], bad), TypeError)
        _row(f"nack-delay-{name}", lambda t, l, bad=bad: t.nack(l["current"], bad), TypeError)
    # visibility / delay negative or NaN -> ValueError
    for name, bad in (("-1", -1), ("-tiny", -1e-300), ("nan", NAN), ("-inf", -math.inf), ("-huge-int", -(10**400))):
        _row(f"claim-visibility-{name}", lambda t, l, bad=bad: t.claim("w", bad), ValueError)
        _row(f"extend-visibility-{name}", lambda t, l, bad=bad: t.extend(l["current"], bad), ValueError)
        _row(f"nack-delay-{name}", lambda t, l, bad=bad: t.nack(l["current"], bad), ValueError)
    # ack/nack/extend given something that is not a Lease -> TypeError
    for name, bad in (("none", None), ("tuple", (1, "a", "a1", "w", 1010.0, 1)), ("int", 1),
                      ("lookalike-lease", LookalikeLease(1, "a", "a1", "w", 1010.0, 1))):
        _row(f"ack-{name}", lambda t, l, bad=bad: t.ack(bad), TypeError)
        _row(f"nack-{name}", lambda t, l, bad=bad: t.nack(bad), TypeError)
        _row(f"nack-park-{name}", lambda t, l, bad=bad: t.nack(bad, 5), TypeError)
        _row(f"extend-{name}", lambda t, l, bad=bad: t.extend(bad, 5), TypeError)
    # signature order: the first bad argument decides, each fully checked in turn
    _row("publish-order-group-first", lambda t, l: t.publish(5, "e", "x"), TypeError)
    _row("claim-order-worker-first", lambda t, l: t.claim(5, -1, "x"), TypeError)
    _row("claim-order-sentinel-before-visibility", lambda t, l: t.claim("__parked__", "x", "x"), ValueError)
    _row("claim-order-visibility-value-before-min_priority-type", lambda t, l: t.claim("w", -1, "x"), ValueError)
    _row("claim-order-visibility-before-min_priority-overflow", lambda t, l: t.claim("w", NAN, 2**64), ValueError)
    _row("nack-order-lease-before-delay", lambda t, l: t.nack(None, "x"), TypeError)
    _row("extend-order-lease-before-visibility", lambda t, l: t.extend("x", -1), TypeError)
    _row("nack-order-delay-before-currency", lambda t, l: t.nack(l["stale"], -1), ValueError)
    _row("extend-order-visibility-before-currency", lambda t, l: t.extend(l["stale"], NAN), ValueError)
    _row("extend-order-visibility-type-before-currency", lambda t, l: t.extend(l["stale"], "x"), TypeError)


_build_rows()


def _ids(leases: List[Any]) -> List[Any]:
    return [(x.group_id, x.seq, x.attempt) for x in leases]


def _check_prio_max(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    assert result == 6
    assert t.claim("w", 10, min_priority=INT64_MAX).group_id == "new"


def _check_prio_min(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    assert result == 6
    assert _ids(ContractBase.claim_all(t, min_priority=INT64_MIN + 1)) == [("c", 4, 1), ("a", 1, 2)]
    assert t.claim("w", 10, min_priority=INT64_MIN).group_id == "new"


def _check_floor_max(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    assert result is None
    assert t.stats() == (5, 4, 1, 1, 0, 0, 0)


def _check_floor_min(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    assert (result.group_id, result.seq, result.attempt, result.expires_at) == ("c", 4, 1, 1015.0)


def _check_vis_inf(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    assert (result.group_id, result.seq, result.attempt, result.expires_at) == ("a", 1, 2, math.inf)
    clock.advance(1e300)
    assert t.claim("w", 10, min_priority=INT64_MIN).group_id == "c"  # b, d expired; a held forever
    assert _ids(ContractBase.claim_all(t)) == [("b", 3, 2), ("d", 5, 2)]


def _check_vis_zero(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    assert (result.group_id, result.seq, result.attempt, result.expires_at) == ("a", 1, 2, 1005.0)
    assert t.stats().leased == 2  # expires_at == now: still leased
    clock.advance(0.001)
    assert t.stats().leased == 1
    assert (t.claim("w", 10).group_id, t.claim("w", 10)) == ("a", None)


def _check_extend_inf(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    assert (result.group_id, result.seq, result.attempt, result.expires_at) == ("b", 3, 1, math.inf)
    clock.advance(1e300)
    assert t.stats() == (5, 4, 1, 0, 0, 0, 0)
    t.ack(l["current"])  # the old lease names the same delivery


def _check_nack_inf(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    assert result is None
    assert t.stats() == (5, 4, 0, 2, 0, 0, 0)
    clock.advance(1e300)
    assert t.stats() == (5, 4, 0, 1, 0, 0, 0)  # d's park ended, b's never does
    assert _ids(ContractBase.claim_all(t)) == [("c", 4, 1), ("a", 1, 2), ("d", 5, 2)]


def _check_nack_neg0(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    assert result is None
    assert t.stats() == (5, 4, 0, 1, 0, 0, 0)  # b is free at once, as with nack(0)
    assert _ids(ContractBase.claim_all(t)) == [("c", 4, 1), ("a", 1, 2), ("b", 3, 2)]


def _check_empty_group(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    assert result == 6
    assert [x.group_id for x in ContractBase.claim_all(t)] == ["c", "", "a"]


def _check_empty_worker(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    assert (result.group_id, result.worker_id) == ("a", "")
    t.ack(result)


class _Int(int):
    """An ``int`` subclass: accepted as the ``int`` it is (the transports
    check it on another path than an exact ``int``)."""


EDGE_ROWS = [
    pytest.param(lambda t, l: t.publish("new", "e", priority=INT64_MAX), _check_prio_max, id="prio-max"),
    pytest.param(lambda t, l: t.publish("new", "e", priority=INT64_MIN), _check_prio_min, id="prio-min"),
    pytest.param(lambda t, l: t.claim("w", 10, min_priority=INT64_MAX), _check_floor_max, id="floor-max"),
    pytest.param(lambda t, l: t.claim("w", 10, min_priority=INT64_MIN), _check_floor_min, id="floor-min"),
    pytest.param(lambda t, l: t.publish("new", "e", priority=_Int(INT64_MAX)), _check_prio_max, id="prio-max-sub"),
    pytest.param(lambda t, l: t.publish("new", "e", priority=_Int(INT64_MIN)), _check_prio_min, id="prio-min-sub"),
    pytest.param(lambda t, l: t.claim("w", 10, min_priority=_Int(INT64_MAX)), _check_floor_max, id="floor-max-sub"),
    pytest.param(lambda t, l: t.claim("w", 10, min_priority=_Int(INT64_MIN)), _check_floor_min, id="floor-min-sub"),
    pytest.param(lambda t, l: t.claim("w", math.inf), _check_vis_inf, id="vis-inf"),
    pytest.param(lambda t, l: t.claim("w", 10**400), _check_vis_inf, id="vis-huge-int"),
    pytest.param(lambda t, l: t.claim("w", 0), _check_vis_zero, id="vis-0"),
    pytest.param(lambda t, l: t.claim("w", -0.0), _check_vis_zero, id="vis-neg0"),
    pytest.param(lambda t, l: t.extend(l["current"], math.inf), _check_extend_inf, id="extend-inf"),
    pytest.param(lambda t, l: t.nack(l["current"], math.inf), _check_nack_inf, id="nack-inf"),
    pytest.param(lambda t, l: t.nack(l["current"], -0.0), _check_nack_neg0, id="nack-neg0"),
    pytest.param(lambda t, l: t.publish("", "e"), _check_empty_group, id="empty-group"),
    pytest.param(lambda t, l: t.claim("", 1), _check_empty_worker, id="empty-worker"),
]


def assert_changes_nothing(
    new_transport: MakeTransport,
    call: Call,
    error: type,
    *,
    clock_during_call: Any = None,
    identity: bool = True,
) -> None:
    """Run ``bad_input_history`` on two transports and ``call`` on one: it
    must raise ``error`` and leave the two indistinguishable.  With
    ``clock_during_call`` the clock misbehaves during the call (raises it,
    or returns it); a ``ClockTouched`` there must not even be read."""
    clocks = [ContractClock(), ContractClock()]
    subject, control = (new_transport(c) for c in clocks)
    leases = bad_input_history(subject, clocks[0])
    bad_input_history(control, clocks[1])
    if clock_during_call is not None:
        clocks[0].bad = clock_during_call
    reads = clocks[0].reads
    with pytest.raises(error):
        call(subject, leases)
    if isinstance(clock_during_call, ClockTouched):
        assert clocks[0].reads == reads, "the clock was read before the arguments were checked"
    clocks[0].behave()
    assert fingerprint(subject, clocks[0], identity) == fingerprint(control, clocks[1], identity)


class BadInputRules(ContractBase):
    """Bad input gets a clear error and changes nothing; edge values work."""

    def assert_changes_nothing(
        self, new_transport: MakeTransport, call: Call, error: type, *, clock_during_call: Any = None
    ) -> None:
        """``assert_changes_nothing`` with this transport's identity flag."""
        assert_changes_nothing(
            new_transport, call, error, clock_during_call=clock_during_call, identity=self.preserves_identity
        )

    @pytest.mark.parametrize("call, error", ARGUMENT_ROWS)
    def test_bad_argument(self, new_transport: MakeTransport, call: Call, error: type) -> None:
        """Each row of the bad-input table: the error, raised before the clock
        is read, and nothing changed."""
        self.assert_changes_nothing(new_transport, call, error, clock_during_call=ClockTouched())

    @pytest.mark.parametrize(
        "call",
        [
            pytest.param(lambda t, l: t.ack(l["stale"]), id="ack"),
            pytest.param(lambda t, l: t.nack(l["stale"]), id="nack"),
            pytest.param(lambda t, l: t.nack(l["stale"], 7), id="nack-park"),
            pytest.param(lambda t, l: t.extend(l["stale"], 7), id="extend"),
        ],
    )
    def test_lease_not_current(self, new_transport: MakeTransport, call: Call) -> None:
        self.assert_changes_nothing(new_transport, call, LeaseLost)

    @pytest.mark.parametrize(
        "call, error",
        [
            pytest.param(lambda t, l: t.extend(l["stale"], 7), RuntimeError, id="extend"),
            pytest.param(lambda t, l: t.nack(l["stale"], 7), RuntimeError, id="nack-park"),
            pytest.param(lambda t, l: t.nack(l["stale"], 0), LeaseLost, id="nack0"),  # reads no clock
            pytest.param(lambda t, l: t.ack(l["stale"]), LeaseLost, id="ack"),  # reads no clock
        ],
    )
    def test_clock_is_read_before_currency(self, new_transport: MakeTransport, call: Call, error: type) -> None:
        """decisions.md: arguments, then the clock, then whether the lease is
        current; ``ack`` and ``nack(0)`` do not read the clock."""
        self.assert_changes_nothing(new_transport, call, error, clock_during_call=RuntimeError("clock"))

    @pytest.mark.parametrize("call, check", EDGE_ROWS)
    def test_edge_values_accepted(
        self, new_transport: MakeTransport, call: Call, check: Callable[..., None]
    ) -> None:
        """The table's edges are accepted and do what they say: the int64
        ends, +inf (and ints beyond float range) never expiring, 0 and -0.0,
        empty ids."""
        clock = ContractClock()
        t = new_transport(clock)
        leases = bad_input_history(t, clock)
        check(t, clock, leases, call(t, leases))


# -- Part 5: later, once, honest attempts ------------------------------------------
# The rows of the bad-input table for Part 5's new arguments (docs/decisions.md,
# "Part 5 ... pinned", "Arguments and the clock"), each gated by the flags of
# what it needs.  The constructor's ``dedup_window`` is not among them: how a
# transport is built is the subclass's business (``make_transport``).

_BAD_TYPES = (("str", "10"), ("true", True), ("false", False), ("none", None), ("decimal", Decimal(1)),
              ("complex", 1j), ("list", [1]))
_BAD_VALUES = (("-1", -1), ("-tiny", -1e-300), ("nan", NAN), ("-inf", -math.inf), ("-huge-int", -(10**400)))
_BAD_KEYS = (("int", 1), ("bytes", b"k"), ("list", ["k"]), ("float", 1.0), ("true", True))
_NOT_LEASES = (("none", None), ("tuple", (1, "a", "a1", "w", 1010.0, 1)), ("int", 1),
               ("lookalike-lease", LookalikeLease(3, "b", "b1", "w", 1010.0, 1)))

LATER_ROWS: List[Any] = []  # publish(delay=) (and the order with the earlier arguments)
LATER_BATCH_ROWS: List[Any] = []  # publish_many(delay=)
ONCE_ROWS: List[Any] = []  # publish(key=)
ONCE_BATCH_ROWS: List[Any] = []  # 4-tuple publish_many items
LATER_ONCE_ROWS: List[Any] = []  # delay before key
LATER_ONCE_BATCH_ROWS: List[Any] = []  # publish_many: keyed items before delay
RELEASE_ROWS: List[Any] = []  # release(lease, delay), retry(group_id)


def _build_part5_rows() -> None:
    name: str
    bad: Any

    def row(rows: List[Any], id: str, call: Callable[..., Any], error: type) -> None:
        rows.append(pytest.param(call, error, id=id))

    for name, bad in _BAD_TYPES:
        row(LATER_ROWS, f"publish-delay-{name}", lambda t, l, bad=bad: t.publish("a", "e", delay=bad), TypeError)
        row(LATER_BATCH_ROWS, f"publish_many-delay-{name}",
            lambda t, l, bad=bad: t.publish_many([("a", "e")], delay=bad), TypeError)
        row(RELEASE_ROWS, f"release-delay-{name}", lambda t, l, bad=bad: t.release(l["current"], bad), TypeError)
    for name, bad in _BAD_VALUES:
        row(LATER_ROWS, f"publish-delay-{name}", lambda t, l, bad=bad: t.publish("a", "e", delay=bad), ValueError)
        row(LATER_BATCH_ROWS, f"publish_many-delay-{name}",
            lambda t, l, bad=bad: t.publish_many([("a", "e")], delay=bad), ValueError)
        row(RELEASE_ROWS, f"release-delay-{name}",
            lambda t, l, bad=bad: t.release(l["current"], delay=bad), ValueError)
    row(LATER_ROWS, "publish-order-group-before-delay", lambda t, l: t.publish(5, "e", delay=-1), TypeError)
    row(LATER_ROWS, "publish-order-priority-before-delay", lambda t, l: t.publish("a", "e", "x", delay=-1),
        TypeError)
    row(LATER_ROWS, "publish-order-priority-range-before-delay",
        lambda t, l: t.publish("new", "e", INT64_MAX + 1, delay=NAN), OverflowError)
    row(LATER_ROWS, "publish-delay-positional", lambda t, l: t.publish("a", "e", 0, 5), TypeError)
    row(LATER_BATCH_ROWS, "publish_many-order-items-before-delay",
        lambda t, l: t.publish_many([("a", "e"), (7, "e")], delay=-1), TypeError)
    row(LATER_BATCH_ROWS, "publish_many-empty-bad-delay", lambda t, l: t.publish_many([], delay=NAN), ValueError)
    row(LATER_BATCH_ROWS, "publish_many-delay-positional", lambda t, l: t.publish_many([("a", "e")], 5), TypeError)
    for name, bad in _BAD_KEYS:
        row(ONCE_ROWS, f"publish-key-{name}", lambda t, l, bad=bad: t.publish("a", "e", key=bad), TypeError)
        row(ONCE_BATCH_ROWS, f"publish_many-key-{name}",
            lambda t, l, bad=bad: t.publish_many([("new", "e", 0, "k"), ("a", "e", 0, bad)]), TypeError)
    row(ONCE_ROWS, "publish-order-group-before-key", lambda t, l: t.publish(None, "e", key=1), TypeError)
    row(ONCE_ROWS, "publish-order-priority-before-key",
        lambda t, l: t.publish("new", "e", INT64_MIN - 1, key=1), OverflowError)
    row(ONCE_BATCH_ROWS, "publish_many-five-fields", lambda t, l: t.publish_many([("a", "e", 0, "k", None)]),
        ValueError)
    row(ONCE_BATCH_ROWS, "publish_many-keyed-bad-priority", lambda t, l: t.publish_many([("a", "e", 1.5, "k")]),
        TypeError)
    row(ONCE_BATCH_ROWS, "publish_many-keyed-priority-range",
        lambda t, l: t.publish_many([("a", "e", INT64_MAX + 1, "k")]), OverflowError)
    row(ONCE_BATCH_ROWS, "publish_many-keyed-then-bad-group",
        lambda t, l: t.publish_many([("new", "e", 0, "k"), (7, "e", 0, "k")]), TypeError)
    row(LATER_ONCE_ROWS, "publish-order-delay-before-key", lambda t, l: t.publish("a", "e", delay=-1, key=1),
        ValueError)
    row(LATER_ONCE_ROWS, "publish-order-delay-type-before-key",
        lambda t, l: t.publish("a", "e", delay="x", key="k"), TypeError)
    row(LATER_ONCE_BATCH_ROWS, "publish_many-order-keyed-items-before-delay",
        lambda t, l: t.publish_many([("a", "e", 0, 1)], delay=-1), TypeError)
    for name, bad in _NOT_LEASES:
        row(RELEASE_ROWS, f"release-{name}", lambda t, l, bad=bad: t.release(bad), TypeError)
        row(RELEASE_ROWS, f"release-park-{name}", lambda t, l, bad=bad: t.release(bad, 5), TypeError)
    row(RELEASE_ROWS, "release-order-lease-before-delay", lambda t, l: t.release(None, "x"), TypeError)
    row(RELEASE_ROWS, "release-order-delay-before-currency", lambda t, l: t.release(l["stale"], -1), ValueError)
    row(RELEASE_ROWS, "release-delay-positional-and-keyword",
        lambda t, l: t.release(l["current"], 1, delay=1), TypeError)
    for name, bad in (("int", 5), ("none", None), ("bytes", b"a"), ("list", ["a"])):
        row(RELEASE_ROWS, f"retry-group_id-{name}", lambda t, l, bad=bad: t.retry(bad), TypeError)


_build_part5_rows()


def _check_delay_zero(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    """``delay`` 0 or -0.0 is the publish of Part 1: claimable at once, no due."""
    assert result == 6
    assert t.stats() == (6, 5, 1, 1, 0, 0, 0)
    assert _ids(ContractBase.claim_all(t)) == [("c", 4, 1), ("new", 6, 1), ("a", 1, 2)]


def _check_delay_inf(t: Any, clock: ContractClock, l: Dict[str, Any], result: Any) -> None:
    """``delay`` +inf (or an int beyond float range): scheduled for ever."""
    assert result == 6
    assert t.stats() == (6, 5, 1, 1, 0, 0, 1)
    clock.advance(1e300)
    assert t.stats() == (6, 5, 0, 0, 0, 0, 1)
    assert [x.group_id for x in ContractBase.claim_all(t, min_priority=INT64_MIN)] == ["c", "a", "b", "d"]
    assert t.claim("w", 10, min_priority=INT64_MIN) is None


#: (call, reads the clock, check)
LATER_EDGE_ROWS = [
    pytest.param(lambda t, l: t.publish("new", "e", delay=0), False, _check_delay_zero, id="delay-0"),
    pytest.param(lambda t, l: t.publish("new", "e", delay=-0.0), False, _check_delay_zero, id="delay-neg0"),
    pytest.param(lambda t, l: t.publish("new", "e", delay=math.inf), True, _check_delay_inf, id="delay-inf"),
    pytest.param(lambda t, l: t.publish("new", "e", delay=10**400), True, _check_delay_inf, id="delay-huge-int"),
]


class Part5BadInputRules(ContractBase):
    """Part 5's rows of the bad-input table: ``delay`` and ``key`` of
    ``publish``, ``publish_many``'s ``delay`` and 4-tuple items, ``release``'s
    lease and delay, ``retry``'s group id; each raised before the clock is
    read, with nothing changed.  Gated by ``supports_later``,
    ``supports_once``, ``supports_release`` (and ``supports_batches`` for
    ``publish_many``)."""

    def assert_changes_nothing(
        self, new_transport: MakeTransport, call: Call, error: type, *, clock_during_call: Any = None
    ) -> None:
        """``assert_changes_nothing`` with this transport's identity flag."""
        assert_changes_nothing(
            new_transport, call, error, clock_during_call=clock_during_call, identity=self.preserves_identity
        )

    @requires("supports_later", "delayed publishes (publish(..., delay=))")
    @pytest.mark.parametrize("call, error", LATER_ROWS)
    def test_bad_delay(self, new_transport: MakeTransport, call: Call, error: type) -> None:
        self.assert_changes_nothing(new_transport, call, error, clock_during_call=ClockTouched())

    @requires("supports_later", "delayed publishes (publish_many(..., delay=))")
    @requires("supports_batches", "batches (publish_many, claim_many, ack_many)")
    @pytest.mark.parametrize("call, error", LATER_BATCH_ROWS)
    def test_bad_batch_delay(self, new_transport: MakeTransport, call: Call, error: type) -> None:
        self.assert_changes_nothing(new_transport, call, error, clock_during_call=ClockTouched())

    @requires("supports_once", "idempotency keys (publish(..., key=))")
    @pytest.mark.parametrize("call, error", ONCE_ROWS)
    def test_bad_key(self, new_transport: MakeTransport, call: Call, error: type) -> None:
        self.assert_changes_nothing(new_transport, call, error, clock_during_call=ClockTouched())

    @requires("supports_once", "idempotency keys (4-tuple publish_many items)")
    @requires("supports_batches", "batches (publish_many, claim_many, ack_many)")
    @pytest.mark.parametrize("call, error", ONCE_BATCH_ROWS)
    def test_bad_keyed_item(self, new_transport: MakeTransport, call: Call, error: type) -> None:
        self.assert_changes_nothing(new_transport, call, error, clock_during_call=ClockTouched())

    @requires("supports_later", "delayed publishes (publish(..., delay=))")
    @requires("supports_once", "idempotency keys (publish(..., key=))")
    @pytest.mark.parametrize("call, error", LATER_ONCE_ROWS)
    def test_delay_is_checked_before_the_key(self, new_transport: MakeTransport, call: Call, error: type) -> None:
        self.assert_changes_nothing(new_transport, call, error, clock_during_call=ClockTouched())

    @requires("supports_later", "delayed publishes (publish_many(..., delay=))")
    @requires("supports_once", "idempotency keys (4-tuple publish_many items)")
    @requires("supports_batches", "batches (publish_many, claim_many, ack_many)")
    @pytest.mark.parametrize("call, error", LATER_ONCE_BATCH_ROWS)
    def test_keyed_items_are_checked_before_the_delay(
        self, new_transport: MakeTransport, call: Call, error: type
    ) -> None:
        self.assert_changes_nothing(new_transport, call, error, clock_during_call=ClockTouched())

    @requires("supports_release", "release and retry")
    @pytest.mark.parametrize("call, error", RELEASE_ROWS)
    def test_bad_release_or_retry(self, new_transport: MakeTransport, call: Call, error: type) -> None:
        self.assert_changes_nothing(new_transport, call, error, clock_during_call=ClockTouched())

    @requires("supports_release", "release and retry")
    def test_release_of_a_lease_not_current(self, new_transport: MakeTransport) -> None:
        """``LeaseLost``, nothing changed, as ``nack``."""
        self.assert_changes_nothing(new_transport, lambda t, l: t.release(l["stale"]), LeaseLost)
        self.assert_changes_nothing(new_transport, lambda t, l: t.release(l["stale"], 7), LeaseLost)

    @requires("supports_release", "release and retry")
    @pytest.mark.parametrize(
        "call, error",
        [
            pytest.param(lambda t, l: t.release(l["stale"], 7), RuntimeError, id="release-park"),
            pytest.param(lambda t, l: t.release(l["stale"], 0), LeaseLost, id="release0"),  # reads no clock
            pytest.param(lambda t, l: t.retry("a"), RuntimeError, id="retry"),  # always reads the clock
            pytest.param(lambda t, l: t.retry("nope"), RuntimeError, id="retry-unknown"),
        ],
    )
    def test_release_and_retry_read_the_clock_as_pinned(
        self, new_transport: MakeTransport, call: Call, error: type
    ) -> None:
        """``release`` as ``nack``: arguments, the clock if ``delay > 0``, then
        the currency; ``retry``: the clock, always."""
        self.assert_changes_nothing(new_transport, call, error, clock_during_call=RuntimeError("clock"))

    @requires("supports_later", "delayed publishes (publish(..., delay=))")
    @pytest.mark.parametrize("call, reads_clock, check", LATER_EDGE_ROWS)
    def test_delay_edges_accepted(
        self, new_transport: MakeTransport, call: Call, reads_clock: bool, check: Callable[..., None]
    ) -> None:
        """0 and -0.0 publish as Part 1 does (reading no clock); +inf and an
        int beyond float range are never due (and read the clock once)."""
        clock = ContractClock()
        t = new_transport(clock)
        leases = bad_input_history(t, clock)
        reads = clock.reads
        if not reads_clock:
            clock.bad = ClockTouched()
        try:
            result = call(t, leases)
        finally:
            clock.behave()
        assert clock.reads - reads <= (1 if reads_clock else 0)
        check(t, clock, leases, result)
