"""Deliberately broken transports: the pure twin with one known bug each.

``test_kit_catches.py`` runs the conformance kit against each of them and
checks that the kit reports the bug.  Each class changes as little as it
can; some reach into the twin's internals (``_groups``, ``_lock``,
``_expire``, ``group.key``, ``group.messages``), so a change there may need
a change here: ``test_kit_catches.py`` then fails with an error of the
broken transport itself, not with the rule it was meant to break.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any, Callable, Dict, Optional

from leasequeue import LeaseLost
from leasequeue._backends.inmemory.transport_py import _FREE, _SCHEDULED
from leasequeue._backends.inmemory.transport_py import InMemoryTransport as Pure
from leasequeue._validation import INT64_MAX, INT64_MIN, check_priority, check_time


class AckWithoutFencing(Pure):
    """The seed's ``ack``: removes the message by seq whatever happened
    since.  A worker whose lease expired, and whose message went to another
    worker, deletes that worker's message; a stale ack never raises."""

    def __init__(self, clock: Callable[[], float] = time.time, **options: Any) -> None:
        super().__init__(clock, **options)
        self._latest: Dict[int, Any] = {}  # seq -> the latest lease issued for it

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        lease = super().claim(*args, **kwargs)
        if lease is not None:
            self._latest[lease.seq] = lease
        return lease

    def extend(self, lease: Any, visibility: float) -> Any:
        new = super().extend(lease, visibility)
        self._latest[new.seq] = new
        return new

    def ack(self, lease: Any) -> None:
        try:
            super().ack(lease)
        except LeaseLost:
            latest = self._latest.get(lease.seq)
            if latest is not None and latest is not lease:
                try:
                    super().ack(latest)  # the message, whoever holds it now
                except LeaseLost:
                    pass


class TimestampRoundRobin(Pure):
    """The seed's round-robin key: the time of a group's last claim (ties
    to the lower seq) instead of the order of claims.  Under a frozen clock
    every claimed group ties, so the group with the lowest seqs is served
    again and again while others wait."""

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        lease = super().claim(*args, **kwargs)
        if lease is not None:
            with self._lock:
                group = self._groups.get(lease.group_id)
                if group is not None:  # leased, so not in a ready heap: its key may change
                    group.key = round(group.last_claimed_at * 1000) * 2**40 + lease.seq
                    # the key is also the delivery's number (fencing by delivery): the lease names it
                    object.__setattr__(lease, "_delivery", group.key)
        return lease


class LifoWithinGroup(Pure):
    """A group's newest message is delivered first (the head being
    delivered, or waiting for its retry, stays where it is)."""

    def publish(self, group_id: str, event: Any, priority: int = 0) -> int:
        seq = super().publish(group_id, event, priority)
        with self._lock:
            group = self._groups.get(str(group_id))
            if group is not None:
                messages = group.messages
                first_free = group.head + (1 if group.attempt else 0)
                if len(messages) - first_free > 1:
                    messages.insert(first_free, messages.pop())
        return seq


class RecreatedGroupKeepsItsPlace(Pure):
    """An emptied group is forgotten, but a later publish that re-creates it
    gives it back its old round-robin place (issue 14: the test of this rule
    could not tell the two apart)."""

    def __init__(self, clock: Callable[[], float] = time.time, **options: Any) -> None:
        super().__init__(clock, **options)
        self._old_keys: Dict[str, int] = {}

    def ack(self, lease: Any) -> None:
        with self._lock:
            group = self._groups.get(getattr(lease, "group_id", None))
            key = None if group is None else group.key
            super().ack(lease)
            if key is not None and lease.group_id not in self._groups:
                self._old_keys[lease.group_id] = key

    def publish(self, group_id: str, event: Any, priority: int = 0) -> int:
        with self._lock:
            fresh = group_id not in self._groups
            seq = super().publish(group_id, event, priority)
            old = self._old_keys.pop(group_id, None) if fresh else None
            if old is not None:
                group = self._groups[group_id]
                self._unready(group)
                group.key = old
                self._make_ready(group)
        return seq


