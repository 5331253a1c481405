"""Part 2 of the contract, "Control plane": ``pause``, ``resume``, ``purge``,
``set_priority``, ``group``, ``groups`` and ``stats().paused``, rule by rule.
"""

from __future__ import annotations

import gc
import math
from typing import Any, Callable, List

import pytest

from .._errors import LeaseLost
from .._types import PARKED
from .._validation import INT64_MIN
from ._contract_base import ContractBase, ContractClock, MakeTransport, requires
from ._rules_bad_input import ClockTouched, assert_changes_nothing

__all__ = ["ControlPlaneRules"]

CONTROL = "the control plane (pause, resume, purge, set_priority, group, groups)"
WAITING = "waiting claims (claim(timeout=...), aclaim, close() waking waiters)"

GROUP_INFO_FIELDS = (
    "group_id", "priority", "messages", "state", "paused", "head_seq", "worker_id", "expires_at", "attempt",
    "last_claimed_at", "reason", "due_at",
)

_BAD_CALLS = [
    pytest.param(lambda t, l: t.pause(5), TypeError, id="pause-int"),
    pytest.param(lambda t, l: t.pause(None), TypeError, id="pause-none"),
    pytest.param(lambda t, l: t.resume(b"a"), TypeError, id="resume-bytes"),
    pytest.param(lambda t, l: t.purge(["a"]), TypeError, id="purge-list"),
    pytest.param(lambda t, l: t.group(5), TypeError, id="group-int"),
    pytest.param(lambda t, l: t.set_priority(5, 1), TypeError, id="set_priority-group-int"),
    pytest.param(lambda t, l: t.set_priority("a", 1.0), TypeError, id="set_priority-float"),
    pytest.param(lambda t, l: t.set_priority("a", True), TypeError, id="set_priority-bool"),
    pytest.param(lambda t, l: t.set_priority("a", "1"), TypeError, id="set_priority-str"),
    pytest.param(lambda t, l: t.set_priority("a", 2**63), OverflowError, id="set_priority-2**63"),
    pytest.param(lambda t, l: t.set_priority("a", INT64_MIN - 1), OverflowError, id="set_priority--2**63-1"),
    pytest.param(lambda t, l: t.set_priority(5, 2**63), TypeError, id="set_priority-order"),
]


