"""``leasequeue.testing``: the contract as something a test suite can run.

For anyone who writes a transport -- leasequeue's own in-memory ones, the
durable backends, or a workflow engine's own -- and wants to know that it
obeys the same rules (``docs/contract.md``, ``docs/testing-your-backend.md``):

* ``ManualClock``: a clock to inject, advanced by hand (and made to
  misbehave on demand).
* ``ReferenceTransport``: the seed's algorithm, literally -- a list of
  messages sorted on every claim -- with the SPEC's fencing and round-robin
  rule: slow, obviously right, the referee.
* ``check_differential(make_transport, ops=..., seed=...)``: your transport
  and the reference under the same random operations; at the first
  difference, an ``AssertionError`` with a shrunk, runnable reproduction.
* ``TransportContract``: a pytest test class to subclass, one test per rule
  of the contract, with capability flags for what a backend does not promise.

Importing this package needs neither pytest nor hypothesis.
``TransportContract`` is loaded on first use, and only then needs pytest: a
missing pytest is a clear ``ImportError`` at that point.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ._clock import ManualClock
from ._differential import DifferentialFailure, DifferentialSummary, check_differential, replay
from ._reference import ReferenceLease, ReferenceTransport

if TYPE_CHECKING:
    from ._contract import TransportContract

__all__ = [
    "DifferentialFailure",
    "DifferentialSummary",
    "ManualClock",
    "ReferenceLease",
    "ReferenceTransport",
    "TransportContract",
    "check_differential",
    "replay",
]

#: The modules of ``TransportContract``: pytest rewrites their ``assert``
#: statements (so a failing rule shows the values it compared) when they are
#: registered before they are imported.
_CONTRACT_MODULES = [
    f"{__name__}.{name}"
    for name in (
        "_contract",
        "_contract_base",
        "_rules_core",
        "_rules_bad_input",
        "_rules_waiting",
        "_rules_control",
        "_rules_batches",
        "_rules_quarantine",
        "_rules_ack_and_claim",
        "_rules_later",
        "_rules_once",
        "_rules_attempts",
        "_rules_transactions",
    )
]


def _register_assert_rewrite(pytest: Any) -> None:
    names = [name for name in _CONTRACT_MODULES if name not in sys.modules]
    if names:
        pytest.register_assert_rewrite(*names)


if "pytest" in sys.modules and sys.modules["pytest"] is not None:  # imported by a test run
    _register_assert_rewrite(sys.modules["pytest"])


def __getattr__(name: str) -> Any:
    if name == "TransportContract":
        try:
            import pytest
        except ImportError as exc:
            raise ImportError(
                "leasequeue.testing.TransportContract is a pytest test class and needs pytest: "
                "pip install pytest"
            ) from exc
        _register_assert_rewrite(pytest)
        from ._contract import TransportContract

        return TransportContract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
