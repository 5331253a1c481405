"""The differential checker can fail, and says why in a few lines.

``check_differential`` is only worth something if it catches broken
transports.  Here it is fed deliberately broken subclasses of the pure twin
and must raise ``DifferentialFailure`` with a short, 1-minimal operation list
that replays to the same disagreement, both through ``replay`` and as the
printed Python script.  It must also refuse to pass what a lax harness would
let through: an error no rule allows, even when every side raises it.
"""

from __future__ import annotations

import heapq
import math
import os
import pickle
import re
import subprocess
import sys
from typing import Any, Callable

import pytest

import leasequeue
from helpers import package_root
from leasequeue import LeaseLost
from leasequeue._backends.inmemory.transport_py import InMemoryTransport as Pure
from leasequeue.testing import DifferentialFailure, ManualClock, ReferenceTransport, check_differential, replay
from leasequeue.testing._differential import detect_capabilities
from leasequeue.testing._generator import call
from leasequeue.testing._harness import SKIPPED, Disagreement, Harness, Side, describe
from leasequeue.testing._ops import ClockFault, LeaseRef
from leasequeue.testing._shrink import ddmin


class OffByOneFloor(Pure):
    """claim() serves groups one priority below the floor."""

    def claim(self, worker_id: Any, visibility: Any, min_priority: Any = 0) -> Any:
        if type(min_priority) is int and -(2**63) < min_priority <= 2**63 - 1:
            min_priority -= 1
        return super().claim(worker_id, visibility, min_priority)


class UnfencedAck(Pure):
    """ack() of a lease that is not current quietly does nothing."""

    def ack(self, lease: Any) -> None:
        try:
            super().ack(lease)
        except LeaseLost:
            pass


class ExpiryAtOrBefore(Pure):
    """Expires a lease at ``expires_at <= now`` (the contract: ``<``)."""

    def _expire(self, now: float) -> None:
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            _, tick, group = expiry[0]
            if group.tick == tick:
                self._make_ready(group)
                self._unlock(group)
            heapq.heappop(expiry)


class CopyingEvents(Pure):
    """Stores a copy of each event, as a serialising backend does."""

    def publish(self, group_id: Any, event: Any, priority: Any = 0) -> int:
        return super().publish(group_id, pickle.loads(pickle.dumps(event)), priority)


def factory(cls: type) -> Callable[[ManualClock], Any]:
    return lambda clock: cls(clock=clock)


def first_failure(make: Callable[[ManualClock], Any], seeds: int = 10, **kwargs: Any) -> DifferentialFailure:
    for seed in range(seeds):
        try:
            check_differential(make, ops=2000, seed=seed, **kwargs)
        except DifferentialFailure as failure:
            return failure
    raise AssertionError(f"no failure in {seeds} seeds")


def outcome_of_script(script: str, make: Callable[[ManualClock], Any]) -> str:
    """Run a printed reproduction; describe what its last line did."""
    namespace: dict[str, Any] = {"make_transport": make}
    try:
        exec(compile(script, "<reproduction>", "exec"), namespace)
    except Exception as exc:  # the last line raised
        return describe(("raises", exc))
    return describe(("returns", namespace["result"]))


@pytest.mark.parametrize("broken, longest", [(OffByOneFloor, 3), (UnfencedAck, 6), (ExpiryAtOrBefore, 10)])
def test_broken_transport_is_caught_with_a_short_reproduction(broken: type, longest: int) -> None:
    make = factory(broken)
    failure = first_failure(make)
    assert isinstance(failure, AssertionError)
    assert 1 <= len(failure.ops) <= longest, str(failure)
    assert "1-minimal" in str(failure)
    assert failure.expected != failure.actual
    # the operation list replays to the same disagreement...
    with pytest.raises(Disagreement) as again:
        replay(make, failure.ops)
    assert again.value.uid == failure.ops[-1][0]
    # ...and so does the printed script, on both sides
    assert outcome_of_script(failure.script, make) == failure.actual
    assert outcome_of_script(failure.script, ReferenceTransport) == failure.expected
    # 1-minimal: without any one operation it passes
    for i in range(len(failure.ops)):
        replay(make, failure.ops[:i] + failure.ops[i + 1:])


def test_the_off_by_one_floor_reproduction() -> None:
    failure = first_failure(factory(OffByOneFloor))
    lines = [line for line in failure.script.splitlines() if line.startswith(("t.", "result", "l"))]
    assert len(lines) == 2
    assert lines[0].startswith("t.publish(")  # a group one level below the floor...
    assert lines[1].startswith("result = t.claim(")  # ...is served
    assert failure.expected == "-> None" and failure.actual.startswith("-> Lease(")


def test_shrinking_is_deterministic() -> None:
    scripts = {first_failure(factory(ExpiryAtOrBefore)).script for _ in range(2)}
    assert len(scripts) == 1


