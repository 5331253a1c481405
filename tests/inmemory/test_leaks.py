"""Leaks (issue 6): references and memory return to where they were.

* After ``ack`` the transport holds no reference to the event (weakref), in
  every way a delivery can end, and also while its group stays alive.
* ``sys.getrefcount`` of events, group ids, worker ids and priorities comes
  back to its baseline, also on the error paths.
* Traced memory (tracemalloc) stays flat over 10^5 publish+claim+ack cycles
  and over cycles of retries, group churn and failing calls.
* The group table shrinks back once 100k groups have drained.

No timing assertions anywhere; the long (10^6 cycles, RSS) version is
``tools/soak.py --leak-cycles 1000000``.
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any, Callable, Iterator

import pytest

from helpers import Event, fresh
from leasequeue.testing import ManualClock

from leasequeue import LeaseLost

# CPython's allocation tracer; PyPy has no _tracemalloc.
tracemalloc = pytest.importorskip("tracemalloc", reason="tracemalloc is not available on this interpreter")



# -- weakref: the transport lets go of the event ------------------------------


def _plain(t: Any, clock: ManualClock) -> None:
    t.ack(t.claim("w", 10))


def _after_nack(t: Any, clock: ManualClock) -> None:
    t.nack(t.claim("w", 10))
    t.ack(t.claim("w", 10))


def _after_park(t: Any, clock: ManualClock) -> None:
    t.nack(t.claim("w", 10), 5)
    clock.advance(6)
    t.ack(t.claim("w", 10))


def _via_old_lease_after_extend(t: Any, clock: ManualClock) -> None:
    lease = t.claim("w", 10)
    t.extend(lease, 10)
    t.ack(lease)


def _after_crash_and_redelivery(t: Any, clock: ManualClock) -> None:
    stale = t.claim("w", 10)
    clock.advance(11)
    t.ack(t.claim("w2", 10))
    with pytest.raises(LeaseLost):
        t.ack(stale)


def _expired_then_acked(t: Any, clock: ManualClock) -> None:
    lease = t.claim("w", 10)
    clock.advance(11)
    t.stats()  # observes the expiry
    t.ack(lease)


ENDINGS = [_plain, _after_nack, _after_park, _via_old_lease_after_extend, _after_crash_and_redelivery,
           _expired_then_acked]


@pytest.mark.parametrize("ending", ENDINGS, ids=[f.__name__.strip("_") for f in ENDINGS])
@pytest.mark.parametrize("group_survives", [False, True], ids=["group-drained", "group-survives"])
def test_no_reference_to_event_after_ack(
    transport: Any, clock: ManualClock, ending: Callable[[Any, ManualClock], None], group_survives: bool
) -> None:
    event = Event()
    ref = weakref.ref(event)
    transport.publish("g", event)
    if group_survives:
        transport.publish("g", Event(2))  # the group, and its message list, live on
    del event
    ending(transport, clock)
    # every lease was a temporary: no cycle to collect, so no gc.collect()
    assert ref() is None, "the transport still references the acked event"
    assert len(transport) == (1 if group_survives else 0)


def test_no_reference_to_events_after_transport_dies(make_transport: Callable[..., Any]) -> None:
    clock = ManualClock()
    t = make_transport(clock=clock)
    events = [Event(i) for i in range(50)]
    refs = [weakref.ref(e) for e in events]
    for i, e in enumerate(events):
        t.publish(f"g{i % 7}", e)
    t.nack(t.claim("w", 10), 100)  # one parked
    t.claim("w", 10)  # one leased, lease dropped
    del events, e
    assert all(r() is not None for r in refs)
    del t
    gc.collect()
    assert all(r() is None for r in refs)


# -- sys.getrefcount returns to baseline --------------------------------------


def test_refcounts_return_to_baseline(transport: Any, clock: ManualClock) -> None:
    event = Event()
    group = fresh("group")
    worker = fresh("worker")
    priority = 2**40 + 12345  # not a cached small int
    before = [sys.getrefcount(x) for x in (event, group, worker, priority)]
    transport.publish(group, event, priority)
    transport.publish(group, Event(1))
    lease = transport.claim(worker, 10)
    assert lease.event is event
    lease2 = transport.extend(lease, 20)
    transport.nack(lease2, 0)
    lease = transport.claim(worker, 10)
    transport.nack(lease, 3)
    clock.advance(4)
    lease = transport.claim(worker, 10)
    transport.ack(lease)
    del lease, lease2
    # the group still exists (one message left): drain it
    transport.ack(transport.claim("other", 10))
    assert len(transport) == 0
    after = [sys.getrefcount(x) for x in (event, group, worker, priority)]
    assert after == before, "(event, group id, worker id, priority) refcounts"


def test_refcounts_unchanged_by_failing_calls(transport: Any, impl: Any, clock: ManualClock) -> None:
    event = Event()
    group = fresh("group")
    worker = fresh("worker")
    transport.publish(group, event)
    lease = transport.claim(worker, 10)
    before = [sys.getrefcount(x) for x in (event, group, worker, lease)]
    forged = impl.Lease(lease.seq, group, event, worker, lease.expires_at, lease.attempt)
    for _ in range(100):
        with pytest.raises(TypeError):
            transport.publish(12345, event)
        with pytest.raises(TypeError):
            transport.publish(group, event, "high")
        with pytest.raises(ValueError):
            transport.claim(worker, -1.0)
        with pytest.raises(LeaseLost):
            transport.ack(forged)
        with pytest.raises(LeaseLost):
            transport.extend(forged, 10)
        with pytest.raises(ValueError):
            transport.nack(lease, float("nan"))
    del forged
    assert [sys.getrefcount(x) for x in (event, group, worker, lease)] == before
    transport.ack(lease)


def test_str_subclass_ids_not_retained(transport: Any) -> None:
    class Name(str):
        pass

    group, worker = Name(fresh("g")), Name(fresh("w"))
    event = Event()
    before = [sys.getrefcount(x) for x in (group, worker, event)]
    transport.publish(group, event)
    lease = transport.claim(worker, 10)
    # the transport and the lease hold exact-str copies, never the subclass objects
    assert [sys.getrefcount(x) for x in (group, worker)] == before[:2]
    transport.ack(lease)
    del lease
    assert [sys.getrefcount(x) for x in (group, worker, event)] == before


# -- tracemalloc: flat over many cycles ----------------------------------------


@pytest.fixture
def traced() -> Iterator[Callable[[], int]]:
    """Start tracemalloc; yields a function returning the traced bytes now (after gc)."""
    tracemalloc.start()

    def now() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    try:
        yield now
    finally:
        tracemalloc.stop()


def _cycles_same_group(t: Any, clock: ManualClock, n: int) -> None:
    # a standing backlog keeps the group alive: message slots are reused
    for _ in range(n):
        t.publish("g", Event())
        t.ack(t.claim("w", 10))


def _cycles_fresh_groups(t: Any, clock: ManualClock, n: int) -> None:
    # every cycle creates a group and forgets it again
    for i in range(n):
        t.publish(f"group-{i}", Event(), i % 5)
        t.ack(t.claim("w", 10, 0))


def _cycles_retries(t: Any, clock: ManualClock, n: int) -> None:
    # the backlog stays under 100, as in the warm-up: only a per-cycle leak can grow
    for i in range(n):
        if len(t) < 100:
            t.publish(f"g{i % 50}", Event())
        lease = t.claim("w", 10)
        if lease is None:
            clock.advance(20)
            continue
        roll = i % 5
        if roll == 0:
            t.nack(t.extend(lease, 5), 0)
        elif roll == 1:
            t.nack(lease, 2)
        elif roll == 2:
            pass  # crash: it expires and comes back
        else:
            t.ack(lease)
        clock.advance(1)
    while len(t):  # drain, so the end state equals the start state
        clock.advance(20)
        lease = t.claim("w", 10)
        if lease is not None:
            t.ack(lease)


def _cycles_failing_calls(t: Any, clock: ManualClock, n: int) -> None:
    t.publish("g", Event())
    lease = t.claim("w", 10)
    t.nack(lease)
    for _ in range(n):
        try:
            t.ack(lease)  # stale
        except LeaseLost:
            pass
        try:
            t.claim("w", float("nan"))
        except ValueError:
            pass
        try:
            t.publish("g", Event(), 2**70)
        except OverflowError:
            pass
    t.ack(t.claim("w", 10))


CYCLES = [
    (_cycles_same_group, 100_000),
    (_cycles_fresh_groups, 30_000),
    (_cycles_retries, 30_000),
    (_cycles_failing_calls, 30_000),
]


@pytest.mark.parametrize("cycles, n", CYCLES, ids=[f.__name__.strip("_") for f, _ in CYCLES])
def test_traced_memory_flat(
    make_transport: Callable[..., Any], traced: Callable[[], int], cycles: Callable[..., None], n: int
) -> None:
    """After a warm-up, n more cycles leave traced memory where it was.

    The bound (32 KiB) is below one byte per cycle: any per-cycle leak of an
    object, however small, exceeds it.
    """
    clock = ManualClock()
    t = make_transport(clock=clock)
    t.publish("g", Event())  # "g" keeps one message throughout (a standing backlog)
    t.publish("g", Event())
    cycles(t, clock, 2000)  # warm-up: free lists, heaps and tables reach their size
    held = len(t)
    base = traced()
    cycles(t, clock, n)
    grown = traced() - base
    assert len(t) == held
    assert grown < 32 * 1024, f"traced memory grew by {grown} bytes over {n} cycles"


def test_message_storage_shrinks_after_backlog_drains(
    make_transport: Callable[..., Any], traced: Callable[[], int]
) -> None:
    """A burst of 100k messages in 10 groups, drained: storage returns near the baseline."""
    n = 100_000
    t = make_transport(clock=ManualClock())
    event = Event()
    base = traced()
    for i in range(n):
        t.publish(f"g{i % 10}", event)
    peak = traced() - base
    for _ in range(n):
        t.ack(t.claim("w", 10))
    assert len(t) == 0
    left = traced() - base
    print(f"{n} messages: +{peak} bytes while held, +{left} bytes after draining")
    assert peak > n * 8
    assert left < peak // 10, f"{left} of {peak} bytes still held after all {n} messages drained"


def test_group_table_shrinks_after_groups_drain(make_transport: Callable[..., Any], traced: Callable[[], int]) -> None:
    """100k groups published and drained: storage returns near the baseline."""
    n = 100_000
    clock = ManualClock()
    t = make_transport(clock=clock)
    names = [f"group-{i}" for i in range(n)]
    event = Event()
    base = traced()
    for i, name in enumerate(names):
        t.publish(name, event, i % 3)
    peak = traced() - base
    for _ in range(n):
        t.ack(t.claim("w", 10, -1))
    assert len(t) == 0 and t.stats().groups == 0
    left = traced() - base
    print(f"{n} groups: +{peak} bytes while held, +{left} bytes after draining")
    assert peak > n * 16  # the measurement sees the groups at all
    assert left < peak // 10, f"{left} of {peak} bytes still held after all {n} groups drained"
