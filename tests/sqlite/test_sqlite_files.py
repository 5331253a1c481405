"""SQLite-specific rules: the file (missing directory, corrupted, foreign,
future schema, read-only, locked past the busy timeout), the constructor's
arguments, serializers, leases across instances and processes, fork and
close.  Every refusal is a clear ``LeaseQueueError`` that changes nothing."""

from __future__ import annotations

import os
import pickle
import sqlite3
import subprocess
import sys
import tempfile
import threading
from typing import Any

import pytest

import leasequeue
from leasequeue import EventDecodeError, LeaseLost, LeaseQueueError, SQLiteTransport
from leasequeue._backends.inmemory.transport_py import Lease as PyLease
from leasequeue.testing import ManualClock


def snapshot(path: Any) -> dict[str, bytes]:
    """Every file of the database (main, -wal, -shm, -journal) byte for byte."""
    path = str(path)
    out = {}
    for suffix in ("", "-wal", "-shm", "-journal"):
        if os.path.exists(path + suffix):
            with open(path + suffix, "rb") as f:
                out[suffix] = f.read()
    return out


def fill(path: Any) -> None:
    with SQLiteTransport(path) as t:
        t.publish("a", 1)
        t.publish("b", 2)


# -- the file -------------------------------------------------------------------------


def test_missing_directory(tmp_path: Any) -> None:
    with pytest.raises(LeaseQueueError, match="does not exist"):
        SQLiteTransport(tmp_path / "nope" / "q.db")
    assert not (tmp_path / "nope").exists()


def test_not_a_database(tmp_path: Any) -> None:
    path = tmp_path / "q.db"
    path.write_bytes(b"hello, this is a text file\n" * 20)
    before = snapshot(path)
    with pytest.raises(LeaseQueueError, match="not a SQLite database"):
        SQLiteTransport(path)
    assert snapshot(path) == before


def test_a_directory_is_refused(tmp_path: Any) -> None:
    with pytest.raises(LeaseQueueError):
        SQLiteTransport(tmp_path)


def test_corrupted_pages(tmp_path: Any) -> None:
    path = tmp_path / "q.db"
    with SQLiteTransport(path) as t:
        t.publish_many([(f"g{i}", "x" * 100) for i in range(300)])
    data = bytearray(path.read_bytes())
    assert len(data) > 8192
    data[4096:] = os.urandom(len(data) - 4096)  # everything but the header page
    path.write_bytes(bytes(data))
    with pytest.raises(LeaseQueueError, match="corrupted|malformed|not a database"):
        with SQLiteTransport(path) as t:
            t.claim("w", 10)
            t.stats()


@pytest.mark.parametrize("kind", ["table", "application_id"])
def test_a_foreign_sqlite_file_is_left_untouched(tmp_path: Any, kind: str) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    if kind == "table":
        conn.execute("CREATE TABLE users (name TEXT)")
        conn.execute("INSERT INTO users VALUES ('ada')")
    else:
        conn.execute("PRAGMA application_id = 1234")
        conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before = snapshot(path)
    with pytest.raises(LeaseQueueError, match="not a leasequeue database|another application"):
        SQLiteTransport(path)
    assert snapshot(path) == before


def test_an_empty_file_becomes_a_database(tmp_path: Any) -> None:
    path = tmp_path / "q.db"
    path.write_bytes(b"")
    with SQLiteTransport(path) as t:
        assert t.publish("a", 1) == 1
    with SQLiteTransport(path) as t:
        assert len(t) == 1


