"""``publish(..., conn=)`` on PostgreSQL: the publish is part of the
application's transaction.  Visible to other processes exactly at the
commit, never after a rollback; the application's own row and the message
commit (or roll back) together; a waiting claim in another process wakes at
the commit, not before; seqs follow commit order in a group (gaps after a
rollback); what an open publish blocks; the connection's settings are left
alone.  Real server, real child processes (``tx_helpers.other``)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any, Callable, List

import psycopg
import pytest
from psycopg.rows import dict_row

from tx_helpers import LIVENESS, app_rows, app_table, child_env, other, other_claim


def test_a_rolled_back_publish_leaves_no_message(conninfo: str, make_pg: Callable[..., Any],
                                                  queue_name: str) -> None:
    t = make_pg(queue_name)
    with psycopg.connect(conninfo) as conn:
        seq = t.publish("g", "lost", conn=conn)
        assert seq > 0
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # not committed by us
        assert other_claim(conninfo, queue_name) is None
        conn.rollback()
    assert other_claim(conninfo, queue_name) is None
    assert other(conninfo, queue_name, "stats") == [0] * 7
    assert len(t) == 0 and t.groups() == []


def test_a_committed_publish_is_claimable_elsewhere_after_the_commit_not_before(
        conninfo: str, make_pg: Callable[..., Any], queue_name: str) -> None:
    t = make_pg(queue_name)
    with psycopg.connect(conninfo) as conn:
        seq = t.publish("g", {"step": "ship"}, conn=conn)
        many = t.publish_many([("h", "h1"), ("h", "h2")], conn=conn)
        assert other(conninfo, queue_name, "stats")[0] == 0
        assert other_claim(conninfo, queue_name) is None
        conn.commit()
    got = other_claim(conninfo, queue_name)
    assert got is not None and (got["seq"], got["event"], got["attempt"]) == (seq, {"step": "ship"}, 1)
    assert [m.seq for m in t.peek("h", 5)] == many
    assert len(t) == 3


@pytest.mark.parametrize("outcome", ["commit", "rollback", "exception"])
def test_the_applications_row_and_the_message_commit_together(
        conninfo: str, make_pg: Callable[..., Any], queue_name: str, outcome: str) -> None:
    t = make_pg(queue_name)
    table = app_table(conninfo)
    with psycopg.connect(conninfo) as conn:
        try:
            with conn.transaction():
                conn.execute(f"INSERT INTO {table} VALUES (17, 'charged')")
                t.publish("order-17", {"step": "ship"}, conn=conn)
                if outcome == "exception":
                    raise KeyError("the handler failed after publishing")
                if outcome == "rollback":
                    raise psycopg.Rollback()
        except KeyError:
            pass
    committed = outcome == "commit"
    assert app_rows(conninfo, table) == ([(17, "charged")] if committed else [])
    got = other_claim(conninfo, queue_name)
    assert (got is not None) is committed
    if committed:
        assert got["event"] == {"step": "ship"}


# A waiting claim in a child process: it reports when it got its lease.
_WAITER = r"""
import json, sys, time
from leasequeue import PostgresTransport
conninfo, queue = sys.argv[1:3]
with PostgresTransport(conninfo, queue=queue) as t:
    print("waiting", flush=True)
    lease = t.claim("waiter", 60.0, timeout=30.0)
    print(json.dumps({"at": time.time(), "event": lease and lease.event}), flush=True)
"""


def _signed_up(conninfo: str, queue: str) -> bool:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM leasequeue.listeners l JOIN leasequeue.queues q "
                           "ON q.id = l.queue WHERE q.name = %s", (queue,)).fetchone()
        return bool(row and row[0])


@pytest.mark.parametrize("group", ["new group", "existing group"])
def test_a_waiting_claim_in_another_process_wakes_at_the_commit(
        conninfo: str, make_pg: Callable[..., Any], queue_name: str, group: str) -> None:
    t = make_pg(queue_name)
    if group == "existing group":  # the group exists (leased): the message becomes claimable by the ack
        t.publish("g", "first")
        first = t.claim("w", 60)
    child = subprocess.Popen([sys.executable, "-c", _WAITER, conninfo, queue_name], env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "waiting"
        deadline = time.monotonic() + LIVENESS
        while not _signed_up(conninfo, queue_name):  # it sleeps on LISTEN now
            assert time.monotonic() < deadline, "the waiting claim never signed up"
            time.sleep(0.02)
        with psycopg.connect(conninfo) as conn:
            if group == "existing group":
                t.publish("g", "second", conn=conn)
                t.ack(first, conn=conn)
            else:
                t.publish("g", "second", conn=conn)
            time.sleep(0.5)
            assert child.poll() is None  # not woken (nor served) before the commit
            committed_at = time.time()
            conn.commit()
        out, err = child.communicate(timeout=LIVENESS)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    report = json.loads(out.strip().splitlines()[-1])
    assert report["event"] == "second", err
    assert report["at"] >= committed_at
    assert report["at"] - committed_at < 5.0  # woken by the NOTIFY (the timeout was 30 s)


def test_seqs_follow_commit_order_in_a_group_with_gaps_after_a_rollback(
        conninfo: str, make_pg: Callable[..., Any], queue_name: str) -> None:
    t = make_pg(queue_name)
    with psycopg.connect(conninfo) as a:
        rolled_back = t.publish("g", "rolled back", conn=a)
        a.rollback()
    after = t.publish("g", "after")
    assert after > rolled_back  # never reused: a gap

    # Two open transactions publishing to one group: the second waits for
    # the first's commit, so seq order is commit order.
    seqs: List[int] = []
    with psycopg.connect(conninfo) as a, psycopg.connect(conninfo) as b:
        first = t.publish("g", "a", conn=a)
        started = threading.Event()

        def second() -> None:
            started.set()
            seqs.append(t.publish("g", "b", conn=b))
            b.commit()

        thread = threading.Thread(target=second)
        thread.start()
        started.wait()
        time.sleep(0.3)
        assert seqs == []  # blocked behind a's open publish to the group
        a.commit()
        thread.join(LIVENESS)
    assert seqs and seqs[0] > first
    assert [m.event for m in t.peek("g", 5)] == ["after", "a", "b"]


def test_an_open_publish_blocks_its_group_not_the_others(
        conninfo: str, make_pg: Callable[..., Any], queue_name: str) -> None:
    """What docs/decisions.md pins: a publish in an open transaction holds its
    group's lock until the transaction ends.  An ack of that group's head (by
    another worker) waits for it; other groups' publishes, claims and acks go
    on; a claim of that group's earlier message is not blocked."""
    t = make_pg(queue_name)
    t.publish("g", "g1")
    t.publish("h", "h1")
    lease_g = t.claim("w", 60)
    assert lease_g.group_id == "g"
    done: List[str] = []
    with psycopg.connect(conninfo) as conn:
        t.publish("g", "g2", conn=conn)
        acker = threading.Thread(target=lambda: (t.ack(lease_g), done.append("ack g")))
        acker.start()
        # Other groups go on meanwhile.
        t.publish("k", "k1")
        lease_h = t.claim("w", 60)
        assert lease_h is not None and lease_h.group_id == "h"
        t.ack(lease_h)
        time.sleep(0.3)
        assert done == []  # the ack of g's head waits for the transaction
        conn.commit()
        acker.join(LIVENESS)
    assert done == ["ack g"]
    assert [m.event for m in t.peek("g", 5)] == ["g2"]