class FloorOffByOne(Pure):
    """``claim(min_priority=p)`` also serves groups of priority ``p - 1``."""

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0, **kwargs: Any) -> Any:
        if type(min_priority) is int and INT64_MIN < min_priority <= INT64_MAX:
            min_priority -= 1  # anything else: the transport reports it
        return super().claim(worker_id, visibility, min_priority, **kwargs)


class ExpiryAtOrBefore(Pure):
    """A lease or park expires when ``expires_at <= now`` instead of ``<``:
    whenever an operation reads the clock, locks due exactly now are freed."""

    def __init__(self, clock: Callable[[], float] = time.time, **options: Any) -> None:
        super().__init__(clock, **options)
        read = self._clock

        def clock_then_expire() -> Any:
            reading = read()
            try:
                now = check_time(reading)
            except (TypeError, ValueError):
                return reading  # the transport reports it
            with self._lock:
                if not self._busy:
                    now = max(now, self._time)
                    self._expire(math.nextafter(now, math.inf))  # frees expires_at < next float: <= now
            return reading

        self._clock = clock_then_expire


def _check_timeout(timeout: Any) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError("timeout must be an int or float")
    if not timeout >= 0:
        raise ValueError("timeout must be >= 0")
    return float(timeout)


class LostWakeUp(Pure):
    """A waiting claim that nothing wakes: it looks for work once, then
    sleeps to its deadline and returns None, whatever arrives meanwhile.
    Only ``close()`` ends the sleep.  Needs the pure twin's waiting (Part 2)
    underneath, for everything but the wake-up."""

    def __init__(self, clock: Callable[[], float] = time.time, **options: Any) -> None:
        super().__init__(clock, **options)
        self._closing = threading.Event()

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, *, timeout: Optional[float] = 0.0
    ) -> Any:
        lease = super().claim(worker_id, visibility, min_priority, timeout=0)
        if lease is not None or timeout == 0:
            return lease
        self._closing.wait(_check_timeout(timeout))
        return None

    async def aclaim(
        self, worker_id: str, visibility: float, min_priority: int = 0, *, timeout: Optional[float] = None
    ) -> Any:
        lease = super().claim(worker_id, visibility, min_priority, timeout=0)
        if lease is not None or timeout == 0:
            return lease
        limit = _check_timeout(timeout)
        deadline = math.inf if limit is None else time.monotonic() + limit
        while not self._closing.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return None

    def close(self) -> None:
        self._closing.set()
        super().close()


#: The broken transports whose bug is in Part 1, and the contract tests that
#: must fail on each (at least these; others may fail too).
PART1_BUGS = {
    "AckWithoutFencing": [
        "test_stale_ack_does_not_delete_the_new_holders_message",
        "test_fencing_stale_lease_raises_lease_lost_and_changes_nothing[ack-expired-and-reclaimed]",
    ],
    "TimestampRoundRobin": ["test_round_robin_order[group-by-group-frozen-clock]"],
    "LifoWithinGroup": ["test_fifo_within_group"],
    "RecreatedGroupKeepsItsPlace": ["test_ack_forgets_round_robin_position"],
    "FloorOffByOne": ["test_priority_floor"],
    "ExpiryAtOrBefore": ["test_expiry_recovery_after_crash", "test_park_blocks_group"],
}


class BuryLetsTheNextMessageThrough(Pure):
    """``bury`` as SQS FIFO dead-letters: the poison message is set aside
    (acked, kept on a list) and its group goes on with its next message,
    which breaks the group's order.  The contract says the group waits."""

    def __init__(self, clock: Callable[[], float] = time.time, **options: Any) -> None:
        super().__init__(clock, **options)
        self.dead_letters: list = []

    def bury(self, lease: Any, reason: str = "") -> None:
        if not isinstance(reason, str):
            raise TypeError("reason must be a str")
        self.ack(lease)  # type-checks and fences the lease like the real one
        self.dead_letters.append((lease, reason))


