"""One fixture over both implementations (multidict's pattern).

Every behavioural test takes ``impl`` (the implementation module), or the
``transport_cls`` / ``transport`` fixtures built on it, so it runs against
the pure-Python and the Cython transport alike.  When the extension should
have been built but does not import, the Cython variants *fail*; they are
skipped only when ``LEASEQUEUE_NO_EXTENSIONS`` asks for a pure-only run.

In parallel: ``parallel.py`` (a plugin, registered below) runs a plain
``python -m pytest`` on every core with pytest-xdist (in the ``test``
extra), and keeps the tests marked ``serial`` one after the other on one
worker; ``-n 0`` or ``-p no:xdist`` runs everything in this one process.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, Callable, Iterator

import pytest

# First: when asked for (tools/coverage.sh), coverage must start before this
# file imports leasequeue, or the modules' top-level lines count as missed.
import coverage_floor  # noqa: F401  (also registered below, as a plugin)
from leasequeue.testing import ManualClock

#: Branch coverage of the pure twin, with a floor: on in CI (.ci/run), opt-in elsewhere (tools/coverage.sh).
pytest_plugins = ["coverage_floor", "parallel"]

IMPLEMENTATIONS = ("python", "cython")
MODULES = {
    "python": "leasequeue._backends.inmemory.transport_py",
    "cython": "leasequeue._backends.inmemory.transport_c",
}


def load_implementation(name: str) -> ModuleType:
    try:
        return importlib.import_module(MODULES[name])
    except ImportError as exc:
        if name == "cython" and os.environ.get("LEASEQUEUE_NO_EXTENSIONS"):
            pytest.skip("Cython transport disabled by LEASEQUEUE_NO_EXTENSIONS")
        pytest.fail(f"the {name} implementation did not import: {exc!r}")


@pytest.fixture(scope="session", params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> ModuleType:
    """The implementation module: ``leasequeue._backends.inmemory.transport_py`` or ``transport_c``."""
    return load_implementation(request.param)


@pytest.fixture
def transport_cls(impl: ModuleType) -> Any:
    return impl.InMemoryTransport


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def transport(transport_cls: Any, clock: ManualClock) -> Iterator[Any]:
    with transport_cls(clock=clock) as t:
        yield t


@pytest.fixture
def make_transport(transport_cls: Any) -> Callable[..., Any]:
    """Factory: ``make_transport(clock=...)`` for tests needing several."""
    return transport_cls
