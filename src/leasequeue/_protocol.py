"""``Transport``: what every leasequeue backend is, as a ``typing.Protocol``.

No backend inherits from these classes: a backend *is* a ``Transport`` when
it has these methods with these signatures, and the type checker says so
(``tests/typing/`` assigns every backend to ``Transport`` and runs mypy).
The worker, the conformance kit and users' own code are typed against it::

    def drain(t: leasequeue.Transport) -> None:
        while (lease := t.claim("drainer", 30.0)) is not None:
            t.ack(lease)

The protocol is built from small ones, one per part of the contract (the
way pgqueuer composes its ports), so that code needing only a part can ask
for only that part:

==========================  ================================================
:class:`CoreTransport`      Part 1: publish, claim, ack, nack, extend, stats,
                            ``len``, close, the context manager; and
                            Part 5's release (a hand-back that does not count)
:class:`WaitingTransport`   Part 2: ``claim(timeout=)``, ``aclaim``, ``closed``
:class:`ControlPlane`       Part 2: pause, resume, purge, set_priority,
                            group, groups
:class:`BatchTransport`     Part 2: publish_many, claim_many, ack_many;
                            and ack_and_claim (a job's ack and the next
                            claim in one call)
:class:`Quarantine`         Part 4: bury, skip, peek; and Part 5's retry
:class:`Transport`          all of them
==========================  ================================================

Each is generic in the lease type ``L`` a backend issues and takes back: a
bare ``Transport`` means ``Transport[Any]``; ``Transport[leasequeue.Lease]``
is exact for the built-in backends.  :class:`LeaseLike` is the protocol of a
lease's fields.  None of these is ``runtime_checkable``: the check is static.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Protocol, Tuple, TypeVar

from ._types import GroupInfo, Message, TransportStats

__all__ = [
    "BatchTransport",
    "ControlPlane",
    "CoreTransport",
    "LeaseLike",
    "Quarantine",
    "Transport",
    "WaitingTransport",
]


class LeaseLike(Protocol):
    """A delivery, as every backend's ``Lease`` has it (all read-only)."""

    @property
    def seq(self) -> int:
        """The message's sequence number (1, 2, 3, ... never reused)."""

    @property
    def group_id(self) -> str:
        """The message's group."""

    @property
    def event(self) -> Any:
        """The published object (by reference in memory; an equal copy in durable backends)."""

    @property
    def worker_id(self) -> str:
        """The worker the message is leased to."""

    @property
    def expires_at(self) -> float:
        """When the lease runs out, in clock seconds (``inf``: never)."""

    @property
    def attempt(self) -> int:
        """1 on a message's first delivery, +1 at each later claim of it."""


L = TypeVar("L", bound=LeaseLike)
L_contra = TypeVar("L_contra", bound=LeaseLike, contravariant=True)  # a lease only taken, never returned
_T = TypeVar("_T")


class CoreTransport(Protocol[L]):
    """Part 1: the seed's transport (publish, claim, ack, nack, extend, stats)."""

    def publish(
        self, group_id: str, event: Any, priority: int = 0, *, delay: float = 0.0, key: Optional[str] = None
    ) -> int:
        """Append ``event`` to ``group_id``; returns its seq.

        ``delay`` > 0 schedules it: not delivered before ``now + delay``
        (its group's later messages wait behind it).  ``key``: an
        idempotency key in the group; while it is held, the publish changes
        nothing and returns the seq of the message that holds it.
        """

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Optional[L]:
        """Lease the next eligible message for ``visibility`` seconds, or ``None``."""

    def ack(self, lease: L) -> None:
        """The message is done: remove it (``LeaseLost`` if the lease is not current)."""

    def nack(self, lease: L, delay: float = 0.0) -> None:
        """Retry now (``delay == 0``) or park the message, blocking its group, for ``delay`` s."""

    def release(self, lease: L, delay: float = 0.0) -> None:
        """``nack(lease, delay)`` whose delivery does not count: the next
        delivery carries the same ``attempt`` as this one."""

    def extend(self, lease: L, visibility: float) -> L:
        """Heartbeat: the same delivery, leased until ``now + visibility``."""

    def stats(self) -> TransportStats:
        """Counts as of now (messages, groups, leased, parked, paused, buried, scheduled)."""

    def __len__(self) -> int:
        """Messages held, whatever their state (ready, leased, parked, buried, scheduled)."""

    def close(self) -> None:
        """End every waiting claim; idempotent."""

    def __enter__(self: _T) -> _T:
        """The transport itself; leaving the block closes it."""

    def __exit__(self, *exc_info: object) -> None:
        """``close()``."""


