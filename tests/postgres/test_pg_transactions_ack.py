"""``ack`` / ``ack_many`` / ``nack`` / ``release`` / ``bury`` with ``conn=``
on PostgreSQL: settled by the application's commit, undone by its rollback,
and from the call to the transaction's end nobody else takes the delivery
over, even once the lease's time is past.  Real server, real child
processes (``tx_helpers.other``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import psycopg
import pytest

from leasequeue import LeaseLost
from tx_helpers import app_rows, app_table, other, other_claim


def test_an_ack_rolled_back_leaves_the_lease_current(conninfo: str, make_pg: Callable[..., Any],
                                                      queue_name: str) -> None:
    t = make_pg(queue_name)
    t.publish("g", "work")
    lease = t.claim("w", 60)
    with psycopg.connect(conninfo) as conn:
        t.ack(lease, conn=conn)
        conn.rollback()
    assert t.group("g").state == "leased"
    assert other_claim(conninfo, queue_name) is None  # still leased: nobody else gets it
    t.extend(lease, 60)  # current
    t.ack(lease)
    assert len(t) == 0


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_an_ack_held_past_the_leases_expiry_is_taken_over_by_nobody(
        conninfo: str, make_pg: Callable[..., Any], queue_name: str, outcome: str) -> None:
    """The ack is called while the lease is current; the transaction then
    stays open past the lease's end: another process's claims get nothing
    meanwhile.  Commit: the message is gone, delivered to nobody else.
    Rollback: the lease is as it was (run out), and the message returns to
    the next claim, as after any expiry."""
    t = make_pg(queue_name)
    table = app_table(conninfo)
    t.publish("g", "charge")
    lease = t.claim("w", 1.0)
    with psycopg.connect(conninfo) as conn:
        conn.execute(f"INSERT INTO {table} VALUES (1, 'charged')")
        t.ack(lease, conn=conn)
        time.sleep(1.5)  # past expires_at, by the server's clock
        assert other_claim(conninfo, queue_name) is None
        assert other_claim(conninfo, queue_name) is None
        if outcome == "commit":
            conn.commit()
        else:
            conn.rollback()
    if outcome == "commit":
        assert app_rows(conninfo, table) == [(1, "charged")]
        assert other_claim(conninfo, queue_name) is None
        assert len(t) == 0
    else:
        assert app_rows(conninfo, table) == []
        got = other_claim(conninfo, queue_name)
        assert got is not None and (got["seq"], got["attempt"]) == (lease.seq, 2)
        with pytest.raises(LeaseLost):
            t.ack(lease)


def test_the_ack_is_checked_when_called(conninfo: str, make_pg: Callable[..., Any], queue_name: str) -> None:
    """A lease that is not current when ack(conn=) is called raises LeaseLost
    at once, inside the transaction, which goes on (nothing failed in it)."""
    t = make_pg(queue_name)
    t.publish("g", "x")
    lease = t.claim("w", 60)
    t.ack(lease)
    with psycopg.connect(conninfo) as conn:
        with pytest.raises(LeaseLost):
            t.ack(lease, conn=conn)
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the transaction is usable still
        conn.commit()


@pytest.mark.parametrize("what", ["nack", "release", "bury", "nack later"])
def test_hand_backs_in_a_transaction(conninfo: str, make_pg: Callable[..., Any], queue_name: str,
                                     what: str) -> None:
    t = make_pg(queue_name)
    t.publish("g", "x")
    lease = t.claim("w", 60)

    def act(conn: Any) -> None:
        if what == "nack":
            t.nack(lease, conn=conn)
        elif what == "release":
            t.release(lease, conn=conn)
        elif what == "bury":
            t.bury(lease, "poison", conn=conn)
        else:
            t.nack(lease, 30.0, conn=conn)

    with psycopg.connect(conninfo) as conn:
        act(conn)
        conn.rollback()
    assert t.group("g").state == "leased"  # rolled back: the lease is as it was
    with psycopg.connect(conninfo) as conn:
        act(conn)
        assert t.group("g").state == "leased"  # not before the commit
        conn.commit()
    expected = {"nack": "ready", "release": "ready", "bury": "buried", "nack later": "parked"}[what]
    assert t.group("g").state == expected
    got = other_claim(conninfo, queue_name)
    if what in ("nack", "release"):
        assert got is not None and got["attempt"] == (2 if what == "nack" else 1)
    else:
        assert got is None


def test_ack_many_in_a_transaction(conninfo: str, make_pg: Callable[..., Any], queue_name: str) -> None:
    t = make_pg(queue_name)
    t.publish_many([("a", 1), ("b", 2)])
    leases = t.claim_many("w", 60, 2)
    with psycopg.connect(conninfo) as conn:
        assert t.ack_many(leases, conn=conn) == []
        assert other(conninfo, queue_name, "stats")[:3] == [2, 2, 2]
        conn.rollback()
    assert len(t) == 2
    with psycopg.connect(conninfo) as conn:
        assert t.ack_many(leases, conn=conn) == []
        conn.commit()
    assert len(t) == 0


def test_aack_on_an_async_connection(conninfo: str, make_pg: Callable[..., Any], queue_name: str) -> None:
    t = make_pg(queue_name)
    t.publish("g", "x")
    t.publish("h", "y")

    async def main() -> None:
        lease = await t.aclaim("w", 60, timeout=0)
        async with await psycopg.AsyncConnection.connect(conninfo) as conn:
            await t.aack(lease, conn=conn)
            await conn.rollback()
            assert t.group(lease.group_id).state == "leased"
            async with conn.transaction():
                await t.aack(lease, conn=conn)
            with pytest.raises(LeaseLost):
                await t.aack(lease, conn=conn)
        other_lease = await t.aclaim("w", 60, timeout=0)
        await t.aack(other_lease)  # conn=None: the transport's own connection

    asyncio.run(main())
    assert len(t) == 0
