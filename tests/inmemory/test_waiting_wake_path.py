"""The wake-up path of a publish with claims waiting (issue 23), on both twins.

The pure twin's ``publish`` serves waiting claims inside its own locked step
(the clock read first, outside the lock), and hands a group it creates
straight to the claim that gets it (``_hand_new``) when nothing else is
claimable; the Cython twin serves after its locked step.  Observably they
are the same: these tests pin what could differ -- a clock that returns an
``int``, messages published by user code run inside that locked step (a
finaliser; a profiler hook stands for it on the pure twin, and on the
Cython twin, which runs no Python code under its lock, the same publish is
made right after), which claim a new group goes to, the exact undo of a
direct hand-off, and running out of memory in the middle of one.
Waiting claims are driven through the core's entry points (``_waiter`` /
``_wait_start`` / ``_wait_end``, see ``_waiting.py``), so the moments are
deterministic.
"""

from __future__ import annotations

import importlib
import math
import sys
import threading
from typing import Any, Callable, List, Tuple

import pytest

from helpers import fingerprint
from leasequeue import LeaseLost
from leasequeue.testing import ManualClock


def _queued(t: Any, worker: str, min_priority: int = 0) -> Tuple[Any, List[int]]:
    woken: List[int] = []
    rec = t._waiter(worker, 30.0, min_priority, lambda: woken.append(1))
    assert t._wait_start(rec) is None, "something was claimable: the record did not queue"
    return rec, woken


def test_an_int_clock_serves_a_waiting_claim_at_its_reading(transport_cls: Any) -> None:
    """The pre-read clock of a publish is checked like any reading: an int
    is taken as that many seconds."""
    t = transport_cls(clock=lambda: 1000)
    rec, woken = _queued(t, "w")
    assert t.publish("g", "e") == 1
    assert woken == [1]
    lease = t._wait_end(rec, True)
    assert (lease.seq, lease.worker_id, lease.expires_at, lease.attempt) == (1, "w", 1030.0, 1)
    assert t._waiting_count() == 0 and t.stats().leased == 1


@pytest.mark.parametrize("where", ["_hand_new", "_treap_insert"])
def test_a_message_published_inside_a_publish_goes_to_the_next_waiting_claim(impl: Any, where: str) -> None:
    """Two claims wait; ``publish("g")`` runs user code that publishes
    ``"h"`` in the middle of its locked step (as it starts handing ``g``
    over, or once it has chosen the claim and is placing ``g``'s level: the
    pure twin's direct hand-off of a new group).  By the time the outer publish returns, the
    first waiting claim has ``g`` (seq 1) and the second ``h`` (seq 2),
    each woken once -- what a separate serving after the publish would
    have done."""
    t = impl.InMemoryTransport(clock=ManualClock())
    first, woken_first = _queued(t, "w1")
    second, woken_second = _queued(t, "w2")
    inner: List[int] = []

    def nested() -> None:
        inner.append(t.publish("h", "nested"))

    _run_inside(impl, where, nested, lambda: t.publish("g", "outer"))
    if not impl.__name__.endswith("_py"):
        nested()  # the Cython twin runs no Python code under its lock: right after, then
    assert inner == [2]
    assert woken_first == [1] and woken_second == [1] and t._waiting_count() == 0
    a, b = t._wait_end(first, True), t._wait_end(second, True)
    assert (a.seq, a.group_id, a.worker_id) == (1, "g", "w1")
    assert (b.seq, b.group_id, b.worker_id) == (2, "h", "w2")
    assert t.stats().leased == 2 and len(t) == 2



@pytest.mark.parametrize("where", ["_add", "_hand_off"])
def test_a_message_published_inside_a_general_serving_publish_is_served_too(where: str) -> None:
    """The pure twin, when a publish cannot hand its message straight over
    (a lease expired meanwhile: expiry first, so ``_add``, then
    ``_serve_locked`` and ``_hand_off``), and user code publishes ``"h"``
    in the middle of that step: each claim is woken once with a lease, and
    nothing is lost: ``g`` goes to the first claim, the second gets ``h``
    or the expired ``old``, whichever was ready when its turn came, and the
    other is ready."""
    impl = importlib.import_module("leasequeue._backends.inmemory.transport_py")
    clock = ManualClock()
    t = impl.InMemoryTransport(clock=clock)
    t.publish("old", "o")
    assert t.claim("x", 1000.0) is not None  # the expiry timer sleeps ~1000 s towards its end
    first, woken_first = _queued(t, "w1")
    second, woken_second = _queued(t, "w2")
    clock.advance(2000.0)  # old's lease has run out; nothing has seen it yet
    inner: List[int] = []
    _run_inside(impl, where, lambda: inner.append(t.publish("h", "nested")), lambda: t.publish("g", "outer"))
    assert inner == [3]
    assert woken_first == [1] and woken_second == [1] and t._waiting_count() == 0
    a, b = t._wait_end(first, True), t._wait_end(second, True)
    assert (a.seq, a.group_id, a.worker_id, a.attempt) == (2, "g", "w1", 1)
    expected_second = ("h", 1) if where == "_add" else ("old", 2)  # h was held until the serving ended
    assert (b.group_id, b.attempt) == expected_second and b.worker_id == "w2"
    rest = t.claim("y", 30.0)
    assert rest is not None and rest.group_id == ({"h", "old"} - {b.group_id}).pop()
    assert t.claim("y", 30.0) is None and len(t) == 3

