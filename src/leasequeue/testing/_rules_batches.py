"""Part 2 of the contract, "Batches": ``publish_many``, ``claim_many`` and
``ack_many``, each the same as its one-by-one equivalent, all or nothing.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Callable, Iterator

import pytest

from ._contract_base import ContractBase, ContractClock, MakeTransport, lease_key, requires
from ._rules_bad_input import ClockTouched, LookalikeLease, assert_changes_nothing, bad_input_history

__all__ = ["BatchRules"]

BATCHES = "batches (publish_many, claim_many, ack_many)"


class Boom(Exception):
    """Raised by an iterator of items half-way through."""


def _items_then_boom() -> Iterator[Any]:
    yield ("a", "fine")
    yield ("new", "fine", 3)
    raise Boom("the items' iterator failed")


_BAD_BATCHES = [
    pytest.param(lambda t, l: t.publish_many([("x", "e"), (5, "e")]), TypeError, id="publish_many-group-int"),
    pytest.param(lambda t, l: t.publish_many([("x", "e"), ("y", "e", 1.5)]), TypeError, id="publish_many-prio-float"),
    pytest.param(lambda t, l: t.publish_many([("x", "e"), ("y", "e", True)]), TypeError, id="publish_many-prio-bool"),
    pytest.param(lambda t, l: t.publish_many([("x", "e"), ("y", "e", 2**63)]), OverflowError, id="publish_many-2**63"),
    pytest.param(lambda t, l: t.publish_many([("x", "e"), ("y",)]), (TypeError, ValueError), id="publish_many-1-tuple"),
    pytest.param(
        lambda t, l: t.publish_many([("x", "e"), ("y", "e", 1, 2)]), (TypeError, ValueError), id="publish_many-4-tuple"
    ),
    pytest.param(lambda t, l: t.publish_many([("x", "e"), 5]), TypeError, id="publish_many-item-int"),
    pytest.param(lambda t, l: t.publish_many(5), TypeError, id="publish_many-not-iterable"),
    pytest.param(lambda t, l: t.publish_many(_items_then_boom()), Boom, id="publish_many-iterator-raises"),
    pytest.param(lambda t, l: t.claim_many(5, 10, 2), TypeError, id="claim_many-worker-int"),
    pytest.param(lambda t, l: t.claim_many("__parked__", 10, 2), ValueError, id="claim_many-parked-sentinel"),
    pytest.param(lambda t, l: t.claim_many("w", -1, 2), ValueError, id="claim_many-visibility-negative"),
    pytest.param(lambda t, l: t.claim_many("w", "10", 2), TypeError, id="claim_many-visibility-str"),
    pytest.param(lambda t, l: t.claim_many("w", 10, -1), ValueError, id="claim_many-max_count-negative"),
    pytest.param(lambda t, l: t.claim_many("w", 10, 1.0), TypeError, id="claim_many-max_count-float"),
    pytest.param(lambda t, l: t.claim_many("w", 10, "2"), TypeError, id="claim_many-max_count-str"),
    pytest.param(lambda t, l: t.claim_many("w", 10, None), TypeError, id="claim_many-max_count-none"),
    pytest.param(lambda t, l: t.claim_many("w", 10, Decimal(2)), TypeError, id="claim_many-max_count-decimal"),
    pytest.param(lambda t, l: t.claim_many("w", 10, 2, 1.0), TypeError, id="claim_many-floor-float"),
    pytest.param(lambda t, l: t.claim_many("w", 10, 2, 2**63), OverflowError, id="claim_many-floor-2**63"),
    pytest.param(lambda t, l: t.claim_many("w", -1, "x"), ValueError, id="claim_many-order-visibility-first"),
    pytest.param(lambda t, l: t.claim_many("w", 10, -1, "x"), ValueError, id="claim_many-order-max_count-first"),
    pytest.param(lambda t, l: t.ack_many([l["current"], None]), TypeError, id="ack_many-none"),
    pytest.param(
        lambda t, l: t.ack_many([l["current"], LookalikeLease(3, "b", "b1", "w", 1010.0, 1)]),
        TypeError,
        id="ack_many-lookalike",
    ),
    pytest.param(lambda t, l: t.ack_many([l["current"], (3, "b")]), TypeError, id="ack_many-tuple"),
    pytest.param(lambda t, l: t.ack_many(5), TypeError, id="ack_many-not-iterable"),
]


class TickingClock(ContractClock):
    """With ``ticking`` set, moves one second on after every read: successive
    claims would each see another ``now``."""

    ticking = False

    def __call__(self) -> float:
        now = super().__call__()
        if self.ticking:
            self.advance(1)
        return now


_GROUPS = (("a", 0), ("b", 2), ("c", -1), ("d", 0), ("e", 5), ("f", 0))
#: One set of event objects for both transports compared (identity counts).
_EVENTS = {group: [f"{group}1", f"{group}2"] for group, _ in _GROUPS}


def _history(t: Any, clock: ContractClock) -> None:
    """Groups of every kind for claim_many: never claimed, claimed, below
    the floor, leased, parked, with several messages."""
    for group, priority in _GROUPS:
        t.publish(group, _EVENTS[group][0], priority=priority)
        t.publish(group, _EVENTS[group][1])
    t.ack(t.claim("w", 10))  # a
    t.nack(t.claim("w", 10))  # b, attempt 1 closed
    t.claim("w", 10)  # d leased
    t.nack(t.claim("w", 10), 100)  # e parked


class BatchRules(ContractBase):
    """The batch rules (see the module docstring)."""

    # -- publish_many -------------------------------------------------------------------

    @requires("supports_batches", BATCHES)
    def test_publish_many_is_publishing_one_by_one(self, new_transport: MakeTransport) -> None:
        """``publish_many``: the seqs, consecutive, in item order; the same
        state as publishing the items one by one (priority on a group's first
        message only)."""
        items = [("a", "a1"), ("b", ["b1"], 5), ("a", "a2", 9), ("c", {"c": 1}, -1), ("b", "b2"), ("", "empty")]
        clocks = [ContractClock(), ContractClock()]
        subject, control = (new_transport(c) for c in clocks)
        for t in (subject, control):
            t.publish("z", "first")
        assert subject.publish_many(items) == [2, 3, 4, 5, 6, 7]
        assert [control.publish(*item) for item in items] == [2, 3, 4, 5, 6, 7]
        assert subject.publish_many(iter([("d", "d1", 1), ("a", "a3")])) == [8, 9]  # any iterable
        assert [control.publish("d", "d1", 1), control.publish("a", "a3")] == [8, 9]
        assert subject.publish_many([]) == []
        leases = self.claim_all(subject)
        assert [x.event for x in leases] == ["first", "a1", ["b1"], {"c": 1}, "empty", "d1"]
        assert self.same_event(leases[2].event, items[1][1])
        for lease in leases:
            subject.ack(lease)
        for lease in self.claim_all(control):
            control.ack(lease)
        assert self.fingerprint(subject, clocks[0]) == self.fingerprint(control, clocks[1])

    @requires("supports_batches", BATCHES)
    @pytest.mark.parametrize("call, error", _BAD_BATCHES)
    def test_batch_bad_input_changes_nothing(
        self, new_transport: MakeTransport, call: Callable[..., Any], error: Any
    ) -> None:
        """One bad item (or argument): the error, before the clock is read,
        and nothing published, claimed or acked; no seq is used up."""
        assert_changes_nothing(
            new_transport, call, error, clock_during_call=ClockTouched(), identity=self.preserves_identity
        )
        clocks = [ContractClock(), ContractClock()]
        subject, control = (new_transport(c) for c in clocks)
        leases = bad_input_history(subject, clocks[0])
        bad_input_history(control, clocks[1])
        with pytest.raises(error):
            call(subject, leases)
        assert subject.publish("next", "e") == control.publish("next", "e")

    # -- claim_many ----------------------------------------------------------------------

    @requires("supports_batches", BATCHES)
    @pytest.mark.parametrize("max_count, floor", [(1, 0), (2, 0), (3, 0), (10, 0), (10, -1), (2, 1), (10, 6)])
    def test_claim_many_is_successive_claims_at_one_now(
        self, new_transport: MakeTransport, max_count: int, floor: int
    ) -> None:
        """``claim_many``: one clock read; exactly the leases that
        ``max_count`` successive claims at that ``now`` would return,
        stopping at the first None (so all of distinct groups)."""
        subject_clock, control_clock = TickingClock(), ContractClock()
        subject, control = new_transport(subject_clock), new_transport(control_clock)
        _history(subject, subject_clock)
        _history(control, control_clock)
        now = subject_clock()
        reads = subject_clock.reads
        subject_clock.ticking = True
        got = subject.claim_many("w", 30, max_count, min_priority=floor)
        subject_clock.ticking = False
        assert subject_clock.reads == reads + 1, "claim_many read the clock more than once"
        assert isinstance(got, list)
        expected = []
        for _ in range(max_count):
            lease = control.claim("w", 30, floor)
            if lease is None:
                break
            expected.append(lease)
        assert [lease_key(x, self.preserves_identity) for x in got] == [
            lease_key(x, self.preserves_identity) for x in expected
        ]
        assert all(x.expires_at == now + 30 for x in got)
        assert len({x.group_id for x in got}) == len(got)
        subject_clock.set(now)
        assert self.fingerprint(subject, subject_clock) == self.fingerprint(control, control_clock)

    @requires("supports_batches", BATCHES)
    def test_claim_many_edges(self, transport: Any) -> None:
        """``max_count=0`` claims nothing; nothing eligible gives ``[]``; it
        never waits."""
        assert self.run_with_deadline(lambda: transport.claim_many("w", 30, 5)) == []
        transport.publish("g", "e")
        assert transport.claim_many("w", 30, 0) == []
        assert transport.stats() == (1, 1, 0, 0, 0, 0, 0)
        got = transport.claim_many("w", 30, 5)
        assert [(x.group_id, x.seq, x.attempt, x.expires_at) for x in got] == [("g", 1, 1, 1030.0)]
        assert self.run_with_deadline(lambda: transport.claim_many("w", 30, 5)) == []

    # -- ack_many -----------------------------------------------------------------------

    @requires("supports_batches", BATCHES)
    def test_ack_many_acks_the_current_and_returns_the_rest(self, new_transport: MakeTransport) -> None:
        """``ack_many``: each current lease is acked, in order; the ones that
        were not current come back (in order); it never raises LeaseLost."""
        clock = ContractClock()
        t, other = new_transport(clock), new_transport(clock)
        for group in ("a", "b", "c", "d"):
            t.publish(group, f"{group}1")
            t.publish(group, f"{group}2")
        other.publish("a", "foreign")
        foreign = other.claim("w", 30)
        stale = t.claim("w", 30)  # a1
        t.nack(stale)
        lb, lc, ld = t.claim("w", 30), t.claim("w", 30), t.claim("w", 30)  # never-claimed groups first
        assert [x.group_id for x in (lb, lc, ld)] == ["b", "c", "d"]
        lost = t.ack_many([lb, stale, lc, lb, foreign, ld])
        assert lost == [stale, lb, foreign]  # lb's second time: no longer current
        assert len(t) == 5 and t.stats() == (5, 4, 0, 0, 0, 0, 0)
        assert t.ack_many([]) == []
        leases = self.claim_all(t)
        assert [(x.group_id, x.seq, x.attempt) for x in leases] == [("a", 1, 2), ("b", 4, 1), ("c", 6, 1), ("d", 8, 1)]
        assert t.ack_many(iter(leases)) == []
        assert len(t) == 1 and len(other) == 1

    @requires("supports_batches", BATCHES)
    def test_ack_many_type_checks_every_element_first(self, transport: Any) -> None:
        for group in ("a", "b"):
            transport.publish(group, group)
        la, lb = transport.claim("w", 30), transport.claim("w", 30)
        for bad in ([la, None, lb], [la, lb, "lease"], [la, LookalikeLease(2, "b", "b", "w", 1030.0, 1)]):
            with pytest.raises(TypeError):
                transport.ack_many(bad)
            assert transport.stats() == (2, 2, 2, 0, 0, 0, 0)
        assert transport.ack_many([la, lb]) == []
        assert len(transport) == 0