class SkipRemovesALeasedHead(Pure):
    """``skip`` that removes the head even while a live lease holds it (by
    acking the latest lease it issued for that group): the worker still
    running it has lost its message.  The contract says ``False``."""

    def __init__(self, clock: Callable[[], float] = time.time, **options: Any) -> None:
        super().__init__(clock, **options)
        self._latest: Dict[str, Any] = {}  # group -> the latest lease issued in it

    def _note(self, lease: Any) -> Any:
        if lease is not None:
            self._latest[lease.group_id] = lease
        return lease

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        return self._note(super().claim(*args, **kwargs))

    def extend(self, lease: Any, visibility: float) -> Any:
        return self._note(super().extend(lease, visibility))

    def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        leases = super().claim_many(*args, **kwargs)
        for lease in leases:
            self._note(lease)
        return leases

    def skip(self, group_id: str) -> bool:
        if super().skip(group_id):
            return True
        latest = self._latest.get(group_id) if isinstance(group_id, str) else None
        if latest is None:
            return False
        try:
            self.ack(latest)  # the leased head, whoever is still working on it
        except LeaseLost:
            return False
        return True


#: The broken transports whose bug is in Part 4's quarantine, and the
#: contract tests that must fail on each.
QUARANTINE_BUGS = {
    "BuryLetsTheNextMessageThrough": ["test_bury_holds_the_group_and_every_other_group_goes_on"],
    "SkipRemovesALeasedHead": [
        "test_skip_refuses_a_head_under_a_live_lease[live]",
        "test_skip_refuses_a_head_under_a_live_lease[at-expires_at]",
    ],
}


# -- ack_and_claim -------------------------------------------------------------------------
# Each of these breaks one rule of ack_and_claim the way a plausible
# implementation would; the real ack and claim do the rest.


class AckAndClaimClaimsFirst(Pure):
    """The claim first, then the ack: the group just acked is still
    blocked by the message being acked, so its next message is never the
    one served, even when it is the only one eligible."""

    def ack_and_claim(self, lease: Any, worker_id: str, visibility: float, min_priority: int = 0) -> Any:
        claimed = self.claim(worker_id, visibility, min_priority)
        self.ack(lease)
        return claimed


class AckAndClaimClaimsWhenTheLeaseIsLost(Pure):
    """A stale lease raises ``LeaseLost``, but only after the claim half
    ran: the call that raised changed the transport (a message leased that
    nobody will ever hear of until it expires)."""

    def ack_and_claim(self, lease: Any, worker_id: str, visibility: float, min_priority: int = 0) -> Any:
        try:
            return super().ack_and_claim(lease, worker_id, visibility, min_priority)
        except LeaseLost:
            self.claim(worker_id, visibility, min_priority)
            raise


class NaiveAckAndClaim(Pure):
    """``ack`` then ``claim``, two calls: the ack is done before the claim's
    arguments and the clock are checked (a bad argument or a failing clock
    leaves it acked), and the ack hands the group's next message to a
    waiting claim before the caller's own claim can take it."""

    def ack_and_claim(self, lease: Any, worker_id: str, visibility: float, min_priority: int = 0) -> Any:
        self.ack(lease)
        return self.claim(worker_id, visibility, min_priority)


class AckAndClaimAcksOnlyWhenItClaims(Pure):
    """Keeps the lease when there is no next job ("ack when the next claim
    succeeds"): with nothing eligible the message is never acked."""

    def ack_and_claim(self, lease: Any, worker_id: str, visibility: float, min_priority: int = 0) -> Any:
        claimed = self.claim(worker_id, visibility, min_priority)
        if claimed is not None:
            self.ack(lease)
        return claimed


