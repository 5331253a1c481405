"""Type stub for the compiled transport: the same API as the pure twin."""

from ._types import PARKED as PARKED
from ._inmemory_py import InMemoryTransport as InMemoryTransport
from ._inmemory_py import Lease as Lease
from ._types import TransportStats as TransportStats

CYTHON_VERSION: str

__all__ = ["PARKED", "InMemoryTransport", "Lease", "TransportStats"]
