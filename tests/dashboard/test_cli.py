"""``leasequeue dashboard`` in a real process: it serves, it stops on
SIGINT, and it refuses what it must refuse with one line on stderr."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from dashboard_helpers import free_port, open_postgres

from leasequeue import SQLiteTransport


def _env(**extra: str) -> Dict[str, str]:
    """This environment without coverage or credentials of its own, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("LEASEQUEUE_COVERAGE", "LEASEQUEUE_DASHBOARD_AUTH")}
    env.update(extra)
    return env


def run(*args: str, env: Optional[Dict[str, str]] = None) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "leasequeue", "dashboard", *args], capture_output=True, text=True,
                          timeout=60, env=env or _env())


class Server:
    """``leasequeue dashboard ARGS --port P`` until ``stop()``."""

    def __init__(self, args: List[str], env: Optional[Dict[str, str]] = None) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "leasequeue", "dashboard", *args, "--port",
                                      str(self.port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env or _env())

    def get(self, path: str, headers: Optional[Dict[str, str]] = None) -> Any:
        deadline = time.monotonic() + 30
        while True:
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers=headers or {})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    return resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()
            except (urllib.error.URLError, ConnectionError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the dashboard did not start: {self.stop()}") from None
                time.sleep(0.1)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=30)
        return err


def test_serves_a_sqlite_queue(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    with SQLiteTransport(path) as t:
        t.publish("g", "hello")
    server = Server(["--sqlite", str(path)])
    try:
        assert server.get("/api/stats") == (200, {"messages": 1, "groups": 1, "leased": 0, "parked": 0,
                                                  "paused": 0, "buried": 0, "scheduled": 0})
        status, data = server.get("/api/groups/g")
        assert status == 200 and data["messages"][0]["event"] == "hello"
        # DNS rebinding: another site's name pointed at 127.0.0.1 is refused.
        for host in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example"):
            status, body = server.get("/", headers={"Host": host})
            assert status == 400 and "loopback Host" in body, host
        for host in (f"localhost:{server.port}", "127.0.0.1", f"[::1]:{server.port}"):
            assert server.get("/api/stats", headers={"Host": host})[0] == 200, host
    finally:
        err = server.stop()
    assert server.proc.returncode == 0, err
    assert "serving http://127.0.0.1:" in err


def test_serves_a_postgres_queue(dash_pg_conninfo: str) -> None:
    name = f"d_{uuid.uuid4().hex[:12]}"
    t = open_postgres(dash_pg_conninfo, name)
    try:
        t.publish("g", {"x": 1})
    finally:
        t.close()
    server = Server(["--postgres", dash_pg_conninfo, "--queue", name, "--serializer", "pickle"])
    try:
        status, data = server.get("/api/stats")
        assert status == 200 and data["messages"] == 1
    finally:
        err = server.stop()
    assert server.proc.returncode == 0, err


def test_auth_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    SQLiteTransport(path).close()
    server = Server(["--sqlite", str(path)], env=_env(LEASEQUEUE_DASHBOARD_AUTH="ops:pw"))
    try:
        status, _ = server.get("/api/stats")
        assert status == 401
        creds = base64.b64encode(b"ops:pw").decode()
        status, data = server.get("/api/stats", headers={"Authorization": f"Basic {creds}"})
        assert status == 200 and data["messages"] == 0
    finally:
        server.stop()


def _one_line(r: "subprocess.CompletedProcess[str]", status: int) -> str:
    assert r.returncode == status, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("leasequeue dashboard: error: "), lines[0]
    return lines[0]


def test_refuses_a_non_loopback_host_without_read_only_or_auth(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    SQLiteTransport(path).close()
    for host in ("0.0.0.0", "::", "192.0.2.7", "example.org"):
        line = _one_line(run("--sqlite", str(path), "--host", host), 2)
        assert "--read-only" in line and "LEASEQUEUE_DASHBOARD_AUTH" in line, line
    line = _one_line(run("--sqlite", str(path), env=_env(LEASEQUEUE_DASHBOARD_AUTH="no-colon")), 2)
    assert "user:password" in line


def test_one_line_errors(tmp_path: Path) -> None:
    line = _one_line(run("--sqlite", str(tmp_path / "missing.db")), 1)
    assert "no such file" in line
    assert not (tmp_path / "missing.db").exists()
    r = run("--sqlite", str(tmp_path / "x.db"), "--port", "99999")
    assert r.returncode == 2 and "not a port number" in r.stderr
    r = run("--sqlite", str(tmp_path / "x.db"), "--serializer", "nonsense")
    assert r.returncode == 2 and "unknown serializer" in r.stderr


def test_a_postgres_queue_that_does_not_exist(dash_pg_conninfo: str) -> None:
    from leasequeue import PostgresTransport

    if not hasattr(PostgresTransport, "create_queue"):
        pytest.skip("this version makes a PostgreSQL queue when it is opened (no QueueNotFound yet)")
    name = f"nf_{uuid.uuid4().hex[:12]}"
    line = _one_line(run("--postgres", dash_pg_conninfo, "--queue", name), 1)
    assert f"queue {name!r} does not exist" in line
    assert name not in [q for q, _stats in PostgresTransport.list_queues(dash_pg_conninfo)]


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "q.db"
    SQLiteTransport(path).close()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _one_line(run("--sqlite", str(path), "--port", str(port)), 1)
    assert f"cannot listen on 127.0.0.1:{port}" in line


def test_port_zero_says_which_port(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    SQLiteTransport(path).close()
    proc = subprocess.Popen([sys.executable, "-m", "leasequeue", "dashboard", "--sqlite", str(path), "--port", "0",
                             "--read-only"], stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("leasequeue dashboard: serving http://127.0.0.1:") and "read-only" in line, line
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        assert port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/stats", timeout=10) as resp:
            assert json.loads(resp.read())["messages"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
