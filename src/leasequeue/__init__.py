"""leasequeue: an in-process message transport for durable workflow engines.

Messages are published into *groups* (one group = one workflow execution).
Workers :meth:`~InMemoryTransport.claim` a message, which leases it for a
visibility timeout, then :meth:`~InMemoryTransport.ack` or
:meth:`~InMemoryTransport.nack` it.  At most one message per group is in
flight, groups are served round-robin, a priority floor lets workers serve
only important groups, and an expired lease frees its message again.  An
operator can pause, resume, purge, re-prioritise and inspect groups
(:class:`GroupInfo`), and the batch calls move many messages per call.

``InMemoryTransport`` is the compiled (Cython) implementation when it was
built and imports, else the pure-Python twin; ``IMPLEMENTATION`` says which.
Set ``LEASEQUEUE_NO_EXTENSIONS=1`` to force the pure one.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ._errors import LeaseLost, LeaseQueueError
from ._types import GroupInfo, TransportStats

__version__ = "0.1.0"

__all__ = [
    "IMPLEMENTATION",
    "GroupInfo",
    "InMemoryTransport",
    "Lease",
    "LeaseLost",
    "LeaseQueueError",
    "TransportStats",
    "__version__",
]

#: True when ``LEASEQUEUE_NO_EXTENSIONS`` is set to a non-empty value.
NO_EXTENSIONS: bool = bool(os.environ.get("LEASEQUEUE_NO_EXTENSIONS"))

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
