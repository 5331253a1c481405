"""Lease acceptance and issue for the durable backends.

A durable transport cannot stamp its leases with an in-process owner token
(a worker may rebuild one in another process, or after a restart), so it
names a delivery by its fields: ``seq``, ``group_id``, ``attempt`` and
``worker_id``, checked against the open delivery in the database.  It issues
``leasequeue.Lease`` instances built with the public constructor and accepts
a ``Lease`` of either implementation (pure or Cython), hand-built included;
anything else is a ``TypeError``.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _inmemory_py

__all__ = ["LEASE_TYPES", "DeliveryKey", "delivery_key", "check_lease", "issue"]


def _lease_types() -> Tuple[type, ...]:
    types: Tuple[type, ...] = (_inmemory_py.Lease,)
    try:
        from . import _inmemory_c
    except ImportError:
        pass
    else:
        types += (_inmemory_c.Lease,)
    return types


LEASE_TYPES = _lease_types()

#: (group_id, seq, attempt, worker_id), or None for a lease whose fields
#: cannot name any delivery (wrong types or out of range).
DeliveryKey = Optional[Tuple[str, int, int, str]]

_INT64 = 2**63
_INT32 = 2**31


def check_lease(lease: Any) -> Any:
    """``TypeError`` unless ``lease`` is a ``Lease`` of either implementation."""
    if type(lease) not in LEASE_TYPES:
        raise TypeError(f"expected a Lease, not {type(lease).__name__}")
    return lease


def delivery_key(lease: Any) -> DeliveryKey:
    """The fields that name the lease's delivery, as exact types.

    Reading the attributes of either ``Lease`` runs no user code; fields of
    the wrong type (a hand-built lease can hold anything) name no delivery.
    """
    seq, group_id, attempt, worker_id = lease.seq, lease.group_id, lease.attempt, lease.worker_id
    if not (isinstance(group_id, str) and isinstance(worker_id, str)):
        return None
    if type(seq) is not int or type(attempt) is not int:
        if isinstance(seq, bool) or isinstance(attempt, bool):
            return None
        if not (isinstance(seq, int) and isinstance(attempt, int)):
            return None
        seq, attempt = int(seq), int(attempt)
    if not (-_INT64 <= seq < _INT64 and -_INT32 <= attempt < _INT32):
        return None
    return (str.__getitem__(group_id, slice(None)), seq, attempt, str.__getitem__(worker_id, slice(None)))


def issue(seq: int, group_id: str, event: Any, worker_id: str, expires_at: float, attempt: int) -> Any:
    """A ``leasequeue.Lease`` (the selected implementation's class)."""
    from . import Lease

    return Lease(seq, group_id, event, worker_id, expires_at, attempt)
