"""``conn=`` on SQLite (SPEC Part 5, "With the application's data"): the
operation runs in the application's own ``sqlite3`` transaction on the same
file.  Real files, real threads and processes.  The rules every backend
shares are the kit's (``_rules_transactions.py``, run by
``test_sqlite_contract.py``); here is what is SQLite's own: the connection
checks, the transaction modes of Python's ``sqlite3``, other processes, the
write lock, and the application's rows committing with the messages.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Iterator, List

import pytest

from leasequeue import LeaseLost, LeaseQueueError, SQLiteTransport

LIVENESS = 20.0


@pytest.fixture
def path(tmp_path: Any) -> str:
    return str(tmp_path / "q.db")


@pytest.fixture
def t(path: str) -> Iterator[SQLiteTransport]:
    with SQLiteTransport(path) as transport:
        with sqlite3.connect(path) as setup:
            setup.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT NOT NULL)")
        yield transport


@pytest.fixture
def conn(path: str, t: SQLiteTransport) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(path, timeout=LIVENESS)
    yield connection
    connection.close()


def _env() -> Dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def _state(t: SQLiteTransport) -> Any:
    return (len(t), tuple(t.stats()), [tuple(g) for g in t.groups()])


# -- the application's rows and the messages, together ---------------------------------------


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_the_applications_row_and_the_message_commit_and_roll_back_together(
    t: SQLiteTransport, conn: sqlite3.Connection, outcome: str
) -> None:
    t.publish("order-17", {"step": "charge"})
    lease = t.claim("w", 30)
    try:
        with conn:  # sqlite3's own: commit on success, roll back on an exception
            conn.execute("INSERT INTO orders VALUES (17, 'charged')")
            t.publish("order-17", {"step": "ship"}, conn=conn)
            t.ack(lease, conn=conn)
            if outcome == "rollback":
                raise RuntimeError("the handler failed")
    except RuntimeError:
        pass
    rows = sqlite3.connect(t.path).execute("SELECT id, state FROM orders").fetchall()
    if outcome == "commit":
        assert rows == [(17, "charged")]
        assert [m.event for m in t.peek("order-17", 10)] == [{"step": "ship"}]
        with pytest.raises(LeaseLost):
            t.ack(lease)
    else:
        assert rows == []
        assert [m.event for m in t.peek("order-17", 10)] == [{"step": "charge"}]
        t.ack(lease)  # the rolled-back ack left it current
        assert len(t) == 0


def test_the_transport_never_commits_nor_rolls_back_the_applications_transaction(
    t: SQLiteTransport, conn: sqlite3.Connection
) -> None:
    t.publish("g", 1)
    stale = t.claim("w", 30)
    t.nack(stale)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO orders VALUES (1, 'x')")
    t.publish("g", 2, conn=conn)
    assert conn.in_transaction
    with pytest.raises(LeaseLost):
        t.nack(stale, 30.0, conn=conn)  # park_time ran, park found the lease stale: rolled back to the savepoint
    assert conn.in_transaction
    assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1  # the application's row is still there
    conn.commit()
    assert t.stats()[:4] == (2, 1, 0, 0)  # two messages, one group, nothing leased or parked
    assert [m.event for m in t.peek("g", 10)] == [1, 2]


def test_the_connections_settings_are_left_alone(t: SQLiteTransport, path: str) -> None:
    conn = sqlite3.connect(path, isolation_level="DEFERRED")
    conn.row_factory = sqlite3.Row
    conn.text_factory = bytes
    settings = (conn.isolation_level, conn.row_factory, conn.text_factory, conn.total_changes >= 0)
    with conn:
        assert t.publish("g", "e", key="k", conn=conn) == 1
        assert t.publish_many([("g", "f"), ("h", "x", 0, "k")], conn=conn) == [2, 3]
    assert (conn.isolation_level, conn.row_factory, conn.text_factory, True) == settings
    assert [m.key for m in t.peek("g", 10)] == ["k", None]
    conn.close()


# -- the transaction modes of Python's sqlite3 --------------------------------------------------


def test_an_implicit_transaction_not_yet_begun_is_opened_and_left_to_the_application(
    t: SQLiteTransport, conn: sqlite3.Connection
) -> None:
    assert conn.isolation_level == "" and not conn.in_transaction  # the default: implicit transactions
    seq = t.publish("g", "e", conn=conn)
    assert conn.in_transaction, "the transport committed the transaction it opened"
    assert len(t) == 0
    conn.commit()
    assert len(t) == 1 and t.claim("w", 30).seq == seq


def test_an_implicit_transaction_the_application_never_commits_leaves_nothing(t: SQLiteTransport, path: str) -> None:
    conn = sqlite3.connect(path)
    t.publish("g", "e", conn=conn)
    conn.close()  # closing without commit rolls back
    assert len(t) == 0 and t.claim("w", 30) is None


def test_a_lease_lost_outside_a_transaction_leaves_none_open(t: SQLiteTransport, conn: sqlite3.Connection) -> None:
    t.publish("g", "e")
    lease = t.claim("w", 30)
    t.ack(lease)
    with pytest.raises(LeaseLost):
        t.ack(lease, conn=conn)
    assert not conn.in_transaction  # the transaction it opened for the ack is gone: no write lock held
    t.publish("g", "f")  # the file is not locked


@pytest.mark.parametrize("mode", ["isolation_level=None", "autocommit=True"])
def test_autocommit_outside_a_transaction_is_refused_and_changes_nothing(
    t: SQLiteTransport, path: str, mode: str
) -> None:
    if mode == "autocommit=True":
        if sys.version_info < (3, 12):
            pytest.skip("sqlite3.connect(autocommit=) is Python 3.12+")
        conn = sqlite3.connect(path, autocommit=True)  # type: ignore[call-arg]
    else:
        conn = sqlite3.connect(path, isolation_level=None)
    t.publish("g", "e")
    lease = t.claim("w", 30)
    before = _state(t)
    for call in (lambda: t.publish("g", "x", conn=conn), lambda: t.ack(lease, conn=conn),
                 lambda: t.publish_many([("g", "x")], conn=conn), lambda: t.release(lease, conn=conn)):
        with pytest.raises(ValueError, match="autocommit mode and not inside a transaction"):
            call()
        assert not conn.in_transaction
    assert _state(t) == before
    conn.execute("BEGIN IMMEDIATE")  # the application's own transaction: then it works
    t.ack(lease, conn=conn)
    conn.execute("COMMIT")
    assert len(t) == 0
    conn.close()


# -- bad input ------------------------------------------------------------------------------------


def test_a_connection_to_another_file_or_to_memory_is_a_value_error(t: SQLiteTransport, tmp_path: Any) -> None:
    t.publish("g", "e")
    lease = t.claim("w", 30)
    before = _state(t)
    other_db = sqlite3.connect(str(tmp_path / "other.db"))
    memory = sqlite3.connect(":memory:")
    temporary = sqlite3.connect("")
    attached = sqlite3.connect(str(tmp_path / "app.db"))
    attached.execute("ATTACH DATABASE ? AS queue", (t.path,))  # the file attached is not main: refused too
    for bad, what in ((other_db, "other.db"), (memory, "in-memory"), (temporary, "in-memory"), (attached, "app.db")):
        for call in (lambda: t.publish("g", "x", conn=bad), lambda: t.ack(lease, conn=bad),
                     lambda: t.nack(lease, conn=bad), lambda: t.bury(lease, conn=bad)):
            with pytest.raises(ValueError, match=what):
                call()
        assert not bad.in_transaction
    assert _state(t) == before
    assert other_db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0  # nothing written there
    t.ack(lease)


def test_the_same_file_through_a_symbolic_link_or_a_relative_path_is_accepted(
    t: SQLiteTransport, tmp_path: Any, monkeypatch: Any
) -> None:
    link = tmp_path / "link.db"
    os.symlink(t.path, link)
    monkeypatch.chdir(tmp_path)
    for name in (str(link), "q.db", "./link.db"):
        conn = sqlite3.connect(name)
        with conn:
            t.publish("g", name, conn=conn)
        conn.close()
    assert [m.event for m in t.peek("g", 10)] == [str(link), "q.db", "./link.db"]


def test_a_hard_link_to_the_file_is_refused(t: SQLiteTransport, tmp_path: Any) -> None:
    """Another name of the same file would have another WAL: refused, clearly
    (or, in a process where SQLite itself notices the file is open under
    another name, with SQLite's own error before anything is written)."""
    hard = tmp_path / "hard.db"
    os.link(t.path, hard)
    conn = sqlite3.connect(str(hard))
    with pytest.raises((ValueError, sqlite3.OperationalError), match="hard link|disk I/O error"):
        t.publish("g", "e", conn=conn)
    conn.close()
    assert len(t) == 0


def test_a_closed_connection_is_a_value_error(t: SQLiteTransport, path: str) -> None:
    conn = sqlite3.connect(path)
    conn.close()
    t.publish("g", "e")
    lease = t.claim("w", 30)
    with pytest.raises(ValueError, match="conn is closed"):
        t.publish("g", "x", conn=conn)
    with pytest.raises(ValueError, match="conn is closed"):
        t.ack_many([lease], conn=conn)
    t.ack(lease)
    assert len(t) == 0


@pytest.mark.parametrize("bad", [object(), "q.db", 1, None.__class__])
def test_a_conn_that_is_not_a_connection_is_a_type_error(t: SQLiteTransport, bad: Any) -> None:
    with pytest.raises(TypeError, match="sqlite3.Connection"):
        t.publish("g", "e", conn=bad)
    assert len(t) == 0


def test_a_closed_transport_raises_lease_queue_error(t: SQLiteTransport, conn: sqlite3.Connection) -> None:
    t.close()
    with pytest.raises(LeaseQueueError):
        t.publish("g", "e", conn=conn)
    assert not conn.in_transaction


def test_a_transaction_with_a_failed_statement_goes_on(t: SQLiteTransport, conn: sqlite3.Connection) -> None:
    """SQLite has no "failed transaction" state: after a constraint error the
    transaction is still open and usable, and the operation joins it."""
    conn.execute("INSERT INTO orders VALUES (1, 'a')")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO orders VALUES (1, 'b')")
    assert conn.in_transaction
    t.publish("g", "e", conn=conn)
    conn.commit()
    assert len(t) == 1 and conn.execute("SELECT state FROM orders").fetchall() == [("a",)]


def test_a_transaction_rolled_back_by_the_application_after_the_operation_leaves_nothing(
    t: SQLiteTransport, conn: sqlite3.Connection
) -> None:
    conn.execute("BEGIN IMMEDIATE")
    seqs = t.publish_many([("g", 1), ("h", 2)], conn=conn, delay=5.0)
    assert seqs == [1, 2]
    conn.rollback()
    assert _state(t) == (0, (0, 0, 0, 0, 0, 0, 0), [])
    assert t.publish("g", 3) == 1  # the counter rolled back with it: the seq is taken again, nobody saw 1


# -- the write lock: what an open transaction blocks -----------------------------------------------


def test_an_open_write_transaction_makes_other_writers_wait_up_to_their_busy_timeout(
    t: SQLiteTransport, conn: sqlite3.Connection, path: str
) -> None:
    t.publish("g", "e")
    impatient = SQLiteTransport(path, busy_timeout=0.2)
    patient = SQLiteTransport(path, busy_timeout=LIVENESS)
    try:
        conn.execute("BEGIN IMMEDIATE")
        t.publish("h", "x", conn=conn)
        started = time.monotonic()
        with pytest.raises(LeaseQueueError, match="locked"):
            impatient.claim("w", 30)  # waited its busy timeout, then gave up: nothing changed
        assert time.monotonic() - started >= 0.15
        assert len(impatient) == 1  # reads go on (WAL): the committed state
        got: List[Any] = []
        claimer = threading.Thread(target=lambda: got.append(patient.claim("w", 30)))
        claimer.start()
        time.sleep(0.3)
        assert got == []  # still waiting for the write lock
        conn.commit()
        claimer.join(LIVENESS)
        assert got and got[0] is not None and got[0].group_id == "g"
        assert impatient.claim("w", 30).group_id == "h"  # and the lock is free again
    finally:
        impatient.close()
        patient.close()


ACK_THEN_WAIT = r"""
import sqlite3, sys, time
from leasequeue import SQLiteTransport, Lease
path = sys.argv[1]
t = SQLiteTransport(path)
conn = sqlite3.connect(path)
conn.execute("BEGIN IMMEDIATE")
t.ack(Lease(1, "g", None, "w", 0.0, 1), conn=conn)  # rebuilt from its fields
print("acked", flush=True)
sys.stdin.readline()
conn.commit() if sys.argv[2] == "commit" else conn.rollback()
print("ended", flush=True)
"""

CLAIM = r"""
import json, sys
from leasequeue import SQLiteTransport
t = SQLiteTransport(sys.argv[1], busy_timeout=30)
lease = t.claim("other", 30)
print(json.dumps(None if lease is None else [lease.seq, lease.attempt]), flush=True)
"""


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_an_ack_in_another_process_holds_its_delivery_past_the_lease_until_it_ends(
    tmp_path: Any, outcome: str
) -> None:
    """Process A acks in its transaction and waits; the lease expires; process
    B claims meanwhile: B waits for A's write lock, and then gets the next
    message (A committed) or the acked one again, attempt 2 (A rolled back);
    never the acked one while A's ack may still commit."""
    path = str(tmp_path / "q.db")
    clock = [1000.0]
    with SQLiteTransport(path, clock=lambda: clock[0]) as t:
        t.publish("g", "e1")
        t.publish("g", "e2")
        assert t.claim("w", 10).seq == 1
    acker = subprocess.Popen([sys.executable, "-c", ACK_THEN_WAIT, path, outcome], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=_env())
    claimer = None
    try:
        assert acker.stdout is not None and acker.stdin is not None
        assert acker.stdout.readline().strip() == "acked"
        # the real clock is far past the lease's end (1010): it has expired
        claimer = subprocess.Popen([sys.executable, "-c", CLAIM, path], stdout=subprocess.PIPE, text=True,
                                   env=_env())
        time.sleep(1.0)
        assert claimer.poll() is None, "a claim went through while another process's transaction held the file"
        acker.stdin.write("go\n")
        acker.stdin.flush()
        assert acker.stdout.readline().strip() == "ended"
        assert claimer.stdout is not None
        got = json.loads(claimer.stdout.readline())
        assert got == ([2, 1] if outcome == "commit" else [1, 2])
    finally:
        acker.kill()
        if claimer is not None:
            claimer.kill()
    with SQLiteTransport(path) as t:
        assert len(t) == (1 if outcome == "commit" else 2)
        assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# -- other processes: visibility and wake-ups ------------------------------------------------------


WAITER = r"""
import json, sys, time
from leasequeue import SQLiteTransport
t = SQLiteTransport(sys.argv[1])
print("ready", flush=True)
lease = t.claim("far", 30, timeout=float(sys.argv[2]))
print(json.dumps(None if lease is None else [time.time(), lease.seq, lease.event]), flush=True)
"""

PEER = r"""
import json, sys
from leasequeue import SQLiteTransport
t = SQLiteTransport(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "claim":
        lease = t.claim("peer", 30)
        print(json.dumps(None if lease is None else [lease.seq, lease.event]), flush=True)
    else:
        print(json.dumps([len(t), [m.event for m in t.peek("g", 10)]]), flush=True)
"""


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_another_process_sees_the_publish_after_the_commit_not_before(
    t: SQLiteTransport, conn: sqlite3.Connection, outcome: str
) -> None:
    peer = subprocess.Popen([sys.executable, "-c", PEER, t.path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=_env())
    try:
        assert peer.stdin is not None and peer.stdout is not None

        def ask(what: str) -> Any:
            peer.stdin.write(what + "\n")  # type: ignore[union-attr]
            peer.stdin.flush()  # type: ignore[union-attr]
            return json.loads(peer.stdout.readline())  # type: ignore[union-attr]

        assert peer.stdout.readline().strip() == "ready"
        conn.execute("INSERT INTO orders VALUES (1, 'new')")  # the implicit transaction begins here
        seq = t.publish("g", "inside", conn=conn)
        assert ask("look") == [0, []]  # reads go on in the other process: not there yet
        conn.commit() if outcome == "commit" else conn.rollback()
        if outcome == "commit":
            assert ask("look") == [1, ["inside"]]
            assert ask("claim") == [seq, "inside"]
        else:
            assert ask("look") == [0, []]
            assert ask("claim") is None
    finally:
        peer.kill()


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_waiting_claim_in_another_process_is_woken_by_the_commit(
    t: SQLiteTransport, conn: sqlite3.Connection, outcome: str
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", WAITER, t.path, str(LIVENESS)], stdout=subprocess.PIPE,
                            text=True, env=_env())
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # let it go to sleep in its claim
        conn.execute("BEGIN IMMEDIATE")
        seq = t.publish("g", "inside", conn=conn)
        time.sleep(0.5)
        assert proc.poll() is None, "the waiting claim returned before the commit"
        sent = time.time()
        if outcome == "commit":
            conn.commit()
        else:
            conn.rollback()
            time.sleep(0.5)
            assert proc.poll() is None, "a rolled-back publish woke the waiting claim"
            sent = time.time()
            seq = t.publish("g", "later")
        woke, got_seq, event = json.loads(proc.stdout.readline())
        proc.wait(LIVENESS)
    finally:
        proc.kill()
    assert (got_seq, event) == (seq, "inside" if outcome == "commit" else "later")
    assert woke - sent < 2.0  # a liveness bound; the documented latency is milliseconds


def test_a_waiting_claim_of_the_same_transport_is_woken_by_the_commit(
    t: SQLiteTransport, conn: sqlite3.Connection
) -> None:
    got: List[Any] = []
    waiter = threading.Thread(target=lambda: got.append(t.claim("w", 30, timeout=LIVENESS)))
    waiter.start()
    time.sleep(0.3)
    conn.execute("BEGIN IMMEDIATE")
    seq = t.publish("g", "e", conn=conn)
    time.sleep(0.3)
    assert got == []
    sent = time.monotonic()
    conn.commit()
    waiter.join(LIVENESS)
    assert got and got[0] is not None and got[0].seq == seq
    assert time.monotonic() - sent < 2.0


def test_an_ack_in_a_transaction_wakes_a_waiting_claim_for_the_next_message_at_the_commit(
    t: SQLiteTransport, conn: sqlite3.Connection
) -> None:
    t.publish("g", "e1")
    t.publish("g", "e2")
    lease = t.claim("w", 30)
    got: List[Any] = []
    waiter = threading.Thread(target=lambda: got.append(t.claim("w2", 30, timeout=LIVENESS)))
    waiter.start()
    time.sleep(0.3)
    with conn:
        t.ack(lease, conn=conn)
        time.sleep(0.3)
        assert got == []
    waiter.join(LIVENESS)
    assert got and got[0] is not None and got[0].seq == 2
