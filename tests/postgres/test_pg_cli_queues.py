"""``leasequeue queue --postgres CONNINFO`` queue administration, run as a
person or a script would: real ``python -m leasequeue`` processes against
the suite's server.  ``install``, ``create-queue``, ``queues`` (table and
``--json``), ``drop-queue`` (asks on a terminal; ``--yes``; refuses
without a terminal), and a command on a queue that does not exist: one
line on stderr, a non-zero exit, nothing made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any, List

import pytest

from leasequeue import PostgresTransport
from tx_helpers import LIVENESS, child_env


def cli(*argv: str, stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "leasequeue", "queue", *argv], env=child_env(), stdin=stdin,
                          capture_output=True, text=True, timeout=LIVENESS)


def _names(conninfo: str) -> List[str]:
    return [name for name, _ in PostgresTransport.list_queues(conninfo)]


def _fresh() -> str:
    return f"c_{uuid.uuid4().hex[:12]}"


def test_a_command_on_a_missing_queue_is_one_line_and_makes_nothing(conninfo: str) -> None:
    name = _fresh()
    for command in (["stats"], ["groups"], ["peek", "g"], ["pause", "g"]):
        proc = cli("--postgres", conninfo, "--queue", name, *command)
        assert proc.returncode != 0
        assert proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and f"queue '{name}' does not exist" in lines[0] and "create-queue" in lines[0]
    assert name not in _names(conninfo)


def test_install_create_and_list(conninfo: str) -> None:
    a, b = _fresh(), _fresh()
    proc = cli("--postgres", conninfo, "install", "--queue", a, "--queue", b)
    assert proc.returncode == 0, proc.stderr
    assert f"created queue {a}" in proc.stdout and f"created queue {b}" in proc.stdout
    again = cli("--postgres", conninfo, "install", "--queue", a, "--json")
    assert again.returncode == 0
    assert json.loads(again.stdout)["queues"] == [{"queue": a, "created": False}]
    c = _fresh()
    made = cli("--postgres", conninfo, "create-queue", c)
    assert (made.returncode, made.stdout.strip()) == (0, f"created queue {c}")
    assert cli("--postgres", conninfo, "create-queue", c).stdout.strip() == f"queue {c} exists already"
    with PostgresTransport(conninfo, queue=c) as t:
        t.publish("g", 1)
        t.publish("h", 2)
    table = cli("--postgres", conninfo, "queues")
    assert table.returncode == 0
    header = table.stdout.splitlines()[0].split()
    assert header == ["queue", "messages", "groups", "leased", "parked", "paused", "buried", "scheduled"]
    row = next(line.split() for line in table.stdout.splitlines() if line.split()[:1] == [c])
    assert row[1:3] == ["2", "2"]
    listed = {d["queue"]: d for d in json.loads(cli("--postgres", conninfo, "queues", "--json").stdout)}
    assert listed[c]["messages"] == 2 and listed[a]["messages"] == 0
    for name in (a, b, c):
        PostgresTransport.drop_queue(conninfo, name)


def test_bad_names_and_sqlite_are_refused(conninfo: str, tmp_path: Any) -> None:
    before = _names(conninfo)
    for argv in (["create-queue", "bad name"], ["install", "--queue", "_x"], ["create-queue", "x" * 64]):
        proc = cli("--postgres", conninfo, *argv)
        assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert _names(conninfo) == before
    proc = cli("--sqlite", str(tmp_path / "q.db"), "queues")
    assert proc.returncode == 2 and "PostgreSQL command" in proc.stderr


def test_drop_queue_without_a_terminal_needs_yes(conninfo: str) -> None:
    name = _fresh()
    PostgresTransport.create_queue(conninfo, name)
    with PostgresTransport(conninfo, queue=name) as t:
        t.publish("g", 1)
    refused = cli("--postgres", conninfo, "drop-queue", name, stdin=subprocess.PIPE)
    assert refused.returncode != 0 and "--yes" in refused.stderr
    assert name in _names(conninfo)
    done = cli("--postgres", conninfo, "drop-queue", name, "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"queue": name, "dropped": True, "messages": 1}
    assert name not in _names(conninfo)
    missing = cli("--postgres", conninfo, "drop-queue", name, "--yes")
    assert missing.returncode != 0 and "does not exist" in missing.stderr


@pytest.mark.parametrize("answer", ["y", "n"])
def test_drop_queue_asks_on_a_terminal(conninfo: str, answer: str) -> None:
    name = _fresh()
    PostgresTransport.create_queue(conninfo, name)
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "leasequeue", "queue", "--postgres", conninfo,
                                 "drop-queue", name], env=child_env(), stdin=slave, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        os.write(master, f"{answer}\n".encode())
        out, err = proc.communicate(timeout=LIVENESS)
    finally:
        os.close(slave)
        os.close(master)
    assert f"drop queue '{name}'" in err and "[y/N]" in err
    if answer == "y":
        assert proc.returncode == 0 and f"dropped queue {name}" in out
        assert name not in _names(conninfo)
    else:
        assert proc.returncode != 0 and "not dropped" in err
        assert name in _names(conninfo)
        PostgresTransport.drop_queue(conninfo, name)
