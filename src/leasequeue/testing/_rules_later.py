"""Part 5 of the contract, "Later: delayed publish", rule by rule.

``publish(..., delay=d)`` with ``d > 0`` makes a message *scheduled* until
``due = now + d``: never delivered while ``due >= now``, an ordinary message
from the first ``now > due`` on.  FIFO holds (a scheduled head holds its
group; messages published before it are not delayed), round-robin places
its group as always, becoming due wakes a waiting claim, and the state
shows in ``group()``, ``stats().scheduled`` and ``peek()``.  The choices
the SPEC leaves open are in docs/decisions.md, "Part 5 ... pinned", "Later".
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Awaitable, List, Tuple

import pytest

from .._types import Message
from ._contract_base import ContractBase, ContractClock, MakeTransport, Waiter, requires
from ._reference import INT64_MIN
from ._rules_bad_input import ClockTouched

__all__ = ["LaterRules"]

LATER = "delayed publish (publish(delay=), publish_many(delay=), the scheduled state, stats().scheduled, due_at)"
CONTROL = "the control plane (pause, resume, purge, set_priority, group, groups)"
QUARANTINE = "the quarantine (bury, skip, peek; resume lifting a bury)"
BATCHES = "batches (publish_many, claim_many, ack_many)"
WAITING = "waiting claims (claim(timeout=...), aclaim, close() waking waiters)"


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _after(t: float) -> float:
    """The first float after ``t``: the first time a message due at ``t`` is due."""
    return math.nextafter(t, math.inf)


class LaterRules(ContractBase):
    """The delayed-publish rules (see the module docstring)."""

    def _served(self, t: Any, min_priority: int = INT64_MIN) -> List[Tuple[str, int]]:
        """Claim and ack until nothing is eligible: ``(group, seq)`` in order."""
        out = []
        while (lease := t.claim("w", 30, min_priority)) is not None:
            out.append((lease.group_id, lease.seq))
            t.ack(lease)
            assert len(out) <= 1000, "claimed more messages than were published"
        return out

    def waiting_claim(self, t: Any, clock: ContractClock, kind: str) -> Waiter:
        """A claim that waits for work ("thread": ``claim(timeout=)``,
        "asyncio": ``aclaim`` on its own loop), once it is waiting."""
        if kind == "thread":
            return self.start_waiting(clock, lambda: t.claim("waiter", 30, timeout=self.far()), name="waiter")
        return self.start_waiting(
            clock, lambda: asyncio.run(_await(t.aclaim("waiter", 30, timeout=self.far()))), name="waiter"
        )

    # -- when it is delivered -----------------------------------------------------

    @requires("supports_later", LATER)
    def test_later_scheduled_until_strictly_past_due(self, transport: Any, clock: ContractClock) -> None:
        """A message published with ``delay=d`` at ``now`` is not delivered
        while ``now + d >= now``, whatever the floor; from the first ``now >
        due`` on it is an ordinary message (attempt 1, seq as published)."""
        event = ["e"]
        assert transport.publish("g", event, delay=10) == 1
        assert len(transport) == 1
        assert transport.claim("w", 30, INT64_MIN) is None
        clock.set(1005.0)
        assert transport.claim("w", 30, INT64_MIN) is None
        clock.set(1010.0)  # due == now: still scheduled (the strict test of an expiry)
        assert transport.claim("w", 30, INT64_MIN) is None
        if self.supports_batches:
            assert transport.claim_many("w", 30, 5, INT64_MIN) == []
        clock.set(_after(1010.0))
        lease = transport.claim("w", 30)
        assert lease is not None, "a scheduled message was not delivered once now > due"
        assert (lease.group_id, lease.seq, lease.attempt, lease.expires_at) == ("g", 1, 1, _after(1010.0) + 30)
        assert self.same_event(lease.event, event)

    @requires("supports_later", LATER)
    def test_later_earlier_messages_of_the_group_are_not_delayed(self, transport: Any, clock: ContractClock) -> None:
        """Messages published before a scheduled one are delivered at once;
        when the scheduled one becomes the head it holds its group until it
        is due, then goes first; other groups go on meanwhile."""
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        transport.publish("g", "later", delay=100)
        transport.publish("g", "g4")
        first = transport.claim("w", 30)
        assert first is not None and (first.group_id, first.seq) == ("g", 1), (
            "a message published before a scheduled one was held back by it")
        transport.ack(first)
        clock.advance(1)
        assert self._served(transport) == [("g", 2)]
        transport.publish("h", "h1")
        assert self._served(transport) == [("h", 5)]  # g's head is scheduled: g waits, h goes on
        assert len(transport) == 2
        clock.set(_after(1100.0))
        assert self._served(transport) == [("g", 3), ("g", 4)]

    @requires("supports_later", LATER)
    def test_later_messages_wait_behind_a_scheduled_head(self, transport: Any, clock: ContractClock) -> None:
        """While a group's head is scheduled, its later messages (published
        without a delay, or due sooner) wait behind it, whatever the floor."""
        transport.publish("g", "slow", priority=5, delay=50)
        transport.publish("g", "now")
        transport.publish("g", "soon", delay=1)
        clock.advance(10)
        assert transport.claim("w", 30, INT64_MIN) is None
        assert transport.claim("w", 30, 5) is None
        clock.advance(41)
        assert self._served(transport, 5) == [("g", 1), ("g", 2), ("g", 3)]

    @requires("supports_later", LATER)
    def test_later_due_is_permanent_once_observed(self, transport: Any, clock: ContractClock) -> None:
        """Once an operation has seen ``now > due`` the message is ordinary for
        good: a clock going back does not schedule it again (the transport's
        time never runs back)."""
        transport.publish("g", "e", delay=10)
        clock.set(1011.0)
        assert transport.stats().scheduled == 0
        clock.set(1001.0)
        lease = transport.claim("w", 30)
        assert lease is not None and lease.seq == 1
        assert lease.expires_at == 1041.0

    @requires("supports_later", LATER)
    def test_later_infinite_delay_is_never_due(self, transport: Any, clock: ContractClock) -> None:
        """``delay=math.inf``: never due, counted as scheduled for ever."""
        transport.publish("g", "never", delay=math.inf)
        transport.publish("h", "h1")
        clock.advance(1e300)
        assert self._served(transport) == [("h", 2)]
        assert transport.stats() == (1, 1, 0, 0, 0, 0, 1)
        if self.supports_control_plane:
            info = transport.group("g")
            assert (info.state, info.due_at) == ("scheduled", math.inf)
        if self.supports_quarantine:
            assert transport.peek("g")[0].due_at == math.inf

    # -- the clock ----------------------------------------------------------------------

    @requires("supports_later", LATER)
    def test_later_delay_zero_reads_no_clock(self, transport: Any, clock: ContractClock) -> None:
        """``delay=0`` (or ``0.0``) is exactly the publish of Part 1: no
        clock read (here the clock raises), not scheduled."""
        clock.bad = ClockTouched()
        assert transport.publish("g", "a", delay=0) == 1
        assert transport.publish("g", "b", 0, delay=0.0) == 2
        if self.supports_batches:
            assert transport.publish_many([("h", "c")], delay=0) == [3]
            assert transport.publish_many([], delay=5) == []  # an empty batch reads no clock either
        clock.behave()
        assert transport.stats().scheduled == 0
        if self.supports_quarantine:
            assert [m.due_at for m in transport.peek("g", 5)] == [None, None]
        assert self._served(transport)[:1] == [("g", 1)]

    @requires("supports_later", LATER)
    def test_later_delay_reads_the_clock_once(self, new_transport: MakeTransport) -> None:
        """A publish with ``delay > 0`` reads the clock once; a clock that
        raises makes it raise that error, and the transport is as before."""
        clock = ContractClock()
        t = new_transport(clock)
        t.publish("g", "a")
        reads = clock.reads
        t.publish("g", "b", delay=5)
        assert clock.reads == reads + 1
        clock.bad = RuntimeError("clock")
        with pytest.raises(RuntimeError):
            t.publish("h", "x", delay=5)
        clock.behave()
        assert len(t) == 2
        assert t.stats().scheduled == 1
        assert t.publish("h", "y") == 3  # the failed publish used no seq
        assert self._served(t) == [("g", 1), ("h", 3)]

    # -- round-robin ---------------------------------------------------------------------

    @requires("supports_later", LATER)
    def test_later_a_scheduled_group_is_never_claimed_and_placed_by_its_oldest_seq(
        self, transport: Any, clock: ContractClock
    ) -> None:
        """A group created by a scheduled publish is "never claimed": once
        due it goes before every never-claimed group with a younger oldest
        message and before every claimed group."""
        transport.publish("s", "s1", delay=10)  # seq 1
        transport.publish("b", "b1")
        transport.publish("b", "b2")
        transport.publish("c", "c1")  # seq 4
        first = transport.claim("w", 30)
        assert (first.group_id, first.seq) == ("b", 2)
        transport.ack(first)
        clock.advance(11)
        transport.publish("d", "d1")  # seq 5, never claimed
        assert [g for g, _ in self._served(transport)][:4] == ["s", "c", "d", "b"]

    @requires("supports_later", LATER)
    def test_later_a_claimed_group_keeps_its_round_robin_key_while_its_head_is_scheduled(
        self, transport: Any, clock: ContractClock
    ) -> None:
        """A claimed group whose next head is scheduled keeps the key of its
        last claim: once due it comes back in its round-robin place."""
        transport.publish("g", "g1")
        transport.publish("g", "g2", delay=10)
        transport.publish("h", "h1")
        transport.publish("h", "h2")
        a = transport.claim("w", 30)
        b = transport.claim("w", 30)
        assert [(a.group_id, a.seq), (b.group_id, b.seq)] == [("g", 1), ("h", 3)]
        transport.ack(a)
        transport.ack(b)
        clock.advance(11)
        assert self._served(transport) == [("g", 2), ("h", 4)]

    # -- what it looks like ---------------------------------------------------------------

    @requires("supports_later", LATER)
    @requires("supports_control_plane", CONTROL)
    def test_later_group_info_and_stats_of_scheduled_messages(self, transport: Any, clock: ContractClock) -> None:
        """``GroupInfo.state == "scheduled"`` and ``due_at`` while the head is
        scheduled and not due; ``stats().scheduled`` counts every scheduled
        message wherever it stands (``messages`` and ``len`` count them too,
        ``parked`` does not)."""
        transport.publish("g", "g1", priority=3, delay=10)  # due 1010
        transport.publish("g", "g2")
        transport.publish("h", "h1")
        transport.publish("h", "h2", delay=20)  # not the head: h is ready
        assert tuple(transport.group("g")) == (
            "g", 3, 2, "scheduled", False, 1, None, None, None, None, None, 1010.0)
        assert tuple(transport.group("h")) == ("h", 0, 2, "ready", False, 3, None, None, None, None, None, None)
        assert transport.stats() == (4, 2, 0, 0, 0, 0, 2)
        assert len(transport) == 4
        lease = transport.claim("w", 30)
        assert lease.group_id == "h"
        assert transport.group("h").state == "leased" and transport.group("h").due_at is None
        assert transport.stats() == (4, 2, 1, 0, 0, 0, 2)
        clock.set(1010.0)
        assert transport.group("g").state == "scheduled"
        clock.set(1010.5)
        assert tuple(transport.group("g")) == ("g", 3, 2, "ready", False, 1, None, None, None, None, None, None)
        assert transport.stats() == (4, 2, 1, 0, 0, 0, 1)
        transport.ack(lease)
        assert tuple(transport.group("h")) == (
            "h", 0, 1, "scheduled", False, 4, None, None, None, 1000.0, None, 1020.0)
        assert sorted((i.group_id, i.state, i.due_at) for i in transport.groups()) == [
            ("g", "ready", None), ("h", "scheduled", 1020.0)]

    @requires("supports_later", LATER)
    @requires("supports_control_plane", CONTROL)
    def test_later_pause_and_resume_do_not_change_a_schedule(self, transport: Any, clock: ContractClock) -> None:
        """A paused group with a scheduled head reports ``"paused"`` and its
        ``due_at``; ``resume`` lifts the pause but not the schedule, and
        returns ``False`` for a group that is only scheduled."""
        transport.publish("g", "e", delay=10)
        assert transport.resume("g") is False  # only scheduled: nothing to resume
        assert transport.pause("g") is True
        info = transport.group("g")
        assert (info.state, info.paused, info.due_at) == ("paused", True, 1010.0)
        assert transport.stats() == (1, 1, 0, 0, 1, 0, 1)
        clock.advance(5)
        assert transport.resume("g") is True
        info = transport.group("g")
        assert (info.state, info.paused, info.due_at) == ("scheduled", False, 1010.0)
        assert transport.claim("w", 30) is None
        transport.pause("g")
        clock.advance(6)  # due while paused
        assert transport.claim("w", 30) is None
        assert transport.group("g").due_at is None and transport.stats().scheduled == 0
        assert transport.resume("g") is True
        lease = transport.claim("w", 30)
        assert lease is not None and (lease.seq, lease.attempt) == (1, 1)

    @requires("supports_later", LATER)
    @requires("supports_control_plane", CONTROL)
    def test_later_set_priority_moves_a_scheduled_group(self, transport: Any, clock: ContractClock) -> None:
        """``set_priority`` changes a scheduled group's priority as any other's;
        the schedule stays."""
        transport.publish("g", "e", delay=10)
        assert transport.set_priority("g", 7) is True
        info = transport.group("g")
        assert (info.priority, info.state, info.due_at) == (7, "scheduled", 1010.0)
        assert transport.claim("w", 30, 7) is None
        clock.advance(11)
        assert transport.claim("w", 30, 8) is None
        lease = transport.claim("w", 30, 7)
        assert lease is not None and lease.seq == 1

    @requires("supports_later", LATER)
    @requires("supports_quarantine", QUARANTINE)
    def test_later_message_due_at(self, transport: Any, clock: ContractClock) -> None:
        """``Message.due_at`` is the due time the message was published with
        (a float sum), also once due and after deliveries; ``None`` without
        a delay."""
        transport.publish("g", "a", delay=0.1)
        transport.publish("g", "b")
        transport.publish("g", "c", delay=math.inf)
        assert [(m.seq, m.attempt, m.due_at) for m in transport.peek("g", 5)] == [
            (1, 0, 1000.0 + 0.1), (2, 0, None), (3, 0, math.inf)]
        clock.advance(1)
        transport.nack(transport.claim("w", 30))
        first = transport.peek("g")[0]
        assert (first.seq, first.attempt, first.due_at) == (1, 1, 1000.0 + 0.1)
        assert isinstance(first, Message)

    @requires("supports_later", LATER)
    @requires("supports_quarantine", QUARANTINE)
    def test_later_skip_removes_a_scheduled_head(self, transport: Any, clock: ContractClock) -> None:
        """``skip`` removes a scheduled head (no live lease holds it): the
        group's next message is claimable at once."""
        transport.publish("g", "later", delay=100)
        transport.publish("g", "next")
        transport.publish("g", "also-later", delay=100)
        assert transport.stats().scheduled == 2
        assert transport.skip("g") is True
        assert transport.stats() == (2, 1, 0, 0, 0, 0, 1)
        assert [m.seq for m in transport.peek("g", 5)] == [2, 3]
        assert self._served(transport) == [("g", 2)]  # then 3 holds g until it is due
        assert transport.skip("g") is True
        assert (len(transport), transport.stats().scheduled) == (0, 0)

    @requires("supports_later", LATER)
    @requires("supports_control_plane", CONTROL)
    def test_later_purge_removes_scheduled_messages(self, transport: Any, clock: ContractClock) -> None:
        """``purge`` removes scheduled messages as any other."""
        transport.publish("g", "a", delay=10)
        transport.publish("g", "b")
        transport.publish("g", "c", delay=20)
        transport.publish("h", "d", delay=5)
        assert transport.purge("g") == 3
        assert transport.stats() == (1, 1, 0, 0, 0, 0, 1)
        assert transport.group("g") is None
        clock.advance(6)
        assert self._served(transport) == [("h", 4)]

    # -- batches -------------------------------------------------------------------------

    @requires("supports_later", LATER)
    @requires("supports_batches", BATCHES)
    def test_later_publish_many_with_delay(self, transport: Any, clock: ContractClock) -> None:
        """``publish_many(items, delay=d)``: every message of the batch is
        scheduled until one ``now + d`` (one clock reading), each in its
        group's order."""
        transport.publish("a", "a0")
        reads = clock.reads
        assert transport.publish_many([("a", "a1"), ("b", "b1", 2), ("a", "a2")], delay=10) == [2, 3, 4]
        assert clock.reads == reads + 1
        assert transport.stats() == (4, 2, 0, 0, 0, 0, 3)
        assert self._served(transport) == [("a", 1)]
        if self.supports_quarantine:
            assert [m.due_at for m in transport.peek("a", 5)] == [1010.0, 1010.0]
        clock.set(1010.0)
        assert transport.claim("w", 30, INT64_MIN) is None
        clock.set(_after(1010.0))
        served = self._served(transport)
        assert sorted(served) == [("a", 2), ("a", 4), ("b", 3)]
        assert served.index(("a", 2)) < served.index(("a", 4))

    # -- waking ---------------------------------------------------------------------------

    @requires("supports_later", LATER)
    @requires("supports_waiting", WAITING)
    @pytest.mark.parametrize("kind", ["thread", "asyncio"])
    @pytest.mark.parametrize("noticed", ["by-itself", "applied-by-stats"])
    @pytest.mark.parametrize("published", ["before-the-claim-waits", "while-it-waits"])
    def test_later_becoming_due_wakes_a_waiting_claim(
        self, transport: Any, clock: ContractClock, kind: str, noticed: str, published: str
    ) -> None:
        """Becoming due is becoming claimable: a waiting claim gets the
        message without anything else happening (it notices the due time by
        itself), or when another operation (``stats()``) sees it due; also
        when the delayed publish came after the claim began to wait.  A
        publish with a delay delivers nothing to a waiting claim."""
        delay = 0.5 if noticed == "by-itself" else 1000.0
        if published == "before-the-claim-waits":
            transport.publish("g", "e", delay=delay)
        waiter = self.waiting_claim(transport, clock, kind)
        if published == "while-it-waits":
            transport.publish("g", "e", delay=delay)
        waiter.join(self.settle_seconds)
        assert not waiter.done, f"the waiting claim returned {waiter.result!r} before the message was due"
        if noticed == "by-itself":
            clock.advance(1)  # nothing else: the waiting claim notices by itself
        else:
            clock.advance(2000)
            assert transport.stats().scheduled == 0  # sees it due: must wake the waiter
        lease = waiter.outcome(self.liveness_timeout)
        assert lease is not None, "the waiting claim returned None instead of the message"
        assert (lease.group_id, lease.seq, lease.attempt, lease.worker_id) == ("g", 1, 1, "waiter")


    # -- the clock readings of a delayed publish ---------------------------------------

    @requires("supports_later", LATER)
    @requires("supports_control_plane", CONTROL)
    def test_later_a_delayed_publish_applies_no_expiry(self, transport: Any, clock: ContractClock) -> None:
        """A delayed publish reads the clock and moves the transport's time,
        but applies no expiry (as ``nack(delay)``'s reading): a park that ran
        out unseen is still a park that ``resume`` lifts (``True``) afterwards
        (docs/decisions.md, "Clock readings that apply no expiry")."""
        transport.publish("a", ["a1"])
        lease = transport.claim("w", 30)
        transport.nack(lease, 5)  # parked until 1005
        clock.set(1010.0)  # the park ran out; nothing has looked since
        assert transport.publish("b", ["b1"], delay=1.0) == 2
        if self.supports_batches:
            assert transport.publish_many([("c", ["c1"])], delay=1.0) == [3]
        assert transport.resume("a") is True  # the park was still there to lift
        assert transport.resume("a") is False
        assert [(x.group_id, x.state) for x in transport.groups()][0] == ("a", "ready")
