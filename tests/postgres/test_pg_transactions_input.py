"""Bad ``conn=`` on PostgreSQL: the wrong kind of connection, a closed one,
one whose transaction has failed, one to another database (with or without
the leasequeue schema, or without the queue): a clear error, and the call
changes nothing."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from typing import Any, Callable, Iterator

import psycopg
import pytest

from leasequeue import PostgresTransport, QueueNotFound


@pytest.fixture
def other_db(conninfo: str) -> Iterator[str]:
    """A second database on the same server, with no schema (dropped afterwards)."""
    name = f"lq_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield conninfo.replace("dbname=postgres", f"dbname={name}")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def _every_write(t: Any, lease: Any, conn: Any) -> list:
    return [
        lambda: t.publish("g", "x", conn=conn),
        lambda: t.publish_many([("g", "x")], conn=conn),
        lambda: t.ack(lease, conn=conn),
        lambda: t.ack_many([lease], conn=conn),
        lambda: t.nack(lease, conn=conn),
        lambda: t.release(lease, conn=conn),
        lambda: t.bury(lease, conn=conn),
    ]


def _state(t: Any) -> Any:
    return (t.stats(), t.groups(), [m.seq for m in t.peek("g", 10)])


@pytest.mark.parametrize("kind", ["sqlite3", "str", "psycopg cursor", "async connection"])
def test_a_connection_of_the_wrong_kind_is_a_type_error(conninfo: str, make_pg: Callable[..., Any],
                                                       queue_name: str, kind: str) -> None:
    t = make_pg(queue_name)
    t.publish("g", "first")
    lease = t.claim("w", 60)
    before = _state(t)
    closers = []
    if kind == "sqlite3":
        bad: Any = sqlite3.connect(":memory:")
        closers.append(bad.close)
    elif kind == "str":
        bad = conninfo
    elif kind == "psycopg cursor":
        real = psycopg.connect(conninfo)
        bad = real.cursor()
        closers.append(real.close)
    else:
        bad = asyncio.run(psycopg.AsyncConnection.connect(conninfo))
        closers.append(lambda: asyncio.run(bad.close()))
    try:
        for call in _every_write(t, lease, bad):
            with pytest.raises(TypeError, match="conn"):
                call()
    finally:
        for close in closers:
            close()
    assert _state(t) == before


def test_the_async_methods_refuse_a_sync_connection(conninfo: str, make_pg: Callable[..., Any],
                                                    queue_name: str) -> None:
    t = make_pg(queue_name)
    t.publish("g", "first")
    lease = t.claim("w", 60)
    before = _state(t)
    with psycopg.connect(conninfo) as conn:
        with pytest.raises(TypeError, match="synchronous"):
            asyncio.run(t.apublish("g", "x", conn=conn))
        with pytest.raises(TypeError, match="synchronous"):
            asyncio.run(t.aack(lease, conn=conn))
        with pytest.raises(TypeError, match="AsyncConnection"):
            asyncio.run(t.aack(lease, conn=sqlite3.connect(":memory:")))
    assert _state(t) == before


def test_a_closed_connection_is_a_value_error(conninfo: str, make_pg: Callable[..., Any], queue_name: str) -> None:
    t = make_pg(queue_name)
    t.publish("g", "first")
    lease = t.claim("w", 60)
    before = _state(t)
    conn = psycopg.connect(conninfo)
    conn.close()
    for call in _every_write(t, lease, conn):
        with pytest.raises(ValueError, match="closed"):
            call()
    aconn = asyncio.run(psycopg.AsyncConnection.connect(conninfo))
    asyncio.run(aconn.close())
    with pytest.raises(ValueError, match="closed"):
        asyncio.run(t.apublish("g", "x", conn=aconn))
    assert _state(t) == before


def test_a_failed_transaction_raises_the_drivers_error(conninfo: str, make_pg: Callable[..., Any],
                                                      queue_name: str) -> None:
    t = make_pg(queue_name)
    t.publish("g", "first")
    lease = t.claim("w", 60)
    before = _state(t)
    with psycopg.connect(conninfo) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        for call in _every_write(t, lease, conn):
            with pytest.raises(psycopg.errors.InFailedSqlTransaction):
                call()
        conn.rollback()
        assert t.publish("g", "after", conn=conn) > 0  # the connection works again after the rollback
        conn.rollback()
    assert _state(t) == before


def test_a_connection_to_another_database(conninfo: str, other_db: str, make_pg: Callable[..., Any],
                                          queue_name: str) -> None:
    """No leasequeue schema there: QueueNotFound saying to install.  The
    schema and a queue of the same name there: ValueError (another
    database), and nothing is written in either."""
    t = make_pg(queue_name)
    before = _state(t)
    with psycopg.connect(other_db) as conn:
        with pytest.raises(QueueNotFound, match="no leasequeue schema.*install"):
            t.publish("g", "x", conn=conn)
    PostgresTransport.install(other_db, queues=[queue_name])
    with psycopg.connect(other_db) as conn:
        with pytest.raises(ValueError, match="another database"):
            t.publish("g", "x", conn=conn)
        conn.rollback()
    with PostgresTransport(other_db, queue=queue_name) as there:
        assert len(there) == 0
    assert _state(t) == before


def test_a_dropped_queue(conninfo: str, make_pg: Callable[..., Any], queue_name: str) -> None:
    t = make_pg(queue_name)
    with psycopg.connect(conninfo) as conn:
        t.publish("g", "checks the connection once", conn=conn)
        conn.commit()
    PostgresTransport.drop_queue(conninfo, queue_name)
    with psycopg.connect(conninfo) as fresh:
        with pytest.raises(QueueNotFound, match="does not exist"):
            t.publish("g", "x", conn=fresh)


def test_a_queue_dropped_after_the_connection_was_checked(conninfo: str, make_pg: Callable[..., Any],
                                                          queue_name: str) -> None:
    """The connection passed its first-use check; the queue is dropped
    later: a publish on it raises QueueNotFound (not the driver's "could not
    open relation"), and a failed transaction before it still gets the
    driver's own error."""
    t = make_pg(queue_name)
    with psycopg.connect(conninfo) as conn:
        t.publish("g", "checked", conn=conn)
        conn.commit()
        PostgresTransport.drop_queue(conninfo, queue_name)
        with pytest.raises(QueueNotFound, match="does not exist"):
            t.publish("g", "x", conn=conn)
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            t.publish("g", "x", conn=conn)
        conn.rollback()
