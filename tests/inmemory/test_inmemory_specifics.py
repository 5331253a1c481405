"""What the conformance kit does not cover: the in-memory classes themselves.

The rules of the contract run on both in-memory transports through
``leasequeue.testing.TransportContract`` (``test_contract_inmemory.py``).
This file keeps what is specific to ``_inmemory_py`` / ``_inmemory_c``: the
``Lease`` class (public constructor, hash, repr, no subclass, no pickle,
forging), the ``InMemoryTransport`` constructor, which operations read the
clock (docs/decisions.md), a lease of the other implementation, and the
garbage collector's finalisers.  Every test takes the ``transport`` /
``make_transport`` / ``impl`` fixtures of ``conftest.py``, so it runs on
both implementations.
"""

from __future__ import annotations

import copy
import gc
import importlib
import math
import os
import pickle
import threading
from types import ModuleType
from typing import Any, Callable

import pytest

from helpers import CPYTHON_ONLY_REASON, IS_CPYTHON
from leasequeue.testing import ManualClock

import leasequeue
from leasequeue.testing._contract_base import ContractClock
from leasequeue.testing._rules_bad_input import assert_changes_nothing, bad_input_history

# -- the Lease class ------------------------------------------------------------


def test_lease_constructor_equality_hash_slots_repr(transport: Any, impl: ModuleType) -> None:
    event = ["unhashable"]
    transport.publish("g", event)
    lease = transport.claim("w", 30)
    same = impl.Lease(1, "g", event, "w", 1030.0, 1)  # positional, seed fields first
    assert same == lease and lease == same and not (same != lease)
    assert hash(same) == hash(lease) == hash((1, "g", "w", 1030.0, 1))
    assert impl.Lease(1, "g", ["unhashable"], "w", 1030.0, 1) != lease  # equal but not the same event
    for field, value in (("seq", 2), ("group_id", "h"), ("worker_id", "x"), ("expires_at", 1.0), ("attempt", 2)):
        fields = dict(seq=1, group_id="g", event=event, worker_id="w", expires_at=1030.0, attempt=1)
        fields[field] = value
        assert impl.Lease(**fields) != lease
    assert lease.__eq__("not a lease") is NotImplemented
    assert len({lease, same}) == 1
    with pytest.raises(AttributeError):
        lease.new_attribute = 1  # type: ignore[attr-defined]
    assert repr(lease) == (
        "Lease(seq=1, group_id='g', event=['unhashable'], worker_id='w', expires_at=1030.0, attempt=1)"
    )


def test_lease_final_not_picklable_copy_is_itself(transport: Any, impl: ModuleType) -> None:
    transport.publish("g", "e")
    lease = transport.claim("w", 30)
    with pytest.raises(TypeError):
        type("Sub", (impl.Lease,), {})
    with pytest.raises(TypeError):
        pickle.dumps(lease)
    assert copy.copy(lease) is lease
    assert copy.deepcopy(lease) is lease
    transport.ack(copy.copy(lease))
    assert len(transport) == 0


def test_forged_lease_equal_to_a_real_one_is_not_current(transport: Any, impl: ModuleType) -> None:
    transport.publish("g", "e")
    lease = transport.claim("w", 30)
    forged = impl.Lease(lease.seq, lease.group_id, lease.event, lease.worker_id, lease.expires_at, lease.attempt)
    assert forged == lease
    for op in (transport.ack, transport.nack, lambda x: transport.extend(x, 5)):
        with pytest.raises(leasequeue.LeaseLost):
            op(forged)
    transport.ack(lease)


# -- the InMemoryTransport class ---------------------------------------------


def test_clock_not_callable(make_transport: Callable[..., Any]) -> None:
    for bad in (None, 1000.0, "time"):
        with pytest.raises(TypeError):
            make_transport(clock=bad)


def other_module(impl: ModuleType) -> ModuleType | None:
    """The other implementation's module, when it can be imported."""
    twin = "transport_c" if impl.__name__.endswith("_py") else "transport_py"
    name = f"leasequeue._backends.inmemory.{twin}"
    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("LEASEQUEUE_NO_EXTENSIONS"):
            return None
        raise


def test_lease_of_the_other_implementation(make_transport: Callable[..., Any], impl: ModuleType) -> None:
    """decisions.md: the type check is against *this* implementation's Lease
    (each implementation has its own class): TypeError, nothing changed."""
    other = other_module(impl)
    if other is None:
        pytest.skip("only one implementation available")
    assert other.Lease is not impl.Lease
    foreign_clock = ContractClock()
    foreign = bad_input_history(other.InMemoryTransport(clock=foreign_clock), foreign_clock)["current"]
    for call in (
        lambda t, l: t.ack(foreign),
        lambda t, l: t.nack(foreign),
        lambda t, l: t.nack(foreign, 3),
        lambda t, l: t.extend(foreign, 3),
    ):
        assert_changes_nothing(make_transport, call, TypeError)


