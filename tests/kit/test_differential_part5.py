"""The differential drives SPEC Part 5 ("Later", "Once", "Honest attempts")
where both sides have it, and catches a transport that gets one of its
rules wrong.

The in-memory twins do not have Part 5 on every branch, so the broken
transports here are referees with one rule broken: each must be caught with
a short, replayable reproduction (through ``replay`` and as the printed
script, which builds the transport with the run's ``dedup_window``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Dict, List, Optional

import pytest

from leasequeue._backends.inmemory.transport_py import InMemoryTransport as Pure
from leasequeue.testing import DifferentialFailure, ManualClock, ReferenceTransport, check_differential, replay
from leasequeue.testing._differential import accepts_dedup_window, detect_capabilities, draw_window
from leasequeue.testing._harness import Disagreement, describe


class DueAtOrBefore(ReferenceTransport):
    """A scheduled message is due at ``now == due`` (the contract: ``due < now``)."""

    @staticmethod
    def _scheduled(m: Dict[str, Any], now: float) -> bool:
        return m["due"] is not None and m["due"] > now


class AnyScheduledBlocks(ReferenceTransport):
    """A scheduled message holds its group even when it is not the head."""

    def _claim(self, worker_id: str, visibility: float, min_priority: int, now: float) -> Any:
        saved = self._messages
        blocked = {m["group_id"] for m in saved if self._scheduled(m, now)}
        self._messages = [m for m in saved if m["group_id"] not in blocked]
        try:
            return super()._claim(worker_id, visibility, min_priority, now)
        finally:
            kept = {id(m) for m in self._messages}
            self._messages = [m for m in saved if id(m) in kept or m["group_id"] in blocked]


class ReleaseCounts(ReferenceTransport):
    """``release`` is a plain ``nack``: the delivery counts."""

    def release(self, lease: Any, delay: float = 0.0) -> None:
        self.nack(lease, delay)


class FencedByAttempt(ReferenceTransport):
    """An issued lease is current while its attempt is its message's and a
    delivery is open: ABA after a ``release``."""

    def _current(self, lease: Any) -> Optional[Dict[str, Any]]:
        if lease._owner is not self:
            return None
        for m in self._messages:
            if m["seq"] == lease.seq:
                return m if m["delivery"] is not None and m["attempt"] == lease.attempt else None
        return None


class WindowIgnored(ReferenceTransport):
    """A key goes with its message, whatever the ``dedup_window``."""

    def _leave(self, m: Dict[str, Any]) -> None:
        self._messages.remove(m)


class RetryKeepsTheBury(ReferenceTransport):
    """``retry`` resets the attempt count but leaves a bury."""

    def retry(self, group_id: str) -> bool:
        group = self._groups.get(group_id) if type(group_id) is str else None
        buried = (group["buried"], group["reason"]) if group is not None else None
        done = super().retry(group_id)
        if done and buried is not None and group is not None:
            group["buried"], group["reason"] = buried
        return done


class KeysAcrossGroups(ReferenceTransport):
    """A key is held across groups (the contract: per group)."""

    def _holder(self, group_id: str, key: str, now: Optional[float]) -> Optional[int]:
        for m in self._messages:
            if m["key"] == key:
                return m["seq"]  # type: ignore[no-any-return]
        return super()._holder(group_id, key, now)


def windowed(cls: type) -> Callable[..., Any]:
    def make(clock: ManualClock, dedup_window: float = 0.0) -> Any:
        return cls(clock, dedup_window=dedup_window)
    return make


def first_failure(make: Callable[..., Any], seeds: int = 12, **kwargs: Any) -> DifferentialFailure:
    for seed in range(seeds):
        try:
            check_differential(make, ops=1500, seed=seed, **kwargs)
        except DifferentialFailure as failure:
            return failure
    raise AssertionError(f"no failure in {seeds} seeds")


def outcome_of_script(script: str, make: Callable[..., Any]) -> str:
    namespace: Dict[str, Any] = {"make_transport": make}
    try:
        exec(compile(script, "<reproduction>", "exec"), namespace)
    except Exception as exc:  # the last line raised
        return describe(("raises", exc))
    return describe(("returns", namespace["result"]))


@pytest.mark.parametrize("broken, longest", [
    (DueAtOrBefore, 6), (AnyScheduledBlocks, 6), (ReleaseCounts, 6), (FencedByAttempt, 8),
    (WindowIgnored, 8), (RetryKeepsTheBury, 8), (KeysAcrossGroups, 4),
])
def test_a_broken_part5_rule_is_caught_with_a_short_reproduction(broken: type, longest: int) -> None:
    make = windowed(broken)
    failure = first_failure(make)
    assert 1 <= len(failure.ops) <= longest, str(failure)
    assert "1-minimal" in str(failure)
    assert failure.expected != failure.actual
    with pytest.raises(Disagreement):
        replay(make, failure.ops, dedup_window=failure.dedup_window)
    assert outcome_of_script(failure.script, make) == failure.actual
    assert outcome_of_script(failure.script, windowed(ReferenceTransport)) == failure.expected
    if failure.dedup_window:
        assert f"dedup_window={'math.inf' if failure.dedup_window == math.inf else failure.dedup_window}" \
            in failure.script


def test_part5_is_driven_where_both_sides_have_it() -> None:
    summary = check_differential(ReferenceTransport, ops=3000, seed=3)
    caps = summary.capabilities
    assert (caps.later, caps.once, caps.release) == (True, True, True)
    assert caps.dedup_window == draw_window(3)
    tally = summary.tally
    for name in ("publish(delay) int", "publish(key) int", "publish(delay,key) int", "release None",
                 "release raise", "retry bool"):
        assert tally[name] > 0, name
    assert any(k.startswith("publish_many(") for k in tally)


def test_a_transport_without_part5_gets_none_of_it() -> None:
    caps = detect_capabilities(lambda clock: Pure(clock=clock))
    assert (caps.later, caps.once, caps.release, caps.dedup_window) == (False, False, False, 0.0)
    summary = check_differential(lambda clock: Pure(clock=clock), ops=1500, seed=4)
    assert not any(k.startswith(("release", "retry", "publish(", "publish_many(")) for k in summary.tally)
    with pytest.raises(ValueError, match="release"):
        check_differential(lambda clock: Pure(clock=clock), ops=10, release=True)
    with pytest.raises(ValueError, match="delay"):
        check_differential(lambda clock: Pure(clock=clock), ops=10, later=True)


def test_the_flags_leave_part5_out() -> None:
    summary = check_differential(ReferenceTransport, ops=1500, seed=5, later=False, once=False, release=False)
    caps = summary.capabilities
    assert (caps.later, caps.once, caps.release, caps.dedup_window) == (False, False, False, 0.0)
    assert not any(k.startswith(("release", "retry", "publish(", "publish_many(")) for k in summary.tally)


def test_the_factory_gets_the_window_only_when_it_is_not_zero() -> None:
    calls: List[Any] = []

    def make(clock: ManualClock, **kwargs: Any) -> ReferenceTransport:
        calls.append(kwargs)
        return ReferenceTransport(clock, **kwargs)

    seeds = {draw_window(s): s for s in range(30)}
    assert set(seeds) == {0.0, 7.5, math.inf}
    for window, seed in seeds.items():
        calls.clear()
        assert check_differential(make, ops=200, seed=seed).capabilities.dedup_window == window
        probe, built = calls[0], calls[1:]  # the capabilities' probe, then the sides (and foreign instances)
        assert probe == {} and len(built) == 2
        assert all(c == ({} if window == 0.0 else {"dedup_window": window}) for c in built)
    calls.clear()
    check_differential(make, ops=200, seed=seeds[7.5], once=False)
    assert len(calls) == 3 and all(c == {} for c in calls)


def test_a_factory_without_the_keyword_runs_with_window_zero() -> None:
    assert accepts_dedup_window(ReferenceTransport)
    assert accepts_dedup_window(functools.partial(ReferenceTransport, accepts_rebuilt_leases=True))
    assert accepts_dedup_window(lambda clock, dedup_window=0.0: None)
    assert accepts_dedup_window(lambda clock, **kw: None)
    assert not accepts_dedup_window(lambda clock: None)
    assert not accepts_dedup_window(len)  # a builtin without the keyword

    class Unreadable:  # as a compiled class: no signature to read, so one is built
        __signature__ = "not a signature"

        def __init__(self, take: bool) -> None:
            self.take = take
            self.built: List[Any] = []

        def __call__(self, clock: ManualClock, **options: Any) -> Any:
            if options and not self.take:
                raise TypeError("unexpected keyword argument 'dedup_window'")
            self.built.append(options)
            return ReferenceTransport(clock, **options)

    taking, refusing = Unreadable(True), Unreadable(False)
    assert accepts_dedup_window(taking) and taking.built == [{"dedup_window": 1.0}]
    assert not accepts_dedup_window(refusing) and refusing.built == []
    seed = next(s for s in range(30) if draw_window(s) == math.inf)
    summary = check_differential(lambda clock: ReferenceTransport(clock), ops=300, seed=seed)
    assert summary.capabilities.once and summary.capabilities.dedup_window == 0.0
    with pytest.raises(ValueError, match="dedup_window"):
        check_differential(lambda clock: ReferenceTransport(clock), ops=10, dedup_window=5.0)
