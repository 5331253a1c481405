"""Part 1 of the contract: the seed's transport, rule by rule.

Single active consumer per group, FIFO within a group, round-robin between
groups, the priority floor, crash recovery by expiry, fencing of stale
leases, park / nack / extend, identity of events, stats / len / close, the
clock as user code, and the project's pinned decisions that a caller can
observe (``docs/decisions.md``: expiry is permanent once observed, the
transport's time never runs backwards, ids come back as exact ``str``).
"""

from __future__ import annotations

import gc
import math
from typing import Any, Callable, Dict, List

import pytest

from .._errors import LeaseLost
from .._validation import INT64_MIN
from ._contract_base import ContractBase, ContractClock, MakeTransport, requires

__all__ = ["CoreRules"]

Op = Callable[[Any, Any], Any]


# -- histories after which a lease is stale (fencing) -------------------------


def _history_expired_and_reclaimed(t: Any, clock: ContractClock) -> Any:
    t.publish("g", "e")
    t.publish("g", "f")
    stale = t.claim("w1", 10)
    clock.advance(20)
    again = t.claim("w2", 10)  # re-delivered: attempt 2
    assert (again.seq, again.attempt) == (stale.seq, 2)
    t.publish("h", "x")
    return stale


def _history_acked(t: Any, clock: ContractClock) -> Any:
    t.publish("g", "e")
    t.publish("g", "f")
    stale = t.claim("w1", 10)
    t.ack(stale)
    return stale


def _history_nacked(t: Any, clock: ContractClock) -> Any:
    t.publish("g", "e")
    t.publish("h", "x")
    stale = t.claim("w1", 10)
    t.nack(stale)
    return stale


def _history_parked(t: Any, clock: ContractClock) -> Any:
    t.publish("g", "e")
    stale = t.claim("w1", 10)
    t.nack(stale, 50)
    return stale


_STALE_HISTORIES = [
    pytest.param(_history_expired_and_reclaimed, id="expired-and-reclaimed"),
    pytest.param(_history_acked, id="acked"),
    pytest.param(_history_nacked, id="nacked"),
    pytest.param(_history_parked, id="parked"),
]
_LEASE_OPS = [
    pytest.param(lambda t, lease: t.ack(lease), id="ack"),
    pytest.param(lambda t, lease: t.nack(lease), id="nack0"),
    pytest.param(lambda t, lease: t.nack(lease, 5), id="nack5"),
    pytest.param(lambda t, lease: t.extend(lease, 30), id="extend"),
]


