"""SPEC Part 2 on SQLite: the control plane (pause, resume, purge,
set_priority, group, groups) and the batches (publish_many, claim_many,
ack_many), on real files and a manual clock."""

from __future__ import annotations

import math
from typing import Any, Iterator

import pytest

from helpers import FakeClock
from leasequeue import GroupInfo, LeaseLost, SQLiteTransport, TransportStats


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def t(tmp_path: Any, clock: FakeClock) -> Iterator[SQLiteTransport]:
    with SQLiteTransport(tmp_path / "q.db", clock=clock) as transport:
        yield transport


def drain(t: SQLiteTransport) -> list[tuple[Any, ...]]:
    """Claim and ack everything claimable now: the order the transport serves."""
    out = []
    while (lease := t.claim("drain", 10, -(2**63))) is not None:
        out.append((lease.seq, lease.group_id, lease.event, lease.attempt))
        t.ack(lease)
    return out


# -- pause / resume ----------------------------------------------------------------


def test_pause_hides_a_group_and_resume_brings_it_back(t: SQLiteTransport) -> None:
    t.publish("a", 1)
    t.publish("b", 2)
    assert t.pause("a") is True
    assert t.pause("a") is False  # already paused
    lease = t.claim("w", 10)
    assert lease is not None and lease.group_id == "b"
    assert t.claim("w", 10) is None
    assert t.stats() == TransportStats(messages=2, groups=2, leased=1, parked=0, paused=1)
    assert t.group("a").state == "paused"
    assert t.resume("a") is True
    assert t.resume("a") is False  # nothing left to lift
    assert t.claim("w", 10).group_id == "a"


def test_a_leased_message_of_a_paused_group_stays_leased(t: SQLiteTransport, clock: FakeClock) -> None:
    t.publish("a", 1)
    t.publish("a", 2)
    lease = t.claim("w", 10)
    assert t.pause("a") is True
    info = t.group("a")
    assert (info.state, info.paused, info.worker_id, info.attempt) == ("leased", True, "w", 1)
    t.nack(lease)  # nack(0) leaves it in the still-paused group
    assert t.claim("w", 10) is None
    t.resume("a")
    lease = t.claim("w", 10)
    assert (lease.seq, lease.attempt) == (1, 2)
    t.pause("a")
    clock.advance(11)  # the lease expires: the message stays in the paused group
    assert t.claim("w", 10) is None
    assert t.group("a").state == "paused"
    t.ack(lease)  # still current: nobody claimed it since
    assert t.group("a").head_seq == 2
    assert t.claim("w", 10) is None


def test_pausing_an_unknown_group_records_it(t: SQLiteTransport) -> None:
    assert t.pause("later") is True
    assert t.stats() == TransportStats(messages=0, groups=0, leased=0, parked=0, paused=1)
    info = t.group("later")
    assert info == GroupInfo("later", 0, 0, "paused", True, None, None, None, None, None)
    t.publish("later", "x", priority=9)  # the group exists: priority ignored
    t.publish("other", "y")
    assert t.claim("w", 10).group_id == "other"
    assert t.claim("w", 10) is None
    assert t.group("later").messages == 1
    assert t.resume("later") is True
    lease = t.claim("w", 10)
    assert (lease.group_id, lease.event, lease.seq) == ("later", "x", 1)


def test_an_emptied_paused_group_is_kept_until_resumed(t: SQLiteTransport) -> None:
    t.publish("a", 1, priority=3)
    lease = t.claim("w", 10)
    t.pause("a")
    t.ack(lease)
    info = t.group("a")
    assert (info.messages, info.priority, info.state, info.head_seq) == (0, 3, "paused", None)
    assert len(t) == 0 and t.stats().groups == 0 and t.stats().paused == 1
    assert t.resume("a") is True
    assert t.group("a") is None  # forgotten on resume
    assert t.stats().paused == 0


def test_resume_ends_a_park_at_once(t: SQLiteTransport) -> None:
    t.publish("a", 1)
    lease = t.claim("w", 10)
    t.nack(lease, delay=1000)
    assert t.claim("w", 10) is None
    info = t.group("a")
    assert (info.state, info.worker_id, info.attempt) == ("parked", "__parked__", 1)
    assert t.resume("a") is True
    again = t.claim("w", 10)
    assert (again.seq, again.attempt) == (1, 2)
    assert t.resume("nobody") is False


# -- purge ---------------------------------------------------------------------------