def test_without_shrinking_the_whole_run_is_reported() -> None:
    shrunk = first_failure(factory(ExpiryAtOrBefore))
    whole = first_failure(factory(ExpiryAtOrBefore), shrink=False)
    assert len(whole.ops) > len(shrunk.ops)
    assert "not shrunk" in str(whole)
    assert whole.ops[-1][0] == int(str(whole).split("operation #")[1].split(" ")[0])


def test_a_serialising_backend_opts_out_of_identity() -> None:
    failure = first_failure(factory(CopyingEvents))
    assert len(failure.ops) == 2 and "event" in str(failure)
    for seed in range(3):
        summary = check_differential(factory(CopyingEvents), ops=1500, seed=seed, preserves_identity=False)
        assert summary.tally["claim lease"] > 0


def test_ddmin_is_1_minimal() -> None:
    needed = {3, 17, 18, 40}
    items = list(range(60))
    result, complete = ddmin(items, lambda c: needed <= set(c), budget=10**6)
    assert complete and result == sorted(needed)
    result, complete = ddmin(items, lambda c: needed <= set(c), budget=100)
    assert not complete and needed <= set(result)


# -- the harness is strict ---------------------------------------------------------


class StatsKeyError(ReferenceTransport):
    def stats(self) -> Any:
        raise KeyError("a bug")


def test_an_error_no_rule_allows_fails_even_on_every_side() -> None:
    harness = Harness([Side("one", StatsKeyError), Side("two", StatsKeyError)])
    with pytest.raises(Disagreement, match="an error no rule allows") as failure:
        harness.apply(call("stats"))
    assert isinstance(failure.value.__cause__, KeyError)


def test_an_unexpected_error_in_the_transport_is_reported() -> None:
    with pytest.raises(DifferentialFailure, match="an error no rule allows") as failure:
        check_differential(factory(StatsKeyError), ops=500, seed=0)
    assert "KeyError: 'a bug'" in str(failure.value)


class RaisesClockFault(ReferenceTransport):
    def publish(self, group_id: Any, event: Any, priority: Any = 0) -> int:
        raise ClockFault("not from the clock")


def test_the_clock_fault_passes_only_when_the_clock_raised_it() -> None:
    sides = [Side("one", RaisesClockFault, foreign=False), Side("two", RaisesClockFault, foreign=False)]
    harness = Harness(sides)
    assert harness.apply(("fault", ClockFault, call("publish", "g", 1))) == ("raise", "ClockFault")
    with pytest.raises(Disagreement, match="an error no rule allows"):
        harness.apply(call("publish", "g", 1))


def test_errors_must_be_of_the_same_kind() -> None:
    class ValueErrorPublish(ReferenceTransport):
        def publish(self, group_id: Any, event: Any, priority: Any = 0) -> int:
            raise ValueError("wrong kind")

    harness = Harness([Side("reference", ReferenceTransport), Side("transport", ValueErrorPublish, foreign=False)])
    with pytest.raises(Disagreement, match="the sides disagree"):
        harness.apply(call("publish", 7, "e"))  # the reference raises TypeError


def test_missing_leases_and_blocking_claims_are_skipped_alike() -> None:
    harness = Harness([Side("a", ReferenceTransport), Side("b", ReferenceTransport)])
    assert harness.apply(call("ack", LeaseRef(99))) is SKIPPED  # its producer never ran
    assert harness.apply(call("publish", "g", 1)) == ("int", "int", 1)
    assert harness.apply(call("claim", "w", 5, timeout=None)) is SKIPPED  # would block
    assert harness.apply(call("claim", "w", 5, timeout=0.01))[0] == "lease"  # a short wait may run
    harness.apply(call("close"))
    assert harness.apply(call("claim", "w", 5, timeout=math.inf)) is None  # closed: returns at once
    assert harness.skipped == 2


def test_results_are_compared_with_their_types() -> None:
    class BoolPriority(ReferenceTransport):
        def group(self, group_id: Any) -> Any:
            info = super().group(group_id)
            return info._replace(priority=True) if info is not None else None

    harness = Harness([Side("reference", ReferenceTransport), Side("transport", BoolPriority)])
    harness.apply(call("publish", "g", 1, 1))
    with pytest.raises(Disagreement):  # True == 1, but a bool is not an int
        harness.apply(call("group", "g"))


# -- capabilities ------------------------------------------------------------------


class PartOne:
    """A transport with Part 1 only (delegating to the reference)."""

    def __init__(self, clock: ManualClock) -> None:
        self._t = ReferenceTransport(clock)
        for name in ("publish", "ack", "nack", "extend", "stats", "close"):
            setattr(self, name, getattr(self._t, name))

    def claim(self, worker_id: Any, visibility: Any, min_priority: Any = 0) -> Any:
        return self._t.claim(worker_id, visibility, min_priority)

    def __len__(self) -> int:
        return len(self._t)


