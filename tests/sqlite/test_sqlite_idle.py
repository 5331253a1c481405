"""Idle SQLite waiting costs nothing, and wakes across processes without
polling (``_backends/sqlite/waiting.py``'s ``Watcher``, ``_backends/sqlite/watch.py``).

Real processes on real files: an *agent* process opens the database, starts
some claims waiting (``claim(..., timeout=...)`` in threads, each looping
claim -> report -> ack), says ``ready <mechanism>``, and then obeys commands
on stdin (``cpu S``: its process CPU time over S seconds, after letting the
watcher settle; ``quit``).  The test process publishes, checkpoints, kills.

* idle CPU: 32 waiting claims in one process, and 4 processes with 8 each,
  use under 2 ms of CPU per second per process (the issue's bound);
* a publish in one process wakes a claim waiting in another: through the
  kernel watch and through the forced fallback poll, with the WAL
  truncated by a checkpoint before each publish, and on a file the waiting
  process created (its WAL did not exist until it waited);
* the kernel watch follows the WAL file through its creation, its deletion
  by the last connection's close and its re-creation;
* several transports on one file in one process wake each other;
* ``close()`` and ``fork()`` leave no watch behind, and a child after fork
  cannot use the parent's;
* a failing or unavailable kernel mechanism falls back to the poll, with one
  warning per process;
* a process killed while its claims wait leaves nothing behind that slows
  or breaks the others.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import pytest

from leasequeue import LeaseQueueError, SQLiteTransport
from leasequeue._backends.sqlite.watch import choose_mechanism, open_watch

LIVENESS = 10.0  # seconds: generous bound for "it woke up" on a loaded machine
IDLE_BOUND_MS = 2.0  # ms of CPU per second of an idle waiting process (issue 23)
SETTLE = 1.2  # seconds an agent lets its watcher settle before measuring (its re-checks end by 0.65 s)

KERNEL = "inotify" if sys.platform.startswith("linux") else ("kqueue" if hasattr(__import__("select"), "kqueue")
                                                             else None)
needs_kernel = pytest.mark.skipif(KERNEL is None, reason="no kernel file watch on this platform")

AGENT = r"""
import json, os, sys, threading, time
from leasequeue import SQLiteTransport
path, claims, settle = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
t = SQLiteTransport(path)
out = threading.Lock()
def say(*words):
    with out:
        sys.stdout.write(" ".join(str(w) for w in words) + "\n")
        sys.stdout.flush()
def work(i):
    while True:
        lease = t.claim(f"w{os.getpid()}-{i}", 30, timeout=None)
        if lease is None:
            return
        say("got", json.dumps(lease.event), repr(time.time()))
        t.ack(lease)
threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(claims)]
for th in threads:
    th.start()
while len(t._queue.waiters) < claims or t._watcher.mechanism is None:
    time.sleep(0.005)
say("ready", t._watcher.mechanism)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "cpu":
        time.sleep(settle)
        c0, w0 = time.process_time(), time.monotonic()
        time.sleep(float(cmd[1]))
        c1, w1 = time.process_time(), time.monotonic()
        say("cpu", repr((c1 - c0) / (w1 - w0) * 1e3), len(t._queue.waiters))
    elif cmd[0] == "quit":
        break
