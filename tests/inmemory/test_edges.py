"""Edge cases of the contract, one scenario each (issue 14).

Each test here pins a rule of SPEC.md / docs/decisions.md in a situation
the broader tests reach only by chance, and was written against a bug that
the rest of the suite let through: a mutant of the pure twin found by
``tools/mutate.py``.  Both implementations run every test (a test that
kills a pure mutant guards the Cython core too).

Grouped by rule:

* single active consumer: stale ready-heap entries never resurface;
* round-robin: expiry keeps a group's place, a re-created group starts
  fresh, and the order holds across many priority levels;
* values that cannot be changed or copied: ``Lease`` attributes cannot be
  deleted, a transport cannot be copied or pickled;
* clear errors: what a ``LeaseLost`` says.
"""

from __future__ import annotations

import copy
import pickle
import random
from typing import Any, Dict, List, Optional, Tuple

import pytest

from leasequeue import LeaseLost
from leasequeue.testing import ManualClock

# -- single active consumer: a stale ready entry never resurfaces ------------------


@pytest.mark.parametrize("levels", ["one-level", "two-levels"])
def test_extended_lease_is_not_served_from_a_stale_ready_entry(transport: Any, clock: ManualClock, levels: str) -> None:
    """SPEC guarantee 1: at most one message of a group is leased at a time.

    The scenario of issue 14: b's lease expires and a claim that finds nothing
    (its floor is too high) observes the expiry, so b is ready again; then
    ``extend(b)`` locks b again.  b's ready entry is now stale, and it must
    stay dead when c's claim takes the top of the heap: the next claim finds
    nothing, where a bug hands b to a second worker while its extended lease
    runs.  ``one-level`` is the fast path nearly every user takes (a single
    priority); ``two-levels`` the general path.
    """
    if levels == "two-levels":
        transport.publish("low", "low", priority=-1)  # a second level, below every floor used here
    for group in "abc":
        transport.publish(group, group)
    a = transport.claim("w1", 100)
    b = transport.claim("w2", 1)
    assert (a.group_id, b.group_id) == ("a", "b")
    clock.advance(2)
    assert transport.claim("w3", 100, min_priority=1) is None  # observes b's expiry
    b2 = transport.extend(b, 100)
    c = transport.claim("w4", 100)
    assert c.group_id == "c"
    assert transport.claim("w5", 100) is None, "b was leased to a second worker while its extended lease runs"
    assert transport.stats().leased == 3
    transport.ack(b2)  # b's delivery is still the current one
    assert len(transport) == 2 + (levels == "two-levels")


# -- round-robin: expiry keeps the group's place -------------------------------------


def _drain(transport: Any, limit: int = 100) -> List[Tuple[str, Any, int]]:
    """Claim and ack until nothing is eligible: (group, event, attempt) in claim order."""
    out = []
    for _ in range(limit):
        lease = transport.claim("d", 100)
        if lease is None:
            return out
        out.append((lease.group_id, lease.event, lease.attempt))
        transport.ack(lease)
    raise AssertionError("the transport never ran dry")


def _publish_each(transport: Any, events: str) -> None:
    """Publish each of the space-separated events to the group its first letter names."""
    for event in events.split():
        transport.publish(event[0], event)


def _ack_next(transport: Any, count: int) -> None:
    """Claim and ack the next ``count`` messages."""
    for _ in range(count):
        transport.ack(transport.claim("w", 100))


def test_expired_lease_keeps_its_groups_place_at_the_front(transport: Any, clock: ManualClock) -> None:
    """SPEC 3 and decisions "Round-robin key": expiry keeps the group's position.

    a was claimed least recently when its lease expires, so it is served
    first again (its old message, attempt 2): not sent to the back."""
    _publish_each(transport, "a1 b1 c1 a2 b2 c2")
    transport.claim("crashes", 1)  # a1, never acked
    _ack_next(transport, 2)  # b1, c1
    clock.advance(2)
    assert _drain(transport) == [("a", "a1", 2), ("b", "b2", 1), ("c", "c2", 1), ("a", "a2", 1)]