class AckAndClaimStaysWithTheGroup(Pure):
    """A "sticky" optimisation: after the ack the worker stays on the same
    group (workflow) while it has a next message, ahead of every group that
    was waiting longer.  That breaks the round-robin."""

    def ack_and_claim(self, lease: Any, worker_id: str, visibility: float, min_priority: int = 0) -> Any:
        self.ack(lease)
        with self._lock:
            group = self._groups.get(lease.group_id)
            if group is not None and group.ready_key is not None:
                self._rekey_ready(group, INT64_MIN)  # first in its level's heap
        return self.claim(worker_id, visibility, min_priority)


class AckAndClaimIgnoresTheFloor(Pure):
    """A wrapper that does not pass ``min_priority`` on: the claim half
    serves every group from priority 0 up, whatever floor was asked for."""

    def ack_and_claim(self, lease: Any, worker_id: str, visibility: float, min_priority: int = 0) -> Any:
        if type(min_priority) is not int:
            min_priority = check_priority(min_priority, "min_priority")  # bad input is still refused
        return super().ack_and_claim(lease, worker_id, visibility)


class AckAndClaimSkipsExpiry(Pure):
    """The claim half does not apply expiry first: a lease that ran out
    still blocks its group (until some other operation expires it)."""

    def ack_and_claim(self, lease: Any, worker_id: str, visibility: float, min_priority: int = 0) -> Any:
        self._expire = lambda now: None  # type: ignore[method-assign]  # shadows the method for this call
        try:
            return super().ack_and_claim(lease, worker_id, visibility, min_priority)
        finally:
            del self._expire


class AckAndClaimKeepsTheAckedEvent(Pure):
    """Keeps every acked event in a debugging log: the transport holds the
    last reference, so an event's finaliser never runs."""

    def __init__(self, clock: Callable[[], float] = time.time, **options: Any) -> None:
        super().__init__(clock, **options)
        self.acked_events: list = []

    def ack_and_claim(self, lease: Any, worker_id: str, visibility: float, min_priority: int = 0) -> Any:
        claimed = super().ack_and_claim(lease, worker_id, visibility, min_priority)
        self.acked_events.append(lease.event)
        return claimed


#: The broken transports whose bug is in ack_and_claim, and the contract
#: tests that must fail on each.
ACK_AND_CLAIM_BUGS = {
    "AckAndClaimClaimsFirst": [
        "test_ack_and_claim_is_ack_then_claim[the-acked-groups-next-message]",
        "test_ack_and_claim_serves_the_acked_group_again_when_it_is_the_only_eligible",
    ],
    "AckAndClaimClaimsWhenTheLeaseIsLost": [
        "test_ack_and_claim_of_a_stale_lease_changes_nothing[expired-and-reclaimed]",
        "test_ack_and_claim_of_a_forged_or_foreign_lease_changes_nothing[forged]",
    ],
    "NaiveAckAndClaim": [
        "test_ack_and_claim_bad_input_changes_nothing[worker_id-int]",
        "test_ack_and_claim_bad_input_changes_nothing[visibility-nan]",
        "test_ack_and_claim_reads_the_clock_before_the_lease_is_looked_at[current-raises]",
        "test_a_waiting_claim_gets_what_ack_and_claim_leaves",
    ],
    "AckAndClaimAcksOnlyWhenItClaims": [
        "test_ack_and_claim_returns_none_when_nothing_is_eligible_and_the_ack_stands",
    ],
    "AckAndClaimStaysWithTheGroup": ["test_ack_and_claim_keeps_the_round_robin"],
    "AckAndClaimIgnoresTheFloor": ["test_ack_and_claim_keeps_the_priority_floor"],
    "AckAndClaimSkipsExpiry": ["test_ack_and_claim_applies_expiry_at_its_now"],
    "AckAndClaimKeepsTheAckedEvent": [
        "test_event_finaliser_publishing_to_the_same_transport_on_ack_and_claim[False]",
        "test_event_finaliser_publishing_to_the_same_transport_on_ack_and_claim[True]",
    ],
}