class WaitingTransport(CoreTransport[L], Protocol[L]):
    """Part 2: waiting for work (``claim(timeout=...)``, ``aclaim``, ``closed``)."""

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, *, timeout: Optional[float] = 0.0
    ) -> Optional[L]:
        """Lease the next eligible message; ``timeout`` > 0 or ``None`` waits for one (``0``: never)."""

    async def aclaim(
        self, worker_id: str, visibility: float, min_priority: int = 0, *, timeout: Optional[float] = None
    ) -> Optional[L]:
        """``claim`` as a coroutine, waiting in the running event loop (default: no deadline)."""

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""


class ControlPlane(Protocol):
    """Part 2: an operator's view and steering of groups."""

    def pause(self, group_id: str) -> bool:
        """Claims skip the group until ``resume``; True if it was not paused."""

    def resume(self, group_id: str) -> bool:
        """Lift a pause and end a park; True if either was lifted."""

    def purge(self, group_id: str) -> int:
        """Remove every message of the group and forget it; returns how many."""

    def set_priority(self, group_id: str, priority: int) -> bool:
        """Re-prioritise a live group; False if there is no such group."""

    def group(self, group_id: str) -> Optional[GroupInfo]:
        """The group as of now, or ``None``."""

    def groups(self) -> List[GroupInfo]:
        """A snapshot of every group, in creation order."""


class BatchTransport(Protocol[L]):
    """Part 2: many messages per call, under one lock and one clock read
    (and ``ack_and_claim``: a job's ack and the next claim in one call)."""

    def publish_many(self, items: Iterable[Tuple[Any, ...]], *, delay: float = 0.0) -> List[int]:
        """Publish ``(group_id, event[, priority[, key]])`` items; returns their seqs."""

    def claim_many(self, worker_id: str, visibility: float, max_count: int, min_priority: int = 0) -> List[L]:
        """What ``max_count`` successive claims at one ``now`` would return."""

    def ack_many(self, leases: Iterable[L]) -> List[L]:
        """Ack each current lease, in order; returns the ones that were not current."""

    def ack_and_claim(self, lease: L, worker_id: str, visibility: float, min_priority: int = 0) -> Optional[L]:
        """``ack(lease)`` then a non-waiting ``claim(worker_id, visibility,
        min_priority)``, as one operation: one lock (one transaction in a
        durable backend), the clock read once.

        A worker's loop then costs one call (one commit) per job instead of
        two.  A lease that is not current raises ``LeaseLost`` and changes
        nothing (no ack, no claim).  Returns the claim's lease, or ``None``
        when no group is eligible (the ack stands).  Never waits.
        """


class Quarantine(Protocol[L_contra]):
    """Part 4: set a poison message aside without breaking its group's order."""

    def bury(self, lease: L_contra, reason: str = "") -> None:
        """End the delivery and quarantine the group, its head kept, until ``resume`` or ``skip``."""

    def skip(self, group_id: str) -> bool:
        """Remove the group's head unless a live lease holds it; lifts a bury (not a pause)."""

    def peek(self, group_id: str, max_count: int = 1) -> List[Message]:
        """The group's oldest ``max_count`` messages, head first, whatever their state."""

    def retry(self, group_id: str) -> bool:
        """Run the head again from scratch: its attempt count back to 0, a
        bury lifted, a park ended (a pause and a schedule stay); False if
        the group is unknown, empty, or its head is under a live lease."""


class Transport(WaitingTransport[L], ControlPlane, BatchTransport[L], Quarantine[L], Protocol[L]):
    """Every operation of the contract: what every leasequeue backend is.

    ``InMemoryTransport`` (both twins), ``SQLiteTransport`` and
    ``PostgresTransport`` satisfy it without inheriting from it.
    """
