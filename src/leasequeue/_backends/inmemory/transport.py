"""The selector: the Cython twin when it was built and imports, else the pure one.

``LEASEQUEUE_NO_EXTENSIONS=1`` (any non-empty value) forces the pure twin.
An extension that is there but fails to import (an ABI mismatch, a missing
symbol) falls back with a ``RuntimeWarning``, never silently; a pure-only
install (no extension at all) falls back quietly, as it was built to.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

__all__ = ["IMPLEMENTATION", "NO_EXTENSIONS", "InMemoryTransport", "Lease"]

#: True when ``LEASEQUEUE_NO_EXTENSIONS`` is set to a non-empty value.
NO_EXTENSIONS: bool = bool(os.environ.get("LEASEQUEUE_NO_EXTENSIONS"))

IMPLEMENTATION: str
if TYPE_CHECKING or NO_EXTENSIONS:
    from .transport_py import InMemoryTransport, Lease

    IMPLEMENTATION = "python"
else:
    try:
        from .transport_c import InMemoryTransport, Lease
    except ImportError as exc:
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == f"{__package__}.transport_c"):
            import warnings

            warnings.warn(
                f"leasequeue: the compiled extension failed to import ({exc}); "
                "using the slower pure-Python implementation",
                RuntimeWarning,
                stacklevel=2,
            )
        from .transport_py import InMemoryTransport, Lease

        IMPLEMENTATION = "python"
    else:
        IMPLEMENTATION = "cython"