def test_expired_lease_keeps_its_groups_place_at_the_back(transport: Any, clock: ManualClock) -> None:
    """SPEC 3 and decisions "Round-robin key": expiry keeps the group's position.

    c was claimed most recently when its lease expires: it waits behind the
    groups claimed before it (not treated as never claimed, not moved up)."""
    _publish_each(transport, "a1 b1 c1 a2 b2")
    _ack_next(transport, 2)  # a1, b1
    transport.claim("crashes", 1)  # c1, never acked
    clock.advance(2)
    assert _drain(transport) == [("a", "a2", 1), ("b", "b2", 1), ("c", "c1", 2)]


def test_expired_park_keeps_its_groups_place(transport: Any, clock: ManualClock) -> None:
    """SPEC nack: "the group keeps its round-robin position from the claim",
    also once the park has run out."""
    _publish_each(transport, "a1 b1 c1 a2 b2 c2")
    transport.nack(transport.claim("w", 100), 1)  # a1 parked for 1 s
    _ack_next(transport, 2)  # b1, c1
    clock.advance(2)
    assert _drain(transport) == [("a", "a1", 2), ("b", "b2", 1), ("c", "c2", 1), ("a", "a2", 1)]


@pytest.mark.parametrize("first", ["stats", "claim"])
def test_an_expiry_is_seen_on_a_clock_near_zero(transport_cls: Any, first: str) -> None:
    """stats() counts a lease whose time ran out as neither leased nor parked,
    and claim() serves its message again, also when the clock reads less than
    the number of locks taken so far (each must compare the lock's end time,
    not its place in the expiry heap's order, with now)."""
    clock = ManualClock(0.0)
    t = transport_cls(clock=clock)
    for i in range(8):  # eight locks taken: the expiry heap's counter is past 8
        t.publish("g%d" % i, i)
        t.ack(t.claim("w", 0.5))
    t.publish("late", "l")
    t.claim("crashes", 0.5)
    t.publish("parked", "p")
    t.nack(t.claim("w", 100.0), 0.25)
    assert t.stats() == (2, 2, 1, 1, 0, 0, 0)
    clock.advance(1.0)  # now 1.0: both locks ran out
    if first == "stats":
        assert t.stats() == (2, 2, 0, 0, 0, 0, 0)
    else:
        lease = t.claim("w", 10.0)
        assert lease is not None and (lease.group_id, lease.attempt) == ("late", 2)
        assert t.stats() == (2, 2, 1, 0, 0, 0, 0)


# -- round-robin: a forgotten group starts fresh -------------------------------------


def test_recreated_group_starts_fresh_not_at_its_old_place(transport: Any) -> None:
    """SPEC ack: a group left with no messages is forgotten, round-robin position
    included; a later publish re-creates it never-claimed, ordered by its new
    oldest message.

    b was claimed before a, so a's old place is behind b; c is a never-claimed
    group published before a comes back.  Fresh, a comes after c (by seq) and
    before b (claimed): c, a, b.  Had a kept its old place: c, b, a; had it
    kept its old first seq: a, c, b."""
    transport.publish("b", "b1")
    transport.publish("a", "a1")
    transport.publish("b", "b2")
    transport.ack(transport.claim("w", 100))  # b1: b is claimed first
    lease = transport.claim("w", 100)
    assert lease.event == "a1"
    transport.ack(lease)  # a is empty: forgotten
    assert transport.stats().groups == 1
    transport.publish("c", "c1")
    transport.publish("a", "a2")
    assert _drain(transport) == [("c", "c1", 1), ("a", "a2", 1), ("b", "b2", 1)]


def test_recreated_group_takes_the_new_priority(transport: Any) -> None:
    """SPEC ack: the forgotten group's priority goes too; the re-creating publish sets it."""
    transport.publish("a", "a1", priority=5)
    transport.ack(transport.claim("w", 100, min_priority=5))
    transport.publish("a", "a2", priority=1)
    assert transport.claim("w", 100, min_priority=2) is None
    assert transport.claim("w", 100, min_priority=1).event == "a2"


# -- round-robin across many priority levels ------------------------------------------


