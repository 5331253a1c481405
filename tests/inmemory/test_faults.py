"""Faults and hostile input (issue 6): the transport stays consistent and loses nothing.

After every fault the transport is checked with ``assert_intact``: ``len``
and ``stats()`` agree with what was published and acked, and every message
still held can be claimed and acked, with its own event, exactly once.

The row-by-row bad-input table and the single-call "a bad clock changes
nothing" checks live in the conformance kit (``leasequeue.testing``, run by
test_contract_inmemory.py); this file covers
faults under concurrency, ``KeyboardInterrupt``, ``MemoryError``, finalisers
and other user code that re-enters the transport, and hostile subclasses.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import subprocess
import sys
import textwrap
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from helpers import (
    CPYTHON_ONLY_REASON,
    IS_CPYTHON,
    collect_during,
    collector_restored,
    finaliser_outcome,
    fingerprint,
    package_root,
    python_argv,
    transport_child,
)
from leasequeue.testing import ManualClock

from leasequeue import LeaseLost

try:  # CPython's test hooks: fail the n-th memory allocation from now
    from _testcapi import remove_mem_hooks, set_nomemory
except ImportError:  # PyPy, or a distribution without the test modules
    set_nomemory = remove_mem_hooks = None

UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")



class Boom(Exception):
    """The error a faulty clock raises."""


class FaultyClock:
    """A clock that can be told to misbehave: raise, NaN, a non-number, go backwards."""

    #: The error each injected fault must cause (the transport validates the clock's value).
    ERRORS = {"raise": Boom, "nan": ValueError, "text": TypeError, "none": TypeError}

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.mode = "ok"
        self.rng = random.Random(6)
        self.lock = threading.Lock()
        self.local = threading.local()  # .fault: what this thread's last read injected

    def injected(self) -> Optional[str]:
        """The fault this thread's clock reads injected since ``forget``, if any."""
        return getattr(self.local, "fault", None)

    def forget(self) -> None:
        self.local.fault = None

    def __call__(self) -> Any:
        mode = self.mode
        if mode == "ok":
            return self.now
        if mode == "raise":
            raise Boom("clock broke")
        if mode == "interrupt":
            raise KeyboardInterrupt
        if mode == "random":
            with self.lock:
                roll = self.rng.random()
                self.now += 0.5
                now = self.now
                back = self.rng.uniform(0, 50)
            fault = "raise" if roll < 0.05 else "nan" if roll < 0.10 else "text" if roll < 0.15 else \
                "none" if roll < 0.20 else None
            self.local.fault = fault
            if fault == "raise":
                raise Boom("clock broke")
            if fault == "nan":
                return math.nan
            if fault == "text":
                return "noon"
            if fault == "none":
                return None
            if roll < 0.35:
                return now - back  # backwards
            return now
        raise AssertionError(mode)


