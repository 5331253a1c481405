"""One test per rule of SPEC.md (and docs/decisions.md), on both implementations.

Every test takes the ``transport``/``make_transport``/``impl`` fixtures of
``conftest.py``, so it runs against the pure-Python and the Cython transport.
"""

from __future__ import annotations

import copy
import gc
import math
import pickle
import threading
from types import ModuleType
from typing import Any, Callable

import pytest

from helpers import CPYTHON_ONLY_REASON, IS_CPYTHON
from leasequeue.testing import ManualClock
from helpers import INT64_MIN, fingerprint

import leasequeue


def claim_all(t: Any, worker: str = "w", visibility: float = 30.0, min_priority: int = INT64_MIN) -> list[Any]:
    """Claim until nothing is eligible; return the leases in claim order."""
    leases = []
    while (lease := t.claim(worker, visibility, min_priority)) is not None:
        leases.append(lease)
    return leases


# -- 1. single active consumer per group -------------------------------------


def test_single_active_consumer_per_group(transport: Any) -> None:
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


# -- 2. FIFO within a group ---------------------------------------------------


def test_fifo_within_group(transport: Any, clock: ManualClock) -> None:
    seqs = {"a": [], "b": []}
    for i in range(10):
        group = "ab"[i % 3 == 0]
        seqs[group].append(transport.publish(group, i))
    delivered: dict[str, list[int]] = {"a": [], "b": []}
    while (lease := transport.claim("w", 30)) is not None:
        delivered[lease.group_id].append(lease.seq)
        transport.ack(lease)
        clock.advance(1)
    assert delivered == seqs


# -- 3. round-robin between groups -------------------------------------------


@pytest.mark.parametrize("tick", [0.0, 1.0], ids=["frozen-clock", "moving-clock"])
def test_round_robin_order(transport: Any, clock: ManualClock, tick: float) -> None:
    """The group claimed least recently goes first, by claim order: a frozen
    clock (all claims in one tick) must not serve a group twice in a row."""
    for _ in range(3):
        for group in ("a", "b", "c"):
            transport.publish(group, group)
    order = []
    while (lease := transport.claim("w", 30)) is not None:
        order.append(lease.group_id)
        transport.ack(lease)
        clock.advance(tick)
    assert order == ["a", "b", "c"] * 3


def test_round_robin_just_served_group_goes_to_back(transport: Any) -> None:
    for group in ("a", "b", "c"):
        transport.publish(group, 1)
        transport.publish(group, 2)
    la = transport.claim("w", 30)
    lb = transport.claim("w", 30)
    transport.ack(lb)  # b was served after a: b is now the most recent
    transport.ack(la)
    assert [x.group_id for x in claim_all(transport)] == ["c", "a", "b"]


# -- never-claimed groups first, by their oldest message ----------------------


def test_never_claimed_groups_first_in_order_of_oldest_message(transport: Any) -> None:
    transport.publish("old", 1)
    transport.publish("old", 2)
    lease = transport.claim("w", 30)
    transport.ack(lease)  # "old" has been claimed: it goes behind new groups
    transport.publish("z", 1)  # seq 3
    transport.publish("y", 1)  # seq 4
    transport.publish("z", 2)
    transport.publish("x", 1)  # seq 6
    assert [x.group_id for x in claim_all(transport)] == ["z", "y", "x", "old"]


# -- 4. priority floor --------------------------------------------------------


def test_priority_floor(transport: Any) -> None:
    transport.publish("low", "l", priority=-5)
    transport.publish("mid", "m", priority=0)
    transport.publish("high", "h", priority=7)
    assert transport.claim("w", 30, min_priority=8) is None
    assert transport.claim("w", 30, min_priority=7).group_id == "high"
    assert transport.claim("w", 30, min_priority=7) is None
    assert transport.claim("w", 30).group_id == "mid"  # default floor 0
    assert transport.claim("w", 30) is None
    assert transport.claim("w", 30, min_priority=-5).group_id == "low"


