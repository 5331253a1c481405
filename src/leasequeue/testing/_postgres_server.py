"""A throwaway PostgreSQL server for tests and benchmarks (not for production).

``ThrowawayServer`` finds ``initdb`` / ``pg_ctl`` (``PATH``, ``LEASEQUEUE_PG_BIN``
or ``/usr/lib/postgresql/*/bin``), runs ``initdb`` into a temporary directory
(as the ``postgres`` user through ``runuser`` when running as root, since
initdb refuses root), starts the server on a Unix socket in that directory
and a free loopback TCP port, and stops it (``pg_ctl stop -m immediate``) and
removes the directory on ``stop()``.  ``restart_immediate()`` is the crash
the fault tests need: ``pg_ctl restart -m immediate``.

``settings={"name": "value"}`` adds server settings (profiling:
``shared_preload_libraries=pg_stat_statements``).  ``fsync=False`` starts it
with ``fsync=off``, for tests: a commit still
writes its WAL to the kernel before it returns (``synchronous_commit``
stays on), so a crashed or killed server process (``-m immediate``,
``SIGKILL``) loses nothing; only an operating-system crash could.  The
benchmarks keep the default, ``fsync=on``.

``session_server()`` is the one server of a test session, for the pytest
fixtures of every test folder that needs PostgreSQL (``tests/postgres``,
``tests/worker``): the one ``LEASEQUEUE_TEST_POSTGRES`` names, else a
throwaway one started on first use in this process and stopped when its
last user leaves, so each pytest-xdist worker (a process) has its own.

Run as a module it starts a server and prints its conninfo, for ``.ci/run``::

    python -m leasequeue.testing._postgres_server start DIR   # prints the conninfo
    python -m leasequeue.testing._postgres_server stop DIR
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Dict, Iterator, List, Optional

__all__ = ["SKIP_ENV", "TEST_ENV", "SessionServer", "ThrowawayServer", "find_bin", "session_server",
           "skipped_on_purpose"]

#: ``1``: the PostgreSQL tests are skipped on purpose (a machine without PostgreSQL).
SKIP_ENV = "LEASEQUEUE_SKIP_POSTGRES"
#: A conninfo: the tests use that running server instead of a throwaway one.
TEST_ENV = "LEASEQUEUE_TEST_POSTGRES"


def find_bin(name: str) -> Optional[str]:
    """The path of a PostgreSQL server program, or None."""
    explicit = os.environ.get("LEASEQUEUE_PG_BIN")
    if explicit:
        path = os.path.join(explicit, name)
        return path if os.access(path, os.X_OK) else None
    # Debian's versioned directories first: /usr/bin has only wrappers there.
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        path = os.path.join(directory, name)
        if os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayServer:
    """One PostgreSQL cluster in a temporary directory, owned by this object."""

    def __init__(self, base: Optional[str] = None, *, fsync: bool = True,
                 settings: Optional[Dict[str, str]] = None) -> None:
        initdb = find_bin("initdb")
        pg_ctl = find_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise RuntimeError(
                "PostgreSQL server programs (initdb, pg_ctl) not found: install PostgreSQL "
                "(Debian: apt-get install postgresql) or set LEASEQUEUE_TEST_POSTGRES to a conninfo"
            )
        self.initdb = initdb
        self.pg_ctl = pg_ctl
        self.dir = base or tempfile.mkdtemp(prefix="leasequeue-pg-")
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")
        self.port = 0
        self.as_postgres = hasattr(os, "geteuid") and os.geteuid() == 0
        self.user = "postgres" if self.as_postgres else None
        self.started = False
        self.fsync = fsync
        #: extra server settings (``-c name=value``), e.g. for profiling
        #: ``{"shared_preload_libraries": "pg_stat_statements"}``
        self.settings = dict(settings or {})

    # ------------------------------------------------------------------ run

    def _run(self, argv: List[str], check: bool = True) -> subprocess.CompletedProcess:
        if self.as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=120)

    @property
    def conninfo(self) -> str:
        user = f" user={self.user}" if self.user else ""
        return f"host=127.0.0.1 port={self.port} dbname=postgres{user}"

    @property
    def socket_conninfo(self) -> str:
        user = f" user={self.user}" if self.user else ""
        return f"host={self.dir} port={self.port} dbname=postgres{user}"

    def start(self) -> str:
        """initdb, start, and return the TCP conninfo."""
        if self.as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        os.chmod(self.dir, 0o755)
        if not os.path.exists(os.path.join(self.data, "PG_VERSION")):
            try:
                self._run([self.initdb, "-D", self.data, "-A", "trust", "-U", self.user or _login(),
                           "--no-sync", "-E", "UTF8", "--locale=C"])
            except subprocess.CalledProcessError as exc:
                raise RuntimeError(f"initdb failed: {exc.stderr.strip()}") from None
        # A free port can be taken between _free_port() and the server's bind
        # (several test processes start servers at once under pytest-xdist):
        # then the start fails with "could not bind" and is tried on another.
        for attempt in range(5):
            self.port = _free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.dir} "
                "-c max_connections=200 -c shared_buffers=128MB"
            )
            if not self.fsync:
                options += " -c fsync=off"
            for name, value in self.settings.items():
                options += f" -c {name}={value}"
            logged = os.path.getsize(self.log) if os.path.exists(self.log) else 0
            try:
                self._run([self.pg_ctl, "-D", self.data, "-l", self.log, "-w", "-t", "60", "-o", options, "start"])
            except subprocess.CalledProcessError as exc:
                if attempt < 4 and "could not bind" in self._tail(since=logged):
                    continue
                raise RuntimeError(f"pg_ctl start failed: {exc.stderr.strip()}\n{self._tail()}") from None
            break
        self.started = True
        return self.conninfo

    def restart_immediate(self) -> None:
        """Crash and restart the server: ``pg_ctl restart -m immediate``."""
        self._run([self.pg_ctl, "-D", self.data, "-l", self.log, "-w", "-t", "60", "-m", "immediate", "restart"])

    def stop(self) -> None:
        """Stop the server (if started) and remove its directory."""
        if self.started:
            self._run([self.pg_ctl, "-D", self.data, "-m", "immediate", "-w", "stop"], check=False)
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def _tail(self, since: int = 0) -> str:
        """The end of the server's log (of what it wrote after byte ``since``)."""
        try:
            with open(self.log, errors="replace") as f:
                f.seek(since)
                return f.read()[-2000:]
        except OSError:
            return ""

    def __enter__(self) -> "ThrowawayServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def skipped_on_purpose() -> bool:
    """True when ``LEASEQUEUE_SKIP_POSTGRES=1`` asks to skip the PostgreSQL tests."""
    return os.environ.get(SKIP_ENV) == "1"


