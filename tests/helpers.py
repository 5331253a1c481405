"""Shared test helpers (imported by the tests; not a test module)."""

from __future__ import annotations

import sys
import threading
from typing import List


class FakeClock:
    """A manual clock: ``clock()`` returns ``now``; tests move it by hand.

    Thread-safe enough for stress tests: reads and ``advance`` take a lock.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self.now = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self.now += seconds
            return self.now

    def set(self, value: float) -> None:
        with self._lock:
            self.now = float(value)


#: CPython runs ``__del__`` the moment the last reference goes, and has
#: tracemalloc and ``gc.set_threshold`` semantics the fault tests rely on;
#: PyPy runs finalisers whenever its collector gets to them.
CPYTHON_ONLY_REASON = "relies on CPython's reference counting / gc / tracemalloc semantics"
IS_CPYTHON = sys.implementation.name == "cpython"


#: Runs first in a child interpreter: when the test run measures coverage
#: (tests/coverage_floor.py sets COVERAGE_PROCESS_START), the child does too.
_CHILD_COVERAGE = """\
import os as _os
if _os.environ.get("COVERAGE_PROCESS_START"):
    import coverage as _coverage
    _coverage.process_startup()
del _os
"""


def python_argv(code: str) -> List[str]:
    """``[sys.executable, "-c", ...]`` running ``code`` in a child interpreter,
    measured by coverage when the test run is."""
    return [sys.executable, "-c", _CHILD_COVERAGE + code]