def test_priority_floor_keeps_round_robin_among_eligible(transport: Any) -> None:
    for group, prio in (("a", 1), ("b", 5), ("c", 1), ("d", 5)):
        transport.publish(group, 1, priority=prio)
        transport.publish(group, 2, priority=prio)
    got = [transport.claim("w", 30, min_priority=5) for _ in range(2)]
    assert [x.group_id for x in got] == ["b", "d"]
    for lease in got:
        transport.ack(lease)
    # a and c were never claimed: they come before b and d
    assert [x.group_id for x in claim_all(transport)] == ["a", "c", "b", "d"]


# -- 5. crash recovery --------------------------------------------------------


def test_expiry_recovery_after_crash(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "e")
    lease = transport.claim("crashing", 30)
    assert lease.expires_at == clock.now + 30
    clock.advance(30)  # expires_at == now: not yet expired (strictly <)
    assert transport.claim("w2", 30) is None
    clock.advance(0.5)
    again = transport.claim("w2", 30)
    assert again is not None
    assert (again.seq, again.worker_id, again.attempt) == (lease.seq, "w2", 2)
    assert again.event is lease.event


def test_expiry_is_permanent_once_observed(transport: Any, clock: ManualClock) -> None:
    """decisions.md: once a claim saw the lease expired, a clock going back
    does not re-lock it."""
    transport.publish("g", "e", priority=0)
    transport.claim("w", 10)
    clock.advance(20)
    assert transport.claim("w", 10, min_priority=1) is None  # observes expiry
    clock.advance(-15)  # back before the old expiry
    again = transport.claim("w2", 10)
    assert again is not None and again.attempt == 2


def test_expiry_not_observed_still_blocks_when_clock_goes_back(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "e")
    transport.claim("w", 10)
    clock.advance(20)  # nobody looked
    clock.advance(-15)
    assert transport.claim("w2", 10) is None


def test_stats_observes_expiry_permanently(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "e")
    transport.claim("w", 10)
    clock.advance(20)
    assert tuple(transport.stats()) == (1, 1, 0, 0, 0)
    clock.advance(-15)
    assert transport.claim("w2", 10) is not None


@pytest.mark.parametrize(
    "op",
    [lambda t, lease: t.claim("w", 1, 10**9), lambda t, lease: t.stats(), lambda t, lease: t.extend(lease, 1),
     lambda t, lease: t.nack(lease, 1)],
    ids=["claim", "stats", "extend", "nack-park"],
)
def test_time_never_runs_backwards(make_transport: Callable[..., Any], op: Callable[[Any, Any], Any]) -> None:
    """decisions.md: an operation acts at max(clock(), the latest time used)."""
    clock = ManualClock()
    t = make_transport(clock=clock)
    t.publish("g", "e")
    t.publish("h", "e")
    lease = t.claim("w", 5)
    clock.advance(100)  # 1100
    op(t, lease)  # acts at 1100
    clock.advance(-60)  # the clock says 1040
    assert t.claim("w", 5).expires_at == 1105.0  # not 1045


@pytest.mark.parametrize(
    "op, error",
    [(lambda t, stale: t.extend(stale, 1), "LeaseLost"), (lambda t, stale: t.nack(stale, 1), "LeaseLost"),
     (lambda t, stale: t.claim("w", 1, 2**63), "OverflowError")],
    ids=["extend-stale", "nack-park-stale", "claim-bad-floor"],
)
def test_failed_call_does_not_move_the_transport_time(
    make_transport: Callable[..., Any], op: Callable[[Any, Any], Any], error: str
) -> None:
    clock = ManualClock()
    t = make_transport(clock=clock)
    t.publish("g", "e")
    t.publish("h", "e")
    stale = t.claim("w", 5)
    t.nack(stale)
    clock.advance(1000)  # 2000
    with pytest.raises(Exception) as info:
        op(t, stale)
    assert type(info.value).__name__ == error
    clock.advance(-500)  # 1500
    assert t.claim("w", 5).expires_at == 1505.0


# -- park ---------------------------------------------------------------------


def test_park_blocks_group(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "first")
    transport.publish("g", "second")
    lease = transport.claim("w", 30)
    transport.nack(lease, delay=100)
    assert tuple(transport.stats()) == (2, 1, 0, 1, 0)
    clock.advance(100)  # due exactly now: still parked
    assert transport.claim("w", 30) is None
    clock.advance(1)
    again = transport.claim("w", 30)
    assert (again.seq, again.attempt) == (lease.seq, 2)