def test_constructor_clock(make_transport: Callable[..., Any]) -> None:
    with pytest.raises(TypeError):
        make_transport(clock=5)
    t = make_transport(ManualClock(50.0))  # positional
    t.publish("g", "e")
    assert t.claim("w", 1).expires_at == 51.0
    default = make_transport()  # time.time
    default.publish("g", "e")
    assert default.claim("w", 0) is not None


def test_clock_read_once_by_claim_extend_stats_and_parking_nack_only(make_transport: Callable[..., Any]) -> None:
    clock = ContractClock()
    t = make_transport(clock=clock)

    def reads(op: Callable[[], Any]) -> int:
        before = clock.reads
        op()
        return clock.reads - before

    assert reads(lambda: t.publish("g", 1)) == 0
    assert reads(lambda: t.publish("g", 2)) == 0
    lease = t.claim("w", 10)
    assert clock.reads == 1
    assert reads(lambda: t.claim("w", 10)) == 1  # nothing eligible: still one read
    assert reads(lambda: t.extend(lease, 10)) == 1
    assert reads(lambda: t.nack(lease, 0)) == 0
    assert reads(lambda: t.nack(t.claim("w", 10), 5)) == 2  # claim + parking nack
    clock.advance(10)
    lease = t.claim("w", 10)
    assert reads(lambda: t.nack(lease, -0.0)) == 0
    assert reads(lambda: t.ack(t.claim("w", 10))) == 1  # the claim only
    assert reads(t.stats) == 1
    assert reads(lambda: len(t)) == 0
    assert reads(t.close) == 0


# -- the garbage collector's finalisers --------------------------------------


def _run_with_deadline(target: Callable[[], None], seconds: float = 20.0) -> None:
    """Run ``target`` in a daemon thread; fail (instead of hanging) on deadlock."""
    errors: list[BaseException] = []

    def wrapper() -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=wrapper, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "deadlock: the operation never returned"
    if errors:
        raise errors[0]


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
def test_gc_finaliser_calling_back_during_operations(transport: Any) -> None:
    """Any finaliser is user code, including one the cycle collector runs in
    the middle of an operation: it may use the transport (no deadlock) and
    must see it whole.  A collection threshold of 1 makes collections happen
    at almost every allocation, so one inside the locked region would run a
    finaliser there."""
    fired: list[int] = []

    class Garbage:
        def __init__(self) -> None:
            self.me = self  # freed only by the cycle collector

        def __del__(self) -> None:
            fired.append(len(transport))
            transport.publish("from-finaliser", len(fired))

    acked: list[int] = []

    def work() -> None:
        for i in range(3000):
            Garbage()
            transport.publish(f"g{i % 50}", i)
            lease = transport.claim("w", 10)
            if lease is not None:
                transport.ack(lease)
                acked.append(lease.seq)
            transport.stats()

    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        _run_with_deadline(work)
    finally:
        gc.set_threshold(*old)
    gc.collect()
    assert len(fired) == 3000
    assert len(transport) + len(acked) == 3000 + 3000  # every publish is there or acked
    assert len(set(acked)) == len(acked)


@pytest.mark.parametrize("through", ["transport", "lease"])
def test_cycles_through_held_events_are_collected(make_transport: Callable[..., Any], through: str) -> None:
    """Events are held by reference where the cycle collector sees them: an
    event that refers back to its transport (or to its lease) is freed."""
    import weakref

    class Event:
        pass

    t = make_transport(clock=ManualClock())
    event = Event()
    t.publish("g", event)
    t.publish("g", Event())
    lease = t.claim("w", 10)
    if through == "transport":
        event.back = t  # type: ignore[attr-defined]
    else:
        event.back = lease  # type: ignore[attr-defined]
        t.ack(lease)  # only the lease <-> event cycle holds it now
    alive = weakref.ref(event)
    del t, event, lease
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda t, lease: t.claim("w", float("nan")), "visibility must not be NaN"),
        (lambda t, lease: t.claim("w", -1), "visibility must be >= 0, not -1"),
        (lambda t, lease: t.extend(lease, float("nan")), "visibility must not be NaN"),
        (lambda t, lease: t.extend(lease, -0.5), "visibility must be >= 0, not -0.5"),
        (lambda t, lease: t.nack(lease, float("nan")), "delay must not be NaN"),
        (lambda t, lease: t.nack(lease, -(10**400)), "delay must be >= 0, not -1000"),
    ],
    ids=["claim-nan", "claim-negative", "extend-nan", "extend-negative", "nack-nan", "nack-huge-negative"],
)
def test_a_bad_duration_says_what_is_wrong_with_it(transport: Any, call: Callable[..., Any], message: str) -> None:
    """NaN and a negative duration are both ValueError: the message tells
    which, and names the argument (and the value, when it is a number)."""
    transport.publish("g", "e")
    lease = transport.claim("w", 10)
    with pytest.raises(ValueError) as caught:
        call(transport, lease)
    assert str(caught.value).startswith(message)
    transport.ack(lease)  # unchanged: still current


