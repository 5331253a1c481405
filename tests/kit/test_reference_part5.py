"""The referee's Part 5 (SPEC Part 5, "Later", "Once", "Honest attempts"),
pinned by small hand-written scenarios against the SPEC and the "Part 5 ...
pinned" section of docs/decisions.md.  Every expected value here is worked
out from those texts, not read off the code.

``ReferenceTransport`` is the oracle of the differential tests, which then
hold every transport to it.
"""

from __future__ import annotations

import math
from typing import Any, List

import pytest

from helpers import INT64_MIN
from leasequeue import GroupInfo, LeaseLost, Message, TransportStats
from leasequeue.testing import ManualClock, ReferenceTransport
from leasequeue.testing._reference import ReferenceLease


class Broke(Exception):
    """Raised by the clock when a call must not read it."""


class Name(str):
    pass


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()  # starts at 1000.0


@pytest.fixture
def t(clock: ManualClock) -> ReferenceTransport:
    return ReferenceTransport(clock)


def claimed_groups(t: ReferenceTransport) -> List[str]:
    out = []
    while (lease := t.claim("w", math.inf, INT64_MIN)) is not None:
        out.append(lease.group_id)
    return out


def snapshot(t: ReferenceTransport) -> Any:
    return t.stats(), t.groups(), [t.peek(g.group_id, 100) for g in t.groups()]


# -- Later ------------------------------------------------------------------------


def test_a_delayed_message_is_scheduled_until_now_passes_its_due(t: ReferenceTransport, clock: ManualClock) -> None:
    assert t.publish("g", "e", delay=10) == 1
    assert t.stats() == TransportStats(1, 1, 0, 0, 0, 0, 1)
    assert t.group("g") == GroupInfo("g", 0, 1, "scheduled", False, 1, None, None, None, None, None, 1010.0)
    assert t.claim("w", 5) is None
    clock.set(1010.0)  # due == now: still scheduled (the strict test of an expiry)
    assert t.claim("w", 5) is None
    assert t.stats().scheduled == 1
    clock.set(1010.5)
    assert t.group("g").state == "ready" and t.group("g").due_at is None
    assert t.stats().scheduled == 0
    lease = t.claim("w", 5)
    assert (lease.seq, lease.attempt, lease.expires_at) == (1, 1, 1015.5)
    assert t.peek("g") == [Message(1, "e", 1, 1010.0, None)]  # due_at stays after it became due


