"""Value types shared by every transport (in-memory, SQLite, PostgreSQL).

Defined once, in pure Python, so that each backend returns the same classes:
``TransportStats`` from ``stats()`` and ``GroupInfo`` from ``group()`` /
``groups()``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

__all__ = ["PARKED", "GroupInfo", "Message", "TransportStats"]

#: The ``worker_id`` reserved for parked messages (the seed's sentinel).
PARKED = "__parked__"


class TransportStats(NamedTuple):
    """A snapshot of a transport's counts (``stats()``)."""

    #: Messages held: ready + leased + parked (the same as ``len(transport)``).
    messages: int
    #: Groups holding at least one message.
    groups: int
    #: Messages under a lease that has not expired.
    leased: int
    #: Messages parked by ``nack(delay > 0)`` and not yet due.
    parked: int
    #: Groups paused by ``pause()`` (held messages or not).  New in 0.2; it
    #: defaults to 0 so that 0.1.0's four-field ``TransportStats(...)`` still builds.
    paused: int = 0
    #: Groups buried by ``bury()`` (until ``resume`` or ``skip``).  New in 0.4;
    #: it defaults to 0 so that the five-field ``TransportStats(...)`` still builds.
    buried: int = 0


class GroupInfo(NamedTuple):
    """What one group is doing (``group()`` / ``groups()``), as of one ``now``."""

    group_id: str
    priority: int
    #: Messages held: ready + leased + parked.
    messages: int
    #: ``"ready"``, ``"leased"``, ``"parked"``, ``"buried"`` or ``"paused"``
    #: (a buried group that is also paused reports ``"buried"``).
    state: str
    #: Paused by ``pause()``; a leased message of a paused group reports
    #: ``state="leased"`` and ``paused=True``.
    paused: bool
    #: Seq of the group's oldest message (``None`` for an empty paused group).
    head_seq: Optional[int]
    #: The current lease or park: holder (``"__parked__"`` for a park), end
    #: and delivery count; all ``None`` when nothing is leased or parked.  A
    #: buried group: the buried delivery's worker and attempt, no end.
    worker_id: Optional[str]
    expires_at: Optional[float]
    attempt: Optional[int]
    #: Clock time of the group's last claim, ``None`` if never claimed.
    last_claimed_at: Optional[float]
    #: The bury reason while the group is buried, else ``None``.  New in 0.4
    #: (last, with a default, so that older constructions still build).
    reason: Optional[str] = None


class Message(NamedTuple):
    """One message as ``peek()`` shows it, whatever its state."""

    seq: int
    #: The event (by reference in memory; an equal copy in durable backends).
    event: Any
    #: Deliveries so far.
    attempt: int
