"""Leases of the durable backends: accepted by their fields, issued as values.

A durable transport (SQLite, PostgreSQL) cannot stamp its leases with an
in-process owner token: a worker in another process, or after a restart,
rebuilds a lease from its fields.  So a lease names its delivery by
``seq``, ``group_id``, ``attempt`` and ``worker_id`` (docs/decisions.md,
"Part 3: durable backends"), compared with the group's open delivery in the
store; ``expires_at`` and ``event`` are not compared.

* ``check_lease``: the type check every settling call makes first: a
  ``Lease`` of either implementation (pure or Cython), hand-built included;
  anything else is a ``TypeError``.
* ``lease_key``: the four fields as exact types, or ``None`` when they can
  name no delivery (a hand-built lease may hold anything: a field of
  another type, a ``str`` or ``int`` subclass, a number outside
  ``1 .. 2**63 - 1``).  Reading the fields runs no user code.
* ``lease_fence``: ``lease_key``'s four fields and the delivery's number
  (``lease_delivery``), in one call: what a backend that fences by
  delivery matches (docs/decisions.md, "Honest attempts").
* ``lost``: the ``LeaseLost`` for a lease that is not current.
* ``issue`` / ``decoded_lease``: the ``leasequeue.Lease`` a claim returns,
  the latter deserializing the stored event first (``EventDecodeError``
  carrying the lease, with the stored data as its event, if that fails).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from .inmemory import transport_py as _inmemory_py
from .._errors import LeaseLost
from .._serializers import EventDecodeError
from .._validation import INT64_MAX

__all__ = [
    "LEASE_TYPES",
    "DeliveryKey",
    "check_lease",
    "decoded_lease",
    "issue",
    "lease_class",
    "lease_delivery",
    "lease_fence",
    "lease_key",
    "lost",
]


def _lease_types() -> Tuple[type, ...]:
    types: Tuple[type, ...] = (_inmemory_py.Lease,)
    try:
        from .inmemory import transport_c as _inmemory_c
    except ImportError:  # a pure-Python install
        pass
    else:
        types += (_inmemory_c.Lease,)
    return types


#: The lease classes a durable transport accepts: either implementation's.
LEASE_TYPES: Tuple[type, ...] = _lease_types()

#: ``(group_id, attempt, seq, worker_id)``, or None for a lease whose fields
#: cannot name any delivery.
DeliveryKey = Optional[Tuple[str, int, int, str]]


def check_lease(lease: Any) -> None:
    """``TypeError`` unless ``lease`` is a ``Lease`` of either implementation."""
    if type(lease) not in LEASE_TYPES:
        raise TypeError(f"expected a Lease, not {type(lease).__name__}")


def lease_key(lease: Any) -> DeliveryKey:
    """``(group_id, attempt, seq, worker_id)`` to match a delivery, or None if
    the lease's fields cannot name one (exact ``str`` / ``int`` only, ``seq``
    and ``attempt`` in ``1 .. 2**63 - 1``)."""
    group_id = lease.group_id
    attempt = lease.attempt
    seq = lease.seq
    worker_id = lease.worker_id
    if (
        type(group_id) is not str
        or type(worker_id) is not str
        or type(seq) is not int
        or type(attempt) is not int
        or not 0 < seq <= INT64_MAX
        or not 0 < attempt <= INT64_MAX
    ):
        return None
    return (group_id, attempt, seq, worker_id)


def lease_delivery(lease: Any) -> Optional[int]:
    """The number of the delivery an issued lease names (the claim number of
    the claim that made it: docs/decisions.md, "Fencing by delivery"), or
    None for a lease built by hand, which is matched by its fields alone."""
    delivery = lease._delivery
    return delivery if type(delivery) is int else None


#: ``(group_id, attempt, seq, worker_id, delivery)``: a ``DeliveryKey`` and
#: the delivery's number (None for a lease built by hand), or None.
FencedKey = Optional[Tuple[str, int, int, str, Optional[int]]]


def lease_fence(lease: Any) -> FencedKey:
    """``lease_key(lease)`` plus ``lease_delivery(lease)``, or None when the
    fields name no delivery.  A number outside ``1 .. 2**63 - 1`` (no
    claim's) becomes 0, which names no delivery either.  One call, inlined:
    every ack pays for it."""
    group_id = lease.group_id
    attempt = lease.attempt
    seq = lease.seq
    worker_id = lease.worker_id
    if (
        type(group_id) is not str
        or type(worker_id) is not str
        or type(seq) is not int
        or type(attempt) is not int
        or not 0 < seq <= INT64_MAX
        or not 0 < attempt <= INT64_MAX
    ):
        return None
    delivery = lease._delivery
    if delivery is not None and (type(delivery) is not int or not 0 < delivery <= INT64_MAX):
        delivery = None if type(delivery) is not int else 0
    return (group_id, attempt, seq, worker_id, delivery)


def lost(lease: Any) -> LeaseLost:
    """The error for a lease that is not current."""
    return LeaseLost(
        f"lease of message {lease.seq!r} in group {lease.group_id!r} (attempt {lease.attempt!r}) "
        "is not current: it was acked, nacked, re-delivered or purged, or it names no delivery of this store"
    )


def lease_class() -> Any:
    """``leasequeue.Lease``: the class of the leases the durable backends issue
    (the selected implementation's, as ``InMemoryTransport``'s)."""
    from .inmemory.transport import Lease

    return Lease


_Lease = lease_class()


def _durable_lease_builder() -> Callable[..., Any]:
    """The ``_durable_lease`` of the module that defines ``_Lease``."""
    if _Lease is _inmemory_py.Lease:
        return _inmemory_py._durable_lease
    from .inmemory import transport_c

    builder: Callable[..., Any] = getattr(transport_c, "_durable_lease")  # not in every transport_c.pyi
    return builder


_build = _durable_lease_builder()


def issue(
    seq: int, group_id: str, event: Any, worker_id: str, expires_at: float, attempt: int, delivery: Optional[int] = None
) -> Any:
    """A ``leasequeue.Lease`` built from its six fields, naming delivery
    ``delivery`` (None: a lease as the public constructor builds it)."""
    if delivery is None:
        return _Lease(seq, group_id, event, worker_id, expires_at, attempt)
    return _build(seq, group_id, event, worker_id, expires_at, attempt, delivery)


def decoded_lease(
    loads: Callable[[Any], Any],
    data: Any,
    seq: int,
    group_id: str,
    worker_id: str,
    expires_at: float,
    attempt: int,
    delivery: Optional[int] = None,
) -> Any:
    """The lease of a claimed message, its event ``loads(data)``.

    If ``loads`` raises (an ``Exception``), ``EventDecodeError`` carries the
    lease with ``data`` as its event: the claim stands.  A ``BaseException``
    (``KeyboardInterrupt``) propagates as it is: the caller undoes the claim.
    """
    try:
        event = loads(data)
    except Exception as exc:
        raise EventDecodeError(
            f"the event of message {seq} in group {group_id!r} could not be deserialized "
            f"({type(exc).__name__}: {exc}); it stays leased to {worker_id!r} until {expires_at}",
            issue(seq, group_id, data, worker_id, expires_at, attempt, delivery),
        ) from exc
    return issue(seq, group_id, event, worker_id, expires_at, attempt, delivery)
