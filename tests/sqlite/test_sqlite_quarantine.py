"""Quarantine on SQLite beyond the kit's rules (``test_sqlite_contract.py``
runs them): ``skip`` and ``resume`` wake a waiting claim in this process and
in another one (the watcher's ``PRAGMA data_version``), a bury is in the file
(another process sees it, and is refused its message), bad input and an
undecodable event in ``peek`` change nothing, and the stored rows say what
the transport says.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from typing import Any, Iterator

import pytest

from leasequeue import LeaseLost, SQLiteTransport, Undecodable
from leasequeue.testing import ManualClock

LIVENESS = 10.0  # seconds: a generous bound for "it woke up" on a loaded machine


@pytest.fixture
def t(tmp_path: Any) -> Iterator[SQLiteTransport]:
    with SQLiteTransport(tmp_path / "q.db", clock=ManualClock()) as transport:
        yield transport


def buried_group(t: SQLiteTransport, group_id: str = "g", messages: int = 2) -> Any:
    for i in range(messages):
        t.publish(group_id, f"{group_id}{i + 1}")
    lease = t.claim("w", 30)
    assert lease.group_id == group_id
    t.bury(lease, "poison")
    return lease


class Waiting:
    """A claim with a timeout, in its own thread, registered before it returns."""

    def __init__(self, t: SQLiteTransport) -> None:
        self.result: Any = "pending"
        before = len(t._queue.waiters)
        self.thread = threading.Thread(target=self._run, args=(t,), daemon=True)
        self.thread.start()
        deadline = LIVENESS
        while len(t._queue.waiters) == before and self.thread.is_alive() and deadline > 0:
            self.thread.join(0.001)
            deadline -= 0.001
        assert len(t._queue.waiters) == before + 1, "the claim did not go to sleep"

    def _run(self, t: SQLiteTransport) -> None:
        self.result = t.claim("waiter", 30, timeout=LIVENESS)

    def join(self) -> Any:
        self.thread.join(LIVENESS + 5)
        assert not self.thread.is_alive(), "the waiting claim did not return"
        return self.result


@pytest.mark.parametrize("how", ["skip", "resume"])
def test_skip_and_resume_wake_a_waiting_claim(t: SQLiteTransport, how: str) -> None:
    """A claim waiting while the only group is buried gets its message when
    an operator resumes (the same head, attempt 2) or skips (the next one)."""
    buried_group(t)
    waiting = Waiting(t)
    assert getattr(t, how)("g") is True
    lease = waiting.join()
    assert lease is not None
    assert (lease.event, lease.attempt) == (("g2", 1) if how == "skip" else ("g1", 2))


OPERATOR = r"""
import sys
from leasequeue import SQLiteTransport
with SQLiteTransport(sys.argv[1]) as t:
    print(getattr(t, sys.argv[2])(sys.argv[3]), flush=True)
"""

WAITER = r"""
import json, sys
from leasequeue import SQLiteTransport
with SQLiteTransport(sys.argv[1]) as t:
    print("ready", flush=True)
    lease = t.claim("far", 30, timeout=float(sys.argv[2]))
    print(json.dumps(None if lease is None else [lease.group_id, lease.event, lease.attempt]), flush=True)
