"""SPEC Part 5, "Later": delayed publish, on both in-memory twins.

``docs/decisions.md`` ("Part 5 ... pinned", "Later") is the law: a message
published with ``delay > 0`` is scheduled while ``due >= now`` (the strict
test of a park's end), only a group's head holds its group, a scheduled
head keeps its group's round-robin key, ``stats().scheduled`` counts every
scheduled message wherever it stands, ``GroupInfo`` reports ``"scheduled"``
(below ``"paused"``) with ``due_at``, and becoming due wakes a waiting claim
through the expiry timer, with no other operation.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any, Callable, List

import pytest

from leasequeue import LeaseLost
from leasequeue.testing import ManualClock


def drain(t: Any, worker: str = "w") -> List[int]:
    """Claim and ack until nothing is claimable now: the seqs, in order."""
    seqs = []
    while (lease := t.claim(worker, 30)) is not None:
        seqs.append(lease.seq)
        t.ack(lease)
    return seqs


# -- the strict due test --------------------------------------------------------


def test_a_scheduled_message_is_claimable_only_once_now_is_past_its_due(transport: Any, clock: ManualClock) -> None:
    seq = transport.publish("g", "later", delay=5)
    assert transport.claim("w", 30) is None
    clock.advance(5)  # now == due: still scheduled
    assert transport.claim("w", 30) is None
    assert transport.stats().scheduled == 1
    clock.advance(0.001)
    lease = transport.claim("w", 30)
    assert lease is not None and (lease.seq, lease.event, lease.attempt) == (seq, "later", 1)
    assert transport.stats().scheduled == 0


def test_delay_zero_is_the_plain_publish_and_reads_no_clock(transport: Any, clock: ManualClock) -> None:
    reads = clock.reads
    assert transport.publish("g", "a", delay=0) == 1
    assert transport.publish("g", "b", delay=0.0) == 2
    assert transport.publish_many([("g", "c")], delay=0) == [3]
    assert clock.reads == reads
    assert transport.stats().scheduled == 0
    assert [m.due_at for m in transport.peek("g", 3)] == [None, None, None]


def test_a_delayed_publish_reads_the_clock_once(transport: Any, clock: ManualClock) -> None:
    reads = clock.reads
    transport.publish("g", "a", delay=1)
    assert clock.reads == reads + 1
    transport.publish_many([("g", "b"), ("h", "c")], delay=1)
    assert clock.reads == reads + 2
    assert transport.publish_many([], delay=1) == []  # an empty batch reads nothing
    assert clock.reads == reads + 2


def test_an_infinite_delay_is_never_due(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "never", delay=math.inf)
    clock.advance(1e12)
    assert transport.claim("w", 30) is None
    assert transport.stats().scheduled == 1
    info = transport.group("g")
    assert info.state == "scheduled" and info.due_at == math.inf
    assert transport.skip("g") is True  # a scheduled head can be skipped
    assert len(transport) == 0 and transport.stats().scheduled == 0


def test_due_is_the_sum_of_the_transport_time_and_the_delay(transport: Any, clock: ManualClock) -> None:
    clock.set(1000.0)
    transport.publish("g", "a", delay=2.5)
    assert transport.peek("g")[0].due_at == 1002.5
    clock.set(990.0)  # the clock turned back: the transport's time does not
    transport.publish("g", "b", delay=1)
    assert transport.peek("g", 2)[1].due_at == 1001.0


# -- FIFO: only the head holds its group ----------------------------------------------


def test_a_scheduled_head_holds_its_group_and_its_later_messages(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "later", delay=10)
    transport.publish("g", "after")
    transport.publish("h", "other")
    assert drain(transport) == [3]  # h goes on; g waits behind its head
    clock.advance(10.5)
    assert drain(transport) == [1, 2]


def test_a_scheduled_message_behind_the_head_delays_nothing_before_it(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "first")
    transport.publish("g", "later", delay=10)
    transport.publish("g", "last")
    assert transport.stats().scheduled == 1
    lease = transport.claim("w", 30)
    assert lease.seq == 1
    transport.ack(lease)  # exposes the scheduled message: it holds the group now
    info = transport.group("g")
    assert (info.state, info.head_seq, info.due_at) == ("scheduled", 2, clock() + 10)
    assert (info.worker_id, info.expires_at, info.attempt) == (None, None, None)
    assert transport.claim("w", 30) is None
    clock.advance(11)
    assert drain(transport) == [2, 3]


def test_a_head_exposed_after_its_due_is_claimable_at_once(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "first")
    transport.publish("g", "later", delay=1)
    lease = transport.claim("w", 30)
    clock.advance(5)  # the second is due long before it becomes the head
    assert transport.stats().scheduled == 0
    transport.ack(lease)
    assert transport.group("g").state == "ready"
    assert drain(transport) == [2]


def test_ack_many_ack_and_claim_and_skip_expose_a_scheduled_head(transport: Any, clock: ManualClock) -> None:
    for group in ("a", "b", "c"):
        transport.publish(group, "first")
        transport.publish(group, "later", delay=5)
    la, lb = transport.claim("w", 30), transport.claim("w", 30)
    assert transport.ack_many([la]) == []
    assert transport.ack_and_claim(lb, "w", 30).group_id == "c"  # b's next is scheduled: c's head goes
    assert transport.skip("c") is False  # leased
    assert [transport.group(g).state for g in "abc"] == ["scheduled", "scheduled", "leased"]
    clock.advance(6)
    assert sorted(drain(transport)) == [2, 4]


def test_skip_of_a_head_exposes_a_scheduled_message(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "first")
    transport.publish("g", "later", delay=5)
    assert transport.skip("g") is True
    assert transport.group("g").state == "scheduled"
    assert transport.claim("w", 30) is None
    clock.advance(6)
    assert drain(transport) == [2]


# -- round-robin --------------------------------------------------------------------


def test_a_group_created_by_a_scheduled_publish_is_placed_by_its_oldest_message(
    transport: Any, clock: ManualClock
) -> None:
    transport.publish("early", "e", delay=5)  # seq 1: never claimed, oldest
    transport.publish("young", "y")  # seq 2
    clock.advance(6)
    assert drain(transport) == [1, 2]  # due: it goes before the younger never-claimed group


def test_a_claimed_group_keeps_its_key_while_its_head_is_scheduled(transport: Any, clock: ManualClock) -> None:
    transport.publish("a", "a1")
    transport.publish("a", "a2", delay=5)
    transport.publish("b", "b1")
    transport.publish("b", "b2")
    lease = transport.claim("w", 30)  # a, first claim
    transport.ack(lease)
    lease = transport.claim("w", 30)  # b, second claim
    transport.ack(lease)
    clock.advance(6)
    # a was claimed longer ago than b: its due head goes first
    assert [transport.claim("w", 30).seq for _ in range(2)] == [2, 4]
    assert transport.group("a").last_claimed_at == clock()


def test_a_priority_floor_does_not_admit_a_scheduled_head(transport: Any, clock: ManualClock) -> None:
    transport.publish("hi", "x", priority=5, delay=5)
    assert transport.claim("w", 30, min_priority=-100) is None
    assert transport.set_priority("hi", 9) is True
    assert transport.group("hi").state == "scheduled"
    clock.advance(6)
    lease = transport.claim("w", 30, min_priority=9)
    assert lease is not None and lease.seq == 1


# -- stats, group, groups, peek ---------------------------------------------------------


def test_stats_counts_every_scheduled_message_wherever_it_stands(transport: Any, clock: ManualClock) -> None:
    transport.publish("p", "parked")
    transport.publish("g", "a", delay=10)
    transport.publish("g", "b", delay=2)  # not the head, due earlier
    transport.publish("g", "c")
    transport.publish("h", "d", delay=5)
    held = transport.claim("w", 30)
    transport.nack(held, 100)  # a park: not scheduled
    stats = transport.stats()
    assert (stats.messages, stats.scheduled, stats.parked, stats.leased) == (5, 3, 1, 0)
    assert len(transport) == 5
    clock.advance(3)
    assert transport.stats().scheduled == 2  # b is due, though it waits behind a
    clock.advance(3)
    assert transport.stats().scheduled == 1  # d is due
    clock.advance(5)
    assert transport.stats().scheduled == 0
    assert sorted(drain(transport)) == [2, 3, 4, 5]
    assert transport.purge("p") == 1
    assert tuple(transport.stats()) == (0, 0, 0, 0, 0, 0, 0)


def test_group_states_and_due_at(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "a", delay=10)
    due = clock() + 10
    info = transport.group("g")
    assert (info.state, info.paused, info.due_at, info.attempt) == ("scheduled", False, due, None)
    assert transport.pause("g") is True
    info = transport.group("g")
    assert (info.state, info.paused, info.due_at) == ("paused", True, due)  # paused, due_at still reported
    assert transport.resume("g") is True
    assert transport.resume("g") is False  # a head that is only scheduled: nothing to lift
    info = transport.group("g")
    assert (info.state, info.due_at) == ("scheduled", due)
    assert [i.state for i in transport.groups()] == ["scheduled"]
    clock.advance(10.5)
    info = transport.group("g")
    assert (info.state, info.due_at) == ("ready", None)


def test_a_paused_group_whose_head_becomes_due_stays_paused(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "a", delay=1)
    transport.pause("g")
    clock.advance(2)
    assert transport.claim("w", 30) is None
    info = transport.group("g")
    assert (info.state, info.due_at) == ("paused", None)
    assert transport.resume("g") is True
    assert drain(transport) == [1]


def test_peek_shows_due_at_and_key_for_good(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "a", delay=1, key="k1")
    transport.publish("g", "b", key="k2")
    transport.publish("g", "c", delay=3)
    transport.publish("g", "d")
    start = clock()
    assert [(m.seq, m.due_at, m.key) for m in transport.peek("g", 10)] == [
        (1, start + 1, "k1"), (2, None, "k2"), (3, start + 3, None), (4, None, None)]
    clock.advance(2)
    lease = transport.claim("w", 30)
    transport.nack(lease)
    head = transport.peek("g")[0]
    assert (head.seq, head.attempt, head.due_at, head.key) == (1, 1, start + 1, "k1")  # after its due and a delivery


# -- the control plane and the quarantine ------------------------------------------------


def test_purge_removes_scheduled_messages(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "a", delay=10)
    transport.publish("g", "b", delay=10)
    assert transport.purge("g") == 2
    assert tuple(transport.stats()) == (0, 0, 0, 0, 0, 0, 0)
    clock.advance(20)
    assert transport.claim("w", 30) is None
    assert transport.group("g") is None


def test_publishing_into_an_empty_paused_group_with_a_delay(transport: Any, clock: ManualClock) -> None:
    assert transport.pause("g") is True
    transport.publish("g", "a", delay=2)
    assert transport.group("g").state == "paused"
    assert transport.resume("g") is True
    assert transport.group("g").state == "scheduled"
    clock.advance(3)
    assert drain(transport) == [1]


def test_retry_leaves_a_schedule_alone(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "a", delay=5)
    assert transport.retry("g") is True
    assert transport.group("g").state == "scheduled"
    assert transport.claim("w", 30) is None
    clock.advance(6)
    assert transport.claim("w", 30).attempt == 1


def test_a_nack_park_of_an_exposed_message_is_a_park(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "a", delay=1)
    clock.advance(2)
    lease = transport.claim("w", 30)
    transport.nack(lease, 5)
    stats = transport.stats()
    assert (stats.parked, stats.scheduled) == (1, 0)
    assert transport.group("g").state == "parked"


# -- batches ---------------------------------------------------------------------------


def test_publish_many_with_a_delay_schedules_every_item(transport: Any, clock: ManualClock) -> None:
    transport.publish("a", "before")
    seqs = transport.publish_many([("a", 1), ("b", 2, 3), ("b", 3)], delay=4)
    assert seqs == [2, 3, 4]
    assert transport.stats().scheduled == 3
    assert drain(transport) == [1]
    assert transport.group("b").priority == 3
    clock.advance(5)
    assert sorted(drain(transport)) == [2, 3, 4]


# -- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize("delay, error", [
    (True, TypeError), ("1", TypeError), (None, TypeError), (-1, ValueError), (math.nan, ValueError),
    (-math.inf, ValueError),
])
def test_a_bad_delay_changes_nothing(transport: Any, clock: ManualClock, delay: Any, error: type) -> None:
    transport.publish("g", "a")
    reads = clock.reads
    with pytest.raises(error):
        transport.publish("g", "b", delay=delay)
    with pytest.raises(error):
        transport.publish_many([("g", "b")], delay=delay)
    assert clock.reads == reads  # checked before the clock is read
    assert transport.publish("g", "c") == 2  # no seq used up
    assert len(transport) == 2 and transport.stats().scheduled == 0


def test_arguments_are_checked_in_order(transport: Any) -> None:
    with pytest.raises(TypeError, match="group_id"):
        transport.publish(1, "e", "x", delay=-1, key=2)
    with pytest.raises(TypeError, match="priority"):
        transport.publish("g", "e", "x", delay=-1, key=2)
    with pytest.raises(ValueError, match="delay"):
        transport.publish("g", "e", 0, delay=-1, key=2)
    with pytest.raises(TypeError, match="key"):
        transport.publish("g", "e", 0, delay=1, key=2)
    assert len(transport) == 0


def test_a_failing_clock_changes_nothing(make_transport: Callable[..., Any]) -> None:
    state = {"fail": False}

    def clock() -> float:
        if state["fail"]:
            raise RuntimeError("clock broke")
        return 1000.0

    t = make_transport(clock=clock, dedup_window=1.0)
    t.publish("g", "a", key="k")
    state["fail"] = True
    for call in (lambda: t.publish("g", "b", delay=1), lambda: t.publish("h", "c", key="k"),
                 lambda: t.publish_many([("g", "d")], delay=1), lambda: t.publish_many([("h", "e", 0, "x")])):
        with pytest.raises(RuntimeError):
            call()
    state["fail"] = False
    assert t.publish("g", "f") == 2
    assert len(t) == 2 and t.stats().scheduled == 0 and t.groups()[0].group_id == "g" and len(t.groups()) == 1


# -- waking a waiting claim ---------------------------------------------------------------


def test_a_waiting_thread_is_woken_when_a_scheduled_message_becomes_due(make_transport: Callable[..., Any]) -> None:
    """Real clock: nothing but the expiry timer wakes the claim."""
    t = make_transport(clock=time.time)
    got: List[Any] = []
    waiter = threading.Thread(target=lambda: got.append(t.claim("w", 30, timeout=10)))
    waiter.start()
    deadline = time.monotonic() + 5
    while t._waiting_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    start = time.monotonic()
    t.publish("g", "later", delay=0.2)  # wakes nobody by itself
    waiter.join(10)
    waited = time.monotonic() - start
    assert got and got[0] is not None and got[0].event == "later"
    assert 0.19 <= waited < 5
    t.close()


def test_a_waiting_aclaim_is_woken_when_a_scheduled_message_becomes_due(make_transport: Callable[..., Any]) -> None:
    t = make_transport(clock=time.time)

    async def main() -> Any:
        task = asyncio.ensure_future(t.aclaim("w", 30, timeout=10))
        while t._waiting_count() == 0:
            await asyncio.sleep(0.001)
        t.publish("g", "first", delay=0.15)
        t.publish("g", "second")  # behind the scheduled head: not claimable
        return await task

    start = time.monotonic()
    lease = asyncio.run(main())
    assert lease is not None and lease.event == "first"
    assert time.monotonic() - start >= 0.14
    t.close()


def test_an_exposed_scheduled_head_wakes_a_waiting_claim_when_due(make_transport: Callable[..., Any]) -> None:
    t = make_transport(clock=time.time)
    t.publish("g", "first")
    t.publish("g", "later", delay=0.2)
    lease = t.claim("w", 30)
    got: List[Any] = []
    waiter = threading.Thread(target=lambda: got.append(t.claim("w2", 30, timeout=10)))
    waiter.start()
    deadline = time.monotonic() + 5
    while t._waiting_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    t.ack(lease)  # the scheduled head is exposed: the timer must watch its due
    waiter.join(10)
    assert got and got[0] is not None and got[0].event == "later"
    t.close()


def test_a_delayed_publish_wakes_nobody_and_a_manual_clock_serves_on_the_next_clock_read(
    make_transport: Callable[..., Any],
) -> None:
    clock = ManualClock()
    t = make_transport(clock=clock)
    got: List[Any] = []
    waiter = threading.Thread(target=lambda: got.append(t.claim("w", 30, timeout=10)))
    waiter.start()
    deadline = time.monotonic() + 5
    while t._waiting_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    hands = t._wake_counts()[0]
    t.publish("g", "later", delay=5)
    assert t._wake_counts()[0] == hands and t._waiting_count() == 1
    clock.advance(6)
    t.stats()  # an operation that reads the clock frees it and serves the waiter
    waiter.join(10)
    assert got and got[0] is not None and got[0].event == "later"
    t.close()


def test_old_leases_of_a_group_stay_lost_after_its_scheduled_head_is_served(
    transport: Any, clock: ManualClock
) -> None:
    transport.publish("g", "first")
    transport.publish("g", "later", delay=1)
    first = transport.claim("w", 30)
    transport.ack(first)
    clock.advance(2)
    second = transport.claim("w", 30)
    with pytest.raises(LeaseLost):
        transport.ack(first)
    transport.ack(second)