class _LyingInt(int):
    """An ``int`` subclass whose comparisons lie and are counted: accepted as
    the plain ``int`` it is, so none of them may run (under the lock or not)."""

    calls = 0

    def _lie(self, other: Any) -> bool:
        type(self).calls += 1
        return False

    __lt__ = __le__ = __gt__ = __ge__ = _lie


def test_an_int_subclass_count_is_used_as_the_int_it_is(transport: Any) -> None:
    for group in "abc":
        transport.publish(group, "e")
    _LyingInt.calls = 0
    leases = transport.claim_many("w", 10, _LyingInt(2))
    assert [lease.group_id for lease in leases] == ["a", "b"]
    assert _LyingInt.calls == 0


@pytest.mark.parametrize("item", [["g", "e"], "ge", None], ids=["list", "str", "none"])
def test_a_publish_many_item_that_is_no_tuple_is_named_as_such(transport: Any, item: Any) -> None:
    with pytest.raises(TypeError, match=f"^publish_many items must be tuples, not {type(item).__name__}$"):
        transport.publish_many([("g", "first"), item])
    assert len(transport) == 0


def _treap_nodes(node: Any, low: float, high: float) -> Any:
    """Check the subtree of the pure twin's level treap at ``node``: search
    order by priority inside ``(low, high)``, heap order by weight, ``best``
    the smallest entry of the subtree.  Returns the subtree's size."""
    if node is None:
        return 0
    assert low < node.priority < high, "levels out of priority order"
    for child in (node.left, node.right):
        assert child is None or child.weight <= node.weight, "a child outweighs its parent: the treap is unbalanced"
    entries = [e for e in (node.heap[0] if node.heap else None, *(c.best for c in (node.left, node.right) if c)) if e]
    assert node.best == (min(entries, key=lambda e: e[0]) if entries else None)
    return 1 + _treap_nodes(node.left, low, node.priority) + _treap_nodes(node.right, node.priority, high)


def test_the_pure_twins_level_treap_keeps_its_orders_as_levels_come_and_go() -> None:
    """White box, pure twin only (the Cython core's treap is C structs): the
    priority levels stay a treap (search order by priority, heap order by
    random weight, so O(log n) deep) while levels are created and deleted.
    A treap that loses its heap order still claims right, only slower: the
    behavioural tests cannot see that."""
    import random

    from leasequeue._backends.inmemory import transport_py as _inmemory_py

    rng = random.Random(7)
    t = _inmemory_py.InMemoryTransport(clock=ManualClock())
    held = []
    for step in range(3000):
        if held and rng.random() < 0.45:
            t.ack(held.pop(rng.randrange(len(held))))  # its group empties: the level may go
        else:
            t.publish(f"g{step}", step, priority=rng.randrange(-60, 60))
            lease = t.claim("w", 1e9, -(2**63))
            if lease is not None:
                held.append(lease)
        if step % 50 == 0 or step > 2950:
            assert _treap_nodes(t._root, -math.inf, math.inf) == len(t._levels)
    for lease in held:
        t.ack(lease)
    while (lease := t.claim("w", 1e9, -(2**63))) is not None:
        t.ack(lease)
    assert t._root is None and not t._levels  # every level went with its last group