def test_purge_removes_everything_and_fences_the_lease(t: SQLiteTransport) -> None:
    for i in range(3):
        t.publish("a", i, priority=5)
    t.publish("b", "keep")
    lease = t.claim("w", 10, min_priority=5)
    t.pause("a")
    assert t.purge("a") == 3
    assert t.purge("a") == 0
    with pytest.raises(LeaseLost):
        t.ack(lease)
    with pytest.raises(LeaseLost):
        t.extend(lease, 10)
    assert t.group("a") is None
    assert t.stats() == TransportStats(messages=1, groups=1, leased=0, parked=0, paused=0)
    t.publish("a", "fresh", priority=1)  # re-created fresh: new priority, not paused
    assert t.group("a").priority == 1
    assert [x[1] for x in drain(t)] == ["b", "a"]


# -- set_priority ----------------------------------------------------------------------


def test_set_priority_keeps_the_round_robin_position(t: SQLiteTransport) -> None:
    t.publish("a", 1)
    t.publish("b", 2)
    assert t.set_priority("zzz", 3) is False
    assert t.group("zzz") is None
    assert t.set_priority("b", 7) is True
    assert t.claim("w", 10, min_priority=5).group_id == "b"
    assert t.set_priority("a", 7) is True
    assert t.group("a").priority == 7
    with pytest.raises(TypeError):
        t.set_priority("a", 1.0)
    with pytest.raises(OverflowError):
        t.set_priority("a", 2**63)
    with pytest.raises(TypeError):
        t.pause(3)
    assert t.group("a").priority == 7


def test_groups_lists_every_group(t: SQLiteTransport, clock: FakeClock) -> None:
    t.publish("b", 1, priority=2)
    t.publish("a", 1)
    t.publish("a", 2)
    t.pause("c")
    lease = t.claim("w", 5)
    assert lease.group_id == "b"
    infos = t.groups()
    assert [g.group_id for g in infos] == ["a", "b", "c"]
    a, b, c = infos
    assert (a.state, a.messages, a.head_seq, a.last_claimed_at) == ("ready", 2, 2, None)
    assert (b.state, b.worker_id, b.expires_at, b.attempt, b.last_claimed_at) == ("leased", "w", 1005.0, 1, 1000.0)
    assert (c.state, c.paused, c.messages) == ("paused", True, 0)
    clock.advance(6)
    assert t.group("b").state == "ready"  # group() applies expiry, as stats() does
    assert t.stats().leased == 0


# -- batches -----------------------------------------------------------------------------


def pair(tmp_path: Any) -> tuple[SQLiteTransport, SQLiteTransport, FakeClock, FakeClock]:
    c1, c2 = FakeClock(), FakeClock()
    return SQLiteTransport(tmp_path / "one.db", clock=c1), SQLiteTransport(tmp_path / "many.db", clock=c2), c1, c2


def test_batches_equal_single_calls(tmp_path: Any) -> None:
    one, many, c1, c2 = pair(tmp_path)
    with one, many:
        items = [(f"g{i % 7}", {"n": i}, i % 3) for i in range(40)] + [("solo", "x")]
        seqs = [one.publish(*item) for item in items]
        assert many.publish_many(items) == seqs == list(range(1, 42))
        for round_ in range(6):
            singles = []
            for _ in range(5):
                lease = one.claim("w", 10, 1 if round_ % 2 else 0)
                if lease is None:
                    break
                singles.append(lease)
            batch = many.claim_many("w", 10, 5, 1 if round_ % 2 else 0)
            assert [(x.seq, x.group_id, x.event, x.expires_at, x.attempt) for x in batch] == [
                (x.seq, x.group_id, x.event, x.expires_at, x.attempt) for x in singles
            ]
            keep = batch[::2]
            for lease in singles[::2]:
                one.ack(lease)
            assert many.ack_many(keep + keep[:1]) == keep[:1]  # the repeat is not current any more
            c1.advance(11)
            c2.advance(11)
        assert one.stats() == many.stats()
        assert drain(one) == drain(many)


def test_claim_many_bounds_and_validation(t: SQLiteTransport) -> None:
    for g in "abc":
        t.publish(g, g)
    assert t.claim_many("w", 10, 0) == []
    with pytest.raises(ValueError):
        t.claim_many("w", 10, -1)
    with pytest.raises(TypeError):
        t.claim_many("w", 10, True)
    with pytest.raises(TypeError):
        t.claim_many("w", 10, 2.0)
    leases = t.claim_many("w", 10, 10)
    assert sorted(x.group_id for x in leases) == ["a", "b", "c"]
    assert t.claim_many("w", 10, 10) == []