# -- Part 5: later, once, honest attempts ----------------------------------------------------
# Each breaks one rule of SPEC Part 5 the way a plausible implementation would.


class DuplicateKeyUsesUpASeq(Pure):
    """A publish whose key is held returns the holder's seq, but takes the
    next seq from the counter first (as an ``INSERT ... ON CONFLICT DO
    NOTHING`` burns a sequence value): the next message's seq skips one."""

    def publish(self, group_id: str, event: Any, priority: int = 0, **kwargs: Any) -> Any:
        held = len(self)
        seq = super().publish(group_id, event, priority, **kwargs)
        if kwargs.get("key") is not None and len(self) == held:  # the key was held: nothing published
            super().publish("__burnt__", None)  # the seq taken anyway ...
            self.purge("__burnt__")  # ... and nothing else left of it
        return seq


class ReleaseFencesByAttemptOnly(Pure):
    """Fencing by ``(seq, attempt)`` instead of by delivery: after a
    ``release`` the next delivery carries the same attempt, so the released
    lease names it again (ABA) and may ack, nack or extend another
    worker's delivery."""

    def __init__(self, clock: Callable[[], float] = time.time, **options: Any) -> None:
        super().__init__(clock, **options)
        self._latest: Dict[int, Any] = {}  # seq -> the latest lease issued for it

    def _note(self, lease: Any) -> Any:
        if lease is not None:
            self._latest[lease.seq] = lease
        return lease

    def _same_attempt(self, lease: Any) -> Any:
        latest = self._latest.get(getattr(lease, "seq", None))
        if latest is not None and latest is not lease and latest.attempt == getattr(lease, "attempt", None):
            return latest
        return None

    def _fenced(self, call: Callable[[Any], Any], lease: Any) -> Any:
        try:
            return call(lease)
        except LeaseLost:
            latest = self._same_attempt(lease)
            if latest is None:
                raise
            return call(latest)  # the same (seq, attempt): taken for the same delivery

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        return self._note(super().claim(*args, **kwargs))

    async def aclaim(self, *args: Any, **kwargs: Any) -> Any:
        return self._note(await super().aclaim(*args, **kwargs))

    def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        leases = super().claim_many(*args, **kwargs)
        for lease in leases:
            self._note(lease)
        return leases

    def ack(self, lease: Any) -> None:
        self._fenced(super().ack, lease)

    def nack(self, lease: Any, delay: float = 0.0) -> None:
        self._fenced(lambda x: super(ReleaseFencesByAttemptOnly, self).nack(x, delay), lease)

    def release(self, lease: Any, delay: float = 0.0) -> None:
        self._fenced(lambda x: super(ReleaseFencesByAttemptOnly, self).release(x, delay), lease)

    def extend(self, lease: Any, visibility: float) -> Any:
        return self._note(self._fenced(lambda x: super(ReleaseFencesByAttemptOnly, self).extend(x, visibility), lease))

    def bury(self, lease: Any, reason: str = "") -> None:
        self._fenced(lambda x: super(ReleaseFencesByAttemptOnly, self).bury(x, reason), lease)

    def ack_and_claim(self, lease: Any, *args: Any, **kwargs: Any) -> Any:
        return self._note(
            self._fenced(lambda x: super(ReleaseFencesByAttemptOnly, self).ack_and_claim(x, *args, **kwargs), lease)
        )

    def ack_many(self, leases: Any) -> Any:
        rest = []
        for lease in super().ack_many(leases):
            latest = self._same_attempt(lease)
            if latest is None or super().ack_many([latest]):
                rest.append(lease)
        return rest


class RetryForgetsThePause(Pure):
    """``retry`` as "make it claimable now": it lifts a pause as well (by
    resuming the group), so an operator's pause is lost."""

    def retry(self, group_id: str) -> bool:
        retried = super().retry(group_id)
        if retried:
            self.resume(group_id)
        return retried



