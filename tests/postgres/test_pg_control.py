"""Part 2 control plane and batches on PostgreSQL (SPEC Part 2), on an
injected manual clock where times matter."""

from __future__ import annotations

import math
import pickle
import threading
import time
from typing import Any

import pytest

from helpers import FakeClock
from leasequeue import GroupInfo, LeaseLost, TransportStats


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def t(make_pg: Any, clock: FakeClock) -> Any:
    return make_pg(clock=clock)


def drain(t: Any) -> list:
    out = []
    while (lease := t.claim("drain", math.inf, -(2**63))) is not None:
        out.append((lease.group_id, lease.event))
        t.ack(lease)
    return out


# ---------------------------------------------------------------- pause / resume


def test_pause_skips_group_and_keeps_it(t: Any) -> None:
    t.publish("a", 1)
    t.publish("b", 2)
    assert t.pause("a") is True
    assert t.pause("a") is False
    assert t.claim("w", 10).group_id == "b"
    assert t.claim("w", 10) is None
    info = t.group("a")
    assert info.state == "paused" and info.paused and info.messages == 1 and info.head_seq == 1
    assert t.stats() == TransportStats(2, 2, 1, 0, 1)
    assert t.resume("a") is True
    assert t.resume("a") is False
    assert t.claim("w", 10).group_id == "a"


def test_pause_a_leased_group(t: Any, clock: FakeClock) -> None:
    t.publish("a", 1)
    t.publish("a", 2)
    lease = t.claim("w", 10)
    assert t.pause("a")
    info = t.group("a")
    assert (info.state, info.paused, info.worker_id, info.attempt) == ("leased", True, "w", 1)
    t.nack(lease)  # nack(0): stays in the paused group
    assert t.claim("w", 10) is None
    t.resume("a")
    again = t.claim("w", 10)
    assert (again.seq, again.attempt) == (1, 2)
    t.pause("a")
    t.ack(again)  # a leased message of a paused group may be acked
    assert t.claim("w", 10) is None
    assert t.group("a").head_seq == 2


def test_expiry_in_a_paused_group_leaves_it_paused(t: Any, clock: FakeClock) -> None:
    t.publish("a", 1)
    t.claim("w", 5)
    t.pause("a")
    clock.advance(6)
    assert t.claim("w", 5) is None
    assert t.group("a").state == "paused"


def test_pause_empty_group_records_it(t: Any) -> None:
    assert t.pause("new") is True
    assert t.group("new") == GroupInfo("new", 0, 0, "paused", True, None, None, None, None, None)
    assert t.stats() == TransportStats(0, 0, 0, 0, 1)
    t.publish("new", "x", 7)  # waits in the paused group, which exists: its priority stays 0
    assert t.claim("w", 10) is None
    assert t.group("new").priority == 0
    assert t.set_priority("new", 7)
    assert t.resume("new")
    assert t.claim("w", 10, 7).event == "x"


def test_emptied_paused_group_is_forgotten_on_resume(t: Any) -> None:
    t.publish("a", 1, 3)
    lease = t.claim("w", 10)
    t.pause("a")
    t.ack(lease)
    assert t.group("a").state == "paused" and t.group("a").messages == 0
    assert t.resume("a") is True
    assert t.group("a") is None
    assert t.groups() == []


def test_resume_ends_a_park_now(t: Any, clock: FakeClock) -> None:
    t.publish("a", 1)
    lease = t.claim("w", 10)
    t.nack(lease, 100)
    info = t.group("a")
    assert (info.state, info.worker_id, info.expires_at) == ("parked", "__parked__", clock.now + 100)
    assert t.resume("a") is True
    again = t.claim("w", 10)
    assert (again.seq, again.attempt) == (1, 2)
    assert t.resume("a") is False  # leased, not paused: nothing to lift
    assert t.resume("nobody") is False


def test_resume_wakes_a_waiting_claim(make_pg: Any) -> None:
    t = make_pg()
    t.publish("a", 1)
    t.pause("a")
    result = []
    th = threading.Thread(target=lambda: result.append(t.claim("w", 10, timeout=10)))
    th.start()
    time.sleep(0.3)
    t.resume("a")
    th.join(30)
    assert result and result[0].event == 1


# ---------------------------------------------------------------- purge / priority


