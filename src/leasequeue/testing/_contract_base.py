"""The machinery under ``TransportContract``: flags, hooks, fixtures, helpers.

The rule tests live in the ``_rules_*`` modules, one per part of the
contract; each is a mixin of ``ContractBase``, and ``_contract.py`` puts them
together.  Nothing here is a test.  Imported only through
``leasequeue.testing.TransportContract``, so pytest is needed only there.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, TypeVar, cast

import pytest

from .._protocol import CoreTransport
from ._clock import ManualClock
from ._reference import INT64_MIN  # the referee's, not the code under test's

__all__ = ["ContractBase", "ContractClock", "Waiter", "claim_all", "fingerprint", "lease_key", "requires"]

F = TypeVar("F", bound=Callable[..., Any])
#: ``new_transport(clock)`` or ``new_transport(clock, dedup_window=w)``
MakeTransport = Callable[..., Any]

_UNSET: Any = object()


class ContractClock(ManualClock):
    """The ``ManualClock`` the contract injects: it also counts its reads
    (in total and per thread) and can misbehave on demand.

    With ``bad`` set, a read raises ``bad`` (an exception instance) or
    returns it (any other value: NaN, a str, ...); ``behave()`` ends that.
    The read counts let waiting tests see that a waiting claim has run (a
    claim reads the clock before it waits) and which waiters woke up.
    """

    def __init__(self, start: float = 1000.0) -> None:
        super().__init__(start)
        self.bad: Any = _UNSET
        self._total_reads = 0
        self._by_thread: Dict[int, int] = {}
        self._seen = threading.Condition(threading.Lock())

    def __call__(self) -> float:
        with self._seen:
            self._total_reads += 1
            ident = threading.get_ident()
            self._by_thread[ident] = self._by_thread.get(ident, 0) + 1
            bad = self.bad
            self._seen.notify_all()
        if bad is not _UNSET:
            if isinstance(bad, BaseException):
                raise bad
            return cast(float, bad)
        return super().__call__()

    @property
    def reads(self) -> int:
        """How many times the clock was read, by any thread."""
        with self._seen:
            return self._total_reads

    def reads_by(self, ident: Optional[int]) -> int:
        """How many times the thread ``ident`` read the clock."""
        with self._seen:
            return self._by_thread.get(ident or 0, 0)

    def reads_by_thread(self) -> Dict[int, int]:
        """A snapshot of the per-thread read counts."""
        with self._seen:
            return dict(self._by_thread)

    def wait_for_reads(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until ``predicate()`` (called without the clock's lock held
        by anyone else) is true after some read, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._seen:
            while True:
                self._seen.release()
                try:
                    if predicate():
                        return True
                finally:
                    self._seen.acquire()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._seen.wait(min(left, 0.05))

    def behave(self) -> None:
        """Stop misbehaving: reads return the reading again."""
        self.bad = _UNSET


class Waiter(threading.Thread):
    """A daemon thread running one call (a waiting claim), keeping its result."""

    def __init__(self, call: Callable[[], Any], name: str = "waiter") -> None:
        super().__init__(name=name, daemon=True)
        self._call = call
        self.result: Any = _UNSET
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self.result = self._call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test by outcome()
            self.error = exc

    @property
    def done(self) -> bool:
        return self.ident is not None and not self.is_alive()

    def outcome(self, timeout: float) -> Any:
        """The call's result (or its exception, raised here), waiting at most
        ``timeout`` seconds: a call still running then fails the test."""
        self.join(timeout)
        assert not self.is_alive(), f"{self.name}: the call did not return within {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result


def requires(flag: str, promise: str) -> Callable[[F], F]:
    """Mark a test as needing the capability ``flag``: when the subclass sets
    it to False the test is *skipped* with the reason, never passed."""

    def decorate(test: F) -> F:
        @functools.wraps(test)
        def gated(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(self, flag):
                pytest.skip(f"{type(self).__name__}.{flag} is False: the transport does not promise {promise}")
            return test(self, *args, **kwargs)

        return cast(F, gated)

    return decorate


def lease_key(lease: Any, identity: bool = True) -> Any:
    """A lease as comparable data: every field with its exact type, and the
    event by identity (or by value, for a backend that copies events)."""
    if lease is None:
        return None
    return (
        lease.seq,
        lease.group_id,
        id(lease.event) if identity else lease.event,
        lease.worker_id,
        lease.expires_at,
        lease.attempt,
        type(lease.seq).__name__,
        type(lease.group_id).__name__,
        type(lease.worker_id).__name__,
        type(lease.expires_at).__name__,
        type(lease.attempt).__name__,
    )


def fingerprint(transport: Any, clock: ManualClock, identity: bool = True) -> List[Any]:
    """Everything observable about a transport, found by using it up.

    ``len``/``stats`` now; every claim that succeeds now (which groups are
    eligible, in which order, with which attempt); then, far in the future
    with all those leases acked, the drain order of everything left.  Two
    transports with the same history give the same fingerprint.  It moves
    ``clock`` 10**9 s on.
    """
    held = len(transport)
    out: List[Any] = [held, tuple(transport.stats())]
    leases = claim_all(transport, "probe", math.inf, INT64_MIN, limit=held)
    out.extend(lease_key(lease, identity) for lease in leases)
    for lease in leases:
        transport.ack(lease)
    out.append(tuple(transport.stats()))
    clock.advance(1e9)
    for _ in range(held + 1):
        lease = transport.claim("drain", 1.0, INT64_MIN)
        if lease is None:
            break
        out.append(lease_key(lease, identity))
        transport.ack(lease)
    else:
        raise AssertionError(f"{held} messages were held, but more were claimed and acked")
    out.append((len(transport), tuple(transport.stats())))
    return out


def claim_all(
    t: Any, worker: str = "w", visibility: float = 30.0, min_priority: int = INT64_MIN, limit: int = 10_000
) -> List[Any]:
    """Claim until nothing is eligible; return the leases in claim order.

    A transport that leases a group again while it is leased would go on
    for ever: more than ``limit`` leases (or more than the transport holds
    messages) fail instead."""
    leases: List[Any] = []
    while (lease := t.claim(worker, visibility, min_priority)) is not None:
        leases.append(lease)
        if len(leases) > limit:
            raise AssertionError(
                f"claim returned more than {limit} leases without an ack (the last {leases[-3:]!r}): "
                "a message or group leased twice?"
            )
    return leases


class ContractBase:
    """Flags, hooks and fixtures of ``TransportContract`` (see its docstring)."""

    # -- capability flags: what the transport promises --------------------

    #: ``lease.event is`` the published object.  False for a backend that
    #: stores events serialised: events are then compared with ``==``, and
    #: the tests of identity (and of event finalisers) are skipped.
    preserves_identity: bool = True
    #: Part 2 "Waiting for work": ``claim(..., timeout=)``, ``aclaim``,
    #: ``close()`` waking waiters, ``closed``.
    supports_waiting: bool = True
    #: Part 2 "Control plane": ``pause``, ``resume``, ``purge``,
    #: ``set_priority``, ``group``, ``groups``, ``stats().paused``.
    supports_control_plane: bool = True
    #: Part 2 "Batches": ``publish_many``, ``claim_many``, ``ack_many``.
    supports_batches: bool = True
    #: Part 4 "Quarantine": ``bury``, ``skip``, ``peek``, ``resume`` lifting
    #: a bury, ``GroupInfo.reason``, ``stats().buried``.
    supports_quarantine: bool = True
    #: ``ack_and_claim(lease, worker_id, visibility, min_priority=0)``: a
    #: job's ack and the next claim in one call (``BatchTransport``).
    supports_ack_and_claim: bool = True
    #: After ``close()`` the transport still works (Part 1: ``close`` is a
    #: no-op for the in-memory transports).  False for a backend whose
    #: ``close()`` releases its connection: every call then raises
    #: ``LeaseQueueError``.
    usable_after_close: bool = True
    #: A lease names its delivery by its fields (``seq``, ``group_id``,
    #: ``worker_id``, ``attempt``): one rebuilt from them with the lease
    #: class's constructor, or issued by another instance of the same store,
    #: is current wherever those fields name the open delivery.  True for a
    #: durable backend whose leases any process may rebuild (SQLite); False
    #: (the in-memory transports) when only the leases the transport issued
    #: are current.  With True, the foreign-lease test uses a lease whose
    #: fields name no delivery of the transport it is handed to, and
    #: ``test_a_lease_rebuilt_from_its_fields`` checks which rebuilt leases
    #: are current.
    accepts_rebuilt_leases: bool = False
    #: Part 5 of the contract (docs/contract.md), "Later": ``publish(..., delay=)``, ``publish_many(...,
    #: delay=)``, the ``"scheduled"`` state, ``GroupInfo.due_at``,
    #: ``stats().scheduled`` and ``Message.due_at``.
    supports_later: bool = True
    #: Part 5 of the contract (docs/contract.md), "Once": ``publish(..., key=)``, keyed ``publish_many``
    #: items, ``Message.key`` and the constructor's ``dedup_window=``
    #: (``make_transport(clock, dedup_window=w)`` must then accept it).
    supports_once: bool = True
    #: Part 5 of the contract (docs/contract.md), "Honest attempts": ``release(lease, delay=0.0)``,
    #: ``retry(group_id)`` and fencing by delivery (a lease of a closed
    #: delivery is never current again, whatever its ``attempt``).
    supports_release: bool = True
    #: Part 5 of the contract (docs/contract.md), "With the application's
    #: data": ``publish``, ``publish_many``, ``ack``, ``ack_many``, ``nack``,
    #: ``bury`` and ``release`` take ``conn=``, the application's database
    #: connection, and run inside its transaction.  False by default (the
    #: in-memory transports have no database); a backend that sets it True
    #: implements ``open_app_connection`` (and, if its connections are not
    #: DB-API ones, ``app_begin`` / ``app_commit`` / ``app_rollback``).
    supports_transactions: bool = False
    #: With ``supports_transactions``: True when an open application
    #: transaction that wrote blocks the transport's own writes until it ends
    #: (SQLite: one writer per file).  The rules then look at the transport,
    #: while the transaction is open, only through calls that never write
    #: (``len``, and ``peek`` with ``supports_quarantine``); with False they
    #: also check ``stats()`` and that a claim gets nothing.
    transactions_block_writers: bool = False

    # -- patience -----------------------------------------------------------

    #: Seconds a test waits for something that must happen (a woken claim
    #: returning, a thread ending) before it fails.  A bound for liveness,
    #: never a speed requirement: raise it for a slow backend or machine.
    liveness_timeout: float = 20.0
    #: Seconds a waiting test lets a claim that has started (it read the
    #: clock) settle into its wait, and lets a wrong wake-up show.
    settle_seconds: float = 0.2

    # -- hooks ---------------------------------------------------------------

    def make_transport(self, clock: Callable[[], float], *, dedup_window: float = 0.0) -> "CoreTransport[Any]":
        """Return a new, empty transport that reads the time from ``clock``.

        A backend with every part of the contract is a ``leasequeue.Transport``;
        one that leaves parts out (the ``supports_*`` flags) is at least a
        ``leasequeue.CoreTransport``.

        Override this.  Each call must give a transport independent of every
        other one (its own database file or queue name): the contract builds
        two side by side to compare them, and uses leases of one on the
        other.  ``clock`` is a zero-argument callable returning seconds (a
        ``ManualClock``); the transport must read the time from it alone.

        ``dedup_window`` (SPEC Part 5, "Once") is passed, as a keyword, only
        by the rules that need a window other than the default: an override
        that takes ``clock`` alone works for every other rule, but with
        ``supports_once`` it must accept ``dedup_window`` and give it to the
        transport's constructor.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must override make_transport(self, clock) to return a transport"
        )

    def close_transport(self, transport: Any) -> None:
        """Release a transport made by ``make_transport`` at the end of a test.

        The default calls ``transport.close()``; override it to also delete
        a database file, drop a schema, stop a server, ...
        """
        transport.close()

    # -- hooks of supports_transactions ----------------------------------------

    def open_app_connection(self, transport: Any) -> ContextManager[Any]:
        """A context manager yielding a new connection of the application's
        kind to ``transport``'s database (SQLite: a ``sqlite3.Connection`` to
        its file; PostgreSQL: a psycopg ``Connection`` to its database), and
        closing it at exit.  Needed only with ``supports_transactions``."""
        raise NotImplementedError(
            f"{type(self).__name__}.supports_transactions is True: override open_app_connection(self, transport)"
        )

    def app_begin(self, conn: Any) -> None:
        """Start the application's transaction on ``conn``.  The default does
        nothing: a DB-API connection (not in autocommit mode) opens one by
        itself at its first statement."""

    def app_commit(self, conn: Any) -> None:
        """Commit the application's transaction (default ``conn.commit()``)."""
        conn.commit()

    def app_rollback(self, conn: Any) -> None:
        """Roll the application's transaction back (default ``conn.rollback()``)."""
        conn.rollback()

    # -- fixtures --------------------------------------------------------------

    @pytest.fixture
    def clock(self) -> ContractClock:
        """The test's clock: a ``ManualClock`` at 1000.0 that also counts reads."""
        return ContractClock()

    @pytest.fixture
    def new_transport(self) -> Iterator[MakeTransport]:
        """A factory ``new_transport(clock)`` (or ``new_transport(clock,
        dedup_window=w)``): ``make_transport`` whose transports
        ``close_transport`` releases when the test ends.  The keyword reaches
        ``make_transport`` only when it is given."""
        made: List[Any] = []

        def new(clock: Callable[[], float], **options: Any) -> Any:
            transport = self.make_transport(clock, **options) if options else self.make_transport(clock)
            made.append(transport)
            return transport

        yield new
        for transport in reversed(made):
            self.close_transport(transport)

    @pytest.fixture
    def transport(self, new_transport: MakeTransport, clock: ContractClock) -> Any:
        """A new transport on the test's ``clock``."""
        return new_transport(clock)

    # -- helpers for the rule tests ------------------------------------------

    def same_event(self, got: Any, published: Any) -> bool:
        """``got is published``, or ``==`` for a backend that copies events."""
        return got is published if self.preserves_identity else bool(got == published)

    def fingerprint(self, transport: Any, clock: ManualClock) -> List[Any]:
        return fingerprint(transport, clock, self.preserves_identity)

    @staticmethod
    def claim_all(t: Any, worker: str = "w", visibility: float = 30.0, min_priority: int = INT64_MIN) -> List[Any]:
        """Claim until nothing is eligible (at most as many leases as the
        transport holds messages); return the leases in claim order."""
        return claim_all(t, worker, visibility, min_priority, limit=len(t))

    def far(self) -> float:
        """A timeout that does not end within a test (a waiting claim must be woken)."""
        return self.liveness_timeout * 3

    def run_with_deadline(self, target: Callable[[], Any]) -> Any:
        """Run ``target`` in a daemon thread and return its result; fail
        (instead of hanging) if it does not return within the liveness bound."""
        waiter = Waiter(target, name="deadline")
        waiter.start()
        return waiter.outcome(self.liveness_timeout)

    def start_waiting(self, clock: ContractClock, call: Callable[[], Any], name: str = "waiter") -> Waiter:
        """Start ``call`` (a waiting claim) in a thread and return once it has
        read the clock (so it has looked for work) and had ``settle_seconds``
        to go to sleep."""
        waiter = Waiter(call, name=name)
        waiter.start()
        ident = waiter.ident
        started = clock.wait_for_reads(lambda: clock.reads_by(ident) > 0 or waiter.done, self.liveness_timeout)
        assert started, f"{name}: the claim did not read the clock within {self.liveness_timeout} s"
        time.sleep(self.settle_seconds)
        return waiter
