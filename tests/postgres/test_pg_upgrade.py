"""The contract's Part 4 (docs/contract.md), "Upgrades keep data", on
PostgreSQL: a schema written by a previous release (leasequeue 0.3, schema
version 1; 0.4, schema version 2; 0.5, schema version 3) is upgraded in
place by ``install()``, in one transaction, with every message, lease, park,
pause, bury and counter kept; a schema of a newer release is refused and
left untouched.  On the upgraded schema, Part 5 (version 4) works on the old
data.

Each store is ``tests/fixtures/postgres-schemaN.sql``, a ``pg_dump`` (plain
SQL) of a database the old code itself filled
(``tests/fixtures/make_upgrade_fixtures.py``, run against commit d13ce49 for
0.3, 9e92f20 for 0.4, 1d46d15 for 0.5 and c9deb69 for 0.6), restored into a fresh database of
the suite's server; ``postgres-schemaN.json`` holds what the old code
reported on it and the claims it gave next.  Every test that starts from an
old store runs on each of them.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, Dict, Iterator, List

import psycopg
import pytest

import leasequeue
from leasequeue import LeaseLost, LeaseQueueError, PostgresTransport
from leasequeue._backends.postgres import transport as _postgres
from leasequeue._backends.sqlfiles import load_migrations
from leasequeue.testing import ManualClock

from fixtures.make_upgrade_fixtures import INT64_MIN, STOP, continue_after, report, restore_dump

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
#: The old releases' schema versions with a fixture: 0.3 (1), 0.4 (2), 0.5 (3) and 0.6 (4).
OLD_VERSIONS = (1, 2, 3, 4)
DUMPS: Dict[int, str] = {}
RECORDS: Dict[int, Dict[str, Any]] = {}
for _version in OLD_VERSIONS:
    with open(os.path.join(FIXTURES, f"postgres-schema{_version}.sql")) as _f:
        DUMPS[_version] = _f.read()
    with open(os.path.join(FIXTURES, f"postgres-schema{_version}.json")) as _f:
        RECORDS[_version] = json.load(_f)
QUEUE = "fixture"
assert all(record["queue"] == QUEUE for record in RECORDS.values())
NEW = str(_postgres.SCHEMA_VERSION)


@pytest.fixture
def new_database(conninfo: str) -> Iterator[Any]:
    """A factory of fresh, empty databases on the suite's server (dropped at the end)."""
    made: List[str] = []

    def make() -> str:
        name = f"lq_upgrade_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return psycopg.conninfo.make_conninfo(conninfo, dbname=name)

    yield make
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for name in made:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=OLD_VERSIONS, ids=[f"schema{v}" for v in OLD_VERSIONS])
def old_version(request: Any) -> int:
    """The schema version of the old release under test."""
    return int(request.param)


@pytest.fixture
def record(old_version: int) -> Dict[str, Any]:
    """What the old release reported on its store."""
    return RECORDS[old_version]


@pytest.fixture
def old_database(new_database: Any, old_version: int) -> str:
    """A fresh database holding the old release's dump, not yet upgraded."""
    target = new_database()
    restore_dump(target, DUMPS[old_version])
    return target


def version_of(conninfo: str) -> str:
    with psycopg.connect(conninfo) as conn:
        return conn.execute("SELECT value FROM leasequeue.meta WHERE key = 'schema_version'").fetchone()[0]


def fingerprint(conninfo: str, *, with_data: bool = True) -> Dict[str, Any]:
    """The schema's columns, indexes and functions (with their bodies), and
    (with_data) every row of its tables: what "untouched" and "alike" compare."""
    with psycopg.connect(conninfo) as conn:
        out: Dict[str, Any] = {
            "columns": conn.execute(
                "SELECT table_name, column_name, data_type, is_nullable, column_default, ordinal_position"
                " FROM information_schema.columns WHERE table_schema = 'leasequeue'"
                " ORDER BY table_name, ordinal_position").fetchall(),
            "indexes": conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'leasequeue' ORDER BY 1").fetchall(),
            "functions": conn.execute(
                "SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid),"
                " p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE n.nspname = 'leasequeue' ORDER BY 1, 2").fetchall(),
        }
        if with_data:
            for table in ("meta", "queues", "groups", "messages"):
                out[table] = conn.execute(f"SELECT * FROM leasequeue.{table} ORDER BY 1, 2").fetchall()
        return out


