"""Faults in the control plane and the batches (issue 10; issue 6's style).

* ``MemoryError``: each new operation allocates before it changes anything
  (the Cython transport reserves everything a batch needs first; the pure
  twin takes a failed ``publish_many`` back), so running out of memory
  leaves the transport as it was.  Each case runs in a subprocess whose
  address space is capped (RLIMIT_AS) just above what it holds, next to an
  untouched twin built the same way: afterwards the two must be the same
  (``helpers.fingerprint``), or differ by exactly the operation when it
  went through after all.
* finalisers that the garbage collector starts in the middle of a new
  operation and that call back into the transport: nothing deadlocks, and
  nothing is lost.

The events' last references being dropped after the lock (``purge``,
``ack_many``) are tested in test_control_plane.py / test_batches.py.
"""

from __future__ import annotations

import heapq
import os
import subprocess
import sys
import textwrap
from typing import Any, Callable, Dict, List, Tuple

import pytest

from helpers import (
    CPYTHON_ONLY_REASON,
    IS_CPYTHON,
    collect_during,
    collector_restored,
    finaliser_outcome,
    fingerprint,
    lease_key,
    package_root,
    transport_child,
)
from leasequeue import LeaseLost
from leasequeue.testing import ManualClock

UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where helpers.py is



PRELUDE = """
import gc, math, resource, sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
import {module} as impl
from helpers import fingerprint
from leasequeue.testing import ManualClock

def cap(headroom):
    gc.collect()
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vm + headroom, resource.RLIM_INFINITY))

def uncap():
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

ca, cb = ManualClock(), ManualClock()
a, b = impl.InMemoryTransport(clock=ca), impl.InMemoryTransport(clock=cb)
both = (a, b)

def same():
    assert fingerprint(a, ca) == fingerprint(b, cb), "the transport changed"
"""