t.close()
say("closed")
"""


def _env(mechanism: str) -> Dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p))
    env.pop("LEASEQUEUE_SQLITE_WATCH", None)
    if mechanism == "poll":
        env["LEASEQUEUE_SQLITE_WATCH"] = "poll"
    elif mechanism != "kernel":
        env["LEASEQUEUE_SQLITE_WATCH"] = mechanism
    return env


class Agent:
    """A process whose claims wait on ``path`` (see the module docstring)."""

    def __init__(self, path: str, claims: int = 1, mechanism: str = "kernel") -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", AGENT, path, str(claims), str(SETTLE)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(mechanism))
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.mechanism: Optional[str] = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def expect(self, word: str, timeout: float = LIVENESS) -> List[str]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the agent did not say {word!r} within {timeout} s") from None
            if line is None:
                raise AssertionError(f"the agent exited (code {self.proc.wait()}) before saying {word!r}")
            parts = line.split()
            if parts and parts[0] == word:
                return parts[1:]

    def ready(self) -> "Agent":
        self.mechanism = self.expect("ready", 30.0)[0]
        return self

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def got(self) -> Any:
        return json.loads(self.expect("got")[0])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(LIVENESS)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.proc.wait(LIVENESS)


@pytest.fixture
def agents() -> Iterator[List[Agent]]:
    started: List[Agent] = []
    yield started
    for agent in started:
        if agent.proc.poll() is None:
            agent.proc.kill()
        agent.proc.wait(LIVENESS)


def _assert_kernel(agent: Agent) -> None:
    assert agent.mechanism == KERNEL, f"expected the {KERNEL} watch, the agent uses {agent.mechanism}"


# -- idle CPU -----------------------------------------------------------------------------


@needs_kernel
@pytest.mark.serial(reason="measures idle processes' CPU time against a bound")
def test_32_idle_claims_in_one_process_use_no_cpu(tmp_path: Any, agents: List[Agent]) -> None:
    path = str(tmp_path / "q.db")
    SQLiteTransport(path).close()
    agent = Agent(path, claims=32)
    agents.append(agent)
    _assert_kernel(agent.ready())
    agent.send("cpu 2")
    ms, waiting = agent.expect("cpu", 30.0)
    assert int(waiting) == 32  # all of them still waiting: nothing woke them
    assert float(ms) < IDLE_BOUND_MS, f"32 idle waiting claims used {float(ms):.2f} ms of CPU per second"


@needs_kernel
@pytest.mark.serial(reason="measures idle processes' CPU time against a bound")
def test_4_processes_with_8_idle_claims_each_use_no_cpu(tmp_path: Any, agents: List[Agent]) -> None:
    path = str(tmp_path / "q.db")
    SQLiteTransport(path).close()
    agents.extend(Agent(path, claims=8) for _ in range(4))
    for agent in agents:
        _assert_kernel(agent.ready())
    for agent in agents:
        agent.send("cpu 2")  # measured over the same quiet 2 s
    figures = [agent.expect("cpu", 30.0) for agent in agents]
    assert [int(w) for _, w in figures] == [8, 8, 8, 8]
    worst = max(float(ms) for ms, _ in figures)
    assert worst < IDLE_BOUND_MS, f"idle waiting processes used {[round(float(m), 2) for m, _ in figures]} ms/s"


# -- wake-ups across processes ------------------------------------------------------------


def _wal_size(path: str) -> int:
    return os.path.getsize(path + "-wal")


@pytest.mark.parametrize("mechanism", ["kernel", "poll"])
@pytest.mark.parametrize("scenario", ["plain", "checkpointed", "fresh-file", "durable"])
def test_a_publish_wakes_a_claim_waiting_in_another_process(
    tmp_path: Any, agents: List[Agent], mechanism: str, scenario: str
) -> None:
    if mechanism == "kernel" and KERNEL is None:
        pytest.skip("no kernel file watch on this platform")
    path = str(tmp_path / "q.db")
    if scenario != "fresh-file":
        SQLiteTransport(path).close()  # else the waiting process creates the file (and its WAL)
    agent = Agent(path, claims=1, mechanism=mechanism)
    agents.append(agent)
    agent.ready()
    assert agent.mechanism == (KERNEL if mechanism == "kernel" else "poll")
    side = sqlite3.connect(path, isolation_level=None)
    try:
        # durable: the publisher fsyncs each commit, between the WAL write the
        # kernel reports and the commit becoming visible (the settle re-checks).
        with SQLiteTransport(path, durable=scenario == "durable") as t:
            for i in range(3):
                time.sleep(0.05)  # the claim is asleep again
                if scenario == "checkpointed":
                    busy, _, _ = side.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                    assert busy == 0 and _wal_size(path) == 0  # the WAL was reset to nothing
                t.publish(f"g{i}", f"m{i}")
                assert agent.got() == f"m{i}"
            _until(lambda: t.stats().messages == 0, "every message acked by the agent")
    finally:
        side.close()
    agent.close()


ASYNC_AGENT = r"""
import asyncio, json, sys
from leasequeue import SQLiteTransport
async def main():
    t = SQLiteTransport(sys.argv[1])
    task = asyncio.ensure_future(t.aclaim("a", 30, timeout=10))
    while not t._queue.waiters or t._watcher.mechanism is None:
        await asyncio.sleep(0.005)
    print("ready", t._watcher.mechanism, flush=True)
    lease = await task
    print("got", json.dumps(None if lease is None else lease.event), flush=True)
    t.close()
