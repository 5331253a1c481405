"""``ack_and_claim`` on the in-memory twins: what the kit's rules
(``leasequeue.testing._rules_ack_and_claim``) do not reach.

Conversions, the transport's time, the waiting claims it serves, its lease
used by every other call, random worker loops against ``ack`` + ``claim`` on
a twin, and ``MemoryError`` on each side of the ack (docs/decisions.md,
"ack_and_claim, pinned"): the Cython transport reserves first and runs no
Python function under its lock; the pure twin keeps the ack and returns
``None`` when the claim half runs out.
"""

from __future__ import annotations

import math
import random
import sys
import threading
import time
from typing import Any, List

import pytest

from helpers import fingerprint, lease_key
from leasequeue import LeaseLost
from leasequeue.testing import ManualClock

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def test_conversions_as_claim_makes_them(transport: Any) -> None:
    """A ``str`` subclass worker comes back an exact ``str``, an ``int``
    visibility a float sum, an ``int`` subclass floor is its ``int``, +inf
    and an int beyond float range never expire, ``-0.0`` is 0."""

    class Name(str):
        pass

    class Level(int):
        pass

    for i in range(6):
        transport.publish("g", i)
    lease = transport.claim("w", 30)
    lease = transport.ack_and_claim(lease, Name("worker"), 5, Level(0))
    assert type(lease.worker_id) is str and lease.worker_id == "worker"
    assert type(lease.expires_at) is float and lease.expires_at == 1005.0
    lease = transport.ack_and_claim(lease, "w", math.inf)
    assert lease.expires_at == math.inf
    lease = transport.ack_and_claim(lease, "w", 10**400)
    assert lease.expires_at == math.inf
    lease = transport.ack_and_claim(lease, "w", -0.0)
    assert lease.expires_at == 1000.0 and transport.stats().leased == 1  # expires_at == now: live
    assert transport.ack_and_claim(lease, "w", 1, min_priority=Level(1)) is None
    assert transport.stats() == (1, 1, 0, 0, 0, 0, 0)


def test_its_lease_is_a_lease_like_any(transport: Any, clock: ManualClock) -> None:
    """The lease it returns is current for ack, nack, extend, bury and
    another ack_and_claim; the one it acked is stale for all of them."""
    for i in range(4):
        transport.publish("g", i)
    first = transport.claim("w", 30)
    lease = transport.ack_and_claim(first, "w", 30)
    assert (lease.seq, lease.attempt) == (2, 1)
    for call in (transport.ack, transport.nack, lambda x: transport.extend(x, 5), transport.bury,
                 lambda x: transport.ack_and_claim(x, "w", 30)):
        with pytest.raises(LeaseLost):
            call(first)
    longer = transport.extend(lease, 100)
    transport.nack(longer)
    again = transport.claim("w", 30)
    assert (again.seq, again.attempt) == (2, 2)
    with pytest.raises(LeaseLost):
        transport.ack_and_claim(lease, "w", 30)  # attempt 1: stale now
    lease = transport.ack_and_claim(again, "w", 30)
    assert (lease.seq, lease.attempt) == (3, 1)
    transport.bury(lease, "poison")
    assert transport.group("g").state == "buried"


def test_a_buried_delivery_is_not_current(transport: Any) -> None:
    transport.publish("g", "g1")
    transport.publish("g", "g2")
    lease = transport.claim("w", 30)
    transport.bury(lease)
    with pytest.raises(LeaseLost):
        transport.ack_and_claim(lease, "w", 30)
    assert transport.group("g").state == "buried" and len(transport) == 2


def test_the_transports_time_never_runs_back(transport: Any, clock: ManualClock) -> None:
    """The claim half acts at ``max(clock(), the latest time used)``."""
    for group in ("g", "h"):
        transport.publish(group, group + "1")
        transport.publish(group, group + "2")
    lease = transport.claim("w", 100)
    clock.advance(50)
    assert transport.stats().leased == 1  # the time is 1050 now
    clock.set(1000.0)  # the clock turns back
    lease = transport.ack_and_claim(lease, "w", 10)
    assert (lease.group_id, lease.expires_at) == ("h", 1060.0)
    assert transport.group("h").last_claimed_at == 1050.0


