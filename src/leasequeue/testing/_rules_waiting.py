"""Part 2 of the contract, "Waiting for work": ``claim(timeout=)``, ``aclaim``,
``close()`` and ``closed``.

These tests use real threads and real event loops.  They never time how
fast something happens; they only bound how long they wait for something
that must happen (``liveness_timeout``) and give a claim that has started
``settle_seconds`` to fall asleep.  A claim reads the injected clock before
it waits, so the tests know a waiter has looked for work by watching the
clock's reads; the same counts show which waiters a message woke up.
"""

from __future__ import annotations

import asyncio
import functools
import math
import signal
import threading
import time
from decimal import Decimal
from typing import Any, Awaitable, Callable, List, Optional, Tuple

import pytest

from .._errors import LeaseQueueError
from ._contract_base import ContractBase, ContractClock, MakeTransport, Waiter, requires
from ._rules_bad_input import ClockTouched, assert_changes_nothing

__all__ = ["WaitingRules"]

WAITING = "waiting claims (claim(timeout=...), aclaim, close() waking waiters)"
NAN = float("nan")


# -- how a message becomes claimable while a claim waits for it ---------------
# Each case: ``setup(t, clock)`` leaves nothing claimable and returns what
# ``trigger(t, clock, held)`` needs to make exactly one message claimable; the
# waiting claim must then get (group, seq, attempt).


def _setup_nothing(t: Any, clock: ContractClock) -> Any:
    return None


def _setup_two_messages_head_leased(t: Any, clock: ContractClock) -> Any:
    t.publish("g", "first")
    t.publish("g", "second")
    return t.claim("holder", 30)


def _lease_one(t: Any, visibility: float) -> Any:
    t.publish("g", "only")
    return t.claim("holder", visibility)


def _setup_leased(t: Any, clock: ContractClock) -> Any:
    return _lease_one(t, 30)


def _setup_short_lease(t: Any, clock: ContractClock) -> Any:
    return _lease_one(t, 0.5)


def _setup_short_park(t: Any, clock: ContractClock) -> Any:
    t.nack(_lease_one(t, 30), 0.5)


def _setup_long_lease(t: Any, clock: ContractClock) -> Any:
    return _lease_one(t, 1000)


def _setup_long_park(t: Any, clock: ContractClock) -> Any:
    t.nack(_lease_one(t, 30), 1000)


def _trigger_publish(t: Any, clock: ContractClock, held: Any) -> None:
    t.publish("g", "new")


def _trigger_ack(t: Any, clock: ContractClock, held: Any) -> None:
    t.ack(held)


def _trigger_nack0(t: Any, clock: ContractClock, held: Any) -> None:
    t.nack(held)


def _trigger_time_passes(t: Any, clock: ContractClock, held: Any) -> None:
    clock.advance(1)  # nothing else: the waiting claim notices by itself


def _trigger_stats_after_expiry(t: Any, clock: ContractClock, held: Any) -> None:
    clock.advance(2000)  # the waiter's own timer is ~1000 s of real time away
    t.stats()  # applies the expiry: it must wake the waiter


def _trigger_claim_after_expiry(t: Any, clock: ContractClock, held: Any) -> None:
    clock.advance(2000)
    assert t.claim("someone", 30, 10**9) is None  # applies the expiry, serves nobody


WAKE_CASES = [
    pytest.param(_setup_nothing, _trigger_publish, ("g", 1, 1), id="publish"),
    pytest.param(_setup_two_messages_head_leased, _trigger_ack, ("g", 2, 1), id="ack-exposes-next"),
    pytest.param(_setup_leased, _trigger_nack0, ("g", 1, 2), id="nack0"),
    pytest.param(_setup_short_lease, _trigger_time_passes, ("g", 1, 2), id="lease-expiry-noticed-by-itself"),
    pytest.param(_setup_short_park, _trigger_time_passes, ("g", 1, 2), id="park-expiry-noticed-by-itself"),
    pytest.param(_setup_long_lease, _trigger_stats_after_expiry, ("g", 1, 2), id="lease-expiry-applied-by-stats"),
    pytest.param(_setup_long_park, _trigger_stats_after_expiry, ("g", 1, 2), id="park-expiry-applied-by-stats"),
    pytest.param(_setup_long_lease, _trigger_claim_after_expiry, ("g", 1, 2), id="lease-expiry-applied-by-claim"),
]