class DelayBlocksTheEarlierMessages(Pure):
    """A delay that holds the whole group, not just the delayed message: a
    publish with ``delay`` into a group whose head is ready schedules the
    group until the new message's due, so messages published before it
    wait too (a "group not before" column instead of a per-message due)."""

    def publish(self, group_id: str, event: Any, priority: int = 0, **kwargs: Any) -> Any:
        seq = super().publish(group_id, event, priority, **kwargs)
        delay = kwargs.get("delay", 0.0)
        if type(delay) in (int, float) and delay > 0:
            with self._lock:
                group = self._groups.get(str(group_id))
                if group is not None and group.lock == _FREE and group.reason is None:
                    last = group.messages[-1]
                    if len(group.messages) - group.head > 1 and last[0] == seq:
                        self._schedule(group, last[2])  # the head waits for the newest message's due
        return seq


class ScheduledHeadDueAtItsDueTime(Pure):
    """A scheduled head becomes claimable at ``now == due`` (``due <= now``)
    instead of from the first ``now > due``: whenever an operation reads
    the clock, a scheduled head due exactly then is freed."""

    def __init__(self, clock: Callable[[], float] = time.time, **options: Any) -> None:
        super().__init__(clock, **options)
        read = self._clock

        def clock_then_free() -> Any:
            reading = read()
            try:
                now = check_time(reading)
            except (TypeError, ValueError):
                return reading  # the transport reports it
            with self._lock:
                if not self._busy:
                    now = max(now, self._time)
                    for due, tick, group in list(self._expiry):
                        if due == now and group.tick == tick and group.lock == _SCHEDULED:
                            if not group.paused:
                                self._make_ready(group)
                            self._unlock(group)
            return reading

        self._clock = clock_then_free



class ReleaseCountsTheDelivery(Pure):
    """``release`` as a plain ``nack``: the handed-back delivery counts, so
    a rolling restart spends the message's retry budget."""

    def release(self, lease: Any, delay: float = 0.0) -> None:
        self.nack(lease, delay)



class RetryGoesToTheBack(Pure):
    """``retry`` as a fresh claim of the group's place: the retried group
    goes to the back of the round-robin (as if just served), instead of
    keeping its key and ``last_claimed_at``."""

    def retry(self, group_id: str) -> bool:
        retried = super().retry(group_id)
        if retried:
            with self._lock:
                group = self._groups.get(str(group_id))
                if group is not None and group.ready_key is not None:
                    self._claims += 1  # a claim number, as if it had just been served
                    self._rekey_ready(group, self._claims)
        return retried


#: The broken transports whose bug is in SPEC Part 5, and the contract tests
#: that must fail on each.
PART5_BUGS = {
    "DuplicateKeyUsesUpASeq": [
        "test_once_a_held_key_returns_the_holders_seq_and_changes_nothing",
        "test_once_a_key_belongs_to_its_group",
    ],
    "ReleaseFencesByAttemptOnly": [
        "test_release_no_aba_a_released_delivery_is_never_current_again[ack-same-worker]",
        "test_release_no_aba_a_released_delivery_is_never_current_again[nack-other-worker]",
        "test_release_no_aba_a_released_delivery_is_never_current_again[extend-same-worker]",
        "test_release_no_aba_whoever_redelivers[claim]",
    ],
    "RetryForgetsThePause": ["test_retry_keeps_a_pause"],
    "DelayBlocksTheEarlierMessages": ["test_later_earlier_messages_of_the_group_are_not_delayed"],
    "ScheduledHeadDueAtItsDueTime": ["test_later_scheduled_until_strictly_past_due"],
    "RetryGoesToTheBack": ["test_retry_keeps_the_round_robin_place"],
    "ReleaseCountsTheDelivery": [
        "test_release_is_nack_whose_delivery_does_not_count[0]",
        "test_release_is_nack_whose_delivery_does_not_count[5]",
        "test_release_hands_the_same_attempt_again_each_time",
    ],
}