def test_part_two_is_driven_only_where_it_exists() -> None:
    caps = detect_capabilities(PartOne)
    assert caps.methods == frozenset() and caps.waiting is False
    summary = check_differential(PartOne, ops=1000, seed=1)
    assert not any(key.split()[0] in ("pause", "claim_many", "groups") for key in summary.tally)
    full = detect_capabilities(ReferenceTransport)
    assert full.waiting and len(full.methods) == 13
    summary = check_differential(ReferenceTransport, ops=3000, seed=1)
    for method in ("pause", "resume", "group", "publish_many", "claim_many", "ack_many"):
        assert any(key.startswith(method + " ") for key in summary.tally), method
    assert detect_capabilities(ReferenceTransport, batches=False, waiting=False) == full._replace(
        methods=full.methods - {"publish_many", "claim_many", "ack_many"}, waiting=False)
    with pytest.raises(ValueError, match="no pause"):
        check_differential(PartOne, control_plane=True)
    with pytest.raises(ValueError, match="no bury"):
        check_differential(PartOne, quarantine=True)
    with pytest.raises(ValueError, match="no ack_and_claim"):
        check_differential(PartOne, ack_and_claim=True)
    with pytest.raises(ValueError, match="timeout"):
        check_differential(PartOne, waiting=True)


def test_quarantine_is_driven_only_where_it_exists() -> None:
    """Part 4's operations are driven against a transport that has them
    (bad input included), and left out, with the streams of before, when
    switched off."""
    summary = check_differential(ReferenceTransport, ops=3000, seed=2)
    for key in ("bury None", "bury raise", "skip bool", "peek list", "peek raise"):
        assert summary.tally.get(key, 0) > 0, key
    without = check_differential(ReferenceTransport, ops=3000, seed=2, quarantine=False)
    assert "bury" not in without.capabilities.methods
    assert not any(key.split()[0] in ("bury", "skip", "peek") for key in without.tally)


def test_ack_and_claim_is_driven_only_where_it_exists() -> None:
    """``ack_and_claim`` is driven against a transport that has it -- leases
    back, ``None``, stale and forged leases, bad input, a failing clock, and
    leases it returned used by later operations -- and left out when
    switched off."""
    before_part5 = {"later": False, "once": False, "release": False}  # the stream this seed was chosen on
    summary = check_differential(ReferenceTransport, ops=3000, seed=3, **before_part5)
    for key in ("ack_and_claim lease", "ack_and_claim None", "ack_and_claim raise", "fault:ack_and_claim raise"):
        assert summary.tally.get(key, 0) > 0, key
    without = check_differential(ReferenceTransport, ops=3000, seed=3, ack_and_claim=False)
    assert "ack_and_claim" not in without.capabilities.methods
    assert not any(key.split()[0].endswith("ack_and_claim") for key in without.tally)


def test_a_lease_from_ack_and_claim_is_replayed_and_printed() -> None:
    """A failure after a lease that ``ack_and_claim`` returned: the shrunk
    script names that lease (``lN = t.ack_and_claim(...)``) and ``replay``
    runs it again."""

    class ExtendForgetsTheWorker(ReferenceTransport):  # wrong only for leases ack_and_claim made
        def ack_and_claim(self, *args: Any, **kwargs: Any) -> Any:
            lease = super().ack_and_claim(*args, **kwargs)
            if lease is not None:
                self._made.add((lease.seq, lease.attempt))
            return lease

        def extend(self, lease: Any, visibility: float) -> Any:
            new = super().extend(lease, visibility)
            if (new.seq, new.attempt) in self._made:
                object.__setattr__(new, "worker_id", new.worker_id + "?")
            return new

        def __init__(self, clock: Any) -> None:
            super().__init__(clock)
            self._made: set = set()

    with pytest.raises(DifferentialFailure) as caught:
        for seed in range(20):
            check_differential(ExtendForgetsTheWorker, ops=2000, seed=seed)
    failure = caught.value
    assert re.search(r"^l(\d+) = t\.ack_and_claim\(", failure.script, re.M), failure.script
    assert "t.extend(l" in failure.script
    with pytest.raises(AssertionError):
        replay(ExtendForgetsTheWorker, failure.ops)


def test_the_kit_imports_without_pytest_or_hypothesis() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pytest', '_pytest', 'hypothesis'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from leasequeue.testing import ReferenceTransport, check_differential\n"
        "print(check_differential(ReferenceTransport, ops=300, seed=2).operations)\n"
    )
    src = package_root(leasequeue)  # the package under test, installed or in place
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 0