class ControlPlaneRules(ContractBase):
    """The control-plane rules (see the module docstring)."""

    # -- pause / resume -------------------------------------------------------------

    @requires("supports_control_plane", CONTROL)
    def test_paused_group_is_never_served(self, transport: Any, clock: ContractClock) -> None:
        """``pause`` returns True if the group was not paused; a paused group
        is never served (like a park with no end); ``resume`` returns True
        when it lifted the pause, and the group is served again."""
        transport.publish("a", "a1")
        transport.publish("b", "b1")
        assert transport.pause("a") is True
        assert transport.pause("a") is False
        assert transport.stats() == (2, 2, 0, 0, 1, 0, 0)
        clock.advance(1e9)
        assert [x.group_id for x in self.claim_all(transport)] == ["b"]
        assert transport.resume("a") is True
        assert transport.resume("a") is False
        assert transport.stats().paused == 0
        lease = transport.claim("w", 30)
        assert (lease.group_id, lease.seq, lease.attempt) == ("a", 1, 1)

    @requires("supports_control_plane", CONTROL)
    def test_pause_leaves_a_leased_message_with_its_worker(self, transport: Any, clock: ContractClock) -> None:
        """A message already leased stays leased: its worker may ack, nack or
        extend it; a nack(0) or an expiry leaves it in the still-paused group."""
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        lease = transport.claim("w", 30)
        assert transport.pause("g") is True
        assert transport.stats() == (2, 1, 1, 0, 1, 0, 0)
        lease = transport.extend(lease, 10)  # still current
        transport.ack(lease)
        assert transport.claim("w", 30) is None  # g2 waits in the paused group
        assert transport.resume("g") is True
        lease = transport.claim("w", 10)
        assert lease.seq == 2
        assert transport.pause("g") is True
        transport.nack(lease)  # free again, but paused
        assert transport.claim("w", 30) is None
        assert transport.resume("g") is True
        lease = transport.claim("w", 10)
        assert (lease.seq, lease.attempt) == (2, 2)
        assert transport.pause("g") is True
        clock.advance(11)  # the lease expires inside the paused group
        assert transport.claim("w", 30) is None
        assert transport.stats() == (1, 1, 0, 0, 1, 0, 0)
        assert transport.resume("g") is True
        assert (transport.claim("w", 10).attempt, transport.claim("w", 10)) == (3, None)

    @requires("supports_control_plane", CONTROL)
    def test_pausing_an_unknown_group_holds_its_later_messages(self, transport: Any) -> None:
        """Pausing a group that holds no message records it: messages
        published later wait in it until ``resume``."""
        assert transport.group("new") is None
        assert transport.pause("new") is True
        assert transport.stats().paused == 1
        info = transport.group("new")
        assert info is not None
        assert (info.group_id, info.messages, info.state, info.paused, info.head_seq) == (
            "new", 0, "paused", True, None
        )
        transport.publish("new", "e")
        transport.publish("other", "e")
        assert [x.group_id for x in self.claim_all(transport)] == ["other"]
        assert transport.group("new").messages == 1
        assert transport.resume("new") is True
        assert transport.claim("w", 30).group_id == "new"

    @requires("supports_control_plane", CONTROL)
    def test_paused_group_is_not_forgotten_while_empty(self, transport: Any) -> None:
        """A paused group survives losing its last message (messages published
        later wait in it); an emptied group is forgotten on ``resume``."""
        transport.publish("g", "e", priority=4)
        lease = transport.claim("w", 30)
        transport.pause("g")
        transport.ack(lease)
        info = transport.group("g")
        assert info is not None and (info.messages, info.state, info.paused, info.priority) == (0, "paused", True, 4)
        assert transport.stats() == (0, 0, 0, 0, 1, 0, 0)
        assert transport.resume("g") is True
        assert transport.group("g") is None  # emptied: forgotten on resume
        assert transport.stats() == (0, 0, 0, 0, 0, 0, 0)
        transport.publish("g", "again", priority=-1)  # created fresh: the new priority holds
        assert transport.group("g").priority == -1
        assert transport.claim("w", 30) is None

    @requires("supports_control_plane", CONTROL)
    def test_resume_ends_a_park_at_once(self, transport: Any, clock: ContractClock) -> None:
        """``resume`` ends a park at once: the parked message is claimable
        now, its attempt count unchanged (its next delivery is attempt + 1)."""
        transport.publish("g", "e")
        transport.publish("h", "e", priority=-1)  # ready, below the default floor
        lease = transport.claim("w", 30)
        transport.nack(lease, 1000)
        assert transport.resume("h") is False  # neither paused nor parked
        assert transport.resume("unknown") is False
        assert transport.group("unknown") is None
        assert transport.resume("g") is True
        assert transport.stats() == (2, 2, 0, 0, 0, 0, 0)
        again = transport.claim("w", 30)
        assert (again.group_id, again.seq, again.attempt) == ("g", 1, 2)
        transport.nack(again, 1000)
        transport.pause("g")
        assert transport.resume("g") is True  # lifts the pause and the park
        assert transport.resume("g") is False
        again = transport.claim("w", 30)
        assert (again.group_id, again.seq, again.attempt) == ("g", 1, 3)
        assert transport.stats() == (2, 2, 1, 0, 0, 0, 0)

    # -- purge ----------------------------------------------------------------------------

    @requires("supports_control_plane", CONTROL)
    def test_purge_removes_every_message_of_the_group(self, transport: Any, clock: ContractClock) -> None:
        """``purge`` removes the group's messages, the leased or parked one
        included (its lease is no longer current), and returns how many."""
        for i in range(3):
            transport.publish("g", f"g{i}")
        transport.publish("h", "h0")
        lease = transport.claim("w", 30)
        assert transport.purge("g") == 3
        for op in (transport.ack, transport.nack, lambda x: transport.nack(x, 5), lambda x: transport.extend(x, 5)):
            with pytest.raises(LeaseLost):
                op(lease)
        assert transport.group("g") is None
        assert (len(transport), transport.stats()) == (1, (1, 1, 0, 0, 0, 0, 0))
        assert transport.purge("g") == 0
        assert transport.purge("unknown") == 0
        parked = transport.claim("w", 30)
        transport.nack(parked, 100)
        assert transport.purge("h") == 1
        assert (len(transport), transport.stats()) == (0, (0, 0, 0, 0, 0, 0, 0))
        assert transport.publish("g", "after") == 5  # seqs are never reused

    @requires("supports_control_plane", CONTROL)
    def test_purge_forgets_the_group(self, transport: Any) -> None:
        """``purge`` forgets the group, its pause, priority and round-robin
        position included: a later publish creates it fresh."""
        transport.publish("g", "g1", priority=5)
        transport.publish("g", "g2")
        transport.publish("h", "h1")
        transport.publish("h", "h2")
        transport.ack(transport.claim("w", 30))  # g: claimed
        transport.ack(transport.claim("w", 30))  # h: claimed after g
        transport.pause("g")
        assert transport.purge("g") == 1
        assert transport.stats().paused == 0
        transport.publish("g", "new", priority=-1)
        info = transport.group("g")
        assert (info.priority, info.paused, info.last_claimed_at) == (-1, False, None)
        assert [x.group_id for x in self.claim_all(transport)] == ["g", "h"]  # never claimed: first
        assert transport.purge("empty-paused") == 0
        transport.pause("empty-paused")
        assert transport.purge("empty-paused") == 0
        assert transport.group("empty-paused") is None and transport.stats().paused == 0

    @requires("preserves_identity", "to hold events by reference (their finalisers run when purge drops them)")
    @requires("supports_control_plane", CONTROL)
    def test_purge_drops_events_outside_the_lock(self, transport: Any) -> None:
        """The purged events' last references go after the lock is released:
        their ``__del__`` may use the transport."""
        published: List[int] = []

        class Step:
            def __del__(self) -> None:
                published.append(transport.publish("next", "from __del__"))

        def scenario() -> None:
            for _ in range(3):
                transport.publish("g", Step())
            lease = transport.claim("w", 30)
            assert transport.purge("g") == 3
            del lease
            gc.collect()

        self.run_with_deadline(scenario)
        assert published == [4, 5, 6]
        assert len(transport) == 3

    # -- set_priority -------------------------------------------------------------------

    @requires("supports_control_plane", CONTROL)
    def test_set_priority(self, transport: Any) -> None:
        """``set_priority`` changes a live group's priority (its round-robin
        position is kept) and returns True; it does not create a group."""
        for group in ("a", "b", "c"):
            transport.publish(group, 1)
            transport.publish(group, 2)
        transport.ack(transport.claim("w", 30))  # a: claim 1
        transport.ack(transport.claim("w", 30))  # b: claim 2
        assert transport.set_priority("a", 7) is True
        assert transport.group("a").priority == 7
        assert transport.claim("w", 30, min_priority=1).group_id == "a"
        assert transport.claim("w", 30, min_priority=1) is None
        assert transport.set_priority("b", -3) is True
        assert [x.group_id for x in self.claim_all(transport, min_priority=0)] == ["c"]
        assert transport.set_priority("zzz", 1) is False
        assert transport.group("zzz") is None and len(transport) == 4
        transport.publish("zzz", "e", priority=2)
        assert transport.group("zzz").priority == 2

    @requires("supports_control_plane", CONTROL)
    def test_set_priority_keeps_the_round_robin_position(self, transport: Any) -> None:
        for group in ("a", "b", "c"):
            transport.publish(group, 1)
            transport.publish(group, 2)
        transport.ack(transport.claim("w", 30))  # a: claim 1
        transport.ack(transport.claim("w", 30))  # b: claim 2
        assert transport.set_priority("a", 3) is True
        # c never claimed, then a (claim 1) before b (claim 2): a kept its place
        assert [x.group_id for x in self.claim_all(transport)] == ["c", "a", "b"]

    # -- group / groups -------------------------------------------------------------------

    @requires("supports_control_plane", CONTROL)
    def test_group_info_in_every_state(self, transport: Any, clock: ContractClock) -> None:
        """``group(g)``: a ``GroupInfo`` with the group's priority, messages,
        state (ready / leased / parked / paused, as of now), paused flag,
        head seq, the current lease's or park's holder, end and attempt, and
        the clock time of its last claim; None for an unknown group."""
        transport.publish("g", "g1", priority=3)
        transport.publish("g", "g2")
        info = transport.group("g")
        assert type(info).__name__ == "GroupInfo" and isinstance(info, tuple)
        assert getattr(info, "_fields", None) == GROUP_INFO_FIELDS
        assert tuple(info) == ("g", 3, 2, "ready", False, 1, None, None, None, None, None, None)
        lease = transport.claim("w", 30)
        assert tuple(transport.group("g")) == ("g", 3, 2, "leased", False, 1, "w", 1030.0, 1, 1000.0, None, None)
        transport.pause("g")
        assert tuple(transport.group("g")) == ("g", 3, 2, "leased", True, 1, "w", 1030.0, 1, 1000.0, None, None)
        clock.advance(5)
        transport.nack(lease, 50)
        assert tuple(transport.group("g")) == ("g", 3, 2, "parked", True, 1, PARKED, 1055.0, 1, 1000.0, None, None)
        transport.resume("g")  # lifts the pause and ends the park
        assert tuple(transport.group("g")) == ("g", 3, 2, "ready", False, 1, None, None, None, 1000.0, None, None)
        lease = transport.claim("w", 10)
        transport.nack(lease, 50)
        assert tuple(transport.group("g")) == ("g", 3, 2, "parked", False, 1, PARKED, 1055.0, 2, 1005.0, None, None)
        clock.advance(51)
        assert tuple(transport.group("g")) == ("g", 3, 2, "ready", False, 1, None, None, None, 1005.0, None, None)
        assert transport.group("unknown") is None

    @requires("supports_control_plane", CONTROL)
    def test_group_applies_expiry_as_stats_does(self, transport: Any, clock: ContractClock) -> None:
        """``group`` reads the clock and applies expiries: an expired lease
        shows "ready", and stays expired when the clock goes back."""
        transport.publish("g", "e")
        transport.claim("w", 10)
        clock.advance(20)
        assert transport.group("g").state == "ready"
        clock.advance(-15)
        again = transport.claim("w2", 10)
        assert again is not None and again.attempt == 2

    @requires("supports_control_plane", CONTROL)
    def test_groups_is_a_snapshot_of_every_group(self, transport: Any, clock: ContractClock) -> None:
        assert transport.groups() == []
        transport.publish("a", "a1", priority=2)
        transport.publish("b", "b1")
        transport.publish("b", "b2")
        transport.pause("c")
        lease = transport.claim("w", 30)
        snapshot = transport.groups()
        assert isinstance(snapshot, list)
        assert sorted(snapshot) == sorted([transport.group("a"), transport.group("b"), transport.group("c")])
        assert sorted(tuple(info) for info in snapshot) == [
            ("a", 2, 1, "leased", False, 1, "w", 1030.0, 1, 1000.0, None, None),
            ("b", 0, 2, "ready", False, 2, None, None, None, None, None, None),
            ("c", 0, 0, "paused", True, None, None, None, None, None, None, None),
        ]
        transport.ack(lease)
        assert sorted(info.group_id for info in transport.groups()) == ["b", "c"]
        assert sorted(info.group_id for info in snapshot) == ["a", "b", "c"]  # a snapshot: unchanged

    # -- bad input --------------------------------------------------------------------

    @requires("supports_control_plane", CONTROL)
    @pytest.mark.parametrize("call, error", _BAD_CALLS)
    def test_control_plane_bad_input(
        self, new_transport: MakeTransport, call: Callable[..., Any], error: type
    ) -> None:
        """As Part 1: ``group_id`` a ``str``, ``priority`` an int64; the error
        comes before the clock is read and changes nothing."""
        assert_changes_nothing(
            new_transport, call, error, clock_during_call=ClockTouched(), identity=self.preserves_identity
        )

    # -- with waiting ---------------------------------------------------------------------

    @requires("supports_waiting", WAITING)
    @requires("supports_control_plane", CONTROL)
    @pytest.mark.parametrize("how", ["resume-pause", "resume-park", "set_priority"])
    def test_resume_and_set_priority_wake_a_waiting_claim(self, transport: Any, clock: ContractClock, how: str) -> None:
        """``resume`` (of a pause or a park) and ``set_priority`` make a group
        claimable: a waiting claim gets it."""
        floor = 5 if how == "set_priority" else 0
        if how == "resume-pause":
            transport.pause("g")
            transport.publish("g", "e")
            expected_attempt = 1
        elif how == "resume-park":
            transport.publish("g", "e")
            transport.nack(transport.claim("w", 30), math.inf)
            expected_attempt = 2
        else:
            transport.publish("g", "e")
            expected_attempt = 1
        waiter = self.start_waiting(
            clock, lambda: transport.claim("waiter", 30, floor, timeout=self.liveness_timeout * 3), name="waiter"
        )
        if how == "set_priority":
            assert transport.set_priority("g", 5) is True
        else:
            assert transport.resume("g") is True
        lease = waiter.outcome(self.liveness_timeout)
        assert lease is not None
        assert (lease.group_id, lease.worker_id, lease.attempt) == ("g", "waiter", expected_attempt)
