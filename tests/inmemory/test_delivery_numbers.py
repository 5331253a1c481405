"""Both twins: the delivery number a lease carries (``Lease._delivery``,
docs/decisions.md "Fencing by delivery"), the leases the durable backends
build with one (``_durable_lease``, ``durable.lease_fence``), Part 5's
operations refused when user code re-enters the transport in the middle of
another operation, and a few paths beside them: a keyed ``publish_many``
waking a waiting claim, a bury reason given as a ``str`` subclass."""

from __future__ import annotations

import sys
from typing import Any, List

from leasequeue import LeaseLost
from leasequeue._backends import durable
from leasequeue.testing import ManualClock


def test_a_lease_names_its_delivery_by_the_claim_number(impl: Any) -> None:
    t = impl.InMemoryTransport(clock=ManualClock())
    for group in ("a", "b", "a"):
        t.publish(group, group)
    first = t.claim("w", 10)
    second = t.claim("w", 10)
    assert (first._delivery, second._delivery) == (1, 2)  # the claims' numbers
    assert t.extend(first, 20)._delivery == 1  # the same delivery
    t.release(first)
    again = t.claim("w", 10)
    assert (again.group_id, again.attempt, again._delivery) == ("a", first.attempt, 3)
    assert impl.Lease(1, "a", "a", "w", 0.0, 1)._delivery is None  # built by hand: names none


def test_a_durable_lease_carries_its_delivery_and_compares_by_its_fields(impl: Any) -> None:
    event = ["e"]
    lease = impl._durable_lease(7, "g", event, "w", 12.5, 2, 41)
    assert type(lease) is impl.Lease
    assert (lease.seq, lease.group_id, lease.event, lease.worker_id, lease.expires_at, lease.attempt) == (
        7, "g", event, "w", 12.5, 2)
    assert lease._delivery == 41 and durable.lease_delivery(lease) == 41
    by_hand = impl.Lease(7, "g", event, "w", 12.5, 2)
    assert lease == by_hand and hash(lease) == hash(by_hand)  # the number is private: not compared
    assert durable.lease_delivery(by_hand) is None
    # an in-memory transport never takes it: it has no owner token
    t = impl.InMemoryTransport(clock=ManualClock())
    t.publish("g", event)
    t.claim("w", 10)
    try:
        t.ack(lease)
    except LeaseLost:
        pass
    else:
        raise AssertionError("an in-memory transport accepted a lease it did not issue")
    assert len(t) == 1


def test_part5_calls_are_refused_from_user_code_under_the_lock(impl: Any) -> None:
    """Pure twin: user code that runs in the middle of an operation (a hook
    on its ``_settle``, as a finaliser the collector starts there would) gets
    ``RuntimeError`` from ``retry``, ``release`` and ``publish_many`` (delayed
    or keyed, too); a nested ``publish`` with a key is taken.  Cython: no
    Python function runs under its lock."""
    t = impl.InMemoryTransport(clock=ManualClock())
    for i in range(3):
        t.publish("g", i)
    t.publish("h", "h1")
    lease = t.claim("w", 10)
    other = t.claim("w", 10)
    seen: List[str] = []
    module = impl.__name__

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "_settle" and frame.f_globals.get("__name__") == module:
            sys.setprofile(None)
            for call in (lambda: t.retry("h"), lambda: t.release(other),
                         lambda: t.publish_many([("n", 1, 0, "k")]), lambda: t.publish_many([("n", 1)], delay=5)):
                try:
                    call()
                    seen.append("ran")
                except RuntimeError as exc:
                    seen.append("refused" if "middle of another operation" in str(exc) else repr(exc))
            seen.append(f"published {t.publish('nested', 'n', key='once')}")

    sys.setprofile(hook)
    try:
        got = t.ack_and_claim(lease, "w", 10)
    finally:
        sys.setprofile(None)
    if impl.__name__.endswith("_py"):
        assert seen == ["refused", "refused", "refused", "refused", "published 5"]
        assert t.publish("nested", "again", key="once") == 5  # its key is held
    else:
        assert seen == []
    assert (got.seq, got.attempt) == (2, 1)
    t.ack(other)  # the nested release was refused: the lease is still current


def test_the_durable_fence_of_a_lease(impl: Any) -> None:
    """``durable.lease_fence``: the fields and the delivery number a durable
    backend matches; None when the fields name no delivery; a number no
    claim can have becomes 0 (names nothing)."""
    assert durable.lease_fence(impl._durable_lease(7, "g", None, "w", 0.0, 2, 41)) == ("g", 2, 7, "w", 41)
    assert durable.lease_fence(impl.Lease(7, "g", None, "w", 0.0, 2)) == ("g", 2, 7, "w", None)
    assert durable.lease_fence(impl._durable_lease(7, "g", None, "w", 0.0, 2, -5)) == ("g", 2, 7, "w", 0)
    assert durable.lease_fence(impl._durable_lease(7, "g", None, "w", 0.0, 2, 0)) == ("g", 2, 7, "w", 0)
    for bad in (impl.Lease("7", "g", None, "w", 0.0, 2), impl.Lease(7, "g", None, "w", 0.0, 0),
                impl.Lease(7, 5, None, "w", 0.0, 2), impl.Lease(2**63, "g", None, "w", 0.0, 1)):
        assert durable.lease_fence(bad) is None
    issued = durable.issue(3, "g", "e", "w", 1.5, 1, 9)
    assert (issued.seq, issued.event, issued._delivery) == (3, "e", 9)
    assert durable.issue(3, "g", "e", "w", 1.5, 1)._delivery is None


class _Reason(str):
    pass


def test_a_keyed_publish_many_wakes_a_waiting_claim(impl: Any) -> None:
    """``publish_many`` with keys (the path that checks the holds) wakes a
    claim that waits, as the plain batch does; a held key wakes nobody."""
    import threading

    t = impl.InMemoryTransport(dedup_window=0.0)
    got: List[Any] = []
    waiter = threading.Thread(target=lambda: got.append(t.claim("w", 30, timeout=30)))
    waiter.start()
    while t.stats().messages == 0 and not t._waiting_count():
        pass
    assert t.publish_many([("g", "e1", 0, "k"), ("g", "e2", 0, "k")]) == [1, 1]
    waiter.join(10)
    assert not waiter.is_alive() and got[0].seq == 1 and got[0].event == "e1"


def test_a_bury_reason_of_a_str_subclass_is_kept_as_a_str(impl: Any) -> None:
    t = impl.InMemoryTransport(clock=ManualClock())
    t.publish("g", "e")
    t.bury(t.claim("w", 10), _Reason("poison"))
    reason = t.group("g").reason
    assert reason == "poison" and type(reason) is str


def test_the_package_lists_its_lazy_backends() -> None:
    import leasequeue

    assert {"PostgresTransport", "SQLiteTransport", "InMemoryTransport"} <= set(dir(leasequeue))