asyncio.run(main())
"""


@pytest.mark.parametrize("mechanism", ["kernel", "poll"])
def test_a_publish_wakes_an_aclaim_waiting_in_another_process(tmp_path: Any, mechanism: str) -> None:
    if mechanism == "kernel" and KERNEL is None:
        pytest.skip("no kernel file watch on this platform")
    path = str(tmp_path / "q.db")
    SQLiteTransport(path).close()
    proc = subprocess.Popen([sys.executable, "-c", ASYNC_AGENT, path], stdout=subprocess.PIPE, text=True,
                            env=_env(mechanism))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["ready", KERNEL if mechanism == "kernel" else "poll"]
        time.sleep(0.05)
        with SQLiteTransport(path) as t:
            t.publish("g", "to the coroutine")
            assert proc.stdout.readline().rstrip("\n").split(None, 1) == ["got", json.dumps("to the coroutine")]
        assert proc.wait(LIVENESS) == 0
    finally:
        proc.kill()
        proc.wait(LIVENESS)


@needs_kernel
def test_the_watch_follows_the_wal_through_creation_deletion_and_recreation(tmp_path: Any) -> None:
    """At the watch's level: armed on a database whose WAL does not exist (no
    file at all yet), it reports the WAL's creation by another process, then
    writes to that file, then the re-created WAL after the last connection's
    close deleted it."""
    path = str(tmp_path / "q.db")
    watch = open_watch(path, choose_mechanism())
    script = r"""
import sys
from leasequeue import SQLiteTransport
t = SQLiteTransport(sys.argv[1])
for line in sys.stdin:
    if line.strip() == "publish":
        t.publish("a", 1)
        print("published", flush=True)
    else:
        break
t.close()
print("closed", flush=True)
"""

    def quiet() -> None:  # drain the reports of what happened so far
        while watch.wait(0.3):
            pass

    def writer() -> subprocess.Popen:  # type: ignore[type-arg]
        return subprocess.Popen([sys.executable, "-c", script, path], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=_env("kernel"))

    def do(proc: Any, cmd: str, answer: str) -> None:
        proc.stdin.write(cmd + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == answer

    try:
        for round_ in range(2):
            assert not os.path.exists(path + "-wal")
            proc = writer()
            try:
                do(proc, "publish", "published")  # creates the WAL (and, the first time, the file)
                assert watch.wait(LIVENESS), f"round {round_}: the WAL's creation was not reported"
                quiet()
                do(proc, "publish", "published")  # a write to the WAL that now exists
                assert watch.wait(LIVENESS), f"round {round_}: a write to the new WAL was not reported"
                quiet()
                do(proc, "quit", "closed")  # the last connection: SQLite deletes the WAL
                proc.wait(LIVENESS)
            finally:
                proc.kill()
            quiet()
        assert not watch.wait(0.2)  # nothing happens: nothing is reported
    finally:
        watch.close()


@pytest.mark.parametrize("mechanism", ["kernel", "poll"])
def test_transports_on_one_file_in_one_process_wake_each_other(
    tmp_path: Any, monkeypatch: Any, mechanism: str
) -> None:
    if mechanism == "kernel" and KERNEL is None:
        pytest.skip("no kernel file watch on this platform")
    monkeypatch.setenv("LEASEQUEUE_SQLITE_WATCH", "poll" if mechanism == "poll" else "auto")
    path = str(tmp_path / "q.db")
    with SQLiteTransport(path) as a, SQLiteTransport(path) as b:
        got: List[Any] = []
        waiting = threading.Thread(target=lambda: got.append(a.claim("w", 30, timeout=LIVENESS)), daemon=True)
        waiting.start()
        _until(lambda: a._queue.waiters and a._watcher.mechanism is not None, "a's claim waiting")
        assert a._watcher.mechanism == (KERNEL if mechanism == "kernel" else "poll")
        time.sleep(0.05)
        b.publish("g", "from b")
        waiting.join(LIVENESS)
        assert got and got[0] is not None and got[0].event == "from b"


def _until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + LIVENESS
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.002)


def _inotify_fd(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    except OSError:
        return False


# -- close and fork -----------------------------------------------------------------------


@pytest.mark.skipif(KERNEL != "inotify", reason="inspects the inotify descriptor in /proc")
def test_close_removes_the_watch(tmp_path: Any) -> None:
    t = SQLiteTransport(tmp_path / "q.db")
    got: List[Any] = ["pending"]
    waiting = threading.Thread(target=lambda: got.__setitem__(0, t.claim("w", 30, timeout=None)), daemon=True)
    waiting.start()
    _until(lambda: t._watcher._watch is not None, "the watch armed")
    fd = t._watcher._watch._fd  # type: ignore[union-attr]
    assert _inotify_fd(fd)
    thread = t._watcher._thread
    t.close()
    waiting.join(LIVENESS)
    assert got == [None]  # close() woke the claim
    assert thread is not None and not thread.is_alive()
    assert t._watcher._watch is None and not _inotify_fd(fd)


@pytest.mark.skipif(not hasattr(os, "fork") or KERNEL != "inotify", reason="fork() and inotify")
def test_a_child_after_fork_neither_inherits_nor_misuses_the_watch(tmp_path: Any) -> None:
    path = str(tmp_path / "q.db")
    t = SQLiteTransport(path)
    got: List[Any] = []
    waiting = threading.Thread(target=lambda: got.append(t.claim("parent", 30, 10, timeout=LIVENESS)), daemon=True)
    waiting.start()
    _until(lambda: t._watcher._watch is not None, "the watch armed")
    fd = t._watcher._watch._fd  # type: ignore[union-attr]
    # Fork once the watcher sleeps in the kernel (its settle re-checks are over):
    # a fork while another thread is inside SQLite (a mutex held, e.g. the
    # allocator's) can leave the child's first SQLite call waiting for ever.
    time.sleep(SETTLE)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        code = 0
        try:
            os.close(r)
            if _inotify_fd(fd):
                code |= 1  # the parent's watch is still open here
            try:
                t.claim("child", 30, timeout=0.1)
                code |= 2  # the parent's transport must refuse
            except LeaseQueueError:
                pass
            own = SQLiteTransport(path)  # a transport of its own waits and wakes
            os.write(w, b"r")
            lease = own.claim("child", 30, timeout=LIVENESS)
            if lease is None or lease.event != "for the child":
                code |= 4
            own.close()
        except BaseException:  # noqa: B036
            code |= 8
        finally:
            os._exit(code)
    os.close(w)
    try:
        assert os.read(r, 1) == b"r"
        time.sleep(0.1)
        with SQLiteTransport(path) as other:
            other.publish("c", "for the child", priority=0)  # below the parent's floor (10)
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child exit status {status:#x}"
            assert _inotify_fd(fd) and t._watcher._watch is not None  # the parent's watch is intact
            other.publish("p", "for the parent", priority=10)  # from another connection: through the watch
            waiting.join(LIVENESS)
            assert got and got[0] is not None and got[0].event == "for the parent"
    finally:
        os.close(r)
        t.close()


# -- the loud fallback ----------------------------------------------------------------------

FALLBACK = r"""
import json, os, sys, threading, time, warnings
from leasequeue import SQLiteTransport
path, how = sys.argv[1], sys.argv[2]
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ts = [SQLiteTransport(path), SQLiteTransport(path)]
    got = []
    for t in ts:
        threading.Thread(target=lambda t=t: got.append(t.claim("w", 30, timeout=10)), daemon=True).start()
    while not all(t._queue.waiters and t._watcher.mechanism for t in ts):
        time.sleep(0.005)
    if how == "break":  # the kernel watch fails under the watcher: close its descriptor
        while not all(t._watcher._watch is not None for t in ts):
            time.sleep(0.005)
        for t in ts:
            watch = t._watcher._watch
            os.close(watch._fd)  # (a poll() in progress on it does not notice: kick it)
            watch.kick()
        while not all(t._watcher.mechanism == "poll" for t in ts):
            time.sleep(0.005)
    print(json.dumps([[str(w.category.__name__), str(w.message)] for w in caught]), flush=True)
    print(json.dumps([t._watcher.mechanism for t in ts]), flush=True)
    sys.stdin.readline()  # the parent publishes two messages
    while len(got) < 2:
        time.sleep(0.005)
    print(json.dumps(sorted(lease.event for lease in got if lease is not None)), flush=True)
