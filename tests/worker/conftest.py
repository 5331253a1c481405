"""Fixtures of the worker's tests: every transport, with the real clock.

``backend`` runs a test on both in-memory twins, a real SQLite file and the
suite's PostgreSQL.  The PostgreSQL server is the one ``LEASEQUEUE_TEST_POSTGRES``
names, else a throwaway one started once per session here (as
``tests/postgres/conftest.py`` does; its fixtures are not visible from this
folder).  ``LEASEQUEUE_SKIP_POSTGRES=1`` skips the PostgreSQL variants on purpose.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import pytest

from worker_helpers import Running, load_implementation

SKIP_PG = os.environ.get("LEASEQUEUE_SKIP_POSTGRES") == "1"
BACKENDS = ("python", "cython", "sqlite", "postgres")
INMEMORY = ("python", "cython")


@pytest.fixture(scope="session")
def worker_pg_conninfo() -> Iterator[str]:
    if SKIP_PG:
        pytest.skip("LEASEQUEUE_SKIP_POSTGRES=1: PostgreSQL tests skipped on purpose")
    from leasequeue import PostgresTransport
    from leasequeue.bench.worker import ThrowawayServer  # wherever the tree keeps it

    conninfo = os.environ.get("LEASEQUEUE_TEST_POSTGRES")
    owned: Optional[ThrowawayServer] = None
    if not conninfo:
        try:
            owned = ThrowawayServer(fsync=False)
            conninfo = owned.start()
        except Exception as exc:
            if owned is not None:
                owned.stop()
            pytest.fail(f"no PostgreSQL server could be started (set LEASEQUEUE_TEST_POSTGRES?): {exc}")
    try:
        PostgresTransport.install(conninfo)
        yield conninfo
    finally:
        if owned is not None:
            owned.stop()


class Backend:
    """Makes transports of one kind; ``open_again()`` opens the same queue anew."""

    def __init__(self, name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.name = name
        self._request = request
        self.path = str(tmp_path / "queue.db")
        self.queue = f"w_{uuid.uuid4().hex[:12]}"
        self.conninfo: Optional[str] = None
        self.made: List[Any] = []
        self._first: Any = None

    @property
    def durable(self) -> bool:
        return self.name in ("sqlite", "postgres")

    def make(self) -> Any:
        """The first call makes the queue; later calls: the in-memory one
        again, a new connection to the durable one."""
        if self.name in INMEMORY:
            if self._first is None:
                self._first = load_implementation(self.name).InMemoryTransport()
                self.made.append(self._first)
            return self._first
        if self.name == "sqlite":
            from leasequeue import SQLiteTransport

            t = SQLiteTransport(self.path)
        else:
            from leasequeue import PostgresTransport

            if self.conninfo is None:
                self.conninfo = self._request.getfixturevalue("worker_pg_conninfo")
            t = PostgresTransport(self.conninfo, queue=self.queue)
        self.made.append(t)
        return t

    def cli_args(self) -> List[str]:
        """The command line's transport arguments for this queue."""
        if self.name == "sqlite":
            return ["--sqlite", self.path]
        if self.name == "postgres":
            if self.conninfo is None:
                self.conninfo = self._request.getfixturevalue("worker_pg_conninfo")
            return ["--postgres", self.conninfo, "--queue", self.queue]
        raise ValueError("the command line runs on durable transports only")

    def close(self) -> None:
        for t in self.made:
            try:
                t.close()
            except Exception:
                pass


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = Backend(request.param, request, tmp_path)
    yield b
    b.close()


@pytest.fixture(params=INMEMORY)
def inmemory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = Backend(request.param, request, tmp_path)
    yield b
    b.close()


@pytest.fixture
def sqlite_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = Backend("sqlite", request, tmp_path)
    yield b
    b.close()


@pytest.fixture(params=("sqlite", "postgres"))
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = Backend(request.param, request, tmp_path)
    yield b
    b.close()


@pytest.fixture
def start() -> Iterator[Callable[[Any, str], Running]]:
    """``start(worker, "threads" | "asyncio")``: run it in the background; stopped at teardown."""
    running: List[Running] = []

    def go(worker: Any, runner: str = "threads") -> Running:
        r = Running(worker, runner)
        running.append(r)
        return r

    yield go
    for r in running:
        r.worker.stop(force=True)
        r.thread.join(10)
