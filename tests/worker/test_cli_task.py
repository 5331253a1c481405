"""``leasequeue worker MODULE:OBJECT`` where OBJECT is a ``leasequeue.Task``
(a handler with its ``Retry``, hooks and ``min_priority``), as a real
process on a real SQLite file: the Task's settings are used, and only the
options given on the command line override them.

Needs ``leasequeue.Task`` (the worker package, #31): named so that pytest
does not collect it until the lead renames it ``test_cli_task.py`` at the
merge.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, List

from worker_helpers import wait_until

from leasequeue import Retry, Task

JOBS = textwrap.dedent(
    """
    import os
    from leasequeue import Retry, Task

    def log(*words):
        with open(os.environ["LQ_TEST_LOG"], "a") as f:
            f.write(" ".join(str(w) for w in words) + "\\n")

    def fail(job):
        log("run", job.group_id, job.attempt)
        raise ValueError("always")

    def on_buried(job, error):
        log("buried", job.group_id, job.attempt)

    failing = Task(fail, retry=Retry(max_attempts=2, backoff=0.01, jitter=0.0), hooks={"buried": on_buried})

    def ok(job):
        log("ok", job.group_id)

    important = Task(ok, min_priority=5)
    """
)


class Cli:
    def __init__(self, tmp_path: Path, backend: Any) -> None:
        self.dir = tmp_path
        (tmp_path / "lq_task_jobs.py").write_text(JOBS)
        self.log = tmp_path / "log.txt"
        self.log.touch()
        self.backend = backend
        self.env = dict(os.environ, LQ_TEST_LOG=str(self.log))
        self.env.pop("LEASEQUEUE_COVERAGE", None)

    def start(self, target: str, *options: str) -> "subprocess.Popen[str]":
        cmd = [sys.executable, "-m", "leasequeue", "worker", f"lq_task_jobs:{target}", *self.backend.cli_args(),
               *options]
        return subprocess.Popen(cmd, cwd=self.dir, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def lines(self) -> List[List[str]]:
        return [line.split() for line in self.log.read_text().splitlines()]


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


def test_a_task_brings_its_retry_and_hooks(sqlite_backend: Any, tmp_path: Path) -> None:
    cli = Cli(tmp_path, sqlite_backend)
    t = sqlite_backend.make()
    t.publish("bad", "x")
    proc = cli.start("failing")  # no --max-attempts: the Task's 2, not the command line's default 5
    try:
        wait_until(lambda: ["buried", "bad", "2"] in cli.lines(), timeout=20)
    finally:
        _stop(proc)
    assert [w for w in cli.lines() if w[0] == "run"] == [["run", "bad", "1"], ["run", "bad", "2"]]
    info = t.group("bad")
    assert info.state == "buried" and info.attempt == 2


def test_an_option_given_overrides_the_task(sqlite_backend: Any, tmp_path: Path) -> None:
    cli = Cli(tmp_path, sqlite_backend)
    t = sqlite_backend.make()
    t.publish("bad", "x")
    proc = cli.start("failing", "--max-attempts", "3")
    try:
        wait_until(lambda: ["buried", "bad", "3"] in cli.lines(), timeout=20)
    finally:
        _stop(proc)
    assert [w[2] for w in cli.lines() if w[0] == "run"] == ["1", "2", "3"]  # the Task's hook still called


def test_a_task_brings_its_min_priority_and_the_option_overrides_it(sqlite_backend: Any, tmp_path: Path) -> None:
    cli = Cli(tmp_path, sqlite_backend)
    t = sqlite_backend.make()
    t.publish("low", "l", 1)
    t.publish("high", "h", 9)
    proc = cli.start("important")
    try:
        wait_until(lambda: ["ok", "high"] in cli.lines(), timeout=20)
    finally:
        _stop(proc)
    assert cli.lines() == [["ok", "high"]] and [g.group_id for g in t.groups()] == ["low"]
    proc = cli.start("important", "--min-priority", "0")
    try:
        wait_until(lambda: ["ok", "low"] in cli.lines(), timeout=20)
    finally:
        _stop(proc)


def test_the_options_keep_the_rest_of_the_tasks_retry() -> None:
    from leasequeue.__main__ import build_parser
    from leasequeue._cli_worker import build_worker_options, is_task

    retry = Retry(max_attempts=2, backoff=0.5, factor=3.0, max_delay=9.0, jitter=0.0, give_up_on=(KeyError,))
    task = Task(lambda job: None, retry=retry, min_priority=4)
    assert is_task(task)
    args = build_parser().parse_args(["worker", "m:f", "--sqlite", "q.db"])
    assert build_worker_options(task, args) == {}  # nothing given: the Task's settings stand
    args = build_parser().parse_args(["worker", "m:f", "--sqlite", "q.db", "--max-attempts", "7"])
    got = build_worker_options(task, args)["retry"]
    assert (got.max_attempts, got.backoff, got.factor, got.max_delay, got.jitter, got.give_up_on) == (
        7, 0.5, 3.0, 9.0, 0.0, (KeyError,))
