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
on), ``peek`` shows the held messages (:class:`Message`), and ``resume`` or
``skip`` lets the group go on.

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

import os
from typing import TYPE_CHECKING

from ._errors import LeaseLost, LeaseQueueError
from ._types import GroupInfo, Message, TransportStats

__version__ = "0.2.0"

__all__ = [
    "IMPLEMENTATION",
    "JSON_SERIALIZER",
    "PICKLE_SERIALIZER",
    "EventDecodeError",
    "GroupInfo",
    "InMemoryTransport",
    "Job",
    "Lease",
    "LeaseLost",
    "LeaseQueueError",
    "Message",
    "Retry",
    "RetryLater",
    "SQLiteTransport",
    "TransportStats",
    "Worker",
    "__version__",
]

#: True when ``LEASEQUEUE_NO_EXTENSIONS`` is set to a non-empty value.
NO_EXTENSIONS: bool = bool(os.environ.get("LEASEQUEUE_NO_EXTENSIONS"))

if TYPE_CHECKING:  # imported on first use at run time (see __getattr__ below)
    from ._serializers import JSON_SERIALIZER, PICKLE_SERIALIZER, EventDecodeError
    from ._sqlite import SQLiteTransport
    from ._worker import Job, Retry, RetryLater, Worker

IMPLEMENTATION: str
if TYPE_CHECKING or NO_EXTENSIONS:
    from ._inmemory_py import InMemoryTransport, Lease

    IMPLEMENTATION = "python"
else:
    try:
        from ._inmemory_c import InMemoryTransport, Lease
    except ImportError as exc:
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == f"{__name__}._inmemory_c"):
            # The extension is there but broken (an ABI mismatch, a missing
            # symbol): fall back, but loudly, unlike a pure-only install.
            import warnings

            warnings.warn(
                f"leasequeue: the compiled extension failed to import ({exc}); "
                "using the slower pure-Python implementation",
                RuntimeWarning,
                stacklevel=2,
            )
        from ._inmemory_py import InMemoryTransport, Lease

        IMPLEMENTATION = "python"
    else:
        IMPLEMENTATION = "cython"


def __getattr__(name: str) -> object:
    """The durable backends are imported on first use.

    The serializers and ``EventDecodeError`` (shared by both, in
    ``_serializers``) and ``SQLiteTransport`` need only the standard
    library; ``PostgresTransport`` needs psycopg (the ``postgres`` extra), so
    it is not in ``__all__`` either: ``from leasequeue import *`` does not
    need it.
    """
    if name in ("JSON_SERIALIZER", "PICKLE_SERIALIZER", "EventDecodeError"):
        from . import _serializers

        value = getattr(_serializers, name)
        globals()[name] = value
        return value
    if name in ("Worker", "Retry", "RetryLater", "Job"):
        from . import _worker

        value = getattr(_worker, name)
        globals()[name] = value
        return value
    if name == "SQLiteTransport":
        from . import _sqlite

        return _sqlite.SQLiteTransport
    if name == "PostgresTransport":
        from ._postgres import PostgresTransport

        globals()[name] = PostgresTransport
        return PostgresTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__) | {"PostgresTransport"})


if TYPE_CHECKING:
    from ._postgres import PostgresTransport as PostgresTransport