def test_a_paused_group_keeps_its_next_message(transport: Any) -> None:
    """The ack of a lease in a paused group: the group keeps its next
    message, not ready; the claim half serves another group."""
    transport.publish("p", "p1")
    transport.publish("p", "p2")
    transport.publish("q", "q1")
    lease = transport.claim("w", 30)
    transport.pause("p")
    got = transport.ack_and_claim(lease, "w", 30)
    assert got is not None and got.group_id == "q"
    assert transport.ack_and_claim(got, "w", 30) is None
    info = transport.group("p")
    assert (info.state, info.messages, info.head_seq) == ("paused", 1, 2)
    transport.resume("p")
    assert transport.claim("w", 30).seq == 2


def test_an_emptied_paused_group_is_kept(transport: Any) -> None:
    transport.publish("p", "p1")
    lease = transport.claim("w", 30)
    transport.pause("p")
    assert transport.ack_and_claim(lease, "w", 30) is None
    assert transport.stats() == (0, 0, 0, 0, 1, 0, 0)
    assert transport.group("p").state == "paused"


def test_the_timer_and_a_waiting_claim_see_the_expiry_it_applied(transport_cls: Any) -> None:
    """With waiting claims, ack_and_claim serves them at its own ``now``:
    the time it read, not a second reading.  The expiry timer reads the
    clock on its own schedule (a loaded machine may start it late, after
    the clock moved): its readings are not the operation's, so they are
    not counted."""
    reads: List[float] = []
    now = [1000.0]

    def clock() -> float:
        if threading.current_thread().name != "leasequeue-expiry-timer":
            reads.append(now[0])
        return now[0]

    t = transport_cls(clock=clock)
    for group in ("x", "y", "g"):
        t.publish(group, group)
    t.claim("w", 1000)
    t.claim("w", 1000)
    lease = t.claim("w", 1000)
    out: List[Any] = []
    waiter = threading.Thread(target=lambda: out.append(t.claim("waiter", 30, timeout=20.0)))
    waiter.start()
    deadline = time.monotonic() + 20
    while t._waiting_count() == 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    now[0] = 5000.0
    before = len(reads)
    got = t.ack_and_claim(lease, "w", 30)
    waiter.join(20)
    assert len(reads) == before + 1, "the waiting claims were served at a second clock reading"
    assert (got.group_id, got.attempt) == ("x", 2)
    assert out and (out[0].group_id, out[0].attempt, out[0].expires_at) == ("y", 2, 5030.0)
    t.close()


@pytest.mark.parametrize("seed", range(12))
def test_a_worker_loop_is_ack_then_claim(transport_cls: Any, seed: int) -> None:
    """Random histories, then worker loops through ``ack_and_claim`` on one
    transport and ``ack`` + ``claim`` on a twin: the same leases, the same
    state, at every step."""
    rng = random.Random(seed)
    clocks = [ManualClock(), ManualClock()]
    a, b = transport_cls(clock=clocks[0]), transport_cls(clock=clocks[1])
    events = [object() for _ in range(400)]
    leases: List[List[Any]] = [[], []]
    for step in range(400):
        roll = rng.random()
        group, priority, floor = f"g{rng.randrange(12)}", rng.choice([0, 0, 1, -1, 5]), rng.choice([0, 0, 1, -3])
        visibility = rng.choice([1, 5, 30, math.inf])
        if roll < 0.4:
            for t in (a, b):
                t.publish(group, events[step], priority)
        elif roll < 0.55:
            for t, held in zip((a, b), leases):
                held.append(t.claim("w", visibility, floor))
        elif roll < 0.65:
            step_seconds = rng.choice([0.5, 2, 10])
            for c in clocks:
                c.advance(step_seconds)
        elif leases[0]:
            k = rng.randrange(len(leases[0]))
            pair = leases[0][k], leases[1][k]
            if pair[0] is None:
                continue
            try:
                got = a.ack_and_claim(pair[0], "w", visibility, floor)
            except LeaseLost:
                got = "lost"
            try:
                b.ack(pair[1])
                expected = b.claim("w", visibility, floor)
            except LeaseLost:
                expected = "lost"
            assert (got == "lost") == (expected == "lost"), step
            if got != "lost":
                assert lease_key(got) == lease_key(expected), step
                leases[0].append(got)
                leases[1].append(expected)
        assert a.stats() == b.stats() and a.groups() == b.groups(), step
    assert fingerprint(a, clocks[0]) == fingerprint(b, clocks[1])


# -- MemoryError: a profiler hook raises it where the pure twin allocates -------