def test_nack_with_infinite_delay_parks_forever(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "e")
    transport.nack(transport.claim("w", 1), delay=math.inf)
    clock.advance(1e300)
    assert transport.claim("w", 1) is None
    assert tuple(transport.stats()) == (1, 1, 0, 1, 0)


# -- nack(0) ------------------------------------------------------------------


def test_nack_zero_retries_first_with_attempt_plus_one(transport: Any) -> None:
    transport.publish("g", "first")
    transport.publish("g", "second")
    lease = transport.claim("w", 30)
    transport.nack(lease)
    again = transport.claim("w2", 30)
    assert (again.seq, again.event, again.attempt, again.worker_id) == (lease.seq, "first", 2, "w2")
    transport.nack(again, 0)
    assert transport.claim("w3", 30).attempt == 3


def test_nack_keeps_round_robin_position(transport: Any) -> None:
    for group in ("a", "b", "c"):
        transport.publish(group, 1)
    la = transport.claim("w", 30)
    lb = transport.claim("w", 30)
    transport.nack(la)  # a keeps the position of its claim: before b
    transport.nack(lb)
    assert [x.group_id for x in claim_all(transport)] == ["c", "a", "b"]


# -- ack ----------------------------------------------------------------------


def test_ack_drops_empty_group_recreated_fresh(transport: Any) -> None:
    transport.publish("g", "e", priority=9)
    transport.publish("h", "e")
    transport.ack(transport.claim("w", 30))  # g served and emptied
    assert tuple(transport.stats())[:2] == (1, 1)
    transport.publish("g", "again", priority=-1)  # fresh: the new priority holds
    assert transport.claim("w", 30).group_id == "h"
    assert transport.claim("w", 30) is None  # g is -1 now, below the floor 0
    assert transport.claim("w", 30, min_priority=-1).group_id == "g"


def test_ack_forgets_round_robin_position(transport: Any) -> None:
    transport.publish("a", 1)
    transport.publish("b", 1)
    transport.publish("b", 2)
    transport.ack(transport.claim("w", 30))  # a: claimed and emptied
    transport.ack(transport.claim("w", 30))  # b: claimed, one left
    transport.publish("a", 2)  # a is fresh: never claimed, so before b
    assert [x.group_id for x in claim_all(transport)] == ["a", "b"]


def test_priority_set_on_first_publish_only(transport: Any) -> None:
    transport.publish("g", 1, priority=5)
    transport.publish("g", 2, priority=-5)  # ignored
    lease = transport.claim("w", 30, min_priority=5)
    assert lease is not None and lease.seq == 1
    transport.ack(lease)
    assert transport.claim("w", 30, min_priority=5).seq == 2


def test_publish_returns_increasing_seq_never_reused(transport: Any) -> None:
    assert [transport.publish("g", i) for i in range(3)] == [1, 2, 3]
    while (lease := transport.claim("w", 30)) is not None:
        transport.ack(lease)
    assert len(transport) == 0  # everything acked, the group forgotten
    assert transport.publish("g", 4) == 4
    assert transport.publish("h", 5) == 5


# -- fencing ------------------------------------------------------------------


def _history_expired_and_reclaimed(t: Any, clock: Any) -> Any:
    t.publish("g", "e")
    t.publish("g", "f")
    stale = t.claim("w1", 10)
    clock.now += 20
    again = t.claim("w2", 10)  # re-delivered: attempt 2
    assert (again.seq, again.attempt) == (stale.seq, 2)
    t.publish("h", "x")
    return stale


def _history_acked(t: Any, clock: Any) -> Any:
    t.publish("g", "e")
    t.publish("g", "f")
    stale = t.claim("w1", 10)
    t.ack(stale)
    return stale


def _history_nacked(t: Any, clock: Any) -> Any:
    t.publish("g", "e")
    t.publish("h", "x")
    stale = t.claim("w1", 10)
    t.nack(stale)
    return stale


def _history_parked(t: Any, clock: Any) -> Any:
    t.publish("g", "e")
    stale = t.claim("w1", 10)
    t.nack(stale, 50)
    return stale