@pytest.mark.parametrize("backlog", [1, 40, 1000])
def test_the_pure_twins_ack_cuts_a_groups_message_list_once_in_a_while(backlog: int) -> None:
    """White box, pure twin only (the Cython core's lists are C arrays): ack
    leaves a spent slot at the front of its group's message list and cuts the
    spent slots off only once they are many (at least 32, and as many as the
    backlog), so that an ack costs O(1) amortised and the list stays within
    about twice the backlog.  Cutting on every ack costs O(backlog) per ack, and never
    cutting keeps a slot for every message the group ever held: the
    behavioural tests see neither (the memory test sees the second)."""
    from leasequeue._backends.inmemory import transport_py as _inmemory_py

    class Cuts(list):  # type: ignore[type-arg]
        count = 0

        def __delitem__(self, index: Any) -> None:
            self.count += 1
            super().__delitem__(index)

    t = _inmemory_py.InMemoryTransport(clock=ManualClock())
    for _ in range(backlog):
        t.publish("G", None)
    group = t._groups["G"]
    group.messages = cuts = Cuts(group.messages)
    longest = 0
    rounds = 2000
    for _ in range(rounds):
        t.publish("G", None)
        t.ack(t.claim("w", 60.0))
        assert t._groups["G"].messages is cuts
        longest = max(longest, len(cuts))
    # a cut every max(32, backlog) acks; loose bounds, not the tuning constants
    every = max(32, backlog)
    assert 1 <= cuts.count <= 2 * (rounds // every) + 1, cuts.count
    assert longest <= 4 * every, longest
    assert len(t) == backlog


def test_the_pure_twins_expiry_heap_is_rebuilt_only_once_in_a_while() -> None:
    """White box, pure twin only: each extend leaves the old expiry entry
    behind, stale; the expiry heap is rebuilt from its live entries only once
    the stale ones outnumber them (and 64 more), so that a lock costs O(1)
    amortised however many leases are live.  Rebuilding on every lock, or
    after a fixed number of stale entries, costs O(live) per lock: the
    behavioural tests cannot see that."""
    from leasequeue._backends.inmemory import transport_py as _inmemory_py

    clock = ManualClock()
    t = _inmemory_py.InMemoryTransport(clock=clock)
    live = 1000
    for i in range(live):
        t.publish("g%d" % i, None)
    # every lease ends at its own time, in no particular order
    ends = [60.0 + (j * 389 % live) / live for j in range(live)]
    leases = [t.claim("w", end) for end in ends]
    rounds = 3000
    state = {"heap": t._expiry, "lease": leases[0]}

    def paced(step: Callable[[int], Any]) -> None:
        """``rounds`` rounds of ``step``, each leaving one stale entry: a
        rebuild every live + 65 of them; loose bounds, not the tuning constants."""
        rebuilds = longest = 0
        for i in range(rounds):
            step(i)
            if t._expiry is not state["heap"]:
                rebuilds += 1
                state["heap"] = t._expiry
            longest = max(longest, len(t._expiry))
        assert 1 <= rebuilds <= 2 * (rounds // (live + 64)) + 1, rebuilds
        assert longest <= 4 * live + 64, longest

    def extend(i: int) -> None:
        ends[0] = 60.0 + (i * 7919 % rounds) / rounds
        state["lease"] = t.extend(state["lease"], ends[0])

    paced(extend)
    # a group leased, acked and leased again leaves one stale entry per round
    # too: the same pacing
    for _ in range(rounds):
        t.publish("hot", None)
    paced(lambda i: t.ack(t.claim("w", 60.0)))  # "hot": every other group is leased
    # endless leases taken and acked (they have no expiry entry) do not count
    # as live entries: the pacing afterwards is the same
    for _ in range(rounds):
        t.publish("endless", None)
    for _ in range(rounds):
        t.ack(t.claim("w", math.inf))
    paced(extend)
    # the rebuilt heap still frees each lease when its time runs out
    start = clock.now
    for k in range(12):
        clock.set(start + 60.0 + k / 10)
        assert t.stats().leased == sum(1 for end in ends if start + end >= clock.now), k
    assert len({t.claim("w", 60.0).group_id for _ in range(live)}) == live


def test_the_pure_twins_table_of_groups_is_copied_only_a_few_times_as_it_drains() -> None:
    """White box, pure twin only: as a backlog of groups drains, the table of
    groups is copied into a smaller one each time it holds an eighth of what
    it held at the last copy (test_memory_bounds checks that memory comes
    back), so a drain of n groups copies O(log n) times, O(n) in all, and a
    backlog that grows while groups are forgotten is never copied.  Copying
    on every forget below some size, or again and again as the table grows,
    costs O(n) per ack: the behavioural tests cannot see that."""
    from leasequeue._backends.inmemory import transport_py as _inmemory_py

    t = _inmemory_py.InMemoryTransport(clock=ManualClock())
    table = t._groups
    copies = 0
    for i in range(20_000):  # the backlog grows while groups are forgotten: no copy
        t.publish("g%d" % (2 * i), None)
        t.publish("g%d" % (2 * i + 1), None)
        t.ack(t.claim("w", 60.0))
        if t._groups is not table:
            copies += 1
            table = t._groups
    assert copies == 0, copies
    assert len(t._groups) == 20_000
    while (lease := t.claim("w", 60.0)) is not None:
        t.ack(lease)
        if t._groups is not table:
            copies += 1
            table = t._groups
    assert 1 <= copies <= 10, copies
    assert not t._groups


def test_the_transport_as_a_context_manager_closes_and_repr_counts(transport_cls: Any) -> None:
    with transport_cls(clock=ManualClock()) as t:
        assert not t.closed
        t.publish("g", "e")
        t.publish("h", "f")
        t.publish("g", "e2")
        assert repr(t).endswith(f"{type(t).__qualname__} messages=3 groups=2>")
    assert t.closed