def test_the_dump_is_of_the_previous_schema(old_database: str, old_version: int, record: Dict[str, Any]) -> None:
    """The restored dump is the old release's schema; the new code will not
    use it before install() upgraded it (a clear error, nothing changed)."""
    assert version_of(old_database) == str(old_version)
    assert record["made_by"].endswith(f"PostgreSQL schema version {old_version}")
    assert _postgres.SCHEMA_VERSION == 5
    before = fingerprint(old_database)
    with pytest.raises(LeaseQueueError, match=f"version {old_version}, older than this leasequeue's .*run leasequeue"):
        PostgresTransport(old_database, queue=QUEUE)
    assert fingerprint(old_database) == before


def test_install_upgrades_a_dump_of_the_previous_release(old_database: str, record: Dict[str, Any]) -> None:
    """After install(): stats() and groups() say what the old code said; the
    old live lease, rebuilt from its fields, is acked; the next seq follows
    the old last one (the queue's sequence found again after the restore);
    the claims then come in the order the old code gave, with the old
    attempt counts."""
    PostgresTransport.install(old_database)
    assert version_of(old_database) == NEW
    clock = ManualClock(STOP)
    buried = [g[0] for g in record["at_stop"]["groups"] if g[3] == "buried"]
    with PostgresTransport(old_database, queue=QUEUE, clock=clock) as t:
        assert report(t) == record["at_stop"]
        stats = t.stats()
        assert stats.buried == len(buried) and tuple(stats[:5]) == tuple(record["at_stop"]["stats"])
        assert stats.scheduled == 0 and all(info.due_at is None for info in t.groups())
        assert {info.group_id: info.reason for info in t.groups() if info.reason is not None} == {
            group_id: "poison pill" for group_id in buried}
        assert continue_after(t, clock, leasequeue.Lease, record["live_lease"]) == record["continued"]


def test_the_new_operations_work_on_an_upgraded_schema(old_database: str, record: Dict[str, Any]) -> None:
    """peek shows the old messages and their delivery counts; the old lease
    can be buried; skip and resume act on the old groups; a second install()
    changes nothing."""
    PostgresTransport.install(old_database)
    live = record["live_lease"]
    buried_before = sum(1 for g in record["at_stop"]["groups"] if g[3] == "buried")
    clock = ManualClock(STOP)
    with PostgresTransport(old_database, queue=QUEUE, clock=clock) as t:
        assert [tuple(m) for m in t.peek("order-1", 5)] == [  # no due time, no key
            (2, {"step": "a1"}, 1, None, None), (4, {"step": "a2"}, 0, None, None), (9, {"step": "a3"}, 0, None, None)]
        lease = leasequeue.Lease(live["seq"], live["group_id"], live["event"], live["worker_id"],
                                 live["expires_at"], live["attempt"])
        t.bury(lease, "poison")
        info = t.group("order-1")
        assert (info.state, info.reason, info.worker_id, info.attempt, info.expires_at) == (
            "buried", "poison", "w-live", 1, None)
        assert t.stats().buried == buried_before + 1
        with pytest.raises(LeaseLost):
            t.ack(lease)
        assert t.skip("order-3") is True  # the parked head goes, the park with it
        assert [m.seq for m in t.peek("order-3", 5)] == [7]
    before = fingerprint(old_database)
    PostgresTransport.install(old_database)
    assert fingerprint(old_database) == before