def test_publish_many_is_all_or_nothing(t: SQLiteTransport) -> None:
    t.publish("a", 0)
    for bad, error in [
        ([("a", 1), ("b", 2, 1.5)], TypeError),
        ([("a", 1), (3, 2)], TypeError),
        ([("a", 1), ("b",)], TypeError),
        ([("a", 1), "ab"], TypeError),
        ([("a", 1), ("b", 2, 2**63)], OverflowError),
        ([("a", 1), ("b", lambda: None)], Exception),  # not picklable: the serializer's error
    ]:
        with pytest.raises(error):
            t.publish_many(bad)
        assert len(t) == 1
    assert t.publish_many([]) == []
    assert t.publish_many(iter([("a", 1), ("b", 2, 4)])) == [2, 3]
    assert t.group("b").priority == 4


def test_ack_many_type_checks_first(t: SQLiteTransport) -> None:
    t.publish("a", 1)
    t.publish("b", 2)
    leases = t.claim_many("w", 10, 2)
    with pytest.raises(TypeError):
        t.ack_many([leases[0], "not a lease", leases[1]])
    assert len(t) == 2  # nothing acked
    assert t.ack_many(leases) == []
    assert len(t) == 0


def test_infinite_durations(t: SQLiteTransport, clock: FakeClock) -> None:
    t.publish("a", 1)
    lease = t.claim("w", math.inf)
    assert lease.expires_at == math.inf
    clock.advance(1e12)
    assert t.claim("w", 1) is None
    assert t.stats().leased == 1
    t.nack(lease, math.inf)
    assert t.group("a").expires_at == math.inf
    assert t.resume("a") is True


@pytest.mark.parametrize("seed", range(3))
def test_batches_equal_single_calls_at_random(tmp_path: Any, seed: int) -> None:
    """Random publishes, floors, acks, nacks, parks and clock steps: a twin
    doing everything one call at a time ends up with the same leases and state."""
    import random

    rng = random.Random(seed)
    one, many, c1, c2 = pair(tmp_path)
    held_one: list[Any] = []
    held_many: list[Any] = []
    with one, many:
        for step in range(120):
            items = [(f"g{rng.randrange(25)}", rng.randrange(1000), rng.randrange(-1, 4))
                     for _ in range(rng.randrange(0, 12))]
            assert [one.publish(*item) for item in items] == many.publish_many(items)
            floor = rng.choice([-(2**63), -1, 0, 1, 2, 3, 4])
            k = rng.randrange(0, 9)
            singles = []
            for _ in range(k):
                lease = one.claim("w", 7, floor)
                if lease is None:
                    break
                singles.append(lease)
            batch = many.claim_many("w", 7, k, floor)
            assert [(x.seq, x.group_id, x.event, x.expires_at, x.attempt) for x in batch] == [
                (x.seq, x.group_id, x.event, x.expires_at, x.attempt) for x in singles
            ], step
            held_one += singles
            held_many += batch
            for _ in range(rng.randrange(0, len(held_one) + 1)):
                i = rng.randrange(len(held_one))
                a, b = held_one.pop(i), held_many.pop(i)
                how = rng.choice(["ack", "ack", "nack", "park"])
                if how == "ack":
                    try:
                        one.ack(a)
                        lost = False
                    except LeaseLost:
                        lost = True
                    assert many.ack_many([b]) == ([b] if lost else [])
                else:
                    delay = 0 if how == "nack" else 3
                    outcomes = []
                    for t, lease in ((one, a), (many, b)):
                        try:
                            t.nack(lease, delay)
                            outcomes.append("ok")
                        except LeaseLost:
                            outcomes.append("lost")
                    assert outcomes[0] == outcomes[1]
            dt = rng.choice([0, 0, 1, 4, 8])
            c1.advance(dt)
            c2.advance(dt)
            assert one.stats() == many.stats()
        assert one.groups() == many.groups()
        assert drain(one) == drain(many)


def test_extend_and_nack_apply_no_expiry(t: SQLiteTransport, clock: FakeClock) -> None:
    """As in memory, only claim, stats and the inspections apply expiry: a park
    whose end has passed is still a park that resume() lifts until one of them runs."""
    t.publish("a", 1)
    t.publish("b", 2)
    t.nack(t.claim("w", 10), delay=5)  # a parked until 1005
    other = t.claim("w", 100)
    clock.advance(10)
    t.extend(other, 100)  # reads the clock (1010), applies no expiry
    t.nack(t.extend(other, 100), delay=1)  # nor does a park
    assert t.resume("a") is True
    t.publish("c", 3)
    t.nack(t.claim("w", 10, min_priority=0), delay=5)
    clock.advance(10)
    assert t.stats().parked == 0  # stats applied expiry: both parks ended
    assert t.resume("b") is False