def run_with_deadline(target: Callable[[], Any], seconds: float = 20.0) -> Any:
    """Run ``target`` in a daemon thread and return its result; fail on deadlock instead of hanging."""
    box: Dict[str, Any] = {}

    def wrapper() -> None:
        try:
            box["value"] = target()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            box["error"] = exc

    thread = threading.Thread(target=wrapper, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "deadlock: the operation never returned"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def assert_intact(t: Any, clock: Any, held: Dict[int, Any], groups: Optional[int] = None) -> None:
    """``held`` maps every message the transport should hold (seq -> event).

    Checks ``len``/``stats``, then claims and acks everything: each held
    message exactly once, with its own event, and nothing else.
    """
    clock.mode = "ok"
    assert len(t) == len(held)
    stats = t.stats()
    assert stats.messages == len(held)
    if groups is not None:
        assert stats.groups == groups
    clock.now = getattr(clock, "now", 0.0) + 10**9  # every finite lease and park has run out
    seen: List[int] = []
    while True:
        lease = run_with_deadline(lambda: t.claim("drain", 10.0, -(2**63)))
        if lease is None:
            break
        assert lease.seq in held and lease.event is held[lease.seq], lease
        seen.append(lease.seq)
        t.ack(lease)
    assert sorted(seen) == sorted(held), "messages lost or delivered twice"
    assert len(t) == 0 and tuple(t.stats()) == (0, 0, 0, 0, 0, 0, 0)


def snapshot(t: Any) -> tuple:
    return (len(t), tuple(t.stats()))


# -- faults under concurrency ---------------------------------------------------


def test_clock_faults_under_concurrency(make_transport: Callable[..., Any]) -> None:
    """Six threads publish, claim, ack, nack, park and extend while the clock raises,
    returns NaN or non-numbers, and jumps backwards; afterwards nothing is lost.

    A call may fail only with the error the fault its own clock read injected
    must cause (``FaultyClock.ERRORS``), or, for ``ack``/``nack``/``extend``,
    with ``LeaseLost`` (another worker got the message after the lease ran
    out); anything else is a transport bug."""
    clock = FaultyClock()
    clock.mode = "random"
    t = make_transport(clock=clock)
    lock = threading.Lock()
    published: Dict[int, Any] = {}
    acked: List[int] = []
    unexpected: List[BaseException] = []
    faults_seen: Dict[str, int] = {}

    def worker(index: int) -> None:
        rng = random.Random(index)
        leases: List[Any] = []
        try:
            for _ in range(3000):
                roll = rng.random()
                clock.forget()
                lease_op = False
                try:
                    if roll < 0.3:
                        event = object()
                        seq = t.publish(f"g{rng.randrange(40)}", event, rng.randrange(3))
                        with lock:
                            published[seq] = event
                    elif roll < 0.55:
                        lease = t.claim(f"w{index}", rng.choice((0.0, 1.0, 5.0, 50.0)), rng.randrange(2))
                        if lease is not None:
                            leases.append(lease)
                    elif roll < 0.65:
                        t.stats()
                    elif leases:
                        lease_op = True
                        lease = leases.pop(rng.randrange(len(leases)))
                        if roll < 0.8:
                            t.ack(lease)
                            with lock:
                                acked.append(lease.seq)
                        elif roll < 0.85:
                            t.nack(lease)
                        elif roll < 0.9:
                            t.nack(lease, rng.choice((0.5, 3.0)))
                        else:
                            leases.append(t.extend(lease, 5.0))
                except LeaseLost:
                    if not lease_op or clock.injected() is not None:
                        raise
                except (Boom, ValueError, TypeError) as exc:
                    fault = clock.injected()
                    if fault is None or type(exc) is not FaultyClock.ERRORS[fault]:
                        raise
                    with lock:
                        faults_seen[fault] = faults_seen.get(fault, 0) + 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            unexpected.append(exc)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads), "deadlock or hang"
    assert not unexpected, unexpected[:3]
    assert set(faults_seen) == set(FaultyClock.ERRORS), f"not every fault was injected: {faults_seen}"
    assert len(acked) == len(set(acked)), "a message was acked twice"
    assert len(published) > 1000 and acked
    held = {seq: ev for seq, ev in published.items() if seq not in set(acked)}
    assert_intact(t, clock, held)


# -- KeyboardInterrupt ------------------------------------------------------------


OPS_READING_THE_CLOCK = {
    "claim": lambda t, lease: t.claim("w2", 10),
    "extend": lambda t, lease: t.extend(lease, 10),
    "nack-park": lambda t, lease: t.nack(lease, 5),
    "stats": lambda t, lease: t.stats(),
}


def _drain_order(t: Any, clock: FaultyClock) -> List[tuple]:
    """Claim-and-ack everything, recording what came out in which order."""
    clock.mode = "ok"
    out = []
    for _ in range(3):
        clock.now += 100
        while (lease := run_with_deadline(lambda: t.claim("d", 10.0))) is not None:
            out.append((lease.seq, lease.group_id, lease.attempt, lease.event))
            t.ack(lease)
    assert len(t) == 0 and tuple(t.stats()) == (0, 0, 0, 0, 0, 0, 0)
    return out


@pytest.mark.parametrize("op", list(OPS_READING_THE_CLOCK))
def test_keyboard_interrupt_from_the_clock(make_transport: Callable[..., Any], op: str) -> None:
    """A BaseException, not an Exception: cleanup written as ``except Exception`` would
    miss it.  The interrupted transport must behave exactly like an untouched twin."""
    events = [object() for _ in range(4)]
    runs = []
    for interrupted in (True, False):
        clock = FaultyClock()
        t = make_transport(clock=clock)
        for g, ev in zip(("a", "a", "b", "c"), events):
            t.publish(g, ev)
        lease = t.claim("w", 10)
        clock.now += 30  # the lease ran out, unobserved: a claim would free it now
        if interrupted:
            clock.mode = "interrupt"
            with pytest.raises(KeyboardInterrupt):
                OPS_READING_THE_CLOCK[op](t, lease)
            clock.mode = "ok"
        assert len(t) == 4
        # the lock was released, and the lease is as current as in the twin
        run_with_deadline(lambda: t.nack(lease))
        runs.append(_drain_order(t, clock))
    assert runs[0] == runs[1]
    assert sorted(r[0] for r in runs[0]) == [1, 2, 3, 4]