def _run_inside(impl: Any, where: str, inner: Callable[[], Any], outer: Callable[[], Any]) -> None:
    """Run ``outer()`` with ``inner()`` called once from a profiler hook at
    the pure twin's ``where`` (inside the operation's locked step); the
    Cython twin: just ``outer()`` (the caller runs ``inner`` after)."""
    done: List[bool] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if (event == "call" and not done and frame.f_code.co_name == where
                and frame.f_globals.get("__name__") == impl.__name__):
            done.append(True)
            inner()

    if not impl.__name__.endswith("_py"):
        outer()
        return
    sys.setprofile(hook)
    try:
        outer()
    finally:
        sys.setprofile(None)
    assert done, "the hook did not get inside the operation"


# ------------------------------------------- the direct hand-off of a new group
#
# A publish creating a group while nothing else is claimable for any waiting
# claim hands that group straight to the claim that gets it (the pure twin's
# ``_hand_new``: created leased, never in the ready set).  These pin that it
# is the claim ``claim`` would have made, on both twins.


def _fields(lease: Any) -> Tuple[Any, ...]:
    return (lease.seq, lease.group_id, lease.worker_id, lease.expires_at, lease.attempt)


def test_a_new_group_goes_to_the_longest_waiting_claim_whose_floor_admits_it(impl: Any) -> None:
    clock = ManualClock()
    t = impl.InMemoryTransport(clock=clock)
    high, woken_high = _queued(t, "high", 5)  # waited longest, but its floor is above priority 0
    low, woken_low = _queued(t, "low")
    later, woken_later = _queued(t, "later", -5)
    assert t.publish("g", "e", priority=0) == 1
    assert (woken_high, woken_low, woken_later) == ([], [1], [])
    lease = t._wait_end(low, True)
    assert _fields(lease) == (1, "g", "low", clock.now + 30.0, 1) and lease.event == "e"
    info = t.group("g")
    assert (info.state, info.worker_id, info.attempt, info.last_claimed_at) == ("leased", "low", 1, clock.now)
    clock.advance(1.0)
    assert t.publish("h", "f", priority=9) == 2  # admitted by both floors left: the longest waiter
    assert (woken_high, woken_later) == ([1], [])
    assert _fields(t._wait_end(high, True)) == (2, "h", "high", clock.now + 30.0, 1)
    assert t.publish("k", "x", priority=-3) == 3
    assert woken_later == [1]
    assert _fields(t._wait_end(later, True)) == (3, "k", "later", clock.now + 30.0, 1)
    assert t.stats().leased == 3 and t._waiting_count() == 0 and t._wake_counts() == (3, 0)
    assert t.claim("y", 1.0, -10) is None


def test_a_new_group_is_handed_over_past_a_ready_group_below_every_floor(impl: Any) -> None:
    """A ready group that no waiting claim admits does not stop the direct
    hand-off; nor does the claim take that group."""
    clock = ManualClock()
    t = impl.InMemoryTransport(clock=clock)
    t.publish("low", "l", priority=0)
    rec, woken = _queued(t, "w", 5)
    t.publish("high", "h", priority=5)
    assert woken == [1]
    assert _fields(t._wait_end(rec, True)) == (2, "high", "w", clock.now + 30.0, 1)
    assert t.claim("x", 1.0).group_id == "low"


def test_a_new_group_no_waiting_claim_admits_is_just_published(impl: Any) -> None:
    t = impl.InMemoryTransport(clock=ManualClock())
    rec, woken = _queued(t, "w", 5)
    assert t.publish("g", "e", priority=4) == 1
    assert woken == [] and t._waiting_count() == 1 and t.stats().leased == 0
    assert t.group("g").state == "ready"
    assert t._wait_end(rec, False) is None
    assert _fields(t.claim("x", 1.0, 4))[:3] == (1, "g", "x")


