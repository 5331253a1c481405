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

Run as a module it starts a server and prints its conninfo, for ``.ci/run``::

    python -m leasequeue.testing._postgres_server start DIR   # prints the conninfo
    python -m leasequeue.testing._postgres_server stop DIR
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

__all__ = ["ThrowawayServer", "find_bin"]


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
