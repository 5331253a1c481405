"""The referee itself, against SPEC.md Part 2 and docs/decisions.md.

``ReferenceTransport`` is the oracle of every differential test, so its
Part 2 operations are pinned here by small hand-written scenarios, one rule
at a time (Part 1 is pinned by the differential runs against two
independent transports).  These tests are about the reference only; the
transports meet the same rules through the differential and the contract
tests.
"""

from __future__ import annotations

import math
from collections import namedtuple
from typing import Any, List

import pytest

from helpers import INT64_MAX, INT64_MIN, fingerprint
from leasequeue import GroupInfo, LeaseLost, TransportStats
from leasequeue.testing import ManualClock, ReferenceLease, ReferenceTransport


class Broke(Exception):
    """Raised by the clock when a call must not read it."""


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def t(clock: ManualClock) -> ReferenceTransport:
    return ReferenceTransport(clock)


def claimed_groups(t: ReferenceTransport, worker: str = "w") -> List[str]:
    out = []
    while (lease := t.claim(worker, math.inf, INT64_MIN)) is not None:
        out.append(lease.group_id)
    return out


# -- the lease value ------------------------------------------------------------


def test_lease_value(t: ReferenceTransport) -> None:
    event = ["unhashable"]
    t.publish("g", event)
    lease = t.claim("w", 10)
    assert (lease.seq, lease.group_id, lease.event, lease.worker_id, lease.expires_at, lease.attempt) == (
        1, "g", event, "w", 1010.0, 1)
    assert lease.event is event
    twin = ReferenceLease(1, "g", event, "w", 1010.0, 1)
    assert twin == lease and hash(twin) == hash(lease)
    assert ReferenceLease(1, "g", ["unhashable"], "w", 1010.0, 1) != lease  # events by identity
    with pytest.raises(AttributeError):
        lease.attempt = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del lease.seq
    with pytest.raises(LeaseLost):
        t.ack(twin)  # built by hand: never current
    t.ack(lease)
    assert len(t) == 0


# -- waiting: claim(timeout=) and close ---------------------------------------------


@pytest.mark.parametrize("timeout, error", [(-1, ValueError), (math.nan, ValueError), (-math.inf, ValueError),
                                            (True, TypeError), ("1", TypeError), (1j, TypeError)])
def test_timeout_validated_with_the_arguments(t: ReferenceTransport, clock: ManualClock, timeout: Any,
                                              error: type) -> None:
    t.publish("g", "e")
    with clock.misbehave(Broke()), pytest.raises(error):
        t.claim("w", 5, timeout=timeout)
    with pytest.raises(TypeError):  # signature order: min_priority is checked first
        t.claim("w", 5, "x", timeout=timeout)
    assert t.stats() == TransportStats(1, 1, 0, 0, 0)


@pytest.mark.parametrize("timeout", [0, 0.0, -0.0, 0.001, 5, math.inf, 10**400, None])
def test_a_waiting_claim_returns_at_once_what_a_claim_returns(t: ReferenceTransport, timeout: Any) -> None:
    """decisions.md: the reference never waits."""
    assert t.claim("w", 5, timeout=timeout) is None
    t.publish("g", "e")
    lease = t.claim("w", 5, timeout=timeout)
    assert lease is not None and lease.seq == 1
    assert t.claim("w", 5, timeout=timeout) is None


def test_close(t: ReferenceTransport, clock: ManualClock) -> None:
    assert t.closed is False
    t.publish("g", "e")
    t.close()
    t.close()  # idempotent
    assert t.closed is True
    reads = clock.reads
    for timeout in (5, 0.001, None, math.inf):
        assert t.claim("w", 5, timeout=timeout) is None  # at once, without claiming
    assert clock.reads == reads  # decisions.md: not even the clock is read
    with pytest.raises(ValueError):
        t.claim("w", 5, timeout=-1)  # still validated
    lease = t.claim("w", 5, timeout=-0.0)  # timeout 0: exactly Part 1
    assert lease is not None
    t.ack(lease)
    t.publish("g", "e2")  # everything else works as before
    assert t.claim("w", 5).event == "e2"


