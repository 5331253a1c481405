"""``leasequeue.testing``: the contract as something a test suite can run.

For anyone who writes a transport -- leasequeue's own in-memory ones, the
durable backends, or a workflow engine's own -- and wants to know that it
obeys the same rules (``docs/contract.md``):

* ``ManualClock``: a clock to inject, advanced by hand (and made to
  misbehave on demand).
* ``ReferenceTransport``: the seed's algorithm, literally -- a list of
  messages sorted on every claim -- with the SPEC's fencing and round-robin
  rule: slow, obviously right, the referee.
* ``check_differential(make_transport, ops=..., seed=...)``: your transport
  and the reference under the same random operations; at the first
  difference, an ``AssertionError`` with a shrunk, runnable reproduction.

Importing this package needs neither pytest nor hypothesis.
"""

from __future__ import annotations

from ._clock import ManualClock
from ._differential import DifferentialFailure, DifferentialSummary, check_differential, replay
from ._reference import ReferenceLease, ReferenceTransport

__all__ = [
    "DifferentialFailure",
    "DifferentialSummary",
    "ManualClock",
    "ReferenceLease",
    "ReferenceTransport",
    "check_differential",
    "replay",
]