def test_keyboard_interrupt_from_clock_value_conversion(make_transport: Callable[..., Any]) -> None:
    """The clock returns an int subclass whose ``__float__`` raises KeyboardInterrupt."""

    class Tick(int):
        def __float__(self) -> float:
            raise KeyboardInterrupt

    value: List[Any] = [1000.0]
    t = make_transport(clock=lambda: value[0])
    held = {t.publish("g", ev): ev for ev in (object(), object())}
    before = snapshot(t)
    value[0] = Tick(1000)
    for call in (lambda: t.claim("w", 10), t.stats):
        with pytest.raises(KeyboardInterrupt):
            call()
    value[0] = 1000.0
    assert snapshot(t) == before
    lease = run_with_deadline(lambda: t.claim("w", 10))
    assert lease.attempt == 1 and lease.seq == min(held)
    value[0] = Tick(1000)
    for call in (lambda: t.extend(lease, 10), lambda: t.nack(lease, 5)):
        with pytest.raises(KeyboardInterrupt):
            call()
    value[0] = 1000.0
    t.nack(lease)  # still current after both interrupted calls
    value[0] = 10.0**9
    seen = []
    while (lease := t.claim("w", 10)) is not None:
        assert lease.event is held[lease.seq]
        seen.append(lease.seq)
        t.ack(lease)
    assert sorted(seen) == sorted(held) and len(t) == 0


# -- user code in argument conversion may re-enter the transport ----------------


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
def test_user_code_in_conversions_may_reenter(make_transport: Callable[..., Any]) -> None:
    """``__float__``/``__int__``/``__index__`` of int subclasses are user code: they run
    before the lock is taken, so calling back into the transport must not deadlock."""
    holder: List[Any] = []
    calls: List[str] = []

    def reenter(where: str) -> None:
        t = holder[0]
        calls.append(where)
        len(t)
        t.publish("side", where, -5)  # below every claim's floor here

    class Seconds(int):
        def __float__(self) -> float:
            reenter("float")
            return float(int(self))

    class Priority(int):
        def __int__(self) -> int:
            reenter("int")
            return int.__int__(self)

        def __index__(self) -> int:
            reenter("index")
            return int.__index__(self)

    stamp: List[Any] = [1000.0]
    t = make_transport(clock=lambda: stamp[0])
    holder.append(t)
    run_with_deadline(lambda: t.publish("g", "e", Priority(1)))
    lease = run_with_deadline(lambda: t.claim("w", Seconds(10), Priority(0)))
    assert lease is not None
    lease = run_with_deadline(lambda: t.extend(lease, Seconds(20)))
    run_with_deadline(lambda: t.nack(lease, Seconds(5)))
    stamp[0] = Seconds(1006)
    lease = run_with_deadline(lambda: t.claim("w", 10, 1))
    assert lease is not None and lease.event == "e" and lease.attempt == 2
    stamp[0] = 1006.0
    t.ack(lease)
    assert calls, "no conversion ran user code: the test tests nothing"
    # every re-entrant publish landed, once
    assert len(t) == len(calls)
    assert sorted(ev for ev in _drain_events(t, stamp)) == sorted(calls)


def _drain_events(t: Any, stamp: List[Any]) -> List[Any]:
    stamp[0] = 10.0**9
    out = []
    while (lease := t.claim("w", 10, -(2**63))) is not None:
        out.append(lease.event)
        t.ack(lease)
    assert len(t) == 0
    return out