def test_purge_removes_everything_and_forgets(t: Any) -> None:
    for i in range(3):
        t.publish("a", i, 5)
    t.publish("b", "b")
    lease = t.claim("w", 10, 5)
    t.pause("a")
    assert t.purge("a") == 3
    assert t.purge("a") == 0
    with pytest.raises(LeaseLost):
        t.ack(lease)
    assert t.group("a") is None
    assert t.stats() == TransportStats(1, 1, 0, 0, 0)
    t.publish("a", "fresh", 1)  # re-created fresh: new priority, not paused
    assert t.group("a").priority == 1 and not t.group("a").paused


def test_set_priority(t: Any) -> None:
    assert t.set_priority("none", 3) is False
    assert t.group("none") is None
    t.publish("a", 1)
    t.publish("b", 2)
    assert t.claim("w", 10, 1) is None
    assert t.set_priority("b", 5) is True
    assert t.claim("w", 10, 1).group_id == "b"
    assert t.group("b").priority == 5


def test_set_priority_keeps_round_robin_position(t: Any) -> None:
    for g in "abc":
        t.publish(g, 1)
        t.publish(g, 2)
    for _ in range(3):
        t.ack(t.claim("w", 10))  # a, b, c each claimed once: order a, b, c
    t.set_priority("a", 9)
    assert [t.claim("w", 10).group_id for _ in range(3)] == ["a", "b", "c"]


def test_set_priority_wakes_a_floor_waiter(make_pg: Any) -> None:
    t = make_pg()
    t.publish("a", 1, 0)
    result = []
    th = threading.Thread(target=lambda: result.append(t.claim("w", 10, 5, timeout=10)))
    th.start()
    time.sleep(0.3)
    t.set_priority("a", 5)
    th.join(30)
    assert result and result[0].event == 1


def test_group_info_fields(t: Any, clock: FakeClock) -> None:
    t.publish("a", 1, 2)
    t.publish("a", 2)
    assert t.group("a") == GroupInfo("a", 2, 2, "ready", False, 1, None, None, None, None)
    lease = t.claim("w", 10)
    assert t.group("a") == GroupInfo("a", 2, 2, "leased", False, 1, "w", clock.now + 10, 1, clock.now)
    clock.advance(11)
    info = t.group("a")  # expired as of now: ready again, no holder
    assert (info.state, info.worker_id, info.attempt, info.last_claimed_at) == ("ready", None, None, clock.now - 11)
    t.ack(lease)  # expired but nobody claimed since: still current
    assert [g.group_id for g in t.groups()] == ["a"]
    assert t.group("a").head_seq == 2


@pytest.mark.parametrize("call", [
    lambda t: t.pause(1), lambda t: t.resume(None), lambda t: t.purge(b"a"),
    lambda t: t.group(3), lambda t: t.set_priority(2, 1),
])
def test_control_plane_bad_group_id(t: Any, call: Any) -> None:
    with pytest.raises(TypeError):
        call(t)


@pytest.mark.parametrize("priority,err", [(True, TypeError), (1.0, TypeError), (2**63, OverflowError)])
def test_set_priority_bad_priority(t: Any, priority: Any, err: type) -> None:
    t.publish("a", 1)
    with pytest.raises(err):
        t.set_priority("a", priority)
    assert t.group("a").priority == 0


# ---------------------------------------------------------------- batches


def test_publish_many_is_publishing_one_by_one(make_pg: Any, clock: FakeClock) -> None:
    one, many = make_pg(clock=clock), make_pg(clock=clock)
    items = [("z", {"n": 1}), ("b", [2], 3), ("z", "three"), ("c", 4, -1), ("a", 5)]
    seqs = [one.publish(*item) for item in items]
    assert many.publish_many(items) == seqs == [1, 2, 3, 4, 5]
    assert [g.group_id for g in many.groups()] == ["z", "b", "c", "a"]  # creation order
    assert one.groups() == many.groups()
    assert drain(one) == drain(many)


UNPICKLABLE = (AttributeError, TypeError, pickle.PicklingError)


