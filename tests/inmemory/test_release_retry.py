"""SPEC Part 5, "Honest attempts": release, retry and fencing by delivery, on
both in-memory twins.

``docs/decisions.md`` ("Honest attempts"): every delivery is numbered by the
claim counter; an issued lease is current while that number is its
message's open delivery, so no lease of a closed delivery is ever current
again, whatever its ``attempt`` (no ABA after ``release`` or ``retry``).
``release`` is ``nack`` that does not count the delivery; ``retry`` is the
operator's fresh start.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, List

import pytest

from leasequeue import LeaseLost
from leasequeue.testing import ManualClock


def stale_calls(t: Any, lease: Any) -> List[Callable[[], Any]]:
    return [lambda: t.ack(lease), lambda: t.nack(lease), lambda: t.nack(lease, 5),
            lambda: t.extend(lease, 5), lambda: t.bury(lease, "x"), lambda: t.release(lease),
            lambda: t.release(lease, 5)]


def assert_lost(t: Any, lease: Any) -> None:
    """Every lease operation raises LeaseLost and changes nothing."""
    before = (len(t), tuple(t.stats()), t.groups())
    for call in stale_calls(t, lease):
        with pytest.raises(LeaseLost):
            call()
        assert (len(t), tuple(t.stats()), t.groups()) == before
    assert t.ack_many([lease]) == [lease]


# -- release --------------------------------------------------------------------------


def test_release_does_not_count_the_delivery(transport: Any) -> None:
    transport.publish("g", "a")
    first = transport.claim("w", 30)
    assert first.attempt == 1
    transport.release(first)
    assert transport.peek("g")[0].attempt == 0
    second = transport.claim("w", 30)
    assert (second.seq, second.attempt) == (first.seq, 1)  # the same attempt again
    assert_lost(transport, first)  # no ABA: same seq, worker and attempt, another delivery
    transport.nack(second)
    third = transport.claim("w", 30)
    assert third.attempt == 2
    transport.ack(third)
    assert len(transport) == 0


def test_release_with_a_delay_parks_with_the_count_handed_back(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "a")
    transport.nack(transport.claim("w", 30))
    lease = transport.claim("w", 30)
    assert lease.attempt == 2
    reads = clock.reads
    transport.release(lease, 5)
    assert clock.reads == reads + 1
    info = transport.group("g")
    assert (info.state, info.worker_id, info.attempt, info.expires_at) == ("parked", "__parked__", 1, clock() + 5)
    assert transport.stats().parked == 1
    assert transport.claim("w", 30) is None
    clock.advance(5.5)
    again = transport.claim("w", 30)
    assert again.attempt == 2
    assert_lost(transport, lease)


def test_release_zero_reads_no_clock_and_keeps_the_round_robin_key(transport: Any, clock: ManualClock) -> None:
    transport.publish("a", "a1")
    transport.publish("b", "b1")
    la = transport.claim("w", 30)  # a: first claim
    lb = transport.claim("w", 30)  # b: second claim
    reads = clock.reads
    transport.release(lb)
    transport.release(la)
    assert clock.reads == reads
    # a was claimed longer ago: it is served first, as after nack
    assert [transport.claim("w", 30).group_id for _ in range(2)] == ["a", "b"]


def test_release_of_a_lease_that_is_not_current(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "a")
    lease = transport.claim("w", 30)
    transport.ack(lease)
    with pytest.raises(LeaseLost):
        transport.release(lease)
    with pytest.raises(TypeError):
        transport.release("not a lease")
    transport.publish("g", "b")
    live = transport.claim("w", 30)
    hand_built = type(live)(live.seq, "g", live.event, "w", live.expires_at, live.attempt)
    assert hand_built == live
    with pytest.raises(LeaseLost):  # in memory a lease built by hand is never current
        transport.release(hand_built)


@pytest.mark.parametrize("delay, error", [(True, TypeError), ("1", TypeError), (-1, ValueError),
                                          (math.nan, ValueError)])
def test_release_checks_its_delay_first(transport: Any, clock: ManualClock, delay: Any, error: type) -> None:
    transport.publish("g", "a")
    lease = transport.claim("w", 30)
    reads = clock.reads
    with pytest.raises(error):
        transport.release(lease, delay)
    assert clock.reads == reads
    assert transport.group("g").state == "leased"
    transport.ack(lease)  # still current


def test_release_of_an_expired_lease_nobody_claimed(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "a")
    lease = transport.claim("w", 1)
    clock.advance(5)
    transport.release(lease)
    assert transport.claim("w", 30).attempt == 1


def test_a_failing_clock_changes_nothing_in_release_and_retry(make_transport: Callable[..., Any]) -> None:
    state = {"fail": False}

    def clock() -> float:
        if state["fail"]:
            raise RuntimeError("clock broke")
        return 1000.0

    t = make_transport(clock=clock)
    t.publish("g", "a")
    lease = t.claim("w", 30)
    state["fail"] = True
    with pytest.raises(RuntimeError):
        t.release(lease, 5)
    with pytest.raises(RuntimeError):
        t.retry("g")
    state["fail"] = False
    info = t.group("g")
    assert (info.state, info.attempt) == ("leased", 1)
    t.release(lease)  # still current
    assert t.claim("w", 30).attempt == 1


# -- retry ---------------------------------------------------------------------------


def test_retry_refuses_an_unknown_an_empty_and_a_leased_group(transport: Any, clock: ManualClock) -> None:
    reads = clock.reads
    assert transport.retry("nobody") is False
    assert clock.reads == reads + 1  # read even for an unknown group
    transport.pause("empty")
    assert transport.retry("empty") is False
    transport.publish("g", "a")
    lease = transport.claim("w", 30)
    assert transport.retry("g") is False
    info = transport.group("g")
    assert (info.state, info.attempt) == ("leased", 1)
    transport.ack(lease)  # untouched


def test_retry_of_an_expired_lease_closes_its_delivery(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "a")
    transport.nack(transport.claim("w", 30))
    lease = transport.claim("w", 1)
    assert lease.attempt == 2
    clock.advance(2)
    assert transport.retry("g") is True
    assert transport.peek("g")[0].attempt == 0
    assert_lost(transport, lease)
    again = transport.claim("w", 30)
    assert again.attempt == 1
    transport.ack(again)


def test_retry_lifts_a_bury(transport: Any) -> None:
    transport.publish("g", "poison")
    transport.publish("g", "next")
    for _ in range(3):
        transport.nack(transport.claim("w", 30))
    lease = transport.claim("w", 30)
    transport.bury(lease, "too many")
    assert transport.stats().buried == 1
    assert transport.retry("g") is True
    info = transport.group("g")
    assert (info.state, info.reason, info.attempt) == ("ready", None, None)
    assert transport.stats().buried == 0
    again = transport.claim("w", 30)
    assert (again.seq, again.attempt) == (1, 1)


def test_retry_ends_a_park(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "a")
    transport.nack(transport.claim("w", 30), 100)
    assert transport.retry("g") is True
    stats = transport.stats()
    assert (stats.parked, transport.group("g").state) == (0, "ready")
    assert transport.claim("w", 30).attempt == 1


def test_retry_keeps_a_pause_and_the_round_robin_position(transport: Any, clock: ManualClock) -> None:
    transport.publish("a", "a1")
    transport.publish("b", "b1")
    la = transport.claim("w", 30)
    clock.advance(1)
    lb = transport.claim("w", 30)
    transport.bury(la, "x")
    transport.nack(lb)
    claimed_at = transport.group("a").last_claimed_at
    transport.pause("a")
    assert transport.retry("a") is True
    info = transport.group("a")
    assert (info.state, info.paused, info.reason, info.last_claimed_at) == ("paused", True, None, claimed_at)
    assert transport.claim("w", 30).group_id == "b"  # a stays paused
    transport.resume("a")
    assert transport.claim("w", 30).attempt == 1


def test_retry_of_a_ready_head_resets_its_count(transport: Any) -> None:
    transport.publish("g", "a")
    transport.nack(transport.claim("w", 30))
    transport.nack(transport.claim("w", 30))
    assert transport.peek("g")[0].attempt == 2
    assert transport.retry("g") is True
    assert transport.peek("g")[0].attempt == 0
    assert transport.claim("w", 30).attempt == 1


def test_retry_checks_the_group_id(transport: Any, clock: ManualClock) -> None:
    reads = clock.reads
    with pytest.raises(TypeError, match="group_id"):
        transport.retry(1)
    assert clock.reads == reads


# -- fencing by delivery -------------------------------------------------------------


def test_extend_names_the_same_delivery(transport: Any) -> None:
    transport.publish("g", "a")
    lease = transport.claim("w", 30)
    longer = transport.extend(lease, 60)
    transport.release(longer)
    assert_lost(transport, lease)
    assert_lost(transport, longer)


def test_an_expired_lease_is_current_until_another_claim(transport: Any, clock: ManualClock) -> None:
    transport.publish("g", "a")
    lease = transport.claim("w", 1)
    clock.advance(2)
    transport.stats()  # expiry applied: the delivery is still open
    transport.release(lease)  # accepted
    second = transport.claim("w", 1)
    clock.advance(2)
    third = transport.claim("w2", 30)
    assert (second.attempt, third.attempt) == (1, 2)
    assert_lost(transport, second)
    transport.ack(third)


def test_a_lease_of_a_forgotten_and_recreated_group_is_not_current(transport: Any) -> None:
    transport.publish("g", "a")
    old = transport.claim("w", 30)
    assert transport.purge("g") == 1
    transport.publish("g", "b")
    new = transport.claim("w", 30)
    assert new.attempt == old.attempt == 1
    assert_lost(transport, old)
    transport.ack(new)


def test_claim_many_ack_and_claim_and_a_waiting_claim_number_their_deliveries(
    make_transport: Callable[..., Any],
) -> None:
    clock = ManualClock()
    t = make_transport(clock=clock)
    t.publish_many([("a", 1), ("b", 2)])
    la, lb = t.claim_many("w", 30, 2)
    t.release(la)
    la2 = t.ack_and_claim(lb, "w", 30)
    assert (la2.seq, la2.attempt) == (1, 1)
    assert_lost(t, la)
    got: List[Any] = []
    t.ack(la2)
    t.publish("c", 3)
    lc = t.claim("w", 30)
    waiter = threading.Thread(target=lambda: got.append(t.claim("w2", 30, timeout=10)))
    waiter.start()
    deadline = time.monotonic() + 5
    while t._waiting_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    t.release(lc)  # wakes the waiting claim, as nack
    waiter.join(10)
    assert got and got[0] is not None and (got[0].seq, got[0].attempt) == (lc.seq, 1)
    assert_lost(t, lc)
    t.ack(got[0])
    t.close()


def test_retry_wakes_a_waiting_claim(make_transport: Callable[..., Any]) -> None:
    t = make_transport(clock=ManualClock())
    t.publish("g", "a")
    t.bury(t.claim("w", 30), "poison")
    got: List[Any] = []
    waiter = threading.Thread(target=lambda: got.append(t.claim("w2", 30, timeout=10)))
    waiter.start()
    deadline = time.monotonic() + 5
    while t._waiting_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert t.retry("g") is True
    waiter.join(10)
    assert got and got[0] is not None and got[0].attempt == 1
    t.close()
