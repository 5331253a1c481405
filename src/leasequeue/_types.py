"""Value types shared by every transport (in-memory, SQLite, PostgreSQL).

Defined once, in pure Python, so that each backend returns the same classes:
``TransportStats`` from ``stats()``, ``GroupInfo`` from ``group()`` /
``groups()`` and ``Message`` from ``peek()``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

__all__ = ["PARKED", "GroupInfo", "Message", "TransportStats"]

#: The ``worker_id`` reserved for parked messages (the seed's sentinel).
PARKED = "__parked__"


class TransportStats(NamedTuple):
    """A snapshot of a transport's counts (``stats()``)."""

    #: Messages held, whatever their state: ready, leased, parked, buried or
    #: scheduled (the same as ``len(transport)``).
    messages: int
    #: Groups holding at least one message.
    groups: int
    #: Messages under a lease that has not expired.
    leased: int
    #: Messages parked by ``nack(delay > 0)`` (or ``release(delay > 0)``) and
    #: not yet due; not those scheduled by a delayed publish.
    parked: int
    #: Groups paused by ``pause()`` (held messages or not).  New in 0.2; it
    #: defaults to 0 so that 0.1.0's four-field ``TransportStats(...)`` still builds.
    paused: int = 0
    #: Groups buried by ``bury()`` (until ``resume`` or ``skip``).  New in
    #: 0.4; it defaults to 0 so that the four- and five-field forms still build.
    buried: int = 0
    #: Messages published with a ``delay`` and not yet due, wherever they
    #: stand in their group (they count in ``messages`` too).  New in 0.6,
    #: with a default, so the earlier forms still build.
    scheduled: int = 0


class GroupInfo(NamedTuple):
    """What one group is doing (``group()`` / ``groups()``), as of one ``now``."""

    group_id: str
    priority: int
    #: Messages held, whatever their state (scheduled ones included).
    messages: int
    #: ``"ready"``, ``"leased"``, ``"parked"``, ``"buried"``, ``"paused"`` or
    #: ``"scheduled"`` (the head was published with a delay and is not due;
    #: the lowest in precedence: a paused group with such a head is ``"paused"``).
    state: str
    #: Paused by ``pause()``; a leased message of a paused group reports
    #: ``state="leased"`` and ``paused=True``.
    paused: bool
    #: Seq of the group's oldest message (``None`` for an empty paused group).
    head_seq: Optional[int]
    #: The current lease or park: holder (``"__parked__"`` for a park), end
    #: and delivery count; all ``None`` when nothing is leased or parked.
    #: A buried group reports the buried delivery's worker and attempt, and
    #: ``expires_at=None``.
    worker_id: Optional[str]
    expires_at: Optional[float]
    attempt: Optional[int]
    #: Clock time of the group's last claim, ``None`` if never claimed.
    last_claimed_at: Optional[float]
    #: The ``bury()`` reason while the group is buried, else ``None``.  New
    #: in 0.4, last and with a default, so the ten-field form still builds.
    reason: Optional[str] = None
    #: The head's due time while it is scheduled and not due, else ``None``.
    #: New in 0.6, last and with a default.
    due_at: Optional[float] = None


class Message(NamedTuple):
    """One held message as ``peek()`` shows it, whatever its state."""

    seq: int
    #: The published object (in memory), or an equal copy (durable backends;
    #: a :class:`~leasequeue.Undecodable` there, with the stored form and the
    #: error, when the serializer cannot read it back: new in 0.7).
    event: Any
    #: Its attempt count: deliveries so far (0 for a message never claimed);
    #: ``release`` hands one back, ``retry`` resets it to 0.
    attempt: int
    #: The due time it was published with (``publish(..., delay=d)``:
    #: ``now + d``), also once it is due; ``None`` for a publish without delay.
    #: New in 0.6, with a default.
    due_at: Optional[float] = None
    #: Its idempotency key (``publish(..., key=k)``), else ``None``.  New in 0.6.
    key: Optional[str] = None
