"""Memory stays bounded under churn that leaves stale bookkeeping behind.

Both implementations: a lease that keeps expiring and being extended while
another group waits makes its group enter and leave the ready set over and
over; the transport's memory must not grow with the number of rounds.  The
same for a group paused and resumed over and over after many claims that
each dropped a stale entry (those drops must be counted exactly).
"""

from __future__ import annotations

from typing import Any

import pytest

from leasequeue.testing import ManualClock

# CPython's allocation tracer; PyPy has no _tracemalloc.
tracemalloc = pytest.importorskip("tracemalloc", reason="tracemalloc is not available on this interpreter")


def _rounds(t: Any, clock: ManualClock, lease: Any, n: int) -> Any:
    for _ in range(n):
        clock.advance(2.0)
        # the expired lease's group becomes ready again; the floor skips it
        assert t.claim("w", 1.0, min_priority=1) is None
        lease = t.extend(lease, 1.0)  # ... and it leaves the ready set again
    return lease


def test_expire_extend_churn_does_not_grow_memory(make_transport: Any) -> None:
    clock = ManualClock()
    t = make_transport(clock=clock)
    t.publish("G", "g")
    lease = t.claim("w", 1.0)
    t.publish("X", "x")  # a second ready group, ahead of G in its heap
    lease = _rounds(t, clock, lease, 2_000)  # warm up: let structures reach size
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        lease = _rounds(t, clock, lease, 20_000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 20k rounds that each leaked one heap entry would hold over 1 MB
    assert grown < 64 * 1024, f"memory grew by {grown} bytes over 20k rounds"
    # and the transport still works: both groups are served, nothing lost
    t.ack(lease)
    assert t.claim("w", 1.0).event == "x"
    assert len(t) == 1


def _claim_round(t: Any) -> None:
    """Groups A and B, A ahead: B leaves and re-enters the ready set (pause,
    resume), then A and B are each claimed and acked (each gets a new message
    first, so both stay, A ahead again).  The claim of B finds B's older heap
    entry behind it, stale, and drops it."""
    t.pause("B")
    t.resume("B")
    for group in ("A", "B"):
        lease = t.claim("w", 60.0)
        assert lease.group_id == group
        t.publish(group, 0)
        t.ack(lease)


def _expired_round(t: Any, clock: ManualClock, end: str) -> None:
    """Group A alone: its lease expires, a claim that takes nothing sees the
    expiry (A is ready again), then the expired lease is acked or nacked
    (accepted: nobody claimed A since), which must not put A into the ready
    set a second time."""
    lease = t.claim("w", 1.0)
    assert lease.group_id == "A"
    clock.advance(2.0)
    assert t.claim("w", 1.0, min_priority=1) is None
    if end == "ack":
        t.publish("A", 0)
        t.ack(lease)
    else:
        t.nack(lease)


def _pause_resume(t: Any, n: int, group: str = "B") -> None:
    for _ in range(n):
        t.pause(group)  # ready behind the other group: it leaves the ready set (lazily) ...
        t.resume(group)  # ... and comes back with the same round-robin key


@pytest.mark.parametrize("before", ["claims", "expired-acks", "expired-nacks"])
def test_pause_resume_churn_after_many_claims_does_not_grow_memory(make_transport: Any, before: str) -> None:
    """The stale heap entries that claims drop must be counted out exactly (and
    a group never be in the ready set twice): after 20k claims that each
    dropped one (or acks or nacks of expired leases whose group was ready
    again), 20k pause/resume rounds of a ready group (each leaving one more
    stale entry behind) keep memory bounded, as they do on a fresh transport."""
    clock = ManualClock()
    t = make_transport(clock=clock)
    if before == "claims":
        for group in ("A", "B"):
            t.publish(group, 0)
        for _ in range(20_000):
            _claim_round(t)
        churned = "B"
    else:
        t.publish("A", 0)
        for _ in range(20_000):
            _expired_round(t, clock, before[8:-1])
        t.publish("B", 0)  # never claimed: ahead of A
        churned = "A"
    assert sorted(g.group_id for g in t.groups()) == ["A", "B"]
    _pause_resume(t, 2_000, churned)  # warm up
    tracemalloc.start()
    try:
        before_bytes = tracemalloc.get_traced_memory()[0]
        _pause_resume(t, 20_000, churned)
        grown = tracemalloc.get_traced_memory()[0] - before_bytes
    finally:
        tracemalloc.stop()
    # 20k rounds that each kept one more heap entry would hold over 1 MB
    assert grown < 64 * 1024, f"memory grew by {grown} bytes over 20k rounds"
    # and the transport still works: both groups are served, nothing lost
    leases = [t.claim("w", 60.0), t.claim("w", 60.0)]
    assert sorted(lease.group_id for lease in leases) == ["A", "B"] and t.claim("w", 60.0) is None
    assert len(t) == 2


def _fed_rounds(t: Any, n: int) -> None:
    for _ in range(n):
        t.publish("G", None)  # the producer keeps the group's backlog steady ...
        t.ack(t.claim("w", 60.0))  # ... as a worker takes its oldest message


@pytest.mark.parametrize("backlog", [1, 40])
def test_a_group_fed_as_fast_as_it_is_drained_does_not_grow_memory(make_transport: Any, backlog: int) -> None:
    """A group that never empties (a long-running workflow whose producer
    keeps pace with its workers) must not keep a slot for every message it
    ever held: after 20k messages through it, with a backlog of 1 or of 40
    behind the one leased, memory is what it was."""
    t = make_transport(clock=ManualClock())
    for _ in range(backlog):
        t.publish("G", None)
    _fed_rounds(t, 2_000)  # warm up
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _fed_rounds(t, 20_000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 20k messages that each kept an 8-byte slot would hold 160 kB
    assert grown < 64 * 1024, f"memory grew by {grown} bytes over 20k messages"
    assert len(t) == backlog and t.stats().groups == 1


def _drain(t: Any) -> None:
    while (lease := t.claim("w", 60.0)) is not None:
        t.ack(lease)


def test_a_drained_backlog_of_many_groups_gives_its_memory_back(make_transport: Any) -> None:
    """A dict never gives memory back when entries are deleted: after a
    backlog of 50k groups drained, the transport's table of groups must be
    copied into one sized for what is left, or it keeps megabytes for good."""
    t = make_transport(clock=ManualClock())
    t.publish("warm", None)
    _drain(t)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(50_000):
            t.publish("g%d" % i, None)
        full = tracemalloc.get_traced_memory()[0] - before
        _drain(t)
        left = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert full > 1_000_000, full  # the backlog did take memory
    # an unshrunk table for 50k groups holds over 1 MB
    assert left < 256 * 1024, f"{left} bytes still held after the backlog drained"
    assert len(t) == 0 and t.stats().groups == 0
