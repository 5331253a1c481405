"""Part 4 of the contract, "Quarantine: bury, skip, peek", rule by rule.

A poison message is set aside without breaking its group's order: ``bury``
ends its delivery and quarantines the group (the message stays at the head,
the group's later messages wait behind it, every other group goes on),
``peek`` shows what the group holds, and ``resume`` (the same message again,
attempt + 1) or ``skip`` (the head removed) lets the group go on.  The
choices the SPEC leaves open are in docs/decisions.md, "Part 4".
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List

import pytest

from .._errors import LeaseLost
from .._types import PARKED
from ._contract_base import ContractBase, ContractClock, MakeTransport, requires
from ._reference import INT64_MAX, INT64_MIN
from ._rules_bad_input import ClockTouched, LookalikeLease, assert_changes_nothing, bad_input_history

__all__ = ["QuarantineRules"]

QUARANTINE = "the quarantine (bury, skip, peek; resume lifting a bury)"
CONTROL = "the control plane (pause, resume, purge, set_priority, group, groups)"
WAITING = "waiting claims (claim(timeout=...), aclaim, close() waking waiters)"

Call = Callable[[Any, Dict[str, Any]], Any]

#: bad input of bury / skip / peek, run on ``bad_input_history``: the error
#: comes before the clock is read (the clock raises ``ClockTouched`` if it is)
_BAD_CALLS = [
    pytest.param(lambda t, l: t.bury("lease"), TypeError, id="bury-str"),
    pytest.param(lambda t, l: t.bury(None, "why"), TypeError, id="bury-none"),
    pytest.param(lambda t, l: t.bury(LookalikeLease(1, "b", "b1", "w", 1010.0, 1)), TypeError,
                 id="bury-lookalike-lease"),
    pytest.param(lambda t, l: t.bury(l["current"], 5), TypeError, id="bury-reason-int"),
    pytest.param(lambda t, l: t.bury(l["current"], None), TypeError, id="bury-reason-none"),
    pytest.param(lambda t, l: t.bury(l["current"], b"why"), TypeError, id="bury-reason-bytes"),
    pytest.param(lambda t, l: t.bury(l["current"], reason=["why"]), TypeError, id="bury-reason-list"),
    pytest.param(lambda t, l: t.bury(None, 5), TypeError, id="bury-order-lease-first"),
    pytest.param(lambda t, l: t.bury(l["stale"], 5), TypeError, id="bury-order-reason-before-currency"),
    pytest.param(lambda t, l: t.skip(5), TypeError, id="skip-int"),
    pytest.param(lambda t, l: t.skip(None), TypeError, id="skip-none"),
    pytest.param(lambda t, l: t.skip(b"b"), TypeError, id="skip-bytes"),
    pytest.param(lambda t, l: t.peek(None), TypeError, id="peek-group-none"),
    pytest.param(lambda t, l: t.peek(["a"], 1), TypeError, id="peek-group-list"),
    pytest.param(lambda t, l: t.peek("a", True), TypeError, id="peek-max_count-true"),
    pytest.param(lambda t, l: t.peek("a", False), TypeError, id="peek-max_count-false"),
    pytest.param(lambda t, l: t.peek("a", 1.0), TypeError, id="peek-max_count-float"),
    pytest.param(lambda t, l: t.peek("a", "1"), TypeError, id="peek-max_count-str"),
    pytest.param(lambda t, l: t.peek("a", None), TypeError, id="peek-max_count-none"),
    pytest.param(lambda t, l: t.peek("a", -1), ValueError, id="peek-max_count--1"),
    pytest.param(lambda t, l: t.peek("a", max_count=-(2**70)), ValueError, id="peek-max_count--2**70"),
    pytest.param(lambda t, l: t.peek(5, -1), TypeError, id="peek-order-group-first"),
]


class QuarantineRules(ContractBase):
    """The quarantine rules (see the module docstring)."""

    def _bury_head(self, t: Any, group: str = "g", reason: str = "boom", visibility: float = 30) -> Any:
        """Claim ``group``'s head (every floor) and bury it; return the lease."""
        lease = t.claim("w", visibility, INT64_MIN)
        assert lease is not None and lease.group_id == group, lease
        assert t.bury(lease, reason) is None
        return lease

    def _peek_ids(self, t: Any, group: str, max_count: int = 100) -> List[Any]:
        return [(m.seq, m.attempt) for m in t.peek(group, max_count)]

    # -- bury -----------------------------------------------------------------------

    @requires("supports_quarantine", QUARANTINE)
    def test_bury_holds_the_group_and_every_other_group_goes_on(self, transport: Any, clock: ContractClock) -> None:
        """``bury``: the delivery ends, the message stays at its group's head,
        and no claim serves the group, whatever the floor; the group's later
        messages wait behind it; every other group goes on."""
        transport.publish("g", "g1", priority=5)
        transport.publish("g", "g2")
        transport.publish("h", "h1")
        transport.publish("h", "h2")
        lease = self._bury_head(transport)
        assert transport.claim("w", 30, 5) is None  # the buried group's own level
        served = []
        for floor in (INT64_MIN, 0, INT64_MAX, INT64_MIN):
            got = transport.claim("w", 30, floor)
            if got is not None:
                served.append((got.group_id, got.seq))
                transport.ack(got)
        assert served == [("h", 3), ("h", 4)]
        assert self.claim_all(transport) == []
        assert len(transport) == 2
        for op in (transport.ack, transport.nack, lambda x: transport.nack(x, 5),
                   lambda x: transport.extend(x, 5), transport.bury):
            with pytest.raises(LeaseLost):  # the buried delivery is over
                op(lease)
        assert self._peek_ids(transport, "g") == [(1, 1), (2, 0)]

    @requires("supports_quarantine", QUARANTINE)
    @requires("supports_control_plane", CONTROL)
    def test_buried_group_info_and_stats(self, transport: Any, clock: ContractClock) -> None:
        """A buried group reports ``state="buried"``, the buried delivery's
        worker and attempt, ``expires_at=None`` and the reason;
        ``stats().buried`` counts it; it is neither leased nor parked."""
        transport.publish("g", "g1", priority=2)
        transport.publish("g", "g2")
        transport.publish("h", "h1")
        first = transport.claim("w1", 30)
        transport.nack(first)
        clock.advance(3)
        lease = transport.claim("w2", 30, 1)  # h (priority 0, never claimed) would come first
        assert (lease.group_id, lease.attempt) == ("g", 2)
        transport.bury(lease, "ValueError: attempt 2")
        info = transport.group("g")
        assert tuple(info) == ("g", 2, 2, "buried", False, 1, "w2", None, 2, 1003.0, "ValueError: attempt 2", None)
        assert transport.stats() == (3, 2, 0, 0, 0, 1, 0)
        assert transport.group("h").reason is None
        assert sorted((i.group_id, i.state, i.reason) for i in transport.groups()) == [
            ("g", "buried", "ValueError: attempt 2"), ("h", "ready", None)]

    @requires("supports_quarantine", QUARANTINE)
    def test_bury_default_reason_and_exact_str(self, transport: Any) -> None:
        """``reason`` defaults to ``""``; a ``str`` subclass is kept as an
        exact ``str``."""

        class Why(str):
            pass

        transport.publish("g", "e")
        transport.publish("h", "e")
        transport.bury(transport.claim("w", 30))
        transport.bury(transport.claim("w", 30), reason=Why("subclassed"))
        if self.supports_control_plane:
            assert transport.group("g").reason == ""
            reason = transport.group("h").reason
            assert reason == "subclassed" and type(reason) is str
        assert transport.stats().buried == 2

    @requires("supports_quarantine", QUARANTINE)
    def test_bury_reads_no_clock(self, transport: Any, clock: ContractClock) -> None:
        """``bury`` reads no clock (like ``ack``)."""
        transport.publish("g", "e")
        lease = transport.claim("w", 30)
        clock.bad = ClockTouched("bury read the clock")
        try:
            transport.bury(lease, "x")
        finally:
            clock.behave()
        assert transport.stats().buried == 1

    @requires("supports_quarantine", QUARANTINE)
    @pytest.mark.parametrize(
        "call",
        [
            pytest.param(lambda t, l: t.bury(l["stale"]), id="stale"),
            pytest.param(lambda t, l: t.bury(l["stale"], "why"), id="stale-with-reason"),
        ],
    )
    def test_bury_with_a_stale_lease_changes_nothing(self, new_transport: MakeTransport, call: Call) -> None:
        """A lease that is not current: ``LeaseLost``, nothing changed (and
        no clock read)."""
        assert_changes_nothing(new_transport, call, LeaseLost, clock_during_call=ClockTouched(),
                               identity=self.preserves_identity)

    @requires("supports_quarantine", QUARANTINE)
    def test_bury_after_the_message_moved_on(self, transport: Any, clock: ContractClock) -> None:
        """A lease whose message was acked, re-claimed after an expiry, or
        purged is not current: ``LeaseLost``; the new holder's delivery is
        untouched."""
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        old = transport.claim("w1", 10)
        clock.advance(11)
        new = transport.claim("w2", 10)
        assert (new.seq, new.attempt) == (1, 2)
        with pytest.raises(LeaseLost):
            transport.bury(old, "late")
        assert transport.stats() == (2, 1, 1, 0, 0, 0, 0)
        transport.ack(new)
        with pytest.raises(LeaseLost):
            transport.bury(new)
        assert transport.stats().buried == 0
        transport.claim("w", 10)  # g2

    @requires("supports_quarantine", QUARANTINE)
    def test_bury_of_a_lease_that_ran_out_unclaimed(self, transport: Any, clock: ContractClock) -> None:
        """A lease whose time ran out but whose message nobody claimed since
        is still current: it may be buried."""
        transport.publish("g", "e")
        lease = transport.claim("w", 10)
        clock.advance(20)
        assert transport.stats().leased == 0
        transport.bury(lease, "late")
        assert transport.stats() == (1, 1, 0, 0, 0, 1, 0)
        assert transport.claim("w", 10) is None

    @requires("supports_quarantine", QUARANTINE)
    def test_bury_of_a_lease_that_never_expires(self, transport: Any, clock: ContractClock) -> None:
        """A lease of infinite visibility ends when buried like any other:
        the message is neither leased nor parked, and ``resume`` lets it go."""
        transport.publish("g", "g1")
        transport.publish("h", "h1")
        lease = transport.claim("w", math.inf)
        assert lease.group_id == "g"
        transport.bury(lease, "forever")
        assert transport.stats() == (2, 2, 0, 0, 0, 1, 0)
        clock.advance(1e9)
        assert transport.claim("w", 30).group_id == "h"
        assert transport.resume("g") is True
        again = transport.claim("w", 30)
        assert (again.group_id, again.attempt) == ("g", 2)
        assert transport.stats() == (2, 2, 2, 0, 0, 0, 0)

    @requires("supports_quarantine", QUARANTINE)
    def test_bury_of_an_extended_lease(self, transport: Any) -> None:
        """The old and the extended lease name the same delivery: either may
        be buried, and the other then stops being current."""
        transport.publish("g", "e")
        old = transport.claim("w", 10)
        new = transport.extend(old, 60)
        transport.bury(old)
        with pytest.raises(LeaseLost):
            transport.ack(new)
        assert transport.stats().buried == 1

    @requires("supports_quarantine", QUARANTINE)
    @requires("supports_control_plane", CONTROL)
    def test_bury_on_a_paused_group(self, transport: Any) -> None:
        """A group paused while its message is leased may be buried: it
        reports ``"buried"`` and ``paused=True``; ``resume`` lifts both."""
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        lease = transport.claim("w", 30)
        assert transport.pause("g") is True
        transport.bury(lease, "poison")
        info = transport.group("g")
        assert (info.state, info.paused, info.reason, info.attempt) == ("buried", True, "poison", 1)
        assert transport.stats() == (2, 1, 0, 0, 1, 1, 0)
        assert transport.pause("g") is False
        assert transport.resume("g") is True
        assert transport.stats() == (2, 1, 0, 0, 0, 0, 0)
        again = transport.claim("w", 30)
        assert (again.seq, again.attempt) == (1, 2)
        assert transport.resume("g") is False

    @requires("supports_quarantine", QUARANTINE)
    @requires("supports_control_plane", CONTROL)
    def test_pausing_a_buried_group_then_resuming(self, transport: Any) -> None:
        """``pause`` and bury are independent: pausing a buried group keeps
        it buried; one ``resume`` lifts both."""
        transport.publish("g", "g1")
        self._bury_head(transport)
        assert transport.pause("g") is True
        info = transport.group("g")
        assert (info.state, info.paused) == ("buried", True)
        assert transport.resume("g") is True
        info = transport.group("g")
        assert (info.state, info.paused, info.reason, info.worker_id, info.attempt) == (
            "ready", False, None, None, None)

    @requires("supports_quarantine", QUARANTINE)
    def test_publish_to_a_buried_group_appends_behind_the_head(self, transport: Any) -> None:
        """Publishing to a buried group appends behind the head (its
        priority argument ignored: the group exists); after ``resume`` the
        group is delivered in publish order, the head first."""
        transport.publish("g", "g1", priority=1)
        self._bury_head(transport)
        events = [["g2"], ["g3"]]
        seqs = [transport.publish("g", event, priority=9) for event in events]
        assert seqs == [2, 3]
        assert transport.claim("w", 30, 9) is None and transport.claim("w", 30) is None
        peeked = transport.peek("g", 5)
        assert [(m.seq, m.attempt) for m in peeked] == [(1, 1), (2, 0), (3, 0)]
        assert self.same_event(peeked[1].event, events[0])
        assert transport.resume("g") is True
        order = []
        for _ in range(3):
            lease = transport.claim("w", 30, 1)
            order.append((lease.seq, lease.attempt))
            transport.ack(lease)
        assert order == [(1, 2), (2, 1), (3, 1)]
        assert len(transport) == 0

    @requires("supports_quarantine", QUARANTINE)
    def test_time_passing_over_a_buried_group(self, transport: Any, clock: ContractClock) -> None:
        """A bury has no end: the clock moving on (expiries applied by claims
        and stats) does not free the group."""
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        self._bury_head(transport, visibility=5)
        for step in (4, 2, 100, 1e9):
            clock.advance(step)
            assert transport.claim("w", 30, INT64_MIN) is None
            assert transport.stats() == (2, 1, 0, 0, 0, 1, 0)
        if self.supports_control_plane:
            info = transport.group("g")
            assert (info.state, info.expires_at, info.head_seq) == ("buried", None, 1)

    @requires("supports_quarantine", QUARANTINE)
    @requires("supports_control_plane", CONTROL)
    def test_resume_lifts_a_bury(self, transport: Any, clock: ContractClock) -> None:
        """``resume`` lifts a bury and returns True: the same message is
        claimable again, its next delivery attempt + 1; the group kept its
        round-robin position from the claim."""
        for group in ("a", "b"):
            transport.publish(group, f"{group}1")
            transport.publish(group, f"{group}2")
        buried = self._bury_head(transport, "a")  # a: claim 1
        clock.advance(1)
        transport.ack(transport.claim("w", 30))  # b: claim 2
        assert transport.resume("a") is True
        assert transport.resume("a") is False
        assert transport.group("a").state == "ready" and transport.stats().buried == 0
        leases = self.claim_all(transport)
        # a was claimed before b: it comes first again, with the same message
        assert [(x.group_id, x.seq, x.attempt) for x in leases] == [("a", 1, 2), ("b", 4, 1)]
        assert buried.seq == 1
        assert transport.resume("unknown") is False

    @requires("supports_quarantine", QUARANTINE)
    @requires("supports_control_plane", CONTROL)
    def test_purge_of_a_buried_group(self, transport: Any) -> None:
        """``purge`` removes a buried group like any other (bury, reason and
        all): a later publish creates it fresh."""
        transport.publish("g", "g1", priority=3)
        transport.publish("g", "g2")
        transport.publish("h", "h1")
        self._bury_head(transport)
        assert transport.purge("g") == 2
        assert transport.group("g") is None
        assert transport.stats() == (1, 1, 0, 0, 0, 0, 0)
        assert transport.peek("g") == []
        transport.publish("g", "new", priority=-1)
        info = transport.group("g")
        assert (info.state, info.priority, info.reason, info.last_claimed_at) == ("ready", -1, None, None)

    # -- skip -----------------------------------------------------------------------

    @requires("supports_quarantine", QUARANTINE)
    @pytest.mark.parametrize(
        "head", ["ready", "parked", "parked-forever", "parked-expired", "leased-expired", "buried", "paused"]
    )
    def test_skip_removes_the_head(self, transport: Any, clock: ContractClock, head: str) -> None:
        """``skip`` removes the head unless a live lease holds it: a ready,
        parked (the park ends with it), paused or buried head, or one under
        a lease that ran out (which then stops being current); the next
        message becomes the head and is claimable unless the group is paused."""
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        transport.publish("g", "g3")
        lease = None
        if head == "parked":
            transport.nack(transport.claim("w", 30), 1000)
        elif head == "parked-forever":
            transport.nack(transport.claim("w", 30), math.inf)
        elif head == "parked-expired":
            transport.nack(transport.claim("w", 30), 10)
            clock.advance(11)
        elif head == "leased-expired":
            lease = transport.claim("w", 10)
            clock.advance(11)
        elif head == "buried":
            self._bury_head(transport)
        elif head == "paused":
            if not self.supports_control_plane:
                pytest.skip(f"{type(self).__name__}.supports_control_plane is False: no pause")
            transport.pause("g")
        assert transport.skip("g") is True
        assert self._peek_ids(transport, "g") == [(2, 0), (3, 0)]
        assert len(transport) == 2 and transport.stats()[2:] == (0, 0, int(head == "paused"), 0, 0)
        if lease is not None:
            for op in (transport.ack, transport.nack, lambda x: transport.extend(x, 5)):
                with pytest.raises(LeaseLost):
                    op(lease)
        if head == "paused":
            assert transport.claim("w", 30, INT64_MIN) is None
            assert transport.resume("g") is True
        nxt = transport.claim("w", 30)
        assert (nxt.group_id, nxt.seq, nxt.attempt) == ("g", 2, 1)

    @requires("supports_quarantine", QUARANTINE)
    @pytest.mark.parametrize("at", ["live", "at-expires_at"])
    def test_skip_refuses_a_head_under_a_live_lease(self, transport: Any, clock: ContractClock, at: str) -> None:
        """A head under a lease that has not expired (``expires_at >= now``)
        is not skipped: ``False``, and nothing changes (the lease stays
        current, the group stays leased)."""
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        lease = transport.claim("w", 10)
        if at == "at-expires_at":
            clock.advance(10)
        assert transport.skip("g") is False
        assert self._peek_ids(transport, "g") == [(1, 1), (2, 0)]
        assert transport.stats() == (2, 1, 1, 0, 0, 0, 0)
        assert transport.claim("w2", 10, INT64_MIN) is None
        transport.ack(lease)  # still current
        assert transport.claim("w", 10).seq == 2

    @requires("supports_quarantine", QUARANTINE)
    def test_skip_of_an_unknown_group(self, transport: Any) -> None:
        """An unknown group: ``False``; no group is created."""
        transport.publish("g", "e")
        assert transport.skip("unknown") is False
        assert transport.peek("unknown") == []
        assert transport.stats() == (1, 1, 0, 0, 0, 0, 0)
        if self.supports_control_plane:
            assert transport.group("unknown") is None

    @requires("supports_quarantine", QUARANTINE)
    def test_skip_emptying_a_group_forgets_it(self, transport: Any) -> None:
        """A group emptied by ``skip`` that is not paused is forgotten: its
        priority and round-robin place go with it."""
        transport.publish("g", "poison", priority=4)
        transport.publish("h", "h1")
        transport.publish("h", "h2")
        self._bury_head(transport)
        transport.ack(transport.claim("w", 30))  # h: claimed after g
        assert transport.skip("g") is True
        assert transport.peek("g") == [] and transport.stats() == (1, 1, 0, 0, 0, 0, 0)
        if self.supports_control_plane:
            assert transport.group("g") is None
        assert transport.skip("g") is False
        transport.publish("g", "fresh", priority=-1)  # created anew: the new priority, never claimed
        assert transport.claim("w", 30, 0).group_id == "h"
        assert transport.claim("w", 30, 0) is None
        assert transport.claim("w", 30, -1).group_id == "g"

    @requires("supports_quarantine", QUARANTINE)
    @requires("supports_control_plane", CONTROL)
    def test_skip_emptying_a_paused_group_keeps_it(self, transport: Any) -> None:
        """A paused group emptied by ``skip`` is kept, paused (its later
        messages wait); skipping it again is ``False``; ``resume`` forgets it."""
        transport.publish("g", "only", priority=4)
        lease = transport.claim("w", 30)
        transport.pause("g")
        transport.bury(lease)
        assert transport.skip("g") is True  # lifts the bury, not the pause
        info = transport.group("g")
        assert (info.messages, info.state, info.paused, info.head_seq, info.reason, info.priority) == (
            0, "paused", True, None, None, 4)
        assert transport.stats() == (0, 0, 0, 0, 1, 0, 0)
        assert transport.skip("g") is False  # an empty paused group
        transport.publish("g", "later")
        assert transport.claim("w", 30, INT64_MIN) is None
        assert transport.resume("g") is True
        assert transport.claim("w", 30, 4).seq == 2

    @requires("supports_quarantine", QUARANTINE)
    @requires("supports_control_plane", CONTROL)
    def test_skip_lifts_a_bury_but_not_a_pause(self, transport: Any) -> None:
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        lease = transport.claim("w", 30)
        transport.pause("g")
        transport.bury(lease)
        assert transport.skip("g") is True
        info = transport.group("g")
        assert (info.state, info.paused, info.head_seq, info.reason) == ("paused", True, 2, None)
        assert transport.stats() == (1, 1, 0, 0, 1, 0, 0)
        assert transport.claim("w", 30, INT64_MIN) is None
        transport.resume("g")
        assert transport.claim("w", 30).seq == 2

    @requires("supports_quarantine", QUARANTINE)
    def test_skip_reads_the_clock_and_a_failing_clock_changes_nothing(self, new_transport: MakeTransport) -> None:
        """``skip`` reads the clock (to tell a live lease from one that ran
        out); a clock that raises: its error, nothing changed."""
        assert_changes_nothing(new_transport, lambda t, l: t.skip("a"), RuntimeError,
                               clock_during_call=RuntimeError("clock"), identity=self.preserves_identity)
        assert_changes_nothing(new_transport, lambda t, l: t.skip("d"), ValueError,
                               clock_during_call=math.nan, identity=self.preserves_identity)

    @requires("supports_quarantine", QUARANTINE)
    @pytest.mark.parametrize("paused", [False, True])
    def test_skip_places_a_never_claimed_group_by_its_new_head(self, transport: Any, paused: bool) -> None:
        """Never-claimed groups come first, in the order of their oldest
        message: after a skip, that is the group's next message (paused or
        not while skipped)."""
        transport.publish("a", "a1")  # seq 1
        transport.publish("b", "b1")  # seq 2
        transport.publish("a", "a2")  # seq 3
        transport.publish("c", "c1")  # seq 4
        if paused:
            transport.pause("a")
        assert transport.skip("a") is True
        if paused:
            transport.resume("a")
        order = [(x.group_id, x.seq) for x in self.claim_all(transport)]
        assert order == [("b", 2), ("a", 3), ("c", 4)]

    @requires("supports_quarantine", QUARANTINE)
    def test_skip_keeps_a_claimed_groups_round_robin_place(self, transport: Any) -> None:
        """A group that was claimed keeps its place (the order of its last
        claim) when its head is skipped: it does not become never-claimed."""
        for event in ("a1", "a2", "a3"):
            transport.publish("a", event)  # seqs 1-3
        transport.publish("b", "b1")  # 4
        transport.publish("b", "b2")  # 5
        transport.ack(transport.claim("w", 30))  # a: claim 1
        transport.ack(transport.claim("w", 30))  # b: claim 2
        transport.publish("c", "c1")  # 6, never claimed
        assert transport.skip("a") is True  # a2 goes; a3 is the head
        order = [(x.group_id, x.seq) for x in self.claim_all(transport)]
        assert order == [("c", 6), ("a", 3), ("b", 5)]

    @requires("supports_quarantine", QUARANTINE)
    def test_skip_uses_the_transports_time(self, transport: Any, clock: ContractClock) -> None:
        """The transport's time never runs back: a skip whose clock reading
        is older than the latest time used acts at that time, and a skip
        that reads a later time moves it on."""
        transport.publish("g", "g1")
        clock.advance(30)
        transport.stats()  # the transport's time: 1030
        clock.advance(-30)
        assert transport.skip("unknown") is False
        assert transport.claim("w", 10).expires_at == 1040.0  # not 1010: time did not run back
        clock.advance(100)
        assert transport.skip("unknown") is False  # reads 1100: the transport's time moves on
        clock.advance(-100)
        transport.publish("h", "h1")
        assert transport.claim("w", 10).expires_at == 1110.0

    @requires("supports_quarantine", QUARANTINE)
    def test_skip_applies_every_expiry_due(self, transport: Any, clock: ContractClock) -> None:
        """``skip`` applies every expiry due, not only the earliest or the
        latest lock's: the head whose lease ran out goes, whatever the other
        locks do."""
        for group in ("a", "b", "c"):
            transport.publish(group, group + "1")
            transport.publish(group, group + "2")
        transport.claim("w", 100)  # a: until 1100
        transport.claim("w", 10)  # b: until 1010
        transport.claim("w", 1000)  # c: until 2000
        clock.advance(50)
        assert transport.skip("a") is False  # still leased
        assert transport.skip("b") is True  # ran out at 1010
        assert transport.skip("c") is False
        assert [m.seq for m in transport.peek("b")] == [4]

    @requires("supports_quarantine", QUARANTINE)
    def test_skip_applies_expiry_as_stats_does(self, transport: Any, clock: ContractClock) -> None:
        """The expiry ``skip`` sees is permanent: the clock turned back does
        not revive the lease it saw run out."""
        transport.publish("g", "g1")
        transport.publish("h", "h1")
        transport.claim("w", 10)  # g
        clock.advance(20)
        assert transport.skip("h") is True  # applies expiry: g's lease is over
        clock.advance(-15)
        again = transport.claim("w2", 10)
        assert (again.group_id, again.attempt) == ("g", 2)

    # -- peek -----------------------------------------------------------------------

    @requires("supports_quarantine", QUARANTINE)
    def test_peek_in_every_state(self, transport: Any, clock: ContractClock) -> None:
        """``peek``: the group's oldest ``max_count`` messages, head first,
        whatever their state, as ``Message(seq, event, attempt, due_at, key)``
        (attempt: deliveries so far; no delay, no key here); ``[]`` for an unknown group."""
        events = {name: [name] for name in ("r1", "r2", "l1", "l2", "p1", "b1", "b2", "b3")}
        for name, event in events.items():
            transport.publish(name[0], event)
        leased = transport.claim("w", 30, INT64_MIN)  # never-claimed groups by their oldest message
        assert leased.group_id == "r"
        transport.nack(leased)  # r: ready again, attempt 1
        lease_l = transport.claim("w", 30)
        parked = transport.claim("w", 30)
        transport.nack(parked, 100)
        buried = transport.claim("w", 30)
        assert (lease_l.group_id, parked.group_id, buried.group_id) == ("l", "p", "b")
        transport.bury(buried, "x")
        expected = {
            "r": [(1, 1, "r1"), (2, 0, "r2")],
            "l": [(3, 1, "l1"), (4, 0, "l2")],
            "p": [(5, 1, "p1")],
            "b": [(6, 1, "b1"), (7, 0, "b2"), (8, 0, "b3")],
        }
        for group, want in expected.items():
            got = transport.peek(group, 10)
            assert isinstance(got, list)
            assert [(m.seq, m.attempt) for m in got] == [(s, a) for s, a, _ in want]
            for message, (_, _, name) in zip(got, want):
                assert type(message).__name__ == "Message"
                assert message._fields == ("seq", "event", "attempt", "due_at", "key")
                assert (message.due_at, message.key) == (None, None)
                assert self.same_event(message.event, events[name])
                assert type(message.seq) is int and type(message.attempt) is int
            assert [(m.seq, m.attempt) for m in transport.peek(group)] == [(s, a) for s, a, _ in want[:1]]
            assert len(transport.peek(group, 2)) == min(2, len(want))
            assert transport.peek(group, 0) == []
            assert len(transport.peek(group, 2**70)) == len(want)
        assert transport.peek("unknown", 5) == []
        if self.supports_control_plane:
            transport.pause("r")
            assert [m.seq for m in transport.peek("r", 5)] == [1, 2]
            transport.pause("empty")
            assert transport.peek("empty", 5) == []

    @requires("supports_quarantine", QUARANTINE)
    def test_peek_changes_nothing_and_reads_no_clock(self, new_transport: MakeTransport) -> None:
        """``peek`` reads no clock and changes nothing: a transport peeked at
        in every group is indistinguishable from one that was not."""
        clocks = [ContractClock(), ContractClock()]
        subject, control = (new_transport(c) for c in clocks)
        bad_input_history(subject, clocks[0])
        bad_input_history(control, clocks[1])
        clocks[0].bad = ClockTouched("peek read the clock")
        reads = clocks[0].reads
        for group in ("a", "b", "c", "d", "unknown"):
            subject.peek(group, 3)
            subject.peek(group)
        assert clocks[0].reads == reads
        clocks[0].behave()
        assert self.fingerprint(subject, clocks[0]) == self.fingerprint(control, clocks[1])

    # -- bad input ----------------------------------------------------------------------

    @requires("supports_quarantine", QUARANTINE)
    @pytest.mark.parametrize("call, error", _BAD_CALLS)
    def test_quarantine_bad_input(self, new_transport: MakeTransport, call: Call, error: type) -> None:
        """``bury``: a lease (``TypeError``), then a ``str`` reason
        (``TypeError``), then currency; ``skip``/``peek``: a ``str`` group id;
        ``peek``'s ``max_count`` an ``int >= 0`` (bool rejected).  The error
        comes before the clock is read and changes nothing."""
        assert_changes_nothing(new_transport, call, error, clock_during_call=ClockTouched(),
                               identity=self.preserves_identity)

    @requires("supports_quarantine", QUARANTINE)
    @requires("supports_control_plane", CONTROL)
    def test_bad_input_leaves_the_quarantine_as_it_was(self, transport: Any, clock: ContractClock) -> None:
        """A bad call on a buried group changes nothing of it."""
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        lease = self._bury_head(transport, reason="first")
        before = transport.group("g")
        for call, error in ((lambda: transport.bury(lease, "again"), LeaseLost),
                            (lambda: transport.bury(lease, 5), TypeError),
                            (lambda: transport.skip(7), TypeError),
                            (lambda: transport.peek("g", -1), ValueError)):
            with pytest.raises(error):
                call()
        assert transport.group("g") == before
        assert transport.stats() == (2, 1, 0, 0, 0, 1, 0)

    # -- wake-ups -----------------------------------------------------------------------

    @requires("supports_waiting", WAITING)
    @requires("supports_quarantine", QUARANTINE)
    @pytest.mark.parametrize("how", ["resume", "skip-buried", "skip-parked"])
    def test_resume_and_skip_wake_a_waiting_claim(self, transport: Any, clock: ContractClock, how: str) -> None:
        """``resume`` of a buried group, and ``skip`` exposing the group's
        next message, make a message claimable: a waiting claim gets it."""
        if how == "resume" and not self.supports_control_plane:
            pytest.skip(f"{type(self).__name__}.supports_control_plane is False: no resume")
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        first = transport.claim("w", 30)
        if how == "skip-parked":
            transport.nack(first, math.inf)
        else:
            transport.bury(first, "poison")
        waiter = self.start_waiting(
            clock, lambda: transport.claim("waiter", 30, timeout=self.liveness_timeout * 3), name="waiter"
        )
        assert not waiter.done, "the waiting claim returned with nothing to claim"
        if how == "resume":
            assert transport.resume("g") is True
            expected = (1, 2)
        else:
            assert transport.skip("g") is True
            expected = (2, 1)
        lease = waiter.outcome(self.liveness_timeout)
        assert lease is not None
        assert (lease.group_id, lease.worker_id, lease.seq, lease.attempt) == ("g", "waiter", *expected)
        assert transport.stats().leased == 1

    @requires("supports_waiting", WAITING)
    @requires("supports_quarantine", QUARANTINE)
    def test_bury_wakes_nobody(self, transport: Any, clock: ContractClock) -> None:
        """A bury makes nothing claimable: a waiting claim stays asleep, and
        gets the next group's message when one is published."""
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        lease = transport.claim("w", 30)
        waiter = self.start_waiting(
            clock, lambda: transport.claim("waiter", 30, timeout=self.liveness_timeout * 3), name="waiter"
        )
        transport.bury(lease)
        waiter.join(self.settle_seconds)
        assert not waiter.done, "a bury woke a waiting claim with the buried group's next message"
        transport.publish("h", "h1")
        got = waiter.outcome(self.liveness_timeout)
        assert got is not None and got.group_id == "h"
        assert self._peek_ids(transport, "g") == [(1, 1), (2, 0)]

    @requires("supports_quarantine", QUARANTINE)
    def test_the_parked_sentinel_is_not_a_buried_worker(self, transport: Any) -> None:
        """A parked head that is skipped leaves no park behind (``stats``)."""
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        transport.nack(transport.claim("w", 30), 1000)
        assert transport.stats() == (2, 1, 0, 1, 0, 0, 0)
        assert transport.skip("g") is True
        assert transport.stats() == (1, 1, 0, 0, 0, 0, 0)
        if self.supports_control_plane:
            info = transport.group("g")
            assert (info.state, info.worker_id) == ("ready", None) and info.worker_id != PARKED