def test_the_connections_settings_are_left_alone(conninfo: str, make_pg: Callable[..., Any],
                                                 queue_name: str) -> None:
    t = make_pg(queue_name)
    conn = psycopg.connect(conninfo, row_factory=dict_row, prepare_threshold=None)
    try:
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        conn.execute("SET application_name = 'the app'")
        conn.commit()
        before = (conn.autocommit, conn.isolation_level, conn.prepare_threshold, conn.row_factory,
                  conn.read_only, conn.deferrable)
        seq = t.publish("g", "x", conn=conn)
        t.publish_many([("g", "y")], conn=conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        row = conn.execute("SELECT current_setting('application_name') AS app, "
                           "current_setting('transaction_isolation') AS iso").fetchone()
        assert row == {"app": "the app", "iso": "serializable"}  # the row factory is the app's still
        after = (conn.autocommit, conn.isolation_level, conn.prepare_threshold, conn.row_factory,
                 conn.read_only, conn.deferrable)
        assert after == before
        conn.commit()
        assert [m.seq for m in t.peek("g")] == [seq]
    finally:
        conn.close()


def test_an_autocommit_connection_commits_each_call(conninfo: str, make_pg: Callable[..., Any],
                                                    queue_name: str) -> None:
    """With autocommit on and no transaction block, each statement is its own
    transaction: the publish is committed when the call returns (the
    application's choice; the transport changes no setting)."""
    t = make_pg(queue_name)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        t.publish("g", "x", conn=conn)
        assert conn.autocommit
        assert other(conninfo, queue_name, "stats")[0] == 1


def test_apublish_on_an_async_connection(conninfo: str, make_pg: Callable[..., Any], queue_name: str) -> None:
    import asyncio

    t = make_pg(queue_name)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(conninfo) as conn:
            await t.apublish("g", "rolled back", conn=conn)
            await conn.rollback()
            async with conn.transaction():
                await t.apublish("g", "committed", conn=conn)
                assert other(conninfo, queue_name, "stats")[0] == 0
        await t.apublish("g", "own connection")  # conn=None: the transport's own, autocommit

    asyncio.run(main())
    assert [m.event for m in t.peek("g", 5)] == ["committed", "own connection"]


def test_an_open_transaction_holds_up_no_waiting_claim_of_other_groups(
        conninfo: str, make_pg: Callable[..., Any], queue_name: str) -> None:
    """An application's transaction that published (to a new group) and
    stays open: another process's claim that starts waiting meanwhile signs
    up and sleeps, a publish to another group is not held up, and wakes it;
    it gets that message while the transaction is still open.  (Before
    schema version 5 the transaction held the queue's shared listen lock to
    its end: the sign-up waited for it, and every announcement queued behind
    the sign-up.)"""
    t = make_pg(queue_name)
    with psycopg.connect(conninfo) as conn:
        t.publish("in-tx", "open", conn=conn)
        child = subprocess.Popen([sys.executable, "-c", _WAITER, conninfo, queue_name], env=child_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "waiting"
            deadline = time.monotonic() + 10.0
            while not _signed_up(conninfo, queue_name):
                assert time.monotonic() < deadline, "the sign-up waited for the open transaction"
                time.sleep(0.02)
            started = time.monotonic()
            t.publish("other", "free")
            assert time.monotonic() - started < 5.0
            out, err = child.communicate(timeout=LIVENESS)
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # still open
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        conn.rollback()
    assert json.loads(out.strip().splitlines()[-1])["event"] == "free", err
