"""The referee's quarantine (SPEC Part 4, "Quarantine: bury, skip, peek"),
pinned by small hand-written scenarios against the SPEC and the "Part 4"
section of docs/decisions.md.

``ReferenceTransport`` is the oracle of the differential tests, which then
hold every transport to it; the kit's ``TransportContract`` checks the same
rules on each transport directly.
"""

from __future__ import annotations

import math
from typing import Any, List

import pytest

from helpers import INT64_MIN
from leasequeue import GroupInfo, LeaseLost, LeaseQueueError, Message, TransportStats
from leasequeue.testing import ManualClock, ReferenceTransport


class Broke(Exception):
    """Raised by the clock when a call must not read it."""


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def t(clock: ManualClock) -> ReferenceTransport:
    return ReferenceTransport(clock)


def claimed_groups(t: ReferenceTransport) -> List[str]:
    out = []
    while (lease := t.claim("w", math.inf, INT64_MIN)) is not None:
        out.append(lease.group_id)
    return out


def test_bury_keeps_the_head_and_holds_the_group_in_order(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("g", "g1", priority=2)
    t.publish("g", "g2")
    t.publish("h", "h1")
    lease = t.claim("w", 10)
    assert lease.group_id == "g"
    assert t.bury(lease, "boom") is None
    assert t.group("g") == GroupInfo("g", 2, 2, "buried", False, 1, "w", None, 1, 1000.0, "boom")
    assert t.stats() == TransportStats(3, 2, 0, 0, 0, 1)
    clock.advance(1e9)  # time passing changes nothing: a bury has no end
    assert claimed_groups(t) == ["h"]
    assert t.stats().buried == 1
    for op in (t.ack, t.nack, lambda x: t.extend(x, 5), lambda x: t.bury(x)):
        with pytest.raises(LeaseLost):  # the delivery ended
            op(lease)
    t.publish("g", "g3")  # behind the head
    assert t.peek("g", 10) == [Message(1, "g1", 1), Message(2, "g2", 0), Message(4, "g3", 0)]
    assert t.resume("g") is True and t.resume("g") is False
    again = t.claim("w", 10, 2)
    assert (again.seq, again.attempt, again.event) == (1, 2, "g1")  # attempt + 1, as after nack(0)
    assert t.group("g").reason is None


def test_bury_validates_lease_then_reason_and_reads_no_clock(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("g", "e")
    lease = t.claim("w", 10)
    with clock.misbehave(Broke("no clock")):
        with pytest.raises(TypeError, match="lease"):
            t.bury("lease", 5)
        with pytest.raises(TypeError, match="reason"):
            t.bury(lease, 5)
        with pytest.raises(TypeError, match="reason"):
            t.bury(lease, None)
        t.bury(lease, reason="ok")
    assert t.group("g").state == "buried"


def test_bury_of_a_paused_group_reports_buried_and_resume_lifts_both(t: ReferenceTransport) -> None:
    t.publish("g", "e")
    lease = t.claim("w", 10)
    t.pause("g")
    t.bury(lease)
    info = t.group("g")
    assert (info.state, info.paused, info.reason) == ("buried", True, "")
    assert t.stats()[4:6] == (1, 1)
    assert t.resume("g") is True
    assert t.stats()[4:6] == (0, 0)
    assert t.claim("w", 10).attempt == 2


def test_bury_of_a_lease_that_ran_out_unclaimed_is_accepted(t: ReferenceTransport, clock: ManualClock) -> None:
    t.publish("g", "e")
    lease = t.claim("w", 10)
    clock.advance(20)
    assert t.stats().leased == 0
    t.bury(lease, "late")
    assert t.group("g").state == "buried"
    other = t.claim("w2", 10)
    assert other is None


def test_skip_removes_the_head_unless_a_live_lease_holds_it(t: ReferenceTransport, clock: ManualClock) -> None:
    for i in range(3):
        t.publish("g", f"g{i}")
    lease = t.claim("w", 10)
    assert t.skip("g") is False  # leased, not expired
    assert t.peek("g") == [Message(1, "g0", 1)]
    clock.advance(10)
    assert t.skip("g") is False  # expires_at == now: still live
    clock.advance(1)
    assert t.skip("g") is True  # ran out: removed, the lease stops being current
    with pytest.raises(LeaseLost):
        t.ack(lease)
    parked = t.claim("w", 10)
    t.nack(parked, 100)
    assert t.skip("g") is True  # a park ends with its message
    assert t.peek("g", 5) == [Message(3, "g2", 0)]
    t.pause("g")
    assert t.skip("g") is True  # paused: removed, the group stays paused and is kept
    info = t.group("g")
    assert (info.messages, info.state, info.paused, info.head_seq) == (0, "paused", True, None)
    assert t.skip("g") is False  # an empty paused group
    assert t.skip("unknown") is False and t.group("unknown") is None
    assert t.resume("g") is True and t.group("g") is None


def test_skip_lifts_a_bury_and_forgets_an_emptied_group(t: ReferenceTransport) -> None:
    t.publish("g", "poison")
    t.publish("g", "next")
    t.bury(t.claim("w", 10), "x")
    assert t.skip("g") is True
    assert t.group("g").state == "ready" and t.stats().buried == 0
    lease = t.claim("w", 10)
    assert (lease.seq, lease.attempt) == (2, 1)
    t.bury(lease)
    assert t.skip("g") is True
    assert t.group("g") is None and t.stats() == (0, 0, 0, 0, 0, 0, 0)


def test_skip_reads_the_clock_once_and_a_failing_clock_changes_nothing(t: ReferenceTransport,
                                                                       clock: ManualClock) -> None:
    t.publish("g", "e")
    with clock.misbehave(Broke("clock")):
        with pytest.raises(Broke):
            t.skip("g")
        with pytest.raises(TypeError):
            t.skip(5)  # validated before the clock
    assert len(t) == 1
    reads = []
    t2 = ReferenceTransport(lambda: reads.append(1) or 1000.0)
    t2.skip("unknown")
    assert reads == [1]


def test_peek_validates_and_changes_nothing(t: ReferenceTransport, clock: ManualClock) -> None:
    events: List[Any] = [["a"], ["b"]]
    t.publish("g", events[0])
    t.publish("g", events[1])
    with clock.misbehave(Broke("no clock")):
        got = t.peek("g", 2)
        assert got[0].event is events[0] and got == [Message(1, events[0], 0), Message(2, events[1], 0)]
        assert t.peek("g", 0) == [] and t.peek("g", 2**70) == got and t.peek("zz", 3) == []
        for bad, error in ((True, TypeError), (1.0, TypeError), ("1", TypeError), (None, TypeError),
                           (-1, ValueError)):
            with pytest.raises(error):
                t.peek("g", bad)
        with pytest.raises(TypeError):
            t.peek(None)
    assert t.claim("w", 10).attempt == 1


def test_purge_of_a_buried_group(t: ReferenceTransport) -> None:
    t.publish("g", "e")
    t.publish("g", "f")
    t.bury(t.claim("w", 10))
    assert t.purge("g") == 2
    assert t.group("g") is None and t.stats() == (0, 0, 0, 0, 0, 0, 0)


def test_closed_and_not_usable_validates_then_refuses(clock: ManualClock) -> None:
    t = ReferenceTransport(clock, usable_after_close=False)
    t.publish("g", "e")
    lease = t.claim("w", 10)
    t.close()
    with pytest.raises(TypeError):
        t.bury(lease, 1)
    with pytest.raises(ValueError):
        t.peek("g", -1)
    for call in (lambda: t.bury(lease), lambda: t.skip("g"), lambda: t.peek("g")):
        with clock.misbehave(Broke("no clock")), pytest.raises(LeaseQueueError):
            call()
