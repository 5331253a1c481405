"""Type stub for the compiled transport: the same API as the pure twin."""

from ..._types import PARKED as PARKED
from ..._types import TransportStats as TransportStats
from .transport_py import InMemoryTransport as InMemoryTransport
from .transport_py import Lease as Lease

CYTHON_VERSION: str

__all__ = ["PARKED", "InMemoryTransport", "Lease", "TransportStats"]