@pytest.mark.parametrize("visibility", [30.0, math.inf], ids=["finite", "no-end"])
def test_undoing_a_direct_hand_off_leaves_the_group_as_if_just_published(impl: Any, visibility: float) -> None:
    """An interrupted waiter gives its lease back (``_wait_end(rec, False)``):
    the group is ready again as a never-claimed group placed by its message
    (ahead of a group published after it, and of a claimed one), attempt 0,
    no claim time: the same transport as one where no claim waited."""
    clock, ref_clock = ManualClock(), ManualClock()
    t, ref = impl.InMemoryTransport(clock=clock), impl.InMemoryTransport(clock=ref_clock)
    for r in (t, ref):
        r.publish("a", "x")
        r.publish("a", "y")
        r.ack(r.claim("z", 1.0))  # "a" is a claimed group, ready
    event = object()
    woken: List[int] = []
    rec = t._waiter("w", visibility, 0, lambda: woken.append(1))
    t.pause("a")  # so that the claim waits
    ref.pause("a")
    assert t._wait_start(rec) is None
    t.publish("g", event)
    assert woken == [1] and t.stats().leased == 1
    t.publish("h", "f")  # no claim waits now: ready
    ref.publish("g", event)
    ref.publish("h", "f")
    assert t._wait_end(rec, False) is None
    for r in (t, ref):
        r.resume("a")
    assert t.stats() == ref.stats() and t.stats().leased == 0
    assert t.group("g") == ref.group("g") and t.group("g").last_claimed_at is None
    assert [g.group_id for g in t.groups()] == [g.group_id for g in ref.groups()]
    assert fingerprint(t, clock) == fingerprint(ref, ref_clock)


def test_an_undone_direct_hand_off_goes_to_the_next_waiting_claim(impl: Any) -> None:
    clock = ManualClock()
    t = impl.InMemoryTransport(clock=clock)
    first, _ = _queued(t, "first")
    t.publish("g", "e")
    second, woken_second = _queued(t, "second")
    assert t._wait_end(first, False) is None  # interrupted after the hand-off
    assert woken_second == [1] and t._waiting_count() == 0
    assert _fields(t._wait_end(second, True)) == (1, "g", "second", clock.now + 30.0, 1)
    assert t._wake_counts() == (2, 0)


def test_a_direct_hand_off_whose_lease_ran_out_before_it_was_picked_up(impl: Any) -> None:
    """The handed lease runs out while the woken claim has not returned yet,
    and another claim takes the message (attempt 2): the late claim still
    returns its lease, which is no longer current; an interrupted one gives
    nothing back (there is nothing of its delivery left)."""
    clock = ManualClock()
    t = impl.InMemoryTransport(clock=clock)
    late = t._waiter("late", 1.0, 0, lambda: None)
    interrupted = t._waiter("interrupted", 1.0, 0, lambda: None)
    assert t._wait_start(late) is None and t._wait_start(interrupted) is None
    start = clock.now
    t.publish("g", "e")
    t.publish("h", "f")
    clock.advance(2.0)
    again = [t.claim("other", 30.0), t.claim("other", 30.0)]
    assert [(x.group_id, x.attempt) for x in again] == [("g", 2), ("h", 2)]
    stale = t._wait_end(late, True)
    assert _fields(stale) == (1, "g", "late", start + 1.0, 1)
    with pytest.raises(LeaseLost):
        t.ack(stale)
    assert t._wait_end(interrupted, False) is None
    assert t.stats().leased == 2
    for x in again:
        t.ack(x)  # current: neither late claim touched them
    assert len(t) == 0


def test_a_direct_hand_off_arms_the_expiry_timer_for_the_claims_still_waiting(impl: Any) -> None:
    """Its lease is a lock that a claim still waiting gets when it expires:
    the expiry timer is armed for it (``_timer_due``), as after any hand-off."""
    clock = ManualClock()
    t = impl.InMemoryTransport(clock=clock)
    first, _ = _queued(t, "first")
    second, woken_second = _queued(t, "second")
    assert t._timer_due()[0] == math.inf
    t.publish("g", "e")
    assert t._timer_due()[0] == clock.now + 30.0
    lease = t._wait_end(first, True)
    clock.advance(31.0)
    t.stats()  # expires it: the second claim gets "g", attempt 2
    assert woken_second == [1]
    assert _fields(t._wait_end(second, True)) == (1, "g", "second", clock.now + 30.0, 2)
    with pytest.raises(LeaseLost):
        t.ack(lease)


class _FailingDict(dict):  # type: ignore[type-arg]
    """A table whose next insertion runs out of memory."""

    def __setitem__(self, key: Any, value: Any) -> None:
        raise MemoryError("injected")


