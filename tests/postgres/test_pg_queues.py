"""Queues are made, not typos (PostgreSQL): the queue-name rule; only
``install(conninfo, queues=...)`` and ``create_queue`` make a queue;
``list_queues`` and ``drop_queue``; opening, reading or working on a queue
that does not exist (never made, or dropped under an open transport)
raises ``QueueNotFound``, a one-line message.  Real server."""

from __future__ import annotations

import threading
import uuid
from typing import Any, Iterator, List

import psycopg
import pytest

from leasequeue import LeaseQueueError, PostgresTransport, QueueNotFound, TransportStats


def _names(conninfo: str) -> List[str]:
    return [name for name, _stats in PostgresTransport.list_queues(conninfo)]


def _fresh() -> str:
    return f"q_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def empty_db(conninfo: str) -> Iterator[str]:
    """A database with no leasequeue schema (dropped afterwards)."""
    name = f"lq_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield conninfo.replace("dbname=postgres", f"dbname={name}")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.mark.parametrize("name", ["default", "a", "7", "orders.eu-west_2", "x" * 63, "A-b.C_d"])
def test_good_names(conninfo: str, name: str) -> None:
    PostgresTransport.create_queue(conninfo, name)
    with PostgresTransport(conninfo, queue=name) as t:
        assert t.publish("g", 1) > 0
        t.purge("g")


@pytest.mark.parametrize("bad, error", [
    (None, TypeError), (7, TypeError), (b"orders", TypeError), (["orders"], TypeError),
    ("", ValueError), ("x" * 64, ValueError), ("_orders", ValueError), ("-x", ValueError), (".x", ValueError),
    ("has space", ValueError), ("semi;colon", ValueError), ("quote'", ValueError), ("tab\t", ValueError),
    ("ordérs", ValueError), ("new\nline", ValueError), ("slash/x", ValueError),
])
def test_bad_names_change_nothing(conninfo: str, bad: Any, error: type) -> None:
    before = _names(conninfo)
    with pytest.raises(error):
        PostgresTransport.create_queue(conninfo, bad)
    with pytest.raises(error):
        PostgresTransport.drop_queue(conninfo, bad)
    with pytest.raises(error):
        PostgresTransport(conninfo, queue=bad)
    with pytest.raises(error):
        PostgresTransport.install(conninfo, queues=["fine", bad])
    assert _names(conninfo) == before  # "fine" was not made either: every name is checked first


def test_install_takes_a_list_not_a_name(conninfo: str) -> None:
    with pytest.raises(TypeError, match="single str"):
        PostgresTransport.install(conninfo, queues="orders")  # type: ignore[arg-type]


def test_install_create_list_drop(conninfo: str) -> None:
    a, b = _fresh(), _fresh()
    PostgresTransport.install(conninfo, queues=[a])
    PostgresTransport.install(conninfo, queues=[a])  # idempotent
    assert a in _names(conninfo)
    assert PostgresTransport.create_queue(conninfo, b) is True
    assert PostgresTransport.create_queue(conninfo, b) is False
    with PostgresTransport(conninfo, queue=b) as t:
        t.publish("g1", 1)
        t.publish("g1", 2)
        t.publish("g2", 3)
        t.claim("w", 60)
    listed = dict(PostgresTransport.list_queues(conninfo))
    assert listed[b] == TransportStats(messages=3, groups=2, leased=1, parked=0, paused=0, buried=0, scheduled=0)
    assert listed[a] == TransportStats(0, 0, 0, 0, 0, 0, 0)
    names = _names(conninfo)
    assert names == sorted(names)
    assert PostgresTransport.drop_queue(conninfo, b) is True
    assert PostgresTransport.drop_queue(conninfo, b) is False
    assert b not in _names(conninfo)
    with pytest.raises(QueueNotFound):
        PostgresTransport(conninfo, queue=b)
    # Made again: empty, and its seqs start afresh (a new sequence).
    assert PostgresTransport.create_queue(conninfo, b) is True
    with PostgresTransport(conninfo, queue=b) as t:
        assert len(t) == 0 and t.groups() == []
    PostgresTransport.drop_queue(conninfo, a)
    PostgresTransport.drop_queue(conninfo, b)