BAD_TIMEOUTS = [
    pytest.param(-1, ValueError, id="-1"),
    pytest.param(-1e-9, ValueError, id="-tiny"),
    pytest.param(NAN, ValueError, id="nan"),
    pytest.param(-math.inf, ValueError, id="-inf"),
    pytest.param("1", TypeError, id="str"),
    pytest.param(True, TypeError, id="true"),
    pytest.param(False, TypeError, id="false"),
    pytest.param(Decimal(1), TypeError, id="decimal"),
    pytest.param(1j, TypeError, id="complex"),
]


class WaitingRules(ContractBase):
    """The waiting rules (see the module docstring)."""

    def waiter(
        self, transport: Any, clock: ContractClock, worker: str, min_priority: int = 0, kind: str = "thread"
    ) -> Waiter:
        """Start a claim (``kind`` "thread": ``claim(timeout=)``, "asyncio":
        ``aclaim`` on its own loop) that waits for work, once it is waiting."""
        if kind == "thread":
            return self.start_waiting(
                clock, lambda: transport.claim(worker, 30, min_priority, timeout=self.far()), name=worker
            )
        return self.start_waiting(
            clock,
            lambda: asyncio.run(_await(transport.aclaim(worker, 30, min_priority, timeout=self.far()))),
            name=worker,
        )

    async def until_read(self, clock: ContractClock, reads: int) -> None:
        """In a coroutine: wait until the clock has been read more than
        ``reads`` times (a task has looked for work), then settle."""
        deadline = time.monotonic() + self.liveness_timeout
        while clock.reads <= reads:
            assert time.monotonic() < deadline, "the aclaim never read the clock"
            await asyncio.sleep(0.005)
        await asyncio.sleep(self.settle_seconds)

    # -- timeout ------------------------------------------------------------------

    @requires("supports_waiting", WAITING)
    def test_timeout_zero_never_waits(self, transport: Any) -> None:
        """``timeout=0`` (the default) is exactly Part 1's claim."""
        assert self.run_with_deadline(lambda: transport.claim("w", 30)) is None
        assert self.run_with_deadline(lambda: transport.claim("w", 30, timeout=0)) is None
        assert self.run_with_deadline(lambda: transport.claim("w", 30, 0, timeout=0.0)) is None
        transport.publish("g", "e")
        lease = transport.claim("w", 30, timeout=0)
        assert (lease.group_id, lease.seq, lease.attempt, lease.expires_at) == ("g", 1, 1, 1030.0)
        assert self.run_with_deadline(lambda: transport.claim("w", 30, timeout=0)) is None  # g is in flight

    @requires("supports_waiting", WAITING)
    @pytest.mark.parametrize("timeout", [0.5, 1], ids=["float", "int"])
    def test_timeout_returns_none_at_the_deadline(self, transport: Any, clock: ContractClock, timeout: float) -> None:
        """With nothing claimable, a claim waits ``timeout`` seconds of real
        time (the injected clock stands still meanwhile) and returns None."""
        transport.publish("g", "e", priority=-1)  # below the floor: never claimable here
        start = time.monotonic()
        assert self.run_with_deadline(lambda: transport.claim("w", 30, timeout=timeout)) is None
        waited = time.monotonic() - start
        assert waited >= timeout * 0.95, f"returned after {waited:.3f} s, before its {timeout} s deadline"
        assert transport.stats() == (1, 1, 0, 0, 0, 0, 0)

    @requires("supports_waiting", WAITING)
    @pytest.mark.parametrize("timeout", ["finite", None], ids=["finite", "none"])
    def test_waiting_claim_gets_a_message_published_meanwhile(
        self, transport: Any, clock: ContractClock, timeout: Optional[str]
    ) -> None:
        """A waiting claim (``timeout > 0`` or ``None``: no deadline) claims
        the message that arrives, as a claim at that time would."""
        limit = self.far() if timeout == "finite" else None
        waiter = self.start_waiting(clock, lambda: transport.claim("w1", 30, timeout=limit))
        clock.advance(7)
        transport.publish("g", "e")
        lease = waiter.outcome(self.liveness_timeout)
        assert lease is not None, "the waiting claim returned None instead of the message"
        assert (lease.group_id, lease.seq, lease.attempt, lease.worker_id) == ("g", 1, 1, "w1")
        assert lease.expires_at == 1037.0
        assert transport.stats() == (1, 1, 1, 0, 0, 0, 0)

    @requires("supports_waiting", WAITING)
    @pytest.mark.parametrize("bad, error", BAD_TIMEOUTS)
    def test_bad_timeout(self, new_transport: MakeTransport, bad: Any, error: type) -> None:
        """``timeout`` negative or NaN: ValueError; not an int/float (or a
        bool): TypeError; checked with the other arguments, before the clock
        is read and before anything changes, by ``claim`` and ``aclaim``."""
        for call in (
            lambda t, l: t.claim("w", 10, timeout=bad),
            lambda t, l: asyncio.run(_await(t.aclaim("w", 10, timeout=bad))),
        ):
            assert_changes_nothing(
                new_transport, call, error, clock_during_call=ClockTouched(), identity=self.preserves_identity
            )

    @requires("supports_waiting", WAITING)
    @pytest.mark.parametrize(
        "call, error",
        [
            pytest.param(lambda t, l: t.claim(5, 10, timeout=-1), TypeError, id="worker-first"),
            pytest.param(lambda t, l: t.claim("w", -1, timeout="x"), ValueError, id="visibility-before-timeout"),
            pytest.param(lambda t, l: t.claim("w", 10, "x", timeout=-1), TypeError, id="floor-before-timeout"),
        ],
    )
    def test_timeout_checked_after_the_other_arguments(
        self, new_transport: MakeTransport, call: Callable[..., Any], error: type
    ) -> None:
        assert_changes_nothing(
            new_transport, call, error, clock_during_call=ClockTouched(), identity=self.preserves_identity
        )

    # -- what wakes a waiting claim --------------------------------------------------

    @requires("supports_waiting", WAITING)
    @pytest.mark.parametrize("kind", ["thread", "asyncio"])
    @pytest.mark.parametrize("setup, trigger, expected", WAKE_CASES)
    def test_waiting_claim_is_woken(
        self,
        transport: Any,
        clock: ContractClock,
        setup: Callable[[Any, ContractClock], Any],
        trigger: Callable[[Any, ContractClock, Any], None],
        expected: Tuple[str, int, int],
        kind: str,
    ) -> None:
        """A message becomes claimable when it is published, when an ack
        exposes a group's next message, on nack(0), and when a lease or park
        expires: noticed by the waiting claim itself when the expiry is due by
        the clock, or applied by any other operation that reads the clock
        (stats(), a claim) in another thread.  The waiting claim gets it."""
        held = setup(transport, clock)
        assert transport.claim("probe", 30, timeout=0) is None  # nothing claimable yet
        waiter = self.waiter(transport, clock, "waiter", kind=kind)
        trigger(transport, clock, held)
        lease = waiter.outcome(self.liveness_timeout)
        assert lease is not None, "the waiting claim returned None instead of the message"
        assert (lease.group_id, lease.seq, lease.attempt, lease.worker_id) == expected + ("waiter",)
        assert transport.stats().leased == 1

    @requires("supports_waiting", WAITING)
    @pytest.mark.parametrize("kind", ["thread", "asyncio"])
    def test_floor_of_a_waiting_claim(self, transport: Any, clock: ContractClock, kind: str) -> None:
        """A waiting claim with ``min_priority=5`` is not woken by a
        priority-0 message; a floor-0 claim that waits behind it gets that
        message (no lost wake-up), and the priority-5 message goes to the
        floor-5 claim."""
        high = self.waiter(transport, clock, "high", min_priority=5, kind=kind)
        high_reads = clock.reads_by(high.ident)
        transport.publish("p0", "e", priority=0)
        time.sleep(self.settle_seconds)
        assert not high.done, f"the floor-5 claim returned {high.result!r} for a priority-0 message"
        assert clock.reads_by(high.ident) == high_reads, "the floor-5 claim was woken by a priority-0 message"
        low = self.waiter(transport, clock, "low", min_priority=0, kind=kind)
        lease = low.outcome(self.liveness_timeout)  # p0 was claimable all along
        assert lease is not None and (lease.group_id, lease.worker_id) == ("p0", "low")
        low2 = self.waiter(transport, clock, "low2", min_priority=0, kind=kind)
        transport.publish("q0", "e", priority=0)  # the floor-5 claim waited longer, but cannot take it
        lease = low2.outcome(self.liveness_timeout)
        assert lease is not None and (lease.group_id, lease.worker_id) == ("q0", "low2")
        assert not high.done
        transport.publish("p5", "e", priority=5)
        lease = high.outcome(self.liveness_timeout)
        assert lease is not None and (lease.group_id, lease.worker_id) == ("p5", "high")

    @requires("supports_waiting", WAITING)
    def test_longest_waiting_claim_is_served_first(self, transport: Any, clock: ContractClock) -> None:
        """Fair: 8 claims wait, then 8 messages arrive one at a time (to new
        groups); they go to the claims in the order the claims began to wait."""
        waiters = [self.waiter(transport, clock, f"w{i}") for i in range(8)]
        for i in range(8):
            transport.publish(f"g{i}", i)
            lease = waiters[i].outcome(self.liveness_timeout)
            assert lease is not None and (lease.worker_id, lease.group_id) == (f"w{i}", f"g{i}"), (
                f"message {i} went to {lease!r}; the longest waiting claim was w{i}"
            )
            time.sleep(self.settle_seconds)
            served = [w.name for w in waiters[i + 1:] if w.done]
            assert not served, f"claims {served} returned although no message was left for them"

    @requires("supports_waiting", WAITING)
    def test_one_message_wakes_one_waiting_claim(self, transport: Any, clock: ContractClock) -> None:
        """No herd: with 32 claims waiting, one message wakes exactly one of
        them (the others neither return nor run a claim: they do not read the
        clock); ``close()`` then ends the other 31 with None."""
        waiters = [
            Waiter(functools.partial(transport.claim, f"w{i}", 30, timeout=self.far()), name=f"w{i}") for i in range(32)
        ]
        for waiter in waiters:
            waiter.start()
        started = clock.wait_for_reads(
            lambda: all(clock.reads_by(w.ident) > 0 or w.done for w in waiters), self.liveness_timeout
        )
        assert started, "not every claim read the clock"
        time.sleep(self.settle_seconds)
        assert not any(w.done for w in waiters), "a claim returned with nothing to claim"
        before = clock.reads_by_thread()
        transport.publish("g", "e")
        deadline = time.monotonic() + self.liveness_timeout
        while not any(w.done for w in waiters):
            assert time.monotonic() < deadline, "no waiting claim got the message"
            time.sleep(0.01)
        time.sleep(self.settle_seconds * 2)
        done = [w for w in waiters if w.done]
        assert len(done) == 1, f"{len(done)} waiting claims returned for one message"
        assert done[0].outcome(0).group_id == "g"
        after = clock.reads_by_thread()
        woken = [w.name for w in waiters if w is not done[0] and after.get(w.ident or 0) != before.get(w.ident or 0)]
        assert not woken, f"one message woke {len(woken)} other waiting claims: {woken}"
        transport.close()
        assert [w.outcome(self.liveness_timeout) for w in waiters if w is not done[0]] == [None] * 31

    # -- close -----------------------------------------------------------------------

    @requires("supports_waiting", WAITING)
    def test_close_wakes_every_waiting_claim(self, transport: Any, clock: ContractClock) -> None:
        """``close()`` wakes every waiting claim, thread or asyncio, and each
        returns None without claiming; ``closed`` says so; close is idempotent."""
        assert transport.closed is False
        waiters = [self.waiter(transport, clock, f"t{i}") for i in range(3)]
        waiters += [self.waiter(transport, clock, f"a{i}", kind="asyncio") for i in range(3)]
        transport.close()
        assert transport.closed is True
        assert [w.outcome(self.liveness_timeout) for w in waiters] == [None] * 6
        transport.close()
        assert transport.closed is True

    @requires("supports_waiting", WAITING)
    def test_after_close_a_waiting_claim_returns_none_at_once(self, transport: Any, clock: ContractClock) -> None:
        """After ``close()`` a claim with a non-zero timeout (or None) returns
        None at once, claimable message or not; ``timeout=0`` and every other
        call work as before, so ``while (lease := t.claim(w, 30,
        timeout=None)) is not None`` is a worker loop that ends on close."""
        if not self.usable_after_close:
            self.check_closed_and_unusable(transport)
            return
        transport.publish("g", "e")
        transport.close()
        for timeout in (None, self.far(), 1):
            assert self.run_with_deadline(functools.partial(transport.claim, "w", 30, timeout=timeout)) is None
        assert self.run_with_deadline(lambda: asyncio.run(_await(transport.aclaim("w", 30)))) is None
        assert transport.publish("h", "e") == 2
        lease = transport.claim("w", 30, timeout=0)
        assert (lease.group_id, lease.attempt) == ("g", 1)
        transport.ack(lease)
        assert transport.stats() == (1, 1, 0, 0, 0, 0, 0)

    def check_closed_and_unusable(self, transport: Any) -> None:
        """``usable_after_close=False`` (the durable backends, docs/decisions.md
        "Part 3"): after ``close()`` a claim with a non-zero timeout and
        ``aclaim`` still return None at once (the worker loop ends), while
        every other call raises ``LeaseQueueError``; ``closed`` is True."""
        transport.publish("g", "e")
        transport.publish("h", "e")
        lease = transport.claim("w", 30)
        transport.close()
        assert transport.closed is True
        for timeout in (None, self.far(), 1):
            assert self.run_with_deadline(functools.partial(transport.claim, "w", 30, timeout=timeout)) is None

        def run_aclaim(timeout: Optional[float]) -> Any:
            return asyncio.run(_await(transport.aclaim("w", 30, timeout=timeout)))

        for timeout in (None, 1):
            assert self.run_with_deadline(functools.partial(run_aclaim, timeout)) is None
        calls: List[Callable[[], Any]] = [
            lambda: transport.publish("i", "e"),
            lambda: transport.claim("w", 30),
            lambda: transport.claim("w", 30, timeout=0),
            lambda: transport.ack(lease),
            lambda: transport.nack(lease),
            lambda: transport.nack(lease, 5),
            lambda: transport.extend(lease, 5),
            transport.stats,
            lambda: len(transport),
        ]
        if self.supports_control_plane:
            calls += [
                lambda: transport.pause("g"),
                lambda: transport.resume("g"),
                lambda: transport.purge("g"),
                lambda: transport.set_priority("g", 1),
                lambda: transport.group("g"),
                transport.groups,
            ]
        if self.supports_batches:
            calls += [
                lambda: transport.publish_many([("i", "e")]),
                lambda: transport.claim_many("w", 30, 2),
                lambda: transport.ack_many([lease]),
            ]
        if self.supports_ack_and_claim:
            calls.append(lambda: transport.ack_and_claim(lease, "w", 30))
        for call in calls:
            with pytest.raises(LeaseQueueError):
                call()
        assert transport.close() is None
        assert transport.closed is True

    # -- asyncio -------------------------------------------------------------------

    @requires("supports_waiting", WAITING)
    def test_aclaim(self, transport: Any, clock: ContractClock) -> None:
        """``aclaim`` on an asyncio loop: at once when a message is ready;
        ``timeout=0`` never waits; a timeout returns None at its deadline;
        a publish from another thread, or a coroutine of the same loop,
        wakes it."""

        async def main() -> None:
            transport.publish("g", "e")
            lease = await transport.aclaim("w", 30)
            assert (lease.group_id, lease.seq, lease.attempt, lease.expires_at) == ("g", 1, 1, 1030.0)
            assert await transport.aclaim("w", 30, timeout=0) is None
            start = time.monotonic()
            assert await transport.aclaim("w", 30, timeout=0.5) is None
            assert time.monotonic() - start >= 0.5 * 0.95

            reads = clock.reads
            task = asyncio.ensure_future(transport.aclaim("w2", 30))
            await self.until_read(clock, reads)
            publisher = threading.Thread(target=transport.publish, args=("h", "from a thread"))
            publisher.start()
            lease = await asyncio.wait_for(task, self.liveness_timeout)
            publisher.join()
            assert (lease.group_id, lease.worker_id) == ("h", "w2")

            reads = clock.reads
            task = asyncio.ensure_future(transport.aclaim("w3", 30))
            await self.until_read(clock, reads)
            transport.publish("i", "from this loop")
            lease = await asyncio.wait_for(task, self.liveness_timeout)
            assert (lease.group_id, lease.worker_id) == ("i", "w3")

        asyncio.run(main())
        assert transport.stats() == (3, 3, 3, 0, 0, 0, 0)

    @requires("supports_waiting", WAITING)
    def test_aclaim_woken_from_another_event_loop(self, transport: Any, clock: ContractClock) -> None:
        waiter = self.waiter(transport, clock, "waiter", kind="asyncio")

        async def publish() -> int:
            return int(transport.publish("g", "from another loop"))

        assert self.run_with_deadline(lambda: asyncio.run(publish())) == 1
        lease = waiter.outcome(self.liveness_timeout)
        assert lease is not None and (lease.group_id, lease.worker_id) == ("g", "waiter")

    @requires("supports_waiting", WAITING)
    def test_aclaim_needs_no_thread_per_waiter(self, transport: Any, clock: ContractClock) -> None:
        """16 ``aclaim`` waiting on one loop add no thread each; 16 messages
        then serve all 16."""
        threads_before = threading.active_count()

        async def main() -> List[Any]:
            tasks = []
            for i in range(16):
                reads = clock.reads
                tasks.append(asyncio.ensure_future(transport.aclaim(f"w{i}", 30)))
                await self.until_read(clock, reads)
            grown = threading.active_count() - threads_before
            assert grown <= 2, f"{grown} threads started for 16 waiting aclaim calls"
            for i in range(16):
                transport.publish(f"g{i}", i)
            return list(await asyncio.wait_for(asyncio.gather(*tasks), self.liveness_timeout))

        leases = asyncio.run(main())
        assert sorted(lease.group_id for lease in leases) == sorted(f"g{i}" for i in range(16))
        assert [lease.worker_id for lease in leases] == [f"w{i}" for i in range(16)]

    # -- an exception in a waiting caller ---------------------------------------------

    @requires("supports_waiting", WAITING)
    def test_cancelled_aclaim_leaves_nothing_leased(self, transport: Any, clock: ContractClock) -> None:
        """Cancelling an ``aclaim`` (directly, or by ``asyncio.wait_for``'s
        timeout) ends its wait at once and leases nothing on its behalf."""

        async def main() -> None:
            reads = clock.reads
            task = asyncio.ensure_future(transport.aclaim("cancelled", 30))
            await self.until_read(clock, reads)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, self.liveness_timeout)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(transport.aclaim("timed-out", 30), 0.3)
            transport.publish("g", "e")
            await asyncio.sleep(self.settle_seconds)

        asyncio.run(main())
        assert transport.stats() == (1, 1, 0, 0, 0, 0, 0), "a cancelled aclaim left the message leased"
        lease = transport.claim("w", 30)
        assert (lease.group_id, lease.attempt, lease.worker_id) == ("g", 1, "w")

    @requires("supports_waiting", WAITING)
    def test_message_for_a_cancelled_aclaim_goes_to_the_next_waiter(
        self, transport: Any, clock: ContractClock
    ) -> None:
        """A message that was about to go to a claim cancelled at that moment
        goes to the next waiting claim, as its first delivery."""

        async def main() -> Any:
            reads = clock.reads
            first = asyncio.ensure_future(transport.aclaim("first", 30))
            await self.until_read(clock, reads)
            reads = clock.reads
            second = asyncio.ensure_future(transport.aclaim("second", 30))
            await self.until_read(clock, reads)
            transport.publish("g", "e")  # wakes "first" ...
            first.cancel()  # ... which is cancelled before it runs again
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(first, self.liveness_timeout)
            return await asyncio.wait_for(second, self.liveness_timeout)

        lease = asyncio.run(main())
        assert lease is not None and (lease.group_id, lease.worker_id, lease.attempt) == ("g", "second", 1)
        assert transport.stats() == (1, 1, 1, 0, 0, 0, 0)

    @requires("supports_waiting", WAITING)
    def test_interrupted_waiting_claim_leaves_nothing_leased(self, transport: Any, clock: ContractClock) -> None:
        """An exception raised in a thread that waits in ``claim`` (here from
        a signal handler, as ``KeyboardInterrupt`` would be) ends the wait at
        once and leaves no message leased on its behalf."""
        if not hasattr(signal, "pthread_kill") or threading.current_thread() is not threading.main_thread():
            pytest.skip("needs POSIX signals delivered to the main thread")

        class Interrupted(BaseException):
            pass

        armed = threading.Event()
        stop = threading.Event()

        def handler(signum: int, frame: Any) -> None:
            if armed.is_set():
                armed.clear()
                raise Interrupted()

        main = threading.get_ident()
        reads = clock.reads_by(main)

        def interrupt() -> None:
            clock.wait_for_reads(lambda: clock.reads_by(main) > reads, self.liveness_timeout)
            time.sleep(self.settle_seconds)
            while armed.is_set() and not stop.is_set():
                signal.pthread_kill(main, signal.SIGUSR1)
                stop.wait(0.2)

        previous = signal.signal(signal.SIGUSR1, handler)
        interrupter = threading.Thread(target=interrupt, daemon=True)
        armed.set()
        interrupter.start()
        try:
            with pytest.raises(Interrupted):
                transport.claim("interrupted", 30, timeout=self.liveness_timeout)
        finally:
            armed.clear()
            stop.set()
            interrupter.join()
            signal.signal(signal.SIGUSR1, previous)
        transport.publish("g", "e")
        time.sleep(self.settle_seconds)
        assert transport.stats() == (1, 1, 0, 0, 0, 0, 0), "the interrupted claim left the message leased"
        lease = transport.claim("w", 30)
        assert (lease.group_id, lease.attempt, lease.worker_id) == ("g", 1, "w")


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