@pytest.mark.parametrize(
    "history", [_history_expired_and_reclaimed, _history_acked, _history_nacked, _history_parked]
)
@pytest.mark.parametrize(
    "op",
    [
        lambda t, lease: t.ack(lease),
        lambda t, lease: t.nack(lease),
        lambda t, lease: t.nack(lease, 5),
        lambda t, lease: t.extend(lease, 30),
    ],
    ids=["ack", "nack0", "nack5", "extend"],
)
def test_fencing_stale_lease_raises_lease_lost_and_changes_nothing(
    make_transport: Callable[..., Any], history: Callable[..., Any], op: Callable[..., Any]
) -> None:
    clocks = [ManualClock(), ManualClock()]
    subject, control = (make_transport(clock=c) for c in clocks)
    stale = history(subject, clocks[0])
    history(control, clocks[1])
    with pytest.raises(leasequeue.LeaseLost):
        op(subject, stale)
    assert fingerprint(subject, clocks[0]) == fingerprint(control, clocks[1])


def test_stale_ack_does_not_delete_the_new_holders_message(transport: Any, clock: ManualClock) -> None:
    """The seed's bug the SPEC fences against."""
    transport.publish("g", "e")
    stale = transport.claim("w1", 10)
    clock.advance(11)
    fresh = transport.claim("w2", 10)
    with pytest.raises(leasequeue.LeaseLost):
        transport.ack(stale)
    assert len(transport) == 1
    transport.ack(fresh)
    assert len(transport) == 0


def test_ack_after_expiry_without_reclaim_is_accepted(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "e", priority=0)
    lease = transport.claim("w", 10)
    clock.advance(100)
    assert transport.claim("w", 10, min_priority=1) is None  # observed, not re-claimed
    assert tuple(transport.stats()) == (1, 1, 0, 0, 0)
    transport.ack(lease)
    assert len(transport) == 0 and tuple(transport.stats()) == (0, 0, 0, 0, 0)


@pytest.mark.parametrize("observed", [False, True])
def test_nack_after_expiry_without_reclaim_is_accepted(transport: Any, clock: ManualClock, observed: bool) -> None:
    transport.publish("g", "e")
    lease = transport.claim("w", 10)
    clock.advance(100)
    if observed:
        transport.stats()
    transport.nack(lease, 50)  # parks from now
    assert tuple(transport.stats()) == (1, 1, 0, 1, 0)
    clock.advance(50)
    assert transport.claim("w", 10) is None
    clock.advance(1)
    assert transport.claim("w", 10).attempt == 2


# -- extend -------------------------------------------------------------------


def test_extend_old_and_new_lease_both_current(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "e")
    old = transport.claim("w", 10)
    clock.advance(5)
    new = transport.extend(old, 60)
    assert (new.seq, new.group_id, new.worker_id, new.attempt) == (old.seq, old.group_id, old.worker_id, old.attempt)
    assert new.event is old.event
    assert new.expires_at == clock.now + 60 and old.expires_at == 1010.0
    clock.advance(30)  # past the old expiry, before the new one
    assert transport.claim("w2", 10) is None
    newer = transport.extend(old, 1)  # the old lease still names the delivery
    assert newer.expires_at == clock.now + 1
    transport.nack(new)  # the delivery closes through either lease
    for lease in (old, new, newer):
        with pytest.raises(leasequeue.LeaseLost):
            transport.ack(lease)


def test_extend_after_expiry_relocks(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "e", priority=0)
    lease = transport.claim("w", 10)
    clock.advance(50)
    assert transport.claim("w", 10, min_priority=1) is None  # expiry observed
    renewed = transport.extend(lease, 30)
    assert tuple(transport.stats()) == (1, 1, 1, 0, 0)
    assert transport.claim("w2", 10) is None  # blocked again
    transport.ack(renewed)
    assert len(transport) == 0


# -- 6. identity --------------------------------------------------------------


def test_identity_of_events(transport: Any, clock: ManualClock) -> None:
    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

    events = [Unhashable(), [1, 2], {"k": "v"}, object()]
    for i, event in enumerate(events):
        transport.publish(f"g{i}", event)
    leases = claim_all(transport)
    assert [lease.event for lease in leases] == events
    assert all(lease.event is event for lease, event in zip(leases, events))
    lease = leases[0]
    clock.advance(1)
    assert transport.extend(lease, 5).event is events[0]
    transport.nack(lease)
    assert transport.claim("w", 5).event is events[0]


