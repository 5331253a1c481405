"""Fixtures for the PostgreSQL backend's tests: a real server, never a mock.

``LEASEQUEUE_TEST_POSTGRES`` (a conninfo) points the tests at a running
server; without it the session starts a throwaway one (initdb into a
temporary directory, a Unix socket there and a free loopback port) and stops
it at the end, also when tests fail: ``session_server`` of
``leasequeue.testing._postgres_server``, the one server of this process,
shared with the worker's tests (``tests/worker/conftest.py``).  A test that needs the server *fails*
when none can be had; only ``LEASEQUEUE_SKIP_POSTGRES=1`` skips them, on
purpose.  Every test works in queues of its own (``queue_name``), so tests
run in any order.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Iterator, List, Optional

import pytest

from leasequeue.testing._postgres_server import TEST_ENV, SessionServer, session_server, skipped_on_purpose

SKIP = skipped_on_purpose()

if SKIP:
    # Not even collected: these modules import psycopg, which a machine
    # without PostgreSQL (a wheel-test runner) may not have.
    collect_ignore_glob = ["test_pg_*.py"]


def pytest_report_header(config: Any) -> str:
    if SKIP:
        return "PostgreSQL tests: skipped on purpose (LEASEQUEUE_SKIP_POSTGRES=1)"
    where = os.environ.get(TEST_ENV) or "a throwaway server started by the session"
    return f"PostgreSQL tests: against {where}"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[SessionServer]:
    with session_server() as server:
        yield server


@pytest.fixture
def own_server(pg_server: SessionServer) -> SessionServer:
    """A server this session controls (restart), for the crash tests."""
    if pg_server.owned is None:
        pytest.fail("this test restarts the server: run it with a throwaway server (unset LEASEQUEUE_TEST_POSTGRES)")
    return pg_server


@pytest.fixture(scope="session")
def conninfo(pg_server: SessionServer) -> str:
    return pg_server.conninfo


@pytest.fixture
def queue_name(conninfo: str) -> str:
    """A new queue of this test's own (created: opening a missing one fails)."""
    from leasequeue import PostgresTransport

    name = f"t_{uuid.uuid4().hex[:16]}"
    PostgresTransport.create_queue(conninfo, name)
    return name


@pytest.fixture
def make_pg(conninfo: str) -> Iterator[Callable[..., Any]]:
    """Factory: ``make_pg(queue=..., clock=..., serializer=...)``; closed at teardown."""
    from leasequeue import PostgresTransport

    made: List[Any] = []

    def make(queue: Optional[str] = None, **kwargs: Any) -> Any:
        if queue is None:
            queue = f"t_{uuid.uuid4().hex[:16]}"
            PostgresTransport.create_queue(conninfo, queue)
        t = PostgresTransport(conninfo, queue=queue, **kwargs)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


@pytest.fixture
def pg(make_pg: Callable[..., Any]) -> Any:
    """A transport on a fresh queue with the server's clock."""
    return make_pg()