CASES = {
    # a batch creating many groups: everything or nothing, and no seq used up
    "publish_many": """
        for t in both:
            for i in range(100_000):
                t.publish("g%d" % (i % 20_000), None, i % 3)
            t.pause("g1")
        items = [("new%d" % i, i, i % 7) for i in range(300_000)]
        before = len(a)
        cap(8 * 2**20)
        try:
            a.publish_many(items)
            outcome = "done"
        except MemoryError:
            outcome = "nomem"
        uncap()
        n = len(a)
        assert n in (before, before + len(items)), (n, before)
        if n != before:
            b.publish_many(items)
        assert a.publish("x", None) == b.publish("x", None), "seq numbers differ"
        same()
    """,
    # pause of unknown groups until memory runs out: a prefix of them exists, paused
    "pause": """
        names = ["p%d" % i for i in range(400_000)]
        done = [False] * len(names)
        cap(6 * 2**20)
        outcome = "done"
        try:
            for i in range(len(names)):
                done[i] = a.pause(names[i])
        except MemoryError:
            outcome = "nomem"
        uncap()
        k = done.index(False) if False in done else len(done)
        listed = [g.group_id for g in a.groups()]
        assert listed == names[:k], (len(listed), k)
        assert a.stats() == (0, 0, 0, 0, k, 0, 0)
        for name in names[:k]:
            b.pause(name)
        a.publish(names[0], "e")
        b.publish(names[0], "e")
        for t in both:
            assert t.claim("w", 10) is None
            for name in names[:k]:
                t.resume(name)
        same()
    """,
    # a snapshot of many groups: the view is allocated first
    "groups": """
        for t in both:
            for i in range(200_000):
                t.publish("g%d" % i, None)
            for _ in range(1000):
                t.claim("w", 1)
        ca.advance(5)
        cb.advance(5)
        cap(4 * 2**20)
        try:
            got = len(a.groups())
            outcome = "done"
        except MemoryError:
            outcome = "nomem"
        uncap()
        same()
    """,
    # claim everything: records and expiry room first; if the leases cannot
    # be built afterwards, the messages come back when their leases expire
    "claim_many": """
        for i in range(200_000):
            a.publish("g%d" % i, i)
        cap(4 * 2**20)
        try:
            got = len(a.claim_many("w", 10, 2**70))
            outcome = "done"
        except MemoryError:
            outcome = "nomem"
        uncap()
        assert len(a) == 200_000
        ca.advance(100)
        seen = set()
        while (lease := a.claim("d", 10, -2**63)) is not None:
            assert lease.event not in seen and lease.seq == lease.event + 1
            seen.add(lease.event)
            a.ack(lease)
        assert len(seen) == 200_000 and a.stats() == (0, 0, 0, 0, 0, 0, 0)
    """,
    # purge of a big group: the events' holder is allocated first
    "purge": """
        for t in both:
            for i in range(300_000):
                t.publish("big", None)
            t.publish("small", None)
            t.claim("w", 10)
        cap(1 * 2**20)
        try:
            removed = a.purge("big")
            outcome = "done"
        except MemoryError:
            outcome = "nomem"
        uncap()
        if a.group("big") is None:
            assert b.purge("big") == 300_000
        same()
    """,
    # ack of many leases: the batch copy and the events' holder come first.
    # The pure twin may also run out half-way (making its next message ready
    # allocates): the acks made stand, a prefix of the batch, and acking the
    # batch again reports exactly that prefix as not current.
    "ack_many": """
        leases = {}
        for t in both:
            for i in range(300_000):
                t.publish("g%d" % (i % 150_000), None)
            leases[t] = [t.claim("w", 10) for _ in range(150_000)]
        cap(1 * 2**20)
        try:
            lost = a.ack_many(leases[a])
            outcome = "done"
        except MemoryError:
            outcome = "nomem"
        uncap()
        acked = 300_000 - len(a)
        assert impl.__name__.endswith("_py") or acked in (0, 150_000), acked
        again = a.ack_many(leases[a])
        assert [id(x) for x in again] == [id(x) for x in leases[a][:acked]]
        assert b.ack_many(leases[b]) == []
        del leases, again
        same()
    """,
    # ack_and_claim when the claim's expiry entry needs a bigger heap (149,225
    # leases: the Cython heap is exactly full): the Cython transport makes the
    # room first, so running out changes nothing; the pure twin may run out in
    # its claim half, after the ack: the ack stands and it returns None
    "ack_and_claim": """
        K = 149_225
        held = {}
        for t in both:
            for i in range(K + 10):
                t.publish("g%d" % i, None)
            held[t] = [t.claim("w", 10) for _ in range(K)]
        got = None
        cap(128 * 2**10)  # less than the heap grows by (its realloc may grow it in place)
        try:
            got = a.ack_and_claim(held[a][0], "w", 10)
            outcome = "done" if got is not None else "none"
        except MemoryError:
            outcome = "nomem"
        uncap()
        if outcome != "nomem":
            b.ack(held[b][0])
        if outcome == "done":
            assert b.claim("w", 10).group_id == got.group_id
        assert impl.__name__.endswith("_py") or outcome == "nomem", outcome
        del held, got
        same()
    """,
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS (Linux)")
@pytest.mark.skipif(UNDER_ASAN, reason="AddressSanitizer reserves terabytes of address space: RLIMIT_AS cannot apply")
@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
@pytest.mark.parametrize("case", list(CASES))
def test_memory_error_changes_nothing(impl: Any, case: str) -> None:
    code = PRELUDE.format(root=package_root(impl), tests=TESTS, module=impl.__name__)
    code += textwrap.dedent(CASES[case]) + "\nprint(outcome)\n"
    # glibc: every block of 64 KiB or more lives in a mapping of its own from
    # the start, and goes back to the system when freed, so no large free
    # heap space is left for a capped allocation to reuse: an allocation the
    # cap forbids fails whatever the test did before (musl maps large blocks
    # anyway).
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(64 * 1024))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False,
                         env=env)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    outcome = out.stdout.split()[-1]
    print(f"{impl.__name__} {case}: {outcome}")
    assert outcome in ("done", "nomem", "none")
    assert outcome != "none" or (impl.__name__.endswith("_py") and case == "ack_and_claim")
    if impl.__name__.endswith("_c") or case not in ("claim_many", "purge", "ack_and_claim"):
        # The cap is tight enough that each of these runs out.  (The pure
        # twin's purge needs no memory, and its claim_many may end the batch
        # early instead: both may go through; its ack_and_claim may run out
        # after the ack, or allocate nothing that fails.)
        assert outcome == "nomem", "the operation did not run out of memory: the test tests nothing"


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
def test_finalisers_run_by_the_garbage_collector_during_new_operations(impl: Any) -> None:
    """As test_faults.py's test for Part 1: cyclic garbage whose ``__del__``
    publishes, collected at whatever allocation crosses the collector's
    threshold -- here inside each control-plane and batch operation."""
    code = transport_child(impl, """
        ops = [
            lambda i: t.pause("g%d" % (i % 7)),
            lambda i: t.resume("g%d" % (i % 5)),
            lambda i: t.purge("g%d" % (i % 11)),
            lambda i: t.set_priority("g%d" % (i % 3), i % 4),
            lambda i: t.group("g%d" % (i % 7)),
            lambda i: t.groups(),
            lambda i: t.publish_many([("g%d" % (i % 13), i), ("h", i, 1)]),
            lambda i: t.ack_many(t.claim_many("w", 10.0, 3)),
            lambda i: t.claim_many("w", 10.0, 2),
            lambda i: [t.ack_and_claim(lease, "w", 10.0) for lease in t.claim_many("w", 10.0, 2)],
        ]

        def tick():
            now[0] += 3.0

        # thresholds up to 10: collect_during may hold one allocation more
        # pending than the loop written here before
        finalised = publishing_finalisers_during(t, ops, range(1, 11), range(8), 60, after_each=tick)
        now[0] += 10.0**9
        for info in t.groups():
            t.resume(info.group_id)
        n = len(t)
        assert t.stats().messages == n == sum(g.messages for g in t.groups())
        drained = claimed_once(t)
        assert drained == n and len(t) == 0 and t.groups() == [], (drained, n)
        print("ok", finalised)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert "DEADLOCK" not in out.stdout, out.stdout
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout}\n{out.stderr[-3000:]}"
    assert int(out.stdout.split()[1]) > 100, "hardly any finaliser ran: the test tests nothing"


def suppress_lost(call: Callable[[], Any]) -> None:
    """``call()``, a ``LeaseLost`` counted as having run (a probe's stale lease)."""
    try:
        call()
    except LeaseLost:
        pass


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
def test_finaliser_in_the_middle_of_a_new_operation_may_only_publish(impl: Any) -> None:
    """decisions.md, "Re-entrant calls and failures", for the Part 2 operations
    (test_faults.py's test for Part 1): a finaliser that the garbage collector
    starts inside an operation, under its lock, gets ``RuntimeError`` from every
    call but ``publish`` (pure twin), and the call changes nothing.  The Cython
    transport allocates nothing the collector tracks under its lock: there,
    every call from a finaliser runs.

    Each operation below runs with a collection landing at each of its first
    allocations in turn (thresholds with a varying amount of pending garbage).
    Two things are checked for the pure twin: every guarded call refuses to
    run inside another operation, and ``pause`` and ``set_priority`` mark
    themselves busy (a finaliser started inside them is refused).  The probes' arguments change
    nothing when they do run (a group already paused, groups that do not
    exist, a floor no group reaches, a stale lease; a waiting claim, refused
    as ``claim`` is, waits a millisecond when it runs)."""
    import gc

    pure = impl.__name__.endswith("_py")
    now = [1000.0]
    t = impl.InMemoryTransport(clock=lambda: now[0])
    t.publish("victim", None)
    stale = t.claim("w", 10.0)
    t.ack(stale)
    t.pause("paused-already")
    running = [""]
    seen: dict = {}

    probes = {
        "pause": lambda: t.pause("paused-already"),
        "resume": lambda: t.resume("absent"),
        "purge": lambda: t.purge("absent"),
        "set_priority": lambda: t.set_priority("absent", 3),
        "group": lambda: t.group("absent"),
        "groups": lambda: t.groups(),
        "publish_many": lambda: t.publish_many([]),
        "claim_many": lambda: t.claim_many("f", 10.0, 3, 2**62),
        "ack_many": lambda: t.ack_many([stale]),
        "ack_and_claim": lambda: suppress_lost(lambda: t.ack_and_claim(stale, "f", 10.0, 2**62)),
        "stats": lambda: t.stats(),
        "claim-waiting": lambda: t.claim("f", 10.0, 2**62, timeout=0.001),
    }

    def finaliser() -> None:
        for name, call in probes.items():
            seen.setdefault((running[0], name), set()).add(finaliser_outcome(call))

    def prepare_resume(i: int) -> Any:
        t.publish("r%d" % i, i)
        t.pause("r%d" % i)
        return lambda: t.resume("r%d" % i)

    def prepare_purge(i: int) -> Any:
        t.publish("u%d" % i, i, 1)
        t.publish("u%d" % i, i, 1)
        return lambda: t.purge("u%d" % i)

    def prepare_set_priority(i: int) -> Any:
        t.publish("s%d" % i, i)
        return lambda: t.set_priority("s%d" % i, 1000 + i)

    def prepare_ack_many(i: int) -> Any:
        t.publish("a%d" % i, i, 2**61)
        t.publish("a%d" % i, i, 2**61)
        leases = t.claim_many("w", 10.0, 1, 2**61)
        return lambda: t.ack_many(leases)

    def prepare_claim_many(i: int) -> Any:
        t.publish("c%d" % i, i, 2**60)
        return lambda: t.claim_many("w", 10.0, 2, 2**60)

    def prepare_ack_and_claim(i: int) -> Any:
        t.publish("k%d" % i, i, 2**59)
        t.publish("k%d" % i, i, 2**59)
        lease = t.claim("w", 10.0, 2**59)
        return lambda: t.ack_and_claim(lease, "w", 10.0, 2**59)

    ops = {
        "pause": lambda i: (lambda: t.pause("p%d" % i)),
        "resume": prepare_resume,
        "purge": prepare_purge,
        "set_priority": prepare_set_priority,
        "group": lambda i: (lambda: t.group("paused-already")),
        "groups": lambda i: t.groups,
        "publish_many": lambda i: (lambda: t.publish_many([("m%d" % i, i), ("n%d" % i, i, 1), ("m%d" % i, i)])),
        "claim_many": prepare_claim_many,
        "ack_many": prepare_ack_many,
        "ack_and_claim": prepare_ack_and_claim,
    }

    with collector_restored():
        i = 0
        for name, prepare in ops.items():
            for threshold in range(1, 9):
                for extra in range(5):
                    i += 1
                    call = prepare(i)
                    running[0] = name
                    collect_during(call, finaliser, threshold, extra)
                    running[0] = ""
    gc.collect()
    outcomes = set().union(*seen.values())
    assert outcomes <= {"ran", "refused"}, seen
    refused_in = {op for (op, _), got in seen.items() if "refused" in got}
    refusing = {probe for (_, probe), got in seen.items() if "refused" in got}
    if pure:
        # pause creates a group and set_priority a level under the lock: class
        # instances, which always count towards a collection.  The others'
        # allocations there (small tuples, lists) mostly come from free lists,
        # which do not, so whether a collection lands inside them is luck.
        must = {"pause", "set_priority"}
        assert refused_in >= must, f"no finaliser was refused inside: {sorted(must - refused_in)}"
        assert refusing == set(probes), f"never refused mid-operation: {sorted(set(probes) - refusing)}"
    else:
        assert not refusing, seen
    # nothing was half done or lost: every message is claimable once
    now[0] = 10.0**9
    for info in t.groups():
        t.resume(info.group_id)
    held = len(t)
    assert t.stats().messages == held
    drained = set()
    while (lease := t.claim("d", 10.0, -2**63)) is not None:
        assert lease.seq not in drained
        drained.add(lease.seq)
        t.ack(lease)
    assert len(drained) == held and len(t) == 0


def test_a_profiler_hook_inside_an_operation_may_only_publish(impl: Any) -> None:
    """The same rule, with user code that lands inside every operation for sure:
    a profiler or debugger hook (``sys.setprofile``).  The pure twin's
    operations call helper functions under their lock (each ends with
    ``_settle``, while the operation still marks the transport busy); a hook
    on that call that calls back into the transport gets ``RuntimeError`` from
    every call but ``publish``, and changes nothing: the transport ends exactly
    like a twin that ran the same operations without a hook, publishing what
    the hook published right after each operation.  (A finaliser, above, lands
    inside an operation only when the collector happens to run there.)  The
    Cython transport runs no Python function under its lock: the hook never
    gets inside."""
    pure = impl.__name__.endswith("_py")
    clocks = [ManualClock(), ManualClock()]
    a, b = impl.InMemoryTransport(clock=clocks[0]), impl.InMemoryTransport(clock=clocks[1])
    names = {g: (object(), object())
             for g in ["held1", "held2", "held3", "held4", "held5", "held6", "free", "purged", "prio", "lifted"]}

    def history(t: Any) -> Dict[str, Any]:
        t.publish("victim", None)
        stale = t.claim("w", 10.0)
        t.ack(stale)
        t.pause("paused-already")
        for g, events in names.items():
            for event in events:
                t.publish(g, event)
        t.pause("lifted")
        held = t.claim_many("w", 10.0, 6)
        assert [lease.group_id for lease in held] == ["held1", "held2", "held3", "held4", "held5", "held6"]
        return {"stale": stale, "held": held}

    def operations(t: Any, state: Dict[str, Any]) -> Dict[str, Callable[[], Any]]:
        held = state["held"]
        return {
            "claim": lambda: t.claim("w", 10.0),
            "claim-waiting": lambda: t.claim("w", 10.0, timeout=0.001),  # starts a wait (_wait_start)
            "ack": lambda: t.ack(held[0]),
            "nack": lambda: t.nack(held[1], 5.0),
            "extend": lambda: t.extend(held[2], 20.0),
            "stats": t.stats,
            "pause": lambda: t.pause("new-paused"),
            "resume": lambda: t.resume("lifted"),
            "purge": lambda: t.purge("purged"),
            "set_priority": lambda: t.set_priority("prio", 4),
            "group": lambda: t.group("free"),
            "groups": t.groups,
            "publish_many": lambda: t.publish_many([("pm", 1), ("prio", 2)]),
            "claim_many": lambda: t.claim_many("w", 10.0, 2),
            "ack_many": lambda: t.ack_many([held[3], held[0]]),
            "bury": lambda: t.bury(held[4], "poison"),
            "skip": lambda: t.skip("free"),
            "peek": lambda: t.peek("prio", 5),
            "ack_and_claim": lambda: t.ack_and_claim(held[5], "w", 10.0),
            "timer_fire": t._timer_fire,  # what the expiry timer calls
            "close": t.close,  # last: the transport works on, only waits end at once
        }

    state_a, state_b = history(a), history(b)
    stale = state_a["stale"]
    # Calls that change nothing when they do run (a group already paused, groups
    # that do not exist, a floor no group reaches, a stale lease), so a guard
    # that let one through is seen by its outcome, not by a changed transport.
    probes: Dict[str, Callable[[], Any]] = {
        "claim": lambda: a.claim("f", 10.0, 2**62),
        "ack": lambda: a.ack(stale),
        "nack": lambda: a.nack(stale),
        "extend": lambda: a.extend(stale, 1.0),
        "stats": a.stats,
        "pause": lambda: a.pause("paused-already"),
        "resume": lambda: a.resume("absent"),
        "purge": lambda: a.purge("absent"),
        "set_priority": lambda: a.set_priority("absent", 3),
        "group": lambda: a.group("absent"),
        "groups": a.groups,
        "publish_many": lambda: a.publish_many([]),
        "claim_many": lambda: a.claim_many("f", 10.0, 3, 2**62),
        "ack_many": lambda: a.ack_many([stale]),
        "bury": lambda: a.bury(stale),
        "skip": lambda: a.skip("absent"),
        "peek": lambda: a.peek("absent"),
        "ack_and_claim": lambda: a.ack_and_claim(stale, "f", 10.0),
    }
    running = [""]
    seen: Dict[Tuple[str, str], str] = {}
    nested: List[Tuple[str, int]] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if (event != "call" or not running[0] or frame.f_code.co_name != "_settle"
                or frame.f_globals.get("__name__") != impl.__name__):
            return
        for name, call in probes.items():
            try:
                call()
                outcome = "ran"
            except RuntimeError as exc:
                outcome = "refused" if "middle of another operation" in str(exc) else repr(exc)
            except BaseException as exc:  # noqa: BLE001 - recorded, asserted below
                outcome = repr(exc)
            seen[running[0], name] = outcome
        nested.append((running[0], a.publish("nested", running[0])))  # allowed: added as the operation ends
        running[0] = ""  # once per operation

    results = {}
    for name, call in operations(a, state_a).items():
        running[0] = name
        sys.setprofile(hook)
        try:
            results[name] = call()
        finally:
            sys.setprofile(None)
        running[0] = ""
    published = dict(nested)
    for name, call in operations(b, state_b).items():
        got = call()
        if name in published:
            assert b.publish("nested", name) == published[name]
        if name not in ("claim", "claim-waiting", "claim_many", "ack_and_claim"):  # leases: compared below
            assert got == results[name], name
    if pure:
        ops = set(operations(a, state_a))
        assert {op for op, _ in seen} == ops, "the hook did not get inside every operation"
        assert seen == {(op, probe): "refused" for op in ops for probe in probes}, {
            key: got for key, got in seen.items() if got != "refused"}
        assert set(published) == ops
    else:
        assert not seen and not nested
    assert a.groups() == b.groups()
    for t in (a, b):
        for info in t.groups():
            if info.paused:
                t.resume(info.group_id)
    assert fingerprint(a, clocks[0]) == fingerprint(b, clocks[1])


#: A batch that appends to a group, refills an empty paused group, creates
#: groups (one at a new priority level) and appends to a group it created.
INTERRUPTED_BATCH = [("old", "e1"), ("empty-paused", "e2", 5), ("claimed-paused", "e3"), ("new", "e4", 7),
                     ("old", "e5", 9), ("new", "e6"), ("new2", "e7", 2)]


@pytest.mark.parametrize("nested_publish", [False, True])
def test_publish_many_failing_at_any_item_is_taken_back_whole(impl: Any, nested_publish: bool) -> None:
    """``publish_many`` is all or nothing: when adding its k-th item fails
    (here a profiler hook raises ``MemoryError`` at the pure twin's call that
    adds the item, as that item's first allocation failing would), the items
    added before it are taken back, newest first, and the transport is as it
    was, with its seqs free again.  Unless something was published meanwhile
    (from the hook: user code inside the operation), whose seq came after the
    batch's: then the batch's seqs stay used.  The Cython transport reserves
    everything first and runs no Python function under its lock: the hook
    never fires and each batch goes through."""
    pure = impl.__name__.endswith("_py")
    events = {item[1]: object() for item in INTERRUPTED_BATCH}
    items = [(item[0], events[item[1]], *item[2:]) for item in INTERRUPTED_BATCH]

    def history(t: Any) -> None:
        t.publish("old", "o1")
        t.publish("old", "o2")
        t.pause("empty-paused")
        t.publish("other", "x", 1)
        t.claim("w", 10.0, 1)
        t.publish("claimed-paused", "c", 3)  # claimed once, then emptied while paused: it keeps its place
        lease = t.claim("w", 10.0, 3)
        t.pause("claimed-paused")
        t.ack(lease)

    for k in range(len(items) + 1):
        clocks = (ManualClock(), ManualClock())
        a, b = impl.InMemoryTransport(clock=clocks[0]), impl.InMemoryTransport(clock=clocks[1])
        history(a)
        history(b)
        adds = [0]
        nested: List[int] = []

        def hook(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and frame.f_code.co_name == "_add" and frame.f_globals.get("__name__") == impl.__name__:
                if adds[0] == k:
                    if nested_publish:
                        nested.append(a.publish("nested", None))
                    raise MemoryError("the item's first allocation")
                adds[0] += 1

        sys.setprofile(hook)
        try:
            got = a.publish_many(items)
        except MemoryError:
            got = None
        finally:
            sys.setprofile(None)
        if got is not None:
            assert got == b.publish_many(items), k
            assert not nested and (k == len(items) or not pure), "the batch was not interrupted"
        else:
            assert pure and k < len(items)
            first = b.publish("probe", None)
            if nested_publish:  # the batch's seqs stay used; the nested publish got the next one
                assert nested == [first + len(items)]
                assert a.publish("probe", None) == first + len(items) + 1
                assert a.group("nested") is not None
                assert a.purge("nested") == 1
                assert a.purge("probe") == b.purge("probe") == 1  # their seqs differ
            else:
                assert a.publish("probe", None) == first
        assert a.groups() == b.groups(), k
        assert a.stats() == b.stats(), k
        for t in (a, b):
            t.resume("empty-paused")
            # a message for the claimed group, then a new group: the claimed one
            # still comes after every never-claimed group
            t.publish("claimed-paused", "r")
            t.publish("late", "l")
            t.resume("claimed-paused")
        if not (nested_publish and got is None):  # else the seqs differ
            assert fingerprint(a, clocks[0]) == fingerprint(b, clocks[1]), k


@pytest.mark.parametrize("nested_publish", [False, True])
def test_publish_failing_gives_its_seq_back_unless_one_was_published_meanwhile(impl: Any,
                                                                             nested_publish: bool) -> None:
    """``publish`` whose message cannot be added (a profiler hook raises
    ``MemoryError`` at the pure twin's ``_add``, as the message's first
    allocation failing would) raises and changes nothing, and its seq is free
    again: the next publish gets it.  Unless user code inside the call (the
    hook) published meanwhile: that message got the next seq and is added, and
    the failed call's seq stays used, so that no seq is handed out twice.  The
    Cython transport runs no Python function under its lock: the hook never
    fires and the publish goes through."""
    pure = impl.__name__.endswith("_py")
    t = impl.InMemoryTransport(clock=ManualClock())
    first = t.publish("old", "o")
    fired: List[str] = []
    nested: List[int] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if (not fired and event == "call" and frame.f_code.co_name == "_add"
                and frame.f_globals.get("__name__") == impl.__name__):
            fired.append(event)
            if nested_publish:
                nested.append(t.publish("nested", "n"))
            raise MemoryError("the message's first allocation")

    sys.setprofile(hook)
    try:
        got: Any = t.publish("new", "e")
    except MemoryError:
        got = None
    finally:
        sys.setprofile(None)
    assert bool(fired) == pure == (got is None)
    if not pure:
        assert got == first + 1
        assert t.publish("probe", "p") == first + 2
        return
    assert t.group("new") is None
    if nested_publish:
        assert nested == [first + 2]
        assert t.publish("probe", "p") == first + 3
        expected = [("old", first, "o"), ("nested", first + 2, "n"), ("probe", first + 3, "p")]
    else:
        assert not nested
        assert t.publish("probe", "p") == first + 1
        expected = [("old", first, "o"), ("probe", first + 1, "p")]
    assert t.stats().messages == len(expected)
    got_all = []
    for _ in expected:
        lease = t.claim("w", 10.0)
        got_all.append((lease.group_id, lease.seq, lease.event))
        t.ack(lease)
    assert got_all == expected
    assert t.claim("w", 10.0) is None


def test_claim_many_failing_at_a_claim_ends_the_batch_there(impl: Any) -> None:
    """``claim_many`` when its k-th claim fails (a profiler hook raises
    ``MemoryError`` at the pure twin's call that makes the claim, as the
    claim's first allocation failing would): the first claim failing raises
    and changes nothing; a later one ends the batch with the k claims made,
    exactly ``claim_many(..., k)``.  The Cython transport reserves everything
    first and runs no Python function under its lock: the hook never fires."""
    pure = impl.__name__.endswith("_py")
    events = [object() for _ in range(6)]

    def history(t: Any) -> None:
        for i, event in enumerate(events):
            t.publish("g%d" % (i % 4), event, i % 2)

    for k in range(5):
        clocks = (ManualClock(), ManualClock())
        a, b = impl.InMemoryTransport(clock=clocks[0]), impl.InMemoryTransport(clock=clocks[1])
        history(a)
        history(b)
        claims = [0]

        def hook(frame: Any, event: str, arg: Any) -> None:
            if (event == "call" and frame.f_code.co_name == "_claim_next"
                    and frame.f_globals.get("__name__") == impl.__name__):
                if claims[0] == k:
                    raise MemoryError("the claim's first allocation")
                claims[0] += 1

        sys.setprofile(hook)
        try:
            got: Any = a.claim_many("w", 10.0, 4)
        except MemoryError:
            got = None
        finally:
            sys.setprofile(None)
        if not pure:
            assert got is not None and len(got) == 4
            k = 4
        elif k == 4:  # the batch ended (max_count) before a 5th claim
            assert got is not None and len(got) == 4
        elif k == 0:
            assert got is None, "the first claim failed: claim_many must raise"
        else:
            assert got is not None, "a later claim failed: the batch ends with the claims made"
        expected = b.claim_many("w", 10.0, k)
        assert [lease_key(lease) for lease in got or []] == [lease_key(lease) for lease in expected], k
        assert a.stats() == b.stats() and a.groups() == b.groups(), k
        assert fingerprint(a, clocks[0]) == fingerprint(b, clocks[1]), k


def _levels(t: Any, *priorities: int) -> None:
    for p in priorities:
        t.publish("level-%d" % p, p, p)


#: (history, the call, where it fails: a Python function's call, or heappush
#: called from a given function of the pure twin).  The "new-level" cases make
#: four levels first, so that the level made for the failing call draws the
#: largest treap weight of the transport's seeded generator: left in the tree,
#: it would sit above the level made for the next group at its priority.
FAILING_ALLOCATIONS = {
    # publish creating a group at a level made for it, or at one that holds a
    # group already (its heap entry: heappush in _make_ready)
    "publish-new-level": (lambda t: _levels(t, 5, 6, 7, 8), lambda t: t.publish("new", "e"), ("c_call", "_make_ready")),
    "publish-old-level": (lambda t: _levels(t, 0), lambda t: t.publish("new", "e"), ("c_call", "_make_ready")),
    # pause creating a group at a level made for it, or at an existing level
    "pause-new-level": (lambda t: _levels(t, 5, 6, 7, 8), lambda t: t.pause("new"), ("call", "_paused_group")),
    "pause-old-level": (lambda t: _levels(t, 0), lambda t: t.pause("new"), ("call", "_paused_group")),
    # set_priority moving a ready group (its heap entry: heappush in _set_level)
    # to a level made for it, or to one that exists
    "set_priority-new-level": (lambda t: _levels(t, 0, 5, 6, 7), lambda t: t.set_priority("level-0", 9),
                               ("c_call", "_set_level")),
    "set_priority-old-level": (lambda t: _levels(t, 0, 9), lambda t: t.set_priority("level-0", 9),
                               ("c_call", "_set_level")),
}


def _pure_levels(t: Any) -> Tuple[List[int], List[Tuple[int, int]]]:
    """White box, pure twin: the priorities its level dict holds, and each
    level of its treap, in order, with its group count."""
    nodes: List[Tuple[int, int]] = []

    def walk(node: Any) -> None:
        if node is not None:
            walk(node.left)
            nodes.append((node.priority, node.groups))
            walk(node.right)

    walk(t._root)
    return sorted(t._levels), nodes


@pytest.mark.parametrize("case", list(FAILING_ALLOCATIONS))
def test_pause_and_set_priority_failing_to_allocate_change_nothing(impl: Any, case: str) -> None:
    """``pause`` of an unknown group, ``set_priority`` of a ready group and
    ``publish`` to a new group allocate one thing under the lock (the group;
    the entry in a level's heap), after maybe creating a priority level for
    it: when that allocation fails (a profiler hook raises ``MemoryError``
    at the pure twin's call), the level made for it goes too, a level that
    was there stays, and the transport is as it was: a later group at that
    priority is claimable like any other.  The
    Cython transport runs no Python function under its lock: the hook never
    fires and the call goes through."""
    pure = impl.__name__.endswith("_py")
    history, call, (kind, where) = FAILING_ALLOCATIONS[case]
    clocks = (ManualClock(), ManualClock())
    a, b = impl.InMemoryTransport(clock=clocks[0]), impl.InMemoryTransport(clock=clocks[1])
    history(a)
    history(b)
    fired = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if fired or event != kind or frame.f_globals.get("__name__") != impl.__name__:
            return
        if frame.f_code.co_name == where and (kind == "call" or arg is heapq.heappush):
            fired.append(event)
            raise MemoryError("the allocation")

    sys.setprofile(hook)
    try:
        call(a)
        failed = False
    except MemoryError:
        failed = True
    finally:
        sys.setprofile(None)
    assert failed == pure == bool(fired)
    if not failed:
        call(b)
    assert a.groups() == b.groups() and a.stats() == b.stats()
    if pure:  # white box: no empty level left behind (it would be kept for good)
        assert _pure_levels(a) == _pure_levels(b)
    for round in range(3):  # every level the case touched, made and dropped again
        for t in (a, b):
            for i, priority in enumerate((0, 5, 9, 0, 5, 9, -1)):
                t.publish("after-%d-%d" % (round, i), priority, priority)
        assert a.groups() == b.groups()
        assert fingerprint(a, clocks[0]) == fingerprint(b, clocks[1])


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
@pytest.mark.parametrize("trigger", ["publish", "ack"])
@pytest.mark.parametrize("action", ["publish", "close", "end-a-wait"])
def test_finaliser_in_the_middle_of_serving_waiting_claims(impl: Any, action: str, trigger: str) -> None:
    """A finaliser that the garbage collector starts while an operation hands
    messages to waiting claims (under the lock, pure twin) may publish, close
    the transport, or end a wait (what a waiting coroutine collected there
    does): the serving must take that into account before it ends, or a
    claim would wait on with a message there for it, or on a closed
    transport, or the ended claim would keep its place and the message handed
    to it.  Two claims wait; a publish of a new group hands it over straight
    (the pure twin's ``_hand_new``), an ack exposing a group's next message
    hands that over through the general serving (``_serve_locked``).  The
    Cython transport runs no finaliser under its lock: the same outcome."""
    import gc
    import traceback

    from leasequeue._backends.inmemory.waiting import CLOSED, HANDED, IDLE
    from leasequeue.testing import ManualClock

    pure = impl.__name__.endswith("_py")
    landed = 0
    with collector_restored():
        for threshold in range(8, 33):
            for extra in range(3):
                t = impl.InMemoryTransport(clock=ManualClock())
                # A second priority level (an empty paused group): each hand-off then
                # repairs a path of the level treap, an allocation the collector counts.
                t.pause("elsewhere")
                t.set_priority("elsewhere", 9)
                if trigger == "ack":  # g's first message leased: the ack exposes "e"
                    t.publish("g", "first")
                    t.publish("g", "e")
                    held = t.claim("x", 30.0)
                records = [t._waiter(f"w{i}", 30.0, 0, lambda: None) for i in range(2)]
                for rec in records:
                    assert t._wait_start(rec) is None
                where: list = []

                def finaliser() -> None:
                    where.append([frame.name for frame in traceback.extract_stack()])
                    if action == "publish":  # two, to one group: they keep their order
                        t.publish("from-finaliser", 1)
                        t.publish("from-finaliser", 2)
                    elif action == "close":
                        t.close()
                    else:
                        assert t._wait_end(records[1], False) is None

                call = (lambda: t.publish("g", "e")) if trigger == "publish" else (lambda: t.ack(held))
                collect_during(call, finaliser, threshold, extra)
                gc.collect()
                assert where, "the finaliser did not run"
                landed += ("_hand_new" if trigger == "publish" else "_serve_locked") in where[0]
                states = [rec.state for rec in records]
                assert t._waiting_count() == 0, (threshold, extra, states)
                if action == "publish":
                    assert states == [HANDED, HANDED] and t.stats().leased == 2 and len(t) == 3
                    handed = sorted((lease.group_id, lease.event) for lease in (t._wait_end(r, True) for r in records))
                    assert handed == [("from-finaliser", 1), ("g", "e")]
                elif action == "close":
                    assert states[1] == CLOSED and t.stats().leased == (states[0] == HANDED)
                else:
                    assert states[1] == IDLE and t.stats().leased == 1 and states[0] == HANDED
                    assert t._wait_end(records[0], True).group_id == "g"
    if pure:
        assert landed, "no collection landed while the claims were served: the test tests nothing"


@pytest.mark.parametrize("serving", ["wait-start", "timer-fire"])
def test_a_message_published_by_user_code_inside_a_serving_goes_to_the_waiting_claim(impl: Any, serving: str) -> None:
    """Waiting claims are served (a wait starting, ``_wait_start``; or the
    expiry timer firing, ``_timer_fire``) and user code run there under the
    lock (a profiler hook here; a finaliser the collector starts, in life)
    publishes: the message is held until the serving is over, and then
    served to the waiting claim before the call returns, not left to wait
    for another operation.  The Cython transport runs no Python code under
    its lock: there nothing is published inside, and the claim waits."""
    from leasequeue._backends.inmemory.waiting import HANDED, IDLE, WAITING

    t = impl.InMemoryTransport(clock=ManualClock())
    rec = t._waiter("w", 30.0, 0, lambda: None)
    published: List[int] = []
    if serving == "timer-fire":
        assert t._wait_start(rec) is None  # queued: nothing to claim

    def hook(frame: Any, event: str, arg: Any) -> None:
        if (event == "call" and not published and frame.f_code.co_name == "_serve_locked"
                and frame.f_globals.get("__name__") == impl.__name__):
            published.append(t.publish("g", "from-user-code"))

    sys.setprofile(hook)
    try:
        if serving == "wait-start":
            lease = t._wait_start(rec)
        else:
            t._timer_fire()
            lease = t._wait_end(rec, True) if rec.state == HANDED else None
    finally:
        sys.setprofile(None)
    if impl.__name__.endswith("_py"):
        assert published == [1]
        assert lease is not None and (lease.group_id, lease.event, lease.worker_id) == ("g", "from-user-code", "w")
        assert rec.state == IDLE and t.stats().leased == 1
    else:
        assert not published and lease is None and rec.state == WAITING
        assert t._wait_end(rec, False) is None


def _land_finaliser_in(impl: Any, setup: Any) -> set:
    """Run ``setup()``'s operation with a collection landing at each of its first
    allocations in turn; return what a finaliser's call to the transport got
    there ("refused" when inside the operation, "ran" when outside it).  After
    each run the operation is done, whole, and nothing else changed."""
    import gc

    got: set = set()
    expected, held = _after(setup, impl)
    with collector_restored():
        for threshold in range(1, 9):
            for extra in range(5):
                t, call = setup(impl)
                inside = [True]

                def finaliser() -> None:
                    outcome = finaliser_outcome(lambda: t.pause("already-paused"))  # changes nothing when it runs
                    got.add(outcome if inside[0] else "outside:" + outcome)

                collect_during(call, finaliser, threshold, extra)
                inside[0] = False
                gc.collect()  # a finaliser not run yet runs now, outside
                assert [g.group_id for g in t.groups()] == expected, "the operation was not done whole"
                assert t.stats().messages == len(t) == sum(g.messages for g in t.groups()) == held
    return got


def _after(setup: Any, impl: Any) -> Any:
    """The group ids and message count after ``setup``'s operation, run
    with no collection in the way."""
    import gc

    gc.disable()
    try:
        t, call = setup(impl)
        call()
        return [g.group_id for g in t.groups()], len(t)
    finally:
        gc.enable()


def _purge_compacting(impl: Any) -> Any:
    """A purge that compacts its level's heap: its group is ready but not
    the heap's top, and the level already holds 32 stale entries (paused
    groups), so the pure twin allocates a set under the lock (``_compact``),
    an allocation that always counts towards a collection."""
    t = impl.InMemoryTransport(clock=ManualClock())
    for k in range(40):
        t.publish("g%d" % k, k)
    for k in range(1, 33):
        t.pause("g%d" % k)
    t.pause("already-paused")
    return t, lambda: t.purge("g33")


def _resume_shrinking(impl: Any) -> Any:
    """A resume that forgets an empty paused group as the group table drains
    below an eighth of its high-water mark, so the pure twin copies the table
    into a smaller dict under the lock (``_forget``), an allocation that
    always counts towards a collection."""
    t = impl.InMemoryTransport(clock=ManualClock())
    for k in range(1100):
        t.publish("g%d" % k, k)
    t.pause("empty")
    t.pause("already-paused")
    for k in range(1100 - 135):  # 137 groups left: 135 + the two paused ones
        t.purge("g%d" % k)
    return t, lambda: t.resume("empty")


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
@pytest.mark.parametrize("setup", [_purge_compacting, _resume_shrinking], ids=["purge", "resume"])
def test_finaliser_inside_resume_or_purge_is_refused(impl: Any, setup: Any) -> None:
    """``resume`` and ``purge`` mark themselves busy too (decisions.md,
    "Re-entrant calls and failures"): a finaliser that the garbage collector
    runs inside them, under the lock, is refused.  Each runs here where the
    pure twin allocates an object the collector counts under its lock (the
    other test only lands there by luck: free lists); the Cython transport
    allocates nothing the collector tracks under its lock, so there every
    call from a finaliser runs.  Either way nothing is half done."""
    got = _land_finaliser_in(impl, setup)
    assert got <= {"refused", "ran", "outside:ran"}, got
    if impl.__name__.endswith("_py"):
        assert "refused" in got, f"no collection landed inside the operation: {got}"
    else:
        assert "refused" not in got, got
