"""``ack_and_claim``: a job's ack and the next claim in one call.

It is exactly ``ack(lease)`` followed by a non-waiting ``claim(worker_id,
visibility, min_priority)``, as one operation: every argument checked first,
the clock read once, then a lease that is not current raises ``LeaseLost``
having changed nothing; else the ack, then the claim at that same ``now``
(expiry first, then round-robin and the floor as a claim does).  ``None``
when no group is eligible, the ack standing.  It never waits; waiting claims
get what the claim leaves; the acked event is released after the lock.
"""

from __future__ import annotations

import gc
import math
import time
from decimal import Decimal
from typing import Any, Callable, Dict, List

import pytest

from .._errors import LeaseLost, LeaseQueueError
from ._contract_base import ContractBase, ContractClock, MakeTransport, lease_key, requires
from ._reference import INT64_MAX, INT64_MIN
from ._rules_bad_input import ClockTouched, LookalikeLease, assert_changes_nothing
from ._rules_batches import TickingClock
from ._rules_core import _STALE_HISTORIES

__all__ = ["AckAndClaimRules"]

ACK_AND_CLAIM = "ack_and_claim (a job's ack and the next claim in one call)"
WAITING = "waiting claims (claim(timeout=...), aclaim, close() waking waiters)"
NAN = float("nan")

Call = Callable[[Any, Dict[str, Any]], Any]


# -- the history the equivalence cases start from ------------------------------------


_GROUPS = (("a", 0), ("b", 2), ("c", -1), ("d", 0), ("e", 5), ("f", -3))
#: One set of event objects for both transports compared (identity counts).
_EVENTS = {"a": ["a1", "a2"], "b": ["b1", "b2"], "c": ["c1"], "d": ["d1", "d2"], "e": ["e1"], "f": ["f1"]}


def _history(t: Any, clock: ContractClock) -> Dict[str, Any]:
    """Groups of every kind: ``a`` leased with a next message (until 1010),
    ``b`` claimed and nacked (free, attempt 1 closed), ``c`` leased with no
    other message (until 1010), ``d`` leased for long (until 2000) with a
    next message, ``e`` parked (until 1105), ``f`` never claimed, below
    the default floor; the priorities 0, 2, -1, 0, 5, -3.  The clock ends
    at 1005."""
    for group, priority in _GROUPS:
        for event in _EVENTS[group]:
            t.publish(group, event, priority)
    leases = {"a": t.claim("w", 10)}
    t.nack(t.claim("w", 10))  # b
    leases["c"] = t.claim("w", 10, -1)
    leases["d"] = t.claim("w", 1000)
    t.nack(t.claim("w", 10), 100)  # e
    assert [lease.group_id for lease in leases.values()] == ["a", "c", "d"]
    clock.advance(5)
    return leases


#: (the lease acked, min_priority, seconds the clock moves first)
_EQUIVALENCE = [
    pytest.param("a", 0, 0, id="the-acked-groups-next-message"),  # a was claimed before b
    pytest.param("a", 1, 0, id="floor-1"),
    pytest.param("a", 3, 0, id="floor-above-every-ready-group"),
    pytest.param("a", INT64_MIN, 0, id="floor-min-a-never-claimed-group-first"),
    pytest.param("c", -1, 0, id="the-acked-group-forgotten"),
    pytest.param("a", 0, 5, id="at-the-end-of-a-lease"),  # c's lease ends at 1010: still live
    pytest.param("a", 0, 20, id="a-lease-expired-below-the-floor"),
    pytest.param("c", -1, 20, id="an-expired-lease-first"),  # a's lease ran out: a1 again, attempt 2
    pytest.param("d", 3, 200, id="a-park-expired"),
    pytest.param("d", INT64_MAX, 200, id="floor-max"),
]


# -- bad input ----------------------------------------------------------------------------

BAD_ROWS: List[Any] = []


