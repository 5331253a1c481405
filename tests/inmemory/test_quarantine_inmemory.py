"""The quarantine's in-memory specifics, on both implementations.

The rules themselves are the kit's (``TransportContract``, run by
``test_contract_inmemory.py``); here is what only an in-memory transport
can show: references (a bury reason, a skipped event, peeked events) are
released exactly, a skipped event's finaliser runs outside the lock and may
call back into the transport, a group that bury/skip/resume/purge pass
through many times leaves nothing behind, and ``repr`` counts buried groups.
"""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any, Callable, List

import pytest

from leasequeue.testing import ManualClock


class Reason(str):
    """A ``str`` subclass: the transport keeps an exact copy, never this object."""


def test_reason_references_are_released(make_transport: Callable[..., Any]) -> None:
    t = make_transport(clock=ManualClock())
    reason = "".join(["poison ", "message"])  # a fresh object, counted alone
    baseline = sys.getrefcount(reason)
    for lift in ("resume", "skip", "purge"):
        t.publish("g", "e")
        t.bury(t.claim("w", 30), reason)
        assert sys.getrefcount(reason) == baseline + 1  # the transport holds it, once
        assert t.group("g").reason is reason
        getattr(t, lift)("g")
        if lift == "resume":
            t.ack(t.claim("w", 30))
        gc.collect()
        assert sys.getrefcount(reason) == baseline, lift
    subclassed = Reason("why")
    t.publish("h", "e")
    t.bury(t.claim("w", 30), subclassed)
    kept = t.group("h").reason
    assert type(kept) is str and kept == "why" and sys.getrefcount(subclassed) == 2  # ours and the call's


def test_skipped_and_peeked_events_are_released(make_transport: Callable[..., Any]) -> None:
    t = make_transport(clock=ManualClock())
    events = [["e", i] for i in range(4)]
    baseline = [sys.getrefcount(e) for e in events]
    for i in range(4):
        t.publish("g", events[i])
    peeked = t.peek("g", 10)
    assert [m.event for m in peeked] == events and all(m.event is e for m, e in zip(peeked, events))
    del peeked
    assert [sys.getrefcount(e) for e in events] == [b + 1 for b in baseline]
    assert t.skip("g") is True and t.skip("g") is True
    lease = t.claim("w", 30)
    t.bury(lease)
    del lease
    assert t.skip("g") is True and t.skip("g") is True
    assert t.group("g") is None and len(t) == 0
    gc.collect()
    assert [sys.getrefcount(e) for e in events] == baseline


class PublishesWhenDropped:
    """An event whose finaliser publishes to the transport that dropped it."""

    def __init__(self, transport: Any, log: List[Any]) -> None:
        self.transport = transport
        self.log = log

    def __del__(self) -> None:
        try:
            self.log.append(self.transport.publish("next", "step"))
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.log.append(exc)


def test_a_skipped_events_finaliser_runs_outside_the_lock(make_transport: Callable[..., Any]) -> None:
    """skip drops the transport's last reference to the removed event after
    its lock: the event's ``__del__`` may publish to the same transport."""
    t = make_transport(clock=ManualClock())
    log: List[Any] = []
    t.publish("g", PublishesWhenDropped(t, log))
    t.publish("g", "second")
    done = threading.Event()

    def skip() -> None:
        assert t.skip("g") is True
        done.set()

    thread = threading.Thread(target=skip, daemon=True)
    thread.start()
    thread.join(20)
    assert done.is_set(), "skip deadlocked on the finaliser's publish"
    assert log == [3]  # published, with the next seq, from inside __del__
    assert [m.event for m in t.peek("g")] == ["second"] and t.group("next").messages == 1


def test_a_group_buried_and_lifted_many_times_leaves_nothing_behind(make_transport: Callable[..., Any]) -> None:
    """Thousands of groups through bury and resume / skip / purge, with
    storage growing and shrinking under them: in the end nothing is held,
    and a fresh group works."""
    t = make_transport(clock=ManualClock())
    for round in range(3):
        names = [f"r{round}-g{i}" for i in range(3000)]
        for name in names:
            t.publish(name, name)
            t.publish(name, name + "-2")
        for _ in names:
            t.bury(t.claim("w", 30), "x")
        assert t.stats().buried == len(names)
        for i, name in enumerate(names):
            how = i % 3
            if how == 0:
                assert t.resume(name) is True
            elif how == 1:
                assert t.skip(name) is True
            else:
                assert t.purge(name) == 2
        assert t.stats().buried == 0
        while (lease := t.claim("w", 30)) is not None:
            t.ack(lease)
        assert len(t) == 0 and t.groups() == [] and tuple(t.stats()) == (0, 0, 0, 0, 0, 0, 0)
    t.publish("fresh", 1)
    assert t.peek("fresh") and t.claim("w", 30).group_id == "fresh"


def test_repr_counts_buried_groups(make_transport: Callable[..., Any]) -> None:
    t = make_transport(clock=ManualClock())
    t.publish("g", "e")
    assert "buried" not in repr(t)
    t.bury(t.claim("w", 30))
    assert repr(t).endswith("messages=1 groups=1 buried=1>")
    t.resume("g")
    assert repr(t).endswith("messages=1 groups=1>")


@pytest.mark.parametrize("count", [0, 1, 3, 2**63 - 1, 2**63, 2**70])
def test_peek_counts_at_the_int64_ends(make_transport: Callable[..., Any], count: int) -> None:
    t = make_transport(clock=ManualClock())
    for i in range(3):
        t.publish("g", i)
    assert [m.seq for m in t.peek("g", count)] == [1, 2, 3][:count]


def test_bury_skip_and_peek_refuse_user_code_nested_in_an_operation() -> None:
    """White box, pure twin: user code that runs inside an operation (a
    finaliser the garbage collector runs there) may only publish; bury, skip
    and peek raise RuntimeError and change nothing, as every other call does
    (the profiler-hook test gets there for real; a tracer cannot see it)."""
    from leasequeue._backends.inmemory.transport_py import InMemoryTransport

    t = InMemoryTransport(clock=ManualClock())
    t.publish("g", "e")
    lease = t.claim("w", 30.0)
    before = (t.stats(), t.groups())
    t._busy = True  # as inside an operation
    try:
        for name, call in (("bury", lambda: t.bury(lease, "r")), ("skip", lambda: t.skip("g")),
                           ("peek", lambda: t.peek("g"))):
            with pytest.raises(RuntimeError, match=name):
                call()
    finally:
        t._busy = False
    assert (t.stats(), t.groups()) == before
    t.ack(lease)