def test_a_scheduled_head_holds_its_group_and_earlier_messages_are_not_delayed(
        t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("g", "a")
    t.publish("g", "b", delay=5)
    t.publish("g", "c")
    first = t.claim("w", 100)
    assert first.event == "a"
    t.ack(first)
    assert t.group("g").state == "scheduled" and t.group("g").due_at == 1005.0
    assert t.claim("w", 100) is None  # "c" waits behind "b"
    clock.advance(6)
    assert [t.claim("w", 100).event for _ in range(1)] == ["b"]


def test_an_infinite_delay_is_never_due(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("g", "e", delay=math.inf)
    clock.advance(1e12)
    assert t.claim("w", 1) is None
    assert t.stats().scheduled == 1
    assert t.group("g").due_at == math.inf
    assert t.skip("g") is True  # a scheduled head can be skipped
    assert t.stats() == TransportStats(0, 0, 0, 0, 0, 0, 0)


def test_a_group_created_scheduled_keeps_its_never_claimed_place(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("old", "x")
    t.claim("w", math.inf)  # "old" is now a claimed group
    t.publish("old", "y")
    t.publish("s", "s1", delay=1)  # seq 3: never claimed, scheduled
    t.publish("n", "n1")  # seq 4: never claimed, younger
    clock.advance(2)
    # "old" still has its first message leased; after that: s (seq 3) before n (seq 4)
    assert claimed_groups(t) == ["s", "n"]


def test_a_paused_group_with_a_scheduled_head_reports_paused_and_its_due(
        t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("g", "e", delay=3)
    assert t.pause("g") is True
    info = t.group("g")
    assert (info.state, info.paused, info.due_at) == ("paused", True, 1003.0)
    assert t.resume("g") is True  # the pause
    assert t.resume("g") is False  # a schedule is not lifted
    assert t.group("g").state == "scheduled"


def test_publish_reads_the_clock_only_when_it_must(clock: ManualClock) -> None:
    t = ReferenceTransport(clock)
    w = ReferenceTransport(clock, dedup_window=5)
    with clock.misbehave(Broke("read")):
        assert t.publish("g", 1) == 1
        assert t.publish("g", 2, delay=0) == 2
        assert t.publish("g", 3, key="k") == 3  # window 0: no reading
        assert w.publish("g", 4) == 1
        assert t.publish_many([], delay=5) == []
        assert w.publish_many([("g", 5, 0, None)]) == [2]
        with pytest.raises(Broke):
            t.publish("g", 6, delay=1)
        with pytest.raises(Broke):
            w.publish("g", 7, key="k")
        with pytest.raises(Broke):
            w.publish_many([("g", 8), ("h", 9, 0, "k")])
        with pytest.raises(Broke):
            t.publish_many([("g", 8)], delay=0.5)
    assert len(t) == 3 and len(w) == 2  # the failed calls changed nothing
    assert t.publish("z", 0) == 4 and w.publish("z", 0) == 3


@pytest.mark.parametrize("args, kwargs, error", [
    ((7, "e"), {"delay": -1}, TypeError),  # group_id first
    (("g", "e", 1.5), {"delay": -1}, TypeError),  # then priority
    (("g", "e", 2**63), {"delay": -1}, OverflowError),
    (("g", "e"), {"delay": -1, "key": 1}, ValueError),  # then delay
    (("g", "e"), {"delay": math.nan}, ValueError),
    (("g", "e"), {"delay": -(10**400)}, ValueError),
    (("g", "e"), {"delay": True}, TypeError),
    (("g", "e"), {"delay": "1"}, TypeError),
    (("g", "e"), {"delay": None}, TypeError),
    (("g", "e"), {"key": 1}, TypeError),  # then key
    (("g", "e"), {"key": b"k"}, TypeError),
    (("g", "e"), {"delay": 5, "key": ["k"]}, TypeError),
])
def test_publish_checks_its_arguments_in_order_and_changes_nothing(
        t: ReferenceTransport, clock: ManualClock, args: Any, kwargs: Any, error: type) -> None:
    t.publish("g", "first")
    before = snapshot(t)
    with clock.misbehave(Broke("no reading before validation")), pytest.raises(error):
        t.publish(*args, **kwargs)
    assert snapshot(t) == before
    assert t.publish("z", 0) == 2


def test_an_int_delay_beyond_float_range_is_infinite(t: ReferenceTransport) -> None:
    t.publish("g", "e", delay=10**400)
    assert t.peek("g") == [Message(1, "e", 0, math.inf, None)]


# -- Once ---------------------------------------------------------------------------


def test_a_held_key_publishes_nothing_and_returns_the_holder(t: ReferenceTransport) -> None:
    assert t.publish("g", "a", key="k") == 1
    assert t.publish("g", "b", 5, delay=100, key="k") == 1  # priority and delay ignored
    assert t.publish("h", "c", key="k") == 2  # another group: another key
    assert t.publish("x", "d", key="k") == 3
    assert t.publish("x", "e", key=Name("k")) == 3  # a str subclass is the same key
    assert t.publish("y", "f", key="") == 4  # the empty string is a key
    assert t.publish("y", "f2", key="") == 4
    assert len(t) == 4 and t.stats().scheduled == 0
    assert t.group("g").priority == 0
    assert t.publish("z", "g") == 5  # no seq was used up by the duplicates
    assert type(t.peek("x")[0].key) is str


def test_a_duplicate_creates_no_group(t: ReferenceTransport) -> None:
    t.publish("g", "a", key="k")
    lease = t.claim("w", 10)
    assert t.publish("g", "b", key="k") == 1  # held while its message is held, leased too
    t.ack(lease)
    assert t.group("g") is None
    assert t.publish("g", "c", key="k") == 2  # window 0: free once the message left


def test_with_a_window_a_key_outlives_its_message(clock: ManualClock) -> None:
    t = ReferenceTransport(clock, dedup_window=10)
    assert t.publish("g", "a", key="k") == 1  # published_at 1000
    clock.advance(3)
    t.ack(t.claim("w", 100))
    assert t.group("g") is None  # forgotten; the key is still held
    assert t.publish("g", "b", key="k") == 1
    assert t.group("g") is None  # and the duplicate created no group
    clock.set(1009.5)
    assert t.publish("g", "c", key="k") == 1
    clock.set(1010.0)  # now >= published_at + window: released
    assert t.publish("g", "d", key="k") == 2
    assert t.publish("g", "e", key="k") == 2  # held by the new message


def test_a_window_holds_a_message_that_is_still_held_past_it(clock: ManualClock) -> None:
    t = ReferenceTransport(clock, dedup_window=1)
    t.publish("g", "a", key="k")
    clock.advance(100)
    assert t.publish("g", "b", key="k") == 1  # (a) does not hold: the message is there


@pytest.mark.parametrize("remove", ["skip", "purge"])
def test_skip_and_purge_let_a_key_go(clock: ManualClock, remove: str) -> None:
    t = ReferenceTransport(clock)
    t.publish("g", "a", key="k")
    getattr(t, remove)("g")
    assert t.publish("g", "b", key="k") == 2
    w = ReferenceTransport(clock, dedup_window=math.inf)
    w.publish("g", "a", key="k")
    getattr(w, remove)("g")
    clock.advance(1e9)
    assert w.publish("g", "b", key="k") == 1  # held for the transport's life


def test_publish_many_keys_and_delay(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("g", "old", key="a")
    seqs = t.publish_many([("g", 1, 0, "a"), ("g", 2, 0, "b"), ("h", 3, 0, "b"), ("g", 4, 7, "b"),
                           ("g", 5), ("g", 6, 0, None)], delay=2)
    assert seqs == [1, 2, 3, 2, 4, 5]
    assert t.peek("g", 10) == [Message(1, "old", 0, None, "a"), Message(2, 2, 0, 1002.0, "b"),
                               Message(4, 5, 0, 1002.0, None), Message(5, 6, 0, 1002.0, None)]
    assert t.stats().scheduled == 4


@pytest.mark.parametrize("items, kwargs, error", [
    ([("g", 1, 0, 1)], {}, TypeError),
    ([("g", 1, 0, "k", None)], {}, ValueError),
    ([("g", 1, 0, "k"), (7, 2)], {"delay": -1}, TypeError),  # every item before delay
    ([("g", 1, 0, "k")], {"delay": -1}, ValueError),
    ([("g", 1)], {"delay": True}, TypeError),
    ([], {"delay": math.nan}, ValueError),
])
def test_publish_many_checks_items_then_delay(t: ReferenceTransport, clock: ManualClock, items: Any,
                                             kwargs: Any, error: type) -> None:
    before = snapshot(t)
    with clock.misbehave(Broke("no reading")), pytest.raises(error):
        t.publish_many(items, **kwargs)
    assert snapshot(t) == before


@pytest.mark.parametrize("window, error", [("1", TypeError), (True, TypeError), (None, TypeError),
                                           (-1, ValueError), (math.nan, ValueError), (-math.inf, ValueError)])
def test_the_window_is_checked_like_a_delay(window: Any, error: type) -> None:
    with pytest.raises(error):
        ReferenceTransport(ManualClock(), dedup_window=window)
    with pytest.raises(TypeError):  # the clock first
        ReferenceTransport(5, dedup_window=window)  # type: ignore[arg-type]


def test_an_infinite_or_int_window_is_accepted() -> None:
    ReferenceTransport(ManualClock(), dedup_window=math.inf)
    ReferenceTransport(ManualClock(), dedup_window=3)


# -- Honest attempts ------------------------------------------------------------------


def test_release_hands_the_attempt_back_and_fences_the_old_delivery(t: ReferenceTransport) -> None:
    t.publish("g", "e")
    first = t.claim("w", 10)
    assert first.attempt == 1
    assert t.release(first) is None
    assert t.peek("g") == [Message(1, "e", 0, None, None)]
    second = t.claim("w", 10)
    assert second.attempt == 1  # the same attempt as the released one ...
    with pytest.raises(LeaseLost):  # ... and still not current: no ABA
        t.ack(first)
    with pytest.raises(LeaseLost):
        t.release(first)
    assert t.peek("g") == [Message(1, "e", 1, None, None)]
    t.ack(second)
    assert len(t) == 0


def test_release_with_a_delay_parks_with_the_handed_back_count(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("g", "e")
    t.publish("h", "f")
    t.nack(t.claim("w", 10))  # g: attempt count 1, round-robin key 1
    lease = t.claim("w", 10)  # h (never claimed) first
    assert lease.group_id == "h"
    lease = t.claim("w", 10)
    assert (lease.group_id, lease.attempt) == ("g", 2)
    t.release(lease, 5)
    info = t.group("g")
    assert (info.state, info.worker_id, info.expires_at, info.attempt) == ("parked", "__parked__", 1005.0, 1)
    assert t.stats().parked == 1
    clock.advance(6)
    assert t.claim("w", 10).attempt == 2


@pytest.mark.parametrize("delay, error", [(-1, ValueError), (math.nan, ValueError), (True, TypeError),
                                          ("1", TypeError)])
def test_release_checks_like_nack(t: ReferenceTransport, clock: ManualClock, delay: Any, error: type) -> None:
    t.publish("g", "e")
    lease = t.claim("w", 10)
    before = snapshot(t)
    with clock.misbehave(Broke("no reading")), pytest.raises(error):
        t.release(lease, delay)
    with pytest.raises(TypeError):
        t.release("lease", -1)
    assert snapshot(t) == before
    with clock.misbehave(Broke("a delay reads the clock before the currency")), pytest.raises(Broke):
        t.release(lease, 1)
    t.release(lease, 0)
    with clock.misbehave(Broke("then: LeaseLost after the reading")), pytest.raises(Broke):
        t.release(lease, 1)
    with pytest.raises(LeaseLost):
        t.release(lease, 1)


def test_a_hand_built_lease_is_never_current_unless_rebuilt_leases_are_accepted(clock: ManualClock) -> None:
    for accepts in (False, True):
        t = ReferenceTransport(clock, accepts_rebuilt_leases=accepts)
        t.publish("g", "e")
        issued = t.claim("w", 10)
        t.release(issued)
        again = t.claim("w", 10)
        rebuilt = ReferenceLease(1, "g", None, "w", 0.0, 1)
        with pytest.raises(LeaseLost):
            t.ack(issued)  # an issued lease knows its delivery
        if accepts:  # the stated price: the same worker and attempt name the new delivery
            t.ack(rebuilt)
            assert len(t) == 0
        else:
            with pytest.raises(LeaseLost):
                t.ack(rebuilt)
            t.ack(again)


def test_retry_false_for_unknown_empty_and_live(t: ReferenceTransport, clock: ManualClock) -> None:
    assert t.retry("nope") is False
    assert t.group("nope") is None
    t.pause("p")
    assert t.retry("p") is False
    t.publish("g", "e")
    lease = t.claim("w", 10)
    assert t.retry("g") is False
    clock.set(1010.0)  # expires_at == now: still live
    assert t.retry("g") is False
    t.ack(lease)
    with pytest.raises(TypeError):
        t.retry(5)  # type: ignore[arg-type]
    with clock.misbehave(Broke("retry always reads the clock")), pytest.raises(Broke):
        t.retry("nope")


def test_retry_of_an_expired_lease_closes_its_delivery(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("g", "e")
    lease = t.claim("w", 10)
    t.claim("w", 10)
    clock.advance(11)
    assert t.retry("g") is True
    with pytest.raises(LeaseLost):
        t.ack(lease)
    assert t.peek("g") == [Message(1, "e", 0, None, None)]
    assert t.group("g").last_claimed_at == 1000.0  # kept
    assert t.claim("w", 10).attempt == 1


def test_retry_lifts_a_bury_ends_a_park_and_keeps_a_pause_and_a_schedule(
        t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("b", "e")
    for _ in range(3):
        t.nack(t.claim("w", 10))
    t.bury(t.claim("w", 10), "poison")
    assert t.stats().buried == 1 and t.peek("b")[0].attempt == 4
    assert t.retry("b") is True
    assert t.stats().buried == 0
    assert t.group("b") == GroupInfo("b", 0, 1, "ready", False, 1, None, None, None, 1000.0, None, None)
    t.pause("b")
    assert t.retry("b") is True
    assert t.group("b").state == "paused"
    t.resume("b")
    t.nack(t.claim("w", 10), 100)
    assert t.group("b").state == "parked"
    assert t.retry("b") is True
    assert t.group("b").state == "ready" and t.peek("b")[0].attempt == 0
    t.publish("s", "x", delay=50)
    assert t.retry("s") is True
    assert t.group("s").state == "scheduled" and t.group("s").due_at == 1050.0