def _row(id: str, call: Callable[..., Any], error: Any) -> None:
    BAD_ROWS.append(pytest.param(call, error, id=id))


def _build_rows() -> None:
    bad: Any
    for name, bad in (("none", None), ("tuple", (3, "b", "b1", "w", 1010.0, 1)), ("int", 3),
                      ("lookalike-lease", LookalikeLease(3, "b", "b1", "w", 1010.0, 1))):
        _row(f"lease-{name}", lambda t, l, bad=bad: t.ack_and_claim(bad, "w", 10), TypeError)
    for name, bad in (("int", 5), ("none", None), ("bytes", b"w")):
        _row(f"worker_id-{name}", lambda t, l, bad=bad: t.ack_and_claim(l["current"], bad, 10), TypeError)
    _row("worker_id-parked-sentinel", lambda t, l: t.ack_and_claim(l["current"], "__parked__", 10), ValueError)
    for name, bad in (("str", "10"), ("true", True), ("none", None), ("decimal", Decimal(1))):
        _row(f"visibility-{name}", lambda t, l, bad=bad: t.ack_and_claim(l["current"], "w", bad), TypeError)
    for name, bad in (("-1", -1), ("-tiny", -1e-300), ("-half", -0.5), ("nan", NAN), ("-inf", -math.inf),
                      ("-huge-int", -(10**400))):
        _row(f"visibility-{name}", lambda t, l, bad=bad: t.ack_and_claim(l["current"], "w", bad), ValueError)
    for name, bad in (("float", 1.0), ("str", "1"), ("true", True), ("none", None)):
        _row(f"min_priority-{name}", lambda t, l, bad=bad: t.ack_and_claim(l["current"], "w", 10, bad), TypeError)
    for name, bad in (("2**63", INT64_MAX + 1), ("-2**63-1", INT64_MIN - 1)):
        _row(f"min_priority-{name}",
             lambda t, l, bad=bad: t.ack_and_claim(l["current"], "w", 10, min_priority=bad), OverflowError)
    # signature order, each argument fully checked before the next; all of them before currency
    _row("order-lease-first", lambda t, l: t.ack_and_claim(None, "__parked__", -1, "x"), TypeError)
    _row("order-worker-before-visibility", lambda t, l: t.ack_and_claim(l["current"], 5, -1), TypeError)
    _row("order-sentinel-before-visibility", lambda t, l: t.ack_and_claim(l["current"], "__parked__", "x"), ValueError)
    _row("order-visibility-before-min_priority", lambda t, l: t.ack_and_claim(l["current"], "w", -1, "x"), ValueError)
    _row("order-arguments-before-currency", lambda t, l: t.ack_and_claim(l["stale"], "w", NAN), ValueError)
    _row("order-worker-before-currency", lambda t, l: t.ack_and_claim(l["stale"], 5, 10), TypeError)


_build_rows()

BAD_CLOCKS = [
    pytest.param(RuntimeError("clock broke"), RuntimeError, id="raises"),
    pytest.param(NAN, ValueError, id="nan"),
    pytest.param("noon", TypeError, id="str"),
    pytest.param(math.inf, ValueError, id="inf"),
]


