"""The wake-up path of a publish with claims waiting (issue 23), on both twins.

The pure twin's ``publish`` serves waiting claims inside its own locked step
(``_publish_to_waiters``: the clock read first, outside the lock); the
Cython twin serves after it.  Observably they are the same: these tests pin
what could differ -- a clock that returns an ``int``, messages published by
user code run inside that locked step (a finaliser; a profiler hook stands
for it on the pure twin, and on the Cython twin, which runs no Python code
under its lock, the same publish is made right after).
Waiting claims are driven through the core's entry points (``_waiter`` /
``_wait_start`` / ``_wait_end``, see ``_waiting.py``), so the moments are
deterministic.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, List, Tuple

import pytest

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


@pytest.mark.parametrize("where", ["_add", "_hand_off"])
def test_a_message_published_inside_a_publish_goes_to_the_next_waiting_claim(impl: Any, where: str) -> None:
    """Two claims wait; ``publish("g")`` runs user code that publishes
    ``"h"`` in the middle of its locked step (while it adds ``g``'s
    message, or while it hands it over).  By the time the outer publish
    returns, the first waiting claim has ``g`` (seq 1) and the second
    ``h`` (seq 2), each woken once -- what a separate serving after the
    publish would have done."""
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