def test_a_newer_schema_version_is_refused(tmp_path: Any) -> None:
    path = tmp_path / "q.db"
    fill(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    before = snapshot(path)
    with pytest.raises(LeaseQueueError, match="schema version 99, newer"):
        SQLiteTransport(path)
    assert snapshot(path) == before


def test_an_older_schema_version_is_refused(tmp_path: Any) -> None:
    """Schema version 3 changed the publish view; a version 2 file (a
    pre-release: no migration from it) is refused and left untouched.
    Version 3 (0.3) files are upgraded: tests/sqlite/test_sqlite_upgrade.py."""
    path = tmp_path / "q.db"
    fill(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    before = snapshot(path)
    with pytest.raises(LeaseQueueError, match="schema version 2, from a pre-release: it cannot be upgraded"):
        SQLiteTransport(path)
    assert snapshot(path) == before


def test_locked_past_the_busy_timeout(tmp_path: Any) -> None:
    path = tmp_path / "q.db"
    fill(path)
    with SQLiteTransport(path, busy_timeout=0.2) as t:
        lease = t.claim("w", 100)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            for call in (lambda: t.publish("c", 3), lambda: t.claim("w", 10), lambda: t.ack(lease),
                         lambda: t.stats(), lambda: t.pause("a"), lambda: t.publish_many([("d", 4)]),
                         lambda: t.ack_and_claim(lease, "w", 10)):
                with pytest.raises(LeaseQueueError, match="locked"):
                    call()
            assert len(t) == 2  # reads still work in WAL mode
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert t.stats().messages == 2
        t.ack(lease)  # the lease survived the refused calls
        assert len(t) == 1


READ_ONLY_CHILD = r"""
import os, sys
from leasequeue import SQLiteTransport, LeaseQueueError  # everything imported while still root
import leasequeue._backends.sqlite.transport
os.setgid(65534); os.setuid(65534)  # then "nobody", who may read the file but not write it
try:
    t = SQLiteTransport(sys.argv[1])
    t.publish("x", 1)
except LeaseQueueError as exc:
    print("refused:", exc)
else:
    print("accepted")
"""


def test_a_read_only_file(tmp_path: Any) -> None:
    directory = tempfile.mkdtemp(dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        os.chmod(directory, 0o755)
        path = os.path.join(directory, "q.db")
        fill(path)
        before = snapshot(path)
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # root ignores file modes: run the attempt as "nobody", who can read but not write.
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p))
            out = subprocess.run([sys.executable, "-c", READ_ONLY_CHILD, path], capture_output=True, text=True,
                                 env=env, timeout=60)
            assert out.stdout.startswith("refused:"), out.stdout + out.stderr
            assert "read-only" in out.stdout or "cannot open" in out.stdout or "unable" in out.stdout
        else:
            os.chmod(path, 0o444)
            os.chmod(directory, 0o555)
            with pytest.raises(LeaseQueueError):
                SQLiteTransport(path).publish("x", 1)
            os.chmod(directory, 0o755)
        assert snapshot(path) == before
        with SQLiteTransport(path) as t:
            assert len(t) == 2
    finally:
        os.chmod(directory, 0o755)
        for name in os.listdir(directory):
            os.remove(os.path.join(directory, name))
        os.rmdir(directory)


# -- the constructor ----------------------------------------------------------------------


def test_constructor_arguments(tmp_path: Any) -> None:
    path = tmp_path / "q.db"
    for kwargs, error in [
        ({"path": b"q.db"}, TypeError),
        ({"path": 3}, TypeError),
        ({"path": ":memory:"}, ValueError),
        ({"path": ""}, ValueError),
        ({"clock": 5}, TypeError),
        ({"serializer": "yaml"}, ValueError),
        ({"serializer": (pickle.dumps,)}, TypeError),
        ({"serializer": 42}, TypeError),
        ({"durable": 1}, TypeError),
        ({"busy_timeout": -1}, ValueError),
        ({"busy_timeout": float("inf")}, ValueError),
        ({"busy_timeout": "5"}, TypeError),
    ]:
        args = {"path": path, **kwargs}
        with pytest.raises(error):
            SQLiteTransport(args.pop("path"), **args)
    assert not path.exists()
    with SQLiteTransport(str(path), durable=True) as t:
        assert t._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert t._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with SQLiteTransport(path) as t:
        assert t._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert t.path == str(path)


def test_serializers(tmp_path: Any) -> None:
    with SQLiteTransport(tmp_path / "p.db") as t:
        event = {"when": 3, "what": ("a", b"\x00", 1.5)}
        t.publish("a", event)
        lease = t.claim("w", 10)
        assert lease.event == event and lease.event is not event
    with SQLiteTransport(tmp_path / "j.db", serializer="json") as t:
        t.publish("a", {"x": [1, 2]})
        assert t.claim("w", 10).event == {"x": [1, 2]}
        with pytest.raises(ValueError):
            t.publish("a", float("nan"))  # not JSON
        with pytest.raises(TypeError):
            t.publish("a", object())
        assert len(t) == 1
    with SQLiteTransport(tmp_path / "j.db", serializer=leasequeue.JSON_SERIALIZER) as t:
        assert len(t) == 1
    upper = (lambda e: e.upper(), lambda s: s.lower())
    with SQLiteTransport(tmp_path / "c.db", serializer=upper) as t:
        t.publish("a", "abc")
        assert t._conn.execute("SELECT event FROM lq_messages").fetchone()[0] == "ABC"
        assert t.claim("w", 10).event == "abc"
    with SQLiteTransport(tmp_path / "bad.db", serializer=(lambda e: 42, lambda s: s)) as t:
        with pytest.raises(TypeError, match="bytes or str"):
            t.publish("a", 1)
        assert len(t) == 0


def test_an_undecodable_event_stays_leased(tmp_path: Any) -> None:
    def loads(data: bytes) -> Any:
        raise ValueError("cannot read that")

    with SQLiteTransport(tmp_path / "q.db", serializer=(pickle.dumps, loads)) as t:
        t.publish("a", 1)
        with pytest.raises(EventDecodeError) as info:
            t.claim("w", 10)
        lease = info.value.lease
        assert lease.event == pickle.dumps(1) and lease.seq == 1
        assert t.stats().leased == 1
        t.ack(lease)  # the caller may drop it
        assert len(t) == 0
        t.publish_many([("a", 1), ("b", 2)])
        with pytest.raises(EventDecodeError) as info:
            t.claim_many("w", 10, 5)
        assert [x.seq for x in info.value.leases] == [2, 3]  # the whole batch, claimed
        assert t.ack_many(info.value.leases) == []
        t.publish("c", 3)
        t.publish("c", 4)
        with pytest.raises(EventDecodeError) as first:
            t.claim("w", 10)
        with pytest.raises(EventDecodeError) as second:
            t.ack_and_claim(first.value.lease, "w", 10)  # the ack and the claim stand
        assert second.value.lease.seq == 5 and t.stats() == (1, 1, 1, 0, 0, 0, 0)
        assert t.ack_and_claim(second.value.lease, "w", 10) is None
        assert len(t) == 0


# -- leases ----------------------------------------------------------------------------------


def test_a_lease_rebuilt_from_its_fields_is_current(tmp_path: Any) -> None:
    path = tmp_path / "q.db"
    with SQLiteTransport(path) as t, SQLiteTransport(path) as other:
        t.publish("a", 1)
        t.publish("a", 2)
        lease = t.claim("w", 10)
        rebuilt = PyLease(lease.seq, lease.group_id, None, lease.worker_id, 0.0, lease.attempt)
        assert other.extend(rebuilt, 20).expires_at > lease.expires_at
        other.ack(rebuilt)
        with pytest.raises(LeaseLost):
            t.ack(lease)
        # Both Lease classes (one and the same class when the extension is not built): two rounds.
        for cls in [type(lease), PyLease]:
            second = t.claim("w", 10)
            assert second.seq == 2
            for wrong in [
                cls(second.seq, "b", None, "w", 0.0, second.attempt),  # another group
                cls(second.seq, "a", None, "v", 0.0, second.attempt),  # another worker
                cls(second.seq, "a", None, "w", 0.0, second.attempt + 1),  # another attempt
                cls(second.seq + 1, "a", None, "w", 0.0, second.attempt),  # not the head
                cls(str(second.seq), "a", None, "w", 0.0, second.attempt),  # a str seq
                cls(second.seq, "a", None, "w", 0.0, True),  # a bool attempt
                cls(2**70, "a", None, "w", 0.0, 1),  # beyond 64 bits
            ]:
                with pytest.raises(LeaseLost):
                    t.ack(wrong)
            t.nack(cls(second.seq, "a", None, "w", 0.0, second.attempt))
        assert t.claim("w", 10).attempt == 3
    for bad in (None, (1, "a"), "lease"):
        with SQLiteTransport(path) as t:
            with pytest.raises(TypeError):
                t.ack(bad)


ACK_CHILD = r"""
import sys
from leasequeue import Lease, SQLiteTransport
t = SQLiteTransport(sys.argv[1])
seq, group, worker, attempt = int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
t.ack(Lease(seq, group, None, worker, 0.0, attempt))
print("acked", len(t))
"""


def test_another_process_acks_a_lease_from_its_fields(tmp_path: Any) -> None:
    path = str(tmp_path / "q.db")
    with SQLiteTransport(path) as t:
        t.publish("a", 1)
        t.publish("b", 2)
        lease = t.claim("w", 100)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        out = subprocess.run([sys.executable, "-c", ACK_CHILD, path, str(lease.seq), lease.group_id,
                              lease.worker_id, str(lease.attempt)], capture_output=True, text=True, env=env,
                             timeout=60)
        assert out.stdout.strip() == "acked 1", out.stderr
        with pytest.raises(LeaseLost):
            t.ack(lease)


def test_a_lease_of_another_file_is_refused(tmp_path: Any) -> None:
    with SQLiteTransport(tmp_path / "one.db") as one, SQLiteTransport(tmp_path / "two.db") as two:
        one.publish("a", 1)
        two.publish("b", 1)
        lease = one.claim("w", 10)
        two.claim("w", 10)
        with pytest.raises(LeaseLost):
            two.ack(lease)  # different group: not a delivery of this file


# -- close and fork ---------------------------------------------------------------------------


def test_a_closed_transport_refuses_every_call(tmp_path: Any) -> None:
    """After close(): a waiting claim returns None without reading the clock
    or touching the file (the worker loop ends); every other call raises
    LeaseQueueError saying the transport is closed, also before reading the
    clock; the file keeps everything."""
    clock = ManualClock()
    t = SQLiteTransport(tmp_path / "q.db", clock=clock)
    t.publish("a", 1)
    lease = t.claim("w", 10)
    t.close()
    t.close()
    assert t.closed
    with clock.misbehave(RuntimeError("the clock was read")):
        assert t.claim("w", 1, timeout=1) is None
        assert t.claim("w", 1, timeout=None) is None
        for call in (lambda: t.publish("a", 1), lambda: t.claim("w", 1), lambda: t.ack(lease), lambda: t.nack(lease),
                     lambda: t.nack(lease, 5), lambda: t.extend(lease, 1), lambda: t.stats(), lambda: len(t),
                     lambda: t.pause("a"), lambda: t.resume("a"), lambda: t.purge("a"), lambda: t.set_priority("a", 1),
                     lambda: t.group("a"), lambda: t.groups(), lambda: t.publish_many([("a", 1)]),
                     lambda: t.publish_many([]), lambda: t.claim_many("w", 1, 1), lambda: t.ack_many([lease]),
                     lambda: t.ack_many([])):
            with pytest.raises(LeaseQueueError, match="closed"):
                call()
    with SQLiteTransport(tmp_path / "q.db", clock=clock) as again:
        again.ack(lease)  # nothing was lost


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_transport_does_not_cross_fork(tmp_path: Any) -> None:
    t = SQLiteTransport(tmp_path / "q.db")
    t.publish("a", 1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: must refuse, and must not close the parent's connection
        try:
            t.publish("a", 2)
            os.write(write, b"accepted")
        except LeaseQueueError as exc:
            os.write(write, b"refused" if "fork" in str(exc) else b"other")
        except BaseException:
            os.write(write, b"error")
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 100) == b"refused"
    os.close(read)
    assert t.publish("a", 3) == 2  # the parent's connection still works
    t.close()


def test_threads_share_one_transport(tmp_path: Any) -> None:
    clock = ManualClock()
    with SQLiteTransport(tmp_path / "q.db", clock=clock) as t:
        t.publish_many([(f"g{i % 50}", i) for i in range(2000)])
        seen: list[int] = []

        def work() -> None:
            while (lease := t.claim("w", 1000)) is not None:
                seen.append(lease.event)
                t.ack(lease)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(seen) == list(range(2000))
        assert len(t) == 0