class _RoundRobinModel:
    """Just enough of the SPEC to say which group a claim serves: the eligible group
    claimed least recently, never-claimed groups first by their oldest message."""

    def __init__(self) -> None:
        self.priority: Dict[str, int] = {}
        self.first_seq: Dict[str, int] = {}
        self.last_claim: Dict[str, int] = {}
        self.busy: Dict[str, bool] = {}
        self.claims = 0

    def add(self, group: str, priority: int, seq: int) -> None:
        if group not in self.priority:
            self.priority[group], self.first_seq[group], self.busy[group] = priority, seq, False

    def expect(self, floor: int) -> Optional[str]:
        eligible = [g for g, p in self.priority.items() if p >= floor and not self.busy[g]]
        if not eligible:
            return None
        return min(eligible, key=lambda g: (1, self.last_claim[g]) if g in self.last_claim
                   else (0, self.first_seq[g]))

    def claimed(self, group: str) -> None:
        self.claims += 1
        self.last_claim[group] = self.claims
        self.busy[group] = True

    def claim(self, transport: Any, floor: int, where: str) -> Any:
        """Claim at ``floor`` from ``transport``: it must be the group the
        model expects (or nothing); the model takes note.  Returns the lease."""
        expected = self.expect(floor)
        lease = transport.claim("w", 100, min_priority=floor)
        assert (lease and lease.group_id) == expected, where
        if lease is not None:
            self.claimed(lease.group_id)
        return lease


@pytest.mark.parametrize("seed", range(4))
def test_round_robin_across_many_priority_levels(transport: Any, seed: int) -> None:
    """SPEC 3 and 4 with many distinct priorities (a deep tree of levels): every
    claim, at every floor, serves the least recently claimed group among those
    at or above the floor.  Leases are kept for a while, then acked (the group
    gets a new message, so it keeps its place) or nacked."""
    rng = random.Random(seed)
    model = _RoundRobinModel()
    priorities = rng.sample(range(-40, 40), 24)
    for i, priority in enumerate(priorities):
        group = f"g{i}"
        for _ in range(2):
            model.add(group, priority, transport.publish(group, None, priority))
    floors = sorted(priorities) + [min(priorities) - 1, max(priorities) + 1]
    held: List[Any] = []
    for _ in range(300):
        floor = rng.choice(floors)
        lease = model.claim(transport, floor, f"floor {floor}")
        if lease is not None:
            held.append(lease)
        if held and (len(held) > 6 or rng.random() < 0.4):
            done = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.7:
                transport.publish(done.group_id, None)  # never empties: keeps its place
                transport.ack(done)
            else:
                transport.nack(done)
            model.busy[done.group_id] = False


@pytest.mark.parametrize("seed", range(6))
def test_round_robin_while_priority_levels_come_and_go(transport: Any, seed: int) -> None:
    """As above, but levels also disappear and reappear: groups empty out (their
    priority level goes with its last group), are created again at another
    priority, and move between priorities (``set_priority``).  Every claim, at
    every floor, still serves the least recently claimed eligible group, so no
    ready group is ever hidden from, or shown to, a floor by the reshaped tree."""
    rng = random.Random(seed)
    model = _RoundRobinModel()
    held: Dict[str, int] = {}  # group -> messages held
    leases: List[Any] = []
    pool = rng.sample(range(-60, 60), 40)
    names = [f"g{i}" for i in range(30)]

    def publish(group: str) -> None:
        priority = rng.choice(pool)
        model.add(group, priority, transport.publish(group, None, priority))
        held[group] = held.get(group, 0) + 1

    for group in names:
        publish(group)
    for step in range(600):
        roll = rng.random()
        if roll < 0.35:
            floor = rng.choice(pool + [min(pool) - 1, max(pool) + 1])
            lease = model.claim(transport, floor, f"step {step}, floor {floor}")
            if lease is not None:
                leases.append(lease)
        elif roll < 0.6 and leases:
            done = leases.pop(rng.randrange(len(leases)))
            group = done.group_id
            if rng.random() < 0.75:
                transport.ack(done)
                held[group] -= 1
                if not held[group]:  # forgotten: place and priority go, maybe its level too
                    del held[group]
                    for table in (model.priority, model.first_seq, model.last_claim, model.busy):
                        table.pop(group, None)
                    continue
            else:
                transport.nack(done)
            model.busy[group] = False
        elif roll < 0.8:
            publish(rng.choice(names))
        else:
            group = rng.choice(names)
            priority = rng.choice(pool)
            assert transport.set_priority(group, priority) == (group in held)
            if group in held:
                model.priority[group] = priority