"""


@pytest.mark.parametrize("how", ["unavailable", "break", "unknown"])
def test_without_the_kernel_watch_the_poll_takes_over_with_one_warning(tmp_path: Any, how: str) -> None:
    if how == "break" and KERNEL != "inotify":
        pytest.skip("breaks an inotify descriptor")
    path = str(tmp_path / "q.db")
    SQLiteTransport(path).close()
    # unavailable: a mechanism this platform does not have; unknown: a misspelt switch.
    mechanism = {"unavailable": "kqueue" if KERNEL != "kqueue" else "inotify", "break": "kernel",
                 "unknown": "inotfy"}[how]
    proc = subprocess.Popen([sys.executable, "-c", FALLBACK, path, how], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=_env(mechanism))
    try:
        assert proc.stdout is not None and proc.stdin is not None
        caught = json.loads(proc.stdout.readline())
        mechanisms = json.loads(proc.stdout.readline())
        assert mechanisms == ["poll", "poll"]
        assert len(caught) == 1, caught  # loudly, once per process (two transports here)
        category, message = caught[0]
        assert category == "RuntimeWarning" and "poll" in message and "LEASEQUEUE_SQLITE_WATCH" in message
        with SQLiteTransport(path) as t:
            t.publish("a", 1)
            t.publish("b", 2)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline()) == [1, 2]  # both woke, through the poll
        proc.wait(LIVENESS)
    finally:
        proc.kill()
        proc.wait(LIVENESS)


# -- a process killed while it waits ---------------------------------------------------------


@needs_kernel
@pytest.mark.serial(reason="measures the survivor's idle CPU time against a bound")
def test_a_process_killed_while_waiting_leaves_nothing_behind(tmp_path: Any, agents: List[Agent]) -> None:
    path = str(tmp_path / "q.db")
    SQLiteTransport(path).close()
    survivor = Agent(path, claims=4)
    victim = Agent(path, claims=4)
    agents.extend([survivor, victim])
    survivor.ready()
    victim.ready()
    os.kill(victim.proc.pid, signal.SIGKILL)
    assert victim.proc.wait(LIVENESS) == -signal.SIGKILL
    with SQLiteTransport(path) as t:
        assert t.stats().leased == 0  # waiting claims hold nothing: nothing to expire
        for i in range(4):
            t.publish(f"g{i}", i)
        assert sorted(survivor.got() for _ in range(4)) == [0, 1, 2, 3]  # all to the survivor, at once
        _until(lambda: t.stats().leased == 0, "the survivor acked everything")
        lease = t.claim("here", 30, timeout=0)  # the file is not locked by the dead process
        assert lease is None
        t.publish("x", "after")
        assert survivor.got() == "after"
    survivor.send("cpu 1")
    ms, waiting = survivor.expect("cpu", 30.0)
    assert int(waiting) == 4
    assert float(ms) < IDLE_BOUND_MS, f"the survivor, idle, used {float(ms):.2f} ms of CPU per second"
    survivor.close()


NO_WATCH_PLATFORM = r"""
import logging, sys, threading, time
from leasequeue import SQLiteTransport
sys.platform = "win32"  # stands for a platform with neither inotify nor kqueue (this is Linux: no kqueue)
path = sys.argv[1]
ts = [SQLiteTransport(path), SQLiteTransport(path)]
for t in ts:
    threading.Thread(target=t.claim, args=("w", 30), kwargs={"timeout": 10}, daemon=True).start()