def test_context_manager_closes(clock: ManualClock) -> None:
    with ReferenceTransport(clock) as t:
        assert not t.closed
    assert t.closed


# -- pause / resume ---------------------------------------------------------------------


def test_pause_keeps_a_group_from_claims_not_its_lease(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("a", "a1")
    t.publish("a", "a2")
    t.publish("b", "b1")
    lease = t.claim("w", 10)  # a1
    assert t.pause("a") is True
    assert t.pause("a") is False  # already paused
    assert t.stats() == TransportStats(3, 2, 1, 0, 1)
    info = t.group("a")
    assert (info.state, info.paused, info.worker_id, info.attempt) == ("leased", True, "w", 1)
    lease = t.extend(lease, 20)  # its worker may still extend...
    t.nack(lease)  # ...and nack: a1 stays in the still-paused group
    assert t.group("a").state == "paused"
    assert claimed_groups(t) == ["b"]
    assert t.resume("a") is True
    assert t.resume("a") is False  # nothing left to lift
    lease = t.claim("w", 10)
    assert (lease.event, lease.attempt) == ("a1", 2)


def test_an_expired_lease_of_a_paused_group_stays_put(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("a", "a1")
    lease = t.claim("w", 10)
    t.pause("a")
    clock.advance(11)
    assert t.claim("w", 10) is None  # expired, but the group is paused
    assert t.group("a").state == "paused"
    t.ack(lease)  # nobody claimed it since: still current
    assert t.group("a").messages == 0


def test_pause_outlives_the_messages(t: ReferenceTransport) -> None:
    """A paused group is not forgotten while paused, even when empty; an
    emptied group is forgotten on resume."""
    assert t.pause("new") is True  # no such group yet: recorded
    assert t.stats() == TransportStats(0, 0, 0, 0, 1)
    assert t.group("new") == GroupInfo("new", 0, 0, "paused", True, None, None, None, None, None)
    t.publish("new", "n1", priority=7)  # the group exists: its priority (0) stays
    assert t.claim("w", 10) is None
    assert t.group("new").priority == 0
    assert t.resume("new") is True
    lease = t.claim("w", 10)
    assert lease.event == "n1"
    t.pause("new")
    t.ack(lease)  # the last message: the paused group stays, with its place
    info = t.group("new")
    assert (info.messages, info.state, info.head_seq, info.last_claimed_at) == (0, "paused", None, 1000.0)
    assert t.stats() == TransportStats(0, 0, 0, 0, 1)
    assert t.resume("new") is True
    assert t.group("new") is None  # forgotten on resume
    assert t.groups() == []


def test_resume_ends_a_park(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("a", "a1")
    lease = t.claim("w", 10)
    t.nack(lease, 100)
    assert t.claim("w", 10) is None
    info = t.group("a")
    assert (info.state, info.worker_id, info.expires_at, info.attempt) == ("parked", "__parked__", 1100.0, 1)
    assert t.resume("a") is True
    assert t.group("a").state == "ready"
    again = t.claim("w", 10)
    assert (again.seq, again.attempt) == (1, 2)  # attempt unchanged by the resume, +1 by the claim
    assert t.resume("a") is False  # a lease is not a park
    assert t.resume("nobody") is False  # decisions.md: unknown group
    assert t.groups()[0].group_id == "a"


def test_resume_ends_a_park_that_ran_out_unseen(t: ReferenceTransport, clock: ManualClock) -> None:
    """decisions.md: resume reads no clock; a park nobody saw run out is still a park."""
    t.publish("a", "a1")
    t.publish("b", "b1")
    t.nack(t.claim("w", 10), 5)
    t.nack(t.claim("w", 10), 5)
    clock.advance(6)
    reads = clock.reads
    assert t.resume("a") is True
    assert clock.reads == reads
    t.stats()  # sees b's park run out
    assert t.resume("b") is False


def test_a_parked_message_in_a_paused_group(t: ReferenceTransport) -> None:
    t.publish("a", "a1")
    t.nack(t.claim("w", 10), 50)
    t.pause("a")
    info = t.group("a")
    assert (info.state, info.paused) == ("parked", True)
    assert t.resume("a") is True  # lifts both
    assert t.claim("w", 10).event == "a1"


# -- purge ------------------------------------------------------------------------------


def test_purge_fences_the_lease_and_forgets_the_group(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("a", "a1", priority=5)
    t.publish("a", "a2")
    t.publish("b", "b1")
    lease = t.claim("w", 10)  # a1
    t.pause("a")
    reads = clock.reads
    assert t.purge("a") == 2
    assert clock.reads == reads
    for call in (lambda: t.ack(lease), lambda: t.nack(lease), lambda: t.nack(lease, 5),
                 lambda: t.extend(lease, 5)):
        with pytest.raises(LeaseLost):
            call()
    assert t.stats() == TransportStats(1, 1, 0, 0, 0)  # pause gone too
    assert t.group("a") is None
    assert t.publish("a", "a3") == 4  # seqs are never reused
    assert t.group("a").priority == 0  # re-created fresh
    assert t.purge("a") == 1
    assert t.purge("a") == 0
    assert t.purge("nobody") == 0


def test_purge_of_a_paused_empty_group_forgets_the_pause(t: ReferenceTransport) -> None:
    t.pause("a")
    assert t.purge("a") == 0
    assert t.stats().paused == 0
    assert t.group("a") is None
    t.publish("a", "a1")
    assert t.claim("w", 10).event == "a1"


# -- set_priority -------------------------------------------------------------------------


def test_set_priority(t: ReferenceTransport) -> None:
    assert t.set_priority("nobody", 3) is False
    assert t.group("nobody") is None  # does not create a group
    t.publish("a", "a1")
    t.publish("b", "b1")
    t.publish("c", "c1")
    t.ack(t.claim("w", 10))  # a: forgotten
    t.publish("a", "a2")
    t.nack(t.claim("w", 10))  # b, claim 2
    t.nack(t.claim("w", 10))  # c, claim 3
    assert t.set_priority("b", 9) is True
    assert t.set_priority("b", 9) is True  # no change, but the group exists
    assert t.claim("w", 10, min_priority=9).group_id == "b"
    assert t.group("b").priority == 9
    # the round-robin position is kept: b (claim 4) goes after a (never) and c (3)
    assert t.set_priority("b", 0) is True
    assert claimed_groups(t) == ["a", "c"]


def test_set_priority_of_a_paused_empty_group(t: ReferenceTransport) -> None:
    t.pause("a")
    assert t.set_priority("a", 4) is True
    t.publish("a", "a1", priority=-1)  # ignored: the group exists
    t.resume("a")
    assert t.claim("w", 10, min_priority=4).group_id == "a"


@pytest.mark.parametrize("call, error", [
    (lambda t: t.pause(5), TypeError),
    (lambda t: t.resume(None), TypeError),
    (lambda t: t.purge(b"a"), TypeError),
    (lambda t: t.group(1), TypeError),
    (lambda t: t.set_priority(3, 1), TypeError),
    (lambda t: t.set_priority(3, "x"), TypeError),  # group_id first
    (lambda t: t.set_priority("a", 1.0), TypeError),
    (lambda t: t.set_priority("a", True), TypeError),
    (lambda t: t.set_priority("a", 2**63), OverflowError),
    (lambda t: t.set_priority("a", INT64_MIN - 1), OverflowError),
])
def test_control_plane_bad_input(t: ReferenceTransport, clock: ManualClock, call: Any, error: type) -> None:
    t.publish("a", "a1")
    t.nack(t.claim("w", 10), 5)
    with clock.misbehave(Broke()), pytest.raises(error):
        call(t)
    assert t.groups() == [GroupInfo("a", 0, 1, "parked", False, 1, "__parked__", 1005.0, 1, 1000.0)]


def test_str_subclass_ids_become_exact_str(t: ReferenceTransport) -> None:
    class Name(str):
        pass

    t.pause(Name("a"))
    info = t.groups()[0]
    assert type(info.group_id) is str
    assert t.resume("a") is True


# -- group / groups ---------------------------------------------------------------------


def test_group_reads_the_clock_and_applies_expiry(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("a", "a1")
    lease = t.claim("w", 10)
    clock.advance(10)
    reads = clock.reads
    info = t.group("nobody")  # unknown, but the clock is read and expiry applied
    assert info is None and clock.reads == reads + 1
    assert t.group("a").state == "leased"  # expires_at == now: not expired (<)
    clock.advance(1)
    assert t.group("a") == GroupInfo("a", 0, 1, "ready", False, 1, None, None, None, 1000.0)
    clock.advance(-5)  # observed expiry is permanent
    assert t.group("a").state == "ready"
    with clock.misbehave(Broke()), pytest.raises(Broke):
        t.group("a")
    with clock.misbehave(math.nan), pytest.raises(ValueError):
        t.groups()
    t.ack(lease)  # nobody claimed it since: still current
    assert t.groups() == []


def test_groups_in_creation_order(t: ReferenceTransport) -> None:
    t.publish("b", 1)
    t.publish("a", 2, priority=3)
    t.pause("c")
    t.publish("d", 3)
    t.ack(t.claim("w", 10))  # b is forgotten...
    t.publish("b", 4)  # ...and re-created last
    infos = t.groups()
    assert [i.group_id for i in infos] == ["a", "c", "d", "b"]
    assert [i.state for i in infos] == ["ready", "paused", "ready", "ready"]
    assert infos[0] == GroupInfo("a", 3, 1, "ready", False, 2, None, None, None, None)
    lease = t.claim("w", 10)
    assert lease.group_id == "a"
    assert t.groups()[0] == GroupInfo("a", 3, 1, "leased", False, 2, "w", 1010.0, 1, 1000.0)
    assert all(type(i) is GroupInfo for i in t.groups())


# -- batches ------------------------------------------------------------------------------


def test_publish_many_is_publish_one_by_one() -> None:
    clocks = [ManualClock(), ManualClock()]
    batch, single = ReferenceTransport(clocks[0]), ReferenceTransport(clocks[1])
    Item = namedtuple("Item", "group_id event priority")
    items = [("a", 1), ("b", 2, 5), ("a", 3, 9), Item("c", 4, -1), ("b", 5)]
    assert batch.publish_many(iter(items)) == [1, 2, 3, 4, 5]  # any iterable of tuples
    for item in items:
        single.publish(*item)
    assert batch.publish_many([]) == []
    assert fingerprint(batch, clocks[0]) == fingerprint(single, clocks[1])


@pytest.mark.parametrize("items, error", [
    (5, TypeError),
    (None, TypeError),
    ("ab", TypeError),  # a str is an iterable of str, not of tuples
    ([["a", 1]], TypeError),  # tuples only
    ([("a", 1), ("b", 2, 0, "x", None)], ValueError),  # 5 fields (Part 5 allows 4: a key)
    ([("a", 1), ("b", 2, 0, 1)], TypeError),  # a key that is not a str
    ([("a",)], ValueError),
    ([()], ValueError),
    ([("a", 1), (7, 2)], TypeError),
    ([("a", 1, 1.0)], TypeError),
    ([("a", 1, True)], TypeError),
    ([("a", 1), ("b", 2, 2**63)], OverflowError),
    ([("a", 1, "x"), (5, 2)], TypeError),  # the first bad item decides
])
def test_publish_many_all_or_nothing(t: ReferenceTransport, items: Any, error: type) -> None:
    t.publish("a", 0)
    with pytest.raises(error):
        t.publish_many(items)
    assert len(t) == 1 and t.stats().groups == 1
    assert t.publish("z", 1) == 2  # no seq was used up


def test_publish_many_iterator_raising_publishes_nothing(t: ReferenceTransport) -> None:
    def items() -> Any:
        yield ("a", 1)
        raise RuntimeError("the producer broke")

    with pytest.raises(RuntimeError):
        t.publish_many(items())
    assert len(t) == 0


def history(t: ReferenceTransport, clock: ManualClock) -> None:
    for i in range(6):
        t.publish(f"g{i % 4}", i, priority=i % 3)
    t.nack(t.claim("w", 10))
    t.nack(t.claim("w", 10), 3)
    t.claim("w", 5)
    clock.advance(6)  # the park and the 5 s lease run out, unseen


@pytest.mark.parametrize("count, floor", [(0, 0), (1, 0), (2, 0), (3, 1), (10, INT64_MIN), (2**70, 0)])
def test_claim_many_is_successive_claims(count: int, floor: int) -> None:
    clocks = [ManualClock(), ManualClock()]
    batch, single = ReferenceTransport(clocks[0]), ReferenceTransport(clocks[1])
    history(batch, clocks[0])
    history(single, clocks[1])
    reads = clocks[0].reads
    leases = batch.claim_many("w2", 7, count, floor)
    assert clocks[0].reads == reads + 1  # one clock read, even for 0
    expected = []
    while len(expected) < count and (lease := single.claim("w2", 7, floor)) is not None:
        expected.append(lease)
    fields = [(x.seq, x.group_id, x.event, x.worker_id, x.expires_at, x.attempt) for x in leases]
    assert fields == [(x.seq, x.group_id, x.event, x.worker_id, x.expires_at, x.attempt) for x in expected]
    assert len({x.group_id for x in leases}) == len(leases)
    assert fingerprint(batch, clocks[0]) == fingerprint(single, clocks[1])


@pytest.mark.parametrize("args, error", [
    (("w", 5, -1), ValueError), (("w", 5, 1.0), TypeError), (("w", 5, True), TypeError),
    (("w", 5, None), TypeError), (("__parked__", 5, 1), ValueError), (("w", -1, 1), ValueError),
    (("w", 5, 1, 2**63), OverflowError), (("w", 5, -1, "x"), ValueError), ((5, "x", "x"), TypeError),
])
def test_claim_many_bad_input(t: ReferenceTransport, clock: ManualClock, args: Any, error: type) -> None:
    t.publish("a", 1)
    with clock.misbehave(Broke()), pytest.raises(error):
        t.claim_many(*args)
    assert t.stats() == TransportStats(1, 1, 0, 0, 0)


def test_ack_many_returns_the_lost_ones(t: ReferenceTransport, clock: ManualClock) -> None:
    for group in "abcd":
        t.publish(group, group)
    a, b, c, d = (t.claim("w", 10) for _ in range(4))
    t.nack(b)  # b: not current any more
    c2 = t.extend(c, 20)  # c and c2 name the same delivery
    forged = ReferenceLease(d.seq, d.group_id, d.event, d.worker_id, d.expires_at, d.attempt)
    reads = clock.reads
    lost = t.ack_many([a, b, c, c2, forged, a])
    assert clock.reads == reads
    assert lost == [b, c2, forged, a]  # in order, the same objects
    assert all(x is y for x, y in zip(lost, [b, c2, forged, a]))
    assert len(t) == 2  # b (free again) and d (still leased)
    assert t.ack_many(iter([d])) == [] and t.ack_many([]) == []
    assert [x.group_id for x in t.groups()] == ["b"]


@pytest.mark.parametrize("leases", [None, 5, "x", [None], ["lease"], [(1, "a")]])
def test_ack_many_type_checks_everything_first(t: ReferenceTransport, leases: Any) -> None:
    t.publish("a", 1)
    lease = t.claim("w", 10)
    batch = [lease] + leases if isinstance(leases, list) else leases
    with pytest.raises(TypeError):
        t.ack_many(batch)
    assert len(t) == 1  # nothing acked
    t.ack(lease)


def test_part_one_bad_input_unchanged(t: ReferenceTransport) -> None:
    """Part 2 does not change Part 1's table (a few rows as a smoke check)."""
    for call, error in ((lambda: t.publish(1, "e"), TypeError), (lambda: t.claim("__parked__", 1), ValueError),
                        (lambda: t.claim("w", 1, INT64_MAX + 1), OverflowError), (lambda: t.ack(None), TypeError)):
        with pytest.raises(error):
            call()
    assert len(t) == 0
