"""SPEC Part 4, "Upgrades keep data", on SQLite: a file written by an earlier
release (leasequeue 0.3, schema version 3; leasequeue 0.5, schema version 4)
is upgraded in place on open, in one transaction, with every message, lease,
park, pause, bury and counter kept; a file of a newer schema is refused and
left untouched.

The files are ``tests/fixtures/sqlite-schema3.db`` and ``sqlite-schema4.db``,
written by the old code itself (``tests/fixtures/make_upgrade_fixtures.py``,
run against commits d13ce49 and 1d46d15), and the ``.json`` beside each holds
what the old code reported on it and the claims it gave next; the new code
must say and do the same.  Then the operations of SPEC Part 5 (later, once,
release, retry) work on the upgraded 0.5 file.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from typing import Any, Dict, List, Tuple

import pytest

import leasequeue
from leasequeue import LeaseLost, LeaseQueueError, SQLiteTransport
from leasequeue._backends.sqlite import transport as _sqlite
from leasequeue._backends.sqlfiles import load_migrations
from leasequeue.testing import ManualClock

from fixtures.make_upgrade_fixtures import STOP, continue_after, continue_after4, report, report4

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
FILE = os.path.join(FIXTURES, "sqlite-schema3.db")
with open(os.path.join(FIXTURES, "sqlite-schema3.json")) as _f:
    RECORD: Dict[str, Any] = json.load(_f)
FILE4 = os.path.join(FIXTURES, "sqlite-schema4.db")
with open(os.path.join(FIXTURES, "sqlite-schema4.json")) as _f:
    RECORD4: Dict[str, Any] = json.load(_f)
CURRENT = (_sqlite.SCHEMA_VERSION, _sqlite.SCHEMA_VERSION)


def old_file(tmp_path: Any, source: str = FILE) -> str:
    path = str(tmp_path / "old.db")
    shutil.copyfile(source, path)
    return path


def version_of(path: str) -> Tuple[int, Any]:
    conn = sqlite3.connect(path)
    try:
        return (conn.execute("PRAGMA user_version").fetchone()[0],
                conn.execute("SELECT version FROM lq_state").fetchone()[0])
    finally:
        conn.close()


def snapshot(path: str) -> Dict[str, bytes]:
    files = {}
    for suffix in ("", "-wal", "-shm", "-journal"):
        if os.path.exists(path + suffix):
            with open(path + suffix, "rb") as f:
                files[suffix] = f.read()
    return files


def schema_of(path: str) -> Dict[str, Any]:
    """Every table's columns (name, type, not null, default, key, hidden) and
    the text of every index, trigger and view: what makes two files alike."""
    conn = sqlite3.connect(path)
    try:
        out: Dict[str, Any] = {}
        for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name"):
            if kind == "table":
                out[name] = [tuple(row[1:]) for row in conn.execute(f"PRAGMA table_xinfo({name})")]
            else:
                out[name] = sql
        return out
    finally:
        conn.close()


def test_the_fixtures_are_of_the_previous_schemas() -> None:
    """The fixtures are what the old code wrote: versions 3 and 4, untouched by the new code."""
    assert version_of(FILE) == (3, 3)
    assert version_of(FILE4) == (4, 4)
    assert _sqlite.SCHEMA_VERSION == 5
    assert "SQLite schema version 3" in RECORD["made_by"]
    assert "leasequeue 0.5.0" in RECORD4["made_by"] and "SQLite schema version 4" in RECORD4["made_by"]


def test_a_file_of_the_previous_release_opens_with_nothing_lost(tmp_path: Any) -> None:
    """stats() and groups() say what the old code said; the old live lease,
    rebuilt from its fields, is acked; the next seq follows the old last one;
    the claims then come in the order the old code gave, with the old attempt
    counts (order-5's third delivery, order-2's second after its lease ran
    out, order-3's after its park)."""
    path = old_file(tmp_path)
    clock = ManualClock(STOP)
    with SQLiteTransport(path, clock=clock) as t:
        assert version_of(path) == CURRENT
        assert report(t) == RECORD["at_stop"]
        stats = t.stats()
        assert stats.buried == 0 and tuple(stats[:5]) == tuple(RECORD["at_stop"]["stats"])
        assert all(info.reason is None for info in t.groups())
        assert continue_after(t, clock, leasequeue.Lease, RECORD["live_lease"]) == RECORD["continued"]


def test_the_new_operations_work_on_an_upgraded_file(tmp_path: Any) -> None:
    """peek shows the old messages and their delivery counts; the old lease
    can be buried, and skip and resume act on the old groups."""
    path = old_file(tmp_path)
    clock = ManualClock(STOP)
    live = RECORD["live_lease"]
    with SQLiteTransport(path, clock=clock) as t:
        assert [tuple(m)[:3] for m in t.peek("order-1", 5)] == [
            (2, {"step": "a1"}, 1), (4, {"step": "a2"}, 0), (9, {"step": "a3"}, 0)]
        lease = leasequeue.Lease(live["seq"], live["group_id"], live["event"], live["worker_id"],
                                 live["expires_at"], live["attempt"])
        t.bury(lease, "poison")
        info = t.group("order-1")
        assert (info.state, info.reason, info.worker_id, info.attempt, info.expires_at) == (
            "buried", "poison", "w-live", 1, None)
        assert t.stats().buried == 1
        with pytest.raises(LeaseLost):
            t.ack(lease)
        assert t.skip("order-3") is True  # the parked head goes, the park with it
        assert [m.seq for m in t.peek("order-3", 5)] == [7]
        assert t.resume("order-1") is True
        assert t.stats().buried == 0
    with SQLiteTransport(path, clock=clock) as t:  # reopened: nothing is migrated twice
        assert version_of(path) == CURRENT
        assert t.peek("order-1", 1)[0].attempt == 1
        assert t.group("order-3").head_seq == 7


def test_an_upgraded_file_has_the_schema_of_a_new_one(tmp_path: Any) -> None:
    """The migrations bring a version-3 file and a version-4 file to exactly the tables, indexes,
    triggers and views that a new file gets from schema.sql."""
    path = old_file(tmp_path)
    SQLiteTransport(path).close()
    fresh = str(tmp_path / "fresh.db")
    SQLiteTransport(fresh).close()
    assert schema_of(path) == schema_of(fresh)
    path4 = str(tmp_path / "old4.db")
    shutil.copyfile(FILE4, path4)
    SQLiteTransport(path4).close()
    assert schema_of(path4) == schema_of(fresh)


def test_the_upgrade_is_one_transaction(tmp_path: Any, monkeypatch: Any) -> None:
    """A migration that fails part-way leaves the file exactly as it was: still
    version 3, byte for byte, and the old state intact."""
    path = old_file(tmp_path)
    before = snapshot(path)
    real = _sqlite.load_statements

    def failing(backend: str, filename: str = "schema.sql") -> List[str]:
        statements = real(backend, filename)
        if filename.startswith("migrations/"):
            statements = statements + ["SELECT no_such_column FROM lq_state"]
        return statements

    monkeypatch.setattr(_sqlite, "load_statements", failing)
    with pytest.raises(LeaseQueueError, match="no_such_column"):
        SQLiteTransport(path)
    assert snapshot(path) == before
    assert version_of(path) == (3, 3)
    monkeypatch.setattr(_sqlite, "load_statements", real)
    with SQLiteTransport(path, clock=ManualClock(STOP)) as t:  # and a later open upgrades it
        assert report(t) == RECORD["at_stop"]


def test_a_file_of_a_newer_release_is_refused_untouched(tmp_path: Any) -> None:
    """A file whose schema is newer than this code's (an upgraded fixture made
    one version newer) is refused with a clear error and not written to."""
    path = old_file(tmp_path)
    SQLiteTransport(path).close()
    newer = _sqlite.SCHEMA_VERSION + 1
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {newer}")
    conn.execute("UPDATE lq_state SET version = ?", (newer,))
    conn.commit()
    conn.close()
    before = snapshot(path)
    with pytest.raises(LeaseQueueError, match=f"schema version {newer}, newer than this leasequeue"):
        SQLiteTransport(path)
    assert snapshot(path) == before


def test_the_migrations_are_numbered_without_gaps() -> None:
    """One file per version from the oldest upgradable one up to this code's."""
    versions = [version for version, _ in load_migrations("sqlite")]
    assert versions == list(range(_sqlite.OLDEST_UPGRADABLE + 1, _sqlite.SCHEMA_VERSION + 1))


OPENER = r"""
import sys
from leasequeue import SQLiteTransport
from leasequeue.testing import ManualClock
with SQLiteTransport(sys.argv[1], clock=ManualClock(float(sys.argv[2]))) as t:
    print(list(t.stats()), flush=True)
"""


def test_processes_opening_an_old_file_at_once_upgrade_it_once(tmp_path: Any) -> None:
    """Four processes open the old file at the same moment: one upgrades it
    (under SQLite's write lock), the others wait and find it upgraded; all
    see the old state."""
    import subprocess
    import sys

    path = old_file(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, path, str(STOP)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(4)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    assert {out.strip() for out, _ in outs} == {str(RECORD["at_stop"]["stats"] + [0, 0])}
    assert version_of(path) == CURRENT
    with SQLiteTransport(path, clock=ManualClock(STOP)) as t:
        assert report(t) == RECORD["at_stop"]


# ---------------------------------------------------------------- 0.5 (schema 4) -> schema 5


def test_a_file_of_0_5_opens_with_nothing_lost(tmp_path: Any) -> None:
    """The 0.5 file (a buried group besides 0.3's scenario): stats() and
    groups() say what 0.5 said, nothing is scheduled; the old live lease,
    rebuilt from its fields, is acked; the claims come in 0.5's order with
    its attempt counts, and the buried group, resumed, gives its head again."""
    path = old_file(tmp_path, FILE4)
    clock = ManualClock(STOP)
    with SQLiteTransport(path, clock=clock) as t:
        assert version_of(path) == CURRENT
        assert report4(t) == RECORD4["at_stop"]
        stats = t.stats()
        assert stats.buried == 1 and stats.scheduled == 0
        assert all(info.due_at is None for info in t.groups())
        assert continue_after4(t, clock, leasequeue.Lease, RECORD4["live_lease"]) == RECORD4["continued"]


def test_the_part_5_operations_work_on_a_file_of_0_5(tmp_path: Any) -> None:
    """On the upgraded 0.5 file: the old messages have no due time and no key;
    retry gives the buried group a fresh start; a delayed publish schedules a
    new group and a keyed one is deduplicated; the old live lease, released,
    is not current any more, and its next delivery has the same attempt."""
    path = old_file(tmp_path, FILE4)
    clock = ManualClock(STOP)
    live = RECORD4["live_lease"]
    with SQLiteTransport(path, clock=clock, dedup_window=10.0) as t:
        assert all(m.due_at is None and m.key is None for m in t.peek("order-1", 5))
        # retry: the buried head's count back to 0, the bury lifted.
        assert t.retry("order-9") is True
        info = t.group("order-9")
        assert (info.state, info.reason, info.attempt) == ("ready", None, None)
        assert t.stats().buried == 0
        lease = t.claim("w", 30.0, 20)
        assert (lease.group_id, lease.seq, lease.attempt) == ("order-9", 13, 1)
        t.ack(lease)
        # later: a new group waits for its due time.
        seq = t.publish("later", {"step": "t1"}, 30, delay=50.0)
        assert seq == RECORD4["continued"]["published_seq"]  # the next seq, as 0.5 gave it
        info = t.group("later")
        assert (info.state, info.due_at) == ("scheduled", STOP + 50.0)
        assert t.stats().scheduled == 1
        assert t.claim("w", 30.0, 30) is None
        # once: the same key in the same group is the same message.
        keyed = t.publish("order-1", {"step": "a4"}, key="charge")
        assert t.publish("order-1", {"step": "again"}, key="charge") == keyed
        assert t.peek("order-1", 5)[-1] == leasequeue.Message(keyed, {"step": "a4"}, 0, None, "charge")
        # release: the old lease, rebuilt from its fields, handed back uncounted.
        old = leasequeue.Lease(live["seq"], live["group_id"], live["event"], live["worker_id"], live["expires_at"],
                               live["attempt"])
        t.release(old)
        with pytest.raises(LeaseLost):
            t.ack(old)
        clock.set(STOP + 51.0)
        assert t.claim("w", 30.0, 30).group_id == "later"
        assert t.peek("order-1", 1)[0].attempt == live["attempt"] - 1
        claimed = [t.claim("w", 30.0) for _ in range(3)]  # order-5 and order-2 were claimed before order-1
        again = next(lease for lease in claimed if lease.group_id == "order-1")
        assert (again.seq, again.attempt) == (2, live["attempt"])