# -- finalisers -------------------------------------------------------------------


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
def test_event_finaliser_claims_and_acks_from_the_same_transport(transport: Any, clock: ManualClock) -> None:
    """When the last reference to an acked event goes, its ``__del__`` works the transport:
    claims the next message, acks it, reads stats/len.  Nothing deadlocks or is lost."""
    log: List[Any] = []

    class Step:
        def __del__(self) -> None:
            lease = transport.claim("finaliser", 10)
            log.append(None if lease is None else lease.event)
            if lease is not None:
                transport.ack(lease)
            log.append(tuple(transport.stats()))
            log.append(len(transport))

    transport.publish("g", Step())
    transport.publish("g", "second")
    transport.publish("h", "third")

    def scenario() -> None:
        lease = transport.claim("w", 10)
        transport.ack(lease)
        del lease  # Step.__del__ runs now: claims and acks "third" ("g" comes after "h": never claimed)

    run_with_deadline(scenario)
    # h was never claimed, so it comes before g; then one message ("second") is
    # left, free: stats (messages, groups, leased, parked, paused, buried) and len say so
    assert log == ["third", (1, 1, 0, 0, 0, 0, 0), 1]
    remaining = transport.claim("w", 10)
    assert remaining.event == "second"
    transport.ack(remaining)
    assert len(transport) == 0


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
def test_finalisers_run_by_the_garbage_collector_during_operations(impl: Any) -> None:
    """Cyclic garbage whose ``__del__`` publishes to the transport.  The collector runs
    at whatever allocation crosses its threshold: when that allocation happens while
    an operation holds the lock, the finaliser (user code) runs under the lock, and
    its publish deadlocks.  Thresholds and pending garbage are varied so that some
    collection lands inside each operation's locked region if it allocates there.

    In a subprocess: a thread stuck inside a finaliser leaves the collector marked
    as running, which would disable ``gc.collect()`` for the rest of the test run.
    """
    code = transport_child(impl, """
        publish, claim, ack, nack, stats = t.publish, t.claim, t.ack, t.nack, t.stats

        def claim_ack(i):
            lease = claim("w", 10.0)
            if lease is not None:
                ack(lease)

        def claim_nack(i):
            lease = claim("w", 10.0)
            if lease is not None:
                nack(lease, 5.0)

        ops = [lambda i: publish("new-%d" % i, 1), claim_ack, claim_nack, lambda i: stats()]
        # thresholds up to 12: collect_during may hold one allocation more pending
        # than the loop written here before; it takes well under a second when
        # nothing deadlocks
        finalised = publishing_finalisers_during(t, ops, range(1, 13), range(12), 20)
        now[0] = 10.0**9  # every park has run out
        # consistent: len agrees with what can be claimed, each message once
        n = len(t)
        assert t.stats().messages == n
        drained = claimed_once(t)
        assert drained == n and len(t) == 0, (drained, n)
        print("ok", finalised)
        """)
    out = subprocess.run(python_argv(code), capture_output=True, text=True, timeout=300, check=False)
    assert "DEADLOCK" not in out.stdout, (
        "a finaliser run by the garbage collector inside an operation deadlocked on the transport's lock: "
        + out.stdout
    )
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout}\n{out.stderr[-3000:]}"
    assert int(out.stdout.split()[1]) > 100, "hardly any finaliser ran: the test tests nothing"


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
def test_finaliser_in_the_middle_of_an_operation_may_only_publish(impl: Any) -> None:
    """decisions.md, "Re-entrant calls and failures": a finaliser that the garbage
    collector starts in the middle of an operation may ``publish``; ``claim``,
    ``ack``, ``nack``, ``extend`` and ``stats`` raise ``RuntimeError`` there (pure
    twin) rather than see a half-done state, and change nothing.  The Cython
    transport allocates nothing the collector tracks under its lock, so there no
    finaliser ever runs mid-operation: every call from one runs outside the lock.

    Collections are made to land at every allocation of a publish (thresholds
    with a varying amount of pending garbage); each finaliser makes all five
    calls with arguments that change nothing when they run outside an
    operation (a floor no group reaches, a stale lease)."""
    pure = impl.__name__.endswith("_py")
    now = [1000.0]
    t = impl.InMemoryTransport(clock=lambda: now[0])
    t.publish("victim", None)
    stale = t.claim("w", 10.0)
    t.ack(stale)  # stale from now on: LeaseLost when a call gets that far
    outcomes: Dict[str, Dict[str, int]] = {}
    published: List[int] = []

    calls = {
        "claim": lambda: t.claim("f", 10.0, 2**62),
        "ack": lambda: t.ack(stale),
        "nack": lambda: t.nack(stale),
        "nack-park": lambda: t.nack(stale, 5.0),
        "extend": lambda: t.extend(stale, 5.0),
        "stats": lambda: t.stats(),
    }

    def finaliser() -> None:
        for name, call in calls.items():
            outcome = finaliser_outcome(call, ran_on=(LeaseLost,))
            outcomes.setdefault(name, {}).setdefault(outcome, 0)
            outcomes[name][outcome] += 1
        published.append(t.publish("from-finaliser", None))

    def cycle(extra: int) -> None:
        t.publish("g%d" % (extra % 3), None)  # allocates under the lock
        lease = t.claim("w", 10.0)
        if lease is not None:
            t.ack(lease)

    def scenario() -> None:
        for threshold in range(1, 13):
            for extra in range(9):
                collect_during(lambda: cycle(extra), finaliser, threshold, extra)

    with collector_restored():
        run_with_deadline(scenario, 60.0)  # each round collects in full: seconds on a busy machine
    gc.collect()
    assert set(outcomes) == set(calls), "no finaliser ran: the test tests nothing"
    for name, seen in outcomes.items():
        assert set(seen) <= {"ran", "refused"}, (name, seen)
        if pure:
            assert seen.get("refused"), f"{name}: no finaliser ran mid-operation, the guard is untested: {seen}"
        else:
            assert "refused" not in seen, (name, seen)
    # nothing was half done: every message is there once, the finalisers' too
    now[0] = 10.0**9
    held = len(t)
    assert t.stats().messages == held
    drained = 0
    while (lease := t.claim("d", 10.0)) is not None:
        drained += 1
        t.ack(lease)
    assert drained == held and len(t) == 0


