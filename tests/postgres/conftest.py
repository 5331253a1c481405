"""Fixtures for the PostgreSQL backend's tests: a real server, never a mock.

``LEASEQUEUE_TEST_POSTGRES`` (a conninfo) points the tests at a running
server; without it the session starts a throwaway one (initdb into a
temporary directory, a Unix socket there and a free loopback port) and stops
it at the end, also when tests fail.  A test that needs the server *fails*
when none can be had; only ``LEASEQUEUE_SKIP_POSTGRES=1`` skips them, on
purpose.  Every test works in queues of its own (``queue_name``), so tests
run in any order.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Iterator, List, Optional

import pytest

SKIP = os.environ.get("LEASEQUEUE_SKIP_POSTGRES") == "1"

if SKIP:
    # Not even collected: these modules import psycopg, which a machine
    # without PostgreSQL (a wheel-test runner) may not have.
    collect_ignore_glob = ["test_pg_*.py"]


def pytest_report_header(config: Any) -> str:
    if SKIP:
        return "PostgreSQL tests: skipped on purpose (LEASEQUEUE_SKIP_POSTGRES=1)"
    where = os.environ.get("LEASEQUEUE_TEST_POSTGRES") or "a throwaway server started by the session"
    return f"PostgreSQL tests: against {where}"


class Server:
    """The session's server: its conninfo, and (when we started it) control."""

    def __init__(self, conninfo: str, owned: Any) -> None:
        self.conninfo = conninfo
        self.owned = owned  # a ThrowawayServer, or None for LEASEQUEUE_TEST_POSTGRES


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    if SKIP:
        pytest.skip("LEASEQUEUE_SKIP_POSTGRES=1: PostgreSQL tests skipped on purpose")
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"psycopg is not installed (pip install '.[test]'): {exc}")
    from leasequeue import PostgresTransport
    from leasequeue.testing._postgres_server import ThrowawayServer

    conninfo = os.environ.get("LEASEQUEUE_TEST_POSTGRES")
    owned: Optional[ThrowawayServer] = None
    if not conninfo:
        try:
            # fsync=off: a commit still reaches the kernel before it returns,
            # so the crash tests (SIGKILL, pg_ctl restart -m immediate) lose
            # nothing; each commit just does not wait for the disk (5 ms ->
            # 0.5 ms a commit on the CI machine).
            owned = ThrowawayServer(fsync=False)
            conninfo = owned.start()
        except Exception as exc:
            if owned is not None:
                owned.stop()
            pytest.fail(f"no PostgreSQL server could be started (set LEASEQUEUE_TEST_POSTGRES?): {exc}")
    try:
        PostgresTransport.install(conninfo)
        yield Server(conninfo, owned)
    finally:
        if owned is not None:
            owned.stop()


@pytest.fixture
def own_server(pg_server: Server) -> Server:
    """A server this session controls (restart), for the crash tests."""
    if pg_server.owned is None:
        pytest.fail("this test restarts the server: run it with a throwaway server (unset LEASEQUEUE_TEST_POSTGRES)")
    return pg_server


@pytest.fixture(scope="session")
def conninfo(pg_server: Server) -> str:
    return pg_server.conninfo


@pytest.fixture
def queue_name() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def make_pg(conninfo: str) -> Iterator[Callable[..., Any]]:
    """Factory: ``make_pg(queue=..., clock=..., serializer=...)``; closed at teardown."""
    from leasequeue import PostgresTransport

    made: List[Any] = []

    def make(queue: Optional[str] = None, **kwargs: Any) -> Any:
        t = PostgresTransport(conninfo, queue=queue or f"t_{uuid.uuid4().hex[:16]}", **kwargs)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


@pytest.fixture
def pg(make_pg: Callable[..., Any]) -> Any:
    """A transport on a fresh queue with the server's clock."""
    return make_pg()
