"""Fixtures of the worker's tests: every transport, with the real clock.

``backend`` runs a test on both in-memory twins, a real SQLite file and the
suite's PostgreSQL: the one server of this test process
(``leasequeue.testing._postgres_server.session_server``, shared with
``tests/postgres``): ``LEASEQUEUE_TEST_POSTGRES``'s, else a throwaway one.
``LEASEQUEUE_SKIP_POSTGRES=1`` skips the PostgreSQL variants on purpose
(psycopg is then not imported at all).

Each in-memory twin also brings its thread runner fast path, as an install
does: ``python`` the pure ``ThreadRunner.fast`` (``fastpath.COMPILED`` set
to ``None`` for the test), ``cython`` the compiled ``_fastpath`` (a failure,
not a skip, where it was not built, unless ``LEASEQUEUE_NO_EXTENSIONS`` is
set); so every test on ``backend`` or ``inmemory`` runs both fast paths.
The durable backends run what the build has (the compiled one).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import pytest

from leasequeue.testing._postgres_server import session_server
from worker_helpers import Running, load_implementation, use_fast_path

BACKENDS = ("python", "cython", "sqlite", "postgres")
INMEMORY = ("python", "cython")


@pytest.fixture(scope="session")
def worker_pg_conninfo() -> Iterator[str]:
    with session_server() as server:
        yield server.conninfo


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
            if self.conninfo is None:
                # First: it skips (LEASEQUEUE_SKIP_POSTGRES=1) before psycopg is imported.
                self.conninfo = self._request.getfixturevalue("worker_pg_conninfo")
            from leasequeue import PostgresTransport

            PostgresTransport.create_queue(self.conninfo, self.queue)  # only made queues open
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
            from leasequeue import PostgresTransport

            PostgresTransport.create_queue(self.conninfo, self.queue)  # only made queues open
            return ["--postgres", self.conninfo, "--queue", self.queue]
        raise ValueError("the command line runs on durable transports only")

    def close(self) -> None:
        for t in self.made:
            try:
                t.close()
            except Exception:
                pass


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    if request.param in INMEMORY:
        use_fast_path(request.param, monkeypatch)
    b = Backend(request.param, request, tmp_path)
    yield b
    b.close()


@pytest.fixture(params=INMEMORY)
def inmemory(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    use_fast_path(request.param, monkeypatch)
    b = Backend(request.param, request, tmp_path)
    yield b
    b.close()


@pytest.fixture(params=INMEMORY)
def fast_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both thread runner fast paths for a test on a durable backend
    (``python``: the pure ``ThreadRunner.fast``; ``cython``: the compiled one)."""
    use_fast_path(request.param, monkeypatch)
    return str(request.param)


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