# -- values that cannot be changed or copied ---------------------------------------------


def test_lease_attributes_cannot_be_deleted(transport: Any) -> None:
    """decisions.md "Leases": immutable; deleting a field is refused like setting one,
    and the lease stays whole and current."""
    transport.publish("g", "e")
    lease = transport.claim("w", 30)
    for name in ("seq", "group_id", "event", "worker_id", "expires_at", "attempt"):
        with pytest.raises(AttributeError):
            delattr(lease, name)
    assert (lease.seq, lease.group_id, lease.event, lease.worker_id, lease.attempt) == (1, "g", "e", "w", 1)
    transport.ack(lease)
    assert len(transport) == 0


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_transport_cannot_be_copied_or_pickled(transport: Any, how: str) -> None:
    """decisions.md: ``InMemoryTransport`` cannot be copied or pickled (``TypeError``):
    two transports sharing one set of leases would break every guarantee, and
    events are held by reference, never serialised.  The refusal changes nothing."""
    transport.publish("g", "e")
    lease = transport.claim("w", 30)
    refuse = {"copy": copy.copy, "deepcopy": copy.deepcopy, "pickle": pickle.dumps}[how]
    with pytest.raises(TypeError):
        refuse(transport)
    transport.ack(lease)
    assert len(transport) == 0


# -- clear errors ---------------------------------------------------------------------


def test_lease_lost_names_the_delivery(transport: Any) -> None:
    """TEAM rule "bad input gets a clear error": a ``LeaseLost`` names the message,
    its group and the attempt, and says why a lease stops being current."""
    transport.publish("orders", "e")
    lease = transport.claim("w", 30)
    transport.nack(lease)
    with pytest.raises(LeaseLost) as caught:
        transport.ack(lease)
    assert str(caught.value) == (
        "lease of message 1 in group 'orders' (attempt 1) is not current: "
        "it was acked, nacked, re-delivered, or issued by another transport"
    )


@pytest.mark.parametrize("seed", range(4))
def test_round_robin_through_heap_compactions_matches_the_referee(transport_cls: Any, seed: int) -> None:
    """One priority level whose heap fills with stale entries (most ready
    groups paused at once) until it is compacted, again and again, with
    claims, acks and resumes in between: the compacted heap must still serve
    the least recently claimed group first.  Every claim is compared with the
    referee's."""
    from leasequeue.testing import ManualClock, ReferenceTransport

    rng = random.Random(seed)
    clocks = [ManualClock(), ManualClock()]
    t, ref = transport_cls(clock=clocks[0]), ReferenceTransport(clock=clocks[1])
    names = [f"g{i}" for i in range(200)]
    for x in (t, ref):
        for name in names:
            x.publish(name, 0)
            x.publish(name, 1)
    held: List[Any] = []

    def claim_some(n: int) -> None:
        for _ in range(n):
            got, want = t.claim("w", 100.0), ref.claim("w", 100.0)
            assert (got and (got.group_id, got.seq)) == (want and (want.group_id, want.seq))
            if got is not None:
                held.append((got, want))
        while held and rng.random() < 0.8:
            got, want = held.pop(rng.randrange(len(held)))
            for x, lease in ((t, got), (ref, want)):
                x.publish(lease.group_id, "more")  # never empties: keeps its round-robin place
                x.ack(lease)

    for _ in range(12):
        claim_some(rng.randrange(5, 40))
        for name in rng.sample(names, rng.randrange(100, 180)):
            assert t.pause(name) == ref.pause(name)
        claim_some(rng.randrange(1, 10))
        for name in rng.sample(names, rng.randrange(50, 200)):
            assert t.resume(name) == ref.resume(name)