def _run_failing(t: Any, function: str, call: Any) -> Any:
    """``call()`` with ``MemoryError`` raised at the first call of the pure
    twin's ``function`` (as its first allocation failing would)."""
    module = type(t).__module__
    fired = [False]

    def hook(frame: Any, event: str, arg: Any) -> None:
        if (event == "call" and frame.f_code.co_name == function and not fired[0]
                and frame.f_globals.get("__name__") == module):
            fired[0] = True
            raise MemoryError(f"{function}'s first allocation")

    sys.setprofile(hook)
    try:
        return call()
    except MemoryError as exc:
        return exc
    finally:
        sys.setprofile(None)


def _pair(transport_cls: Any) -> Any:
    clocks = (ManualClock(), ManualClock())
    a, b = transport_cls(clock=clocks[0]), transport_cls(clock=clocks[1])
    events = [object() for _ in range(4)]
    held = []
    for t in (a, b):
        t.publish("g", events[0])
        t.publish("g", events[1])
        t.publish("h", events[2], 3)
        held.append(t.claim("w", 10))
    return a, b, clocks, held


@pytest.mark.parametrize("where", ["_advance", "_claim_next"])
def test_a_memory_error_in_the_claim_half_keeps_the_ack(impl: Any, where: str) -> None:
    """Pure twin: the ack stands and the call returns ``None`` (the claim
    found nothing), as ``claim_many`` ends its batch.  Cython: it reserved
    first and calls no Python function under its lock: the hook never fires."""
    a, b, clocks, (lease_a, lease_b) = _pair(impl.InMemoryTransport)
    got = _run_failing(a, where, lambda: a.ack_and_claim(lease_a, "w", 10))
    b.ack(lease_b)
    if impl.__name__.endswith("_py"):
        assert got is None, got
    else:
        expected = b.claim("w", 10)
        assert lease_key(got) == lease_key(expected)
    assert a.stats() == b.stats() and a.groups() == b.groups()
    assert fingerprint(a, clocks[0]) == fingerprint(b, clocks[1])


def test_a_memory_error_in_the_ack_half_changes_nothing(impl: Any) -> None:
    """Pure twin: the ack allocates first (its group's next message made
    ready), so a ``MemoryError`` there leaves the transport as it was, the
    lease still current.  Cython: nothing to fail."""
    a, b, clocks, (lease_a, lease_b) = _pair(impl.InMemoryTransport)
    got = _run_failing(a, "_make_ready", lambda: a.ack_and_claim(lease_a, "w", 10))
    if impl.__name__.endswith("_py"):
        assert isinstance(got, MemoryError), got
        assert a.stats() == b.stats() and a.groups() == b.groups()
        got = a.ack_and_claim(lease_a, "w", 10)  # the lease is still current
    b.ack(lease_b)
    assert lease_key(got) == lease_key(b.claim("w", 10))
    assert fingerprint(a, clocks[0]) == fingerprint(b, clocks[1])


def test_reentered_from_user_code_under_the_lock_is_refused(impl: Any) -> None:
    """Pure twin: user code that runs in the middle of ack_and_claim (a hook
    on its ``_settle``, as a finaliser the collector starts there would) gets
    ``RuntimeError`` from every call but ``publish``; the ack_and_claim
    itself is refused when it is the nested call.  Cython: no Python
    function runs under its lock."""
    t = impl.InMemoryTransport(clock=ManualClock())
    for i in range(3):
        t.publish("g", i)
    lease = t.claim("w", 10)
    seen: List[str] = []
    module = impl.__name__

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "_settle" and frame.f_globals.get("__name__") == module:
            sys.setprofile(None)
            for call in (t.stats, lambda: t.ack_and_claim(lease, "w", 10), lambda: t.claim("w", 1)):
                try:
                    call()
                    seen.append("ran")
                except RuntimeError as exc:
                    seen.append("refused" if "middle of another operation" in str(exc) else repr(exc))
                except LeaseLost:
                    seen.append("lost")
            seen.append(f"published {t.publish('nested', 'n')}")

    sys.setprofile(hook)
    try:
        got = t.ack_and_claim(lease, "w", 10)
    finally:
        sys.setprofile(None)
    if impl.__name__.endswith("_py"):
        assert seen == ["refused", "refused", "refused", "published 4"]
    else:
        assert seen == []
    assert (got.seq, got.attempt) == (2, 1)
    assert t.stats().messages == (3 if seen else 2)