"""


def run_python(*argv: str) -> "subprocess.Popen[str]":
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("how", ["skip", "resume"])
def test_skip_and_resume_from_another_process_wake_a_waiting_claim(tmp_path: Any, how: str) -> None:
    """The operator is another process: its commit reaches this process's
    watcher, which wakes the claim waiting here."""
    path = str(tmp_path / "q.db")
    with SQLiteTransport(path) as t:
        buried_group(t)
        waiting = Waiting(t)
        operator = run_python(OPERATOR, path, how, "g")
        try:
            out, _ = operator.communicate(timeout=LIVENESS)
        finally:
            operator.kill()
        assert out.strip() == "True"
        lease = waiting.join()
        assert lease is not None
        assert (lease.event, lease.attempt) == (("g2", 1) if how == "skip" else ("g1", 2))


def test_a_waiter_in_another_process_wakes_on_skip(tmp_path: Any) -> None:
    """And the other way round: a claim waiting in another process while the
    group is buried gets the next message when this process skips the head."""
    path = str(tmp_path / "q.db")
    with SQLiteTransport(path) as t:
        buried_group(t)
        waiter = run_python(WAITER, path, str(LIVENESS))
        try:
            assert waiter.stdout is not None
            assert waiter.stdout.readline().strip() == "ready"
            assert t.skip("g") is True
            line = waiter.stdout.readline()
            waiter.wait(LIVENESS)
        finally:
            waiter.kill()
        assert json.loads(line) == ["g", "g2", 1]


def test_a_bury_is_in_the_file(tmp_path: Any) -> None:
    """Another instance on the file sees the bury (state, reason, counts),
    claims nothing of the group, and may lift it; the rows agree."""
    path = tmp_path / "q.db"
    clock = ManualClock()
    with SQLiteTransport(path, clock=clock) as a, SQLiteTransport(path, clock=clock) as b:
        lease = buried_group(a)
        b.publish("other", "o1")
        info = b.group("g")
        assert (info.state, info.reason, info.worker_id, info.attempt, info.messages) == (
            "buried", "poison", "w", 1, 2)
        assert b.stats().buried == 1
        assert b.claim("w2", 30, -(2**63)).group_id == "other"
        assert b.claim("w2", 30, -(2**63)) is None
        with pytest.raises(LeaseLost):
            b.ack(lease)  # the buried delivery ended
        db = sqlite3.connect(path)
        try:
            assert db.execute("SELECT lock, reason, expires_at FROM lq_groups WHERE group_id = 'g'").fetchone() == (
                3, "poison", None)
            assert db.execute("SELECT buried FROM lq_quarantine").fetchone() == (1,)
        finally:
            db.close()
        assert b.resume("g") is True
        assert a.stats().buried == 0 and a.group("g").reason is None


def test_bad_input_changes_nothing(t: SQLiteTransport) -> None:
    t.publish("g", "g1")
    lease = t.claim("w", 30)
    before = (t.stats(), t.groups(), t.peek("g", 5))
    for call, error in [
        (lambda: t.bury(lease, 5), TypeError),
        (lambda: t.bury(lease, None), TypeError),
        (lambda: t.bury(lease, b"why"), TypeError),
        (lambda: t.bury(("g", 1), "x"), TypeError),
        (lambda: t.skip(5), TypeError),
        (lambda: t.skip(None), TypeError),
        (lambda: t.peek(5), TypeError),
        (lambda: t.peek("g", True), TypeError),
        (lambda: t.peek("g", 1.0), TypeError),
        (lambda: t.peek("g", -1), ValueError),
    ]:
        with pytest.raises(error):
            call()
        assert (t.stats(), t.groups(), t.peek("g", 5)) == before
    t.ack(lease)  # still current


def test_peek_of_an_undecodable_event_shows_it_and_changes_nothing(tmp_path: Any) -> None:
    def loads(data: Any) -> Any:
        if data in (b'"bad"', '"bad"'):
            raise ValueError("cannot decode")
        return json.loads(data)

    with SQLiteTransport(tmp_path / "q.db", serializer=(json.dumps, loads)) as t:
        t.publish("g", "good")
        t.publish("g", "bad")
        assert [m.event for m in t.peek("g")] == ["good"]
        bad = t.peek("g", 2)[1]
        assert bad.seq == 2 and bad.event == Undecodable('"bad"', "ValueError: cannot decode")
        assert t.stats()[:2] == (2, 1)
        assert t.claim("w", 30).event == "good"


def test_peek_is_bounded_by_max_count(t: SQLiteTransport) -> None:
    """max_count beyond SQLite's 64-bit LIMIT is accepted (every message),
    0 gives [] (and reads nothing)."""
    t.publish_many([("g", i) for i in range(5)])
    assert [m.seq for m in t.peek("g", 2**70)] == [1, 2, 3, 4, 5]
    assert t.peek("g", 0) == [] and t.peek("nobody", 3) == []


def test_closed_transport_refuses_the_new_operations(tmp_path: Any) -> None:
    from leasequeue import LeaseQueueError

    t = SQLiteTransport(tmp_path / "q.db")
    t.publish("g", 1)
    lease = t.claim("w", 30)
    t.close()
    for call in (lambda: t.bury(lease), lambda: t.skip("g"), lambda: t.peek("g"), lambda: t.peek("g", 0)):
        with pytest.raises(LeaseQueueError, match="closed"):
            call()
    with pytest.raises(TypeError):
        t.bury(lease, 5)  # arguments first, as everywhere
