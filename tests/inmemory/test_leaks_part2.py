"""Leaks in the control plane and the batches (test_leaks.py's rules, issue 10).

The Cython transport moves references by hand in the new operations (the
events and ids a purge or an ack_many releases after its lock, the records
claim_many turns into leases, the worker ids ``group()`` reports), so
``sys.getrefcount`` of events, group ids and worker ids must come back to
its baseline, on the error paths too, and weak references must die.
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any, List

import pytest

from helpers import CPYTHON_ONLY_REASON, IS_CPYTHON, Event, fresh
from leasequeue.testing import ManualClock

pytestmark = pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)



def refcounts(objs: List[Any]) -> List[int]:
    gc.collect()
    return [sys.getrefcount(o) for o in objs]


def test_batches_release_events_ids_and_workers(transport_cls: Any) -> None:
    clock = ManualClock()
    t = transport_cls(clock=clock)
    gids = [fresh(f"g{i}") for i in range(20)]
    worker = fresh("w")
    events = [Event(i) for i in range(200)]
    refs = [weakref.ref(e) for e in events]
    watched = gids + [worker]
    before = refcounts(watched)
    for _ in range(3):
        seqs = t.publish_many([(gids[i % 20], e, i % 3) for i, e in enumerate(events)])
        assert len(seqs) == 200
        while leases := t.claim_many(worker, 10, 7):
            infos = t.groups()
            assert {i.worker_id for i in infos if i.state == "leased"} == {worker}
            del infos
            assert t.ack_many(leases + leases[:1]) == leases[:1]  # the duplicate is not current
            clock.advance(1)
        del leases, seqs
        assert len(t) == 0
    del events
    gc.collect()
    assert all(r() is None for r in refs), "the transport kept an event"
    assert refcounts(watched) == before


def test_control_plane_releases_everything(transport_cls: Any) -> None:
    clock = ManualClock()
    t = transport_cls(clock=clock)
    gids = [fresh(f"g{i}") for i in range(6)]
    worker = fresh("w")
    events = [Event(i) for i in range(60)]
    refs = [weakref.ref(e) for e in events]
    watched = gids + [worker]
    before = refcounts(watched)
    for i in range(60):
        t.publish(gids[i % 6], events[i])
    lease = t.claim(worker, 10)
    t.pause(gids[0])
    t.pause(gids[1])
    t.set_priority(gids[2], 5)
    t.nack(t.claim(worker, 10), 30)
    for g in gids:
        info = t.group(g)
        assert info is not None
    snapshot = t.groups()
    assert t.purge(gids[0]) == 10  # with the lease
    assert t.purge(gids[3]) == 10
    for g in gids:
        t.resume(g)
    del lease, info, snapshot
    for g in gids:
        t.purge(g)
    t.pause(gids[5])  # an empty paused group, forgotten by resume
    t.resume(gids[5])
    assert len(t) == 0 and t.groups() == []
    del g  # the loops' variable
    del events
    gc.collect()
    assert all(r() is None for r in refs), "the transport kept an event"
    print("DBG", [(type(r).__name__, str(r)[:300]) for r in gc.get_referrers(worker)])
    assert refcounts(watched) == before


def test_failed_calls_leave_no_references(transport_cls: Any) -> None:
    t = transport_cls(clock=ManualClock())
    gid = fresh("g")
    event = Event()
    watched = [gid, event]
    base = refcounts(watched)
    t.publish(gid, event)
    lease = t.claim("w", 10)
    held = [gid, event, lease]
    before = refcounts(held)
    for bad in (
        lambda: t.publish_many([(gid, event), (gid, event, 2**63)]),
        lambda: t.publish_many([(gid, event), [gid, event]]),
        lambda: t.claim_many(gid, 10, -1),
        lambda: t.ack_many([lease, None]),
        lambda: t.set_priority(gid, 1.5),
    ):
        with pytest.raises((TypeError, ValueError, OverflowError)):
            bad()
    assert refcounts(held) == before
    del held
    t.nack(lease)
    lease = None
    (again,) = t.claim_many("w", 10, 1)
    assert again.event is event
    t.ack_many([again])
    del again
    assert refcounts(watched) == base