@pytest.mark.parametrize(("fails", "level_exists", "spares"), [
    ("_Level", False, False), ("_Group", False, False), ("_Group", True, False),
    ("heappush", False, True), ("heappush", True, True), ("heappush", False, False),
    ("group-table", False, True), ("group-table", True, False), ("level-table", False, True),
])
def test_a_direct_hand_off_out_of_memory_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, fails: str, level_exists: bool, spares: bool
) -> None:
    """The pure twin's direct hand-off allocates before it changes anything,
    whether it takes the records a waiting claim made beforehand (``spares``)
    or makes its own: whichever allocation fails, the publish raises
    MemoryError, its sequence number is free again, the claim still waits,
    the event is not kept, and the transport is the same as one where the
    publish never happened."""
    import gc
    import weakref

    impl = importlib.import_module("leasequeue._backends.inmemory.transport_py")
    clock, ref_clock = ManualClock(), ManualClock()
    t, ref = impl.InMemoryTransport(clock=clock), impl.InMemoryTransport(clock=ref_clock)
    for r in (t, ref):
        if level_exists:
            r.publish("x", "held", priority=3)
            r.claim("holder", 1000.0)  # priority 3's level exists, nothing is ready
    rec, woken = _queued(t, "w")
    assert (t._spare is not None, t._spare_level is not None) == (True, True)  # made by the waiting claim
    if not spares:
        t._spare = t._spare_level = None
    tables = {"group-table": "_groups", "level-table": "_levels"}
    if fails in tables:
        setattr(t, tables[fails], _FailingDict(getattr(t, tables[fails])))
    else:
        def failing(*args: Any) -> Any:
            raise MemoryError("injected")

        monkeypatch.setattr(impl, fails, failing)

    class Event:
        pass

    event = Event()
    gone = weakref.ref(event)
    with pytest.raises(MemoryError):
        t.publish("g", event, priority=3)
    monkeypatch.undo()
    if fails in tables:
        setattr(t, tables[fails], dict(getattr(t, tables[fails])))
    del event
    gc.collect()
    assert gone() is None, "the failed publish kept its event"
    assert woken == [] and t._waiting_count() == 1 and rec.state == 1  # still waiting
    assert sorted(t._levels) == ([3] if level_exists else [])
    assert t.stats() == ref.stats() and len(t) == len(ref)
    seq = 2 if level_exists else 1
    assert t.publish("g", "e", priority=3) == seq  # the number was given back
    assert woken == [1]
    assert _fields(t._wait_end(rec, True)) == (seq, "g", "w", clock.now + 30.0, 1)
    ref.publish("g", "e", priority=3)
    ref.claim("w", 30.0)
    assert t.stats() == ref.stats()
    assert fingerprint(t, clock) == fingerprint(ref, ref_clock)


def test_direct_hand_offs_keep_the_expiry_heap_bounded() -> None:
    """White box, pure twin: a direct hand-off pushes an expiry entry
    without compacting the heap (off the wake-up path); the claim that
    waits compacts it before it does.  Workers waiting on an empty queue,
    publish after publish: the stale entries of the acked leases do not
    pile up."""
    impl = importlib.import_module("leasequeue._backends.inmemory.transport_py")
    t = impl.InMemoryTransport(clock=ManualClock())
    sizes = []
    for i in range(500):
        rec, woken = _queued(t, "w")
        t.publish(f"g{i % 3}", i)
        assert woken == [1]
        t.ack(t._wait_end(rec, True))
        sizes.append(len(t._expiry))
    assert max(sizes) <= 65 and t._live_expiry == 0
    assert sizes[-1] < sizes[63], "the heap was never compacted"


def test_a_new_group_is_not_handed_over_straight_while_a_ready_group_waits_for_a_serving(impl: Any) -> None:
    """A group can be ready while claims wait when the serving that should
    have handed it over could not read the clock (an ack here: it hands
    nothing over and leaves it to the expiry timer, whose clock fails too).
    A publish creating a group then serves both, in claim order -- the new
    group (never claimed) to the first claim, the ready one to the second --
    instead of handing only its own group over and leaving the second claim
    asleep next to a claimable message."""
    clock = ManualClock()
    failing = [False]

    def flaky() -> float:
        if failing[0] or threading.current_thread().name == "leasequeue-expiry-timer":
            raise OSError("clock unavailable")
        return clock()

    t = impl.InMemoryTransport(clock=flaky)
    t.publish("a", "a1")
    t.publish("a", "a2")
    held = t.claim("x", 30.0)
    first, woken_first = _queued(t, "first")
    second, woken_second = _queued(t, "second")
    failing[0] = True
    t.ack(held)  # "a2" is ready; the serving could not read the clock
    failing[0] = False
    assert (woken_first, woken_second) == ([], []) and t._waiting_count() == 2  # (group() would serve)
    t.publish("g", "e")
    assert (woken_first, woken_second) == ([1], [1]) and t._waiting_count() == 0
    got = [_fields(t._wait_end(rec, True))[:3] for rec in (first, second)]
    assert got == [(3, "g", "first"), (2, "a", "second")]
