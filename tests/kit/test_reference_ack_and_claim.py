"""The referee's ``ack_and_claim`` (docs/decisions.md, "ack_and_claim,
pinned"): the kit's own rules run against it (it is the oracle of every
differential test, so it must state them too), and a few scenarios on what
only a referee shows: the composition read literally, with its flags for
durable backends.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest

from leasequeue import LeaseLost, LeaseQueueError, TransportStats
from leasequeue.testing import ManualClock, ReferenceLease, ReferenceTransport
from leasequeue.testing._rules_ack_and_claim import AckAndClaimRules


class TestTheReferee(AckAndClaimRules):
    """The contract's ack_and_claim rules, on the referee (which never waits)."""

    supports_waiting = False

    def make_transport(self, clock: Callable[[], float]) -> Any:
        return ReferenceTransport(clock)


class TestTheRefereeOfADurableBackend(AckAndClaimRules):
    """The same with the durable backends' rules (rebuilt leases, unusable after close)."""

    supports_waiting = False
    accepts_rebuilt_leases = True
    usable_after_close = False

    def make_transport(self, clock: Callable[[], float]) -> Any:
        return ReferenceTransport(clock, accepts_rebuilt_leases=True, usable_after_close=False)


class Broke(Exception):
    """Raised by the clock when a call must not read it."""


def test_it_is_ack_then_claim_at_one_reading() -> None:
    reads = []
    now = [1000.0]

    def clock() -> float:
        reads.append(now[0])
        return now[0]

    t = ReferenceTransport(clock)
    for i in range(3):
        t.publish("g", i)
    t.publish("h", "h", priority=-1)
    lease = t.claim("w", 10)
    now[0] = 1020.0
    got = t.ack_and_claim(lease, "w2", 5)
    assert reads == [1000.0, 1020.0]
    assert (got.seq, got.worker_id, got.expires_at, got.attempt) == (2, "w2", 1025.0, 1)
    assert t.ack_and_claim(got, "w", 5, -1).group_id == "h"  # never claimed: before g's third message
    assert t.stats() == TransportStats(2, 2, 1, 0, 0, 0)


def test_a_stale_lease_changes_nothing_not_even_the_time() -> None:
    clock = ManualClock()
    t = ReferenceTransport(clock)
    t.publish("g", "g1")
    t.publish("x", "x1")
    stale = t.claim("w", 10)
    t.nack(stale)
    held = t.claim("w", 10)  # x1, until 1010
    clock.advance(100)
    with pytest.raises(LeaseLost):
        t.ack_and_claim(stale, "w", 10)
    clock.set(1000.0)
    assert t.stats().leased == 1, "the failed call applied expiry (or moved the time)"
    t.ack(held)


def test_a_rebuilt_lease_is_acked_where_its_fields_name_the_delivery() -> None:
    t = ReferenceTransport(ManualClock(), accepts_rebuilt_leases=True)
    t.publish("g", "g1")
    t.publish("g", "g2")
    lease = t.claim("w", 10)
    rebuilt = ReferenceLease(lease.seq, "g", None, "w", 0.0, lease.attempt)
    got = t.ack_and_claim(rebuilt, "w", 10)
    assert (got.seq, got.event) == (2, "g2")
    wrong = ReferenceLease(got.seq, "g", None, "somebody else", 0.0, got.attempt)
    with pytest.raises(LeaseLost):
        t.ack_and_claim(wrong, "w", 10)


def test_closed_and_unusable_it_checks_its_arguments_then_refuses_before_the_clock() -> None:
    clock = ManualClock()
    t = ReferenceTransport(clock, usable_after_close=False)
    t.publish("g", "g1")
    lease = t.claim("w", 10)
    t.close()

    def broken() -> float:
        raise Broke()

    t._clock = broken
    with pytest.raises(TypeError):
        t.ack_and_claim("lease", "w", 10)
    with pytest.raises(ValueError):
        t.ack_and_claim(lease, "w", math.nan)
    with pytest.raises(LeaseQueueError):
        t.ack_and_claim(lease, "w", 10)
