"""Part 5 of the contract, "Honest attempts": ``release``, ``retry`` and
fencing by delivery, rule by rule.

``release(lease, delay)`` is ``nack(lease, delay)`` whose delivery does not
count (the next delivery carries the same ``attempt``); ``retry(group_id)``
gives a group's head a fresh start (attempt count 0, a bury lifted, a park
ended, an expired delivery closed; a pause, a schedule and the round-robin
place stay).  Because both hand out an ``attempt`` an old lease may carry,
a lease is current by its *delivery*, never by its fields: a lease of a
closed delivery raises ``LeaseLost`` for good.  The choices the SPEC leaves
open are in docs/decisions.md, "Part 5 ... pinned", "Honest attempts".
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Awaitable, Callable, List, Tuple

import pytest

from .._errors import LeaseLost
from .._types import PARKED
from ._contract_base import ContractBase, ContractClock, MakeTransport, requires
from ._reference import INT64_MIN
from ._rules_core import _history_acked

__all__ = ["AttemptRules"]

RELEASE = "release(lease, delay), retry(group_id) and fencing by delivery"
CONTROL = "the control plane (pause, resume, purge, set_priority, group, groups)"
QUARANTINE = "the quarantine (bury, skip, peek; resume lifting a bury)"
WAITING = "waiting claims (claim(timeout=...), aclaim, close() waking waiters)"
LATER = "delayed publish (publish(delay=), publish_many(delay=), the scheduled state, stats().scheduled, due_at)"

Op = Callable[[Any, Any], Any]


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _ids(leases: List[Any]) -> List[Tuple[str, int, int]]:
    return [(x.group_id, x.seq, x.attempt) for x in leases]


# -- histories after which a lease is stale, release among them ----------------


def _stale_released(t: Any, clock: ContractClock) -> Any:
    t.publish("g", "e")
    t.publish("h", "x")
    stale = t.claim("w1", 10)
    t.release(stale)
    return stale


def _stale_released_and_parked(t: Any, clock: ContractClock) -> Any:
    t.publish("g", "e")
    stale = t.claim("w1", 10)
    t.release(stale, 50)
    return stale


def _stale_released_and_redelivered(t: Any, clock: ContractClock) -> Any:
    t.publish("g", "e")
    t.publish("g", "f")
    stale = t.claim("w1", 10)
    t.release(stale)
    again = t.claim("w1", 10)  # the same worker, attempt and expiry: only the delivery differs
    assert (again.seq, again.attempt, again.expires_at) == (stale.seq, stale.attempt, stale.expires_at)
    return stale


def _stale_expired_and_reclaimed(t: Any, clock: ContractClock) -> Any:
    t.publish("g", "e")
    stale = t.claim("w1", 10)
    clock.advance(20)
    t.claim("w2", 10)
    return stale


_STALE = [
    pytest.param(_stale_released, id="released"),
    pytest.param(_stale_released_and_parked, id="released-and-parked"),
    pytest.param(_stale_released_and_redelivered, id="released-and-redelivered"),
    pytest.param(_history_acked, id="acked"),
    pytest.param(_stale_expired_and_reclaimed, id="expired-and-reclaimed"),
]

_RELEASES = [
    pytest.param(lambda t, lease: t.release(lease), id="release0"),
    pytest.param(lambda t, lease: t.release(lease, 5), id="release5"),
]

def _ack_many_refuses(t: Any, lease: Any) -> None:
    """``ack_many`` returns a lease that is not current instead of raising:
    raise ``LeaseLost`` when it did."""
    rest = t.ack_many([lease])
    assert len(rest) == 1 and rest[0] is lease, f"ack_many acked a stale lease (returned {rest!r})"
    raise LeaseLost("ack_many returned the lease: not current")


#: every call that names a delivery by its lease, with the flag it needs
_LEASE_CALLS = [
    pytest.param(lambda t, lease: t.ack(lease), None, id="ack"),
    pytest.param(lambda t, lease: t.nack(lease), None, id="nack"),
    pytest.param(lambda t, lease: t.nack(lease, 5), None, id="nack5"),
    pytest.param(lambda t, lease: t.extend(lease, 5), None, id="extend"),
    pytest.param(lambda t, lease: t.release(lease), None, id="release"),
    pytest.param(lambda t, lease: t.release(lease, 5), None, id="release5"),
    pytest.param(lambda t, lease: t.bury(lease, "x"), "supports_quarantine", id="bury"),
    pytest.param(lambda t, lease: t.ack_and_claim(lease, "w", 30), "supports_ack_and_claim", id="ack_and_claim"),
    pytest.param(lambda t, lease: _ack_many_refuses(t, lease), "supports_batches", id="ack_many"),
]


class AttemptRules(ContractBase):
    """The release / retry / fencing-by-delivery rules (see the module docstring)."""

    def _skip_without(self, flag: Any) -> None:
        if flag is not None and not getattr(self, flag):
            pytest.skip(f"{type(self).__name__}.{flag} is False")

    def _drain(self, t: Any) -> List[Tuple[str, int, int]]:
        """Claim and ack until nothing is eligible: ``(group, seq, attempt)``."""
        out = []
        while (lease := t.claim("w", 30, INT64_MIN)) is not None:
            out.append((lease.group_id, lease.seq, lease.attempt))
            t.ack(lease)
            assert len(out) <= 1000, "claimed more messages than were published"
        return out

    # -- release ---------------------------------------------------------------------

    @requires("supports_release", RELEASE)
    @pytest.mark.parametrize("delay", [0, 5])
    def test_release_is_nack_whose_delivery_does_not_count(self, new_transport: MakeTransport, delay: float) -> None:
        """``release(lease, delay)`` does what ``nack(lease, delay)`` does (the
        round-robin place, the park, what is served next and when), except
        that the message's next delivery carries the same ``attempt``."""
        clocks = [ContractClock(), ContractClock()]
        released, nacked = (new_transport(c) for c in clocks)
        for t in (released, nacked):
            t.publish("g", "g1")
            t.publish("g", "g2")
            t.publish("h", "h1")
            t.publish("h", "h2")
            t.ack(t.claim("w", 30))  # g1: g's round-robin key is the first claim
            t.ack(t.claim("w", 30))  # h1: the second
        g_r = released.claim("w", 30)
        g_n = nacked.claim("w", 30)
        assert _ids([g_r]) == _ids([g_n]) == [("g", 2, 1)]
        assert released.release(g_r, delay) is None
        nacked.nack(g_n, delay)
        assert released.stats() == nacked.stats()
        for clock in clocks:
            clock.advance(6)
        got_r = _ids(self.claim_all(released))
        got_n = _ids(self.claim_all(nacked))
        assert [(g, s) for g, s, _ in got_r] == [(g, s) for g, s, _ in got_n]
        assert [a for g, s, a in got_r if s == 2] == [1], "the released delivery was counted"
        assert [a for g, s, a in got_n if s == 2] == [2]
        assert [a for g, s, a in got_r if s != 2] == [a for g, s, a in got_n if s != 2]

    @requires("supports_release", RELEASE)
    def test_release_hands_the_same_attempt_again_each_time(self, transport: Any, clock: ContractClock) -> None:
        """Released deliveries never count: after two releases the message's
        delivery is still attempt 1; a nack then counts as usual."""
        transport.publish("g", "e")
        lease = transport.claim("w", 30)
        transport.release(lease)
        lease = transport.claim("w", 30)
        assert lease.attempt == 1
        transport.release(lease)
        lease = transport.claim("w", 30)
        assert lease.attempt == 1
        transport.nack(lease)
        lease = transport.claim("w", 30)
        assert lease.attempt == 2
        transport.release(lease)
        assert transport.claim("w", 30).attempt == 2
        if self.supports_quarantine:
            assert transport.peek("g")[0].attempt == 2

    @requires("supports_release", RELEASE)
    def test_release_with_delay_parks(self, transport: Any, clock: ContractClock) -> None:
        """``release(lease, d)`` with ``d > 0`` parks the message until
        ``now + d`` (strictly past it), as ``nack`` does; the parked group's
        ``attempt`` is the count after the release."""
        transport.publish("g", "e")
        transport.nack(transport.claim("w", 30))
        lease = transport.claim("w", 30)
        assert lease.attempt == 2
        transport.release(lease, 10)
        assert transport.stats() == (1, 1, 0, 1, 0, 0, 0)
        if self.supports_control_plane:
            assert tuple(transport.group("g")) == (
                "g", 0, 1, "parked", False, 1, PARKED, 1010.0, 1, 1000.0, None, None)
        clock.set(1010.0)
        assert transport.claim("w", 30, INT64_MIN) is None
        clock.set(math.nextafter(1010.0, math.inf))
        again = transport.claim("w", 30)
        assert again is not None and (again.seq, again.attempt) == (1, 2)

    @requires("supports_release", RELEASE)
    def test_release_with_infinite_delay_parks_for_ever(self, transport: Any, clock: ContractClock) -> None:
        transport.publish("g", "e")
        transport.release(transport.claim("w", 30), math.inf)
        clock.advance(1e300)
        assert transport.claim("w", 30, INT64_MIN) is None
        assert transport.stats().parked == 1

    @requires("supports_release", RELEASE)
    @pytest.mark.parametrize("history", _STALE)
    @pytest.mark.parametrize("op", _RELEASES)
    def test_release_of_a_stale_lease_raises_lease_lost_and_changes_nothing(
        self, new_transport: MakeTransport, history: Callable[..., Any], op: Op
    ) -> None:
        """``release`` of a lease that is not current raises ``LeaseLost`` and
        changes nothing."""
        clocks = [ContractClock(), ContractClock()]
        subject, control = (new_transport(c) for c in clocks)
        stale = history(subject, clocks[0])
        history(control, clocks[1])
        with pytest.raises(LeaseLost):
            op(subject, stale)
        assert self.fingerprint(subject, clocks[0]) == self.fingerprint(control, clocks[1])

    @requires("supports_release", RELEASE)
    @pytest.mark.parametrize("same_worker", [True, False], ids=["same-worker", "other-worker"])
    @pytest.mark.parametrize("call, flag", _LEASE_CALLS)
    def test_release_no_aba_a_released_delivery_is_never_current_again(
        self, new_transport: MakeTransport, same_worker: bool, call: Op, flag: Any
    ) -> None:
        """Fencing by delivery: after ``release`` the message's next delivery
        carries the released lease's ``attempt`` (and, with the same worker
        and clock, all its fields), yet the old lease raises ``LeaseLost``
        and changes nothing; the new one is current."""
        self._skip_without(flag)
        clocks = [ContractClock(), ContractClock()]
        subject, control = (new_transport(c) for c in clocks)
        leases = []
        for t in (subject, control):
            t.publish("g", "e")
            t.publish("g", "f")
            t.publish("h", "x")
            old = t.claim("w1", 10)  # g
            t.claim("w3", 10)  # h, so that the next claim is g's
            t.release(old)
            new = t.claim("w1" if same_worker else "w2", 10)
            assert (new.seq, new.attempt) == (old.seq, old.attempt) == (1, 1)
            leases.append((old, new))
        with pytest.raises(LeaseLost):
            call(subject, leases[0][0])
        subject.extend(leases[0][1], 10)  # the new delivery is current
        control.extend(leases[1][1], 10)
        assert self.fingerprint(subject, clocks[0]) == self.fingerprint(control, clocks[1])

    @requires("supports_release", RELEASE)
    @pytest.mark.parametrize("how", ["claim", "claim_many", "ack_and_claim"])
    def test_release_no_aba_whoever_redelivers(self, transport: Any, clock: ContractClock, how: str) -> None:
        """Whatever claim makes the next delivery (``claim``, ``claim_many``,
        ``ack_and_claim``), the released lease stays stale and the new one
        is current."""
        if how == "claim_many":
            self._skip_without("supports_batches")
        if how == "ack_and_claim":
            self._skip_without("supports_ack_and_claim")
        transport.publish("g", "e")
        transport.publish("g", "f")
        transport.publish("h", "x")
        old = transport.claim("w", 10)  # g
        other = transport.claim("w", 10)  # h
        transport.release(old)
        if how == "claim":
            new = transport.claim("w", 10)
        elif how == "claim_many":
            [new] = transport.claim_many("w", 10, 1)
        else:
            new = transport.ack_and_claim(other, "w", 10)
        assert (new.group_id, new.seq, new.attempt, new.worker_id) == ("g", 1, 1, "w")
        for op in (transport.ack, transport.nack, transport.release, lambda x: transport.extend(x, 10)):
            with pytest.raises(LeaseLost):
                op(old)
        transport.ack(new)
        with pytest.raises(LeaseLost):
            transport.ack(old)
        if how != "ack_and_claim":
            transport.ack(other)
        assert [(g, s) for g, s, _ in self._drain(transport)] == [("g", 2)]

    @requires("supports_release", RELEASE)
    @requires("supports_waiting", WAITING)
    @pytest.mark.parametrize("kind", ["thread", "asyncio"])
    def test_release_wakes_a_waiting_claim(self, transport: Any, clock: ContractClock, kind: str) -> None:
        """``release(lease)`` makes the message claimable at once, as
        ``nack(lease)`` does: a waiting claim gets it, with the same attempt."""
        transport.publish("g", "e")
        lease = transport.claim("holder", 30)
        if kind == "thread":
            waiter = self.start_waiting(clock, lambda: transport.claim("waiter", 30, timeout=self.far()))
        else:
            waiter = self.start_waiting(
                clock, lambda: asyncio.run(_await(transport.aclaim("waiter", 30, timeout=self.far()))))
        transport.release(lease)
        got = waiter.outcome(self.liveness_timeout)
        assert got is not None, "the waiting claim returned None instead of the released message"
        assert (got.group_id, got.seq, got.attempt, got.worker_id) == ("g", 1, 1, "waiter")

    # -- retry ---------------------------------------------------------------------------

    @requires("supports_release", RELEASE)
    @pytest.mark.parametrize("case", ["unknown", "paused-empty", "leased", "leased-until-now"])
    def test_retry_refuses_and_changes_nothing(self, new_transport: MakeTransport, case: str) -> None:
        """``retry`` returns ``False`` and changes nothing (but the time it
        read and the expiry it applied) for an unknown group, a group
        holding no message, and a head under a lease with ``expires_at >=
        now``; that lease stays current."""
        if case == "paused-empty":
            self._skip_without("supports_control_plane")
        clocks = [ContractClock(), ContractClock()]
        subject, control = (new_transport(c) for c in clocks)
        leases = []
        for t, clock in zip((subject, control), clocks):
            t.publish("a", "a1")
            t.publish("g", "g1")
            t.publish("g", "g2")
            t.nack(t.claim("w", 10))  # a: attempt 1, ready again
            lease = t.claim("w", 10)  # g
            if case == "paused-empty":
                t.pause("p")
            clock.advance(10 if case == "leased-until-now" else 3)
            leases.append(lease)
        group = {"unknown": "nobody", "paused-empty": "p"}.get(case, "g")
        assert subject.retry(group) is False
        control.stats()  # the same reading and expiry as the retry's
        subject.ack(leases[0])
        control.ack(leases[1])
        if self.supports_control_plane:
            assert subject.groups() == control.groups()
        assert self.fingerprint(subject, clocks[0]) == self.fingerprint(control, clocks[1])

    @requires("supports_release", RELEASE)
    def test_retry_resets_the_attempt_of_a_ready_head(self, transport: Any, clock: ContractClock) -> None:
        """On a head that is simply ready, ``retry`` returns ``True`` and its
        next delivery is attempt 1."""
        transport.publish("g", "e")
        for _ in range(3):
            transport.nack(transport.claim("w", 30))
        assert transport.retry("g") is True
        if self.supports_quarantine:
            assert transport.peek("g")[0].attempt == 0
        assert _ids([transport.claim("w", 30)]) == [("g", 1, 1)]

    @requires("supports_release", RELEASE)
    @requires("supports_quarantine", QUARANTINE)
    def test_retry_lifts_a_bury_with_a_fresh_attempt_count(self, transport: Any, clock: ContractClock) -> None:
        """``retry`` of a buried group lifts the bury (reason gone,
        ``stats().buried`` - 1) and resets the attempt count: the head is
        claimable at once as attempt 1; the buried lease stays stale."""
        transport.publish("g", "g1")
        transport.publish("g", "g2")
        transport.publish("h", "h1")
        transport.nack(transport.claim("w", 30))  # g, attempt 1
        clock.advance(1)
        transport.ack(transport.claim("w", 30))  # h
        buried = transport.claim("w", 30)
        assert _ids([buried]) == [("g", 1, 2)]
        transport.bury(buried, "boom")
        assert transport.stats() == (2, 1, 0, 0, 0, 1, 0)
        assert transport.retry("g") is True
        assert transport.stats() == (2, 1, 0, 0, 0, 0, 0)
        if self.supports_control_plane:
            assert tuple(transport.group("g")) == ("g", 0, 2, "ready", False, 1, None, None, None, 1001.0, None, None)
        assert [(m.seq, m.attempt) for m in transport.peek("g", 5)] == [(1, 0), (2, 0)]
        again = transport.claim("w", 30)
        assert _ids([again]) == [("g", 1, 1)]
        with pytest.raises(LeaseLost):
            transport.ack(buried)
        transport.ack(again)

    @requires("supports_release", RELEASE)
    def test_retry_ends_a_park(self, transport: Any, clock: ContractClock) -> None:
        """``retry`` of a parked group ends the park: claimable at once, as
        attempt 1."""
        transport.publish("g", "e")
        transport.nack(transport.claim("w", 30))
        parked = transport.claim("w", 30)
        transport.nack(parked, 1000)
        assert transport.stats().parked == 1
        assert transport.retry("g") is True
        assert transport.stats() == (1, 1, 0, 0, 0, 0, 0)
        assert _ids([transport.claim("w", 30)]) == [("g", 1, 1)]
        with pytest.raises(LeaseLost):
            transport.ack(parked)

    @requires("supports_release", RELEASE)
    def test_retry_closes_an_expired_delivery(self, transport: Any, clock: ContractClock) -> None:
        """``retry`` of a head whose lease expired closes that delivery: the
        old lease raises ``LeaseLost`` at once (not only after a re-claim),
        and after the next delivery (attempt 1 again) too."""
        transport.publish("g", "e")
        transport.publish("g", "f")
        old = transport.claim("w", 10)
        clock.set(1010.0)
        assert transport.retry("g") is False  # expires_at == now: still live
        clock.set(1011.0)
        assert transport.retry("g") is True
        assert transport.stats().leased == 0
        with pytest.raises(LeaseLost):
            transport.extend(old, 10)
        with pytest.raises(LeaseLost):
            transport.ack(old)
        new = transport.claim("w", 10)
        assert (new.seq, new.attempt, new.worker_id) == (1, 1, "w")
        for op in (transport.ack, transport.nack, transport.release):
            with pytest.raises(LeaseLost):
                op(old)
        transport.ack(new)
        assert len(transport) == 1

    @requires("supports_release", RELEASE)
    @requires("supports_control_plane", CONTROL)
    def test_retry_keeps_a_pause(self, transport: Any, clock: ContractClock) -> None:
        """``retry`` of a paused group returns ``True``, resets the count and
        ends a park, but the group stays paused."""
        transport.publish("g", "e")
        transport.nack(transport.claim("w", 30), 1000)
        transport.pause("g")
        assert transport.retry("g") is True
        info = transport.group("g")
        assert (info.state, info.paused, info.worker_id, info.expires_at) == ("paused", True, None, None)
        assert transport.claim("w", 30, INT64_MIN) is None
        assert transport.resume("g") is True
        assert _ids([transport.claim("w", 30)]) == [("g", 1, 1)]

    @requires("supports_release", RELEASE)
    @requires("supports_later", LATER)
    def test_retry_keeps_a_schedule(self, transport: Any, clock: ContractClock) -> None:
        """``retry`` of a group whose head is scheduled returns ``True`` and
        leaves the schedule alone."""
        transport.publish("g", "e", delay=50)
        assert transport.retry("g") is True
        assert transport.claim("w", 30, INT64_MIN) is None
        assert transport.stats().scheduled == 1
        if self.supports_control_plane:
            assert transport.group("g").due_at == 1050.0
        clock.set(1051.0)
        assert _ids([transport.claim("w", 30)]) == [("g", 1, 1)]

    @requires("supports_release", RELEASE)
    def test_retry_keeps_the_round_robin_place(self, transport: Any, clock: ContractClock) -> None:
        """``retry`` keeps the group's round-robin key and ``last_claimed_at``:
        it neither goes to the back nor becomes "never claimed"."""
        for g in "abc":
            transport.publish(g, g + "1")
        leases = [transport.claim("w", 30) for _ in range(3)]
        assert [x.group_id for x in leases] == ["a", "b", "c"]
        clock.advance(5)
        for lease in leases:
            transport.nack(lease, 100)
        transport.publish("d", "d1")  # never claimed: before every claimed group
        assert transport.retry("b") is True
        assert transport.retry("a") is True
        if self.supports_control_plane:
            assert transport.group("b").last_claimed_at == 1000.0
        clock.advance(101)
        assert [g for g, _, _ in self._drain(transport)] == ["d", "a", "b", "c"]

    @requires("supports_release", RELEASE)
    @requires("supports_waiting", WAITING)
    @pytest.mark.parametrize("held", ["parked", "buried"])
    def test_retry_wakes_a_waiting_claim(self, transport: Any, clock: ContractClock, held: str) -> None:
        """A head that ``retry`` makes claimable goes to a waiting claim."""
        if held == "buried":
            self._skip_without("supports_quarantine")
        transport.publish("g", "e")
        lease = transport.claim("w", 30)
        if held == "parked":
            transport.nack(lease, 1000)
        else:
            transport.bury(lease, "boom")
        waiter = self.start_waiting(clock, lambda: transport.claim("waiter", 30, timeout=self.far()))
        assert transport.retry("g") is True
        got = waiter.outcome(self.liveness_timeout)
        assert got is not None, "the waiting claim returned None instead of the retried head"
        assert (got.group_id, got.seq, got.attempt, got.worker_id) == ("g", 1, 1, "waiter")
