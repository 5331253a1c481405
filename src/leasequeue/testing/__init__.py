"""leasequeue.testing: the conformance kit, for leasequeue and for any backend.

An engine author who writes a transport of their own (SQLite, PostgreSQL,
Redis, ...) checks it against the same rules leasequeue's transports obey:

* ``ManualClock``: a clock to inject, advanced by hand.
* ``TransportContract``: a pytest test class to subclass, one test per rule
  of the contract, with capability flags for what a backend does not promise
  (see ``docs/testing-your-backend.md``).

This package imports without pytest.  ``TransportContract`` is loaded on
first use, and only then needs pytest: a missing pytest is a clear
``ImportError`` at that point, not when the package is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._clock import ManualClock

if TYPE_CHECKING:
    from ._contract import TransportContract

__all__ = ["ManualClock", "TransportContract"]


def __getattr__(name: str) -> Any:
    if name == "TransportContract":
        try:
            import pytest  # noqa: F401  (only to give a clear message)
        except ImportError as exc:
            raise ImportError(
                "leasequeue.testing.TransportContract is a pytest test class and needs pytest: "
                "pip install pytest"
            ) from exc
        from ._contract import TransportContract

        return TransportContract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
