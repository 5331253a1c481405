"""Property tests (issue 6): a hypothesis state machine over both implementations.

Random sequences of publish / claim / ack / nack / park / extend / clock
moves, including stale and repeated uses of old leases.  A deliberately
simple shadow (per group: its unacked messages in order, the lock on the
head, the open delivery) says what must hold; after every step:

* at most one live lease (or park) per group, counted from what the
  transport handed out (every lease issued and not closed by a successful
  ack/nack, at its latest expiry, and every park), not from the shadow,
* a claim returns the oldest unacked message of an eligible group, with
  ``attempt`` = previous deliveries + 1 (FIFO; which group is the referee's
  business, in test_differential.py), and ``None`` only when no group is
  eligible,
* ``ack``/``nack``/``extend`` succeed exactly when the shadow says the lease
  is current, and raise ``LeaseLost`` otherwise,
* ``len`` and ``stats()`` equal the shadow's counts.

Runs reach the common case: about half of them use a single priority level
(the fast path nearly every user takes), the clock sometimes lands exactly
on a lease's or park's ``expires_at`` (still live: expiry is ``<``), and
runs are long enough, over enough groups, to leave stale entries in the
ready heaps.  ``HYPOTHESIS_MAX_EXAMPLES`` raises the number of runs
(default 40 per implementation, enough for the suite; CI or a soak can ask
for more).
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Tuple

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from leasequeue.testing import ManualClock

from leasequeue import LeaseLost

MAX_EXAMPLES = int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "40"))
GROUPS = ("a", "b", "c", "d", "e", "f")
DURATIONS = st.sampled_from([0.0, 0.5, 1.0, 3.0, 10.0, math.inf])


class _GroupShadow:
    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.seqs: List[int] = []  # unacked messages, oldest first
        self.lock: Optional[Tuple[str, float]] = None  # ("leased" | "parked", expires_at) on the head
        self.open_attempt = 0  # attempt of the head's open delivery, 0 when none is open
        self.attempts = 0  # deliveries of the head so far


def make_machine(impl: Any) -> type:
    class TransportMachine(RuleBasedStateMachine):
        leases = Bundle("leases")

        def __init__(self) -> None:
            super().__init__()
            self.clock = ManualClock(1000.0)
            self.t = impl.InMemoryTransport(clock=self.clock)
            self.groups: Dict[str, _GroupShadow] = {}
            self.events: Dict[int, Any] = {}
            self.last_seq = 0
            self.acked = 0
            self.single_level = False
            # What the transport handed out, for the at-most-one invariant:
            # delivery (group, seq, attempt) -> expires_at of its latest lease,
            # deliveries closed by a successful ack/nack, parks -> their end.
            self.deliveries: Dict[Tuple[str, int, int], float] = {}
            self.closed: set = set()
            self.parks: Dict[Tuple[str, int, int], float] = {}
            self.latest: Dict[str, Any] = {}  # group -> latest lease of its open delivery

        @initialize(single_level=st.booleans())
        def choose_levels(self, single_level: bool) -> None:
            # about half of the runs publish at one priority (the claim fast path)
            self.single_level = single_level

        def _issued(self, lease: Any) -> None:
            self.deliveries[(lease.group_id, lease.seq, lease.attempt)] = lease.expires_at
            self.latest[lease.group_id] = lease

        # ------------------------------------------------------------ shadow

        def _now(self) -> float:
            return self.clock.now

        def _locked(self, g: _GroupShadow) -> bool:
            return g.lock is not None and g.lock[1] >= self._now()

        def _eligible(self, min_priority: int) -> List[str]:
            return [name for name, g in self.groups.items() if g.priority >= min_priority and not self._locked(g)]

        def _current(self, lease: Any) -> Optional[_GroupShadow]:
            g = self.groups.get(lease.group_id)
            if g is None or not g.seqs or g.seqs[0] != lease.seq:
                return None
            if g.open_attempt == 0 or g.open_attempt != lease.attempt:
                return None
            return g

        # ------------------------------------------------------------- rules

        @rule(group=st.sampled_from(GROUPS), priority=st.integers(-2, 2))
        def publish(self, group: str, priority: int) -> None:
            if self.single_level:
                priority = 0
            event = object()
            seq = self.t.publish(group, event, priority)
            assert seq == self.last_seq + 1
            self.last_seq = seq
            self.events[seq] = event
            g = self.groups.get(group)
            if g is None:  # created (or re-created, fresh) with this priority
                g = self.groups[group] = _GroupShadow(priority)
            g.seqs.append(seq)

        @rule(target=leases, worker=st.sampled_from(["w1", "w2"]), visibility=DURATIONS,
              min_priority=st.integers(-3, 3))
        def claim(self, worker: str, visibility: float, min_priority: int) -> Any:
            eligible = self._eligible(min_priority)
            lease = self.t.claim(worker, visibility, min_priority)
            if lease is None:
                assert not eligible, f"claim returned None while {eligible} were eligible"
                return multiple()
            assert lease.group_id in eligible, f"{lease.group_id} served, eligible were {eligible}"
            g = self.groups[lease.group_id]
            assert lease.seq == g.seqs[0], "not the group's oldest message (FIFO)"
            assert lease.event is self.events[lease.seq]
            assert lease.attempt == g.attempts + 1
            assert lease.worker_id == worker and lease.expires_at == self._now() + visibility
            g.attempts += 1
            g.open_attempt = lease.attempt
            g.lock = ("leased", lease.expires_at)
            self._issued(lease)
            return lease

        @rule(lease=leases)
        def ack(self, lease: Any) -> None:
            g = self._current(lease)
            if g is None:
                try:
                    self.t.ack(lease)
                except LeaseLost:
                    return
                raise AssertionError(f"ack of a lease that is not current was accepted: {lease!r}")
            self.t.ack(lease)
            self.closed.add((lease.group_id, lease.seq, lease.attempt))
            g.seqs.pop(0)
            g.lock, g.open_attempt, g.attempts = None, 0, 0
            self.acked += 1
            del self.events[lease.seq]
            if not g.seqs:
                del self.groups[lease.group_id]  # forgotten entirely

        @rule(lease=leases, delay=DURATIONS)
        def nack(self, lease: Any, delay: float) -> None:
            g = self._current(lease)
            if g is None:
                try:
                    self.t.nack(lease, delay)
                except LeaseLost:
                    return
                raise AssertionError(f"nack of a lease that is not current was accepted: {lease!r}")
            self.t.nack(lease, delay)
            self.closed.add((lease.group_id, lease.seq, lease.attempt))
            if delay > 0:
                self.parks[(lease.group_id, lease.seq, lease.attempt)] = self._now() + delay
            g.open_attempt = 0
            g.lock = None if delay == 0 else ("parked", self._now() + delay)

        @rule(target=leases, lease=leases, visibility=DURATIONS)
        def extend(self, lease: Any, visibility: float) -> Any:
            g = self._current(lease)
            if g is None:
                try:
                    self.t.extend(lease, visibility)
                except LeaseLost:
                    return multiple()
                raise AssertionError(f"extend of a lease that is not current was accepted: {lease!r}")
            new = self.t.extend(lease, visibility)
            assert (new.seq, new.attempt, new.worker_id, new.event) == (
                lease.seq, lease.attempt, lease.worker_id, lease.event)
            assert new.expires_at == self._now() + visibility
            g.lock = ("leased", new.expires_at)
            self._issued(new)
            return new

        @rule(seconds=st.sampled_from([0.25, 0.5, 1.0, 2.0, 5.0]))
        def advance(self, seconds: float) -> None:
            self.clock.advance(seconds)

        def _future_expiries(self) -> List[float]:
            now = self._now()
            return sorted({g.lock[1] for g in self.groups.values() if g.lock and now < g.lock[1] < math.inf})

        @precondition(lambda self: self._future_expiries())
        @rule(pick=st.integers(0, 5), past=st.booleans())
        def advance_to_an_expiry(self, pick: int, past: bool) -> None:
            # exactly on a lock's expires_at (still live: expiry is ``<``), or just past it
            expiries = self._future_expiries()
            target = expiries[pick % len(expiries)]
            self.clock.set(math.nextafter(target, math.inf) if past else target)

        # -------------------------------------------------------- invariants

        @invariant()
        def at_most_one_live_lease_or_park_per_group(self) -> None:
            # from what the transport issued: a delivery is live while it is
            # not closed and its latest lease has not run out; a park while it
            # has not run out.  A double lease (a second worker served while
            # the first lease runs) shows up as two live ones.
            now = self._now()
            live: Dict[str, List[Any]] = {}
            for (group, seq, attempt), expires_at in self.deliveries.items():
                if (group, seq, attempt) not in self.closed and expires_at >= now:
                    live.setdefault(group, []).append(("lease", seq, attempt))
            for (group, seq, attempt), expires_at in self.parks.items():
                if expires_at >= now:
                    live.setdefault(group, []).append(("park", seq, attempt))
            for group, locks in live.items():
                assert len(locks) == 1, f"group {group} has {len(locks)} live locks: {locks}"
            stats = self.t.stats()
            assert stats.leased + stats.parked == len(live)

        @invariant()
        def counts_match_the_shadow(self) -> None:
            held = sum(len(g.seqs) for g in self.groups.values())
            assert held == self.last_seq - self.acked
            assert len(self.t) == held
            now = self._now()
            leased = sum(1 for g in self.groups.values() if g.lock and g.lock[0] == "leased" and g.lock[1] >= now)
            parked = sum(1 for g in self.groups.values() if g.lock and g.lock[0] == "parked" and g.lock[1] >= now)
            assert tuple(self.t.stats()) == (held, len(self.groups), leased, parked, 0, 0, 0)  # none paused/buried/scheduled

        @invariant()
        def fifo_heads(self) -> None:
            for g in self.groups.values():
                assert g.seqs == sorted(g.seqs)

        def teardown(self) -> None:
            # everything still held can be claimed and acked, once each; a
            # lease that never expires is acked through its latest lease, a
            # park that never ends keeps its group's messages (by design)
            self.clock.advance(10**9)
            stuck = []
            for name, g in self.groups.items():
                if g.lock and g.lock[1] == math.inf:
                    if g.lock[0] == "leased":
                        self.t.ack(self.latest[name])
                        g.seqs.pop(0)
                    else:
                        stuck += g.seqs
            got = []
            while (lease := self.t.claim("drain", 1.0, -3)) is not None:
                got.append(lease.seq)
                self.t.ack(lease)
            expected = [s for g in self.groups.values() for s in g.seqs if s not in stuck]
            assert sorted(got) == sorted(expected)
            assert len(self.t) == len(stuck)

    return TransportMachine


def test_state_machine(impl: Any) -> None:
    run_state_machine_as_test(
        make_machine(impl),
        settings=settings(
            max_examples=MAX_EXAMPLES,
            stateful_step_count=100,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