def test_ack_and_claim_works_on_an_upgraded_schema(old_database: str, record: Dict[str, Any]) -> None:
    """What version 3 added, on an old store: the old live lease, rebuilt, is
    acked and the next message claimed in one call, and that message is the
    one the old code's first claim after its ack gave (the message the old
    code published in between went to a group that is claimed last); the
    same lease again is not current, and changes nothing."""
    PostgresTransport.install(old_database)
    live = record["live_lease"]
    clock = ManualClock(STOP)
    with PostgresTransport(old_database, queue=QUEUE, clock=clock) as t:
        lease = leasequeue.Lease(live["seq"], live["group_id"], live["event"], live["worker_id"],
                                 live["expires_at"], live["attempt"])
        got = t.ack_and_claim(lease, "drain", 30.0, INT64_MIN)
        assert got is not None
        assert [got.group_id, got.seq, got.attempt, got.event, got.expires_at] == record["continued"]["claims"][0]
        before = (t.stats(), t.groups())
        with pytest.raises(LeaseLost):
            t.ack_and_claim(lease, "drain", 30.0, INT64_MIN)
        assert (t.stats(), t.groups()) == before


def test_transactions_work_on_an_upgraded_schema(old_database: str, record: Dict[str, Any]) -> None:
    """What version 5 added (conn=, leasequeue.app_tx), on an old store: the
    old live lease, rebuilt by hand, acked in a transaction that rolls back
    is still current; acked in one that commits, its message is gone; a
    publish in a rolled-back transaction leaves nothing, a committed one is
    there; the old messages are untouched."""
    PostgresTransport.install(old_database)
    live = record["live_lease"]
    clock = ManualClock(STOP)
    with PostgresTransport(old_database, queue=QUEUE, clock=clock) as t:
        before = t.stats().messages
        old = leasequeue.Lease(live["seq"], live["group_id"], live["event"], live["worker_id"],
                               live["expires_at"], live["attempt"])
        with psycopg.connect(old_database) as conn:
            t.ack(old, conn=conn)
            t.publish("new-group", "rolled back", conn=conn)
            conn.rollback()
            assert t.stats().messages == before
            t.ack(old, conn=conn)
            seq = t.publish("new-group", "committed", conn=conn)
            conn.commit()
        assert t.stats().messages == before
        assert [(m.seq, m.event) for m in t.peek("new-group")] == [(seq, "committed")]
        assert live["seq"] not in [m.seq for m in t.peek(live["group_id"], 10)]


def test_part5_works_on_an_upgraded_schema(old_database: str, record: Dict[str, Any]) -> None:
    """What version 4 added, on an old store: the old live lease, rebuilt by
    hand (matched by its fields), is released, so its message's attempt
    count goes back to 0; a new delivery of it, released too, is fenced from
    the next one though both carry attempt 1; retry lifts the old bury; a
    delayed publish schedules a new group (stats().scheduled, due_at) until
    its due, and a keyed publish into an old group is held by the key."""
    PostgresTransport.install(old_database)
    live = record["live_lease"]
    buried = [g[0] for g in record["at_stop"]["groups"] if g[3] == "buried"]
    clock = ManualClock(STOP)
    with PostgresTransport(old_database, queue=QUEUE, clock=clock, dedup_window=60.0) as t:
        old = leasequeue.Lease(live["seq"], live["group_id"], live["event"], live["worker_id"],
                               live["expires_at"], live["attempt"])
        t.release(old)
        assert (t.peek("order-1")[0].attempt, t.group("order-1").state) == (0, "ready")
        for group_id in [g[0] for g in record["at_stop"]["groups"]]:
            if group_id != "order-1":
                t.pause(group_id)
        first = t.claim("w-live", 30.0, INT64_MIN)
        assert (first.group_id, first.seq, first.attempt) == ("order-1", 2, 1)
        t.release(first)
        second = t.claim("w-live", 30.0, INT64_MIN)
        assert (second.group_id, second.seq, second.attempt, second.worker_id) == ("order-1", 2, 1, "w-live")
        with pytest.raises(LeaseLost):
            t.ack(first)  # same fields, a closed delivery
        t.ack(second)
        t.pause("order-1")  # every old group is paused now
        for group_id in buried:
            assert t.retry(group_id) is True
            info = t.group(group_id)
            assert (info.state, info.reason, t.peek(group_id)[0].attempt) == ("paused", None, 0)
        assert t.stats().buried == 0
        seq = t.publish("later", {"step": "s1"}, delay=10.0)
        assert seq == record["continued"]["published_seq"]  # the old sequence goes on (the first publish since)
        info = t.group("later")
        assert (info.state, info.due_at, t.stats().scheduled) == ("scheduled", STOP + 10.0, 1)
        assert t.claim("w", 30.0, INT64_MIN) is None
        keyed = t.publish("order-2", {"step": "k"}, key="once")
        messages = len(t)
        assert t.publish("order-2", {"step": "k again"}, key="once") == keyed and len(t) == messages
        clock.set(STOP + 10.5)
        got = t.claim("w", 30.0, INT64_MIN)
        assert (got.group_id, got.seq, t.stats().scheduled) == ("later", seq, 0)


