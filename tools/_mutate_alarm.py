"""pytest plugin for tools/mutate.py: a mutant's test that runs too long fails.

With ``MUTATE_TEST_TIMEOUT`` set (seconds, from ``--test-timeout``), each
test's call is given that long (``SIGALRM``, main thread, POSIX only); past
it the test fails with a marker that mutate.py reports as a *timeout* (an
endless loop).  One hung test then costs that many seconds instead of the
whole mutant's ``--timeout``, and the other tests of the subset still run
for mutants that merely pass slowly.  Unset or 0: nothing happens (the
baseline never sets it).
"""

from __future__ import annotations

import os
import signal
from typing import Any, Generator

import pytest

LIMIT = int(os.environ.get("MUTATE_TEST_TIMEOUT", "0") or 0)
MARKER = "MUTATE-TEST-TIMEOUT"


class MutateTestTimeout(Exception):
    pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any) -> Generator[None, None, None]:
    if LIMIT <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise MutateTestTimeout(f"{MARKER}: {item.nodeid} ran over {LIMIT} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(LIMIT)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