class AckAndClaimRules(ContractBase):
    """The ``ack_and_claim`` rules (see the module docstring)."""

    # -- what it is ------------------------------------------------------------------------

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    @pytest.mark.parametrize("acked, floor, step", _EQUIVALENCE)
    def test_ack_and_claim_is_ack_then_claim(
        self, new_transport: MakeTransport, acked: str, floor: int, step: float
    ) -> None:
        """The same lease and the same state as ``ack(lease)`` followed by
        ``claim(worker_id, visibility, min_priority)``, with one clock read
        (the clock moves on after each read here: a second read would show)."""
        subject_clock, control_clock = TickingClock(), ContractClock()
        subject, control = new_transport(subject_clock), new_transport(control_clock)
        leases = _history(subject, subject_clock)
        expected_leases = _history(control, control_clock)
        for c in (subject_clock, control_clock):
            c.advance(step)
        now = subject_clock.now
        reads = subject_clock.reads
        subject_clock.ticking = True
        got = subject.ack_and_claim(leases[acked], "w2", 30, floor)
        subject_clock.ticking = False
        assert subject_clock.reads == reads + 1, "ack_and_claim did not read the clock exactly once"
        control.ack(expected_leases[acked])
        expected = control.claim("w2", 30, floor)
        assert lease_key(got, self.preserves_identity) == lease_key(expected, self.preserves_identity)
        if got is not None:
            assert got.expires_at == now + 30 and got.worker_id == "w2"
        subject_clock.set(now)
        assert self.fingerprint(subject, subject_clock) == self.fingerprint(control, control_clock)

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    def test_ack_and_claim_returns_none_when_nothing_is_eligible_and_the_ack_stands(
        self, transport: Any, clock: ContractClock
    ) -> None:
        """Nothing eligible: ``None`` at once (it never waits), the message
        acked all the same (an emptied group forgotten, priority and all), and
        a next message the floor excluded left ready."""
        transport.publish("g", "g1", priority=3)
        lease = transport.claim("w", 30)
        assert self.run_with_deadline(lambda: transport.ack_and_claim(lease, "w", 30)) is None
        assert len(transport) == 0 and tuple(transport.stats()) == (0, 0, 0, 0, 0, 0, 0)
        with pytest.raises(LeaseLost):
            transport.ack(lease)  # acked for good
        transport.publish("g", "g2")  # the group was forgotten: created fresh, with priority 0
        assert transport.claim("w", 30, min_priority=1) is None
        transport.publish("g", "g3")
        lease = transport.claim("w", 30)
        assert (lease.seq, lease.attempt) == (2, 1)
        assert transport.ack_and_claim(lease, "w", 30, min_priority=INT64_MAX) is None
        assert tuple(transport.stats()) == (1, 1, 0, 0, 0, 0, 0)
        lease = transport.claim("w", 30)
        assert (lease.group_id, lease.seq, lease.attempt) == ("g", 3, 1)

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    def test_ack_and_claim_serves_the_acked_group_again_when_it_is_the_only_eligible(self, transport: Any) -> None:
        """A worker's loop on one group: each call acks a message and leases
        the group's next one, in order, until the group is empty."""
        for i in range(4):
            transport.publish("g", f"g{i + 1}")
        transport.publish("low", "below the floor", priority=-5)
        lease = transport.claim("w", 30)
        seen: List[Any] = []
        while lease is not None and len(seen) < 10:
            seen.append((lease.group_id, lease.seq, lease.attempt))
            lease = transport.ack_and_claim(lease, "w", 30)
        assert seen == [("g", 1, 1), ("g", 2, 1), ("g", 3, 1), ("g", 4, 1)]
        assert tuple(transport.stats()) == (1, 1, 0, 0, 0, 0, 0)

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    def test_ack_and_claim_keeps_the_round_robin(self, transport: Any) -> None:
        """The group just acked goes to the back like any claimed group: a
        worker's loop through ``ack_and_claim`` serves the groups in turn,
        never-claimed groups first."""
        transport.publish("z", "z1")
        z = transport.claim("w", 30)  # claimed first: the least recently claimed group later
        for group in "abc":
            for i in (1, 2):
                transport.publish(group, f"{group}{i}")
        transport.publish("z", "z2")
        transport.ack(z)
        lease = transport.claim("w", 30)
        seen: List[Any] = []
        while lease is not None and len(seen) < 10:
            seen.append(lease.event)
            lease = transport.ack_and_claim(lease, "w", 30)
        assert seen == ["a1", "b1", "c1", "z2", "a2", "b2", "c2"]

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    def test_ack_and_claim_keeps_the_priority_floor(self, transport: Any) -> None:
        """The claim half serves only groups at or above ``min_priority``."""
        for group, priority in (("low", 0), ("high", 5)):
            transport.publish(group, f"{group}1", priority)
            transport.publish(group, f"{group}2")
        lease = transport.claim("w", 30)
        assert (lease.group_id, lease.seq) == ("low", 1)
        lease = transport.ack_and_claim(lease, "w", 30, 5)
        assert lease is not None and (lease.group_id, lease.seq) == ("high", 3)
        assert transport.ack_and_claim(lease, "w", 30, min_priority=6) is None  # low2 is below it
        assert len(transport) == 2
        lease = transport.claim("w", 30, 5)
        assert lease is not None and (lease.group_id, lease.seq) == ("high", 4)
        lease = transport.ack_and_claim(lease, "w", 30, INT64_MIN)
        assert lease is not None and (lease.group_id, lease.seq) == ("low", 2)

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    def test_ack_and_claim_applies_expiry_at_its_now(self, transport: Any, clock: ContractClock) -> None:
        """The claim half applies expiry first, at the call's ``now``
        (``expires_at < now``), and that expiry is permanent."""
        transport.publish("x", "x1")
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        transport.publish("g", "g3")
        crashed = transport.claim("w1", 10)  # x1 until 1010: its worker crashes
        lease = transport.claim("w", 100)
        assert (crashed.group_id, lease.group_id) == ("x", "g")
        clock.set(1010.0)  # x's lease ends exactly now: still leased
        lease = transport.ack_and_claim(lease, "w", 30)
        assert lease is not None and (lease.group_id, lease.seq) == ("g", 3)
        clock.advance(1)  # now it has expired, and x was claimed before g
        lease = transport.ack_and_claim(lease, "w2", 30)
        assert lease is not None and (lease.group_id, lease.seq, lease.attempt) == ("x", 1, 2)
        assert (lease.worker_id, lease.expires_at) == ("w2", 1041.0)
        clock.set(1000.0)  # the clock goes back: the expiry it saw stays
        with pytest.raises(LeaseLost):
            transport.ack(crashed)
        assert transport.stats().leased == 1
        transport.ack(lease)

    # -- a lease that is not current ---------------------------------------------------------

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    @pytest.mark.parametrize("history", _STALE_HISTORIES)
    def test_ack_and_claim_of_a_stale_lease_changes_nothing(
        self, new_transport: MakeTransport, history: Callable[..., Any]
    ) -> None:
        """A lease that is not current: ``LeaseLost``, and nothing acked,
        nothing claimed, no expiry applied, the transport's time unmoved
        (stats, groups and the messages as they were; a re-delivered message
        still leased to its new holder)."""
        clocks = [ContractClock(), ContractClock()]
        subject, control = (new_transport(c) for c in clocks)
        stale = history(subject, clocks[0])
        history(control, clocks[1])
        for t in (subject, control):
            t.publish("other", "o1")  # what the claim half would take
        for c in clocks:
            c.advance(100)  # every lease has run out: a claim half would expire them (permanently)
        with pytest.raises(LeaseLost):
            subject.ack_and_claim(stale, "w9", 30)
        for c in clocks:
            c.advance(-100)  # back: an expiry seen at +100, or a time used, would show now
        assert self.observe(subject) == self.observe(control)
        assert self.fingerprint(subject, clocks[0]) == self.fingerprint(control, clocks[1])

    def observe(self, t: Any) -> List[Any]:
        """What a call that changes nothing leaves as it was: stats, every
        group's state (with the control plane), the groups' messages (with
        the quarantine's peek)."""
        out: List[Any] = [tuple(t.stats())]
        if self.supports_control_plane:
            out.append([tuple(info) for info in t.groups()])
        if self.supports_quarantine:
            out.append([[(m.seq, m.attempt) for m in t.peek(g, 10)] for g in ("g", "h", "other")])
        return out

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    @pytest.mark.parametrize("kind", ["forged", "foreign", "fields-of-the-wrong-type"])
    def test_ack_and_claim_of_a_forged_or_foreign_lease_changes_nothing(
        self, new_transport: MakeTransport, kind: str
    ) -> None:
        """A lease built by hand, or issued by another transport: never
        current (with ``accepts_rebuilt_leases``: one whose fields name no
        open delivery here, or are not an exact ``int``/``str``), so
        ``LeaseLost`` and nothing changed."""
        clocks = [ContractClock(), ContractClock()]
        subject, control, other = (new_transport(c) for c in (*clocks, ContractClock()))
        for t in (subject, control, other):
            t.publish("g", "g1")
            t.publish("g", "g2")
            t.publish("h", "h1")
        mine = subject.claim("w", 30)
        control.claim("w", 30)
        worker = "w2" if self.accepts_rebuilt_leases else "w"
        theirs = other.claim(worker, 30)
        if kind == "foreign":
            lease = theirs
        elif kind == "forged":
            lease = type(mine)(mine.seq, mine.group_id, mine.event, worker, mine.expires_at, mine.attempt)
        else:  # the open delivery's fields, but its seq a str
            lease = type(mine)(str(mine.seq), mine.group_id, mine.event, mine.worker_id, mine.expires_at, mine.attempt)
        with pytest.raises(LeaseLost):
            subject.ack_and_claim(lease, "w", 30)
        assert self.observe(subject) == self.observe(control)
        assert self.fingerprint(subject, clocks[0]) == self.fingerprint(control, clocks[1])

    # -- bad input and the clock -------------------------------------------------------------

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    @pytest.mark.parametrize("call, error", BAD_ROWS)
    def test_ack_and_claim_bad_input_changes_nothing(
        self, new_transport: MakeTransport, call: Call, error: Any
    ) -> None:
        """Every argument is checked first -- the lease's type as ``ack``
        checks it, then ``worker_id``, ``visibility`` and ``min_priority`` as
        ``claim`` does, each fully before the next -- before the clock is
        read: the error ``ack`` or ``claim`` would raise, and nothing acked."""
        assert_changes_nothing(
            new_transport, call, error, clock_during_call=ClockTouched(), identity=self.preserves_identity
        )

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    @pytest.mark.parametrize("bad, error", BAD_CLOCKS)
    @pytest.mark.parametrize("lease", ["current", "stale"])
    def test_ack_and_claim_reads_the_clock_before_the_lease_is_looked_at(
        self, new_transport: MakeTransport, bad: Any, error: type, lease: str
    ) -> None:
        """The clock is read once, after the arguments and before the lease
        is looked at: a clock that raises or returns garbage gives its error
        (for a stale lease too, not ``LeaseLost``), and nothing is acked."""
        assert_changes_nothing(
            new_transport, lambda t, l: t.ack_and_claim(l[lease], "w", 30), error,
            clock_during_call=bad, identity=self.preserves_identity,
        )

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    def test_ack_and_claim_after_close(self, transport: Any, clock: ContractClock) -> None:
        """After ``close()`` it works as before (the in-memory transports), or
        (``usable_after_close=False``) checks its arguments, then raises
        ``LeaseQueueError`` without reading the clock."""
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        lease = transport.claim("w", 30)
        transport.close()
        with pytest.raises(TypeError):
            transport.ack_and_claim(lease, 5, 30)
        if self.usable_after_close:
            lease = transport.ack_and_claim(lease, "w", 30)
            assert lease is not None and (lease.group_id, lease.seq) == ("g", 2)
            return
        clock.bad = ClockTouched()
        with pytest.raises(LeaseQueueError):
            transport.ack_and_claim(lease, "w", 30)

    # -- no user code under the lock -----------------------------------------------------

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    @requires("preserves_identity", "to hold events by reference (an event's finaliser runs on the ack)")
    @pytest.mark.parametrize("cyclic", [False, True])
    def test_event_finaliser_publishing_to_the_same_transport_on_ack_and_claim(
        self, transport: Any, cyclic: bool
    ) -> None:
        """The acked event is released by the transport, after its lock:
        when that drops the last reference, the event's ``__del__`` may
        publish to the same transport (no deadlock, no half-done state), and
        the message it published is there afterwards."""
        published: List[int] = []

        class Step:
            def __init__(self) -> None:
                if cyclic:
                    self.me = self  # only the cycle collector frees it

            def __del__(self) -> None:
                published.append(transport.publish("next", "step 2"))

        def scenario() -> Any:
            transport.publish("g", Step())
            transport.publish("g", "g2")
            lease = transport.claim("w", 30)
            got = transport.ack_and_claim(lease, "w", 30)
            del lease  # the caller's last reference: the transport must hold none
            gc.collect()
            return None if got is None else (got.group_id, got.seq)

        assert self.run_with_deadline(scenario) == ("g", 2)
        assert published == [3]
        assert len(transport) == 2
        lease = transport.claim("w", 30)
        assert lease is not None and (lease.seq, lease.group_id, lease.event) == (3, "next", "step 2")

    # -- waiting claims (real threads) -------------------------------------------------------

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    @requires("supports_waiting", WAITING)
    def test_a_waiting_claim_gets_what_ack_and_claim_leaves(self, transport: Any, clock: ContractClock) -> None:
        """Waiting claims are served from what the claim half leaves: the
        caller's next message is its own (not handed to a waiting claim
        first), and a next message the claim half did not take wakes the
        waiting claim."""
        for i in range(3):
            transport.publish("g", f"g{i + 1}")
        transport.publish("h", "h1")
        lease = transport.claim("w", 30)
        held = transport.claim("w", 30)
        assert (lease.group_id, held.group_id) == ("g", "h")
        assert transport.claim("probe", 30) is None  # nothing claimable
        waiter = self.start_waiting(clock, lambda: transport.claim("waiter", 30, timeout=self.far()))
        got = transport.ack_and_claim(lease, "w", 30)
        assert got is not None and (got.group_id, got.seq) == ("g", 2), (
            f"ack_and_claim returned {got!r}: the caller's next message went to the waiting claim")
        time.sleep(self.settle_seconds)
        assert not waiter.done, f"the waiting claim returned {waiter.result!r}, but nothing was left for it"
        assert transport.ack_and_claim(got, "w", 30, min_priority=INT64_MAX) is None
        woken = waiter.outcome(self.liveness_timeout)
        assert woken is not None and (woken.group_id, woken.seq, woken.worker_id) == ("g", 3, "waiter")
        transport.ack(held)

    @requires("supports_ack_and_claim", ACK_AND_CLAIM)
    @requires("supports_waiting", WAITING)
    def test_a_waiting_claim_gets_an_expiry_that_ack_and_claim_applied(
        self, transport: Any, clock: ContractClock
    ) -> None:
        """The claim half's expiry freed two groups: it takes one, a waiting
        claim gets the other."""
        for group in ("x", "y", "g"):
            transport.publish(group, f"{group}1")
        crashed = [transport.claim("w", 1000), transport.claim("w", 1000)]
        lease = transport.claim("w", 1000)
        assert [x.group_id for x in crashed] + [lease.group_id] == ["x", "y", "g"]
        waiter = self.start_waiting(clock, lambda: transport.claim("waiter", 30, timeout=self.far()))
        clock.advance(2000)  # x's and y's leases run out; the waiter's own timer is ~1000 s of real time away
        got = transport.ack_and_claim(lease, "w", 30)
        woken = waiter.outcome(self.liveness_timeout)
        assert got is not None and woken is not None, (got, woken)
        assert {got.group_id, woken.group_id} == {"x", "y"}
        assert (got.attempt, woken.attempt, got.worker_id, woken.worker_id) == (2, 2, "w", "waiter")