def test_an_upgraded_schema_is_the_schema_of_a_new_install(old_database: str, new_database: Any) -> None:
    """The migrations plus schema.sql bring the old schema to exactly the
    columns, indexes and functions that a new database gets."""
    PostgresTransport.install(old_database)
    fresh = new_database()
    PostgresTransport.install(fresh)
    assert fingerprint(old_database, with_data=False) == fingerprint(fresh, with_data=False)


def test_install_upgrades_in_one_transaction(old_database: str, monkeypatch: Any) -> None:
    """A failure part-way through the upgrade (here: after the migration, in
    an extra statement) leaves the old schema and its data exactly as they
    were; a later install() upgrades it."""
    before = fingerprint(old_database)
    real = _postgres.load_script

    def failing(backend: str, filename: str = "schema.sql") -> str:
        script = real(backend, filename)
        if filename.startswith("migrations/"):
            script += "\nSELECT no_such_column FROM leasequeue.meta;\n"
        return script

    monkeypatch.setattr(_postgres, "load_script", failing)
    with pytest.raises(LeaseQueueError, match="no_such_column"):
        PostgresTransport.install(old_database)
    assert fingerprint(old_database) == before
    monkeypatch.setattr(_postgres, "load_script", real)
    PostgresTransport.install(old_database)
    assert version_of(old_database) == NEW


def test_a_schema_of_a_newer_release_is_refused_untouched(new_database: Any) -> None:
    """install() and PostgresTransport() refuse a schema newer than this
    code's, with a clear error, and change nothing in it."""
    target = new_database()
    PostgresTransport.install(target)
    newer = _postgres.SCHEMA_VERSION + 1
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("UPDATE leasequeue.meta SET value = %s WHERE key = 'schema_version'", (str(newer),))
        # Something the newer release "changed": install() must not undo it.
        conn.execute("CREATE OR REPLACE FUNCTION leasequeue.stats_newer() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    before = fingerprint(target)
    with pytest.raises(LeaseQueueError, match=f"version {newer}, newer than this leasequeue"):
        PostgresTransport.install(target)
    with pytest.raises(LeaseQueueError, match=f"version {newer}, newer than this leasequeue"):
        PostgresTransport(target, queue="q")
    assert fingerprint(target) == before


def test_the_migrations_are_numbered_without_gaps() -> None:
    """One file per version from the oldest upgradable one up to this code's."""
    versions = [version for version, _ in load_migrations("postgres")]
    assert versions == list(range(_postgres.OLDEST_UPGRADABLE + 1, _postgres.SCHEMA_VERSION + 1))


def test_concurrent_installs_upgrade_once(old_database: str, record: Dict[str, Any]) -> None:
    """Three install() calls at once on the old schema (three deploy jobs):
    the advisory lock makes them take turns; the first upgrades, the others
    find the new version; the state is the old one."""
    import threading

    errors: List[BaseException] = []

    def install() -> None:
        try:
            PostgresTransport.install(old_database)
        except BaseException as exc:  # noqa: B036 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=install) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors
    assert version_of(old_database) == NEW
    with PostgresTransport(old_database, queue=QUEUE, clock=ManualClock(STOP)) as t:
        assert report(t) == record["at_stop"]
