"""Batches (SPEC Part 2, "Batches"; docs/decisions.md, Part 2).

``publish_many``, ``claim_many`` and ``ack_many`` on both implementations,
each held against the same operations done one by one on a twin transport
(same clock times, same event objects): the results must be equal -- leases
field by field with the events by identity -- and so must the state
afterwards (``helpers.fingerprint`` uses both transports up and compares
everything observable).
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, Iterator, List, NamedTuple, Tuple

import pytest

from helpers import CPYTHON_ONLY_REASON, INT64_MAX, INT64_MIN, IS_CPYTHON, fingerprint, lease_key
from leasequeue.testing import ManualClock

from leasequeue import LeaseLost, TransportStats


class Twins:
    """Two transports of one implementation, each with its own manual clock,
    moved together: ``a`` gets the batch, ``b`` the calls one by one."""

    def __init__(self, cls: Any) -> None:
        self.ca, self.cb = ManualClock(), ManualClock()
        self.a, self.b = cls(clock=self.ca), cls(clock=self.cb)

    def advance(self, seconds: float) -> None:
        self.ca.advance(seconds)
        self.cb.advance(seconds)

    def both(self, call: Callable[[Any], Any]) -> Tuple[Any, Any]:
        return call(self.a), call(self.b)

    def same_state(self) -> None:
        assert len(self.a) == len(self.b)
        assert self.a.stats() == self.b.stats()
        assert self.a.groups() == self.b.groups()

    def same_fingerprint(self) -> None:
        assert fingerprint(self.a, self.ca) == fingerprint(self.b, self.cb)


def claims_one_by_one(t: Any, worker: str, visibility: float, max_count: int, floor: int = 0) -> List[Any]:
    out = []
    while len(out) < max_count:
        lease = t.claim(worker, visibility, floor)
        if lease is None:
            break
        out.append(lease)
    return out


def acks_one_by_one(t: Any, leases: List[Any]) -> List[Any]:
    lost = []
    for lease in leases:
        try:
            t.ack(lease)
        except LeaseLost:
            lost.append(lease)
    return lost


def keys(leases: List[Any]) -> List[Any]:
    return [lease_key(lease) for lease in leases]


def fill(twins: Twins, rng: random.Random, n: int, groups: int) -> None:
    for _ in range(n):
        g, ev, p = f"g{rng.randrange(groups)}", object(), rng.choice([0, 1, 2])
        twins.both(lambda t: t.publish(g, ev, p))


# -- publish_many ----------------------------------------------------------------------


def test_publish_many_is_publishing_one_by_one(transport_cls: Any) -> None:
    twins = Twins(transport_cls)
    rng = random.Random(1)
    twins.a.publish("g0", "before")
    twins.b.publish("g0", "before")
    twins.a.pause("p")
    twins.b.pause("p")
    for size in (0, 1, 3, 16, 64, 200):
        items: List[Any] = []
        for _ in range(size):
            g = rng.choice(["g0", "g1", "p", f"new{rng.randrange(40)}"])
            ev = object()
            items.append((g, ev) if rng.random() < 0.5 else (g, ev, rng.choice([-1, 0, 3, INT64_MAX])))
        seqs = twins.a.publish_many(items)
        singles = [twins.b.publish(*item) for item in items]
        assert seqs == singles and type(seqs) is list
        assert seqs == list(range(seqs[0], seqs[0] + size)) if size else seqs == []
        twins.same_state()
    twins.a.resume("p")
    twins.b.resume("p")
    twins.same_fingerprint()


@pytest.mark.parametrize("form", ["list", "tuple", "iterator", "generator", "dict_keys"])
def test_publish_many_takes_any_iterable(transport: Any, form: str) -> None:
    items = [("a", 1), ("b", 2, 5), ("a", 3)]
    arg: Any = {
        "list": items,
        "tuple": tuple(items),
        "iterator": iter(items),
        "generator": (item for item in items),
        "dict_keys": dict.fromkeys(items).keys(),
    }[form]
    assert transport.publish_many(arg) == [1, 2, 3]
    assert [(g.group_id, g.priority, g.messages) for g in transport.groups()] == [("a", 0, 2), ("b", 5, 1)]


def test_publish_many_reads_named_tuples_as_the_tuples_they_are(transport: Any) -> None:
    class Item(NamedTuple):
        group_id: str
        event: Any

    class Hostile(tuple):  # type: ignore[type-arg]
        def __len__(self) -> int:
            raise AssertionError("__len__ called")

        def __getitem__(self, i: Any) -> Any:
            raise AssertionError("__getitem__ called")

        def __iter__(self) -> Iterator[Any]:
            raise AssertionError("__iter__ called")

    class Name(str):
        pass

    seqs = transport.publish_many([Item("a", "x"), Hostile(("b", "y", 2)), (Name("c"), "z")])
    assert seqs == [1, 2, 3]
    listed = transport.groups()
    assert [(g.group_id, g.priority) for g in listed] == [("a", 0), ("b", 2), ("c", 0)]
    assert all(type(g.group_id) is str for g in listed)


BAD_ITEMS = [
    ([["g", "e"]], TypeError),  # a list is not a tuple
    (["ge"], TypeError),  # nor is a str
    ([None], TypeError),
    ([("g",)], ValueError),
    ([()], ValueError),
    ([("g", "e", 0, None, 1)], ValueError),  # five fields (0.6 accepts a fourth, the key)
    ([("g", "e", 0, 1)], TypeError),  # a key that is not a str
    ([(7, "e")], TypeError),
    ([("g", "e", 1.5)], TypeError),
    ([("g", "e", True)], TypeError),
    ([("g", "e", 2**63)], OverflowError),
    ([("g", "e", INT64_MIN - 1)], OverflowError),
    ([("ok", "e"), ("ok2", "e", 1), (b"g", "e")], TypeError),  # the last item spoils the batch
    ([("g", "e", 2**63), ["g", "e"]], OverflowError),  # the first bad item decides
    ([["g", "e"], ("g", "e", 2**63)], TypeError),
    ([("g",), (7, "e")], ValueError),
]


@pytest.mark.parametrize("items, error", BAD_ITEMS)
def test_publish_many_checks_every_item_first(transport: Any, clock: ManualClock, items: Any, error: type) -> None:
    t = transport
    t.publish("g", "held")
    t.pause("p")
    before = (len(t), t.stats(), t.groups())
    with pytest.raises(error):
        t.publish_many(items)
    with pytest.raises(error):
        t.publish_many(iter(items))
    assert (len(t), t.stats(), t.groups()) == before
    assert t.publish("g", "next") == 2  # no seq was used up


@pytest.mark.parametrize("items", [5, None, 1.5, object()])
def test_publish_many_of_a_non_iterable(transport: Any, items: Any) -> None:
    with pytest.raises(TypeError):
        transport.publish_many(items)
    assert len(transport) == 0 and transport.publish("g", 1) == 1


def test_publish_many_iteration_error_publishes_nothing(transport: Any) -> None:
    class Broken(Exception):
        pass

    def items() -> Iterator[Any]:
        yield ("a", 1)
        yield ("b", 2)
        raise Broken

    with pytest.raises(Broken):
        transport.publish_many(items())
    assert len(transport) == 0 and transport.groups() == [] and transport.publish("a", 1) == 1


def test_publish_many_priority_counts_on_creation_only(transport: Any) -> None:
    t = transport
    t.publish("old", "x", 4)
    t.publish_many([("new", 1, 2), ("new", 2, 9), ("old", 3, 9), ("new2", 4), ("new2", 5, 9)])
    assert [(g.group_id, g.priority, g.messages) for g in t.groups()] == [("old", 4, 2), ("new", 2, 2), ("new2", 0, 2)]


def test_publish_many_into_an_empty_paused_group(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish("a", "a1")
    t.pause("p")
    t.publish_many([("b", "b1"), ("p", "p1"), ("p", "p2")])
    assert t.group("p").messages == 2 and t.stats() == TransportStats(4, 3, 0, 0, 1)
    assert [t.claim("w", 10).event for _ in range(2)] + [t.claim("w", 10)] == ["a1", "b1", None]
    t.resume("p")
    assert t.claim("w", 10).event == "p1"  # placed by its oldest message, never claimed


def test_publish_many_creates_many_levels_at_once(transport: Any) -> None:
    """New groups over many new priority levels in one batch (each level made,
    with room for its groups, before anything is published)."""
    t = transport
    items = [(f"g{i}", i, (i * 7919) % 37 - 18) for i in range(300)]
    t.publish_many(items)
    for floor in range(18, -19, -1):
        got = sorted(lease.event for lease in claims_one_by_one(t, "w", math.inf, 10**6, floor))
        assert got == sorted(i for i in range(300) if (i * 7919) % 37 - 18 == floor)


def test_publish_many_reads_no_clock(transport: Any, clock: ManualClock) -> None:
    before = clock.reads
    transport.publish_many([("a", 1), ("b", 2)])
    transport.publish_many([])
    with pytest.raises(TypeError):
        transport.publish_many([["a", 1]])
    assert clock.reads == before


# -- claim_many --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_claim_many_is_successive_claims_at_one_now(transport_cls: Any, seed: int) -> None:
    rng = random.Random(seed)
    twins = Twins(transport_cls)
    groups = rng.choice([1, 3, 20, 200])
    fill(twins, rng, rng.choice([5, 50, 400]), groups)
    for _ in range(40):
        roll = rng.random()
        if roll < 0.3:
            fill(twins, rng, rng.randrange(1, 30), groups)
        elif roll < 0.45:
            twins.advance(rng.choice([0.5, 3, 11]))
        elif roll < 0.55:
            g = f"g{rng.randrange(groups)}"
            call = rng.choice([lambda t: t.pause(g), lambda t: t.resume(g), lambda t: t.set_priority(g, 1)])
            twins.both(call)
        k = rng.choice([0, 1, 2, 5, 16, 64, 2**70])
        floor = rng.choice([INT64_MIN, 0, 1, 2, 3])
        vis = rng.choice([0.0, 1.0, 5.0, math.inf])
        worker = rng.choice(["w1", "w2"])
        batch = twins.a.claim_many(worker, vis, k, floor)
        singles = claims_one_by_one(twins.b, worker, vis, k, floor)
        assert type(batch) is list
        assert keys(batch) == keys(singles)
        assert len({lease.group_id for lease in batch}) == len(batch)
        # then ack or nack some of them, the same way on both sides
        for la, lb in zip(batch, singles):
            what = rng.random()
            if what < 0.5:
                twins.a.ack(la)
                twins.b.ack(lb)
            elif what < 0.6:
                twins.a.nack(la, 2)
                twins.b.nack(lb, 2)
        twins.same_state()
    twins.same_fingerprint()


def test_claim_many_reads_the_clock_once_and_applies_expiry(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish_many([("a", 1), ("b", 2), ("c", 3)])
    leases = t.claim_many("w", 10, 2)
    assert [lease.event for lease in leases] == [1, 2]
    assert {lease.expires_at for lease in leases} == {1010.0}
    clock.advance(11)
    before = clock.reads
    assert t.claim_many("w", 10, 0) == []  # reads the clock even for nothing...
    assert clock.reads == before + 1
    assert t.stats().leased == 0  # ...and applied the expiry
    clock.advance(-11)  # for good: the transport's time does not go back
    got = t.claim_many("w", 5, 10)
    assert [(lease.event, lease.attempt, lease.expires_at) for lease in got] == [
        (3, 1, 1016.0), (1, 2, 1016.0), (2, 2, 1016.0)]
    assert clock.reads == before + 3


def test_claim_many_stops_at_the_first_none_and_takes_no_group_twice(transport: Any) -> None:
    t = transport
    for i in range(5):
        t.publish("g", i)
    t.publish("h", "h0", 2)
    assert [lease.event for lease in t.claim_many("w", 10, 2**70)] == [0, "h0"]
    assert t.claim_many("w", 10, 2**70) == []


def test_claim_many_respects_floor_and_pause(transport: Any) -> None:
    t = transport
    t.publish_many([("lo", 1, 0), ("hi", 2, 5), ("hi2", 3, 5), ("mid", 4, 3)])
    t.pause("hi2")
    assert [lease.event for lease in t.claim_many("w", 10, 10, 3)] == [2, 4]


def test_claim_many_default_floor_is_zero_as_claims(transport: Any) -> None:
    t = transport
    t.publish_many([("below", 1, -1), ("at", 2, 0), ("above", 3, 1)])
    assert sorted(lease.event for lease in t.claim_many("w", 10, 5)) == [2, 3]
    assert t.claim("w", 10) is None
    assert [lease.event for lease in t.claim_many("w", 10, 5, -1)] == [1]


@pytest.mark.parametrize(
    "args, error",
    [
        (("w", 10, -1), ValueError),
        (("w", 10, 1.0), TypeError),
        (("w", 10, True), TypeError),
        (("w", 10, None), TypeError),
        (("w", 10, "1"), TypeError),
        (("__parked__", 10, 1), ValueError),
        ((5, 10, 1), TypeError),
        (("w", -1, 1), ValueError),
        (("w", math.nan, 1), ValueError),
        (("w", 10, 1, 2**63), OverflowError),
        (("w", 10, 1, -2**63 - 1), OverflowError),
        (("w", 10, 1, 1.0), TypeError),
        (("w", -1, -1, "x"), ValueError),  # signature order: visibility first
        (("w", 10, -1, "x"), ValueError),  # then max_count
    ],
)
def test_claim_many_bad_input(transport: Any, clock: ManualClock, args: Any, error: type) -> None:
    t = transport
    t.publish("g", "a")
    t.claim("w", 1)
    clock.advance(5)  # an expiry a clock read would apply
    before = clock.reads
    with pytest.raises(error):
        t.claim_many(*args)
    assert clock.reads == before  # validated before the clock is read
    clock.advance(-5)
    assert t.stats().leased == 1


def test_claim_many_big_counts(transport: Any) -> None:
    class Count(int):
        pass

    t = transport
    t.publish_many([(f"g{i}", i) for i in range(50)])
    assert len(t.claim_many("w", 10, Count(3))) == 3
    assert len(t.claim_many("w", 10, 10**30)) == 47


# -- ack_many ---------------------------------------------------------------------------


def test_ack_many_returns_the_very_leases_that_were_not_current(transport_cls: Any) -> None:
    clock = ManualClock()
    t = transport_cls(clock=clock)
    other = transport_cls(clock=clock)
    other.publish("g", "x")
    foreign = other.claim("w", 10)
    t.publish_many([(f"g{i}", i) for i in range(4)] + [("g0", "second")])
    a, b, c, d = t.claim_many("w", 10, 4)
    b2 = t.extend(b, 30)
    forged = type(a)(a.seq, a.group_id, a.event, a.worker_id, a.expires_at, a.attempt)
    t.nack(d)
    batch = [a, b2, b, a, forged, foreign, c, d]
    lost = t.ack_many(iter(batch))
    assert type(lost) is list
    assert [id(x) for x in lost] == [id(b), id(a), id(forged), id(foreign), id(d)]
    assert [lease.event for lease in claims_one_by_one(t, "w", 10, 10)] == ["second", 3]
    assert t.ack_many([]) == []


@pytest.mark.parametrize("bad", [None, "lease", (1, "a"), 5])
def test_ack_many_type_checks_every_element_first(transport: Any, bad: Any) -> None:
    t = transport
    t.publish_many([("a", 1), ("b", 2)])
    leases = t.claim_many("w", 10, 2)
    before = (len(t), t.stats())
    with pytest.raises(TypeError):
        t.ack_many([leases[0], bad, leases[1]])
    assert (len(t), t.stats()) == before
    assert t.ack_many(leases) == []
    assert len(t) == 0


@pytest.mark.parametrize("leases", [None, 5, object()])
def test_ack_many_of_a_non_iterable(transport: Any, leases: Any) -> None:
    with pytest.raises(TypeError):
        transport.ack_many(leases)


def test_ack_many_reads_no_clock_and_never_raises_lease_lost(transport: Any, clock: ManualClock) -> None:
    t = transport
    t.publish_many([("a", 1), ("a", 2)])
    lease = t.claim("w", 10)
    t.ack(lease)
    before = clock.reads
    assert t.ack_many([lease, lease]) == [lease, lease]
    assert clock.reads == before
    current = t.claim("w", 10)  # "a" again: 2
    before = clock.reads
    assert t.ack_many([current, lease]) == [lease]  # acks one; no claim waits: no clock either
    assert clock.reads == before and len(t) == 0


def test_ack_many_keeps_an_emptied_paused_group(transport: Any) -> None:
    t = transport
    t.publish_many([("p", 1), ("q", 2)])
    leases = t.claim_many("w", 10, 2)
    t.pause("p")
    assert t.ack_many(leases) == []
    assert [(g.group_id, g.messages, g.paused) for g in t.groups()] == [("p", 0, True)]
    assert t.stats() == TransportStats(0, 0, 0, 0, 1)


@pytest.mark.parametrize("seed", range(6))
def test_ack_many_is_acking_one_by_one(transport_cls: Any, seed: int) -> None:
    rng = random.Random(seed)
    twins = Twins(transport_cls)
    groups = rng.choice([2, 10, 100])
    fill(twins, rng, 300, groups)
    pool: List[Tuple[Any, Any]] = []  # (lease of a, lease of b), current or not
    for _ in range(60):
        batch = twins.a.claim_many("w", 5, rng.choice([1, 4, 16]), INT64_MIN)
        singles = claims_one_by_one(twins.b, "w", 5, len(batch), INT64_MIN)
        assert keys(batch) == keys(singles)
        pool.extend(zip(batch, singles))
        if pool and rng.random() < 0.3:
            la, lb = pool[rng.randrange(len(pool))]
            try:
                pool.append((twins.a.extend(la, 9), twins.b.extend(lb, 9)))
            except LeaseLost:
                with pytest.raises(LeaseLost):
                    twins.b.extend(lb, 9)
        if rng.random() < 0.3:
            twins.advance(rng.choice([2, 6]))
        if rng.random() < 0.2:
            g = f"g{rng.randrange(groups)}"
            if rng.random() < 0.5:
                twins.both(lambda t: t.pause(g))
            else:
                removed = twins.both(lambda t: t.purge(g))
                assert removed[0] == removed[1]
        picks = [pool[rng.randrange(len(pool))] for _ in range(rng.randrange(0, 12))] if pool else []
        lost_a = twins.a.ack_many([la for la, _ in picks])
        lost_b = acks_one_by_one(twins.b, [lb for _, lb in picks])
        assert keys(lost_a) == keys(lost_b)
        twins.same_state()
        if rng.random() < 0.2:
            fill(twins, rng, 30, groups)
    for name in [g.group_id for g in twins.a.groups() if g.paused]:
        twins.both(lambda t: t.resume(name))
    twins.same_fingerprint()


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
def test_ack_many_drops_the_events_after_the_lock(transport: Any, clock: ManualClock) -> None:
    """Events whose ``__del__`` works the same transport (publish, claim, group).

    The leases hold their events while ``ack_many`` holds the lock, so the
    last references go when ``ack_many`` lets go of the batch, which is here
    the only holder of the leases (a generator feeds them): that must be
    after the lock, with the batch complete.
    """
    t = transport
    log: List[Any] = []

    class Step:
        def __init__(self, n: int) -> None:
            self.n = n

        def __del__(self) -> None:
            t.publish("next", self.n)
            got = t.claim_many("finaliser", 10, 1, 1)  # only "hi" groups: none left
            log.append((self.n, len(t), got, t.group("a")))

    t.publish_many([(g, Step(i)) for i, g in enumerate("abc")])
    assert t.ack_many(lease for lease in t.claim_many("w", 10, 3)) == []
    assert sorted(entry[0] for entry in log) == [0, 1, 2]
    assert all(entry[2] == [] and entry[3] is None for entry in log)
    assert sorted(entry[1] for entry in log) == [1, 2, 3]
    assert len(t) == 3


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
def test_ack_many_releases_each_acked_event_while_its_group_goes_on(transport: Any) -> None:
    """An acked message's event is released at once, not when its group
    empties (mutation testing: keeping the acked slot of a long group's list
    went unseen, since every leak test drained its groups first)."""
    import weakref

    class Event:
        pass

    t = transport
    events = [Event() for _ in range(5)]
    refs = [weakref.ref(e) for e in events]
    t.publish_many([("g", e) for e in events])
    del events
    for i in range(4):
        lease = t.claim("w", 10)
        assert t.ack_many([lease]) == []
        del lease
        assert [r() is None for r in refs] == [True] * (i + 1) + [False] * (4 - i)
    assert len(t) == 1


# -- everything together ------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_batches_against_one_by_one_random(transport_cls: Any, seed: int) -> None:
    """A random mix: every batch on ``a`` is the single calls on ``b``."""
    rng = random.Random(100 + seed)
    twins = Twins(transport_cls)
    groups = rng.choice([3, 30, 300])
    pool: List[Tuple[Any, Any]] = []
    for _ in range(300):
        roll = rng.random()
        if roll < 0.35:
            items = [(f"g{rng.randrange(groups)}", object(), rng.choice([0, 1, 2])) for _ in range(rng.randrange(8))]
            assert twins.a.publish_many(items) == [twins.b.publish(*item) for item in items]
        elif roll < 0.6:
            k, vis, floor = rng.choice([1, 3, 8, 2**70]), rng.choice([1, 4, math.inf]), rng.choice([0, 1, 2])
            batch = twins.a.claim_many("w", vis, k, floor)
            singles = claims_one_by_one(twins.b, "w", vis, k, floor)
            assert keys(batch) == keys(singles)
            pool.extend(zip(batch, singles))
        elif roll < 0.85 and pool:
            picks = [pool[rng.randrange(len(pool))] for _ in range(rng.randrange(1, 6))]
            lost = twins.a.ack_many([la for la, _ in picks])
            assert keys(lost) == keys(acks_one_by_one(twins.b, [lb for _, lb in picks]))
        else:
            twins.advance(rng.choice([1, 3, 5]))
        twins.same_state()
    pool.clear()
    twins.same_fingerprint()



def test_ack_many_through_a_long_group_keeps_its_order(transport: Any) -> None:
    """Acking a long group's messages one ack_many at a time goes past the
    point where the group's acked prefix is dropped (compaction): every
    message is still delivered once, in order, and the group is forgotten
    at the end (mutation testing: a wrong head after compaction survived)."""
    t = transport
    seqs = [t.publish("g", i) for i in range(100)]
    for i in range(100):
        lease = t.claim("w", 30)
        assert lease is not None and (lease.seq, lease.event) == (seqs[i], i)
        assert t.ack_many([lease]) == []
        assert len(t) == 99 - i
    assert t.claim("w", 30) is None and t.group("g") is None