class SessionServer:
    """The test session's server: its conninfo, and (when this process
    started it) the ``ThrowawayServer`` that controls it (``owned``; None
    for ``LEASEQUEUE_TEST_POSTGRES``)."""

    def __init__(self, conninfo: str, owned: Optional[ThrowawayServer]) -> None:
        self.conninfo = conninfo
        self.owned = owned


_shared_lock = threading.Lock()
_shared: Optional[SessionServer] = None
_shared_users = 0


@contextlib.contextmanager
def session_server() -> Iterator[SessionServer]:
    """The server of this test process, with the leasequeue schema installed,
    for a session-scoped pytest fixture (``with session_server() as server:
    yield ...``).

    ``LEASEQUEUE_SKIP_POSTGRES=1`` skips the test that asks for it
    (``pytest.skip``): the only way to do without PostgreSQL.  Otherwise a
    missing psycopg or a server that cannot be started *fails* it.  The
    server is ``LEASEQUEUE_TEST_POSTGRES``'s, else a throwaway one (``fsync=off``:
    a commit still reaches the kernel before it returns, so the crash tests
    -- SIGKILL, ``pg_ctl restart -m immediate`` -- lose nothing; it just
    does not wait for the disk) started by the first user in this process
    and stopped when the last one leaves: every fixture built on this shares
    one server per process, and each pytest-xdist worker has its own.
    """
    import pytest

    global _shared, _shared_users
    if skipped_on_purpose():
        pytest.skip(f"{SKIP_ENV}=1: PostgreSQL tests skipped on purpose")
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"psycopg is not installed (pip install '.[test]', or set {SKIP_ENV}=1): {exc}")
    with _shared_lock:
        if _shared is None:
            _shared = _start_session_server()
        _shared_users += 1
        server = _shared
    try:
        yield server
    finally:
        with _shared_lock:
            _shared_users -= 1
            if _shared_users == 0:
                _shared = None
                if server.owned is not None:
                    server.owned.stop()


def _start_session_server() -> SessionServer:
    import pytest

    from leasequeue import PostgresTransport

    conninfo = os.environ.get(TEST_ENV)
    owned: Optional[ThrowawayServer] = None
    if not conninfo:
        try:
            owned = ThrowawayServer(fsync=False)
            conninfo = owned.start()
        except Exception as exc:
            if owned is not None:
                owned.stop()
            pytest.fail(f"no PostgreSQL server could be started (set {TEST_ENV}?): {exc}")
    try:
        PostgresTransport.install(conninfo)
    except BaseException:
        if owned is not None:
            owned.stop()
        raise
    return SessionServer(conninfo, owned)


def _login() -> str:
    import getpass

    return getpass.getuser()


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("start", "stop"):
        print("usage: python -m leasequeue.testing._postgres_server start|stop DIR", file=sys.stderr)
        return 2
    os.makedirs(args[1], exist_ok=True)
    server = ThrowawayServer(args[1])
    if args[0] == "start":
        print(server.start())
    else:
        server.started = True
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
