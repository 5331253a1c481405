"""The control plane (SPEC Part 2, "Control plane"; docs/decisions.md, Part 2).

``pause``, ``resume``, ``purge``, ``set_priority``, ``group``, ``groups`` and
``stats().paused`` on both implementations, on a manual clock: each rule
alone first, then a long random walk that interleaves them with leases,
parks, expiries, nacks and acks and checks after every step that ``len``,
``stats()`` and ``groups()`` agree, with one another and with a simple
shadow of what was published, acked and purged.  (Which group a claim picks
among several is the referee's business: test_differential.py.)
"""

from __future__ import annotations

import math
import random
import sys
from typing import Any, Dict, List, Optional

import pytest

from helpers import CPYTHON_ONLY_REASON, INT64_MAX, INT64_MIN, IS_CPYTHON
from leasequeue.testing import ManualClock

from leasequeue import GroupInfo, LeaseLost, TransportStats

PARKED = "__parked__"


def info(t: Any, group_id: str) -> GroupInfo:
    got = t.group(group_id)
    assert got is not None, f"group {group_id!r} is not there"
    return got


def drain(t: Any, clock: ManualClock) -> List[Any]:
    """Everything claimable, far in the future, claimed and acked: the events."""
    clock.advance(1e9)
    out = []
    while (lease := t.claim("drain", 10, INT64_MIN)) is not None:
        out.append(lease.event)
        t.ack(lease)
    return out


def test_stats_built_with_0_1_0s_four_fields_has_no_paused_group() -> None:
    stats = TransportStats(5, 4, 1, 0)
    assert stats == (5, 4, 1, 0, 0, 0, 0) and stats.paused == 0 and stats.buried == 0


def test_stats_built_with_0_2_0s_five_fields_has_no_buried_group() -> None:
    stats = TransportStats(5, 4, 1, 0, 2)
    assert stats == (5, 4, 1, 0, 2, 0, 0) and stats.paused == 2 and stats.buried == 0


def test_group_info_built_with_0_2_0s_ten_fields_has_no_reason() -> None:
    info = GroupInfo("g", 0, 1, "ready", False, 1, None, None, None, None)
    assert info.reason is None and info.due_at is None and len(info) == 12 and info._fields[-2:] == ("reason", "due_at")


# -- pause ---------------------------------------------------------------------------


def test_pause_unknown_group_creates_it_paused_and_keeps_later_messages(transport: Any, clock: ManualClock) -> None:
    t = transport
    assert t.pause("g") is True
    assert t.pause("g") is False  # already paused
    assert t.group("g") == GroupInfo("g", 0, 0, "paused", True, None, None, None, None, None)
    assert t.stats() == TransportStats(0, 0, 0, 0, 1)  # an empty paused group counts in `paused` alone
    assert len(t) == 0
    t.publish("g", "first", 7)  # the group exists: the priority argument is ignored
    t.publish("g", "second")
    assert t.claim("w", 10, INT64_MIN) is None
    g = info(t, "g")
    assert (g.priority, g.messages, g.state, g.paused, g.head_seq) == (0, 2, "paused", True, 1)
    assert t.stats() == TransportStats(2, 1, 0, 0, 1)
    assert t.resume("g") is True
    assert t.resume("g") is False
    assert t.claim("w", 10, 1) is None  # priority 0, not 7
    lease = t.claim("w", 10)
    assert (lease.event, lease.attempt) == ("first", 1)
    assert t.stats() == TransportStats(2, 1, 1, 0, 0)