# -- Lease value semantics ----------------------------------------------------


def test_lease_fields_equality_hash_immutability_repr(transport: Any, impl: ModuleType) -> None:
    event = ["unhashable"]
    transport.publish("g", event)
    lease = transport.claim("w", 30)
    assert (lease.seq, lease.group_id, lease.event, lease.worker_id, lease.expires_at, lease.attempt) == (
        1, "g", event, "w", 1030.0, 1
    )
    same = impl.Lease(1, "g", event, "w", 1030.0, 1)  # positional, seed fields first
    assert same == lease and lease == same and not (same != lease)
    assert hash(same) == hash(lease) == hash((1, "g", "w", 1030.0, 1))
    assert impl.Lease(1, "g", ["unhashable"], "w", 1030.0, 1) != lease  # equal but not the same event
    for field, value in (("seq", 2), ("group_id", "h"), ("worker_id", "x"), ("expires_at", 1.0), ("attempt", 2)):
        fields = dict(seq=1, group_id="g", event=event, worker_id="w", expires_at=1030.0, attempt=1)
        fields[field] = value
        assert impl.Lease(**fields) != lease
    assert lease.__eq__("not a lease") is NotImplemented
    assert lease != (1, "g", event, "w", 1030.0, 1)
    assert len({lease, same}) == 1
    for name in ("seq", "group_id", "event", "worker_id", "expires_at", "attempt"):
        with pytest.raises(AttributeError):
            setattr(lease, name, 5)
    with pytest.raises(AttributeError):
        lease.new_attribute = 1  # type: ignore[attr-defined]
    assert repr(lease) == (
        "Lease(seq=1, group_id='g', event=['unhashable'], worker_id='w', expires_at=1030.0, attempt=1)"
    )


def test_lease_final_not_picklable_copy_is_itself(transport: Any, impl: ModuleType) -> None:
    transport.publish("g", "e")
    lease = transport.claim("w", 30)
    with pytest.raises(TypeError):
        type("Sub", (impl.Lease,), {})
    with pytest.raises(TypeError):
        pickle.dumps(lease)
    assert copy.copy(lease) is lease
    assert copy.deepcopy(lease) is lease
    transport.ack(copy.copy(lease))
    assert len(transport) == 0


def test_forged_lease_equal_to_a_real_one_is_not_current(transport: Any, impl: ModuleType) -> None:
    transport.publish("g", "e")
    lease = transport.claim("w", 30)
    forged = impl.Lease(lease.seq, lease.group_id, lease.event, lease.worker_id, lease.expires_at, lease.attempt)
    assert forged == lease
    for op in (transport.ack, transport.nack, lambda x: transport.extend(x, 5)):
        with pytest.raises(leasequeue.LeaseLost):
            op(forged)
    transport.ack(lease)


def test_lease_from_another_instance_raises_lease_lost(make_transport: Callable[..., Any]) -> None:
    clock = ManualClock()
    one, two = make_transport(clock=clock), make_transport(clock=clock)
    event = object()
    for t in (one, two):
        t.publish("g", event)
    foreign = two.claim("w", 30)
    mine = one.claim("w", 30)
    assert foreign == mine  # look-alikes: equal, but issued by another transport
    for op in (one.ack, one.nack, lambda x: one.nack(x, 5), lambda x: one.extend(x, 5)):
        with pytest.raises(leasequeue.LeaseLost):
            op(foreign)
    assert tuple(one.stats()) == (1, 1, 1, 0, 0)
    one.ack(mine)
    two.ack(foreign)


# -- stats, len, close, context manager -------------------------------------


def test_stats_fields(transport: Any, clock: ManualClock, impl: ModuleType) -> None:
    stats = transport.stats()
    assert stats._fields == ("messages", "groups", "leased", "parked", "paused")
    assert type(stats).__name__ == "TransportStats"
    assert isinstance(stats, tuple) and stats == (0, 0, 0, 0, 0)
    for group in ("a", "a", "b", "c", "d"):
        transport.publish(group, group)
    leased = transport.claim("w", 10)
    parked = transport.claim("w", 10)
    transport.nack(parked, 20)
    stats = transport.stats()
    assert (stats.messages, stats.groups, stats.leased, stats.parked) == (5, 4, 1, 1)
    clock.advance(15)  # the lease expired (nobody claimed since): neither
    assert transport.stats() == (5, 4, 0, 1, 0)
    clock.advance(10)
    assert transport.stats() == (5, 4, 0, 0, 0)
    transport.ack(leased)  # still current: accepted
    assert transport.stats() == (4, 4, 0, 0, 0)