while not all(t._queue.waiters and t._watcher.mechanism for t in ts):
    time.sleep(0.005)
print(",".join(t._watcher.mechanism for t in ts), flush=True)
for t in ts:
    t.close()
"""


@pytest.mark.skipif(KERNEL != "inotify", reason="pretends a Linux machine has no kernel watch")
def test_a_platform_without_a_kernel_watch_says_so_once_in_the_log(tmp_path: Any) -> None:
    path = str(tmp_path / "q.db")
    SQLiteTransport(path).close()
    out = subprocess.run([sys.executable, "-c", NO_WATCH_PLATFORM, path], capture_output=True, text=True,
                         env=_env("kernel"), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "poll,poll"
    lines = [line for line in out.stderr.splitlines() if "no kernel file watch" in line]
    assert len(lines) == 1, out.stderr  # once per process, not once per transport
    assert "win32" in lines[0] and "LEASEQUEUE_SQLITE_WATCH=poll" in lines[0]


@needs_kernel
@pytest.mark.parametrize("how", ["relative-then-chdir", "through-a-symlink"])
def test_the_watch_finds_the_wal_the_transport_uses(tmp_path: Any, monkeypatch: Any, how: str) -> None:
    """A transport opened with a relative path keeps watching its own WAL
    after os.chdir(); one opened through a symlink watches the WAL SQLite
    writes (next to the real file).  Either way a commit on the file through
    another transport (another connection: through the watch) wakes it."""
    real = tmp_path / "data" / "q.db"
    real.parent.mkdir()
    if how == "relative-then-chdir":
        monkeypatch.chdir(real.parent)
        waiting_on: Any = "q.db"
    else:
        (tmp_path / "link.db").symlink_to(real)
        waiting_on = tmp_path / "link.db"
    with SQLiteTransport(waiting_on) as a, SQLiteTransport(real) as b:
        if how == "relative-then-chdir":
            monkeypatch.chdir(tmp_path)
        got: List[Any] = []
        waiting = threading.Thread(target=lambda: got.append(a.claim("w", 30, timeout=LIVENESS)), daemon=True)
        waiting.start()
        _until(lambda: a._queue.waiters and a._watcher._watch is not None, "a's claim waiting, its watch armed")
        assert a._watcher._watch.wal == os.path.realpath(real) + "-wal"  # type: ignore[union-attr]
        time.sleep(0.05)
        b.publish("g", how)
        waiting.join(LIVENESS)
        assert got and got[0] is not None and got[0].event == how