def test_pause_stops_claims_but_not_the_lease_already_out(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish("g", "a")
    t.publish("g", "b")
    lease = t.claim("w", 10)
    assert t.pause("g") is True
    g = info(t, "g")
    assert (g.state, g.paused, g.worker_id, g.expires_at, g.attempt) == ("leased", True, "w", 1010.0, 1)
    longer = t.extend(lease, 20)  # the worker may extend...
    assert longer.expires_at == 1020.0
    t.ack(longer)  # ...and ack
    assert t.claim("w", 10) is None  # "b" waits in the paused group
    assert info(t, "g").state == "paused"
    t.resume("g")
    assert t.claim("w", 10).event == "b"


@pytest.mark.parametrize("how", ["nack0", "expiry"])
def test_nack_or_expiry_leaves_the_message_in_the_still_paused_group(
    transport: Any, clock: ManualClock, how: str
) -> None:
    t = transport
    t.publish("g", "a")
    t.publish("h", "other")
    lease = t.claim("w", 10)
    assert lease.group_id == "g"
    t.pause("g")
    if how == "nack0":
        t.nack(lease)
    else:
        clock.advance(11)
    assert t.claim("w", 10).group_id == "h"  # the claim sees the expiry; "g" stays out
    assert t.claim("w", 10) is None
    g = info(t, "g")
    assert (g.state, g.paused, g.messages, g.worker_id, g.attempt) == ("paused", True, 1, None, None)
    if how == "expiry":
        t.ack(lease)  # expired but nobody claimed it since: still current
        assert t.group("g") == GroupInfo("g", 0, 0, "paused", True, None, None, None, None, 1000.0)
        return
    assert t.resume("g") is True
    again = t.claim("w", 10)
    assert (again.seq, again.attempt) == (lease.seq, 2)


def test_paused_group_is_never_forgotten(transport: Any, clock: ManualClock) -> None:
    """Its last message acked while paused, a group keeps its priority, its
    round-robin place and ``last_claimed_at``; messages published later wait."""
    t = transport
    t.publish("a", "a1", 5)
    t.publish("b", "b1", 5)
    lease = t.claim("w", 10, 5)
    assert lease.group_id == "a"
    t.pause("a")
    clock.advance(1)
    t.ack(lease)
    assert t.group("a") == GroupInfo("a", 5, 0, "paused", True, None, None, None, None, 1000.0)
    assert t.stats() == TransportStats(1, 1, 0, 0, 1)
    t.publish("a", "a2", 0)  # priority ignored: the group was kept
    t.publish("c", "c1", 5)
    assert info(t, "a").priority == 5
    t.resume("a")
    # "a" was claimed once: behind the never-claimed "b" and "c"
    order = []
    while (got := t.claim("w", 10, 5)) is not None:
        order.append(got.event)
        t.ack(got)
    assert order == ["b1", "c1", "a2"]


def test_pause_created_group_is_placed_by_its_oldest_message(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish("a", "a1")  # seq 1
    t.pause("b")  # created before "c", but with no message
    t.publish("c", "c1")  # seq 2
    t.publish("b", "b1")  # seq 3
    t.resume("b")
    got = [t.claim("w", 10).group_id for _ in range(3)]
    assert got == ["a", "c", "b"]


def test_pause_created_group_comes_before_claimed_groups(transport: Any, clock: ManualClock) -> None:
    """Never claimed, it is placed among the never-claimed groups (by its
    oldest message), so before any group claimed once, and reports no
    ``last_claimed_at``."""
    t = transport
    t.publish("old", "o")
    t.nack(t.claim("w", 10))  # "old" claimed once: after every never-claimed group
    t.pause("b")
    t.publish("b", "b1")
    assert info(t, "b").last_claimed_at is None
    t.resume("b")
    assert [t.claim("w", 10).group_id for _ in range(2)] == ["b", "old"]


def test_groups_paused_before_their_first_message_keep_their_level_alive(transport: Any) -> None:
    """A group created by ``pause`` counts in its priority level like any
    other: the level stays while any of its groups does, whichever goes first."""
    t = transport
    t.publish("a", "a1")
    t.publish("b", "b1")
    t.pause("new")  # the level of priority 0 now holds a, b and new
    t.ack(t.claim("w", 10))  # a: forgotten
    t.ack(t.claim("w", 10))  # b: forgotten
    t.publish("new", "n1")
    t.resume("new")
    lease = t.claim("w", 10)
    assert lease is not None and lease.group_id == "new"
    t.ack(lease)
    t.publish("c", "c1")  # a fresh level
    assert t.claim("w", 10).group_id == "c"


# -- resume --------------------------------------------------------------------------


def test_resume_of_unknown_group_is_false_and_creates_nothing(transport: Any) -> None:
    assert transport.resume("nope") is False
    assert transport.group("nope") is None
    assert transport.groups() == []


def test_resume_ends_a_park_at_once(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish("g", "a")
    lease = t.claim("w", 10)
    t.nack(lease, 100)
    g = info(t, "g")
    assert (g.state, g.worker_id, g.expires_at, g.attempt) == ("parked", PARKED, 1100.0, 1)
    assert t.claim("w", 10) is None
    assert t.resume("g") is True  # no pause, but a park: lifted
    assert t.stats() == TransportStats(1, 1, 0, 0, 0)
    assert info(t, "g").state == "ready"
    assert t.resume("g") is False
    again = t.claim("w2", 10)
    assert (again.seq, again.attempt, again.worker_id) == (lease.seq, 2, "w2")
    with pytest.raises(LeaseLost):
        t.ack(lease)


def test_resume_reads_no_clock_an_unseen_expired_park_is_still_a_park(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish("g", "a")
    t.nack(t.claim("w", 10), 5)
    clock.advance(6)  # the park ran out, but no operation has seen it
    assert t.resume("g") is True
    t.nack(t.claim("w", 10), 5)
    clock.advance(6)
    t.stats()  # seen expired: no park any more
    assert t.resume("g") is False


def test_resume_does_not_lift_a_lease(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish("g", "a")
    t.publish("g", "b")
    lease = t.claim("w", 10)
    assert t.resume("g") is False
    t.pause("g")
    assert t.resume("g") is True  # the pause is lifted, the lease stays
    g = info(t, "g")
    assert (g.state, g.paused, g.worker_id) == ("leased", False, "w")
    assert t.claim("w", 10) is None
    t.ack(lease)
    assert t.claim("w", 10).event == "b"


def test_resume_of_an_empty_group_forgets_it(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.pause("g")
    t.set_priority("g", 9)
    assert t.resume("g") is True
    assert t.group("g") is None and t.stats() == TransportStats(0, 0, 0, 0, 0)
    t.publish("g", "x", 3)  # created fresh: this priority counts
    assert info(t, "g").priority == 3


def test_resume_keeps_the_round_robin_place(transport: Any, clock: ManualClock) -> None:
    t = transport
    for g in "abc":
        t.publish(g, g + "1")
        t.publish(g, g + "2")
    for _ in range(3):  # a, b, c claimed in this order: round-robin keys 1, 2, 3
        t.ack(t.claim("w", 10))
    t.pause("a")
    assert t.claim("w", 10).group_id == "b"  # "a" is skipped, not moved
    t.resume("a")
    order = []
    while (lease := t.claim("w", 10)) is not None:
        order.append(lease.group_id)
    assert order == ["a", "c"]  # "a" (served longest ago) before "c"


# -- purge ---------------------------------------------------------------------------


def test_purge_removes_everything_and_fences_the_leases(transport: Any, clock: ManualClock) -> None:
    t = transport
    for i in range(5):
        t.publish("g", f"g{i}", 4)
    t.publish("h", "h0")
    lease = t.claim("w", 10, 4)
    longer = t.extend(lease, 30)
    t.pause("g")
    assert t.purge("g") == 5
    for stale in (lease, longer):
        with pytest.raises(LeaseLost):
            t.ack(stale)
        with pytest.raises(LeaseLost):
            t.nack(stale)
        with pytest.raises(LeaseLost):
            t.extend(stale, 5)
    assert t.group("g") is None
    assert t.stats() == TransportStats(1, 1, 0, 0, 0)  # the pause went with the group
    assert t.purge("g") == 0
    assert t.purge("unknown") == 0
    t.publish("g", "new", 1)  # a fresh group: its own priority, never claimed
    g = info(t, "g")
    assert (g.priority, g.messages, g.head_seq, g.last_claimed_at, g.paused) == (1, 1, 7, None, False)
    new = t.claim("w", 10, 1)
    assert (new.event, new.attempt) == ("new", 1)
    t.ack(new)
    assert drain(t, clock) == ["h0"]


def test_purge_of_a_parked_message(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish("g", "a")
    lease = t.claim("w", 10)
    t.nack(lease, 50)
    assert t.stats().parked == 1
    assert t.purge("g") == 1
    assert t.stats() == TransportStats(0, 0, 0, 0, 0) and len(t) == 0
    clock.advance(100)  # the park's expiry entry must not resurrect anything
    assert t.claim("w", 10) is None and t.stats() == TransportStats(0, 0, 0, 0, 0)


def test_purge_of_an_empty_paused_group_forgets_the_pause(transport: Any) -> None:
    t = transport
    t.pause("g")
    assert t.purge("g") == 0
    assert t.group("g") is None and t.stats().paused == 0
    t.publish("g", "x")
    assert t.claim("w", 10).event == "x"  # not paused any more


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
def test_purge_drops_the_events_after_the_lock(transport: Any, clock: ManualClock) -> None:
    """An event whose ``__del__`` works the same transport: had purge dropped it
    under its lock, that would deadlock or see a half-done purge."""
    t = transport
    log: List[Any] = []

    class Step:
        def __init__(self, n: int) -> None:
            self.n = n

        def __del__(self) -> None:
            log.append((self.n, t.publish("next", self.n), len(t), tuple(t.stats()), t.group("g")))

    for i in range(3):
        t.publish("g", Step(i))
    t.claim("w", 10)  # the first one is leased: purged all the same
    assert t.purge("g") == 3
    assert sorted(entry[0] for entry in log) == [0, 1, 2]
    assert all(entry[4] is None for entry in log)  # the purge was complete when they ran
    assert [entry[2] for entry in log] == [1, 2, 3]
    assert sorted(drain(t, clock)) == [0, 1, 2]


# -- set_priority --------------------------------------------------------------------


def test_set_priority_changes_the_floor_test_and_keeps_the_place(transport: Any, clock: ManualClock) -> None:
    t = transport
    for g in "abc":
        t.publish(g, g + "1")
        t.publish(g, g + "2")
    for _ in range(3):
        t.ack(t.claim("w", 10))  # round-robin keys: a, b, c
    assert t.set_priority("c", 5) is True
    assert t.claim("w", 10, 5).group_id == "c"
    assert t.claim("w", 10, 5) is None
    assert t.set_priority("a", 5) is True
    assert t.set_priority("b", 5) is True
    assert [t.claim("w", 10, 5).group_id for _ in range(2)] == ["a", "b"]
    assert info(t, "c").priority == 5


def test_set_priority_does_not_create_a_group(transport: Any) -> None:
    t = transport
    assert t.set_priority("nope", 3) is False
    assert t.group("nope") is None and t.groups() == []
    t.publish("g", "x", 2)
    assert t.set_priority("g", 2) is True  # unchanged, still True
    t.pause("p")
    assert t.set_priority("p", -4) is True  # an empty paused group has a priority too
    assert info(t, "p").priority == -4
    t.publish("p", "y")
    t.resume("p")
    assert t.claim("w", 10, -3).group_id == "g"
    assert t.claim("w", 10, -4).group_id == "p"


def test_set_priority_of_leased_and_paused_groups(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish("g", "a")
    t.publish("g", "b")
    lease = t.claim("w", 10)
    t.set_priority("g", INT64_MAX)
    t.ack(lease)
    assert t.claim("w", 10, INT64_MAX).event == "b"
    t.publish("h", "c")
    t.pause("h")
    t.set_priority("h", INT64_MIN)
    assert t.claim("w", 10, INT64_MIN) is None
    t.resume("h")
    assert t.claim("w", 10, INT64_MIN).event == "c"


def test_set_priority_moves_groups_between_many_levels(transport: Any, clock: ManualClock) -> None:
    """Levels created and emptied by moves, ready groups carried along, in a
    deterministic shuffle; a claim at each floor must still find the right ones."""
    t = transport
    rng = random.Random(5)
    prio: Dict[str, int] = {}
    for i in range(60):
        g = f"g{i}"
        prio[g] = rng.randrange(-3, 4)
        t.publish(g, g, prio[g])
    for _ in range(300):
        g = f"g{rng.randrange(60)}"
        prio[g] = rng.randrange(-5, 6)
        assert t.set_priority(g, prio[g])
    for floor in range(6, -7, -1):
        got = set()
        while (lease := t.claim("w", math.inf, floor)) is not None:
            got.add(lease.group_id)
        assert got == {g for g, p in prio.items() if p == floor}, floor
    assert [(i.group_id, i.priority) for i in t.groups()] == list(prio.items())


def test_set_priority_into_a_level_where_the_group_comes_first(transport: Any) -> None:
    """A ready group moved to a level whose groups come after it (here one
    claimed once) is that level's first from then on, for claims at any
    floor (mutation testing: the level's cached best entry was left stale)."""
    t = transport
    t.publish("H", "h", 5)
    t.nack(t.claim("w", 10))  # H claimed once: after every never-claimed group
    t.publish("A", "a")
    t.publish("G", "g")
    t.publish("J", "j", 3)
    assert t.set_priority("G", 5)  # not the head of its level: its old entry just goes stale
    got = []
    while (lease := t.claim("w", 10, INT64_MIN)) is not None:
        got.append(lease.group_id)
    assert got == ["A", "G", "J", "H"]


@pytest.mark.parametrize("memory", ["enough", "short"])
def test_compaction_after_moves_and_pauses_keeps_every_group_once(impl: Any, memory: str) -> None:
    """Moving most of a level's ready groups away and pausing more of them
    leaves mostly stale entries in its heap, so it is rebuilt (compacted)
    from its live entries, each group once: among them a group that left the
    level, was claimed and released elsewhere, and came back (a stale entry
    and a live one, with different keys).  Every group is then delivered
    exactly once, in round-robin order.  "short": the pure twin runs out of
    memory half-way through the rebuild (a profiler hook raises
    ``MemoryError`` at an append), and the rebuild is given up, the heap
    untouched; the Cython transport runs no Python function under its lock.
    (Mutation testing: no test compacted a heap of the control plane.)"""
    t = impl.InMemoryTransport(clock=ManualClock())
    names = [f"g{i:02}" for i in range(80)]
    t.publish_many([(g, g) for g in names])
    assert t.set_priority("g05", 1)
    lease = t.claim("w", 10, 1)
    assert lease.group_id == "g05"
    t.nack(lease)  # claimed: g05 now comes after every never-claimed group
    assert t.set_priority("g05", 0)
    for g in names[1::2]:
        if g != "g05":
            assert t.set_priority(g, -1)  # entries of level 0 go stale, none at the top
    appends = [0]

    def hook(frame: Any, event: str, arg: Any) -> None:
        if (event == "c_call" and frame.f_code.co_name == "_compact" and getattr(arg, "__name__", "") == "append"
                and frame.f_globals.get("__name__") == impl.__name__):
            appends[0] += 1
            if appends[0] == 10:
                raise MemoryError("the rebuilt heap")

    if memory == "short":
        sys.setprofile(hook)
    try:
        for g in names[78:40:-2]:
            assert t.pause(g)  # past 40 stale entries, level 0 is compacted
    finally:
        sys.setprofile(None)
    assert appends[0] == (10 if memory == "short" and impl.__name__.endswith("_py") else 0)
    for g in names[78:40:-2]:
        assert t.resume(g)
    got = []
    while (lease := t.claim("w", math.inf, INT64_MIN)) is not None:
        got.append(lease.group_id)
    assert got == [g for g in names if g != "g05"] + ["g05"]
    assert t.stats().leased == 80


# -- group / groups ------------------------------------------------------------------


def test_group_info_fields_through_a_life(transport: Any, clock: ManualClock) -> None:
    t = transport
    assert t.group("g") is None
    t.publish("g", "a", 3)
    t.publish("g", "b")
    assert t.group("g") == GroupInfo("g", 3, 2, "ready", False, 1, None, None, None, None)
    lease = t.claim("w", 10)
    assert t.group("g") == GroupInfo("g", 3, 2, "leased", False, 1, "w", 1010.0, 1, 1000.0)
    clock.advance(5)
    t.nack(lease, 20)
    assert t.group("g") == GroupInfo("g", 3, 2, "parked", False, 1, PARKED, 1025.0, 1, 1000.0)
    t.pause("g")
    assert t.group("g") == GroupInfo("g", 3, 2, "parked", True, 1, PARKED, 1025.0, 1, 1000.0)
    clock.advance(30)
    assert t.group("g") == GroupInfo("g", 3, 2, "paused", True, 1, None, None, None, 1000.0)
    t.resume("g")
    lease = t.claim("w2", 1)
    assert t.group("g") == GroupInfo("g", 3, 2, "leased", False, 1, "w2", 1036.0, 2, 1035.0)
    t.ack(lease)
    assert t.group("g") == GroupInfo("g", 3, 1, "ready", False, 2, None, None, None, 1035.0)
    got = t.group("g")
    assert type(got) is GroupInfo and type(got.expires_at) is type(None)
    lease = t.claim("w", math.inf)
    g = info(t, "g")
    assert (g.expires_at, type(g.expires_at), type(g.last_claimed_at), type(g.attempt)) == (
        math.inf, float, float, int)


def test_group_and_groups_apply_expiry_for_good(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish("g", "a")
    t.publish("h", "b")
    t.claim("w", 10)
    clock.advance(11)
    assert info(t, "g").state == "ready"
    clock.advance(-11)  # the clock goes back: the expiry stays seen
    assert info(t, "g").state == "ready"
    assert t.stats().leased == 0
    t.claim("w", 10)  # at the transport's time (1011): "h" (never claimed) comes first
    clock.set(1011)
    states = {i.group_id: i.state for i in t.groups()}
    assert states == {"g": "ready", "h": "leased"}
    clock.advance(11)
    assert [i.state for i in t.groups()] == ["ready", "ready"]
    assert t.stats().leased == 0


def test_groups_in_creation_order(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish("b", 1)
    t.pause("x")
    t.publish("a", 2)
    t.publish("b", 3)
    t.publish("c", 4)
    assert [i.group_id for i in t.groups()] == ["b", "x", "a", "c"]
    lease = t.claim("w", 10)
    assert lease.group_id == "b"
    t.ack(lease)
    t.ack(t.claim("w", 10))  # "a": emptied and forgotten
    t.publish("a", 5)  # re-created: at the end
    assert [i.group_id for i in t.groups()] == ["b", "x", "c", "a"]
    t.purge("b")
    t.resume("x")
    t.publish("b", 6)
    assert [i.group_id for i in t.groups()] == ["c", "a", "b"]
    assert type(t.groups()) is list


def test_groups_is_a_snapshot(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish("g", "a")
    snapshot = t.groups()
    t.claim("w", 10)
    t.purge("g")
    assert snapshot == [GroupInfo("g", 0, 1, "ready", False, 1, None, None, None, None)]
    with pytest.raises(AttributeError):
        snapshot[0].state = "leased"  # type: ignore[misc]


# -- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda t: t.pause(5), TypeError),
        (lambda t: t.pause(None), TypeError),
        (lambda t: t.resume(b"g"), TypeError),
        (lambda t: t.purge(1.0), TypeError),
        (lambda t: t.set_priority(3, 1), TypeError),
        (lambda t: t.set_priority("g", 1.5), TypeError),
        (lambda t: t.set_priority("g", True), TypeError),
        (lambda t: t.set_priority("g", 2**63), OverflowError),
        (lambda t: t.set_priority("g", INT64_MIN - 1), OverflowError),
        (lambda t: t.set_priority("zz", "x"), TypeError),
        (lambda t: t.group(None), TypeError),
    ],
)
def test_bad_input_changes_nothing(transport: Any, clock: ManualClock, call: Any, error: type) -> None:
    t = transport
    t.publish("g", "a", 1)
    t.pause("p")
    before = (len(t), t.stats(), t.groups())
    with pytest.raises(error):
        call(t)
    assert (len(t), t.stats(), t.groups()) == before


def test_str_and_int_subclasses_are_stored_exact(transport: Any) -> None:
    class Name(str):
        pass

    class Prio(int):
        pass

    t = transport
    assert t.pause(Name("g")) is True
    assert t.set_priority(Name("g"), Prio(4)) is True
    g = info(t, Name("g"))
    assert type(g.group_id) is str and type(g.priority) is int and g.priority == 4
    assert t.resume(Name("g")) is True and t.group("g") is None


def test_clock_errors_in_group_and_groups_change_nothing(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish("g", "a")
    t.claim("w", 1)
    clock.advance(5)
    for value in (math.nan, "noon", None):
        with clock.misbehave(value):
            with pytest.raises((TypeError, ValueError)):
                t.group("g")
            with pytest.raises((TypeError, ValueError)):
                t.groups()
    clock.advance(-5)
    assert info(t, "g").state == "leased"  # nothing was expired by the failed calls


# -- everything interleaved -----------------------------------------------------------


class Shadow:
    """What the transport must hold: per group, the unacked, unpurged messages."""

    def __init__(self) -> None:
        self.held: Dict[str, List[int]] = {}
        self.events: Dict[int, Any] = {}
        self.acked: set[int] = set()
        self.purged: set[int] = set()
        self.purge_total = 0


def check_agreement(t: Any, shadow: Shadow) -> None:
    """``len``, ``stats()`` and ``groups()`` agree with each other and the shadow."""
    n = len(t)
    stats = t.stats()  # reads the clock: the expiries it applies are seen by groups() too
    listed = t.groups()
    assert n == stats.messages == sum(g.messages for g in listed) == sum(map(len, shadow.held.values()))
    assert stats.groups == sum(1 for g in listed if g.messages)
    assert stats.leased == sum(1 for g in listed if g.state == "leased")
    assert stats.parked == sum(1 for g in listed if g.state == "parked")
    assert stats.paused == sum(1 for g in listed if g.paused)
    assert len({g.group_id for g in listed}) == len(listed)
    for g in listed:
        seqs = shadow.held.get(g.group_id, [])
        assert g.messages == len(seqs)
        assert g.head_seq == (seqs[0] if seqs else None)
        if g.messages == 0:
            assert g.paused and g.state == "paused"
        assert (g.worker_id is None) == (g.state in ("ready", "paused"))
        assert t.group(g.group_id) == g
    assert {g.group_id for g in listed if g.messages} == {k for k, v in shadow.held.items() if v}


@pytest.mark.parametrize("seed", range(6))
def test_control_plane_interleaved_with_everything(transport_cls: Any, seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock(1000.0)
    t = transport_cls(clock=clock)
    shadow = Shadow()
    names = [f"g{i}" for i in range(rng.choice([3, 8, 30]))]
    leases: List[Any] = []
    for _ in range(1500):
        roll = rng.random()
        g = rng.choice(names)
        if roll < 0.25:
            event = object()
            seq = t.publish(g, event, rng.choice([0, 0, 1, -1]))
            shadow.held.setdefault(g, []).append(seq)
            shadow.events[seq] = event
        elif roll < 0.45:
            lease = t.claim(f"w{rng.randrange(3)}", rng.choice([1, 5, 20, math.inf]), rng.choice([-1, 0, 1]))
            if lease is not None:
                seqs = shadow.held[lease.group_id]
                assert lease.seq == seqs[0] and lease.event is shadow.events[lease.seq]
                leases.append(lease)
        elif roll < 0.6 and leases:
            lease = leases.pop(rng.randrange(len(leases)))
            what = rng.random()
            try:
                if what < 0.6:
                    t.ack(lease)
                    shadow.held[lease.group_id].remove(lease.seq)
                    shadow.acked.add(lease.seq)
                elif what < 0.75:
                    t.nack(lease)
                elif what < 0.9:
                    t.nack(lease, rng.choice([1, 10]))
                else:
                    leases.append(t.extend(lease, rng.choice([1, 10])))
            except LeaseLost:
                pass
        elif roll < 0.7:
            t.pause(g)
            shadow.held.setdefault(g, [])
        elif roll < 0.8:
            t.resume(g)
        elif roll < 0.84:
            removed = t.purge(g)
            seqs = shadow.held.pop(g, [])
            assert removed == len(seqs)
            shadow.purged.update(seqs)
            shadow.purge_total += removed
        elif roll < 0.88:
            assert t.set_priority(g, rng.choice([-1, 0, 1, 2])) == (t.group(g) is not None)
        elif roll < 0.97:
            clock.advance(rng.choice([0.5, 2, 6, 15]))
        else:
            t.groups()
        # the shadow's empty entries stand for paused groups, or nothing
        for name in [k for k, v in shadow.held.items() if not v and t.group(k) is None]:
            del shadow.held[name]
        check_agreement(t, shadow)
    # nothing lost: everything not acked or purged is still there, once
    for lease in leases:
        try:
            t.ack(lease)
        except LeaseLost:
            continue
        shadow.held[lease.group_id].remove(lease.seq)
        shadow.acked.add(lease.seq)
    for name in list(shadow.held):
        t.resume(name)
    left = drain(t, clock)
    expected = {s for seqs in shadow.held.values() for s in seqs}
    assert sorted(id(e) for e in left) == sorted(id(shadow.events[s]) for s in expected)
    assert len(shadow.acked) + shadow.purge_total + len(left) == len(shadow.events)
    assert t.stats() == TransportStats(0, 0, 0, 0, 0) and t.groups() == []
    assert shadow.purge_total > 0 and shadow.acked


def test_leases_made_stale_by_purge_raise_lease_lost_everywhere(transport: Any, clock: ManualClock) -> None:
    """Purge, then the same group id re-created with a look-alike delivery: the old
    lease is not current there either (seqs differ), and ack_many returns it."""
    t = transport
    t.publish("g", "a")
    old = t.claim("w", 10)
    t.purge("g")
    t.publish("g", "a")
    new = t.claim("w", 10)
    assert (new.attempt, new.group_id, new.worker_id) == (old.attempt, old.group_id, old.worker_id)
    for op in (t.ack, t.nack, lambda lease: t.extend(lease, 5)):
        with pytest.raises(LeaseLost):
            op(old)
    assert t.ack_many([old]) == [old]
    t.ack(new)
    assert len(t) == 0


def test_which_operations_read_the_clock(transport: Any, clock: ManualClock) -> None:
    """pause, resume, purge and set_priority never read it; group and groups once."""
    t = transport
    t.publish("g", "a")
    for call, reads in (
        (lambda: t.pause("g"), 0),
        (lambda: t.pause("new"), 0),
        (lambda: t.set_priority("g", 3), 0),
        (lambda: t.resume("g"), 0),
        (lambda: t.purge("new"), 0),
        (lambda: t.group("g"), 1),
        (lambda: t.group("unknown"), 1),
        (lambda: t.groups(), 1),
        (lambda: t.purge("g"), 0),
    ):
        before = clock.reads
        call()
        assert clock.reads - before == reads


def test_stats_has_seven_named_fields(transport: Any) -> None:
    stats: Optional[TransportStats] = transport.stats()
    assert stats is not None
    assert stats._fields == ("messages", "groups", "leased", "parked", "paused", "buried", "scheduled")
    assert type(stats) is TransportStats


# -- waking a waiting claim --------------------------------------------------------


def _waiter(t: Any, min_priority: int = 0) -> Any:
    """A thread in ``claim(timeout=10)``; ``.result`` holds what it returned."""
    import threading
    import time

    box: List[Any] = []
    thread = threading.Thread(target=lambda: box.append(t.claim("waiter", 60, min_priority, timeout=10)), daemon=True)
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive() and not box, "the claim did not wait: nothing was claimable"
    thread.result = box  # type: ignore[attr-defined]
    return thread


WAKE_UPS = {  # (what blocks the group, what wakes the waiter, the waiter's floor)
    "resume of a pause": (lambda t: t.pause("g"), lambda t, _: t.resume("g"), 0),
    "resume of a park": (lambda t: t.nack(t.claim("w", 10), 3600), lambda t, _: t.resume("g"), 0),
    "set_priority": (lambda t: None, lambda t, _: t.set_priority("g", 5), 5),
    "publish_many": (lambda t: t.purge("g"), lambda t, _: t.publish_many([("g", "e")]), 0),
    "ack_many": (lambda t: t.claim("w", 10), lambda t, lease: t.ack_many([lease]), 0),
}


@pytest.mark.parametrize("case", list(WAKE_UPS))
def test_control_plane_and_batches_wake_a_waiting_claim(transport: Any, case: str) -> None:
    """SPEC: resume and set_priority make a group claimable and wake a waiter;
    so do publish_many and ack_many, as publish and ack do."""
    t = transport
    block, wake, floor = WAKE_UPS[case]
    t.publish("g", "e")
    t.publish("g", "second")
    state = block(t)
    thread = _waiter(t, floor)
    assert wake(t, state) not in (False, 0)
    thread.join(10)
    assert not thread.is_alive(), "the waiting claim was not woken"
    assert thread.result and thread.result[0] is not None  # type: ignore[attr-defined]


def test_claim_many_never_waits(transport: Any) -> None:
    with pytest.raises(TypeError):
        transport.claim_many("w", 10, 1, 0, timeout=1.0)
    assert transport.claim_many("w", 10, 5) == []  # nothing there: at once


def test_group_and_groups_expire_the_earliest_lease_among_several(transport: Any, clock: ManualClock) -> None:
    """``group``/``groups`` look at the earliest expiry, not any other: with two
    leases, the shorter one has run out and the longer one has not."""
    t = transport
    t.publish("long", "a")
    t.publish("short", "b")
    assert t.claim("w", 100).group_id == "long"
    assert t.claim("w", 5).group_id == "short"
    clock.advance(6)
    assert t.group("short").state == "ready"
    assert t.group("long").state == "leased"
    t.claim("w", 5)  # "short" again, until 1011
    clock.advance(6)
    assert {i.group_id: i.state for i in t.groups()} == {"long": "leased", "short": "ready"}
    assert t.stats().leased == 1


# The operations that read the clock: each applies expiry at the transport's
# time, which never goes back (mutation testing: the "now" of group, groups and
# claim_many was not pinned down when the clock goes back).
CLOCK_READERS = {
    "group": lambda t: [t.group("g").state],
    "groups": lambda t: [i.state for i in t.groups() if i.group_id == "g"],
    "claim_many": lambda t: ["ready" if t.claim_many("w", 10, 0) == [] else "?"],  # max_count 0: claims nothing
}


@pytest.mark.parametrize("op", list(CLOCK_READERS))
def test_clock_readers_move_the_transport_time_forward_for_good(transport: Any, clock: ManualClock, op: str) -> None:
    """After ``op`` read a later clock, an earlier reading does not take the
    transport's time back: the next claim's lease runs from the later time."""
    t = transport
    t.publish("g", "a")
    clock.set(2000)
    assert CLOCK_READERS[op](t) == ["ready"]
    clock.set(1500)
    lease = t.claim("w", 10)
    assert lease is not None and lease.expires_at == 2010.0


@pytest.mark.parametrize("op", list(CLOCK_READERS))
def test_clock_readers_expire_at_the_transport_time_when_the_clock_is_behind(
    transport: Any, clock: ManualClock, op: str
) -> None:
    """``extend`` moves the transport's time to its clock reading without
    expiring anything; when the clock then reads earlier, ``op`` still
    expires what ran out before that time."""
    t = transport
    t.publish("g", "a")
    t.publish("h", "b")
    assert t.claim("w", 10).group_id == "g"  # until 1010
    h = t.claim("w", 100)
    clock.set(1020)
    t.extend(h, 50)  # the transport's time is 1020; g's lease has run out, unseen
    clock.set(1005)
    assert CLOCK_READERS[op](t) == ["ready"]
    assert t.stats().leased == 1
    lease = t.claim("w", 10)
    assert (lease.group_id, lease.attempt, lease.expires_at) == ("g", 2, 1030.0)


@pytest.mark.parametrize("op", list(CLOCK_READERS))
def test_clock_readers_near_time_zero(transport_cls: Any, op: str) -> None:
    """A clock that starts at 0: expiry times below the expiry heap's entry
    counters (mutation testing: comparing the counter instead of the time went
    unseen with clocks in the thousands)."""
    clock = ManualClock(0.0)
    t = transport_cls(clock=clock)
    t.publish("g", "a")
    t.publish("h", "b")
    assert t.claim("w", 0.5).group_id == "g"  # until 0.5, expiry entry counter 1
    assert t.claim("w", 0.25).group_id == "h"  # until 0.25, counter 2
    clock.set(0.75)
    if op == "claim_many":  # both leases have run out: both messages come again
        got = t.claim_many("w", 10, 5)
        assert sorted((lease.group_id, lease.attempt) for lease in got) == [("g", 2), ("h", 2)]
    else:
        assert CLOCK_READERS[op](t) == ["ready"]
        assert t.stats().leased == 0
