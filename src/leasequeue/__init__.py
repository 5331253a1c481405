"""leasequeue: an in-process message transport for durable workflow engines.

Messages are published into *groups* (one group = one workflow execution).
Workers :meth:`~InMemoryTransport.claim` a message, which leases it for a
visibility timeout, then :meth:`~InMemoryTransport.ack` or
:meth:`~InMemoryTransport.nack` it.  At most one message per group is in
flight, groups are served round-robin, a priority floor lets workers serve
only important groups, and an expired lease frees its message again.  An
operator can pause, resume, purge, re-prioritise and inspect groups
(:class:`GroupInfo`), and the batch calls move many messages per call.  A
poison message is set aside without breaking its group's order: ``bury``
quarantines its group (the message stays at the head, every other group goes
on), ``peek`` shows the held messages (:class:`Message`), and ``resume``,
``retry`` (a fresh start: the attempt count back to 0) or ``skip`` lets the
group go on.  A publish can be delayed (``delay=``: not delivered before
then, still in its group's order) and keyed (``key=``: a publish whose key
is held in its group adds nothing, so a retried publish counts once), and
``release`` hands a delivery back without counting it.  Delivery is at
least once: a handler may run again after a crash or an expired lease, so
handlers are idempotent.

``InMemoryTransport`` is the compiled (Cython) implementation when it was
built and imports, else the pure-Python twin; ``IMPLEMENTATION`` says which.
Set ``LEASEQUEUE_NO_EXTENSIONS=1`` to force the pure one.

``SQLiteTransport`` is the same contract in a SQLite file shared by
processes (durable; events stored serialized); it is imported on first use.

``Worker`` runs a handler for every message of any transport (threads or
asyncio), with heartbeats, a ``Retry`` policy, quarantine of poison
messages, graceful shutdown, hooks and optional metrics; it too is imported
on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _backends
from ._errors import LeaseLost, LeaseQueueError, QueueNotFound
from ._protocol import BatchTransport, ControlPlane, CoreTransport, LeaseLike, Quarantine, Transport, WaitingTransport
from ._types import GroupInfo, Message, TransportStats

__version__ = "0.7.0"

__all__ = [
    "IMPLEMENTATION",
    "JSON_SERIALIZER",
    "PICKLE_SERIALIZER",
    "BatchTransport",
    "ControlPlane",
    "CoreTransport",
    "EventDecodeError",
    "GroupInfo",
    "InMemoryTransport",
    "Job",
    "Lease",
    "LeaseLike",
    "LeaseLost",
    "LeaseQueueError",
    "Message",
    "Middleware",
    "PyInMemoryTransport",
    "QueueNotFound",
    "Quarantine",
    "Retry",
    "RetryLater",
    "SQLiteTransport",
    "Task",
    "Transport",
    "TransportStats",
    "Undecodable",
    "WaitingTransport",
    "Worker",
    "__version__",
    "task",
]

from ._backends.inmemory.transport import IMPLEMENTATION, NO_EXTENSIONS, InMemoryTransport, Lease  # noqa: F401

if TYPE_CHECKING:  # imported on first use at run time (see __getattr__ below)
    from ._backends.inmemory.transport_py import InMemoryTransport as PyInMemoryTransport
    from ._backends.sqlite.transport import SQLiteTransport
    from ._serializers import JSON_SERIALIZER, PICKLE_SERIALIZER, EventDecodeError, Undecodable
    from .worker import Job, Middleware, Retry, RetryLater, Task, Worker, task


def __getattr__(name: str) -> object:
    """The other backends, and the serializers, are imported on first use.

    ``import leasequeue`` imports the in-memory transport only: no
    ``sqlite3``, no ``psycopg``.  ``SQLiteTransport`` needs only the standard
    library; ``PostgresTransport`` needs psycopg (the ``postgres`` extra: a
    missing psycopg raises ``ImportError`` naming it), so it is not in
    ``__all__`` either: ``from leasequeue import *`` does not need it.
    ``PyInMemoryTransport`` is the pure-Python twin whatever
    ``IMPLEMENTATION`` says (frozenlist's ``PyFrozenList``): a conformance
    kit user's second implementation to compare with.
    """
    if name in ("JSON_SERIALIZER", "PICKLE_SERIALIZER", "EventDecodeError", "Undecodable"):
        from . import _serializers

        value = getattr(_serializers, name)
    elif name in ("Worker", "Retry", "RetryLater", "Job", "Task", "task", "Middleware"):
        from . import worker

        value = getattr(worker, name)
    elif name in _backends.BACKENDS:
        value = _backends.load(name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__) | {"PostgresTransport"})


if TYPE_CHECKING:
    from ._backends.postgres.transport import PostgresTransport as PostgresTransport
