"""Property tests (issue 6): a hypothesis state machine over both implementations.

Random sequences of publish / claim / ack / nack / park / extend / clock
moves, including stale and repeated uses of old leases.  A deliberately
simple shadow (per group: its unacked messages in order, the lock on the
head, the open delivery) says what must hold; after every step:

* at most one live lease (or park) per group,
* a claim returns the oldest unacked message of an eligible group, with
  ``attempt`` = previous deliveries + 1 (FIFO; which group is the referee's
  business, in test_differential.py), and ``None`` only when no group is
  eligible,
* ``ack``/``nack``/``extend`` succeed exactly when the shadow says the lease
  is current, and raise ``LeaseLost`` otherwise,
* ``len`` and ``stats()`` equal the shadow's counts.

``HYPOTHESIS_MAX_EXAMPLES`` raises the number of runs (default 40 per
implementation, enough for the suite; CI or a soak can ask for more).
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Tuple

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, rule, run_state_machine_as_test

from leasequeue.testing import ManualClock

from leasequeue import LeaseLost

MAX_EXAMPLES = int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "40"))
GROUPS = ("a", "b", "c", "d")
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
            return new

        @rule(seconds=st.sampled_from([0.25, 0.5, 1.0, 2.0, 5.0]))
        def advance(self, seconds: float) -> None:
            self.clock.advance(seconds)

        # -------------------------------------------------------- invariants

        @invariant()
        def at_most_one_live_lease_or_park_per_group(self) -> None:
            # by construction of the shadow, each group has one lock; the
            # transport must agree on how many are live (below) and accept
            # ack/nack/extend only on the one open delivery (in the rules)
            live = sum(1 for g in self.groups.values() if self._locked(g))
            assert live <= len(self.groups)
            stats = self.t.stats()
            assert stats.leased + stats.parked == live

        @invariant()
        def counts_match_the_shadow(self) -> None:
            held = sum(len(g.seqs) for g in self.groups.values())
            assert held == self.last_seq - self.acked
            assert len(self.t) == held
            now = self._now()
            leased = sum(1 for g in self.groups.values() if g.lock and g.lock[0] == "leased" and g.lock[1] >= now)
            parked = sum(1 for g in self.groups.values() if g.lock and g.lock[0] == "parked" and g.lock[1] >= now)
            assert tuple(self.t.stats()) == (held, len(self.groups), leased, parked, 0)

        @invariant()
        def fifo_heads(self) -> None:
            for g in self.groups.values():
                assert g.seqs == sorted(g.seqs)

        def teardown(self) -> None:
            # everything still held can be claimed and acked, once each
            self.clock.advance(10**9)
            for g in self.groups.values():
                if g.lock and g.lock[1] == math.inf:
                    return  # parked or leased forever: not drainable, by design
            got = []
            while (lease := self.t.claim("drain", 1.0, -3)) is not None:
                got.append(lease.seq)
                self.t.ack(lease)
            assert sorted(got) == sorted(s for g in self.groups.values() for s in g.seqs)
            assert len(self.t) == 0

    return TransportMachine


def test_state_machine(impl: Any) -> None:
    run_state_machine_as_test(
        make_machine(impl),
        settings=settings(
            max_examples=MAX_EXAMPLES,
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
