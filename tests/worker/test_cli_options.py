"""The command lines' options of 0.7 as real processes on a real SQLite file
(and the suite's PostgreSQL where a connection matters): ``--serializer``
(``json`` and ``MODULE:OBJECT``) for ``worker`` and ``queue``,
``--min-priority``, ``--drain-timeout inf``, ``--metrics-host`` and a
metrics port in use, and every anticipated error as one line on stderr
(``PROG: error: ...``) with a non-zero exit and no traceback, unless
``--log-level DEBUG``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from worker_helpers import wait_until

from leasequeue import Retry

JOBS = textwrap.dedent(
    """
    import json, os

    def record(job):
        with open(os.environ["LQ_TEST_LOG"], "a") as f:
            f.write(json.dumps([job.group_id, job.event]) + "\\n")

    # A serializer of this application: JSON text behind a tag.
    def dumps(event):
        return "v1:" + json.dumps(event)

    def loads(data):
        if isinstance(data, bytes):
            data = data.decode()
        if not data.startswith("v1:"):
            raise ValueError("not a v1 event")
        return json.loads(data[3:])

    TAGGED = (dumps, loads)

    class TaggedCodec:
        dumps = staticmethod(dumps)
        loads = staticmethod(loads)

    NOT_A_SERIALIZER = 42
    NOT_A_HANDLER = "hello"
    """
)


class Cli:
    def __init__(self, tmp_path: Path, backend: Any) -> None:
        self.dir = tmp_path
        (tmp_path / "lq_cli_jobs.py").write_text(JOBS)
        self.log = tmp_path / "log.txt"
        self.log.touch()
        self.backend = backend
        self.env = dict(os.environ, LQ_TEST_LOG=str(self.log))
        self.env.pop("LEASEQUEUE_COVERAGE", None)

    def start(self, *options: str) -> "subprocess.Popen[str]":
        cmd = [sys.executable, "-m", "leasequeue", "worker", "lq_cli_jobs:record", *self.backend.cli_args(),
               *options]
        return subprocess.Popen(cmd, cwd=self.dir, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def run(self, *args: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run([sys.executable, "-m", "leasequeue", *args], cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=60)

    def records(self) -> List[Any]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]


def _stop(proc: "subprocess.Popen[str]") -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the worker did not exit:\n{out}") from None
    assert proc.returncode == 0, out
    return out


def one_line(r: "subprocess.CompletedProcess[str]", prog: str, status: int) -> str:
    """The one stderr line of a failed run (no traceback), after ``PROG: error: ``."""
    assert r.returncode == status, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, f"not one line: {r.stderr!r}"
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert "Traceback" not in r.stderr
    return lines[0][len(prog) + len(": error: "):]


# ------------------------------------------------------------------ --serializer


def test_a_json_queue_through_the_worker_and_peek(sqlite_backend: Any, tmp_path: Path) -> None:
    from leasequeue import SQLiteTransport

    cli = Cli(tmp_path, sqlite_backend)
    t = SQLiteTransport(sqlite_backend.path, serializer="json")
    sqlite_backend.made.append(t)
    for i in range(3):
        t.publish(f"g{i}", {"n": i, "tags": ["a", "b"]})

    r = cli.run("queue", "--sqlite", sqlite_backend.path, "--serializer", "json", "peek", "g1", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert json.loads(r.stdout)[0]["event"] == {"n": 1, "tags": ["a", "b"]}

    proc = cli.start("--serializer", "json")
    try:
        wait_until(lambda: len(cli.records()) == 3, timeout=20)
    finally:
        out = _stop(proc)
    assert sorted(map(tuple, (map(json.dumps, rec) for rec in cli.records()))) == sorted(
        (json.dumps(f"g{i}"), json.dumps({"n": i, "tags": ["a", "b"]})) for i in range(3))
    assert "bytes-like" not in out
    assert t.stats().messages == 0


@pytest.mark.parametrize("spec", ["lq_cli_jobs:TAGGED", "lq_cli_jobs:TaggedCodec"])
def test_a_serializer_of_the_application(durable: Any, tmp_path: Path, spec: str) -> None:
    sys.path.insert(0, str(tmp_path))
    try:
        cli = Cli(tmp_path, durable)
        import lq_cli_jobs

        durable.make()
        if durable.name == "sqlite":
            from leasequeue import SQLiteTransport

            t = SQLiteTransport(durable.path, serializer=lq_cli_jobs.TAGGED)
        else:
            from leasequeue import PostgresTransport

            t = PostgresTransport(durable.conninfo, queue=durable.queue, serializer=lq_cli_jobs.TAGGED)
        durable.made.append(t)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("lq_cli_jobs", None)
    t.publish("g", {"tagged": True})
    r = cli.run("queue", *durable.cli_args(), "--serializer", spec, "peek", "g", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["event"] == {"tagged": True}
    proc = cli.start("--serializer", spec)
    try:
        wait_until(lambda: cli.records() == [["g", {"tagged": True}]], timeout=20)
    finally:
        _stop(proc)


# ------------------------------------------------------------------ --min-priority, --drain-timeout inf


def test_min_priority_serves_only_groups_at_or_above_it(sqlite_backend: Any, tmp_path: Path) -> None:
    cli = Cli(tmp_path, sqlite_backend)
    t = sqlite_backend.make()
    t.publish("low", "l", 1)
    t.publish("high", "h", 7)
    t.publish("edge", "e", 5)
    proc = cli.start("--min-priority", "5", "--drain-timeout", "inf")
    try:
        wait_until(lambda: len(cli.records()) == 2, timeout=20)
    finally:
        _stop(proc)  # --drain-timeout inf: a clean stop all the same
    assert sorted(g for g, _ in cli.records()) == ["edge", "high"]
    assert [g.group_id for g in t.groups()] == ["low"] and t.stats().messages == 1


# ------------------------------------------------------------------ metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_metrics_port_in_use_is_one_line_and_opens_nothing(tmp_path: Path, sqlite_backend: Any) -> None:
    cli = Cli(tmp_path, sqlite_backend)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = cli.run("worker", "lq_cli_jobs:record", "--sqlite", sqlite_backend.path, "--metrics-host", "127.0.0.1",
                    "--metrics-port", str(port))
    message = one_line(r, "leasequeue worker", 1)
    assert message.startswith(f"cannot serve metrics on 127.0.0.1:{port}: ") and "in use" in message
    assert not os.path.exists(sqlite_backend.path)  # the queue was not even opened


def test_metrics_host_binds_the_address_given(tmp_path: Path, sqlite_backend: Any) -> None:
    cli = Cli(tmp_path, sqlite_backend)
    sqlite_backend.make().publish("g", "x")
    port = _free_port()
    proc = cli.start("--metrics-host", "127.0.0.1", "--metrics-port", str(port))
    try:
        def scrape() -> Optional[str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    text: str = resp.read().decode()
            except OSError:
                return None
            done = [line for line in text.splitlines()
                    if line.startswith("leasequeue_worker_jobs_total{") and 'outcome="succeeded"' in line]
            return text if done and done[0].endswith(" 1.0") else None

        text = wait_until(scrape, timeout=20, interval=0.1)
    finally:
        out = _stop(proc)
    assert "leasequeue_worker_jobs_total" in text
    assert f"metrics on http://127.0.0.1:{port}/metrics" in out


# ------------------------------------------------------------------ one-line errors


def test_every_anticipated_worker_error_is_one_line(tmp_path: Path, sqlite_backend: Any) -> None:
    cli = Cli(tmp_path, sqlite_backend)
    db = sqlite_backend.path
    (tmp_path / "lq_broken.py").write_text("import nothing_of_that_name_xyz\n")
    (tmp_path / "not_a_db.db").write_bytes(b"this is not a SQLite file " * 100)
    w = "leasequeue worker"

    def worker(*args: str, status: int = 2) -> str:
        return one_line(cli.run("worker", *args), w, status)

    assert "MODULE:OBJECT" in worker("lq_cli_jobs", "--sqlite", db)
    assert worker("lq_broken:handle", "--sqlite", db) == (
        "cannot import 'lq_broken': No module named 'nothing_of_that_name_xyz'")
    assert "no attribute 'nope'" in worker("lq_cli_jobs:nope", "--sqlite", db)
    assert "not a handler function or a leasequeue.Task" in worker("lq_cli_jobs:NOT_A_HANDLER", "--sqlite", db)
    assert "unknown serializer 'yaml'" in worker("lq_cli_jobs:record", "--sqlite", db, "--serializer", "yaml")
    assert "not a (dumps, loads) pair" in worker("lq_cli_jobs:record", "--sqlite", db,
                                                 "--serializer", "lq_cli_jobs:NOT_A_SERIALIZER")
    assert "cannot import 'no_such_codec'" in worker("lq_cli_jobs:record", "--sqlite", db,
                                                     "--serializer", "no_such_codec:X")
    assert "must be > 0: '0'" in worker("lq_cli_jobs:record", "--sqlite", db, "--visibility", "0")
    assert "must be finite: 'inf'" in worker("lq_cli_jobs:record", "--sqlite", db, "--visibility", "inf")
    assert "must be >= 0: '-1'" in worker("lq_cli_jobs:record", "--sqlite", db, "--backoff", "-1")
    assert "must be >= 0: '-1'" in worker("lq_cli_jobs:record", "--sqlite", db, "--drain-timeout", "-1")
    assert "not a number of seconds: 'nan'" in worker("lq_cli_jobs:record", "--sqlite", db, "--drain-timeout", "nan")
    assert "must be >= 1: '0'" in worker("lq_cli_jobs:record", "--sqlite", db, "--concurrency", "0")
    assert "must be >= 0: '-1'" in worker("lq_cli_jobs:record", "--sqlite", db, "--prefetch", "-1")
    assert "not an integer: 'high'" in worker("lq_cli_jobs:record", "--sqlite", db, "--min-priority", "high")
    assert "64-bit" in worker("lq_cli_jobs:record", "--sqlite", db, "--min-priority", str(2**63))
    assert "--metrics-host needs --metrics-port" in worker("lq_cli_jobs:record", "--sqlite", db,
                                                           "--metrics-host", "127.0.0.1")
    assert "--sqlite" in worker("lq_cli_jobs:record")
    assert worker("lq_cli_jobs:record", "--sqlite", str(tmp_path / "not_a_db.db"), status=1).startswith(
        "cannot open ")
    assert worker("lq_cli_jobs:record", "--sqlite", str(tmp_path / "no" / "such" / "dir.db"),
                  status=1).startswith("cannot open ")


def test_a_postgres_that_cannot_be_reached_is_one_line(tmp_path: Path, sqlite_backend: Any) -> None:
    pytest.importorskip("psycopg")  # the postgres extra; the message without it is checked too, below
    cli = Cli(tmp_path, sqlite_backend)
    bad = f"host={tmp_path / 'no-server'} dbname=nothing connect_timeout=2"
    for args, prog in ((("worker", "lq_cli_jobs:record", "--postgres", bad), "leasequeue worker"),
                       (("queue", "--postgres", bad, "stats"), "leasequeue queue")):
        message = one_line(cli.run(*args), prog, 1)
        assert message.startswith("cannot open the PostgreSQL queue: ")
    message = one_line(cli.run("worker", "lq_cli_jobs:record", "--postgres", "dbname=x port=notaport"),
                       "leasequeue worker", 1)
    assert message.startswith("cannot open the PostgreSQL queue: ")


def test_every_anticipated_queue_error_is_one_line(tmp_path: Path, sqlite_backend: Any) -> None:
    cli = Cli(tmp_path, sqlite_backend)
    sqlite_backend.make().publish("g", "x")
    db = sqlite_backend.path
    q = "leasequeue queue"
    assert one_line(cli.run("queue", "--sqlite", str(tmp_path / "missing.db"), "stats"), q, 1) == (
        f"no such file: {tmp_path / 'missing.db'}")
    assert one_line(cli.run("queue", "--sqlite", db, "group", "nobody"), q, 1) == "no group 'nobody'"
    (tmp_path / "not_a_db.db").write_bytes(b"this is not a SQLite file " * 100)
    assert one_line(cli.run("queue", "--sqlite", str(tmp_path / "not_a_db.db"), "stats"), q, 1).startswith(
        "cannot open ")
    assert "invalid choice: 'explode'" in one_line(cli.run("queue", "--sqlite", db, "explode"), q, 2)
    assert "unknown serializer" in one_line(cli.run("queue", "--sqlite", db, "--serializer", "x", "stats"), q, 2)
    assert "--queue names a PostgreSQL queue" in one_line(cli.run("queue", "--sqlite", db, "--queue", "a", "stats"),
                                                          q, 2)


def test_log_level_debug_prints_the_traceback_too(tmp_path: Path, sqlite_backend: Any) -> None:
    cli = Cli(tmp_path, sqlite_backend)
    r = cli.run("worker", "no_module_xyz:handle", "--sqlite", sqlite_backend.path, "--log-level", "DEBUG")
    assert r.returncode == 2
    assert "Traceback (most recent call last)" in r.stderr and "ModuleNotFoundError" in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "leasequeue worker: error: cannot import 'no_module_xyz': No module named 'no_module_xyz'")


# ------------------------------------------------------------------ only the options given reach Worker


def test_only_the_options_given_are_passed_to_worker() -> None:
    from leasequeue.__main__ import build_parser
    from leasequeue._cli_worker import build_worker_options

    def options(*argv: str) -> Dict[str, Any]:
        args = build_parser().parse_args(["worker", "m:f", "--sqlite", "q.db", *argv])
        return build_worker_options(lambda job: None, args)

    assert options() == {}
    got = options("--concurrency", "4", "--visibility", "2.5", "--drain-timeout", "inf", "--min-priority", "-3")
    assert got == {"concurrency": 4, "visibility": 2.5, "drain_timeout": float("inf"), "min_priority": -3}
    assert options("--prefetch", "0") == {"prefetch": 0}
    assert options("--prefetch", "8") == {"prefetch": 8}
    retry = options("--max-attempts", "3")["retry"]
    assert isinstance(retry, Retry) and (retry.max_attempts, retry.backoff) == (3, Retry().backoff)
    retry = options("--backoff", "0.25")["retry"]
    assert (retry.max_attempts, retry.backoff) == (Retry().max_attempts, 0.25)


def test_a_database_that_does_not_exist_is_one_line(tmp_path: Path, worker_pg_conninfo: str,
                                                      sqlite_backend: Any) -> None:
    from psycopg.conninfo import make_conninfo

    cli = Cli(tmp_path, sqlite_backend)
    missing = make_conninfo(worker_pg_conninfo, dbname="lq_no_such_database")
    for args, prog in ((("worker", "lq_cli_jobs:record", "--postgres", missing, "--queue", "q"), "leasequeue worker"),
                       (("queue", "--postgres", missing, "--queue", "q", "groups"), "leasequeue queue")):
        message = one_line(cli.run(*args), prog, 1)
        assert message.startswith("cannot open the PostgreSQL queue: ") and "lq_no_such_database" in message


def test_ctrl_c_while_importing_the_handler_is_one_line(tmp_path: Path, sqlite_backend: Any) -> None:
    cli = Cli(tmp_path, sqlite_backend)
    marker = tmp_path / "importing"
    (tmp_path / "lq_slow_import.py").write_text(
        f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(60)\ndef handle(job):\n    pass\n")
    proc = subprocess.Popen([sys.executable, "-m", "leasequeue", "worker", "lq_slow_import:handle",
                             "--sqlite", sqlite_backend.path], cwd=tmp_path, env=cli.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(marker.exists, timeout=20)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and err == "leasequeue worker: interrupted\n", err


def test_the_defaults_the_help_shows_are_the_workers_own() -> None:
    """No option given, nothing is passed: the defaults are Worker's and
    Retry's, and ``--help`` must tell them right."""
    from leasequeue import InMemoryTransport, Worker
    from leasequeue.__main__ import build_parser

    w = Worker(InMemoryTransport(), lambda job: None)
    assert (w.concurrency, w.visibility, w.drain_timeout, w.min_priority) == (1, 30.0, 30.0, 0)
    assert (w.prefetch, w.batch) == (None, 16)  # adaptive, up to batch
    assert (w.retry.max_attempts, w.retry.backoff) == (5, 1.0)
    helps = {a.dest: a.help for a in build_parser()._subparsers._group_actions[0].choices["worker"]._actions}
    for dest, shown in (("concurrency", "default 1"), ("visibility", "default 30"), ("drain_timeout", "default 30"),
                        ("min_priority", "default 0"), ("max_attempts", "default 5"), ("backoff", "default 1"),
                        ("prefetch", "default: adaptive"), ("prefetch", "up to 16")):
        assert shown in helps[dest], (dest, helps[dest])