def test_len(transport: Any) -> None:
    assert len(transport) == 0
    for i in range(4):
        transport.publish(f"g{i % 2}", i)
    lease = transport.claim("w", 10)
    parked = transport.claim("w", 10)
    transport.nack(parked, 100)
    assert len(transport) == 4  # ready + leased + parked
    transport.ack(lease)
    assert len(transport) == 3


def test_close_idempotent(transport: Any) -> None:
    transport.publish("g", "e")
    assert transport.close() is None
    assert transport.close() is None
    assert len(transport) == 1


def test_context_manager(make_transport: Callable[..., Any]) -> None:
    t = make_transport(clock=ManualClock())
    with t as entered:
        assert entered is t
        t.publish("g", "e")
    assert len(t) == 1
    with pytest.raises(KeyError):
        with make_transport(clock=ManualClock()):
            raise KeyError("not swallowed")


def test_constructor_clock(make_transport: Callable[..., Any]) -> None:
    with pytest.raises(TypeError):
        make_transport(clock=5)
    t = make_transport(ManualClock(50.0))  # positional
    t.publish("g", "e")
    assert t.claim("w", 1).expires_at == 51.0
    default = make_transport()  # time.time
    default.publish("g", "e")
    assert default.claim("w", 0) is not None


# -- infinite visibility -----------------------------------------------------


def test_visibility_inf_never_expires(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "e")
    lease = transport.claim("w", math.inf)
    assert lease.expires_at == math.inf
    clock.advance(1e308)
    assert transport.claim("w", 1) is None
    assert transport.stats().leased == 1
    assert transport.claim("w", 10**400) is None  # int beyond float: +inf too


def test_huge_int_visibility_counts_as_inf(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "e")
    assert transport.claim("w", 10**400).expires_at == math.inf


# -- which operations read the clock -----------------------------------------


def test_clock_read_once_by_claim_extend_stats_and_parking_nack_only(make_transport: Callable[..., Any]) -> None:
    clock = ManualClock()
    t = make_transport(clock=clock)

    def reads(op: Callable[[], Any]) -> int:
        before = clock.reads
        op()
        return clock.reads - before

    assert reads(lambda: t.publish("g", 1)) == 0
    assert reads(lambda: t.publish("g", 2)) == 0
    lease = t.claim("w", 10)
    assert clock.reads == 1
    assert reads(lambda: t.claim("w", 10)) == 1  # nothing eligible: still one read
    assert reads(lambda: t.extend(lease, 10)) == 1
    assert reads(lambda: t.nack(lease, 0)) == 0
    assert reads(lambda: t.nack(t.claim("w", 10), 5)) == 2  # claim + parking nack
    clock.advance(10)
    lease = t.claim("w", 10)
    assert reads(lambda: t.nack(lease, -0.0)) == 0
    assert reads(lambda: t.ack(t.claim("w", 10))) == 1  # the claim only
    assert reads(t.stats) == 1
    assert reads(lambda: len(t)) == 0
    assert reads(t.close) == 0


# -- re-entrancy: user code never under the lock -----------------------------


def _run_with_deadline(target: Callable[[], None], seconds: float = 20.0) -> None:
    """Run ``target`` in a daemon thread; fail (instead of hanging) on deadlock."""
    errors: list[BaseException] = []

    def wrapper() -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=wrapper, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "deadlock: the operation never returned"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("cyclic", [False, True])
def test_event_finaliser_publishing_to_same_transport_on_ack(transport: Any, cyclic: bool) -> None:
    published: list[int] = []

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

    _run_with_deadline(scenario)
    assert published == [2]
    assert len(transport) == 1
    lease = transport.claim("w", 30)
    assert (lease.seq, lease.group_id, lease.event) == (2, "next", "step 2")