def test_transport_collected_while_finalisers_publish_to_it(impl: Any) -> None:
    """Events that reference their transport (a cycle) and publish to it from ``__del__``:
    when the collector frees the lot, the finalisers run on a transport being torn
    down.  In a subprocess: a crash must not take the test run with it."""
    code = textwrap.dedent(
        f"""
        import gc, sys
        sys.path.insert(0, {package_root(impl)!r})
        import {impl.__name__} as impl

        class Step:
            def __init__(self, t, depth):
                self.t, self.depth = t, depth
            def __del__(self):
                if self.depth < 3:
                    self.t.publish("g", Step(self.t, self.depth + 1))

        for round_ in range(200):
            t = impl.InMemoryTransport(clock=lambda: 1000.0)
            for i in range(20):
                t.publish(f"g{{i % 3}}", Step(t, 0))
            t.claim("w", 10)
            t.nack(t.claim("w", 10), 5)
            del t
            gc.collect()
        print("survived")
        """
    )
    out = subprocess.run(python_argv(code), capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stderr[-3000:]}"
    assert "survived" in out.stdout
    assert "Fatal Python error" not in out.stderr


# -- MemoryError ------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS (Linux)")
@pytest.mark.skipif(UNDER_ASAN, reason="AddressSanitizer reserves terabytes of address space: RLIMIT_AS cannot apply")
@pytest.mark.parametrize("shape", ["one-group", "many-groups"])
def test_memory_error_leaves_transport_consistent(impl: Any, shape: str) -> None:
    """Publish until memory runs out, in a subprocess whose address space is capped
    (RLIMIT_AS: the machine is never at risk).  Then free a ballast and check the
    transport: every message that a publish reported is there, and nothing else."""
    code = textwrap.dedent(
        f"""
        import resource, sys, gc
        sys.path.insert(0, {package_root(impl)!r})
        import {impl.__name__} as impl
        t = impl.InMemoryTransport(clock=lambda: 1000.0)
        many = {shape == "many-groups"!r}
        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * resource.getpagesize()
        ballast = bytearray(64 * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (vm + 256 * 2**20, resource.RLIM_INFINITY))
        import time
        count = 0
        give_up = time.monotonic() + 60
        try:
            while True:
                seq = t.publish(("g%d" % count) if many else "g", None)
                count = seq
                if not count % 64 and time.monotonic() > give_up:
                    # at the limit the interpreter can crawl (small allocations trickle
                    # through page by page) instead of raising: nothing to test then
                    print("crawl", count)
                    sys.exit(0)
        except MemoryError:
            pass
        del ballast
        gc.collect()
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        n = len(t)
        assert n in (count, count + 1), ("len is off", n, count)
        nxt = t.publish("after", None)
        assert nxt == n + 1, ("seq numbers skipped or reused", nxt, n)
        st = t.stats()
        assert st.messages == n + 1 and st.groups == (n + 1 if many else 2), (st, n)
        seen = 0
        while True:
            lease = t.claim("w", 10, -2**63)
            if lease is None:
                break
            seen += 1
            t.ack(lease)
        assert seen == n + 1 and len(t) == 0, ("len/stats count messages that cannot be claimed", seen, n + 1)
        print("ok", n)
        """
    )
    try:
        out = subprocess.run(python_argv(code), capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:  # a crawl so slow it never reached its own minute's check
        pytest.skip("the interpreter crawled at the memory limit (no answer in 300 s) instead of raising MemoryError")
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    if out.stdout.startswith("crawl"):
        pytest.skip("the interpreter crawled at the memory limit instead of raising MemoryError: " + out.stdout)
    assert out.stdout.startswith("ok"), out.stdout
    n = int(out.stdout.split()[1])
    assert n > 10_000, "ran out of memory before the transport grew: the test tests nothing"


def _nomemory_history(t: Any, clock: Any) -> Dict[str, Any]:
    """Three priority levels; a current lease (b), a parked group (d), a lease that
    ran out unobserved (e), a never-claimed group (c)."""
    t.publish("a", "a1", priority=3)
    t.publish("a", "a2")
    t.publish("b", "b1")
    t.publish("c", "c1", priority=-2)
    t.publish("d", "d1")
    t.publish("e", "e1", priority=5)
    t.nack(t.claim("w", 10, min_priority=5), 0)  # e: claimed once, free again
    t.nack(t.claim("w", 10, min_priority=3), 0)  # a: claimed once, free again
    current = t.claim("w", 10)  # b (never claimed)
    t.nack(t.claim("w", 10), 100)  # d (never claimed) parked
    expiring = t.claim("w", 2, min_priority=5)  # e, the last of its level, runs out below
    assert [x.group_id for x in (current, expiring)] == ["b", "e"]
    clock.advance(5)
    return {"current": current, "expiring": expiring}


def _one_level_history(t: Any, clock: Any) -> Dict[str, Any]:
    """One priority level (the claim fast path), with a lease that ran out unobserved."""
    for group in "abc":
        t.publish(group, group)
    current = t.claim("w", 10)
    t.claim("w", 2)
    clock.advance(5)
    return {"current": current}


NOMEMORY_OPS = {
    "publish-new-group": (_nomemory_history, lambda t, l: t.publish("new", "e")),
    "publish-new-level": (_nomemory_history, lambda t, l: t.publish("new", "e", priority=7)),
    "publish-old-group": (_nomemory_history, lambda t, l: t.publish("a", "e")),
    "claim": (_nomemory_history, lambda t, l: t.claim("w2", 10, min_priority=-5)),
    "claim-one-level": (_one_level_history, lambda t, l: t.claim("w2", 10)),
    "ack": (_nomemory_history, lambda t, l: t.ack(l["current"])),
    "ack-last-of-level": (_nomemory_history, lambda t, l: t.ack(l["expiring"])),
    "nack": (_nomemory_history, lambda t, l: t.nack(l["current"])),
    "nack-park": (_nomemory_history, lambda t, l: t.nack(l["current"], 5)),
    "extend": (_nomemory_history, lambda t, l: t.extend(l["current"], 5)),
    "stats": (_nomemory_history, lambda t, l: t.stats()),
}

#: Operations of the pure twin that break the rule today: the allocation that fails
#: can come after the operation changed the transport (the lock's exit, ``_forget``
#: in an ack).  For these the test asserts less: after a MemoryError the transport
#: is as before *or as after* the operation, whole either way.  Remove an entry
#: when it is fixed.  (``claim`` is not here: ``_lease_ready`` makes every value
#: first, ``_take_top`` is all or nothing, ``_repair`` reuses its path list and the
#: lease is allocated before the lock, so a failed claim changes nothing.)
PURE_TWIN_LATE_ALLOCATION = {"publish-new-group", "publish-new-level", "publish-old-group",
                             "ack", "ack-last-of-level", "nack", "nack-park"}


@contextlib.contextmanager
def _no_tracer() -> Iterator[None]:
    """``set_nomemory`` counts every allocation, a tracer's too: coverage, measuring
    this run, allocates as lines run, and a failure there is its own (and ends its
    tracing).  So the armed call runs unmeasured."""
    cov = None
    try:
        import coverage

        cov = coverage.Coverage.current()
    except ImportError:
        pass
    tracer = sys.gettrace()
    if cov is not None:
        cov.stop()
    elif tracer is not None:
        sys.settrace(None)
    try:
        yield
    finally:
        if cov is not None:
            cov.start()
        elif tracer is not None:
            sys.settrace(tracer)


class _PlainClock:
    """A manual clock with no lock: a failed allocation inside ``ManualClock``'s
    ``with lock`` can leave that lock held (Python's hazard, not the transport's)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _Bounded:
    """A transport whose ``claim`` gives up after ``limit`` calls: a corrupted one
    may hand out leases forever, and ``fingerprint`` claims until ``None``."""

    def __init__(self, transport: Any, limit: int = 1000) -> None:
        self.transport, self.left = transport, limit

    def __len__(self) -> int:
        return len(self.transport)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)

    def claim(self, *args: Any) -> Any:
        self.left -= 1
        assert self.left >= 0, "claim keeps returning leases: the transport is corrupted"
        return self.transport.claim(*args)


@pytest.mark.skipif(set_nomemory is None, reason="needs CPython's _testcapi.set_nomemory")
@pytest.mark.parametrize("op", list(NOMEMORY_OPS))
def test_failed_allocation_anywhere_changes_nothing(
    make_transport: Callable[..., Any], impl: Any, op: str
) -> None:
    """decisions.md, "MemoryError": each operation allocates before it changes
    anything, so a failed allocation leaves the transport as it was (a failed
    publish gives its seq back).  ``set_nomemory(n, n + 1)`` fails exactly the
    n-th allocation from the call on, for n = 0, 1, 2, ... until the operation
    completes: after each MemoryError the transport must be indistinguishable
    (the next seq, then ``referee.fingerprint``) from an untouched twin, and
    the run that completes must match a twin that made the same call."""
    pure = impl.__name__.endswith("_py")
    late_allocation_allowed = pure and op in PURE_TWIN_LATE_ALLOCATION
    history, call = NOMEMORY_OPS[op]
    completed_in_a_row = 0
    for n in range(1000):
        clocks = (_PlainClock(), _PlainClock(), _PlainClock())
        subject, untouched, done = (make_transport(clock=c) for c in clocks)
        leases = history(subject, clocks[0])
        history(untouched, clocks[1])
        call(done, history(done, clocks[2]))
        gc.collect()
        try:
            with _no_tracer():
                set_nomemory(n, n + 1)
                try:
                    call(subject, leases)
                finally:
                    remove_mem_hooks()
        except MemoryError:
            completed_in_a_row = 0
            twins = (untouched, done) if late_allocation_allowed else (untouched,)
        else:
            completed_in_a_row += 1
            twins = (done,)
        seq = subject.publish("probe", None)
        assert seq in [twin.publish("probe", None) for twin in twins], f"allocation {n}: the next seq differs"
        observed = fingerprint(_Bounded(subject), clocks[0])
        assert observed in [fingerprint(twin, clocks[1 + (twin is done)]) for twin in twins], (
            f"allocation {n} left the transport changed")
        if completed_in_a_row == 3:  # past the operation's last allocation (one it absorbs is no end)
            break
    else:
        raise AssertionError("the operation never completed")


# -- hostile input ------------------------------------------------------------------


def test_hostile_str_subclass_ids_never_run_under_the_lock(make_transport: Callable[..., Any]) -> None:
    """``__hash__``/``__eq__``/``__len__``/``__getitem__`` that call back into the transport:
    had any of them run under the lock, the call would deadlock."""
    holder: List[Any] = []

    class Name(str):
        def __hash__(self) -> int:
            holder[0].publish("hash", None)
            return str.__hash__(self)

        def __eq__(self, other: object) -> bool:
            holder[0].publish("eq", None)
            return str.__eq__(self, other)

        def __len__(self) -> int:
            holder[0].publish("len", None)
            return str.__len__(self)

        def __getitem__(self, item: Any) -> str:
            holder[0].publish("getitem", None)
            return str.__getitem__(self, item)

    clock = ManualClock()
    t = make_transport(clock=clock)
    holder.append(t)
    event = object()
    seq = run_with_deadline(lambda: t.publish(Name("g"), event))
    lease = run_with_deadline(lambda: t.claim(Name("w"), 10, 0))
    assert lease.seq == seq and lease.event is event
    assert type(lease.group_id) is str and type(lease.worker_id) is str
    with pytest.raises(ValueError):
        run_with_deadline(lambda: t.claim(Name("__parked__"), 10))
    t.ack(lease)
    # whatever user code ran published; each of those is held and claimable
    assert len(t) == t.stats().messages
    _drain_all(t, clock)


def _drain_all(t: Any, clock: ManualClock) -> int:
    clock.advance(10**9)
    n = len(t)
    got = 0
    while (lease := t.claim("d", 10, -(2**63))) is not None:
        got += 1
        t.ack(lease)
    assert got == n and len(t) == 0
    return got


def test_object_pretending_to_be_a_str_is_refused(transport: Any) -> None:
    """``isinstance`` believes a ``__class__`` property; the transport must not."""

    class Fake:
        @property  # type: ignore[misc]
        def __class__(self) -> type:
            return str

    assert isinstance(Fake(), str)
    before = snapshot(transport)
    with pytest.raises(TypeError):
        transport.publish(Fake(), "e")
    with pytest.raises(TypeError):
        transport.claim(Fake(), 10)
    assert snapshot(transport) == before


def test_object_pretending_to_be_a_lease_runs_no_code_under_the_lock(
    make_transport: Callable[..., Any], impl: Any
) -> None:
    """An impostor whose ``__class__`` says Lease, and whose attributes are computed by
    user code that calls back into the transport.  It is not a ``Lease`` (decisions.md:
    ``type(lease) is Lease``, which no ``__class__`` property fools): ``TypeError``,
    before any of its attributes is read, nothing changed, and no deadlock."""
    holder: List[Any] = []
    reentered: List[str] = []
    clock = ManualClock()
    t = make_transport(clock=clock)
    holder.append(t)
    t.publish("g", "e")
    real = t.claim("w", 10)

    class Impostor:
        @property  # type: ignore[misc]
        def __class__(self) -> type:
            return impl.Lease

        def __getattr__(self, name: str) -> Any:
            len(holder[0])
            holder[0].publish("impostor", name)
            reentered.append(name)
            return getattr(real, name)

    before = snapshot(t)
    for call in (lambda: t.ack(Impostor()), lambda: t.nack(Impostor()), lambda: t.extend(Impostor(), 10)):
        with pytest.raises(TypeError):
            run_with_deadline(call)
    assert reentered == [], "the transport read an attribute of an object that is not a Lease"
    assert snapshot(t) == before
    t.ack(real)  # untouched and still current
    assert len(t) == 0


@pytest.mark.parametrize(
    "priority, error",
    [(2**63, OverflowError), (-(2**63) - 1, OverflowError), (10**100, OverflowError), (-(10**100), OverflowError)],
    ids=["2**63", "-2**63-1", "1e100", "-1e100"],
)
def test_huge_int_subclass_priorities_refused(transport: Any, priority: int, error: type) -> None:
    class Big(int):
        def __hash__(self) -> int:
            raise AssertionError("hashed")

        def __lt__(self, other: object) -> bool:
            raise AssertionError("compared")

    transport.publish("g", "first")
    before = snapshot(transport)
    with pytest.raises(error):
        transport.publish("h", "e", Big(priority))
    with pytest.raises(error):
        transport.claim("w", 10, Big(priority))
    assert snapshot(transport) == before
    lease = transport.claim("w", 10, -(2**63))
    assert lease.event == "first"


def test_extreme_int_subclass_priorities_are_stored_as_plain_ints(transport: Any) -> None:
    """Within range, int subclasses whose comparisons and hash raise are accepted:
    the transport compares its own exact copies."""

    class Hostile(int):
        def __hash__(self) -> int:
            raise AssertionError("hashed")

        def __lt__(self, other: object) -> bool:
            raise AssertionError("compared")

        __gt__ = __le__ = __ge__ = __lt__

        def __eq__(self, other: object) -> bool:
            raise AssertionError("compared")

    transport.publish("low", "l", Hostile(-(2**63)))
    transport.publish("high", "h", Hostile(2**63 - 1))
    lease = transport.claim("w", 10, Hostile(2**63 - 1))
    assert lease.event == "h"
    assert transport.claim("w", 10, Hostile(2**63 - 1)) is None
    lease2 = transport.claim("w", 10, Hostile(-(2**63)))
    assert lease2.event == "l"
    transport.ack(lease)
    transport.ack(lease2)
    assert len(transport) == 0


def test_lease_outliving_its_transport_is_refused_by_a_successor(make_transport: Callable[..., Any]) -> None:
    """A transport dies with a lease outstanding; a new one (often at the same address)
    issues a look-alike delivery.  The old lease must not be current there (no ABA on
    whatever marks a lease's owner)."""
    clock = ManualClock()
    same_address = 0
    for _ in range(50):
        gc.collect()  # no garbage of the previous round is freed in between below
        t1 = make_transport(clock=clock)
        t1.publish("g", None)
        old = t1.claim("w", 30)
        address = id(t1)
        del t1  # freed now (what it holds may wait for the collector)
        t2 = make_transport(clock=clock)
        same_address += id(t2) == address
        t2.publish("g", None)
        mine = t2.claim("w", 30)
        assert old == mine  # look-alikes
        before = snapshot(t2)
        for op in (t2.ack, t2.nack, lambda x: t2.extend(x, 5)):
            with pytest.raises(LeaseLost):
                op(old)
        assert snapshot(t2) == before
        t2.ack(mine)
    # the case the test is about: the successor really took the dead one's place
    # (CPython reuses the freed memory; PyPy's ids never repeat)
    if IS_CPYTHON:
        assert same_address > 0, "no successor was allocated at the dead transport's address: ABA not tested"