def test_publish_many_validates_everything_first(t: Any) -> None:
    t.publish("a", 0)
    for bad, err in [([("a", 1), (2, 2)], TypeError), ([("a", 1), ("b", 2, True)], TypeError),
                     ([("a", 1), ("b", 2, 2**64)], OverflowError), ([("a", 1), ["b", 2]], TypeError),
                     ([("a", 1), ("b",)], ValueError), ([("a", 1), ("b", 1, 2, 3)], ValueError),
                     (5, TypeError), ([("a", 1), ("b", lambda: 0)], UNPICKLABLE)]:
        with pytest.raises(err):
            t.publish_many(bad)
    assert len(t) == 1
    assert t.publish_many([]) == []
    assert t.publish_many(iter([("x", 1)])) == [2]


def test_claim_many_is_successive_claims(make_pg: Any) -> None:
    c1, c2 = FakeClock(), FakeClock()
    one, many = make_pg(clock=c1), make_pg(clock=c2)
    for t in (one, many):
        for i in range(10):
            t.publish(f"g{i % 4}", i, i % 3)
    singles = []
    while (lease := one.claim("w", 10, 1)) is not None and len(singles) < 3:
        singles.append(lease)
    batch = many.claim_many("w", 10, 3, 1)
    assert batch == singles
    rest_one = []
    while (lease := one.claim("w", 10, 1)) is not None:
        rest_one.append(lease)
    assert many.claim_many("w", 10, 100, 1) == rest_one
    assert many.claim_many("w", 10, 0) == []


@pytest.mark.parametrize("count,err", [(-1, ValueError), (1.0, TypeError), (True, TypeError), ("2", TypeError)])
def test_claim_many_bad_count(t: Any, count: Any, err: type) -> None:
    t.publish("a", 1)
    with pytest.raises(err):
        t.claim_many("w", 10, count)
    assert t.stats().leased == 0


def test_ack_many(t: Any) -> None:
    for g in "abcd":
        t.publish(g, g)
    leases = t.claim_many("w", 10, 4)
    t.ack(leases[1])
    with pytest.raises(TypeError):
        t.ack_many([leases[0], "not a lease"])
    assert len(t) == 3  # nothing acked by the refused batch
    lost = t.ack_many([leases[0], leases[1], leases[2], leases[1]])
    assert lost == [leases[1], leases[1]]
    assert len(t) == 1
    assert t.ack_many([]) == []


def test_publish_many_into_paused_and_new_groups(make_pg: Any, clock: FakeClock) -> None:
    one, many = make_pg(clock=clock), make_pg(clock=clock)
    items = [("p", "first", 4), ("n", "x", 2), ("p", "second", 9), ("n", "y", 7)]
    for t in (one, many):
        t.pause("p")
    for item in items:
        one.publish(*item)
    assert many.publish_many(items) == [1, 2, 3, 4]
    assert one.groups() == many.groups()
    assert many.group("p").priority == 0 and many.group("n").priority == 2
    assert [g.group_id for g in many.groups()] == ["p", "n"]  # creation order
    for t in (one, many):
        t.resume("p")
    assert drain(one) == drain(many)


def test_claim_many_has_no_upper_bound(t: Any) -> None:
    for g in "abc":
        t.publish(g, g)
    assert [x.group_id for x in t.claim_many("w", 10, 2**70)] == ["a", "b", "c"]


def test_groups_in_creation_order(t: Any) -> None:
    for g in ["z", "b", "y"]:
        t.publish(g, 1)
    t.pause("a")
    lease = t.claim("w", 10)
    t.ack(lease)  # "z" is forgotten, and re-created at the end
    t.publish("z", 2)
    assert [g.group_id for g in t.groups()] == ["b", "y", "a", "z"]


def test_publish_many_reads_tuple_subclasses_as_tuples(t: Any) -> None:
    class Odd(tuple):
        def __len__(self) -> int:
            raise AssertionError("not called")

        def __getitem__(self, i: Any) -> Any:
            raise AssertionError("not called")

    assert t.publish_many([Odd(("g", "e"))]) == [1]
    assert t.claim("w", 10).event == "e"


def test_ack_many_forgets_emptied_groups(t: Any) -> None:
    t.publish("a", 1)
    t.publish("b", 2)
    t.publish("b", 3)
    leases = t.claim_many("w", 10, 2)
    assert t.ack_many(leases) == []
    assert [g.group_id for g in t.groups()] == ["b"]  # "a" emptied: forgotten
    for lease in leases:
        with pytest.raises(LeaseLost):
            t.ack(lease)
    assert t.ack_many(leases) == leases
