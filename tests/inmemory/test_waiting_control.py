"""Waiting claims meet the control plane and the batches (SPEC Part 2).

``resume``, ``set_priority``, ``publish_many`` and ``ack_many`` hand what
they make claimable to a waiting claim; ``claim_many``, ``group()`` and
``groups()`` hand over what their expiries free; ``pause`` and ``purge``
act on groups whose message was handed to a waiting claim that has not
picked its lease up yet, and the exact undo of an abandoned hand-off
respects them (docs/decisions.md, "Interrupted or cancelled").  Both
implementations, real threads and real event loops; the "handed over but
not picked up" moments are made deterministic through the waiting side's
own entry points (``_waiter`` / ``_wait_start`` / ``_wait_end``, see
``_waiting.py``), or by cancelling an ``aclaim`` on its loop's thread
before it runs again.  The stress run with waiting workers and an operator
thread at once is in ``test_stress.py``.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any, Callable, List, Optional

import pytest

from leasequeue import LeaseLost
from leasequeue.testing import ManualClock

from helpers import INT64_MAX, fingerprint, lease_key

#: How long a test waits for something that must happen (not a speed bound).
PATIENCE = 20.0


def until(condition: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.002)


class Waiter(threading.Thread):
    """A thread blocked in ``t.claim(..., timeout=...)``, queued when started."""

    def __init__(self, t: Any, worker: str, min_priority: int = 0) -> None:
        super().__init__(daemon=True)
        self.t = t
        self.worker = worker
        self.min_priority = min_priority
        self.result: Any = "not returned"
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self.result = self.t.claim(self.worker, 30.0, self.min_priority, timeout=PATIENCE)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def queue(self) -> "Waiter":
        base = self.t._waiting_count()
        self.start()
        until(lambda: self.t._waiting_count() == base + 1, f"{self.worker} queued")
        return self

    def got(self) -> Any:
        self.join(PATIENCE)
        assert not self.is_alive(), f"{self.worker}'s waiting claim did not return"
        assert self.error is None, repr(self.error)
        return self.result


class Record:
    """A waiting claim driven by hand through the core's entry points: queued
    by ``_wait_start``, so that a hand-off to it can be followed by other
    calls before its owner picks the lease up (``keep``) or is interrupted
    (``abandon``: the exact undo)."""

    def __init__(self, t: Any, worker: str = "waiter", min_priority: int = 0, visibility: float = 30.0) -> None:
        self.t = t
        self.woken = 0
        self.rec = t._waiter(worker, visibility, min_priority, self._wake)
        assert t._wait_start(self.rec) is None, "something was claimable: the record did not queue"

    def _wake(self) -> None:
        self.woken += 1

    def keep(self) -> Any:
        return self.t._wait_end(self.rec, True)

    def abandon(self) -> None:
        assert self.t._wait_end(self.rec, False) is None


def park(t: Any, group: str = "g") -> None:
    """``group`` with one message, parked for an hour (claimed, nacked with a delay)."""
    t.publish(group, "e")
    t.nack(t.claim("x", 10.0), delay=3600.0)


def views(t: Any) -> List[Any]:
    return [tuple(info) for info in t.groups()]


# ------------------------------------------- an abandoned hand-off meets pause


@pytest.mark.parametrize("expired", [False, True], ids=["lease-live", "lease-expired-and-seen"])
def test_undo_in_a_group_paused_meanwhile_leaves_it_paused(transport_cls: Any, expired: bool) -> None:
    """A message handed to a waiting claim, its group paused before the claim
    picks the lease up, the claim interrupted: the hand-off is undone exactly
    and the group stays paused -- not served to the next waiting claim, not
    claimable -- until a resume, which serves it.  The same observable state
    as a twin where the hand-off never happened."""
    clock, ref_clock = ManualClock(), ManualClock()
    t, ref = transport_cls(clock=clock), transport_cls(clock=ref_clock)
    first = Record(t, "first")
    t.publish("g", "e")  # handed to "first" (claim 1, attempt 1)
    ref.publish("g", "e")
    assert first.woken == 1 and t._waiting_count() == 0
    second = Record(t, "second")
    assert t.pause("g") is True and ref.pause("g") is True
    if expired:
        for c, x in ((clock, t), (ref_clock, ref)):
            c.advance(31.0)
            x.stats()  # the handed lease expires: a paused group is not made ready
    first.abandon()
    assert second.woken == 0 and t._waiting_count() == 1  # nothing claimable: the group is paused
    assert views(t) == views(ref)
    assert views(t)[0][3:6] == ("paused", True, 1)  # state, paused, head_seq
    assert t.stats() == ref.stats()
    assert t.claim("x", 1.0) is None
    assert t.resume("g") is True and ref.resume("g") is True
    assert second.woken == 1
    lease = second.keep()
    expected = ref.claim("second", 30.0)
    assert lease_key(lease)[:2] + lease_key(lease)[3:] == lease_key(expected)[:2] + lease_key(expected)[3:]
    assert lease.attempt == 1  # the undone delivery left no trace
    assert fingerprint(t, clock) == fingerprint(ref, ref_clock)


def test_a_paused_group_is_not_handed_to_a_waiting_claim(transport: Any) -> None:
    """Publishing into a paused group wakes nobody; its resume does."""
    w = Waiter(transport, "w").queue()
    transport.pause("g")
    handed = transport._wake_counts()[0]
    transport.publish("g", "e")
    time.sleep(0.05)
    assert w.is_alive() and transport._wake_counts()[0] == handed
    assert transport.resume("g") is True
    assert (w.got().group_id, w.got().attempt) == ("g", 1)
    assert transport._wake_counts()[0] == handed + 1


def test_pause_does_not_take_a_handed_lease_back(transport: Any) -> None:
    """A lease already handed over stays valid through a pause (as any lease
    does): the waiting claim returns it, and it may be acked."""
    first = Record(transport)
    transport.publish("g", "e")
    transport.publish("g", "f")
    transport.pause("g")
    lease = first.keep()
    assert (lease.seq, lease.worker_id, lease.attempt) == (1, "waiter", 1)
    assert transport.group("g").state == "leased" and transport.group("g").worker_id == "waiter"
    transport.ack(lease)
    assert transport.group("g")[3:6] == ("paused", True, 2)
    assert transport.claim("x", 1.0) is None


# ------------------------------------------- an abandoned hand-off meets purge


@pytest.mark.parametrize("after", ["nothing", "same-id-again", "slot-reused"])
def test_purge_of_a_handed_off_message_leaves_nothing_to_undo(transport: Any, clock: ManualClock,
                                                              after: str) -> None:
    """The purge removes the message handed over; the interrupted claim's
    undo sees that delivery is not current and changes nothing -- also when
    the group id (or, in the Cython twin, the group's slot) is in use again
    by then."""
    first = Record(transport)
    transport.publish("g", "e")  # handed to "first"
    assert transport.purge("g") == 1
    if after == "same-id-again":
        transport.publish("g", "new")  # seq 2, a group never claimed
    elif after == "slot-reused":
        transport.publish("h", "other")  # seq 2 takes the freed slot
        transport.publish("g", "new")  # seq 3
    before = (views(transport), tuple(transport.stats()))
    first.abandon()
    assert (views(transport), tuple(transport.stats())) == before
    if after == "nothing":
        assert len(transport) == 0 and transport.groups() == [] and transport.stats().leased == 0
    else:
        order = [(lease.seq, lease.group_id, lease.attempt) for lease in transport.claim_many("x", 5.0, 10)]
        assert order == ([(2, "g", 1)] if after == "same-id-again" else [(2, "h", 1), (3, "g", 1)])
        assert all(info.last_claimed_at == clock.now for info in transport.groups())


def test_a_purged_lease_picked_up_after_the_purge_is_lost(transport: Any) -> None:
    first = Record(transport)
    transport.publish("g", "e")
    transport.purge("g")
    lease = first.keep()  # the claim was granted before the purge: it returns the lease...
    assert (lease.seq, lease.worker_id) == (1, "waiter")
    with pytest.raises(LeaseLost):  # ...which the purge made stale
        transport.ack(lease)
    assert transport.ack_many([lease]) == [lease]
    assert len(transport) == 0


# ----------------------------------- an abandoned hand-off meets set_priority


def test_undo_after_set_priority_restores_the_group_at_its_new_priority(transport_cls: Any) -> None:
    clock, ref_clock = ManualClock(), ManualClock()
    t, ref = transport_cls(clock=clock), transport_cls(clock=ref_clock)
    for x in (t, ref):
        x.publish("old", "o")
        x.ack(x.claim("x", 5.0))  # claim 1: "old" is forgotten
    first = Record(t)
    t.publish("g", "e")  # handed over: claim 2
    ref.publish("g", "e")
    assert t.set_priority("g", 7) is True and ref.set_priority("g", 7) is True
    high = Record(t, "high", min_priority=7)  # nothing of priority 7 is ready: it queues
    first.abandon()  # the message goes to the next waiting claim whose floor admits it
    assert high.woken == 1
    lease, expected = high.keep(), ref.claim("high", 30.0, 7)
    assert (lease.seq, lease.group_id, lease.attempt, lease.expires_at) == (
        expected.seq, expected.group_id, expected.attempt, expected.expires_at)
    assert views(t) == views(ref)
    assert fingerprint(t, clock) == fingerprint(ref, ref_clock)


# ------------------------------------------------- waking by the control plane


def test_set_priority_serves_a_waiting_claims_floor_only_when_it_reaches_it(transport: Any,
                                                                             clock: ManualClock) -> None:
    transport.publish("g", "e")  # priority 0: not for a floor-5 claim
    w = Waiter(transport, "five", min_priority=5).queue()
    reads = clock.reads
    handed = transport._wake_counts()[0]
    assert transport.set_priority("g", 4) is True  # a ready group moved: one look for a taker
    transport.pause("g")
    assert transport.set_priority("g", 9) is True  # paused: not claimable, nothing to hand over
    time.sleep(0.05)
    assert w.is_alive() and transport._wake_counts()[0] == handed
    assert clock.reads == reads + 1  # the waiting claim was not woken to look
    transport.resume("g")
    lease = w.got()
    assert (lease.group_id, lease.worker_id, lease.attempt) == ("g", "five", 1)
    assert transport.group("g").priority == 9


def test_set_priority_serves_the_longest_waiting_claim_it_admits(transport: Any) -> None:
    """Waiting claims on floors 10 (first) and 5 (second); a ready group raised
    to 5 goes to the second, one raised to 10 then to the first."""
    transport.publish("a", "ea")
    transport.publish("b", "eb")
    ten = Waiter(transport, "ten", min_priority=10).queue()
    five = Waiter(transport, "five", min_priority=5).queue()
    transport.set_priority("a", 5)
    assert five.got().group_id == "a"
    assert ten.is_alive()
    transport.set_priority("b", 10)
    assert ten.got().group_id == "b"


def test_set_priority_of_a_leased_group_hands_nothing_over(transport: Any) -> None:
    transport.publish("g", "e")
    transport.publish("g", "f")
    held = transport.claim("x", 30.0)
    w = Waiter(transport, "five", min_priority=5).queue()
    handed = transport._wake_counts()[0]
    transport.set_priority("g", 5)
    time.sleep(0.05)
    assert w.is_alive() and transport._wake_counts()[0] == handed
    transport.ack(held)  # exposes "f" in a group now at priority 5
    assert (w.got().seq, w.got().group_id) == (2, "g")


def test_resume_of_a_park_hands_it_to_the_longest_waiter_only(transport: Any) -> None:
    park(transport)
    first, second = Waiter(transport, "first").queue(), Waiter(transport, "second").queue()
    handed = transport._wake_counts()[0]
    assert transport.resume("g") is True
    lease = first.got()
    assert (lease.seq, lease.worker_id, lease.attempt) == (1, "first", 2)
    assert second.is_alive() and transport._waiting_count() == 1
    assert transport._wake_counts()[0] == handed + 1  # one message, one wake-up
    transport.publish("h", "f")
    assert second.got().group_id == "h"


def test_resume_of_a_paused_park_hands_over_once_both_are_lifted(transport: Any) -> None:
    park(transport)
    transport.pause("g")
    w = Waiter(transport, "w").queue()
    assert transport.resume("g") is True  # lifts the pause and ends the park at once
    assert (w.got().attempt, w.got().group_id) == (2, "g")


def test_asyncio_claims_are_woken_by_resume_and_set_priority_from_a_thread(transport_cls: Any) -> None:
    t = transport_cls()
    t.publish("paused", "p", priority=1)
    t.pause("paused")
    t.publish("low", "l")  # priority 0: below both floors

    async def main() -> List[Any]:
        anyone = asyncio.ensure_future(t.aclaim("anyone", 30.0, 1))
        await until_queued(t, 1)
        floor = asyncio.ensure_future(t.aclaim("floor", 30.0, 3))
        await until_queued(t, 2)
        thread = threading.Thread(target=lambda: (t.resume("paused"), t.set_priority("low", 3)))
        thread.start()
        got = await asyncio.wait_for(asyncio.gather(anyone, floor), PATIENCE)
        thread.join(PATIENCE)
        return got

    anyone, floor = asyncio.run(main())
    assert (anyone.group_id, floor.group_id) == ("paused", "low")


async def until_queued(t: Any, n: int) -> None:
    deadline = time.monotonic() + PATIENCE
    while t._waiting_count() < n:
        assert time.monotonic() < deadline, f"timed out waiting for {n} queued claims"
        await asyncio.sleep(0.002)


def test_a_cancelled_aclaim_in_a_group_paused_meanwhile(transport_cls: Any) -> None:
    """asyncio: the task handed a lease is cancelled before it runs again, after
    the group was paused: the next task is not served until the resume."""
    t = transport_cls()

    async def main() -> Any:
        first = asyncio.ensure_future(t.aclaim("first", 30.0))
        await until_queued(t, 1)
        second = asyncio.ensure_future(t.aclaim("second", 30.0))
        await until_queued(t, 2)
        t.publish("g", "e")  # on the loop's thread: "first" is handed the lease, not yet run
        t.pause("g")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.sleep(0.05)
        assert not second.done() and t._waiting_count() == 1
        assert t.stats().leased == 0 and t.group("g").state == "paused"
        t.resume("g")
        return await asyncio.wait_for(second, PATIENCE)

    lease = asyncio.run(main())
    assert (lease.worker_id, lease.group_id, lease.attempt) == ("second", "g", 1)


# ------------------------------------------------------------- the batches


def test_publish_many_serves_waiting_claims_in_waiting_order(transport: Any) -> None:
    waiters = [Waiter(transport, f"w{i}").queue() for i in range(4)]
    handed = transport._wake_counts()[0]
    transport.publish_many([(f"g{i}", i) for i in range(4)] + [("g0", "second of g0")])
    assert [(w.got().worker_id, w.got().group_id) for w in waiters] == [(f"w{i}", f"g{i}") for i in range(4)]
    assert transport._wake_counts()[0] == handed + 4
    assert transport.stats().leased == 4 and len(transport) == 5


def test_ack_many_serves_the_next_messages_to_waiting_claims(transport: Any) -> None:
    transport.publish_many([("a", 1), ("b", 2), ("a", 3), ("b", 4)])
    leases = transport.claim_many("x", 30.0, 2)
    first, second = Waiter(transport, "first").queue(), Waiter(transport, "second").queue()
    assert transport.ack_many(leases + leases) == leases  # the duplicates are not current
    assert [(w.got().seq, w.got().worker_id) for w in (first, second)] == [(3, "first"), (4, "second")]


def test_claim_many_takes_its_own_then_serves_what_its_expiries_freed(transport: Any, clock: ManualClock) -> None:
    transport.publish("low", "l", priority=0)
    transport.publish("high", "h", priority=5)
    transport.publish("low2", "l2", priority=0)
    transport.claim_many("crashed", 10.0, 3)
    w = Waiter(transport, "w").queue()
    clock.advance(11.0)  # every lease is over by the clock, but nobody looked
    got = transport.claim_many("batch", 10.0, 1, min_priority=0)  # expires all three, takes one
    assert [(lease.group_id, lease.attempt) for lease in got] == [("low", 2)]
    assert (w.got().group_id, w.got().attempt) == ("high", 2)  # the next in round-robin order
    assert transport.claim_many("batch", 10.0, 5, min_priority=6) == []


@pytest.mark.parametrize("operation", ["group", "groups"])
def test_group_and_groups_serve_what_their_expiry_freed(transport: Any, clock: ManualClock, operation: str) -> None:
    transport.publish("g", "e")
    transport.claim("crashed", 10.0)
    w = Waiter(transport, "w").queue()
    clock.advance(11.0)
    if operation == "group":
        assert transport.group("unknown") is None
    else:
        assert [info.group_id for info in transport.groups()] == ["g"]
    assert (w.got().group_id, w.got().attempt) == ("g", 2)


@pytest.mark.parametrize("operation", ["group", "groups", "claim_many"])
def test_expiry_seen_by_group_groups_or_claim_many_is_handed_over_before_it_returns(
    transport: Any, clock: ManualClock, operation: str
) -> None:
    """The hand-off happens in the call itself, not later by the expiry timer:
    the lease ran for an hour, so the timer sleeps for an hour of real time."""
    transport.publish("g", "e")
    transport.claim("crashed", 3600.0)
    rec = Record(transport)
    clock.advance(3601.0)
    calls = {
        "group": lambda: transport.group("unknown"),
        "groups": lambda: [info.group_id for info in transport.groups()],
        "claim_many": lambda: transport.claim_many("batch", 10.0, 5, min_priority=INT64_MAX),
    }
    assert calls[operation]() == {"group": None, "groups": ["g"], "claim_many": []}[operation]
    assert rec.woken == 1
    lease = rec.keep()
    assert (lease.group_id, lease.attempt, lease.worker_id, lease.expires_at) == ("g", 2, "waiter", 4631.0)


# ------------------------------------------------------ clock reads, close()


def test_which_calls_read_the_clock_while_a_claim_waits(transport: Any, clock: ManualClock) -> None:
    """docs/decisions.md: while a claim waits, resume, set_priority,
    publish_many and ack_many read the clock once when they made a group
    claimable, and not otherwise; pause and purge never do."""
    transport.publish("g", "e")
    transport.publish("h", "f")
    held = transport.claim("x", 30.0)  # g
    parked = transport.claim("x", 30.0)  # h
    transport.nack(parked, delay=100.0)
    Record(transport, min_priority=INT64_MAX)  # waits, admitting nothing here
    cases = [
        (lambda: transport.pause("g"), 0),  # leased and paused
        (lambda: transport.pause("new"), 0),
        (lambda: transport.resume("new"), 0),  # an empty group: forgotten
        (lambda: transport.resume("g"), 0),  # still leased: nothing claimable
        (lambda: transport.resume("nobody"), 0),
        (lambda: transport.set_priority("g", 3), 0),  # leased: not ready
        (lambda: transport.set_priority("h", 3), 0),  # parked
        (lambda: transport.resume("h"), 1),  # the park ends: ready
        (lambda: transport.set_priority("h", 3), 0),  # unchanged
        (lambda: transport.set_priority("h", 4), 1),  # a ready group moved
        (lambda: transport.publish_many([]), 0),
        (lambda: transport.publish_many([("g", "e2")]), 1),
        (lambda: transport.ack_many([]), 0),
        (lambda: transport.ack_many([held]), 1),
        (lambda: transport.ack_many([held]), 0),  # not current any more: nothing acked
        (lambda: transport.purge("h"), 0),
        (lambda: transport.purge("g"), 0),
    ]
    for i, (call, reads) in enumerate(cases):
        before = clock.reads
        call()
        assert clock.reads - before == reads, f"case {i}"
    assert transport._waiting_count() == 1


def test_after_close_the_control_plane_and_batches_work_and_hand_nothing_over(
    transport: Any, clock: ManualClock
) -> None:
    park(transport)
    w = Waiter(transport, "w").queue()
    transport.close()
    assert w.got() is None
    handed = transport._wake_counts()[0]
    assert transport.resume("g") is True
    assert transport.pause("p") is True and transport.set_priority("p", 3) is True
    assert transport.publish_many([("p", "q"), ("r", "s")]) == [2, 3]
    assert transport.group("g").state == "ready" and len(transport.groups()) == 3
    reads = clock.reads
    assert transport.claim("late", 10.0, timeout=5.0) is None  # at once, without the clock
    assert clock.reads == reads
    leases = transport.claim_many("y", 10.0, 5)  # claim_many ignores close()
    assert [(lease.group_id, lease.attempt) for lease in leases] == [("r", 1), ("g", 2)]  # never claimed first
    assert transport.ack_many(leases) == [] and transport.purge("p") == 1
    assert transport._wake_counts()[0] == handed and len(transport) == 0


def _end_wait_inside(impl: Any, t: Any, rec: Any, call: Callable[[], Any], where: str = "_settle") -> None:
    """Run ``call()`` with ``rec``'s wait ended (not kept) from user code run
    inside it, under its lock: a profiler hook at the operation's ``where``
    (its ``_settle``; ``publish`` settles inline unless there is something
    to settle, so its ``_add``) stands for a coroutine the garbage collector
    finalises there (pure twin).  The Cython transport runs no Python code
    under its lock: there the wait is ended after the call."""
    import sys

    ended: List[Any] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if (event == "call" and not ended and frame.f_code.co_name == where
                and frame.f_globals.get("__name__") == impl.__name__):
            ended.append(t._wait_end(rec, False))

    sys.setprofile(hook)
    try:
        call()
    finally:
        sys.setprofile(None)
    if impl.__name__.endswith("_py"):
        assert ended == [None], "the hook did not get inside the operation"
    else:
        assert not ended
        assert t._wait_end(rec, False) is None


@pytest.mark.parametrize("operation", ["publish", "claim", "stats", "group", "groups", "claim_many", "pause"])
def test_a_wait_ended_inside_another_operation_is_undone_as_it_ends(impl: Any, operation: str) -> None:
    """A waiting claim that was handed a lease and is ended from user code run
    inside another operation (a coroutine the garbage collector finalises
    there, here a profiler hook: pure twin) gives its lease back exactly by the
    time that operation returns, even with no other claim waiting to serve:
    the message is claimable at once, attempt 1, not only when the lease
    expires."""
    t = impl.InMemoryTransport(clock=ManualClock())
    rec = t._waiter("w", 30.0, 0, lambda: None)
    assert t._wait_start(rec) is None  # queued: nothing to claim
    t.publish("g", "e")  # handed to the waiting claim
    assert t.stats().leased == 1 and t._waiting_count() == 0
    calls = {
        "publish": lambda: t.publish("h", "f"),
        "claim": lambda: t.claim("x", 10.0, 2**62),
        "stats": t.stats,
        "group": lambda: t.group("g"),
        "groups": t.groups,
        "claim_many": lambda: t.claim_many("x", 10.0, 2, 2**62),
        "pause": lambda: t.pause("p"),
    }
    _end_wait_inside(impl, t, rec, calls[operation], "_add" if operation == "publish" else "_settle")
    assert t.stats().leased == 0
    lease = t.claim("x", 10.0)
    assert (lease.group_id, lease.attempt) == ("g", 1)


@pytest.mark.parametrize("operation", ["publish", "stats", "groups"])
def test_a_wait_ended_inside_another_operation_goes_to_the_next_waiting_claim(impl: Any, operation: str) -> None:
    """As above with a second claim waiting: the lease the first one gives
    back goes to the second, attempt 1, which is woken (its wake callback
    runs) by the time the operation returns."""
    t = impl.InMemoryTransport(clock=ManualClock())
    woken: List[str] = []
    first = t._waiter("w1", 30.0, 0, lambda: woken.append("w1"))
    second = t._waiter("w2", 30.0, 0, lambda: woken.append("w2"))
    assert t._wait_start(first) is None and t._wait_start(second) is None
    t.publish("g", "e")  # handed to the first
    assert woken == ["w1"] and t._waiting_count() == 1
    calls = {"publish": lambda: t.publish("g", "f"), "stats": t.stats, "groups": t.groups}  # nothing claimable
    _end_wait_inside(impl, t, first, calls[operation], "_add" if operation == "publish" else "_settle")
    lease = t._wait_end(second, True)
    assert woken[-1] == "w2" and t._waiting_count() == 0
    assert (lease.seq, lease.group_id, lease.worker_id, lease.attempt) == (1, "g", "w2", 1)


@pytest.mark.parametrize("claimed_before", [False, True], ids=["never-claimed", "claimed-before"])
def test_an_undone_hand_off_gives_the_group_back_its_last_claim_time(
    transport: Any, clock: ManualClock, claimed_before: bool
) -> None:
    """A waiting claim handed a message and then ended without keeping it
    (interrupted, cancelled) leaves the group as it was: ``last_claimed_at``
    included, ``None`` for a group never claimed."""
    from leasequeue._backends.inmemory.waiting import HANDED

    if claimed_before:
        transport.publish("g", "first")
        transport.publish("g", "second")
        first = transport.claim("w0", 10.0)  # at 1000; g is leased now
    rec = transport._waiter("w", 30.0, 0, lambda: None)
    assert transport._wait_start(rec) is None  # nothing claimable: it waits
    clock.advance(5.0)
    if claimed_before:
        transport.ack(first)  # "second" is ready: handed to the waiting claim at 1005
    else:
        transport.publish("g", "only")  # handed to the waiting claim at 1005
    assert rec.state == HANDED
    assert transport.group("g").last_claimed_at == 1005.0
    assert transport._wait_end(rec, False) is None  # not kept: undone
    info = transport.group("g")
    assert (info.state, info.attempt, info.last_claimed_at) == ("ready", None, 1000.0 if claimed_before else None)


# ------------------------------------------------- an undone hand-off is exact


def test_undo_of_a_hand_off_with_no_lease_end_frees_the_group(transport_cls: Any) -> None:
    """A waiting claim with ``visibility=inf`` is handed a lease that never
    expires (nothing to watch); undone, the group is free and ready again,
    exactly as in a twin where the hand-off never happened."""
    clock, ref_clock = ManualClock(), ManualClock()
    t, ref = transport_cls(clock=clock), transport_cls(clock=ref_clock)
    waiter = Record(t, "w", visibility=math.inf)
    t.publish("g", "e")
    ref.publish("g", "e")
    assert waiter.woken == 1 and t.stats().leased == 1
    waiter.abandon()
    assert t.stats() == ref.stats() and t.stats().leased == 0
    assert views(t) == views(ref)
    assert fingerprint(t, clock) == fingerprint(ref, ref_clock)


def test_undo_after_a_nack_leaves_the_nacked_lease_lost(transport_cls: Any) -> None:
    """A lease nacked, its message handed to a waiting claim, the hand-off
    undone: the nacked lease does not become current again (its delivery was
    closed by the nack), and the next claim is attempt 2, as in a twin where
    the hand-off never happened."""
    clock, ref_clock = ManualClock(), ManualClock()
    t, ref = transport_cls(clock=clock), transport_cls(clock=ref_clock)
    leases = []
    for x in (t, ref):
        x.publish("g", "e")
        leases.append(x.claim("w0", 30.0))
    waiter = Record(t, "w")
    t.nack(leases[0])  # handed to the waiting claim: attempt 2
    ref.nack(leases[1])
    assert waiter.woken == 1
    waiter.abandon()
    for x, lease in zip((t, ref), leases):
        with pytest.raises(LeaseLost):
            x.ack(lease)
    assert views(t) == views(ref)
    assert fingerprint(t, clock) == fingerprint(ref, ref_clock)


def test_undo_after_purge_and_a_new_claim_in_the_group_leaves_that_claim(transport: Any) -> None:
    """The handed message purged, the group created again by a publish and
    its new message claimed (attempt 1, like the handed one): undoing the old
    hand-off must not touch that claim, which is not its delivery."""
    waiter = Record(transport, "w")
    transport.publish("g", "old")  # handed to the waiting claim: seq 1, attempt 1
    assert waiter.woken == 1
    assert transport.purge("g") == 1
    transport.publish("g", "new")  # seq 2
    other = transport.claim("other", 30.0)
    assert (other.seq, other.attempt) == (2, 1)
    waiter.abandon()
    assert transport.claim("third", 30.0) is None  # g is still leased to "other"
    assert transport.stats().leased == 1
    transport.ack(other)  # still current
    assert len(transport) == 0


@pytest.mark.parametrize("where", ["inside-an-operation", "inside-a-wait-end"])
def test_user_code_around_a_wait_end_keeps_the_busy_guard(impl: Any, where: str) -> None:
    """A wait ended from user code inside another operation is only noted
    (an orphan), and leaves that operation marked busy: a claim from the
    same user code is still refused.  User code run inside a wait's end
    (under its lock) is refused too, and what it publishes goes to the next
    waiting claim before the end returns.  (Profiler hooks stand for
    finalisers here; the Cython transport runs no Python code under its
    lock, so the hook never gets inside.)"""
    import sys

    from leasequeue._backends.inmemory.waiting import HANDED

    t = impl.InMemoryTransport(clock=ManualClock())
    first = t._waiter("w1", 30.0, 0, lambda: None)
    second = t._waiter("w2", 30.0, 0, lambda: None)
    assert t._wait_start(first) is None and t._wait_start(second) is None
    target = "_settle" if where == "inside-an-operation" else "_end_locked"
    got: List[str] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if (event != "call" or got or frame.f_code.co_name != target
                or frame.f_globals.get("__name__") != impl.__name__):
            return
        if where == "inside-an-operation":
            assert t._wait_end(first, False) is None  # noted, ended as the operation ends
        else:
            t.publish("g", "from-user-code")  # held, then served to the waiting claim left
        try:
            t.claim("x", 10.0, 2**62)
            got.append("ran")
        except RuntimeError as exc:
            got.append("refused" if "middle of another operation" in str(exc) else repr(exc))

    sys.setprofile(hook)
    try:
        if where == "inside-an-operation":
            t.stats()
        else:
            assert t._wait_end(first, False) is None
    finally:
        sys.setprofile(None)
    if impl.__name__.endswith("_py"):
        assert got == ["refused"]
    else:
        assert got == []
        if where == "inside-an-operation":
            assert t._wait_end(first, False) is None
        else:
            t.publish("g", "from-user-code")
    assert t._waiting_count() == (1 if where == "inside-an-operation" else 0)
    if where == "inside-a-wait-end":
        assert second.state == HANDED
        lease = t._wait_end(second, True)
        assert (lease.group_id, lease.event, lease.worker_id) == ("g", "from-user-code", "w2")
    else:
        assert t._wait_end(second, False) is None