def test_opening_a_missing_queue_is_a_clear_error(conninfo: str) -> None:
    name = _fresh()
    with pytest.raises(QueueNotFound) as caught:
        PostgresTransport(conninfo, queue=name)
    message = str(caught.value)
    assert "\n" not in message
    assert f"queue {name!r} does not exist" in message and "create_queue" in message
    assert isinstance(caught.value, LookupError) and isinstance(caught.value, LeaseQueueError)
    assert name not in _names(conninfo)  # opening made nothing


def test_a_database_without_the_schema(empty_db: str) -> None:
    with pytest.raises(QueueNotFound, match="no leasequeue schema.*install"):
        PostgresTransport(empty_db)
    with pytest.raises(QueueNotFound, match="no leasequeue schema.*install"):
        PostgresTransport.create_queue(empty_db, "orders")
    with pytest.raises(QueueNotFound, match="no leasequeue schema"):
        PostgresTransport.list_queues(empty_db)
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT to_regnamespace('leasequeue')").fetchone() == (None,)  # nothing made
    PostgresTransport.install(empty_db, queues=())
    assert PostgresTransport.list_queues(empty_db) == []
    with pytest.raises(QueueNotFound):
        PostgresTransport(empty_db)  # install(queues=()) made no queue
    PostgresTransport.install(empty_db)  # the default: ("default",)
    with PostgresTransport(empty_db) as t:
        assert len(t) == 0


def test_a_queue_dropped_under_an_open_transport(conninfo: str) -> None:
    name = _fresh()
    PostgresTransport.create_queue(conninfo, name)
    t = PostgresTransport(conninfo, queue=name)
    try:
        t.publish("g", 1)
        lease = t.claim("w", 60)
        t.publish("h", 2)
        PostgresTransport.drop_queue(conninfo, name)
        calls = [
            lambda: t.publish("g", 3), lambda: t.publish_many([("g", 3)]), lambda: t.claim("w", 60),
            lambda: t.claim_many("w", 60, 5), lambda: t.ack(lease), lambda: t.nack(lease),
            lambda: t.extend(lease, 10), lambda: t.bury(lease), lambda: t.stats(), lambda: len(t),
            lambda: t.groups(), lambda: t.group("g"), lambda: t.peek("g"), lambda: t.pause("g"),
            lambda: t.resume("g"), lambda: t.purge("g"), lambda: t.skip("g"), lambda: t.retry("g"),
            lambda: t.set_priority("g", 3), lambda: t.ack_many([lease]),
        ]
        for call in calls:
            with pytest.raises(QueueNotFound, match="does not exist"):
                call()
        # A queue of the same name made again is another queue: the old transport still fails.
        PostgresTransport.create_queue(conninfo, name)
        with pytest.raises(QueueNotFound):
            t.stats()
        with pytest.raises(QueueNotFound):
            t.pause("g")
    finally:
        t.close()
        PostgresTransport.drop_queue(conninfo, name)
    with psycopg.connect(conninfo) as conn:  # the pause of the dropped queue left no row behind
        assert conn.execute("SELECT count(*) FROM leasequeue.groups g WHERE NOT EXISTS "
                            "(SELECT 1 FROM leasequeue.queues q WHERE q.id = g.queue)").fetchone() == (0,)


def test_a_waiting_claim_learns_its_queue_was_dropped(conninfo: str) -> None:
    name = _fresh()
    PostgresTransport.create_queue(conninfo, name)
    t = PostgresTransport(conninfo, queue=name)
    outcome: List[BaseException] = []

    def wait() -> None:
        try:
            t.claim("w", 60, timeout=30.0)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    try:
        thread.start()
        with psycopg.connect(conninfo, autocommit=True) as conn:  # wait until it sleeps (signed up)
            for _ in range(1000):
                if conn.execute("SELECT count(*) FROM leasequeue.listeners l JOIN leasequeue.queues q "
                                "ON q.id = l.queue WHERE q.name = %s", (name,)).fetchone()[0]:
                    break
                threading.Event().wait(0.01)
        PostgresTransport.drop_queue(conninfo, name)
        thread.join(10.0)
        assert not thread.is_alive(), "the waiting claim slept on"
        assert len(outcome) == 1 and isinstance(outcome[0], QueueNotFound)
    finally:
        t.close()
