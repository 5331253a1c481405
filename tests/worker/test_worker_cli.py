"""``leasequeue worker`` as a real process on a real SQLite file and the
suite's PostgreSQL: a crash loop (``os._exit`` in the handler) buried after
``max_attempts``; SIGTERM drains and exits 0 with the rest left in the queue,
nothing leased; a second signal exits at once; ``/metrics`` scraped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from worker_helpers import wait_until

HANDLERS = textwrap.dedent(
    """
    import os, time

    LOG = os.environ["LQ_TEST_LOG"]

    def log(*words):
        with open(LOG, "a") as f:
            f.write(" ".join(str(w) for w in words) + "\\n")

    def crashy(job):
        log("run", job.event, job.attempt)
        if job.event == "boom":
            os._exit(3)

    def sleepy(job):
        log("start", job.event)
        time.sleep(float(os.environ.get("LQ_SLEEP", "1")))
        log("end", job.event)

    async def asleepy(job):
        import asyncio
        log("start", job.event)
        await asyncio.sleep(float(os.environ.get("LQ_SLEEP", "1")))
        log("end", job.event)

    def picky(job):
        if job.event == "bad":
            raise ValueError("bad input")
    """
)


class Cli:
    def __init__(self, tmp_path: Path, backend: Any) -> None:
        self.dir = tmp_path
        (tmp_path / "lq_test_jobs.py").write_text(HANDLERS)
        self.log = tmp_path / "log.txt"
        self.log.touch()
        self.backend = backend

    def start(self, target: str, *options: str, env: Optional[Dict[str, str]] = None) -> "subprocess.Popen[str]":
        e = dict(os.environ, LQ_TEST_LOG=str(self.log), **(env or {}))
        e.pop("LEASEQUEUE_COVERAGE", None)
        cmd = [sys.executable, "-m", "leasequeue", "worker", f"lq_test_jobs:{target}",
               *self.backend.cli_args(), *options]
        return subprocess.Popen(cmd, cwd=self.dir, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def lines(self) -> List[List[str]]:
        return [line.split() for line in self.log.read_text().splitlines()]


def _finish(proc: "subprocess.Popen[str]", timeout: float = 20) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the worker did not exit:\n{out}") from None
    return out


def test_a_crash_loop_through_the_cli_is_buried_after_max_attempts(durable: Any, tmp_path: Path) -> None:
    cli = Cli(tmp_path, durable)
    t = durable.make()
    t.publish("crash", "boom")
    for g in range(4):
        t.publish(f"g{g}", f"ok{g}")
    runs = 0
    while True:
        runs += 1
        assert runs <= 5, f"not buried after {runs - 1} runs: {cli.lines()}"
        # The default prefetch: "boom" is claimed first in the first run (its group
        # is the oldest, and nothing is prefetched before a first job ran), and
        # once redelivered it runs alone (the finished jobs' acks sent, nothing
        # prefetched behind it): no ok job runs twice (the test counts runs).
        proc = cli.start("crashy", "--visibility", "0.5", "--max-attempts", "2")
        done = False
        deadline = time.monotonic() + 20
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"run {runs} neither crashed nor buried the group: {_finish(proc)}")
            info = t.group("crash")
            if info is not None and info.state == "buried" and t.stats().messages == 1:
                done = True
                break
            time.sleep(0.05)
        if done:
            proc.send_signal(signal.SIGTERM)
            out = _finish(proc)
            assert proc.returncode == 0, out
            break
        out = _finish(proc)
        assert proc.returncode == 3, out  # the handler's os._exit
    runs_of = [w for w in cli.lines() if w[0] == "run"]
    assert [w[1:] for w in runs_of if w[1] == "boom"] == [["boom", "1"], ["boom", "2"]]
    assert sorted(w[1] for w in runs_of if w[1] != "boom") == ["ok0", "ok1", "ok2", "ok3"]
    info = t.group("crash")
    assert info.state == "buried" and "beyond the budget of max_attempts 2" in info.reason and info.attempt == 3
    assert "buried" in out


@pytest.mark.parametrize("handler", ["sleepy", "asleepy"])
def test_sigterm_drains_and_exits_0(durable: Any, tmp_path: Path, handler: str) -> None:
    cli = Cli(tmp_path, durable)
    t = durable.make()
    for g in range(8):
        t.publish(f"g{g}", f"m{g}")
    proc = cli.start(handler, "--concurrency", "2", env={"LQ_SLEEP": "1.0"})
    wait_until(lambda: len([w for w in cli.lines() if w[0] == "start"]) == 2, timeout=20)
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc)
    assert proc.returncode == 0, out
    lines = cli.lines()
    started = [w[1] for w in lines if w[0] == "start"]
    ended = [w[1] for w in lines if w[0] == "end"]
    assert len(started) == 2 and sorted(ended) == sorted(started), lines
    s = t.stats()
    assert s.messages == 6 and s.leased == 0 and s.parked == 0


def test_a_second_sigterm_exits_at_once(durable: Any, tmp_path: Path) -> None:
    cli = Cli(tmp_path, durable)
    t = durable.make()
    for g in range(4):
        t.publish(f"g{g}", f"m{g}")
    proc = cli.start("sleepy", "--concurrency", "2", "--drain-timeout", "60", env={"LQ_SLEEP": "60"})
    wait_until(lambda: len([w for w in cli.lines() if w[0] == "start"]) == 2, timeout=20)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None, "the first signal did not wait for the running handlers"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc, timeout=10)
    assert time.monotonic() - t0 < 5
    assert proc.returncode == 1, out
    assert not [w for w in cli.lines() if w[0] == "end"]
    s = t.stats()
    assert s.messages == 4 and s.leased == 2  # left to expire: never handed back while running


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> Dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_metrics_scraped_from_a_cli_worker(tmp_path: Path, sqlite_backend: Any) -> None:
    backend = sqlite_backend
    cli = Cli(tmp_path, backend)
    t = backend.make()
    for i in range(10):
        t.publish(f"g{i}", f"ok{i}")
    t.publish("poison", "bad")
    port = _free_port()
    proc = cli.start("picky", "--metrics-port", str(port), "--max-attempts", "2", "--backoff", "0.05",
                     "--concurrency", "4")
    try:
        def counts() -> Any:
            try:
                m = _scrape(port)
            except OSError:  # not serving yet
                return None
            if m.get('leasequeue_buried_groups{queue="queue.db"}') == 1.0 and _get(m, "succeeded") == 10:
                return m
            return None

        m = wait_until(counts, timeout=20, interval=0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out = _finish(proc)
    assert proc.returncode == 0, out
    assert _get(m, "started") == 12 and _get(m, "retried") == 1 and _get(m, "buried") == 1
    assert _get(m, "lost") == 0 and _get(m, "handed_back") == 0
    assert m['leasequeue_worker_handler_seconds_count{queue="queue.db"}'] == 12
    assert m['leasequeue_worker_jobs_in_flight{queue="queue.db"}'] == 0
    assert all(name.startswith("leasequeue_") for name in m if not name.startswith(("python_", "process_")))
    assert not any("poison" in name or "g1" in name for name in m), "a group id in a label"


def _get(m: Dict[str, float], outcome: str) -> Optional[float]:
    for name, value in m.items():
        if name.startswith("leasequeue_worker_jobs_total{") and f'outcome="{outcome}"' in name:
            return value
    return None


def test_worker_cli_errors(tmp_path: Path) -> None:
    (tmp_path / "lq_test_jobs.py").write_text(HANDLERS)
    db = str(tmp_path / "q.db")

    def run(*args: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run([sys.executable, "-m", "leasequeue", "worker", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)

    env = dict(os.environ)
    env.pop("LQ_TEST_LOG", None)
    r = run("lq_test_jobs:crashy", "--sqlite", db)  # the module raises KeyError on import
    assert r.returncode == 2 and "importing 'lq_test_jobs' raised KeyError" in r.stderr
    env["LQ_TEST_LOG"] = str(tmp_path / "log.txt")

    r = run("nomodule_xyz:handle", "--sqlite", db)
    assert r.returncode == 2 and "cannot import 'nomodule_xyz'" in r.stderr
    r = run("lq_test_jobs:nothing", "--sqlite", db)
    assert r.returncode == 2 and "no attribute 'nothing'" in r.stderr
    r = run("lq_test_jobs", "--sqlite", db)
    assert r.returncode == 2 and "MODULE:OBJECT" in r.stderr
    r = run("lq_test_jobs:crashy", "--sqlite", db, "--queue", "q")
    assert r.returncode == 2 and "--queue" in r.stderr
    r = run("lq_test_jobs:crashy", "--sqlite", db, "--concurrency", "0")
    assert r.returncode == 2 and "--concurrency" in r.stderr
    r = run("lq_test_jobs:crashy", "--sqlite", db, "--visibility", "0")
    assert r.returncode == 2 and "--visibility" in r.stderr
    r = run("lq_test_jobs:crashy")
    assert r.returncode == 2 and "--sqlite" in r.stderr
    r = run("--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "leasequeue worker myapp.jobs:handle" in r.stdout
