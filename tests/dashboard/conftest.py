"""Fixtures for the dashboard's tests: a real SQLite file or a queue of the
suite's real PostgreSQL server (``session_server``, shared with
tests/postgres and tests/worker), and the dashboard served for real by
uvicorn on a free loopback port.  ``LEASEQUEUE_SKIP_POSTGRES=1`` skips the
PostgreSQL variants on purpose, as everywhere in the suite."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from dashboard_helpers import Served, open_postgres  # noqa: E402

from leasequeue.testing._postgres_server import session_server  # noqa: E402

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(scope="session")
def dash_pg_conninfo() -> Iterator[str]:
    with session_server() as server:
        yield server.conninfo


@pytest.fixture(params=BACKENDS)
def make_transport(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Factory of transports of one backend (each test: a file or queue of its own); closed at teardown."""
    made: List[Any] = []
    name = f"t_{uuid.uuid4().hex[:16]}"

    if request.param == "postgres":
        conninfo = request.getfixturevalue("dash_pg_conninfo")

        def make(**kwargs: Any) -> Any:
            t = open_postgres(conninfo, name, **kwargs)
            made.append(t)
            return t
    else:
        from leasequeue import SQLiteTransport

        def make(**kwargs: Any) -> Any:
            t = SQLiteTransport(tmp_path / "queue.db", **kwargs)
            made.append(t)
            return t

    make.backend = request.param  # type: ignore[attr-defined]
    yield make
    for t in made:
        t.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Any], Served]]:
    """``serve(asgi_app)`` -> a ``Served`` dashboard; stopped at teardown."""
    running: List[Served] = []

    def start(asgi: Any) -> Served:
        s = Served(asgi)
        running.append(s)
        return s

    yield start
    for s in running:
        s.stop()