def test_clock_calling_back_into_transport_does_not_deadlock(make_transport: Callable[..., Any]) -> None:
    """The clock is user code: it may use the transport it belongs to."""
    holder: list[Any] = []
    seen: list[int] = []

    def clock() -> float:
        if holder:
            seen.append(len(holder[0]))
            seen.append(holder[0].publish("from-clock", "x"))
        return 1000.0

    t = make_transport(clock=clock)
    holder.append(t)
    t.publish("g", "e")
    _run_with_deadline(lambda: t.claim("w", 10))
    assert seen == [1, 2]
    assert len(t) == 2


@pytest.mark.parametrize(
    "op",
    [
        lambda t, lease: t.claim("w", 10),
        lambda t, lease: t.extend(lease, 10),
        lambda t, lease: t.nack(lease, 5),
        lambda t, lease: t.stats(),
    ],
    ids=["claim", "extend", "nack-park", "stats"],
)
@pytest.mark.parametrize(
    "bad, error",
    [(RuntimeError("clock broke"), RuntimeError), (float("nan"), ValueError), ("noon", TypeError),
     (True, TypeError), (math.inf, ValueError), (-math.inf, ValueError), (10**400, ValueError)],
    ids=["raises", "nan", "str", "bool", "inf", "-inf", "huge-int"],
)
def test_bad_clock_leaves_transport_unchanged(
    make_transport: Callable[..., Any], op: Callable[..., Any], bad: Any, error: type
) -> None:
    clocks = [ManualClock(), ManualClock()]
    subject, control = (make_transport(clock=c) for c in clocks)
    leases = []
    for t, c in zip((subject, control), clocks):
        t.publish("a", 1)
        t.publish("a", 2)
        t.publish("b", 1)
        leases.append(t.claim("w", 10))
        c.advance(30)  # the lease ran out, unobserved: a claim would free it
    with clocks[0].misbehave(bad), pytest.raises(error):
        op(subject, leases[0])
    assert fingerprint(subject, clocks[0]) == fingerprint(control, clocks[1])


def test_clock_returning_int_is_converted_to_float(make_transport: Callable[..., Any]) -> None:
    t = make_transport(clock=lambda: 1000)
    t.publish("g", "e")
    lease = t.claim("w", 5)
    assert lease.expires_at == 1005.0 and type(lease.expires_at) is float


# -- ids: exact str ------------------------------------------------------------


def test_str_subclass_ids_are_stored_as_exact_str(transport: Any) -> None:
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


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
def test_gc_finaliser_calling_back_during_operations(transport: Any) -> None:
    """Any finaliser is user code, including one the cycle collector runs in
    the middle of an operation: it may use the transport (no deadlock) and
    must see it whole.  A collection threshold of 1 makes collections happen
    at almost every allocation, so one inside the locked region would run a
    finaliser there."""
    fired: list[int] = []

    class Garbage:
        def __init__(self) -> None:
            self.me = self  # freed only by the cycle collector

        def __del__(self) -> None:
            fired.append(len(transport))
            transport.publish("from-finaliser", len(fired))

    acked: list[int] = []

    def work() -> None:
        for i in range(3000):
            Garbage()
            transport.publish(f"g{i % 50}", i)
            lease = transport.claim("w", 10)
            if lease is not None:
                transport.ack(lease)
                acked.append(lease.seq)
            transport.stats()

    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        _run_with_deadline(work)
    finally:
        gc.set_threshold(*old)
    gc.collect()
    assert len(fired) == 3000
    assert len(transport) + len(acked) == 3000 + 3000  # every publish is there or acked
    assert len(set(acked)) == len(acked)


@pytest.mark.parametrize("through", ["transport", "lease"])
def test_cycles_through_held_events_are_collected(make_transport: Callable[..., Any], through: str) -> None:
    """Events are held by reference where the cycle collector sees them: an
    event that refers back to its transport (or to its lease) is freed."""
    import weakref

    class Event:
        pass

    t = make_transport(clock=ManualClock())
    event = Event()
    t.publish("g", event)
    t.publish("g", Event())
    lease = t.claim("w", 10)
    if through == "transport":
        event.back = t  # type: ignore[attr-defined]
    else:
        event.back = lease  # type: ignore[attr-defined]
        t.ack(lease)  # only the lease <-> event cycle holds it now
    alive = weakref.ref(event)
    del t, event, lease
    gc.collect()
    assert alive() is None
