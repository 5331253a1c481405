"""Errors and faults on a real server: wrong conninfo, no schema, a newer
schema, a locked table past a statement timeout, a backend killed with
pg_terminate_backend, a connection dropped mid-call (a TCP proxy cut), and a
server restart with ``pg_ctl restart -m immediate``.  In each case the
caller gets ``LeaseQueueError``, nothing is lost, no half state is left, and
the next call reconnects."""

from __future__ import annotations

import select
import socket
import threading
import time
import uuid
from typing import Any, Iterator, List

import psycopg
import pytest

from leasequeue import LeaseQueueError, PostgresTransport


def admin(conninfo: str) -> Any:
    return psycopg.connect(conninfo, autocommit=True)


@pytest.fixture
def scratch_db(conninfo: str) -> Iterator[str]:
    """A fresh database (no schema), dropped afterwards."""
    name = f"lq_{uuid.uuid4().hex[:12]}"
    with admin(conninfo) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield conninfo.replace("dbname=postgres", f"dbname={name}")
    with admin(conninfo) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_wrong_conninfo(conninfo: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(LeaseQueueError, match="cannot connect to PostgreSQL"):
        PostgresTransport(f"host=127.0.0.1 port={port} dbname=postgres connect_timeout=3")
    with pytest.raises(LeaseQueueError, match="cannot connect"):
        PostgresTransport(conninfo + "_nosuchdb")
    with pytest.raises(LeaseQueueError):
        PostgresTransport("this is = not a conninfo")
    with pytest.raises(TypeError):
        PostgresTransport(None)  # type: ignore[arg-type]


def test_database_without_schema(scratch_db: str) -> None:
    with pytest.raises(LeaseQueueError, match="no leasequeue schema.*install"):
        PostgresTransport(scratch_db)
    PostgresTransport.install(scratch_db)
    with PostgresTransport(scratch_db) as t:
        t.publish("g", 1)
        assert len(t) == 1


def test_schema_from_a_newer_version(scratch_db: str) -> None:
    PostgresTransport.install(scratch_db)
    with admin(scratch_db) as conn:
        conn.execute("UPDATE leasequeue.meta SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(LeaseQueueError, match="version 999, newer"):
        PostgresTransport(scratch_db)
    with pytest.raises(LeaseQueueError, match="version 999, newer"):
        PostgresTransport.install(scratch_db)


def test_schema_dropped_under_a_transport(scratch_db: str) -> None:
    PostgresTransport.install(scratch_db)
    t = PostgresTransport(scratch_db)
    with admin(scratch_db) as conn:
        conn.execute("DROP SCHEMA leasequeue CASCADE")
    with pytest.raises(LeaseQueueError, match="install"):
        t.publish("g", 1)
    t.close()


def test_locked_table_past_statement_timeout(conninfo: str, queue_name: str) -> None:
    t = PostgresTransport(conninfo + " options='-c statement_timeout=500'", queue=queue_name)
    t.publish("g", 1)
    lock = admin(conninfo)
    lock.execute("BEGIN")
    lock.execute("LOCK TABLE leasequeue.messages IN ACCESS EXCLUSIVE MODE")
    try:
        start = time.monotonic()
        with pytest.raises(LeaseQueueError, match="statement_timeout"):
            t.publish("g", 2)
        with pytest.raises(LeaseQueueError, match="statement_timeout"):
            t.claim("w", 30)
        assert time.monotonic() - start < 10
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert len(t) == 1  # nothing half done
    assert t.stats().leased == 0
    assert t.claim("w", 30).event == 1  # and the next call works
    t.close()


def blocked_call(conninfo: str, t: Any, call: Any) -> tuple:
    """Run ``call`` while an administrator holds a lock it needs; return the
    thread, its outcome list and the admin connection holding the lock."""
    lock = admin(conninfo)
    lock.execute("BEGIN")
    lock.execute("LOCK TABLE leasequeue.groups IN ACCESS EXCLUSIVE MODE")
    outcome: List[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: B036
            outcome.append(exc)

    th = threading.Thread(target=run)
    th.start()
    return th, outcome, lock


def backend_waiting(conninfo: str, fragment: str) -> int:
    with admin(conninfo) as conn:
        for _ in range(500):
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                (f"%{fragment}%",)).fetchone()
            if row:
                return int(row[0])
            time.sleep(0.01)
    raise AssertionError("the call never blocked on the lock")


@pytest.mark.parametrize("op", ["publish", "claim", "ack"])
def test_backend_killed_mid_call(conninfo: str, make_pg: Any, op: str) -> None:
    t = make_pg()
    t.publish("g", "first")
    lease = t.claim("w", 30) if op == "ack" else None
    calls = {"publish": lambda: t.publish("g", "second"), "claim": lambda: t.claim("w2", 30),
             "ack": lambda: t.ack(lease)}
    th, outcome, lock = blocked_call(conninfo, t, calls[op])
    pid = backend_waiting(conninfo, f"leasequeue.{op}")
    with admin(conninfo) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    th.join(10)
    lock.execute("ROLLBACK")
    lock.close()
    assert isinstance(outcome[0], LeaseQueueError), outcome
    # Nothing half done: the killed transaction rolled back entirely.
    expected = {"publish": (1, 0), "claim": (1, 0), "ack": (1, 1)}[op]
    stats = t.stats()
    assert (stats.messages, stats.leased) == expected
    # The next call reconnects.
    if op == "ack":
        t.ack(lease)
    else:
        assert t.claim("w3", 30).event == "first"


class CuttableProxy:
    """A TCP proxy to the server whose connections can be cut at once
    (a dropped network connection, as the client sees it)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.socks: List[socket.socket] = []
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 1.0)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        raise OSError
                    (b if s is a else a).sendall(data)
        except (OSError, ValueError):
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self) -> None:
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        self.socks = []

    def close(self) -> None:
        self.stopped = True
        self.cut()
        self.server.close()


def test_connection_dropped_mid_claim(conninfo: str, queue_name: str) -> None:
    """The claim's connection is cut while the server is still working on it:
    the caller gets LeaseQueueError; the claim then either committed (its
    lease exists and ends at its visibility, then the message comes again)
    or not (the message is free).  Either way nothing is lost."""
    port = int(conninfo.split("port=")[1].split()[0])
    proxy = CuttableProxy("127.0.0.1", port)
    via_proxy = conninfo.replace(f"port={port}", f"port={proxy.port}")
    try:
        t = PostgresTransport(via_proxy, queue=queue_name)
        direct = PostgresTransport(conninfo, queue=queue_name)
        t.publish("g", "x")
        th, outcome, lock = blocked_call(conninfo, t, lambda: t.claim("w", 1.0))
        backend_waiting(conninfo, "leasequeue.claim")
        proxy.cut()
        th.join(10)
        assert isinstance(outcome[0], LeaseQueueError), outcome
        lock.execute("ROLLBACK")  # the server goes on with the orphaned claim
        lock.close()
        time.sleep(0.3)
        stats = direct.stats()
        assert stats.messages == 1 and stats.leased in (0, 1)
        time.sleep(1.2)  # any lease the claim made has ended
        again = t.claim("w", 30)  # the next call reconnects (through the proxy)
        assert again.event == "x" and again.attempt in (1, 2)
        t.ack(again)
        assert len(direct) == 0
        t.close()
        direct.close()
    finally:
        proxy.close()


def test_server_restart_immediate(own_server: Any, queue_name: str) -> None:
    """pg_ctl restart -m immediate: a crash.  Committed work survives, pooled
    connections fail with LeaseQueueError once, then calls reconnect; a
    waiting claim's listener reconnects and still wakes."""
    conninfo = own_server.conninfo
    t = PostgresTransport(conninfo, queue=queue_name)
    for i in range(20):
        t.publish(f"g{i % 5}", i)
    lease = t.claim("w", 300)
    waiting: List[Any] = []
    th = threading.Thread(target=lambda: waiting.append(t.claim("waiter", 30, 7, timeout=60)))
    th.start()
    time.sleep(0.3)
    own_server.owned.restart_immediate()
    failures = 0
    for _ in range(50):
        try:
            stats = t.stats()
            break
        except LeaseQueueError:
            failures += 1
            time.sleep(0.1)
    else:
        raise AssertionError("the transport never reconnected")
    assert failures <= 2
    assert (stats.messages, stats.leased) == (20, 1)
    t.ack(lease)  # the lease survived the crash
    time.sleep(1.0)  # the listener reconnects (back-off)
    t.publish("urgent", "wake", 7)
    th.join(30)
    assert waiting and waiting[0] is not None and waiting[0].event == "wake"
    t.close()