class CoreRules(ContractBase):
    """The Part 1 rules (see the module docstring)."""

    # -- 1. single active consumer per group ---------------------------------

    def test_single_active_consumer_per_group(self, transport: Any) -> None:
        """At most one message of a group is leased at a time."""
        for i in range(3):
            transport.publish("g", f"e{i}")
        first = transport.claim("w1", 30)
        assert first is not None and first.seq == 1
        # the group's other messages wait while one is leased
        assert transport.claim("w2", 30) is None
        transport.publish("h", "other")
        other = transport.claim("w2", 30)
        assert other is not None and other.group_id == "h"
        assert transport.claim("w3", 30) is None
        transport.ack(first)
        second = transport.claim("w3", 30)
        assert second is not None and (second.group_id, second.seq) == ("g", 2)

    # -- 2. FIFO within a group ----------------------------------------------

    def test_fifo_within_group(self, transport: Any, clock: ContractClock) -> None:
        """A group's messages are delivered in publish order."""
        seqs: Dict[str, List[int]] = {"a": [], "b": []}
        for i in range(10):
            group = "ab"[i % 3 == 0]
            seqs[group].append(transport.publish(group, i))
        delivered: Dict[str, List[int]] = {"a": [], "b": []}
        for _ in range(11):  # 10 messages, then None
            lease = transport.claim("w", 30)
            if lease is None:
                break
            delivered[lease.group_id].append(lease.seq)
            transport.ack(lease)
            clock.advance(1)
        assert delivered == seqs

    # -- 3. round-robin between groups -----------------------------------------

    @pytest.mark.parametrize("tick", [0.0, 1.0], ids=["frozen-clock", "moving-clock"])
    @pytest.mark.parametrize("published", ["interleaved", "group-by-group"])
    def test_round_robin_order(self, transport: Any, clock: ContractClock, tick: float, published: str) -> None:
        """The group claimed least recently goes first, by the order of
        claims: a frozen clock (all claims in one tick) must not serve a group
        twice in a row.  (The seed's timestamp key ties there and falls back
        to the lower seq: with a group's messages published together, it
        serves that group again.)"""
        if published == "interleaved":
            for _ in range(3):
                for group in ("a", "b", "c"):
                    transport.publish(group, group)
        else:
            for group in ("a", "b", "c"):
                for _ in range(3):
                    transport.publish(group, group)
        order = []
        for _ in range(10):  # 9 messages, then None
            lease = transport.claim("w", 30)
            if lease is None:
                break
            order.append(lease.group_id)
            transport.ack(lease)
            clock.advance(tick)
        assert order == ["a", "b", "c"] * 3

    def test_round_robin_just_served_group_goes_to_back(self, transport: Any) -> None:
        for group in ("a", "b", "c"):
            transport.publish(group, 1)
            transport.publish(group, 2)
        la = transport.claim("w", 30)
        lb = transport.claim("w", 30)
        transport.ack(lb)  # b was served after a: b is now the most recent
        transport.ack(la)
        assert [x.group_id for x in self.claim_all(transport)] == ["c", "a", "b"]

    def test_never_claimed_groups_first_in_order_of_oldest_message(self, transport: Any) -> None:
        transport.publish("old", 1)
        transport.publish("old", 2)
        lease = transport.claim("w", 30)
        transport.ack(lease)  # "old" has been claimed: it goes behind new groups
        transport.publish("z", 1)  # seq 3
        transport.publish("y", 1)  # seq 4
        transport.publish("z", 2)
        transport.publish("x", 1)  # seq 6
        assert [x.group_id for x in self.claim_all(transport)] == ["z", "y", "x", "old"]

    # -- 4. priority floor ------------------------------------------------------

    def test_priority_floor(self, transport: Any) -> None:
        """``claim(min_priority=p)`` serves only groups of priority ``>= p``
        (the default floor is 0)."""
        transport.publish("low", "l", priority=-5)
        transport.publish("mid", "m", priority=0)
        transport.publish("high", "h", priority=7)
        assert transport.claim("w", 30, min_priority=8) is None
        assert transport.claim("w", 30, min_priority=7).group_id == "high"
        assert transport.claim("w", 30, min_priority=7) is None
        assert transport.claim("w", 30).group_id == "mid"  # default floor 0
        assert transport.claim("w", 30) is None
        assert transport.claim("w", 30, min_priority=-5).group_id == "low"

    def test_priority_floor_keeps_round_robin_among_eligible(self, transport: Any) -> None:
        for group, prio in (("a", 1), ("b", 5), ("c", 1), ("d", 5)):
            transport.publish(group, 1, priority=prio)
            transport.publish(group, 2, priority=prio)
        got = [transport.claim("w", 30, min_priority=5) for _ in range(2)]
        assert [x.group_id for x in got] == ["b", "d"]
        for lease in got:
            transport.ack(lease)
        # a and c were never claimed: they come before b and d
        assert [x.group_id for x in self.claim_all(transport)] == ["a", "c", "b", "d"]

    def test_priority_extremes(self, transport: Any) -> None:
        """The whole signed 64-bit range is usable, ends included."""
        transport.publish("lo", "e", priority=INT64_MIN)
        transport.publish("hi", "e", priority=2**63 - 1)
        assert transport.claim("w", 1, min_priority=2**63 - 1).group_id == "hi"
        assert transport.claim("w", 1, min_priority=INT64_MIN + 1) is None
        assert transport.claim("w", 1, min_priority=INT64_MIN).group_id == "lo"

    def test_int_subclass_priority_accepted(self, transport: Any) -> None:
        class Level(int):
            pass

        transport.publish("g", "e", priority=Level(4))
        assert transport.claim("w", 1, min_priority=Level(4)).group_id == "g"

    def test_priority_set_on_first_publish_only(self, transport: Any) -> None:
        transport.publish("g", 1, priority=5)
        transport.publish("g", 2, priority=-5)  # ignored
        lease = transport.claim("w", 30, min_priority=5)
        assert lease is not None and lease.seq == 1
        transport.ack(lease)
        assert transport.claim("w", 30, min_priority=5).seq == 2

    # -- 5. crash recovery --------------------------------------------------

    def test_expiry_recovery_after_crash(self, transport: Any, clock: ContractClock) -> None:
        """A lease not acked or nacked before it expires frees its message:
        it is delivered again (attempt + 1).  Expiry is strict:
        ``expires_at < now``."""
        transport.publish("g", "e")
        lease = transport.claim("crashing", 30)
        assert lease.expires_at == clock() + 30
        clock.advance(30)  # expires_at == now: not yet expired (strictly <)
        assert transport.claim("w2", 30) is None
        clock.advance(0.5)
        again = transport.claim("w2", 30)
        assert again is not None
        assert (again.seq, again.worker_id, again.attempt) == (lease.seq, "w2", 2)
        assert self.same_event(again.event, lease.event)

    def test_expiry_is_permanent_once_observed(self, transport: Any, clock: ContractClock) -> None:
        """Once a claim saw a lease expired, a clock going back does not
        re-lock it (decisions.md)."""
        transport.publish("g", "e", priority=0)
        transport.claim("w", 10)
        clock.advance(20)
        assert transport.claim("w", 10, min_priority=1) is None  # observes expiry
        clock.advance(-15)  # back before the old expiry
        again = transport.claim("w2", 10)
        assert again is not None and again.attempt == 2

    def test_expiry_not_observed_still_blocks_when_clock_goes_back(self, transport: Any, clock: ContractClock) -> None:
        transport.publish("g", "e")
        transport.claim("w", 10)
        clock.advance(20)  # nobody looked
        clock.advance(-15)
        assert transport.claim("w2", 10) is None

    def test_stats_observes_expiry_permanently(self, transport: Any, clock: ContractClock) -> None:
        transport.publish("g", "e")
        transport.claim("w", 10)
        clock.advance(20)
        assert tuple(transport.stats()) == (1, 1, 0, 0, 0, 0, 0)
        clock.advance(-15)
        assert transport.claim("w2", 10) is not None

    @pytest.mark.parametrize(
        "op",
        [
            pytest.param(lambda t, lease: t.claim("w", 1, 10**9), id="claim"),
            pytest.param(lambda t, lease: t.stats(), id="stats"),
            pytest.param(lambda t, lease: t.extend(lease, 1), id="extend"),
            pytest.param(lambda t, lease: t.nack(lease, 1), id="nack-park"),
        ],
    )
    def test_time_never_runs_backwards(self, new_transport: MakeTransport, op: Op) -> None:
        """An operation acts at max(clock(), the latest time one used)
        (decisions.md): a clock turned back does not shorten leases."""
        clock = ContractClock()
        t = new_transport(clock)
        t.publish("g", "e")
        t.publish("h", "e")
        lease = t.claim("w", 5)
        clock.advance(100)  # 1100
        op(t, lease)  # acts at 1100
        clock.advance(-60)  # the clock says 1040
        assert t.claim("w", 5).expires_at == 1105.0  # not 1045

    @pytest.mark.parametrize(
        "op, error",
        [
            pytest.param(lambda t, stale: t.extend(stale, 1), LeaseLost, id="extend-stale"),
            pytest.param(lambda t, stale: t.nack(stale, 1), LeaseLost, id="nack-park-stale"),
            pytest.param(lambda t, stale: t.claim("w", 1, 2**63), OverflowError, id="claim-bad-floor"),
        ],
    )
    def test_failed_call_does_not_move_the_transport_time(
        self, new_transport: MakeTransport, op: Op, error: type
    ) -> None:
        clock = ContractClock()
        t = new_transport(clock)
        t.publish("g", "e")
        t.publish("h", "e")
        stale = t.claim("w", 5)
        t.nack(stale)
        clock.advance(1000)  # 2000
        with pytest.raises(error):
            op(t, stale)
        clock.advance(-500)  # 1500
        assert t.claim("w", 5).expires_at == 1505.0

    # -- park -------------------------------------------------------------------

    def test_park_blocks_group(self, transport: Any, clock: ContractClock) -> None:
        """``nack(delay > 0)`` parks the message until ``now + delay``; while
        parked it blocks its whole group; it is then delivered again."""
        transport.publish("g", "first")
        transport.publish("g", "second")
        lease = transport.claim("w", 30)
        transport.nack(lease, delay=100)
        assert tuple(transport.stats()) == (2, 1, 0, 1, 0, 0, 0)
        clock.advance(100)  # due exactly now: still parked
        assert transport.claim("w", 30) is None
        clock.advance(1)
        again = transport.claim("w", 30)
        assert (again.seq, again.attempt) == (lease.seq, 2)

    def test_nack_with_infinite_delay_parks_forever(self, transport: Any, clock: ContractClock) -> None:
        transport.publish("g", "e")
        transport.nack(transport.claim("w", 1), delay=math.inf)
        clock.advance(1e300)
        assert transport.claim("w", 1) is None
        assert tuple(transport.stats()) == (1, 1, 0, 1, 0, 0, 0)

    # -- nack(0) ----------------------------------------------------------------

    def test_nack_zero_retries_first_with_attempt_plus_one(self, transport: Any) -> None:
        transport.publish("g", "first")
        transport.publish("g", "second")
        lease = transport.claim("w", 30)
        transport.nack(lease)
        again = transport.claim("w2", 30)
        assert (again.seq, again.event, again.attempt, again.worker_id) == (lease.seq, "first", 2, "w2")
        transport.nack(again, 0)
        assert transport.claim("w3", 30).attempt == 3

    def test_nack_keeps_round_robin_position(self, transport: Any) -> None:
        for group in ("a", "b", "c"):
            transport.publish(group, 1)
        la = transport.claim("w", 30)
        lb = transport.claim("w", 30)
        transport.nack(la)  # a keeps the position of its claim: before b
        transport.nack(lb)
        assert [x.group_id for x in self.claim_all(transport)] == ["c", "a", "b"]

    # -- ack -----------------------------------------------------------------

    def test_ack_drops_empty_group_recreated_fresh(self, transport: Any) -> None:
        """A group left with no messages is forgotten: a later publish
        re-creates it with that publish's priority."""
        transport.publish("g", "e", priority=9)
        transport.publish("h", "e")
        transport.ack(transport.claim("w", 30))  # g served and emptied
        assert tuple(transport.stats())[:2] == (1, 1)
        transport.publish("g", "again", priority=-1)  # fresh: the new priority holds
        assert transport.claim("w", 30).group_id == "h"
        assert transport.claim("w", 30) is None  # g is -1 now, below the floor 0
        assert transport.claim("w", 30, min_priority=-1).group_id == "g"

    def test_ack_forgets_round_robin_position(self, transport: Any) -> None:
        """A re-created group is never-claimed again: it comes after the
        never-claimed groups with older messages, before every claimed
        group, and neither keeps its old claim position nor its old message's
        place."""
        transport.publish("b", 1)  # seq 1
        transport.publish("b", 2)  # seq 2
        transport.publish("a", 1)  # seq 3
        transport.ack(transport.claim("w", 30))  # b (oldest never-claimed): claim 1, one left
        transport.ack(transport.claim("w", 30))  # a: claim 2, emptied and forgotten
        transport.publish("c", 1)  # seq 4: never claimed
        transport.publish("a", 2)  # seq 5: a re-created
        transport.publish("d", 1)  # seq 6: never claimed
        # forgotten: never-claimed by oldest message c(4) a(5) d(6), then b (claim 1);
        # a remembered position would give c d b a; a's old message's place a c d b
        assert [x.group_id for x in self.claim_all(transport)] == ["c", "a", "d", "b"]

    def test_publish_returns_increasing_seq_never_reused(self, transport: Any) -> None:
        assert [transport.publish("g", i) for i in range(3)] == [1, 2, 3]
        for _ in range(3):
            transport.ack(transport.claim("w", 30))
        assert transport.claim("w", 30) is None
        assert len(transport) == 0  # everything acked, the group forgotten
        assert transport.publish("g", 4) == 4
        assert transport.publish("h", 5) == 5

    # -- fencing ------------------------------------------------------------

    @pytest.mark.parametrize("history", _STALE_HISTORIES)
    @pytest.mark.parametrize("op", _LEASE_OPS)
    def test_fencing_stale_lease_raises_lease_lost_and_changes_nothing(
        self, new_transport: MakeTransport, history: Callable[..., Any], op: Op
    ) -> None:
        """``ack``/``nack``/``extend`` of a lease that is not current (acked,
        nacked, re-delivered) raise ``LeaseLost`` and change nothing."""
        clocks = [ContractClock(), ContractClock()]
        subject, control = (new_transport(c) for c in clocks)
        stale = history(subject, clocks[0])
        history(control, clocks[1])
        with pytest.raises(LeaseLost):
            op(subject, stale)
        assert self.fingerprint(subject, clocks[0]) == self.fingerprint(control, clocks[1])

    def test_stale_ack_does_not_delete_the_new_holders_message(self, transport: Any, clock: ContractClock) -> None:
        """The seed's bug the contract fences against: a worker whose lease
        expired must not delete the message re-delivered to another."""
        transport.publish("g", "e")
        stale = transport.claim("w1", 10)
        clock.advance(11)
        fresh = transport.claim("w2", 10)
        with pytest.raises(LeaseLost):
            transport.ack(stale)
        assert len(transport) == 1
        transport.ack(fresh)
        assert len(transport) == 0

    def test_ack_after_expiry_without_reclaim_is_accepted(self, transport: Any, clock: ContractClock) -> None:
        """A lease whose time ran out but whose message nobody claimed since
        is still current."""
        transport.publish("g", "e", priority=0)
        lease = transport.claim("w", 10)
        clock.advance(100)
        assert transport.claim("w", 10, min_priority=1) is None  # observed, not re-claimed
        assert tuple(transport.stats()) == (1, 1, 0, 0, 0, 0, 0)
        transport.ack(lease)
        assert len(transport) == 0 and tuple(transport.stats()) == (0, 0, 0, 0, 0, 0, 0)

    @pytest.mark.parametrize("observed", [False, True])
    def test_nack_after_expiry_without_reclaim_is_accepted(
        self, transport: Any, clock: ContractClock, observed: bool
    ) -> None:
        transport.publish("g", "e")
        lease = transport.claim("w", 10)
        clock.advance(100)
        if observed:
            transport.stats()
        transport.nack(lease, 50)  # parks from now
        assert tuple(transport.stats()) == (1, 1, 0, 1, 0, 0, 0)
        clock.advance(50)
        assert transport.claim("w", 10) is None
        clock.advance(1)
        assert transport.claim("w", 10).attempt == 2

    def test_lease_from_another_instance_raises_lease_lost(self, new_transport: MakeTransport) -> None:
        """A lease of another, independent transport is not current here
        (with ``accepts_rebuilt_leases``: one whose fields name no open
        delivery here, since fields are all such a backend compares)."""
        clock = ContractClock()
        one, two = new_transport(clock), new_transport(clock)
        event = "same"
        for t in (one, two):
            t.publish("g", event)
        foreign = two.claim("w2" if self.accepts_rebuilt_leases else "w", 30)
        mine = one.claim("w", 30)
        if self.preserves_identity and not self.accepts_rebuilt_leases:
            assert foreign == mine  # look-alikes: equal, but issued by another transport
        for op in (one.ack, one.nack, lambda x: one.nack(x, 5), lambda x: one.extend(x, 5)):
            with pytest.raises(LeaseLost):
                op(foreign)
        assert tuple(one.stats()) == (1, 1, 1, 0, 0, 0, 0)
        one.ack(mine)
        two.ack(foreign)

    @requires("accepts_rebuilt_leases", "that a lease rebuilt from its fields is current")
    def test_a_lease_rebuilt_from_its_fields(self, transport: Any, clock: ContractClock) -> None:
        """``accepts_rebuilt_leases``: a lease built with the lease class's
        constructor from a current lease's six fields is current exactly when
        its ``seq``, ``group_id``, ``worker_id`` and ``attempt`` name the open
        delivery (``expires_at`` and ``event`` are not compared), and acking,
        nacking or extending it acts on that delivery.  (Without the flag,
        ``check_differential`` checks that hand-built leases are refused.)"""
        transport.publish("g", "e")
        transport.publish("g", "f")
        lease = transport.claim("w", 30)
        cls = type(lease)
        rebuilt = cls(lease.seq, lease.group_id, lease.event, lease.worker_id, lease.expires_at, lease.attempt)
        wrong = [
            cls(lease.seq + 1, lease.group_id, None, lease.worker_id, lease.expires_at, lease.attempt),
            cls(lease.seq, "h", None, lease.worker_id, lease.expires_at, lease.attempt),
            cls(lease.seq, lease.group_id, None, "w2", lease.expires_at, lease.attempt),
            cls(lease.seq, lease.group_id, None, lease.worker_id, lease.expires_at, lease.attempt + 1),
        ]
        for bad in wrong:
            for op in (transport.ack, transport.nack, lambda x: transport.nack(x, 5), lambda x: transport.extend(x, 5)):
                with pytest.raises(LeaseLost):
                    op(bad)
        assert tuple(transport.stats()) == (2, 1, 1, 0, 0, 0, 0)
        clock.advance(5)
        extended = transport.extend(cls(lease.seq, lease.group_id, None, lease.worker_id, 0.0, lease.attempt), 60)
        assert (extended.seq, extended.attempt, extended.expires_at) == (lease.seq, lease.attempt, 1065.0)
        transport.nack(rebuilt)  # closes the delivery: the original lease goes with it
        with pytest.raises(LeaseLost):
            transport.ack(lease)
        again = transport.claim("w", 30)
        assert (again.seq, again.attempt) == (lease.seq, 2)
        transport.ack(cls(again.seq, again.group_id, "any event", again.worker_id, -1.0, again.attempt))
        assert tuple(transport.stats()) == (1, 1, 0, 0, 0, 0, 0)

    # -- extend -------------------------------------------------------------

    def test_extend_old_and_new_lease_both_current(self, transport: Any, clock: ContractClock) -> None:
        """``extend`` returns a new lease (same seq, attempt, worker) until
        ``now + visibility``; old and new name the same delivery."""
        transport.publish("g", "e")
        old = transport.claim("w", 10)
        clock.advance(5)
        new = transport.extend(old, 60)
        assert (new.seq, new.group_id, new.worker_id, new.attempt) == (
            old.seq, old.group_id, old.worker_id, old.attempt
        )
        assert self.same_event(new.event, old.event)
        assert new.expires_at == clock() + 60 and old.expires_at == 1010.0
        clock.advance(30)  # past the old expiry, before the new one
        assert transport.claim("w2", 10) is None
        newer = transport.extend(old, 1)  # the old lease still names the delivery
        assert newer.expires_at == clock() + 1
        transport.nack(new)  # the delivery closes through either lease
        for lease in (old, new, newer):
            with pytest.raises(LeaseLost):
                transport.ack(lease)

    def test_extend_after_expiry_relocks(self, transport: Any, clock: ContractClock) -> None:
        transport.publish("g", "e", priority=0)
        lease = transport.claim("w", 10)
        clock.advance(50)
        assert transport.claim("w", 10, min_priority=1) is None  # expiry observed
        renewed = transport.extend(lease, 30)
        assert tuple(transport.stats()) == (1, 1, 1, 0, 0, 0, 0)
        assert transport.claim("w2", 10) is None  # blocked again
        transport.ack(renewed)
        assert len(transport) == 0

    # -- infinite visibility ----------------------------------------------------

    def test_visibility_inf_never_expires(self, transport: Any, clock: ContractClock) -> None:
        transport.publish("g", "e")
        lease = transport.claim("w", math.inf)
        assert lease.expires_at == math.inf
        clock.advance(1e308)
        assert transport.claim("w", 1) is None
        assert transport.stats().leased == 1
        assert transport.claim("w", 10**400) is None  # int beyond float: +inf too

    def test_huge_int_visibility_counts_as_inf(self, transport: Any) -> None:
        transport.publish("g", "e")
        assert transport.claim("w", 10**400).expires_at == math.inf

    # -- 6. events ---------------------------------------------------------------

    def test_events_come_back_equal(self, transport: Any, clock: ContractClock) -> None:
        """Every delivery carries the published event (an equal copy at least)."""
        events = ["text", 17, 2.5, None, [1, "two", [3]], {"k": "v", "n": [1, 2]}, ""]
        for i, event in enumerate(events):
            transport.publish(f"g{i}", event)
        leases = self.claim_all(transport)
        assert [lease.event for lease in leases] == events
        clock.advance(1)
        assert transport.extend(leases[4], 5).event == events[4]
        transport.nack(leases[5])
        assert transport.claim("w", 5).event == events[5]

    @requires("preserves_identity", "that lease.event is the published object")
    def test_identity_of_events(self, transport: Any, clock: ContractClock) -> None:
        """Events are held by reference: ``lease.event is`` the published
        object, unhashable and uncopyable ones too."""

        class Unhashable:
            __hash__ = None  # type: ignore[assignment]

        events = [Unhashable(), [1, 2], {"k": "v"}, object()]
        for i, event in enumerate(events):
            transport.publish(f"g{i}", event)
        leases = self.claim_all(transport)
        assert [lease.event for lease in leases] == events
        assert all(lease.event is event for lease, event in zip(leases, events))
        lease = leases[0]
        clock.advance(1)
        assert transport.extend(lease, 5).event is events[0]
        transport.nack(lease)
        assert transport.claim("w", 5).event is events[0]

    # -- Lease -------------------------------------------------------------------

    def test_lease_is_an_immutable_value(self, transport: Any) -> None:
        """``Lease`` fields (seed's three first), exact types, immutable,
        hashable even when the event is not."""
        event = ["unhashable"]
        transport.publish("g", event)
        lease = transport.claim("w", 30)
        assert (lease.seq, lease.group_id, lease.event, lease.worker_id, lease.expires_at, lease.attempt) == (
            1, "g", event, "w", 1030.0, 1
        )
        assert [type(getattr(lease, f)) for f in ("seq", "group_id", "worker_id", "expires_at", "attempt")] == [
            int, str, str, float, int
        ]
        for name in ("seq", "group_id", "event", "worker_id", "expires_at", "attempt"):
            with pytest.raises(AttributeError):
                setattr(lease, name, 5)
        assert lease == lease and len({lease, lease}) == 1
        assert lease != (1, "g", event, "w", 1030.0, 1)
        assert transport.extend(lease, 60) != lease  # another expires_at

    # -- stats, len, close, context manager ---------------------------------------

    def test_stats_fields(self, transport: Any, clock: ContractClock) -> None:
        """``stats()``: named fields messages, groups, leased, parked, paused,
        buried, scheduled; expired leases and parks count as neither."""
        stats = transport.stats()
        assert stats._fields == ("messages", "groups", "leased", "parked", "paused", "buried", "scheduled")
        assert type(stats).__name__ == "TransportStats"
        assert isinstance(stats, tuple) and stats == (0, 0, 0, 0, 0, 0, 0)
        for group in ("a", "a", "b", "c", "d"):
            transport.publish(group, group)
        leased = transport.claim("w", 10)
        parked = transport.claim("w", 10)
        transport.nack(parked, 20)
        stats = transport.stats()
        assert (stats.messages, stats.groups, stats.leased, stats.parked) == (5, 4, 1, 1)
        clock.advance(15)  # the lease expired (nobody claimed since): neither
        assert transport.stats() == (5, 4, 0, 1, 0, 0, 0)
        clock.advance(10)
        assert transport.stats() == (5, 4, 0, 0, 0, 0, 0)
        transport.ack(leased)  # still current: accepted
        assert transport.stats() == (4, 4, 0, 0, 0, 0, 0)

    def test_len(self, transport: Any) -> None:
        """``len``: messages held, ready + leased + parked."""
        assert len(transport) == 0
        for i in range(4):
            transport.publish(f"g{i % 2}", i)
        lease = transport.claim("w", 10)
        parked = transport.claim("w", 10)
        transport.nack(parked, 100)
        assert len(transport) == 4  # ready + leased + parked
        transport.ack(lease)
        assert len(transport) == 3

    def test_close_idempotent(self, transport: Any) -> None:
        transport.publish("g", "e")
        assert transport.close() is None
        assert transport.close() is None
        if self.usable_after_close:
            assert len(transport) == 1

    def test_context_manager(self, new_transport: MakeTransport) -> None:
        """``with transport as t``: ``t`` is the transport; exceptions pass."""
        t = new_transport(ContractClock())
        with t as entered:
            assert entered is t
            t.publish("g", "e")
        if self.usable_after_close:
            assert len(t) == 1
        with pytest.raises(KeyError):
            with new_transport(ContractClock()):
                raise KeyError("not swallowed")

    # -- the clock ---------------------------------------------------------------

    @pytest.mark.parametrize(
        "op",
        [
            pytest.param(lambda t, lease: t.claim("w", 10), id="claim"),
            pytest.param(lambda t, lease: t.extend(lease, 10), id="extend"),
            pytest.param(lambda t, lease: t.nack(lease, 5), id="nack-park"),
            pytest.param(lambda t, lease: t.stats(), id="stats"),
        ],
    )
    @pytest.mark.parametrize(
        "bad, error",
        [
            pytest.param(RuntimeError("clock broke"), RuntimeError, id="raises"),
            pytest.param(float("nan"), ValueError, id="nan"),
            pytest.param("noon", TypeError, id="str"),
            pytest.param(True, TypeError, id="bool"),
            pytest.param(math.inf, ValueError, id="inf"),
            pytest.param(-math.inf, ValueError, id="-inf"),
            pytest.param(10**400, ValueError, id="huge-int"),
        ],
    )
    def test_bad_clock_leaves_transport_unchanged(
        self, new_transport: MakeTransport, op: Op, bad: Any, error: type
    ) -> None:
        """A clock that raises passes its error through; one that returns a
        non-number, a bool, NaN or an infinity gives TypeError / ValueError;
        either way the transport is left exactly as it was."""
        clocks = [ContractClock(), ContractClock()]
        subject, control = (new_transport(c) for c in clocks)
        leases = []
        for t, c in zip((subject, control), clocks):
            t.publish("a", 1)
            t.publish("a", 2)
            t.publish("b", 1)
            leases.append(t.claim("w", 10))
            c.advance(30)  # the lease ran out, unobserved: a claim would free it
        clocks[0].bad = bad
        with pytest.raises(error):
            op(subject, leases[0])
        clocks[0].behave()
        assert self.fingerprint(subject, clocks[0]) == self.fingerprint(control, clocks[1])

    def test_clock_returning_int_is_converted_to_float(self, new_transport: MakeTransport) -> None:
        t = new_transport(lambda: 1000)
        t.publish("g", "e")
        lease = t.claim("w", 5)
        assert lease.expires_at == 1005.0 and type(lease.expires_at) is float

    def test_clock_calling_back_into_transport_does_not_deadlock(self, new_transport: MakeTransport) -> None:
        """The clock is user code: it runs outside the transport's lock and
        may use the transport it belongs to."""
        holder: List[Any] = []
        seen: List[int] = []

        def clock() -> float:
            if holder:
                seen.append(len(holder[0]))
                seen.append(holder[0].publish("from-clock", "x"))
            return 1000.0

        t = new_transport(clock)
        holder.append(t)
        t.publish("g", "e")
        self.run_with_deadline(lambda: t.claim("w", 10))
        holder.clear()
        assert seen == [1, 2]
        assert len(t) == 2

    # -- user code never under the lock --------------------------------------

    @requires("preserves_identity", "to hold events by reference (an event's finaliser runs on the transport's ack)")
    @pytest.mark.parametrize("cyclic", [False, True])
    def test_event_finaliser_publishing_to_same_transport_on_ack(self, transport: Any, cyclic: bool) -> None:
        """When ``ack`` drops the last reference to an event, its ``__del__``
        may publish to the same transport: no deadlock, no half-done state."""
        published: List[int] = []

        class Step:
            def __init__(self) -> None:
                if cyclic:
                    self.me = self  # only the cycle collector frees it

            def __del__(self) -> None:
                published.append(transport.publish("next", "step 2"))

        def scenario() -> None:
            transport.publish("g", Step())
            lease = transport.claim("w", 30)
            transport.ack(lease)
            del lease  # the last reference goes now
            gc.collect()

        self.run_with_deadline(scenario)
        assert published == [2]
        assert len(transport) == 1
        lease = transport.claim("w", 30)
        assert (lease.seq, lease.group_id, lease.event) == (2, "next", "step 2")

    def test_str_subclass_ids_are_stored_as_exact_str(self, transport: Any) -> None:
        """A ``str`` subclass id is used as the equal exact ``str`` (its own
        ``__hash__``/``__eq__`` never run) and comes back as ``str``."""

        class Name(str):
            def __hash__(self) -> int:  # must never be called under the lock
                raise AssertionError("user __hash__ ran")

            def __eq__(self, other: object) -> bool:
                raise AssertionError("user __eq__ ran")

        transport.publish(Name("g"), "e")
        transport.publish("g", "f")  # the same group as Name("g")
        lease = transport.claim(Name("w"), 10)
        assert type(lease.group_id) is str and type(lease.worker_id) is str
        assert (lease.group_id, lease.worker_id) == ("g", "w")
        assert transport.claim("w", 10) is None  # one group, blocked
        with pytest.raises(ValueError):
            transport.claim(Name("__parked__"), 10)
        transport.ack(lease)
        assert transport.claim(Name("w"), 10).seq == 2
